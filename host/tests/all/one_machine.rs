//! A day on one machine, through the real binary: names that do not
//! exist are refused and nothing is created for them; a stop leaves no
//! dead letter owed where `dlq list` cannot see it, one re-drive takes
//! every letter, and the counts add up; settings from `waku.toml` reach
//! every command; topics are listed, described and consumed.

use std::collections::BTreeSet;
use std::path::Path;

use crate::common::{self, bank_wasm, text, waku};
use serde_json::json;

/// Every path under `dir`, to see that a command created nothing.
fn tree(dir: &Path) -> BTreeSet<String> {
    fn walk(dir: &Path, root: &Path, paths: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            paths.insert(path.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            if path.is_dir() {
                walk(&path, root, paths);
            }
        }
    }
    let mut paths = BTreeSet::new();
    walk(dir, dir, &mut paths);
    paths
}

fn write_lines(dir: &Path, name: &str, lines: &[String]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n")).unwrap();
    path.to_string_lossy().into_owned()
}

/// `data/` with topic `accounts` (2 partitions) and projection `bank`
/// that consumed it, the bank module in `modules/`.
fn bank_data(dir: &Path) {
    let module = bank_wasm().to_string_lossy().into_owned();
    let events = [
        json!({"type": "AccountOpened", "body": {"account": 1, "owner": "ann"}}).to_string(),
        json!({"type": "Deposited", "body": {"account": 1, "amount": 5}}).to_string(),
    ];
    let file = write_lines(dir, "events.jsonl", &events);
    let out = waku(
        &["publish", "--data", "data", "--topic", "accounts", "--partitions", "2", "--module", &module, &file],
        dir,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::fs::create_dir(dir.join("modules")).unwrap();
    std::fs::copy(bank_wasm(), dir.join("modules/bank.wasm")).unwrap();
    let run = ["run", "--data", "data", "--projection", "bank", "--topic", "accounts", "--modules", "modules"];
    let out = waku(&[&run[..], &["--until-caught-up"]].concat(), dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn every_command_refuses_a_misspelt_projection_topic_or_data_directory_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    bank_data(dir.path());
    let before = tree(dir.path());
    // (command, where the names go): P a projection, T a topic, D the data directory.
    let commands: [&[&str]; 15] = [
        &["status", "--data", "D", "--projection", "P", "--topic", "T"],
        &["state", "get", "--data", "D", "--projection", "P", "--key", "1"],
        &["state", "counters", "--data", "D", "--projection", "P"],
        &["dlq", "list", "--data", "D", "--projection", "P", "--topic", "T"],
        &["dlq", "show", "--data", "D", "--projection", "P", "--topic", "T", "--record", "0:0"],
        &["dlq", "redrive", "--data", "D", "--projection", "P", "--topic", "T", "--all"],
        &["modules", "list", "--data", "D", "--projection", "P"],
        &["modules", "rollback", "--data", "D", "--projection", "P", "bank"],
        &["reset", "--data", "D", "--projection", "P", "--topic", "T", "--to", "earliest", "--yes"],
        &["rebuild", "--data", "D", "--projection", "P", "--promote"],
        &["rebuild", "--data", "D", "--projection", "P", "--rollback"],
        &["topic", "list", "--data", "D"],
        &["topic", "describe", "--data", "D", "--topic", "T"],
        &["topic", "consume", "--data", "D", "--topic", "T"],
        &["state", "get", "--data", "D", "--projection", "P", "--key", "1", "--shadow"],
    ];
    let mut checked = 0;
    for command in commands {
        let takes = |slot: &str| command.contains(&slot);
        let cases = [
            ("P", "nope", "projection `nope` does not exist in `data` (its projections: bank)"),
            (
                "T",
                "acounts",
                "topic `acounts` does not exist (the log's topics: accounts, dlq_accounts, retry_accounts)",
            ),
            ("D", "nowhere", "no data directory `nowhere` (data directories beside it: data)"),
        ];
        for (slot, wrong, expected) in cases.into_iter().filter(|(slot, ..)| takes(slot)) {
            let args: Vec<&str> = command
                .iter()
                .map(|arg| match *arg {
                    arg if arg == slot => wrong,
                    "P" => "bank",
                    "T" => "accounts",
                    "D" => "data",
                    arg => arg,
                })
                .collect();
            let out = waku(&args, dir.path());
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "`waku {}`: {stderr}", args.join(" "));
            assert!(stderr.contains(expected), "`waku {}`: `{expected}` not in {stderr}", args.join(" "));
            assert_eq!(tree(dir.path()), before, "`waku {}` created something", args.join(" "));
            checked += 1;
        }
    }
    assert_eq!(checked, 34);
    // A rebuild may come before the first run: a name not there yet is
    // said, not refused.
    let rebuild = ["rebuild", "--data", "data", "--projection", "nope", "--topic", "accounts", "--modules", "modules"];
    let out = waku(&rebuild, dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("note: projection `nope` does not exist in `data` (its projections: bank)"),
        "{}",
        text(&out.stderr)
    );
    // A data directory with nothing in it beside it either.
    let empty = tempfile::tempdir().unwrap();
    let out = waku(&["status", "--projection", "bank", "--topic", "accounts"], empty.path());
    assert!(
        text(&out.stderr)
            .contains("no data directory `waku-data` (none beside it either); `waku publish --partitions N`"),
        "{}",
        text(&out.stderr)
    );
    assert!(tree(empty.path()).is_empty());
}

/// `waku status --output json` of projection `ledger`.
fn ledger_status(dir: &Path) -> serde_json::Value {
    let out =
        waku(&["status", "--data", "data", "--projection", "ledger", "--topic", "ledger", "--output", "json"], dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The number before `word` in `line`: `12 dead letters` → 12.
fn number_before(line: &str, word: &str) -> u64 {
    let before = line.split(word).next().unwrap_or_else(|| panic!("no `{word}` in {line}"));
    before.split_whitespace().last().unwrap().parse().unwrap_or_else(|_| panic!("no number before `{word}` in {line}"))
}

#[cfg(unix)]
#[test]
fn a_stop_leaves_no_dead_letter_unseen_one_redrive_takes_them_all_and_the_counts_add_up() {
    const EVENTS: u64 = 3000;
    let dir = tempfile::tempdir().unwrap();
    let probe = common::probe_wasm().to_string_lossy().into_owned();
    let lines: Vec<String> = (0..EVENTS)
        .map(|n| {
            let fail = (n % 10 == 3).then_some("unrecoverable");
            json!({"type": "Ledger", "body": {"key": n % 40, "seq": n, "amount": 1, "fail": fail, "ordering": "relaxed"}})
                .to_string()
        })
        .collect();
    let file = write_lines(dir.path(), "ledger.jsonl", &lines);
    let out = waku(
        &["publish", "--data", "data", "--topic", "ledger", "--partitions", "2", "--module", &probe, &file],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::fs::create_dir(dir.path().join("modules")).unwrap();
    std::fs::copy(&probe, dir.path().join("modules/probe.wasm")).unwrap();
    let run = ["run", "--data", "data", "--projection", "ledger", "--topic", "ledger", "--modules", "modules"];
    let flags = ["--create-emit-topics", "1", "--batch-size", "16"];

    // Following the topic; stopped by SIGINT part way.
    let mut child = common::waku_command(dir.path())
        .args([&run[..], &flags[..]].concat())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = common::stderr_lines(&mut child);
    let mut seen = Vec::new();
    // Stopped as soon as the first failure is logged: batches with dead
    // letters are committing.
    common::wait_for_line(&lines, &mut seen, |line| line.contains(" WARN "));
    let kill = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    seen.extend(lines.try_iter());
    assert_eq!(status.code(), Some(0), "{seen:#?}");

    // Nothing owed: every dead letter counted is in the log, listed.
    let stopped = ledger_status(dir.path());
    assert_eq!(stopped["outbox"], 0, "a graceful stop appends its outbox: {stopped}");
    let dead = stopped["dead_lettered"].as_u64().unwrap();
    assert!(dead > 0, "nothing was dead-lettered before the stop: {stopped}");
    assert!(dead < EVENTS / 10, "the stop came after the last failure; the test needs a larger workload: {stopped}");
    let dlq = |args: &[&str]| {
        let base = ["dlq", args[0], "--data", "data", "--projection", "ledger", "--topic", "ledger"];
        waku(&[&base[..], &args[1..]].concat(), dir.path())
    };
    let out = dlq(&["list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary = text(&out.stderr);
    assert_eq!(number_before(&summary, "dead letter"), dead, "{summary}");
    assert!(!summary.contains("outbox"), "{summary}");
    assert_eq!(text(&out.stdout).lines().count() as u64, dead);
    let out = dlq(&["list", "--output", "json"]);
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listing["in_outbox"], 0, "{listing}");

    // One re-drive takes every letter listed.
    let out = dlq(&["redrive", "--all"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let redrove = text(&out.stdout);
    assert_eq!(number_before(&redrove, "dead letter"), dead, "{redrove}");
    let out = dlq(&["redrive", "--all"]);
    assert!(text(&out.stdout).starts_with("re-drove 0 dead letters"), "{}", text(&out.stdout));

    // The rest, and the re-driven letters again (the module still fails
    // them): every event published is accounted for.
    let out = waku(&[&run[..], &flags[..], &["--until-caught-up"]].concat(), dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let done = ledger_status(dir.path());
    let count = |name: &str| done[name].as_u64().unwrap_or_else(|| panic!("no {name} in {done}"));
    assert_eq!(count("redriven"), dead, "{done}");
    assert_eq!(count("applied"), EVENTS - EVENTS / 10, "{done}");
    assert_eq!(
        count("applied") + count("skipped") + count("retrying") + count("dead_lettered") - count("redriven"),
        EVENTS,
        "the counts add up to the events published: {done}"
    );
    let out = waku(&["status", "--data", "data", "--projection", "ledger", "--topic", "ledger"], dir.path());
    let shown = text(&out.stdout);
    assert!(shown.contains(&format!("({dead} of them re-driven since)")), "{shown}");
}

#[test]
fn settings_from_waku_toml_reach_every_command() {
    let dir = tempfile::tempdir().unwrap();
    bank_data(dir.path());
    std::fs::create_dir(dir.path().join("new-modules")).unwrap();
    std::fs::copy(bank_wasm(), dir.path().join("new-modules/bank.wasm")).unwrap();
    std::fs::write(
        dir.path().join("waku.toml"),
        "data = \"data\"\nprojection = \"bank\"\ntopic = \"accounts\"\nmodules = \"new-modules\"\n",
    )
    .unwrap();
    let ok = |args: &[&str]| {
        let out = waku(args, dir.path());
        assert!(out.status.success(), "`waku {}`: {}", args.join(" "), text(&out.stderr));
        text(&out.stdout)
    };
    assert!(ok(&["status"]).starts_with("projection `bank` on topic `accounts`"));
    assert!(ok(&["state", "get", "--key", "1"]).contains("\"owner\": \"ann\""));
    assert!(ok(&["state", "counters"]).contains("open_accounts"));
    ok(&["dlq", "list"]);
    assert!(ok(&["modules", "list"]).contains("the directory holds the active version"), "modules from the file");
    assert!(ok(&["topic", "describe"]).starts_with("topic `accounts`: 2 partitions, 2 messages"));
    assert_eq!(ok(&["topic", "consume", "--output", "json"]).lines().count(), 2);
    assert!(ok(&["topic", "consume"]).contains("type AccountOpened (tag "), "names from the file's modules");
    // The file's modules ask for a rebuild; a bare --promote is the
    // go-ahead whatever the file says, and --rollback leaves them out.
    let asked = ok(&["rebuild", "--promote", "manual"]);
    assert!(asked.starts_with("asked for rebuild 1 of `bank`"), "{asked}");
    let promote = ok(&["rebuild", "--promote"]);
    assert!(promote.starts_with("asked the running host to promote rebuild 1 of `bank`"), "{promote}");
    let out = waku(&["rebuild", "--rollback"], dir.path());
    assert!(!text(&out.stderr).contains("cannot be used with"), "{}", text(&out.stderr));
    // The admin address in one form for `run` and `status`.
    std::fs::write(dir.path().join("waku.toml"), "data = \"data\"\nprojection = \"bank\"\nadmin = \"127.0.0.1:1\"\n")
        .unwrap();
    // From the file, an endpoint nobody listens on means no host runs: the
    // files are read. Given as a flag, it is what was asked for.
    let out = waku(&["status", "--topic", "accounts"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("projection `bank` on topic `accounts`"), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr)
            .contains("no host answers at the admin endpoint http://127.0.0.1:1 (setting `admin`); reading the files"),
        "{}",
        text(&out.stderr)
    );
    let out = waku(&["status", "--topic", "accounts", "--admin", "http://127.0.0.1:1/"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("asking http://127.0.0.1:1/status"), "{}", text(&out.stderr));
}

#[test]
fn topics_are_created_listed_described_and_consumed() {
    let dir = tempfile::tempdir().unwrap();
    bank_data(dir.path());
    let ok = |args: &[&str]| {
        let out = waku(args, dir.path());
        assert!(out.status.success(), "`waku {}`: {}", args.join(" "), text(&out.stderr));
        text(&out.stdout)
    };
    assert_eq!(
        ok(&["topic", "create", "--data", "data", "--topic", "orders", "--partitions", "3"]).trim(),
        "topic `orders` has 3 partitions"
    );
    ok(&["topic", "create", "--data", "data", "--topic", "orders", "--partitions", "3"]);
    let out = waku(&["topic", "create", "--data", "data", "--topic", "orders", "--partitions", "2"], dir.path());
    assert!(text(&out.stderr).contains("topic `orders` has 3 partitions, not 2"), "{}", text(&out.stderr));
    let out = waku(&["topic", "create", "--data", "data", "--topic", "dlq_orders", "--partitions", "2"], dir.path());
    assert!(text(&out.stderr).contains("is one of the host's own topics"), "{}", text(&out.stderr));

    let listed = ok(&["topic", "list", "--data", "data"]);
    assert!(listed.contains("accounts\t2 partitions\t2 messages"), "{listed}");
    assert!(listed.contains("orders\t3 partitions\t0 messages"), "{listed}");
    let listed: serde_json::Value =
        serde_json::from_str(&ok(&["topic", "list", "--data", "data", "--output", "json"])).unwrap();
    assert!(listed["topics"].as_array().unwrap().contains(&json!({"topic": "orders", "partitions": 3, "messages": 0})));
    let described: serde_json::Value =
        serde_json::from_str(&ok(&["topic", "describe", "--data", "data", "--topic", "accounts", "--output", "json"]))
            .unwrap();
    let messages: u64 =
        described["partitions"].as_array().unwrap().iter().map(|p| p["messages"].as_u64().unwrap()).sum();
    assert_eq!((messages, &described["durability"]), (2, &json!("durable")), "{described}");

    let out = waku(&["topic", "consume", "--data", "data", "--topic", "accounts"], dir.path());
    let consumed = text(&out.stdout);
    let lines: Vec<&str> = consumed.lines().collect();
    assert_eq!(lines.len(), 2, "{consumed}");
    assert!(lines.iter().all(|line| line.contains("key 1 tag ")), "{consumed}");
    assert!(consumed.contains(r#""owner":"ann""#), "{consumed}");
    // Without modules, one line says how to see the types' names.
    let hint = text(&out.stderr);
    assert_eq!(hint.lines().count(), 1, "{hint}");
    assert!(hint.contains("shown by tag; give the module directory of a projection that reads `accounts`"), "{hint}");
    // With the modules of a projection that reads it, the names.
    let out = waku(&["topic", "consume", "--data", "data", "--topic", "accounts", "--modules", "modules"], dir.path());
    let named = text(&out.stdout);
    assert!(named.lines().any(|line| line.contains("key 1 type AccountOpened (tag ")), "{named}");
    assert!(named.lines().any(|line| line.contains("key 1 type Deposited (tag ")), "{named}");
    assert_eq!(text(&out.stderr), "");
    let json_lines =
        ok(&["topic", "consume", "--data", "data", "--topic", "accounts", "--output", "json", "--limit", "1"]);
    let first: serde_json::Value = serde_json::from_str(json_lines.trim()).unwrap();
    assert_eq!((&first["topic"], &first["event"]["key"]), (&json!("accounts"), &json!(1)), "{first}");
    assert_eq!(first["event"]["type_name"], json!(null), "{first}");
    let json_lines = ok(&[
        "topic",
        "consume",
        "--data",
        "data",
        "--topic",
        "accounts",
        "--output",
        "json",
        "--limit",
        "1",
        "--modules",
        "modules",
    ]);
    let first: serde_json::Value = serde_json::from_str(json_lines.trim()).unwrap();
    assert!(["AccountOpened", "Deposited"].contains(&first["event"]["type_name"].as_str().unwrap_or("")), "{first}");
    assert!(first["body"]["text"].as_str().unwrap().contains("\"account\":1"), "{first}");
    // A module directory past its count is refused, as `waku run` refuses it,
    // not read in part.
    let crowded = dir.path().join("crowded");
    std::fs::create_dir_all(&crowded).unwrap();
    for n in 0..=64 {
        std::fs::write(crowded.join(format!("m{n:02}.wasm")), b"not a component").unwrap();
    }
    let out = waku(&["topic", "consume", "--data", "data", "--topic", "accounts", "--modules", "crowded"], dir.path());
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("module-count: a module directory holds at most 64 modules"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(ok(&["topic", "consume", "--data", "data", "--topic", "accounts", "--from", "end"]), "");
    let out = waku(&["topic", "consume", "--data", "data", "--topic", "accounts", "--partition", "5"], dir.path());
    assert!(
        text(&out.stderr).contains("topic `accounts` has no partition 5 (it has 2 partitions)"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn waku_test_keeps_its_compiled_module_and_says_when_the_arguments_are_swapped() {
    let dir = tempfile::tempdir().unwrap();
    let module = bank_wasm().to_string_lossy().into_owned();
    let events = write_lines(
        dir.path(),
        "events.jsonl",
        &[json!({"type": "AccountOpened", "body": {"account": 1, "owner": "ann"}}).to_string()],
    );
    let out = waku(&["test", &events, &module], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("is a WebAssembly component, not sample events: the component comes first"),
        "{}",
        text(&out.stderr)
    );
    let cache = dir.path().join("cache");
    for _ in 0..2 {
        let out = waku(&["test", &module, &events, "--compile-cache", "cache"], dir.path());
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(text(&out.stdout).contains("owner"), "{}", text(&out.stdout));
    }
    let kept = std::fs::read_dir(&cache).unwrap().count();
    assert!(kept > 0, "the compiled module is kept in {}", cache.display());
}

#[test]
fn topics_on_iggy_are_created_listed_described_and_consumed_as_on_the_embedded_log() {
    let Some(url) = common::servers::iggy_url("topics on Iggy") else { return };
    let dir = tempfile::tempdir().unwrap();
    let stream = common::servers::fresh_stream("waku-topics");
    let on_iggy = |args: &[&str]| {
        let out = waku(&[args, &["--iggy", &url, "--stream", &stream]].concat(), dir.path());
        assert!(out.status.success(), "`waku {}`: {}", args.join(" "), text(&out.stderr));
        text(&out.stdout)
    };
    on_iggy(&["topic", "create", "--topic", "orders", "--partitions", "2"]);
    let module = bank_wasm().to_string_lossy().into_owned();
    let file = write_lines(
        dir.path(),
        "events.jsonl",
        &[json!({"type": "AccountOpened", "body": {"account": 1, "owner": "ann"}}).to_string()],
    );
    on_iggy(&["publish", "--topic", "orders", "--module", &module, &file]);
    assert!(on_iggy(&["topic", "list"]).contains("orders\t2 partitions\t1 message"));
    assert!(
        on_iggy(&["topic", "describe", "--topic", "orders"]).starts_with("topic `orders`: 2 partitions, 1 message")
    );
    let consumed = on_iggy(&["topic", "consume", "--topic", "orders", "--output", "json"]);
    let record: serde_json::Value = serde_json::from_str(consumed.trim()).unwrap();
    assert_eq!(record["event"]["key"], json!(1), "{record}");
    let out = waku(&["topic", "describe", "--topic", "order", "--iggy", &url, "--stream", &stream], dir.path());
    assert!(
        text(&out.stderr).contains("topic `order` does not exist (the log's topics: orders)"),
        "{}",
        text(&out.stderr)
    );
    assert!(tree(dir.path()).iter().all(|path| path == "events.jsonl"), "{:?}", tree(dir.path()));
}

#[test]
fn read_only_commands_on_postgresql_state_refuse_a_missing_projection_and_create_nothing() {
    let Ok(url) = std::env::var("WAKU_POSTGRES_URL") else {
        const WHY: &str = "the PostgreSQL read-only command test needs a server named by WAKU_POSTGRES_URL";
        assert!(!std::env::var("CI").is_ok_and(|ci| ci == "true"), "{WHY}");
        eprintln!("skipped: {WHY}");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    bank_data(dir.path());
    // Projections of their own: the tables are shared.
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let (there, nope) = (format!("ro-{stamp}"), format!("nope-{stamp}"));
    let run = ["run", "--data", "data", "--topic", "accounts", "--modules", "modules", "--until-caught-up"];
    let out = waku(&[&run[..], &["--projection", &there, "--state", &url]].concat(), dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let commands: [&[&str]; 5] = [
        &["status", "--topic", "accounts"],
        &["state", "get", "--key", "1"],
        &["state", "counters"],
        &["dlq", "list", "--topic", "accounts"],
        &["modules", "list"],
    ];
    for command in commands {
        let args = [command, &["--data", "data", "--projection", &nope, "--state", &url]].concat();
        let out = waku(&args, dir.path());
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "`waku {}`: {stderr}", command.join(" "));
        let refused = format!("projection `{nope}` does not exist in the PostgreSQL state (its projections: ");
        assert!(stderr.contains(&refused) && stderr.contains(&there), "`waku {}`: {stderr}", command.join(" "));
        // The one that is there still reads.
        let args = [command, &["--data", "data", "--projection", &there, "--state", &url]].concat();
        let out = waku(&args, dir.path());
        assert!(out.status.success(), "`waku {}`: {}", command.join(" "), text(&out.stderr));
    }
    // Nothing of the misspelt one was written.
    let (_, found) = wakuwaku::storage::state::postgres::PostgresStore::connect_existing(&url, &there).unwrap();
    assert!(found.contains(&there) && !found.contains(&nope), "{found:?}");
}

#[test]
fn read_only_commands_on_iggy_refuse_a_missing_stream_or_topic_and_create_nothing() {
    let Ok(url) = std::env::var("WAKU_IGGY_URL") else {
        eprintln!("skipped: the Iggy read-only command test needs a server named by WAKU_IGGY_URL");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let (there, nope) = (format!("ro-{stamp}"), format!("nope-{stamp}"));
    let out = waku(
        &["topic", "create", "--iggy", &url, "--stream", &there, "--topic", "accounts", "--partitions", "1"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let commands: [&[&str]; 3] = [
        &["topic", "list"],
        &["topic", "describe", "--topic", "accounts"],
        &["topic", "consume", "--topic", "accounts"],
    ];
    for command in commands {
        // Twice: the first refusal created nothing the second finds.
        for _ in 0..2 {
            let out = waku(&[command, &["--iggy", &url, "--stream", &nope]].concat(), dir.path());
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "`waku {}`: {stderr}", command.join(" "));
            let refused = format!("Iggy stream `{nope}` does not exist (the server's streams: ");
            assert!(stderr.contains(&refused) && stderr.contains(&there), "`waku {}`: {stderr}", command.join(" "));
        }
    }
    let out = waku(&["topic", "describe", "--iggy", &url, "--stream", &there, "--topic", "acounts"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("topic `acounts` does not exist (the log's topics: accounts)"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.path().join("waku-data").exists());
}
