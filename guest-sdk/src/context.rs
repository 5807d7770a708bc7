//! What a handler can do during a call: state, counters, emit, log.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::event::{Event, PartitionKey};
use crate::types::{Algebra, EventAtomicOrdering, HandlerError, Level};

/// The host's side of a handler call, as raw bytes: what the WIT imports
/// `state`, `emit` and `log` offer.
///
/// Handlers do not use it directly; [`Context`] wraps it with typed helpers.
/// Inside a WASM module it is implemented by calling the host's imports; in
/// native tests by [`testing::MemoryHost`](crate::testing::MemoryHost); a
/// native host (a benchmark, say) may implement it to call
/// [`Module::handle`](crate::Module::handle) without a sandbox.
///
/// State entries belong to the key being handled; counters are shared by all
/// keys of the projection.
pub trait HostApi {
    /// Reads an entry of the current key.
    fn get(&mut self, name: &str) -> Option<Vec<u8>>;
    /// Writes an entry of the current key; fails when the host's size limit
    /// is exceeded, with a message naming the limit.
    fn set(&mut self, name: &str, value: &[u8]) -> Result<(), String>;
    /// Removes an entry of the current key (no error if it is absent).
    fn delete(&mut self, name: &str);
    /// Adds `delta` to a counter shared by every key.
    fn counter_add(&mut self, name: &str, delta: i64);
    /// Reads a shared counter: its committed value plus this key's changes.
    fn counter_get(&mut self, name: &str) -> i64;
    /// Queues a message for another topic, sent when the batch commits;
    /// fails when the host's size limit is exceeded.
    fn emit(&mut self, message: Outgoing) -> Result<(), String>;
    /// Writes a line to the host's log.
    fn log(&mut self, level: Level, message: &str);
}

/// A message a handler publishes to another topic, with the headers the
/// host writes for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The topic to publish to.
    pub topic: String,
    /// The event type's tag.
    pub tag: u32,
    /// The hash of the event's key.
    pub key_hash: u64,
    /// The ordering the event asks for.
    pub ordering: EventAtomicOrdering,
    /// The event type's algebra.
    pub algebra: Algebra,
    /// The encoded body.
    pub body: Vec<u8>,
}

impl Outgoing {
    /// The message for `event` on `topic`: tag, key hash, ordering and
    /// algebra come from the event.
    pub fn new<E: Event>(topic: impl Into<String>, event: &E) -> Self {
        Self {
            topic: topic.into(),
            tag: E::TYPE_TAG.get(),
            key_hash: event.key().key_hash(),
            ordering: event.atomic_ordering(),
            algebra: E::ALGEBRA,
            body: event.encode(),
        }
    }

    /// Decodes the body as `E`; an unrecoverable error if the tag is not
    /// `E`'s or the body is malformed.
    pub fn decode<E: Event>(&self) -> Result<E, HandlerError> {
        if self.tag != E::TYPE_TAG.get() {
            return Err(HandlerError::unrecoverable(format!(
                "message has tag {}, {} has tag {}",
                self.tag,
                E::NAME,
                E::TYPE_TAG
            )));
        }
        E::decode(&self.body)
    }
}

/// A handler's view of the host during one call: the state of the key being
/// handled, the shared counters, emit and log.
///
/// Typed state entries are JSON. Writes become visible to later reads of the
/// same key at once and are committed with the batch; if the call fails,
/// they are discarded.
pub struct Context<'a> {
    host: &'a mut dyn HostApi,
    key_hash: u64,
}

impl<'a> Context<'a> {
    /// A context for a call about the key with hash `key_hash`.
    pub fn new(host: &'a mut dyn HostApi, key_hash: u64) -> Self {
        Self { host, key_hash }
    }

    /// The hash of the key being handled.
    pub fn key_hash(&self) -> u64 {
        self.key_hash
    }

    /// Reads a JSON entry of the current key. An entry that does not decode
    /// as `T` is an unrecoverable error naming the entry.
    pub fn get<T: DeserializeOwned>(&mut self, name: &str) -> Result<Option<T>, HandlerError> {
        match self.host.get(name) {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                HandlerError::unrecoverable(format!(
                    "state entry `{name}` is not a valid {}: {e}",
                    std::any::type_name::<T>()
                ))
            }),
        }
    }

    /// Writes a JSON entry of the current key. Exceeding the host's size
    /// limit is an unrecoverable error.
    pub fn set<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) -> Result<(), HandlerError> {
        let bytes = serde_json::to_vec(value)
            .map_err(|e| HandlerError::unrecoverable(format!("cannot encode state entry `{name}` as JSON: {e}")))?;
        self.set_bytes(name, &bytes)
    }

    /// Reads an entry of the current key as bytes.
    pub fn get_bytes(&mut self, name: &str) -> Option<Vec<u8>> {
        self.host.get(name)
    }

    /// Writes an entry of the current key as bytes. Exceeding the host's
    /// size limit is an unrecoverable error.
    pub fn set_bytes(&mut self, name: &str, value: &[u8]) -> Result<(), HandlerError> {
        self.host
            .set(name, value)
            .map_err(|e| HandlerError::unrecoverable(format!("cannot write state entry `{name}`: {e}")))
    }

    /// Removes an entry of the current key (nothing happens if it is absent).
    pub fn delete(&mut self, name: &str) {
        self.host.delete(name);
    }

    /// Adds `delta` (possibly negative) to a counter shared by every key.
    /// Counters are the only state shared across keys: additions commute, so
    /// keys handled at the same time lose no update.
    pub fn counter_add(&mut self, name: &str, delta: i64) {
        self.host.counter_add(name, delta);
    }

    /// Reads a shared counter: its committed value plus this key's changes.
    /// Other keys' changes in the same batch may or may not be included.
    pub fn counter_get(&mut self, name: &str) -> i64 {
        self.host.counter_get(name)
    }

    /// Publishes `event` to `topic` when the batch commits; its headers (tag,
    /// key hash, ordering, algebra) come from the event. Exceeding the
    /// host's size limit is an unrecoverable error.
    pub fn emit<E: Event>(&mut self, topic: &str, event: &E) -> Result<(), HandlerError> {
        self.host
            .emit(Outgoing::new(topic, event))
            .map_err(|e| HandlerError::unrecoverable(format!("cannot emit {} to `{topic}`: {e}", E::NAME)))
    }

    /// Writes a line to the host's log.
    pub fn log(&mut self, level: Level, message: &str) {
        self.host.log(level, message);
    }

    /// Writes a debug line to the host's log.
    pub fn debug(&mut self, message: &str) {
        self.log(Level::Debug, message);
    }

    /// Writes an info line to the host's log.
    pub fn info(&mut self, message: &str) {
        self.log(Level::Info, message);
    }

    /// Writes a warning to the host's log.
    pub fn warn(&mut self, message: &str) {
        self.log(Level::Warn, message);
    }
}
