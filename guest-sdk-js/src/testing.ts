/**
 * Unit-testing handlers with node's test runner: no component, no host.
 *
 * {@link MemoryHost} keeps state, counters, emitted messages and log lines
 * in memory, and drives a module through the same byte path the component
 * uses: each event is encoded, its key taken with the module's `key`, and
 * the bodies dispatched by tag through `Module.handle`, where they are
 * decoded again. It applies the host's rules with the host's messages
 * (`limits.ts`): state, counter and emit calls are refused past the same
 * limits and state quotas (counters per projection, entries per key), only
 * during a call, and log lines are cut and counted. A failed call leaves
 * no trace in state, counters, timers or emitted messages (its log lines
 * are kept).
 *
 * Timers (contract 0.5, `docs/timers.md`) are kept per key under the
 * host's rules by id (`timer-name`, `timer-payload-size`, `timer-time`,
 * `timer-at-firing`, `timers-per-key`, `timers-in-all`), and
 * {@link MemoryHost.advance} moves the projection's clock and fires the
 * due ones as the host does, so a timer is unit-tested without a log:
 *
 *     host.handle([Clicked.of({ user: 1n, at: 100n })]);  // sets "end" at 700
 *     assert.equal(host.advance(701), 1);                  // fires it
 *
 *     import { MemoryHost } from "wakuwaku-guest/testing";
 *
 *     const host = new MemoryHost(bank);
 *     host.handle([Deposited.of({ account: 42n, amount: 100n, count: 1n })]);
 *     assert.equal(host.get(42, "account", Account)?.balance, 100n);
 *
 * One difference from the host, on purpose: something thrown that is not a
 * `HandlerError` propagates as it is, with its stack, where the component
 * reports it as retryable (as a Rust panic traps).
 */

import { type Outgoing } from "./context.js";
import type { Event, EventType } from "./event.js";
import { fromUtf8, parseJson, utf8, writeJson } from "./json.js";
import { type DecodedKey, type KeyValue, decodeKey, encodeKey, toHex } from "./key.js";
import {
  CallTally,
  DEFAULT_LIMITS,
  LogTally,
  type PayloadLimits,
  checkCombinedBody,
  checkCounterCount,
  checkEntriesPerKey,
  checkKey,
  checkTimerName,
  checkTimersInAll,
  checkTimersPerKey,
  counterValue,
} from "./limits.js";
import type { Module } from "./module.js";
import { chunks, compareBytes, reduce } from "./reduce.js";
import type { Schema } from "./schema.js";
import { type Level, type Ordering, Refusal, type Timer } from "./types.js";

/** A line a handler logged (as kept: cut when long). */
export interface LogLine {
  /** The key being handled when it was logged, decoded. */
  readonly key: DecodedKey;
  readonly level: Level;
  readonly message: string;
}

type Record_ = { type: EventType<unknown>; body: Uint8Array; ordering: Ordering };

/**
 * The ordering the host plans one key's timed record `index` with
 * (`records` in event-time order): a `timed` record whose type differs from
 * the key's last `timed` record before it is a full barrier (`acq-rel`,
 * `event-time-order`); every other record keeps its own.
 */
function timeFenced(records: readonly Record_[], index: number): Ordering {
  const { type, ordering } = records[index]!;
  if (type.timing !== "timed") {
    return ordering;
  }
  for (let i = index - 1; i >= 0; i--) {
    if (records[i]!.type.timing === "timed") {
      return records[i]!.type === type ? ordering : "acq-rel";
    }
  }
  return ordering;
}

/**
 * The runs the host's planner makes of one key's records (type and
 * ordering, in order), as lists of indexes, in the order the host applies
 * them: segments cut at fences (`acquire` and `acq-rel` start one and head
 * it, `release` ends one as its tail, or gets one of its own when its type
 * heads a segment that holds other types), each segment's head, then its
 * body runs in order of first appearance, then its tail.
 */
