//! A batch as a value: records in, the [`BatchCommit`] out, with a native
//! module and a snapshot held in a map: no log, no store, no thread.

use std::collections::HashMap;

use super::super::test_ledger::*;
use super::super::work::BatchBuffers;
use super::{Advance, Finished};
use crate::engine::consumer::ConsumerError;
use crate::engine::routing::{self, FailureClass, RetryQueue, Routed};
use crate::event::{Algebra, EventAtomicOrdering, EventHeaders, EventTypeTag};
use crate::key::Key;
use crate::storage::log::{PolledBatch, Record, StoredRecord};
use crate::storage::state::{BatchCommit, StateReader};
use crate::storage::stats::Stat;

use EventAtomicOrdering::{AcqRel, Relaxed};

/// Runs `records` (offsets 0, 1, …) as a batch polled from the topic, over
/// `state`, to its commit.
fn polled(records: &[Record], state: MapSnapshot) -> Finished {
    run_polled(records, state, Ledger::new()).unwrap()
}

/// [`polled`] with `ledger`, its error as it comes.
fn run_polled(records: &[Record], state: MapSnapshot, ledger: Ledger) -> Result<Finished, ConsumerError> {
    let mut batch = PolledBatch::new();
    for (offset, record) in records.iter().enumerate() {
        batch.push(offset as u64, record).unwrap();
    }
    let advance = Advance::Topic(records.len() as u64);
    let queue = RetryQueue::starting_at(0);
    let mut buffers = BatchBuffers::default();
    let read = |_: &[Key]| Ok(StateReader::new(state));
    runner().polled(0, (&batch, &advance), &queue, &mut buffers, modules(ledger), read)
}

/// Runs records taken from the retry topic (the retry position once they
/// are done: `position`) to its commit.
fn retried(records: Vec<StoredRecord>, position: u64) -> Finished {
    let read = |_: &[Key]| Ok(StateReader::new(MapSnapshot::default()));
    runner().retried(0, records, (HashMap::new(), position), modules(Ledger::new()), read).unwrap()
}

/// The value `key` writes to `name` in the commit.
fn written(commit: &BatchCommit, key: i64, name: &str) -> Option<String> {
    let (_, writes) = commit.writes.iter().find(|(k, _)| *k == Key::int(key))?;
    writes.get(name).flatten().map(|value| String::from_utf8_lossy(value).into_owned())
}

/// The commit's records for topic `topic`: each body, routing headers and
/// envelope.
fn routed_to(commit: &BatchCommit, topic: &str) -> Vec<(String, Routed, EventHeaders)> {
    let records = commit.outbox.iter().filter(|entry| entry.topic == topic).map(|entry| &entry.record);
    records
        .map(|record| {
            let envelope = EventHeaders::parse_stored(&record.headers).unwrap();
            (String::from_utf8_lossy(&record.body).into_owned(), Routed::parse(&record.headers).unwrap(), envelope)
        })
        .collect()
}

#[test]
fn a_keyed_fold_writes_each_keys_state_and_moves_the_positions_on() {
    let records = [
        relaxed(1, DEPOSIT, "5"),
        relaxed(2, DEPOSIT, "7"),
        relaxed(1, DEPOSIT, "3"),
        relaxed(1, DEPOSIT, "1"),
        relaxed(2, SUM, "10"),
        relaxed(2, SUM, "20"),
    ];
    let mut state = MapSnapshot::default();
    state.0.insert((Key::int(1), "balance".into()), b"100".to_vec());
    let Finished { commit, summary, .. } = polled(&records, state);
    assert_eq!(written(&commit, 1, "balance").as_deref(), Some("109"), "on top of the snapshot's 100");
    assert_eq!(written(&commit, 2, "balance").as_deref(), Some("37"));
    // Key 1's three deposits take two calls (max-batch 2), key 2's one and
    // its two sums one fold.
    assert_eq!((summary.consumed, summary.applied, summary.calls), (6, 6, 4));
    assert_eq!(commit.counter_deltas.get("deposits"), Some(&5), "3 deposits, 1 deposit, 1 folded sum");
    assert_eq!(commit.positions, [("t".to_owned(), 0, 6), (routing::retry_topic("t"), 0, 0)]);
    assert!(commit.outbox.is_empty() && commit.done.is_empty());
    assert_eq!(commit.stat_deltas[Stat::Applied], 6);
}

