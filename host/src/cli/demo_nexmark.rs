//! `waku demo nexmark`: build the nexmark example (query 5's first stage
//! and query 7, and query 5's second stage with its feature `hot`),
//! publish a seeded Nexmark stream ([`crate::authoring::nexmark`]) to a
//! fresh embedded log, run the three projections to the end of it one
//! after another, then the plain bank projection over as many bank events
//! (the baseline the queries' throughput is divided by), and print each
//! one's throughput and time per phase, and the oracle's verdict on what
//! queries 5 and 7 emitted.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;

use super::available_threads;
use super::demo::example_build;
use super::run::{explain, hint_at_limit_flags};
use crate::authoring::demo::{self, WorkloadSpec};
use crate::authoring::nexmark::{self, HighestBid, HotItems, NexmarkEvent, NexmarkSpec, Topic};
use crate::authoring::publish;
use crate::engine::consumer::Summary;
use crate::engine::projection::load_module_file;
use crate::operations::host::{CompileCache, Host, HostSettings, ModuleSource};
use crate::sandbox::handler::HandlerModule;
use crate::storage::log::{EmbeddedLog, EventLog};

/// The topics the queries emit to.
const Q5_SLOTS: &str = "nexmark-q5-slots";
const Q5: &str = "nexmark-q5";
const Q7: &str = "nexmark-q7";
/// The baseline's topic.
const BANK: &str = "accounts";

#[derive(Args)]
pub(super) struct NexmarkArgs {
    /// Events to generate: persons, auctions and bids, 1:3:46.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    events: u64,
    /// Events per second of event time (the generator's constant rate).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    rate: u32,
    /// Seed of the stream.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Partitions of each input topic.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    partitions: u32,
    /// Handler workers.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=256))]
    workers: u64,
    /// Keep the log and state here (must not exist yet) instead of a
    /// temporary directory.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Use this build of examples/nexmark (query 5's first stage and
    /// query 7) instead of building it.
    #[arg(long)]
    module: Option<PathBuf>,
    /// Use this build of examples/nexmark with its feature `hot` (query
    /// 5's second stage) instead of building it.
    #[arg(long)]
    hot_module: Option<PathBuf>,
    /// Use this build of examples/bank (the baseline) instead of building
    /// it.
    #[arg(long)]
    bank_module: Option<PathBuf>,
}

/// One projection's run to the end of its input.
struct Consumed {
    summary: Summary,
    time: Duration,
}

impl Consumed {
    fn line(&self, what: &str, emitted: usize, unit: &str) -> String {
        let secs = self.time.as_secs_f64();
        format!(
            "{what}: {} events in {secs:.2} s ({:.0} events/s), {} timers fired, {} dead-lettered, {emitted} {unit} \
             emitted",
            self.summary.consumed,
            self.summary.consumed as f64 / secs.max(1e-9),
            self.summary.timers_fired,
            self.summary.counts.dead_lettered,
        )
    }
}

pub(super) async fn run(args: NexmarkArgs) -> Result<ExitCode> {
    let spec = NexmarkSpec { events: args.events, rate: args.rate, seed: args.seed, partitions: args.partitions };
    let first_path = example_build("nexmark", args.module.as_deref(), &[])?;
    let hot_path = example_build("nexmark", args.hot_module.as_deref(), &["hot"])?;
    let bank_path = example_build("bank", args.bank_module.as_deref(), &[])?;
    let temp;
    let data = match &args.data {
        Some(dir) if dir.exists() => bail!("{} already exists; the demo needs a fresh directory", dir.display()),
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir().context("creating a temporary directory")?;
            temp.path().to_owned()
        }
    };
    std::fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
    let sandbox = HostSettings::new(&data, "nexmark", Q7, ModuleSource::Loaded(Vec::new())).sandbox()?;
    let load = |path: &Path| {
        load_module_file(&sandbox, path)
            .map_err(hint_at_limit_flags)
            .with_context(|| format!("loading module {}", path.display()))
    };
    let (first, hot, bank) = (load(&first_path)?, load(&hot_path)?, load(&bank_path)?);
    let log = Arc::new(EmbeddedLog::open(data.join("log.redb")).context("opening the demo's log")?);

    errln!("waku: generating and publishing {} Nexmark events to two topics ...", spec.events);
    let events = nexmark::generate(spec);
    let expected = nexmark::oracle(&events, spec.partitions);
    for topic in [Topic::Q5, Topic::Q7] {
        log.create_topic(topic.name(), spec.partitions).await?;
        let outgoing = nexmark::outgoing(&*first, &events, topic)?;
        publish::publish(&*log, topic.name(), first.clone(), outgoing, None, available_threads()).await?;
    }

    let workers = args.workers as usize;
    let q7 = consume(&log, &data, ("nexmark-q7", Topic::Q7.name()), first.clone(), workers).await?;
    let q5_slots = consume(&log, &data, ("nexmark-q5-slots", Topic::Q5.name()), first, workers).await?;
    let q5_hot = consume(&log, &data, ("nexmark-q5-hot", Q5_SLOTS), hot, workers).await?;
    let bank = baseline(&log, &data, bank, &spec, workers).await?;

    let found_q7: Vec<HighestBid> = nexmark::results(&*log, Q7).await?;
    let found_q5: Vec<HotItems> = nexmark::results(&*log, Q5).await?;
    let (differ_q5, differ_q7) =
        (nexmark::differences(&expected.q5, &found_q5), nexmark::differences(&expected.q7, &found_q7));
    let runs = Runs { q7: &q7, q5_slots: &q5_slots, q5_hot: &q5_hot, bank: &bank };
    let lines = report_lines(&spec, &events, runs, (&found_q5, &found_q7), (differ_q5, differ_q7));
    outln!("{}", lines.join("\n"))?;
    Ok(if differ_q5 + differ_q7 == 0 { ExitCode::SUCCESS } else { ExitCode::from(3) })
}