export function plannedRuns(records: readonly { type: unknown; ordering: Ordering }[]): number[][] {
  const runs: number[][] = [];
  const slots: { type: unknown; indexes: number[] }[] = [];
  let open = false;
  let head = false;
  let tail: number | undefined;

  const finish = (): void => {
    const first = head && slots.length > 0 ? 1 : 0;
    const order: number[] = [];
    for (let i = 0; i < first; i++) order.push(i);
    for (let i = first; i < slots.length; i++) if (i !== tail) order.push(i);
    if (tail !== undefined) order.push(tail);
    for (const i of order) runs.push(slots[i]!.indexes);
    slots.length = 0;
    open = true;
    head = false;
    tail = undefined;
  };
  const slot = (type: unknown, index: number): number => {
    const found = slots.findIndex((s) => s.type === type);
    if (found >= 0) {
      slots[found]!.indexes.push(index);
      return found;
    }
    slots.push({ type, indexes: [index] });
    return slots.length - 1;
  };

  records.forEach(({ type, ordering }, index) => {
    if (ordering === "acquire" || ordering === "acq-rel") {
      finish();
      head = true;
      slot(type, index);
    } else if (ordering === "relaxed") {
      if (!open) finish();
      slot(type, index);
    } else {
      const onHead = head && slots[0]?.type === type;
      if (open && !(onHead && slots.length > 1)) {
        const number = slot(type, index);
        if (!onHead) tail = number;
      } else {
        finish();
        tail = slot(type, index);
      }
      open = false;
    }
  });
  finish();
  return runs;
}

/**
 * An in-memory host for unit tests of `module`: per-key state, shared
 * counters, emitted messages and log lines, under `limits` (the host's
 * defaults unless given). The module's `describe` is checked when the host
 * is made, as the host checks it at load.
 */
export class MemoryHost {
  readonly limits: PayloadLimits;
  /** Per key (hex of its bytes): its entries. */
  private state = new Map<string, Map<string, Uint8Array>>();
  private counters = new Map<string, bigint>();
  /** Per key (hex of its bytes): its pending timers by name. */
  private timerMap = new Map<string, Map<string, Timer>>();
  /** The messages emitted so far, in order. */
  readonly emitted: Outgoing[] = [];
  /** The lines logged so far, in order. */
  readonly logs: LogLine[] = [];

  constructor(
    readonly module: Module,
    options: { limits?: Partial<PayloadLimits> } = {},
  ) {
    module.describe();
    this.limits = { ...DEFAULT_LIMITS, ...options.limits };
  }

  /**
   * Delivers `events` as they are, without reduction: consecutive events of
   * one type and one key form a run, cut into chunks of at most the type's
   * `maxBatch`, each handed to the module's `handle`. Stops at the first
   * failing chunk (throwing its error); earlier chunks stay applied.
   */
  handle(events: Iterable<Event>): void {
    for (const { type, key, bodies } of this.runs(events)) {
      this.deliver(type, key, bodies);
    }
  }

  /**
   * Like {@link handle}, but first reduces each run with its type's
   * algebra, by the host's rules (`reduce.ts`): an associative run of two
   * or more is folded with the module's `combine`, an idempotent one loses
   * adjacent duplicates, an idempotent-commutative one is sorted and loses
   * all duplicates.
   */
  handleReduced(events: Iterable<Event>): void {
    for (const { type, key, bodies } of this.runs(events)) {
      const reduced = reduce(type.algebra, bodies, (run) => {
        const body = this.module.combine(type.tag, run);
        checkCombinedBody(this.limits, body);
        return body;
      });
      this.deliver(type, key, reduced);
    }
  }

