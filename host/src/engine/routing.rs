//! Retry routing: where events go when they cannot be applied, and the
//! records that take them there.
//!
//! | failure | what the consumer does |
//! | --- | --- |
//! | transient | the chunk is retried in place, [`RetryPolicy::transient_retries`] times with a doubling backoff, then treated as retryable |
//! | retryable, trap | the key stops; its unfinished work goes to `retry_<topic>` and later events of the key are diverted behind it |
//! | unrecoverable | the chunk goes to `dlq_<topic>`; the key goes on |
//! | retries exhausted | as unrecoverable |
//! | unreadable headers | the message goes to `dlq_<topic>` |
//! | an emitted message can never be delivered | the message goes to `dlq_<topic>` ([`crate::engine::outbox`]) |
//!
//! Rules kept here:
//! - **Records say where they came from.** Every retry and dead-letter
//!   record carries the envelope of its event plus the [`Routed`] headers:
//!   the projection it belongs to (several projections may share a topic and
//!   so its retry and dead-letter topics), the origin partition and offset,
//!   how many events it accounts for (a folded run is one record), the
//!   attempts made, when it first and last failed, and why, as text
//!   headers any consumer can read ([`context`], `waku.error.*`).
//! - **Order survives retries.** Unfinished work is written in the order it
//!   would have executed, and its orderings are rewritten
//!   ([`rewrite_orderings`]) so that planning it again keeps that order:
//!   each stage becomes a segment of its own. An attempt takes a key's
//!   waiting records from the front, in execution order; a chunk that fails
//!   there again is written again with [`Routed::ahead_of`] naming the
//!   record it goes before, and the queue puts it there
//!   ([`RetryQueue::index`]), at start-up too.
//! - **An attempt costs what it takes, not the key's backlog.** What one
//!   attempt reads is bounded in records and bytes
//!   ([`RetryQueue::take_due`]); of a key already in retry only the failed
//!   chunk (or the rest of a folded run, whose parts stand for several
//!   records) is written again, and what the attempt did not reach stays
//!   where it waits ([`RetryQueue::put_back`]), as does every record of a
//!   key that was not called at all (the batch's budget or the module's
//!   time ran out first). A key that keeps failing therefore writes each
//!   of its events to the retry topic once per attempt at most.
//! - **Delays are measured from the failure**, in wall-clock time written
//!   into the record, so they survive restarts: a record is due at
//!   `failed-at + delay(attempts)`.
//! - **The queue lives in the log.** Which keys are in retry is rebuilt
//!   from the retry topic at start-up ([`RetryQueue`]); the projection's
//!   state only holds the retry position and the offsets above it that are
//!   done, committed with the batch that did them.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::time::Duration;

use crate::platform::clock::now_ms;

use crate::event::{EventAtomicOrdering, EventHeaders, Header, HeaderError};
use crate::key::Key;
use crate::reduce::Origin;
use crate::sandbox::handler::{CallError, ErrorClass};
use crate::storage::log::{Record, StoredRecord};

pub(crate) mod context;

/// The retry topic of `topic`.
pub fn retry_topic(topic: &str) -> String {
    format!("retry_{topic}")
}

/// The dead-letter topic of `topic`.
pub fn dlq_topic(topic: &str) -> String {
    format!("dlq_{topic}")
}

/// Where a projection's failures go: its retry and dead-letter topics.
///
/// Both stay under the host-owned prefixes `retry_` and `dlq_`, which
/// modules may never emit to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedTopics {
    topic: String,
    retry: String,
    dlq: String,
}

impl RoutedTopics {
    /// The topic's shared ones, `retry_<topic>` and `dlq_<topic>`: every
    /// projection of the topic routes there, its records tagged with its
    /// name.
    pub fn shared(topic: &str) -> Self {
        Self { topic: topic.to_owned(), retry: retry_topic(topic), dlq: dlq_topic(topic) }
    }

    /// A rebuild shadow's own, `retry_<topic>.rebuild` and
    /// `dlq_<topic>.rebuild`, so a rebuild never adds to what the live
    /// projection and its readers of the shared ones see.
    pub fn shadow(topic: &str) -> Self {
        Self {
            topic: topic.to_owned(),
            retry: format!("{}.rebuild", retry_topic(topic)),
            dlq: format!("{}.rebuild", dlq_topic(topic)),
        }
    }

    /// The topic whose failures go here.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The retry topic.
    pub fn retry(&self) -> &str {
        &self.retry
    }

    /// The dead-letter topic.
    pub fn dlq(&self) -> &str {
        &self.dlq
    }
}

/// Why an event left the normal path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// The handler said "try again right away", more often than allowed.
    Transient,
    /// The handler said "try again later".
    Retryable,
    /// The handler said "this will never succeed".
    Unrecoverable,
    /// The guest trapped (panic, CPU budget, memory, stack) or broke the
    /// contract.
    Trap,
    /// The message's headers could not be read.
    Malformed,
    /// A message a handler emitted can never be delivered (its topic is
    /// missing or invalid, or the log refuses the record); the letter is the
    /// message, not an event.
    Undeliverable,
}

impl FailureClass {
    /// Every class.
    pub const ALL: [Self; 6] =
        [Self::Transient, Self::Retryable, Self::Unrecoverable, Self::Trap, Self::Malformed, Self::Undeliverable];

