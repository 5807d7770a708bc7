//! Held events across a restart of the real host (issue 44, items 1 and
//! 2): whatever changes between two runs, no held event is lost and no
//! released one is applied again.
//!
//! A projection over topics `a` and `b` holds events in its release stage:
//! `b` is all ahead of `a` in event time, so its entries wait for `a`'s
//! (and `b` is paused at `--max-held-mib 1`). The host is stopped there
//! (SIGKILL, or SIGTERM as an operator stops it), the store is checked to
//! list held events of `b`, and the next run changes what would decide
//! their timing now: a module version whose `TimedLedger` declares no event
//! time (adopted, hot-reloaded, or rolled back to; the probe built with
//! `untimed-ledger`), `--untimed-topic b`, another `--max-held-mib`, a
//! topic added or removed. Every key's ledger is then checked against the
//! oracle: every entry applied once. The rule checked is the release
//! stage's (`core/src/release.rs`, "Crash safety"): a held event's timing
//! is decided once, when it is held.

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use wakuwaku::authoring::publish::headers_for;
use wakuwaku::event::{EventTypeTag, partition_for};
use wakuwaku::sandbox::handler::HandlerModule;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku::storage::state::StateStore;

use crate::common::{probe_untimed_ledger_wasm, probe_wasm, stderr_lines, text, wait_for_line, waku, waku_command};
use crate::event_time::{BASE_MS, Entry, PARTITIONS, oracle_balances, outcome, probe, publish, workload};

/// Keys and entries per key of the held workload: enough that `b` passes
/// 1 MiB held per partition while `a` is still read.
const KEYS: u64 = 120;
const PER_KEY: u64 = 200;

/// How the first run is stopped.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// SIGKILL: nothing more is committed.
    Kill,
    /// SIGTERM: the batch in flight is committed, then it exits.
    Term,
}

/// The held workload: each key's entries `1..=PER_KEY/2` in `a`, the rest
/// in `b`, all of one `seq` at one event time.
fn held_entries(keys: u64) -> Vec<(&'static str, Entry)> {
    (1..=PER_KEY)
        .flat_map(|seq| (0..keys).map(move |key| (key, seq)))
        .map(|(key, seq)| {
            let topic = if seq <= PER_KEY / 2 { "a" } else { "b" };
            (topic, Entry { key, seq, amount: (key * 7 + seq) as i64 % 50, event_time: BASE_MS + seq as i64 * 1000 })
        })
        .collect()
}

