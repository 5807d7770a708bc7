//! The event model: type tags, orderings, algebras, key hashes and the header
//! envelope every message carries.
//!
//! A message's metadata travels as named user headers so that the planner
//! never decodes a body. This module owns the one place where those headers
//! are written ([`EventHeaders::to_headers`]) and read back
//! ([`Envelope::parse`]; [`EventHeaders::parse`] also checks the key).
//!
//! Rules it keeps:
//! - **Parsing is strict.** A missing header, a value of the wrong length, an
//!   unknown format version or an unknown enum value is a [`HeaderError`]
//!   that names the header. Nothing is guessed or defaulted.
//! - **The format is versioned.** Every message carries `waku-version`; a
//!   reader refuses versions it does not know instead of misreading them.
//! - **Integers are little-endian** and fixed-width, so the encoding is the
//!   same on every platform and for every log backend.
//! - **Event time is optional on the wire, required by declaration.** A
//!   message may carry `waku-event-time` ([`header_name::EVENT_TIME`]); a
//!   message without it reads exactly as before the header existed, so no
//!   format version changes. Whether a type needs it is its
//!   [`EventTiming`]: a type that declares event time refuses a message
//!   without it ([`EventTiming::event_time`]).
//!
//! # Writing the envelope from another producer
//!
//! Producers other than `waku publish` write these user headers (names are
//! exact, values are raw bytes):
//!
//! | header | value |
//! | --- | --- |
//! | `waku-version` | 1 byte: `2` |
//! | `waku-tag` | the type tag, u32 little-endian (4 bytes) |
//! | `waku-key` | the key's canonical bytes ([`crate::key`]) |
//! | `waku-ordering` | 1 byte: relaxed 0, acquire 1, release 2, acq-rel 3 |
//! | `waku-algebra` | 1 byte: non-associative 0, commutative 1, idempotent 2, idempotent-commutative 3, associative 4 |
//! | `waku-event-time` | only for types that declare event time: when the event happened, milliseconds since the Unix epoch (UTC), i64 little-endian (8 bytes) |
//!
//! For example an event that happened at 2026-12-02T12:00:00Z carries
//! `waku-event-time` = `1796212800000` as the bytes
//! `00 3a a0 36 a2 01 00 00`. Each header appears at most once; other
//! headers are ignored.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::key::{Key, KeyError};

/// The 64-bit hash the host derives from a key's canonical bytes
/// ([`crate::key::key_hash`]).
///
/// It picks the partition, so equal keys always share a partition, and it
/// buckets keys in memory. It never identifies a key: that is the
/// [`Key`]'s bytes.
pub type KeyHash = u64;

/// Identifies an event type; unique among the event types of one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EventTypeTag(u32);

impl EventTypeTag {
    /// Wraps a raw tag.
    pub const fn new(tag: u32) -> Self {
        Self(tag)
    }

    /// The raw tag.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for EventTypeTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// How a message orders itself against events of other types of its key.
///
/// The names mirror [`std::sync::atomic::Ordering`]; the "memory" is the
/// stream of events of one key. See `spec/ordering.md`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventAtomicOrdering {
    /// Only the order among events of its own type is kept. The default.
    #[default]
    Relaxed,
    /// Opens something: every later event of the key waits for it.
    Acquire,
    /// Closes something: it waits for every earlier event of the key.
    Release,
    /// A full barrier: nothing passes it in either direction.
    AcqRel,
}

impl EventAtomicOrdering {
    /// All orderings, in wire order.
    pub const ALL: [Self; 4] = [Self::Relaxed, Self::Acquire, Self::Release, Self::AcqRel];

