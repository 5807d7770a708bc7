/** The TypeScript inventory on the node test host: timed types in event-time order. */

import assert from "node:assert/strict";
import { test } from "node:test";
import { fromUtf8 } from "wakuwaku-guest/json";
import { MemoryHost } from "wakuwaku-guest/testing";
import inventory, { CatalogueUpdated, STOCK, Stock, StockAdded, StockRemoved, add, remove } from "../inventory.js";

const added = (id: bigint, quantity: bigint, at: bigint) => StockAdded.of({ product: 1n, quantity, id, at });
const removed = (id: bigint, quantity: bigint, at: bigint) => StockRemoved.of({ product: 1n, quantity, id, at });

test("describes the Rust inventory's types and timings", () => {
  assert.deepEqual(
    inventory.describe().eventTypes.map((type) => [type.tag, type.name, type.timing]),
    [
      [1, "StockAdded", "timed"],
      [2, "StockRemoved", "timed"],
      [3, "CatalogueUpdated", "untimed"],
    ],
  );
});

test("two stock events the other way round give another stock (as the Rust inventory's test)", () => {
  const empty = (): Stock => ({ level: 0n, applied: 0n, refused: 0n, chain: 0n });
  const [one, other] = [empty(), empty()];
  add(one, 3n, 1n);
  remove(one, 2n, 2n);
  remove(other, 2n, 2n);
  add(other, 3n, 1n);
  assert.deepEqual([one.level, one.refused, other.level, other.refused], [1n, 0n, 3n, 1n]);
  const [swapped, straight] = [empty(), empty()];
  add(swapped, 1n, 2n);
  add(swapped, 1n, 1n);
  add(straight, 1n, 1n);
  add(straight, 1n, 2n);
  assert.notEqual(straight.chain, swapped.chain, "even adds are told apart by the chain");
});

test("events from several topics are applied in event-time order", () => {
  const host = new MemoryHost(inventory);
  // Listed topic by topic, as they were read: removals first, but later.
  host.handleInEventTimeOrder([
    removed(2n, 2n, 30n),
    CatalogueUpdated.of({ product: 1n, name: "tea", price: 300n }),
    added(1n, 3n, 10n),
    added(3n, 1n, 20n),
  ]);
  const inOrder = { level: 0n, applied: 0n, refused: 0n, chain: 0n };
  add(inOrder, 3n, 1n);
  add(inOrder, 1n, 3n);
  remove(inOrder, 2n, 2n);
  assert.deepEqual(host.get(1, STOCK, Stock), inOrder);
  assert.equal(inOrder.level, 2n);
  assert.equal(fromUtf8(host.getBytes(1, "catalogue")!), '{"product":1,"name":"tea","price":300}');
});
