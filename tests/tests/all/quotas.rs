//! The state quotas of the contract (`counter-count`, `entries-per-key`)
//! through the real consumer, on both state stores (PostgreSQL gated on
//! `WAKU_POSTGRES_URL`), with the hostile module (`tests/guests/hostile`)
//! making new counters and entries for as long as the host lets it.
//!
//! What a user relies on: past the quota a new counter or entry is refused
//! at the call with a message naming the rule and the numbers; the store
//! holds exactly the quota, after a restart too; existing counters and
//! entries still change, a delete makes room, other keys are unaffected;
//! and the partitions go on.

use std::sync::Arc;
use std::time::SystemTime;

use serde_json::json;
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig, Summary};
use wakuwaku::engine::projection::Projection;
use wakuwaku::key::Key;
use wakuwaku::operations::dead_letter;
use wakuwaku::sandbox::handler::PayloadLimits;
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku::storage::state::{PostgresStore, StateStore};
use wakuwaku_tests::hostile::{Accounts, OUT, attack, counter, hostile_module, report, tag};
use wakuwaku_tests::postgres_url;

const TOPIC: &str = "quotas";

/// Where a bed keeps its state.
#[derive(Clone)]
enum Backend {
    Embedded,
    /// The database's URL and the projection's name (unique: the tables
    /// are shared).
    Postgres(String, String),
}

impl Backend {
    fn postgres(what: &str) -> Option<Self> {
        let url = postgres_url(what)?;
        let stamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
        Some(Self::Postgres(url, format!("quotas-{stamp}")))
    }

    fn projection(&self) -> &str {
        match self {
            Self::Embedded => "quotas",
            Self::Postgres(_, projection) => projection,
        }
    }

    fn open(&self, dir: &std::path::Path) -> StateStore {
        match self {
            Self::Embedded => StateStore::open(&dir.join("state.redb")).unwrap(),
            Self::Postgres(url, projection) => {
                StateStore::from_backend(PostgresStore::connect(url, projection).unwrap())
            }
        }
    }
}

/// The hostile module over an embedded log of `partitions` partitions and
/// a store of `backend`, under `payload`.
struct Bed {
    dir: tempfile::TempDir,
    backend: Backend,
    log: Arc<EmbeddedLog>,
    projection: Arc<Projection>,
    config: ConsumerConfig,
    partitions: u32,
}

impl Bed {
    async fn new(backend: Backend, payload: PayloadLimits, partitions: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
        log.create_topic(TOPIC, partitions).await.unwrap();
        log.create_topic(OUT, 1).await.unwrap();
        let sandbox = Sandbox::new(SandboxLimits::default()).unwrap().with_payload_limits(payload);
        let store = backend.open(dir.path());
        let projection =
            Arc::new(Projection::new(backend.projection(), TOPIC, vec![hostile_module(&sandbox)], store).unwrap());
        let config = ConsumerConfig { workers: 2, payload, ..ConsumerConfig::default() };
        Self { dir, backend, log, projection, config, partitions }
    }

    fn store(&self) -> &StateStore {
        self.projection.store()
    }

    async fn append(&self, partition: u32, records: Vec<Record>) {
        self.log.append(TOPIC, vec![(partition, records)]).await.unwrap();
    }

    /// Consumes what the topic holds now and checks every event is
    /// accounted for.
    async fn run(&self) -> Summary {
        let summary = Consumer::new(self.log.clone(), self.projection.clone(), self.config.clone())
            .catch_up()
            .await
            .expect("the consumer never stops because of a module");
        Accounts::of(self.store(), TOPIC, self.partitions).check().unwrap();
        summary
    }

    /// The same store opened afresh, as after a restart.
    fn reopened(self) -> Self {
        let Self { dir, backend, log, projection, config, partitions } = self;
        let modules = projection.modules();
        drop(projection);
        let store = backend.open(dir.path());
        let projection = Arc::new(Projection::new(backend.projection(), TOPIC, modules, store).unwrap());
        Self { dir, backend, log, projection, config, partitions }
    }

