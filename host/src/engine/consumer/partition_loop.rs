//! One partition's loop ([`PartitionLoop`]): poll (or read every topic
//! through the event-time stage, [`super::timing`]), run the batch to its
//! commit ([`super::batch`]), settle what the commit owes the log, give keys
//! whose retry is due another attempt; until an end, a stop, or another
//! host taking the partition.
//!
//! Rules kept here:
//! - **One step at a time**: settle what the last commit owes (its outbox,
//!   its retry records indexed, the log's consumer offsets), then a retry
//!   batch if one is due, else a batch read from the log. After a retry
//!   batch the topic has its turn, so keys that stay due cannot hold up
//!   the partition's other modules.
//! - **An unavailable log or a host fault is waited out** with a doubling
//!   backoff, from what was committed: nothing is counted against a module.
//! - **A refused commit drops or restarts the partition**: fenced (another
//!   host took it), it is given up and its batch counted as redone; a
//!   position the database forgot starts it over from what the store holds.
//! - **The log is not trusted to keep its tail**: the end offset is read at
//!   the start and, at most every [`TAIL_CHECK`], while nothing is read;
//!   a lost tail is recorded and followed, one below what was applied stops
//!   the partition.
//! - **Events are read only on evidence**: an idle partition waits for the
//!   log's append signal or its idle poll, never decides anything on a
//!   timer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashSet;

use super::batch::Advance;
use super::key::FAILURES_LOGGED_PER_BATCH;
use super::parts::Parts;
use super::phase::{Phase, PhaseTimes};
use super::release_marks;
use super::timer_clock::{BatchClock, SoloClock};
use super::timing::{Timed, TimedRead};
use super::work::BatchBuffers;
use super::{ConsumerError, Summary};
use crate::engine::routing::{self, KeyInRetry, RetryQueue, Routed};
use crate::engine::telemetry::BatchTrace;
use crate::event::EventHeaders;
use crate::key::Key;
use crate::storage::log::loss::{self, Truncation};
use crate::storage::log::{EventLog, LogError, PolledBatch};
use crate::storage::state::StateError;

/// One partition of a consumer, from its start to its end: what it shares
/// with the others, its index, and where its consuming stands.
pub(super) struct PartitionLoop<L> {
    parts: Parts<L>,
    partition: u32,
    state: PartitionState,
}

