//! The embedded log: every topic of one host in a single redb file.
//!
//! Layout of the file:
//! - `topics`: topic name → partition count.
//! - `log/{topic}/{partition}`: one table per partition. Records are stored
//!   in **blocks** of up to 1024 records and 32 KiB: the key is the
//!   offset of the block's first record, the value holds the record count,
//!   an index of record ends and the records encoded with postcard. One
//!   append call writes one or more blocks per partition; a read seeks to
//!   the block holding its first offset and uses the index to skip into it.
//!   The end offset is the last block's key plus its count. Per-record keys
//!   would cost a B-tree insert per record; blocks make appends several
//!   times cheaper.
//! - `consumer-offsets`: (consumer, topic, partition) → next offset.
//! - `append-times`: (topic, partition, milliseconds since the Unix epoch)
//!   → first offset: the records from that offset on, up to the next
//!   entry's, were appended at that time. An append writes an entry only
//!   when the clock has moved past the partition's last one, so a
//!   partition's times never go backwards (a clock set back counts as the
//!   last time), appends within one millisecond share an entry, and the
//!   first record at or after a time is one lookup away. Logs written before
//!   append times were recorded open as they are; their untimed records
//!   count as appended before every recorded time.
//!
//! Every write is one redb transaction: a failed one leaves nothing
//! behind. Appends and topics are durable: a committed append survives a
//! crash. A consumer offset (informational) is not flushed on its own: it
//! reaches the disk with the next append or when the log is closed, so a
//! crash may take it back. Each committed append is signalled to waiting
//! consumers ([`EventLog::appends`]). redb does blocking file I/O, so each
//! call runs on tokio's blocking pool ([`tokio::task::spawn_blocking`]);
//! the methods must therefore be called from within a tokio runtime.
//!
//! A stored block or record that cannot be decoded (unknown block format,
//! truncated index, bad postcard, a gap in the offsets) is
//! [`LogError::Corrupt`], naming the offset; it never panics.
//!
//! **One record holds at most [`MAX_RECORD_BYTES`]** as stored (16 MiB;
//! 64 KiB more in the host's retry and dead-letter topics, for the routing
//! headers, [`record_limit`]). An append of a larger record is
//! [`LogError::RecordTooLarge`], naming its size and the limit, and stores
//! nothing. A larger record already in the file (an older version's, or
//! one written by hand) is read as a small stand-in ([`super::UNREADABLE`])
//! that says so, never copied into a batch: the consumer dead-letters the
//! stand-in, naming the record's size and the limit, and goes on. redb
//! reads a value whole, so reading past such a record loads it once, but
//! nothing holds it.
//!
//! Topic names follow core's topic-name rule
//! ([`wakuwaku_core::names::check_topic_name`]: non-empty, at most 255
//! bytes, only ASCII letters, digits, `.`, `_` and `-`); anything else is
//! [`LogError::InvalidTopicName`]. This keeps the table names unambiguous
//! and the names safe to print and to use as file or URL parts.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableError};

use super::{EventLog, LogError, PolledBatch, Record, StoredRecord, check_topic_name};
use crate::event::Header;
use crate::storage::redb_file::{self, OpenError};

/// topic → partition count.
const TOPICS: TableDefinition<&str, u32> = TableDefinition::new("topics");
/// (consumer, topic, partition) → next offset.
const CONSUMER_OFFSETS: TableDefinition<(&str, &str, u32), u64> = TableDefinition::new("consumer-offsets");
/// (topic, producer) → the highest sequence number appended with `append_as`.
const PRODUCERS: TableDefinition<(&str, u32, &str), u64> = TableDefinition::new("producers");

/// (topic, partition, append time in ms since the Unix epoch) → the first
/// offset appended then.
const APPEND_TIMES: TableDefinition<(&str, u32, u64), u64> = TableDefinition::new("append-times");

/// The most one record may hold as stored, in bytes (its postcard
/// encoding: headers, body and their lengths): 16 MiB. Far above what the
/// host itself writes (an emitted body or a state value is at most 1 MiB
/// by default, a key 1 KiB), and bounded so that one record can never make
/// a read, a batch or an append hold more than that: redb reads a value
/// whole, so a larger one would be loaded whole wherever it is read.
/// [`EventLog::append`] refuses a larger record
/// ([`LogError::RecordTooLarge`]); a read meets one only in a file written
/// by an older version or by hand, and reads a stand-in in its place
/// ([`super::UNREADABLE`]).
pub const MAX_RECORD_BYTES: usize = 16 << 20;

/// What the host's own retry and dead-letter topics (`retry_…`, `dlq_…`,
/// see [`crate::engine::routing`]) take per record above [`MAX_RECORD_BYTES`]: a
/// record routed there is a record of the log (at most the limit) plus
/// routing headers (a projection and module name, a failure message cut to
/// 4 KiB, a few numbers), so routing an event of the largest size never
/// fails for want of room.
pub const ROUTED_HEADROOM: usize = 64 << 10;

/// The most one record of `topic` may hold as stored: [`MAX_RECORD_BYTES`],
/// plus [`ROUTED_HEADROOM`] in the host's retry and dead-letter topics.
pub fn record_limit(topic: &str) -> usize {
    if topic.starts_with("retry_") || topic.starts_with("dlq_") {
        MAX_RECORD_BYTES + ROUTED_HEADROOM
    } else {
        MAX_RECORD_BYTES
    }
}

/// An [`EventLog`] stored in one redb file on this machine.
///
/// Cheap to clone: clones share the open database. Only one process may
/// have the file open at a time (redb locks it).
#[derive(Clone)]
pub struct EmbeddedLog {
    inner: Arc<Inner>,
}

struct Inner {
    db: Database,
    path: PathBuf,
    /// Changed after every committed append ([`EventLog::appends`]).
    appended: tokio::sync::watch::Sender<()>,
}

impl std::fmt::Debug for EmbeddedLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedLog").field("path", &self.inner.path).finish_non_exhaustive()
    }
}

impl EmbeddedLog {
    /// Opens the log file at `path`, creating it (and its parent
    /// directories) if it does not exist, after checking all of it
    /// ([`LogError::Damaged`]).
    ///
    /// Blocks on file I/O; call it before serving or from a blocking task.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LogError> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| LogError::Io { path: path.clone(), source })?;
        }
        // The page cache: redb's default (1 GiB) grows with everything
        // appended; consumers read a log front to back, so 64 MiB is plenty.
        let db = redb_file::open(&path, 64 << 20).map_err(|e| match e {
            OpenError::Damaged(reason) => LogError::Damaged { path: path.clone(), reason },
            OpenError::Engine(redb::DatabaseError::DatabaseAlreadyOpen) => LogError::InUse { path: path.clone() },
            OpenError::Engine(e) => storage(&path, e),
        })?;
        let inner = Inner { db, path, appended: tokio::sync::watch::Sender::new(()) };
        let txn = inner.db.begin_write().map_err(|e| inner.storage(e))?;
        txn.open_table(TOPICS).map_err(|e| inner.storage(e))?;
        txn.open_table(CONSUMER_OFFSETS).map_err(|e| inner.storage(e))?;
        txn.commit().map_err(|e| inner.storage(e))?;
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The file this log is stored in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `work` on the blocking pool. A panic inside it is resumed here.
    async fn blocking<T, F>(&self, work: F) -> Result<T, LogError>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T, LogError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        match tokio::task::spawn_blocking(move || work(&inner)).await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(LogError::Cancelled),
        }
    }
}

