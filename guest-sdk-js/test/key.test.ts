/** The canonical key encoding: the shared vectors, the host's pinned encodings, JS values, refusals. */

import assert from "node:assert/strict";
import { test } from "node:test";
import {
  type DecodedKey,
  KeyFormatError,
  type KeyValue,
  decodeKey,
  encodeKey,
  fromHex,
  keyText,
  parseKeyText,
  toHex,
} from "../src/key.js";
import { parseJson } from "../src/json.js";
import { sharedVectors } from "./vectors.js";

interface KeyVectors {
  vectors: { text: string; hex: string }[];
  refused: { hex: string; reason: string }[];
}

/** A key value from its text form, as an author would write it. */
function fromText(text: string): KeyValue {
  const convert = (value: unknown): KeyValue => {
    if (Array.isArray(value)) return value.map(convert);
    if (typeof value === "object" && value !== null) return fromHex((value as { bytes: string }).bytes);
    return value as KeyValue;
  };
  return convert(parseJson(text));
}

/** What decodeKey gives for a key value: safe integers as numbers, others as bigints. */
function decoded(value: KeyValue): DecodedKey {
  if (Array.isArray(value)) return value.map(decoded);
  if (typeof value === "bigint" && Number.isSafeInteger(Number(value))) return Number(value);
  return value as DecodedKey;
}

test("every shared vector encodes, decodes and shows as its text", () => {
  const { vectors } = sharedVectors<KeyVectors>("key_vectors.json");
  assert.ok(vectors.length >= 30, "the file lost its vectors");
  for (const { text, hex } of vectors) {
    assert.equal(toHex(encodeKey(fromText(text))), hex, text);
    assert.equal(toHex(parseKeyText(text)), hex, text);
    assert.deepEqual(decodeKey(fromHex(hex)), decoded(fromText(text)), hex);
    assert.equal(keyText(fromHex(hex)), text, hex);
  }
});

test("the shared refused bytes are not keys", () => {
  const { refused } = sharedVectors<KeyVectors>("key_vectors.json");
  assert.ok(refused.length > 0);
  for (const { hex, reason } of refused) {
    assert.throws(() => decodeKey(fromHex(hex)), KeyFormatError, reason);
  }
});

test("the host's pinned encodings, byte for byte", () => {
  const pinned: [KeyValue, string][] = [
    [0, "0100"],
    [42, "0154"],
    [-1, "0101"],
    [42n, "0154"],
    [true, "0102"],
    [false, "0100"],
    [(1n << 64n) - 1n, "01feffffffffffffffff03"],
    ["ann", "0203616e6e"],
    [new Uint8Array([0xab]), "0301ab"],
    [[42, "eur"], "040201540203657572"],
    [[], "0400"],
  ];
  for (const [value, hex] of pinned) {
    assert.equal(toHex(encodeKey(value)), hex, String(value));
  }
  // The fast path for small integers and the general one agree.
  for (const n of [0, 1, 63, 64, 127, 128, 0x0fffffff, 0x10000000, 2 ** 40]) {
    assert.equal(toHex(encodeKey(n)), toHex(encodeKey(BigInt(n))), String(n));
  }
});

test("values that cannot be keys are refused, saying why", () => {
  const refused: [unknown, string][] = [
    [null, "an absent key is no key"],
    [undefined, "an absent key is no key"],
    [1.5, "not a safe integer"],
    [2 ** 60, "not a safe integer"],
    [1n << 64n, "outside the range from i64::MIN to u64::MAX"],
    [-(1n << 63n) - 1n, "outside the range"],
    [{ a: 1 }, "a value of type Object"],
    ["\ud800", "not valid Unicode"],
    ["x".repeat(1100), "at most 1024 bytes"],
  ];
  for (const [value, why] of refused) {
    assert.throws(() => encodeKey(value as KeyValue), (error: Error) => {
      assert.ok(error instanceof KeyFormatError && error.message.includes(why), `${String(value)}: ${error.message}`);
      return true;
    });
  }
  let deep: KeyValue = 1;
  for (let i = 0; i < 17; i++) deep = [deep];
  assert.throws(() => encodeKey(deep), /nest at most 16 deep/);
});

test("bytes that are no canonical key are refused in the host's words", () => {
  const cases: [string, string][] = [
    ["", "a key cannot be empty"],
    ["018000", "a number in the key is not in its shortest form (at byte 1)"],
    ["0154ff", "the key has 1 bytes after its value"],
    ["0205616e", "the key's bytes end inside a value (at byte 1)"],
    ["0202ffff", "a string in the key is not UTF-8 (at byte 2)"],
    ["07", "unknown key value tag 0x07 at byte 0"],
  ];
  for (const [hex, message] of cases) {
    assert.throws(() => decodeKey(fromHex(hex)), { name: "KeyFormatError", message });
  }
});

test("the text form refuses what is no key", () => {
  for (const text of ["1.5", "true", "null", '{"bytes":"abc"}', '{"bytes":"zz"}', '{"x":1}', "[", "18446744073709551616"]) {
    assert.throws(() => parseKeyText(text), /not a key/, text);
  }
});
