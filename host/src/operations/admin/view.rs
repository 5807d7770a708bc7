//! Views of a projection's state for people and tools: a key's entries
//! and the shared counters, one page at a time.
//!
//! What a module wrote decides how much state there is, so no view reads
//! or answers all of it: a page holds at most [`MAX_PAGE`] items (a
//! default of [`ENTRIES_PAGE`] entries or [`COUNTERS_PAGE`] counters), and
//! a page of entries stops once its values reach [`ENTRIES_PAGE_BYTES`]
//! (the first entry always comes). Each page names the next one: `after`
//! the name the page says (`entries_next`, `counters_next` or `next`),
//! present when there may be more. Names are in byte order.
//!
//! A key's view ([`KeyView`]) carries the first page of counters too, as it
//! did all of them before counters had a view of their own
//! ([`CountersView`]); a projection with more counters says so with
//! `counters_next`.
//!
//! Entry values that are JSON stay JSON, others become strings. The
//! endpoint passes JSON values on as they are ([`serde_json::value::RawValue`]),
//! never as a parsed tree, which could take many times a value's size.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::value::RawValue;

use crate::key::Key;
use crate::storage::state::{StateError, StateStore};

/// The default number of entries on a page of a key's view.
pub const ENTRIES_PAGE: usize = 100;
/// The default number of counters on a page of the counters' view; a key's
/// view shows this many too.
pub const COUNTERS_PAGE: usize = 100;
/// The most items a page holds, whatever `limit` asks.
pub const MAX_PAGE: usize = 1_000;
/// A page of entries stops once its values hold this many bytes.
pub const ENTRIES_PAGE_BYTES: usize = 1 << 20;

/// Which page a view shows: items after `after` (from the first without
/// it), at most `limit` of them (capped at [`MAX_PAGE`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    /// Show items after this name.
    pub after: Option<String>,
    /// The most items to show; `None`: the view's default.
    pub limit: Option<usize>,
}

impl Page {
    /// The page's size: `limit`, or `default`, at most [`MAX_PAGE`] and at
    /// least 1.
    fn size(&self, default: usize) -> usize {
        self.limit.unwrap_or(default).clamp(1, MAX_PAGE)
    }
}

/// An entry's value as a view shows it.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum EntryValue {
    /// A value that is JSON, as it was written.
    Json(Box<RawValue>),
    /// Any other value, as text (invalid UTF-8 replaced).
    Text(String),
}

impl EntryValue {
    fn of(bytes: Vec<u8>) -> Self {
        match serde_json::from_slice::<Box<RawValue>>(&bytes) {
            Ok(json) => Self::Json(json),
            Err(_) => Self::Text(String::from_utf8_lossy(&bytes).into_owned()),
        }
    }
}

/// A key's view: one page of its entries, and the first page of the
/// counters.
#[derive(Debug, Serialize)]
pub struct KeyView {
    /// The key, as JSON.
    pub key: serde_json::Value,
    /// The page's entries, by name.
    pub entries: BTreeMap<String, EntryValue>,
    /// Where the next page of entries starts (`after`), when there may be
    /// more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entries_next: Option<String>,
    /// The first counters, by name.
    pub counters: BTreeMap<String, serde_json::Value>,
    /// Where the next page of counters starts (`after` on the counters'
    /// view), when there are more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters_next: Option<String>,
}

