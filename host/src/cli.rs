//! The `waku` command line. It parses flags, calls the library, and turns
//! errors into messages a person can act on.
//!
//! Exit codes (stable): 0 success, including `run` stopped by SIGINT or
//! SIGTERM after committing the batch in flight, and a command whose
//! standard output was closed by its reader (`waku dlq list | head`); 1 an
//! error (printed as `waku: error: …` with its causes); 2 a usage error
//! (from the argument parser); 3 the demo's oracle check failed (even when
//! its report could not be printed); 130 `run` aborted by a second signal
//! (as after a crash, nothing committed is lost).
//!
//! Output: results go to standard output through `outln!`, which returns
//! write errors instead of panicking as `println!` does; a closed pipe ends
//! the command quietly with exit 0 (as a Unix tool killed by SIGPIPE would,
//! but through an error, as ripgrep does). SIGPIPE itself stays ignored, as
//! Rust sets it: a `run` must not die because the admin endpoint's client or
//! the Iggy server closed a socket, and it writes to standard output only its
//! final summary, so a closed pipe never stops it before its work is
//! committed. Messages go to standard error through `errln!`, which
//! ignores write errors: nobody reading them is no reason to stop. Log
//! lines are coloured only when standard error is a terminal and `NO_COLOR`
//! is unset or empty (<https://no-color.org>).
//!
//! Every limit is a flag of `run` and `demo`, one per field of
//! [`SandboxLimits`] (what the engine enforces) and of [`PayloadLimits`]
//! (what the consumer's key scopes enforce), defaulting to the library's
//! values. So is the retry policy ([`RetryPolicy`]): `--max-attempts`,
//! `--retry-delays`, `--transient-retries`, `--transient-backoff`.
//!
//! Data directory layout (`--data`, default `waku-data`):
//! `log.redb` is the embedded log (with `retry_<topic>` and `dlq_<topic>`
//! beside each consumed topic); `projections/<name>.redb` is a projection's
//! state, consumer positions, counts and retry bookkeeping.

use std::io::{ErrorKind, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};

use crate::admin::{self, Admin};
use crate::consumer::{Consumer, ConsumerConfig, ConsumerError, Summary, stat};
use crate::dead_letter::{self, DeadLetter, DeadLetterError, Selection};
use crate::demo::{self, WorkloadSpec};
use crate::guest_build::GuestBuild;
use crate::handler::{HandlerModule, LimitsError, PayloadLimits};
use crate::key::Key;
use crate::lifecycle::{Library, LifecycleError, LogEmitTopics, Reloader, ensure_emit_topics};
use crate::log::EventLog;
use crate::log::{AnyLog, EmbeddedLog, IggyLog, LogError};
use crate::metrics::Metrics;
use crate::progress::Progress;
use crate::projection::{Projection, ProjectionError, load_module_file};
use crate::publish::{self, Outgoing};
use crate::routing::RetryPolicy;
use crate::runtime::{LoadError, Sandbox, SandboxLimits};
use crate::state::StateStore;
use wakuwaku_core::limits::printable;

/// `println!` for a command's results, returning the write error instead of
/// panicking, so that `?` ends the command; `report` ends a closed pipe
/// quietly.
macro_rules! outln {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout().lock(), $($arg)*).map_err(StdoutError)
    };
}

