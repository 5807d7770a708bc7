//! The outbox publisher: appends what committed batches owe the log, the
//! messages handlers emitted and the records routed to the retry and
//! dead-letter topics, then clears it.
//!
//! A batch cannot append to the log inside its state transaction, so it
//! commits these records to the projection's outbox ([`crate::storage::state`]), and
//! [`publish`] appends them after the commit (and at start-up, for what a
//! crash or a stop left behind). Rules kept here:
//!
//! - **Each entry once, in commit order per partition.** Appends are
//!   stamped ([`EventLog::append_as`]) as the store's [`producer`] with the
//!   entries' sequence numbers, so what reached the log before a crash or a
//!   lost answer is not appended again. A partition's entries go in pieces
//!   small enough for one request ([`STAMPED_APPEND_RECORDS`],
//!   [`STAMPED_APPEND_BYTES`]), each stamped with a number no lower than any
//!   in it and lower than any of the partition's entries left out, so a
//!   backend that stores only whole requests (Iggy) never holds half of a
//!   stamped append. Partitions whose entries fit one request share one
//!   append per topic (one transaction on the embedded log).
//! - **Recovery reads from a mark.** Before its first append to a
//!   partition, the publisher records the partition's end offset, its
//!   *mark*, in the state store (and lowers a mark above the end: the topic
//!   was deleted and created again). Every append it has not seen confirmed
//!   lies at or after the mark, so [`EventLog::producer_sequence`] looks no
//!   further back (Iggy reads stamps from the messages), however much was
//!   appended after a crash. A mark moves forward only after a publish has
//!   settled every entry, to the end offset read when that publish started,
//!   and only once more than [`MARK_LAG`] records lie between: recovery
//!   reads at most that many plus what was appended since the last settled
//!   publish to the topic.
//! - **Nothing owed blocks the projection.** A message a handler emitted
//!   that can never be delivered (its topic is missing, never created or
//!   deleted after the commit; its name is invalid; its partition is gone;
//!   the log refuses the record, [`LogError::Refused`] or
//!   [`LogError::RecordTooLarge`]) is replaced, in the
//!   commit that settles the outbox, by a dead letter in `dlq_<topic>` of
//!   the projection's topic, in the partition of the event that emitted it:
//!   the message's headers and body plus the routing headers ([`Routed`])
//!   naming that event (the earliest of its handler call, with the topic it
//!   was read from), class
//!   `undeliverable`, the reason, the module and its version, and 0 events
//!   (the event itself was applied). [`Stat::Undeliverable`] counts them,
//!   and the run goes on. An unavailable log ([`LogError::Unavailable`]) is
//!   not permanent: the publish fails, the consumer backs off and publishes
//!   again, and the stamps keep the resend exact. Other failures (storage,
//!   corruption) stop the consumer, as anywhere else.
//! - **The host's own records are never rerouted.** A retry or dead-letter
//!   record that cannot be appended for good is [`OutboxError::HostRecord`],
//!   naming the topic and the reason, and stays in the outbox. The host
//!   creates `retry_<topic>` and `dlq_<topic>` when it starts, before it
//!   publishes, and builds their records from records the log accepted, so
//!   this means one was deleted (or changed) while the host ran: the error
//!   stops `waku run` instead of looping, and the next start creates the
//!   topic again and delivers the records. One exception: the dead letter
//!   of an undeliverable message that the log refuses in turn (it carries
//!   the message the log refused) is replaced once by a slim letter, the
//!   envelope and routing headers without the body, the failure message
//!   saying what was dropped; only a refusal of that stops the run.
//!
//! - **A partition's entries are its host's.** Every entry belongs to the
//!   partition of the projection's topic whose commit added it
//!   ([`OutboxEntry::source`](crate::storage::state::OutboxEntry::source)); a
//!   publisher publishes and removes only the entries of the partitions it
//!   is given (those its host holds), under a producer name and marks of
//!   that partition's own. So hosts sharing one state store (PostgreSQL)
//!   never publish the same entry, the stamps of one never hide the other's
//!   appends, and removals are fenced like commits: a host that lost the
//!   partition can no longer remove what its new host publishes.
//!
//! Callers must not publish one partition's entries from two places at
//! once: the consumer holds a lock, and the CLI's re-drive runs with the
//! state store to itself.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::engine::routing::{Failure, FailureClass, Routed, RoutedTopics, context};
use crate::event::{EventHeaders, Header, partition_for};
use crate::platform::clock::now_ms;
use crate::storage::log::{EventLog, LogError, Record};
use crate::storage::state::{BatchCommit, EmitOrigin, OutboxEntry, StateError, StateStore};
use crate::storage::stats::Stat;

