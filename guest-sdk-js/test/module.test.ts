/** Event types, modules and JSON bodies: declarations checked, the WIT's handler interface over bytes. */

import assert from "node:assert/strict";
import { test } from "node:test";
import { Module, UnrecoverableError, decodeKey, defineEvent, t, writeJson } from "../src/index.js";
import { fromUtf8, parseJson, utf8 } from "../src/json.js";
import { Added, Flagged, Stamped, Visited, visits } from "./fixture.js";

const unrecoverable = (message: string | RegExp) => (error: unknown) => {
  assert.ok(error instanceof UnrecoverableError, String(error));
  if (typeof message === "string") assert.equal(error.message, message);
  else assert.match(error.message, message);
  return true;
};

test("bad declarations fail when they are made", () => {
  const key = (e: { user: bigint }) => e.user;
  const fields = { user: t.u64 };
  const cases: [() => unknown, RegExp][] = [
    [() => defineEvent({ tag: -1, name: "A", fields, key }), /tag -1 is not a u32/],
    [() => defineEvent({ tag: 2 ** 32, name: "A", fields, key }), /is not a u32/],
    [() => defineEvent({ tag: 1, name: "no spaces", fields, key }), /name "no spaces" is not/],
    [() => defineEvent({ tag: 1, name: "A", maxBatch: 0, fields, key }), /maxBatch 0 is not from 1/],
    [() => defineEvent({ tag: 1, name: "A", algebra: "associative", fields, key }), /associative but gives no combine/],
    [() => defineEvent({ tag: 1, name: "A", timing: "timed", fields, key }), /timed but gives no eventTime/],
    [() => defineEvent({ tag: 1, name: "A", algebra: "sometimes" as "idempotent", fields, key }), /algebra "sometimes"/],
    [() => new Module("m").handles([Visited, defineEvent({ tag: 1, name: "B", fields, key })], () => {}), /Visited and B have the same tag 1/],
    [() => new Module("m", { emits: ["retry_x"] }), /emit-topic-host-owned/],
    [() => new Module("m", { emits: ["a", "a"] }), /emit-topic-duplicate/],
  ];
  for (const [make, message] of cases) {
    assert.throws(make, (error: Error) => error instanceof TypeError && message.test(error.message));
  }
  assert.throws(() => new Module("empty").describe(), /event-type-count/);
});

test("describe lists the types as the WIT records them", () => {
  const info = visits.describe();
  assert.deepEqual(info.emits, ["audit"]);
  assert.deepEqual(info.eventTypes[1], {
    tag: 2,
    name: "Added",
    algebra: "associative",
    maxBatch: 256,
    timing: "untimed",
  });
  assert.deepEqual(
    info.eventTypes.map((type) => type.timing),
    ["untimed", "untimed", "untimed", "timed", "timed-relaxed"],
  );
});

test("keys, orderings and combine over bytes", () => {
  assert.deepEqual(decodeKey(visits.key(1, utf8('{"user":7,"page":"/"}'))), 7);
  assert.deepEqual(decodeKey(visits.key(3, utf8('{"user":7,"flag":"on"}'))), [7, "flags"]);
  assert.equal(visits.ordering(3, utf8('{"user":7,"flag":"on"}')), "acquire");
  assert.equal(visits.ordering(3, utf8('{"user":7,"flag":"off"}')), "release");
  assert.equal(visits.ordering(1, utf8('{"user":7,"page":"/"}')), "relaxed");
  const bodies = ['{"user":4,"amount":10}', '{"user":4,"amount":-3,"count":2}'].map(utf8);
  assert.equal(fromUtf8(visits.combine(2, bodies)), '{"user":4,"amount":7,"count":3}');
  assert.equal(fromUtf8(visits.combine(2, [utf8('{"user":4,"amount":10}')])), '{"user":4,"amount":10}');
  assert.throws(() => visits.combine(1, bodies), unrecoverable("Visited is not associative"));
  assert.throws(() => visits.combine(2, []), unrecoverable("combine of no Added events"));
  assert.throws(() => visits.key(9, utf8("{}")), unrecoverable("module visits has no event type with tag 9"));
});

