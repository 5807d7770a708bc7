//! `waku reset` through the library: what waits in the retry and
//! dead-letter topics is not applied on top of a start-over; the bank
//! started over on PostgreSQL state (gated on `WAKU_POSTGRES_URL`) and on an
//! Iggy log, with a move by time (gated on `WAKU_IGGY_URL`). The command
//! itself, on the embedded log and store, is tested through the binary in
//! `host/tests/all/reset.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use wakuwaku::authoring::demo::{self, Oracle, WorkloadSpec};
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::engine::routing::RetryPolicy;
use wakuwaku::event::{Algebra, EventAtomicOrdering, EventHeaders};
use wakuwaku::key::Key;
use wakuwaku::operations::dead_letter::{self, Selection};
use wakuwaku::operations::host::{Host, HostSettings, StateSettings};
use wakuwaku::operations::reset::{self, Target};
use wakuwaku::storage::log::{EmbeddedLog, Record};
use wakuwaku::storage::log::{EventLog, IggyLog};
use wakuwaku::storage::state::{StateError, StateStore};
use wakuwaku::storage::stats::Stat;
use wakuwaku_tests::flaky::{Flaky, STEP, Step};
use wakuwaku_tests::{bank_log, bank_module, catch_up, host_settings, publish_bank};

const EVENTS: usize = 3_000;

/// The projection's store, taken for a reset as soon as no host holds it
/// (a stopped host's database session ends shortly after it).
fn store_for_reset(settings: &HostSettings) -> StateStore {
    let store = settings.open_state().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.lock_for_reset() {
            Ok(()) => return store,
            Err(StateError::InUse { .. }) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(error) => panic!("the reset cannot take the projection: {error}"),
        }
    }
}

