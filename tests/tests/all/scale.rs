//! Iggy consumer groups: hosts that join one group are handed disjoint
//! partitions that together cover the topic, and the partitions of a
//! member whose connection closes go to the members left; three hosts of
//! one projection (state in PostgreSQL) survive one killed mid-run and one
//! added later; and two hosts of a projection over two co-partitioned
//! timed topics hold each partition index across both, one host at a time,
//! applying every key's events once, in event-time order.
//!
//! Needs a server named by `WAKU_IGGY_URL` (and, for the hosts, one named
//! by `WAKU_POSTGRES_URL`); without them each test prints one `skipped: …`
//! line. Each test uses a stream of its own.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use wakuwaku::authoring::demo::{self, Oracle, WorkloadSpec};
use wakuwaku::authoring::publish;
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::storage::log::{EventLog, IggyLog};
use wakuwaku::storage::state::{PostgresStore, StateStore};
use wakuwaku::storage::stats::Stat;
use wakuwaku_tests::group::GroupHost;
use wakuwaku_tests::{bank_module, fresh_stream, iggy_url, postgres_url, publish_bank};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_members_share_the_partitions_and_a_closed_members_go_to_the_rest() {
    let Some(url) = iggy_url("consumer-group assignment") else { return };
    let stream = fresh_stream("group");
    let a = IggyLog::connect(&url, &stream).await.unwrap();
    a.create_topic("accounts", 4).await.unwrap();
    let b = IggyLog::connect(&url, &stream).await.unwrap();
    let first = a.group_partitions("accounts", "bank").await.unwrap();
    assert_eq!(first, [0, 1, 2, 3], "a lone member holds every partition");
    let held_by_b = b.group_partitions("accounts", "bank").await.unwrap();
    let held_by_a = a.group_partitions("accounts", "bank").await.unwrap();
    let (set_a, set_b): (BTreeSet<u32>, BTreeSet<u32>) =
        (held_by_a.iter().copied().collect(), held_by_b.iter().copied().collect());
    assert!(set_a.is_disjoint(&set_b), "{held_by_a:?} and {held_by_b:?}");
    assert_eq!(set_a.union(&set_b).copied().collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert!(!held_by_a.is_empty() && !held_by_b.is_empty(), "{held_by_a:?} and {held_by_b:?}");

    // B's connection closes (a host that dies): A is given everything.
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held = a.group_partitions("accounts", "bank").await.unwrap();
        if held == [0, 1, 2, 3] {
            break;
        }
        assert!(Instant::now() < deadline, "A still holds {held:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The embedded log has no groups.
    let dir = tempfile::tempdir().unwrap();
    let embedded = wakuwaku::storage::log::EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
    assert!(matches!(
        embedded.group_partitions("accounts", "bank").await,
        Err(wakuwaku::storage::log::LogError::NoConsumerGroups)
    ));
}

/// Waits (a guard against a hang, not a speed target) until `done`.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Three hosts of one projection in one consumer group, state in
/// PostgreSQL; one dies mid-run (killed, as by SIGKILL) and one is added
/// later. The survivors take the dead host's partitions, the read model
/// equals the oracle, and every event is applied exactly once.
#[test]
fn three_hosts_in_a_group_survive_a_killed_one_and_a_late_one_joins() {
    let Some(url) = iggy_url("three hosts in a consumer group") else { return };
    let Some(postgres) = postgres_url("three hosts in a consumer group") else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let stream = fresh_stream("scale");
    let projection = stream.replace('-', "_");
    let module = bank_module();
    let log = runtime.block_on(IggyLog::connect(&url, &stream)).unwrap();
    let mut oracle =
        runtime.block_on(publish_bank(&log, module.clone(), WorkloadSpec { events: 4_000, accounts: 90, seed: 51 }, 6));
    let config = ConsumerConfig { batch_size: 200, ..ConsumerConfig::default() };
    let host = |name: &str| {
        GroupHost::start(&url, &stream, &postgres, (&projection, "bank"), config.clone(), &dir.path().join(name))
    };
    let (a, b, c) = (host("a"), host("b"), host("c"));
    wait_until("the group shares out all six partitions", || {
        let mut held: Vec<u32> = [&a, &b, &c].iter().flat_map(|h| h.held()).collect();
        held.sort_unstable();
        held == [0, 1, 2, 3, 4, 5] && [&a, &b, &c].iter().all(|h| !h.held().is_empty())
    });

    // More events arrive; B dies in the middle of them.
    let more = |seed, oracle: &mut Oracle| {
        let (events, _) = demo::workload(WorkloadSpec { events: 4_000, accounts: 90, seed });
        events.iter().for_each(|event| oracle.apply(event));
        let outgoing = demo::outgoing(&*module, &events).expect("the bank module");
        runtime.block_on(publish::publish(&log, "accounts", module.clone(), outgoing, None, 2)).unwrap();
    };
    more(52, &mut oracle);
    let b_held = b.held();
    b.kill();
    wait_until("A and C took B's partitions", || {
        let survivors: Vec<u32> = a.held().into_iter().chain(c.held()).collect();
        b_held.iter().all(|p| survivors.contains(p))
    });
    // A fourth host joins later and is given a share.
    let d = host("d");
    more(53, &mut oracle);
    wait_until("D holds partitions", || !d.held().is_empty());

    let store = StateStore::from_backend(PostgresStore::connect(&postgres, &projection).unwrap());
    let ends = runtime.block_on(log.end_offsets("accounts")).unwrap();
    wait_until("every partition consumed to its end", || {
        (0..6).all(|p| store.position("accounts", p).unwrap() == Some(ends[p as usize]))
    });
    // A partition moving to D may still be between A and D.
    wait_until("the live hosts hold every partition once", || {
        let mut held: Vec<u32> = [&a, &c, &d].iter().flat_map(|h| h.held()).collect();
        held.sort_unstable();
        held == [0, 1, 2, 3, 4, 5]
    });
    for h in [a, c, d] {
        h.stop();
    }

    let check = demo::check_projection(&oracle, &*module, &store).unwrap();
    assert!(check.matches(), "{}", check.report(10));
    let stats = store.stats().unwrap();
    assert_eq!(stats[Stat::Applied], 12_000, "every event applied exactly once");
}

/// Three hosts in one group while events keep arriving: C joins late, B
/// stops gracefully, A is killed. A planned join and a graceful leave redo
/// nothing (no commit is refused by fencing on any host: the host losing a
/// partition lets it go after its batch in flight, and the one gaining it
/// waits for that), B's partitions are taken by the others, and after A
/// dies C takes everything. The read model equals the oracle and every
/// event is applied exactly once. Handover and failover times are printed
/// (the figures are in BENCHMARKS.md, not asserted).
#[test]
fn a_late_join_and_a_graceful_leave_redo_nothing_and_a_killed_hosts_partitions_move() {
    let Some(url) = iggy_url("rebalances without redone work") else { return };
    let Some(postgres) = postgres_url("rebalances without redone work") else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let stream = fresh_stream("moves");
    let projection = stream.replace('-', "_");
    let module = bank_module();
    let log = std::sync::Arc::new(runtime.block_on(IggyLog::connect(&url, &stream)).unwrap());
    let spec = |seed| WorkloadSpec { events: 6_000, accounts: 120, seed };
    let mut oracle = runtime.block_on(publish_bank(&*log, module.clone(), spec(71), 6));
    let config = ConsumerConfig { batch_size: 100, ..ConsumerConfig::default() };
    let host = |name: &str| {
        GroupHost::start(&url, &stream, &postgres, (&projection, "bank"), config.clone(), &dir.path().join(name))
    };
    // Events keep arriving in the background while hosts come and go.
    let publishing = |seed, oracle: &mut Oracle| {
        let (events, _) = demo::workload(spec(seed));
        events.iter().for_each(|event| oracle.apply(event));
        let outgoing = demo::outgoing(&*module, &events).expect("the bank module");
        let (log, module) = (log.clone(), module.clone());
        runtime.spawn(async move { publish::publish(&*log, "accounts", module, outgoing, None, 2).await.unwrap() })
    };
    let held_by = |hosts: &[&GroupHost]| {
        let mut held: Vec<u32> = hosts.iter().flat_map(|h| h.held()).collect();
        held.sort_unstable();
        held
    };
    let (a, b) = (host("a"), host("b"));
    wait_until("A and B share all six partitions", || {
        held_by(&[&a, &b]) == [0, 1, 2, 3, 4, 5] && !a.held().is_empty() && !b.held().is_empty()
    });

    // C joins while A and B are busy.
    let more = publishing(72, &mut oracle);
    let c = host("c");
    wait_until("C holds partitions", || !c.held().is_empty() && held_by(&[&a, &b, &c]) == [0, 1, 2, 3, 4, 5]);
    runtime.block_on(more).unwrap();
    assert_eq!((a.redone(), b.redone(), c.redone()), (0, 0, 0), "a planned join redid events");

    // B stops gracefully while events arrive: the others take its partitions.
    let more = publishing(73, &mut oracle);
    let b_held = b.held();
    let stopping = Instant::now();
    let b_summary = b.stop();
    let stopped = stopping.elapsed();
    wait_until("A and C took B's partitions", || held_by(&[&a, &c]) == [0, 1, 2, 3, 4, 5]);
    let handover = stopping.elapsed();
    runtime.block_on(more).unwrap();
    assert_eq!(b_summary.redone, 0, "B redid events");
    assert_eq!((a.redone(), c.redone()), (0, 0), "a graceful leave redid events");
    eprintln!("graceful leave of {b_held:?}: stopped in {stopped:?}, taken by the others after {handover:?}");

    // A dies while events arrive: C takes everything.
    let more = publishing(74, &mut oracle);
    let a_held = a.held();
    let killing = Instant::now();
    a.kill();
    wait_until("C took A's partitions", || c.held() == [0, 1, 2, 3, 4, 5]);
    eprintln!("kill of {a_held:?}: taken by C after {:?}", killing.elapsed());
    runtime.block_on(more).unwrap();

    let store = StateStore::from_backend(PostgresStore::connect(&postgres, &projection).unwrap());
    let ends = runtime.block_on(log.end_offsets("accounts")).unwrap();
    wait_until("every partition consumed to its end", || {
        (0..6).all(|p| store.position("accounts", p).unwrap() == Some(ends[p as usize]))
    });
    let c_redone = c.redone();
    c.stop();
    assert_eq!(c_redone, 0, "C, which only gained partitions, redid events");
    let check = demo::check_projection(&oracle, &*module, &store).unwrap();
    assert!(check.matches(), "{}", check.report(10));
    let stats = store.stats().unwrap();
    assert_eq!(stats[Stat::Applied], 24_000, "every event applied exactly once");
}

/// The probe's `TimedLedger`, a timed type: `seq` rises with each key's
/// event time, and the module counts `out_of_order` when it sees it fall.
const LEDGER: wakuwaku::event::EventTypeTag = wakuwaku::event::EventTypeTag::new(51);
/// The topics of the projection over several topics, co-partitioned.
const TIMED_TOPICS: [&str; 2] = ["early", "late"];

/// Each key's `per_key` ledger entries (key, seq, amount, event time), the
/// topic of each alternating so each key's history interleaves the two,
/// appended to the key's partition of every topic in event-time order.
/// Returns the entries.
async fn publish_timed_history(log: &IggyLog, keys: u64, per_key: u64, partitions: u32) -> Vec<(u64, u64, i64)> {
    use wakuwaku::event::{Header, header_name, partition_for};
    const BASE_MS: i64 = 1_796_169_600_000;
    let mut entries: Vec<(i64, usize, u64, u64, i64)> = (0..keys)
        .flat_map(|key| (1..=per_key).map(move |seq| (key, seq)))
        .map(|(key, seq)| {
            let at = BASE_MS + seq as i64 * 1000 + key as i64;
            (at, ((key + seq) % 2) as usize, key, seq, ((key * 7 + seq) % 5) as i64 + 1)
        })
        .collect();
    entries.sort_unstable();
    for (topic_index, topic) in TIMED_TOPICS.iter().enumerate() {
        let mut batches: Vec<(u32, Vec<wakuwaku::storage::log::Record>)> =
            (0..partitions).map(|p| (p, Vec::new())).collect();
        for &(at, _, key, seq, amount) in entries.iter().filter(|entry| entry.1 == topic_index) {
            let body =
                serde_json::json!({ "key": key, "seq": seq, "amount": amount, "fail": null, "ordering": "relaxed" });
            let mut record = wakuwaku_tests::json_record(LEDGER, key, body);
            record.headers.push(Header { name: header_name::EVENT_TIME.into(), value: at.to_le_bytes().to_vec() });
            let partition = partition_for(wakuwaku::key::Key::int(key).key_hash(), partitions);
            batches[partition as usize].1.push(record);
        }
        // In appends of at most 500 records a partition.
        for (partition, records) in batches {
            for chunk in records.chunks(500) {
                log.append(topic, vec![(partition, chunk.to_vec())]).await.unwrap();
            }
        }
    }
    entries.into_iter().map(|(_, _, key, seq, amount)| (key, seq, amount)).collect()
}

/// The partitions two hosts both hold at one instant. Each is read twice
/// around the other's reads (B, A, B): a partition moving from A to B shows
/// in A before and in B after, so only one showing in all three reads was
/// held by both at once, whichever way it moves.
fn held_by_both(a: &GroupHost, b: &GroupHost) -> Vec<u32> {
    let before = b.held();
    let held_by_a = a.held();
    let after = b.held();
    held_by_a.into_iter().filter(|p| before.contains(p) && after.contains(p)).collect()
}

/// Every partition index a host's release stages show reads every topic
/// of the projection: a key's events from each topic meet on that host.
fn reads_every_topic(host: &GroupHost) -> bool {
    host.timing().iter().all(|timing| {
        let topics: Vec<&str> = timing.inputs.iter().map(|input| input.topic.as_str()).collect();
        topics == TIMED_TOPICS
    })
}

/// Whether a host's release stages show every partition index it holds
/// (one shows a moment after the index is taken).
fn shows_held(host: &GroupHost) -> bool {
    let shown: Vec<u32> = host.timing().iter().map(|timing| timing.partition).collect();
    host.held().iter().all(|p| shown.contains(p))
}

/// Two hosts of a projection over two co-partitioned timed topics, one
/// consumer group, state in PostgreSQL: each partition index is held by
/// one host at a time, across both topics (the group assigns indexes of
/// the first topic; the host holding one reads it in every topic). B joins
/// while A reads the history and stops gracefully half way, handing its
/// indexes (with what their release stages held) back to A. Every key's
/// entries are applied exactly once, in event-time order (the oracle: each
/// key's entries sorted by event time), with no order violation.
#[test]
fn two_hosts_in_a_group_share_co_partitioned_timed_topics_by_partition_index() {
    let Some(url) = iggy_url("two hosts sharing timed topics by partition index") else { return };
    let Some(postgres) = postgres_url("two hosts sharing timed topics by partition index") else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let stream = fresh_stream("timed-group");
    let projection = stream.replace('-', "_");
    let partitions = 4;
    let (keys, per_key) = (60, 60);
    let log = runtime.block_on(IggyLog::connect(&url, &stream)).unwrap();
    for topic in TIMED_TOPICS {
        runtime.block_on(log.create_topic(topic, partitions)).unwrap();
    }
    let entries = runtime.block_on(publish_timed_history(&log, keys, per_key, partitions));
    let total = entries.len() as i128;
    // Small batches, so that B joins (a second or more after A) while A
    // is still reading the history.
    let config = ConsumerConfig { batch_size: 8, ..ConsumerConfig::default() };
    let probe = wakuwaku_tests::probe_wasm();
    let host = |name: &str| {
        let names = (projection.as_str(), "ledger");
        GroupHost::start_over(
            &url,
            &stream,
            &postgres,
            names,
            (&TIMED_TOPICS, &probe),
            config.clone(),
            &dir.path().join(name),
        )
    };
    let store = StateStore::from_backend(PostgresStore::connect(&postgres, &projection).unwrap());
    let applied = || store.counters().unwrap().into_iter().find(|(name, _)| name == "ledger").map_or(0, |(_, n)| n);
    let started = Instant::now();
    let (a, b) = (host("a"), host("b"));
    let owned_once = |a: &GroupHost, b: &GroupHost| {
        let both = held_by_both(a, b);
        assert!(both.is_empty(), "partitions {both:?} held by both hosts at once");
        assert!(reads_every_topic(a) && reads_every_topic(b), "{:?} {:?}", a.timing(), b.timing());
    };
    let held = |hosts: &[&GroupHost]| {
        let mut held: Vec<u32> = hosts.iter().flat_map(|h| h.held()).collect();
        held.sort_unstable();
        held
    };
    wait_until("A and B share the four partition indexes", || {
        owned_once(&a, &b);
        let shared = held(&[&a, &b]) == [0, 1, 2, 3] && !a.held().is_empty() && !b.held().is_empty();
        shared && shows_held(&a) && shows_held(&b)
    });
    assert!(applied() < total, "A read the whole history before B joined: make it longer");
    eprintln!("shared after {:?}, {} of {total} applied", started.elapsed(), applied());
    wait_until("half the history applied", || {
        owned_once(&a, &b);
        applied() >= total / 2
    });
    let b_summary = b.stop();
    eprintln!("B stopped after {:?}", started.elapsed());
    wait_until("A holds every index and applied the history", || {
        reads_every_topic(&a) && a.held() == [0, 1, 2, 3] && shows_held(&a) && applied() == total
    });
    eprintln!("A applied the rest after {:?}", started.elapsed());
    let ends: Vec<Vec<u64>> =
        TIMED_TOPICS.iter().map(|topic| runtime.block_on(log.end_offsets(topic)).unwrap()).collect();
    wait_until("every partition of both topics committed to its end", || {
        TIMED_TOPICS
            .iter()
            .zip(&ends)
            .all(|(topic, ends)| (0..partitions).all(|p| store.position(topic, p).unwrap() == Some(ends[p as usize])))
    });
    let a_summary = a.stop();
    assert!(b_summary.applied > 0, "B applied none of the history: {b_summary:?}");
    assert_eq!(a_summary.order_violations + b_summary.order_violations, 0, "order violations");

    let counters: std::collections::HashMap<String, i128> = store.counters().unwrap().into_iter().collect();
    assert_eq!(counters.get("out_of_order"), None, "a key saw its entries out of event-time order");
    assert_eq!(counters.get("ledger").copied(), Some(total));
    let stats = store.stats().unwrap();
    assert_eq!(stats[Stat::Applied], total as u64, "every entry applied exactly once");
    assert_eq!(stats[Stat::OrderViolations], 0);
    // The oracle: each key's entries in event-time order (as published).
    for key in 0..keys {
        let mine: Vec<&(u64, u64, i64)> = entries.iter().filter(|entry| entry.0 == key).collect();
        let read = |name: &str| -> i64 {
            let bytes = store.get(&wakuwaku::key::Key::int(key), name).unwrap().expect("the key's state");
            serde_json::from_slice(&bytes).unwrap()
        };
        assert_eq!(read("seq"), mine.last().unwrap().1 as i64, "key {key}'s last entry");
        assert_eq!(read("balance"), mine.iter().map(|entry| entry.2).sum::<i64>(), "key {key}'s balance");
    }
}