    /// The counters whose names start with `prefix`.
    fn counters_named(&self, prefix: &str) -> usize {
        self.store().counters().unwrap().iter().filter(|(name, _)| name.starts_with(prefix)).count()
    }

    /// The failure message of the dead letter of integer key `key`.
    async fn dead_letter_reason(&self, key: u64) -> String {
        let letters = dead_letter::list(&*self.log, TOPIC, self.backend.projection(), self.store()).await.unwrap();
        let letter = letters
            .iter()
            .find(|l| l.envelope.as_ref().is_ok_and(|h| h.key == Key::int(key)))
            .unwrap_or_else(|| panic!("key {key} is not dead-lettered"));
        letter.routed.failure.clone().expect("a dead letter says why").message
    }
}

/// Keys 1 to 4 add to new counters until refused (1 000 a call at most);
/// the projection may hold 2 500.
async fn counters_stop_at_the_quota_and_existing_ones_still_change(backend: Backend) {
    let payload = PayloadLimits { max_counters: 2_500, ..PayloadLimits::default() };
    let bed = Bed::new(backend, payload, 1).await;
    bed.append(0, (1..=4).map(|key| attack(tag::COUNTER_NAMES, key, json!({ "seq": key }))).collect()).await;
    assert_eq!(bed.run().await.applied, 4);
    // Exactly the quota, whichever keys got there first.
    assert_eq!(bed.store().counters().unwrap().len(), 2_500);
    assert_eq!(bed.counters_named("many."), 2_500);
    let reports: Vec<_> = (1..=4).map(|key| report(bed.store(), key).expect("each key left a report")).collect();
    assert_eq!(reports.iter().map(|r| r.accepted).sum::<u64>(), 2_500);
    let full: Vec<_> = reports.iter().filter_map(|r| r.first.get("counter-count")).collect();
    assert!(!full.is_empty(), "{reports:?}");
    for message in full {
        assert!(message.starts_with("counter-count: the projection holds 2500 counters"), "{message}");
        assert!(message.contains("at most 2500"), "{message}");
    }

    // At the quota: an existing counter still changes, a new one does not,
    // and a module that returns the refusal has its event dead-lettered.
    bed.append(
        0,
        vec![
            attack(tag::SHARED_COUNTER, 5, json!({ "name": "many.1.0", "delta": 41 })),
            attack(tag::SHARED_COUNTER, 6, json!({ "name": "fresh", "delta": 1 })),
            attack(tag::COUNTER_NAMES, 7, json!({ "seq": 7, "then": "return" })),
        ],
    )
    .await;
    let summary = bed.run().await;
    assert_eq!((summary.applied, summary.dead_lettered), (2, 1), "{summary:?}");
    assert_eq!(report(bed.store(), 5).unwrap().outcomes, ["ok", "= 42"]);
    assert_eq!(report(bed.store(), 6).unwrap().outcomes, ["counter-count", "= 0"]);
    let reason = bed.dead_letter_reason(7).await;
    assert!(reason.contains("counter-count: the projection holds 2500 counters"), "{reason}");
    assert_eq!(counter(bed.store(), "fresh"), 0);

    // A restart counts what is committed: still full.
    let bed = bed.reopened();
    bed.append(0, vec![attack(tag::COUNTER_NAMES, 8, json!({ "seq": 8 }))]).await;
    assert_eq!(bed.run().await.applied, 1);
    assert_eq!(report(bed.store(), 8).unwrap().accepted, 0);
    assert_eq!(bed.store().counters().unwrap().len(), 2_500);
}

