//! `waku run`: consume a topic into a projection until stopped (or caught
//! up), with a progress bar while the start-up backlog is replayed.
//!
//! Rules kept here: a run that fails on its settings, its data directory
//! or its topics creates nothing (no data directory, log, projection or
//! compile cache) and compiles nothing: they are checked first, here and
//! in [`Host::start`]; `--create-topic` is what lets a run make them.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;

use super::admin_access::AdminServeArgs;
use super::args::{ConsumeArgs, DataArgs, TopicArgs};
use super::available_threads;
use super::config;
use super::local_host;
use super::signals::ShutdownSignals;
use crate::engine::consumer::{ConsumerError, Summary};
use crate::engine::progress::Progress;
use crate::engine::projection::ProjectionError;
use crate::operations::host::{CompileCache, Host, HostError, HostSettings, ModuleSource};
use crate::operations::lifecycle::LifecycleError;
use crate::sandbox::runtime::LoadError;
use crate::storage::log::LogError;
use crate::storage::state::StateStore;
use crate::storage::stats::Stat;

#[derive(Args)]
pub(super) struct RunArgs {
    #[command(flatten)]
    pub(super) data: DataArgs,
    /// The projection's name (its state file is named after it).
    #[arg(long)]
    pub(super) projection: String,
    #[command(flatten)]
    pub(super) topics: TopicArgs,
    /// With several topics: the most MiB of events each partition index
    /// holds for event-time order before it pauses the inputs that are
    /// ahead of the clock (read in event-time alignment).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub(super) max_held_mib: u64,
    /// With several topics: one of them whose events carry no event time
    /// (a catalogue). Its events are applied as they arrive, and it serves
    /// as the processing-time clock once every other topic's partitions are
    /// idle (reached an end offset the log reported). Give it more than once
    /// for several.
    #[arg(long = "untimed-topic", value_name = "TOPIC", value_delimiter = ',')]
    pub(super) untimed_topics: Vec<String>,
    /// With several topics: the most an event time may be ahead of the
    /// time the log appended its message (`90s`, `1h`, `2d`). An event
    /// further ahead goes to the dead-letter topic with its reason instead
    /// of holding or moving the clock (`waku dlq redrive` applies it).
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = event_time_span, allow_hyphen_values = true)]
    pub(super) max_event_time_ahead: Duration,
    /// With several topics: how far the projection's clock trails the
    /// evidence (`0s`, `2s`, `1m`), so that an event read at most this late
    /// is still applied in event-time order; a later one is applied at once
    /// and counted as late. Events within it of the latest event time wait
    /// until the log says more.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = event_time_span, allow_hyphen_values = true)]
    pub(super) allowed_lateness: Duration,
    /// The directory of the projection's modules (*.wasm).
    #[arg(long)]
    pub(super) modules: PathBuf,
    /// A module from an OCI registry, `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`
    /// (repeat, or comma-separate): pulled into the module directory as
    /// `<last segment>.wasm` at start-up and pinned to its digest; a
    /// restart runs the pinned digest even if the tag moved (`waku modules
    /// adopt` or --adopt-modules takes the new one). In waku.toml:
    /// `module-ref = ["oci://…"]`.
    #[arg(long = "module-ref", value_name = "REF", value_delimiter = ',', value_parser = module_ref)]
    pub(super) module_refs: Vec<crate::operations::oci::ModuleRef>,
    /// Only these partitions (comma-separated), e.g. `0,2`.
    #[arg(long, value_delimiter = ',')]
    pub(super) partitions: Option<Vec<u32>>,
    /// Join this Iggy consumer group for the topic and consume exactly the
    /// partitions Iggy assigns, following changes as hosts join and leave.
    /// Needs `--iggy` and `--state postgres://…` (a partition's state must
    /// follow it to another host).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["partitions", "until_caught_up"])]
    pub(super) group: Option<String>,
    /// Stop once the end offsets read at start-up are reached.
    #[arg(long)]
    pub(super) until_caught_up: bool,
    /// Create the topic with this many partitions if it does not exist (an
    /// existing one must have as many). Without it a missing topic is an
    /// error: `run` never creates the topic it consumes unasked.
    #[arg(long, value_name = "PARTITIONS")]
    pub(super) create_topic: Option<u32>,
    /// Run the module versions in the directory even where the projection
    /// recorded others (by default a restart runs the recorded versions and
    /// reports the difference).
    #[arg(long)]
    pub(super) adopt_modules: bool,
    /// Do not watch the module directory for new versions.
    #[arg(long)]
    pub(super) no_watch: bool,
    /// Keep compiled modules here (default: `<data>/cache`).
    #[arg(long, conflicts_with = "no_compile_cache")]
    pub(super) compile_cache: Option<PathBuf>,
    /// Compile every module at start-up instead of using the cache.
    #[arg(long)]
    pub(super) no_compile_cache: bool,
    /// The most MiB the compile cache keeps: past it, the least recently
    /// used compiled modules are removed (never those of the versions
    /// running), to be compiled again if loaded again.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub(super) compile_cache_max_mib: u64,
    /// With `--state postgres://…`: the most the host keeps in memory of
    /// the state of the partitions it holds, so that handlers read it
    /// without a round trip to the database (a batch loads what it lacks
    /// in one query, up to as much again). 0 keeps nothing and reads each
    /// entry with a query of its own.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(0..=1 << 20))]
    pub(super) state_cache_mib: u64,
    /// Serve the admin endpoint (health, readiness, metrics, modules,
    /// state, status) on this address, e.g. `127.0.0.1:9100`. An address
    /// other than loopback needs a token (--admin-token-file) or
    /// --admin-insecure.
    #[arg(long, value_parser = super::admin_access::serve_address)]
    pub(super) admin: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub(super) admin_access: AdminServeArgs,
    #[command(flatten)]
    pub(super) consume: ConsumeArgs,
    /// Print the effective settings and where each came from (flag,
    /// environment variable, config file, default), secrets masked, and
    /// exit.
    #[arg(long)]
    pub(super) print_config: bool,
}

