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
//!
//! **The event time of a reduced record** that goes to retry or the
//! dead-letter topic is that of the event whose place in its key's order it
//! takes, so that, released again in event-time order, it lands where it
//! was applied: after everything its key's order puts before it, before
//! everything after it ([`reduced_event_time`]). A record standing for
//! several events (a fold, or duplicates dropped into one) takes the time
//! of the first of them in its run (release order; for one topic, log
//! order), except in a run that closes its
//! segment (the tail, ending at its `Release` event), where it takes the
//! last's. Neither the earliest nor the latest time alone keeps that: a
//! head run folds a `Relaxed` event of its type from after body events into
//! the `Acquire` that opens the segment, so its latest time would put the
//! fold after those body events; a tail folds an earlier `Relaxed` event
//! into the closing `Release`, so its earliest would put the fold before
//! them. The events are found by their place in the run, never by offset:
//! in a batch released across several topics, offsets of different topics
//! coincide.

use std::borrow::Cow;
use std::ops::{ControlFlow, Range};
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
use wakuwaku_core::timers::{Agenda, KeyTimers, Millis, Next};

use super::call_time::CallTime;
use super::failure::{self, Route, Tries};
use super::phase::{Laps, Phase};
use super::projection_names::ProjectionNames;
use super::timer_letter::{TIMER_EVENT_TYPE, TIMER_LETTER_TAG, TimerLetter};
use super::work::{BatchWork, KeyWork, RunWork};
use super::{CallObserver, ConsumerConfig, RunCall, Summary};
use crate::engine::metrics::BatchTally;
use crate::engine::projection::{Instances, ModuleSet};
use crate::engine::routing::{self, Failure, FailureClass, Routed, RoutedTopics};
use crate::engine::telemetry::CallTrace;
use crate::engine::telemetry::{CallOf, CallOutcome};
use crate::event::{Algebra, EventAtomicOrdering, EventHeaders, EventTypeTag};
use crate::key::Key;
use crate::reduce::{Origin, Traced, reduce_traced};
use crate::sandbox::handler::{
    BatchBudget, BatchCounters, CallError, ErrorClass, HandlerInstance, HandlerModule, KeyOutcome, KeyScope,
    ScopeError, ScopeShared, TimerQuota,
};
use crate::storage::state::{OutboxEntry, StateReader};

/// What runs a worker's keys: the part of a [`BatchRunner`](super::batch::BatchRunner)
/// that a key's run reads. It holds no log and no store: a key's calls read
/// the batch's snapshot and write into the key's scope, so a unit test runs
/// a worker's keys as a value, on the calling thread.
#[derive(Clone)]
pub(super) struct KeyRunner {
    /// The projection's names: where a failed chunk's records go.
    pub(super) projection: Arc<ProjectionNames>,
    pub(super) config: ConsumerConfig,
    pub(super) observer: Option<Arc<dyn CallObserver>>,
    /// Whether each call's time is kept for the metrics.
    pub(super) times_calls: bool,
    /// On the clone a batch runs on: where its calls report.
    pub(super) trace: Option<Arc<CallTrace>>,
    /// On the clone a batch runs on: the clock its keys' timers fire by
    /// (none: no timer fires in it, as in a batch taken from retry).
    pub(super) clock: Option<Millis>,
    /// On the clone a batch runs on: every key of the partition with a
    /// stored timer the clock passed, when the store listed them all. A
    /// key not among them holds no due timer but those its calls set, so
    /// its timers are not read unless a call reads them (none: read every
    /// key's).
    pub(super) due: Option<Arc<std::collections::HashSet<Key>>>,
}

impl KeyRunner {
    /// The runner of `projection`'s keys under `config`: no observer, no
    /// metrics, no trace.
    pub(super) fn new(projection: Arc<ProjectionNames>, config: ConsumerConfig) -> Self {
        Self { projection, config, observer: None, times_calls: false, trace: None, clock: None, due: None }
    }

