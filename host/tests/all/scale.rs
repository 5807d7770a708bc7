//! Scale-out through the real binary: three `waku run --iggy … --group G
//! --state postgres://…` processes of one projection (each with its own
//! data directory and admin port) while events are published; one is
//! SIGKILLed mid-run and a fourth started later. The read model in
//! PostgreSQL equals the oracle, every event is applied exactly once, and
//! the dead host's partitions were taken by the hosts left.
//!
//! Needs an Iggy server (`WAKU_IGGY_URL`) and a PostgreSQL server
//! (`WAKU_POSTGRES_URL`); without them it prints one `skipped: …` line.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::servers::{fresh_stream, iggy_url, postgres_url};
use crate::common::{bank_wasm, waku_command};
use wakuwaku::authoring::demo::{self, Oracle, WorkloadSpec};
use wakuwaku::authoring::publish;
use wakuwaku::engine::projection::load_module_file;
use wakuwaku::operations::host::{StateSettings, open_state};
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
use wakuwaku::storage::log::{EventLog, IggyLog};
use wakuwaku::storage::stats::Stat;

const PARTITIONS: u32 = 6;
const EVENTS: usize = 3_000;

/// One `waku run` process of the group, its standard error in `log`.
struct Member {
    child: Child,
    log: PathBuf,
}

