//! The test suite every state backend passes: each test is a function over
//! a [`Fixture`] that opens (and reopens) one store, and [`state_suite!`]
//! turns the list into `#[test]`s inside a backend's test module.

use super::*;
use crate::event::Header;
use crate::storage::stats::Stat;
use wakuwaku_core::timers::Timer;

/// Opens a backend's store; a second call opens the same store again (the
/// caller drops the first one before, as a restarting host does).
pub(super) trait Fixture {
    /// The store.
    fn open(&self) -> StateStore;

    /// Whether two open stores fence each other ([`StateBackend::claim`]).
    fn fences(&self) -> bool;
}

/// One `#[test]` per suite function, over the fixture `$fixture` (an
/// expression of type `Option<impl Fixture>`; `None` skips).
macro_rules! state_suite {
    ($fixture:expr) => {
        $crate::storage::state::suite::state_suite!(@tests $fixture; commit_then_read_back, a_commit_survives_reopen_and_counters_pass_the_i64_range, keys_are_their_bytes_and_are_listed_in_byte_order, delete_removes_an_entry_and_an_empty_key, counters_add_across_commits_and_stats_saturate, outbox_sequence_numbers_keep_increasing, a_reader_sees_its_snapshot_only, meta_round_trips, done_offsets_are_dropped_once_the_position_passes_them, a_claim_fences_the_previous_owner, positions_done_marks_and_host_values_are_listed, starting_over_clears_all_but_host_values_in_one_commit, a_run_and_a_reset_exclude_each_other, snapshots_count_what_the_quotas_need_up_to_a_bound, counters_and_entries_are_read_in_pages, positions_under_any_name_round_trip_and_a_later_commit_leaves_the_others, timers_are_committed_with_the_batch_and_found_by_time, timers_are_cleared_by_starting_over);
    };
    (@tests $fixture:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                if let Some(fixture) = $fixture {
                    $crate::storage::state::suite::$name(&fixture);
                }
            }
        )*
    };
}
pub(super) use state_suite;

fn k(n: u64) -> Key {
    Key::int(n)
}

fn writes(pairs: &[(&str, Option<&str>)]) -> KeyWrites {
    let mut w = KeyWrites::default();
    for (name, value) in pairs {
        match value {
            Some(v) => w.set(name, v.as_bytes().to_vec()),
            None => w.delete(name),
        }
    }
    w
}

fn entry(topic: &str, n: u8) -> OutboxEntry {
    OutboxEntry {
        topic: topic.into(),
        partition_key: u64::from(n),
        partition: None,
        record: Record { headers: vec![Header { name: "h".into(), value: vec![n] }], body: vec![n; 3] },
        origin: (n % 2 == 1).then(|| EmitOrigin {
            partition: 1,
            offset: u64::from(n) * 10,
            module: "m".into(),
            version: "v".into(),
            topic: Some("t".into()),
        }),
    }
}

fn bytes(s: &str) -> Option<Vec<u8>> {
    Some(s.as_bytes().to_vec())
}

pub(super) fn commit_then_read_back(fixture: &dyn Fixture) {
    let store = fixture.open();
    assert_eq!(store.keys().unwrap(), Vec::<Key>::new());
    let commit = BatchCommit {
        writes: vec![
            (k(7), writes(&[("balance", Some("10")), ("owner", Some("ann"))])),
            (k(u64::MAX), writes(&[("x", Some("max"))])),
            (k(0), writes(&[("x", Some("zero"))])),
        ],
        positions: vec![("accounts".into(), 2, 100)],
        ..BatchCommit::default()
    };
    store.commit(commit).unwrap();
    assert_eq!(store.keys().unwrap(), vec![k(0), k(7), k(u64::MAX)]);
    assert_eq!(store.get(&k(7), "balance").unwrap(), bytes("10"));
    assert_eq!(store.get(&k(7), "missing").unwrap(), None);
    assert_eq!(store.get(&k(8), "balance").unwrap(), None);
    assert_eq!(
        store.entries(&k(7)).unwrap(),
        vec![("balance".to_owned(), b"10".to_vec()), ("owner".to_owned(), b"ann".to_vec())]
    );
    assert_eq!(store.entries(&k(u64::MAX)).unwrap(), vec![("x".to_owned(), b"max".to_vec())]);
    assert_eq!(store.entries(&k(3)).unwrap(), vec![]);
    assert_eq!(store.position("accounts", 2).unwrap(), Some(100));
    assert_eq!(store.position("accounts", 1).unwrap(), None);
    let reader = store.reader().unwrap();
    assert_eq!(reader.get(&k(0), "x").unwrap(), bytes("zero"));
    assert_eq!(reader.counter("nothing").unwrap(), 0);
}