    /// Handles the keys of worker `worker` ([`BatchWork::keys_of`]), one
    /// key after another.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_worker(
        &self,
        partition: u32,
        work: &BatchWork,
        (worker, workers): (usize, usize),
        snapshot: &Arc<StateReader>,
        (budget, counters, timers): (&BatchBudget, &BatchCounters, &TimerQuota),
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
            timers: timers.clone(),
        });
        // Everything between two reductions is charged to the calls.
        let mut laps = Laps::start();
        for key_work in work.keys_of(worker, workers) {
            if outcome.host_fault.is_some() {
                break; // the batch will not commit
            }
            let key = key_work.key.clone();
            let mut scope = KeyScope::sharing(key.clone(), &shared);
            let calls = Calls { instances: &mut instances, time: call_time };
            let at = KeyInBatch { partition, work, key_work, modules };
            self.run_key(at, &mut scope, calls, &mut laps, &mut outcome);
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

    /// Runs one key's runs in order, its due timers fired among them
    /// ([`Agenda`]: under the batch's clock, a due timer fires before the
    /// key's first later timed event not handed over yet). A failed chunk
    /// is dead-lettered (the key goes on) or sent to retry with everything
    /// after it (the key stops, and its timers still due wait for it), as
    /// its class and the attempts its records have had say
    /// ([`Self::chunk_failed`]).
    fn run_key(
        &self,
        at: KeyInBatch<'_>,
        scope: &mut KeyScope,
        Calls { instances, time }: Calls<'_, '_>,
        laps: &mut Laps,
        out: &mut WorkerOutcome,
    ) {
        let KeyInBatch { work, key_work, .. } = at;
        let key_runs = work.runs(key_work);
        // The key's records are numbered for the agenda from its first.
        let base = key_runs.first().map_or(0, |run| run.records.start);
        let mut agenda = self.clock.map(|clock| Agenda::new(work.places(key_work).to_vec(), clock));
        // Nothing of the key applied, skipped or dead-lettered yet.
        let mut untouched = true;
        for (index, run) in key_runs.iter().enumerate() {
            let mut from = run.records.start;
            while from < run.records.end {
                // The timers due before the run's next record fire first;
                // the agenda says how far the records may go then.
                let mut to = run.records.end;
                if let Some(agenda) = agenda.as_mut() {
                    let with = Calls { instances: &mut *instances, time };
                    match self.fire_due(at, agenda, scope, with, out) {
                        ControlFlow::Break(()) => return,
                        ControlFlow::Continue(Some(end)) => to = to.min(base + end).max(from + 1),
                        ControlFlow::Continue(None) => {}
                    }
                }
                let part = RunWork { records: from..to, closes: run.closes && to == run.records.end, ..run.clone() };
                // What follows the part: the rest of its run, then the
                // key's later runs.
                let rest: Vec<RunWork>;
                let later = match to == run.records.end {
                    true => &key_runs[index + 1..],
                    false => {
                        let tail = RunWork { records: to..run.records.end, ..run.clone() };
                        rest = std::iter::once(tail).chain(key_runs[index + 1..].iter().cloned()).collect();
                        &rest[..]
                    }
                };
                let with = Calls { instances: &mut *instances, time };
                let placed = agenda.as_mut().map(|agenda| (agenda, base));
                match self.run_part(at, (&part, later), scope, with, placed, (laps, &mut untouched), out) {
                    ControlFlow::Break(()) => return,
                    ControlFlow::Continue(handed) => from = handed,
                }
            }
        }
        // The timers due after the key's last record fire last.
        if let Some(agenda) = agenda.as_mut() {
            let with = Calls { instances: &mut *instances, time };
            let _ = self.fire_due(at, agenda, scope, with, out);
        }
    }

    /// The key's timers as the agenda needs them: read (once per batch)
    /// unless the key is known to hold no due timer and no call read or
    /// set its timers yet (then none, without asking the store).
    fn timers_of<'s>(&self, scope: &'s mut KeyScope) -> Result<&'s KeyTimers, ScopeError> {
        static NONE: std::sync::OnceLock<KeyTimers> = std::sync::OnceLock::new();
        let unread = !scope.timers_read();
        if unread && self.due.as_ref().is_some_and(|due| !due.contains(scope.key())) {
            return Ok(NONE.get_or_init(KeyTimers::default));
        }
        scope.timers()
    }

    /// Fires the key's timers the agenda says are due before its next
    /// record, one call per time, until the next record's turn comes.
    /// Returns where the records handed over next must stop (the agenda's
    /// index of the first record a due timer fires before), or `Break` on
    /// a host fault (the batch will not commit).
    fn fire_due(
        &self,
        at: KeyInBatch<'_>,
        agenda: &mut Agenda,
        scope: &mut KeyScope,
        Calls { instances, time }: Calls<'_, '_>,
        out: &mut WorkerOutcome,
    ) -> ControlFlow<(), Option<usize>> {
        loop {
            let next = match self.timers_of(scope) {
                Ok(timers) => agenda.next(timers),
                Err(error) => {
                    out.host_fault.get_or_insert(error.to_string());
                    return ControlFlow::Break(());
                }
            };
            match next {
                Next::Events(range) => return ControlFlow::Continue(Some(range.end)),
                Next::Done => return ControlFlow::Continue(None),
                Next::Fire(firing) => {
                    let with = Calls { instances: &mut *instances, time };
                    self.fire(at, firing, scope, with, out)?;
                }
            }
        }
    }

    /// Fires the key's timers at `firing` (in name order, in one call) to
    /// every module of the batch with a `fire` export, in the projection's
    /// module order. A call that fails is taken back (retried in place
    /// first while it fails transiently, as `handle` is) and its timers are
    /// dead-lettered; the key goes on. `Break` on a host fault.
    fn fire(
        &self,
        KeyInBatch { partition, key_work, modules, .. }: KeyInBatch<'_>,
        firing: Millis,
        scope: &mut KeyScope,
        Calls { instances, time }: Calls<'_, '_>,
        out: &mut WorkerOutcome,
    ) -> ControlFlow<()> {
        let key = &key_work.key;
        let fired = match scope.take_due(firing) {
            Ok(fired) => fired,
            Err(error) => {
                out.host_fault.get_or_insert(error.to_string());
                return ControlFlow::Break(());
            }
        };
        let mut taken = false;
        for (index, module) in modules.modules().iter().enumerate() {
            let started = std::time::Instant::now();
            let result = instances.get(index).and_then(|instance| {
                scope.set_emit_origin((self.projection.topic_name(0), partition, 0), module.name(), module.version());
                self.call_fire(instance, scope, &fired)
            });
            let elapsed = started.elapsed();
            time.charge(index, elapsed);
            let error = match result {
                Ok(false) => continue,
                Ok(true) => {
                    taken = true;
                    self.trace_call(&**module, TIMER_EVENT_TYPE, key, &[], elapsed, CallOutcome::Ok);
                    out.summary.timers_fired += fired.len() as u64;
                    out.tally.timers.entry(index).or_default().fired += fired.len() as u64;
                    out.summary.calls += 1;
                    continue;
                }
                Err(CallError::HostFault(fault)) => {
                    tracing::error!(projection = self.projection.name(), partition, %key, "host fault: {fault}");
                    out.host_fault.get_or_insert(fault);
                    return ControlFlow::Break(());
                }
                Err(error) => error,
            };
            taken = true;
            self.trace_call(&**module, TIMER_EVENT_TYPE, key, &[], elapsed, CallOutcome::DeadLetter);
            self.dead_letter_timers(partition, key, (&**module, &fired), error, out);
            out.tally.timers.entry(index).or_default().dead_lettered += fired.len() as u64;
        }
        if !taken {
            tracing::warn!(
                projection = self.projection.name(),
                partition,
                %key,
                at = firing,
                "{} timers of key {key} were due and no module of the projection fires timers (none exports \
                 `fire`): they are dropped",
                fired.len()
            );
        }
        ControlFlow::Continue(())
    }

    /// Calls `fire`, retrying in place while it fails transiently, as
    /// [`Self::call`] does for `handle`.
    fn call_fire(
        &self,
        instance: &mut dyn HandlerInstance,
        scope: &mut KeyScope,
        timers: &[wakuwaku_core::timers::Timer],
    ) -> Result<bool, CallError> {
        let mut backoff = self.config.retry.transient_backoff;
        for _ in 0..self.config.retry.transient_retries {
            match instance.fire(scope, timers) {
                Err(CallError::Handler { class: ErrorClass::Transient, .. }) => {
                    std::thread::sleep(backoff);
                    backoff = backoff.saturating_mul(2);
                }
                result => return result,
            }
        }
        instance.fire(scope, timers)
    }

    /// Writes the timers a failed `fire` call of `module` was handed to the
    /// dead-letter topic, as one record: the failure's headers, the key,
    /// the time of the timers as its event time, and the timers as a JSON
    /// body ([`TimerLetter`]).
    fn dead_letter_timers(
        &self,
        partition: u32,
        key: &Key,
        (module, fired): (&dyn HandlerModule, &[wakuwaku_core::timers::Timer]),
        error: CallError,
        out: &mut WorkerOutcome,
    ) {
        let failure = Failure {
            class: FailureClass::of(&error),
            message: error.to_string(),
            module: module.name().to_owned(),
            version: module.version().to_owned(),
        };
        if out.failures_logged < FAILURES_LOGGED_PER_BATCH {
            out.failures_logged += 1;
            tracing::warn!(
                projection = self.projection.name(),
                partition,
                %key,
                "fire failed; its {} timers go to the dead-letter topic: {}",
                fired.len(),
                wakuwaku_core::terminal::printable(&failure.message)
            );
        }
        out.failures += 1;
        let at = fired.first().map(|timer| timer.at);
        let origin = Origin { events: 0, ..Origin::in_topic(0, 0) };
        let routed = self.routed(partition, origin, Tries::default(), Some(failure), TIMER_EVENT_TYPE);
        let envelope = EventHeaders {
            tag: TIMER_LETTER_TAG,
            key: key.clone(),
            ordering: EventAtomicOrdering::Relaxed,
            algebra: Algebra::NonAssociative,
            event_time: at,
        };
        let body = TimerLetter::of(fired).to_json();
        let record = routing::routed_record(&envelope, &routed, body);
        out.routed.push(self.projection.routed_entry(RoutedTopics::dlq, partition, key.key_hash(), record));
        out.summary.timers_dead_lettered += fired.len() as u64;
    }

    /// Runs `part` of a run (its records, `later` what follows it in the
    /// key), chunk by chunk. With the key's agenda (and the number of the
    /// key's first record), tells it how far each call got and stops after
    /// a call that set a timer now due before the part's next record (a
    /// part left as it came; a folded one is handed over whole). Returns
    /// the first record not handed over, or `Break` when the key stops.
    /// (One loop over the part's chunks with each call's outcome routed
    /// where it happens, as the key's loop was before timers: split, the
    /// outcomes would need a type of their own to travel back.)
    #[allow(clippy::too_many_arguments)]
    fn run_part(
        &self,
        at: KeyInBatch<'_>,
        (run, later): (&RunWork, &[RunWork]),
        scope: &mut KeyScope,
        Calls { instances, time }: Calls<'_, '_>,
        mut placed: Option<(&mut Agenda, usize)>,
        (laps, untouched): (&mut Laps, &mut bool),
        out: &mut WorkerOutcome,
    ) -> ControlFlow<(), usize> {
        let KeyInBatch { partition, work, key_work, modules } = at;
        let key = &key_work.key;
        let handed = |to: usize, placed: &mut Option<(&mut Agenda, usize)>, scope: &mut KeyScope| match placed {
            Some((agenda, base)) => match self.timers_of(scope) {
                Ok(timers) => agenda.handed(to - *base, timers),
                Err(_) => false,
            },
            None => false,
        };
        let Some(route) = modules.route(run.tag) else {
            out.summary.skipped += work.records(run).0.iter().map(|o| o.events).sum::<u64>();
            *untouched = false;
            handed(run.records.end, &mut placed, scope);
            return ControlFlow::Continue(run.records.end);
        };
        let origins = work.records(run).0;
        let observed = self.observer.as_ref().map(|_| origins.iter().map(|o| o.offset).collect::<Vec<_>>());
        let tag = run.tag;
        let module = &*modules.modules()[route.module];
        let with = Calls { instances: &mut *instances, time };
        let reach = reachable(time, route, module, scope);
        let reduced = Self::reduced_run(work, run, (route, module), reach, with, laps, out);
        // A failed fold is one failure of the whole run.
        let max_batch = if reduced.fold_error.is_some() { u32::MAX } else { route.event_type.max_batch };
        let (mut start, mut calls, mut all_applied) = (0, 0, true);
        for chunk in reduce::chunks(&reduced.records.bodies, max_batch) {
            let (begin, end) = (start, start + chunk.len());
            start = end;
            let served = &reduced.records.origins[begin..end];
            let with = Calls { instances: &mut *instances, time };
            let (result, elapsed) = self.call_chunk(partition, &reduced, (chunk, served), scope, with, out);
            let error = match result {
                Ok(()) => {
                    self.trace_call(module, &route.event_type.name, key, served, elapsed, CallOutcome::Ok);
                    // Unreduced chunks are reported one by one, so a
                    // failure later in the run hides none of them.
                    let unreduced = observed.as_deref().filter(|offsets| offsets.len() == reduced.records.bodies.len());
                    let chunk = (tag, route.module, served);
                    self.chunk_applied(partition, key, chunk, unreduced.map(|offsets| &offsets[begin..end]), out);
                    calls += 1;
                    *untouched = false;
                    // A timer the call set may be due before the next
                    // record: then the rest of the part waits for it.
                    if reduced.as_it_came
                        && end < reduced.records.bodies.len()
                        && handed(run.records.start + end, &mut placed, scope)
                    {
                        return ControlFlow::Continue(run.records.start + end);
                    }
                    continue;
                }
                Err(CallError::HostFault(fault)) => {
                    self.trace_call(module, &route.event_type.name, key, served, elapsed, CallOutcome::HostFault);
                    tracing::error!(projection = self.projection.name(), partition, %key, "host fault: {fault}");
                    out.host_fault.get_or_insert(fault);
                    return ControlFlow::Break(());
                }
                Err(error) => error,
            };
            all_applied = false;
            let failed = FailedChunk { records: begin..end, error, elapsed };
            match self.chunk_failed(at, &reduced, later, failed, *untouched, out) {
                ControlFlow::Continue(()) => *untouched = false,
                ControlFlow::Break(()) => return ControlFlow::Break(()),
            }
        }
        handed(run.records.end, &mut placed, scope);
        if all_applied
            && let (Some(observer), Some(offsets)) = (&self.observer, observed)
            && offsets.len() != reduced.records.bodies.len()
        {
            let key = key.clone();
            let reduced = reduced.records.bodies.len();
            observer.run_handled(&RunCall { partition, key, tag, offsets, reduced, calls });
        }
        ControlFlow::Continue(run.records.end)
    }

    /// Calls `handle` with a chunk of `run` (`chunk`, its records' origins
    /// `served`), unless its fold failed or its module is out of reach,
    /// and charges the time taken to the module.
    fn call_chunk(
        &self,
        partition: u32,
        run: &ReducedRun<'_>,
        (chunk, served): (&[Vec<u8>], &[Origin]),
        scope: &mut KeyScope,
        Calls { instances, time }: Calls<'_, '_>,
        out: &mut WorkerOutcome,
    ) -> (Result<(), CallError>, std::time::Duration) {
        let (route, module, tag) = (run.route, run.module, run.run.tag);
        let started = std::time::Instant::now();
        let result = match &run.fold_error {
            Some(error) => Err(error.clone()),
            None => reachable(time, route, module, scope).and_then(|()| {
                let (topic, offset) = served.iter().map(|o| (o.topic, o.offset)).min().unwrap_or_default();
                let place = (self.projection.topic_name(topic), partition, offset);
                scope.set_emit_origin(place, module.name(), module.version());
                instances.get(route.module).and_then(|instance| self.call(instance, scope, tag, chunk))
            }),
        };
        let elapsed = started.elapsed();
        time.charge(route.module, elapsed);
        if self.times_calls {
            out.tally.of(route.module, tag).call_times.push(elapsed);
        }
        (result, elapsed)
    }

    /// Reduces `run` of `work` ([`Self::reduce_run`]; `route`d to
    /// `module`) for its calls, with what its records need should a chunk
    /// of it fail.
    fn reduced_run<'a>(
        work: &'a BatchWork,
        run: &'a RunWork,
        (route, module): (&'a crate::engine::projection::Route, &'a dyn HandlerModule),
        reachable: Result<(), CallError>,
        calls: Calls<'_, '_>,
        laps: &mut Laps,
        out: &mut WorkerOutcome,
    ) -> ReducedRun<'a> {
        let (origins, bodies, attempts) = work.records(run);
        let traced = Traced { bodies: bodies.into(), origins: origins.into() };
        let (records, fold_error) = Self::reduce_run(route, run.tag, traced, reachable, calls, laps, out);
        // Left as it came (reduction gives a borrowed run back borrowed only
        // when it leaves it so), or changed: then perhaps reordered, whether
        // or not it kept its length.
        let as_it_came = matches!(records.bodies, Cow::Borrowed(_)) || records.bodies[..] == bodies[..];
        let attempts: Cow<[Tries]> = match as_it_came {
            true => attempts.into(),
            false => reduced_tries(route.event_type.algebra, (bodies, attempts), &records.bodies).into(),
        };
        // Should the run fail, it goes to retry or the dead-letter topic
        // as reduced, unless `combine` made it larger than the events
        // it stands for: then as the events came, so that a fold never
        // costs the batch's memory or the log more than its events did.
        let inflated = records.bodies.len() == 1
            && bodies.len() > 1
            && records.bodies[0].len() > bodies.iter().map(Vec::len).sum::<usize>();
        let times = work.event_times(run);
        ReducedRun { run, route, module, bodies, origins, times, records, attempts, as_it_came, fold_error, inflated }
    }

    /// Routes a failed chunk of `run`, as [`failure::decide`] says:
    /// dead-letters it (the key goes on: `Continue`), or sends it to retry
    /// with all of the key's unfinished work, `later` its runs not reached
    /// (the key stops: `Break`). `untouched`: nothing of the key was
    /// applied, skipped or dead-lettered before it.
    fn chunk_failed(
        &self,
        at: KeyInBatch<'_>,
        run: &ReducedRun<'_>,
        later: &[RunWork],
        FailedChunk { records, error, elapsed }: FailedChunk,
        untouched: bool,
        out: &mut WorkerOutcome,
    ) -> ControlFlow<()> {
        let (partition, key, route, module) = (at.partition, &at.key_work.key, run.route, run.module);
        let (begin, end) = (records.start, records.end);
        // A cut is logged once per module and batch, by `CallTime`;
        // past so many failures a worker's batch counts the rest.
        let reported = !matches!(error, CallError::BatchTime { .. } | CallError::BatchBudgetSpent { .. });
        out.failures += usize::from(reported);
        let class = FailureClass::of(&error);
        // A key that only shared a batch with a flood loses no attempt.
        let failure::Decision { attempt, route: next } = failure::decide(
            class,
            error.counts_as_attempt(),
            run.attempts[begin..end].iter().map(|tries| tries.attempts),
            self.config.retry.max_attempts,
        );
        let tries = Tries { attempts: attempt, ..Tries::merged(run.attempts[begin..end].iter().copied()) };
        let outcome = if next == Route::DeadLetter { CallOutcome::DeadLetter } else { CallOutcome::Retry };
        self.trace_call(module, &route.event_type.name, key, &run.records.origins[begin..end], elapsed, outcome);
        if class == FailureClass::Trap {
            out.tally.of(route.module, run.run.tag).traps += 1;
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
                projection = self.projection.name(),
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
        let (bodies, origins) = match run.inflated {
            true => (run.bodies, run.origins),
            false => (&run.records.bodies[begin..end], &run.records.origins[begin..end]),
        };
        // The chunk's first record carries the whole message while
        // the worker's batch has written less than
        // `WHOLE_MESSAGE_BYTES_PER_BATCH` of them; every other
        // record a brief one.
        let whole = out.whole_message_bytes < WHOLE_MESSAGE_BYTES_PER_BATCH;
        if whole {
            out.whole_message_bytes += failure.message.len();
        }
        let brief = failure.brief(whole.then(|| origins.first().map_or(0, |origin| origin.offset)));
        let failure_of = |index: usize| if index == 0 && whole { failure.clone() } else { brief.clone() };
        let time_of = |index: usize| if run.inflated { run.times[index] } else { run.reduced_time(begin + index) };
        if next == Route::DeadLetter {
            let failed = (bodies, origins, tries);
            self.dead_letter_chunk(
                partition,
                key,
                (RunShape::of(run.run), route),
                failed,
                (&failure_of, &time_of),
                out,
            );
            return ControlFlow::Continue(());
        }
        let chunk = RoutedChunk { end, bodies, origins, tries, failure_of: &failure_of, time_of: &time_of };
        self.retry_key(at, run, later, chunk, untouched && !error.counts_as_attempt(), out);
        ControlFlow::Break(())
    }

    /// Sends a key's unfinished work to retry: the failed `chunk` of `run`
    /// with its attempt counted, then the rest of the run and the runs
    /// `later` as they were. Taken from the retry topic, only what must go
    /// before the rest is written again; the rest stays where it waits
    /// ([`RetrySlice`](super::batch::RetrySlice)), all of it when `stays`
    /// (not the key's doing and nothing of it done).
    fn retry_key(
        &self,
        KeyInBatch { partition, work, key_work, modules }: KeyInBatch<'_>,
        run: &ReducedRun<'_>,
        later: &[RunWork],
        chunk: RoutedChunk<'_>,
        stays: bool,
        out: &mut WorkerOutcome,
    ) {
        let (key, shape, end, reduced) = (&key_work.key, RunShape::of(run.run), chunk.end, &run.records);
        // The records of the run from the failed chunk on, up to the
        // end given, as they go to retry: the failed chunk with its
        // attempt counted, the rest as they were.
        let unfinished_run = |ahead_end: usize| {
            let failed =
                chunk.bodies.iter().zip(chunk.origins).enumerate().map(|(index, (body, &origin))| Unfinished {
                    shape,
                    origin,
                    tries: chunk.tries,
                    failure: Some((chunk.failure_of)(index)),
                    event_time: (chunk.time_of)(index),
                    body: body.clone(),
                });
            let rest = (end..ahead_end).map(|index| Unfinished {
                shape,
                origin: reduced.origins[index],
                tries: run.attempts[index],
                failure: None,
                event_time: run.reduced_time(index),
                body: reduced.bodies[index].clone(),
            });
            failed.chain(rest)
        };
        if let Some(slice) = &work.retry {
            if stays {
                let key_runs = work.runs(key_work);
                out.left.extend(key_runs.iter().flat_map(|run| work.inputs(run)).map(|&i| slice.offsets[i]));
                return;
            }
            // The failed chunk goes ahead, and the rest of its run
            // too when the run was folded (its parts stand for
            // several records); every record not reached stays.
            let unreduced = run.as_it_came;
            let mut left: Vec<usize> = if unreduced { work.inputs(run.run)[end..].to_vec() } else { Vec::new() };
            left.extend(later.iter().flat_map(|later| work.inputs(later)));
            let ahead_of =
                left.iter().min().map(|&i| slice.offsets[i]).or_else(|| slice.next_waiting.get(key).copied());
            out.left.extend(left.iter().map(|&i| slice.offsets[i]));
            let ahead_end = if unreduced { end } else { reduced.bodies.len() };
            let unfinished = unfinished_run(ahead_end).collect();
            self.retry_later(partition, key, modules, (unfinished, ahead_of), out);
            return;
        }
        // Retry later: the rest of the run, then every later run.
        let mut unfinished: Vec<Unfinished> = unfinished_run(reduced.bodies.len()).collect();
        unfinished.extend(later.iter().flat_map(|run| unfinished_of(work, run)));
        self.retry_later(partition, key, modules, (unfinished, None), out);
    }

    /// Reports a call for the events of `origins` to the batch's trace,
    /// when telemetry is on.
    fn trace_call(
        &self,
        module: &dyn HandlerModule,
        event_type: &str,
        key: &Key,
        origins: &[Origin],
        elapsed: std::time::Duration,
        outcome: CallOutcome,
    ) {
        if let Some(trace) = &self.trace {
            let events = origins.iter().map(|origin| origin.events).sum();
            let call = CallOf { module: module.name(), version: module.version(), event_type, key, events };
            trace.call(call, elapsed, outcome);
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
        out.tally.of(module, tag).counts.applied += events;
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
        (shape, route): (RunShape, &crate::engine::projection::Route),
        (bodies, origins, tries): (&[Vec<u8>], &[Origin], Tries),
        (failure_of, time_of): (ByIndex<'_, Failure>, ByIndex<'_, Option<i64>>),
        out: &mut WorkerOutcome,
    ) {
        for (index, (body, &origin)) in bodies.iter().zip(origins).enumerate() {
            let routed = self.routed(partition, origin, tries, Some(failure_of(index)), &route.event_type.name);
            let envelope = shape.envelope(key, time_of(index));
            let record = routing::routed_record(&envelope, &routed, body.clone());
            out.routed.push(self.projection.routed_entry(RoutedTopics::dlq, partition, key.key_hash(), record));
            out.summary.dead_lettered += origin.events;
            out.tally.of(route.module, shape.tag).counts.dead_lettered += origin.events;
        }
    }

    /// Reduces one run with its type's algebra (a long associative run
    /// folded in parts), unless the module cannot be reached (`reachable`:
    /// out of time or budget for this batch). A failed fold, or a module
    /// out of reach, gives the run back unreduced with the error: it fails
    /// whole. Only a run its algebra may change is timed as reduced (two
    /// clock reads fewer for every other run).
    fn reduce_run<'a>(
        route: &crate::engine::projection::Route,
        tag: EventTypeTag,
        traced: Traced<'a>,
        reachable: Result<(), CallError>,
        Calls { instances, time }: Calls<'_, '_>,
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
            out.routed.push(self.projection.routed_entry(RoutedTopics::retry, partition, key.key_hash(), record));
            out.summary.retry_in += item.origin.events;
            if let Some(route) = modules.route(item.shape.tag) {
                out.tally.of(route.module, item.shape.tag).counts.retry_in += item.origin.events;
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
        let now = crate::platform::clock::now_ms();
        Routed {
            projection: self.projection.name().to_owned(),
            topic: self.projection.topic_name(origin.topic).to_owned(),
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
}

/// What a worker calls modules with: its instances of the batch's
/// modules ([`KeyInBatch::modules`]), and the time each module's calls may
/// still take.
struct Calls<'w, 'i> {
    instances: &'w mut Instances<'i>,
    time: &'w CallTime,
}

/// One key of a worker's batch as its runs are run: the partition, the
/// batch's work and module set, and the key's runs in it.
#[derive(Clone, Copy)]
struct KeyInBatch<'w> {
    partition: u32,
    work: &'w BatchWork,
    key_work: &'w KeyWork,
    modules: &'w ModuleSet,
}

/// Whether the module of `route` may be called again in this batch: its
/// calls have time left ([`CallTime`]) and the batch's budget is not spent.
fn reachable(
    time: &CallTime,
    route: &crate::engine::projection::Route,
    module: &dyn HandlerModule,
    scope: &KeyScope,
) -> Result<(), CallError> {
    time.check(route.module, module.name()).and_then(|()| scope.budget_not_spent())
}

/// A run of a key as its chunks are called: its records as they came and
/// as reduced, and what a failed chunk of it needs to be routed.
struct ReducedRun<'a> {
    run: &'a RunWork,
    route: &'a crate::engine::projection::Route,
    module: &'a dyn HandlerModule,
    /// Its records as they came, with their event times.
    bodies: &'a [Vec<u8>],
    origins: &'a [Origin],
    times: &'a [Option<i64>],
    /// Its records as reduced, and the attempts each has had.
    records: Traced<'a>,
    attempts: Cow<'a, [Tries]>,
    /// Whether its records as reduced are its records as they came, index
    /// for index (an idempotent-commutative run without duplicates is
    /// sorted: the same length, another order).
    as_it_came: bool,
    /// Why the fold failed or the module was out of reach, if so: the run
    /// fails whole.
    fold_error: Option<CallError>,
    /// Whether `combine` made its one record larger than the events it
    /// stands for: a failure routes those events instead.
    inflated: bool,
}

impl ReducedRun<'_> {
    /// The event time reduced record `index` carries on to retry or the
    /// dead-letter topic (see the module doc).
    fn reduced_time(&self, index: usize) -> Option<i64> {
        if self.as_it_came {
            // Each record is the event of its place (a run that failed whole
            // unreduced keeps equal bodies apart).
            return self.times[index];
        }
        let algebra = self.route.event_type.algebra;
        reduced_event_time(algebra, self.run.closes, (self.bodies, self.times), &self.records.bodies, index)
    }
}

