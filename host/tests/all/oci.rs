//! `waku modules push` and `waku modules adopt` through the real binary,
//! against the OCI registry `WAKU_OCI_REGISTRY` names (`.ci/run` starts
//! one): a projection started from a reference in `waku.toml` keeps the
//! digest it pinned after the tag moved, until `adopt` takes the tag's new
//! digest for the next `waku run`; `adopt` wants the host stopped.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, bank_fee_wasm, bank_wasm, text, waku};
use serde_json::json;
use wakuwaku::sandbox::runtime::content_version;

fn ok(dir: &Path, args: &[&str]) -> Output {
    let out = waku(args, dir);
    assert!(out.status.success(), "`waku {}`: {}{}", args.join(" "), text(&out.stdout), text(&out.stderr));
    out
}

/// Pushes `file` as `reference`: its manifest digest.
fn push(dir: &Path, file: &Path, reference: &str) -> String {
    let out = ok(dir, &["modules", "push", &file.to_string_lossy(), reference]);
    let pushed = text(&out.stdout);
    let manifest = pushed.lines().find_map(|line| line.trim().strip_prefix("manifest "));
    manifest.unwrap_or_else(|| panic!("no manifest in {pushed}")).trim().to_owned()
}

/// Publishes a withdrawal of 10 from account 42.
fn withdraw_10(dir: &Path) {
    let events = dir.join("withdraw.jsonl");
    std::fs::write(&events, json!({"type": "Withdrawn", "body": {"account": 42, "amount": 10}}).to_string()).unwrap();
    ok(dir, &["publish", "--module", &bank_wasm().to_string_lossy(), &events.to_string_lossy()]);
}

/// Runs the projection to the end of its topic: account 42's balance, the
/// active bank version and the manifest digest it is pinned to.
fn run_until_caught_up(dir: &Path) -> (i64, String, String) {
    ok(dir, &["run", "--until-caught-up"]);
    let state = ok(dir, &["state", "get", "--key", "42", "--output", "json"]);
    let state: serde_json::Value = serde_json::from_slice(&state.stdout).unwrap();
    let listed = ok(dir, &["modules", "list", "--output", "json"]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let bank = &listed["modules"][0];
    (
        state["entries"]["account"]["balance"].as_i64().unwrap(),
        bank["active"].as_str().unwrap().to_owned(),
        bank["pinned"]["manifest"].as_str().unwrap_or_default().to_owned(),
    )
}

#[test]
fn modules_adopt_takes_a_moved_tag_for_the_next_run_and_wants_the_host_stopped() {
    let Some(registry) = common::servers::oci_registry("waku modules adopt") else { return };
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let reference = format!("oci://{registry}/waku-test/r{now}/bank:live");
    std::fs::create_dir(dir.join("modules")).unwrap();
    std::fs::write(
        dir.join("waku.toml"),
        format!(
            "data = \"data\"\nprojection = \"bank\"\ntopic = \"accounts\"\nmodules = \"modules\"\nmodule-ref = \
             [\"{reference}\"]\n"
        ),
    )
    .unwrap();
    let (v1, v2) = (
        content_version(&std::fs::read(bank_wasm()).unwrap()),
        content_version(&std::fs::read(bank_fee_wasm()).unwrap()),
    );
    let first = push(dir, bank_wasm(), &reference);
    let opened = dir.join("open.jsonl");
    let lines = [
        json!({"type": "AccountOpened", "body": {"account": 42, "owner": "ann"}}),
        json!({"type": "Deposited", "body": {"account": 42, "amount": 100}}),
    ];
    std::fs::write(&opened, lines.map(|line| line.to_string()).join("\n")).unwrap();
    ok(dir, &["publish", "--partitions", "1", "--module", &bank_wasm().to_string_lossy(), &opened.to_string_lossy()]);
    withdraw_10(dir);
    assert_eq!(run_until_caught_up(dir), (90, v1.clone(), first.clone()), "pulled, pinned, run");

    // The tag moves to the bank with a fee: a restart keeps the pinned one.
    let second = push(dir, bank_fee_wasm(), &reference);
    assert_ne!(first, second);
    withdraw_10(dir);
    assert_eq!(run_until_caught_up(dir), (80, v1.clone(), first.clone()), "the pinned digest runs on");

    // While `waku run` holds the data directory, adopt is refused.
    let mut host = common::waku_command(dir).arg("run").stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.join("data/running-host.json").exists() {
        assert!(Instant::now() < deadline, "the host did not start within a minute");
        std::thread::sleep(Duration::from_millis(100));
    }
    let refused = waku(&["modules", "adopt"], dir);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stdout));
    assert!(text(&refused.stderr).contains("stop it first"), "{}", text(&refused.stderr));
    let stopped = std::process::Command::new("kill").args(["-INT", &host.id().to_string()]).status().unwrap();
    assert!(stopped.success());
    assert!(host.wait().unwrap().success());
    assert_eq!(run_until_caught_up(dir), (80, v1.clone(), first.clone()), "the refused adopt changed nothing");

    // Adopted: the tag's digest, from the next `waku run` on.
    let adopted = ok(dir, &["modules", "adopt"]);
    assert_eq!(
        text(&adopted.stdout),
        format!("module `bank`: {first} → {second} ({reference}); the next `waku run` runs it\n")
    );
    assert_eq!(std::fs::read(dir.join("modules/bank.wasm")).unwrap(), std::fs::read(bank_fee_wasm()).unwrap());
    let again = ok(dir, &["modules", "adopt"]);
    assert_eq!(text(&again.stdout), format!("module `bank`: {reference} stays at {second}\n"));
    withdraw_10(dir);
    assert_eq!(run_until_caught_up(dir), (69, v2, second), "the fee is taken from then on");

    // Without a reference there is nothing to adopt.
    std::fs::remove_file(dir.join("waku.toml")).unwrap();
    let none = waku(&["modules", "adopt", "--data", "data", "--projection", "bank", "--modules", "modules"], dir);
    assert_eq!(none.status.code(), Some(1));
    assert!(text(&none.stderr).contains("no module references to adopt"), "{}", text(&none.stderr));
}
