//! `waku demo`: build the bank example, publish a seeded workload, consume
//! it, and check the read model against an oracle.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Instant, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::Args;

use super::args::ConsumeArgs;
use super::available_threads;
use super::run::{explain, hint_at_limit_flags};
use crate::authoring::demo::{self, WorkloadSpec};
use crate::authoring::guest_build::GuestBuild;
use crate::authoring::publish;
use crate::engine::projection::load_module_file;
use crate::operations::host::{CompileCache, Host, HostSettings, LogSettings, ModuleSource};
use crate::sandbox::handler::HandlerModule;
use crate::storage::log::EventLog;
use crate::storage::stats::Stat;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(super) struct DemoArgs {
    #[command(subcommand)]
    pub(super) example: Option<DemoExample>,
    /// Events to generate.
    #[arg(long, default_value_t = 1_000_000)]
    pub(super) events: usize,
    /// Accounts to spread them over.
    #[arg(long, default_value_t = 10_000)]
    pub(super) accounts: u64,
    /// Seed of the workload.
    #[arg(long, default_value_t = 42)]
    pub(super) seed: u64,
    /// Partitions of the `accounts` topic.
    #[arg(long, default_value_t = 4)]
    pub(super) partitions: u32,
    /// Keep the log and state here (must not exist yet) instead of a
    /// temporary directory.
    #[arg(long)]
    pub(super) data: Option<PathBuf>,
    /// Use this bank module instead of building examples/bank.
    #[arg(long)]
    pub(super) module: Option<PathBuf>,
    /// Serve the admin endpoint on this address while the demo runs.
    #[arg(long, value_parser = super::admin_access::serve_address)]
    pub(super) admin: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub(super) admin_access: super::admin_access::AdminServeArgs,
    /// Run the demo on an Apache Iggy server instead of the embedded log
    /// (`iggy://user:password@host:port`), in a fresh stream
    /// `waku-demo-<time>`; the projection's state stays local.
    #[arg(long)]
    pub(super) iggy: Option<String>,
    #[command(flatten)]
    pub(super) consume: ConsumeArgs,
}

/// Other demos than the bank's.
#[derive(clap::Subcommand)]
pub(super) enum DemoExample {
    /// Event time across 13 topics (the inventory example): days of history
    /// read with one topic late at start-up, then live traffic; checks the
    /// read model against an oracle that sorts each product's events by
    /// event time.
    #[command(after_help = "Example:\n  waku demo inventory --products 500 --history 50000 --live-secs 10")]
    Inventory(super::demo_inventory::InventoryArgs),
    /// Nexmark's queries 5 (hot items over hopping windows) and 7 (the
    /// highest bid per tumbling window) on the guest SDK's windows, over a
    /// seeded stream of persons, auctions and bids; checks what they emit
    /// against an oracle that sorts the bids.
    #[command(after_help = "Example:\n  waku demo nexmark --events 1000000 --partitions 4")]
    Nexmark(super::demo_nexmark::NexmarkArgs),
}

/// The topic of the bank workload.
const TOPIC: &str = "accounts";

/// The module `example` of the repository's `examples/`, built, unless
/// `module` names one already built.
pub(super) fn example_module(example: &str, module: Option<&Path>) -> Result<PathBuf> {
    example_build(example, module, &[])
}

/// [`example_module`] built with `features` (into a target directory of
/// its own when there are any: the component has the crate's name).
pub(super) fn example_build(example: &str, module: Option<&Path>, features: &[&str]) -> Result<PathBuf> {
    if let Some(path) = module {
        return Ok(path.to_owned());
    }
    // A clone of the repository: the working directory, else the one this
    // binary was built in (gone for an installed one).
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host/ has a parent").to_owned();
    let dir = Path::new("examples").join(example);
    let Some(repo) = [PathBuf::from("."), built_in].into_iter().find(|repo| repo.join(&dir).is_dir()) else {
        bail!(
            "the demo builds the {example} example of the repository, and there is no `examples/{example}` here: run \
             it in a clone of the repository, or pass --module <{example}.wasm> (built there with `waku build \
             examples/{example} --out {example}.wasm`)"
        );
    };
    let crate_dir = repo.join(dir);
    let mut target_dir = repo.join("target").join("guests");
    if !features.is_empty() {
        target_dir = target_dir.join(format!("{example}-{}", features.join("-")));
    }
    let features = features.iter().map(|feature| (*feature).to_owned()).collect();
    let build = GuestBuild { target_dir: Some(target_dir), features, ..GuestBuild::new(crate_dir) };
    Ok(build.run()?)
}

