//! Fuzzes the header envelope parser, `EventHeaders::parse` and
//! `parse_stored`, with arbitrary lists of (name, value) headers: any list,
//! or a well-formed envelope with arbitrary edits.
//!
//! Properties, for every input:
//! - neither function panics, and both give the same answer;
//! - the answer is right, judged by the format alone (not by the parser's
//!   order of checks): it succeeds exactly when each envelope header appears
//!   once, with the right length (the key: canonical key bytes) and a known
//!   value, and then decodes those values; otherwise its error is one the
//!   input really has;
//! - a parsed value round-trips: `to_headers` writes the same bytes the
//!   input carried for the envelope, and parsing them gives the same value.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use wakuwaku_core::event::{
    Algebra, EventAtomicOrdering, EventHeaders, EventTypeTag, HEADER_FORMAT_VERSION, Header, HeaderError, header_name,
};
use wakuwaku_core::key::Key;

/// The envelope's headers, in the order `to_headers` writes them, and the
/// length of each value (0: any length, the key's canonical bytes).
const ENVELOPE: [(&str, usize); 5] = [
    (header_name::VERSION, 1),
    (header_name::TAG, 4),
    (header_name::KEY, 0),
    (header_name::ORDERING, 1),
    (header_name::ALGEBRA, 1),
];

/// A header name: mostly envelope names, so that inputs get past
/// "missing", plus near misses (which must be ignored) and anything else.
#[derive(Debug, Arbitrary)]
enum Name {
    Envelope(u8),
    /// An envelope name, changed so that it no longer matches: upper case,
    /// a trailing space, or a prefix.
    NearMiss(u8, u8),
    Other(String),
}

impl Name {
    fn into_string(self) -> String {
        match self {
            Name::Envelope(i) => ENVELOPE[usize::from(i) % 5].0.to_owned(),
            Name::NearMiss(i, how) => {
                let name = ENVELOPE[usize::from(i) % 5].0;
                match how % 3 {
                    0 => name.to_uppercase(),
                    1 => format!("{name} "),
                    _ => format!("x-{name}"),
                }
            }
            Name::Other(name) => name,
        }
    }
}

/// What the fuzzer builds a header list from.
#[derive(Debug, Arbitrary)]
enum Input {
    /// Any list of headers.
    Raw(Vec<(Name, Vec<u8>)>),
    /// A mostly well-formed envelope, then edits: so that inputs reach the
    /// success path often, and its neighbours (one header repeated, moved,
    /// dropped, cut short, set to an unknown value, foreign ones between).
    Edited { tag: u32, key: u64, version: Option<u8>, ordering: u8, algebra: u8, edits: Vec<Edit> },
}

/// One change to a header list; positions wrap around its length.
#[derive(Debug, Arbitrary)]
enum Edit {
    Insert { at: u8, name: Name, value: Vec<u8> },
    Remove { at: u8 },
    SetValue { at: u8, value: Vec<u8> },
    Move { from: u8, to: u8 },
    Repeat { at: u8 },
}

impl Input {
    fn into_headers(self) -> Vec<Header> {
        let header = |name: &str, value: &[u8]| Header { name: name.to_owned(), value: value.to_vec() };
        match self {
            Input::Raw(headers) => {
                headers.into_iter().map(|(name, value)| Header { name: name.into_string(), value }).collect()
            }
            Input::Edited { tag, key, version, ordering, algebra, edits } => {
                // Values one past the known ones now and then.
                let mut headers = vec![
                    header(header_name::VERSION, &[version.unwrap_or(HEADER_FORMAT_VERSION)]),
                    header(header_name::TAG, &tag.to_le_bytes()),
                    header(header_name::KEY, Key::int(key).as_bytes()),
                    header(header_name::ORDERING, &[ordering % 5]),
                    header(header_name::ALGEBRA, &[algebra % 6]),
                ];
                for edit in edits {
                    let at = |i: u8, len: usize| usize::from(i) % len.max(1);
                    match edit {
                        Edit::Insert { at: i, name, value } => {
                            let i = at(i, headers.len() + 1);
                            headers.insert(i, Header { name: name.into_string(), value });
                        }
                        Edit::Remove { at: i } if !headers.is_empty() => {
                            headers.remove(at(i, headers.len()));
                        }
                        Edit::SetValue { at: i, value } if !headers.is_empty() => {
                            let i = at(i, headers.len());
                            headers[i].value = value;
                        }
                        Edit::Move { from, to } if !headers.is_empty() => {
                            let moved = headers.remove(at(from, headers.len()));
                            let to = at(to, headers.len() + 1);
                            headers.insert(to, moved);
                        }
                        Edit::Repeat { at: i } if !headers.is_empty() => {
                            let repeated = headers[at(i, headers.len())].clone();
                            headers.push(repeated);
                        }
                        _ => {}
                    }
                }
                headers
            }
        }
    }
}

