//! A polled batch: the records of one read held in one buffer, each record
//! a view into it.
//!
//! The consumer reads thousands of records per batch and needs, of each, its
//! envelope headers once and its body once. Decoding every record into an
//! owned [`Record`] costs a `String` and a `Vec` per header and a `Vec` per
//! body; a [`PolledBatch`] instead keeps the records' stored encoding in one
//! buffer and an index of where each record's headers and body lie in it.
//! Headers are read off the encoding when asked for (the consumer asks once
//! per record), so the index stays a few words per record.
//!
//! Rules it keeps:
//! - **Checked once, when the batch is filled.** Each record is walked as the
//!   postcard encoding of a [`Record`] when it is pushed: lengths inside the
//!   buffer, header names UTF-8, no trailing bytes. What fails is refused
//!   with the reason (the log reports it as corrupt), so a view never meets
//!   a bad encoding later.
//! - **Exactly the record.** [`RecordView::to_record`] gives back the
//!   [`Record`] that was pushed or stored, header for header, byte for byte.
//! - **A record taken out is its encoding.** [`RecordView::to_encoded`]
//!   copies one record's stored bytes out alone ([`EncodedRecord`]: one
//!   allocation of exactly its size, so it keeps no poll's buffer alive),
//!   and [`PolledBatch::push_record`] copies them into another batch as
//!   they are: never decoded into headers and a body, never encoded or
//!   checked again. The release stage holds records so.
//! - **A polled record says when the log appended it**
//!   ([`RecordView::append_time`]), where the log keeps that (the embedded
//!   log's `append-times`, Iggy's message timestamps): the evidence the
//!   release stage bounds event times by. A record taken into another batch
//!   ([`PolledBatch::push_record`]) has none: it was judged when polled.
//! - **A batch gathered from several inputs says where each record came
//!   from** ([`RecordView::input`]: for a projection over several topics,
//!   the topic's index); 0 for every record of a poll.
//! - **No allocation per record.** The buffer and the index
//!   grow with the batch and are kept across polls ([`PolledBatch::clear`]),
//!   so a partition that polls batches of one size allocates them once.
//! - **Bounded in bytes, not only in records.** A poll stops once the
//!   buffer holds [`PolledBatch::BYTE_BUDGET`] (always taking at least one
//!   record), so a publisher's large messages cannot make one poll of
//!   thousands of records hold gigabytes. A backend that fetches records
//!   over the network (Iggy) sizes each fetch from the budget left, so
//!   what it fetches stays near the budget too, not only what it keeps.

use super::Record;
use crate::event::Header;

/// Records of one partition read at once, in offset order, in one buffer.
#[derive(Debug, Clone)]
pub struct PolledBatch {
    /// The records' postcard encodings, back to back.
    bytes: Vec<u8>,
    /// One entry per record, in offset order.
    records: Vec<Entry>,
    /// Once `bytes` holds this much, the batch takes no more records.
    byte_budget: usize,
}

impl Default for PolledBatch {
    fn default() -> Self {
        Self::with_byte_budget(Self::BYTE_BUDGET)
    }
}

/// Where one record lies in the buffer.
#[derive(Debug, Clone, Copy)]
struct Entry {
    offset: u64,
    /// The input it came from ([`RecordView::input`]).
    input: u32,
    /// When the log appended it, in ms since the Unix epoch
    /// ([`RecordView::append_time`]).
    append_time: Option<i64>,
    /// Where its encoding starts (its header count).
    start: usize,
    /// Where its first header starts (after the header count).
    headers: usize,
    /// How many headers it has.
    count: usize,
    /// Its body's range.
    body: (usize, usize),
}

impl Entry {
    /// The entry of the record of `offset` read from `input`, whose
    /// encoding starts at `start` and has the parts `layout` says.
    fn placed(offset: u64, input: u32, start: usize, Layout { headers, count, body }: Layout) -> Self {
        let body = (start + body.0, start + body.1);
        Entry { offset, input, append_time: None, start, headers: start + headers, count, body }
    }
}

impl PolledBatch {
    /// How many bytes of stored records a batch takes before it is full:
    /// 32 MiB, far above what a batch of ordinary events holds (a default
    /// batch of 65 536 of the demo's events is about 5 MiB).
    pub const BYTE_BUDGET: usize = 32 << 20;

    /// An empty batch with the default [`BYTE_BUDGET`](Self::BYTE_BUDGET).
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch that is full once it holds `byte_budget` bytes of
    /// stored records (and at least one record).
    pub fn with_byte_budget(byte_budget: usize) -> Self {
        Self { bytes: Vec::new(), records: Vec::new(), byte_budget }
    }

