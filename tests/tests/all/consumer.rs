//! The consumer's accounting: unknown tags are skipped and counted,
//! unreadable headers are dead-lettered and counted, and a failing handler
//! sends its event to retry while the rest of the batch commits; retry and
//! dead-letter topics must have the partition count of their main topic.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::engine::outbox;
use wakuwaku::engine::routing::{FailureClass, Routed, RoutedTopics};
use wakuwaku::event::{EventHeaders, EventTypeTag, Header, partition_for};
use wakuwaku::operations::host::{Host, HostSettings, RunningHost};
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku::storage::state::{BatchCommit, OutboxEntry, StateStore};
use wakuwaku::storage::stats::Stat;
use wakuwaku_tests::{catch_up, host_settings, json_record as record, probe_module};

const NOTE: EventTypeTag = EventTypeTag::new(4);
const FAIL: EventTypeTag = EventTypeTag::new(5);

/// A log holding `records` in topic `probes`, and the settings of a host
/// of the probe over it.
async fn setup(records: Vec<Record>) -> (tempfile::TempDir, Arc<EmbeddedLog>, HostSettings) {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("probes", 1).await.unwrap();
    log.append("probes", vec![(0, records)]).await.unwrap();
    let settings = host_settings(dir.path(), "probe", "probes", vec![probe_module()], ConsumerConfig::default());
    (dir, log, settings)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tags_are_skipped_and_unreadable_headers_counted() {
    let mut garbled = record(NOTE, 1, json!({}));
    garbled.headers[2].value.truncate(1); // the key ends inside its integer
    let missing = Record { headers: vec![Header { name: "trace".into(), value: vec![1] }], body: vec![] };
    let records = vec![
        record(NOTE, 1, json!({ "key": 1, "text": "a", "emit_to": null })),
        record(EventTypeTag::new(99), 1, json!({ "anything": true })),
        garbled,
        record(NOTE, 2, json!({ "key": 2, "text": "b", "emit_to": null })),
        missing,
        record(EventTypeTag::new(99), 3, json!({})),
    ];
    let (_dir, log, settings) = setup(records).await;
    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!((summary.consumed, summary.applied, summary.skipped, summary.malformed), (6, 2, 2, 2));
    let stats = projection.store().stats().unwrap();
    assert_eq!(stats[Stat::Applied], 2);
    assert_eq!(stats[Stat::Skipped], 2);
    assert_eq!(stats[Stat::Malformed], 2);
    assert_eq!(stats[Stat::DeadLettered], 2);
    assert_eq!(projection.store().position("probes", 0).unwrap(), Some(6));
    // Both unreadable messages are in the dead-letter topic with the reason.
    let dead = log.read("dlq_probes", 0, 0, 10).await.unwrap();
    let reasons: Vec<(u64, String)> = dead
        .iter()
        .map(|d| {
            let routed = Routed::parse(&d.record.headers).unwrap();
            let failure = routed.failure.unwrap();
            assert_eq!(failure.class, FailureClass::Malformed);
            (routed.origin_offset, failure.message)
        })
        .collect();
    assert_eq!(
        reasons,
        [
            (2, "header `waku-key` is not a canonical key: the key's bytes end inside a value (at byte 1)".to_owned()),
            (4, "missing header `waku-version`".to_owned())
        ]
    );
}

/// A record over the embedded log's limit, already in the file (written by
/// an older version or by hand), is dead-lettered with its size and the
/// limit, never loaded into a batch, and the partition goes on past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_record_over_the_log_limit_is_dead_lettered_and_the_partition_goes_on() {
    use wakuwaku::storage::log::embedded::MAX_RECORD_BYTES;
    let (dir, log, settings) = setup(vec![record(NOTE, 1, json!({ "key": 1, "text": "a", "emit_to": null }))]).await;
    drop(log);
    // One block holding one record, in the log's block format: format 1,
    // the record count, the end of each record, the records (postcard).
    let oversize = Record { body: vec![b' '; MAX_RECORD_BYTES], ..record(NOTE, 3, json!({})) };
    let encoded = postcard::to_allocvec(&oversize).unwrap();
    let mut block = vec![1];
    block.extend_from_slice(&1u32.to_le_bytes());
    block.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
    block.extend_from_slice(&encoded);
    {
        let db = redb::Database::create(dir.path().join("log.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        let table: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log/probes/0");
        txn.open_table(table).unwrap().insert(1, block.as_slice()).unwrap();
        txn.commit().unwrap();
    }
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.append("probes", vec![(0, vec![record(NOTE, 2, json!({ "key": 2, "text": "b", "emit_to": null }))])])
        .await
        .unwrap();

    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!((summary.consumed, summary.applied, summary.malformed, summary.dead_lettered), (3, 2, 1, 1));
    assert_eq!(projection.store().position("probes", 0).unwrap(), Some(3));
    let dead = log.read("dlq_probes", 0, 0, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    let routed = Routed::parse(&dead[0].record.headers).unwrap();
    let failure = routed.failure.unwrap();
    assert_eq!((routed.origin_offset, failure.class), (1, FailureClass::Malformed));
    let expected = format!(
        "the record has {} bytes as stored, over the embedded log's limit of {MAX_RECORD_BYTES} bytes per record",
        encoded.len()
    );
    assert!(failure.message.starts_with(&expected), "{}", failure.message);
    assert!(dead[0].record.body.is_empty(), "the letter does not carry the record");
    // The record itself stays in the log, where the letter says.
    assert_eq!(log.end_offset("probes", 0).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_handler_sends_its_event_to_retry_and_the_batch_commits() {
    let records = vec![
        record(NOTE, 1, json!({ "key": 1, "text": "first", "emit_to": null })),
        record(NOTE, 2, json!({ "key": 2, "text": "other key", "emit_to": null })),
        record(FAIL, 1, json!({ "key": 1, "class": "retryable", "message": "the ledger is busy" })),
    ];
    let (_dir, log, settings) = setup(records).await;
    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!((summary.consumed, summary.applied, summary.retry_in, summary.dead_lettered), (3, 2, 1, 0));

    // The batch committed: position, both notes, the counts.
    let store = projection.store();
    assert_eq!(store.position("probes", 0).unwrap(), Some(3));
    assert_eq!(store.get(&wakuwaku::key::Key::int(2u64), "last").unwrap(), Some(b"\"other key\"".to_vec()));
    assert_eq!(
        store.get(&wakuwaku::key::Key::int(1u64), "before-failure").unwrap(),
        None,
        "the failed call left a write"
    );
    let stats = store.stats().unwrap();
    assert_eq!((stats[Stat::Applied], stats[Stat::RetryIn]), (2, 1));

    // The failed event waits in the retry topic (its first delay is 1 s),
    // saying where it came from and why.
    let waiting = log.read("retry_probes", 0, 0, 10).await.unwrap();
    assert_eq!(waiting.len(), 1);
    let routed = Routed::parse(&waiting[0].record.headers).unwrap();
    assert_eq!((routed.projection.as_str(), routed.origin_partition, routed.origin_offset), ("probe", 0, 2));
    assert_eq!((routed.events, routed.attempts), (1, 1));
    let failure = routed.failure.unwrap();
    assert_eq!(failure.class, FailureClass::Retryable);
    assert_eq!(failure.message, "retryable handler error: the ledger is busy");
    assert_eq!(failure.module, "probe");
    assert_eq!(failure.version, projection.modules()[0].version());
    assert_eq!(EventHeaders::parse_stored(&waiting[0].record.headers).unwrap().key, wakuwaku::key::Key::int(1u64));
    assert_eq!(log.end_offset("dlq_probes", 0).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_appended_just_before_a_crash_is_not_published_again() {
    let (_dir, log, settings) = setup(Vec::new()).await;
    log.create_topic("notes-out", 2).await.unwrap();
    let store = settings.open_state().unwrap();
    // Three emitted messages, committed with a batch…
    let entry = |i: u64| OutboxEntry {
        topic: "notes-out".into(),
        partition_key: i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        partition: None,
        record: record(NOTE, i, json!({ "key": i, "text": "out", "emit_to": null })),
        origin: None,
    };
    let commit = BatchCommit { outbox: vec![entry(1), entry(2), entry(3)], ..BatchCommit::default() };
    store.commit(commit).unwrap();
    // …of which the first two reached the log before the host crashed,
    // before it could clear its outbox.
    let pending = store.outbox().unwrap();
    let appended =
        pending[..2].iter().map(|(_, e)| (partition_for(e.partition_key, 2), vec![e.record.clone()])).collect();
    let producer = outbox::producer(&store, "probe").unwrap();
    assert!(log.append_as("notes-out", appended, &producer, pending[1].0).await.unwrap());
    drop(store);

    // Starting again publishes the third, and only the third.
    let (_, projection) = catch_up(&log, settings).await.unwrap();
    let published = log.end_offset("notes-out", 0).await.unwrap() + log.end_offset("notes-out", 1).await.unwrap();
    assert_eq!(published, 3);
    assert!(projection.store().outbox().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_of_one_projection_never_hide_each_others_emits() {
    // One log, two partitions; each "host" runs the same projection over
    // one partition with its own state, and both emit to one topic.
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("probes", 2).await.unwrap();
    log.create_topic("notes-out", 1).await.unwrap();
    for partition in 0..2u32 {
        let notes = (0..30u64)
            .map(|i| record(NOTE, i, json!({ "key": i, "text": format!("p{partition}-{i}"), "emit_to": "notes-out" })))
            .collect();
        log.append("probes", vec![(partition, notes)]).await.unwrap();
    }
    let module = probe_module();
    for host in 0..2u32 {
        let data = dir.path().join(format!("host{host}"));
        let config = ConsumerConfig { partitions: Some(vec![host]), batch_size: 7, ..ConsumerConfig::default() };
        catch_up(&log, host_settings(&data, "probe", "probes", vec![module.clone()], config)).await.unwrap();
    }
    assert_eq!(log.end_offset("notes-out", 0).await.unwrap(), 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_topic_with_another_partition_count_is_refused_naming_both() {
    let (_dir, log, settings) = setup(vec![record(NOTE, 1, json!({ "key": 1, "text": "a", "emit_to": null }))]).await;
    log.create_topic("dlq_probes", 3).await.unwrap();
    let host = Host::start_on(log.clone(), settings).await.unwrap();
    let projection = host.projection().clone();
    let error = host.finished().await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "topic `dlq_probes` has 3 partitions but its main topic `probes` has 1; they must match (delete \
         `dlq_probes` or give it 1 partitions)"
    );
    assert_eq!(projection.store().position("probes", 0).unwrap(), None, "nothing was consumed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_outbox_goes_out_in_whole_stamped_appends_and_a_failure_between_them_repeats_nothing() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use wakuwaku::storage::log::LogError;
    use wakuwaku_tests::faulty::{Call, FaultyLog};

    let dir = tempfile::tempdir().unwrap();
    let writes = Arc::new(AtomicUsize::new(0));
    let counted = writes.clone();
    // The second append fails, as a server going away between two would.
    let log = FaultyLog::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap(), move |call| match call {
        Call::Write { .. } if counted.fetch_add(1, Ordering::SeqCst) == 1 => {
            Some(LogError::Unavailable { address: "test".into(), reason: "gone".into() })
        }
        _ => None,
    });
    log.create_topic("out", 2).await.unwrap();
    let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
    let entry = |partition: u32, n: u64| OutboxEntry {
        topic: "out".into(),
        partition_key: 0,
        partition: Some(partition),
        record: record(NOTE, n, json!({ "n": n })),
        origin: None,
    };
    let outbox = (0..2500).map(|n| entry(0, n)).chain((0..10).map(|n| entry(1, n))).collect();
    store.commit(BatchCommit { outbox, ..BatchCommit::default() }).unwrap();

    assert!(outbox::publish(&log, &store, "probe", &RoutedTopics::shared("probes"), &[0, 1]).await.is_err());
    outbox::publish(&log, &store, "probe", &RoutedTopics::shared("probes"), &[0, 1]).await.unwrap();
    assert!(store.outbox().unwrap().is_empty());
    // 3 appends of at most 1000 to partition 0 and 1 to partition 1, plus
    // the one that failed.
    assert_eq!(writes.load(Ordering::SeqCst), 5);
    for (partition, count) in [(0, 2500), (1, 10)] {
        let bodies: Vec<serde_json::Value> = log
            .log
            .read("out", partition, 0, 10_000)
            .await
            .unwrap()
            .iter()
            .map(|r| serde_json::from_slice(&r.record.body).unwrap())
            .collect();
        let expected: Vec<serde_json::Value> = (0..count).map(|n| json!({ "n": n })).collect();
        assert_eq!(bodies, expected, "partition {partition}: each record once, in order");
    }
}

/// A note for `key`, which the probe applies.
fn note(key: u64) -> Record {
    record(NOTE, key, json!({ "key": key, "text": "n", "emit_to": null }))
}

/// A host of the probe following `probes` (which holds `records`), polling
/// an idle partition every `idle_poll`.
async fn following(
    records: Vec<Record>,
    idle_poll: Duration,
) -> (tempfile::TempDir, Arc<EmbeddedLog>, RunningHost<EmbeddedLog>) {
    let (dir, log, settings) = setup(records).await;
    let consumer = ConsumerConfig { idle_poll, ..settings.consumer.clone() };
    let host =
        Host::start_on(log.clone(), HostSettings { until_caught_up: false, consumer, ..settings }).await.unwrap();
    (dir, log, host)
}

/// Waits until `host` has committed `probes` up to `end`; fails saying
/// `what` after `within`.
async fn wait_for_position(host: &RunningHost<EmbeddedLog>, end: u64, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while host.projection().store().position("probes", 0).unwrap() != Some(end) {
        assert!(Instant::now() < deadline, "{what}: the host stopped short of offset {end}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_following_host_applies_what_is_appended_after_it_caught_up() {
    let (_dir, log, host) = following((0..3).map(note).collect(), Duration::from_millis(5)).await;
    // Caught up, idle, then more: a record at a time, then a run larger
    // than a stored block; each is applied where it stands.
    let mut end = 3u64;
    for (round, appended) in [0u64, 1, 1, 2000, 5].into_iter().enumerate() {
        log.append("probes", vec![(0, (end..end + appended).map(note).collect())]).await.unwrap();
        end += appended;
        wait_for_position(&host, end, Duration::from_secs(30), &format!("round {round}")).await;
        let counters = host.projection().store().counters().unwrap();
        assert_eq!(counters, [("notes".to_owned(), end as i128)], "round {round}");
    }
    assert_eq!(host.stop().await.unwrap().applied, end);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_following_host_polls_at_once_when_the_embedded_log_is_appended_to() {
    // An idle wait far longer than the test may take: only the log's append
    // signal can make the host see the later notes in time.
    let (_dir, log, host) = following(vec![note(0)], Duration::from_secs(600)).await;
    wait_for_position(&host, 1, Duration::from_secs(60), "the first note").await;
    for end in [2, 3] {
        log.append("probes", vec![(0, vec![note(end - 1)])]).await.unwrap();
        wait_for_position(&host, end, Duration::from_secs(60), "after an append").await;
    }
    assert_eq!(host.stop().await.unwrap().applied, 3);
}

/// Taking an assigned partition fails while the log cannot say where the
/// partition ends: the consumer keeps following (it does not stop), logs
/// and counts each failed take, and takes the partitions once the log
/// answers again, consuming every event once. Every take first makes the
/// log forget the stamps of the partition's outbox producer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_take_of_an_assigned_partition_is_tried_again_after_a_backoff() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use wakuwaku::engine::consumer::Consumer;
    use wakuwaku::engine::metrics::Metrics;
    use wakuwaku::engine::projection::Projection;
    use wakuwaku::storage::log::LogError;
    use wakuwaku_tests::faulty::{Call, FaultyLog};

    const FAULTS: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let module = wakuwaku_tests::bank_module();
    // Once armed (after the events are published), the first FAULTS
    // end-offset reads of `accounts` fail; forgotten producers are noted.
    let armed = Arc::new(AtomicBool::new(false));
    let queries = Arc::new(AtomicUsize::new(0));
    let forgotten = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let (is_armed, counted, forgets) = (armed.clone(), queries.clone(), forgotten.clone());
    let log =
        Arc::new(FaultyLog::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap(), move |call| match call {
            Call::Query { topic: "accounts" }
                if is_armed.load(Ordering::SeqCst) && counted.fetch_add(1, Ordering::SeqCst) < FAULTS =>
            {
                Some(LogError::Unavailable { address: "test".into(), reason: "gone".into() })
            }
            Call::Forget { producer } => {
                forgets.lock().unwrap().push(producer.to_owned());
                None
            }
            _ => None,
        }));
    let spec = wakuwaku::authoring::demo::WorkloadSpec { events: 1_000, accounts: 40, seed: 71 };
    let oracle = wakuwaku_tests::publish_bank(&*log, module.clone(), spec, 2).await;
    armed.store(true, Ordering::SeqCst);

    let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
    let projection = Arc::new(Projection::new("bank", "accounts", vec![module.clone()], store).unwrap());
    let metrics = Arc::new(Metrics::default());
    let config = ConsumerConfig {
        log_backoff: (Duration::from_millis(10), Duration::from_millis(100)),
        ..ConsumerConfig::default()
    };
    let (_assign, assigned) = tokio::sync::watch::channel(vec![0, 1]);
    let consumer =
        Consumer::new(log.clone(), projection.clone(), config).with_assignment(assigned).with_metrics(metrics.clone());
    let progress = consumer.progress();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        consumer
            .follow(async {
                let _ = stopped.await;
            })
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(progress.partitions().len() == 2 && progress.caught_up()) {
        assert!(!task.is_finished(), "the consumer stopped: {:?}", task.await);
        assert!(Instant::now() < deadline, "the partitions were never taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(queries.load(Ordering::SeqCst) > FAULTS, "every fault was hit");
    let counted = metrics.encode();
    assert!(
        counted.contains(&format!("waku_partition_takes_failed_total{{projection=\"bank\"}} {FAULTS}")),
        "{counted}"
    );
    // One forget per take tried (FAULTS failed, two succeeded).
    let producer = wakuwaku::engine::outbox::producer(projection.store(), "bank").unwrap();
    let forgotten = forgotten.lock().unwrap().clone();
    assert_eq!(forgotten.len(), FAULTS + 2, "{forgotten:?}");
    for partition in [0, 1] {
        assert!(forgotten.contains(&format!("{producer}/{partition}")), "{forgotten:?}");
    }
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
    let check = wakuwaku::authoring::demo::check_projection(&oracle, &*module, projection.store()).unwrap();
    assert!(check.matches(), "{}", check.report(10));
}
