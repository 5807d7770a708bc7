//! The release stage: holds events that carry an event time and releases
//! them in event-time order once the log's evidence says nothing earlier can
//! still be read. It sits in front of the planner ([`crate::plan`]): what it
//! releases, in the order it releases it, is what the planner plans as if it
//! were one partition's log.
//!
//! # Purpose
//!
//! A projection may read several co-partitioned topics about one key (the
//! "silence" source: 13 topics, strict event-time order per product). Their
//! partitions are read at different speeds, so the order in which a key's
//! events arrive is not the order in which they happened. The stage makes it
//! so: it holds each event under its event time and lets it go when the
//! projection's **clock** passes it. The held events are the sort: nothing is
//! sorted in bulk, events leave an ordered map as the clock moves.
//!
//! The stage is pure: the host hands it what it read ([`Arrival`]), what the
//! log said about end offsets ([`ReleaseStage::observe_end`]) and the
//! processing time; it hands back what is released ([`Released`]), which
//! input partitions to stop reading ([`ReleaseStage::paused`]) and what to
//! commit ([`ReleaseStage::checkpoint`]). No I/O, no clock of its own, no
//! timer.
//!
//! # Rules kept here
//!
//! - **Each input partition has a clock**: the highest event time read from
//!   it ([`InputStatus::clock`]); none before it has said anything.
//! - **A partition stops counting only on evidence.** It counts until its
//!   position (the next offset it will read) reaches an end offset the log
//!   reported: at start-up, before anything is read, for the history; later,
//!   an end offset read at a known instant. Then it is **idle**. A record
//!   read past that end offset is new data: the partition counts again until
//!   the log reports an end it has reached. **No timer ever marks a
//!   partition idle.** An end offset below the position is stale (the
//!   partition already said more than it) and changes nothing.
//! - **The projection's clock** ([`ReleaseStage::clock`]) is the minimum of
//!   the clocks of the event-time partitions that count; a counting
//!   partition that has not said anything yet holds it where it is. When no
//!   event-time partition counts, the clock is the processing time if the
//!   projection reads a topic without event time ([`ClockSource::ProcessingTime`]:
//!   that topic serves as the processing-time clock once all others are
//!   idle), and otherwise one past the highest event time read (the log has
//!   said everything it had, so everything read may go). The clock never
//!   goes back.
//! - **The processing-time clock reaches as far as the evidence**: the
//!   earliest of the instants at which the event-time partitions were last
//!   found at their ends (the `at` of [`ReleaseStage::observe_end`]; the host
//!   takes it before it asks the log), never the instant of the release
//!   itself. With a processing-time partition, an idle event-time partition
//!   does not leave the minimum: it stays in it with that instant, so a
//!   partition still counting cannot push the clock past what the idle one
//!   may still say (a live event stamped after its last end offset was
//!   read); an idle partition's instant is far ahead of any history, so it
//!   holds no history back. Each of them had said everything appended before its instant,
//!   so the clock passes no event that was in the log then. An event
//!   appended after with an earlier time is late, and counted: the one
//!   thing the clock cannot know. With no event-time partition at all it
//!   is the processing time given to [`ReleaseStage::release`].
//! - **The clock is exclusive.** Every held event whose time is *below* the
//!   clock is released; an event *at* the clock waits, because a counting
//!   partition may still deliver another one at that same time that sorts
//!   before it.
//! - **Release order** is ascending `(event time, topic index, partition,
//!   offset)` ([`OrderKey`]): event time first, ties broken by where the
//!   event sits in the log, which is the same on every run. Keys are never
//!   mixed up by this: the order is total across keys, so it holds per key a
//!   fortiori, and the released sequence per key is what the planner then
//!   plans, fences and all.
//! - **Events without event time pass at once** ([`Release::Untimed`]), as
//!   they arrive; so do all events of a processing-time partition.
//! - **Late events are delivered, never dropped.** An event read with a time
//!   below the clock is released at once ([`Release::Late`]) and counted as
//!   a violation with its lateness (clock − event time, in milliseconds).
//!   That is the one thing not promised: an event that lands in the log after
//!   the clock passed its time cannot be ordered, and it is counted.
//! - **Event times are bounded by the log's evidence**
//!   ([`ReleaseLimits::max_ahead`], default one hour). Each arrival carries
//!   the time the log appended its record ([`Arrival::append_time`]: the
//!   log's own stamp, the same on every reading, never a wall clock of the
//!   host). An event whose time is more than the bound past its append
//!   time, or is `Millis::MAX` (no clock passes it: the clock is
//!   exclusive), is **refused**: released at once as
//!   [`Release::TooFarAhead`] for the host to dead-letter with its reason,
//!   never held, never in any clock. So it neither freezes a partition nor
//!   moves the clock, and every other event is released exactly as if it
//!   had carried no event time. A re-drive appends it again, with a later
//!   append time, and a raised bound admits it.
//! - **A record without an append time** (one written before the log kept
//!   them) has no evidence to measure it against: it is admitted as it
//!   always was, except at `Millis::MAX`, so nothing freezes a partition.
//!   Its events are history, read once; every record appended since has an
//!   append time.
//! - **Allowed lateness** ([`ReleaseLimits::allowed_lateness`], default 0):
//!   the clock trails the evidence. Every clock the rules above allow is
//!   lowered by the allowance before the rule that it never goes back, so an
//!   event read at most that long after the evidence passed its time is
//!   still held and released in its place; a later one is late, by its
//!   lateness less the allowance, and counted. Evidence only: with a quiet
//!   log, events within the allowance of the latest evidence stay held
//!   (the committed position stays before them) until more evidence comes,
//!   and a rebuild reading the same log releases them the same way. A stage
//!   with nothing replaying, no event-time input counting and every held
//!   event at or past the clock is **settled** ([`ReleaseStage::settled`]):
//!   it released all the evidence lets it release, so the host's caught-up
//!   gate (`--until-caught-up`, readiness, a rebuild's promotion) counts it
//!   caught up and never waits on an allowance.
//! - **Event-time arithmetic saturates**: no event time (`i64::MIN`,
//!   `i64::MAX`, anything between) overflows a clock, a lateness or a
//!   bound.
//!
//! # The start-up race, and why evidence
//!
//! At start-up the connections to the partitions form at different speeds.
//! A rule that marks a partition idle after some quiet time cannot tell
//! "still connecting" from "finished": one topic sits quiet, times out, the
//! others push the clock past event times it has not delivered yet, and its
//! first records arrive already late. Here the host asks the log for every
//! partition's end offset before reading anything; a partition with history
//! has a position below its end offset, so it counts, with no clock, and
//! holds the projection's clock back however late it is first read. The
//! exhaustive test at the bottom of this file checks that every interleaving
//! of reading a history gives zero violations, where the timer rule does not.
//!
//! # Bounded: alignment
//!
//! What is held is bounded in bytes ([`ReleaseLimits::max_held_bytes`]). When
//! the held bytes exceed the limit, every input partition is paused except
//! the ones that can move the clock: the counting event-time partitions whose
//! clock is not ahead of the projection's (the laggards, among them every
//! partition not read yet), and partitions still replaying after a restart.
//! The host stops reading paused partitions ([`ReleaseStage::paused`]), so
//! partitions are read in event-time alignment instead of buffered without
//! limit. Some counting partition is always a laggard, so this never stops
//! the stage. The limit can be passed by what the host reads from the
//! laggards in one poll, and by events that share the clock's exact time.
//!
//! # Crash safety: what to commit
//!
//! Held events are not stored anywhere: they stay in the log, and the
//! committed position of a partition never passes a held event. After each
//! batch of released events is applied, the host commits, in the same
//! transaction, the [`Checkpoint`]:
//!
//! - per input partition, `commit`: its lowest held offset, or its position
//!   when it holds nothing; the host starts reading it there after a restart;
//! - per input partition, `read_to`: the highest position it had reached
//!   (also before earlier restarts);
//! - per input partition, `held` ([`InputCheckpoint::held`]): exactly which
//!   offsets in `commit..read_to` it still holds, as ascending disjoint runs
//!   of consecutive offsets (commonly one or a few);
//! - the clock.
//!
//! **A held event's timing is decided once, when it is held.** The rule on
//! restart ([`ReleaseStage::restore`]): an event at an offset in
//! `commit..read_to` was read before; it is held again if and only if the
//! checkpoint's list names it, and then under the event time its header
//! carries ([`Arrival::carried_time`]), the time it was held under, whatever
//! its type declares now; every other one was released then and is skipped
//! ([`Admission::AlreadyReleased`]). Nothing in that range is judged by the
//! declarations of the module version active now or by the host's flags, so
//! a hot-reloaded, adopted or rolled-back version, `--untimed-topic` added
//! or removed, or another `--max-held-mib` can neither lose a held event
//! nor apply a released one again. A listed event whose header carries no
//! readable time now is released at once, never dropped. The list costs
//! what the held runs number: holding the next offset extends a run,
//! releasing one shrinks or splits its run.
//!
//! A refused event (too far ahead, see above) is never held, so no list
//! names it: on restart it counts as released, it went to the dead letters
//! when first read. A listed event is held again under its carried time
//! without being judged again by the bound (its timing was decided when it
//! was held), except that `Millis::MAX`, which no clock passes, is refused
//! whenever it is read. So a bound changed between two runs judges only
//! what is read for the first time. The committed clock already trails the
//! evidence by the allowed lateness, so a changed allowance changes nothing
//! of this: raised, the clock stays at the committed one until the evidence
//! less the new allowance passes it; lowered, the clock moves on at the
//! next release and the listed events below it go in release order.
//!
//! A checkpoint written before the list existed (`held` none) is restored
//! with the rule of that time: an event below `read_to` was released if and
//! only if it has no event time or its time is below the committed clock.
//! That rule needs the same event times on every reading, so it is exact
//! only while the declarations are unchanged; an input restored so writes
//! no list until it has read up to its `read_to` again, then writes one.
//!
//! Until every input partition has read up to its `read_to` again, the
//! clock stays at the committed one, and a replaying partition is never
//! paused: the checkpoints written meanwhile carry the restored list (or
//! clock) for what is not read again yet, and a clock moved past those
//! events would release them late.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch: event times and processing times.
pub type Millis = i64;

/// Where an input partition's events take their place in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClockSource {
    /// A topic whose event types carry event times: its partitions count
    /// toward the projection's clock and their events are held.
    EventTime,
    /// A topic without event time: its events pass at once and it serves as
    /// the processing-time clock once every event-time partition is idle.
    ProcessingTime,
}

/// One input partition of a projection, as the host declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Input {
    /// The topic's index among the projection's topics (the order they are
    /// configured in); part of the tie-break of the release order.
    pub topic: u32,
    /// The partition's index inside its topic.
    pub partition: u32,
    /// Whether its events carry event time.
    pub clock: ClockSource,
}

/// What bounds the stage. [`ReleaseLimits::default`] suits a small machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseLimits {
    /// Above this many held bytes, the partitions that cannot move the clock
    /// are paused (see the module docs, "Bounded"). Default 64 MiB: the held
    /// events of a projection on a machine of a few GiB. Lower it to pause
    /// earlier (less memory, more pauses); a higher one lets a partition run
    /// further ahead before it waits.
    pub max_held_bytes: u64,
    /// The most milliseconds an event time may be ahead of the time the log
    /// appended its record (module docs, "Event times bounded by the
    /// log"); one further ahead is refused ([`Release::TooFarAhead`]).
    /// Default [`ReleaseLimits::DEFAULT_MAX_AHEAD`].
    pub max_ahead: Millis,
    /// How far, in milliseconds, the projection's clock trails the evidence
    /// (module docs, "Allowed lateness"): an event read at most this late is
    /// still released in its place. Default 0.
    pub allowed_lateness: Millis,
}

impl ReleaseLimits {
    /// The default of [`ReleaseLimits::max_ahead`]: one hour. Far above the
    /// skew of producers' clocks and the time a record takes from its
    /// producer to the log (seconds), far below what would make the clock
    /// jump (an event stamped in the year 9999 or at `i64::MAX`): one event
    /// within the bound moves its partition's clock at most an hour past
    /// what the log has seen.
    pub const DEFAULT_MAX_AHEAD: Millis = 60 * 60 * 1000;

    /// Whether an event of time `event_time`, appended to the log at
    /// `append_time`, is admitted: its time is at most
    /// [`ReleaseLimits::max_ahead`] past its append time, and below
    /// `Millis::MAX` (which no clock passes: the clock is exclusive). An
    /// event whose append time the log cannot give is admitted unless its
    /// time is `Millis::MAX` (module docs).
    pub fn admits(&self, event_time: Millis, append_time: Option<Millis>) -> bool {
        event_time < Millis::MAX
            && append_time.is_none_or(|appended| event_time <= appended.saturating_add(self.max_ahead.max(0)))
    }
}

impl Default for ReleaseLimits {
    fn default() -> Self {
        ReleaseLimits { max_held_bytes: 64 << 20, max_ahead: Self::DEFAULT_MAX_AHEAD, allowed_lateness: 0 }
    }
}

/// One record the host read from an input partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival<T> {
    /// The input partition it was read from: an index into the inputs the
    /// stage was built with.
    pub input: usize,
    /// Its offset; offsets of one input arrive increasing.
    pub offset: u64,
    /// Its event time, or none for types that carry none.
    pub event_time: Option<Millis>,
    /// When the log appended it (its evidence, the same on every reading),
    /// or none where the log cannot say (a record of a log written before
    /// append times were kept).
    pub append_time: Option<Millis>,
    /// The event time its header carries, whatever its type declares now:
    /// an event the checkpoint restored from lists as held is held again
    /// under it (see the module docs, "Crash safety"), as it was held under
    /// it before.
    pub carried_time: Option<Millis>,
    /// What holding it costs (its body and headers), counted against
    /// [`ReleaseLimits::max_held_bytes`].
    pub bytes: u64,
    /// Whatever the host needs back when it is released (the record).
    pub payload: T,
}

