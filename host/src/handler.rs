//! What the consumer calls: handler modules, their instances, and the
//! key-scoped view of state a call may touch.
//!
//! The consumer never sees WebAssembly. It sees a [`HandlerModule`] (the
//! event types a module declares, and a way to make instances) and a
//! [`HandlerInstance`] (something that can `handle`, `combine`, and answer
//! `key`/`ordering` for a body). The WASM runtime implements both; so can
//! native Rust code, which is how the benchmark compares the two inside the
//! same host.
//!
//! Rules kept here:
//! - **A call sees one key.** A [`KeyScope`] holds the state writes, counter
//!   changes and emitted messages of one key during one batch. Reads see the
//!   key's own earlier writes first, then the committed snapshot.
//! - **A failed call leaves no trace.** Writes of a call are staged and only
//!   join the key's buffer when the call succeeds ([`KeyScope::finish_call`]).
//! - **Limits are the host's.** Oversized state values, emits and log lines
//!   are refused with a message naming the limit, never truncated silently.

use std::fmt;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::event::{Algebra, EventAtomicOrdering, EventHeaders, EventTypeTag, KeyHash};
use crate::log::Record;
use crate::state::{EmitOrigin, KeyWrites, OutboxEntry, StateError, StateReader};

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
}

/// The kind of failure a handler reports; it decides where events go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorClass {
    /// May succeed right away: retried in place.
    Transient,
    /// May succeed later.
    Retryable,
    /// Will never succeed.
    Unrecoverable,
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Transient => "transient",
            Self::Retryable => "retryable",
            Self::Unrecoverable => "unrecoverable",
        })
    }
}

/// Why a call into a handler did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The handler returned an error.
    #[error("{class} handler error: {message}")]
    Handler {
        /// What kind of failure the handler reported.
        class: ErrorClass,
        /// The handler's message.
        message: String,
    },
    /// The guest trapped: a panic, out of CPU budget, a memory limit, a
    /// stack overflow. The instance is replaced before its next call.
    #[error("module trapped: {reason}")]
    Trap {
        /// What the trap was, with the guest's last stderr output if any.
        reason: String,
    },
    /// The module broke the contract (for example it returned a body for a
    /// type it does not declare, or a state read failed in the host).
    #[error("{0}")]
    Host(String),
}

impl CallError {
    /// The class that decides where the failed events go. A trap is
    /// retryable: the module may be fixed, or the limit raised.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Handler { class, .. } => *class,
            Self::Trap { .. } | Self::Host(_) => ErrorClass::Retryable,
        }
    }
}

/// A loaded module: what it declares and how to get an instance of it.
pub trait HandlerModule: Send + Sync {
    /// The module's name (its file stem for WASM modules).
    fn name(&self) -> &str;
    /// An identifier of this exact code, e.g. a content hash.
    fn version(&self) -> &str;
    /// The event types it handles.
    fn event_types(&self) -> &[EventType];
    /// A fresh instance, ready for calls.
    fn instantiate(&self) -> Result<Box<dyn HandlerInstance>, CallError>;
}

