//! The WASM runtime: the sandbox that loads handler components and runs them.
//!
//! [`Sandbox`] is the one place that builds engines, linkers and stores, so
//! everything a module is allowed to do is decided here:
//!
//! - **Only the contract is linked.** The `state`, `emit` and `log`
//!   interfaces of `wit/handler.wit`, plus WASI with an empty context: no
//!   preopened directory, no environment, no arguments, no network, a frozen
//!   clock. A component that imports anything else is refused at load, and
//!   the error lists the imports.
//! - **Each instance has limits.** A memory limit (linear memories, tables
//!   and instances), a wasm stack limit and a CPU budget per call, enforced
//!   with epoch interruption: a background thread ticks the engine's epoch
//!   and every call (and every instantiation, which runs guest init code)
//!   re-arms its deadline first, because deadlines belong to the store.
//! - **A trap costs an instance, not the host.** After a trap an instance
//!   cannot be entered again; [`WasmInstance`] replaces itself from the
//!   pre-linked template before its next call. The trap's reason and the
//!   guest's last stderr output (where a panic message lands) are kept.
//! - **Compile once, instantiate cheaply.** A component is compiled and
//!   pre-linked once per [`WasmModule`]; instances come from that template
//!   and keep their store across calls.
//! - **A cached artifact is checked, never trusted.** With a compile cache
//!   ([`Sandbox::with_compile_cache`]) compiled components are kept on disk,
//!   keyed by the SHA-256 of the component and the engine's settings, and
//!   framed with the SHA-256 of the artifact itself. An entry that is
//!   corrupt, truncated or made by an incompatible engine is compiled again
//!   and rewritten; only an entry whose checksum matches reaches wasmtime's
//!   `deserialize` (which checks version and settings once more).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, Store, StoreLimits, StoreLimitsBuilder, Trap};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

use crate::event::{Algebra, EventAtomicOrdering, EventTypeTag, KeyHash};
use crate::handler::{
    CallError, Emitted, ErrorClass, EventType, HandlerInstance, HandlerModule, KeyScope, LogLevel, PayloadLimits,
};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "module",
    });
}

use bindings::exports::wakuwaku::handler::handler as guest;
use bindings::wakuwaku::handler::{emit, log, state, types};

/// The version of the WIT package this host implements.
pub const CONTRACT: &str = "wakuwaku:handler@0.1.0";

/// How often the epoch ticks; the CPU budget is rounded up to it.
const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Bytes of a guest's stderr kept for error reports (the tail of the call
/// that failed; where a Rust panic message lands).
const STDERR_TAIL: usize = 4 << 10;

/// Limits every instance runs under. All have defaults; see each field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxLimits {
    /// Most linear memory an instance may grow to, in bytes. Default 64 MiB.
    pub memory_bytes: usize,
    /// CPU time one call may take before it traps. Default 1 s. Measured in
    /// wall-clock epochs, so a busy machine counts against it too.
    #[serde(with = "millis")]
    pub call_budget: Duration,
    /// Most wasm stack a call may use, in bytes. Default 512 KiB.
    pub max_wasm_stack: usize,
    /// Most table elements an instance may have. Default 100 000.
    pub table_elements: usize,
    /// Most core instances one component instance may create. Default 100.
    pub instances: usize,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            memory_bytes: 64 << 20,
            call_budget: Duration::from_secs(1),
            max_wasm_stack: 512 << 10,
            table_elements: 100_000,
            instances: 100,
        }
    }
}

