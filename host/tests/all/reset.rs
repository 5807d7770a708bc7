//! `waku reset`, run as a person would: the real binary over the embedded
//! log and state, and over PostgreSQL state when `WAKU_POSTGRES_URL` names
//! a server.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use crate::common::{self, bank_wasm, text, waku};
use wakuwaku::authoring::demo::{self, Oracle, WorkloadSpec};
use wakuwaku::engine::projection::load_module_file;
use wakuwaku::key::Key;
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
use wakuwaku::storage::log::{EmbeddedLog, EventLog};
use wakuwaku::storage::state::StateStore;
use wakuwaku::storage::stats::{Stat, Stats};

const PROJECTION: [&str; 6] = ["--data", "data", "--projection", "bank", "--topic", "accounts"];

/// Publishes a bank workload (`seed` picks it) to `accounts` in `dir/data`.
fn publish(dir: &Path, spec: WorkloadSpec, partitions: u32) -> Oracle {
    publish_with(dir, spec, partitions, &[])
}

/// [`publish`] with `env` set (`WAKU_IGGY` for another log).
fn publish_with(dir: &Path, spec: WorkloadSpec, partitions: u32, env: &[(&str, &str)]) -> Oracle {
    let (events, oracle) = demo::workload(spec);
    let lines: String =
        events.iter().map(|e| serde_json::json!({ "type": e.type_name, "body": e.body }).to_string() + "\n").collect();
    let file = dir.join(format!("events-{}.jsonl", spec.seed));
    std::fs::write(&file, lines).unwrap();
    let module = bank_wasm().to_string_lossy().into_owned();
    let partitions = partitions.to_string();
    let file = file.to_string_lossy().into_owned();
    let args = ["publish", "--data", "data", "--topic", "accounts", "--partitions", &partitions, "--module", &module];
    let out = common::waku_command(dir).args([&args[..], &[file.as_str()]].concat()).envs(env.iter().copied()).output();
    let out = out.unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    oracle
}

fn modules(dir: &Path) {
    let modules = dir.join("modules");
    if !modules.exists() {
        std::fs::create_dir(&modules).unwrap();
        std::fs::copy(bank_wasm(), modules.join("bank.wasm")).unwrap();
    }
}

/// `waku run --until-caught-up`; the number of events it consumed.
fn run_until_caught_up(dir: &Path) -> u64 {
    modules(dir);
    let out = waku(&[&["run"], &PROJECTION[..], &["--modules", "modules", "--until-caught-up"]].concat(), dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let rest = stdout.split("consumed ").nth(1).unwrap_or_else(|| panic!("no summary in {stdout:?}"));
    rest.split(' ').next().unwrap().parse().unwrap()
}

fn reset(dir: &Path, args: &[&str]) -> std::process::Output {
    waku(&[&["reset"], &PROJECTION[..], args].concat(), dir)
}

/// Every key's entries, the counters and the statistics of a state file.
type Dump = (BTreeMap<Key, Vec<(String, Vec<u8>)>>, Vec<(String, i128)>, Stats);

fn dump(store: &StateStore) -> Dump {
    let entries = store.keys().unwrap().into_iter().map(|key| (key.clone(), store.entries(&key).unwrap())).collect();
    (entries, store.counters().unwrap(), store.stats().unwrap())
}

fn state(dir: &Path) -> StateStore {
    StateStore::open(&dir.join("data/projections/bank.redb")).unwrap()
}

fn positions(dir: &Path, topic: &str) -> Vec<Option<u64>> {
    let store = state(dir);
    (0..3).map(|partition| store.position(topic, partition).unwrap()).collect()
}

/// The end offsets of `accounts`, read while no `waku` holds the log.
fn ends(dir: &Path) -> Vec<u64> {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let log = EmbeddedLog::open(dir.join("data/log.redb")).unwrap();
        log.end_offsets("accounts").await.unwrap()
    })
}

