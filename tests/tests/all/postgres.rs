//! The bank workload through the host with its state in PostgreSQL: the
//! read model equals the oracle, plain SQL on the projection's view reads
//! an account's balance, and a restart resumes at the committed positions
//! without applying anything twice.
//!
//! Needs a server named by `WAKU_POSTGRES_URL` (`.ci/run` starts one);
//! without it, the test prints one `skipped: …` line (under CI it fails).
//! Each run uses a projection of its own, so runs share one database.
//!
//! Also: a host whose partition another host took drops that partition
//! (its commit refused) and goes on with its others.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wakuwaku::authoring::demo::{self, Oracle, WorkloadSpec};
use wakuwaku::authoring::publish;
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig};
use wakuwaku::engine::progress::Progress;
use wakuwaku::engine::projection::Projection;
use wakuwaku::operations::host::{Host, StateSettings};
use wakuwaku::sandbox::handler::HandlerModule;
use wakuwaku::storage::log::EventLog;
use wakuwaku::storage::state::{PostgresStore, StateStore};
use wakuwaku::storage::stats::Stat;
use wakuwaku_tests::{bank_log, bank_module, catch_up, fresh_stream, host_settings, postgres_url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bank_on_postgres_matches_the_oracle_reads_by_sql_and_resumes() {
    let Some(url) = postgres_url("the bank on PostgreSQL") else { return };
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let spec = WorkloadSpec { events: 8_000, accounts: 120, seed: 21 };
    let (log, oracle) = bank_log(dir.path(), module.clone(), spec, 4).await;
    let projection = fresh_stream("bank").replace('-', "_");
    let settings = |partitions: Option<Vec<u32>>| {
        let config = ConsumerConfig { batch_size: 400, partitions, ..ConsumerConfig::default() };
        let mut settings = host_settings(dir.path(), &projection, "accounts", vec![module.clone()], config);
        settings.state = StateSettings::Postgres { url: url.clone() };
        settings
    };

    // First run: partition 0 only; then a restart over all partitions
    // resumes partition 0 at its end.
    let (first, _) = catch_up(&log, settings(Some(vec![0]))).await.unwrap();
    let end0 = log.end_offset("accounts", 0).await.unwrap();
    assert_eq!(first.consumed, end0);
    let (second, projection_state) = catch_up(&log, settings(None)).await.unwrap();
    assert_eq!(second.consumed, spec.events as u64 - end0, "partition 0 was consumed again");
    // A third run finds nothing left to do.
    let (third, _) = catch_up(&log, settings(None)).await.unwrap();
    assert_eq!((third.consumed, third.applied), (0, 0));

    let store = projection_state.store();
    let check = demo::check_projection(&oracle, &*module, store).unwrap();
    assert!(check.matches(), "{}", check.report(10));
    assert_eq!(check.accounts, oracle.accounts.len());
    // Every event applied exactly once across the three runs.
    let stats = store.stats().unwrap();
    assert_eq!(stats[Stat::Applied], spec.events as u64);

    // Plain SQL on the documented view answers an account's balance.
    let config: wakuwaku::storage::state::postgres::tls::PostgresConfig = url.parse().unwrap();
    let client = config.connect_client().await.unwrap();
    for (&account, expected) in oracle.accounts.iter().take(20) {
        let sql = format!(
            "SELECT (json->>'balance')::bigint FROM \"waku_state_{projection}\" \
             WHERE key = $1 AND name = '{}'",
            demo::ACCOUNT_ENTRY
        );
        let row = client.query_one(&sql, &[&account.to_string()]).await.unwrap();
        assert_eq!(row.get::<_, i64>(0), expected.balance, "account {account}");
    }
}

/// Publishes a second seeded workload to `accounts` and folds it into
/// `oracle`.
async fn publish_more(log: &impl EventLog, module: &Arc<dyn HandlerModule>, spec: WorkloadSpec, oracle: &mut Oracle) {
    let (events, _) = demo::workload(spec);
    events.iter().for_each(|event| oracle.apply(event));
    let outgoing = demo::outgoing(&**module, &events).expect("the bank module");
    publish::publish(log, "accounts", module.clone(), outgoing, None, 2).await.unwrap();
}

/// Waits (a guard against a hang, not a speed target) until `done`.
async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Host A follows both partitions; host B takes partition 1. A's next
/// commit to it is refused: A drops partition 1 (logged, counted), keeps
/// consuming partition 0, and B consumes partition 1; every event is
/// applied once and the read model equals the oracle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_partition_is_dropped_and_the_host_keeps_its_others() {
    let Some(url) = postgres_url("a fenced partition is dropped") else { return };
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let first = WorkloadSpec { events: 2_000, accounts: 60, seed: 31 };
    let (log, mut oracle) = bank_log(dir.path(), module.clone(), first, 2).await;
    let projection = fresh_stream("fenced").replace('-', "_");
    let settings = |partitions: Option<Vec<u32>>, until_caught_up: bool| {
        let config = ConsumerConfig { batch_size: 200, partitions, ..ConsumerConfig::default() };
        let mut settings = host_settings(dir.path(), &projection, "accounts", vec![module.clone()], config);
        settings.state = StateSettings::Postgres { url: url.clone() };
        settings.until_caught_up = until_caught_up;
        settings
    };

    let a = Host::start_on(log.clone(), settings(None, false)).await.unwrap();
    let progress = a.progress().clone();
    wait_for("A caught up", || progress.caught_up()).await;
    // B claims partition 1 (and finds nothing left to consume there).
    let (b_first, _) = catch_up(&log, settings(Some(vec![1]), true)).await.unwrap();
    assert_eq!(b_first.consumed, 0);

    publish_more(&*log, &module, WorkloadSpec { events: 2_000, accounts: 60, seed: 32 }, &mut oracle).await;
    let held = |progress: &Progress| progress.partitions().iter().map(|p| p.partition).collect::<Vec<_>>();
    wait_for("A dropped partition 1", || held(&progress) == [0]).await;
    assert!(
        a.metrics().encode().contains(&format!("waku_partitions_fenced_total{{projection=\"{projection}\"}} 1")),
        "{}",
        a.metrics().encode()
    );
    // A keeps consuming partition 0; B takes up partition 1.
    let end0 = log.end_offset("accounts", 0).await.unwrap();
    let store = a.projection().store().clone();
    wait_for("A consumed partition 0", || store.position("accounts", 0).unwrap() == Some(end0)).await;
    let (b_second, _) = catch_up(&log, settings(Some(vec![1]), true)).await.unwrap();
    assert!(b_second.consumed > 0);
    let end1 = log.end_offset("accounts", 1).await.unwrap();
    assert_eq!(store.position("accounts", 1).unwrap(), Some(end1));
    a.stop().await.unwrap();

    let check = demo::check_projection(&oracle, &*module, &store).unwrap();
    assert!(check.matches(), "{}", check.report(10));
    let stats = store.stats().unwrap();
    assert_eq!(stats[Stat::Applied], 4_000, "every event applied once");
}

