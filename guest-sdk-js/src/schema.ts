/**
 * Schemas: what a JSON body or state entry must look like, checked when it
 * is read, and the TypeScript type it is read as.
 *
 * TypeScript's types are gone at run time, so an event type's fields are
 * declared with these values, from which both the checks and the static
 * type come (`Infer<typeof schema>`):
 *
 *     const fields = { account: t.u64, amount: t.i64, count: t.skipIfDefault(t.u64, 1n) };
 *
 * Reading follows serde's defaults in the Rust SDK, so a body one side
 * accepts the other accepts too: fields are read by name, unknown fields
 * are ignored, a missing field without a default is an error, and each
 * value must fit its schema (`t.u64` is an integer from 0 to 2^64 − 1, read
 * exactly as a `bigint`; `t.int` a safe integer as a `number`; an enum one
 * of its strings). A value that does not fit throws a {@link DecodeError}
 * naming its path (`amount: expected an integer, got "x"`).
 *
 * Writing gives the bytes `serde_json::to_vec` gives: fields in declaration
 * order, compact; a {@link t.skipIfDefault} field is left out when it
 * holds its default (serde's `skip_serializing_if`), an optional field that
 * is `undefined` is written as `null`, as serde writes `None`.
 */

import { type JsonValue, writeJson } from "./json.js";

/** A value that does not fit its schema; the message names the path. */
export class DecodeError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "DecodeError";
  }
}

/** Reads and writes values of type `T`. */
export interface Schema<T> {
  /** What it reads, in words (`an integer`, `a string`, ...). */
  readonly what: string;
  /** Reads a parsed JSON value (`undefined` when a field is absent). */
  read(value: JsonValue | undefined, path: string): T;
  /** Writes the value as compact JSON text. */
  write(value: T): string;
  /** A field with this schema is left out when this says so. */
  skip?(value: T): boolean;
}

/** The type a schema reads. */
export type Infer<S> = S extends Schema<infer T> ? T : never;

/** The fields of an object schema. */
export type Fields = Record<string, Schema<unknown>>;

/** The type an object schema with `F` reads. */
export type ObjectOf<F extends Fields> = { [K in keyof F]: Infer<F[K]> };

function at(path: string): string {
  return path === "" ? "" : `${path}: `;
}

function shown(value: JsonValue | undefined): string {
  if (value === undefined) {
    return "nothing";
  }
  const text = writeJson(value);
  return text.length > 64 ? `${text.slice(0, 64)}…` : text;
}

function mismatch(path: string, what: string, value: JsonValue | undefined): DecodeError {
  return new DecodeError(`${at(path)}expected ${what}, got ${shown(value)}`);
}

function bigIntegers(what: string, min: bigint, max: bigint): Schema<bigint> {
  return {
    what,
    read(value, path) {
      let big: bigint;
      if (typeof value === "bigint") {
        big = value;
      } else if (typeof value === "number" && Number.isInteger(value)) {
        big = BigInt(value);
      } else {
        throw mismatch(path, what, value);
      }
      if (big < min || big > max) {
        throw mismatch(path, what, value);
      }
      return big;
    },
    write(value) {
      if (typeof value !== "bigint" || value < min || value > max) {
        throw new TypeError(`${String(value)} is not ${what} (a bigint)`);
      }
      return value.toString();
    },
  };
}

function numbers(what: string, check: (value: number) => boolean): Schema<number> {
  return {
    what,
    read(value, path) {
      if (typeof value === "number" && check(value)) {
        return value;
      }
      throw mismatch(path, what, value);
    },
    write(value) {
      if (typeof value !== "number" || !check(value)) {
        throw new TypeError(`${String(value)} is not ${what}`);
      }
      return JSON.stringify(value);
    },
  };
}

