//! The Nexmark demo (`waku demo nexmark`): a seeded generator of persons,
//! auctions and bids as Nexmark's generator makes them, and the oracle of
//! queries 5 and 7 (the `nexmark` example, `examples/nexmark`) computed by
//! sorting.
//!
//! Rules kept here (`docs/timers.md`, "Nexmark", says them for users):
//! - **Nexmark's proportions and clock.** Event `n` is a person when
//!   `n mod 50` is 0, an auction when it is 1 to 3, else a bid (1:3:46);
//!   its event time is `base + n × 1000 / rate` ms, the generator's
//!   constant inter-event delay. Ids follow the generator's: the latest
//!   person and auction so far, a bid's auction the hot one (the latest
//!   rounded down to a hundred) half the time, else one of the last 100
//!   (or 10 ahead); its bidder the hot person three times in four; prices
//!   `10^(6u) × 100` cents, `u` uniform. Deterministic for a seed.
//! - **Two topics of the same stream.** Query 5 reads bids keyed by their
//!   slot ([`Topic::Q5`]), query 7 keyed by their window ([`Topic::Q7`]);
//!   both topics carry the persons and auctions too.
//! - **The oracle sorts, it does not run the module.** Query 7: each
//!   window's bids, the highest price and the bids at it. Query 5: each
//!   slot's bids per auction, summed over a window's slots, the auctions
//!   with the most. A window is expected when the host's clock passed it:
//!   at the end of the log, one past the latest event time of the
//!   partition its key falls in (query 5: every one of its slots so).

use std::collections::BTreeMap;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::authoring::publish::Outgoing;
use crate::event::partition_for;
use crate::key::Key;
use crate::sandbox::handler::HandlerModule;
use crate::storage::log::{EventLog, LogError};

/// The hop of query 5's windows and the length of a slot (as the module).
pub(crate) const HOP_MS: i64 = 2_000;
/// The length of query 5's windows.
pub(crate) const Q5_SIZE_MS: i64 = 10_000;
/// The length of query 7's windows.
pub const Q7_SIZE_MS: i64 = 10_000;
/// Where event time starts: 2026-12-02T00:00:00Z, in ms.
const BASE_MS: i64 = 1_796_169_600_000;
/// Nexmark's proportions: of every 50 events, 1 person and 3 auctions.
const PROPORTION: u64 = 50;
const PERSONS: u64 = 1;
const AUCTIONS: u64 = 3;
/// Nexmark's generator constants.
const FIRST_PERSON_ID: u64 = 1_000;
const FIRST_AUCTION_ID: u64 = 1_000;
const HOT_RATIO: u64 = 100;
const IN_FLIGHT_AUCTIONS: u64 = 100;
const AUCTION_ID_LEAD: u64 = 10;
const ACTIVE_PEOPLE: u64 = 1_000;
const PERSON_ID_LEAD: u64 = 10;

/// Why the demo could not publish or check.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NexmarkError {
    /// The module is not the nexmark example.
    #[error("module `{module}` declares no event type `{name}`: is it the nexmark example?")]
    NotNexmark {
        /// The module.
        module: String,
        /// The missing event type.
        name: &'static str,
    },
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// A result on an output topic is not what the module emits.
    #[error("a record at offset {offset} of topic `{topic}` is not a result of the nexmark example: {reason}")]
    Result {
        /// The topic.
        topic: String,
        /// Its offset.
        offset: u64,
        /// Why.
        reason: String,
    },
}

/// What to generate.
#[derive(Debug, Clone, Copy)]
pub struct NexmarkSpec {
    /// Events in all.
    pub events: u64,
    /// Events per second of event time.
    pub rate: u32,
    /// Seed.
    pub seed: u64,
    /// Partitions of each input topic.
    pub partitions: u32,
}

/// One generated event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NexmarkEvent {
    /// A person.
    Person {
        /// Its id.
        id: u64,
        /// When it registered, ms since the epoch.
        at: i64,
    },
    /// An auction.
    Auction {
        /// Its id.
        id: u64,
        /// The person selling.
        seller: u64,
        /// When it opened, ms since the epoch.
        at: i64,
    },
    /// A bid.
    Bid(Bid),
}

/// A bid, as the example's `Bid`.
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

/// Query 5's result for a window, as the example's `HotItems`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct HotItems {
    pub(crate) start: i64,
    pub(crate) end: i64,
    pub(crate) bids: u64,
    pub(crate) auctions: Vec<u64>,
}