/// The database forgets the host's last commits behind its back (every
/// batch table of the projection set back to a snapshot, as a crash with
/// `synchronous_commit=off` leaves it) while the host is idle. The host's
/// next commit is refused by its position check, and it starts the
/// partitions over from what the database holds: the forgotten events are
/// applied again, the read model equals the oracle and every event counts
/// once. Without the check the host would go on from its memory, and the
/// forgotten batches would be missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_database_forgot_its_last_commits_goes_on_from_the_database_not_its_memory() {
    let Some(url) = postgres_url("a database that forgot commits") else { return };
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let (log, mut oracle) =
        bank_log(dir.path(), module.clone(), WorkloadSpec { events: 2_000, accounts: 300, seed: 71 }, 2).await;
    let projection = fresh_stream("forgot").replace('-', "_");
    let config = ConsumerConfig { batch_size: 200, ..ConsumerConfig::default() };
    let mut settings = host_settings(dir.path(), &projection, "accounts", vec![module.clone()], config);
    settings.state = StateSettings::Postgres { url: url.clone() };
    settings.until_caught_up = false;
    let host = Host::start_on(log.clone(), settings).await.unwrap();
    let store = host.projection().store().clone();
    let consumed = || async {
        let ends = log.end_offsets("accounts").await.unwrap();
        (0..2).all(|p| store.position("accounts", p).unwrap() == Some(ends[p as usize]))
    };
    let wait_consumed = |what: &'static str| async move {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !consumed().await {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    wait_consumed("the first workload was consumed").await;

    let config: wakuwaku::storage::state::postgres::tls::PostgresConfig = url.parse().unwrap();
    let client = config.connect_client().await.unwrap();
    let tables =
        ["waku_state", "waku_counters", "waku_stats", "waku_positions", "waku_done", "waku_outbox", "waku_outbox_next"];
    for table in tables {
        let sql = format!("CREATE TEMP TABLE snap_{table} AS SELECT * FROM {table} WHERE projection = '{projection}'");
        client.batch_execute(&sql).await.unwrap();
    }
    publish_more(&*log, &module, WorkloadSpec { events: 2_000, accounts: 300, seed: 72 }, &mut oracle).await;
    wait_consumed("the second workload was consumed").await;
    // The database forgets the second workload's commits.
    let mut forget = String::from("BEGIN;");
    for table in tables {
        forget += &format!(
            "DELETE FROM {table} WHERE projection = '{projection}'; INSERT INTO {table} SELECT * FROM snap_{table};"
        );
    }
    client.batch_execute(&(forget + "COMMIT")).await.unwrap();
    // A few events more: few accounts, so most of what was forgotten is
    // read back only if it is applied again.
    publish_more(&*log, &module, WorkloadSpec { events: 100, accounts: 300, seed: 73 }, &mut oracle).await;
    wait_consumed("the forgotten and the new events were consumed").await;
    let redone = host.progress().redone();
    host.stop().await.unwrap();

    let check = demo::check_projection(&oracle, &*module, &store).unwrap();
    assert!(check.matches(), "{}", check.report(10));
    let stats = store.stats().unwrap();
    assert_eq!(stats[Stat::Applied], 4_100, "every event applied once in the database");
    assert!(redone >= 2_000, "the forgotten events count as redone: {redone}");
}