/// Most records in one stamped append of the outbox.
pub const STAMPED_APPEND_RECORDS: usize = 1000;
/// Most bytes (bodies and headers) in one stamped append of the outbox,
/// unless a single record is larger; well inside Iggy's 64 MiB request.
pub const STAMPED_APPEND_BYTES: usize = 8 << 20;
/// How many records may lie between a partition's mark and its end before
/// a settled publish moves the mark up: the most a recovery reads beyond
/// what was appended since the last settled publish.
pub const MARK_LAG: u64 = 10_000;

/// The state-store entry ([`StateStore::meta`]) holding the marks, before
/// `/<partition>` names the source partition they are for (the entry
/// without it is an older build's, for all partitions).
const MARKS: &str = "outbox-marks";

/// Why publishing the outbox stopped. The outbox keeps what was not
/// settled; publishing again resumes exactly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The log failed; [`LogError::Unavailable`] is worth another try.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The state store failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// A retry or dead-letter record cannot be appended for good.
    #[error(
        "cannot append a retry or dead-letter record to `{topic}`: {reason} (the record stays in the outbox; if the \
         topic was deleted, restarting `waku run` creates it again)"
    )]
    HostRecord {
        /// The host's topic.
        topic: String,
        /// Why.
        reason: String,
    },
}

/// What one [`publish`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Published {
    /// Entries appended (dead letters of undeliverable messages included).
    pub appended: u64,
    /// Emitted messages that could never be delivered and were
    /// dead-lettered instead.
    pub undeliverable: u64,
}

/// Appends the pending outbox entries of `partitions` (of the
/// projection's topic), dead-lettering undeliverable messages to the
/// projection's dead-letter topic (`routed`), to the log and clears them,
/// in commit order. See the [module
/// documentation](self) for the rules.
pub async fn publish<L: EventLog>(
    log: &L,
    store: &StateStore,
    projection: &str,
    routed: &RoutedTopics,
    partitions: &[u32],
) -> Result<Published, OutboxError> {
    let legacy = producer(store, projection)?;
    let mut published = Published::default();
    for &source in partitions {
        let producer = partition_producer(&legacy, source);
        let publisher = Publisher {
            log,
            store,
            projection,
            topic: routed.topic().to_owned(),
            dlq: routed.dlq().to_owned(),
            source,
            producer,
            legacy: legacy.clone(),
        };
        let done = publisher.publish().await?;
        published.appended += done.appended;
        published.undeliverable += done.undeliverable;
    }
    Ok(published)
}

impl<L: EventLog> Publisher<'_, L> {
    /// Publishes the source partition's entries, round after round.
    async fn publish(&self) -> Result<Published, OutboxError> {
        let mut published = Published::default();
        // A round that dead-letters messages commits the letters to the outbox,
        // and the next round appends them; a letter is replaced at most once
        // more (slimmed), so this ends.
        loop {
            let (round, replaced) = self.round().await?;
            published.appended += round.appended;
            published.undeliverable += round.undeliverable;
            if !replaced {
                return Ok(published);
            }
        }
    }
}

/// The producer name a projection's outbox appends as
/// ([`EventLog::append_as`]), before `/<partition>` names the source
/// partition: the projection's name and an id made once per state store
/// and kept in it. Hosts that share a log each run their partitions of a
/// projection with their own state, so their stamps never hide each
/// other's appends; a restart keeps its name. Hosts that share a state
/// store (PostgreSQL) share the name, and the source partition keeps apart
/// the stamps of partitions published by different hosts, while a
/// partition that moves keeps its name, so its new host finds what the
/// old one appended.
pub fn producer(store: &StateStore, projection: &str) -> Result<String, StateError> {
    const META: &str = "outbox-producer";
    if let Some(id) = store.meta(META)? {
        return Ok(format!("projection:{projection}:{}", String::from_utf8_lossy(&id)));
    }
    let id = format!("{:016x}", rand::random::<u64>());
    store.set_meta(META, id.as_bytes())?;
    Ok(format!("projection:{projection}:{id}"))
}

