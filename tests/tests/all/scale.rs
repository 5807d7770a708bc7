//! Iggy consumer groups: hosts that join one group are handed disjoint
//! partitions that together cover the topic, and the partitions of a
//! member whose connection closes go to the members left; three hosts of
//! one projection (state in PostgreSQL) survive one killed mid-run and one
//! added later.
//!
//! Needs a server named by `WAKU_IGGY_URL` (and, for the hosts, one named
//! by `WAKU_POSTGRES_URL`); without them each test prints one `skipped: …`
//! line. Each test uses a stream of its own.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use wakuwaku::consumer::{ConsumerConfig, stat};
use wakuwaku::demo::{self, Oracle, WorkloadSpec};
use wakuwaku::log::{EventLog, IggyLog};
use wakuwaku::publish;
use wakuwaku::state::{PostgresStore, StateStore};
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
    let embedded = wakuwaku::log::EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
    assert!(matches!(
        embedded.group_partitions("accounts", "bank").await,
        Err(wakuwaku::log::LogError::NoConsumerGroups)
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
    let stats: std::collections::HashMap<_, _> = store.stats().unwrap().into_iter().collect();
    assert_eq!(stats.get(stat::APPLIED).copied(), Some(12_000), "every event applied exactly once");
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
    let stats: std::collections::HashMap<_, _> = store.stats().unwrap().into_iter().collect();
    assert_eq!(stats.get(stat::APPLIED).copied(), Some(24_000), "every event applied exactly once");
}
