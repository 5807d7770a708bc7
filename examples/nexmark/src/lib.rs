//! Nexmark's queries 5 and 7 (the auction benchmark Apache Beam's Nexmark
//! suite runs: persons, auctions and bids), on the guest SDK's windows
//! (`wakuwaku_guest::windows`), for `waku demo nexmark` (`docs/timers.md`,
//! "Nexmark").
//!
//! - **Query 7, the highest bid per tumbling window** of [`Q7_SIZE_MS`]: a
//!   [`WindowBid`] is keyed by the start of its window, so every bid of a
//!   window is one key's; a tumbling window over the key's bids keeps the
//!   highest price and the bids at it, and emits a [`HighestBid`] to
//!   `nexmark-q7` when the clock passes the window's end.
//! - **Query 5, the hot items: the auctions with the most bids per
//!   hopping window** of [`Q5_SIZE_MS`] every [`HOP_MS`], in two stages. A
//!   [`SlotBid`] is keyed by its slot (the [`HOP_MS`] its time falls in); a
//!   tumbling window of one slot counts the bids per auction and emits the
//!   counts ([`SlotCounts`]) to `nexmark-q5-slots` when the clock passes
//!   it. The second stage (built with the feature `hot`, [`NexmarkHot`]: a
//!   projection may not read what its own module emits) adds each slot's
//!   counts into the [`SLOTS_PER_WINDOW`] hopping windows holding it, and
//!   emits a window's [`HotItems`] to `nexmark-q5` once all its slots
//!   came. It closes by count, not by a timer: the slots' counts come from
//!   the first stage's partitions, each at its own pace, so no clock of the
//!   second stage's input says that a window's last slot has come; a count
//!   does, since each slot emits once (a window one of whose slots had no
//!   bid never closes: none at Nexmark's rates, but at the run's edges).
//! - **Persons and auctions** are read and counted (counters `persons`,
//!   `auctions`): the queries need only bids, but a Nexmark source gives
//!   every query the whole stream.
//!
//! A key's bids all fall in its one window, so a timer never falls between
//! two of them: the bid types hand over runs of [`BID_BATCH`] at once
//! (`max-batch: 1` is for windows that share a key's events), and a call
//! folds its run into one partial aggregate and adds that to the window
//! once. The SDK's windows read and write the window's aggregate (JSON) at
//! each `add`: added bid by bid, a slot's count of some thousand auctions
//! would be read and written again for each of its bids.

use serde::{Deserialize, Serialize};
use wakuwaku_guest::{Context, Event, EventTiming, EventTypeTag, Handler, HandlerError};

/// The hop of query 5's windows, and the length of a slot.
pub const HOP_MS: i64 = 2_000;
/// The length of query 5's hopping windows.
pub const Q5_SIZE_MS: i64 = 10_000;
/// How many slots a query-5 window holds.
pub const SLOTS_PER_WINDOW: i64 = Q5_SIZE_MS / HOP_MS;
/// The length of query 7's tumbling windows.
pub const Q7_SIZE_MS: i64 = 10_000;
/// The longest run of bids handed over in one call.
pub const BID_BATCH: u32 = 4_096;

/// A person who sells and bids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    /// Its id.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its city.
    pub city: String,
    /// When it registered, ms since the epoch.
    pub date_time: i64,
}

/// An auction a person opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auction {
    /// Its id.
    pub id: u64,
    /// The person selling.
    pub seller: u64,
    /// Its category.
    pub category: u64,
    /// The first price, in cents.
    pub initial_bid: u64,
    /// When it closes, ms since the epoch.
    pub expires: i64,
    /// When it opened, ms since the epoch.
    pub date_time: i64,
}

/// A bid on an auction.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Bid {
    /// The auction.
    pub auction: u64,
    /// The person bidding.
    pub bidder: u64,
    /// The price, in cents.
    pub price: u64,
    /// When it was made, ms since the epoch.
    pub date_time: i64,
}

/// A bid as query 5 reads it: keyed by its slot's start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SlotBid(pub Bid);

/// A bid as query 7 reads it: keyed by its window's start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WindowBid(pub Bid);

/// One slot's bids per auction, from query 5's first stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotCounts {
    /// The slot's start.
    pub slot: i64,
    /// Bids per auction, by auction.
    pub counts: Vec<(u64, u64)>,
}

