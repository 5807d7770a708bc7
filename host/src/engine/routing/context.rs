//! The context headers of retry and dead-letter records: one text scheme,
//! `waku.error.*`, that any consumer of the log can read without this
//! project's code (Iggy's web UI or CLI, a script, a Kafka tool), and the
//! binary `waku-*` headers older versions wrote, still read.
//!
//! Rules kept here:
//! - **Text, one scheme.** Every value is UTF-8 text: numbers in decimal,
//!   times in RFC 3339 UTC with milliseconds (`2026-12-03T11:41:11.123Z`),
//!   names and messages as they are. The names and their Kafka Connect
//!   (`__connect.errors.*`) and KIP-1034 (`__streams.errors.*`)
//!   counterparts are tabled in the README ("Dead letters").
//! - **Bounded.** A value is written at most [`MAX_VALUE_BYTES`] long (the
//!   message [`MAX_MESSAGE_BYTES`]), cut at a character boundary with a
//!   marker saying so, and read back at most that long, whatever a record
//!   of the topic holds: a listing of many letters holds little per letter.
//! - **Strict where the host acts, lenient where it only shows.** Numbers,
//!   times and the failure class must parse (the retry queue schedules by
//!   them); a projection, topic, module, version, event type or message
//!   that is not UTF-8 is read with each bad byte escaped as `\xNN`, so a
//!   hostile record is shown, never refused for its text.
//! - **Older records read as before.** A record without any `waku.error.*`
//!   header is read in the binary scheme ([`legacy`]), strictly, as the
//!   versions that wrote it did; it has no topic, event type or first
//!   failure time. New records are written in the text scheme only.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Failure, FailureClass, Routed, header_name as legacy};
use crate::event::{EventAtomicOrdering, Header, HeaderError};

/// Names of the text context headers.
pub mod name {
    /// What every name starts with.
    pub const PREFIX: &str = crate::storage::log::TEXT_HEADER_PREFIX;
    /// The topic the event was read from.
    pub const TOPIC: &str = "waku.error.topic";
    /// Its partition there, decimal.
    pub const PARTITION: &str = "waku.error.partition";
    /// Its offset there (the earliest, for a folded run), decimal.
    pub const OFFSET: &str = "waku.error.offset";
    /// The projection the record belongs to.
    pub const PROJECTION: &str = "waku.error.projection";
    /// The module that failed; absent when no module was involved.
    pub const MODULE: &str = "waku.error.module";
    /// Its version (the content hash, or the OCI digest it was pulled by).
    pub const MODULE_VERSION: &str = "waku.error.module.version";
    /// The event type's name, when the host knew it.
    pub const EVENT_TYPE: &str = "waku.error.event.type";
    /// The failure class (`transient`, `retryable`, `unrecoverable`,
    /// `trap`, `malformed`, `undeliverable`); absent for an event diverted
    /// behind its key.
    pub const CLASS: &str = "waku.error.class";
    /// The handler's or the host's message.
    pub const MESSAGE: &str = "waku.error.message";
    /// Attempts made so far, decimal.
    pub const ATTEMPTS: &str = "waku.error.attempts";
    /// When the first attempt failed, RFC 3339; absent before any failure.
    pub const FIRST_FAILURE: &str = "waku.error.first.failure";
    /// When it last failed (or was diverted, or re-driven), RFC 3339.
    pub const LAST_FAILURE: &str = "waku.error.last.failure";
    /// Events the record accounts for (a folded run is one record), decimal.
    pub const EVENTS: &str = "waku.error.events";
    /// The retry offset of the record of the same key this one goes
    /// before, decimal; optional.
    pub const AHEAD_OF: &str = "waku.error.ahead.of";
    /// The event's ordering on its topic (`relaxed`, `acquire`, `release`,
    /// `acq-rel`), before a retry rewrote the record's own; optional.
    pub const ORDERING: &str = "waku.error.ordering";

    /// Every name, in the order they are written.
    pub const ALL: [&str; 15] = [
        TOPIC,
        PARTITION,
        OFFSET,
        PROJECTION,
        MODULE,
        MODULE_VERSION,
        EVENT_TYPE,
        CLASS,
        MESSAGE,
        ATTEMPTS,
        FIRST_FAILURE,
        LAST_FAILURE,
        EVENTS,
        AHEAD_OF,
        ORDERING,
    ];
}