/// Runs projection `name` over `topic` with `module` until it is caught up.
async fn consume(
    log: &Arc<EmbeddedLog>,
    data: &Path,
    (name, topic): (&str, &str),
    module: Arc<dyn HandlerModule>,
    workers: usize,
) -> Result<Consumed> {
    let mut settings = HostSettings::new(data, name, topic, ModuleSource::Loaded(vec![module]));
    settings.compile_cache = CompileCache::Off;
    settings.consumer.workers = workers;
    settings.until_caught_up = true;
    settings.create_emit_topics = Some(1);
    let started = Instant::now();
    let host = Host::start_on(log.clone(), settings).await.map_err(|error| explain(error, &[topic.to_owned()]))?;
    let summary = host.finished().await?;
    Ok(Consumed { summary, time: started.elapsed() })
}

/// The bank workload of as many events as the stream (10 000 accounts, the
/// same seed), published to `accounts` and consumed by the bank example:
/// the plain projection the queries are compared with, in the same run.
async fn baseline(
    log: &Arc<EmbeddedLog>,
    data: &Path,
    bank: Arc<dyn HandlerModule>,
    spec: &NexmarkSpec,
    workers: usize,
) -> Result<Consumed> {
    let events = usize::try_from(spec.events).context("--events is too large for this machine")?;
    let (workload, _) = demo::workload(WorkloadSpec { events, accounts: 10_000, seed: spec.seed });
    let outgoing = demo::outgoing(&*bank, &workload)?;
    log.create_topic(BANK, spec.partitions).await?;
    publish::publish(&**log, BANK, bank.clone(), outgoing, None, available_threads()).await?;
    consume(log, data, ("bank", BANK), bank, workers).await
}

/// The runs the demo reports.
struct Runs<'a> {
    q7: &'a Consumed,
    q5_slots: &'a Consumed,
    q5_hot: &'a Consumed,
    bank: &'a Consumed,
}

impl Consumed {
    fn per_second(&self) -> f64 {
        self.summary.consumed as f64 / self.time.as_secs_f64().max(1e-9)
    }
}

/// What the demo prints: the stream, each projection's figures and the
/// oracle's verdict.
fn report_lines(
    spec: &NexmarkSpec,
    events: &[NexmarkEvent],
    Runs { q7, q5_slots, q5_hot, bank }: Runs<'_>,
    (found_q5, found_q7): (&[HotItems], &[HighestBid]),
    (differ_q5, differ_q7): (usize, usize),
) -> Vec<String> {
    let count = |f: fn(&NexmarkEvent) -> bool| events.iter().filter(|event| f(event)).count();
    let persons = count(|e| matches!(e, NexmarkEvent::Person { .. }));
    let auctions = count(|e| matches!(e, NexmarkEvent::Auction { .. }));
    let q5_time = q5_slots.time + q5_hot.time;
    let mut lines = vec![
        format!(
            "workload: {} events ({persons} persons, {auctions} auctions, {} bids: Nexmark's 1:3:46), {:.1} s of event \
             time at {} events/s, seed {}, {} partitions per input topic",
            spec.events,
            spec.events as usize - persons - auctions,
            spec.events as f64 / f64::from(spec.rate),
            spec.rate,
            spec.seed,
            spec.partitions
        ),
        q7.line("query 7, the highest bid per 10 s tumbling window", found_q7.len(), "windows"),
        q5_slots.line("query 5, first stage, bids per auction per 2 s slot", q5_hot.summary.consumed as usize, "slots"),
        q5_hot.line("query 5, second stage, the hot items of each 10 s window every 2 s", found_q5.len(), "windows"),
        format!(
            "query 5, both stages: {} input events in {:.2} s ({:.0} events/s)",
            q5_slots.summary.consumed,
            q5_time.as_secs_f64(),
            q5_slots.summary.consumed as f64 / q5_time.as_secs_f64().max(1e-9)
        ),
        format!(
            "the plain bank projection (the baseline), as many bank events: {} events in {:.2} s ({:.0} events/s)",
            bank.summary.consumed,
            bank.time.as_secs_f64(),
            bank.per_second()
        ),
        format!(
            "throughput ÷ the bank's: query 7 {:.2}, query 5 {:.2} (both stages)",
            q7.per_second() / bank.per_second().max(1e-9),
            q5_slots.summary.consumed as f64 / q5_time.as_secs_f64().max(1e-9) / bank.per_second().max(1e-9)
        ),
        format!("time per phase, query 7: {}", q7.summary.phases),
        format!("time per phase, query 5's first stage: {}", q5_slots.summary.phases),
        format!("time per phase, the bank: {}", bank.summary.phases),
    ];
    lines.push(if differ_q5 + differ_q7 == 0 {
        format!(
            "oracle check: match (query 5: {} windows, query 7: {} windows; each window's results computed by \
             sorting the generated bids)",
            found_q5.len(),
            found_q7.len()
        )
    } else {
        format!(
            "oracle check: MISMATCH (query 5: {differ_q5} windows missing, extra or different of {} found; query 7: \
             {differ_q7} of {} found)",
            found_q5.len(),
            found_q7.len()
        )
    });
    lines
}
