//! One batch, from records to a commit: headers parsed into the planner's
//! input (keys in retry diverted behind them, unreadable headers
//! dead-lettered), the plan split over the partition's workers, their
//! outcomes gathered into one [`BatchCommit`] with the position, and that
//! committed in one transaction.
//!
//! The planner groups records by a number per key, never by its hash: each
//! distinct key of the batch (its canonical bytes) gets its own, so two
//! keys never share a run, a fold, a state scope or a retry diversion.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use super::call_time::CallTime;
use super::failure::Tries;
use super::key::{KeyWork, RunWork, WorkerOutcome};
use super::key_table::KeyTable;
use super::phase::{Laps, Phase};
use super::timing::Advance;
use super::{Consumer, ConsumerError, Summary, release_marks};
use crate::event::{Algebra, Envelope, HeaderError};
use crate::handler::{BatchBudget, BatchCounters, ContractError, KeyOutcome};
use crate::key::Key;
use crate::log::{EventLog, PolledBatch, StoredRecord};
use crate::metrics::BatchTally;
use crate::plan::{Plan, PlanRecord, Stage};
use crate::projection::ModuleSet;
use crate::reduce::Origin;
use crate::routing::{self, RetryQueue, Routed, RoutedTopics};
use crate::state::{BatchCommit, StateReader};

/// Why a polled message is dead-lettered before it is planned.
enum Unreadable {
    /// Its headers cannot be read.
    Headers(HeaderError),
    /// Its type declares event time and it carries none.
    Declared(ContractError),
}