/// The most bytes of a value other than the message.
pub const MAX_VALUE_BYTES: usize = 1 << 10;

/// The most bytes of the message header.
pub const MAX_MESSAGE_BYTES: usize = 8 << 10;

/// The last millisecond RFC 3339 can write (9999-12-31T23:59:59.999Z); a
/// later time is written as this.
const MAX_TIME_MS: u64 = 253_402_300_799_999;

/// What a cut value ends with.
const CUT: &str = " […cut]";

/// Whether `name` is a context header of either scheme: a header a
/// message from outside must not carry into a routed record.
pub fn is_context_header(name: &str) -> bool {
    name.starts_with(name::PREFIX) || legacy::ALL.contains(&name)
}

/// The text context headers of `routed`, in the order of [`name::ALL`].
pub fn to_headers(routed: &Routed) -> Vec<Header> {
    let mut headers = Vec::with_capacity(15);
    let mut text = |name: &str, value: &str, max: usize| {
        headers.push(Header { name: name.to_owned(), value: bounded(value, max).into_bytes() });
    };
    text(name::TOPIC, &routed.topic, MAX_VALUE_BYTES);
    text(name::PARTITION, &routed.origin_partition.to_string(), MAX_VALUE_BYTES);
    text(name::OFFSET, &routed.origin_offset.to_string(), MAX_VALUE_BYTES);
    text(name::PROJECTION, &routed.projection, MAX_VALUE_BYTES);
    if let Some(failure) = &routed.failure
        && !failure.module.is_empty()
    {
        text(name::MODULE, &failure.module, MAX_VALUE_BYTES);
        text(name::MODULE_VERSION, &failure.version, MAX_VALUE_BYTES);
    }
    if !routed.event_type.is_empty() {
        text(name::EVENT_TYPE, &routed.event_type, MAX_VALUE_BYTES);
    }
    if let Some(failure) = &routed.failure {
        text(name::CLASS, failure.class.name(), MAX_VALUE_BYTES);
        text(name::MESSAGE, &failure.message, MAX_MESSAGE_BYTES);
    }
    text(name::ATTEMPTS, &routed.attempts.to_string(), MAX_VALUE_BYTES);
    if let Some(first) = routed.first_failed_at_ms {
        text(name::FIRST_FAILURE, &rfc3339(first), MAX_VALUE_BYTES);
    }
    text(name::LAST_FAILURE, &rfc3339(routed.failed_at_ms), MAX_VALUE_BYTES);
    text(name::EVENTS, &routed.events.to_string(), MAX_VALUE_BYTES);
    if let Some(offset) = routed.ahead_of {
        text(name::AHEAD_OF, &offset.to_string(), MAX_VALUE_BYTES);
    }
    if let Some(ordering) = routed.ordering {
        text(name::ORDERING, ordering.name(), MAX_VALUE_BYTES);
    }
    headers
}

/// Reads the context of a routed record: the text scheme if the record
/// has any `waku.error.*` header, else the binary one of older versions.
pub fn parse(headers: &[Header]) -> Result<Routed, HeaderError> {
    if headers.iter().any(|h| h.name.starts_with(name::PREFIX)) { parse_text(headers) } else { parse_legacy(headers) }
}

