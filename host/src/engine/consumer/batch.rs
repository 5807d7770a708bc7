//! One batch, from records to a commit: headers parsed into the planner's
//! input (keys in retry diverted behind them, unreadable headers
//! dead-lettered), the plan split over the partition's workers, their
//! outcomes gathered into one [`BatchCommit`] with the position, and that
//! committed in one transaction.
//!
//! The batch is a value: [`BatchRunner`] holds neither the log nor the
//! store. It takes records and a way to read the snapshot of the batch's
//! keys and gives back the [`Finished`] batch, its commit not yet made;
//! [`BatchRunner::commit`] then hands that to the store. Gathering the
//! workers' outcomes into the commit is a function of them ([`gather`]).
//!
//! The planner groups records by a number per key, never by its hash: each
//! distinct key of the batch (its canonical bytes) gets its own, so two
//! keys never share a run, a fold, a state scope or a retry diversion.
//!
//! Rules kept here:
//! - **A key's timed events reach its handler in event-time order.** The
//!   records of a released batch come in event-time order; as they become
//!   the planner's records, a change of timed type within a key is made a
//!   fence ([`wakuwaku_core::time_order`]): the first record of a
//!   [`EventTiming::Timed`] type after one of another such type is planned
//!   as `AcqRel`, so the planner, which keeps only the orders the ordering
//!   page requires, cannot put the two types in two body runs. Untimed
//!   types, and timed types declared `timed-relaxed` (the module's
//!   opt-out), are planned as they declare. Records taken from retry are
//!   fenced the same way (they come in the order they were executed).
//! - **The fence is the planner's alone.** A record keeps its declared
//!   ordering everywhere else: in its run's headers when it goes to retry
//!   or the dead-letter topic, and in its tries.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use super::call_time::CallTime;
use super::failure::Tries;
use super::key::{KeyRunner, WorkerOutcome};
use super::phase::{Laps, Phase};
use super::projection_names::ProjectionNames;
use super::release_marks::ReleasedMarks;
use super::timer_clock::{BatchClock, SoloClock};
use super::work::{BatchBuffers, BatchInput, BatchWork, RetrySlice};
use super::{ConsumerConfig, ConsumerError, Summary, release_marks};
use crate::engine::metrics::{BatchTally, Metrics};
use crate::engine::projection::{ModuleSet, Projection};
use crate::engine::routing::{self, RetryQueue, Routed, RoutedTopics};
use crate::event::{Envelope, EventTiming, HeaderError};
use crate::key::Key;
use crate::reduce::Origin;
use crate::sandbox::handler::{BatchBudget, BatchCounters, ContractError, CounterQuota, KeyOutcome, TimerQuota};
use crate::storage::log::{PolledBatch, RecordView, StoredRecord};
use crate::storage::state::TimerWrite;
use crate::storage::state::{BatchCommit, StateError, StateReader, StateStore};
use wakuwaku_core::release::Checkpoint;
use wakuwaku_core::timers::Place;

/// What the partition commits with a batch of released events.
pub(super) struct ReleasedProgress {
    /// The projection's topics, one per input of the checkpoint.
    pub(super) topics: Vec<String>,
    /// The stage's checkpoint once the batch is applied.
    pub(super) checkpoint: Checkpoint,
    /// Late events among the batch (and since the last commit).
    pub(super) violations: u64,
    /// The events of the batch whose event time is too far ahead of their
    /// append time, by (input, offset): the batch dead-letters each with
    /// its reason.
    pub(super) refused: HashMap<(u32, u64), String>,
    /// The events of the batch released late, by (input, offset): they
    /// hold no timer back ([`wakuwaku_core::timers::Place::Anywhere`]).
    pub(super) late: HashSet<(u32, u64)>,
}

/// How a batch moves the partition on.
pub(super) enum Advance {
    /// A batch polled from the one topic: the next offset.
    Topic(u64),
    /// A batch of released events over several topics.
    Released(ReleasedProgress),
    /// A batch polled from the one topic of a projection whose release
    /// stage released events above its position (cut from several
    /// topics): the next offset, and the marks, written again clipped at
    /// it.
    PastReleased(u64, Arc<ReleasedMarks>),
}

impl Advance {
    /// The next offset of the one topic, for a batch polled from it.
    pub(super) fn next_offset(&self) -> Option<u64> {
        match self {
            Advance::Topic(next) | Advance::PastReleased(next, _) => Some(*next),
            Advance::Released(_) => None,
        }
    }
}

