//! The inventory demo (`waku demo inventory`): the shape of the "silence"
//! source, generated from a seed, for a projection over several topics in
//! event-time order.
//!
//! - **Topics**: [`TIMED_TOPICS`] (12, events with event time) and
//!   [`CATALOGUE`] (no event time), all with the same partition count,
//!   products as keys (the `inventory` example module).
//! - **History**: events spread over days of event time. Each timed topic
//!   is in event-time order per partition (as one producer writes it), and
//!   the topics differ in density (topic `i` gets `i + 1` shares), so the
//!   host reads them far apart in event time: the usual disorder across
//!   topics. The catalogue has one entry per product.
//! - **The start-up race**: [`DemoLog`] answers every read of one topic
//!   with nothing for the first seconds, as a slow connection does, though
//!   its history is in the log.
//! - **Live traffic**: events appended at a stated rate, each stamped with
//!   its event time when it is appended ([`DemoLog::append_stamped`]: the
//!   stamp and the append happen under one lock that end-offset reads also
//!   take, as with a log's append time), so every event that lands is
//!   stamped no earlier than any end offset read before it.
//! - **The oracle**: each product's timed events sorted by event time, ties
//!   by topic index (the order of [`topics`]) and then by position in the
//!   topic (the order they were appended), applied natively one by one; the
//!   latest catalogue entry. Written apart from the module, so that it
//!   checks the module and the host.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use serde_json::json;

use crate::authoring::publish::headers_for;
use crate::engine::consumer::LatencyHistogram;
use crate::event::{EventTypeTag, partition_for};
use crate::operations::host::{Host, HostError, HostSettings, RunningHost};
use crate::sandbox::handler::{CallError, HandlerInstance, HandlerModule};
use crate::storage::log::{self, EventLog, LogError, PolledBatch, Record, StoredRecord};
use crate::storage::state::{StateError, StateStore};

/// The 12 topics whose events carry event time, in release-order index.
pub const TIMED_TOPICS: [&str; 12] = [
    "receipts",
    "sales",
    "returns",
    "transfers-in",
    "transfers-out",
    "reservations",
    "cancellations",
    "damages",
    "recounts",
    "web-orders",
    "store-orders",
    "adjustments",
];

/// The topic without event time: the processing-time clock.
pub const CATALOGUE: &str = "catalogue";

/// Which timed topics add stock (the others remove it).
fn adds_stock(topic: usize) -> bool {
    matches!(TIMED_TOPICS[topic], "receipts" | "returns" | "transfers-in" | "cancellations" | "recounts")
}

/// Every topic of the projection, in the order given to the host: the timed
/// ones, then the catalogue.
pub fn topics() -> Vec<String> {
    TIMED_TOPICS.iter().chain([&CATALOGUE]).map(|t| (*t).to_owned()).collect()
}

/// The state entry of a product's stock, and of its catalogue entry.
pub const STOCK_ENTRY: &str = "stock";
/// See [`STOCK_ENTRY`].
pub const CATALOGUE_ENTRY: &str = "catalogue";

/// Event type names of the inventory module.
pub mod event_name {
    /// Tag 1: adds stock, with event time.
    pub const ADDED: &str = "StockAdded";
    /// Tag 2: removes stock, with event time.
    pub const REMOVED: &str = "StockRemoved";
    /// Tag 3: the catalogue, without event time.
    pub const CATALOGUE: &str = "CatalogueUpdated";
}

/// The size and seed of the demo.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InventorySpec {
    /// Products (keys).
    pub products: u64,
    /// Timed events of the history.
    pub history: usize,
    /// Days of event time the history spans, ending at the start.
    pub days: u32,
    /// Partitions of every topic.
    pub partitions: u32,
    /// Live events per second.
    pub live_rate: u32,
    /// How long the live phase lasts.
    pub live: Duration,
    /// How long reads of the late topic find nothing at start-up.
    pub late_start: Duration,
    /// The seed: equal specs give equal histories.
    pub seed: u64,
}

impl Default for InventorySpec {
    fn default() -> Self {
        InventorySpec {
            products: 200,
            history: 12_000,
            days: 7,
            partitions: 3,
            live_rate: 400,
            live: Duration::from_secs(5),
            late_start: Duration::from_secs(3),
            seed: 42,
        }
    }
}

/// The topic whose partitions start being read late: the densest one, so
/// that the others would run furthest ahead of it.
pub const LATE_TOPIC: usize = 11;

