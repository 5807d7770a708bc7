//! The partition set of one projection's consumer ([`Consumer`]): which
//! partitions it consumes, and how they come and go.
//!
//! A consumer either holds a fixed set (every partition, or those
//! [`ConsumerConfig::partitions`] names) until the end offsets read at its
//! start, given positions or a shutdown; or it follows a consumer group's
//! assignment as it changes ([`Consumer::with_assignment`]). Each partition
//! held runs its own loop ([`PartitionLoop`]) as a task; this module starts,
//! stops and gathers them.
//!
//! Rules kept here:
//! - **Nothing is consumed before the routed topics are durable** and the
//!   topics' identity is what was recorded ([`loss`]).
//! - **A partition is claimed before it is read** (its previous host can
//!   no longer commit to it) and its outbox published first.
//! - **Start-up waits out an unavailable log** (a server restarting, a
//!   cluster electing a leader): every step before the partitions start
//!   may be repeated (topics created if missing, claims, the outbox's
//!   stamped appends, end offsets read), so the whole start is tried
//!   again with the log's backoff, said once, until the log answers or
//!   the consumer is told to stop.
//! - **One partition failing stops the others the same way**, so the error
//!   is returned at once rather than at the next shutdown.
//! - **Partitions move without redone work**: one lost is let go after its
//!   batch in flight commits; one gained waits until its previous host let
//!   it go or its hold ended, never on a timer of this host's.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap, FxHashSet};

use super::partition_loop::PartitionLoop;
use super::parts::Parts;
use super::timing_status::TimingBoard;
use super::{CallObserver, ConsumerConfig, ConsumerError, Summary};
use crate::engine::metrics::Metrics;
use crate::engine::outbox::{self, Published};
use crate::engine::progress::Progress;
use crate::engine::projection::Projection;
use crate::engine::telemetry::Telemetry;
use crate::storage::log::loss::{self, TopicRole};
use crate::storage::log::{EventLog, LogError};

/// Consumes one projection's topics from a log.
pub struct Consumer<L> {
    /// What every partition's loop shares.
    parts: Parts<L>,
    /// When set, the partitions to hold while following, as they change
    /// ([`Consumer::with_assignment`]).
    assignment: Option<tokio::sync::watch::Receiver<Vec<u32>>>,
}

impl<L> Clone for Consumer<L> {
    fn clone(&self) -> Self {
        Self { parts: self.parts.clone(), assignment: self.assignment.clone() }
    }
}

impl<L: EventLog> Consumer<L> {
    /// A consumer of `projection`'s topic on `log`.
    pub fn new(log: Arc<L>, projection: Arc<Projection>, config: ConsumerConfig) -> Self {
        Self { parts: Parts::new(log, projection, config), assignment: None }
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
        self.parts.runner.keys.observer = Some(observer);
        self
    }

    /// Exports a span per batch (and its calls) and the messaging metrics
    /// through `telemetry`.
    pub fn with_telemetry(mut self, telemetry: Option<Telemetry>) -> Self {
        self.parts.telemetry = telemetry;
        self
    }

