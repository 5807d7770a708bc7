//! `waku run --topic a --topic b`: a projection over two co-partitioned
//! topics applies each key's events in event-time order (the
//! `waku-event-time` header), exactly once, across restarts and SIGKILLs,
//! and delivers late events at once, counted.
//!
//! The workload is the probe's timed ledger (`TimedLedger`, a timed type):
//! `seq` rises with each key's event time, and the module counts
//! `out_of_order` when it sees it fall, so the state says whether the order
//! held; `ledger` counts the entries applied. A timed Python module
//! (`tests/guests/ledger-py`) goes through `waku test` with two files the
//! same way.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use wakuwaku::authoring::publish::headers_for;
use wakuwaku::engine::projection::load_module_file;
use wakuwaku::event::{EventTypeTag, header_name, partition_for};
use wakuwaku::sandbox::handler::HandlerModule;
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku::storage::state::StateStore;
use wakuwaku::storage::stats::Stat;

use crate::common::{compile_cache, inventory_wasm, ledger_py_wasm, probe_wasm, text, waku, waku_command, waku_within};

pub(crate) const PARTITIONS: u32 = 2;
/// The probe's `TimedLedger`.
pub(crate) const LEDGER: EventTypeTag = EventTypeTag::new(51);
/// 2026-12-02T00:00:00Z, in ms.
pub(crate) const BASE_MS: i64 = 1_796_169_600_000;
/// 9999-12-31T23:59:59Z, in ms.
const YEAR_9999_MS: i64 = 253_402_300_799_000;
/// How long a run that must end may take before the test calls it stuck.
const MUST_END_WITHIN: Duration = Duration::from_secs(180);

/// The time now, in ms since the epoch.
fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

/// One ledger entry to publish.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub(crate) key: u64,
    pub(crate) seq: u64,
    pub(crate) amount: i64,
    pub(crate) event_time: i64,
}

pub(crate) fn probe(dir: &Path) -> Arc<dyn HandlerModule> {
    let modules = dir.join("modules");
    std::fs::create_dir_all(&modules).unwrap();
    std::fs::copy(probe_wasm(), modules.join("probe.wasm")).unwrap();
    load_module_file(&Sandbox::new(SandboxLimits::default()).unwrap(), probe_wasm()).unwrap()
}

/// Each key's `per_key` entries, `seq` and event time rising together,
/// each put in topic `a` or `b` at random: the two topics interleave each
/// key's history. Each partition is in event-time order, as producers that
/// stamp their events when they send them write them; with `jitter`, only
/// per key: entries of one `seq` of different keys are appended in any
/// order within their second, as several producers sharing a partition
/// write them.
pub(crate) fn workload(keys: u64, per_key: u64, seed: u64, jitter: bool) -> Vec<(&'static str, Entry)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut entries = Vec::new();
    for key in 0..keys {
        for seq in 1..=per_key {
            let within = if jitter { rng.random_range(0..1000) } else { key as i64 };
            let event_time = BASE_MS + (seq as i64) * 1000 + within;
            let topic = if rng.random_range(0..2) == 0 { "a" } else { "b" };
            entries.push((topic, Entry { key, seq, amount: rng.random_range(1..100), event_time }));
        }
    }
    match jitter {
        false => entries.sort_by_key(|(_, entry)| entry.event_time),
        true => {
            let mut order: Vec<(u64, u64, usize)> =
                entries.iter().enumerate().map(|(at, (_, entry))| (entry.seq, rng.random::<u64>(), at)).collect();
            order.sort_unstable();
            entries = order.into_iter().map(|(_, _, at)| entries[at]).collect();
        }
    }
    entries
}

/// Appends `entries` to their topics, each partition's in the order given,
/// each with the headers the module writes for it (`waku-event-time` from
/// its body's `at`).
pub(crate) async fn publish(dir: &Path, module: &Arc<dyn HandlerModule>, entries: &[(&str, Entry)]) {
    let log = EmbeddedLog::open(dir.join("data/log.redb")).unwrap();
    for topic in ["a", "b"] {
        if log.partitions(topic).await.is_err() {
            log.create_topic(topic, PARTITIONS).await.unwrap();
        }
    }
    let event_type = module.event_types().iter().find(|t| t.tag == LEDGER).unwrap().clone();
    let mut instance = module.instantiate().unwrap();
    let mut batched: std::collections::BTreeMap<&str, Vec<(u32, Vec<Record>)>> = Default::default();
    for (topic, entry) in entries {
        let body = serde_json::to_vec(&serde_json::json!({
            "key": entry.key, "seq": entry.seq, "amount": entry.amount, "fail": null, "ordering": "relaxed",
            "at": entry.event_time
        }))
        .unwrap();
        let headers = headers_for(&mut *instance, &event_type, &body).unwrap();
        assert_eq!(headers.event_time, Some(entry.event_time), "the module's event time");
        let partition = partition_for(headers.key.key_hash(), PARTITIONS);
        let batches = batched.entry(*topic).or_insert_with(|| (0..PARTITIONS).map(|p| (p, Vec::new())).collect());
        batches[partition as usize].1.push(Record { headers: headers.to_headers(), body });
    }
    // Each partition's records in the order given, a topic's in one append.
    for (topic, batches) in batched {
        log.append(topic, batches).await.unwrap();
    }
}

