//! The platform on a three-node Apache Iggy cluster whose nodes die: the
//! leader SIGKILLed mid-run (several times), a follower killed, the whole
//! cluster stopped and started, the host's link to the leader cut by a
//! proxy (the leader running on), a publish through a failover, and a
//! group of three hosts (state in PostgreSQL, `WAKU_POSTGRES_URL`) losing
//! one host and the leader at once. Each checks every event applied
//! exactly once against the oracle, that the log still holds what was
//! published, and that nothing hung (each run has a deadline).
//!
//! Every test starts its own cluster on free loopback ports from the
//! server binary named by `WAKU_IGGY_SERVER`
//! ([`wakuwaku_tests::iggy_cluster`]), and otherwise prints one line saying
//! it was skipped. One test runs at a time: three nodes each are all a
//! small machine takes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku::authoring::publish;
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::engine::progress::Progress;
use wakuwaku::operations::host::{Host, HostSettings};
use wakuwaku::storage::log::{EventLog, IggyLog};
use wakuwaku_tests::iggy_cluster::IggyCluster;
use wakuwaku_tests::{bank_module, check_bank_store, host_settings, publish_bank};

/// Held by each test for its whole run.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const TOPIC: &str = "accounts";
const PARTITIONS: u32 = 4;
/// How long a node's death may hold a run up, at most, before the test
/// calls it hung.
const RUN_LIMIT: Duration = Duration::from_secs(300);

fn bank_host(dir: &std::path::Path) -> HostSettings {
    let config = ConsumerConfig {
        batch_size: 200,
        log_backoff: (Duration::from_millis(50), Duration::from_millis(500)),
        ..ConsumerConfig::default()
    };
    host_settings(&dir.join("host"), "bank", TOPIC, vec![bank_module()], config)
}