/// The producer name the outbox of source partition `source` appends as.
fn partition_producer(projection_producer: &str, source: u32) -> String {
    format!("{projection_producer}/{source}")
}

/// Makes `log` forget what it remembers of the stamps of `partition`'s
/// outbox producer ([`EventLog::forget_producer`]): called when a host
/// takes the partition, since the host that held it in between appended
/// under that name, perhaps without removing what it appended.
pub fn forget_stamps<L: EventLog>(
    log: &L,
    store: &StateStore,
    projection: &str,
    partition: u32,
) -> Result<(), StateError> {
    log.forget_producer(&partition_producer(&producer(store, projection)?, partition));
    Ok(())
}

/// Whether a failed append fails the same way however often it is tried.
fn is_permanent(error: &LogError) -> bool {
    matches!(
        error,
        LogError::TopicNotFound { .. }
            | LogError::InvalidTopicName { .. }
            | LogError::BackendName { .. }
            | LogError::PartitionNotFound { .. }
            | LogError::Refused { .. }
            | LogError::RecordTooLarge { .. }
    )
}

/// Whether a permanent failure is the topic's, so every entry for it fails.
fn is_topic_gone(error: &LogError) -> bool {
    matches!(error, LogError::TopicNotFound { .. } | LogError::InvalidTopicName { .. } | LogError::BackendName { .. })
}

/// Pending entries with their sequence numbers.
type Entries = Vec<(u64, OutboxEntry)>;

/// One stamped append: records per partition, stamped with `stamp`.
struct Append {
    topic: String,
    batches: Vec<(u32, Entries)>,
    stamp: u64,
}

/// Publishes the entries of one source partition.
struct Publisher<'a, L> {
    log: &'a L,
    store: &'a StateStore,
    projection: &'a str,
    /// The projection's topic and its dead-letter topic.
    topic: String,
    dlq: String,
    /// The partition of the projection's topic whose entries these are.
    source: u32,
    producer: String,
    /// The name stamps had before they named the source partition, looked
    /// up when a partition has none of the new name yet (an outbox left by
    /// an older build).
    legacy: String,
}

/// What a round puts in place of entries that can never be delivered.
#[derive(Default)]
struct Settling {
    /// New outbox entries: dead letters, committed with the settling.
    replacements: Vec<OutboxEntry>,
    /// Emitted messages among the entries replaced.
    undeliverable: u64,
}

