//! Shared harness for wakuwaku's end-to-end tests and benchmarks.
//!
//! - [`guest_wasm`] builds a guest crate (the bank example, the probe
//!   test module) into a component once per process, into `target/guests`,
//!   apart from the outer build.
//! - [`Recorder`] records every handled run, in order per key.
//! - [`check_call_order`] checks recorded calls against the spec: every
//!   pair of events that `spec/ordering.md` orders was handled in that
//!   order.
//! - [`bank_log`] publishes a seeded bank workload into a fresh embedded
//!   log, [`publish_bank`] into any log.
//! - [`iggy_url`] names the Iggy server tests may use, or says they were
//!   skipped; [`proxy`] cuts connections to it on cue; [`iggy_cluster`]
//!   starts a three-node cluster from `WAKU_IGGY_SERVER` and kills its
//!   nodes on cue.
//! - [`paced`] appends a backlog at a steady rate, for the benchmarks
//!   that follow a log while it grows.
//! - [`native`] runs a guest-SDK module natively inside the host, to compare
//!   with WASM.
//! - [`host_settings`] and [`catch_up`] start a host of loaded modules
//!   and run it until caught up: how most tests consume.
//! - [`json_record`] makes the Relaxed, JSON-bodied messages most tests
//!   publish; [`bank_module`] and [`probe_module`] load the test modules.
//! - [`faulty`] is the embedded log with faults on cue; [`losing`] one
//!   that loses its tail, a topic or its head on cue (both from
//!   `wakuwaku`'s `test-support` feature).
//! - [`flaky`] is a native module that fails on cue, for the retry and
//!   dead-letter tests.
//! - [`liar`] builds hand-written components that break the contract
//!   (garbage return values, bad descriptions, another world).
//! - [`python`] builds and loads the Python bank (`examples/bank-py`) with
//!   componentize-py, or says the test was skipped.
//! - [`typescript`] builds and loads the TypeScript bank (`examples/bank-ts`)
//!   with esbuild and componentize-js, or says it was skipped;
//!   [`ported_bank`] checks a port of the bank against the Rust bank and
//!   the oracle.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use rustc_hash::FxHashMap;
use wakuwaku::authoring::demo::{self, Oracle, WorkloadSpec};
use wakuwaku::authoring::guest_build::GuestBuild;
use wakuwaku::authoring::publish;
use wakuwaku::engine::consumer::{CallObserver, ConsumerConfig, RunCall, Summary};
use wakuwaku::engine::projection::Projection;
use wakuwaku::event::{Algebra, EventAtomicOrdering, EventHeaders, EventTypeTag};
use wakuwaku::key::Key;
use wakuwaku::operations::host::{Host, HostError, HostSettings, ModuleSource};
use wakuwaku::plan::{PlanRecord, must_precede};
use wakuwaku::sandbox::handler::HandlerModule;
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku::storage::state::StateStore;

pub mod click_windows;
pub mod flaky;
pub mod group;
pub mod hostile;
pub mod iggy_cluster;
pub mod liar;
pub mod native;
pub mod paced;
pub mod ported_bank;
pub mod proxy;
pub mod python;
mod servers;
pub mod typescript;

pub use servers::{fresh_stream, iggy_url, oci_registry, postgres_url};
pub use wakuwaku::storage::log::test_support::{faulty, losing};

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_owned()
}

/// Builds the guest crate at `crate_path` (relative to the repository) for
/// wasm32-wasip2, once per process, and returns the component's path.
pub fn guest_wasm(crate_path: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<FxHashMap<String, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
    built
        .entry(crate_path.to_owned())
        .or_insert_with(|| {
            let root = repo_root();
            GuestBuild {
                target_dir: Some(root.join("target").join("guests")),
                quiet: true,
                ..GuestBuild::new(root.join(crate_path))
            }
            .run()
            .unwrap_or_else(|e| panic!("building {crate_path}: {e}"))
        })
        .clone()
}

/// The bank example as a component.
pub fn bank_wasm() -> PathBuf {
    guest_wasm("examples/bank")
}

/// The bank with a withdrawal fee (`tests/guests/bank-fee`), the changed
/// logic the rebuild tests roll out, as a component.
pub fn bank_fee_wasm() -> PathBuf {
    guest_wasm("tests/guests/bank-fee")
}