impl std::fmt::Display for SandboxLimits {
    /// One line naming every limit, e.g. for an error or a start-up banner.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let size = |bytes: usize| {
            if bytes != 0 && bytes.is_multiple_of(1 << 20) {
                format!("{} MiB", bytes >> 20)
            } else if bytes != 0 && bytes.is_multiple_of(1 << 10) {
                format!("{} KiB", bytes >> 10)
            } else {
                format!("{bytes} bytes")
            }
        };
        write!(
            f,
            "memory {}, CPU budget {} ms per call, wasm stack {}, {} table elements, {} instances",
            size(self.memory_bytes),
            self.call_budget.as_millis(),
            size(self.max_wasm_stack),
            self.table_elements,
            self.instances,
        )
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(value.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// Why a component could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The bytes are not a valid component (a core module, a truncated
    /// file, garbage).
    #[error("module `{module}` is not a valid WebAssembly component: {reason}")]
    Invalid {
        /// The module's name.
        module: String,
        /// What the compiler said.
        reason: String,
    },
    /// The component imports something outside the contract.
    #[error("module `{module}` imports what the host does not grant: {}", imports.join(", "))]
    ForbiddenImports {
        /// The module's name.
        module: String,
        /// The imports that are not granted.
        imports: Vec<String>,
    },
    /// The component does not export the contract's handler interface.
    #[error("module `{module}` does not export `{CONTRACT}` (is it built with the wakuwaku-guest SDK?): {reason}")]
    NotAHandler {
        /// The module's name.
        module: String,
        /// What the linker said.
        reason: String,
    },
    /// The component could not be instantiated: a limit of the sandbox
    /// (memory, table elements, instances, CPU budget) was hit while it set
    /// itself up, or its start-up code trapped.
    #[error("module `{module}` could not be instantiated within the sandbox limits ({limits}): {reason}")]
    Instantiate {
        /// The module's name.
        module: String,
        /// The limits it ran under.
        limits: SandboxLimits,
        /// What failed.
        reason: String,
    },
    /// `describe` failed or returned something unusable.
    #[error("module `{module}` failed to describe its event types: {reason}")]
    Describe {
        /// The module's name.
        module: String,
        /// Why.
        reason: String,
    },
    /// The engine could not be set up.
    #[error("the WebAssembly engine could not be configured: {0}")]
    Engine(String),
}

/// Compiles and instantiates handler components under [`SandboxLimits`].
///
/// Cloning is cheap; clones share the engine and linker.
#[derive(Clone)]
pub struct Sandbox {
    shared: Arc<Shared>,
    /// Where compiled components are kept between runs, if anywhere.
    cache: Option<Arc<Path>>,
}

struct Shared {
    engine: Engine,
    linker: Linker<StoreData>,
    limits: SandboxLimits,
    ticker_stop: Arc<AtomicBool>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.ticker_stop.store(true, AtomicOrdering::Relaxed);
    }
}

impl Sandbox {
    /// A sandbox with these limits; starts the epoch ticker thread.
    pub fn new(limits: SandboxLimits) -> Result<Self, LoadError> {
        let mut config = Config::new();
        config.epoch_interruption(true).max_wasm_stack(limits.max_wasm_stack).parallel_compilation(true);
        let engine = Engine::new(&config).map_err(|e| LoadError::Engine(format!("{e:#}")))?;

        let mut linker = Linker::<StoreData>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        bindings::Module::add_to_linker::<StoreData, HasSelf<StoreData>>(&mut linker, |data| data)
            .map_err(|e| LoadError::Engine(format!("{e:#}")))?;

        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(engine.weak(), ticker_stop.clone());
        Ok(Self { shared: Arc::new(Shared { engine, linker, limits, ticker_stop }), cache: None })
    }

    /// The same sandbox, keeping compiled components in `dir` (created when
    /// first written) so that loading a module seen before skips compiling.
    pub fn with_compile_cache(mut self, dir: &Path) -> Self {
        self.cache = Some(Arc::from(dir));
        self
    }

    /// The limits instances run under.
    pub fn limits(&self) -> &SandboxLimits {
        &self.shared.limits
    }

    /// Compiles a component, checks its imports, pre-links it and asks it
    /// to describe its event types.
    pub fn load(&self, name: &str, bytes: &[u8]) -> Result<WasmModule, LoadError> {
        let (component, from_cache) = self.compile(name, bytes)?;
        self.check_imports(name, &component)?;
        let pre = self
            .shared
            .linker
            .instantiate_pre(&component)
            .and_then(bindings::ModulePre::new)
            .map_err(|e| LoadError::NotAHandler { module: name.to_owned(), reason: format!("{e:#}") })?;
        let mut module = WasmModule {
            name: name.to_owned(),
            version: content_version(bytes),
            pre,
            sandbox: self.clone(),
            event_types: Vec::new(),
            from_cache,
        };
        let mut instance = module.instantiate_wasm().map_err(|error| LoadError::Instantiate {
            module: name.to_owned(),
            limits: self.shared.limits,
            reason: match error {
                CallError::Trap { reason } => reason,
                other => other.to_string(),
            },
        })?;
        module.event_types = instance
            .describe()
            .map_err(|error| LoadError::Describe { module: name.to_owned(), reason: error.to_string() })?;
        Ok(module)
    }

