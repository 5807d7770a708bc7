//! The WASM runtime: the sandbox that loads handler components and runs them.
//!
//! [`Sandbox`] is the one place that builds engines, linkers and stores, so
//! everything a module is allowed to do is decided here:
//!
//! - **Only the contract is linked, one capability at a time.** Each import
//!   of `wit/handler-0.5.wit` is a unit of its own, with its rules: [`state`]
//!   (the key's entries and shared counters), [`emit`] (messages to the
//!   module's declared topics), [`log`] (diagnostics), [`timers`] (the
//!   key's event-time timers), and [`wasi`] (WASI
//!   with an empty context: no preopened directory, no environment, no
//!   arguments, no network, a frozen clock, stderr kept as a bounded tail,
//!   random bytes and live WASI resources bounded).
//!   One table ([`capabilities`]) links them and decides at load which
//!   imports a component may have: anything else (a WASI interface or
//!   version the linker lacks included) is refused, and the error lists
//!   the imports; a granted name imported with functions the host lacks is
//!   refused as an import mismatch. A component built for another version
//!   of the contract is refused with the versions named.
//! - **Modules of the previous contracts keep running.** A component built
//!   for `wakuwaku:handler@0.2.0`, `@0.3.0` or `@0.4.0` is recognised at
//!   load by the versions of its imports and export and bound with that
//!   version's bindings ([`contract_0_2`], [`contract_0_3`],
//!   [`contract_0_4`]): the same capabilities serve it; a 0.2 module's
//!   event types are all untimed, a 0.3 module's `timed` types are timed
//!   (in event-time order against each other), and a module before 0.5
//!   has no timers and is never asked to fire one. So
//!   a host upgrade never stops a pinned module version from running.
//! - **Every value crossing the boundary is checked.** What a module hands
//!   an import is checked at the call (the rules of
//!   [`wakuwaku_core::limits`], applied by the [`KeyScope`] of the call);
//!   a broken rule is a `refusal` the module sees. What its exports return
//!   is checked too: `describe` at load, `key` (canonical), `combine` (body
//!   size) and `handle` (its error message is cut to 4 KiB) at each call.
//! - **Host faults are not traps of the module.** When the host's state
//!   store fails under an import, the import traps the guest with a host
//!   fault (Spin's pattern: the outer result is the host's, the inner one
//!   the guest's), and the call fails as [`CallError::HostFault`], never as
//!   a [`CallError::Trap`] counted against the module.
//! - **Each instance has limits.** A memory limit (linear memories, tables
//!   and instances), a wasm stack limit and a CPU budget per call, enforced
//!   with epoch interruption: a background thread ticks the engine's epoch
//!   and every call (and every instantiation, which runs guest init code)
//!   re-arms its deadline first, because deadlines belong to the store.
//! - **Each version's calls are measured where they are made** ([`usage`]):
//!   every call's wall time and failure class, and every instance's
//!   memory, on atomics of the version's [`usage::VersionUsage`], which the
//!   sandbox's [`usage::UsageBoard`] keeps after the version is swapped
//!   out ([`Sandbox::usage`], [`HandlerModule::usage_board`]), with the
//!   last log lines of each module ([`log::LogBook`]).
//! - **A trap costs an instance, not the host.** After a trap an instance
//!   cannot be entered again; [`WasmInstance`] replaces itself from the
//!   pre-linked template before its next call. The trap's reason and the
//!   guest's last stderr output (where a panic message lands) are kept.
//! - **An instance whose memory passed its high-water mark is replaced.**
//!   Linear memory never shrinks, and a garbage-collected guest (a
//!   JavaScript engine, Python) grows its heap between collections and
//!   fragments it, so a long-lived instance creeps towards its limit over
//!   tens of thousands of calls, though no call needs much. Before a call,
//!   an instance holding more than [`high_water_mark`] (half of the room
//!   its limit left it when fresh, above what it held then) is dropped and
//!   a fresh one made from the pre-linked template (0.1 to 0.7 ms for a
//!   TypeScript module), and the module counts it
//!   ([`HandlerModule::take_instances_recycled`]). This is safe because an
//!   instance keeps nothing a call may rely on: a key's state, counters
//!   and timers are the host's, handed over through the imports at each
//!   call; random bytes are seeded per call; an instance is replaced after
//!   a trap and pooled instances are interchangeable anyway. If the fresh
//!   instance cannot be made (the host's memory is full), the call runs on
//!   the old one.
//! - **Compile once, instantiate cheaply.** A component is compiled and
//!   pre-linked once per [`WasmModule`]; instances come from that template
//!   and keep their store across calls.
//! - **Compiling is bounded too.** Size rules cannot bound what compiling
//!   a component costs, so once the process has a compiler program (the
//!   `waku` command is its own) it compiles in a child process under a CPU
//!   budget and a memory limit ([`compiler`]); a component past either is
//!   refused naming the rule, and the same bytes are not compiled again.
//! - **A cached artifact is checked, never trusted.** With a compile cache
//!   ([`Sandbox::with_compile_cache`]) compiled components are kept on disk,
//!   keyed by the SHA-256 of the component and the engine's settings, and
//!   framed with the SHA-256 of the artifact itself. An entry that is
//!   corrupt, truncated or made by an incompatible engine is compiled again
//!   and rewritten; only an entry whose checksum matches reaches wasmtime's
//!   `deserialize` (which checks version and settings once more). As an
//!   entry is native code, it is used only when it and the cache directory
//!   belong to the host's user and no one else may write them.
//! - **The compile cache stays under its size bound.** After each entry it
//!   writes, the least recently used entries (a hit makes an entry the most
//!   recently used) are removed until the cache holds at most its bound
//!   ([`Sandbox::with_compile_cache_max_bytes`], 1 GiB by default), except
//!   the entries of the versions this sandbox loaded last for each module
//!   (see `runtime/cache.rs`). A loaded module never reads its entry again, so removing
//!   one costs only a compile at the next load.
//!
//! Files: the capability units `state`, `emit`, `log`, `timers`, `wasi`
//! and the table that links them, `capabilities`; the adapters of the
//! older contracts, `contract_0_2`, `contract_0_3` and `contract_0_4`, and
//! what they share, `contract_adapter`; `instance_limits` bounds each instance's memories and
//! tables; `usage` counts each version's calls, failures and memory; `blocking` runs module code where blocking is allowed;
//! `compiler` compiles in a bounded child process; `cache` keeps compiled
//! artifacts on disk; `component_file` reads a component from disk within
//! its bounds.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wakuwaku_core::limits::{ContractError, check_combined_body, check_description, check_key, error_message};
use wasmtime::component::{Linker, ResourceTableError};
use wasmtime::{Config, Engine, Store, StoreLimitsBuilder, Trap};