  /**
   * Applies events of several types as the host applies a projection's
   * events read from several topics once it has read them all: events of
   * untimed types as they come, in the order given; events of timed types
   * held, put in event-time order (ties in the order given: list the events
   * topic by topic, each in log order), and planned as the host plans a
   * released batch, key by key: a key's events of `timed` types in
   * event-time order (`event-time-order`), those of `timed-relaxed` types
   * moving past them as their orderings allow. Each event's time comes from
   * the module's `eventTime`, as `waku publish` takes it, so a timed event
   * without one throws the publisher's `event-time-declared` error before
   * anything is applied. Runs are chunked by `maxBatch`, without reduction.
   */
  handleInEventTimeOrder(events: Iterable<Event>): void {
    const untimed: Event[] = [];
    const timed: { time: bigint; event: Event }[] = [];
    for (const event of events) {
      const time = this.module.eventTime(event.type.tag, event.type.encode(event.value));
      if (time === undefined) {
        untimed.push(event);
      } else {
        timed.push({ time, event });
      }
    }
    this.handle(untimed);
    // Array.prototype.sort is stable: equal times keep the order given.
    timed.sort((a, b) => (a.time < b.time ? -1 : a.time > b.time ? 1 : 0));
    const byKey = new Map<string, { key: Uint8Array; records: Record_[] }>();
    for (const { event } of timed) {
      const body = event.type.encode(event.value);
      const key = this.module.key(event.type.tag, body);
      checkKey(key);
      const id = toHex(key);
      let entry = byKey.get(id);
      if (entry === undefined) {
        entry = { key, records: [] };
        byKey.set(id, entry);
      }
      entry.records.push({ type: event.type, body, ordering: this.module.ordering(event.type.tag, body) });
    }
    for (const { key, records } of byKey.values()) {
      const planned = records.map((record, index) => ({ type: record.type, ordering: timeFenced(records, index) }));
      for (const run of plannedRuns(planned)) {
        this.deliver(records[run[0]!]!.type, key, run.map((index) => records[index]!.body));
      }
    }
  }

  private runs(events: Iterable<Event>): { type: EventType<unknown>; key: Uint8Array; bodies: Uint8Array[] }[] {
    const runs: { type: EventType<unknown>; key: Uint8Array; bodies: Uint8Array[] }[] = [];
    for (const event of events) {
      const body = event.type.encode(event.value);
      const key = this.module.key(event.type.tag, body);
      checkKey(key);
      const last = runs[runs.length - 1];
      if (last !== undefined && last.type === event.type && compareBytes(last.key, key) === 0) {
        last.bodies.push(body);
      } else {
        runs.push({ type: event.type, key, bodies: [body] });
      }
    }
    return runs;
  }

  private deliver(type: EventType<unknown>, key: Uint8Array, bodies: readonly Uint8Array[]): void {
    for (const chunk of chunks(bodies, type.maxBatch)) {
      this.handleBodies(type.tag, key, chunk);
    }
  }

  /**
   * One `handle` call with encoded bodies for the key with canonical bytes
   * `key`, as the host makes it. On error the call's state writes, counter
   * changes and emitted messages are rolled back and the error is thrown.
   */
  handleBodies(tag: number, key: Uint8Array, bodies: readonly Uint8Array[]): void {
    checkKey(key);
    this.undoable(key, undefined, (scope) => this.module.handle(scope, tag, key, bodies));
  }

  /**
   * Runs one call about `key` (firing the timers at `firing`, if any): on
   * error its state writes, counter changes, timer changes and emitted
   * messages are rolled back and the error is thrown.
   */
  private undoable(key: Uint8Array, firing: bigint | undefined, call: (scope: KeyScope) => void): void {
    const id = toHex(key);
    const state = new Map(this.state.get(id) ?? []);
    const timers = new Map(this.timerMap.get(id) ?? []);
    const counters = new Map(this.counters);
    const emitted = this.emitted.length;
    const scope = new KeyScope(this, key, id, firing);
    try {
      call(scope);
    } catch (error) {
      this.state.set(id, state);
      this.timerMap.set(id, timers);
      this.counters = counters;
      this.emitted.length = emitted;
      throw error;
    } finally {
      scope.close();
      if (this.timerMap.get(id)?.size === 0) {
        this.timerMap.delete(id);
      }
    }
  }