/// One generated event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// Index into [`topics`] (the catalogue is last).
    pub topic: usize,
    /// The product.
    pub product: u64,
    /// Units (stock events).
    pub quantity: i64,
    /// Unique per event, in generation order.
    pub id: u64,
    /// Its event time (none for the catalogue, and for live events until
    /// they are stamped).
    pub time: Option<i64>,
}

/// The history: per topic, its events in append order. Timed topics are
/// in event-time order; topic `i` has about `i + 1` shares of the events.
pub fn history(spec: &InventorySpec, end_ms: i64) -> Vec<Vec<Planned>> {
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let span = i64::from(spec.days.max(1)) * 86_400_000;
    let shares: u64 = (1..=TIMED_TOPICS.len() as u64).sum();
    let mut topics: Vec<Vec<Planned>> = vec![Vec::new(); TIMED_TOPICS.len() + 1];
    for id in 0..spec.history as u64 {
        let mut share = rng.random_range(0..shares);
        let topic = (0..TIMED_TOPICS.len()).find(|&t| {
            let size = t as u64 + 1;
            let here = share < size;
            share = share.saturating_sub(size);
            here
        });
        let topic = topic.unwrap_or(0);
        // Whole seconds: ties across topics happen, and the tie rule shows.
        let time = end_ms - span + rng.random_range(0..span / 1000) * 1000;
        let product = rng.random_range(0..spec.products.max(1));
        topics[topic].push(Planned { topic, product, quantity: rng.random_range(1..=9), id, time: Some(time) });
    }
    for events in &mut topics {
        events.sort_by_key(|event| event.time);
    }
    let first_id = spec.history as u64;
    topics[TIMED_TOPICS.len()] = (0..spec.products.max(1))
        .map(|product| Planned { topic: TIMED_TOPICS.len(), product, quantity: 0, id: first_id + product, time: None })
        .collect();
    topics
}

/// A live event of generation number `id` (not stamped yet).
pub fn live_event(rng: &mut ChaCha8Rng, spec: &InventorySpec, id: u64) -> Planned {
    let topic = rng.random_range(0..=TIMED_TOPICS.len());
    Planned {
        topic,
        product: rng.random_range(0..spec.products.max(1)),
        quantity: rng.random_range(1..=9),
        id,
        time: None,
    }
}

/// The read model of a product's stock, as the module keeps it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Stock {
    /// Units in stock.
    pub level: i64,
    /// Stock events applied.
    pub applied: u64,
    /// Removals refused as the stock was short.
    pub refused: u64,
    /// FNV-1a over the ids applied, in order.
    pub chain: u64,
}

impl Stock {
    fn apply(&mut self, adds: bool, quantity: i64, id: u64) {
        if adds {
            self.level = self.level.wrapping_add(quantity);
        } else if self.level >= quantity {
            self.level -= quantity;
        } else {
            self.refused += 1;
        }
        let mut hash = if self.applied == 0 { 0xcbf2_9ce4_8422_2325 } else { self.chain };
        for byte in id.to_le_bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.chain = hash;
        self.applied += 1;
    }
}

/// One stock event as the oracle keeps it: (event time, topic, position
/// in the topic, adds, quantity, id).
type OracleEvent = (i64, usize, usize, bool, i64, u64);

/// What the oracle expects per product: its stock. (Catalogue entries
/// commute with everything and are not checked.)
#[derive(Debug, Default)]
pub struct Oracle {
    /// Per product, its stock events as appended.
    timed: BTreeMap<u64, Vec<OracleEvent>>,
    appended: Vec<usize>,
}

impl Oracle {
    /// Takes in `event` as appended to its topic (after any before it).
    pub fn appended(&mut self, event: &Planned) {
        if self.appended.len() <= event.topic {
            self.appended.resize(event.topic + 1, 0);
        }
        let position = self.appended[event.topic];
        self.appended[event.topic] += 1;
        if let Some(time) = event.time {
            self.timed.entry(event.product).or_default().push((
                time,
                event.topic,
                position,
                adds_stock(event.topic),
                event.quantity,
                event.id,
            ));
        }
    }

    /// Each product's stock: its events sorted by (event time, topic,
    /// position), applied one by one.
    pub fn expected(&self) -> BTreeMap<u64, Stock> {
        self.timed
            .iter()
            .map(|(&product, events)| {
                let mut events = events.clone();
                events.sort_unstable_by_key(|&(time, topic, position, ..)| (time, topic, position));
                let mut stock = Stock::default();
                events.iter().for_each(|&(_, _, _, adds, quantity, id)| stock.apply(adds, quantity, id));
                (product, stock)
            })
            .collect()
    }

    /// How many events it took in.
    pub fn events(&self) -> usize {
        self.appended.iter().sum()
    }
}

