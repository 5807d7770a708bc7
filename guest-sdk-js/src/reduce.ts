/**
 * Reduction: what the host may do to a run before handing it to a
 * handler, given the algebra its event type declares; the host's rules
 * (`core/src/reduce.rs`) for the test host.
 *
 * A run is every event of one type and one key between two fences, in log
 * order.
 *
 * | algebra                | what happens to the run                                   |
 * | ---------------------- | --------------------------------------------------------- |
 * | non-associative        | nothing                                                   |
 * | commutative            | nothing (delivering in log order is always allowed)       |
 * | idempotent             | adjacent duplicates (equal body bytes) are dropped        |
 * | idempotent-commutative | sorted by body bytes, every duplicate dropped             |
 * | associative            | folded into one body by `combine` (a run of two or more)  |
 *
 * After reduction a run is cut into chunks of at most `maxBatch` events;
 * each chunk is one handler call. Both rules are checked against the
 * host's vectors (`core/tests/reduce_vectors.json`).
 */

import type { Algebra } from "./types.js";

/** Compares bodies bytewise, as the host sorts them. */
export function compareBytes(a: Uint8Array, b: Uint8Array): number {
  const length = Math.min(a.length, b.length);
  for (let i = 0; i < length; i++) {
    if (a[i] !== b[i]) {
      return a[i]! - b[i]!;
    }
  }
  return a.length - b.length;
}

function dedup(bodies: Uint8Array[]): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (const body of bodies) {
    const last = out[out.length - 1];
    if (last === undefined || compareBytes(last, body) !== 0) {
      out.push(body);
    }
  }
  return out;
}

/**
 * Reduces a run's bodies according to `algebra`. `combine` is called at
 * most once, and only for an associative run of at least two bodies.
 */
export function reduce(
  algebra: Algebra,
  bodies: readonly Uint8Array[],
  combine: (run: Uint8Array[]) => Uint8Array,
): Uint8Array[] {
  const run = [...bodies];
  switch (algebra) {
    case "idempotent":
      return dedup(run);
    case "idempotent-commutative":
      return dedup(run.sort(compareBytes));
    case "associative":
      return run.length >= 2 ? [combine(run)] : run;
    default:
      return run;
  }
}

/** Cuts reduced bodies into handler calls of at most `maxBatch` events (0 is taken as 1). */
export function chunks<T>(bodies: readonly T[], maxBatch: number): T[][] {
  const size = Math.max(maxBatch, 1);
  const out: T[][] = [];
  for (let start = 0; start < bodies.length; start += size) {
    out.push(bodies.slice(start, start + size));
  }
  return out;
}
