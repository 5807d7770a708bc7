//! The README's "A day on one machine", run as written: its blocks are read
//! from README.md (the `<!-- day: … -->` markers), not copied here, so the
//! walk cannot drift from what the test runs.
//!
//! The script is the blocks in order, run by bash with `-e` in a fresh
//! directory, the `waku` under test first on the PATH: the `new` block,
//! then `src/lib.rs` written from the Rust block, then the commands. Two
//! things are added, and only these: after a line that starts a command in
//! the background (`… &`) the script waits until that host serves its data
//! directory (`waku-data/running-host.json`), where a person waits for its
//! start-up line; and a trap stops that host if the script fails. The
//! scaffold builds (`cargo test`, and `waku build` through
//! `WAKU_TARGET_DIR`) share the first-hour tests' cargo target directory.

#![cfg(unix)]

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::text;

/// The fenced block after the marker `<!-- day: {name} -->`.
fn block(readme: &str, name: &str) -> String {
    let marker = format!("<!-- day: {name} -->");
    let (_, after) = readme.split_once(&marker).unwrap_or_else(|| panic!("README.md has no {marker}"));
    let after = after.trim_start();
    let (fence, body) = after.split_once('\n').unwrap();
    assert!(fence.starts_with("```"), "{marker} is not followed by a fenced block");
    body.split_once("\n```").unwrap_or_else(|| panic!("{marker}: the block does not end")).0.to_owned()
}

#[test]
fn the_readme_day_on_one_machine_runs_as_written() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    let new = block(&readme, "new");
    let lib = block(&readme, "src/lib.rs");
    let commands = block(&readme, "commands");
    let mut script = String::from("trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n");
    script.push_str(&new);
    script.push_str("\ncat > src/lib.rs <<'WAKU_README_EOF'\n");
    script.push_str(&lib);
    script.push_str("\nWAKU_README_EOF\n");
    let mut commands_run = 0;
    for line in commands.lines() {
        script.push_str(line);
        script.push('\n');
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        commands_run += 1;
        if line.split('#').next().unwrap().trim_end().ends_with('&') {
            script.push_str("until [ -e waku-data/running-host.json ]; do sleep 0.2; done\n");
        }
    }
    assert!(commands_run >= 15, "the walk lost commands:\n{commands}");

    let dir = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_waku")).parent().unwrap().to_owned();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("scaffolds");
    let mut child = std::process::Command::new("bash")
        .args(["-e", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", &target)
        .env("WAKU_TARGET_DIR", &target)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(900);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the README's day did not end within 15 minutes");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "the README's day failed ({}):\n{stdout}\n{stderr}", out.status);
    // What the README says it shows.
    assert!(stdout.contains("key 9 type Visited (tag 1)"), "{stdout}");
    assert!(stdout.contains("page `/checkout` is too long"), "{stdout}");
    assert!(stdout.contains("re-drove 1 dead letter (1 event)"), "{stdout}");
    assert!(stdout.contains("into `retry_visits`; the running `waku run` applies them now"), "{stdout}");
    // `pages`: the consumed messages (`partition:offset` first) without
    // routing headers.
    let consumed = |line: &&str| {
        let place = line.split('\t').next().unwrap_or_default();
        place.split_once(':').is_some_and(|(p, o)| p.parse::<u32>().is_ok() && o.parse::<u64>().is_ok())
    };
    let pages: Vec<&str> = stdout
        .lines()
        .filter(|line| consumed(line) && line.contains("\"page\"") && !line.contains("waku.error.projection="))
        .collect();
    assert_eq!(pages.len(), 4, "{stdout}");
    assert!(pages.iter().any(|line| line.contains("/checkout")), "user 9's visit reached `pages`: {stdout}");
    assert!(stdout.contains("\"visits\": 1"), "{stdout}");
    assert!(stdout.contains("projection `shop` on topic `visits`"), "{stdout}");
}