    /// The name the WIT contract uses (`relaxed`, `acquire`, `release`,
    /// `acq-rel`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Relaxed => "relaxed",
            Self::Acquire => "acquire",
            Self::Release => "release",
            Self::AcqRel => "acq-rel",
        }
    }

    /// Whether later events of the key must wait for this one.
    pub const fn acquires(self) -> bool {
        matches!(self, Self::Acquire | Self::AcqRel)
    }

    /// Whether this event must wait for every earlier event of the key.
    pub const fn releases(self) -> bool {
        matches!(self, Self::Release | Self::AcqRel)
    }

    const fn to_wire(self) -> u8 {
        match self {
            Self::Relaxed => 0,
            Self::Acquire => 1,
            Self::Release => 2,
            Self::AcqRel => 3,
        }
    }

    fn from_wire(value: u8) -> Option<Self> {
        Self::ALL.get(usize::from(value)).copied()
    }
}

/// The law an event type obeys, which decides how a run may be reduced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algebra {
    /// No law: every event is delivered in log order. The default.
    #[default]
    NonAssociative,
    /// a·b = b·a: nothing is dropped; the order inside a run may relax.
    Commutative,
    /// a·a = a: adjacent duplicates (equal body bytes) are dropped.
    Idempotent,
    /// Both: the run is sorted by body bytes and every duplicate dropped.
    IdempotentCommutative,
    /// a·b = combine(a, b): the run is folded into one event.
    Associative,
}

impl Algebra {
    /// All algebras, in wire order.
    pub const ALL: [Self; 5] =
        [Self::NonAssociative, Self::Commutative, Self::Idempotent, Self::IdempotentCommutative, Self::Associative];

    /// The name the WIT contract uses (`non-associative`, …,
    /// `associative`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::NonAssociative => "non-associative",
            Self::Commutative => "commutative",
            Self::Idempotent => "idempotent",
            Self::IdempotentCommutative => "idempotent-commutative",
            Self::Associative => "associative",
        }
    }

    const fn to_wire(self) -> u8 {
        match self {
            Self::NonAssociative => 0,
            Self::Commutative => 1,
            Self::Idempotent => 2,
            Self::IdempotentCommutative => 3,
            Self::Associative => 4,
        }
    }

    fn from_wire(value: u8) -> Option<Self> {
        Self::ALL.get(usize::from(value)).copied()
    }
}

impl fmt::Display for EventAtomicOrdering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Algebra {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The header envelope version this build writes and the only one it reads.
///
/// Version 2 carries the key's canonical bytes in `waku-key`; version 1
/// carried a 64-bit hash, which could not tell colliding keys apart.
pub const HEADER_FORMAT_VERSION: u8 = 2;

/// Names of the user headers that make up the envelope.
pub mod header_name {
    /// Format version, 1 byte.
    pub const VERSION: &str = "waku-version";
    /// Event type tag, u32 little-endian.
    pub const TAG: &str = "waku-tag";
    /// The key's canonical bytes ([`crate::key`]), 1 to
    /// [`crate::key::MAX_KEY_BYTES`] bytes.
    pub const KEY: &str = "waku-key";
    /// Ordering, 1 byte (relaxed 0, acquire 1, release 2, acq-rel 3).
    pub const ORDERING: &str = "waku-ordering";
    /// Algebra, 1 byte (non-associative 0 … associative 4).
    pub const ALGEBRA: &str = "waku-algebra";
    /// When the event happened: milliseconds since the Unix epoch (UTC),
    /// i64 little-endian, 8 bytes. Optional: only types that declare event
    /// time ([`super::EventTiming::Timed`]) carry it.
    pub const EVENT_TIME: &str = "waku-event-time";
}

/// Whether an event type's events carry an event time: declared per type,
/// as its algebra is.
///
/// A timed type's events are held by the release stage ([`crate::release`])
/// and released in event-time order across the projection's topics; an
/// untimed type's events are applied as they arrive.
///
/// Among one key's events, a [`Timed`](Self::Timed) type's also reach the
/// handler in event-time order against the key's other `Timed` types'
/// ([`crate::time_order`]); a [`TimedRelaxed`](Self::TimedRelaxed) type's
/// may move past those of other timed types as their ordering allows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventTiming {
    /// No event time: applied in arrival order. The default, and what every
    /// type declared before event time existed is.
    #[default]
    Untimed,
    /// Every event carries its event time in `waku-event-time`, and a key's
    /// events of timed types reach its handler in event-time order.
    Timed,
    /// Every event carries its event time, as for [`Timed`](Self::Timed),
    /// but its events may move past the key's timed events of other types
    /// as their [`EventAtomicOrdering`] allows (contract 0.4 on).
    TimedRelaxed,
}

