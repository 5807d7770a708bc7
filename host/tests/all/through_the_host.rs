//! While `waku run` holds an embedded data directory, every other command
//! of that directory finds it and runs through it, through the real
//! binary: the same output as with nothing running; publishing, following
//! a topic, listing, showing and re-driving dead letters, rolling a module
//! back (which takes effect at once), reading state and status, asking
//! for a rebuild. A host killed
//! with SIGKILL leaves its address file behind, and a file that is not a
//! host's may be there: the commands read the files then.

#![cfg(unix)]

use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, probe_wasm, text, waku};
use serde_json::json;

const ADDRESS_FILE: &str = "data/running-host.json";

fn write_lines(dir: &Path, name: &str, lines: &[serde_json::Value]) -> String {
    let path = dir.join(name);
    let lines: Vec<String> = lines.iter().map(ToString::to_string).collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    path.to_string_lossy().into_owned()
}

fn ledger(key: u64, seq: u64, fail: Option<&str>) -> serde_json::Value {
    json!({"type": "Ledger", "body": {"key": key, "seq": seq, "amount": 1, "fail": fail, "ordering": "relaxed"}})
}

fn note(key: u64, text: &str) -> serde_json::Value {
    json!({"type": "Note", "body": {"key": key, "text": text, "emit_to": "out"}})
}

fn ok(dir: &Path, args: &[&str]) -> Output {
    let out = waku(args, dir);
    assert!(out.status.success(), "`waku {}`: {}{}", args.join(" "), text(&out.stdout), text(&out.stderr));
    out
}