/// A projection directory (the probe in its module directory) with the
/// held workload published.
async fn held_workload(keys: u64) -> (tempfile::TempDir, Arc<dyn HandlerModule>, Vec<(&'static str, Entry)>) {
    let dir = tempfile::tempdir().unwrap();
    let module = probe(dir.path());
    let entries = held_entries(keys);
    publish(dir.path(), &module, &entries).await;
    (dir, module, entries)
}

/// `waku run` of projection `ledger` over `topics` until caught up, with
/// `extra` flags.
fn run_args(topics: &[&str], extra: &[&str]) -> Vec<String> {
    let mut args = vec!["run", "--data", "data", "--projection", "ledger"];
    for topic in topics {
        args.extend(["--topic", topic]);
    }
    args.extend(["--modules", "modules", "--until-caught-up", "--batch-size", "64", "--create-emit-topics", "1"]);
    args.extend(extra);
    args.into_iter().map(str::to_owned).collect()
}

/// Starts `waku` with `args`, its standard error as lines: the event-time
/// stage's and the hot reload's at info.
fn start(dir: &Path, args: &[String]) -> (Child, Receiver<String>) {
    let mut child = waku_command(dir)
        .args(args)
        .env("RUST_LOG", "warn,wakuwaku::engine::consumer::timing=info,waku::reload=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("waku starts");
    let lines = stderr_lines(&mut child);
    (child, lines)
}

/// Stops `child` as `stop` says; it must still be running.
fn stop_it(mut child: Child, stop: Stop, seen: &[String]) {
    assert!(child.try_wait().unwrap().is_none(), "waku ended before it was stopped: {seen:#?}");
    match stop {
        Stop::Kill => child.kill().unwrap(),
        Stop::Term => {
            let kill = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
            assert!(kill.success());
        }
    }
    let status = child.wait().unwrap();
    if let Stop::Term = stop {
        assert!(status.success(), "a clean stop exits 0: {status:?}, {seen:#?}");
    }
}

/// Runs the projection over `a` and `b` until `b` is paused (its events
/// held), then `while_held` (which may change things and wait for lines),
/// then stops it as `stop` says. The store must then list held events of
/// `b`: what the next run must neither lose nor repeat.
fn hold_then_stop(
    dir: &Path,
    stop: Stop,
    extra: &[&str],
    while_held: impl FnOnce(&Receiver<String>, &mut Vec<String>),
) {
    let (child, lines) = start(dir, &run_args(&["a", "b"], &[&["--max-held-mib", "1"], extra].concat()));
    let mut seen = Vec::new();
    wait_for_line(&lines, &mut seen, |line| line.contains("input `b` partition") && line.contains("paused"));
    while_held(&lines, &mut seen);
    stop_it(child, stop, &seen);
    assert!(held_events(dir, "b") > 0, "no event of `b` held when the host stopped ({stop:?})");
}

/// How many events of `topic` the store lists as held, over every
/// partition.
fn held_events(dir: &Path, topic: &str) -> u64 {
    let store = StateStore::open(&dir.join("data/projections/ledger.redb")).unwrap();
    let positions = store.positions().unwrap();
    let mark = |name: String, partition: u32| {
        positions.iter().find(|(at, p, _)| *at == name && *p == partition).map(|(_, _, value)| *value)
    };
    let mut held = 0;
    for partition in 0..PARTITIONS {
        let runs = mark(format!("release:held-runs:{topic}"), partition).unwrap_or(0);
        for run in 0..runs {
            let start = mark(format!("release:held-start:{topic}:{run}"), partition).unwrap();
            let end = mark(format!("release:held-end:{topic}:{run}"), partition).unwrap();
            held += end - start;
        }
    }
    held
}

/// Runs `args` to the end; it must succeed. Returns its standard error.
fn run_to_end(dir: &Path, args: &[String]) -> String {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = waku(&args, dir);
    let stderr = text(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    stderr
}

/// Every entry of `entries` applied exactly once: the count, each key's
/// balance and its last `seq`.
fn assert_exact(dir: &Path, module: &Arc<dyn HandlerModule>, entries: &[(&str, Entry)], keys: u64, what: &str) {
    let found = outcome(dir, module, keys);
    assert_eq!(found.applied_entries, entries.len() as i128, "{what}: not every entry applied exactly once");
    assert_eq!(found.balances, oracle_balances(entries), "{what}: a key's balance");
    let mut last = std::collections::HashMap::new();
    for (_, entry) in entries {
        let seq = last.entry(entry.key).or_insert(0);
        *seq = entry.seq.max(*seq);
    }
    for (key, seq) in found.last_seq {
        assert!(seq <= last[&key], "{what}: key {key} ended at seq {seq}");
    }
}

/// Puts the probe built with `untimed-ledger` into the module directory.
fn put_untimed_version(dir: &Path) {
    std::fs::copy(probe_untimed_ledger_wasm(), dir.join("modules/probe.wasm")).unwrap();
}

/// Issue 44.1: held, stopped, and restarted with an adopted version whose
/// `TimedLedger` is untimed (`--adopt-modules`): the held entries are held
/// again under the time they carry and applied once, after a SIGKILL as
/// after a clean stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_events_survive_a_restart_on_an_adopted_version_whose_type_is_untimed() {
    for stop in [Stop::Kill, Stop::Term] {
        let (dir, module, entries) = held_workload(KEYS).await;
        hold_then_stop(dir.path(), stop, &[], |_, _| {});
        put_untimed_version(dir.path());
        let stderr = run_to_end(dir.path(), &run_args(&["a", "b"], &["--adopt-modules"]));
        assert!(stderr.contains("module `probe`: ") && stderr.contains(" → "), "the untimed version adopted: {stderr}");
        assert_exact(dir.path(), &module, &entries, KEYS, &format!("adopted untimed version after {stop:?}"));
    }
}

/// Issue 44.1: a hot reload to the untimed version while events are held,
/// then a SIGKILL: the restart runs the untimed version (the recorded one),
/// and the held entries are applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_events_survive_a_hot_reload_to_an_untimed_version_and_a_kill() {
    // Five times the keys: `b` stays held while the new version compiles
    // (over a second) and is swapped in.
    let (dir, module, entries) = held_workload(5 * KEYS).await;
    // Built before the host starts: a first build takes longer than the
    // wait for the swap.
    probe_untimed_ledger_wasm();
    hold_then_stop(dir.path(), Stop::Kill, &[], |lines, seen| {
        put_untimed_version(dir.path());
        wait_for_line(lines, seen, |line| line.contains("module swapped in"));
        std::thread::sleep(Duration::from_millis(100));
    });
    let stderr = run_to_end(dir.path(), &run_args(&["a", "b"], &[]));
    assert!(!stderr.contains("error"), "{stderr}");
    assert_exact(dir.path(), &module, &entries, 5 * KEYS, "hot reload to the untimed version");
}

/// Issue 44.1: the untimed version ran first (recorded), the timed one was
/// adopted and holds events when it is killed, and `waku modules rollback`
/// goes back to the untimed one: the restart runs it, and the held entries
/// are applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_events_survive_a_rollback_to_an_untimed_version() {
    let dir = tempfile::tempdir().unwrap();
    let module = probe(dir.path());
    put_untimed_version(dir.path());
    {
        let log = EmbeddedLog::open(dir.path().join("data/log.redb")).unwrap();
        for topic in ["a", "b"] {
            log.create_topic(topic, PARTITIONS).await.unwrap();
        }
    }
    run_to_end(dir.path(), &run_args(&["a", "b"], &[]));
    let entries = held_entries(KEYS);
    publish(dir.path(), &module, &entries).await;
    std::fs::copy(probe_wasm(), dir.path().join("modules/probe.wasm")).unwrap();
    hold_then_stop(dir.path(), Stop::Kill, &["--adopt-modules"], |_, _| {});
    let rollback = waku(&["modules", "rollback", "--data", "data", "--projection", "ledger", "probe"], dir.path());
    assert!(rollback.status.success(), "{}{}", text(&rollback.stdout), text(&rollback.stderr));
    let stderr = run_to_end(dir.path(), &run_args(&["a", "b"], &[]));
    assert!(stderr.contains("module `probe`: the directory holds version"), "the rolled-back version runs: {stderr}");
    assert_exact(dir.path(), &module, &entries, KEYS, "rolled back to the untimed version");
}

