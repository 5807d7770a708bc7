//! What a handler can do during a call: state, counters, emit, log, timers.

use serde::Serialize;
use serde::de::DeserializeOwned;
use wakuwaku_core::key::Key;

use wakuwaku_core::timers::Timer;

use crate::event::Event;
use crate::types::{Algebra, EventAtomicOrdering, HandlerError, Level};

/// Why the host refused a value a handler handed it: the rule broken, as
/// text that starts with the rule's id (e.g. `state-value-size: …`; the
/// rules are in `wit/handler.wit` and [`wakuwaku_core::limits`]).
pub type Refusal = String;

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
/// keys of the projection. Every call but `log` may be refused, with a
/// [`Refusal`] naming the rule; a refused value is not kept.
pub trait HostApi {
    /// Reads an entry of the current key.
    fn get(&mut self, name: &str) -> Result<Option<Vec<u8>>, Refusal>;
    /// Writes an entry of the current key.
    fn set(&mut self, name: &str, value: &[u8]) -> Result<(), Refusal>;
    /// Removes an entry of the current key (no error if it is absent).
    fn delete(&mut self, name: &str) -> Result<(), Refusal>;
    /// Adds `delta` to a counter shared by every key; refused when the
    /// counter as this key sees it would leave the `i64` range.
    fn counter_add(&mut self, name: &str, delta: i64) -> Result<(), Refusal>;
    /// Reads a shared counter: its committed value plus this key's changes.
    fn counter_get(&mut self, name: &str) -> Result<i64, Refusal>;
    /// Queues a message for a declared topic, sent when the batch commits.
    fn emit(&mut self, message: Outgoing) -> Result<(), Refusal>;
    /// Writes a line to the host's log (cut and counted by the host; never
    /// fails).
    fn log(&mut self, level: Level, message: &str);
    /// Sets the current key's timer `name` at event time `at` with
    /// `payload` (a new one, or the one of that name moved). A host without
    /// timers refuses (`outside-handle`).
    fn timer_set(&mut self, name: &str, at: i64, payload: &[u8]) -> Result<(), Refusal> {
        let _ = (name, at, payload);
        Err(no_timers())
    }
    /// Cancels the current key's timer `name` (no error if there is none).
    fn timer_cancel(&mut self, name: &str) -> Result<(), Refusal> {
        let _ = name;
        Err(no_timers())
    }
    /// The current key's timer `name`, as this call sees it.
    fn timer_get(&mut self, name: &str) -> Result<Option<Timer>, Refusal> {
        let _ = name;
        Err(no_timers())
    }
}

/// What a host without timers answers.
fn no_timers() -> Refusal {
    "outside-handle: `timers` is not available on this host".to_owned()
}

/// A message a handler publishes to another topic, with the headers the
/// host writes for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The topic to publish to: one the module declares in
    /// [`export_module!`](crate::export_module) (`emits: [...]`).
    pub topic: String,
    /// The event type's tag.
    pub tag: u32,
    /// The event's key.
    pub key: Key,
    /// The ordering the event asks for.
    pub ordering: EventAtomicOrdering,
    /// The event type's algebra.
    pub algebra: Algebra,
    /// The encoded body.
    pub body: Vec<u8>,
}

impl Outgoing {
    /// The message for `event` on `topic`: tag, key, ordering and algebra
    /// come from the event. Fails (unrecoverably) when the event's key has
    /// no key shape.
    pub fn new<E: Event>(topic: impl Into<String>, event: &E) -> Result<Self, HandlerError> {
        Ok(Self {
            topic: topic.into(),
            tag: E::TYPE_TAG.get(),
            key: crate::module::__private::key_of(event)?,
            ordering: event.atomic_ordering(),
            algebra: E::ALGEBRA,
            body: event.encode(),
        })
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

/// A handler's view of the host during one call: the key being handled,
/// its state, the shared counters, emit and log.
///
/// Typed state entries are JSON. Writes become visible to later reads of the
/// same key at once and are committed with the batch; if the call fails,
/// they are discarded. A value the host refuses (see [`HostApi`]) is an
/// unrecoverable error naming the entry and the rule: the events go to the
/// dead-letter topic with it.
pub struct Context<'a> {
    host: &'a mut dyn HostApi,
    key: &'a Key,
}

/// A refusal as the error a handler returns.
fn refused(what: String, refusal: Refusal) -> HandlerError {
    HandlerError::unrecoverable(format!("{what}: {refusal}"))
}

impl<'a> Context<'a> {
    /// A context for a call about `key`.
    pub fn new(host: &'a mut dyn HostApi, key: &'a Key) -> Self {
        Self { host, key }
    }

    /// The key being handled.
    pub fn key(&self) -> &Key {
        self.key
    }

