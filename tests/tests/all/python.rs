//! The Python bank (`examples/bank-py`, built with componentize-py from the
//! Python SDK) through the real host: it describes itself as the Rust bank
//! does, gives every body the Rust bank's key and ordering (so modules in
//! both languages can share a topic), fails bad input as the Rust bank
//! does, and its read model after a seeded workload equals the oracle.
//!
//! Each test needs componentize-py (see `wakuwaku_tests::python`); without
//! it, it prints one `skipped: …` line, except under CI, where it fails.

use std::sync::Arc;

use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::operations::host::HostSettings;
use wakuwaku::sandbox::handler::{CallError, ErrorClass};
use wakuwaku_tests::python::bank_py_module;
use wakuwaku_tests::{Recorder, bank_log, bank_module, catch_up, check_call_order, host_settings, read_partition};

#[test]
fn the_python_bank_describes_keys_and_orders_as_the_rust_bank() {
    let Some(python) = bank_py_module("the Python bank's description, keys and orderings") else { return };
    let rust = bank_module();
    assert_eq!(python.event_types(), rust.event_types());
    assert!(python.emits().is_empty());
    let types = rust.event_types().to_vec();

    let (mut python, mut rust) = (python.instantiate().unwrap(), rust.instantiate().unwrap());
    let (events, _) = demo::workload(WorkloadSpec { events: 2_000, accounts: 300, seed: 3 });
    for event in &events {
        let tag = types.iter().find(|t| t.name == event.type_name).unwrap().tag;
        let body = serde_json::to_vec(&event.body).unwrap();
        assert_eq!(python.key(tag, &body).unwrap(), rust.key(tag, &body).unwrap(), "{}", event.body);
        assert_eq!(python.ordering(tag, &body).unwrap(), rust.ordering(tag, &body).unwrap(), "{}", event.body);
    }
    // Folding: the same deposits fold to the same body bytes.
    let deposited = types.iter().find(|t| t.name == demo::event_name::DEPOSITED).unwrap().tag;
    let deposits: Vec<Vec<u8>> = [r#"{"account":4,"amount":10}"#, r#"{"account":4,"amount":-3,"count":2}"#]
        .map(|b| b.as_bytes().to_vec())
        .into();
    assert_eq!(python.combine(deposited, &deposits).unwrap(), rust.combine(deposited, &deposits).unwrap());
    assert_eq!(python.combine(deposited, &deposits).unwrap(), br#"{"account":4,"amount":7,"count":3}"#);

    // Bad input fails as the Rust bank's does: unrecoverable, naming the type.
    let opened = types.iter().find(|t| t.name == demo::event_name::OPENED).unwrap().tag;
    for error in [python.key(opened, b"not json").unwrap_err(), python.ordering(opened, b"{}").unwrap_err()] {
        match error {
            CallError::Handler { class: ErrorClass::Unrecoverable, message } => {
                assert!(message.starts_with("malformed AccountOpened body: "), "{message}")
            }
            other => panic!("expected an unrecoverable handler error, got {other}"),
        }
    }
    let withdrawn = types.iter().find(|t| t.name == demo::event_name::WITHDRAWN).unwrap().tag;
    match python.combine(withdrawn, &deposits).unwrap_err() {
        CallError::Handler { class: ErrorClass::Unrecoverable, message } => {
            assert_eq!(message, "Withdrawn is not associative")
        }
        other => panic!("expected an unrecoverable handler error, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_bank_read_model_matches_the_oracle_and_keeps_order() {
    let Some(module) = bank_py_module("the Python bank against the oracle") else { return };
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
