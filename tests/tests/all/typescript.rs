//! The TypeScript bank (`examples/bank-ts`, built with esbuild and componentize-js from the
//! TypeScript SDK) through the real host: it describes itself as the Rust bank
//! does, gives every body the Rust bank's key and ordering (so modules in
//! both languages can share a topic), fails bad input as the Rust bank
//! does, and its read model after a seeded workload equals the oracle.
//!
//! Each test needs the npm tools (see `wakuwaku_tests::typescript`); without
//! them, it prints one `skipped: …` line, except under CI, where it fails.

use std::sync::Arc;

use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::operations::host::HostSettings;
use wakuwaku::sandbox::handler::{CallError, ErrorClass};
use wakuwaku_tests::typescript::bank_ts_module;
use wakuwaku_tests::{Recorder, bank_log, bank_module, catch_up, check_call_order, host_settings, read_partition};

#[test]
fn the_typescript_bank_describes_keys_and_orders_as_the_rust_bank() {
    let Some(ts) = bank_ts_module("the TypeScript bank's description, keys and orderings") else { return };
    let rust = bank_module();
    assert_eq!(ts.event_types(), rust.event_types());
    assert!(ts.emits().is_empty());
    let types = rust.event_types().to_vec();

    let (mut ts, mut rust) = (ts.instantiate().unwrap(), rust.instantiate().unwrap());
    let (events, _) = demo::workload(WorkloadSpec { events: 2_000, accounts: 300, seed: 3 });
    for event in &events {
        let tag = types.iter().find(|t| t.name == event.type_name).unwrap().tag;
        let body = serde_json::to_vec(&event.body).unwrap();
        assert_eq!(ts.key(tag, &body).unwrap(), rust.key(tag, &body).unwrap(), "{}", event.body);
        assert_eq!(ts.ordering(tag, &body).unwrap(), rust.ordering(tag, &body).unwrap(), "{}", event.body);
    }
    // Folding: the same deposits fold to the same body bytes.
    let deposited = types.iter().find(|t| t.name == demo::event_name::DEPOSITED).unwrap().tag;
    let deposits: Vec<Vec<u8>> = [r#"{"account":4,"amount":10}"#, r#"{"account":4,"amount":-3,"count":2}"#]
        .map(|b| b.as_bytes().to_vec())
        .into();
    assert_eq!(ts.combine(deposited, &deposits).unwrap(), rust.combine(deposited, &deposits).unwrap());
    assert_eq!(ts.combine(deposited, &deposits).unwrap(), br#"{"account":4,"amount":7,"count":3}"#);

    // Bad input fails as the Rust bank's does: unrecoverable, naming the type.
    let opened = types.iter().find(|t| t.name == demo::event_name::OPENED).unwrap().tag;
    for error in [ts.key(opened, b"not json").unwrap_err(), ts.ordering(opened, b"{}").unwrap_err()] {
        match error {
            CallError::Handler { class: ErrorClass::Unrecoverable, message } => {
                assert!(message.starts_with("malformed AccountOpened body: "), "{message}")
            }
            other => panic!("expected an unrecoverable handler error, got {other}"),
        }
    }
    let withdrawn = types.iter().find(|t| t.name == demo::event_name::WITHDRAWN).unwrap().tag;
    match ts.combine(withdrawn, &deposits).unwrap_err() {
        CallError::Handler { class: ErrorClass::Unrecoverable, message } => {
            assert_eq!(message, "Withdrawn is not associative")
        }
        other => panic!("expected an unrecoverable handler error, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_bank_read_model_matches_the_oracle_and_keeps_order() {
    let Some(module) = bank_ts_module("the TypeScript bank against the oracle") else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = WorkloadSpec { events: 20_000, accounts: 300, seed: 13 };
    let partitions = 4;
    let (log, oracle) = bank_log(dir.path(), module.clone(), spec, partitions).await;
    let recorder = Arc::new(Recorder::default());
    let config = ConsumerConfig { batch_size: 2048, workers: 2, ..ConsumerConfig::default() };
    let settings = HostSettings {
        observer: Some(recorder.clone()),
        ..host_settings(dir.path(), "bank", "accounts", vec![module.clone()], config)
    };
    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!((summary.consumed, summary.applied), (spec.events as u64, spec.events as u64), "{summary:?}");
    assert_eq!((summary.skipped, summary.malformed), (0, 0), "{summary:?}");
    assert!(summary.calls < summary.applied, "deposits were folded: {summary:?}");

    let check = demo::check_projection(&oracle, &*module, projection.store()).unwrap();
    assert!(check.matches(), "{}", check.report(10));
    assert_eq!(check.accounts, oracle.accounts.len());
    let calls = recorder.calls();
    for partition in 0..partitions {
        let records = read_partition(&log, "accounts", partition).await;
        check_call_order(partition, &records, &calls).unwrap_or_else(|e| panic!("partition {partition}: {e}"));
    }
}

/// What one instance of the TypeScript bank costs: it starts, and handles a
/// chunk of the workload, within 16 MiB of instance memory (its snapshot
/// alone is 145 pages, 9.1 MiB; the host's default limit is 64 MiB), and
/// the time to instantiate it is printed (`--nocapture`).
#[test]
fn a_typescript_instance_starts_and_runs_in_16_mib() {
    use std::time::{Duration, Instant};
    use wakuwaku::sandbox::handler::{BatchBudget, KeyScope, PayloadLimits};
    use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
    use wakuwaku::storage::state::StateStore;
    let Some(wasm) = wakuwaku_tests::typescript::bank_ts_wasm("the TypeScript bank's instance memory") else {
        return;
    };
    let cache = wakuwaku_tests::repo_root().join("target/guests/cache");
    let limits =
        SandboxLimits { memory_bytes: 16 << 20, compile_budget: Duration::from_secs(300), ..SandboxLimits::default() };
    let sandbox = Sandbox::new(limits).unwrap().with_compile_cache(&cache);
    let module = wakuwaku::engine::projection::load_module_file(&sandbox, &wasm).unwrap();
    let types = module.event_types().to_vec();
    let tag = |name: &str| types.iter().find(|t| t.name == name).unwrap().tag;
    let (events, _) = demo::workload(WorkloadSpec { events: 2_000, accounts: 50, seed: 5 });
    let runs = 10u32;
    let started = Instant::now();
    for _ in 0..runs {
        let instance = module.instantiate().expect("an instance within 16 MiB");
        drop(instance);
    }
    let per_instance = started.elapsed() / runs;
    let mut instance = module.instantiate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
    let reader = Arc::new(store.reader().unwrap());
    let payload = PayloadLimits::default();
    for event in events.iter().take(500) {
        let body = serde_json::to_vec(&event.body).unwrap();
        let tag = tag(event.type_name);
        let key = instance.key(tag, &body).unwrap();
        let mut scope = KeyScope::new(key, reader.clone(), payload, BatchBudget::new(&payload));
        instance.handle(&mut scope, tag, &[body]).expect("a call within 16 MiB");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "TypeScript bank: {per_instance:?} per instantiation (mean of {runs})");
}