/// A page of the counters' view.
#[derive(Debug, Serialize)]
pub struct CountersView {
    /// The page's counters, by name.
    pub counters: BTreeMap<String, serde_json::Value>,
    /// Where the next page starts (`after`), when there are more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// A page of `key`'s entries (or only `entry`, when given), with the first
/// counters.
pub fn key_view(store: &StateStore, key: &Key, entry: Option<&str>, page: &Page) -> Result<KeyView, StateError> {
    let (entries, entries_next) = match entry {
        Some(name) => (store.get(key, name)?.map(|value| (name.to_owned(), value)).into_iter().collect(), None),
        None => {
            let size = page.size(ENTRIES_PAGE);
            // One more than the page, to know whether there are more.
            let mut entries = store.entries_page(key, page.after.as_deref(), size + 1, ENTRIES_PAGE_BYTES)?;
            let bytes: usize = entries.iter().map(|(_, value)| value.len()).sum();
            let more = entries.len() > size || bytes >= ENTRIES_PAGE_BYTES;
            entries.truncate(size);
            let next = more.then(|| entries.last().map(|(name, _)| name.clone())).flatten();
            (entries, next)
        }
    };
    let counters = counters_view(store, &Page::default())?;
    Ok(KeyView {
        key: key.value().to_json(),
        entries: entries.into_iter().map(|(name, value)| (name, EntryValue::of(value))).collect(),
        entries_next,
        counters: counters.counters,
        counters_next: counters.next,
    })
}

/// A page of the counters.
pub fn counters_view(store: &StateStore, page: &Page) -> Result<CountersView, StateError> {
    let size = page.size(COUNTERS_PAGE);
    let mut counters = store.counters_page(page.after.as_deref(), size + 1)?;
    let more = counters.len() > size;
    counters.truncate(size);
    let next = more.then(|| counters.last().map(|(name, _)| name.clone())).flatten();
    Ok(CountersView { counters: counters.into_iter().map(|(name, value)| (name, counter_json(value))).collect(), next })
}

/// A counter as a JSON number; the rare value past the i64 range (several
/// keys' changes summed in one batch) as a string of its digits.
pub fn counter_json(value: i128) -> serde_json::Value {
    i64::try_from(value).map_or_else(|_| value.to_string().into(), serde_json::Value::from)
}

/// Why a view's query string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// A parameter the view does not take.
    #[error("unknown query parameter `{0}` (this view takes {1})")]
    Unknown(String, &'static str),
    /// A parameter given twice.
    #[error("query parameter `{0}` is given twice")]
    Twice(String),
    /// A value that is not percent-encoded UTF-8.
    #[error("query parameter `{0}` is not percent-encoded UTF-8")]
    NotUtf8(String),
    /// A `limit` that is not a number from 1 up.
    #[error("`limit` is a number of items from 1 to {MAX_PAGE}; `{0}` is not")]
    Limit(String),
}

/// The parameters of a query string (`after=a%20b&limit=10`), each at most
/// once and each one of `known`.
pub fn parse_query(
    query: Option<&str>,
    known: &'static [&'static str],
    listed: &'static str,
) -> Result<BTreeMap<String, String>, QueryError> {
    let mut parameters = BTreeMap::new();
    for pair in query.unwrap_or_default().split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |text: &str| {
            // Form encoding writes a space as `+`.
            let text = text.replace('+', " ");
            percent_encoding::percent_decode_str(&text).decode_utf8().map(|text| text.into_owned())
        };
        let name = decode(name).map_err(|_| QueryError::NotUtf8(name.to_owned()))?;
        if !known.contains(&name.as_str()) {
            return Err(QueryError::Unknown(name, listed));
        }
        let value = decode(value).map_err(|_| QueryError::NotUtf8(name.clone()))?;
        if parameters.insert(name.clone(), value).is_some() {
            return Err(QueryError::Twice(name));
        }
    }
    Ok(parameters)
}

