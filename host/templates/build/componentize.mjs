// Runs componentize-js's command line (its path is the first argument, the
// rest are its arguments) with one fix to the bindings it generates, for
// componentize-js 0.23 and earlier (bytecodealliance/ComponentizeJS#343):
// their `toInt64` lowers an `s64` as a signed BigInt, which the engine's
// `coreabi_from_bigint64` accepts only when it is unsigned, so every
// negative `s64` argument of an import (`counter-add` with a negative
// delta) aborts the instance. The fix lowers it as its two's complement
// (`BigInt.asUintN(64, ...)`): the same 64 bits, which the engine accepts.
// Written by `waku build` beside the bundle; nothing else changes.
import { createRequire, syncBuiltinESMExports } from "node:module";
import { pathToFileURL } from "node:url";

const SIGNED = "return BigInt.asIntN(64, converted);";
const BITS = "return BigInt.asUintN(64, converted);";

const require = createRequire(import.meta.url);
const fs = require("node:fs/promises");
const writeFile = fs.writeFile;
fs.writeFile = function (path, data, ...rest) {
  if (typeof data === "string" && data.includes("function toInt64(val)")) {
    if (!data.includes(SIGNED) && !data.includes(BITS)) {
      console.error("waku: warning: this componentize-js lowers s64 in a way waku build does not know; negative s64 arguments may abort the instance");
    }
    data = data.replaceAll(SIGNED, BITS);
  }
  return writeFile.call(this, path, data, ...rest);
};
syncBuiltinESMExports();

const [cli, ...args] = process.argv.slice(2);
process.argv = [process.argv[0], cli, ...args];
await import(pathToFileURL(cli).href);
