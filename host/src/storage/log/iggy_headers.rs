//! The codec between a [`Record`]'s headers and Iggy user headers: what
//! [`super::iggy`] sends with each message and reads back from it. Pure
//! functions over Iggy's header types and bytes, so every rule is tested
//! without a server.
//!
//! Iggy keeps no header order and one value per name, and refuses empty
//! values, values over 255 bytes and keys outside 1 to 255 bytes. Our
//! headers have any name and any value, so the codec encodes around that.
//!
//! Rules kept here:
//! - **Headers round-trip as a set by name**: what [`encode_headers`]
//!   writes, [`decode_headers`] reads back byte for byte (order aside),
//!   whatever the names and values.
//! - **A key is its name with every `~` doubled** ([`header_key`]); a
//!   lone `~` always starts a suffix, so no name can pose as another's
//!   piece or marker.
//! - **The tag travels as a typed `u32`** (the header [`TAG`] with a
//!   4-byte value); any other value as raw bytes, little-endian as
//!   written, so a value's bytes are read back whatever its Iggy kind.
//! - **An empty value** is stored under `name~empty` (a `u8` 0).
//! - **A value over 255 bytes is split** over the keys `name`, `name~1`,
//!   `name~2`, …, joined in order on reading.
//! - **Context headers are text** ([`super::is_text_header`]): a valid
//!   UTF-8 value is stored as Iggy strings, so Iggy's web UI and CLI show
//!   them, split only at character boundaries; a value that is not UTF-8
//!   is stored raw, like any other.
//! - **An empty body** is marked by the key [`EMPTY_BODY`] (no name
//!   encodes to it); the client stores the one byte `0` as the payload.
//! - **A key Iggy cannot store is refused**, naming it
//!   ([`HeaderRefusal`]): a name longer than 255 bytes once encoded, or
//!   empty. Nothing is cut silently.
//! - **Reading never fails on what another producer wrote**: a block the
//!   client's own decoding refuses (malformed, an unknown kind, a
//!   fixed-size value of another size) reads as `None`, as the client
//!   reads it; keys that do not follow the scheme are taken as names; of a
//!   piece given twice, the last one counts.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::str::FromStr;

use iggy::prelude::{HeaderKey, HeaderKind, HeaderValue};
use iggy_binary_protocol::{WireUserHeaderIterator, validate_user_headers};

use crate::event::Header;
use crate::event::header_name::TAG;

/// The header key marking an empty body (see the module docs).
pub(super) const EMPTY_BODY: &str = "~no-body";

/// The longest Iggy header key or value, in bytes.
const MAX_PIECE: usize = 255;

/// Iggy user headers, as a message is built with them.
pub(super) type UserHeaders = BTreeMap<HeaderKey, HeaderValue>;

/// A header Iggy cannot store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum HeaderRefusal {
    /// The key (a header's name, encoded) is empty or over 255 bytes.
    #[error("header key {key:?} cannot be stored in Iggy (1 to 255 bytes, `~` counting twice)")]
    Key {
        /// The key, as encoded.
        key: String,
    },
    /// A value given whole ([`put_raw`]) is empty or over 255 bytes.
    #[error("header {name:?} cannot hold {bytes} bytes in Iggy (1 to 255)")]
    Value {
        /// The header's name.
        name: String,
        /// The value's length.
        bytes: usize,
    },
}