  /**
   * Moves the projection's clock to `clock` (ms since the epoch) and fires
   * every timer below it, as the host does when no event of the key is
   * left to apply before them: each key's due timers in (time, name)
   * order, all of one time in one call of the module's timer handler
   * ({@link Module.onTimers}); timers a call sets below the clock fire in
   * turn; keys in the order of their earliest due timer, then of their
   * bytes. Stops at the first failing call, throwing its error (its
   * changes taken back, its timers pending again). Returns how many calls
   * it made.
   */
  advance(clock: number | bigint): number {
    const now = BigInt(clock);
    let calls = 0;
    for (;;) {
      let next: { at: bigint; id: string } | undefined;
      for (const [id, timers] of this.timerMap) {
        for (const timer of timers.values()) {
          const earlier =
            next === undefined || timer.at < next.at || (timer.at === next.at && compareHex(id, next.id) < 0);
          if (timer.at < now && earlier) {
            next = { at: timer.at, id };
          }
        }
      }
      if (next === undefined) {
        return calls;
      }
      const { at, id } = next;
      const key = fromHex(id);
      this.undoable(key, at, (scope) => {
        const due = inFiringOrder([...this.timerMap.get(id)!.values()].filter((timer) => timer.at === at));
        for (const timer of due) {
          this.timerMap.get(id)!.delete(timer.name);
        }
        this.module.fire(scope, key, due);
      });
      calls += 1;
    }
  }

  /** The pending timers of `key` (a key value: `42`, `"ann"`, `[42, "eur"]`), in firing order. */
  timers(key: KeyValue): Timer[] {
    return inFiringOrder([...(this.timerMap.get(toHex(encodeKey(key)))?.values() ?? [])]);
  }

  /** A JSON state entry of `key` (a key value: `42`, `"ann"`, `[42, "eur"]`), read with `schema` when given. */
  get<T = unknown>(key: KeyValue, name: string, schema?: Schema<T>): T | undefined {
    const data = this.getBytes(key, name);
    if (data === undefined) {
      return undefined;
    }
    const value = parseJson(fromUtf8(data));
    return schema === undefined ? (value as T) : schema.read(value, "");
  }

  /** Writes a JSON state entry of `key`, e.g. to start a test from a given read model. */
  set<T>(key: KeyValue, name: string, value: T, schema?: Schema<T>): void {
    this.entriesOf(toHex(encodeKey(key)), true).set(name, utf8(schema === undefined ? writeJson(value) : schema.write(value)));
  }

  /** A state entry of `key`, as bytes. */
  getBytes(key: KeyValue, name: string): Uint8Array | undefined {
    return this.state.get(toHex(encodeKey(key)))?.get(name);
  }

  /** Every state entry of `key`. */
  entries(key: KeyValue): Map<string, Uint8Array> {
    return new Map(this.state.get(toHex(encodeKey(key))) ?? []);
  }

  /** Every key that has state, decoded, in canonical byte order. */
  keys(): DecodedKey[] {
    return [...this.state.entries()]
      .filter(([, entries]) => entries.size > 0)
      .map(([id]) => id)
      .sort()
      .map((id) => decodeKey(fromHex(id)));
  }

  /** The value of a shared counter (0 if never touched). */
  counter(name: string): bigint {
    return this.counters.get(name) ?? 0n;
  }

  /** @internal The entries of a key (hex id), made when `create`. */
  entriesOf(id: string, create: boolean): Map<string, Uint8Array> {
    let entries = this.state.get(id);
    if (entries === undefined) {
      entries = new Map();
      if (create) {
        this.state.set(id, entries);
      }
    }
    return entries;
  }

  /** @internal The shared counters. */
  counterMap(): Map<string, bigint> {
    return this.counters;
  }

  /** @internal The pending timers of a key (hex id), made when `create`. */
  timersOf(id: string, create: boolean): Map<string, Timer> {
    let timers = this.timerMap.get(id);
    if (timers === undefined) {
      timers = new Map();
      if (create) {
        this.timerMap.set(id, timers);
      }
    }
    return timers;
  }

  /** @internal How many timers the projection holds. */
  timerCount(): number {
    let count = 0;
    for (const timers of this.timerMap.values()) {
      count += timers.size;
    }
    return count;
  }
}

/** The bytes of a hex id. */
function fromHex(id: string): Uint8Array {
  return Uint8Array.from(id.match(/../g) ?? [], (byte) => Number.parseInt(byte, 16));
}

