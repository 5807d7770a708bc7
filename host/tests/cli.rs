//! The `waku` command, run as a person would: real binary, real files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use wakuwaku::guest_build::GuestBuild;

fn waku(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_waku")).args(args).current_dir(dir).output().expect("waku runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The bank example, built once for this test binary.
fn bank_wasm() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        GuestBuild { target_dir: Some(root.join("target/guests")), quiet: true, ..GuestBuild::new(root.join("examples/bank")) }
            .run()
            .expect("the bank example builds")
    })
}

fn write_lines(dir: &Path, name: &str, lines: &[&str]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n")).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn a_malformed_line_is_reported_with_its_number_and_nothing_is_published() {
    let dir = tempfile::tempdir().unwrap();
    let module = bank_wasm().to_string_lossy().into_owned();
    let good = r#"{"type": "AccountOpened", "body": {"account": 1, "owner": "ann"}}"#;
    let cases = [
        (r#"{"type": "Deposited", "body": {"account": 1, "amount": 5}"#, "line 3"),
        (r#"{"type": "Teleported", "body": {}}"#, "does not declare event type `Teleported`"),
        (r#"{"type": "Deposited", "body": {"account": "one", "amount": 5}}"#, "malformed Deposited body"),
        (r#"{"body": {"account": 1}}"#, "exactly one of `type`"),
    ];
    for (index, (bad, expected)) in cases.iter().enumerate() {
        let file = write_lines(dir.path(), &format!("bad{index}.jsonl"), &[good, "", bad, good]);
        let out = waku(
            &["publish", "--data", "data", "--topic", "accounts", "--partitions", "2", "--module", &module, &file],
            dir.path(),
        );
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.starts_with("waku: error: nothing was published"), "{stderr}");
        assert!(stderr.contains("line 3"), "{stderr}");
        assert!(stderr.contains(expected), "`{expected}` not in {stderr}");
    }
    // Nothing reached the log: a consumer finds no event.
    let modules = dir.path().join("modules");
    std::fs::create_dir(&modules).unwrap();
    std::fs::copy(bank_wasm(), modules.join("bank.wasm")).unwrap();
    let out = waku(
        &["run", "--data", "data", "--projection", "bank", "--topic", "accounts", "--modules", "modules", "--until-caught-up"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("consumed 0 events"), "{}", text(&out.stdout));
}

#[test]
fn publish_run_and_state_get_work_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let module = bank_wasm().to_string_lossy().into_owned();
    let file = write_lines(
        dir.path(),
        "events.jsonl",
        &[
            r#"{"type": "AccountOpened", "body": {"account": 42, "owner": "ann"}}"#,
            r#"{"type": "Deposited", "body": {"account": 42, "amount": 100}}"#,
            r#"{"type": "Deposited", "body": {"account": 42, "amount": 20}}"#,
            r#"{"tag": 3, "body": {"account": 42, "amount": 30}}"#,
            r#"{"type": "AccountStatusChanged", "body": {"account": 42, "status": "frozen"}}"#,
            r#"{"type": "AccountOpened", "body": {"account": 7, "owner": "bob"}}"#,
        ],
    );
    let out = waku(
        &["publish", "--data", "data", "--topic", "accounts", "--partitions", "3", "--module", &module, &file],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "published 6 events to `accounts`");

    let modules = dir.path().join("modules");
    std::fs::create_dir(&modules).unwrap();
    std::fs::copy(bank_wasm(), modules.join("bank.wasm")).unwrap();
    let out = waku(
        &["run", "--data", "data", "--projection", "bank", "--topic", "accounts", "--modules", "modules", "--until-caught-up"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("consumed 6 events"), "{}", text(&out.stdout));

    let out = waku(
        &[
            "state", "get", "--data", "data", "--projection", "bank", "--module", &module,
            "--event", r#"AccountOpened={"account":42,"owner":""}"#,
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let account = &state["entries"]["account"];
    assert_eq!(account["balance"], 90);
    assert_eq!(account["deposits"], 2);
    assert_eq!(account["status"], "frozen");
    assert_eq!(account["owner"], "ann");
    assert_eq!(state["counters"]["open_accounts"], 2);

    // The key hash printed can be used directly.
    let key_hash = state["key_hash"].as_str().unwrap().to_owned();
    let out = waku(
        &["state", "get", "--data", "data", "--projection", "bank", "--key-hash", &key_hash, "account"],
        dir.path(),
    );
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(&again["entries"]["account"], account);

    // Running again consumes nothing: the position was committed.
    let out = waku(
        &["run", "--data", "data", "--projection", "bank", "--topic", "accounts", "--modules", "modules", "--until-caught-up"],
        dir.path(),
    );
    assert!(text(&out.stdout).contains("consumed 0 events"), "{}", text(&out.stdout));
}

#[test]
fn bad_input_gets_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = waku(&["run", "--data", "data", "--projection", "bank", "--topic", "t", "--modules", "nowhere"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("nowhere"), "{}", text(&out.stderr));

    let out = waku(&["state", "get", "--projection", "bank", "--key-hash", "0xzz"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("`0xzz` is not a key hash"), "{}", text(&out.stderr));

    let out = waku(&["build", "no-such-crate"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no Cargo.toml in no-such-crate"), "{}", text(&out.stderr));

    let out = waku(&["frobnicate"], dir.path());
    assert_eq!(out.status.code(), Some(2), "usage errors exit 2");
}
