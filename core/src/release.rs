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
//! - the clock.
//!
//! The rule on restart ([`ReleaseStage::restore`]): an event at an offset
//! below `read_to` was read before; it was released then if and only if it
//! has no event time or its time is below the committed clock (every event
//! read is released at once or held until the clock passes it, and the clock
//! only grows). Such an event is skipped ([`Admission::AlreadyReleased`]);
//! every other one is held again. So nothing is released twice and nothing
//! is lost, whenever the crash happens. Until every input partition has read
//! up to its `read_to` again, the clock stays at the committed one, and a
//! replaying partition is never paused: otherwise a crash during the replay
//! would leave a checkpoint whose clock judges wrongly an event not yet read
//! again.
//!
//! The rule needs the same event times on every reading: the host derives an
//! arrival's event time from the record alone (its `waku-event-time` header
//! and the declaration of its type by the module version recorded as
//! active, see [`crate::event`]).

use std::collections::{BTreeMap, BTreeSet};

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
}

impl Default for ReleaseLimits {
    fn default() -> Self {
        ReleaseLimits { max_held_bytes: 64 << 20 }
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputCheckpoint {
    /// Where reading resumes: the lowest held offset, or the position when
    /// nothing is held. Never past a held event.
    pub commit: u64,
    /// The highest position ever reached: below it, the restart rule decides
    /// what was released.
    pub read_to: u64,
}

impl Checkpoint {
    /// The checkpoint of a projection that has read nothing: every input
    /// partition starts at `positions` (one per input).
    pub fn start(positions: &[u64]) -> Checkpoint {
        Checkpoint {
            clock: None,
            inputs: positions.iter().map(|&at| InputCheckpoint { commit: at, read_to: at }).collect(),
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
    held: BTreeSet<u64>,
}

impl InputState {
    fn counts(&self) -> bool {
        self.input.clock == ClockSource::EventTime && self.idle_since.is_none()
    }

    fn replaying(&self) -> bool {
        self.position < self.replay_to
    }
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
            states.push(InputState {
                input,
                position: saved.commit,
                replay_to: saved.read_to,
                clock: None,
                pending_end: None,
                idle_since: None,
                held: BTreeSet::new(),
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
        let Arrival { input, offset, event_time, bytes, payload } = arrival;
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
        if let Some(time) = event_time {
            state.clock = state.clock.max(Some(time));
        }
        let topic = state.input.topic;
        let partition = state.input.partition;
        if was_replaying && !state.replaying() {
            self.replaying -= 1;
        }
        let released_before = match (event_time, self.restored_clock) {
            (None, _) => true,
            (Some(time), Some(clock)) => time < clock,
            (Some(_), None) => false,
        };
        if replayed && released_before {
            return Ok(Admission::AlreadyReleased);
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
        if let Some(clock) = self.clock_allowed(now) {
            self.clock = self.clock.max(Some(clock));
        }
        let Some(clock) = self.clock else { return };
        while let Some(entry) = self.held.first_entry() {
            if entry.key().event_time >= clock {
                break;
            }
            let (key, held) = entry.remove_entry();
            self.inputs[held.input].held.remove(&key.offset);
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
        let mut counting = self.inputs.iter().filter(|state| state.counts()).peekable();
        if counting.peek().is_some() {
            // A counting input that has said nothing holds the clock.
            return counting.map(|state| state.clock).min().flatten();
        }
        if self.has_processing_time {
            return Some(now);
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
                    commit: state.held.first().copied().unwrap_or(state.position).min(state.position),
                    read_to: state.position.max(state.replay_to),
                })
                .collect(),
        }
    }

    /// The projection's clock: every held event below it has been released.
    pub fn clock(&self) -> Option<Millis> {
        self.clock
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
        let laggard = state.counts() && state.clock.is_none_or(|clock| self.clock.is_some_and(|now| clock <= now));
        !laggard
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