#[test]
fn a_retryable_failure_sends_the_keys_unfinished_work_to_retry_past_its_fence_in_order() {
    let records = [
        relaxed(1, DEPOSIT, "5"),
        relaxed(1, DEPOSIT, "fail"),
        event(1, RESET, AcqRel, None, "reset"),
        relaxed(1, DEPOSIT, "2"),
        relaxed(2, DEPOSIT, "4"),
        event(2, RESET, AcqRel, None, "reset"),
        relaxed(2, DEPOSIT, "6"),
    ];
    let Finished { commit, summary, .. } = polled(&records, MapSnapshot::default());
    // Key 2 goes on: the fence keeps its reset between its deposits.
    assert_eq!(written(&commit, 2, "balance").as_deref(), Some("6"));
    // Key 1 stops at the failed chunk (both its first deposits): nothing
    // of it is written, and everything goes to retry in its order.
    assert_eq!(written(&commit, 1, "balance"), None);
    let retry: Vec<_> = routed_to(&commit, &routing::retry_topic("t"))
        .into_iter()
        .map(|(body, routed, envelope)| {
            assert_eq!(envelope.key, Key::int(1));
            let class = routed.failure.as_ref().map(|failure| failure.class);
            (body, routed.origin_offset, routed.attempts, class, routed.ordering)
        })
        .collect();
    let failed = Some(FailureClass::Retryable);
    assert_eq!(
        retry,
        [
            ("5".to_owned(), 0, 1, failed, Some(Relaxed)),
            ("fail".to_owned(), 1, 1, failed, Some(Relaxed)),
            ("reset".to_owned(), 2, 0, None, Some(AcqRel)),
            ("2".to_owned(), 3, 0, None, Some(Relaxed)),
        ]
    );
    assert_eq!((summary.applied, summary.retry_in, summary.dead_lettered), (3, 4, 0));
    assert_eq!((commit.stat_deltas[Stat::Applied], commit.stat_deltas[Stat::RetryIn]), (3, 4), "kept with the state");

    // Taken back from the retry topic, it fails again: the failed chunk
    // is written again, one attempt more, ahead of the records not reached,
    // which stay where they wait; the retry position stops at them.
    let taken = commit.outbox.iter().filter(|entry| entry.topic == routing::retry_topic("t"));
    let stored = taken.enumerate().map(|(offset, entry)| StoredRecord {
        offset: offset as u64,
        record: entry.record.clone(),
        append_time: None,
    });
    let Finished { commit, summary, left, .. } = retried(stored.collect(), 4);
    let again: Vec<_> = routed_to(&commit, &routing::retry_topic("t"))
        .into_iter()
        .map(|(body, routed, _)| (body, routed.attempts, routed.ahead_of))
        .collect();
    assert_eq!(again, [("5".to_owned(), 2, Some(2)), ("fail".to_owned(), 2, Some(2))]);
    assert_eq!(left, [2, 3]);
    let retry = routing::retry_topic("t");
    assert_eq!(commit.done, [(retry.clone(), 0, 0), (retry.clone(), 0, 1)]);
    assert_eq!(commit.positions, [(retry, 0, 2)]);
    assert_eq!((summary.retry_in, summary.retry_out), (2, 2));
    assert_eq!((commit.stat_deltas[Stat::RetryIn], commit.stat_deltas[Stat::RetryOut]), (2, 2));
}

#[test]
fn an_unrecoverable_failure_is_dead_lettered_and_its_key_goes_on() {
    let records = [relaxed(1, DEPOSIT, "5"), relaxed(1, RESET, "bad reset"), relaxed(1, DEPOSIT, "2")];
    let Finished { commit, summary, .. } = polled(&records, MapSnapshot::default());
    assert_eq!(written(&commit, 1, "balance").as_deref(), Some("7"), "both deposits, one run");
    let dead = routed_to(&commit, &routing::dlq_topic("t"));
    assert_eq!(dead.len(), 1);
    let (body, routed, envelope) = &dead[0];
    assert_eq!((body.as_str(), routed.origin_offset, routed.attempts), ("bad reset", 1, 1));
    let failure = routed.failure.as_ref().unwrap();
    assert_eq!(
        (failure.class, failure.message.as_str()),
        (FailureClass::Unrecoverable, "unrecoverable handler error: bad reset")
    );
    assert_eq!((envelope.key.clone(), envelope.tag), (Key::int(1), EventTypeTag::new(RESET)));
    assert_eq!((summary.applied, summary.dead_lettered, summary.retry_in), (2, 1, 0));
    assert_eq!((commit.stat_deltas[Stat::Applied], commit.stat_deltas[Stat::DeadLettered]), (2, 1));
}

#[test]
fn a_timed_event_without_its_time_is_dead_lettered_and_a_retried_one_keeps_its_time() {
    let records = [
        event(1, READING, Relaxed, None, "untimed"),
        event(1, READING, Relaxed, Some(1_000), "ok"),
        event(2, READING, Relaxed, Some(2_000), "fail"),
    ];
    let Finished { commit, summary, .. } = polled(&records, MapSnapshot::default());
    assert_eq!(written(&commit, 1, "readings").as_deref(), Some("ok "));
    let dead = routed_to(&commit, &routing::dlq_topic("t"));
    assert_eq!(dead.iter().map(|(body, _, _)| body.as_str()).collect::<Vec<_>>(), ["untimed"]);
    let retry = routed_to(&commit, &routing::retry_topic("t"));
    assert_eq!(
        retry.iter().map(|(body, _, e)| (body.as_str(), e.event_time)).collect::<Vec<_>>(),
        [("fail", Some(2_000))]
    );
    assert_eq!((summary.malformed, summary.dead_lettered, summary.applied, summary.retry_in), (1, 1, 1, 1));
}