pub(super) fn a_commit_survives_reopen_and_counters_pass_the_i64_range(fixture: &dyn Fixture) {
    {
        let store = fixture.open();
        store
            .commit(BatchCommit {
                writes: vec![(k(1), writes(&[("a", Some("1"))]))],
                counter_deltas: [("total".to_owned(), i128::from(i64::MAX) - 1)].into_iter().collect(),
                positions: vec![("t".into(), 0, 5)],
                outbox: vec![entry("out", 1)],
                ..BatchCommit::default()
            })
            .unwrap();
        // Several keys' deltas may sum past i64 in one batch (each was
        // checked on its own): the commit still lands, nothing wraps.
        store
            .commit(BatchCommit {
                counter_deltas: [("total".to_owned(), 2)].into_iter().collect(),
                ..BatchCommit::default()
            })
            .unwrap();
    }
    let store = fixture.open();
    assert_eq!(store.entries(&k(1)).unwrap(), vec![("a".to_owned(), b"1".to_vec())]);
    assert_eq!(store.position("t", 0).unwrap(), Some(5));
    assert_eq!(store.counters().unwrap(), vec![("total".to_owned(), i128::from(i64::MAX) + 1)]);
    assert_eq!(store.outbox().unwrap(), vec![(0, entry("out", 1))]);
}

