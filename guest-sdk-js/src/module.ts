/**
 * A module: the event types it handles, dispatched by tag, and the topics
 * it may emit to.
 *
 *     const bank = new Module("bank");
 *     bank.handles(Deposited, (ctx, events) => { ... });
 *     bank.onTimers((ctx, timers) => { ... });   // only if it sets timers
 *     export default bank;
 *
 * Every handler call gets events of one key and one type, in log order
 * (after the host's reduction), at most `maxBatch` of them; calls for one
 * key never overlap. On error nothing the call wrote is kept, and the
 * events go where the error's class says.
 *
 * A module's timers (contract 0.5, `docs/timers.md`) are set in any call
 * with `ctx.setTimer` and fired, per key, by the one handler registered
 * with {@link Module.onTimers}: all of a key's due timers of one time in
 * one call, in name order. A module without one sets no timers, and fails
 * unrecoverably if it is ever asked to fire some.
 *
 * `describe`, `key`, `ordering`, `eventTime`, `combine`, `handle` and `fire` are
 * the WIT `handler` interface over bytes: the component exports them
 * (`component.ts`) and the test host calls them, so a unit test runs
 * exactly the code the component runs. Each fails with an unrecoverable
 * error naming the tag when the module has no event type with that tag,
 * and naming the type when a body does not decode.
 */

import { Context, type HostApi } from "./context.js";
import type { EventOf, EventType } from "./event.js";
import { ContractError, I64_MAX, I64_MIN, checkDescription, checkEmits } from "./limits.js";
import { type Algebra, type Ordering, type Timer, type Timing, UnrecoverableError } from "./types.js";

/** A handler: called with the context and a chunk of events of one key and one type. */
export type Handler<T> = (ctx: Context, events: T[]) => void;

/** The timer handler: called with the context and a key's due timers of one time, in name order. */
export type TimerHandler = (ctx: Context, timers: Timer[]) => void;

/** One event type as `describe` reports it (the WIT record `event-type`). */
export interface EventTypeInfo {
  tag: number;
  name: string;
  algebra: Algebra;
  maxBatch: number;
  timing: Timing;
}

/** What a module declares about itself (the WIT record `module-info`). */
export interface ModuleInfo {
  eventTypes: EventTypeInfo[];
  emits: string[];
}

interface Entry {
  type: EventType<unknown>;
  handler: Handler<unknown>;
}

/**
 * A handler module: its event types, each with its handler, and the topics
 * it may emit to. `emits` is checked now (topic names, none of the host's
 * `retry_*`/`dlq_*`, none twice); tags as handlers are registered: two
 * types with one tag throw a `TypeError`, so the import, and the component
 * build, fail.
 */
export class Module {
  readonly name: string;
  readonly emits: readonly string[];
  private readonly entries = new Map<number, Entry>();
  private timerHandler: TimerHandler | undefined;

  constructor(name: string, options: { emits?: readonly string[] } = {}) {
    this.name = name;
    this.emits = Object.freeze([...(options.emits ?? [])]);
    try {
      checkEmits(this.emits);
    } catch (error) {
      if (error instanceof ContractError) {
        throw new TypeError(`module ${name}: ${error.message}`);
      }
      throw error;
    }
  }

  /** Registers `handler` for the events of `types` (one handler may serve several types). */
  handles<T>(type: EventType<T>, handler: Handler<T>): this;
  // `any`: a list of event types of different event shapes (EventType is invariant).
  handles<const L extends readonly EventType<any>[]>(types: L, handler: Handler<EventOf<L[number]>>): this;
  handles(types: EventType<unknown> | readonly EventType<unknown>[], handler: Handler<never>): this {
    const list = Array.isArray(types) ? types : [types];
    if (list.length === 0) {
      throw new TypeError(`module ${this.name}: handles() needs at least one event type`);
    }
    if (typeof handler !== "function") {
      throw new TypeError(`module ${this.name}: the handler of ${list.map((t) => t.name).join(", ")} is not a function`);
    }
    for (const type of list as EventType<unknown>[]) {
      if (typeof type?.decode !== "function" || typeof type.tag !== "number") {
        throw new TypeError(`module ${this.name}: ${String(type)} is not an event type (made with defineEvent)`);
      }
      const known = this.entries.get(type.tag);
      if (known !== undefined) {
        throw new TypeError(
          `module ${this.name}: event types ${known.type.name} and ${type.name} have the same tag ${type.tag}`,
        );
      }
      this.entries.set(type.tag, { type, handler: handler as Handler<unknown> });
    }
    return this;
  }

