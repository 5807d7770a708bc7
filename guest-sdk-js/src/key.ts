/**
 * Keys: what order and state are scoped to, as canonical bytes.
 *
 * A key is a small value (an integer, a string, a byte string, or a tuple
 * of those) with one canonical encoding, stated in `wit/handler.wit`
 * ("Keys") and implemented by the host in `core/src/key.rs`. Every guest
 * SDK produces the same bytes for the same value, so modules written in
 * Rust, Python and TypeScript can share a topic: `encodeKey(42)` here is
 * the key of `42u64` in the Rust SDK and of `42` in the Python SDK. All
 * are checked against the same vectors (`core/tests/key_vectors.json`).
 *
 * Rules kept here:
 * - **Bytes are the identity.** Two keys are equal exactly when their
 *   bytes are.
 * - **One encoding per value.** {@link encodeKey} writes the shortest
 *   form; {@link decodeKey} refuses anything that is not exactly one value
 *   in its shortest form, with a {@link KeyFormatError} in the host's words.
 * - **Limits.** At most {@link MAX_KEY_BYTES} bytes in all, tuples nested
 *   at most {@link MAX_KEY_DEPTH} deep.
 *
 * How JavaScript values map onto key values:
 *
 * | JavaScript value                                  | key value               |
 * | ------------------------------------------------- | ----------------------- |
 * | a safe integer `number`, a `bigint` from −2^63 to 2^64 − 1 | integer        |
 * | `boolean`                                         | integer 0 or 1          |
 * | `string`                                          | string (its UTF-8)      |
 * | `Uint8Array`                                      | byte string             |
 * | an array                                          | tuple                   |
 *
 * Anything else (`null`, `undefined`, fractions, objects) is refused: a
 * fraction has no canonical form, an object no canonical order, and an
 * absent key is no key. {@link decodeKey} gives integers as `number`s when
 * they are safe integers, else as `bigint`s.
 *
 * The text form (for people, logs and the `waku` command) is JSON: an
 * integer is a number, a string a JSON string, a tuple an array, a byte
 * string `{"bytes": "<hex>"}`: `42`, `"ann"`, `[42,"eur"]`.
 */

import { type JsonValue, parseJson, writeJson } from "./json.js";

/** The most bytes a key's canonical encoding may have. */
export const MAX_KEY_BYTES = 1024;
/** The deepest tuples may nest (a key that is a plain value has depth 0). */
export const MAX_KEY_DEPTH = 16;

const INT = 0x01;
const STR = 0x02;
const BYTES = 0x03;
const TUPLE = 0x04;

const INT_MIN = -(1n << 63n);
const INT_MAX = (1n << 64n) - 1n;

/** A key value: an integer, a string, a byte string, or a tuple of those. */
export type KeyValue = number | bigint | boolean | string | Uint8Array | readonly KeyValue[];

/** A decoded key: integers as `number` (when safe) or `bigint`. */
export type DecodedKey = number | bigint | string | Uint8Array | DecodedKey[];

/** Why a value or bytes are not a key; the message is the host's wording. */
export class KeyFormatError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "KeyFormatError";
  }
}

const textEncoder = new TextEncoder();

class Writer {
  bytes = new Uint8Array(16);
  length = 0;

  push(byte: number): void {
    if (this.length === this.bytes.length) {
      this.grow(1);
    }
    this.bytes[this.length++] = byte;
  }

  pushAll(data: Uint8Array): void {
    if (this.length + data.length > this.bytes.length) {
      this.grow(data.length);
    }
    this.bytes.set(data, this.length);
    this.length += data.length;
  }

  leb128(value: number | bigint): void {
    if (typeof value === "number") {
      // Lengths and safe integers: plain arithmetic, no bigint.
      while (value >= 0x80) {
        this.push((value % 0x80) | 0x80);
        value = Math.floor(value / 0x80);
      }
      this.push(value);
      return;
    }
    while (value >= 0x80n) {
      this.push(Number(value & 0x7fn) | 0x80);
      value >>= 7n;
    }
    this.push(Number(value));
  }

  private grow(more: number): void {
    const next = new Uint8Array(Math.max(this.bytes.length * 2, this.length + more));
    next.set(this.bytes.subarray(0, this.length));
    this.bytes = next;
  }
}

/**
 * The canonical bytes of `value` (see the table above), checked against the
 * limits; a value that cannot be a key throws a {@link KeyFormatError}.
 */