impl EventTiming {
    /// Every timing.
    pub const ALL: [Self; 3] = [Self::Untimed, Self::Timed, Self::TimedRelaxed];

    /// The name used in configuration and logs (`untimed`, `timed`,
    /// `timed-relaxed`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Untimed => "untimed",
            Self::Timed => "timed",
            Self::TimedRelaxed => "timed-relaxed",
        }
    }

    /// Whether its events carry an event time (held by the release stage,
    /// `event-time-declared`).
    pub const fn is_timed(self) -> bool {
        matches!(self, Self::Timed | Self::TimedRelaxed)
    }

    /// The event time a message of a type with this timing has, from the
    /// `waku-event-time` its envelope carried ([`Envelope::event_time`]).
    ///
    /// A timed type without the header is refused with
    /// [`HeaderError::Missing`] (such a message goes to the dead-letter
    /// topic with that reason). An untimed type has no event time even if
    /// the header is there: it is applied as it arrives, and a message
    /// written while its type still declared event time stays readable.
    pub fn event_time(self, carried: Option<i64>) -> Result<Option<i64>, HeaderError> {
        match self {
            Self::Untimed => Ok(None),
            Self::Timed | Self::TimedRelaxed => {
                carried.map(Some).ok_or(HeaderError::Missing { name: header_name::EVENT_TIME })
            }
        }
    }
}

impl fmt::Display for EventTiming {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One named user header: what a log backend stores beside the body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The header's name.
    pub name: String,
    /// The header's raw value.
    pub value: Vec<u8>,
}

/// Why a message's headers could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// A required header is absent.
    #[error("missing header `{name}`")]
    Missing {
        /// The header's name.
        name: &'static str,
    },
    /// A header appears more than once.
    #[error("header `{name}` appears more than once")]
    Duplicate {
        /// The header's name.
        name: &'static str,
    },
    /// A header's value has the wrong number of bytes.
    #[error("header `{name}` has {found} bytes, expected {expected}")]
    WrongLength {
        /// The header's name.
        name: &'static str,
        /// The length the format defines.
        expected: usize,
        /// The length found.
        found: usize,
    },
    /// The envelope was written by a format version this build cannot read.
    #[error("header format version {found} is not supported (this build reads version {HEADER_FORMAT_VERSION})")]
    UnknownVersion {
        /// The version found.
        found: u8,
    },
    /// The ordering byte is not one of the four orderings.
    #[error("header `waku-ordering` has unknown value {found}")]
    UnknownOrdering {
        /// The value found.
        found: u8,
    },
    /// The algebra byte is not one of the five algebras.
    #[error("header `waku-algebra` has unknown value {found}")]
    UnknownAlgebra {
        /// The value found.
        found: u8,
    },
    /// The key header does not hold a canonical key.
    #[error("header `waku-key` is not a canonical key: {0}")]
    InvalidKey(#[from] KeyError),
    /// A header's value is not one the format allows.
    #[error("header `{name}` is invalid: {reason}")]
    Invalid {
        /// The header's name.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// The metadata every message carries: enough to plan and reduce it without
/// decoding its body.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EventHeaders {
    /// The event type.
    pub tag: EventTypeTag,
    /// The event's key: what its order and state are scoped to.
    pub key: Key,
    /// The ordering this message asks for.
    pub ordering: EventAtomicOrdering,
    /// The algebra its type declares.
    pub algebra: Algebra,
    /// When it happened (milliseconds since the Unix epoch), if the message
    /// carries `waku-event-time`; whether its type requires one is its
    /// [`EventTiming`]. Left out of serialized forms when there is none,
    /// so those read as they did before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<i64>,
}

impl EventHeaders {
    /// The envelope as user headers, version first; `waku-event-time` last
    /// and only when there is an event time.
    pub fn to_headers(&self) -> Vec<Header> {
        let header = |name: &str, value: &[u8]| Header { name: name.to_owned(), value: value.to_vec() };
        let mut headers = vec![
            header(header_name::VERSION, &[HEADER_FORMAT_VERSION]),
            header(header_name::TAG, &self.tag.get().to_le_bytes()),
            header(header_name::KEY, self.key.as_bytes()),
            header(header_name::ORDERING, &[self.ordering.to_wire()]),
            header(header_name::ALGEBRA, &[self.algebra.to_wire()]),
        ];
        if let Some(time) = self.event_time {
            headers.push(header(header_name::EVENT_TIME, &time.to_le_bytes()));
        }
        headers
    }

    /// Reads the envelope from a message's user headers, strictly.
    ///
    /// Headers that are not part of the envelope are ignored, so other
    /// tools may add their own. Names are given as `&str` or as their
    /// bytes (a view into a polled batch).
    pub fn parse<'a, N: AsRef<[u8]>>(headers: impl IntoIterator<Item = (N, &'a [u8])>) -> Result<Self, HeaderError> {
        Envelope::parse(headers)?.into_headers()
    }

    /// [`EventHeaders::parse`] over stored [`Header`]s.
    pub fn parse_stored(headers: &[Header]) -> Result<Self, HeaderError> {
        Envelope::parse_stored(headers)?.into_headers()
    }
}

