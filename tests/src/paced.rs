//! A producer at a steady rate, for the benchmarks that follow a log while
//! it is appended (`latency`, `window_latency`): each partition's backlog
//! appended in order, an append of every partition's due share every
//! tick, and when each append returned, which is where an event's latency
//! starts; and the percentiles they report.

use std::time::{Duration, Instant};

use wakuwaku::storage::log::{EventLog, Record};

/// One append of one partition: offsets `first..end`, returned `at`.
#[derive(Debug, Clone, Copy)]
pub struct Appended {
    pub partition: u32,
    pub first: u64,
    pub end: u64,
    pub at: Instant,
}

/// When the append holding `offset` of `partition` returned.
pub fn appended_at(appends: &[Appended], partition: u32, offset: u64) -> Option<Instant> {
    appends.iter().find(|a| a.partition == partition && (a.first..a.end).contains(&offset)).map(|a| a.at)
}

/// The value at `fraction` (0 to 1) of `sorted` latencies, nearest rank.
pub fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * fraction).round() as usize]
}

/// Appends `backlog[p]` to partition `p` of `topic`, `rate` events per
/// second in all (each partition by its share of the events), every
/// `tick`; returns the appends and how long it took.
pub async fn append_at_rate<L: EventLog>(
    log: &L,
    topic: &str,
    backlog: &[Vec<Record>],
    rate: f64,
    tick: Duration,
) -> (Vec<Appended>, Duration) {
    let total: usize = backlog.iter().map(Vec::len).sum();
    let mut appends = Vec::new();
    let producing = Instant::now();
    let mut ticks = tokio::time::interval(tick);
    let mut sent = vec![0usize; backlog.len()];
    while sent.iter().zip(backlog).any(|(sent, all)| *sent < all.len()) {
        ticks.tick().await;
        let due_total = rate * producing.elapsed().as_secs_f64();
        let mut batch = Vec::new();
        for (partition, all) in backlog.iter().enumerate() {
            let upto = ((due_total * all.len() as f64 / total as f64) as usize).min(all.len());
            if upto > sent[partition] {
                batch.push((partition as u32, all[sent[partition]..upto].to_vec()));
            }
        }
        if batch.is_empty() {
            continue;
        }
        let ranges: Vec<(u32, u64, u64)> = batch
            .iter()
            .map(|(partition, records)| {
                let first = sent[*partition as usize] as u64;
                (*partition, first, first + records.len() as u64)
            })
            .collect();
        log.append(topic, batch).await.unwrap();
        let at = Instant::now();
        for (partition, first, end) in ranges {
            sent[partition as usize] = end as usize;
            appends.push(Appended { partition, first, end, at });
        }
    }
    (appends, producing.elapsed())
}
