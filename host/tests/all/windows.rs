//! The guest SDK's windows through the real host (`docs/timers.md`,
//! "Windows (Rust SDK)"): the test module `tests/guests/windowed` puts each
//! `Click` of a key into tumbling, hopping and session windows, and emits
//! each closed window's total to the topic `totals`. `waku run` reads a
//! seeded workload from the embedded log, is SIGKILLed at random moments,
//! then runs to the end; what the topic holds is checked against an oracle
//! computed by sorting each key's clicks:
//!
//! - **every window's total exactly once**: one closed by the final clock
//!   (one past the latest event time of its partition, lowered by the
//!   allowed lateness) is on the topic once, with the clicks sorting puts
//!   in it; one the clock did not pass is not there;
//! - **out-of-order event times**: the log's clicks are out of event-time
//!   order across keys by up to [`DISORDER`] ms (each key's own clicks in
//!   order), which the host's `--allowed-lateness` absorbs;
//! - **late beyond the allowance**: stragglers, clicks far older than
//!   their key's first window, read once that window closed, join no
//!   window and are counted (`<windows>/late`), each once;
//! - `waku reset` and a run again emit the same totals.

use std::collections::BTreeMap;
use std::path::Path;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use wakuwaku::event::{Algebra, EventAtomicOrdering, EventHeaders, EventTypeTag, partition_for};
use wakuwaku::key::Key;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku::storage::state::StateStore;
use windowed::{HOPPING_HOP, HOPPING_SIZE, SESSION_GAP, SESSION_LATENESS, TUMBLING_LATENESS, TUMBLING_SIZE, Total};

use crate::common::{text, waku, windowed_wasm};
use crate::event_time::{BASE_MS, PARTITIONS};

/// The module's `Click`.
const CLICK: EventTypeTag = EventTypeTag::new(80);
/// How far out of event-time order the log's clicks are, at most.
const DISORDER: i64 = 80;
/// The host's `--allowed-lateness`, in ms: at least [`DISORDER`].
const ALLOWED_LATENESS: i64 = 100;
/// How far before its key's first click a straggler is.
const STRAGGLER_BACK: i64 = 10_000;

/// One click of the workload, in log order.
#[derive(Debug, Clone, Copy)]
struct Click {
    key: u64,
    at: i64,
    amount: i64,
    /// Far older than its key's first window, read once it closed.
    straggler: bool,
}

impl Click {
    fn record(&self) -> Record {
        let headers = EventHeaders {
            tag: CLICK,
            key: Key::int(self.key),
            ordering: EventAtomicOrdering::Relaxed,
            algebra: Algebra::NonAssociative,
            event_time: Some(self.at),
        };
        let body = serde_json::json!({ "key": self.key, "at": self.at, "amount": self.amount });
        Record { headers: headers.to_headers(), body: serde_json::to_vec(&body).unwrap() }
    }

    fn partition(&self) -> u32 {
        partition_for(Key::int(self.key).key_hash(), PARTITIONS)
    }
}

/// The windows of one kind a time falls in: `(start, end, close)`, the
/// window's timer at `close`.
fn fixed_windows(at: i64, size: i64, hop: i64, lateness: i64) -> Vec<(i64, i64, i64)> {
    let mut start = at.div_euclid(hop) * hop;
    let mut windows = Vec::new();
    while start > at - size {
        windows.push((start, start + size, start + size - 1 + lateness));
        start -= hop;
    }
    windows
}

/// A key's sessions over its clicks sorted by time: `(start, end, clicks,
/// sum)`, a session ending [`SESSION_GAP`] after its last click.
fn sessions(sorted: &[&Click]) -> Vec<(i64, i64, u64, i64)> {
    let mut sessions: Vec<(i64, i64, u64, i64)> = Vec::new();
    for click in sorted {
        match sessions.last_mut() {
            Some(last) if click.at < last.1 => {
                *last = (last.0, click.at + SESSION_GAP, last.2 + 1, last.3 + click.amount)
            }
            _ => sessions.push((click.at, click.at + SESSION_GAP, 1, click.amount)),
        }
    }
    sessions
}

/// The latest time at which a key's first window of each kind closes.
fn first_closes(sorted: &[&Click]) -> i64 {
    let first = sorted[0].at;
    let tumbling = fixed_windows(first, TUMBLING_SIZE, TUMBLING_SIZE, TUMBLING_LATENESS)[0].2;
    let hopping = fixed_windows(first, HOPPING_SIZE, HOPPING_HOP, 0).into_iter().map(|w| w.2).min().unwrap();
    let session = sessions(sorted)[0].1 - 1 + SESSION_LATENESS;
    tumbling.max(hopping).max(session)
}

