/** Each window kind in the test host against an oracle computed by sorting, and the allowed lateness. */

import assert from "node:assert/strict";
import { test } from "node:test";
import { type Aggregate, Module, type Window, Windows, defineEvent, t } from "../src/index.js";
import { MemoryHost } from "../src/testing.js";

const Click = defineEvent({
  tag: 1,
  name: "Click",
  maxBatch: 1,
  timing: "timed",
  fields: { key: t.u64, at: t.i64, amount: t.i64 },
  key: (click) => click.key,
  eventTime: (click) => click.at,
});
type Click = ReturnType<typeof Click.decode>;

/** A closed window's total, `kind` naming the windows. */
const Total = defineEvent({
  tag: 2,
  name: "Total",
  fields: { kind: t.int, key: t.u64, start: t.i64, end: t.i64, total: t.i64 },
  key: (total) => total.key,
});
type Total = { -readonly [F in keyof ReturnType<typeof Total.decode>]: ReturnType<typeof Total.decode>[F] };

/** Sums the amounts; `kind` names the windows in the result. */
function sum(kind: number): Aggregate<Click, bigint> {
  return {
    initial: () => 0n,
    add: (total, click) => total + click.amount,
    merge: (total, other) => total + other,
    result: (key, window: Window, total) =>
      Total.of({ kind, key: BigInt(key as number), start: window.start, end: window.end, total }),
    schema: t.i64,
  };
}

const tumbling = new Windows("tumbling", { kind: "tumbling", size: 10 }, 0, "totals", sum(0));
const hopping = new Windows("hopping", { kind: "hopping", size: 10, hop: 5 }, 0, "totals", sum(1));
const sessions = new Windows("sessions", { kind: "session", gap: 5 }, 0, "totals", sum(2));
/** Tumbling windows kept open 5 ms past their end. */
const lenient = new Windows("lenient", { kind: "tumbling", size: 10 }, 5, "totals", sum(3));

/** Every kind at once over the same clicks; late ones noted per key. */
const clicks = new Module("clicks", { emits: ["totals"] })
  .handles(Click, (ctx, events) => {
    for (const click of events) {
      tumbling.add(ctx, click.at, click);
      hopping.add(ctx, click.at, click);
      sessions.add(ctx, click.at, click);
      if (lenient.add(ctx, click.at, click) === "late") {
        ctx.set("late", [...(ctx.get("late", t.array(t.i64)) ?? []), click.at], t.array(t.i64));
      }
    }
  })
  .onTimers((ctx, timers) => {
    for (const windows of [tumbling, hopping, sessions, lenient]) {
      windows.fire(ctx, timers);
    }
  });

const byTotal = (a: Total, b: Total) =>
  a.kind - b.kind || Number(a.key - b.key) || Number(a.start - b.start) || Number(a.end - b.end);

function totals(host: MemoryHost): Total[] {
  return host.emitted.map((message) => Total.decode(message.body)).sort(byTotal);
}

/** Hands `events` over as the host does: the clock moved to each one's time first, then past the last. */
function run(events: Click[]): MemoryHost {
  const host = new MemoryHost(clicks);
  for (const click of events) {
    host.advance(click.at);
    host.handle([Click.of(click)]);
  }
  host.advance(events.reduce((last, click) => (click.at > last ? click.at : last), 0n) + 1n);
  return host;
}

/** Seeded clicks of 3 keys in time order, several of one time (the Rust SDK's generator). */
function seeded(seed: bigint, count: number): Click[] {
  let state = seed;
  const next = (below: bigint) => {
    state = BigInt.asUintN(64, state * 6_364_136_223_846_793_005n + 1_442_695_040_888_963_407n);
    return (state >> 33n) % below;
  };
  let at = 0n;
  return Array.from({ length: count }, () => {
    at += next(5n);
    return { key: next(3n), at, amount: next(100n) };
  });
}

