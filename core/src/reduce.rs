//! Reduction: what the host may do to a run before handing it to a handler,
//! given the algebra its event type declares.
//!
//! A run is every event of one type and one key in one segment, in log
//! order (see [`crate::plan`]). Reduction never mixes runs, so it cannot
//! break an order the planner kept.
//!
//! | algebra | what happens to the run |
//! | --- | --- |
//! | non-associative | nothing |
//! | commutative | nothing (the order inside the run may relax, but delivering it in log order is always allowed) |
//! | idempotent | adjacent duplicates (equal body bytes) are dropped |
//! | idempotent-commutative | sorted by body bytes, every duplicate dropped |
//! | associative | folded into one body by the module's `combine` |
//!
//! After reduction a run is cut into chunks of at most `max-batch` events
//! ([`chunks`]); each chunk is one handler call.
//!
//! The functions here are pure: bodies in, bodies out; the module's
//! `combine` comes in as a closure.

use crate::event::Algebra;

/// Reduces a run's bodies according to `algebra`.
///
/// `combine` is called at most once, and only for an associative run of at
/// least two events; its error is returned as is.
pub fn reduce<E>(
    algebra: Algebra,
    mut bodies: Vec<Vec<u8>>,
    combine: impl FnOnce(&[Vec<u8>]) -> Result<Vec<u8>, E>,
) -> Result<Vec<Vec<u8>>, E> {
    match algebra {
        Algebra::NonAssociative | Algebra::Commutative => {}
        Algebra::Idempotent => bodies.dedup(),
        Algebra::IdempotentCommutative => {
            bodies.sort_unstable();
            bodies.dedup();
        }
        Algebra::Associative if bodies.len() >= 2 => bodies = vec![combine(&bodies)?],
        Algebra::Associative => {}
    }
    Ok(bodies)
}

/// Cuts reduced bodies into handler calls of at most `max_batch` events.
/// A `max_batch` of 0 is treated as 1.
pub fn chunks(bodies: &[Vec<u8>], max_batch: u32) -> impl Iterator<Item = &[Vec<u8>]> {
    bodies.chunks(usize::try_from(max_batch).unwrap_or(usize::MAX).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bodies(items: &[&str]) -> Vec<Vec<u8>> {
        items.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    fn no_combine(_: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        Err("combine must not be called".into())
    }

    #[test]
    fn non_associative_and_commutative_keep_everything_in_order() {
        for algebra in [Algebra::NonAssociative, Algebra::Commutative] {
            let run = bodies(&["b", "a", "a", "c"]);
            assert_eq!(reduce(algebra, run.clone(), no_combine), Ok(run));
        }
    }

    #[test]
    fn idempotent_drops_adjacent_duplicates_only() {
        let reduced = reduce(Algebra::Idempotent, bodies(&["a", "a", "b", "a", "a"]), no_combine);
        assert_eq!(reduced, Ok(bodies(&["a", "b", "a"])));
    }

    #[test]
    fn idempotent_commutative_sorts_and_drops_all_duplicates() {
        let reduced = reduce(Algebra::IdempotentCommutative, bodies(&["c", "a", "c", "b", "a"]), no_combine);
        assert_eq!(reduced, Ok(bodies(&["a", "b", "c"])));
    }

    #[test]
    fn associative_folds_the_whole_run_with_one_call() {
        let mut calls = 0;
        let reduced = reduce(Algebra::Associative, bodies(&["1", "2", "3"]), |run: &[Vec<u8>]| {
            calls += 1;
            let sum: u32 = run.iter().map(|b| std::str::from_utf8(b).unwrap().parse::<u32>().unwrap()).sum();
            Ok::<_, String>(sum.to_string().into_bytes())
        });
        assert_eq!(reduced, Ok(bodies(&["6"])));
        assert_eq!(calls, 1);
    }

    #[test]
    fn associative_single_event_is_not_combined() {
        assert_eq!(reduce(Algebra::Associative, bodies(&["x"]), no_combine), Ok(bodies(&["x"])));
        assert_eq!(reduce(Algebra::Associative, Vec::new(), no_combine), Ok(Vec::new()));
    }

    #[test]
    fn combine_errors_are_returned() {
        let reduced = reduce(Algebra::Associative, bodies(&["a", "b"]), |_: &[Vec<u8>]| Err("bad".to_owned()));
        assert_eq!(reduced, Err("bad".to_owned()));
    }

    #[test]
    fn chunks_respect_max_batch() {
        let run = bodies(&["a", "b", "c", "d", "e"]);
        let sizes: Vec<usize> = chunks(&run, 2).map(<[_]>::len).collect();
        assert_eq!(sizes, [2, 2, 1]);
        assert_eq!(chunks(&run, 0).count(), 5);
        assert_eq!(chunks(&run, u32::MAX).count(), 1);
    }
}