pub(crate) fn run_args() -> Vec<&'static str> {
    vec![
        "run",
        "--data",
        "data",
        "--projection",
        "ledger",
        "--topic",
        "a",
        "--topic",
        "b",
        "--modules",
        "modules",
        "--until-caught-up",
        "--batch-size",
        "16",
        "--create-emit-topics",
        "1",
    ]
}

/// What the projection holds at the end.
#[derive(Debug, PartialEq)]
pub(crate) struct Outcome {
    pub(crate) applied_entries: i128,
    pub(crate) out_of_order: Option<i128>,
    pub(crate) violations: u64,
    pub(crate) balances: HashMap<u64, i64>,
    pub(crate) last_seq: HashMap<u64, u64>,
}

pub(crate) fn outcome(dir: &Path, module: &Arc<dyn HandlerModule>, keys: u64) -> Outcome {
    outcome_of(dir, module, 0..keys, "ledger")
}

/// What `projection` holds at the end.
fn outcome_of(
    dir: &Path,
    module: &Arc<dyn HandlerModule>,
    keys: impl IntoIterator<Item = u64>,
    projection: &str,
) -> Outcome {
    let store = StateStore::open(&dir.join(format!("data/projections/{projection}.redb"))).unwrap();
    let counters: HashMap<String, i128> = store.counters().unwrap().into_iter().collect();
    let stats = store.stats().unwrap();
    let mut instance = module.instantiate().unwrap();
    let (mut balances, mut last_seq) = (HashMap::new(), HashMap::new());
    for key in keys {
        let body = serde_json::json!({ "key": key, "seq": 0, "amount": 0, "fail": null, "ordering": "relaxed" });
        let state_key = instance.key(LEDGER, &serde_json::to_vec(&body).unwrap()).unwrap();
        let read = |name: &str| store.get(&state_key, name).unwrap();
        balances.insert(key, read("balance").map_or(0, |b| serde_json::from_slice(&b).unwrap()));
        last_seq.insert(key, read("seq").map_or(0, |s| serde_json::from_slice(&s).unwrap()));
    }
    Outcome {
        applied_entries: counters.get("ledger").copied().unwrap_or(0),
        out_of_order: counters.get("out_of_order").copied(),
        violations: stats[Stat::OrderViolations],
        balances,
        last_seq,
    }
}

