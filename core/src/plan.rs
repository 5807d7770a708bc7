//! The planner: turns a polled batch into an execution plan that keeps the
//! order `spec/ordering.md` asks for, and as little more as it can.
//!
//! # Purpose
//!
//! A log partition is totally ordered, but business logic only cares about
//! the order of the events of one key. The planner reads three headers of
//! every record of a batch (key, type tag, ordering; bodies are never
//! decoded) and groups the records so that the consumer can process keys
//! concurrently and hand every handler call a run of events of one key and
//! one type, which its algebra may then reduce.
//!
//! The planner is pure: [`PlanRecord`]s in, a [`Plan`] of indices into the
//! input slice out. No I/O, no clock, nothing to mock.
//!
//! # What a plan promises
//!
//! - **Keys are independent.** [`Plan::keys`] lists every key of the batch
//!   once, in order of first appearance. Nothing of one key waits for
//!   another key, so keys may run concurrently.
//! - **Segments run one after another.** [`Plan::segments`] of a key are in
//!   log order: every record of a segment is applied before any record of the
//!   next one. Each segment covers a consecutive stretch of its key's records.
//! - **Head, then body, then tail.** Inside a segment, the head run
//!   ([`Plan::head`], optional) runs first, then every body run
//!   ([`Plan::body`], any number, concurrently and in any order), then the
//!   tail run ([`Plan::tail`], optional). [`Plan::stages`] yields them in
//!   that order.
//! - **A run is one key, one type, in log order.** [`Plan::records`] of a run
//!   are indices into the input slice, increasing. A run holds *every* record
//!   of its type in its segment, so a type has at most one run per segment.
//! - **Every record is planned exactly once.**
//!
//! Together these keep **every required order**. The spec requires an
//! earlier record to be applied before a later one ([`must_precede`]) when
//! both have the same key and
//! 1. they have the same type (events of one type never swap), or
//! 2. the earlier one acquires ([`Acquire`] or [`AcqRel`]: later events
//!    depend on it), or
//! 3. the later one releases ([`Release`] or [`AcqRel`]: it depends on
//!    everything before it).
//!
//! The plan keeps such a pair in order: the earlier record is in an earlier
//! segment, or in an earlier stage of the same segment, or before the later
//! one in the same run. The exhaustive test at the bottom of this file checks
//! exactly that for every batch of up to five records over two keys, three
//! types and four orderings.
//!
//! # How fences cut segments
//!
//! The planner walks each key's records in log order. The current segment is
//! either *open* (it takes more records) or *closed* (the next record starts
//! a new segment). A record joins a segment by joining the run of its own
//! type there, creating the run if the type is new to the segment.
//!
//! - **[`Relaxed`]** joins the open segment, in the run of its type, which
//!   may be the head run. With no open segment it starts a new one, as a body
//!   run.
//! - **[`Acquire`]** and **[`AcqRel`]** always start a new segment; their
//!   run is the head. The segment stays open, so later Relaxed records join
//!   it and a later Release may end it. Only a Release closes a segment.
//!   That is all the full barrier of AcqRel (nothing passes it in either
//!   direction) needs: every earlier record of the key is in an earlier
//!   segment, and every later one follows it in the head run, or is in a
//!   later stage of its segment, or in a later segment.
//! - **[`Release`]** joins the open segment, its run becomes the tail (a body
//!   run of its type moves there), and the segment closes. With no open
//!   segment it gets a segment of its own, whose tail is its run.
//! - **The corner case:** if the Release's type is already the head of the
//!   open segment and the segment also holds other types, the Release gets a
//!   segment of its own (as its tail), because one run cannot be both first
//!   and last. If the segment holds only that type, the Release simply joins
//!   the head run and closes the segment: there is nothing to order against.
//!
//! Because a run gathers every record of its type in the segment, a Relaxed
//! record can land in the head or tail run of its type:
//! - in `[B, A (Acquire), B, A]`, the second A joins the head run of the
//!   second segment and is applied before the second B;
//! - in `[A, B, A (Release), B]`, the first A is in the tail run of the first
//!   segment and is applied after the first B; the second B starts the next
//!   segment.
//!
//! Both are allowed: a Relaxed record may pass records of other types, and
//! records of one type never swap.
//!
//! # Where the planner is stricter than required, and why
//!
//! - **Segments are total.** A Relaxed record after a Release waits for the
//!   Release, and a Relaxed record before an Acquire is applied before it,
//!   although the spec requires neither. A list of segments is the execution
//!   model of the spec, simple to run, retry and divert; and the runs of one
//!   key execute one after another anyway, so the extra order costs no
//!   concurrency, only some reduction (runs end at every cut).
//! - **Runs are whole.** A Relaxed record that joins a head run is applied
//!   before body runs it need not precede, and one whose run becomes the
//!   tail waits for body runs it need not follow. In exchange a type has one
//!   run per segment: fewer handler calls and longer runs to reduce.
//! - **The corner case** cuts a segment that a finer plan could avoid: the
//!   Release's own segment waits for the body runs, which the spec requires,
//!   and for nothing else.
//! - **Keys are compared by hash.** Two keys whose hashes collide share one
//!   key in the plan and are ordered against each other. That only adds
//!   order, never removes it, so a collision costs concurrency, not
//!   correctness.
//!
//! # Cost
//!
//! Linear in the batch: one hash lookup per record to give its key a dense
//! index, a counting sort of the records by key, one walk per key that
//! assigns each record a run through a small per-segment table of types
//! (scanned linearly; it spills to a hash map when a segment holds many
//! types), and a counting sort inside each segment so that every run is a
//! contiguous slice of one vector. The plan is a handful of flat vectors; no
//! allocation per key, segment or run, and [`Plan::rebuild`] reuses them from
//! one batch to the next.
//!
//! [`Relaxed`]: EventAtomicOrdering::Relaxed
//! [`Acquire`]: EventAtomicOrdering::Acquire
//! [`Release`]: EventAtomicOrdering::Release
//! [`AcqRel`]: EventAtomicOrdering::AcqRel

