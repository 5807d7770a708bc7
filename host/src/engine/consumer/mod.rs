//! The consumer loop: poll → plan → reduce → invoke → commit, per partition.
//!
//! For each polled batch of one partition:
//! 1. **Plan** from headers alone ([`crate::plan`]); bodies stay opaque.
//!    Records are grouped by key, and a key is its canonical bytes, never
//!    its hash: each distinct key of the batch gets a planning number of
//!    its own, so keys whose hashes collide never share a run, a fold, a
//!    state scope or a retry diversion. A message whose headers cannot be
//!    parsed goes to the dead-letter topic with the parse error. Events of a key that is waiting in retry are
//!    diverted behind it, to the retry topic ([`crate::engine::routing`]).
//! 2. **Execute per key.** Keys are spread over worker threads (a batch
//!    with one worker runs on the calling thread); one key's
//!    runs execute one after another (head, body runs, tail, segment after
//!    segment), so a key never races with itself. Each run is reduced with
//!    its type's algebra ([`crate::reduce`]) and handed to the module in
//!    chunks of at most `max-batch` events. Runs whose tag no module
//!    declares are skipped and counted as `skipped`. A failed chunk is
//!    routed by its class ([`crate::engine::routing`]): retried in place, sent with
//!    the key's unfinished work to the retry topic, or dead-lettered.
//! 3. **Commit once.** State writes, counter changes, the outbox (emitted
//!    messages and routed records), counts, the partition's next offset and
//!    the retry bookkeeping go into the projection's store in one
//!    transaction. A crash at any moment leaves the state exactly as if
//!    every event before the committed offset had been applied once. The
//!    outbox is then published to the log and cleared ([`crate::engine::outbox`]):
//!    each entry once, and a message that can never be delivered
//!    dead-lettered instead of blocking the partition; a leftover outbox is
//!    published again at start-up, once the retry and dead-letter topics
//!    exist.
//!
//! Between batches, keys whose retry is due are taken from the retry topic
//! (all of a key's waiting records at once), planned and executed the same
//! way, and committed with the retry position and the offsets now done.
//! Every event ends applied, skipped, in retry or dead-lettered, and the
//! counts in [`crate::storage::stats`] say which.
//!
//! A host fault ([`CallError::HostFault`](crate::sandbox::handler::CallError::HostFault): the state store failed under a
//! call) is never counted against a module: the batch is not committed,
//! and the partition tries it again after the same backoff as an
//! unavailable log.
//!
//! A partition another host took ([`StateError::Fenced`]: its commit was
//! refused whole) is dropped: logged with the epochs, counted
//! (`waku_partitions_fenced_total`, and its batch's events in
//! `waku_events_redone_total`), taken out of the caught-up gate, while
//! the host keeps consuming its other partitions. A commit refused because
//! the database no longer holds the position this host's last commit left
//! ([`StateError::PositionMoved`]: it forgot acknowledged commits) starts
//! the partition over from what the database holds, nothing of the host's
//! memory of it kept, and counts the refused and forgotten events as
//! redone. Partitions that follow a
//! consumer group move without that ([`Consumer::with_assignment`]): the
//! host that loses one lets it go after its batch in flight, and the one
//! that gains it waits for that. Taking an assigned
//! partition that fails (the log or the state store unreachable while
//! claiming it, publishing its outbox or reading its end offset) never
//! stops the host: logged, counted (`waku_partition_takes_failed_total`)
//! and tried again after the log's backoff, doubling.
//!
//! Progress is measured against end offsets read from the log, never a
//! timer: [`Consumer::catch_up`] reads every partition's end offset once and
//! returns when the committed position reaches it and no retry is due.
//!
//! The log is not trusted to keep what it acknowledged ([`loss`]): before
//! consuming, the retry and dead-letter topics must be durable and the
//! topic's identity is compared with the one recorded; a partition's end
//! offset is read again at its start and, at most every
//! [`TAIL_CHECK`], while it finds nothing to read. An end below the
//! position or below an end read earlier is a lost tail: logged, counted,
//! recorded, and followed (the gate lowers to the new end, so catching up
//! never waits for offsets that are gone); one below what the projection
//! applied stops the partition ([`ConsumerError::LogTruncated`]).
//!
//! Layout: this module holds the partition loop (poll, settle, retries due);
//! `batch` takes a polled batch to its one commit, as a value: its
//! `BatchRunner` holds no log and no store, takes records and a snapshot
//! and gives back the commit, which the loop then hands the store (its unit
//! tests run batches so, with a native module); `key_table` numbers a
//! batch's keys; `key` runs one worker's keys; `failure` decides where a
//! failed chunk goes; [`phase`] times every batch phase by phase.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap, FxHashSet};

use crate::engine::metrics::Metrics;
use crate::engine::outbox::{self, OutboxError, Published};
use crate::engine::progress::Progress;
use crate::engine::projection::Projection;
use crate::engine::routing::{self, KeyInRetry, RetryPolicy, RetryQueue, Routed};
use crate::engine::telemetry::{BatchOf, BatchTrace, Telemetry};
use crate::event::{EventHeaders, EventTypeTag};
use crate::key::Key;
use crate::sandbox::handler::PayloadLimits;
use crate::storage::log::loss::{self, LossError, LostHistory, TopicRole, Truncation};
use crate::storage::log::{EventLog, LogError, PolledBatch};
use crate::storage::state::StateError;
use crate::storage::stats::{Stat, Stats};

mod batch;
use batch::{BatchBuffers, BatchRunner};
use timing::Advance;
mod call_time;
mod failure;
mod key;
mod key_table;
pub mod phase;
pub(crate) mod release_marks;
mod timing;
pub mod timing_status;

pub use phase::{Phase, PhaseTimes};
pub(crate) use release_marks::marked_topics;
pub use timing_status::{InputTiming, LatencyHistogram, PartitionTiming, TimingBoard};
use wakuwaku_core::release::{ReleaseError, ReleaseLimits};

/// How a consumer polls and executes.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Most messages polled per batch. Default 65 536: larger batches give
    /// longer runs to reduce and fewer handler calls and commits (see
    /// BENCHMARKS.md). It is a maximum: a poll takes what is there, so a
    /// consumer that keeps up handles small batches.
    pub batch_size: usize,
    /// Worker threads per batch; keys are spread over them. Default: the
    /// machine's available parallelism.
    pub workers: usize,
    /// The partitions this consumer owns; `None` means all of them.
    pub partitions: Option<Vec<u32>>,
    /// How long `follow` waits before polling an idle partition again.
    /// Default 50 ms. A log that signals its appends
    /// ([`EventLog::appends`]: the embedded log) ends the wait as soon as
    /// one is made.
    pub idle_poll: Duration,
    /// Size limits for what handlers hand the host.
    pub payload: PayloadLimits,
    /// How failed events are retried.
    pub retry: RetryPolicy,
    /// The first and the longest wait before trying an unavailable log
    /// again; the wait doubles in between. Default 100 ms and 5 s.
    pub log_backoff: (Duration, Duration),
    /// How long one module's calls (`combine` and `handle`, summed over the
    /// workers) may run in one batch before its further calls in the batch
    /// are not made and their keys go to retry without losing an attempt
    /// ([`CallError::BatchTime`](crate::sandbox::handler::CallError::BatchTime)), so
    /// a slow module cannot hold up the partition. Default 30 s.
    pub module_time_per_batch: Duration,
    /// What bounds the events a projection over several topics holds for
    /// event-time order, per partition index ([`ReleaseLimits`]; default
    /// 64 MiB held).
    pub release: ReleaseLimits,
    /// Topics of a projection over several topics whose events carry no
    /// event time (a catalogue): their events pass at once, and they serve
    /// as the processing-time clock once every other topic's partitions
    /// are idle ([`wakuwaku_core::release`], "processing-time clock").
    /// Default: none.
    pub untimed_topics: Vec<String>,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            batch_size: 65_536,
            workers: std::thread::available_parallelism().map_or(1, usize::from),
            partitions: None,
            idle_poll: Duration::from_millis(50),
            payload: PayloadLimits::default(),
            retry: RetryPolicy::default(),
            log_backoff: (Duration::from_millis(100), Duration::from_secs(5)),
            module_time_per_batch: Duration::from_secs(30),
            release: ReleaseLimits::default(),
            untimed_topics: Vec::new(),
        }
    }
}

