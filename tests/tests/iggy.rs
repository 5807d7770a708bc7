//! The platform on Apache Iggy, end to end: the bank projection against the
//! oracle, Iggy's own consumer offsets (and how they follow the commits),
//! two hosts sharing a topic, a server that goes away mid-run, producer
//! stamps read back by a fresh client, and emits, retries and dead letters
//! through Iggy topics.
//!
//! Every test needs a server named by `WAKU_IGGY_URL` (for example
//! `iggy://iggy:iggy@127.0.0.1:8090`) and otherwise prints one line saying
//! it was skipped. Each uses a stream of its own. The restart tests also
//! need `WAKU_IGGY_RESTART`, a shell command that kills that server with
//! SIGKILL (no shutdown hook flushes anything) and starts it again: what
//! the server acknowledged must survive that, and does only on durable
//! topics (see `wakuwaku::storage::log::iggy`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use wakuwaku::authoring::demo::{self, Oracle, WorkloadSpec};
use wakuwaku::authoring::publish::{self, Outgoing};
use wakuwaku::engine::consumer::{ConsumerConfig, Summary};
use wakuwaku::engine::routing::RoutedTopics;
use wakuwaku::event::partition_for;
use wakuwaku::operations::host::{Host, HostSettings};
use wakuwaku::storage::log::{EventLog, IggyLog};
use wakuwaku::storage::state::StateStore;
use wakuwaku::storage::stats::Stats;
use wakuwaku_tests::proxy::{CuttableProxy, upstream_of};
use wakuwaku_tests::{
    bank_module, catch_up, fresh_stream, host_settings, iggy_url, json_record, probe_module, publish_bank,
};

/// Held shared by every test, and alone by the one that restarts the
/// server, so no other test sees the restart.
static SERVER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

const TOPIC: &str = "accounts";
const PARTITIONS: u32 = 4;

/// A host of the bank projection (its state in `dir/<host>`) that runs
/// until caught up.
fn bank_host(dir: &std::path::Path, host: &str, config: ConsumerConfig) -> HostSettings {
    host_settings(&dir.join(host), "bank", TOPIC, vec![bank_module()], config)
}

fn config(batch_size: usize) -> ConsumerConfig {
    ConsumerConfig {
        batch_size,
        log_backoff: (Duration::from_millis(50), Duration::from_millis(500)),
        ..ConsumerConfig::default()
    }
}

/// The oracle check over the stores of several hosts, each holding the
/// accounts of its partitions; every store must hold positions for its
/// own partitions only.
fn check_hosts(oracle: &Oracle, hosts: &[(&[u32], &StateStore)]) -> demo::OracleCheck {
    let module = bank_module();
    let opened = demo::bank_tag(&*module, demo::event_name::OPENED).unwrap();
    let mut instance = module.instantiate().unwrap();
    let counter = |store: &StateStore| {
        store.counters().unwrap().into_iter().find(|(name, _)| name == demo::OPEN_ACCOUNTS).map_or(0, |(_, v)| v)
    };
    for (partitions, store) in hosts {
        for partition in 0..PARTITIONS {
            let position = store.position(TOPIC, partition).unwrap();
            assert_eq!(position.is_some(), partitions.contains(&partition), "partition {partition}: {position:?}");
        }
    }
    let open_accounts = hosts.iter().map(|(_, store)| counter(store)).sum();
    demo::check(oracle, open_accounts, |account| -> Result<_, ()> {
        let body = serde_json::to_vec(&serde_json::json!({ "account": account, "owner": "" })).unwrap();
        let key = instance.key(opened, &body).unwrap();
        let partition = partition_for(key.key_hash(), PARTITIONS);
        let (_, store) = hosts.iter().find(|(partitions, _)| partitions.contains(&partition)).expect("an owner");
        Ok(store.get(&key, demo::ACCOUNT_ENTRY).unwrap())
    })
    .unwrap()
}

