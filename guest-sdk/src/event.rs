//! Events, their keys and the handlers that apply them.

use serde::Serialize;
use serde::de::DeserializeOwned;
use wakuwaku_core::key::{Key, KeyError};

use crate::context::Context;
use crate::types::{Algebra, EventAtomicOrdering, EventTiming, EventTypeTag, HandlerError};

/// What order is scoped to: one account, one order, one user.
///
/// Events with equal keys keep the order the spec promises and are handled
/// one call after another; events of different keys are independent. A key
/// travels as its canonical bytes (see the crate docs, "Keys"): the host
/// keeps them with every message, in state, and in retry and dead-letter
/// records, and two keys are the same exactly when their bytes are.
///
/// The default [`to_key`](PartitionKey::to_key) serializes the value with
/// serde ([`wakuwaku_core::key_serde::to_key`]): a newtype is its inner
/// value, a struct or tuple is a tuple of its fields, so
/// `#[derive(Serialize)] struct AccountId(u64)` has the bytes of `42u64`,
/// and of the integer 42 in any guest language. Changing a key type's shape
/// (adding a field, say) changes its bytes: the state of existing keys is
/// then no longer found.
///
/// ```
/// use serde::Serialize;
/// use wakuwaku_guest::PartitionKey;
///
/// #[derive(Serialize)]
/// struct AccountId(u64);
///
/// impl PartitionKey for AccountId {}
///
/// assert_eq!(AccountId(42).to_key().unwrap(), 42u64.to_key().unwrap());
/// assert_eq!(AccountId(42).to_key().unwrap().as_bytes(), [0x01, 0x54]);
/// ```
pub trait PartitionKey: Serialize {
    /// The key's canonical bytes. Fails for values of no key shape
    /// (floats, maps, options, enum variants with data).
    fn to_key(&self) -> Result<Key, KeyError> {
        wakuwaku_core::key_serde::to_key(self)
    }
}

macro_rules! partition_keys {
    ($($t:ty),* $(,)?) => { $(impl PartitionKey for $t {})* };
}
partition_keys!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, bool, char, String, str);

macro_rules! tuple_keys {
    ($(($($name:ident),+)),* $(,)?) => { $(impl<$($name: PartitionKey),+> PartitionKey for ($($name,)+) {})* };
}
tuple_keys!((A), (A, B), (A, B, C), (A, B, C, D));

impl<T: PartitionKey + ?Sized> PartitionKey for &T {
    fn to_key(&self) -> Result<Key, KeyError> {
        (**self).to_key()
    }
}

/// A [`Key`] is already canonical. (Inside another key type, a `Key`
/// field serializes as a byte string of its bytes, not as the key itself.)
impl PartitionKey for Key {
    fn to_key(&self) -> Result<Key, KeyError> {
        Ok(self.clone())
    }
}

/// One event type: a body schema with a tag, a name, an algebra, a key and a
/// per-message ordering.
///
/// Bodies are JSON by default ([`decode`](Event::decode) and
/// [`encode`](Event::encode)); override both to use another format.
pub trait Event: Serialize + DeserializeOwned {
    /// Unique among the event types of one topic; written into every
    /// message's header.
    const TYPE_TAG: EventTypeTag;
    /// A human name used in logs, metrics and errors.
    const NAME: &'static str;
    /// How the host may reduce a run of this type. Default: no reduction.
    const ALGEBRA: Algebra = Algebra::NonAssociative;
    /// The most events one handler call receives (at least 1). Default 256.
    const MAX_BATCH: u32 = 256;
    /// Whether this type's events carry an event time. Default
    /// [`EventTiming::Untimed`]: applied as they arrive. A
    /// [`EventTiming::Timed`] type implements
    /// [`event_time`](Event::event_time); its events are applied, per key,
    /// in event-time order across the projection's topics and against the
    /// key's events of other `Timed` types (see the crate docs, "Event
    /// time"). [`EventTiming::TimedRelaxed`] is timed too, but its events
    /// may move past the key's events of other timed types as their
    /// [`atomic_ordering`](Event::atomic_ordering) allows.
    const TIMING: EventTiming = EventTiming::Untimed;

    /// The key type that scopes this event's order.
    type Key: PartitionKey;

    /// The key of this message.
    fn key(&self) -> Self::Key;

