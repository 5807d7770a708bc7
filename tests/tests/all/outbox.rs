//! Nothing owed blocks a partition: emitted messages that can never be
//! delivered (a missing or deleted topic, an invalid name, a record the log
//! refuses) become dead letters with their reason and the run goes on, with
//! exact counts; a record of the host's own that cannot be appended stops
//! the run naming its topic, and a restart delivers it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig};
use wakuwaku::engine::outbox::{self, OutboxError, Published};
use wakuwaku::engine::projection::Projection;
use wakuwaku::engine::routing::{FailureClass, Routed, RoutedTopics};
use wakuwaku::event::{EventHeaders, EventTypeTag};
use wakuwaku::key::Key;
use wakuwaku::operations::dead_letter::{self, DeadLetterError, Selection};
use wakuwaku::storage::log::{EmbeddedLog, EventLog, LogError};
use wakuwaku::storage::state::{BatchCommit, EmitOrigin, OutboxEntry, StateStore};
use wakuwaku::storage::stats::{Stat, Stats};
use wakuwaku_tests::faulty::{Call, FaultyLog};
use wakuwaku_tests::{catch_up, host_settings, json_record as record, probe_module};

const NOTE: EventTypeTag = EventTypeTag::new(4);

fn emitted(topic: &str, key: u64, origin: (u32, u64)) -> OutboxEntry {
    OutboxEntry {
        topic: topic.into(),
        partition_key: key,
        partition: None,
        record: record(NOTE, key, json!({ "key": key, "to": topic })),
        origin: Some(EmitOrigin {
            partition: origin.0,
            offset: origin.1,
            module: "probe".into(),
            version: "0123abcd".into(),
            topic: None,
        }),
    }
}

fn stats(store: &StateStore) -> Stats {
    store.stats().unwrap()
}

