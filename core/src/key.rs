//! Keys: what order and state are scoped to, as canonical bytes.
//!
//! A key is a small value ([`KeyValue`]: an integer, a string, a byte
//! string, or a tuple of those) with one canonical encoding, so that every
//! guest language produces the same bytes for the same value. A module's
//! `key` export returns those bytes; the host keeps them with every message,
//! in state, and in retry and dead-letter records, and derives from them the
//! 64-bit hash it uses to pick a partition and to bucket keys in memory.
//!
//! Rules kept here:
//! - **Bytes are the identity.** Two [`Key`]s are equal exactly when their
//!   bytes are; the hash only speeds up lookups. Keys whose hashes collide
//!   stay apart everywhere (state, plans, reduced runs, retry diversion).
//! - **Only canonical bytes make a key.** [`Key::from_canonical`] refuses
//!   anything that is not exactly one value in its shortest encoding, at
//!   most [`MAX_KEY_BYTES`] long and nested at most [`MAX_KEY_DEPTH`] deep,
//!   with an error naming the problem and where it is. So one value never
//!   has two encodings, and every key can be shown as text.
//! - **A text form for people.** [`Key`]'s `Display` and [`Key::parse_text`]
//!   use JSON: an integer is a number, a string a JSON string, a tuple an
//!   array, a byte string `{"bytes": "<hex>"}`. `42`, `"ann"`,
//!   `[42, "eur"]`.
//!
//! The encoding (also stated in `wit/handler.wit`):
//!
//! | value | bytes |
//! | --- | --- |
//! | integer, any value from `i64::MIN` to `u64::MAX` | `0x01`, the zigzag form as unsigned LEB128, shortest form |
//! | string (UTF-8) | `0x02`, the byte length as unsigned LEB128, the bytes |
//! | byte string | `0x03`, the length as unsigned LEB128, the bytes |
//! | tuple | `0x04`, the element count as unsigned LEB128, each element |
//!
//! The hash is SipHash-1-3 with both keys zero over the canonical bytes.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most bytes a key's canonical encoding may have.
pub const MAX_KEY_BYTES: usize = 1024;

/// The deepest tuples may nest (a key that is a plain value has depth 0).
pub const MAX_KEY_DEPTH: usize = 16;

const INT: u8 = 0x01;
const STR: u8 = 0x02;
const BYTES: u8 = 0x03;
const TUPLE: u8 = 0x04;

/// A key's value, decoded.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyValue {
    /// An integer from `i64::MIN` to `u64::MAX`.
    Int(i128),
    /// A UTF-8 string.
    Str(String),
    /// A byte string.
    Bytes(Vec<u8>),
    /// A tuple of values (structs and tuple structs encode as tuples).
    Tuple(Vec<KeyValue>),
}

/// Why bytes or text are not a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// No bytes at all.
    #[error("a key cannot be empty")]
    Empty,
    /// Longer than [`MAX_KEY_BYTES`].
    #[error("a key has at most {MAX_KEY_BYTES} bytes; this one has {length}")]
    TooLong {
        /// Its length.
        length: usize,
    },
    /// Tuples nested deeper than [`MAX_KEY_DEPTH`].
    #[error("a key's tuples nest at most {MAX_KEY_DEPTH} deep")]
    TooDeep,
    /// The bytes end inside a value.
    #[error("the key's bytes end inside a value (at byte {at})")]
    Truncated {
        /// Where the missing bytes should be.
        at: usize,
    },
    /// A value starts with a byte that is no value's tag.
    #[error("unknown key value tag {tag:#04x} at byte {at}")]
    UnknownTag {
        /// The byte found.
        tag: u8,
        /// Where.
        at: usize,
    },
    /// A length or integer is not in its shortest LEB128 form.
    #[error("a number in the key is not in its shortest form (at byte {at})")]
    NotShortest {
        /// Where the number starts.
        at: usize,
    },
    /// An integer outside `i64::MIN..=u64::MAX`.
    #[error("an integer in the key is outside the range from i64::MIN to u64::MAX (at byte {at})")]
    IntOutOfRange {
        /// Where the integer starts.
        at: usize,
    },
    /// A string that is not UTF-8.
    #[error("a string in the key is not UTF-8 (at byte {at})")]
    NotUtf8 {
        /// Where the string's bytes start.
        at: usize,
    },
    /// Bytes after the one value a key holds.
    #[error("the key has {extra} bytes after its value")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
    /// A value of a type that has no key form (a float, a map, an option,
    /// an enum variant with data), met while serializing it as a key.
    #[error("this value cannot be a key: {reason}")]
    NotAKey {
        /// Which part of the value, and why.
        reason: String,
    },
    /// Text that is not a key's text form.
    #[error("not a key: {reason} (a key is written as JSON: 42, \"ann\", [42, \"eur\"] or {{\"bytes\": \"00ff\"}})")]
    Text {
        /// What is wrong with it.
        reason: String,
    },
}