fn check_oracle(store: &StateStore, oracle: &Oracle) {
    let sandbox = Sandbox::new(SandboxLimits::default()).unwrap();
    let bank = load_module_file(&sandbox, bank_wasm()).unwrap();
    let check = demo::check_projection(oracle, &*bank, store).unwrap();
    assert!(check.matches(), "{}", check.report(5));
}

#[test]
fn earliest_starts_the_bank_over_and_keeps_the_old_state_as_a_backup() {
    const EVENTS: usize = 6_000;
    let dir = tempfile::tempdir().unwrap();
    let oracle = publish(dir.path(), WorkloadSpec { events: EVENTS, accounts: 60, seed: 3 }, 2);
    assert_eq!(run_until_caught_up(dir.path()), EVENTS as u64);
    let before = dump(&state(dir.path()));

    let out = reset(dir.path(), &["--to", "earliest", "--yes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("every event of `accounts` is applied again"), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let backup = stdout.split("its old state is in ").nth(1).and_then(|rest| rest.split(" (").next());
    // Named as `--data` was given: relative to the working directory.
    let backup = dir.path().join(backup.unwrap_or_else(|| panic!("no backup named in {stdout}")));
    {
        let store = state(dir.path());
        assert!(store.keys().unwrap().is_empty() && store.counters().unwrap().is_empty());
        assert!(store.stats().unwrap().is_empty());
        assert_eq!(store.position("accounts", 0).unwrap(), Some(0));
    }

    // The replay applies every event once more, onto an empty state.
    assert_eq!(run_until_caught_up(dir.path()), EVENTS as u64);
    let after = state(dir.path());
    check_oracle(&after, &oracle);
    assert_eq!(
        after.stats().unwrap()[Stat::Applied],
        EVENTS as u64,
        "every event applied exactly once since the reset"
    );
    assert!(dump(&after) == before, "the replay gives the read model the first run gave");
    drop(after);

    // The backup opens, holds the state as it was, and commands read it.
    let old = StateStore::open(&backup.join("projections/bank.redb")).unwrap();
    assert!(dump(&old) == before, "the backup holds the state as it was");
    check_oracle(&old, &oracle);
    drop(old);
    let backup = backup.strip_prefix(dir.path()).unwrap().to_string_lossy().into_owned();
    let key = oracle.accounts.keys().next().unwrap().to_string();
    let out = waku(&["state", "get", "--data", &backup, "--projection", "bank", "--key", &key], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("\"account\""), "{}", text(&out.stdout));

    // --no-backup keeps none.
    let out = reset(dir.path(), &["--to", "earliest", "--yes", "--no-backup"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("no backup was kept"), "{}", text(&out.stdout));
    assert_eq!(std::fs::read_dir(dir.path().join("data/backups")).unwrap().count(), 1);
}

#[test]
fn offset_latest_and_time_move_exactly_the_named_partitions_and_keep_state() {
    let dir = tempfile::tempdir().unwrap();
    publish(dir.path(), WorkloadSpec { events: 300, accounts: 20, seed: 1 }, 3);
    let first = ends(dir.path());
    // The second workload is appended strictly after `between`.
    std::thread::sleep(Duration::from_millis(20));
    let between = SystemTime::now();
    std::thread::sleep(Duration::from_millis(20));
    publish(dir.path(), WorkloadSpec { events: 300, accounts: 20, seed: 2 }, 3);
    let end = ends(dir.path());
    run_until_caught_up(dir.path());
    let consumed = dump(&state(dir.path()));
    let all: Vec<_> = end.iter().copied().map(Some).collect();
    assert_eq!(positions(dir.path(), "accounts"), all);

    // offset:N on partitions 0 and 2: partition 1 stays.
    let out = reset(dir.path(), &["--to", "offset:5", "--partitions", "0,2", "--yes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&format!("\n  partition 0: {} -> 5: {} events will be applied again", end[0], end[0] - 5)));
    assert!(!stderr.contains("\\n"), "each part of the plan on a line of its own, no literal `\\n`: {stderr}");
    assert!(!stderr.contains("partition 1:"), "{stderr}");
    assert_eq!(positions(dir.path(), "accounts"), [Some(5), Some(end[1]), Some(5)]);
    assert_eq!(dump(&state(dir.path())), consumed, "a move keeps the state");

    // latest: every partition to its end, skipping what is between.
    let out = reset(dir.path(), &["--to", "latest", "--yes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("events skipped will never be applied"), "{stderr}");
    assert!(stderr.contains(&format!("partition 0: 5 -> {}: {} events will never be applied", end[0], end[0] - 5)));
    assert_eq!(positions(dir.path(), "accounts"), all);

    // time: partition 1 to the first event of the second workload.
    let time = format!("time:{}", humantime::format_rfc3339_micros(between));
    let out = reset(dir.path(), &["--to", &time, "--partitions", "1", "--yes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(positions(dir.path(), "accounts"), [Some(end[0]), Some(first[1]), Some(end[2])]);
    // A time before everything: the start; after everything: the end.
    let out = reset(dir.path(), &["--to", "time:2000-01-01T00:00:00Z", "--partitions", "2", "--yes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(positions(dir.path(), "accounts"), [Some(end[0]), Some(first[1]), Some(0)]);
    let out = reset(dir.path(), &["--to", "time:2999-01-01T00:00:00Z", "--yes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(positions(dir.path(), "accounts"), all);
    assert_eq!(dump(&state(dir.path())), consumed);
}

#[test]
fn without_a_terminal_and_without_yes_nothing_is_reset() {
    let dir = tempfile::tempdir().unwrap();
    publish(dir.path(), WorkloadSpec { events: 100, accounts: 5, seed: 4 }, 3);
    run_until_caught_up(dir.path());
    let before = (positions(dir.path(), "accounts"), dump(&state(dir.path())));
    for target in ["earliest", "offset:0"] {
        let out = common::waku_command(dir.path())
            .args([&["reset"], &PROJECTION[..], &["--to", target]].concat())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{target}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("add --yes"), "{}", text(&out.stderr));
        assert_eq!((positions(dir.path(), "accounts"), dump(&state(dir.path()))), before, "{target}");
    }
    assert!(!dir.path().join("data/backups").exists(), "no backup either");
}

/// `waku reset` on a terminal (a pseudo-terminal from util-linux's
/// `script`), answering `answer`.
#[cfg(unix)]
fn reset_on_a_terminal(dir: &Path, args: &[&str], answer: &str) -> std::process::Output {
    use std::io::Write;
    let line = [&[env!("CARGO_BIN_EXE_waku"), "reset"], &PROJECTION[..], args].concat().join(" ");
    let mut child = Command::new("script")
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("util-linux `script` runs");
    child.stdin.take().unwrap().write_all(format!("{answer}\n").as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[cfg(unix)]
#[test]
fn on_a_terminal_it_asks_and_only_yes_resets() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: the terminal test needs util-linux `script`");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    publish(dir.path(), WorkloadSpec { events: 100, accounts: 5, seed: 8 }, 3);
    run_until_caught_up(dir.path());
    let before = positions(dir.path(), "accounts");
    // The terminal carries both streams: they come back on stdout.
    let out = reset_on_a_terminal(dir.path(), &["--to", "offset:1"], "no");
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(shown.contains("Type `yes` to go on") && shown.contains("the answer was not `yes`"), "{shown}");
    assert_eq!(positions(dir.path(), "accounts"), before);
    let out = reset_on_a_terminal(dir.path(), &["--to", "offset:1"], "yes");
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert_eq!(positions(dir.path(), "accounts"), [Some(1); 3]);
}

#[test]
fn bad_targets_and_partitions_are_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    publish(dir.path(), WorkloadSpec { events: 60, accounts: 5, seed: 5 }, 3);
    run_until_caught_up(dir.path());
    for (value, says) in [
        ("offset:minus", "the offset is not a whole number"),
        ("time:yesterday", "RFC 3339"),
        ("beginning", "expected earliest, latest, offset:N or time:RFC3339"),
    ] {
        let out = reset(dir.path(), &["--to", value, "--yes"]);
        assert_eq!(out.status.code(), Some(2), "{value}: {}", text(&out.stderr));
        let stderr = text(&out.stderr);
        assert!(stderr.contains(&format!("`{value}`")) && stderr.contains(says), "{value}: {stderr}");
    }
    for (args, says) in [
        (&["--to", "earliest", "--partitions", "0"][..], "takes no partition list"),
        (&["--to", "offset:100000"][..], "offset 100000 is past the end of `accounts` partition 0"),
        (&["--to", "latest", "--partitions", "7"][..], "has no partition 7"),
    ] {
        let out = reset(dir.path(), &[args, &["--yes"]].concat());
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(says), "{args:?}: {}", text(&out.stderr));
    }
}

#[cfg(unix)]
#[test]
fn a_reset_is_refused_while_a_run_holds_the_projection() {
    let dir = tempfile::tempdir().unwrap();
    publish(dir.path(), WorkloadSpec { events: 100, accounts: 5, seed: 6 }, 3);
    run_until_caught_up(dir.path());
    let before = dump(&state(dir.path()));
    let running = start_run(dir.path(), &PROJECTION);
    let pid = running.id();
    // The host names itself in its address file once it serves.
    let started = std::time::Instant::now();
    while !dir.path().join("data/running-host.json").exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "the run never wrote its address file");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = reset(dir.path(), &["--to", "earliest", "--yes"]);
    // Another projection's run on the same data directory: the log is held.
    let other = waku(
        &["run", "--data", "data", "--projection", "other", "--topic", "accounts", "--modules", "modules"],
        dir.path(),
    );
    stop_run(running);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("projection `bank` is in use") && stderr.contains("stop its `waku run` first"), "{stderr}");
    assert!(stderr.contains(&format!("in use by process {pid} ")), "the holder is named: {stderr}");
    let stderr = text(&other.stderr);
    assert_eq!(other.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("log.redb` is in use by another process"), "{stderr}");
    assert!(stderr.contains(&format!("held by: process {pid} (named in ")), "the holder is named: {stderr}");
    assert_eq!(dump(&state(dir.path())), before, "the refused reset changed nothing");
    // Stopped, it resets.
    let out = reset(dir.path(), &["--to", "earliest", "--yes", "--no-backup"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(state(dir.path()).keys().unwrap().is_empty());
}

/// Starts `waku run` with `args` and returns once its banner's last line
/// shows: from then on it holds the projection's state.
#[cfg(unix)]
fn start_run(dir: &Path, args: &[&str]) -> std::process::Child {
    modules(dir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_waku"))
        .args([&["run"], args, &["--modules", "modules"]].concat())
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.starts_with("waku: sandbox limits") => return child,
            Some(Ok(_)) => {}
            other => panic!("`waku run` ended before its banner: {other:?}"),
        }
    }
}

/// Stops a run started by [`start_run`] with SIGTERM; it exits 0.
#[cfg(unix)]
fn stop_run(mut child: std::process::Child) {
    let kill = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[cfg(unix)]
#[test]
fn on_postgresql_a_run_refuses_the_reset_and_earliest_keeps_the_rows_in_a_backup() {
    let Ok(url) = std::env::var("WAKU_POSTGRES_URL") else {
        eprintln!("skipped: the PostgreSQL reset command test needs a server named by WAKU_POSTGRES_URL");
        return;
    };
    const EVENTS: usize = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let oracle = publish(dir.path(), WorkloadSpec { events: EVENTS, accounts: 20, seed: 9 }, 2);
    // A projection of its own: the tables are shared.
    let stamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
    let projection = format!("reset-{stamp}");
    let target = ["--data", "data", "--projection", &projection, "--topic", "accounts", "--state", &url];
    let run = |dir: &Path| {
        let out = waku(&[&["run"], &target[..], &["--modules", "modules", "--until-caught-up"]].concat(), dir);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    modules(dir.path());
    assert!(run(dir.path()).contains(&format!("consumed {EVENTS} events")));
    let key = oracle.accounts.keys().next().unwrap().to_string();
    let state_get = |data: &str| {
        let args = ["state", "get", "--data", data, "--projection", &projection, "--key", &key];
        let out = match data {
            "data" => waku(&[&args[..], &["--state", &url]].concat(), dir.path()),
            _ => waku(&args, dir.path()),
        };
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let consumed = state_get("data");

    // A run holds the projection (a shared lock): the reset is refused.
    let running = start_run(dir.path(), &target);
    let out = waku(&[&["reset"], &target[..], &["--to", "earliest", "--yes"]].concat(), dir.path());
    stop_run(running);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("is in use"), "{}", text(&out.stderr));
    assert_eq!(state_get("data"), consumed);

    // Stopped, it starts over; the backup holds the projection's rows.
    let out = waku(&[&["reset"], &target[..], &["--to", "earliest", "--yes"]].concat(), dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let backup = stdout.split("its old state is in ").nth(1).and_then(|rest| rest.split(" (").next()).unwrap();
    assert!(backup.starts_with(&format!("data/backups/{projection}-")), "{backup}");
    assert_eq!(state_get(backup), consumed);
    assert!(!state_get("data").contains("\"account\""), "the state was cleared");

    // The replay gives the same read model, every event applied once.
    assert!(run(dir.path()).contains(&format!("consumed {EVENTS} events")));
    assert_eq!(state_get("data"), consumed);
}

#[test]
fn on_iggy_a_time_finds_each_named_partitions_offset() {
    let Ok(url) = std::env::var("WAKU_IGGY_URL") else {
        eprintln!("skipped: the Iggy reset command test needs a server named by WAKU_IGGY_URL");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let stamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
    let stream = format!("waku-reset-cli-{stamp}");
    // Every command of the test reads the log from the environment.
    let env = [("WAKU_IGGY", url.as_str()), ("WAKU_STREAM", stream.as_str())];
    let ends = || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let log = wakuwaku::storage::log::IggyLog::connect(&url, &stream).await.unwrap();
            log.end_offsets("accounts").await.unwrap()
        })
    };
    publish_with(dir.path(), WorkloadSpec { events: 300, accounts: 20, seed: 11 }, 3, &env);
    let first = ends();
    std::thread::sleep(Duration::from_millis(20));
    let between = SystemTime::now();
    std::thread::sleep(Duration::from_millis(20));
    publish_with(dir.path(), WorkloadSpec { events: 300, accounts: 20, seed: 12 }, 3, &env);
    let end = ends();
    modules(dir.path());
    let waku_iggy = |args: &[&str]| {
        let out = common::waku_command(dir.path()).args(args).envs(env).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    };
    waku_iggy(&[&["run"], &PROJECTION[..], &["--modules", "modules", "--until-caught-up"]].concat());
    let consumed = dump(&state(dir.path()));
    let time = format!("time:{}", humantime::format_rfc3339_micros(between));
    waku_iggy(&[&["reset"], &PROJECTION[..], &["--to", &time, "--partitions", "0,2", "--yes"]].concat());
    assert_eq!(positions(dir.path(), "accounts"), [Some(first[0]), Some(end[1]), Some(first[2])]);
    waku_iggy(&[&["reset"], &PROJECTION[..], &["--to", "offset:3", "--partitions", "1", "--yes"]].concat());
    assert_eq!(positions(dir.path(), "accounts"), [Some(first[0]), Some(3), Some(first[2])]);
    assert_eq!(dump(&state(dir.path())), consumed, "moves keep the state");
}