/// Every record of a topic's partitions, as (partition, routing, body).
async fn letters(log: &impl EventLog, topic: &str) -> Vec<(u32, Routed, Vec<u8>)> {
    let mut all = Vec::new();
    for partition in 0..log.partitions(topic).await.unwrap() {
        for stored in log.read(topic, partition, 0, 1000).await.unwrap() {
            all.push((partition, Routed::parse(&stored.record.headers).unwrap(), stored.record.body));
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_to_a_missing_topic_or_an_invalid_name_become_dead_letters_and_the_rest_goes_out() {
    let dir = tempfile::tempdir().unwrap();
    let log = EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
    for (topic, partitions) in [("probes", 2), ("dlq_probes", 2), ("out", 1)] {
        log.create_topic(topic, partitions).await.unwrap();
    }
    let store = StateStore::open(&dir.path().join("probe.redb")).unwrap();
    let outbox = vec![emitted("out", 1, (0, 3)), emitted("nowhere", 2, (1, 7)), emitted("bad name!", 3, (0, 9))];
    // Committed with the positions of both partitions, as a consumer of
    // them would: this store owns their dead letters.
    let positions = vec![("probes".to_owned(), 0, 10), ("probes".to_owned(), 1, 10)];
    store.commit(BatchCommit { outbox, positions, ..BatchCommit::default() }).unwrap();

    let published = outbox::publish(&log, &store, "probe", &RoutedTopics::shared("probes"), &[0, 1]).await.unwrap();
    assert_eq!(published, Published { appended: 3, undeliverable: 2 });
    assert!(store.outbox().unwrap().is_empty());
    assert_eq!(stats(&store)[Stat::Undeliverable], 2);
    assert_eq!(log.end_offset("out", 0).await.unwrap(), 1);

    // Each letter sits in the partition of the event that emitted it, with
    // the message's envelope and body, naming that event, the module and
    // why; it stands for no event.
    let mut dead = letters(&log, "dlq_probes").await;
    dead.sort_by_key(|(partition, _, _)| *partition);
    let summary: Vec<(u32, u64, u64, FailureClass, String)> = dead
        .iter()
        .map(|(partition, routed, _)| {
            let failure = routed.failure.clone().unwrap();
            assert_eq!((failure.module.as_str(), failure.version.as_str()), ("probe", "0123abcd"));
            (*partition, routed.origin_offset, routed.events, failure.class, failure.message)
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                0,
                9,
                0,
                FailureClass::Undeliverable,
                "the message emitted to `bad name!` cannot be delivered: invalid topic name \"bad name!\": only ASCII \
                 letters, digits, '.', '_' and '-' are allowed"
                    .to_owned()
            ),
            (
                1,
                7,
                0,
                FailureClass::Undeliverable,
                "the message emitted to `nowhere` cannot be delivered: topic `nowhere` does not exist".to_owned()
            ),
        ]
    );
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&dead[1].2).unwrap(), json!({ "key": 2, "to": "nowhere" }));

    // `waku dlq list` shows them; re-driving leaves them alone, and says so
    // when one is asked for by place.
    let listed = dead_letter::list(&log, "probes", "probe", &store).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[1].envelope.as_ref().unwrap().key, Key::int(2u64));
    let all = Selection::default();
    assert_eq!(dead_letter::redrive(&log, "probes", "probe", &store, &all).await.unwrap().records, 0);
    let one = Selection { records: vec![(1, 0)], ..Selection::default() };
    let refused = dead_letter::redrive(&log, "probes", "probe", &store, &one).await.unwrap_err();
    assert!(matches!(refused, DeadLetterError::CannotRedrive { partition: 1, offset: 0, .. }), "{refused}");

    // Publishing again repeats nothing.
    assert_eq!(
        outbox::publish(&log, &store, "probe", &RoutedTopics::shared("probes"), &[0, 1]).await.unwrap(),
        Published::default()
    );
    assert_eq!(letters(&log, "dlq_probes").await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_deleted_after_the_commit_does_not_stop_the_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let deleted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let gone = deleted.clone();
    // `notes-out` exists when the modules load; once `deleted` is set, the
    // log answers as if someone had deleted it.
    let log =
        Arc::new(FaultyLog::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap(), move |call| match call {
            Call::Write { topic: "notes-out" } | Call::Query { topic: "notes-out" } if gone.load(Ordering::SeqCst) => {
                Some(LogError::TopicNotFound { topic: "notes-out".into() })
            }
            _ => None,
        }));
    log.create_topic("probes", 2).await.unwrap();
    log.create_topic("notes-out", 1).await.unwrap();
    for partition in 0..2u64 {
        let notes = (0..10u64)
            .map(|i| record(NOTE, i, json!({ "key": i, "text": format!("p{partition}-{i}"), "emit_to": "notes-out" })))
            .collect();
        log.append("probes", vec![(partition as u32, notes)]).await.unwrap();
    }
    let store = StateStore::open(&dir.path().join("probe.redb")).unwrap();
    let module = probe_module();
    let version = module.version().to_owned();
    let projection = Arc::new(Projection::new("probe", "probes", vec![module], store).unwrap());
    deleted.store(true, Ordering::SeqCst);

    let config = ConsumerConfig { batch_size: 4, ..ConsumerConfig::default() };
    // A bare consumer: a host would refuse the module for its deleted emit topic.
    let summary = Consumer::new(log.clone(), projection.clone(), config.clone()).catch_up().await.unwrap();
    assert_eq!((summary.consumed, summary.applied, summary.undeliverable), (20, 20, 20));
    let counts = stats(projection.store());
    assert_eq!((counts[Stat::Applied], counts[Stat::Undeliverable]), (20, 20));
    assert_eq!(counts[Stat::DeadLettered], 0, "no event was dead-lettered");
    assert!(projection.store().outbox().unwrap().is_empty());

    // One letter per emit, beside the event that emitted it.
    let dead = letters(&log.log, "dlq_probes").await;
    let mut origins: Vec<(u32, u64)> = dead.iter().map(|(p, routed, _)| (*p, routed.origin_offset)).collect();
    origins.sort();
    let expected: Vec<(u32, u64)> = (0..2).flat_map(|p| (0..10).map(move |o| (p, o))).collect();
    assert_eq!(origins, expected);
    for (partition, routed, _) in &dead {
        assert_eq!(routed.origin_partition, *partition);
        let failure = routed.failure.as_ref().unwrap();
        assert_eq!((failure.class, failure.module.as_str()), (FailureClass::Undeliverable, "probe"));
        assert_eq!(failure.version, version);
        assert!(failure.message.ends_with("topic `notes-out` does not exist"), "{}", failure.message);
    }

    // A restart finds nothing owed and goes on.
    let again = Consumer::new(log.clone(), projection.clone(), config).catch_up().await.unwrap();
    assert_eq!((again.consumed, again.undeliverable), (0, 0));
    assert_eq!(letters(&log.log, "dlq_probes").await.len(), 20);
}

