//! The `timers-in-all` quota of one batch: how many timers the projection
//! holds, so that a new one is refused at [`PayloadLimits::max_timers`].
//!
//! Rules it keeps:
//! - **Counted: the snapshot's, plus the batch's.** The committed count is
//!   read from the batch's snapshot once, and only when a set would make a
//!   new timer; every key scope of the batch adds one for each new timer
//!   ([`TimerQuota::reserve`], refused at the limit) and takes one off for
//!   each it cancels or fires ([`TimerQuota::adjust`]); a failed call gives
//!   its changes back. A batch that is not committed takes its count with
//!   it: the next batch reads the store again.
//! - **Shared by the batch's workers** (cloning shares it), not by the
//!   batches of other partitions in flight or other hosts: together they
//!   may pass the limit by what the others set meanwhile, each batch being
//!   held to it on its own.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};

use wakuwaku_core::limits::PayloadLimits;

use crate::storage::state::StateError;

/// How many timers the projection holds, as one batch sees it.
#[derive(Debug, Clone)]
pub struct TimerQuota {
    limit: usize,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// The snapshot's count, once read.
    committed: OnceLock<usize>,
    /// What the batch's calls added, less what they removed.
    added: AtomicI64,
}

impl TimerQuota {
    /// A batch's quota at [`PayloadLimits::max_timers`].
    pub fn new(limits: &PayloadLimits) -> Self {
        Self { limit: limits.max_timers, shared: Arc::default() }
    }

    /// Counts one new timer, reading the committed count with
    /// `committed` the first time; refuses with what is held when that
    /// would pass the limit.
    pub fn reserve(&self, committed: impl FnOnce() -> Result<usize, StateError>) -> Result<(), Reserve> {
        let base = match self.shared.committed.get() {
            Some(base) => *base,
            None => {
                let read = committed().map_err(Reserve::Store)?;
                *self.shared.committed.get_or_init(|| read)
            }
        };
        let limit = i64::try_from(self.limit).unwrap_or(i64::MAX);
        let base = i64::try_from(base).unwrap_or(i64::MAX);
        self.shared
            .added
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |added| {
                (base.saturating_add(added) < limit).then_some(added + 1)
            })
            .map(drop)
            .map_err(|added| Reserve::Full { held: usize::try_from(base.saturating_add(added)).unwrap_or(0) })
    }

    /// Adds `delta` (negative: timers removed, or a failed call's given
    /// back).
    pub fn adjust(&self, delta: isize) {
        self.shared.added.fetch_add(delta as i64, Ordering::AcqRel);
    }
}

/// Why [`TimerQuota::reserve`] did not count a new timer.
#[derive(Debug)]
pub enum Reserve {
    /// The projection holds `held` timers, the limit.
    Full {
        /// Timers held, committed and added by the batch.
        held: usize,
    },
    /// The store could not count them.
    Store(StateError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_timers_stop_at_the_limit_and_removed_ones_make_room() {
        let limits = PayloadLimits { max_timers: 3, ..PayloadLimits::default() };
        let quota = TimerQuota::new(&limits);
        let shared = quota.clone();
        let mut reads = 0;
        quota
            .reserve(|| {
                reads += 1;
                Ok(1)
            })
            .unwrap();
        shared.reserve(|| unreachable!("read once")).unwrap();
        assert!(matches!(quota.reserve(|| Ok(0)), Err(Reserve::Full { held: 3 })));
        quota.adjust(-1);
        shared.reserve(|| Ok(0)).unwrap();
        assert!(matches!(shared.reserve(|| Ok(0)), Err(Reserve::Full { held: 3 })));
        assert_eq!(reads, 1);
    }
}