use std::fmt;

use rustc_hash::FxHashMap;

use crate::event::{EventAtomicOrdering, EventTypeTag, KeyHash};

/// What the planner reads from one message: its key, type tag and
/// ordering, all from headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanRecord {
    /// Which key the event belongs to: records with equal numbers are
    /// planned as one key. The consumer gives each distinct key of a batch
    /// (its canonical bytes, [`crate::key::Key`]) a number of its own, so
    /// two keys never share a run, whatever their hashes; the page's tests
    /// use the account number itself.
    pub key: KeyHash,
    /// The event type; a run holds records of one tag.
    pub tag: EventTypeTag,
    /// The ordering this message declares; it decides where segments are cut.
    pub ordering: EventAtomicOrdering,
}

/// Whether the spec requires `earlier` (lower log index) to be applied
/// before `later`: same key, and the same type, or `earlier` acquires, or
/// `later` releases.
///
/// Every [`Plan`] keeps every such pair in order.
pub fn must_precede(earlier: &PlanRecord, later: &PlanRecord) -> bool {
    earlier.key == later.key && (earlier.tag == later.tag || earlier.ordering.acquires() || later.ordering.releases())
}

/// The execution plan of one batch: keys ▸ segments ▸ head, body and tail
/// runs ▸ record indices. See the [module documentation](self).
///
/// Held as flat vectors; the handles ([`PlanKey`], [`Segment`], [`Run`])
/// are ranges into them and only mean something to the plan they came from.
#[derive(Default, Clone)]
pub struct Plan {
    keys: Vec<PlanKey>,
    segments: Vec<Segment>,
    runs: Vec<Run>,
    /// Record indices, grouped by run; runs are stored key by key, segment
    /// by segment, in execution order.
    indices: Vec<usize>,
    scratch: Scratch,
}

/// One key of a plan: its hash and its segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanKey {
    hash: KeyHash,
    segments_start: u32,
    segments_end: u32,
}

impl PlanKey {
    /// The key number ([`PlanRecord::key`]) every record of this key carries.
    pub fn key_hash(&self) -> KeyHash {
        self.hash
    }
}

/// One segment of a key: an optional head run, any number of body runs and
/// an optional tail run. Segments of a key run strictly one after another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// The segment's runs in `Plan::runs`: head, body runs, tail.
    runs_start: u32,
    runs_end: u32,
    has_head: bool,
    has_tail: bool,
}

/// Every record of one type, one key and one segment, in log order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    tag: EventTypeTag,
    /// The run's records in `Plan::indices`.
    start: u32,
    end: u32,
}

impl Run {
    /// The event type of every record in the run.
    pub fn tag(&self) -> EventTypeTag {
        self.tag
    }

