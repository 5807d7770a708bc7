//! Unit-testing handlers natively, without WASM and without a host.
//!
//! [`MemoryHost`] keeps state, counters, emitted messages and log lines in
//! memory, and drives a module through the same byte path the component
//! uses: events are encoded, dispatched by tag through [`Module::handle`],
//! and decoded again.
//!
//! ```
//! # use serde::{Deserialize, Serialize};
//! # use wakuwaku_guest::{Context, Event, EventTypeTag, Handler, HandlerError};
//! # #[derive(Serialize, Deserialize)]
//! # struct Pinged { user: u64 }
//! # impl Event for Pinged {
//! #     const TYPE_TAG: EventTypeTag = EventTypeTag::new(1);
//! #     const NAME: &'static str = "Pinged";
//! #     type Key = u64;
//! #     fn key(&self) -> u64 { self.user }
//! # }
//! # struct Pings;
//! # impl Handler<Pinged> for Pings {
//! #     fn handle(ctx: &mut Context<'_>, events: &[Pinged]) -> Result<(), HandlerError> {
//! #         let n: u64 = ctx.get("pings")?.unwrap_or(0);
//! #         ctx.set("pings", &(n + events.len() as u64))
//! #     }
//! # }
//! # wakuwaku_guest::export_module!(Pings: Pinged);
//! use wakuwaku_guest::testing::MemoryHost;
//!
//! let mut host = MemoryHost::new();
//! host.handle::<Pings, _>(&[Pinged { user: 1 }, Pinged { user: 1 }, Pinged { user: 2 }]).unwrap();
//! assert_eq!(host.get::<u64>(&1u64, "pings"), Some(2));
//! assert_eq!(host.get::<u64>(&2u64, "pings"), Some(1));
//! ```

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::context::{HostApi, Outgoing};
use crate::event::{Event, Handler, PartitionKey};
use crate::module::Module;
use wakuwaku_core::reduce::{chunks, reduce};

use crate::types::{HandlerError, Level};

/// A line a handler logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// The key being handled when it was logged.
    pub key_hash: u64,
    /// Its level.
    pub level: Level,
    /// Its text.
    pub message: String,
}

/// An in-memory host for native tests: per-key state, shared counters,
/// emitted messages and log lines.
///
/// Like the real host, a failed call leaves no trace in state, counters or
/// emitted messages (its log lines are kept).
#[derive(Clone, Debug, Default)]
pub struct MemoryHost {
    state: BTreeMap<u64, BTreeMap<String, Vec<u8>>>,
    counters: BTreeMap<String, i64>,
    emitted: Vec<Outgoing>,
    logs: Vec<LogLine>,
    value_limit: Option<usize>,
}

impl MemoryHost {
    /// An empty host with no size limit on state values.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes writes of state values longer than `bytes` fail, as the host's
    /// size limit does.
    pub fn with_value_limit(mut self, bytes: usize) -> Self {
        self.value_limit = Some(bytes);
        self
    }

    /// Delivers `events` as they are, without reduction: consecutive events
    /// of one key form a run, cut into chunks of at most `E::MAX_BATCH`, and
    /// each chunk is encoded and handed to [`Module::handle`]. Stops at the
    /// first failing chunk; earlier chunks stay applied.
    pub fn handle<M, E>(&mut self, events: &[E]) -> Result<(), HandlerError>
    where
        M: Module + Handler<E>,
        E: Event,
    {
        for (key_hash, bodies) in runs(events) {
            self.deliver::<M>(E::TYPE_TAG.get(), E::MAX_BATCH, key_hash, &bodies)?;
        }
        Ok(())
    }

    /// Like [`handle`](Self::handle), but first reduces each run with `E`'s
    /// algebra with the host's own reduction (`wakuwaku_core::reduce`): an
    /// associative run of two or more events is folded into one with
    /// [`Module::combine`], an idempotent one loses adjacent duplicates, an
    /// idempotent-commutative one is sorted and loses all duplicates.
    pub fn handle_reduced<M, E>(&mut self, events: &[E]) -> Result<(), HandlerError>
    where
        M: Module + Handler<E>,
        E: Event,
    {
        let tag = E::TYPE_TAG.get();
        for (key_hash, bodies) in runs(events) {
            let bodies = reduce(E::ALGEBRA, bodies, |bodies| M::combine(tag, bodies))?;
            self.deliver::<M>(tag, E::MAX_BATCH, key_hash, &bodies)?;
        }
        Ok(())
    }

    fn deliver<M: Module>(
        &mut self,
        tag: u32,
        max_batch: u32,
        key_hash: u64,
        bodies: &[Vec<u8>],
    ) -> Result<(), HandlerError> {
        for chunk in chunks(bodies, max_batch) {
            self.handle_bodies::<M>(tag, key_hash, chunk)?;
        }
        Ok(())
    }