/// The bank component with a custom section holding `n` appended (for
/// `n > 0`): the same behaviour, another content hash, so another version.
pub fn bank_variant(n: u8) -> Vec<u8> {
    let mut bytes = std::fs::read(bank_wasm()).expect("the bank component");
    if n > 0 {
        let name = b"waku-test-variant";
        bytes.extend([0x00, (1 + name.len() + 1) as u8, name.len() as u8]);
        bytes.extend(name);
        bytes.push(n);
    }
    bytes
}

/// The probe test module (`tests/guests/probe`) as a component.
pub fn probe_wasm() -> PathBuf {
    guest_wasm("tests/guests/probe")
}

/// Loads the bank component into a default sandbox.
pub fn bank_module() -> Arc<dyn HandlerModule> {
    let sandbox = Sandbox::new(SandboxLimits::default()).expect("a default sandbox");
    wakuwaku::engine::projection::load_module_file(&sandbox, &bank_wasm()).expect("the bank module loads")
}

/// The inventory example (`waku demo inventory`) as a component, loaded
/// into a default sandbox.
pub fn inventory_module() -> Arc<dyn HandlerModule> {
    let sandbox = Sandbox::new(SandboxLimits::default()).expect("a default sandbox");
    let wasm = guest_wasm("examples/inventory");
    wakuwaku::engine::projection::load_module_file(&sandbox, &wasm).expect("the inventory module loads")
}

/// Loads the probe component into a default sandbox.
pub fn probe_module() -> Arc<dyn HandlerModule> {
    let sandbox = Sandbox::new(SandboxLimits::default()).expect("a default sandbox");
    wakuwaku::engine::projection::load_module_file(&sandbox, &probe_wasm()).expect("the probe module loads")
}

/// A message of type `tag` for key `key` with a JSON body, Relaxed and
/// non-associative: what most tests publish.
pub fn json_record(tag: EventTypeTag, key: u64, body: serde_json::Value) -> Record {
    let key = Key::int(key);
    let headers = EventHeaders {
        tag,
        key,
        ordering: EventAtomicOrdering::Relaxed,
        algebra: Algebra::NonAssociative,
        event_time: None,
    };
    Record { headers: headers.to_headers(), body: serde_json::to_vec(&body).expect("JSON") }
}

/// Settings for a host of the loaded `modules` as projection `projection`
/// over `topic`, its data (state) in `data`, consuming with `consumer`
/// until caught up. A topic a module declares it emits to is created with
/// one partition if missing, so tests need not create topics they never
/// read.
pub fn host_settings(
    data: &Path,
    projection: &str,
    topic: &str,
    modules: Vec<Arc<dyn HandlerModule>>,
    consumer: ConsumerConfig,
) -> HostSettings {
    let mut settings = HostSettings::new(data, projection, topic, ModuleSource::Loaded(modules));
    settings.consumer = consumer;
    settings.create_emit_topics = Some(1);
    settings.until_caught_up = true;
    settings
}

/// Starts a host on `log` with `settings` (see [`host_settings`]) and
/// waits until it stops; returns what it did and its projection, whose
/// store the test then checks. Starting it again with the same settings
/// (once the projection is dropped) is a restart.
pub async fn catch_up<L: EventLog>(
    log: &Arc<L>,
    settings: HostSettings,
) -> Result<(Summary, Arc<Projection>), HostError> {
    let host = Host::start_on(log.clone(), settings).await?;
    let projection = host.projection().clone();
    Ok((host.finished().await?, projection))
}

/// Records every handled run.
#[derive(Default)]
pub struct Recorder {
    calls: Mutex<Vec<RunCall>>,
}

impl Recorder {
    /// Everything recorded so far, in the order it was reported.
    pub fn calls(&self) -> Vec<RunCall> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl CallObserver for Recorder {
    fn run_handled(&self, call: &RunCall) {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).push(call.clone());
    }
}

