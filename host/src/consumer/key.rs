//! One worker's part of a batch: its keys, one after another, and for each
//! key its runs in execution order (head, body runs, tail, segment after
//! segment), so a key never races with itself.
//!
//! Each run is reduced with its type's algebra (a long associative run
//! folded in parts of at most [`COMBINE_PART_BYTES`]) and handed to the module in
//! chunks of at most `max-batch` events ([`reduce::chunks`]). A failed
//! chunk goes where [`failure::decide`] says: dead-lettered (the key goes
//! on), or sent to the retry topic with all of the key's unfinished work
//! (the key stops). A module whose calls used up their time in the batch
//! ([`CallTime`]) is not called again in it: its keys' runs fail as
//! retryable without costing an attempt. A host fault stops the worker:
//! its batch will not commit.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

/// The most bytes of bodies one `combine` call gets: a longer run is
/// folded in parts, then the parts' results, so a hot key's run never
/// outgrows the module's memory (which would fail every event of it).
const COMBINE_PART_BYTES: usize = 4 << 20;

/// The failed calls a worker logs in one batch; the rest are counted in
/// one line (a module failing every call would log every event). Also
/// the unreadable records one look at the retry topic logs.
pub(super) const FAILURES_LOGGED_PER_BATCH: usize = 32;

/// The bytes of whole failure messages the routed records of one worker's
/// batch carry (the first record of each failed chunk); past them every
/// record carries a brief message ([`Failure::brief`]), so a module
/// failing every call with a 4 KiB message costs the batch's memory and
/// the log at most this, plus 256 bytes per event.
const WHOLE_MESSAGE_BYTES_PER_BATCH: usize = 1 << 20;

use wakuwaku_core::reduce;

use super::batch::BatchWork;
use super::call_time::CallTime;
use super::failure::{self, Route, Tries};
use super::phase::{Laps, Phase};
use super::{Consumer, RunCall, Summary};
use crate::event::{Algebra, EventAtomicOrdering, EventHeaders, EventTypeTag};
use crate::handler::{
    BatchBudget, BatchCounters, CallError, ErrorClass, HandlerInstance, KeyOutcome, KeyScope, ScopeShared,
};
use crate::key::Key;
use crate::log::EventLog;
use crate::metrics::BatchTally;
use crate::projection::{Instances, ModuleSet};
use crate::reduce::{Origin, Traced, reduce_traced};
use crate::routing::{self, Failure, FailureClass, Routed, RoutedTopics};
use crate::state::{OutboxEntry, StateReader};

