/**
 * Windows of every kind over clicks, for the host's tests
 * (`tests/src/click_windows.rs`), the TypeScript twin of
 * `tests/guests/windows-py`: each click joins its key's tumbling, hopping
 * and session windows and a tumbling window with an allowed lateness; each
 * window's total is emitted to `totals` when the clock passes its close.
 * Late clicks (beyond the allowance) are listed in the key's `late` entry.
 */

import { type Aggregate, Module, type Window, Windows, defineEvent, t } from "wakuwaku-guest";

const Click = defineEvent({
  tag: 1,
  name: "Click",
  maxBatch: 1,
  timing: "timed",
  fields: { user: t.u64, at: t.i64, amount: t.i64 },
  key: (click) => click.user,
  eventTime: (click) => click.at,
});
type Click = ReturnType<typeof Click.decode>;

/** A closed window's total; `kind` names the windows (0 tumbling, 1 hopping, 2 sessions, 3 tumbling with lateness). */
const Total = defineEvent({
  tag: 2,
  name: "Total",
  fields: { kind: t.int, user: t.u64, start: t.i64, end: t.i64, total: t.i64 },
  key: (total) => total.user,
});

function sum(kind: number): Aggregate<Click, bigint> {
  return {
    initial: () => 0n,
    add: (total, click) => total + click.amount,
    merge: (total, other) => total + other,
    result: (user, window: Window, total) => Total.of({ kind, user: BigInt(user as number), ...window, total }),
    schema: t.i64,
  };
}

const windows = [
  new Windows("tumbling", { kind: "tumbling", size: 60_000 }, 0, "totals", sum(0)),
  new Windows("hopping", { kind: "hopping", size: 60_000, hop: 20_000 }, 0, "totals", sum(1)),
  new Windows("sessions", { kind: "session", gap: 15_000 }, 0, "totals", sum(2)),
  new Windows("lenient", { kind: "tumbling", size: 60_000 }, 30_000, "totals", sum(3)),
];

const late = t.array(t.array(t.json));

export default new Module("clickwindows", { emits: ["totals"] })
  .handles(Click, (ctx, clicks) => {
    for (const click of clicks) {
      for (const window of windows) {
        if (window.add(ctx, click.at, click) === "late") {
          ctx.set("late", [...(ctx.get("late", late) ?? []), [window.name, click.at]], late);
        }
      }
    }
  })
  .onTimers((ctx, timers) => {
    for (const window of windows) {
      window.fire(ctx, timers);
    }
  });
