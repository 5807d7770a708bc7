/**
 * The inventory of the event-time demo (`waku demo inventory`) in
 * TypeScript: the Rust inventory's (`examples/inventory`) timed types,
 * tags, orderings, state bytes and behaviour, so either module passes the
 * demo's oracle, which sorts each product's events by event time.
 *
 * | type             | tag | timing  | ordering | what it does                                    |
 * | ---------------- | --- | ------- | -------- | ----------------------------------------------- |
 * | StockAdded       | 1   | timed   | acq-rel  | adds to the product's stock                     |
 * | StockRemoved     | 2   | timed   | acq-rel  | removes from it, or counts a refusal            |
 * | CatalogueUpdated | 3   | untimed | relaxed  | keeps the product's latest catalogue entry      |
 *
 * The stock is order-sensitive (a removal is refused when the stock is too
 * low), and its `chain` hashes the ids of the stock events in the order
 * they were applied (FNV-1a over each id's little-endian bytes), so the
 * oracle sees any event applied out of event-time order.
 */

import { Module, Ordering, Timing, defineEvent, type Infer, t } from "wakuwaku-guest";

/** The state entry of a product's {@link Stock}. */
export const STOCK = "stock";
/** The state entry of a product's latest catalogue entry. */
export const CATALOGUE = "catalogue";

const byProduct = (event: { product: bigint }): bigint => event.product;
const stockFields = { product: t.u64, quantity: t.i64, id: t.u64, at: t.i64 };

/** Stock arrived, at `at` (ms since the epoch). */
export const StockAdded = defineEvent({
  tag: 1,
  name: "StockAdded",
  timing: Timing.Timed,
  fields: stockFields,
  key: byProduct,
  // The stock is order-sensitive: nothing passes a stock event.
  ordering: () => Ordering.AcqRel,
  eventTime: (event) => event.at,
});

/** Stock left, at `at`. */
export const StockRemoved = defineEvent({
  tag: 2,
  name: "StockRemoved",
  timing: Timing.Timed,
  fields: stockFields,
  key: byProduct,
  ordering: () => Ordering.AcqRel,
  eventTime: (event) => event.at,
});

/** The product's catalogue entry changed (no event time). */
export const CatalogueUpdated = defineEvent({
  tag: 3,
  name: "CatalogueUpdated",
  fields: { product: t.u64, name: t.string, price: t.i64 },
  key: byProduct,
});

/** A product's stock: the state entry `stock`, fields in the Rust inventory's order. */
export const Stock = t.object({ level: t.i64, applied: t.u64, refused: t.u64, chain: t.u64 });
export type Stock = Infer<typeof Stock>;

const FNV_OFFSET = 0xcbf29ce484222325n;
const FNV_PRIME = 0x100000001b3n;

function link(stock: Stock, id: bigint): void {
  let hash = stock.applied === 0n ? FNV_OFFSET : stock.chain;
  for (let i = 0n; i < 8n; i++) {
    hash = BigInt.asUintN(64, (hash ^ ((id >> (8n * i)) & 0xffn)) * FNV_PRIME);
  }
  stock.chain = hash;
  stock.applied = BigInt.asUintN(64, stock.applied + 1n);
}

/** Adds `quantity` (wrapping as i64). */
export function add(stock: Stock, quantity: bigint, id: bigint): void {
  stock.level = BigInt.asIntN(64, stock.level + quantity);
  link(stock, id);
}

/** Removes `quantity` if there is that much, else counts a refusal. */
export function remove(stock: Stock, quantity: bigint, id: bigint): void {
  if (stock.level >= quantity) {
    stock.level -= quantity;
  } else {
    stock.refused = BigInt.asUintN(64, stock.refused + 1n);
  }
  link(stock, id);
}

const inventory = new Module("inventory");

inventory.handles(StockAdded, (ctx, events) => {
  const stock = ctx.get(STOCK, Stock) ?? { level: 0n, applied: 0n, refused: 0n, chain: 0n };
  for (const event of events) add(stock, event.quantity, event.id);
  ctx.set(STOCK, stock, Stock);
});

inventory.handles(StockRemoved, (ctx, events) => {
  const stock = ctx.get(STOCK, Stock) ?? { level: 0n, applied: 0n, refused: 0n, chain: 0n };
  for (const event of events) remove(stock, event.quantity, event.id);
  ctx.set(STOCK, stock, Stock);
});

const Catalogue = t.object({ product: t.u64, name: t.string, price: t.i64 });

inventory.handles(CatalogueUpdated, (ctx, events) => {
  const last = events[events.length - 1];
  if (last !== undefined) ctx.set(CATALOGUE, last, Catalogue);
});

export default inventory;
