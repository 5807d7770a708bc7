//! Components that break the contract (see `wakuwaku_tests::liar`): a bad
//! description refuses the load with the reason; garbage return values trap
//! the call cleanly and the same instance works again; components of another
//! world are refused; a module that traps on every call does not stop
//! another module of the same projection; and through the consumer, every
//! hostile call (endless loop, memory bomb, deep recursion, panic, oversized
//! state value, oversized emit, garbage return value) lands in the
//! dead-letter topic with its reason while the other keys are applied.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use wakuwaku::event::{EventAtomicOrdering, EventTypeTag};
use wakuwaku::handler::{CallError, HandlerModule, KeyScope, PayloadLimits};
use wakuwaku::projection::{Projection, load_module_file};
use wakuwaku::runtime::{LoadError, Sandbox, SandboxLimits};
use wakuwaku::state::StateStore;
use wakuwaku_tests::liar::{self, Describe, LIE, TRAP, TRUTH};
use wakuwaku_tests::{json_record, probe_wasm};

const SPIN: EventTypeTag = EventTypeTag::new(1);
const PANIC: EventTypeTag = EventTypeTag::new(3);
const NOTE: EventTypeTag = EventTypeTag::new(4);

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxLimits { call_budget: Duration::from_millis(200), ..SandboxLimits::default() }).unwrap()
}

fn load_liar(sandbox: &Sandbox, describe: Describe) -> Result<Arc<dyn HandlerModule>, LoadError> {
    Ok(Arc::new(sandbox.load("liar", &liar::liar(describe))?))
}

fn trap_reason<T: std::fmt::Debug>(result: Result<T, CallError>) -> String {
    match result {
        Err(CallError::Trap { reason }) => reason,
        other => panic!("expected a trap, got {other:?}"),
    }
}

fn bodies(value: serde_json::Value) -> Vec<Vec<u8>> {
    vec![serde_json::to_vec(&value).unwrap()]
}

#[test]
fn an_honest_liar_loads_and_describes_itself() {
    let module = load_liar(&sandbox(), Describe::Honest).unwrap();
    let described: Vec<(u32, &str, u32)> =
        module.event_types().iter().map(|t| (t.tag.get(), t.name.as_str(), t.max_batch)).collect();
    assert_eq!(described, [(100, "Truth", 16), (101, "Lie", 16), (102, "Trap", 16)]);
}

#[test]
fn a_description_the_host_cannot_use_refuses_the_load_with_the_reason() {
    let sandbox = sandbox();
    for (describe, expected) in [
        (Describe::DuplicateTag, "tag 100 is declared twice"),
        (Describe::ZeroMaxBatch, "event type `Truth` declares max-batch 0"),
        (Describe::OutOfBounds, "list pointer/length out of bounds"),
    ] {
        match load_liar(&sandbox, describe) {
            Err(LoadError::Describe { module, reason }) => {
                assert_eq!(module, "liar");
                assert!(reason.contains(expected), "{describe:?}: `{reason}` lacks `{expected}`");
            }
            Err(other) => panic!("{describe:?}: expected a describe error, got {other}"),
            Ok(_) => panic!("{describe:?}: the liar loaded"),
        }
    }
}

#[test]
fn garbage_return_values_trap_cleanly_and_the_same_instance_works_next() {
    let module = load_liar(&sandbox(), Describe::Honest).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
    let mut scope = KeyScope::new(42, Arc::new(store.reader().unwrap()), PayloadLimits::default());
    let mut instance = module.instantiate().unwrap();
    let body = b"{}".to_vec();
    let many = vec![body.clone(); 3];

    // Each export in turn returns something the host cannot lift; the next
    // call on the same instance object answers properly.
    let reason = trap_reason(instance.key(LIE, &body));
    assert!(reason.contains("discriminant"), "key: {reason}");
    assert_eq!(instance.key(TRUTH, &body), Ok(42));

    let reason = trap_reason(instance.ordering(LIE, &body));
    assert!(reason.contains("discriminant"), "ordering: {reason}");
    assert_eq!(instance.ordering(TRUTH, &body), Ok(EventAtomicOrdering::Relaxed));

    let reason = trap_reason(instance.combine(LIE, &many));
    assert!(reason.contains("out of bounds"), "combine: {reason}");
    assert_eq!(instance.combine(TRUTH, &many), Ok(Vec::new()));

    let reason = trap_reason(instance.handle(&mut scope, LIE, &many));
    assert!(reason.contains("out of bounds"), "handle: {reason}");
    instance.handle(&mut scope, TRUTH, &many).unwrap();

    let reason = trap_reason(instance.handle(&mut scope, TRAP, &many));
    assert!(reason.contains("unreachable"), "handle: {reason}");
    instance.handle(&mut scope, TRUTH, &many).unwrap();
}

