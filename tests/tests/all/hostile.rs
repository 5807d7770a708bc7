//! Components that break the contract (see `wakuwaku_tests::liar`): a bad
//! description refuses the load with the rule it broke; garbage return
//! values trap the call cleanly and the same instance works again; values
//! that lift but break a rule (a key that is not canonical, an empty
//! `combine` body, a huge error message) fail the call or are cut, without
//! a trap; components of another world, or of the previous contract, are
//! refused; a module that traps on every call does not stop another module
//! of the same projection; a module's emit topics must exist when it is
//! loaded (or be created on request), also on hot reload; and through the
//! consumer, every hostile call (endless loop, memory bomb, deep recursion,
//! panic, refused values of every kind, garbage return values) lands in
//! the dead-letter topic with its reason while the other keys are applied.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use wakuwaku::engine::projection::{Projection, load_module_file};
use wakuwaku::event::{EventAtomicOrdering, EventTypeTag};
use wakuwaku::key::Key;
use wakuwaku::operations::lifecycle::{CreateTopics, Library, LifecycleError, LogEmitTopics, ensure_emit_topics};
use wakuwaku::sandbox::handler::{
    BatchBudget, CallError, ContractError, ErrorClass, HandlerInstance, HandlerModule, KeyScope, PayloadLimits,
};
use wakuwaku::sandbox::runtime::{LoadError, Sandbox, SandboxLimits};
use wakuwaku::storage::log::EventLog;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::state::StateStore;
use wakuwaku_tests::liar::{self, BAD, BAD_MESSAGE_LEN, Describe, LIE, TRAP, TRUTH};
use wakuwaku_tests::{catch_up, host_settings, json_record, probe_wasm};

const SPIN: EventTypeTag = EventTypeTag::new(1);
const PANIC: EventTypeTag = EventTypeTag::new(3);
const NOTE: EventTypeTag = EventTypeTag::new(4);
const RAW: EventTypeTag = EventTypeTag::new(8);

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

fn scope(reader: &Arc<wakuwaku::storage::state::StateReader>, key: u64) -> KeyScope {
    let limits = PayloadLimits::default();
    KeyScope::new(Key::int(key), reader.clone(), limits, BatchBudget::new(&limits))
}

#[test]
fn an_honest_liar_loads_and_describes_itself() {
    let module = load_liar(&sandbox(), Describe::Honest).unwrap();
    let described: Vec<(u32, &str, u32)> =
        module.event_types().iter().map(|t| (t.tag.get(), t.name.as_str(), t.max_batch)).collect();
    assert_eq!(described, [(100, "Truth", 16), (101, "Lie", 16), (102, "Trap", 16), (103, "Bad", 16)]);
    assert!(module.emits().is_empty());
}