pub(crate) fn oracle_balances(entries: &[(&str, Entry)]) -> HashMap<u64, i64> {
    let mut balances = HashMap::new();
    for (_, entry) in entries {
        *balances.entry(entry.key).or_default() += entry.amount;
    }
    balances
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_topics_interleaving_each_keys_history_are_applied_in_event_time_order() {
    let dir = tempfile::tempdir().unwrap();
    let module = probe(dir.path());
    let (keys, per_key) = (30, 40);
    let entries = workload(keys, per_key, 32, false);
    publish(dir.path(), &module, &entries).await;

    let run = waku(&run_args(), dir.path());
    let stderr = text(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(!stderr.contains("late event"), "{stderr}");

    let found = outcome(dir.path(), &module, keys);
    assert_eq!(found.out_of_order, None, "a key saw its entries out of event-time order");
    assert_eq!(found.applied_entries, (keys * per_key) as i128, "every entry applied exactly once");
    assert_eq!(found.violations, 0);
    assert_eq!(found.balances, oracle_balances(&entries));
    assert!(found.last_seq.values().all(|&seq| seq == per_key), "{:?}", found.last_seq);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_event_is_applied_at_once_counted_and_logged_and_an_unreadable_event_time_dead_lettered() {
    let dir = tempfile::tempdir().unwrap();
    let module = probe(dir.path());
    let entries = workload(4, 10, 7, false);
    publish(dir.path(), &module, &entries).await;
    assert!(waku(&run_args(), dir.path()).status.success());

    // Key 3's next entry, stamped an hour before everything read so far:
    // the clock (committed with the last batch) is past it already.
    let late = Entry { key: 3, seq: 11, amount: 5, event_time: BASE_MS - 3_600_000 };
    publish(dir.path(), &module, &[("b", late)]).await;
    // And a message whose event time is 3 bytes, not 8.
    {
        let log = EmbeddedLog::open(dir.path().join("data/log.redb")).unwrap();
        let mut record = log.read("a", 0, 0, 1).await.unwrap().remove(0).record;
        let header = record.headers.iter_mut().find(|h| h.name == header_name::EVENT_TIME).unwrap();
        header.value.truncate(3);
        log.append("a", vec![(0, vec![record])]).await.unwrap();
    }
    let run = waku(&run_args(), dir.path());
    let stderr = text(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let line = stderr.lines().find(|line| line.contains("late event of key")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("late event of key 3") && line.contains("lateness_ms"), "{line}");

    let unreadable =
        stderr.lines().find(|line| line.contains("unreadable headers")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(unreadable.contains("waku-event-time"), "the reason names the header: {unreadable}");
    let store = StateStore::open(&dir.path().join("data/projections/ledger.redb")).unwrap();
    let stats = store.stats().unwrap();
    assert_eq!((stats[Stat::Malformed], stats[Stat::DeadLettered]), (1, 1));
    drop(store);

    let found = outcome(dir.path(), &module, 4);
    assert_eq!(found.violations, 1, "the late event is counted once");
    assert_eq!(found.applied_entries, 41, "and applied, not dropped");
    assert_eq!(found.last_seq[&3], 11);
    let mut expected = oracle_balances(&entries);
    *expected.get_mut(&3).unwrap() += 5;
    assert_eq!(found.balances, expected);

    let status = waku(&["status", "--data", "data", "--projection", "ledger", "--topic", "a"], dir.path());
    let shown = text(&status.stdout);
    assert!(shown.contains("1 order violations"), "{shown}{}", text(&status.stderr));
}

#[test]
fn topics_with_different_partition_counts_are_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    probe(dir.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let log = EmbeddedLog::open(dir.path().join("data/log.redb")).unwrap();
        log.create_topic("a", 2).await.unwrap();
        log.create_topic("b", 3).await.unwrap();
    });
    let run = waku(&run_args(), dir.path());
    let stderr = text(&run.stderr);
    assert!(!run.status.success());
    assert!(
        stderr.contains("`a` has 2") && stderr.contains("`b` has 3") && stderr.contains("co-partitioned"),
        "{stderr}"
    );
}

/// SIGKILL at random moments while the two topics are read (the stage
/// holds events whenever one topic is ahead of the other, and, as the
/// partitions are in event-time order only per key, events above the
/// committed position that were released already), then one run to the
/// end: every entry applied once, each key in event-time order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_host_while_events_are_held_loses_none_and_repeats_none() {
    let trials: u64 = std::env::var("WAKU_CRASH_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    let dir = tempfile::tempdir().unwrap();
    let module = probe(dir.path());
    let (keys, per_key) = (50, 160);
    let entries = workload(keys, per_key, 2026, true);
    publish(dir.path(), &module, &entries).await;
    let killed = crate::common::kill_runs_at_random(dir.path(), &run_args(), trials, 5);
    assert!(killed > 0, "no run was killed mid-way");
    let last = waku(&run_args(), dir.path());
    assert!(last.status.success(), "{}", text(&last.stderr));

    let found = outcome(dir.path(), &module, keys);
    assert_eq!(found.out_of_order, None, "after {killed} kills, a key saw its entries out of event-time order");
    assert_eq!(found.applied_entries, (keys * per_key) as i128, "after {killed} kills, not exactly once");
    assert_eq!(found.balances, oracle_balances(&entries));
}

/// A timed ledger entry as a JSON line for `waku publish` and `waku test`,
/// stamped `at` (none when `None`).
fn timed_line(key: u64, seq: u64, at: Option<i64>) -> String {
    let body = serde_json::json!({
        "key": key, "seq": seq, "amount": seq, "fail": null, "ordering": "relaxed", "at": at
    });
    serde_json::json!({ "type": "TimedLedger", "body": body }).to_string()
}

/// `waku publish` asks the module for a timed type's event time and writes
/// it into `waku-event-time` (the bytes README documents for other
/// producers); an untimed type's message carries none; a timed event the
/// module has no time for is refused with the rule, and nothing of the
/// file is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waku_publish_writes_the_modules_event_time_and_refuses_a_timed_event_without_one() {
    let dir = tempfile::tempdir().unwrap();
    probe(dir.path());
    let probe = probe_wasm().display().to_string();
    let untimed =
        r#"{"type": "Ledger", "body": {"key": 1, "seq": 2, "amount": 1, "fail": null, "ordering": "relaxed"}}"#;
    let lines = [timed_line(1, 1, Some(1_796_212_800_000)), untimed.to_owned()];
    std::fs::write(dir.path().join("good.jsonl"), lines.join("\n")).unwrap();
    let publish = |file: &str| {
        let args = ["publish", "--data", "data", "--topic", "a", "--partitions", "1", "--module", &probe, file];
        waku(&args, dir.path())
    };
    let out = publish("good.jsonl");
    assert!(out.status.success(), "{}", text(&out.stderr));

    let bad = [timed_line(2, 1, Some(1)), timed_line(2, 2, None)].join("\n");
    std::fs::write(dir.path().join("bad.jsonl"), bad).unwrap();
    let out = publish("bad.jsonl");
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("line 2") && stderr.contains("event-time-declared: TimedLedger"), "{stderr}");

    let log = EmbeddedLog::open(dir.path().join("data/log.redb")).unwrap();
    let records = log.read("a", 0, 0, 10).await.unwrap();
    let event_times: Vec<Option<Vec<u8>>> = records
        .iter()
        .map(|r| r.record.headers.iter().find(|h| h.name == header_name::EVENT_TIME).map(|h| h.value.clone()))
        .collect();
    // 2026-12-02T12:00:00Z, as README "Event time across topics" shows it.
    assert_eq!(event_times, [Some(vec![0x00, 0x3a, 0xa0, 0x36, 0xa2, 0x01, 0x00, 0x00]), None], "nothing of bad.jsonl");
}

/// `waku test` with two files consumes them as two topics of one
/// projection, as the host does: each key's timed entries are applied in
/// event-time order across the files, whatever file they are in.
#[test]
fn waku_test_applies_timed_events_across_files_in_event_time_order() {
    let dir = tempfile::tempdir().unwrap();
    let probe = probe_wasm().display().to_string();
    // Key 1's entries alternate between the files; `seq` rises with time.
    let a: Vec<String> = [1u64, 3, 5].iter().map(|&seq| timed_line(1, seq, Some(BASE_MS + seq as i64))).collect();
    let b: Vec<String> = [2u64, 4, 6].iter().map(|&seq| timed_line(1, seq, Some(BASE_MS + seq as i64))).collect();
    std::fs::write(dir.path().join("a.jsonl"), a.join("\n")).unwrap();
    std::fs::write(dir.path().join("b.jsonl"), b.join("\n")).unwrap();

    let out = waku(&["test", &probe, "a.jsonl", "b.jsonl", "--expect", "expected.json", "--update"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let outcome: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("expected.json")).unwrap()).unwrap();
    let key = &outcome["keys"]["1"]["state"];
    assert_eq!((&key["seq"], &key["balance"]), (&serde_json::json!(6), &serde_json::json!(21)), "{outcome}");
    assert_eq!(outcome["counters"]["ledger"], serde_json::json!(6), "{outcome}");
    assert!(outcome["counters"].get("out_of_order").is_none(), "applied out of event-time order: {outcome}");

    // One file is one topic, applied in its order.
    let out = waku(&["test", &probe, "b.jsonl", "--expect", "one.json", "--update"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let outcome: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("one.json")).unwrap()).unwrap();
    assert_eq!(outcome["keys"]["1"]["state"]["seq"], serde_json::json!(6), "{outcome}");
}

/// `{"type": ty, "body": {"key": 7, "at": at}}` lines, one per time: the
/// probe's timed events of product 7 (see its `seen_event!`).
fn seen_lines(ty: &str, times: &[i64]) -> String {
    let line = |at: &i64| serde_json::json!({ "type": ty, "body": { "key": 7, "at": BASE_MS + at } }).to_string();
    times.iter().map(line).collect::<Vec<_>>().join("\n")
}

/// What product 7's handler saw, `O@1` for an `Ordered` at `BASE_MS + 1`.
fn seen_by_handler(seen: &serde_json::Value) -> Vec<String> {
    let seen: Vec<String> = serde_json::from_value(seen.clone()).unwrap_or_else(|e| panic!("{e}: {seen}"));
    seen.into_iter()
        .map(|entry| {
            let (letter, at) = entry.split_once('@').unwrap();
            format!("{letter}@{}", at.parse::<i64>().unwrap() - BASE_MS)
        })
        .collect()
}

/// Issue 45: two relaxed timed types of one key, one topic each (the
/// README's orders and shipments), reach the handler in event-time order
/// through `waku test` with two files and through `waku run` with two
/// topics alike (`event-time-order`); the same two declared
/// `timed-relaxed` keep their per-type runs.
#[test]
fn relaxed_timed_types_of_two_topics_reach_the_handler_in_event_time_order_in_waku_test_and_waku_run() {
    let dir = tempfile::tempdir().unwrap();
    let probe = probe_wasm().display().to_string();
    let modules = dir.path().join("modules");
    std::fs::create_dir_all(&modules).unwrap();
    std::fs::copy(probe_wasm(), modules.join("probe.wasm")).unwrap();
    let files = [
        ("orders.jsonl", seen_lines("Ordered", &[1000, 3000, 5000])),
        ("shipments.jsonl", seen_lines("Shipped", &[2000, 4000, 6000])),
        ("returns.jsonl", seen_lines("Returned", &[1000, 3000, 5000])),
        ("inspections.jsonl", seen_lines("Inspected", &[2000, 4000, 6000])),
    ];
    for (file, lines) in &files {
        std::fs::write(dir.path().join(file), lines).unwrap();
    }
    let in_time_order = ["O@1000", "S@2000", "O@3000", "S@4000", "O@5000", "S@6000"];
    let per_type = ["R@1000", "R@3000", "R@5000", "I@2000", "I@4000", "I@6000"];

    for ((first, second), expected) in
        [(("orders", "shipments"), in_time_order), (("returns", "inspections"), per_type)]
    {
        let (a, b) = (format!("{first}.jsonl"), format!("{second}.jsonl"));
        let outcome = format!("{first}.json");
        let out = waku(&["test", &probe, &a, &b, "--expect", &outcome, "--update"], dir.path());
        assert!(out.status.success(), "{}", text(&out.stderr));
        let outcome: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join(&outcome)).unwrap()).unwrap();
        assert_eq!(seen_by_handler(&outcome["keys"]["7"]["state"]["seen"]), expected, "waku test: {outcome}");

        for (topic, file) in [(first, &a), (second, &b)] {
            let args = ["publish", "--data", "data", "--topic", topic, "--partitions", "1", "--module", &probe, file];
            let out = waku(&args, dir.path());
            assert!(out.status.success(), "{}", text(&out.stderr));
        }
        let projection = format!("{first}-{second}");
        let args = ["run", "--data", "data", "--projection", &projection, "--topic", first, "--topic", second];
        let more = ["--modules", "modules", "--until-caught-up", "--create-emit-topics", "1"];
        let run = waku(&[&args[..], &more[..]].concat(), dir.path());
        assert!(run.status.success(), "{}", text(&run.stderr));
        let store = StateStore::open(&dir.path().join(format!("data/projections/{projection}.redb"))).unwrap();
        let seen = store.get(&wakuwaku::key::Key::int(7u64), "seen").unwrap().expect("product 7 was handled");
        let seen: serde_json::Value = serde_json::from_slice(&seen).unwrap();
        assert_eq!(seen_by_handler(&seen), expected, "waku run");
        assert_eq!(store.stats().unwrap()[Stat::OrderViolations], 0);
    }
}

