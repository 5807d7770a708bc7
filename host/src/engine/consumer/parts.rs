//! What every partition of a consumer shares, and the few things the
//! partition set ([`super::partition_set`]) and one partition's loop
//! ([`super::partition_loop`]) both do with it: publish the outbox, read a
//! partition index's gate, open a batch's trace, record its phases.
//!
//! Rules kept here:
//! - **One outbox publisher at a time**: partitions commit to one outbox,
//!   and two publishers could append the same entries before either
//!   clears them.
//! - **A gate sums the projection's topics**: a partition index's position
//!   and end offset are the sums over its topics (for one topic, the
//!   topic's own), so the caught-up gate compares like with like.

use std::sync::Arc;
use std::time::Duration;

use super::batch::BatchRunner;
use super::phase::PhaseTimes;
use super::summary::Summary;
use super::timing_status::TimingBoard;
use super::{ConsumerConfig, ConsumerError};
use crate::engine::metrics::Metrics;
use crate::engine::outbox::{self, Published};
use crate::engine::progress::{LastBatch, Progress};
use crate::engine::projection::Projection;
use crate::engine::telemetry::{BatchOf, BatchTrace, Telemetry};
use crate::storage::log::EventLog;

/// What the partitions of one consumer share: the log, the projection, the
/// settings, what runs batches, and what they report to.
pub(super) struct Parts<L> {
    pub(super) log: Arc<L>,
    pub(super) projection: Arc<Projection>,
    pub(super) config: ConsumerConfig,
    /// What runs its batches, from records to their commit.
    pub(super) runner: BatchRunner,
    /// Partitions commit to one outbox; one publisher at a time, or two
    /// could publish the same entries before either clears them.
    outbox: Arc<tokio::sync::Mutex<()>>,
    /// The caught-up gate.
    pub(super) progress: Arc<Progress>,
    pub(super) metrics: Option<Arc<Metrics>>,
    /// What the release stages show (projections over several topics).
    pub(super) timing: Arc<TimingBoard>,
    /// OpenTelemetry export, when configured ([`crate::engine::telemetry`]).
    pub(super) telemetry: Option<Telemetry>,
}

impl<L> Clone for Parts<L> {
    fn clone(&self) -> Self {
        Self {
            log: self.log.clone(),
            projection: self.projection.clone(),
            config: self.config.clone(),
            runner: self.runner.clone(),
            outbox: self.outbox.clone(),
            progress: self.progress.clone(),
            metrics: self.metrics.clone(),
            timing: self.timing.clone(),
            telemetry: self.telemetry.clone(),
        }
    }
}

impl<L: EventLog> Parts<L> {
    /// The parts of a consumer of `projection`'s topics on `log`: no
    /// metrics, no telemetry yet.
    pub(super) fn new(log: Arc<L>, projection: Arc<Projection>, config: ConsumerConfig) -> Self {
        Self {
            log,
            runner: BatchRunner::new(&projection, &config),
            projection,
            outbox: Arc::default(),
            progress: Arc::default(),
            metrics: None,
            timing: Arc::default(),
            telemetry: None,
            config,
        }
    }

    /// A partition index's gate: its committed position and the end offset
    /// read now, each summed over the projection's topics (for one topic,
    /// the topic's own).
    pub(super) async fn gate_of(&self, partition: u32) -> Result<(u64, u64), ConsumerError> {
        let (mut position, mut end) = (0, 0);
        for topic in self.projection.topics() {
            position += self.projection.store().position(topic, partition)?.unwrap_or(0);
            end += self.log.end_offset(topic, partition).await?;
        }
        Ok((position, end))
    }

    /// The OpenTelemetry trace of a batch of `count` records of `topic` at
    /// `offsets`, when telemetry is on.
    pub(super) fn open_trace(
        &self,
        topic: &str,
        partition: u32,
        offsets: impl Iterator<Item = u64>,
        count: usize,
        polled: Duration,
    ) -> Option<BatchTrace> {
        let telemetry = self.telemetry.as_ref()?;
        let (first, last) = offsets.fold((u64::MAX, 0), |(first, last), offset| (first.min(offset), last.max(offset)));
        let projection = self.projection.name();
        Some(telemetry.batch(BatchOf { projection, topic, partition, count, first: first.min(last), last }, polled))
    }

    /// Observes a batch of `partition` ([`record_phases`](Self::record_phases))
    /// and keeps it as the partition's last ([`Progress::batch_done`]):
    /// `kind` `topic` or `retry`, `took` its wall time.
    pub(super) fn record_batch(&self, partition: u32, kind: &'static str, batch: &Summary, took: Duration) {
        self.record_phases(&batch.phases);
        let phases = batch.phases.iter().map(|(phase, time)| (phase.name(), time.as_micros() as u64)).collect();
        self.progress.batch_done(
            partition,
            LastBatch {
                kind,
                events: batch.consumed,
                applied: batch.counts.applied,
                calls: batch.calls,
                phases,
                took_us: took.as_micros() as u64,
                at_ms: crate::platform::clock::now_ms(),
            },
        );
    }

    /// Observes a batch's (or a settle step's) phases in the metrics.
    pub(super) fn record_phases(&self, phases: &PhaseTimes) {
        if let Some(metrics) = &self.metrics {
            metrics.batch_phases(self.projection.name(), phases);
        }
    }

    /// Publishes the outbox entries of `partitions`: what their committed
    /// batches emitted or routed.
    pub(super) async fn publish_outbox(&self, partitions: &[u32]) -> Result<Published, ConsumerError> {
        let _one_publisher = self.outbox.lock().await;
        let projection = &*self.projection;
        let routed = projection.routed_topics();
        let published = outbox::publish(&*self.log, projection.store(), projection.name(), routed, partitions).await?;
        if let Some(metrics) = self.metrics.as_ref().filter(|_| published.undeliverable > 0) {
            metrics.undeliverable(projection.name(), published.undeliverable);
        }
        Ok(published)
    }
}
