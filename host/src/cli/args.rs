//! Arguments shared by several commands: where the data is (the log and
//! the projection's state), and how to consume (batches, workers, retries,
//! one flag per sandbox and payload limit), checked and turned into the
//! library's settings.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;

use super::existing;
use crate::engine::consumer::ConsumerConfig;
use crate::engine::routing::RetryPolicy;
use crate::key::Key;
use crate::operations::host::{HostError, HostSettings, LogSettings, StateSettings};
use crate::sandbox::handler::{LimitsError, PayloadLimits};
use crate::sandbox::runtime::SandboxLimits;
use crate::storage::log::AnyLog;
use crate::storage::state::StateStore;

#[derive(Args)]
pub(super) struct DataArgs {
    /// The data directory (embedded log and projection state).
    #[arg(long, default_value = "waku-data")]
    pub(super) data: PathBuf,
    /// Use an Apache Iggy server as the log instead of the embedded one:
    /// `iggy://user:password@host:port` (client options such as
    /// `?reconnection_retries=10&reconnection_interval=1s` may follow).
    #[arg(long)]
    pub(super) iggy: Option<String>,
    /// The Iggy stream holding the topics (created if missing).
    #[arg(long, default_value = "waku", requires = "iggy")]
    pub(super) stream: String,
    /// With --iggy: create topics with the server's defaults instead of
    /// durable ones (each acknowledged message written and fsynced before
    /// the answer), and accept retry, dead-letter and emit topics that can
    /// lose acknowledged messages. Faster appends; a crash of the server
    /// can lose events (see docs/iggy.md, "Durability on Iggy").
    /// The embedded log is durable whatever this says.
    #[arg(long)]
    pub(super) lossy_topics: bool,
    /// Keep the projection's state in PostgreSQL instead of the data
    /// directory: `postgres://user:password@host:port/db` (the host creates
    /// its tables; several hosts may share it).
    #[arg(long, value_parser = postgres_url)]
    pub(super) state: Option<String>,
}

/// `error`, under `hint` when another process holds the files; about any
/// other failure (a damaged file, say) the hint would mislead.
pub(super) fn hint_if_in_use(hint: &'static str) -> impl FnOnce(HostError) -> anyhow::Error {
    move |error| match error.is_in_use() {
        true => anyhow::Error::new(error).context(hint),
        false => error.into(),
    }
}

/// A `--state` value: a PostgreSQL URL.
fn postgres_url(value: &str) -> Result<String, String> {
    match value.starts_with("postgres://") || value.starts_with("postgresql://") {
        true => Ok(value.to_owned()),
        false => Err(format!("`{value}` is no PostgreSQL URL (postgres://user:password@host:port/db)")),
    }
}

impl DataArgs {
    /// Which log the flags name.
    pub(super) fn log_settings(&self) -> LogSettings {
        match &self.iggy {
            Some(url) => {
                LogSettings::Iggy { url: url.clone(), stream: self.stream.clone(), lossy_topics: self.lossy_topics }
            }
            None => LogSettings::Embedded,
        }
    }

    /// The log; the running host's own when this command runs in it
    /// ([`super::local_host`]).
    pub(super) async fn log(&self) -> Result<AnyLog, HostError> {
        if self.iggy.is_none()
            && let Some(log) = super::local_host::shared_log(&self.data)
        {
            return Ok(log);
        }
        self.log_settings().open(&self.data).await
    }

    /// Where the flags keep the state.
    pub(super) fn state_settings(&self) -> StateSettings {
        match &self.state {
            Some(url) => StateSettings::Postgres { url: url.clone() },
            None => StateSettings::Embedded,
        }
    }

    /// The projection's state store; the running host's own when this
    /// command runs in it ([`super::local_host`]).
    pub(super) fn state(&self, projection: &str) -> Result<StateStore, HostError> {
        if self.state.is_none()
            && let Some(store) = super::local_host::shared_state(&self.data, projection)
        {
            return Ok(store);
        }
        crate::operations::host::open_state(&self.data, &self.state_settings(), projection)
    }

    /// The log for a command that works on what is there: an embedded one
    /// must exist already ([`existing`]); `hint` goes with a file another
    /// process holds.
    pub(super) async fn existing_log(&self, hint: &'static str) -> Result<AnyLog> {
        if let Some(url) = &self.iggy {
            let log = crate::storage::log::iggy::IggyLog::connect_existing(url, &self.stream).await?;
            return Ok(AnyLog::Iggy(log.with_lossy_topics(self.lossy_topics)));
        }
        existing::log_file(&self.data)?;
        self.log().await.map_err(hint_if_in_use(hint))
    }

