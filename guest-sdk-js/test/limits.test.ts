/**
 * The host's rules and limits, with the host's messages: the cases and
 * expected words of `core/src/limits.rs`'s tests, and every rule id the
 * host's `Refusal` and `ContractError` name produced here too.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, test } from "node:test";
import { encodeKey } from "../src/key.js";
import {
  CallTally,
  ContractError,
  DEFAULT_LIMITS,
  type DescribedType,
  I64_MAX,
  I64_MIN,
  LogTally,
  MAX_EMIT_TOPICS,
  MAX_ERROR_MESSAGE_BYTES,
  MAX_EVENT_TYPES,
  MAX_NAME_BYTES,
  MAX_TIMER_NAME_BYTES,
  type PayloadLimits,
  checkCombinedBody,
  checkCounterCount,
  checkDescription,
  checkEntriesPerKey,
  checkKey,
  checkName,
  checkTimersInAll,
  checkTimersPerKey,
  counterValue,
  errorMessage,
  isEventTypeName,
  utf8Length,
} from "../src/limits.js";
import { utf8 } from "../src/json.js";
import { Refusal } from "../src/types.js";
import { REPO } from "./vectors.js";

const SMALL: PayloadLimits = {
  ...DEFAULT_LIMITS,
  maxStateValue: 8,
  maxStateWritesPerCall: 3,
  maxStateBytesPerCall: 20,
  maxCounterChangesPerCall: 2,
  maxEmitBody: 8,
  maxEmitsPerCall: 2,
  maxEmitBytesPerCall: 24,
  maxLogLine: 5,
  maxLogLinesPerCall: 2,
  maxCounters: 3,
  maxEntriesPerKey: 2,
};

/** Every rule id a case here saw refused. */
const seen = new Set<string>();

/** The rule id of what `call` throws (a Refusal or a ContractError). */
function rule(call: () => unknown): string {
  try {
    call();
  } catch (error) {
    if (error instanceof Refusal || error instanceof ContractError) {
      seen.add(error.rule);
      return error.rule;
    }
    throw error;
  }
  assert.fail("nothing was refused");
}

/** The message of the refusal `call` throws. */
function refusal(call: () => unknown): string {
  rule(call);
  try {
    call();
  } catch (error) {
    return (error as Error).message;
  }
  return "";
}

test("names are 1 to 256 bytes and hold no NUL", () => {
  assert.equal(rule(() => checkName("")), "name-length");
  assert.equal(rule(() => checkName("n".repeat(257))), "name-length");
  assert.equal(rule(() => checkName("é".repeat(129))), "name-length", "bytes are counted, not characters");
  checkName("n");
  checkName("n".repeat(MAX_NAME_BYTES));
  assert.equal(
    refusal(() => checkName("a\0b")),
    "name-nul: an entry or counter name holds no NUL character (U+0000); this one has one at byte 1",
  );
  assert.equal(rule(() => checkName("\0")), "name-nul");
  assert.equal(rule(() => checkName("\0".repeat(300))), "name-length", "past the length rule first");
  checkName("é\u0001\u007f");
  assert.equal(utf8Length("é日\u{1F600}\ud800"), 2 + 3 + 4 + 3);
});

test("state writes are checked, then counted", () => {
  let tally = new CallTally();
  assert.equal(
    refusal(() => tally.set(SMALL, "big", 9)),
    "state-value-size: state value `big` has 9 bytes, over the limit of 8 bytes",
  );
  assert.deepEqual(tally, new CallTally(), "a refused write counts nothing");
  tally.set(SMALL, "a", 8);
  tally.delete(SMALL, "bb");
  assert.deepEqual([tally.stateWrites, tally.stateBytes], [2, 11]);
  assert.equal(rule(() => tally.set(SMALL, "c", 9)), "state-value-size");
  tally.set(SMALL, "c", 8);
  assert.equal(rule(() => tally.delete(SMALL, "d")), "state-writes-per-call");
  tally = new CallTally();
  tally.set(SMALL, "aaaaaaaaaaaa", 8);
  assert.equal(
    refusal(() => tally.set(SMALL, "b", 1)),
    "state-bytes-per-call: one call may write at most 20 bytes of names and values; this write would make 22",
  );
  assert.equal(rule(() => tally.delete(SMALL, "")), "name-length");
});