/// `eprintln!` for messages, ignoring write errors: when nobody reads
/// standard error any more the command still does its work.
macro_rules! errln {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// A command's result could not be written to standard output.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to standard output")]
struct StdoutError(#[source] std::io::Error);

impl StdoutError {
    /// Whether the reader closed its end (`| head`): the command ends
    /// quietly with exit 0.
    fn reader_gone(&self) -> bool {
        self.0.kind() == ErrorKind::BrokenPipe
    }
}

/// Runs event handlers as WebAssembly components over a partitioned log.
#[derive(Parser)]
#[command(name = "waku", version, about, propagate_version = true, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build a guest into a handler component: a Rust crate (cargo,
    /// wasm32-wasip2) or a Python project (pyproject.toml; componentize-py).
    Build(BuildArgs),
    /// Publish JSON lines to a topic, with headers from the module.
    Publish(PublishArgs),
    /// Consume a topic into a projection.
    Run(RunArgs),
    /// Read a projection's state.
    #[command(subcommand)]
    State(StateCommand),
    /// List, inspect and re-drive a projection's dead letters.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Show a projection's module versions, or roll one back.
    #[command(subcommand)]
    Modules(ModulesCommand),
    /// Where a projection stands: per partition position, end, lag; module
    /// versions; counts of applied, skipped, retrying, dead-lettered events.
    Status(StatusArgs),
    /// Build the bank example, publish a seeded workload, consume it, and
    /// check the read model against an oracle.
    Demo(DemoArgs),
}

#[derive(Args)]
struct DataArgs {
    /// The data directory (embedded log and projection state).
    #[arg(long, default_value = "waku-data")]
    data: PathBuf,
    /// Use an Apache Iggy server as the log instead of the embedded one:
    /// `iggy://user:password@host:port` (client options such as
    /// `?reconnection_retries=10&reconnection_interval=1s` may follow).
    #[arg(long)]
    iggy: Option<String>,
    /// The Iggy stream holding the topics (created if missing).
    #[arg(long, default_value = "waku", requires = "iggy")]
    stream: String,
}

impl DataArgs {
    async fn log(&self) -> Result<AnyLog> {
        match &self.iggy {
            Some(url) => Ok(AnyLog::Iggy(
                IggyLog::connect(url, &self.stream)
                    .await
                    .with_context(|| format!("connecting to Iggy, stream `{}`", self.stream))?,
            )),
            None => {
                let path = self.data.join("log.redb");
                let log =
                    EmbeddedLog::open(&path).with_context(|| format!("opening the embedded log {}", path.display()))?;
                Ok(AnyLog::Embedded(log))
            }
        }
    }

    fn state(&self, projection: &str) -> Result<StateStore> {
        crate::log::embedded::validate_topic_name(projection)
            .with_context(|| format!("`{projection}` cannot name a projection"))?;
        let path = self.data.join("projections").join(format!("{projection}.redb"));
        StateStore::open(&path).with_context(|| format!("opening the state of projection `{projection}`"))
    }
}

#[derive(Args)]
struct BuildArgs {
    /// The guest's directory: a crate (Cargo.toml) or a Python project
    /// (pyproject.toml with a [tool.wakuwaku] table naming its module).
    #[arg(default_value = ".")]
    crate_dir: PathBuf,
    /// Copy the component to this file.
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// Build without optimisation (Rust only).
    #[arg(long)]
    debug: bool,
    /// Cargo's target directory; a Python component goes to
    /// <it>/python/<module>.wasm (default: the project's target/).
    #[arg(long)]
    target_dir: Option<PathBuf>,
}

#[derive(Args)]
struct PublishArgs {
    #[command(flatten)]
    data: DataArgs,
    /// The topic to publish to.
    #[arg(long)]
    topic: String,
    /// The handler module whose `key` and `ordering` write the headers.
    #[arg(long)]
    module: PathBuf,
    /// Create the topic with this many partitions if it does not exist.
    #[arg(long)]
    partitions: Option<u32>,
    /// JSON lines, `{"type": "<event type>", "body": {...}}`; `-` reads stdin.
    file: PathBuf,
}

#[derive(Args)]
struct ConsumeArgs {
    /// Most messages per batch.
    #[arg(long, default_value_t = ConsumerConfig::default().batch_size)]
    batch_size: usize,
    /// Worker threads per batch (default: the number of cores).
    #[arg(long)]
    workers: Option<usize>,
    /// Create the topics a module declares it emits to, with this many
    /// partitions, when they do not exist. Without it a missing emit topic
    /// refuses the module (at start-up, or the new version on reload).
    #[arg(long, value_name = "PARTITIONS")]
    create_emit_topics: Option<u32>,
    #[command(flatten)]
    retry: RetryArgs,
    #[command(flatten)]
    limits: LimitArgs,
}

/// How failed events are retried ([`RetryPolicy`]).
#[derive(Args, Debug, Clone, PartialEq, Eq)]
#[command(next_help_heading = "Retries")]
struct RetryArgs {
    /// Attempts before a retryable failure or a trap is dead-lettered
    /// (1: at once).
    #[arg(long, default_value_t = RetryPolicy::default().max_attempts)]
    max_attempts: u32,
    /// Waits before attempts 2, 3, …, measured from the failure; the last
    /// repeats. E.g. `1s,5s,30s,2m,10m` (the default) or `0s`.
    #[arg(long, value_delimiter = ',', value_parser = humantime::parse_duration)]
    retry_delays: Option<Vec<Duration>>,
    /// In-place retries of a transient failure before it counts as
    /// retryable.
    #[arg(long, default_value_t = RetryPolicy::default().transient_retries)]
    transient_retries: u32,
    /// The first in-place backoff (it doubles), e.g. `10ms`.
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    transient_backoff: Duration,
}

impl RetryArgs {
    fn policy(&self) -> Result<RetryPolicy> {
        if self.max_attempts == 0 {
            bail!("--max-attempts must be at least 1");
        }
        let delays = self.retry_delays.clone().unwrap_or_else(|| RetryPolicy::default().delays);
        Ok(RetryPolicy {
            transient_retries: self.transient_retries,
            transient_backoff: self.transient_backoff,
            delays,
            max_attempts: self.max_attempts,
        })
    }
}

/// One flag per limit of [`SandboxLimits`] and of [`PayloadLimits`]; the
/// defaults are the library's.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
#[command(next_help_heading = "Sandbox limits (per module instance)")]
struct LimitArgs {
    /// Memory limit per module instance, in MiB.
    #[arg(long, default_value_t = SandboxLimits::default().memory_bytes >> 20)]
    memory_mib: usize,
    /// CPU budget per handler call, in milliseconds.
    #[arg(long, default_value_t = SandboxLimits::default().call_budget.as_millis() as u64)]
    call_budget_ms: u64,
    /// Most wasm stack one call may use, in KiB (deep recursion traps).
    #[arg(long, default_value_t = SandboxLimits::default().max_wasm_stack >> 10)]
    max_wasm_stack_kib: usize,
    /// Most table elements (function references) per instance.
    #[arg(long, default_value_t = SandboxLimits::default().table_elements)]
    max_table_elements: usize,
    /// Most core instances (and memories, and tables) one module instance may create.
    #[arg(long, default_value_t = SandboxLimits::default().instances)]
    max_instances: usize,
    /// Largest state value a handler may write, in KiB; a larger write is
    /// refused (`state-value-size`).
    #[arg(long, default_value_t = PayloadLimits::default().max_state_value >> 10, help_heading = PAYLOAD)]
    max_state_value_kib: usize,
    /// Most state writes (set or delete) one handler call may make.
    #[arg(long, default_value_t = PayloadLimits::default().max_state_writes_per_call, help_heading = PAYLOAD)]
    max_state_writes_per_call: usize,
    /// Most KiB of entry names and values one handler call may write.
    #[arg(long, default_value_t = PayloadLimits::default().max_state_bytes_per_call >> 10, help_heading = PAYLOAD)]
    max_state_kib_per_call: usize,
    /// Most counter changes one handler call may make.
    #[arg(long, default_value_t = PayloadLimits::default().max_counter_changes_per_call, help_heading = PAYLOAD)]
    max_counter_changes_per_call: usize,
    /// Largest body a handler may emit (or `combine` may return), in KiB; a
    /// larger emit is refused (`emit-body-size`).
    #[arg(long, default_value_t = PayloadLimits::default().max_emit_body >> 10, help_heading = PAYLOAD)]
    max_emit_kib: usize,
    /// Most messages one handler call may emit.
    #[arg(long, default_value_t = PayloadLimits::default().max_emits_per_call, help_heading = PAYLOAD)]
    max_emits_per_call: usize,
    /// Most KiB of topics, keys and bodies one handler call may emit.
    #[arg(long, default_value_t = PayloadLimits::default().max_emit_bytes_per_call >> 10, help_heading = PAYLOAD)]
    max_emit_kib_per_call: usize,
    /// Longest handler log line kept, in bytes; longer lines are cut and
    /// marked, never an error.
    #[arg(long, default_value_t = PayloadLimits::default().max_log_line, help_heading = PAYLOAD)]
    max_log_line_bytes: usize,
    /// Most log lines one handler call may write; later ones are dropped
    /// and counted.
    #[arg(long, default_value_t = PayloadLimits::default().max_log_lines_per_call, help_heading = PAYLOAD)]
    max_log_lines_per_call: usize,
    /// Most MiB the host holds for the state writes, counter changes and
    /// emits of the batches in flight (one per partition) together; a call
    /// past it is retried in a later batch.
    #[arg(long, default_value_t = PayloadLimits::default().max_batch_held >> 20, help_heading = PAYLOAD)]
    max_batch_held_mib: usize,
}

/// The help heading of the payload limits.
const PAYLOAD: &str = "Payload limits (what a module may hand the host)";

impl LimitArgs {
    /// Every limit flag with its value, to refuse zeros by name.
    fn flags(&self) -> [(&'static str, u64); 15] {
        [
            ("--memory-mib", self.memory_mib as u64),
            ("--call-budget-ms", self.call_budget_ms),
            ("--max-wasm-stack-kib", self.max_wasm_stack_kib as u64),
            ("--max-table-elements", self.max_table_elements as u64),
            ("--max-instances", self.max_instances as u64),
            ("--max-state-value-kib", self.max_state_value_kib as u64),
            ("--max-state-writes-per-call", self.max_state_writes_per_call as u64),
            ("--max-state-kib-per-call", self.max_state_kib_per_call as u64),
            ("--max-counter-changes-per-call", self.max_counter_changes_per_call as u64),
            ("--max-emit-kib", self.max_emit_kib as u64),
            ("--max-emits-per-call", self.max_emits_per_call as u64),
            ("--max-emit-kib-per-call", self.max_emit_kib_per_call as u64),
            ("--max-log-line-bytes", self.max_log_line_bytes as u64),
            ("--max-log-lines-per-call", self.max_log_lines_per_call as u64),
            ("--max-batch-held-mib", self.max_batch_held_mib as u64),
        ]
    }

    /// The sandbox's limits the flags ask for; every flag must be at least 1.
    fn limits(&self) -> Result<SandboxLimits> {
        if let Some((flag, _)) = self.flags().iter().find(|(_, value)| *value == 0) {
            bail!("{flag} must be at least 1");
        }
        Ok(SandboxLimits {
            memory_bytes: scaled(self.memory_mib, 20, "--memory-mib")?,
            call_budget: std::time::Duration::from_millis(self.call_budget_ms),
            max_wasm_stack: scaled(self.max_wasm_stack_kib, 10, "--max-wasm-stack-kib")?,
            table_elements: self.max_table_elements,
            instances: self.max_instances,
        })
    }

    /// The payload limits the flags ask for; the consumer's key scopes and
    /// the sandbox enforce them.
    fn payload(&self) -> Result<PayloadLimits> {
        self.limits()?; // checks every flag
        let payload = PayloadLimits {
            max_state_value: scaled(self.max_state_value_kib, 10, "--max-state-value-kib")?,
            max_state_writes_per_call: self.max_state_writes_per_call,
            max_state_bytes_per_call: scaled(self.max_state_kib_per_call, 10, "--max-state-kib-per-call")?,
            max_counter_changes_per_call: self.max_counter_changes_per_call,
            max_emit_body: scaled(self.max_emit_kib, 10, "--max-emit-kib")?,
            max_emits_per_call: self.max_emits_per_call,
            max_emit_bytes_per_call: scaled(self.max_emit_kib_per_call, 10, "--max-emit-kib-per-call")?,
            max_log_line: self.max_log_line_bytes,
            max_log_lines_per_call: self.max_log_lines_per_call,
            max_batch_held: scaled(self.max_batch_held_mib, 20, "--max-batch-held-mib")?,
        };
        if let Err(LimitsError::BatchBelowCall { call, .. }) = payload.check() {
            bail!(
                "--max-batch-held-mib {} is less than one handler call may hold with the per-call limits ({} MiB); \
                 raise it or lower the per-call limits",
                self.max_batch_held_mib,
                call.div_ceil(1 << 20)
            );
        }
        Ok(payload)
    }
}

/// `value << shift` (a size in KiB or MiB, in bytes), or an error naming
/// the flag when it does not fit.
fn scaled(value: usize, shift: u32, flag: &str) -> Result<usize> {
    value.checked_mul(1 << shift).with_context(|| format!("{flag} {value} is too large"))
}

impl ConsumeArgs {
    /// The consumer's configuration, with the payload limits of the flags.
    fn config(&self, partitions: Option<Vec<u32>>) -> Result<ConsumerConfig> {
        if self.batch_size == 0 {
            bail!("--batch-size must be at least 1");
        }
        let mut config = ConsumerConfig {
            batch_size: self.batch_size,
            partitions,
            payload: self.limits.payload()?,
            retry: self.retry.policy()?,
            ..ConsumerConfig::default()
        };
        if let Some(workers) = self.workers {
            if workers == 0 {
                bail!("--workers must be at least 1");
            }
            config.workers = workers;
        }
        Ok(config)
    }

    /// The sandbox of the flags' limits (its payload limits apply to the
    /// calls outside `handle`).
    fn sandbox(&self) -> Result<Sandbox> {
        Ok(Sandbox::new(self.limits.limits()?)?.with_payload_limits(self.limits.payload()?))
    }
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    data: DataArgs,
    /// The projection's name (its state file is named after it).
    #[arg(long)]
    projection: String,
    /// The topic to consume.
    #[arg(long)]
    topic: String,
    /// The directory of the projection's modules (*.wasm).
    #[arg(long)]
    modules: PathBuf,
    /// Only these partitions (comma-separated), e.g. `0,2`.
    #[arg(long, value_delimiter = ',')]
    partitions: Option<Vec<u32>>,
    /// Stop once the end offsets read at start-up are reached.
    #[arg(long)]
    until_caught_up: bool,
    /// Create the topic with this many partitions if it does not exist (an
    /// existing one must have as many). Without it a missing topic is an
    /// error: `run` never creates the topic it consumes unasked.
    #[arg(long, value_name = "PARTITIONS")]
    create_topic: Option<u32>,
    /// Run the module versions in the directory even where the projection
    /// recorded others (by default a restart runs the recorded versions and
    /// reports the difference).
    #[arg(long)]
    adopt_modules: bool,
    /// Do not watch the module directory for new versions.
    #[arg(long)]
    no_watch: bool,
    /// Keep compiled modules here (default: `<data>/cache`).
    #[arg(long, conflicts_with = "no_compile_cache")]
    compile_cache: Option<PathBuf>,
    /// Compile every module at start-up instead of using the cache.
    #[arg(long)]
    no_compile_cache: bool,
    /// Serve the admin endpoint (health, readiness, metrics, modules,
    /// state, status) on this address, e.g. `127.0.0.1:9100`.
    #[arg(long)]
    admin: Option<std::net::SocketAddr>,
    #[command(flatten)]
    consume: ConsumeArgs,
}

#[derive(Args)]
struct StatusArgs {
    #[command(flatten)]
    target: ProjectionArgs,
    /// Ask the running host's admin endpoint instead of reading the files
    /// (which `waku run` holds open), e.g. `http://127.0.0.1:9100`.
    #[arg(long)]
    admin: Option<String>,
}

#[derive(Subcommand)]
enum ModulesCommand {
    /// Each module's active version and the versions kept for rollback.
    List(ModulesListArgs),
    /// Make an earlier kept version of a module active (the next `waku run`
    /// runs it). Stop `waku run` first.
    Rollback(ModulesRollbackArgs),
}

#[derive(Args)]
struct ModulesListArgs {
    #[command(flatten)]
    data: DataArgs,
    /// The projection.
    #[arg(long)]
    projection: String,
    /// Also compare with the files of this module directory.
    #[arg(long)]
    modules: Option<PathBuf>,
}

#[derive(Args)]
struct ModulesRollbackArgs {
    #[command(flatten)]
    data: DataArgs,
    /// The projection.
    #[arg(long)]
    projection: String,
    /// The module.
    module: String,
    /// The version (or a prefix of it); default: the one before the active.
    #[arg(value_name = "VERSION")]
    target: Option<String>,
}

#[derive(Subcommand)]
enum StateCommand {
    /// Print a key's state entries (and the shared counters) as JSON.
    Get(StateGetArgs),
}

#[derive(Args)]
struct StateGetArgs {
    #[command(flatten)]
    data: DataArgs,
    /// The projection.
    #[arg(long)]
    projection: String,
    /// The key, as the module's log lines and `waku dlq list` print it
    /// (JSON: `42`, `'"ann"'`, `'[42,"eur"]'`).
    #[arg(long, conflicts_with = "event", required_unless_present = "event")]
    key: Option<String>,
    /// Find the key from an event body: `<event type>=<JSON body>`, e.g.
    /// `AccountOpened={"account":42,"owner":""}`; needs --module.
    #[arg(long, requires = "module")]
    event: Option<String>,
    /// The module that computes the key of --event.
    #[arg(long)]
    module: Option<PathBuf>,
    /// Only this entry.
    entry: Option<String>,
}

#[derive(Subcommand)]
enum DlqCommand {
    /// List the dead letters of a projection, one per line.
    List(ProjectionArgs),
    /// Print one dead letter in full: where it came from, why, its body.
    Show(DlqShowArgs),
    /// Send dead letters back through the normal path (after fixing the
    /// module): they join the retry topic, in dead-letter order per key, and
    /// the next `waku run` applies them. Only the partitions this host's
    /// state store owns (those it holds a position for: the ones its `waku
    /// run` consumes) are re-driven; it says which, and which it left to
    /// other hosts. Stop `waku run` first: the embedded log and state files
    /// are open in one process at a time.
    Redrive(DlqRedriveArgs),
}

/// A projection and the topic it consumes (its retry and dead-letter
/// topics are `retry_<topic>` and `dlq_<topic>`).
#[derive(Args)]
struct ProjectionArgs {
    #[command(flatten)]
    data: DataArgs,
    /// The projection.
    #[arg(long)]
    projection: String,
    /// The topic it consumes.
    #[arg(long)]
    topic: String,
}

#[derive(Args)]
struct DlqShowArgs {
    #[command(flatten)]
    dlq: ProjectionArgs,
    /// The dead letter's partition.
    #[arg(long)]
    partition: u32,
    /// Its offset in the dead-letter topic.
    #[arg(long)]
    offset: u64,
}

#[derive(Args)]
struct DlqRedriveArgs {
    #[command(flatten)]
    dlq: ProjectionArgs,
    /// Only these partitions (comma-separated); each must be one this
    /// state store owns.
    #[arg(long, value_delimiter = ',')]
    partition: Vec<u32>,
    /// Only these records, as `<partition>:<offset>` (comma-separated); each
    /// must be in a partition this state store owns.
    #[arg(long, value_delimiter = ',', value_parser = parse_place)]
    record: Vec<(u32, u64)>,
    /// Only this key, as `waku dlq list` prints it (JSON: `42`, `'"ann"'`).
    #[arg(long)]
    key: Option<String>,
    /// Every dead letter of the projection not re-driven yet, in the
    /// partitions this state store owns.
    #[arg(long, conflicts_with_all = ["partition", "record", "key"])]
    all: bool,
}

#[derive(Args)]
struct DemoArgs {
    /// Events to generate.
    #[arg(long, default_value_t = 1_000_000)]
    events: usize,
    /// Accounts to spread them over.
    #[arg(long, default_value_t = 10_000)]
    accounts: u64,
    /// Seed of the workload.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Partitions of the `accounts` topic.
    #[arg(long, default_value_t = 4)]
    partitions: u32,
    /// Keep the log and state here (must not exist yet) instead of a
    /// temporary directory.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Use this bank module instead of building examples/bank.
    #[arg(long)]
    module: Option<PathBuf>,
    /// Serve the admin endpoint on this address while the demo runs.
    #[arg(long)]
    admin: Option<std::net::SocketAddr>,
    /// Run the demo on an Apache Iggy server instead of the embedded log
    /// (`iggy://user:password@host:port`), in a fresh stream
    /// `waku-demo-<time>`; the projection's state stays local.
    #[arg(long)]
    iggy: Option<String>,
    #[command(flatten)]
    consume: ConsumeArgs,
}

/// The exit codes, for `waku --help`.
const EXIT_CODES: &str = "Exit codes: 0 success (also when standard output is closed early, as by `| head`), 1 \
                          error, 2 usage error, 3 the demo's oracle check failed, 130 `run` aborted by a second \
                          signal.";

/// Runs the command line and returns the process's exit code.
pub fn main() -> ExitCode {
    main_with(std::env::args_os())
}

/// Runs the command line `args` (the first is the program's name), as
/// the `waku` binary would; for benchmarks that time a command in-process.
pub fn main_with(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = Cli::parse_from(args);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    // A second command in one process keeps the first one's subscriber.
    let colours = log_colours(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colours).try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return report(&anyhow::Error::new(error).context("starting the async runtime")),
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(code) => code,
        Err(error) => report(&error),
    }
}

/// Whether log lines get colours: only on a terminal, and not when
/// `NO_COLOR` is set to anything but the empty string
/// (<https://no-color.org>).
fn log_colours(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

/// Prints `error` with its causes and returns exit code 1; nothing, and 0,
/// when standard output was closed by its reader.
fn report(error: &anyhow::Error) -> ExitCode {
    if stdout_closed(error) {
        return ExitCode::SUCCESS;
    }
    errln!("waku: error: {error}");
    for cause in error.chain().skip(1) {
        errln!("  caused by: {cause}");
    }
    ExitCode::from(1)
}

/// Whether `error` is a write to a standard output whose reader is gone; a
/// broken pipe anywhere else (a socket to the log) is a real error.
fn stdout_closed(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| cause.downcast_ref::<StdoutError>().is_some_and(StdoutError::reader_gone))
}

async fn dispatch(command: Command) -> Result<ExitCode> {
    match command {
        Command::Build(args) => build(args).map(|()| ExitCode::SUCCESS),
        Command::Publish(args) => publish_file(args).await.map(|()| ExitCode::SUCCESS),
        Command::Run(args) => run(args).await.map(|()| ExitCode::SUCCESS),
        Command::State(StateCommand::Get(args)) => state_get(args).map(|()| ExitCode::SUCCESS),
        Command::Dlq(command) => dlq(command).await.map(|()| ExitCode::SUCCESS),
        Command::Modules(command) => modules(command).map(|()| ExitCode::SUCCESS),
        Command::Status(args) => status(args).await.map(|()| ExitCode::SUCCESS),
        Command::Demo(args) => run_demo(args).await,
    }
}

fn build(args: BuildArgs) -> Result<()> {
    let built =
        GuestBuild { target_dir: args.target_dir, release: !args.debug, ..GuestBuild::new(&args.crate_dir) }.run()?;
    let path = match args.out {
        Some(out) => {
            std::fs::copy(&built, &out).with_context(|| format!("copying {} to {}", built.display(), out.display()))?;
            out
        }
        None => built,
    };
    outln!("{}", path.display())?;
    Ok(())
}

fn load_module(sandbox: &Sandbox, path: &Path) -> Result<Arc<dyn HandlerModule>> {
    load_module_file(sandbox, path).with_context(|| format!("loading module {}", path.display()))
}

/// Says which flags raise the limits when a module does not fit them.
fn hint_at_limit_flags(error: impl Into<LifecycleError>) -> anyhow::Error {
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

async fn publish_file(args: PublishArgs) -> Result<()> {
    let text = if args.file == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("reading standard input")?;
        text
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?
    };
    let sandbox = Sandbox::new(SandboxLimits::default())?;
    let module = load_module(&sandbox, &args.module)?;
    let log = args.data.log().await?;
    if let Some(partitions) = args.partitions {
        log.create_topic(&args.topic, partitions).await?;
    }
    let events = publish::parse_json_lines(&text, &*module)
        .with_context(|| format!("nothing was published from {}", args.file.display()))?;
    let lines =
        text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()).map(|(index, _)| index + 1).collect();
    let count = publish::publish(&log, &args.topic, module, events, Some(lines), available_threads())
        .await
        .with_context(|| format!("nothing was published from {}", args.file.display()))?;
    outln!("published {count} events to `{}`", args.topic)?;
    Ok(())
}