    /// The state store of a projection that must exist already
    /// ([`existing`]; in PostgreSQL, looked for there by opening it).
    pub(super) fn existing_state(&self, projection: &str, hint: &'static str) -> Result<StateStore> {
        if let Some(url) = &self.state {
            let (store, found) = crate::storage::state::postgres::PostgresStore::connect_existing(url, projection)?;
            if !found.iter().any(|name| name == projection) {
                return Err(existing::Missing::StateProjection { name: projection.to_owned(), found }.into());
            }
            return Ok(StateStore::from_backend(store));
        }
        crate::storage::log::check_projection_name(projection).with_context(|| format!("projection `{projection}`"))?;
        existing::projection(&self.data, projection)?;
        self.state(projection).map_err(hint_if_in_use(hint))
    }
}

/// How a command prints its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Output {
    /// Lines for people.
    Table,
    /// One JSON document, of the shape the README states
    /// ("Output and exit codes").
    Json,
}

/// `--output`.
#[derive(Args)]
pub(super) struct OutputArgs {
    /// How to print the result: `table` for people, `json` for programs
    /// (a stable shape, documented in the README).
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub(super) output: Output,
}

impl OutputArgs {
    /// Whether the result is printed as JSON.
    pub(super) fn json(&self) -> bool {
        self.output == Output::Json
    }
}

/// The topics a projection consumes, taken the same way by every command
/// (`run`, `status`, `dlq`, `reset`): `--topic` given more than once, a
/// comma-separated list, `WAKU_TOPIC`, or a list in `waku.toml`
/// (`topic = ["orders", "shipments"]`). The first names the projection's
/// retry and dead-letter topics (`retry_<first>`, `dlq_<first>`).
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub(super) struct TopicArgs {
    /// The topic the projection consumes. Give it more than once (or a
    /// comma-separated list) for a projection over several co-partitioned
    /// topics: each partition index is read across all of them, and a key's
    /// events of types declared timed (their `waku-event-time` header) are
    /// applied in event-time order (see docs/event-time.md). The first
    /// names its retry and dead-letter topics.
    #[arg(long = "topic", value_name = "TOPIC", required = true, value_delimiter = ',')]
    pub(super) topics: Vec<String>,
}

impl TopicArgs {
    /// The first topic: it names the projection's retry and dead-letter
    /// topics.
    pub(super) fn first(&self) -> &str {
        &self.topics[0]
    }

    /// The topics after the first.
    pub(super) fn more(&self) -> &[String] {
        &self.topics[1..]
    }

    /// Every topic, in the order given.
    pub(super) fn all(&self) -> &[String] {
        &self.topics
    }
}

/// A projection and the topics it consumes (its retry and dead-letter
/// topics are `retry_<first topic>` and `dlq_<first topic>`).
#[derive(Args)]
pub(super) struct ProjectionArgs {
    #[command(flatten)]
    pub(super) data: DataArgs,
    /// The projection.
    #[arg(long)]
    pub(super) projection: String,
    #[command(flatten)]
    pub(super) topics: TopicArgs,
}

impl ProjectionArgs {
    /// The first topic, which names the retry and dead-letter topics.
    pub(super) fn topic(&self) -> &str {
        self.topics.first()
    }

    /// The log and the state store of a projection and topics that must
    /// exist already, checked before anything is opened ([`existing`]); a
    /// first topic that is a later topic of the projection is refused,
    /// naming the one that names its retry and dead-letter topics.
    pub(super) async fn existing(&self, hint: &'static str) -> Result<(AnyLog, StateStore)> {
        // The log first: a running host holds it, and a bad `--iggy` is
        // what to say before anything else.
        let log = self.data.existing_log(hint).await?;
        let store = self.data.existing_state(&self.projection, hint)?;
        for topic in self.topics.all() {
            existing::topic(&log, topic).await?;
        }
        existing::first_topic(&log, &store, &self.projection, self.topic()).await?;
        Ok((log, store))
    }
}

