/**
 * What a handler can do during a call: state, counters, emit, log, timers.
 *
 * {@link Context} is the handler's view; it wraps a {@link HostApi}, the
 * raw bytes-level calls of the WIT imports `state`, `emit`, `log` and
 * `timers`.
 * Inside a component the host API calls the host (`component.ts`); in unit
 * tests it is the in-memory `MemoryHost` (`testing.ts`).
 *
 * A host API call the host refuses throws a {@link Refusal} with the
 * host's text, which names the rule (`state-value-size: ...`); the context
 * turns it into {@link Refused}, an unrecoverable error that also says
 * what was refused, in the Rust SDK's words (``cannot write state entry
 * `big`: state-value-size: ...``). Catching it is allowed: the call may
 * still succeed without what was refused. Left uncaught, it fails the call.
 */

import type { Event } from "./event.js";
import { fromUtf8, parseJson, utf8, writeJson } from "./json.js";
import { type DecodedKey, decodeKey } from "./key.js";
import { I64_MAX, I64_MIN } from "./limits.js";
import type { Schema } from "./schema.js";
import {
  type Algebra,
  type Level,
  type Ordering,
  Refusal,
  Refused,
  type Timer,
  UnrecoverableError,
} from "./types.js";

/** A message a handler publishes to another topic (the WIT record `outgoing`). */
export interface Outgoing {
  /** One of the topics the module declared it emits to. */
  readonly topic: string;
  /** The event type's tag. */
  readonly tag: number;
  /** The message's key, in canonical bytes. */
  readonly key: Uint8Array;
  /** The ordering the message asks for. */
  readonly ordering: Ordering;
  /** The event type's algebra. */
  readonly algebra: Algebra;
  /** The encoded body. */
  readonly body: Uint8Array;
}

/** The message for `event` on `topic`: tag, key, ordering and algebra come from the event. */
export function outgoing(topic: string, event: Event): Outgoing {
  const { type, value } = event;
  return {
    topic,
    tag: type.tag,
    key: type.keyBytes(value),
    ordering: type.ordering(value),
    algebra: type.algebra,
    body: type.encode(value),
  };
}

/**
 * The host's side of a handler call, as raw bytes: what the WIT imports
 * offer. Every method but `log` throws a {@link Refusal} when the host
 * refuses the call.
 */
export interface HostApi {
  /** Reads an entry of the current key. */
  get(name: string): Uint8Array | undefined;
  /** Writes an entry of the current key. */
  set(name: string, value: Uint8Array): void;
  /** Removes an entry of the current key (no error if it is absent). */
  delete(name: string): void;
  /** Adds `delta` to a counter shared by every key. */
  counterAdd(name: string, delta: bigint): void;
  /** Reads a shared counter: its committed value plus this key's changes. */
  counterGet(name: string): bigint;
  /** Queues a message, sent when the batch commits. */
  emit(message: Outgoing): void;
  /** Writes a line to the host's log (never fails). */
  log(level: Level, message: string): void;
  /** Sets the current key's timer `name` at event time `at` with `payload` (a new one, or the one of that name moved). */
  setTimer(name: string, at: bigint, payload: Uint8Array): void;
  /** Cancels the current key's timer `name` (no error if there is none). */
  cancelTimer(name: string): void;
  /** The current key's timer `name`, as this call sees it. */
  getTimer(name: string): Timer | undefined;
}

/** `value` as an s64 bigint (a safe integer or a bigint in range), or `undefined`. */
function s64(value: number | bigint): bigint | undefined {
  const big = typeof value === "bigint" ? value : Number.isSafeInteger(value) ? BigInt(value) : undefined;
  return big !== undefined && big >= I64_MIN && big <= I64_MAX ? big : undefined;
}

/**
 * The JSON payload of `timer`, read against `schema` when given: what
 * {@link Context.setTimer} gave it. A payload that does not decode is an
 * unrecoverable error naming the timer.
 */
export function timerPayload<T = unknown>(timer: Timer, schema?: Schema<T>): T {
  try {
    const value = parseJson(fromUtf8(timer.payload));
    return schema === undefined ? (value as T) : schema.read(value, "");
  } catch (error) {
    const what = schema === undefined ? "JSON value" : schema.what;
    throw new UnrecoverableError(`the payload of timer \`${timer.name}\` is not a valid ${what}: ${(error as Error).message}`);
  }
}

function refused(what: string, error: unknown): unknown {
  return error instanceof Refusal ? new Refused(what, error) : error;
}

/**
 * A handler's view of the host during one call: the state of the key being
 * handled, the counters shared by all keys, emit and log.
 *
 * State entries are JSON by default ({@link Context.get},
 * {@link Context.set}), read against a schema when one is given. Writes are
 * visible to later reads of the same key at once and committed with the
 * batch; if the call fails, none is kept.
 */
export class Context {
  private decoded: DecodedKey | undefined;

  constructor(
    private readonly host: HostApi,
    /** The key being handled, in canonical bytes. */
    readonly keyBytes: Uint8Array,
  ) {}

  /** The key being handled, decoded (integers as `number` when safe, else `bigint`). */
  get key(): DecodedKey {
    this.decoded ??= decodeKey(this.keyBytes);
    return this.decoded;
  }

  /**
   * Reads a JSON entry of the current key, checked against `schema` when
   * given; `undefined` if it is absent. An entry that does not decode is an
   * unrecoverable error naming the entry.
   */
  get<T = unknown>(name: string, schema?: Schema<T>): T | undefined {
    let data: Uint8Array | undefined;
    try {
      data = this.host.get(name);
    } catch (error) {
      throw refused(`cannot read state entry \`${name}\``, error);
    }
    if (data === undefined) {
      return undefined;
    }
    try {
      const value = parseJson(fromUtf8(data));
      return schema === undefined ? (value as T) : schema.read(value, "");
    } catch (error) {
      const what = schema === undefined ? "JSON value" : schema.what;
      throw new UnrecoverableError(`state entry \`${name}\` is not a valid ${what}: ${(error as Error).message}`);
    }
  }