/// Query 7's result for a window, as the example's `HighestBid`.
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

/// The two input topics: one per query, as each keys the bids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic {
    /// Bids keyed by their slot.
    Q5,
    /// Bids keyed by their window.
    Q7,
}

impl Topic {
    /// The topic's name.
    pub fn name(self) -> &'static str {
        match self {
            Topic::Q5 => "nexmark-q5-in",
            Topic::Q7 => "nexmark-q7-in",
        }
    }

    /// The event type a bid is published as.
    fn bid_type(self) -> &'static str {
        match self {
            Topic::Q5 => "SlotBid",
            Topic::Q7 => "WindowBid",
        }
    }

    /// The key the module gives a bid at `at`.
    fn bid_key(self, at: i64) -> i64 {
        match self {
            Topic::Q5 => window_start(at, HOP_MS),
            Topic::Q7 => window_start(at, Q7_SIZE_MS),
        }
    }
}

fn window_start(at: i64, size: i64) -> i64 {
    at.div_euclid(size) * size
}

/// Nexmark's latest person (0-based) when event `n` is made.
fn last_person(n: u64) -> u64 {
    n / PROPORTION * PERSONS
}

/// Nexmark's latest auction (0-based) when event `n` is made (none before
/// the first).
fn last_auction(n: u64) -> Option<u64> {
    let (epoch, offset) = (n / PROPORTION, n % PROPORTION);
    match offset {
        0 => (epoch * AUCTIONS).checked_sub(1),
        o if o <= AUCTIONS => Some(epoch * AUCTIONS + o - 1),
        _ => Some(epoch * AUCTIONS + AUCTIONS - 1),
    }
}

/// The events of `spec`, in order.
pub fn generate(spec: NexmarkSpec) -> Vec<NexmarkEvent> {
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let rate = i64::from(spec.rate.max(1));
    (0..spec.events)
        .map(|n| {
            let at = BASE_MS + i64::try_from(n).unwrap_or(i64::MAX / 1_000) * 1_000 / rate;
            let person = last_person(n);
            let auction = last_auction(n).unwrap_or(0);
            match n % PROPORTION {
                0 => NexmarkEvent::Person { id: FIRST_PERSON_ID + person, at },
                o if o <= AUCTIONS => {
                    let seller =
                        FIRST_PERSON_ID + person.saturating_sub(rng.random_range(0..ACTIVE_PEOPLE.min(person + 1)));
                    NexmarkEvent::Auction { id: FIRST_AUCTION_ID + auction, seller, at }
                }
                _ => {
                    let auction = if rng.random_range(0..2) > 0 {
                        auction / HOT_RATIO * HOT_RATIO
                    } else {
                        let low = auction.saturating_sub(IN_FLIGHT_AUCTIONS);
                        low + rng.random_range(0..auction - low + 1 + AUCTION_ID_LEAD)
                    };
                    let bidder = if rng.random_range(0..4) > 0 {
                        person / HOT_RATIO * HOT_RATIO + 1
                    } else {
                        let people = person + 1;
                        let active = people.min(ACTIVE_PEOPLE);
                        people - active + rng.random_range(0..active + PERSON_ID_LEAD)
                    };
                    let price = (10f64.powf(rng.random::<f64>() * 6.0) * 100.0).round() as u64;
                    let (auction, bidder) = (FIRST_AUCTION_ID + auction, FIRST_PERSON_ID + bidder);
                    NexmarkEvent::Bid(Bid { auction, bidder, price, date_time: at })
                }
            }
        })
        .collect()
}

/// The events as messages of `module` for `topic`.
pub fn outgoing(
    module: &dyn HandlerModule,
    events: &[NexmarkEvent],
    topic: Topic,
) -> Result<Vec<Outgoing>, NexmarkError> {
    let tag = |name: &'static str| {
        module
            .event_types()
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.tag)
            .ok_or_else(|| NexmarkError::NotNexmark { module: module.name().to_owned(), name })
    };
    let (person, auction, bid) = (tag("Person")?, tag("Auction")?, tag(topic.bid_type())?);
    Ok(events
        .iter()
        .map(|event| match event {
            NexmarkEvent::Person { id, at } => {
                let body = json!({ "id": id, "name": format!("person {id}"), "city": "Kyoto", "date_time": at });
                Outgoing { tag: person, body: body.to_string().into_bytes() }
            }
            NexmarkEvent::Auction { id, seller, at } => {
                let body = json!({
                    "id": id, "seller": seller, "category": id % 5, "initial_bid": 100, "expires": at + 20_000,
                    "date_time": at
                });
                Outgoing { tag: auction, body: body.to_string().into_bytes() }
            }
            NexmarkEvent::Bid(b) => Outgoing { tag: bid, body: serde_json::to_vec(b).expect("JSON") },
        })
        .collect())
}

