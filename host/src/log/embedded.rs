//! The embedded log: every topic of one host in a single redb file.
//!
//! Layout of the file:
//! - `topics`: topic name → partition count.
//! - `log/{topic}/{partition}`: one table per partition, offset (u64) →
//!   the [`Record`] encoded with postcard. Offsets are the keys, so a read
//!   is one range scan and the end offset is the last key plus one.
//! - `consumer-offsets`: (consumer, topic, partition) → next offset.
//!
//! Every write is one durable redb transaction: a committed append survives
//! a crash, and a failed one leaves nothing behind. redb does blocking file
//! I/O, so each call runs on tokio's blocking pool
//! ([`tokio::task::spawn_blocking`]); the methods must therefore be called
//! from within a tokio runtime.
//!
//! Topic names are non-empty, at most 255 bytes, and use only ASCII letters,
//! digits, `.`, `_` and `-`; anything else is
//! [`LogError::InvalidTopicName`]. This keeps the table names unambiguous
//! and matches what Iggy accepts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableError};

use super::{EventLog, LogError, Record, StoredRecord};

/// topic → partition count.
const TOPICS: TableDefinition<&str, u32> = TableDefinition::new("topics");
/// (consumer, topic, partition) → next offset.
const CONSUMER_OFFSETS: TableDefinition<(&str, &str, u32), u64> = TableDefinition::new("consumer-offsets");

/// The longest topic name accepted, in bytes.
pub const MAX_TOPIC_NAME_LEN: usize = 255;

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
}

impl std::fmt::Debug for EmbeddedLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedLog").field("path", &self.inner.path).finish_non_exhaustive()
    }
}

