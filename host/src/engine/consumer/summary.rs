//! What a stretch of consuming did ([`Summary`]), summed over batches and
//! partitions.
//!
//! Rules kept here:
//! - **One list of counts.** The counts a projection keeps with its state
//!   are [`Counts`], declared once with [`Stat`]; a summary holds them as
//!   they are (read as `summary.applied`, through [`std::ops::Deref`]) and
//!   adds only what no statistic keeps: batches, messages consumed, calls,
//!   redone events and the time per phase. What a commit adds to the
//!   statistics is those counts ([`Summary::stat_deltas`]), never a copy
//!   made field by field.

use std::ops::{Deref, DerefMut};

use super::phase::PhaseTimes;
use crate::storage::stats::{Counts, Stats};

/// What a stretch of consuming did.
///
/// Its statistics are its [`Counts`] (`applied`, `skipped`, `malformed`,
/// `dead_lettered`, `retry_in`, `retry_out`, `undeliverable`,
/// `order_violations`, …), read and added to as its own fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Batches committed.
    pub batches: u64,
    /// Messages consumed (applied + skipped + malformed).
    pub consumed: u64,
    /// The statistics it adds to the projection's ([`crate::storage::stats`]).
    pub counts: Counts,
    /// Handler calls made.
    pub calls: u64,
    /// Events processed for nothing: their batch's commit was refused
    /// because another host took the partition (fencing), or done again
    /// because the database had forgotten their commits
    /// ([`StateError::PositionMoved`](crate::storage::state::StateError::PositionMoved)).
    pub redone: u64,
    /// Where the time went, per phase of a batch (see [`super::phase`]).
    pub phases: PhaseTimes,
}

impl Summary {
    /// Adds what `other` did.
    pub fn add(&mut self, other: &Summary) {
        self.batches += other.batches;
        self.consumed += other.consumed;
        self.counts.absorb(&other.counts);
        self.calls += other.calls;
        self.redone += other.redone;
        self.phases.absorb(&other.phases);
    }

    /// The counts a commit adds to the projection's statistics: all of its
    /// own but the undeliverable messages, which the outbox counts when it
    /// finds them ([`crate::engine::outbox`]).
    pub(super) fn stat_deltas(&self) -> Stats {
        Stats::from(Counts { undeliverable: 0, ..self.counts })
    }
}

impl Deref for Summary {
    type Target = Counts;

    fn deref(&self) -> &Counts {
        &self.counts
    }
}

impl DerefMut for Summary {
    fn deref_mut(&mut self) -> &mut Counts {
        &mut self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::stats::Stat;

    #[test]
    fn adding_summaries_adds_every_statistic_and_the_rest() {
        let counts = Counts { applied: 2, retry_in: 1, ..Counts::default() };
        let mut total = Summary { batches: 1, consumed: 3, calls: 2, counts, ..Summary::default() };
        let mut other = Summary { batches: 2, consumed: 5, redone: 4, ..Summary::default() };
        for (count, stat) in (1..).zip(Stat::ALL) {
            other.counts.add(stat, count);
        }
        total.add(&other);
        assert_eq!((total.batches, total.consumed, total.calls, total.redone), (3, 8, 2, 4));
        assert_eq!(total.applied, 3);
        assert_eq!(total.retry_in, 1 + 5);
        for (count, stat) in (1..).zip(Stat::ALL).skip(1).filter(|(_, stat)| *stat != Stat::RetryIn) {
            assert_eq!(*total.field(stat), count, "{stat}");
        }
    }

    #[test]
    fn a_commit_adds_every_statistic_but_the_undeliverable_messages() {
        let mut summary = Summary::default();
        for stat in Stat::ALL {
            summary.counts.add(stat, 7);
        }
        let deltas = summary.stat_deltas();
        for stat in Stat::ALL {
            let expected = if stat == Stat::Undeliverable { 0 } else { 7 };
            assert_eq!(deltas.get(stat), expected, "{stat}");
        }
    }

    #[test]
    fn statistics_saturate_rather_than_wrap() {
        let counts = |applied| Counts { applied, ..Counts::default() };
        let mut summary = Summary { counts: counts(u64::MAX - 1), ..Summary::default() };
        summary.add(&Summary { counts: counts(5), ..Summary::default() });
        assert_eq!(summary.applied, u64::MAX);
    }
}
