//! A log that does not keep what it held ([`wakuwaku::storage::log::loss`]): a lost
//! tail is followed, counted and shown, never waited for, and stops a
//! partition that applied lost offsets until a reset; a topic created
//! again is recognised; a lost head is said before a replay; a lossy
//! topic the host appends to refuses the start unless accepted. All
//! without Iggy, over [`LosingLog`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use wakuwaku::engine::consumer::{ConsumerConfig, Summary};
use wakuwaku::engine::metrics::Metrics;
use wakuwaku::engine::projection::Projection;
use wakuwaku::event::EventTypeTag;
use wakuwaku::operations::admin::{self, Status};
use wakuwaku::operations::host::{Host, HostSettings, ModuleSource};
use wakuwaku::operations::reset::{self, Target};
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::loss::{self, Durability, LostHead};
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku_tests::losing::{LosingLog, copy_prefix};
use wakuwaku_tests::{json_record as record, probe_module};

const NOTE: EventTypeTag = EventTypeTag::new(4);
const TOPIC: &str = "probes";

/// `count` notes of keys `0..10`, numbered from `from`.
fn notes(from: u64, count: u64) -> Vec<Record> {
    (from..from + count).map(|i| record(NOTE, i % 10, json!({ "key": i % 10, "text": format!("n{i}") }))).collect()
}

/// A fresh embedded log in `dir` with the topics a probe projection on
/// `probes` needs, `ends[p]` notes in partition `p`.
async fn log_with(dir: &std::path::Path, name: &str, ends: &[u64]) -> EmbeddedLog {
    let log = EmbeddedLog::open(dir.join(name)).unwrap();
    let partitions = ends.len() as u32;
    for topic in [TOPIC, "retry_probes", "dlq_probes"] {
        log.create_topic(topic, partitions).await.unwrap();
    }
    log.create_topic("notes-out", 1).await.unwrap();
    log.create_topic("out", 1).await.unwrap();
    for (partition, &end) in (0u32..).zip(ends) {
        if end > 0 {
            log.append(TOPIC, vec![(partition, notes(0, end))]).await.unwrap();
        }
    }
    log
}

/// The probe projection's host settings: until caught up, small batches.
fn settings(dir: &std::path::Path) -> HostSettings {
    let mut settings = HostSettings::new(dir, "probe", TOPIC, ModuleSource::Loaded(vec![probe_module()]));
    settings.consumer = ConsumerConfig { batch_size: 10, ..ConsumerConfig::default() };
    settings.until_caught_up = true;
    settings
}

/// What a host run until caught up did, with its projection and metrics;
/// an error as its whole chain of causes. Fails the test after 30 s: a
/// host must never wait for offsets that are gone.
async fn run(
    log: &Arc<LosingLog>,
    dir: &std::path::Path,
) -> (Result<Summary, String>, Option<(Arc<Projection>, Arc<Metrics>)>) {
    let chain = |error: &dyn std::error::Error| {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    };
    let host = match Host::start_on(log.clone(), settings(dir)).await {
        Ok(host) => host,
        Err(error) => return (Err(chain(&error)), None),
    };
    let kept = (host.projection().clone(), host.metrics().clone());
    let finished = tokio::time::timeout(Duration::from_secs(30), host.finished()).await;
    let finished = finished.expect("the host waited 30 s: it must follow the log's new end, not wait");
    (finished.map_err(|error| chain(&error)), Some(kept))
}

async fn status(log: &LosingLog, projection: &Projection) -> Status {
    admin::status(log, "probe", TOPIC, projection.store(), None, BTreeMap::new()).await.unwrap()
}