/// Why an event was released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Release {
    /// The clock passed its event time: it is in event-time order.
    InOrder,
    /// It has no event time (or comes from a processing-time partition) and
    /// passed at once.
    Untimed,
    /// Its time was already below the clock when it was read: released at
    /// once, out of order, and counted as a violation.
    Late {
        /// How far below the clock it was, in milliseconds (at least 1).
        by: Millis,
    },
    /// Its event time is further ahead of its append time than
    /// [`ReleaseLimits::max_ahead`] (or is `Millis::MAX`): released at
    /// once for the host to dead-letter, never held, never in any clock.
    TooFarAhead {
        /// Its append time, as the arrival gave it.
        append_time: Option<Millis>,
    },
}

/// An event the stage lets go, to be planned and applied in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released<T> {
    /// The input partition it was read from.
    pub input: usize,
    /// Its offset there.
    pub offset: u64,
    /// Its event time, if it has one.
    pub event_time: Option<Millis>,
    /// Why it goes now.
    pub release: Release,
    /// The payload of its [`Arrival`].
    pub payload: T,
}

/// What [`ReleaseStage::read`] did with an arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Admission {
    /// It waits for the clock.
    Held,
    /// It was released at once (untimed or late) into the output.
    Released,
    /// Its event time is too far ahead of its append time: released at once
    /// into the output as [`Release::TooFarAhead`], for the dead letters.
    Refused,
    /// It was released before the restart the stage was restored from, so
    /// it is skipped (see the module docs, "Crash safety").
    AlreadyReleased,
}

/// The release order: ascending event time, then topic index, partition and
/// offset. Unique per event, and the same on every reading of the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OrderKey {
    /// The event time.
    pub event_time: Millis,
    /// The topic's index in the projection.
    pub topic: u32,
    /// The partition in the topic.
    pub partition: u32,
    /// The offset in the partition.
    pub offset: u64,
}

/// What the host commits with every applied batch, and restores the stage
/// from after a restart. See the module docs, "Crash safety".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The projection's clock: every event read with a time below it was
    /// released. None while the clock has not moved.
    pub clock: Option<Millis>,
    /// One entry per input partition, in the order of the inputs.
    pub inputs: Vec<InputCheckpoint>,
}

/// One input partition's part of a [`Checkpoint`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputCheckpoint {
    /// Where reading resumes: the lowest held offset, or the position when
    /// nothing is held. Never past a held event.
    pub commit: u64,
    /// The highest position ever reached: below it, the restart rule decides
    /// what was released.
    pub read_to: u64,
    /// The offsets in `commit..read_to` held when the checkpoint was taken,
    /// as ascending disjoint runs: on restart exactly these are held again,
    /// every other offset below `read_to` was released. None in a checkpoint
    /// written before the list existed: it is restored with the clock rule
    /// (module docs, "Crash safety").
    #[serde(default)]
    pub held: Option<Vec<HeldRun>>,
}

/// Consecutive offsets `start..end` of one input, every one of them held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HeldRun {
    /// The first offset.
    pub start: u64,
    /// One past the last.
    pub end: u64,
}

impl Checkpoint {
    /// The checkpoint of a projection that has read nothing: every input
    /// partition starts at `positions` (one per input).
    pub fn start(positions: &[u64]) -> Checkpoint {
        Checkpoint {
            clock: None,
            inputs: positions
                .iter()
                .map(|&at| InputCheckpoint { commit: at, read_to: at, held: Some(Vec::new()) })
                .collect(),
        }
    }
}

/// Whether an input partition counts toward the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Progress {
    /// It may still say something the clock must wait for.
    Counting,
    /// Its position reached an end offset the log reported.
    Idle {
        /// The instant that end offset was read, as the host gave it.
        since: Millis,
    },
}

/// One input partition as the stage sees it: for `/status` and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputStatus {
    /// The partition.
    pub input: Input,
    /// The next offset it will read.
    pub position: u64,
    /// The highest event time read from it.
    pub clock: Option<Millis>,
    /// Whether it counts.
    pub progress: Progress,
    /// How many of its events are held.
    pub held: usize,
    /// Whether the host should stop reading it for now.
    pub paused: bool,
    /// Whether it is still re-reading what it had read before a restart.
    pub replaying: bool,
}

/// Why the stage refused a call: a host bug, never message content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReleaseError {
    /// The input index is not one of the stage's inputs.
    #[error("input {input} is not one of the {inputs} inputs")]
    UnknownInput {
        /// The index given.
        input: usize,
        /// How many inputs there are.
        inputs: usize,
    },
    /// An arrival's offset is below the input's position: offsets of one
    /// input must arrive increasing.
    #[error("input {input}: offset {offset} arrived at position {position}")]
    OffsetBehind {
        /// The input.
        input: usize,
        /// The offset that arrived.
        offset: u64,
        /// The input's position.
        position: u64,
    },
    /// The checkpoint has a different number of inputs.
    #[error("the checkpoint has {found} inputs, the stage {expected}")]
    CheckpointInputs {
        /// The stage's inputs.
        expected: usize,
        /// The checkpoint's.
        found: usize,
    },
    /// A checkpoint entry's held list is not ascending disjoint runs
    /// inside `commit..read_to`.
    #[error("input {input}: the checkpoint's held run {start}..{end} is not ascending inside {commit}..{read_to}")]
    CheckpointHeldRun {
        /// The input.
        input: usize,
        /// The run's first offset.
        start: u64,
        /// One past its last.
        end: u64,
        /// The entry's commit.
        commit: u64,
        /// The entry's read_to.
        read_to: u64,
    },
    /// A checkpoint entry resumes past the position it says was reached.
    #[error("input {input}: the checkpoint resumes at {commit}, past read_to {read_to}")]
    CheckpointCommitPastRead {
        /// The input.
        input: usize,
        /// Its commit.
        commit: u64,
        /// Its read_to.
        read_to: u64,
    },
}

/// The release stage of one projection (normally one partition index across
/// all its topics, where a key's events meet). See the [module
/// documentation](self).
#[derive(Debug, Clone)]
pub struct ReleaseStage<T> {
    inputs: Vec<InputState>,
    limits: ReleaseLimits,
    clock: Option<Millis>,
    /// The clock of the checkpoint restored from: it judges the replay.
    restored_clock: Option<Millis>,
    /// How many inputs are still below their `replay_to`.
    replaying: usize,
    held: BTreeMap<OrderKey, Held<T>>,
    held_bytes: u64,
    violations: u64,
    has_processing_time: bool,
}

#[derive(Debug, Clone)]
struct Held<T> {
    input: usize,
    bytes: u64,
    payload: T,
}

#[derive(Debug, Clone)]
struct InputState {
    input: Input,
    position: u64,
    /// Below this offset, events were read before the restart.
    replay_to: u64,
    clock: Option<Millis>,
    /// An end offset the log reported above the position, and when.
    pending_end: Option<(u64, Millis)>,
    idle_since: Option<Millis>,
    held: HeldRuns,
    /// What the checkpoint restored from says was held below `replay_to`.
    restored: RestoredHeld,
}

/// The offsets of one input's held events, as runs of consecutive held
/// offsets: what its checkpoint's `commit` needs (the lowest) and its held
/// list ([`InputCheckpoint::held`]), at a cost in runs, not events.
///
/// An input's events arrive in offset order but leave in event-time order:
/// holding the next offset extends the last run or starts one (a push),
/// letting one go shrinks or splits its run (a binary search). A run holds
/// only offsets that were held one after another, so every run holds at
/// least one event and there are never more runs than held events; an input
/// in time order lets go from the front, and keeps one run.
#[derive(Debug, Clone, Default)]
struct HeldRuns {
    /// Ascending, disjoint, none empty.
    runs: VecDeque<HeldRun>,
    /// How many offsets are held.
    held: usize,
}

impl HeldRuns {
    /// Adds `offset`, above every offset added before.
    fn insert(&mut self, offset: u64) {
        self.held += 1;
        match self.runs.back_mut() {
            Some(last) if last.end == offset => last.end += 1,
            _ => {
                debug_assert!(self.runs.back().is_none_or(|last| last.end < offset));
                self.runs.push_back(HeldRun { start: offset, end: offset + 1 });
            }
        }
    }

    /// Removes a held `offset`; nothing if it is not held.
    fn remove(&mut self, offset: u64) {
        let at = self.runs.partition_point(|run| run.end <= offset);
        let Some(run) = self.runs.get_mut(at).filter(|run| run.start <= offset) else { return };
        self.held -= 1;
        let HeldRun { start, end } = *run;
        match (start == offset, end == offset + 1) {
            (true, true) => {
                self.runs.remove(at);
            }
            (true, false) => run.start += 1,
            (false, true) => run.end -= 1,
            (false, false) => {
                run.end = offset;
                self.runs.insert(at + 1, HeldRun { start: offset + 1, end });
            }
        }
    }

    /// The lowest held offset.
    fn first(&self) -> Option<u64> {
        self.runs.front().map(|run| run.start)
    }

    fn len(&self) -> usize {
        self.held
    }
}

/// The held list of a restored checkpoint for one input, read alongside
/// the replay: the offsets of a replayed event only rise, so a cursor
/// finds each in constant time.
#[derive(Debug, Clone, Default)]
struct RestoredHeld {
    /// [`InputCheckpoint::held`]: none for a checkpoint written without it.
    runs: Option<Vec<HeldRun>>,
    /// The first run not wholly below the offsets asked about so far.
    next: usize,
}

impl RestoredHeld {
    /// Whether `offset` (at or above every offset asked before) was held
    /// when the checkpoint was taken; none when the checkpoint has no list.
    fn held(&mut self, offset: u64) -> Option<bool> {
        let runs = self.runs.as_ref()?;
        while runs.get(self.next).is_some_and(|run| run.end <= offset) {
            self.next += 1;
        }
        Some(runs.get(self.next).is_some_and(|run| run.start <= offset))
    }

    /// The listed runs at or above `from`.
    fn from(&self, from: u64) -> impl Iterator<Item = HeldRun> + '_ {
        let runs = self.runs.as_deref().unwrap_or_default();
        runs[self.next.min(runs.len())..]
            .iter()
            .filter(move |run| run.end > from)
            .map(move |run| HeldRun { start: run.start.max(from), end: run.end })
    }
}

impl InputState {
    fn counts(&self) -> bool {
        self.input.clock == ClockSource::EventTime && self.idle_since.is_none()
    }

    fn replaying(&self) -> bool {
        self.position < self.replay_to
    }
}

/// Refuses a held list that is not ascending, disjoint, non-empty runs
/// inside `commit..read_to`.
fn check_held_runs(input: usize, saved: &InputCheckpoint, runs: &[HeldRun]) -> Result<(), ReleaseError> {
    let mut floor = saved.commit;
    for run in runs {
        if run.start < floor || run.end <= run.start || run.end > saved.read_to {
            let (commit, read_to) = (saved.commit, saved.read_to);
            return Err(ReleaseError::CheckpointHeldRun { input, start: run.start, end: run.end, commit, read_to });
        }
        floor = run.end;
    }
    Ok(())
}

impl<T> ReleaseStage<T> {
    /// A stage over `inputs` that has read nothing, each input starting at
    /// `positions` (one per input). Every input counts until the host reports
    /// an end offset it has reached: report the start-up end offsets before
    /// reading anything.
    pub fn new(inputs: &[Input], positions: &[u64], limits: ReleaseLimits) -> Result<Self, ReleaseError> {
        Self::restore(inputs, &Checkpoint::start(positions), limits)
    }

    /// A stage restored from a committed checkpoint: each input resumes at
    /// its `commit`, and the restart rule (module docs) skips what was
    /// released before.
    pub fn restore(inputs: &[Input], checkpoint: &Checkpoint, limits: ReleaseLimits) -> Result<Self, ReleaseError> {
        if checkpoint.inputs.len() != inputs.len() {
            return Err(ReleaseError::CheckpointInputs { expected: inputs.len(), found: checkpoint.inputs.len() });
        }
        let mut states = Vec::with_capacity(inputs.len());
        for (index, (&input, saved)) in inputs.iter().zip(&checkpoint.inputs).enumerate() {
            if saved.commit > saved.read_to {
                return Err(ReleaseError::CheckpointCommitPastRead {
                    input: index,
                    commit: saved.commit,
                    read_to: saved.read_to,
                });
            }
            if let Some(runs) = &saved.held {
                check_held_runs(index, saved, runs)?;
            }
            states.push(InputState {
                input,
                position: saved.commit,
                replay_to: saved.read_to,
                clock: None,
                pending_end: None,
                idle_since: None,
                held: HeldRuns::default(),
                restored: RestoredHeld { runs: saved.held.clone(), next: 0 },
            });
        }
        let replaying = states.iter().filter(|state| state.replaying()).count();
        Ok(ReleaseStage {
            has_processing_time: inputs.iter().any(|input| input.clock == ClockSource::ProcessingTime),
            inputs: states,
            limits,
            clock: checkpoint.clock,
            restored_clock: checkpoint.clock,
            replaying,
            held: BTreeMap::new(),
            held_bytes: 0,
            violations: 0,
        })
    }