    /// Compiles `bytes`, or takes the compiled component from the cache;
    /// says which.
    fn compile(&self, name: &str, bytes: &[u8]) -> Result<(Component, bool), LoadError> {
        let engine = &self.shared.engine;
        let compile = || {
            Component::new(engine, bytes)
                .map_err(|e| LoadError::Invalid { module: name.to_owned(), reason: format!("{e:#}") })
        };
        let Some(dir) = &self.cache else { return Ok((compile()?, false)) };
        let path = dir.join(format!("{}-{}.cwasm", sha256_hex(bytes), self.engine_fingerprint()));
        match std::fs::read(&path).ok().map(|file| compile_cache::unframe(&file).map(<[u8]>::to_vec)) {
            Some(Some(artifact)) => {
                // SAFETY: the artifact's checksum matches the one written
                // beside it when this host serialized it, so these are bytes
                // `Component::serialize` produced; `deserialize` itself
                // refuses artifacts of another wasmtime version or settings.
                match unsafe { Component::deserialize(engine, &artifact) } {
                    Ok(component) => return Ok((component, true)),
                    Err(e) => tracing::warn!(
                        module = name,
                        "cached component {} is unusable, compiling: {e:#}",
                        path.display()
                    ),
                }
            }
            Some(None) => tracing::warn!(module = name, "cached component {} is corrupt, compiling", path.display()),
            None => {}
        }
        let component = compile()?;
        match component.serialize() {
            Ok(artifact) => {
                if let Err(e) = compile_cache::write(dir, &path, &artifact) {
                    tracing::warn!(module = name, "cannot write the compile cache {}: {e}", path.display());
                }
            }
            Err(e) => tracing::warn!(module = name, "cannot serialize the compiled component: {e:#}"),
        }
        Ok((component, false))
    }

    /// A short digest of everything in the engine's configuration that
    /// decides whether a compiled artifact can be reused.
    fn engine_fingerprint(&self) -> String {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.shared.engine.precompile_compatibility_hash().hash(&mut hasher);
        format!("{:016x}", hasher.finish())
    }

    fn check_imports(&self, name: &str, component: &Component) -> Result<(), LoadError> {
        let granted = |import: &str| {
            import.starts_with("wasi:")
                || ["state", "emit", "log", "types"]
                    .iter()
                    .any(|interface| import == format!("wakuwaku:handler/{interface}@0.1.0"))
        };
        let forbidden: Vec<String> = component
            .component_type()
            .imports(&self.shared.engine)
            .map(|(import, _)| import.to_owned())
            .filter(|import| !granted(import))
            .collect();
        if forbidden.is_empty() {
            Ok(())
        } else {
            Err(LoadError::ForbiddenImports { module: name.to_owned(), imports: forbidden })
        }
    }

    fn new_store(&self, module: &str) -> Store<StoreData> {
        let limits = &self.shared.limits;
        let stderr = stderr::Tail::new(STDERR_TAIL);
        let wasi = WasiCtx::builder()
            .stderr(stderr.clone())
            .wall_clock(FrozenClock)
            .monotonic_clock(FrozenClock)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let store_limits = StoreLimitsBuilder::new()
            .memory_size(limits.memory_bytes)
            .table_elements(limits.table_elements)
            .instances(limits.instances)
            .memories(limits.instances)
            .tables(limits.instances)
            .trap_on_grow_failure(true)
            .build();
        let data = StoreData {
            wasi,
            table: ResourceTable::new(),
            limits: store_limits,
            scope: None,
            stderr,
            module: module.to_owned(),
        };
        let mut store = Store::new(&self.shared.engine, data);
        store.limiter(|data| &mut data.limits);
        store.epoch_deadline_trap();
        store
    }

    fn deadline_ticks(&self) -> u64 {
        let budget = self.shared.limits.call_budget.as_nanos();
        budget.div_ceil(EPOCH_TICK.as_nanos()).max(1) as u64
    }
}

fn spawn_epoch_ticker(engine: wasmtime::EngineWeak, stop: Arc<AtomicBool>) {
    std::thread::Builder::new()
        .name("waku-epoch".into())
        .spawn(move || {
            while !stop.load(AtomicOrdering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                match engine.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => return,
                }
            }
        })
        .expect("spawning the epoch ticker thread");
}

/// A clock that never moves: modules get no time unless the host grants it.
struct FrozenClock;

