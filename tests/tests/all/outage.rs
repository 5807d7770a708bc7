//! A log that goes away: the consumer backs off, reports it, and resumes
//! from what it committed, with nothing lost or applied twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::event::EventTypeTag;
use wakuwaku::operations::host::{Host, HostSettings, ModuleSource};
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, LogError, Record};
use wakuwaku_tests::faulty::{Call, FaultyLog};
use wakuwaku_tests::{json_record as record, probe_module};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_log_is_waited_out_and_nothing_is_lost_or_repeated() {
    const NOTE: EventTypeTag = EventTypeTag::new(4);
    const FAIL: EventTypeTag = EventTypeTag::new(5);
    let dir = tempfile::tempdir().unwrap();
    let log = EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
    log.create_topic("probes", 2).await.unwrap();
    for partition in 0..2u32 {
        let mut records: Vec<Record> = (0..600u64)
            .map(|i| record(NOTE, i % 40, json!({ "key": i % 40, "text": format!("n{i}"), "emit_to": "out" })))
            .collect();
        // Failures too, so retry and dead-letter records cross the outage.
        records.push(record(FAIL, 7, json!({ "key": 7, "class": "unrecoverable", "message": "no" })));
        log.append("probes", vec![(partition, records)]).await.unwrap();
    }
    log.create_topic("out", 2).await.unwrap();
    // The probe module declares it; a host refuses a module without its emit topics.
    log.create_topic("notes-out", 1).await.unwrap();
    // Unreachable for calls number 40..120 (setup calls aside).
    let calls = Arc::new(AtomicU64::new(0));
    let counted = calls.clone();
    let log = Arc::new(FaultyLog::new(log, move |call| {
        let call = match call {
            Call::Setup => return None,
            _ => counted.fetch_add(1, Ordering::SeqCst),
        };
        (40..120)
            .contains(&call)
            .then(|| LogError::Unavailable { address: "test".into(), reason: format!("call {call} dropped") })
    }));
    let mut settings = HostSettings::new(dir.path(), "probe", "probes", ModuleSource::Loaded(vec![probe_module()]));
    let backoff = (std::time::Duration::from_millis(1), std::time::Duration::from_millis(20));
    settings.consumer = ConsumerConfig { batch_size: 25, log_backoff: backoff, ..ConsumerConfig::default() };
    settings.until_caught_up = true;
    let host = Host::start_on(log.clone(), settings).await.unwrap();
    let (projection, progress, metrics) = (host.projection().clone(), host.progress().clone(), host.metrics().clone());
    let summary = host.finished().await.unwrap();

    assert!(calls.load(Ordering::SeqCst) > 120, "the outage did not happen");
    assert_eq!((summary.applied, summary.dead_lettered), (1200, 2));
    assert_eq!(projection.store().counters().unwrap(), [("notes".to_owned(), 1200)], "applied exactly once");
    let out: u64 = log.log.end_offset("out", 0).await.unwrap() + log.log.end_offset("out", 1).await.unwrap();
    assert_eq!(out, 1200, "every emitted message published exactly once");
    let dead = log.log.end_offset("dlq_probes", 0).await.unwrap() + log.log.end_offset("dlq_probes", 1).await.unwrap();
    assert_eq!(dead, 2);
    assert!(progress.log_available());
    assert!(
        metrics.encode().contains("waku_log_unavailable_total{projection=\"probe\"}"),
        "the outage was not counted"
    );
}
