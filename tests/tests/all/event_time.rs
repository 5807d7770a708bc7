//! The start-up race of a projection over several topics: one topic's
//! partition is read late (its reads find nothing for a while, though the
//! log holds its history). The clock waits for it, because its position is
//! below the end offset read before anything was read, so no event is
//! late; a rule that took its silence for the end would have let the other
//! topic push the clock past its history.
//!
//! And each event type is held to what it declares: a timed type's message
//! without its event time is dead-lettered naming the rule, an untimed
//! type's header is ignored, and records routed to retry keep their time;
//! a retried fold keeps the time of the event whose place it takes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::event::{Algebra, EventAtomicOrdering, EventHeaders, EventTypeTag, Header, header_name};
use wakuwaku::key::Key;
use wakuwaku::operations::host::{Host, StateSettings};
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku::storage::stats::Stat;
use wakuwaku_tests::faulty::{Call, FaultyLog};
use wakuwaku_tests::flaky;
use wakuwaku_tests::{fresh_stream, host_settings, json_record, postgres_url, probe_module};

/// The probe's `TimedLedger`, a timed type.
const LEDGER: EventTypeTag = EventTypeTag::new(51);
const BASE_MS: i64 = 1_796_169_600_000;

/// Key `key`'s entry `seq`, stamped `event_time`.
fn entry(key: u64, seq: u64, event_time: i64) -> Record {
    let body = json!({ "key": key, "seq": seq, "amount": 1, "fail": null, "ordering": "relaxed" });
    let mut record = json_record(LEDGER, key, body);
    record.headers.push(Header { name: header_name::EVENT_TIME.into(), value: event_time.to_le_bytes().to_vec() });
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_read_late_at_start_up_holds_the_clock_and_no_event_is_late() {
    start_up_race("ledger", None).await;
}

/// The same with the state (and the release checkpoint) in PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_read_late_at_start_up_holds_the_clock_on_postgres_too() {
    let Some(url) = postgres_url("event time with the state in PostgreSQL") else { return };
    start_up_race(&fresh_stream("ledger").replace('-', "_"), Some(url)).await;
}

/// Two topics, one of them silent for its first 40 reads; the projection
/// `projection`, its state embedded or in the PostgreSQL database `url`.
async fn start_up_race(projection: &str, url: Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let log = EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
    let (keys, per_key) = (20u64, 30u64);
    // Odd entries of every key in `early`, even ones in `late`: each key's
    // history alternates between the two topics.
    for topic in ["early", "late"] {
        log.create_topic(topic, 1).await.unwrap();
        let records: Vec<Record> = (1..=per_key)
            .flat_map(|seq| (0..keys).map(move |key| (key, seq)))
            .filter(|(_, seq)| (seq % 2 == 1) == (topic == "early"))
            .map(|(key, seq)| entry(key, seq, BASE_MS + seq as i64 * 1000 + key as i64))
            .collect();
        log.append(topic, vec![(0, records)]).await.unwrap();
    }
    // `late` finds nothing for its first 40 reads, while `early` is read
    // 4 entries a time (half a batch of 8 each).
    let silent_reads = Arc::new(AtomicU64::new(0));
    let counted = silent_reads.clone();
    let log = Arc::new(FaultyLog::new(log, |_| None).with_silence(move |call| {
        matches!(call, Call::Read { topic: "late", .. }) && counted.fetch_add(1, Ordering::SeqCst) < 40
    }));
    let consumer = ConsumerConfig { batch_size: 8, ..ConsumerConfig::default() };
    let mut settings = host_settings(dir.path(), projection, "early", vec![probe_module()], consumer);
    settings.more_topics = vec!["late".to_owned()];
    if let Some(url) = url {
        settings.state = StateSettings::Postgres { url };
    }
    let host = Host::start_on(log.clone(), settings).await.unwrap();
    let (projection, metrics) = (host.projection().clone(), host.metrics().clone());
    let summary = host.finished().await.unwrap();

    assert!(silent_reads.load(Ordering::SeqCst) > 40, "`late` was never silent");
    assert_eq!(summary.order_violations, 0);
    let store = projection.store();
    let counters: std::collections::HashMap<String, i128> = store.counters().unwrap().into_iter().collect();
    assert_eq!(counters.get("out_of_order"), None, "a key saw its entries out of event-time order");
    assert_eq!(counters.get("ledger").copied(), Some((keys * per_key) as i128));
    let stats = store.stats().unwrap();
    assert_eq!(stats[Stat::OrderViolations], 0);

    // The metrics show each input's clock and that both ended idle, with
    // nothing held.
    let shown = metrics.encode();
    let line = |metric: &str, topic: &str| {
        shown
            .lines()
            .find(|line| line.starts_with(&format!("{metric}{{")) && line.contains(&format!("topic=\"{topic}\"")))
            .unwrap_or_else(|| panic!("no {metric} of {topic}: {shown}"))
            .to_owned()
    };
    for topic in ["early", "late"] {
        assert!(line("waku_input_idle", topic).ends_with(" 1"), "{shown}");
        let last_seq = if topic == "early" { per_key - 1 } else { per_key };
        let clock = BASE_MS + last_seq as i64 * 1000 + keys as i64 - 1;
        assert!(line("waku_input_clock_ms", topic).ends_with(&format!(" {clock}")), "{shown}");
    }
    let held = shown.lines().find(|line| line.starts_with("waku_held_events{")).unwrap_or_else(|| panic!("{shown}"));
    assert!(held.ends_with(" 0"), "{held}");
}