/// A timed Python module (`tests/guests/ledger-py`, built with
/// componentize-py) through `waku test` with two files, two topics of one
/// projection: each account's entries are split over the files and
/// published out of event-time order across them (`a.jsonl` first, though
/// `b.jsonl` holds each account's earliest entries), and applied in
/// event-time order, as the module's `applied` list shows.
#[test]
fn a_timed_python_module_applies_entries_across_files_in_event_time_order() {
    let Some(wasm) = ledger_py_wasm("a timed Python module through `waku test`") else { return };
    let dir = tempfile::tempdir().unwrap();
    let line = |account: u64, seq: u64| {
        let body = serde_json::json!({ "account": account, "seq": seq, "amount": seq, "at": BASE_MS + seq as i64 });
        serde_json::json!({ "type": "Entry", "body": body }).to_string()
    };
    let file = |entries: &[(u64, u64)]| entries.iter().map(|&(account, seq)| line(account, seq)).collect::<Vec<_>>();
    let a = file(&[(1, 3), (2, 2), (1, 4), (2, 3), (1, 6)]);
    let b = file(&[(1, 1), (2, 1), (1, 2), (1, 5)]);
    std::fs::write(dir.path().join("a.jsonl"), a.join("\n")).unwrap();
    std::fs::write(dir.path().join("b.jsonl"), b.join("\n")).unwrap();

    let (wasm, cache) = (wasm.display().to_string(), compile_cache().display().to_string());
    let test = |files: &[&str], outcome: &str| {
        let args = [&["test", wasm.as_str()], files, &["--compile-cache", &cache, "--expect", outcome, "--update"]];
        let out = waku(&args.concat(), dir.path());
        assert!(out.status.success(), "{}", text(&out.stderr));
        let text = std::fs::read_to_string(dir.path().join(outcome)).unwrap();
        serde_json::from_str::<serde_json::Value>(&text).unwrap()
    };
    let outcome = test(&["a.jsonl", "b.jsonl"], "both.json");
    let state = |account: &str| &outcome["keys"][account]["state"];
    assert_eq!(state("1")["applied"], serde_json::json!([1, 2, 3, 4, 5, 6]), "{outcome}");
    assert_eq!(state("2")["applied"], serde_json::json!([1, 2, 3]), "{outcome}");
    assert_eq!((&state("1")["balance"], &state("2")["balance"]), (&serde_json::json!(21), &serde_json::json!(6)));
    assert_eq!(outcome["counters"]["entries"], serde_json::json!(9), "{outcome}");
    assert!(outcome["counters"].get("out_of_order").is_none(), "applied out of event-time order: {outcome}");

    // One file is one topic, applied in its order.
    let outcome = test(&["a.jsonl"], "one.json");
    assert_eq!(outcome["keys"]["1"]["state"]["applied"], serde_json::json!([3, 4, 6]), "{outcome}");
}

