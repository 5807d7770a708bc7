//! Issue 10, case 5, from the module's side: keys whose hashes collide stay
//! apart across the WIT boundary. This binary forces every key's hash to
//! one number (`key::test_support::force_key_hash`, process-wide, hence a
//! binary of its own), then runs the hostile module's `Behave` events: the
//! module checks that the key bytes `handle` receives are the ones its
//! `key` export gives the body (and fails the call otherwise), writes them
//! to its state and emits them. Every key must keep its own state and its
//! own emitted messages.

use std::sync::Arc;

use serde_json::json;
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::event::EventHeaders;
use wakuwaku::key::Key;
use wakuwaku::key::test_support::force_key_hash;
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
use wakuwaku::storage::log::EventLog;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku_tests::hostile::{Accounts, OUT, attack, counter, hostile_module, tag};
use wakuwaku_tests::{catch_up, host_settings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_whose_hashes_collide_keep_their_own_state_and_emits_through_the_boundary() {
    force_key_hash(|_| 7);
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("hostile", 1).await.unwrap();
    log.create_topic(OUT, 2).await.unwrap();
    let keys = 1..=20u64;
    let records = keys
        .clone()
        .flat_map(|key| (0..3).map(move |seq| attack(tag::BEHAVE, key, json!({ "seq": seq, "mode": "emit" }))))
        .collect();
    log.append("hostile", vec![(0, records)]).await.unwrap();
    let sandbox = Sandbox::new(SandboxLimits::default()).unwrap();
    let config = ConsumerConfig { workers: 2, ..ConsumerConfig::default() };
    let settings = host_settings(dir.path(), "collide", "hostile", vec![hostile_module(&sandbox)], config);
    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!((summary.applied, summary.dead_lettered), (60, 0), "{summary:?}");
    Accounts::of(projection.store(), "hostile", 1).check().unwrap();

    for key in keys.clone() {
        let key = Key::int(key);
        assert_eq!(key.key_hash(), 7);
        assert_eq!(projection.store().get(&key, "seen").unwrap().as_deref(), Some(key.as_bytes()));
    }
    assert_eq!(counter(projection.store(), "behaved"), 60);
    // One hash, one partition: all 60 messages in partition 0 of the
    // emit topic, each with its own key, three per key.
    assert_eq!(log.end_offset(OUT, 1).await.unwrap(), 0);
    let emitted = log.read(OUT, 0, 0, 100).await.unwrap();
    let mut per_key = std::collections::BTreeMap::<Key, usize>::new();
    for record in emitted {
        *per_key.entry(EventHeaders::parse_stored(&record.record.headers).unwrap().key).or_default() += 1;
    }
    assert_eq!(per_key, keys.map(|key| (Key::int(key), 3)).collect());
}