impl KeyValue {
    /// The canonical bytes of this value, checked against the limits.
    pub fn encode(&self) -> Result<Vec<u8>, KeyError> {
        let mut out = Vec::new();
        self.encode_into(&mut out, 0)?;
        if out.len() > MAX_KEY_BYTES {
            return Err(KeyError::TooLong { length: out.len() });
        }
        Ok(out)
    }

    fn encode_into(&self, out: &mut Vec<u8>, depth: usize) -> Result<(), KeyError> {
        match self {
            Self::Int(value) => {
                if !(i128::from(i64::MIN)..=i128::from(u64::MAX)).contains(value) {
                    return Err(KeyError::IntOutOfRange { at: out.len() });
                }
                out.push(INT);
                write_leb128(out, zigzag(*value));
            }
            Self::Str(text) => {
                out.push(STR);
                write_leb128(out, text.len() as u128);
                out.extend_from_slice(text.as_bytes());
            }
            Self::Bytes(bytes) => {
                out.push(BYTES);
                write_leb128(out, bytes.len() as u128);
                out.extend_from_slice(bytes);
            }
            Self::Tuple(items) => {
                if depth >= MAX_KEY_DEPTH {
                    return Err(KeyError::TooDeep);
                }
                out.push(TUPLE);
                write_leb128(out, items.len() as u128);
                for item in items {
                    item.encode_into(out, depth + 1)?;
                    if out.len() > MAX_KEY_BYTES {
                        return Err(KeyError::TooLong { length: out.len() });
                    }
                }
            }
        }
        Ok(())
    }

    /// Decodes canonical bytes; anything else is a [`KeyError`] naming the
    /// problem.
    pub fn decode(bytes: &[u8]) -> Result<Self, KeyError> {
        if bytes.is_empty() {
            return Err(KeyError::Empty);
        }
        if bytes.len() > MAX_KEY_BYTES {
            return Err(KeyError::TooLong { length: bytes.len() });
        }
        let mut reader = Reader { bytes, at: 0 };
        let value = reader.value(0)?;
        match bytes.len() - reader.at {
            0 => Ok(value),
            extra => Err(KeyError::TrailingBytes { extra }),
        }
    }