/// Why a polled message is dead-lettered before it is planned.
enum Unreadable {
    /// Its headers cannot be read.
    Headers(HeaderError),
    /// Its type declares event time and it carries none.
    Declared(ContractError),
    /// Its event time is too far ahead of its append time: the release
    /// stage refused it, for this reason.
    TooFarAhead(String),
}

/// What runs a partition's batches, from records to the commit they make:
/// the batch's part of a [`Consumer`](super::Consumer), without its log or
/// its store. [`BatchRunner::polled`] and [`BatchRunner::retried`] take
/// records and a way to read the batch's state, and give back the
/// [`Finished`] batch whose [`BatchCommit`] the store is then handed
/// ([`BatchRunner::commit`]); nothing between reads a log, and a batch of
/// one worker runs on the calling thread, so a unit test runs one as a
/// value.
#[derive(Clone)]
pub(super) struct BatchRunner {
    /// What runs each worker's keys ([`KeyRunner`]): the projection's
    /// names, the settings, the observer and the batch's trace.
    pub(super) keys: KeyRunner,
    pub(super) metrics: Option<Arc<Metrics>>,
    /// What the batches in flight (one per partition) may make the host
    /// hold, together.
    pub(super) budget: BatchBudget,
    /// The counters the batches in flight add, against the projection's
    /// quota (`counter-count`).
    pub(super) counters: CounterQuota,
    /// On the clone a batch runs on: the clock its timers fire by, and
    /// for a projection of one topic the clock to commit with it.
    pub(super) clock: BatchClock,
    pub(super) solo: Option<SoloClock>,
    /// On the clone a batch runs on: keys without records in it whose
    /// timers are due ([`StateStore::due_timers`]).
    pub(super) due: Vec<Key>,
}

/// The most keys with only due timers one batch takes; the others fire in
/// the batches after it.
pub(super) const DUE_KEYS_PER_BATCH: usize = 4096;

impl BatchRunner {
    /// The runner of `projection`'s batches under `config`.
    pub(super) fn new(projection: &Projection, config: &ConsumerConfig) -> Self {
        Self {
            keys: KeyRunner::new(Arc::new(ProjectionNames::of(projection)), config.clone()),
            metrics: None,
            budget: BatchBudget::new(&config.payload),
            counters: CounterQuota::new(&config.payload),
            clock: BatchClock::default(),
            solo: None,
            due: Vec::new(),
        }
    }

    /// Records what every committed batch did in `metrics`, each call's
    /// time among it.
    pub(super) fn record_in(&mut self, metrics: Arc<Metrics>) {
        self.metrics = Some(metrics);
        self.keys.times_calls = true;
    }

    /// Plans, executes and commits one batch polled from the topic (or
    /// released by the release stage, in release order) with `modules`,
    /// moving the partition on by `advance` in the same commit. Runs on a
    /// blocking thread.
    pub(super) fn process_batch(
        &self,
        partition: u32,
        (records, advance): (&PolledBatch, &Advance),
        queue: &RetryQueue,
        buffers: &mut BatchBuffers,
        modules: Arc<ModuleSet>,
        store: &StateStore,
    ) -> Result<Summary, ConsumerError> {
        let read = |keys: &[Key]| store.batch_reader(partition, keys);
        let mut runner = self.clone();
        let (due, complete) = runner.due_keys(partition, store, queue)?;
        // The store is asked for the timers of no other key of the batch
        // than these, unless the list is cut short.
        runner.keys.due = complete.then(|| Arc::new(due.iter().cloned().collect()));
        runner.due = due;
        let finished = runner.polled(partition, (records, advance), queue, buffers, modules, read)?;
        Ok(self.commit(finished, store)?.0)
    }

    /// The keys of `partition` whose timers are due under the batch's
    /// clock, but for those waiting in retry (their timers wait with them):
    /// at most [`DUE_KEYS_PER_BATCH`], earliest first; and whether that is
    /// all of them.
    fn due_keys(&self, partition: u32, store: &StateStore, queue: &RetryQueue) -> Result<(Vec<Key>, bool), StateError> {
        let Some(clock) = self.clock.clock else { return Ok((Vec::new(), true)) };
        let due = store.due_timers(partition, clock, DUE_KEYS_PER_BATCH)?;
        let complete = due.len() < DUE_KEYS_PER_BATCH;
        Ok((due.into_iter().map(|(key, _)| key).filter(|key| !queue.holds(key)).collect(), complete))
    }

