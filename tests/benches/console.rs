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
//! 2. **An open console on a busy host**: the bank projection catches up
//!    on one backlog (`WAKU_BENCH_EVENTS`, default 200 000 events over 4
//!    partitions) into a fresh store, once with the console served (its
//!    history sampler running) and a client polling every view the pages
//!    poll (overview, history, late events, dead letters, modules and a
//!    module's log lines, topics, messages) every `WAKU_BENCH_POLL_MS`
//!    (default 200: each view ten times as often as an open page asks for
//!    the one it shows), once alone. The two runs of a pair follow each
//!    other, their order alternating (with then without, without then
//!    with, …: ABBA…), over `WAKU_BENCH_PAIRS` pairs (default 8), so a
//!    load that changes slowly weighs on both runs of a pair alike. Each
//!    pair's ratio (with ÷ without) of events per second and of the
//!    process's CPU time per event (`/proc/self/stat`: what the work cost,
//!    which another process's load disturbs far less than the time it
//!    took; the console's client runs in the process too, so it counts
//!    against the console), the load average (`/proc/loadavg`, one minute)
//!    before and after it, then the median ratios, their spread (the
//!    middle half and the extremes) and the load's range.
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
    let body = response.body_mut().read_to_string().unwrap();
    if status != 200 {
        eprintln!("{url}: {status} {body}");
    }
    (status, body.len())
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
/// The one-minute load average, if the system says.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// The CPU time this process has used so far, user and system, in clock
/// ticks (`/proc/self/stat`): every thread's, the console's and its
/// client's too.
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// What one run measured.
struct Run {
    /// Events applied per second.
    rate: f64,
    /// CPU ticks the process used per million events applied.
    cpu_per_million: f64,
    /// Requests the console answered.
    asked: u64,
}

/// One catch-up of the bank on `log` into a fresh store at `path`, with the
/// console served and polled every `poll_ms` when `watched`.
async fn bank_run<L: EventLog>(
    log: &Arc<L>,
    module: &Arc<dyn wakuwaku::sandbox::handler::HandlerModule>,
    path: &std::path::Path,
    watched: bool,
    poll_ms: u64,
) -> Run {
    let store = StateStore::open(path).unwrap();
    let projection = Arc::new(Projection::new("bank", "accounts", vec![module.clone()], store).unwrap());
    let consumer = Consumer::new(log.clone(), projection.clone(), ConsumerConfig::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (stop_serving, stopped) = tokio::sync::oneshot::channel::<()>();
    let poller = if watched {
        let admin = Admin {
            log: log.clone(),
            projection,
            progress: consumer.progress(),
            metrics: Arc::new(Metrics::default()),
            library: None,
            rebuild: None,
            token: None,
            read_token: None,
            timing: Some(consumer.timing()),
        };
        let listener = admin::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let address = listener.local_addr().unwrap();
        let listening = tokio::spawn(admin::serve(listener, admin, None, async {
            let _ = stopped.await;
        }));
        let stop = stop.clone();
        let poller = std::thread::spawn(move || {
            let base = format!("http://{address}/console/api");
            let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
            let paths = [
                "overview",
                "history",
                "late-events",
                "dead-letters?limit=50",
                "modules",
                "module-log?module=bank",
                "topics",
                "messages?topic=accounts&from=end",
            ];
            let mut asked = 0;
            while !stop.load(Ordering::Relaxed) {
                for path in paths {
                    assert_eq!(get(&agent, &format!("{base}/{path}")).0, 200, "{path}");
                    asked += 1;
                }
                // In steps, so the run's end is not kept waiting.
                let next = Instant::now() + Duration::from_millis(poll_ms);
                while Instant::now() < next && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10).min(next.saturating_duration_since(Instant::now())));
                }
            }
            asked
        });
        Some((listening, poller))
    } else {
        None
    };
    let (start, ticks) = (Instant::now(), cpu_ticks().unwrap_or(0));
    let summary = consumer.catch_up().await.unwrap();
    let rate = summary.applied as f64 / start.elapsed().as_secs_f64();
    let cpu_per_million = cpu_ticks().unwrap_or(0).saturating_sub(ticks) as f64 * 1e6 / summary.applied as f64;
    stop.store(true, Ordering::Relaxed);
    let asked = match poller {
        Some((listening, poller)) => {
            let asked = poller.join().unwrap();
            let _ = stop_serving.send(());
            let _ = listening.await;
            asked
        }
        None => 0,
    };
    Run { rate, cpu_per_million, asked }
}

