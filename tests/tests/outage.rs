//! A log that goes away: the consumer backs off, reports it, and resumes
//! from what it committed, with nothing lost or applied twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;
use wakuwaku::consumer::{Consumer, ConsumerConfig};
use wakuwaku::event::{Algebra, EventAtomicOrdering, EventHeaders, EventTypeTag};
use wakuwaku::log::embedded::EmbeddedLog;
use wakuwaku::log::{EventLog, LogError, Record, StoredRecord};
use wakuwaku::metrics::Metrics;
use wakuwaku::projection::{Projection, load_module_file};
use wakuwaku::runtime::{Sandbox, SandboxLimits};
use wakuwaku::state::StateStore;
use wakuwaku_tests::probe_wasm;

/// The embedded log, unreachable for calls number `from..to`.
struct Outage {
    log: EmbeddedLog,
    calls: AtomicU64,
    from: u64,
    to: u64,
}

impl Outage {
    fn reachable(&self) -> Result<(), LogError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if (self.from..self.to).contains(&call) {
            return Err(LogError::Unavailable { address: "test".into(), reason: format!("call {call} dropped") });
        }
        Ok(())
    }
}

impl EventLog for Outage {
    async fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), LogError> {
        self.log.create_topic(topic, partitions).await
    }
    async fn partitions(&self, topic: &str) -> Result<u32, LogError> {
        self.log.partitions(topic).await
    }
    async fn append(&self, topic: &str, batches: Vec<(u32, Vec<Record>)>) -> Result<(), LogError> {
        self.reachable()?;
        self.log.append(topic, batches).await
    }
    async fn append_as(
        &self,
        topic: &str,
        batches: Vec<(u32, Vec<Record>)>,
        producer: &str,
        sequence: u64,
    ) -> Result<bool, LogError> {
        self.reachable()?;
        self.log.append_as(topic, batches, producer, sequence).await
    }
    async fn producer_sequence(&self, topic: &str, partition: u32, producer: &str) -> Result<Option<u64>, LogError> {
        self.reachable()?;
        self.log.producer_sequence(topic, partition, producer).await
    }
    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<StoredRecord>, LogError> {
        self.reachable()?;
        self.log.read(topic, partition, from, max).await
    }
    async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64, LogError> {
        self.reachable()?;
        self.log.end_offset(topic, partition).await
    }
    async fn store_consumer_offset(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
        next: u64,
    ) -> Result<(), LogError> {
        self.reachable()?;
        self.log.store_consumer_offset(consumer, topic, partition, next).await
    }
    async fn consumer_offset(&self, consumer: &str, topic: &str, partition: u32) -> Result<Option<u64>, LogError> {
        self.log.consumer_offset(consumer, topic, partition).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_log_is_waited_out_and_nothing_is_lost_or_repeated() {
    const NOTE: EventTypeTag = EventTypeTag::new(4);
    const FAIL: EventTypeTag = EventTypeTag::new(5);
    let dir = tempfile::tempdir().unwrap();
    let log = EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
    log.create_topic("probes", 2).await.unwrap();
    let record = |tag, key: u64, body: serde_json::Value| {
        let headers = EventHeaders {
            tag,
            key_hash: key,
            ordering: EventAtomicOrdering::Relaxed,
            algebra: Algebra::NonAssociative,
        };
        Record { headers: headers.to_headers(), body: serde_json::to_vec(&body).unwrap() }
    };
    for partition in 0..2u32 {
        let mut records: Vec<Record> = (0..600u64)
            .map(|i| record(NOTE, i % 40, json!({ "key": i % 40, "text": format!("n{i}"), "emit_to": "out" })))
            .collect();
        // Failures too, so retry and dead-letter records cross the outage.
        records.push(record(FAIL, 7, json!({ "key": 7, "class": "unrecoverable", "message": "no" })));
        log.append("probes", vec![(partition, records)]).await.unwrap();
    }
    log.create_topic("out", 2).await.unwrap();
    let log = Arc::new(Outage { log, calls: AtomicU64::new(0), from: 40, to: 120 });
    let module = load_module_file(&Sandbox::new(SandboxLimits::default()).unwrap(), &probe_wasm()).unwrap();
    let store = StateStore::open(&dir.path().join("probe.redb")).unwrap();
    let projection = Arc::new(Projection::new("probe", "probes", vec![module], store).unwrap());
    let metrics = Arc::new(Metrics::default());
    let backoff = (std::time::Duration::from_millis(1), std::time::Duration::from_millis(20));
    let config = ConsumerConfig { batch_size: 25, log_backoff: backoff, ..ConsumerConfig::default() };
    let consumer = Consumer::new(log.clone(), projection.clone(), config).with_metrics(metrics.clone());
    let summary = consumer.catch_up().await.unwrap();

    assert!(log.calls.load(Ordering::SeqCst) > 120, "the outage did not happen");
    assert_eq!((summary.applied, summary.dead_lettered), (1200, 2));
    assert_eq!(projection.store().counters().unwrap(), [("notes".to_owned(), 1200)], "applied exactly once");
    let out: u64 = log.log.end_offset("out", 0).await.unwrap() + log.log.end_offset("out", 1).await.unwrap();
    assert_eq!(out, 1200, "every emitted message published exactly once");
    let dead = log.log.end_offset("dlq_probes", 0).await.unwrap() + log.log.end_offset("dlq_probes", 1).await.unwrap();
    assert_eq!(dead, 2);
    assert!(consumer.progress().log_available());
    assert!(
        metrics.encode().contains("waku_log_unavailable_total{projection=\"probe\"}"),
        "the outage was not counted"
    );
}
