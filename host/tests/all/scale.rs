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
use wakuwaku::consumer::stat;
use wakuwaku::demo::{self, Oracle, WorkloadSpec};
use wakuwaku::host::{StateSettings, open_state};
use wakuwaku::log::{EventLog, IggyLog};
use wakuwaku::projection::load_module_file;
use wakuwaku::publish;
use wakuwaku::runtime::{Sandbox, SandboxLimits};

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
            .env("RUST_LOG", "warn,wakuwaku::consumer=info")
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
    let stats: std::collections::HashMap<_, _> = store.stats().unwrap().into_iter().collect();
    assert_eq!(stats.get(stat::APPLIED).copied(), Some(published), "every event applied exactly once");
}