    /// Records what every committed batch did in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.parts.runner.record_in(metrics.clone());
        self.parts.metrics = Some(metrics);
        self
    }

    /// The caught-up gate: filled when consuming starts, advanced after
    /// every commit.
    pub fn progress(&self) -> Arc<Progress> {
        self.parts.progress.clone()
    }

    /// What the release stages of a projection over several topics show:
    /// clocks, held events, late events.
    pub fn timing(&self) -> Arc<TimingBoard> {
        self.parts.timing.clone()
    }

    /// The partition count of the projection's topics, checked to be the
    /// same in each (co-partitioned).
    pub async fn partition_count(&self) -> Result<u32, ConsumerError> {
        let mut counts = Vec::new();
        for topic in self.parts.projection.topics() {
            counts.push((topic.clone(), self.parts.log.partitions(topic).await?));
        }
        let count = counts[0].1;
        if counts.iter().any(|(_, other)| *other != count) {
            return Err(ConsumerError::NotCoPartitioned { counts });
        }
        Ok(count)
    }

    /// The partitions this consumer owns, checked against the topic.
    pub async fn partitions(&self) -> Result<Vec<u32>, ConsumerError> {
        let topic = self.parts.projection.topic();
        let count = self.partition_count().await?;
        match &self.parts.config.partitions {
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
        if let (Some(assignment), Until::Shutdown) = (&self.assignment, &until) {
            let count = self.prepare().await?;
            return self.consume_assigned(count, assignment.clone(), shutdown).await;
        }
        let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
        let stop_tx = Arc::new(stop_tx);
        let stop_on_shutdown = stop_tx.clone();
        let watcher = tokio::spawn(async move {
            shutdown.await;
            let _ = stop_on_shutdown.send(true);
        });
        let mut backoff = None;
        let (gate, left) = loop {
            match self.start_fixed().await {
                Err(ConsumerError::Log(error @ LogError::Unavailable { .. })) => {
                    let (first, longest) = self.parts.config.log_backoff;
                    let wait = backoff.map_or(first, |last: Duration| (last * 2).clamp(first, longest));
                    if backoff.replace(wait).is_none() {
                        tracing::warn!(
                            projection = self.parts.projection.name(),
                            "cannot start: {error}; trying again until the log answers"
                        );
                    }
                    self.parts.progress.set_log_available(false);
                    let _ = tokio::time::timeout(wait, stop_rx.changed()).await;
                    if *stop_rx.borrow() {
                        watcher.abort();
                        return Ok(Summary::default());
                    }
                }
                started => break started?,
            }
        };
        self.parts.progress.set_log_available(true);
        self.parts.progress.begin(gate.iter().copied());
        let mut tasks = tokio::task::JoinSet::new();
        for (partition, _, end_at_start) in gate {
            let end = match &until {
                Until::EndOffsets => Some(end_at_start),
                Until::Positions(ends) => Some(ends.get(&partition).copied().unwrap_or(end_at_start)),
                Until::Shutdown => None,
            };
            let parts = self.parts.clone();
            let stop = stop_rx.clone();
            let stop_all = stop_tx.clone();
            tasks.spawn(async move {
                let result = PartitionLoop::run(parts, partition, end, stop).await.map(|(summary, _)| summary);
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

    /// What every start does first: the routed topics created (or checked)
    /// and durable, the topics' identity checked. Gives the partition count.
    async fn prepare(&self) -> Result<u32, ConsumerError> {
        let topic = self.parts.projection.topic();
        let count = self.partition_count().await?;
        let routed_topics = self.parts.projection.routed_topics();
        let routed = [(routed_topics.retry(), TopicRole::Retry), (routed_topics.dlq(), TopicRole::DeadLetter)];
        for (routed, role) in routed.map(|(name, role)| (name.to_owned(), role)) {
            match self.parts.log.create_topic(&routed, count).await {
                Err(LogError::PartitionCountMismatch { existing, .. }) => {
                    let topic = topic.to_owned();
                    return Err(ConsumerError::RoutedTopicMismatch { topic, partitions: count, routed, existing });
                }
                other => other?,
            }
            loss::require_durable(&*self.parts.log, &routed, role).await?;
        }
        for topic in self.parts.projection.topics() {
            loss::warn_if_lossy(&*self.parts.log, topic).await?;
            for truncation in loss::check_identity(&*self.parts.log, self.parts.projection.store(), topic).await? {
                if let Some(metrics) = &self.parts.metrics {
                    metrics.log_truncated(&truncation.topic, truncation.partition);
                }
            }
        }
        Ok(count)
    }

    /// The start of a fixed set of partitions, each step one that may be
    /// repeated: [`Consumer::prepare`], then every partition claimed, what
    /// the last run left in the outbox published, and the gate (each
    /// partition's position and end offset, read once).
    async fn start_fixed(&self) -> Result<(Vec<(u32, u64, u64)>, Published), ConsumerError> {
        self.prepare().await?;
        // Each partition is claimed first: a host that held it before can
        // no longer commit to it (a no-op for the embedded store).
        let partitions = self.partitions().await?;
        for &partition in &partitions {
            self.parts.projection.store().claim(partition)?;
        }
        // What the last run left, now that its retry and dead-letter
        // records have somewhere to go.
        let left = self.parts.publish_outbox(&partitions).await?;
        // The gate: every partition's end offset, read once at start-up.
        let mut gate = Vec::with_capacity(partitions.len());
        for &partition in &partitions {
            let (position, end) = self.parts.gate_of(partition).await?;
            gate.push((partition, position, end));
        }
        Ok((gate, left))
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
        self.parts.progress.begin([]);
        let mut shutdown = std::pin::pin!(shutdown);
        let mut assigned = Assigned::default();
        if let Some(metrics) = &self.parts.metrics {
            // Shown at 0 from the start, so a rebalance's cost reads as a difference.
            metrics.events_redone(self.parts.projection.name(), 0);
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
                    projection = self.parts.projection.name(),
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
                            projection = self.parts.projection.name(),
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
            let parts = self.parts.clone();
            tasks.spawn(async move { (partition, PartitionLoop::run(parts, partition, None, stopped).await) });
        }
    }

    /// Gives up a partition whose task ended (after its last commit, or
    /// fenced): out of the gate, and the store drops what it kept of it and
    /// its hold ([`StateBackend::release`](crate::storage::state::StateBackend::release)).
    fn let_go(&self, partition: u32) {
        self.parts.progress.release(partition);
        self.parts.timing.remove(partition);
        self.parts.projection.store().release(partition);
    }

    /// Takes a partition: claims it (fencing its previous host), forgets
    /// the stamps this process remembers of its outbox producer (the
    /// previous host appended under that name), publishes what its outbox
    /// holds, and gates it at its committed position and the end offset
    /// read now. Returns the messages found undeliverable, or `None` while
    /// the partition's previous host still holds it
    /// ([`StateBackend::claim_released`](crate::storage::state::StateBackend::claim_released)).
    async fn take_partition(&self, partition: u32) -> Result<Option<u64>, ConsumerError> {
        let Some(epoch) = self.parts.projection.store().claim_released(partition)? else { return Ok(None) };
        outbox::forget_stamps(
            &*self.parts.log,
            self.parts.projection.store(),
            self.parts.projection.name(),
            partition,
        )?;
        let left = self.parts.publish_outbox(&[partition]).await?;
        let (position, end) = self.parts.gate_of(partition).await?;
        self.parts.progress.take(partition, position, end);
        tracing::info!(
            projection = self.parts.projection.name(),
            partition,
            epoch,
            position,
            end,
            "took partition {partition}"
        );
        Ok(Some(left.undeliverable))
    }

    /// Logs and counts a failed [`Consumer::take_partition`] and returns
    /// how long to wait before trying again: the log's backoff, doubled
    /// after each failure in a row (`last` the wait before this one). The
    /// partition stays unheld meanwhile; the others go on.
    fn take_failed(&self, partition: u32, error: &ConsumerError, last: Option<Duration>) -> Duration {
        let (first, longest) = self.parts.config.log_backoff;
        let backoff = last.map_or(first, |last| (last * 2).clamp(first, longest));
        // Said once per run of failures, as the partitions' own outages are.
        let projection = self.parts.projection.name();
        match last {
            None => tracing::warn!(
                projection,
                partition,
                "cannot take partition {partition}: {error}; trying again in {backoff:?}"
            ),
            Some(_) => tracing::debug!(
                projection,
                partition,
                "cannot take partition {partition}: {error}; trying again in {backoff:?}"
            ),
        }
        if let Some(metrics) = &self.parts.metrics {
            metrics.partition_take_failed(self.parts.projection.name());
        }
        backoff
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

#[cfg(test)]
mod tests {
    //! The partition set on the embedded log and the embedded state store,
    //! on a runtime of one thread, with the test ledger's module.

    use super::super::test_ledger::{DEPOSIT, Ledger, relaxed};
    use super::*;
    use crate::key::Key;
    use crate::storage::log::EmbeddedLog;
    use crate::storage::state::StateStore;

    /// A log with each topic of `topics` and its partition count, and a
    /// consumer of them (the first one's routed topics) under `config`.
    async fn consumer(
        dir: &tempfile::TempDir,
        topics: &[(&str, u32)],
        config: ConsumerConfig,
    ) -> (Arc<EmbeddedLog>, Consumer<EmbeddedLog>) {
        let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
        for &(topic, partitions) in topics {
            log.create_topic(topic, partitions).await.unwrap();
        }
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        let more: Vec<String> = topics[1..].iter().map(|(topic, _)| (*topic).to_owned()).collect();
        let projection = Projection::new("p", topics[0].0, vec![Arc::new(Ledger::new())], store).unwrap();
        let projection = Arc::new(projection.with_more_topics(&more).unwrap());
        let config = ConsumerConfig { workers: 1, ..config };
        (log.clone(), Consumer::new(log, projection, config))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_partition_it_is_told_to_own_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let config = ConsumerConfig { partitions: Some(vec![1, 5]), ..ConsumerConfig::default() };
        let (_, consumer) = consumer(&dir, &[("t", 2)], config).await;

        let error = consumer.catch_up().await.unwrap_err();

        assert!(matches!(error, ConsumerError::NoSuchPartition { partition: 5, partitions: 2, .. }), "{error}");
        assert_eq!(error.to_string(), "topic `t` has 2 partitions; partition 5 does not exist");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn topics_of_different_partition_counts_are_refused_naming_each() {
        let dir = tempfile::tempdir().unwrap();
        let (_, consumer) = consumer(&dir, &[("a", 2), ("b", 3)], ConsumerConfig::default()).await;

        let error = consumer.partitions().await.unwrap_err();

        assert!(error.to_string().ends_with("but `a` has 2, `b` has 3"), "{error}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn catching_up_consumes_the_partitions_owned_to_their_ends_and_creates_the_routed_topics() {
        let dir = tempfile::tempdir().unwrap();
        let config = ConsumerConfig { partitions: Some(vec![0, 2]), ..ConsumerConfig::default() };
        let (log, consumer) = consumer(&dir, &[("t", 3)], config).await;
        let appended = (0..3).map(|partition| (partition, vec![relaxed(i64::from(partition), DEPOSIT, "2"); 4]));
        log.append("t", appended.collect()).await.unwrap();

        let summary = consumer.catch_up().await.unwrap();

        assert_eq!((summary.applied, summary.consumed), (8, 8), "partitions 0 and 2, not 1");
        let store = consumer.parts.projection.store();
        let positions: Vec<_> = (0..3).map(|partition| store.position("t", partition).unwrap()).collect();
        assert_eq!(positions, [Some(4), None, Some(4)]);
        assert_eq!(store.get(&Key::int(2), "balance").unwrap().as_deref(), Some(&b"8"[..]));
        let routed = consumer.parts.projection.routed_topics();
        for topic in [routed.retry(), routed.dlq()] {
            assert_eq!(log.partitions(topic).await.unwrap(), 3, "{topic}");
        }
        let progress = consumer.progress();
        assert!(progress.partitions().iter().all(|p| p.position == 4), "the gate reached every end");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_routed_topic_of_another_partition_count_is_refused_before_anything_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let (log, consumer) = consumer(&dir, &[("t", 2)], ConsumerConfig::default()).await;
        let retry = consumer.parts.projection.routed_topics().retry().to_owned();
        log.create_topic(&retry, 3).await.unwrap();
        log.append("t", vec![(0, vec![relaxed(1, DEPOSIT, "1")])]).await.unwrap();

        let error = consumer.catch_up().await.unwrap_err();

        assert!(matches!(&error, ConsumerError::RoutedTopicMismatch { existing: 3, partitions: 2, .. }), "{error}");
        assert_eq!(consumer.parts.projection.store().position("t", 0).unwrap(), None);
    }
}
