import assert from "node:assert/strict";
import { test } from "node:test";
import { MemoryHost } from "wakuwaku-guest/testing";
import module, { Visited } from "../{{module}}.js";

test("counts visits per user and in all", () => {
  const host = new MemoryHost(module);
  host.handle([
    Visited.of({ user: 7n, page: "/" }),
    Visited.of({ user: 7n, page: "/" }),
    Visited.of({ user: 8n, page: "/" }),
  ]);
  assert.equal(host.get(7, "visits"), 2);
  assert.equal(host.get(8, "visits"), 1);
  assert.equal(host.counter("all_visits"), 3n);
});