  /** Writes a JSON entry of the current key, with `schema` when given (field order, skipped defaults). */
  set<T>(name: string, value: T, schema?: Schema<T>): void {
    let data: Uint8Array;
    try {
      data = utf8(schema === undefined ? writeJson(value) : schema.write(value));
    } catch (error) {
      throw new UnrecoverableError(`cannot encode state entry \`${name}\` as JSON: ${(error as Error).message}`);
    }
    try {
      this.host.set(name, data);
    } catch (error) {
      throw refused(`cannot write state entry \`${name}\``, error);
    }
  }

  /** Reads an entry of the current key as bytes. */
  getBytes(name: string): Uint8Array | undefined {
    try {
      return this.host.get(name);
    } catch (error) {
      throw refused(`cannot read state entry \`${name}\``, error);
    }
  }

  /** Writes an entry of the current key as bytes. */
  setBytes(name: string, value: Uint8Array): void {
    try {
      this.host.set(name, value);
    } catch (error) {
      throw refused(`cannot write state entry \`${name}\``, error);
    }
  }

  /** Removes an entry of the current key (nothing happens if it is absent). */
  delete(name: string): void {
    try {
      this.host.delete(name);
    } catch (error) {
      throw refused(`cannot delete state entry \`${name}\``, error);
    }
  }

  /**
   * Adds `delta` (an s64, possibly negative; a safe integer or a bigint) to
   * a counter shared by every key. An addition that would take the counter,
   * as this key sees it, out of the s64 range is refused (`counter-range`),
   * and nothing is added.
   */
  counterAdd(name: string, delta: number | bigint): void {
    let big: bigint;
    if (typeof delta === "bigint") {
      big = delta;
    } else if (Number.isSafeInteger(delta)) {
      big = BigInt(delta);
    } else {
      throw new UnrecoverableError(`cannot add ${String(delta)} to counter \`${name}\`: the delta is not an s64`);
    }
    if (big < I64_MIN || big > I64_MAX) {
      throw new UnrecoverableError(`cannot add ${String(delta)} to counter \`${name}\`: the delta is not an s64`);
    }
    try {
      this.host.counterAdd(name, big);
    } catch (error) {
      throw refused(`cannot add ${big} to counter \`${name}\``, error);
    }
  }

  /** Reads a shared counter: its committed value plus this key's changes. */
  counterGet(name: string): bigint {
    try {
      return this.host.counterGet(name);
    } catch (error) {
      throw refused(`cannot read counter \`${name}\``, error);
    }
  }

  /**
   * Publishes `event` (made with `Type.of(value)`) to `topic` when the batch
   * commits; its headers come from the event. The topic must be one the
   * module declared in `emits`.
   */
  emit(topic: string, event: Event): void {
    const message = outgoing(topic, event);
    try {
      this.host.emit(message);
    } catch (error) {
      throw refused(`cannot emit ${event.type.name} to \`${topic}\``, error);
    }
  }

  /**
   * Sets the current key's timer `name` at event time `at` (ms since the
   * epoch, an s64: a safe integer or a bigint) with `payload` as JSON
   * (with `schema` when given), carried to the module's timer handler
   * ({@link Module.onTimers}): a new timer, or the one of that name moved.
   * It fires once the projection's clock passes `at` (see
   * `docs/timers.md`). A refusal (`timers-per-key`, `timer-payload-size`,
   * ...) is {@link Refused}, naming the timer and the rule.
   */
  setTimer<T>(name: string, at: number | bigint, payload: T, schema?: Schema<T>): void {
    let data: Uint8Array;
    try {
      data = utf8(schema === undefined ? writeJson(payload) : schema.write(payload));
    } catch (error) {
      throw new UnrecoverableError(`cannot encode the payload of timer \`${name}\`: ${(error as Error).message}`);
    }
    this.setTimerBytes(name, at, data);
  }

  /** {@link Context.setTimer} with the payload as bytes. */
  setTimerBytes(name: string, at: number | bigint, payload: Uint8Array): void {
    const time = s64(at);
    if (time === undefined) {
      throw new UnrecoverableError(`cannot set timer \`${name}\` at ${String(at)}: the time is not an s64`);
    }
    try {
      this.host.setTimer(name, time, payload);
    } catch (error) {
      throw refused(`cannot set timer \`${name}\``, error);
    }
  }

  /** Cancels the current key's timer `name` (nothing happens if there is none). */
  cancelTimer(name: string): void {
    try {
      this.host.cancelTimer(name);
    } catch (error) {
      throw refused(`cannot cancel timer \`${name}\``, error);
    }
  }

  /** The current key's timer `name`, if it is pending (as this call sees it). */
  timer(name: string): Timer | undefined {
    try {
      return this.host.getTimer(name);
    } catch (error) {
      throw refused(`cannot read timer \`${name}\``, error);
    }
  }

  /** Writes a line to the host's log. */
  log(level: Level, message: string): void {
    this.host.log(level, String(message));
  }

  trace(message: string): void {
    this.host.log("trace", String(message));
  }

  debug(message: string): void {
    this.host.log("debug", String(message));
  }

  info(message: string): void {
    this.host.log("info", String(message));
  }

  warn(message: string): void {
    this.host.log("warn", String(message));
  }

  error(message: string): void {
    this.host.log("error", String(message));
  }
}