test("counters stay in range as the key sees them", () => {
  const tally = new CallTally();
  assert.equal(tally.counterAdd(SMALL, "c", I64_MAX - 1n, 1n), I64_MAX);
  assert.equal(
    refusal(() => tally.counterAdd(SMALL, "c", I64_MAX, 1n)),
    "counter-range: counter `c` is 9223372036854775807 as this key sees it; adding 1 leaves the s64 range",
  );
  assert.equal(tally.counterChanges, 1, "the refused change is not counted");
  assert.equal(tally.counterAdd(SMALL, "c", I64_MAX + 5n, -5n), I64_MAX);
  assert.equal(rule(() => tally.counterAdd(SMALL, "c", 0n, 1n)), "counter-changes-per-call");
  assert.equal(rule(() => counterValue("c", I64_MIN - 1n)), "counter-range");
  assert.equal(counterValue("c", -3n), -3n);
});

test("new counters and entries stop at their quota, with the numbers in the refusal", () => {
  checkCounterCount(SMALL, "c", 2);
  assert.equal(
    refusal(() => checkCounterCount(SMALL, "c", 3)),
    "counter-count: the projection holds 3 counters (committed and pending), at most 3; counter `c` would be a new one",
  );
  checkEntriesPerKey(SMALL, "e", 1);
  assert.equal(
    refusal(() => checkEntriesPerKey(SMALL, "e", 2)),
    "entries-per-key: this key holds 2 entries (committed and written in this batch), at most 2; entry `e` would be a new one",
  );
  const long = "n".repeat(MAX_NAME_BYTES);
  assert.ok(refusal(() => checkEntriesPerKey(SMALL, long, 9)).includes(`\`${long.slice(0, 64)}…\``));
});

test("emits go to declared topics with canonical keys and bounded bodies", () => {
  const declared = ["out"];
  const key = encodeKey(7);
  const tally = new CallTally();
  assert.equal(
    refusal(() => tally.emit(SMALL, declared, "dlq_in", key, utf8("b"))),
    "emit-topic: `dlq_in` is not among the topics the module declared in `module-info.emits` (out)",
  );
  assert.ok(refusal(() => tally.emit(SMALL, [], "out", key, utf8("b"))).endsWith("(none)"));
  assert.equal(rule(() => tally.emit(SMALL, declared, "out", key, new Uint8Array())), "emit-body-size");
  assert.equal(rule(() => tally.emit(SMALL, declared, "out", key, new Uint8Array(9))), "emit-body-size");
  assert.equal(
    refusal(() => tally.emit(SMALL, declared, "out", new Uint8Array([0x01, 0x80, 0x00]), utf8("b"))),
    "emit-key: the message's key is not canonical: a number in the key is not in its shortest form (at byte 1)",
  );
  assert.deepEqual(tally, new CallTally());
  tally.emit(SMALL, declared, "out", key, utf8("12345678"));
  assert.equal(
    refusal(() => tally.emit(SMALL, declared, "out", key, utf8("12345678"))),
    "emit-bytes-per-call: one call may emit at most 24 bytes of topics, keys and bodies; this message would make 26",
  );
  tally.emit(SMALL, declared, "out", key, utf8("1"));
  assert.equal(rule(() => tally.emit(SMALL, declared, "out", key, utf8("1"))), "emits-per-call");
});

