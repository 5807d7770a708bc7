/** The test host: state, counters, emits and logs under the host's rules; failed calls leave nothing. */

import assert from "node:assert/strict";
import { test } from "node:test";
import {
  type Context,
  type HostApi,
  Module,
  Refused,
  UnrecoverableError,
  defineEvent,
  t,
  timerPayload,
} from "../src/index.js";
import { fromUtf8 } from "../src/json.js";
import { MemoryHost } from "../src/testing.js";
import { Added, Flagged, Noted, Stamped, Totals, Visited, visits } from "./fixture.js";

test("state, counters and logs of a run of events", () => {
  const host = new MemoryHost(visits);
  host.handle([
    Visited.of({ user: 7n, page: "/" }),
    Visited.of({ user: 7n, page: "/a" }),
    Visited.of({ user: 8n, page: "/" }),
  ]);
  assert.deepEqual(host.get(7, "totals", Totals), { visits: 2, amount: 0n });
  assert.equal(fromUtf8(host.getBytes(8, "totals")!), '{"visits":1,"amount":0}');
  assert.equal(host.counter("all_visits"), 3n);
  assert.equal(host.counter("never"), 0n);
  assert.deepEqual(host.keys(), [7, 8]);
  assert.deepEqual(
    host.logs.map((line) => [line.key, line.level, line.message]),
    [
      [7, "info", "2 visits"],
      [8, "info", "1 visits"],
    ],
  );
});

test("runs are cut by max batch, and reduced by algebra only when asked", () => {
  const host = new MemoryHost(visits);
  const adds = [5n, -2n, 10n].map((amount) => Added.of({ user: 1n, amount, count: 1n }));
  host.handle(adds);
  assert.equal(host.get(1, "added_calls"), 1, "one run, one call");
  host.handleReduced(adds);
  assert.equal(host.get(1, "added_calls"), 2, "folded into one event");
  assert.equal(host.get(1, "totals", Totals)?.amount, 26n);
  const Small = defineEvent({ tag: 1, name: "Small", maxBatch: 2, fields: { n: t.int }, key: () => 0 });
  const calls: number[] = [];
  const module = new Module("small").handles(Small, (_ctx, events) => {
    calls.push(events.length);
  });
  new MemoryHost(module).handle([1, 2, 3, 4, 5].map((n) => Small.of({ n })));
  assert.deepEqual(calls, [2, 2, 1]);
});

test("a failed call keeps nothing it wrote, counted or emitted", () => {
  const host = new MemoryHost(visits);
  host.handle([Flagged.of({ user: 3n, flag: "on" })]);
  assert.equal(host.get([3, "flags"], "flag"), "on");
  assert.equal(host.emitted.length, 1);
  assert.throws(
    () => host.handle([Flagged.of({ user: 3n, flag: "fail" })]),
    (error: Error) => error instanceof UnrecoverableError && error.message === "flag of 3,flags failed",
  );
  assert.equal(host.get([3, "flags"], "flag"), "on", "the write was rolled back");
  assert.equal(host.counter("all_visits"), 0n);
  assert.equal(host.emitted.length, 1, "the emit was rolled back");
  const message = host.emitted[0]!;
  assert.deepEqual([message.topic, message.tag, message.ordering, message.algebra], ["audit", 1, "relaxed", "non-associative"]);
  assert.deepEqual(Visited.decode(message.body), { user: 99n, page: "flags" });
});

test("refusals name their rule, and a caught one lets the call go on", () => {
  const host = new MemoryHost(visits);
  host.handle([Flagged.of({ user: 4n, flag: "big" })]);
  assert.equal(host.getBytes([4, "flags"], "big"), undefined, "nothing of the refused value is kept");
  assert.match(host.logs[0]!.message, /^cannot write state entry `big`: state-value-size: state value `big` has 2097152 bytes/);
  assert.equal(host.get([4, "flags"], "flag"), "big", "the call succeeded without it");
});

test("the host's limits and quotas apply, with the host's words", () => {
  const Poke = defineEvent({ tag: 1, name: "Poke", fields: { what: t.string, n: t.int }, key: () => 1 });
  const rules: string[] = [];
  const module = new Module("poke", { emits: ["out"] }).handles(Poke, (ctx, events) => {
    for (const { what, n } of events) {
      try {
        if (what === "set") for (let i = 0; i < n; i++) ctx.set(`e${i}`, i);
        if (what === "count") for (let i = 0; i < n; i++) ctx.counterAdd(`c${i}`, 1);
        if (what === "add") ctx.counterAdd("c0", BigInt(n) << 62n);
        if (what === "emit") ctx.emit(what === "emit" && n === 0 ? "elsewhere" : "out", Poke.of({ what, n }));
        if (what === "name") ctx.set("", 1);
        if (what === "nul") ctx.get("a\0b");
      } catch (error) {
        assert.ok(error instanceof Refused, String(error));
        rules.push(error.rule);
      }
    }
  });
  const host = new MemoryHost(module, { limits: { maxEntriesPerKey: 3, maxCounters: 2 } });
  host.handle(["set:5", "count:3", "add:1", "add:1", "emit:0", "emit:1", "name:0"].map((text) => {
    const [what, n] = text.split(":");
    return Poke.of({ what: what!, n: Number(n) });
  }));
  assert.deepEqual(rules, ["entries-per-key", "counter-count", "counter-range", "emit-topic", "name-length"]);
  assert.equal(host.entries(1).size, 3);
  assert.equal(host.counter("c0"), (1n << 62n) + 1n);
  assert.equal(host.emitted.length, 1);
});

