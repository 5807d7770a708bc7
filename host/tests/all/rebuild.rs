//! A rebuild survives SIGKILL: `waku run` is killed while it builds a
//! shadow and while it promotes one, through the real binary. After every
//! kill the projection is either the old one (the old logic over every
//! event) or the promoted one (the new logic over every event), never a
//! mix: a `waku run --until-caught-up` on what the kill left, then the read
//! model against both oracles. The next `waku run` resumes the rebuild.
//! Also: `waku state get` (with `--shadow`, and through the running host's
//! admin endpoint with `--admin`) reads a waiting shadow and the live
//! state, and `waku rebuild` refuses what it cannot do.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::common::{bank_fee_wasm, bank_wasm, stderr_lines, text, waku, waku_command};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use wakuwaku::demo::{self, Oracle, WorkloadSpec};
use wakuwaku::host::{StateSettings, open_state};
use wakuwaku::log::EventLog;
use wakuwaku::log::embedded::EmbeddedLog;
use wakuwaku::projection::load_module_file;
use wakuwaku::publish;
use wakuwaku::rebuild::RebuildPaths;
use wakuwaku::runtime::{Sandbox, SandboxLimits};

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
    waku_command(dir)
        .args(RUN)
        .args(["--batch-size", "128"])
        .env("RUST_LOG", "warn,wakuwaku::rebuild=info")
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
        .env("RUST_LOG", "warn,wakuwaku::rebuild=info")
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
    let shadow = wakuwaku::state::StateStore::open(&dir.path().join("data/rebuilds/bank/1/state.redb")).unwrap();
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