    /// Its name on the wire and in output.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Retryable => "retryable",
            Self::Unrecoverable => "unrecoverable",
            Self::Trap => "trap",
            Self::Malformed => "malformed",
            Self::Undeliverable => "undeliverable",
        }
    }

    /// The class a failed call is routed as.
    pub fn of(error: &CallError) -> Self {
        match error {
            CallError::Handler { class: ErrorClass::Transient, .. } => Self::Transient,
            CallError::Handler { class: ErrorClass::Retryable, .. } => Self::Retryable,
            CallError::Handler { class: ErrorClass::Unrecoverable, .. } => Self::Unrecoverable,
            CallError::Trap { .. } => Self::Trap,
            // An answer that breaks the contract (a `combine` body out of
            // bounds, a key not canonical) fails as retryable, as the WIT
            // states: a fixed module can take the events back.
            CallError::Contract(_)
            // Decided by the host: the key is tried again in a later batch.
            | CallError::BatchBudget { .. }
            | CallError::BatchBudgetSpent { .. }
            | CallError::HostMemory { .. }
            | CallError::BatchTime { .. }
            | CallError::HostFault(_) => Self::Retryable,
        }
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How failures are retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// How often a chunk that failed transiently is retried in place before
    /// it is treated as retryable. Default 3.
    pub transient_retries: u32,
    /// The first in-place backoff; it doubles with every try. Default 10 ms.
    pub transient_backoff: Duration,
    /// The delay before attempt n + 1 is `delays[n - 1]`, the last entry
    /// repeating. Default 1 s, 5 s, 30 s, 2 min, 10 min.
    pub delays: Vec<Duration>,
    /// Attempts (the first one included) before a retryable failure goes to
    /// the dead-letter topic. Default 6; 1 sends it there at once.
    pub max_attempts: u32,
    /// The most memory a partition's retry queue may hold
    /// ([`RetryQueue::held_bytes`]). Past it the partition reads no more of
    /// its topic until retries drain, so a module that keeps failing costs
    /// the host this much memory per partition, not a record per event of
    /// the backlog. Default 64 MiB (about a million waiting events).
    pub queue_max_bytes: usize,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            transient_retries: 3,
            transient_backoff: Duration::from_millis(10),
            delays: [1, 5, 30, 120, 600].map(Duration::from_secs).to_vec(),
            max_attempts: 6,
            queue_max_bytes: 64 << 20,
        }
    }
}

impl RetryPolicy {
    /// How long after a failure a record that has had `attempts` attempts
    /// is tried again. Zero for records that have not failed (attempts 0).
    pub fn delay(&self, attempts: u32) -> Duration {
        match attempts {
            0 => Duration::ZERO,
            n => self.delays.get(n as usize - 1).or(self.delays.last()).copied().unwrap_or_default(),
        }
    }
}

/// Why an event failed, as its retry or dead-letter record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The class.
    pub class: FailureClass,
    /// The handler's (or the host's) message.
    pub message: String,
    /// The module that failed; empty when no module was involved.
    pub module: String,
    /// Its version (content hash); empty when no module was involved.
    pub version: String,
}

impl Failure {
    /// The most of its message a record of a failed chunk carries after
    /// the chunk's first, which carries all of it.
    pub const BRIEF_MESSAGE_BYTES: usize = 256;

    /// This failure as the records of a failed chunk after its first carry
    /// it: the message cut to [`Self::BRIEF_MESSAGE_BYTES`], saying where
    /// it is whole (the record of origin offset `whole_at`), if anywhere. A
    /// chunk of many events then writes a long message once, not once per
    /// event.
    pub fn brief(&self, whole_at: Option<u64>) -> Failure {
        let message = match (wakuwaku_core::limits::cut(&self.message, Self::BRIEF_MESSAGE_BYTES), whole_at) {
            ((_, false), _) => self.message.clone(),
            ((kept, true), Some(first)) => format!("{kept} […cut; whole on the record of origin offset {first}]"),
            ((kept, true), None) => format!("{kept} […cut]"),
        };
        Failure { message, ..self.clone() }
    }
}

/// The headers a retry or dead-letter record carries beside the event's
/// envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    /// The projection the record belongs to.
    pub projection: String,
    /// The topic the event was read from; empty on a record an older
    /// version wrote.
    pub topic: String,
    /// The event type's name, when the host knew it; empty otherwise.
    pub event_type: String,
    /// The partition the event was first read from.
    pub origin_partition: u32,
    /// Its offset there (the earliest, for a folded run).
    pub origin_offset: u64,
    /// Events the record accounts for.
    pub events: u64,
    /// Attempts made so far; 0 for an event diverted behind its key.
    pub attempts: u32,
    /// When it failed (or was diverted, or re-driven), in ms since the epoch.
    pub failed_at_ms: u64,
    /// When its first attempt failed, in ms since the epoch; `None` before
    /// any failure, and on a record an older version wrote.
    pub first_failed_at_ms: Option<u64>,
    /// Why; `None` for an event diverted behind its key.
    pub failure: Option<Failure>,
    /// The retry offset of the record of the same key this one goes
    /// before: set on a failed chunk re-appended while later work of its
    /// key stays where it waits ([`RetryQueue::index`]).
    pub ahead_of: Option<u64>,
    /// The ordering the event had on its topic, before a retry rewrote it
    /// ([`rewrite_orderings`]); carried from the first routing through
    /// every attempt. `None` on a record an older version wrote.
    pub ordering: Option<EventAtomicOrdering>,
}