    /// How many bytes of stored records the batch takes before it is full.
    pub fn byte_budget(&self) -> usize {
        self.byte_budget
    }

    /// Whether a poll should stop adding records: the batch holds at least
    /// one record and its byte budget is spent. Every log's `poll` stops
    /// here, so one poll holds at most the budget plus one record (Iggy's
    /// stops by the same rule as it fetches, counting
    /// [`Record::byte_len`], a few bytes per header below the encoding).
    pub fn is_full(&self) -> bool {
        !self.records.is_empty() && self.bytes.len() >= self.byte_budget
    }

    /// Removes every record, keeping the buffers for the next poll.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.records.clear();
    }

    /// Appends a record from its stored encoding (postcard, as
    /// [`Record`]'s `Serialize` writes it), checked; on an error nothing is
    /// added and the reason is returned.
    pub fn push_encoded(&mut self, offset: u64, encoded: &[u8]) -> Result<(), String> {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(encoded);
        self.index(offset, start)
    }

    /// Appends an owned record (encoded apart first, so that a failure
    /// leaves the buffer as it was).
    pub fn push(&mut self, offset: u64, record: &Record) -> Result<(), String> {
        let encoded = postcard::to_allocvec(record).map_err(|e| e.to_string())?;
        self.push_encoded(offset, &encoded)
    }

    /// Makes room for `records` more records of `bytes` bytes of stored
    /// encodings in all, so that pushing them grows nothing (what is
    /// already there is kept).
    pub fn reserve(&mut self, records: usize, bytes: usize) {
        self.records.reserve(records);
        self.bytes.reserve(bytes);
    }

    /// Appends a record taken out of a batch ([`RecordView::to_encoded`]),
    /// read from `input`: its bytes copied in as they are, checked when
    /// they were first pushed.
    pub fn push_record(&mut self, offset: u64, input: u32, record: &EncodedRecord) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(&record.bytes);
        self.records.push(Entry::placed(offset, input, start, record.layout));
    }

    /// Checks and indexes the encoded record that starts at `start` and
    /// runs to the end of the buffer; on an error, removes it again.
    fn index(&mut self, offset: u64, start: usize) -> Result<(), String> {
        match check(&self.bytes[start..]) {
            Ok(layout) => {
                self.records.push(Entry::placed(offset, 0, start, layout));
                Ok(())
            }
            Err(reason) => {
                self.bytes.truncate(start);
                Err(reason)
            }
        }
    }

    /// Gives every record the append time `append_time` answers for its
    /// offset ([`RecordView::append_time`]).
    pub fn stamp_append_times(&mut self, mut append_time: impl FnMut(u64) -> Option<i64>) {
        for entry in &mut self.records {
            entry.append_time = append_time(entry.offset);
        }
    }

    /// Gives the last record pushed the append time `millis`.
    pub fn stamp_last(&mut self, millis: Option<i64>) {
        if let Some(entry) = self.records.last_mut() {
            entry.append_time = millis;
        }
    }

    /// Keeps only the records whose offset `keep` accepts (their bytes
    /// stay in the buffer until the next poll clears it).
    pub fn retain_offsets(&mut self, mut keep: impl FnMut(u64) -> bool) {
        self.records.retain(|entry| keep(entry.offset));
    }

    /// How many records the batch holds.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the batch holds no record.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The records, in offset order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = RecordView<'_>> {
        self.records.iter().map(|entry| RecordView { batch: self, entry })
    }

    /// The last record, if any.
    pub fn last(&self) -> Option<RecordView<'_>> {
        self.records.last().map(|entry| RecordView { batch: self, entry })
    }
}

/// Where the parts of one encoded record lie, relative to its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    headers: usize,
    count: usize,
    body: (usize, usize),
}

/// Checks one postcard-encoded [`Record`]: a header count, each header's
/// name (UTF-8) and value, the body, nothing after. Accepts exactly what
/// postcard's own decoding of a [`Record`] accepts (a test checks it).
fn check(encoded: &[u8]) -> Result<Layout, String> {
    // Where `rest` starts in `encoded`.
    let at = |rest: &[u8]| encoded.len() - rest.len();
    let (count, mut rest) = take_len(encoded).ok_or("bad header count")?;
    let headers = at(rest);
    for index in 0..count {
        let (name, _, after) = take_header(rest).ok_or_else(|| format!("header {index} is cut short"))?;
        std::str::from_utf8(name).map_err(|e| format!("header {index}: name is not UTF-8: {e}"))?;
        rest = after;
    }
    let (body, after) = take_bytes(rest).ok_or("the body is cut short")?;
    if !after.is_empty() {
        return Err(format!("{} trailing bytes", after.len()));
    }
    Ok(Layout { headers, count, body: (at(after) - body.len(), at(after)) })
}

