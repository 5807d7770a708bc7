/**
 * The component bridge (`component.ts`) with the WIT imports faked
 * (`fake-wit/`, registered by `npm test`): refusals arrive as
 * componentize-js throws them (the WIT error as `payload`), handler errors
 * leave with their class, anything else as retryable.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { exportHandler } from "../src/component.js";
import { Module, RetryableError, defineEvent, t } from "../src/index.js";
import { fromUtf8, utf8 } from "../src/json.js";
import { decodeKey } from "../src/key.js";
import { visits } from "./fixture.js";

interface Fake {
  calls: unknown[][];
  refuse: Set<string>;
  call(name: string, ...args: unknown[]): unknown;
}

const fake: Fake = {
  calls: [],
  refuse: new Set(),
  call(name, ...args) {
    this.calls.push([name, ...args]);
    if (this.refuse.has(name)) {
      // What componentize-js throws for the `err` of an import's result.
      throw Object.assign(new Error("refused"), { payload: `state-value-size: refused ${name}` });
    }
    return name === "counterGet" ? 41n : undefined;
  },
};
(globalThis as { wakuFakeHost?: Fake }).wakuFakeHost = fake;

/** The WIT `handler-error` an export call threw (as componentize-js reads it: `payload`). */
function witError(run: () => unknown): { class: string; message: string } {
  try {
    run();
  } catch (error) {
    return (error as { payload: { class: string; message: string } }).payload;
  }
  return assert.fail("the call did not fail");
}

test("describe is the module's, and calls go through to it", () => {
  const handler = exportHandler(visits);
  assert.deepEqual(handler.describe(), visits.describe());
  assert.deepEqual(decodeKey(handler.key(1, utf8('{"user":7,"page":"/"}'))), 7);
  assert.equal(handler.ordering(3, utf8('{"user":7,"flag":"on"}')), "acquire");
  assert.equal(handler.eventTime(4, utf8('{"user":7,"at":12}')), 12n);
  assert.equal(handler.eventTime(1, utf8("x")), undefined);
  assert.equal(fromUtf8(handler.combine(2, [utf8('{"user":1,"amount":1}'), utf8('{"user":1,"amount":2}')])), '{"user":1,"amount":3,"count":2}');
  fake.calls.length = 0;
  handler.handle(1, new Uint8Array([1, 14]), [utf8('{"user":7,"page":"/"}')]);
  assert.deepEqual(
    fake.calls.map((call) => call[0]),
    ["get", "set", "counterAdd", "log"],
  );
  assert.equal(fromUtf8(fake.calls[1]![2] as Uint8Array), '{"visits":1,"amount":0}');
  assert.equal(fake.calls[2]![2], 1n);
});

test("errors leave as the WIT's handler-error: their class, or retryable for anything else", () => {
  const handler = exportHandler(visits);
  assert.deepEqual(witError(() => handler.key(9, utf8("{}"))), {
    class: "unrecoverable",
    message: "module visits has no event type with tag 9",
  });
  const Boom = defineEvent({ tag: 1, name: "Boom", fields: { how: t.string }, key: () => 1 });
  const boom = exportHandler(
    new Module("boom").handles(Boom, (_ctx, [event]) => {
      if (event!.how === "retry") throw new RetryableError("later");
      if (event!.how === "huge") throw new RetryableError("x".repeat(100_000));
      throw new TypeError("not a function");
    }),
  );
  assert.deepEqual(witError(() => boom.handle(1, new Uint8Array([1, 2]), [utf8('{"how":"retry"}')])), {
    class: "retryable",
    message: "later",
  });
  const huge = witError(() => boom.handle(1, new Uint8Array([1, 2]), [utf8('{"how":"huge"}')]));
  assert.ok(huge.message.endsWith(" […cut]") && huge.message.length <= 4096 + 7, "cut to 4 KiB");
  const other = witError(() => boom.handle(1, new Uint8Array([1, 2]), [utf8('{"how":"?"}')]));
  assert.equal(other.class, "retryable");
  assert.match(other.message, /^uncaught TypeError in module boom at .*: not a function$/);
});

test("a refusal from an import becomes Refused, naming the rule", () => {
  const Try = defineEvent({ tag: 1, name: "Try", fields: {}, key: () => 1 });
  const seen: string[] = [];
  const handler = exportHandler(
    new Module("try").handles(Try, (ctx) => {
      try {
        ctx.set("x", 1);
      } catch (error) {
        seen.push(String(error));
      }
      ctx.set("y", 2);
    }),
  );
  fake.refuse = new Set(["set"]);
  const error = witError(() => handler.handle(1, new Uint8Array([1, 2]), [utf8("{}")]));
  fake.refuse = new Set();
  assert.deepEqual(seen, ["unrecoverable: cannot write state entry `x`: state-value-size: refused set"]);
  assert.deepEqual(error, {
    class: "unrecoverable",
    message: "cannot write state entry `y`: state-value-size: refused set",
  });
});

test("timers go through the timers import, and fire through the timer handler", () => {
  const Tick = defineEvent({ tag: 1, name: "Tick", fields: { at: t.i64 }, key: () => 1 });
  const fired: string[] = [];
  const handler = exportHandler(
    new Module("ticks")
      .handles(Tick, (ctx, [tick]) => {
        ctx.setTimer("next", tick!.at - 100n, { n: 1 });
        ctx.timer("next");
        ctx.cancelTimer("old");
      })
      .onTimers((ctx, timers) => {
        fired.push(...timers.map((timer) => `${timer.name}@${timer.at}:${fromUtf8(timer.payload)}`));
        ctx.setTimer("next", timers[0]!.at + 1n, null);
      }),
  );
  fake.calls.length = 0;
  handler.handle(1, new Uint8Array([1, 2]), [utf8('{"at":-5}')]);
  assert.deepEqual(fake.calls.map((call) => call.slice(0, 3)), [
    ["setTimer", "next", -105n],
    ["getTimer", "next"],
    ["cancelTimer", "old"],
  ]);
  assert.equal(fromUtf8(fake.calls[0]![3] as Uint8Array), '{"n":1}');
  handler.fire(new Uint8Array([1, 2]), [{ name: "next", at: -105n, payload: utf8("{}") }]);
  assert.deepEqual(fired, ["next@-105:{}"]);
  assert.deepEqual(fake.calls[3]!.slice(0, 3), ["setTimer", "next", -104n]);
  fake.refuse = new Set(["setTimer"]);
  const error = witError(() => handler.fire(new Uint8Array([1, 2]), [{ name: "next", at: 0n, payload: utf8("{}") }]));
  fake.refuse = new Set();
  assert.deepEqual(error, {
    class: "unrecoverable",
    message: "cannot set timer `next`: state-value-size: refused setTimer",
  });
  assert.deepEqual(witError(() => exportHandler(visits).fire(new Uint8Array([1, 2]), [])), {
    class: "unrecoverable",
    message: "the module handles no timers, but was asked to fire 0 of them",
  });
});
