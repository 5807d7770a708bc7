/** A small module for the SDK's tests: visits and a ledger, with every kind of declaration. */

import { Module, Timing, UnrecoverableError, defineEvent, t } from "../src/index.js";

export const Visited = defineEvent({
  tag: 1,
  name: "Visited",
  fields: { user: t.u64, page: t.string },
  key: (event) => event.user,
});

export const Added = defineEvent({
  tag: 2,
  name: "Added",
  algebra: "associative",
  fields: { user: t.u64, amount: t.i64, count: t.skipIfDefault(t.u64, 1n) },
  key: (event) => event.user,
  combine: (events) => ({
    user: events[0]!.user,
    amount: BigInt.asIntN(64, events.reduce((sum, e) => sum + e.amount, 0n)),
    count: BigInt.asUintN(64, events.reduce((sum, e) => sum + e.count, 0n)),
  }),
});

export const Flagged = defineEvent({
  tag: 3,
  name: "Flagged",
  fields: { user: t.u64, flag: t.enumOf("on", "off", "fail", "big") },
  key: (event) => [event.user, "flags"],
  ordering: (event) => (event.flag === "on" ? "acquire" : "release"),
});

export const Stamped = defineEvent({
  tag: 4,
  name: "Stamped",
  timing: Timing.Timed,
  fields: { user: t.u64, at: t.optional(t.i64) },
  key: (event) => event.user,
  eventTime: (event) => event.at,
});

export const Noted = defineEvent({
  tag: 5,
  name: "Noted",
  timing: "timed-relaxed",
  fields: { user: t.u64, at: t.int },
  key: (event) => event.user,
  eventTime: (event) => event.at,
});

export const Totals = t.object({ visits: t.int, amount: t.i64 });

export const visits = new Module("visits", { emits: ["audit"] });

visits.handles(Visited, (ctx, events) => {
  const totals = ctx.get("totals", Totals) ?? { visits: 0, amount: 0n };
  totals.visits += events.length;
  ctx.set("totals", totals, Totals);
  ctx.counterAdd("all_visits", events.length);
  ctx.info(`${events.length} visits`);
});

visits.handles(Added, (ctx, events) => {
  const totals = ctx.get("totals", Totals) ?? { visits: 0, amount: 0n };
  for (const event of events) totals.amount = BigInt.asIntN(64, totals.amount + event.amount);
  ctx.set("totals", totals, Totals);
  ctx.set("added_calls", (ctx.get<number>("added_calls") ?? 0) + 1);
});

visits.handles(Flagged, (ctx, events) => {
  for (const event of events) {
    ctx.set(`flag`, event.flag);
    if (event.flag === "fail") {
      ctx.counterAdd("all_visits", 100);
      ctx.emit("audit", Visited.of({ user: 0n, page: "failed" }));
      throw new UnrecoverableError(`flag of ${String(ctx.key)} failed`);
    }
    if (event.flag === "big") {
      try {
        ctx.setBytes("big", new Uint8Array(2 << 20));
      } catch (error) {
        ctx.warn(String((error as Error).message));
      }
    }
  }
  ctx.emit("audit", Visited.of({ user: 99n, page: "flags" }));
});

visits.handles([Stamped, Noted], (ctx, events) => {
  const seen = ctx.get<number[]>("times") ?? [];
  for (const event of events) seen.push(Number(event.at));
  ctx.set("times", seen);
});

export default visits;