export function encodeKey(value: KeyValue): Uint8Array {
  // The hot path of every call: a plain small integer.
  if (typeof value === "number" && Number.isSafeInteger(value) && value >= 0 && value < 0x10000000) {
    const out = new Writer();
    out.push(INT);
    out.leb128(value * 2);
    return out.bytes.slice(0, out.length);
  }
  const out = new Writer();
  encodeInto(value, out, 0);
  if (out.length > MAX_KEY_BYTES) {
    throw new KeyFormatError(`a key has at most ${MAX_KEY_BYTES} bytes; this one has ${out.length}`);
  }
  return out.bytes.slice(0, out.length);
}

function encodeInto(value: KeyValue, out: Writer, depth: number): void {
  switch (typeof value) {
    case "number":
      if (!Number.isSafeInteger(value)) {
        throw new KeyFormatError(
          `this value cannot be a key: the number ${value} is not a safe integer (use a bigint past 2^53)`,
        );
      }
      encodeInt(BigInt(value), out);
      return;
    case "bigint":
      encodeInt(value, out);
      return;
    case "boolean":
      encodeInt(value ? 1n : 0n, out);
      return;
    case "string": {
      if (!value.isWellFormed()) {
        throw new KeyFormatError("this value cannot be a key: a string that is not valid Unicode (a lone surrogate)");
      }
      const data = textEncoder.encode(value);
      out.push(STR);
      out.leb128(data.length);
      out.pushAll(data);
      return;
    }
    default:
      break;
  }
  if (value instanceof Uint8Array) {
    out.push(BYTES);
    out.leb128(value.length);
    out.pushAll(value);
    return;
  }
  if (Array.isArray(value)) {
    if (depth >= MAX_KEY_DEPTH) {
      throw new KeyFormatError(`a key's tuples nest at most ${MAX_KEY_DEPTH} deep`);
    }
    out.push(TUPLE);
    out.leb128(value.length);
    for (const item of value as readonly KeyValue[]) {
      encodeInto(item, out, depth + 1);
      if (out.length > MAX_KEY_BYTES) {
        throw new KeyFormatError(`a key has at most ${MAX_KEY_BYTES} bytes; this one has ${out.length}`);
      }
    }
    return;
  }
  const what =
    value === null || value === undefined
      ? `${String(value)} (an absent key is no key)`
      : `a value of type ${typeof value === "object" ? ((value as object).constructor?.name ?? "object") : typeof value}`;
  throw new KeyFormatError(
    `this value cannot be a key: ${what}; a key is an integer, string, Uint8Array, or an array of those`,
  );
}

function encodeInt(value: bigint, out: Writer): void {
  if (value < INT_MIN || value > INT_MAX) {
    throw new KeyFormatError(
      `an integer in the key is outside the range from i64::MIN to u64::MAX (at byte ${out.length})`,
    );
  }
  out.push(INT);
  out.leb128(value >= 0n ? value << 1n : ((-value) << 1n) - 1n);
}

/**
 * The value of canonical key bytes; anything else throws a
 * {@link KeyFormatError} naming the problem.
 */