impl<L: EventLog> Publisher<'_, L> {
    /// Appends every pending entry once, or replaces it by a dead letter,
    /// then settles the outbox in one commit. Says whether it replaced any.
    async fn round(&self) -> Result<(Published, bool), OutboxError> {
        let pending = self.store.outbox_of(self.source)?;
        let Some(&(last_sequence, _)) = pending.last() else { return Ok((Published::default(), false)) };
        let mut settling = Settling::default();
        let (ends, targets) = self.targets(pending, &mut settling).await?;
        let mut marks = Marks::load(self.store, self.source)?;
        let target_ends =
            targets.keys().map(|(topic, partition)| (topic, *partition, ends[topic][*partition as usize]));
        if marks.cap(target_ends) {
            marks.save(self.store, self.source)?;
        }
        let mut appended = 0;
        for append in self.appends(targets, &marks, &mut settling).await? {
            appended += self.append(append, &mut settling).await?;
        }
        let undeliverable = settling.undeliverable;
        let replaced = self.settle(last_sequence, settling)?;
        // Everything up to `last_sequence` is settled: nothing unconfirmed
        // lies below the end offsets read before this round appended.
        if marks.advance(&ends) {
            marks.save(self.store, self.source)?;
        }
        Ok((Published { appended, undeliverable }, replaced))
    }

    /// Where each pending entry goes: the end offsets of every topic owed
    /// something (read once, before anything is appended) and the entries
    /// per partition, in order. Entries that cannot go anywhere are set
    /// aside.
    async fn targets(
        &self,
        pending: Entries,
        settling: &mut Settling,
    ) -> Result<(FxHashMap<String, Vec<u64>>, BTreeMap<(String, u32), Entries>), OutboxError> {
        let mut ends: FxHashMap<String, Vec<u64>> = FxHashMap::default();
        let mut gone: FxHashMap<String, String> = FxHashMap::default();
        let mut targets: BTreeMap<(String, u32), Entries> = BTreeMap::new();
        for (sequence, entry) in pending {
            if !ends.contains_key(&entry.topic) && !gone.contains_key(&entry.topic) {
                match self.log.end_offsets(&entry.topic).await {
                    Ok(offsets) => drop(ends.insert(entry.topic.clone(), offsets)),
                    Err(error) if is_permanent(&error) => drop(gone.insert(entry.topic.clone(), error.to_string())),
                    Err(error) => return Err(error.into()),
                }
            }
            if let Some(reason) = gone.get(&entry.topic) {
                self.set_aside(settling, entry, reason.clone(), false)?;
                continue;
            }
            let partitions = ends[&entry.topic].len() as u32;
            let partition = entry.partition.unwrap_or_else(|| partition_for(entry.partition_key, partitions));
            if partition >= partitions {
                let error = LogError::PartitionNotFound { topic: entry.topic.clone(), partition, partitions };
                self.set_aside(settling, entry, error.to_string(), false)?;
                continue;
            }
            targets.entry((entry.topic.clone(), partition)).or_default().push((sequence, entry));
        }
        Ok((ends, targets))
    }

    /// The stamped appends for what each partition still lacks (asked of
    /// the log from the partition's mark): whole partitions that fit one
    /// request share one append per topic; larger ones go in pieces.
    async fn appends(
        &self,
        targets: BTreeMap<(String, u32), Entries>,
        marks: &Marks,
        settling: &mut Settling,
    ) -> Result<Vec<Append>, OutboxError> {
        let mut appends = Vec::new();
        let mut whole: BTreeMap<String, Append> = BTreeMap::new();
        for ((topic, partition), entries) in targets {
            let since = marks.get(&topic, partition);
            let mut appended = self.log.producer_sequence(&topic, partition, &self.producer, since).await;
            if let Ok(None) = appended {
                appended = self.log.producer_sequence(&topic, partition, &self.legacy, since).await;
            }
            let appended = match appended {
                Ok(appended) => appended,
                Err(error) if is_permanent(&error) => {
                    for (_, entry) in entries {
                        self.set_aside(settling, entry, error.to_string(), false)?;
                    }
                    continue;
                }
                Err(error) => return Err(error.into()),
            };
            let entries: Entries =
                entries.into_iter().filter(|(sequence, _)| appended.is_none_or(|known| *sequence > known)).collect();
            let Some(&(last, _)) = entries.last() else { continue };
            let fits = entries.len() <= STAMPED_APPEND_RECORDS
                && entries.iter().map(|(_, entry)| entry.record.byte_len()).sum::<usize>() <= STAMPED_APPEND_BYTES;
            if fits {
                let append =
                    whole.entry(topic.clone()).or_insert_with(|| Append { topic, batches: Vec::new(), stamp: 0 });
                append.stamp = append.stamp.max(last);
                append.batches.push((partition, entries));
            } else {
                appends.extend(pieces(&topic, partition, entries));
            }
        }
        appends.extend(whole.into_values());
        Ok(appends)
    }

    /// Removes the outbox through `last_sequence`, putting the dead letters
    /// in place of what was set aside, in one commit. Says whether it put
    /// any there.
    fn settle(&self, last_sequence: u64, settling: Settling) -> Result<bool, OutboxError> {
        let Settling { replacements, undeliverable } = settling;
        if replacements.is_empty() {
            self.store.remove_outbox(self.source, last_sequence)?;
            return Ok(false);
        }
        self.store.commit(BatchCommit {
            outbox: replacements,
            stat_deltas: [(Stat::Undeliverable, undeliverable)].into_iter().collect(),
            outbox_through: Some((self.source, last_sequence)),
            ..BatchCommit::default()
        })?;
        Ok(true)
    }

    /// Makes one stamped append. When the log refuses it for good, the
    /// records go one by one, so only those that cannot be delivered are
    /// set aside. Returns how many records were appended.
    async fn append(&self, append: Append, settling: &mut Settling) -> Result<u64, OutboxError> {
        let Append { topic, mut batches, stamp } = append;
        let count = batches.iter().map(|(_, entries)| entries.len() as u64).sum::<u64>();
        let records = batches
            .iter_mut()
            .map(|(partition, entries)| {
                (*partition, entries.iter_mut().map(|(_, entry)| std::mem::take(&mut entry.record)).collect())
            })
            .collect();
        let error = match self.log.append_as(&topic, records, &self.producer, stamp).await {
            Ok(_) => return Ok(count),
            Err(error) if is_permanent(&error) => error,
            Err(error) => return Err(error.into()),
        };
        // The records went into the failed call: read them again.
        let mut stored: BTreeMap<u64, OutboxEntry> = self.store.outbox_of(self.source)?.into_iter().collect();
        let mut appended = 0;
        for (partition, entries) in batches {
            for (sequence, _) in entries {
                let Some(entry) = stored.remove(&sequence) else { continue };
                if is_topic_gone(&error) {
                    self.set_aside(settling, entry, error.to_string(), false)?;
                    continue;
                }
                // Records of the append already stored carry a stamp at or
                // above their own number and are skipped.
                let record = vec![(partition, vec![entry.record.clone()])];
                match self.log.append_as(&topic, record, &self.producer, sequence).await {
                    Ok(_) => appended += 1,
                    Err(error) if is_permanent(&error) => {
                        let refused = matches!(error, LogError::Refused { .. } | LogError::RecordTooLarge { .. });
                        self.set_aside(settling, entry, error.to_string(), refused)?;
                    }
                    Err(error) => return Err(error.into()),
                }
            }
        }
        Ok(appended)
    }

    /// Takes an entry that can never be delivered: an emitted message is
    /// replaced by its dead letter; a dead letter the log `refused` by a
    /// slimmer one (see [`slim_letter`]); any other record of the host's own
    /// is an error.
    fn set_aside(
        &self,
        settling: &mut Settling,
        mut entry: OutboxEntry,
        reason: String,
        refused: bool,
    ) -> Result<(), OutboxError> {
        if let Some(origin) = entry.origin.take() {
            settling.replacements.push(self.dead_letter(origin, entry, reason));
            settling.undeliverable += 1;
            return Ok(());
        }
        match (refused && entry.topic == self.dlq).then(|| slim_letter(&entry.record, &reason)).flatten() {
            Some(record) => {
                tracing::warn!(
                    projection = self.projection,
                    "a dead letter is refused and goes without its body: {reason}"
                );
                settling.replacements.push(OutboxEntry { record, ..entry });
                Ok(())
            }
            None => Err(OutboxError::HostRecord { topic: entry.topic, reason }),
        }
    }

    /// The dead letter standing for an emitted message that can never be
    /// delivered: its headers (minus any posing as routing headers) and body,
    /// plus routing headers naming the call that emitted it.
    fn dead_letter(&self, origin: EmitOrigin, entry: OutboxEntry, reason: String) -> OutboxEntry {
        tracing::warn!(
            projection = self.projection,
            partition = origin.partition,
            offset = origin.offset,
            module = origin.module,
            "a message emitted to `{}` cannot be delivered and goes to `{}`: {reason}",
            entry.topic,
            self.dlq
        );
        let now = now_ms();
        let routed = Routed {
            projection: self.projection.to_owned(),
            topic: origin.topic.unwrap_or_else(|| self.topic.to_owned()),
            event_type: String::new(),
            origin_partition: origin.partition,
            origin_offset: origin.offset,
            events: 0,
            attempts: 0,
            failed_at_ms: now,
            first_failed_at_ms: Some(now),
            failure: Some(Failure {
                class: FailureClass::Undeliverable,
                message: format!("the message emitted to `{}` cannot be delivered: {reason}", entry.topic),
                module: origin.module,
                version: origin.version,
            }),
            ahead_of: None,
            ordering: None,
        };
        let mut headers: Vec<Header> =
            entry.record.headers.into_iter().filter(|h| !context::is_context_header(&h.name)).collect();
        headers.extend(routed.to_headers());
        OutboxEntry {
            topic: self.dlq.clone(),
            partition_key: entry.partition_key,
            partition: Some(origin.partition),
            record: Record { headers, body: entry.record.body },
            origin: None,
        }
    }
}