/// `waku run` of projection `ledger`, following its topic.
fn start_host(dir: &Path) -> Child {
    let run = ["run", "--data", "data", "--projection", "ledger", "--topic", "ledger", "--modules", "modules"];
    let child = common::waku_command(dir)
        .args(run)
        .args(["--create-emit-topics", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the host serves its data directory", || dir.join(ADDRESS_FILE).exists());
    child
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "not within a minute: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn signal(child: &Child, name: &str) {
    let sent = std::process::Command::new("kill").args([name, &child.id().to_string()]).status().unwrap();
    assert!(sent.success());
}

/// The commands that read, each as a user would type it.
const READERS: [&[&str]; 9] = [
    &["status", "--data", "data", "--projection", "ledger", "--topic", "ledger"],
    &["state", "get", "--data", "data", "--projection", "ledger", "--key", "1"],
    &["state", "counters", "--data", "data", "--projection", "ledger"],
    &["dlq", "list", "--data", "data", "--projection", "ledger", "--topic", "ledger"],
    &["dlq", "show", "--data", "data", "--projection", "ledger", "--topic", "ledger", "--record", "0:0"],
    &["modules", "list", "--data", "data", "--projection", "ledger", "--modules", "modules", "--output", "json"],
    &["topic", "list", "--data", "data"],
    &["topic", "consume", "--data", "data", "--topic", "out", "--output", "json"],
    &["topic", "consume", "--data", "data", "--topic", "out", "--modules", "modules"],
];

/// Read commands that fail, with a path as typed in their message.
const REFUSED: [&[&str]; 2] = [
    &["state", "get", "--data", "data", "--projection", "nope", "--key", "1"],
    &["modules", "list", "--data", "data", "--projection", "ledger", "--modules", "nowhere"],
];

#[test]
fn while_waku_run_runs_every_command_of_its_data_directory_runs_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let probe = probe_wasm().to_string_lossy().into_owned();
    std::fs::create_dir(dir.join("modules")).unwrap();
    std::fs::copy(&probe, dir.join("modules/probe.wasm")).unwrap();
    // Key 1 ends in a dead letter, key 2 emits to `out`.
    let first =
        write_lines(dir, "first.jsonl", &[ledger(1, 0, None), ledger(1, 1, Some("unrecoverable")), note(2, "a")]);
    let publish = ["publish", "--data", "data", "--topic", "ledger", "--module", probe.as_str()];
    ok(dir, &[&publish[..], &["--partitions", "1", &first]].concat());
    let run = ["run", "--data", "data", "--projection", "ledger", "--topic", "ledger", "--modules", "modules"];
    ok(dir, &[&run[..], &["--create-emit-topics", "1", "--until-caught-up"]].concat());

    // The modules of `modules/` emit to `out`: their names are not its.
    let out = waku(&["topic", "consume", "--data", "data", "--topic", "out", "--modules", "modules"], dir);
    assert!(text(&out.stdout).contains(" tag "), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("module `probe` of modules emits to `out`"), "{}", text(&out.stderr));

    // With nothing running, then with the host running: the same.
    let alone: Vec<Output> = READERS.iter().chain(&REFUSED).map(|args| waku(args, dir)).collect();
    let mut host = start_host(dir);
    let address = dir.join(ADDRESS_FILE);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&address).unwrap().permissions().mode() & 0o777, 0o600);
    for (index, (args, alone)) in READERS.iter().chain(&REFUSED).zip(&alone).enumerate() {
        let through = waku(args, dir);
        let command = args.join(" ");
        match index < READERS.len() {
            true => assert!(alone.status.success(), "`waku {command}` alone: {}", text(&alone.stderr)),
            // The path as typed, never absolute.
            false => {
                let said = text(&alone.stderr);
                assert!(said.contains("`data`") || said.contains(" nowhere"), "`waku {command}` alone: {said}");
            }
        }
        assert_eq!(through.status.code(), alone.status.code(), "`waku {command}`: {}", text(&through.stderr));
        // Only a running host knows the end offsets it started at; every
        // other figure is the same.
        let startup_end_unknown = |out: &Output| match args[0] {
            "status" => without_startup_end(&text(&out.stdout)),
            _ => text(&out.stdout),
        };
        assert_eq!(startup_end_unknown(&through), startup_end_unknown(alone), "`waku {command}`");
        assert_eq!(text(&through.stderr), text(&alone.stderr), "`waku {command}`");
    }
    // A misspelt name is refused the same way.
    let out = waku(&["state", "get", "--data", "data", "--projection", "nope", "--key", "1"], dir);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("projection `nope` does not exist"), "{}", text(&out.stderr));

    // A follower of `out` sees what the host emits for an event published
    // while it runs.
    let mut follower = common::waku_command(dir)
        .args(["topic", "consume", "--data", "data", "--topic", "out", "--from", "1", "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = stdout_lines(&mut follower);
    // Standard input, as `publish -` reads it.
    let mut publisher = common::waku_command(dir)
        .args([&publish[..], &["-"]].concat())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    let more = [note(3, "while-running"), ledger(4, 0, Some("unrecoverable"))];
    let text_lines: Vec<String> = more.iter().map(ToString::to_string).collect();
    publisher.stdin.take().unwrap().write_all(text_lines.join("\n").as_bytes()).unwrap();
    let published = publisher.wait_with_output().unwrap();
    assert!(published.status.success());
    assert_eq!(text(&published.stdout), "published 2 events to `ledger`\n");
    let seen = lines.recv_timeout(Duration::from_secs(60)).expect("the follower shows the emitted message");
    assert!(seen.contains("while-running"), "{seen}");
    follower.kill().unwrap();
    let _ = follower.wait();

    // The new dead letter is listed, shown and re-driven with everything
    // else, in one pass.
    let list = ["dlq", "list", "--data", "data", "--projection", "ledger", "--topic", "ledger"];
    wait_until("the new dead letter is listed", || text(&waku(&list, dir).stdout).lines().count() == 2);
    let listed = text(&ok(dir, &list).stdout);
    let place = listed.lines().nth(1).unwrap().split('\t').next().unwrap().to_owned();
    let shown = text(
        &ok(dir, &["dlq", "show", "--data", "data", "--projection", "ledger", "--topic", "ledger", "--record", &place])
            .stdout,
    );
    assert!(shown.contains("class:        unrecoverable"), "{shown}");
    let redriven = text(
        &ok(dir, &["dlq", "redrive", "--data", "data", "--projection", "ledger", "--topic", "ledger", "--all"]).stdout,
    );
    assert!(redriven.starts_with("re-drove 2 dead letters (2 events)"), "{redriven}");
    assert!(redriven.trim_end().ends_with("the running `waku run` applies them now"), "{redriven}");

    // A new version swapped in, then rolled back through the host.
    let mut second = std::fs::read(&probe).unwrap();
    // A custom section at the end: the same module, another version.
    second.extend_from_slice(&[0, 6, 5, b'w', b'a', b'k', b'u', b'2']);
    let partial = dir.join("modules/.probe.partial");
    std::fs::write(&partial, &second).unwrap();
    std::fs::rename(&partial, dir.join("modules/probe.wasm")).unwrap();
    let kept = |dir: &Path| {
        let out = waku(&["modules", "list", "--data", "data", "--projection", "ledger", "--output", "json"], dir);
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        listed["modules"][0]["kept"].as_array().map_or(0, Vec::len)
    };
    wait_until("the new version is swapped in", || kept(dir) == 2);
    let rolled = text(&ok(dir, &["modules", "rollback", "--data", "data", "--projection", "ledger", "probe"]).stdout);
    assert!(rolled.starts_with("module `probe`: "), "{rolled}");

    // State and status of what the host applied since it started.
    let state = text(&ok(dir, &["state", "get", "--data", "data", "--projection", "ledger", "--key", "3"]).stdout);
    assert!(state.contains("while-running"), "{state}");
    let status = text(
        &ok(dir, &["status", "--data", "data", "--projection", "ledger", "--topic", "ledger", "--output", "json"])
            .stdout,
    );
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["projection"], "ledger", "{status}");
    let asked = text(
        &ok(
            dir,
            &[
                "rebuild",
                "--data",
                "data",
                "--projection",
                "ledger",
                "--topic",
                "ledger",
                "--modules",
                "modules",
                "--promote",
                "manual",
            ],
        )
        .stdout,
    );
    assert!(asked.starts_with("asked for rebuild 1 of `ledger`"), "{asked}");

    // A clean stop takes the address away.
    signal(&host, "-INT");
    assert!(host.wait().unwrap().success());
    assert!(!address.exists(), "a clean stop removes the address file");
    assert!(!dir.join("data/host.sock").exists(), "and the socket");

    // A host killed with SIGKILL leaves both: the commands read the files,
    // at once.
    host = start_host(dir);
    signal(&host, "-KILL");
    let _ = host.wait();
    assert!(address.exists());
    let started = Instant::now();
    let out = ok(dir, READERS[0]);
    assert!(text(&out.stdout).starts_with("projection `ledger`"), "{}", text(&out.stdout));
    assert!(started.elapsed() < Duration::from_secs(20), "no waiting for a host that is gone");
    assert_eq!(text(&out.stderr), "", "a killed host is no news");

    // A file that is not a host's: said, then the files.
    for (garbage, mode, said) in [
        (&b"{\"pid\": 1, \"socket\": \"/nowhere\""[..], 0o600, "is not a host's address"),
        (&[0xff; 100][..], 0o600, "is not a host's address"),
        (&b"{}"[..], 0o644, "may be read or written by others"),
    ] {
        std::fs::write(&address, garbage).unwrap();
        std::fs::set_permissions(&address, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = ok(dir, READERS[0]);
        assert!(text(&out.stderr).contains(said), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains("reading the files"), "{}", text(&out.stderr));
    }
    // A live process that is no host (this test), with nothing on the
    // socket: the files.
    let forged = json!({"pid": std::process::id(), "socket": dir.join("data/host.sock"), "token": "x"});
    std::fs::write(&address, forged.to_string()).unwrap();
    std::fs::set_permissions(&address, std::fs::Permissions::from_mode(0o600)).unwrap();
    ok(dir, READERS[0]);
    // A peer that takes the connection and never answers: an error, in time.
    let socket = dir.join("data/host.sock");
    let _ = std::fs::remove_file(&socket);
    let _silent = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).unwrap();
    let started = Instant::now();
    let out = waku(READERS[0], dir);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("did not answer within"), "{}", text(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// `(withdrawals, balance)` of bank account 42, read through whatever
/// owns the data directory.
fn account_42(dir: &Path) -> (i64, i64) {
    let out = ok(dir, &["state", "get", "--data", "data", "--projection", "bank", "--key", "42", "--output", "json"]);
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let account = &state["entries"]["account"];
    (account["withdrawals"].as_i64().unwrap_or(0), account["balance"].as_i64().unwrap_or(0))
}

/// Publishes a withdrawal of 10 from account 42 and waits until the
/// running host applied it: the balance after it.
fn withdraw_10(dir: &Path, bank: &str) -> i64 {
    let (withdrawals, _) = account_42(dir);
    let events =
        write_lines(dir, "withdraw.jsonl", &[json!({"type": "Withdrawn", "body": {"account": 42, "amount": 10}})]);
    ok(dir, &["publish", "--data", "data", "--topic", "accounts", "--module", bank, &events]);
    wait_until("the withdrawal is applied", || account_42(dir).0 == withdrawals + 1);
    account_42(dir).1
}

/// The active version of the bank module, as `modules list` shows it.
fn active_bank(dir: &Path) -> String {
    let out = ok(dir, &["modules", "list", "--data", "data", "--projection", "bank", "--output", "json"]);
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    listed["modules"][0]["active"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn a_rollback_through_the_running_host_takes_effect_at_once_or_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (v1, v2) = (common::bank_wasm(), common::bank_fee_wasm());
    let bank = v1.to_string_lossy().into_owned();
    std::fs::create_dir(dir.join("modules")).unwrap();
    std::fs::copy(v1, dir.join("modules/bank.wasm")).unwrap();
    let opened = write_lines(
        dir,
        "open.jsonl",
        &[
            json!({"type": "AccountOpened", "body": {"account": 42, "owner": "ann"}}),
            json!({"type": "Deposited", "body": {"account": 42, "amount": 100}}),
        ],
    );
    ok(dir, &["publish", "--data", "data", "--topic", "accounts", "--partitions", "1", "--module", &bank, &opened]);
    let run = ["run", "--data", "data", "--projection", "bank", "--topic", "accounts", "--modules", "modules"];
    let mut host = common::waku_command(dir).args(run).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_until("the host serves its data directory", || dir.join(ADDRESS_FILE).exists());
    let first = active_bank(dir);

    // v2 (a fee of 1 on every withdrawal) swapped in by a hot reload.
    let partial = dir.join("modules/.bank.partial");
    std::fs::copy(v2, &partial).unwrap();
    std::fs::rename(&partial, dir.join("modules/bank.wasm")).unwrap();
    wait_until("the new version is swapped in", || active_bank(dir) != first);
    let second = active_bank(dir);
    assert_eq!(withdraw_10(dir, &bank), 89, "v2 takes the fee");

    // Rolled back through the host: the next event is v1's, no fee.
    let rolled = ok(dir, &["modules", "rollback", "--data", "data", "--projection", "bank", "bank"]);
    assert_eq!(withdraw_10(dir, &bank), 79, "v1 runs at once after the rollback: no fee");
    assert_eq!(
        text(&rolled.stdout),
        format!("module `bank`: {second} → {first}; the running host runs {first} from its next batch\n")
    );
    assert_eq!(active_bank(dir), first);

    // A version that no longer loads (its kept copy altered) is refused,
    // said, and nothing changes: v1 runs on and stays recorded.
    let kept = dir.join(format!("data/modules/bank/bank/{second}.wasm"));
    let mut altered = std::fs::read(&kept).unwrap();
    altered.extend_from_slice(&[0, 4, 3, b'b', b'a', b'd']);
    std::fs::write(&kept, altered).unwrap();
    let refused = waku(&["modules", "rollback", "--data", "data", "--projection", "bank", "bank", &second[..8]], dir);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stdout));
    let said = text(&refused.stderr);
    assert!(said.contains(&format!("version {second} is refused, and {first} runs on (nothing changed)")), "{said}");
    assert!(said.contains("was altered"), "{said}");
    assert_eq!(text(&refused.stdout), "");
    assert_eq!(active_bank(dir), first);
    assert_eq!(withdraw_10(dir, &bank), 69, "v1 runs on");

    signal(&host, "-INT");
    assert!(host.wait().unwrap().success());
}

/// The lines of `child`'s standard output (piped), as they come.
fn stdout_lines(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (sender, lines) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().expect("standard output is piped");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    lines
}

/// `waku status`'s text with each partition's start-up end shown as
/// unknown (`-`), as the files show it.
fn without_startup_end(status: &str) -> String {
    let row = |line: &str| {
        let mut fields: Vec<&str> = line.split('\t').collect();
        if fields.len() == 7 && fields[0].parse::<u32>().is_ok() {
            fields[3] = "-";
        }
        fields.join("\t")
    };
    status.lines().map(|line| row(line) + "\n").collect()
}