/// Issue 44.1: the operator's flags change between two runs over held
/// events: `--untimed-topic b` added (its held events keep the time they
/// were held under), and `--max-held-mib` raised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_events_survive_an_untimed_topic_added_and_another_max_held_mib() {
    for (change, flags) in
        [("--untimed-topic b", ["--untimed-topic", "b"]), ("--max-held-mib 64", ["--max-held-mib", "64"])]
    {
        let (dir, module, entries) = held_workload(KEYS).await;
        hold_then_stop(dir.path(), Stop::Kill, &[], |_, _| {});
        run_to_end(dir.path(), &run_args(&["a", "b"], &flags));
        assert_exact(dir.path(), &module, &entries, KEYS, change);
    }
}

/// Issue 44.1: a topic `c` added to the projection between two runs over
/// held events: `c` starts at its beginning, `a` and `b` where they were,
/// and nothing of theirs is applied again (nor lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_events_survive_a_topic_added() {
    let (dir, module, mut entries) = held_workload(KEYS).await;
    hold_then_stop(dir.path(), Stop::Kill, &[], |_, _| {});
    // `c` has one entry per key, after everything else.
    let more: Vec<(&str, Entry)> = (0..KEYS)
        .map(|key| ("c", Entry { key, seq: PER_KEY + 1, amount: 3, event_time: BASE_MS + (PER_KEY as i64 + 1) * 1000 }))
        .collect();
    publish_to(dir.path(), &module, &more).await;
    entries.extend(more);
    run_to_end(dir.path(), &run_args(&["a", "b", "c"], &[]));
    assert_exact(dir.path(), &module, &entries, KEYS, "topic `c` added");
}