    /// How many records the run holds; at least one.
    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    /// Always false: a run exists because a record is in it.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// One step of a segment's execution, from [`Plan::stages`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage<'a> {
    /// The head run: runs before everything else of the segment.
    Head(&'a Run),
    /// The body runs: run after the head and before the tail, concurrently
    /// and in any order among themselves.
    Body(&'a [Run]),
    /// The tail run: runs after everything else of the segment.
    Tail(&'a Run),
}

impl Plan {
    /// Plans a batch. `records` are in log order; the plan refers to them by
    /// index.
    ///
    /// # Panics
    /// If the batch holds more than `u32::MAX` records.
    pub fn new(records: &[PlanRecord]) -> Plan {
        let mut plan = Plan::default();
        plan.rebuild(records);
        // A plan built once does not keep its working buffers.
        plan.scratch = Scratch::default();
        plan
    }

    /// Replaces this plan with the plan of `records`, reusing its
    /// allocations: what a consumer does once per polled batch. The plan
    /// keeps its working buffers for the next call (about 20 bytes per
    /// record of the largest batch so far).
    ///
    /// # Panics
    /// If the batch holds more than `u32::MAX` records.
    pub fn rebuild(&mut self, records: &[PlanRecord]) {
        assert!(u32::try_from(records.len()).is_ok(), "a batch holds at most u32::MAX records");
        let Plan { keys, segments, runs, indices, scratch } = self;
        keys.clear();
        segments.clear();
        runs.clear();
        indices.clear();
        indices.resize(records.len(), 0);
        let Scratch { key_index, key_of, key_ends, by_key, builder } = scratch;

        // Dense key indices in order of first appearance, and their counts.
        key_index.clear();
        key_of.clear();
        key_ends.clear();
        let mut last: Option<(KeyHash, u32)> = None;
        for record in records {
            let dense = match last {
                Some((hash, dense)) if hash == record.key => dense,
                _ => {
                    let next = keys.len() as u32;
                    let dense = *key_index.entry(record.key).or_insert_with(|| {
                        keys.push(PlanKey { hash: record.key, segments_start: 0, segments_end: 0 });
                        key_ends.push(0);
                        next
                    });
                    last = Some((record.key, dense));
                    dense
                }
            };
            key_ends[dense as usize] += 1;
            key_of.push(dense);
        }

        // Counting sort of record indices by key; stable, so each key's
        // records stay in log order. Afterwards `key_ends[k]` is where key
        // `k`'s records end in `by_key`.
        let mut start = 0;
        for count in key_ends.iter_mut() {
            let len = *count;
            *count = start;
            start += len;
        }
        by_key.clear();
        let unset = Sorted { index: 0, tag: EventTypeTag::new(0), ordering: EventAtomicOrdering::Relaxed };
        by_key.resize(records.len(), unset);
        for (index, (record, &dense)) in records.iter().zip(key_of.iter()).enumerate() {
            let cursor = &mut key_ends[dense as usize];
            by_key[*cursor as usize] = Sorted { index: index as u32, tag: record.tag, ordering: record.ordering };
            *cursor += 1;
        }

        // One walk per key, cutting segments at the fences.
        builder.slot_of.clear();
        builder.slot_of.resize(records.len(), 0);
        let mut out = Output { segments, runs, indices };
        let mut key_start = 0usize;
        for (key, &key_end) in keys.iter_mut().zip(key_ends.iter()) {
            let key_end = key_end as usize;
            key.segments_start = out.segments.len() as u32;
            builder.state = State::None;
            for position in key_start..key_end {
                let Sorted { tag, ordering, .. } = by_key[position];
                let slot = builder.place(position, tag, ordering, &mut out, by_key);
                builder.slot_of[position] = slot;
            }
            if builder.state != State::None {
                builder.finish(key_end, &mut out, by_key);
            }
            key.segments_end = out.segments.len() as u32;
            key_start = key_end;
        }
    }

    /// Every key of the batch, once, in order of first appearance.
    pub fn keys(&self) -> &[PlanKey] {
        &self.keys
    }

    /// The segments of `key`, in the order they must run: one after another.
    pub fn segments(&self, key: &PlanKey) -> &[Segment] {
        &self.segments[key.segments_start as usize..key.segments_end as usize]
    }

    /// The head run of `segment`, which runs first, if it has one.
    pub fn head(&self, segment: &Segment) -> Option<&Run> {
        segment.has_head.then(|| &self.runs[segment.runs_start as usize])
    }

    /// The body runs of `segment`, in order of first appearance in the
    /// segment. They run after the head and before the tail, concurrently
    /// and in any order among themselves.
    pub fn body(&self, segment: &Segment) -> &[Run] {
        let start = segment.runs_start as usize + usize::from(segment.has_head);
        let end = segment.runs_end as usize - usize::from(segment.has_tail);
        &self.runs[start..end]
    }

    /// The tail run of `segment`, which runs last, if it has one.
    pub fn tail(&self, segment: &Segment) -> Option<&Run> {
        segment.has_tail.then(|| &self.runs[segment.runs_end as usize - 1])
    }

    /// The stages of `segment` in execution order: head, body, tail, leaving
    /// out an absent head or tail and an empty body.
    pub fn stages<'a>(&'a self, segment: &Segment) -> impl Iterator<Item = Stage<'a>> + use<'a> {
        let body = self.body(segment);
        self.head(segment)
            .map(Stage::Head)
            .into_iter()
            .chain((!body.is_empty()).then_some(Stage::Body(body)))
            .chain(self.tail(segment).map(Stage::Tail))
    }

    /// The records of `run`: indices into the planned slice, in log order.
    pub fn records(&self, run: &Run) -> &[usize] {
        &self.indices[run.start as usize..run.end as usize]
    }

    /// How many records the plan holds: the length of the planned batch.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether the planned batch was empty.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
}

impl fmt::Debug for Plan {
    /// Nested: key ▸ segments ▸ stages ▸ runs as `tag [indices]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct RunView<'a>(&'a Plan, &'a Run);
        impl fmt::Debug for RunView<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "tag {} {:?}", self.1.tag, self.0.records(self.1))
            }
        }
        struct SegmentView<'a>(&'a Plan, &'a Segment);
        impl fmt::Debug for SegmentView<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let (plan, segment) = (self.0, self.1);
                let mut s = f.debug_struct("Segment");
                if let Some(head) = plan.head(segment) {
                    s.field("head", &RunView(plan, head));
                }
                let body: Vec<_> = plan.body(segment).iter().map(|run| RunView(plan, run)).collect();
                if !body.is_empty() {
                    s.field("body", &body);
                }
                if let Some(tail) = plan.tail(segment) {
                    s.field("tail", &RunView(plan, tail));
                }
                s.finish()
            }
        }
        struct KeyView<'a>(&'a Plan, &'a PlanKey);
        impl fmt::Debug for KeyView<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list()
                    .entries(self.0.segments(self.1).iter().map(|segment| SegmentView(self.0, segment)))
                    .finish()
            }
        }
        f.debug_map().entries(self.keys.iter().map(|key| (key.hash, KeyView(self, key)))).finish()
    }
}

/// Buffers that only live during [`Plan::rebuild`], kept for the next batch.
#[derive(Default, Clone)]
struct Scratch {
    /// Key number → dense key index.
    key_index: FxHashMap<KeyHash, u32>,
    /// Per record: its dense key index.
    key_of: Vec<u32>,
    /// Per dense key: its record count, then where its records end in
    /// `by_key`.
    key_ends: Vec<u32>,
    /// The records grouped by key, each key's in log order.
    by_key: Vec<Sorted>,
    builder: SegmentBuilder,
}

/// A record as the walk over a key reads it. Copying the type and ordering
/// next to the index keeps that walk a sequential read instead of a random
/// access into the batch per record.
#[derive(Debug, Clone, Copy)]
struct Sorted {
    /// Index of the record in the batch.
    index: u32,
    tag: EventTypeTag,
    ordering: EventAtomicOrdering,
}