/// Reads the text scheme: each header at most once; partition, offset,
/// projection, attempts, last failure and events required; class and
/// message together or not at all.
fn parse_text(headers: &[Header]) -> Result<Routed, HeaderError> {
    let mut fields: [Option<&[u8]>; 15] = [None; 15];
    for h in headers {
        if let Some(slot) = name::ALL.iter().position(|name| *name == h.name)
            && fields[slot].replace(&h.value).is_some()
        {
            return Err(HeaderError::Duplicate { name: name::ALL[slot] });
        }
    }
    let get = |name: &'static str| fields[name::ALL.iter().position(|n| *n == name).expect("a name of ALL")];
    let required = |name: &'static str| get(name).ok_or(HeaderError::Missing { name });
    let shown = |name: &'static str, max: usize| get(name).map(|value| lenient(value, max)).unwrap_or_default();
    let failure = match (get(name::CLASS), get(name::MESSAGE)) {
        (None, None) => None,
        (Some(class), Some(_)) => Some(Failure {
            class: class_of(name::CLASS, class)?,
            message: shown(name::MESSAGE, MAX_MESSAGE_BYTES),
            module: shown(name::MODULE, MAX_VALUE_BYTES),
            version: shown(name::MODULE_VERSION, MAX_VALUE_BYTES),
        }),
        (None, Some(_)) => return Err(HeaderError::Missing { name: name::CLASS }),
        (Some(_), None) => return Err(HeaderError::Missing { name: name::MESSAGE }),
    };
    Ok(Routed {
        projection: lenient(required(name::PROJECTION)?, MAX_VALUE_BYTES),
        topic: shown(name::TOPIC, MAX_VALUE_BYTES),
        event_type: shown(name::EVENT_TYPE, MAX_VALUE_BYTES),
        origin_partition: decimal(name::PARTITION, required(name::PARTITION)?)?,
        origin_offset: decimal(name::OFFSET, required(name::OFFSET)?)?,
        events: decimal(name::EVENTS, required(name::EVENTS)?)?,
        attempts: decimal(name::ATTEMPTS, required(name::ATTEMPTS)?)?,
        failed_at_ms: time_ms(name::LAST_FAILURE, required(name::LAST_FAILURE)?)?,
        first_failed_at_ms: get(name::FIRST_FAILURE).map(|value| time_ms(name::FIRST_FAILURE, value)).transpose()?,
        failure,
        ahead_of: get(name::AHEAD_OF).map(|value| decimal(name::AHEAD_OF, value)).transpose()?,
        // Only shown and carried on: a name this version does not know
        // reads as not recorded.
        ordering: get(name::ORDERING)
            .and_then(|value| EventAtomicOrdering::ALL.into_iter().find(|o| o.name().as_bytes() == value)),
    })
}

/// Reads the binary scheme older versions wrote, strictly: every header
/// present exactly once with the right length, the four failure headers
/// all or none, `waku-ahead-of` optional.
pub fn parse_legacy(headers: &[Header]) -> Result<Routed, HeaderError> {
    let mut fields: [Option<&[u8]>; 11] = [None; 11];
    for h in headers {
        if let Some(slot) = legacy::ALL.iter().position(|name| *name == h.name)
            && fields[slot].replace(&h.value).is_some()
        {
            return Err(HeaderError::Duplicate { name: legacy::ALL[slot] });
        }
    }
    let field = |slot: usize| fields[slot].ok_or(HeaderError::Missing { name: legacy::ALL[slot] });
    let text = |slot: usize| -> Result<String, HeaderError> {
        String::from_utf8(field(slot)?.to_vec())
            .map_err(|_| HeaderError::Invalid { name: legacy::ALL[slot], reason: "not UTF-8".into() })
    };
    let failure = if fields[6..10].iter().all(Option::is_none) {
        None
    } else {
        Some(Failure {
            class: class_of(legacy::CLASS, field(6)?)?,
            message: text(7)?,
            module: text(8)?,
            version: text(9)?,
        })
    };
    Ok(Routed {
        projection: text(0)?,
        topic: String::new(),
        event_type: String::new(),
        origin_partition: u32::from_le_bytes(fixed(legacy::ALL[1], field(1)?)?),
        origin_offset: u64::from_le_bytes(fixed(legacy::ALL[2], field(2)?)?),
        events: u64::from_le_bytes(fixed(legacy::ALL[3], field(3)?)?),
        attempts: u32::from_le_bytes(fixed(legacy::ALL[4], field(4)?)?),
        failed_at_ms: u64::from_le_bytes(fixed(legacy::ALL[5], field(5)?)?),
        first_failed_at_ms: None,
        failure,
        ahead_of: fields[10].map(|value| fixed(legacy::AHEAD_OF, value).map(u64::from_le_bytes)).transpose()?,
        ordering: None,
    })
}

fn fixed<const N: usize>(name: &'static str, value: &[u8]) -> Result<[u8; N], HeaderError> {
    value.try_into().map_err(|_| HeaderError::WrongLength { name, expected: N, found: value.len() })
}

fn class_of(name: &'static str, value: &[u8]) -> Result<FailureClass, HeaderError> {
    FailureClass::ALL
        .into_iter()
        .find(|class| class.name().as_bytes() == value)
        .ok_or_else(|| HeaderError::Invalid { name, reason: format!("unknown class {:?}", lenient(value, 64)) })
}

