//! Timers fired by the real host (`docs/timers.md`), with the probe's
//! `Tick`: each event appends `e<at>` to its key's `seq` and may set a
//! timer, whose firing appends `t<at>`. Every run is checked against an
//! oracle computed by sorting: a key's events and the timers they set, by
//! time, an event before a timer of its time; a timer fires when the
//! partition's clock passed it (at the end of the log: one past the latest
//! event time of the partition).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::event::{EventTypeTag, Header, header_name, partition_for};
use wakuwaku::key::Key;
use wakuwaku::operations::host::{Host, StateSettings};
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku::storage::state::StateStore;
use wakuwaku::storage::stats::Stat;
use wakuwaku_tests::faulty::{Call, FaultyLog};
use wakuwaku_tests::{fresh_stream, host_settings, json_record, postgres_url, probe_module};

/// The probe's `Tick`.
const TICK: EventTypeTag = EventTypeTag::new(70);
const BASE_MS: i64 = 1_796_169_600_000;

/// One event of the scenario: its key, its time and the timer it sets.
#[derive(Debug, Clone, Copy)]
struct Tick {
    key: u64,
    at: i64,
    timer: Option<i64>,
}

impl Tick {
    fn record(&self) -> Record {
        let body = json!({ "key": self.key, "at": self.at, "timer": self.timer });
        let mut record = json_record(TICK, self.key, body);
        let time = self.at.to_le_bytes().to_vec();
        record.headers.push(Header { name: header_name::EVENT_TIME.into(), value: time });
        record
    }
}

/// A seeded scenario: `keys` keys, `events` events in time order (several
/// of one time), about half setting a timer 1 to 40 ms after their time
/// (some on another event's time exactly, some moved by a later set of
/// the same name).
fn scenario(keys: u64, events: usize, seed: u64) -> Vec<Tick> {
    let mut state = seed;
    let mut next = move |below: u64| {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % below
    };
    let mut at = BASE_MS;
    (0..events)
        .map(|_| {
            at += next(4) as i64 * 5;
            let key = next(keys);
            let timer = (next(2) == 0).then(|| at + 1 + next(40) as i64);
            Tick { key, at, timer }
        })
        .collect()
}

/// What each key's `seq` must read: its events and the timers they set
/// merged by time (an event before a timer of its time; a name set again
/// is one timer), the timers past the partition's clock at the end of
/// the log left out (they are still pending).
fn oracle(ticks: &[Tick], partitions: u32) -> BTreeMap<u64, Vec<String>> {
    let partition_of = |key: u64| partition_for(Key::int(key).key_hash(), partitions);
    let mut clock: HashMap<u32, i64> = HashMap::new();
    for tick in ticks {
        let end = clock.entry(partition_of(tick.key)).or_insert(i64::MIN);
        *end = (*end).max(tick.at + 1);
    }
    let mut merged: BTreeMap<u64, Vec<(i64, u8)>> = BTreeMap::new();
    for tick in ticks {
        let items = merged.entry(tick.key).or_default();
        items.push((tick.at, 0));
        if let Some(timer) = tick.timer.filter(|&timer| timer < clock[&partition_of(tick.key)]) {
            items.push((timer, 1));
        }
    }
    merged
        .into_iter()
        .map(|(key, mut items)| {
            items.sort();
            items.dedup_by(|a, b| a.1 == 1 && a == b);
            let seq =
                items.into_iter().map(|(at, kind)| format!("{}{at}", if kind == 0 { 'e' } else { 't' })).collect();
            (key, seq)
        })
        .collect()
}

/// Each key's `seq` as the store holds it.
fn sequences(store: &StateStore, keys: u64) -> BTreeMap<u64, Vec<String>> {
    let reader = store.reader().unwrap();
    (0..keys)
        .filter_map(|key| {
            let seq = reader.get(&Key::int(key), "seq").unwrap()?;
            Some((key, serde_json::from_slice(&seq).unwrap()))
        })
        .collect()
}

/// How many timers the oracle fires.
fn fired(expected: &BTreeMap<u64, Vec<String>>) -> u64 {
    expected.values().flatten().filter(|item| item.starts_with('t')).count() as u64
}

/// One topic of two partitions: every timer fires at its place among its
/// key's events, whatever the batch size (a replay from scratch polls the
/// log differently and fires the same sequence), and the timers beyond
/// the clock stay pending, shown with the earliest of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_fire_at_their_place_among_their_keys_events_however_the_log_is_polled() {
    let (keys, partitions) = (6u64, 2u32);
    let ticks = scenario(keys, 300, 7);
    let expected = oracle(&ticks, partitions);
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("ticks", partitions).await.unwrap();
    let mut by_partition: BTreeMap<u32, Vec<Record>> = BTreeMap::new();
    for tick in &ticks {
        by_partition.entry(partition_for(Key::int(tick.key).key_hash(), partitions)).or_default().push(tick.record());
    }
    log.append("ticks", by_partition.into_iter().collect()).await.unwrap();
    let mut runs = Vec::new();
    for batch_size in [1, 7, 1000] {
        let data = dir.path().join(format!("run-{batch_size}"));
        std::fs::create_dir_all(&data).unwrap();
        let consumer = ConsumerConfig { batch_size, ..ConsumerConfig::default() };
        let settings = host_settings(&data, "ticks", "ticks", vec![probe_module()], consumer);
        let (summary, projection) = wakuwaku_tests::catch_up(&log, settings).await.unwrap();
        let store = projection.store();
        assert_eq!(sequences(store, keys), expected, "batch size {batch_size}");
        assert_eq!(summary.timers_fired, fired(&expected), "batch size {batch_size}");
        assert_eq!(store.stats().unwrap()[Stat::TimersFired], fired(&expected));
        let pending = store.timer_summary(None).unwrap();
        let set: std::collections::HashSet<(u64, i64)> =
            ticks.iter().filter_map(|tick| tick.timer.map(|timer| (tick.key, timer))).collect();
        assert_eq!(pending.pending, set.len() as u64 - fired(&expected), "the rest wait for a later clock");
        runs.push(sequences(store, keys));
    }
    assert!(runs.windows(2).all(|pair| pair[0] == pair[1]));
}