/// The envelope as read from a message's headers, with the key still as
/// its bytes: everything [`EventHeaders::parse`] checks except that the
/// key is canonical.
///
/// A consumer reads thousands of records of a few keys per batch: it
/// parses each record's envelope into this (no allocation), and checks and
/// builds a [`Key`] once per distinct key bytes
/// ([`Envelope::into_headers`], [`Key::from_canonical`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope<'a> {
    /// The event type.
    pub tag: EventTypeTag,
    /// The `waku-key` header's bytes, not yet checked to be canonical.
    pub key: &'a [u8],
    /// The ordering this message asks for.
    pub ordering: EventAtomicOrdering,
    /// The algebra its type declares.
    pub algebra: Algebra,
    /// The `waku-event-time` header's value, if the message carries one.
    pub event_time: Option<i64>,
}

impl<'a> Envelope<'a> {
    /// Reads the envelope from a message's user headers, strictly, as
    /// [`EventHeaders::parse`] does, except for the key's canonical form.
    pub fn parse<N: AsRef<[u8]>>(headers: impl IntoIterator<Item = (N, &'a [u8])>) -> Result<Self, HeaderError> {
        const NAMES: [&str; 6] = [
            header_name::VERSION,
            header_name::TAG,
            header_name::KEY,
            header_name::ORDERING,
            header_name::ALGEBRA,
            header_name::EVENT_TIME,
        ];
        const VERSION: &[u8] = NAMES[0].as_bytes();
        const TAG: &[u8] = NAMES[1].as_bytes();
        const KEY: &[u8] = NAMES[2].as_bytes();
        const ORDERING: &[u8] = NAMES[3].as_bytes();
        const ALGEBRA: &[u8] = NAMES[4].as_bytes();
        const EVENT_TIME: &[u8] = NAMES[5].as_bytes();
        let mut fields: [Option<&[u8]>; 6] = [None; 6];
        for (name, value) in headers {
            let slot = match name.as_ref() {
                VERSION => 0,
                TAG => 1,
                KEY => 2,
                ORDERING => 3,
                ALGEBRA => 4,
                EVENT_TIME => 5,
                _ => continue,
            };
            if fields[slot].replace(value).is_some() {
                return Err(HeaderError::Duplicate { name: NAMES[slot] });
            }
        }
        let field = |slot: usize| fields[slot].ok_or(HeaderError::Missing { name: NAMES[slot] });
        let [version] = fixed::<1>(NAMES[0], field(0)?)?;
        if version != HEADER_FORMAT_VERSION {
            return Err(HeaderError::UnknownVersion { found: version });
        }
        let tag = u32::from_le_bytes(fixed(NAMES[1], field(1)?)?);
        let key = field(2)?;
        let [ordering] = fixed::<1>(NAMES[3], field(3)?)?;
        let ordering =
            EventAtomicOrdering::from_wire(ordering).ok_or(HeaderError::UnknownOrdering { found: ordering })?;
        let [algebra] = fixed::<1>(NAMES[4], field(4)?)?;
        let algebra = Algebra::from_wire(algebra).ok_or(HeaderError::UnknownAlgebra { found: algebra })?;
        let event_time = fields[5].map(|value| fixed(NAMES[5], value).map(i64::from_le_bytes)).transpose()?;
        Ok(Self { tag: EventTypeTag::new(tag), key, ordering, algebra, event_time })
    }

    /// [`Envelope::parse`] over stored [`Header`]s.
    pub fn parse_stored(headers: &'a [Header]) -> Result<Self, HeaderError> {
        Self::parse(headers.iter().map(|h| (h.name.as_str(), h.value.as_slice())))
    }

    /// The envelope with its key checked ([`Key::from_canonical`]).
    pub fn into_headers(self) -> Result<EventHeaders, HeaderError> {
        Ok(self.with_key(Key::from_canonical(self.key)?))
    }

    /// The envelope with `key`, which the caller built from (or found for)
    /// the same bytes as [`Envelope::key`].
    pub fn with_key(self, key: Key) -> EventHeaders {
        debug_assert_eq!(key.as_bytes(), self.key, "the key of these bytes");
        EventHeaders { tag: self.tag, key, ordering: self.ordering, algebra: self.algebra, event_time: self.event_time }
    }
}

fn fixed<const N: usize>(name: &'static str, value: &[u8]) -> Result<[u8; N], HeaderError> {
    value.try_into().map_err(|_| HeaderError::WrongLength { name, expected: N, found: value.len() })
}

/// The partition a key hash belongs to, out of `partitions`.
///
/// Every backend and every publisher uses this one function, so they agree
/// on where a key lives. It maps the hash onto `0..partitions` by
/// multiplication (Lemire's range reduction), which keeps the spread even
/// for any partition count.
///
/// # Panics
/// If `partitions` is zero: a topic always has at least one partition.
pub fn partition_for(key_hash: KeyHash, partitions: u32) -> u32 {
    assert!(partitions > 0, "a topic has at least one partition");
    ((u128::from(key_hash) * u128::from(partitions)) >> 64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> EventHeaders {
        EventHeaders {
            tag: EventTypeTag::new(7),
            key: Key::int(0x0102_0304_0506_0708_u64),
            ordering: EventAtomicOrdering::AcqRel,
            algebra: Algebra::Associative,
            event_time: None,
        }
    }

    fn parse(headers: &[Header]) -> Result<EventHeaders, HeaderError> {
        EventHeaders::parse_stored(headers)
    }

    #[test]
    fn round_trips_every_ordering_and_algebra() {
        for ordering in EventAtomicOrdering::ALL {
            for algebra in Algebra::ALL {
                let headers = EventHeaders { ordering, algebra, ..sample() };
                assert_eq!(parse(&headers.to_headers()), Ok(headers));
            }
        }
    }

    #[test]
    fn ignores_foreign_headers() {
        let mut headers = sample().to_headers();
        headers.insert(0, Header { name: "trace-id".into(), value: vec![1, 2, 3] });
        assert_eq!(parse(&headers), Ok(sample()));
    }

    #[test]
    fn missing_header_is_named() {
        for name in
            [header_name::VERSION, header_name::TAG, header_name::KEY, header_name::ORDERING, header_name::ALGEBRA]
        {
            let headers: Vec<_> = sample().to_headers().into_iter().filter(|h| h.name != name).collect();
            assert_eq!(parse(&headers), Err(HeaderError::Missing { name }));
            assert!(parse(&headers).unwrap_err().to_string().contains(name));
        }
    }

    #[test]
    fn wrong_length_is_named() {
        let mut headers = sample().to_headers();
        headers[1].value.push(0);
        assert_eq!(parse(&headers), Err(HeaderError::WrongLength { name: header_name::TAG, expected: 4, found: 5 }));
    }

    #[test]
    fn unknown_version_is_refused() {
        for version in [1, 3] {
            let mut headers = sample().to_headers();
            headers[0].value = vec![version];
            assert_eq!(parse(&headers), Err(HeaderError::UnknownVersion { found: version }));
        }
    }

    #[test]
    fn a_key_that_is_not_canonical_is_refused_with_the_reason() {
        for (bytes, reason) in [
            (vec![], KeyError::Empty),
            (vec![0x01, 0x54, 0x00], KeyError::TrailingBytes { extra: 1 }),
            (vec![0x09], KeyError::UnknownTag { tag: 9, at: 0 }),
        ] {
            let mut headers = sample().to_headers();
            headers[2].value = bytes;
            let error = parse(&headers).unwrap_err();
            assert_eq!(error, HeaderError::InvalidKey(reason.clone()));
            assert!(error.to_string().contains("waku-key"), "{error}");
        }
    }

    #[test]
    fn keys_round_trip_whatever_their_hash() {
        let key = Key::parse_text(r#"[42, "eur", {"bytes": "00"}]"#).unwrap();
        let headers = EventHeaders { key: key.clone(), ..sample() };
        assert_eq!(parse(&headers.to_headers()).unwrap().key, key);
    }

    #[test]
    fn unknown_enum_values_are_refused() {
        let mut headers = sample().to_headers();
        headers[3].value = vec![4];
        assert_eq!(parse(&headers), Err(HeaderError::UnknownOrdering { found: 4 }));
        let mut headers = sample().to_headers();
        headers[4].value = vec![9];
        assert_eq!(parse(&headers), Err(HeaderError::UnknownAlgebra { found: 9 }));
    }

    #[test]
    fn the_envelope_reads_everything_but_the_keys_canonical_form() {
        let envelope = |headers: &[Header]| {
            let envelope = Envelope::parse(headers.iter().map(|h| (h.name.as_bytes(), h.value.as_slice()))).unwrap();
            (envelope.key.to_vec(), envelope.into_headers())
        };
        let headers = sample().to_headers();
        assert_eq!(envelope(&headers), (sample().key.as_bytes().to_vec(), Ok(sample())));
        let borrowed = Envelope::parse(headers.iter().map(|h| (h.name.as_str(), h.value.as_slice()))).unwrap();
        assert_eq!(borrowed.with_key(sample().key), sample());

        let mut bad_key = headers.clone();
        bad_key[2].value = vec![0x09];
        let refused = Err(HeaderError::InvalidKey(KeyError::UnknownTag { tag: 9, at: 0 }));
        assert_eq!(envelope(&bad_key), (vec![0x09], refused.clone()), "parsed, then refused when the key is built");
        assert_eq!(parse(&bad_key), refused);
    }

    #[test]
    fn duplicate_header_is_refused() {
        let mut headers = sample().to_headers();
        headers.push(headers[1].clone());
        assert_eq!(parse(&headers), Err(HeaderError::Duplicate { name: header_name::TAG }));
    }

    #[test]
    fn a_message_without_event_time_reads_as_it_always_did() {
        // The five headers of format version 2, exactly as written before
        // `waku-event-time` existed.
        let headers = sample().to_headers();
        assert_eq!(headers.len(), 5);
        assert!(headers.iter().all(|h| h.name != header_name::EVENT_TIME));
        assert_eq!(parse(&headers), Ok(sample()));
        assert_eq!(parse(&headers).unwrap().event_time, None);
    }

    #[test]
    fn event_time_round_trips_as_eight_little_endian_bytes() {
        for time in [0, 1, -1, 1_796_212_800_000, i64::MIN, i64::MAX] {
            let headers = EventHeaders { event_time: Some(time), ..sample() };
            let written = headers.to_headers();
            let header = written.iter().find(|h| h.name == header_name::EVENT_TIME).unwrap();
            assert_eq!(header.value, time.to_le_bytes());
            assert_eq!(parse(&written), Ok(headers));
        }
    }

    #[test]
    fn the_documented_example_of_another_producer_parses() {
        // The module docs' table and example, written by hand.
        let header = |name: &str, value: &[u8]| Header { name: name.into(), value: value.to_vec() };
        let headers = [
            header("waku-version", &[2]),
            header("waku-tag", &[7, 0, 0, 0]),
            header("waku-key", Key::int(42u64).as_bytes()),
            header("waku-ordering", &[0]),
            header("waku-algebra", &[0]),
            header("waku-event-time", &[0x00, 0x3a, 0xa0, 0x36, 0xa2, 0x01, 0x00, 0x00]),
        ];
        let parsed = parse(&headers).unwrap();
        assert_eq!(parsed.event_time, Some(1_796_212_800_000), "2026-12-02T12:00:00Z");
        assert_eq!((parsed.tag, parsed.key), (EventTypeTag::new(7), Key::int(42u64)));
    }

    #[test]
    fn an_unreadable_event_time_is_refused_with_its_name() {
        for bytes in [vec![], vec![1; 7], vec![1; 9]] {
            let mut headers = sample().to_headers();
            let found = bytes.len();
            headers.push(Header { name: header_name::EVENT_TIME.into(), value: bytes });
            let error = parse(&headers).unwrap_err();
            assert_eq!(error, HeaderError::WrongLength { name: header_name::EVENT_TIME, expected: 8, found });
            assert!(error.to_string().contains("waku-event-time"), "{error}");
        }
        let mut headers = EventHeaders { event_time: Some(5), ..sample() }.to_headers();
        headers.push(headers[5].clone());
        assert_eq!(parse(&headers), Err(HeaderError::Duplicate { name: header_name::EVENT_TIME }));
    }

    #[test]
    fn a_timed_type_requires_the_event_time_and_an_untimed_one_ignores_it() {
        let missing = HeaderError::Missing { name: header_name::EVENT_TIME };
        assert_eq!(EventTiming::Timed.event_time(None), Err(missing.clone()));
        assert!(missing.to_string().contains("waku-event-time"));
        assert_eq!(EventTiming::Timed.event_time(Some(9)), Ok(Some(9)));
        assert_eq!(EventTiming::Untimed.event_time(Some(9)), Ok(None));
        assert_eq!(EventTiming::Untimed.event_time(None), Ok(None));
        assert_eq!(EventTiming::default(), EventTiming::Untimed);
        assert_eq!(EventTiming::TimedRelaxed.event_time(None), Err(missing.clone()));
        assert_eq!(EventTiming::TimedRelaxed.event_time(Some(9)), Ok(Some(9)));
        let names: Vec<_> = EventTiming::ALL.iter().map(|timing| timing.to_string()).collect();
        assert_eq!(names, ["untimed", "timed", "timed-relaxed"]);
        assert_eq!(serde_json::to_string(&EventTiming::Timed).unwrap(), r#""timed""#);
        assert_eq!(serde_json::to_string(&EventTiming::TimedRelaxed).unwrap(), r#""timed-relaxed""#);
        let timed: Vec<_> = EventTiming::ALL.iter().map(|timing| timing.is_timed()).collect();
        assert_eq!(timed, [false, true, true]);
    }

    #[test]
    fn the_envelope_carries_the_event_time_into_the_headers() {
        let headers = EventHeaders { event_time: Some(-3), ..sample() }.to_headers();
        let envelope = Envelope::parse_stored(&headers).unwrap();
        assert_eq!(envelope.event_time, Some(-3));
        assert_eq!(envelope.with_key(sample().key).event_time, Some(-3));
    }

    #[test]
    fn partitions_cover_the_range_evenly() {
        let partitions = 4;
        let mut counts = [0u32; 4];
        for i in 0..4000u64 {
            let hash = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            counts[partition_for(hash, partitions) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (800..1200).contains(&c)), "{counts:?}");
        assert_eq!(partition_for(u64::MAX, 3), 2);
        assert_eq!(partition_for(0, 3), 0);
    }
}