/// One header off the front of `bytes`: its name, its value, what follows.
fn take_header(bytes: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let (name, rest) = take_bytes(bytes)?;
    let (value, rest) = take_bytes(rest)?;
    Some((name, value, rest))
}

/// A length-prefixed byte string off the front of `bytes`, and what follows.
fn take_bytes(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = take_len(bytes)?;
    (len <= rest.len()).then(|| rest.split_at(len))
}

/// A length off the front of `bytes`, as postcard writes a `usize`:
/// unsigned LEB128 of a u64, at most 10 bytes, no bits past the 64th.
/// Read here rather than through postcard's deserializer because it runs
/// a dozen times per record on the consumer's hot path.
fn take_len(bytes: &[u8]) -> Option<(usize, &[u8])> {
    const MAX_BYTES: usize = 10;
    let mut value = 0u64;
    for (index, &byte) in bytes.iter().enumerate().take(MAX_BYTES) {
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            // The tenth byte holds only the 64th bit.
            if index == MAX_BYTES - 1 && byte > 1 {
                return None;
            }
            return Some((usize::try_from(value).ok()?, &bytes[index + 1..]));
        }
    }
    None
}

/// One record of a [`PolledBatch`], borrowed from its buffer.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    batch: &'a PolledBatch,
    entry: &'a Entry,
}

impl<'a> RecordView<'a> {
    /// The record's offset in its partition.
    pub fn offset(&self) -> u64 {
        self.entry.offset
    }

    /// The input it was read from, in a batch gathered from several
    /// ([`PolledBatch::push_record`]); 0 in a poll.
    pub fn input(&self) -> u32 {
        self.entry.input
    }

    /// When the log appended it, in milliseconds since the Unix epoch: none
    /// where the log does not say (a record written before the embedded log
    /// kept append times, or one taken into another batch).
    pub fn append_time(&self) -> Option<i64> {
        self.entry.append_time
    }

    /// The user headers, in the order they were written: name and value
    /// bytes (names were checked to be UTF-8 when the batch was filled).
    pub fn headers(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + use<'a> {
        // Checked when pushed, so every header is there.
        let rest = &self.batch.bytes[self.entry.headers..];
        (0..self.entry.count).scan(rest, |rest, _| {
            let (name, value, after) = take_header(rest)?;
            *rest = after;
            Some((name, value))
        })
    }

    /// The body.
    pub fn body(&self) -> &'a [u8] {
        &self.batch.bytes[self.entry.body.0..self.entry.body.1]
    }

    /// Its size as stored, headers and body.
    pub fn stored_len(&self) -> usize {
        self.entry.body.1 - self.entry.headers
    }

    /// The headers as owned [`Header`]s, without copying the body.
    pub fn owned_headers(&self) -> Vec<Header> {
        self.headers()
            .map(|(name, value)| Header { name: String::from_utf8_lossy(name).into_owned(), value: value.to_vec() })
            .collect()
    }

    /// The record as an owned [`Record`], exactly as it was stored.
    pub fn to_record(&self) -> Record {
        Record { headers: self.owned_headers(), body: self.body().to_vec() }
    }

    /// The record's stored encoding copied out alone, for
    /// [`PolledBatch::push_record`].
    pub fn to_encoded(&self) -> EncodedRecord {
        let Entry { start, headers, count, body, .. } = *self.entry;
        EncodedRecord {
            bytes: self.batch.bytes[start..body.1].into(),
            layout: Layout { headers: headers - start, count, body: (body.0 - start, body.1 - start) },
        }
    }
}

/// One record's stored encoding, taken out of its batch alone
/// ([`RecordView::to_encoded`]) and checked when it was first pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedRecord {
    /// Exactly its bytes, so holding it holds nothing more.
    bytes: Box<[u8]>,
    layout: Layout,
}

impl EncodedRecord {
    /// Its size as stored, headers and body ([`RecordView::stored_len`]).
    pub fn stored_len(&self) -> usize {
        self.layout.body.1 - self.layout.headers
    }

