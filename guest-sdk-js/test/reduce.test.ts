/** Reduction and chunking, checked against the host's vectors (`core/tests/reduce_vectors.json`). */

import assert from "node:assert/strict";
import { test } from "node:test";
import { chunks, reduce } from "../src/reduce.js";
import { fromUtf8, utf8 } from "../src/json.js";
import type { Algebra } from "../src/types.js";
import { sharedVectors } from "./vectors.js";

interface ReduceVectors {
  reduce: { algebra: Algebra; run: string[]; reduced: string[] }[];
  chunks: { events: number; max_batch: number; sizes: number[] }[];
}

test("every reduction vector gives the host's result", () => {
  const { reduce: cases } = sharedVectors<ReduceVectors>("reduce_vectors.json");
  assert.ok(cases.length >= 10, "the file lost its vectors");
  for (const { algebra, run, reduced } of cases) {
    let combined = 0;
    const out = reduce(algebra, run.map(utf8), (bodies) => {
      combined += 1;
      return utf8(bodies.map(fromUtf8).join("+"));
    });
    assert.deepEqual(out.map(fromUtf8), reduced, `${algebra} ${JSON.stringify(run)}`);
    assert.ok(combined <= 1, "combine is called at most once");
  }
});

test("every chunking vector cuts calls as the host does", () => {
  const { chunks: cases } = sharedVectors<ReduceVectors>("reduce_vectors.json");
  assert.ok(cases.length > 0);
  for (const { events, max_batch, sizes } of cases) {
    const bodies = Array.from({ length: events }, (_, i) => i);
    const calls = chunks(bodies, max_batch);
    assert.deepEqual(calls.map((call) => call.length), sizes, `${events} events, max batch ${max_batch}`);
    assert.deepEqual(calls.flat(), bodies, "in order, none lost");
  }
});

test("a failing combine is thrown", () => {
  assert.throws(() => reduce("associative", [utf8("a"), utf8("b")], () => {
    throw new RangeError("broken");
  }), RangeError);
});