/// Query 5's answer for one window: the auctions with the most bids.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HotItems {
    /// The window's start.
    pub start: i64,
    /// One past its end.
    pub end: i64,
    /// How many bids each of them had.
    pub bids: u64,
    /// The auctions, ascending.
    pub auctions: Vec<u64>,
}

/// Query 7's answer for one window: the highest price and its bids.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HighestBid {
    /// The window's start.
    pub start: i64,
    /// One past its end.
    pub end: i64,
    /// The highest price.
    pub price: u64,
    /// The bids at that price, ascending.
    pub bids: Vec<Bid>,
}

/// The start of the window of `size` holding `at`.
pub fn window_start(at: i64, size: i64) -> i64 {
    at.div_euclid(size) * size
}

fn key_of(start: i64) -> u64 {
    u64::try_from(start).unwrap_or(0)
}

macro_rules! event {
    ($type:ty, $tag:expr, $name:expr, $batch:expr, $timing:expr, |$event:ident| $key:expr, $time:expr) => {
        impl Event for $type {
            const TYPE_TAG: EventTypeTag = EventTypeTag::new($tag);
            const NAME: &'static str = $name;
            const MAX_BATCH: u32 = $batch;
            const TIMING: EventTiming = $timing;
            type Key = u64;

            fn key(&self) -> u64 {
                let $event = self;
                $key
            }

            fn event_time(&self) -> Option<i64> {
                // The results have no event time: their binding goes unused.
                #[allow(unused_variables)]
                let $event = self;
                $time
            }
        }
    };
}

event!(Person, 90, "Person", 256, EventTiming::Timed, |p| p.id, Some(p.date_time));
event!(Auction, 91, "Auction", 256, EventTiming::Timed, |a| a.id, Some(a.date_time));
event!(
    SlotBid,
    92,
    "SlotBid",
    BID_BATCH,
    EventTiming::Timed,
    |b| key_of(window_start(b.0.date_time, HOP_MS)),
    Some(b.0.date_time)
);
event!(
    WindowBid,
    93,
    "WindowBid",
    BID_BATCH,
    EventTiming::Timed,
    |b| key_of(window_start(b.0.date_time, Q7_SIZE_MS)),
    Some(b.0.date_time)
);
// One key for the second stage: a window's slots meet there.
event!(SlotCounts, 94, "SlotCounts", 64, EventTiming::Untimed, |_s| 0, None);
event!(HotItems, 95, "HotItems", 1, EventTiming::Untimed, |h| key_of(h.start), None);
event!(HighestBid, 96, "HighestBid", 1, EventTiming::Untimed, |h| key_of(h.start), None);

#[cfg(not(feature = "hot"))]
mod first {
    use std::collections::BTreeMap;

    use wakuwaku_guest::windows::{Aggregate, Window, WindowKind, Windows};
    use wakuwaku_guest::{Key, OnTimers, Timer};

    use super::*;

    /// Counts a slot's bids per auction.
    pub struct PerAuction;

    /// A run's bids per auction, added to its slot at once.
    type Counts = BTreeMap<u64, u64>;

    impl Aggregate for PerAuction {
        type Event = Counts;
        type State = Counts;
        type Result = SlotCounts;

        fn add(counts: &mut Counts, run: &Counts) {
            Self::merge(counts, run.clone());
        }

        fn merge(into: &mut BTreeMap<u64, u64>, other: BTreeMap<u64, u64>) {
            other.into_iter().for_each(|(auction, count)| *into.entry(auction).or_default() += count);
        }

        fn result(_: &Key, window: Window, counts: BTreeMap<u64, u64>) -> SlotCounts {
            SlotCounts { slot: window.start, counts: counts.into_iter().collect() }
        }
    }

    /// The highest price of a window and the bids at it.
    #[derive(Debug, Default, Serialize, Deserialize)]
    pub struct Highest {
        price: u64,
        bids: Vec<Bid>,
    }

    /// Keeps a window's highest bids.
    pub struct HighestPrice;

    impl Highest {
        /// Keeps `bid` if it is at or above the highest price.
        fn offer(&mut self, bid: &Bid) {
            if self.bids.is_empty() || bid.price > self.price {
                *self = Highest { price: bid.price, bids: vec![bid.clone()] };
            } else if bid.price == self.price {
                self.bids.push(bid.clone());
            }
        }
    }

    impl Aggregate for HighestPrice {
        type Event = Highest;
        type State = Highest;
        type Result = HighestBid;

        fn add(highest: &mut Highest, run: &Highest) {
            run.bids.iter().for_each(|bid| highest.offer(bid));
        }

