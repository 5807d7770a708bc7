/**
 * Windows over a key's events, built on timers: tumbling, hopping and
 * session windows with an aggregate the author writes, an allowed
 * lateness, and each window's result emitted to a topic when it closes.
 *
 * The TypeScript counterpart of the Rust SDK's `windows` module, with its
 * rules and its state layout, so a module ported from one to the other
 * keeps its open windows (`docs/timers.md`, "Windows", says them for
 * authors):
 * - **A window is `[start, end)` in event time.** Tumbling windows of
 *   `size` start at multiples of `size`; hopping windows of `size` start
 *   every `hop` (an event is in each of the windows that hold its time); a
 *   session holds events less than `gap` apart and ends `gap` after its
 *   last event (an event that bridges two sessions merges them, with the
 *   aggregate's `merge`).
 * - **A window closes when the clock passes its end and the allowance**:
 *   its timer is set at `end - 1 + lateness`, so it fires after every
 *   event of the key up to that time (the host's rule for timers); then
 *   {@link Windows.fire} emits the aggregate's `result` to the topic and
 *   forgets the window. An event read late but within the allowance still
 *   joins its window.
 * - **Late beyond the allowance**: an event whose every window closed is
 *   added to none; it is counted (the counter `<name>/late`) and
 *   {@link Windows.add} returns `"late"`, for the author to act on.
 * - **Kept in the key's state**: the open windows and their aggregates in
 *   the entry `<name>/open` (JSON: `{"<start>": [end, aggregate]}`, by
 *   start; each SDK reads the other's), the latest close time fired in `<name>/closed`; one timer per
 *   open window, named `<name>/<start>`. Declare `maxBatch: 1` on the
 *   windowed type, as timers fall exactly between events only so.
 */

import type { Context } from "./context.js";
import type { Event } from "./event.js";
import { type JsonValue, parseJson } from "./json.js";
import type { DecodedKey } from "./key.js";
import type { Schema } from "./schema.js";
import { type Timer, UnrecoverableError } from "./types.js";

/** What kind of windows: lengths in ms, as numbers (safe integers) or bigints. */
export type WindowKind =
  | { kind: "tumbling"; size: number | bigint }
  | { kind: "hopping"; size: number | bigint; hop: number | bigint }
  | { kind: "session"; gap: number | bigint };

/** One window: `[start, end)` in event time (ms since the epoch). */
export interface Window {
  readonly start: bigint;
  readonly end: bigint;
}

/**
 * What the author writes, for events of type `E` and an aggregate `S`
 * kept in the key's state as JSON (through `schema` when given, else as
 * it is: numbers, bigints, strings, arrays and plain objects).
 */
export interface Aggregate<E, S> {
  /** A new window's aggregate. */
  initial(): S;
  /** The aggregate with `event` added. */
  add(state: S, event: E): S;
  /** The aggregates of two sessions an event bridges, merged. */
  merge(into: S, other: S): S;
  /** What a closed window of `key` emits (made with `Type.of(...)`). */
  result(key: DecodedKey, window: Window, state: S): Event;
  /** How the aggregate is kept as JSON (default: as it is). */
  schema?: Schema<S>;
}

/** Where {@link Windows.add} put an event: into these windows, or `"late"` (into none, counted). */
export type Placed = Window[] | "late";

const I64_MIN = -(1n << 63n);
const I64_MAX = (1n << 63n) - 1n;
const DIGITS = /^-?\d+$/;

/** `value` within an s64, as saturating arithmetic leaves it. */
function saturated(value: bigint): bigint {
  return value < I64_MIN ? I64_MIN : value > I64_MAX ? I64_MAX : value;
}

/** The largest multiple of `step` (> 0) not above `value`. */
function floorTo(value: bigint, step: bigint): bigint {
  const rest = value % step;
  return rest < 0n ? value - rest - step : value - rest;
}

/** A length given to the windows, as a positive bigint. */
function length(what: string, value: number | bigint): bigint {
  const big = typeof value === "bigint" ? value : Number.isSafeInteger(value) ? BigInt(value) : undefined;
  if (big === undefined || big < 1n || big > I64_MAX) {
    throw new RangeError(`a window's ${what} must be a whole number of ms from 1 to 2^63-1, not ${String(value)}`);
  }
  return big;
}