pub(super) fn keys_are_their_bytes_and_are_listed_in_byte_order(fixture: &dyn Fixture) {
    let store = fixture.open();
    let text = |t: &str| Key::parse_text(t).unwrap();
    let keys = [text(r#""b""#), text(r#""a""#), text(r#"["a", 1]"#), text(r#""ab""#), k(3)];
    let commit = BatchCommit {
        writes: keys.iter().map(|key| (key.clone(), writes(&[("v", Some(&key.to_string()))]))).collect(),
        ..BatchCommit::default()
    };
    store.commit(commit).unwrap();
    let mut sorted = keys.to_vec();
    sorted.sort();
    assert_eq!(store.keys().unwrap(), sorted);
    for key in &keys {
        assert_eq!(store.entries(key).unwrap(), vec![("v".to_owned(), key.to_string().into_bytes())]);
    }
}

pub(super) fn delete_removes_an_entry_and_an_empty_key(fixture: &dyn Fixture) {
    let store = fixture.open();
    store
        .commit(BatchCommit {
            writes: vec![(k(1), writes(&[("a", Some("1")), ("b", Some("2"))]))],
            ..Default::default()
        })
        .unwrap();
    store
        .commit(BatchCommit { writes: vec![(k(1), writes(&[("a", None), ("zz", None)]))], ..Default::default() })
        .unwrap();
    assert_eq!(store.get(&k(1), "a").unwrap(), None);
    assert_eq!(store.entries(&k(1)).unwrap(), vec![("b".to_owned(), b"2".to_vec())]);
    store.commit(BatchCommit { writes: vec![(k(1), writes(&[("b", None)]))], ..Default::default() }).unwrap();
    assert_eq!(store.keys().unwrap(), Vec::<Key>::new());
}

pub(super) fn counters_add_across_commits_and_stats_saturate(fixture: &dyn Fixture) {
    let store = fixture.open();
    for (delta, stat) in [(5, 1), (-8, 2), (10, u64::MAX)] {
        // `from_a_newer_host`: a count this host has no `Stat` for.
        let mut stat_deltas: Stats = [(Stat::Applied, stat)].into_iter().collect();
        stat_deltas.add_named("from_a_newer_host", 1);
        store
            .commit(BatchCommit {
                counter_deltas: [("c".to_owned(), delta), ("d".to_owned(), 1)].into_iter().collect(),
                stat_deltas,
                ..Default::default()
            })
            .unwrap();
    }
    assert_eq!(store.counters().unwrap(), vec![("c".to_owned(), 7), ("d".to_owned(), 3)]);
    assert_eq!(store.reader().unwrap().counter("c").unwrap(), 7);
    let stats = store.stats().unwrap();
    assert_eq!(stats.named().collect::<Vec<_>>(), vec![("applied", u64::MAX), ("from_a_newer_host", 3)]);
    assert_eq!(stats[Stat::Applied], u64::MAX);
}

pub(super) fn outbox_sequence_numbers_keep_increasing(fixture: &dyn Fixture) {
    let store = fixture.open();
    store.commit(BatchCommit { outbox: vec![entry("a", 0), entry("b", 1)], ..Default::default() }).unwrap();
    store.commit(BatchCommit { outbox: vec![entry("a", 2)], ..Default::default() }).unwrap();
    assert_eq!(store.outbox().unwrap(), vec![(0, entry("a", 0)), (1, entry("b", 1)), (2, entry("a", 2))]);
    // Each entry is its source partition's (odd ones come from 1).
    assert_eq!(store.outbox_of(0).unwrap(), vec![(0, entry("a", 0)), (2, entry("a", 2))]);
    assert_eq!(store.outbox_of(1).unwrap(), vec![(1, entry("b", 1))]);
    store.remove_outbox(0, 1).unwrap();
    assert_eq!(store.outbox().unwrap(), vec![(1, entry("b", 1)), (2, entry("a", 2))]);
    store.remove_outbox(0, 2).unwrap();
    assert_eq!(store.outbox().unwrap(), vec![(1, entry("b", 1))]);
    store.remove_outbox(1, 2).unwrap();
    assert_eq!(store.outbox().unwrap(), vec![]);
    drop(store);
    let store = fixture.open();
    store.commit(BatchCommit { outbox: vec![entry("c", 3)], ..Default::default() }).unwrap();
    assert_eq!(store.outbox().unwrap(), vec![(3, entry("c", 3))]);
    store.remove_outbox(1, 0).unwrap();
    store.remove_outbox(0, 3).unwrap();
    assert_eq!(store.outbox().unwrap().len(), 1);
    // Settling replaces: partition 1's entries up to 3 go, the new one gets 5.
    store.commit(BatchCommit { outbox: vec![entry("d", 4)], ..Default::default() }).unwrap();
    let settle = BatchCommit { outbox: vec![entry("dlq", 5)], outbox_through: Some((1, 3)), ..Default::default() };
    store.commit(settle).unwrap();
    assert_eq!(store.outbox().unwrap(), vec![(4, entry("d", 4)), (5, entry("dlq", 5))]);
}

pub(super) fn a_reader_sees_its_snapshot_only(fixture: &dyn Fixture) {
    let store = fixture.open();
    store
        .commit(BatchCommit {
            writes: vec![(k(1), writes(&[("a", Some("old"))]))],
            counter_deltas: [("c".to_owned(), 1)].into_iter().collect(),
            ..Default::default()
        })
        .unwrap();
    let before = store.reader().unwrap();
    store
        .commit(BatchCommit {
            writes: vec![(k(1), writes(&[("a", Some("new")), ("b", Some("new"))]))],
            counter_deltas: [("c".to_owned(), 10)].into_iter().collect(),
            ..Default::default()
        })
        .unwrap();
    // Shared by reference across threads, as the workers of a batch do.
    std::thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(before.get(&k(1), "a").unwrap(), bytes("old"));
            assert_eq!(before.get(&k(1), "b").unwrap(), None);
            assert_eq!(before.counter("c").unwrap(), 1);
        });
    });
    let after = store.reader().unwrap();
    assert_eq!(after.get(&k(1), "a").unwrap(), bytes("new"));
    assert_eq!(after.counter("c").unwrap(), 11);
}