impl<L: EventLog> PartitionLoop<L> {
    /// Consumes one partition until `end` (if given) or until `stop` is set.
    /// Keys whose retry is due are taken before the next batch is polled.
    ///
    /// When the log is unavailable ([`LogError::Unavailable`]), the partition
    /// waits with a growing backoff and tries again from what it committed:
    /// the outbox and retry index owed by the last commit are settled first,
    /// and a retry queue that was being worked on is rebuilt from the log.
    /// Says, with what it did, whether it ended because another host took
    /// the partition.
    pub(super) async fn run(
        parts: Parts<L>,
        partition: u32,
        end: Option<u64>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<(Summary, bool), ConsumerError> {
        // Reading where to start repeats nothing: tried again while the log
        // is unavailable, as the loop's steps are.
        let mut backoff = Duration::ZERO;
        let state = loop {
            match Self::starting_state(&parts, partition, end).await {
                Err(ConsumerError::Log(error @ LogError::Unavailable { .. })) => {
                    let (first, longest) = parts.config.log_backoff;
                    let again = backoff > Duration::ZERO;
                    backoff = (backoff * 2).clamp(first, longest);
                    say_unavailable(again, parts.projection.name(), partition, &error.into(), backoff);
                    parts.progress.set_log_available(false);
                    let _ = tokio::time::timeout(backoff, stop.changed()).await;
                    if *stop.borrow() {
                        return Ok((Summary::default(), false));
                    }
                }
                started => break started?,
            }
        };
        Self { parts, partition, state }.consume(end, stop).await
    }

    /// [`PartitionLoop::run`] once started.
    async fn consume(
        mut self,
        mut end: Option<u64>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<(Summary, bool), ConsumerError> {
        let partition = self.partition;
        let mut summary = Summary::default();
        let mut backoff = Duration::ZERO;
        loop {
            if *stop.borrow() {
                break;
            }
            let step = self.step(end, &mut summary).await;
            if let Some(lowered) = self.state.lowered_end.take() {
                end = end.map(|end| end.min(lowered));
            }
            match step {
                Ok(Step::Worked) => {}
                Ok(Step::Done) => break,
                Ok(Step::Idle(wait)) => {
                    let woken = async {
                        tokio::select! {
                            _ = stop.changed() => {}
                            () = appended(&mut self.state.appends) => {}
                        }
                    };
                    let _ = tokio::time::timeout(wait, woken).await;
                }
                Ok(Step::Full(wait)) => {
                    let _ = tokio::time::timeout(wait, stop.changed()).await;
                }
                Err(error @ (ConsumerError::Log(LogError::Unavailable { .. }) | ConsumerError::HostFault(_))) => {
                    let (first, longest) = self.parts.config.log_backoff;
                    let again = backoff > Duration::ZERO;
                    backoff = (backoff * 2).clamp(first, longest);
                    say_unavailable(again, self.parts.projection.name(), partition, &error, backoff);
                    if matches!(error, ConsumerError::Log(_)) {
                        self.parts.progress.set_log_available(false);
                        if let Some(metrics) = &self.parts.metrics {
                            metrics.log_unavailable(self.parts.projection.name());
                        }
                    }
                    let _ = tokio::time::timeout(backoff, stop.changed()).await;
                    continue;
                }
                Err(ConsumerError::State(StateError::Fenced { held, current, .. })) => {
                    summary.redone += self.state.in_flight;
                    self.drop_fenced(held, current, self.state.in_flight);
                    return Ok((summary, true));
                }
                Err(ConsumerError::State(moved @ StateError::PositionMoved { .. })) => {
                    let Some((reloaded, redone)) = self.reload(end, &moved).await? else {
                        summary.redone += self.state.in_flight;
                        self.give_up(self.state.in_flight);
                        return Ok((summary, true));
                    };
                    summary.redone += redone;
                    self.state = reloaded;
                    continue;
                }
                Err(error) => return Err(error),
            }
            if !backoff.is_zero() {
                backoff = Duration::ZERO;
                if !self.parts.progress.log_available() {
                    self.parts.progress.set_log_available(true);
                    tracing::info!(projection = self.parts.projection.name(), partition, "the log is available again");
                }
            }
        }
        if self.state.settle {
            self.settle_at_stop(&mut summary).await;
        }
        Ok((summary, false))
    }

    /// A partition's state as it starts: from its committed position (its
    /// end offset checked, or its release stage restored), its retry queue
    /// to be rebuilt from the log.
    async fn starting_state(
        parts: &Parts<L>,
        partition: u32,
        end: Option<u64>,
    ) -> Result<PartitionState, ConsumerError> {
        let topic = parts.projection.topic().to_owned();
        let position = parts.projection.store().position(&topic, partition)?.unwrap_or(0);
        release_marks::refuse_held_by_removed(parts.projection.store(), parts.projection.topics(), partition)?;
        let mut solo = None;
        let (timed, released) = match parts.projection.topics().len() {
            1 => {
                Self::check_tail_at_start(parts, &topic, partition, position).await?;
                // The timers' clock, told the end offset before anything
                // is read.
                let mut clock = SoloClock::restore(parts.projection.store(), partition)?;
                let end = parts.log.end_offset(&topic, partition).await?;
                clock.observe_end(end, position, parts.config.release);
                solo = Some(clock);
                (None, release_marks::released_marks(parts.projection.store(), &topic, partition)?.map(Arc::new))
            }
            _ => {
                for topic in parts.projection.topics() {
                    let position = parts.projection.store().position(topic, partition)?.unwrap_or(0);
                    Self::check_tail_at_start(parts, topic, partition, position).await?;
                }
                (Some(Timed::start(parts, partition).await?), None)
            }
        };
        Ok(PartitionState {
            timed,
            solo,
            due_checked: None,
            released,
            position,
            known_end: end.unwrap_or(0).max(position),
            tail_checked: None,
            lowered_end: None,
            queue: None,
            settle: false,
            spare: PolledBatch::new(),
            buffers: BatchBuffers::default(),
            appends: parts.log.appends(),
            queue_full: false,
            topic_turn: false,
            in_flight: 0,
        })
    }

    /// After a commit refused because the store's position was not where
    /// this host's last commit left it ([`StateError::PositionMoved`]: the
    /// database forgot acknowledged commits): claims the partition again,
    /// which drops what the store kept of it and reads its positions, and
    /// starts it over from what the store holds, nothing of the host's
    /// memory kept. The refused batch and the forgotten ones are counted as
    /// redone, and returned with the new state. `None` when another host
    /// holds the partition now (the database's restart ended this host's
    /// hold): it is given up.
    async fn reload(
        &self,
        end: Option<u64>,
        moved: &StateError,
    ) -> Result<Option<(PartitionState, u64)>, ConsumerError> {
        let partition = self.partition;
        if self.parts.projection.store().claim_released(partition)?.is_none() {
            tracing::warn!(
                projection = self.parts.projection.name(),
                partition,
                "{moved}; another host holds partition {partition} now: this host stops consuming it"
            );
            return Ok(None);
        }
        let mut reloaded = Self::starting_state(&self.parts, partition, end).await?;
        // What the last commits the store kept owe the log is published
        // again (the stamps keep the log from taking anything twice).
        reloaded.settle = true;
        // The gate's position: summed over the topics, as it was and as the
        // store holds it now.
        let before = self.parts.progress.partitions().into_iter().find(|p| p.partition == partition);
        let (now, _) = self.parts.gate_of(partition).await?;
        let redone = self.state.in_flight + before.map_or(self.state.position, |p| p.position).saturating_sub(now);
        tracing::warn!(
            projection = self.parts.projection.name(),
            partition,
            redone,
            "{moved}; partition {partition} starts again from offset {} as the store holds it ({redone} events \
             done again)",
            reloaded.position
        );
        self.parts.progress.rewind(partition, now);
        self.parts.progress.add_redone(redone);
        if let Some(metrics) = &self.parts.metrics {
            metrics.events_redone(self.parts.projection.name(), redone);
        }
        Ok(Some((reloaded, redone)))
    }

    /// A stop leaves nothing owed that a later command cannot see: the
    /// last commit's outbox (its dead letters among it) is appended before
    /// the partition is let go. A failure here is no failure of the stop:
    /// the outbox keeps what was not appended, and the next start (or
    /// `waku dlq redrive`) appends it, as after a crash.
    async fn settle_at_stop(&self, summary: &mut Summary) {
        let partition = self.partition;
        let topic = self.parts.projection.topic();
        let settled = async {
            summary.undeliverable += self.parts.publish_outbox(&[partition]).await?.undeliverable;
            self.parts
                .log
                .store_consumer_offset(self.parts.projection.name(), topic, partition, self.state.position)
                .await?;
            Ok::<_, ConsumerError>(())
        };
        if let Err(error) = settled.await {
            tracing::warn!(
                projection = self.parts.projection.name(),
                partition,
                "{error}; what the last batch owes the log stays in the outbox for the next start"
            );
        }
    }

    /// One step of [`PartitionLoop::consume`]: settle what the last
    /// commit owes, or give due keys another attempt, or consume a batch.
    async fn step(&mut self, end: Option<u64>, summary: &mut Summary) -> Result<Step, ConsumerError> {
        let mut queue = match self.state.queue.take() {
            Some(queue) => queue,
            None => self.rebuild_retry_queue().await?,
        };
        if self.state.settle {
            self.settle(&mut queue, summary).await?;
        }
        // After a retry batch the topic has its turn, while it has more to
        // read: keys that stay due (a module slow on every call, cut by its
        // time per batch) would otherwise fill every step and hold up the
        // partition's other modules.
        let topic_turn = std::mem::take(&mut self.state.topic_turn) && end.is_none_or(|end| self.state.position < end);
        let due = match topic_turn {
            true => Vec::new(),
            false => {
                queue.take_due(crate::platform::clock::now_ms(), self.parts.config.batch_size, PolledBatch::BYTE_BUDGET)
            }
        };
        if !due.is_empty() {
            self.state.in_flight = due.iter().map(|(_, in_retry)| in_retry.records.len() as u64).sum();
            // On an error the queue is rebuilt from the log next time.
            self.state.due_checked = None;
            let began = Instant::now();
            let (batch, settled) = self.retry_batch(due, queue).await?;
            self.parts.record_batch(self.partition, "retry", &batch, began.elapsed());
            summary.add(&batch);
            self.state.queue = Some(settled);
            self.state.settle = true;
            self.state.topic_turn = true;
            return Ok(Step::Worked);
        }
        if let Some(until_due) = self.retry_queue_full(&queue) {
            self.state.queue = Some(queue);
            return Ok(Step::Full(until_due));
        }
        let polling = Instant::now();
        let polled = match self.state.timed.take() {
            Some(mut timed) => {
                if let Some(appends) = &mut self.state.appends {
                    appends.borrow_and_update();
                }
                let polled = timed.read(&self.parts, self.partition, end.is_some()).await.map(|read| self.polled(read));
                self.state.timed = Some(timed);
                polled
            }
            None => self.poll_topic(end, &queue).await,
        };
        match polled {
            Ok(Polled::Batch(records, advance)) => {
                self.apply((records, advance, polling.elapsed()), queue, summary).await
            }
            Ok(Polled::Nothing(step)) => {
                // The clock may have moved without a batch (an end offset
                // reached): timers it made due fire in a batch of their own.
                match self.timers_due(&queue) {
                    Ok(Some(advance)) => {
                        let records = std::mem::take(&mut self.state.spare);
                        return self.apply((records, advance, polling.elapsed()), queue, summary).await;
                    }
                    Ok(None) => {}
                    Err(error) => {
                        self.state.queue = Some(queue);
                        return Err(error);
                    }
                }
                // Records another process appended to the retry topic (a
                // `waku dlq redrive` run through this host) join the queue
                // while the topic is quiet, and are attempted at once.
                let scanned = queue.scanned();
                let indexed = self.index_retries(&mut queue, &FxHashSet::default()).await;
                let grew = queue.scanned() != scanned;
                self.state.queue = Some(queue);
                indexed?;
                Ok(if grew { Step::Worked } else { step })
            }
            Err(error) => {
                self.state.queue = Some(queue);
                Err(error)
            }
        }
    }

    /// Whether the partition's retry `queue` holds too much for it to read
    /// on (`queue_max_bytes`), and then how long until a retry is due;
    /// logs when the queue fills and when it has room again.
    fn retry_queue_full(&mut self, queue: &RetryQueue) -> Option<Duration> {
        let partition = self.partition;
        if !queue.is_empty() && queue.held_bytes() >= self.parts.config.retry.queue_max_bytes {
            // Diverting more would hold a record per event of the backlog:
            // the topic waits until retries drain.
            if !std::mem::replace(&mut self.state.queue_full, true) {
                tracing::warn!(
                    projection = self.parts.projection.name(),
                    partition,
                    "the retry queue holds {} MiB (`--retry-queue-mib`): partition {partition} reads no more of \
                     topic `{}` until its retries are done or dead-lettered",
                    queue.held_bytes() >> 20,
                    self.parts.projection.topic(),
                );
            }
            let until_due = queue.next_due_ms().map_or(Duration::MAX, |due| {
                Duration::from_millis(due.saturating_sub(crate::platform::clock::now_ms()))
            });
            return Some(until_due);
        }
        if std::mem::take(&mut self.state.queue_full) {
            tracing::info!(
                projection = self.parts.projection.name(),
                partition,
                "the retry queue has room: reading on"
            );
        }
        None
    }

    /// After a commit: its outbox out, its retry records indexed (so the
    /// next batch diverts their keys), the log's consumer offsets updated.
    async fn settle(&mut self, queue: &mut RetryQueue, summary: &mut Summary) -> Result<(), ConsumerError> {
        let partition = self.partition;
        let started = Instant::now();
        summary.undeliverable += self.parts.publish_outbox(&[partition]).await?.undeliverable;
        self.index_retries(queue, &FxHashSet::default()).await?;
        let name = self.parts.projection.name();
        match &self.state.timed {
            None => {
                self.parts
                    .log
                    .store_consumer_offset(name, self.parts.projection.topic(), partition, self.state.position)
                    .await?
            }
            Some(_) => {
                for topic in self.parts.projection.topics() {
                    let position = self.parts.projection.store().position(topic, partition)?.unwrap_or(0);
                    self.parts.log.store_consumer_offset(name, topic, partition, position).await?;
                }
            }
        }
        self.state.settle = false;
        let mut phases = PhaseTimes::default();
        phases.add(Phase::Outbox, started.elapsed());
        self.parts.record_phases(&phases);
        summary.phases.absorb(&phases);
        Ok(())
    }

    /// Polls the one topic of a projection from the partition's position
    /// (up to `end` if given). On an empty poll, looks for a lost tail and
    /// says how long to wait: the idle poll, or less if a retry is due
    /// sooner.
    async fn poll_topic(&mut self, end: Option<u64>, queue: &RetryQueue) -> Result<Polled, ConsumerError> {
        let partition = self.partition;
        let want = match end {
            Some(end) if self.state.position >= end => {
                // The end given is one the log reported: the timers'
                // clock passes everything read.
                if let Some(solo) = &mut self.state.solo {
                    solo.observe_end(end, self.state.position, self.parts.config.release);
                }
                return Ok(Polled::Nothing(Step::Done));
            }
            Some(end) => self.parts.config.batch_size.min((end - self.state.position) as usize),
            None => self.parts.config.batch_size,
        };
        if let Some(appends) = &mut self.state.appends {
            // Seen before polling: an append from here on ends the idle
            // wait should this poll find nothing.
            appends.borrow_and_update();
        }
        let spare = std::mem::take(&mut self.state.spare);
        let topic = self.parts.projection.topic();
        let mut records = self.parts.log.poll(topic, partition, self.state.position, want, spare).await?;
        let Some(last) = records.last() else {
            self.state.spare = records;
            self.check_tail().await?;
            if let Some(solo) = self.state.solo.as_mut().filter(|solo| solo.waits_for_end(self.state.position)) {
                let end = self.parts.log.end_offset(self.parts.projection.topic(), partition).await?;
                solo.observe_end(end, self.state.position, self.parts.config.release);
            }
            let until_due = queue
                .next_due_ms()
                .map(|due| Duration::from_millis(due.saturating_sub(crate::platform::clock::now_ms())));
            let wait = until_due.map_or(self.parts.config.idle_poll, |until| until.min(self.parts.config.idle_poll));
            return Ok(Polled::Nothing(Step::Idle(wait)));
        };
        let next = last.offset() + 1;
        let advance = match &self.state.released {
            Some(marks) => {
                records.retain_offsets(|offset| !marks.applied(offset));
                Advance::PastReleased(next, marks.clone())
            }
            None => Advance::Topic(next),
        };
        Ok(Polled::Batch(records, advance))
    }

    /// Plans, executes and commits a polled (or released) batch on a
    /// blocking thread, then moves the partition on by `advance`. Released
    /// events whose commit failed stay pending, to be applied again.
    async fn apply(
        &mut self,
        (records, advance, polled): (PolledBatch, Advance, Duration),
        queue: RetryQueue,
        summary: &mut Summary,
    ) -> Result<Step, ConsumerError> {
        let applying = Instant::now();
        let partition = self.partition;
        self.state.in_flight = records.len() as u64;
        if let Some(next) = advance.next_offset() {
            self.parts.progress.read(partition, next);
        }
        let mut runner = self.parts.runner.clone();
        let offsets = records.iter().map(|view| view.offset());
        let trace = self.parts.open_trace(self.parts.projection.topic(), partition, offsets, records.len(), polled);
        runner.keys.trace = trace.as_ref().map(BatchTrace::calls);
        let mut buffers = std::mem::take(&mut self.state.buffers);
        // The modules of this batch, whatever is swapped in meanwhile.
        let (modules, store) = (self.parts.projection.current(), self.parts.projection.store().clone());
        // The clock the batch fires timers by; a one-topic clock moved by
        // its records goes back should the batch not commit.
        let solo_before = self.state.solo.clone();
        runner.clock = match (&advance, &mut self.state.solo) {
            (Advance::Released(progress), _) => {
                BatchClock { clock: progress.checkpoint.clock, late: progress.late.clone() }
            }
            // Only a timed type moves the clock: a projection without one
            // reads no record twice.
            (_, Some(solo)) if modules.has_timed_types() => {
                let clock = solo.read(&records, &modules, self.parts.config.release, self.state.position);
                runner.solo = Some(solo.clone());
                clock
            }
            (_, Some(solo)) => BatchClock { clock: solo.clock(), late: Default::default() },
            (_, None) => BatchClock::default(),
        };
        runner.keys.clock = runner.clock.clock;
        self.state.due_checked = None;
        let (batch, returned, records, buffers, advance) = tokio::task::spawn_blocking(move || {
            let polled = (&records, &advance);
            let batch = runner.process_batch(partition, polled, &queue, &mut buffers, modules, &store);
            (batch, queue, records, buffers, advance)
        })
        .await
        .map_err(|e| ConsumerError::WorkerPanicked(e.to_string()))?;
        if let Some(trace) = trace {
            trace.finish(batch.as_ref().map_err(|error| error as &dyn std::fmt::Display));
        }
        self.state.queue = Some(returned);
        self.state.buffers = buffers;
        let batch = match (&advance, &mut self.state.timed) {
            (Advance::Released(progress), Some(timed)) => match batch {
                Ok(batch) => {
                    if let Some(metrics) = self.parts.metrics.as_ref().filter(|_| progress.violations > 0) {
                        metrics.order_violations(self.parts.projection.name(), progress.violations);
                    }
                    timed.committed(records, progress, &self.parts.timing);
                    self.parts.progress.advance(partition, timed.gate_position());
                    batch
                }
                Err(error) => {
                    timed.not_committed(records);
                    return Err(error);
                }
            },
            (_, _) => {
                self.state.spare = records;
                if batch.is_err() {
                    self.state.solo = solo_before;
                }
                let batch = batch?;
                if let Some(next) = advance.next_offset() {
                    self.state.position = next;
                    self.parts.progress.advance(partition, next);
                    if self.state.released.as_ref().is_some_and(|marks| next >= marks.read_to()) {
                        self.state.released = None;
                    }
                }
                batch
            }
        };
        let mut batch = batch;
        batch.phases.add(Phase::Poll, polled);
        self.parts.record_batch(partition, "topic", &batch, polled + applying.elapsed());
        summary.add(&batch);
        self.state.settle = true;
        Ok(Step::Worked)
    }

    /// Stops a partition whose recorded truncation lost offsets the
    /// projection applied, or whose end offset is below its position now
    /// (recording that): before it reads anything.
    async fn check_tail_at_start(
        parts: &Parts<L>,
        topic: &str,
        partition: u32,
        position: u64,
    ) -> Result<(), ConsumerError> {
        if let Some(truncation) = loss::recorded(parts.projection.store(), topic, partition)?
            && truncation.applied_lost()
        {
            return Err(ConsumerError::LogTruncated(Box::new(truncation)));
        }
        let end = parts.log.end_offset(topic, partition).await?;
        match Truncation::detect(topic, partition, position, position, end) {
            Some(truncation) => {
                Self::truncated(parts, &truncation)?;
                Err(ConsumerError::LogTruncated(Box::new(truncation)))
            }
            None => Ok(()),
        }
    }

    /// Reads the partition's end offset again (at most every
    /// [`TAIL_CHECK`]) when a poll found nothing: an end below the position
    /// or below the highest end read is a lost tail. One below what was
    /// applied stops the partition; otherwise the partition follows the
    /// new end (its gate and, when catching up, where it stops).
    async fn check_tail(&mut self) -> Result<(), ConsumerError> {
        let partition = self.partition;
        if self.state.tail_checked.is_some_and(|at| at.elapsed() < TAIL_CHECK) {
            return Ok(());
        }
        self.state.tail_checked = Some(Instant::now());
        let topic = self.parts.projection.topic();
        let end = self.parts.log.end_offset(topic, partition).await?;
        let Some(truncation) = Truncation::detect(topic, partition, self.state.position, self.state.known_end, end)
        else {
            self.state.known_end = self.state.known_end.max(end);
            return Ok(());
        };
        Self::truncated(&self.parts, &truncation)?;
        if truncation.applied_lost() {
            return Err(ConsumerError::LogTruncated(Box::new(truncation)));
        }
        self.state.known_end = end;
        self.state.lowered_end = Some(end);
        self.parts.progress.lower_end(partition, end);
        Ok(())
    }

    /// Says a partition lost its tail: an error in the log, the count
    /// (`waku_log_truncated_total`), and the record `waku status` shows.
    fn truncated(parts: &Parts<L>, truncation: &Truncation) -> Result<(), ConsumerError> {
        tracing::error!(
            projection = parts.projection.name(),
            topic = truncation.topic,
            partition = truncation.partition,
            "{truncation}"
        );
        if let Some(metrics) = &parts.metrics {
            metrics.log_truncated(&truncation.topic, truncation.partition);
        }
        loss::record(parts.projection.store(), truncation)?;
        Ok(())
    }

    /// The keys of `partition` waiting in retry, read from the retry topic
    /// from the committed retry position on, minus the records already done.
    async fn rebuild_retry_queue(&self) -> Result<RetryQueue, ConsumerError> {
        let partition = self.partition;
        let retry = self.parts.projection.routed_topics().retry().to_owned();
        let store = self.parts.projection.store();
        let mut queue = RetryQueue::starting_at(store.position(&retry, partition)?.unwrap_or(0));
        let done: FxHashSet<u64> = store.done(&retry, partition)?.into_iter().collect();
        self.index_retries(&mut queue, &done).await?;
        Ok(queue)
    }

    /// Adds this projection's records appended to the retry partition since
    /// the queue last looked, except those in `done`.
    async fn index_retries(&self, queue: &mut RetryQueue, done: &FxHashSet<u64>) -> Result<(), ConsumerError> {
        let partition = self.partition;
        let retry = self.parts.projection.routed_topics().retry().to_owned();
        let end = self.parts.log.end_offset(&retry, partition).await?;
        // Polled, so what is read at once is bounded in bytes too.
        let mut records = PolledBatch::new();
        let mut unreadable = 0;
        while queue.scanned() < end {
            let want = self.parts.config.batch_size.min((end - queue.scanned()) as usize);
            records = self.parts.log.poll(&retry, partition, queue.scanned(), want, records).await?;
            let Some(last) = records.last().map(|r| r.offset()) else { break };
            for view in records.iter().filter(|r| !done.contains(&r.offset())) {
                let headers = view.owned_headers();
                let parsed =
                    Routed::parse(&headers).and_then(|routed| Ok((routed, EventHeaders::parse_stored(&headers)?)));
                match parsed {
                    Ok((routed, envelope)) if routed.projection == self.parts.projection.name() => {
                        queue.index(view.offset(), envelope.key, &routed, view.stored_len(), &self.parts.config.retry);
                    }
                    Ok(_) => {} // another projection's
                    Err(error) => {
                        unreadable += 1;
                        if unreadable <= FAILURES_LOGGED_PER_BATCH {
                            tracing::warn!(
                                projection = self.parts.projection.name(),
                                partition,
                                offset = view.offset(),
                                "record in `{retry}` has unreadable headers and is ignored: {error}"
                            );
                        }
                    }
                }
            }
            queue.skip_to(last + 1);
        }
        if unreadable > FAILURES_LOGGED_PER_BATCH {
            tracing::warn!(
                projection = self.parts.projection.name(),
                partition,
                "{} more records in `{retry}` have unreadable headers and are ignored",
                unreadable - FAILURES_LOGGED_PER_BATCH
            );
        }
        Ok(())
    }

    /// Gives keys whose retry is due another attempt: reads the first of
    /// their waiting records ([`RetryQueue::take_due`]), executes them like
    /// a batch, and commits the outcome with the retry position and the
    /// offsets now done. What the attempt left where it waits goes back in
    /// the queue. The caller then publishes the outbox and indexes what it
    /// added to the retry topic.
    async fn retry_batch(
        &self,
        due: Vec<(Key, KeyInRetry)>,
        mut queue: RetryQueue,
    ) -> Result<(Summary, RetryQueue), ConsumerError> {
        let partition = self.partition;
        let retry = self.parts.projection.routed_topics().retry().to_owned();
        let polling = Instant::now();
        let mut records = Vec::new();
        for (_, in_retry) in &due {
            for (first, count) in routing::consecutive(in_retry.records.iter().map(|w| w.offset)) {
                records.extend(self.parts.log.read(&retry, partition, first, count).await?);
            }
        }
        let polled = polling.elapsed();
        let next_waiting =
            due.iter().filter_map(|(key, _)| queue.first_waiting(key).map(|offset| (key.clone(), offset))).collect();
        // Once every record taken is done; the batch lowers it to the first
        // record it leaves.
        let retry_position = queue.position();
        let mut runner = self.parts.runner.clone();
        let offsets = records.iter().map(|stored| stored.offset);
        let trace = self.parts.open_trace(&retry, partition, offsets, records.len(), polled);
        runner.keys.trace = trace.as_ref().map(BatchTrace::calls);
        let (modules, store) = (self.parts.projection.current(), self.parts.projection.store().clone());
        let processed = tokio::task::spawn_blocking(move || {
            runner.process_retry_batch(partition, records, (next_waiting, retry_position), modules, &store)
        })
        .await
        .map_err(|e| ConsumerError::WorkerPanicked(e.to_string()))?;
        if let Some(trace) = trace {
            trace.finish(
                processed.as_ref().map(|(summary, _)| summary).map_err(|error| error as &dyn std::fmt::Display),
            );
        }
        let (mut summary, left) = processed?;
        summary.phases.add(Phase::Poll, polled);
        // An attempt that did nothing at all (its calls not made, for the
        // batch's budget or the module's time) leaves its keys waiting a
        // moment, so the partition does not spin on them.
        let taken: usize = due.iter().map(|(_, in_retry)| in_retry.records.len()).sum();
        let not_before = if left.len() == taken { crate::platform::clock::now_ms() + NOTHING_DONE_PAUSE_MS } else { 0 };
        let left: FxHashSet<u64> = left.into_iter().collect();
        for (key, in_retry) in due {
            let stays = in_retry.records.into_iter().filter(|waiting| left.contains(&waiting.offset)).collect();
            queue.put_back(key, stays, not_before);
        }
        Ok((summary, queue))
    }

    /// Drops a partition another host took (claimed epoch `current`, this
    /// host's was `held`): its refused commit changed nothing, the
    /// partition's new host resumes from the last commit, and this host
    /// goes on with its other partitions.
    fn drop_fenced(&self, held: u64, current: u64, redone: u64) {
        let partition = self.partition;
        tracing::warn!(
            projection = self.parts.projection.name(),
            partition,
            redone,
            "partition {partition} was taken over by another host (epoch {current}, this host held {held}): \
             its last batch ({redone} events) was not committed and this host stops consuming it"
        );
        self.give_up(redone);
    }

    /// Takes a partition another host has now out of the gate, and counts
    /// its refused batch's events as redone.
    fn give_up(&self, redone: u64) {
        let partition = self.partition;
        self.parts.progress.release(partition);
        self.parts.progress.add_redone(redone);
        if let Some(metrics) = &self.parts.metrics {
            metrics.partition_fenced(self.parts.projection.name());
            metrics.events_redone(self.parts.projection.name(), redone);
        }
    }

    /// Whether timers of the partition are due under its clock (but for
    /// keys waiting in `queue`, whose timers wait with them), and then how
    /// a batch of no records that fires them moves the partition on:
    /// where it stands, its clock committed again.
    fn timers_due(&mut self, queue: &RetryQueue) -> Result<Option<Advance>, ConsumerError> {
        let clock = match (&self.state.timed, &self.state.solo) {
            (Some(timed), _) => timed.clock(),
            (None, Some(solo)) => solo.clock(),
            (None, None) => None,
        };
        let Some(clock) = clock.filter(|&clock| self.state.due_checked != Some(clock)) else { return Ok(None) };
        let due = self.parts.projection.store().due_timers(self.partition, clock, super::batch::DUE_KEYS_PER_BATCH)?;
        if due.iter().all(|(key, _)| queue.holds(key)) {
            self.state.due_checked = Some(clock);
            return Ok(None);
        }
        Ok(Some(match &mut self.state.timed {
            Some(timed) => Advance::Released(timed.progress_now()),
            None => match &self.state.released {
                Some(marks) => Advance::PastReleased(self.state.position, marks.clone()),
                None => Advance::Topic(self.state.position),
            },
        }))
    }

    /// What the event-time stage's read means for the loop.
    fn polled(&self, read: TimedRead) -> Polled {
        match read {
            TimedRead::Released(records, progress) => Polled::Batch(records, Advance::Released(*progress)),
            TimedRead::CaughtUp => Polled::Nothing(Step::Done),
            TimedRead::ReadSome => Polled::Nothing(Step::Worked),
            TimedRead::Nothing => Polled::Nothing(Step::Idle(self.parts.config.idle_poll)),
        }
    }
}

/// How often a partition that finds nothing to read reads its end offset
/// again, to notice a log that lost its tail ([`loss`]).
pub const TAIL_CHECK: Duration = Duration::from_secs(1);

/// How long keys wait after an attempt whose calls were none of them made
/// ([`PartitionLoop::retry_batch`]).
const NOTHING_DONE_PAUSE_MS: u64 = 50;

/// Where one partition's consuming stands between steps.
struct PartitionState {
    /// The committed position.
    position: u64,
    /// The highest end offset read (or the position, if higher): an end
    /// below it is a lost tail.
    known_end: u64,
    /// When the end offset was last read to look for a lost tail.
    tail_checked: Option<Instant>,
    /// A lower end the partition follows since it lost its tail, for the
    /// caller to apply to where it stops.
    lowered_end: Option<u64>,
    /// The keys in retry; `None` when it must be rebuilt from the log.
    queue: Option<RetryQueue>,
    /// Whether the last commit's outbox and retry records still have to be
    /// published and indexed.
    settle: bool,
    /// The last polled batch, emptied by the next poll, which reuses its
    /// buffers.
    spare: PolledBatch,
    /// The planner's input and the plan, refilled by the next batch.
    buffers: BatchBuffers,
    /// The log's append signal, if it has one ([`EventLog::appends`]).
    appends: Option<tokio::sync::watch::Receiver<()>>,
    /// Whether its retry queue was full at the last step (logged once).
    queue_full: bool,
    /// Whether the last step was a retry batch: the topic goes next.
    topic_turn: bool,
    /// The release stage, for a projection over several topics: the
    /// partition index is read across all of them in event-time order.
    timed: Option<Timed>,
    /// The timers' clock of a projection of one topic.
    solo: Option<SoloClock>,
    /// The clock under which no timer of the partition was found due
    /// (but those of keys in retry) since the last batch: no need to look
    /// again until the clock moves or a batch runs.
    due_checked: Option<wakuwaku_core::release::Millis>,
    /// For a projection of one topic read in the release stage before
    /// (cut from several): what the stage released above the position,
    /// skipped until the position passes it.
    released: Option<Arc<release_marks::ReleasedMarks>>,
    /// The events of the batch being processed (or last processed): what
    /// a refused commit redid.
    in_flight: u64,
}

/// Resolves once records were appended since `appends` last looked;
/// never, for a log without the signal.
async fn appended(appends: &mut Option<tokio::sync::watch::Receiver<()>>) {
    if let Some(appends) = appends
        && appends.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// What a poll (or a timed read) found.
enum Polled {
    /// A batch to apply, and how it moves the partition on.
    Batch(PolledBatch, Advance),
    /// Nothing to apply: the step ends so.
    Nothing(Step),
}

/// What one step did.
enum Step {
    /// Committed something (or settled a commit).
    Worked,
    /// Nothing to do for now; look again after this long.
    Idle(Duration),
    /// The retry queue is full and nothing in it is due: look again after
    /// this long (when the first key is due), whatever is appended.
    Full(Duration),
    /// Reached the end it was given.
    Done,
}

/// Says that a partition's step failed on an outage and waits `backoff`:
/// a warning for the first failure in a row, so an outage is said once
/// per partition however long it lasts (its end is said too, "the log is
/// available again"); the failures after it at debug level.
fn say_unavailable(again: bool, projection: &str, partition: u32, error: &ConsumerError, backoff: Duration) {
    match again {
        false => {
            tracing::warn!(projection, partition, "{error}; trying again in {backoff:?} (and on, until it answers)")
        }
        true => tracing::debug!(projection, partition, "{error}; trying again in {backoff:?}"),
    }
}

#[cfg(test)]
mod tests {
    //! One partition's loop on the embedded log and the embedded state
    //! store, on a runtime of one thread, with the test ledger's module.

    use std::sync::Arc;

    use super::super::test_ledger::{DEPOSIT, Ledger, relaxed};
    use super::*;
    use crate::engine::consumer::ConsumerConfig;
    use crate::engine::projection::Projection;
    use crate::engine::routing::RetryPolicy;
    use crate::key::Key;
    use crate::storage::log::EmbeddedLog;
    use crate::storage::log::Record;
    use crate::storage::state::StateStore;

    /// A log with topic `t` of two partitions and its routed topics, a
    /// state store, and the parts of a consumer of `t` with the ledger.
    async fn parts(dir: &tempfile::TempDir) -> Parts<EmbeddedLog> {
        let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
        let routed = routing::RoutedTopics::shared("t");
        for topic in ["t", routed.retry(), routed.dlq()] {
            log.create_topic(topic, 2).await.unwrap();
        }
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        let projection = Projection::new("p", "t", vec![Arc::new(Ledger::new())], store).unwrap();
        // Retries wait long enough that none is due while the test runs.
        let retry = RetryPolicy { delays: vec![Duration::from_secs(3600)], ..RetryPolicy::default() };
        let config = ConsumerConfig { workers: 1, batch_size: 3, retry, ..ConsumerConfig::default() };
        Parts::new(log, Arc::new(projection), config)
    }

    async fn append(parts: &Parts<EmbeddedLog>, partition: u32, records: Vec<Record>) -> u64 {
        parts.log.append("t", vec![(partition, records)]).await.unwrap();
        parts.log.end_offset("t", partition).await.unwrap()
    }

    fn balance(parts: &Parts<EmbeddedLog>, key: i64) -> Option<String> {
        let value = parts.projection.store().get(&Key::int(key), "balance").unwrap();
        value.map(|bytes| String::from_utf8(bytes).unwrap())
    }

    fn running() -> tokio::sync::watch::Receiver<bool> {
        tokio::sync::watch::channel(false).1
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_partition_is_applied_batch_by_batch_to_its_end_and_its_position_committed() {
        let dir = tempfile::tempdir().unwrap();
        let parts = parts(&dir).await;
        let deposits = (1..=7).map(|n| relaxed(n % 2, DEPOSIT, &n.to_string())).collect();
        let end = append(&parts, 0, deposits).await;
        append(&parts, 1, vec![relaxed(5, DEPOSIT, "100")]).await;

        let (summary, fenced) = PartitionLoop::run(parts.clone(), 0, Some(end), running()).await.unwrap();

        assert!(!fenced);
        assert_eq!((summary.applied, summary.consumed, summary.batches), (7, 7, 3), "batches of at most 3");
        assert_eq!(balance(&parts, 1).as_deref(), Some("16"), "1 + 3 + 5 + 7");
        assert_eq!(balance(&parts, 0).as_deref(), Some("12"), "2 + 4 + 6");
        let store = parts.projection.store();
        assert_eq!(store.position("t", 0).unwrap(), Some(7));
        assert_eq!(store.position("t", 1).unwrap(), None, "the other partition is not this loop's");
        assert_eq!(balance(&parts, 5), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_event_goes_to_retry_with_its_keys_later_events_and_other_keys_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let parts = parts(&dir).await;
        let records = vec![relaxed(1, DEPOSIT, "fail"), relaxed(2, DEPOSIT, "4"), relaxed(1, DEPOSIT, "5")];
        let end = append(&parts, 0, records).await;
        append(&parts, 0, vec![relaxed(1, DEPOSIT, "6"), relaxed(2, DEPOSIT, "1")]).await;
        let end = end + 2;

        let (summary, _) = PartitionLoop::run(parts.clone(), 0, Some(end), running()).await.unwrap();

        assert_eq!(summary.applied, 2, "key 2's events");
        assert_eq!(summary.retry_in, 3, "the failed event, and key 1's events behind it in this batch and the next");
        assert_eq!(balance(&parts, 2).as_deref(), Some("5"));
        assert_eq!(balance(&parts, 1), None);
        let retry = parts.projection.routed_topics().retry().to_owned();
        let waiting = parts.log.read(&retry, 0, 0, 10).await.unwrap();
        let bodies: Vec<&[u8]> = waiting.iter().map(|stored| stored.record.body.as_slice()).collect();
        assert_eq!(bodies, [&b"fail"[..], b"5", b"6"], "in the key's order, in the partition it came from");
        assert_eq!(parts.projection.store().position("t", 0).unwrap(), Some(end));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_loop_told_to_stop_before_it_starts_reads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let parts = parts(&dir).await;
        append(&parts, 0, vec![relaxed(1, DEPOSIT, "1")]).await;
        let (stop_tx, stop) = tokio::sync::watch::channel(true);

        let (summary, fenced) = PartitionLoop::run(parts.clone(), 0, None, stop).await.unwrap();

        drop(stop_tx);
        assert_eq!((summary, fenced), (Summary::default(), false));
        assert_eq!(parts.projection.store().position("t", 0).unwrap(), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_loop_that_follows_stops_between_batches_when_told_and_keeps_what_it_committed() {
        let dir = tempfile::tempdir().unwrap();
        let parts = parts(&dir).await;
        append(&parts, 0, vec![relaxed(1, DEPOSIT, "2"), relaxed(1, DEPOSIT, "3")]).await;
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let following = tokio::spawn(PartitionLoop::run(parts.clone(), 0, None, stop));
        while parts.projection.store().position("t", 0).unwrap() != Some(2) {
            tokio::task::yield_now().await;
        }

        stop_tx.send(true).unwrap();
        let (summary, fenced) = following.await.unwrap().unwrap();

        assert!(!fenced);
        assert_eq!(summary.applied, 2);
        assert_eq!(balance(&parts, 1).as_deref(), Some("5"));
    }
}
