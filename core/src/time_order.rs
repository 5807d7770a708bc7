//! Event-time order within a key: the fences that keep a key's timed events
//! of different types in the order the release stage released them, added
//! to the orderings the planner reads ([`crate::plan`], unchanged).
//!
//! The release stage ([`crate::release`]) hands the consumer a key's timed
//! events in event-time order, whatever topic each came from. The planner
//! then keeps only the orders the ordering page requires: events of one
//! type never swap, fences order the rest. Two [`Relaxed`] timed types of
//! one key (orders and shipments of one product) would land in two body
//! runs, one type's events all before the other's. [`TimeOrder`] is what
//! the consumer puts between the two: for each record it gives the
//! ordering the planner plans it with.
//!
//! Rules kept here (`event-time-order` in `wit/handler-0.4.wit`):
//! - **A change of timed type is a fence.** Among one key's records of
//!   [`EventTiming::Timed`] types, in the order they are handed to the
//!   planner, the first record of a type after a record of another such
//!   type is planned as [`AcqRel`]: every earlier record of the key is
//!   applied before it and every later one after it. Consecutive records of
//!   one timed type stay one run (reduced by their algebra, chunked by
//!   `max-batch`), so the handler sees the key's timed events in the order
//!   given, i.e. in event-time order, and batching is lost only where the
//!   type changes.
//! - **Only ever stronger.** A record is planned with its declared ordering
//!   or with [`AcqRel`], which requires every order its declared ordering
//!   does ([`crate::plan::must_precede`]), so no order the ordering page
//!   requires is lost. The declared ordering is what the record keeps
//!   everywhere else (its headers in retry and the dead-letter topic).
//! - **Untimed and opted-out types keep their declared ordering.** A record
//!   of an [`EventTiming::Untimed`] type, or of an
//!   [`EventTiming::TimedRelaxed`] type (the module's opt-out: its events
//!   may move past the key's timed events of other types as their ordering
//!   allows), is planned as declared and does not count as a change of
//!   type for the next timed record.
//! - **Keys are independent.** What one key's records were never fences
//!   another key's.
//! - **One batch at a time.** A batch's first timed record of a key is not
//!   fenced: every earlier batch of its partition was applied before it.
//!
//! [`Relaxed`]: EventAtomicOrdering::Relaxed
//! [`AcqRel`]: EventAtomicOrdering::AcqRel

use std::collections::HashMap;

use crate::event::{EventAtomicOrdering, EventTiming, EventTypeTag, KeyHash};

/// The fences of one batch: for each key, the type of its last record of a
/// [`EventTiming::Timed`] type so far. Reused batch after batch
/// ([`TimeOrder::clear`]).
#[derive(Debug, Default, Clone)]
pub struct TimeOrder {
    last_timed: HashMap<KeyHash, EventTypeTag>,
}

impl TimeOrder {
    /// Forgets every key, keeping the allocation: a new batch starts.
    pub fn clear(&mut self) {
        self.last_timed.clear();
    }

