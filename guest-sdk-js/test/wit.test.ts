/**
 * The WIT types are generated, not written: `src/wit/handler-<v>/` is what
 * `jco guest-types` makes of `wit/handler-<v>.wit` for the current contract
 * and the one before it, and the SDK's vocabulary is the WIT's.
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { test } from "node:test";
import type * as wit04 from "wakuwaku:handler/types@0.4.0";
import type * as wit05 from "wakuwaku:handler/types@0.5.0";
import { Algebra, ErrorClass, Ordering, Timing, WIT_PACKAGE } from "../src/index.js";
import { REPO } from "./vectors.js";

/** The files under `dir`, relative, with their text. */
function files(dir: string): Map<string, string> {
  const out = new Map<string, string>();
  const walk = (at: string): void => {
    for (const entry of readdirSync(at, { withFileTypes: true })) {
      const path = join(at, entry.name);
      if (entry.isDirectory()) walk(path);
      else out.set(relative(dir, path), readFileSync(path, "utf8"));
    }
  };
  walk(dir);
  return out;
}

/** jco, from the repository's npm tools. */
const JCO = join(REPO, "node_modules", ".bin", "jco");

for (const version of ["0.5", "0.4"]) {
  test(`src/wit/handler-${version} is what jco generates from wit/handler-${version}.wit`, () => {
    const scratch = mkdtempSync(join(tmpdir(), "waku-wit-"));
    try {
      // jco reads a directory of WIT files: one holding just this version.
      const witDir = join(scratch, "wit");
      execFileSync("mkdir", ["-p", witDir]);
      copyFileSync(join(REPO, "wit", `handler-${version}.wit`), join(witDir, `handler-${version}.wit`));
      const out = join(scratch, "out");
      execFileSync(JCO, ["guest-types", witDir, "-n", "module", "-o", out, "-q"], { stdio: "pipe" });
      const generated = files(out);
      assert.ok(generated.size >= 5, `jco wrote ${generated.size} files`);
      assert.deepEqual(
        files(join(REPO, "guest-sdk-js", "src", "wit", `handler-${version}`)),
        generated,
        `regenerate: node_modules/.bin/jco guest-types <dir with wit/handler-${version}.wit> -n module -o guest-sdk-js/src/wit/handler-${version}`,
      );
    } finally {
      rmSync(scratch, { recursive: true, force: true });
    }
  });
}

test("the SDK's vocabulary is the current contract's, which keeps the one before", () => {
  assert.equal(WIT_PACKAGE, /package (\S+);/.exec(readFileSync(join(REPO, "wit", "handler-0.5.wit"), "utf8"))![1]);
  // Every name of the generated unions, at run time (the types are checked by tsc).
  const all = <T extends string>(names: Record<string, T>): T[] => Object.values(names);
  assert.deepEqual(all(Algebra), ["non-associative", "commutative", "idempotent", "idempotent-commutative", "associative"]);
  assert.deepEqual(all(Ordering), ["relaxed", "acquire", "release", "acq-rel"]);
  assert.deepEqual(all(Timing), ["untimed", "timed", "timed-relaxed"]);
  assert.deepEqual(all(ErrorClass), ["transient", "retryable", "unrecoverable"]);
  // 0.4's vocabulary is within 0.5's (what a 0.4 module says, 0.5 reads, so
  // a module written for 0.4 builds unchanged): these assignments compile
  // only while that holds.
  const timing: wit05.Timing = "timed-relaxed" satisfies wit04.Timing;
  const record: wit05.EventType = { tag: 1, name: "A", algebra: "idempotent", maxBatch: 1, timing } satisfies wit04.EventType;
  const outgoing: wit04.Outgoing extends wit05.Outgoing ? true : false = true;
  const error: wit04.HandlerError extends wit05.HandlerError ? true : false = true;
  const info: wit04.ModuleInfo extends wit05.ModuleInfo ? true : false = true;
  assert.ok(record && outgoing && error && info);
});
