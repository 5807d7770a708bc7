//! A handler author's first hour, through the real `waku` binary: `waku
//! new` into a directory outside the checkout, `cargo test` and `waku
//! build` there, `waku test` against a stored expectation, and `waku dev`
//! rebuilding and swapping on a source edit.
//!
//! The scaffolded crates share one cargo target directory (under the test
//! target's tmp dir), so wit-bindgen and the SDK compile once per machine,
//! not once per test. The Python scaffold's pytest and build need
//! componentize-py, found as `waku build` finds it; without it that test
//! prints one `skipped: …` line, except under CI (`CI=true`), where it
//! fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{self, bank_wasm, probe_wasm, text, waku};

/// The cargo target directory every scaffolded crate of these tests shares.
fn shared_target() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("scaffolds")
}

fn succeeded(what: &str, out: &Output) {
    assert!(out.status.success(), "{what} failed:\n{}\n{}", text(&out.stdout), text(&out.stderr));
}

/// `waku new <name>` in a fresh temporary directory (outside the
/// checkout); returns the directory and the project's path.
fn new_project(name: &str, lang: &str) -> (tempfile::TempDir, PathBuf) {
    let outside = tempfile::tempdir().unwrap();
    let out = waku(&["new", name, "--lang", lang], outside.path());
    succeeded("waku new", &out);
    let project = outside.path().join(name);
    assert!(text(&out.stdout).contains(&format!("created {name}")), "{}", text(&out.stdout));
    (outside, project)
}

/// `waku build` of `project` into the shared target directory.
fn build(project: &Path) -> PathBuf {
    let out = waku(&["build", ".", "--out", "module.wasm", "--target-dir", shared_target().to_str().unwrap()], project);
    succeeded("waku build", &out);
    project.join("module.wasm")
}

#[test]
fn a_new_rust_project_tests_builds_and_runs_at_once_outside_the_checkout() {
    let (_outside, project) = new_project("visits", "rust");
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().canonicalize().unwrap();
    assert!(!project.canonicalize().unwrap().starts_with(&checkout));
    for file in ["Cargo.toml", "src/lib.rs"] {
        let written = std::fs::read_to_string(project.join(file)).unwrap();
        assert!(!written.contains(checkout.to_str().unwrap()), "{file} refers to the checkout");
    }
    assert_eq!(std::fs::read_to_string(project.join("README.md")).unwrap().lines().count(), 3);

    let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["test", "--quiet"])
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", shared_target())
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap();
    succeeded("cargo test in the new project", &out);
    assert!(text(&out.stdout).contains("1 passed"), "{}", text(&out.stdout));

    let wasm = build(&project);
    let expected = project.join("expected.json");
    let args = ["test", wasm.to_str().unwrap(), "events.jsonl", "--expect", expected.to_str().unwrap()];
    let out = waku(&[&args[..], &["--update"]].concat(), &project);
    succeeded("waku test --update", &out);
    let stored: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&expected).unwrap()).unwrap();
    assert_eq!(stored["keys"]["7"]["state"]["visits"], 2, "{stored}");
    assert_eq!(stored["keys"]["7"]["log"], serde_json::json!(["info 2 visits"]), "{stored}");
    assert_eq!(stored["keys"]["8"]["state"]["visits"], 1, "{stored}");
    assert_eq!(stored["counters"]["all_visits"], 3, "{stored}");
    assert_eq!(stored["events"]["applied"], 3, "{stored}");

    let out = waku(&args, &project);
    succeeded("waku test --expect", &out);
    assert!(text(&out.stdout).contains("as expected"), "{}", text(&out.stdout));
}