/// Appends timed ledger `entries` to their topics (created with
/// [`PARTITIONS`] if missing): [`publish`] for topics other than `a`, `b`.
async fn publish_to(dir: &Path, module: &Arc<dyn HandlerModule>, entries: &[(&str, Entry)]) {
    let log = EmbeddedLog::open(dir.join("data/log.redb")).unwrap();
    let event_type = module.event_types().iter().find(|t| t.tag == crate::event_time::LEDGER).unwrap().clone();
    let mut instance = module.instantiate().unwrap();
    for (topic, entry) in entries {
        if log.partitions(topic).await.is_err() {
            log.create_topic(topic, PARTITIONS).await.unwrap();
        }
        let body = serde_json::to_vec(&serde_json::json!({
            "key": entry.key, "seq": entry.seq, "amount": entry.amount, "fail": null, "ordering": "relaxed",
            "at": entry.event_time
        }))
        .unwrap();
        let headers = headers_for(&mut *instance, &event_type, &body).unwrap();
        let partition = partition_for(headers.key.key_hash(), PARTITIONS);
        log.append(topic, vec![(partition, vec![Record { headers: headers.to_headers(), body }])]).await.unwrap();
    }
}

/// Issue 44.1, a topic removed: `b` holds events when the host stops, and
/// the next run names only `a`. Its held events would never be applied, so
/// the run is refused, naming the topic, the partition and the held
/// events, and nothing is applied; run once more with `b` until caught up
/// (which releases everything held), then without it, and every entry is
/// applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_removed_while_it_holds_events_is_refused_until_they_are_applied() {
    let (dir, module, entries) = held_workload(KEYS).await;
    hold_then_stop(dir.path(), Stop::Kill, &[], |_, _| {});
    let before = outcome(dir.path(), &module, KEYS).applied_entries;
    let args: Vec<String> = run_args(&["a"], &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let refused = waku(&args, dir.path());
    let stderr = text(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("waku: error:") && stderr.contains("topic `b` partition") && stderr.contains("held"),
        "{stderr}"
    );
    assert!(stderr.contains("--topic b") && stderr.contains("until caught up"), "says what to do: {stderr}");
    assert_eq!(outcome(dir.path(), &module, KEYS).applied_entries, before, "the refused run applied nothing");

    run_to_end(dir.path(), &run_args(&["a", "b"], &[]));
    assert_eq!(held_events(dir.path(), "b"), 0);
    run_to_end(dir.path(), &run_args(&["a"], &[]));
    assert_exact(dir.path(), &module, &entries, KEYS, "topic `b` removed after it held nothing");
}

/// A projection over `a` and `b` cut to `b`
/// alone (a one-topic projection, which reads without the release stage)
/// while `b` holds events and has released later ones (its event times
/// rise per key only, so some are released around a held one). The
/// one-topic run resumes at `b`'s committed position, the lowest held
/// offset: it applies the held events, and skips the released ones above
/// them, which it would otherwise apply a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projection_cut_to_one_topic_applies_no_released_event_again() {
    let dir = tempfile::tempdir().unwrap();
    let module = probe(dir.path());
    // `a`: each key's first two entries; `b`: the rest, several producers'
    // worth of jitter within each second.
    let (keys, per_key) = (100, 240);
    let entries: Vec<(&str, Entry)> = workload(keys, per_key, 44, true)
        .into_iter()
        .map(|(_, entry)| (if entry.seq <= 2 { "a" } else { "b" }, entry))
        .collect();
    publish(dir.path(), &module, &entries).await;
    let gap = || held_events(dir.path(), "a") == 0 && released_above_held(dir.path(), "b");
    assert!(kill_until(dir.path(), gap), "no stop left `b` with released events above a held one, and `a` none held");
    run_to_end(dir.path(), &run_args(&["b"], &[]));
    assert_exact(dir.path(), &module, &entries, keys, "cut to topic `b`");
}

