//! `cargo bench -p wakuwaku-tests --bench lifecycle`: what module lifecycle
//! costs, in one run.
//!
//! 1. **Cold start**: from loading the bank module to its first handled
//!    event, with an empty compile cache and with a warm one.
//! 2. **Hot swaps under load**: the bank projection follows a log with a
//!    backlog; first it runs untouched, then the module file is swapped
//!    between two versions again and again. Reported: the longest pause
//!    between two handled runs in each phase (a swap must not pause the
//!    consumer for more than a batch), how long a swap takes to apply, and
//!    the events lost or applied twice (checked against the oracle and the
//!    recorded calls).
//!
//! `WAKU_BENCH_SWAPS` (default 40) and `WAKU_BENCH_EVENTS` (default
//! 2 000 000) resize it.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku::engine::consumer::{CallObserver, Consumer, ConsumerConfig, RunCall};
use wakuwaku::engine::projection::Projection;
use wakuwaku::operations::lifecycle::{Library, Reloader};
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits, content_version};
use wakuwaku::storage::log::EventLog;
use wakuwaku::storage::state::StateStore;
use wakuwaku::storage::stats::Stat;
use wakuwaku_tests::{bank_log, bank_module, bank_variant, check_call_order, read_partition};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 4096;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn install(dir: &Path, bytes: &[u8]) {
    let temporary = dir.join(".bank.wasm.tmp");
    std::fs::write(&temporary, bytes).unwrap();
    std::fs::rename(temporary, dir.join("bank.wasm")).unwrap();
}

/// Records when each run was handled, and every call for the order check.
#[derive(Default)]
struct Clock {
    handled: Mutex<Vec<Instant>>,
    calls: Mutex<Vec<RunCall>>,
}

impl CallObserver for Clock {
    fn run_handled(&self, call: &RunCall) {
        self.handled.lock().unwrap().push(Instant::now());
        self.calls.lock().unwrap().push(call.clone());
    }
}

impl Clock {
    /// The longest gap between two handled runs inside [from, to).
    fn longest_pause(&self, from: Instant, to: Instant) -> Duration {
        let handled = self.handled.lock().unwrap();
        let inside: Vec<Instant> = handled.iter().copied().filter(|t| *t >= from && *t < to).collect();
        inside.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
    }
}