fuzz_target!(|input: Input| {
    let headers = input.into_headers();
    let parsed = EventHeaders::parse(headers.iter().map(|h| (h.name.as_str(), h.value.as_slice())));
    assert_eq!(parsed, EventHeaders::parse_stored(&headers), "parse and parse_stored disagree");

    // The values each envelope header has in the input, in input order.
    let values: [Vec<&[u8]>; 5] = std::array::from_fn(|slot| {
        headers.iter().filter(|h| h.name == ENVELOPE[slot].0).map(|h| h.value.as_slice()).collect()
    });
    match parsed {
        Ok(event) => {
            // Each envelope header once, right length, known values: and the
            // value is what those bytes say.
            let [version, tag, key, ordering, algebra] = values.map(|v| match v[..] {
                [once] => once,
                _ => panic!("parsed although a header is missing or repeated: {headers:?}"),
            });
            assert_eq!(version, [HEADER_FORMAT_VERSION]);
            assert_eq!(event.tag, EventTypeTag::new(u32::from_le_bytes(tag.try_into().unwrap())));
            assert_eq!(event.key.as_bytes(), key);
            assert_eq!(ordering, [EventAtomicOrdering::ALL.iter().position(|o| *o == event.ordering).unwrap() as u8]);
            assert_eq!(algebra, [Algebra::ALL.iter().position(|a| *a == event.algebra).unwrap() as u8]);

            // Round trip: the same bytes, and the same value back.
            let written = event.to_headers();
            let mut envelope: Vec<Header> =
                headers.iter().filter(|h| ENVELOPE.iter().any(|(n, _)| h.name == *n)).cloned().collect();
            envelope.sort_by_key(|h| ENVELOPE.iter().position(|(n, _)| h.name == *n));
            assert_eq!(written, envelope, "to_headers differs from the parsed envelope");
            assert_eq!(EventHeaders::parse_stored(&written), Ok(event));
        }
        Err(error) => {
            let message = error.to_string();
            let named = |name: &str| {
                assert!(message.contains(name), "error `{message}` does not name `{name}`");
                let slot = ENVELOPE.iter().position(|(n, _)| *n == name).expect("an envelope header");
                (slot, &values[slot])
            };
            let one_byte = |found: u8, values: &[&[u8]]| values.iter().any(|v| *v == [found]);
            let real = match error {
                HeaderError::Missing { name } => named(name).1.is_empty(),
                HeaderError::Duplicate { name } => named(name).1.len() > 1,
                HeaderError::WrongLength { name, expected, found } => {
                    let (slot, values) = named(name);
                    expected == ENVELOPE[slot].1 && found != expected && values.iter().any(|v| v.len() == found)
                }
                HeaderError::UnknownVersion { found } => found != HEADER_FORMAT_VERSION && one_byte(found, &values[0]),
                HeaderError::UnknownOrdering { found } => {
                    usize::from(found) >= EventAtomicOrdering::ALL.len() && one_byte(found, &values[3])
                }
                HeaderError::UnknownAlgebra { found } => {
                    usize::from(found) >= Algebra::ALL.len() && one_byte(found, &values[4])
                }
                HeaderError::InvalidKey(ref reason) => {
                    values[2].iter().any(|v| Key::from_canonical(v).as_ref().err() == Some(reason))
                }
                other => panic!("an error this target does not know: {other:?}"),
            };
            assert!(real, "error `{message}` ({error:?}) is not true of the input: {headers:?}");
        }
    }
});