    /// Takes in one record read from an input: holds it, or releases it at
    /// once into `out` (untimed or late), or skips it as released before the
    /// restart. The clock does not move here; [`ReleaseStage::release`] moves
    /// it.
    pub fn read(&mut self, arrival: Arrival<T>, out: &mut Vec<Released<T>>) -> Result<Admission, ReleaseError> {
        let Arrival { input, offset, event_time, append_time, carried_time, bytes, payload } = arrival;
        let limits = self.limits;
        let state = self.input_mut(input)?;
        if offset < state.position {
            return Err(ReleaseError::OffsetBehind { input, offset, position: state.position });
        }
        let was_replaying = state.replaying();
        let replayed = offset < state.replay_to;
        state.position = offset + 1;
        state.note_read(offset);
        let event_time = match state.input.clock {
            ClockSource::EventTime => event_time,
            ClockSource::ProcessingTime => None,
        };
        // Read before the restart: held again exactly when the checkpoint
        // lists it, under the time its header carries; without a list, the
        // clock rule judges it by its event time now.
        let held_before = if replayed { state.restored.held(offset) } else { Some(false) };
        let listed = held_before == Some(true);
        let event_time = if listed { carried_time } else { event_time };
        // Judged by the record alone, so the same on every reading; a listed
        // event was judged when it was held (only `Millis::MAX` is refused).
        let evidence = if listed { None } else { append_time };
        let refused = event_time.is_some_and(|time| !limits.admits(time, evidence));
        if let Some(time) = event_time.filter(|_| !refused && state.input.clock == ClockSource::EventTime) {
            state.clock = state.clock.max(Some(time));
        }
        let topic = state.input.topic;
        let partition = state.input.partition;
        if was_replaying && !state.replaying() {
            self.replaying -= 1;
        }
        let released_before = match (held_before, event_time, self.restored_clock) {
            (Some(held), _, _) => replayed && !held,
            (None, None, _) => true,
            (None, Some(_), _) if refused => true,
            (None, Some(time), Some(clock)) => time < clock,
            (None, Some(_), None) => false,
        };
        if released_before {
            return Ok(Admission::AlreadyReleased);
        }
        if refused {
            let release = Release::TooFarAhead { append_time };
            out.push(Released { input, offset, event_time, release, payload });
            return Ok(Admission::Refused);
        }
        let Some(time) = event_time else {
            out.push(Released { input, offset, event_time, release: Release::Untimed, payload });
            return Ok(Admission::Released);
        };
        if let Some(clock) = self.clock.filter(|&clock| time < clock) {
            self.violations += 1;
            let release = Release::Late { by: clock.saturating_sub(time) };
            out.push(Released { input, offset, event_time, release, payload });
            return Ok(Admission::Released);
        }
        let key = OrderKey { event_time: time, topic, partition, offset };
        self.inputs[input].held.insert(offset);
        self.held_bytes += bytes;
        self.held.insert(key, Held { input, bytes, payload });
        Ok(Admission::Held)
    }

    /// The log reported `end` as the end offset of `input`, read at instant
    /// `at`: if the input's position has reached it, the input is idle;
    /// if it is above the position, the input becomes idle when it gets
    /// there; if it is below, it is stale and ignored. The clock does not
    /// move here; [`ReleaseStage::release`] moves it.
    pub fn observe_end(&mut self, input: usize, end: u64, at: Millis) -> Result<(), ReleaseError> {
        let state = self.input_mut(input)?;
        if end == state.position {
            state.idle_since = Some(at);
            state.pending_end = None;
            if state.replaying() {
                // The log no longer holds what was read before: nothing is
                // left to replay.
                state.replay_to = state.position;
                self.replaying -= 1;
            }
        } else if end > state.position && state.pending_end.is_none_or(|(pending, _)| pending <= end) {
            state.pending_end = Some((end, at));
        }
        Ok(())
    }

    /// Moves the clock as far as the evidence allows (`now` is the processing
    /// time, used only as the module docs say) and releases into `out`, in
    /// release order, every held event below it.
    pub fn release(&mut self, now: Millis, out: &mut Vec<Released<T>>) {
        if let Some(evidence) = self.clock_allowed(now) {
            let trailing = evidence.saturating_sub(self.limits.allowed_lateness.max(0));
            self.clock = self.clock.max(Some(trailing));
        }
        let Some(clock) = self.clock else { return };
        while let Some(entry) = self.held.first_entry() {
            if entry.key().event_time >= clock {
                break;
            }
            let (key, held) = entry.remove_entry();
            self.inputs[held.input].held.remove(key.offset);
            self.held_bytes -= held.bytes;
            out.push(Released {
                input: held.input,
                offset: key.offset,
                event_time: Some(key.event_time),
                release: Release::InOrder,
                payload: held.payload,
            });
        }
    }

    /// The clock the evidence allows now, before the rule that it never goes
    /// back: none when it must stay where it is.
    fn clock_allowed(&self, now: Millis) -> Option<Millis> {
        if self.replaying > 0 {
            return None;
        }
        if self.has_processing_time {
            // The processing time, as far as the evidence reaches: a
            // counting event-time input bounds it by its clock (none yet
            // holds it), an idle one by the instant it was last found at
            // its end, which bounds the times of what it can still say.
            let timed = self.inputs.iter().filter(|state| state.input.clock == ClockSource::EventTime);
            let bounds = timed.map(|state| if state.counts() { state.clock } else { state.idle_since });
            return bounds.min().map_or(Some(now), |bound| bound.map(|bound| bound.min(now)));
        }
        let mut counting = self.inputs.iter().filter(|state| state.counts()).peekable();
        if counting.peek().is_some() {
            // A counting input that has said nothing holds the clock.
            return counting.map(|state| state.clock).min().flatten();
        }
        self.inputs.iter().filter_map(|state| state.clock).max().map(|highest| highest.saturating_add(1))
    }

    /// What the host commits with the batch it applies now.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            clock: self.clock,
            inputs: self
                .inputs
                .iter()
                .map(|state| InputCheckpoint {
                    commit: state.held.first().unwrap_or(state.position).min(state.position),
                    read_to: state.position.max(state.replay_to),
                    held: state.held_list(),
                })
                .collect(),
        }
    }

    /// The projection's clock: every held event below it has been released.
    pub fn clock(&self) -> Option<Millis> {
        self.clock
    }

    /// Whether the stage released all the log's evidence lets it release
    /// until the log says more: no replay under way, no event-time input
    /// counting toward the clock, and every held event at or past the clock
    /// (waiting for an allowed lateness, or for the processing time). A
    /// caught-up gate may count such a partition index as caught up.
    pub fn settled(&self) -> bool {
        self.replaying == 0
            && self.inputs.iter().all(|state| !state.counts())
            && self.held.keys().next().is_none_or(|first| self.clock.is_some_and(|clock| first.event_time >= clock))
    }

    /// How many events are held.
    pub fn held_events(&self) -> usize {
        self.held.len()
    }

    /// How many bytes are held (the arrivals' `bytes`).
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// How many late events were released since the stage was built.
    pub fn violations(&self) -> u64 {
        self.violations
    }

    /// The inputs the host should not read for now, in input order: empty
    /// unless the held bytes exceed the limit (module docs, "Bounded").
    /// Ask after [`ReleaseStage::release`]: between reads and the release
    /// that follows them, the clock has not caught up with them yet.
    pub fn paused(&self) -> Vec<usize> {
        (0..self.inputs.len()).filter(|&input| self.is_paused(input)).collect()
    }

    /// Whether the host should not read `input` for now; false for an index
    /// that is not an input.
    pub fn is_paused(&self, input: usize) -> bool {
        let Some(state) = self.inputs.get(input) else { return false };
        if self.held_bytes <= self.limits.max_held_bytes || state.replaying() {
            return false;
        }
        let laggard =
            state.counts() && state.clock.is_none_or(|clock| self.clock.is_some_and(|projection| clock <= projection));
        // With a processing-time input, an idle event-time input bounds the
        // clock by the instant of its last end offset: it is read, so that
        // its next end offset moves the clock.
        let bounds = self.has_processing_time && state.input.clock == ClockSource::EventTime && !state.counts();
        !laggard && !bounds
    }

    /// One input as the stage sees it, or none for an index that is not an
    /// input.
    pub fn input_status(&self, input: usize) -> Option<InputStatus> {
        let state = self.inputs.get(input)?;
        Some(InputStatus {
            input: state.input,
            position: state.position,
            clock: state.clock,
            progress: match state.idle_since {
                Some(since) => Progress::Idle { since },
                None => Progress::Counting,
            },
            held: state.held.len(),
            paused: self.is_paused(input),
            replaying: state.replaying(),
        })
    }

    /// How many inputs the stage has.
    pub fn inputs(&self) -> usize {
        self.inputs.len()
    }

    fn input_mut(&mut self, input: usize) -> Result<&mut InputState, ReleaseError> {
        let inputs = self.inputs.len();
        self.inputs.get_mut(input).ok_or(ReleaseError::UnknownInput { input, inputs })
    }
}

impl InputState {
    /// The held list of its checkpoint: what it holds, then what the
    /// restored list says of the offsets it has not read again. None while
    /// it replays a checkpoint without a list: the clock rule still judges
    /// those offsets, and the clock waits until the replay is over.
    fn held_list(&self) -> Option<Vec<HeldRun>> {
        if self.restored.runs.is_none() && self.replaying() {
            return None;
        }
        let mut runs = Vec::with_capacity(self.held.runs.len());
        runs.extend(self.held.runs.iter().copied());
        if self.replaying() {
            runs.extend(self.restored.from(self.position));
        }
        Some(runs)
    }

    /// After reading `offset` (the position is now past it): a record at or
    /// past an end offset the log reported is new data, so the input counts
    /// again; reaching a pending end offset exactly makes it idle.
    fn note_read(&mut self, offset: u64) {
        self.idle_since = None;
        if let Some((end, at)) = self.pending_end {
            if offset >= end {
                self.pending_end = None;
            } else if self.position == end {
                self.pending_end = None;
                self.idle_since = Some(at);
            }
        }
    }
}

/// Helpers for tests: a simulated log of a few input partitions, a host
/// loop that reads it in a given interleaving, and the checks the module
/// docs promise, run after every step.
///
/// Compiled for this crate's tests, and public with the `test-support`
/// feature, for tests elsewhere (a host test can drive its own consumer
/// with the same scenarios).
#[cfg(any(test, feature = "test-support"))]
pub mod test_support {
    use std::collections::BTreeSet;

    use super::{
        Admission, Arrival, Checkpoint, ClockSource, Input, Millis, OrderKey, Progress, Release, ReleaseLimits,
        ReleaseStage, Released,
    };

    /// The processing time the simulation reports after its last step: past
    /// every event time the scenarios use.
    pub const LATE_NOW: Millis = 1_000_000;

