//! The checks every port of the bank example to another language passes
//! (`examples/bank-py`, `examples/bank-ts`): it describes itself as the
//! Rust bank does, gives every body the Rust bank's key and ordering (so
//! modules in both languages can share a topic), fails bad input as the
//! Rust bank does, and its read model after a seeded workload equals the
//! oracle, every key's events handled in the order the spec asks. And
//! what the ports' harnesses share: whether a build tool is there (or a
//! `skipped:` line), and a port loaded once per process with its compiled
//! code cached.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::operations::host::HostSettings;
use wakuwaku::sandbox::handler::{CallError, ErrorClass, HandlerModule};
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};

use crate::{Recorder, bank_log, bank_module, catch_up, check_call_order, host_settings, read_partition, repo_root};

/// Whether a port's build tool was `found`; if not, prints one line saying
/// `what` was skipped and `needs` what, or, under CI (`CI=true`), which
/// installs the tools (`ci_installs`), panics.
pub fn tool_available<T, E: std::fmt::Display>(
    found: Result<T, E>,
    what: &str,
    needs: &str,
    ci_installs: &str,
) -> bool {
    match found {
        Ok(_) => true,
        Err(error) if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
            panic!("{what}: CI installs {ci_installs}, but: {error}")
        }
        Err(_) => {
            // Straight to stderr, past the test harness's capture, so it shows.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "skipped: {what} needs {needs}");
            false
        }
    }
}

/// The component `wasm` loaded into a default sandbox once per process
/// (kept in `cell`), its compiled code kept in `target/guests/cache`, so a
/// test run that finds the component unchanged skips its compile.
pub fn load_once(cell: &OnceLock<Arc<dyn HandlerModule>>, wasm: &Path) -> Arc<dyn HandlerModule> {
    cell.get_or_init(|| {
        let cache = repo_root().join("target").join("guests").join("cache");
        let sandbox = Sandbox::new(SandboxLimits::default()).expect("a default sandbox").with_compile_cache(&cache);
        wakuwaku::engine::projection::load_module_file(&sandbox, wasm)
            .unwrap_or_else(|error| panic!("{} loads: {error}", wasm.display()))
    })
    .clone()
}

/// `port` describes itself, keys, orders, folds and fails bad input as the
/// Rust bank does.
pub fn describes_keys_and_orders_as_the_rust_bank(port: Arc<dyn HandlerModule>) {
    let rust = bank_module();
    assert_eq!(port.event_types(), rust.event_types());
    assert!(port.emits().is_empty());
    let types = rust.event_types().to_vec();

    let (mut port, mut rust) = (port.instantiate().unwrap(), rust.instantiate().unwrap());
    let (events, _) = demo::workload(WorkloadSpec { events: 2_000, accounts: 300, seed: 3 });
    for event in &events {
        let tag = types.iter().find(|t| t.name == event.type_name).unwrap().tag;
        let body = serde_json::to_vec(&event.body).unwrap();
        assert_eq!(port.key(tag, &body).unwrap(), rust.key(tag, &body).unwrap(), "{}", event.body);
        assert_eq!(port.ordering(tag, &body).unwrap(), rust.ordering(tag, &body).unwrap(), "{}", event.body);
    }
    // Folding: the same deposits fold to the same body bytes.
    let deposited = types.iter().find(|t| t.name == demo::event_name::DEPOSITED).unwrap().tag;
    let deposits: Vec<Vec<u8>> = [r#"{"account":4,"amount":10}"#, r#"{"account":4,"amount":-3,"count":2}"#]
        .map(|b| b.as_bytes().to_vec())
        .into();
    assert_eq!(port.combine(deposited, &deposits).unwrap(), rust.combine(deposited, &deposits).unwrap());
    assert_eq!(port.combine(deposited, &deposits).unwrap(), br#"{"account":4,"amount":7,"count":3}"#);

    // Bad input fails as the Rust bank's does: unrecoverable, naming the type.
    let opened = types.iter().find(|t| t.name == demo::event_name::OPENED).unwrap().tag;
    for error in [port.key(opened, b"not json").unwrap_err(), port.ordering(opened, b"{}").unwrap_err()] {
        match error {
            CallError::Handler { class: ErrorClass::Unrecoverable, message } => {
                assert!(message.starts_with("malformed AccountOpened body: "), "{message}")
            }
            other => panic!("expected an unrecoverable handler error, got {other}"),
        }
    }
    let withdrawn = types.iter().find(|t| t.name == demo::event_name::WITHDRAWN).unwrap().tag;
    match port.combine(withdrawn, &deposits).unwrap_err() {
        CallError::Handler { class: ErrorClass::Unrecoverable, message } => {
            assert_eq!(message, "Withdrawn is not associative")
        }
        other => panic!("expected an unrecoverable handler error, got {other}"),
    }
}

/// A seeded workload of 20 000 events over 4 partitions through a host of
/// `module`: every event applied, deposits folded, the read model equal to
/// the oracle's, and every key's events handled in the spec's order.
pub async fn read_model_matches_the_oracle_and_keeps_order(module: Arc<dyn HandlerModule>) {
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