/// `headers` as Iggy user headers (see the module docs), with the
/// [`EMPTY_BODY`] marker when `empty_body`.
pub(super) fn encode_headers(headers: &[Header], empty_body: bool) -> Result<UserHeaders, HeaderRefusal> {
    let mut encoded = UserHeaders::new();
    for Header { name, value } in headers {
        match (name.as_str(), value.len()) {
            (TAG, 4) => {
                let tag = u32::from_le_bytes(value[..].try_into().expect("4 bytes"));
                put(&mut encoded, name, HeaderValue::from(tag))?;
            }
            (_, 0) => put(&mut encoded, &header_key(name, Some("empty")), HeaderValue::from(0u8))?,
            // Context headers are text: stored as Iggy strings, so its web
            // UI and CLI show them, cut only at character boundaries.
            _ if super::is_text_header(name) && std::str::from_utf8(value).is_ok() => {
                let text = std::str::from_utf8(value).expect("checked");
                for (index, piece) in text_pieces(text, MAX_PIECE).enumerate() {
                    let suffix = (index > 0).then(|| index.to_string());
                    let piece = HeaderValue::from_raw(HeaderKind::String, piece.as_bytes()).expect("1 to 255 bytes");
                    put(&mut encoded, &header_key(name, suffix.as_deref()), piece)?;
                }
            }
            _ => {
                for (index, piece) in value.chunks(MAX_PIECE).enumerate() {
                    let suffix = (index > 0).then(|| index.to_string());
                    let piece = HeaderValue::from_raw(HeaderKind::Raw, piece).expect("1 to 255 bytes");
                    put(&mut encoded, &header_key(name, suffix.as_deref()), piece)?;
                }
            }
        }
    }
    if empty_body {
        put(&mut encoded, EMPTY_BODY, HeaderValue::from(0u8))?;
    }
    Ok(encoded)
}

/// Adds the header `name` (a name of the host's own, without `~`, taken as
/// the key) with the raw `value` of 1 to 255 bytes, unsplit.
pub(super) fn put_raw(headers: &mut UserHeaders, name: &str, value: &[u8]) -> Result<(), HeaderRefusal> {
    let value = HeaderValue::from_raw(HeaderKind::Raw, value)
        .map_err(|_| HeaderRefusal::Value { name: name.to_owned(), bytes: value.len() })?;
    put(headers, name, value)
}

/// Adds `value` under the key `key`, refused when Iggy cannot store the key.
fn put(headers: &mut UserHeaders, key: &str, value: HeaderValue) -> Result<(), HeaderRefusal> {
    let key = HeaderKey::from_str(key).map_err(|_| HeaderRefusal::Key { key: key.to_owned() })?;
    headers.insert(key, value);
    Ok(())
}

/// `text` in pieces of 1 to `max` bytes (`max` at least 4), each cut at a
/// character boundary.
fn text_pieces(mut text: &str, max: usize) -> impl Iterator<Item = &str> {
    std::iter::from_fn(move || {
        if text.is_empty() {
            return None;
        }
        let (piece, _) = wakuwaku_core::limits::cut(text, max);
        text = &text[piece.len()..];
        Some(piece)
    })
}

/// The user-header key of header `name`, or of its piece `suffix`: the name
/// with every `~` doubled, then `~suffix`.
pub(super) fn header_key(name: &str, suffix: Option<&str>) -> String {
    let mut key = name.replace('~', "~~");
    if let Some(suffix) = suffix {
        key.push('~');
        key.push_str(suffix);
    }
    key
}

/// What a user-header key stands for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum HeaderPiece {
    /// Piece `index` of the value of header `name`.
    Value { name: String, index: usize },
    /// The header `name`, with an empty value.
    Empty { name: String },
    /// The record's body is empty.
    EmptyBody,
}

/// Reads a key written by [`header_key`]. Keys no host wrote (another
/// producer's) that do not follow the scheme are taken as names.
pub(super) fn parse_header_key(key: &str) -> HeaderPiece {
    let mut name = String::with_capacity(key.len());
    let mut chars = key.char_indices();
    while let Some((at, c)) = chars.next() {
        if c != '~' {
            name.push(c);
            continue;
        }
        let rest = &key[at + 1..];
        if rest.starts_with('~') {
            chars.next();
            name.push('~');
            continue;
        }
        return match rest {
            "empty" => HeaderPiece::Empty { name },
            _ if name.is_empty() && EMPTY_BODY.strip_prefix('~') == Some(rest) => HeaderPiece::EmptyBody,
            _ if !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()) => match rest.parse() {
                Ok(index) => HeaderPiece::Value { name, index },
                Err(_) => HeaderPiece::Value { name: key.to_owned(), index: 0 },
            },
            _ => HeaderPiece::Value { name: key.to_owned(), index: 0 },
        };
    }
    HeaderPiece::Value { name, index: 0 }
}