impl EventLog for EmbeddedLog {
    async fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), LogError> {
        check_topic_name(topic)?;
        let topic = topic.to_owned();
        self.blocking(move |inner| inner.create_topic(&topic, partitions)).await
    }

    async fn partitions(&self, topic: &str) -> Result<u32, LogError> {
        check_topic_name(topic)?;
        let topic = topic.to_owned();
        self.blocking(move |inner| {
            let txn = inner.db.begin_read().map_err(|e| inner.storage(e))?;
            let topics = txn.open_table(TOPICS).map_err(|e| inner.storage(e))?;
            inner.partition_count(&topics, &topic)
        })
        .await
    }

    async fn topics(&self) -> Result<Vec<(String, u32)>, LogError> {
        self.blocking(move |inner| {
            let txn = inner.db.begin_read().map_err(|e| inner.storage(e))?;
            let topics = txn.open_table(TOPICS).map_err(|e| inner.storage(e))?;
            let mut listed = Vec::new();
            for entry in topics.iter().map_err(|e| inner.storage(e))? {
                let (name, partitions) = entry.map_err(|e| inner.storage(e))?;
                listed.push((name.value().to_owned(), partitions.value()));
            }
            Ok(listed)
        })
        .await
    }

    async fn append(&self, topic: &str, batches: Vec<(u32, Vec<Record>)>) -> Result<(), LogError> {
        check_topic_name(topic)?;
        let topic = topic.to_owned();
        self.blocking(move |inner| inner.append(&topic, batches, None).map(|_| ())).await
    }

    async fn append_as(
        &self,
        topic: &str,
        batches: Vec<(u32, Vec<Record>)>,
        producer: &str,
        sequence: u64,
    ) -> Result<bool, LogError> {
        check_topic_name(topic)?;
        let (topic, producer) = (topic.to_owned(), producer.to_owned());
        self.blocking(move |inner| inner.append(&topic, batches, Some((&producer, sequence)))).await
    }

    /// Exact, from the `producers` table: `since` is not needed.
    async fn producer_sequence(
        &self,
        topic: &str,
        partition: u32,
        producer: &str,
        _since: u64,
    ) -> Result<Option<u64>, LogError> {
        check_topic_name(topic)?;
        let (topic, producer) = (topic.to_owned(), producer.to_owned());
        self.blocking(move |inner| {
            let txn = inner.db.begin_read().map_err(|e| inner.storage(e))?;
            let table = match txn.open_table(PRODUCERS) {
                Ok(table) => table,
                Err(TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(inner.storage(e)),
            };
            let sequence = table.get((topic.as_str(), partition, producer.as_str())).map_err(|e| inner.storage(e))?;
            Ok(sequence.map(|s| s.value()))
        })
        .await
    }

    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<StoredRecord>, LogError> {
        check_topic_name(topic)?;
        let topic = topic.to_owned();
        self.blocking(move |inner| inner.read(&topic, partition, from, max)).await
    }

    async fn poll(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        mut batch: PolledBatch,
    ) -> Result<PolledBatch, LogError> {
        check_topic_name(topic)?;
        let topic = topic.to_owned();
        self.blocking(move |inner| {
            batch.clear();
            inner.scan(&topic, partition, from, max, |offset, bytes| {
                batch.push_encoded(offset, bytes)?;
                Ok(if batch.is_full() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
            })?;
            let span = batch.iter().next().map(|first| first.offset()).zip(batch.last().map(|last| last.offset()));
            if let Some((first, last)) = span {
                // Read after the records: every record scanned has its entry.
                let times = inner.append_times(&topic, partition, first, last)?;
                let mut times = times.into_iter().peekable();
                let mut current = None;
                batch.stamp_append_times(|offset| {
                    while let Some(&(_, time)) = times.peek().filter(|entry| entry.0 <= offset) {
                        current = i64::try_from(time).ok();
                        times.next();
                    }
                    current
                });
            }
            Ok(batch)
        })
        .await
    }

    fn max_record_bytes(&self, topic: &str) -> Option<usize> {
        Some(record_limit(topic))
    }

    /// Every append of this process goes through this log, so a
    /// consumer waiting on it hears of each one.
    fn appends(&self) -> Option<tokio::sync::watch::Receiver<()>> {
        Some(self.inner.appended.subscribe())
    }

    async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64, LogError> {
        check_topic_name(topic)?;
        let topic = topic.to_owned();
        self.blocking(move |inner| {
            let txn = inner.db.begin_read().map_err(|e| inner.storage(e))?;
            let topics = txn.open_table(TOPICS).map_err(|e| inner.storage(e))?;
            inner.check_partition(&topics, &topic, partition)?;
            inner.partition_end(&txn, &topic, partition)
        })
        .await
    }

    async fn end_offsets(&self, topic: &str) -> Result<Vec<u64>, LogError> {
        check_topic_name(topic)?;
        let topic = topic.to_owned();
        self.blocking(move |inner| {
            let txn = inner.db.begin_read().map_err(|e| inner.storage(e))?;
            let topics = txn.open_table(TOPICS).map_err(|e| inner.storage(e))?;
            let partitions = inner.partition_count(&topics, &topic)?;
            (0..partitions).map(|partition| inner.partition_end(&txn, &topic, partition)).collect()
        })
        .await
    }

    async fn store_consumer_offset(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
        next: u64,
    ) -> Result<(), LogError> {
        check_topic_name(topic)?;
        let (consumer, topic) = (consumer.to_owned(), topic.to_owned());
        self.blocking(move |inner| {
            let mut txn = inner.db.begin_write().map_err(|e| inner.storage(e))?;
            // Informational, and stored after every batch: without an
            // fsync of its own (it reaches the disk with the next append),
            // so a consumer does not wait for the disk twice per batch.
            txn.set_durability(redb::Durability::None).map_err(|e| inner.storage(e))?;
            {
                let topics = txn.open_table(TOPICS).map_err(|e| inner.storage(e))?;
                inner.check_partition(&topics, &topic, partition)?;
                let mut offsets = txn.open_table(CONSUMER_OFFSETS).map_err(|e| inner.storage(e))?;
                offsets.insert((consumer.as_str(), topic.as_str(), partition), next).map_err(|e| inner.storage(e))?;
            }
            txn.commit().map_err(|e| inner.storage(e))
        })
        .await
    }

    async fn consumer_offset(&self, consumer: &str, topic: &str, partition: u32) -> Result<Option<u64>, LogError> {
        check_topic_name(topic)?;
        let (consumer, topic) = (consumer.to_owned(), topic.to_owned());
        self.blocking(move |inner| {
            let txn = inner.db.begin_read().map_err(|e| inner.storage(e))?;
            let topics = txn.open_table(TOPICS).map_err(|e| inner.storage(e))?;
            inner.check_partition(&topics, &topic, partition)?;
            let offsets = txn.open_table(CONSUMER_OFFSETS).map_err(|e| inner.storage(e))?;
            let next = offsets.get((consumer.as_str(), topic.as_str(), partition)).map_err(|e| inner.storage(e))?;
            Ok(next.map(|v| v.value()))
        })
        .await
    }

    /// The first entry of `append-times` at or after `time`, in one
    /// lookup; records without a time count as older than every time.
    async fn offset_at(&self, topic: &str, partition: u32, time: SystemTime) -> Result<u64, LogError> {
        check_topic_name(topic)?;
        let topic = topic.to_owned();
        let wanted = unix_millis(time);
        self.blocking(move |inner| {
            let txn = inner.db.begin_read().map_err(|e| inner.storage(e))?;
            let topics = txn.open_table(TOPICS).map_err(|e| inner.storage(e))?;
            inner.check_partition(&topics, &topic, partition)?;
            let end = inner.partition_end(&txn, &topic, partition)?;
            let times = match txn.open_table(APPEND_TIMES) {
                Ok(times) => times,
                Err(TableError::TableDoesNotExist(_)) => return Ok(end),
                Err(e) => return Err(inner.storage(e)),
            };
            let topic = topic.as_str();
            let first = times.range((topic, partition, wanted)..=(topic, partition, u64::MAX));
            match first.map_err(|e| inner.storage(e))?.next() {
                Some(entry) => Ok(entry.map_err(|e| inner.storage(e))?.1.value().min(end)),
                None => Ok(end),
            }
        })
        .await
    }
}

impl Inner {
    fn storage(&self, e: impl Into<redb::Error>) -> LogError {
        storage(&self.path, e)
    }

    fn partition_count(&self, topics: &impl ReadableTable<&'static str, u32>, topic: &str) -> Result<u32, LogError> {
        match topics.get(topic).map_err(|e| self.storage(e))? {
            Some(count) => Ok(count.value()),
            None => Err(LogError::TopicNotFound { topic: topic.to_owned() }),
        }
    }

    fn check_partition(
        &self,
        topics: &impl ReadableTable<&'static str, u32>,
        topic: &str,
        partition: u32,
    ) -> Result<(), LogError> {
        let partitions = self.partition_count(topics, topic)?;
        if partition < partitions {
            Ok(())
        } else {
            Err(LogError::PartitionNotFound { topic: topic.to_owned(), partition, partitions })
        }
    }

    /// The end offset of a partition table: the last block's first offset
    /// plus its record count.
    fn end_of(
        &self,
        table: &impl ReadableTable<u64, &'static [u8]>,
        topic: &str,
        partition: u32,
    ) -> Result<u64, LogError> {
        let Some((key, value)) = table.last().map_err(|e| self.storage(e))? else { return Ok(0) };
        let offset = key.value();
        let corrupt = |reason: String| LogError::Corrupt { topic: topic.to_owned(), partition, offset, reason };
        let block = Block::parse(value.value()).map_err(corrupt)?;
        offset.checked_add(u64::from(block.count)).ok_or_else(|| corrupt("offsets overflow u64".to_owned()))
    }

    /// The end offset of a partition known to exist.
    fn partition_end(&self, txn: &redb::ReadTransaction, topic: &str, partition: u32) -> Result<u64, LogError> {
        match txn.open_table(partition_table(&partition_table_name(topic, partition))) {
            Ok(table) => self.end_of(&table, topic, partition),
            Err(TableError::TableDoesNotExist(_)) => Ok(0),
            Err(e) => Err(self.storage(e)),
        }
    }

    fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), LogError> {
        if partitions == 0 {
            return Err(LogError::InvalidPartitionCount { topic: topic.to_owned(), requested: partitions });
        }
        let txn = self.db.begin_write().map_err(|e| self.storage(e))?;
        {
            let mut topics = txn.open_table(TOPICS).map_err(|e| self.storage(e))?;
            let existing = topics.get(topic).map_err(|e| self.storage(e))?.map(|v| v.value());
            if let Some(existing) = existing {
                return if existing == partitions {
                    Ok(())
                } else {
                    Err(LogError::PartitionCountMismatch { topic: topic.to_owned(), existing, requested: partitions })
                };
            }
            topics.insert(topic, partitions).map_err(|e| self.storage(e))?;
            for partition in 0..partitions {
                txn.open_table(partition_table(&partition_table_name(topic, partition)))
                    .map_err(|e| self.storage(e))?;
            }
        }
        txn.commit().map_err(|e| self.storage(e))
    }

    /// Appends in one transaction; with a producer stamp, only when its
    /// sequence number is new, remembering it in the same transaction.
    fn append(
        &self,
        topic: &str,
        batches: Vec<(u32, Vec<Record>)>,
        stamp: Option<(&str, u64)>,
    ) -> Result<bool, LogError> {
        // Encode everything before taking the writer lock.
        let mut encoded = Vec::with_capacity(batches.len());
        let limit = record_limit(topic);
        for (partition, records) in &batches {
            let blocks = encode_blocks(records, limit).map_err(|unstorable| match unstorable {
                Unstorable::TooLarge { size } => {
                    LogError::RecordTooLarge { topic: topic.to_owned(), partition: *partition, size, limit }
                }
                Unstorable::Encoding(reason) => {
                    LogError::Refused { topic: topic.to_owned(), partition: *partition, reason }
                }
            })?;
            encoded.push((*partition, blocks));
        }
        drop(batches);

        let txn = self.db.begin_write().map_err(|e| self.storage(e))?;
        {
            let topics = txn.open_table(TOPICS).map_err(|e| self.storage(e))?;
            // Check every partition before writing anything: all or nothing.
            let partitions = self.partition_count(&topics, topic)?;
            if let Some(&(partition, _)) = encoded.iter().find(|(partition, _)| *partition >= partitions) {
                return Err(LogError::PartitionNotFound { topic: topic.to_owned(), partition, partitions });
            }
            if let Some((producer, sequence)) = stamp {
                // Partitions that already hold this stamp append nothing.
                let mut producers = txn.open_table(PRODUCERS).map_err(|e| self.storage(e))?;
                let mut fresh = Vec::with_capacity(encoded.len());
                for (partition, blocks) in encoded {
                    let key = (topic, partition, producer);
                    let known = producers.get(key).map_err(|e| self.storage(e))?.map(|s| s.value());
                    if known.is_none_or(|known| known < sequence) {
                        producers.insert(key, sequence).map_err(|e| self.storage(e))?;
                        fresh.push((partition, blocks));
                    }
                }
                if fresh.is_empty() {
                    return Ok(false);
                }
                encoded = fresh;
            } else if encoded.iter().all(|(_, blocks)| blocks.is_empty()) {
                return Ok(true);
            }
            let now = unix_millis(SystemTime::now());
            let mut times = txn.open_table(APPEND_TIMES).map_err(|e| self.storage(e))?;
            for (partition, blocks) in &encoded {
                if blocks.is_empty() {
                    continue;
                }
                let mut table = txn
                    .open_table(partition_table(&partition_table_name(topic, *partition)))
                    .map_err(|e| self.storage(e))?;
                let mut offset = self.end_of(&table, topic, *partition)?;
                self.note_append_time(&mut times, topic, *partition, offset, now)?;
                for (count, block) in blocks {
                    table.insert(offset, block.as_slice()).map_err(|e| self.storage(e))?;
                    offset += u64::from(*count);
                }
            }
        }
        txn.commit().map_err(|e| self.storage(e))?;
        self.appended.send_replace(());
        Ok(true)
    }

    /// Records that the records of `partition` from `first` on were appended
    /// at `now`, unless its last recorded time is already at or past it.
    fn note_append_time(
        &self,
        times: &mut redb::Table<(&'static str, u32, u64), u64>,
        topic: &str,
        partition: u32,
        first: u64,
        now: u64,
    ) -> Result<(), LogError> {
        let last =
            times.range((topic, partition, 0)..=(topic, partition, u64::MAX)).map_err(|e| self.storage(e))?.next_back();
        let last = last.transpose().map_err(|e| self.storage(e))?.map(|(time, _)| time.value().2);
        if last.is_none_or(|last| now > last) {
            times.insert((topic, partition, now), first).map_err(|e| self.storage(e))?;
        }
        Ok(())
    }

    fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<StoredRecord>, LogError> {
        let mut records = Vec::new();
        self.scan(topic, partition, from, max, |offset, bytes| {
            let record = match postcard::take_from_bytes::<Record>(bytes) {
                Ok((record, [])) => record,
                Ok((_, rest)) => return Err(format!("{} trailing bytes", rest.len())),
                Err(e) => return Err(e.to_string()),
            };
            records.push(StoredRecord { offset, record, append_time: None });
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(records)
    }

    /// The `append-times` entries that cover offsets `first` to `last` of
    /// `partition`, as (first offset, time), ascending: the last entry at or
    /// before `first` (none when `first` was appended before the log kept
    /// times), then every later one up to `last`. Entries ascend in time and
    /// offset together, so the first one is found by a binary search over
    /// time, a few dozen lookups, however long the partition's history.
    fn append_times(&self, topic: &str, partition: u32, first: u64, last: u64) -> Result<Vec<(u64, u64)>, LogError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let times = match txn.open_table(APPEND_TIMES) {
            Ok(times) => times,
            Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(self.storage(e)),
        };
        // The first entry at or after `time`, as (time, first offset).
        let at_or_after = |time: u64| -> Result<Option<(u64, u64)>, LogError> {
            let mut range =
                times.range((topic, partition, time)..=(topic, partition, u64::MAX)).map_err(|e| self.storage(e))?;
            let entry = range.next().transpose().map_err(|e| self.storage(e))?;
            Ok(entry.map(|(key, offset)| (key.value().2, offset.value())))
        };
        let (mut low, mut high, mut covering) = (0u64, u64::MAX, None);
        while low <= high {
            let middle = low + (high - low) / 2;
            match at_or_after(middle)? {
                Some((time, offset)) if offset <= first => {
                    covering = Some(time);
                    match time.checked_add(1) {
                        Some(next) => low = next,
                        None => break,
                    }
                }
                _ if middle == 0 => break,
                _ => high = middle - 1,
            }
        }
        let mut found = Vec::new();
        let range = times.range((topic, partition, covering.unwrap_or(0))..=(topic, partition, u64::MAX));
        for entry in range.map_err(|e| self.storage(e))? {
            let (key, offset) = entry.map_err(|e| self.storage(e))?;
            if offset.value() > last {
                break;
            }
            found.push((offset.value(), key.value().2));
        }
        Ok(found)
    }

    /// Hands `visit` the stored encoding of up to `max` records from offset
    /// `from` on, in offset order, until it says to stop; a reason it
    /// returns makes the record [`LogError::Corrupt`]. A record over the
    /// topic's [`record_limit`] is handed over as its stand-in
    /// ([`super::UNREADABLE`]), never copied.
    fn scan(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        mut visit: impl FnMut(u64, &[u8]) -> Result<ControlFlow<()>, String>,
    ) -> Result<(), LogError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let topics = txn.open_table(TOPICS).map_err(|e| self.storage(e))?;
        self.check_partition(&topics, topic, partition)?;
        let table = match txn.open_table(partition_table(&partition_table_name(topic, partition))) {
            Ok(table) => table,
            Err(TableError::TableDoesNotExist(_)) => return Ok(()),
            Err(e) => return Err(self.storage(e)),
        };
        let end = self.end_of(&table, topic, partition)?;
        if from >= end || max == 0 {
            return Ok(());
        }
        let corrupt =
            |offset: u64, reason: String| LogError::Corrupt { topic: topic.to_owned(), partition, offset, reason };
        let count = usize::try_from(end - from).map_or(max, |available| available.min(max));
        let mut visited = 0;
        let limit = record_limit(topic);

        // The block holding `from` is the last one starting at or before it.
        let first = table.range(..=from).map_err(|e| self.storage(e))?.next_back();
        let Some(first) = first else { return Err(corrupt(from, "no block holds this offset".to_owned())) };
        let mut expected = first.map_err(|e| self.storage(e))?.0.value();
        for entry in table.range(expected..).map_err(|e| self.storage(e))? {
            let (key, value) = entry.map_err(|e| self.storage(e))?;
            let offset = key.value();
            if offset != expected {
                return Err(corrupt(expected, format!("missing records: the next block starts at offset {offset}")));
            }
            let block = Block::parse(value.value()).map_err(|reason| corrupt(offset, reason))?;
            let skip = from.saturating_sub(offset);
            for (offset, index) in (offset + skip..).zip(skip..u64::from(block.count)) {
                // `index` < count ≤ u32::MAX, so it fits.
                let bytes = block.record(index as u32).map_err(|reason| corrupt(offset, reason))?;
                let flow = if bytes.len() > limit {
                    visit(offset, &stand_in(bytes.len(), limit))
                } else {
                    visit(offset, bytes)
                };
                let flow = flow.map_err(|reason| corrupt(offset, reason))?;
                visited += 1;
                if visited == count || flow.is_break() {
                    return Ok(());
                }
            }
            expected = offset + u64::from(block.count);
        }
        Err(corrupt(expected, format!("the partition ends before its end offset {end}")))
    }
}

/// The stored encoding of the stand-in read in place of a record of `size`
/// bytes, over the `limit` ([`super::UNREADABLE`]).
fn stand_in(size: usize, limit: usize) -> Vec<u8> {
    let reason = format!(
        "the record has {size} bytes as stored, over the embedded log's limit of {limit} bytes per record; it is \
         not read, and stays in the log at its offset"
    );
    let record = Record {
        headers: vec![Header { name: super::UNREADABLE.to_owned(), value: reason.into_bytes() }],
        body: Vec::new(),
    };
    postcard::to_allocvec(&record).expect("a record always encodes")
}

/// `time` in milliseconds since the Unix epoch (0 before it).
fn unix_millis(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// The block format this build writes and the only one it reads.
const BLOCK_FORMAT: u8 = 1;
/// A block holds at most this many records...
const BLOCK_MAX_RECORDS: usize = 1024;
/// ...and, unless it holds a single record, at most this many bytes: just
/// under redb's 32 KiB page order, leaving room for the leaf's own header
/// and key, so a block fills its pages instead of spilling into the next
/// power of two.
const BLOCK_MAX_BYTES: usize = 32 * 1024 - 256;
/// Format byte and record count.
const BLOCK_HEADER_LEN: usize = 5;

/// Why records cannot be stored.
#[derive(Debug)]
enum Unstorable {
    /// A record's encoding has `size` bytes, over the limit.
    TooLarge { size: usize },
    /// A record cannot be encoded.
    Encoding(String),
}

/// Splits records into encoded blocks: (record count, block bytes), each
/// record's encoding at most `limit` bytes.
///
/// A block is the format byte, the record count (u32 LE), the end of each
/// record in the payload (u32 LE each), then the records, postcard-encoded,
/// back to back. Storing many records per redb entry instead of one makes
/// appends several times cheaper; the index lets a read start in the middle
/// of a block without decoding what comes before.
fn encode_blocks(records: &[Record], limit: usize) -> Result<Vec<(u32, Vec<u8>)>, Unstorable> {
    let mut blocks = Vec::new();
    let mut payload = Vec::with_capacity(BLOCK_MAX_BYTES);
    let mut ends: Vec<u32> = Vec::with_capacity(BLOCK_MAX_RECORDS);
    for record in records {
        let start = payload.len();
        payload = postcard::to_extend(record, payload).map_err(|e| Unstorable::Encoding(e.to_string()))?;
        let size = payload.len() - start;
        if size > limit {
            return Err(Unstorable::TooLarge { size });
        }
        // The payload holds at most a block's bytes before this record.
        let end = u32::try_from(payload.len()).map_err(|_| Unstorable::TooLarge { size })?;
        if !ends.is_empty() && BLOCK_HEADER_LEN + 4 * (ends.len() + 1) + payload.len() > BLOCK_MAX_BYTES {
            // This record does not fit: seal the block without it and
            // start the next one with it.
            let carried = payload.split_off(start);
            blocks.push(seal_block(&mut payload, &mut ends));
            payload = carried;
            ends.push(u32::try_from(payload.len()).expect("smaller than the record that fit above"));
        } else {
            ends.push(end);
        }
        if ends.len() == BLOCK_MAX_RECORDS || BLOCK_HEADER_LEN + 4 * ends.len() + payload.len() >= BLOCK_MAX_BYTES {
            blocks.push(seal_block(&mut payload, &mut ends));
        }
    }
    if !ends.is_empty() {
        blocks.push(seal_block(&mut payload, &mut ends));
    }
    Ok(blocks)
}

fn seal_block(payload: &mut Vec<u8>, ends: &mut Vec<u32>) -> (u32, Vec<u8>) {
    // At most BLOCK_MAX_RECORDS, so it fits.
    let count = ends.len() as u32;
    let mut block = Vec::with_capacity(BLOCK_HEADER_LEN + 4 * ends.len() + payload.len());
    block.push(BLOCK_FORMAT);
    block.extend_from_slice(&count.to_le_bytes());
    for end in ends.drain(..) {
        block.extend_from_slice(&end.to_le_bytes());
    }
    block.extend_from_slice(payload);
    payload.clear();
    (count, block)
}

/// A stored block, checked enough to index into safely.
struct Block<'a> {
    count: u32,
    index: &'a [u8],
    payload: &'a [u8],
}

impl<'a> Block<'a> {
    fn parse(bytes: &'a [u8]) -> Result<Self, String> {
        let Some((&format, rest)) = bytes.split_first() else { return Err("empty block".to_owned()) };
        if format != BLOCK_FORMAT {
            return Err(format!("unknown block format {format}"));
        }
        let count = rest.get(..4).ok_or("truncated block header")?;
        let count = u32::from_le_bytes(count.try_into().expect("4 bytes"));
        if count == 0 {
            return Err("block with no records".to_owned());
        }
        let index_len = 4 * count as usize;
        let index = rest.get(4..4 + index_len).ok_or_else(|| format!("truncated block index ({count} records)"))?;
        let payload = &rest[4 + index_len..];
        let block = Self { count, index, payload };
        let last = block.end(count - 1);
        if last != payload.len() {
            return Err(format!("block index ends at {last}, payload has {} bytes", payload.len()));
        }
        Ok(block)
    }

    fn end(&self, index: u32) -> usize {
        let at = 4 * index as usize;
        u32::from_le_bytes(self.index[at..at + 4].try_into().expect("4 bytes")) as usize
    }

    /// The encoded bytes of record `index` (< count).
    fn record(&self, index: u32) -> Result<&'a [u8], String> {
        let start = if index == 0 { 0 } else { self.end(index - 1) };
        let end = self.end(index);
        self.payload.get(start..end).ok_or_else(|| format!("block index out of order ({start}..{end})"))
    }
}