/// The longest span of event time a setting takes
/// (`--max-event-time-ahead`, `--allowed-lateness`): 100 years (of 365.25
/// days, as durations are written: `100years`).
const MAX_EVENT_TIME_SPAN: Duration = Duration::from_secs(3_155_760_000);

/// Parses a span of event time: a duration such as `90s`, `5m` or `1h`,
/// not negative, at most [`MAX_EVENT_TIME_SPAN`].
pub(super) fn event_time_span(text: &str) -> Result<Duration, String> {
    if text.trim_start().starts_with('-') {
        return Err(format!("`{text}` is negative; give a duration of 0s or more, such as `5s` or `1h`"));
    }
    let span = humantime::parse_duration(text)
        .map_err(|error| format!("`{text}` is not a duration ({error}); give one such as `90s`, `5m` or `1h`"))?;
    if span > MAX_EVENT_TIME_SPAN {
        return Err(format!("`{text}` is over the most allowed, {}", humantime::format_duration(MAX_EVENT_TIME_SPAN)));
    }
    Ok(span)
}

/// Milliseconds of a span [`event_time_span`] accepted (it fits).
fn span_millis(span: Duration) -> wakuwaku_core::release::Millis {
    wakuwaku_core::release::Millis::try_from(span.as_millis()).unwrap_or(wakuwaku_core::release::Millis::MAX)
}

/// Parses a `--module-ref`.
pub(super) fn module_ref(text: &str) -> Result<crate::operations::oci::ModuleRef, String> {
    text.parse().map_err(|error: crate::operations::oci::OciError| error.to_string())
}

impl RunArgs {
    /// The first topic: it names the projection's retry and dead-letter
    /// topics.
    pub(super) fn topic(&self) -> &str {
        self.topics.first()
    }