pub(super) fn meta_round_trips(fixture: &dyn Fixture) {
    let store = fixture.open();
    assert_eq!(store.meta("module/bank").unwrap(), None);
    store.set_meta("module/bank", b"v1").unwrap();
    store.set_meta("module/bank", b"v2").unwrap();
    assert_eq!(store.meta("module/bank").unwrap(), Some(b"v2".to_vec()));
}

pub(super) fn done_offsets_are_dropped_once_the_position_passes_them(fixture: &dyn Fixture) {
    let store = fixture.open();
    let done = |offsets: &[u64]| offsets.iter().map(|&o| ("retry_t".to_owned(), 1, o)).collect();
    store.commit(BatchCommit { done: done(&[4, 7, 9]), ..BatchCommit::default() }).unwrap();
    store.commit(BatchCommit { done: done(&[3]), ..BatchCommit::default() }).unwrap();
    assert_eq!(store.done("retry_t", 1).unwrap(), [3, 4, 7, 9]);
    assert!(store.done("retry_t", 0).unwrap().is_empty());
    // Position 8 in the same commit as a new done offset: below 8 goes.
    let commit = BatchCommit { done: done(&[12]), positions: vec![("retry_t".into(), 1, 8)], ..BatchCommit::default() };
    store.commit(commit).unwrap();
    assert_eq!(store.done("retry_t", 1).unwrap(), [9, 12]);
}

pub(super) fn a_claim_fences_the_previous_owner(fixture: &dyn Fixture) {
    if !fixture.fences() {
        // One process holds the store: a claim has nothing to bump.
        assert_eq!(fixture.open().claim(3).unwrap(), 0);
        return;
    }
    let old = fixture.open();
    let new = fixture.open();
    let batch = |next: u64, value: &str| BatchCommit {
        writes: vec![(k(1), writes(&[("v", Some(value))]))],
        counter_deltas: [("c".to_owned(), 1)].into_iter().collect(),
        positions: vec![("t".into(), 3, next), ("retry_t".into(), 3, next)],
        outbox: vec![entry("out", 1)],
        ..BatchCommit::default()
    };
    let first = old.claim(3).unwrap();
    old.commit(batch(10, "old")).unwrap();
    let second = new.claim(3).unwrap();
    assert!(second > first, "a claim bumps the epoch: {first} then {second}");
    // The old owner's commit is refused whole: nothing of it lands.
    let refused = old.commit(batch(20, "stale")).unwrap_err();
    assert!(
        matches!(refused, StateError::Fenced { partition: 3, held, current } if held == first && current == second),
        "{refused}"
    );
    assert_eq!(new.position("t", 3).unwrap(), Some(10));
    assert_eq!(new.get(&k(1), "v").unwrap(), bytes("old"));
    assert_eq!(new.counters().unwrap(), vec![("c".to_owned(), 1)]);
    assert_eq!(new.outbox().unwrap().len(), 1);
    // The new owner commits; partitions nobody claimed are not fenced.
    new.commit(batch(20, "new")).unwrap();
    old.commit(BatchCommit { positions: vec![("t".into(), 4, 1)], ..BatchCommit::default() }).unwrap();
    assert_eq!(new.position("t", 3).unwrap(), Some(20));
    assert_eq!(new.get(&k(1), "v").unwrap(), bytes("new"));

    // The outbox of a claimed partition is fenced too: adding to it,
    // removing from it, settling it.
    let entry_of = |partition: u32| OutboxEntry { partition: Some(partition), origin: None, ..entry("retry_t", 0) };
    let pending = new.outbox_of(3).unwrap();
    assert_eq!(pending.len(), 0);
    new.commit(BatchCommit { outbox: vec![entry_of(3)], ..BatchCommit::default() }).unwrap();
    let (last, _) = *new.outbox_of(3).unwrap().last().unwrap();
    for refused in [
        old.remove_outbox(3, last).unwrap_err(),
        old.commit(BatchCommit { outbox: vec![entry_of(3)], ..BatchCommit::default() }).unwrap_err(),
        old.commit(BatchCommit { outbox_through: Some((3, last)), ..BatchCommit::default() }).unwrap_err(),
    ] {
        assert!(matches!(refused, StateError::Fenced { partition: 3, .. }), "{refused}");
    }
    assert_eq!(new.outbox_of(3).unwrap().len(), 1);
    new.remove_outbox(3, last).unwrap();
    assert!(new.outbox_of(3).unwrap().is_empty());
}

