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
//! `combine` comes in as a closure. A run may come borrowed (the consumer
//! lends each run from one vector of its batch's bodies): what reduction
//! leaves as it is stays borrowed, and only what it changes is copied.

use std::borrow::Cow;

use crate::event::Algebra;

/// What one body of a run stands for: the topic and log offset of the
/// first event in it and how many events it carries. A body read from the
/// log stands for itself (`events: 1`); a folded body for every event
/// folded into it.
///
/// Reduction keeps origins so that work handed on after a failure (to the
/// retry or dead-letter topic) still says where it came from and how many
/// events it accounts for. A run of a projection over several topics may
/// hold events of each: a body standing for several names the one with the
/// lowest topic index and, in that topic, the lowest offset, so it always
/// names an event it stands for (in a projection of one topic, the
/// earliest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Origin {
    /// The index of the topic the event was read from, among the
    /// projection's topics (0 for a projection of one topic).
    pub topic: u32,
    /// Offset of the earliest event, in that topic.
    pub offset: u64,
    /// Events it accounts for (at least 1).
    pub events: u64,
}

impl Origin {
    /// One event at `offset` of the first (or only) topic.
    pub const fn single(offset: u64) -> Self {
        Self::in_topic(0, offset)
    }

    /// One event at `offset` of the topic of index `topic`.
    pub const fn in_topic(topic: u32, offset: u64) -> Self {
        Self { topic, offset, events: 1 }
    }

    /// Folds `other` into `self`: the earlier place (topic, then offset),
    /// the events of both.
    fn absorb(&mut self, other: Origin) {
        (self.topic, self.offset) = (self.topic, self.offset).min((other.topic, other.offset));
        self.events += other.events;
    }
}

/// A run's bodies with the [`Origin`] of each, index for index, owned or
/// borrowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Traced<'a> {
    /// The bodies.
    pub bodies: Cow<'a, [Vec<u8>]>,
    /// Where each body came from.
    pub origins: Cow<'a, [Origin]>,
}

/// Reduces a run's bodies according to `algebra`.
///
/// `combine` is called at most once, and only for an associative run of at
/// least two events; its error is returned as is.
pub fn reduce<E>(
    algebra: Algebra,
    bodies: Vec<Vec<u8>>,
    combine: impl FnOnce(&[Vec<u8>]) -> Result<Vec<u8>, E>,
) -> Result<Vec<Vec<u8>>, E> {
    let origins: Vec<Origin> = (0..bodies.len() as u64).map(Origin::single).collect();
    let run = Traced { bodies: bodies.into(), origins: origins.into() };
    reduce_traced(algebra, run, combine).map(|run| run.bodies.into_owned()).map_err(|(error, _)| error)
}

/// Whether [`reduce_traced`] may change a run of `len` bodies of
/// `algebra`: only a run of two or more that drops duplicates or folds.
/// Every other run comes back as it came.
pub fn may_change(algebra: Algebra, len: usize) -> bool {
    len >= 2 && !matches!(algebra, Algebra::NonAssociative | Algebra::Commutative)
}

/// [`reduce`], keeping track of what each reduced body stands for: a
/// dropped duplicate is counted in the body that stays, a fold carries the
/// events of the whole run. When `combine` fails, its error comes back with
/// the run untouched, so the caller can route the run elsewhere.
///
/// A run that reduction leaves as it is comes back as it came (borrowed
/// stays borrowed); bodies it keeps from a borrowed run are copied.
///
/// # Panics
/// If `run.bodies` and `run.origins` differ in length.
pub fn reduce_traced<'a, E>(
    algebra: Algebra,
    run: Traced<'a>,
    combine: impl FnOnce(&[Vec<u8>]) -> Result<Vec<u8>, E>,
) -> Result<Traced<'a>, (E, Traced<'a>)> {
    assert_eq!(run.bodies.len(), run.origins.len(), "one origin per body");
    if !may_change(algebra, run.bodies.len()) {
        return Ok(run);
    }
    Ok(match algebra {
        Algebra::NonAssociative | Algebra::Commutative => run,
        Algebra::Idempotent if !run.bodies.windows(2).any(|pair| pair[0] == pair[1]) => run,
        Algebra::Idempotent => {
            let order: Vec<usize> = (0..run.bodies.len()).collect();
            dedup(run, &order)
        }
        Algebra::IdempotentCommutative => {
            let mut order: Vec<usize> = (0..run.bodies.len()).collect();
            order.sort_unstable_by(|&a, &b| run.bodies[a].cmp(&run.bodies[b]));
            dedup(run, &order)
        }
        Algebra::Associative => match combine(&run.bodies) {
            Ok(folded) => {
                let mut origin = run.origins[0];
                run.origins[1..].iter().for_each(|&o| origin.absorb(o));
                Traced { bodies: vec![folded].into(), origins: vec![origin].into() }
            }
            Err(error) => return Err((error, run)),
        },
    })
}