/// Waits until the consumer has replayed `events`, or 120 s.
async fn replayed(progress: &Progress, events: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while progress.replayed().0 < events && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How the host reaches the cluster's nodes.
enum Links {
    Direct,
    /// Through a proxy per node, which a test can cut.
    BehindProxies,
}

/// Publishes the bank workload `spec` through the cluster, runs a host
/// over it with `disturb` acting on the cluster meanwhile, and checks the
/// read model against the oracle: every event applied once.
async fn bank_through<F, Fut>(what: &str, spec: WorkloadSpec, links: Links, disturb: F) -> Option<u64>
where
    F: FnOnce(IggyCluster, Arc<Progress>) -> Fut,
    Fut: Future<Output = IggyCluster> + Send + 'static,
{
    let _one = ONE_AT_A_TIME.lock().await;
    show_log_on_failure();
    let cluster = match links {
        Links::Direct => IggyCluster::from_env(what)?,
        Links::BehindProxies => IggyCluster::from_env_behind_proxies(what).await?,
    };
    cluster.leader(Duration::from_secs(60)).await.expect("the cluster elects a leader");
    let url = cluster.url();
    let publisher = IggyLog::connect(&url, "waku-cluster").await.unwrap();
    let oracle = publish_bank(&publisher, bank_module(), spec, PARTITIONS).await;
    drop(publisher);

    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(IggyLog::connect(&url, "waku-cluster").await.unwrap());
    let published = contents(&log).await;
    let host = Host::start_on(log.clone(), bank_host(dir.path())).await.unwrap();
    let projection = host.projection().clone();
    let mut disturbing = tokio::spawn(disturb(cluster, host.progress().clone()));
    let run = tokio::time::timeout(RUN_LIMIT, host.finished());
    tokio::pin!(run);
    // A disturbance that failed (a node that did not come back) ends the
    // test at once, not after the run's limit.
    let disturbed = |joined: Result<IggyCluster, tokio::task::JoinError>| {
        joined.unwrap_or_else(|e| panic!("{what}: disturbing the cluster failed: {e}"))
    };
    let (cluster, finished) = tokio::select! {
        joined = &mut disturbing => (disturbed(joined), run.await),
        finished = &mut run => (disturbed(disturbing.await), finished),
    };
    // A failure of the server itself is told apart from the host's.
    let what = format!("{what}{}", cluster.server_panics());
    let summary = finished.unwrap_or_else(|_| panic!("{what}: the host caught up within {RUN_LIMIT:?}")).unwrap();
    let after = contents(&log).await;
    for (partition, (before, after)) in published.iter().zip(&after).enumerate() {
        let differ = before.iter().zip(after).filter(|(a, b)| a != b).count();
        assert!(
            before.len() == after.len() && differ == 0,
            "{what}: partition {partition} holds what was published: {} records then, {} now, {differ} differ",
            before.len(),
            after.len()
        );
    }
    let mut places = Vec::new();
    for partition in 0..PARTITIONS {
        let position = projection.store().position(TOPIC, partition).unwrap();
        places.push((position, log.end_offset(TOPIC, partition).await.unwrap()));
    }
    assert_eq!(
        (summary.applied, summary.dead_lettered),
        (spec.events as u64, 0),
        "{what}: every event once (positions and ends {places:?})"
    );
    // One host holds every partition throughout: nothing to redo.
    assert_eq!(summary.redone, 0, "{what}: no event redone");
    let check = check_bank_store(&oracle, projection.store());
    assert!(check.matches(), "{what}: {}", check.report(5));
    for (partition, (position, end)) in places.into_iter().enumerate() {
        assert_eq!(position, Some(end), "{what}: partition {partition}");
    }
    drop(cluster);
    Some(log.failovers())
}

/// The host's log lines, written where the test harness keeps them: shown
/// with a failing test's output (`RUST_LOG` chooses them; the host's
/// warnings and its informational lines by default).
fn show_log_on_failure() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn,wakuwaku=info,iggy=off"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

/// The bodies of each partition of the bank's topic, read from the log.
async fn contents(log: &IggyLog) -> Vec<Vec<Vec<u8>>> {
    let mut partitions = Vec::new();
    for partition in 0..PARTITIONS {
        let (mut bodies, mut from) = (Vec::new(), 0);
        loop {
            let read = log.read(TOPIC, partition, from, 4096).await.unwrap();
            let Some(last) = read.last() else { break };
            from = last.offset + 1;
            bodies.extend(read.into_iter().map(|stored| stored.record.body));
        }
        partitions.push(bodies);
    }
    partitions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_three_times_mid_run_loses_and_repeats_nothing() {
    let spec = WorkloadSpec { events: 30_000, accounts: 500, seed: 21 };
    let failovers = bank_through("leader kills", spec, Links::Direct, |mut cluster, progress| async move {
        for at in [5_000, 12_000, 19_000] {
            replayed(&progress, at).await;
            let leader = cluster.leader(Duration::from_secs(60)).await.expect("a leader");
            cluster.kill(leader);
            tokio::time::sleep(Duration::from_secs(1)).await;
            cluster.start(leader);
        }
        cluster
    })
    .await;
    if let Some(failovers) = failovers {
        assert!(failovers >= 3, "each kill of the leader moved the host: {failovers} failovers");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_killed_mid_run_moves_nothing() {
    let spec = WorkloadSpec { events: 20_000, accounts: 500, seed: 22 };
    let failovers = bank_through("a follower's kill", spec, Links::Direct, |mut cluster, progress| async move {
        replayed(&progress, 6_000).await;
        let leader = cluster.leader(Duration::from_secs(60)).await.expect("a leader");
        let follower = (leader + 1) % 3;
        cluster.kill(follower);
        replayed(&progress, 14_000).await;
        cluster.start(follower);
        cluster
    })
    .await;
    if let Some(failovers) = failovers {
        assert_eq!(failovers, 0, "the host stayed on the leader");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_cluster_stopped_and_started_mid_run_loses_nothing() {
    let spec = WorkloadSpec { events: 20_000, accounts: 500, seed: 23 };
    bank_through("the whole cluster's restart", spec, Links::Direct, |mut cluster, progress| async move {
        replayed(&progress, 6_000).await;
        for node in 0..3 {
            cluster.stop(node);
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        for node in 0..3 {
            cluster.start(node);
        }
        cluster
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_link_cut_by_a_proxy_loses_and_repeats_nothing() {
    let spec = WorkloadSpec { events: 24_000, accounts: 500, seed: 25 };
    let failovers = bank_through("links cut", spec, Links::BehindProxies, |cluster, progress| async move {
        // The leader runs on throughout: only the host's connections to it
        // are dropped, twice at once, then for longer than a failover takes.
        let leader = cluster.leader(Duration::from_secs(60)).await.expect("a leader");
        for (at, down) in [(4_000, Duration::ZERO), (9_000, Duration::ZERO), (14_000, Duration::from_secs(5))] {
            replayed(&progress, at).await;
            cluster.cut_link(leader, down).await;
        }
        cluster
    })
    .await;
    if let Some(failovers) = failovers {
        // A cut that falls between two calls may cost no failover; the
        // five seconds' one cannot.
        assert!(failovers >= 1, "the cuts moved the host: {failovers} failovers");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_through_a_failover_stores_every_line_once() {
    let _one = ONE_AT_A_TIME.lock().await;
    show_log_on_failure();
    let Some(mut cluster) = IggyCluster::from_env("a publish through a failover") else { return };
    let leader = cluster.leader(Duration::from_secs(60)).await.expect("the cluster elects a leader");
    let log = IggyLog::connect(&cluster.url(), "waku-cluster").await.unwrap();
    log.create_topic(TOPIC, PARTITIONS).await.unwrap();
    let module = bank_module();
    let (events, _) = demo::workload(WorkloadSpec { events: 60_000, accounts: 500, seed: 24 });
    let outgoing = demo::outgoing(&*module, &events).unwrap();
    let mut expected: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
    for event in &outgoing {
        *expected.entry(event.body.clone()).or_default() += 1;
    }
    let publishing = async { publish::publish(&log, TOPIC, module.clone(), outgoing, None, 2).await };
    let killing = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cluster.kill(leader);
    };
    let (published, ()) = tokio::join!(publishing, killing);
    let published = published.expect("the publish waited out the election");
    assert_eq!(published, 60_000);
    let mut seen: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
    for partition in 0..PARTITIONS {
        let end = log.end_offset(TOPIC, partition).await.unwrap();
        let mut from = 0;
        while from < end {
            for stored in log.read(TOPIC, partition, from, 4096).await.unwrap() {
                from = stored.offset + 1;
                *seen.entry(stored.record.body).or_default() += 1;
            }
        }
    }
    assert!(log.failovers() >= 1, "the publisher failed over");
    assert!(seen == expected, "every line stored once: {} bodies seen, {} expected", seen.len(), expected.len());
}

/// Every `waku` command with a cluster URL whose first node, the leader,
/// was SIGKILLed: each finds a live node and does its work (the topic
/// made, the events published, the projection caught up, the rest
/// answering), as long as a majority is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_works_with_the_first_node_and_leader_dead() {
    let _one = ONE_AT_A_TIME.lock().await;
    show_log_on_failure();
    let Some(mut cluster) = IggyCluster::from_env("the commands on a cluster") else { return };
    // The leader, named first in the URL, killed.
    let leader = cluster.leader(Duration::from_secs(60)).await.expect("a leader");
    let order = [leader, (leader + 1) % 3, (leader + 2) % 3];
    let url = format!("iggy://iggy:iggy@{}", order.map(|node| cluster.address(node)).join(","));
    cluster.kill(leader);
    cluster.leader(Duration::from_secs(60)).await.expect("the two left elect a leader");
    let dir = tempfile::tempdir().unwrap();
    let stream = wakuwaku_tests::fresh_stream("waku-commands");
    let (data, modules) = (dir.path().join("data"), dir.path().join("modules"));
    std::fs::create_dir_all(&modules).unwrap();
    std::fs::copy(wakuwaku_tests::bank_wasm(), modules.join("bank.wasm")).unwrap();
    let (events, _) = demo::workload(WorkloadSpec { events: 3_000, accounts: 100, seed: 26 });
    let lines: String =
        events.iter().map(|e| serde_json::json!({ "type": e.type_name, "body": e.body }).to_string() + "\n").collect();
    let file = dir.path().join("events.jsonl");
    std::fs::write(&file, lines).unwrap();
    let waku = |args: &[&str]| {
        let mut all: Vec<String> = ["waku", "--log-level", "warn"].iter().map(|a| a.to_string()).collect();
        all.extend(args.iter().map(|a| a.to_string()));
        all.extend(["--iggy", &url, "--stream", &stream, "--data", data.to_str().unwrap()].map(String::from));
        let shown = args.join(" ");
        async move {
            let code = tokio::task::spawn_blocking(move || wakuwaku::cli::main_with(all.iter().map(Into::into)));
            assert_eq!(code.await.unwrap(), std::process::ExitCode::SUCCESS, "waku {shown} through the cluster");
        }
    };
    let (bank, file) = (wakuwaku_tests::bank_wasm(), file.to_str().unwrap().to_owned());
    waku(&["topic", "create", "--topic", TOPIC, "--partitions", "4"]).await;
    waku(&["publish", "--topic", TOPIC, "--module", bank.to_str().unwrap(), &file]).await;
    waku(&["topic", "list"]).await;
    waku(&["topic", "describe", "--topic", TOPIC]).await;
    let run = ["run", "--projection", "bank", "--topic", TOPIC, "--modules", modules.to_str().unwrap()];
    waku(&[&run[..], &["--until-caught-up"]].concat()).await;
    waku(&["status", "--projection", "bank", "--topic", TOPIC]).await;
    waku(&["dlq", "list", "--projection", "bank", "--topic", TOPIC]).await;
    waku(&["modules", "list", "--projection", "bank"]).await;
    waku(&["reset", "--projection", "bank", "--topic", TOPIC, "--to", "earliest", "--yes"]).await;
    waku(&["rebuild", "--projection", "bank", "--topic", TOPIC, "--modules", modules.to_str().unwrap()]).await;
    waku(&[&run[..], &["--until-caught-up"]].concat()).await;

    let log = IggyLog::connect(&url, &stream).await.unwrap();
    assert_eq!(log.partitions(TOPIC).await.unwrap(), 4, "the topic made with its partitions");
    let ends = log.end_offsets(TOPIC).await.unwrap();
    assert_eq!(ends.iter().sum::<u64>(), 3_000, "every line published once");
    for (partition, end) in ends.into_iter().enumerate() {
        let consumed = log.consumer_offset("bank", TOPIC, partition as u32).await.unwrap();
        assert_eq!(consumed, Some(end), "partition {partition} consumed to its end, after the reset too");
    }
}

/// Three hosts of one projection in a consumer group over the cluster,
/// state in PostgreSQL (`WAKU_POSTGRES_URL`); one host is killed at the
/// same moment as the leader, while events arrive. The two survivors fail
/// over, rejoin the group, take the dead host's partitions, and the read
/// model equals the oracle with every event applied exactly once.
/// (Iggy never logs out the sessions a dead node held: without the
/// group made afresh after a failover, their partitions stayed unread.)
#[test]
fn a_group_of_three_loses_a_host_and_the_leader_at_once_and_applies_every_event_once() {
    use wakuwaku::storage::state::{PostgresStore, StateStore};
    use wakuwaku::storage::stats::Stat;
    use wakuwaku_tests::group::GroupHost;

    let _one = ONE_AT_A_TIME.blocking_lock();
    show_log_on_failure();
    let what = "a group over the cluster";
    let Some(postgres) = wakuwaku_tests::postgres_url(what) else { return };
    let Some(mut cluster) = IggyCluster::from_env(what) else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    runtime.block_on(cluster.leader(Duration::from_secs(60))).expect("the cluster elects a leader");
    let (url, dir) = (cluster.url(), tempfile::tempdir().unwrap());
    let stream = wakuwaku_tests::fresh_stream("cluster-group");
    let projection = stream.replace('-', "_");
    let module = bank_module();
    let log = runtime.block_on(IggyLog::connect(&url, &stream)).unwrap();
    let spec = WorkloadSpec { events: 4_000, accounts: 90, seed: 61 };
    let mut oracle = runtime.block_on(publish_bank(&log, module.clone(), spec, 6));
    let config = ConsumerConfig {
        batch_size: 100,
        log_backoff: (Duration::from_millis(50), Duration::from_millis(500)),
        ..ConsumerConfig::default()
    };
    let host = |name: &str| {
        GroupHost::start(&url, &stream, &postgres, (&projection, "bank"), config.clone(), &dir.path().join(name))
    };
    let (a, b, c) = (host("a"), host("b"), host("c"));
    wait_until("the group shares out all six partitions", || [&a, &b, &c].iter().all(|h| !h.held().is_empty()));
    let (events, _) = demo::workload(WorkloadSpec { events: 4_000, accounts: 90, seed: 62 });
    events.iter().for_each(|event| oracle.apply(event));
    let outgoing = demo::outgoing(&*module, &events).unwrap();
    runtime.block_on(publish::publish(&log, TOPIC, module.clone(), outgoing, None, 2)).unwrap();
    let leader = runtime.block_on(cluster.leader(Duration::from_secs(60))).expect("a leader");
    b.kill();
    cluster.kill(leader);
    cluster.start(leader);

    let store = StateStore::from_backend(PostgresStore::connect(&postgres, &projection).unwrap());
    // The test's own client fails over too: asked again until it answers.
    let ends = runtime.block_on(async {
        loop {
            match log.end_offsets(TOPIC).await {
                Ok(ends) => break ends,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    });
    wait_until("every partition consumed to its end", || {
        let done = (0..6).all(|p| store.position(TOPIC, p).unwrap() == Some(ends[p as usize]));
        if !done && std::env::var_os("WAKU_TEST_SHOW_GROUP").is_some() {
            let positions: Vec<_> = (0..6).map(|p| store.position(TOPIC, p).unwrap()).collect();
            eprintln!("A holds {:?}, C holds {:?}; positions {positions:?} of {ends:?}", a.held(), c.held());
        }
        done
    });
    for h in [a, c] {
        h.stop();
    }
    let check = demo::check_projection(&oracle, &*module, &store).unwrap();
    assert!(check.matches(), "{}", check.report(10));
    assert_eq!(store.stats().unwrap()[Stat::Applied], 8_000, "every event applied exactly once");
}

/// Waits (a guard against a hang, not a speed target) until `done`.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + RUN_LIMIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