pub(super) fn positions_done_marks_and_host_values_are_listed(fixture: &dyn Fixture) {
    let store = fixture.open();
    assert!(store.positions().unwrap().is_empty() && store.done_marks().unwrap().is_empty());
    store
        .commit(BatchCommit {
            positions: vec![("t".into(), 1, 4), ("retry_t".into(), 0, 2), ("t".into(), 0, 9)],
            done: vec![("dlq_t".into(), 3, 7), ("retry_t".into(), 0, 5)],
            ..BatchCommit::default()
        })
        .unwrap();
    store.set_meta("b", b"2").unwrap();
    store.set_meta("a", b"1").unwrap();
    let listed = |list: &[(&str, u32, u64)]| list.iter().map(|&(t, p, o)| (t.to_owned(), p, o)).collect::<Vec<_>>();
    assert_eq!(store.positions().unwrap(), listed(&[("retry_t", 0, 2), ("t", 0, 9), ("t", 1, 4)]));
    assert_eq!(store.done_marks().unwrap(), listed(&[("dlq_t", 3, 7), ("retry_t", 0, 5)]));
    let meta = store.meta_entries().unwrap();
    assert!(meta.contains(&("a".to_owned(), b"1".to_vec())) && meta.contains(&("b".to_owned(), b"2".to_vec())));
}

pub(super) fn starting_over_clears_all_but_host_values_in_one_commit(fixture: &dyn Fixture) {
    let store = fixture.open();
    store
        .commit(BatchCommit {
            writes: vec![(k(1), writes(&[("a", Some("1"))])), (k(2), writes(&[("b", Some("2"))]))],
            counter_deltas: [("c".to_owned(), 5)].into_iter().collect(),
            stat_deltas: [(Stat::Applied, 3)].into_iter().collect(),
            positions: vec![("t".into(), 0, 10), ("t".into(), 1, 20), ("retry_t".into(), 0, 3)],
            done: vec![("retry_t".into(), 0, 6), ("dlq_t".into(), 1, 2)],
            outbox: vec![entry("out", 0), entry("out", 1)],
            ..BatchCommit::default()
        })
        .unwrap();
    store.set_meta("module/bank", b"v1").unwrap();
    store.start_over(vec![("t".into(), 0, 0), ("retry_t".into(), 0, 8)]).unwrap();
    assert_eq!(store.keys().unwrap(), Vec::<Key>::new());
    assert_eq!(store.get(&k(1), "a").unwrap(), None);
    assert!(store.counters().unwrap().is_empty() && store.stats().unwrap().is_empty());
    assert_eq!(store.reader().unwrap().counter("c").unwrap(), 0);
    assert!(store.done_marks().unwrap().is_empty() && store.outbox().unwrap().is_empty());
    assert_eq!(store.positions().unwrap(), vec![("retry_t".to_owned(), 0, 8), ("t".to_owned(), 0, 0)]);
    assert_eq!(store.position("t", 1).unwrap(), None);
    assert_eq!(store.meta("module/bank").unwrap(), bytes("v1"));
    // Outbox sequence numbers are never reused, even across a start-over.
    store.commit(BatchCommit { outbox: vec![entry("out", 2)], ..BatchCommit::default() }).unwrap();
    assert_eq!(store.outbox().unwrap(), vec![(2, entry("out", 2))]);
    // It survives a reopen.
    drop(store);
    let store = fixture.open();
    assert_eq!(store.positions().unwrap().len(), 2);
    assert_eq!(store.keys().unwrap(), Vec::<Key>::new());
}