    /// The value as JSON (the key's text form).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Self::Int(value) => match (i64::try_from(*value), u64::try_from(*value)) {
                (Ok(signed), _) => signed.into(),
                (_, Ok(unsigned)) => unsigned.into(),
                // Out of range values are never decoded or encoded.
                _ => value.to_string().into(),
            },
            Self::Str(text) => text.as_str().into(),
            Self::Bytes(bytes) => {
                let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
                serde_json::json!({ "bytes": hex })
            }
            Self::Tuple(items) => items.iter().map(Self::to_json).collect::<Vec<_>>().into(),
        }
    }

    /// Reads a value from its text form (JSON).
    pub fn from_json(json: &serde_json::Value) -> Result<Self, KeyError> {
        let text = |reason: String| KeyError::Text { reason };
        match json {
            serde_json::Value::Number(number) => number
                .as_i64()
                .map(i128::from)
                .or_else(|| number.as_u64().map(i128::from))
                .map(Self::Int)
                .ok_or_else(|| text(format!("{number} is not an integer from i64::MIN to u64::MAX"))),
            serde_json::Value::String(value) => Ok(Self::Str(value.clone())),
            serde_json::Value::Array(items) => {
                items.iter().map(Self::from_json).collect::<Result<_, _>>().map(Self::Tuple)
            }
            serde_json::Value::Object(object) => match (object.len(), object.get("bytes")) {
                (1, Some(serde_json::Value::String(hex))) => decode_hex(hex).map(Self::Bytes).map_err(text),
                _ => Err(text("an object must be {\"bytes\": \"<hex>\"}".to_owned())),
            },
            other => Err(text(format!("{other} is not an integer, string, array or byte string"))),
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, KeyError> {
        let byte = *self.bytes.get(self.at).ok_or(KeyError::Truncated { at: self.at })?;
        self.at += 1;
        Ok(byte)
    }

    fn leb128(&mut self) -> Result<u128, KeyError> {
        let start = self.at;
        let mut value: u128 = 0;
        for shift in (0..).step_by(7) {
            let byte = self.byte()?;
            let bits = u128::from(byte & 0x7f);
            if shift >= 128 || (bits << shift) >> shift != bits {
                return Err(KeyError::IntOutOfRange { at: start });
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                if byte == 0 && shift > 0 {
                    return Err(KeyError::NotShortest { at: start });
                }
                return Ok(value);
            }
        }
        unreachable!("the loop returns")
    }

    fn length(&mut self) -> Result<usize, KeyError> {
        let start = self.at;
        let length = self.leb128()?;
        let remaining = (self.bytes.len() - self.at) as u128;
        if length > remaining {
            return Err(KeyError::Truncated { at: start });
        }
        Ok(length as usize)
    }

    fn take(&mut self, length: usize) -> &[u8] {
        let slice = &self.bytes[self.at..self.at + length];
        self.at += length;
        slice
    }

    fn value(&mut self, depth: usize) -> Result<KeyValue, KeyError> {
        let start = self.at;
        match self.byte()? {
            INT => {
                let at = self.at;
                let value = unzigzag(self.leb128()?);
                if !(i128::from(i64::MIN)..=i128::from(u64::MAX)).contains(&value) {
                    return Err(KeyError::IntOutOfRange { at });
                }
                Ok(KeyValue::Int(value))
            }
            STR => {
                let length = self.length()?;
                let at = self.at;
                let bytes = self.take(length);
                std::str::from_utf8(bytes)
                    .map(|text| KeyValue::Str(text.to_owned()))
                    .map_err(|_| KeyError::NotUtf8 { at })
            }
            BYTES => {
                let length = self.length()?;
                Ok(KeyValue::Bytes(self.take(length).to_vec()))
            }
            TUPLE => {
                if depth >= MAX_KEY_DEPTH {
                    return Err(KeyError::TooDeep);
                }
                // Each element takes at least two bytes, so a count larger
                // than what is left is refused before anything is allocated.
                let count = self.length()?;
                let mut items = Vec::with_capacity(count.min(MAX_KEY_BYTES / 2));
                for _ in 0..count {
                    items.push(self.value(depth + 1)?);
                }
                Ok(KeyValue::Tuple(items))
            }
            tag => Err(KeyError::UnknownTag { tag, at: start }),
        }
    }
}

fn zigzag(value: i128) -> u128 {
    ((value << 1) ^ (value >> 127)) as u128
}

fn unzigzag(value: u128) -> i128 {
    ((value >> 1) as i128) ^ -((value & 1) as i128)
}

fn write_leb128(out: &mut Vec<u8>, mut value: u128) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn decode_hex(hex: &str) -> Result<Vec<u8>, String> {
    if !hex.len().is_multiple_of(2) {
        return Err(format!("byte string `{hex}` has an odd number of hex digits"));
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(|| format!("byte string `{hex}` is not hex"))
        })
        .collect()
}

/// The hash the host derives from a key's canonical bytes: SipHash-1-3 with
/// both keys zero. It picks the partition ([`crate::event::partition_for`])
/// and buckets keys in memory; it never identifies a key.
pub fn key_hash(bytes: &[u8]) -> u64 {
    #[cfg(feature = "test-support")]
    if let Some(forced) = test_support::FORCED_HASH.get() {
        return forced(bytes);
    }
    let mut hasher = siphasher::sip::SipHasher13::new_with_keys(0, 0);
    hasher.write(bytes);
    hasher.finish()
}

/// A key: canonical bytes, checked, with their hash.
///
/// Equality, ordering and hashing follow the bytes (the `Hash` impl feeds
/// the precomputed [`key_hash`], which is a function of the bytes). Cloning
/// is cheap.
#[derive(Clone)]
pub struct Key {
    hash: u64,
    bytes: Arc<[u8]>,
}

