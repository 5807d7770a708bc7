//! A projection over several topics through every command, the real
//! binary: its topics come from `waku.toml` (`topic = ["a", "b"]`),
//! `WAKU_TOPIC` or repeated `--topic` flags for `status`, `dlq`, `reset`
//! and `state` as for `run`; `status` shows the same figures per topic and
//! per partition whether it asks the admin endpoint, runs through the
//! running host's socket or reads the files; a later topic given first is
//! refused naming the first; and a `run` that fails on a misspelt topic or
//! data directory leaves nothing behind.
//!
//! The workload is the probe's timed ledger over topics `a` and `b`
//! ([`super::event_time`]).

#![cfg(unix)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, text, waku};
use crate::event_time::{probe, publish, workload};

/// The README's shape of a two-topic projection's `waku.toml`.
const WAKU_TOML: &str = "data = \"data\"\nprojection = \"ledger\"\ntopic = [\"a\", \"b\"]\nmodules = \"modules\"\n";

/// `dir` with the probe in `modules`, a two-topic workload published to
/// `a` and `b` of `data`, and the README's `waku.toml`.
async fn two_topic_projection(dir: &Path) {
    let module = probe(dir);
    publish(dir, &module, &workload(6, 5, 3, false)).await;
    std::fs::write(dir.join("waku.toml"), WAKU_TOML).unwrap();
}

