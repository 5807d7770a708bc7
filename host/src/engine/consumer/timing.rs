//! Event time across topics: the consumer's side of the release stage
//! ([`wakuwaku_core::release`]) for a projection over several
//! co-partitioned topics.
//!
//! One partition task holds one partition index across every topic of the
//! projection (its inputs, in the order the topics are given), so a key's
//! events from every topic meet here. Each step reads every input that is
//! not paused, hands each record to the stage with its `waku-event-time`
//! header, and applies what the stage releases as one batch, in release
//! order, through the same planner, reduction, retries, dead letters and
//! commit as a one-topic batch ([`super::batch`]).
//!
//! Rules it keeps:
//! - **The clock moves only on evidence.** Before anything is read, every
//!   input's end offset is read and reported to the stage; afterwards an
//!   input's end offset is read again right after a poll that read all the
//!   log had, and reported with the instant it was read. An input counts
//!   toward the clock until its position reached such an end offset. No
//!   timer marks an input idle: a topic whose partitions are read late at
//!   start-up (the start-up race) holds the clock back, because its
//!   position is below the end offset read before.
//! - **A topic without event time is the processing-time clock**
//!   ([`super::ConsumerConfig::untimed_topics`], `--untimed-topic`): its
//!   events pass at once, and once every other input is idle the clock is
//!   the instant they were last found at their ends, taken before the log
//!   is asked; so it moves with processing time while the log says the
//!   others are done, and never past what was in the log at that instant.
//! - **Events without event time pass at once**, as they arrive: those of
//!   a type declared untimed (`event-time-untimed`: a `waku-event-time`
//!   header on them is ignored) and those of a tag no module declares
//!   without the header. A message whose headers, that header included,
//!   cannot be read passes at once too, and so does one of a timed type
//!   without the header: the batch dead-letters both with the reason
//!   (`event-time-declared` for the second), as in a one-topic batch.
//! - **Event times are bounded by the log's evidence**: each record goes to
//!   the stage with the time the log appended it
//!   ([`crate::storage::log::RecordView::append_time`]), and one whose event time is
//!   further ahead of it than `--max-event-time-ahead`
//!   ([`ReleaseLimits::max_ahead`]) is refused by the stage and
//!   dead-lettered by the batch with a reason naming its event time, its
//!   append time, the bound and the setting that raises it
//!   ([`ReleasedProgress::refused`]). It never holds or moves a clock, so
//!   every reading of the log (live, restart, reset, rebuild) judges it the
//!   same way and no wall clock decides.
//! - **The clock trails the evidence by `--allowed-lateness`**
//!   ([`ReleaseLimits::allowed_lateness`]): an event read at most that late
//!   is applied in its place.
//! - **Late events are delivered, never dropped**: released at once,
//!   counted (`order_violations` in the statistics, committed with the
//!   batch; `waku_order_violations_total`) and logged with their key and
//!   lateness.
//! - **Exactly once across crashes.** The stage's checkpoint (where each
//!   input resumes: never past a held event; how far each had read; the
//!   clock) is committed in the transaction of the batch that applies what
//!   it released ([`super::release_marks`]). Held events stay in the log:
//!   a restart reads them again from the committed positions, and the
//!   stage skips what was released before. Released events not yet
//!   committed stay pending and are applied before anything more is read.
//! - **Bounded.** Inputs the stage pauses (held bytes over
//!   [`super::ConsumerConfig::release`]) are not read until it lets them
//!   go on. A held record is its stored encoding copied out of its poll
//!   alone ([`EncodedRecord`]), so what is held is what is counted: no
//!   record keeps a poll's buffer alive. It goes into the released batch
//!   as it is, never decoded or encoded again.
//! - **Each released record keeps its topic** (its input's index,
//!   [`crate::storage::log::RecordView::input`]): the batch routes it to retry or
//!   the dead-letter topic naming the topic it was read from.

use wakuwaku_core::release::{
    Admission, Arrival, ClockSource, Input, Millis, Release, ReleaseLimits, ReleaseStage, Released,
};

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::ConsumerError;
use super::batch::ReleasedProgress;
use super::parts::Parts;
use super::release_marks;
use super::timing_status::{LateEvent, PartitionTiming, TimingBoard};
use crate::engine::projection::ModuleSet;
use crate::event::Envelope;
use crate::key::Key;
use crate::storage::log::{EncodedRecord, EventLog, PolledBatch, RecordView};