pub(super) async fn run_demo(args: DemoArgs) -> Result<ExitCode> {
    match args.example {
        Some(DemoExample::Inventory(inventory)) => return super::demo_inventory::run(inventory).await,
        Some(DemoExample::Nexmark(nexmark)) => return super::demo_nexmark::run(nexmark).await,
        None => {}
    }
    let module_path = example_module("bank", args.module.as_deref())?;
    let temp;
    let data_dir = match &args.data {
        Some(dir) => {
            if dir.exists() {
                bail!("{} already exists; the demo needs a fresh directory", dir.display());
            }
            dir.clone()
        }
        None => {
            temp = tempfile::tempdir().context("creating a temporary directory")?;
            temp.path().to_owned()
        }
    };
    let stream = format!("waku-demo-{}", std::time::SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis());
    let mut settings = HostSettings::new(data_dir, "bank", TOPIC, ModuleSource::Loaded(Vec::new()));
    if let Some(url) = &args.iggy {
        settings.log = LogSettings::Iggy { url: url.clone(), stream, lossy_topics: false };
    }
    args.consume.apply(&mut settings)?;
    settings.compile_cache = CompileCache::Off;
    settings.admin = args.admin;
    args.admin_access.apply(&mut settings)?;
    settings.until_caught_up = true;
    settings.telemetry_from_env = true;
    let module = load_module_file(&settings.sandbox()?, &module_path)
        .map_err(hint_at_limit_flags)
        .with_context(|| format!("loading module {}", module_path.display()))?;
    settings.modules = ModuleSource::Loaded(vec![module.clone()]);
    let spec = WorkloadSpec { events: args.events, accounts: args.accounts, seed: args.seed };
    let report = demo_run(settings, module, spec, args.partitions).await?;
    let verdict = if report.check.matches() { ExitCode::SUCCESS } else { ExitCode::from(3) };
    // The verdict stands even when the report could not be printed.
    match outln!("{}", report.lines.join("\n")).and_then(|()| outln!("{}", report.check.report(5))) {
        Err(error) if !error.reader_gone() => Err(error.into()),
        _ => Ok(verdict),
    }
}

pub(super) struct DemoReport {
    lines: Vec<String>,
    check: demo::OracleCheck,
}

pub(super) async fn demo_run(
    settings: HostSettings,
    module: Arc<dyn HandlerModule>,
    spec: WorkloadSpec,
    partitions: u32,
) -> Result<DemoReport> {
    let (events, oracle) = demo::workload(spec);
    let outgoing = demo::outgoing(&*module, &events)?;

    let log = Arc::new(settings.log.open(&settings.data).await?);
    log.create_topic(TOPIC, partitions).await?;
    let started = Instant::now();
    let published = publish::publish(&*log, TOPIC, module.clone(), outgoing, None, available_threads()).await?;
    let publish_secs = started.elapsed().as_secs_f64();

    let workers = settings.consumer.workers;
    let host = Host::start_on(log, settings).await.map_err(|error| explain(error, &[TOPIC.to_owned()]))?;
    if let Some(address) = host.admin_address() {
        errln!("waku: admin endpoint on {}", super::admin_access::served_url(address, host.serves_admin_tls()));
    }
    let projection = host.projection().clone();
    let metrics = host.metrics().clone();
    if std::io::stderr().is_terminal() {
        errln!("waku: consuming {published} events ...");
    }
    let started = Instant::now();
    let summary = host.finished().await?;
    let consume_secs = started.elapsed().as_secs_f64();

    let store = projection.store();
    let check = demo::check_projection(&oracle, &*module, store)?;

    let stats = store.stats()?;
    // Those the consumer's batches have not recorded yet are still the module's.
    let recycled = metrics.instances_recycled(projection.name(), module.name()) + module.take_instances_recycled();
    let lines = vec![
        format!(
            "workload: {} events over {} accounts (seed {}), {} partitions of topic `{TOPIC}`",
            spec.events, spec.accounts, spec.seed, partitions
        ),
        format!("module: {}@{} ({} event types)", module.name(), module.version(), module.event_types().len()),
        format!(
            "published: {published} events in {publish_secs:.2} s ({:.0} events/s)",
            published as f64 / publish_secs
        ),
        format!(
            "consumed: {} events in {} batches with {} workers: {} applied, {} skipped, {} dead-lettered, {} handler \
             calls",
            summary.consumed,
            summary.batches,
            workers,
            stats[Stat::Applied],
            stats[Stat::Skipped],
            stats[Stat::DeadLettered],
            summary.calls,
        ),
        format!("throughput: {:.0} events/s ({consume_secs:.2} s to consume)", summary.consumed as f64 / consume_secs),
        format!("time per phase (summed over partitions and workers): {}", summary.phases),
        format!("module instances replaced at their memory's high-water mark (publishing and consuming): {recycled}"),
    ];
    Ok(DemoReport { lines, check })
}