/// The page the parameters `after` and `limit` ask for.
pub fn page_of(parameters: &BTreeMap<String, String>) -> Result<Page, QueryError> {
    let limit = match parameters.get("limit") {
        None => None,
        Some(text) => match text.parse::<usize>() {
            Ok(limit) if limit >= 1 => Some(limit),
            _ => return Err(QueryError::Limit(text.clone())),
        },
    };
    Ok(Page { after: parameters.get("after").cloned(), limit })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::state::{BatchCommit, KeyWrites};

    fn store_with(entries: usize, value: &[u8], counters: usize) -> (tempfile::TempDir, StateStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("s.redb")).unwrap();
        let mut writes = KeyWrites::default();
        for i in 0..entries {
            writes.set(&format!("e{i:04}"), value.to_vec());
        }
        let counter_deltas = (0..counters).map(|i| (format!("c{i:05}"), i as i128)).collect();
        store
            .commit(BatchCommit { writes: vec![(Key::int(1), writes)], counter_deltas, ..Default::default() })
            .unwrap();
        (dir, store)
    }

    #[test]
    fn a_key_view_shows_a_page_of_entries_and_the_first_counters_whatever_the_store_holds() {
        let (_dir, store) = store_with(250, b"{\"n\": 1}", 2_500);
        let view = key_view(&store, &Key::int(1), None, &Page::default()).unwrap();
        assert_eq!((view.entries.len(), view.entries_next.as_deref()), (ENTRIES_PAGE, Some("e0099")));
        assert_eq!((view.counters.len(), view.counters_next.as_deref()), (COUNTERS_PAGE, Some("c00099")));
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["entries"]["e0000"], serde_json::json!({ "n": 1 }), "JSON stays JSON");
        assert_eq!(json["key"], serde_json::json!(1));
        // The next pages, to the end.
        let page = Page { after: Some("e0199".into()), limit: Some(500) };
        let view = key_view(&store, &Key::int(1), None, &page).unwrap();
        assert_eq!((view.entries.len(), view.entries_next), (50, None));
        let page = Page { after: Some("c02000".into()), limit: Some(5_000) };
        let counters = counters_view(&store, &page).unwrap();
        assert_eq!((counters.counters.len(), counters.next), (499, None));
        let counters = counters_view(&store, &Page { after: None, limit: Some(5_000) }).unwrap();
        assert_eq!((counters.counters.len(), counters.next.as_deref()), (MAX_PAGE, Some("c00999")));
        // One entry only.
        let view = key_view(&store, &Key::int(1), Some("e0007"), &Page::default()).unwrap();
        assert_eq!(view.entries.keys().collect::<Vec<_>>(), ["e0007"]);
        assert!(key_view(&store, &Key::int(1), Some("none"), &Page::default()).unwrap().entries.is_empty());
    }

    #[test]
    fn a_page_of_entries_stops_at_its_bytes_and_other_values_are_text() {
        let (_dir, store) = store_with(5, &[b'x'; 400 << 10], 0);
        let view = key_view(&store, &Key::int(1), None, &Page::default()).unwrap();
        assert_eq!(view.entries.len(), 3, "1 MiB is reached by the third value of 400 KiB");
        assert_eq!(view.entries_next.as_deref(), Some("e0002"));
        assert!(matches!(&view.entries["e0000"], EntryValue::Text(text) if text.len() == 400 << 10));
        assert_eq!(counters_view(&store, &Page::default()).unwrap().next, None);
    }

    #[test]
    fn query_strings_are_decoded_and_checked() {
        const KNOWN: &[&str] = &["after", "limit"];
        let parsed = parse_query(Some("after=a%20b+c&limit=7"), KNOWN, "after, limit").unwrap();
        assert_eq!(page_of(&parsed).unwrap(), Page { after: Some("a b c".into()), limit: Some(7) });
        assert_eq!(page_of(&parse_query(None, KNOWN, "").unwrap()).unwrap(), Page::default());
        let error = parse_query(Some("afterr=x"), KNOWN, "after, limit").unwrap_err();
        assert_eq!(error.to_string(), "unknown query parameter `afterr` (this view takes after, limit)");
        assert_eq!(parse_query(Some("limit=1&limit=2"), KNOWN, "").unwrap_err(), QueryError::Twice("limit".into()));
        assert_eq!(parse_query(Some("after=%FF"), KNOWN, "").unwrap_err(), QueryError::NotUtf8("after".into()));
        for bad in ["limit=0", "limit=-1", "limit=x"] {
            let parameters = parse_query(Some(bad), KNOWN, "").unwrap();
            assert!(matches!(page_of(&parameters), Err(QueryError::Limit(_))), "{bad}");
        }
    }
}