    /// One record of a simulated partition.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Record {
        /// Its event time.
        pub event_time: Option<Millis>,
        /// Its key, for the per-key order check.
        pub key: u8,
    }

    /// One simulated input partition: its records in offset order, how many
    /// of them are history (in the log at start-up) and, for each live one,
    /// whether the poll that read it also reported the partition's end (the
    /// next record was not in the log yet).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Partition {
        /// How the stage sees it.
        pub input: Input,
        /// Its records; offset = index.
        pub records: Vec<Record>,
        /// How many records were in the log at start-up.
        pub history: usize,
        /// Per record: after reading it, the host learns the end offset
        /// (only meaningful for live records; history ends are reported at
        /// start-up).
        pub end_after: Vec<bool>,
        /// Whether its type declares event time: when not, its records
        /// are read with none, though their headers carry theirs (a type
        /// whose module version changed, with producers ahead of it).
        pub timed: bool,
    }

    impl Partition {
        /// Whether its timed records never go back in event time.
        pub fn in_time_order(&self) -> bool {
            let times: Vec<Millis> = self.records.iter().filter_map(|record| record.event_time).collect();
            times.windows(2).all(|pair| pair[0] <= pair[1])
        }
    }

    /// Where the host's idleness comes from.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Evidence {
        /// The log's end offsets: at start-up, and after a live record whose
        /// poll found the partition at its end. The rule of the module.
        Offsets,
        /// The baseline the article replaced, for comparison only: a
        /// partition not read for `quiet` steps is marked idle, by telling
        /// the stage its end is its position (a lie when it has more).
        Timer {
            /// Steps without a read after which it is marked idle.
            quiet: usize,
        },
    }

    /// What a simulated run released and counted.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct Outcome {
        /// Everything released, in order, as (input, offset, why).
        pub released: Vec<(usize, u64, Release)>,
        /// Violations the stage counted.
        pub violations: u64,
        /// After each step (0: before the first), the checkpoint and how many
        /// releases it covers: what a host committing after every step
        /// would have committed.
        pub commits: Vec<(Checkpoint, usize)>,
        /// How many of the first commits were taken while some input was
        /// still replaying (after a restart), and the one after the replay.
        pub replay_commits: usize,
        /// What is still held once everything is read and the log said so:
        /// with an allowed lateness, the events the clock has not passed
        /// (it trails the evidence), as (input, offset).
        pub held_at_end: Vec<(usize, u64)>,
    }

    /// The held events of `stage`, checked to be at or past its clock.
    fn held_at_end(stage: &ReleaseStage<()>) -> Result<Vec<(usize, u64)>, String> {
        let clock = stage.clock();
        if let Some(first) = stage.held.keys().next().filter(|key| clock.is_none_or(|clock| key.event_time < clock)) {
            return Err(format!("{first:?} is still held below the clock {clock:?}"));
        }
        Ok(stage.held.iter().map(|(key, held)| (held.input, key.offset)).collect())
    }

    fn arrival(partitions: &[Partition], input: usize, offset: u64) -> Arrival<()> {
        let partition = &partitions[input];
        let record = partition.records[offset as usize];
        let event_time = record.event_time.filter(|_| partition.timed);
        // Every record was appended at instant 0: with a bound of 1, times
        // above 1 are too far ahead.
        let (append_time, carried_time) = (Some(0), record.event_time);
        Arrival { input, offset, event_time, append_time, carried_time, bytes: 1, payload: () }
    }

    fn order_key(partitions: &[Partition], input: usize, offset: u64) -> Option<OrderKey> {
        let partition = &partitions[input];
        let event_time = partition.records[offset as usize].event_time.filter(|_| partition.timed)?;
        Some(OrderKey { event_time, topic: partition.input.topic, partition: partition.input.partition, offset })
    }

    /// A host that reads `partitions` in the order `schedule` names them
    /// (one record per entry), with `evidence`, releasing after every read;
    /// then, once everything is read, the log reports every end and the
    /// clock is released at [`LATE_NOW`]. Checks after every step that the
    /// clock never goes back, never passes an unread event of a counting
    /// partition in time order, that the checkpoint never resumes past a
    /// held event, that pausing keeps a laggard readable, and that every
    /// violation was late by what it says; at the end, that every record
    /// was released exactly once.
    pub fn run(
        partitions: &[Partition],
        schedule: &[usize],
        evidence: Evidence,
        limits: ReleaseLimits,
    ) -> Result<Outcome, String> {
        let inputs: Vec<Input> = partitions.iter().map(|partition| partition.input).collect();
        let mut stage = ReleaseStage::new(&inputs, &vec![0; inputs.len()], limits).map_err(|e| e.to_string())?;
        let mut cursor = vec![0u64; partitions.len()];
        let mut last_read = vec![0usize; partitions.len()];
        let mut out = Vec::new();
        let mut outcome = Outcome::default();
        if evidence == Evidence::Offsets {
            for (input, partition) in partitions.iter().enumerate() {
                stage.observe_end(input, partition.history as u64, 0).map_err(|e| e.to_string())?;
            }
        }
        outcome.commits.push((stage.checkpoint(), 0));
        for (step, &input) in schedule.iter().enumerate() {
            let now = step as Millis + 1;
            let clock_at_read = stage.clock();
            let offset = cursor[input];
            cursor[input] += 1;
            last_read[input] = step + 1;
            stage.read(arrival(partitions, input, offset), &mut out).map_err(|e| e.to_string())?;
            match evidence {
                Evidence::Offsets => {
                    let partition = &partitions[input];
                    if offset as usize >= partition.history && partition.end_after[offset as usize] {
                        stage.observe_end(input, cursor[input], now).map_err(|e| e.to_string())?;
                    }
                }
                Evidence::Timer { quiet } => {
                    for (other, &read) in last_read.iter().enumerate() {
                        if step + 1 - read >= quiet {
                            stage.observe_end(other, cursor[other], now).map_err(|e| e.to_string())?;
                        }
                    }
                }
            }
            if evidence == Evidence::Offsets {
                check_progress(partitions, &stage, &cursor)?;
            }
            let before = stage.clock();
            stage.release(now, &mut out);
            check_step(partitions, &stage, &cursor, before, clock_at_read, &mut out, &mut outcome)?;
            outcome.commits.push((stage.checkpoint(), outcome.released.len()));
        }
        for (input, partition) in partitions.iter().enumerate() {
            stage.observe_end(input, partition.records.len() as u64, LATE_NOW).map_err(|e| e.to_string())?;
        }
        stage.release(LATE_NOW, &mut out);
        collect(partitions, &mut out, None, &mut outcome)?;
        outcome.violations = stage.violations();
        outcome.held_at_end = held_at_end(&stage)?;
        let released = outcome.released.iter().map(|&(input, offset, _)| (input, offset));
        check_once(partitions, released.chain(outcome.held_at_end.iter().copied()))?;
        Ok(outcome)
    }

    /// Moves `out` into the outcome, checking each late release against
    /// the clock at its read.
    fn collect(
        partitions: &[Partition],
        out: &mut Vec<Released<()>>,
        clock_at_read: Option<Option<Millis>>,
        outcome: &mut Outcome,
    ) -> Result<(), String> {
        for released in out.drain(..) {
            if let Release::Late { by } = released.release {
                let time = order_key(partitions, released.input, released.offset).map(|key| key.event_time);
                let expected = clock_at_read.flatten().zip(time).map(|(clock, time)| clock - time);
                if by < 1 || (clock_at_read.is_some() && expected != Some(by)) {
                    return Err(format!("{released:?} late by {by}, the clock at its read says {expected:?}"));
                }
            }
            outcome.released.push((released.input, released.offset, released.release));
        }
        Ok(())
    }

    fn check_step(
        partitions: &[Partition],
        stage: &ReleaseStage<()>,
        cursor: &[u64],
        before: Option<Millis>,
        clock_at_read: Option<Millis>,
        out: &mut Vec<Released<()>>,
        outcome: &mut Outcome,
    ) -> Result<(), String> {
        let after = stage.clock();
        let checkpoint = stage.checkpoint();
        if after < before {
            return Err(format!("the clock went back from {before:?} to {after:?}"));
        }
        for (input, partition) in partitions.iter().enumerate() {
            let status = stage.input_status(input).ok_or("no status")?;
            let counts = status.progress == Progress::Counting
                && partition.input.clock == ClockSource::EventTime
                && partition.timed;
            if counts && partition.in_time_order() {
                let unread = partition.records[cursor[input] as usize..].iter().filter_map(|r| r.event_time);
                for time in unread {
                    if before.is_none_or(|before| before <= time) && after.is_some_and(|after| time < after) {
                        return Err(format!("the clock passed {time}, unread in counting input {input}: {after:?}"));
                    }
                }
            }
            let commit = checkpoint.inputs[input].commit;
            if commit > status.position {
                return Err(format!("input {input} commits {commit} past its position {}", status.position));
            }
        }
        check_processing_time(stage, before)?;
        check_pauses(partitions, stage)?;
        // A late release happened at the read, before this step's release.
        let late_at_read = Some(clock_at_read);
        let (late, in_order): (Vec<_>, Vec<_>) = out.drain(..).partition(|r| r.release != Release::InOrder);
        let mut late = late;
        collect(partitions, &mut late, late_at_read, outcome)?;
        let mut in_order = in_order;
        collect(partitions, &mut in_order, None, outcome)
    }

    /// With the offset gate, an input is idle exactly when the log said
    /// where its end is and it has read up to there: its whole history and
    /// no live record yet, or a live record whose poll found the end.
    fn check_progress(partitions: &[Partition], stage: &ReleaseStage<()>, cursor: &[u64]) -> Result<(), String> {
        for (input, partition) in partitions.iter().enumerate() {
            let read = cursor[input] as usize;
            let idle = read == partition.history || (read > partition.history && partition.end_after[read - 1]);
            let progress = stage.input_status(input).ok_or("no status")?.progress;
            if idle != matches!(progress, Progress::Idle { .. }) {
                return Err(format!("input {input} after {read} reads: {progress:?}, the log says idle: {idle}"));
            }
        }
        Ok(())
    }

    /// With a processing-time input and every event-time input idle (and
    /// none replaying), the clock is where the evidence reaches: the
    /// earliest instant an event-time input was last found at its end,
    /// unless it was past that already.
    fn check_processing_time(stage: &ReleaseStage<()>, before: Option<Millis>) -> Result<(), String> {
        let timed: Vec<_> = stage.inputs.iter().filter(|s| s.input.clock == ClockSource::EventTime).collect();
        if !stage.has_processing_time || stage.replaying > 0 || timed.is_empty() || timed.iter().any(|s| s.counts()) {
            return Ok(());
        }
        let evidence = timed.iter().filter_map(|s| s.idle_since).min();
        let trailing = evidence.map(|evidence| evidence.saturating_sub(stage.limits.allowed_lateness));
        let expected = before.max(trailing);
        if stage.clock() != expected {
            return Err(format!("processing-time clock {:?}, the evidence reaches {evidence:?}", stage.clock()));
        }
        Ok(())
    }

    fn check_pauses(partitions: &[Partition], stage: &ReleaseStage<()>) -> Result<(), String> {
        let paused = stage.paused();
        if !paused.is_empty() && stage.held_bytes() <= stage.limits.max_held_bytes {
            return Err(format!("paused {paused:?} with {} bytes held", stage.held_bytes()));
        }
        let counting: Vec<usize> = (0..partitions.len())
            .filter(|&input| {
                partitions[input].input.clock == ClockSource::EventTime
                    && stage.input_status(input).is_some_and(|s| s.progress == Progress::Counting)
            })
            .collect();
        // With a processing-time input, idle event-time inputs bound the
        // clock too, and are never paused.
        let idle_bounds = stage.has_processing_time
            && (0..partitions.len()).any(|input| {
                partitions[input].input.clock == ClockSource::EventTime
                    && !counting.contains(&input)
                    && !paused.contains(&input)
            });
        if !counting.is_empty() && counting.iter().all(|input| paused.contains(input)) && !idle_bounds {
            return Err(format!("every counting input is paused: {paused:?}"));
        }
        Ok(())
    }

    /// Checks that `released` names every record of `partitions` exactly
    /// once.
    pub fn check_once(partitions: &[Partition], released: impl Iterator<Item = (usize, u64)>) -> Result<(), String> {
        let mut seen = BTreeSet::new();
        for (input, offset) in released {
            if !seen.insert((input, offset)) {
                return Err(format!("input {input} offset {offset} released twice"));
            }
        }
        let total: usize = partitions.iter().map(|partition| partition.records.len()).sum();
        if seen.len() != total {
            return Err(format!("{} of {total} records released: {seen:?}", seen.len()));
        }
        Ok(())
    }

    /// Checks that the timed events of `released` are in release order
    /// ([`OrderKey`]), over all keys and per key.
    pub fn check_order(partitions: &[Partition], released: &[(usize, u64, Release)]) -> Result<(), String> {
        // Refused events are not ordered: they go to the dead letters.
        let keys: Vec<(u8, OrderKey)> = released
            .iter()
            .filter(|&&(_, _, release)| !matches!(release, Release::TooFarAhead { .. }))
            .filter_map(|&(input, offset, _)| {
                let key = partitions[input].records[offset as usize].key;
                order_key(partitions, input, offset).map(|order| (key, order))
            })
            .collect();
        if !keys.windows(2).all(|pair| pair[0].1 < pair[1].1) {
            return Err(format!("released out of order: {keys:?}"));
        }
        let mut present: Vec<u8> = keys.iter().map(|k| k.0).collect();
        present.sort_unstable();
        present.dedup();
        for key in present {
            let of_key: Vec<OrderKey> = keys.iter().filter(|k| k.0 == key).map(|k| k.1).collect();
            if !of_key.windows(2).all(|pair| pair[0] < pair[1]) {
                return Err(format!("key {key} released out of order: {of_key:?}"));
            }
        }
        Ok(())
    }

    /// A restarted host: restores the stage from `checkpoint`, learns at
    /// start-up that every record is in the log, and reads each input from
    /// its commit to the end, round-robin starting with input `first`,
    /// releasing after every read. Returns what it released (skipping what
    /// the stage says was released before) and its commits after every step.
    pub fn restart(
        partitions: &[Partition],
        checkpoint: &Checkpoint,
        first: usize,
        limits: ReleaseLimits,
    ) -> Result<Outcome, String> {
        let inputs: Vec<Input> = partitions.iter().map(|partition| partition.input).collect();
        let mut stage = ReleaseStage::restore(&inputs, checkpoint, limits).map_err(|e| e.to_string())?;
        let mut cursor: Vec<u64> = checkpoint.inputs.iter().map(|input| input.commit).collect();
        for (input, partition) in partitions.iter().enumerate() {
            stage.observe_end(input, partition.records.len() as u64, 0).map_err(|e| e.to_string())?;
        }
        let mut outcome = Outcome::default();
        let mut out = Vec::new();
        outcome.commits.push((stage.checkpoint(), 0));
        outcome.replay_commits = 1;
        let mut turn = first;
        let mut step = 0;
        while (0..partitions.len()).any(|input| cursor[input] < partitions[input].records.len() as u64) {
            let input = turn % partitions.len();
            turn += 1;
            if cursor[input] >= partitions[input].records.len() as u64 {
                continue;
            }
            step += 1;
            let offset = cursor[input];
            cursor[input] += 1;
            let admission = stage.read(arrival(partitions, input, offset), &mut out).map_err(|e| e.to_string())?;
            if admission == Admission::AlreadyReleased && !out.is_empty() {
                return Err("a skipped arrival was released".into());
            }
            let replaying = stage.replaying > 0;
            stage.release(step, &mut out);
            collect(partitions, &mut out, None, &mut outcome)?;
            outcome.commits.push((stage.checkpoint(), outcome.released.len()));
            if replaying {
                outcome.replay_commits = outcome.commits.len() + 1;
            }
        }
        // The log says again, at the end, that everything was read.
        for (input, partition) in partitions.iter().enumerate() {
            stage.observe_end(input, partition.records.len() as u64, LATE_NOW).map_err(|e| e.to_string())?;
        }
        stage.release(LATE_NOW, &mut out);
        collect(partitions, &mut out, None, &mut outcome)?;
        outcome.violations = stage.violations();
        outcome.held_at_end = held_at_end(&stage)?;
        Ok(outcome)
    }

    /// For every commit of `outcome` (a crash right after it), restarts from
    /// it and checks that the committed releases and the restarted host's
    /// together release every record exactly once, in release order when
    /// neither counted a violation; and, for every commit of that restarted
    /// host up to the first one after its replay (a second crash), the same
    /// across both restarts.
    pub fn check_restarts(partitions: &[Partition], outcome: &Outcome, limits: ReleaseLimits) -> Result<(), String> {
        for (checkpoint, committed) in &outcome.commits {
            let before = &outcome.released[..*committed];
            for first in 0..partitions.len() {
                let again = restart(partitions, checkpoint, first, limits)
                    .map_err(|why| format!("restart from {checkpoint:?}: {why}"))?;
                let both: Vec<_> = before.iter().chain(&again.released).copied().collect();
                let held = again.held_at_end.iter().copied();
                check_once(partitions, both.iter().map(|&(input, offset, _)| (input, offset)).chain(held))
                    .map_err(|why| format!("restart from {checkpoint:?} (first {first}): {why}"))?;
                if outcome.violations == 0 && again.violations == 0 {
                    check_order(partitions, &both).map_err(|why| format!("restart from {checkpoint:?}: {why}"))?;
                }
                if first != 0 {
                    continue;
                }
                // A second crash once the replay is over meets a stage like
                // any other, which the first crash already covers.
                let during_replay = &again.commits[..again.replay_commits.min(again.commits.len())];
                for (second, committed_again) in during_replay {
                    let third = restart(partitions, second, 1, limits)
                        .map_err(|why| format!("second restart from {second:?}: {why}"))?;
                    let all = before.iter().chain(&again.released[..*committed_again]).chain(&third.released);
                    let held = third.held_at_end.iter().copied();
                    check_once(partitions, all.map(|&(input, offset, _)| (input, offset)).chain(held))
                        .map_err(|why| format!("restart from {checkpoint:?}, then from {second:?}: {why}"))?;
                }
            }
            for (change, changed) in changes(partitions) {
                let again = restart(&changed, checkpoint, 0, limits)
                    .map_err(|why| format!("restart from {checkpoint:?} after {change}: {why}"))?;
                let both = before.iter().chain(&again.released).map(|&(input, offset, _)| (input, offset));
                check_once(partitions, both.chain(again.held_at_end.iter().copied()))
                    .map_err(|why| format!("restart from {checkpoint:?} after {change}: {why}"))?;
            }
            check_legacy_restart(partitions, checkpoint, before, limits)?;
        }
        Ok(())
    }

    /// What an operator may change in [`ReleaseLimits`] between two runs:
    /// the allowed lateness (to none, or one more) and the bound on event
    /// times ahead of their append time (to none, or to the largest).
    pub fn limit_changes(limits: ReleaseLimits) -> [(String, ReleaseLimits); 4] {
        let lateness = |allowed_lateness| ReleaseLimits { allowed_lateness, ..limits };
        let bound = |max_ahead| ReleaseLimits { max_ahead, ..limits };
        [
            ("no allowed lateness".to_owned(), lateness(0)),
            ("a raised allowed lateness".to_owned(), lateness(limits.allowed_lateness.saturating_add(1))),
            ("a bound of 0".to_owned(), bound(0)),
            ("the largest bound".to_owned(), bound(Millis::MAX)),
        ]
    }

    /// For every commit of `outcome`, restarts from it under each of
    /// [`limit_changes`] and checks that the committed releases and the
    /// restarted host's (with what it still holds at the end) release every
    /// record exactly once: a changed allowance or bound loses and repeats
    /// nothing (module docs, "Crash safety").
    pub fn check_restarts_with_changed_limits(
        partitions: &[Partition],
        outcome: &Outcome,
        limits: ReleaseLimits,
    ) -> Result<(), String> {
        for (checkpoint, committed) in &outcome.commits {
            let before = &outcome.released[..*committed];
            for (change, changed) in limit_changes(limits) {
                let again = restart(partitions, checkpoint, 0, changed)
                    .map_err(|why| format!("restart from {checkpoint:?} with {change}: {why}"))?;
                let both = before.iter().chain(&again.released).map(|&(input, offset, _)| (input, offset));
                check_once(partitions, both.chain(again.held_at_end.iter().copied()))
                    .map_err(|why| format!("restart from {checkpoint:?} with {change}: {why}"))?;
            }
        }
        Ok(())
    }

    /// What an operator or a module author may change between two runs:
    /// per input, its types start or stop declaring event time (a new
    /// module version, hot-reloaded or adopted), or its topic becomes a
    /// processing-time one (`--untimed-topic`) or stops being one.
    pub fn changes(partitions: &[Partition]) -> Vec<(String, Vec<Partition>)> {
        let mut all = Vec::new();
        for input in 0..partitions.len() {
            let mut flipped = partitions.to_vec();
            flipped[input].timed = !flipped[input].timed;
            all.push((format!("input {input} timed: {}", flipped[input].timed), flipped));
            let mut flipped = partitions.to_vec();
            flipped[input].input.clock = match flipped[input].input.clock {
                ClockSource::EventTime => ClockSource::ProcessingTime,
                ClockSource::ProcessingTime => ClockSource::EventTime,
            };
            all.push((format!("input {input} clock: {:?}", flipped[input].input.clock), flipped));
        }
        all
    }

    /// A checkpoint written before the held list (none): restored with
    /// the clock rule, which is exact as long as nothing changed between
    /// the runs; and so is a second crash during that replay.
    fn check_legacy_restart(
        partitions: &[Partition],
        checkpoint: &Checkpoint,
        before: &[(usize, u64, Release)],
        limits: ReleaseLimits,
    ) -> Result<(), String> {
        let mut legacy = checkpoint.clone();
        legacy.inputs.iter_mut().for_each(|input| input.held = None);
        let again = restart(partitions, &legacy, 0, limits).map_err(|why| format!("restart from {legacy:?}: {why}"))?;
        let both: Vec<_> = before.iter().chain(&again.released).copied().collect();
        let held = again.held_at_end.iter().copied();
        check_once(partitions, both.iter().map(|&(input, offset, _)| (input, offset)).chain(held))
            .map_err(|why| format!("restart from {legacy:?}: {why}"))?;
        for (second, committed_again) in &again.commits[..again.replay_commits.min(again.commits.len())] {
            let third = restart(partitions, second, 1, limits)
                .map_err(|why| format!("second restart from {second:?}: {why}"))?;
            let all = before.iter().chain(&again.released[..*committed_again]).chain(&third.released);
            let held = third.held_at_end.iter().copied();
            check_once(partitions, all.map(|&(input, offset, _)| (input, offset)).chain(held))
                .map_err(|why| format!("restart from {legacy:?}, then from {second:?}: {why}"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{
        Evidence, Outcome, Partition, Record, check_order, check_restarts, check_restarts_with_changed_limits, run,
    };
    use super::*;

    const EVENT_TIME: ClockSource = ClockSource::EventTime;

    /// The held runs of an input against a `BTreeSet` of the held offsets,
    /// removed in a scrambled order (event-time order is not offset order),
    /// with one offset held far ahead of the rest: the same offsets, lowest
    /// and count after every step, and never more runs than held offsets.
    #[test]
    fn held_runs_follow_a_set_and_stay_bounded() {
        for seed in 0..20u64 {
            let (mut ours, mut set) = (HeldRuns::default(), std::collections::BTreeSet::new());
            let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            let expanded =
                |runs: &HeldRuns| -> Vec<u64> { runs.runs.iter().flat_map(|run| run.start..run.end).collect() };
            for offset in 0..3_000u64 {
                // Every third offset is released at once, never held.
                if offset % 3 == 2 {
                    continue;
                }
                ours.insert(offset);
                set.insert(offset);
                // Remove about one held offset per insert, never offset 0:
                // it stays held to the end, in front of everything.
                while set.len() > 1 && next() % 2 == 0 {
                    let candidates: Vec<u64> = set.range(1..).copied().collect();
                    if candidates.is_empty() {
                        break;
                    }
                    let gone = candidates[(next() % candidates.len() as u64) as usize];
                    ours.remove(gone);
                    set.remove(&gone);
                }
                ours.remove(offset + 10_000); // not held: nothing changes
                assert_eq!((ours.first(), ours.len()), (set.first().copied(), set.len()), "seed {seed}");
                assert!(ours.runs.len() <= ours.len(), "seed {seed}");
                if offset % 97 == 0 {
                    assert_eq!(expanded(&ours), set.iter().copied().collect::<Vec<_>>(), "seed {seed}");
                }
            }
            assert_eq!(expanded(&ours), set.iter().copied().collect::<Vec<_>>(), "seed {seed}");
            for gone in set.clone() {
                ours.remove(gone);
                set.remove(&gone);
                assert_eq!((ours.first(), ours.len()), (set.first().copied(), set.len()));
            }
            assert!(ours.runs.is_empty());
        }
    }

    /// A checkpoint entry with its held list, runs as `(start, end)`.
    fn listed(commit: u64, read_to: u64, runs: &[(u64, u64)]) -> InputCheckpoint {
        let held = runs.iter().map(|&(start, end)| HeldRun { start, end }).collect();
        InputCheckpoint { commit, read_to, held: Some(held) }
    }

    /// A checkpoint entry as written before the held list.
    fn legacy(commit: u64, read_to: u64) -> InputCheckpoint {
        InputCheckpoint { commit, read_to, held: None }
    }

    fn input(topic: u32, clock: ClockSource) -> Input {
        Input { topic, partition: 0, clock }
    }

    /// A partition of topic `topic` whose records have these event times
    /// (key: record index modulo 2), all history.
    fn history(topic: u32, times: &[Option<Millis>]) -> Partition {
        let records = times.iter().enumerate().map(|(i, &event_time)| Record { event_time, key: (i % 2) as u8 });
        let records: Vec<Record> = records.collect();
        Partition {
            input: input(topic, EVENT_TIME),
            history: records.len(),
            end_after: vec![false; records.len()],
            records,
            timed: true,
        }
    }

    fn arrival(input: usize, offset: u64, event_time: Option<Millis>) -> Arrival<u64> {
        Arrival { input, offset, event_time, append_time: None, carried_time: event_time, bytes: 10, payload: offset }
    }

    fn stage(inputs: &[Input]) -> ReleaseStage<u64> {
        ReleaseStage::new(inputs, &vec![0; inputs.len()], ReleaseLimits::default()).unwrap()
    }

    fn offsets(released: &[Released<u64>]) -> Vec<(usize, u64)> {
        released.iter().map(|r| (r.input, r.offset)).collect()
    }

    #[test]
    fn the_start_up_race_gives_no_violation_with_the_offset_gate() {
        // Three topics of history; topic 2 connects late and is read last.
        let partitions = [
            history(0, &[Some(10), Some(20), Some(30)]),
            history(1, &[Some(15), Some(25), Some(35)]),
            history(2, &[Some(5), Some(12), Some(40)]),
        ];
        let schedule = [0, 1, 0, 1, 0, 1, 2, 2, 2];
        let gate = run(&partitions, &schedule, Evidence::Offsets, ReleaseLimits::default()).unwrap();
        assert_eq!(gate.violations, 0);
        check_order(&partitions, &gate.released).unwrap();
        // The timer rule marks topic 2 idle while it is still connecting:
        // the clock passes 5 and 12 before they are read.
        let timer = run(&partitions, &schedule, Evidence::Timer { quiet: 2 }, ReleaseLimits::default()).unwrap();
        assert_eq!(timer.violations, 2, "{timer:?}");
        let late: Vec<_> = timer.released.iter().filter(|r| matches!(r.2, Release::Late { .. })).collect();
        assert_eq!(late.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(), [(2, 0), (2, 1)]);
    }

    #[test]
    fn a_partition_not_read_yet_holds_the_clock() {
        let mut stage = stage(&[input(0, EVENT_TIME), input(1, EVENT_TIME)]);
        stage.observe_end(0, 2, 0).unwrap();
        stage.observe_end(1, 1, 0).unwrap();
        let mut out = Vec::new();
        assert_eq!(stage.read(arrival(0, 0, Some(10)), &mut out), Ok(Admission::Held));
        assert_eq!(stage.read(arrival(0, 1, Some(20)), &mut out), Ok(Admission::Held));
        stage.release(0, &mut out);
        assert_eq!((stage.clock(), out.len(), stage.held_events(), stage.held_bytes()), (None, 0, 2, 20));
        // Input 0 reached its start-up end: idle. Input 1 still counts.
        assert_eq!(stage.input_status(0).unwrap().progress, Progress::Idle { since: 0 });
        assert_eq!(stage.input_status(1).unwrap().progress, Progress::Counting);
        assert_eq!(stage.read(arrival(1, 0, Some(15)), &mut out), Ok(Admission::Held));
        stage.release(0, &mut out);
        // Everything is idle: every event read may go, in event-time order.
        assert_eq!(stage.clock(), Some(21));
        assert_eq!(offsets(&out), [(0, 0), (1, 0), (0, 1)]);
        assert!(out.iter().all(|r| r.release == Release::InOrder));
        assert_eq!(stage.checkpoint().inputs, [listed(2, 2, &[]), listed(1, 1, &[])]);
    }

    #[test]
    fn the_clock_is_the_minimum_of_the_counting_partitions_and_exclusive() {
        let mut stage = stage(&[input(0, EVENT_TIME), input(1, EVENT_TIME)]);
        let mut out = Vec::new();
        stage.read(arrival(0, 0, Some(10)), &mut out).unwrap();
        stage.read(arrival(1, 0, Some(10)), &mut out).unwrap();
        stage.read(arrival(0, 1, Some(30)), &mut out).unwrap();
        stage.release(0, &mut out);
        // Both count; the clock is 10 and events at 10 wait: input 1 may
        // still deliver another 10.
        assert_eq!((stage.clock(), out.len()), (Some(10), 0));
        stage.read(arrival(1, 1, Some(10)), &mut out).unwrap();
        stage.read(arrival(1, 2, Some(20)), &mut out).unwrap();
        stage.release(0, &mut out);
        assert_eq!(stage.clock(), Some(20));
        // Ties at 10 go by topic index, then offset.
        assert_eq!(offsets(&out), [(0, 0), (1, 0), (1, 1)]);
        assert_eq!(stage.checkpoint().inputs[0].commit, 1, "offset 1 of input 0 (30) is held");
        assert_eq!(stage.checkpoint().inputs[1].commit, 2, "offset 2 of input 1 (20) is held");
    }

    #[test]
    fn events_without_event_time_pass_at_once() {
        let mut stage = stage(&[input(0, EVENT_TIME), input(1, ClockSource::ProcessingTime)]);
        let mut out = Vec::new();
        assert_eq!(stage.read(arrival(0, 0, Some(10)), &mut out), Ok(Admission::Held));
        assert_eq!(stage.read(arrival(0, 1, None), &mut out), Ok(Admission::Released));
        // A processing-time partition's events pass at once whatever they say.
        assert_eq!(stage.read(arrival(1, 0, Some(1)), &mut out), Ok(Admission::Released));
        assert_eq!(offsets(&out), [(0, 1), (1, 0)]);
        assert!(out.iter().all(|r| r.release == Release::Untimed));
        // The held event keeps the commit of input 0 at offset 0.
        assert_eq!(stage.checkpoint().inputs[0], listed(0, 2, &[(0, 1)]));
        assert_eq!(stage.checkpoint().inputs[1], listed(1, 1, &[]));
    }

    #[test]
    fn a_late_event_is_released_at_once_and_counted_with_its_lateness() {
        let mut stage = stage(&[input(0, EVENT_TIME), input(1, EVENT_TIME)]);
        let mut out = Vec::new();
        stage.observe_end(1, 0, 0).unwrap();
        stage.read(arrival(0, 0, Some(50)), &mut out).unwrap();
        stage.observe_end(0, 1, 0).unwrap();
        stage.release(0, &mut out);
        assert_eq!((stage.clock(), offsets(&out)), (Some(51), vec![(0, 0)]));
        out.clear();
        // Input 1 was idle (empty at start-up) and now says 20: too late.
        assert_eq!(stage.read(arrival(1, 0, Some(20)), &mut out), Ok(Admission::Released));
        assert_eq!(out[0].release, Release::Late { by: 31 });
        assert_eq!(stage.violations(), 1);
        assert_eq!(stage.input_status(1).unwrap().progress, Progress::Counting, "new data: it counts again");
    }

    fn appended(input: usize, offset: u64, event_time: Millis, append_time: Option<Millis>) -> Arrival<u64> {
        Arrival { append_time, ..arrival(input, offset, Some(event_time)) }
    }

    /// Events stamped far ahead of their append time on one key (input 0,
    /// offsets 1 to 4) between ordinary ones: each is refused at once,
    /// none moves a clock, and the ordinary events of both inputs are
    /// released in event-time order with no violation.
    #[test]
    fn an_event_time_too_far_ahead_of_its_append_time_is_refused_and_moves_no_clock() {
        let mut stage = stage(&[input(0, EVENT_TIME), input(1, EVENT_TIME)]);
        let bound = ReleaseLimits::DEFAULT_MAX_AHEAD;
        let year_9999 = 253_402_300_799_000;
        let mut out = Vec::new();
        assert_eq!(stage.read(appended(0, 0, 1_000, Some(900)), &mut out), Ok(Admission::Held));
        for (offset, time) in [(1, Millis::MAX), (2, year_9999), (3, 2_000 + bound + 1)] {
            assert_eq!(stage.read(appended(0, offset, time, Some(2_000)), &mut out), Ok(Admission::Refused));
        }
        // No append time: no evidence to measure, but MAX never passes.
        assert_eq!(stage.read(appended(0, 4, Millis::MAX, None), &mut out), Ok(Admission::Refused));
        assert_eq!(stage.input_status(0).unwrap().clock, Some(1_000), "no refused time in the input's clock");
        // Exactly at the bound: admitted.
        assert_eq!(stage.read(appended(0, 5, 2_000 + bound, Some(2_000)), &mut out), Ok(Admission::Held));
        assert_eq!(stage.read(appended(1, 0, 1_500, Some(1_500)), &mut out), Ok(Admission::Held));
        assert_eq!(stage.read(appended(1, 1, 3_000, Some(3_000)), &mut out), Ok(Admission::Held));
        let refused: Vec<_> = out.drain(..).map(|r| (r.offset, r.release)).collect();
        assert_eq!(
            refused,
            [
                (1, Release::TooFarAhead { append_time: Some(2_000) }),
                (2, Release::TooFarAhead { append_time: Some(2_000) }),
                (3, Release::TooFarAhead { append_time: Some(2_000) }),
                (4, Release::TooFarAhead { append_time: None }),
            ]
        );
        stage.observe_end(0, 6, 0).unwrap();
        stage.observe_end(1, 2, 0).unwrap();
        stage.release(0, &mut out);
        assert_eq!(offsets(&out), [(0, 0), (1, 0), (1, 1), (0, 5)]);
        assert_eq!((stage.clock(), stage.violations()), (Some(2_000 + bound + 1), 0));
        // A restart re-reading them skips them: they went to the dead
        // letters when first read, and no held list names them; under a
        // raised bound too (only what is read for the first time is judged
        // by the bound in force). Offset 5 was listed: held again.
        let inputs = [input(0, EVENT_TIME), input(1, EVENT_TIME)];
        let raised = ReleaseLimits { max_ahead: Millis::MAX, ..ReleaseLimits::default() };
        let held = Some(vec![HeldRun { start: 5, end: 6 }]);
        for (held, limits) in
            [(held.clone(), ReleaseLimits::default()), (held, raised), (None, ReleaseLimits::default())]
        {
            let checkpoint = Checkpoint {
                clock: Some(1_200),
                inputs: vec![
                    InputCheckpoint { commit: 0, read_to: 6, held: held.clone() },
                    InputCheckpoint { commit: 0, read_to: 0, held: Some(Vec::new()) },
                ],
            };
            let mut restored = ReleaseStage::restore(&inputs, &checkpoint, limits).unwrap();
            let mut out = Vec::new();
            let again = [(0, 1_000, Some(900)), (1, Millis::MAX, Some(2_000)), (2, year_9999, Some(2_000))];
            for (offset, time, append_time) in again.into_iter().chain([(4, Millis::MAX, None)]) {
                let admission = restored.read(appended(0, offset, time, append_time), &mut out);
                assert_eq!(admission, Ok(Admission::AlreadyReleased), "{offset} with {held:?}");
            }
            let admission = restored.read(appended(0, 5, 2_000 + bound, Some(2_000)), &mut out);
            assert_eq!(admission, Ok(Admission::Held), "with {held:?}");
            assert!(out.is_empty());
        }
        // A raised bound admits what the default refused.
        assert!(raised.admits(year_9999, Some(0)) && !raised.admits(Millis::MAX, Some(0)));
        assert!(ReleaseLimits::default().admits(Millis::MIN, Some(Millis::MAX)));
    }

    /// The clock trails the evidence by the allowance: an event read after
    /// the evidence passed its time, by at most the allowance, is released
    /// in its place; one later is late by what exceeds the allowance.
    #[test]
    fn the_clock_trails_the_evidence_by_the_allowed_lateness() {
        let limits = ReleaseLimits { allowed_lateness: 1_000, ..ReleaseLimits::default() };
        let inputs = [input(0, EVENT_TIME), input(1, EVENT_TIME)];
        let mut stage: ReleaseStage<u64> = ReleaseStage::new(&inputs, &[0, 0], limits).unwrap();
        let mut out = Vec::new();
        stage.observe_end(0, 0, 0).unwrap();
        stage.observe_end(1, 0, 0).unwrap();
        // Caught up; live: an order at 5 000 (both idle again after it).
        stage.read(arrival(0, 0, Some(5_000)), &mut out).unwrap();
        stage.observe_end(0, 1, 10).unwrap();
        stage.release(10, &mut out);
        assert_eq!((stage.clock(), stage.held_events()), (Some(4_001), 1), "5 001 less the allowance");
        // A shipment of 4 500 read a second later: in its place.
        assert_eq!(stage.read(arrival(1, 0, Some(4_500)), &mut out), Ok(Admission::Held));
        stage.observe_end(1, 1, 20).unwrap();
        stage.release(20, &mut out);
        assert!(out.is_empty(), "nothing passed yet: 4 500 and 5 000 wait");
        stage.read(arrival(0, 1, Some(6_000)), &mut out).unwrap();
        stage.observe_end(0, 2, 30).unwrap();
        stage.release(30, &mut out);
        assert_eq!((offsets(&out), stage.clock()), (vec![(1, 0), (0, 0)], Some(5_001)));
        assert_eq!(stage.violations(), 0);
        // 3 000 is 3 001 below the evidence (6 001): late by 2 001, its
        // lateness less the allowance.
        stage.read(arrival(1, 1, Some(3_000)), &mut out).unwrap();
        assert_eq!(out.last().map(|r| r.release), Some(Release::Late { by: 2_001 }));
        // The allowance saturates with extreme times.
        let wide = ReleaseLimits { allowed_lateness: Millis::MAX, ..ReleaseLimits::default() };
        let mut stage: ReleaseStage<u64> = ReleaseStage::new(&inputs, &[0, 0], wide).unwrap();
        stage.read(appended(0, 0, Millis::MIN, Some(0)), &mut out).unwrap();
        stage.observe_end(0, 1, 0).unwrap();
        stage.observe_end(1, 0, 0).unwrap();
        stage.release(0, &mut out);
        assert_eq!((stage.clock(), stage.held_events()), (Some(Millis::MIN), 1));
    }

    #[test]
    fn an_idle_partition_that_receives_new_data_counts_again_until_the_log_says_it_is_at_its_end() {
        let mut stage = stage(&[input(0, EVENT_TIME), input(1, EVENT_TIME)]);
        let mut out = Vec::new();
        stage.observe_end(0, 1, 0).unwrap();
        stage.observe_end(1, 1, 0).unwrap();
        stage.read(arrival(0, 0, Some(10)), &mut out).unwrap();
        stage.read(arrival(1, 0, Some(10)), &mut out).unwrap();
        stage.release(0, &mut out);
        assert_eq!(stage.clock(), Some(11), "caught up: both idle");
        // Live data on input 1 after catch-up: it counts again, and input 0
        // (idle) does not hold it back.
        stage.read(arrival(1, 1, Some(30)), &mut out).unwrap();
        stage.read(arrival(1, 2, Some(40)), &mut out).unwrap();
        stage.release(5, &mut out);
        assert_eq!((stage.clock(), stage.held_events()), (Some(40), 1), "the highest time read from input 1");
        assert_eq!(stage.input_status(1).unwrap().progress, Progress::Counting);
        // A stale end offset (below the position) changes nothing.
        stage.observe_end(1, 2, 6).unwrap();
        stage.release(6, &mut out);
        assert_eq!(stage.input_status(1).unwrap().progress, Progress::Counting);
        // The poll found it at its end, read at instant 7: idle again.
        stage.observe_end(1, 3, 7).unwrap();
        stage.release(7, &mut out);
        assert_eq!(stage.input_status(1).unwrap().progress, Progress::Idle { since: 7 });
        assert_eq!((stage.clock(), stage.held_events()), (Some(41), 0));
        // An end offset above the position: idle once it gets there.
        stage.observe_end(0, 3, 8).unwrap();
        stage.read(arrival(0, 1, Some(45)), &mut out).unwrap();
        assert_eq!(stage.input_status(0).unwrap().progress, Progress::Counting);
        stage.read(arrival(0, 2, Some(46)), &mut out).unwrap();
        assert_eq!(stage.input_status(0).unwrap().progress, Progress::Idle { since: 8 });
    }

    #[test]
    fn the_processing_time_topic_is_the_clock_once_all_others_are_idle() {
        let inputs = [input(0, EVENT_TIME), input(1, ClockSource::ProcessingTime)];
        let mut stage = stage(&inputs);
        let mut out = Vec::new();
        stage.read(arrival(0, 0, Some(100)), &mut out).unwrap();
        stage.release(500, &mut out);
        assert_eq!(stage.clock(), Some(100), "while input 0 counts, processing time does not matter");
        stage.read(arrival(0, 1, Some(200)), &mut out).unwrap();
        stage.observe_end(0, 2, 150).unwrap();
        stage.release(170, &mut out);
        assert_eq!(stage.clock(), Some(150), "idle: the processing time of the evidence, not of the release");
        assert_eq!(offsets(&out), [(0, 0)]);
        assert_eq!(stage.held_events(), 1, "200 waits for the processing time to pass it");
        stage.release(300, &mut out);
        assert_eq!(stage.clock(), Some(150), "no new evidence, no move");
        stage.observe_end(0, 2, 201).unwrap();
        stage.release(300, &mut out);
        assert_eq!((stage.clock(), stage.held_events()), (Some(201), 0));
        // Live again: new data counts, holds the clock, and is in order.
        stage.read(arrival(0, 2, Some(250)), &mut out).unwrap();
        stage.release(400, &mut out);
        assert_eq!((stage.clock(), stage.held_events()), (Some(250), 1), "counting again: its own clock");
        stage.observe_end(0, 3, 260).unwrap();
        stage.release(400, &mut out);
        assert_eq!((stage.clock(), stage.held_events(), stage.violations()), (Some(260), 0, 0));
        // An event appended after the evidence with an earlier time is late.
        stage.read(arrival(0, 3, Some(255)), &mut out).unwrap();
        assert_eq!(out.last().map(|r| r.release), Some(Release::Late { by: 5 }));
        assert_eq!(stage.violations(), 1);
    }

    #[test]
    fn reading_only_the_laggards_keeps_held_bytes_bounded() {
        // Input 0 has a long history of early times; input 1 runs far ahead.
        let limits = ReleaseLimits { max_held_bytes: 30, ..ReleaseLimits::default() };
        let mut stage: ReleaseStage<u64> =
            ReleaseStage::new(&[input(0, EVENT_TIME), input(1, EVENT_TIME)], &[0, 0], limits).unwrap();
        stage.observe_end(0, 40, 0).unwrap();
        stage.observe_end(1, 40, 0).unwrap();
        let mut out = Vec::new();
        let mut next = [0u64; 2];
        let mut peak = 0;
        for step in 0..200 {
            let input = if step % 2 == 0 { 1 } else { 0 };
            let input = if stage.is_paused(input) || next[input] == 40 { 1 - input } else { input };
            if next[input] == 40 {
                break;
            }
            let time = if input == 0 { next[0] as Millis } else { 1000 + next[1] as Millis * 10 };
            stage.read(arrival(input, next[input], Some(time)), &mut out).unwrap();
            next[input] += 1;
            stage.release(0, &mut out);
            peak = peak.max(stage.held_bytes());
            assert!(!stage.paused().contains(&0) || stage.input_status(0).unwrap().progress != Progress::Counting);
        }
        assert!(stage.paused().is_empty() || next == [40, 40]);
        assert!(peak <= limits.max_held_bytes + 10, "peak {peak}");
        stage.release(0, &mut out);
        assert_eq!(out.len(), 80);
        assert_eq!(stage.violations(), 0);
    }

    #[test]
    fn a_restart_skips_what_was_released_and_holds_again_what_was_held() {
        let inputs = [input(0, EVENT_TIME), input(1, EVENT_TIME)];
        let mut stage = stage(&inputs);
        let mut out = Vec::new();
        stage.read(arrival(0, 0, Some(10)), &mut out).unwrap(); // released by the clock
        stage.read(arrival(0, 1, None), &mut out).unwrap(); // untimed: at once
        stage.read(arrival(0, 2, Some(30)), &mut out).unwrap(); // held
        stage.read(arrival(1, 0, Some(20)), &mut out).unwrap(); // held at the clock
        stage.release(0, &mut out);
        assert_eq!(offsets(&out), [(0, 1), (0, 0)]);
        let checkpoint = stage.checkpoint();
        assert_eq!(checkpoint.clock, Some(20));
        assert_eq!(checkpoint.inputs, [listed(2, 3, &[(2, 3)]), listed(0, 1, &[(0, 1)])]);
        let mut restored: ReleaseStage<u64> =
            ReleaseStage::restore(&inputs, &checkpoint, ReleaseLimits::default()).unwrap();
        let mut out = Vec::new();
        assert_eq!(restored.read(arrival(1, 0, Some(20)), &mut out), Ok(Admission::Held));
        assert_eq!(restored.read(arrival(0, 2, Some(30)), &mut out), Ok(Admission::Held));
        restored.observe_end(0, 3, 0).unwrap();
        restored.observe_end(1, 1, 0).unwrap();
        restored.release(0, &mut out);
        assert_eq!(offsets(&out), [(1, 0), (0, 2)]);
    }

    #[test]
    fn the_clock_waits_while_a_partition_replays() {
        // Input 0 is out of time order: 20, then 15. Before the crash the
        // clock was 10 and both were held.
        let inputs = [input(0, EVENT_TIME), input(1, EVENT_TIME)];
        let checkpoint = Checkpoint { clock: Some(10), inputs: vec![legacy(0, 2), legacy(0, 0)] };
        let mut stage: ReleaseStage<u64> =
            ReleaseStage::restore(&inputs, &checkpoint, ReleaseLimits::default()).unwrap();
        let mut out = Vec::new();
        stage.read(arrival(0, 0, Some(20)), &mut out).unwrap();
        stage.read(arrival(1, 0, Some(30)), &mut out).unwrap();
        stage.release(0, &mut out);
        // Without the wait the clock would be 20, and a second crash now
        // would judge 15 (not read again yet) released.
        assert_eq!(stage.clock(), Some(10));
        assert!(stage.input_status(0).unwrap().replaying);
        assert_eq!(stage.read(arrival(0, 1, Some(15)), &mut out), Ok(Admission::Held));
        stage.release(0, &mut out);
        assert_eq!(stage.clock(), Some(20));
        assert_eq!(offsets(&out), [(0, 1)]);
    }

    /// Input 0 holds 30 (offset 0) and released 10 (offset 1, in order);
    /// input 1 holds 20. The checkpoint lists the held offsets.
    fn two_held(inputs: &[Input]) -> Checkpoint {
        let mut stage = stage(inputs);
        let mut out = Vec::new();
        stage.read(arrival(0, 0, Some(30)), &mut out).unwrap();
        stage.read(arrival(1, 0, Some(20)), &mut out).unwrap();
        stage.read(arrival(0, 1, Some(10)), &mut out).unwrap();
        stage.release(0, &mut out);
        assert_eq!(offsets(&out), [(0, 1)]);
        let checkpoint = stage.checkpoint();
        assert_eq!(checkpoint.inputs, [listed(0, 2, &[(0, 1)]), listed(0, 1, &[(0, 1)])]);
        checkpoint
    }

    /// What a restarted stage releases from `checkpoint` when every record
    /// is read again as `read` says (offset, event time now, carried time).
    fn restarted(
        inputs: &[Input],
        checkpoint: &Checkpoint,
        read: &[(usize, u64, Option<Millis>, Option<Millis>)],
    ) -> Vec<Released<u64>> {
        let mut stage: ReleaseStage<u64> = ReleaseStage::restore(inputs, checkpoint, ReleaseLimits::default()).unwrap();
        let mut out = Vec::new();
        for &(input, offset, event_time, carried_time) in read {
            stage
                .read(
                    Arrival { input, offset, event_time, append_time: None, carried_time, bytes: 1, payload: offset },
                    &mut out,
                )
                .unwrap();
        }
        for (input, ends) in [(0, 2), (1, 1)] {
            stage.observe_end(input, ends, 100).unwrap();
        }
        stage.release(100, &mut out);
        out
    }

    #[test]
    fn a_held_event_is_held_again_under_its_header_time_when_its_type_stopped_declaring_one() {
        let inputs = [input(0, EVENT_TIME), input(1, EVENT_TIME)];
        let checkpoint = two_held(&inputs);
        // The new module version's types declare no event time.
        let read = [(0, 0, None, Some(30)), (0, 1, None, Some(10)), (1, 0, None, Some(20))];
        let out = restarted(&inputs, &checkpoint, &read);
        assert_eq!(offsets(&out), [(1, 0), (0, 0)], "both held ones, in event-time order; 10 not again");
        assert!(out.iter().all(|r| r.release == Release::InOrder), "{out:?}");
        // The rule before the list judged by today's declaration: lost.
        let mut old = checkpoint.clone();
        old.inputs.iter_mut().for_each(|input| input.held = None);
        assert_eq!(offsets(&restarted(&inputs, &old, &read)), []);
    }

    #[test]
    fn an_event_released_untimed_is_not_applied_again_when_its_type_starts_declaring_event_time() {
        let inputs = [input(0, EVENT_TIME), input(1, EVENT_TIME)];
        let mut stage = stage(&inputs);
        let mut out = Vec::new();
        // Another type's 60 is held in front; then the old version reads
        // the ledger untimed, though producers already stamp it 50.
        assert_eq!(stage.read(arrival(0, 0, Some(60)), &mut out), Ok(Admission::Held));
        let untimed = Arrival {
            input: 0,
            offset: 1,
            event_time: None,
            append_time: None,
            carried_time: Some(50),
            bytes: 1,
            payload: 1,
        };
        assert_eq!(stage.read(untimed, &mut out), Ok(Admission::Released));
        stage.read(arrival(1, 0, Some(20)), &mut out).unwrap();
        stage.release(0, &mut out);
        let checkpoint = stage.checkpoint();
        assert_eq!(checkpoint.inputs, [listed(0, 2, &[(0, 1)]), listed(0, 1, &[(0, 1)])]);
        let read = [(0, 0, Some(60), Some(60)), (0, 1, Some(50), Some(50)), (1, 0, Some(20), Some(20))];
        let out = restarted(&inputs, &checkpoint, &read);
        assert_eq!(offsets(&out), [(1, 0), (0, 0)], "50 was applied before the restart");
        let mut old = checkpoint.clone();
        old.inputs.iter_mut().for_each(|input| input.held = None);
        assert_eq!(offsets(&restarted(&inputs, &old, &read)), [(1, 0), (0, 1), (0, 0)], "the old rule: twice");
    }

    #[test]
    fn a_held_event_of_a_topic_made_processing_time_is_released_once_in_event_time_order() {
        let checkpoint = two_held(&[input(0, EVENT_TIME), input(1, EVENT_TIME)]);
        // `--untimed-topic` for both topics now.
        let inputs = [input(0, ClockSource::ProcessingTime), input(1, ClockSource::ProcessingTime)];
        let read = [(0, 0, Some(30), Some(30)), (0, 1, Some(10), Some(10)), (1, 0, Some(20), Some(20))];
        let out = restarted(&inputs, &checkpoint, &read);
        assert_eq!(offsets(&out), [(1, 0), (0, 0)]);
        // And back: nothing of the processing-time run is held, so nothing
        // is read as held again.
        let mut stage: ReleaseStage<u64> =
            ReleaseStage::restore(&inputs, &checkpoint, ReleaseLimits::default()).unwrap();
        let mut out = Vec::new();
        stage.read(arrival(0, 0, Some(30)), &mut out).unwrap();
        stage.read(arrival(0, 1, Some(10)), &mut out).unwrap();
        stage.read(arrival(0, 2, Some(40)), &mut out).unwrap();
        let (clock, checkpoint) = (stage.clock(), stage.checkpoint());
        assert_eq!(checkpoint.inputs[0], listed(0, 3, &[(0, 1)]), "held 30; 40 passed at once");
        assert_eq!(checkpoint.inputs[1], listed(0, 1, &[(0, 1)]), "not read again yet: the list carries it");
        let timed = [input(0, EVENT_TIME), input(1, EVENT_TIME)];
        let read = [(0, 0, Some(30), Some(30)), (0, 1, Some(10), Some(10)), (0, 2, Some(40), Some(40))];
        let again = restarted(&timed, &checkpoint, &[read[0], read[1], read[2], (1, 0, Some(20), Some(20))]);
        assert_eq!(offsets(&again), [(1, 0), (0, 0)], "40 not again; clock {clock:?}");
    }

    #[test]
    fn a_held_event_whose_header_lost_its_time_is_released_at_once_not_dropped() {
        let inputs = [input(0, EVENT_TIME), input(1, EVENT_TIME)];
        let checkpoint = two_held(&inputs);
        let read = [(0, 0, None, None), (0, 1, Some(10), Some(10)), (1, 0, Some(20), Some(20))];
        let out = restarted(&inputs, &checkpoint, &read);
        assert_eq!(offsets(&out), [(0, 0), (1, 0)]);
        assert_eq!(out[0].release, Release::Untimed);
    }

    #[test]
    fn a_held_list_out_of_its_range_is_refused() {
        let inputs = [input(0, EVENT_TIME)];
        for runs in [&[(1, 5)][..], &[(3, 3)], &[(3, 5), (4, 6)], &[(3, 7)]] {
            let checkpoint = Checkpoint { clock: None, inputs: vec![listed(2, 6, runs)] };
            let refused = ReleaseStage::<u64>::restore(&inputs, &checkpoint, ReleaseLimits::default()).unwrap_err();
            assert!(matches!(refused, ReleaseError::CheckpointHeldRun { input: 0, .. }), "{runs:?}: {refused}");
        }
    }

    #[test]
    fn a_checkpoint_of_before_the_held_list_reads_as_none_and_restores_with_the_clock_rule() {
        let old = r#"{"clock":15,"inputs":[{"commit":0,"read_to":2}]}"#;
        let checkpoint: Checkpoint = serde_json::from_str(old).unwrap();
        assert_eq!(checkpoint.inputs, [legacy(0, 2)]);
        let inputs = [input(0, EVENT_TIME)];
        let mut stage: ReleaseStage<u64> =
            ReleaseStage::restore(&inputs, &checkpoint, ReleaseLimits::default()).unwrap();
        let mut out = Vec::new();
        assert_eq!(stage.read(arrival(0, 0, Some(10)), &mut out), Ok(Admission::AlreadyReleased));
        assert_eq!(stage.checkpoint().inputs[0].held, None, "still replaying by the clock rule");
        assert_eq!(stage.read(arrival(0, 1, Some(20)), &mut out), Ok(Admission::Held));
        assert_eq!(stage.checkpoint().inputs[0], listed(1, 2, &[(1, 2)]), "replayed: the list from now on");
    }

    #[test]
    fn host_bugs_are_typed_errors() {
        let inputs = [input(0, EVENT_TIME)];
        let mut stage = stage(&inputs);
        let mut out = Vec::new();
        assert_eq!(stage.read(arrival(1, 0, None), &mut out), Err(ReleaseError::UnknownInput { input: 1, inputs: 1 }));
        assert_eq!(stage.observe_end(3, 0, 0), Err(ReleaseError::UnknownInput { input: 3, inputs: 1 }));
        stage.read(arrival(0, 5, None), &mut out).unwrap();
        assert_eq!(
            stage.read(arrival(0, 5, None), &mut out),
            Err(ReleaseError::OffsetBehind { input: 0, offset: 5, position: 6 })
        );
        let checkpoint = Checkpoint::start(&[0, 0]);
        let refused = ReleaseStage::<u64>::restore(&inputs, &checkpoint, ReleaseLimits::default()).unwrap_err();
        assert_eq!(refused, ReleaseError::CheckpointInputs { expected: 1, found: 2 });
        let checkpoint = Checkpoint { clock: None, inputs: vec![legacy(3, 2)] };
        let refused = ReleaseStage::<u64>::restore(&inputs, &checkpoint, ReleaseLimits::default()).unwrap_err();
        assert!(refused.to_string().contains("past read_to 2"), "{refused}");
    }

    /// Every order in which a host can read `lens[i]` records of input `i`,
    /// one record at a time.
    fn interleavings(lens: &[usize]) -> Vec<Vec<usize>> {
        fn visit(left: &mut [usize], schedule: &mut Vec<usize>, all: &mut Vec<Vec<usize>>) {
            if left.iter().all(|&n| n == 0) {
                all.push(schedule.clone());
                return;
            }
            for input in 0..left.len() {
                if left[input] > 0 {
                    left[input] -= 1;
                    schedule.push(input);
                    visit(left, schedule, all);
                    schedule.pop();
                    left[input] += 1;
                }
            }
        }
        let mut all = Vec::new();
        visit(&mut lens.to_vec(), &mut Vec::new(), &mut all);
        all
    }

    /// Every sequence of up to `max_len` records over `times`.
    fn sequences(times: &[Option<Millis>], max_len: usize) -> Vec<Vec<Option<Millis>>> {
        let mut all = vec![vec![]];
        let mut last = vec![vec![]];
        for _ in 0..max_len {
            last = last
                .iter()
                .flat_map(|seq: &Vec<_>| times.iter().map(move |&t| [seq.clone(), vec![t]].concat()))
                .collect();
            all.extend(last.iter().cloned());
        }
        all
    }

    /// Every way one partition of topic `topic` can look: up to two records
    /// over {untimed, 0, 1, 2}, any split into history and live, and for
    /// each live record whether its poll reported the end.
    fn partitions_of(topic: u32) -> Vec<Partition> {
        let mut all = Vec::new();
        for times in sequences(&[None, Some(0), Some(1), Some(2)], 2) {
            let len = times.len();
            for history_len in 0..=len {
                let live = len - history_len;
                for ends in 0..(1u32 << live) {
                    let mut partition = history(topic, &times);
                    partition.history = history_len;
                    for (i, end) in partition.end_after.iter_mut().enumerate().skip(history_len) {
                        *end = ends & (1 << (i - history_len)) != 0;
                    }
                    partition
                        .records
                        .iter_mut()
                        .enumerate()
                        .for_each(|(i, r)| r.key = ((i + topic as usize) % 2) as u8);
                    all.push(partition);
                }
            }
        }
        all
    }

    /// Every pair of partitions of [`partitions_of`], with and without a
    /// processing-time topic beside them, in every interleaving of reads:
    /// every record released exactly once; the clock never going back nor
    /// passing an unread event of a counting partition; release order per
    /// key (and overall) whenever no violation is counted; no violation when
    /// everything is history read in time order; and for a crash after every
    /// step, and a second one after every step of the restarted host,
    /// nothing lost and nothing released twice.
    #[test]
    fn every_interleaving_of_two_partitions_keeps_the_rules() {
        let limits = ReleaseLimits { max_held_bytes: 1, ..ReleaseLimits::default() };
        let runs = for_every_pair(|partitions| check_every_schedule(partitions, limits));
        assert!(runs > 100_000, "{runs}");
    }

    /// Calls `check` on every pair of partitions of [`partitions_of`], with
    /// and without a processing-time topic beside them, spread over the
    /// machine's threads; the sum of what it returns.
    fn for_every_pair(check: impl Fn(&[Partition]) -> usize + Sync) -> usize {
        let lefts = partitions_of(0);
        let rights = partitions_of(1);
        assert_eq!(lefts.len(), 1 + 4 * 3 + 16 * 7);
        std::thread::scope(|scope| {
            let threads = std::thread::available_parallelism().map_or(1, usize::from);
            let workers: Vec<_> = (0..threads)
                .map(|thread| {
                    let (lefts, rights, check) = (&lefts, &rights, &check);
                    scope.spawn(move || {
                        let mut runs = 0;
                        for left in lefts.iter().skip(thread).step_by(threads) {
                            for right in rights {
                                for with_processing_time in [false, true] {
                                    let mut partitions = vec![left.clone(), right.clone()];
                                    if with_processing_time {
                                        let mut clock = history(2, &[]);
                                        clock.input.clock = ClockSource::ProcessingTime;
                                        partitions.push(clock);
                                    }
                                    runs += check(&partitions);
                                }
                            }
                        }
                        runs
                    })
                })
                .collect();
            workers.into_iter().map(|worker| worker.join().unwrap()).sum()
        })
    }

    /// The late events of an outcome, with their lateness.
    fn late_events(outcome: &Outcome) -> Vec<(usize, u64, Millis)> {
        let late = outcome.released.iter().filter_map(|&(input, offset, release)| match release {
            Release::Late { by } => Some((input, offset, by)),
            _ => None,
        });
        late.collect()
    }

    /// Every pair of partitions, every interleaving, with an allowed
    /// lateness of 1 and 2 against none: the clock trails the one without
    /// an allowance by it, so exactly the events late by more than the
    /// allowance without it are late with it, by their lateness less the
    /// allowance, and every other one is released in its place (release
    /// order per key when none is late); a crash after every step (with an
    /// allowance of 1) loses and repeats nothing, also when the next run
    /// has another allowance or bound.
    #[test]
    fn every_interleaving_with_an_allowed_lateness_releases_in_place_what_is_at_most_that_late() {
        let runs = for_every_pair(|partitions| {
            let lens: Vec<usize> = partitions.iter().map(|p| p.records.len()).collect();
            let mut runs = 0;
            for schedule in interleavings(&lens) {
                let context = || format!("\n  partitions: {partitions:?}\n  schedule: {schedule:?}");
                let none = run(partitions, &schedule, Evidence::Offsets, ReleaseLimits::default())
                    .unwrap_or_else(|why| panic!("{why}{}", context()));
                for allowance in [1, 2] {
                    let limits = ReleaseLimits { allowed_lateness: allowance, ..ReleaseLimits::default() };
                    let with = run(partitions, &schedule, Evidence::Offsets, limits)
                        .unwrap_or_else(|why| panic!("{why}{}", context()));
                    let expected: Vec<_> = late_events(&none)
                        .into_iter()
                        .filter(|&(_, _, by)| by > allowance)
                        .map(|(input, offset, by)| (input, offset, by - allowance))
                        .collect();
                    let mut late = late_events(&with);
                    late.sort_unstable();
                    let mut expected = expected;
                    expected.sort_unstable();
                    assert_eq!(late, expected, "allowance {allowance}{}", context());
                    if with.violations == 0 {
                        check_order(partitions, &with.released).unwrap_or_else(|why| panic!("{why}{}", context()));
                    }
                    if allowance == 1 {
                        check_restarts(partitions, &with, limits).unwrap_or_else(|why| panic!("{why}{}", context()));
                        check_restarts_with_changed_limits(partitions, &with, limits)
                            .unwrap_or_else(|why| panic!("{why}{}", context()));
                    }
                    runs += 1;
                }
            }
            runs
        });
        assert!(runs > 100_000, "{runs}");
    }

    /// Every pair of partitions, every interleaving, every record appended
    /// at instant 0 and a bound of 1: the records of time 2 are refused,
    /// and everything else is released exactly as if they carried no event
    /// time (one too far ahead changes nothing for any other event, of its
    /// key or another); a crash after every step loses and repeats nothing,
    /// also when the next run has another allowance or bound.
    #[test]
    fn every_interleaving_with_a_bound_releases_the_rest_as_if_the_refused_had_no_time() {
        let bound = ReleaseLimits { max_ahead: 1, ..ReleaseLimits::default() };
        let runs = for_every_pair(|partitions| {
            let mut untimed = partitions.to_vec();
            for record in untimed.iter_mut().flat_map(|p| p.records.iter_mut()) {
                record.event_time = record.event_time.filter(|&time| time <= 1);
            }
            let lens: Vec<usize> = partitions.iter().map(|p| p.records.len()).collect();
            let mut runs = 0;
            for schedule in interleavings(&lens) {
                let context = || format!("\n  partitions: {partitions:?}\n  schedule: {schedule:?}");
                let refused = run(partitions, &schedule, Evidence::Offsets, bound)
                    .unwrap_or_else(|why| panic!("{why}{}", context()));
                let without = run(&untimed, &schedule, Evidence::Offsets, ReleaseLimits::default())
                    .unwrap_or_else(|why| panic!("{why}{}", context()));
                let as_untimed: Vec<_> = refused
                    .released
                    .iter()
                    .map(|&(input, offset, release)| {
                        let time = partitions[input].records[offset as usize].event_time;
                        let timed_partition = partitions[input].input.clock == EVENT_TIME;
                        let expected_refusal = time == Some(2) && timed_partition;
                        let is_refusal = matches!(release, Release::TooFarAhead { append_time: Some(0) });
                        assert_eq!(is_refusal, expected_refusal, "{input}/{offset}{}", context());
                        (input, offset, if is_refusal { Release::Untimed } else { release })
                    })
                    .collect();
                assert_eq!(as_untimed, without.released, "{}", context());
                check_restarts(partitions, &refused, bound).unwrap_or_else(|why| panic!("{why}{}", context()));
                check_restarts_with_changed_limits(partitions, &refused, bound)
                    .unwrap_or_else(|why| panic!("{why}{}", context()));
                runs += 1;
            }
            runs
        });
        assert!(runs > 50_000, "{runs}");
    }

    fn check_every_schedule(partitions: &[Partition], limits: ReleaseLimits) -> usize {
        let lens: Vec<usize> = partitions.iter().map(|p| p.records.len()).collect();
        let all_history_in_order = partitions.iter().all(|p| p.history == p.records.len() && p.in_time_order());
        let mut runs = 0;
        for schedule in interleavings(&lens) {
            let context = || format!("\n  partitions: {partitions:?}\n  schedule: {schedule:?}");
            let outcome = run(partitions, &schedule, Evidence::Offsets, limits)
                .unwrap_or_else(|why| panic!("{why}{}", context()));
            if outcome.violations == 0 {
                check_order(partitions, &outcome.released).unwrap_or_else(|why| panic!("{why}{}", context()));
            }
            if all_history_in_order {
                assert_eq!(outcome.violations, 0, "{outcome:?}{}", context());
            }
            check_restarts(partitions, &outcome, limits).unwrap_or_else(|why| panic!("{why}{}", context()));
            runs += 1;
        }
        runs
    }

    /// The start-up race over three topics: every history of up to two
    /// records per partition over event times {0, 1, 2}, read in every
    /// interleaving. With the offset gate, a history in time order never
    /// gives a violation and is released in order; the timer rule (a
    /// partition not read for two steps is idle) gives violations in some.
    #[test]
    fn every_start_up_race_of_three_partitions_is_violation_free_with_the_offset_gate() {
        let histories = sequences(&[Some(0), Some(1), Some(2)], 2);
        assert_eq!(histories.len(), 13);
        let (mut in_order_runs, mut timer_violating, mut gate_violating) = (0, 0, 0);
        for a in &histories {
            for b in &histories {
                for c in &histories {
                    let partitions = [history(0, a), history(1, b), history(2, c)];
                    let in_order = partitions.iter().all(Partition::in_time_order);
                    for schedule in interleavings(&[a.len(), b.len(), c.len()]) {
                        let context = || format!("\n  partitions: {partitions:?}\n  schedule: {schedule:?}");
                        let gate = run(&partitions, &schedule, Evidence::Offsets, ReleaseLimits::default())
                            .unwrap_or_else(|why| panic!("{why}{}", context()));
                        let timer = run(&partitions, &schedule, Evidence::Timer { quiet: 2 }, ReleaseLimits::default())
                            .unwrap_or_else(|why| panic!("{why}{}", context()));
                        if gate.violations > 0 {
                            gate_violating += 1;
                        }
                        if in_order {
                            in_order_runs += 1;
                            assert_eq!(gate.violations, 0, "{gate:?}{}", context());
                            check_order(&partitions, &gate.released).unwrap_or_else(|why| panic!("{why}{}", context()));
                            if timer.violations > 0 {
                                timer_violating += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(in_order_runs > 10_000, "{in_order_runs}");
        assert!(timer_violating > in_order_runs / 10, "the timer rule: {timer_violating} of {in_order_runs}");
        // Only histories out of time order can give the gate a violation.
        assert!(gate_violating > 0);
    }
}
