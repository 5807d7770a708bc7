//! Crash safety with injected failures: `waku run` killed with SIGKILL at
//! random moments once its modules are loaded, again and again, over a ledger workload in which some
//! entries fail (transiently, retryably, unrecoverably, by trapping) and
//! some messages have unreadable headers; then run to the end.
//!
//! State, counts, positions, retry bookkeeping and routed records commit in
//! one transaction per batch, so afterwards:
//! - every balance equals the oracle (the sum of the entries that do not
//!   fail), and no key ever saw its entries out of order;
//! - every published message is accounted for exactly once: applied, or
//!   dead-lettered (one dead letter per failing entry and per unreadable
//!   message, never two), with nothing left in retry.
//!
//! `WAKU_CRASH_TRIALS` sets the number of kills (default 20, what CI runs);
//! `WAKU_CRASH_SEED` picks the workload and the kill moments. For hundreds:
//! `WAKU_CRASH_TRIALS=300 cargo test -p wakuwaku --test crash -- --nocapture`.

mod common;

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{probe_wasm, text, waku_command};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use wakuwaku::authoring::publish::{self, Outgoing};
use wakuwaku::engine::projection::load_module_file;
use wakuwaku::engine::routing::Routed;
use wakuwaku::event::Header;
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku::storage::state::StateStore;
use wakuwaku::storage::stats::Stat;