fn succeeds(dir: &Path, args: &[&str]) -> Output {
    let out = waku(args, dir);
    assert!(out.status.success(), "`waku {}`: {}{}", args.join(" "), text(&out.stdout), text(&out.stderr));
    out
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_takes_the_topics_of_waku_toml_as_run_does() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    two_topic_projection(dir).await;
    succeeds(dir, &["run", "--until-caught-up", "--create-emit-topics", "1"]);

    let status = succeeds(dir, &["status"]);
    let shown = text(&status.stdout);
    assert!(shown.starts_with("projection `ledger` on topics `a`, `b`: caught up"), "{shown}");
    let status = json(&succeeds(dir, &["status", "--output", "json"]));
    for partition in status["partitions"].as_array().unwrap() {
        let topics: Vec<&str> =
            partition["topics"].as_array().unwrap().iter().map(|t| t["topic"].as_str().unwrap()).collect();
        assert_eq!(topics, ["a", "b"], "{status}");
        let summed: u64 = partition["topics"].as_array().unwrap().iter().map(|t| t["position"].as_u64().unwrap()).sum();
        assert_eq!(partition["position"].as_u64(), Some(summed), "{status}");
    }
    for environment in ["a,b", ""] {
        let out = common::waku_command(dir).args(["status"]).env("WAKU_TOPIC", environment).output().unwrap();
        assert!(out.status.success(), "WAKU_TOPIC={environment}: {}", text(&out.stderr));
    }
    let listed = json(&succeeds(dir, &["dlq", "list", "--output", "json"]));
    assert_eq!((listed["topic"].as_str(), listed["dead_letters"].as_array().map(Vec::len)), (Some("a"), Some(0)));
    succeeds(dir, &["dlq", "list", "--topic", "a", "--topic", "b"]);
    let show = waku(&["dlq", "show", "--record", "0:0"], dir);
    assert_eq!(show.status.code(), Some(1), "found no letter, not a usage error: {}", text(&show.stderr));
    assert!(text(&show.stderr).contains("no dead letter"), "{}", text(&show.stderr));
    succeeds(dir, &["dlq", "redrive", "--all"]);
    succeeds(dir, &["state", "counters"]);
    succeeds(dir, &["modules", "list"]);

    let reset = succeeds(dir, &["reset", "--to", "latest", "--yes"]);
    let said = text(&reset.stderr);
    assert!(said.contains("to latest in `a`, `b`"), "both topics named: {said}");
    let moved = text(&reset.stdout);
    for topic in ["`a` partition 0", "`a` partition 1", "`b` partition 0", "`b` partition 1"] {
        assert!(moved.contains(topic), "{topic} not in {moved}");
    }
    let reset = succeeds(dir, &["reset", "--to", "earliest", "--yes", "--no-backup"]);
    let said = text(&reset.stderr);
    assert!(said.contains("every event of `a`, `b` is applied again"), "{said}");
    let status = json(&succeeds(dir, &["status", "--output", "json"]));
    let positions: Vec<u64> =
        status["partitions"].as_array().unwrap().iter().map(|p| p["position"].as_u64().unwrap()).collect();
    assert!(positions.iter().all(|&p| p == 0), "every topic starts over: {status}");

    // A shadow rebuild over both topics, asked with the topics of waku.toml.
    let asked = succeeds(dir, &["rebuild", "--modules", "modules"]);
    let said = format!("{}{}", text(&asked.stdout), text(&asked.stderr));
    assert!(said.contains("rebuild 1 of `ledger` over `a`, `b`"), "both topics rebuilt: {said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_topic_given_first_is_refused_naming_the_first_topic() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    two_topic_projection(dir).await;
    succeeds(dir, &["run", "--until-caught-up", "--create-emit-topics", "1"]);
    for command in
        [&["dlq", "list"][..], &["dlq", "redrive", "--all"], &["status"], &["reset", "--to", "latest", "--yes"]]
    {
        let out = waku(&[command, &["--topic", "b"]].concat(), dir);
        let said = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{said}");
        assert!(
            said.contains("dead letters of projection `ledger` are in `dlq_a`, named by its first topic `a`, not `b`"),
            "`waku {}`: {said}",
            command.join(" ")
        );
    }
    succeeds(dir, &["dlq", "list", "--topic", "a"]);
}

/// `status` as JSON with the figures that move with the wall clock
/// (watermark lag) left out.
fn steady(mut status: serde_json::Value) -> serde_json::Value {
    for timing in status["event_time"].as_array_mut().into_iter().flatten() {
        timing["watermark_lag_ms"] = serde_json::Value::Null;
    }
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_through_the_socket_the_admin_endpoint_and_the_files_agree() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    two_topic_projection(dir).await;
    let mut host = common::waku_command(dir)
        .args(["run", "--create-emit-topics", "1", "--admin", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = common::stderr_lines(&mut host);
    let mut seen = Vec::new();
    common::wait_for_line(&lines, &mut seen, |line| line.starts_with("waku: admin endpoint on "));
    let url = seen.iter().find_map(|line| line.strip_prefix("waku: admin endpoint on ")).unwrap().trim().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    let through_socket = loop {
        let out = waku(&["status", "--output", "json"], dir);
        if out.status.success() && dir.join("data/running-host.json").exists() {
            let status = json(&out);
            let caught_up = status["partitions"].as_array().unwrap().iter().all(|p| p["caught_up"] == true);
            let clocks = status["event_time"].as_array().into_iter().flatten().collect::<Vec<_>>();
            if caught_up && !clocks.is_empty() && clocks.iter().all(|t| t["clock_ms"].is_i64()) {
                break status;
            }
        }
        assert!(Instant::now() < deadline, "not caught up within a minute");
        std::thread::sleep(Duration::from_millis(100));
    };
    let through_admin = json(&succeeds(dir, &["status", "--output", "json", "--admin", &url]));
    assert_eq!(steady(through_socket.clone()), steady(through_admin), "socket and admin endpoint");
    for partition in through_socket["partitions"].as_array().unwrap() {
        assert!(partition["end_at_start"].is_u64(), "the start-up end through the socket: {through_socket}");
        assert_eq!(partition["topics"].as_array().map(Vec::len), Some(2), "{through_socket}");
    }

    let stopped = Command::new("kill").args(["-TERM", &host.id().to_string()]).status().unwrap();
    assert!(stopped.success());
    assert!(host.wait().unwrap().success());
    let from_files = json(&succeeds(dir, &["status", "--output", "json"]));
    // What only a running host knows (its start-up ends, its release
    // stages) is gone with it; the rest is the same figures.
    let without_live = |mut status: serde_json::Value| {
        status["event_time"] = serde_json::Value::Null;
        status["redone"] = serde_json::Value::Null;
        for partition in status["partitions"].as_array_mut().unwrap() {
            partition["end_at_start"] = serde_json::Value::Null;
        }
        status
    };
    assert_eq!(without_live(from_files), without_live(through_socket), "files and running host");
}

/// Every path under `dir`, relative.
fn tree(dir: &Path) -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path.clone());
            }
            found.insert(path.strip_prefix(dir).unwrap().to_owned());
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_a_misspelt_topic_or_data_directory_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    two_topic_projection(dir).await;
    let before = tree(dir);
    assert!(!before.contains(Path::new("data/projections")), "{before:?}");
    let cases: [(&[&str], &str); 3] = [
        (&["--topic", "a", "--topic", "shipmnets"], "topic `shipmnets` does not exist"),
        (&["--topic", "ab"], "topic `ab` does not exist"),
        (&["--data", "dta"], "no data directory `dta` (data directories beside it: data)"),
    ];
    for (flags, expected) in cases {
        let out = waku(&[&["run", "--until-caught-up"][..], flags].concat(), dir);
        let said = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{said}");
        assert!(said.contains(expected), "`{expected}` not in {said}");
        assert_eq!(tree(dir), before, "`waku run {}` left something behind", flags.join(" "));
    }
}