/// Checks recorded runs against the spec for every key.
///
/// `log` holds one partition's records in log order as (offset, key,
/// planning headers). Within a key, runs are handled one after another, so the
/// recorded order of a key's runs is a total order; every pair the spec
/// orders must appear in that order (or in one run, in log order, which a
/// run always keeps). Also checks that every record was handled exactly once.
pub fn check_call_order(partition: u32, log: &[(u64, Key, PlanRecord)], calls: &[RunCall]) -> Result<(), String> {
    // Position of every handled offset: (index of its run among its key's
    // runs, index inside the run).
    let mut position: FxHashMap<u64, (usize, usize)> = FxHashMap::default();
    let mut runs_per_key: FxHashMap<&Key, usize> = FxHashMap::default();
    for call in calls.iter().filter(|c| c.partition == partition) {
        let run_index = runs_per_key.entry(&call.key).or_default();
        for (inside, &offset) in call.offsets.iter().enumerate() {
            if position.insert(offset, (*run_index, inside)).is_some() {
                return Err(format!("offset {offset} was handled twice"));
            }
        }
        *run_index += 1;
    }
    if let Some((offset, ..)) = log.iter().find(|(offset, ..)| !position.contains_key(offset)) {
        return Err(format!("offset {offset} was never handled"));
    }
    let mut by_key: FxHashMap<&Key, Vec<(u64, PlanRecord)>> = FxHashMap::default();
    for (offset, key, record) in log {
        by_key.entry(key).or_default().push((*offset, *record));
    }
    for (key, events) in by_key {
        for (i, (earlier_offset, earlier)) in events.iter().enumerate() {
            for (later_offset, later) in &events[i + 1..] {
                if must_precede(earlier, later) && position[earlier_offset] >= position[later_offset] {
                    return Err(format!(
                        "key {key}: offset {earlier_offset} ({:?}, tag {}) must be handled before offset \
                         {later_offset} ({:?}, tag {}) but was not: positions {:?} vs {:?}",
                        earlier.ordering,
                        earlier.tag,
                        later.ordering,
                        later.tag,
                        position[earlier_offset],
                        position[later_offset]
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Reads a whole partition back as keys and planning records (whose `key`
/// is the key's hash: compare keys by the [`Key`]).
pub async fn read_partition(log: &EmbeddedLog, topic: &str, partition: u32) -> Vec<(u64, Key, PlanRecord)> {
    let end = log.end_offset(topic, partition).await.expect("end offset");
    let stored = log.read(topic, partition, 0, end as usize).await.expect("read back");
    stored
        .into_iter()
        .map(|s| {
            let h = EventHeaders::parse_stored(&s.record.headers).expect("headers written by publish parse");
            (s.offset, h.key.clone(), PlanRecord { key: h.key.key_hash(), tag: h.tag, ordering: h.ordering })
        })
        .collect()
}

/// Publishes a seeded bank workload to topic `accounts` of a fresh embedded
/// log at `dir/log.redb`; returns the log and the oracle.
pub async fn bank_log(
    dir: &Path,
    module: Arc<dyn HandlerModule>,
    spec: WorkloadSpec,
    partitions: u32,
) -> (Arc<EmbeddedLog>, Oracle) {
    let log = Arc::new(EmbeddedLog::open(dir.join("log.redb")).expect("open log"));
    let oracle = publish_bank(&*log, module, spec, partitions).await;
    (log, oracle)
}

/// The bank oracle's check of one host's store, which holds every
/// partition of `accounts`.
pub fn check_bank_store(oracle: &Oracle, store: &StateStore) -> demo::OracleCheck {
    let module = bank_module();
    let opened = demo::bank_tag(&*module, demo::event_name::OPENED).unwrap();
    let mut instance = module.instantiate().unwrap();
    let open_accounts =
        store.counters().unwrap().into_iter().find(|(name, _)| name == demo::OPEN_ACCOUNTS).map_or(0, |(_, v)| v);
    demo::check(oracle, open_accounts, |account| -> Result<_, ()> {
        let body = serde_json::to_vec(&serde_json::json!({ "account": account, "owner": "" })).unwrap();
        let key = instance.key(opened, &body).unwrap();
        Ok(store.get(&key, demo::ACCOUNT_ENTRY).unwrap())
    })
    .unwrap()
}

/// Publishes a seeded bank workload to topic `accounts` of `log` (created
/// with `partitions` partitions) and returns its oracle.
pub async fn publish_bank(
    log: &impl EventLog,
    module: Arc<dyn HandlerModule>,
    spec: WorkloadSpec,
    partitions: u32,
) -> Oracle {
    let (events, oracle) = demo::workload(spec);
    let outgoing = demo::outgoing(&*module, &events).expect("the bank module");
    log.create_topic("accounts", partitions).await.expect("create topic");
    publish::publish(log, "accounts", module, outgoing, None, 2).await.expect("publish");
    oracle
}