/// A decimal number: ASCII digits only, no sign, no padding beyond the
/// type's width.
fn decimal<T: std::str::FromStr>(name: &'static str, value: &[u8]) -> Result<T, HeaderError> {
    let invalid = || HeaderError::Invalid { name, reason: format!("{:?} is not a decimal number", lenient(value, 64)) };
    if value.is_empty() || value.len() > 20 || !value.iter().all(u8::is_ascii_digit) {
        return Err(invalid());
    }
    std::str::from_utf8(value).ok().and_then(|text| text.parse().ok()).ok_or_else(invalid)
}

/// `ms` since the epoch as RFC 3339 UTC with milliseconds.
pub fn rfc3339(ms: u64) -> String {
    let time = UNIX_EPOCH + Duration::from_millis(ms.min(MAX_TIME_MS));
    humantime::format_rfc3339_millis(time).to_string()
}

fn time_ms(name: &'static str, value: &[u8]) -> Result<u64, HeaderError> {
    let invalid = || HeaderError::Invalid { name, reason: format!("{:?} is not an RFC 3339 time", lenient(value, 64)) };
    let text = std::str::from_utf8(value).map_err(|_| invalid())?;
    let time: SystemTime = humantime::parse_rfc3339(text).map_err(|_| invalid())?;
    time.duration_since(UNIX_EPOCH).map(|since| since.as_millis() as u64).map_err(|_| invalid())
}

/// `value` cut to `max` bytes at a character boundary, with a marker when
/// cut.
fn bounded(value: &str, max: usize) -> String {
    if value.len() <= max {
        return value.to_owned();
    }
    format!("{}{CUT}", wakuwaku_core::limits::cut(value, max.saturating_sub(CUT.len())).0)
}

/// `value` as text, each byte that is not part of UTF-8 written `\xNN`,
/// at most `max` bytes ([`bounded`]).
pub fn lenient(value: &[u8], max: usize) -> String {
    // Never look at more than the bound (and room for escapes) of a large value.
    let looked = &value[..value.len().min(max.saturating_mul(4))];
    let mut text = String::with_capacity(looked.len().min(max));
    for chunk in looked.utf8_chunks() {
        text.push_str(chunk.valid());
        for byte in chunk.invalid() {
            text.push_str(&format!("\\x{byte:02x}"));
        }
    }
    let cut = looked.len() < value.len() || text.len() > max;
    match cut {
        false => text,
        true => format!("{}{CUT}", wakuwaku_core::limits::cut(&text, max.saturating_sub(CUT.len())).0),
    }
}