/// `waku demo inventory`, small: 13 topics with one read late at start-up,
/// history then live traffic, no violation, and the read model equal to
/// the oracle's (each product's events sorted by event time).
#[test]
fn the_inventory_demo_ends_with_no_violation_and_the_oracle_matching() {
    let dir = tempfile::tempdir().unwrap();
    let module = inventory_wasm().to_str().unwrap().to_owned();
    let args = ["demo", "inventory", "--module", &module, "--history", "3000", "--products", "50"];
    let more = ["--live-secs", "1.5", "--live-rate", "300", "--late-start-secs", "1"];
    let output = waku(&[&args[..], &more[..]].concat(), dir.path());
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stdout}\n{stderr}");
    for line in
        ["order violations: 0", "oracle check: match (50 products", "start-up race: reads of topic `adjustments`"]
    {
        assert!(stdout.contains(line), "no `{line}` in:\n{stdout}");
    }
    let latency = stdout.lines().find(|line| line.starts_with("release latency (live")).unwrap_or_default();
    assert!(latency.contains("p50 ") && !latency.contains("p50 -"), "no live release measured: {stdout}");
}

/// SIGKILL while an input is paused for alignment: `b` is all ahead of
/// `a` in event time, so it is held until the bound (1 MiB) pauses it, and
/// `a` is read alone; killed then (and a run to the end after), every
/// entry is applied once, each key in event-time order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_host_while_inputs_are_paused_for_alignment_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let module = probe(dir.path());
    let (keys, per_key) = (200u64, 320u64);
    let entries: Vec<(&str, Entry)> = (1..=per_key)
        .flat_map(|seq| (0..keys).map(move |key| (key, seq)))
        .map(|(key, seq)| {
            let topic = if seq <= per_key / 2 { "a" } else { "b" };
            (topic, Entry { key, seq, amount: (key + seq) as i64 % 50, event_time: BASE_MS + seq as i64 * 1000 })
        })
        .collect();
    publish(dir.path(), &module, &entries).await;
    let mut args = run_args();
    let batch = args.iter().position(|&arg| arg == "--batch-size").unwrap() + 1;
    args[batch] = "64";
    args.extend(["--max-held-mib", "1"]);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut killed_paused = 0;
    for trial in 0..3 {
        let mut child = waku_command(dir.path())
            .args(&args)
            .env("RUST_LOG", "wakuwaku::engine::consumer::timing=info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("waku starts");
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let mut paused = false;
        while std::io::BufRead::read_line(&mut stderr, &mut line).unwrap_or(0) > 0 {
            if line.contains("input `b` partition") && line.contains("paused") {
                paused = true;
                break;
            }
            line.clear();
        }
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        std::thread::sleep(Duration::from_millis(rng.random_range(0..150)));
        match child.try_wait().unwrap() {
            Some(status) => assert!(status.success(), "trial {trial}: waku failed on its own"),
            None => {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                killed_paused += u64::from(paused);
            }
        }
    }
    assert!(killed_paused > 0, "no run was killed while `b` was paused");
    let last = waku(&args, dir.path());
    assert!(last.status.success(), "{}", text(&last.stderr));
    let found = outcome(dir.path(), &module, keys);
    assert_eq!(found.out_of_order, None, "a key saw its entries out of event-time order");
    assert_eq!(found.applied_entries, (keys * per_key) as i128, "not exactly once");
    assert_eq!(found.balances, oracle_balances(&entries));
}