/// The dead letter of an undeliverable message emitted by an event of a
/// projection's second topic names that topic as its origin, with the
/// event's offset in it (the first topic was named for every one before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeliverable_messages_of_a_projection_over_two_topics_name_the_topic_of_the_event_that_emitted_them() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(FaultyLog::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap(), |call| match call {
        Call::Write { topic: "notes-out" } | Call::Query { topic: "notes-out" } => {
            Some(LogError::TopicNotFound { topic: "notes-out".into() })
        }
        _ => None,
    }));
    // `more` has more events than `probes`, so its offsets are not those
    // of `probes`; the keys differ, so each call handles events of one
    // topic (a call names the earliest of its events).
    for (topic, events, keys) in [("probes", 2u64, 0), ("more", 5, 100)] {
        log.create_topic(topic, 1).await.unwrap();
        let note = |i: u64| json!({ "key": keys + i, "text": format!("{topic}-{i}"), "emit_to": "notes-out" });
        let notes = (0..events).map(|i| record(NOTE, keys + i, note(i))).collect();
        log.append(topic, vec![(0, notes)]).await.unwrap();
    }
    let store = StateStore::open(&dir.path().join("probe.redb")).unwrap();
    let projection = Projection::new("probe", "probes", vec![probe_module()], store).unwrap();
    let projection = Arc::new(projection.with_more_topics(&["more".to_owned()]).unwrap());
    let summary = Consumer::new(log.clone(), projection, ConsumerConfig::default()).catch_up().await.unwrap();
    assert_eq!((summary.applied, summary.undeliverable), (7, 7), "{summary:?}");

    // Each letter's origin, against the event its body names.
    let mut origins: Vec<(String, String, u64)> = letters(&log.log, "dlq_probes")
        .await
        .into_iter()
        .map(|(_, routed, body)| {
            let text = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["text"].as_str().unwrap().to_owned();
            (text, routed.topic, routed.origin_offset)
        })
        .collect();
    origins.sort();
    let mut expected: Vec<(String, String, u64)> = [("probes", 2u64), ("more", 5)]
        .into_iter()
        .flat_map(|(topic, events)| (0..events).map(move |i| (format!("{topic}-{i}"), topic.to_owned(), i)))
        .collect();
    expected.sort();
    assert_eq!(origins, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_records_the_log_refuses_are_dead_lettered() {
    let dir = tempfile::tempdir().unwrap();
    let writes = Arc::new(AtomicUsize::new(0));
    let counted = writes.clone();
    // The whole append is refused, then the second record on its own.
    let log = FaultyLog::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap(), move |call| match call {
        Call::Write { topic: "out" } if matches!(counted.fetch_add(1, Ordering::SeqCst), 0 | 2) => {
            Some(LogError::Refused { topic: "out".into(), partition: 0, reason: "too large".into() })
        }
        _ => None,
    });
    for (topic, partitions) in [("probes", 1), ("dlq_probes", 1), ("out", 1)] {
        log.create_topic(topic, partitions).await.unwrap();
    }
    let store = StateStore::open(&dir.path().join("probe.redb")).unwrap();
    let outbox = (1..=3).map(|key| emitted("out", key, (0, key))).collect();
    store.commit(BatchCommit { outbox, ..BatchCommit::default() }).unwrap();

    let published = outbox::publish(&log, &store, "probe", &RoutedTopics::shared("probes"), &[0, 1]).await.unwrap();
    assert_eq!(published, Published { appended: 3, undeliverable: 1 });
    let keys: Vec<Key> = log
        .log
        .read("out", 0, 0, 10)
        .await
        .unwrap()
        .iter()
        .map(|r| EventHeaders::parse_stored(&r.record.headers).unwrap().key)
        .collect();
    assert_eq!(keys, [Key::int(1u64), Key::int(3u64)], "in order, without the refused one");
    let dead = letters(&log.log, "dlq_probes").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].1.origin_offset, 2);
    assert_eq!(
        dead[0].1.failure.as_ref().unwrap().message,
        "the message emitted to `out` cannot be delivered: `out` partition 0 refuses the record: too large"
    );
}