impl<L: EventLog> Consumer<L> {
    /// Handles the keys of worker `worker` ([`BatchWork::keys_of`]), one
    /// key after another.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_worker(
        &self,
        partition: u32,
        work: &BatchWork,
        (worker, workers): (usize, usize),
        snapshot: &Arc<StateReader>,
        (budget, counters): (&BatchBudget, &BatchCounters),
        call_time: &CallTime,
        modules: &ModuleSet,
    ) -> WorkerOutcome {
        let mut instances = modules.instances();
        let mut outcome = WorkerOutcome::default();
        let shared = Arc::new(ScopeShared {
            snapshot: snapshot.clone(),
            limits: self.config.payload,
            budget: budget.clone(),
            counters: counters.clone(),
        });
        // Everything between two reductions is charged to the calls.
        let mut laps = Laps::start();
        for key_work in work.keys_of(worker, workers) {
            if outcome.host_fault.is_some() {
                break; // the batch will not commit
            }
            let key = key_work.key.clone();
            let mut scope = KeyScope::sharing(key.clone(), &shared);
            let calls = Calls { modules, instances: &mut instances, time: call_time };
            self.run_key(partition, work, key_work, &mut scope, calls, &mut laps, &mut outcome);
            outcome.keys.push((key, scope.into_outcome()));
        }
        laps.lap(&mut outcome.summary.phases, Phase::Calls);
        let unlogged = outcome.failures - outcome.failures_logged;
        if unlogged > 0 {
            tracing::warn!(
                projection = self.projection.name(),
                partition,
                "{unlogged} more failed calls in this batch (their reasons are on their retry and dead-letter records)"
            );
        }
        outcome
    }

    /// Runs one key's runs in order. A failed chunk is dead-lettered (the
    /// key goes on) or sent to retry with everything after it (the key
    /// stops), as its class and the attempts its records have had say.
    #[allow(clippy::too_many_arguments)]
    fn run_key(
        &self,
        partition: u32,
        work: &BatchWork,
        key_work: &KeyWork,
        scope: &mut KeyScope,
        Calls { modules, instances, time }: Calls<'_, '_>,
        laps: &mut Laps,
        out: &mut WorkerOutcome,
    ) {
        let projection = &*self.projection;
        let key = &key_work.key;
        // Nothing of the key applied, skipped or dead-lettered yet.
        let mut untouched = true;
        let mut runs = work.runs(key_work).iter();
        while let Some(run) = runs.next() {
            let (origins, bodies, attempts) = work.records(run);
            let times = work.event_times(run);
            let Some(route) = modules.route(run.tag) else {
                out.summary.skipped += origins.iter().map(|o| o.events).sum::<u64>();
                untouched = false;
                continue;
            };
            let observed = self.observer.as_ref().map(|_| origins.iter().map(|o| o.offset).collect::<Vec<_>>());
            let shape = run.shape();
            let tag = run.tag;
            let (run_records, run_origins, run_bodies) = (bodies.len(), origins, bodies);
            let module = &modules.modules()[route.module];
            let reachable =
                |scope: &KeyScope| time.check(route.module, module.name()).and_then(|()| scope.budget_not_spent());
            let traced = Traced { bodies: bodies.into(), origins: origins.into() };
            let calls = Calls { modules, instances: &mut *instances, time };
            let (reduced, fold_error) = Self::reduce_run(route, tag, traced, reachable(scope), calls, laps, out);
            let attempts: Cow<[Tries]> = if attempts.len() == reduced.bodies.len() {
                attempts.into()
            } else {
                // Reduced records stand for several: they carry the most
                // attempts any of them had, and the earliest first failure.
                vec![Tries::merged(attempts.iter().copied()); reduced.bodies.len()].into()
            };
            // Should the run fail, it goes to retry or the dead-letter topic
            // as reduced, unless `combine` made it larger than the events
            // it stands for: then as the events came, so that a fold never
            // costs the batch's memory or the log more than its events did.
            let inflated = reduced.bodies.len() == 1
                && run_records > 1
                && reduced.bodies[0].len() > run_bodies.iter().map(Vec::len).sum::<usize>();
            // The event time a reduced record carries on to retry or the
            // dead-letter topic: its own, or for one that stands for
            // several the time of the event whose place (origin) it takes.
            let reduced_time = |index: usize| match reduced.bodies.len() == run_records {
                true => times[index],
                false => {
                    run_origins.iter().position(|o| o.offset == reduced.origins[index].offset).and_then(|i| times[i])
                }
            };
            // A failed fold is one failure of the whole run.
            let max_batch = if fold_error.is_some() { u32::MAX } else { route.event_type.max_batch };
            let (mut start, mut calls, mut all_applied) = (0, 0, true);
            for chunk in reduce::chunks(&reduced.bodies, max_batch) {
                let (begin, end) = (start, start + chunk.len());
                start = end;
                let started = std::time::Instant::now();
                let result = match &fold_error {
                    Some(error) => Err(error.clone()),
                    None => reachable(scope).and_then(|()| {
                        let earliest = reduced.origins[begin..end].iter().map(|o| o.offset).min().unwrap_or_default();
                        scope.set_emit_origin(partition, earliest, module.name(), module.version());
                        instances.get(route.module).and_then(|instance| self.call(instance, scope, tag, chunk))
                    }),
                };
                let elapsed = started.elapsed();
                time.charge(route.module, elapsed);
                if self.metrics.is_some() {
                    out.tally.of(route.module, tag).call_times.push(elapsed);
                }
                let error = match result {
                    Ok(()) => {
                        // Unreduced chunks are reported one by one, so a
                        // failure later in the run hides none of them.
                        let unreduced = observed.as_deref().filter(|offsets| offsets.len() == reduced.bodies.len());
                        let chunk = (tag, route.module, &reduced.origins[begin..end]);
                        self.chunk_applied(partition, key, chunk, unreduced.map(|offsets| &offsets[begin..end]), out);
                        calls += 1;
                        untouched = false;
                        continue;
                    }
                    Err(CallError::HostFault(fault)) => {
                        tracing::error!(projection = projection.name(), partition, %key, "host fault: {fault}");
                        out.host_fault.get_or_insert(fault);
                        return;
                    }
                    Err(error) => error,
                };
                all_applied = false;
                // A cut is logged once per module and batch, by `CallTime`;
                // past so many failures a worker's batch counts the rest.
                let reported = !matches!(error, CallError::BatchTime { .. } | CallError::BatchBudgetSpent { .. });
                out.failures += usize::from(reported);
                let class = FailureClass::of(&error);
                // A key that only shared a batch with a flood loses no attempt.
                let failure::Decision { attempt, route: next } = failure::decide(
                    class,
                    error.counts_as_attempt(),
                    attempts[begin..end].iter().map(|tries| tries.attempts),
                    self.config.retry.max_attempts,
                );
                let tries = Tries { attempts: attempt, ..Tries::merged(attempts[begin..end].iter().copied()) };
                if class == FailureClass::Trap {
                    out.tally.of(route.module, tag).traps += 1;
                }
                let failure = Failure {
                    class,
                    message: error.to_string(),
                    module: module.name().to_owned(),
                    version: module.version().to_owned(),
                };
                if reported && out.failures_logged < FAILURES_LOGGED_PER_BATCH {
                    out.failures_logged += 1;
                    tracing::warn!(
                        projection = projection.name(),
                        partition,
                        %key,
                        event_type = route.event_type.name,
                        attempt,
                        "{}",
                        wakuwaku_core::terminal::printable(&error.to_string())
                    );
                }
                // The failed chunk as it is routed: an inflated fold (the
                // run's one chunk) as its events.
                let (failed_bodies, failed_origins) = match inflated {
                    true => (run_bodies, run_origins),
                    false => (&reduced.bodies[begin..end], &reduced.origins[begin..end]),
                };
                // The chunk's first record carries the whole message while
                // the worker's batch has written less than
                // `WHOLE_MESSAGE_BYTES_PER_BATCH` of them; every other
                // record a brief one.
                let whole = out.whole_message_bytes < WHOLE_MESSAGE_BYTES_PER_BATCH;
                if whole {
                    out.whole_message_bytes += failure.message.len();
                }
                let brief = failure.brief(whole.then(|| failed_origins.first().map_or(0, |origin| origin.offset)));
                let failure_of = |index: usize| if index == 0 && whole { failure.clone() } else { brief.clone() };
                let failed_time = |index: usize| if inflated { times[index] } else { reduced_time(begin + index) };
                if next == Route::DeadLetter {
                    let failed = (failed_bodies, failed_origins, tries);
                    self.dead_letter_chunk(partition, key, (shape, route), failed, (&failure_of, &failed_time), out);
                    untouched = false;
                    continue;
                }
                // The records of the run from `begin` on as they go to
                // retry: the failed chunk with its attempt counted, the
                // rest as they were.
                let unfinished_run = |records: Range<usize>| {
                    let failed =
                        failed_bodies.iter().zip(failed_origins).enumerate().map(|(index, (body, &origin))| {
                            Unfinished {
                                shape,
                                origin,
                                tries,
                                failure: Some(failure_of(index)),
                                event_time: failed_time(index),
                                body: body.clone(),
                            }
                        });
                    let rest = records.filter(|&index| index >= end).map(|index| Unfinished {
                        shape,
                        origin: reduced.origins[index],
                        tries: attempts[index],
                        failure: None,
                        event_time: reduced_time(index),
                        body: reduced.bodies[index].clone(),
                    });
                    failed.chain(rest)
                };
                if let Some(slice) = &work.retry {
                    // Taken from the retry topic: only what must go before
                    // the rest is written again; the rest stays where it
                    // waits ([`RetrySlice`]).
                    let key_runs = work.runs(key_work);
                    if untouched && !error.counts_as_attempt() {
                        // Not the key's doing and nothing of it done: all
                        // of it stays.
                        out.left.extend(key_runs.iter().flat_map(|run| work.inputs(run)).map(|&i| slice.offsets[i]));
                        return;
                    }
                    // The failed chunk goes ahead, and the rest of its run
                    // too when the run was folded (its parts stand for
                    // several records); every record not reached stays.
                    let unreduced = reduced.bodies.len() == run_records;
                    let mut left: Vec<usize> = if unreduced { work.inputs(run)[end..].to_vec() } else { Vec::new() };
                    left.extend(runs.flat_map(|later| work.inputs(later)));
                    let ahead_of =
                        left.iter().min().map(|&i| slice.offsets[i]).or_else(|| slice.next_waiting.get(key).copied());
                    out.left.extend(left.iter().map(|&i| slice.offsets[i]));
                    let ahead_end = if unreduced { end } else { reduced.bodies.len() };
                    let unfinished = unfinished_run(begin..ahead_end).collect();
                    self.retry_later(partition, key, modules, (unfinished, ahead_of), out);
                    return;
                }
                // Retry later: the rest of the run, then every later run.
                let mut unfinished: Vec<Unfinished> = unfinished_run(begin..reduced.bodies.len()).collect();
                unfinished.extend(runs.flat_map(|run| unfinished_of(work, run)));
                self.retry_later(partition, key, modules, (unfinished, None), out);
                return;
            }
            if all_applied
                && let (Some(observer), Some(offsets)) = (&self.observer, observed)
                && offsets.len() != reduced.bodies.len()
            {
                let key = key.clone();
                observer.run_handled(&RunCall { partition, key, tag, offsets, reduced: reduced.bodies.len(), calls });
            }
        }
    }

    /// Counts a chunk of a run (`tag`, handled by module `module`, its
    /// records' `origins`) applied, and reports it to the observer if the
    /// run was not reduced (`offsets`: the chunk's).
    fn chunk_applied(
        &self,
        partition: u32,
        key: &Key,
        (tag, module, origins): (EventTypeTag, usize, &[Origin]),
        offsets: Option<&[u64]>,
        out: &mut WorkerOutcome,
    ) {
        let events = origins.iter().map(|o| o.events).sum::<u64>();
        out.summary.applied += events;
        out.tally.of(module, tag).applied += events;
        out.summary.calls += 1;
        if let (Some(observer), Some(offsets)) = (&self.observer, offsets) {
            let offsets = offsets.to_vec();
            let reduced = offsets.len();
            observer.run_handled(&RunCall { partition, key: key.clone(), tag, offsets, reduced, calls: 1 });
        }
    }

    /// Dead-letters a failed chunk of a run (its `shape`, routed by
    /// `route`): each record with its failure and event time (by its index
    /// in the chunk) and the chunk's tries.
    fn dead_letter_chunk(
        &self,
        partition: u32,
        key: &Key,
        (shape, route): (RunShape, &crate::projection::Route),
        (bodies, origins, tries): (&[Vec<u8>], &[Origin], Tries),
        (failure_of, time_of): (ByIndex<'_, Failure>, ByIndex<'_, Option<i64>>),
        out: &mut WorkerOutcome,
    ) {
        for (index, (body, &origin)) in bodies.iter().zip(origins).enumerate() {
            let routed = self.routed(partition, origin, tries, Some(failure_of(index)), &route.event_type.name);
            let envelope = shape.envelope(key, time_of(index));
            let record = routing::routed_record(&envelope, &routed, body.clone());
            out.routed.push(self.routed_entry(RoutedTopics::dlq, partition, key.key_hash(), record));
            out.summary.dead_lettered += origin.events;
            out.tally.of(route.module, shape.tag).dead_lettered += origin.events;
        }
    }

    /// Reduces one run with its type's algebra (a long associative run
    /// folded in parts), unless the module cannot be reached (`reachable`:
    /// out of time or budget for this batch). A failed fold, or a module
    /// out of reach, gives the run back unreduced with the error: it fails
    /// whole. Only a run its algebra may change is timed as reduced (two
    /// clock reads fewer for every other run).
    fn reduce_run<'a>(
        route: &crate::projection::Route,
        tag: EventTypeTag,
        traced: Traced<'a>,
        reachable: Result<(), CallError>,
        Calls { instances, time, .. }: Calls<'_, '_>,
        laps: &mut Laps,
        out: &mut WorkerOutcome,
    ) -> (Traced<'a>, Option<CallError>) {
        let reduces = reduce::may_change(route.event_type.algebra, traced.bodies.len());
        if reduces {
            laps.lap(&mut out.summary.phases, Phase::Calls);
        }
        let folding = reduces.then(std::time::Instant::now);
        let reduced = match reachable.and_then(|()| instances.get(route.module)) {
            Err(error) => (traced, Some(error)),
            Ok(instance) => match reduce_traced(route.event_type.algebra, traced, |bodies| {
                reduce::fold_in_parts(bodies, COMBINE_PART_BYTES, |part| instance.combine(tag, part))
            }) {
                Ok(reduced) => (reduced, None),
                Err((error, run)) => (run, Some(error)),
            },
        };
        if let Some(folding) = folding {
            time.charge(route.module, folding.elapsed());
            laps.lap(&mut out.summary.phases, Phase::Reduce);
        }
        reduced
    }

    /// Calls `handle`, retrying in place while it fails transiently, as
    /// often as the policy allows, with a doubling backoff.
    fn call(
        &self,
        instance: &mut dyn HandlerInstance,
        scope: &mut KeyScope,
        tag: EventTypeTag,
        bodies: &[Vec<u8>],
    ) -> Result<(), CallError> {
        let mut backoff = self.config.retry.transient_backoff;
        for _ in 0..self.config.retry.transient_retries {
            match instance.handle(scope, tag, bodies) {
                Err(CallError::Handler { class: ErrorClass::Transient, .. }) => {
                    std::thread::sleep(backoff);
                    backoff = backoff.saturating_mul(2);
                }
                result => return result,
            }
        }
        instance.handle(scope, tag, bodies)
    }

    /// Writes a key's unfinished work to the retry topic, in execution
    /// order, with orderings rewritten so each stage stays a segment, and
    /// ahead of the key's record at the retry offset given, if any.
    fn retry_later(
        &self,
        partition: u32,
        key: &Key,
        modules: &ModuleSet,
        (unfinished, ahead_of): (Vec<Unfinished>, Option<u64>),
        out: &mut WorkerOutcome,
    ) {
        let orderings = routing::rewrite_orderings(unfinished.iter().map(|u| u.shape.stage));
        for (item, ordering) in unfinished.into_iter().zip(orderings) {
            let event_type = modules.route(item.shape.tag).map_or("", |route| route.event_type.name.as_str());
            let routed =
                Routed { ahead_of, ..self.routed(partition, item.origin, item.tries, item.failure, event_type) };
            let envelope = RunShape { ordering, ..item.shape }.envelope(key, item.event_time);
            let record = routing::routed_record(&envelope, &routed, item.body);
            out.routed.push(self.routed_entry(RoutedTopics::retry, partition, key.key_hash(), record));
            out.summary.retry_in += item.origin.events;
            if let Some(route) = modules.route(item.shape.tag) {
                out.tally.of(route.module, item.shape.tag).retried += item.origin.events;
            }
        }
    }

    /// The routing headers of a record of this projection.
    fn routed(
        &self,
        partition: u32,
        origin: Origin,
        tries: Tries,
        failure: Option<Failure>,
        event_type: &str,
    ) -> Routed {
        let now = routing::now_ms();
        Routed {
            projection: self.projection.name().to_owned(),
            topic: self.topic_name(origin.topic).to_owned(),
            event_type: event_type.to_owned(),
            origin_partition: partition,
            origin_offset: origin.offset,
            events: origin.events,
            attempts: tries.attempts,
            failed_at_ms: now,
            first_failed_at_ms: tries.first_failure(failure.is_some(), now),
            failure,
            ahead_of: None,
            ordering: tries.ordering,
        }
    }

    /// The name of the projection's topic of index `topic` (an
    /// [`Origin::topic`]); the first for an index it does not have.
    pub(super) fn topic_name(&self, topic: u32) -> &str {
        let topics = self.projection.topics();
        topics.get(topic as usize).map_or(self.projection.topic(), String::as_str)
    }

    /// An outbox entry for the retry or dead-letter topic (`topic_of` the
    /// projection's topic), to the partition the event came from.
    pub(super) fn routed_entry(
        &self,
        topic_of: fn(&RoutedTopics) -> &str,
        partition: u32,
        key_hash: u64,
        record: crate::log::Record,
    ) -> OutboxEntry {
        let topic = topic_of(self.projection.routed_topics()).to_owned();
        OutboxEntry { topic, partition_key: key_hash, partition: Some(partition), record, origin: None }
    }
}

