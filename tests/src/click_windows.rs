//! Tumbling, hopping and session windows through the real host, the same
//! scenario for each SDK's windowed module (`tests/guests/windows-py`,
//! `tests/guests/windows-ts`; each declares the windows below): seeded
//! clicks of 8 keys in time order over 2 partitions of the embedded log,
//! and every window's total emitted to `totals` equal to an oracle
//! computed by sorting (each key's clicks put in the windows of each kind,
//! those whose close, `end - 1 + lateness`, is below the partition's clock
//! at the end of the log: one past its latest click). The windows still
//! open wait as timers, and nothing is late.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::event::{EventTypeTag, Header, header_name, partition_for};
use wakuwaku::key::Key;
use wakuwaku::sandbox::handler::HandlerModule;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku::storage::stats::Stat;

use crate::{catch_up, host_settings, json_record};

/// Runs the scenario through `module` (a module of the windows below) and
/// checks every total it emits against the oracle.
pub async fn emit_what_sorting_gives(module: Arc<dyn HandlerModule>) {
    let (keys, partitions) = (8u64, 2u32);
    let clicks = clicks(keys, 400, 11);
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("clicks", partitions).await.unwrap();
    let mut by_partition: BTreeMap<u32, Vec<Record>> = BTreeMap::new();
    for click in &clicks {
        by_partition.entry(partition(click.user, partitions)).or_default().push(click.record());
    }
    log.append("clicks", by_partition.into_iter().collect()).await.unwrap();

    let consumer = ConsumerConfig { batch_size: 64, ..ConsumerConfig::default() };
    let settings = host_settings(dir.path(), "clicks", "clicks", vec![module], consumer);
    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!(summary.applied, clicks.len() as u64, "{summary:?}");

    let expected = oracle(&clicks, partitions);
    assert!(expected.iter().any(|total| total.kind == 2) && expected.len() > 100, "a scenario worth checking");
    let end = log.end_offset("totals", 0).await.unwrap();
    let mut emitted: Vec<Total> = log
        .read("totals", 0, 0, end as usize)
        .await
        .unwrap()
        .into_iter()
        .map(|stored| serde_json::from_slice(&stored.record.body).unwrap())
        .collect();
    emitted.sort();
    assert_eq!(emitted, expected);
    assert_eq!(summary.timers_fired, projection.store().stats().unwrap()[Stat::TimersFired]);
    assert!(summary.timers_fired > 0);
    let pending = projection.store().timer_summary(None).unwrap().pending;
    assert!(pending > 0, "the windows still open wait for a later clock");
    let reader = projection.store().reader().unwrap();
    for key in 0..keys {
        assert_eq!(reader.get(&Key::int(key), "late").unwrap(), None, "key {key}: in time order, nothing is late");
    }
}

const CLICK: EventTypeTag = EventTypeTag::new(1);
const BASE_MS: i64 = 1_796_169_600_000;
/// The windows' size (tumbling and hopping), as the modules declare it.
const SIZE: i64 = 60_000;
/// The hopping windows' hop.
const HOP: i64 = 20_000;
/// The sessions' gap.
const GAP: i64 = 15_000;
/// The lenient tumbling windows' allowed lateness.
const LATENESS: i64 = 30_000;

#[derive(Debug, Clone, Copy)]
pub struct Click {
    pub user: u64,
    pub at: i64,
    pub amount: i64,
}

impl Click {
    pub fn record(&self) -> Record {
        let mut record =
            json_record(CLICK, self.user, json!({ "user": self.user, "at": self.at, "amount": self.amount }));
        record.headers.push(Header { name: header_name::EVENT_TIME.into(), value: self.at.to_le_bytes().to_vec() });
        record
    }
}

/// A window's total as the module emits it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub struct Total {
    pub kind: u8,
    pub user: u64,
    pub start: i64,
    pub end: i64,
    pub total: i64,
}

pub fn partition(user: u64, partitions: u32) -> u32 {
    partition_for(Key::int(user).key_hash(), partitions)
}

/// Seeded clicks of `keys` keys in time order, several of one time,
/// 0 to 15 s apart (so sessions of a 15 s gap both end and go on).
pub fn clicks(keys: u64, count: usize, seed: u64) -> Vec<Click> {
    let mut state = seed;
    let mut next = move |below: u64| {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % below
    };
    let mut at = BASE_MS;
    (0..count)
        .map(|_| {
            at += next(4) as i64 * 1_000 * next(6) as i64;
            Click { user: next(keys), at, amount: next(100) as i64 }
        })
        .collect()
}

/// The totals sorting gives: each key's clicks by time in the windows
/// of each kind, those closing below its partition's final clock.
pub fn oracle(clicks: &[Click], partitions: u32) -> Vec<Total> {
    let mut clock: BTreeMap<u32, i64> = BTreeMap::new();
    for click in clicks {
        let end = clock.entry(partition(click.user, partitions)).or_insert(i64::MIN);
        *end = (*end).max(click.at + 1);
    }
    let mut sums: BTreeMap<(u8, u64, i64, i64), i64> = BTreeMap::new();
    let mut by_key: BTreeMap<u64, Vec<Click>> = BTreeMap::new();
    for click in clicks {
        by_key.entry(click.user).or_default().push(*click);
        let tumbling = click.at.div_euclid(SIZE) * SIZE;
        *sums.entry((0, click.user, tumbling, tumbling + SIZE)).or_default() += click.amount;
        *sums.entry((3, click.user, tumbling, tumbling + SIZE)).or_default() += click.amount;
        let last = click.at.div_euclid(HOP) * HOP;
        for start in (0..SIZE / HOP).map(|back| last - back * HOP) {
            *sums.entry((1, click.user, start, start + SIZE)).or_default() += click.amount;
        }
    }
    for (user, mut events) in by_key {
        events.sort_by_key(|click| click.at);
        let mut sessions: Vec<(i64, i64, i64)> = Vec::new();
        for click in events {
            match sessions.last_mut() {
                Some((_, last, total)) if click.at < *last + GAP => (*last, *total) = (click.at, *total + click.amount),
                _ => sessions.push((click.at, click.at, click.amount)),
            }
        }
        for (start, last, total) in sessions {
            sums.insert((2, user, start, last + GAP), total);
        }
    }
    let mut totals: Vec<Total> = sums
        .into_iter()
        .filter(|((kind, user, _, end), _)| {
            let lateness = if *kind == 3 { LATENESS } else { 0 };
            end - 1 + lateness < clock[&partition(*user, partitions)]
        })
        .map(|((kind, user, start, end), total)| Total { kind, user, start, end, total })
        .collect();
    totals.sort();
    totals
}