use crate::event::{Algebra, EventAtomicOrdering, EventTiming, EventTypeTag};
use crate::key::Key;
use crate::sandbox::handler::{
    CallError, ErrorClass, EventType, HandlerInstance, HandlerModule, KeyScope, PayloadLimits,
};
use wakuwaku_core::timers::Timer;

pub(crate) mod blocking;
mod cache;
pub(crate) mod capabilities;
pub(crate) mod compiler;
pub mod component_file;
#[macro_use]
mod contract_adapter;
mod contract_0_2;
mod contract_0_3;
mod contract_0_4;
pub(crate) mod emit;
mod instance_limits;
pub mod log;
pub(crate) mod state;
pub(crate) mod timers;
pub mod usage;
pub mod wasi;

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/handler-0.5.wit",
        world: "module",
        // State reads may fail in the host; those imports trap with a host
        // fault instead of answering the guest.
        imports: { "wakuwaku:handler/state": trappable, "wakuwaku:handler/timers": trappable },
    });
}

use bindings::wakuwaku::handler::types;

/// The WIT package and version this host implements, read from
/// `wit/handler-0.5.wit`.
pub const CONTRACT: &str = wakuwaku_core::limits::CONTRACT;

/// The first version of the contract, which the host still loads
/// ([`contract_0_2`]).
pub const CONTRACT_0_2: &str = wakuwaku_core::limits::CONTRACT_0_2;

/// The version before `timed-relaxed`, which the host still loads
/// ([`contract_0_3`]).
pub const CONTRACT_0_3: &str = wakuwaku_core::limits::CONTRACT_0_3;

/// The version before timers, which the host still loads
/// ([`contract_0_4`]).
pub const CONTRACT_0_4: &str = wakuwaku_core::limits::CONTRACT_0_4;

/// How often the epoch ticks; the CPU budget is rounded up to it.
const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Limits every instance runs under. All have defaults; see each field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxLimits {
    /// Most linear memory an instance may grow to, in bytes, all its
    /// memories together (a component may define many). Default 64 MiB.
    pub memory_bytes: usize,
    /// CPU time one call may take before it traps. Default 1 s. Measured in
    /// wall-clock epochs, so a busy machine counts against it too.
    #[serde(with = "millis")]
    pub call_budget: Duration,
    /// Most wasm stack a call may use, in bytes. Default 512 KiB.
    pub max_wasm_stack: usize,
    /// Most table elements an instance may have, all its tables together.
    /// Default 100 000.
    pub table_elements: usize,
    /// Most core instances one component instance may create. Default 100.
    pub instances: usize,
    /// CPU time compiling one component may take, all compiler threads
    /// together, when it compiles in a child process
    /// ([`compiler`]); past it the component is refused
    /// (`component-compile-time`). Rounded up to whole seconds. Default
    /// 30 s (the Python bank example takes about 8 s).
    #[serde(with = "millis")]
    pub compile_budget: Duration,
    /// Most memory compiling one component may take in its child process,
    /// in bytes; past it the component is refused
    /// (`component-compile-memory`). Default 1 GiB (the Python bank example
    /// takes about 0.45 GiB).
    pub compile_memory_bytes: usize,
    /// Most linear memory all instances of the sandbox may hold together,
    /// in bytes, whatever modules, partitions and workers make them; a
    /// growth past it fails its call as [`CallError::HostMemory`]. Default
    /// 1 GiB.
    pub host_memory_bytes: usize,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            memory_bytes: 64 << 20,
            call_budget: Duration::from_secs(1),
            max_wasm_stack: 512 << 10,
            table_elements: 100_000,
            instances: 100,
            compile_budget: Duration::from_secs(30),
            compile_memory_bytes: 1 << 30,
            host_memory_bytes: 1 << 30,
        }
    }
}

impl SandboxLimits {
    /// The compile budget in whole seconds, as the child's `RLIMIT_CPU`
    /// counts it.
    pub fn compile_seconds(&self) -> u64 {
        self.compile_budget.as_secs() + u64::from(self.compile_budget.subsec_nanos() > 0)
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
            "memory {} ({} for all instances), CPU budget {} ms per call, wasm stack {}, {} table elements, {} \
             instances; compiling: {} s of CPU, memory {}",
            size(self.memory_bytes),
            size(self.host_memory_bytes),
            self.call_budget.as_millis(),
            size(self.max_wasm_stack),
            self.table_elements,
            self.instances,
            self.compile_seconds(),
            size(self.compile_memory_bytes),
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

/// The longest module name, in bytes.
pub const MAX_MODULE_NAME_BYTES: usize = 128;

/// Whether `name` may name a module (`module-name`): 1 to
/// [`MAX_MODULE_NAME_BYTES`] bytes of ASCII letters, digits, `_`, `-` and
/// `.`, not starting with `.`. Its kept versions are stored in a directory
/// of that name, so `..` (the stem of a file `...wasm`) would put them
/// outside the projection's, among another projection's.
pub fn is_module_name(name: &str) -> bool {
    (1..=MAX_MODULE_NAME_BYTES).contains(&name.len())
        && !name.starts_with('.')
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b'.'))
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
    /// The module's name (its file's stem) is not one the host can name
    /// files, logs and metrics after.
    #[error(
        "module-name: a module's name (its file's name without `.wasm`) is 1 to {MAX_MODULE_NAME_BYTES} bytes of \
         letters, digits, `_`, `-` and `.`, not starting with `.`; `{}` is not",
        wakuwaku_core::terminal::printable(module)
    )]
    Name {
        /// The name it was given.
        module: String,
    },
    /// The component was built for another version of the contract.
    #[error(
        "module `{module}` was built for {found}, but this host implements {CONTRACT} (and loads modules built \
         for {CONTRACT_0_4}, {CONTRACT_0_3} and {CONTRACT_0_2}); rebuild it with a wakuwaku-guest SDK for {CONTRACT}"
    )]
    ContractVersion {
        /// The module's name.
        module: String,
        /// The contract it uses.
        found: String,
    },
    /// The component imports something outside the contract.
    #[error(
        "module `{module}` imports what the host does not grant: {} (granted: {})",
        imports.join(", "),
        capabilities::granted()
    )]
    ForbiddenImports {
        /// The module's name.
        module: String,
        /// The imports that are not granted.
        imports: Vec<String>,
    },
    /// The component imports a granted interface, but with functions or
    /// types the host does not provide under that name (a WASI 0.2 patch
    /// version newer than the host's, or a forged interface).
    #[error("module `{module}` imports a granted interface in a form the host does not provide: {reason}")]
    ImportMismatch {
        /// The module's name.
        module: String,
        /// What the linker said (the import and what it lacks).
        reason: String,
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
        limits: Box<SandboxLimits>,
        /// What failed.
        reason: String,
    },
    /// Compiling the component in its child process broke a compile limit
    /// ([`compiler`]).
    #[error(
        "{}: compiling module `{module}` {}; it is refused{}",
        match limit {
            compiler::CompileLimit::Time => "component-compile-time",
            compiler::CompileLimit::Memory => "component-compile-memory",
            compiler::CompileLimit::Artifact { .. } => "component-artifact-size",
        },
        match limit {
            compiler::CompileLimit::Time => format!(
                "took more than its budget of {} s of CPU (the compile budget, `--compile-budget-s`)",
                limits.compile_seconds()
            ),
            compiler::CompileLimit::Memory => format!(
                "needed more than {} MiB of memory (the compile memory limit, `--compile-memory-mib`)",
                limits.compile_memory_bytes >> 20
            ),
            compiler::CompileLimit::Artifact { most } => format!(
                "made more than {most} bytes of native code and memory images (at most twice the component's size, \
                 plus the memory limit, plus 16 MiB)"
            ),
        },
        if *again { " (as before: the same bytes are not compiled again until the host restarts)" } else { "" }
    )]
    CompileLimit {
        /// The module's name.
        module: String,
        /// The limit it broke.
        limit: compiler::CompileLimit,
        /// The limits it was compiled under.
        limits: Box<SandboxLimits>,
        /// Whether the sandbox refused these bytes before, and did not
        /// compile them again.
        again: bool,
    },
    /// The compiler process failed for a reason of the host's (it could
    /// not be started, or it crashed), not of the component.
    #[error("module `{module}` could not be compiled: the compiler process failed: {reason}")]
    Compiler {
        /// The module's name.
        module: String,
        /// What failed.
        reason: String,
    },
    /// `describe` failed or returned something unusable; the reason names
    /// the rule it broke.
    #[error("module `{module}` failed to describe itself: {reason}")]
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