fn storage(path: &Path, e: impl Into<redb::Error>) -> LogError {
    LogError::Storage { path: path.to_path_buf(), source: Box::new(e.into()) }
}

fn partition_table_name(topic: &str, partition: u32) -> String {
    format!("log/{topic}/{partition}")
}

fn partition_table(name: &str) -> TableDefinition<'_, u64, &'static [u8]> {
    TableDefinition::new(name)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::event::Header;

    fn record(i: u64) -> Record {
        Record {
            headers: vec![Header { name: "n".into(), value: i.to_le_bytes().to_vec() }],
            body: format!("body {i:0>95}").into_bytes(),
        }
    }

    fn records(range: std::ops::Range<u64>) -> Vec<Record> {
        range.map(record).collect()
    }

    fn open(dir: &tempfile::TempDir) -> EmbeddedLog {
        EmbeddedLog::open(dir.path().join("log.redb")).unwrap()
    }

    fn offsets(stored: &[StoredRecord]) -> Vec<u64> {
        stored.iter().map(|r| r.offset).collect()
    }

    #[tokio::test]
    async fn append_read_and_end_offsets_across_partitions() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir);
        log.create_topic("t", 3).await.unwrap();
        assert_eq!(log.partitions("t").await.unwrap(), 3);
        for p in 0..3 {
            assert_eq!(log.end_offset("t", p).await.unwrap(), 0);
            assert!(log.read("t", p, 0, 10).await.unwrap().is_empty());
        }
        log.append("t", vec![(0, records(0..3)), (2, records(10..12)), (0, records(3..5))]).await.unwrap();
        log.append("t", vec![(2, records(12..13))]).await.unwrap();
        assert_eq!(log.end_offset("t", 0).await.unwrap(), 5);
        assert_eq!(log.end_offset("t", 1).await.unwrap(), 0);
        assert_eq!(log.end_offset("t", 2).await.unwrap(), 3);

        let p0 = log.read("t", 0, 0, 100).await.unwrap();
        assert_eq!(offsets(&p0), vec![0, 1, 2, 3, 4]);
        assert_eq!(p0.into_iter().map(|r| r.record).collect::<Vec<_>>(), records(0..5));
        let p2 = log.read("t", 2, 0, 100).await.unwrap();
        assert_eq!(p2.into_iter().map(|r| r.record).collect::<Vec<_>>(), records(10..13));
        assert!(log.read("t", 1, 0, 100).await.unwrap().is_empty());

        assert!(matches!(
            log.read("t", 3, 0, 1).await,
            Err(LogError::PartitionNotFound { partition: 3, partitions: 3, .. })
        ));
        assert!(matches!(log.end_offset("nope", 0).await, Err(LogError::TopicNotFound { topic }) if topic == "nope"));
        assert!(matches!(log.append("nope", vec![]).await, Err(LogError::TopicNotFound { .. })));
    }

    #[tokio::test]
    async fn appends_are_signalled_and_nothing_else_is() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir);
        log.create_topic("t", 1).await.unwrap();
        let mut appends = log.appends().expect("the embedded log signals appends");
        log.store_consumer_offset("c", "t", 0, 0).await.unwrap();
        assert!(!appends.has_changed().unwrap(), "a consumer offset is not an append");
        log.append("t", vec![(0, records(0..2))]).await.unwrap();
        assert!(appends.has_changed().unwrap());
        appends.borrow_and_update();
        assert!(log.append_as("t", vec![(0, records(2..3))], "p", 1).await.unwrap());
        assert!(appends.has_changed().unwrap());
        appends.borrow_and_update();
        assert!(log.append("nope", vec![(0, records(0..1))]).await.is_err());
        assert!(!appends.has_changed().unwrap(), "a refused append changes nothing");
    }

    #[tokio::test]
    async fn a_time_finds_the_first_record_appended_at_or_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir);
        log.create_topic("t", 2).await.unwrap();
        let before = SystemTime::now();
        log.append("t", vec![(0, records(0..3))]).await.unwrap();
        // Past the first append's millisecond, whatever the clock's grain.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let between = SystemTime::now();
        log.append("t", vec![(0, records(3..5)), (1, records(0..1))]).await.unwrap();
        assert_eq!(log.offset_at("t", 0, SystemTime::UNIX_EPOCH).await.unwrap(), 0);
        assert_eq!(log.offset_at("t", 0, before).await.unwrap(), 0);
        assert_eq!(log.offset_at("t", 0, between).await.unwrap(), 3);
        assert_eq!(log.offset_at("t", 1, between).await.unwrap(), 0);
        let later = SystemTime::now() + std::time::Duration::from_secs(3600);
        assert_eq!(log.offset_at("t", 0, later).await.unwrap(), 5, "nothing after it: the end");
        assert!(matches!(log.offset_at("t", 2, before).await, Err(LogError::PartitionNotFound { partition: 2, .. })));
    }

    #[tokio::test]
    async fn a_log_written_without_append_times_opens_and_its_records_count_as_older() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir);
        log.create_topic("t", 1).await.unwrap();
        log.append("t", vec![(0, records(0..3))]).await.unwrap();
        drop(log);
        {
            // What a log of an earlier build holds: no append times.
            let db = Database::create(dir.path().join("log.redb")).unwrap();
            let txn = db.begin_write().unwrap();
            assert!(txn.delete_table(APPEND_TIMES).unwrap());
            txn.commit().unwrap();
        }
        let log = open(&dir);
        assert_eq!(log.offset_at("t", 0, SystemTime::UNIX_EPOCH).await.unwrap(), 3, "untimed: before every time");
        log.append("t", vec![(0, records(3..5))]).await.unwrap();
        assert_eq!(log.offset_at("t", 0, SystemTime::UNIX_EPOCH).await.unwrap(), 3);
        assert_eq!(offsets(&log.read("t", 0, 0, 10).await.unwrap()), vec![0, 1, 2, 3, 4]);
        // A poll says no append time for the records of the earlier build.
        let polled = log.poll("t", 0, 0, 10, PolledBatch::new()).await.unwrap();
        let times: Vec<bool> = polled.iter().map(|view| view.append_time().is_some()).collect();
        assert_eq!(times, [false, false, false, true, true]);
    }

    /// Every polled record carries the time its append was stored, from
    /// any offset on: 40 appends in different milliseconds, polled from
    /// every offset, each record's time within its append's call and the
    /// times never going back.
    #[tokio::test]
    async fn a_poll_gives_each_record_the_time_it_was_appended() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir);
        log.create_topic("t", 1).await.unwrap();
        let mut windows = Vec::new();
        for first in (0..80).step_by(2) {
            let before = unix_millis(SystemTime::now());
            log.append("t", vec![(0, records(first..first + 2))]).await.unwrap();
            let after = unix_millis(SystemTime::now());
            windows.extend([(before, after); 2]);
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        for from in 0..80u64 {
            let polled = log.poll("t", 0, from, 7, PolledBatch::new()).await.unwrap();
            let mut last = 0;
            for view in polled.iter() {
                let time = u64::try_from(view.append_time().expect("appended with a time")).unwrap();
                let (before, after) = windows[view.offset() as usize];
                assert!(before <= time && time <= after && time >= last, "offset {}: {time}", view.offset());
                last = time;
            }
        }
    }

    #[tokio::test]
    async fn read_from_the_middle_and_past_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir);
        log.create_topic("t", 1).await.unwrap();
        log.append("t", vec![(0, records(0..10))]).await.unwrap();
        let middle = log.read("t", 0, 4, 3).await.unwrap();
        assert_eq!(offsets(&middle), vec![4, 5, 6]);
        assert_eq!(middle[0].record, record(4));
        assert_eq!(offsets(&log.read("t", 0, 8, 100).await.unwrap()), vec![8, 9]);
        assert!(log.read("t", 0, 10, 100).await.unwrap().is_empty());
        assert!(log.read("t", 0, 1000, 100).await.unwrap().is_empty());
        assert!(log.read("t", 0, 0, 0).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn append_is_all_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir);
        log.create_topic("t", 2).await.unwrap();
        log.append("t", vec![(0, records(0..2))]).await.unwrap();
        let err = log.append("t", vec![(0, records(2..4)), (1, records(0..1)), (7, records(0..1))]).await.unwrap_err();
        assert!(matches!(err, LogError::PartitionNotFound { partition: 7, partitions: 2, .. }), "{err}");
        assert_eq!(log.end_offset("t", 0).await.unwrap(), 2);
        assert_eq!(log.end_offset("t", 1).await.unwrap(), 0);
        // The log still works after the refused append.
        log.append("t", vec![(0, records(2..3))]).await.unwrap();
        assert_eq!(offsets(&log.read("t", 0, 0, 10).await.unwrap()), vec![0, 1, 2]);
    }

    #[tokio::test]
    async fn topics_and_records_persist_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/dirs/log.redb");
        {
            let log = EmbeddedLog::open(&path).unwrap();
            log.create_topic("a", 2).await.unwrap();
            log.create_topic("b.c_d-1", 1).await.unwrap();
            log.append("a", vec![(1, records(0..4))]).await.unwrap();
            log.store_consumer_offset("proj", "a", 1, 3).await.unwrap();
        }
        let log = EmbeddedLog::open(&path).unwrap();
        assert_eq!(log.partitions("a").await.unwrap(), 2);
        assert_eq!(log.partitions("b.c_d-1").await.unwrap(), 1);
        assert_eq!(log.end_offset("a", 1).await.unwrap(), 4);
        assert_eq!(log.read("t", 0, 0, 1).await.unwrap_err().to_string(), "topic `t` does not exist");
        assert_eq!(log.read("a", 1, 3, 10).await.unwrap()[0].record, record(3));
        assert_eq!(log.consumer_offset("proj", "a", 1).await.unwrap(), Some(3));
    }

    #[tokio::test]
    async fn create_topic_is_idempotent_and_refuses_another_count() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir);
        log.create_topic("t", 4).await.unwrap();
        log.append("t", vec![(3, records(0..1))]).await.unwrap();
        log.create_topic("t", 4).await.unwrap();
        assert_eq!(log.end_offset("t", 3).await.unwrap(), 1);
        let err = log.create_topic("t", 5).await.unwrap_err();
        assert!(matches!(err, LogError::PartitionCountMismatch { existing: 4, requested: 5, .. }));
        assert_eq!(err.to_string(), "topic `t` has 4 partitions, not 5");
        assert!(matches!(log.create_topic("z", 0).await, Err(LogError::InvalidPartitionCount { requested: 0, .. })));
        assert!(matches!(log.partitions("z").await, Err(LogError::TopicNotFound { .. })));
    }

    #[tokio::test]
    async fn invalid_topic_names_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir);
        let long = "x".repeat(256);
        for bad in ["", "a/b", "a b", "é", "log\n", long.as_str()] {
            match log.create_topic(bad, 1).await {
                Err(LogError::InvalidTopicName { topic, .. }) => assert_eq!(topic, bad),
                other => panic!("{bad:?}: {other:?}"),
            }
            assert!(matches!(log.read(bad, 0, 0, 1).await, Err(LogError::InvalidTopicName { .. })));
        }
        let err = log.create_topic("a/b", 1).await.unwrap_err().to_string();
        assert!(err.contains("\"a/b\""), "{err}");
        log.create_topic(&"x".repeat(255), 1).await.unwrap();
    }

    #[tokio::test]
    async fn append_as_appends_each_sequence_number_once_per_producer_and_partition() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir);
        log.create_topic("t", 2).await.unwrap();
        log.create_topic("u", 1).await.unwrap();
        assert_eq!(log.producer_sequence("t", 0, "p", 0).await.unwrap(), None);
        assert!(log.append_as("t", vec![(0, records(0..3))], "p", 5).await.unwrap());
        // The same stamp again, or an older one: nothing is appended there.
        assert!(!log.append_as("t", vec![(0, records(3..6))], "p", 5).await.unwrap());
        assert!(!log.append_as("t", vec![(0, records(3..6))], "p", 4).await.unwrap());
        assert_eq!((log.end_offset("t", 0).await.unwrap(), log.end_offset("t", 1).await.unwrap()), (3, 0));
        assert_eq!(log.producer_sequence("t", 0, "p", 0).await.unwrap(), Some(5));
        // Exact wherever the stamp lies: `since` is not needed.
        assert_eq!(log.producer_sequence("t", 0, "p", u64::MAX).await.unwrap(), Some(5));
        // A partition the earlier stamp never reached takes it.
        assert!(log.append_as("t", vec![(0, records(3..6)), (1, records(3..5))], "p", 5).await.unwrap());
        assert_eq!((log.end_offset("t", 0).await.unwrap(), log.end_offset("t", 1).await.unwrap()), (3, 2));
        assert_eq!(log.producer_sequence("t", 1, "p", 0).await.unwrap(), Some(5));
        // Other producers and other topics keep their own numbers.
        assert!(log.append_as("t", vec![(1, records(0..1))], "q", 1).await.unwrap());
        assert!(log.append_as("u", vec![(0, records(0..1))], "p", 1).await.unwrap());
        assert!(log.append_as("t", vec![(0, records(3..4))], "p", 6).await.unwrap());
        assert_eq!(log.end_offset("t", 0).await.unwrap(), 4);
        // A refused append (no such partition) remembers nothing.
        assert!(log.append_as("t", vec![(9, records(0..1))], "p", 7).await.is_err());
        assert_eq!(log.producer_sequence("t", 0, "p", 0).await.unwrap(), Some(6));
        // And the numbers survive a reopen.
        drop(log);
        let log = open(&dir);
        assert!(!log.append_as("t", vec![(0, records(0..1))], "p", 6).await.unwrap());
    }

    #[tokio::test]
    async fn consumer_offsets_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir);
        log.create_topic("t", 2).await.unwrap();
        assert_eq!(log.consumer_offset("c", "t", 0).await.unwrap(), None);
        log.store_consumer_offset("c", "t", 0, 10).await.unwrap();
        log.store_consumer_offset("c", "t", 1, 20).await.unwrap();
        log.store_consumer_offset("d", "t", 0, 30).await.unwrap();
        log.store_consumer_offset("c", "t", 0, 11).await.unwrap();
        assert_eq!(log.consumer_offset("c", "t", 0).await.unwrap(), Some(11));
        assert_eq!(log.consumer_offset("c", "t", 1).await.unwrap(), Some(20));
        assert_eq!(log.consumer_offset("d", "t", 0).await.unwrap(), Some(30));
        assert_eq!(log.consumer_offset("d", "t", 1).await.unwrap(), None);
        assert!(matches!(log.store_consumer_offset("c", "t", 2, 0).await, Err(LogError::PartitionNotFound { .. })));
        assert!(matches!(log.consumer_offset("c", "u", 0).await, Err(LogError::TopicNotFound { .. })));
    }

    /// Writes `blocks` (key, bytes) straight into partition 1 of topic `t`.
    fn poke(path: &Path, blocks: &[(u64, Vec<u8>)]) {
        let db = Database::create(path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(partition_table("log/t/1")).unwrap();
            for (key, bytes) in blocks {
                table.insert(key, bytes.as_slice()).unwrap();
            }
        }
        txn.commit().unwrap();
    }

    fn block_of(records: &[&[u8]]) -> Vec<u8> {
        let mut payload = Vec::new();
        let mut ends = Vec::new();
        for record in records {
            payload.extend_from_slice(record);
            ends.push(payload.len() as u32);
        }
        seal_block(&mut payload, &mut ends).1
    }

    /// Everything a consumer asks of a log, to its end: what a damaged
    /// file must answer with an error or with records, never a panic.
    async fn read_everything(path: &Path) -> Result<usize, LogError> {
        let log = EmbeddedLog::open(path)?;
        let mut read = 0;
        for partition in 0..log.partitions("t").await? {
            log.consumer_offset("c", "t", partition).await?;
            let end = log.end_offset("t", partition).await?;
            let mut from = 0;
            while from < end {
                let records = log.read("t", partition, from, 500).await?;
                let Some(last) = records.last() else { break };
                from = last.offset + 1;
                read += records.len();
            }
        }
        Ok(read)
    }

    #[tokio::test]
    async fn a_damaged_file_is_refused_at_opening_naming_it_never_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let intact = dir.path().join("intact.redb");
        {
            let log = EmbeddedLog::open(&intact).unwrap();
            log.create_topic("t", 2).await.unwrap();
            for chunk in 0..20 {
                log.append("t", vec![(0, records(chunk * 200..chunk * 200 + 200)), (1, records(0..100))])
                    .await
                    .unwrap();
            }
            log.store_consumer_offset("c", "t", 0, 7).await.unwrap();
        }
        assert_eq!(read_everything(&intact).await.unwrap(), 6000);
        // Without the check at opening, redb panics on some of these copies
        // (a page index past its page) and allocates without bound on others.
        let mut refused = 0;
        for seed in 0..40 {
            let path = dir.path().join(format!("damaged-{seed}.redb"));
            std::fs::copy(&intact, &path).unwrap();
            redb_file::flip_bytes(&path, seed, 50);
            match read_everything(&path).await {
                Err(LogError::Damaged { path: named, .. }) => {
                    assert_eq!(named, path);
                    refused += 1;
                }
                Err(other) => panic!("seed {seed}: not reported as damaged: {other:?}"),
                // The bytes fell where no committed page is.
                Ok(read) => assert_eq!(read, 6000, "seed {seed}"),
            }
        }
        assert!(refused >= 30, "only {refused} of 40 damaged copies refused");
    }

    #[tokio::test]
    async fn an_emptied_file_is_damaged_not_a_new_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.redb");
        EmbeddedLog::open(&path).unwrap().create_topic("t", 1).await.unwrap();
        std::fs::write(&path, b"").unwrap();
        let error = EmbeddedLog::open(&path).unwrap_err();
        assert!(matches!(&error, LogError::Damaged { path: named, .. } if *named == path), "{error:?}");
        assert!(error.to_string().contains("is empty"), "{error}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "the refused file was written to");
    }

    #[tokio::test]
    async fn undecodable_record_is_corrupt_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.redb");
        {
            let log = EmbeddedLog::open(&path).unwrap();
            log.create_topic("t", 2).await.unwrap();
            log.append("t", vec![(1, records(0..3))]).await.unwrap();
        }
        let reopen = || EmbeddedLog::open(&path).unwrap();

        // Garbage where a block should be.
        poke(&path, &[(3, vec![0xFF, 0xFF, 0xFF])]);
        let log = reopen();
        let err = log.read("t", 1, 0, 10).await.unwrap_err();
        match &err {
            LogError::Corrupt { topic, partition: 1, offset: 3, reason } if topic == "t" => {
                assert_eq!(reason, "unknown block format 255");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(err.to_string(), "corrupt record in `t` partition 1 at offset 3: unknown block format 255");
        assert!(matches!(log.end_offset("t", 1).await, Err(LogError::Corrupt { offset: 3, .. })));
        drop(log);

        // Well-formed blocks holding a record that is not postcard, and one
        // with trailing bytes.
        let mut trailing = postcard::to_allocvec(&record(4)).unwrap();
        trailing.push(0);
        let good = postcard::to_allocvec(&record(5)).unwrap();
        poke(&path, &[(3, block_of(&[&[0xFF, 0xFF, 0xFF]])), (4, block_of(&[&trailing, &good]))]);
        let log = reopen();
        assert_eq!(log.end_offset("t", 1).await.unwrap(), 6);
        assert_eq!(log.read("t", 1, 0, 3).await.unwrap()[2].record, record(2));
        assert!(matches!(log.read("t", 1, 0, 10).await, Err(LogError::Corrupt { offset: 3, .. })));
        let err = log.read("t", 1, 4, 10).await.unwrap_err();
        assert!(
            matches!(err, LogError::Corrupt { offset: 4, ref reason, .. } if reason == "1 trailing bytes"),
            "{err}"
        );
        assert_eq!(log.read("t", 1, 5, 10).await.unwrap()[0].record, record(5));
        drop(log);

        // A gap in the offsets, and a truncated index.
        poke(&path, &[(3, block_of(&[&good])), (4, block_of(&[&good])), (6, block_of(&[&good]))]);
        let log = reopen();
        assert_eq!(log.end_offset("t", 1).await.unwrap(), 7);
        let err = log.read("t", 1, 0, 10).await.unwrap_err();
        assert!(
            matches!(err, LogError::Corrupt { offset: 5, ref reason, .. } if reason.starts_with("missing records")),
            "{err}"
        );
        drop(log);
        poke(&path, &[(4, Vec::new())]);
        let log = reopen();
        assert!(
            matches!(log.read("t", 1, 4, 1).await, Err(LogError::Corrupt { offset: 4, ref reason, .. }) if reason == "empty block")
        );
        drop(log);
        let mut truncated = block_of(&[&good, &good]);
        truncated.truncate(7);
        poke(&path, &[(4, block_of(&[&good, &good])), (6, truncated)]);
        let log = reopen();
        let err = log.end_offset("t", 1).await.unwrap_err();
        assert!(
            matches!(err, LogError::Corrupt { offset: 6, ref reason, .. } if reason.starts_with("truncated block index")),
            "{err}"
        );
    }

    /// A record whose stored encoding has exactly `size` bytes.
    fn record_of_size(size: usize) -> Record {
        let base = postcard::experimental::serialized_size(&record(0)).unwrap() - record(0).body.len() - 1;
        // The body's length prefix takes 4 bytes for bodies of 2 to 256 MiB.
        let record = Record { body: vec![7; size - base - 4], ..record(0) };
        assert_eq!(postcard::experimental::serialized_size(&record).unwrap(), size);
        record
    }

    #[tokio::test]
    async fn a_record_over_the_limit_is_refused_naming_its_size_and_nothing_is_appended() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir);
        log.create_topic("t", 2).await.unwrap();
        let batches = vec![(0, records(0..3)), (1, vec![record(3), record_of_size(MAX_RECORD_BYTES + 1)])];
        let error = log.append("t", batches).await.unwrap_err();
        assert!(
            matches!(error, LogError::RecordTooLarge { ref topic, partition: 1, size, limit: MAX_RECORD_BYTES }
                if topic == "t" && size == MAX_RECORD_BYTES + 1),
            "{error:?}"
        );
        assert_eq!(
            error.to_string(),
            "`t` partition 1 refuses a record of 16777217 bytes: the log takes at most 16777216 bytes per record \
             (headers and body)"
        );
        assert_eq!(log.end_offsets("t").await.unwrap(), [0, 0], "all or nothing");
        // At the limit: stored, and read back whole.
        log.append("t", vec![(1, vec![record_of_size(MAX_RECORD_BYTES), record(1)])]).await.unwrap();
        let read = log.read("t", 1, 0, 10).await.unwrap();
        assert_eq!(
            read.iter().map(|stored| &stored.record).collect::<Vec<_>>(),
            [&record_of_size(MAX_RECORD_BYTES), &record(1)]
        );
        let polled = log.poll("t", 1, 0, 10, PolledBatch::new()).await.unwrap();
        assert_eq!(polled.iter().next().unwrap().body().len(), record_of_size(MAX_RECORD_BYTES).body.len());
        // The host's retry and dead-letter topics take the routing headers'
        // room on top, and no more.
        assert_eq!(log.max_record_bytes("t"), Some(MAX_RECORD_BYTES));
        for topic in ["retry_t".to_owned(), "dlq_t".to_owned()] {
            log.create_topic(&topic, 1).await.unwrap();
            assert_eq!(log.max_record_bytes(&topic), Some(MAX_RECORD_BYTES + ROUTED_HEADROOM));
            log.append(&topic, vec![(0, vec![record_of_size(MAX_RECORD_BYTES + ROUTED_HEADROOM)])]).await.unwrap();
            let error = log.append(&topic, vec![(0, vec![record_of_size(MAX_RECORD_BYTES + ROUTED_HEADROOM + 1)])]);
            assert!(matches!(error.await, Err(LogError::RecordTooLarge { .. })), "{topic}");
            assert_eq!(log.end_offset(&topic, 0).await.unwrap(), 1);
        }
    }

    #[tokio::test]
    async fn a_stored_record_over_the_limit_reads_as_a_stand_in_and_the_partition_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.redb");
        let log = EmbeddedLog::open(&path).unwrap();
        log.create_topic("t", 2).await.unwrap();
        log.append("t", vec![(1, records(0..2))]).await.unwrap();
        drop(log);
        // As an older version (or a hand) would have written it.
        let oversize = record_of_size(MAX_RECORD_BYTES + 100);
        let blocks = encode_blocks(&[oversize, record(3)], usize::MAX).unwrap();
        poke(&path, &[(2, blocks[0].1.clone()), (3, blocks[1].1.clone())]);
        let log = EmbeddedLog::open(&path).unwrap();
        let reason = "the record has 16777316 bytes as stored, over the embedded log's limit of 16777216 bytes per \
                      record; it is not read, and stays in the log at its offset";
        let stand_in = Record {
            headers: vec![Header { name: super::super::UNREADABLE.into(), value: reason.as_bytes().to_vec() }],
            body: Vec::new(),
        };
        let read = log.read("t", 1, 0, 10).await.unwrap();
        assert_eq!(offsets(&read), [0, 1, 2, 3]);
        assert_eq!(read[2].record, stand_in);
        assert_eq!(read[3].record, record(3));
        let polled = log.poll("t", 1, 1, 10, PolledBatch::new()).await.unwrap();
        assert_eq!(polled.iter().map(|view| view.to_record()).collect::<Vec<_>>(), [record(1), stand_in, record(3)]);
        let stand_in = polled.iter().nth(1).unwrap();
        assert_eq!(super::super::unreadable_reason(stand_in.headers()).as_deref(), Some(reason));
        assert_eq!(super::super::unreadable_reason(polled.iter().next().unwrap().headers()), None);
    }

    #[test]
    fn blocks_split_by_count_and_size() {
        let counts = |blocks: &[(u32, Vec<u8>)]| blocks.iter().map(|(count, _)| *count).collect::<Vec<_>>();
        let tiny: Vec<Record> = (0..2100).map(|_| Record { headers: vec![], body: vec![] }).collect();
        assert_eq!(counts(&encode_blocks(&tiny, MAX_RECORD_BYTES).unwrap()), vec![1024, 1024, 52]);
        let big: Vec<Record> = (0..5).map(|i| Record { headers: vec![], body: vec![i; 12_000] }).collect();
        assert_eq!(counts(&encode_blocks(&big, MAX_RECORD_BYTES).unwrap()), vec![2, 2, 1]);
        let huge = vec![Record { headers: vec![], body: vec![1; 100_000] }, record(1)];
        assert_eq!(counts(&encode_blocks(&huge, MAX_RECORD_BYTES).unwrap()), vec![1, 1]);
        let many = records(0..3000);
        let blocks = encode_blocks(&many, MAX_RECORD_BYTES).unwrap();
        assert_eq!(counts(&blocks).iter().sum::<u32>(), 3000);
        for (count, bytes) in &blocks {
            assert!(bytes.len() <= BLOCK_MAX_BYTES || *count == 1);
            assert_eq!(Block::parse(bytes).unwrap().count, *count);
        }
        assert!(encode_blocks(&[], MAX_RECORD_BYTES).unwrap().is_empty());
    }

    #[tokio::test]
    async fn reads_cross_block_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir);
        log.create_topic("t", 1).await.unwrap();
        // Several blocks, then small appends of 1 and 3.
        let blocks = encode_blocks(&records(0..600), MAX_RECORD_BYTES).unwrap();
        assert!(blocks.len() > 2, "{}", blocks.len());
        log.append("t", vec![(0, records(0..600))]).await.unwrap();
        log.append("t", vec![(0, records(600..601))]).await.unwrap();
        log.append("t", vec![(0, records(601..604))]).await.unwrap();
        assert_eq!(log.end_offset("t", 0).await.unwrap(), 604);
        let mut cases = vec![(0, 604), (250, 300), (599, 3), (600, 10), (603, 1), (17, 1)];
        let mut boundary = 0;
        for (count, _) in &blocks {
            boundary += u64::from(*count);
            cases.extend([(boundary - 1, 1), (boundary - 1, 2), (boundary, 1), (boundary + 1, 1000)]);
        }
        for (from, max) in cases {
            let read = log.read("t", 0, from, max).await.unwrap();
            let expected: Vec<u64> = (from..604).take(max).collect();
            assert_eq!(offsets(&read), expected, "from {from} max {max}");
            assert!(read.iter().all(|r| r.record == record(r.offset)));
        }
    }

    #[test]
    fn a_second_open_of_the_same_file_is_in_use_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.redb");
        let _log = EmbeddedLog::open(&path).unwrap();
        let err = EmbeddedLog::open(&path).unwrap_err();
        assert!(matches!(&err, LogError::InUse { path: named } if *named == path), "{err:?}");
        assert!(err.to_string().contains("log.redb` is in use by another process"), "{err}");
    }

    /// A throughput figure; run with
    /// `cargo test --release -p wakuwaku --lib log::embedded::tests::throughput -- --ignored --nocapture`.
    #[tokio::test(flavor = "multi_thread")]
    #[ignore = "measurement, run in release"]
    async fn throughput() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir);
        log.create_topic("bench", 1).await.unwrap();
        let headers = crate::event::EventHeaders {
            tag: crate::event::EventTypeTag::new(1),
            key: crate::key::Key::int(42u64),
            ordering: crate::event::EventAtomicOrdering::Relaxed,
            algebra: crate::event::Algebra::NonAssociative,
            event_time: None,
        }
        .to_headers();
        let total = 1_000_000u64;
        let chunk = 65_536usize;
        let records: Vec<Record> =
            (0..total).map(|i| Record { headers: headers.clone(), body: vec![(i % 251) as u8; 100] }).collect();
        let chunks: Vec<Vec<Record>> = records.chunks(chunk).map(<[Record]>::to_vec).collect();
        drop(records);
        let started = Instant::now();
        for batch in chunks {
            log.append("bench", vec![(0, batch)]).await.unwrap();
        }
        let append = started.elapsed();
        let started = Instant::now();
        let (mut from, mut read) = (0, 0);
        loop {
            let batch = log.read("bench", 0, from, 4096).await.unwrap();
            let Some(last) = batch.last() else { break };
            from = last.offset + 1;
            read += batch.len();
        }
        let reading = started.elapsed();
        assert_eq!(read as u64, total);
        let size = std::fs::metadata(log.path()).unwrap().len();
        println!(
            "append {total} records in chunks of {chunk}: {append:?} ({:.0}/s); read in 4096s: {reading:?} ({:.0}/s); file {} MB",
            total as f64 / append.as_secs_f64(),
            total as f64 / reading.as_secs_f64(),
            size / 1_000_000,
        );
    }
}