test("bodies that do not fit are unrecoverable, naming the type", () => {
  const cases: [string, RegExp][] = [
    ["not json", /^malformed Visited body: /],
    ["{}", /^malformed Visited body: missing field `user`$/],
    ['{"user":"7","page":"/"}', /^malformed Visited body: user: expected an integer from 0 to 2\^64-1, got "7"$/],
    ['{"user":-1,"page":"/"}', /user: expected an integer from 0 to 2\^64-1, got -1/],
    ['{"user":18446744073709551616,"page":"/"}', /got 18446744073709551616/],
    ['{"user":1.5,"page":"/"}', /got 1.5/],
    ["[1]", /expected an object, got \[1\]/],
  ];
  for (const [body, message] of cases) {
    assert.throws(() => visits.key(1, utf8(body)), unrecoverable(message), body);
  }
  assert.throws(() => visits.key(1, new Uint8Array([0xff])), unrecoverable(/^malformed Visited body: /));
  assert.throws(() => visits.key(3, utf8('{"user":1,"flag":"maybe"}')), unrecoverable(/flag: expected one of "on", "off"/));
});

test("64-bit integers are exact, and bodies are written as serde_json writes them", () => {
  const max = "18446744073709551615";
  const body = utf8(`{"extra":[1,{"x":null}],"user":${max},"page":"é\\n\\u0001"}`);
  const event = Visited.decode(body);
  assert.equal(event.user, (1n << 64n) - 1n);
  assert.equal(fromUtf8(Visited.encode(event)), `{"user":${max},"page":"é\\n\\u0001"}`, "unknown fields dropped, order kept");
  assert.equal(fromUtf8(Added.encode({ user: 1n, amount: -(1n << 63n), count: 1n })), '{"user":1,"amount":-9223372036854775808}');
  assert.equal(fromUtf8(Added.encode({ user: 1n, amount: 0n, count: 2n })), '{"user":1,"amount":0,"count":2}');
  assert.deepEqual(parseJson('{"a":9007199254740993,"b":9007199254740991,"c":[1.5e3,-12345678901234567890]}'), {
    a: 9007199254740993n,
    b: 9007199254740991,
    c: [1500, -12345678901234567890n],
  });
  assert.equal(writeJson({ a: 1n << 70n, b: [true, null, "x"], c: undefined, d: { e: 1.5 } }), '{"a":1180591620717411303424,"b":[true,null,"x"],"d":{"e":1.5}}');
  assert.throws(() => parseJson('{"a":12345678901234567,}'), SyntaxError);
  assert.throws(() => writeJson(Number.NaN), TypeError);
});

test("event time: asked only of timed types, and refused when there is none (event-time-declared)", () => {
  assert.equal(visits.eventTime(1, utf8("not even json")), undefined, "an untimed type is not decoded");
  assert.equal(visits.eventTime(4, utf8('{"user":1,"at":-5}')), -5n);
  assert.equal(visits.eventTime(5, utf8('{"user":1,"at":30}')), 30n);
  assert.throws(
    () => visits.eventTime(4, utf8('{"user":1}')),
    unrecoverable(/^event-time-declared: Stamped declares event time, but its eventTime\(\) returned undefined/),
  );
  const Floaty = defineEvent({
    tag: 1,
    name: "Floaty",
    timing: "timed",
    fields: { at: t.float },
    key: () => 1,
    eventTime: (event) => event.at,
  });
  const module = new Module("floaty").handles(Floaty, () => {});
  assert.throws(() => module.eventTime(1, utf8('{"at":1.5}')), unrecoverable(/^event-time-declared: /));
  assert.equal(Stamped.timing, "timed");
});

test("a key that is no key is unrecoverable, naming the type", () => {
  const Bad = defineEvent({ tag: 1, name: "Bad", fields: { x: t.float }, key: (event) => event.x });
  const module = new Module("bad").handles(Bad, () => {});
  assert.throws(() => module.key(1, utf8('{"x":0.5}')), unrecoverable(/^the key of a Bad is not a key: /));
  assert.equal(Flagged.name, "Flagged");
});

test("an event type with its own body format", () => {
  const Raw = defineEvent<Uint8Array>({
    tag: 7,
    name: "Raw",
    decode: (body) => {
      if (body.length === 0) throw new RangeError("empty");
      return body;
    },
    encode: (event) => event,
    key: (event) => event.subarray(0, 1),
  });
  const module = new Module("raw").handles(Raw, () => {});
  assert.deepEqual(decodeKey(module.key(7, new Uint8Array([5, 6]))), new Uint8Array([5]));
  assert.throws(() => module.key(7, new Uint8Array()), unrecoverable("malformed Raw body: empty"));
});