impl HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// The content version of a module: the first 16 hex digits of the SHA-256
/// of its bytes. Equal files share a version; a changed file never does.
pub fn content_version(bytes: &[u8]) -> String {
    sha256_hex(bytes)[..16].to_owned()
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The on-disk frame of a cached artifact: a magic tag, the SHA-256 of the
/// artifact, the artifact.
mod compile_cache {
    use std::path::Path;

    use sha2::Digest;

    const MAGIC: &[u8; 8] = b"wakuCW01";

    /// The artifact inside `file`, if the frame and checksum are intact.
    pub(super) fn unframe(file: &[u8]) -> Option<&[u8]> {
        let rest = file.strip_prefix(MAGIC)?;
        let (checksum, artifact) = rest.split_at_checked(32)?;
        (sha2::Sha256::digest(artifact).as_slice() == checksum).then_some(artifact)
    }

    /// Writes `artifact` framed to `path`, through a temporary file and a
    /// rename, so a crash never leaves half an entry under the real name.
    pub(super) fn write(dir: &Path, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let mut framed = Vec::with_capacity(MAGIC.len() + 32 + artifact.len());
        framed.extend_from_slice(MAGIC);
        framed.extend_from_slice(&sha2::Sha256::digest(artifact));
        framed.extend_from_slice(artifact);
        let temporary = tempfile::NamedTempFile::new_in(dir)?;
        std::fs::write(temporary.path(), &framed)?;
        temporary.persist(path).map_err(|e| e.error)?;
        Ok(())
    }
}

/// What one store holds: the WASI context, limits, and the scope of the key
/// being handled (only during `handle`).
struct StoreData {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
    scope: Option<KeyScope>,
    stderr: stderr::Tail,
    module: String,
}

impl WasiView for StoreData {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

const NO_SCOPE: &str = "state is only available while handling events";

impl types::Host for StoreData {}

impl state::Host for StoreData {
    fn get(&mut self, name: String) -> Option<Vec<u8>> {
        self.scope.as_mut().and_then(|scope| scope.get(&name))
    }

    fn set(&mut self, name: String, value: Vec<u8>) -> Result<(), String> {
        self.scope.as_mut().ok_or_else(|| NO_SCOPE.to_owned())?.set(&name, value)
    }

    fn delete(&mut self, name: String) {
        if let Some(scope) = self.scope.as_mut() {
            scope.delete(&name);
        }
    }

    fn counter_add(&mut self, name: String, delta: i64) {
        if let Some(scope) = self.scope.as_mut() {
            scope.counter_add(&name, delta);
        }
    }

    fn counter_get(&mut self, name: String) -> i64 {
        self.scope.as_mut().map_or(0, |scope| scope.counter_get(&name))
    }
}

impl emit::Host for StoreData {
    fn emit(&mut self, message: types::Outgoing) -> Result<(), String> {
        let scope = self.scope.as_mut().ok_or_else(|| NO_SCOPE.to_owned())?;
        scope.emit(Emitted {
            topic: message.topic,
            headers: crate::event::EventHeaders {
                tag: EventTypeTag::new(message.tag),
                key_hash: message.key_hash,
                ordering: ordering_from_wit(message.ordering),
                algebra: algebra_from_wit(message.algebra),
            },
            body: message.body,
        })
    }
}

impl log::Host for StoreData {
    fn log(&mut self, level: log::Level, message: String) {
        let level = match level {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        match &self.scope {
            Some(scope) => scope.log(&self.module, level, &message),
            // Outside `handle` (describe, key, …) no scope sets the limit.
            None => {
                crate::handler::log_line(&self.module, None, level, &message, PayloadLimits::default().max_log_line)
            }
        }
    }
}

fn ordering_from_wit(ordering: types::Ordering) -> EventAtomicOrdering {
    match ordering {
        types::Ordering::Relaxed => EventAtomicOrdering::Relaxed,
        types::Ordering::Acquire => EventAtomicOrdering::Acquire,
        types::Ordering::Release => EventAtomicOrdering::Release,
        types::Ordering::AcqRel => EventAtomicOrdering::AcqRel,
    }
}

fn algebra_from_wit(algebra: types::Algebra) -> Algebra {
    match algebra {
        types::Algebra::NonAssociative => Algebra::NonAssociative,
        types::Algebra::Commutative => Algebra::Commutative,
        types::Algebra::Idempotent => Algebra::Idempotent,
        types::Algebra::IdempotentCommutative => Algebra::IdempotentCommutative,
        types::Algebra::Associative => Algebra::Associative,
    }
}

/// A compiled, pre-linked handler component.
pub struct WasmModule {
    name: String,
    version: String,
    pre: bindings::ModulePre<StoreData>,
    sandbox: Sandbox,
    event_types: Vec<EventType>,
    from_cache: bool,
}

impl WasmModule {
    /// Whether the compiled component came from the compile cache.
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    fn instantiate_wasm(&self) -> Result<WasmInstance, CallError> {
        let mut store = self.sandbox.new_store(&self.name);
        store.set_epoch_deadline(self.sandbox.deadline_ticks());
        match self.pre.instantiate(&mut store) {
            Ok(bindings) => Ok(WasmInstance { store, bindings, module: self.clone_handle(), poisoned: false }),
            Err(error) => Err(trap_error(&store, error)),
        }
    }

    fn clone_handle(&self) -> ModuleHandle {
        ModuleHandle { name: self.name.clone(), pre: self.pre.clone(), sandbox: self.sandbox.clone() }
    }
}

impl HandlerModule for WasmModule {
    fn name(&self) -> &str {
        &self.name
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn event_types(&self) -> &[EventType] {
        &self.event_types
    }

    fn instantiate(&self) -> Result<Box<dyn HandlerInstance>, CallError> {
        Ok(Box::new(self.instantiate_wasm()?))
    }
}

/// What an instance needs to replace itself after a trap.
struct ModuleHandle {
    name: String,
    pre: bindings::ModulePre<StoreData>,
    sandbox: Sandbox,
}

/// One instance of a [`WasmModule`], with its own store.
pub struct WasmInstance {
    store: Store<StoreData>,
    bindings: bindings::Module,
    module: ModuleHandle,
    poisoned: bool,
}

impl WasmInstance {
    /// Re-arms the CPU budget and replaces a trapped instance.
    fn prepare(&mut self) -> Result<(), CallError> {
        if self.poisoned {
            let mut store = self.module.sandbox.new_store(&self.module.name);
            store.set_epoch_deadline(self.module.sandbox.deadline_ticks());
            self.bindings = self.module.pre.instantiate(&mut store).map_err(|e| trap_error(&store, e))?;
            self.store = store;
            self.poisoned = false;
        }
        self.store.data().stderr.clear();
        self.store.set_epoch_deadline(self.module.sandbox.deadline_ticks());
        Ok(())
    }

    /// Runs one export call, turning traps into [`CallError::Trap`] and
    /// guest errors into [`CallError::Handler`].
    fn call<R>(
        &mut self,
        f: impl FnOnce(&guest::Guest, &mut Store<StoreData>) -> wasmtime::Result<Result<R, types::HandlerError>>,
    ) -> Result<R, CallError> {
        self.prepare()?;
        match f(self.bindings.wakuwaku_handler_handler(), &mut self.store) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(CallError::Handler { class: class_from_wit(error.class), message: error.message }),
            Err(error) => {
                self.poisoned = true;
                Err(trap_error(&self.store, error))
            }
        }
    }

    fn describe(&mut self) -> Result<Vec<EventType>, CallError> {
        let described = self.call(|guest, store| guest.call_describe(store).map(Ok))?;
        let mut event_types = Vec::with_capacity(described.len());
        for event_type in described {
            if event_type.max_batch == 0 {
                return Err(CallError::Host(format!("event type `{}` declares max-batch 0", event_type.name)));
            }
            if event_types.iter().any(|known: &EventType| known.tag.get() == event_type.tag) {
                return Err(CallError::Host(format!("tag {} is declared twice", event_type.tag)));
            }
            event_types.push(EventType {
                tag: EventTypeTag::new(event_type.tag),
                name: event_type.name,
                algebra: algebra_from_wit(event_type.algebra),
                max_batch: event_type.max_batch,
            });
        }
        Ok(event_types)
    }
}

impl HandlerInstance for WasmInstance {
    fn handle(&mut self, scope: &mut KeyScope, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<(), CallError> {
        // Replace a trapped instance first, so the scope moves into the
        // store that makes the call. The store is 'static, so the scope
        // moves in for the call and back out after it.
        self.prepare()?;
        let key = scope.key();
        self.store.data_mut().scope = Some(scope.take_for_call());
        let result = self.call(|guest, store| guest.call_handle(store, tag.get(), key, bodies));
        if let Some(taken) = self.store.data_mut().scope.take() {
            *scope = taken;
        }
        scope.finish_call(result)
    }

    fn combine(&mut self, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<Vec<u8>, CallError> {
        self.call(|guest, store| guest.call_combine(store, tag.get(), bodies))
    }

    fn key(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<KeyHash, CallError> {
        self.call(|guest, store| guest.call_key(store, tag.get(), body))
    }

    fn ordering(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<EventAtomicOrdering, CallError> {
        self.call(|guest, store| guest.call_ordering(store, tag.get(), body)).map(ordering_from_wit)
    }
}

fn class_from_wit(class: types::ErrorClass) -> ErrorClass {
    match class {
        types::ErrorClass::Transient => ErrorClass::Transient,
        types::ErrorClass::Retryable => ErrorClass::Retryable,
        types::ErrorClass::Unrecoverable => ErrorClass::Unrecoverable,
    }
}

/// Describes a wasmtime error as a trap: its kind, root cause, and the tail
/// of the guest's stderr (where a Rust panic message lands).
fn trap_error(store: &Store<StoreData>, error: wasmtime::Error) -> CallError {
    let kind = match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => "CPU budget exhausted (call deadline passed)".to_owned(),
        Some(Trap::StackOverflow) => "wasm stack overflow".to_owned(),
        Some(Trap::UnreachableCodeReached) => "unreachable executed (a panic or abort)".to_owned(),
        Some(trap) => trap.to_string(),
        None => format!("{}", error.root_cause()),
    };
    let stderr = store.data().stderr.contents();
    let stderr = stderr.trim();
    let reason = if stderr.is_empty() { kind } else { format!("{kind}; guest stderr: {stderr}") };
    CallError::Trap { reason }
}

/// The guest's stderr: keeps the last bytes written and never refuses a
/// write, so a chatty guest cannot fail by printing (Rust's `eprintln!`
/// panics when stderr fails) and a trap report shows the latest output.
mod stderr {
    use std::collections::VecDeque;
    use std::io;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use tokio::io::AsyncWrite;
    use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
    use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

    /// A shared, bounded tail of everything written.
    #[derive(Clone)]
    pub(super) struct Tail {
        bytes: Arc<Mutex<VecDeque<u8>>>,
        capacity: usize,
    }

    impl Tail {
        pub(super) fn new(capacity: usize) -> Self {
            Self { bytes: Arc::default(), capacity }
        }

        fn lock(&self) -> MutexGuard<'_, VecDeque<u8>> {
            self.bytes.lock().unwrap_or_else(|e| e.into_inner())
        }

        fn push(&self, data: &[u8]) {
            let mut bytes = self.lock();
            let data = &data[data.len().saturating_sub(self.capacity)..];
            let overflow = (bytes.len() + data.len()).saturating_sub(self.capacity);
            bytes.drain(..overflow);
            bytes.extend(data);
        }

        /// Forgets what was written (before each call).
        pub(super) fn clear(&self) {
            self.lock().clear();
        }

        /// What is kept, as text.
        pub(super) fn contents(&self) -> String {
            let bytes = self.lock();
            let (front, back) = bytes.as_slices();
            String::from_utf8_lossy(&[front, back].concat()).into_owned()
        }
    }

    impl IsTerminal for Tail {
        fn is_terminal(&self) -> bool {
            false
        }
    }

    impl StdoutStream for Tail {
        fn p2_stream(&self) -> Box<dyn OutputStream> {
            Box::new(self.clone())
        }

        fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
            Box::new(self.clone())
        }
    }

    impl OutputStream for Tail {
        fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
            self.push(&bytes);
            Ok(())
        }

        fn flush(&mut self) -> StreamResult<()> {
            Ok(())
        }

        fn check_write(&mut self) -> StreamResult<usize> {
            Ok(64 << 10)
        }
    }

    #[async_trait::async_trait]
    impl Pollable for Tail {
        async fn ready(&mut self) {}
    }

    impl AsyncWrite for Tail {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
            self.push(data);
            Poll::Ready(Ok(data.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn keeps_the_last_bytes_and_never_refuses() {
            let tail = Tail::new(8);
            let mut stream = tail.p2_stream();
            for chunk in ["0123", "4567", "89ab"] {
                stream.write(Bytes::from(chunk)).unwrap();
            }
            assert_eq!(tail.contents(), "456789ab");
            stream.write(Bytes::from("a longer line than the tail")).unwrap();
            assert_eq!(tail.contents(), "the tail");
            tail.clear();
            assert_eq!(tail.contents(), "");
        }
    }
}