/// Names of the binary routing headers older versions wrote: read
/// ([`context::parse_legacy`]), never written.
pub mod header_name {
    /// The projection, UTF-8.
    pub const PROJECTION: &str = "waku-projection";
    /// Origin partition, u32 little-endian.
    pub const ORIGIN_PARTITION: &str = "waku-origin-partition";
    /// Origin offset, u64 little-endian.
    pub const ORIGIN_OFFSET: &str = "waku-origin-offset";
    /// Events accounted for, u64 little-endian.
    pub const EVENTS: &str = "waku-events";
    /// Attempts made, u32 little-endian.
    pub const ATTEMPTS: &str = "waku-attempts";
    /// Failure time, u64 little-endian milliseconds since the epoch.
    pub const FAILED_AT: &str = "waku-failed-at";
    /// Failure class name, UTF-8.
    pub const CLASS: &str = "waku-failure-class";
    /// Failure message, UTF-8.
    pub const MESSAGE: &str = "waku-failure";
    /// Module name, UTF-8.
    pub const MODULE: &str = "waku-module";
    /// Module version, UTF-8.
    pub const VERSION: &str = "waku-module-version";
    /// The retry offset the record goes before, u64 little-endian; optional.
    pub const AHEAD_OF: &str = "waku-ahead-of";

    /// Every routing header.
    pub const ALL: [&str; 11] = [
        PROJECTION,
        ORIGIN_PARTITION,
        ORIGIN_OFFSET,
        EVENTS,
        ATTEMPTS,
        FAILED_AT,
        CLASS,
        MESSAGE,
        MODULE,
        VERSION,
        AHEAD_OF,
    ];
}

impl Routed {
    /// The context headers, in the text scheme ([`context`]).
    pub fn to_headers(&self) -> Vec<Header> {
        context::to_headers(self)
    }

    /// Reads the context headers: the text scheme, or the binary one of
    /// older versions ([`context::parse`]).
    pub fn parse(headers: &[Header]) -> Result<Self, HeaderError> {
        context::parse(headers)
    }

    /// When the record is due again under `policy`, in ms since the epoch.
    pub fn due_ms(&self, policy: &RetryPolicy) -> u64 {
        self.failed_at_ms.saturating_add(policy.delay(self.attempts).as_millis() as u64)
    }
}

/// A record routed to the retry or dead-letter topic: the event's envelope
/// and body, plus the routing headers.
pub fn routed_record(envelope: &EventHeaders, routed: &Routed, body: Vec<u8>) -> Record {
    let mut headers = envelope.to_headers();
    headers.extend(routed.to_headers());
    Record { headers, body }
}

/// Why a message whose headers could not be read (`error`) is
/// dead-lettered: the parse error, or for a stand-in the log read in place
/// of a record it would not hand over ([`crate::storage::log::UNREADABLE`]), the
/// log's reason.
pub fn malformed_reason(record: &Record, error: &HeaderError) -> String {
    let headers = record.headers.iter().map(|h| (h.name.as_bytes(), h.value.as_slice()));
    crate::storage::log::unreadable_reason(headers).unwrap_or_else(|| error.to_string())
}

/// The dead-letter record of a message whose headers could not be read: its
/// own headers as they were (minus any that pose as routing headers) and
/// its body, plus the routing headers naming why (`message`, from
/// [`malformed_reason`]).
pub fn malformed_record(
    projection: &str,
    topic: &str,
    partition: u32,
    stored: StoredRecord,
    message: String,
) -> Record {
    let now = now_ms();
    let routed = Routed {
        projection: projection.to_owned(),
        topic: topic.to_owned(),
        event_type: String::new(),
        origin_partition: partition,
        origin_offset: stored.offset,
        events: 1,
        attempts: 0,
        failed_at_ms: now,
        first_failed_at_ms: Some(now),
        failure: Some(Failure {
            class: FailureClass::Malformed,
            message,
            module: String::new(),
            version: String::new(),
        }),
        ahead_of: None,
        ordering: None,
    };
    let mut headers: Vec<Header> =
        stored.record.headers.into_iter().filter(|h| !context::is_context_header(&h.name)).collect();
    headers.extend(routed.to_headers());
    Record { headers, body: stored.record.body }
}

/// Rewrites the orderings of unfinished work, given as `(stage, ordering)`
/// per record in execution order, so that planning the records again puts
/// every stage in a segment of its own, in the same order: the first record
/// of a stage acquires (it starts a segment, its run becomes the head), the
/// others are relaxed (same-type records join that head run, the rest
/// become body runs).
pub fn rewrite_orderings(stages: impl IntoIterator<Item = usize>) -> Vec<EventAtomicOrdering> {
    let mut previous = None;
    stages
        .into_iter()
        .map(|stage| {
            let first = previous != Some(stage);
            previous = Some(stage);
            if first { EventAtomicOrdering::Acquire } else { EventAtomicOrdering::Relaxed }
        })
        .collect()
}

