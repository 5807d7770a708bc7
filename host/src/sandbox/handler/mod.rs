//! What the consumer calls: handler modules, their instances, and the
//! key-scoped view of state a call may touch.
//!
//! The consumer never sees WebAssembly. It sees a [`HandlerModule`] (the
//! event types a module declares, the topics it may emit to, and a way to
//! make instances) and a [`HandlerInstance`] (something that can `handle`,
//! `combine`, and answer `key`/`ordering` for a body). The WASM runtime
//! implements both; so can native Rust code, which is how the benchmark
//! compares the two inside the same host.
//!
//! Layout, one concern per file:
//! - this file: the module view ([`HandlerModule`], [`HandlerInstance`],
//!   [`EventType`], [`Emitted`]);
//! - `error`: why a call fails ([`CallError`], [`ErrorClass`],
//!   [`ScopeError`]), and which failures count against a key;
//! - `budget`: what the batches in flight may hold ([`BatchBudget`]);
//! - `scope`: the state one key sees during a batch ([`KeyScope`]): where a
//!   value a call reads comes from, and how its writes, counter changes and
//!   emits are staged, checked and taken back;
//! - `quota`: the `counter-count` quota across batches ([`CounterQuota`]);
//! - `timer_quota`: the `timers-in-all` quota across batches
//!   ([`TimerQuota`]).

use serde::{Deserialize, Serialize};

use crate::event::{Algebra, EventAtomicOrdering, EventTiming, EventTypeTag};
use crate::key::Key;
pub use wakuwaku_core::limits;
pub use wakuwaku_core::limits::{ContractError, LimitsError, PayloadLimits, Refusal};

mod budget;
mod error;
mod quota;
mod scope;
mod timer_quota;
pub use budget::BatchBudget;
pub use error::{CallError, ErrorClass, ScopeError};
pub use quota::{BatchCounters, CounterQuota};
pub use scope::{KeyOutcome, KeyScope, ScopeShared};
pub use timer_quota::TimerQuota;

/// One event type as a module declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventType {
    /// Unique among the event types of one projection.
    pub tag: EventTypeTag,
    /// A human name for logs, metrics and errors.
    pub name: String,
    /// How runs of this type may be reduced.
    pub algebra: Algebra,
    /// The most events one `handle` call receives (at least 1).
    pub max_batch: u32,
    /// Whether its events carry an event time (WIT `event-type.timing`;
    /// every type of a module built for the 0.2 contract is untimed).
    /// Untimed when absent from a serialized form.
    #[serde(default)]
    pub timing: EventTiming,
}

/// A loaded module: what it declares and how to get an instance of it.
pub trait HandlerModule: Send + Sync {
    /// The module's name (its file stem for WASM modules).
    fn name(&self) -> &str;
    /// An identifier of this exact code, e.g. a content hash.
    fn version(&self) -> &str;
    /// The event types it handles.
    fn event_types(&self) -> &[EventType];
    /// The topics it declared it may emit to (WIT `module-info.emits`); an
    /// emit to any other topic is refused. None by default.
    fn emits(&self) -> &[String] {
        &[]
    }
    /// A fresh instance, ready for calls.
    fn instantiate(&self) -> Result<Box<dyn HandlerInstance>, CallError>;
    /// Whether instances a batch is done with are worth keeping for the
    /// next ones; when not, they and the idle ones are dropped. Yes by
    /// default.
    fn keeps_idle_instances(&self) -> bool {
        true
    }
    /// How many instances were replaced by fresh ones because their
    /// memory passed its high-water mark (see the runtime's module
    /// documentation) since the last time this was asked.
    /// None by default.
    fn take_instances_recycled(&self) -> u64 {
        0
    }
    /// The figures of every version of the sandbox this module runs in
    /// (calls, failures by class, call times, instance memory; see
    /// [`crate::sandbox::runtime::usage`]). None by default: a native
    /// module is not measured.
    fn usage_board(&self) -> Option<std::sync::Arc<crate::sandbox::runtime::usage::UsageBoard>> {
        None
    }
}

/// One instance of a module. Calls on one instance never overlap.
pub trait HandlerInstance: Send {
    /// Applies `bodies` (one type, one key, log order) to the key of `scope`.
    fn handle(&mut self, scope: &mut KeyScope, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<(), CallError>;
    /// Folds a run of an associative type into one body.
    fn combine(&mut self, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<Vec<u8>, CallError>;
    /// The key of a body, checked canonical.
    fn key(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<Key, CallError>;
    /// The ordering a body asks for.
    fn ordering(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<EventAtomicOrdering, CallError>;
    /// When the event of a body happened (ms since the Unix epoch), asked
    /// only about a timed type; none for an untimed one. A timed type's
    /// none is the caller's to refuse (`event-time-declared`).
    fn event_time(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<Option<i64>, CallError>;
    /// Fires the key's due `timers` of one time (in name order) for the key
    /// of `scope`; what the call changes is staged in the scope as a
    /// `handle` call's is. Returns whether the module has a `fire` export:
    /// one that has none (a module of an older contract, which has no
    /// `timers` import either) is not called.
    fn fire(&mut self, scope: &mut KeyScope, timers: &[wakuwaku_core::timers::Timer]) -> Result<bool, CallError> {
        let _ = (scope, timers);
        Ok(false)
    }
}

/// Severity of a line a handler logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something looks wrong.
    Warn,
    /// Something failed.
    Error,
}

/// A message a handler wants published, as it handed it over (the key not
/// yet checked); see [`KeyScope::emit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// The target topic.
    pub topic: String,
    /// Its event type.
    pub tag: EventTypeTag,
    /// Its key's canonical bytes (checked by [`KeyScope::emit`]).
    pub key: Vec<u8>,
    /// The ordering it asks for.
    pub ordering: EventAtomicOrdering,
    /// Its type's algebra.
    pub algebra: Algebra,
    /// Its body.
    pub body: Vec<u8>,
}
