//! One batch, from records to a commit: headers parsed into the planner's
//! input (keys in retry diverted behind them, unreadable headers
//! dead-lettered), the plan split over the partition's workers, their
//! outcomes gathered into one [`BatchCommit`] with the position, and that
//! committed in one transaction.
//!
//! The planner groups records by a number per key, never by its hash: each
//! distinct key of the batch (its canonical bytes) gets its own, so two
//! keys never share a run, a fold, a state scope or a retry diversion.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::key::{KeyWork, RunWork, WorkerOutcome};
use super::phase::{Laps, Phase};
use super::{Consumer, ConsumerError, Summary};
use crate::event::{Algebra, EventHeaders};
use crate::handler::{BatchBudget, KeyOutcome};
use crate::key::Key;
use crate::log::{EventLog, PolledBatch, StoredRecord};
use crate::metrics::BatchTally;
use crate::plan::{Plan, PlanRecord, Stage};
use crate::projection::ModuleSet;
use crate::reduce::Origin;
use crate::routing::{self, RetryQueue, Routed, RoutedTopics};
use crate::state::{BatchCommit, StateReader};

impl<L: EventLog> Consumer<L> {
    /// Plans, executes and commits one batch polled from the topic. Runs on
    /// a blocking thread.
    pub(super) fn process_batch(
        &self,
        partition: u32,
        records: &PolledBatch,
        next: u64,
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
            match EventHeaders::parse(view.headers()) {
                Ok(headers) if queue.holds(&headers.key) => {
                    // Behind its key's retry, so its order is kept.
                    let routed = Routed {
                        projection: projection.name().to_owned(),
                        origin_partition: partition,
                        origin_offset: view.offset(),
                        events: 1,
                        attempts: 0,
                        failed_at_ms: now,
                        failure: None,
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
                Ok(headers) => input.push(headers, Origin::single(view.offset()), 0, view.body().to_vec()),
                Err(error) => {
                    tracing::warn!(
                        projection = projection.name(),
                        partition,
                        offset = view.offset(),
                        "message has unreadable headers and goes to the dead-letter topic: {error}"
                    );
                    let stored = StoredRecord { offset: view.offset(), record: view.to_record() };
                    let record = routing::malformed_record(projection.name(), partition, stored, &error);
                    commit.outbox.push(self.routed_entry(RoutedTopics::dlq, partition, 0, record));
                    summary.malformed += 1;
                    summary.dead_lettered += 1;
                }
            }
        }
        commit.positions.push((projection.topic().to_owned(), partition, next));
        summary.phases.add(Phase::Decode, decoding.elapsed());
        self.execute_and_commit(partition, &modules, buffers, summary, commit, tally)
    }

    /// Plans, executes and commits records taken from the retry topic. Runs
    /// on a blocking thread.
    pub(super) fn process_retry_batch(
        &self,
        partition: u32,
        records: Vec<StoredRecord>,
        retry_position: u64,
    ) -> Result<Summary, ConsumerError> {
        let decoding = Instant::now();
        let projection = &*self.projection;
        let retry = projection.routed_topics().retry().to_owned();
        let mut summary = Summary { batches: 1, ..Summary::default() };
        let mut commit = BatchCommit::default();
        let mut buffers = BatchBuffers::default();
        let input = &mut buffers.input;
        for stored in records {
            commit.done.push((retry.clone(), partition, stored.offset));
            let parsed = Routed::parse(&stored.record.headers)
                .and_then(|routed| Ok((routed, EventHeaders::parse_stored(&stored.record.headers)?)));
            match parsed {
                Ok((routed, headers)) => {
                    summary.retry_out += routed.events;
                    input.push(headers, routing::origin_of(&routed), routed.attempts, stored.record.body);
                }
                Err(error) => {
                    // It was readable when it was indexed: the log changed
                    // under the host. Keep it, with the reason.
                    let record = routing::malformed_record(projection.name(), partition, stored, &error);
                    commit.outbox.push(self.routed_entry(RoutedTopics::dlq, partition, 0, record));
                    summary.retry_out += 1;
                    summary.dead_lettered += 1;
                }
            }
        }
        commit.positions.push((retry, partition, retry_position));
        summary.phases.add(Phase::Decode, decoding.elapsed());
        self.execute_and_commit(partition, &projection.current(), &mut buffers, summary, commit, BatchTally::default())
    }

    /// Plans `input`, executes it across workers and commits everything in
    /// one transaction together with what `commit` already holds.
    fn execute_and_commit(
        &self,
        partition: u32,
        modules: &ModuleSet,
        buffers: &mut BatchBuffers,
        mut summary: Summary,
        mut commit: BatchCommit,
        mut tally: BatchTally,
    ) -> Result<Summary, ConsumerError> {
        let store = self.projection.store();
        let mut laps = Laps::start();
        let BatchBuffers { input, plan } = buffers;
        plan.rebuild(&input.plan);
        let work = split_work(plan, input, self.config.workers.max(1));
        laps.lap(&mut summary.phases, Phase::Plan);
        let snapshot = Arc::new(store.reader()?);
        // Held until the commit is done: what the batch holds counts
        // against the budget every partition in flight shares.
        let budget = self.budget.batch();
        let outcomes = self.execute(partition, work, &snapshot, &budget, modules)?;
        drop(snapshot);
        // The workers time their own reduce and calls phases.
        let mut laps = Laps::start();
        // A host fault (the state store failed under a call) is not the
        // module's doing: nothing of the batch is committed, and the
        // partition tries it again after a backoff.
        if let Some(fault) = outcomes.iter().find_map(|outcome| outcome.host_fault.clone()) {
            return Err(ConsumerError::HostFault(fault));
        }
        for outcome in outcomes {
            summary.add(&outcome.summary);
            tally.absorb(outcome.tally);
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
        commit.stat_deltas = summary.stat_deltas();
        store.commit(commit)?;
        laps.lap(&mut summary.phases, Phase::Commit);
        if let Some(metrics) = &self.metrics {
            metrics.record(self.projection.name(), modules, &tally, summary.skipped, summary.malformed);
        }
        Ok(summary)
    }

    /// Runs every worker's keys on its own thread.
    fn execute(
        &self,
        partition: u32,
        work: Vec<Vec<KeyWork>>,
        snapshot: &Arc<StateReader>,
        budget: &BatchBudget,
        modules: &ModuleSet,
    ) -> Result<Vec<WorkerOutcome>, ConsumerError> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = work
                .into_iter()
                .map(|keys| scope.spawn(move || self.run_worker(partition, keys, snapshot, budget, modules)))
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
    keys: Vec<Key>,
    /// Each key's number. Keys (and so their hashes) are chosen by
    /// publishers, so the table's hash is seeded per process.
    numbers: HashMap<Key, u64>,
    algebras: Vec<Algebra>,
    origins: Vec<Origin>,
    bodies: Vec<Option<Vec<u8>>>,
    /// Attempts each record has had (records taken from retry).
    attempts: Vec<u32>,
}

impl BatchInput {
    /// Empties every vector and the key table, keeping their allocations.
    fn clear(&mut self) {
        let Self { plan, keys, numbers, algebras, origins, bodies, attempts } = self;
        plan.clear();
        keys.clear();
        numbers.clear();
        algebras.clear();
        origins.clear();
        bodies.clear();
        attempts.clear();
    }

    fn push(&mut self, headers: EventHeaders, origin: Origin, attempts: u32, body: Vec<u8>) {
        let next = self.keys.len() as u64;
        let number = *self.numbers.entry(headers.key).or_insert_with_key(|key| {
            self.keys.push(key.clone());
            next
        });
        self.plan.push(PlanRecord { key: number, tag: headers.tag, ordering: headers.ordering });
        self.algebras.push(headers.algebra);
        self.origins.push(origin);
        self.attempts.push(attempts);
        self.bodies.push(Some(body));
    }
}

/// Turns the plan into per-worker lists of keys, moving each body into the
/// run that holds it. Keys go round-robin to workers in order of first
/// appearance; body runs of a segment are executed in plan order, which the
/// spec allows (they may run in any order). Stages are numbered per key in
/// execution order.
fn split_work(plan: &Plan, input: &mut BatchInput, workers: usize) -> Vec<Vec<KeyWork>> {
    let mut work: Vec<Vec<KeyWork>> = (0..workers.min(plan.keys().len()).max(1)).map(|_| Vec::new()).collect();
    let worker_count = work.len();
    for (index, key) in plan.keys().iter().enumerate() {
        let mut runs = Vec::new();
        let mut stage_index = 0;
        for segment in plan.segments(key) {
            for stage in plan.stages(segment) {
                let stage_runs = match stage {
                    Stage::Head(run) | Stage::Tail(run) => std::slice::from_ref(run),
                    Stage::Body(body) => body,
                };
                for run in stage_runs {
                    let records = plan.records(run);
                    let first = records[0];
                    runs.push(RunWork {
                        tag: run.tag(),
                        stage: stage_index,
                        ordering: input.plan[first].ordering,
                        algebra: input.algebras[first],
                        origins: records.iter().map(|&i| input.origins[i]).collect(),
                        attempts: records.iter().map(|&i| input.attempts[i]).collect(),
                        bodies: records.iter().map(|&i| input.bodies[i].take().unwrap_or_default()).collect(),
                    });
                }
                stage_index += 1;
            }
        }
        // The planner's key is the number `BatchInput::push` gave the key.
        let key = input.keys[key.key_hash() as usize].clone();
        work[index % worker_count].push(KeyWork { key, runs });
    }
    work
}