    /// The host these flags ask for.
    pub(super) fn settings(&self) -> Result<HostSettings> {
        let modules =
            ModuleSource::Directory { path: self.modules.clone(), adopt: self.adopt_modules, watch: !self.no_watch };
        let mut settings = HostSettings::new(&self.data.data, &self.projection, self.topic(), modules);
        settings.more_topics = self.topics.more().to_vec();
        settings.module_refs = self.module_refs.clone();
        settings.log = self.data.log_settings();
        settings.state = self.data.state_settings();
        settings.consumer.partitions = self.partitions.clone();
        self.consume.apply(&mut settings)?;
        // After the consumer's configuration is made, which would reset them.
        settings.consumer.release.max_held_bytes = self.max_held_mib << 20;
        settings.consumer.release.max_ahead = span_millis(self.max_event_time_ahead);
        settings.consumer.release.allowed_lateness = span_millis(self.allowed_lateness);
        settings.consumer.untimed_topics = self.untimed_topics.clone();
        settings.create_topic = self.create_topic;
        settings.compile_cache = match (&self.compile_cache, self.no_compile_cache) {
            (_, true) => CompileCache::Off,
            (Some(dir), false) => CompileCache::At(dir.clone()),
            (None, false) => CompileCache::InData,
        };
        settings.compile_cache_max_bytes = self.compile_cache_max_mib << 20;
        settings.state_cache_bytes = usize::try_from(self.state_cache_mib << 20).unwrap_or(usize::MAX);
        settings.admin = self.admin;
        self.admin_access.apply(&mut settings)?;
        settings.until_caught_up = self.until_caught_up;
        settings.group = self.group.clone();
        settings.telemetry_from_env = true;
        Ok(settings)
    }
}

pub(super) async fn run(args: RunArgs, layered: &[config::Setting]) -> Result<()> {
    // Caught before anything slow happens.
    let signals = ShutdownSignals::install()?;
    if let Some(summary) = config::summary(layered) {
        errln!("waku: {summary}");
    }
    let loading = Instant::now();
    let settings = args.settings().map_err(|error| name_the_source(error, layered))?;
    if args.data.iggy.is_none() && args.create_topic.is_none() {
        // A misspelt `--data` (data directories stand beside it) is said as
        // such, and made nowhere; with none beside it the host says the
        // topic is missing and how to create it, and creates nothing either.
        if let Err(missing @ super::existing::Missing::DataDir { .. }) = super::existing::data_dir(&args.data.data)
            && missing.names_others()
        {
            return Err(missing.into());
        }
    }
    let host = Host::start(settings).await.map_err(|error| explain(error, args.topics.all()))?;
    for difference in host.differences() {
        errln!("waku: {difference}");
    }
    let projection = host.projection();
    errln!(
        "waku: projection `{}` on topic `{}`: {} ({} event types, loaded in {:.2} s), batch {}, {} workers",
        args.projection,
        args.topics.all().join("`, `"),
        projection.modules().iter().map(|m| format!("{}@{}", m.name(), m.version())).collect::<Vec<_>>().join(", "),
        projection.modules().iter().map(|m| m.event_types().len()).sum::<usize>(),
        loading.elapsed().as_secs_f64(),
        args.consume.batch_size,
        args.consume.workers.unwrap_or_else(available_threads),
    );
    errln!("waku: sandbox limits: {}", host.sandbox().limits());
    if let Some(address) = host.admin_address() {
        errln!("waku: admin endpoint on {}", super::admin_access::served_url(address, host.serves_admin_tls()));
    }
    let store = projection.store().clone();
    let shared =
        local_host::Shared::of_host(&args.data.data, &args.projection, host.log(), &store, args.data.state.is_none())
            .with_live_modules(host.library(), projection)
            .with_live_status(projection, host.live_status());
    let served = local_host::serve_or_warn(shared, super::run_forwarded);
    let display = show_progress(&args.projection, host.progress().clone());
    let started = Instant::now();
    let summary = host.stop_when(signals.first()).await;
    drop(display);
    drop(served);
    let summary = summary.map_err(|error| explain(error, args.topics.all()))?;
    print_summary(&summary, started.elapsed().as_secs_f64(), &store)
}

/// Names where a refused setting came from when it was not its flag: the
/// checks of [`RunArgs::settings`] name the flag (`--workers must be at
/// least 1`), which misleads when the value came from the environment or
/// the file.
fn name_the_source(error: anyhow::Error, layered: &[config::Setting]) -> anyhow::Error {
    let message = error.to_string();
    let from_elsewhere = layered.iter().find(|setting| {
        message.starts_with(&format!("--{} ", setting.name))
            && matches!(setting.source, config::Source::Env(_) | config::Source::File(_))
    });
    match from_elsewhere {
        Some(setting) => error.context(format!("bad value for setting `{}` from {}", setting.name, setting.source)),
        None => error,
    }
}

