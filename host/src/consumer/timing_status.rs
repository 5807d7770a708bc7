//! What the release stages of a running consumer show: per partition
//! index, the projection's clock, the watermark lag, the held events and
//! bytes, the late events counted, and each input partition's clock and
//! whether it still counts (idle or not), paused or replaying.
//!
//! The consumer writes a partition's entry after every step that read or
//! released something; `/status` and `/metrics` read the board. It only
//! shows: nothing here decides anything.

use std::collections::BTreeMap;
use std::sync::Mutex;

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
    pub(super) fn of<T>(partition: u32, topics: &[String], stage: &ReleaseStage<T>, now: Millis) -> Self {
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
            inputs,
        }
    }
}

/// The latest [`PartitionTiming`] of every partition index the consumer
/// holds.
#[derive(Debug, Default)]
pub struct TimingBoard {
    partitions: Mutex<BTreeMap<u32, PartitionTiming>>,
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
}
