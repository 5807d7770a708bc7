//! The inventory projection of `waku demo inventory`: the stock of each
//! product, from events spread over many topics that must be applied in
//! event-time order.
//!
//! Events are keyed by [`ProductId`]; their bodies are plain JSON:
//!
//! | type | tag | event time | ordering |
//! | --- | --- | --- | --- |
//! | [`StockAdded`] | 1 | yes | acq-rel: applied exactly in the order released |
//! | [`StockRemoved`] | 2 | yes | acq-rel |
//! | [`CatalogueUpdated`] | 3 | no | relaxed |
//!
//! The read model is one state entry [`STOCK`] per product, the JSON of a
//! [`Stock`], and one entry [`CATALOGUE`] with its latest
//! [`CatalogueUpdated`]. A removal is refused (and counted) when the stock
//! is short, and every applied stock event is folded into a hash chain: so
//! any two stock events of a product applied the other way round give
//! another [`Stock`], which is what the demo's oracle checks. Catalogue
//! updates write their own entry and commute with stock events: they may
//! be applied as they arrive.

use serde::{Deserialize, Serialize};
use wakuwaku_guest::{
    Context, Event, EventAtomicOrdering, EventTiming, EventTypeTag, Handler, HandlerError, PartitionKey,
};

/// The state entry holding a product's [`Stock`], as JSON.
pub const STOCK: &str = "stock";

/// The state entry holding a product's latest [`CatalogueUpdated`].
pub const CATALOGUE: &str = "catalogue";

/// The key of every inventory event: one product. Its canonical key is the
/// product number as an integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProductId(pub u64);

impl PartitionKey for ProductId {}

/// Units of a product came in (a receipt, a return, a transfer in).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockAdded {
    /// The product.
    pub product: u64,
    /// How many units.
    pub quantity: i64,
    /// The event's number in the workload: folded into the chain.
    pub id: u64,
    /// When it happened, in ms since the Unix epoch: its event time.
    pub at: i64,
}

impl Event for StockAdded {
    const TYPE_TAG: EventTypeTag = EventTypeTag::new(1);
    const NAME: &'static str = "StockAdded";
    const TIMING: EventTiming = EventTiming::Timed;
    type Key = ProductId;

    fn key(&self) -> ProductId {
        ProductId(self.product)
    }

    fn atomic_ordering(&self) -> EventAtomicOrdering {
        // The stock is order-sensitive: nothing passes a stock event.
        EventAtomicOrdering::AcqRel
    }

    fn event_time(&self) -> Option<i64> {
        Some(self.at)
    }
}

/// Units of a product went out (a sale, a transfer out, damage).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockRemoved {
    /// The product.
    pub product: u64,
    /// How many units.
    pub quantity: i64,
    /// The event's number in the workload: folded into the chain.
    pub id: u64,
    /// When it happened, in ms since the Unix epoch: its event time.
    pub at: i64,
}

impl Event for StockRemoved {
    const TYPE_TAG: EventTypeTag = EventTypeTag::new(2);
    const NAME: &'static str = "StockRemoved";
    const TIMING: EventTiming = EventTiming::Timed;
    type Key = ProductId;

    fn key(&self) -> ProductId {
        ProductId(self.product)
    }

    fn atomic_ordering(&self) -> EventAtomicOrdering {
        EventAtomicOrdering::AcqRel
    }

    fn event_time(&self) -> Option<i64> {
        Some(self.at)
    }
}

/// The catalogue's entry of a product: no event time, applied as it
/// arrives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogueUpdated {
    /// The product.
    pub product: u64,
    /// Its name.
    pub name: String,
    /// Its price, in the smallest unit of the currency.
    pub price: i64,
}

impl Event for CatalogueUpdated {
    const TYPE_TAG: EventTypeTag = EventTypeTag::new(3);
    const NAME: &'static str = "CatalogueUpdated";
    type Key = ProductId;

    fn key(&self) -> ProductId {
        ProductId(self.product)
    }
}

/// The read model of one product: the state entry [`STOCK`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stock {
    /// Units in stock.
    pub level: i64,
    /// Stock events applied.
    pub applied: u64,
    /// Removals refused because the stock was short.
    pub refused: u64,
    /// FNV-1a over the ids of the applied events, in the order applied.
    pub chain: u64,
}

impl Stock {
    /// Applies one added quantity.
    pub fn add(&mut self, quantity: i64, id: u64) {
        self.level = self.level.wrapping_add(quantity);
        self.link(id);
    }

    /// Applies one removal: refused when the stock is short.
    pub fn remove(&mut self, quantity: i64, id: u64) {
        if self.level >= quantity {
            self.level -= quantity;
        } else {
            self.refused += 1;
        }
        self.link(id);
    }

    fn link(&mut self, id: u64) {
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut hash = if self.applied == 0 { 0xcbf2_9ce4_8422_2325 } else { self.chain };
        for byte in id.to_le_bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(PRIME);
        }
        self.chain = hash;
        self.applied += 1;
    }
}

/// The module: keeps a [`Stock`] and a [`CATALOGUE`] entry per product.
pub struct Inventory;

impl Handler<StockAdded> for Inventory {
    fn handle(ctx: &mut Context<'_>, events: &[StockAdded]) -> Result<(), HandlerError> {
        let mut stock: Stock = ctx.get(STOCK)?.unwrap_or_default();
        events.iter().for_each(|event| stock.add(event.quantity, event.id));
        ctx.set(STOCK, &stock)
    }
}

impl Handler<StockRemoved> for Inventory {
    fn handle(ctx: &mut Context<'_>, events: &[StockRemoved]) -> Result<(), HandlerError> {
        let mut stock: Stock = ctx.get(STOCK)?.unwrap_or_default();
        events.iter().for_each(|event| stock.remove(event.quantity, event.id));
        ctx.set(STOCK, &stock)
    }
}

impl Handler<CatalogueUpdated> for Inventory {
    fn handle(ctx: &mut Context<'_>, events: &[CatalogueUpdated]) -> Result<(), HandlerError> {
        match events.last() {
            Some(last) => ctx.set(CATALOGUE, last),
            None => Ok(()),
        }
    }
}

wakuwaku_guest::export_module!(Inventory: StockAdded, StockRemoved, CatalogueUpdated);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_stock_events_the_other_way_round_give_another_stock() {
        let (mut one, mut other) = (Stock::default(), Stock::default());
        one.add(3, 1);
        one.remove(2, 2);
        other.remove(2, 2);
        other.add(3, 1);
        assert_ne!(one, other);
        assert_eq!((one.level, one.refused, other.level, other.refused), (1, 0, 3, 1));
        let mut swapped = Stock::default();
        swapped.add(1, 2);
        swapped.add(1, 1);
        let mut straight = Stock::default();
        straight.add(1, 1);
        straight.add(1, 2);
        assert_ne!(straight.chain, swapped.chain, "even adds are told apart by the chain");
    }
}