pub(super) fn a_run_and_a_reset_exclude_each_other(fixture: &dyn Fixture) {
    if !fixture.fences() {
        // One process holds the file: its lock does both jobs.
        let store = fixture.open();
        store.hold_for_run().unwrap();
        store.lock_for_reset().unwrap();
        return;
    }
    let in_use = |result: Result<(), StateError>| matches!(result, Err(StateError::InUse { .. }));
    let (run, other_run) = (fixture.open(), fixture.open());
    run.hold_for_run().unwrap();
    other_run.hold_for_run().unwrap();
    let reset = fixture.open();
    assert!(in_use(reset.lock_for_reset()), "a reset is refused while hosts run the projection");
    drop((run, other_run));
    // The lock goes with the runs' sessions, which the server ends shortly.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while in_use(reset.lock_for_reset()) {
        assert!(std::time::Instant::now() < deadline, "the runs' lock outlived their stores");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(in_use(fixture.open().hold_for_run()), "a run is refused while a reset holds the projection");
    assert!(in_use(fixture.open().lock_for_reset()), "one reset at a time");
}

pub(super) fn snapshots_count_what_the_quotas_need_up_to_a_bound(fixture: &dyn Fixture) {
    let store = fixture.open();
    let before = store.reader().unwrap();
    let mut commit = BatchCommit::default();
    let names: Vec<String> = (0..30).map(|i| format!("e{i:02}")).collect();
    let mut key_writes = KeyWrites::default();
    for name in &names {
        key_writes.set(name, vec![1]);
    }
    commit.writes =
        vec![(k(1), key_writes), (k(2), writes(&[("only", Some("1"))])), (k(3), writes(&[("x", Some("1"))]))];
    commit.counter_deltas = (0..25).map(|i| (format!("c{i}"), 0)).collect();
    store.commit(commit).unwrap();
    let reader = store.reader().unwrap();
    assert_eq!(reader.entry_count(&k(1), 1_000).unwrap(), 30);
    assert_eq!(reader.entry_count(&k(1), 12).unwrap(), 12, "counting stops at the bound");
    assert_eq!(reader.entry_count(&k(2), 1_000).unwrap(), 1, "a key's count stops at the next key");
    assert_eq!(reader.entry_count(&k(4), 1_000).unwrap(), 0);
    assert!(reader.contains(&k(2), "only").unwrap());
    assert!(!reader.contains(&k(2), "other").unwrap() && !reader.contains(&k(4), "only").unwrap());
    // A counter written with a zero total exists; one never written does not.
    assert_eq!(reader.find_counter("c0").unwrap(), Some(0));
    assert_eq!(reader.find_counter("never").unwrap(), None);
    assert_eq!(reader.counter_count(1_000).unwrap(), 25);
    assert_eq!(reader.counter_count(10).unwrap(), 10, "counting stops at the bound");
    // An older snapshot counts what it saw.
    assert_eq!((before.counter_count(1_000).unwrap(), before.entry_count(&k(1), 1_000).unwrap()), (0, 0));
}