test("outside a call the host refuses every state call (outside-handle) and drops log lines", () => {
  let kept: Context | undefined;
  const Once = defineEvent({ tag: 1, name: "Once", fields: {}, key: () => "k" });
  const module = new Module("once").handles(Once, (ctx) => {
    kept = ctx;
  });
  const host = new MemoryHost(module);
  host.handle([Once.of({})]);
  assert.throws(() => kept!.get("x"), (error: Error) => error instanceof Refused && error.rule === "outside-handle");
  assert.throws(() => kept!.counterAdd("x", 1), /outside-handle: `state` is only available while `handle` or `fire` runs/);
  assert.throws(() => kept!.emit("out", Once.of({})), /outside-handle: `emit`/);
  kept!.info("too late");
  assert.equal(host.logs.length, 0);
});

test("log lines are cut and counted per call", () => {
  const Chatty = defineEvent({ tag: 1, name: "Chatty", fields: {}, key: () => 1 });
  const module = new Module("chatty").handles(Chatty, (ctx) => {
    for (let i = 0; i < 4; i++) ctx.info(i === 0 ? "x".repeat(10) : `line ${i}`);
  });
  const host = new MemoryHost(module, { limits: { maxLogLine: 4, maxLogLinesPerCall: 2 } });
  host.handle([Chatty.of({})]);
  assert.deepEqual(
    host.logs.map((line) => line.message),
    ["xxxx […cut]", "line […cut]", "log-lines-per-call: 2 more log lines of this call dropped (at most 2 per call)"],
  );
});

test("timed events are applied in event-time order, across types as the host plans them", () => {
  const host = new MemoryHost(visits);
  host.handleInEventTimeOrder([
    Stamped.of({ user: 1n, at: 30n }),
    Visited.of({ user: 1n, page: "/" }),
    Stamped.of({ user: 1n, at: 10n }),
    Noted.of({ user: 1n, at: 20 }),
    Stamped.of({ user: 1n, at: 40n }),
  ]);
  // Noted is timed-relaxed: it may move past Stamped (one run per type).
  assert.deepEqual(host.get(1, "times"), [10, 30, 40, 20]);
  assert.equal(host.get(1, "totals", Totals)?.visits, 1);
  assert.throws(
    () => host.handleInEventTimeOrder([Stamped.of({ user: 2n, at: undefined })]),
    /event-time-declared: Stamped declares event time/,
  );
  assert.equal(host.get(2, "times"), undefined, "nothing was applied");
});

/**
 * Counts clicks per session: each click moves the `end` timer, whose payload
 * is the count; firing it records the session and, at a count of 99, tries
 * to set a timer at its own time (refused). `Arm` sets `end` as given and
 * tries a second timer, noting the refusal.
 */
const Click = defineEvent({ tag: 1, name: "Click", fields: { user: t.u64, at: t.i64 }, key: (e) => e.user });
const Arm = defineEvent({ tag: 2, name: "Arm", fields: { user: t.u64, at: t.i64, count: t.int }, key: (e) => e.user });
const sessions = new Module("sessions")
  .handles(Click, (ctx, clicks) => {
    for (const click of clicks) {
      const end = ctx.timer("end");
      const count = end === undefined ? 0 : timerPayload(end, t.int);
      ctx.setTimer("end", click.at + 10n, count + 1);
    }
  })
  .handles(Arm, (ctx, [arm]) => {
    ctx.setTimer("end", arm!.at, arm!.count, t.int);
    try {
      ctx.setTimer("more", 1, null);
    } catch (error) {
      ctx.set("refused", (error as Refused).rule);
    }
  })
  .onTimers((ctx, timers) => {
    const seen = ctx.get("sessions", t.array(t.array(t.int))) ?? [];
    for (const timer of timers) {
      const count = timerPayload(timer, t.int);
      if (count === 99) ctx.setTimer("again", timer.at, 0);
      seen.push([Number(timer.at), count]);
    }
    ctx.set("sessions", seen);
  });