/// How many of a component's forbidden imports an error names.
const MOST_IMPORTS_NAMED: usize = 16;

impl LoadError {
    /// Whether these bytes would be refused again whatever the host's
    /// state: not for the compiler process, the engine, or an
    /// instantiation or `describe` call that may have met the host's
    /// memory or a busy machine.
    pub fn is_of_the_bytes(&self) -> bool {
        matches!(
            self,
            Self::Invalid { .. }
                | Self::Name { .. }
                | Self::ContractVersion { .. }
                | Self::ForbiddenImports { .. }
                | Self::ImportMismatch { .. }
                | Self::NotAHandler { .. }
                | Self::CompileLimit { .. }
        )
    }

    /// The same error with what it quotes of the component cut to 4 KiB
    /// per field and [`MOST_IMPORTS_NAMED`] imports of 256 bytes, the rest
    /// counted.
    fn bounded(self) -> Self {
        let cut = wakuwaku_core::limits::error_message;
        match self {
            Self::Invalid { module, reason } => Self::Invalid { module, reason: cut(reason) },
            Self::ContractVersion { module, found } => Self::ContractVersion { module, found: cut(found) },
            Self::ForbiddenImports { module, mut imports } => {
                let more = imports.len().saturating_sub(MOST_IMPORTS_NAMED);
                imports.truncate(MOST_IMPORTS_NAMED);
                for import in &mut imports {
                    if let (kept, true) = wakuwaku_core::limits::cut(import, 256) {
                        *import = format!("{kept}…");
                    }
                }
                if more > 0 {
                    imports.push(format!("and {more} more"));
                }
                Self::ForbiddenImports { module, imports }
            }
            Self::ImportMismatch { module, reason } => Self::ImportMismatch { module, reason: cut(reason) },
            Self::NotAHandler { module, reason } => Self::NotAHandler { module, reason: cut(reason) },
            Self::Instantiate { module, limits, reason } => Self::Instantiate { module, limits, reason: cut(reason) },
            Self::Describe { module, reason } => Self::Describe { module, reason: cut(reason) },
            Self::Compiler { module, reason } => Self::Compiler { module, reason: cut(reason) },
            other => other,
        }
    }
}

/// A host fault raised inside an import: it traps the guest, and the call
/// fails as [`CallError::HostFault`].
#[derive(Debug, thiserror::Error)]
#[error("host-fault: {0}")]
struct HostFault(String);

pub use compiler::compile_in_child_processes;

/// The default size bound of the compile cache: 1 GiB, some 30 versions of
/// a Python module (about 36 MB compiled) or hundreds of a Rust one.
pub const DEFAULT_COMPILE_CACHE_MAX_BYTES: u64 = 1 << 30;
pub use component_file::read_component;

/// Compiles and instantiates handler components under [`SandboxLimits`].
///
/// Cloning is cheap; clones share the engine and linker.
#[derive(Clone)]
pub struct Sandbox {
    shared: Arc<Shared>,
    /// Where compiled components are kept between runs, if anywhere.
    cache: Option<Arc<Path>>,
    /// The most bytes of entries the compile cache keeps.
    cache_max_bytes: u64,
    /// The payload limits of calls outside `handle` (inside it, the key
    /// scope's apply): log lines of any call, `combine`'s body.
    payload: PayloadLimits,
}

struct Shared {
    engine: Engine,
    linker: Linker<StoreData>,
    limits: SandboxLimits,
    ticker_stop: Arc<AtomicBool>,
    /// Components refused at a compile limit, by SHA-256: the same bytes
    /// are refused at once, not compiled again.
    over_compile_limits: Mutex<HashMap<String, compiler::CompileLimit>>,
    /// What every instance's memories draw on.
    host_memory: Arc<instance_limits::HostMemory>,
    /// The compile cache entries of the versions loaded last, which
    /// pruning leaves alone.
    cache_in_use: cache::InUse,
    /// Each loaded version's calls, failures and memory.
    usage: Arc<usage::UsageBoard>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.ticker_stop.store(true, AtomicOrdering::Relaxed);
    }
}