pub(super) fn counters_and_entries_are_read_in_pages(fixture: &dyn Fixture) {
    let store = fixture.open();
    let mut key_writes = KeyWrites::default();
    for i in 0..7 {
        key_writes.set(&format!("e{i}"), vec![b'v'; 10]);
    }
    store
        .commit(BatchCommit {
            writes: vec![(k(1), key_writes), (k(2), writes(&[("a", Some("next key"))]))],
            counter_deltas: (0..5).map(|i| (format!("c{i}"), i128::from(i))).collect(),
            ..BatchCommit::default()
        })
        .unwrap();
    let names = |page: Vec<(String, Vec<u8>)>| page.into_iter().map(|(name, _)| name).collect::<Vec<_>>();
    assert_eq!(names(store.entries_page(&k(1), None, 3, usize::MAX).unwrap()), ["e0", "e1", "e2"]);
    assert_eq!(names(store.entries_page(&k(1), Some("e2"), 3, usize::MAX).unwrap()), ["e3", "e4", "e5"]);
    assert_eq!(names(store.entries_page(&k(1), Some("e5"), 3, usize::MAX).unwrap()), ["e6"], "never the next key's");
    assert!(store.entries_page(&k(1), Some("e6"), 3, usize::MAX).unwrap().is_empty());
    // Bytes bound a page too: none after the values reach 25 bytes (the
    // third of 10); the first entry always comes.
    assert_eq!(names(store.entries_page(&k(1), None, 100, 25).unwrap()), ["e0", "e1", "e2"]);
    assert_eq!(names(store.entries_page(&k(1), None, 100, 20).unwrap()), ["e0", "e1"]);
    assert_eq!(names(store.entries_page(&k(1), Some("e0"), 100, 1).unwrap()), ["e1"]);
    assert_eq!(names(store.entries_page(&k(1), Some("e0"), 100, 0).unwrap()), ["e1"]);
    assert_eq!(store.entries_page(&k(1), None, 100, usize::MAX).unwrap(), store.entries(&k(1)).unwrap());
    let page = store.counters_page(None, 2).unwrap();
    assert_eq!(page, [("c0".to_owned(), 0), ("c1".to_owned(), 1)]);
    let page = store.counters_page(Some("c1"), 10).unwrap();
    assert_eq!(page.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>(), ["c2", "c3", "c4"]);
    assert!(store.counters_page(Some("c4"), 10).unwrap().is_empty());
    assert!(store.counters_page(Some("zzz"), 10).unwrap().is_empty());
}

/// Positions under names no topic can have (with `:`), as the release
/// stage's checkpoint writes them: read back as written after a reopen,
/// up to 32 bits' halves of a clock; a later commit overwrites some, to
/// lower values too, and leaves the others.
pub(super) fn positions_under_any_name_round_trip_and_a_later_commit_leaves_the_others(fixture: &impl Fixture) {
    let store = fixture.open();
    let names = ["a", "release:read-to:a", "release:held-runs:a", "release:held-start:a:2", "release:clock-high"];
    let first = [3, 12, 3, 10, u64::from(u32::MAX)];
    let positions = names.iter().zip(first).map(|(name, at)| ((*name).to_owned(), 1, at)).collect();
    store.commit(BatchCommit { positions, ..BatchCommit::default() }).unwrap();
    let later = vec![("release:read-to:a".to_owned(), 1, 13), ("release:held-runs:a".to_owned(), 1, 1)];
    store.commit(BatchCommit { positions: later, ..BatchCommit::default() }).unwrap();
    drop(store);
    let store = fixture.open();
    let read: Vec<Option<u64>> = names.iter().map(|name| store.position(name, 1).unwrap()).collect();
    assert_eq!(read, [Some(3), Some(13), Some(1), Some(10), Some(u64::from(u32::MAX))]);
    assert_eq!(store.position("release:read-to:a", 2).unwrap(), None, "another partition");
}

fn timer(name: &str, at: Millis) -> Timer {
    Timer { name: name.to_owned(), at, payload: name.as_bytes().to_vec() }
}

fn timers_of(store: &StateStore, key: &Key) -> Vec<(String, Millis, Vec<u8>)> {
    let mut timers: Vec<_> =
        store.reader().unwrap().timers(key).unwrap().into_iter().map(|t| (t.name, t.at, t.payload)).collect();
    timers.sort();
    timers
}