/** The schemas. */
export const t = {
  /** An integer from −2^63 to 2^63 − 1 (Rust's `i64`), read as a `bigint`. */
  i64: bigIntegers("an integer from -2^63 to 2^63-1", -(1n << 63n), (1n << 63n) - 1n),
  /** An integer from 0 to 2^64 − 1 (Rust's `u64`), read as a `bigint`. */
  u64: bigIntegers("an integer from 0 to 2^64-1", 0n, (1n << 64n) - 1n),
  /** A safe integer (±(2^53 − 1)), read as a `number`. */
  int: numbers("a safe integer", Number.isSafeInteger),
  /** An integer from 0 to 2^32 − 1 (Rust's `u32`), read as a `number`. */
  u32: numbers("an integer from 0 to 2^32-1", (n) => Number.isInteger(n) && n >= 0 && n <= 0xffffffff),
  /** Any finite number (Rust's `f64`). */
  float: numbers("a number", Number.isFinite),
  /** A string. */
  string: {
    what: "a string",
    read(value, path) {
      if (typeof value === "string") {
        return value;
      }
      throw mismatch(path, "a string", value);
    },
    write(value) {
      if (typeof value !== "string") {
        throw new TypeError(`${String(value)} is not a string`);
      }
      return JSON.stringify(value);
    },
  } as Schema<string>,
  /** `true` or `false`. */
  bool: {
    what: "a boolean",
    read(value, path) {
      if (typeof value === "boolean") {
        return value;
      }
      throw mismatch(path, "a boolean", value);
    },
    write(value) {
      return value ? "true" : "false";
    },
  } as Schema<boolean>,
  /** Any JSON value, taken as it comes (integers past 2^53 as `bigint`s). */
  json: {
    what: "a JSON value",
    read(value, path) {
      if (value === undefined) {
        throw mismatch(path, "a JSON value", value);
      }
      return value;
    },
    write: writeJson,
  } as Schema<JsonValue>,

  /** One of `values` (a Rust enum of unit variants, as serde writes it). */
  enumOf<const V extends readonly [string, ...string[]]>(...values: V): Schema<V[number]> {
    const what = `one of ${values.map((v) => JSON.stringify(v)).join(", ")}`;
    return {
      what,
      read(value, path) {
        if (typeof value === "string" && values.includes(value)) {
          return value as V[number];
        }
        throw mismatch(path, what, value);
      },
      write(value) {
        if (!values.includes(value)) {
          throw new TypeError(`${String(value)} is not ${what}`);
        }
        return JSON.stringify(value);
      },
    };
  },

  /** `null` or absent as `undefined`, else `inner` (Rust's `Option`). */
  optional<T>(inner: Schema<T>): Schema<T | undefined> {
    return {
      what: `${inner.what} or null`,
      read(value, path) {
        return value === undefined || value === null ? undefined : inner.read(value, path);
      },
      write(value) {
        return value === undefined ? "null" : inner.write(value);
      },
    };
  },

  /** A field read as `value` when absent (serde's `#[serde(default)]`). */
  default<T>(inner: Schema<T>, value: T): Schema<T> {
    return {
      what: inner.what,
      read(given, path) {
        return given === undefined ? value : inner.read(given, path);
      },
      write: (given) => inner.write(given),
    };
  },

  /**
   * A field read as `value` when absent and left out when it holds `value`
   * (serde's `default` with `skip_serializing_if`).
   */
  skipIfDefault<T>(inner: Schema<T>, value: T): Schema<T> {
    return {
      what: inner.what,
      read(given, path) {
        return given === undefined ? value : inner.read(given, path);
      },
      write: (given) => inner.write(given),
      skip: (given) => given === value,
    };
  },

  /** An array of `inner` (Rust's `Vec`). */
  array<T>(inner: Schema<T>): Schema<T[]> {
    const what = `an array of ${inner.what}`;
    return {
      what,
      read(value, path) {
        if (!Array.isArray(value)) {
          throw mismatch(path, what, value);
        }
        return value.map((item, index) => inner.read(item, `${path}[${index}]`));
      },
      write(value) {
        return `[${value.map((item) => inner.write(item)).join(",")}]`;
      },
    };
  },

  /** An object with `fields` (a Rust struct): see the module docs. */
  object<F extends Fields>(fields: F): Schema<ObjectOf<F>> {
    const entries = Object.entries(fields);
    const names = entries.map(([name]) => JSON.stringify(name));
    return {
      what: "an object",
      read(value, path) {
        if (typeof value !== "object" || value === null || Array.isArray(value)) {
          throw mismatch(path, "an object", value);
        }
        const out: Record<string, unknown> = {};
        for (const [name, schema] of entries) {
          const field = Object.hasOwn(value, name) ? value[name] : undefined;
          try {
            out[name] = schema.read(field, path === "" ? name : `${path}.${name}`);
          } catch (error) {
            if (field === undefined && error instanceof DecodeError) {
              throw new DecodeError(`${at(path)}missing field \`${name}\``);
            }
            throw error;
          }
        }
        return out as ObjectOf<F>;
      },
      write(value) {
        let out = "{";
        for (let i = 0; i < entries.length; i++) {
          const [name, schema] = entries[i]!;
          const field = (value as Record<string, unknown>)[name];
          if (schema.skip?.(field)) {
            continue;
          }
          out += `${out.length === 1 ? "" : ","}${names[i]}:${schema.write(field)}`;
        }
        return `${out}}`;
      },
    };
  },
};
