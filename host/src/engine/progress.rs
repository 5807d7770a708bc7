//! Knowing when history is replayed: the caught-up gate.
//!
//! A silent partition may be done or merely slow; a timeout cannot tell.
//! So when a consumer starts, it reads every partition's end offset once
//! and keeps it ([`Progress::begin`]). A partition is caught up when its
//! committed position reaches that offset; the projection is caught up when
//! every partition is. Readiness (`/ready`), the progress display and
//! `waku status` read this gate; no timer decides anything.
//!
//! Positions are published after each commit ([`Progress::advance`]), so
//! the gate never claims more than the state holds.
//!
//! The gate covers the partitions the host holds now: a partition it loses
//! (another host claimed it, [`Progress::release`]) leaves the gate, and
//! one it takes later joins it with the position and end offset read when
//! it was taken ([`Progress::take`]). A partition whose log lost its tail
//! follows the new end ([`Progress::lower_end`]): offsets that are gone
//! are never waited for.
//!
//! It also keeps each partition's last batch ([`LastBatch`]: its size,
//! its phases, how long it took, when it ended), for the console: one
//! short lock per batch, never per event.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};
use std::time::Instant;

/// One partition as the gate sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionProgress {
    /// The partition.
    pub partition: u32,
    /// The committed position when the consumer started.
    pub start: u64,
    /// The end offset when the consumer started: the gate.
    pub end_at_start: u64,
    /// The committed position now.
    pub position: u64,
    /// The offset after the last batch read (at least the position): what
    /// lies between the two is the batch in flight, which a host that takes
    /// the partition after this one dies reads again.
    pub read_to: u64,
}

impl PartitionProgress {
    /// Whether the partition reached its start-up end offset.
    pub fn caught_up(&self) -> bool {
        self.position >= self.end_at_start
    }
}

/// A partition's last batch ([`Progress::batch_done`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LastBatch {
    /// What it read: `topic` (from the partition's position) or `retry`
    /// (keys due again).
    pub kind: &'static str,
    /// Events it consumed.
    pub events: u64,
    /// Events it applied.
    pub applied: u64,
    /// Handler calls it made.
    pub calls: u64,
    /// `(phase, µs)` of each phase that took any time, in data-flow order
    /// (`reduce` and `calls` summed over the batch's workers).
    pub phases: Vec<(&'static str, u64)>,
    /// Its wall time, µs, from its poll to its commit.
    pub took_us: u64,
    /// When it ended, ms since the epoch.
    pub at_ms: u64,
}

/// The caught-up gate of one consumer; cheap to share.
#[derive(Debug, Default)]
pub struct Progress {
    /// Each partition's last batch, by partition.
    last_batches: std::sync::Mutex<std::collections::BTreeMap<u32, LastBatch>>,
    started: OnceLock<Started>,
    /// Set while the log cannot be reached.
    log_unavailable: std::sync::atomic::AtomicBool,
    /// Events this host processed for nothing since it started (their
    /// batch's commit was refused by fencing): what rebalances cost it.
    redone: AtomicU64,
}

#[derive(Debug)]
struct Started {
    at: Instant,
    /// Each partition held.
    partitions: RwLock<Vec<Held>>,
}

/// A partition in the gate.
#[derive(Debug)]
struct Held {
    partition: u32,
    start: u64,
    /// The end offset at start.
    end: u64,
    /// The committed position now.
    now: AtomicU64,
    /// The offset after the last batch read.
    read_to: AtomicU64,
}

impl Held {
    fn new(partition: u32, start: u64, end: u64) -> Self {
        Self { partition, start, end, now: AtomicU64::new(start), read_to: AtomicU64::new(start) }
    }
}