    /// Plans, executes and commits records taken from the retry topic, each
    /// key's in execution order; `next_waiting` names the first record of
    /// each key whose others still wait. Returns the retry offsets of the
    /// records it left where they wait. Runs on a blocking thread.
    pub(super) fn process_retry_batch(
        &self,
        partition: u32,
        records: Vec<StoredRecord>,
        (next_waiting, retry_position): (HashMap<Key, u64>, u64),
        modules: Arc<ModuleSet>,
        store: &StateStore,
    ) -> Result<(Summary, Vec<u64>), ConsumerError> {
        let read = |keys: &[Key]| store.batch_reader(partition, keys);
        let finished = self.retried(partition, records, (next_waiting, retry_position), modules, read)?;
        self.commit(finished, store)
    }

    /// Runs one batch polled from the topic (or released) to the commit it
    /// makes, not committed: its records parsed into the planner's input
    /// (keys in retry diverted behind them, unreadable headers
    /// dead-lettered), then [`BatchRunner::execute_batch`]. `read` gives
    /// the snapshot of the batch's keys.
    pub(super) fn polled(
        &self,
        partition: u32,
        (records, advance): (&PolledBatch, &Advance),
        queue: &RetryQueue,
        buffers: &mut BatchBuffers,
        modules: Arc<ModuleSet>,
        read: impl FnOnce(&[Key]) -> Result<StateReader, StateError>,
    ) -> Result<Finished, ConsumerError> {
        let projection = &*self.keys.projection;
        let decoding = Instant::now();
        let mut summary = Summary { batches: 1, consumed: records.len() as u64, ..Summary::default() };
        let mut commit = BatchCommit::default();
        let mut tally = BatchTally::default();
        buffers.input.clear();
        let now = crate::platform::clock::now_ms();
        let refused = match advance {
            Advance::Released(progress) => Some(&progress.refused).filter(|refused| !refused.is_empty()),
            Advance::Topic(_) | Advance::PastReleased(..) => None,
        };
        for view in records.iter() {
            let refusal = refused.and_then(|refused| refused.get(&(view.input(), view.offset())));
            self.take_polled(
                partition,
                view,
                (queue, &modules, now, refusal.map(String::as_str)),
                &mut buffers.input,
                (&mut commit, &mut summary, &mut tally),
            );
        }
        if let Some(solo) = &self.solo {
            solo.add_to_commit(&mut commit, partition);
        }
        match advance {
            Advance::Topic(next) => commit.positions.push((projection.topic().to_owned(), partition, *next)),
            Advance::PastReleased(next, marks) => {
                commit.positions.push((projection.topic().to_owned(), partition, *next));
                marks.add_to_commit(&mut commit, projection.topic(), partition, *next);
            }
            Advance::Released(progress) => {
                release_marks::add_to_commit(&mut commit, &progress.topics, partition, &progress.checkpoint);
                summary.order_violations += progress.violations;
            }
        }
        // What the retry topic holds below the queue's position is done or
        // not this projection's: a restart need not read it again.
        commit.positions.push((projection.routed_topics().retry().to_owned(), partition, queue.position()));
        summary.phases.add(Phase::Decode, decoding.elapsed());
        self.execute_batch(partition, modules, buffers, (summary, commit, tally), read)
    }

