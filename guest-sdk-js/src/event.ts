/**
 * Event types: a body schema with a tag, a name, an algebra, a max batch,
 * a timing, a key and a per-message ordering, all declared in one place.
 *
 *     export const Deposited = defineEvent({
 *       tag: 2,
 *       name: "Deposited",
 *       algebra: Algebra.Associative,
 *       fields: { account: t.u64, amount: t.i64, count: t.skipIfDefault(t.u64, 1n) },
 *       key: (event) => event.account,
 *       combine: (events) => ({ ...events[0]!, amount: sum(events) }),
 *     });
 *     export type Deposited = EventOf<typeof Deposited>;
 *
 * The declaration is checked when it is made (so a bad one fails the
 * import, and with it the component build): `tag` is a u32 (unique among
 * a module's types, checked by the module), `name` 1 to 128 bytes of
 * letters, digits, `_`, `-`, `.` and `:`, `maxBatch` from 1 to 2^32 − 1
 * (default 256), `algebra` and `timing` the WIT's names (defaults
 * `non-associative` and `untimed`); an associative type must give
 * `combine`, a timed one `eventTime`.
 *
 * A timed type says when each event happened, in milliseconds since the
 * Unix epoch, read from the event itself (never from a clock):
 * `eventTime: (event) => event.atMs`. `waku publish` writes it into the
 * message's `waku-event-time` header (`event-time-declared`: `undefined`
 * refuses the event) and the host applies a key's timed events in
 * event-time order across the projection's topics (`event-time-order`);
 * `timing: "timed-relaxed"` lets them move past other timed types' events
 * as their orderings allow.
 *
 * Bodies are JSON read against `fields` (see `schema.ts`), or whatever
 * `decode` and `encode` make of them when those are given instead. A body
 * that does not decode is an unrecoverable error naming the type.
 */

import { KeyFormatError, type KeyValue, encodeKey } from "./key.js";
import { fromUtf8, parseJson, utf8 } from "./json.js";
import { isEventTypeName } from "./limits.js";
import { type Fields, type ObjectOf, type Schema, t } from "./schema.js";
import {
  type Algebra,
  type Ordering,
  type Timing,
  UnrecoverableError,
  isAlgebra,
  isOrdering,
  isTiming,
} from "./types.js";

/** What every event type declares, whatever its body format. */
interface Declared<T> {
  /** Unique among the event types of one topic; written into every message's header. */
  tag: number;
  /** A human name used in logs, metrics and errors. */
  name: string;
  /** How the host may reduce a run of this type (default `non-associative`). */
  algebra?: Algebra;
  /** The most events one handler call receives (default 256). */
  maxBatch?: number;
  /** Whether its events carry an event time (default `untimed`). */
  timing?: Timing;
  /** The key of an event: it may depend only on the event. */
  key(event: T): KeyValue;
  /** How an event orders itself against other types of its key (default `relaxed`). */
  ordering?(event: T): Ordering;
  /** When the event happened (ms since the epoch); asked only of a timed type. */
  eventTime?(event: T): number | bigint | undefined;
  /** Folds a run (at least one event, of one key, in log order) into one event; associative types only. */
  combine?(events: T[]): T;
}

/** An event type whose bodies are JSON objects with `fields`. */
export interface JsonEventSpec<F extends Fields> extends Declared<ObjectOf<F>> {
  fields: F;
}

/** An event type with a body format of its own. */
export interface CodecEventSpec<T> extends Declared<T> {
  decode(body: Uint8Array): T;
  encode(event: T): Uint8Array;
}

/** An event of a known type, as the test host and `emit` take it. */
export interface Event<T = unknown> {
  readonly type: EventType<T>;
  readonly value: T;
}

/** A declared event type: what the module, the test host and the component use. */
export interface EventType<T> {
  readonly tag: number;
  readonly name: string;
  readonly algebra: Algebra;
  readonly maxBatch: number;
  readonly timing: Timing;
  /** The key of an event, as a value. */
  key(event: T): KeyValue;
  /** The ordering an event asks for. */
  ordering(event: T): Ordering;
  /** When the event happened, or `undefined` (never asked of an untimed type). */
  eventTime(event: T): number | bigint | undefined;
  /** Folds a run into one event; unrecoverable for a type that is not associative. */
  combine(events: T[]): T;
  /** Reads a body; one that does not fit is an unrecoverable error naming the type. */
  decode(body: Uint8Array): T;
  /** Writes a body. */
  encode(event: T): Uint8Array;
  /** The canonical bytes of the event's key; a value that is no key is unrecoverable. */
  keyBytes(event: T): Uint8Array;
  /** `value` as an event of this type (for `emit` and the test host). */
  of(value: T): Event<T>;
}