test("log lines are cut and counted", () => {
  const tally = new LogTally();
  assert.equal(tally.admit(SMALL, "short"), "short");
  assert.equal(tally.admit(SMALL, "ééé"), "éé […cut]");
  assert.equal(tally.admit(SMALL, "third"), undefined);
  assert.equal(tally.admit(SMALL, "fourth"), undefined);
  const closing = tally.finish(SMALL);
  assert.equal(closing, "log-lines-per-call: 2 more log lines of this call dropped (at most 2 per call)");
  seen.add(closing!.split(":")[0]!);
  assert.notEqual(tally.admit(SMALL, "again"), undefined, "the next call starts afresh");
  assert.equal(tally.finish(SMALL), undefined);
});

test("descriptions are checked rule by rule", () => {
  const ok = (tag: number): DescribedType => ({ tag, name: "Type", maxBatch: 1 });
  checkDescription([ok(1), ok(2)], ["out", "a.b-c_d"]);
  const cases: [DescribedType[], string[], string][] = [
    [[], [], "event-type-count"],
    [Array.from({ length: MAX_EVENT_TYPES + 1 }, () => ok(1)), [], "event-type-count"],
    [[ok(1), ok(1)], [], "event-type-tag"],
    [[{ tag: 1, name: "", maxBatch: 1 }], [], "event-type-name"],
    [[{ tag: 1, name: "no spaces", maxBatch: 1 }], [], "event-type-name"],
    [[{ tag: 1, name: "Type", maxBatch: 0 }], [], "max-batch"],
    [[ok(1), { tag: 4294967295, name: "Type", maxBatch: 1 }], [], "event-type-tag-reserved"],
    [[ok(1)], Array.from({ length: MAX_EMIT_TOPICS + 1 }, (_, i) => `t${i}`), "emit-topic-count"],
    [[ok(1)], ["a/b"], "emit-topic-name"],
    [[ok(1)], ["retry_x"], "emit-topic-host-owned"],
    [[ok(1)], ["dlq_x"], "emit-topic-host-owned"],
    [[ok(1)], ["a", "a"], "emit-topic-duplicate"],
    [[ok(1)], ["t".repeat(256)], "emit-topic-name"],
  ];
  for (const [types, emits, expected] of cases) {
    assert.equal(rule(() => checkDescription(types, emits)), expected);
  }
  checkDescription([ok(1)], []);
  assert.ok(isEventTypeName("n".repeat(128)) && !isEventTypeName("n".repeat(129)));
  assert.ok(isEventTypeName("bank:Deposited.v2"));
});

test("timers are checked as values and counted as state writes", () => {
  // The cases of core/src/limits.rs's `timers_are_checked_as_values_and_counted_as_state_writes`.
  const limits: PayloadLimits = {
    ...DEFAULT_LIMITS,
    maxTimerPayload: 4,
    maxStateWritesPerCall: 3,
    maxTimersPerKey: 2,
    maxTimers: 5,
  };
  const tally = new CallTally();
  const long = "n".repeat(MAX_TIMER_NAME_BYTES + 1);
  assert.equal(rule(() => tally.timerSet(limits, "", 1n, 0, undefined)), "timer-name");
  assert.equal(rule(() => tally.timerSet(limits, long, 1n, 0, undefined)), "timer-name");
  assert.equal(
    refusal(() => tally.timerSet(limits, "a\0b", 1n, 0, undefined)),
    "timer-name: a timer name is 1 to 128 bytes without NUL; this one has a NUL at byte 1",
  );
  assert.equal(
    refusal(() => tally.timerSet(limits, "close", 1n, 5, undefined)),
    "timer-payload-size: timer `close` has a payload of 5 bytes, over the limit of 4 bytes",
  );
  assert.equal(
    refusal(() => tally.timerSet(limits, "close", I64_MAX, 0, undefined)),
    `timer-time: timer \`close\` is set at ${I64_MAX}, the largest time, which no clock ever passes`,
  );
  assert.equal(
    refusal(() => tally.timerSet(limits, "close", 7n, 0, 7n)),
    "timer-at-firing: timer `close` is set at 7 while the timers at 7 fire; a call that fires timers sets timers only later than them",
  );
  assert.equal(rule(() => tally.timerSet(limits, "close", 6n, 0, 7n)), "timer-at-firing");
  assert.deepEqual(tally, new CallTally(), "refused calls count nothing");
  tally.timerSet(limits, "close", 8n, 4, 7n);
  tally.timerSet(limits, "close", I64_MIN, 0, undefined);
  tally.timerCancel(limits, "close");
  assert.deepEqual([tally.stateWrites, tally.stateBytes], [3, 5 + 4 + 5 + 5]);
  assert.equal(rule(() => tally.timerCancel(limits, "close")), "state-writes-per-call");
  assert.equal(rule(() => new CallTally().timerCancel(limits, "")), "timer-name");
  checkTimersPerKey(limits, "x", 1);
  assert.equal(
    refusal(() => checkTimersPerKey(limits, "x", 2)),
    "timers-per-key: a key holds at most 2 timers (it holds 2); timer `x` would be a new one (moving or cancelling one is allowed)",
  );
  checkTimersInAll(limits, "x", 4);
  assert.equal(
    refusal(() => checkTimersInAll(limits, "x", 5)),
    "timers-in-all: a projection holds at most 5 timers (it holds 5); timer `x` would be a new one",
  );
});