fn notes_applied(projection: &Projection) -> i128 {
    projection.store().counters().unwrap().into_iter().find(|(name, _)| name == "notes").map_or(0, |(_, n)| n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_lost_ahead_of_the_position_is_followed_counted_and_shown() {
    let dir = tempfile::tempdir().unwrap();
    let first = log_with(dir.path(), "first.redb", &[100, 100]).await;
    // The server comes back with 60 of partition 0's 100 messages, once
    // the host read 20 of them: the end it read at start-up is gone.
    let kept = log_with(dir.path(), "kept.redb", &[0, 0]).await;
    copy_prefix(&first, &kept, TOPIC, &[60, 100]).await;
    let log = Arc::new(LosingLog::new(first));
    log.lose_when_read_at(TOPIC, 0, 20, kept);

    let (summary, kept) = run(&log, dir.path()).await;
    let (projection, metrics) = kept.unwrap();
    let summary = summary.unwrap();
    assert!(log.lost(), "the log did not lose its tail");
    assert_eq!(summary.applied, 160, "what the log still holds is applied, once");
    assert_eq!(notes_applied(&projection), 160);
    let text = metrics.encode();
    assert!(text.contains(r#"waku_log_truncated_total{topic="probes",partition="0"} 1"#), "{text}");
    assert!(!text.contains(r#"waku_log_truncated_total{topic="probes",partition="1"}"#), "{text}");
    let status = status(&log, &projection).await;
    let lost = &status.partitions[0];
    assert_eq!((lost.position, lost.end, lost.stopped, lost.caught_up), (60, 60, false, true));
    let said = lost.truncated.as_deref().unwrap();
    assert!(said.contains("`probes` partition 0 lost offsets 60..100 (40 messages)"), "{said}");
    assert_eq!(status.partitions[1].truncated, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_that_applied_lost_offsets_stops_until_a_reset() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(LosingLog::new(log_with(dir.path(), "first.redb", &[100]).await));
    let (summary, _) = run(&log, dir.path()).await;
    assert_eq!(summary.unwrap().applied, 100);
    // The server lost offsets 60..100 after the host applied them, and 20
    // new messages were appended at 60..80.
    let kept = log_with(dir.path(), "kept.redb", &[0]).await;
    copy_prefix(&log.current(), &kept, TOPIC, &[60]).await;
    kept.append(TOPIC, vec![(0, notes(1000, 20))]).await.unwrap();
    log.replace(kept);

    let (stopped, kept) = run(&log, dir.path()).await;
    let (projection, metrics) = kept.unwrap();
    let error = stopped.unwrap_err();
    assert!(error.contains("`probes` partition 0 lost offsets 80..100 (20 messages)"), "{error}");
    assert!(error.contains("applied events from offsets 80..100"), "{error}");
    assert!(error.contains("waku reset"), "{error}");
    assert!(metrics.encode().contains(r#"waku_log_truncated_total{topic="probes",partition="0"} 1"#));
    let shown = status(&log, &projection).await;
    assert!(shown.partitions[0].stopped && !shown.partitions[0].caught_up);
    assert_eq!(notes_applied(&projection), 100, "nothing of the new messages was applied or skipped");
    drop((projection, metrics));

    // More appends take the end past the position: the partition still
    // stops, rather than skip the messages at 80..100.
    log.current().append(TOPIC, vec![(0, notes(2000, 40))]).await.unwrap();
    let (again, kept) = run(&log, dir.path()).await;
    let again = again.unwrap_err();
    assert!(again.contains("lost offsets 80..100"), "the truncation is kept: {again}");

    // The operator decides: from offset 60, where the log holds other
    // messages now.
    let projection = kept.unwrap().0;
    let store = projection.store();
    let plan = reset::plan(&*log, store, TOPIC, Target::Offset(60), None).await.unwrap();
    reset::apply(&*log, store, "probe", &plan, None).await.unwrap();
    drop(projection);
    let (after, kept) = run(&log, dir.path()).await;
    assert_eq!(after.unwrap().applied, 60, "offsets 60..120 as the log holds them now");
    assert_eq!(notes_applied(&kept.unwrap().0), 160);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_created_again_is_recognised_by_its_identity() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(LosingLog::new(log_with(dir.path(), "first.redb", &[50]).await));
    log.set_identity(TOPIC, "topic 1 created at 100");
    let (summary, _) = run(&log, dir.path()).await;
    assert_eq!(summary.unwrap().applied, 50);
    // Deleted and created again with more messages than the host read: the
    // end offsets alone would not tell.
    log.replace(log_with(dir.path(), "again.redb", &[70]).await);
    log.set_identity(TOPIC, "topic 7 created at 900");
    let (stopped, kept) = run(&log, dir.path()).await;
    let error = stopped.unwrap_err();
    assert!(error.contains("topic `probes` was deleted and created again"), "{error}");
    assert!(error.contains("partition 0 lost offsets 0..50"), "{error}");
    let (projection, metrics) = kept.unwrap();
    assert!(metrics.encode().contains(r#"waku_log_truncated_total{topic="probes",partition="0"} 1"#));
    assert_eq!(notes_applied(&projection), 50, "nothing of the new topic applied or skipped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_from_the_earliest_offset_says_what_retention_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(LosingLog::new(log_with(dir.path(), "first.redb", &[100, 40]).await));
    let (summary, kept) = run(&log, dir.path()).await;
    assert_eq!(summary.unwrap().applied, 140);
    let projection = kept.unwrap().0;
    log.set_first(TOPIC, 0, 30);

    let shown = status(&log, &projection).await;
    assert_eq!(shown.partitions.iter().map(|p| p.first).collect::<Vec<_>>(), [30, 0]);
    let plan = reset::plan(&*log, projection.store(), TOPIC, Target::Earliest, None).await.unwrap();
    assert_eq!(plan.lost_history, [LostHead { partition: 0, first: 30, end: 100 }]);
    let refused = plan.check_history(false).unwrap_err().to_string();
    assert!(refused.contains("partition 0: offsets 0..30 gone (30 messages)"), "{refused}");
    assert!(refused.contains("--accept-lost-history"), "{refused}");
    plan.check_history(true).unwrap();
    // A rebuild (from offset 0) asks the same.
    let rebuild = loss::refuse_lost_history(&*log, TOPIC, false).await.unwrap_err().to_string();
    assert!(rebuild.contains("offsets 0..30 gone (30 messages)"), "{rebuild}");
    assert_eq!(loss::refuse_lost_history(&*log, TOPIC, true).await.unwrap().len(), 1);
    // Nothing lost: nothing to accept.
    log.set_first(TOPIC, 0, 0);
    let whole = reset::plan(&*log, projection.store(), TOPIC, Target::Earliest, None).await.unwrap();
    whole.check_history(false).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lossy_topic_the_host_appends_to_refuses_the_start_unless_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(LosingLog::new(log_with(dir.path(), "first.redb", &[30]).await));
    let lossy = || Durability::Lossy { setting: "enforce_fsync = false, messages_required_to_save = 1024".into() };
    for topic in ["retry_probes", "dlq_probes", "notes-out"] {
        log.set_durability(topic, lossy());
        let (refused, _) = run(&log, dir.path()).await;
        let error = refused.unwrap_err();
        assert!(error.contains(&format!("topic `{topic}`")), "{error}");
        assert!(error.contains("enforce_fsync = false, messages_required_to_save = 1024"), "{error}");
        assert!(error.contains("--lossy-topics"), "{error}");
        log.set_durability(topic, Durability::Durable);
    }
    // The consumed topic only warns; an unknown durability refuses as a
    // lossy one does.
    log.set_durability(TOPIC, lossy());
    log.set_durability("dlq_probes", Durability::Unknown { reason: "the server does not say".into() });
    let (refused, _) = run(&log, dir.path()).await;
    assert!(refused.unwrap_err().contains("durability unknown: the server does not say"));
    log.accept_lossy(true);
    log.set_durability("retry_probes", lossy());
    let (accepted, _) = run(&log, dir.path()).await;
    assert_eq!(accepted.unwrap().applied, 30, "accepted with --lossy-topics");
}
