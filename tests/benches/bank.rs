//! `cargo bench -p wakuwaku-tests --bench bank`: the bank projection on one
//! seeded workload, three ways, in one run:
//!
//! 1. **wasm**: the bank component through the host (plan, reduce, chunked
//!    calls, one commit per batch).
//! 2. **native**: the same handler code compiled natively, inside the same
//!    host (same planner, reduction, state and commits).
//! 3. **wasm per event**: the bank component called once per event in log
//!    order, without planning or reduction, with the same commits.
//! 4. **wasm, small batches**: as 1, with batches of 4096 instead of the
//!    default 65 536 (fewer events per key per batch to fold).
//! 5. **wasm, OpenTelemetry on**: as 1, exporting a span per batch, call
//!    spans and the consumer metrics over OTLP/HTTP to a receiver in this
//!    process that answers every request with 200 (`host/src/engine/telemetry.rs`).
//!
//! Each way consumes the same log into a fresh state store; each is checked
//! against the oracle, so a fast wrong answer cannot win. Prints events/s
//! and the ratios. `WAKU_BENCH_EVENTS` and `WAKU_BENCH_ACCOUNTS` resize the
//! workload (default 1 000 000 events over 10 000 accounts);
//! `WAKU_BENCH_ONLY=native` (or `wasm`, `per-event`, `wasm-small`, `wasm-otel`, several
//! separated by commas) runs only those ways, e.g. under a profiler.

use std::sync::Arc;
use std::time::Instant;

use rustc_hash::FxHashMap;
use wakuwaku::authoring::demo::{self, Oracle, WorkloadSpec};
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig};
use wakuwaku::engine::projection::Projection;
use wakuwaku::engine::telemetry::Telemetry;
use wakuwaku::event::EventHeaders;
use wakuwaku::key::Key;
use wakuwaku::sandbox::handler::{BatchBudget, HandlerModule, KeyScope, PayloadLimits};
use wakuwaku::storage::log::EventLog;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::state::{BatchCommit, StateStore};
use wakuwaku_tests::native::NativeModule;
use wakuwaku_tests::{bank_log, bank_module};

// The allocator the `waku` command uses, so figures match the demo.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The consumer's default batch size.
const BATCH: usize = 65_536;
const SMALL_BATCH: usize = 4096;
const ROUNDS: usize = 2;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing
    // useful either way: run only when benchmarking.
    if !std::env::args().any(|arg| arg == "--bench") {
        println!("bank bench: run with `cargo bench -p wakuwaku-tests --bench bank`");
        return;
    }
    // As the `waku` command does, so the figures match it.
    wakuwaku::platform::memory::prefer_small_pages();
    let collector = Collector::start();
    // SAFETY: no other thread runs yet (the collector's thread reads no
    // environment), and the telemetry way is the only reader.
    unsafe {
        for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("OTEL_")) {
            std::env::remove_var(name);
        }
        std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{}", collector.address));
    }
    let spec = WorkloadSpec {
        events: env_or("WAKU_BENCH_EVENTS", 1_000_000) as usize,
        accounts: env_or("WAKU_BENCH_ACCOUNTS", 10_000),
        seed: 42,
    };
    assert_eq!(BATCH, ConsumerConfig::default().batch_size, "the bench measures the default batch size");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let wasm = bank_module();
    let native: Arc<dyn HandlerModule> = Arc::new(NativeModule::<bank::Bank>::new("bank-native"));
    let (log, oracle) = runtime.block_on(bank_log(dir.path(), wasm.clone(), spec, 4));
    println!(
        "workload: {} events, {} accounts, 4 partitions, batch {BATCH}, {} workers; best of {ROUNDS} rounds",
        spec.events,
        spec.accounts,
        ConsumerConfig::default().workers
    );

    let only = std::env::var("WAKU_BENCH_ONLY").ok();
    let runs = |way: &str| only.as_deref().is_none_or(|only| only.split(',').any(|o| o.trim() == way));
    let mut best = [f64::MAX; 5];
    for round in 0..ROUNDS {
        let state = |name: &str| StateStore::open(&dir.path().join(format!("{name}-{round}.redb"))).unwrap();
        let host = |module: &Arc<dyn HandlerModule>, name, batch| {
            runtime.block_on(through_host(&log, module.clone(), state(name), &oracle, (batch, None)))
        };
        if runs("wasm") {
            best[0] = best[0].min(host(&wasm, "wasm", BATCH));
        }
        if runs("native") {
            best[1] = best[1].min(host(&native, "native", BATCH));
        }
        if runs("per-event") {
            best[2] = best[2].min(runtime.block_on(per_event(&log, wasm.clone(), state("per-event"), &oracle)));
        }
        if runs("wasm-small") {
            best[3] = best[3].min(host(&wasm, "wasm-small", SMALL_BATCH));
        }
        if runs("wasm-otel") {
            let telemetry = Telemetry::from_env("waku-embedded").unwrap().expect("an endpoint is set");
            let config = (BATCH, Some(telemetry.clone()));
            let secs = runtime.block_on(through_host(&log, wasm.clone(), state("wasm-otel"), &oracle, config));
            assert!(telemetry.shutdown(), "the last export finished in time");
            best[4] = best[4].min(secs);
        }
    }
    // A way left out (`WAKU_BENCH_ONLY`) prints nothing, nor any ratio it is in.
    let measured = |way: usize| best[way] < f64::MAX;
    let labels = [
        "wasm modules through the host:      ".to_owned(),
        "native handlers through the host:   ".to_owned(),
        "wasm, one call per event, no plan:  ".to_owned(),
        format!("wasm through the host, batch {SMALL_BATCH}: "),
        "wasm through the host, OTel on:     ".to_owned(),
    ];
    for (way, label) in labels.iter().enumerate().filter(|(way, _)| measured(*way)) {
        println!("{label} {:>12.0} events/s", spec.events as f64 / best[way]);
    }
    let ratios = [
        ("ratio native / wasm:                ".to_owned(), 0, 1),
        ("ratio wasm / wasm-per-event:        ".to_owned(), 2, 0),
        (format!("ratio batch {BATCH} / batch {SMALL_BATCH}:     "), 3, 0),
        ("ratio OTel on / off (time):         ".to_owned(), 4, 0),
    ];
    for (label, slower, faster) in ratios.iter().filter(|(_, a, b)| measured(*a) && measured(*b)) {
        println!("{label} {:>12.2}", best[*slower] / best[*faster]);
    }
    if measured(4) {
        println!("OTLP requests received: {}", collector.requests.load(std::sync::atomic::Ordering::Relaxed));
    }
}

