//! `cargo bench -p wakuwaku-tests --bench window_latency`: how long a
//! window's result waits after the projection's clock passed the window's
//! end, for a host following Nexmark's query 7 (`examples/nexmark`: the
//! highest bid per 10 s tumbling window, keyed by window) while a producer
//! appends the stream.
//!
//! The stream is Nexmark's (`wakuwaku::authoring::nexmark`), published to a
//! source log to get each record's key and event time as `waku publish`
//! gives them, then appended again to a fresh log at `WAKU_BENCH_RATE`
//! events/s (default 100 000; an append per partition every [`TICK`]),
//! which a consumer follows. A window's bids are one key's, so one
//! partition's; that partition's clock passes the window's end when it
//! reads its first record of an event time at or past the end (Nexmark's
//! clock: persons and auctions move it too). A result's latency runs from
//! the return of the append that wrote that record to the moment the
//! result is first seen on `nexmark-q7` (its end offset, read every
//! 100 µs): firing the timer, the call, the commit and the outbox's append.
//! Reported: p50, p99 and the longest, over every window whose end the
//! stream passed.
//!
//! `WAKU_BENCH_EVENTS` (default 1 000 000) and `WAKU_BENCH_EVENT_RATE`
//! (events per second of event time, default 200: with 1 000 000 events,
//! 5 000 s of event time, 500 windows) resize it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use wakuwaku::authoring::nexmark::{self, HighestBid, NexmarkSpec, Q7_SIZE_MS, Topic};
use wakuwaku::authoring::publish;
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig};
use wakuwaku::engine::projection::{Projection, load_module_file};
use wakuwaku::event::{EventHeaders, partition_for};
use wakuwaku::key::Key;
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
use wakuwaku::storage::log::{EmbeddedLog, EventLog, Record};
use wakuwaku::storage::state::StateStore;
use wakuwaku_tests::paced::{append_at_rate, appended_at, percentile};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How often the producer appends.
const TICK: Duration = Duration::from_millis(5);
const PARTITIONS: u32 = 4;
const RESULTS: &str = "nexmark-q7";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return; // `cargo test` builds benches too; only run under `cargo bench`
    }
    wakuwaku::platform::memory::prefer_small_pages();
    let spec = NexmarkSpec {
        events: env_or("WAKU_BENCH_EVENTS", 1_000_000),
        rate: env_or("WAKU_BENCH_EVENT_RATE", 200) as u32,
        seed: 7,
        partitions: PARTITIONS,
    };
    let rate = env_or("WAKU_BENCH_RATE", 100_000) as f64;
    let dir = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::new(SandboxLimits::default()).unwrap();
    let module = load_module_file(&sandbox, &wakuwaku_tests::guest_wasm("examples/nexmark")).unwrap();

    // The stream as `waku publish` writes it, read back per partition.
    let source = EmbeddedLog::open(dir.path().join("source.redb")).unwrap();
    let input = Topic::Q7.name();
    source.create_topic(input, PARTITIONS).await.unwrap();
    let events = nexmark::generate(spec);
    let outgoing = nexmark::outgoing(&*module, &events, Topic::Q7).unwrap();
    publish::publish(&source, input, module.clone(), outgoing, None, 2).await.unwrap();
    let mut backlog: Vec<Vec<Record>> = Vec::new();
    for partition in 0..PARTITIONS {
        let end = source.end_offset(input, partition).await.unwrap();
        let stored = source.read(input, partition, 0, end as usize).await.unwrap();
        backlog.push(stored.into_iter().map(|s| s.record).collect());
    }
    let times: Vec<Vec<i64>> = backlog
        .iter()
        .map(|records| {
            records.iter().map(|r| EventHeaders::parse_stored(&r.headers).unwrap().event_time.expect("timed")).collect()
        })
        .collect();

    // A consumer following a fresh log.
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic(input, PARTITIONS).await.unwrap();
    log.create_topic(RESULTS, 1).await.unwrap();
    let store = StateStore::open(&dir.path().join("q7.redb")).unwrap();
    let projection = Arc::new(Projection::new(RESULTS, input, vec![module], store).unwrap());
    let consumer = Consumer::new(log.clone(), projection, ConsumerConfig::default());
    let progress = consumer.progress();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let following = tokio::spawn(async move { consumer.follow(async { stop_rx.await.unwrap_or(()) }).await.unwrap() });

    // When each result was first seen: (end offset, when).
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (log, sampling) = (log.clone(), sampling.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let mut seen: Vec<(u64, Instant)> = Vec::new();
            while sampling.load(Ordering::Relaxed) {
                let end = runtime.block_on(log.end_offset(RESULTS, 0)).unwrap();
                if seen.last().is_none_or(|&(before, _)| before < end) {
                    seen.push((end, Instant::now()));
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            seen
        })
    };

    let (appends, produced) = append_at_rate(&*log, input, &backlog, rate, TICK).await;
    let sent: Vec<usize> = backlog.iter().map(Vec::len).collect();
    while !progress.partitions().iter().zip(&sent).all(|(p, &sent)| p.position >= sent as u64) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // the last commits' outbox
    let _ = stop_tx.send(());
    let summary = following.await.unwrap();
    sampling.store(false, Ordering::Relaxed);
    let seen = sampler.join().unwrap();

    let end = log.end_offset(RESULTS, 0).await.unwrap();
    let results = log.read(RESULTS, 0, 0, end as usize).await.unwrap();
    let mut latencies = Vec::new();
    let mut unpassed = 0;
    let mut by_start: BTreeMap<i64, u64> = BTreeMap::new();
    for stored in &results {
        let result: HighestBid = serde_json::from_slice(&stored.record.body).unwrap();
        *by_start.entry(result.start).or_default() += 1;
        let partition = partition_for(Key::int(u64::try_from(result.start).unwrap()).key_hash(), PARTITIONS) as usize;
        // The first record of the window's partition at or past its end: the evidence.
        let Some(evidence) = times[partition].iter().position(|&t| t >= result.start + Q7_SIZE_MS) else {
            unpassed += 1; // passed only by the end offset's evidence
            continue;
        };
        let appended = appended_at(&appends, partition as u32, evidence as u64).expect("every record appended");
        let index = seen.partition_point(|&(end, _)| end <= stored.offset);
        let first_seen = seen.get(index).expect("every result seen").1;
        latencies.push(first_seen.saturating_duration_since(appended));
    }
    assert!(by_start.values().all(|&n| n == 1), "a window emitted twice");
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "query 7 followed at {rate:.0} events/s offered ({:.0} reached; {} events, {} batches, {} windows closed, \
         {unpassed} by the end offset alone):",
        summary.applied as f64 / produced.as_secs_f64(),
        summary.applied,
        summary.batches,
        results.len()
    );
    println!(
        "  clock past a window's end to its result on `{RESULTS}`: p50 {:.1} ms, p99 {:.1} ms, longest {:.1} ms \
         ({} windows)",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
        ms(*latencies.last().unwrap()),
        latencies.len()
    );
}