/** The type of the events of an event type: `type Deposited = EventOf<typeof Deposited>`. */
export type EventOf<E> = E extends EventType<infer T> ? T : never;

const U32_MAX = 0xffffffff;

function malformed(name: string, error: unknown): UnrecoverableError {
  const reason = error instanceof Error ? error.message : String(error);
  return new UnrecoverableError(`malformed ${name} body: ${reason}`);
}

/** Declares an event type (see the module docs); a bad declaration throws a `TypeError`. */
export function defineEvent<const F extends Fields>(spec: JsonEventSpec<F>): EventType<ObjectOf<F>>;
export function defineEvent<T>(spec: CodecEventSpec<T>): EventType<T>;
export function defineEvent<T>(spec: JsonEventSpec<Fields> | CodecEventSpec<T>): EventType<T> {
  const { tag, name } = spec;
  const label = typeof name === "string" ? name : `with tag ${String(tag)}`;
  const fail = (what: string): never => {
    throw new TypeError(`event type ${label}: ${what}`);
  };
  if (!Number.isInteger(tag) || tag < 0 || tag > U32_MAX) {
    fail(`tag ${String(tag)} is not a u32`);
  }
  if (typeof name !== "string" || !isEventTypeName(name)) {
    fail(`name ${JSON.stringify(name)} is not 1 to 128 bytes of letters, digits, \`_\`, \`-\`, \`.\` and \`:\``);
  }
  const algebra = spec.algebra ?? "non-associative";
  if (!isAlgebra(algebra)) {
    fail(`algebra ${JSON.stringify(algebra)} is not one of the WIT's algebras`);
  }
  const maxBatch = spec.maxBatch ?? 256;
  if (!Number.isInteger(maxBatch) || maxBatch < 1 || maxBatch > U32_MAX) {
    fail(`maxBatch ${String(maxBatch)} is not from 1 to ${U32_MAX}`);
  }
  const timing = spec.timing ?? "untimed";
  if (!isTiming(timing)) {
    fail(`timing ${JSON.stringify(timing)} is not one of the WIT's timings`);
  }
  if (typeof spec.key !== "function") {
    fail("gives no key(event)");
  }
  if (timing !== "untimed" && typeof spec.eventTime !== "function") {
    fail("is timed but gives no eventTime(event)");
  }
  if (algebra === "associative" && typeof spec.combine !== "function") {
    fail("is associative but gives no combine(events)");
  }

  let decode: (body: Uint8Array) => T;
  let encode: (event: T) => Uint8Array;
  if ("fields" in spec) {
    if ("decode" in spec || "encode" in spec) {
      fail("gives both fields and decode/encode");
    }
    const schema = t.object(spec.fields) as unknown as Schema<T>;
    decode = (body) => {
      try {
        return schema.read(parseJson(fromUtf8(body)), "");
      } catch (error) {
        throw malformed(name, error);
      }
    };
    encode = (event) => utf8(schema.write(event));
  } else {
    if (typeof spec.decode !== "function" || typeof spec.encode !== "function") {
      fail("gives neither fields nor decode and encode");
    }
    const own = spec.decode;
    decode = (body) => {
      try {
        return own(body);
      } catch (error) {
        throw error instanceof UnrecoverableError ? error : malformed(name, error);
      }
    };
    encode = (event) => spec.encode(event);
  }

  const declared = spec as Declared<T>;
  const ordering = declared.ordering;
  const type: EventType<T> = {
    tag,
    name,
    algebra,
    maxBatch,
    timing,
    key: (event) => declared.key(event),
    ordering: ordering === undefined ? () => "relaxed" : (event) => {
      const asked = ordering(event);
      if (!isOrdering(asked)) {
        throw new UnrecoverableError(`${name}.ordering returned ${String(asked)}, not one of the WIT's orderings`);
      }
      return asked;
    },
    eventTime: (event) => declared.eventTime?.(event),
    combine(events) {
      if (declared.combine === undefined || algebra !== "associative") {
        throw new UnrecoverableError(`${name} is not associative`);
      }
      return declared.combine(events);
    },
    decode,
    encode,
    keyBytes(event) {
      try {
        return encodeKey(declared.key(event));
      } catch (error) {
        if (error instanceof KeyFormatError) {
          throw new UnrecoverableError(`the key of a ${name} is not a key: ${error.message}`);
        }
        throw error;
      }
    },
    of: (value) => ({ type, value }),
  };
  return Object.freeze(type);
}
