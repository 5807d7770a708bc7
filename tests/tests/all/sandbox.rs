//! The sandbox: limits hold, a trap costs an instance and never the host,
//! a failed call leaves no trace, only the contract can be imported, and
//! every value a real component hands an import is checked at the call,
//! with a refusal naming the rule.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use wakuwaku::authoring::publish::{self, Outgoing};
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::engine::projection::load_module_file;
use wakuwaku::event::EventTypeTag;
use wakuwaku::key::Key;
use wakuwaku::sandbox::handler::{
    BatchBudget, CallError, ErrorClass, HandlerInstance, HandlerModule, KeyScope, PayloadLimits,
};
use wakuwaku::sandbox::runtime::component_file::{MAX_COMPONENT_FUNCTIONS, MAX_COMPONENT_GLOBALS, MAX_FUNCTION_BYTES};
use wakuwaku::sandbox::runtime::wasi::{MAX_RANDOM_BYTES, MAX_WASI_RESOURCES};
use wakuwaku::sandbox::runtime::{LoadError, Sandbox, SandboxLimits};
use wakuwaku::storage::log::EventLog;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::state::StateStore;
use wakuwaku_core::limits::ContractError;
use wakuwaku_tests::hostile::{ALLOC_TRIGGER, hostile_module, tag};
use wakuwaku_tests::{catch_up, host_settings, probe_wasm};

const SPIN: EventTypeTag = EventTypeTag::new(1);
const HOG: EventTypeTag = EventTypeTag::new(2);
const PANIC: EventTypeTag = EventTypeTag::new(3);
const NOTE: EventTypeTag = EventTypeTag::new(4);
const FAIL: EventTypeTag = EventTypeTag::new(5);
const RECURSE: EventTypeTag = EventTypeTag::new(6);
const LEAK: EventTypeTag = EventTypeTag::new(9);

fn limits() -> SandboxLimits {
    SandboxLimits { memory_bytes: 16 << 20, call_budget: Duration::from_millis(200), ..SandboxLimits::default() }
}

fn probe(limits: SandboxLimits) -> Arc<dyn HandlerModule> {
    load_module_file(&Sandbox::new(limits).unwrap(), &probe_wasm()).unwrap()
}

struct Harness {
    _dir: tempfile::TempDir,
    store: StateStore,
}

impl Harness {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        Self { _dir: dir, store }
    }

    fn scope(&self, key: u64) -> KeyScope {
        self.scope_with(key, PayloadLimits::default())
    }

    fn scope_with(&self, key: u64, limits: PayloadLimits) -> KeyScope {
        KeyScope::new(Key::int(key), Arc::new(self.store.reader().unwrap()), limits, BatchBudget::new(&limits))
    }
}

fn body(value: serde_json::Value) -> Vec<Vec<u8>> {
    vec![serde_json::to_vec(&value).unwrap()]
}

fn note(instance: &mut dyn HandlerInstance, scope: &mut KeyScope, text: &str) -> Result<(), CallError> {
    instance.handle(scope, NOTE, &body(json!({ "key": 1, "text": text, "emit_to": null })))
}

fn assert_trap(result: Result<(), CallError>, expected: &str) {
    match result {
        Err(CallError::Trap { reason }) => {
            assert!(reason.contains(expected), "trap reason `{reason}` lacks `{expected}`")
        }
        other => panic!("expected a trap mentioning `{expected}`, got {other:?}"),
    }
}

#[test]
fn an_endless_loop_runs_out_of_cpu_budget_and_the_instance_recovers() {
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let mut scope = harness.scope(1);
    let started = Instant::now();
    assert_trap(instance.handle(&mut scope, SPIN, &body(json!({ "key": 1 }))), "CPU budget");
    assert!(started.elapsed() < Duration::from_secs(10), "the deadline did not stop the loop");
    // The same instance object serves the next call from a fresh instance.
    note(&mut *instance, &mut scope, "after the loop").unwrap();
    assert_eq!(scope.get("last"), Ok(Some(b"\"after the loop\"".to_vec())));
}

#[test]
fn a_memory_bomb_hits_the_memory_limit() {
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let mut scope = harness.scope(1);
    let result = instance.handle(&mut scope, HOG, &body(json!({ "key": 1, "mib": 64 })));
    assert!(matches!(result, Err(CallError::Trap { .. })), "{result:?}");
    assert_eq!(scope.get("hogged"), Ok(None), "a trapped call left a write");
    // Within the limit the same request works.
    instance.handle(&mut scope, HOG, &body(json!({ "key": 1, "mib": 4 }))).unwrap();
    assert_eq!(scope.get("hogged"), Ok(Some(b"4".to_vec())));
}

/// An instance whose memory only grows (as a garbage-collected heap's does
/// between collections) is replaced by a fresh one once it passes its
/// high-water mark, so a long run of calls that each need little never
/// meets the limit; without the replacement the 17th call of 1 MiB would
/// trap under 16 MiB.
#[test]
fn an_instance_past_its_memorys_high_water_mark_is_replaced_and_calls_go_on() {
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let mut scope = harness.scope(1);
    for call in 0..60 {
        let result = instance.handle(&mut scope, LEAK, &body(json!({ "key": 1, "kib": 1024 })));
        assert_eq!(result, Ok(()), "call {call}");
    }
    assert_eq!(scope.counter_get("leaks"), Ok(60));
    // 16 MiB and a fresh instance of about 1 MiB: replaced every 7 or 8 calls.
    let recycled = module.take_instances_recycled();
    assert!((6..=10).contains(&recycled), "{recycled} instances replaced");
    assert_eq!(module.take_instances_recycled(), 0, "taking the count resets it");
    // One call of more than the limit still traps: the mark is no way around it.
    let result = instance.handle(&mut scope, LEAK, &body(json!({ "key": 1, "kib": 17 * 1024 })));
    assert!(matches!(result, Err(CallError::Trap { .. })), "{result:?}");
}

