//! Untrusted modules against the PostgreSQL state store (gated on
//! `WAKU_POSTGRES_URL`): values the embedded store keeps as plain bytes
//! must not break a PostgreSQL commit or read, or the partition would be
//! tried again forever.
//!
//! Each test runs the hostile module (`tests/guests/hostile`) through the
//! real consumer over an embedded log and a projection of its own in the
//! database, and asserts what a user relies on: the offending call is
//! refused with a rule, the batch commits, the other keys are applied, a
//! restart goes on, and every event read is accounted for.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::json;
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig, Summary};
use wakuwaku::engine::projection::Projection;
use wakuwaku::key::{Key, KeyValue};
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku::storage::state::{BatchCommit, KeyWrites, PostgresStore, StateStore};
use wakuwaku_tests::hostile::{Accounts, OUT, attack, hostile_module, report, tag};

const TOPIC: &str = "hostile";

/// The hostile module over an embedded log and a fresh projection in the
/// database named by `WAKU_POSTGRES_URL`, or `None` without one.
struct Bed {
    _dir: tempfile::TempDir,
    url: String,
    log: Arc<EmbeddedLog>,
    projection: Arc<Projection>,
}

impl Bed {
    async fn new() -> Option<Self> {
        let Ok(url) = std::env::var("WAKU_POSTGRES_URL") else {
            eprintln!("skipped: the PostgreSQL hostile tests need a server named by WAKU_POSTGRES_URL");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
        log.create_topic(TOPIC, 1).await.unwrap();
        log.create_topic(OUT, 1).await.unwrap();
        // A projection no other run used: the tables are shared.
        let stamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
        let name = format!("hostile-{stamp}");
        let sandbox = Sandbox::new(SandboxLimits::default()).unwrap();
        let projection =
            Arc::new(Projection::new(&name, TOPIC, vec![hostile_module(&sandbox)], open(&url, &name)).unwrap());
        Some(Self { _dir: dir, url, log, projection })
    }

    fn store(&self) -> &StateStore {
        self.projection.store()
    }

    async fn append(&self, records: Vec<Record>) {
        self.log.append(TOPIC, vec![(0, records)]).await.unwrap();
    }

    /// Consumes what the topic holds now; a commit the store keeps failing
    /// shows as a run that never ends.
    async fn run(&self) -> Summary {
        let consumer = Consumer::new(self.log.clone(), self.projection.clone(), ConsumerConfig::default());
        let summary = tokio::time::timeout(Duration::from_secs(60), consumer.catch_up())
            .await
            .expect("the partition is not wedged")
            .expect("the consumer never stops because of a module");
        Accounts::of(self.store(), TOPIC, 1).check().unwrap();
        summary
    }

    /// The same projection over a new connection, as after a restart.
    fn reopened(self) -> Self {
        let Self { _dir, url, log, projection } = self;
        let (name, modules) = (projection.name().to_owned(), projection.modules());
        drop(projection);
        let projection = Arc::new(Projection::new(&name, TOPIC, modules, open(&url, &name)).unwrap());
        Self { _dir, url, log, projection }
    }
}

fn open(url: &str, projection: &str) -> StateStore {
    StateStore::from_backend(PostgresStore::connect(url, projection).unwrap())
}

/// A name with a NUL in it is valid UTF-8, and the embedded store keeps it,
/// but PostgreSQL `text` cannot hold it: the state imports refuse it
/// (`name-nul`) on every backend, and the partition goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_with_a_nul_is_refused_and_never_wedges_a_postgresql_partition() {
    let Some(bed) = Bed::new().await else { return };
    bed.append(vec![
        attack(tag::BAD_NAMES, 1, json!({ "name": "nul\u{0}name" })),
        attack(tag::SHARED_COUNTER, 2, json!({ "name": "\u{0}", "delta": 1 })),
        attack(tag::BEHAVE, 3, json!({})),
    ])
    .await;
    let summary = bed.run().await;
    assert_eq!(summary.applied, 3, "{summary:?}");
    let names = report(bed.store(), 1).expect("key 1 left a report");
    assert_eq!(names.outcomes, vec!["name-nul"; 5]);
    assert!(names.first["name-nul"].contains("NUL"), "{:?}", names.first);
    let counter = report(bed.store(), 2).expect("key 2 left a report");
    assert_eq!(counter.outcomes, vec!["name-nul"; 2]);
    assert!(report(bed.store(), 3).is_some(), "key 3 applied");