    /// Reads a JSON entry of the current key. An entry that does not decode
    /// as `T` is an unrecoverable error naming the entry.
    pub fn get<T: DeserializeOwned>(&mut self, name: &str) -> Result<Option<T>, HandlerError> {
        match self.get_bytes(name)? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                HandlerError::unrecoverable(format!(
                    "state entry `{name}` is not a valid {}: {e}",
                    std::any::type_name::<T>()
                ))
            }),
        }
    }

    /// Writes a JSON entry of the current key.
    pub fn set<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) -> Result<(), HandlerError> {
        let bytes = serde_json::to_vec(value)
            .map_err(|e| HandlerError::unrecoverable(format!("cannot encode state entry `{name}` as JSON: {e}")))?;
        self.set_bytes(name, &bytes)
    }

    /// Reads an entry of the current key as bytes.
    pub fn get_bytes(&mut self, name: &str) -> Result<Option<Vec<u8>>, HandlerError> {
        self.host.get(name).map_err(|refusal| refused(format!("cannot read state entry `{name}`"), refusal))
    }

    /// Writes an entry of the current key as bytes.
    pub fn set_bytes(&mut self, name: &str, value: &[u8]) -> Result<(), HandlerError> {
        self.host.set(name, value).map_err(|refusal| refused(format!("cannot write state entry `{name}`"), refusal))
    }

    /// Removes an entry of the current key (nothing happens if it is absent).
    pub fn delete(&mut self, name: &str) -> Result<(), HandlerError> {
        self.host.delete(name).map_err(|refusal| refused(format!("cannot delete state entry `{name}`"), refusal))
    }

    /// Adds `delta` (possibly negative) to a counter shared by every key.
    /// Counters are the only state shared across keys: additions commute, so
    /// keys handled at the same time lose no update. An addition that would
    /// take the counter, as this key sees it, out of the `i64` range is
    /// refused (`counter-range`), and nothing is added.
    pub fn counter_add(&mut self, name: &str, delta: i64) -> Result<(), HandlerError> {
        self.host
            .counter_add(name, delta)
            .map_err(|refusal| refused(format!("cannot add {delta} to counter `{name}`"), refusal))
    }

    /// Reads a shared counter: its committed value plus this key's changes.
    /// Other keys' changes in the same batch may or may not be included;
    /// "committed" is as of the batch's start, so changes other batches
    /// commit meanwhile (on this host or another sharing the state) show
    /// from the next batch on.
    pub fn counter_get(&mut self, name: &str) -> Result<i64, HandlerError> {
        self.host.counter_get(name).map_err(|refusal| refused(format!("cannot read counter `{name}`"), refusal))
    }

    /// Publishes `event` to `topic` when the batch commits; its headers (tag,
    /// key, ordering, algebra) come from the event. `topic` must be one the
    /// module declares (`emits: [...]` in
    /// [`export_module!`](crate::export_module)).
    pub fn emit<E: Event>(&mut self, topic: &str, event: &E) -> Result<(), HandlerError> {
        self.host
            .emit(Outgoing::new(topic, event)?)
            .map_err(|refusal| refused(format!("cannot emit {} to `{topic}`", E::NAME), refusal))
    }

    /// Sets the current key's timer `name` at event time `at` (ms since the
    /// Unix epoch), carrying `payload` as JSON to the call that fires it
    /// ([`OnTimers::fire`](crate::OnTimers::fire)): a new timer, or the one
    /// of that name moved. It fires once the projection's clock passes
    /// `at`, after every event of the key at or before `at` (see
    /// `docs/timers.md`). A refusal (`timers-per-key`, `timer-payload-size`,
    /// …) is an unrecoverable error naming the timer and the rule.
    pub fn set_timer<T: Serialize + ?Sized>(&mut self, name: &str, at: i64, payload: &T) -> Result<(), HandlerError> {
        let bytes = serde_json::to_vec(payload)
            .map_err(|e| HandlerError::unrecoverable(format!("cannot encode the payload of timer `{name}`: {e}")))?;
        self.set_timer_bytes(name, at, &bytes)
    }

    /// [`Context::set_timer`] with the payload as bytes.
    pub fn set_timer_bytes(&mut self, name: &str, at: i64, payload: &[u8]) -> Result<(), HandlerError> {
        self.host.timer_set(name, at, payload).map_err(|refusal| refused(format!("cannot set timer `{name}`"), refusal))
    }

    /// Cancels the current key's timer `name` (nothing happens if there is
    /// none).
    pub fn cancel_timer(&mut self, name: &str) -> Result<(), HandlerError> {
        self.host.timer_cancel(name).map_err(|refusal| refused(format!("cannot cancel timer `{name}`"), refusal))
    }

    /// The current key's timer `name`, if it is pending.
    pub fn timer(&mut self, name: &str) -> Result<Option<Timer>, HandlerError> {
        self.host.timer_get(name).map_err(|refusal| refused(format!("cannot read timer `{name}`"), refusal))
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