    /// Takes one polled record into the batch: into `input` for the
    /// planner, or, behind its key's retry or unreadable, into the commit's
    /// outbox as a retry or dead-letter record.
    fn take_polled(
        &self,
        partition: u32,
        view: RecordView<'_>,
        (queue, modules, now, refusal): (&RetryQueue, &ModuleSet, u64, Option<&str>),
        input: &mut BatchInput,
        (commit, summary, tally): (&mut BatchCommit, &mut Summary, &mut BatchTally),
    ) {
        let projection = &*self.keys.projection;
        // The topic it was read from (a released batch gathers several).
        let topic = self.keys.projection.topic_name(view.input());
        // Unreadable headers, or a timed type's message without its
        // event time (`event-time-declared`), are dead-lettered.
        let parsed = refusal
            .map_or(Ok(()), |reason| Err(Unreadable::TooFarAhead(reason.to_owned())))
            .and_then(|()| Envelope::parse(view.headers()).map_err(Unreadable::Headers))
            .and_then(|envelope| {
                let number = input.keys.number(envelope.key).map_err(|error| Unreadable::Headers(error.into()))?;
                Ok((number, envelope))
            })
            .and_then(|(number, mut envelope)| {
                envelope.event_time =
                    modules.event_time(envelope.tag, envelope.event_time).map_err(Unreadable::Declared)?;
                Ok((number, envelope))
            });
        match parsed {
            Ok((number, envelope)) if queue.holds(input.keys.key(number)) => {
                // Behind its key's retry, so its order is kept.
                let headers = envelope.with_key(input.keys.key(number).clone());
                let routed = Routed {
                    projection: projection.name().to_owned(),
                    topic: topic.to_owned(),
                    event_type: modules.route(headers.tag).map(|r| r.event_type.name.clone()).unwrap_or_default(),
                    origin_partition: partition,
                    origin_offset: view.offset(),
                    events: 1,
                    attempts: 0,
                    failed_at_ms: now,
                    first_failed_at_ms: None,
                    failure: None,
                    ahead_of: None,
                    ordering: Some(headers.ordering),
                };
                let record = routing::routed_record(&headers, &routed, view.body().to_vec());
                commit.outbox.push(self.keys.projection.routed_entry(
                    RoutedTopics::retry,
                    partition,
                    headers.key.key_hash(),
                    record,
                ));
                summary.retry_in += 1;
                if let Some(route) = modules.route(headers.tag) {
                    tally.of(route.module, headers.tag).counts.retry_in += 1;
                }
            }
            Ok((number, envelope)) => {
                let tries = Tries::fresh(envelope.ordering);
                let origin = Origin::in_topic(view.input(), view.offset());
                let timing = modules.timing(envelope.tag);
                // A timed event read in its place holds later timers back;
                // a late one, or one without a place in time, none.
                let place = match (timing, envelope.event_time) {
                    (EventTiming::Timed, Some(time)) if !self.clock.late.contains(&(view.input(), view.offset())) => {
                        Place::At(time)
                    }
                    _ => Place::Anywhere,
                };
                input.push_placed(number, (envelope, timing), (origin, place), tries, view.body().to_vec());
            }
            Err(error) => {
                let stored = StoredRecord { offset: view.offset(), record: view.to_record(), append_time: None };
                let (reason, what) = match error {
                    Unreadable::Headers(error) => {
                        (routing::malformed_reason(&stored.record, &error), "unreadable headers")
                    }
                    Unreadable::Declared(error) => (error.to_string(), "unreadable headers"),
                    Unreadable::TooFarAhead(reason) => (reason, "an event time too far ahead"),
                };
                tracing::warn!(
                    projection = projection.name(),
                    topic,
                    partition,
                    offset = view.offset(),
                    "message has {what} and goes to the dead-letter topic: {reason}"
                );
                let record = routing::malformed_record(projection.name(), topic, partition, stored, reason);
                commit.outbox.push(self.keys.projection.routed_entry(RoutedTopics::dlq, partition, 0, record));
                summary.malformed += 1;
                summary.dead_lettered += 1;
            }
        }
    }

    /// Runs records taken from the retry topic to the commit they make, not
    /// committed (see [`BatchRunner::process_retry_batch`]).
    pub(super) fn retried(
        &self,
        partition: u32,
        records: Vec<StoredRecord>,
        (next_waiting, retry_position): (HashMap<Key, u64>, u64),
        modules: Arc<ModuleSet>,
        read: impl FnOnce(&[Key]) -> Result<StateReader, StateError>,
    ) -> Result<Finished, ConsumerError> {
        let decoding = Instant::now();
        let projection = &*self.keys.projection;
        let retry = projection.routed_topics().retry().to_owned();
        let mut summary = Summary { batches: 1, ..Summary::default() };
        let mut commit = BatchCommit::default();
        let mut buffers = BatchBuffers::default();
        let input = &mut buffers.input;
        let mut offsets = Vec::with_capacity(records.len());
        for stored in records {
            let parsed = Routed::parse(&stored.record.headers).and_then(|routed| {
                let envelope = Envelope::parse_stored(&stored.record.headers)?;
                Ok((routed, input.keys.number(envelope.key).map_err(HeaderError::from)?, envelope))
            });
            match parsed {
                Ok((routed, number, envelope)) => {
                    offsets.push(stored.offset);
                    let origin = routing::origin_of(&routed, projection.topics());
                    let timing = modules.timing(envelope.tag);
                    input.push(number, (envelope, timing), origin, Tries::of(&routed), stored.record.body);
                }
                Err(error) => {
                    // It was readable when it was indexed: the log changed
                    // under the host. Keep it, with the reason.
                    commit.done.push((retry.clone(), partition, stored.offset));
                    let reason = routing::malformed_reason(&stored.record, &error);
                    let record =
                        routing::malformed_record(projection.name(), projection.topic(), partition, stored, reason);
                    commit.outbox.push(self.keys.projection.routed_entry(RoutedTopics::dlq, partition, 0, record));
                    summary.retry_out += 1;
                    summary.dead_lettered += 1;
                }
            }
        }
        summary.phases.add(Phase::Decode, decoding.elapsed());
        buffers.work.retry = Some(RetrySlice { offsets, next_waiting, position: retry_position });
        self.execute_batch(partition, modules, &mut buffers, (summary, commit, BatchTally::default()), read)
    }