/// The run's bodies taken in `order`, adjacent equal ones dropped and each
/// counted in the one that stays.
fn dedup<'a>(run: Traced<'a>, order: &[usize]) -> Traced<'a> {
    let Traced { mut bodies, origins } = run;
    let mut kept: Vec<Vec<u8>> = Vec::new();
    let mut kept_origins: Vec<Origin> = Vec::new();
    for &index in order {
        let origin = origins[index];
        match (kept.last(), kept_origins.last_mut()) {
            (Some(last), Some(counted)) if *last == bodies[index] => counted.absorb(origin),
            _ => {
                // Moved out of an owned run, copied out of a borrowed one.
                kept.push(match &mut bodies {
                    Cow::Owned(owned) => std::mem::take(&mut owned[index]),
                    Cow::Borrowed(borrowed) => borrowed[index].clone(),
                });
                kept_origins.push(origin);
            }
        }
    }
    Traced { bodies: kept.into(), origins: kept_origins.into() }
}

/// Folds `bodies` (at least two) into one with `combine`, giving each call
/// at most `max_bytes` of bodies (but always at least two, so every call
/// makes progress): consecutive parts are folded, then their results, in
/// order, until one body is left. By associativity that is the fold of
/// the whole run; it keeps one call's input within what a module's memory
/// holds, however long the run.
pub fn fold_in_parts<E>(
    bodies: &[Vec<u8>],
    max_bytes: usize,
    mut combine: impl FnMut(&[Vec<u8>]) -> Result<Vec<u8>, E>,
) -> Result<Vec<u8>, E> {
    let mut level = fold_level(bodies, max_bytes, &mut combine)?;
    while level.len() > 1 {
        level = fold_level(&level, max_bytes, &mut combine)?;
    }
    Ok(level.pop().unwrap_or_default())
}