/// Why consuming stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The state store failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// A partition this consumer was told to own does not exist.
    #[error("topic `{topic}` has {partitions} partitions; partition {partition} does not exist")]
    NoSuchPartition {
        /// The topic.
        topic: String,
        /// The partition asked for.
        partition: u32,
        /// How many the topic has.
        partitions: u32,
    },
    /// The topics of a projection over several topics have different
    /// partition counts: a key would not land in the same partition index
    /// in each.
    #[error(
        "the topics of a projection must have the same number of partitions (co-partitioned), but {}",
        .counts.iter().map(|(topic, count)| format!("`{topic}` has {count}")).collect::<Vec<_>>().join(", ")
    )]
    NotCoPartitioned {
        /// Each topic with its partition count, in the order given.
        counts: Vec<(String, u32)>,
    },
    /// A topic the projection no longer reads holds events in the
    /// partition index's release stage (its last checkpoint lists them):
    /// run on without it, they would never be applied.
    #[error(
        "topic `{topic}` partition {partition} has {held} events held in the event-time stage (offsets from \
         {first}), and the projection no longer reads it: run once more with it (`--topic {topic}`) until caught \
         up, which applies every held event, then without it"
    )]
    HeldByRemovedTopic {
        /// The topic no longer given.
        topic: String,
        /// The partition index.
        partition: u32,
        /// How many events its checkpoint lists as held.
        held: u64,
        /// The lowest held offset.
        first: u64,
    },
    /// A topic the projection now reads alone was read in the release
    /// stage, and its checkpoint (written before checkpoints listed held
    /// events) does not say which events below `read_to` were applied.
    #[error(
        "topic `{topic}` partition {partition} was read in event-time order with other topics up to offset \
         {read_to}, and its checkpoint does not list which events from offset {commit} on were applied: run once \
         more with the projection's other topics until caught up, then with `{topic}` alone"
    )]
    ReleasedUnlisted {
        /// The topic read alone now.
        topic: String,
        /// The partition index.
        partition: u32,
        /// Its committed position.
        commit: u64,
        /// Where the release stage had read it to.
        read_to: u64,
    },
    /// The release stage refused a call: a bug in the host, never message
    /// content.
    #[error("the release stage refused a call: {0}")]
    Release(ReleaseError),
    /// A retry or dead-letter topic exists with another partition count
    /// than its main topic; records could not keep their partition.
    #[error(
        "topic `{routed}` has {existing} partitions but its main topic `{topic}` has {partitions}; they must match \
         (delete `{routed}` or give it {partitions} partitions)"
    )]
    RoutedTopicMismatch {
        /// The main topic.
        topic: String,
        /// Its partition count.
        partitions: u32,
        /// The retry or dead-letter topic.
        routed: String,
        /// Its partition count.
        existing: u32,
    },
    /// The host failed under a handler call (its state store could not be
    /// read). Not the module's doing: the batch is not committed, and the
    /// partition tries it again after a backoff.
    #[error("host fault while handling a batch: {0}")]
    HostFault(String),
    /// A worker thread panicked (a bug in the host, never in a module).
    #[error("a consumer worker panicked: {0}")]
    WorkerPanicked(String),
    /// The outbox holds a record of the host's own it cannot append.
    #[error(transparent)]
    Outbox(OutboxError),
    /// A partition lost offsets from which the projection already applied
    /// events ([`loss`]): it stops, at every start, until `waku reset`.
    #[error("{0}")]
    LogTruncated(Box<Truncation>),
    /// A replay from the earliest offset would lack messages retention
    /// deleted, and was not accepted ([`loss::refuse_lost_history`]).
    #[error(transparent)]
    LostHistory(Box<LostHistory>),
}

impl From<LossError> for ConsumerError {
    fn from(error: LossError) -> Self {
        match error {
            LossError::Log(error) => ConsumerError::Log(error),
            LossError::State(error) => ConsumerError::State(error),
            LossError::LostHistory(lost) => ConsumerError::LostHistory(lost),
        }
    }
}

impl From<OutboxError> for ConsumerError {
    /// Log and state failures stay what they are, so an unavailable log is
    /// waited out wherever it happened.
    fn from(error: OutboxError) -> Self {
        match error {
            OutboxError::Log(error) => Self::Log(error),
            OutboxError::State(error) => Self::State(error),
            error => Self::Outbox(error),
        }
    }
}

/// Events handed to a handler, as seen by a [`CallObserver`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCall {
    /// The partition.
    pub partition: u32,
    /// The key.
    pub key: Key,
    /// The event type.
    pub tag: EventTypeTag,
    /// Offsets of the run's events, in log order.
    pub offsets: Vec<u64>,
    /// Events after reduction.
    pub reduced: usize,
    /// Handler calls made for the run.
    pub calls: usize,
}

/// Watches handler calls; tests use it to check execution order.
///
/// Calls for one key are reported in the order they ran: each successful
/// chunk of a run that reduction left as it was, or the whole of a reduced
/// run once every chunk of it succeeded. For records taken from the retry
/// topic the offsets are the origin offsets they carry.
pub trait CallObserver: Send + Sync {
    /// A run was handled successfully.
    fn run_handled(&self, call: &RunCall);
}

/// What a stretch of consuming did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Batches committed.
    pub batches: u64,
    /// Messages consumed (applied + skipped + malformed).
    pub consumed: u64,
    /// Events applied.
    pub applied: u64,
    /// Events skipped (no module declares their tag).
    pub skipped: u64,
    /// Messages with unreadable headers.
    pub malformed: u64,
    /// Events written to the dead-letter topic (malformed ones included).
    pub dead_lettered: u64,
    /// Events written to the retry topic.
    pub retry_in: u64,
    /// Events taken from the retry topic for another attempt.
    pub retry_out: u64,
    /// Emitted messages that could never be delivered (dead-lettered).
    pub undeliverable: u64,
    /// Late events (read after the clock passed their event time),
    /// applied at once.
    pub order_violations: u64,
    /// Handler calls made.
    pub calls: u64,
    /// Events processed for nothing: their batch's commit was refused
    /// because another host took the partition (fencing), or done again
    /// because the database had forgotten their commits
    /// ([`StateError::PositionMoved`]).
    pub redone: u64,
    /// Where the time went, per phase of a batch (see [`phase`]).
    pub phases: PhaseTimes,
}

impl Summary {
    /// Adds what `other` did.
    pub fn add(&mut self, other: &Summary) {
        self.batches += other.batches;
        self.consumed += other.consumed;
        self.applied += other.applied;
        self.skipped += other.skipped;
        self.malformed += other.malformed;
        self.dead_lettered += other.dead_lettered;
        self.retry_in += other.retry_in;
        self.retry_out += other.retry_out;
        self.undeliverable += other.undeliverable;
        self.order_violations += other.order_violations;
        self.calls += other.calls;
        self.redone += other.redone;
        self.phases.absorb(&other.phases);
    }

    /// The counts to add to the projection's statistics ([`crate::storage::stats`]).
    fn stat_deltas(&self) -> Stats {
        [
            (Stat::Applied, self.applied),
            (Stat::Skipped, self.skipped),
            (Stat::Malformed, self.malformed),
            (Stat::DeadLettered, self.dead_lettered),
            (Stat::RetryIn, self.retry_in),
            (Stat::RetryOut, self.retry_out),
            (Stat::OrderViolations, self.order_violations),
        ]
        .into_iter()
        .collect()
    }
}

/// Consumes one projection's topic from a log.
pub struct Consumer<L> {
    log: Arc<L>,
    projection: Arc<Projection>,
    config: ConsumerConfig,
    /// What runs its batches, from records to their commit.
    runner: BatchRunner,
    /// Partitions commit to one outbox; one publisher at a time, or two
    /// could publish the same entries before either clears them.
    outbox: Arc<tokio::sync::Mutex<()>>,
    progress: Arc<Progress>,
    metrics: Option<Arc<Metrics>>,
    /// When set, the partitions to hold while following, as they change
    /// ([`Consumer::with_assignment`]).
    assignment: Option<tokio::sync::watch::Receiver<Vec<u32>>>,
    /// What the release stages show (projections over several topics).
    timing: Arc<TimingBoard>,
    /// OpenTelemetry export, when configured ([`crate::engine::telemetry`]).
    telemetry: Option<Telemetry>,
}