    /// Plans `input`, executes it across workers and gathers their
    /// outcomes into one commit together with what `commit` already holds,
    /// not committed ([`gather`]). `read` gives the snapshot of the
    /// batch's keys.
    fn execute_batch(
        &self,
        partition: u32,
        modules: Arc<ModuleSet>,
        buffers: &mut BatchBuffers,
        (mut summary, commit, tally): (Summary, BatchCommit, BatchTally),
        read: impl FnOnce(&[Key]) -> Result<StateReader, StateError>,
    ) -> Result<Finished, ConsumerError> {
        let mut laps = Laps::start();
        let BatchBuffers { input, plan, work } = buffers;
        plan.rebuild(&input.plan);
        work.lay_out(plan, input);
        work.add_timer_keys(self.due.iter().cloned());
        // Drawn before the snapshot is taken, so it knows which of the
        // counters other batches added the snapshot surely holds.
        let counters = self.counters.batch();
        // Every entry of the batch's keys is read here, before the calls,
        // so no call waits for the store ([`crate::storage::state::cache`]).
        let snapshot = match self.due.is_empty() {
            true => Arc::new(read(input.keys.keys())?),
            false => {
                let known: HashSet<&Key> = input.keys.keys().iter().collect();
                let only_due = self.due.iter().filter(|key| !known.contains(key)).cloned().collect::<Vec<_>>();
                let mut keys = input.keys.keys().to_vec();
                keys.extend(only_due);
                Arc::new(read(&keys)?)
            }
        };
        laps.lap(&mut summary.phases, Phase::Plan);
        if let Some(trace) = &self.keys.trace {
            trace.set_keys(input.keys.keys().len());
        }
        // Held until the commit is done: what the batch holds counts
        // against the budget every partition in flight shares.
        let budget = self.budget.batch();
        let call_time = CallTime::new(self.keys.config.module_time_per_batch, modules.modules().len());
        let outcomes = self.execute(partition, work, &snapshot, (&budget, &counters, &call_time), &modules)?;
        drop(snapshot);
        // The bodies are freed here, by the thread that allocated them.
        work.clear();
        // The workers time their own reduce and calls phases.
        let laps = Laps::start();
        let routed = self.keys.projection.routed_topics();
        let gathered = gather(partition, outcomes, (&work.retry, &input.origins), routed, (summary, commit, tally))?;
        let (commit, summary, left, tally) = gathered;
        Ok(Finished { commit, summary, left, tally, modules, counters, budget, laps })
    }

    /// Commits a finished batch to `store`, then reports it. Returns its
    /// summary and the retry offsets of the records it left where they
    /// wait.
    pub(super) fn commit(&self, finished: Finished, store: &StateStore) -> Result<(Summary, Vec<u64>), ConsumerError> {
        let Finished { commit, mut summary, left, tally, modules, counters, budget, mut laps } = finished;
        store.commit(commit)?;
        counters.committed();
        drop(budget);
        laps.lap(&mut summary.phases, Phase::Commit);
        if let Some(metrics) = &self.metrics {
            metrics.record(self.keys.projection.name(), &modules, &tally, summary.skipped, summary.malformed);
        }
        Ok((summary, left))
    }