/// What a worker calls modules with: the batch's module set, the worker's
/// instances of them, and the time each module's calls may still take.
struct Calls<'w, 'i> {
    modules: &'w ModuleSet,
    instances: &'w mut Instances<'i>,
    time: &'w CallTime,
}

/// One key of a batch: its runs in [`BatchWork`], in execution order.
pub(super) struct KeyWork {
    pub(super) key: Key,
    pub(super) runs: Range<usize>,
}

/// One run of a key: its records in [`BatchWork`].
pub(super) struct RunWork {
    pub(super) tag: EventTypeTag,
    /// Which stage of the key's execution the run belongs to.
    pub(super) stage: usize,
    /// The ordering and algebra its first record carried.
    pub(super) ordering: EventAtomicOrdering,
    pub(super) algebra: Algebra,
    /// Its records' bodies, origins and attempts.
    pub(super) records: Range<usize>,
}

impl RunWork {
    fn shape(&self) -> RunShape {
        RunShape { tag: self.tag, stage: self.stage, ordering: self.ordering, algebra: self.algebra }
    }
}

/// What a routed record of a run needs besides its body and origin.
#[derive(Clone, Copy)]
struct RunShape {
    tag: EventTypeTag,
    stage: usize,
    ordering: EventAtomicOrdering,
    algebra: Algebra,
}