test("return values: keys, combined bodies and error messages", () => {
  checkKey(new Uint8Array([0x01, 0x54]));
  assert.equal(rule(() => checkKey(new Uint8Array([0x01, 0x80, 0x00]))), "key-canonical");
  assert.equal(rule(() => checkKey(new Uint8Array(2000).fill(3))), "key-canonical");
  checkCombinedBody(SMALL, utf8("x"));
  assert.equal(rule(() => checkCombinedBody(SMALL, new Uint8Array())), "combine-body-size");
  assert.equal(rule(() => checkCombinedBody(SMALL, new Uint8Array(9))), "combine-body-size");
  const kept = errorMessage("é".repeat(MAX_ERROR_MESSAGE_BYTES));
  assert.ok(utf8Length(kept) <= MAX_ERROR_MESSAGE_BYTES + utf8Length(" […cut]") && kept.endsWith(" […cut]"));
  assert.equal(errorMessage("short"), "short");
});

/**
 * The rule ids of the host's `Refusal` and `ContractError` (each variant's
 * message starts with its id), read from `core/src/limits.rs`.
 */
function hostRuleIds(): Set<string> {
  const source = readFileSync(join(REPO, "core", "src", "limits.rs"), "utf8");
  const ids = new Set<string>();
  for (const name of ["Refusal", "ContractError"]) {
    const start = source.indexOf(`pub enum ${name} {`);
    assert.ok(start >= 0, `core/src/limits.rs has no enum ${name}`);
    const body = source.slice(start, source.indexOf("\n}\n", start));
    for (const match of body.matchAll(/#\[error\(\s*"([a-z][a-z0-9-]*):/g)) {
      ids.add(match[1]!);
    }
  }
  return ids;
}

/**
 * Rules kept outside `limits.ts`, each checked where it is kept:
 * `outside-handle` by the test host (`testing.test.ts`),
 * `event-time-declared` by `Module.eventTime` (`module.test.ts`), and
 * `import-size`, the bound on the bytes one import call hands the host
 * before it copies them (the largest value the limits allow, a key, and
 * room for names): the test host copies nothing, and a value past it is
 * past `state-value-size` or `emit-body-size` already, refused there.
 */
const KEPT_BY_THE_TEST_HOST = new Set(["outside-handle", "event-time-declared", "import-size"]);

after(() => {
  // Registered last: runs once every case above has added what it saw.
  const ids = hostRuleIds();
  assert.ok(ids.size >= 20, `only ${ids.size} rule ids read from core/src/limits.rs`);
  const missing = [...ids].filter((id) => !seen.has(id) && !KEPT_BY_THE_TEST_HOST.has(id));
  assert.deepEqual(missing, [], "every rule the host refuses with is refused here too");
});