    /// Runs every worker's keys: on its own thread each when there are
    /// several, on this one when there is one. A worker that panics fails
    /// the batch ([`ConsumerError::WorkerPanicked`]) either way.
    fn execute(
        &self,
        partition: u32,
        work: &BatchWork,
        snapshot: &Arc<StateReader>,
        (budget, counters, call_time): (&BatchBudget, &BatchCounters, &CallTime),
        modules: &ModuleSet,
    ) -> Result<Vec<WorkerOutcome>, ConsumerError> {
        let workers = work.workers(self.keys.config.workers);
        let timers = TimerQuota::new(&self.keys.config.payload);
        let run = |worker| {
            let shares = (budget, counters, &timers);
            self.keys.run_worker(partition, work, (worker, workers), snapshot, shares, call_time, modules)
        };
        if workers == 1 {
            // What a spawned worker's join would catch. Nothing outlives
            // the unwind but what the batch drops on failing.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(0)));
            return outcome.map(|outcome| vec![outcome]).map_err(|panic| panicked(&*panic));
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers).map(|worker| scope.spawn(move || run(worker))).collect();
            handles.into_iter().map(|handle| handle.join().map_err(|panic| panicked(&*panic))).collect()
        })
    }
}

/// A batch run to the commit it makes, not yet committed: the commit, and
/// what follows it ([`BatchRunner::commit`]).
pub(super) struct Finished {
    /// What the store commits in one transaction.
    pub(super) commit: BatchCommit,
    pub(super) summary: Summary,
    /// The retry offsets of the records a batch taken from the retry topic
    /// left where they wait.
    pub(super) left: Vec<u64>,
    tally: BatchTally,
    modules: Arc<ModuleSet>,
    /// Held until the commit is done: the counters the batch adds, what it
    /// holds of the budget.
    counters: BatchCounters,
    budget: BatchBudget,
    /// Timing the commit phase since the workers ended.
    laps: Laps,
}

/// Gathers the workers' `outcomes` into `commit`: their writes, counter
/// changes, timers (each changed key's, as the partition's) and outbox,
/// and, for a batch taken from the retry topic
/// (`retry`, its input's `origins`), the records done and the retry
/// position. A host fault fails the batch: nothing of it is committed, and
/// the partition tries it again after a backoff. Returns the commit, the
/// summary, the retry offsets left where they wait and the tally.
fn gather(
    partition: u32,
    outcomes: Vec<WorkerOutcome>,
    (retry, origins): (&Option<RetrySlice>, &[Origin]),
    routed: &RoutedTopics,
    (mut summary, mut commit, mut tally): (Summary, BatchCommit, BatchTally),
) -> Result<(BatchCommit, Summary, Vec<u64>, BatchTally), ConsumerError> {
    // A host fault (the state store failed under a call) is not the
    // module's doing.
    if let Some(fault) = outcomes.iter().find_map(|outcome| outcome.host_fault.clone()) {
        return Err(ConsumerError::HostFault(fault));
    }
    let mut left = Vec::new();
    for outcome in outcomes {
        summary.add(&outcome.summary);
        tally.absorb(outcome.tally);
        left.extend(outcome.left);
        for (key, KeyOutcome { writes, counters, outbox, timers }) in outcome.keys {
            if let Some(timers) = timers {
                commit.timers.push(TimerWrite { key: key.clone(), partition, timers: timers.in_order() });
            }
            if !writes.is_empty() {
                commit.writes.push((key, writes));
            }
            for (name, delta) in counters {
                *commit.counter_deltas.entry(name).or_default() += delta;
            }
            commit.outbox.extend(outbox);
        }
        commit.outbox.extend(outcome.routed);
    }
    if let Some(slice) = retry {
        let retry = routed.retry();
        let stays: HashSet<u64> = left.iter().copied().collect();
        for (index, &offset) in slice.offsets.iter().enumerate().filter(|(_, offset)| !stays.contains(offset)) {
            commit.done.push((retry.to_owned(), partition, offset));
            summary.retry_out += origins[index].events;
        }
        let position = left.iter().copied().fold(slice.position, u64::min);
        commit.positions.push((retry.to_owned(), partition, position));
    }
    commit.stat_deltas = summary.stat_deltas();
    Ok((commit, summary, left, tally))
}

/// The message of a worker's panic.
fn panicked(panic: &(dyn std::any::Any + Send)) -> ConsumerError {
    let message = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default();
    ConsumerError::WorkerPanicked(message)
}

#[cfg(test)]
mod tests;