/// Two consumers of one PostgreSQL projection follow an assignment (as
/// Iggy's consumer group hands one out): partitions moved from A to B stop
/// on A and resume on B; then A dies mid-run (its task aborted, a batch
/// perhaps in flight) and B takes all partitions. Every event is applied
/// exactly once and the read model equals the oracle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_follow_the_assignment_and_a_dead_hosts_partitions_are_taken_over() {
    let Some(url) = postgres_url("partitions following an assignment") else { return };
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let (log, mut oracle) =
        bank_log(dir.path(), module.clone(), WorkloadSpec { events: 3_000, accounts: 80, seed: 41 }, 4).await;
    let projection = fresh_stream("assigned").replace('-', "_");
    let consumer = |assignment| {
        let store = StateStore::from_backend(PostgresStore::connect(&url, &projection).unwrap());
        let projection = Arc::new(Projection::new(&projection, "accounts", vec![module.clone()], store).unwrap());
        let config = ConsumerConfig { batch_size: 100, ..ConsumerConfig::default() };
        Consumer::new(log.clone(), projection, config).with_assignment(assignment)
    };
    let store = StateStore::from_backend(PostgresStore::connect(&url, &projection).unwrap());
    let all_consumed = || async {
        let ends = log.end_offsets("accounts").await.unwrap();
        (0..4).all(|p| store.position("accounts", p).unwrap() == Some(ends[p as usize]))
    };
    let held = |progress: &Progress| progress.partitions().iter().map(|p| p.partition).collect::<Vec<_>>();

    let (to_a, a_assigned) = tokio::sync::watch::channel(vec![0, 1, 2, 3]);
    let (to_b, b_assigned) = tokio::sync::watch::channel(vec![]);
    let (a, b) = (consumer(a_assigned), consumer(b_assigned));
    let (a_progress, b_progress) = (a.progress(), b.progress());
    let a_task = tokio::spawn(async move { a.follow(std::future::pending()).await });
    let (stop_b, b_stopped) = tokio::sync::oneshot::channel::<()>();
    let b_task = tokio::spawn(async move {
        b.follow(async {
            let _ = b_stopped.await;
        })
        .await
    });
    wait_for("A holds and caught up on 4 partitions", || held(&a_progress).len() == 4 && a_progress.caught_up()).await;

    // Partitions 2 and 3 move to B.
    to_a.send(vec![0, 1]).unwrap();
    to_b.send(vec![2, 3]).unwrap();
    wait_for("the move", || held(&a_progress) == [0, 1] && held(&b_progress) == [2, 3]).await;
    publish_more(&*log, &module, WorkloadSpec { events: 3_000, accounts: 80, seed: 42 }, &mut oracle).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !all_consumed().await {
        assert!(Instant::now() < deadline, "timed out consuming the second workload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A dies while events arrive; B is assigned everything.
    publish_more(&*log, &module, WorkloadSpec { events: 3_000, accounts: 80, seed: 43 }, &mut oracle).await;
    a_task.abort();
    to_b.send(vec![0, 1, 2, 3]).unwrap();
    wait_for("B took A's partitions", || held(&b_progress) == [0, 1, 2, 3]).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !all_consumed().await {
        assert!(Instant::now() < deadline, "timed out consuming the third workload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_b.send(()).unwrap();
    b_task.await.unwrap().unwrap();

    let check = demo::check_projection(&oracle, &*module, &store).unwrap();
    assert!(check.matches(), "{}", check.report(10));
    let stats = store.stats().unwrap();
    assert_eq!(stats[Stat::Applied], 9_000, "every event applied exactly once");
}

/// A host whose view of the assignment never changed while another host
/// briefly claimed one of its partitions (views of a rebalance that
/// crossed): its commit there is refused, and it takes the partition back
/// after a pause instead of leaving it without a host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_fenced_while_still_assigned_is_taken_back() {
    let Some(url) = postgres_url("a fenced partition still assigned") else { return };
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let (log, mut oracle) =
        bank_log(dir.path(), module.clone(), WorkloadSpec { events: 2_000, accounts: 50, seed: 61 }, 2).await;
    let projection = fresh_stream("retake").replace('-', "_");
    let store = StateStore::from_backend(PostgresStore::connect(&url, &projection).unwrap());
    let host_store = StateStore::from_backend(PostgresStore::connect(&url, &projection).unwrap());
    let host = Arc::new(Projection::new(&projection, "accounts", vec![module.clone()], host_store).unwrap());
    let config = ConsumerConfig { batch_size: 100, ..ConsumerConfig::default() };
    let (_assign, assigned) = tokio::sync::watch::channel(vec![0, 1]);
    let consumer = Consumer::new(log.clone(), host, config).with_assignment(assigned);
    let progress = consumer.progress();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        consumer
            .follow(async {
                let _ = stopped.await;
            })
            .await
    });
    wait_for("caught up", || progress.partitions().len() == 2 && progress.caught_up()).await;

    // Another host claims partition 1 and lets it go again.
    let epoch_before = store.claim(1).unwrap();
    publish_more(&*log, &module, WorkloadSpec { events: 2_000, accounts: 50, seed: 62 }, &mut oracle).await;
    let ends = log.end_offsets("accounts").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while (0..2).any(|p| store.position("accounts", p).unwrap() != Some(ends[p as usize])) {
        assert!(Instant::now() < deadline, "partition 1 was never taken back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(store.claim(1).unwrap() > epoch_before + 1, "the host claimed partition 1 again");
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
    let check = demo::check_projection(&oracle, &*module, &store).unwrap();
    assert!(check.matches(), "{}", check.report(10));
    let stats = store.stats().unwrap();
    assert_eq!(stats[Stat::Applied], 4_000, "every event applied once");
}

/// The round trips a batch costs stay the same as the batch holds more
/// keys: one partition, four batches, and about 20, 200 and then 2 000
/// keys per batch, with the state behind a proxy adding 0.5 ms each way
/// and counting the host's turns (the round trips it waits for). Before a
/// batch read its keys in one query, every key read was a round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_batch_stay_the_same_as_keys_per_batch_grow() {
    let Some(url) = postgres_url("round trips per batch") else { return };
    let upstream = wakuwaku_tests::proxy::upstream_of(&url).to_owned();
    let mut runs = Vec::new();
    for accounts in [40_u64, 400, 4_000] {
        let dir = tempfile::tempdir().unwrap();
        let module = bank_module();
        let spec = WorkloadSpec { events: accounts as usize * 2, accounts, seed: 5 };
        let (log, oracle) = bank_log(dir.path(), module.clone(), spec, 1).await;
        let proxy = wakuwaku_tests::proxy::LatencyProxy::start(upstream.clone(), Duration::from_micros(500)).unwrap();
        let projection = fresh_stream("trips").replace('-', "_");
        let config = ConsumerConfig { batch_size: spec.events / 4, ..ConsumerConfig::default() };
        let mut settings = host_settings(dir.path(), &projection, "accounts", vec![module.clone()], config);
        settings.state = StateSettings::Postgres { url: proxy.url_for(&url) };
        let (summary, projection) = catch_up(&log, settings).await.unwrap();
        // Counted before the check below reads every account.
        runs.push((accounts, proxy.turns(), summary.batches));
        let check = demo::check_projection(&oracle, &*module, projection.store()).unwrap();
        assert!(check.matches(), "{}", check.report(5));
    }
    eprintln!("accounts, round trips of the whole run, batches: {runs:?}");
    let fewest = runs.iter().map(|(_, turns, _)| *turns).min().unwrap();
    let most = runs.iter().map(|(_, turns, _)| *turns).max().unwrap();
    // The same batches, the same statements: what differs is how many
    // connections the pool opened and prepared statements on (about a
    // dozen round trips each). A round trip per key would add thousands.
    assert!(most <= fewest + 50, "round trips grow with the keys per batch: {runs:?}");
    // Four batches each: none was redone because its calls waited.
    assert!(runs.iter().all(|(_, _, batches)| *batches == 4), "{runs:?}");
}