#[test]
fn instances_together_stay_within_the_hosts_memory_and_give_it_back() {
    // 16 MiB per instance, 24 MiB for all: two instances cannot both hog 12.
    let module = probe(SandboxLimits { host_memory_bytes: 24 << 20, ..limits() });
    let harness = Harness::new();
    let mut scope = harness.scope(1);
    let mut first = module.instantiate().unwrap();
    let mut second = module.instantiate().unwrap();
    first.handle(&mut scope, HOG, &body(json!({ "key": 1, "mib": 12 }))).unwrap();
    let result = second.handle(&mut scope, HOG, &body(json!({ "key": 1, "mib": 12 })));
    let Err(error @ CallError::HostMemory { limit, .. }) = result else { panic!("{result:?}") };
    assert_eq!(limit, 24 << 20);
    assert!(error.to_string().starts_with("host-instance-memory: "), "{error}");
    assert!(error.to_string().contains("--host-memory-mib"), "{error}");
    assert_eq!(error.class(), ErrorClass::Retryable);
    assert!(!module.keeps_idle_instances(), "more than half is held: idle instances are not worth keeping");
    // Dropping the first gives its memory back; the second is replaced
    // (its failed call poisoned it) and now fits.
    drop(first);
    second.handle(&mut scope, HOG, &body(json!({ "key": 1, "mib": 12 }))).unwrap();
    drop(second);
    assert!(module.keeps_idle_instances());
}

#[test]
fn a_panic_is_a_trap_whose_reason_carries_the_message() {
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let mut scope = harness.scope(1);
    let result = instance.handle(&mut scope, PANIC, &body(json!({ "key": 1, "message": "ledger out of balance" })));
    assert_trap(result, "ledger out of balance");
    note(&mut *instance, &mut scope, "after the panic").unwrap();
}

#[test]
fn unbounded_recursion_overflows_the_wasm_stack() {
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let mut scope = harness.scope(1);
    let result = instance.handle(&mut scope, RECURSE, &body(json!({ "key": 1, "depth": u64::MAX })));
    assert_trap(result, "stack overflow");
    note(&mut *instance, &mut scope, "after the overflow").unwrap();
}

#[test]
fn a_handler_error_keeps_its_class_and_drops_the_calls_writes() {
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let mut scope = harness.scope(1);
    for (class, expected) in [
        ("transient", ErrorClass::Transient),
        ("retryable", ErrorClass::Retryable),
        ("unrecoverable", ErrorClass::Unrecoverable),
    ] {
        let result = instance.handle(&mut scope, FAIL, &body(json!({ "key": 1, "class": class, "message": "no" })));
        assert_eq!(result, Err(CallError::Handler { class: expected, message: "no".into() }));
    }
    assert_eq!(scope.get("before-failure"), Ok(None));
    let outcome = scope.into_outcome();
    assert!(outcome.writes.is_empty() && outcome.counters.is_empty() && outcome.outbox.is_empty());
}

#[test]
fn oversized_state_values_are_refused_with_the_limit_named() {
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let mut scope = harness.scope_with(1, PayloadLimits { max_state_value: 8, ..PayloadLimits::default() });
    let result = note(&mut *instance, &mut scope, "far more than eight bytes");
    match result {
        Err(CallError::Handler { class: ErrorClass::Unrecoverable, message }) => {
            assert!(message.contains("state-value-size: state value `last`"), "{message}");
            assert!(message.contains("limit of 8 bytes"), "{message}")
        }
        other => panic!("expected an unrecoverable error naming the limit, got {other:?}"),
    }
}

/// A "compile bomb": compiling holds several KiB of host memory per
/// function until it ends, and an empty function is 6 bytes of the file.
/// A component past [`MAX_COMPONENT_FUNCTIONS`] is refused before it is
/// compiled (a million functions, 6 MiB, would take gigabytes), naming
/// the rule; one just within it compiles.
#[test]
fn a_component_of_too_many_functions_is_refused_before_it_is_compiled() {
    let sandbox = Sandbox::new(limits()).unwrap();
    let functions =
        |n: u64| wat::parse_str(format!("(component (core module {}))", "(func)".repeat(n as usize))).unwrap();
    let started = Instant::now();
    match sandbox.load("bomb", &functions(MAX_COMPONENT_FUNCTIONS + 1)) {
        Err(LoadError::Invalid { reason, .. }) => assert_eq!(
            reason,
            format!(
                "component-functions: the core modules of a component define at most {MAX_COMPONENT_FUNCTIONS} \
                 functions in all; this one defines {} or more",
                MAX_COMPONENT_FUNCTIONS + 1
            )
        ),
        other => panic!("expected a refusal naming component-functions, got {:?}", other.err()),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "refused after {:?}: it was compiled", started.elapsed());
    // Split over two core modules, they count together.
    let half = "(func)".repeat(MAX_COMPONENT_FUNCTIONS as usize / 2 + 1);
    let split = wat::parse_str(format!("(component (core module {half}) (core module {half}))")).unwrap();
    assert!(
        matches!(sandbox.load("bomb", &split), Err(LoadError::Invalid { reason, .. }) if reason.starts_with("component-functions:"))
    );
    // A few functions compile (and fail later: this is no handler).
    assert!(matches!(sandbox.load("small", &functions(10)), Err(LoadError::NotAHandler { .. })));
}

/// One huge function is a compile bomb too: compiling it holds about 90
/// times its size and takes seconds per MiB. A function past
/// [`MAX_FUNCTION_BYTES`] is refused before anything is compiled, naming
/// the rule and the function; many functions just within it pass the check.
#[test]
fn a_component_with_a_function_too_large_is_refused_before_it_is_compiled() {
    let sandbox = Sandbox::new(limits()).unwrap();
    // `nop` is one byte of code; the body's size adds its locals and `end`.
    let function = |bytes: u64| format!("(func {})", "nop ".repeat(bytes as usize));
    let component = |functions: &[String]| {
        wat::parse_str(format!("(component (core module (func) {}))", functions.concat())).unwrap()
    };
    let started = Instant::now();
    match sandbox.load("bomb", &component(&[function(MAX_FUNCTION_BYTES)])) {
        Err(LoadError::Invalid { reason, .. }) => assert_eq!(
            reason,
            format!(
                "component-function-size: a function of a component has at most {MAX_FUNCTION_BYTES} bytes of \
                 code; function 1 of a core module has {}",
                MAX_FUNCTION_BYTES + 2
            )
        ),
        other => panic!("expected a refusal naming component-function-size, got {:?}", other.err()),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "refused after {:?}: it was compiled", started.elapsed());
    let checked = wakuwaku::sandbox::runtime::component_file::check_code(&component(&[function(1000), function(1000)]));
    assert_eq!(checked, Ok(3));
}

