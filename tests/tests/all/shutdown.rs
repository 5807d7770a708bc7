//! A host (`Consumer::follow` underneath) stops promptly: when its
//! shutdown future resolves (even with every partition idle), and when one
//! partition fails (the others stop too, so the error is returned at once,
//! not at the next signal). The signal path end to end is in
//! host/tests/all/cli.rs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig, ConsumerError};
use wakuwaku::engine::projection::Projection;
use wakuwaku::event::EventTypeTag;
use wakuwaku::operations::host::{Host, HostSettings};
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, LogError, Record};
use wakuwaku::storage::state::StateStore;
use wakuwaku_tests::faulty::{Call, FaultyLog};
use wakuwaku_tests::{catch_up, host_settings, json_record, probe_module};

const NOTE: EventTypeTag = EventTypeTag::new(4);

fn note(key: u64) -> Record {
    json_record(NOTE, key, json!({ "key": key, "text": format!("note {key}"), "emit_to": null }))
}

fn projection(dir: &std::path::Path) -> Arc<Projection> {
    let module = probe_module();
    let store = StateStore::open(&dir.join("probe.redb")).unwrap();
    Arc::new(Projection::new("probe", "probes", vec![module], store).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_returns_promptly_when_shutdown_resolves_on_idle_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("probes", 3).await.unwrap();
    log.append("probes", vec![(0, vec![note(1), note(2)]), (2, vec![note(3)])]).await.unwrap();
    let config = ConsumerConfig { idle_poll: Duration::from_secs(30), ..ConsumerConfig::default() };
    let settings = host_settings(dir.path(), "probe", "probes", vec![probe_module()], config);
    let host = Host::start_on(log, HostSettings { until_caught_up: false, ..settings }).await.unwrap();
    let projection = host.projection().clone();

    // The shutdown comes once everything is committed: the partitions then
    // idle with a poll interval far longer than the test may take.
    let shutdown_at = std::cell::Cell::new(None);
    let shutdown = async {
        let store = projection.store();
        let deadline = Instant::now() + Duration::from_secs(60);
        while store.position("probes", 0).unwrap() != Some(2) || store.position("probes", 2).unwrap() != Some(1) {
            assert!(Instant::now() < deadline, "the host never consumed the three notes");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shutdown_at.set(Some(Instant::now()));
    };
    let summary = tokio::time::timeout(Duration::from_secs(90), host.stop_when(shutdown))
        .await
        .expect("follow did not return after the shutdown")
        .unwrap();
    let took = shutdown_at.get().expect("stopped by the shutdown").elapsed();
    assert!(took < Duration::from_secs(5), "follow took {took:?} after the shutdown");
    assert_eq!(summary.applied, 3);
    assert_eq!(projection.store().counters().unwrap(), [("notes".to_owned(), 3)]);
    assert_eq!(projection.store().position("probes", 0).unwrap(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_partition_stops_follow_without_waiting_for_a_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    // Reading partition 1 fails.
    let log = FaultyLog::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap(), |call| match call {
        Call::Read { topic, partition: 1, from } => Some(LogError::Corrupt {
            topic: topic.to_owned(),
            partition: 1,
            offset: from,
            reason: "broken on purpose".into(),
        }),
        _ => None,
    });
    log.create_topic("probes", 2).await.unwrap();
    log.append("probes", vec![(0, vec![note(1)]), (1, vec![note(2)])]).await.unwrap();
    // A bare consumer: the assertion matches the consumer's own error.
    let consumer = Consumer::new(Arc::new(log), projection(dir.path()), ConsumerConfig::default());

    let never = std::future::pending::<()>();
    let result = tokio::time::timeout(Duration::from_secs(10), consumer.follow(never))
        .await
        .expect("follow kept the healthy partition running after the other one failed");
    match result {
        Err(ConsumerError::Log(LogError::Corrupt { partition: 1, reason, .. })) => {
            assert_eq!(reason, "broken on purpose")
        }
        other => panic!("expected partition 1's error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catching_up_stops_on_shutdown_and_a_second_run_finishes_the_rest() {
    use wakuwaku::authoring::demo::{self, WorkloadSpec};
    use wakuwaku_tests::{bank_log, bank_module};

    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let spec = WorkloadSpec { events: 20_000, accounts: 200, seed: 4 };
    let (log, oracle) = bank_log(dir.path(), module.clone(), spec, 2).await;
    let config = ConsumerConfig { batch_size: 50, ..ConsumerConfig::default() };
    let settings = host_settings(dir.path(), "bank", "accounts", vec![module.clone()], config);

    let host = Host::start_on(log.clone(), settings.clone()).await.unwrap();
    let projection = host.projection().clone();
    let first = host.stop_when(tokio::time::sleep(Duration::from_millis(300))).await.unwrap();
    assert!(first.consumed < spec.events as u64, "the shutdown did not stop catching up");
    let committed: u64 = (0..2).map(|p| projection.store().position("accounts", p).unwrap().unwrap_or(0)).sum();
    assert_eq!(committed, first.consumed, "what was consumed is exactly what was committed");
    drop(projection);

    let (second, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!(first.consumed + second.consumed, spec.events as u64);
    let check = demo::check_projection(&oracle, &*module, projection.store()).unwrap();
    assert!(check.matches(), "{}", check.report(5));
}