/// Consumes (what a host stopped before left, `applied` events applied
/// already), starts over (with a backup that holds the first read model),
/// consumes again: the read model equals the oracle, every event applied
/// once since the reset.
async fn start_over_and_replay<L: EventLog>(
    log: &Arc<L>,
    settings: HostSettings,
    oracle: &Oracle,
    dir: &std::path::Path,
    applied: u64,
) {
    let module = bank_module();
    let (summary, _) = catch_up(log, settings.clone()).await.unwrap();
    assert_eq!(applied + summary.applied, EVENTS as u64);

    let store = store_for_reset(&settings);
    let plan = reset::plan(&**log, &store, "accounts", Target::Earliest, None).await.unwrap();
    assert_eq!(plan.moves.iter().map(|m| m.replayed()).sum::<u64>(), EVENTS as u64);
    let backup = reset::apply(&**log, &store, &settings.projection, &plan, Some(&dir.join("backups"))).await.unwrap();
    let backup = StateStore::open(&backup.unwrap().join(format!("projections/{}.redb", settings.projection))).unwrap();
    let check = demo::check_projection(oracle, &*module, &backup).unwrap();
    assert!(check.matches(), "the backup: {}", check.report(5));
    assert!(store.keys().unwrap().is_empty());
    drop(store);

    let (summary, projection) = catch_up(log, settings).await.unwrap();
    assert_eq!(summary.applied, EVENTS as u64);
    let check = demo::check_projection(oracle, &*module, projection.store()).unwrap();
    assert!(check.matches(), "after the replay: {}", check.report(5));
    assert_eq!(projection.store().stats().unwrap()[Stat::Applied], EVENTS as u64, "nothing applied twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bank_on_postgresql_starts_over_and_a_running_host_refuses_the_reset() {
    let Ok(url) = std::env::var("WAKU_POSTGRES_URL") else {
        eprintln!("skipped: the PostgreSQL reset test needs a server named by WAKU_POSTGRES_URL");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let spec = WorkloadSpec { events: EVENTS, accounts: 40, seed: 21 };
    let (log, oracle) = bank_log(dir.path(), module.clone(), spec, 2).await;
    // A projection no other run used: the tables are shared.
    let stamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
    let projection = format!("reset-{stamp}");
    let mut settings = host_settings(dir.path(), &projection, "accounts", vec![module], ConsumerConfig::default());
    settings.state = StateSettings::Postgres { url };

    // A host following the topic holds the projection: the reset is refused.
    let running =
        Host::start_on(log.clone(), HostSettings { until_caught_up: false, ..settings.clone() }).await.unwrap();
    let store = settings.open_state().unwrap();
    let refused = store.lock_for_reset().unwrap_err();
    assert!(matches!(refused, StateError::InUse { .. }), "{refused}");
    assert!(refused.to_string().contains("in use by another process"), "{refused}");
    // It may have consumed some of the events meanwhile, or all.
    let stopped = running.stop().await.unwrap();
    drop(store);

    start_over_and_replay(&log, settings, &oracle, dir.path(), stopped.applied).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bank_on_iggy_moves_by_time_and_starts_over() {
    let Some(url) = wakuwaku_tests::iggy_url("the Iggy reset test") else { return };
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let log = Arc::new(IggyLog::connect(&url, &wakuwaku_tests::fresh_stream("waku-reset")).await.unwrap());
    let spec = WorkloadSpec { events: EVENTS, accounts: 40, seed: 22 };
    let oracle = publish_bank(&*log, module.clone(), spec, 2).await;
    let first: Vec<u64> = log.end_offsets("accounts").await.unwrap();
    let settings = host_settings(dir.path(), "bank", "accounts", vec![module.clone()], ConsumerConfig::default());

    start_over_and_replay(&log, settings.clone(), &oracle, dir.path(), 0).await;

    // Events appended after `between` are found by time on partition 1 only.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let between = SystemTime::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    publish_bank(&*log, module, WorkloadSpec { events: 200, accounts: 40, seed: 23 }, 2).await;
    let end = log.end_offsets("accounts").await.unwrap();
    let store = store_for_reset(&settings);
    let plan = reset::plan(&*log, &store, "accounts", Target::Time(between), Some(&[1])).await.unwrap();
    assert_eq!(plan.moves.len(), 1);
    assert_eq!((plan.moves[0].partition, plan.moves[0].from, plan.moves[0].to), (1, first[1], first[1]));
    let plan = reset::plan(&*log, &store, "accounts", Target::Latest, Some(&[1])).await.unwrap();
    reset::apply(&*log, &store, "bank", &plan, None).await.unwrap();
    assert_eq!(store.position("accounts", 1).unwrap(), Some(end[1]));
    assert_eq!(store.position("accounts", 0).unwrap(), Some(first[0]), "partition 0 stays");
}

/// A flaky step of key `key` (one partition): `fail` says how its calls fail.
fn step(key: u64, seq: u64, fail: &[&str]) -> Record {
    let headers = EventHeaders {
        tag: STEP,
        key: Key::int(key),
        ordering: EventAtomicOrdering::Relaxed,
        algebra: Algebra::NonAssociative,
        event_time: None,
    };
    let fail = fail.iter().map(|s| (*s).to_owned()).collect();
    Record { headers: headers.to_headers(), body: Step { seq, amount: 1, fail, ..Step::default() }.body() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_waits_in_retry_and_the_dead_letters_are_not_applied_on_top_of_the_replay() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("steps", 1).await.unwrap();
    // Key 1 fails once, retryably: it waits in retry. Key 2 fails once,
    // for good: it is dead-lettered. Key 3 is applied. Each call after the
    // first succeeds.
    let events = vec![step(1, 1, &["retryable"]), step(2, 2, &["unrecoverable"]), step(3, 3, &[])];
    log.append("steps", vec![(0, events)]).await.unwrap();
    let module = Flaky::new();
    // The delay outlasts the first catch-up even on a loaded machine (a
    // retry due before it ends would be applied in it).
    let retry = RetryPolicy { delays: vec![Duration::from_secs(2)], max_attempts: 5, ..RetryPolicy::default() };
    let config = ConsumerConfig { retry, ..ConsumerConfig::default() };
    let settings = host_settings(dir.path(), "flaky", "steps", vec![Arc::new(module.clone())], config);
    let (summary, _) = catch_up(&log, settings.clone()).await.unwrap();
    assert_eq!((summary.applied, summary.retry_in, summary.dead_lettered), (1, 1, 1), "{summary:?}");

    let store = store_for_reset(&settings);
    let plan = reset::plan(&*log, &store, "steps", Target::Earliest, None).await.unwrap();
    reset::apply(&*log, &store, "flaky", &plan, None).await.unwrap();
    let letters = dead_letter::list(&*log, "steps", "flaky", &store).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert!(letters[0].redriven, "a dead letter from before the reset counts as re-driven");
    let redriven = dead_letter::redrive(&*log, "steps", "flaky", &store, &Selection::default()).await.unwrap();
    assert_eq!((redriven.records, redriven.already), (0, 1), "{redriven:?}");
    drop(store);

    // Past the retry's delay: the record waiting from before would be due.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!((summary.applied, summary.retry_in, summary.retry_out), (3, 0, 0), "{summary:?}");
    for key in 1..=3u64 {
        assert_eq!(Flaky::applied(projection.store(), &Key::int(key)), [key], "key {key}: applied once, by the replay");
    }
    let stats = projection.store().stats().unwrap();
    assert_eq!(stats[Stat::Applied], 3);
    assert_eq!(stats[Stat::DeadLettered], 0, "the replay dead-lettered nothing");
}
