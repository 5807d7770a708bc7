//! A rebuild survives SIGKILL: `waku run` is killed while it builds a
//! shadow and while it promotes one, through the real binary. After every
//! kill the projection is either the old one (the old logic over every
//! event) or the promoted one (the new logic over every event), never a
//! mix: a `waku run --until-caught-up` on what the kill left, then the read
//! model against both oracles. The next `waku run` resumes the rebuild.
//! Also: `waku state get` (with `--shadow`, and through the running host's
//! admin endpoint with `--admin`) reads a waiting shadow and the live
//! state, and `waku rebuild` refuses what it cannot do.
//!
//! The same over two topics of timed ledger entries (the event-time tests'
//! workload): the live projection applied half of one topic late, out of
//! event-time order; a rebuild replays both topics from offset 0 in
//! event-time order, and once promoted the read model is a fresh replay's.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::common::{bank_fee_wasm, bank_wasm, probe_wasm, stderr_lines, text, variant_of, waku, waku_command};
use crate::event_time::{self, Entry};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use wakuwaku::authoring::demo::{self, Oracle, WorkloadSpec};
use wakuwaku::authoring::publish;
use wakuwaku::engine::projection::load_module_file;
use wakuwaku::operations::host::{StateSettings, open_state};
use wakuwaku::operations::rebuild::RebuildPaths;
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
use wakuwaku::storage::log::EventLog;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::state::StateStore;
use wakuwaku::storage::stats::Stat;

const RUN: [&str; 9] = ["run", "--data", "data", "--projection", "bank", "--topic", "accounts", "--modules", "modules"];

/// Publishes a bank workload to `accounts` in `dir/data/log.redb`; the
/// module directories `modules/` (the bank) and `new/` (the bank with a
/// fee); returns the old oracle.
async fn setup(dir: &Path, events: usize) -> Oracle {
    for (sub, wasm) in [("modules", bank_wasm()), ("new", bank_fee_wasm())] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        std::fs::copy(wasm, dir.join(sub).join("bank.wasm")).unwrap();
    }
    let sandbox = Sandbox::new(SandboxLimits::default()).unwrap();
    let module = load_module_file(&sandbox, bank_wasm()).unwrap();
    let (workload, oracle) = demo::workload(WorkloadSpec { events, accounts: 200, seed: 1414 });
    let outgoing = demo::outgoing(&*module, &workload).expect("the bank module");
    let log = EmbeddedLog::open(dir.join("data/log.redb")).unwrap();
    log.create_topic("accounts", 2).await.unwrap();
    publish::publish(&log, "accounts", module, outgoing, None, 2).await.unwrap();
    oracle
}

fn with_fee(oracle: &Oracle) -> Oracle {
    let mut fee = oracle.clone();
    for account in fee.accounts.values_mut() {
        account.balance -= account.withdrawals as i64;
    }
    fee
}

/// Starts `waku run` following the topic, with the rebuild's log lines.
fn follow(dir: &Path) -> Child {
    follow_with(dir, &[&RUN[..], &["--batch-size", "128"]].concat())
}

