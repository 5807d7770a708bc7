//! `cargo bench -p wakuwaku-tests --bench event_time`: event time across
//! topics on the workload of `waku demo inventory` (13 topics, the
//! catalogue without event time, products as keys, days of history with
//! topic `i` `i + 1` times as dense as topic 0).
//!
//! 1. **Violations, the article's baseline against the offset gate.** The
//!    release stage alone (`wakuwaku_core::release`), one per partition
//!    index, fed by a simulated host that reads every input that is not
//!    paused, [`SHARE`] records a round, a round a millisecond of processing
//!    time, with the reads of one topic finding nothing for its first
//!    [`LATE_ROUNDS`] rounds (the start-up race). The baseline marks an
//!    input idle once it found nothing for [`TIMEOUT_ROUNDS`] rounds
//!    (Flink's `withIdleness`, benchmark only: by telling the stage the end
//!    is where the input stands); the gate reports the end offsets the log
//!    has, at start-up and after a read that found everything. Violations
//!    of each, as a share of the timed events.
//! 2. **Peak held bytes with one topic 10× behind**: the same simulation,
//!    the gate, with the densest topic read 10× slower than the others (a
//!    tenth of [`SHARE`] a round), at the default bound (64 MiB) and at
//!    1 MiB: the peak of held bytes of one partition index.
//! 3. **Throughput, event-time path ÷ plain projection**: the host
//!    (inventory module, embedded log and state) catching up on the
//!    history over the 13 topics in event-time order, against the same
//!    records in one topic of as many partitions (a one-topic projection:
//!    log order, the event times only carried); events per second of each
//!    in the same run, their ratio, the time of each per phase, and the
//!    ratio in CPU time (the process's CPU seconds during each path: far
//!    steadier than wall time on a machine shared with other work).
//! 4. **Release latency in the live phase**: `waku demo inventory`'s run
//!    (history, then live traffic at [`LIVE_RATE`] events/s for
//!    [`LIVE_SECS`] s): p50 and p99 from the clock passing an event to the
//!    commit of its handle call, with the violations and the oracle check.
//!
//! `WAKU_BENCH_EVENTS` (default 60 000) sizes the history;
//! `WAKU_BENCH_ONLY=throughput` runs part 3 alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wakuwaku::authoring::inventory_demo::{self, Encoder, InventorySpec, LATE_TOPIC, Planned, TIMED_TOPICS};
use wakuwaku::engine::consumer::Summary;
use wakuwaku::operations::host::{CompileCache, Host, HostSettings, ModuleSource};
use wakuwaku::storage::log::{EmbeddedLog, EventLog, Record};
use wakuwaku_core::release::{Arrival, ClockSource, Input, Millis, ReleaseLimits, ReleaseStage, Released};
use wakuwaku_tests::inventory_module;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Records read from an input per round.
const SHARE: usize = 64;
/// Rounds (ms) during which the late topic's reads find nothing.
const LATE_ROUNDS: u64 = 3_000;
/// The baseline's idleness timeout, in rounds (ms).
const TIMEOUT_ROUNDS: u64 = 1_000;
/// The live phase of part 4.
const LIVE_RATE: u32 = 1_000;
const LIVE_SECS: u64 = 10;
/// The bytes of one record as stored (headers and body), about.
const RECORD_BYTES: u64 = 150;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Where the idleness comes from in the simulation.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// The log's end offsets.
    Gate,
    /// Quiet for this many rounds.
    Timer(u64),
}

/// What a simulation found: violations, timed events, the peak of held
/// bytes of one partition index.
#[derive(Default)]
struct Simulated {
    violations: u64,
    timed: u64,
    peak_held_bytes: u64,
}

/// The history of every topic split by partition index (product modulo
/// `partitions`, as co-partitioned topics place a key).
fn by_partition(history: &[Vec<Planned>], partitions: u32) -> Vec<Vec<Vec<Planned>>> {
    (0..u64::from(partitions))
        .map(|p| {
            history
                .iter()
                .map(|events| events.iter().filter(|e| e.product % u64::from(partitions) == p).copied().collect())
                .collect()
        })
        .collect()
}