/// The plan's vectors, as [`SegmentBuilder::finish`] appends to them.
struct Output<'a> {
    segments: &'a mut Vec<Segment>,
    runs: &'a mut Vec<Run>,
    indices: &'a mut Vec<usize>,
}

/// Whether the current key has a segment, and whether it takes more records.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The key has no segment yet.
    #[default]
    None,
    /// The current segment takes more records.
    Open,
    /// The current segment is closed: the next record starts a new one.
    Closed,
}

/// A segment's table of types has at most this many entries before lookups
/// go through a hash map instead of a linear scan.
const SCAN_LIMIT: usize = 16;

/// The segment being built for the key being walked.
#[derive(Default, Clone)]
struct SegmentBuilder {
    state: State,
    /// Where the segment begins in `by_key`.
    start: usize,
    /// The segment's runs in order of first appearance ("slots"): type and
    /// record count. The head, when there is one, is slot 0.
    slots: Vec<(EventTypeTag, u32)>,
    /// Type → slot, filled only once `slots` outgrows [`SCAN_LIMIT`].
    spill: FxHashMap<EventTypeTag, u32>,
    has_head: bool,
    tail: Option<u32>,
    /// Per position in `by_key`: the slot of the record's run.
    slot_of: Vec<u32>,
    /// Per slot: the next free place in the plan's indices.
    cursor: Vec<u32>,
}

impl SegmentBuilder {
    /// Places the record at `position` of `by_key` and returns its slot,
    /// finishing the previous segment if the record starts a new one.
    #[inline]
    fn place(
        &mut self,
        position: usize,
        tag: EventTypeTag,
        ordering: EventAtomicOrdering,
        out: &mut Output<'_>,
        by_key: &[Sorted],
    ) -> u32 {
        match ordering {
            EventAtomicOrdering::Relaxed => {
                if self.state != State::Open {
                    self.begin(position, out, by_key);
                }
                self.slot(tag)
            }
            EventAtomicOrdering::Acquire | EventAtomicOrdering::AcqRel => {
                // AcqRel releases too, but starting the segment is enough:
                // everything before it is in earlier segments.
                self.begin(position, out, by_key);
                self.has_head = true;
                self.slot(tag)
            }
            EventAtomicOrdering::Release => {
                let release_on_head = self.has_head && self.slots[0].0 == tag;
                if self.state == State::Open && !(release_on_head && self.slots.len() > 1) {
                    let slot = self.slot(tag);
                    if !release_on_head {
                        self.tail = Some(slot);
                    }
                    self.state = State::Closed;
                    slot
                } else {
                    // No open segment, or the corner case: a segment of its own.
                    self.begin(position, out, by_key);
                    self.state = State::Closed;
                    self.tail = Some(0);
                    self.slot(tag)
                }
            }
        }
    }

    /// Finishes the current segment, if any, and opens an empty one at
    /// `position`.
    fn begin(&mut self, position: usize, out: &mut Output<'_>, by_key: &[Sorted]) {
        if self.state != State::None {
            self.finish(position, out, by_key);
        }
        self.state = State::Open;
        self.start = position;
        self.slots.clear();
        if !self.spill.is_empty() {
            self.spill.clear();
        }
        self.has_head = false;
        self.tail = None;
    }

    /// The slot of `tag`'s run in the current segment, counting one more
    /// record in it; a new slot if the type is new to the segment.
    #[inline]
    fn slot(&mut self, tag: EventTypeTag) -> u32 {
        let found = if self.slots.len() <= SCAN_LIMIT {
            // Without an early exit: types arrive in no predictable order,
            // and a short scan without branches beats a mispredicted one.
            let mut found = None;
            for (slot, &(t, _)) in self.slots.iter().enumerate() {
                if t == tag {
                    found = Some(slot as u32);
                }
            }
            found
        } else {
            self.spill.get(&tag).copied()
        };
        if let Some(slot) = found {
            self.slots[slot as usize].1 += 1;
            return slot;
        }
        let slot = self.slots.len() as u32;
        self.slots.push((tag, 1));
        if self.slots.len() > SCAN_LIMIT {
            if self.spill.is_empty() {
                self.spill.extend(self.slots.iter().enumerate().map(|(slot, &(t, _))| (t, slot as u32)));
            } else {
                self.spill.insert(tag, slot);
            }
        }
        slot
    }

    /// Appends the current segment, which ends at `end` in `by_key`, to the
    /// plan: its runs in execution order, and its record indices grouped by
    /// run. The segment's indices take the same places in the plan as its
    /// records do in `by_key`.
    fn finish(&mut self, end: usize, out: &mut Output<'_>, by_key: &[Sorted]) {
        let runs_start = out.runs.len() as u32;
        self.cursor.clear();
        self.cursor.resize(self.slots.len(), 0);
        let mut next = self.start as u32;
        let mut push = |slot: usize| {
            let (tag, count) = self.slots[slot];
            self.cursor[slot] = next;
            out.runs.push(Run { tag, start: next, end: next + count });
            next += count;
        };
        let body_start = if self.has_head {
            push(0);
            1
        } else {
            0
        };
        for slot in body_start..self.slots.len() {
            if self.tail != Some(slot as u32) {
                push(slot);
            }
        }
        if let Some(tail) = self.tail {
            push(tail as usize);
        }
        out.segments.push(Segment {
            runs_start,
            runs_end: out.runs.len() as u32,
            has_head: self.has_head,
            has_tail: self.tail.is_some(),
        });
        for (sorted, &slot) in by_key[self.start..end].iter().zip(&self.slot_of[self.start..end]) {
            let cursor = &mut self.cursor[slot as usize];
            out.indices[*cursor as usize] = sorted.index as usize;
            *cursor += 1;
        }
    }
}