/// The release stage of one partition index, and what its steps keep.
pub(super) struct Timed {
    /// The projection's topics: one input each, in this order.
    topics: Vec<String>,
    stage: ReleaseStage<EncodedRecord>,
    /// Each input's end offset read when the partition was taken: catching
    /// up ends once every input reached it and nothing is held.
    start_ends: Vec<u64>,
    /// Released events not committed yet, in release order, each with
    /// its input ([`crate::storage::log::RecordView::input`]). The batch handed
    /// out comes back at its commit ([`Timed::committed`]) and is filled
    /// again, so its buffers grow once rather than anew per batch.
    pending: PolledBatch,
    /// Released events as the stage hands them out.
    released: Vec<Released<EncodedRecord>>,
    /// The last poll's batch, reused by the next one (a poll buffer of
    /// its own: the released batch never takes its place).
    spare: PolledBatch,
    /// Late events already committed (counted in the statistics).
    violations_committed: u64,
    /// When the pending events were released, and how many of them in
    /// event-time order: their release latency is counted at their commit.
    pending_since: Option<Instant>,
    pending_in_order: u64,
    /// The most bytes held at once.
    peak_held_bytes: u64,
    /// Which inputs were paused at the last read: a change is logged.
    paused: Vec<bool>,
    /// The refused events among the pending ones, with their reasons
    /// ([`ReleasedProgress::refused`]).
    refused: HashMap<(u32, u64), String>,
    /// The late events among the pending ones, by (input, offset)
    /// ([`ReleasedProgress::late`]).
    late: HashSet<(u32, u64)>,
}

/// What one read of the stage found ([`Timed::read`]).
pub(super) enum TimedRead {
    /// Released events to apply as one batch, with what their commit
    /// records.
    Released(PolledBatch, Box<ReleasedProgress>),
    /// Every input reached its end offset read at the start, and nothing
    /// waits to be applied.
    CaughtUp,
    /// Something was read but nothing released: the clock waits for the
    /// other inputs, so read on at once.
    ReadSome,
    /// Nothing was read.
    Nothing,
}

impl Timed {
    /// Whether every input reached its end offset read at the start and
    /// nothing waits.
    ///
    /// Events still held once the stage is [settled](ReleaseStage::settled)
    /// wait for evidence the log does not hold yet (an allowed lateness, a
    /// processing time to come): they stay held, and the committed
    /// positions stay before them.
    fn caught_up(&self) -> bool {
        self.pending.is_empty()
            && (self.stage.held_events() == 0 || self.stage.settled())
            && (0..self.topics.len())
                .all(|input| self.stage.input_status(input).is_some_and(|s| s.position >= self.start_ends[input]))
    }

    /// What the caught-up gate counts for a partition index: the sum of the
    /// inputs' committed positions, or of their read positions once the
    /// stage is settled and nothing released waits for its commit (what is
    /// held then waits for evidence the log does not hold yet).
    pub(super) fn gate_position(&self) -> u64 {
        let checkpoint = self.stage.checkpoint();
        if self.pending.is_empty() && self.stage.settled() {
            return (0..self.topics.len()).filter_map(|input| self.stage.input_status(input)).map(|s| s.position).sum();
        }
        checkpoint.inputs.iter().map(|input| input.commit).sum()
    }

    /// The projection's clock, as the stage holds it now.
    pub(super) fn clock(&self) -> Option<Millis> {
        self.stage.clock()
    }

    /// The progress to commit with a batch of no released events (one
    /// that fires timers only): the stage's checkpoint now. Nothing is
    /// pending when the loop asks (it found nothing to apply).
    pub(super) fn progress_now(&self) -> ReleasedProgress {
        self.progress()
    }

    /// The progress to commit with the pending events.
    fn progress(&self) -> ReleasedProgress {
        ReleasedProgress {
            topics: self.topics.clone(),
            checkpoint: self.stage.checkpoint(),
            violations: self.stage.violations() - self.violations_committed,
            refused: self.refused.clone(),
            late: self.late.clone(),
        }
    }

    /// After the pending batch committed: it is done, and so are its late
    /// events.
    pub(super) fn committed(&mut self, batch: PolledBatch, progress: &ReleasedProgress, board: &TimingBoard) {
        self.violations_committed += progress.violations;
        self.refused.clear();
        self.late.clear();
        if let Some(since) = self.pending_since.take() {
            board.released(since.elapsed(), std::mem::take(&mut self.pending_in_order));
        }
        self.pending = batch;
        self.pending.clear();
    }

    /// After the pending batch failed: it is applied again next time.
    pub(super) fn not_committed(&mut self, batch: PolledBatch) {
        self.pending = batch;
    }
}