async fn run(args: RunArgs) -> Result<()> {
    // Caught before anything slow happens.
    let signals = ShutdownSignals::install()?;
    let loading = Instant::now();
    let mut sandbox = args.consume.sandbox()?;
    if !args.no_compile_cache {
        let cache = args.compile_cache.clone().unwrap_or_else(|| args.data.data.join("cache"));
        sandbox = sandbox.with_compile_cache(&cache);
    }
    let metrics = Arc::new(Metrics::default());
    let store = args.data.state(&args.projection)?;
    let log = Arc::new(args.data.log().await?);
    // Every module loaded, now or on reload, must find its emit topics.
    let emit_topics = LogEmitTopics {
        log: log.clone(),
        create: args.consume.create_emit_topics,
        runtime: tokio::runtime::Handle::current(),
    };
    let library = Arc::new(
        Library::new(&args.data.data, &args.projection, store.clone(), sandbox.clone())
            .with_metrics(metrics.clone())
            .with_emit_topics(Arc::new(emit_topics)),
    );
    // Loading compiles and asks the log about emit topics: off the async
    // runtime's threads.
    let (modules, differences) = tokio::task::spawn_blocking({
        let (library, dir, adopt) = (library.clone(), args.modules.clone(), args.adopt_modules);
        move || library.start(&dir, adopt)
    })
    .await
    .context("loading the modules")?
    .map_err(hint_at_limit_flags)?;
    for difference in &differences {
        errln!("waku: {difference}");
    }
    let projection = Arc::new(Projection::new(&args.projection, &args.topic, modules, store)?);
    let _reloader = match args.no_watch {
        true => None,
        false => Some(Reloader::watch(library.clone(), projection.clone(), &args.modules)?),
    };
    if let Some(partitions) = args.create_topic {
        log.create_topic(&args.topic, partitions).await?;
    }
    let consumer = Consumer::new(log.clone(), projection.clone(), args.consume.config(args.partitions.clone())?)
        .with_metrics(metrics.clone());
    errln!(
        "waku: projection `{}` on topic `{}`: {} ({} event types, loaded in {:.2} s), batch {}, {} workers",
        args.projection,
        args.topic,
        projection.modules().iter().map(|m| format!("{}@{}", m.name(), m.version())).collect::<Vec<_>>().join(", "),
        projection.modules().iter().map(|m| m.event_types().len()).sum::<usize>(),
        loading.elapsed().as_secs_f64(),
        args.consume.batch_size,
        args.consume.workers.unwrap_or_else(available_threads),
    );
    errln!("waku: sandbox limits: {}", sandbox.limits());
    let (stop_admin, admin_stopped) = tokio::sync::oneshot::channel::<()>();
    if let Some(address) = args.admin {
        let listener = admin::bind(address).await?;
        errln!("waku: admin endpoint on http://{}", listener.local_addr()?);
        let admin = Admin {
            log,
            projection: projection.clone(),
            progress: consumer.progress(),
            metrics,
            library: Some(library.clone()),
        };
        tokio::spawn(async move {
            if let Err(error) = admin::serve(listener, admin, async {
                let _ = admin_stopped.await;
            })
            .await
            {
                errln!("waku: the admin endpoint stopped: {error}");
            }
        });
    }
    let display = show_progress(&args.projection, consumer.progress());
    let started = Instant::now();
    let summary = if args.until_caught_up {
        consumer.catch_up_or_stop(signals.first()).await
    } else {
        consumer.follow(signals.first()).await
    };
    drop(display);
    let _ = stop_admin.send(());
    let summary = summary.map_err(|error| match error {
        ConsumerError::Log(LogError::TopicNotFound { topic }) if topic == args.topic => anyhow::anyhow!(
            "topic `{topic}` does not exist; create it with `waku run --create-topic <partitions>` or `waku publish \
             --partitions <partitions>`"
        ),
        other => other.into(),
    })?;
    print_summary(&summary, started.elapsed().as_secs_f64(), projection.store())
}

