//! What the release stages of a running consumer show: per partition
//! index, the projection's clock, the watermark lag, the held events and
//! bytes, the late events counted, and each input partition's clock and
//! whether it still counts (idle or not), paused or replaying.
//!
//! The consumer writes a partition's entry after every step that read or
//! released something; `/status` and `/metrics` read the board. It only
//! shows: nothing here decides anything.
//!
//! The board also keeps the most recent late events ([`LateEvent`]: key,
//! input, offset, event time, lateness), at most [`LATE_EVENTS_KEPT`], and
//! how many were read in all since the host started, for the console.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wakuwaku_core::release::{Millis, Progress, ReleaseStage};

/// One partition index of a projection over several topics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionTiming {
    /// The partition index (the same in every topic).
    pub partition: u32,
    /// The projection's clock (watermark), ms since the epoch: every held
    /// event below it was released. None while it has not moved.
    pub clock_ms: Option<Millis>,
    /// Processing time minus the clock, in ms, when the status was taken.
    pub watermark_lag_ms: Option<Millis>,
    /// Events waiting for the clock.
    pub held_events: u64,
    /// Their bytes as stored.
    pub held_bytes: u64,
    /// Late events (read after the clock passed their time) since the
    /// partition was taken: delivered at once and counted.
    pub order_violations: u64,
    /// The most bytes held at once since the partition was taken.
    pub peak_held_bytes: u64,
    /// Each input partition, in the order of the projection's topics.
    pub inputs: Vec<InputTiming>,
}

/// One input partition (a topic's partition of that index).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputTiming {
    /// The topic.
    pub topic: String,
    /// The next offset it reads.
    pub position: u64,
    /// The latest event time read from it.
    pub clock_ms: Option<Millis>,
    /// Whether it stopped counting toward the clock: its position reached
    /// an end offset the log reported.
    pub idle: bool,
    /// Whether it is paused for alignment (too far ahead of the clock with
    /// the held bytes over their bound).
    pub paused: bool,
    /// Whether it is still re-reading what it had read before a restart.
    pub replaying: bool,
}

impl PartitionTiming {
    /// The status of `stage`, the release stage of `partition` over
    /// `topics`, at processing time `now`; `violations` late events since
    /// the partition was taken.
    pub(super) fn of<T>(
        partition: u32,
        topics: &[String],
        stage: &ReleaseStage<T>,
        now: Millis,
        peak_held_bytes: u64,
    ) -> Self {
        let inputs = (0..stage.inputs())
            .filter_map(|input| stage.input_status(input))
            .zip(topics)
            .map(|(status, topic)| InputTiming {
                topic: topic.clone(),
                position: status.position,
                clock_ms: status.clock,
                idle: matches!(status.progress, Progress::Idle { .. }),
                paused: status.paused,
                replaying: status.replaying,
            })
            .collect();
        PartitionTiming {
            partition,
            clock_ms: stage.clock(),
            watermark_lag_ms: stage.clock().map(|clock| now.saturating_sub(clock)),
            held_events: stage.held_events() as u64,
            held_bytes: stage.held_bytes(),
            order_violations: stage.violations(),
            peak_held_bytes: peak_held_bytes.max(stage.held_bytes()),
            inputs,
        }
    }
}

/// How many late events the board keeps, the most recent.
pub const LATE_EVENTS_KEPT: usize = 100;

/// An event read after the clock passed its event time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LateEvent {
    /// Its key as the module wrote it (`?` when its headers had none
    /// readable); not made printable here.
    pub key: String,
    /// The topic it was read from.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// Its offset there.
    pub offset: u64,
    /// Its event time, ms since the epoch.
    pub event_time_ms: Millis,
    /// How late: the clock minus its event time, ms.
    pub lateness_ms: Millis,
    /// When it was read, ms since the epoch.
    pub read_at_ms: Millis,
}

/// The late events the board keeps, and their count.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LateEvents {
    /// Late events read since the host started (a batch not committed may
    /// read one again after a restart; `order_violations` counts those
    /// committed).
    pub total: u64,
    /// The most recent, newest first, at most [`LATE_EVENTS_KEPT`].
    pub recent: std::collections::VecDeque<LateEvent>,
}

