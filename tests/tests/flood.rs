//! A module that floods the host (it loops `emit()` or `set()`, ignoring
//! every refusal) holds the host to the payload limits: the process's peak
//! resident memory stays bounded, whether the flood runs into the CPU
//! budget or ends in time and succeeds, on every key of a batch. Before
//! the per-call and per-batch limits, such a module took the host to
//! 1.9 GB in 3.7 s. And what the batch budget turns away is not lost: the
//! calls past it are retried in later batches.
//!
//! A test binary of its own, its tests one at a time, so that no other
//! test's memory blurs the figures.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig, Summary};
use wakuwaku::engine::projection::Projection;
use wakuwaku::engine::routing::RetryPolicy;
use wakuwaku::event::EventTypeTag;
use wakuwaku::key::Key;
use wakuwaku::sandbox::handler::PayloadLimits;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku::storage::state::StateStore;
use wakuwaku_tests::{json_record, probe_module};

const RAW: EventTypeTag = EventTypeTag::new(8);

/// One test at a time: the figures are the process's.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A probe `Raw` event for key `key` (see the probe's docs), ignoring
/// refusals.
fn flood(key: u64, op: &str, count: u64, len: u64) -> Record {
    let body = json!({
        "key": key, "op": op, "name": "e{i}", "len": len, "delta": 1, "topic": "out",
        "emit_key": Key::int(key).as_bytes(), "count": count, "ignore": true,
    });
    json_record(RAW, key, body)
}

/// A field of `/proc/self/status`, in MiB.
fn status_mib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|line| line.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
    line.split_whitespace().nth(1).and_then(|kib| kib.parse::<u64>().ok()).expect("a number of KiB") / 1024
}

/// Consumes `records` (topic `floods`, one partition) with the probe,
/// and says how far the process's peak resident memory rose above where it
/// was.
async fn consume(
    dir: &std::path::Path,
    records: Vec<Record>,
    config: ConsumerConfig,
) -> (Summary, u64, Arc<EmbeddedLog>) {
    let log = Arc::new(EmbeddedLog::open(dir.join("log.redb")).unwrap());
    log.create_topic("floods", 1).await.unwrap();
    log.create_topic("out", 1).await.unwrap();
    log.append("floods", vec![(0, records)]).await.unwrap();
    let store = StateStore::open(&dir.join("state.redb")).unwrap();
    let projection = Arc::new(Projection::new("floods", "floods", vec![probe_module()], store).unwrap());
    // Reset the peak to the current resident set.
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting the peak RSS");
    let before = status_mib("VmRSS:");
    // A bare consumer: a host's own set-up (sandbox, state) would fall inside the figure.
    let summary = Consumer::new(log.clone(), projection, config).catch_up().await.unwrap();
    let peak = status_mib("VmHWM:");
    eprintln!("peak RSS {peak} MiB, {} MiB above the {before} MiB before", peak.saturating_sub(before));
    (summary, peak.saturating_sub(before), log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_cut_short_by_the_cpu_budget_keep_the_host_bounded() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // Each call loops a billion times: only the CPU budget (1 s) ends it,
    // with a trap, and nothing of it is kept.
    let records = (0..4).map(|key| flood(key, ["emit", "set"][key as usize % 2], 1_000_000_000, 64 << 10)).collect();
    let config = ConsumerConfig {
        workers: 2,
        retry: RetryPolicy { delays: vec![Duration::ZERO], max_attempts: 1, ..RetryPolicy::default() },
        ..ConsumerConfig::default()
    };
    let (summary, grew, log) = consume(dir.path(), records, config).await;
    assert_eq!(summary.dead_lettered, 4, "every flood traps on its CPU budget: {summary:?}");
    assert_eq!(log.end_offset("out", 0).await.unwrap(), 0, "nothing of a trapped call is emitted");
    assert!(grew < 128, "the floods took the host {grew} MiB above where it was");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_that_succeed_on_every_key_of_a_batch_keep_the_host_bounded() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // 32 keys each try 100 emits or writes of 256 KiB (800 MiB in all) and
    // succeed with what was accepted: 16 each (4 MiB per call).
    let (keys, len) = (32u64, (256 << 10) - 64);
    let records = (0..keys).map(|key| flood(key, ["emit", "set"][key as usize % 2], 100, len)).collect();
    let config = ConsumerConfig {
        workers: 2,
        retry: RetryPolicy { delays: vec![Duration::ZERO], max_attempts: 1_000, ..RetryPolicy::default() },
        ..ConsumerConfig::default()
    };
    let (summary, grew, log) = consume(dir.path(), records, config).await;
    assert_eq!((summary.applied, summary.dead_lettered), (keys, 0), "{summary:?}");
    assert!(summary.retry_in > 0, "the batch budget held every call: {summary:?}");
    assert_eq!(log.end_offset("out", 0).await.unwrap(), keys / 2 * 16, "16 emits of each emitting key, once");
    // Measured 300 to 400 MiB on a 2-core machine (the allocator keeps
    // freed pages for a while, so it varies run to run); the floods try to
    // hand the host 800 MiB, and before the limits took it to 1.9 GB.
    assert!(grew < 512, "the floods took the host {grew} MiB above where it was");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_past_the_batch_budget_are_retried_in_later_batches_and_nothing_is_lost() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // 40 keys each emit 100 messages of 1 KiB (about 150 KiB held with the
    // bookkeeping) into a batch budget of 1 MiB: a handful fit per batch.
    let keys = 40u64;
    let records = (0..keys).map(|key| flood(key, "emit", 100, 1024)).collect();
    let payload = PayloadLimits {
        max_state_bytes_per_call: 128 << 10,
        max_emit_bytes_per_call: 128 << 10,
        max_counter_changes_per_call: 100,
        max_batch_held: 1 << 20,
        ..PayloadLimits::default()
    };
    payload.check().unwrap();
    let config = ConsumerConfig {
        payload,
        retry: RetryPolicy { delays: vec![Duration::ZERO], max_attempts: 1_000, ..RetryPolicy::default() },
        ..ConsumerConfig::default()
    };
    let (summary, _, log) = consume(dir.path(), records, config).await;
    assert_eq!((summary.applied, summary.dead_lettered), (keys, 0), "{summary:?}");
    assert!(summary.retry_in > 0, "the budget held every call: {summary:?}");
    assert_eq!(log.end_offset("out", 0).await.unwrap(), keys * 100, "every emit of every key, once");
}