pub(super) fn timers_are_committed_with_the_batch_and_found_by_time(fixture: &dyn Fixture) {
    let store = fixture.open();
    assert_eq!(store.timer_summary(None).unwrap(), TimerSummary::default());
    let before = store.reader().unwrap();
    let write = |key: u64, partition: u32, timers: Vec<Timer>| TimerWrite { key: k(key), partition, timers };
    store
        .commit(BatchCommit {
            timers: vec![
                write(1, 0, vec![timer("close", 50), timer("a", -7)]),
                write(2, 0, vec![timer("close", 20)]),
                write(3, 1, vec![timer("close", 5)]),
                // Listed twice: the later wins.
                write(4, 0, vec![timer("x", 1)]),
                write(4, 0, vec![timer("y", 30)]),
            ],
            positions: vec![("t".into(), 0, 3)],
            ..BatchCommit::default()
        })
        .unwrap();
    assert!(before.timers(&k(1)).unwrap().is_empty(), "a snapshot sees what was committed before it");
    assert_eq!(before.timer_count(100).unwrap(), 0);
    assert_eq!(timers_of(&store, &k(1)), [("a".into(), -7, b"a".to_vec()), ("close".into(), 50, b"close".to_vec())]);
    assert_eq!(timers_of(&store, &k(4)), [("y".into(), 30, b"y".to_vec())]);
    assert_eq!(store.reader().unwrap().timer_count(100).unwrap(), 5);
    assert_eq!(store.reader().unwrap().timer_count(2).unwrap(), 2, "counted up to the bound");
    // Due below a clock, per partition, earliest first, each key once.
    assert_eq!(store.due_timers(0, 21, 10).unwrap(), [(k(1), -7), (k(2), 20)]);
    assert_eq!(store.due_timers(0, 20, 10).unwrap(), [(k(1), -7)], "the clock is exclusive");
    assert_eq!(store.due_timers(0, 100, 2).unwrap(), [(k(1), -7), (k(2), 20)], "at most the limit");
    assert_eq!(store.due_timers(1, 100, 10).unwrap(), [(k(3), 5)]);
    assert!(store.due_timers(2, Millis::MAX, 10).unwrap().is_empty());
    assert_eq!(store.timer_summary(None).unwrap(), TimerSummary { pending: 5, next_at: Some(-7) });
    assert_eq!(store.timer_summary(Some(1)).unwrap(), TimerSummary { pending: 1, next_at: Some(5) });
    // A later batch replaces a key's timers: one fired, one moved, one
    // cancelled, one added; an empty list removes them all.
    store
        .commit(BatchCommit {
            timers: vec![write(1, 0, vec![timer("close", 60), timer("b", 55)]), write(2, 0, vec![])],
            ..BatchCommit::default()
        })
        .unwrap();
    assert_eq!(timers_of(&store, &k(1)), [("b".into(), 55, b"b".to_vec()), ("close".into(), 60, b"close".to_vec())]);
    assert!(timers_of(&store, &k(2)).is_empty());
    assert_eq!(store.due_timers(0, 100, 10).unwrap(), [(k(4), 30), (k(1), 55)]);
    // A commit that fails changes no timer: a fenced one, where fencing is.
    drop(store);
    let store = fixture.open();
    assert_eq!(store.timer_summary(None).unwrap(), TimerSummary { pending: 4, next_at: Some(5) });
    if fixture.fences() {
        store.claim(0).unwrap();
        let other = fixture.open();
        other.claim(0).unwrap();
        let refused = store.commit(BatchCommit {
            timers: vec![write(1, 0, vec![])],
            positions: vec![("t".into(), 0, 4)],
            ..BatchCommit::default()
        });
        assert!(matches!(refused, Err(StateError::Fenced { .. })), "{refused:?}");
        assert_eq!(timers_of(&other, &k(1)).len(), 2, "nothing of a refused commit is applied");
    }
}

pub(super) fn timers_are_cleared_by_starting_over(fixture: &dyn Fixture) {
    let store = fixture.open();
    let timers = vec![TimerWrite { key: k(1), partition: 0, timers: vec![timer("close", 5)] }];
    store.commit(BatchCommit { timers, ..BatchCommit::default() }).unwrap();
    store.start_over(vec![("t".into(), 0, 0)]).unwrap();
    assert!(timers_of(&store, &k(1)).is_empty());
    assert_eq!(store.timer_summary(None).unwrap(), TimerSummary::default());
    assert!(store.due_timers(0, Millis::MAX, 10).unwrap().is_empty());
}
