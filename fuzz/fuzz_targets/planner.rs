//! Fuzzes the planner: arbitrary batches of up to 4096 records over a small
//! alphabet (up to 8 keys, up to 32 types so that a segment's type table
//! spills past its linear-scan limit, and the four orderings at a density
//! of fences the input picks).
//!
//! Properties, for every input:
//! - `Plan::new` does not panic, and the plan passes the checker of
//!   `plan::test_support` (every record once, runs of one key and type in
//!   log order, and every order the spec requires kept);
//! - `Plan::rebuild` over a plan that held another batch, larger or smaller,
//!   gives the same plan as `Plan::new`.
//!
//! Input layout: three bytes of shape, then two bytes per record.
//! - byte 0, the alphabet: keys = low 3 bits + 1, types = high 5 bits + 1;
//! - byte 1, the fence level, 0 to 8 (modulo 9): 0 makes every record
//!   Relaxed (long segments, many types in one), 8 draws the four orderings
//!   evenly;
//! - byte 2, where the batch is split for the rebuild check;
//! - per record, byte 0: ordering (bits 0-1: Relaxed, Acquire, Release,
//!   AcqRel), a gate (bits 2-4: the ordering counts only if the gate is
//!   below the fence level, otherwise the record is Relaxed) and the key
//!   (bits 5-7); byte 1: the type.

#![no_main]

use libfuzzer_sys::fuzz_target;
use wakuwaku_core::event::{EventAtomicOrdering, EventTypeTag, KeyHash};
use wakuwaku_core::plan::test_support::check_plan;
use wakuwaku_core::plan::{Plan, PlanRecord};

const MAX_RECORDS: usize = 4096;

/// Key hashes, with the extremes of the range among them.
const KEY_HASHES: [KeyHash; 8] = [0, u64::MAX, 42, 1 << 63, 7, 0x9E37_79B9_7F4A_7C15, 1, u64::MAX - 1];

fuzz_target!(|data: &[u8]| {
    let [alphabet, fences, split, rest @ ..] = data else { return };
    let keys = usize::from(alphabet & 0x07) + 1;
    let tags = u32::from(alphabet >> 3) + 1;
    let fence_level = fences % 9;
    let records: Vec<PlanRecord> = rest
        .chunks_exact(2)
        .take(MAX_RECORDS)
        .map(|pair| {
            let gate = (pair[0] >> 2) & 0x07;
            let ordering = if gate < fence_level {
                EventAtomicOrdering::ALL[usize::from(pair[0] & 0x03)]
            } else {
                EventAtomicOrdering::Relaxed
            };
            PlanRecord {
                key: KEY_HASHES[usize::from(pair[0] >> 5) % keys],
                tag: EventTypeTag::new(u32::from(pair[1]) % tags),
                ordering,
            }
        })
        .collect();

    let plan = Plan::new(&records);
    if let Err(why) = check_plan(&records, &plan) {
        panic!("{why}");
    }
    let expected = format!("{plan:?}");

    // A consumer's plan: rebuilt batch after batch, reusing its buffers.
    let split = records.len() * usize::from(*split) / 255;
    let (front, back) = records.split_at(split);
    let mut reused = Plan::default();
    reused.rebuild(back);
    reused.rebuild(&records);
    assert_eq!(reused.len(), records.len());
    assert_eq!(format!("{reused:?}"), expected, "rebuild after a smaller batch differs from Plan::new");
    reused.rebuild(front);
    let fresh = Plan::new(front);
    assert_eq!(format!("{reused:?}"), format!("{fresh:?}"), "rebuild after a larger batch differs from Plan::new");
});