/// Runs the projection over `a` and `b` and SIGKILLs it a little later
/// each time (from 300 ms after its partitions start), until `stopped_as`
/// accepts what the store holds then; at most five times. Says whether it
/// did.
fn kill_until(dir: &Path, stopped_as: impl Fn() -> bool) -> bool {
    for attempt in 0..5u64 {
        let (child, lines) = start(dir, &run_args(&["a", "b"], &[]));
        let mut seen = Vec::new();
        wait_for_line(&lines, &mut seen, |line| line.contains("reads 2 topics in event-time order"));
        std::thread::sleep(Duration::from_millis(300 + 200 * attempt));
        stop_it(child, Stop::Kill, &seen);
        if stopped_as() {
            return true;
        }
    }
    false
}

/// Whether some partition of `topic` has events below its `read_to` mark
/// and above its committed position that it does not hold: released ones
/// a restart must skip.
fn released_above_held(dir: &Path, topic: &str) -> bool {
    let store = StateStore::open(&dir.join("data/projections/ledger.redb")).unwrap();
    (0..PARTITIONS).any(|partition| {
        let commit = store.position(topic, partition).unwrap().unwrap_or(0);
        let read_to = store.position(&format!("release:read-to:{topic}"), partition).unwrap().unwrap_or(0);
        let runs = store.position(&format!("release:held-runs:{topic}"), partition).unwrap().unwrap_or(0);
        let held: u64 = (0..runs)
            .map(|run| {
                let at = |what: &str| store.position(&format!("release:held-{what}:{topic}:{run}"), partition);
                at("end").unwrap().unwrap() - at("start").unwrap().unwrap()
            })
            .sum();
        read_to > commit + held
    })
}

/// The probe's `Ordered` (tag 52), timed in both versions: product 7's.
const ORDERED: EventTypeTag = EventTypeTag::new(52);

/// Issue 44.2, the mirror case: a type that starts declaring event time.
/// The untimed version runs first while producers already write the
/// event-time header on every ledger entry; `b` starts with an `Ordered`
/// event far ahead in time, which is held (its type is timed), while the
/// ledger entries after it pass at once. Killed there, then restarted on
/// the adopted timed version: the entries released before are not held and
/// applied again, and the `Ordered` event is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_that_starts_declaring_event_time_applies_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let module = probe(dir.path());
    let (keys, per_key) = (100u64, 240u64);
    let entries: Vec<(&str, Entry)> = workload(keys, per_key, 45, false)
        .into_iter()
        .map(|(_, entry)| (if entry.seq <= per_key / 2 { "a" } else { "b" }, entry))
        .collect();
    {
        let log = EmbeddedLog::open(dir.path().join("data/log.redb")).unwrap();
        for topic in ["a", "b"] {
            log.create_topic(topic, PARTITIONS).await.unwrap();
        }
        let event_type = module.event_types().iter().find(|t| t.tag == ORDERED).unwrap().clone();
        let body = serde_json::to_vec(&serde_json::json!({ "key": 7, "at": BASE_MS + 86_400_000 })).unwrap();
        let headers = headers_for(&mut *module.instantiate().unwrap(), &event_type, &body).unwrap();
        let partition = partition_for(headers.key.key_hash(), PARTITIONS);
        log.append("b", vec![(partition, vec![Record { headers: headers.to_headers(), body }])]).await.unwrap();
    }
    publish(dir.path(), &module, &entries).await;
    put_untimed_version(dir.path());
    let gap = || held_events(dir.path(), "b") > 0 && released_above_held(dir.path(), "b");
    assert!(kill_until(dir.path(), gap), "no stop left `b` holding its `Ordered` event with entries released after it");
    std::fs::copy(probe_wasm(), dir.path().join("modules/probe.wasm")).unwrap();
    run_to_end(dir.path(), &run_args(&["a", "b"], &["--adopt-modules"]));
    assert_exact(dir.path(), &module, &entries, keys, "the ledger became timed");
    let store = StateStore::open(&dir.path().join("data/projections/ledger.redb")).unwrap();
    let seen = store.get(&wakuwaku::key::Key::int(7u64), "seen").unwrap().expect("product 7's `Ordered` applied");
    let seen: Vec<String> = serde_json::from_slice(&seen).unwrap();
    assert_eq!(seen.len(), 1, "the `Ordered` event applied once: {seen:?}");
}
