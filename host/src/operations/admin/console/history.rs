//! What the overview's plots show from the moment the page opens: the
//! host's own record of its throughput and lag over the last minutes.
//!
//! A task started with the console ([`History::sampler`]) reads the
//! projection's figures every [`SAMPLE_EVERY`] (the figures `/status`
//! answers: events applied, each partition's lag, the most watermark lag
//! of any partition) into a ring buffer of [`SAMPLES`] samples, ten
//! minutes. `GET /console/api/history` answers it whole; the page draws it
//! once when it opens and goes on with its own polls. Rules kept here:
//!
//! - **Bounded, whatever runs**: [`SAMPLES`] samples, each with at most
//!   [`MAX_PARTITIONS`] partitions' lags (their sum always), so the buffer
//!   and its answer stay a few tens of kilobytes.
//! - **Costing nothing measurable**: one status read every two seconds
//!   (the read the overview makes, well under a millisecond), whether or
//!   not a page is open; a failed read skips its sample and is not logged
//!   (the overview shows the failure).
//! - The task ends once the console is gone (it holds it weakly).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::Serialize;

use super::Console;
use crate::operations::admin::{LiveStatus, Status, running_status};
use crate::storage::log::EventLog;

/// How often the host samples its figures (the page's own poll rate).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// How many samples are kept: ten minutes at [`SAMPLE_EVERY`].
pub const SAMPLES: usize = 300;

/// The most partitions whose own lag a sample keeps (their sum is kept
/// whatever their number).
pub const MAX_PARTITIONS: usize = 64;

/// The projection's figures at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// When, ms since the epoch.
    pub t_ms: u64,
    /// Events applied in all.
    pub applied: u64,
    /// The lag of every partition, summed.
    pub lag: u64,
    /// `(partition, lag)` of the first [`MAX_PARTITIONS`] partitions.
    pub partitions: Vec<(u32, u64)>,
    /// The most watermark lag of any partition index, ms (0 without
    /// release stages).
    pub watermark_lag_ms: u64,
}

impl Sample {
    /// The sample of `status`, taken at `t_ms`.
    pub fn of(status: &Status, t_ms: u64) -> Self {
        Self {
            t_ms,
            applied: status.applied,
            lag: status.partitions.iter().map(|p| p.lag).sum(),
            partitions: status.partitions.iter().take(MAX_PARTITIONS).map(|p| (p.partition, p.lag)).collect(),
            watermark_lag_ms: status.event_time.iter().filter_map(|t| t.watermark_lag_ms).max().unwrap_or(0).max(0)
                as u64,
        }
    }
}

/// The ring buffer of [`Sample`]s.
#[derive(Debug, Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

/// What `GET /console/api/history` answers.
#[derive(Serialize)]
pub struct HistoryView {
    /// How often the host samples, ms.
    pub every_ms: u64,
    /// The samples, oldest first.
    pub samples: Vec<Sample>,
}

impl History {
    /// Adds `sample`, dropping the oldest past [`SAMPLES`].
    pub fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if samples.len() == SAMPLES {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// Every sample kept, oldest first.
    pub fn view(&self) -> HistoryView {
        let samples = self.samples.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        HistoryView { every_ms: SAMPLE_EVERY.as_millis() as u64, samples: samples.iter().cloned().collect() }
    }

    /// Samples `console`'s projection now and every [`SAMPLE_EVERY`],
    /// until the console is dropped.
    pub(super) async fn sampler<L: EventLog>(console: Weak<Console<L>>) {
        let mut every = tokio::time::interval(SAMPLE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            every.tick().await;
            let Some(console) = console.upgrade() else { return };
            let admin = &console.admin;
            let live = LiveStatus {
                progress: Some(admin.progress.clone()),
                timing: admin.timing.clone(),
                rebuild: admin.rebuild.clone(),
            };
            if let Ok(status) = running_status(&*admin.log, &admin.projection, &live).await {
                console.history.push(Sample::of(&status, super::api::now_ms()));
            }
        }
    }

    /// Starts [`History::sampler`] for `console`.
    pub(super) fn start<L: EventLog>(console: &Arc<Console<L>>) {
        tokio::spawn(Self::sampler(Arc::downgrade(console)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_ms: u64) -> Sample {
        Sample { t_ms, applied: t_ms * 10, lag: 0, partitions: vec![(0, 0)], watermark_lag_ms: 0 }
    }

    #[test]
    fn the_history_keeps_the_newest_samples_oldest_first() {
        let history = History::default();
        for t in 0..(SAMPLES as u64 + 5) {
            history.push(sample(t));
        }
        let view = history.view();
        assert_eq!(view.samples.len(), SAMPLES);
        assert_eq!(view.samples.first().unwrap().t_ms, 5, "the five oldest went");
        assert_eq!(view.samples.last().unwrap().t_ms, SAMPLES as u64 + 4);
        assert_eq!(view.every_ms, 2_000);
    }
}