#[derive(Args)]
pub(super) struct ConsumeArgs {
    /// Most messages per batch (a batch also stops once its messages hold
    /// 32 MiB).
    #[arg(long, default_value_t = ConsumerConfig::default().batch_size)]
    pub(super) batch_size: usize,
    /// Worker threads per batch (default: the number of cores).
    #[arg(long)]
    pub(super) workers: Option<usize>,
    /// Create the topics a module declares it emits to, with this many
    /// partitions, when they do not exist (at most 256 while the host
    /// runs). Without it a missing emit topic refuses the module (at
    /// start-up, or the new version on reload).
    #[arg(long, value_name = "PARTITIONS")]
    pub(super) create_emit_topics: Option<u32>,
    #[command(flatten)]
    pub(super) retry: RetryArgs,
    #[command(flatten)]
    pub(super) limits: LimitArgs,
}

/// How failed events are retried ([`RetryPolicy`]).
#[derive(Args, Debug, Clone, PartialEq, Eq)]
#[command(next_help_heading = "Retries")]
pub(super) struct RetryArgs {
    /// Attempts before a retryable failure or a trap is dead-lettered
    /// (1: at once).
    #[arg(long, default_value_t = RetryPolicy::default().max_attempts)]
    pub(super) max_attempts: u32,
    /// Waits before attempts 2, 3, …, measured from the failure; the last
    /// repeats. E.g. `0s` or `250ms,1m`.
    #[arg(long, value_delimiter = ',', value_parser = humantime::parse_duration, default_value = "1s,5s,30s,2m,10m")]
    pub(super) retry_delays: Vec<Duration>,
    /// In-place retries of a transient failure before it counts as
    /// retryable.
    #[arg(long, default_value_t = RetryPolicy::default().transient_retries)]
    pub(super) transient_retries: u32,
    /// The first in-place backoff (it doubles), e.g. `10ms`.
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    pub(super) transient_backoff: Duration,
    /// The most memory one partition's retry queue holds, in MiB (about 64
    /// bytes per waiting event, plus its key); past it the partition reads
    /// no more of its topic until retries drain.
    #[arg(long, default_value_t = RetryPolicy::default().queue_max_bytes >> 20)]
    pub(super) retry_queue_mib: usize,
}

impl RetryArgs {
    pub(super) fn policy(&self) -> Result<RetryPolicy> {
        if self.max_attempts == 0 {
            bail!("--max-attempts must be at least 1");
        }
        if self.retry_queue_mib == 0 {
            bail!("--retry-queue-mib must be at least 1");
        }
        Ok(RetryPolicy {
            transient_retries: self.transient_retries,
            transient_backoff: self.transient_backoff,
            delays: self.retry_delays.clone(),
            max_attempts: self.max_attempts,
            queue_max_bytes: self.retry_queue_mib.saturating_mul(1 << 20),
        })
    }
}

