/**
 * JSON with exact 64-bit integers, read and written as `serde_json` does.
 *
 * JavaScript numbers hold integers exactly only up to 2^53; the Rust SDK's
 * bodies carry `i64` and `u64`. So:
 * - {@link parseJson} reads an integer literal outside the safe range as a
 *   `bigint` (every other number as a `number`). It uses the engine's own
 *   `JSON.parse` unless the text holds a run of 16 or more digits (the
 *   only way to write such an integer), so the common body costs one
 *   native parse.
 * - {@link writeJson} writes compact JSON (no spaces), a `bigint` as its
 *   digits, object keys in insertion order and non-ASCII characters as
 *   they are: the bytes `serde_json::to_vec` writes for the same value.
 *
 * Malformed text throws a `SyntaxError`; what a value must look like is the
 * schema's business (`schema.ts`).
 */

/** A JSON value as read here: integers beyond 2^53 are `bigint`s. */
export type JsonValue =
  | null
  | boolean
  | number
  | bigint
  | string
  | JsonValue[]
  | { [key: string]: JsonValue };

const LONG_DIGITS = /\d{16}/;

/** Reads JSON text; integer literals outside ±(2^53 − 1) become `bigint`s. */
export function parseJson(text: string): JsonValue {
  if (!LONG_DIGITS.test(text)) {
    return JSON.parse(text) as JsonValue;
  }
  return new Parser(text).document();
}

class Parser {
  private at = 0;

  constructor(private readonly text: string) {}

  document(): JsonValue {
    const value = this.value();
    this.space();
    if (this.at !== this.text.length) {
      this.fail("unexpected text after the value");
    }
    return value;
  }

  private fail(what: string): never {
    throw new SyntaxError(`${what} at position ${this.at}`);
  }

  private space(): void {
    const text = this.text;
    while (this.at < text.length) {
      const c = text.charCodeAt(this.at);
      if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) {
        return;
      }
      this.at++;
    }
  }

  private value(): JsonValue {
    this.space();
    const c = this.text[this.at];
    if (c === "{") {
      return this.object();
    }
    if (c === "[") {
      return this.array();
    }
    if (c === '"') {
      return this.string();
    }
    if (c === "-" || (c !== undefined && c >= "0" && c <= "9")) {
      return this.number();
    }
    for (const [word, value] of [
      ["true", true],
      ["false", false],
      ["null", null],
    ] as const) {
      if (this.text.startsWith(word, this.at)) {
        this.at += word.length;
        return value;
      }
    }
    return this.fail(c === undefined ? "unexpected end of text" : `unexpected character ${JSON.stringify(c)}`);
  }

  private object(): JsonValue {
    this.at++;
    const out: { [key: string]: JsonValue } = {};
    this.space();
    if (this.text[this.at] === "}") {
      this.at++;
      return out;
    }
    for (;;) {
      this.space();
      if (this.text[this.at] !== '"') {
        this.fail("expected a string key");
      }
      const key = this.string();
      this.space();
      if (this.text[this.at] !== ":") {
        this.fail("expected `:`");
      }
      this.at++;
      out[key] = this.value();
      this.space();
      const next = this.text[this.at++];
      if (next === "}") {
        return out;
      }
      if (next !== ",") {
        this.at--;
        this.fail("expected `,` or `}`");
      }
    }
  }

  private array(): JsonValue {
    this.at++;
    const out: JsonValue[] = [];
    this.space();
    if (this.text[this.at] === "]") {
      this.at++;
      return out;
    }
    for (;;) {
      out.push(this.value());
      this.space();
      const next = this.text[this.at++];
      if (next === "]") {
        return out;
      }
      if (next !== ",") {
        this.at--;
        this.fail("expected `,` or `]`");
      }
    }
  }

  private string(): string {
    // A string literal is the same to JSON.parse wherever it stands.
    const start = this.at;
    this.at++;
    const text = this.text;
    while (this.at < text.length) {
      const c = text[this.at];
      if (c === "\\") {
        this.at += 2;
      } else if (c === '"') {
        this.at++;
        return JSON.parse(text.slice(start, this.at)) as string;
      } else {
        this.at++;
      }
    }
    return this.fail("unterminated string");
  }

  private number(): number | bigint {
    const match = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(this.text.slice(this.at));
    if (match === null) {
      return this.fail("malformed number");
    }
    this.at += match[0].length;
    const literal = match[0];
    if (match[2] === undefined && match[3] === undefined) {
      const value = Number(literal);
      return Number.isSafeInteger(value) ? value : BigInt(literal);
    }
    return Number(literal);
  }
}

/**
 * Compact JSON of `value`, as `serde_json` writes it: `bigint`s as their
 * digits, `undefined` object fields left out, keys in insertion order.
 * A number that is not finite has no JSON form and throws a `TypeError`.
 */
export function writeJson(value: unknown): string {
  switch (typeof value) {
    case "string":
      return JSON.stringify(value);
    case "number":
      if (!Number.isFinite(value)) {
        throw new TypeError(`${value} has no JSON form`);
      }
      return JSON.stringify(value);
    case "bigint":
      return value.toString();
    case "boolean":
      return value ? "true" : "false";
    case "object": {
      if (value === null) {
        return "null";
      }
      if (Array.isArray(value)) {
        return `[${value.map((item) => writeJson(item === undefined ? null : item)).join(",")}]`;
      }
      let out = "{";
      let first = true;
      for (const key of Object.keys(value)) {
        const field = (value as Record<string, unknown>)[key];
        if (field === undefined) {
          continue;
        }
        out += `${first ? "" : ","}${JSON.stringify(key)}:${writeJson(field)}`;
        first = false;
      }
      return `${out}}`;
    }
    default:
      throw new TypeError(`a ${typeof value} has no JSON form`);
  }
}

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** UTF-8 bytes of `text`. */
export function utf8(text: string): Uint8Array {
  return encoder.encode(text);
}

/** The text of UTF-8 bytes; bytes that are not UTF-8 throw a `TypeError`. */
export function fromUtf8(bytes: Uint8Array): string {
  return decoder.decode(bytes);
}