impl Started {
    fn partitions(&self) -> std::sync::RwLockReadGuard<'_, Vec<Held>> {
        self.partitions.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn partitions_mut(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Held>> {
        self.partitions.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Progress {
    /// Records the partitions' positions and end offsets at start-up, as
    /// (partition, committed position, end offset). Only the first call
    /// counts: the gate is the end offsets of the first start.
    pub fn begin(&self, partitions: impl IntoIterator<Item = (u32, u64, u64)>) {
        let partitions = partitions.into_iter().map(|(p, start, end)| Held::new(p, start, end)).collect();
        let _ = self.started.set(Started { at: Instant::now(), partitions: RwLock::new(partitions) });
    }

    /// Adds a partition taken after start-up, as (committed position, end
    /// offset) read when it was taken; it replaces any earlier gate of it.
    pub fn take(&self, partition: u32, start: u64, end: u64) {
        let started = self.started.get_or_init(|| Started { at: Instant::now(), partitions: RwLock::default() });
        let mut partitions = started.partitions_mut();
        partitions.retain(|held| held.partition != partition);
        partitions.push(Held::new(partition, start, end));
        partitions.sort_unstable_by_key(|held| held.partition);
    }

    /// Takes a partition the host no longer holds out of the gate.
    pub fn release(&self, partition: u32) {
        if let Some(started) = self.started.get() {
            started.partitions_mut().retain(|held| held.partition != partition);
        }
    }

    /// Lowers a partition's gate to `end`: its log lost its tail, so the
    /// end offset read at start-up no longer exists and is never waited for
    /// ([`crate::storage::log::loss`]).
    pub fn lower_end(&self, partition: u32, end: u64) {
        if let Some(started) = self.started.get() {
            for held in started.partitions_mut().iter_mut() {
                if held.partition == partition {
                    held.end = held.end.min(end);
                }
            }
        }
    }

    /// Records a partition's committed position.
    pub fn advance(&self, partition: u32, position: u64) {
        self.with(partition, |held| {
            held.now.fetch_max(position, Ordering::Relaxed);
            held.read_to.fetch_max(position, Ordering::Relaxed);
        });
    }

    /// Records that a batch of a partition up to (not including) `offset`
    /// was read: it is in flight until its commit.
    pub fn read(&self, partition: u32, offset: u64) {
        self.with(partition, |held| {
            held.read_to.fetch_max(offset, Ordering::Relaxed);
        });
    }

    /// Calls `f` on `partition`, if it is in the gate.
    fn with(&self, partition: u32, f: impl FnOnce(&Held)) {
        if let Some(started) = self.started.get()
            && let Some(held) = started.partitions().iter().find(|held| held.partition == partition)
        {
            f(held);
        }
    }

    /// Sets a partition's committed position back to `position`: the store
    /// holds less than this host had committed (it forgot commits).
    pub fn rewind(&self, partition: u32, position: u64) {
        self.with(partition, |held| {
            held.now.store(position, Ordering::Relaxed);
            held.read_to.store(position, Ordering::Relaxed);
        });
    }

    /// Every partition held, once the consumer has started.
    pub fn partitions(&self) -> Vec<PartitionProgress> {
        self.started.get().map_or_else(Vec::new, |started| {
            started
                .partitions()
                .iter()
                .map(|held| PartitionProgress {
                    partition: held.partition,
                    start: held.start,
                    end_at_start: held.end,
                    position: held.now.load(Ordering::Relaxed),
                    read_to: held.read_to.load(Ordering::Relaxed),
                })
                .collect()
        })
    }

    /// Whether the consumer has started and every partition it holds is
    /// caught up.
    pub fn caught_up(&self) -> bool {
        self.started.get().is_some() && self.partitions().iter().all(PartitionProgress::caught_up)
    }

    /// Records whether the log can be reached.
    pub fn set_log_available(&self, available: bool) {
        self.log_unavailable.store(!available, Ordering::Relaxed);
    }

    /// Counts `events` processed for nothing: their batch's commit was
    /// refused because another host took the partition
    /// (`waku_events_redone_total`).
    pub fn add_redone(&self, events: u64) {
        self.redone.fetch_add(events, Ordering::Relaxed);
    }

    /// Events this host processed for nothing since it started
    /// ([`Progress::add_redone`]).
    pub fn redone(&self) -> u64 {
        self.redone.load(Ordering::Relaxed)
    }

    /// Whether the log could be reached at the last try.
    pub fn log_available(&self) -> bool {
        !self.log_unavailable.load(Ordering::Relaxed)
    }

    /// Events of the start-up backlog consumed, and the backlog's size.
    pub fn replayed(&self) -> (u64, u64) {
        self.partitions().iter().fold((0, 0), |(done, total), p| {
            let backlog = p.end_at_start.saturating_sub(p.start);
            (done + p.position.min(p.end_at_start).saturating_sub(p.start), total + backlog)
        })
    }

    /// Seconds since the consumer started.
    pub fn elapsed_secs(&self) -> f64 {
        self.started.get().map_or(0.0, |started| started.at.elapsed().as_secs_f64())
    }

    /// Records `batch` as `partition`'s last.
    pub fn batch_done(&self, partition: u32, batch: LastBatch) {
        let mut last = self.last_batches.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        last.insert(partition, batch);
    }

    /// Each partition's last batch, by partition (those that ran one since
    /// the consumer started).
    pub fn last_batches(&self) -> std::collections::BTreeMap<u32, LastBatch> {
        self.last_batches.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caught_up_only_when_every_partition_reaches_its_start_up_end() {
        let progress = Progress::default();
        assert!(!progress.caught_up(), "not before the consumer starts");
        progress.begin([(0, 10, 50), (1, 0, 0), (2, 7, 7)]);
        assert!(!progress.caught_up());
        assert_eq!(progress.replayed(), (0, 40));
        progress.advance(0, 49);
        assert!(!progress.caught_up());
        progress.advance(0, 50);
        assert!(progress.caught_up());
        assert_eq!(progress.replayed(), (40, 40));
        // Later messages do not move the gate; an older position never
        // moves a partition back.
        progress.advance(0, 70);
        progress.advance(0, 60);
        assert_eq!(progress.partitions()[0].position, 70);
        assert_eq!(progress.replayed(), (40, 40));
        progress.begin([(0, 0, 1000)]);
        assert!(progress.caught_up(), "the first start's end offsets are the gate");
    }

    #[test]
    fn the_gate_follows_the_partitions_held() {
        let progress = Progress::default();
        progress.begin([(0, 0, 10), (1, 0, 10)]);
        progress.advance(0, 10);
        assert!(!progress.caught_up());
        // Partition 1 was taken over by another host: it no longer counts.
        progress.release(1);
        assert!(progress.caught_up());
        assert_eq!(progress.partitions().iter().map(|p| p.partition).collect::<Vec<_>>(), [0]);
        progress.advance(1, 10);
        assert_eq!(progress.partitions().len(), 1, "a released partition does not come back by advancing");
        // Taking partition 2 later: its gate is what was read when taken.
        progress.take(2, 5, 8);
        assert!(!progress.caught_up());
        assert_eq!(progress.replayed(), (10, 13));
        progress.advance(2, 8);
        assert!(progress.caught_up());
    }

    #[test]
    fn a_lost_tail_lowers_the_gate_and_never_raises_it() {
        let progress = Progress::default();
        progress.begin([(0, 0, 100), (1, 0, 10)]);
        progress.advance(0, 60);
        progress.advance(1, 10);
        assert!(!progress.caught_up());
        progress.lower_end(0, 60);
        assert!(progress.caught_up(), "the offsets past 60 are gone");
        progress.lower_end(0, 80);
        assert_eq!(progress.partitions()[0].end_at_start, 60);
        assert_eq!(progress.replayed(), (70, 70));
    }
}