#[test]
fn a_description_the_host_cannot_use_refuses_the_load_naming_the_rule() {
    let sandbox = sandbox();
    for (describe, expected) in [
        (Describe::DuplicateTag, "event-type-tag: tag 100 is declared twice"),
        (Describe::ZeroMaxBatch, "max-batch: event type `Truth` declares max-batch 0"),
        (Describe::OutOfBounds, "list pointer/length out of bounds"),
        (Describe::BadName, "event-type-name: tag 100 is named `no spaces`"),
        (Describe::NoEventTypes, "event-type-count:"),
        (Describe::TooManyEventTypes, "event-type-count: a module handles 1 to 256 event types; this one declares 257"),
        (Describe::HostTopic, "emit-topic-host-owned: `dlq_mixed`"),
        (Describe::BadTopic, "emit-topic-name: `a/b`"),
        (Describe::ReservedTag, "event-type-tag-reserved: event type `Lie` declares tag 4294967295"),
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

/// An honest liar's instance, and a scope for key 42 over an empty store
/// (kept in the directory returned first).
fn honest_liar() -> (tempfile::TempDir, KeyScope, Box<dyn HandlerInstance>) {
    let module = load_liar(&sandbox(), Describe::Honest).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
    let scope = scope(&Arc::new(store.reader().unwrap()), 42);
    (dir, scope, module.instantiate().unwrap())
}

#[test]
fn garbage_return_values_trap_cleanly_and_the_same_instance_works_next() {
    let (_dir, mut scope, mut instance) = honest_liar();
    let body = b"{}".to_vec();
    let many = vec![body.clone(); 3];

    // Each export in turn returns something the host cannot lift; the next
    // call on the same instance object answers properly.
    let reason = trap_reason(instance.key(LIE, &body));
    assert!(reason.contains("discriminant"), "key: {reason}");
    assert_eq!(instance.key(TRUTH, &body), Ok(Key::int(42)));

    let reason = trap_reason(instance.ordering(LIE, &body));
    assert!(reason.contains("discriminant"), "ordering: {reason}");
    assert_eq!(instance.ordering(TRUTH, &body), Ok(EventAtomicOrdering::Relaxed));

    let reason = trap_reason(instance.combine(LIE, &many));
    assert!(reason.contains("out of bounds"), "combine: {reason}");
    assert_eq!(instance.combine(TRUTH, &many), Ok(b"{}".to_vec()));

    let reason = trap_reason(instance.handle(&mut scope, LIE, &many));
    assert!(reason.contains("out of bounds"), "handle: {reason}");
    instance.handle(&mut scope, TRUTH, &many).unwrap();

    let reason = trap_reason(instance.handle(&mut scope, TRAP, &many));
    assert!(reason.contains("unreachable"), "handle: {reason}");
    instance.handle(&mut scope, TRUTH, &many).unwrap();
}

#[test]
fn values_that_lift_but_break_a_rule_fail_the_call_without_a_trap() {
    let (_dir, mut scope, mut instance) = honest_liar();
    let body = b"{}".to_vec();

    let error = instance.key(BAD, &body).unwrap_err();
    assert!(matches!(error, CallError::Contract(ContractError::KeyNotCanonical { .. })), "{error:?}");
    assert!(error.to_string().contains("key-canonical:"), "{error}");
    assert_eq!(error.class(), ErrorClass::Retryable);

    let error = instance.combine(BAD, &[body.clone(), body.clone()]).unwrap_err();
    assert_eq!(error, CallError::Contract(ContractError::CombinedBodySize { length: 0, limit: 1 << 20 }));
    assert!(error.to_string().contains("combine-body-size:"), "{error}");

    // A 16 KiB error message is kept, cut to 4 KiB: it ends up in headers.
    match instance.handle(&mut scope, BAD, std::slice::from_ref(&body)) {
        Err(CallError::Handler { class: ErrorClass::Unrecoverable, message }) => {
            assert!(message.starts_with("mmmm") && message.ends_with(" […cut]"), "{}", &message[message.len() - 20..]);
            assert!(message.len() < BAD_MESSAGE_LEN / 3, "the message was not cut: {} bytes", message.len());
        }
        other => panic!("expected an unrecoverable error, got {other:?}"),
    }
    // None of it was a trap: the instance serves on.
    instance.handle(&mut scope, TRUTH, std::slice::from_ref(&body)).unwrap();
    assert_eq!(instance.key(TRUTH, &body), Ok(Key::int(42)));

    // Outside `handle` the sandbox's payload limits apply: `combine`'s
    // body `{}` is over a body limit of 1 byte.
    let tight = sandbox().with_payload_limits(PayloadLimits { max_emit_body: 1, ..PayloadLimits::default() });
    let mut instance = tight.load("liar", &liar::liar(Describe::Honest)).unwrap().instantiate().unwrap();
    let error = instance.combine(TRUTH, &[body.clone(), body]).unwrap_err();
    assert_eq!(error, CallError::Contract(ContractError::CombinedBodySize { length: 2, limit: 1 }));
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

#[test]
fn a_module_of_the_previous_contract_is_refused_naming_both_versions() {
    match sandbox().load("old", &liar::old_contract()) {
        Err(error @ LoadError::ContractVersion { .. }) => {
            let message = error.to_string();
            assert!(message.contains("was built for wakuwaku:handler@0.1.0"), "{message}");
            assert!(message.contains(wakuwaku::sandbox::runtime::CONTRACT), "{message}");
        }
        Err(other) => panic!("expected a contract version error, got {other}"),
        Ok(_) => panic!("a module of the old contract loaded"),
    }
}

#[test]
fn a_module_using_two_contract_versions_at_once_is_refused_naming_both() {
    match sandbox().load("mixed", &liar::mixed_contract()) {
        Err(error @ LoadError::ContractVersion { .. }) => {
            let message = error.to_string();
            assert!(message.contains(wakuwaku::sandbox::runtime::CONTRACT_0_2), "{message}");
            assert!(message.contains(wakuwaku::sandbox::runtime::CONTRACT), "{message}");
            assert!(message.contains("at once"), "{message}");
        }
        Err(other) => panic!("expected a contract version error, got {other}"),
        Ok(_) => panic!("a module of two contract versions loaded"),
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

    let mut probe_instance = probe.instantiate().unwrap();
    let mut liar_instance = liar.instantiate().unwrap();
    let mut probe_scope = scope(&reader, 1);
    let mut liar_scope = scope(&reader, 2);
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
        assert_eq!(probe_scope.get("last"), Ok(Some(serde_json::to_vec(&text).unwrap())));
    }
    // The other way round: the probe panics every call, the liar's truth holds.
    for _ in 0..5 {
        trap_reason(probe_instance.handle(&mut probe_scope, PANIC, &bodies(json!({ "key": 1, "message": "boom" }))));
        liar_instance.handle(&mut liar_scope, TRUTH, &[b"{}".to_vec()]).unwrap();
    }
    assert_eq!(probe_scope.counter_get("notes"), Ok(5));
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
            let mut scope = scope(&reader, 1);
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
        let mut scope = scope(&reader, 2);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_emit_topic_is_a_load_error_naming_it_unless_creation_was_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let log = EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
    let probe = load_module_file(&sandbox(), &probe_wasm()).unwrap();
    log.create_topic("out", 1).await.unwrap();
    match ensure_emit_topics(&log, &*probe, None).await {
        Err(error @ LifecycleError::MissingEmitTopic { .. }) => {
            let message = error.to_string();
            assert!(message.contains("module `probe` declares it emits to topic `notes-out`"), "{message}");
            assert!(message.contains("--create-emit-topics"), "{message}");
        }
        other => panic!("expected a missing emit topic, got {other:?}"),
    }
    ensure_emit_topics(&log, &*probe, Some(&CreateTopics::new(3))).await.unwrap();
    assert_eq!(log.partitions("notes-out").await.unwrap(), 3);
    assert_eq!(log.partitions("out").await.unwrap(), 1, "an existing topic is left as it is");
    ensure_emit_topics(&log, &*probe, None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_creates_at_most_its_limit_of_emit_topics_however_many_loads_ask() {
    let dir = tempfile::tempdir().unwrap();
    let probe = load_module_file(&sandbox(), &probe_wasm()).unwrap();
    // The probe declares two topics; each fresh log lacks both.
    let create = CreateTopics::with_limit(1, 3);
    let first = EmbeddedLog::open(dir.path().join("first.redb")).unwrap();
    ensure_emit_topics(&first, &*probe, Some(&create)).await.unwrap();
    let second = EmbeddedLog::open(dir.path().join("second.redb")).unwrap();
    match ensure_emit_topics(&second, &*probe, Some(&create)).await {
        Err(error @ LifecycleError::EmitTopicsCreated { .. }) => {
            let message = error.to_string();
            assert!(message.contains("emit-topics-created"), "{message}");
            assert!(message.contains("already created 3 emit topics"), "{message}");
        }
        other => panic!("expected the limit of created topics, got {other:?}"),
    }
    let created = [second.partitions("notes-out").await.is_ok(), second.partitions("out").await.is_ok()];
    assert_eq!(created.iter().filter(|&&c| c).count(), 1, "one topic fit under the limit: {created:?}");
    // Topics that exist cost nothing: the first log's module loads again.
    ensure_emit_topics(&first, &*probe, Some(&create)).await.unwrap();
    assert_eq!(CreateTopics::DEFAULT_LIMIT, 256, "the figure the README and `--help` give");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_whose_new_module_needs_a_missing_topic_is_refused_and_the_old_set_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let modules = dir.path().join("modules");
    std::fs::create_dir(&modules).unwrap();
    std::fs::write(modules.join("liar.wasm"), liar::liar(Describe::Honest)).unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
    let topics = LogEmitTopics { log: log.clone(), create: None, runtime: tokio::runtime::Handle::current() };
    let library = Arc::new(
        Library::new(&dir.path().join("data"), "accounts", store.clone(), sandbox()).with_emit_topics(Arc::new(topics)),
    );
    let (library_, modules_) = (library.clone(), modules.clone());
    let (started, _) = tokio::task::spawn_blocking(move || library_.start(&modules_, false)).await.unwrap().unwrap();
    let projection = Arc::new(Projection::new("accounts", "accounts", started, store).unwrap());

    // The probe declares `notes-out` and `out`, which do not exist.
    std::fs::copy(probe_wasm(), modules.join("probe.wasm")).unwrap();
    let reload = {
        let (library, projection, modules) = (library.clone(), projection.clone(), modules.clone());
        move || library.reload(&projection, &modules)
    };
    let changed = tokio::task::spawn_blocking(reload.clone()).await.unwrap().unwrap();
    assert!(changed.is_empty(), "{changed:?}");
    assert_eq!(projection.modules().iter().map(|m| m.name().to_owned()).collect::<Vec<_>>(), ["liar"]);
    let status = &library.reloads()["probe"];
    let error = status.error.as_deref().expect("the reload was refused");
    assert!(error.contains("module `probe` declares it emits to topic `notes-out`"), "{error}");
    assert_eq!(library.load_counts().1, 1, "the refusal counts as a failed load");

    // Once the topics exist, the same file is taken.
    log.create_topic("notes-out", 1).await.unwrap();
    log.create_topic("out", 1).await.unwrap();
    let changed = tokio::task::spawn_blocking(reload).await.unwrap().unwrap();
    assert_eq!(changed, ["probe"], "{:?}", library.reloads());
    assert_eq!(projection.modules().len(), 2);
}

/// A probe `Raw` event for key `key`.
fn raw(key: u64, op: &str, count: u64, fields: serde_json::Value) -> serde_json::Value {
    let mut event = json!({
        "key": key, "op": op, "name": "n", "len": 1, "delta": 1, "topic": "out",
        "emit_key": Key::int(key).as_bytes(), "count": count, "ignore": false,
    });
    for (field, value) in fields.as_object().unwrap() {
        event[field] = value.clone();
    }
    event
}

/// Every hostile module of the suite, end to end through the consumer:
/// each failure lands where the error table says with a reason naming it,
/// and every other key of both modules is applied in the same run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_calls_land_in_the_dead_letter_topic_with_their_reasons_and_the_rest_is_applied() {
    use wakuwaku::engine::consumer::ConsumerConfig;
    use wakuwaku::engine::routing::{FailureClass, RetryPolicy, Routed};
    use wakuwaku::event::EventHeaders;
    use wakuwaku::storage::log::Record;

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

    let record = |key: u64, tag: EventTypeTag, body: serde_json::Value| json_record(tag, key, body);
    let big = "x".repeat(4096);
    let unrecoverable = FailureClass::Unrecoverable;
    let hostile = [
        (1, record(1, SPIN, json!({ "key": 1 })), FailureClass::Trap, "CPU budget"),
        (2, record(2, HOG, json!({ "key": 2, "mib": 64 })), FailureClass::Trap, "memory"),
        (3, record(3, RECURSE, json!({ "key": 3, "depth": 100_000_000u64 })), FailureClass::Trap, "stack overflow"),
        (4, record(4, PANIC, json!({ "key": 4, "message": "boom" })), FailureClass::Trap, "boom"),
        (5, record(5, NOTE, json!({ "key": 5, "text": big, "emit_to": null })), unrecoverable, "state-value-size:"),
        (6, record(6, NOTE, json!({ "key": 6, "text": "e", "emit_to": "out" })), unrecoverable, "emit-body-size:"),
        (7, Record { body: b"{}".to_vec(), ..record(7, LIE, json!({})) }, FailureClass::Trap, "trap"),
        (8, record(8, NOTE, json!({ "key": 8, "text": "e", "emit_to": "dlq_mixed" })), unrecoverable, "emit-topic:"),
        (9, record(9, RAW, raw(9, "counter-add", 2, json!({ "delta": i64::MAX }))), unrecoverable, "counter-range:"),
        (11, record(11, RAW, raw(11, "emit", 1, json!({ "emit_key": [1, 128, 0] }))), unrecoverable, "emit-key:"),
        (12, record(12, RAW, raw(12, "emit", 100_000, json!({}))), unrecoverable, "emits-per-call:"),
        (
            13,
            record(13, RAW, raw(13, "set", 100_000, json!({ "name": "e{i}" }))),
            unrecoverable,
            "state-writes-per-call:",
        ),
        (14, Record { body: b"{}".to_vec(), ..record(14, BAD, json!({})) }, unrecoverable, "mmmm"),
    ];
    let mut records: Vec<Record> = hostile.iter().map(|(_, r, _, _)| r.clone()).collect();
    for key in 20..30 {
        records.push(record(key, NOTE, json!({ "key": key, "text": "fine", "emit_to": null })));
    }
    records.push(Record { body: b"{}".to_vec(), ..record(31, TRUTH, json!({})) });
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("mixed", 1).await.unwrap();
    log.create_topic("out", 1).await.unwrap();
    log.append("mixed", vec![(0, records)]).await.unwrap();

    let config = ConsumerConfig {
        payload: PayloadLimits { max_state_value: 1024, max_emit_body: 8, ..PayloadLimits::default() },
        retry: RetryPolicy { delays: vec![Duration::ZERO], max_attempts: 2, ..RetryPolicy::default() },
        ..ConsumerConfig::default()
    };
    let settings = host_settings(dir.path(), "both", "mixed", vec![probe, liar], config);
    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!((summary.applied, summary.dead_lettered), (11, hostile.len() as u64));
    assert_eq!(projection.store().counters().unwrap(), [("notes".to_owned(), 10i128)]);
    assert_eq!(log.end_offset("out", 0).await.unwrap(), 0, "no refused emit reached a topic");

    let dead = log.read("dlq_mixed", 0, 0, 100).await.unwrap();
    assert_eq!(dead.len(), hostile.len());
    for (key, _, class, reason) in hostile {
        let letter = dead
            .iter()
            .find(|d| EventHeaders::parse_stored(&d.record.headers).unwrap().key == Key::int(key))
            .unwrap_or_else(|| panic!("key {key} is not in the dead-letter topic"));
        let failure = Routed::parse(&letter.record.headers).unwrap().failure.unwrap();
        assert_eq!(failure.class, class, "key {key}: {}", failure.message);
        assert!(failure.message.contains(reason), "key {key}: {:?} does not name {reason:?}", failure.message);
        assert!(failure.message.len() < 5 << 10, "key {key}: a {} byte message", failure.message.len());
    }
}