/// Reads one partition index's `inputs` (events per topic) with `rule`;
/// `slow` reads that topic a tenth of the share a round.
fn simulate(inputs: &[Vec<Planned>], rule: Rule, slow: Option<usize>, limits: ReleaseLimits) -> Simulated {
    let declared: Vec<Input> = (0..inputs.len() as u32)
        .map(|topic| Input {
            topic,
            partition: 0,
            clock: if (topic as usize) < TIMED_TOPICS.len() {
                ClockSource::EventTime
            } else {
                ClockSource::ProcessingTime
            },
        })
        .collect();
    let mut stage: ReleaseStage<()> = ReleaseStage::new(&declared, &vec![0; inputs.len()], limits).unwrap();
    let mut position = vec![0usize; inputs.len()];
    let mut quiet = vec![0u64; inputs.len()];
    let mut out: Vec<Released<()>> = Vec::new();
    let mut found = Simulated::default();
    if rule == Rule::Gate {
        for (input, events) in inputs.iter().enumerate() {
            stage.observe_end(input, events.len() as u64, 0).unwrap();
        }
    }
    let start: Millis = 1_800_000_000_000;
    let mut round: u64 = 0;
    while position.iter().zip(inputs).any(|(at, events)| *at < events.len()) || stage.held_events() > 0 {
        round += 1;
        let now = start + round as Millis;
        for (input, events) in inputs.iter().enumerate() {
            if stage.is_paused(input) {
                continue;
            }
            let late = input == LATE_TOPIC && round <= LATE_ROUNDS;
            let share = if slow == Some(input) { SHARE / 10 } else { SHARE };
            let take = if late { 0 } else { share.min(events.len() - position[input]) };
            for event in &events[position[input]..position[input] + take] {
                let arrival = Arrival {
                    input,
                    offset: position[input] as u64,
                    event_time: event.time,
                    append_time: None,
                    carried_time: event.time,
                    bytes: RECORD_BYTES,
                    payload: (),
                };
                stage.read(arrival, &mut out).unwrap();
                position[input] += 1;
            }
            quiet[input] = if take == 0 { quiet[input] + 1 } else { 0 };
            match rule {
                Rule::Gate if take < share && !late => {
                    stage.observe_end(input, events.len() as u64, now).unwrap();
                }
                Rule::Timer(timeout) if quiet[input] >= timeout => {
                    stage.observe_end(input, position[input] as u64, now).unwrap();
                }
                _ => {}
            }
        }
        found.peak_held_bytes = found.peak_held_bytes.max(stage.held_bytes());
        stage.release(now, &mut out);
        out.clear();
        assert!(round < 100_000_000, "the simulation does not end");
    }
    found.violations = stage.violations();
    found.timed = inputs[..TIMED_TOPICS.len()].iter().map(|events| events.len() as u64).sum();
    found
}

fn simulate_all(split: &[Vec<Vec<Planned>>], rule: Rule, slow: Option<usize>, limits: ReleaseLimits) -> Simulated {
    split.iter().map(|inputs| simulate(inputs, rule, slow, limits)).fold(Simulated::default(), |sum, one| Simulated {
        violations: sum.violations + one.violations,
        timed: sum.timed + one.timed,
        peak_held_bytes: sum.peak_held_bytes.max(one.peak_held_bytes),
    })
}

/// Settings of a host catching up on `topics` with the inventory module.
fn settings(
    data: &std::path::Path,
    topics: &[String],
    module: &Arc<dyn wakuwaku::sandbox::handler::HandlerModule>,
) -> HostSettings {
    let mut settings = HostSettings::new(data, "inventory", &topics[0], ModuleSource::Loaded(vec![module.clone()]));
    settings.more_topics = topics[1..].to_vec();
    settings.compile_cache = CompileCache::Off;
    settings.until_caught_up = true;
    settings
}

/// Appends `events` (per topic, in order) to `log` as the demo's topics
/// (`plain`: all into one topic `all`). Returns the topics to consume.
async fn append(
    log: &EmbeddedLog,
    history: &[Vec<Planned>],
    encoder: &mut Encoder,
    partitions: u32,
    plain: bool,
) -> Vec<String> {
    let names: Vec<String> = if plain { vec!["all".to_owned()] } else { inventory_demo::topics() };
    for name in &names {
        log.create_topic(name, partitions).await.unwrap();
    }
    for (topic, events) in history.iter().enumerate() {
        let name = if plain { &names[0] } else { &names[topic] };
        for chunk in events.chunks(4096) {
            let mut batches: Vec<(u32, Vec<Record>)> = (0..partitions).map(|p| (p, Vec::new())).collect();
            for event in chunk {
                // The same records on both paths: a one-topic projection
                // applies them in log order, its event times only carried.
                let (partition, record) = encoder.record(event).unwrap();
                batches[partition as usize].1.push(record);
            }
            log.append(name, batches).await.unwrap();
        }
    }
    names
}

/// Events per second of a host catching up on the history, in event-time
/// order over the 13 topics or (`plain`) in one topic, and its summary.
/// Also the CPU seconds the process spent meanwhile (none where
/// `/proc/self/stat` cannot be read).
async fn throughput(history: &[Vec<Planned>], partitions: u32, plain: bool) -> (f64, Option<f64>, Summary) {
    let module = inventory_module();
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    let mut encoder = Encoder::new(&*module, partitions).unwrap();
    let topics = append(&log, history, &mut encoder, partitions, plain).await;
    let (started, cpu_before) = (Instant::now(), cpu_seconds());
    let host = Host::start_on(log, settings(dir.path(), &topics, &module)).await.unwrap();
    let summary = host.finished().await.unwrap();
    let cpu = cpu_seconds().zip(cpu_before).map(|(after, before)| after - before);
    let events: usize = history.iter().map(Vec::len).sum();
    assert_eq!(summary.consumed as usize, events);
    (events as f64 / started.elapsed().as_secs_f64(), cpu, summary)
}

/// The CPU time of this process so far, user and system, in seconds
/// (Linux: `/proc/self/stat`, in clock ticks of 1/100 s). On a machine
/// shared with other work, the CPU time of a path moves far less from
/// run to run than its wall time.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may
    // hold spaces): utime and stime are the 12th and 13th of them.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