/// The embedded log's record limit: an emitted message over it becomes a
/// dead letter that keeps its body (the dead-letter topic has room for the
/// routing headers); a retry record of the host's own over its topic's
/// limit stops the publish naming the topic, the size and the limit, and
/// stays in the outbox, never dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_over_the_embedded_log_limit_are_dead_lettered_or_stop_with_the_sizes_never_dropped() {
    use wakuwaku::storage::log::embedded::{MAX_RECORD_BYTES, ROUTED_HEADROOM};
    let dir = tempfile::tempdir().unwrap();
    let log = EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
    for topic in ["probes", "dlq_probes", "retry_probes", "out"] {
        log.create_topic(topic, 1).await.unwrap();
    }
    let store = StateStore::open(&dir.path().join("probe.redb")).unwrap();
    let mut large = emitted("out", 1, (0, 4));
    large.record.body = vec![b'x'; MAX_RECORD_BYTES];
    let outbox = vec![large.clone(), emitted("out", 2, (0, 5))];
    store.commit(BatchCommit { outbox, ..BatchCommit::default() }).unwrap();

    let published = outbox::publish(&log, &store, "probe", &RoutedTopics::shared("probes"), &[0]).await.unwrap();
    assert_eq!(published, Published { appended: 2, undeliverable: 1 });
    assert_eq!(log.end_offset("out", 0).await.unwrap(), 1);
    let dead = letters(&log, "dlq_probes").await;
    assert_eq!(dead.len(), 1);
    let message = dead[0].1.failure.as_ref().unwrap().message.clone();
    assert!(
        message.starts_with("the message emitted to `out` cannot be delivered: `out` partition 0 refuses a record of")
            && message
                .ends_with(&format!("the log takes at most {MAX_RECORD_BYTES} bytes per record (headers and body)")),
        "{message}"
    );
    assert_eq!(dead[0].2, large.record.body, "the letter keeps the body");

    // A retry record too large even for its topic's room.
    let mut retry = large.clone();
    retry.topic = "retry_probes".into();
    retry.origin = None;
    retry.record.body = vec![b'x'; MAX_RECORD_BYTES + ROUTED_HEADROOM];
    store.commit(BatchCommit { outbox: vec![retry], ..BatchCommit::default() }).unwrap();
    let error = outbox::publish(&log, &store, "probe", &RoutedTopics::shared("probes"), &[0]).await.unwrap_err();
    assert!(matches!(&error, OutboxError::HostRecord { topic, .. } if topic == "retry_probes"), "{error}");
    let limit = MAX_RECORD_BYTES + ROUTED_HEADROOM;
    assert!(error.to_string().contains(&format!("the log takes at most {limit} bytes per record")), "{error}");
    assert_eq!(store.outbox().unwrap().len(), 1, "kept in the outbox");
    assert_eq!(log.end_offset("retry_probes", 0).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_dead_letter_topic_stops_naming_it_and_a_restart_delivers() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("probes", 1).await.unwrap();
    let settings = host_settings(dir.path(), "probe", "probes", vec![probe_module()], ConsumerConfig::default());
    let store = settings.open_state().unwrap();
    store.commit(BatchCommit { outbox: vec![emitted("nowhere", 5, (0, 0))], ..BatchCommit::default() }).unwrap();

    // The message becomes a dead letter, which has nowhere to go.
    let error = outbox::publish(&*log, &store, "probe", &RoutedTopics::shared("probes"), &[0, 1]).await.unwrap_err();
    assert!(matches!(&error, OutboxError::HostRecord { topic, .. } if topic == "dlq_probes"), "{error}");
    assert_eq!(
        error.to_string(),
        "cannot append a retry or dead-letter record to `dlq_probes`: topic `dlq_probes` does not exist (the record \
         stays in the outbox; if the topic was deleted, restarting `waku run` creates it again)"
    );
    let pending = store.outbox().unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].1.topic, "dlq_probes");
    assert_eq!(stats(&store)[Stat::Undeliverable], 1, "counted once, with the letter");

    // Starting a host creates the routed topics, then publishes.
    drop(store);
    let (_, projection) = catch_up(&log, settings).await.unwrap();
    let store = projection.store().clone();
    assert!(store.outbox().unwrap().is_empty());
    let dead = letters(&*log, "dlq_probes").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].1.failure.as_ref().unwrap().class, FailureClass::Undeliverable);
    assert_eq!(stats(&store)[Stat::Undeliverable], 1);
}
