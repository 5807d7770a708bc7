//! `cargo bench -p wakuwaku-tests --bench console`: the operator console
//! (`/console` on the admin endpoint) with large numbers, and what an open
//! console costs a busy host.
//!
//! 1. **Large numbers**: one embedded log holding a million messages in
//!    topic `steps` and a million dead letters of projection `flaky` in
//!    `dlq_steps`; the console's JSON views timed over real HTTP, each
//!    asked 10 times (median and slowest, ms): the first page of dead
//!    letters, a page near the end (`after=0:999000`), a search by key
//!    (reads its budget of 5 000 letters), one letter with its body, the
//!    newest and a middle page of messages, the topics, the overview.
//! 2. **An open console on a busy host**: two hosts of the bank projection
//!    catch up side by side on one backlog (`WAKU_BENCH_EVENTS`, default
//!    400 000 events over 4 partitions), each into a fresh store: one
//!    serves the console (its history sampler running) with a client
//!    polling every view the pages poll (overview, history, late events,
//!    dead letters, modules, topics, messages) every `WAKU_BENCH_POLL_MS`
//!    (default 200: each view ten times as often as an open page asks for
//!    the one it shows), the other serves nothing. Which host is watched
//!    alternates over `WAKU_BENCH_ROUNDS` rounds (default 6); each round's
//!    ratio of their rates, and the median.
//!
//! `WAKU_BENCH_ONLY=pages` or `WAKU_BENCH_ONLY=host` runs one part alone.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use wakuwaku::authoring::demo::WorkloadSpec;
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig};
use wakuwaku::engine::metrics::Metrics;
use wakuwaku::engine::projection::Projection;
use wakuwaku::engine::routing::{Failure, FailureClass, Routed};
use wakuwaku::event::{Algebra, EventAtomicOrdering, EventHeaders};
use wakuwaku::key::Key;
use wakuwaku::operations::admin::{self, Admin};
use wakuwaku::storage::log::{EmbeddedLog, EventLog, Record};
use wakuwaku::storage::state::StateStore;
use wakuwaku_tests::flaky::{Flaky, STEP, Step};
use wakuwaku_tests::{bank_log, bank_module};

const MILLION: u64 = 1_000_000;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

fn main() {
    if !std::env::args().any(|arg| arg == "--bench") {
        println!("console bench: run with `cargo bench -p wakuwaku-tests --bench console`");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let only = std::env::var("WAKU_BENCH_ONLY").unwrap_or_default();
    if only.is_empty() || only == "pages" {
        runtime.block_on(large_numbers());
    }
    if only.is_empty() || only == "host" {
        runtime.block_on(busy_host());
    }
}

/// Serves `admin` (open, on loopback) until the process ends.
async fn serve<L: EventLog>(admin: Admin<L>) -> SocketAddr {
    let listener = admin::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(admin::serve(listener, admin, None, std::future::pending()));
    address
}

fn get(agent: &ureq::Agent, url: &str) -> (u16, usize) {
    let mut response = agent.get(url).call().unwrap();
    let status = response.status().as_u16();
    (status, response.body_mut().read_to_string().unwrap().len())
}

async fn large_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("steps", 1).await.unwrap();
    log.create_topic("dlq_steps", 1).await.unwrap();
    let filled = Instant::now();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    for chunk in 0..MILLION / 10_000 {
        let (mut messages, mut letters) = (Vec::with_capacity(10_000), Vec::with_capacity(10_000));
        for i in chunk * 10_000..(chunk + 1) * 10_000 {
            let envelope = EventHeaders {
                tag: STEP,
                key: Key::int(i % 10_000),
                ordering: EventAtomicOrdering::Relaxed,
                algebra: Algebra::NonAssociative,
                event_time: None,
            };
            let body = Step { seq: i, amount: 1, ..Step::default() }.body();
            messages.push(Record { headers: envelope.to_headers(), body: body.clone() });
            let routed = Routed {
                projection: "flaky".into(),
                topic: "steps".into(),
                event_type: "Step".into(),
                origin_partition: 0,
                origin_offset: i,
                events: 1,
                attempts: 1,
                failed_at_ms: now,
                first_failed_at_ms: Some(now),
                failure: Some(Failure {
                    class: FailureClass::Unrecoverable,
                    message: "not fixed yet".into(),
                    module: "flaky".into(),
                    version: "flaky-1".into(),
                }),
                ahead_of: None,
                ordering: None,
            };
            let mut headers = envelope.to_headers();
            headers.extend(routed.to_headers());
            letters.push(Record { headers, body });
        }
        log.append("steps", vec![(0, messages)]).await.unwrap();
        log.append("dlq_steps", vec![(0, letters)]).await.unwrap();
    }
    println!(
        "console bench: 1 000 000 messages and 1 000 000 dead letters written in {:.1} s",
        filled.elapsed().as_secs_f64()
    );
    let store = StateStore::open(&dir.path().join("flaky.redb")).unwrap();
    let projection = Arc::new(Projection::new("flaky", "steps", vec![Arc::new(Flaky::new())], store).unwrap());
    let consumer = Consumer::new(log.clone(), projection.clone(), ConsumerConfig::default());
    let admin = Admin {
        log,
        projection,
        progress: consumer.progress(),
        metrics: Arc::new(Metrics::default()),
        library: None,
        rebuild: None,
        token: None,
        read_token: None,
        timing: None,
    };
    let base = format!("http://{}/console/api", serve(admin).await);
    let views = [
        ("dead letters, first page of 50", "dead-letters?limit=50"),
        ("dead letters, a page near the end", "dead-letters?limit=50&after=0:999000"),
        ("dead letters, a search by key (5 000 read)", "dead-letters?limit=50&key=12345678"),
        ("one dead letter with its body", "dead-letter?record=0:500000"),
        ("messages, the newest 20", "messages?topic=steps&partition=0&from=end&limit=20"),
        ("messages, 20 from offset 500 000", "messages?topic=steps&partition=0&from=500000&limit=20"),
        ("messages, a page of 200", "messages?topic=steps&partition=0&from=700000&limit=200"),
        ("topics", "topics"),
        ("overview", "overview"),
    ];
    println!("\n| view (1 000 000 dead letters, 1 000 000 messages) | median ms | slowest ms | bytes |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, path) in views {
        let url = format!("{base}/{path}");
        let (times, bytes) = tokio::task::spawn_blocking(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
            let mut times = Vec::new();
            let mut bytes = 0;
            for _ in 0..10 {
                let start = Instant::now();
                let (status, length) = get(&agent, &url);
                times.push(start.elapsed().as_secs_f64() * 1000.0);
                assert_eq!(status, 200, "{url}");
                bytes = length;
            }
            times.sort_by(f64::total_cmp);
            (times, bytes)
        })
        .await
        .unwrap();
        println!("| {name} | {:.1} | {:.1} | {bytes} |", times[times.len() / 2], times[times.len() - 1]);
    }
}