test("timers fire when the clock passes them, in time order, and keep the host's rules", () => {
  const host = new MemoryHost(sessions, { limits: { maxTimersPerKey: 1 } });
  host.handle([Click.of({ user: 1n, at: 100n }), Click.of({ user: 1n, at: 105n }), Click.of({ user: 2n, at: 103n })]);
  assert.deepEqual(
    host.timers(1).map((timer) => [timer.name, timer.at, fromUtf8(timer.payload)]),
    [["end", 115n, "2"]],
    "the click at 105 moved the timer",
  );
  assert.equal(host.advance(113), 0, "nothing is due below 113 but key 2's at 113");
  assert.equal(host.advance(114), 1);
  assert.deepEqual(host.get(2, "sessions"), [[113, 1]]);
  assert.equal(host.advance(116n), 1);
  assert.deepEqual(host.get(1, "sessions"), [[115, 2]]);
  assert.deepEqual(host.timers(1), []);
  // `timers-per-key`: a new timer past the quota is refused, the call goes on.
  host.handle([Arm.of({ user: 3n, at: 200n, count: 99 })]);
  assert.equal(host.get(3, "refused"), "timers-per-key");
  // `timer-at-firing`: a fire call sets timers only later than them; the
  // failed call is taken back and its timer stays pending.
  assert.throws(
    () => host.advance(201),
    (error: Error) => error instanceof Refused && error.rule === "timer-at-firing",
  );
  assert.equal(host.timers(3).length, 1, "a failed fire keeps its timers");
  assert.equal(host.get(3, "sessions"), undefined);
  // A module without a timer handler fails if asked to fire.
  assert.throws(
    () => visits.fire({} as HostApi, new Uint8Array([1, 2]), []),
    /the module handles no timers, but was asked to fire 0 of them/,
  );
});

test("timer names, payloads, times and the projection's quota are the host's rules", () => {
  const Set_ = defineEvent({
    tag: 1,
    name: "Set",
    fields: { user: t.u64, name: t.string, at: t.i64, bytes: t.int },
    key: (e) => e.user,
  });
  const module = new Module("set").handles(Set_, (ctx, [set]) => {
    ctx.setTimerBytes(set!.name, set!.at, new Uint8Array(set!.bytes));
  });
  const host = new MemoryHost(module, { limits: { maxTimerPayload: 4, maxTimers: 2 } });
  const refused = (fields: { user?: bigint; name?: string; at?: bigint; bytes?: number }): string => {
    try {
      host.handle([Set_.of({ user: 1n, name: "t", at: 5n, bytes: 0, ...fields })]);
    } catch (error) {
      return (error as Refused).rule;
    }
    return "accepted";
  };
  assert.equal(refused({ name: "" }), "timer-name");
  assert.equal(refused({ name: "a\0b" }), "timer-name");
  assert.equal(refused({ name: "n".repeat(129) }), "timer-name");
  assert.equal(refused({ bytes: 5 }), "timer-payload-size");
  assert.equal(refused({ at: (1n << 63n) - 1n }), "timer-time");
  assert.equal(refused({ user: 1n, name: "a" }), "accepted");
  assert.equal(refused({ user: 2n, name: "b" }), "accepted");
  assert.equal(refused({ user: 3n, name: "c" }), "timers-in-all");
  assert.equal(refused({ user: 2n, name: "b", at: 9n }), "accepted", "moving one is never refused");
  assert.deepEqual(host.timers(3), [], "the refused call left nothing");
  // Due timers of one time fire in one call, names in byte order, keys by earliest time.
  const order: string[] = [];
  const many = new Module("many")
    .handles(Set_, (ctx, events) => {
      for (const set of events) ctx.setTimerBytes(set.name, set.at, new Uint8Array());
    })
    .onTimers((ctx, timers) => {
      order.push(`${String(ctx.key)}:${timers.map((timer) => `${timer.name}@${timer.at}`).join(",")}`);
      if (timers[0]!.name === "z") ctx.setTimerBytes("y", 8, new Uint8Array());
    });
  const all = new MemoryHost(many);
  all.handle([
    Set_.of({ user: 1n, name: "z", at: 7n, bytes: 0 }),
    Set_.of({ user: 1n, name: "\u{1F600}", at: 7n, bytes: 0 }),
    Set_.of({ user: 1n, name: "\uFFFF", at: 7n, bytes: 0 }),
    Set_.of({ user: 2n, name: "a", at: 3n, bytes: 0 }),
    Set_.of({ user: 3n, name: "a", at: 7n, bytes: 0 }),
  ]);
  assert.equal(all.advance(10), 4, "the timer set while firing, below the clock, fires in turn");
  assert.deepEqual(order, ["2:a@3", "1:z@7,\uFFFF@7,\u{1F600}@7", "3:a@7", "1:y@8"]);
});