/// Why the demo could not make or check its events.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InventoryError {
    /// The module is not the inventory example.
    #[error("module `{module}` declares no event type `{name}`: is it the inventory example?")]
    NotInventory {
        /// The module.
        module: String,
        /// The missing event type.
        name: &'static str,
    },
    /// The module failed on a body.
    #[error("the module could not compute a product's key: {0}")]
    Call(#[from] CallError),
    /// The state could not be read.
    #[error(transparent)]
    State(#[from] StateError),
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The host failed.
    #[error(transparent)]
    Host(#[from] HostError),
    /// The host did not apply everything appended in time.
    #[error("the host had not applied every event {0:?} after the last was appended")]
    Stalled(Duration),
}

/// What a run of the demo found.
#[derive(Debug)]
pub struct InventoryReport {
    /// Events of the history, and of the live phase (catalogue included).
    pub history_events: usize,
    /// See [`InventoryReport::history_events`].
    pub live_events: usize,
    /// From the host's start until the history was applied.
    pub history_time: Duration,
    /// How long the live phase appended.
    pub live_time: Duration,
    /// Late events counted over every partition index.
    pub violations: u64,
    /// Release latencies of the live phase.
    pub live_latency: LatencyHistogram,
    /// The most bytes held at once by one partition index, and the sum of
    /// every partition index's peak.
    pub peak_held_bytes: (u64, u64),
    /// Products compared, and the differences found (at most 5 shown).
    pub products: usize,
    /// See [`InventoryReport::products`].
    pub differences: Vec<String>,
}

/// Runs the demo on `log` with `settings` (the topics and the clock are
/// set here) and the inventory `module`: the history, the host started
/// with one topic read late, the live phase, and the check.
pub async fn run<L: EventLog>(
    log: L,
    mut settings: HostSettings,
    module: Arc<dyn HandlerModule>,
    spec: InventorySpec,
) -> Result<InventoryReport, InventoryError> {
    let names = topics();
    settings.topic = names[0].clone();
    settings.more_topics = names[1..].to_vec();
    settings.consumer.untimed_topics = vec![CATALOGUE.to_owned()];
    let log = Arc::new(DemoLog::new(log, TIMED_TOPICS[LATE_TOPIC], spec.late_start));
    for topic in &names {
        log.create_topic(topic, spec.partitions).await?;
    }
    let mut encoder = Encoder::new(&*module, spec.partitions)?;
    let mut oracle = Oracle::default();
    for (topic, events) in names.iter().zip(history(&spec, crate::platform::clock::now_ms() as i64)) {
        for chunk in events.chunks(4096) {
            let mut batches: Vec<(u32, Vec<Record>)> = (0..spec.partitions).map(|p| (p, Vec::new())).collect();
            for event in chunk {
                oracle.appended(event);
                let (partition, record) = encoder.record(event)?;
                batches[partition as usize].1.push(record);
            }
            log.append(topic, batches).await?;
        }
    }
    let history_events = oracle.events();
    log.arm();
    let started = Instant::now();
    let host = Host::start_on(log.clone(), settings).await?;
    applied(&log, &host, &names, spec.partitions).await?;
    let history_time = started.elapsed();
    let before = host.timing().release_latency();
    let started = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed.wrapping_add(1));
    let total = (f64::from(spec.live_rate) * spec.live.as_secs_f64()) as u64;
    for n in 0..total {
        let due = Duration::from_secs_f64(n as f64 / f64::from(spec.live_rate.max(1)));
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let event = live_event(&mut rng, &spec, history_events as u64 + n);
        let timed = event.topic < TIMED_TOPICS.len();
        let event = log.append_stamped(&names[event.topic], event, &mut encoder, timed).await?;
        oracle.appended(&event);
    }
    let live_time = started.elapsed();
    applied(&log, &host, &names, spec.partitions).await?;
    let live_latency = host.timing().release_latency().since(&before);
    let timing = host.timing().snapshot();
    let projection = host.projection().clone();
    host.stop().await?;
    let found = encoder.stocks(projection.store(), spec.products)?;
    let (products, differences) = compare(&oracle.expected(), &found, 5);
    Ok(InventoryReport {
        history_events,
        live_events: oracle.events() - history_events,
        history_time,
        live_time,
        violations: timing.iter().map(|t| t.order_violations).sum(),
        live_latency,
        peak_held_bytes: (
            timing.iter().map(|t| t.peak_held_bytes).max().unwrap_or(0),
            timing.iter().map(|t| t.peak_held_bytes).sum(),
        ),
        products,
        differences,
    })
}

/// Waits until the host committed every topic's partitions up to their
/// ends, with nothing held.
async fn applied<L: EventLog>(
    log: &DemoLog<L>,
    host: &RunningHost<DemoLog<L>>,
    topics: &[String],
    partitions: u32,
) -> Result<(), InventoryError> {
    const PATIENCE: Duration = Duration::from_secs(600);
    let since = Instant::now();
    let store = host.projection().store();
    loop {
        let mut done = host.timing().snapshot().iter().all(|t| t.held_events == 0);
        for topic in topics {
            for partition in 0..partitions {
                let end = log.log.end_offset(topic, partition).await?;
                done &= store.position(topic, partition)?.unwrap_or(0) >= end;
            }
        }
        if done {
            return Ok(());
        }
        if since.elapsed() > PATIENCE {
            return Err(InventoryError::Stalled(PATIENCE));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Makes the records of inventory events with one module instance.
pub struct Encoder {
    instance: Box<dyn HandlerInstance>,
    types: Vec<crate::sandbox::handler::EventType>,
    tags: [EventTypeTag; 3],
    partitions: u32,
}

impl Encoder {
    /// An encoder for `module`, whose topics have `partitions` partitions.
    pub fn new(module: &dyn HandlerModule, partitions: u32) -> Result<Self, InventoryError> {
        let tag = |name: &'static str| {
            module
                .event_types()
                .iter()
                .find(|t| t.name == name)
                .map(|t| t.tag)
                .ok_or_else(|| InventoryError::NotInventory { module: module.name().to_owned(), name })
        };
        let tags = [tag(event_name::ADDED)?, tag(event_name::REMOVED)?, tag(event_name::CATALOGUE)?];
        Ok(Encoder { instance: module.instantiate()?, types: module.event_types().to_vec(), tags, partitions })
    }

    /// `event`'s partition and record: its event time, if it has one, in
    /// the body's `at`, which the module returns and [`headers_for`] writes
    /// into the `waku-event-time` header, as `waku publish` does. Its topic decides its type: a
    /// catalogue entry, or stock added or removed.
    pub fn record(&mut self, event: &Planned) -> Result<(u32, Record), InventoryError> {
        let (tag, body) = match event.topic >= TIMED_TOPICS.len() {
            true => (
                self.tags[2],
                json!({ "product": event.product, "name": format!("product {}", event.id), "price": event.id % 1000 }),
            ),
            false => {
                let tag = if adds_stock(event.topic) { self.tags[0] } else { self.tags[1] };
                (tag, json!({ "product": event.product, "quantity": event.quantity, "id": event.id, "at": event.time }))
            }
        };
        let body = serde_json::to_vec(&body).expect("JSON");
        let event_type = self.types.iter().find(|t| t.tag == tag).expect("a tag of the module");
        let headers = headers_for(&mut *self.instance, event_type, &body)?;
        let partition = partition_for(headers.key.key_hash(), self.partitions);
        Ok((partition, Record { headers: headers.to_headers(), body }))
    }

    /// Reads each product's stock from `store`: missing ones are absent.
    pub fn stocks(&mut self, store: &StateStore, products: u64) -> Result<BTreeMap<u64, Stock>, InventoryError> {
        let mut stocks = BTreeMap::new();
        for product in 0..products {
            let body =
                serde_json::to_vec(&json!({ "product": product, "quantity": 0, "id": 0, "at": 0 })).expect("JSON");
            let key = self.instance.key(self.tags[0], &body)?;
            if let Some(bytes) = store.get(&key, STOCK_ENTRY)? {
                // An entry the module wrote badly reads as a difference.
                let stock =
                    serde_json::from_slice(&bytes).unwrap_or(Stock { chain: 0, applied: u64::MAX, ..Stock::default() });
                stocks.insert(product, stock);
            }
        }
        Ok(stocks)
    }
}

/// The demo's log: another log, but reads of one topic find nothing until
/// some time after [`DemoLog::arm`] (the start-up race), and
/// [`DemoLog::append_stamped`] stamps events as they are appended.
pub struct DemoLog<L> {
    log: L,
    late_topic: String,
    late_until: Mutex<Option<Instant>>,
    late_for: Duration,
    /// Held while a live event is stamped and appended, and while an end
    /// offset is read.
    stamping: tokio::sync::Mutex<()>,
}

impl<L: EventLog> DemoLog<L> {
    /// `log`, where `late_topic` is read late by `late_for` once armed.
    pub fn new(log: L, late_topic: &str, late_for: Duration) -> Self {
        DemoLog {
            log,
            late_topic: late_topic.to_owned(),
            late_until: Mutex::new(None),
            late_for,
            stamping: tokio::sync::Mutex::new(()),
        }
    }

    /// Starts the late topic's delay now (call it right before the host
    /// starts).
    pub fn arm(&self) {
        *self.late_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + self.late_for);
    }

    fn reads_late(&self, topic: &str) -> bool {
        topic == self.late_topic
            && self.late_until.lock().unwrap_or_else(|e| e.into_inner()).is_some_and(|until| Instant::now() < until)
    }

    /// Stamps `event` with the processing time, then appends it: no end
    /// offset is read in between. Returns the stamped event.
    pub async fn append_stamped(
        &self,
        topic: &str,
        mut event: Planned,
        encoder: &mut Encoder,
        timed: bool,
    ) -> Result<Planned, InventoryError> {
        let _stamping = self.stamping.lock().await;
        if timed {
            event.time = Some(crate::platform::clock::now_ms() as i64);
        }
        let (partition, record) = encoder.record(&event)?;
        self.log.append(topic, vec![(partition, vec![record])]).await?;
        Ok(event)
    }
}

impl<L: EventLog> log::ForwardingLog for DemoLog<L> {
    type Inner = L;

    fn inner(&self) -> impl std::ops::Deref<Target = L> + Send + '_ {
        &self.log
    }

    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<StoredRecord>, LogError> {
        if self.reads_late(topic) {
            return Ok(Vec::new());
        }
        self.log.read(topic, partition, from, max).await
    }
    async fn poll(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        mut batch: PolledBatch,
    ) -> Result<PolledBatch, LogError> {
        if self.reads_late(topic) {
            batch.clear();
            return Ok(batch);
        }
        self.log.poll(topic, partition, from, max, batch).await
    }
    async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64, LogError> {
        let _stamping = self.stamping.lock().await;
        self.log.end_offset(topic, partition).await
    }
    async fn end_offsets(&self, topic: &str) -> Result<Vec<u64>, LogError> {
        let _stamping = self.stamping.lock().await;
        self.log.end_offsets(topic).await
    }
    async fn extent(&self, topic: &str, partition: u32) -> Result<(u64, u64), LogError> {
        let _stamping = self.stamping.lock().await;
        self.log.extent(topic, partition).await
    }
}

/// The differences between the read model and the oracle, at most `max`
/// of them described, and how many products were compared.
pub fn compare(expected: &BTreeMap<u64, Stock>, found: &BTreeMap<u64, Stock>, max: usize) -> (usize, Vec<String>) {
    let mut differences = Vec::new();
    let products: std::collections::BTreeSet<u64> = expected.keys().chain(found.keys()).copied().collect();
    for &product in &products {
        let (want, got) = (expected.get(&product), found.get(&product));
        if want != got {
            differences.push(format!("product {product}: expected {want:?}, found {got:?}"));
        }
    }
    let count = differences.len();
    differences.truncate(max);
    if count > max {
        differences.push(format!("… and {} more", count - max));
    }
    (products.len(), differences)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_is_seeded_in_time_order_per_topic_and_denser_for_later_topics() {
        let spec = InventorySpec { history: 6_000, ..InventorySpec::default() };
        let one = history(&spec, 1_796_212_800_000);
        assert_eq!(one, history(&spec, 1_796_212_800_000));
        assert_eq!(one.len(), 13);
        for events in &one[..12] {
            assert!(events.windows(2).all(|pair| pair[0].time <= pair[1].time));
        }
        assert!(one[11].len() > 5 * one[0].len(), "{} against {}", one[11].len(), one[0].len());
        assert_eq!(one[12].len() as u64, spec.products);
    }

    #[test]
    fn the_oracle_sorts_by_time_then_topic_then_position_and_tells_orders_apart() {
        let event = |topic, id, time| Planned { topic, product: 1, quantity: 5, id, time: Some(time) };
        let mut oracle = Oracle::default();
        // A removal at 10 in "sales" (1), a receipt at 10 in "receipts" (0):
        // the tie goes to the receipt, so nothing is refused.
        oracle.appended(&event(1, 1, 10));
        oracle.appended(&event(0, 2, 10));
        let stock = oracle.expected()[&1];
        assert_eq!((stock.level, stock.refused, stock.applied), (0, 0, 2));
        let mut other = Oracle::default();
        other.appended(&event(1, 1, 9));
        other.appended(&event(0, 2, 10));
        assert_eq!(other.expected()[&1].refused, 1);
        assert_ne!(other.expected()[&1].chain, stock.chain);
    }
}