/// Event times at the ends of `i64`, in the year 9999 and two hours ahead
/// of the log, on one key (99) among other keys' entries over both topics:
/// the three too far ahead of the time the log appended them are
/// dead-lettered, each with a reason naming its event time, its append
/// time, the bound and the setting; the run ends; key 99's others (from
/// `i64::MIN` on) and every other key are applied in event-time order with
/// no late event. A later run over newer entries, with one more far ahead
/// among them, finds the clock where the ordinary events left it: nothing
/// late, nothing out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_times_far_ahead_of_the_log_are_dead_lettered_and_freeze_or_reorder_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let module = probe(dir.path());
    let (keys, per_key) = (6, 10);
    let entries = workload(keys, per_key, 44, false);
    let extreme = [
        ("a", Entry { key: 99, seq: 1, amount: 1, event_time: i64::MIN }),
        ("b", Entry { key: 99, seq: 2, amount: 2, event_time: -5 }),
        ("a", Entry { key: 99, seq: 3, amount: 4, event_time: 0 }),
        ("b", Entry { key: 99, seq: 4, amount: 8, event_time: i64::MAX }),
        ("a", Entry { key: 99, seq: 5, amount: 16, event_time: YEAR_9999_MS }),
        ("b", Entry { key: 99, seq: 6, amount: 32, event_time: now_ms() + 2 * 3_600_000 }),
    ];
    // Key 99's entries first: its admitted ones are the earliest times.
    publish(dir.path(), &module, &extreme).await;
    publish(dir.path(), &module, &entries).await;

    let run = waku_within(&run_args(), dir.path(), MUST_END_WITHIN).expect("the run ends");
    let stderr = text(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(!stderr.contains("late event"), "{stderr}");
    let refused: Vec<&str> = stderr.lines().filter(|line| line.contains("an event time too far ahead")).collect();
    assert_eq!(refused.len(), 3, "{stderr}");
    let largest = refused.iter().find(|line| line.contains("event time 9223372036854775807 ms")).expect("i64::MAX");
    assert!(
        largest.contains("ahead of the time the log appended it")
            && largest.contains("over the bound of 1h")
            && largest.contains("--max-event-time-ahead")
            && largest.contains("WAKU_MAX_EVENT_TIME_AHEAD"),
        "{largest}"
    );
    let store = StateStore::open(&dir.path().join("data/projections/ledger.redb")).unwrap();
    assert_eq!(store.stats().unwrap()[Stat::DeadLettered], 3);
    drop(store);
    let found = outcome_of(dir.path(), &module, (0..keys).chain([99]), "ledger");
    assert_eq!(found.out_of_order, None, "a key saw its entries out of event-time order");
    assert_eq!((found.violations, found.applied_entries), (0, (keys * per_key + 3) as i128));
    let mut expected = oracle_balances(&entries);
    expected.insert(99, 1 + 2 + 4);
    assert_eq!((found.balances, found.last_seq[&99]), (expected, 3));

    // Later entries, one of key 99 far ahead among them.
    let later: Vec<(&str, Entry)> = (0..keys)
        .map(|key| ("b", Entry { key, seq: per_key + 1, amount: 1, event_time: BASE_MS + 60_000 + key as i64 }))
        .chain([("a", Entry { key: 99, seq: 7, amount: 64, event_time: YEAR_9999_MS })])
        .chain((0..keys).map(|key| ("a", Entry { key, seq: per_key + 2, amount: 1, event_time: BASE_MS + 61_000 })))
        .collect();
    publish(dir.path(), &module, &later).await;
    let run = waku_within(&run_args(), dir.path(), MUST_END_WITHIN).expect("the second run ends");
    let stderr = text(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(!stderr.contains("late event"), "{stderr}");
    let found = outcome_of(dir.path(), &module, (0..keys).chain([99]), "ledger");
    assert_eq!((found.out_of_order, found.violations), (None, 0));
    assert_eq!(found.applied_entries, (keys * (per_key + 2) + 3) as i128);
    assert!((0..keys).all(|key| found.last_seq[&key] == per_key + 2), "{:?}", found.last_seq);
}

/// `waku test` with two files whose timed entries are stamped at the ends
/// of `i64`, at 0, before the epoch, in the year 9999 and two hours ahead:
/// it ends, applies what is not too far ahead in event-time order across
/// the files, and the other key's entries are all applied in order.
#[test]
fn waku_test_with_extreme_event_times_over_several_files_ends() {
    let dir = tempfile::tempdir().unwrap();
    let probe = probe_wasm().display().to_string();
    let ahead = now_ms() + 2 * 3_600_000;
    let a = [(1, 1, i64::MIN), (2, 1, BASE_MS + 1), (1, 3, 0), (2, 3, BASE_MS + 3), (1, 5, i64::MAX)];
    let b = [(1, 2, -5), (2, 2, BASE_MS + 2), (1, 4, YEAR_9999_MS), (2, 4, BASE_MS + 4), (1, 6, ahead)];
    let lines = |entries: &[(u64, u64, i64)]| -> String {
        entries.iter().map(|&(key, seq, at)| timed_line(key, seq, Some(at))).collect::<Vec<_>>().join("\n")
    };
    std::fs::write(dir.path().join("a.jsonl"), lines(&a)).unwrap();
    std::fs::write(dir.path().join("b.jsonl"), lines(&b)).unwrap();
    let args = ["test", &probe, "a.jsonl", "b.jsonl", "--expect", "expected.json", "--update"];
    let out = waku_within(&args, dir.path(), MUST_END_WITHIN).expect("waku test ends");
    let outcome: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("expected.json")).unwrap()).unwrap();
    assert!(outcome["counters"].get("out_of_order").is_none(), "applied out of event-time order: {outcome}");
    assert_eq!(outcome["counters"]["ledger"], serde_json::json!(7), "{outcome}{}", text(&out.stderr));
    let state =
        |key: &str| (outcome["keys"][key]["state"]["seq"].clone(), outcome["keys"][key]["state"]["balance"].clone());
    assert_eq!(state("1"), (serde_json::json!(3), serde_json::json!(6)), "{outcome}");
    assert_eq!(state("2"), (serde_json::json!(4), serde_json::json!(10)), "{outcome}");
}