/** Hex ids compared as the bytes they stand for (lower-case hex sorts as its bytes). */
function compareHex(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** `timers` in the order they fire: time, then name as UTF-8 bytes. */
function inFiringOrder(timers: Timer[]): Timer[] {
  return timers.sort((a, b) => (a.at < b.at ? -1 : a.at > b.at ? 1 : compareBytes(utf8(a.name), utf8(b.name))));
}

/**
 * The host as one call about one key sees it: the module's host API during
 * that call, refusing everything once the call is over.
 */
class KeyScope {
  private tally = new CallTally();
  private readonly logTally = new LogTally();
  private open = true;

  constructor(
    private readonly host: MemoryHost,
    private readonly key: Uint8Array,
    private readonly id: string,
    /** The time of the timers being fired, in a `fire` call. */
    private readonly firing: bigint | undefined,
  ) {}

  close(): void {
    const closing = this.logTally.finish(this.host.limits);
    if (closing !== undefined) {
      this.host.logs.push({ key: decodeKey(this.key), level: "warn", message: closing });
    }
    this.open = false;
  }

  private checkOpen(face: string): void {
    if (!this.open) {
      throw new Refusal(`outside-handle: \`${face}\` is only available while \`handle\` or \`fire\` runs`);
    }
  }

  get(name: string): Uint8Array | undefined {
    this.checkOpen("state");
    return this.host.entriesOf(this.id, false).get(name);
  }

  set(name: string, value: Uint8Array): void {
    this.checkOpen("state");
    const before = this.tally.copy();
    this.tally.set(this.host.limits, name, value.length);
    const entries = this.host.entriesOf(this.id, true);
    if (!entries.has(name)) {
      try {
        checkEntriesPerKey(this.host.limits, name, entries.size);
      } catch (error) {
        // Refused: the call's counts stay as they were.
        this.tally = before;
        throw error;
      }
    }
    entries.set(name, value.slice());
  }

  delete(name: string): void {
    this.checkOpen("state");
    this.tally.delete(this.host.limits, name);
    this.host.entriesOf(this.id, false).delete(name);
  }

  counterAdd(name: string, delta: bigint): void {
    this.checkOpen("state");
    const counters = this.host.counterMap();
    const current = counters.get(name) ?? 0n;
    const before = this.tally.copy();
    const after = this.tally.counterAdd(this.host.limits, name, current, delta);
    if (!counters.has(name)) {
      try {
        checkCounterCount(this.host.limits, name, counters.size);
      } catch (error) {
        this.tally = before;
        throw error;
      }
    }
    counters.set(name, after);
  }

  counterGet(name: string): bigint {
    this.checkOpen("state");
    return counterValue(name, this.host.counterMap().get(name) ?? 0n);
  }

  emit(message: Outgoing): void {
    this.checkOpen("emit");
    this.tally.emit(this.host.limits, this.host.module.emits, message.topic, message.key, message.body);
    this.host.emitted.push(message);
  }

  setTimer(name: string, at: bigint, payload: Uint8Array): void {
    this.checkOpen("timers");
    const limits = this.host.limits;
    const before = this.tally.copy();
    this.tally.timerSet(limits, name, at, payload.length, this.firing);
    const timers = this.host.timersOf(this.id, true);
    if (!timers.has(name)) {
      try {
        checkTimersPerKey(limits, name, timers.size);
        checkTimersInAll(limits, name, this.host.timerCount());
      } catch (error) {
        // Refused: the call's counts stay as they were.
        this.tally = before;
        throw error;
      }
    }
    timers.set(name, { name, at, payload: payload.slice() });
  }

  cancelTimer(name: string): void {
    this.checkOpen("timers");
    this.tally.timerCancel(this.host.limits, name);
    this.host.timersOf(this.id, false).delete(name);
  }

  getTimer(name: string): Timer | undefined {
    this.checkOpen("timers");
    checkTimerName(name);
    const timer = this.host.timersOf(this.id, false).get(name);
    return timer === undefined ? undefined : { ...timer, payload: timer.payload.slice() };
  }

  log(level: Level, message: string): void {
    if (!this.open) {
      return;
    }
    const kept = this.logTally.admit(this.host.limits, message);
    if (kept !== undefined) {
      this.host.logs.push({ key: decodeKey(this.key), level, message: kept });
    }
  }
}
