//! One conformance suite for every log backend: the embedded log always,
//! Apache Iggy when `WAKU_IGGY_URL` names a server (for example
//! `iggy://iggy:iggy@127.0.0.1:8090`); without it the Iggy half prints one
//! line saying it was skipped.

use std::time::{Duration, SystemTime};

use wakuwaku::event::{Algebra, EventAtomicOrdering, EventHeaders, EventTypeTag, Header, partition_for};
use wakuwaku::key::Key;
use wakuwaku::storage::log::{EmbeddedLog, EventLog, IggyLog, LogError, PolledBatch, Record};

fn record(key: u64, n: u32) -> Record {
    let headers = EventHeaders {
        tag: EventTypeTag::new(n),
        key: Key::int(key),
        ordering: EventAtomicOrdering::Acquire,
        algebra: Algebra::Associative,
        event_time: None,
    };
    let mut headers = headers.to_headers();
    headers.push(Header { name: "trace".into(), value: format!("t{n}").into_bytes() });
    Record { headers, body: format!("{{\"n\":{n}}}").into_bytes() }
}

fn sorted(mut headers: Vec<Header>) -> Vec<Header> {
    headers.sort_by(|a, b| a.name.cmp(&b.name));
    headers
}

/// `poll` gives the records `read` gives: the same offsets, and each view
/// the same record, header for header and byte for byte, whatever the batch
/// it refills held before.
async fn assert_poll_reads<L: EventLog>(log: &L, topic: &str, partition: u32, from: u64, max: usize) {
    let read = log.read(topic, partition, from, max).await.unwrap();
    let used = log.poll(topic, 0, 0, 100, PolledBatch::new()).await.unwrap();
    let polled = log.poll(topic, partition, from, max, used).await.unwrap();
    assert_eq!(polled.len(), read.len(), "{topic}/{partition}: {max} from {from}");
    for (view, stored) in polled.iter().zip(read) {
        assert_eq!(view.offset(), stored.offset);
        assert_eq!(view.body(), stored.record.body.as_slice());
        let record = view.to_record();
        assert_eq!(record.body, stored.record.body);
        assert_eq!(sorted(record.headers), sorted(stored.record.headers.clone()));
        assert_eq!(EventHeaders::parse(view.headers()), EventHeaders::parse_stored(&stored.record.headers));
    }
}