/// `events` clicks of `keys` keys in log order (see the module docs), with
/// a straggler for each key but every fourth.
fn scenario(keys: u64, events: usize, seed: u64) -> Vec<Click> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut at = BASE_MS;
    let mut clicks: Vec<(i64, Click)> = (0..events)
        .map(|_| {
            at += rng.random_range(0..30);
            let click =
                Click { key: rng.random_range(0..keys), at, amount: rng.random_range(1..100), straggler: false };
            (at + rng.random_range(0..DISORDER), click)
        })
        .collect();
    clicks.sort_by_key(|(place, _)| *place);
    let mut clicks: Vec<Click> = clicks.into_iter().map(|(_, click)| click).collect();
    // Each key's own clicks in time order: its times, sorted, in its places.
    let mut times: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    clicks.iter().for_each(|click| times.entry(click.key).or_default().push(click.at));
    times.values_mut().for_each(|times| times.sort_unstable_by(|a, b| b.cmp(a)));
    clicks.iter_mut().for_each(|click| click.at = times.get_mut(&click.key).unwrap().pop().unwrap());
    // A straggler right after a click of its key that is later than the
    // key's first windows and read once the clock passed them all (the
    // latest time read before it, lowered by the allowed lateness): those
    // windows closed before that click, whatever the batches.
    let mut by_key: BTreeMap<u64, Vec<&Click>> = BTreeMap::new();
    clicks.iter().for_each(|click| by_key.entry(click.key).or_default().push(click));
    let first: BTreeMap<u64, (i64, i64)> = by_key
        .into_iter()
        .map(|(key, mut sorted)| {
            sorted.sort_by_key(|click| click.at);
            (key, (sorted[0].at, first_closes(&sorted)))
        })
        .collect();
    let mut wanted: BTreeMap<u64, bool> = first.keys().map(|&key| (key, key % 4 != 0)).collect();
    let mut latest: BTreeMap<u32, i64> = BTreeMap::new();
    let mut out = Vec::with_capacity(clicks.len() + wanted.len());
    for click in clicks {
        let read_before = latest.get(&click.partition()).copied();
        let (first_at, closes) = first[&click.key];
        let past = read_before.is_some_and(|latest| latest - ALLOWED_LATENESS > closes);
        let late = wanted[&click.key] && click.at > closes && past;
        out.push(click);
        if late {
            wanted.insert(click.key, false);
            let at = first_at - STRAGGLER_BACK;
            out.push(Click { key: click.key, at, amount: 1_000_000, straggler: true });
        }
        let latest = latest.entry(click.partition()).or_insert(i64::MIN);
        *latest = (*latest).max(click.at);
    }
    out
}

/// The totals the topic must hold, sorted, and how many stragglers there
/// are: each key's clicks but the stragglers, sorted by time, in the
/// windows of each kind; those whose timer the final clock of their
/// partition passed.
fn oracle(clicks: &[Click]) -> (Vec<Total>, u64) {
    let mut clock: BTreeMap<u32, i64> = BTreeMap::new();
    for click in clicks {
        let end = clock.entry(click.partition()).or_insert(i64::MIN);
        *end = (*end).max(click.at + 1 - ALLOWED_LATENESS);
    }
    let mut by_key: BTreeMap<u64, Vec<&Click>> = BTreeMap::new();
    clicks.iter().filter(|click| !click.straggler).for_each(|click| by_key.entry(click.key).or_default().push(click));
    let mut totals = Vec::new();
    for (key, mut sorted) in by_key {
        sorted.sort_by_key(|click| click.at);
        let clock = clock[&sorted[0].partition()];
        let mut fixed: BTreeMap<(&str, i64, i64, i64), (u64, i64)> = BTreeMap::new();
        for click in &sorted {
            let kinds = [
                ("tumbling", fixed_windows(click.at, TUMBLING_SIZE, TUMBLING_SIZE, TUMBLING_LATENESS)),
                ("hopping", fixed_windows(click.at, HOPPING_SIZE, HOPPING_HOP, 0)),
            ];
            for (windows, found) in kinds {
                for (start, end, close) in found {
                    let sum = fixed.entry((windows, start, end, close)).or_default();
                    *sum = (sum.0 + 1, sum.1 + click.amount);
                }
            }
        }
        let sessions = sessions(&sorted)
            .into_iter()
            .map(|(start, end, clicks, sum)| (("sessions", start, end, end - 1 + SESSION_LATENESS), (clicks, sum)));
        for ((windows, start, end, close), (clicks, sum)) in fixed.into_iter().chain(sessions) {
            if close < clock {
                totals.push(Total { windows: windows.to_owned(), key, start, end, clicks, sum });
            }
        }
    }
    totals.sort();
    (totals, clicks.iter().filter(|click| click.straggler).count() as u64)
}

