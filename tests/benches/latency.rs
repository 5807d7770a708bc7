//! `cargo bench -p wakuwaku-tests --bench latency`: how long an event
//! waits between its append and the commit that applies it, for a host
//! following a topic at half the throughput it reaches catching up.
//!
//! 1. **The maximum**: the bank projection catches up on a seeded backlog
//!    (two partitions, the consumer's default batch size and workers);
//!    events per second, and the longest pause between two handled runs
//!    (no partition handling anything), in average batches: the steady
//!    state's stall, if there is one.
//! 2. **Half of it**: a fresh log and projection; a consumer follows the
//!    topic while a producer appends the same events, in the same
//!    partitions, at half that rate (an append per partition every
//!    [`TICK`]). An event's latency runs from the return of the append
//!    that wrote it to the first moment the consumer's committed position
//!    (its [`Progress`](wakuwaku::engine::progress::Progress), advanced after every
//!    commit, read every 100 µs) is past it. Reported: p50, p99 and the
//!    longest, also in average batches of the same run, and the oracle
//!    check of the followed projection.
//!
//! `WAKU_BENCH_EVENTS` (default 400 000) resizes it; the followed phase
//! lasts about twice as long as catching up. `WAKU_BENCH_RATE` (events/s)
//! offers that rate instead of half the maximum, to compare two builds at
//! the same load.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku::engine::consumer::{CallObserver, Consumer, ConsumerConfig, RunCall};
use wakuwaku::engine::projection::Projection;
use wakuwaku::storage::log::{EmbeddedLog, EventLog, Record};
use wakuwaku::storage::state::StateStore;
use wakuwaku_tests::paced::{Appended, append_at_rate, percentile};
use wakuwaku_tests::{bank_log, bank_module};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How often the producer appends.
const TICK: Duration = Duration::from_millis(5);
const PARTITIONS: u32 = 2;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// When each run was handled.
#[derive(Default)]
struct Handled(std::sync::Mutex<Vec<Instant>>);

impl CallObserver for Handled {
    fn run_handled(&self, _: &RunCall) {
        self.0.lock().unwrap().push(Instant::now());
    }
}

impl Handled {
    /// The longest gap between two handled runs.
    fn longest_pause(&self) -> Duration {
        let handled = self.0.lock().unwrap();
        handled.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
    }
}

/// A partition's committed positions over time, as a sampler saw them.
type Commits = Vec<(u64, Instant)>;

/// When the commit that took `partition` past `offset` was first seen.
fn committed_at(commits: &Commits, offset: u64) -> Option<Instant> {
    let index = commits.partition_point(|&(position, _)| position <= offset);
    commits.get(index).map(|&(_, at)| at)
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return; // `cargo test` builds benches too; only run under `cargo bench`
    }
    wakuwaku::platform::memory::prefer_small_pages();
    let events = env_or("WAKU_BENCH_EVENTS", 400_000);
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let spec = WorkloadSpec { events, accounts: 10_000, seed: 42 };

    // 1. The maximum: catching up on the backlog.
    let (source, oracle) = bank_log(&dir.path().join("source"), module.clone(), spec, PARTITIONS).await;
    let store = StateStore::open(&dir.path().join("max.redb")).unwrap();
    let projection = Arc::new(Projection::new("bank", "accounts", vec![module.clone()], store).unwrap());
    let handled = Arc::new(Handled::default());
    let consumer = Consumer::new(source.clone(), projection, ConsumerConfig::default()).with_observer(handled.clone());
    let started = Instant::now();
    let summary = consumer.catch_up().await.unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    let maximum = summary.applied as f64 / elapsed;
    // As the lifecycle benchmark counts it: the run's time per batch.
    let batch = elapsed / summary.batches as f64;
    let pause = handled.longest_pause().as_secs_f64();
    println!(
        "catching up: {maximum:.0} events/s ({} events, {} batches of {:.0} events, one per {:.1} ms on \
         average); longest pause between handled runs {:.1} ms = {:.2} average batches",
        summary.applied,
        summary.batches,
        summary.applied as f64 / summary.batches as f64,
        batch * 1e3,
        pause * 1e3,
        pause / batch
    );

    // 2. Following at half of it.
    let mut backlog: Vec<Vec<Record>> = Vec::new();
    for partition in 0..PARTITIONS {
        let stored = source.read("accounts", partition, 0, events).await.unwrap();
        backlog.push(stored.into_iter().map(|s| s.record).collect());
    }
    let log = Arc::new(EmbeddedLog::open(dir.path().join("followed/log.redb")).unwrap());
    log.create_topic("accounts", PARTITIONS).await.unwrap();
    let store = StateStore::open(&dir.path().join("followed.redb")).unwrap();
    let projection = Arc::new(Projection::new("bank", "accounts", vec![module.clone()], store).unwrap());
    let consumer = Consumer::new(log.clone(), projection.clone(), ConsumerConfig::default());
    let progress = consumer.progress();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let following = tokio::spawn(async move { consumer.follow(async { stop_rx.await.unwrap_or(()) }).await.unwrap() });

    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (progress, sampling) = (progress.clone(), sampling.clone());
        std::thread::spawn(move || {
            let mut commits: Vec<Commits> = vec![Vec::new(); PARTITIONS as usize];
            while sampling.load(Ordering::Relaxed) {
                let now = Instant::now();
                for partition in progress.partitions() {
                    let seen = &mut commits[partition.partition as usize];
                    if seen.last().is_none_or(|&(position, _)| position < partition.position) {
                        seen.push((partition.position, now));
                    }
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            commits
        })
    };

    let rate = std::env::var("WAKU_BENCH_RATE").ok().and_then(|v| v.parse().ok()).unwrap_or(maximum / 2.0);
    let (appends, produced) = append_at_rate(&*log, "accounts", &backlog, rate, TICK).await;
    let sent: Vec<usize> = backlog.iter().map(Vec::len).collect();
    while !progress.partitions().iter().zip(&sent).all(|(p, &sent)| p.position >= sent as u64) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let _ = stop_tx.send(());
    let summary = following.await.unwrap();
    sampling.store(false, Ordering::Relaxed);
    let commits = sampler.join().unwrap();

    let mut latencies = Vec::with_capacity(events);
    for Appended { partition, first, end, at } in appends {
        for offset in first..end {
            let committed = committed_at(&commits[partition as usize], offset).expect("every event committed");
            latencies.push(committed.saturating_duration_since(at));
        }
    }
    latencies.sort();
    let batch = produced.as_secs_f64() / summary.batches as f64;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (p50, p99, max) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99), *latencies.last().unwrap());
    println!(
        "following at {:.2} of it ({:.0} events/s offered, {:.0} reached; {} batches, one per {:.1} ms on average):",
        rate / maximum,
        rate,
        summary.applied as f64 / produced.as_secs_f64(),
        summary.batches,
        batch * 1e3
    );
    println!(
        "  append to commit: p50 {:.1} ms, p99 {:.1} ms, longest {:.1} ms; in average batches {:.2}, {:.2}, {:.2}",
        ms(p50),
        ms(p99),
        ms(max),
        p50.as_secs_f64() / batch,
        p99.as_secs_f64() / batch,
        max.as_secs_f64() / batch
    );
    let check = demo::check_projection(&oracle, &*module, projection.store()).unwrap();
    println!("  oracle {}", if check.matches() { "matches" } else { "DIFFERS" });
    assert!(check.matches() && summary.applied == events as u64, "{}", check.report(5));
}