/// Every instance of a core module holds 16 bytes of host memory per
/// global, outside the memory limit, and a component may instantiate one
/// core module a hundred times: a 5 MB file of a million globals made one
/// instance hold 1.6 GB. Past [`MAX_COMPONENT_GLOBALS`] in all core
/// modules, a component is refused before it is compiled, naming the rule.
#[test]
fn a_component_of_too_many_globals_is_refused_before_it_is_compiled() {
    let sandbox = Sandbox::new(limits()).unwrap();
    let globals = |n: u64| "(global (mut i64) (i64.const 0))".repeat(n as usize);
    let half = globals(MAX_COMPONENT_GLOBALS / 2 + 1);
    let copies = "(core instance (instantiate $m))".repeat(90);
    let bomb = wat::parse_str(format!("(component (core module $m {half}) (core module {half}) {copies})")).unwrap();
    let started = Instant::now();
    match sandbox.load("bomb", &bomb) {
        Err(LoadError::Invalid { reason, .. }) => assert_eq!(
            reason,
            format!(
                "component-globals: the core modules of a component define at most {MAX_COMPONENT_GLOBALS} globals \
                 in all; this one defines {} or more",
                MAX_COMPONENT_GLOBALS + 2
            )
        ),
        other => panic!("expected a refusal naming component-globals, got {:?}", other.err()),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "refused after {:?}: it was compiled", started.elapsed());
    // Just within the limit, the check passes (and loading fails later:
    // this is no handler).
    let within = wat::parse_str(format!("(component (core module {}))", globals(MAX_COMPONENT_GLOBALS))).unwrap();
    assert!(matches!(sandbox.load("within", &within), Err(LoadError::NotAHandler { .. })));
}

/// wasmtime makes a memory image of each linear memory's data segments:
/// two bytes 16 MiB apart are 16 MiB of artifact, which the host would
/// hold and cache (a 2 KB component made 200 MB). An artifact over twice
/// the component, plus the memory limit, plus 16 MiB is refused, naming
/// the rule.
#[test]
fn a_component_whose_memory_images_dwarf_it_is_refused() {
    let sandbox = Sandbox::new(limits()).unwrap(); // memory limit 16 MiB: at most about 32 MiB
    let memory = |i: usize| {
        format!(
            r#"(memory $m{i} 256) (data (memory $m{i}) (i32.const 0) "a") (data (memory $m{i}) (i32.const 16711679) "b")"#
        )
    };
    let images = |count: usize| {
        let memories: String = (0..count).map(memory).collect();
        wat::parse_str(format!("(component (core module {memories}))")).unwrap()
    };
    let bomb = images(4);
    assert!(bomb.len() < 1000, "{} bytes", bomb.len());
    match sandbox.load("images", &bomb) {
        Err(error @ LoadError::CompileLimit { .. }) => assert!(
            error.to_string().starts_with("component-artifact-size: compiling module `images` made more than"),
            "{error}"
        ),
        other => panic!("expected a refusal naming component-artifact-size, got {:?}", other.err()),
    }
    // One such memory is within the limit (and loading fails later: this
    // is no handler).
    assert!(matches!(sandbox.load("image", &images(1)), Err(LoadError::NotAHandler { .. })));
}

#[test]
fn components_that_import_more_than_the_contract_are_refused_by_name() {
    let sandbox = Sandbox::new(limits()).unwrap();
    let evil = wat::parse_str(
        r#"(component
            (import "evil:net/socket" (instance))
            (import "wasi:filesystem/preopens@0.2.0" (instance))
        )"#,
    )
    .unwrap();
    match sandbox.load("evil", &evil) {
        Err(LoadError::ForbiddenImports { module, imports }) => {
            assert_eq!(module, "evil");
            assert_eq!(imports, ["evil:net/socket"]);
        }
        other => panic!("expected forbidden imports, got {:?}", other.err()),
    }
}

