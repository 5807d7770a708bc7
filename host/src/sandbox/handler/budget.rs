//! What the batches in flight may make the host hold: one budget shared by
//! every partition's batch, charged by the key scopes as their calls end.
//!
//! Rules kept here:
//! - **What a batch holds is bounded.** Each call counts what it hands the
//!   host against the per-call limits of [`PayloadLimits`] as it goes, and,
//!   when it ends, the batch's shared [`BatchBudget`] is charged with what
//!   the key's scope has come to hold: its staged entries (names, values
//!   and [`limits::WRITE_OVERHEAD`](wakuwaku_core::limits::WRITE_OVERHEAD) each), the names of the counters it
//!   changed, and its emits ([`limits::EMIT_OVERHEAD`](wakuwaku_core::limits::EMIT_OVERHEAD) each). A call pays
//!   only for the growth past the most the key held after an earlier call,
//!   so a key that rewrites one entry a thousand times holds one entry's
//!   worth; shrinking gives nothing back before the batch ends, so the
//!   charge is never below what the key holds. A call that would take the
//!   batch past its budget fails as [`CallError::BatchBudget`] (retryable:
//!   its key is tried again in a later batch), whatever the module did
//!   with it. One call's growth is at most what [`CallTally::held`](wakuwaku_core::limits::CallTally::held) counts,
//!   so one call always fits an empty budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::{CallError, PayloadLimits};

/// What the batches in flight may make the host hold
/// ([`PayloadLimits::max_batch_held`]).
///
/// A consumer makes one and draws a [`BatchBudget::batch`] from it for each
/// batch, which its key scopes share (cloning shares it). What a batch takes
/// is given back when the batch is done (its last clone is dropped), so the
/// bound holds for all partitions in flight together, not per partition.
#[derive(Debug, Clone)]
pub struct BatchBudget {
    limit: usize,
    /// What every batch drawn from the same budget holds.
    held: Arc<AtomicUsize>,
    /// What this batch took, given back on drop.
    taken: Arc<Taken>,
}

/// One batch's share of a [`BatchBudget`].
#[derive(Debug)]
struct Taken {
    bytes: AtomicUsize,
    from: Arc<AtomicUsize>,
    /// Whether a call of this batch did not fit: its later calls are not
    /// made ([`BatchBudget::not_spent`]).
    refused: AtomicBool,
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.from.fetch_sub(*self.bytes.get_mut(), Ordering::AcqRel);
    }
}

impl BatchBudget {
    /// A budget of `limits.max_batch_held` bytes, usable as one batch's.
    pub fn new(limits: &PayloadLimits) -> Self {
        let held = Arc::<AtomicUsize>::default();
        let taken = Arc::new(Taken { bytes: AtomicUsize::new(0), from: held.clone(), refused: AtomicBool::new(false) });
        Self { limit: limits.max_batch_held, held, taken }
    }

    /// A batch's budget, drawing on this one together with every other
    /// batch drawn from it; what it takes is given back when it is dropped.
    pub fn batch(&self) -> Self {
        let taken =
            Arc::new(Taken { bytes: AtomicUsize::new(0), from: self.held.clone(), refused: AtomicBool::new(false) });
        Self { limit: self.limit, held: self.held.clone(), taken }
    }

    /// Fails with [`CallError::BatchBudgetSpent`] once a call of this batch
    /// did not fit: the calls after it are not made, so a batch whose
    /// budget is spent does not run every remaining key only to send it to
    /// retry.
    pub fn not_spent(&self) -> Result<(), CallError> {
        if self.taken.refused.load(Ordering::Acquire) {
            return Err(CallError::BatchBudgetSpent { limit: self.limit });
        }
        Ok(())
    }

    /// What the batches drawing on this budget hold, in bytes.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Takes `bytes` from the budget for a key that holds `key_held`
    /// already, or says what was held when they do not fit.
    pub(super) fn reserve(&self, bytes: usize, key_held: usize) -> Result<(), CallError> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .map_err(|held| {
                self.taken.refused.store(true, Ordering::Release);
                CallError::BatchBudget { held, adds: bytes, limit: self.limit, key_held }
            })?;
        self.taken.bytes.fetch_add(bytes, Ordering::AcqRel);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_drawn_from_one_budget_share_it_and_give_back_what_they_took() {
        let budget = BatchBudget::new(&PayloadLimits { max_batch_held: 100, ..PayloadLimits::default() });
        let (one, two) = (budget.batch(), budget.batch());
        one.reserve(60, 0).unwrap();
        let error = two.clone().reserve(50, 0).unwrap_err();
        assert!(matches!(error, CallError::BatchBudget { held: 60, adds: 50, limit: 100, .. }), "{error}");
        two.reserve(40, 0).unwrap();
        assert_eq!(budget.held(), 100);
        drop(one);
        assert_eq!(budget.held(), 40, "a finished batch gives back what it took");
        let scope_copy = two.clone();
        drop(two);
        assert_eq!(budget.held(), 40, "a clone still in use keeps the batch's share");
        drop(scope_copy);
        assert_eq!(budget.held(), 0);
    }
}