/// The last resort for the dead letter of an undeliverable message that
/// the log refuses in turn (Iggy under a server limit lower than the
/// host's): the event envelope and the routing headers, the failure message
/// saying so, and no body. `None` for any other record, and for one that is
/// slim already, so a refusal of that stops the run instead of looping.
fn slim_letter(record: &Record, refusal: &str) -> Option<Record> {
    let mut routed = Routed::parse(&record.headers).ok()?;
    let envelope = EventHeaders::parse_stored(&record.headers).map(|e| e.to_headers()).unwrap_or_default();
    if record.body.is_empty() && record.headers.len() == envelope.len() + routed.to_headers().len() {
        return None;
    }
    let failure = routed.failure.as_mut().filter(|f| f.class == FailureClass::Undeliverable)?;
    failure.message.push_str(&format!(
        "; its dead letter was refused too ({refusal}), so it keeps only the envelope, without the body ({} bytes) \
         or other headers",
        record.body.len()
    ));
    let mut headers = envelope;
    headers.extend(routed.to_headers());
    Some(Record { headers, body: Vec::new() })
}

/// A partition's entries too many or too large for one request, in pieces
/// that fit, each stamped with its own last sequence number.
fn pieces(topic: &str, partition: u32, entries: Entries) -> Vec<Append> {
    let mut pieces = Vec::new();
    let mut entries = entries.into_iter().peekable();
    while entries.peek().is_some() {
        let (mut piece, mut bytes): (Entries, usize) = (Vec::new(), 0);
        while let Some((sequence, entry)) = entries.next_if(|(_, entry)| {
            piece.is_empty()
                || (piece.len() < STAMPED_APPEND_RECORDS && bytes + entry.record.byte_len() <= STAMPED_APPEND_BYTES)
        }) {
            bytes += entry.record.byte_len();
            piece.push((sequence, entry));
        }
        let stamp = piece.last().map_or(0, |(sequence, _)| *sequence);
        pieces.push(Append { topic: topic.to_owned(), batches: vec![(partition, piece)], stamp });
    }
    pieces
}