/// The origin a routed record of a projection over `topics` stands for:
/// its topic's index among them, or the first's for a topic that is not
/// one of them (an older host wrote none, or the projection's topics
/// changed since).
pub fn origin_of(routed: &Routed, topics: &[String]) -> Origin {
    let topic = topics.iter().position(|topic| *topic == routed.topic).unwrap_or(0);
    Origin { topic: u32::try_from(topic).unwrap_or(0), offset: routed.origin_offset, events: routed.events }
}

/// One record of a key waiting in retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    /// Its offset in the retry partition.
    pub offset: u64,
    /// Events it accounts for.
    pub events: u64,
    /// Its size as stored (headers and body), to bound what one attempt
    /// reads.
    pub bytes: usize,
    /// When it is due (ms since the epoch).
    pub due_ms: u64,
}

/// A key in retry: its records in the order they are to be executed, which
/// is partition order except where a failed chunk was put back ahead of
/// the key's later work ([`Routed::ahead_of`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyInRetry {
    /// Its records, in execution order.
    pub records: VecDeque<Waiting>,
}

impl KeyInRetry {
    /// When its first record is due.
    pub fn due_ms(&self) -> u64 {
        self.records.front().map_or(u64::MAX, |w| w.due_ms)
    }
}

/// The keys of one partition waiting in retry, rebuilt from the retry topic.
///
/// The consumer feeds it every record of its projection appended to the
/// retry partition ([`RetryQueue::index`]), takes the first records of due
/// keys out ([`RetryQueue::take_due`]), puts back what an attempt left
/// where it waits ([`RetryQueue::put_back`]) and reads where the retry
/// position can move ([`RetryQueue::position`]).
///
/// What one attempt takes is bounded in records and bytes, however long a
/// key's backlog: a key stays in the queue (and its new events are
/// diverted behind it) until its last record is done. What the queue holds
/// in memory is counted ([`RetryQueue::held_bytes`]) so the consumer can
/// stop reading its topic while it is full.
#[derive(Debug, Default)]
pub struct RetryQueue {
    /// Keyed with a seeded hash: keys are chosen by publishers.
    keys: HashMap<Key, KeyInRetry>,
    /// Retry offsets of waiting records, to find the lowest quickly (the
    /// offset alone: a key may be long, and a backlog holds many records).
    waiting: BTreeSet<u64>,
    /// Each key by when its first record is due, so a step finds the due
    /// keys without looking at the others (a full queue holds hundreds of
    /// thousands).
    due: BTreeSet<(u64, Key)>,
    /// The canonical bytes of the keys in `keys`, together.
    key_bytes: usize,
    /// Everything below this retry offset has been indexed.
    scanned: u64,
}

/// What the queue holds per waiting record, about: its [`Waiting`] and
/// its offset in `waiting`, with what the collections add.
const BYTES_PER_RECORD: usize = 64;
/// What the queue holds per key besides its bytes, about: the map's entry,
/// the key's record deque and its place in the due index.
const BYTES_PER_KEY: usize = 128;

impl RetryQueue {
    /// An empty queue that starts indexing at `position`.
    pub fn starting_at(position: u64) -> Self {
        Self { scanned: position, ..Self::default() }
    }

    /// The offset indexing continues from.
    pub fn scanned(&self) -> u64 {
        self.scanned
    }

    /// Whether `key` has records waiting: its new events must be diverted.
    pub fn holds(&self, key: &Key) -> bool {
        self.keys.contains_key(key)
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Keys waiting.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// About what the queue holds in memory: a fixed cost per waiting record
    /// and per key, and each key's bytes.
    pub fn held_bytes(&self) -> usize {
        self.waiting.len() * BYTES_PER_RECORD + self.keys.len() * BYTES_PER_KEY + self.key_bytes
    }

    /// Changes the records of `key` (entered and counted if new) with
    /// `change`, keeping the due index in step and forgetting the key
    /// once none of its records waits.
    fn change_records<R>(&mut self, key: &Key, change: impl FnOnce(&mut VecDeque<Waiting>) -> R) -> R {
        let in_retry = match self.keys.get_mut(key) {
            Some(in_retry) => {
                self.due.remove(&(in_retry.due_ms(), key.clone()));
                in_retry
            }
            None => {
                self.key_bytes += key.as_bytes().len();
                self.keys.entry(key.clone()).or_default()
            }
        };
        let changed = change(&mut in_retry.records);
        if in_retry.records.is_empty() {
            self.keys.remove(key);
            self.key_bytes -= key.as_bytes().len();
        } else {
            self.due.insert((in_retry.due_ms(), key.clone()));
        }
        changed
    }

    /// Events waiting.
    pub fn events(&self) -> u64 {
        self.keys.values().flat_map(|k| &k.records).map(|w| w.events).sum()
    }

    /// Adds one retry record of `bytes` at `offset` for `key`, due as
    /// `routed` says. Records must come in partition order; `scanned` moves
    /// past them. A record `ahead_of` another of its key goes before it;
    /// any other goes last.
    pub fn index(&mut self, offset: u64, key: Key, routed: &Routed, bytes: usize, policy: &RetryPolicy) {
        let waiting = Waiting { offset, events: routed.events, bytes, due_ms: routed.due_ms(policy) };
        self.change_records(&key, |records| {
            let place = routed.ahead_of.and_then(|ahead_of| records.iter().position(|w| w.offset == ahead_of));
            records.insert(place.unwrap_or(records.len()), waiting);
        });
        self.waiting.insert(offset);
        self.scanned = self.scanned.max(offset + 1);
    }

    /// Moves `scanned` to `end` (records below it that are not ours, or done).
    pub fn skip_to(&mut self, end: u64) {
        self.scanned = self.scanned.max(end);
    }

    /// The earliest due time of any key.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.due.first().map(|&(due_ms, _)| due_ms)
    }