impl Member {
    fn start(dir: &Path, name: &str, iggy: &str, stream: &str, postgres: &str, projection: &str) -> Self {
        let data = dir.join(name);
        let log = dir.join(format!("{name}.log"));
        let child = waku_command(dir)
            .args(["run", "--data"])
            .arg(&data)
            .args(["--projection", projection, "--topic", "accounts", "--modules", "modules", "--batch-size", "200"])
            .args(["--iggy", iggy, "--stream", stream, "--group", "bank", "--state", postgres])
            .args(["--admin", "127.0.0.1:0"])
            .env("RUST_LOG", "warn,wakuwaku::engine::consumer=info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("waku starts");
        Self { child, log }
    }

    /// Its log so far.
    fn lines(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The partitions it holds now, from its log: taken, and not stopped
    /// or fenced since.
    fn held(&self) -> BTreeSet<u32> {
        held_in(&self.lines())
    }

    /// Stops it with SIGTERM, as an operator does, and waits for its exit;
    /// says whether it exited 0, and its log.
    fn terminate(mut self) -> (bool, String) {
        let kill = std::process::Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(kill.success());
        let status = self.child.wait().unwrap();
        (status.success(), self.lines())
    }

    /// Ends it with SIGKILL: no batch finished, nothing settled.
    fn kill(mut self) -> String {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.lines()
    }
}

impl Drop for Member {
    /// A failed test leaves no host running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The partitions a host's log says it holds at its end.
fn held_in(log: &str) -> BTreeSet<u32> {
    let mut held = BTreeSet::new();
    for line in log.lines() {
        let number = |after: &str| line.split(after).nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok();
        if let Some(partition) = number("took partition ") {
            held.insert(partition);
        } else if (line.contains("unassigned: stopping it") || line.contains("was taken over by another host"))
            && let Some(partition) = number("partition ")
        {
            held.remove(&partition);
        }
    }
    held
}

/// The events a host's log says it redid: batches whose commit fencing
/// refused (`… its last batch (N events) was not committed …`).
fn redone_in(log: &str) -> u64 {
    log.lines().filter_map(|line| line.split("its last batch (").nth(1)?.split(' ').next()?.parse::<u64>().ok()).sum()
}

/// Whether the hosts' partitions, together, are every partition once.
fn held_once(held: &[BTreeSet<u32>]) -> bool {
    let all: Vec<u32> = held.iter().flatten().copied().collect();
    all.len() == PARTITIONS as usize && all.iter().copied().collect::<BTreeSet<_>>().len() == all.len()
}

/// Waits (a guard against a hang, not a speed target) until `done`.
fn wait_until(what: &str, members: &[&Member], mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while !done() {
        if Instant::now() > deadline {
            let logs: Vec<String> = members.iter().map(|m| m.lines()).collect();
            panic!("timed out waiting until {what}; logs:\n{}", logs.join("\n----\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn three_waku_processes_in_a_group_survive_one_sigkilled_and_a_late_one_joins() {
    let Some(iggy) = iggy_url("three `waku run` processes in a consumer group") else { return };
    let Some(postgres) = postgres_url("three `waku run` processes in a consumer group") else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("modules")).unwrap();
    std::fs::copy(bank_wasm(), dir.path().join("modules/bank.wasm")).unwrap();
    let stream = fresh_stream("scale-process");
    let projection = stream.replace('-', "_");

    let sandbox = Sandbox::new(SandboxLimits::default()).unwrap();
    let module = load_module_file(&sandbox, bank_wasm()).unwrap();
    let log = runtime.block_on(IggyLog::connect(&iggy, &stream)).unwrap();
    runtime.block_on(log.create_topic("accounts", PARTITIONS)).unwrap();
    let mut oracle = Oracle::default();
    let mut published = 0;
    let mut publish_more = |seed| {
        let (events, _) = demo::workload(WorkloadSpec { events: EVENTS, accounts: 90, seed });
        events.iter().for_each(|event| oracle.apply(event));
        let outgoing = demo::outgoing(&*module, &events).expect("the bank module");
        runtime.block_on(publish::publish(&log, "accounts", module.clone(), outgoing, None, 2)).unwrap();
        published += EVENTS as u64;
    };
    publish_more(61);

    let member = |name| Member::start(dir.path(), name, &iggy, &stream, &postgres, &projection);
    let (a, b, c) = (member("a"), member("b"), member("c"));
    wait_until("the three share out all six partitions", &[&a, &b, &c], || {
        let held = [a.held(), b.held(), c.held()];
        held_once(&held) && held.iter().all(|h| !h.is_empty())
    });

    // More events arrive; B is SIGKILLed while the hosts consume them.
    publish_more(62);
    let b_held = b.held();
    let b_log = b.kill();
    let (a_before, c_before) = (a.lines().len(), c.lines().len());
    wait_until("A and C took B's partitions", &[&a, &c], || {
        let taken_since: BTreeSet<u32> =
            [(&a, a_before), (&c, c_before)].iter().flat_map(|(m, before)| held_in(&m.lines()[*before..])).collect();
        b_held.is_subset(&taken_since)
    });

    // A fourth host joins later and is given a share.
    let d = member("d");
    publish_more(63);
    wait_until("D holds partitions", &[&a, &c, &d], || !d.held().is_empty());

    let store = open_state(dir.path(), &StateSettings::Postgres { url: postgres.clone() }, &projection).unwrap();
    let ends = runtime.block_on(log.end_offsets("accounts")).unwrap();
    wait_until("every partition consumed to its end", &[&a, &c, &d], || {
        (0..PARTITIONS).all(|p| store.position("accounts", p).unwrap() == Some(ends[p as usize]))
    });
    wait_until("the live hosts hold every partition once", &[&a, &c, &d], || {
        held_once(&[a.held(), c.held(), d.held()])
    });
    assert!(b_log.contains("took partition"), "B held partitions before it was killed:\n{b_log}");
    for m in [a, c, d] {
        m.kill();
    }

    let check = demo::check_projection(&oracle, &*module, &store).unwrap();
    assert!(check.matches(), "{}", check.report(10));
    let stats = store.stats().unwrap();
    assert_eq!(stats[Stat::Applied], published, "every event applied exactly once");
}

/// Three `waku run --group` processes while events keep arriving: C joins
/// late, B is stopped with SIGTERM, A is SIGKILLed. The planned join and
/// the graceful leave redo nothing (no host's commit is refused by
/// fencing), B exits 0 and its partitions are taken by the others, A's by
/// C; the read model equals the oracle and every event is applied exactly
/// once. Handover and failover times are printed, not asserted (the
/// figures are in BENCHMARKS.md).
#[test]
fn waku_processes_join_late_leave_on_sigterm_and_die_on_sigkill_redoing_only_the_dead_ones_batch() {
    let Some(iggy) = iggy_url("`waku run` processes joining and leaving a group") else { return };
    let Some(postgres) = postgres_url("`waku run` processes joining and leaving a group") else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("modules")).unwrap();
    std::fs::copy(bank_wasm(), dir.path().join("modules/bank.wasm")).unwrap();
    let stream = fresh_stream("moves-process");
    let projection = stream.replace('-', "_");
    let sandbox = Sandbox::new(SandboxLimits::default()).unwrap();
    let module = load_module_file(&sandbox, bank_wasm()).unwrap();
    let log = std::sync::Arc::new(runtime.block_on(IggyLog::connect(&iggy, &stream)).unwrap());
    runtime.block_on(log.create_topic("accounts", PARTITIONS)).unwrap();
    let mut oracle = Oracle::default();
    let mut published = 0;
    // Published in the background, so the hosts are busy while they move.
    let mut publish_more = |seed| {
        let (events, _) = demo::workload(WorkloadSpec { events: 2 * EVENTS, accounts: 90, seed });
        events.iter().for_each(|event| oracle.apply(event));
        let outgoing = demo::outgoing(&*module, &events).expect("the bank module");
        published += events.len() as u64;
        let (log, module) = (log.clone(), module.clone());
        runtime.spawn(async move { publish::publish(&*log, "accounts", module, outgoing, None, 2).await.unwrap() })
    };
    runtime.block_on(publish_more(81)).unwrap();
    let member = |name| Member::start(dir.path(), name, &iggy, &stream, &postgres, &projection);
    let (a, b) = (member("a"), member("b"));
    wait_until("A and B share out all six partitions", &[&a, &b], || {
        held_once(&[a.held(), b.held()]) && !a.held().is_empty() && !b.held().is_empty()
    });

    // C joins while events arrive.
    let more = publish_more(82);
    let c = member("c");
    wait_until("C holds a share", &[&a, &b, &c], || !c.held().is_empty() && held_once(&[a.held(), b.held(), c.held()]));
    runtime.block_on(more).unwrap();
    let redone = |members: &[&Member]| members.iter().map(|m| redone_in(&m.lines())).collect::<Vec<_>>();
    assert_eq!(redone(&[&a, &b, &c]), [0, 0, 0], "a planned join redid events");

    // B is stopped with SIGTERM while events arrive.
    let more = publish_more(83);
    let b_held = b.held();
    let (a_before, c_before) = (a.lines().len(), c.lines().len());
    let terminating = Instant::now();
    let (exited_0, b_log) = b.terminate();
    let exited = terminating.elapsed();
    assert!(exited_0, "B exits 0 on SIGTERM:\n{b_log}");
    wait_until("A and C took B's partitions", &[&a, &c], || {
        let taken: BTreeSet<u32> =
            [(&a, a_before), (&c, c_before)].iter().flat_map(|(m, before)| held_in(&m.lines()[*before..])).collect();
        b_held.is_subset(&taken)
    });
    let handover = terminating.elapsed();
    runtime.block_on(more).unwrap();
    assert_eq!(redone_in(&b_log), 0, "B redid events:\n{b_log}");
    assert_eq!(redone(&[&a, &c]), [0, 0], "a graceful leave redid events");
    eprintln!("SIGTERM of B ({b_held:?}): exited after {exited:?}, its partitions taken after {handover:?}");

    // A is SIGKILLed while events arrive: C takes everything.
    let more = publish_more(84);
    let a_held = a.held();
    let c_before = c.lines().len();
    let killing = Instant::now();
    let a_log = a.kill();
    wait_until("C took A's partitions", &[&c], || a_held.is_subset(&held_in(&c.lines()[c_before..])));
    eprintln!("SIGKILL of A ({a_held:?}): its partitions taken after {:?}", killing.elapsed());
    runtime.block_on(more).unwrap();

    let store = open_state(dir.path(), &StateSettings::Postgres { url: postgres.clone() }, &projection).unwrap();
    let ends = runtime.block_on(log.end_offsets("accounts")).unwrap();
    wait_until("every partition consumed to its end", &[&c], || {
        (0..PARTITIONS).all(|p| store.position("accounts", p).unwrap() == Some(ends[p as usize]))
    });
    assert_eq!(redone_in(&a_log), 0, "A redid events before it was killed:\n{a_log}");
    let (_, c_log) = c.terminate();
    assert_eq!(redone_in(&c_log), 0, "C, which only gained partitions, redid events:\n{c_log}");
    let check = demo::check_projection(&oracle, &*module, &store).unwrap();
    assert!(check.matches(), "{}", check.report(10));
    let stats = store.stats().unwrap();
    assert_eq!(stats[Stat::Applied], published, "every event applied exactly once");
}
