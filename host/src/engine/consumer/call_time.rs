//! How long one module's calls may run in one batch.
//!
//! The sandbox bounds one call ([`SandboxLimits::call_budget`]), but a
//! module that takes nearly all of it on every call would hold a batch of
//! thousands of keys, and every other module's events in it, for hours.
//! So each batch also bounds the time each module's calls (its `combine`
//! and `handle` calls, summed over the workers) may take in all
//! ([`ConsumerConfig::module_time_per_batch`]). Past it, the module's
//! remaining calls in the batch are not made: they fail as
//! [`CallError::BatchTime`], their keys go to the retry topic without
//! losing an attempt, and the batch commits. Other modules are not held
//! up, and nothing is lost.
//!
//! Rules kept here:
//! - The first call of each module in a batch always runs (the check is
//!   "already over", never "would be over"), so every batch makes progress
//!   and the keys a slow module delays are all reached in the end.
//! - Time is wall time measured around the calls, so a call's time counts
//!   even when it traps, and so do the waits between a transient failure's
//!   retries in place (a module failing transiently on every call would
//!   otherwise hold the batch for its backoff times its keys).
//! - A cut is logged once per module and batch, not once per key.
//!
//! [`SandboxLimits::call_budget`]: crate::sandbox::runtime::SandboxLimits::call_budget
//! [`ConsumerConfig::module_time_per_batch`]: super::ConsumerConfig::module_time_per_batch

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::sandbox::handler::CallError;

/// The time each module's calls have taken in one batch, shared by its
/// workers; indexed like the batch's `ModuleSet::modules`.
pub(super) struct CallTime {
    limit: Duration,
    spent_nanos: Vec<AtomicU64>,
    /// Whether the module's cut was logged.
    logged: Vec<AtomicBool>,
}

impl CallTime {
    /// Nothing spent yet by any of `modules` modules.
    pub(super) fn new(limit: Duration, modules: usize) -> Self {
        Self {
            limit,
            spent_nanos: (0..modules).map(|_| AtomicU64::new(0)).collect(),
            logged: (0..modules).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Adds `elapsed` to what `module`'s calls have taken.
    pub(super) fn charge(&self, module: usize, elapsed: Duration) {
        if let Some(spent) = self.spent_nanos.get(module) {
            let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
            // Saturating: a sum past u64 nanoseconds (585 years) stays over.
            let _ = spent.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| Some(s.saturating_add(nanos)));
        }
    }

    /// Whether `module` (named `name`) may still be called in this batch.
    pub(super) fn check(&self, module: usize, name: &str) -> Result<(), CallError> {
        let spent = Duration::from_nanos(self.spent_nanos.get(module).map_or(0, |s| s.load(Ordering::Relaxed)));
        if spent <= self.limit {
            return Ok(());
        }
        let error = CallError::BatchTime {
            module: name.to_owned(),
            spent_ms: spent.as_millis(),
            limit_ms: self.limit.as_millis(),
        };
        if self.logged.get(module).is_some_and(|logged| !logged.swap(true, Ordering::Relaxed)) {
            tracing::warn!(module = name, "{error}; this applies to all its keys left in the batch");
        }
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_is_stopped_only_once_it_is_over_and_alone() {
        let time = CallTime::new(Duration::from_millis(10), 2);
        assert!(time.check(0, "slow").is_ok(), "the first call always runs");
        time.charge(0, Duration::from_millis(10));
        assert!(time.check(0, "slow").is_ok(), "at the limit is not over it");
        time.charge(0, Duration::from_nanos(1));
        let error = time.check(0, "slow").unwrap_err();
        assert!(matches!(&error, CallError::BatchTime { module, limit_ms: 10, .. } if module == "slow"), "{error}");
        assert!(error.to_string().starts_with("batch-module-time: module `slow` has run for 10 ms"), "{error}");
        assert!(!error.counts_as_attempt());
        assert!(time.check(1, "other").is_ok(), "another module keeps its own time");
    }

    #[test]
    fn huge_charges_saturate_and_unknown_modules_are_ignored() {
        let time = CallTime::new(Duration::from_secs(1), 1);
        time.charge(0, Duration::MAX);
        time.charge(0, Duration::MAX);
        assert!(time.check(0, "m").is_err());
        time.charge(7, Duration::MAX);
        assert!(time.check(7, "gone").is_ok());
    }
}