/// Helpers for tests: a checker that a plan keeps every order the spec
/// requires.
///
/// Compiled for this crate's tests, and public with the `test-support`
/// feature, for tests and fuzz targets elsewhere (the `planner` fuzz target
/// runs it on every input). A feature rather than an always-public hidden
/// module: the checker is quadratic in the batch and only meant for tests,
/// so normal builds neither compile it nor offer it.
#[cfg(any(test, feature = "test-support"))]
pub mod test_support {
    use super::{EventTypeTag, Plan, PlanRecord, Stage, must_precede};

    /// Checks `plan` against `records` and returns why it is wrong, with the
    /// input and the plan: every record planned exactly once; every run of
    /// one key and one type, in log order; a type at most once per segment;
    /// keys once each, in order of first appearance; segments over
    /// consecutive stretches of their key's records; and every pair that
    /// [`must_precede`] kept in the plan's order.
    pub fn check_plan(records: &[PlanRecord], plan: &Plan) -> Result<(), String> {
        PlanChecker::default().check(records, plan)
    }

    /// Where a record sits in a plan.
    #[derive(Debug, Clone, Copy)]
    struct Place {
        segment: usize,
        /// Head 0, body 1, tail 2.
        stage: u8,
        run: usize,
        position: usize,
    }

    /// [`check_plan`] with buffers reused across calls.
    #[derive(Default)]
    pub struct PlanChecker {
        places: Vec<Option<Place>>,
        tags: Vec<EventTypeTag>,
    }

    impl PlanChecker {
        /// See [`check_plan`].
        pub fn check(&mut self, records: &[PlanRecord], plan: &Plan) -> Result<(), String> {
            self.check_quietly(records, plan).map_err(|why| format!("{why}\n  input: {records:?}\n  plan: {plan:?}"))
        }

