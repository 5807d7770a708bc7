//! The clock timers fire by, as a batch is handed it ([`BatchClock`]), and
//! for a projection of one topic, where no release stage keeps one, the
//! clock its partition's evidence gives ([`SoloClock`]).
//!
//! Rules kept here (`docs/timers.md` says them for authors):
//! - **One clock, the release stage's.** A projection over several topics
//!   fires timers by the clock its release stage committed with the batch
//!   ([`wakuwaku_core::release`]); a projection of one topic gets the same
//!   clock from its partition as a stage of one event-time input would:
//!   the latest event time read (of a timed type, within
//!   `--max-event-time-ahead` of its append time), or one past it once the
//!   position reached an end offset the log reported; lowered by
//!   `--allowed-lateness`; never going back. No wall clock decides, and a
//!   partition that has read no event time has no clock: its timers wait.
//! - **Kept with the state.** The one-topic clock and the latest event
//!   time read are committed with every batch, as positions under names no
//!   topic can have (`timers:clock-*`, `timers:latest-*`), so a restart
//!   fires from where the last commit left the clock, never from less.
//!   `waku reset` clears them with the positions.
//! - **Late events hold no timer back**: an event of the one topic whose
//!   time is below the clock as it is read is late; the batch places it
//!   anywhere among its key's timers ([`wakuwaku_core::timers::Place`]),
//!   as the release stage's late events are.

use std::collections::HashSet;

use wakuwaku_core::release::{Millis, ReleaseLimits};

use super::release_marks::{clock_bits, clock_of};
use crate::engine::projection::ModuleSet;
use crate::event::Envelope;
use crate::storage::log::PolledBatch;
use crate::storage::state::{BatchCommit, StateError, StateStore};

/// The position names of the one-topic clock's halves and of the latest
/// event time read.
const CLOCK_HIGH: &str = "timers:clock-high";
const CLOCK_LOW: &str = "timers:clock-low";
const LATEST_HIGH: &str = "timers:latest-high";
const LATEST_LOW: &str = "timers:latest-low";

/// What a batch fires timers by: the projection's clock once its events
/// are released (none: no timer is due), and which of its records were
/// read late, by (input, offset).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct BatchClock {
    pub(super) clock: Option<Millis>,
    pub(super) late: HashSet<(u32, u64)>,
}

/// The clock of one partition of a projection of one topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct SoloClock {
    /// The latest admitted event time read below the committed position.
    latest: Option<Millis>,
    /// The clock, as committed or moved since.
    clock: Option<Millis>,
    /// The highest end offset the log reported.
    end: u64,
}

impl SoloClock {
    /// The clock of `partition` of `topic` as last committed, its end
    /// offset not known yet.
    pub(super) fn restore(store: &StateStore, partition: u32) -> Result<Self, StateError> {
        let read = |high: &str, low: &str| -> Result<Option<Millis>, StateError> {
            Ok(match (store.position(high, partition)?, store.position(low, partition)?) {
                (Some(high), Some(low)) => Some(clock_of((high << 32) | low)),
                _ => None,
            })
        };
        Ok(Self { latest: read(LATEST_HIGH, LATEST_LOW)?, clock: read(CLOCK_HIGH, CLOCK_LOW)?, end: 0 })
    }

    /// The clock now.
    pub(super) fn clock(&self) -> Option<Millis> {
        self.clock
    }

    /// The log reported `end` as the partition's end offset, the position
    /// being `position`: once the position reached it, everything read may
    /// go, and the clock moves one past the latest event time read.
    /// Returns whether the clock moved.
    pub(super) fn observe_end(&mut self, end: u64, position: u64, limits: ReleaseLimits) -> bool {
        self.end = self.end.max(end);
        let before = self.clock;
        self.advance(position, limits);
        self.clock != before
    }

    /// Whether an end offset would move the clock: event times were read
    /// and the position is not known to be at an end the log reported.
    pub(super) fn waits_for_end(&self, position: u64) -> bool {
        self.latest.is_some() && position > self.end
    }

    /// Moves the clock as far as the evidence lets it, never back.
    fn advance(&mut self, position: u64, limits: ReleaseLimits) {
        let Some(latest) = self.latest else { return };
        let idle = position >= self.end && self.end > 0;
        let evidence = if idle { latest.saturating_add(1) } else { latest };
        let clock = evidence.saturating_sub(limits.allowed_lateness.max(0));
        self.clock = Some(self.clock.map_or(clock, |before| before.max(clock)));
    }

    /// Reads a polled batch of the one topic, from `position` on: each
    /// record of a timed type moves the clock by its event time; one read
    /// with a time below the clock is late. Returns what the batch fires
    /// timers by; the clock is moved as after the batch.
    pub(super) fn read(
        &mut self,
        records: &PolledBatch,
        modules: &ModuleSet,
        limits: ReleaseLimits,
        position: u64,
    ) -> BatchClock {
        let mut late = HashSet::new();
        for view in records.iter() {
            let Ok(envelope) = Envelope::parse(view.headers()) else { continue };
            let Ok(Some(time)) = modules.event_time(envelope.tag, envelope.event_time) else { continue };
            if !limits.admits(time, view.append_time()) {
                continue;
            }
            if self.clock.is_some_and(|clock| time < clock) {
                late.insert((view.input(), view.offset()));
            }
            self.latest = Some(self.latest.map_or(time, |latest| latest.max(time)));
            // A record read past the end reported counts again.
            self.advance(view.offset().max(position), limits);
        }
        let next = records.last().map_or(position, |last| last.offset() + 1);
        self.advance(next, limits);
        BatchClock { clock: self.clock, late }
    }

    /// Adds the clock and the latest event time read to `commit`.
    pub(super) fn add_to_commit(&self, commit: &mut BatchCommit, partition: u32) {
        for (time, high, low) in [(self.clock, CLOCK_HIGH, CLOCK_LOW), (self.latest, LATEST_HIGH, LATEST_LOW)] {
            if let Some(time) = time {
                let bits = clock_bits(time);
                commit.positions.push((high.to_owned(), partition, bits >> 32));
                commit.positions.push((low.to_owned(), partition, bits & u64::from(u32::MAX)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_follows_the_latest_time_read_and_passes_it_only_at_an_end_offset() {
        let limits = ReleaseLimits::default();
        let mut solo = SoloClock::default();
        assert!(!solo.observe_end(5, 0, limits), "nothing read: no clock");
        solo.latest = Some(100);
        solo.advance(3, limits);
        assert_eq!(solo.clock(), Some(100), "below the end: the latest time read, exclusive");
        assert!(solo.observe_end(5, 5, limits));
        assert_eq!(solo.clock(), Some(101), "at the end: one past it");
        // New data past the end counts again, and the clock never goes back.
        solo.latest = Some(100);
        solo.advance(3, limits);
        assert_eq!(solo.clock(), Some(101));
    }

    #[test]
    fn an_allowed_lateness_makes_the_clock_trail() {
        let limits = ReleaseLimits { allowed_lateness: 10, ..ReleaseLimits::default() };
        let mut solo = SoloClock { latest: Some(100), ..SoloClock::default() };
        solo.advance(0, limits);
        assert_eq!(solo.clock(), Some(90));
        solo.observe_end(1, 1, limits);
        assert_eq!(solo.clock(), Some(91));
    }
}