/// The probe's `Ledger`, an untimed type sharing `TimedLedger`'s handler
/// (and so a key's `seq`).
const UNTIMED_LEDGER: EventTypeTag = EventTypeTag::new(50);

/// A ledger entry of type `tag`, with a `waku-event-time` header when
/// `event_time` is given, failing as `fail` says.
fn ledger(tag: EventTypeTag, key: u64, seq: u64, event_time: Option<i64>, fail: Option<&str>) -> Record {
    let body = json!({ "key": key, "seq": seq, "amount": 1, "fail": fail, "ordering": "relaxed" });
    let mut record = json_record(tag, key, body);
    if let Some(time) = event_time {
        record.headers.push(Header { name: header_name::EVENT_TIME.into(), value: time.to_le_bytes().to_vec() });
    }
    record
}

/// The host enforces what each type declares (`event-time-declared`,
/// `event-time-untimed`), and a record routed to retry keeps its event
/// time:
/// - key 1: a timed entry without the header is dead-lettered naming the
///   rule; its other entry is applied;
/// - key 3: an untimed entry stamped later than a timed one of the key is
///   applied as it arrives, first, so the key's `seq` stays in order (were
///   the header honoured, the timed entry would go first and the key see
///   `seq` fall);
/// - key 4: a timed entry that fails as retryable goes to the retry topic
///   with its `waku-event-time`, and from there to the dead-letter topic
///   with it still.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_type_is_held_to_its_event_time_declaration_and_retried_records_keep_their_time() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    for topic in ["early", "late"] {
        log.create_topic(topic, 1).await.unwrap();
    }
    let early = vec![
        ledger(LEDGER, 1, 1, Some(BASE_MS + 1000), None),
        ledger(LEDGER, 3, 2, Some(BASE_MS + 1000), None),
        ledger(LEDGER, 4, 1, Some(BASE_MS + 4000), Some("retryable")),
    ];
    let late = vec![ledger(LEDGER, 1, 2, None, None), ledger(UNTIMED_LEDGER, 3, 1, Some(BASE_MS + 5000), None)];
    log.append("early", vec![(0, early)]).await.unwrap();
    log.append("late", vec![(0, late)]).await.unwrap();

    let mut consumer = ConsumerConfig::default();
    consumer.retry.delays = vec![std::time::Duration::from_millis(10)];
    consumer.retry.max_attempts = 2;
    let mut settings = host_settings(dir.path(), "ledger", "early", vec![probe_module()], consumer);
    settings.more_topics = vec!["late".to_owned()];
    let (summary, projection) = wakuwaku_tests::catch_up(&log, settings).await.unwrap();
    assert_eq!(summary.order_violations, 0, "{summary:?}");
    let store = projection.store();
    let counters: std::collections::HashMap<String, i128> = store.counters().unwrap().into_iter().collect();
    assert_eq!(counters.get("out_of_order"), None, "key 3's untimed entry was held by its header");
    assert_eq!(counters.get("ledger"), Some(&3), "keys 1 and 3 applied, the missing time and key 4 not");

    // Key 1's entry without its time: dead-lettered, naming the rule.
    let letters = wakuwaku::operations::dead_letter::list(&*log, "early", "ledger", store).await.unwrap();
    let reasons: Vec<String> = letters
        .iter()
        .filter_map(|letter| letter.routed.failure.as_ref().map(|failure| failure.message.clone()))
        .collect();
    let declared = reasons
        .iter()
        .find(|reason| reason.starts_with("event-time-declared: event type `TimedLedger` (tag 51)"))
        .unwrap_or_else(|| panic!("no event-time-declared dead letter in {reasons:?}"));
    assert!(declared.contains("no `waku-event-time` header"), "{declared}");

    // Key 4's entry in the retry topic, and in the dead-letter topic once
    // retried, with its event time.
    let stamped = (BASE_MS + 4000).to_le_bytes().to_vec();
    let time_of =
        |record: &Record| record.headers.iter().find(|h| h.name == header_name::EVENT_TIME).map(|h| h.value.clone());
    let retried = log.read(projection.routed_topics().retry(), 0, 0, 10).await.unwrap();
    assert!(!retried.is_empty(), "key 4 went to retry");
    for stored in &retried {
        assert_eq!(time_of(&stored.record), Some(stamped.clone()), "a retry record keeps the event time");
    }
    let key_4 = letters
        .iter()
        .find(|letter| letter.envelope.as_ref().is_ok_and(|envelope| envelope.key == wakuwaku::key::Key::int(4u64)));
    if let Some(letter) = key_4 {
        assert_eq!(letter.envelope.as_ref().unwrap().event_time, Some(BASE_MS + 4000), "and so does its dead letter");
    }
}

