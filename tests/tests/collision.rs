//! Keys are identities, not hashes. This test binary forces every key's
//! hash to one number (`key::test_support::force_key_hash`, for the whole
//! process, which is why it is a binary of its own), so every key collides
//! with every other, then checks that nothing of one key reaches another:
//! the bank's read model equals its oracle (each account its own state and
//! its own folded deposits), every key's calls keep the spec's order, and a
//! key waiting in retry diverts only its own later events.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::engine::routing::RetryPolicy;
use wakuwaku::event::EventTypeTag;
use wakuwaku::key::Key;
use wakuwaku::key::test_support::force_key_hash;
use wakuwaku::operations::host::HostSettings;
use wakuwaku::storage::log::EventLog;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku_tests::{
    Recorder, bank_log, bank_module, catch_up, check_call_order, host_settings, json_record, probe_module,
    read_partition,
};

const COLLIDING: u64 = 7;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_whose_hashes_collide_share_no_state_run_or_retry() {
    force_key_hash(|_| COLLIDING);
    assert_eq!(Key::int(1u64).key_hash(), Key::parse_text(r#""ann""#).unwrap().key_hash());
    assert_ne!(Key::int(1u64), Key::int(2u64));

    // The bank over colliding keys: every account's state and folds apart.
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let spec = WorkloadSpec { events: 3_000, accounts: 40, seed: 3 };
    let (log, oracle) = bank_log(dir.path(), module.clone(), spec, 2).await;
    let recorder = Arc::new(Recorder::default());
    let config = ConsumerConfig { batch_size: 256, workers: 2, ..ConsumerConfig::default() };
    let settings = HostSettings {
        observer: Some(recorder.clone()),
        ..host_settings(dir.path(), "bank", "accounts", vec![module.clone()], config)
    };
    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!(summary.applied, spec.events as u64);
    let check = demo::check_projection(&oracle, &*module, projection.store()).unwrap();
    assert!(check.matches(), "{}", check.report(10));
    assert_eq!(projection.store().keys().unwrap().len(), oracle.accounts.len());
    // One hash means one partition: every account is in partition 0.
    assert_eq!(log.end_offset("accounts", 1).await.unwrap(), 0);
    let calls = recorder.calls();
    let records = read_partition(&log, "accounts", 0).await;
    check_call_order(0, &records, &calls).unwrap();
    // A folded run never spans two accounts: each call is about one key.
    for call in &calls {
        let keys: std::collections::HashSet<&Key> =
            call.offsets.iter().map(|offset| &records.iter().find(|(o, ..)| o == offset).unwrap().1).collect();
        assert_eq!(keys.into_iter().collect::<Vec<_>>(), [&call.key]);
    }

    // A key in retry diverts only its own events, not a colliding key's.
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("probes", 1).await.unwrap();
    let (note, fail) = (EventTypeTag::new(4), EventTypeTag::new(5));
    let records = vec![
        json_record(fail, 1, json!({ "key": 1, "class": "retryable", "message": "later" })),
        json_record(note, 1, json!({ "key": 1, "text": "one", "emit_to": null })),
        json_record(note, 2, json!({ "key": 2, "text": "two", "emit_to": null })),
    ];
    log.append("probes", vec![(0, records)]).await.unwrap();
    let config = ConsumerConfig {
        batch_size: 1, // key 1 is in retry before its note and key 2's are polled
        retry: RetryPolicy { delays: vec![Duration::from_secs(3600)], ..RetryPolicy::default() },
        ..ConsumerConfig::default()
    };
    let settings = host_settings(dir.path(), "probe", "probes", vec![probe_module()], config);
    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!((summary.applied, summary.retry_in), (1, 2), "{summary:?}");
    let store = projection.store();
    assert_eq!(store.get(&Key::int(2u64), "last").unwrap(), Some(br#""two""#.to_vec()));
    assert_eq!(store.get(&Key::int(1u64), "last").unwrap(), None, "key 1's note waits behind its retry");
}