/** The totals the oracle gives: each key's events sorted by time, put in each kind's windows, those closed by the final clock. */
function oracle(events: Click[]): Total[] {
  const clock = events.reduce((last, click) => (click.at > last ? click.at : last), 0n) + 1n;
  const sums = new Map<string, Total>();
  const add = (kind: number, key: bigint, start: bigint, end: bigint, amount: bigint) => {
    const id = `${kind}/${key}/${start}/${end}`;
    const total = sums.get(id) ?? { kind, key, start, end, total: 0n };
    total.total += amount;
    sums.set(id, total);
  };
  const floor = (value: bigint, step: bigint) => value - (((value % step) + step) % step);
  for (const click of events) {
    const start = floor(click.at, 10n);
    add(0, click.key, start, start + 10n, click.amount);
    add(3, click.key, start, start + 10n, click.amount);
    const hop = floor(click.at, 5n);
    for (const from of [hop - 5n, hop]) add(1, click.key, from, from + 10n, click.amount);
  }
  const closed = [...sums.values()];
  for (const key of new Set(events.map((click) => click.key))) {
    const mine = events.filter((click) => click.key === key).sort((a, b) => Number(a.at - b.at));
    let session: Total | undefined;
    for (const click of mine) {
      if (session === undefined || click.at >= session.end) {
        session = { kind: 2, key, start: click.at, end: click.at + 5n, total: 0n };
        closed.push(session);
      }
      session.end = click.at + 5n;
      session.total += click.amount;
    }
  }
  const lateness = (total: Total) => (total.kind === 3 ? 5n : 0n);
  return closed.filter((total) => total.end - 1n + lateness(total) < clock).sort(byTotal);
}

test("tumbling, hopping and session windows emit what sorting gives", () => {
  for (let seed = 0n; seed < 20n; seed++) {
    const events = seeded(seed, 60);
    const host = run(events);
    assert.deepEqual(totals(host), oracle(events), `seed ${seed}`);
    assert.equal(host.counter("lenient/late"), 0n, `seed ${seed}: in order, nothing is late`);
  }
});

test("a late event within the allowance joins its window, one beyond it is counted and handed back", () => {
  const host = new MemoryHost(clicks);
  const click = (at: bigint, amount: bigint) => Click.of({ key: 1n, at, amount });
  for (const [event, clock] of [
    [click(1n, 1n), 1n],
    [click(12n, 10n), 12n],
    [click(8n, 100n), 12n],
    [click(20n, 1000n), 20n],
  ] as const) {
    host.advance(clock);
    host.handle([event]);
  }
  // [0, 10) closed at 14 (9 + 5) when the clock reached 20, with the late click at 8 in it.
  assert.deepEqual(
    totals(host).filter((total) => total.kind === 3),
    [{ kind: 3, key: 1n, start: 0n, end: 10n, total: 101n }],
  );
  // Beyond it: counted, handed back, in no window.
  host.handle([click(3n, 5n)]);
  assert.equal(host.counter("lenient/late"), 1n);
  assert.deepEqual(host.get(1, "late", t.array(t.i64)), [3n]);
  host.advance(100);
  assert.ok(!totals(host).some((total) => total.kind === 3 && total.start === 0n && total.total !== 101n));
});

test("the state keeps the Rust SDK's layout: open windows by start as [end, aggregate], the last close time", () => {
  const host = new MemoryHost(clicks);
  host.handle([Click.of({ key: 4n, at: 12n, amount: 3n })]);
  assert.deepEqual(host.get(4, "hopping/open"), { "5": [15, 3], "10": [20, 3] });
  assert.deepEqual(
    host.timers(4).filter((timer) => timer.name.startsWith("hopping/")).map((timer) => [timer.name, timer.at]),
    [["hopping/5", 14n], ["hopping/10", 19n]],
  );
  host.advance(15);
  assert.deepEqual(host.get(4, "hopping/open"), { "10": [20, 3] });
  assert.equal(host.get(4, "hopping/closed"), 14);
});

test("a session bridged by an event merges, and its earlier timer is cancelled", () => {
  const host = new MemoryHost(clicks);
  host.handle([Click.of({ key: 2n, at: 0n, amount: 1n }), Click.of({ key: 2n, at: 8n, amount: 2n })]);
  assert.deepEqual(host.get(2, "sessions/open"), { "0": [5, 1], "8": [13, 2] });
  host.handle([Click.of({ key: 2n, at: 4n, amount: 4n })]);
  assert.deepEqual(host.get(2, "sessions/open"), { "0": [13, 7] });
  assert.deepEqual(
    host.timers(2).filter((timer) => timer.name.startsWith("sessions/")).map((timer) => [timer.name, timer.at]),
    [["sessions/0", 12n]],
  );
});

test("lengths that make no windows are refused by name", () => {
  const none = sum(9);
  assert.throws(() => new Windows("w", { kind: "tumbling", size: 0 }, 0, "totals", none), /window's size must be a whole number/);
  assert.throws(() => new Windows("w", { kind: "hopping", size: 10, hop: 3 }, 0, "totals", none), /hop \(3\) must divide its size \(10\)/);
  assert.throws(() => new Windows("w", { kind: "session", gap: 1.5 }, 0, "totals", none), /window's gap must be/);
  assert.throws(() => new Windows("w", { kind: "tumbling", size: 10 }, -1, "totals", none), /window's lateness must be/);
});