/// Each partition's mark: an offset at or below every append of this
/// store's producer there that has not been seen confirmed.
#[derive(Default)]
struct Marks(BTreeMap<(String, u32), u64>);

impl Marks {
    /// The marks of the source partition `source`, or an older build's
    /// marks for all (at or below anything it left unconfirmed).
    fn load(store: &StateStore, source: u32) -> Result<Self, StateError> {
        let bytes = match store.meta(&format!("{MARKS}/{source}"))? {
            Some(bytes) => bytes,
            None => match store.meta(MARKS)? {
                Some(bytes) => bytes,
                None => return Ok(Self::default()),
            },
        };
        let marks: Vec<(String, u32, u64)> = postcard::from_bytes(&bytes).map_err(|e| StateError::Corrupt {
            store: store.location().to_owned(),
            what: format!("the outbox marks: {e}"),
        })?;
        Ok(Self(marks.into_iter().map(|(topic, partition, mark)| ((topic, partition), mark)).collect()))
    }

    fn save(&self, store: &StateStore, source: u32) -> Result<(), StateError> {
        let marks: Vec<(&str, u32, u64)> =
            self.0.iter().map(|((topic, partition), mark)| (topic.as_str(), *partition, *mark)).collect();
        let bytes = postcard::to_allocvec(&marks).map_err(|e| StateError::Storage {
            store: store.location().to_owned(),
            source: format!("cannot encode the outbox marks: {e}").into(),
        })?;
        store.set_meta(&format!("{MARKS}/{source}"), &bytes)
    }

    /// The mark of a partition (0, the safe answer, if it has none).
    fn get(&self, topic: &str, partition: u32) -> u64 {
        self.0.get(&(topic.to_owned(), partition)).copied().unwrap_or(0)
    }