/// What the queries must emit: each sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Expected {
    /// Query 5's windows.
    pub(crate) q5: Vec<HotItems>,
    /// Query 7's windows.
    pub(crate) q7: Vec<HighestBid>,
}

/// The oracle (see the module docs).
pub(crate) fn oracle(events: &[NexmarkEvent], partitions: u32) -> Expected {
    let partition = |key: i64| partition_for(Key::int(key).key_hash(), partitions);
    // Each topic's final clock per partition: one past its latest time.
    let mut clocks: BTreeMap<(u8, u32), i64> = BTreeMap::new();
    let mut slots: BTreeMap<i64, BTreeMap<u64, u64>> = BTreeMap::new();
    let mut highest: BTreeMap<i64, (u64, Vec<Bid>)> = BTreeMap::new();
    for event in events {
        let (at, keys) = match event {
            NexmarkEvent::Person { id, at } | NexmarkEvent::Auction { id, at, .. } => {
                let key = i64::try_from(*id).unwrap_or(i64::MAX);
                (*at, [key, key])
            }
            NexmarkEvent::Bid(bid) => {
                let at = bid.date_time;
                *slots.entry(window_start(at, HOP_MS)).or_default().entry(bid.auction).or_default() += 1;
                let (price, bids) = highest.entry(window_start(at, Q7_SIZE_MS)).or_insert((bid.price, Vec::new()));
                if bid.price > *price {
                    (*price, *bids) = (bid.price, Vec::new());
                }
                if bid.price == *price {
                    bids.push(bid.clone());
                }
                (at, [Topic::Q5.bid_key(at), Topic::Q7.bid_key(at)])
            }
        };
        for (topic, key) in keys.into_iter().enumerate() {
            let clock = clocks.entry((topic as u8, partition(key))).or_insert(i64::MIN);
            *clock = (*clock).max(at + 1);
        }
    }
    let passed = |topic: u8, start: i64, size: i64| {
        clocks.get(&(topic, partition(start))).is_some_and(|clock| start + size - 1 < *clock)
    };
    let q7 = highest
        .into_iter()
        .filter(|(start, _)| passed(1, *start, Q7_SIZE_MS))
        .map(|(start, (price, mut bids))| {
            bids.sort();
            HighestBid { start, end: start + Q7_SIZE_MS, price, bids }
        })
        .collect();
    let closed: BTreeMap<i64, BTreeMap<u64, u64>> =
        slots.into_iter().filter(|(start, _)| passed(0, *start, HOP_MS)).collect();
    let starts: std::collections::BTreeSet<i64> =
        closed.keys().flat_map(|slot| (0..Q5_SIZE_MS / HOP_MS).map(move |back| slot - back * HOP_MS)).collect();
    let q5 = starts
        .into_iter()
        .filter_map(|start| {
            let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
            for slot in (start..start + Q5_SIZE_MS).step_by(HOP_MS as usize) {
                closed.get(&slot)?.iter().for_each(|(auction, count)| *counts.entry(*auction).or_default() += count);
            }
            let bids = counts.values().copied().max()?;
            let auctions = counts.into_iter().filter(|(_, count)| *count == bids).map(|(a, _)| a).collect();
            Some(HotItems { start, end: start + Q5_SIZE_MS, bids, auctions })
        })
        .collect();
    Expected { q5, q7 }
}

/// Every result on `topic` (one partition), sorted.
pub(crate) async fn results<L: EventLog, T: for<'a> Deserialize<'a> + Ord>(
    log: &L,
    topic: &str,
) -> Result<Vec<T>, NexmarkError> {
    let end = log.end_offset(topic, 0).await?;
    let mut found = Vec::new();
    let mut offset = 0;
    while offset < end {
        let read = log.read(topic, 0, offset, 4_096).await?;
        if read.is_empty() {
            break;
        }
        for stored in read {
            offset = stored.offset + 1;
            let result = serde_json::from_slice(&stored.record.body).map_err(|error| NexmarkError::Result {
                topic: topic.to_owned(),
                offset: stored.offset,
                reason: error.to_string(),
            })?;
            found.push(result);
        }
    }
    found.sort();
    Ok(found)
}