#[test]
fn waku_test_on_the_bank_exits_non_zero_on_a_difference_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    std::fs::write(
        &events,
        "{\"type\": \"AccountOpened\", \"body\": {\"account\": 42, \"owner\": \"ann\"}}\n\
         {\"type\": \"Deposited\", \"body\": {\"account\": 42, \"amount\": 100}}\n\
         {\"type\": \"Deposited\", \"body\": {\"account\": 42, \"amount\": 20}}\n\
         {\"type\": \"Withdrawn\", \"body\": {\"account\": 42, \"amount\": 30}}\n",
    )
    .unwrap();
    let expect = dir.path().join("expected.json");
    let bank = bank_wasm().to_str().unwrap();
    let args = ["test", bank, "events.jsonl", "--expect", "expected.json"];
    succeeded("waku test --update", &waku(&[&args[..], &["--update"]].concat(), dir.path()));
    let stored = std::fs::read_to_string(&expect).unwrap();
    assert!(stored.contains("\"balance\": 90"), "{stored}");
    succeeded("waku test --expect", &waku(&args, dir.path()));

    std::fs::write(&expect, stored.replace("\"balance\": 90", "\"balance\": 91")).unwrap();
    let out = waku(&args, dir.path());
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("1 differences from expected.json"), "{stdout}");
    assert!(stdout.contains("keys.42.state.account.balance: expected 91, found 90"), "{stdout}");

    // A bad line names the file and the line; nothing runs.
    std::fs::write(
        &events,
        "{\"type\": \"AccountOpened\", \"body\": {\"account\": 1, \"owner\": \"x\"}}\n\nnot json\n",
    )
    .unwrap();
    let out = waku(&args, dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("events.jsonl: line 3: "), "{}", text(&out.stderr));
    assert!(text(&out.stdout).is_empty(), "{}", text(&out.stdout));
}

#[test]
fn waku_test_shows_failures_with_their_class_emits_and_log_lines_per_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("events.jsonl"),
        "{\"type\": \"Note\", \"body\": {\"key\": 1, \"text\": \"hello\", \"emit_to\": \"out\"}}\n\
         {\"type\": \"Fail\", \"body\": {\"key\": 2, \"class\": \"unrecoverable\", \"message\": \"bad cheque\"}}\n\
         {\"type\": \"Fail\", \"body\": {\"key\": 3, \"class\": \"retryable\", \"message\": \"later\"}}\n\
         {\"type\": \"Panic\", \"body\": {\"key\": 4, \"message\": \"boom\"}}\n",
    )
    .unwrap();
    let probe = probe_wasm().to_str().unwrap();
    let out = waku(&["test", probe, "events.jsonl", "--expect", "outcome.json", "--update"], dir.path());
    succeeded("waku test", &out);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("key 1\n  state last = \"hello\"\n  log info noted hello\n"), "{stdout}");
    assert!(
        stdout.contains("emitted to out: key 1, tag 4: {\"emit_to\":null,\"key\":1,\"text\":\"hello\"}"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "key 2\n  failed (unrecoverable): Fail (tag 5), 1 event: unrecoverable handler error: bad cheque"
        )
    );
    assert!(stdout.contains("key 3\n  failed (retryable): Fail (tag 5), 1 event: retryable handler error: later"));
    assert!(stdout.contains("key 4\n  failed (trap): Panic (tag 3), 1 event: "), "{stdout}");
    assert!(stdout.contains("boom"), "{stdout}");
    assert!(!stdout.contains("RUST_BACKTRACE"), "advice a sandbox without environment cannot follow: {stdout}");
    assert!(!stdout.contains("before-failure"), "a failed call's writes are dropped: {stdout}");
    assert!(stdout.contains("4 events: 1 applied, 0 skipped, 3 dead-lettered"), "{stdout}");
    let stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("outcome.json")).unwrap()).unwrap();
    assert_eq!(stored["keys"]["3"]["failures"][0]["class"], "retryable", "{stored}");
    assert_eq!(stored["emitted"][0]["topic"], "out", "{stored}");
    assert_eq!(stored["counters"]["notes"], 1, "{stored}");
}