impl RunShape {
    /// The envelope of a routed record of the run, with its event time,
    /// so that a retried or dead-lettered event keeps it.
    fn envelope(&self, key: &Key, event_time: Option<i64>) -> EventHeaders {
        EventHeaders { tag: self.tag, key: key.clone(), ordering: self.ordering, algebra: self.algebra, event_time }
    }
}

/// Something of each record of a chunk, by its index in the chunk.
type ByIndex<'a, T> = &'a dyn Fn(usize) -> T;

/// A run not reached, as it goes to retry: its records as they came.
fn unfinished_of<'w>(work: &'w BatchWork, run: &'w RunWork) -> impl Iterator<Item = Unfinished> + 'w {
    let shape = run.shape();
    let (origins, bodies, attempts) = work.records(run);
    let times = work.event_times(run);
    origins.iter().zip(bodies).zip(attempts).zip(times).map(move |(((&origin, body), &tries), &event_time)| {
        Unfinished { shape, origin, tries, failure: None, event_time, body: body.clone() }
    })
}

/// A record of a key's work that did not run, on its way to retry.
struct Unfinished {
    shape: RunShape,
    origin: Origin,
    tries: Tries,
    /// Why, for the chunk that failed.
    failure: Option<Failure>,
    /// Its event time, carried in the record's `waku-event-time`.
    event_time: Option<i64>,
    body: Vec<u8>,
}

#[derive(Default)]
pub(super) struct WorkerOutcome {
    pub(super) keys: Vec<(Key, KeyOutcome)>,
    /// Records for the retry and dead-letter topics.
    pub(super) routed: Vec<OutboxEntry>,
    /// Retry offsets of records a batch taken from the retry topic left
    /// where they wait.
    pub(super) left: Vec<u64>,
    /// Why the host itself failed under a call, if it did: the batch is not
    /// committed.
    pub(super) host_fault: Option<String>,
    /// Failed calls, and how many of them were logged.
    failures: usize,
    failures_logged: usize,
    /// Bytes of the whole failure messages its routed records carry.
    whole_message_bytes: usize,
    pub(super) summary: Summary,
    pub(super) tally: BatchTally,
}
