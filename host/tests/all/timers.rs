//! Timers through the `waku` binary (`docs/timers.md`), with the probe's
//! `Tick` (tag 70): each event appends `e<at>` to its key's `seq` and may
//! set a timer, whose firing appends `t<at>`. Each run is checked against
//! an oracle computed by sorting: a key's events and the timers they set,
//! by time, an event before a timer of its time; a timer fires once the
//! partition's clock passed it (at the end of the log: one past the latest
//! event time of its partition index).
//!
//! - SIGKILL at random moments while timers are pending, then a run to
//!   the end: every key's sequence is the oracle's, so no timer was lost
//!   or fired twice (one topic, whose clock the host keeps itself, and two
//!   topics, whose clock is the release stage's);
//! - `waku reset` then a run again fires the same sequence, and `waku
//!   status` shows the timers left pending and the earliest of them;
//! - a shadow rebuild (`waku rebuild`), once promoted, fired the same
//!   sequence;
//! - on the embedded state and on PostgreSQL;
//! - `waku test` reports the timers fired and pending.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use wakuwaku::event::{Algebra, EventAtomicOrdering, EventHeaders, EventTypeTag, partition_for};
use wakuwaku::key::Key;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku::storage::state::StateStore;
use wakuwaku::storage::state::postgres::PostgresStore;
use wakuwaku::storage::stats::Stat;

use crate::common::servers::{fresh_stream, postgres_url};
use crate::common::{probe_wasm, text, variant_of, waku};
use crate::event_time::{BASE_MS, PARTITIONS, probe};

/// The probe's `Tick`.
const TICK: EventTypeTag = EventTypeTag::new(70);

/// One event: its key, its time and the timer it sets.
#[derive(Debug, Clone, Copy)]
struct Tick {
    key: u64,
    at: i64,
    timer: Option<i64>,
}

impl Tick {
    fn body(&self) -> serde_json::Value {
        serde_json::json!({ "key": self.key, "at": self.at, "timer": self.timer })
    }

    fn record(&self) -> Record {
        let headers = EventHeaders {
            tag: TICK,
            key: Key::int(self.key),
            ordering: EventAtomicOrdering::Relaxed,
            algebra: Algebra::NonAssociative,
            event_time: Some(self.at),
        };
        Record { headers: headers.to_headers(), body: serde_json::to_vec(&self.body()).unwrap() }
    }
}

/// `events` events of `keys` keys in time order, several of one time,
/// about half setting a timer 1 to 60 ms after their time.
fn scenario(keys: u64, events: usize, seed: u64) -> Vec<Tick> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut at = BASE_MS;
    (0..events)
        .map(|_| {
            at += rng.random_range(0..4) * 5;
            let key = rng.random_range(0..keys);
            let timer = rng.random_bool(0.5).then(|| at + rng.random_range(1..60));
            Tick { key, at, timer }
        })
        .collect()
}

/// What each key's `seq` must read (see the module docs).
fn oracle(ticks: &[Tick]) -> BTreeMap<u64, Vec<String>> {
    let partition_of = |key: u64| partition_for(Key::int(key).key_hash(), PARTITIONS);
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

/// Appends the ticks to `topics` in `dir`'s log: tick `i` to topic
/// `i % topics.len()`, each partition in time order.
async fn publish(dir: &Path, topics: &[&str], ticks: &[Tick]) {
    let log = EmbeddedLog::open(dir.join("data/log.redb")).unwrap();
    for (index, topic) in topics.iter().enumerate() {
        log.create_topic(topic, PARTITIONS).await.unwrap();
        let mut batches: Vec<(u32, Vec<Record>)> = (0..PARTITIONS).map(|p| (p, Vec::new())).collect();
        for tick in ticks.iter().skip(index).step_by(topics.len()) {
            batches[partition_for(Key::int(tick.key).key_hash(), PARTITIONS) as usize].1.push(tick.record());
        }
        log.append(topic, batches).await.unwrap();
    }
}

/// Where a run keeps the projection's state: the data directory, or the
/// PostgreSQL database of this URL; and the projection's name.
struct Target {
    projection: String,
    postgres: Option<String>,
}

impl Target {
    /// The flags naming the projection (and its state) after `command`.
    fn args<'a>(&'a self, command: &'a str, topics: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![command, "--data", "data", "--projection", &self.projection];
        for topic in topics {
            args.extend(["--topic", topic]);
        }
        if let Some(url) = &self.postgres {
            args.extend(["--state", url]);
        }
        args
    }

    fn store(&self, dir: &Path) -> StateStore {
        match &self.postgres {
            None => StateStore::open(&dir.join(format!("data/projections/{}.redb", self.projection))).unwrap(),
            Some(url) => StateStore::from_backend(PostgresStore::connect(url, &self.projection).unwrap()),
        }
    }
}