/// One level of [`fold_in_parts`]: each part folded into one body.
fn fold_level<E>(
    bodies: &[Vec<u8>],
    max_bytes: usize,
    combine: &mut impl FnMut(&[Vec<u8>]) -> Result<Vec<u8>, E>,
) -> Result<Vec<Vec<u8>>, E> {
    let mut folded = Vec::new();
    let mut rest = bodies;
    while !rest.is_empty() {
        let mut bytes = 0;
        let fits = rest
            .iter()
            .take_while(|body| {
                bytes += body.len();
                bytes <= max_bytes
            })
            .count();
        let (part, after) = rest.split_at(fits.max(2).min(rest.len()));
        folded.push(match part {
            [single] => single.clone(),
            _ => combine(part)?,
        });
        rest = after;
    }
    Ok(folded)
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

    #[test]
    fn folding_in_parts_equals_the_whole_fold_and_bounds_each_call() {
        let run: Vec<Vec<u8>> = (0..50u8).map(|i| vec![b'a' + i % 26; usize::from(i % 7) + 1]).collect();
        let whole: Vec<u8> = run.concat();
        for max_bytes in [0, 1, 5, 8, 30, 1000] {
            let mut calls = 0;
            let folded = fold_in_parts(&run, max_bytes, |part| {
                calls += 1;
                let bytes: usize = part.iter().map(Vec::len).sum();
                assert!(part.len() >= 2, "a call folds at least two bodies");
                assert!(part.len() == 2 || bytes <= max_bytes, "{bytes} bytes over {max_bytes}");
                Ok::<_, String>(part.concat())
            });
            assert_eq!(folded, Ok(whole.clone()), "max {max_bytes}");
            assert!(calls < run.len(), "max {max_bytes}: {calls} calls, each folds away one body or more");
        }
        assert_eq!(fold_in_parts(&run, 1000, |_| Err("no")), Err("no"));
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
    fn origins_count_every_event_once_for_owned_and_borrowed_runs() {
        let origins = |pairs: &[(u64, u64)]| -> Vec<Origin> {
            pairs.iter().map(|&(offset, events)| Origin { topic: 0, offset, events }).collect()
        };
        let singles = |offsets: &[u64]| -> Vec<Origin> { offsets.iter().map(|&o| Origin::single(o)).collect() };
        let cases = [
            (Algebra::Idempotent, bodies(&["a", "a", "b", "a"]), singles(&[10, 11, 12, 13])),
            (Algebra::IdempotentCommutative, bodies(&["c", "a", "c", "a", "b"]), singles(&[5, 6, 7, 8, 9])),
        ];
        let expected = [
            (bodies(&["a", "b", "a"]), origins(&[(10, 2), (12, 1), (13, 1)])),
            (bodies(&["a", "b", "c"]), origins(&[(6, 2), (9, 1), (5, 2)])),
        ];
        for ((algebra, run, offsets), (want_bodies, want_origins)) in cases.iter().zip(&expected) {
            let owned = Traced { bodies: run.clone().into(), origins: offsets.clone().into() };
            let borrowed = Traced { bodies: run[..].into(), origins: offsets[..].into() };
            for traced in [owned, borrowed] {
                let reduced = reduce_traced(*algebra, traced, no_combine).unwrap();
                assert_eq!(reduced.bodies, *want_bodies, "{algebra}");
                assert_eq!(reduced.origins, *want_origins, "{algebra}");
            }
        }

        let weighted = Traced { bodies: bodies(&["1", "2"]).into(), origins: origins(&[(40, 3), (7, 2)]).into() };
        let folded =
            reduce_traced(Algebra::Associative, weighted.clone(), |_: &[Vec<u8>]| Ok::<_, String>(b"3".to_vec()));
        assert_eq!(folded.unwrap().origins, origins(&[(7, 5)]));
        let failed = reduce_traced(Algebra::Associative, weighted.clone(), |_: &[Vec<u8>]| Err("no".to_owned()));
        assert_eq!(failed, Err(("no".to_owned(), weighted)), "a failed fold gives the run back");
    }

    #[test]
    fn a_body_standing_for_events_of_several_topics_names_one_of_them() {
        let fold = |origins: &[Origin]| {
            let run = Traced { bodies: bodies(&["1", "1", "1"]).into(), origins: origins.to_vec().into() };
            reduce_traced(Algebra::Associative, run, |_: &[Vec<u8>]| Ok::<_, String>(b"3".to_vec())).unwrap().origins
        };
        let origins = [Origin::in_topic(2, 4), Origin::in_topic(1, 90), Origin::in_topic(1, 7)];
        assert_eq!(fold(&origins)[..], [Origin { topic: 1, offset: 7, events: 3 }]);
        let run = Traced { bodies: bodies(&["a", "a"]).into(), origins: origins[..2].to_vec().into() };
        let deduped = reduce_traced(Algebra::Idempotent, run, no_combine).unwrap();
        assert_eq!(deduped.origins[..], [Origin { topic: 1, offset: 90, events: 2 }]);
    }

    #[test]
    fn a_borrowed_run_that_reduction_leaves_alone_stays_borrowed() {
        let run = bodies(&["a", "b", "a"]);
        let offsets: Vec<Origin> = (0..3).map(Origin::single).collect();
        for algebra in [Algebra::NonAssociative, Algebra::Commutative, Algebra::Idempotent] {
            let borrowed = Traced { bodies: run[..].into(), origins: offsets[..].into() };
            let reduced = reduce_traced(algebra, borrowed, no_combine).unwrap();
            assert!(matches!(reduced.bodies, Cow::Borrowed(_)), "{algebra}");
            assert_eq!(reduced.bodies, run, "{algebra}");
        }
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