impl Key {
    /// A key from canonical bytes; anything else is refused with the reason.
    pub fn from_canonical(bytes: &[u8]) -> Result<Self, KeyError> {
        KeyValue::decode(bytes)?;
        Ok(Self { hash: key_hash(bytes), bytes: Arc::from(bytes) })
    }

    /// The key of a value.
    pub fn of(value: &KeyValue) -> Result<Self, KeyError> {
        let bytes = value.encode()?;
        Ok(Self { hash: key_hash(&bytes), bytes: Arc::from(bytes) })
    }

    /// The key of an integer (as a module's `u64` or `i64` key encodes).
    pub fn int(value: impl Into<i128>) -> Self {
        let value = value.into().clamp(i128::from(i64::MIN), i128::from(u64::MAX));
        Self::of(&KeyValue::Int(value)).expect("an integer in range is always a key")
    }

    /// Reads a key from its text form (JSON: `42`, `"ann"`, `[42, "eur"]`,
    /// `{"bytes": "00ff"}`).
    pub fn parse_text(text: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        let json: serde_json::Value =
            serde_json::from_str(text).map_err(|e| KeyError::Text { reason: e.to_string() })?;
        let value = KeyValue::from_json(&json).map_err(|error| match json {
            // Named as written: JSON reads `18446744073709551616` as a float.
            serde_json::Value::Number(_) => {
                KeyError::Text { reason: format!("{text} is not an integer from i64::MIN to u64::MAX") }
            }
            _ => error,
        })?;
        Self::of(&value)
    }

    /// The canonical bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The hash the host derives from the bytes ([`key_hash`]).
    pub fn key_hash(&self) -> u64 {
        self.hash
    }

    /// The decoded value.
    pub fn value(&self) -> KeyValue {
        KeyValue::decode(&self.bytes).expect("a Key holds canonical bytes")
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.bytes == other.bytes
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.bytes.cmp(&other.bytes)
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl fmt::Display for Key {
    /// The text form: JSON.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.value().to_json())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

impl Serialize for Key {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.bytes)
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bytes: Vec<u8> = serde::de::Deserialize::deserialize(deserializer)?;
        Self::from_canonical(&bytes).map_err(serde::de::Error::custom)
    }
}

/// Hooks for tests only (feature `test-support`).
#[cfg(feature = "test-support")]
pub mod test_support {
    use std::sync::OnceLock;

    pub(super) static FORCED_HASH: OnceLock<fn(&[u8]) -> u64> = OnceLock::new();

    /// Replaces [`super::key_hash`] for the rest of the process, e.g. with a
    /// constant so that every key collides. Only the first call counts; use
    /// it in a test binary of its own, before any key is made.
    pub fn force_key_hash(hash: fn(&[u8]) -> u64) {
        let _ = FORCED_HASH.set(hash);
    }