    /// Takes the first records of keys due at `now_ms`, oldest first, each
    /// key's in execution order, until they hold `max_records` records or
    /// `max_bytes` bytes (at least one record). A key with records left
    /// stays in the queue.
    pub fn take_due(&mut self, now_ms: u64, max_records: usize, max_bytes: usize) -> Vec<(Key, KeyInRetry)> {
        let (mut taken, mut records, mut bytes) = (Vec::new(), 0, 0usize);
        while let Some((due_ms, key)) = self.due.first().cloned()
            && due_ms <= now_ms
        {
            let slice = self.change_records(&key, |in_retry| {
                let mut slice = KeyInRetry::default();
                while let Some(first) = in_retry.front()
                    && (records == 0 || (records < max_records && bytes.saturating_add(first.bytes) <= max_bytes))
                {
                    records += 1;
                    bytes = bytes.saturating_add(first.bytes);
                    slice.records.push_back(in_retry.pop_front().expect("looked at"));
                }
                slice
            });
            for taken in &slice.records {
                self.waiting.remove(&taken.offset);
            }
            // A key left with records is full: nothing more fits.
            let full = self.keys.contains_key(&key);
            if !slice.records.is_empty() {
                taken.push((key, slice));
            }
            if full {
                break;
            }
        }
        taken
    }

    /// Puts records of `key` that an attempt took but left where they wait
    /// back in front of the key's others, in the order given, due no
    /// earlier than `due_ms`.
    pub fn put_back(&mut self, key: Key, left: Vec<Waiting>, due_ms: u64) {
        if left.is_empty() {
            return;
        }
        for waiting in &left {
            self.waiting.insert(waiting.offset);
        }
        self.change_records(&key, |records| {
            for waiting in left.into_iter().rev() {
                records.push_front(Waiting { due_ms: waiting.due_ms.max(due_ms), ..waiting });
            }
        });
    }

    /// The retry offset of the first record of `key` waiting, if any.
    pub fn first_waiting(&self, key: &Key) -> Option<u64> {
        self.keys.get(key).and_then(|k| k.records.front()).map(|w| w.offset)
    }

    /// The retry position: the lowest offset still waiting, or the end of
    /// what was indexed.
    pub fn position(&self) -> u64 {
        self.waiting.first().copied().unwrap_or(self.scanned)
    }
}

