//! Events, their keys and the handlers that apply them.

use std::hash::{Hash, Hasher};

use serde::Serialize;
use serde::de::DeserializeOwned;
use siphasher::sip::SipHasher13;

use crate::context::Context;
use crate::types::{Algebra, EventAtomicOrdering, EventTypeTag, HandlerError};

/// What order is scoped to: one account, one order, one user.
///
/// Events with equal keys keep the order the spec promises and are handled
/// one call after another; events of different keys are independent. The
/// log carries only [`key_hash`](PartitionKey::key_hash), a 64-bit hash of
/// the key, in every message's header: the host plans, partitions and stores
/// state by that number and never sees the key itself.
///
/// The default `key_hash` is [`stable_hash`] of the [`Hash`] impl (SipHash-1-3
/// with zero keys, integers fed as fixed-width little-endian). It is the same
/// on `wasm32` and on 64-bit native targets, so a publisher, the host and a
/// native test all compute the same hash. Changing a key's `Hash` impl (or
/// overriding `key_hash`) changes every hash: the state of existing keys is
/// then no longer found.
///
/// ```
/// use wakuwaku_guest::PartitionKey;
///
/// #[derive(Hash)]
/// struct AccountId(u64);
///
/// impl PartitionKey for AccountId {}
///
/// assert_eq!(AccountId(42).key_hash(), 42u64.key_hash());
/// ```
pub trait PartitionKey: Hash {
    /// The 64-bit hash the log carries for this key.
    fn key_hash(&self) -> u64 {
        stable_hash(self)
    }
}

macro_rules! partition_keys {
    ($($t:ty),* $(,)?) => { $(impl PartitionKey for $t {})* };
}
partition_keys!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128, bool, char, String, str);

impl<T: PartitionKey + ?Sized> PartitionKey for &T {
    fn key_hash(&self) -> u64 {
        (**self).key_hash()
    }
}

/// SipHash-1-3 with both keys zero over a value's [`Hash`] impl, made
/// independent of the platform: every integer is fed as its little-endian
/// bytes, and `usize`/`isize` (lengths of slices, enum discriminants) as
/// 64-bit. This is the default [`PartitionKey::key_hash`].
pub fn stable_hash<T: Hash + ?Sized>(value: &T) -> u64 {
    let mut hasher = StableHasher(SipHasher13::new_with_keys(0, 0));
    value.hash(&mut hasher);
    hasher.finish()
}

/// Feeds integers to `SipHash` in a fixed width and byte order, so a hash does
/// not depend on the pointer width or endianness of the target.
struct StableHasher(SipHasher13);

impl Hasher for StableHasher {
    fn finish(&self) -> u64 {
        self.0.finish()
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }
    fn write_u8(&mut self, i: u8) {
        self.0.write(&[i]);
    }
    fn write_u16(&mut self, i: u16) {
        self.0.write(&i.to_le_bytes());
    }
    fn write_u32(&mut self, i: u32) {
        self.0.write(&i.to_le_bytes());
    }
    fn write_u64(&mut self, i: u64) {
        self.0.write(&i.to_le_bytes());
    }
    fn write_u128(&mut self, i: u128) {
        self.0.write(&i.to_le_bytes());
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn write_i8(&mut self, i: i8) {
        self.0.write(&i.to_le_bytes());
    }
    fn write_i16(&mut self, i: i16) {
        self.0.write(&i.to_le_bytes());
    }
    fn write_i32(&mut self, i: i32) {
        self.0.write(&i.to_le_bytes());
    }
    fn write_i64(&mut self, i: i64) {
        self.0.write(&i.to_le_bytes());
    }
    fn write_i128(&mut self, i: i128) {
        self.0.write(&i.to_le_bytes());
    }
    fn write_isize(&mut self, i: isize) {
        self.write_i64(i as i64);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Hash)]
    struct Id(u64);
    impl PartitionKey for Id {}

    #[derive(Hash)]
    enum Composite {
        #[allow(dead_code)]
        A,
        B(Vec<u16>, String, usize),
    }
    impl PartitionKey for Composite {}

    #[test]
    fn key_hash_is_siphash13_of_little_endian_bytes() {
        let expected = {
            let mut h = SipHasher13::new_with_keys(0, 0);
            h.write(&42u64.to_le_bytes());
            h.finish()
        };
        assert_eq!(Id(42).key_hash(), expected);
        assert_eq!(42u64.key_hash(), expected);
    }

    #[test]
    fn key_hash_is_pinned() {
        // These numbers are on the wire and in stored state: they must never
        // change, on any target.
        assert_eq!(Id(42).key_hash(), 0x7b3e_724b_36eb_df51, "{:#x}", Id(42).key_hash());
        let composite = Composite::B(vec![1, 2], "x".into(), 7).key_hash();
        assert_eq!(composite, 0x3002_856f_ff66_d3f9, "{composite:#x}");
    }

    #[test]
    fn usize_hashes_as_u64() {
        assert_eq!(stable_hash(&7usize), stable_hash(&7u64));
        assert_eq!(stable_hash(&-7isize), stable_hash(&-7i64));
    }
}