/// While the start-up backlog is replayed, a progress bar on a terminal:
/// events done of the backlog, events/s, time left. Nothing when standard
/// error is not a terminal. Stops when dropped or caught up.
fn show_progress(projection: &str, progress: Arc<Progress>) -> Option<ProgressDisplay> {
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
struct ProgressDisplay {
    bar: indicatif::ProgressBar,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ProgressDisplay {
    fn drop(&mut self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}

/// SIGINT and SIGTERM, caught from the moment [`ShutdownSignals::install`]
/// returns: a signal that arrives while modules are still loading is not
/// lost to the default action (which kills the process), it stops the
/// consumer as soon as it starts.
struct ShutdownSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn install() -> Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                interrupt: signal(SignalKind::interrupt()).context("catching SIGINT")?,
                terminate: signal(SignalKind::terminate()).context("catching SIGTERM")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Waits for the next signal.
    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }

    /// Resolves on the first signal, after saying so. A second signal
    /// aborts the process at once (exit code 130), as a crash would:
    /// nothing committed is lost, the batch in flight is consumed again.
    async fn first(mut self) {
        self.next().await;
        errln!("waku: stopping after the batch in flight (signal again to abort)");
        tokio::spawn(async move {
            self.next().await;
            errln!("waku: aborted; the batch in flight was not committed");
            std::process::exit(130);
        });
    }
}

fn state_get(args: StateGetArgs) -> Result<()> {
    let store = args.data.state(&args.projection)?;
    let key = match (&args.key, &args.event, &args.module) {
        (Some(text), _, _) => parse_key(text)?,
        (None, Some(event), Some(module)) => {
            let (type_name, body) = event.split_once('=').context("--event takes `<event type>=<JSON body>`")?;
            let sandbox = Sandbox::new(SandboxLimits::default())?;
            let module = load_module(&sandbox, module)?;
            let event_type = module
                .event_types()
                .iter()
                .find(|t| t.name == type_name)
                .with_context(|| format!("the module declares no event type `{type_name}`"))?;
            let body: serde_json::Value = serde_json::from_str(body).context("the body of --event is not JSON")?;
            let body = serde_json::to_vec(&body)?;
            module.instantiate()?.key(event_type.tag, &body).context("the module could not compute the key")?
        }
        _ => bail!("give --key, or --event with --module"),
    };
    let output = admin::key_state_json(&store, &key, args.entry.as_deref())?;
    outln!("{}", serde_json::to_string_pretty(&output)?)?;
    Ok(())
}

async fn status(args: StatusArgs) -> Result<()> {
    let target = &args.target;
    let status = match &args.admin {
        Some(url) => {
            let url = format!("{}/status", url.trim_end_matches('/'));
            let body = ureq::get(&url)
                .call()
                .and_then(|mut response| response.body_mut().read_to_string())
                .with_context(|| format!("asking {url}"))?;
            let status: admin::Status =
                serde_json::from_str(&body).with_context(|| format!("{url} answered something else than a status"))?;
            if status.projection != target.projection {
                bail!("{url} runs projection `{}`, not `{}`", status.projection, target.projection);
            }
            status
        }
        None => {
            let hint = "is `waku run` using it? pass --admin <its admin endpoint>";
            let log = target.data.log().await.context(hint)?;
            let store = target.data.state(&target.projection).context(hint)?;
            let library = Library::new(
                &target.data.data,
                &target.projection,
                store.clone(),
                Sandbox::new(SandboxLimits::default())?,
            );
            let versions = library.recorded()?.active;
            admin::status(&log, &target.projection, &target.topic, &store, None, versions).await?
        }
    };
    let caught_up = status.partitions.iter().all(|p| p.caught_up);
    outln!(
        "projection `{}` on topic `{}`: {}",
        status.projection,
        status.topic,
        if caught_up { "caught up" } else { "catching up" }
    )?;
    let modules: Vec<String> = status.modules.iter().map(|(name, version)| format!("{name}@{version}")).collect();
    outln!("modules: {}", if modules.is_empty() { "none".to_owned() } else { modules.join(", ") })?;
    outln!(
        "events: {} applied, {} skipped, {} retrying, {} dead-lettered",
        status.applied,
        status.skipped,
        status.retrying,
        status.dead_lettered
    )?;
    outln!(
        "emitted messages: {} undeliverable (dead-lettered); outbox: {} records not yet appended",
        status.undeliverable,
        status.outbox
    )?;
    outln!("partition\tposition\tstart-up end\tend\tlag\tcaught up")?;
    for p in &status.partitions {
        let at_start = p.end_at_start.map_or_else(|| "-".to_owned(), |end| end.to_string());
        let caught_up = if p.caught_up { "yes" } else { "no" };
        outln!("{}\t{}\t{at_start}\t{}\t{}\t{caught_up}", p.partition, p.position, p.end, p.lag)?;
    }
    Ok(())
}

fn modules(command: ModulesCommand) -> Result<()> {
    let (data, projection) = match &command {
        ModulesCommand::List(args) => (&args.data, &args.projection),
        ModulesCommand::Rollback(args) => (&args.data, &args.projection),
    };
    let store = data.state(projection).context("is `waku run` using it? stop it first")?;
    let library = Library::new(&data.data, projection, store, Sandbox::new(SandboxLimits::default())?);
    match &command {
        ModulesCommand::List(args) => {
            let recorded = library.recorded()?;
            if recorded.active.is_empty() {
                outln!("projection `{projection}` has run no module yet")?;
            }
            let in_directory: std::collections::BTreeMap<String, String> = match &args.modules {
                None => Default::default(),
                Some(dir) => std::fs::read_dir(dir)
                    .with_context(|| format!("reading {}", dir.display()))?
                    .filter_map(Result::ok)
                    .map(|entry| entry.path())
                    .filter(|path| path.extension().is_some_and(|ext| ext == "wasm"))
                    .filter_map(|path| {
                        let bytes = std::fs::read(&path).ok()?;
                        Some((
                            path.file_stem()?.to_string_lossy().into_owned(),
                            crate::runtime::content_version(&bytes),
                        ))
                    })
                    .collect(),
            };
            for (module, active) in &recorded.active {
                let kept = recorded.kept.get(module).map(Vec::as_slice).unwrap_or_default();
                let kept: Vec<String> =
                    kept.iter().map(|v| if v == active { format!("{v} (active)") } else { v.clone() }).collect();
                let directory = match in_directory.get(module) {
                    Some(version) if version == active => "; the directory holds the active version".to_owned(),
                    Some(version) => format!("; the directory holds {version}"),
                    None if args.modules.is_some() => "; not in the directory".to_owned(),
                    None => String::new(),
                };
                outln!("{module}: {active}{directory}\n  kept, newest first: {}", kept.join(", "))?;
            }
        }
        ModulesCommand::Rollback(args) => {
            let (from, to) = library.rollback(&args.module, args.target.as_deref())?;
            outln!("module `{}`: {from} → {to}; the next `waku run` runs {to}", args.module)?;
        }
    }
    Ok(())
}

async fn dlq(command: DlqCommand) -> Result<()> {
    let args = match &command {
        DlqCommand::List(args) => args,
        DlqCommand::Show(show) => &show.dlq,
        DlqCommand::Redrive(redrive) => &redrive.dlq,
    };
    let log = args.data.log().await.context("is `waku run` using it? stop it first")?;
    let store = args.data.state(&args.projection).context("is `waku run` using it? stop it first")?;
    let (topic, projection) = (args.topic.as_str(), args.projection.as_str());
    match &command {
        DlqCommand::List(_) => {
            let letters = dead_letter::list(&log, topic, projection, &store).await?;
            for letter in &letters {
                outln!("{}", dead_letter_line(letter))?;
            }
            let waiting = letters.iter().filter(|l| l.owned && !l.redriven).count();
            let others: Vec<u32> = letters.iter().filter(|l| !l.owned).map(|l| l.partition).collect();
            let elsewhere = match others.len() {
                0 => String::new(),
                count => {
                    let mut partitions = others;
                    partitions.dedup();
                    format!("; {count} in {}, which this state store does not own", partition_list(&partitions))
                }
            };
            errln!("{} dead letters of `{projection}` ({waiting} not re-driven{elsewhere})", letters.len());
        }
        DlqCommand::Show(show) => {
            let letter = dead_letter::show(&log, topic, projection, &store, show.partition, show.offset).await?;
            outln!("{}", dead_letter_details(&letter))?;
        }
        DlqCommand::Redrive(redrive) => {
            let selection = Selection {
                partitions: redrive.partition.clone(),
                records: redrive.record.clone(),
                key: redrive.key.as_deref().map(parse_key).transpose()?,
            };
            if !redrive.all && selection == Selection::default() {
                bail!("say which dead letters to re-drive: --partition, --record, --key, or --all");
            }
            let done = match dead_letter::redrive(&log, topic, projection, &store, &selection).await {
                Err(error @ (DeadLetterError::NothingOwned { .. } | DeadLetterError::NotOwned { .. })) => {
                    let state = store.path().display();
                    return Err(anyhow::Error::new(error).context(format!("nothing re-driven with the state {state}")));
                }
                done => done?,
            };
            outln!(
                "re-drove {} dead letters ({} events) of `{projection}` from {} into `retry_{topic}`{}; the next \
                 `waku run` applies them",
                done.records,
                done.events,
                partition_list(&done.partitions),
                if done.already > 0 {
                    format!(" ({} re-driven before, left alone)", done.already)
                } else {
                    String::new()
                }
            )?;
            if done.left > 0 {
                outln!(
                    "left {} dead letters in {} to the hosts that own them (this state store holds no position there)",
                    done.left,
                    partition_list(&done.others)
                )?;
            }
        }
    }
    Ok(())
}

/// `partition 0`, `partitions 0, 2`, or `no partition`.
fn partition_list(partitions: &[u32]) -> String {
    let numbers: Vec<String> = partitions.iter().map(u32::to_string).collect();
    match partitions.len() {
        0 => "no partition".to_owned(),
        1 => format!("partition {}", numbers[0]),
        _ => format!("partitions {}", numbers.join(", ")),
    }
}

/// `partition:offset`.
fn parse_place(text: &str) -> Result<(u32, u64), String> {
    let (partition, offset) = text.split_once(':').ok_or_else(|| format!("`{text}` is not <partition>:<offset>"))?;
    let partition = partition.parse().map_err(|_| format!("`{partition}` is not a partition number"))?;
    let offset = offset.parse().map_err(|_| format!("`{offset}` is not an offset"))?;
    Ok((partition, offset))
}

fn failed_at(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// One line per dead letter, for `waku dlq list`. What a module or a
/// publisher wrote (keys, messages) is shown escaped
/// ([`wakuwaku_core::limits::printable`]): it never drives the terminal or
/// breaks the line.
fn dead_letter_line(letter: &DeadLetter) -> String {
    let routed = &letter.routed;
    let failure = routed.failure.as_ref();
    let event = match &letter.envelope {
        Ok(envelope) => printable(&format!("key {} tag {}", envelope.key, envelope.tag)).into_owned(),
        Err(_) => "unreadable headers".to_owned(),
    };
    format!(
        "{}:{}\t{}\t{event}\tfrom {}:{} ({} events)\tattempts {}\t{}\t{}{}",
        letter.partition,
        letter.offset,
        failure.map_or("-", |f| f.class.name()),
        routed.origin_partition,
        routed.origin_offset,
        routed.events,
        routed.attempts,
        failed_at(routed.failed_at_ms),
        failure.map_or(String::new(), |f| printable(&f.message).into_owned()),
        match (letter.owned, letter.redriven) {
            (false, _) => "\t[not this host's]",
            (true, true) => "\t[re-driven]",
            (true, false) => "",
        },
    )
}

/// Everything about one dead letter, for `waku dlq show`, each line and the
/// body's lines escaped as in [`dead_letter_line`].
fn dead_letter_details(letter: &DeadLetter) -> String {
    let routed = &letter.routed;
    let mut lines = vec![
        format!("dead letter:  partition {}, offset {}", letter.partition, letter.offset),
        format!("projection:   {}", routed.projection),
        format!(
            "origin:       partition {}, offset {} ({} events)",
            routed.origin_partition, routed.origin_offset, routed.events
        ),
        format!("attempts:     {}", routed.attempts),
        format!("failed at:    {}", failed_at(routed.failed_at_ms)),
    ];
    if let Some(failure) = &routed.failure {
        lines.push(format!("class:        {}", failure.class));
        lines.push(format!("message:      {}", failure.message));
        if !failure.module.is_empty() {
            lines.push(format!("module:       {}@{}", failure.module, failure.version));
        }
    }
    match &letter.envelope {
        Ok(e) => lines.push(format!("event:        key {}, tag {}, {}, {}", e.key, e.tag, e.ordering, e.algebra)),
        Err(error) => lines.push(format!("event:        headers unreadable: {error}")),
    }
    lines.push(format!(
        "re-driven:    {}",
        match (letter.owned, letter.redriven) {
            (false, _) => "unknown here: this state store does not own the partition",
            (true, true) => "yes",
            (true, false) => "no",
        }
    ));
    let mut lines: Vec<String> = lines.iter().map(|line| printable(line).into_owned()).collect();
    let body = &letter.record.body;
    match std::str::from_utf8(body) {
        Ok(text) => {
            lines.push(format!("body ({} bytes):", body.len()));
            lines.extend(text.split('\n').map(|line| printable(line).into_owned()));
        }
        Err(_) => lines.push(format!(
            "body ({} bytes, hex):\n{}",
            body.len(),
            body.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )),
    }
    lines.join("\n")
}

fn parse_key(text: &str) -> Result<Key> {
    Key::parse_text(text).with_context(|| format!("--key `{text}`"))
}

async fn run_demo(args: DemoArgs) -> Result<ExitCode> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host/ has a parent").to_owned();
    let module_path = match &args.module {
        Some(path) => path.clone(),
        None => {
            let crate_dir = repo.join("examples").join("bank");
            if !crate_dir.is_dir() {
                bail!("cannot find {}; run from a clone of the repository or pass --module", crate_dir.display());
            }
            errln!("waku: building {} ...", crate_dir.display());
            let build =
                GuestBuild { target_dir: Some(repo.join("target").join("guests")), ..GuestBuild::new(crate_dir) };
            build.run()?
        }
    };
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
    let data = DataArgs { data: data_dir, iggy: args.iggy.clone(), stream };

    let sandbox = args.consume.sandbox()?;
    let module = load_module_file(&sandbox, &module_path)
        .map_err(hint_at_limit_flags)
        .with_context(|| format!("loading module {}", module_path.display()))?;
    let spec = WorkloadSpec { events: args.events, accounts: args.accounts, seed: args.seed };
    let config = args.consume.config(None)?;
    let create_emit_topics = args.consume.create_emit_topics;
    let report = demo_run(&data, module, spec, args.partitions, config, create_emit_topics, args.admin).await?;
    let verdict = if report.check.matches() { ExitCode::SUCCESS } else { ExitCode::from(3) };
    // The verdict stands even when the report could not be printed.
    match outln!("{}", report.lines.join("\n")).and_then(|()| outln!("{}", report.check.report(5))) {
        Err(error) if !error.reader_gone() => Err(error.into()),
        _ => Ok(verdict),
    }
}

struct DemoReport {
    lines: Vec<String>,
    check: demo::OracleCheck,
}

async fn demo_run(
    data: &DataArgs,
    module: Arc<dyn HandlerModule>,
    spec: WorkloadSpec,
    partitions: u32,
    config: ConsumerConfig,
    create_emit_topics: Option<u32>,
    admin_address: Option<std::net::SocketAddr>,
) -> Result<DemoReport> {
    const TOPIC: &str = "accounts";
    let (events, oracle) = demo::workload(spec);
    let outgoing = events
        .iter()
        .map(|event| {
            Ok(Outgoing { tag: demo::bank_tag(&*module, event.type_name)?, body: serde_json::to_vec(&event.body)? })
        })
        .collect::<Result<Vec<_>>>()?;

    let log = Arc::new(data.log().await?);
    log.create_topic(TOPIC, partitions).await?;
    ensure_emit_topics(&*log, &*module, create_emit_topics).await?;
    let started = Instant::now();
    let published = publish::publish(&*log, TOPIC, module.clone(), outgoing, None, available_threads()).await?;
    let publish_secs = started.elapsed().as_secs_f64();

    let projection = Arc::new(Projection::new("bank", TOPIC, vec![module.clone()], data.state("bank")?)?);
    let metrics = Arc::new(Metrics::default());
    let consumer = Consumer::new(log.clone(), projection.clone(), config.clone()).with_metrics(metrics.clone());
    let (stop_admin, admin_stopped) = tokio::sync::oneshot::channel::<()>();
    if let Some(address) = admin_address {
        let listener = admin::bind(address).await?;
        errln!("waku: admin endpoint on http://{}", listener.local_addr()?);
        let admin =
            Admin { log, projection: projection.clone(), progress: consumer.progress(), metrics, library: None };
        tokio::spawn(admin::serve(listener, admin, async {
            let _ = admin_stopped.await;
        }));
    }
    if std::io::stderr().is_terminal() {
        errln!("waku: consuming {published} events ...");
    }
    let started = Instant::now();
    let summary = consumer.catch_up().await?;
    let consume_secs = started.elapsed().as_secs_f64();
    let _ = stop_admin.send(());

    let store = projection.store();
    let check = demo::check_projection(&oracle, &*module, store)?;

    let stats: std::collections::BTreeMap<String, u64> = store.stats()?.into_iter().collect();
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
            config.workers,
            stats.get(stat::APPLIED).copied().unwrap_or(0),
            stats.get(stat::SKIPPED).copied().unwrap_or(0),
            stats.get(stat::DEAD_LETTERED).copied().unwrap_or(0),
            summary.calls,
        ),
        format!("throughput: {:.0} events/s ({consume_secs:.2} s to consume)", summary.consumed as f64 / consume_secs),
        format!("time per phase (summed over partitions and workers): {}", summary.phases),
    ];
    Ok(DemoReport { lines, check })
}