impl EmbeddedLog {
    /// Opens the log file at `path`, creating it (and its parent
    /// directories) if it does not exist.
    ///
    /// Blocks on file I/O; call it before serving or from a blocking task.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LogError> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| LogError::Io { path: path.clone(), source })?;
        }
        let db = Database::create(&path).map_err(|e| storage(&path, e))?;
        let inner = Inner { db, path };
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
        validate_topic_name(topic)?;
        let topic = topic.to_owned();
        self.blocking(move |inner| inner.create_topic(&topic, partitions)).await
    }

    async fn partitions(&self, topic: &str) -> Result<u32, LogError> {
        validate_topic_name(topic)?;
        let topic = topic.to_owned();
        self.blocking(move |inner| {
            let txn = inner.db.begin_read().map_err(|e| inner.storage(e))?;
            let topics = txn.open_table(TOPICS).map_err(|e| inner.storage(e))?;
            inner.partition_count(&topics, &topic)
        })
        .await
    }

    async fn append(&self, topic: &str, batches: Vec<(u32, Vec<Record>)>) -> Result<(), LogError> {
        validate_topic_name(topic)?;
        let topic = topic.to_owned();
        self.blocking(move |inner| inner.append(&topic, batches)).await
    }

    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<StoredRecord>, LogError> {
        validate_topic_name(topic)?;
        let topic = topic.to_owned();
        self.blocking(move |inner| inner.read(&topic, partition, from, max)).await
    }

    async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64, LogError> {
        validate_topic_name(topic)?;
        let topic = topic.to_owned();
        self.blocking(move |inner| {
            let txn = inner.db.begin_read().map_err(|e| inner.storage(e))?;
            let topics = txn.open_table(TOPICS).map_err(|e| inner.storage(e))?;
            inner.check_partition(&topics, &topic, partition)?;
            match txn.open_table(partition_table(&partition_table_name(&topic, partition))) {
                Ok(table) => inner.end_of(&table),
                Err(TableError::TableDoesNotExist(_)) => Ok(0),
                Err(e) => Err(inner.storage(e)),
            }
        })
        .await
    }

    async fn store_consumer_offset(&self, consumer: &str, topic: &str, partition: u32, next: u64) -> Result<(), LogError> {
        validate_topic_name(topic)?;
        let (consumer, topic) = (consumer.to_owned(), topic.to_owned());
        self.blocking(move |inner| {
            let txn = inner.db.begin_write().map_err(|e| inner.storage(e))?;
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
        validate_topic_name(topic)?;
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

    fn check_partition(&self, topics: &impl ReadableTable<&'static str, u32>, topic: &str, partition: u32) -> Result<(), LogError> {
        let partitions = self.partition_count(topics, topic)?;
        if partition < partitions {
            Ok(())
        } else {
            Err(LogError::PartitionNotFound { topic: topic.to_owned(), partition, partitions })
        }
    }

    /// The end offset of a partition table: its last key plus one.
    fn end_of(&self, table: &impl ReadableTable<u64, &'static [u8]>) -> Result<u64, LogError> {
        Ok(table.last().map_err(|e| self.storage(e))?.map_or(0, |(offset, _)| offset.value() + 1))
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
                txn.open_table(partition_table(&partition_table_name(topic, partition))).map_err(|e| self.storage(e))?;
            }
        }
        txn.commit().map_err(|e| self.storage(e))
    }

    fn append(&self, topic: &str, batches: Vec<(u32, Vec<Record>)>) -> Result<(), LogError> {
        // Encode everything before taking the writer lock, into one buffer.
        let total: usize = batches.iter().map(|(_, records)| records.len()).sum();
        let mut bytes = Vec::with_capacity(total * 128);
        let mut ends = Vec::with_capacity(total);
        for (partition, records) in &batches {
            for record in records {
                bytes = postcard::to_extend(record, bytes).map_err(|e| LogError::Storage {
                    path: self.path.clone(),
                    source: format!("cannot encode a record for `{topic}` partition {partition}: {e}").into(),
                })?;
                ends.push(bytes.len());
            }
        }

        let txn = self.db.begin_write().map_err(|e| self.storage(e))?;
        {
            let topics = txn.open_table(TOPICS).map_err(|e| self.storage(e))?;
            // Check every partition before writing anything: all or nothing.
            let partitions = self.partition_count(&topics, topic)?;
            if let Some(&(partition, _)) = batches.iter().find(|(partition, _)| *partition >= partitions) {
                return Err(LogError::PartitionNotFound { topic: topic.to_owned(), partition, partitions });
            }
            if total == 0 {
                return Ok(());
            }
            let (mut start, mut ends) = (0, ends.into_iter());
            for (partition, records) in &batches {
                if records.is_empty() {
                    continue;
                }
                let mut table = txn
                    .open_table(partition_table(&partition_table_name(topic, *partition)))
                    .map_err(|e| self.storage(e))?;
                let mut offset = self.end_of(&table)?;
                for end in ends.by_ref().take(records.len()) {
                    table.insert(offset, &bytes[start..end]).map_err(|e| self.storage(e))?;
                    offset += 1;
                    start = end;
                }
            }
        }
        txn.commit().map_err(|e| self.storage(e))
    }

    fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<StoredRecord>, LogError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let topics = txn.open_table(TOPICS).map_err(|e| self.storage(e))?;
        self.check_partition(&topics, topic, partition)?;
        let table = match txn.open_table(partition_table(&partition_table_name(topic, partition))) {
            Ok(table) => table,
            Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(self.storage(e)),
        };
        let end = self.end_of(&table)?;
        if from >= end || max == 0 {
            return Ok(Vec::new());
        }
        let count = usize::try_from(end - from).map_or(max, |available| available.min(max));
        let mut records = Vec::with_capacity(count);
        let mut expected = from;
        for entry in table.range(from..).map_err(|e| self.storage(e))?.take(count) {
            let (key, value) = entry.map_err(|e| self.storage(e))?;
            let offset = key.value();
            let corrupt = |reason: String| LogError::Corrupt { topic: topic.to_owned(), partition, offset, reason };
            if offset != expected {
                return Err(corrupt(format!("expected offset {expected} (offsets must be dense)")));
            }
            let record = match postcard::take_from_bytes::<Record>(value.value()) {
                Ok((record, [])) => record,
                Ok((_, rest)) => return Err(corrupt(format!("{} trailing bytes", rest.len()))),
                Err(e) => return Err(corrupt(e.to_string())),
            };
            records.push(StoredRecord { offset, record });
            expected += 1;
        }
        Ok(records)
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

/// Checks a topic name against the embedded log's rules (see the module
/// documentation).
pub fn validate_topic_name(topic: &str) -> Result<(), LogError> {
    let reason = if topic.is_empty() {
        "it is empty"
    } else if topic.len() > MAX_TOPIC_NAME_LEN {
        "it is longer than 255 bytes"
    } else if !topic.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        "only ASCII letters, digits, '.', '_' and '-' are allowed"
    } else {
        return Ok(());
    };
    Err(LogError::InvalidTopicName { topic: topic.to_owned(), reason })
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::event::Header;

    fn record(i: u64) -> Record {
        Record {
            headers: vec![Header { name: "n".into(), value: i.to_le_bytes().to_vec() }],
            body: format!("body {i}").into_bytes(),
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

    #[tokio::test]
    async fn undecodable_record_is_corrupt_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.redb");
        {
            let log = EmbeddedLog::open(&path).unwrap();
            log.create_topic("t", 2).await.unwrap();
            log.append("t", vec![(1, records(0..3))]).await.unwrap();
        }
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut table = txn.open_table(partition_table("log/t/1")).unwrap();
                table.insert(1, [0xFF, 0xFF, 0xFF].as_slice()).unwrap();
                let mut trailing = postcard::to_allocvec(&record(2)).unwrap();
                trailing.push(0);
                table.insert(2, trailing.as_slice()).unwrap();
            }
            txn.commit().unwrap();
        }
        let log = EmbeddedLog::open(&path).unwrap();
        assert_eq!(log.read("t", 1, 0, 1).await.unwrap()[0].record, record(0));
        let err = log.read("t", 1, 0, 10).await.unwrap_err();
        match &err {
            LogError::Corrupt { topic, partition: 1, offset: 1, .. } if topic == "t" => {}
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().starts_with("corrupt record in `t` partition 1 at offset 1: "), "{err}");
        let err = log.read("t", 1, 2, 10).await.unwrap_err();
        assert!(matches!(err, LogError::Corrupt { offset: 2, ref reason, .. } if reason == "1 trailing bytes"), "{err}");
        // The end offset does not decode values.
        assert_eq!(log.end_offset("t", 1).await.unwrap(), 3);
    }

    #[test]
    fn a_second_open_of_the_same_file_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.redb");
        let _log = EmbeddedLog::open(&path).unwrap();
        let err = EmbeddedLog::open(&path).unwrap_err();
        assert!(matches!(err, LogError::Storage { .. }));
        assert!(err.to_string().contains("log.redb"), "{err}");
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
            key_hash: 42,
            ordering: crate::event::EventAtomicOrdering::Relaxed,
            algebra: crate::event::Algebra::NonAssociative,
        }
        .to_headers();
        let total = 1_000_000u64;
        let chunk = 65_536u64;
        let started = Instant::now();
        let mut appended = 0;
        while appended < total {
            let n = chunk.min(total - appended);
            let batch = (0..n).map(|i| Record { headers: headers.clone(), body: vec![(i % 251) as u8; 100] }).collect();
            log.append("bench", vec![(0, batch)]).await.unwrap();
            appended += n;
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