/// The latest [`PartitionTiming`] of every partition index the consumer
/// holds.
#[derive(Debug, Default)]
pub struct TimingBoard {
    partitions: Mutex<BTreeMap<u32, PartitionTiming>>,
    latency: Mutex<LatencyHistogram>,
    late: Mutex<LateEvents>,
}

impl TimingBoard {
    /// Replaces the entry of its partition.
    pub fn update(&self, timing: PartitionTiming) {
        self.partitions.lock().unwrap_or_else(|e| e.into_inner()).insert(timing.partition, timing);
    }

    /// Forgets a partition this host no longer holds.
    pub fn remove(&self, partition: u32) {
        self.partitions.lock().unwrap_or_else(|e| e.into_inner()).remove(&partition);
    }

    /// Every entry, by partition.
    pub fn snapshot(&self) -> Vec<PartitionTiming> {
        self.partitions.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// Counts `events` released in event-time order together, whose
    /// handle calls were committed `latency` after the clock passed them.
    pub(super) fn released(&self, latency: Duration, events: u64) {
        self.latency.lock().unwrap_or_else(|e| e.into_inner()).observe(latency, events);
    }

    /// Keeps `event`, read late, dropping the oldest past [`LATE_EVENTS_KEPT`].
    pub(super) fn late(&self, event: LateEvent) {
        let mut late = self.late.lock().unwrap_or_else(|e| e.into_inner());
        late.total += 1;
        late.recent.truncate(LATE_EVENTS_KEPT - 1);
        late.recent.push_front(event);
    }

    /// The late events kept, newest first, and their count.
    pub fn late_events(&self) -> LateEvents {
        self.late.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The release latencies counted so far, over every partition index:
    /// from the clock passing an event to the commit of its handle call.
    pub fn release_latency(&self) -> LatencyHistogram {
        self.latency.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Counts of latencies in buckets of a quarter of a power of two of
/// microseconds (each bucket about 19 % wide), up to about 70 minutes: a
/// percentile is read as its bucket's upper bound, so it is never
/// understated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyHistogram {
    counts: Vec<u64>,
}

/// Quarter steps of a power of two: 4 buckets per doubling.
const STEPS: f64 = 4.0;
/// Buckets: 2^(128/4) µs is over an hour; longer ones share the last.
const BUCKETS: usize = 128;

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self { counts: vec![0; BUCKETS] }
    }
}

impl LatencyHistogram {
    /// Counts `n` samples of `latency`.
    pub fn observe(&mut self, latency: Duration, n: u64) {
        let micros = latency.as_micros().max(1) as f64;
        let bucket = ((micros.log2() * STEPS).ceil() as usize).min(BUCKETS - 1);
        self.counts[bucket] += n;
    }

    /// How many samples were counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// What was counted since `earlier`, a copy of this histogram taken
    /// before.
    pub fn since(&self, earlier: &LatencyHistogram) -> LatencyHistogram {
        let counts = self.counts.iter().zip(&earlier.counts).map(|(now, then)| now.saturating_sub(*then)).collect();
        LatencyHistogram { counts }
    }

    /// The latency `q` (0..=1) of the samples are at or below, as the upper
    /// bound of its bucket; none without samples.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        let bucket = self.counts.iter().position(|&count| {
            seen += count;
            seen >= rank
        })?;
        Some(Duration::from_micros(2f64.powf(bucket as f64 / STEPS).round() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_bucket_upper_bounds_and_never_understate() {
        let mut histogram = LatencyHistogram::default();
        assert_eq!(histogram.quantile(0.5), None);
        histogram.observe(Duration::from_millis(3), 98);
        histogram.observe(Duration::from_millis(80), 2);
        let before = histogram.clone();
        let p50 = histogram.quantile(0.5).unwrap();
        assert!(p50 >= Duration::from_millis(3) && p50 < Duration::from_micros(3600), "{p50:?}");
        let p99 = histogram.quantile(0.99).unwrap();
        assert!(p99 >= Duration::from_millis(80) && p99 < Duration::from_millis(96), "{p99:?}");
        histogram.observe(Duration::from_secs(1 << 20), 1);
        assert_eq!(histogram.since(&before).count(), 1, "an hour and more share the last bucket");
    }
}