impl Timed {
    /// Starts the release stage of `partition` across the projection's
    /// topics: restored from its committed checkpoint, then told every
    /// input's end offset before anything is read.
    pub(super) async fn start<L: EventLog>(parts: &Parts<L>, partition: u32) -> Result<Timed, ConsumerError> {
        let topics = parts.projection.topics().to_vec();
        let store = parts.projection.store();
        let checkpoint = release_marks::restore(store, &topics, partition)?;
        let clock = |topic: &String| match parts.config.untimed_topics.contains(topic) {
            true => ClockSource::ProcessingTime,
            false => ClockSource::EventTime,
        };
        let inputs: Vec<Input> =
            topics.iter().zip(0..).map(|(name, topic)| Input { topic, partition, clock: clock(name) }).collect();
        let mut stage = ReleaseStage::restore(&inputs, &checkpoint, parts.config.release)?;
        let mut start_ends = Vec::with_capacity(topics.len());
        for (input, topic) in topics.iter().enumerate() {
            // The instant before the log is asked: everything appended
            // before it is below the end offset the log reports.
            let at = now();
            let end = parts.log.end_offset(topic, partition).await?;
            stage.observe_end(input, end, at)?;
            start_ends.push(end);
        }
        tracing::info!(
            projection = parts.projection.name(),
            partition,
            clock = checkpoint.clock,
            "partition {partition} reads {} topics in event-time order (end offsets at start: {start_ends:?})",
            topics.len()
        );
        let timed = Timed {
            topics,
            stage,
            start_ends,
            pending: PolledBatch::new(),
            released: Vec::new(),
            spare: PolledBatch::new(),
            violations_committed: 0,
            pending_since: None,
            pending_in_order: 0,
            peak_held_bytes: 0,
            paused: Vec::new(),
            refused: HashMap::new(),
            late: HashSet::new(),
        };
        parts.timing.update(PartitionTiming::of(partition, &timed.topics, &timed.stage, now(), 0));
        Ok(timed)
    }

    /// One read of a timed partition: the pending events if a commit of
    /// them failed, else every input that is not paused read once and what
    /// the stage releases then. `catching_up`: stop at the end offsets read
    /// at the start.
    pub(super) async fn read<L: EventLog>(
        &mut self,
        parts: &Parts<L>,
        partition: u32,
        catching_up: bool,
    ) -> Result<TimedRead, ConsumerError> {
        if !self.pending.is_empty() {
            return Ok(TimedRead::Released(std::mem::take(&mut self.pending), Box::new(self.progress())));
        }
        if catching_up && self.caught_up() {
            return Ok(TimedRead::CaughtUp);
        }
        let read = self.read_inputs(parts, partition).await?;
        self.peak_held_bytes = self.peak_held_bytes.max(self.stage.held_bytes());
        self.stage.release(now(), &mut self.released);
        if !self.released.is_empty() {
            self.pending_since = Some(Instant::now());
        }
        let bytes = self.released.iter().map(|released| released.payload.encoded_len()).sum();
        self.pending.reserve(self.released.len(), bytes);
        for released in self.released.drain(..) {
            self.pending_in_order += u64::from(released.release == Release::InOrder);
            // An input index fits: the inputs are the projection's topics.
            let input = u32::try_from(released.input).unwrap_or(u32::MAX);
            if matches!(released.release, Release::Late { .. }) {
                self.late.insert((input, released.offset));
            }
            self.pending.push_record(released.offset, input, &released.payload);
        }
        self.show_timing(parts, partition);
        if !self.pending.is_empty() {
            return Ok(TimedRead::Released(std::mem::take(&mut self.pending), Box::new(self.progress())));
        }
        if self.stage.settled() {
            // Nothing to commit, but what is held waits for new evidence.
            parts.progress.advance(partition, self.gate_position());
        }
        // Something read but nothing released: read on at once, the
        // clock waits for the other inputs.
        Ok(if read { TimedRead::ReadSome } else { TimedRead::Nothing })
    }

    /// Polls every input the stage does not pause, once, and hands what it
    /// read to the stage. An input whose poll read all the log had gets
    /// its end offset read now and reported. Says whether anything was
    /// read.
    async fn read_inputs<L: EventLog>(&mut self, parts: &Parts<L>, partition: u32) -> Result<bool, ConsumerError> {
        let mut read_any = false;
        let share = (parts.config.batch_size / self.topics.len()).max(1);
        let modules = parts.projection.current();
        self.log_pauses(parts.projection.name(), partition);
        for input in 0..self.topics.len() {
            if self.stage.is_paused(input) {
                continue;
            }
            let topic = self.topics[input].clone();
            let from = self.stage.input_status(input).map_or(0, |status| status.position);
            let records = parts.log.poll(&topic, partition, from, share, std::mem::take(&mut self.spare)).await?;
            let read_all = records.len() < share && !records.is_full();
            for view in records.iter() {
                self.admit(parts, (partition, input), view, &modules)?;
            }
            read_any |= !records.is_empty();
            self.spare = records;
            if read_all {
                let at = now();
                let end = parts.log.end_offset(&topic, partition).await?;
                self.stage.observe_end(input, end, at)?;
            }
        }
        Ok(read_any)
    }