/// The ledger counters of `store`: (`ledger`, `out_of_order`).
fn ledger_counts(store: &wakuwaku::storage::state::StateStore) -> (i128, i128) {
    let counters: std::collections::HashMap<String, i128> = store.counters().unwrap().into_iter().collect();
    (counters.get("ledger").copied().unwrap_or(0), counters.get("out_of_order").copied().unwrap_or(0))
}

/// Waits until `store` counted `applied` ledger entries.
async fn wait_for(store: &wakuwaku::storage::state::StateStore, applied: i128) -> Instant {
    let since = Instant::now();
    while ledger_counts(store).0 < applied {
        assert!(since.elapsed() < Duration::from_secs(60), "{:?} of {applied} applied", ledger_counts(store));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Instant::now()
}

/// After catching up, every input is idle and an untimed topic is the
/// clock: it follows processing time (far past the history), an event that
/// then arrives on an idle partition with a time just ahead waits until
/// processing time passes it (then goes, in order), and one with a time the
/// clock already passed is applied at once and counted late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_partition_that_receives_new_data_after_catch_up_counts_again_under_the_processing_time_clock() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    let (keys, per_key) = (5u64, 6u64);
    for topic in ["early", "late", "catalogue"] {
        log.create_topic(topic, 1).await.unwrap();
    }
    for topic in ["early", "late"] {
        let records: Vec<Record> = (1..=per_key)
            .flat_map(|seq| (0..keys).map(move |key| (key, seq)))
            .filter(|(_, seq)| (seq % 2 == 1) == (topic == "early"))
            .map(|(key, seq)| entry(key, seq, BASE_MS + seq as i64 * 1000 + key as i64))
            .collect();
        log.append(topic, vec![(0, records)]).await.unwrap();
    }
    // The catalogue: no event time, applied as it arrives.
    let untimed = |key: u64| {
        json_record(
            UNTIMED_LEDGER,
            key,
            json!({ "key": key, "seq": 1, "amount": 1, "fail": null, "ordering": "relaxed" }),
        )
    };
    log.append("catalogue", vec![(0, vec![untimed(100), untimed(101)])]).await.unwrap();
    let consumer = ConsumerConfig { untimed_topics: vec!["catalogue".to_owned()], ..ConsumerConfig::default() };
    let mut settings = host_settings(dir.path(), "stock", "early", vec![probe_module()], consumer);
    settings.more_topics = vec!["late".to_owned(), "catalogue".to_owned()];
    settings.until_caught_up = false;
    let started_ms = wakuwaku::platform::clock::now_ms() as i64;
    let host = Host::start_on(log.clone(), settings).await.unwrap();
    let store = host.projection().store().clone();
    let history = (keys * per_key + 2) as i128;
    wait_for(&store, history).await;

    // Caught up: every input idle, the clock at processing time, not at
    // one past the history's latest event time.
    let clock = {
        let since = Instant::now();
        loop {
            let timing = host.timing().snapshot();
            let idle = timing.iter().all(|t| t.inputs.iter().all(|input| input.idle));
            if let (true, Some(clock)) = (idle, timing[0].clock_ms)
                && clock >= started_ms
            {
                break clock;
            }
            assert!(since.elapsed() < Duration::from_secs(10), "{timing:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    assert!(clock <= wakuwaku::platform::clock::now_ms() as i64);

    // New data on the idle `early`, 300 ms ahead of processing time: it
    // counts again, and waits for the processing-time clock to pass it.
    let ahead = wakuwaku::platform::clock::now_ms() as i64 + 300;
    log.append("early", vec![(0, vec![entry(0, per_key + 1, ahead)])]).await.unwrap();
    wait_for(&store, history + 1).await;
    let applied_ms = wakuwaku::platform::clock::now_ms() as i64;
    assert!(applied_ms > ahead, "applied at {applied_ms}, before processing time passed its event time {ahead}");
    // Then on the idle `late`, a time the clock passed long ago: late,
    // applied at once, counted.
    log.append("late", vec![(0, vec![entry(7, 1, BASE_MS)])]).await.unwrap();
    wait_for(&store, history + 2).await;
    assert_eq!(ledger_counts(&store).1, 0, "a key saw its entries out of event-time order");
    let violations = host.timing().snapshot()[0].order_violations;
    let summary = host.stop().await.unwrap();
    assert_eq!((violations, summary.order_violations), (1, 1));
}

/// A record of the flaky module's type `tag` for `key`, stamped
/// `event_time`; a sum of odd `seq` fails (retryable) on its first call.
fn flaky_record(tag: EventTypeTag, key: u64, seq: u64, (ordering, event_time): (EventAtomicOrdering, i64)) -> Record {
    let algebra = if tag == flaky::SUM { Algebra::Associative } else { Algebra::NonAssociative };
    let fail = if tag == flaky::SUM && seq % 2 == 1 { vec!["retryable".to_owned()] } else { Vec::new() };
    let headers = EventHeaders { tag, key: Key::int(key), ordering, algebra, event_time: Some(event_time) };
    Record { headers: headers.to_headers(), body: flaky::Step { seq, amount: 1, fail, ..Default::default() }.body() }
}

/// A fold released across two topics that goes to retry keeps the event
/// time of the event whose place it takes in its key's order (never an
/// event found by its offset, which another topic's event shares):
/// - key 1's run of sums, one from each topic, is a body run: its fold
///   keeps its first event's time (2 000), not that of topic `b`'s event
///   at offset 0 (3 000), the fold's origin;
/// - key 3's sums end at a `Release`: the run is the tail after the body
///   run `Other`, and its fold keeps the `Release`'s time (2 700), which
///   keeps it after `Other` (2 600); its first event's (2 500) would not.
///
/// Both folds fail once (retryable) and are applied from the retry topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_fold_keeps_the_event_time_of_the_event_whose_place_it_takes() {
    use flaky::{OTHER, STEP, SUM};
    use wakuwaku::event::EventAtomicOrdering::{Relaxed, Release};
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    for topic in ["a", "b"] {
        log.create_topic(topic, 1).await.unwrap();
    }
    let at = |ms: i64| BASE_MS + ms;
    let a = vec![
        flaky_record(STEP, 9, 10, (Relaxed, at(1000))),
        flaky_record(SUM, 1, 1, (Relaxed, at(2000))),
        flaky_record(SUM, 3, 3, (Relaxed, at(2500))),
    ];
    let b = vec![
        flaky_record(SUM, 1, 2, (Relaxed, at(3000))),
        flaky_record(OTHER, 3, 4, (Relaxed, at(2600))),
        flaky_record(SUM, 3, 6, (Release, at(2700))),
    ];
    log.append("a", vec![(0, a)]).await.unwrap();
    log.append("b", vec![(0, b)]).await.unwrap();

    let module = flaky::Flaky::new().timed();
    let mut consumer = ConsumerConfig::default();
    // Due at once: `--until-caught-up` ends a partition at its end offset
    // without waiting for retries not yet due, so any delay would make the
    // retried folds' application depend on the machine's speed.
    consumer.retry.delays = vec![Duration::ZERO];
    consumer.retry.max_attempts = 3;
    let mut settings = host_settings(dir.path(), "folds", "a", vec![Arc::new(module.clone())], consumer);
    settings.more_topics = vec!["b".to_owned()];
    let (summary, projection) = wakuwaku_tests::catch_up(&log, settings).await.unwrap();
    assert_eq!((summary.order_violations, summary.dead_lettered), (0, 0), "{summary:?}");

    let retried = log.read(projection.routed_topics().retry(), 0, 0, 10).await.unwrap();
    let mut times: Vec<(Key, Option<i64>)> = retried
        .iter()
        .map(|stored| {
            let headers = EventHeaders::parse_stored(&stored.record.headers).unwrap();
            (headers.key, headers.event_time)
        })
        .collect();
    times.sort_by_key(|(key, _)| key.to_string());
    assert_eq!(times, [(Key::int(1u64), Some(at(2000))), (Key::int(3u64), Some(at(2700)))], "the retried folds");
    // Applied from there: key 3's fold after its `Other`.
    let store = projection.store();
    assert_eq!(flaky::Flaky::applied(store, &Key::int(1u64)), [1]);
    assert_eq!(flaky::Flaky::applied(store, &Key::int(3u64)), [4, 3]);
}

/// Dead-letter and retry records of a projection over two topics name the
/// topic, partition and offset each event was read from (the first topic
/// was named for every one before), and a re-driven letter that fails
/// again names them still:
/// - `second` offset 1 fails for good: dead-lettered naming `second`;
/// - `second` offset 2 fails retryably: its retry record names `second`;
/// - `first` offset 2 fails for good: dead-lettered naming `first`;
/// - the letter of `second` re-driven fails again: its new letter names
///   `second` offset 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_of_a_projection_over_two_topics_name_the_topic_each_event_was_read_from() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    for topic in ["first", "second"] {
        log.create_topic(topic, 2).await.unwrap();
    }
    // Three keys of partition 1, so offsets and the partition say something.
    let in_partition_1 = |key: &u64| wakuwaku::event::partition_for(wakuwaku::key::Key::int(*key).key_hash(), 2) == 1;
    let keys: Vec<u64> = (1..).filter(in_partition_1).take(3).collect();
    let (a, b, c) = (keys[0], keys[1], keys[2]);
    let at = |ms: i64| Some(BASE_MS + ms);
    let first = vec![
        ledger(LEDGER, a, 1, at(1000), None),
        ledger(LEDGER, a, 2, at(3000), None),
        ledger(LEDGER, a, 3, at(3500), Some("unrecoverable")),
    ];
    let second = vec![
        ledger(LEDGER, b, 1, at(1500), None),
        ledger(LEDGER, b, 2, at(2000), Some("unrecoverable")),
        ledger(LEDGER, c, 1, at(2500), Some("retryable")),
    ];
    log.append("first", vec![(1, first)]).await.unwrap();
    log.append("second", vec![(1, second)]).await.unwrap();

    let mut consumer = ConsumerConfig::default();
    // Retries wait past the catch-up: key c's record stays in retry.
    consumer.retry.delays = vec![Duration::from_secs(600)];
    let mut settings = host_settings(dir.path(), "ledger", "first", vec![probe_module()], consumer);
    settings.more_topics = vec!["second".to_owned()];
    let (summary, projection) = wakuwaku_tests::catch_up(&log, settings.clone()).await.unwrap();
    assert_eq!((summary.applied, summary.dead_lettered, summary.retry_in), (3, 2, 1), "{summary:?}");

    // Where each dead letter says its event came from, by key.
    let origins = |letters: &[wakuwaku::operations::dead_letter::DeadLetter]| {
        let mut origins: Vec<(u64, String, u32, u64, bool)> = letters
            .iter()
            .map(|letter| {
                let key = letter.envelope.as_ref().unwrap().key.clone();
                let key = [a, b, c].into_iter().find(|k| wakuwaku::key::Key::int(*k) == key).unwrap();
                let routed = &letter.routed;
                (key, routed.topic.clone(), routed.origin_partition, routed.origin_offset, letter.redriven)
            })
            .collect();
        origins.sort();
        origins
    };
    let store = projection.store();
    let letters = wakuwaku::operations::dead_letter::list(&*log, "first", "ledger", store).await.unwrap();
    assert_eq!(origins(&letters), [(a, "first".into(), 1, 2, false), (b, "second".into(), 1, 1, false)]);
    // As the text header `waku.error.topic` says it, read off the log.
    let dlq = log.read(projection.routed_topics().dlq(), 1, 0, 10).await.unwrap();
    let topics: Vec<&[u8]> = dlq
        .iter()
        .filter_map(|stored| stored.record.headers.iter().find(|h| h.name == "waku.error.topic"))
        .map(|h| &h.value[..])
        .collect();
    assert_eq!(topics.len(), 2, "{dlq:?}");
    assert!(topics.contains(&&b"second"[..]) && topics.contains(&&b"first"[..]), "{topics:?}");
    // Key c's record waiting in retry.
    let retried = log.read(projection.routed_topics().retry(), 1, 0, 10).await.unwrap();
    let routed: Vec<_> = retried
        .iter()
        .map(|stored| wakuwaku::engine::routing::Routed::parse(&stored.record.headers).unwrap())
        .collect();
    let places: Vec<_> = routed.iter().map(|r| (r.topic.as_str(), r.origin_partition, r.origin_offset)).collect();
    assert_eq!(places, [("second", 1, 2)], "key c's retry record");

    // Key b's letter re-driven fails again, and still names where it came from.
    let selection =
        wakuwaku::operations::dead_letter::Selection { key: Some(wakuwaku::key::Key::int(b)), ..Default::default() };
    let redriven =
        wakuwaku::operations::dead_letter::redrive(&*log, "first", "ledger", store, &selection).await.unwrap();
    assert_eq!(redriven.records, 1, "{redriven:?}");
    drop(projection);
    let (summary, projection) = wakuwaku_tests::catch_up(&log, settings).await.unwrap();
    assert_eq!(summary.dead_lettered, 1, "the re-driven letter failed again: {summary:?}");
    let letters = wakuwaku::operations::dead_letter::list(&*log, "first", "ledger", projection.store()).await.unwrap();
    assert_eq!(
        origins(&letters),
        [(a, "first".into(), 1, 2, false), (b, "second".into(), 1, 1, false), (b, "second".into(), 1, 1, true)]
    );
}