fn run_args(target: &Target, topics: &[&str]) -> Vec<String> {
    let args: Vec<String> = target
        .args("run", topics)
        .into_iter()
        .chain(["--modules", "modules"])
        .chain(["--until-caught-up", "--batch-size", "16", "--create-emit-topics", "1"])
        .map(str::to_owned)
        .collect();
    args
}

/// Each key's `seq`, and the statistics, of the projection in `dir`.
fn found(target: &Target, dir: &Path, keys: u64) -> (BTreeMap<u64, Vec<String>>, u64, u64) {
    let store = target.store(dir);
    let seqs = (0..keys)
        .filter_map(|key| {
            let seq = store.get(&Key::int(key), "seq").unwrap()?;
            Some((key, serde_json::from_slice(&seq).unwrap()))
        })
        .collect();
    let pending = store.timer_summary(None).unwrap().pending;
    (seqs, store.stats().unwrap()[Stat::TimersFired], pending)
}

fn fired(expected: &BTreeMap<u64, Vec<String>>) -> u64 {
    expected.values().flatten().filter(|item| item.starts_with('t')).count() as u64
}

/// Kills `waku run` over `topics` at random moments (SIGKILL), `trials`
/// times, then runs it to the end; checks the oracle; then `waku reset`
/// and a run again fire the same sequence.
async fn killed_then_reset(topics: &[&str], seed: u64, target: Target) {
    let trials: u64 = std::env::var("WAKU_CRASH_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    let dir = tempfile::tempdir().unwrap();
    probe(dir.path());
    let keys = 12;
    let ticks = scenario(keys, 3000, seed);
    let expected = oracle(&ticks);
    publish(dir.path(), topics, &ticks).await;
    let args = run_args(&target, topics);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let killed = crate::common::kill_runs_at_random(dir.path(), &args, trials, seed);
    assert!(killed > 0, "no run was killed mid-way");
    let last = waku(&args, dir.path());
    assert!(last.status.success(), "{}", text(&last.stderr));
    let (seqs, _, pending) = found(&target, dir.path(), keys);
    assert_eq!(seqs, expected, "after {killed} kills, a timer was lost, fired twice or out of its place");
    let set: std::collections::HashSet<(u64, i64)> =
        ticks.iter().filter_map(|tick| tick.timer.map(|timer| (tick.key, timer))).collect();
    assert_eq!(pending, set.len() as u64 - fired(&expected), "the timers past the clock are pending");

    let mut reset = target.args("reset", topics);
    reset.extend(["--to", "earliest", "--yes"]);
    let out = waku(&reset, dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let again = waku(&args, dir.path());
    assert!(again.status.success(), "{}", text(&again.stderr));
    let (seqs, timers_fired, _) = found(&target, dir.path(), keys);
    assert_eq!(seqs, expected, "a reset fired another sequence");
    assert_eq!(timers_fired, fired(&expected), "counted once each since the reset");

    // `waku status` shows the pending timers and the earliest of them.
    let status = target.args("status", topics);
    let out = waku(&status, dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let fired_at: std::collections::HashSet<(u64, i64)> = expected
        .iter()
        .flat_map(|(key, seq)| seq.iter().filter_map(move |item| Some((*key, item.strip_prefix('t')?.parse().ok()?))))
        .collect();
    let next = set.iter().filter(|timer| !fired_at.contains(timer)).map(|(_, at)| *at).min().unwrap();
    let line = format!("timers: {pending} pending, the next due at {next} ms");
    assert!(text(&out.stdout).contains(&line), "{line} not in {}", text(&out.stdout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_host_with_timers_pending_loses_none_and_fires_none_twice_and_a_reset_fires_the_same() {
    killed_then_reset(&["a"], 49, Target { projection: "ticks".into(), postgres: None }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_host_with_timers_pending_over_two_topics_loses_none_and_fires_none_twice() {
    killed_then_reset(&["a", "b"], 50, Target { projection: "ticks".into(), postgres: None }).await;
}

/// The same with the state (timers among it) in PostgreSQL, over one
/// topic and over two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_host_with_timers_pending_on_postgres_loses_none_and_fires_none_twice() {
    let Some(url) = postgres_url("timers killed with the state in PostgreSQL") else { return };
    for (topics, seed) in [(&["a"][..], 51), (&["a", "b"][..], 52)] {
        let projection = fresh_stream("ticks").replace('-', "_");
        killed_then_reset(topics, seed, Target { projection, postgres: Some(url.clone()) }).await;
    }
}

/// A shadow rebuild with a new version of the probe (the same logic) over
/// one topic and over two: once promoted, the projection's timers fired
/// in the same places as the first run's, each counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_fires_the_same_timers_in_the_same_places() {
    use wakuwaku::operations::host::{StateSettings, open_state};
    for (topics, seed) in [(&["a"][..], 53), (&["a", "b"][..], 54)] {
        let dir = tempfile::tempdir().unwrap();
        probe(dir.path());
        std::fs::create_dir_all(dir.path().join("new")).unwrap();
        std::fs::write(dir.path().join("new/probe.wasm"), variant_of(probe_wasm())).unwrap();
        let keys = 12;
        let ticks = scenario(keys, 3000, seed);
        let expected = oracle(&ticks);
        publish(dir.path(), topics, &ticks).await;
        let target = Target { projection: "ticks".into(), postgres: None };
        let args = run_args(&target, topics);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let first = waku(&args, dir.path());
        assert!(first.status.success(), "{}", text(&first.stderr));
        assert_eq!(found(&target, dir.path(), keys).0, expected, "{topics:?}: the first run");

        let mut rebuild = target.args("rebuild", topics);
        rebuild.extend(["--modules", "new"]);
        let asked = waku(&rebuild, dir.path());
        assert!(asked.status.success(), "{}", text(&asked.stderr));
        let following: Vec<&str> = args.iter().copied().filter(|arg| *arg != "--until-caught-up").collect();
        assert!(crate::rebuild::follow_until_promoted(dir.path(), &following), "{topics:?}: never promoted");
        let store = open_state(&dir.path().join("data"), &StateSettings::Embedded, "ticks").unwrap();
        let seqs: BTreeMap<u64, Vec<String>> = (0..keys)
            .filter_map(|key| Some((key, serde_json::from_slice(&store.get(&Key::int(key), "seq").unwrap()?).unwrap())))
            .collect();
        assert_eq!(seqs, expected, "{topics:?}: the rebuild fired another sequence");
        assert_eq!(store.stats().unwrap()[Stat::TimersFired], fired(&expected), "{topics:?}: counted once each");
    }
}

/// `waku test` fires timers as `waku run` does, from the file's event
/// times, and reports them: fired and pending, in its report and in the
/// stored outcome.
#[test]
fn waku_test_reports_the_timers_fired_and_pending() {
    let dir = tempfile::tempdir().unwrap();
    let ticks = [
        Tick { key: 1, at: BASE_MS, timer: Some(BASE_MS + 5) },
        Tick { key: 1, at: BASE_MS + 10, timer: Some(BASE_MS + 100) },
        Tick { key: 2, at: BASE_MS + 20, timer: None },
    ];
    let lines: Vec<String> =
        ticks.iter().map(|tick| serde_json::json!({ "type": "Tick", "body": tick.body() }).to_string()).collect();
    std::fs::write(dir.path().join("ticks.jsonl"), lines.join("\n")).unwrap();
    let probe = probe_wasm().display().to_string();
    let out = waku(&["test", &probe, "ticks.jsonl", "--expect", "expected.json", "--update"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    assert!(report.contains("timers: 1 fired, 0 dead-lettered, 1 pending"), "{report}");
    let outcome: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("expected.json")).unwrap()).unwrap();
    assert_eq!(outcome["timers"], serde_json::json!({ "fired": 1, "dead_lettered": 0, "pending": 1 }), "{outcome}");
    let seq = &outcome["keys"]["1"]["state"]["seq"];
    let expected = [format!("e{BASE_MS}"), format!("t{}", BASE_MS + 5), format!("e{}", BASE_MS + 10)];
    assert_eq!(seq, &serde_json::json!(expected), "{outcome}");
}