#[test]
fn components_of_another_world_are_refused() {
    let sandbox = sandbox();
    for (name, bytes) in [("greeter", liar::other_world()), ("impostor", liar::wrong_shape())] {
        match sandbox.load(name, &bytes) {
            Err(error @ LoadError::NotAHandler { .. }) => {
                let message = error.to_string();
                assert!(message.contains(&format!("module `{name}`")), "{message}");
                assert!(message.contains("wakuwaku:handler"), "{message}");
            }
            Err(other) => panic!("{name}: expected NotAHandler, got {other}"),
            Ok(_) => panic!("{name}: a component of another world loaded"),
        }
    }
}

/// A projection of the probe (tags 1..) and an honest liar (tags 100..).
fn two_module_projection(dir: &std::path::Path) -> Arc<Projection> {
    let sandbox = sandbox();
    let probe = load_module_file(&sandbox, &probe_wasm()).unwrap();
    let liar = load_liar(&sandbox, Describe::Honest).unwrap();
    let store = StateStore::open(&dir.join("state.redb")).unwrap();
    Arc::new(Projection::new("both", "mixed", vec![probe, liar], store).unwrap())
}

#[test]
fn a_module_trapping_on_every_call_does_not_stop_the_other_module() {
    let dir = tempfile::tempdir().unwrap();
    let projection = two_module_projection(dir.path());
    let modules = projection.modules();
    let [probe, liar] = &modules[..] else { panic!("two modules") };
    assert_eq!(projection.route(NOTE).map(|r| r.module), Some(0));
    assert_eq!(projection.route(TRAP).map(|r| r.module), Some(1));
    let reader = Arc::new(projection.store().reader().unwrap());
    let scope = |key| KeyScope::new(key, reader.clone(), PayloadLimits::default());

    let mut probe_instance = probe.instantiate().unwrap();
    let mut liar_instance = liar.instantiate().unwrap();
    let mut probe_scope = scope(1);
    let mut liar_scope = scope(2);
    for round in 0..5 {
        // The liar fails every call, in every way it knows ...
        trap_reason(liar_instance.handle(&mut liar_scope, TRAP, &[b"{}".to_vec()]));
        trap_reason(liar_instance.handle(&mut liar_scope, LIE, &[b"{}".to_vec()]));
        trap_reason(liar_instance.key(LIE, b"{}"));
        // ... and the probe's calls go on, state and all.
        let text = format!("round {round}");
        probe_instance
            .handle(&mut probe_scope, NOTE, &bodies(json!({ "key": 1, "text": text, "emit_to": null })))
            .unwrap();
        assert_eq!(probe_scope.get("last"), Some(serde_json::to_vec(&text).unwrap()));
    }
    // The other way round: the probe panics every call, the liar's truth holds.
    for _ in 0..5 {
        trap_reason(probe_instance.handle(&mut probe_scope, PANIC, &bodies(json!({ "key": 1, "message": "boom" }))));
        liar_instance.handle(&mut liar_scope, TRUTH, &[b"{}".to_vec()]).unwrap();
    }
    assert_eq!(probe_scope.counter_get("notes"), 5);
}

#[test]
fn a_module_burning_its_cpu_budget_does_not_stall_the_other_module_on_another_thread() {
    let dir = tempfile::tempdir().unwrap();
    let projection = two_module_projection(dir.path());
    let modules = projection.modules();
    let [probe, liar] = &modules[..] else { panic!("two modules") };
    let reader = Arc::new(projection.store().reader().unwrap());
    let spinning = AtomicBool::new(true);

    let (spins, truths) = std::thread::scope(|threads| {
        let spinner = threads.spawn(|| {
            let mut instance = probe.instantiate().unwrap();
            let mut scope = KeyScope::new(1, reader.clone(), PayloadLimits::default());
            let mut spins = 0;
            for _ in 0..3 {
                let reason = trap_reason(instance.handle(&mut scope, SPIN, &bodies(json!({ "key": 1 }))));
                assert!(reason.contains("CPU budget"), "{reason}");
                spins += 1;
            }
            spinning.store(false, Ordering::Relaxed);
            spins
        });
        let mut instance = liar.instantiate().unwrap();
        let mut scope = KeyScope::new(2, reader.clone(), PayloadLimits::default());
        let mut truths = 0u64;
        while spinning.load(Ordering::Relaxed) {
            instance.handle(&mut scope, TRUTH, &[b"{}".to_vec()]).unwrap();
            truths += 1;
        }
        (spinner.join().unwrap(), truths)
    });
    assert_eq!(spins, 3);
    assert!(truths >= 10, "the liar made only {truths} calls while the probe spun for three budgets");
}