        fn merge(into: &mut Highest, other: Highest) {
            Self::add(into, &other);
        }

        fn result(_: &Key, window: Window, mut highest: Highest) -> HighestBid {
            highest.bids.sort();
            HighestBid { start: window.start, end: window.end, price: highest.price, bids: highest.bids }
        }
    }

    const SLOTS: Windows<PerAuction> =
        Windows::new("slots", WindowKind::Tumbling { size: HOP_MS }, 0, "nexmark-q5-slots");
    const HIGHEST: Windows<HighestPrice> =
        Windows::new("highest", WindowKind::Tumbling { size: Q7_SIZE_MS }, 0, "nexmark-q7");

    /// Query 5's first stage and query 7.
    pub struct Nexmark;

    impl Handler<Person> for Nexmark {
        fn handle(ctx: &mut Context<'_>, events: &[Person]) -> Result<(), HandlerError> {
            ctx.counter_add("persons", events.len() as i64)
        }
    }

    impl Handler<Auction> for Nexmark {
        fn handle(ctx: &mut Context<'_>, events: &[Auction]) -> Result<(), HandlerError> {
            ctx.counter_add("auctions", events.len() as i64)
        }
    }

    impl Handler<SlotBid> for Nexmark {
        fn handle(ctx: &mut Context<'_>, events: &[SlotBid]) -> Result<(), HandlerError> {
            // The key is the slot: the whole run falls in it.
            let Some(first) = events.first() else { return Ok(()) };
            let mut run = Counts::new();
            events.iter().for_each(|bid| *run.entry(bid.0.auction).or_default() += 1);
            SLOTS.add(ctx, first.0.date_time, &run).map(drop)
        }
    }

    impl Handler<WindowBid> for Nexmark {
        fn handle(ctx: &mut Context<'_>, events: &[WindowBid]) -> Result<(), HandlerError> {
            // The key is the window: the whole run falls in it.
            let Some(first) = events.first() else { return Ok(()) };
            let mut run = Highest::default();
            events.iter().for_each(|bid| run.offer(&bid.0));
            HIGHEST.add(ctx, first.0.date_time, &run).map(drop)
        }
    }

    impl OnTimers for Nexmark {
        fn fire(ctx: &mut Context<'_>, timers: &[Timer]) -> Result<(), HandlerError> {
            SLOTS.fire(ctx, timers)?;
            HIGHEST.fire(ctx, timers)?;
            Ok(())
        }
    }

    wakuwaku_guest::export_module!(
        Nexmark: Person, Auction, SlotBid, WindowBid;
        emits: ["nexmark-q5-slots", "nexmark-q7"];
        timers: Nexmark
    );
}

#[cfg(not(feature = "hot"))]
pub use first::Nexmark;

#[cfg(feature = "hot")]
mod hot {
    use std::collections::BTreeMap;

    use super::*;

    /// The open windows: how many of their slots came, and the bids per
    /// auction so far.
    type Open = BTreeMap<i64, (i64, BTreeMap<u64, u64>)>;

    /// Query 5's second stage.
    pub struct NexmarkHot;

    impl Handler<SlotCounts> for NexmarkHot {
        fn handle(ctx: &mut Context<'_>, events: &[SlotCounts]) -> Result<(), HandlerError> {
            let mut open: Open = ctx.get("open")?.unwrap_or_default();
            for slot in events {
                for back in 0..SLOTS_PER_WINDOW {
                    let start = slot.slot - back * HOP_MS;
                    let (came, counts) = open.entry(start).or_default();
                    *came += 1;
                    slot.counts.iter().for_each(|&(auction, count)| *counts.entry(auction).or_default() += count);
                    if *came < SLOTS_PER_WINDOW {
                        continue;
                    }
                    let (_, counts) = open.remove(&start).unwrap_or_default();
                    let bids = counts.values().copied().max().unwrap_or(0);
                    let auctions = counts.into_iter().filter(|&(_, count)| count == bids).map(|(a, _)| a).collect();
                    ctx.emit("nexmark-q5", &HotItems { start, end: start + Q5_SIZE_MS, bids, auctions })?;
                }
            }
            ctx.set("open", &open)
        }
    }

    wakuwaku_guest::export_module!(NexmarkHot: SlotCounts; emits: ["nexmark-q5"]);
}

#[cfg(feature = "hot")]
pub use hot::NexmarkHot;
