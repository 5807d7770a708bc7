//! Rebuilding a projection in the shadow while its host keeps serving it
//! (`crate::rebuild`): a bank projection is rebuilt with a changed module
//! (a fee per withdrawal, `tests/guests/bank-fee`).
//!
//! - Under load (events published while the host runs), the live read
//!   model keeps the old logic until the promotion, and the promoted one
//!   equals an oracle of the new logic over every event: none lost, none
//!   applied twice across the switch.
//! - With manual promotion, the caught-up shadow waits while the live
//!   projection keeps the old logic; promoted on the go-ahead; a rollback
//!   then brings the old state and versions back, and the old logic over
//!   every event.
//! - A shadow whose module fails (retryably, for good) routes its failures
//!   to its own `retry_<topic>.rebuild` and `dlq_<topic>.rebuild`: the
//!   shared ones and the live projection's counts are untouched, and after
//!   the promotion its dead letters are listed with `--rebuilt`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wakuwaku::authoring::demo::{self, Oracle, WorkloadSpec};
use wakuwaku::authoring::publish;
use wakuwaku::engine::routing::{RetryPolicy, Routed};
use wakuwaku::event::EventTypeTag;
use wakuwaku::key::Key;
use wakuwaku::operations::dead_letter::{self, Selection, Shelf};
use wakuwaku::operations::host::{Host, HostSettings, ModuleSource, RunningHost, StateSettings, open_state};
use wakuwaku::operations::rebuild::{self, Promote, RebuildPaths};
use wakuwaku::sandbox::handler::HandlerModule;
use wakuwaku::sandbox::runtime::content_version;
use wakuwaku::storage::log::EventLog;
use wakuwaku::storage::log::Record;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku_tests::{bank_fee_wasm, bank_module, bank_wasm, json_record, probe_wasm};

const TOPIC: &str = "accounts";
const PROJECTION: &str = "bank";

/// The fee oracle: the old oracle with every withdrawal costing 1 more.
fn with_fee(oracle: &Oracle) -> Oracle {
    let mut fee = oracle.clone();
    for account in fee.accounts.values_mut() {
        account.balance -= account.withdrawals as i64;
    }
    fee
}

/// Module directories: `old/bank.wasm` the bank, `new/bank.wasm` the bank
/// with a fee (same file name: the new version of the same module).
fn module_dirs(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (old, new) = (dir.join("old"), dir.join("new"));
    for (path, wasm) in [(&old, bank_wasm()), (&new, bank_fee_wasm())] {
        std::fs::create_dir_all(path).unwrap();
        std::fs::copy(wasm, path.join("bank.wasm")).unwrap();
    }
    (old, new)
}

/// Starts a host following the topic; with `admin`, serving the admin
/// endpoint (whose server lets go of the store a moment after the host
/// stopped: no restart then).
async fn start(log: &Arc<EmbeddedLog>, dir: &Path, modules: &Path, admin: bool) -> RunningHost<EmbeddedLog> {
    start_watching(log, dir, modules, admin, false).await
}

/// [`start`], watching `modules` for hot reload when `watch`.
async fn start_watching(
    log: &Arc<EmbeddedLog>,
    dir: &Path,
    modules: &Path,
    admin: bool,
    watch: bool,
) -> RunningHost<EmbeddedLog> {
    let source = ModuleSource::Directory { path: modules.to_owned(), adopt: false, watch };
    let mut settings = HostSettings::new(dir.join("data"), PROJECTION, TOPIC, source);
    settings.consumer.batch_size = 256;
    settings.admin = admin.then(|| "127.0.0.1:0".parse().unwrap());
    Host::start_on(log.clone(), settings).await.expect("the host starts")
}

/// Publishes `events` of the workload.
async fn publish_events(log: &EmbeddedLog, module: &Arc<dyn HandlerModule>, events: &[demo::WorkloadEvent]) {
    let outgoing = demo::outgoing(&**module, events).expect("the bank module");
    publish::publish(log, TOPIC, module.clone(), outgoing, None, 2).await.unwrap();
}

/// The oracle of the first `n` events.
fn oracle_of(events: &[demo::WorkloadEvent]) -> Oracle {
    let mut oracle = Oracle::default();
    for event in events {
        oracle.apply(event);
    }
    oracle
}

/// How long a wait for the host may take: generous, for a busy 2-core CI
/// machine running a debug build; a wait that times out names what it
/// waited for.
const PATIENCE: Duration = Duration::from_secs(180);