        // One rule of the specification after another, each with its own
        // message; split up, they would only pass the same buffers around.
        fn check_quietly(&mut self, records: &[PlanRecord], plan: &Plan) -> Result<(), String> {
            self.places.clear();
            self.places.resize(records.len(), None);
            if plan.len() != records.len() {
                return Err(format!("plan holds {} records, input {}", plan.len(), records.len()));
            }
            let mut run_id = 0;
            let mut segment_id = 0;
            let mut previous_first = None;
            for key in plan.keys() {
                let mut key_first = None;
                let mut segment_min = 0;
                if plan.segments(key).is_empty() {
                    return Err(format!("key {} has no segment", key.key_hash()));
                }
                for segment in plan.segments(key) {
                    let (mut lo, mut hi) = (usize::MAX, 0);
                    self.tags.clear();
                    let mut stages = 0;
                    for stage in plan.stages(segment) {
                        stages += 1;
                        let (stage, runs) = match stage {
                            Stage::Head(run) => (0, std::slice::from_ref(run)),
                            Stage::Body(runs) => (1, runs),
                            Stage::Tail(run) => (2, std::slice::from_ref(run)),
                        };
                        for run in runs {
                            if run.is_empty() || run.len() != plan.records(run).len() {
                                return Err(format!("run {run:?} has a wrong length"));
                            }
                            if self.tags.contains(&run.tag()) {
                                return Err(format!("tag {} has two runs in one segment", run.tag()));
                            }
                            self.tags.push(run.tag());
                            let mut last = None;
                            for (position, &index) in plan.records(run).iter().enumerate() {
                                let Some(record) = records.get(index) else {
                                    return Err(format!("index {index} is out of the batch"));
                                };
                                if record.key != key.key_hash() || record.tag != run.tag() {
                                    return Err(format!("record {index} is in a run of another key or type"));
                                }
                                if last.is_some_and(|last| last >= index) {
                                    return Err(format!("run {:?} is not in log order", plan.records(run)));
                                }
                                last = Some(index);
                                if self.places[index]
                                    .replace(Place { segment: segment_id, stage, run: run_id, position })
                                    .is_some()
                                {
                                    return Err(format!("record {index} is planned twice"));
                                }
                                lo = lo.min(index);
                                hi = hi.max(index);
                            }
                            run_id += 1;
                        }
                    }
                    if stages == 0 {
                        return Err("a segment has no run".into());
                    }
                    if lo < segment_min {
                        return Err(format!("segments of key {} overlap in log order", key.key_hash()));
                    }
                    segment_min = hi;
                    key_first.get_or_insert(lo);
                    segment_id += 1;
                }
                let first = key_first.unwrap_or_default();
                if previous_first.is_some_and(|previous| previous >= first) {
                    return Err("keys are not in order of first appearance".into());
                }
                previous_first = Some(first);
                // A key is listed once: its first record comes first.
                if records[..first].iter().any(|record| record.key == key.key_hash()) {
                    return Err(format!("key {} misses its first record", key.key_hash()));
                }
            }
            if let Some(index) = self.places.iter().position(Option::is_none) {
                return Err(format!("record {index} is not planned"));
            }
            for (j, later) in records.iter().enumerate() {
                for (i, earlier) in records[..j].iter().enumerate() {
                    if !must_precede(earlier, later) {
                        continue;
                    }
                    let (a, b) = (self.places[i].unwrap(), self.places[j].unwrap());
                    let kept = a.segment < b.segment
                        || (a.segment == b.segment
                            && (a.stage < b.stage || (a.run == b.run && a.position < b.position)));
                    if !kept {
                        return Err(format!("record {i} must precede record {j}, but the plan does not order them so"));
                    }
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{PlanChecker, check_plan};
    use super::*;
    use EventAtomicOrdering::{AcqRel, Acquire, Relaxed, Release};

    const A: EventTypeTag = EventTypeTag::new(1);
    const B: EventTypeTag = EventTypeTag::new(2);
    const C: EventTypeTag = EventTypeTag::new(3);

    fn record(key: KeyHash, tag: EventTypeTag, ordering: EventAtomicOrdering) -> PlanRecord {
        PlanRecord { key, tag, ordering }
    }

    /// Plans and checks `batch`.
    fn plan(batch: &[PlanRecord]) -> Plan {
        let plan = Plan::new(batch);
        check_plan(batch, &plan).unwrap();
        plan
    }

    /// A segment as (head, body, tail) record lists, for comparing.
    type Shape = (Option<Vec<usize>>, Vec<Vec<usize>>, Option<Vec<usize>>);

    /// The shape of every segment of the only key.
    fn shape(plan: &Plan) -> Vec<Shape> {
        let [key] = plan.keys() else { panic!("expected one key: {plan:?}") };
        plan.segments(key)
            .iter()
            .map(|segment| {
                (
                    plan.head(segment).map(|run| plan.records(run).to_vec()),
                    plan.body(segment).iter().map(|run| plan.records(run).to_vec()).collect(),
                    plan.tail(segment).map(|run| plan.records(run).to_vec()),
                )
            })
            .collect()
    }

    #[test]
    fn worked_example_of_the_spec() {
        const OPENED: EventTypeTag = EventTypeTag::new(1);
        const DEPOSITED: EventTypeTag = EventTypeTag::new(2);
        const WITHDRAWN: EventTypeTag = EventTypeTag::new(3);
        const CLOSED: EventTypeTag = EventTypeTag::new(4);
        let batch = [
            record(42, OPENED, Acquire),
            record(42, DEPOSITED, Relaxed),
            record(7, DEPOSITED, Relaxed),
            record(42, WITHDRAWN, Relaxed),
            record(42, DEPOSITED, Relaxed),
            record(42, CLOSED, Release),
            record(42, OPENED, Acquire),
            record(42, DEPOSITED, Relaxed),
        ];
        let plan = plan(&batch);
        let [account_42, account_7] = plan.keys() else { panic!("{plan:?}") };
        assert_eq!((account_42.key_hash(), account_7.key_hash()), (42, 7));
        let [only] = plan.segments(account_7) else { panic!("{plan:?}") };
        assert_eq!(plan.body(only).iter().map(|run| plan.records(run)).collect::<Vec<_>>(), [&[2][..]]);
        let [first, second] = plan.segments(account_42) else { panic!("{plan:?}") };
        let tags: Vec<Vec<EventTypeTag>> = plan
            .stages(first)
            .map(|stage| match stage {
                Stage::Head(run) | Stage::Tail(run) => vec![run.tag()],
                Stage::Body(runs) => runs.iter().map(Run::tag).collect(),
            })
            .collect();
        assert_eq!(tags, [vec![OPENED], vec![DEPOSITED, WITHDRAWN], vec![CLOSED]]);
        assert_eq!(plan.head(second).map(|run| plan.records(run)), Some(&[6][..]));
        assert_eq!(plan.body(second).iter().map(|run| plan.records(run)).collect::<Vec<_>>(), [&[7][..]]);
        assert_eq!(plan.tail(second), None);
    }

    #[test]
    fn relaxed_event_joins_the_head_run_of_its_type() {
        // [B, A (Acquire), B, A]: the second A is applied before the second B.
        let batch = [record(1, B, Relaxed), record(1, A, Acquire), record(1, B, Relaxed), record(1, A, Relaxed)];
        assert_eq!(shape(&plan(&batch)), [(None, vec![vec![0]], None), (Some(vec![1, 3]), vec![vec![2]], None)]);
    }

    #[test]
    fn relaxed_event_joins_the_tail_run_of_its_type() {
        // [A, B, A (Release), B]: the first A is applied after the first B.
        let batch = [record(1, A, Relaxed), record(1, B, Relaxed), record(1, A, Release), record(1, B, Relaxed)];
        assert_eq!(shape(&plan(&batch)), [(None, vec![vec![1]], Some(vec![0, 2])), (None, vec![vec![3]], None)]);
    }

    #[test]
    fn release_on_the_head_type_with_other_types_gets_a_segment_of_its_own() {
        let batch = [record(1, A, Acquire), record(1, B, Relaxed), record(1, A, Relaxed), record(1, A, Release)];
        assert_eq!(shape(&plan(&batch)), [(Some(vec![0, 2]), vec![vec![1]], None), (None, vec![], Some(vec![3]))]);
    }

    #[test]
    fn release_on_the_head_type_alone_joins_the_head_and_closes() {
        let batch = [record(1, A, Acquire), record(1, A, Relaxed), record(1, A, Release), record(1, B, Relaxed)];
        assert_eq!(shape(&plan(&batch)), [(Some(vec![0, 1, 2]), vec![], None), (None, vec![vec![3]], None)]);
    }

    #[test]
    fn release_with_no_open_segment_stands_alone_as_a_tail() {
        let batch = [record(1, A, Release), record(1, B, Release), record(1, B, Relaxed)];
        assert_eq!(
            shape(&plan(&batch)),
            [(None, vec![], Some(vec![0])), (None, vec![], Some(vec![1])), (None, vec![vec![2]], None)]
        );
    }

    #[test]
    fn release_moves_the_body_run_of_its_type_to_the_tail() {
        let batch = [record(1, A, Relaxed), record(1, B, Relaxed), record(1, C, Relaxed), record(1, B, Release)];
        assert_eq!(shape(&plan(&batch)), [(None, vec![vec![0], vec![2]], Some(vec![1, 3]))]);
    }

    #[test]
    fn acq_rel_starts_a_segment_and_heads_it_without_closing_it() {
        // The page: "An Acquire or AcqRel event starts a new segment, and
        // the run of its type becomes that segment's head." Only a Release
        // ends a segment, so a later Relaxed event joins the AcqRel's one.
        let batch = [record(1, A, AcqRel), record(1, B, Relaxed)];
        assert_eq!(shape(&plan(&batch)), [(Some(vec![0]), vec![vec![1]], None)]);

        // Nothing passes it either way: what came before is in an earlier
        // segment, what comes after runs after its head run.
        let batch = [
            record(1, A, Relaxed),
            record(1, B, Relaxed),
            record(1, C, AcqRel),
            record(1, A, Relaxed),
            record(1, C, Relaxed),
            record(1, B, Release),
        ];
        assert_eq!(
            shape(&plan(&batch)),
            [(None, vec![vec![0], vec![1]], None), (Some(vec![2, 4]), vec![vec![3]], Some(vec![5]))]
        );
    }

    #[test]
    fn acq_rel_after_acq_rel_starts_another_segment() {
        let batch = [record(1, A, AcqRel), record(1, B, Relaxed), record(1, B, AcqRel), record(1, A, Relaxed)];
        assert_eq!(shape(&plan(&batch)), [(Some(vec![0]), vec![vec![1]], None), (Some(vec![2]), vec![vec![3]], None)]);
    }

    #[test]
    fn one_type_may_choose_its_ordering_per_message() {
        // AccountStatusChanged: Active is Relaxed, Frozen AcqRel, Closed Release.
        const STATUS: EventTypeTag = EventTypeTag::new(5);
        const DEPOSITED: EventTypeTag = EventTypeTag::new(2);
        let batch = [
            record(9, DEPOSITED, Relaxed), // 0
            record(9, STATUS, Relaxed),    // 1 active
            record(9, DEPOSITED, Relaxed), // 2
            record(9, STATUS, AcqRel),     // 3 frozen
            record(9, STATUS, Relaxed),    // 4 active again
            record(9, DEPOSITED, Relaxed), // 5
            record(9, STATUS, Release),    // 6 closed
        ];
        // The freeze starts a segment and heads it; the re-activation after
        // it joins that head run and the deposit is its body. The close is
        // of the head's type while the segment holds another type: the
        // corner case, a segment of its own.
        assert_eq!(
            shape(&plan(&batch)),
            [
                (None, vec![vec![0, 2], vec![1]], None),
                (Some(vec![3, 4]), vec![vec![5]], None),
                (None, vec![], Some(vec![6])),
            ]
        );
    }

    #[test]
    fn keys_are_listed_in_order_of_first_appearance() {
        let batch = [
            record(30, A, Relaxed),
            record(10, A, Acquire),
            record(30, B, Release),
            record(20, A, Relaxed),
            record(10, A, Relaxed),
        ];
        let plan = plan(&batch);
        assert_eq!(plan.keys().iter().map(PlanKey::key_hash).collect::<Vec<_>>(), [30, 10, 20]);
        let records: Vec<Vec<usize>> = plan
            .keys()
            .iter()
            .map(|key| {
                plan.segments(key)
                    .iter()
                    .flat_map(|s| plan.stages(s))
                    .flat_map(|stage| match stage {
                        Stage::Head(run) | Stage::Tail(run) => plan.records(run).to_vec(),
                        Stage::Body(runs) => runs.iter().flat_map(|run| plan.records(run).iter().copied()).collect(),
                    })
                    .collect()
            })
            .collect();
        assert_eq!(records, [vec![0, 2], vec![1, 4], vec![3]]);
    }

    #[test]
    fn empty_batch_plans_nothing() {
        let plan = plan(&[]);
        assert!(plan.is_empty());
        assert_eq!(plan.len(), 0);
        assert!(plan.keys().is_empty());
    }

    #[test]
    fn stages_leave_out_what_is_absent() {
        let batch = [record(1, A, Acquire), record(1, B, Release)];
        let plan = plan(&batch);
        let segment = &plan.segments(&plan.keys()[0])[0];
        let stages: Vec<_> = plan.stages(segment).collect();
        assert!(
            matches!(stages[..], [Stage::Head(head), Stage::Tail(tail)] if head.tag() == A && tail.tag() == B),
            "{stages:?}"
        );
    }

    #[test]
    fn many_types_in_one_segment() {
        // Past the linear-scan limit the type table spills to a hash map.
        let batch: Vec<_> = (0..200u32)
            .map(|i| record(1, EventTypeTag::new(i % 50), if i == 120 { Release } else { Relaxed }))
            .collect();
        let plan = plan(&batch);
        let segments = plan.segments(&plan.keys()[0]);
        assert_eq!(segments.len(), 2);
        assert_eq!(plan.body(&segments[0]).len(), 49);
        assert_eq!(plan.tail(&segments[0]).map(|run| plan.records(run)), Some(&[20, 70, 120][..]));
        assert_eq!(plan.body(&segments[1]).len(), 50);
    }

    #[test]
    fn rebuild_matches_a_fresh_plan() {
        let first = [record(1, A, Acquire), record(2, B, Relaxed), record(1, B, Release)];
        let second = [record(3, C, Relaxed), record(3, A, AcqRel)];
        let mut reused = Plan::new(&first);
        reused.rebuild(&second);
        assert_eq!(format!("{reused:?}"), format!("{:?}", Plan::new(&second)));
        check_plan(&second, &reused).unwrap();
    }

    #[test]
    fn must_precede_follows_the_spec() {
        for earlier in EventAtomicOrdering::ALL {
            for later in EventAtomicOrdering::ALL {
                let (e, l) = (record(1, A, earlier), record(1, B, later));
                assert_eq!(must_precede(&e, &l), earlier.acquires() || later.releases(), "{earlier:?} {later:?}");
                assert!(must_precede(&record(1, A, earlier), &record(1, A, later)));
                assert!(!must_precede(&record(1, A, earlier), &record(2, A, later)));
            }
        }
    }

    /// The alphabet of the exhaustive tests: 2 keys × 3 types × 4 orderings.
    const KEYS: usize = 2;
    const TAGS: usize = 3;
    const MAX_LEN: usize = 5;

    /// Plans and checks every batch of up to [`MAX_LEN`] records over the
    /// alphabet, or, with `up_to_renaming`, one batch of each class of
    /// batches that differ only by a renaming of keys and of types (keys
    /// and types appear in order: 0 first, then 1, ...). Returns how many
    /// batches it checked.
    ///
    /// Renaming is a symmetry of both the planner and [`must_precede`]:
    /// they only ever compare keys and types for equality. So checking one
    /// batch per class checks them all.
    fn check_every_batch(up_to_renaming: bool) -> usize {
        /// How many keys and types the record after one of `key` and `tag`
        /// may use, when `keys` and `tags` were allowed for it: up to
        /// renaming, one more once the newest one is used.
        fn allowed(keys: usize, tags: usize, key: usize, tag: usize) -> (usize, usize) {
            (keys.max(key + 2).min(KEYS), tags.max(tag + 2).min(TAGS))
        }

        /// Checks `batch` and, depth-first, every batch that extends it,
        /// whose next record may use `keys` keys and `tags` types.
        fn visit(
            batch: &mut Vec<PlanRecord>,
            keys: usize,
            tags: usize,
            plan: &mut Plan,
            checker: &mut PlanChecker,
        ) -> usize {
            plan.rebuild(batch);
            if let Err(why) = checker.check(batch, plan) {
                panic!("{why}");
            }
            if batch.len() == MAX_LEN {
                return 1;
            }
            let mut checked = 1;
            for key in 0..keys {
                for tag in 0..tags {
                    for ordering in EventAtomicOrdering::ALL {
                        batch.push(record(key as KeyHash, EventTypeTag::new(tag as u32), ordering));
                        let (next_keys, next_tags) = allowed(keys, tags, key, tag);
                        checked += visit(batch, next_keys, next_tags, plan, checker);
                        batch.pop();
                    }
                }
            }
            checked
        }

        let (keys, tags) = if up_to_renaming { (1, 1) } else { (KEYS, TAGS) };
        // The batches of one record, dealt out to the available cores.
        let mut firsts = Vec::new();
        for key in 0..keys {
            for tag in 0..tags {
                for ordering in EventAtomicOrdering::ALL {
                    firsts.push(record(key as KeyHash, EventTypeTag::new(tag as u32), ordering));
                }
            }
        }
        let threads = std::thread::available_parallelism().map_or(1, usize::from).min(firsts.len());
        let firsts = &firsts;
        let checked: usize = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|thread| {
                    scope.spawn(move || {
                        let mut plan = Plan::default();
                        let mut checker = PlanChecker::default();
                        let mut batch = Vec::with_capacity(MAX_LEN);
                        let mut checked = 0;
                        for first in firsts.iter().skip(thread).step_by(threads) {
                            batch.clear();
                            batch.push(*first);
                            let (next_keys, next_tags) =
                                allowed(keys, tags, first.key as usize, first.tag.get() as usize);
                            checked += visit(&mut batch, next_keys, next_tags, &mut plan, &mut checker);
                        }
                        checked
                    })
                })
                .collect();
            workers.into_iter().map(|worker| worker.join().unwrap()).sum()
        });
        // And the empty batch.
        let empty = Plan::new(&[]);
        check_plan(&[], &empty).unwrap();
        checked + 1
    }