/// Every partition's position in `store` has reached the log's end.
async fn caught_up(log: &IggyLog, stores: &[&StateStore]) -> bool {
    for partition in 0..PARTITIONS {
        let end = log.end_offset(TOPIC, partition).await.unwrap();
        let position = stores.iter().find_map(|store| store.position(TOPIC, partition).unwrap()).unwrap_or(0);
        if position < end {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bank_projection_on_iggy_matches_the_oracle_and_iggy_shows_its_progress() {
    let Some(url) = iggy_url("the bank projection on Iggy") else { return };
    let _shared = SERVER.read().await;
    let log = Arc::new(IggyLog::connect(&url, &fresh_stream("waku-test-bank")).await.unwrap());
    let spec = WorkloadSpec { events: 20_000, accounts: 500, seed: 11 };
    let oracle = publish_bank(&*log, bank_module(), spec, PARTITIONS).await;

    let dir = tempfile::tempdir().unwrap();
    let (summary, projection) = catch_up(&log, bank_host(dir.path(), "host", config(1000))).await.unwrap();
    assert_eq!((summary.applied, summary.dead_lettered), (20_000, 0));
    let check = check_hosts(&oracle, &[(&[0, 1, 2, 3], projection.store())]);
    assert!(check.matches(), "{}", check.report(5));
    for partition in 0..PARTITIONS {
        let end = log.end_offset(TOPIC, partition).await.unwrap();
        assert!(end > 0);
        assert_eq!(projection.store().position(TOPIC, partition).unwrap(), Some(end));
        // What Iggy's own tools read as the consumer group's progress.
        assert_eq!(log.consumer_offset("bank", TOPIC, partition).await.unwrap(), Some(end), "partition {partition}");
    }
    for routed in ["retry_accounts", "dlq_accounts"] {
        assert_eq!(log.partitions(routed).await.unwrap(), PARTITIONS, "{routed}");
    }
}

/// Iggy's stored offsets are what its own tools and its consumer groups'
/// cooperative join go by, so they follow the commits: never ahead of
/// what the state store committed (a host that dies must not have told
/// Iggy it consumed what it never committed), and at most the batch
/// committed but not yet settled, plus the one being committed while we
/// look, behind it, moving as the host consumes, not only at its stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iggy_offsets_follow_the_commits_and_never_run_ahead_of_them() {
    let Some(url) = iggy_url("Iggy offsets following the commits") else { return };
    let _shared = SERVER.read().await;
    let stream = fresh_stream("waku-test-offsets");
    let publisher = IggyLog::connect(&url, &stream).await.unwrap();
    publisher.create_topic(TOPIC, PARTITIONS).await.unwrap();
    let module = bank_module();
    let (events, oracle) = demo::workload(WorkloadSpec { events: 20_000, accounts: 500, seed: 13 });
    let outgoing: Vec<Outgoing> = demo::outgoing(&*module, &events).expect("the bank module");

    const BATCH: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(IggyLog::connect(&url, &stream).await.unwrap());
    let settings = HostSettings { until_caught_up: false, ..bank_host(dir.path(), "host", config(BATCH)) };
    let host = Host::start_on(log, settings).await.unwrap();
    let projection = host.projection().clone();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(host.stop_when(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    }));

    let publishing = {
        let (publisher, module) = (IggyLog::connect(&url, &stream).await.unwrap(), module.clone());
        tokio::spawn(async move {
            for chunk in outgoing.chunks(500) {
                publish::publish(&publisher, TOPIC, module.clone(), chunk.to_vec(), None, 2).await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let mut seen: Vec<std::collections::BTreeSet<u64>> = vec![Default::default(); PARTITIONS as usize];
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        for partition in 0..PARTITIONS {
            // Iggy first, then the store: both only grow, so an offset
            // read before the position can only understate the first.
            let stored = publisher.consumer_offset("bank", TOPIC, partition).await.unwrap().unwrap_or(0);
            let committed = projection.store().position(TOPIC, partition).unwrap().unwrap_or(0);
            assert!(stored <= committed, "partition {partition}: Iggy has {stored}, the store committed {committed}");
            assert!(
                committed - stored <= 2 * BATCH as u64,
                "partition {partition}: Iggy's offset {stored} lags the commit {committed} by more than two batches"
            );
            seen[partition as usize].insert(stored);
        }
        if publishing.is_finished() && caught_up(&publisher, &[projection.store()]).await {
            break;
        }
        assert!(Instant::now() < deadline, "the host did not catch up in 2 minutes");
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    publishing.await.unwrap();
    stop.send(true).unwrap();
    let summary: Summary = run.await.unwrap().unwrap();
    assert_eq!(summary.applied, 20_000);
    let check = check_hosts(&oracle, &[(&[0, 1, 2, 3], projection.store())]);
    assert!(check.matches(), "{}", check.report(5));
    for partition in 0..PARTITIONS {
        let end = publisher.end_offset(TOPIC, partition).await.unwrap();
        assert_eq!(publisher.consumer_offset("bank", TOPIC, partition).await.unwrap(), Some(end));
        // Moved while the host consumed: more than a start and an end.
        let moved = seen[partition as usize].len();
        assert!(moved > 3, "partition {partition}: Iggy's offset took only {moved} values while the host consumed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_on_disjoint_partitions_apply_every_event_once_while_events_arrive() {
    let Some(url) = iggy_url("the two-host test") else { return };
    let _shared = SERVER.read().await;
    let stream = fresh_stream("waku-test-hosts");
    let publisher = IggyLog::connect(&url, &stream).await.unwrap();
    publisher.create_topic(TOPIC, PARTITIONS).await.unwrap();
    let module = bank_module();
    let (events, oracle) = demo::workload(WorkloadSpec { events: 20_000, accounts: 500, seed: 12 });
    let mut outgoing: Vec<Outgoing> = demo::outgoing(&*module, &events).expect("the bank module");
    let later = outgoing.split_off(outgoing.len() / 2);
    publish::publish(&publisher, TOPIC, module.clone(), outgoing, None, 2).await.unwrap();

    // Two hosts of one projection: their own connection, their own state,
    // their own partitions.
    let dir = tempfile::tempdir().unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut hosts = Vec::new();
    for (name, partitions) in [("a", vec![0, 2]), ("b", vec![1, 3])] {
        let log = Arc::new(IggyLog::connect(&url, &stream).await.unwrap());
        let config = ConsumerConfig { partitions: Some(partitions.clone()), ..config(500) };
        let settings = HostSettings { until_caught_up: false, ..bank_host(dir.path(), name, config) };
        let host = Host::start_on(log, settings).await.unwrap();
        let projection = host.projection().clone();
        let mut stopped = stopped.clone();
        let run = tokio::spawn(host.stop_when(async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }));
        hosts.push((partitions, projection, run));
    }

    for chunk in later.chunks(1000) {
        publish::publish(&publisher, TOPIC, module.clone(), chunk.to_vec(), None, 2).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let stores: Vec<&StateStore> = hosts.iter().map(|(_, projection, _)| projection.store()).collect();
    while !caught_up(&publisher, &stores).await {
        assert!(Instant::now() < deadline, "the hosts did not catch up in 2 minutes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(true).unwrap();

    let mut applied = 0;
    for (_, _, run) in hosts.iter_mut() {
        let summary: Summary = run.await.unwrap().unwrap();
        assert!(summary.applied > 0, "each host did its share");
        applied += summary.applied;
    }
    assert_eq!(applied, 20_000, "every event applied once over both hosts");
    let owned: Vec<(&[u32], &StateStore)> =
        hosts.iter().map(|(partitions, projection, _)| (partitions.as_slice(), projection.store())).collect();
    let check = check_hosts(&oracle, &owned);
    assert!(check.matches(), "{}", check.report(5));
    for partition in 0..PARTITIONS {
        let end = publisher.end_offset(TOPIC, partition).await.unwrap();
        assert_eq!(publisher.consumer_offset("bank", TOPIC, partition).await.unwrap(), Some(end));
    }
}

/// Consumes `events` bank events from a fresh stream while `outage` makes
/// the server go away once the consumer is under way, and checks nothing
/// was lost or applied twice.
async fn consume_through_an_outage<F>(
    url: &str,
    consumer_url: &str,
    outage: impl FnOnce(Arc<wakuwaku::engine::progress::Progress>) -> F,
) where
    F: Future<Output = ()> + Send + 'static,
{
    let stream = fresh_stream("waku-test-outage");
    let publisher = IggyLog::connect(url, &stream).await.unwrap();
    let spec = WorkloadSpec { events: 20_000, accounts: 500, seed: 13 };
    let oracle = publish_bank(&publisher, bank_module(), spec, PARTITIONS).await;
    drop(publisher);

    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(IggyLog::connect(consumer_url, &stream).await.unwrap());
    let host = Host::start_on(log.clone(), bank_host(dir.path(), "host", config(200))).await.unwrap();
    let (projection, metrics) = (host.projection().clone(), host.metrics().clone());
    let outage = tokio::spawn(outage(host.progress().clone()));
    let summary = tokio::time::timeout(Duration::from_secs(180), host.finished())
        .await
        .expect("caught up within 3 minutes")
        .unwrap();
    outage.await.unwrap();

    assert_eq!((summary.applied, summary.dead_lettered), (20_000, 0), "nothing lost, nothing applied twice");
    let check = check_hosts(&oracle, &[(&[0, 1, 2, 3], projection.store())]);
    assert!(check.matches(), "{}", check.report(5));
    let reported = metrics
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix("waku_log_unavailable_total{projection=\"bank\"} "))
        .map(|count| count.parse::<u64>().unwrap());
    assert!(reported.is_some_and(|count| count > 0), "the outage was counted: {reported:?}");
}

/// Waits until the consumer has replayed `events`, or 60 s.
async fn replayed(progress: &wakuwaku::engine::progress::Progress, events: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while progress.replayed().0 < events && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until the consumer reports the log unavailable, or 30 s.
async fn reported_unavailable(progress: &wakuwaku::engine::progress::Progress) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while progress.log_available() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_and_a_server_that_refuses_them_lose_nothing_and_are_reported() {
    let Some(url) = iggy_url("the dropped-connection test") else { return };
    let _shared = SERVER.read().await;
    let proxy = Arc::new(CuttableProxy::start(upstream_of(&url).to_owned()).await.unwrap());
    let via_proxy =
        format!("{}{}reconnection_interval=200ms", proxy.url_for(&url), if url.contains('?') { "&" } else { "?" });
    let cutter = proxy.clone(); // The proxy must outlive the cuts.
    consume_through_an_outage(&url, &via_proxy, |progress| async move {
        for at in [2_000, 8_000, 14_000] {
            replayed(&progress, at).await;
            let cut = cutter.cut_for(Duration::from_millis(1500));
            let (_, reported) = tokio::join!(cut, reported_unavailable(&progress));
            assert!(reported, "the consumer reported the log unavailable (cut at {at} events)");
        }
    })
    .await;
}

/// `WAKU_IGGY_RESTART`, the command that kills the server with SIGKILL
/// and starts it again; without it, prints one line saying `what` was
/// skipped.
fn restart_command(what: &str) -> Option<String> {
    let restart = std::env::var("WAKU_IGGY_RESTART").ok();
    if restart.is_none() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {what} needs WAKU_IGGY_RESTART, a shell command that kills the server with SIGKILL and starts \
             it again"
        );
    }
    restart
}

/// Runs the restart command, failing the test if it fails.
async fn kill_and_restart(restart: String) {
    let status = tokio::task::spawn_blocking(move || std::process::Command::new("sh").args(["-c", &restart]).status())
        .await
        .unwrap()
        .expect("WAKU_IGGY_RESTART runs");
    assert!(status.success(), "WAKU_IGGY_RESTART failed: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_run_loses_nothing() {
    let Some(url) = iggy_url("the server-restart test") else { return };
    let Some(restart) = restart_command("the server-restart test") else { return };
    let _alone = SERVER.write().await;
    consume_through_an_outage(&url, &url, |progress| async move {
        replayed(&progress, 4_000).await;
        kill_and_restart(restart).await;
    })
    .await;
}

/// What a probe projection's run did, as its state and the log say.
#[derive(Debug, PartialEq, Eq)]
struct ProbeOutcome {
    /// The projection's statistics (applied, retry_in, retry_out,
    /// dead_lettered, ...).
    stats: Stats,
    /// Its counters (`notes`: notes applied).
    counters: Vec<(String, i128)>,
    /// The texts of the messages in `notes-out`, sorted.
    emitted: Vec<String>,
    /// Records in `retry_probes` and in `dlq_probes`.
    routed: (u64, u64),
}

/// A probe projection on a fresh stream: 2 partitions of notes that emit
/// to `notes-out`, and failures, retryable (retried once, then
/// dead-lettered) and unrecoverable; with `restart`, the server is killed
/// and started again once the host replayed a third of it.
async fn probe_run(url: &str, restart: Option<String>) -> ProbeOutcome {
    use serde_json::json;
    use wakuwaku::engine::routing::RetryPolicy;
    use wakuwaku::event::EventTypeTag;
    let stream = fresh_stream("waku-test-crash");
    let log = Arc::new(IggyLog::connect(url, &stream).await.unwrap());
    log.create_topic("probes", 2).await.unwrap();
    log.create_topic("notes-out", 1).await.unwrap();
    log.create_topic("out", 1).await.unwrap();
    let note = |partition: u32, i: u64| {
        let body = json!({ "key": i % 50, "text": format!("p{partition}-{i}"), "emit_to": "notes-out" });
        json_record(EventTypeTag::new(4), i % 50, body)
    };
    let fail = |i: u64, class: &str| {
        json_record(EventTypeTag::new(5), 1000 + i, json!({ "key": 1000 + i, "class": class, "message": "no" }))
    };
    for partition in 0..2 {
        let records = (0..1500u64)
            .map(|i| match i {
                _ if i % 100 == 7 => fail(i, "retryable"),
                _ if i % 150 == 11 => fail(i, "unrecoverable"),
                _ => note(partition, i),
            })
            .collect();
        log.append("probes", vec![(partition, records)]).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let retry = RetryPolicy { delays: vec![Duration::ZERO], max_attempts: 2, ..RetryPolicy::default() };
    let config = ConsumerConfig { retry, ..config(50) };
    let settings = host_settings(dir.path(), "probe", "probes", vec![probe_module()], config);
    let host = Host::start_on(log.clone(), settings).await.unwrap();
    let projection = host.projection().clone();
    let progress = host.progress().clone();
    let crash = tokio::spawn(async move {
        if let Some(restart) = restart {
            replayed(&progress, 1000).await;
            assert!(progress.replayed().0 < 3000, "the crash must come mid-run");
            kill_and_restart(restart).await;
        }
    });
    tokio::time::timeout(Duration::from_secs(180), host.finished()).await.expect("caught up within 3 minutes").unwrap();
    crash.await.unwrap();
    let mut emitted = Vec::new();
    for stored in log.read("notes-out", 0, 0, 10_000).await.unwrap() {
        let body: serde_json::Value = serde_json::from_slice(&stored.record.body).unwrap();
        emitted.push(body["text"].as_str().unwrap().to_owned());
    }
    emitted.sort();
    let mut routed = (0, 0);
    for partition in 0..2 {
        routed.0 += log.end_offset("retry_probes", partition).await.unwrap();
        routed.1 += log.end_offset("dlq_probes", partition).await.unwrap();
    }
    let store = projection.store();
    ProbeOutcome { stats: store.stats().unwrap(), counters: store.counters().unwrap(), emitted, routed }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_of_the_server_mid_run_changes_no_events_fate_and_repeats_no_emit() {
    let Some(url) = iggy_url("the SIGKILL test") else { return };
    let Some(restart) = restart_command("the SIGKILL test") else { return };
    let _alone = SERVER.write().await;
    let calm = probe_run(&url, None).await;
    let crashed = probe_run(&url, Some(restart)).await;
    // 2 × (15 retryable + 10 unrecoverable) failures, the rest notes.
    let notes = 2 * (1500 - 15 - 10);
    assert_eq!(calm.emitted.len(), notes, "{calm:?}");
    assert_eq!(calm.routed, (30, 50), "one retry record per retryable failure; every failure dead-lettered");
    let mut unique = crashed.emitted.clone();
    unique.dedup();
    assert_eq!(unique.len(), crashed.emitted.len(), "no emitted message twice");
    assert_eq!(crashed, calm, "the crash changed what became of some event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_the_host_creates_are_durable_and_a_retry_topic_without_fsync_is_refused_unless_accepted() {
    use wakuwaku::storage::log::loss::Durability;
    let Some(url) = iggy_url("the topic durability test") else { return };
    let _shared = SERVER.read().await;
    let stream = fresh_stream("waku-test-durability");
    let log = Arc::new(IggyLog::connect(&url, &stream).await.unwrap());
    log.create_topic("probes", 2).await.unwrap();
    log.create_topic("notes-out", 1).await.unwrap();
    log.create_topic("out", 1).await.unwrap();
    // What the server reports for the topics the host created.
    assert_eq!(log.durability("probes").await.unwrap(), Durability::Durable);
    // A retry topic someone else created with the server's defaults.
    let lossy = IggyLog::connect(&url, &stream).await.unwrap().with_lossy_topics(true);
    lossy.create_topic("retry_probes", 2).await.unwrap();
    let reported = log.durability("retry_probes").await.unwrap();
    assert!(
        matches!(&reported, Durability::Lossy { setting } if setting.contains("enforce_fsync = false")),
        "{reported:?}"
    );
    let record = json_record(wakuwaku::event::EventTypeTag::new(4), 1, serde_json::json!({ "key": 1, "text": "t" }));
    log.append("probes", vec![(0, vec![record])]).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let settings = || host_settings(dir.path(), "probe", "probes", vec![probe_module()], config(50));
    let refused = Host::start_on(log.clone(), settings()).await.unwrap().finished().await.unwrap_err().to_string();
    assert!(refused.contains("topic `retry_probes` (a retry topic) can lose acknowledged appends"), "{refused}");
    assert!(refused.contains("enforce_fsync = false"), "{refused}");
    assert!(refused.contains("--lossy-topics"), "{refused}");
    assert_eq!(log.end_offset("retry_probes", 0).await.unwrap(), 0, "nothing appended to it");

    // Told it may: it runs, with a warning.
    let accepting = Arc::new(IggyLog::connect(&url, &stream).await.unwrap().with_lossy_topics(true));
    let summary = Host::start_on(accepting, settings()).await.unwrap().finished().await.unwrap();
    assert_eq!(summary.applied, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_client_reads_a_producers_stamp_back_from_behind_later_messages() {
    use wakuwaku::event::EventTypeTag;
    let Some(url) = iggy_url("the producer-stamp test") else { return };
    let _shared = SERVER.read().await;
    let stream = fresh_stream("waku-test-stamps");
    let record = |n: u32| json_record(EventTypeTag::new(n), 7, serde_json::json!(n));
    let first = IggyLog::connect(&url, &stream).await.unwrap();
    first.create_topic("out", 2).await.unwrap();
    // A whole outbox group (1000 records, one request), then others' messages.
    assert!(first.append_as("out", vec![(0, (0..1000).map(record).collect())], "host-a", 5).await.unwrap());
    first.append("out", vec![(0, (0..4500).map(record).collect())]).await.unwrap();

    let fresh = IggyLog::connect(&url, &stream).await.unwrap();
    assert_eq!(fresh.producer_sequence("out", 0, "host-a", 0).await.unwrap(), Some(5));
    assert_eq!(fresh.producer_sequence("out", 1, "host-a", 0).await.unwrap(), None);
    assert!(!fresh.append_as("out", vec![(0, vec![record(1)])], "host-a", 5).await.unwrap(), "already there");
    assert!(fresh.append_as("out", vec![(0, vec![record(2)])], "host-a", 6).await.unwrap());
    assert_eq!(first.end_offset("out", 0).await.unwrap(), 5501);
    assert_eq!(
        IggyLog::connect(&url, &stream).await.unwrap().producer_sequence("out", 0, "host-a", 0).await.unwrap(),
        Some(6)
    );
}

/// A producer name that moves to another process and back (a partition's
/// outbox producer, A → B → A): what A remembered of its stamps is stale
/// once B appended as it, and forgetting it makes A read B's stamp back
/// instead of appending B's messages again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_forgotten_when_it_comes_back_finds_what_another_client_appended_as_it() {
    use wakuwaku::event::EventTypeTag;
    let Some(url) = iggy_url("the forgotten-producer test") else { return };
    let _shared = SERVER.read().await;
    let stream = fresh_stream("waku-test-forget");
    let record = |n: u32| json_record(EventTypeTag::new(n), 7, serde_json::json!(n));
    let a = IggyLog::connect(&url, &stream).await.unwrap();
    a.create_topic("out", 1).await.unwrap();
    assert!(a.append_as("out", vec![(0, vec![record(1)])], "p/0", 5).await.unwrap());
    // B holds the partition for a while and appends as the same producer.
    let b = IggyLog::connect(&url, &stream).await.unwrap();
    assert!(b.append_as("out", vec![(0, vec![record(2)])], "p/0", 6).await.unwrap());
    assert_eq!(a.producer_sequence("out", 0, "p/0", 0).await.unwrap(), Some(5), "A's memory is stale");

    a.forget_producer("p/0");
    assert_eq!(a.producer_sequence("out", 0, "p/0", 0).await.unwrap(), Some(6));
    assert!(!a.append_as("out", vec![(0, vec![record(2)])], "p/0", 6).await.unwrap(), "already there");
    assert_eq!(a.end_offset("out", 0).await.unwrap(), 2, "B's message is not appended again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emits_retries_and_dead_letters_travel_through_iggy_topics() {
    use serde_json::json;
    use wakuwaku::engine::routing::{FailureClass, RetryPolicy, Routed};
    use wakuwaku::event::EventTypeTag;
    use wakuwaku::storage::log::Record;
    let Some(url) = iggy_url("the routing test on Iggy") else { return };
    let _shared = SERVER.read().await;
    let record = |tag: u32, key: u64, body: serde_json::Value| json_record(EventTypeTag::new(tag), key, body);
    let log = Arc::new(IggyLog::connect(&url, &fresh_stream("waku-test-routing")).await.unwrap());
    log.create_topic("probes", 2).await.unwrap();
    log.create_topic("notes-out", 1).await.unwrap();
    for partition in 0..2u64 {
        let mut records: Vec<Record> = (0..20)
            .map(|i| record(4, i, json!({ "key": i, "text": format!("p{partition}-{i}"), "emit_to": "notes-out" })))
            .collect();
        records.insert(5, record(5, 100, json!({ "key": 100, "class": "retryable", "message": "busy" })));
        records.insert(9, record(5, 101, json!({ "key": 101, "class": "unrecoverable", "message": "bad" })));
        log.append("probes", vec![(partition as u32, records)]).await.unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let retry = RetryPolicy { delays: vec![Duration::ZERO], max_attempts: 2, ..RetryPolicy::default() };
    let config = ConsumerConfig { retry, ..config(8) };
    let settings = host_settings(dir.path(), "probe", "probes", vec![probe_module()], config);
    let host = Host::start_on(log.clone(), HostSettings { until_caught_up: false, ..settings }).await.unwrap();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(host.stop_when(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    }));
    let deadline = Instant::now() + Duration::from_secs(60);
    let ends = |topic: &'static str| {
        let log = log.clone();
        async move {
            let mut sum = 0;
            // The consumer creates the routed topics once it starts.
            for partition in 0..log.partitions(topic).await.unwrap_or(0) {
                sum += log.end_offset(topic, partition).await.unwrap();
            }
            sum
        }
    };
    while ends("dlq_probes").await < 4 || ends("notes-out").await < 40 {
        assert!(Instant::now() < deadline, "the failures were not dead-lettered in a minute");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // Room for anything extra to show.
    stop.send(true).unwrap();
    let summary = run.await.unwrap().unwrap();

    assert_eq!((summary.applied, summary.dead_lettered), (40, 4));
    assert_eq!((summary.retry_in, summary.retry_out), (2, 2));
    assert_eq!(ends("notes-out").await, 40, "every emit once");
    assert_eq!(ends("retry_probes").await, 2, "one retry per retryable failure");
    let mut classes = Vec::new();
    for partition in 0..2 {
        for letter in log.read("dlq_probes", partition, 0, 10).await.unwrap() {
            let routed = Routed::parse(&letter.record.headers).unwrap();
            assert_eq!(routed.origin_partition, partition);
            classes.push((routed.failure.unwrap().class, routed.attempts));
        }
    }
    classes.sort_by_key(|(class, _)| format!("{class:?}"));
    assert_eq!(
        classes,
        [
            (FailureClass::Retryable, 2),
            (FailureClass::Retryable, 2),
            (FailureClass::Unrecoverable, 1),
            (FailureClass::Unrecoverable, 1)
        ]
    );
}

/// An outbox entry the probe projection emitted from partition 0.
fn emitted(topic: &str, key: u64, record: wakuwaku::storage::log::Record) -> wakuwaku::storage::state::OutboxEntry {
    wakuwaku::storage::state::OutboxEntry {
        topic: topic.into(),
        partition_key: key,
        partition: Some(0),
        record,
        origin: Some(wakuwaku::storage::state::EmitOrigin {
            partition: 0,
            offset: key,
            module: "probe".into(),
            version: "v".into(),
            topic: None,
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_crash_is_recovered_exactly_behind_more_than_the_old_look_back() {
    use wakuwaku::engine::outbox::{self, Published};
    use wakuwaku::event::EventTypeTag;
    use wakuwaku::storage::log::LogError;
    use wakuwaku::storage::state::BatchCommit;
    use wakuwaku_tests::faulty::{Call, FaultyLog};
    /// More than the 100 000 messages the old recovery looked back.
    const LATER: u64 = 150_000;
    let Some(url) = iggy_url("the outbox recovery test on Iggy") else { return };
    let _shared = SERVER.read().await;
    let stream = fresh_stream("waku-test-recovery");
    let record = |n: u64| json_record(EventTypeTag::new(4), n, serde_json::json!({ "n": n }));
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(&dir.path().join("probe.redb")).unwrap();
    let outbox = (0..5).map(|n| emitted("out", n, record(n))).chain([emitted("zz", 5, record(5))]).collect();
    store.commit(BatchCommit { outbox, ..BatchCommit::default() }).unwrap();

    // The first host appends `out`'s part, then loses the server before
    // `zz` (appended after `out`), so its outbox is not settled.
    let first = FaultyLog::new(IggyLog::connect(&url, &stream).await.unwrap(), |call| match call {
        Call::Write { topic: "zz" } => Some(LogError::Unavailable { address: "test".into(), reason: "gone".into() }),
        _ => None,
    });
    for topic in ["out", "zz", "dlq_probes"] {
        first.create_topic(topic, 1).await.unwrap();
    }
    first.append("out", vec![(0, (0..3).map(|n| record(100 + n)).collect())]).await.unwrap();
    assert!(outbox::publish(&first, &store, "probe", &RoutedTopics::shared("probes"), &[0, 1]).await.is_err());
    assert_eq!(store.outbox().unwrap().len(), 6);
    assert_eq!(first.log.end_offset("out", 0).await.unwrap(), 3 + 5);

    // Others keep appending, far past what the old look-back read.
    let others = IggyLog::connect(&url, &stream).await.unwrap();
    for _ in 0..LATER / 10_000 {
        others.append("out", vec![(0, (0..10_000).map(|n| record(1000 + n)).collect())]).await.unwrap();
    }

    // A restarted host (a fresh client that remembers nothing) sends only
    // what is missing.
    let restarted = IggyLog::connect(&url, &stream).await.unwrap();
    let published =
        outbox::publish(&restarted, &store, "probe", &RoutedTopics::shared("probes"), &[0, 1]).await.unwrap();
    assert_eq!(published, Published { appended: 1, undeliverable: 0 });
    assert!(store.outbox().unwrap().is_empty());
    assert_eq!(restarted.end_offset("out", 0).await.unwrap(), 3 + 5 + LATER, "each of the five once");
    assert_eq!(restarted.end_offset("zz", 0).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_iggy_cannot_take_is_dead_lettered_and_empty_bodies_travel() {
    use wakuwaku::engine::outbox::{self, Published};
    use wakuwaku::engine::routing::{FailureClass, Routed};
    use wakuwaku::event::{EventTypeTag, Header};
    use wakuwaku::storage::state::BatchCommit;
    let Some(url) = iggy_url("the undeliverable-message test on Iggy") else { return };
    let _shared = SERVER.read().await;
    let log = IggyLog::connect(&url, &fresh_stream("waku-test-undeliverable")).await.unwrap();
    for topic in ["probes", "dlq_probes", "out"] {
        log.create_topic(topic, 1).await.unwrap();
    }
    let empty = wakuwaku::storage::log::Record {
        body: Vec::new(),
        ..json_record(EventTypeTag::new(4), 1, serde_json::json!({}))
    };
    let mut unstorable = json_record(EventTypeTag::new(4), 2, serde_json::json!({ "n": 2 }));
    unstorable.headers.push(Header { name: "x".repeat(300), value: b"v".to_vec() });
    let fine = json_record(EventTypeTag::new(4), 4, serde_json::json!({ "n": 4 }));
    let outbox = vec![
        emitted("out", 1, empty.clone()),
        emitted("out", 2, unstorable),
        emitted("nowhere", 3, fine.clone()),
        emitted("out", 4, fine),
    ];
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(&dir.path().join("probe.redb")).unwrap();
    store.commit(BatchCommit { outbox, ..BatchCommit::default() }).unwrap();

    let published = outbox::publish(&log, &store, "probe", &RoutedTopics::shared("probes"), &[0, 1]).await.unwrap();
    assert_eq!(published, Published { appended: 4, undeliverable: 2 });
    let out = log.read("out", 0, 0, 10).await.unwrap();
    assert_eq!(out.len(), 2);
    assert!(out[0].record.body.is_empty(), "an empty body comes back empty");
    let mut reasons: Vec<(u64, FailureClass, String)> = log
        .read("dlq_probes", 0, 0, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|letter| {
            let routed = Routed::parse(&letter.record.headers).unwrap();
            let failure = routed.failure.unwrap();
            (routed.origin_offset, failure.class, failure.message)
        })
        .collect();
    reasons.sort_by_key(|(offset, _, _)| *offset);
    assert_eq!(reasons.len(), 2);
    assert_eq!((reasons[0].0, reasons[0].1), (2, FailureClass::Undeliverable));
    assert!(reasons[0].2.contains("`out` partition 0 refuses the record: header key"), "{}", reasons[0].2);
    // Its letter carried the header Iggy refused, so it went slim.
    assert!(reasons[0].2.contains("its dead letter was refused too"), "{}", reasons[0].2);
    assert_eq!(
        (reasons[1].0, reasons[1].1, reasons[1].2.as_str()),
        (
            3,
            FailureClass::Undeliverable,
            "the message emitted to `nowhere` cannot be delivered: topic `nowhere` does not exist"
        )
    );
}

/// Polls of a partition whose messages go from small to large and back:
/// each batch keeps to its byte budget (plus the one message that crosses
/// it), every message comes once and in order, and small messages are
/// polled as many at a time as the batch allows again after large ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polls_keep_to_their_byte_budget_through_large_messages() {
    use wakuwaku::storage::log::{PolledBatch, Record};
    let Some(url) = iggy_url("the Iggy byte-budget poll test") else { return };
    let _shared = SERVER.read().await;
    let log = IggyLog::connect(&url, &fresh_stream("waku-test-budget")).await.unwrap();
    log.create_topic("mixed", 1).await.unwrap();
    const MIB: usize = 1 << 20;
    let record = |n: usize, size: usize| Record { headers: Vec::new(), body: n.to_le_bytes().repeat(size / 8) };
    let sizes: Vec<usize> = [vec![128; 3000], vec![MIB; 10], vec![128; 3000]].concat();
    for (start, chunk) in (0..).step_by(500).zip(sizes.chunks(500)) {
        let records = chunk.iter().enumerate().map(|(n, &size)| record(start + n, size)).collect();
        log.append("mixed", vec![(0, records)]).await.unwrap();
    }
    let budget = 3 * MIB;
    let (mut batch, mut next, mut polls) = (PolledBatch::with_byte_budget(budget), 0u64, Vec::new());
    while next < sizes.len() as u64 {
        batch = log.poll("mixed", 0, next, 1024, batch).await.unwrap();
        assert!(!batch.is_empty(), "a poll at {next} found nothing");
        let bytes: usize = batch.iter().map(|view| view.body().len()).sum();
        assert!(bytes < budget + MIB, "a poll at {next} holds {bytes} bytes");
        let last = next as usize + batch.len() == sizes.len();
        assert!(batch.len() == 1024 || bytes >= budget || last, "a poll at {next} stopped short: {bytes} bytes");
        for view in batch.iter() {
            assert_eq!(view.offset(), next);
            assert_eq!(view.body(), record(next as usize, sizes[next as usize]).body.as_slice());
            next += 1;
        }
        polls.push(batch.len());
    }
    // Three large messages fill a batch; the small ones after them fill
    // whole batches again.
    assert_eq!(polls, [1024, 1024, 952 + 3, 3, 3, 1 + 1023, 1024, 953]);
}

/// A projection over two topics on Iggy: each key's history alternates
/// between them, stamped with `waku-event-time`; it is applied in
/// event-time order, exactly once, and Iggy shows the consumer's offsets of
/// both topics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_topics_on_iggy_are_applied_in_event_time_order_per_key() {
    let Some(url) = iggy_url("two topics in event-time order on Iggy") else { return };
    let _shared = SERVER.read().await;
    let log = Arc::new(IggyLog::connect(&url, &fresh_stream("waku-test-event-time")).await.unwrap());
    // The probe's `TimedLedger`, a timed type.
    const LEDGER: wakuwaku::event::EventTypeTag = wakuwaku::event::EventTypeTag::new(51);
    let (keys, per_key, partitions) = (24u64, 30u64, 2u32);
    for topic in ["early", "late"] {
        log.create_topic(topic, partitions).await.unwrap();
        let mut batches: Vec<(u32, Vec<wakuwaku::storage::log::Record>)> =
            (0..partitions).map(|p| (p, Vec::new())).collect();
        for seq in (1..=per_key).filter(|seq| (seq % 2 == 1) == (topic == "early")) {
            for key in 0..keys {
                let body =
                    serde_json::json!({ "key": key, "seq": seq, "amount": 1, "fail": null, "ordering": "relaxed" });
                let mut record = json_record(LEDGER, key, body);
                let time = 1_796_169_600_000i64 + seq as i64 * 1000 + key as i64;
                record.headers.push(wakuwaku::event::Header {
                    name: wakuwaku::event::header_name::EVENT_TIME.into(),
                    value: time.to_le_bytes().to_vec(),
                });
                let partition = partition_for(wakuwaku::key::Key::int(key).key_hash(), partitions);
                batches[partition as usize].1.push(record);
            }
        }
        log.append(topic, batches).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let mut settings = host_settings(dir.path(), "ledger", "early", vec![probe_module()], config(10));
    settings.more_topics = vec!["late".to_owned()];
    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!((summary.applied, summary.order_violations), (keys * per_key, 0));
    let counters: std::collections::HashMap<String, i128> =
        projection.store().counters().unwrap().into_iter().collect();
    assert_eq!(counters.get("out_of_order"), None, "a key saw its entries out of event-time order");
    assert_eq!(counters.get("ledger").copied(), Some((keys * per_key) as i128));
    for topic in ["early", "late"] {
        for partition in 0..partitions {
            let end = log.end_offset(topic, partition).await.unwrap();
            assert_eq!(projection.store().position(topic, partition).unwrap(), Some(end), "{topic} {partition}");
            assert_eq!(
                log.consumer_offset("ledger", topic, partition).await.unwrap(),
                Some(end),
                "{topic} {partition}"
            );
        }
    }
}

/// A dead letter's context read back as any Iggy consumer reads it: the
/// `iggy` client alone polls the dead-letter topic, and every context
/// header is an Iggy String header holding text, with no wakuwaku code
/// between the server and the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_iggy_client_reads_a_dead_letters_context_as_string_headers() {
    use iggy::prelude::{
        Client, Consumer, HeaderKey, HeaderKind, Identifier, IggyClient, MessageClient, PollingStrategy,
    };
    use std::str::FromStr;
    use wakuwaku::event::EventTypeTag;
    let Some(url) = iggy_url("the plain Iggy reader of dead letters") else { return };
    let _shared = SERVER.read().await;
    let stream = fresh_stream("waku-test-plain-dlq");
    let log = Arc::new(IggyLog::connect(&url, &stream).await.unwrap());
    log.create_topic("probes", 1).await.unwrap();
    let fail = serde_json::json!({ "key": 7, "class": "unrecoverable", "message": "no such account" });
    let note = serde_json::json!({ "key": 8, "text": "fine", "emit_to": null });
    let records = vec![json_record(EventTypeTag::new(4), 8, note), json_record(EventTypeTag::new(5), 7, fail)];
    log.append("probes", vec![(0, records)]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let settings = host_settings(dir.path(), "probe", "probes", vec![probe_module()], config(8));
    let (summary, _) = catch_up(&log, settings).await.unwrap();
    assert_eq!((summary.applied, summary.dead_lettered), (1, 1));

    let client = IggyClient::from_connection_string(&url).unwrap();
    client.connect().await.unwrap();
    let polled = client
        .poll_messages(
            &Identifier::named(&stream).unwrap(),
            &Identifier::named("dlq_probes").unwrap(),
            Some(0),
            &Consumer::new(Identifier::named("a-plain-reader").unwrap()),
            &PollingStrategy::offset(0),
            10,
            false,
        )
        .await
        .unwrap();
    assert_eq!(polled.messages.len(), 1, "one dead letter");
    let letter = &polled.messages[0];
    let headers = letter.user_headers_map().unwrap().expect("the letter has headers");
    let text = |name: &str| {
        let value = headers.get(&HeaderKey::from_str(name).unwrap()).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(value.kind(), HeaderKind::String, "{name}");
        value.as_str().unwrap().to_owned()
    };
    assert_eq!(text("waku.error.topic"), "probes");
    assert_eq!(text("waku.error.partition"), "0");
    assert_eq!(text("waku.error.offset"), "1");
    assert_eq!(text("waku.error.projection"), "probe");
    assert_eq!(text("waku.error.module"), "probe");
    assert_eq!(text("waku.error.module.version"), probe_module().version());
    assert_eq!(text("waku.error.event.type"), "Fail");
    assert_eq!(text("waku.error.class"), "unrecoverable");
    assert!(text("waku.error.message").contains("no such account"), "{}", text("waku.error.message"));
    assert_eq!(text("waku.error.attempts"), "1");
    assert_eq!(text("waku.error.events"), "1");
    for time in ["waku.error.first.failure", "waku.error.last.failure"] {
        let at = humantime::parse_rfc3339(&text(time)).unwrap_or_else(|e| panic!("{time}: {e}"));
        let age = std::time::SystemTime::now().duration_since(at).unwrap();
        assert!(age < Duration::from_secs(600), "{time}: {at:?}");
    }
    // The body is the event's, as published.
    let body: serde_json::Value = serde_json::from_slice(&letter.payload).unwrap();
    assert_eq!(body["message"], "no such account");
}
