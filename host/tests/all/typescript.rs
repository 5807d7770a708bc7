//! TypeScript guests through the real `waku` binary: the bank
//! (`examples/bank-ts`) in `waku demo --module`, against the oracle, and in
//! `waku test --expect`, storing exactly what the Rust bank stores on the
//! same events; the inventory's timed types (`examples/inventory-ts`) in
//! `waku demo inventory`; `waku new --lang ts|js`, `npm test`, `waku build`,
//! `waku test` and `waku dev` in a new project; and a hostile handler
//! through `waku run`.
//!
//! It needs the repository's npm tools (`npm ci` at the root); without
//! them each test prints one `skipped: …` line, except under CI
//! (`CI=true`), where it fails.

use crate::common::{self, bank_ts_wasm, bank_wasm, compile_cache, hostile_ts_wasm, inventory_ts_wasm, text, waku};

/// Events of every bank type, over three accounts, with a fold, a freeze,
/// a close and a reopen.
const EVENTS: &str = "\
{\"type\": \"AccountOpened\", \"body\": {\"account\": 42, \"owner\": \"ann\"}}
{\"type\": \"AccountOpened\", \"body\": {\"account\": 7, \"owner\": \"bob\"}}
{\"type\": \"Deposited\", \"body\": {\"account\": 42, \"amount\": 100}}
{\"type\": \"Deposited\", \"body\": {\"account\": 42, \"amount\": 20, \"count\": 2}}
{\"type\": \"Withdrawn\", \"body\": {\"account\": 42, \"amount\": 30}}
{\"type\": \"Deposited\", \"body\": {\"account\": 7, \"amount\": 9223372036854775807}}
{\"type\": \"Deposited\", \"body\": {\"account\": 7, \"amount\": 1}}
{\"type\": \"AccountStatusChanged\", \"body\": {\"account\": 7, \"status\": \"frozen\"}}
{\"type\": \"Withdrawn\", \"body\": {\"account\": 18446744073709551615, \"amount\": -5}}
{\"type\": \"AccountClosed\", \"body\": {\"account\": 42}}
{\"type\": \"AccountOpened\", \"body\": {\"account\": 42, \"owner\": \"ann b.\"}}
{\"type\": \"AccountStatusChanged\", \"body\": {\"account\": 42, \"status\": \"active\"}}
";

#[test]
fn the_typescript_bank_stores_the_rust_banks_expectations() {
    let Some(ts) = bank_ts_wasm("the TypeScript bank's `waku test --expect`") else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("events.jsonl"), EVENTS).unwrap();
    let cache = compile_cache();
    let cache = cache.to_str().unwrap();
    let run = |wasm: &str, expect: &str, update: bool| {
        let mut args = vec!["test", wasm, "events.jsonl", "--compile-cache", cache, "--expect", expect];
        if update {
            args.push("--update");
        }
        let out = waku(&args, dir.path());
        assert!(out.status.success(), "waku test {wasm}:\n{}\n{}", text(&out.stdout), text(&out.stderr));
        text(&out.stdout)
    };
    let rust = run(bank_wasm().to_str().unwrap(), "rust.json", true);
    let typescript = run(ts.to_str().unwrap(), "ts.json", true);
    let stored = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    assert_eq!(stored("ts.json"), stored("rust.json"), "the stored expectations are equal");
    assert_eq!(typescript.replace("ts.json", "rust.json"), rust, "and so is what `waku test` shows");
    assert!(stored("rust.json").contains("\"balance\": -9223372036854775808"), "{}", stored("rust.json"));
    // The TypeScript bank passes the Rust bank's expectation file.
    run(ts.to_str().unwrap(), "rust.json", false);
}

#[test]
fn the_typescript_bank_runs_the_demo_and_matches_the_oracle() {
    let Some(ts) = bank_ts_wasm("the TypeScript bank's demo") else { return };
    let dir = tempfile::tempdir().unwrap();
    // Compiling the engine (a component of about 12 MB) takes tens of seconds
    // of CPU in this debug build, close to the default budget of 30 s.
    let args = [
        "demo",
        "--module",
        ts.to_str().unwrap(),
        "--events",
        "20000",
        "--accounts",
        "300",
        "--seed",
        "7",
        "--compile-budget-s",
        "300",
    ];
    let out = waku(&args, dir.path());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "waku demo:\n{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("oracle check: match"), "{stdout}");
}

/// The inventory's timed types in TypeScript (`examples/inventory-ts`)
/// through `waku demo inventory`: history read with one topic late, then
/// live traffic; the oracle sorts each product's events by event time.
#[test]
fn the_typescript_inventory_runs_the_event_time_demo_and_matches_the_oracle() {
    let Some(inventory) = inventory_ts_wasm("the TypeScript inventory's demo") else { return };
    let dir = tempfile::tempdir().unwrap();
    let module = inventory.to_str().unwrap();
    let args = ["demo", "inventory", "--module", module, "--products", "50", "--history", "2000", "--live-secs", "2"];
    let out = waku(&args, dir.path());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "waku demo inventory:\n{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("order violations: 0"), "{stdout}");
    assert!(stdout.contains("oracle check: match (50 products"), "{stdout}");
}

/// Waits (up to five minutes) for a line containing `wanted`.
fn wait_for(lines: &std::sync::mpsc::Receiver<String>, wanted: &str, seen: &mut Vec<String>) {
    common::wait_for_text(lines, wanted, seen, std::time::Duration::from_secs(300));
}

/// `waku new --lang <lang>` outside the checkout, with the repository's
/// npm tools linked in as `node_modules` (what `npm install` puts there:
/// the same pinned versions, `pinned_npm_versions_are_the_repositorys`;
/// linked, so the test needs no network); `npm test` passes in it.
fn new_js_project(name: &str, lang: &str) -> Option<(tempfile::TempDir, std::path::PathBuf)> {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    if !crate::common::js_tools_available(repo, &format!("the {lang} scaffold's npm test and build")) {
        return None;
    }
    let outside = tempfile::tempdir().unwrap();
    let project = outside.path().join(name);
    let out = waku(&["new", name, "--lang", lang, "--path", project.to_str().unwrap()], outside.path());
    assert!(out.status.success(), "waku new --lang {lang}: {}", text(&out.stderr));
    assert!(text(&out.stderr).contains("npm install && npm test && waku build"), "{}", text(&out.stderr));
    assert!(std::fs::read_to_string(project.join("README.md")).unwrap().contains("`npm install`"));
    std::os::unix::fs::symlink(repo.join("node_modules"), project.join("node_modules")).unwrap();
    let out = std::process::Command::new("npm").args(["test", "--silent"]).current_dir(&project).output().unwrap();
    assert!(out.status.success(), "npm test ({lang}):\n{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("# pass 1"), "{}", text(&out.stdout));
    Some((outside, project))
}

#[test]
fn a_new_typescript_or_javascript_project_tests_builds_and_runs_at_once() {
    for (lang, name) in [("ts", "visits-ts"), ("js", "visits-js")] {
        let Some((_outside, project)) = new_js_project(name, lang) else { return };
        let out = waku(&["build", ".", "--out", "module.wasm"], &project);
        assert!(out.status.success(), "waku build ({lang}): {}", text(&out.stderr));
        let built = project.join(format!("target/js/{name}.wasm"));
        let modified = || std::fs::metadata(&built).unwrap().modified().unwrap();
        let first = modified();
        let out = waku(&["build", ".", "--out", "module.wasm"], &project);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(modified(), first, "nothing changed: the build was skipped ({lang})");
        let cache = compile_cache();
        let out = waku(&["test", "module.wasm", "events.jsonl", "--compile-cache", cache.to_str().unwrap()], &project);
        assert!(out.status.success(), "waku test ({lang}): {}", text(&out.stderr));
        let stdout = text(&out.stdout);
        assert!(stdout.contains("key 7\n  state visits = 2\n  log info 2 visits\n"), "{lang}: {stdout}");
        assert!(stdout.contains("counter all_visits = 3"), "{lang}: {stdout}");
    }
}

#[test]
fn waku_dev_swaps_in_an_edited_typescript_handler_and_keeps_it_on_a_build_error() {
    let Some((_outside, project)) = new_js_project("dev-ts", "ts") else { return };
    let handler = project.join("dev_ts.ts");
    let edit = |from: &str, to: &str| {
        let now = std::fs::read_to_string(&handler).unwrap();
        assert!(now.contains(from), "{from}");
        std::fs::write(&handler, now.replace(from, to)).unwrap();
    };
    let mut child = common::KillOnDrop(
        crate::common::waku_command(&project)
            .args(["dev", ".", "--topic", "visits", "--events", "events.jsonl"])
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let lines = common::stderr_lines(&mut child.0);
    let mut seen = Vec::new();
    wait_for(&lines, "watching the sources", &mut seen);
    edit("`${now} visits`", "`edited: ${now} visits`");
    wait_for(&lines, "swapped in dev-ts@", &mut seen);
    wait_for(&lines, "edited: 4 visits module=\"dev-ts\" key=7", &mut seen);
    // A build error: reported, and the running version stays.
    edit("export default module;", "export default module oops;");
    wait_for(&lines, "the build failed, the previous version keeps running", &mut seen);
    let swaps = seen.iter().filter(|line| line.contains("swapped in dev-ts@")).count();
    assert_eq!(swaps, 1, "{}", seen.join("\n"));
}

/// A hostile TypeScript module (`tests/guests/hostile-ts`) through `waku
/// run`: an endless loop ends at the CPU budget, unbounded allocation at
/// the memory limit (both trap, are retried, then dead-lettered, as a Rust
/// module's would be), an error with a 16 MiB message is dead-lettered
/// with the message cut to 4 KiB; the honest events of other keys are
/// applied.
#[test]
fn a_hostile_typescript_handler_fails_its_calls_and_the_other_keys_go_on() {
    let Some(hostile) = hostile_ts_wasm("a hostile TypeScript handler through `waku run`") else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("modules")).unwrap();
    std::fs::copy(hostile, dir.path().join("modules/hostile.wasm")).unwrap();
    std::fs::write(
        dir.path().join("events.jsonl"),
        "{\"type\":\"Note\",\"body\":{\"key\":1,\"text\":\"before\"}}\n{\"type\":\"Spin\",\"body\":{\"key\":2}}\n\
         {\"type\":\"Hog\",\"body\":{\"key\":3}}\n{\"type\":\"Shout\",\"body\":{\"key\":4}}\n\
         {\"type\":\"Note\",\"body\":{\"key\":5,\"text\":\"after\"}}\n",
    )
    .unwrap();
    let cache = compile_cache();
    let cache = cache.to_str().unwrap();
    let data = ["--data", "data"];
    let publish = ["publish", "--topic", "in", "--module", "modules/hostile.wasm", "--partitions", "1", "events.jsonl"];
    let out = waku(&[&publish[..], &data].concat(), dir.path());
    assert!(out.status.success(), "waku publish: {}", text(&out.stderr));
    let run = [
        "run",
        "--projection",
        "p",
        "--topic",
        "in",
        "--modules",
        "modules",
        "--until-caught-up",
        "--no-watch",
        "--retry-delays",
        "0s",
        "--max-attempts",
        "2",
        "--compile-budget-s",
        "300",
    ];
    let out = waku(&[&run[..], &data, &["--compile-cache", cache]].concat(), dir.path());
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "waku run:\n{stdout}\n{stderr}");
    assert!(stdout.contains("5 events") && stdout.contains("2 applied, 0 skipped, 3 dead-lettered"), "{stdout}");
    let out = waku(&["dlq", "list", "--projection", "p", "--topic", "in", "--data", "data"], dir.path());
    assert!(out.status.success(), "waku dlq list: {}", text(&out.stderr));
    let letters = text(&out.stdout);
    let letter = |kind: &str| {
        letters
            .lines()
            .find(|line| line.contains(&format!("type {kind} ")))
            .unwrap_or_else(|| panic!("no dead letter of {kind}:\n{letters}"))
            .to_owned()
    };
    let spin = letter("Spin");
    assert!(
        spin.contains("\ttrap\t") && spin.contains("attempts 2") && spin.contains("CPU budget exhausted"),
        "{spin}"
    );
    let hog = letter("Hog");
    assert!(hog.contains("\ttrap\t") && hog.contains("growing memory"), "{hog}");
    let shout = letter("Shout");
    assert!(shout.contains("\tunrecoverable\t") && shout.contains("attempts 1"), "{shout}");
    let reason = shout.rsplit('\t').next().unwrap();
    assert!(reason.ends_with(" […cut]") && reason.len() < 4096 + 64, "{} bytes", reason.len());
}