/// One flag per limit of [`SandboxLimits`] and of [`PayloadLimits`]; the
/// defaults are the library's.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
#[command(next_help_heading = "Sandbox limits (per module instance)")]
pub(super) struct LimitArgs {
    /// Memory limit per module instance (all its linear memories together), in MiB.
    #[arg(long, default_value_t = SandboxLimits::default().memory_bytes >> 20)]
    pub(super) memory_mib: usize,
    /// Memory limit of all module instances together, in MiB, whatever
    /// modules, partitions and workers make them; a call whose instance
    /// would take them past it is retried later (`host-instance-memory`).
    /// At least `--memory-mib`.
    #[arg(long, default_value_t = SandboxLimits::default().host_memory_bytes >> 20)]
    pub(super) host_memory_mib: usize,
    /// CPU budget per handler call, in milliseconds.
    #[arg(long, default_value_t = SandboxLimits::default().call_budget.as_millis() as u64)]
    pub(super) call_budget_ms: u64,
    /// Most wasm stack one call may use, in KiB (deep recursion traps).
    #[arg(long, default_value_t = SandboxLimits::default().max_wasm_stack >> 10)]
    pub(super) max_wasm_stack_kib: usize,
    /// Most table elements (function references) per instance, all its tables together.
    #[arg(long, default_value_t = SandboxLimits::default().table_elements)]
    pub(super) max_table_elements: usize,
    /// Most core instances (and memories, and tables) one module instance may create.
    #[arg(long, default_value_t = SandboxLimits::default().instances)]
    pub(super) max_instances: usize,
    /// CPU time compiling one module may take, in seconds (all compiler
    /// threads together); a module past it is refused
    /// (`component-compile-time`).
    #[arg(long, default_value_t = SandboxLimits::default().compile_seconds())]
    pub(super) compile_budget_s: u64,
    /// Most memory compiling one module may take, in MiB; a module past it
    /// is refused (`component-compile-memory`).
    #[arg(long, default_value_t = SandboxLimits::default().compile_memory_bytes >> 20)]
    pub(super) compile_memory_mib: usize,
    /// How long one module's calls may run in one batch (summed over the
    /// workers), e.g. `30s`; past it the module's other keys in the batch
    /// are retried in a later batch without losing an attempt, so a slow
    /// module cannot hold up the partition.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub(super) max_module_time_per_batch: Duration,
    /// Largest state value a handler may write, in KiB; a larger write is
    /// refused (`state-value-size`).
    #[arg(long, default_value_t = PayloadLimits::default().max_state_value >> 10, help_heading = PAYLOAD)]
    pub(super) max_state_value_kib: usize,
    /// Most state writes (set or delete) one handler call may make.
    #[arg(long, default_value_t = PayloadLimits::default().max_state_writes_per_call, help_heading = PAYLOAD)]
    pub(super) max_state_writes_per_call: usize,
    /// Most KiB of entry names and values one handler call may write.
    #[arg(long, default_value_t = PayloadLimits::default().max_state_bytes_per_call >> 10, help_heading = PAYLOAD)]
    pub(super) max_state_kib_per_call: usize,
    /// Most counter changes one handler call may make.
    #[arg(long, default_value_t = PayloadLimits::default().max_counter_changes_per_call, help_heading = PAYLOAD)]
    pub(super) max_counter_changes_per_call: usize,
    /// Largest body a handler may emit (or `combine` may return), in KiB; a
    /// larger emit is refused (`emit-body-size`).
    #[arg(long, default_value_t = PayloadLimits::default().max_emit_body >> 10, help_heading = PAYLOAD)]
    pub(super) max_emit_kib: usize,
    /// Most messages one handler call may emit.
    #[arg(long, default_value_t = PayloadLimits::default().max_emits_per_call, help_heading = PAYLOAD)]
    pub(super) max_emits_per_call: usize,
    /// Most KiB of topics, keys and bodies one handler call may emit.
    #[arg(long, default_value_t = PayloadLimits::default().max_emit_bytes_per_call >> 10, help_heading = PAYLOAD)]
    pub(super) max_emit_kib_per_call: usize,
    /// Longest handler log line kept, in bytes; longer lines are cut and
    /// marked, never an error.
    #[arg(long, default_value_t = PayloadLimits::default().max_log_line, help_heading = PAYLOAD)]
    pub(super) max_log_line_bytes: usize,
    /// Most log lines one handler call may write; later ones are dropped
    /// and counted.
    #[arg(long, default_value_t = PayloadLimits::default().max_log_lines_per_call, help_heading = PAYLOAD)]
    pub(super) max_log_lines_per_call: usize,
    /// Most MiB the host holds for the state writes, counter changes and
    /// emits of the batches in flight (one per partition) together; a call
    /// past it is retried in a later batch. Committing and publishing hold
    /// them up to three times over; a rebuild's shadow has its own budget.
    #[arg(long, default_value_t = PayloadLimits::default().max_batch_held >> 20, help_heading = PAYLOAD)]
    pub(super) max_batch_held_mib: usize,
    /// Most distinct counters the projection may hold; adding to a new
    /// counter past it is refused (`counter-count`), existing ones still
    /// change.
    #[arg(long, default_value_t = PayloadLimits::default().max_counters, help_heading = PAYLOAD)]
    pub(super) max_counters: usize,
    /// Most entries one key may hold; setting a new entry past it is
    /// refused (`entries-per-key`), overwriting or deleting one is not.
    #[arg(long, default_value_t = PayloadLimits::default().max_entries_per_key, help_heading = PAYLOAD)]
    pub(super) max_entries_per_key: usize,
    /// Largest payload of a timer, in bytes (`timer-payload-size`).
    #[arg(long, default_value_t = PayloadLimits::default().max_timer_payload, help_heading = PAYLOAD)]
    pub(super) max_timer_payload_bytes: usize,
    /// Most timers one key may hold; setting a new one past it is refused
    /// (`timers-per-key`), moving or cancelling one is not.
    #[arg(long, default_value_t = PayloadLimits::default().max_timers_per_key, help_heading = PAYLOAD)]
    pub(super) max_timers_per_key: usize,
    /// Most timers the projection may hold (`timers-in-all`).
    #[arg(long, default_value_t = PayloadLimits::default().max_timers, help_heading = PAYLOAD)]
    pub(super) max_timers: usize,
}