    /// One [`Module::handle`] call with encoded bodies, as the host makes it.
    /// On error, the call's state writes, counter changes and emitted
    /// messages are rolled back.
    pub fn handle_bodies<M: Module>(
        &mut self,
        tag: u32,
        key_hash: u64,
        bodies: &[Vec<u8>],
    ) -> Result<(), HandlerError> {
        let state = self.state.get(&key_hash).cloned();
        let counters = self.counters.clone();
        let emitted = self.emitted.len();
        let result = M::handle(&mut self.scope(key_hash), tag, key_hash, bodies);
        if result.is_err() {
            match state {
                Some(state) => self.state.insert(key_hash, state),
                None => self.state.remove(&key_hash),
            };
            self.counters = counters;
            self.emitted.truncate(emitted);
        }
        result
    }

    /// The [`HostApi`] of one key, to call [`Module::handle`] or build a
    /// [`Context`](crate::Context) by hand.
    pub fn scope(&mut self, key_hash: u64) -> KeyScope<'_> {
        KeyScope { host: self, key_hash }
    }

    /// A JSON state entry of `key`.
    ///
    /// # Panics
    ///
    /// If the entry exists but does not decode as `T`.
    pub fn get<T: DeserializeOwned>(&self, key: &impl PartitionKey, name: &str) -> Option<T> {
        let bytes = self.get_bytes(key.key_hash(), name)?;
        Some(
            serde_json::from_slice(bytes)
                .unwrap_or_else(|e| panic!("state entry `{name}` is not a valid {}: {e}", std::any::type_name::<T>())),
        )
    }

    /// Writes a JSON state entry of `key`, e.g. to start a test from a given
    /// read model.
    ///
    /// # Panics
    ///
    /// If `value` cannot be encoded as JSON.
    pub fn set<T: Serialize + ?Sized>(&mut self, key: &impl PartitionKey, name: &str, value: &T) {
        let bytes = serde_json::to_vec(value).expect("state value encodes as JSON");
        self.state.entry(key.key_hash()).or_default().insert(name.to_owned(), bytes);
    }

    /// A state entry of the key with hash `key_hash`, as bytes.
    pub fn get_bytes(&self, key_hash: u64, name: &str) -> Option<&[u8]> {
        self.state.get(&key_hash)?.get(name).map(Vec::as_slice)
    }

    /// The value of a shared counter (0 if never touched).
    pub fn counter(&self, name: &str) -> i64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// The messages emitted so far, in order.
    pub fn emitted(&self) -> &[Outgoing] {
        &self.emitted
    }

    /// The lines logged so far, in order.
    pub fn logs(&self) -> &[LogLine] {
        &self.logs
    }
}

/// Consecutive events of one key, encoded.
fn runs<E: Event>(events: &[E]) -> Vec<(u64, Vec<Vec<u8>>)> {
    let mut runs: Vec<(u64, Vec<Vec<u8>>)> = Vec::new();
    for event in events {
        let key_hash = event.key().key_hash();
        match runs.last_mut() {
            Some((last, bodies)) if *last == key_hash => bodies.push(event.encode()),
            _ => runs.push((key_hash, vec![event.encode()])),
        }
    }
    runs
}

/// [`MemoryHost`] seen by a call about one key; see [`MemoryHost::scope`].
#[derive(Debug)]
pub struct KeyScope<'a> {
    host: &'a mut MemoryHost,
    key_hash: u64,
}

impl HostApi for KeyScope<'_> {
    fn get(&mut self, name: &str) -> Option<Vec<u8>> {
        self.host.get_bytes(self.key_hash, name).map(<[u8]>::to_vec)
    }
    fn set(&mut self, name: &str, value: &[u8]) -> Result<(), String> {
        if let Some(limit) = self.host.value_limit.filter(|&limit| value.len() > limit) {
            return Err(format!("value of {} bytes exceeds the limit of {limit} bytes", value.len()));
        }
        self.host.state.entry(self.key_hash).or_default().insert(name.to_owned(), value.to_vec());
        Ok(())
    }
    fn delete(&mut self, name: &str) {
        if let Some(entries) = self.host.state.get_mut(&self.key_hash) {
            entries.remove(name);
        }
    }
    fn counter_add(&mut self, name: &str, delta: i64) {
        let counter = self.host.counters.entry(name.to_owned()).or_default();
        *counter = counter.wrapping_add(delta);
    }
    fn counter_get(&mut self, name: &str) -> i64 {
        self.host.counter(name)
    }
    fn emit(&mut self, message: Outgoing) -> Result<(), String> {
        self.host.emitted.push(message);
        Ok(())
    }
    fn log(&mut self, level: Level, message: &str) {
        self.host.logs.push(LogLine { key_hash: self.key_hash, level, message: message.to_owned() });
    }
}