/// Key 1 sets new entries until refused (1 000 a call at most); a key may
/// hold 1 500.
async fn entries_stop_at_the_quota_and_a_key_may_still_overwrite_and_delete(backend: Backend) {
    let payload = PayloadLimits { max_entries_per_key: 1_500, ..PayloadLimits::default() };
    let bed = Bed::new(backend, payload, 1).await;
    let flood = |key, seq| attack(tag::SET_FLOOD, key, json!({ "seq": seq }));
    bed.append(0, vec![flood(1, 1), flood(1, 2), flood(1, 3)]).await;
    assert_eq!(bed.run().await.applied, 3);
    let entries = |key| bed.store().entries(&Key::int(key)).unwrap();
    assert_eq!(entries(1).len(), 1_500);
    // The first call stopped at the per-call limit, the second at the
    // quota, the third at once (and no report fits either: it is new).
    assert_eq!(counter(bed.store(), "SetFlood.accepted"), 1_500);
    assert_eq!(counter(bed.store(), "SetFlood.refused.state-writes-per-call"), 1);
    assert_eq!(counter(bed.store(), "SetFlood.refused.entries-per-key"), 2);
    assert_eq!(report(bed.store(), 1), None);

    // At the quota: overwriting its 1 000 first entries passes, and so do
    // a delete and the new entry it makes room for (the report); another
    // key has a quota of its own; returning the refusal dead-letters.
    bed.append(
        0,
        vec![
            attack(tag::SET_FLOOD, 1, json!({ "seq": 1, "n": 1_000 })),
            attack(tag::BAD_NAMES, 1, json!({ "name": "flood.1.0" })),
            flood(2, 9),
            attack(tag::SET_FLOOD, 1, json!({ "seq": 4, "then": "return" })),
        ],
    )
    .await;
    let summary = bed.run().await;
    assert_eq!((summary.applied, summary.dead_lettered), (3, 1), "{summary:?}");
    assert_eq!(counter(bed.store(), "SetFlood.accepted"), 1_500 + 1_000 + 1_000);
    let names = report(bed.store(), 1).expect("the delete made room for the report");
    assert_eq!(names.outcomes, ["ok"; 5], "get, set, delete, counter-add, counter-get of `flood.1.0`");
    assert_eq!(entries(1).len(), 1_500);
    assert!(entries(1).iter().any(|(name, _)| name == "report"));
    assert!(!entries(1).iter().any(|(name, _)| name == "flood.1.0"));
    assert_eq!(entries(2).len(), 1_000, "another key is not held back");
    let reason = bed.dead_letter_reason(1).await;
    assert!(
        reason.contains(
            "entries-per-key: this key holds 1500 entries (committed and written in this batch), at most 1500"
        ),
        "{reason}"
    );

    // A restart counts what is committed: still full.
    let bed = bed.reopened();
    bed.append(0, vec![flood(1, 5)]).await;
    assert_eq!(bed.run().await.applied, 1);
    assert_eq!(counter(bed.store(), "SetFlood.refused.entries-per-key"), 3);
    assert_eq!(bed.store().entries(&Key::int(1)).unwrap().len(), 1_500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_stop_at_the_quota_and_existing_ones_still_change_embedded() {
    counters_stop_at_the_quota_and_existing_ones_still_change(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_stop_at_the_quota_and_existing_ones_still_change_on_postgresql() {
    let Some(backend) = Backend::postgres("the counter quota on PostgreSQL") else { return };
    counters_stop_at_the_quota_and_existing_ones_still_change(backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_stop_at_the_quota_and_a_key_may_still_overwrite_and_delete_embedded() {
    entries_stop_at_the_quota_and_a_key_may_still_overwrite_and_delete(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_stop_at_the_quota_and_a_key_may_still_overwrite_and_delete_on_postgresql() {
    let Some(backend) = Backend::postgres("the entry quota on PostgreSQL") else { return };
    entries_stop_at_the_quota_and_a_key_may_still_overwrite_and_delete(backend).await;
}

/// Four partitions add new counters at once, each batch over its own
/// snapshot: together they stop at the quota, not at a quota each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_in_flight_share_one_counter_quota() {
    let payload = PayloadLimits { max_counters: 1_500, ..PayloadLimits::default() };
    let bed = Bed::new(Backend::Embedded, payload, 4).await;
    for partition in 0..4u32 {
        let keys = (1..=3).map(|n| u64::from(partition) * 10 + n);
        bed.append(partition, keys.map(|key| attack(tag::COUNTER_NAMES, key, json!({ "seq": key }))).collect()).await;
    }
    assert_eq!(bed.run().await.applied, 12);
    assert_eq!(bed.store().counters().unwrap().len(), 1_500);
}