/** One open window of a key: its end and aggregate. */
interface OpenWindow<S> {
  end: bigint;
  state: S;
}

/** Windows of one kind over a key's events, their results emitted to a topic. */
export class Windows<E, S> {
  private readonly size: bigint;
  private readonly hop: bigint;
  private readonly gap: bigint | undefined;
  private readonly lateness: bigint;

  /**
   * Windows named `name` (their state entries and timers start with it) of
   * `kind`, keeping each open `lateness` ms past its end, their results
   * emitted to `topic` (which the module declares in `emits`). A length
   * that is not a positive whole number, or a hop that does not divide
   * the size, throws a `RangeError` naming it.
   */
  constructor(
    readonly name: string,
    readonly kind: WindowKind,
    lateness: number | bigint,
    readonly topic: string,
    private readonly aggregate: Aggregate<E, S>,
  ) {
    this.lateness = lateness === 0 || lateness === 0n ? 0n : length("lateness", lateness);
    switch (kind.kind) {
      case "tumbling":
        this.size = length("size", kind.size);
        this.hop = this.size;
        break;
      case "hopping":
        this.size = length("size", kind.size);
        this.hop = length("hop", kind.hop);
        if (this.hop > this.size || this.size % this.hop !== 0n) {
          throw new RangeError(`a hopping window's hop (${this.hop}) must divide its size (${this.size})`);
        }
        break;
      case "session":
        this.gap = length("gap", kind.gap);
        this.size = this.hop = 1n;
        break;
    }
  }

  /**
   * Adds `event`, of event time `at`, to its windows of the current key;
   * opens those not open yet (setting their timers), or, if every one of
   * them closed already, counts it late and returns `"late"`.
   */
  add(ctx: Context, at: number | bigint, event: E): Placed {
    const time = saturated(BigInt(at));
    const open = this.readOpen(ctx);
    const closed = this.readClosed(ctx);
    const isClosed = (window: Window) => closed !== undefined && this.closesAt(window.end) <= closed;
    let placed: Window[];
    if (this.gap !== undefined) {
      placed = this.addToSession(ctx, open, time, this.gap, event, isClosed);
    } else {
      placed = this.fixedWindows(time).filter((window) => !isClosed(window));
      for (const window of placed) {
        let entry = open.get(window.start);
        if (entry === undefined) {
          ctx.setTimerBytes(this.timerName(window.start), this.closesAt(window.end), new Uint8Array());
          entry = { end: window.end, state: this.aggregate.initial() };
          open.set(window.start, entry);
        }
        entry.state = this.aggregate.add(entry.state, event);
      }
    }
    if (placed.length === 0) {
      ctx.counterAdd(`${this.name}/late`, 1);
      return "late";
    }
    this.writeOpen(ctx, open);
    return placed;
  }

  /**
   * Closes the windows of the current key whose timers are among `timers`
   * (others are left to the caller): emits each one's result to the topic
   * and forgets it. Returns the windows closed.
   */
  fire(ctx: Context, timers: readonly Timer[]): Window[] {
    const prefix = `${this.name}/`;
    const ours = timers.filter((timer) => timer.name.startsWith(prefix));
    if (ours.length === 0) {
      return [];
    }
    const open = this.readOpen(ctx);
    let closed = this.readClosed(ctx);
    const done: Window[] = [];
    for (const timer of ours) {
      const digits = timer.name.slice(prefix.length);
      if (!DIGITS.test(digits)) {
        continue;
      }
      const start = BigInt(digits);
      closed = closed === undefined || timer.at > closed ? timer.at : closed;
      const entry = open.get(start);
      if (entry === undefined) {
        continue;
      }
      open.delete(start);
      const window = { start, end: entry.end };
      ctx.emit(this.topic, this.aggregate.result(ctx.key, window, entry.state));
      done.push(window);
    }
    this.writeOpen(ctx, open);
    ctx.set(`${this.name}/closed`, closed ?? null);
    return done;
  }