    /// The key of `value` with `hash` in place of its real hash, so a test
    /// can make two distinct keys collide.
    pub fn key_with_hash(value: &super::KeyValue, hash: u64) -> super::Key {
        let key = super::Key::of(value).expect("a test key within the limits");
        super::Key { hash, ..key }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(value: i128) -> KeyValue {
        KeyValue::Int(value)
    }

    #[test]
    fn encodings_are_pinned() {
        // These bytes are on the wire and in stored state, and every guest
        // SDK must produce them: they never change.
        let cases: [(KeyValue, &[u8]); 8] = [
            (int(0), &[0x01, 0x00]),
            (int(42), &[0x01, 0x54]),
            (int(-1), &[0x01, 0x01]),
            (int(64), &[0x01, 0x80, 0x01]),
            (int(u64::MAX.into()), &[0x01, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x03]),
            (KeyValue::Str("ann".into()), &[0x02, 0x03, b'a', b'n', b'n']),
            (KeyValue::Bytes(vec![0, 255]), &[0x03, 0x02, 0x00, 0xff]),
            (
                KeyValue::Tuple(vec![int(42), KeyValue::Str("eur".into())]),
                &[0x04, 0x02, 0x01, 0x54, 0x02, 0x03, b'e', b'u', b'r'],
            ),
        ];
        for (value, bytes) in cases {
            assert_eq!(value.encode().unwrap(), bytes, "{value:?}");
            assert_eq!(KeyValue::decode(bytes).unwrap(), value);
        }
        assert_eq!(key_hash(&[0x01, 0x54]), Key::int(42u64).key_hash());
    }

    #[test]
    fn round_trips_at_the_edges_of_the_integer_range() {
        for value in [i128::from(i64::MIN), -65, -64, 63, 127, 128, i128::from(i64::MAX), i128::from(u64::MAX)] {
            let bytes = int(value).encode().unwrap();
            assert_eq!(KeyValue::decode(&bytes).unwrap(), int(value));
            let key = Key::from_canonical(&bytes).unwrap();
            assert_eq!(Key::parse_text(&key.to_string()).unwrap(), key);
        }
        assert_eq!(int(i128::from(u64::MAX) + 1).encode(), Err(KeyError::IntOutOfRange { at: 0 }));
        assert_eq!(int(i128::from(i64::MIN) - 1).encode(), Err(KeyError::IntOutOfRange { at: 0 }));
    }

    #[test]
    fn non_canonical_bytes_are_refused_with_the_reason() {
        let cases: [(&[u8], KeyError); 9] = [
            (&[], KeyError::Empty),
            (&[0x05], KeyError::UnknownTag { tag: 5, at: 0 }),
            (&[0x01], KeyError::Truncated { at: 1 }),
            (&[0x01, 0x80, 0x00], KeyError::NotShortest { at: 1 }),
            (&[0x01, 0x00, 0x00], KeyError::TrailingBytes { extra: 1 }),
            (&[0x02, 0x05, b'a'], KeyError::Truncated { at: 1 }),
            (&[0x02, 0x01, 0xff], KeyError::NotUtf8 { at: 2 }),
            (&[0x04, 0xff, 0xff, 0xff, 0xff, 0x0f], KeyError::Truncated { at: 1 }),
            (
                &[
                    0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                    0xff, 0xff, 0xff, 0x7f,
                ],
                KeyError::IntOutOfRange { at: 1 },
            ),
        ];
        for (bytes, error) in cases {
            assert_eq!(Key::from_canonical(bytes).unwrap_err(), error, "{bytes:02x?}");
        }
        assert_eq!(
            KeyValue::decode(&vec![0x03; MAX_KEY_BYTES + 1]),
            Err(KeyError::TooLong { length: MAX_KEY_BYTES + 1 })
        );
        let mut deep = KeyValue::Int(1);
        for _ in 0..=MAX_KEY_DEPTH {
            deep = KeyValue::Tuple(vec![deep]);
        }
        assert_eq!(deep.encode(), Err(KeyError::TooDeep));
        let bytes: Vec<u8> =
            std::iter::repeat_n([0x04, 0x01], MAX_KEY_DEPTH + 1).flatten().chain([0x01, 0x02]).collect();
        assert_eq!(KeyValue::decode(&bytes), Err(KeyError::TooDeep));
    }

    #[test]
    fn text_form_is_json() {
        let key =
            Key::of(&KeyValue::Tuple(vec![int(42), KeyValue::Str("eur".into()), KeyValue::Bytes(vec![0xab])])).unwrap();
        assert_eq!(key.to_string(), r#"[42,"eur",{"bytes":"ab"}]"#);
        assert_eq!(Key::parse_text(r#" [42, "eur", {"bytes": "AB"}] "#).unwrap(), key);
        for bad in ["4.5", "true", "{\"x\": 1}", "[1,", "18446744073709551616", "{\"bytes\": \"abc\"}"] {
            let error = Key::parse_text(bad).unwrap_err();
            assert!(matches!(error, KeyError::Text { .. }), "{bad}: {error}");
        }
        let error = Key::parse_text(" 18446744073709551616").unwrap_err().to_string();
        assert!(error.contains("18446744073709551616 is not an integer from i64::MIN to u64::MAX"), "{error}");
    }

    #[test]
    fn equal_hashes_do_not_make_equal_keys() {
        let a = Key { hash: 7, bytes: Arc::from(&[0x01, 0x02][..]) };
        let b = Key { hash: 7, bytes: Arc::from(&[0x01, 0x04][..]) };
        assert_ne!(a, b);
        let set: std::collections::HashSet<Key> = [a.clone(), b, a].into_iter().collect();
        assert_eq!(set.len(), 2);
    }
}