impl Sandbox {
    /// A sandbox with these limits and the default [`PayloadLimits`];
    /// starts the epoch ticker thread.
    pub fn new(limits: SandboxLimits) -> Result<Self, LoadError> {
        let engine = Engine::new(&engine_config(&limits)).map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        let mut linker = Linker::<StoreData>::new(&engine);
        capabilities::link(&mut linker).map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(engine.weak(), ticker_stop.clone());
        Ok(Self {
            shared: Arc::new(Shared {
                engine,
                linker,
                limits,
                ticker_stop,
                over_compile_limits: Mutex::default(),
                host_memory: instance_limits::HostMemory::new(limits.host_memory_bytes),
                cache_in_use: cache::InUse::default(),
                usage: Arc::new(usage::UsageBoard::new(limits.memory_bytes, limits.call_budget)),
            }),
            cache: None,
            cache_max_bytes: DEFAULT_COMPILE_CACHE_MAX_BYTES,
            payload: PayloadLimits::default(),
        })
    }

    /// The same sandbox, keeping compiled components in `dir` (created when
    /// first written) so that loading a module seen before skips compiling.
    pub fn with_compile_cache(mut self, dir: &Path) -> Self {
        self.cache = Some(Arc::from(dir));
        self
    }

    /// The same sandbox, keeping at most `bytes` of entries in its compile
    /// cache: after writing an entry it removes the least recently used
    /// ones past the bound (see the [module documentation](self)). Default
    /// [`DEFAULT_COMPILE_CACHE_MAX_BYTES`]. A bound below one entry keeps
    /// only the entries in use.
    pub fn with_compile_cache_max_bytes(mut self, bytes: u64) -> Self {
        self.cache_max_bytes = bytes;
        self
    }

    /// The same sandbox, with these payload limits for what calls outside
    /// `handle` hand the host: log lines of `describe`, `key`, `ordering`
    /// and `combine`, and the size of `combine`'s body. Give it the limits
    /// the consumer's key scopes use.
    pub fn with_payload_limits(mut self, payload: PayloadLimits) -> Self {
        self.payload = payload;
        self
    }

    /// The limits instances run under.
    pub fn limits(&self) -> &SandboxLimits {
        &self.shared.limits
    }

    /// The payload limits of calls outside `handle`.
    pub fn payload_limits(&self) -> &PayloadLimits {
        &self.payload
    }

    /// The calls, failures and memory of every module version this
    /// sandbox loaded (see [`usage`]).
    pub fn usage(&self) -> &Arc<usage::UsageBoard> {
        &self.shared.usage
    }

    /// Compiles a component (at most
    /// [`MAX_COMPONENT_BYTES`](component_file::MAX_COMPONENT_BYTES) and
    /// [`MAX_COMPONENT_FUNCTIONS`](component_file::MAX_COMPONENT_FUNCTIONS) of at most
    /// [`MAX_FUNCTION_BYTES`](component_file::MAX_FUNCTION_BYTES) each), checks
    /// its imports, pre-links it and asks it to describe itself (checking
    /// the answer).
    ///
    /// What an error quotes of the component (names, the compiler's and
    /// the linker's words about it) is cut to 4 KiB per field and 16
    /// imports, as it is logged and shown: a component of 500 import
    /// names of 99 KB each made a 49 MB message, logged again at every
    /// change of the module directory.
    pub fn load(&self, name: &str, bytes: &[u8]) -> Result<WasmModule, LoadError> {
        if !is_module_name(name) {
            // Not cut: a name that is no module name is at most a file
            // name, which the file system bounds.
            return Err(LoadError::Name { module: name.to_owned() });
        }
        self.load_named(name, bytes).map_err(LoadError::bounded)
    }

    fn load_named(&self, name: &str, bytes: &[u8]) -> Result<WasmModule, LoadError> {
        component_file::check_size(bytes.len() as u64)
            .and_then(|()| component_file::check_code(bytes).map(drop))
            .map_err(|e| LoadError::Invalid { module: name.to_owned(), reason: e.to_string() })?;
        let (component, from_cache) = cache::compile(self, name, bytes)?;
        let contract = capabilities::check_imports(&self.shared.engine, name, &component)?;
        // Linking checks imports before exports: a mismatch found here is
        // an import's, not a missing handler export.
        self.shared
            .linker
            .substituted_component_type(&component)
            .map_err(|e| LoadError::ImportMismatch { module: name.to_owned(), reason: format!("{e:#}") })?;
        let pre = self
            .shared
            .linker
            .instantiate_pre(&component)
            .and_then(|pre| match contract {
                capabilities::Contract::Current => bindings::ModulePre::new(pre).map(Pre::Current),
                capabilities::Contract::V0_4 => contract_0_4::bindings::ModulePre::new(pre).map(Pre::V0_4),
                capabilities::Contract::V0_3 => contract_0_3::bindings::ModulePre::new(pre).map(Pre::V0_3),
                capabilities::Contract::V0_2 => contract_0_2::bindings::ModulePre::new(pre).map(Pre::V0_2),
            })
            .map_err(|e| LoadError::NotAHandler { module: name.to_owned(), reason: format!("{e:#}") })?;
        let version = content_version(bytes);
        let mut module = WasmModule {
            handle: ModuleHandle {
                name: name.to_owned(),
                pre,
                sandbox: self.clone(),
                emits: Arc::from([]),
                recycled: Arc::default(),
                usage: self.shared.usage.version(name, &version),
            },
            version,
            event_types: Vec::new(),
            from_cache,
        };
        let mut instance = module.instantiate_wasm().map_err(|error| LoadError::Instantiate {
            module: name.to_owned(),
            limits: Box::new(self.shared.limits),
            reason: match error {
                CallError::Trap { reason } => reason,
                other => other.to_string(),
            },
        })?;
        let (event_types, emits) =
            instance.describe().map_err(|reason| LoadError::Describe { module: name.to_owned(), reason })?;
        module.event_types = event_types;
        module.handle.emits = emits.into();
        Ok(module)
    }