#[tokio::main]
async fn main() {
    // As the `waku` command does, so the figures match it.
    wakuwaku::platform::memory::prefer_small_pages();
    let spec = InventorySpec {
        history: env_or("WAKU_BENCH_EVENTS", 60_000),
        products: 1_000,
        live_rate: LIVE_RATE,
        live: Duration::from_secs(LIVE_SECS),
        ..InventorySpec::default()
    };
    // The history ends now, in whole seconds: the host bounds event times
    // by the log's append times (`--max-event-time-ahead`), so a history
    // ending in the future would be dead-lettered rather than released.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let history = inventory_demo::history(&spec, i64::try_from(now.as_secs()).unwrap_or(i64::MAX / 1000) * 1000);
    let split = by_partition(&history, spec.partitions);
    println!(
        "workload: {} history events, {} products, 13 topics x {} partitions, seed {}",
        spec.history, spec.products, spec.partitions, spec.seed
    );

    let only_throughput = std::env::var("WAKU_BENCH_ONLY").is_ok_and(|only| only == "throughput");
    if !only_throughput {
        simulations(&split);
    }
    throughputs(&history, spec.partitions).await;
    if !only_throughput {
        live(spec).await;
    }
}

/// Parts 1 and 2: the release stage alone.
fn simulations(split: &[Vec<Vec<Planned>>]) {
    println!(
        "\n1. violations, topic `{}` read {LATE_ROUNDS} ms late, {SHARE} records a read:",
        TIMED_TOPICS[LATE_TOPIC]
    );
    for (name, rule) in [("timer-based idleness (1 s)", Rule::Timer(TIMEOUT_ROUNDS)), ("offset gate", Rule::Gate)] {
        let found = simulate_all(split, rule, None, ReleaseLimits::default());
        println!(
            "   {name:<28} {:>7} of {} timed events late ({:.2} %)",
            found.violations,
            found.timed,
            found.violations as f64 * 100.0 / found.timed as f64
        );
    }

    println!("\n2. peak held bytes of one partition index, topic `{}` read 10x slower:", TIMED_TOPICS[LATE_TOPIC]);
    for limit in [64u64 << 20, 1 << 20] {
        let limits = ReleaseLimits { max_held_bytes: limit, ..ReleaseLimits::default() };
        let found = simulate_all(split, Rule::Gate, Some(LATE_TOPIC), limits);
        let unbounded = if limit == 64 << 20 { " (nothing paused below it)" } else { "" };
        println!(
            "   limit {:>5} KiB: peak {:>9} bytes{unbounded}, {} violations",
            limit >> 10,
            found.peak_held_bytes,
            found.violations
        );
    }
}

/// Part 3: the host on both paths.
async fn throughputs(history: &[Vec<Planned>], partitions: u32) {
    println!("\n3. throughput catching up on the history (the host, embedded log and state):");
    let (timed, timed_cpu, timed_summary) = throughput(history, partitions, false).await;
    let (plain, plain_cpu, plain_summary) = throughput(history, partitions, true).await;
    let cpu = |seconds: Option<f64>| seconds.map_or_else(|| "CPU n/a".to_owned(), |s| format!("CPU {s:.2} s"));
    for (name, rate, seconds, summary) in [
        ("event-time path over 13 topics", timed, timed_cpu, &timed_summary),
        ("plain projection, one topic", plain, plain_cpu, &plain_summary),
    ] {
        println!(
            "   {name:<31} {rate:>8.0} events/s, {}, {} batches, {} handler calls",
            cpu(seconds),
            summary.batches,
            summary.calls
        );
        println!("      time per phase: {}", summary.phases);
    }
    println!("   ratio: {:.2}", timed / plain);
    if let (Some(timed), Some(plain)) = (timed_cpu, plain_cpu) {
        // Events per CPU second of each path, divided: the same events.
        println!("   ratio in CPU time (plain CPU s / event-time CPU s): {:.2}", plain / timed);
    }
}

/// Part 4: the demo's live phase.
async fn live(spec: InventorySpec) {
    println!("\n4. waku demo inventory, live at {LIVE_RATE} events/s for {LIVE_SECS} s:");
    let module = inventory_module();
    let dir = tempfile::tempdir().unwrap();
    let log = EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
    let mut host = settings(dir.path(), &inventory_demo::topics(), &module);
    host.until_caught_up = false;
    let spec = InventorySpec { history: spec.history / 4, ..spec };
    let report = inventory_demo::run(log, host, module, spec).await.unwrap();
    let ms = |q: f64| report.live_latency.quantile(q).map_or(f64::NAN, |l| l.as_secs_f64() * 1e3);
    println!(
        "   {} live events; release latency p50 {:.1} ms, p99 {:.1} ms; {} violations; peak held {} bytes; oracle {}",
        report.live_events,
        ms(0.5),
        ms(0.99),
        report.violations,
        report.peak_held_bytes.0,
        if report.differences.is_empty() { "match" } else { "MISMATCH" }
    );
}