/// A chunk of a run (its reduced `records`) whose call failed.
struct FailedChunk {
    records: Range<usize>,
    error: CallError,
    elapsed: std::time::Duration,
}

/// A failed chunk as it goes to retry: its records (those of the reduced
/// run up to `end`, or an inflated fold's events) with their tries, and
/// each one's failure and event time by its index in the chunk.
struct RoutedChunk<'c> {
    end: usize,
    bodies: &'c [Vec<u8>],
    origins: &'c [Origin],
    tries: Tries,
    failure_of: ByIndex<'c, Failure>,
    time_of: ByIndex<'c, Option<i64>>,
}

/// The event time of reduced record `index` of a run (`reduced`, from the
/// run's `bodies` by `algebra`, each with its event time in `times`, in
/// release order): the time of the event whose place it takes (see the
/// module doc). `closes`: the run is its segment's tail.
fn reduced_event_time(
    algebra: Algebra,
    closes: bool,
    (bodies, times): (&[Vec<u8>], &[Option<i64>]),
    reduced: &[Vec<u8>],
    index: usize,
) -> Option<i64> {
    // The events (by their place in the run) that it stands for.
    let stands_for: Vec<usize> = match algebra {
        // Sorted by body, each body once: every event with its body.
        Algebra::IdempotentCommutative => (0..bodies.len()).filter(|&i| bodies[i] == reduced[index]).collect(),
        // Left as it came.
        _ if reduced.len() == bodies.len() => return times[index],
        // One fold of the whole run.
        Algebra::Associative => (0..bodies.len()).collect(),
        // The `index`th group of adjacent equal bodies.
        Algebra::Idempotent => {
            let mut group = 0;
            (0..bodies.len())
                .filter(|&i| {
                    group += usize::from(i > 0 && bodies[i] != bodies[i - 1]);
                    group == index
                })
                .collect()
        }
        // Never reduced.
        Algebra::NonAssociative | Algebra::Commutative => return times[index],
    };
    let place = if closes { stands_for.last() } else { stands_for.first() };
    place.and_then(|&i| times[i])
}

