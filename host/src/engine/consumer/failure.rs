//! Where a failed chunk goes: the retry-or-dead-letter decision, as a pure
//! function of the failure and the attempts its events have had.
//!
//! Rules (DESIGN.md, "Errors and where events go"):
//! - The attempt a failure makes is one more than the most attempts any
//!   event of the chunk had before, unless the failure does not count as
//!   an attempt (a key that merely shared a batch with a flood,
//!   [`CallError::counts_as_attempt`](crate::sandbox::handler::CallError::counts_as_attempt)).
//! - An unrecoverable failure is dead-lettered at once.
//! - Any other failure (retryable, a trap, a transient one that stayed so
//!   after its retries in place) goes to the retry topic, until its
//!   attempt reaches `max_attempts`: then it is dead-lettered, never
//!   retried forever.

use crate::engine::routing::{FailureClass, Routed};
use crate::event::EventAtomicOrdering;

/// The attempts a record has had, and when the first of them failed: what
/// its next retry or dead-letter record carries on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Tries {
    /// Attempts made.
    pub(super) attempts: u32,
    /// When the first failed, in ms since the epoch; 0 before any failure.
    pub(super) first_failed_at_ms: u64,
    /// The ordering its event had on its topic, before a retry rewrote
    /// it; `None` when an older version routed it without saying.
    pub(super) ordering: Option<EventAtomicOrdering>,
}

impl Tries {
    /// What a record taken from the retry topic had.
    pub(super) fn of(routed: &Routed) -> Self {
        Self {
            attempts: routed.attempts,
            first_failed_at_ms: routed.first_failed_at_ms.unwrap_or(0),
            ordering: routed.ordering,
        }
    }

    /// What an event read from its topic has: no attempt, its ordering.
    pub(super) fn fresh(ordering: EventAtomicOrdering) -> Self {
        Self { ordering: Some(ordering), ..Self::default() }
    }

    /// What records folded into one carry: the most attempts any had, and
    /// the earliest first failure, the first ordering recorded.
    pub(super) fn merged(tries: impl IntoIterator<Item = Tries>) -> Self {
        tries.into_iter().fold(Self::default(), |merged, tries| Self {
            attempts: merged.attempts.max(tries.attempts),
            first_failed_at_ms: match (merged.first_failed_at_ms, tries.first_failed_at_ms) {
                (0, first) | (first, 0) => first,
                (one, other) => one.min(other),
            },
            ordering: merged.ordering.or(tries.ordering),
        })
    }

    /// The first failure time a record failing (`failed`) at `now_ms`
    /// carries: its earlier one, else `now_ms` if it failed, else none.
    pub(super) fn first_failure(self, failed: bool, now_ms: u64) -> Option<u64> {
        match self.first_failed_at_ms {
            0 => failed.then_some(now_ms),
            first => Some(first),
        }
    }
}

/// Where a failed chunk goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// To the dead-letter topic; the key goes on.
    DeadLetter,
    /// To the retry topic, with the key's unfinished work; the key stops.
    Retry,
}

/// The decision for one failed chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Decision {
    /// The attempt this failure was, as the routed records carry it.
    pub(super) attempt: u32,
    /// Where the chunk goes.
    pub(super) route: Route,
}

/// Decides where a chunk that failed with `class` goes. `prior` are the
/// attempts its events had before this call.
pub(super) fn decide(
    class: FailureClass,
    counts_as_attempt: bool,
    prior: impl IntoIterator<Item = u32>,
    max_attempts: u32,
) -> Decision {
    let attempt = prior.into_iter().max().unwrap_or(0).saturating_add(u32::from(counts_as_attempt));
    let route =
        if class == FailureClass::Unrecoverable || attempt >= max_attempts { Route::DeadLetter } else { Route::Retry };
    Decision { attempt, route }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_tries_keep_the_most_attempts_and_the_earliest_first_failure() {
        let tries = |attempts, first_failed_at_ms| Tries { attempts, first_failed_at_ms, ordering: None };
        assert_eq!(Tries::merged([tries(1, 500), tries(3, 900), tries(0, 0)]), tries(3, 500));
        assert_eq!(Tries::merged([tries(0, 0), tries(2, 700)]), tries(2, 700));
        assert_eq!(tries(0, 0).first_failure(true, 42), Some(42));
        assert_eq!(tries(0, 0).first_failure(false, 42), None);
        assert_eq!(tries(2, 7).first_failure(true, 42), Some(7));
    }

    const MAX: u32 = 6;

    #[test]
    fn unrecoverable_is_dead_lettered_at_once() {
        assert_eq!(
            decide(FailureClass::Unrecoverable, true, [0, 0], MAX),
            Decision { attempt: 1, route: Route::DeadLetter }
        );
    }

    #[test]
    fn retryable_failures_are_retried_until_the_last_attempt() {
        for class in [FailureClass::Retryable, FailureClass::Trap, FailureClass::Transient] {
            for prior in 0..MAX - 1 {
                let decision = decide(class, true, [prior], MAX);
                assert_eq!(decision, Decision { attempt: prior + 1, route: Route::Retry }, "{class:?} after {prior}");
            }
            let last = decide(class, true, [MAX - 1], MAX);
            assert_eq!(last, Decision { attempt: MAX, route: Route::DeadLetter }, "{class:?}");
        }
    }

    #[test]
    fn the_chunk_carries_the_most_attempts_of_its_events() {
        assert_eq!(decide(FailureClass::Retryable, true, [0, 4, 2], MAX).attempt, 5);
        assert_eq!(decide(FailureClass::Retryable, true, [1, MAX - 1, 0], MAX).route, Route::DeadLetter);
        assert_eq!(decide(FailureClass::Retryable, true, [], MAX).attempt, 1);
    }

    #[test]
    fn a_failure_that_does_not_count_loses_no_attempt() {
        let decision = decide(FailureClass::Retryable, false, [MAX - 1], MAX);
        assert_eq!(decision, Decision { attempt: MAX - 1, route: Route::Retry });
        // ...but an event already out of attempts is not retried forever.
        assert_eq!(decide(FailureClass::Retryable, false, [MAX], MAX).route, Route::DeadLetter);
    }

    #[test]
    fn attempts_saturate_instead_of_wrapping() {
        let decision = decide(FailureClass::Retryable, true, [u32::MAX], u32::MAX);
        assert_eq!(decision, Decision { attempt: u32::MAX, route: Route::DeadLetter });
    }

    #[test]
    fn one_attempt_allowed_dead_letters_the_first_failure() {
        assert_eq!(decide(FailureClass::Trap, true, [0], 1).route, Route::DeadLetter);
    }
}