    /// The ordering the planner plans the next record of `key` with: one of
    /// type `tag` whose type declares `timing` and which declares
    /// `ordering`. Records are handed in the order the planner gets them.
    pub fn planned(
        &mut self,
        key: KeyHash,
        tag: EventTypeTag,
        timing: EventTiming,
        ordering: EventAtomicOrdering,
    ) -> EventAtomicOrdering {
        if timing != EventTiming::Timed {
            return ordering;
        }
        match self.last_timed.insert(key, tag) {
            Some(previous) if previous != tag => EventAtomicOrdering::AcqRel,
            _ => ordering,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventAtomicOrdering::{AcqRel, Acquire, Relaxed, Release};
    use crate::plan::test_support::check_plan;
    use crate::plan::{Plan, PlanRecord, Stage, must_precede};

    /// Two timed types (orders, shipments), an untimed one and an opted-out
    /// timed one.
    const ORDER: EventTypeTag = EventTypeTag::new(1);
    const SHIPMENT: EventTypeTag = EventTypeTag::new(2);
    const NOTE: EventTypeTag = EventTypeTag::new(3);
    const AUDIT: EventTypeTag = EventTypeTag::new(4);
    const TAGS: [EventTypeTag; 4] = [ORDER, SHIPMENT, NOTE, AUDIT];
    const ORDERINGS: [EventAtomicOrdering; 4] = [Relaxed, Acquire, Release, AcqRel];

    fn timing(tag: EventTypeTag) -> EventTiming {
        match tag {
            ORDER | SHIPMENT => EventTiming::Timed,
            AUDIT => EventTiming::TimedRelaxed,
            _ => EventTiming::Untimed,
        }
    }

    /// The records as the planner gets them: orderings fenced.
    fn fenced(declared: &[PlanRecord]) -> Vec<PlanRecord> {
        let mut order = TimeOrder::default();
        declared
            .iter()
            .map(|r| PlanRecord { ordering: order.planned(r.key, r.tag, timing(r.tag), r.ordering), ..*r })
            .collect()
    }

    /// Where each record is applied: (segment, stage, run, position).
    fn places(plan: &Plan, len: usize) -> Vec<(usize, u8, usize, usize)> {
        let mut places = vec![(0, 0, 0, 0); len];
        let (mut segment_id, mut run_id) = (0, 0);
        for key in plan.keys() {
            for segment in plan.segments(key) {
                for stage in plan.stages(segment) {
                    let (stage, runs) = match stage {
                        Stage::Head(run) => (0, std::slice::from_ref(run)),
                        Stage::Body(runs) => (1, runs),
                        Stage::Tail(run) => (2, std::slice::from_ref(run)),
                    };
                    for run in runs {
                        for (position, &index) in plan.records(run).iter().enumerate() {
                            places[index] = (segment_id, stage, run_id, position);
                        }
                        run_id += 1;
                    }
                }
                segment_id += 1;
            }
        }
        places
    }

    /// Whether the plan applies the record at `a` before the one at `b`,
    /// whatever order its body runs take.
    fn applied_before(a: (usize, u8, usize, usize), b: (usize, u8, usize, usize)) -> bool {
        a.0 < b.0 || (a.0 == b.0 && (a.1 < b.1 || (a.2 == b.2 && a.3 < b.3)))
    }

    /// Checks one batch: the fenced plan is a valid plan, keeps every order
    /// the declared orderings require, applies the key's records of
    /// `Timed` types in the order given (event-time order), keeps
    /// consecutive records of one timed type in one run, and changes
    /// nothing for a key whose records have at most one `Timed` type.
    fn check(declared: &[PlanRecord]) -> Result<(), String> {
        let planned = fenced(declared);
        let plan = Plan::new(&planned);
        check_plan(&planned, &plan)?;
        let places = places(&plan, declared.len());
        let why = |what: &str| format!("{what}\n  input: {declared:?}\n  planned: {planned:?}\n  plan: {plan:?}");
        for (j, later) in declared.iter().enumerate() {
            for (i, earlier) in declared[..j].iter().enumerate() {
                if must_precede(earlier, later) && !applied_before(places[i], places[j]) {
                    return Err(why(&format!("declared order {i} before {j} lost")));
                }
                let both_timed = timing(earlier.tag) == EventTiming::Timed && timing(later.tag) == EventTiming::Timed;
                if earlier.key == later.key && both_timed && !applied_before(places[i], places[j]) {
                    return Err(why(&format!("timed {i} is not applied before timed {j}")));
                }
            }
        }
        for (index, (record, planned)) in declared.iter().zip(&planned).enumerate() {
            let timed_types = |key| {
                let mut tags: Vec<_> = declared
                    .iter()
                    .filter(|r| r.key == key && timing(r.tag) == EventTiming::Timed)
                    .map(|r| r.tag)
                    .collect();
                tags.dedup();
                tags.sort();
                tags.dedup();
                tags.len()
            };
            if planned.ordering != record.ordering && timed_types(record.key) < 2 {
                return Err(why(&format!("record {index} fenced, though its key has one timed type")));
            }
            if planned.ordering != record.ordering && planned.ordering != AcqRel {
                return Err(why(&format!("record {index} planned weaker than AcqRel")));
            }
            if planned.ordering != record.ordering && timing(record.tag) != EventTiming::Timed {
                return Err(why(&format!("record {index} fenced, though its type is not timed")));
            }
        }
        Ok(())
    }

    /// Every batch of `len` records over `keys` keys, all four types and
    /// all four orderings.
    fn every_batch(len: usize, keys: u64, each: &mut impl FnMut(&[PlanRecord])) {
        let symbols: Vec<PlanRecord> = (0..keys)
            .flat_map(|key| {
                TAGS.iter()
                    .flat_map(move |&tag| ORDERINGS.iter().map(move |&ordering| PlanRecord { key, tag, ordering }))
            })
            .collect();
        let mut batch = vec![symbols[0]; len];
        let mut digits = vec![0usize; len];
        loop {
            for (slot, &digit) in batch.iter_mut().zip(&digits) {
                *slot = symbols[digit];
            }
            each(&batch);
            let Some(position) = digits.iter().rposition(|&digit| digit + 1 < symbols.len()) else { return };
            digits[position] += 1;
            digits[position + 1..].fill(0);
        }
    }

    #[test]
    fn every_small_batch_keeps_declared_orders_and_applies_timed_events_in_the_order_given() {
        let mut checked = 0;
        let mut run = |len, keys| {
            every_batch(len, keys, &mut |batch| {
                check(batch).unwrap_or_else(|why| panic!("{why}"));
                checked += 1;
            })
        };
        // One key: every sequence up to 5 records; two keys: up to 3.
        for len in 0..=5 {
            run(len, 1);
        }
        for len in 1..=3 {
            run(len, 2);
        }
        assert_eq!(
            checked,
            (0..=5).map(|n| 16usize.pow(n)).sum::<usize>() + (1..=3).map(|n| 32usize.pow(n)).sum::<usize>()
        );
    }

    /// The README's example: orders and shipments of one product, both
    /// relaxed and timed, released in event-time order.
    #[test]
    fn orders_and_shipments_of_one_product_reach_the_handler_in_event_time_order() {
        let record = |tag| PlanRecord { key: 7, tag, ordering: Relaxed };
        let batch = [record(ORDER), record(SHIPMENT), record(ORDER), record(ORDER), record(SHIPMENT)];
        let plan = Plan::new(&fenced(&batch));
        let [key] = plan.keys() else { panic!("one key") };
        let runs: Vec<&[usize]> = plan
            .segments(key)
            .iter()
            .flat_map(|segment| plan.stages(segment).collect::<Vec<_>>())
            .flat_map(|stage| match stage {
                Stage::Head(run) | Stage::Tail(run) => vec![plan.records(run)],
                Stage::Body(runs) => runs.iter().map(|run| plan.records(run)).collect(),
            })
            .collect();
        // The two orders in a row stay one run.
        assert_eq!(runs, [&[0][..], &[1], &[2, 3], &[4]]);
    }

    /// Declared `timed-relaxed`, the same types keep their per-type runs.
    #[test]
    fn an_opted_out_type_moves_past_the_other_timed_types_as_its_ordering_allows() {
        let mut order = TimeOrder::default();
        let planned: Vec<_> =
            [ORDER, AUDIT, ORDER, AUDIT].iter().map(|&tag| order.planned(7, tag, timing(tag), Relaxed)).collect();
        assert_eq!(planned, [Relaxed; 4]);
        let planned = [SHIPMENT, ORDER].map(|tag| order.planned(7, tag, EventTiming::TimedRelaxed, Relaxed));
        assert_eq!(planned, [Relaxed; 2], "an opted-out type is no change of timed type");
        // Another key's orders fence nothing of key 7.
        assert_eq!(order.planned(8, SHIPMENT, EventTiming::Timed, Relaxed), Relaxed);
        assert_eq!(order.planned(7, ORDER, EventTiming::Timed, Release), Release);
        order.clear();
        assert_eq!(order.planned(7, SHIPMENT, EventTiming::Timed, Relaxed), Relaxed, "a new batch");
    }
}