/// The headers in a message's user-header bytes, by name (pieces of a split
/// value joined in order), and whether they mark the body as empty; `None`
/// for bytes the client's own decoding refuses (a malformed block, a kind
/// it does not know, a fixed-size value of another size).
///
/// Read straight from the bytes, without the client's map of typed keys and
/// values: every typed value this crate reads (the tag's `u32`, a
/// sequence's `u64`) is the little-endian bytes it wrote, which is how Iggy
/// carries them, so a value's bytes are taken as they are whatever its kind.
pub(super) fn decode_headers(bytes: &[u8]) -> Option<(Vec<Header>, bool)> {
    validate_user_headers(bytes).ok()?;
    let mut pieces: Vec<(Cow<'_, str>, usize, &[u8])> = Vec::new();
    let mut empty_body = false;
    for entry in WireUserHeaderIterator::new(bytes) {
        if !fits_kind(entry.key_kind.0, entry.key) || !fits_kind(entry.value_kind.0, entry.value) {
            return None;
        }
        let key = String::from_utf8_lossy(entry.key);
        if !key.contains('~') {
            pieces.push((key, 0, entry.value));
            continue;
        }
        match parse_header_key(&key) {
            HeaderPiece::Value { name, index } => pieces.push((name.into(), index, entry.value)),
            HeaderPiece::Empty { name } => pieces.push((name.into(), 0, &[])),
            HeaderPiece::EmptyBody => empty_body = true,
        }
    }
    // By name, then piece; of a piece given twice (only another producer
    // can write that), the last one.
    pieces.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    let mut headers: Vec<Header> = Vec::with_capacity(pieces.len());
    let mut pieces = pieces.into_iter().peekable();
    while let Some((name, index, value)) = pieces.next() {
        if pieces.peek().is_some_and(|(next, next_index, _)| *next == name && *next_index == index) {
            continue;
        }
        match headers.last_mut() {
            Some(last) if last.name == name => last.value.extend_from_slice(value),
            _ => headers.push(Header { name: name.into_owned(), value: value.to_vec() }),
        }
    }
    Some((headers, empty_body))
}

/// Whether `bytes` can be a header key or value of the kind coded `kind`:
/// a kind Iggy knows, and the size it has if it has one (the checks of the
/// client's `user_headers_map`).
fn fits_kind(kind: u8, bytes: &[u8]) -> bool {
    let size = match HeaderKind::from_code(kind) {
        Ok(HeaderKind::Raw | HeaderKind::String) => return true,
        Ok(HeaderKind::Bool | HeaderKind::Int8 | HeaderKind::Uint8) => 1,
        Ok(HeaderKind::Int16 | HeaderKind::Uint16) => 2,
        Ok(HeaderKind::Int32 | HeaderKind::Uint32 | HeaderKind::Float32) => 4,
        Ok(HeaderKind::Int64 | HeaderKind::Uint64 | HeaderKind::Float64) => 8,
        Ok(HeaderKind::Int128 | HeaderKind::Uint128) => 16,
        Err(_) => return false,
    };
    bytes.len() == size
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use iggy::prelude::IggyMessage;

    use super::*;
    use crate::event::header_name::KEY;
    use crate::storage::log::UNREADABLE;

    fn header(name: &str, value: &[u8]) -> Header {
        Header { name: name.to_owned(), value: value.to_vec() }
    }

    /// The user-header bytes Iggy's client sends for `headers`: its own
    /// serialisation, without a server.
    fn wire(headers: UserHeaders) -> Bytes {
        let message = IggyMessage::builder().payload(Bytes::from_static(b"{}")).user_headers(headers).build();
        message.unwrap().user_headers.expect("headers were given")
    }

    /// `headers` encoded, sent as Iggy's client sends them, and decoded,
    /// sorted by name.
    fn round_trip(headers: &[Header], empty_body: bool) -> (Vec<Header>, bool) {
        let encoded = encode_headers(headers, empty_body).unwrap();
        let (mut decoded, empty) = decode_headers(&wire(encoded)).expect("our own headers decode");
        decoded.sort_by(|a, b| a.name.cmp(&b.name));
        (decoded, empty)
    }

    fn sorted(headers: &[Header]) -> Vec<Header> {
        let mut headers = headers.to_vec();
        headers.sort_by(|a, b| a.name.cmp(&b.name));
        headers
    }

    /// The kind of the value stored under `key`, and how many keys there are.
    fn kind_of(encoded: &UserHeaders, key: &str) -> Option<HeaderKind> {
        encoded.get(&HeaderKey::from_str(key).unwrap()).map(HeaderValue::kind)
    }

    #[test]
    fn every_header_kind_round_trips_through_encode_and_decode() {
        let long_text = "é".repeat(200);
        let name_at_the_bound = "n".repeat(MAX_PIECE);
        let kinds: Vec<(&str, Header)> = vec![
            ("the tag", header(TAG, &9u32.to_le_bytes())),
            ("a tag of another size, raw", header(TAG, &[1, 2, 3])),
            ("an empty value", header("waku-module", &[])),
            ("a short text context header", header("waku.error.offset", b"41")),
            ("a text context header over 255 bytes", header("waku.error.message", long_text.as_bytes())),
            ("an empty text context header", header("waku.error.kind", &[])),
            ("a non-UTF-8 value under a text name", header("waku.error.module", &[0xff, 0xfe, b'a'])),
            ("a short binary value", header(KEY, &[0x01, 0x54])),
            ("a binary value of 255 bytes", header("b255", &[5; 255])),
            ("a binary value over 255 bytes", header("waku-failure", &[7; 600])),
            ("a name at the key's bound", header(&name_at_the_bound, b"v")),
            ("a name posing as a piece", header("a~1", b"not a piece")),
            ("a name posing as an empty value", header("a~empty", b"not empty")),
            ("a name posing as the body marker", header("~no-body", b"not the marker")),
            ("a lone tilde, empty", header("~", &[])),
            ("doubled tildes, split", header("~~", &[3; 300])),
            ("a trailing tilde", header("b~", b"x")),
            ("a tilde and digits", header("~1", b"y")),
            ("the unreadable marker", header(UNREADABLE, b"a record of 20 MiB, over the 16 MiB limit")),
        ];
        for (kind, header) in &kinds {
            for empty_body in [false, true] {
                let headers = std::slice::from_ref(header);
                assert_eq!(round_trip(headers, empty_body), (headers.to_vec(), empty_body), "{kind}");
            }
        }
        // A message holds one value per name: the second tag is left out.
        let mut all: Vec<Header> = kinds.into_iter().map(|(_, header)| header).collect();
        all.dedup_by(|later, earlier| later.name == earlier.name);
        assert_eq!(round_trip(&all, false), (sorted(&all), false), "all kinds in one message");
        assert_eq!(round_trip(&all, true), (sorted(&all), true));
        assert_eq!(round_trip(&[], true), (vec![], true), "the body marker alone");
    }

    #[test]
    fn each_kind_is_stored_as_the_module_docs_say() {
        let long_text = "é".repeat(200);
        let headers = [
            header(TAG, &9u32.to_le_bytes()),
            header("waku-module", &[]),
            header("waku.error.message", long_text.as_bytes()),
            header("waku.error.module", &[0xff]),
            header("waku-failure", &[7; 600]),
            header("a~b", b"v"),
        ];
        let encoded = encode_headers(&headers, true).unwrap();
        assert_eq!(kind_of(&encoded, TAG), Some(HeaderKind::Uint32), "the tag is a typed u32");
        assert_eq!(kind_of(&encoded, "waku-module~empty"), Some(HeaderKind::Uint8), "an empty value, by its key");
        assert_eq!(kind_of(&encoded, "waku-module"), None);
        // 400 bytes of 2-byte characters: 254 bytes, then 146, cut at a
        // character, as strings.
        let text = |key: &str| encoded.get(&HeaderKey::from_str(key).unwrap()).unwrap().as_str().unwrap().len();
        assert_eq!((text("waku.error.message"), text("waku.error.message~1")), (254, 146));
        assert_eq!(kind_of(&encoded, "waku.error.message~1"), Some(HeaderKind::String));
        assert_eq!(kind_of(&encoded, "waku.error.module"), Some(HeaderKind::Raw), "not UTF-8: raw");
        let pieces: Vec<_> = ["waku-failure", "waku-failure~1", "waku-failure~2"].map(|k| kind_of(&encoded, k)).into();
        assert_eq!(pieces, [Some(HeaderKind::Raw); 3], "600 bytes in three raw pieces");
        assert_eq!(kind_of(&encoded, "a~~b"), Some(HeaderKind::Raw), "`~` doubled");
        assert_eq!(kind_of(&encoded, EMPTY_BODY), Some(HeaderKind::Uint8));
        assert_eq!(encoded.len(), 10);
    }

    #[test]
    fn keys_iggy_cannot_store_are_refused_naming_them() {
        let refusal = |name: &str, value: &[u8]| encode_headers(&[header(name, value)], false).unwrap_err();
        let key_refused = |key: &str| HeaderRefusal::Key { key: key.to_owned() };
        let long = "x".repeat(MAX_PIECE + 1);
        assert_eq!(refusal(&long, b"v"), key_refused(&long), "a name over 255 bytes");
        assert_eq!(refusal("", b"v"), key_refused(""), "an empty name");
        let tildes = "~".repeat(128);
        assert_eq!(refusal(&tildes, b"v"), key_refused(&"~".repeat(256)), "`~` counts twice");
        assert!(encode_headers(&[header(&"~".repeat(127), b"v")], false).is_ok());
        // A name that fits whole but not with a piece's or an empty value's
        // suffix.
        let near = "n".repeat(MAX_PIECE - 1);
        assert!(encode_headers(&[header(&near, &[1; 255])], false).is_ok());
        assert_eq!(refusal(&near, &[1; 256]), key_refused(&format!("{near}~1")));
        assert_eq!(refusal(&near, &[]), key_refused(&format!("{near}~empty")));
        assert_eq!(
            refusal("", b"v").to_string(),
            "header key \"\" cannot be stored in Iggy (1 to 255 bytes, `~` counting twice)"
        );
        let mut headers = UserHeaders::new();
        put_raw(&mut headers, "waku-producer", b"p").unwrap();
        let empty = put_raw(&mut headers, "waku-producer", &[]).unwrap_err();
        assert_eq!(empty, HeaderRefusal::Value { name: "waku-producer".into(), bytes: 0 });
        assert_eq!(empty.to_string(), "header \"waku-producer\" cannot hold 0 bytes in Iggy (1 to 255)");
        let long = put_raw(&mut headers, "waku-producer", &[1; 256]).unwrap_err();
        assert_eq!(long, HeaderRefusal::Value { name: "waku-producer".into(), bytes: 256 });
        assert_eq!(put_raw(&mut headers, "", b"v").unwrap_err(), key_refused(""));
        assert_eq!(headers.len(), 1, "a refused header is not added");
    }

    #[test]
    fn blocks_the_client_refuses_read_as_none() {
        let mut buf = bytes::BytesMut::new();
        // A value kind Iggy does not know.
        iggy_binary_protocol::encode_user_headers(&[(2, b"k", 16, b"v")], &mut buf);
        assert_eq!(decode_headers(&buf), None);
        assert_eq!(decode_headers(&[2, 1, 0, 0, 0, b'k']), None, "cut short");
    }
}