impl<L> Clone for Consumer<L> {
    fn clone(&self) -> Self {
        Self {
            log: self.log.clone(),
            projection: self.projection.clone(),
            config: self.config.clone(),
            runner: self.runner.clone(),
            outbox: self.outbox.clone(),
            progress: self.progress.clone(),
            metrics: self.metrics.clone(),
            assignment: self.assignment.clone(),
            timing: self.timing.clone(),
            telemetry: self.telemetry.clone(),
        }
    }
}

impl<L: EventLog> Consumer<L> {
    /// A consumer of `projection`'s topic on `log`.
    pub fn new(log: Arc<L>, projection: Arc<Projection>, config: ConsumerConfig) -> Self {
        Self {
            log,
            runner: BatchRunner::new(&projection, &config),
            projection,
            outbox: Arc::default(),
            progress: Arc::default(),
            metrics: None,
            assignment: None,
            timing: Arc::default(),
            telemetry: None,
            config,
        }
    }

    /// Follows the partitions `assignment` names as it changes (Iggy's
    /// consumer-group assignment) instead of a fixed set, when following
    /// ([`Consumer::follow`]). Needs a state store shared by the hosts
    /// (PostgreSQL).
    ///
    /// Partitions move without redone work:
    /// - **Losing** one stops it between batches: the batch in flight
    ///   commits, then the partition is let go (its hold in the store too,
    ///   [`StateBackend::release`](crate::storage::state::StateBackend::release)).
    ///   Stopping lets every partition go the same way.
    /// - **Gaining** one claims it only once its previous host let it go or
    ///   that host's hold ended (it died, or stopped answering the store):
    ///   [`StateBackend::claim_released`](crate::storage::state::StateBackend::claim_released),
    ///   asked again every [`HOLD_RETRY`] meanwhile. What decides is the
    ///   store's view of the previous host, never a timer of this one; and
    ///   fencing still refuses a host that was wrong about holding one.
    /// - Taking one publishes what its outbox holds and resumes from its
    ///   committed position, its gate the position and end offset read then.
    ///
    /// A batch refused by fencing anyway is counted as redone
    /// (`waku_events_redone_total`, [`Summary::redone`]).
    pub fn with_assignment(mut self, assignment: tokio::sync::watch::Receiver<Vec<u32>>) -> Self {
        self.assignment = Some(assignment);
        self
    }