fn print_summary(summary: &Summary, secs: f64, store: &StateStore) -> Result<()> {
    outln!(
        "consumed {} events in {} batches ({:.0} events/s): {} applied, {} skipped, {} dead-lettered ({} malformed), \
         {} sent to retry, {} taken back",
        summary.consumed,
        summary.batches,
        summary.consumed as f64 / secs.max(1e-9),
        summary.applied,
        summary.skipped,
        summary.dead_lettered,
        summary.malformed,
        summary.retry_in,
        summary.retry_out,
    )?;
    outln!("time per phase (summed over partitions and workers): {}", summary.phases)?;
    let stats: std::collections::HashMap<String, u64> = store.stats()?.into_iter().collect();
    let count = |name: &str| stats.get(name).copied().unwrap_or(0);
    let waiting = count(stat::RETRY_IN).saturating_sub(count(stat::RETRY_OUT));
    if waiting > 0 {
        outln!("{waiting} events wait in retry; the next `waku run` takes them when they are due")?;
    }
    if count(stat::DEAD_LETTERED) > 0 {
        outln!("{} events are dead letters in all (see `waku dlq list`)", count(stat::DEAD_LETTERED))?;
    }
    if count(stat::UNDELIVERABLE) > 0 {
        outln!(
            "{} emitted messages could not be delivered and are dead letters in all (class `undeliverable` in `waku \
             dlq list`)",
            count(stat::UNDELIVERABLE)
        )?;
    }
    Ok(())
}