async fn busy_host() {
    let events = env_or("WAKU_BENCH_EVENTS", 200_000) as usize;
    let pairs = env_or("WAKU_BENCH_PAIRS", 8).max(1);
    let poll_ms = env_or("WAKU_BENCH_POLL_MS", 200);
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let (log, _) = bank_log(dir.path(), module.clone(), WorkloadSpec { events, accounts: 10_000, seed: 42 }, 4).await;
    // The routed topics a host creates when it starts, there before the first poll.
    for routed in ["retry_accounts", "dlq_accounts"] {
        log.create_topic(routed, 4).await.unwrap();
    }
    let (mut ratios, mut cpu_ratios) = (Vec::new(), Vec::new());
    let (mut alone, mut watched, mut loads) = (Vec::new(), Vec::new(), Vec::new());
    println!(
        "| pair | order | with the console, events/s | alone, events/s | with ÷ alone | CPU per event, with ÷ alone | \
         load before → after |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | --- |");
    for pair in 0..pairs {
        let load_before = load_average();
        // ABBA: with first in even pairs, alone first in odd ones.
        let order = if pair % 2 == 0 { [true, false] } else { [false, true] };
        let (mut with, mut without) = (None, None);
        for (run, console) in order.into_iter().enumerate() {
            let path = dir.path().join(format!("bank-{pair}-{run}.redb"));
            let measured = bank_run(&log, &module, &path, console, poll_ms).await;
            let _ = std::fs::remove_file(&path);
            *if console { &mut with } else { &mut without } = Some(measured);
        }
        let (Some(with), Some(without)) = (with, without) else { unreachable!("each pair runs both") };
        let load_after = load_average();
        loads.extend(load_before.into_iter().chain(load_after));
        let ratio = with.rate / without.rate;
        let cpu_ratio = with.cpu_per_million / without.cpu_per_million;
        println!(
            "| {pair} | {} | {:.0} ({} requests) | {:.0} | {ratio:.3} | {cpu_ratio:.3} | {} → {} |",
            if order[0] { "with, alone" } else { "alone, with" },
            with.rate,
            with.asked,
            without.rate,
            load_before.map_or("?".to_owned(), |l| format!("{l:.2}")),
            load_after.map_or("?".to_owned(), |l| format!("{l:.2}")),
        );
        ratios.push(ratio);
        cpu_ratios.push(cpu_ratio);
        alone.push(without.rate);
        watched.push(with.rate);
    }
    let sorted = |values: &mut Vec<f64>| values.sort_by(f64::total_cmp);
    let median = |values: &[f64]| (values[(values.len() - 1) / 2] + values[values.len() / 2]) / 2.0;
    for values in [&mut ratios, &mut cpu_ratios, &mut alone, &mut watched, &mut loads] {
        sorted(values);
    }
    let quartile = |values: &[f64], q: usize| values[(values.len() - 1) * q / 4];
    println!("\n| bank, {events} events, 4 partitions, {pairs} pairs | median |");
    println!("| --- | ---: |");
    println!("| alone, events/s | {:.0} |", median(&alone));
    println!("| console polled every {poll_ms} ms, events/s | {:.0} |", median(&watched));
    println!(
        "| with ÷ alone (the pairs' ratios) | {:+.2} % (middle half {:+.2} to {:+.2} %, all {:+.2} to {:+.2} %) |",
        (median(&ratios) - 1.0) * 100.0,
        (quartile(&ratios, 1) - 1.0) * 100.0,
        (quartile(&ratios, 3) - 1.0) * 100.0,
        (ratios[0] - 1.0) * 100.0,
        (ratios[ratios.len() - 1] - 1.0) * 100.0,
    );
    println!(
        "| CPU per event, with ÷ alone (the whole process, the console's client too) | {:+.2} % (middle half \
         {:+.2} to {:+.2} %) |",
        (median(&cpu_ratios) - 1.0) * 100.0,
        (quartile(&cpu_ratios, 1) - 1.0) * 100.0,
        (quartile(&cpu_ratios, 3) - 1.0) * 100.0,
    );
    if let (Some(low), Some(high)) = (loads.first(), loads.last()) {
        println!("| load average (1 min) during the run | {low:.2} to {high:.2} |");
    }
}