/// Two hosts catch up at once, side by side, on the same backlog, each into
/// a fresh store: one serves the console (its history sampler running) and
/// is polled every `WAKU_BENCH_POLL_MS`, the other serves nothing. Which
/// one is watched alternates by round; each round gives the ratio of their
/// rates, so the load the machine carries falls on both alike.
async fn busy_host() {
    let events = env_or("WAKU_BENCH_EVENTS", 400_000) as usize;
    let rounds = env_or("WAKU_BENCH_ROUNDS", 6);
    let poll_ms = env_or("WAKU_BENCH_POLL_MS", 200);
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let (log, _) = bank_log(dir.path(), module.clone(), WorkloadSpec { events, accounts: 10_000, seed: 42 }, 4).await;
    let mut ratios = Vec::new();
    let (mut alone, mut watched) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let (mut hosts, mut projections) = (Vec::new(), Vec::new());
        for host in 0..2 {
            let store = StateStore::open(&dir.path().join(format!("bank-{round}-{host}.redb"))).unwrap();
            let projection = Arc::new(Projection::new("bank", "accounts", vec![module.clone()], store).unwrap());
            hosts.push(Consumer::new(log.clone(), projection.clone(), ConsumerConfig::default()));
            projections.push(projection);
        }
        let watched_host = (round % 2) as usize;
        let consumer = &hosts[watched_host];
        let admin = Admin {
            log: log.clone(),
            projection: projections[watched_host].clone(),
            progress: consumer.progress(),
            metrics: Arc::new(Metrics::default()),
            library: None,
            rebuild: None,
            token: None,
            read_token: None,
            timing: Some(consumer.timing()),
        };
        let base = format!("http://{}/console/api", serve(admin).await);
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
                let paths = [
                    "overview",
                    "history",
                    "late-events",
                    "dead-letters?limit=50",
                    "modules",
                    "topics",
                    "messages?topic=accounts&from=end",
                ];
                let mut asked = 0;
                while !stop.load(Ordering::Relaxed) {
                    for path in paths {
                        assert_eq!(get(&agent, &format!("{base}/{path}")).0, 200, "{path}");
                        asked += 1;
                    }
                    std::thread::sleep(Duration::from_millis(poll_ms));
                }
                asked
            })
        };
        let runs: Vec<_> = hosts
            .into_iter()
            .map(|consumer| {
                tokio::spawn(async move {
                    let start = Instant::now();
                    let summary = consumer.catch_up().await.unwrap();
                    (summary.applied, start.elapsed().as_secs_f64())
                })
            })
            .collect();
        let mut rates = Vec::new();
        for run in runs {
            let (applied, secs) = run.await.unwrap();
            assert_eq!(applied, events as u64);
            rates.push(applied as f64 / secs);
        }
        stop.store(true, Ordering::Relaxed);
        let asked = poller.join().unwrap();
        let (with, without) = (rates[watched_host], rates[1 - watched_host]);
        println!(
            "round {round}: host {watched_host} with the console polled ({asked} requests) {with:.0} events/s, the \
             other alone {without:.0} events/s: {:+.2} %",
            (with / without - 1.0) * 100.0
        );
        ratios.push(with / without);
        alone.push(without);
        watched.push(with);
    }
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    println!("\n| bank, {events} events, 4 partitions, two hosts side by side | median events/s |");
    println!("| --- | ---: |");
    println!("| alone | {:.0} |", median(&mut alone));
    println!("| console polled every {poll_ms} ms | {:.0} |", median(&mut watched));
    println!("| with ÷ alone, median of {rounds} rounds | {:+.2} % |", (median(&mut ratios) - 1.0) * 100.0);
}
