//! A guest's stderr is captured as a bounded tail: printing never fails a
//! call, and a trap report shows the output of the call that failed.

use std::sync::Arc;

use serde_json::json;
use wakuwaku::engine::projection::load_module_file;
use wakuwaku::event::EventTypeTag;
use wakuwaku::key::Key;
use wakuwaku::sandbox::handler::{BatchBudget, CallError, KeyScope, PayloadLimits};
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
use wakuwaku::storage::state::StateStore;
use wakuwaku_tests::probe_wasm;

const PANIC: EventTypeTag = EventTypeTag::new(3);
const CHATTER: EventTypeTag = EventTypeTag::new(40);

#[test]
fn printing_a_lot_never_fails_and_traps_report_the_latest_output() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
    let module = load_module_file(&Sandbox::new(SandboxLimits::default()).unwrap(), &probe_wasm()).unwrap();
    let mut instance = module.instantiate().unwrap();
    let limits = PayloadLimits::default();
    let mut scope = KeyScope::new(Key::int(1), Arc::new(store.reader().unwrap()), limits, BatchBudget::new(&limits));
    let body = |value: serde_json::Value| vec![serde_json::to_vec(&value).unwrap()];
    // About 1 MiB of stderr over ten calls, far beyond what is kept.
    for _ in 0..10 {
        instance.handle(&mut scope, CHATTER, &body(json!({ "key": 1, "lines": 2000 }))).unwrap();
    }
    assert_eq!(scope.get("chattered"), Ok(Some(b"2000".to_vec())));
    match instance.handle(&mut scope, PANIC, &body(json!({ "key": 1, "message": "the last words" }))) {
        Err(CallError::Trap { reason }) => {
            assert!(reason.contains("the last words"), "{reason}");
            assert!(!reason.contains("chatter line"), "output of earlier calls leaked into the report: {reason}");
            assert!(reason.len() < 8 << 10, "the report is not bounded: {} bytes", reason.len());
        }
        other => panic!("expected a trap, got {other:?}"),
    }
}