fn assert_matches(oracle: &Oracle, module: &dyn HandlerModule, store: &StateStore, way: &str) {
    // The native module computes keys the same way as the component.
    let check = demo::check_projection(oracle, module, store).unwrap();
    assert!(check.matches(), "{way}: {}", check.report(5));
}

/// Consumes the whole log through the host; returns the seconds it took.
async fn through_host(
    log: &Arc<EmbeddedLog>,
    module: Arc<dyn HandlerModule>,
    store: StateStore,
    oracle: &Oracle,
    (batch_size, telemetry): (usize, Option<Telemetry>),
) -> f64 {
    let projection = Arc::new(Projection::new("bank", "accounts", vec![module.clone()], store).unwrap());
    let config = ConsumerConfig { batch_size, ..ConsumerConfig::default() };
    let started = Instant::now();
    Consumer::new(log.clone(), projection.clone(), config).with_telemetry(telemetry).catch_up().await.unwrap();
    let secs = started.elapsed().as_secs_f64();
    assert_matches(oracle, &*module, projection.store(), module.name());
    secs
}

/// One call per event in log order, no planning or reduction, partitions
/// one after another, one commit per batch; returns the seconds it took.
async fn per_event(log: &Arc<EmbeddedLog>, module: Arc<dyn HandlerModule>, store: StateStore, oracle: &Oracle) -> f64 {
    let started = Instant::now();
    let mut instance = module.instantiate().unwrap();
    for partition in 0..log.partitions("accounts").await.unwrap() {
        let end = log.end_offset("accounts", partition).await.unwrap();
        let mut position = 0;
        while position < end {
            let records = log.read("accounts", partition, position, BATCH).await.unwrap();
            let snapshot = Arc::new(store.reader().unwrap());
            let mut scopes: FxHashMap<Key, KeyScope> = FxHashMap::default();
            let budget = BatchBudget::new(&PayloadLimits::default());
            for stored in &records {
                let headers = EventHeaders::parse_stored(&stored.record.headers).unwrap();
                let scope = scopes.entry(headers.key.clone()).or_insert_with(|| {
                    KeyScope::new(headers.key, snapshot.clone(), PayloadLimits::default(), budget.clone())
                });
                let body = std::slice::from_ref(&stored.record.body);
                instance.handle(scope, headers.tag, body).unwrap();
            }
            position = records.last().unwrap().offset + 1;
            let mut commit = BatchCommit::default();
            for (key, scope) in scopes {
                let outcome = scope.into_outcome();
                commit.writes.push((key, outcome.writes));
                for (name, delta) in outcome.counters {
                    *commit.counter_deltas.entry(name).or_default() += delta;
                }
            }
            commit.positions.push(("accounts".into(), partition, position));
            drop(snapshot);
            store.commit(commit).unwrap();
        }
    }
    let secs = started.elapsed().as_secs_f64();
    assert_matches(oracle, &*module, &store, "wasm per event");
    secs
}

/// An OTLP/HTTP endpoint that reads each request and answers 200 with an
/// empty body (an empty export response), on a thread of its own.
struct Collector {
    address: std::net::SocketAddr,
    requests: Arc<std::sync::atomic::AtomicU64>,
}

impl Collector {
    fn start() -> Self {
        use std::io::{BufRead, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let requests = Arc::new(std::sync::atomic::AtomicU64::default());
        let counted = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let counted = counted.clone();
                std::thread::spawn(move || {
                    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                    let mut writer = stream;
                    loop {
                        let mut length = 0usize;
                        let mut line = String::new();
                        loop {
                            line.clear();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            let lower = line.to_ascii_lowercase();
                            if let Some(value) = lower.strip_prefix("content-length:") {
                                length = value.trim().parse().unwrap_or(0);
                            }
                            if line == "\r\n" {
                                break;
                            }
                        }
                        let mut body = vec![0; length];
                        if reader.read_exact(&mut body).is_err() {
                            return;
                        }
                        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let answer =
                            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                        if writer.write_all(answer.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { address, requests }
    }
}