/// Appends the clicks to topic `clicks` of `dir`'s log, each partition in
/// the clicks' order, and copies the module into `dir/modules`.
async fn publish(dir: &Path, clicks: &[Click]) {
    let modules = dir.join("modules");
    std::fs::create_dir_all(&modules).unwrap();
    std::fs::copy(windowed_wasm(), modules.join("windowed.wasm")).unwrap();
    let log = EmbeddedLog::open(dir.join("data/log.redb")).unwrap();
    log.create_topic("clicks", PARTITIONS).await.unwrap();
    let mut batches: Vec<(u32, Vec<Record>)> = (0..PARTITIONS).map(|p| (p, Vec::new())).collect();
    for click in clicks {
        batches[click.partition() as usize].1.push(click.record());
    }
    log.append("clicks", batches).await.unwrap();
}

/// The totals on the topic `totals` of `dir`'s log from offset `from` on,
/// sorted, and the topic's end offset.
async fn totals(dir: &Path, from: u64) -> (Vec<Total>, u64) {
    let log = EmbeddedLog::open(dir.join("data/log.redb")).unwrap();
    let end = log.end_offset("totals", 0).await.unwrap();
    let mut found = Vec::new();
    let mut offset = from;
    while offset < end {
        let read = log.read("totals", 0, offset, 1_000).await.unwrap();
        assert!(!read.is_empty(), "the topic ends at {offset}, below its end offset {end}");
        offset += read.len() as u64;
        found.extend(read.into_iter().map(|stored| serde_json::from_slice::<Total>(&stored.record.body).unwrap()));
    }
    found.sort();
    (found, end)
}

/// The projection's `<windows>/late` counters.
fn late_counts(dir: &Path) -> [i128; 3] {
    let store = StateStore::open(&dir.join("data/projections/windows.redb")).unwrap();
    let counters = store.counters().unwrap();
    let counter = |name: String| counters.iter().find(|(n, _)| *n == name).map_or(0, |(_, value)| *value);
    ["tumbling", "hopping", "sessions"].map(|windows| counter(format!("{windows}/late")))
}

fn run_args(batch_size: &str) -> Vec<&str> {
    vec![
        "run",
        "--data",
        "data",
        "--projection",
        "windows",
        "--topic",
        "clicks",
        "--modules",
        "modules",
        "--until-caught-up",
        "--batch-size",
        batch_size,
        "--create-emit-topics",
        "1",
        "--allowed-lateness",
        "100ms",
    ]
}

/// SIGKILL at random moments while windows are open, then a run to the
/// end: the topic holds every closed window's total once, as sorting
/// gives it, and the stragglers were counted once each; then `waku reset`
/// and a run with other batches emit the same totals again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_through_the_host_emit_each_total_once_across_kills_and_count_the_late() {
    let trials: u64 = std::env::var("WAKU_CRASH_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    let dir = tempfile::tempdir().unwrap();
    let clicks = scenario(10, 3_000, 49);
    let (expected, stragglers) = oracle(&clicks);
    assert!(stragglers >= 3, "the workload has too few stragglers: {stragglers}");
    assert!(expected.iter().any(|t| t.windows == "sessions") && expected.len() > 200, "{}", expected.len());
    let disorder = clicks.windows(2).filter(|pair| pair[1].at < pair[0].at && !pair[1].straggler).count();
    assert!(disorder > 100, "the log is hardly out of order: {disorder} inversions");
    publish(dir.path(), &clicks).await;

    let args = run_args("16");
    let killed = crate::common::kill_runs_at_random(dir.path(), &args, trials, 49);
    assert!(killed > 0, "no run was killed mid-way");
    let last = waku(&args, dir.path());
    assert!(last.status.success(), "{}", text(&last.stderr));
    let (found, end) = totals(dir.path(), 0).await;
    assert_eq!(found.len(), expected.len(), "after {killed} kills, a total was lost or emitted twice");
    assert_eq!(found, expected, "after {killed} kills");
    assert_eq!(late_counts(dir.path()), [i128::from(stragglers); 3], "each straggler counted once per kind");

    let reset = waku(
        &["reset", "--data", "data", "--projection", "windows", "--topic", "clicks", "--to", "earliest", "--yes"],
        dir.path(),
    );
    assert!(reset.status.success(), "{}", text(&reset.stderr));
    let again = waku(&run_args("1000"), dir.path());
    assert!(again.status.success(), "{}", text(&again.stderr));
    let (found, _) = totals(dir.path(), end).await;
    assert_eq!(found, expected, "a reset emitted other totals");
    assert_eq!(late_counts(dir.path()), [i128::from(stragglers); 3]);
}