export function decodeKey(data: Uint8Array): DecodedKey {
  if (data.length === 0) {
    throw new KeyFormatError("a key cannot be empty");
  }
  if (data.length > MAX_KEY_BYTES) {
    throw new KeyFormatError(`a key has at most ${MAX_KEY_BYTES} bytes; this one has ${data.length}`);
  }
  const reader = new Reader(data);
  const value = reader.value(0);
  const extra = data.length - reader.at;
  if (extra > 0) {
    throw new KeyFormatError(`the key has ${extra} bytes after its value`);
  }
  return value;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

class Reader {
  at = 0;

  constructor(private readonly data: Uint8Array) {}

  byte(): number {
    if (this.at >= this.data.length) {
      throw new KeyFormatError(`the key's bytes end inside a value (at byte ${this.at})`);
    }
    return this.data[this.at++]!;
  }

  leb128(): bigint {
    const start = this.at;
    let value = 0n;
    let shift = 0n;
    for (;;) {
      const byte = this.byte();
      const bits = BigInt(byte & 0x7f);
      // The host reads numbers into 128 bits; anything wider is out of range.
      if (shift >= 128n || (bits << shift) >> 128n !== 0n) {
        throw new KeyFormatError(
          `an integer in the key is outside the range from i64::MIN to u64::MAX (at byte ${start})`,
        );
      }
      value |= bits << shift;
      if ((byte & 0x80) === 0) {
        if (byte === 0 && shift > 0n) {
          throw new KeyFormatError(`a number in the key is not in its shortest form (at byte ${start})`);
        }
        return value;
      }
      shift += 7n;
    }
  }

  length(): number {
    const start = this.at;
    const length = this.leb128();
    if (length > BigInt(this.data.length - this.at)) {
      throw new KeyFormatError(`the key's bytes end inside a value (at byte ${start})`);
    }
    return Number(length);
  }

  value(depth: number): DecodedKey {
    const start = this.at;
    const tag = this.byte();
    switch (tag) {
      case INT: {
        const at = this.at;
        const raw = this.leb128();
        const value = (raw & 1n) === 0n ? raw >> 1n : -(raw >> 1n) - 1n;
        if (value < INT_MIN || value > INT_MAX) {
          throw new KeyFormatError(
            `an integer in the key is outside the range from i64::MIN to u64::MAX (at byte ${at})`,
          );
        }
        const small = Number(value);
        return Number.isSafeInteger(small) ? small : value;
      }
      case STR: {
        const length = this.length();
        const at = this.at;
        this.at += length;
        try {
          return utf8.decode(this.data.subarray(at, at + length));
        } catch {
          throw new KeyFormatError(`a string in the key is not UTF-8 (at byte ${at})`);
        }
      }
      case BYTES: {
        const length = this.length();
        const raw = this.data.slice(this.at, this.at + length);
        this.at += length;
        return raw;
      }
      case TUPLE: {
        if (depth >= MAX_KEY_DEPTH) {
          throw new KeyFormatError(`a key's tuples nest at most ${MAX_KEY_DEPTH} deep`);
        }
        const count = this.length();
        const items: DecodedKey[] = [];
        for (let i = 0; i < count; i++) {
          items.push(this.value(depth + 1));
        }
        return items;
      }
      default:
        throw new KeyFormatError(`unknown key value tag 0x${tag.toString(16).padStart(2, "0")} at byte ${start}`);
    }
  }
}

/** Lowercase hex of bytes. */
export function toHex(bytes: Uint8Array): string {
  let out = "";
  for (const byte of bytes) {
    out += byte.toString(16).padStart(2, "0");
  }
  return out;
}

/** The bytes of hex text (which must be even-length hex). */
export function fromHex(text: string): Uint8Array {
  const out = new Uint8Array(text.length / 2);
  for (let i = 0; i < out.length; i++) {
    out[i] = Number.parseInt(text.slice(2 * i, 2 * i + 2), 16);
  }
  return out;
}

/** The text form of canonical key bytes (JSON, as the host shows keys). */
export function keyText(data: Uint8Array): string {
  return writeJson(toJson(decodeKey(data)));
}

function toJson(value: DecodedKey): JsonValue {
  if (value instanceof Uint8Array) {
    return { bytes: toHex(value) };
  }
  if (Array.isArray(value)) {
    return value.map(toJson);
  }
  return value;
}

/**
 * The canonical bytes of a key written in its text form (JSON: `42`,
 * `"ann"`, `[42, "eur"]`, `{"bytes": "00ff"}`).
 */
export function parseKeyText(text: string): Uint8Array {
  let value: JsonValue;
  try {
    value = parseJson(text);
  } catch (error) {
    throw textError((error as Error).message);
  }
  return encodeKey(fromJson(value));
}

function fromJson(value: JsonValue): KeyValue {
  if (typeof value === "boolean" || value === null || (typeof value === "number" && !Number.isInteger(value))) {
    throw textError(`${writeJson(value)} is not an integer, string, array or byte string`);
  }
  if (typeof value === "number" || typeof value === "bigint") {
    const big = BigInt(value);
    if (big < INT_MIN || big > INT_MAX) {
      throw textError(`${value} is not an integer from i64::MIN to u64::MAX`);
    }
    return big;
  }
  if (typeof value === "string") {
    return value;
  }
  if (Array.isArray(value)) {
    return value.map(fromJson);
  }
  const keys = Object.keys(value);
  const hex = value["bytes"];
  if (keys.length === 1 && typeof hex === "string") {
    if (hex.length % 2 !== 0) {
      throw textError(`byte string \`${hex}\` has an odd number of hex digits`);
    }
    if (!/^[0-9a-fA-F]*$/.test(hex)) {
      throw textError(`byte string \`${hex}\` is not hex`);
    }
    return fromHex(hex);
  }
  throw textError('an object must be {"bytes": "<hex>"}');
}

function textError(reason: string): KeyFormatError {
  return new KeyFormatError(
    `not a key: ${reason} (a key is written as JSON: 42, "ann", [42, "eur"] or {"bytes": "00ff"})`,
  );
}
