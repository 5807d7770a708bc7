/** The repository's shared test vectors (`core/tests/`), as the host's own tests read them. */

import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root (this SDK lives in `guest-sdk-js/`). */
export const REPO = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

/**
 * Reads a vector file of `core/tests/` (`WAKU_VECTORS_DIR` points
 * elsewhere, for a copy of the SDK outside the repository).
 */
export function sharedVectors<T>(name: string): T {
  const directory = process.env["WAKU_VECTORS_DIR"] ?? join(REPO, "core", "tests");
  return JSON.parse(readFileSync(join(directory, name), "utf8")) as T;
}