/// Starts `waku run` with `args` (following), with the rebuild's log lines.
fn follow_with(dir: &Path, args: &[&str]) -> Child {
    waku_command(dir)
        .args(args)
        .env("RUST_LOG", "warn,wakuwaku::operations::rebuild=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("waku starts")
}

/// Waits for a line of `child`'s standard error containing `wanted`;
/// false if it ended first.
fn wait_for_line(child: &mut Child, wanted: &str) -> bool {
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let found = loop {
        line.clear();
        if stderr.read_line(&mut line).unwrap_or(0) == 0 {
            break false;
        }
        if line.contains(wanted) {
            break true;
        }
    };
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    found
}

/// Brings what a kill left to the end of the log, then says whether the
/// projection is the promoted one, checking it is exactly one of the two.
fn check_old_or_new(dir: &Path, oracle: &Oracle, what: &str) -> bool {
    let caught_up = waku(&[&RUN[..], &["--until-caught-up"]].concat(), dir);
    assert!(caught_up.status.success(), "{what}: {}", text(&caught_up.stderr));
    let store = open_state(&dir.join("data"), &StateSettings::Embedded, "bank").unwrap();
    let sandbox = Sandbox::new(SandboxLimits::default()).unwrap();
    let module = load_module_file(&sandbox, bank_wasm()).unwrap();
    let old = demo::check_projection(oracle, &*module, &store).unwrap();
    let new = demo::check_projection(&with_fee(oracle), &*module, &store).unwrap();
    let promoted = RebuildPaths::new(&dir.join("data"), "bank").pointer().unwrap().is_some();
    match promoted {
        false => assert!(old.matches(), "{what}: not promoted, so the old logic: {}", old.report(3)),
        true => assert!(new.matches(), "{what}: promoted, so the new logic: {}", new.report(3)),
    }
    promoted
}

fn kill(mut child: Child) {
    child.kill().unwrap(); // SIGKILL: nothing is finished
    child.wait().unwrap();
}

/// Runs `waku` with `args` (following the log) until it logs that a
/// shadow was promoted, then kills it; false if it ended first, or did not
/// promote within 180 s.
pub(crate) fn follow_until_promoted(dir: &Path, args: &[&str]) -> bool {
    let mut child = follow_with(dir, args);
    let (pid, done) = (child.id(), std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)));
    let watchdog = done.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(180));
        if !watchdog.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    });
    let promoted = wait_for_line(&mut child, "promoted");
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    kill(child);
    promoted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_host_during_a_rebuild_and_during_its_promotion_leaves_the_old_or_the_new_projection() {
    let dir = tempfile::tempdir().unwrap();
    let oracle = setup(dir.path(), 20_000).await;
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    // The old projection, caught up first.
    assert!(!check_old_or_new(dir.path(), &oracle, "before the rebuild"));
    let asked = waku(
        &["rebuild", "--data", "data", "--projection", "bank", "--topic", "accounts", "--modules", "new"],
        dir.path(),
    );
    assert!(asked.status.success(), "{}", text(&asked.stderr));
    // Kills while the shadow is being built.
    for trial in 0..3 {
        let mut child = follow(dir.path());
        assert!(wait_for_line(&mut child, "rebuilding in the shadow"), "trial {trial}: the shadow never started");
        std::thread::sleep(Duration::from_millis(rng.random_range(50..400)));
        kill(child);
        assert!(!check_old_or_new(dir.path(), &oracle, &format!("kill {trial} during the rebuild")));
    }
    // Kills while promoting (a few milliseconds from its first line to the
    // pointer's rename), until one lands after the switch.
    let (mut left_old, mut left_new) = (0, 0);
    for trial in 0..12 {
        let mut child = follow(dir.path());
        assert!(wait_for_line(&mut child, "promoting:"), "trial {trial}: the promotion never started");
        std::thread::sleep(Duration::from_micros(rng.random_range(0..=1_500 * trial)));
        kill(child);
        match check_old_or_new(dir.path(), &oracle, &format!("kill {trial} during the promotion")) {
            false => left_old += 1,
            true => {
                left_new += 1;
                break;
            }
        }
    }
    println!("kills while promoting left the old projection {left_old} times, the promoted one {left_new} times");
    if left_new == 0 {
        // Let one run finish the promotion.
        let mut child = follow(dir.path());
        assert!(wait_for_line(&mut child, "promoted"), "the rebuild was never promoted");
        kill(child);
        assert!(check_old_or_new(dir.path(), &oracle, "after the promotion"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_shadow_is_read_with_state_get_shadow_and_promoted_on_the_go_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let oracle = setup(dir.path(), 2_000).await;
    let rebuild = |extra: &[&str]| {
        waku(&[&["rebuild", "--data", "data", "--projection", "bank"][..], extra].concat(), dir.path())
    };
    let refused = rebuild(&["--promote"]);
    assert!(!refused.status.success());
    assert!(text(&refused.stderr).contains("no rebuild of `bank` is under way"), "{}", text(&refused.stderr));
    let refused = rebuild(&["--rollback"]);
    assert!(text(&refused.stderr).contains("no previous state to roll back to"), "{}", text(&refused.stderr));
    let refused = rebuild(&["--topic", "accounts", "--modules", "new", "--state", "postgres://u:p@localhost/db"]);
    assert!(text(&refused.stderr).contains("needs the embedded state store"), "{}", text(&refused.stderr));

    let asked = rebuild(&["--topic", "accounts", "--modules", "new", "--promote", "manual"]);
    assert!(asked.status.success(), "{}", text(&asked.stderr));
    let again = rebuild(&["--topic", "accounts", "--modules", "new"]);
    assert!(text(&again.stderr).contains("already under way"), "{}", text(&again.stderr));
    let status = || {
        let out = waku(&["status", "--data", "data", "--projection", "bank", "--topic", "accounts"], dir.path());
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    // Before its first run the projection has no store: `status` says so
    // and creates none.
    let out = waku(&["status", "--data", "data", "--projection", "bank", "--topic", "accounts"], dir.path());
    assert!(text(&out.stderr).contains("projection `bank` does not exist in `data`"), "{}", text(&out.stderr));
    assert!(!dir.path().join("data/projections/bank.redb").exists());
    let account = *oracle.accounts.iter().find(|(_, a)| a.withdrawals > 0).unwrap().0;
    let key = account.to_string();
    let expected = &oracle.accounts[&account];
    let get = |extra: &[&str]| {
        let args =
            [&["state", "get", "--data", "data", "--projection", "bank", "--key", &key, "--output", "json"], extra]
                .concat();
        let out = waku(&args, dir.path());
        assert!(out.status.success(), "{extra:?}: {}", text(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        json["entries"]["account"]["balance"].as_i64().unwrap()
    };
    // The host builds the shadow, which then waits: while it runs, both
    // are read through its admin endpoint (it holds the files).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let address = format!("127.0.0.1:{port}");
    let mut child = waku_command(dir.path())
        .args(RUN)
        .args(["--batch-size", "128", "--admin", &address])
        .env("RUST_LOG", "warn,wakuwaku::operations::rebuild=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("waku starts");
    assert!(wait_for_line(&mut child, "waiting for `waku rebuild --promote`"), "the shadow caught up");
    let url = format!("http://{address}");
    // Without --admin, through the running host that holds the files.
    assert_eq!(get(&[]), expected.balance, "the running host, asked through its data directory");
    assert_eq!(get(&["--admin", &url]), expected.balance, "the running host serves the old logic");
    assert_eq!(get(&["--admin", &url, "--shadow"]), expected.balance - expected.withdrawals as i64, "and its shadow");
    let wrong = waku(&["state", "get", "--projection", "other", "--key", &key, "--admin", &url], dir.path());
    assert!(text(&wrong.stderr).contains("no projection `other` here"), "{}", text(&wrong.stderr));
    kill(child);
    let shadow =
        wakuwaku::storage::state::StateStore::open(&dir.path().join("data/rebuilds/bank/1/state.redb")).unwrap();
    let consumed: u64 = (0..2).map(|p| shadow.position("accounts", p).unwrap().unwrap_or(0)).sum();
    assert_eq!(consumed, 2_000, "the shadow consumed every event");
    drop(shadow);
    // With the host stopped, `waku status` reads the rebuild from its files.
    let shown = status();
    assert!(shown.contains("0 events to promotion"), "{shown}");
    assert!(shown.contains("shadow at") && !shown.contains("shadow at 0,"), "{shown}");
    assert_eq!(get(&[]), expected.balance, "the live projection keeps the old logic");
    assert_eq!(get(&["--shadow"]), expected.balance - expected.withdrawals as i64, "the shadow has the new logic");
    assert!(!check_old_or_new(dir.path(), &oracle, "waiting for the go-ahead"));

    let promote = rebuild(&["--promote"]);
    assert!(promote.status.success(), "{}", text(&promote.stderr));
    let mut child = follow(dir.path());
    assert!(wait_for_line(&mut child, "promoted"), "promoted on the go-ahead");
    kill(child);
    assert!(check_old_or_new(dir.path(), &oracle, "after the go-ahead"));
    let refused =
        waku(&["state", "get", "--data", "data", "--projection", "bank", "--key", &key, "--shadow"], dir.path());
    assert!(text(&refused.stderr).contains("no rebuild of `bank` is under way"), "{}", text(&refused.stderr));
}

/// A request that cannot be read for now (here `request.toml` is a
/// symlink loop: ELOOP, as EMFILE or EIO would be) is not a failed
/// rebuild: the request stays, and the rebuild starts once it reads again.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_cannot_be_read_for_now_is_kept_and_started_once_it_can() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path(), 500).await;
    let asked = waku(
        &["rebuild", "--data", "data", "--projection", "bank", "--topic", "accounts", "--modules", "new"],
        dir.path(),
    );
    assert!(asked.status.success(), "{}", text(&asked.stderr));
    let requests = dir.path().join("data/rebuilds/bank");
    let (request, held, other) =
        (requests.join("request.toml"), requests.join("held.toml"), requests.join("loop.toml"));
    std::fs::rename(&request, &held).unwrap();
    std::os::unix::fs::symlink("loop.toml", &request).unwrap();
    std::os::unix::fs::symlink("request.toml", &other).unwrap();

    let mut child = follow(dir.path());
    let lines = stderr_lines(&mut child);
    let mut seen = Vec::new();
    let mut wait_for = |wanted: &str| crate::common::wait_for_line(&lines, &mut seen, |line| line.contains(wanted));
    wait_for("the rebuild cannot start yet and is tried again");
    std::thread::sleep(Duration::from_secs(1)); // five more checks
    assert!(request.symlink_metadata().is_ok(), "the request was removed");
    std::fs::rename(&held, &other).unwrap(); // request.toml → the request
    wait_for("rebuilding in the shadow");
    kill(child);
    assert!(seen.iter().all(|line| !line.contains("the rebuild failed")), "{seen:#?}");
}

/// A projection's read model: every key's entries, and the counters.
type ReadModel = (Vec<KeyEntries>, Vec<(String, i128)>);

/// One key (as text) and its state entries.
type KeyEntries = (String, Vec<(String, Vec<u8>)>);

fn read_model(store: &StateStore) -> ReadModel {
    let mut keys: Vec<KeyEntries> =
        store.keys().unwrap().into_iter().map(|key| (key.to_string(), store.entries(&key).unwrap())).collect();
    keys.sort();
    let mut counters = store.counters().unwrap();
    counters.sort();
    (keys, counters)
}

/// The two-topic ledger projection `ledger` (over `a` and `b`) of a
/// rebuild test: its read model as the live host left it and a fresh
/// replay's, and a key whose last entry differs between the two.
struct TwoTopics {
    old: ReadModel,
    replayed: ReadModel,
    /// A key, its `seq` in the live projection and in a replay.
    key: (u64, u64, u64),
}

const LEDGER_KEYS: u64 = 40;
const LEDGER_PER_KEY: u64 = 40;

/// Publishes the ledger to `a` and `b` in `dir/data/log.redb`: all of `a`
/// and the first half of `b` (by event time) first, consumed by the live
/// projection; then the rest of `b`, which it applies late (its clock
/// passed those times), out of event-time order. Each partition stays in
/// event-time order, so a replay orders every key's entries. The module
/// directories: `modules/` (the probe) and `new/` (another version of it);
/// `waku.toml` names the projection and its two topics.
async fn setup_two_topics(dir: &Path) -> TwoTopics {
    let module = event_time::probe(dir);
    std::fs::create_dir_all(dir.join("new")).unwrap();
    std::fs::write(dir.join("new/probe.wasm"), variant_of(probe_wasm())).unwrap();
    let entries = event_time::workload(LEDGER_KEYS, LEDGER_PER_KEY, 45, false);
    let late = |(topic, entry): &(&str, Entry)| *topic == "b" && entry.seq > LEDGER_PER_KEY / 2;
    let (later, first): (Vec<_>, Vec<_>) = entries.iter().copied().partition(late);
    event_time::publish(dir, &module, &first).await;
    let run = waku(&event_time::run_args(), dir);
    assert!(run.status.success(), "{}", text(&run.stderr));
    event_time::publish(dir, &module, &later).await;
    let run = waku(&event_time::run_args(), dir);
    assert!(text(&run.stderr).contains("late event"), "{}", text(&run.stderr));
    let live = StateStore::open(&dir.join("data/projections/ledger.redb")).unwrap();
    assert!(live.stats().unwrap()[Stat::OrderViolations] > 0);
    let old = read_model(&live);
    drop(live);
    // A fresh replay of both topics under another name.
    let mut replay = event_time::run_args();
    *replay.iter_mut().find(|arg| **arg == "ledger").unwrap() = "replay";
    let run = waku(&replay, dir);
    assert!(run.status.success() && !text(&run.stderr).contains("late event"), "{}", text(&run.stderr));
    let replayed = read_model(&StateStore::open(&dir.join("data/projections/replay.redb")).unwrap());
    let counter = |model: &ReadModel, name: &str| model.1.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    assert_eq!(counter(&replayed, "ledger"), Some((LEDGER_KEYS * LEDGER_PER_KEY) as i128));
    assert_eq!(counter(&replayed, "out_of_order"), None, "the replay is in event-time order");
    assert!(counter(&old, "out_of_order").is_some_and(|n| n > 0), "the live projection applied entries late");
    let seq = |model: &ReadModel, key: u64| {
        let (_, entries) = model.0.iter().find(|(k, _)| *k == key.to_string()).expect("the key's state");
        let (_, seq) = entries.iter().find(|(name, _)| name == "seq").unwrap();
        serde_json::from_slice::<u64>(seq).unwrap()
    };
    let key = (0..LEDGER_KEYS)
        .map(|key| (key, seq(&old, key), seq(&replayed, key)))
        .find(|(_, old, replayed)| old != replayed)
        .expect("a key whose last entry was applied late");
    std::fs::write(dir.join("waku.toml"), "data = \"data\"\nprojection = \"ledger\"\ntopic = [\"a\", \"b\"]\n")
        .unwrap();
    TwoTopics { old, replayed, key }
}

/// `waku run` of the ledger projection following both topics.
fn follow_ledger(dir: &Path, extra: &[&str]) -> Child {
    let args: Vec<&str> = event_time::run_args().into_iter().filter(|arg| *arg != "--until-caught-up").collect();
    follow_with(dir, &[&args[..], extra].concat())
}

/// Brings what a kill left of the ledger projection to the end of the
/// log, then says whether it is the promoted one, checking that it is
/// exactly the live one as it was or exactly a fresh replay.
fn check_old_or_replayed(dir: &Path, two: &TwoTopics, what: &str) -> bool {
    let caught_up = waku(&event_time::run_args(), dir);
    assert!(caught_up.status.success(), "{what}: {}", text(&caught_up.stderr));
    let paths = RebuildPaths::new(&dir.join("data"), "ledger");
    let promoted = paths.pointer().unwrap().is_some_and(|pointer| pointer.active != paths.original_store());
    let store = open_state(&dir.join("data"), &StateSettings::Embedded, "ledger").unwrap();
    match promoted {
        false => assert!(read_model(&store) == two.old, "{what}: not promoted, so the live projection as it was"),
        true => {
            assert!(read_model(&store) == two.replayed, "{what}: promoted, so a replay's read model");
            assert_eq!(store.stats().unwrap()[Stat::OrderViolations], 0, "{what}: the shadow applied none late");
        }
    }
    promoted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_host_during_a_rebuild_over_two_timed_topics_and_its_promotion_leaves_the_old_or_a_replay() {
    let dir = tempfile::tempdir().unwrap();
    let two = setup_two_topics(dir.path()).await;
    let mut rng = ChaCha8Rng::seed_from_u64(45);
    let asked = waku(&["rebuild", "--topic", "a", "--topic", "b", "--modules", "new"], dir.path());
    assert!(asked.status.success(), "{}", text(&asked.stderr));
    for trial in 0..2 {
        let mut child = follow_ledger(dir.path(), &[]);
        assert!(wait_for_line(&mut child, "rebuilding in the shadow"), "trial {trial}: the shadow never started");
        std::thread::sleep(Duration::from_millis(rng.random_range(50..300)));
        kill(child);
        assert!(!check_old_or_replayed(dir.path(), &two, &format!("kill {trial} during the rebuild")));
    }
    let (mut left_old, mut left_new) = (0, 0);
    for trial in 0..12 {
        let mut child = follow_ledger(dir.path(), &[]);
        assert!(wait_for_line(&mut child, "promoting:"), "trial {trial}: the promotion never started");
        std::thread::sleep(Duration::from_micros(rng.random_range(0..=3_000 * trial)));
        kill(child);
        match check_old_or_replayed(dir.path(), &two, &format!("kill {trial} during the promotion")) {
            false => left_old += 1,
            true => {
                left_new += 1;
                break;
            }
        }
    }
    println!("kills while promoting left the old projection {left_old} times, the promoted one {left_new} times");
    if left_new == 0 {
        let mut child = follow_ledger(dir.path(), &[]);
        assert!(wait_for_line(&mut child, "promoted"), "the rebuild was never promoted");
        kill(child);
        assert!(check_old_or_replayed(dir.path(), &two, "after the promotion"));
    }
}

/// Over two topics named in `waku.toml`: a rebuild naming one of them is
/// refused; a manual one is built by the running host and read through
/// its admin endpoint and, the host stopped, from its files; promoted on
/// the go-ahead, rolled back after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_shadow_over_two_topics_is_read_through_the_host_and_its_files_promoted_and_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let two = setup_two_topics(dir.path()).await;
    let rebuild = |extra: &[&str]| waku(&[&["rebuild"][..], extra].concat(), dir.path());
    let refused = rebuild(&["--topic", "a", "--modules", "new"]);
    let said = text(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(said.contains("consumes `a`, `b` (as its host last started), but the rebuild names `a`"), "{said}");
    let asked = rebuild(&["--modules", "new", "--promote", "manual"]);
    assert!(asked.status.success(), "{}", text(&asked.stderr));

    let (key, old_seq, replayed_seq) = two.key;
    let key = key.to_string();
    let seq = |extra: &[&str]| {
        let out = waku(&[&["state", "get", "--key", &key, "--output", "json"][..], extra].concat(), dir.path());
        assert!(out.status.success(), "{extra:?}: {}", text(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        json["entries"]["seq"].as_u64().unwrap()
    };
    let status = |extra: &[&str]| {
        let args = [&["status", "--data", "data", "--projection", "ledger", "--topic", "a"][..], extra].concat();
        let out = waku(&args, dir.path());
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let address = format!("127.0.0.1:{port}");
    let mut child = follow_ledger(dir.path(), &["--admin", &address]);
    assert!(wait_for_line(&mut child, "waiting for `waku rebuild --promote`"), "the shadow caught up");
    let url = format!("http://{address}");
    assert_eq!(seq(&[]), old_seq, "the running host, asked through its data directory");
    assert_eq!(seq(&["--admin", &url]), old_seq, "the running host serves the live projection");
    assert_eq!(seq(&["--admin", &url, "--shadow"]), replayed_seq, "and its shadow, a replay");
    let shown = status(&["--admin", &url]);
    assert!(shown.contains("waiting for --promote") && shown.contains("0 events to promotion"), "{shown}");
    kill(child);

    // With the host stopped, from the files: the shadow stands at every
    // event of both topics.
    let shadow = StateStore::open(&dir.path().join("data/rebuilds/ledger/1/state.redb")).unwrap();
    let at = |partition| -> u64 { ["a", "b"].iter().map(|t| shadow.position(t, partition).unwrap().unwrap()).sum() };
    let (at_0, at_1) = (at(0), at(1));
    assert_eq!(at_0 + at_1, LEDGER_KEYS * LEDGER_PER_KEY, "the shadow consumed every event of both topics");
    drop(shadow);
    let shown = status(&[]);
    assert!(shown.contains("0 events to promotion"), "{shown}");
    for (partition, at) in [(0, at_0), (1, at_1)] {
        let line = format!("rebuild partition {partition}: shadow at {at}, live at {at}");
        assert!(shown.contains(&line), "no `{line}` in {shown}");
    }
    assert_eq!(seq(&[]), old_seq, "the live projection as it was");
    assert_eq!(seq(&["--shadow"]), replayed_seq, "the shadow, a replay");
    assert!(!check_old_or_replayed(dir.path(), &two, "waiting for the go-ahead"));

    let promote = rebuild(&["--promote"]);
    assert!(promote.status.success(), "{}", text(&promote.stderr));
    let mut child = follow_ledger(dir.path(), &[]);
    assert!(wait_for_line(&mut child, "promoted"), "promoted on the go-ahead");
    kill(child);
    assert!(check_old_or_replayed(dir.path(), &two, "after the go-ahead"));
    assert_eq!(seq(&[]), replayed_seq);

    let rollback = rebuild(&["--rollback"]);
    assert!(rollback.status.success(), "{}", text(&rollback.stderr));
    let mut child = follow_ledger(dir.path(), &[]);
    assert!(wait_for_line(&mut child, "rolled back"), "rolled back");
    kill(child);
    assert!(!check_old_or_replayed(dir.path(), &two, "after the rollback"));
}

/// A rebuild over two timed topics with an allowed lateness, run as the
/// live projection is: both hold each partition index's last events, which
/// wait for evidence the log does not hold yet. The shadow still counts as
/// caught up (its release stage is settled, its positions where the live
/// ones are) and is promoted; the promoted projection applied none late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_over_two_topics_with_an_allowed_lateness_is_promoted() {
    let dir = tempfile::tempdir().unwrap();
    let module = event_time::probe(dir.path());
    std::fs::create_dir_all(dir.path().join("new")).unwrap();
    std::fs::write(dir.path().join("new/probe.wasm"), variant_of(probe_wasm())).unwrap();
    event_time::publish(dir.path(), &module, &event_time::workload(LEDGER_KEYS, LEDGER_PER_KEY, 46, true)).await;
    let lateness = ["--allowed-lateness", "2s"];
    let run = waku(&[&event_time::run_args()[..], &lateness].concat(), dir.path());
    assert!(run.status.success(), "{}", text(&run.stderr));
    let held = |store: &StateStore| {
        (0..event_time::PARTITIONS).any(|partition| {
            let at = |topic: &str| store.position(topic, partition).unwrap().unwrap_or(0);
            at("release:read-to:a") + at("release:read-to:b") > at("a") + at("b")
        })
    };
    let live = StateStore::open(&dir.path().join("data/projections/ledger.redb")).unwrap();
    assert!(held(&live), "the live projection holds events within the allowance");
    drop(live);
    let asked = waku(
        &["rebuild", "--data", "data", "--projection", "ledger", "--topic", "a", "--topic", "b", "--modules", "new"],
        dir.path(),
    );
    assert!(asked.status.success(), "{}", text(&asked.stderr));

    let following: Vec<&str> =
        event_time::run_args().into_iter().filter(|arg| *arg != "--until-caught-up").chain(lateness).collect();
    let promoted = follow_until_promoted(dir.path(), &following);
    assert!(promoted, "the shadow was never promoted within 180 s");
    let paths = RebuildPaths::new(&dir.path().join("data"), "ledger");
    let pointer = paths.pointer().unwrap().expect("a promotion moves the pointer");
    assert_ne!(pointer.active, paths.original_store());
    let store = open_state(&dir.path().join("data"), &StateSettings::Embedded, "ledger").unwrap();
    assert_eq!(store.stats().unwrap()[Stat::OrderViolations], 0, "the shadow applied none late");
}