    /// Logs each input that was paused or let go since the last read.
    fn log_pauses(&mut self, projection: &str, partition: u32) {
        self.paused.resize(self.topics.len(), false);
        for (input, was) in self.paused.iter_mut().enumerate() {
            let paused = self.stage.is_paused(input);
            if paused == *was {
                continue;
            }
            *was = paused;
            let (topic, held_bytes) = (&self.topics[input], self.stage.held_bytes());
            match paused {
                true => tracing::info!(
                    projection,
                    topic,
                    partition,
                    held_bytes,
                    "input `{topic}` partition {partition} paused: {held_bytes} bytes held, over --max-held-mib, and \
                     its clock is ahead; it is read again once the others catch up (event-time alignment)"
                ),
                false => tracing::info!(
                    projection,
                    topic,
                    partition,
                    held_bytes,
                    "input `{topic}` partition {partition} read again"
                ),
            }
        }
    }

    /// Hands one record to the stage with its event time; logs it if it is
    /// late.
    fn admit<L: EventLog>(
        &mut self,
        parts: &Parts<L>,
        (partition, input): (u32, usize),
        view: RecordView<'_>,
        modules: &ModuleSet,
    ) -> Result<(), ConsumerError> {
        // Unreadable headers, or a timed type without its time: no event
        // time, so it passes at once and the batch dead-letters it with
        // the reason.
        let envelope = Envelope::parse(view.headers()).ok();
        let event_time =
            envelope.and_then(|envelope| modules.event_time(envelope.tag, envelope.event_time).ok().flatten());
        let arrival = Arrival {
            input,
            offset: view.offset(),
            event_time,
            append_time: view.append_time(),
            carried_time: envelope.and_then(|envelope| envelope.event_time),
            bytes: view.stored_len() as u64,
            payload: view.to_encoded(),
        };
        let admission = self.stage.read(arrival, &mut self.released)?;
        if admission == Admission::Refused
            && let Some(Released { release: Release::TooFarAhead { append_time }, event_time: Some(time), .. }) =
                self.released.last()
        {
            let reason = too_far_ahead(*time, *append_time, parts.config.release);
            // An input index fits: the inputs are the projection's topics.
            let place = (u32::try_from(input).unwrap_or(u32::MAX), view.offset());
            self.refused.insert(place, reason);
        }
        if admission == Admission::Released
            && let Some(Released { release: Release::Late { by }, event_time, .. }) = self.released.last()
        {
            let key = envelope.and_then(|envelope| Key::from_canonical(envelope.key).ok());
            let key = key.map_or_else(|| "?".to_owned(), |key| key.to_string());
            parts.timing.late(LateEvent {
                key: key.clone(),
                topic: self.topics[input].clone(),
                partition,
                offset: view.offset(),
                event_time_ms: event_time.unwrap_or_default(),
                lateness_ms: *by,
                read_at_ms: now(),
            });
            tracing::warn!(
                projection = parts.projection.name(),
                topic = self.topics[input],
                partition,
                offset = view.offset(),
                event_time,
                lateness_ms = by,
                "late event of key {key}: read {by} ms after the clock passed its event time; applied at once, out \
                 of event-time order, and counted as an order violation"
            );
        }
        Ok(())
    }

    /// Shows the stage on the board (`/status`) and in the metrics.
    fn show_timing<L: EventLog>(&self, parts: &Parts<L>, partition: u32) {
        let timing = PartitionTiming::of(partition, &self.topics, &self.stage, now(), self.peak_held_bytes);
        if let Some(metrics) = &parts.metrics {
            metrics.event_time(parts.projection.name(), &timing);
        }
        parts.timing.update(timing);
    }
}

/// Why an event of time `event_time`, appended at `append_time`, was
/// refused under `limits`: what its dead letter says.
pub(super) fn too_far_ahead(event_time: Millis, append_time: Option<Millis>, limits: ReleaseLimits) -> String {
    let span = |millis: Millis| humantime::format_duration(Duration::from_millis(millis.unsigned_abs())).to_string();
    let bound = span(limits.max_ahead);
    match append_time {
        Some(appended) => format!(
            "event-time-ahead: event time {event_time} ms is {} ahead of the time the log appended it, {appended}              ms, over the bound of {bound} (--max-event-time-ahead, WAKU_MAX_EVENT_TIME_AHEAD,              `max-event-time-ahead` in waku.toml, raises it for later events); `waku dlq redrive` applies it",
            span(event_time.saturating_sub(appended))
        ),
        None => format!(
            "event-time-ahead: event time {event_time} ms is the largest time, which no clock passes (the log              keeps no append time for this record to bound it by)"
        ),
    }
}

/// The processing time, in ms since the epoch.
fn now() -> Millis {
    Millis::try_from(crate::platform::clock::now_ms()).unwrap_or(Millis::MAX)
}