/// The help heading of the payload limits.
pub(super) const PAYLOAD: &str = "Payload limits (what a module may hand the host)";

impl LimitArgs {
    /// Every limit flag with its value, to refuse zeros by name.
    pub(super) fn flags(&self) -> [(&'static str, u64); 23] {
        [
            ("--memory-mib", self.memory_mib as u64),
            ("--host-memory-mib", self.host_memory_mib as u64),
            ("--call-budget-ms", self.call_budget_ms),
            ("--max-wasm-stack-kib", self.max_wasm_stack_kib as u64),
            ("--max-table-elements", self.max_table_elements as u64),
            ("--max-instances", self.max_instances as u64),
            ("--compile-budget-s", self.compile_budget_s),
            ("--compile-memory-mib", self.compile_memory_mib as u64),
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
            ("--max-counters", self.max_counters as u64),
            ("--max-entries-per-key", self.max_entries_per_key as u64),
            ("--max-timer-payload-bytes", self.max_timer_payload_bytes as u64),
            ("--max-timers-per-key", self.max_timers_per_key as u64),
            ("--max-timers", self.max_timers as u64),
        ]
    }

    /// The sandbox's limits the flags ask for; every flag must be at least 1.
    pub(super) fn limits(&self) -> Result<SandboxLimits> {
        if let Some((flag, _)) = self.flags().iter().find(|(_, value)| *value == 0) {
            bail!("{flag} must be at least 1");
        }
        if self.host_memory_mib < self.memory_mib {
            bail!(
                "--host-memory-mib {} is less than one instance may hold (--memory-mib {}); raise it",
                self.host_memory_mib,
                self.memory_mib
            );
        }
        Ok(SandboxLimits {
            memory_bytes: scaled(self.memory_mib, 20, "--memory-mib")?,
            call_budget: std::time::Duration::from_millis(self.call_budget_ms),
            max_wasm_stack: scaled(self.max_wasm_stack_kib, 10, "--max-wasm-stack-kib")?,
            table_elements: self.max_table_elements,
            instances: self.max_instances,
            compile_budget: std::time::Duration::from_secs(self.compile_budget_s),
            compile_memory_bytes: scaled(self.compile_memory_mib, 20, "--compile-memory-mib")?,
            host_memory_bytes: scaled(self.host_memory_mib, 20, "--host-memory-mib")?,
        })
    }

    /// The payload limits the flags ask for; the consumer's key scopes and
    /// the sandbox enforce them.
    pub(super) fn payload(&self) -> Result<PayloadLimits> {
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
            max_counters: self.max_counters,
            max_entries_per_key: self.max_entries_per_key,
            max_timer_payload: self.max_timer_payload_bytes,
            max_timers_per_key: self.max_timers_per_key,
            max_timers: self.max_timers,
        };
        // A `combine` body (at most this) may be routed to retry as one
        // record, which the embedded log must be able to hold.
        let most_emit_kib = crate::storage::log::embedded::MAX_RECORD_BYTES >> 10;
        if self.max_emit_kib > most_emit_kib {
            bail!(
                "--max-emit-kib {} is over what one record of the log holds ({most_emit_kib} KiB); lower it",
                self.max_emit_kib
            );
        }
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
pub(super) fn scaled(value: usize, shift: u32, flag: &str) -> Result<usize> {
    value.checked_mul(1 << shift).with_context(|| format!("{flag} {value} is too large"))
}

impl ConsumeArgs {
    /// The consumer's configuration, with the payload limits of the flags.
    pub(super) fn config(&self, partitions: Option<Vec<u32>>) -> Result<ConsumerConfig> {
        if self.batch_size == 0 {
            bail!("--batch-size must be at least 1");
        }
        if self.limits.max_module_time_per_batch.is_zero() {
            bail!("--max-module-time-per-batch must be more than 0");
        }
        let mut config = ConsumerConfig {
            batch_size: self.batch_size,
            partitions,
            payload: self.limits.payload()?,
            retry: self.retry.policy()?,
            module_time_per_batch: self.limits.max_module_time_per_batch,
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

    /// Sets the limits, the consumer's configuration (keeping its
    /// partitions) and the emit-topic creation of `settings` from the flags.
    pub(super) fn apply(&self, settings: &mut HostSettings) -> Result<()> {
        settings.limits = self.limits.limits()?;
        settings.consumer = self.config(settings.consumer.partitions.take())?;
        settings.create_emit_topics = self.create_emit_topics;
        Ok(())
    }
}

/// A `--key`: JSON, as the log lines and `waku dlq list` print keys. A
/// bare word that is no JSON (`c1`) gets the quoting it needs suggested.
pub(super) fn parse_key(text: &str) -> Result<Key> {
    Key::parse_text(text).with_context(|| {
        let word = text.trim();
        let bare = !word.is_empty() && word.chars().all(|c| c.is_alphanumeric() || "-_.:@".contains(c));
        match bare && serde_json::from_str::<serde_json::Value>(word).is_err() {
            true => {
                let quoted = serde_json::Value::String(word.to_owned()).to_string();
                format!("--key `{text}` (keys are JSON: a string key is written quoted, --key '{quoted}')")
            }
            false => format!("--key `{text}`"),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cli::{Cli, Command};
    use crate::operations::host::{CompileCache, ModuleSource};
    use crate::sandbox::runtime::Sandbox;
    use clap::Parser;

    fn consume_args(flags: &[&str]) -> ConsumeArgs {
        let base = ["waku", "run", "--projection", "p", "--topic", "t", "--modules", "m"];
        match Cli::try_parse_from(base.iter().chain(flags)).expect("the flags parse").command {
            Command::Run(args) => args.consume,
            _ => unreachable!("parsed a run command"),
        }
    }

    #[test]
    fn the_event_time_flags_of_run_survive_the_consumer_flags() {
        let flags = ["waku", "run", "--projection", "p", "--topic", "t,catalogue", "--modules", "m"];
        let more = ["--max-held-mib", "3", "--untimed-topic", "catalogue", "--batch-size", "9"];
        let spans = ["--max-event-time-ahead", "90s", "--allowed-lateness", "2s"];
        let Command::Run(args) = Cli::try_parse_from(flags.iter().chain(&more).chain(&spans)).unwrap().command else {
            unreachable!("parsed a run command")
        };
        let settings = args.settings().unwrap();
        assert_eq!(settings.consumer.release.max_held_bytes, 3 << 20);
        assert_eq!((settings.consumer.release.max_ahead, settings.consumer.release.allowed_lateness), (90_000, 2_000));
        assert_eq!(settings.consumer.untimed_topics, ["catalogue"]);
        assert_eq!((settings.consumer.batch_size, settings.more_topics.as_slice()), (9, &["catalogue".to_owned()][..]));
    }

    /// The sandbox a host started with these flags runs modules in.
    fn sandbox(args: &ConsumeArgs) -> Result<Sandbox> {
        let mut settings = HostSettings::new("data", "p", "t", ModuleSource::Loaded(Vec::new()));
        args.apply(&mut settings)?;
        settings.compile_cache = CompileCache::Off;
        Ok(settings.sandbox()?)
    }

    #[test]
    fn a_bare_word_key_is_refused_with_the_quoting_it_needs() {
        let error = format!("{:#}", parse_key("c1").unwrap_err());
        assert!(
            error.starts_with("--key `c1` (keys are JSON: a string key is written quoted, --key '\"c1\"')"),
            "{error}"
        );
        assert_eq!(parse_key("\"c1\"").unwrap(), Key::parse_text("\"c1\"").unwrap());
        let error = format!("{:#}", parse_key("[1,").unwrap_err());
        assert!(error.starts_with("--key `[1,`") && !error.contains("quoted"), "{error}");
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
            ("--host-memory-mib", "67"),
            ("--call-budget-ms", "7"),
            ("--max-wasm-stack-kib", "5"),
            ("--max-table-elements", "11"),
            ("--max-instances", "13"),
            ("--max-state-value-kib", "17"),
            ("--compile-budget-s", "59"),
            ("--compile-memory-mib", "61"),
            ("--max-state-writes-per-call", "29"),
            ("--max-state-kib-per-call", "31"),
            ("--max-counter-changes-per-call", "37"),
            ("--max-emit-kib", "19"),
            ("--max-emits-per-call", "41"),
            ("--max-emit-kib-per-call", "43"),
            ("--max-log-line-bytes", "23"),
            ("--max-log-lines-per-call", "47"),
            ("--max-batch-held-mib", "53"),
            ("--max-counters", "59"),
            ("--max-entries-per-key", "61"),
            ("--max-timer-payload-bytes", "71"),
            ("--max-timers-per-key", "73"),
            ("--max-timers", "79"),
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
            max_counters: 59,
            max_entries_per_key: 61,
            max_timer_payload: 71,
            max_timers_per_key: 73,
            max_timers: 79,
        };
        let expected = SandboxLimits {
            memory_bytes: 3 << 20,
            call_budget: Duration::from_millis(7),
            max_wasm_stack: 5 << 10,
            table_elements: 11,
            instances: 13,
            compile_budget: Duration::from_secs(59),
            compile_memory_bytes: 61 << 20,
            host_memory_bytes: 67 << 20,
        };
        assert_eq!(args.limits.limits().unwrap(), expected);
        let sandbox = sandbox(&args).unwrap();
        assert_eq!((*sandbox.limits(), *sandbox.payload_limits()), (expected, payload));
        assert_eq!(args.config(None).unwrap().payload, payload, "the consumer's key scopes get the payload limits");
        assert_eq!(args.create_emit_topics, None);
        assert_eq!(consume_args(&["--create-emit-topics", "3"]).create_emit_topics, Some(3));
    }

    #[test]
    fn an_emit_limit_over_one_log_record_is_refused_naming_the_flag() {
        let error = consume_args(&["--max-emit-kib", "16385"]).config(None).err().unwrap().to_string();
        assert_eq!(error, "--max-emit-kib 16385 is over what one record of the log holds (16384 KiB); lower it");
        let at_most = ["--max-emit-kib", "16384", "--max-emit-kib-per-call", "16384", "--max-batch-held-mib", "1024"];
        consume_args(&at_most).config(None).unwrap();
    }

    #[test]
    fn module_time_per_batch_is_a_duration_and_zero_is_refused() {
        assert_eq!(
            consume_args(&[]).config(None).unwrap().module_time_per_batch,
            ConsumerConfig::default().module_time_per_batch
        );
        let config = consume_args(&["--max-module-time-per-batch", "250ms"]).config(None).unwrap();
        assert_eq!(config.module_time_per_batch, Duration::from_millis(250));
        let error = consume_args(&["--max-module-time-per-batch", "0s"]).config(None).err().unwrap().to_string();
        assert_eq!(error, "--max-module-time-per-batch must be more than 0");
    }

    #[test]
    fn a_host_memory_below_one_instance_is_refused_naming_both_flags() {
        let error = consume_args(&["--memory-mib", "128", "--host-memory-mib", "100"]).limits.limits().unwrap_err();
        assert_eq!(
            error.to_string(),
            "--host-memory-mib 100 is less than one instance may hold (--memory-mib 128); raise it"
        );
        consume_args(&["--memory-mib", "128", "--host-memory-mib", "128"]).limits.limits().unwrap();
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
            "--retry-queue-mib",
            "3",
        ]);
        let expected = RetryPolicy {
            transient_retries: 0,
            transient_backoff: Duration::from_millis(5),
            delays: vec![Duration::from_millis(250), Duration::from_secs(3), Duration::from_secs(60)],
            max_attempts: 2,
            queue_max_bytes: 3 << 20,
        };
        assert_eq!(args.config(None).unwrap().retry, expected);
        assert_eq!(consume_args(&[]).config(None).unwrap().retry, RetryPolicy::default());
        let error = consume_args(&["--max-attempts", "0"]).config(None).err().unwrap();
        assert_eq!(error.to_string(), "--max-attempts must be at least 1");
        let error = consume_args(&["--retry-queue-mib", "0"]).config(None).err().unwrap();
        assert_eq!(error.to_string(), "--retry-queue-mib must be at least 1");
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
            "--max-counters",
            "--max-entries-per-key",
            "--max-timer-payload-bytes",
            "--max-timers-per-key",
            "--max-timers",
        ] {
            let args = consume_args(&[flag, "0"]);
            let error = sandbox(&args).err().expect("a zero limit is refused").to_string();
            assert_eq!(error, format!("{flag} must be at least 1"));
        }
        let args = consume_args(&["--memory-mib", &usize::MAX.to_string()]);
        assert!(sandbox(&args).err().unwrap().to_string().contains("--memory-mib"));
    }
}