    /// Every batch of up to five records over 2 keys × 3 types × 4
    /// orderings, up to renaming of keys and types (701,765 batches; see
    /// [`check_every_batch`] for why that covers them all).
    #[test]
    fn every_batch_up_to_renaming_keeps_every_required_order() {
        // Per length n ≥ 1: keys in order of appearance (2^(n-1) patterns),
        // types in order of appearance (Stirling numbers S(n,1)+S(n,2)+S(n,3)),
        // any orderings (4^n).
        let expected = 1 + 4 + 2 * 2 * 16 + 4 * 5 * 64 + 8 * 14 * 256 + 16 * 41 * 1024;
        assert_eq!(check_every_batch(true), expected);
    }

    /// Literally every batch of up to five records over 2 keys × 3 types ×
    /// 4 orderings: 24 symbols, 8,288,041 batches. Too slow for an
    /// unoptimised build; the test above covers the same ground.
    #[test]
    #[cfg_attr(debug_assertions, ignore = "8.3 M batches; run with --release or --include-ignored")]
    fn every_batch_keeps_every_required_order() {
        let symbols: usize = KEYS * TAGS * 4;
        let expected: usize = (0..=MAX_LEN as u32).map(|len| symbols.pow(len)).sum();
        assert_eq!(check_every_batch(false), expected);
    }
}