/// With `--allowed-lateness 2s`, a live entry read after one of a later
/// event time (key 3: seq 12 is read, then seq 11, a second earlier) is
/// applied in its place once the log's evidence passes both, and the live
/// read model equals a second projection's that reads the same log from
/// offset 0 (a replay). An entry later than the allowance is applied at
/// once and counted as late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_within_the_allowed_lateness_is_applied_in_its_place_live_as_in_a_replay() {
    let dir = tempfile::tempdir().unwrap();
    let module = probe(dir.path());
    let entries = workload(4, 10, 9, false);
    publish(dir.path(), &module, &entries).await;
    let allowing = |projection: &'static str| {
        let mut args = run_args();
        args[4] = projection;
        args.extend(["--allowed-lateness", "2s"]);
        args
    };
    let run = |projection| {
        let run = waku_within(&allowing(projection), dir.path(), MUST_END_WITHIN).expect("the run ends");
        let stderr = text(&run.stderr);
        assert!(run.status.success(), "{stderr}");
        stderr
    };
    run("ledger");
    for (topic, entry) in [
        ("a", Entry { key: 3, seq: 12, amount: 7, event_time: BASE_MS + 12_000 }),
        ("b", Entry { key: 3, seq: 11, amount: 5, event_time: BASE_MS + 11_000 }),
        ("a", Entry { key: 3, seq: 13, amount: 3, event_time: BASE_MS + 15_000 }),
    ] {
        publish(dir.path(), &module, &[(topic, entry)]).await;
        let stderr = run("ledger");
        assert!(!stderr.contains("late event"), "{stderr}");
    }
    // Keys 1 and 2 share the other partition index, which read nothing
    // new: its last 2 s of entries (seq 9 and 10) wait for evidence, and
    // the run still ended (settled).
    let live = outcome_of(dir.path(), &module, 0..4, "ledger");
    assert_eq!((live.out_of_order, live.violations, live.applied_entries), (None, 0, 38), "{live:?}");
    assert_eq!(live.last_seq[&3], 12, "13 waits for evidence 2 s past it");
    assert_eq!((live.last_seq[&1], live.last_seq[&2]), (8, 8), "{live:?}");
    run("replay");
    assert_eq!(outcome_of(dir.path(), &module, 0..4, "replay"), live, "live and replay differ");

    // 10 s of event time behind the clock's evidence: past the allowance.
    publish(dir.path(), &module, &[("b", Entry { key: 2, seq: 11, amount: 1, event_time: BASE_MS + 5_000 })]).await;
    let stderr = run("ledger");
    assert!(stderr.contains("late event of key 2"), "{stderr}");
    let found = outcome_of(dir.path(), &module, 0..4, "ledger");
    assert_eq!((found.violations, found.applied_entries), (1, 39));
}