/// The binary headers older versions wrote for `routed`, byte for byte as
/// they wrote them: for tests that old records still list, show and re-drive.
#[cfg(test)]
pub(crate) fn legacy_headers(routed: &Routed) -> Vec<Header> {
    let header = |name: &str, value: &[u8]| Header { name: name.to_owned(), value: value.to_vec() };
    let mut headers = vec![
        header(legacy::PROJECTION, routed.projection.as_bytes()),
        header(legacy::ORIGIN_PARTITION, &routed.origin_partition.to_le_bytes()),
        header(legacy::ORIGIN_OFFSET, &routed.origin_offset.to_le_bytes()),
        header(legacy::EVENTS, &routed.events.to_le_bytes()),
        header(legacy::ATTEMPTS, &routed.attempts.to_le_bytes()),
        header(legacy::FAILED_AT, &routed.failed_at_ms.to_le_bytes()),
    ];
    if let Some(failure) = &routed.failure {
        headers.extend([
            header(legacy::CLASS, failure.class.name().as_bytes()),
            header(legacy::MESSAGE, failure.message.as_bytes()),
            header(legacy::MODULE, failure.module.as_bytes()),
            header(legacy::VERSION, failure.version.as_bytes()),
        ]);
    }
    if let Some(offset) = routed.ahead_of {
        headers.push(header(legacy::AHEAD_OF, &offset.to_le_bytes()));
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed() -> Routed {
        Routed {
            projection: "bank".into(),
            topic: "accounts".into(),
            event_type: "deposited".into(),
            origin_partition: 2,
            origin_offset: 41,
            events: 3,
            attempts: 2,
            failed_at_ms: 1_764_000_000_123,
            first_failed_at_ms: Some(1_764_000_000_000),
            failure: Some(Failure {
                class: FailureClass::Trap,
                message: "module trapped: out of fuel".into(),
                module: "bank".into(),
                version: "sha256:0123".into(),
            }),
            ahead_of: Some(9),
            ordering: Some(EventAtomicOrdering::Relaxed),
        }
    }

    fn value<'a>(headers: &'a [Header], name: &str) -> &'a str {
        let header = headers.iter().find(|h| h.name == name).unwrap_or_else(|| panic!("no {name}"));
        std::str::from_utf8(&header.value).unwrap()
    }

    #[test]
    fn every_value_is_text_and_reads_back() {
        let headers = to_headers(&routed());
        assert_eq!(value(&headers, name::PARTITION), "2");
        assert_eq!(value(&headers, name::OFFSET), "41");
        assert_eq!(value(&headers, name::LAST_FAILURE), "2025-11-24T16:00:00.123Z");
        assert_eq!(value(&headers, name::FIRST_FAILURE), "2025-11-24T16:00:00.000Z");
        assert_eq!(value(&headers, name::CLASS), "trap");
        assert_eq!(value(&headers, name::ORDERING), "relaxed");
        assert_eq!(parse(&headers), Ok(routed()));
        let diverted = Routed { failure: None, first_failed_at_ms: None, ahead_of: None, ordering: None, ..routed() };
        let headers = to_headers(&diverted);
        assert!(headers.iter().all(|h| h.name != name::CLASS && h.name != name::MODULE), "{headers:?}");
        assert_eq!(parse(&headers), Ok(diverted));
    }

    #[test]
    fn numbers_and_times_are_strict() {
        for (name, bad) in [
            (name::PARTITION, "-1"),
            (name::OFFSET, "0x10"),
            (name::ATTEMPTS, "99999999999"),
            (name::EVENTS, ""),
            (name::LAST_FAILURE, "yesterday"),
        ] {
            let mut headers = to_headers(&routed());
            headers.iter_mut().find(|h| h.name == name).unwrap().value = bad.as_bytes().to_vec();
            assert!(matches!(parse(&headers), Err(HeaderError::Invalid { .. })), "{name}={bad:?}");
        }
        let mut twice = to_headers(&routed());
        twice.push(Header { name: name::OFFSET.into(), value: b"1".to_vec() });
        assert_eq!(parse(&twice), Err(HeaderError::Duplicate { name: name::OFFSET }));
    }

    #[test]
    fn hostile_values_are_bounded_and_escaped() {
        let long = Routed {
            failure: Some(Failure { message: "é".repeat(MAX_MESSAGE_BYTES), ..routed().failure.unwrap() }),
            topic: "t".repeat(10 * MAX_VALUE_BYTES),
            ..routed()
        };
        let headers = to_headers(&long);
        assert!(headers.iter().all(|h| h.value.len() <= MAX_MESSAGE_BYTES), "a value over the bound");
        assert!(value(&headers, name::MESSAGE).ends_with(CUT));
        assert_eq!(value(&headers, name::TOPIC).len(), MAX_VALUE_BYTES);

        let mut hostile = to_headers(&routed());
        for h in &mut hostile {
            match h.name.as_str() {
                name::MESSAGE => h.value = [b"bad \xff\xfe".as_slice(), &[b'x'; 1 << 20]].concat(),
                name::MODULE => h.value = b"m\xc3".to_vec(),
                name::ORDERING => h.value = b"sideways".to_vec(),
                _ => {}
            }
        }
        let read = parse(&hostile).unwrap();
        let failure = read.failure.unwrap();
        assert!(failure.message.starts_with("bad \\xff\\xfe"), "{}", &failure.message[..20]);
        assert!(failure.message.len() <= MAX_MESSAGE_BYTES);
        assert_eq!(failure.module, "m\\xc3");
        // An ordering this version does not name reads as not recorded.
        assert_eq!(read.ordering, None);
        assert_eq!(lenient(b"\x80", 64), "\\x80");
    }

    #[test]
    fn times_past_rfc3339_are_written_as_its_last() {
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
    }
}