/// The tries of each reduced record of a run (`reduced`, from `bodies`
/// by `algebra`, each with its `tries`, changed by the reduction): those of
/// the events it stands for, merged ([`Tries::merged`]: the most attempts,
/// the earliest first failure). Found by body, never by index: a sorted
/// run's records are in another order than its events.
fn reduced_tries(algebra: Algebra, (bodies, tries): (&[Vec<u8>], &[Tries]), reduced: &[Vec<u8>]) -> Vec<Tries> {
    let mut merged = vec![Tries::default(); reduced.len()];
    let last = reduced.len().saturating_sub(1);
    let mut group = 0;
    for (index, (body, &each)) in bodies.iter().zip(tries).enumerate() {
        let place = match algebra {
            // Sorted by body, each body once.
            Algebra::IdempotentCommutative => reduced.binary_search(body).unwrap_or_else(|place| place.min(last)),
            // The `group`th run of adjacent equal bodies.
            Algebra::Idempotent => {
                group += usize::from(index > 0 && bodies[index] != bodies[index - 1]);
                group.min(last)
            }
            // One fold of the whole run (no other algebra changes a run).
            _ => 0,
        };
        if let Some(slot) = merged.get_mut(place) {
            *slot = Tries::merged([*slot, each]);
        }
    }
    merged
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
    /// The shape of `run`'s records.
    fn of(run: &RunWork) -> Self {
        Self { tag: run.tag, stage: run.stage, ordering: run.ordering, algebra: run.algebra }
    }

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
    let shape = RunShape::of(run);
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

#[cfg(test)]
mod worker_tests {
    //! One worker's keys as a value: the batch's work laid out from
    //! records, run on the calling thread with the test ledger's module
    //! over a snapshot in a map. No log, no store, no thread.

    use std::sync::Arc;
    use std::time::Duration;

    use super::super::test_ledger::{DEPOSIT, Ledger, MapSnapshot, modules, relaxed};
    use super::super::work::{BatchInput, BatchWork};
    use super::*;
    use crate::event::{Envelope, EventTiming};
    use crate::plan::Plan;
    use crate::sandbox::handler::CounterQuota;
    use crate::storage::log::{PolledBatch, Record};

    /// The work of a batch of `records` (offsets 0, 1, …), planned.
    fn work_of(records: &[Record]) -> BatchWork {
        let mut batch = PolledBatch::new();
        for (offset, record) in (0..).zip(records) {
            batch.push(offset, record).unwrap();
        }
        let mut input = BatchInput::default();
        for view in batch.iter() {
            let envelope = Envelope::parse(view.headers()).unwrap();
            let number = input.keys.number(envelope.key).unwrap();
            let (origin, tries) = (Origin::single(view.offset()), Tries::fresh(envelope.ordering));
            input.push(number, (envelope, EventTiming::Untimed), origin, tries, view.body().to_vec());
        }
        let mut plan = Plan::default();
        plan.rebuild(&input.plan);
        let mut work = BatchWork::default();
        work.lay_out(&plan, &mut input);
        work
    }

    /// Runs every key of `work` as the one worker, each module's calls
    /// given `time` in the batch.
    fn run(work: &BatchWork, time: Duration) -> WorkerOutcome {
        let config = ConsumerConfig { workers: 1, ..ConsumerConfig::default() };
        let names = ProjectionNames::new("p".into(), vec!["t".into()], RoutedTopics::shared("t"));
        let runner = KeyRunner::new(Arc::new(names), config.clone());
        let modules = modules(Ledger::new());
        let snapshot = Arc::new(StateReader::new(MapSnapshot::default()));
        let budget = BatchBudget::new(&config.payload).batch();
        let counters = CounterQuota::new(&config.payload).batch();
        let call_time = CallTime::new(time, modules.modules().len());
        let timers = TimerQuota::new(&config.payload);
        runner.run_worker(0, work, (0, 1), &snapshot, (&budget, &counters, &timers), &call_time, &modules)
    }

    /// What key `key` wrote to its `balance`, if anything.
    fn balance(outcome: &WorkerOutcome, key: i64) -> Option<String> {
        let (_, written) = outcome.keys.iter().find(|(k, _)| *k == Key::int(key))?;
        let value = written.writes.get("balance")??;
        Some(String::from_utf8(value.to_vec()).unwrap())
    }

    /// The records routed to retry: body, and the attempts they carry.
    fn in_retry(outcome: &WorkerOutcome) -> Vec<(String, u32)> {
        let retry = RoutedTopics::shared("t").retry().to_owned();
        let routed = outcome.routed.iter().filter(|entry| entry.topic == retry).map(|entry| &entry.record);
        let attempts = |record: &crate::storage::log::Record| Routed::parse(&record.headers).unwrap().attempts;
        routed.map(|record| (String::from_utf8_lossy(&record.body).into_owned(), attempts(record))).collect()
    }

    #[test]
    fn each_key_runs_its_events_in_order_into_its_own_scope_in_chunks_of_max_batch() {
        let records =
            [relaxed(1, DEPOSIT, "5"), relaxed(2, DEPOSIT, "1"), relaxed(1, DEPOSIT, "7"), relaxed(1, DEPOSIT, "3")];

        let outcome = run(&work_of(&records), Duration::from_secs(30));

        assert_eq!(balance(&outcome, 1).as_deref(), Some("15"));
        assert_eq!(balance(&outcome, 2).as_deref(), Some("1"));
        assert_eq!(outcome.summary.applied, 4);
        assert_eq!(outcome.summary.calls, 3, "deposits go two a call: [5, 7], [3] and [1]");
        assert!(outcome.routed.is_empty() && outcome.host_fault.is_none());
    }

    #[test]
    fn a_failed_chunk_sends_its_key_and_the_rest_of_its_work_to_retry_while_other_keys_run() {
        let records =
            [relaxed(1, DEPOSIT, "fail"), relaxed(1, DEPOSIT, "2"), relaxed(2, DEPOSIT, "4"), relaxed(1, DEPOSIT, "9")];

        let outcome = run(&work_of(&records), Duration::from_secs(30));

        assert_eq!(balance(&outcome, 1), None, "the failed call's writes are dropped");
        assert_eq!(balance(&outcome, 2).as_deref(), Some("4"));
        assert_eq!(outcome.summary.retry_in, 3);
        let bodies: Vec<String> = in_retry(&outcome).into_iter().map(|(body, _)| body).collect();
        assert_eq!(bodies, ["fail", "2", "9"], "the key's order kept");
    }

    #[test]
    fn a_module_out_of_time_is_not_called_again_and_its_keys_wait_without_losing_an_attempt() {
        let records = [relaxed(1, DEPOSIT, "1"), relaxed(2, DEPOSIT, "2"), relaxed(3, DEPOSIT, "3")];

        let outcome = run(&work_of(&records), Duration::ZERO);

        assert_eq!(outcome.summary.calls, 1, "the first call spends the module's time");
        assert_eq!(outcome.summary.applied, 1);
        assert_eq!(in_retry(&outcome), [("2".to_owned(), 0), ("3".to_owned(), 0)]);
    }
}

#[cfg(test)]
mod tests {
    use super::{Tries, reduced_event_time, reduced_tries};
    use crate::event::Algebra;

    /// A run of the bodies named.
    fn run(names: &[&str]) -> Vec<Vec<u8>> {
        names.iter().map(|name| name.as_bytes().to_vec()).collect()
    }

    #[test]
    fn a_fold_takes_its_first_events_time_and_a_tails_fold_its_last_events() {
        // Release order, so not sorted by time: a late event at 2.
        let (bodies, times) = (run(&["x", "y", "z"]), [Some(5), Some(2), Some(9)]);
        let folded = run(&["xyz"]);
        let time = |closes| reduced_event_time(Algebra::Associative, closes, (&bodies, &times), &folded, 0);
        assert_eq!((time(false), time(true)), (Some(5), Some(9)));
    }

    #[test]
    fn a_record_left_by_dropping_duplicates_takes_the_time_of_the_first_or_for_a_tail_the_last_of_them() {
        let (bodies, times) = (run(&["a", "a", "b", "a", "a"]), [1, 2, 3, 4, 5].map(Some));
        let kept = run(&["a", "b", "a"]);
        let time = |closes, index| reduced_event_time(Algebra::Idempotent, closes, (&bodies, &times), &kept, index);
        assert_eq!([0, 1, 2].map(|index| time(false, index)), [Some(1), Some(3), Some(4)]);
        assert_eq!([0, 1, 2].map(|index| time(true, index)), [Some(2), Some(3), Some(5)]);

        // Sorted by body, each once: by body, not by place.
        let (bodies, times) = (run(&["b", "a", "b"]), [1, 2, 3].map(Some));
        let sorted = run(&["a", "b"]);
        let time = |closes, index| {
            reduced_event_time(Algebra::IdempotentCommutative, closes, (&bodies, &times), &sorted, index)
        };
        assert_eq!([time(false, 0), time(false, 1), time(true, 1)], [Some(2), Some(1), Some(3)]);
        // Sorted without duplicates: still by body.
        let (bodies, times) = (run(&["b", "a"]), [1, 2].map(Some));
        let sorted = run(&["a", "b"]);
        let time = |index| reduced_event_time(Algebra::IdempotentCommutative, false, (&bodies, &times), &sorted, index);
        assert_eq!([time(0), time(1)], [Some(2), Some(1)]);
    }

    #[test]
    fn a_reduced_record_carries_the_tries_of_the_events_it_stands_for() {
        let tries = |attempts| Tries { attempts, first_failed_at_ms: u64::from(attempts) * 10, ordering: None };
        let attempts = |algebra, bodies: &[Vec<u8>], reduced: &[Vec<u8>], each: &[u32]| {
            let each: Vec<Tries> = each.iter().map(|&a| tries(a)).collect();
            reduced_tries(algebra, (bodies, &each), reduced).iter().map(|t| t.attempts).collect::<Vec<_>>()
        };
        // Sorted, no duplicate dropped: by body, not by index.
        assert_eq!(attempts(Algebra::IdempotentCommutative, &run(&["b", "a"]), &run(&["a", "b"]), &[3, 0]), [0, 3]);
        let (bodies, sorted) = (run(&["c", "a", "c", "b"]), run(&["a", "b", "c"]));
        assert_eq!(attempts(Algebra::IdempotentCommutative, &bodies, &sorted, &[1, 0, 4, 2]), [0, 2, 4]);
        let (bodies, kept) = (run(&["a", "a", "b", "a"]), run(&["a", "b", "a"]));
        assert_eq!(attempts(Algebra::Idempotent, &bodies, &kept, &[1, 2, 0, 5]), [2, 0, 5]);
        assert_eq!(attempts(Algebra::Associative, &bodies, &run(&["aaba"]), &[1, 2, 0, 5]), [5]);
        // The earliest first failure of those merged.
        let merged = reduced_tries(Algebra::Idempotent, (&bodies, &[tries(1), tries(2), tries(0), tries(5)]), &kept);
        assert_eq!(merged[0].first_failed_at_ms, 10);
    }

    #[test]
    fn a_record_left_as_it_came_keeps_its_own_time() {
        let (bodies, times) = (run(&["x", "y"]), [Some(7), None]);
        for algebra in [Algebra::NonAssociative, Algebra::Commutative, Algebra::Idempotent, Algebra::Associative] {
            let time = |index| reduced_event_time(algebra, true, (&bodies, &times), &bodies, index);
            assert_eq!([time(0), time(1)], [Some(7), None], "{algebra:?}");
        }
    }
}