/// Turns a host's error into one that says what to do where the flags can
/// help: a missing topic, a module that does not fit the sandbox limits.
pub(super) fn explain(error: HostError, topics: &[String]) -> anyhow::Error {
    match error {
        HostError::Consumer(ConsumerError::Log(LogError::TopicNotFound { topic: missing }))
            if topics.contains(&missing) =>
        {
            anyhow::anyhow!(
                "topic `{missing}` does not exist; create it with `waku run --create-topic <partitions>` or `waku \
                 publish --partitions <partitions>`"
            )
        }
        HostError::Modules(error) => hint_at_limit_flags(error),
        other => other.into(),
    }
}

/// While the start-up backlog is replayed, a progress bar on a terminal:
/// events done of the backlog, events/s, time left. Nothing when standard
/// error is not a terminal. Stops when dropped or caught up.
pub(super) fn show_progress(projection: &str, progress: Arc<Progress>) -> Option<ProgressDisplay> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:30}] {human_pos}/{human_len} events, {per_sec}, {eta} left",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(format!("replaying `{projection}`"));
    let shown = bar.clone();
    let task = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let (done, total) = progress.replayed();
            shown.set_length(total);
            shown.set_position(done);
            if progress.caught_up() {
                shown.finish_with_message("caught up");
                break;
            }
        }
    });
    Some(ProgressDisplay { bar, task })
}

/// A progress bar and the task that feeds it.
pub(super) struct ProgressDisplay {
    bar: indicatif::ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ProgressDisplay {
    fn drop(&mut self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}

/// Says which flags raise the limits when a module does not fit them.
pub(super) fn hint_at_limit_flags(error: impl Into<LifecycleError>) -> anyhow::Error {
    let error = error.into();
    let too_small = matches!(error, LifecycleError::Projection(ProjectionError::Load(LoadError::Instantiate { .. })));
    let error = anyhow::Error::new(error);
    if too_small {
        error.context(
            "a module does not fit the sandbox limits; raise them with --memory-mib, --max-table-elements or \
             --max-instances (see `waku help run`)",
        )
    } else {
        error
    }
}

pub(super) fn print_summary(summary: &Summary, secs: f64, store: &StateStore) -> Result<()> {
    use crate::platform::words::counted;
    let rate = crate::platform::words::per_second(summary.consumed, secs, "event")
        .map_or(String::new(), |rate| format!(" ({rate})"));
    outln!(
        "consumed {} in {}{rate}: {} applied, {} skipped, {} dead-lettered ({} malformed), {} sent to retry, {} taken \
         back",
        counted(summary.consumed, "event"),
        counted(summary.batches, "batch"),
        summary.applied,
        summary.skipped,
        summary.dead_lettered,
        summary.malformed,
        summary.retry_in,
        summary.retry_out,
    )?;
    if !summary.phases.total().is_zero() {
        outln!("time per phase (summed over partitions and workers): {}", summary.phases)?;
    }
    if summary.order_violations > 0 {
        outln!(
            "{} (read after the clock passed their event time) applied at once, out of event-time order",
            counted(summary.order_violations, "late event")
        )?;
    }
    let stats = store.stats()?;
    let waiting = stats.retrying();
    if waiting > 0 {
        outln!("{} in retry; the next `waku run` takes them when they are due", counted(waiting, "event"))?;
    }
    // Re-driven letters were applied (or dead-lettered again, counted
    // anew): they are no longer dead letters.
    let dead_letters = stats[Stat::DeadLettered].saturating_sub(stats[Stat::Redriven]);
    if dead_letters > 0 {
        outln!("{} in all (see `waku dlq list`)", counted(dead_letters, "dead letter"))?;
    }
    if stats[Stat::Undeliverable] > 0 {
        outln!(
            "{} emitted messages could not be delivered and are dead letters in all (class `undeliverable` in `waku \
             dlq list`)",
            stats[Stat::Undeliverable]
        )?;
    }
    Ok(())
}