/// How many of `found` differ from `expected`: missing, extra or
/// different, as the multisets of both.
pub(crate) fn differences<T: Ord + Clone>(expected: &[T], found: &[T]) -> usize {
    let (mut e, mut f) = (expected.iter().peekable(), found.iter().peekable());
    let mut differ = 0;
    loop {
        match (e.peek(), f.peek()) {
            (None, None) => return differ,
            (Some(a), Some(b)) if a == b => {
                e.next();
                f.next();
            }
            (Some(a), Some(b)) if a < b => {
                differ += 1;
                e.next();
            }
            (Some(_), Some(_)) | (None, Some(_)) => {
                differ += 1;
                f.next();
            }
            (Some(_), None) => {
                differ += 1;
                e.next();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_keeps_nexmarks_proportions_and_clock_and_is_seeded() {
        let spec = NexmarkSpec { events: 5_000, rate: 10_000, seed: 7, partitions: 4 };
        let events = generate(spec);
        let count = |f: fn(&NexmarkEvent) -> bool| events.iter().filter(|e| f(e)).count();
        assert_eq!(count(|e| matches!(e, NexmarkEvent::Person { .. })), 100);
        assert_eq!(count(|e| matches!(e, NexmarkEvent::Auction { .. })), 300);
        assert_eq!(count(|e| matches!(e, NexmarkEvent::Bid(_))), 4_600);
        let at = |e: &NexmarkEvent| match e {
            NexmarkEvent::Person { at, .. } | NexmarkEvent::Auction { at, .. } => *at,
            NexmarkEvent::Bid(bid) => bid.date_time,
        };
        assert_eq!(at(&events[4_999]) - at(&events[0]), 499, "10 000 events/s: 0.1 ms apart");
        assert_eq!(events, generate(spec));
        assert_ne!(events, generate(NexmarkSpec { seed: 8, ..spec }));
        // Bids go to auctions that exist or are about to, half to the hot one.
        let bids: Vec<&Bid> =
            events.iter().filter_map(|e| if let NexmarkEvent::Bid(b) = e { Some(b) } else { None }).collect();
        assert!(bids.iter().all(|bid| bid.auction < FIRST_AUCTION_ID + 300 + AUCTION_ID_LEAD));
        let hot = bids.iter().filter(|bid| (bid.auction - FIRST_AUCTION_ID).is_multiple_of(HOT_RATIO)).count();
        assert!(hot > bids.len() * 2 / 5, "{hot} of {} bids on a hot auction", bids.len());
    }

    #[test]
    fn the_oracle_finds_the_highest_bids_and_the_hot_items() {
        let bid = |auction: u64, price: u64, at: i64| {
            NexmarkEvent::Bid(Bid { auction, bidder: 1, price, date_time: BASE_MS + at })
        };
        // Query 7's window [0, 10 s): 7 twice at the top. Query 5's slots
        // 0..5 hold auction 1 five times, auction 2 three; the end of the
        // log (a bid at 25 s, on every partition through persons) passes them.
        let mut events = vec![bid(1, 5, 0), bid(2, 7, 100), bid(1, 7, 2_100), bid(1, 3, 4_000), bid(2, 1, 6_000)];
        events.extend([bid(1, 1, 8_000), bid(1, 1, 9_999), bid(2, 2, 9_999)]);
        events.extend((0..64).map(|id| NexmarkEvent::Person { id, at: BASE_MS + 25_000 }));
        let expected = oracle(&events, 4);
        let top = expected.q7.iter().find(|w| w.start == BASE_MS).unwrap();
        assert_eq!((top.price, top.bids.len()), (7, 2));
        let hot = expected.q5.iter().find(|w| w.start == BASE_MS).unwrap();
        assert_eq!((hot.bids, hot.auctions.clone()), (5, vec![1]));
        assert_eq!(differences(&expected.q5, &expected.q5), 0);
        assert_eq!(differences(&expected.q5[1..], &expected.q5[..1]), expected.q5.len());
    }
}