  /** Adds an event at `at` to the sessions it touches (merging them), or to a new one; none if its session would be closed. */
  private addToSession(
    ctx: Context,
    open: Map<bigint, OpenWindow<S>>,
    at: bigint,
    gap: bigint,
    event: E,
    isClosed: (window: Window) => boolean,
  ): Window[] {
    let window = { start: at, end: saturated(at + gap) };
    const touched = [...open].filter(([start, { end }]) => window.start < end && start < window.end).map(([start]) => start);
    if (touched.length === 0 && isClosed(window)) {
      return [];
    }
    let state = this.aggregate.initial();
    for (const start of touched) {
      const other = open.get(start)!;
      open.delete(start);
      ctx.cancelTimer(this.timerName(start));
      window = { start: start < window.start ? start : window.start, end: other.end > window.end ? other.end : window.end };
      state = this.aggregate.merge(state, other.state);
    }
    state = this.aggregate.add(state, event);
    ctx.setTimerBytes(this.timerName(window.start), this.closesAt(window.end), new Uint8Array());
    open.set(window.start, { end: window.end, state });
    return [window];
  }

  /** The tumbling or hopping windows holding time `at`, by start. */
  private fixedWindows(at: bigint): Window[] {
    const windows: Window[] = [];
    for (let start = floorTo(at, this.hop); start > at - this.size; start -= this.hop) {
      windows.unshift({ start, end: saturated(start + this.size) });
    }
    return windows;
  }

  /** When a window ending at `end` closes: its timer's time. */
  private closesAt(end: bigint): bigint {
    return saturated(end - 1n + this.lateness);
  }

  private timerName(start: bigint): string {
    return `${this.name}/${start}`;
  }

  private readClosed(ctx: Context): bigint | undefined {
    const closed = ctx.get<JsonValue>(`${this.name}/closed`);
    if (closed === undefined || closed === null) {
      return undefined;
    }
    if (typeof closed !== "number" && typeof closed !== "bigint") {
      throw new UnrecoverableError(`state entry \`${this.name}/closed\` is not a time`);
    }
    return BigInt(closed);
  }

  /** The open windows of the current key, by start. */
  private readOpen(ctx: Context): Map<bigint, OpenWindow<S>> {
    const entry = `${this.name}/open`;
    const stored = ctx.get<JsonValue>(entry);
    const open = new Map<bigint, OpenWindow<S>>();
    if (stored === undefined) {
      return open;
    }
    const bad = (why: string) => new UnrecoverableError(`state entry \`${entry}\` is not a map of open windows: ${why}`);
    if (stored === null || typeof stored !== "object" || Array.isArray(stored)) {
      throw bad("not an object");
    }
    for (const [start, value] of Object.entries(stored)) {
      if (!DIGITS.test(start) || !Array.isArray(value) || value.length !== 2) {
        throw bad(`window \`${start}\` is not [end, aggregate]`);
      }
      const [end, state] = value as [JsonValue, JsonValue];
      if (typeof end !== "number" && typeof end !== "bigint") {
        throw bad(`window \`${start}\` has no end`);
      }
      open.set(BigInt(start), { end: BigInt(end), state: this.readAggregate(entry, start, state) });
    }
    return open;
  }

  /** A window's aggregate as kept, read through the aggregate's schema when it has one. */
  private readAggregate(entry: string, start: string, state: JsonValue): S {
    const schema = this.aggregate.schema;
    if (schema === undefined) {
      return state as S;
    }
    try {
      return schema.read(state, start);
    } catch (error) {
      throw new UnrecoverableError(`state entry \`${entry}\`: window ${start}'s aggregate is not ${schema.what}: ${(error as Error).message}`);
    }
  }

  /** Writes the open windows by start, as the Rust SDK's map does. */
  private writeOpen(ctx: Context, open: Map<bigint, OpenWindow<S>>): void {
    const schema = this.aggregate.schema;
    const stored: { [start: string]: JsonValue } = {};
    for (const [start, { end, state }] of [...open].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
      const kept = schema === undefined ? (state as JsonValue) : parseJson(schema.write(state));
      stored[String(start)] = [end, kept];
    }
    ctx.set(`${this.name}/open`, stored);
  }
}
