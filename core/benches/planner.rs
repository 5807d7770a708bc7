//! Planner throughput: one batch of 1 M records over 10 k keys and 4 event
//! types, with some fences (about 2% Acquire, 2% Release, 0.5% AcqRel).
//!
//! `cargo bench -p wakuwaku-core --bench planner` reports records per second.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use wakuwaku_core::event::{EventAtomicOrdering, EventTypeTag, KeyHash};
use wakuwaku_core::plan::{Plan, PlanRecord};

const RECORDS: usize = 1_000_000;
const KEYS: u64 = 10_000;
const TAGS: u64 = 4;

/// SplitMix64: a deterministic, well-spread sequence without a dependency.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The benchmark batch: random keys (hashed, as on the wire), types and
/// fences, the same on every run.
fn batch() -> Vec<PlanRecord> {
    let mut state = 0x5EED;
    (0..RECORDS)
        .map(|_| {
            let random = splitmix(&mut state);
            let mut key = random % KEYS;
            let key: KeyHash = splitmix(&mut key);
            let tag = EventTypeTag::new(((random >> 32) % TAGS) as u32);
            let ordering = match (random >> 40) % 1000 {
                0..20 => EventAtomicOrdering::Acquire,
                20..40 => EventAtomicOrdering::Release,
                40..45 => EventAtomicOrdering::AcqRel,
                _ => EventAtomicOrdering::Relaxed,
            };
            PlanRecord { key, tag, ordering }
        })
        .collect()
}

fn planner(c: &mut Criterion) {
    let records = batch();
    let mut group = c.benchmark_group("planner");
    group.throughput(Throughput::Elements(records.len() as u64));
    group.sample_size(20);
    group.bench_function("new: 1M records, 10k keys, 4 types", |b| b.iter(|| Plan::new(black_box(&records))));
    group.bench_function("rebuild: 1M records, 10k keys, 4 types", |b| {
        let mut plan = Plan::default();
        b.iter(|| {
            plan.rebuild(black_box(&records));
            black_box(plan.len())
        })
    });
    group.finish();
}

criterion_group!(benches, planner);
criterion_main!(benches);
