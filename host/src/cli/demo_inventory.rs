//! `waku demo inventory`: build the inventory example, run the demo of
//! [`crate::authoring::inventory_demo`] on a fresh embedded log, and print its
//! figures: order violations, the oracle check, the release latency of the
//! live phase and the peak of held bytes.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;

use super::demo::example_module;
use super::run::hint_at_limit_flags;
use crate::authoring::inventory_demo::{self, CATALOGUE, InventoryReport, InventorySpec, LATE_TOPIC, TIMED_TOPICS};
use crate::engine::projection::load_module_file;
use crate::operations::host::{CompileCache, HostSettings, ModuleSource};
use crate::storage::log::EmbeddedLog;

#[derive(Args)]
pub(super) struct InventoryArgs {
    /// Products (the keys).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    products: u64,
    /// Events of the history, over the 12 topics with event time.
    #[arg(long, default_value_t = 12_000)]
    history: usize,
    /// Days of event time the history spans.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=3650))]
    days: u32,
    /// Partitions of each of the 13 topics.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=64))]
    partitions: u32,
    /// Live events per second, once the history is applied.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    live_rate: u32,
    /// Seconds of live traffic.
    #[arg(long, default_value_t = 5.0)]
    live_secs: f64,
    /// Seconds during which reads of one topic find nothing at start-up,
    /// though its history is in the log (the start-up race).
    #[arg(long, default_value_t = 3.0)]
    late_start_secs: f64,
    /// Seed of the history.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// The most MiB each partition index holds before it reads in
    /// event-time alignment.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    max_held_mib: u64,
    /// Handler workers.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=256))]
    workers: u64,
    /// Keep the log and state here (must not exist yet) instead of a
    /// temporary directory.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Use this inventory module instead of building examples/inventory.
    #[arg(long)]
    module: Option<PathBuf>,
}

pub(super) async fn run(args: InventoryArgs) -> Result<ExitCode> {
    let seconds = |value: f64, flag: &str| {
        Duration::try_from_secs_f64(value).with_context(|| format!("--{flag} must be a number of seconds, 0 or more"))
    };
    let spec = InventorySpec {
        products: args.products,
        history: args.history,
        days: args.days,
        partitions: args.partitions,
        live_rate: args.live_rate,
        live: seconds(args.live_secs, "live-secs")?,
        late_start: seconds(args.late_start_secs, "late-start-secs")?,
        seed: args.seed,
    };
    let module_path = example_module("inventory", args.module.as_deref())?;
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
    let mut settings = HostSettings::new(&data, "inventory", TIMED_TOPICS[0], ModuleSource::Loaded(Vec::new()));
    settings.compile_cache = CompileCache::Off;
    settings.consumer.workers = args.workers as usize;
    settings.consumer.release.max_held_bytes = args.max_held_mib << 20;
    let module = load_module_file(&settings.sandbox()?, &module_path)
        .map_err(hint_at_limit_flags)
        .with_context(|| format!("loading module {}", module_path.display()))?;
    settings.modules = ModuleSource::Loaded(vec![module.clone()]);
    let log = EmbeddedLog::open(data.join("log.redb")).context("opening the demo's log")?;
    errln!(
        "waku: {} history events, then {:.1} s of live traffic at {}/s ...",
        spec.history,
        spec.live.as_secs_f64(),
        spec.live_rate
    );
    let report = inventory_demo::run(log, settings, module, spec).await?;
    let lines = report_lines(&report, &spec, args.max_held_mib);
    let matches = report.differences.is_empty();
    outln!("{}", lines.join("\n"))?;
    Ok(if matches && report.violations == 0 { ExitCode::SUCCESS } else { ExitCode::from(3) })
}

/// The most a live phase may fall short of the rate asked before the demo
/// says so: appends are paced by a timer, which wakes a little late.
const LIVE_RATE_TOLERANCE: f64 = 0.9;

/// A line saying the live phase appended slower than `asked` events per
/// second (the machine could not keep up), or nothing when it kept up.
fn live_rate_shortfall(events: usize, time: Duration, asked: u32) -> Option<String> {
    let secs = time.as_secs_f64();
    let reached = events as f64 / secs;
    (secs > 0.0 && reached < f64::from(asked) * LIVE_RATE_TOLERANCE).then(|| {
        format!(
            "live rate not reached: {reached:.0} events/s of the {asked}/s asked (this machine could not append \
             faster; the figures below are for the rate reached)"
        )
    })
}

/// What the demo prints: the workload, the start-up race, the figures and
/// the checks.
fn report_lines(report: &InventoryReport, spec: &InventorySpec, max_held_mib: u64) -> Vec<String> {
    let ms = |latency: Option<Duration>| latency.map_or("-".to_owned(), |l| format!("{:.1} ms", l.as_secs_f64() * 1e3));
    let mut lines = vec![
        format!(
            "workload: {} history events over {} days of event time, {} products as keys, 13 topics of {} partitions \
             (`{CATALOGUE}` without event time, the processing-time clock), seed {}",
            report.history_events, spec.days, spec.products, spec.partitions, spec.seed
        ),
        format!(
            "start-up race: reads of topic `{}` found nothing for the first {:.1} s",
            TIMED_TOPICS[LATE_TOPIC],
            spec.late_start.as_secs_f64()
        ),
        format!(
            "history: applied in {:.2} s ({:.0} events/s)",
            report.history_time.as_secs_f64(),
            report.history_events as f64 / report.history_time.as_secs_f64()
        ),
        format!(
            "live: {} events in {:.2} s (asked {}/s), each stamped with its event time as it was appended",
            report.live_events,
            report.live_time.as_secs_f64(),
            spec.live_rate
        ),
    ];
    lines.extend(live_rate_shortfall(report.live_events, report.live_time, spec.live_rate));
    lines.extend([
        format!(
            "release latency (live, the clock passing an event → the commit of its handle call, {} events): p50 {}, \
             p99 {}",
            report.live_latency.count(),
            ms(report.live_latency.quantile(0.5)),
            ms(report.live_latency.quantile(0.99)),
        ),
        format!(
            "peak held bytes: {} (largest partition index), {} (sum over partition indexes); limit {} MiB each",
            report.peak_held_bytes.0, report.peak_held_bytes.1, max_held_mib
        ),
        format!("order violations: {}", report.violations),
        match report.differences.is_empty() {
            true => format!(
                "oracle check: match ({} products; each product's events sorted by event time, ties by topic order, \
                 then by position in the topic)",
                report.products
            ),
            false => format!("oracle check: MISMATCH in {} products", report.differences.len()),
        },
    ]);
    lines.extend(report.differences.iter().map(|difference| format!("  {difference}")));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_rate_not_reached_is_said_and_one_reached_is_not() {
        let said = live_rate_shortfall(2_000, Duration::from_secs(10), 400).unwrap();
        assert!(said.starts_with("live rate not reached: 200 events/s of the 400/s asked"), "{said}");
        assert_eq!(live_rate_shortfall(3_950, Duration::from_secs(10), 400), None);
        assert_eq!(live_rate_shortfall(0, Duration::ZERO, 400), None);
    }
}