/// Two topics, one of them silent for its first 40 reads though the log
/// holds its history (the start-up race): the clock waits for it, so no
/// timer fires before an event of its time or earlier that the silent
/// topic still holds; every sequence matches the oracle. On the embedded
/// state and on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_across_two_topics_fire_nothing_early_when_a_topic_is_read_late() {
    timers_across_topics("ticks", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_across_two_topics_fire_nothing_early_on_postgres_too() {
    let Some(url) = postgres_url("timers with the state in PostgreSQL") else { return };
    timers_across_topics(&fresh_stream("ticks").replace('-', "_"), Some(url)).await;
}

async fn timers_across_topics(projection: &str, url: Option<String>) {
    let keys = 5u64;
    let ticks = scenario(keys, 240, 11);
    let expected = oracle(&ticks, 1);
    let dir = tempfile::tempdir().unwrap();
    let log = EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
    // Events alternate between the topics; each topic is in time order.
    for (topic, parity) in [("early", 0), ("late", 1)] {
        log.create_topic(topic, 1).await.unwrap();
        let records = ticks.iter().enumerate().filter(|(i, _)| i % 2 == parity).map(|(_, tick)| tick.record());
        log.append(topic, vec![(0, records.collect())]).await.unwrap();
    }
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
    let projection = host.projection().clone();
    let summary = host.finished().await.unwrap();
    assert!(silent_reads.load(Ordering::SeqCst) > 40, "`late` was never silent");
    assert_eq!(summary.order_violations, 0);
    assert_eq!(sequences(projection.store(), keys), expected);
    assert_eq!(summary.timers_fired, fired(&expected));
}

/// A `fire` call that fails (unrecoverable) is taken back, its timers go
/// to the dead-letter topic as one letter naming the key, the failure and
/// each timer, and the key goes on: its later events are applied, and the
/// other keys' timers fire. `/metrics` counts both, by module.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_fire_call_is_taken_back_and_its_timers_dead_lettered() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("ticks", 1).await.unwrap();
    let tick = |key: u64, at: i64, timer: Option<i64>, name: Option<&str>| {
        let body = json!({ "key": key, "at": BASE_MS + at, "timer": timer.map(|t| BASE_MS + t), "name": name });
        let mut record = json_record(TICK, key, body);
        let time = (BASE_MS + at).to_le_bytes().to_vec();
        record.headers.push(Header { name: header_name::EVENT_TIME.into(), value: time });
        record
    };
    let records =
        vec![tick(1, 100, Some(110), Some("fail-soon")), tick(2, 150, Some(160), None), tick(1, 200, None, None)];
    log.append("ticks", vec![(0, records)]).await.unwrap();
    let settings = host_settings(dir.path(), "ticks", "ticks", vec![probe_module()], ConsumerConfig::default());
    let host = Host::start_on(log.clone(), settings).await.unwrap();
    let (projection, metrics) = (host.projection().clone(), host.metrics().clone());
    let summary = host.finished().await.unwrap();
    let store = projection.store();
    let text = metrics.encode();
    let series = |name: &str| {
        text.lines()
            .find(|line| line.starts_with(&format!("{name}{{projection=\"ticks\",module=\"probe")))
            .map(|line| line.rsplit(' ').next().unwrap().to_owned())
    };
    assert_eq!(series("waku_timers_fired_total").as_deref(), Some("1"), "{text}");
    assert_eq!(series("waku_timers_dead_lettered_total").as_deref(), Some("1"), "{text}");
    let seq = |key: u64| -> Vec<String> {
        serde_json::from_slice(&store.get(&Key::int(key), "seq").unwrap().unwrap()).unwrap()
    };
    let at = |time: i64| (BASE_MS + time).to_string();
    assert_eq!(seq(1), [format!("e{}", at(100)), format!("e{}", at(200))], "the failed call's write is gone");
    assert_eq!(seq(2), [format!("e{}", at(150)), format!("t{}", at(160))]);
    assert_eq!((summary.timers_fired, summary.timers_dead_lettered), (1, 1), "{summary:?}");
    assert_eq!(store.stats().unwrap()[Stat::TimersDeadLettered], 1);
    assert_eq!(store.timer_summary(None).unwrap().pending, 0);

    let letters = wakuwaku::operations::dead_letter::list(&*log, "ticks", "ticks", store).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    let envelope = letter.envelope.as_ref().unwrap();
    assert_eq!((envelope.key.clone(), envelope.event_time), (Key::int(1u64), Some(BASE_MS + 110)));
    assert_eq!(letter.routed.event_type, "timer");
    let failure = letter.routed.failure.as_ref().unwrap();
    assert!(failure.message.contains("fire fails on cue"), "{failure:?}");
    let stored = log.read(projection.routed_topics().dlq(), letter.partition, letter.offset, 1).await.unwrap();
    let body: serde_json::Value = serde_json::from_slice(&stored[0].record.body).unwrap();
    assert_eq!(body, json!({ "timers": [{ "name": "fail-soon", "at": BASE_MS + 110, "payload_hex": "" }] }));
}