  /**
   * Registers the handler that fires the module's timers (at most one): it
   * may use state, emit, log and timers as an event handler does, setting
   * timers only later than the ones it fires (`timer-at-firing`).
   */
  onTimers(handler: TimerHandler): this {
    if (typeof handler !== "function") {
      throw new TypeError(`module ${this.name}: the timer handler is not a function`);
    }
    if (this.timerHandler !== undefined) {
      throw new TypeError(`module ${this.name}: onTimers() is called twice; a module has one timer handler`);
    }
    this.timerHandler = handler;
    return this;
  }

  /** Whether the module has a timer handler ({@link Module.onTimers}). */
  get handlesTimers(): boolean {
    return this.timerHandler !== undefined;
  }

  /** The event types this module handles, in the order registered. */
  get eventTypes(): EventType<unknown>[] {
    return [...this.entries.values()].map((entry) => entry.type);
  }

  private entry(tag: number): Entry {
    const entry = this.entries.get(tag);
    if (entry === undefined) {
      throw new UnrecoverableError(`module ${this.name} has no event type with tag ${tag}`);
    }
    return entry;
  }

  /** The event type with `tag`; an unrecoverable error naming the tag if there is none. */
  eventType(tag: number): EventType<unknown> {
    return this.entry(tag).type;
  }

  /** The event types and emit topics, checked by the rules the host applies to `describe`. */
  describe(): ModuleInfo {
    const eventTypes = this.eventTypes.map(({ tag, name, algebra, maxBatch, timing }) => ({
      tag,
      name,
      algebra,
      maxBatch,
      timing,
    }));
    checkDescription(eventTypes, this.emits);
    return { eventTypes, emits: [...this.emits] };
  }

  /** The canonical key bytes of a message body. */
  key(tag: number, body: Uint8Array): Uint8Array {
    const type = this.entry(tag).type;
    return type.keyBytes(type.decode(body));
  }

  /** The ordering a message body asks for. */
  ordering(tag: number, body: Uint8Array): Ordering {
    const type = this.entry(tag).type;
    return type.ordering(type.decode(body));
  }

  /**
   * When the event of a body happened (ms since the epoch, as a bigint) for
   * a timed type; `undefined` for an untimed one, which is not decoded. A
   * timed event without one, or with one that is no s64 integer, is an
   * unrecoverable error naming the rule (`event-time-declared`).
   */
  eventTime(tag: number, body: Uint8Array): bigint | undefined {
    const type = this.entry(tag).type;
    if (type.timing === "untimed") {
      return undefined;
    }
    const time = type.eventTime(type.decode(body));
    let big: bigint | undefined;
    if (typeof time === "bigint") {
      big = time;
    } else if (typeof time === "number" && Number.isSafeInteger(time)) {
      big = BigInt(time);
    }
    if (big === undefined || big < I64_MIN || big > I64_MAX) {
      throw new UnrecoverableError(
        `event-time-declared: ${type.name} declares event time, but its eventTime() returned ${String(time)}, not milliseconds since the epoch as an s64`,
      );
    }
    return big;
  }

  /** Folds a run of bodies (at least one) of an associative type into one body with its `combine`. */
  combine(tag: number, bodies: readonly Uint8Array[]): Uint8Array {
    const type = this.entry(tag).type;
    if (bodies.length === 0) {
      throw new UnrecoverableError(`combine of no ${type.name} events`);
    }
    if (type.algebra !== "associative") {
      throw new UnrecoverableError(`${type.name} is not associative`);
    }
    return type.encode(type.combine(bodies.map((body) => type.decode(body))));
  }

  /** Applies a chunk of bodies of one type to the key `key` (canonical bytes); state calls go to `host`. */
  handle(host: HostApi, tag: number, key: Uint8Array, bodies: readonly Uint8Array[]): void {
    const { type, handler } = this.entry(tag);
    const events = bodies.map((body) => type.decode(body));
    handler(new Context(host, key), events);
  }

  /**
   * Fires the key `key`'s due `timers` of one time with the timer handler;
   * state calls go to `host`. Without one, an unrecoverable error.
   */
  fire(host: HostApi, key: Uint8Array, timers: readonly Timer[]): void {
    if (this.timerHandler === undefined) {
      throw new UnrecoverableError(`the module handles no timers, but was asked to fire ${timers.length} of them`);
    }
    this.timerHandler(new Context(host, key), [...timers]);
  }
}