/// Waits until the host's committed positions reach the log's ends.
async fn caught_up_now(host: &RunningHost<EmbeddedLog>) {
    let started = Instant::now();
    loop {
        let status = host.status().await.unwrap();
        if status.partitions.iter().all(|p| p.lag == 0) {
            return;
        }
        assert!(started.elapsed() < PATIENCE, "the host never caught up: {status:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the host's rebuild reaches `phase`.
async fn rebuild_phase(host: &RunningHost<EmbeddedLog>, phase: &str) {
    let started = Instant::now();
    while host.rebuild().is_none_or(|status| status.phase != phase) {
        assert!(started.elapsed() < PATIENCE, "the rebuild never reached `{phase}`: {:?}", host.rebuild());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assert_read_model(host: &RunningHost<EmbeddedLog>, oracle: &Oracle, what: &str) {
    let check = demo::check_projection(oracle, &*bank_module(), host.projection().store()).unwrap();
    assert!(check.matches(), "{what}: {}", check.report(5));
}

fn module_version(host: &RunningHost<EmbeddedLog>) -> String {
    host.projection().modules()[0].version().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_under_load_keeps_the_old_logic_live_then_promotes_the_new_logic_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = module_dirs(dir.path());
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic(TOPIC, 2).await.unwrap();
    let module = bank_module();
    let (events, full) = demo::workload(WorkloadSpec { events: 40_000, accounts: 300, seed: 14 });
    assert!(full.accounts.values().any(|a| a.withdrawals > 0), "the workload withdraws");
    let (first, rest) = events.split_at(30_000);
    publish_events(&log, &module, first).await;

    let host = start(&log, dir.path(), &old, false).await;
    caught_up_now(&host).await;
    assert_read_model(&host, &oracle_of(first), "the live projection before the rebuild");
    let old_version = module_version(&host);

    // The rebuild is asked for while events keep coming.
    RebuildPaths::new(&dir.path().join("data"), PROJECTION).ask(&[TOPIC.to_string()], &new, Promote::Auto).unwrap();
    // The publisher stops once, after two chunks, until the test looked.
    let (paused, mut wait_paused) = tokio::sync::oneshot::channel::<()>();
    let (resume, wait_resume) = tokio::sync::oneshot::channel::<()>();
    let publisher = {
        let (log, module, rest) = (log.clone(), module.clone(), rest.to_vec());
        tokio::spawn(async move {
            let (mut paused, mut wait_resume) = (Some(paused), Some(wait_resume));
            for (i, chunk) in rest.chunks(500).enumerate() {
                if i == 2 {
                    let _ = paused.take().unwrap().send(());
                    let _ = wait_resume.take().unwrap().await;
                }
                publish_events(&log, &module, chunk).await;
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        })
    };
    (&mut wait_paused).await.unwrap();
    // Until the promotion, the live projection is the old logic: checked
    // while the rebuild's phase says building before and after the look.
    // The shadow may be promoted at any moment (during the look too: the
    // look then counts for nothing and is made again), since the phases
    // only move forward: building, promoting, promoted.
    let published = &events[..first.len() + 1_000];
    let phase = || host.rebuild().map(|status| status.phase).unwrap_or_default();
    let started = Instant::now();
    let checked_while_building = loop {
        let before = phase();
        caught_up_now(&host).await;
        if before == "building" {
            let check = demo::check_projection(&oracle_of(published), &*bank_module(), host.projection().store());
            if phase() == "building" {
                let check = check.unwrap();
                assert!(check.matches(), "the live projection during the rebuild: {}", check.report(5));
                break true;
            }
        }
        if before == "promoted" {
            assert_read_model(&host, &with_fee(&oracle_of(published)), "promoted early");
            break false;
        }
        assert!(started.elapsed() < PATIENCE, "the rebuild was neither building nor promoted: {:?}", host.rebuild());
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    println!("the live projection was checked while the shadow was building: {checked_while_building}");
    resume.send(()).unwrap();
    rebuild_phase(&host, "promoted").await;
    publisher.await.unwrap();
    caught_up_now(&host).await;

    assert_ne!(module_version(&host), old_version, "the new version runs after the promotion");
    assert_read_model(&host, &with_fee(&full), "the promoted projection against the new logic's oracle");
    let status = host.status().await.unwrap();
    assert_eq!(status.applied, events.len() as u64, "every event applied once: {status:?}");
    // The switch survives a restart: the pointer names the promoted store.
    host.stop().await.unwrap();
    let host = start(&log, dir.path(), &old, false).await;
    caught_up_now(&host).await;
    assert_read_model(&host, &with_fee(&full), "the promoted projection after a restart");
    assert_ne!(module_version(&host), old_version, "a restart runs the promoted versions");
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_promotion_waits_for_the_go_ahead_and_a_rollback_restores_the_old_state() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = module_dirs(dir.path());
    let data = dir.path().join("data");
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic(TOPIC, 2).await.unwrap();
    let module = bank_module();
    let (events, full) = demo::workload(WorkloadSpec { events: 6_000, accounts: 100, seed: 15 });
    let (first, rest) = events.split_at(3_000);
    publish_events(&log, &module, first).await;
    let host = start(&log, dir.path(), &old, true).await;
    caught_up_now(&host).await;
    let old_version = module_version(&host);

    let paths = RebuildPaths::new(&data, PROJECTION);
    paths.ask(&[TOPIC.to_string()], &new, Promote::Manual).unwrap();
    rebuild_phase(&host, "waiting for --promote").await;
    let waiting = host.rebuild().unwrap();
    assert_eq!(waiting.distance, 0, "caught up: {waiting:?}");
    // The admin endpoint shows it, and the host stays ready.
    let base = format!("http://{}", host.admin_address().unwrap());
    let before = oracle_of(first);
    let account = *before.accounts.iter().find(|(_, a)| a.withdrawals > 0).unwrap().0;
    let (ready, status, live, shadow) = tokio::task::spawn_blocking(move || {
        let get = |path: &str| ureq::get(&format!("{base}{path}")).call().map(|mut r| r.body_mut().read_to_string());
        let balance = |path: String| {
            let json: serde_json::Value = serde_json::from_str(&get(&path).unwrap().unwrap()).unwrap();
            json["entries"]["account"]["balance"].as_i64().unwrap()
        };
        let (live, shadow) = (balance(format!("/state/bank/{account}")), balance(format!("/shadow/bank/{account}")));
        (get("/ready").is_ok(), get("/status").unwrap().unwrap(), live, shadow)
    })
    .await
    .unwrap();
    assert!(ready, "/ready stays ready during a rebuild");
    let expected = &before.accounts[&account];
    assert_eq!(live, expected.balance, "/state: the live projection");
    assert_eq!(shadow, expected.balance - expected.withdrawals as i64, "/shadow: the shadow, with the fee");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["rebuild"]["phase"], "waiting for --promote", "{status}");
    assert_eq!(status["rebuild"]["distance"], 0, "{status}");
    assert!(waiting.partitions.iter().all(|&(_, shadow, live)| shadow == live), "{waiting:?}");
    // Caught up but not promoted: the live projection keeps the old logic.
    assert_read_model(&host, &oracle_of(first), "the live projection while the shadow waits");
    assert_eq!(module_version(&host), old_version);

    paths.ask_promotion().unwrap();
    rebuild_phase(&host, "promoted").await;
    assert_read_model(&host, &with_fee(&oracle_of(first)), "the promoted projection");
    publish_events(&log, &module, rest).await;
    caught_up_now(&host).await;
    assert_read_model(&host, &with_fee(&full), "the promoted projection after more events");

    paths.ask_rollback().unwrap();
    rebuild_phase(&host, "rolled back").await;
    caught_up_now(&host).await;
    assert_eq!(module_version(&host), old_version, "the old versions run again");
    assert_read_model(&host, &full, "the rolled-back projection: the old logic over every event");
    assert_eq!(host.status().await.unwrap().applied, events.len() as u64);
    host.stop().await.unwrap();
}

/// With the module directory watched, a promotion replaces the running
/// set as a whole: a later change in the watched directory applies on top
/// of the promoted modules, and never brings back the directory's older
/// files (which still hold the versions before the rebuild).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_promotion_hot_reload_applies_only_later_changes_of_the_watched_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = module_dirs(dir.path());
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic(TOPIC, 2).await.unwrap();
    let (events, _) = demo::workload(WorkloadSpec { events: 2_000, accounts: 50, seed: 16 });
    publish_events(&log, &bank_module(), &events).await;
    let host = start_watching(&log, dir.path(), &old, false, true).await;
    caught_up_now(&host).await;
    let data = dir.path().join("data");
    let library = host.library().unwrap().clone();

    RebuildPaths::new(&data, PROJECTION).ask(&[TOPIC.to_string()], &new, Promote::Auto).unwrap();
    rebuild_phase(&host, "promoted").await;
    let promoted = module_version(&host);
    assert_eq!(promoted, content_version(&std::fs::read(bank_fee_wasm()).unwrap()));

    // Something changes in the watched directory (a file that does not
    // load, named to come after `bank`: a reload looks at files in name
    // order, so once it tried this one it decided about `bank`): the
    // reload it sets off leaves the promoted bank alone.
    std::fs::write(old.join("marker.wasm"), b"\0asm broken").unwrap();
    let started = Instant::now();
    while !library.reloads().contains_key("marker") {
        assert!(started.elapsed() < PATIENCE, "the watched directory was never reloaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(module_version(&host), promoted, "a reload after the promotion brought the old file back");
    assert_eq!(library.recorded().unwrap().active["bank"], promoted, "the record names what runs");

    // A new bank written into the watched directory after the promotion
    // replaces the promoted one, and is recorded.
    let later = wakuwaku_tests::bank_variant(7);
    let temporary = old.join(".bank.wasm.tmp");
    std::fs::write(&temporary, &later).unwrap();
    std::fs::rename(&temporary, old.join("bank.wasm")).unwrap();
    let later = content_version(&later);
    let started = Instant::now();
    while module_version(&host) != later {
        assert!(started.elapsed() < PATIENCE, "the later change was never applied: {:?}", library.reloads());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(library.recorded().unwrap().active["bank"], later);
    // The promoted store keeps its copies apart from the store before it.
    for version in [&promoted, &later] {
        assert!(data.join(format!("rebuilds/bank/1/kept/bank/{version}.wasm")).is_file(), "{version}");
        assert!(!data.join(format!("modules/bank/bank/{version}.wasm")).exists(), "{version}");
    }

    // A rollback replaces the set as a whole too: the old version runs, and
    // a later reload leaves it alone although the directory holds another.
    // (It loads the directory's unrecorded modules, as a restart would: the
    // broken file goes first.)
    std::fs::remove_file(old.join("marker.wasm")).unwrap();
    RebuildPaths::new(&data, PROJECTION).ask_rollback().unwrap();
    rebuild_phase(&host, "rolled back").await;
    let restored = content_version(&std::fs::read(bank_wasm()).unwrap());
    assert_eq!(module_version(&host), restored);
    std::fs::write(old.join("marker2.wasm"), b"\0asm broken").unwrap();
    let started = Instant::now();
    while !library.reloads().contains_key("marker2") {
        assert!(started.elapsed() < PATIENCE, "the watched directory was never reloaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(module_version(&host), restored, "a reload after the rollback undid it");
    assert_eq!(library.recorded().unwrap().active["bank"], restored, "the record names what runs");
    host.stop().await.unwrap();
}

/// The records of `topic` tagged with `projection`, in every partition (0
/// before the host made the topic).
async fn routed_of(log: &EmbeddedLog, topic: &str, projection: &str) -> usize {
    let mut count = 0;
    for partition in 0..log.partitions(topic).await.unwrap_or(0) {
        let end = log.end_offset(topic, partition).await.unwrap();
        for stored in log.read(topic, partition, 0, end as usize).await.unwrap() {
            count += usize::from(Routed::parse(&stored.record.headers).unwrap().projection == projection);
        }
    }
    count
}

/// A ledger event of the probe for `key`, failing as `fail` says.
fn ledger(key: u64, seq: u64, fail: Option<&str>) -> Record {
    let body = serde_json::json!({"key": key, "seq": seq, "amount": 1, "fail": fail, "ordering": "relaxed"});
    json_record(EventTypeTag::new(50), key, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_routes_its_failures_to_its_own_topics_and_its_dead_letters_stay_listable_after_promotion() {
    const LEDGER: &str = "ledger";
    let dir = tempfile::tempdir().unwrap();
    let modules = dir.path().join("modules");
    std::fs::create_dir_all(&modules).unwrap();
    std::fs::copy(probe_wasm(), modules.join("probe.wasm")).unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    for (topic, partitions) in [(LEDGER, 2), ("notes-out", 1), ("out", 1)] {
        log.create_topic(topic, partitions).await.unwrap();
    }
    // Key 1 fails retryably until its attempts run out, key 2 for good;
    // key 3 never fails.
    let mut events = vec![ledger(1, 1, None), ledger(1, 2, Some("retryable")), ledger(1, 3, None)];
    events.extend([ledger(2, 1, Some("unrecoverable")), ledger(2, 2, None)]);
    events.extend((1..=10).map(|seq| ledger(3, seq, None)));
    log.append(LEDGER, vec![(0, events)]).await.unwrap();
    let source = ModuleSource::Directory { path: modules.clone(), adopt: false, watch: false };
    let mut settings = HostSettings::new(dir.path().join("data"), PROJECTION, LEDGER, source);
    settings.consumer.retry =
        RetryPolicy { delays: vec![Duration::from_millis(5)], max_attempts: 2, ..Default::default() };
    let host = Host::start_on(log.clone(), settings).await.expect("the host starts");
    let (shared_retry, shared_dlq) = ("retry_ledger", "dlq_ledger");
    let started = Instant::now();
    while routed_of(&log, shared_dlq, PROJECTION).await != 2 {
        assert!(started.elapsed() < PATIENCE, "the live projection never dead-lettered both events");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    caught_up_now(&host).await;
    assert_eq!(routed_of(&log, shared_dlq, PROJECTION).await, 2, "the live projection dead-lettered both");
    let live_stats = host.projection().store().stats().unwrap();
    let shared_ends = [log.end_offsets(shared_retry).await.unwrap(), log.end_offsets(shared_dlq).await.unwrap()];

    let paths = RebuildPaths::new(&dir.path().join("data"), PROJECTION);
    paths.ask(&[LEDGER.to_string()], &modules, Promote::Manual).unwrap();
    rebuild_phase(&host, "waiting for --promote").await;
    let shadow = rebuild::shadow_name(PROJECTION);
    assert_eq!(log.partitions("retry_ledger.rebuild").await.unwrap(), 2, "made with the topic's partitions");
    assert!(routed_of(&log, "retry_ledger.rebuild", &shadow).await > 0, "the shadow retried in its own topic");
    assert_eq!(routed_of(&log, "dlq_ledger.rebuild", &shadow).await, 2, "and dead-lettered in its own");
    let shared_now = [log.end_offsets(shared_retry).await.unwrap(), log.end_offsets(shared_dlq).await.unwrap()];
    assert_eq!(shared_now, shared_ends, "the shadow added nothing to the shared topics");
    assert_eq!(routed_of(&log, shared_retry, &shadow).await + routed_of(&log, shared_dlq, &shadow).await, 0);
    assert_eq!(host.projection().store().stats().unwrap(), live_stats, "the live projection's counts are untouched");

    let shelf = Shelf::rebuilt(LEDGER, PROJECTION);
    let before = dead_letter::list_on(&*log, LEDGER, &shelf, host.projection().store()).await.unwrap();
    assert!(before.len() == 2 && before.iter().all(|l| !l.owned), "not the live store's to re-drive: {before:?}");

    paths.ask_promotion().unwrap();
    rebuild_phase(&host, "promoted").await;
    let store = host.projection().store();
    let rebuilt = dead_letter::list_on(&*log, LEDGER, &shelf, store).await.unwrap();
    assert_eq!(rebuilt.len(), 2, "the rebuild's dead letters are listed with --rebuilt: {rebuilt:?}");
    assert!(rebuilt.iter().all(|l| l.owned && !l.redriven), "owned by the promoted store, not re-driven yet");
    // The unrecoverable one first, then the retryable one, out of attempts.
    let keys: Vec<_> = rebuilt.iter().map(|l| l.envelope.as_ref().unwrap().key.clone()).collect();
    assert_eq!(keys, [Key::int(2), Key::int(1)]);
    // The promoted store reads the shared retry topic from its end.
    let ends = log.end_offsets(shared_retry).await.unwrap();
    for (partition, end) in ends.into_iter().enumerate() {
        assert_eq!(store.position(shared_retry, partition as u32).unwrap(), Some(end));
    }
    host.stop().await.unwrap();

    // Re-driven, they join the shared retry topic as the projection's.
    let retried = routed_of(&log, shared_retry, PROJECTION).await;
    let store = open_state(&dir.path().join("data"), &StateSettings::Embedded, PROJECTION).unwrap();
    let done = dead_letter::redrive_on(&*log, LEDGER, PROJECTION, &shelf, &store, &Selection::default()).await.unwrap();
    assert_eq!(done.records, 2, "{done:?}");
    assert_eq!(routed_of(&log, shared_retry, PROJECTION).await, retried + 2);
    let after = dead_letter::list_on(&*log, LEDGER, &shelf, &store).await.unwrap();
    assert!(after.iter().all(|l| l.redriven), "marked re-driven: {after:?}");
}