    /// Before appending to partitions now at these end offsets: marks a
    /// partition that has no mark at its end (it was never appended to, so
    /// anything this round appends lies above), and lowers a mark above its
    /// end (the topic was deleted and created again; nothing of ours is in
    /// the new one yet, or an earlier round would have lowered it).
    /// Returns whether any mark changed; they must be saved before appending.
    fn cap<'t>(&mut self, ends: impl Iterator<Item = (&'t String, u32, u64)>) -> bool {
        let mut changed = false;
        for (topic, partition, end) in ends {
            let mark = self.0.entry((topic.clone(), partition)).or_insert(u64::MAX);
            if *mark > end {
                *mark = end;
                changed = true;
            }
        }
        changed
    }

    /// Moves marks more than [`MARK_LAG`] behind up to the end offsets
    /// `ends` (read before a round that settled everything); whether any
    /// moved.
    fn advance(&mut self, ends: &FxHashMap<String, Vec<u64>>) -> bool {
        let mut moved = false;
        for ((topic, partition), mark) in &mut self.0 {
            if let Some(&end) = ends.get(topic).and_then(|ends| ends.get(*partition as usize))
                && end.saturating_sub(*mark) > MARK_LAG
            {
                *mark = end;
                moved = true;
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::storage::log::iggy::{last_stamp, stamp_headers};
    use crate::storage::log::{self, EmbeddedLog};

    /// A log that keeps producer stamps only in its messages and finds them
    /// by reading, as Iggy does: the embedded log underneath, `append_as` a
    /// plain append with the stamp headers, `producer_sequence` a read back
    /// from `since` through Iggy's own code, and nothing remembered from one
    /// instance (process) to the next. It can lose the answer to an append
    /// to one topic after the append, as a crash would.
    struct ScanningLog {
        log: EmbeddedLog,
        known: Mutex<FxHashMap<(String, u32, String), Option<u64>>>,
        lose_answer_to: Option<&'static str>,
    }

    impl ScanningLog {
        fn new(log: &EmbeddedLog, lose_answer_to: Option<&'static str>) -> Self {
            Self { log: log.clone(), known: Mutex::default(), lose_answer_to }
        }
    }

    impl log::ForwardingLog for ScanningLog {
        type Inner = EmbeddedLog;

        fn inner(&self) -> impl std::ops::Deref<Target = EmbeddedLog> + Send + '_ {
            &self.log
        }

        async fn append_as(
            &self,
            topic: &str,
            batches: Vec<(u32, Vec<Record>)>,
            producer: &str,
            sequence: u64,
        ) -> Result<bool, LogError> {
            let mut appended = false;
            for (partition, mut records) in batches {
                if EventLog::producer_sequence(self, topic, partition, producer, 0)
                    .await?
                    .is_some_and(|s| s >= sequence)
                {
                    continue;
                }
                for record in &mut records {
                    record.headers.extend(stamp_headers(producer, sequence));
                }
                self.log.append(topic, vec![(partition, records)]).await?;
                self.known.lock().unwrap().insert((topic.into(), partition, producer.into()), Some(sequence));
                appended = true;
            }
            if self.lose_answer_to == Some(topic) {
                return Err(LogError::Unavailable { address: "test".into(), reason: "the answer was lost".into() });
            }
            Ok(appended)
        }
        async fn producer_sequence(
            &self,
            topic: &str,
            partition: u32,
            producer: &str,
            since: u64,
        ) -> Result<Option<u64>, LogError> {
            let key = (topic.to_owned(), partition, producer.to_owned());
            if let Some(&known) = self.known.lock().unwrap().get(&key) {
                return Ok(known);
            }
            let found = last_stamp(&self.log, topic, partition, producer, since).await?;
            self.known.lock().unwrap().insert(key, found);
            Ok(found)
        }
    }

    fn emitted(topic: &str, n: u64) -> OutboxEntry {
        OutboxEntry {
            topic: topic.into(),
            partition_key: n,
            partition: Some(0),
            record: Record {
                headers: vec![Header { name: "n".into(), value: n.to_le_bytes().to_vec() }],
                body: vec![1],
            },
            origin: Some(EmitOrigin { partition: 0, offset: n, module: "m".into(), version: "v".into(), topic: None }),
        }
    }

    /// The old look-back read the last 100 000 messages; the mark makes
    /// recovery find an append behind any amount of later traffic.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn recovery_finds_what_was_appended_before_a_crash_behind_any_traffic() {
        const LATER: u64 = 150_000;
        let dir = tempfile::tempdir().unwrap();
        let log = EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
        for topic in ["out", "zz", "dlq_t"] {
            log.create_topic(topic, 1).await.unwrap();
        }
        log.append("out", vec![(0, vec![Record::default(); 7])]).await.unwrap();
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        let outbox = (0..5).map(|n| emitted("out", n)).chain([emitted("zz", 5)]).collect();
        store.commit(BatchCommit { outbox, ..BatchCommit::default() }).unwrap();

        // `out` receives its five, then the host dies before it settles
        // (`zz`, after `out`, is never reached).
        let error = publish(&ScanningLog::new(&log, Some("out")), &store, "p", &RoutedTopics::shared("t"), &[0])
            .await
            .unwrap_err();
        assert!(matches!(error, OutboxError::Log(LogError::Unavailable { .. })), "{error}");
        assert_eq!(store.outbox().unwrap().len(), 6);
        assert_eq!(Marks::load(&store, 0).unwrap().get("out", 0), 7, "the end before the first append");
        for _ in 0..LATER / 10_000 {
            log.append("out", vec![(0, vec![Record::default(); 10_000])]).await.unwrap();
        }

        // A fresh process: the stamps are found from the mark, 150 000
        // messages back, where the old 100 000-message look-back found none.
        let producer = format!("{}/0", producer(&store, "p").unwrap());
        let end = log.end_offset("out", 0).await.unwrap();
        let old_window = ScanningLog::new(&log, None);
        assert_eq!(old_window.producer_sequence("out", 0, &producer, end - 100_000).await.unwrap(), None);
        let restarted = ScanningLog::new(&log, None);
        let published = publish(&restarted, &store, "p", &RoutedTopics::shared("t"), &[0]).await.unwrap();
        assert_eq!(published, Published { appended: 1, undeliverable: 0 });
        assert!(store.outbox().unwrap().is_empty());
        assert_eq!(log.end_offset("out", 0).await.unwrap(), 7 + 5 + LATER, "each of the five once");
        assert_eq!(log.end_offset("zz", 0).await.unwrap(), 1);
        // Settled with more than MARK_LAG behind: the mark moves up to the
        // end read before that publish, so the next recovery reads little.
        assert_eq!(Marks::load(&store, 0).unwrap().get("out", 0), 7 + 5 + LATER);
    }

    /// Hosts sharing one state store publish the partitions they hold:
    /// each only its own entries, and one partition's stamps (higher
    /// sequence numbers, appended first) never hide another's entries.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_publisher_publishes_only_its_partitions_and_stamps_never_hide_another_partitions() {
        let dir = tempfile::tempdir().unwrap();
        let log = EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
        for topic in ["out", "dlq_t"] {
            log.create_topic(topic, 1).await.unwrap();
        }
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        let from = |source: u32, n: u64| {
            let mut entry = emitted("out", n);
            entry.origin.as_mut().unwrap().partition = source;
            entry
        };
        let outbox = vec![from(0, 0), from(0, 1), from(1, 2), from(1, 3)];
        store.commit(BatchCommit { outbox, ..BatchCommit::default() }).unwrap();

        let published = publish(&log, &store, "p", &RoutedTopics::shared("t"), &[1]).await.unwrap();
        assert_eq!(published.appended, 2);
        assert_eq!(store.outbox().unwrap().iter().map(|(seq, _)| *seq).collect::<Vec<_>>(), [0, 1]);
        let published = publish(&log, &store, "p", &RoutedTopics::shared("t"), &[0]).await.unwrap();
        assert_eq!(published.appended, 2, "partition 1's stamps (2, 3) hid partition 0's entries (0, 1)");
        assert!(store.outbox().unwrap().is_empty());
        let bodies: Vec<u64> = log
            .read("out", 0, 0, 10)
            .await
            .unwrap()
            .iter()
            .map(|stored| u64::from_le_bytes(stored.record.headers[0].value.as_slice().try_into().unwrap()))
            .collect();
        assert_eq!(bodies, [2, 3, 0, 1]);
        // Published again, nothing goes twice.
        assert_eq!(publish(&log, &store, "p", &RoutedTopics::shared("t"), &[0, 1]).await.unwrap().appended, 0);
        assert_eq!(log.end_offset("out", 0).await.unwrap(), 4);
    }

    #[test]
    fn marks_start_at_the_end_are_lowered_when_a_topic_shrank_and_advance_only_when_far_behind() {
        let topic = "out".to_owned();
        let mut marks = Marks::default();
        assert!(marks.cap([(&topic, 0, 40), (&topic, 1, 0)].into_iter()));
        assert_eq!((marks.get("out", 0), marks.get("out", 1)), (40, 0));
        assert!(!marks.cap([(&topic, 0, 90)].into_iter()), "a mark below the end stays");
        // Deleted and created again: the end is below the mark.
        assert!(marks.cap([(&topic, 0, 3)].into_iter()));
        assert_eq!(marks.get("out", 0), 3);
        let ends: FxHashMap<String, Vec<u64>> = [(topic.clone(), vec![3 + MARK_LAG, MARK_LAG])].into_iter().collect();
        assert!(!marks.advance(&ends), "at most MARK_LAG behind: no write");
        let ends: FxHashMap<String, Vec<u64>> = [(topic, vec![4 + MARK_LAG, 5])].into_iter().collect();
        assert!(marks.advance(&ends));
        assert_eq!((marks.get("out", 0), marks.get("out", 1)), (4 + MARK_LAG, 0));
    }
}