    /// Reports every handled run to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.runner.observer = Some(observer);
        self
    }

    /// Exports a span per batch (and its calls) and the messaging metrics
    /// through `telemetry`.
    pub fn with_telemetry(mut self, telemetry: Option<Telemetry>) -> Self {
        self.telemetry = telemetry;
        self
    }

    /// Records what every committed batch did in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.runner.metrics = Some(metrics.clone());
        self.metrics = Some(metrics);
        self
    }

    /// The caught-up gate: filled when consuming starts, advanced after
    /// every commit.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// What the release stages of a projection over several topics show:
    /// clocks, held events, late events.
    pub fn timing(&self) -> Arc<TimingBoard> {
        self.timing.clone()
    }

    /// The partition count of the projection's topics, checked to be the
    /// same in each (co-partitioned).
    pub async fn partition_count(&self) -> Result<u32, ConsumerError> {
        let mut counts = Vec::new();
        for topic in self.projection.topics() {
            counts.push((topic.clone(), self.log.partitions(topic).await?));
        }
        let count = counts[0].1;
        if counts.iter().any(|(_, other)| *other != count) {
            return Err(ConsumerError::NotCoPartitioned { counts });
        }
        Ok(count)
    }

    /// The partitions this consumer owns, checked against the topic.
    pub async fn partitions(&self) -> Result<Vec<u32>, ConsumerError> {
        let topic = self.projection.topic();
        let count = self.partition_count().await?;
        match &self.config.partitions {
            None => Ok((0..count).collect()),
            Some(owned) => {
                if let Some(&missing) = owned.iter().find(|&&p| p >= count) {
                    return Err(ConsumerError::NoSuchPartition {
                        topic: topic.to_owned(),
                        partition: missing,
                        partitions: count,
                    });
                }
                Ok(owned.clone())
            }
        }
    }

    /// Consumes every partition up to the end offsets read when it starts,
    /// then returns what it did. Partitions run concurrently.
    pub async fn catch_up(&self) -> Result<Summary, ConsumerError> {
        self.consume(Until::EndOffsets, std::future::pending()).await
    }

    /// [`Consumer::catch_up`], stopping early when `shutdown` resolves: the
    /// batch in flight is finished and committed first.
    pub async fn catch_up_or_stop(
        &self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Summary, ConsumerError> {
        self.consume(Until::EndOffsets, shutdown).await
    }

    /// Consumes every partition, following new messages, until `shutdown`
    /// resolves; the batch in flight is finished and committed first.
    pub async fn follow(&self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<Summary, ConsumerError> {
        self.consume(Until::Shutdown, shutdown).await
    }

    /// Consumes each partition up to exactly the position `ends` gives it
    /// (partitions it does not name: up to the end offset read now), then
    /// returns. A rebuild lines a shadow and the live projection up with it
    /// ([`crate::operations::rebuild`]).
    pub async fn catch_up_to(&self, ends: FxHashMap<u32, u64>) -> Result<Summary, ConsumerError> {
        self.consume(Until::Positions(ends), std::future::pending()).await
    }

    /// Runs one task per partition until `until` or `shutdown`. A partition
    /// that fails stops the others the same way, so the error is returned at
    /// once instead of at the next shutdown.
    async fn consume(
        &self,
        until: Until,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Summary, ConsumerError> {
        let topic = self.projection.topic();
        let count = self.partition_count().await?;
        let routed_topics = self.projection.routed_topics();
        let routed = [(routed_topics.retry(), TopicRole::Retry), (routed_topics.dlq(), TopicRole::DeadLetter)];
        for (routed, role) in routed.map(|(name, role)| (name.to_owned(), role)) {
            match self.log.create_topic(&routed, count).await {
                Err(LogError::PartitionCountMismatch { existing, .. }) => {
                    let topic = topic.to_owned();
                    return Err(ConsumerError::RoutedTopicMismatch { topic, partitions: count, routed, existing });
                }
                other => other?,
            }
            loss::require_durable(&*self.log, &routed, role).await?;
        }
        for topic in self.projection.topics() {
            loss::warn_if_lossy(&*self.log, topic).await?;
            for truncation in loss::check_identity(&*self.log, self.projection.store(), topic).await? {
                if let Some(metrics) = &self.metrics {
                    metrics.log_truncated(&truncation.topic, truncation.partition);
                }
            }
        }
        if let (Some(assignment), Until::Shutdown) = (&self.assignment, &until) {
            return self.consume_assigned(count, assignment.clone(), shutdown).await;
        }
        // Each partition is claimed first: a host that held it before can
        // no longer commit to it (a no-op for the embedded store).
        let partitions = self.partitions().await?;
        for &partition in &partitions {
            self.projection.store().claim(partition)?;
        }
        // What the last run left, now that its retry and dead-letter
        // records have somewhere to go.
        let left = self.publish_outbox(&partitions).await?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stop_tx = Arc::new(stop_tx);
        let stop_on_shutdown = stop_tx.clone();
        let watcher = tokio::spawn(async move {
            shutdown.await;
            let _ = stop_on_shutdown.send(true);
        });
        // The gate: every partition's end offset, read once at start-up.
        let mut gate = Vec::with_capacity(partitions.len());
        for &partition in &partitions {
            let (position, end) = self.gate_of(partition).await?;
            gate.push((partition, position, end));
        }
        self.progress.begin(gate.iter().copied());
        let mut tasks = tokio::task::JoinSet::new();
        for (partition, _, end_at_start) in gate {
            let end = match &until {
                Until::EndOffsets => Some(end_at_start),
                Until::Positions(ends) => Some(ends.get(&partition).copied().unwrap_or(end_at_start)),
                Until::Shutdown => None,
            };
            let consumer = self.clone();
            let stop = stop_rx.clone();
            let stop_all = stop_tx.clone();
            tasks.spawn(async move {
                let result = consumer.consume_partition(partition, end, stop).await.map(|(summary, _)| summary);
                if result.is_err() {
                    let _ = stop_all.send(true);
                }
                result
            });
        }
        let summary = collect(tasks).await;
        watcher.abort();
        let mut summary = summary?;
        summary.undeliverable += left.undeliverable;
        Ok(summary)
    }

    /// Follows the partitions `assignment` names until `shutdown`
    /// ([`Consumer::with_assignment`]): one task per partition held, started
    /// when the partition is taken and stopped (between batches) when it is
    /// lost, and let go when its task ends. One its previous host still
    /// holds is asked for again after [`HOLD_RETRY`]. A partition another host took while it is still assigned here
    /// is taken back only after [`RETAKE_AFTER`]: the other host's view of
    /// the assignment was newer or older than this one's, and by then both
    /// have asked again (two hosts never claim it back and forth at full
    /// speed, and a partition handed back between two asks is not left
    /// without a host). A take that fails is tried again after a backoff
    /// ([`Consumer::take_failed`]).
    async fn consume_assigned(
        &self,
        count: u32,
        mut assignment: tokio::sync::watch::Receiver<Vec<u32>>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Summary, ConsumerError> {
        self.progress.begin([]);
        let mut shutdown = std::pin::pin!(shutdown);
        let mut assigned = Assigned::default();
        if let Some(metrics) = &self.metrics {
            // Shown at 0 from the start, so a rebalance's cost reads as a difference.
            metrics.events_redone(self.projection.name(), 0);
        }
        let mut tasks = tokio::task::JoinSet::new();
        let mut total = Summary::default();
        let result = loop {
            let wanted: FxHashSet<u32> =
                assignment.borrow_and_update().iter().copied().filter(|&p| p < count).collect();
            self.take_wanted(&wanted, &mut assigned, &mut tasks, &mut total).await;
            let Assigned { held, fenced, failed, waiting } = &mut assigned;
            let retake = (fenced.values().map(|at| *at + RETAKE_AFTER))
                .chain(failed.values().map(|f| f.0))
                .chain(waiting.values().copied())
                .min();
            tokio::select! {
                () = &mut shutdown => break Ok(()),
                changed = assignment.changed() => if changed.is_err() { break Ok(()) },
                () = tokio::time::sleep_until(retake.unwrap_or_else(Instant::now).into()), if retake.is_some() => {}
                Some(joined) = tasks.join_next() => {
                    let (partition, ended) = joined.map_err(|e| ConsumerError::WorkerPanicked(e.to_string()))?;
                    held.remove(&partition);
                    self.let_go(partition);
                    match ended {
                        Ok((summary, was_fenced)) => {
                            total.add(&summary);
                            if was_fenced {
                                fenced.insert(partition, Instant::now());
                            }
                        }
                        Err(error) => break Err(error),
                    }
                }
            }
        };
        for stop in assigned.held.values() {
            let _ = stop.send(true);
        }
        let mut first_error = result.err();
        // Stopping: each partition lets go once its batch in flight
        // committed, so the hosts that get it take it at once.
        while let Some(joined) = tasks.join_next().await {
            match joined.map_err(|e| ConsumerError::WorkerPanicked(e.to_string())) {
                Ok((partition, Ok((summary, _)))) => {
                    self.let_go(partition);
                    total.add(&summary);
                }
                Ok((partition, Err(error))) => {
                    self.let_go(partition);
                    first_error.get_or_insert(error);
                }
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(total), Err)
    }

    /// Follows `wanted`, the partitions assigned now: stops the tasks of
    /// those held and no longer assigned, and takes each assigned one not
    /// held (unless fenced lately, or its take is to be tried again or
    /// asked for again later), starting its task in `tasks`.
    async fn take_wanted(
        &self,
        wanted: &FxHashSet<u32>,
        assigned: &mut Assigned,
        tasks: &mut PartitionTasks,
        total: &mut Summary,
    ) {
        assigned.fenced.retain(|partition, at| wanted.contains(partition) && at.elapsed() < RETAKE_AFTER);
        assigned.failed.retain(|partition, _| wanted.contains(partition));
        assigned.waiting.retain(|partition, _| wanted.contains(partition));
        for (&partition, stop) in &assigned.held {
            if !wanted.contains(&partition) {
                tracing::info!(
                    projection = self.projection.name(),
                    partition,
                    "partition {partition} unassigned: stopping it"
                );
                let _ = stop.send(true);
            }
        }
        let now = Instant::now();
        let mut taken: Vec<u32> = wanted
            .iter()
            .copied()
            .filter(|p| !assigned.held.contains_key(p) && !assigned.fenced.contains_key(p))
            .filter(|p| assigned.failed.get(p).is_none_or(|(again, _)| *again <= now))
            .filter(|p| assigned.waiting.get(p).is_none_or(|again| *again <= now))
            .collect();
        taken.sort_unstable();
        for partition in taken {
            match self.take_partition(partition).await {
                Ok(None) => {
                    if assigned.waiting.insert(partition, Instant::now() + HOLD_RETRY).is_none() {
                        tracing::info!(
                            projection = self.projection.name(),
                            partition,
                            "partition {partition} is still held by its previous host: taking it once that host \
                             commits its batch in flight and lets it go"
                        );
                    }
                    continue;
                }
                Ok(Some(left)) => {
                    assigned.failed.remove(&partition);
                    assigned.waiting.remove(&partition);
                    total.undeliverable += left;
                }
                Err(error) => {
                    let backoff = self.take_failed(partition, &error, assigned.failed.get(&partition).map(|f| f.1));
                    assigned.failed.insert(partition, (Instant::now() + backoff, backoff));
                    continue;
                }
            }
            let (stop, stopped) = tokio::sync::watch::channel(false);
            assigned.held.insert(partition, stop);
            let consumer = self.clone();
            tasks.spawn(async move { (partition, consumer.consume_partition(partition, None, stopped).await) });
        }
    }

    /// Gives up a partition whose task ended (after its last commit, or
    /// fenced): out of the gate, and the store drops what it kept of it and
    /// its hold ([`StateBackend::release`](crate::storage::state::StateBackend::release)).
    fn let_go(&self, partition: u32) {
        self.progress.release(partition);
        self.timing.remove(partition);
        self.projection.store().release(partition);
    }

    /// Takes a partition: claims it (fencing its previous host), forgets
    /// the stamps this process remembers of its outbox producer (the
    /// previous host appended under that name), publishes what its outbox
    /// holds, and gates it at its committed position and the end offset
    /// read now. Returns the messages found undeliverable, or `None` while
    /// the partition's previous host still holds it
    /// ([`StateBackend::claim_released`](crate::storage::state::StateBackend::claim_released)).
    async fn take_partition(&self, partition: u32) -> Result<Option<u64>, ConsumerError> {
        let Some(epoch) = self.projection.store().claim_released(partition)? else { return Ok(None) };
        outbox::forget_stamps(&*self.log, self.projection.store(), self.projection.name(), partition)?;
        let left = self.publish_outbox(&[partition]).await?;
        let (position, end) = self.gate_of(partition).await?;
        self.progress.take(partition, position, end);
        tracing::info!(
            projection = self.projection.name(),
            partition,
            epoch,
            position,
            end,
            "took partition {partition}"
        );
        Ok(Some(left.undeliverable))
    }

    /// A partition index's gate: its committed position and the end offset
    /// read now, each summed over the projection's topics (for one topic,
    /// the topic's own).
    async fn gate_of(&self, partition: u32) -> Result<(u64, u64), ConsumerError> {
        let (mut position, mut end) = (0, 0);
        for topic in self.projection.topics() {
            position += self.projection.store().position(topic, partition)?.unwrap_or(0);
            end += self.log.end_offset(topic, partition).await?;
        }
        Ok((position, end))
    }

    /// Logs and counts a failed [`Consumer::take_partition`] and returns
    /// how long to wait before trying again: the log's backoff, doubled
    /// after each failure in a row (`last` the wait before this one). The
    /// partition stays unheld meanwhile; the others go on.
    fn take_failed(&self, partition: u32, error: &ConsumerError, last: Option<Duration>) -> Duration {
        let (first, longest) = self.config.log_backoff;
        let backoff = last.map_or(first, |last| (last * 2).clamp(first, longest));
        tracing::warn!(
            projection = self.projection.name(),
            partition,
            "cannot take partition {partition}: {error}; trying again in {backoff:?}"
        );
        if let Some(metrics) = &self.metrics {
            metrics.partition_take_failed(self.projection.name());
        }
        backoff
    }

    /// Consumes one partition until `end` (if given) or until `stop` is set.
    /// Keys whose retry is due are taken before the next batch is polled.
    ///
    /// When the log is unavailable ([`LogError::Unavailable`]), the partition
    /// waits with a growing backoff and tries again from what it committed:
    /// the outbox and retry index owed by the last commit are settled first,
    /// and a retry queue that was being worked on is rebuilt from the log.
    /// Says, with what it did, whether it ended because another host took
    /// the partition.
    async fn consume_partition(
        &self,
        partition: u32,
        mut end: Option<u64>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<(Summary, bool), ConsumerError> {
        let mut state = self.partition_state(partition, end).await?;
        let mut summary = Summary::default();
        let mut backoff = Duration::ZERO;
        loop {
            if *stop.borrow() {
                break;
            }
            let step = self.step(partition, end, &mut state, &mut summary).await;
            if let Some(lowered) = state.lowered_end.take() {
                end = end.map(|end| end.min(lowered));
            }
            match step {
                Ok(Step::Worked) => {}
                Ok(Step::Done) => break,
                Ok(Step::Idle(wait)) => {
                    let woken = async {
                        tokio::select! {
                            _ = stop.changed() => {}
                            () = appended(&mut state.appends) => {}
                        }
                    };
                    let _ = tokio::time::timeout(wait, woken).await;
                }
                Ok(Step::Full(wait)) => {
                    let _ = tokio::time::timeout(wait, stop.changed()).await;
                }
                Err(error @ (ConsumerError::Log(LogError::Unavailable { .. }) | ConsumerError::HostFault(_))) => {
                    let (first, longest) = self.config.log_backoff;
                    backoff = (backoff * 2).clamp(first, longest);
                    tracing::warn!(
                        projection = self.projection.name(),
                        partition,
                        "{error}; trying again in {backoff:?}"
                    );
                    if matches!(error, ConsumerError::Log(_)) {
                        self.progress.set_log_available(false);
                        if let Some(metrics) = &self.metrics {
                            metrics.log_unavailable(self.projection.name());
                        }
                    }
                    let _ = tokio::time::timeout(backoff, stop.changed()).await;
                    continue;
                }
                Err(ConsumerError::State(StateError::Fenced { held, current, .. })) => {
                    summary.redone += state.in_flight;
                    self.drop_fenced(partition, held, current, state.in_flight);
                    return Ok((summary, true));
                }
                Err(ConsumerError::State(moved @ StateError::PositionMoved { .. })) => {
                    let Some((reloaded, redone)) = self.reload(partition, end, &state, &moved).await? else {
                        summary.redone += state.in_flight;
                        self.give_up(partition, state.in_flight);
                        return Ok((summary, true));
                    };
                    summary.redone += redone;
                    state = reloaded;
                    continue;
                }
                Err(error) => return Err(error),
            }
            if !backoff.is_zero() {
                backoff = Duration::ZERO;
                if !self.progress.log_available() {
                    self.progress.set_log_available(true);
                    tracing::info!(projection = self.projection.name(), partition, "the log is available again");
                }
            }
        }
        if state.settle {
            self.settle_at_stop(partition, &state, &mut summary).await;
        }
        Ok((summary, false))
    }

    /// A partition's state as it starts: from its committed position (its
    /// end offset checked, or its release stage restored), its retry queue
    /// to be rebuilt from the log.
    async fn partition_state(&self, partition: u32, end: Option<u64>) -> Result<PartitionState, ConsumerError> {
        let topic = self.projection.topic().to_owned();
        let position = self.projection.store().position(&topic, partition)?.unwrap_or(0);
        release_marks::refuse_held_by_removed(self.projection.store(), self.projection.topics(), partition)?;
        let (timed, released) = match self.projection.topics().len() {
            1 => {
                self.check_tail_at_start(&topic, partition, position).await?;
                (None, release_marks::released_marks(self.projection.store(), &topic, partition)?.map(Arc::new))
            }
            _ => (Some(self.start_timed(partition).await?), None),
        };
        Ok(PartitionState {
            timed,
            released,
            position,
            known_end: end.unwrap_or(0).max(position),
            tail_checked: None,
            lowered_end: None,
            queue: None,
            settle: false,
            spare: PolledBatch::new(),
            buffers: BatchBuffers::default(),
            appends: self.log.appends(),
            queue_full: false,
            topic_turn: false,
            in_flight: 0,
        })
    }

    /// After a commit refused because the store's position was not where
    /// this host's last commit left it ([`StateError::PositionMoved`]: the
    /// database forgot acknowledged commits): claims the partition again,
    /// which drops what the store kept of it and reads its positions, and
    /// starts it over from what the store holds, nothing of the host's
    /// memory kept. The refused batch and the forgotten ones are counted as
    /// redone, and returned with the new state. `None` when another host
    /// holds the partition now (the database's restart ended this host's
    /// hold): it is given up.
    async fn reload(
        &self,
        partition: u32,
        end: Option<u64>,
        state: &PartitionState,
        moved: &StateError,
    ) -> Result<Option<(PartitionState, u64)>, ConsumerError> {
        if self.projection.store().claim_released(partition)?.is_none() {
            tracing::warn!(
                projection = self.projection.name(),
                partition,
                "{moved}; another host holds partition {partition} now: this host stops consuming it"
            );
            return Ok(None);
        }
        let mut reloaded = self.partition_state(partition, end).await?;
        // What the last commits the store kept owe the log is published
        // again (the stamps keep the log from taking anything twice).
        reloaded.settle = true;
        // The gate's position: summed over the topics, as it was and as the
        // store holds it now.
        let before = self.progress.partitions().into_iter().find(|p| p.partition == partition);
        let (now, _) = self.gate_of(partition).await?;
        let redone = state.in_flight + before.map_or(state.position, |p| p.position).saturating_sub(now);
        tracing::warn!(
            projection = self.projection.name(),
            partition,
            redone,
            "{moved}; partition {partition} starts again from offset {} as the store holds it ({redone} events \
             done again)",
            reloaded.position
        );
        self.progress.rewind(partition, now);
        self.progress.add_redone(redone);
        if let Some(metrics) = &self.metrics {
            metrics.events_redone(self.projection.name(), redone);
        }
        Ok(Some((reloaded, redone)))
    }

    /// A stop leaves nothing owed that a later command cannot see: the
    /// last commit's outbox (its dead letters among it) is appended before
    /// the partition is let go. A failure here is no failure of the stop:
    /// the outbox keeps what was not appended, and the next start (or
    /// `waku dlq redrive`) appends it, as after a crash.
    async fn settle_at_stop(&self, partition: u32, state: &PartitionState, summary: &mut Summary) {
        let topic = self.projection.topic();
        let settled = async {
            summary.undeliverable += self.publish_outbox(&[partition]).await?.undeliverable;
            self.log.store_consumer_offset(self.projection.name(), topic, partition, state.position).await?;
            Ok::<_, ConsumerError>(())
        };
        if let Err(error) = settled.await {
            tracing::warn!(
                projection = self.projection.name(),
                partition,
                "{error}; what the last batch owes the log stays in the outbox for the next start"
            );
        }
    }

    /// One step of [`Consumer::consume_partition`]: settle what the last
    /// commit owes, or give due keys another attempt, or consume a batch.
    async fn step(
        &self,
        partition: u32,
        end: Option<u64>,
        state: &mut PartitionState,
        summary: &mut Summary,
    ) -> Result<Step, ConsumerError> {
        let mut queue = match state.queue.take() {
            Some(queue) => queue,
            None => self.rebuild_retry_queue(partition).await?,
        };
        if state.settle {
            self.settle(partition, state, &mut queue, summary).await?;
        }
        // After a retry batch the topic has its turn, while it has more to
        // read: keys that stay due (a module slow on every call, cut by its
        // time per batch) would otherwise fill every step and hold up the
        // partition's other modules.
        let topic_turn = std::mem::take(&mut state.topic_turn) && end.is_none_or(|end| state.position < end);
        let due = match topic_turn {
            true => Vec::new(),
            false => queue.take_due(crate::platform::clock::now_ms(), self.config.batch_size, PolledBatch::BYTE_BUDGET),
        };
        if !due.is_empty() {
            state.in_flight = due.iter().map(|(_, in_retry)| in_retry.records.len() as u64).sum();
            // On an error the queue is rebuilt from the log next time.
            let (batch, settled) = self.retry_batch(partition, due, queue).await?;
            self.record_phases(&batch.phases);
            summary.add(&batch);
            state.queue = Some(settled);
            state.settle = true;
            state.topic_turn = true;
            return Ok(Step::Worked);
        }
        if let Some(until_due) = self.retry_queue_full(partition, state, &queue) {
            state.queue = Some(queue);
            return Ok(Step::Full(until_due));
        }
        let polling = Instant::now();
        let polled = match state.timed.take() {
            Some(mut timed) => {
                if let Some(appends) = &mut state.appends {
                    appends.borrow_and_update();
                }
                let polled = self.timed_read(partition, end.is_some(), &mut timed).await;
                state.timed = Some(timed);
                polled
            }
            None => self.poll_topic(partition, end, state, &queue).await,
        };
        match polled {
            Ok(Polled::Batch(records, advance)) => {
                self.apply(partition, (records, advance, polling.elapsed()), queue, state, summary).await
            }
            Ok(Polled::Nothing(step)) => {
                // Records another process appended to the retry topic (a
                // `waku dlq redrive` run through this host) join the queue
                // while the topic is quiet, and are attempted at once.
                let scanned = queue.scanned();
                let indexed = self.index_retries(partition, &mut queue, &FxHashSet::default()).await;
                let grew = queue.scanned() != scanned;
                state.queue = Some(queue);
                indexed?;
                Ok(if grew { Step::Worked } else { step })
            }
            Err(error) => {
                state.queue = Some(queue);
                Err(error)
            }
        }
    }

    /// Whether the partition's retry `queue` holds too much for it to read
    /// on (`queue_max_bytes`), and then how long until a retry is due;
    /// logs when the queue fills and when it has room again.
    fn retry_queue_full(&self, partition: u32, state: &mut PartitionState, queue: &RetryQueue) -> Option<Duration> {
        if !queue.is_empty() && queue.held_bytes() >= self.config.retry.queue_max_bytes {
            // Diverting more would hold a record per event of the backlog:
            // the topic waits until retries drain.
            if !std::mem::replace(&mut state.queue_full, true) {
                tracing::warn!(
                    projection = self.projection.name(),
                    partition,
                    "the retry queue holds {} MiB (`--retry-queue-mib`): partition {partition} reads no more of \
                     topic `{}` until its retries are done or dead-lettered",
                    queue.held_bytes() >> 20,
                    self.projection.topic(),
                );
            }
            let until_due = queue.next_due_ms().map_or(Duration::MAX, |due| {
                Duration::from_millis(due.saturating_sub(crate::platform::clock::now_ms()))
            });
            return Some(until_due);
        }
        if std::mem::take(&mut state.queue_full) {
            tracing::info!(projection = self.projection.name(), partition, "the retry queue has room: reading on");
        }
        None
    }

    /// After a commit: its outbox out, its retry records indexed (so the
    /// next batch diverts their keys), the log's consumer offsets updated.
    async fn settle(
        &self,
        partition: u32,
        state: &mut PartitionState,
        queue: &mut RetryQueue,
        summary: &mut Summary,
    ) -> Result<(), ConsumerError> {
        let started = Instant::now();
        summary.undeliverable += self.publish_outbox(&[partition]).await?.undeliverable;
        self.index_retries(partition, queue, &FxHashSet::default()).await?;
        let name = self.projection.name();
        match &state.timed {
            None => self.log.store_consumer_offset(name, self.projection.topic(), partition, state.position).await?,
            Some(_) => {
                for topic in self.projection.topics() {
                    let position = self.projection.store().position(topic, partition)?.unwrap_or(0);
                    self.log.store_consumer_offset(name, topic, partition, position).await?;
                }
            }
        }
        state.settle = false;
        let mut phases = PhaseTimes::default();
        phases.add(Phase::Outbox, started.elapsed());
        self.record_phases(&phases);
        summary.phases.absorb(&phases);
        Ok(())
    }

    /// Polls the one topic of a projection from the partition's position
    /// (up to `end` if given). On an empty poll, looks for a lost tail and
    /// says how long to wait: the idle poll, or less if a retry is due
    /// sooner.
    async fn poll_topic(
        &self,
        partition: u32,
        end: Option<u64>,
        state: &mut PartitionState,
        queue: &RetryQueue,
    ) -> Result<Polled, ConsumerError> {
        let want = match end {
            Some(end) if state.position >= end => return Ok(Polled::Nothing(Step::Done)),
            Some(end) => self.config.batch_size.min((end - state.position) as usize),
            None => self.config.batch_size,
        };
        if let Some(appends) = &mut state.appends {
            // Seen before polling: an append from here on ends the idle
            // wait should this poll find nothing.
            appends.borrow_and_update();
        }
        let spare = std::mem::take(&mut state.spare);
        let topic = self.projection.topic();
        let mut records = self.log.poll(topic, partition, state.position, want, spare).await?;
        let Some(last) = records.last() else {
            state.spare = records;
            self.check_tail(partition, state).await?;
            let until_due = queue
                .next_due_ms()
                .map(|due| Duration::from_millis(due.saturating_sub(crate::platform::clock::now_ms())));
            let wait = until_due.map_or(self.config.idle_poll, |until| until.min(self.config.idle_poll));
            return Ok(Polled::Nothing(Step::Idle(wait)));
        };
        let next = last.offset() + 1;
        let advance = match &state.released {
            Some(marks) => {
                records.retain_offsets(|offset| !marks.applied(offset));
                Advance::PastReleased(next, marks.clone())
            }
            None => Advance::Topic(next),
        };
        Ok(Polled::Batch(records, advance))
    }

    /// Plans, executes and commits a polled (or released) batch on a
    /// blocking thread, then moves the partition on by `advance`. Released
    /// events whose commit failed stay pending, to be applied again.
    async fn apply(
        &self,
        partition: u32,
        (records, advance, polled): (PolledBatch, Advance, Duration),
        queue: RetryQueue,
        state: &mut PartitionState,
        summary: &mut Summary,
    ) -> Result<Step, ConsumerError> {
        state.in_flight = records.len() as u64;
        if let Some(next) = advance.next_offset() {
            self.progress.read(partition, next);
        }
        let mut runner = self.runner.clone();
        let offsets = records.iter().map(|view| view.offset());
        let trace = self.open_trace(self.projection.topic(), partition, offsets, records.len(), polled);
        runner.trace = trace.as_ref().map(BatchTrace::calls);
        let mut buffers = std::mem::take(&mut state.buffers);
        // The modules of this batch, whatever is swapped in meanwhile.
        let (modules, store) = (self.projection.current(), self.projection.store().clone());
        let (batch, returned, records, buffers, advance) = tokio::task::spawn_blocking(move || {
            let polled = (&records, &advance);
            let batch = runner.process_batch(partition, polled, &queue, &mut buffers, modules, &store);
            (batch, queue, records, buffers, advance)
        })
        .await
        .map_err(|e| ConsumerError::WorkerPanicked(e.to_string()))?;
        if let Some(trace) = trace {
            trace.finish(batch.as_ref().map_err(|error| error as &dyn std::fmt::Display));
        }
        state.queue = Some(returned);
        state.buffers = buffers;
        let batch = match (&advance, &mut state.timed) {
            (Advance::Released(progress), Some(timed)) => match batch {
                Ok(batch) => {
                    if let Some(metrics) = self.metrics.as_ref().filter(|_| progress.violations > 0) {
                        metrics.order_violations(self.projection.name(), progress.violations);
                    }
                    timed.committed(records, progress, &self.timing);
                    self.progress.advance(partition, timed.gate_position());
                    batch
                }
                Err(error) => {
                    timed.not_committed(records);
                    return Err(error);
                }
            },
            (_, _) => {
                state.spare = records;
                let batch = batch?;
                if let Some(next) = advance.next_offset() {
                    state.position = next;
                    self.progress.advance(partition, next);
                    if state.released.as_ref().is_some_and(|marks| next >= marks.read_to()) {
                        state.released = None;
                    }
                }
                batch
            }
        };
        let mut batch = batch;
        batch.phases.add(Phase::Poll, polled);
        self.record_phases(&batch.phases);
        summary.add(&batch);
        state.settle = true;
        Ok(Step::Worked)
    }

    /// Stops a partition whose recorded truncation lost offsets the
    /// projection applied, or whose end offset is below its position now
    /// (recording that): before it reads anything.
    async fn check_tail_at_start(&self, topic: &str, partition: u32, position: u64) -> Result<(), ConsumerError> {
        if let Some(truncation) = loss::recorded(self.projection.store(), topic, partition)?
            && truncation.applied_lost()
        {
            return Err(ConsumerError::LogTruncated(Box::new(truncation)));
        }
        let end = self.log.end_offset(topic, partition).await?;
        match Truncation::detect(topic, partition, position, position, end) {
            Some(truncation) => {
                self.truncated(&truncation)?;
                Err(ConsumerError::LogTruncated(Box::new(truncation)))
            }
            None => Ok(()),
        }
    }

    /// Reads the partition's end offset again (at most every
    /// [`TAIL_CHECK`]) when a poll found nothing: an end below the position
    /// or below the highest end read is a lost tail. One below what was
    /// applied stops the partition; otherwise the partition follows the
    /// new end (its gate and, when catching up, where it stops).
    async fn check_tail(&self, partition: u32, state: &mut PartitionState) -> Result<(), ConsumerError> {
        if state.tail_checked.is_some_and(|at| at.elapsed() < TAIL_CHECK) {
            return Ok(());
        }
        state.tail_checked = Some(Instant::now());
        let topic = self.projection.topic();
        let end = self.log.end_offset(topic, partition).await?;
        let Some(truncation) = Truncation::detect(topic, partition, state.position, state.known_end, end) else {
            state.known_end = state.known_end.max(end);
            return Ok(());
        };
        self.truncated(&truncation)?;
        if truncation.applied_lost() {
            return Err(ConsumerError::LogTruncated(Box::new(truncation)));
        }
        state.known_end = end;
        state.lowered_end = Some(end);
        self.progress.lower_end(partition, end);
        Ok(())
    }

    /// Says a partition lost its tail: an error in the log, the count
    /// (`waku_log_truncated_total`), and the record `waku status` shows.
    fn truncated(&self, truncation: &Truncation) -> Result<(), ConsumerError> {
        tracing::error!(
            projection = self.projection.name(),
            topic = truncation.topic,
            partition = truncation.partition,
            "{truncation}"
        );
        if let Some(metrics) = &self.metrics {
            metrics.log_truncated(&truncation.topic, truncation.partition);
        }
        loss::record(self.projection.store(), truncation)?;
        Ok(())
    }

    /// The keys of `partition` waiting in retry, read from the retry topic
    /// from the committed retry position on, minus the records already done.
    async fn rebuild_retry_queue(&self, partition: u32) -> Result<RetryQueue, ConsumerError> {
        let retry = self.projection.routed_topics().retry().to_owned();
        let store = self.projection.store();
        let mut queue = RetryQueue::starting_at(store.position(&retry, partition)?.unwrap_or(0));
        let done: FxHashSet<u64> = store.done(&retry, partition)?.into_iter().collect();
        self.index_retries(partition, &mut queue, &done).await?;
        Ok(queue)
    }

    /// Adds this projection's records appended to the retry partition since
    /// the queue last looked, except those in `done`.
    async fn index_retries(
        &self,
        partition: u32,
        queue: &mut RetryQueue,
        done: &FxHashSet<u64>,
    ) -> Result<(), ConsumerError> {
        let retry = self.projection.routed_topics().retry().to_owned();
        let end = self.log.end_offset(&retry, partition).await?;
        // Polled, so what is read at once is bounded in bytes too.
        let mut records = PolledBatch::new();
        let mut unreadable = 0;
        while queue.scanned() < end {
            let want = self.config.batch_size.min((end - queue.scanned()) as usize);
            records = self.log.poll(&retry, partition, queue.scanned(), want, records).await?;
            let Some(last) = records.last().map(|r| r.offset()) else { break };
            for view in records.iter().filter(|r| !done.contains(&r.offset())) {
                let headers = view.owned_headers();
                let parsed =
                    Routed::parse(&headers).and_then(|routed| Ok((routed, EventHeaders::parse_stored(&headers)?)));
                match parsed {
                    Ok((routed, envelope)) if routed.projection == self.projection.name() => {
                        queue.index(view.offset(), envelope.key, &routed, view.stored_len(), &self.config.retry);
                    }
                    Ok(_) => {} // another projection's
                    Err(error) => {
                        unreadable += 1;
                        if unreadable <= key::FAILURES_LOGGED_PER_BATCH {
                            tracing::warn!(
                                projection = self.projection.name(),
                                partition,
                                offset = view.offset(),
                                "record in `{retry}` has unreadable headers and is ignored: {error}"
                            );
                        }
                    }
                }
            }
            queue.skip_to(last + 1);
        }
        if unreadable > key::FAILURES_LOGGED_PER_BATCH {
            tracing::warn!(
                projection = self.projection.name(),
                partition,
                "{} more records in `{retry}` have unreadable headers and are ignored",
                unreadable - key::FAILURES_LOGGED_PER_BATCH
            );
        }
        Ok(())
    }

    /// Gives keys whose retry is due another attempt: reads the first of
    /// their waiting records ([`RetryQueue::take_due`]), executes them like
    /// a batch, and commits the outcome with the retry position and the
    /// offsets now done. What the attempt left where it waits goes back in
    /// the queue. The caller then publishes the outbox and indexes what it
    /// added to the retry topic.
    async fn retry_batch(
        &self,
        partition: u32,
        due: Vec<(Key, KeyInRetry)>,
        mut queue: RetryQueue,
    ) -> Result<(Summary, RetryQueue), ConsumerError> {
        let retry = self.projection.routed_topics().retry().to_owned();
        let polling = Instant::now();
        let mut records = Vec::new();
        for (_, in_retry) in &due {
            for (first, count) in routing::consecutive(in_retry.records.iter().map(|w| w.offset)) {
                records.extend(self.log.read(&retry, partition, first, count).await?);
            }
        }
        let polled = polling.elapsed();
        let next_waiting =
            due.iter().filter_map(|(key, _)| queue.first_waiting(key).map(|offset| (key.clone(), offset))).collect();
        // Once every record taken is done; the batch lowers it to the first
        // record it leaves.
        let retry_position = queue.position();
        let mut runner = self.runner.clone();
        let offsets = records.iter().map(|stored| stored.offset);
        let trace = self.open_trace(&retry, partition, offsets, records.len(), polled);
        runner.trace = trace.as_ref().map(BatchTrace::calls);
        let (modules, store) = (self.projection.current(), self.projection.store().clone());
        let processed = tokio::task::spawn_blocking(move || {
            runner.process_retry_batch(partition, records, (next_waiting, retry_position), modules, &store)
        })
        .await
        .map_err(|e| ConsumerError::WorkerPanicked(e.to_string()))?;
        if let Some(trace) = trace {
            trace.finish(
                processed.as_ref().map(|(summary, _)| summary).map_err(|error| error as &dyn std::fmt::Display),
            );
        }
        let (mut summary, left) = processed?;
        summary.phases.add(Phase::Poll, polled);
        // An attempt that did nothing at all (its calls not made, for the
        // batch's budget or the module's time) leaves its keys waiting a
        // moment, so the partition does not spin on them.
        let taken: usize = due.iter().map(|(_, in_retry)| in_retry.records.len()).sum();
        let not_before = if left.len() == taken { crate::platform::clock::now_ms() + NOTHING_DONE_PAUSE_MS } else { 0 };
        let left: FxHashSet<u64> = left.into_iter().collect();
        for (key, in_retry) in due {
            let stays = in_retry.records.into_iter().filter(|waiting| left.contains(&waiting.offset)).collect();
            queue.put_back(key, stays, not_before);
        }
        Ok((summary, queue))
    }

    /// Drops a partition another host took (claimed epoch `current`, this
    /// host's was `held`): its refused commit changed nothing, the
    /// partition's new host resumes from the last commit, and this host
    /// goes on with its other partitions.
    fn drop_fenced(&self, partition: u32, held: u64, current: u64, redone: u64) {
        tracing::warn!(
            projection = self.projection.name(),
            partition,
            redone,
            "partition {partition} was taken over by another host (epoch {current}, this host held {held}): \
             its last batch ({redone} events) was not committed and this host stops consuming it"
        );
        self.give_up(partition, redone);
    }

    /// Takes a partition another host has now out of the gate, and counts
    /// its refused batch's events as redone.
    fn give_up(&self, partition: u32, redone: u64) {
        self.progress.release(partition);
        self.progress.add_redone(redone);
        if let Some(metrics) = &self.metrics {
            metrics.partition_fenced(self.projection.name());
            metrics.events_redone(self.projection.name(), redone);
        }
    }

    /// The OpenTelemetry trace of a batch of `count` records of `topic` at
    /// `offsets`, when telemetry is on.
    fn open_trace(
        &self,
        topic: &str,
        partition: u32,
        offsets: impl Iterator<Item = u64>,
        count: usize,
        polled: Duration,
    ) -> Option<BatchTrace> {
        let telemetry = self.telemetry.as_ref()?;
        let (first, last) = offsets.fold((u64::MAX, 0), |(first, last), offset| (first.min(offset), last.max(offset)));
        let projection = self.projection.name();
        Some(telemetry.batch(BatchOf { projection, topic, partition, count, first: first.min(last), last }, polled))
    }

    /// Observes a batch's (or a settle step's) phases in the metrics.
    fn record_phases(&self, phases: &PhaseTimes) {
        if let Some(metrics) = &self.metrics {
            metrics.batch_phases(self.projection.name(), phases);
        }
    }

    /// Publishes the outbox entries of `partitions`: what their committed
    /// batches emitted or routed.
    async fn publish_outbox(&self, partitions: &[u32]) -> Result<Published, ConsumerError> {
        let _one_publisher = self.outbox.lock().await;
        let projection = &*self.projection;
        let routed = projection.routed_topics();
        let published = outbox::publish(&*self.log, projection.store(), projection.name(), routed, partitions).await?;
        if let Some(metrics) = self.metrics.as_ref().filter(|_| published.undeliverable > 0) {
            metrics.undeliverable(projection.name(), published.undeliverable);
        }
        Ok(published)
    }
}

/// How long a partition another host took is left to it while the
/// assignment still names it here ([`Consumer::with_assignment`]): longer
/// than the consumer group is polled ([`crate::engine::membership::GROUP_POLL`]).
pub const RETAKE_AFTER: Duration = Duration::from_secs(2);

/// How soon a partition its previous host still holds is asked for again
/// ([`StateBackend::claim_released`](crate::storage::state::StateBackend::claim_released)):
/// that host lets go as soon as its batch in flight commits, so a handover
/// waits about this much past that commit.
pub const HOLD_RETRY: Duration = Duration::from_millis(25);

/// How often a partition that finds nothing to read reads its end offset
/// again, to notice a log that lost its tail ([`loss`]).
pub const TAIL_CHECK: Duration = Duration::from_secs(1);

/// How long keys wait after an attempt whose calls were none of them made
/// ([`Consumer::retry_batch`]).
const NOTHING_DONE_PAUSE_MS: u64 = 50;

/// What [`Consumer::consume_assigned`] keeps of the partitions it follows.
#[derive(Default)]
struct Assigned {
    /// The partitions held, each with what stops its task.
    held: FxHashMap<u32, tokio::sync::watch::Sender<bool>>,
    /// Partitions another host took while assigned here, and when.
    fenced: FxHashMap<u32, Instant>,
    /// Partitions whose taking failed: when to try again, and the wait
    /// after that.
    failed: FxHashMap<u32, (Instant, Duration)>,
    /// Partitions another host still holds (finishing its batch in
    /// flight): when to ask again.
    waiting: FxHashMap<u32, Instant>,
}

/// The tasks of the partitions followed, each ending with its partition,
/// its summary and whether it was fenced.
type PartitionTasks = tokio::task::JoinSet<(u32, Result<(Summary, bool), ConsumerError>)>;

/// Where one partition's consuming stands between steps.
struct PartitionState {
    /// The committed position.
    position: u64,
    /// The highest end offset read (or the position, if higher): an end
    /// below it is a lost tail.
    known_end: u64,
    /// When the end offset was last read to look for a lost tail.
    tail_checked: Option<Instant>,
    /// A lower end the partition follows since it lost its tail, for the
    /// caller to apply to where it stops.
    lowered_end: Option<u64>,
    /// The keys in retry; `None` when it must be rebuilt from the log.
    queue: Option<RetryQueue>,
    /// Whether the last commit's outbox and retry records still have to be
    /// published and indexed.
    settle: bool,
    /// The last polled batch, emptied by the next poll, which reuses its
    /// buffers.
    spare: PolledBatch,
    /// The planner's input and the plan, refilled by the next batch.
    buffers: BatchBuffers,
    /// The log's append signal, if it has one ([`EventLog::appends`]).
    appends: Option<tokio::sync::watch::Receiver<()>>,
    /// Whether its retry queue was full at the last step (logged once).
    queue_full: bool,
    /// Whether the last step was a retry batch: the topic goes next.
    topic_turn: bool,
    /// The release stage, for a projection over several topics: the
    /// partition index is read across all of them in event-time order.
    timed: Option<timing::Timed>,
    /// For a projection of one topic read in the release stage before
    /// (cut from several): what the stage released above the position,
    /// skipped until the position passes it.
    released: Option<Arc<release_marks::ReleasedMarks>>,
    /// The events of the batch being processed (or last processed): what
    /// a refused commit redid.
    in_flight: u64,
}

/// Resolves once records were appended since `appends` last looked;
/// never, for a log without the signal.
async fn appended(appends: &mut Option<tokio::sync::watch::Receiver<()>>) {
    if let Some(appends) = appends
        && appends.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// What a poll (or a timed read) found.
enum Polled {
    /// A batch to apply, and how it moves the partition on.
    Batch(PolledBatch, Advance),
    /// Nothing to apply: the step ends so.
    Nothing(Step),
}

/// What one step did.
enum Step {
    /// Committed something (or settled a commit).
    Worked,
    /// Nothing to do for now; look again after this long.
    Idle(Duration),
    /// The retry queue is full and nothing in it is due: look again after
    /// this long (when the first key is due), whatever is appended.
    Full(Duration),
    /// Reached the end it was given.
    Done,
}

/// How far [`Consumer::consume`] goes.
enum Until {
    /// The end offsets read at the start: catching up.
    EndOffsets,
    /// Given positions: lining up with another consumer.
    Positions(FxHashMap<u32, u64>),
    /// Only a shutdown: following.
    Shutdown,
}

async fn collect(mut tasks: tokio::task::JoinSet<Result<Summary, ConsumerError>>) -> Result<Summary, ConsumerError> {
    let mut total = Summary::default();
    let mut first_error = None;
    while let Some(joined) = tasks.join_next().await {
        match joined.map_err(|e| ConsumerError::WorkerPanicked(e.to_string())) {
            Ok(Ok(summary)) => total.add(&summary),
            Ok(Err(error)) | Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    first_error.map_or(Ok(total), Err)
}
