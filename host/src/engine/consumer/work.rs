//! A batch's data as it goes from the planner to the workers: what a
//! partition keeps from one batch to the next ([`BatchBuffers`]), the
//! planner's input index for index ([`BatchInput`]), and the plan laid out
//! key by key and run by run for the workers to borrow ([`BatchWork`],
//! [`KeyWork`], [`RunWork`]).
//!
//! Rules kept here:
//! - **Nothing of one batch is read by the next**: every buffer is emptied
//!   at the start of a batch, its allocations kept.
//! - **A key is a number per batch, never its hash**: each distinct key of
//!   the batch gets its own number in order of first appearance
//!   ([`KeyTable`]), so two keys never share a run whatever their hashes.
//! - **Work goes round-robin**: keys go to workers in order of first
//!   appearance; a key's runs stay together, in execution order.

use std::collections::HashMap;
use std::ops::Range;

use super::failure::Tries;
use super::key_table::KeyTable;
use crate::event::Envelope;
use crate::event::{Algebra, EventAtomicOrdering, EventTiming, EventTypeTag};
use crate::key::Key;
use crate::plan::{Plan, PlanRecord, Stage};
use crate::reduce::Origin;
use wakuwaku_core::time_order::TimeOrder;
use wakuwaku_core::timers::Place;

/// What a partition keeps from one batch to the next, so that the next
/// batch refills these vectors, maps and the plan instead of allocating
/// them again. Emptied at the start of each batch: nothing of one batch is
/// read by the next.
#[derive(Default)]
pub(super) struct BatchBuffers {
    pub(super) input: BatchInput,
    pub(super) plan: Plan,
    pub(super) work: BatchWork,
}

/// What a batch hands the planner and the workers, index for index.
///
/// The planner groups records by a number per key: each distinct key of
/// the batch (its canonical bytes) gets its own, in order of first
/// appearance, so two keys never share one whatever their hashes.
#[derive(Default)]
pub(super) struct BatchInput {
    /// The planner's records: each one's ordering fenced by `time_order`.
    pub(super) plan: Vec<PlanRecord>,
    /// Each record's declared ordering, which it keeps outside the plan.
    pub(super) orderings: Vec<EventAtomicOrdering>,
    /// The fences that keep each key's timed events in the order given.
    pub(super) time_order: TimeOrder,
    /// The batch's keys, by the number their records carry in `plan`.
    pub(super) keys: KeyTable,
    pub(super) algebras: Vec<Algebra>,
    pub(super) origins: Vec<Origin>,
    pub(super) bodies: Vec<Vec<u8>>,
    /// Attempts each record has had (records taken from retry).
    pub(super) attempts: Vec<Tries>,
    /// Each record's event time, as its type declares it: kept in the
    /// records it goes to retry or the dead-letter topic as.
    pub(super) event_times: Vec<Option<i64>>,
    /// Each record's place among its key's timers ([`Place`]).
    pub(super) places: Vec<Place>,
}

impl BatchInput {
    /// Empties every vector and the key table, keeping their allocations.
    pub(super) fn clear(&mut self) {
        let Self { plan, orderings, time_order, keys, algebras, origins, bodies, attempts, event_times, places } = self;
        plan.clear();
        places.clear();
        orderings.clear();
        time_order.clear();
        keys.clear();
        algebras.clear();
        origins.clear();
        bodies.clear();
        attempts.clear();
        event_times.clear();
    }

    /// Appends a record whose key has `number` in [`BatchInput::keys`] and
    /// whose type declares `timing`, with no place among its key's timers
    /// ([`BatchInput::push_placed`]).
    pub(super) fn push(
        &mut self,
        number: u32,
        (envelope, timing): (Envelope<'_>, EventTiming),
        origin: Origin,
        attempts: Tries,
        body: Vec<u8>,
    ) {
        self.push_placed(number, (envelope, timing), (origin, Place::Anywhere), attempts, body);
    }

    /// Appends a record as [`BatchInput::push`] does, at `place` among its
    /// key's timers.
    pub(super) fn push_placed(
        &mut self,
        number: u32,
        (envelope, timing): (Envelope<'_>, EventTiming),
        (origin, place): (Origin, Place),
        attempts: Tries,
        body: Vec<u8>,
    ) {
        self.places.push(place);
        let key = u64::from(number);
        let ordering = self.time_order.planned(key, envelope.tag, timing, envelope.ordering);
        self.plan.push(PlanRecord { key, tag: envelope.tag, ordering });
        self.orderings.push(envelope.ordering);
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
    places: Vec<Place>,
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
    pub(super) fn lay_out(&mut self, plan: &Plan, input: &mut BatchInput) {
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
                            self.places.push(input.places[index]);
                            self.inputs.push(index);
                        }
                        let first = records[0];
                        self.runs.push(RunWork {
                            tag: run.tag(),
                            stage: stage_index,
                            ordering: input.orderings[first],
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
    pub(super) fn clear(&mut self) {
        let Self { keys, runs, bodies, origins, attempts, event_times, places, inputs, retry: _ } = self;
        keys.clear();
        places.clear();
        runs.clear();
        bodies.clear();
        origins.clear();
        attempts.clear();
        event_times.clear();
        inputs.clear();
    }

    /// Adds keys that have no records in the batch, only timers due
    /// ([`super::timer_clock`]): each one not in the batch yet gets a
    /// [`KeyWork`] without runs, after the keys with records.
    pub(super) fn add_timer_keys(&mut self, keys: impl IntoIterator<Item = Key>) {
        let known: std::collections::HashSet<Key> = self.keys.iter().map(|work| work.key.clone()).collect();
        let end = self.runs.len();
        for key in keys {
            if !known.contains(&key) {
                self.keys.push(KeyWork { key, runs: end..end });
            }
        }
    }

    /// A key's records' places among its timers, in execution order (its
    /// runs' records one after another).
    pub(super) fn places(&self, key: &KeyWork) -> &[Place] {
        let runs = &self.runs[key.runs.clone()];
        match (runs.first(), runs.last()) {
            (Some(first), Some(last)) => &self.places[first.records.start..last.records.end],
            _ => &[],
        }
    }

    /// How many workers share the batch: `workers`, but no more than it
    /// has keys, and at least one.
    pub(super) fn workers(&self, workers: usize) -> usize {
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

/// One key of a batch: its runs in [`BatchWork`], in execution order.
pub(super) struct KeyWork {
    pub(super) key: Key,
    pub(super) runs: Range<usize>,
}

/// One run of a key: its records in [`BatchWork`].
#[derive(Clone)]
pub(super) struct RunWork {
    pub(super) tag: EventTypeTag,
    /// Which stage of the key's execution the run belongs to.
    pub(super) stage: usize,
    /// The ordering and algebra its first record carried.
    pub(super) ordering: EventAtomicOrdering,
    pub(super) algebra: Algebra,
    /// Whether it is its segment's tail (it closes the segment).
    pub(super) closes: bool,
    /// Its records' bodies, origins and attempts.
    pub(super) records: Range<usize>,
}