/// Every hostile module of the suite, end to end through the consumer:
/// each failure lands where the error table says with a reason naming it,
/// and every other key of both modules is applied in the same run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_calls_land_in_the_dead_letter_topic_with_their_reasons_and_the_rest_is_applied() {
    use wakuwaku::consumer::{Consumer, ConsumerConfig};
    use wakuwaku::event::EventHeaders;
    use wakuwaku::log::embedded::EmbeddedLog;
    use wakuwaku::log::{EventLog, Record};
    use wakuwaku::routing::{FailureClass, RetryPolicy, Routed};

    const HOG: EventTypeTag = EventTypeTag::new(2);
    const RECURSE: EventTypeTag = EventTypeTag::new(6);
    let dir = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::new(SandboxLimits {
        memory_bytes: 16 << 20,
        call_budget: Duration::from_millis(200),
        ..SandboxLimits::default()
    })
    .unwrap();
    let probe = load_module_file(&sandbox, &probe_wasm()).unwrap();
    let liar = load_liar(&sandbox, Describe::Honest).unwrap();
    let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
    let projection = Arc::new(Projection::new("both", "mixed", vec![probe, liar], store).unwrap());

    let record = |key: u64, tag: EventTypeTag, body: serde_json::Value| json_record(tag, key, body);
    let big = "x".repeat(4096);
    let hostile = [
        (1, record(1, SPIN, json!({ "key": 1 })), FailureClass::Trap, "CPU budget"),
        (2, record(2, HOG, json!({ "key": 2, "mib": 64 })), FailureClass::Trap, "memory"),
        (3, record(3, RECURSE, json!({ "key": 3, "depth": 100_000_000u64 })), FailureClass::Trap, "stack overflow"),
        (4, record(4, PANIC, json!({ "key": 4, "message": "boom" })), FailureClass::Trap, "boom"),
        (
            5,
            record(5, NOTE, json!({ "key": 5, "text": big, "emit_to": null })),
            FailureClass::Unrecoverable,
            "over the limit of 1024 bytes",
        ),
        (
            6,
            record(6, NOTE, json!({ "key": 6, "text": "e", "emit_to": "out" })),
            FailureClass::Unrecoverable,
            "over the limit of 8 bytes",
        ),
        (7, Record { body: b"{}".to_vec(), ..record(7, LIE, json!({})) }, FailureClass::Trap, "trap"),
    ];
    let mut records: Vec<Record> = hostile.iter().map(|(_, r, _, _)| r.clone()).collect();
    for key in 10..20 {
        records.push(record(key, NOTE, json!({ "key": key, "text": "fine", "emit_to": null })));
    }
    records.push(Record { body: b"{}".to_vec(), ..record(21, TRUTH, json!({})) });
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("mixed", 1).await.unwrap();
    log.create_topic("out", 1).await.unwrap();
    log.append("mixed", vec![(0, records)]).await.unwrap();

    let config = ConsumerConfig {
        payload: PayloadLimits { max_state_value: 1024, max_emit_body: 8, ..PayloadLimits::default() },
        retry: RetryPolicy { delays: vec![Duration::ZERO], max_attempts: 2, ..RetryPolicy::default() },
        ..ConsumerConfig::default()
    };
    let summary = Consumer::new(log.clone(), projection.clone(), config).catch_up().await.unwrap();
    assert_eq!((summary.applied, summary.dead_lettered), (11, 7));
    assert_eq!(projection.store().counters().unwrap(), [("notes".to_owned(), 10)]);

    let dead = log.read("dlq_mixed", 0, 0, 100).await.unwrap();
    assert_eq!(dead.len(), hostile.len());
    for (key, _, class, reason) in hostile {
        let letter = dead
            .iter()
            .find(|d| EventHeaders::parse_stored(&d.record.headers).unwrap().key_hash == key)
            .unwrap_or_else(|| panic!("key {key} is not in the dead-letter topic"));
        let failure = Routed::parse(&letter.record.headers).unwrap().failure.unwrap();
        assert_eq!(failure.class, class, "key {key}: {}", failure.message);
        assert!(failure.message.contains(reason), "key {key}: {:?} does not name {reason:?}", failure.message);
    }
}