const PARTITIONS: u32 = 3;
const LEDGER_TAG: u32 = 50;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What the ledger must look like after the last run.
#[derive(Default)]
struct Oracle {
    balances: HashMap<u64, i64>,
    applied: u64,
    failing: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_host_at_random_moments_with_failures_loses_nothing_and_repeats_nothing() {
    let trials = env_or("WAKU_CRASH_TRIALS", 20);
    let seed = env_or("WAKU_CRASH_SEED", 2026);
    let dir = tempfile::tempdir().unwrap();
    let modules = dir.path().join("modules");
    std::fs::create_dir(&modules).unwrap();
    std::fs::copy(probe_wasm(), modules.join("probe.wasm")).unwrap();
    let module = load_module_file(&Sandbox::new(SandboxLimits::default()).unwrap(), probe_wasm()).unwrap();

    // A workload that outlasts the kills: ~2 % of the entries fail, in
    // every way, and a few messages cannot be read at all.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let events = (trials as usize * 6000).max(60_000);
    let mut oracle = Oracle::default();
    let mut seqs: HashMap<u64, u64> = HashMap::new();
    let outgoing: Vec<Outgoing> = (0..events)
        .map(|_| {
            let key = rng.random_range(0..300u64);
            let seq = seqs.entry(key).or_default();
            *seq += 1;
            let amount = rng.random_range(1..100i64);
            let fail = match rng.random_range(0..200) {
                0 => Some("transient"),
                1 => Some("retryable"),
                2 => Some("unrecoverable"),
                3 => Some("trap"),
                _ => None,
            };
            match fail {
                Some(_) => oracle.failing += 1,
                None => {
                    *oracle.balances.entry(key).or_default() += amount;
                    oracle.applied += 1;
                }
            }
            let ordering = ["relaxed", "relaxed", "acquire", "release", "acq-rel"][rng.random_range(0..5)];
            let body =
                serde_json::json!({ "key": key, "seq": *seq, "amount": amount, "fail": fail, "ordering": ordering });
            Outgoing { tag: wakuwaku::event::EventTypeTag::new(LEDGER_TAG), body: serde_json::to_vec(&body).unwrap() }
        })
        .collect();
    let malformed = events as u64 / 500;
    {
        let log = EmbeddedLog::open(dir.path().join("data/log.redb")).unwrap();
        log.create_topic("ledger", PARTITIONS).await.unwrap();
        publish::publish(&log, "ledger", module.clone(), outgoing, None, 2).await.unwrap();
        for i in 0..malformed {
            let garbled = Record { headers: vec![Header { name: "waku-tag".into(), value: vec![1] }], body: vec![] };
            log.append("ledger", vec![((i % u64::from(PARTITIONS)) as u32, vec![garbled])]).await.unwrap();
        }
    }

    let run = || {
        waku_command(dir.path())
            .args(["run", "--data", "data", "--projection", "ledger", "--topic", "ledger", "--modules", "modules"])
            .args(["--until-caught-up", "--batch-size", "97", "--max-attempts", "3", "--retry-delays", "0s"])
            .args(["--transient-retries", "1", "--transient-backoff", "1ms"])
            // The probe declares the topics it may emit to; they must exist.
            .args(["--create-emit-topics", "1"])
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("waku starts")
    };
    let (mut killed, mut finished_early) = (0, 0);
    for trial in 0..trials {
        let mut child = run();
        // Kill during consumption, not start-up: wait for the line `run`
        // prints once its modules are loaded (slow on a busy machine).
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while std::io::BufRead::read_line(&mut stderr, &mut line).unwrap_or(0) > 0 && !line.contains("batch 97") {
            line.clear();
        }
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        std::thread::sleep(Duration::from_millis(rng.random_range(10..250)));
        match child.try_wait().unwrap() {
            Some(status) => {
                assert!(status.success(), "trial {trial}: waku failed on its own: {line}");
                finished_early += 1;
            }
            None => {
                child.kill().unwrap(); // SIGKILL: no chance to finish anything
                child.wait().unwrap();
                killed += 1;
            }
        }
    }
    let state_path = dir.path().join("data/projections/ledger.redb");
    let consumed: u64 = {
        let store = StateStore::open(&state_path).unwrap();
        (0..PARTITIONS).map(|p| store.position("ledger", p).unwrap().unwrap_or(0)).sum()
    };
    println!("{killed} kills, {finished_early} runs finished before their kill, {consumed} messages committed");
    assert!(killed > 0, "no run was ever killed mid-way; the workload is too small for the kill times");
    assert!(consumed > 0, "no batch was ever committed before a kill; the kills only hit start-up");

    // One last run to the end.
    let started = Instant::now();
    let last = run().wait_with_output().unwrap();
    assert!(last.status.success(), "the final run failed: {}", text(&last.stderr));
    assert!(started.elapsed() < Duration::from_secs(120));

    let store = StateStore::open(&state_path).unwrap();
    // The module says which key an account number is.
    let mut instance = module.instantiate().unwrap();
    let tag = wakuwaku::event::EventTypeTag::new(LEDGER_TAG);
    let mut balance = |key: u64| -> i64 {
        let body = serde_json::json!({ "key": key, "seq": 0, "amount": 0, "fail": null, "ordering": "relaxed" });
        let key = instance.key(tag, &serde_json::to_vec(&body).unwrap()).unwrap();
        store.get(&key, "balance").unwrap().map_or(0, |b| serde_json::from_slice(&b).unwrap())
    };
    let wrong: Vec<(u64, i64, i64)> = oracle
        .balances
        .iter()
        .map(|(&key, &expected)| (key, expected, balance(key)))
        .filter(|&(_, expected, found)| found != expected)
        .take(5)
        .collect();
    assert!(wrong.is_empty(), "after {killed} kills, balances differ (key, expected, found): {wrong:?}");
    let counters: HashMap<String, i128> = store.counters().unwrap().into_iter().collect();
    assert_eq!(counters.get("out_of_order"), None, "a key saw its entries out of order");
    assert_eq!(counters.get("ledger").copied(), Some(oracle.applied as i128), "every entry applied exactly once");

    let stats = store.stats().unwrap();
    assert_eq!(stats[Stat::Applied], oracle.applied);
    assert_eq!(stats[Stat::DeadLettered], oracle.failing + malformed);
    assert_eq!(stats[Stat::Malformed], malformed);
    assert_eq!(stats.retrying(), 0, "nothing is left in retry");
    assert_eq!(stats[Stat::Skipped], 0);

    // Exactly one dead letter per failing entry and unreadable message.
    let log = Arc::new(EmbeddedLog::open(dir.path().join("data/log.redb")).unwrap());
    let mut origins = HashSet::new();
    for partition in 0..PARTITIONS {
        let end = log.end_offset("ledger", partition).await.unwrap();
        assert_eq!(store.position("ledger", partition).unwrap(), Some(end));
        let dlq_end = log.end_offset("dlq_ledger", partition).await.unwrap();
        for letter in log.read("dlq_ledger", partition, 0, dlq_end as usize).await.unwrap() {
            let routed = Routed::parse(&letter.record.headers).unwrap();
            assert!(origins.insert((routed.origin_partition, routed.origin_offset)), "a dead letter was written twice");
        }
    }
    assert_eq!(origins.len() as u64, oracle.failing + malformed);
}