    /// How this message orders itself against other event types of its key.
    /// It may depend on the message (one type modelling several
    /// transitions), but only on the message. Default: `Relaxed`.
    fn atomic_ordering(&self) -> EventAtomicOrdering {
        EventAtomicOrdering::Relaxed
    }

    /// When this event happened, in milliseconds since the Unix epoch
    /// (UTC), read from the event itself (never from a clock). Asked only
    /// when [`TIMING`](Event::TIMING) is timed, where
    /// `None` fails the publish (`event-time-declared`). Default: `None`.
    fn event_time(&self) -> Option<i64> {
        None
    }

    /// Folds a run of events (at least one, of one key, in log order) into
    /// one event that the handler treats exactly like the whole run. Called
    /// by the host only when [`ALGEBRA`](Event::ALGEBRA) is
    /// [`Algebra::Associative`]; the default fails as unrecoverable.
    fn combine(events: Vec<Self>) -> Result<Self, HandlerError> {
        drop(events);
        Err(HandlerError::unrecoverable(format!("{} is not associative", Self::NAME)))
    }

    /// Decodes a body. Default: JSON; a malformed body is an unrecoverable
    /// error naming the type.
    fn decode(bytes: &[u8]) -> Result<Self, HandlerError> {
        serde_json::from_slice(bytes)
            .map_err(|e| HandlerError::unrecoverable(format!("malformed {} body: {e}", Self::NAME)))
    }

    /// Encodes a body. Default: JSON.
    fn encode(&self) -> Vec<u8> {
        // Serializing plain data to JSON into memory fails only for maps with
        // non-string keys or a failing `Serialize` impl: bugs, not inputs.
        serde_json::to_vec(self).unwrap_or_else(|e| panic!("cannot encode {} as JSON: {e}", Self::NAME))
    }
}

/// Applies events of one type. A module type implements it once for each
/// event type it handles and lists them in
/// [`export_module!`](crate::export_module).
///
/// Every call gets events of one key and one type, in log order (after the
/// host's reduction), at most [`Event::MAX_BATCH`] of them. Calls for one key
/// never overlap. On error nothing the call wrote is kept, and the events go
/// where the error's class says.
pub trait Handler<E: Event> {
    /// Applies a chunk of events of one key.
    fn handle(ctx: &mut Context<'_>, events: &[E]) -> Result<(), HandlerError>;
}

/// Acts on a key's timers when the projection's clock passes them: a module
/// that sets timers ([`Context::set_timer`]) implements it and names itself
/// in [`export_module!`](crate::export_module) (`timers: MyModule`).
///
/// Every call gets the due timers of one key and one time, in name order;
/// they are no longer pending. It may read and write state, emit, log and
/// set timers later than these (`timer-at-firing`). On error nothing the
/// call wrote is kept.
pub trait OnTimers {
    /// Fires `timers`, all of the key of `ctx` and of one time.
    fn fire(ctx: &mut Context<'_>, timers: &[crate::Timer]) -> Result<(), HandlerError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct AccountId(u64);
    impl PartitionKey for AccountId {}

    #[derive(Serialize)]
    struct Holding {
        account: u64,
        currency: String,
    }
    impl PartitionKey for Holding {}

    #[test]
    fn newtypes_and_integers_of_every_width_share_their_bytes() {
        let expected = Key::int(42u64);
        assert_eq!(AccountId(42).to_key().unwrap(), expected);
        for key in
            [42u8.to_key(), 42u32.to_key(), 42i64.to_key(), 42usize.to_key(), <&u16 as PartitionKey>::to_key(&&42)]
        {
            assert_eq!(key.unwrap(), expected);
        }
        assert_eq!(true.to_key().unwrap(), Key::int(1));
        assert_eq!(expected.to_key().unwrap(), expected, "a Key is its own key");
    }

    #[test]
    fn structs_and_tuples_are_tuples() {
        let holding = Holding { account: 42, currency: "eur".into() }.to_key().unwrap();
        assert_eq!(holding, (42u64, "eur".to_owned()).to_key().unwrap());
        assert_eq!(holding.to_string(), r#"[42,"eur"]"#);
        assert_eq!("ann".to_key().unwrap().as_bytes(), b"\x02\x03ann");
    }
}