#[test]
fn waku_new_refuses_a_non_empty_directory_and_a_bad_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("taken")).unwrap();
    std::fs::write(dir.path().join("taken/notes.txt"), "mine").unwrap();
    let out = waku(&["new", "visits", "--path", "taken"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("taken exists and is not empty"), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_dir(dir.path().join("taken")).unwrap().count(), 1);

    let out = waku(&["new", "my handler"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("`my handler` cannot name a handler project"), "{}", text(&out.stderr));
    let out = waku(&["new", "visits", "--lang", "cobol"], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// Waits (up to ten minutes: a cold build) for a line containing `wanted`.
fn wait_for(lines: &std::sync::mpsc::Receiver<String>, wanted: &str, seen: &mut Vec<String>) {
    common::wait_for_text(lines, wanted, seen, std::time::Duration::from_secs(600));
}

#[test]
fn waku_dev_swaps_in_an_edited_handler_and_keeps_the_old_one_on_a_build_error() {
    let (_outside, project) = new_project("visits", "rust");
    let lib = project.join("src/lib.rs");
    let source = std::fs::read_to_string(&lib).unwrap();
    let edit = |from: &str, to: &str| {
        let now = std::fs::read_to_string(&lib).unwrap();
        assert!(now.contains(from), "{from}");
        std::fs::write(&lib, now.replace(from, to)).unwrap();
    };
    let target = shared_target();
    let token_file = project.join("admin-token");
    std::fs::write(&token_file, "dev-token-never-shown\n").unwrap();
    let mut child = common::KillOnDrop(
        common::waku_command(&project)
            .args(["dev", ".", "--topic", "visits", "--events", "events.jsonl"])
            .arg("--target-dir")
            .arg(&target)
            .args(["--admin", "127.0.0.1:0", "--admin-token-file"])
            .arg(&token_file)
            .env_remove("RUST_LOG")
            .env_remove("WAKU_ADMIN_TOKEN")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let lines = common::stderr_lines(&mut child.0);
    let mut seen = Vec::new();

    // An edit as soon as waku dev says it watches the sources (it must
    // already): the new version is swapped in, runs the sample events
    // again on the state the first run left, and says so in its own words.
    wait_for(&lines, "watching the sources", &mut seen);
    // Its admin endpoint asks for the token it was given.
    let started = seen.iter().find(|line| line.contains("admin endpoint on http://")).expect("an admin endpoint");
    let url = started.split("admin endpoint on ").nth(1).unwrap().split(')').next().unwrap().to_owned();
    let status = |authorization: Option<&str>| {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut request = agent.get(&format!("{url}/status"));
        if let Some(value) = authorization {
            request = request.header("Authorization", value);
        }
        request.call().unwrap().status().as_u16()
    };
    assert_eq!((status(None), status(Some("Bearer dev-token-never-shown"))), (401, 200));
    assert!(source.contains("ctx.info(&format!(\"{now} visits\"));"));
    edit("\"{now} visits\"", "\"edited: {now} visits\"");
    wait_for(&lines, "swapped in visits@", &mut seen);
    wait_for(&lines, "edited: 4 visits module=\"visits\" key=7", &mut seen);
    let first_run = |line: &String| line.contains("2 visits module=\"visits\" key=7");
    assert!(seen.iter().any(first_run), "the first run's events were handled: {}", seen.join("\n"));

    // A build error: reported, and the running version stays.
    edit("Ok(())\n    }\n}", "Ok(()) oops\n    }\n}");
    wait_for(&lines, "the build failed, the previous version keeps running", &mut seen);
    let swaps = |seen: &[String]| seen.iter().filter(|line| line.contains("swapped in visits@")).count();
    assert_eq!(swaps(&seen), 1, "{}", seen.join("\n"));

    // Fixed: the next version takes over from the state the edited one
    // kept running on.
    edit("Ok(()) oops", "Ok(())");
    edit("\"edited: {now} visits\"", "\"fixed: {now} visits\"");
    wait_for(&lines, "fixed: 6 visits module=\"visits\" key=7", &mut seen);
    assert_eq!(swaps(&seen), 2, "{}", seen.join("\n"));
    assert!(
        seen.iter().any(|line| line.contains("goes on from the state earlier versions built")),
        "{}",
        seen.join("\n")
    );

    // The sample events edited: published again, with no build.
    let events = project.join("events.jsonl");
    let text = std::fs::read_to_string(&events).unwrap();
    std::fs::write(&events, text.trim_end().to_owned() + "\n").unwrap();
    wait_for(&lines, "events.jsonl changed; publishing the sample events again", &mut seen);
    wait_for(&lines, "fixed: 8 visits module=\"visits\" key=7", &mut seen);
    assert_eq!(swaps(&seen), 2, "{}", seen.join("\n"));

    // A change that builds to the same component (a comment): said, and
    // nothing swapped.
    let now = std::fs::read_to_string(&lib).unwrap();
    std::fs::write(&lib, now + "\n// A comment changes nothing the compiler keeps.\n").unwrap();
    wait_for(&lines, "the build is the running version visits@", &mut seen);
    assert_eq!(swaps(&seen), 2, "{}", seen.join("\n"));
    assert!(!seen.iter().any(|line| line.contains("dev-token-never-shown")), "the token was logged");
}

/// A componentize-py and a python with pytest, found as `waku build` finds
/// componentize-py (the python beside it, else `python3`); `None` after a
/// `skipped:` line, or a panic under CI, which installs both.
fn python_tools(project: &Path) -> Option<(std::ffi::OsString, PathBuf)> {
    use wakuwaku::authoring::guest_build::python::{COMPONENTIZE_PY_ENV, find_componentize_py};
    let skip = |why: String| {
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("the Python scaffold: CI installs componentize-py and pytest (.ci/run), but {why}");
        }
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "skipped: the Python scaffold's pytest and build: {why}");
        None
    };
    let tool = match find_componentize_py(project, std::env::var_os(COMPONENTIZE_PY_ENV)) {
        Ok(tool) => tool,
        Err(error) => return skip(error.to_string()),
    };
    let beside = Path::new(&tool).parent().map(|bin| bin.join("python")).filter(|p| p.is_file());
    let python = beside.unwrap_or_else(|| PathBuf::from("python3"));
    let has_pytest = Command::new(&python).args(["-m", "pytest", "--version"]).output();
    if !has_pytest.is_ok_and(|out| out.status.success()) {
        return skip(format!("{} has no pytest", python.display()));
    }
    Some((tool, python))
}

#[test]
fn a_new_python_project_tests_with_pytest_and_builds_at_once() {
    let (_outside, project) = new_project("py-visits", "python");
    let Some((componentize_py, python)) = python_tools(&project) else { return };
    let out =
        Command::new(&python).args(["-m", "pytest", "-q", "-p", "no:cacheprovider"]).current_dir(&project).output();
    let out = out.unwrap();
    succeeded("pytest in the new project", &out);
    assert!(text(&out.stdout).contains("1 passed"), "{}", text(&out.stdout));

    let out = common::waku_command(&project)
        .args(["build", ".", "--out", "module.wasm"])
        .env("WAKU_COMPONENTIZE_PY", &componentize_py)
        .output()
        .unwrap();
    succeeded("waku build (Python)", &out);
    let out = waku(&["test", "module.wasm", "events.jsonl"], &project);
    succeeded("waku test (Python)", &out);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("key 7\n  state visits = 2\n  log info 2 visits\n"), "{stdout}");
    assert!(stdout.contains("counter all_visits = 3"), "{stdout}");
}

/// `waku build` says what it builds and where before cargo starts, that a
/// first build there takes minutes, and builds a Rust guest into the
/// target directory projects share: `WAKU_TARGET_DIR`, else `waku/target`
/// in the user's cache directory. (A crate cargo refuses at once keeps
/// this cheap: the line comes before cargo runs, its error after.)
#[test]
fn waku_build_announces_a_first_build_into_the_shared_target_directory() {
    let dir = tempfile::tempdir().unwrap();
    let guest = dir.path().join("guest");
    std::fs::create_dir(&guest).unwrap();
    std::fs::write(guest.join("Cargo.toml"), "[package]\nname = \"not valid\"\n").unwrap();
    let cache = dir.path().join("cache");
    let named = dir.path().join("shared");
    for (env_target, expected) in [(None, cache.join("waku").join("target")), (Some(&named), named.clone())] {
        let mut command = common::waku_command(&guest);
        command.args(["build", "."]).env("XDG_CACHE_HOME", &cache).env_remove("WAKU_TARGET_DIR");
        if let Some(target) = env_target {
            command.env("WAKU_TARGET_DIR", target);
        }
        let out = command.output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        let stderr = text(&out.stderr);
        let notice = format!("waku: building . for wasm32-wasip2 (release) in {}", expected.display());
        let at = stderr.find(&notice).unwrap_or_else(|| panic!("no `{notice}`:\n{stderr}"));
        assert!(stderr[at..].contains("the first build there compiles the dependencies too"), "{stderr}");
        assert!(stderr.contains("cargo could not build ."), "{stderr}");
    }
}