    // A restart goes on from the committed position.
    let bed = bed.reopened();
    bed.append(vec![attack(tag::BEHAVE, 4, json!({}))]).await;
    assert_eq!(bed.run().await.applied, 1);
    assert!(report(bed.store(), 4).is_some(), "key 4 applied after the restart");
}

/// Keys and values a module may legally produce that PostgreSQL is picky
/// about (a NUL in a string key, bytes that are not UTF-8, JSON that
/// `jsonb` refuses or cannot nest, numbers past its range) are kept
/// exactly, byte for byte, and never fail the commit that writes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_values_postgresql_is_picky_about_are_kept_byte_for_byte() {
    let Ok(url) = std::env::var("WAKU_POSTGRES_URL") else {
        eprintln!("skipped: the PostgreSQL hostile tests need a server named by WAKU_POSTGRES_URL");
        return;
    };
    let stamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
    let projection = format!("picky-{stamp}");
    let keys = [
        Key::of(&KeyValue::Str("nul\u{0}key".into())).unwrap(),
        Key::of(&KeyValue::Str("\u{7f}\u{1b}[2J é \u{fffd}".into())).unwrap(),
        Key::of(&KeyValue::Bytes(vec![0, 0xff, 0xfe])).unwrap(),
        Key::of(&KeyValue::Bytes(vec![b'k'; 1021])).unwrap(), // 1024 bytes in all: the limit
        Key::of(&KeyValue::Tuple(vec![KeyValue::Str("\u{0}".into()), KeyValue::Int(-1)])).unwrap(),
    ];
    let values: Vec<Vec<u8>> = vec![
        b"\"\\u0000\"".to_vec(),                                           // JSON jsonb refuses
        vec![0xff, 0xfe, 0x00],                                            // not UTF-8
        [vec![b'['; 200_000], vec![b']'; 200_000]].concat(),               // nested past jsonb's stack
        b"1e999999999".to_vec(),                                           // past numeric's range
        b"{\"a\": 1, \"a\": 2, \"\\ud800\": \"lone surrogate\"}".to_vec(), // duplicate key, bad escape
        vec![b' '; 1 << 20],                                               // 1 MiB of nothing
    ];
    let commit = |store: &StateStore, value_of: &dyn Fn(usize) -> Vec<u8>| {
        let writes = keys
            .iter()
            .map(|key| {
                let mut writes = KeyWrites::default();
                for index in 0..values.len() {
                    writes.set(&format!("v{index}"), value_of(index));
                }
                (key.clone(), writes)
            })
            .collect();
        store.commit(BatchCommit { writes, ..BatchCommit::default() }).expect("the commit goes through");
    };
    let check = |store: &StateStore, value_of: &dyn Fn(usize) -> Vec<u8>| {
        let mut listed = store.keys().unwrap();
        listed.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        let mut expected = keys.to_vec();
        expected.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        assert_eq!(listed, expected);
        for key in &keys {
            for index in 0..values.len() {
                let got = store.get(key, &format!("v{index}")).unwrap();
                assert!(got.as_deref() == Some(&value_of(index)[..]), "{key} v{index}");
            }
        }
    };
    let store = open(&url, &projection);
    commit(&store, &|index| values[index].clone());
    check(&store, &|index| values[index].clone());
    // Overwritten in place, also across a reconnect.
    drop(store);
    let store = open(&url, &projection);
    let swapped = |index: usize| values[values.len() - 1 - index].clone();
    commit(&store, &swapped);
    check(&store, &swapped);
}