/// Every promise of the `EventLog` trait, on topics named after `prefix`.
async fn conformance<L: EventLog>(log: &L, prefix: &str) {
    let topic = format!("{prefix}-events");
    let missing = format!("{prefix}-missing");

    // Topics: created once, checked after, refused with a bad count.
    log.create_topic(&topic, 3).await.unwrap();
    log.create_topic(&topic, 3).await.unwrap();
    let mismatch = log.create_topic(&topic, 4).await.unwrap_err();
    assert!(matches!(mismatch, LogError::PartitionCountMismatch { existing: 3, requested: 4, .. }), "{mismatch}");
    assert!(matches!(log.create_topic(&missing, 0).await, Err(LogError::InvalidPartitionCount { .. })));
    assert_eq!(log.partitions(&topic).await.unwrap(), 3);
    assert!(matches!(log.partitions(&missing).await, Err(LogError::TopicNotFound { .. })));
    let listed = log.topics().await.unwrap();
    assert!(listed.contains(&(topic.clone(), 3)), "{listed:?}");
    assert!(!listed.iter().any(|(name, _)| name == &missing), "a topic never created is not listed: {listed:?}");
    assert!(listed.is_sorted(), "{listed:?}");
    for partition in 0..3 {
        assert_eq!(log.end_offset(&topic, partition).await.unwrap(), 0, "an empty partition ends at 0");
    }

    // Appends: in order, offsets dense from 0, per partition.
    log.append(&topic, vec![(0, (0..5).map(|n| record(1, n)).collect()), (2, vec![record(2, 100)])]).await.unwrap();
    log.append(&topic, vec![(0, (5..2500).map(|n| record(1, n)).collect())]).await.unwrap();
    assert_eq!(log.end_offset(&topic, 0).await.unwrap(), 2500);
    assert_eq!(log.end_offset(&topic, 1).await.unwrap(), 0);
    assert_eq!(log.end_offset(&topic, 2).await.unwrap(), 1);
    let all = log.read(&topic, 0, 0, 10_000).await.unwrap();
    assert_eq!(all.len(), 2500);
    for (index, stored) in all.iter().enumerate() {
        assert_eq!(stored.offset, index as u64);
        let expected = record(1, index as u32);
        assert_eq!(stored.record.body, expected.body);
        assert_eq!(sorted(stored.record.headers.clone()), sorted(expected.headers));
        assert_eq!(EventHeaders::parse_stored(&stored.record.headers).unwrap().tag.get(), index as u32);
    }
    let middle = log.read(&topic, 0, 1200, 7).await.unwrap();
    assert_eq!(middle.iter().map(|r| r.offset).collect::<Vec<_>>(), (1200..1207).collect::<Vec<_>>());
    assert!(log.read(&topic, 0, 2500, 10).await.unwrap().is_empty());
    assert!(log.read(&topic, 0, 0, 0).await.unwrap().is_empty());
    assert!(matches!(log.read(&topic, 3, 0, 1).await, Err(LogError::PartitionNotFound { partitions: 3, .. })));
    for (from, max) in [(0, 10_000), (1200, 7), (1023, 3), (2499, 5), (2500, 10), (0, 0)] {
        assert_poll_reads(log, &topic, 0, from, max).await;
    }
    assert!(matches!(
        log.poll(&topic, 3, 0, 1, PolledBatch::new()).await,
        Err(LogError::PartitionNotFound { partitions: 3, .. })
    ));
    assert!(matches!(log.append(&topic, vec![(7, vec![record(1, 1)])]).await, Err(LogError::PartitionNotFound { .. })));

    // Producer stamps: once per partition, and a partial first try is
    // completed, not repeated.
    assert_eq!(log.producer_sequence(&topic, 1, "outbox", 0).await.unwrap(), None);
    assert!(log.append_as(&topic, vec![(1, vec![record(3, 1), record(3, 2)])], "outbox", 4).await.unwrap());
    assert!(!log.append_as(&topic, vec![(1, vec![record(3, 1), record(3, 2)])], "outbox", 4).await.unwrap());
    assert!(
        log.append_as(&topic, vec![(1, vec![record(3, 1), record(3, 2)]), (2, vec![record(4, 1)])], "outbox", 4)
            .await
            .unwrap()
    );
    assert_eq!((log.end_offset(&topic, 1).await.unwrap(), log.end_offset(&topic, 2).await.unwrap()), (2, 2));
    assert_eq!(log.producer_sequence(&topic, 1, "outbox", 0).await.unwrap(), Some(4));
    assert_eq!(log.producer_sequence(&topic, 1, "other", 0).await.unwrap(), None);
    assert!(log.append_as(&topic, vec![(1, vec![record(3, 3)])], "outbox", 5).await.unwrap());
    assert_eq!(log.producer_sequence(&topic, 1, "outbox", 0).await.unwrap(), Some(5));

    // End offsets of a whole topic at once, in partition order.
    assert_eq!(log.end_offsets(&topic).await.unwrap(), vec![2500, 3, 2]);
    assert!(matches!(log.end_offsets(&missing).await, Err(LogError::TopicNotFound { .. })));

    // Records come back exactly, whatever they hold: an empty body, empty
    // and long header values, names that look like an encoding's own.
    let header = |name: &str, value: &[u8]| Header { name: name.into(), value: value.to_vec() };
    let odd = [
        Record { headers: vec![], body: vec![] },
        Record {
            headers: vec![
                header("~", &[]),
                header("a~1", b"x"),
                header("a", &[9; 600]),
                header("~no-body", b"y"),
                header("b~empty", &[]),
            ],
            body: vec![],
        },
        Record { headers: vec![header("z", b"0")], body: vec![0] },
    ];
    log.append(&topic, vec![(2, odd.to_vec())]).await.unwrap();
    assert_poll_reads(log, &topic, 2, 0, 10).await;
    let back = log.read(&topic, 2, 2, 10).await.unwrap();
    assert_eq!(back.len(), odd.len());
    for (stored, expected) in back.into_iter().zip(odd) {
        assert_eq!(stored.record.body, expected.body);
        assert_eq!(sorted(stored.record.headers), sorted(expected.headers));
    }

    // Consumer offsets: informational, per consumer and partition.
    assert_eq!(log.consumer_offset("bank", &topic, 0).await.unwrap(), None);
    log.store_consumer_offset("bank", &topic, 0, 1200).await.unwrap();
    log.store_consumer_offset("bank", &topic, 0, 2500).await.unwrap();
    assert_eq!(log.consumer_offset("bank", &topic, 0).await.unwrap(), Some(2500));
    assert_eq!(log.consumer_offset("bank", &topic, 1).await.unwrap(), None);
    let stored = log.store_consumer_offset("bank", &topic, 3, 5).await;
    assert!(matches!(stored, Err(LogError::PartitionNotFound { partitions: 3, .. })), "{stored:?}");
    let stored = log.store_consumer_offset("bank", &missing, 0, 5).await;
    assert!(matches!(stored, Err(LogError::TopicNotFound { .. })), "{stored:?}");

    // Reads in sequence (which a backend may serve from a poll made ahead),
    // broken by reads elsewhere, shorter reads and appends, return exactly
    // the records at the offsets asked for.
    let sequence = format!("{prefix}-sequence");
    log.create_topic(&sequence, 1).await.unwrap();
    log.append(&sequence, vec![(0, (0..2500).map(|n| record(5, n)).collect())]).await.unwrap();
    let reads = [(0, 500), (500, 500), (1000, 200), (1200, 200), (100, 10), (1400, 600), (1800, 600), (2400, 600)];
    for (step, (from, max)) in reads.into_iter().enumerate() {
        if step == 7 {
            log.append(&sequence, vec![(0, (2500..2800).map(|n| record(5, n)).collect())]).await.unwrap();
        }
        let read = log.read(&sequence, 0, from, max).await.unwrap();
        let expected: Vec<u64> = (from..(from + max as u64).min(2800)).collect();
        assert_eq!(read.iter().map(|r| r.offset).collect::<Vec<_>>(), expected, "read {step}: {max} from {from}");
        for stored in read {
            let tag = EventHeaders::parse_stored(&stored.record.headers).unwrap().tag.get();
            assert_eq!(u64::from(tag), stored.offset, "read {step}: the record stored at its offset");
        }
    }
    assert!(log.read(&sequence, 0, 2800, 600).await.unwrap().is_empty());

    // A follower's polls: one batch refilled poll after poll, to the end,
    // then empty at the end, then, once more is appended (a record at a
    // time and in a run), exactly the new records from where it stood.
    let followed = format!("{prefix}-followed");
    log.create_topic(&followed, 1).await.unwrap();
    let mut batch = log.poll(&followed, 0, 0, 100, PolledBatch::new()).await.unwrap();
    assert!(batch.is_empty(), "an empty partition polls empty");
    let mut next = 0u64;
    for (round, appended) in [3u32, 1, 1, 1500, 2, 1024, 1].into_iter().enumerate() {
        let records = (0..appended).map(|n| record(6, next as u32 + n)).collect();
        log.append(&followed, vec![(0, records)]).await.unwrap();
        let end = next + u64::from(appended);
        while next < end {
            batch = log.poll(&followed, 0, next, 1000, batch).await.unwrap();
            let offsets: Vec<u64> = batch.iter().map(|view| view.offset()).collect();
            let expected: Vec<u64> = (next..end.min(next + 1000)).collect();
            assert_eq!(offsets, expected, "round {round}: polled from {next}");
            for view in batch.iter() {
                let tag = EventHeaders::parse(view.headers()).unwrap().tag.get();
                assert_eq!(u64::from(tag), view.offset(), "round {round}: the record stored at its offset");
            }
            next += offsets.len() as u64;
        }
        batch = log.poll(&followed, 0, next, 1000, batch).await.unwrap();
        assert!(batch.is_empty(), "round {round}: nothing past the end at {next}");
    }

    // A poll stops at the batch's byte budget, however many records it may
    // take, and a record larger than the budget still comes alone: large
    // messages never make one poll hold thousands of them.
    let large = format!("{prefix}-large");
    log.create_topic(&large, 1).await.unwrap();
    let bodies = [10_000usize, 10_000, 10_000, 50_000, 10];
    let records = bodies.iter().enumerate().map(|(n, &len)| Record { body: vec![n as u8; len], ..record(7, n as u32) });
    log.append(&large, vec![(0, records.collect())]).await.unwrap();
    let mut next = 0u64;
    let mut polls = Vec::new();
    while next < bodies.len() as u64 {
        let batch = log.poll(&large, 0, next, 1000, PolledBatch::with_byte_budget(15_000)).await.unwrap();
        let offsets: Vec<u64> = batch.iter().map(|view| view.offset()).collect();
        assert!(!offsets.is_empty() && offsets[0] == next, "polled from {next}: {offsets:?}");
        for view in batch.iter() {
            assert_eq!(view.body().len(), bodies[view.offset() as usize]);
        }
        next += offsets.len() as u64;
        polls.push(offsets);
    }
    assert_eq!(polls, [vec![0, 1], vec![2, 3], vec![4]], "each poll stops once past 15 000 bytes");

    // A log with a record limit of its own refuses a larger record, naming
    // its size and the limit, and stores nothing of the append; a record
    // within it is stored and read back whole.
    if let Some(limit) = log.max_record_bytes(&large) {
        let limited = format!("{prefix}-limited");
        log.create_topic(&limited, 2).await.unwrap();
        let over = Record { body: vec![1; limit], ..record(8, 1) };
        let batches = vec![(0, vec![record(8, 0)]), (1, vec![record(9, 0), over])];
        let error = log.append(&limited, batches).await.unwrap_err();
        assert!(
            matches!(error, LogError::RecordTooLarge { partition: 1, size, limit: refused, .. }
                if size > limit && refused == limit),
            "{error}"
        );
        assert!(error.to_string().contains(&format!("the log takes at most {limit} bytes per record")), "{error}");
        assert_eq!(log.end_offsets(&limited).await.unwrap(), [0, 0], "nothing of the append");
        let within = Record { body: vec![1; limit - 1000], ..record(8, 2) };
        log.append(&limited, vec![(1, vec![within.clone(), record(8, 3)])]).await.unwrap();
        let read = log.read(&limited, 1, 0, 10).await.unwrap();
        assert_eq!(read.into_iter().map(|stored| stored.record).collect::<Vec<_>>(), [within, record(8, 3)]);
        assert_poll_reads(log, &limited, 1, 0, 10).await;
    }

    // Keys land where `partition_for` says, whichever backend.
    let keyed = format!("{prefix}-keyed");
    log.create_topic(&keyed, 4).await.unwrap();
    let keys: Vec<u64> = (0..64u64).collect();
    let batches = keys.iter().map(|&k| (partition_for(Key::int(k).key_hash(), 4), vec![record(k, 1)])).collect();
    log.append(&keyed, batches).await.unwrap();
    for partition in 0..4 {
        for stored in log.read(&keyed, partition, 0, 100).await.unwrap() {
            let key = EventHeaders::parse_stored(&stored.record.headers).unwrap().key;
            assert_eq!(partition_for(key.key_hash(), 4), partition);
        }
    }

    // Times: the first offset appended at or after a time, else the end.
    let timed = format!("{prefix}-timed");
    log.create_topic(&timed, 2).await.unwrap();
    let before = SystemTime::now();
    log.append(&timed, vec![(0, (0..3).map(|n| record(1, n)).collect())]).await.unwrap();
    // Past the first append's clock tick on either side.
    std::thread::sleep(Duration::from_millis(20));
    let between = SystemTime::now();
    log.append(&timed, vec![(0, (3..5).map(|n| record(1, n)).collect())]).await.unwrap();
    assert_eq!(log.offset_at(&timed, 0, before).await.unwrap(), 0);
    assert_eq!(log.offset_at(&timed, 0, between).await.unwrap(), 3);
    assert_eq!(log.offset_at(&timed, 0, SystemTime::now() + Duration::from_secs(3600)).await.unwrap(), 5);
    assert_eq!(log.offset_at(&timed, 1, before).await.unwrap(), 0, "an empty partition: its end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_log_keeps_every_promise() {
    let dir = tempfile::tempdir().unwrap();
    let log = EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
    conformance(&log, "t").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iggy_keeps_every_promise() {
    let Some(url) = wakuwaku_tests::iggy_url("the Iggy conformance suite") else { return };
    let log = IggyLog::connect(&url, &wakuwaku_tests::fresh_stream("waku-conformance")).await.unwrap();
    conformance(&log, "t").await;
}