impl<L: EventLog> Consumer<L> {
    /// Plans, executes and commits one batch polled from the topic (or
    /// released by the release stage, in release order), moving the
    /// partition on by `advance` in the same commit. Runs on a blocking
    /// thread.
    pub(super) fn process_batch(
        &self,
        partition: u32,
        records: &PolledBatch,
        advance: &Advance,
        queue: &RetryQueue,
        buffers: &mut BatchBuffers,
    ) -> Result<Summary, ConsumerError> {
        let projection = &*self.projection;
        // The modules of this batch, whatever is swapped in meanwhile.
        let decoding = Instant::now();
        let modules = projection.current();
        let mut summary = Summary { batches: 1, consumed: records.len() as u64, ..Summary::default() };
        let mut commit = BatchCommit::default();
        let mut tally = BatchTally::default();
        let input = &mut buffers.input;
        input.clear();
        let now = routing::now_ms();
        for view in records.iter() {
            // The topic it was read from (a released batch gathers several).
            let topic = self.topic_name(view.input());
            // Unreadable headers, or a timed type's message without its
            // event time (`event-time-declared`), are dead-lettered.
            let parsed = Envelope::parse(view.headers())
                .and_then(|envelope| Ok((input.keys.number(envelope.key)?, envelope)))
                .map_err(Unreadable::Headers)
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
                    commit.outbox.push(self.routed_entry(
                        RoutedTopics::retry,
                        partition,
                        headers.key.key_hash(),
                        record,
                    ));
                    summary.retry_in += 1;
                    if let Some(route) = modules.route(headers.tag) {
                        tally.of(route.module, headers.tag).retried += 1;
                    }
                }
                Ok((number, envelope)) => {
                    let tries = Tries::fresh(envelope.ordering);
                    let origin = Origin::in_topic(view.input(), view.offset());
                    input.push(number, envelope, origin, tries, view.body().to_vec());
                }
                Err(error) => {
                    let stored = StoredRecord { offset: view.offset(), record: view.to_record() };
                    let reason = match error {
                        Unreadable::Headers(error) => routing::malformed_reason(&stored.record, &error),
                        Unreadable::Declared(error) => error.to_string(),
                    };
                    tracing::warn!(
                        projection = projection.name(),
                        topic,
                        partition,
                        offset = view.offset(),
                        "message has unreadable headers and goes to the dead-letter topic: {reason}"
                    );
                    let record = routing::malformed_record(projection.name(), topic, partition, stored, reason);
                    commit.outbox.push(self.routed_entry(RoutedTopics::dlq, partition, 0, record));
                    summary.malformed += 1;
                    summary.dead_lettered += 1;
                }
            }
        }
        match advance {
            Advance::Topic(next) => commit.positions.push((projection.topic().to_owned(), partition, *next)),
            Advance::Released(progress) => {
                release_marks::add_to_commit(&mut commit, &progress.topics, partition, &progress.checkpoint);
                summary.order_violations += progress.violations;
            }
        }
        // What the retry topic holds below the queue's position is done or
        // not this projection's: a restart need not read it again.
        commit.positions.push((projection.routed_topics().retry().to_owned(), partition, queue.position()));
        summary.phases.add(Phase::Decode, decoding.elapsed());
        let (summary, _) = self.execute_and_commit(partition, &modules, buffers, summary, commit, tally)?;
        Ok(summary)
    }

    /// Plans, executes and commits records taken from the retry topic, each
    /// key's in execution order; `next_waiting` names the first record of
    /// each key whose others still wait. Returns the retry offsets of the
    /// records it left where they wait. Runs on a blocking thread.
    pub(super) fn process_retry_batch(
        &self,
        partition: u32,
        records: Vec<StoredRecord>,
        next_waiting: HashMap<Key, u64>,
        retry_position: u64,
    ) -> Result<(Summary, Vec<u64>), ConsumerError> {
        let decoding = Instant::now();
        let projection = &*self.projection;
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
                    input.push(number, envelope, origin, Tries::of(&routed), stored.record.body);
                }
                Err(error) => {
                    // It was readable when it was indexed: the log changed
                    // under the host. Keep it, with the reason.
                    commit.done.push((retry.clone(), partition, stored.offset));
                    let reason = routing::malformed_reason(&stored.record, &error);
                    let record =
                        routing::malformed_record(projection.name(), projection.topic(), partition, stored, reason);
                    commit.outbox.push(self.routed_entry(RoutedTopics::dlq, partition, 0, record));
                    summary.retry_out += 1;
                    summary.dead_lettered += 1;
                }
            }
        }
        summary.phases.add(Phase::Decode, decoding.elapsed());
        buffers.work.retry = Some(RetrySlice { offsets, next_waiting, position: retry_position });
        self.execute_and_commit(partition, &projection.current(), &mut buffers, summary, commit, BatchTally::default())
    }

    /// Plans `input`, executes it across workers and commits everything in
    /// one transaction together with what `commit` already holds. For a
    /// batch taken from the retry topic, the records it did not leave where
    /// they wait are committed as done, and the offsets of those it left
    /// are returned.
    fn execute_and_commit(
        &self,
        partition: u32,
        modules: &ModuleSet,
        buffers: &mut BatchBuffers,
        mut summary: Summary,
        mut commit: BatchCommit,
        mut tally: BatchTally,
    ) -> Result<(Summary, Vec<u64>), ConsumerError> {
        let store = self.projection.store();
        let mut laps = Laps::start();
        let BatchBuffers { input, plan, work } = buffers;
        plan.rebuild(&input.plan);
        work.lay_out(plan, input);
        // Drawn before the snapshot is taken, so it knows which of the
        // counters other batches added the snapshot surely holds.
        let counters = self.counters.batch();
        // Every entry of the batch's keys is read here, before the calls,
        // so no call waits for the store ([`crate::state::cache`]).
        let snapshot = Arc::new(store.batch_reader(partition, input.keys.keys())?);
        laps.lap(&mut summary.phases, Phase::Plan);
        if let Some(trace) = &self.trace {
            trace.set_keys(input.keys.keys().len());
        }
        // Held until the commit is done: what the batch holds counts
        // against the budget every partition in flight shares.
        let budget = self.budget.batch();
        let call_time = CallTime::new(self.config.module_time_per_batch, modules.modules().len());
        let outcomes = self.execute(partition, work, &snapshot, (&budget, &counters, &call_time), modules)?;
        drop(snapshot);
        // The bodies are freed here, by the thread that allocated them.
        work.clear();
        // The workers time their own reduce and calls phases.
        let mut laps = Laps::start();
        // A host fault (the state store failed under a call) is not the
        // module's doing: nothing of the batch is committed, and the
        // partition tries it again after a backoff.
        if let Some(fault) = outcomes.iter().find_map(|outcome| outcome.host_fault.clone()) {
            return Err(ConsumerError::HostFault(fault));
        }
        let mut left = Vec::new();
        for outcome in outcomes {
            summary.add(&outcome.summary);
            tally.absorb(outcome.tally);
            left.extend(outcome.left);
            for (key, KeyOutcome { writes, counters, outbox }) in outcome.keys {
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
        if let Some(slice) = &work.retry {
            let retry = self.projection.routed_topics().retry();
            let stays: HashSet<u64> = left.iter().copied().collect();
            for (index, &offset) in slice.offsets.iter().enumerate().filter(|(_, offset)| !stays.contains(offset)) {
                commit.done.push((retry.to_owned(), partition, offset));
                summary.retry_out += input.origins[index].events;
            }
            let position = left.iter().copied().fold(slice.position, u64::min);
            commit.positions.push((retry.to_owned(), partition, position));
        }
        commit.stat_deltas = summary.stat_deltas();
        store.commit(commit)?;
        counters.committed();
        laps.lap(&mut summary.phases, Phase::Commit);
        if let Some(metrics) = &self.metrics {
            metrics.record(self.projection.name(), modules, &tally, summary.skipped, summary.malformed);
        }
        Ok((summary, left))
    }

    /// Runs every worker's keys on its own thread.
    fn execute(
        &self,
        partition: u32,
        work: &BatchWork,
        snapshot: &Arc<StateReader>,
        (budget, counters, call_time): (&BatchBudget, &BatchCounters, &CallTime),
        modules: &ModuleSet,
    ) -> Result<Vec<WorkerOutcome>, ConsumerError> {
        let workers = work.workers(self.config.workers);
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|worker| {
                    scope.spawn(move || {
                        let shares = (budget, counters);
                        self.run_worker(partition, work, (worker, workers), snapshot, shares, call_time, modules)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| {
                    handle.join().map_err(|panic| {
                        let message = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                            .unwrap_or_default();
                        ConsumerError::WorkerPanicked(message)
                    })
                })
                .collect()
        })
    }
}

/// What a partition keeps from one batch to the next, so that the next
/// batch refills these vectors, maps and the plan instead of allocating
/// them again. Emptied at the start of each batch: nothing of one batch is
/// read by the next.
#[derive(Default)]
pub(super) struct BatchBuffers {
    input: BatchInput,
    plan: Plan,
    work: BatchWork,
}

/// What a batch hands the planner and the workers, index for index.
///
/// The planner groups records by a number per key: each distinct key of
/// the batch (its canonical bytes) gets its own, in order of first
/// appearance, so two keys never share one whatever their hashes.
#[derive(Default)]
struct BatchInput {
    plan: Vec<PlanRecord>,
    /// The batch's keys, by the number their records carry in `plan`.
    keys: KeyTable,
    algebras: Vec<Algebra>,
    origins: Vec<Origin>,
    bodies: Vec<Vec<u8>>,
    /// Attempts each record has had (records taken from retry).
    attempts: Vec<Tries>,
    /// Each record's event time, as its type declares it: kept in the
    /// records it goes to retry or the dead-letter topic as.
    event_times: Vec<Option<i64>>,
}

impl BatchInput {
    /// Empties every vector and the key table, keeping their allocations.
    fn clear(&mut self) {
        let Self { plan, keys, algebras, origins, bodies, attempts, event_times } = self;
        plan.clear();
        keys.clear();
        algebras.clear();
        origins.clear();
        bodies.clear();
        attempts.clear();
        event_times.clear();
    }

    /// Appends a record whose key has `number` in [`BatchInput::keys`].
    fn push(&mut self, number: u32, envelope: Envelope<'_>, origin: Origin, attempts: Tries, body: Vec<u8>) {
        self.plan.push(PlanRecord { key: u64::from(number), tag: envelope.tag, ordering: envelope.ordering });
        self.algebras.push(envelope.algebra);
        self.origins.push(origin);
        self.attempts.push(attempts);
        self.bodies.push(body);
        self.event_times.push(envelope.event_time);
    }
}

/// A batch's work as its workers read it: every planned record's body,
/// origin and attempts in execution order (key by key, run by run), each
/// key's runs and each run's records as ranges into them. Laid out once per
/// batch into vectors the partition keeps, so a batch allocates nothing per
/// key or run; the workers borrow it.
#[derive(Default)]
pub(super) struct BatchWork {
    keys: Vec<KeyWork>,
    runs: Vec<RunWork>,
    bodies: Vec<Vec<u8>>,
    origins: Vec<Origin>,
    attempts: Vec<Tries>,
    event_times: Vec<Option<i64>>,
    /// Each record's index in the batch's input.
    inputs: Vec<usize>,
    /// Where the records of a batch taken from the retry topic wait; `None`
    /// for a batch polled from the topic.
    pub(super) retry: Option<RetrySlice>,
}

/// Where the records of a batch taken from the retry topic wait, so that an
/// attempt writes again only what must go before the rest of its key and
/// leaves the rest in place ([`RetryQueue::put_back`]): an attempt costs
/// the log at most the chunk that failed, however long the key's backlog.
#[derive(Default)]
pub(super) struct RetrySlice {
    /// The retry offset of each record, by its index in the input.
    pub(super) offsets: Vec<u64>,
    /// For each key with records waiting that the batch did not take, the
    /// first of them.
    pub(super) next_waiting: HashMap<Key, u64>,
    /// The retry position once every record taken is done.
    pub(super) position: u64,
}

impl BatchWork {
    /// Lays out the plan, moving each body in from `input`. Body runs of a
    /// segment are executed in plan order, which the spec allows (they may
    /// run in any order). Stages are numbered per key in execution order.
    fn lay_out(&mut self, plan: &Plan, input: &mut BatchInput) {
        self.clear();
        for key in plan.keys() {
            let runs_start = self.runs.len();
            let mut stage_index = 0;
            for segment in plan.segments(key) {
                for stage in plan.stages(segment) {
                    let stage_runs = match stage {
                        Stage::Head(run) | Stage::Tail(run) => std::slice::from_ref(run),
                        Stage::Body(body) => body,
                    };
                    for run in stage_runs {
                        let records = plan.records(run);
                        let start = self.bodies.len();
                        for &index in records {
                            self.bodies.push(std::mem::take(&mut input.bodies[index]));
                            self.origins.push(input.origins[index]);
                            self.attempts.push(input.attempts[index]);
                            self.event_times.push(input.event_times[index]);
                            self.inputs.push(index);
                        }
                        let first = records[0];
                        self.runs.push(RunWork {
                            tag: run.tag(),
                            stage: stage_index,
                            ordering: input.plan[first].ordering,
                            algebra: input.algebras[first],
                            closes: matches!(stage, Stage::Tail(_)),
                            records: start..self.bodies.len(),
                        });
                    }
                    stage_index += 1;
                }
            }
            // The planner's key is the number `BatchInput::push` gave the key.
            let number = u32::try_from(key.key_hash()).expect("a number BatchInput::push gave");
            self.keys.push(KeyWork { key: input.keys.key(number).clone(), runs: runs_start..self.runs.len() });
        }
    }

    /// Empties it, dropping the bodies and keeping the vectors (and the
    /// retry slice, set once for the batch).
    fn clear(&mut self) {
        let Self { keys, runs, bodies, origins, attempts, event_times, inputs, retry: _ } = self;
        keys.clear();
        runs.clear();
        bodies.clear();
        origins.clear();
        attempts.clear();
        event_times.clear();
        inputs.clear();
    }

    /// How many workers share the batch: `workers`, but no more than it
    /// has keys, and at least one.
    fn workers(&self, workers: usize) -> usize {
        workers.min(self.keys.len()).max(1)
    }

    /// The keys worker `worker` of `workers` runs: keys go round-robin to
    /// workers in order of first appearance.
    pub(super) fn keys_of(&self, worker: usize, workers: usize) -> impl Iterator<Item = &KeyWork> {
        self.keys.iter().skip(worker).step_by(workers.max(1))
    }

    /// A key's runs, in execution order.
    pub(super) fn runs(&self, key: &KeyWork) -> &[RunWork] {
        &self.runs[key.runs.clone()]
    }

    /// A run's origins, bodies and attempts, index for index.
    pub(super) fn records(&self, run: &RunWork) -> (&[Origin], &[Vec<u8>], &[Tries]) {
        let records = run.records.clone();
        (&self.origins[records.clone()], &self.bodies[records.clone()], &self.attempts[records])
    }

    /// A run's records' event times, index for index with
    /// [`BatchWork::records`].
    pub(super) fn event_times(&self, run: &RunWork) -> &[Option<i64>] {
        &self.event_times[run.records.clone()]
    }

    /// A run's records' indexes in the batch's input.
    pub(super) fn inputs(&self, run: &RunWork) -> &[usize] {
        &self.inputs[run.records.clone()]
    }
}