    /// The bytes it takes in a batch ([`PolledBatch::push_record`]): its
    /// whole encoding, header count and lengths included.
    pub fn encoded_len(&self) -> usize {
        self.bytes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(body: &[u8]) -> Record {
        Record {
            headers: vec![
                Header { name: "waku-key".into(), value: vec![0, 1, 255] },
                Header { name: "trace-é".into(), value: vec![] },
            ],
            body: body.to_vec(),
        }
    }

    #[test]
    fn views_give_back_each_record_exactly() {
        let records = [record(b"first"), Record::default(), record(&[7; 300])];
        let mut batch = PolledBatch::new();
        for (offset, record) in (10..).zip(&records) {
            if offset % 2 == 0 {
                batch.push(offset, record).unwrap();
            } else {
                batch.push_encoded(offset, &postcard::to_allocvec(record).unwrap()).unwrap();
            }
        }
        assert_eq!(batch.len(), 3);
        for ((view, record), offset) in batch.iter().zip(&records).zip(10..) {
            assert_eq!(view.offset(), offset);
            assert_eq!(view.to_record(), *record);
            assert_eq!(view.body(), record.body.as_slice());
            let names: Vec<_> = view.headers().map(|(name, _)| name).collect();
            assert_eq!(names, record.headers.iter().map(|h| h.name.as_bytes()).collect::<Vec<_>>());
        }
        assert_eq!(batch.last().map(|view| view.offset()), Some(12));
    }

    #[test]
    fn a_record_taken_out_goes_into_another_batch_exactly_with_its_input() {
        let records = [record(b"first"), Record::default(), record(&[7; 300])];
        let mut polled = PolledBatch::new();
        for (offset, record) in (10..).zip(&records) {
            polled.push(offset, record).unwrap();
        }
        let taken: Vec<EncodedRecord> = polled.iter().map(|view| view.to_encoded()).collect();
        let mut gathered = PolledBatch::new();
        gathered.push(3, &record(b"before")).unwrap();
        for (index, record) in taken.iter().enumerate().rev() {
            gathered.push_record(20 + index as u64, index as u32 + 1, record);
        }
        let views: Vec<_> = gathered.iter().collect();
        assert_eq!((views[0].input(), views[0].to_record()), (0, record(b"before")));
        for (view, index) in views[1..].iter().zip([2usize, 1, 0]) {
            assert_eq!(view.to_record(), records[index]);
            assert_eq!((view.offset(), view.input()), (20 + index as u64, index as u32 + 1));
            assert_eq!(view.stored_len(), taken[index].stored_len());
            assert_eq!(view.to_encoded(), taken[index]);
        }
    }

    #[test]
    fn a_bad_encoding_is_refused_and_leaves_the_batch_as_it_was() {
        let mut batch = PolledBatch::new();
        batch.push(0, &record(b"kept")).unwrap();
        let good = postcard::to_allocvec(&record(b"body")).unwrap();
        let mut trailing = good.clone();
        trailing.push(0);
        let mut bad_name = good.clone();
        bad_name[2] = 0xff; // first byte of the first header's name
        for (bytes, reason) in [
            (&good[..good.len() - 1], "body"),
            (&trailing[..], "1 trailing bytes"),
            (&bad_name[..], "header 0: name is not UTF-8"),
            (&[][..], "header count"),
            (&[200, 1][..], "header 0 is cut short"), // 200 headers announced, none there
        ] {
            let error = batch.push_encoded(1, bytes).unwrap_err();
            assert!(error.contains(reason), "{error}");
            assert_eq!(batch.len(), 1);
            assert_eq!(batch.iter().next().unwrap().to_record(), record(b"kept"));
        }
        batch.push_encoded(1, &good).unwrap();
        assert_eq!(batch.last().unwrap().to_record(), record(b"body"));
    }

    #[test]
    fn accepts_exactly_what_postcard_decodes() {
        let postcard_accepts =
            |bytes: &[u8]| matches!(postcard::take_from_bytes::<Record>(bytes), Ok((_, rest)) if rest.is_empty());
        let records = [record(b"body"), Record::default(), record(&[0x80; 130])];
        let mut cases = 0;
        for encoded in records.iter().map(|r| postcard::to_allocvec(r).unwrap()) {
            let mut variants: Vec<Vec<u8>> = (0..=encoded.len()).map(|end| encoded[..end].to_vec()).collect();
            for at in 0..encoded.len() {
                for byte in [0x00, 0x01, 0x02, 0x7f, 0x80, 0xc3, 0xff] {
                    let mut changed = encoded.clone();
                    changed[at] = byte;
                    variants.push(changed);
                }
            }
            for bytes in variants {
                let ours = PolledBatch::new().push_encoded(0, &bytes);
                assert_eq!(ours.is_ok(), postcard_accepts(&bytes), "{bytes:?}: {ours:?}");
                cases += 1;
            }
        }
        // Lengths at the edges of the varint encoding.
        for bytes in
            [&[0xff; 10][..], &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], &[0x80, 0x00, 0x00]]
        {
            assert_eq!(PolledBatch::new().push_encoded(0, bytes).is_ok(), postcard_accepts(bytes), "{bytes:?}");
        }
        assert!(cases > 1000, "{cases}");
    }
}