    /// A store for an instance of `module` (of the version `usage` counts,
    /// if given).
    fn new_store(
        &self,
        module: &str,
        emits: Arc<[String]>,
        usage: Option<&Arc<usage::VersionUsage>>,
    ) -> Store<StoreData> {
        let limits = &self.shared.limits;
        let store_limits = StoreLimitsBuilder::new()
            .memory_size(limits.memory_bytes)
            .table_elements(limits.table_elements)
            .instances(limits.instances)
            .memories(limits.instances)
            .tables(limits.instances)
            .trap_on_grow_failure(true)
            .build();
        let store_limits = instance_limits::InstanceLimits::new(
            store_limits,
            limits.memory_bytes,
            limits.table_elements,
            self.shared.host_memory.clone(),
        );
        let log = log::LogUnit::new(module, self.payload);
        let (store_limits, log) = match usage {
            Some(usage) => (store_limits.counted_in(usage.clone()), log.kept_for(usage.clone())),
            None => (store_limits, log),
        };
        let data = StoreData { wasi: wasi::WasiState::new(), limits: store_limits, scope: None, emits, log };
        let mut store = Store::new(&self.shared.engine, data);
        store.limiter(|data| &mut data.limits);
        store.epoch_deadline_trap();
        // What one import call may hand the host is bounded by the payload
        // limits, not by wasmtime's default of 128 MiB per call.
        store.set_hostcall_fuel(self.payload.most_lifted_per_call());
        store
    }

    fn deadline_ticks(&self) -> u64 {
        let budget = self.shared.limits.call_budget.as_nanos();
        budget.div_ceil(EPOCH_TICK.as_nanos()).max(1) as u64
    }
}

