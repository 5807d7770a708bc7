//! Crash safety: `waku run` killed with SIGKILL at random moments, again and
//! again, then run to the end. State, counts and positions commit in one
//! transaction per batch, so the read model must equal the oracle and every
//! published event must have been applied exactly once.
//!
//! `WAKU_CRASH_TRIALS` sets the number of kills (default 20, what CI runs);
//! `WAKU_CRASH_SEED` picks the kill moments. For hundreds of trials:
//! `WAKU_CRASH_TRIALS=300 cargo test -p wakuwaku --test crash -- --nocapture`.

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{bank_wasm, text, waku_command};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use wakuwaku::consumer::stat;
use wakuwaku::demo::{self, WorkloadSpec};
use wakuwaku::log::EventLog;
use wakuwaku::log::embedded::EmbeddedLog;
use wakuwaku::projection::load_module_file;
use wakuwaku::publish::{self, Outgoing};
use wakuwaku::runtime::{Sandbox, SandboxLimits};
use wakuwaku::state::StateStore;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_host_at_random_moments_loses_nothing_and_applies_nothing_twice() {
    let trials = env_or("WAKU_CRASH_TRIALS", 20);
    let seed = env_or("WAKU_CRASH_SEED", 2026);
    let dir = tempfile::tempdir().unwrap();
    let modules = dir.path().join("modules");
    std::fs::create_dir(&modules).unwrap();
    std::fs::copy(bank_wasm(), modules.join("bank.wasm")).unwrap();
    let module = load_module_file(&Sandbox::new(SandboxLimits::default()).unwrap(), bank_wasm()).unwrap();

    // Publish a workload that outlasts the kills (hundreds to thousands of events are
    // consumed between two kills), then let go of the log file for the
    // child process.
    let events = (trials as usize * 3000).max(30_000);
    let spec = WorkloadSpec { events, accounts: 300, seed };
    let (events, oracle) = demo::workload(spec);
    {
        let log = EmbeddedLog::open(dir.path().join("data/log.redb")).unwrap();
        log.create_topic("accounts", 3).await.unwrap();
        let outgoing = events
            .iter()
            .map(|e| Outgoing {
                tag: demo::bank_tag(&*module, e.type_name).unwrap(),
                body: serde_json::to_vec(&e.body).unwrap(),
            })
            .collect();
        publish::publish(&log, "accounts", module.clone(), outgoing, None, 2).await.unwrap();
    }

    let run = || {
        waku_command(dir.path())
            .args(["run", "--data", "data", "--projection", "bank", "--topic", "accounts", "--modules", "modules"])
            .args(["--until-caught-up", "--batch-size", "97"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("waku starts")
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut killed, mut finished_early) = (0, 0);
    for trial in 0..trials {
        let mut child = run();
        std::thread::sleep(Duration::from_millis(rng.random_range(30..600)));
        match child.try_wait().unwrap() {
            Some(status) => {
                let stderr = text(&child.wait_with_output().unwrap().stderr);
                assert!(status.success(), "trial {trial}: waku failed on its own: {stderr}");
                finished_early += 1;
            }
            None => {
                child.kill().unwrap(); // SIGKILL: no chance to finish anything
                child.wait().unwrap();
                killed += 1;
            }
        }
    }
    // The kills landed mid-way: batches were committed, but not all.
    let consumed: u64 = {
        let store = StateStore::open(&dir.path().join("data/projections/bank.redb")).unwrap();
        (0..3).map(|p| store.position("accounts", p).unwrap().unwrap_or(0)).sum()
    };
    println!("{killed} kills, {finished_early} runs finished before their kill, {consumed} events committed");
    assert!(killed > 0, "no run was ever killed mid-way; the workload is too small for the kill times");
    assert!(consumed > 0, "no batch was ever committed before a kill; the kills only hit start-up");

    // One last run to the end.
    let started = Instant::now();
    let last = run().wait_with_output().unwrap();
    assert!(last.status.success(), "the final run failed: {}", text(&last.stderr));
    assert!(started.elapsed() < Duration::from_secs(120));

    let store = StateStore::open(&dir.path().join("data/projections/bank.redb")).unwrap();
    let check = demo::check_projection(&oracle, &*module, &store).unwrap();
    assert!(check.matches(), "after {killed} kills: {}", check.report(5));
    let applied = store.stats().unwrap().into_iter().find(|(name, _)| name == stat::APPLIED).map(|(_, n)| n);
    assert_eq!(applied, Some(spec.events as u64), "every event applied exactly once");
    let log = Arc::new(EmbeddedLog::open(dir.path().join("data/log.redb")).unwrap());
    for partition in 0..3 {
        let end = log.end_offset("accounts", partition).await.unwrap();
        assert_eq!(store.position("accounts", partition).unwrap(), Some(end));
    }
}