/// One instance of a module. Calls on one instance never overlap.
pub trait HandlerInstance: Send {
    /// Applies `bodies` (one type, one key, log order) to the key of `scope`.
    fn handle(&mut self, scope: &mut KeyScope, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<(), CallError>;
    /// Folds a run of an associative type into one body.
    fn combine(&mut self, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<Vec<u8>, CallError>;
    /// The key hash of a body.
    fn key(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<KeyHash, CallError>;
    /// The ordering a body asks for.
    fn ordering(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<EventAtomicOrdering, CallError>;
}

/// Size limits the host enforces on what a handler hands it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadLimits {
    /// Largest state value a handler may set, in bytes. Default 1 MiB.
    pub max_state_value: usize,
    /// Largest body a handler may emit, in bytes. Default 1 MiB.
    pub max_emit_body: usize,
    /// Longest log line kept, in bytes; longer ones are cut and marked.
    /// Default 4 KiB.
    pub max_log_line: usize,
}

impl Default for PayloadLimits {
    fn default() -> Self {
        Self { max_state_value: 1 << 20, max_emit_body: 1 << 20, max_log_line: 4 << 10 }
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

/// A message a handler wants published; see [`KeyScope::emit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// The target topic.
    pub topic: String,
    /// Its envelope.
    pub headers: EventHeaders,
    /// Its body.
    pub body: Vec<u8>,
}

/// The state one key sees while its events are handled in one batch.
///
/// It lives for one key and one batch: the consumer makes it, passes it to
/// every call for that key, and turns it into part of the batch's commit.
pub struct KeyScope {
    key: KeyHash,
    snapshot: Arc<StateReader>,
    limits: PayloadLimits,
    committed: Staged,
    call: Staged,
    host_fault: Option<StateError>,
    /// What emits of the next calls record as their origin.
    emit_origin: Option<EmitOrigin>,
}

/// Writes, counter changes and emits not yet committed.
#[derive(Default)]
struct Staged {
    writes: KeyWrites,
    counters: FxHashMap<String, i64>,
    outbox: Vec<OutboxEntry>,
}

impl Staged {
    fn absorb(&mut self, later: Staged) {
        self.writes.merge(later.writes);
        for (name, delta) in later.counters {
            *self.counters.entry(name).or_default() += delta;
        }
        self.outbox.extend(later.outbox);
    }
}

/// What a key's handling in one batch leaves to commit.
#[derive(Debug, Default)]
pub struct KeyOutcome {
    /// State writes of the key.
    pub writes: KeyWrites,
    /// Changes to shared counters.
    pub counters: FxHashMap<String, i64>,
    /// Messages to publish once the batch commits.
    pub outbox: Vec<OutboxEntry>,
}

impl KeyScope {
    /// A scope for `key` over a committed `snapshot`.
    pub fn new(key: KeyHash, snapshot: Arc<StateReader>, limits: PayloadLimits) -> Self {
        Self {
            key,
            snapshot,
            limits,
            committed: Staged::default(),
            call: Staged::default(),
            host_fault: None,
            emit_origin: None,
        }
    }

    /// The key being handled.
    pub fn key(&self) -> KeyHash {
        self.key
    }

    /// Moves the scope's contents out (to hand them to a `'static` store
    /// for one call), leaving an empty scope of the same key behind.
    pub(crate) fn take_for_call(&mut self) -> KeyScope {
        KeyScope {
            key: self.key,
            snapshot: self.snapshot.clone(),
            limits: self.limits,
            committed: std::mem::take(&mut self.committed),
            call: std::mem::take(&mut self.call),
            host_fault: self.host_fault.take(),
            emit_origin: self.emit_origin.take(),
        }
    }

    /// Names the call about to be made as the origin of what it emits
    /// ([`OutboxEntry::origin`]).
    pub fn set_emit_origin(&mut self, origin: EmitOrigin) {
        self.emit_origin = Some(origin);
    }

    /// Ends a call: its staged changes join the key's buffer when it
    /// succeeded and are dropped when it failed. A state read that failed in
    /// the host during the call turns success into [`CallError::Host`].
    pub fn finish_call(&mut self, result: Result<(), CallError>) -> Result<(), CallError> {
        let call = std::mem::take(&mut self.call);
        let result = match self.host_fault.take() {
            Some(fault) => Err(CallError::Host(format!("state read failed: {fault}"))),
            None => result,
        };
        if result.is_ok() {
            self.committed.absorb(call);
        }
        result
    }

    /// Everything the key's successful calls changed.
    pub fn into_outcome(self) -> KeyOutcome {
        let Staged { writes, counters, outbox } = self.committed;
        KeyOutcome { writes, counters, outbox }
    }

    /// Reads an entry of the key: this call's writes, then the batch's, then
    /// the committed state.
    pub fn get(&mut self, name: &str) -> Option<Vec<u8>> {
        for staged in [&self.call, &self.committed] {
            if let Some(value) = staged.writes.get(name) {
                return value.map(<[u8]>::to_vec);
            }
        }
        match self.snapshot.get(self.key, name) {
            Ok(value) => value,
            Err(fault) => {
                self.host_fault.get_or_insert(fault);
                None
            }
        }
    }

    /// Writes an entry of the key.
    pub fn set(&mut self, name: &str, value: Vec<u8>) -> Result<(), String> {
        if value.len() > self.limits.max_state_value {
            return Err(format!(
                "state value `{name}` has {} bytes, over the limit of {} bytes",
                value.len(),
                self.limits.max_state_value
            ));
        }
        self.call.writes.set(name, value);
        Ok(())
    }

    /// Removes an entry of the key.
    pub fn delete(&mut self, name: &str) {
        self.call.writes.delete(name);
    }

    /// Adds to a counter shared by all keys.
    pub fn counter_add(&mut self, name: &str, delta: i64) {
        *self.call.counters.entry(name.to_owned()).or_default() += delta;
    }

    /// A shared counter: committed value plus this key's changes.
    pub fn counter_get(&mut self, name: &str) -> i64 {
        let committed = match self.snapshot.counter(name) {
            Ok(value) => value,
            Err(fault) => {
                self.host_fault.get_or_insert(fault);
                0
            }
        };
        let own: i64 = [&self.call, &self.committed].iter().filter_map(|s| s.counters.get(name)).sum();
        committed.wrapping_add(own)
    }

    /// Queues a message for publication when the batch commits.
    pub fn emit(&mut self, message: Emitted) -> Result<(), String> {
        if message.body.len() > self.limits.max_emit_body {
            return Err(format!(
                "emitted body has {} bytes, over the limit of {} bytes",
                message.body.len(),
                self.limits.max_emit_body
            ));
        }
        self.call.outbox.push(OutboxEntry {
            topic: message.topic,
            partition_key: message.headers.key_hash,
            partition: None,
            record: Record { headers: message.headers.to_headers(), body: message.body },
            origin: self.emit_origin.clone(),
        });
        Ok(())
    }

    /// Writes a handler's log line through `tracing`, cut to the limit.
    pub fn log(&self, module: &str, level: LogLevel, message: &str) {
        log_line(module, Some(self.key), level, message, self.limits.max_log_line);
    }
}

/// Emits a handler's log line through `tracing`, cut at `max` bytes.
pub(crate) fn log_line(module: &str, key: Option<KeyHash>, level: LogLevel, message: &str, max: usize) {
    let mut cut = message.len().min(max);
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let ellipsis = if cut < message.len() { " […cut]" } else { "" };
    let message = &message[..cut];
    macro_rules! emit {
        ($level:ident) => {
            tracing::$level!(target: "waku::guest", module, key, "{message}{ellipsis}")
        };
    }
    match level {
        LogLevel::Trace => emit!(trace),
        LogLevel::Debug => emit!(debug),
        LogLevel::Info => emit!(info),
        LogLevel::Warn => emit!(warn),
        LogLevel::Error => emit!(error),
    }
}