/// The engine's settings: the same in the host and in its compiler
/// processes, whose artifacts it deserializes.
fn engine_config(limits: &SandboxLimits) -> Config {
    let mut config = Config::new();
    config.epoch_interruption(true).max_wasm_stack(limits.max_wasm_stack).parallel_compilation(true);
    config
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

/// The content version of a module: the first 16 hex digits of the SHA-256
/// of its bytes. Equal files share a version; a changed file never does.
pub fn content_version(bytes: &[u8]) -> String {
    cache::sha256_hex(bytes)[..16].to_owned()
}

/// What one store holds: each capability's state, the store's limits, and
/// the scope of the key being handled (only during `handle`).
pub(crate) struct StoreData {
    wasi: wasi::WasiState,
    limits: instance_limits::InstanceLimits,
    /// The key scope of the `handle` call running; `None` in any other
    /// call, where `state` and `emit` refuse everything.
    scope: Option<KeyScope>,
    /// The topics the module declared it may emit to.
    emits: Arc<[String]>,
    log: log::LogUnit,
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

fn timing_from_wit(timing: types::Timing) -> EventTiming {
    match timing {
        types::Timing::Untimed => EventTiming::Untimed,
        types::Timing::Timed => EventTiming::Timed,
        types::Timing::TimedRelaxed => EventTiming::TimedRelaxed,
    }
}

fn class_from_wit(class: types::ErrorClass) -> ErrorClass {
    match class {
        types::ErrorClass::Transient => ErrorClass::Transient,
        types::ErrorClass::Retryable => ErrorClass::Retryable,
        types::ErrorClass::Unrecoverable => ErrorClass::Unrecoverable,
    }
}

/// A compiled, pre-linked handler component.
pub struct WasmModule {
    handle: ModuleHandle,
    version: String,
    event_types: Vec<EventType>,
    from_cache: bool,
}

impl WasmModule {
    /// Whether the compiled component came from the compile cache.
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    fn instantiate_wasm(&self) -> Result<WasmInstance, CallError> {
        let (store, bindings) = self.handle.instantiate()?;
        let fresh_memory = store.data().limits.memory_held();
        Ok(WasmInstance { store, bindings, module: self.handle.clone(), poisoned: false, fresh_memory })
    }
}

impl HandlerModule for WasmModule {
    fn name(&self) -> &str {
        &self.handle.name
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn event_types(&self) -> &[EventType] {
        &self.event_types
    }

    fn emits(&self) -> &[String] {
        &self.handle.emits
    }

    fn instantiate(&self) -> Result<Box<dyn HandlerInstance>, CallError> {
        Ok(Box::new(self.instantiate_wasm()?))
    }

    /// Not while the instances hold more than half of what the host lets
    /// them hold together: idle ones give their memory back to the calls
    /// that need it.
    fn keeps_idle_instances(&self) -> bool {
        let host = &self.handle.sandbox.shared.host_memory;
        host.held() <= host.limit() / 2
    }

    fn take_instances_recycled(&self) -> u64 {
        self.handle.recycled.swap(0, AtomicOrdering::Relaxed)
    }

    fn usage_board(&self) -> Option<Arc<usage::UsageBoard>> {
        Some(self.handle.sandbox.shared.usage.clone())
    }
}

/// The most linear memory an instance that held `fresh` bytes when made
/// may hold before its next call, under a limit of `limit` bytes: `fresh`
/// plus half the room above it. Past it, the instance is replaced by a
/// fresh one (see the [module documentation](self)). A module that fills
/// its limit at start-up is never replaced for it.
pub fn high_water_mark(fresh: usize, limit: usize) -> usize {
    fresh + limit.saturating_sub(fresh) / 2
}

/// A pre-linked component, bound with the bindings of the contract version
/// it was built for.
#[derive(Clone)]
enum Pre {
    /// [`CONTRACT`].
    Current(bindings::ModulePre<StoreData>),
    /// [`CONTRACT_0_3`].
    V0_3(contract_0_3::bindings::ModulePre<StoreData>),
    /// [`CONTRACT_0_4`].
    V0_4(contract_0_4::bindings::ModulePre<StoreData>),
    /// [`CONTRACT_0_2`].
    V0_2(contract_0_2::bindings::ModulePre<StoreData>),
}

/// The exports of one instance, by contract version.
enum Exports {
    Current(bindings::Module),
    V0_3(contract_0_3::bindings::Module),
    V0_4(contract_0_4::bindings::Module),
    V0_2(contract_0_2::bindings::Module),
}

impl Pre {
    fn instantiate(&self, store: &mut Store<StoreData>) -> wasmtime::Result<Exports> {
        match self {
            Self::Current(pre) => pre.instantiate(store).map(Exports::Current),
            Self::V0_3(pre) => pre.instantiate(store).map(Exports::V0_3),
            Self::V0_4(pre) => pre.instantiate(store).map(Exports::V0_4),
            Self::V0_2(pre) => pre.instantiate(store).map(Exports::V0_2),
        }
    }
}

/// What an instance needs to replace itself after a trap.
#[derive(Clone)]
struct ModuleHandle {
    name: String,
    pre: Pre,
    sandbox: Sandbox,
    emits: Arc<[String]>,
    /// Instances replaced at their memory's high-water mark, not yet
    /// taken by [`HandlerModule::take_instances_recycled`].
    recycled: Arc<AtomicU64>,
    /// This version's calls, failures and memory.
    usage: Arc<usage::VersionUsage>,
}

impl ModuleHandle {
    /// A fresh store and instance, its start-up code run under the CPU
    /// budget.
    fn instantiate(&self) -> Result<(Store<StoreData>, Exports), CallError> {
        let mut attempts = 1;
        loop {
            let mut store = self.sandbox.new_store(&self.name, self.emits.clone(), Some(&self.usage));
            store.set_epoch_deadline(self.sandbox.deadline_ticks());
            match blocking::off_async_runtime(|| self.pre.instantiate(&mut store)) {
                Ok(bindings) => return Ok((store, bindings)),
                // The first instance of a module makes its memory images,
                // sealing a memfd, which Linux refuses for a moment while
                // the pages just written are still referenced (EBUSY;
                // seen once under a full test run). wasmtime keeps no
                // failure there, so a fresh store tries again.
                Err(error) if attempts < 3 && is_busy(&error) => attempts += 1,
                Err(error) => return Err(call_failure(&store, error)),
            }
        }
    }
}

/// One instance of a [`WasmModule`], with its own store.
pub struct WasmInstance {
    store: Store<StoreData>,
    bindings: Exports,
    module: ModuleHandle,
    poisoned: bool,
    /// The linear memory the instance held when it was made.
    fresh_memory: usize,
}

impl WasmInstance {
    /// Replaces a trapped instance, or one past its memory's high-water
    /// mark, re-arms the CPU budget and starts the call's random bytes
    /// from `seed` ([`wasi::call_seed`]).
    fn prepare(&mut self, seed: u64) -> Result<(), CallError> {
        if self.poisoned {
            self.replace()?;
            self.poisoned = false;
        } else if self.past_high_water() && self.replace().is_ok() {
            self.module.recycled.fetch_add(1, AtomicOrdering::Relaxed);
        }
        self.store.data().wasi.clear_stderr();
        self.store.data().wasi.reseed(seed);
        self.store.set_epoch_deadline(self.module.sandbox.deadline_ticks());
        Ok(())
    }

    /// Whether the instance holds more linear memory than its
    /// [`high_water_mark`].
    fn past_high_water(&self) -> bool {
        let limit = self.module.sandbox.shared.limits.memory_bytes;
        self.store.data().limits.memory_held() > high_water_mark(self.fresh_memory, limit)
    }

    /// A fresh store and instance in place of this one; on failure, this
    /// one is kept.
    fn replace(&mut self) -> Result<(), CallError> {
        (self.store, self.bindings) = self.module.instantiate()?;
        self.fresh_memory = self.store.data().limits.memory_held();
        Ok(())
    }

    /// Runs one export call outside `handle`, its random bytes seeded with
    /// `seed`.
    fn call<R: Send>(
        &mut self,
        seed: u64,
        f: impl FnOnce(&Exports, &mut Store<StoreData>) -> wasmtime::Result<Result<R, types::HandlerError>> + Send,
    ) -> Result<R, CallError> {
        self.prepare(seed)?;
        let payload = self.module.sandbox.payload;
        self.store.data_mut().log.begin(None, payload);
        self.invoke(f)
    }

    /// Runs one export call on a prepared instance, turning guest errors
    /// into [`CallError::Handler`] (message cut to 4 KiB), host faults into
    /// [`CallError::HostFault`] and traps into [`CallError::Trap`], and
    /// counts it, its time and its failure's class, in its version's
    /// [`usage`].
    fn invoke<R: Send>(
        &mut self,
        f: impl FnOnce(&Exports, &mut Store<StoreData>) -> wasmtime::Result<Result<R, types::HandlerError>> + Send,
    ) -> Result<R, CallError> {
        self.store.data_mut().limits.take_refused();
        let (bindings, store) = (&self.bindings, &mut self.store);
        let (outcome, took) = blocking::off_async_runtime(|| {
            let started = std::time::Instant::now();
            let outcome = f(bindings, store);
            (outcome, started.elapsed())
        });
        let (result, failure) = match outcome {
            Ok(Ok(value)) => (Ok(value), None),
            Ok(Err(error)) => {
                let class = class_from_wit(error.class);
                (
                    Err(CallError::Handler { class, message: error_message(error.message) }),
                    Some(usage::Failure::Handler),
                )
            }
            Err(error) => {
                self.poisoned = true;
                let interrupted = matches!(error.downcast_ref::<Trap>(), Some(Trap::Interrupt));
                let refused = self.store.data_mut().limits.take_refused();
                let failure = call_failure(&self.store, error);
                let class = match &failure {
                    CallError::HostFault(_) => usage::Failure::Host,
                    CallError::Contract(_) => usage::Failure::Contract,
                    CallError::HostMemory { .. } => usage::Failure::Memory,
                    _ if interrupted => usage::Failure::Time,
                    _ if refused => usage::Failure::Memory,
                    _ => usage::Failure::Trap,
                };
                (Err(failure), Some(class))
            }
        };
        self.module.usage.call(took, failure);
        self.store.data_mut().log.finish();
        result
    }

    /// Asks the module what it handles and where it emits, and checks the
    /// answer against the rules of `module-info`.
    fn describe(&mut self) -> Result<(Vec<EventType>, Vec<String>), String> {
        let seed = wasi::call_seed("describe", 0, &[], &[] as &[&[u8]]);
        let info = self
            .call(seed, |exports, store| match exports {
                Exports::Current(m) => m.wakuwaku_handler_handler().call_describe(store).map(Ok),
                Exports::V0_4(m) => {
                    m.wakuwaku_handler_handler().call_describe(store).map(contract_0_4::module_info).map(Ok)
                }
                Exports::V0_3(m) => {
                    m.wakuwaku_handler_handler().call_describe(store).map(contract_0_3::module_info).map(Ok)
                }
                Exports::V0_2(m) => {
                    m.wakuwaku_handler_handler().call_describe(store).map(contract_0_2::module_info).map(Ok)
                }
            })
            .map_err(|error| error.to_string())?;
        let types = info.event_types.iter().map(|t| (t.tag, t.name.as_str(), t.max_batch));
        check_description(types, &info.emits).map_err(|error| error.to_string())?;
        let event_types = info
            .event_types
            .into_iter()
            .map(|t| EventType {
                tag: EventTypeTag::new(t.tag),
                name: t.name,
                algebra: algebra_from_wit(t.algebra),
                max_batch: t.max_batch,
                timing: timing_from_wit(t.timing),
            })
            .collect();
        Ok((event_types, info.emits))
    }
}

impl HandlerInstance for WasmInstance {
    fn handle(&mut self, scope: &mut KeyScope, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<(), CallError> {
        // Replace a trapped instance first, so the scope moves into the
        // store that makes the call. The store is 'static, so the scope
        // moves in for the call and back out after it.
        let key: Key = scope.key().clone();
        self.prepare(wasi::call_seed("handle", tag.get(), key.as_bytes(), bodies))?;
        let data = self.store.data_mut();
        data.log.begin(Some(key.clone()), *scope.limits());
        data.scope = Some(scope.take_for_call());
        let result = self.invoke(|exports, store| match exports {
            Exports::Current(m) => m.wakuwaku_handler_handler().call_handle(store, tag.get(), key.as_bytes(), bodies),
            Exports::V0_4(m) => {
                contract_0_4::answer(m.wakuwaku_handler_handler().call_handle(store, tag.get(), key.as_bytes(), bodies))
            }
            Exports::V0_3(m) => {
                contract_0_3::answer(m.wakuwaku_handler_handler().call_handle(store, tag.get(), key.as_bytes(), bodies))
            }
            Exports::V0_2(m) => {
                contract_0_2::answer(m.wakuwaku_handler_handler().call_handle(store, tag.get(), key.as_bytes(), bodies))
            }
        });
        if let Some(taken) = self.store.data_mut().scope.take() {
            *scope = taken;
        }
        scope.finish_call(result)
    }

    /// Calls `fire` with the key's due timers of one time; a module of an
    /// older contract has no `fire` (and no `timers` import): false, no
    /// call.
    fn fire(&mut self, scope: &mut KeyScope, timers: &[Timer]) -> Result<bool, CallError> {
        let Exports::Current(_) = &self.bindings else { return Ok(false) };
        let key: Key = scope.key().clone();
        let seeded: Vec<Vec<u8>> =
            timers.iter().map(|t| [t.name.as_bytes(), &t.at.to_le_bytes(), &t.payload].concat()).collect();
        let firing = timers.iter().map(|t| t.at).max();
        self.prepare(wasi::call_seed("fire", 0, key.as_bytes(), &seeded))?;
        let data = self.store.data_mut();
        data.log.begin(Some(key.clone()), *scope.limits());
        data.scope = Some(scope.take_for_call());
        if let Some(scope) = data.scope.as_mut() {
            scope.begin_firing(firing);
        }
        let timers: Vec<types::Timer> = timers
            .iter()
            .map(|t| types::Timer { name: t.name.clone(), at: t.at, payload: t.payload.clone() })
            .collect();
        let result = self.invoke(|exports, store| match exports {
            Exports::Current(m) => m.wakuwaku_handler_handler().call_fire(store, key.as_bytes(), &timers),
            _ => Ok(Ok(())),
        });
        if let Some(taken) = self.store.data_mut().scope.take() {
            *scope = taken;
        }
        scope.begin_firing(None);
        scope.finish_call(result).map(|()| true)
    }

    fn combine(&mut self, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<Vec<u8>, CallError> {
        let seed = wasi::call_seed("combine", tag.get(), &[], bodies);
        let body = self.call(seed, |exports, store| match exports {
            Exports::Current(m) => m.wakuwaku_handler_handler().call_combine(store, tag.get(), bodies),
            Exports::V0_4(m) => {
                contract_0_4::answer(m.wakuwaku_handler_handler().call_combine(store, tag.get(), bodies))
            }
            Exports::V0_3(m) => {
                contract_0_3::answer(m.wakuwaku_handler_handler().call_combine(store, tag.get(), bodies))
            }
            Exports::V0_2(m) => {
                contract_0_2::answer(m.wakuwaku_handler_handler().call_combine(store, tag.get(), bodies))
            }
        })?;
        check_combined_body(&self.module.sandbox.payload, &body)
            .inspect_err(|_| self.module.usage.failed_after(usage::Failure::Contract))?;
        Ok(body)
    }

    fn key(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<Key, CallError> {
        let seed = wasi::call_seed("key", tag.get(), &[], &[body]);
        let bytes = self.call(seed, |exports, store| match exports {
            Exports::Current(m) => m.wakuwaku_handler_handler().call_key(store, tag.get(), body),
            Exports::V0_4(m) => contract_0_4::answer(m.wakuwaku_handler_handler().call_key(store, tag.get(), body)),
            Exports::V0_3(m) => contract_0_3::answer(m.wakuwaku_handler_handler().call_key(store, tag.get(), body)),
            Exports::V0_2(m) => contract_0_2::answer(m.wakuwaku_handler_handler().call_key(store, tag.get(), body)),
        })?;
        Ok(check_key(&bytes).inspect_err(|_| self.module.usage.failed_after(usage::Failure::Contract))?)
    }

    fn ordering(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<EventAtomicOrdering, CallError> {
        let seed = wasi::call_seed("ordering", tag.get(), &[], &[body]);
        self.call(seed, |exports, store| match exports {
            Exports::Current(m) => m.wakuwaku_handler_handler().call_ordering(store, tag.get(), body),
            Exports::V0_4(m) => {
                contract_0_4::answer(m.wakuwaku_handler_handler().call_ordering(store, tag.get(), body))
                    .map(|answer| answer.map(contract_0_4::ordering))
            }
            Exports::V0_3(m) => {
                contract_0_3::answer(m.wakuwaku_handler_handler().call_ordering(store, tag.get(), body))
                    .map(|answer| answer.map(contract_0_3::ordering))
            }
            Exports::V0_2(m) => {
                contract_0_2::answer(m.wakuwaku_handler_handler().call_ordering(store, tag.get(), body))
                    .map(|answer| answer.map(contract_0_2::ordering))
            }
        })
        .map(ordering_from_wit)
    }

    /// A module of the 0.2 contract has no `event-time` export and no timed
    /// type: none.
    fn event_time(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<Option<i64>, CallError> {
        let seed = wasi::call_seed("event-time", tag.get(), &[], &[body]);
        self.call(seed, |exports, store| match exports {
            Exports::Current(m) => m.wakuwaku_handler_handler().call_event_time(store, tag.get(), body),
            Exports::V0_4(m) => {
                contract_0_4::answer(m.wakuwaku_handler_handler().call_event_time(store, tag.get(), body))
            }
            Exports::V0_3(m) => {
                contract_0_3::answer(m.wakuwaku_handler_handler().call_event_time(store, tag.get(), body))
            }
            Exports::V0_2(_) => Ok(Ok(None)),
        })
    }
}

/// Whether `error` is the OS saying a resource is busy for the moment
/// (EBUSY).
fn is_busy(error: &wasmtime::Error) -> bool {
    error
        .chain()
        .any(|cause| cause.downcast_ref::<std::io::Error>().and_then(std::io::Error::raw_os_error) == Some(libc::EBUSY))
}

/// Whether `error` is wasmtime refusing to copy more out of the instance
/// in one call than [`Store::set_hostcall_fuel`] allows (its error type is
/// private; its message is what it offers).
fn is_hostcall_bound(error: &wasmtime::Error) -> bool {
    error.chain().any(|cause| cause.to_string().contains("fuel allocated for hostcalls has been exhausted"))
}

/// What a failed call or instantiation was: a host fault raised by an
/// import, or a trap of the guest, described by its kind, root cause, and
/// the tail of the guest's stderr (where a Rust panic message lands).
fn call_failure(store: &Store<StoreData>, error: wasmtime::Error) -> CallError {
    if let Some(HostFault(fault)) = error.downcast_ref::<HostFault>() {
        return CallError::HostFault(fault.clone());
    }
    if is_hostcall_bound(&error) {
        return CallError::Contract(ContractError::ImportSize { limit: store.hostcall_fuel() });
    }
    if let Some(refusal) = store.data().limits.host_refusal() {
        let instance_limits::HostRefusal { held, adds, instance_held, limit } = refusal;
        return CallError::HostMemory { held, adds, instance_held, limit };
    }
    let kind = match error.downcast_ref::<Trap>() {
        None if matches!(error.downcast_ref(), Some(ResourceTableError::Full)) => wasi::too_many_resources(),
        Some(Trap::Interrupt) => "CPU budget exhausted (call deadline passed)".to_owned(),
        Some(Trap::StackOverflow) => "wasm stack overflow".to_owned(),
        Some(Trap::UnreachableCodeReached) => "unreachable executed (a panic or abort)".to_owned(),
        Some(trap) => trap.to_string(),
        None => format!("{}", error.root_cause()),
    };
    let stderr = stderr_reason(&store.data().wasi.stderr());
    let reason = if stderr.is_empty() { kind } else { format!("{kind}; guest stderr: {stderr}") };
    // Cut as a handler's message is: the stderr tail is the module's text.
    CallError::Trap { reason: wakuwaku_core::limits::error_message(reason) }
}

/// The guest's stderr tail as one line for a failure's reason: its lines
/// joined with spaces (a Rust panic's message follows its place on a line
/// of its own), without Rust's advice to set `RUST_BACKTRACE`, which a
/// module given no environment cannot follow.
fn stderr_reason(stderr: &str) -> String {
    let lines = stderr.lines().map(str::trim).filter(|line| !line.is_empty());
    let lines = lines.filter(|line| {
        !(line.starts_with("note: run with `RUST_BACKTRACE=") || line.starts_with("note: Some details are omitted"))
    });
    lines.collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_on_stderr_is_one_line_without_the_backtrace_advice() {
        let stderr = "\nthread '<unnamed>' panicked at src/lib.rs:10:5:\nboom\nnote: run with `RUST_BACKTRACE=1` \
                      environment variable to display a backtrace\n";
        assert_eq!(stderr_reason(stderr), "thread '<unnamed>' panicked at src/lib.rs:10:5: boom");
        assert_eq!(stderr_reason("  \n"), "");
    }

    #[test]
    fn a_host_fault_raised_in_an_import_fails_the_call_as_a_host_fault_not_a_trap() {
        let sandbox = Sandbox::new(SandboxLimits::default()).unwrap();
        let store = sandbox.new_store("m", Arc::from([]), None);
        // Wasmtime adds context (the wasm backtrace) on the way out.
        let fault = wasmtime::Error::new(HostFault("disk gone".into())).context("wasm backtrace");
        assert_eq!(call_failure(&store, fault), CallError::HostFault("disk gone".into()));
        let trap = wasmtime::Error::new(Trap::UnreachableCodeReached).context("wasm backtrace");
        assert!(matches!(call_failure(&store, trap), CallError::Trap { reason } if reason.contains("unreachable")));
    }

    #[test]
    fn the_high_water_mark_is_half_the_room_a_fresh_instance_had() {
        const MIB: usize = 1 << 20;
        assert_eq!(high_water_mark(9 * MIB, 64 * MIB), 9 * MIB + 55 * MIB / 2);
        assert_eq!(high_water_mark(0, 16 * MIB), 8 * MIB);
        // A module that fills its limit at start-up is never past it.
        assert_eq!(high_water_mark(64 * MIB, 64 * MIB), 64 * MIB);
        assert_eq!(high_water_mark(70 * MIB, 64 * MIB), 70 * MIB);
    }

    #[test]
    fn only_a_busy_resource_somewhere_in_the_chain_is_tried_again() {
        let os = |code| wasmtime::Error::new(std::io::Error::from_raw_os_error(code)).context("making memory images");
        assert!(is_busy(&os(libc::EBUSY)));
        assert!(!is_busy(&os(libc::ENOMEM)));
        assert!(!is_busy(&wasmtime::Error::new(Trap::UnreachableCodeReached)));
    }

    /// A component may hold many linear memories (a core module each, or
    /// several in one): the memory limit holds for all of them together,
    /// not for each.
    #[test]
    fn all_memories_of_an_instance_share_its_memory_limit() {
        let sandbox = Sandbox::new(SandboxLimits::default()).unwrap();
        // A core module of `memories` memories of 600 pages (37.5 MiB) each.
        let module = |memories: u8| {
            let mut bytes = vec![0, b'a', b's', b'm', 1, 0, 0, 0, 5, 1 + 3 * memories, memories];
            (0..memories).for_each(|_| bytes.extend([0x00, 0xd8, 0x04]));
            wasmtime::Module::new(&sandbox.shared.engine, &bytes).unwrap()
        };
        let mut store = sandbox.new_store("m", Arc::from([]), None);
        wasmtime::Instance::new(&mut store, &module(1), &[]).expect("one memory of 37.5 MiB fits");
        let mut store = sandbox.new_store("m", Arc::from([]), None);
        let error = wasmtime::Instance::new(&mut store, &module(2), &[]).expect_err("two make 75 MiB, over 64 MiB");
        assert!(format!("{error:#}").contains("memory"), "{error:#}");
    }
}