fn available_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn consume_args(flags: &[&str]) -> ConsumeArgs {
        let base = ["waku", "run", "--projection", "p", "--topic", "t", "--modules", "m"];
        match Cli::try_parse_from(base.iter().chain(flags)).expect("the flags parse").command {
            Command::Run(args) => args.consume,
            _ => unreachable!("parsed a run command"),
        }
    }

    #[test]
    fn log_lines_are_coloured_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(log_colours(true, None));
        assert!(log_colours(true, Some(OsStr::new(""))), "an empty NO_COLOR does not count");
        assert!(!log_colours(true, Some(OsStr::new("1"))));
        assert!(!log_colours(false, None));
        assert!(!log_colours(false, Some(OsStr::new(""))));
    }

    #[test]
    fn only_a_closed_standard_output_ends_a_command_quietly() {
        let closed = anyhow::Error::new(StdoutError(ErrorKind::BrokenPipe.into())).context("listing");
        assert!(stdout_closed(&closed));
        assert_eq!(report(&closed), ExitCode::SUCCESS);
        let full = anyhow::Error::new(StdoutError(std::io::Error::other("disk full")));
        assert!(!stdout_closed(&full));
        // A broken pipe elsewhere (a socket to the log) is an error.
        let socket = anyhow::Error::new(std::io::Error::from(ErrorKind::BrokenPipe));
        assert!(!stdout_closed(&socket));
    }

    #[test]
    fn every_subcommand_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn limit_flags_default_to_the_library_defaults() {
        let args = consume_args(&[]);
        assert_eq!(args.limits.limits().unwrap(), SandboxLimits::default());
        assert_eq!(args.config(None).unwrap().payload, PayloadLimits::default());
    }

    #[test]
    fn every_limit_flag_sets_its_limit_for_the_sandbox_and_the_consumer() {
        let flags = [
            ("--memory-mib", "3"),
            ("--call-budget-ms", "7"),
            ("--max-wasm-stack-kib", "5"),
            ("--max-table-elements", "11"),
            ("--max-instances", "13"),
            ("--max-state-value-kib", "17"),
            ("--max-state-writes-per-call", "29"),
            ("--max-state-kib-per-call", "31"),
            ("--max-counter-changes-per-call", "37"),
            ("--max-emit-kib", "19"),
            ("--max-emits-per-call", "41"),
            ("--max-emit-kib-per-call", "43"),
            ("--max-log-line-bytes", "23"),
            ("--max-log-lines-per-call", "47"),
            ("--max-batch-held-mib", "53"),
        ];
        let args = consume_args(&flags.iter().flat_map(|(flag, value)| [*flag, *value]).collect::<Vec<_>>());
        assert_eq!(args.limits.flags().len(), flags.len(), "a flag of LimitArgs is not tested here");
        let payload = PayloadLimits {
            max_state_value: 17 << 10,
            max_state_writes_per_call: 29,
            max_state_bytes_per_call: 31 << 10,
            max_counter_changes_per_call: 37,
            max_emit_body: 19 << 10,
            max_emits_per_call: 41,
            max_emit_bytes_per_call: 43 << 10,
            max_log_line: 23,
            max_log_lines_per_call: 47,
            max_batch_held: 53 << 20,
        };
        let expected = SandboxLimits {
            memory_bytes: 3 << 20,
            call_budget: Duration::from_millis(7),
            max_wasm_stack: 5 << 10,
            table_elements: 11,
            instances: 13,
        };
        assert_eq!(args.limits.limits().unwrap(), expected);
        let sandbox = args.sandbox().unwrap();
        assert_eq!((*sandbox.limits(), *sandbox.payload_limits()), (expected, payload));
        assert_eq!(args.config(None).unwrap().payload, payload, "the consumer's key scopes get the payload limits");
        assert_eq!(args.create_emit_topics, None);
        assert_eq!(consume_args(&["--create-emit-topics", "3"]).create_emit_topics, Some(3));
    }

    #[test]
    fn a_batch_budget_below_one_call_is_refused_naming_the_flag() {
        let error = consume_args(&["--max-batch-held-mib", "2"]).config(None).err().unwrap().to_string();
        assert!(error.starts_with("--max-batch-held-mib 2 is less than one handler call may hold"), "{error}");
        let small_calls =
            ["--max-batch-held-mib", "2", "--max-state-kib-per-call", "64", "--max-emit-kib-per-call", "64"];
        consume_args(&small_calls).config(None).unwrap();
    }

    #[test]
    fn retry_flags_set_the_policy_and_zero_attempts_are_refused() {
        assert_eq!(consume_args(&[]).config(None).unwrap().retry, RetryPolicy::default());
        let args = consume_args(&[
            "--max-attempts",
            "2",
            "--retry-delays",
            "250ms,3s,1m",
            "--transient-retries",
            "0",
            "--transient-backoff",
            "5ms",
        ]);
        let expected = RetryPolicy {
            transient_retries: 0,
            transient_backoff: Duration::from_millis(5),
            delays: vec![Duration::from_millis(250), Duration::from_secs(3), Duration::from_secs(60)],
            max_attempts: 2,
        };
        assert_eq!(args.config(None).unwrap().retry, expected);
        let error = consume_args(&["--max-attempts", "0"]).config(None).err().unwrap();
        assert_eq!(error.to_string(), "--max-attempts must be at least 1");
        let base = ["waku", "run", "--projection", "p", "--topic", "t", "--modules", "m"];
        let error = Cli::try_parse_from(base.iter().chain(&["--retry-delays", "soon"])).err().unwrap();
        assert!(error.to_string().contains("--retry-delays"), "{error}");
    }

    #[test]
    fn the_demo_takes_the_same_limit_flags() {
        let cli = Cli::try_parse_from(["waku", "demo", "--max-emit-kib", "2", "--max-instances", "9"]).unwrap();
        let Command::Demo(args) = cli.command else { unreachable!("parsed a demo command") };
        let limits = &args.consume.limits;
        assert_eq!((limits.payload().unwrap().max_emit_body, limits.limits().unwrap().instances), (2 << 10, 9));
    }

    #[test]
    fn a_zero_limit_is_refused_naming_its_flag() {
        for flag in [
            "--memory-mib",
            "--call-budget-ms",
            "--max-wasm-stack-kib",
            "--max-table-elements",
            "--max-instances",
            "--max-state-value-kib",
            "--max-state-writes-per-call",
            "--max-state-kib-per-call",
            "--max-counter-changes-per-call",
            "--max-emit-kib",
            "--max-emits-per-call",
            "--max-emit-kib-per-call",
            "--max-log-line-bytes",
            "--max-log-lines-per-call",
            "--max-batch-held-mib",
        ] {
            let args = consume_args(&[flag, "0"]);
            let error = args.sandbox().err().expect("a zero limit is refused").to_string();
            assert_eq!(error, format!("{flag} must be at least 1"));
        }
        let args = consume_args(&["--memory-mib", &usize::MAX.to_string()]);
        assert!(args.sandbox().err().unwrap().to_string().contains("--memory-mib"));
    }
}