/// Groups sorted offsets into runs of consecutive ones, as `(first, count)`,
/// to read them back with as few reads as possible.
pub fn consecutive(offsets: impl IntoIterator<Item = u64>) -> Vec<(u64, usize)> {
    let mut ranges: Vec<(u64, usize)> = Vec::new();
    for offset in offsets {
        match ranges.last_mut() {
            Some((first, count)) if *first + *count as u64 == offset => *count += 1,
            _ => ranges.push((offset, 1)),
        }
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventTypeTag;
    use crate::key::KeyValue;

    fn routed(attempts: u32, failure: bool) -> Routed {
        Routed {
            projection: "bank".into(),
            topic: "accounts".into(),
            event_type: "deposited".into(),
            origin_partition: 2,
            origin_offset: 41,
            events: 3,
            attempts,
            failed_at_ms: 1_000,
            first_failed_at_ms: failure.then_some(500),
            failure: failure.then(|| Failure {
                class: FailureClass::Trap,
                message: "module trapped: out of fuel".into(),
                module: "bank".into(),
                version: "0123456789abcdef".into(),
            }),
            ahead_of: None,
            ordering: Some(EventAtomicOrdering::Release),
        }
    }

    #[test]
    fn routing_headers_round_trip_with_and_without_a_failure() {
        for value in [routed(2, true), routed(0, false), Routed { ahead_of: Some(7), ..routed(1, true) }] {
            assert_eq!(Routed::parse(&value.to_headers()), Ok(value.clone()));
            // What older versions wrote reads as it did: without what they
            // did not write.
            let old = Routed {
                topic: String::new(),
                event_type: String::new(),
                first_failed_at_ms: None,
                ordering: None,
                ..value
            };
            assert_eq!(Routed::parse(&context::legacy_headers(&old)), Ok(old));
        }
        let mut short = context::legacy_headers(&Routed { ahead_of: Some(7), ..routed(1, true) });
        short.last_mut().unwrap().value.pop();
        assert_eq!(
            Routed::parse(&short),
            Err(HeaderError::WrongLength { name: header_name::AHEAD_OF, expected: 8, found: 7 })
        );
    }

    #[test]
    fn older_binary_routing_headers_are_parsed_strictly() {
        let headers = context::legacy_headers(&routed(1, true));
        let without = |name: &str| headers.iter().filter(|h| h.name != name).cloned().collect::<Vec<_>>();
        assert_eq!(
            Routed::parse(&without(header_name::ATTEMPTS)),
            Err(HeaderError::Missing { name: header_name::ATTEMPTS })
        );
        // One failure header missing is an error, not "no failure".
        assert_eq!(
            Routed::parse(&without(header_name::MODULE)),
            Err(HeaderError::Missing { name: header_name::MODULE })
        );
        let mut bad = headers.clone();
        bad.iter_mut().find(|h| h.name == header_name::CLASS).unwrap().value = b"sad".to_vec();
        assert!(Routed::parse(&bad).unwrap_err().to_string().contains("unknown class \"sad\""));
        let mut short = headers.clone();
        short.iter_mut().find(|h| h.name == header_name::EVENTS).unwrap().value.pop();
        assert_eq!(
            Routed::parse(&short),
            Err(HeaderError::WrongLength { name: header_name::EVENTS, expected: 8, found: 7 })
        );
        let mut twice = headers.clone();
        twice.push(headers[0].clone());
        assert_eq!(Routed::parse(&twice), Err(HeaderError::Duplicate { name: header_name::PROJECTION }));
    }

    #[test]
    fn a_malformed_message_keeps_its_headers_but_not_forged_routing_ones() {
        let forged = Header { name: header_name::ATTEMPTS.into(), value: vec![9, 9, 9, 9] };
        let stored = StoredRecord {
            offset: 17,
            record: Record { headers: vec![Header { name: "waku-tag".into(), value: vec![1] }, forged], body: vec![7] },
            append_time: None,
        };
        let error = HeaderError::Missing { name: "waku-version" };
        let record = malformed_record("bank", "accounts", 3, stored, error.to_string());
        let routed = Routed::parse(&record.headers).unwrap();
        assert_eq!((routed.origin_partition, routed.origin_offset, routed.attempts), (3, 17, 0));
        let failure = routed.failure.unwrap();
        assert_eq!(failure.class, FailureClass::Malformed);
        assert_eq!(failure.message, "missing header `waku-version`");
        assert_eq!(record.headers[0].name, "waku-tag");
        assert_eq!(record.body, vec![7]);
    }

    #[test]
    fn a_stand_in_for_a_record_the_log_would_not_read_is_dead_lettered_with_the_logs_reason() {
        let reason = "the record has 20000000 bytes as stored, over the embedded log's limit";
        let stand_in = Record {
            headers: vec![Header { name: crate::storage::log::UNREADABLE.into(), value: reason.into() }],
            body: vec![],
        };
        let error = EventHeaders::parse_stored(&stand_in.headers).unwrap_err();
        assert_eq!(malformed_reason(&stand_in, &error), reason);
        let record = malformed_record(
            "bank",
            "accounts",
            0,
            StoredRecord { offset: 5, record: stand_in, append_time: None },
            reason.to_owned(),
        );
        let routed = Routed::parse(&record.headers).unwrap();
        assert_eq!((routed.origin_offset, routed.failure.unwrap().message.as_str()), (5, reason));
        // Only a lone such header is a stand-in.
        let forged = Record {
            headers: vec![
                Header { name: crate::storage::log::UNREADABLE.into(), value: reason.into() },
                Header { name: "waku-tag".into(), value: vec![1] },
            ],
            body: vec![],
        };
        let error = EventHeaders::parse_stored(&forged.headers).unwrap_err();
        assert_eq!(malformed_reason(&forged, &error), error.to_string());
    }

    #[test]
    fn delays_follow_the_schedule_and_repeat_the_last() {
        let policy = RetryPolicy { delays: vec![Duration::from_secs(1), Duration::from_secs(5)], ..Default::default() };
        assert_eq!(policy.delay(0), Duration::ZERO);
        assert_eq!(policy.delay(1), Duration::from_secs(1));
        assert_eq!(policy.delay(2), Duration::from_secs(5));
        assert_eq!(policy.delay(7), Duration::from_secs(5));
        assert_eq!(routed(1, true).due_ms(&policy), 2_000);
        let none = RetryPolicy { delays: vec![], ..Default::default() };
        assert_eq!(none.delay(3), Duration::ZERO);
    }

    #[test]
    fn rewritten_orderings_make_each_stage_a_segment() {
        use crate::plan::{Plan, PlanRecord};
        let tag = EventTypeTag::new;
        // Unfinished work in execution order: stage 0 = body runs A, B;
        // stage 1 = tail run C; stage 2 = head A.
        let work = [(0, tag(1)), (0, tag(1)), (0, tag(2)), (1, tag(3)), (2, tag(1))];
        let orderings = rewrite_orderings(work.iter().map(|&(stage, _)| stage));
        let records: Vec<PlanRecord> =
            work.iter().zip(&orderings).map(|(&(_, tag), &ordering)| PlanRecord { key: 5, tag, ordering }).collect();
        let plan = Plan::new(&records);
        let segments = plan.segments(&plan.keys()[0]);
        assert_eq!(segments.len(), 3);
        let stage_records = |s| -> Vec<usize> {
            let mut all: Vec<usize> = plan
                .stages(&segments[s])
                .flat_map(|stage| match stage {
                    crate::plan::Stage::Head(run) | crate::plan::Stage::Tail(run) => plan.records(run).to_vec(),
                    crate::plan::Stage::Body(runs) => runs.iter().flat_map(|r| plan.records(r).to_vec()).collect(),
                })
                .collect();
            all.sort();
            all
        };
        assert_eq!([stage_records(0), stage_records(1), stage_records(2)], [vec![0, 1, 2], vec![3], vec![4]]);
    }

    fn offsets(in_retry: &KeyInRetry) -> Vec<u64> {
        in_retry.records.iter().map(|w| w.offset).collect()
    }

    #[test]
    fn the_queue_takes_due_keys_and_moves_the_position() {
        let policy = RetryPolicy { delays: vec![Duration::from_secs(10)], ..Default::default() };
        let mut queue = RetryQueue::starting_at(5);
        let key = Key::int;
        queue.index(5, key(1), &Routed { failed_at_ms: 0, ..routed(1, true) }, 10, &policy); // due at 10 s
        queue.index(6, key(2), &Routed { failed_at_ms: 0, attempts: 0, ..routed(0, false) }, 10, &policy); // due now
        queue.index(7, key(1), &Routed { attempts: 0, ..routed(0, false) }, 10, &policy); // behind key 1
        assert!(queue.holds(&key(1)) && queue.holds(&key(2)) && !queue.holds(&key(3)));
        assert_eq!(queue.position(), 5);
        assert_eq!(queue.events(), 9);

        let taken = queue.take_due(1_000, 100, 1 << 20);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].0, key(2));
        assert_eq!(queue.position(), 5, "key 1 still waits at offset 5");

        let taken = queue.take_due(10_000, 100, 1 << 20);
        assert_eq!(taken[0].0, key(1));
        assert_eq!(offsets(&taken[0].1), [5, 7]);
        assert!(queue.is_empty());
        assert_eq!(queue.position(), 8);
    }

    #[test]
    fn due_keys_are_taken_by_the_due_time_of_their_first_record() {
        let (mut queue, key) = (RetryQueue::starting_at(0), Key::int);
        // Keys 0..50 indexed with due times falling: 50 s down to 1 s.
        for n in 0..50u64 {
            let due_at = Routed { failed_at_ms: 0, ..routed(0, false) };
            let policy = RetryPolicy { delays: vec![Duration::from_secs(50 - n)], ..Default::default() };
            queue.index(n, key(n), &Routed { attempts: 1, ..due_at }, 10, &policy);
        }
        assert_eq!(queue.next_due_ms(), Some(1_000));
        let taken: Vec<Key> = queue.take_due(10_000, 100, 1 << 20).into_iter().map(|(key, _)| key).collect();
        assert_eq!(taken, (40..50).rev().map(key).collect::<Vec<_>>(), "due by 10 s, earliest first");
        assert_eq!(queue.next_due_ms(), Some(11_000));

        // Records put back in front of key 0 (due at 50 s) make it due first.
        let early = Waiting { offset: 100, events: 1, bytes: 10, due_ms: 0 };
        queue.put_back(key(0), vec![early], 5_000);
        assert_eq!(queue.next_due_ms(), Some(5_000));
        let taken = queue.take_due(5_000, 100, 1 << 20);
        assert_eq!(taken.len(), 1);
        assert_eq!((taken[0].0.clone(), offsets(&taken[0].1)), (key(0), vec![100, 0]), "its whole backlog");
        assert_eq!(queue.next_due_ms(), Some(11_000));
        assert_eq!(queue.len(), 39);
    }

    /// A queue holding `records` due records of `bytes` each for key 1, at
    /// retry offsets from 0.
    fn backlog(records: u64, bytes: usize) -> (RetryQueue, Key) {
        let (mut queue, key) = (RetryQueue::starting_at(0), Key::int(1));
        let due = Routed { failed_at_ms: 0, ..routed(0, false) };
        for offset in 0..records {
            queue.index(offset, key.clone(), &due, bytes, &RetryPolicy::default());
        }
        (queue, key)
    }

    #[test]
    fn an_attempt_takes_a_bounded_slice_of_a_long_backlog_and_the_key_stays_held() {
        let (mut queue, key) = backlog(10, 100);
        // Four records by count...
        let taken = queue.take_due(u64::MAX, 4, 1 << 20);
        assert_eq!(offsets(&taken[0].1), [0, 1, 2, 3]);
        assert!(queue.holds(&key), "the rest of the key still waits, so its new events are diverted");
        assert_eq!(queue.first_waiting(&key), Some(4));
        assert_eq!(queue.position(), 4);
        // ...three by bytes...
        let taken = queue.take_due(u64::MAX, 100, 399);
        assert_eq!(offsets(&taken[0].1), [4, 5, 6]);
        // ...and always one, however large.
        let taken = queue.take_due(u64::MAX, 100, 1);
        assert_eq!(offsets(&taken[0].1), [7]);
        assert_eq!(queue.events(), 2 * 3);
    }

    #[test]
    fn a_brief_failure_cuts_a_long_message_at_a_character_and_says_where_it_is_whole() {
        let short = routed(1, true).failure.unwrap();
        assert_eq!(short.brief(Some(3)), short, "a short message stays whole");
        let long = Failure { message: "é".repeat(300), ..short };
        let brief = long.brief(Some(41));
        let (kept, note) = brief.message.split_once(" […cut").unwrap();
        assert_eq!(kept, "é".repeat(Failure::BRIEF_MESSAGE_BYTES / 2));
        assert_eq!(note, "; whole on the record of origin offset 41]");
        assert_eq!(long.brief(None).message, format!("{kept} […cut]"));
        assert_eq!((brief.class, &brief.module, &brief.version), (long.class, &long.module, &long.version));
    }

    #[test]
    fn what_the_queue_holds_is_counted_as_records_and_keys_come_and_go() {
        let policy = RetryPolicy::default();
        let mut queue = RetryQueue::starting_at(0);
        assert_eq!(queue.held_bytes(), 0);
        let long = Key::of(&KeyValue::Bytes(vec![7; 1000])).unwrap();
        let short = Key::int(1);
        let due = Routed { failed_at_ms: 0, ..routed(0, false) };
        for offset in 0..3 {
            queue.index(offset, short.clone(), &due, 10, &policy);
        }
        queue.index(3, long.clone(), &due, 10, &policy);
        let key_bytes = short.as_bytes().len() + long.as_bytes().len();
        assert_eq!(queue.held_bytes(), 4 * BYTES_PER_RECORD + 2 * BYTES_PER_KEY + key_bytes);
        // Taking a key's last record forgets the key; putting it back
        // counts it again.
        let taken = queue.take_due(u64::MAX, 100, 1 << 20);
        assert_eq!(queue.held_bytes(), 0, "everything was taken");
        for (key, slice) in taken {
            queue.put_back(key, slice.records.into(), 0);
        }
        assert_eq!(queue.held_bytes(), 4 * BYTES_PER_RECORD + 2 * BYTES_PER_KEY + key_bytes);
        queue.put_back(Key::int(9), Vec::new(), 0);
        assert!(!queue.holds(&Key::int(9)), "putting back nothing enters no key");
    }

    #[test]
    fn a_failed_chunk_put_ahead_goes_before_what_its_key_left_waiting() {
        let policy = RetryPolicy { delays: vec![Duration::from_secs(10)], ..Default::default() };
        let mut queue = RetryQueue::starting_at(0);
        let key = Key::int(1);
        let diverted = Routed { failed_at_ms: 0, ..routed(0, false) };
        for offset in 0..4 {
            queue.index(offset, key.clone(), &diverted, 1, &policy);
        }
        // An attempt takes 0 and 1 (2 and 3 still wait): 0 is done, 1
        // fails and is written again as offsets 4 and 5, ahead of 2.
        let taken = queue.take_due(u64::MAX, 2, 1 << 20);
        assert_eq!(offsets(&taken[0].1), [0, 1]);
        let failed = Routed { failed_at_ms: 1_000, ahead_of: Some(2), ..routed(1, true) };
        queue.index(4, key.clone(), &failed, 1, &policy);
        queue.index(5, key.clone(), &failed, 1, &policy);
        let in_retry = &queue.keys[&key];
        assert_eq!(offsets(in_retry), [4, 5, 2, 3]);
        assert_eq!(in_retry.due_ms(), 11_000, "due as the failed chunk, not as the records behind it");
        assert_eq!(queue.position(), 2);
        // A record whose place is gone goes last.
        queue.index(6, key.clone(), &Routed { ahead_of: Some(99), ..failed }, 1, &policy);
        assert_eq!(offsets(&queue.keys[&key]), [4, 5, 2, 3, 6]);
    }

    #[test]
    fn records_left_by_an_attempt_go_back_in_front_of_their_key() {
        let (mut queue, key) = backlog(5, 1);
        let taken = queue.take_due(u64::MAX, 3, 1 << 20);
        let left: Vec<Waiting> = taken[0].1.records.iter().copied().skip(1).collect();
        queue.put_back(key.clone(), left, 500);
        assert_eq!(offsets(&queue.keys[&key]), [1, 2, 3, 4]);
        assert_eq!(queue.position(), 1);
        assert_eq!(queue.next_due_ms(), Some(500), "held back as asked");
        assert!(queue.take_due(499, 100, 1 << 20).is_empty());
        // Nothing left of a key taken whole: it is gone.
        let taken = queue.take_due(500, 100, 1 << 20);
        assert_eq!(offsets(&taken[0].1), [1, 2, 3, 4]);
        queue.put_back(key.clone(), Vec::new(), 0);
        assert!(queue.is_empty() && !queue.holds(&key));
    }

    #[test]
    fn keys_whose_hashes_collide_wait_apart() {
        use crate::key::{KeyValue, test_support::key_with_hash};
        let policy = RetryPolicy::default();
        let ann = key_with_hash(&KeyValue::Str("ann".into()), 7);
        let bob = key_with_hash(&KeyValue::Str("bob".into()), 7);
        let mut queue = RetryQueue::starting_at(0);
        queue.index(0, ann.clone(), &Routed { failed_at_ms: 0, ..routed(1, true) }, 1, &policy);
        assert!(queue.holds(&ann));
        assert!(!queue.holds(&bob), "bob's events are not diverted behind ann's retry");
        queue.index(1, bob.clone(), &Routed { failed_at_ms: 0, ..routed(1, true) }, 1, &policy);
        let taken = queue.take_due(u64::MAX, 100, 1 << 20);
        let keys: Vec<&Key> = taken.iter().map(|(key, _)| key).collect();
        assert_eq!(keys, [&ann, &bob]);
        assert!(taken.iter().all(|(_, in_retry)| in_retry.records.len() == 1));
    }

    #[test]
    fn consecutive_offsets_are_grouped() {
        assert_eq!(consecutive([3, 4, 5, 9, 11, 12]), [(3, 3), (9, 1), (11, 2)]);
        assert!(consecutive([]).is_empty());
    }
}