/// What an error quotes of a component is bounded: 500 imports of names
/// of 99 KB made a 49 MB message, logged at every directory change.
#[test]
fn a_refusal_quotes_a_bounded_part_of_what_the_component_says() {
    let sandbox = Sandbox::new(limits()).unwrap();
    let long = "n".repeat(99_000);
    let imports: String = (0..500).map(|i| format!(r#"(import "evil:x{i}/{long}" (instance))"#)).collect();
    let evil = wat::parse_str(format!("(component {imports})")).unwrap();
    let error = sandbox.load("evil", &evil).err().unwrap();
    let message = error.to_string();
    assert!(message.len() < 8 << 10, "{} bytes", message.len());
    assert!(message.contains("evil:x0/nnn") && message.contains("and 484 more"), "{}", &message[..200]);
}

#[test]
fn wasi_interfaces_and_versions_the_host_does_not_link_are_refused_by_name() {
    let sandbox = Sandbox::new(limits()).unwrap();
    // What the host links (any 0.2 patch version) passes; the rest is named.
    let granted = ["wasi:cli/environment@0.2.0", "wasi:sockets/tcp@0.2.3", "wasi:io/streams@0.2.99"];
    let refused = [
        "wasi:http/outgoing-handler@0.2.0",
        "wasi:clocks/timezone@0.2.12",
        "wasi:cli/environment@0.3.0",
        "wasi:cli/stdout",
        "wasi:io/streams@0.2.0-rc-2023-11-10",
    ];
    let imports: String =
        granted.iter().chain(&refused).map(|name| format!(r#"(import "{name}" (instance))"#)).collect();
    let hostile = wat::parse_str(format!("(component {imports})")).unwrap();
    match sandbox.load("hostile", &hostile) {
        Err(error @ LoadError::ForbiddenImports { .. }) => {
            let LoadError::ForbiddenImports { module, imports } = &error else { unreachable!() };
            assert_eq!(module, "hostile");
            assert_eq!(imports, &refused);
            let message = error.to_string();
            assert!(message.contains("wasi:http/outgoing-handler@0.2.0, wasi:clocks/timezone@0.2.12"), "{message}");
            assert!(message.contains("wasi:*@0.2.x"), "{message}");
        }
        other => panic!("expected forbidden imports, got {:?}", other.err()),
    }
    // Only granted names: linking goes on to the exports.
    let imports: String = granted.iter().map(|name| format!(r#"(import "{name}" (instance))"#)).collect();
    let granted_only = wat::parse_str(format!("(component {imports})")).unwrap();
    assert!(matches!(sandbox.load("granted", &granted_only), Err(LoadError::NotAHandler { .. })));
}

#[test]
fn a_granted_interface_with_a_function_the_host_lacks_is_refused_as_an_import_mismatch() {
    let sandbox = Sandbox::new(limits()).unwrap();
    let forged = wat::parse_str(
        r#"(component
            (import "wasi:cli/environment@0.2.0" (instance
                (export "get-arguments" (func (result (list string))))
                (export "get-host-secrets" (func (result (list string))))
            ))
        )"#,
    )
    .unwrap();
    match sandbox.load("forged", &forged) {
        Err(error @ LoadError::ImportMismatch { .. }) => {
            let message = error.to_string();
            assert!(message.contains("wasi:cli/environment@0.2.0"), "{message}");
            assert!(message.contains("get-host-secrets"), "{message}");
            assert!(!message.contains("does not export"), "{message}");
        }
        other => panic!("expected an import mismatch, got {:?}", other.err()),
    }
}

#[test]
fn core_modules_truncated_files_and_foreign_components_are_refused() {
    let sandbox = Sandbox::new(limits()).unwrap();
    let core = wat::parse_str("(module)").unwrap();
    assert!(matches!(sandbox.load("core", &core), Err(LoadError::Invalid { .. })));
    let probe = std::fs::read(probe_wasm()).unwrap();
    let error = sandbox.load("cut", &probe[..probe.len() / 2]).err().expect("a truncated file is refused");
    assert!(matches!(error, LoadError::Invalid { .. }), "{error}");
    let empty_component = wat::parse_str("(component)").unwrap();
    let error = sandbox.load("empty", &empty_component).err().expect("a component without the handler export");
    assert!(matches!(error, LoadError::NotAHandler { .. }), "{error}");
    assert!(error.to_string().contains("wakuwaku:handler"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emitted_messages_are_published_after_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let module = probe(limits());
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("probes", 2).await.unwrap();
    log.create_topic("notes-out", 3).await.unwrap();
    let events = (0..20u64)
        .map(|i| Outgoing {
            tag: NOTE,
            body: serde_json::to_vec(&json!({ "key": i % 5, "text": format!("n{i}"), "emit_to": "notes-out" }))
                .unwrap(),
        })
        .collect();
    publish::publish(&*log, "probes", module.clone(), events, None, 2).await.unwrap();

    let config = ConsumerConfig { batch_size: 8, ..Default::default() };
    let (summary, projection) =
        catch_up(&log, host_settings(dir.path(), "probe", "probes", vec![module], config)).await.unwrap();
    assert_eq!(summary.applied, 20);
    assert_eq!(projection.store().counters().unwrap(), [("notes".to_owned(), 20i128)]);
    assert!(projection.store().outbox().unwrap().is_empty(), "the outbox was not cleared");
    let mut emitted = 0;
    for partition in 0..3 {
        emitted += log.end_offset("notes-out", partition).await.unwrap();
    }
    assert_eq!(emitted, 20);
}

const PEEK: EventTypeTag = EventTypeTag::new(7);

fn note_to(instance: &mut dyn HandlerInstance, scope: &mut KeyScope, text: &str, topic: &str) -> Result<(), CallError> {
    instance.handle(scope, NOTE, &body(json!({ "key": 1, "text": text, "emit_to": topic })))
}

#[test]
fn oversized_emits_are_refused_with_the_limit_named() {
    let payload = PayloadLimits { max_emit_body: 64, ..PayloadLimits::default() };
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let mut scope = harness.scope_with(1, payload);
    match note_to(&mut *instance, &mut scope, &"x".repeat(100), "out") {
        Err(CallError::Handler { class: ErrorClass::Unrecoverable, message }) => {
            assert!(message.contains("emit-body-size: an emitted body is 1 to 64 bytes"), "{message}");
            assert!(message.contains("cannot emit Note to `out`"), "{message}");
        }
        other => panic!("expected an unrecoverable error naming the limit, got {other:?}"),
    }
    assert_eq!(scope.get("last"), Ok(None), "the refused call left a write");
    // A body within the limit is queued, and the call's writes are kept.
    note_to(&mut *instance, &mut scope, "short", "out").unwrap();
    assert_eq!(scope.get("last"), Ok(Some(b"\"short\"".to_vec())));
    let outbox = scope.into_outcome().outbox;
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].topic, "out");
}

/// Collects what `tracing` writes while `f` runs on this thread.
fn capture_logs(f: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Buffer(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let bytes = buffer.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn oversized_log_lines_are_cut_and_the_call_succeeds() {
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let payload = PayloadLimits { max_log_line: 32, ..PayloadLimits::default() };
    let mut scope = harness.scope_with(1, payload);
    let text = "y".repeat(10_000);
    let logs = capture_logs(|| note(&mut *instance, &mut scope, &text).unwrap());
    let line = logs.lines().find(|line| line.contains("noted")).unwrap_or_else(|| panic!("no log line in {logs:?}"));
    assert!(line.contains(&format!("noted {}", "y".repeat(32 - "noted ".len()))), "{line}");
    assert!(line.contains("[…cut]"), "{line}");
    assert!(!line.contains(&"y".repeat(32)), "the line was not cut at 32 bytes: {line}");
    // The call succeeded: its write is kept in full.
    assert_eq!(scope.get("last").unwrap().map(|value| value.len()), Some(text.len() + 2));
}

#[test]
fn the_wasi_context_grants_no_environment_arguments_clock_files_or_network() {
    assert!(std::env::vars_os().count() > 0, "the host process has an environment to leak");
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let mut scope = harness.scope(1);
    instance.handle(&mut scope, PEEK, &body(json!({ "key": 1 }))).unwrap();
    let seen: serde_json::Value = serde_json::from_slice(&scope.get("surroundings").unwrap().unwrap()).unwrap();
    assert_eq!(seen["env_vars"], 0, "{seen}");
    assert_eq!(seen["args"], 0, "{seen}");
    assert_eq!(seen["wall_clock_secs"], 0, "the wall clock is not frozen at the epoch: {seen}");
    assert_eq!(seen["monotonic_nanos"], 0, "the monotonic clock moves: {seen}");
    for denied in ["read_root", "open_file", "tcp_connect", "name_lookup"] {
        assert!(seen[denied].get("Err").is_some(), "`{denied}` succeeded: {seen}");
    }
}

#[test]
fn the_call_budget_is_the_configured_one() {
    let harness = Harness::new();
    for budget_ms in [100, 500] {
        let budget = Duration::from_millis(budget_ms);
        let module = probe(SandboxLimits { call_budget: budget, ..limits() });
        let mut instance = module.instantiate().unwrap();
        let mut scope = harness.scope(1);
        let started = Instant::now();
        assert_trap(instance.handle(&mut scope, SPIN, &body(json!({ "key": 1 }))), "CPU budget");
        let elapsed = started.elapsed();
        assert!(elapsed + Duration::from_millis(20) >= budget, "a {budget:?} budget trapped after {elapsed:?}");
        assert!(elapsed < budget + Duration::from_secs(3), "a {budget:?} budget trapped after {elapsed:?}");
    }
}

#[test]
fn the_wasm_stack_limit_is_the_configured_one() {
    let harness = Harness::new();
    let recurse = body(json!({ "key": 1, "depth": 2_000 }));
    let roomy = probe(limits());
    roomy.instantiate().unwrap().handle(&mut harness.scope(1), RECURSE, &recurse).unwrap();
    let cramped = probe(SandboxLimits { max_wasm_stack: 16 << 10, ..limits() });
    assert_trap(cramped.instantiate().unwrap().handle(&mut harness.scope(1), RECURSE, &recurse), "stack overflow");
}

#[test]
fn table_and_instance_limits_are_enforced_at_instantiation() {
    let probe_bytes = std::fs::read(probe_wasm()).unwrap();
    for (what, limits) in [
        ("table", SandboxLimits { table_elements: 1, ..limits() }),
        ("instance", SandboxLimits { instances: 1, ..limits() }),
    ] {
        let sandbox = Sandbox::new(limits).unwrap();
        match sandbox.load("probe", &probe_bytes) {
            Err(error) => {
                let message = error.to_string();
                let LoadError::Instantiate { module, limits: shown, reason } = error else {
                    panic!("expected an instantiation error, got {message}")
                };
                assert_eq!((module.as_str(), *shown), ("probe", limits));
                assert!(reason.contains(what), "the reason does not name the {what} limit: {reason}");
                assert!(message.contains(&format!("1 {what}")), "the message does not show the limit: {message}");
            }
            Ok(_) => panic!("the probe loaded under a {what} limit of 1"),
        }
    }
}

const RAW: EventTypeTag = EventTypeTag::new(8);

/// A probe `Raw` event: `op` called `count` times straight through the
/// WIT imports (see the probe's docs).
fn raw(op: &str, count: u64, fields: serde_json::Value) -> Vec<Vec<u8>> {
    let mut event = json!({
        "key": 1, "op": op, "name": "n", "len": 1, "delta": 1, "topic": "out",
        "emit_key": [1, 2], "count": count, "ignore": false,
    });
    for (field, value) in fields.as_object().unwrap() {
        event[field] = value.clone();
    }
    body(event)
}

/// Runs a raw event and returns the message of the unrecoverable error the
/// probe makes of the first refusal.
fn refused(instance: &mut dyn HandlerInstance, scope: &mut KeyScope, bodies: &[Vec<u8>]) -> String {
    match instance.handle(scope, RAW, bodies) {
        Err(CallError::Handler { class: ErrorClass::Unrecoverable, message }) => message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn every_value_a_component_hands_an_import_is_checked_at_the_call() {
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let payload = PayloadLimits {
        max_state_value: 16,
        max_state_writes_per_call: 3,
        max_state_bytes_per_call: 40,
        max_counter_changes_per_call: 2,
        max_emit_body: 16,
        max_emits_per_call: 3,
        max_emit_bytes_per_call: 40,
        ..PayloadLimits::default()
    };
    let mut scope = harness.scope_with(1, payload);
    let canonical = Key::int(7).as_bytes().to_vec();
    let cases = [
        (raw("set", 1, json!({ "name": "" })), "0 accepted, then refused: name-length:"),
        (raw("get", 1, json!({ "name": "n".repeat(257) })), "0 accepted, then refused: name-length:"),
        (raw("counter-get", 1, json!({ "name": "" })), "0 accepted, then refused: name-length:"),
        (raw("set", 1, json!({ "len": 17 })), "0 accepted, then refused: state-value-size:"),
        (raw("set", 4, json!({ "name": "e{i}" })), "3 accepted, then refused: state-writes-per-call:"),
        (raw("delete", 4, json!({})), "3 accepted, then refused: state-writes-per-call:"),
        (raw("set", 3, json!({ "name": "e{i}", "len": 15 })), "2 accepted, then refused: state-bytes-per-call:"),
        (raw("counter-add", 3, json!({})), "2 accepted, then refused: counter-changes-per-call:"),
        (raw("counter-add", 2, json!({ "delta": i64::MAX })), "1 accepted, then refused: counter-range:"),
        (raw("counter-add", 2, json!({ "delta": i64::MIN })), "1 accepted, then refused: counter-range:"),
        (
            raw("emit", 1, json!({ "topic": "elsewhere", "emit_key": canonical })),
            "0 accepted, then refused: emit-topic:",
        ),
        (
            raw("emit", 1, json!({ "topic": "dlq_probes", "emit_key": canonical })),
            "0 accepted, then refused: emit-topic:",
        ),
        (
            raw("emit", 1, json!({ "topic": "retry_probes", "emit_key": canonical })),
            "0 accepted, then refused: emit-topic:",
        ),
        (raw("emit", 1, json!({ "emit_key": [1, 128, 0] })), "0 accepted, then refused: emit-key:"),
        (raw("emit", 1, json!({ "emit_key": [] })), "0 accepted, then refused: emit-key:"),
        (raw("emit", 1, json!({ "emit_key": canonical, "len": 0 })), "0 accepted, then refused: emit-body-size:"),
        (raw("emit", 1, json!({ "emit_key": canonical, "len": 17 })), "0 accepted, then refused: emit-body-size:"),
        (raw("emit", 4, json!({ "emit_key": canonical })), "3 accepted, then refused: emits-per-call:"),
        (raw("emit", 3, json!({ "emit_key": canonical, "len": 16 })), "1 accepted, then refused: emit-bytes-per-call:"),
    ];
    for (bodies, expected) in cases {
        let message = refused(&mut *instance, &mut scope, &bodies);
        assert!(message.starts_with(expected), "`{message}` does not start with `{expected}`");
    }
    let outcome = scope.into_outcome();
    assert!(outcome.writes.is_empty() && outcome.counters.is_empty() && outcome.outbox.is_empty());
}

#[test]
fn a_component_may_ignore_a_refusal_and_only_what_was_accepted_is_kept() {
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let payload = PayloadLimits { max_emits_per_call: 5, max_state_writes_per_call: 4, ..PayloadLimits::default() };
    let mut scope = harness.scope_with(1, payload);
    let key = Key::parse_text(r#"[7,"x"]"#).unwrap();
    // Ten thousand emits and writes, each past the limit refused and ignored.
    let flood = |op: &str| raw(op, 10_000, json!({ "ignore": true, "name": "e{i}", "emit_key": key.as_bytes() }));
    instance.handle(&mut scope, RAW, &flood("emit")).unwrap();
    instance.handle(&mut scope, RAW, &flood("set")).unwrap();
    let outcome = scope.into_outcome();
    assert_eq!(outbox_keys(&outcome.outbox), vec![key; 5]);
    assert_eq!(outcome.outbox[0].topic, "out");
    assert_eq!(outcome.writes.len(), 4);
}

fn outbox_keys(outbox: &[wakuwaku::storage::state::OutboxEntry]) -> Vec<Key> {
    outbox.iter().map(|entry| wakuwaku::event::EventHeaders::parse_stored(&entry.record.headers).unwrap().key).collect()
}

#[test]
fn a_flood_of_log_lines_keeps_the_limit_and_says_how_many_were_dropped() {
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let mut scope = harness.scope_with(1, PayloadLimits { max_log_lines_per_call: 10, ..PayloadLimits::default() });
    let logs = capture_logs(|| instance.handle(&mut scope, RAW, &raw("log", 5_000, json!({ "len": 3 }))).unwrap());
    let kept = logs.lines().filter(|line| line.contains("rrr")).count();
    assert_eq!(kept, 10, "{logs}");
    assert!(logs.contains("log-lines-per-call: 4990 more log lines of this call dropped"), "{logs}");
    assert!(logs.contains("key=1"), "the lines carry the key in its text form: {logs}");
}

#[test]
fn the_key_export_answers_canonical_bytes_and_handle_receives_them() {
    let module = probe(limits());
    assert_eq!(module.emits(), ["notes-out", "out"]);
    let mut instance = module.instantiate().unwrap();
    let body = serde_json::to_vec(&json!({ "key": 42, "text": "t", "emit_to": null })).unwrap();
    assert_eq!(instance.key(NOTE, &body), Ok(Key::int(42u64)));
    // `handle` receives the scope's key, whatever its shape.
    let harness = Harness::new();
    let key = Key::parse_text(r#"[7,"eur",{"bytes":"00ff"}]"#).unwrap();
    let payload = PayloadLimits::default();
    let reader = Arc::new(harness.store.reader().unwrap());
    let mut scope = KeyScope::new(key.clone(), reader, payload, BatchBudget::new(&payload));
    instance.handle(&mut scope, RAW, &raw("key", 1, json!({}))).unwrap();
    assert_eq!(scope.get("key"), Ok(Some(serde_json::to_vec(&key.to_string()).unwrap())));
}

#[test]
fn a_call_past_the_batch_budget_fails_retryable_and_the_next_batch_takes_it() {
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let payload = PayloadLimits {
        max_state_bytes_per_call: 64 << 10,
        max_emit_bytes_per_call: 64 << 10,
        max_batch_held: 1 << 20,
        ..PayloadLimits::default()
    };
    payload.check().unwrap();
    let budget = BatchBudget::new(&payload);
    let reader = Arc::new(harness.store.reader().unwrap());
    let write_60k = raw("set", 60, json!({ "name": "e{i}", "len": 1000 }));
    let mut failed = None;
    for key in 0..100u64 {
        let mut scope = KeyScope::new(Key::int(key), reader.clone(), payload, budget.clone());
        if let Err(error) = instance.handle(&mut scope, RAW, &write_60k) {
            failed = Some((key, error));
            break;
        }
    }
    let (key, error) = failed.expect("the batch budget stopped a call");
    assert!(matches!(error, CallError::BatchBudget { .. }), "{error}");
    assert_eq!(error.class(), ErrorClass::Retryable);
    assert!(key > 10, "the budget held {key} calls of 60 KB only");
    assert!(budget.held() <= 1 << 20);
    // A fresh batch takes the same call.
    let fresh = BatchBudget::new(&payload);
    let mut scope = KeyScope::new(Key::int(key), reader, payload, fresh);
    instance.handle(&mut scope, RAW, &write_60k).unwrap();
}

/// A hostile module's instance and a scope for key 1 over an empty store.
fn hostile(harness: &Harness) -> (Box<dyn HandlerInstance>, KeyScope) {
    let module = hostile_module(&Sandbox::new(limits()).unwrap());
    (module.instantiate().unwrap(), harness.scope(1))
}

/// WASI's random interfaces make the bytes in the host before the guest
/// has room for them: wasmtime-wasi would make 64 MiB per call, whatever
/// the module's memory limit. Past [`MAX_RANDOM_BYTES`] the call traps
/// naming the rule, and the next call works.
#[test]
fn random_bytes_are_made_at_most_max_random_bytes_a_call() {
    let harness = Harness::new();
    let (mut instance, mut scope) = hostile(&harness);
    for mode in ["secure", "insecure"] {
        let mut ask = |size: u64| {
            instance.handle(&mut scope, tag::RANDOM, &body(json!({ "key": 1, "mode": mode, "size": size })))
        };
        ask(MAX_RANDOM_BYTES).unwrap();
        for size in [MAX_RANDOM_BYTES + 1, 48 << 20, u64::MAX] {
            assert_trap(
                ask(size),
                &format!(
                    "random-size: one WASI call may ask for at most {MAX_RANDOM_BYTES} random bytes; this one asked for {size}"
                ),
            );
        }
        ask(16).unwrap();
    }
}

/// What a module hands an import, or returns from an export, is copied
/// out of its memory before any rule can look at it: wasmtime bounds that
/// copy per call (128 MiB by default), and the sandbox sets the bound from
/// the payload limits ([`PayloadLimits::most_lifted_per_call`]). A log line
/// or an error message as large as the largest value passes (and is cut);
/// one of 8 MiB fails its call as retryable naming `import-size` (the
/// instance is replaced), and the next call works.
#[test]
fn an_import_argument_past_the_hostcall_bound_traps_before_it_is_copied() {
    let harness = Harness::new();
    let (mut instance, mut scope) = hostile(&harness);
    let bound = PayloadLimits::default().most_lifted_per_call();
    assert!(bound < 2 << 20, "{bound}");
    let log_line = |size: u64| body(json!({ "key": 1, "n": 1, "size": size }));
    instance.handle(&mut scope, tag::LOG_FLOOD, &log_line(1 << 20)).unwrap();
    for (tag, size) in [(tag::LOG_FLOOD, 8 << 20), (tag::HUGE_ERROR, 8 << 20), (tag::LOG_FLOOD, bound as u64 + 1)] {
        let event = body(json!({ "key": 1, "n": 1, "size": size }));
        match instance.handle(&mut scope, tag, &event) {
            Err(error @ CallError::Contract(ContractError::ImportSize { limit })) => {
                assert_eq!(limit, bound);
                assert_eq!(error.class(), ErrorClass::Retryable);
                assert!(
                    error.to_string().contains(&format!(
                        "import-size: one import call, or an export's answer, may hand the host at most {bound} bytes"
                    )),
                    "{error}"
                );
            }
            other => panic!("{size} bytes of tag {tag:?}: expected import-size, got {other:?}"),
        }
    }
    match instance.handle(&mut scope, tag::HUGE_ERROR, &body(json!({ "key": 1, "size": 1 << 20 }))) {
        Err(CallError::Handler { message, .. }) => assert!(message.len() <= (4 << 10) + 16, "{}", message.len()),
        other => panic!("a 1 MiB message is the module's error, cut: {other:?}"),
    }
    instance.handle(&mut scope, tag::LOG_FLOOD, &log_line(16)).unwrap();
}

/// Random bytes are a function of the call (`runtime/wasi.rs`, stated in
/// the WIT): the same event on the same key gets the same bytes, on any
/// instance and however many calls came before; another key or body other
/// bytes; both random interfaces alike.
#[test]
fn random_bytes_are_the_same_for_the_same_call_and_differ_between_calls() {
    let harness = Harness::new();
    let (mut first, _) = hostile(&harness);
    let (mut second, _) = hostile(&harness);
    let ask = |instance: &mut Box<dyn HandlerInstance>, key: u64, mode: &str, seq: u64| -> String {
        let mut scope = harness.scope(key);
        let event = body(json!({ "key": key, "mode": mode, "size": 32, "seq": seq }));
        instance.handle(&mut scope, tag::RANDOM, &event).unwrap();
        let report: serde_json::Value = serde_json::from_slice(&scope.get("report").unwrap().unwrap()).unwrap();
        report["outcomes"][0].as_str().unwrap().to_owned()
    };
    for mode in ["secure", "insecure"] {
        let bytes = ask(&mut first, 1, mode, 0);
        assert!(bytes.starts_with("32 bytes "), "{bytes}");
        assert_eq!(ask(&mut first, 1, mode, 0), bytes, "{mode}: the same call again");
        assert_eq!(ask(&mut second, 1, mode, 0), bytes, "{mode}: the same call on another instance");
        assert_ne!(ask(&mut first, 2, mode, 0), bytes, "{mode}: another key");
        assert_ne!(ask(&mut first, 1, mode, 1), bytes, "{mode}: another body");
    }
}

/// Every WASI pollable, stream or error a module opens is an entry the
/// host keeps until the module drops it (wasmtime-wasi allows a million).
/// Past [`MAX_WASI_RESOURCES`] the call traps naming the rule; dropped
/// resources give their room back, and those a module leaks across calls
/// go with the instance the trap replaces.
#[test]
fn the_host_keeps_at_most_max_wasi_resources_of_an_instance() {
    let harness = Harness::new();
    let (mut instance, mut scope) = hostile(&harness);
    for mode in ["pollables", "streams"] {
        let mut open = |n: usize, leak: bool| {
            instance.handle(&mut scope, tag::HANDLES, &body(json!({ "key": 1, "mode": mode, "n": n, "leak": leak })))
        };
        for _ in 0..3 {
            open(MAX_WASI_RESOURCES / 4, false).unwrap();
        }
        assert_trap(open(MAX_WASI_RESOURCES + 1, false), "wasi-resources: the host keeps at most 1000");
        open(10, false).unwrap();
        open(MAX_WASI_RESOURCES / 4, true).unwrap();
        assert_trap(open(MAX_WASI_RESOURCES, false), "wasi-resources");
        open(MAX_WASI_RESOURCES / 4, false).unwrap();
    }
}

/// The host places a call's key and bodies in the module's memory through
/// the module's own allocator (`cabi_realloc`), and frees what a call
/// returned through its post-return function: both are the module's code.
/// An allocator that traps, spins, answers a pointer out of bounds or off
/// its alignment, or grows memory past the limit, and a post-return that
/// traps, each fail that call as a trap (retryable), within the CPU budget
/// (armed before the arguments are lowered), and the next call runs on a
/// fresh instance.
#[test]
fn a_hostile_allocator_or_post_return_fails_the_call_as_a_trap_and_the_next_call_runs() {
    let sandbox = Sandbox::new(limits()).unwrap();
    let module = hostile_module(&sandbox);
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let mut scope = harness.scope(1);
    let arm = |mode: &str| body(json!({ "key": 1, "mode": mode }));
    let one_body = vec![vec![b' '; ALLOC_TRIGGER]];
    let many_bodies = vec![b"{}".to_vec(); ALLOC_TRIGGER / 8];
    let attacks: [(&str, &Vec<Vec<u8>>, &str); 5] = [
        ("trap", &one_body, "unreachable"),
        ("loop", &one_body, "CPU budget"),
        ("out-of-bounds", &one_body, "realloc return: beyond end of memory"),
        ("misaligned", &many_bodies, "realloc return: result not aligned"),
        ("grow", &one_body, "growing memory"),
    ];
    for (mode, bodies, expected) in attacks {
        instance.handle(&mut scope, tag::ARM_ALLOCATOR, &arm(mode)).unwrap();
        let started = Instant::now();
        assert_trap(instance.handle(&mut scope, tag::BEHAVE, bodies), expected);
        assert!(started.elapsed() < Duration::from_secs(5), "{mode}: took {:?}", started.elapsed());
        instance.handle(&mut scope, tag::BEHAVE, &body(json!({ "key": 1 }))).unwrap();
    }
    // `combine` lowers its bodies the same way.
    instance.handle(&mut scope, tag::ARM_ALLOCATOR, &arm("trap")).unwrap();
    match instance.combine(tag::HUGE_COMBINE, &one_body) {
        Err(CallError::Trap { reason }) => assert!(reason.contains("unreachable"), "{reason}"),
        other => panic!("expected a trap, got {:?}", other.map(|body| body.len())),
    }
    // The post-return function runs after the result was read: its trap
    // fails the call all the same.
    assert_trap(instance.handle(&mut scope, tag::ARM_ALLOCATOR, &arm("post-return")), "unreachable");
    instance.handle(&mut scope, tag::BEHAVE, &body(json!({ "key": 1 }))).unwrap();
    let failed = instance.handle(&mut scope, tag::HUGE_ERROR, &body(json!({ "key": 1, "size": 10 })));
    assert!(matches!(failed, Err(CallError::Handler { .. })), "{failed:?}");

    // The sandbox counted each failure by its class on the module's
    // version (the console's figures): the spin ran out of time, the
    // growth of 4 GiB out of memory, the rest trapped.
    let usage = sandbox.usage().module("hostile");
    assert_eq!(usage.len(), 1);
    let figures = &usage[0];
    assert_eq!(figures.version, module.version());
    assert_eq!(
        figures.errors,
        vec![("handler", 1), ("trap", 5), ("time", 1), ("memory", 1), ("contract", 0), ("host", 0)],
        "{figures:?}"
    );
    assert!(figures.longest_us >= 200_000 && figures.longest_us < 5_000_000, "the spin took its budget: {figures:?}");
    assert!(figures.p99_us.unwrap() <= figures.longest_us);
    assert!(figures.memory_peak_bytes > 0 && figures.memory_peak_bytes <= 16 << 20, "{figures:?}");
    assert!(figures.instances >= 1 && figures.memory_bytes > 0, "{figures:?}");
    drop(instance);
    let dropped = &sandbox.usage().module("hostile")[0];
    assert_eq!(dropped.instances + 1, figures.instances, "a dropped instance gives its memory back: {dropped:?}");
}

/// A module of the current contract sets and cancels timers through the
/// import, within their rules, and the host fires them through `fire`: the
/// fired timers are gone from the key, a `fire` call may set later ones
/// only, and what it changes is staged as a `handle` call's is.
#[test]
fn timers_are_set_through_the_import_and_fired_through_the_export() {
    let module = probe(limits());
    let harness = Harness::new();
    let mut instance = module.instantiate().unwrap();
    let payload = PayloadLimits { max_timer_payload: 4, max_timers_per_key: 3, ..PayloadLimits::default() };
    let mut scope = harness.scope_with(1, payload);
    let set = |name: &str, at: i64, len: u64| raw("timer-set", 1, json!({ "name": name, "delta": at, "len": len }));
    let raw_call = |instance: &mut Box<dyn HandlerInstance>, scope: &mut KeyScope, bodies: Vec<Vec<u8>>| {
        instance.handle(scope, EventTypeTag::new(8), &bodies)
    };
    for (name, at) in [("chain", 10), ("self", 20), ("gone", 30)] {
        raw_call(&mut instance, &mut scope, set(name, at, 2)).unwrap();
    }
    raw_call(&mut instance, &mut scope, raw("timer-cancel", 1, json!({ "name": "gone" }))).unwrap();
    let refused = |result: Result<(), CallError>| match result {
        Err(CallError::Handler { message, .. }) => message,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(refused(raw_call(&mut instance, &mut scope, set("big", 40, 5))).contains("timer-payload-size:"));
    assert!(refused(raw_call(&mut instance, &mut scope, set("max", i64::MAX, 0))).contains("timer-time:"));
    raw_call(&mut instance, &mut scope, set("third", 50, 0)).unwrap();
    assert!(refused(raw_call(&mut instance, &mut scope, set("fourth", 60, 0))).contains("timers-per-key:"));

    let chain = scope.take_due(10).unwrap();
    assert_eq!(instance.fire(&mut scope, &chain), Ok(true));
    let selfish = scope.take_due(20).unwrap();
    assert_eq!(instance.fire(&mut scope, &selfish), Ok(true));
    assert_eq!(scope.get("fired"), Ok(Some(br#"["chain@10","self@20"]"#.to_vec())));
    let refusal: String = serde_json::from_slice(&scope.get("refused").unwrap().unwrap()).unwrap();
    assert!(refusal.contains("timer-at-firing:"), "{refusal}");
    let timers = scope.into_outcome().timers.expect("the timers changed").in_order();
    let pending: Vec<(&str, i64)> = timers.iter().map(|t| (t.name.as_str(), t.at)).collect();
    assert_eq!(pending, [("chain-next", 15), ("third", 50)], "fired ones are gone, the one `fire` set is there");
}

/// Through the consumer: the timers a batch's calls set are committed with
/// it, as the key's partition's, each key's replaced as a whole; a call
/// that fails keeps none of its timers, also those it set before the
/// refusal (its events are dead-lettered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_set_in_a_batch_are_committed_with_it_and_a_failed_calls_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let module = probe(limits());
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("probes", 2).await.unwrap();
    let raw = |key: u64, op: &str, name: &str, at: i64, count: u64| Outgoing {
        tag: EventTypeTag::new(8),
        body: serde_json::to_vec(&json!({
            "key": key, "op": op, "name": name, "len": 1, "delta": at, "topic": "out",
            "emit_key": [1], "count": count, "ignore": false,
        }))
        .unwrap(),
    };
    let events = vec![
        raw(1, "timer-set", "close", 5_000, 1),
        raw(2, "timer-set", "close", 3_000, 1),
        raw(1, "timer-set", "close", 7_000, 1), // moves key 1's timer
        raw(2, "timer-set", "t{i}", 9_000, 2),
        raw(2, "timer-cancel", "t0", 0, 1),
        // One call of key 3's two events (one run), refused on its second
        // set (a name of 129 bytes): the call fails, and its first timer
        // is not kept either.
        raw(3, "timer-set", "x", 1_000, 1),
        raw(3, "timer-set", &"y".repeat(129), 1_000, 1),
    ];
    publish::publish(&*log, "probes", module.clone(), events, None, 2).await.unwrap();
    let config = ConsumerConfig { batch_size: 3, ..Default::default() };
    let (summary, projection) =
        catch_up(&log, host_settings(dir.path(), "probe", "probes", vec![module], config)).await.unwrap();
    assert_eq!((summary.applied, summary.dead_lettered), (5, 2), "{summary:?}");
    let store = projection.store();
    let timers = |key: u64| -> Vec<(String, i64)> {
        let mut timers: Vec<(String, i64)> =
            store.reader().unwrap().timers(&Key::int(key)).unwrap().into_iter().map(|t| (t.name, t.at)).collect();
        timers.sort();
        timers
    };
    assert_eq!(timers(1), [("close".to_owned(), 7_000)]);
    assert_eq!(timers(2), [("close".to_owned(), 3_000), ("t1".to_owned(), 9_000)]);
    assert!(timers(3).is_empty(), "the failed call's timers are not kept");
    let summary = store.timer_summary(None).unwrap();
    assert_eq!((summary.pending, summary.next_at), (3, Some(3_000)));
    // Each key's timers belong to the partition its events are read from.
    for partition in 0..2 {
        let mut due: Vec<Key> =
            store.due_timers(partition, i64::MAX, 10).unwrap().into_iter().map(|(k, _)| k).collect();
        due.sort();
        let mut expected: Vec<Key> = [1u64, 2]
            .into_iter()
            .map(Key::int)
            .filter(|key| wakuwaku::event::partition_for(key.key_hash(), 2) == partition)
            .collect();
        expected.sort();
        assert_eq!(due, expected, "partition {partition}");
    }
}