/// A key's events of two timed types, released in event-time order, reach
/// the handler in that order (relaxed, they would be two body runs); one
/// declared `timed-relaxed` moves past them as its ordering allows. A
/// record fenced for the planner keeps its declared ordering in the
/// dead-letter topic.
#[test]
fn a_keys_timed_events_of_two_types_are_handled_in_the_order_released() {
    let timed = |tag, at, body| event(1, tag, Relaxed, Some(at), body);
    let records = [timed(READING, 1, "r1"), timed(MARK, 2, "m2"), timed(READING, 3, "r3"), timed(MARK, 4, "m4")];
    let Finished { commit, .. } = polled(&records, MapSnapshot::default());
    assert_eq!(written(&commit, 1, "readings").as_deref(), Some("r1 m2 r3 m4 "));

    let records = [timed(READING, 1, "r1"), timed(GLANCE, 2, "g2"), timed(READING, 3, "r3")];
    let Finished { commit, .. } = polled(&records, MapSnapshot::default());
    assert_eq!(written(&commit, 1, "readings").as_deref(), Some("r1 r3 g2 "), "one run per type");

    let records = [timed(READING, 1, "r1"), timed(MARK, 2, "bad2"), timed(READING, 3, "r3")];
    let Finished { commit, .. } = polled(&records, MapSnapshot::default());
    assert_eq!(written(&commit, 1, "readings").as_deref(), Some("r1 r3 "));
    let dead = routed_to(&commit, &routing::dlq_topic("t"));
    let dead: Vec<_> = dead.iter().map(|(body, _, envelope)| (body.as_str(), envelope.ordering)).collect();
    assert_eq!(dead, [("bad2", Relaxed)], "as declared");
}

#[test]
fn a_sorted_run_carries_each_events_own_attempts() {
    // Taken from retry: "ok" after 3 attempts, then "fail", new. Sorted by
    // body, "fail" runs first: it fails with its own first attempt, and
    // "ok" goes on to retry with its 3.
    let stored = |offset, body: &str, attempts| {
        let envelope = EventHeaders {
            tag: EventTypeTag::new(TAG),
            key: Key::int(1),
            ordering: Relaxed,
            algebra: Algebra::IdempotentCommutative,
            event_time: None,
        };
        let routed = Routed {
            projection: "p".into(),
            topic: "t".into(),
            event_type: "tag".into(),
            origin_partition: 0,
            origin_offset: offset,
            events: 1,
            attempts,
            failed_at_ms: 0,
            first_failed_at_ms: None,
            failure: None,
            ahead_of: None,
            ordering: Some(Relaxed),
        };
        let record = routing::routed_record(&envelope, &routed, body.as_bytes().to_vec());
        StoredRecord { offset, record, append_time: None }
    };
    let Finished { commit, .. } = retried(vec![stored(0, "ok", 3), stored(1, "fail", 0)], 2);
    let retry = routed_to(&commit, &routing::retry_topic("t"));
    let attempts: Vec<_> = retry.iter().map(|(body, routed, _)| (body.as_str(), routed.attempts)).collect();
    assert_eq!(attempts, [("fail", 1), ("ok", 3)]);
}

#[test]
fn a_run_that_fails_whole_as_it_came_keeps_each_events_own_time() {
    // No time per batch: the module's first call (key 1's) is its last, and
    // key 2's run fails unreduced, without costing an attempt.
    let records = [
        relaxed(1, DEPOSIT, "1"),
        event(2, MARK, Relaxed, Some(5_000), "m"),
        event(2, MARK, Relaxed, Some(3_000), "m"),
    ];
    let mut batch = PolledBatch::new();
    for (offset, record) in records.iter().enumerate() {
        batch.push(offset as u64, record).unwrap();
    }
    let mut runner = runner();
    runner.keys.config.module_time_per_batch = std::time::Duration::ZERO;
    let read = |_: &[Key]| Ok(StateReader::new(MapSnapshot::default()));
    let (queue, mut buffers) = (RetryQueue::starting_at(0), BatchBuffers::default());
    let advance = Advance::Topic(3);
    let finished = runner.polled(0, (&batch, &advance), &queue, &mut buffers, modules(Ledger::new()), read).unwrap();
    assert_eq!(written(&finished.commit, 1, "balance").as_deref(), Some("1"));
    let retry = routed_to(&finished.commit, &routing::retry_topic("t"));
    let times: Vec<_> =
        retry.iter().map(|(_, routed, e)| (routed.origin_offset, routed.attempts, e.event_time)).collect();
    assert_eq!(times, [(1, 0, Some(5_000)), (2, 0, Some(3_000))]);
}

#[test]
fn a_panicking_worker_fails_the_batch_on_the_calling_thread_too() {
    let ledger = Ledger { panics: true, ..Ledger::new() };
    let result = run_polled(&[relaxed(1, DEPOSIT, "1")], MapSnapshot::default(), ledger);
    let message = match result {
        Err(ConsumerError::WorkerPanicked(message)) => message,
        other => panic!("not a panic: {:?}", other.err()),
    };
    assert_eq!(message, "no instance today");
}