async fn cold_start(dir: &Path, cache: &Path) -> Duration {
    let spec = WorkloadSpec { events: 1, accounts: 1, seed: 1 };
    let run = dir.join(format!("run-{}", std::time::SystemTime::now().elapsed().unwrap_or_default().as_nanos()));
    std::fs::create_dir_all(run.join("modules")).unwrap();
    install(&run.join("modules"), &bank_variant(0));
    let (log, _) = bank_log(&run, bank_module(), spec, 1).await;
    let started = Instant::now();
    let store = StateStore::open(&run.join("bank.redb")).unwrap();
    let sandbox = Sandbox::new(SandboxLimits::default()).unwrap().with_compile_cache(cache);
    let library = Library::new(&run, "bank", store.clone(), sandbox);
    let (modules, _) = library.start(&run.join("modules"), false).unwrap();
    let projection = Arc::new(Projection::new("bank", "accounts", modules, store).unwrap());
    let summary = Consumer::new(log, projection, ConsumerConfig::default()).catch_up().await.unwrap();
    assert_eq!(summary.applied, 1);
    started.elapsed()
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return; // `cargo test` builds benches too; only run under `cargo bench`
    }
    // As the `waku` command does, so the figures match it.
    wakuwaku::platform::memory::prefer_small_pages();
    let dir = tempfile::tempdir().unwrap();

    // 1. Cold start.
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    for round in 0..3 {
        let cache = dir.path().join(format!("cache-{round}"));
        cold.push(cold_start(dir.path(), &cache).await);
        warm.push(cold_start(dir.path(), &cache).await);
    }
    let (cold, warm) = (cold.iter().min().unwrap().as_secs_f64(), warm.iter().min().unwrap().as_secs_f64());
    println!(
        "cold start to the first handled event: {:.0} ms compiling, {:.0} ms with a warm cache",
        cold * 1e3,
        warm * 1e3
    );
    println!("  ratio compiling / warm cache: {:.1}", cold / warm);

    // 2. Hot swaps under load.
    let swaps = env_or("WAKU_BENCH_SWAPS", 40);
    let events = env_or("WAKU_BENCH_EVENTS", 2_000_000);
    let root = dir.path().join("swaps");
    let modules_dir = root.join("modules");
    std::fs::create_dir_all(&modules_dir).unwrap();
    install(&modules_dir, &bank_variant(0));
    let store = StateStore::open(&root.join("bank.redb")).unwrap();
    let sandbox = Sandbox::new(SandboxLimits::default()).unwrap().with_compile_cache(&root.join("cache"));
    let library = Arc::new(Library::new(&root, "bank", store.clone(), sandbox));
    let (modules, _) = library.start(&modules_dir, false).unwrap();
    let module = modules[0].clone();
    let spec = WorkloadSpec { events, accounts: 10_000, seed: 42 };
    let (log, oracle) = bank_log(&root, module.clone(), spec, 2).await;
    let projection = Arc::new(Projection::new("bank", "accounts", modules, store).unwrap());
    let _reloader = Reloader::watch(library.clone(), projection.clone(), &modules_dir).unwrap();
    let clock = Arc::new(Clock::default());
    let config = ConsumerConfig { batch_size: BATCH, ..ConsumerConfig::default() };
    let consumer = Consumer::new(log.clone(), projection.clone(), config).with_observer(clock.clone());
    let progress = consumer.progress();
    let consuming = tokio::spawn(async move { consumer.catch_up().await.unwrap() });

    let steady_from = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let swaps_from = Instant::now();
    let mut apply_times = Vec::new();
    for swap in 0..swaps {
        let bytes = bank_variant(if swap % 2 == 0 { 1 } else { 0 });
        let version = content_version(&bytes);
        let written = Instant::now();
        install(&modules_dir, &bytes);
        while !projection.modules().iter().any(|m| m.version() == version) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        apply_times.push(written.elapsed());
    }
    let swaps_to = Instant::now();
    assert!(!progress.caught_up(), "the backlog ran out during the swaps; raise WAKU_BENCH_EVENTS");
    let summary = consuming.await.unwrap();
    let finished = Instant::now();

    let batches_per_sec = summary.batches as f64 / (finished - steady_from).as_secs_f64().max(1e-9);
    let steady = clock.longest_pause(steady_from, swaps_from);
    let swapping = clock.longest_pause(swaps_from, swaps_to);
    let batch = Duration::from_secs_f64(1.0 / batches_per_sec.max(1e-9));
    apply_times.sort();
    println!(
        "{swaps} swaps under load (batches of {BATCH}, {:.0} ms per batch on average): a swap applies {:.0} ms (median) after the file is written",
        batch.as_secs_f64() * 1e3,
        apply_times[apply_times.len() / 2].as_secs_f64() * 1e3,
    );
    let extra = swapping.saturating_sub(steady);
    println!(
        "  longest pause between handled runs: {:.1} ms steady, {:.1} ms while swapping (ratio {:.2}); the \
         swaps added {:.1} ms = {:.2} of an average batch",
        steady.as_secs_f64() * 1e3,
        swapping.as_secs_f64() * 1e3,
        swapping.as_secs_f64() / steady.as_secs_f64().max(1e-9),
        extra.as_secs_f64() * 1e3,
        extra.as_secs_f64() / batch.as_secs_f64().max(1e-9),
    );

    let check = demo::check_projection(&oracle, &*module, projection.store()).unwrap();
    let applied = projection.store().stats().unwrap()[Stat::Applied];
    let calls = clock.calls.lock().unwrap().clone();
    let mut order = Ok(());
    for partition in 0..2 {
        order = order.and(check_call_order(partition, &read_partition(&log, "accounts", partition).await, &calls));
    }
    println!(
        "  lost: {}, applied twice: {} (oracle {}, order {})",
        (events as u64).saturating_sub(applied),
        applied.saturating_sub(events as u64),
        if check.matches() { "matches" } else { "DIFFERS" },
        if order.is_ok() { "kept" } else { "BROKEN" },
    );
    assert!(check.matches() && order.is_ok() && applied == events as u64);
    let _ = log.end_offset("accounts", 0).await;
}
