//! A log that loses what it held, on cue: its tail (a server that lost
//! acknowledged messages), all of a topic (deleted and created again), or
//! its head (retention), for tests of what the host does about it
//! ([`crate::storage::log::loss`]).
//!
//! [`LosingLog`] serves an embedded log, and can swap it for another one
//! when a partition is first read from a given offset
//! ([`LosingLog::lose_when_read_at`]): the other log holds a prefix of the
//! first ([`copy_prefix`]), so from then on the partition's end offset is
//! lower, and appends land at the lost offsets. It reports the topic
//! identity, first offsets and durability it is told to.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::storage::log::embedded::EmbeddedLog;
use crate::storage::log::loss::Durability;
use crate::storage::log::{self, EventLog, LogError, PolledBatch, Record, StoredRecord};
use rustc_hash::FxHashMap;

/// A swap waiting for a read: when `(topic, partition)` is read from
/// `at` or later, the log becomes `log`.
struct Swap {
    topic: String,
    partition: u32,
    at: u64,
    log: EmbeddedLog,
}

/// An embedded log that loses what it held on cue (see the module docs).
pub struct LosingLog {
    current: RwLock<Arc<EmbeddedLog>>,
    swap: Mutex<Option<Swap>>,
    identity: Mutex<FxHashMap<String, String>>,
    first: Mutex<FxHashMap<(String, u32), u64>>,
    durability: Mutex<FxHashMap<String, Durability>>,
    accepts_lossy: AtomicBool,
}

impl LosingLog {
    /// Serves `log` until told otherwise.
    pub fn new(log: EmbeddedLog) -> Self {
        Self {
            current: RwLock::new(Arc::new(log)),
            swap: Mutex::default(),
            identity: Mutex::default(),
            first: Mutex::default(),
            durability: Mutex::default(),
            accepts_lossy: AtomicBool::new(false),
        }
    }

    /// The log served now.
    pub fn current(&self) -> Arc<EmbeddedLog> {
        self.current.read().unwrap().clone()
    }

    /// Serves `log` from now on.
    pub fn replace(&self, log: EmbeddedLog) {
        *self.current.write().unwrap() = Arc::new(log);
    }

    /// Serves `log` from the first read of `topic`'s `partition` at offset
    /// `at` or later on, before that read is answered.
    pub fn lose_when_read_at(&self, topic: &str, partition: u32, at: u64, log: EmbeddedLog) {
        *self.swap.lock().unwrap() = Some(Swap { topic: topic.to_owned(), partition, at, log });
    }

    /// Whether the swap [`Self::lose_when_read_at`] set up has happened.
    pub fn lost(&self) -> bool {
        self.swap.lock().unwrap().is_none()
    }

    /// Reports `identity` as `topic`'s ([`EventLog::topic_identity`]).
    pub fn set_identity(&self, topic: &str, identity: &str) {
        self.identity.lock().unwrap().insert(topic.to_owned(), identity.to_owned());
    }

    /// Reports `first` as the first offset of `topic`'s `partition`
    /// ([`EventLog::extent`]), as if retention deleted what is below it.
    pub fn set_first(&self, topic: &str, partition: u32, first: u64) {
        self.first.lock().unwrap().insert((topic.to_owned(), partition), first);
    }

    /// Reports `durability` for `topic` ([`EventLog::durability`]).
    pub fn set_durability(&self, topic: &str, durability: Durability) {
        self.durability.lock().unwrap().insert(topic.to_owned(), durability);
    }

    /// Whether to accept lossy topics ([`EventLog::accepts_lossy_topics`]).
    pub fn accept_lossy(&self, accept: bool) {
        self.accepts_lossy.store(accept, Ordering::SeqCst);
    }

    fn reading(&self, topic: &str, partition: u32, from: u64) -> Arc<EmbeddedLog> {
        let mut swap = self.swap.lock().unwrap();
        if swap.as_ref().is_some_and(|s| s.topic == topic && s.partition == partition && from >= s.at) {
            let swap = swap.take().expect("checked");
            self.replace(swap.log);
        }
        drop(swap);
        self.current()
    }
}

/// Appends to `to` the first `keep[p]` records of each partition `p` of
/// `topic` in `from` (every record of a partition `keep` does not name),
/// creating the topic with as many partitions: what a server that lost the
/// rest would hold.
pub async fn copy_prefix(from: &EmbeddedLog, to: &EmbeddedLog, topic: &str, keep: &[u64]) {
    let partitions = from.partitions(topic).await.unwrap();
    to.create_topic(topic, partitions).await.unwrap();
    for partition in 0..partitions {
        let end = from.end_offset(topic, partition).await.unwrap();
        let kept = keep.get(partition as usize).copied().unwrap_or(end).min(end);
        let records: Vec<Record> = from
            .read(topic, partition, 0, kept as usize)
            .await
            .unwrap()
            .into_iter()
            .map(|stored| stored.record)
            .collect();
        if !records.is_empty() {
            to.append(topic, vec![(partition, records)]).await.unwrap();
        }
    }
}

/// Reads and polls may swap the log first; extents, durability, lossy
/// topics and topic identities are what the log was told. There is no
/// append signal (`appends`, the trait's default rather than the embedded
/// log's, as the tests over this log were written against): a consumer
/// polls on its idle wait.
impl log::ForwardingLog for LosingLog {
    type Inner = EmbeddedLog;

    fn inner(&self) -> impl std::ops::Deref<Target = EmbeddedLog> + Send + '_ {
        self.current()
    }

    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<StoredRecord>, LogError> {
        self.reading(topic, partition, from).read(topic, partition, from, max).await
    }
    async fn poll(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        batch: PolledBatch,
    ) -> Result<PolledBatch, LogError> {
        self.reading(topic, partition, from).poll(topic, partition, from, max, batch).await
    }
    async fn extent(&self, topic: &str, partition: u32) -> Result<(u64, u64), LogError> {
        let end = EventLog::end_offset(self, topic, partition).await?;
        let first = self.first.lock().unwrap().get(&(topic.to_owned(), partition)).copied().unwrap_or(0);
        Ok((first.min(end), end))
    }
    async fn durability(&self, topic: &str) -> Result<Durability, LogError> {
        Ok(self.durability.lock().unwrap().get(topic).cloned().unwrap_or(Durability::Durable))
    }
    fn accepts_lossy_topics(&self) -> bool {
        self.accepts_lossy.load(Ordering::SeqCst)
    }
    async fn topic_identity(&self, topic: &str) -> Result<Option<String>, LogError> {
        Ok(self.identity.lock().unwrap().get(topic).cloned())
    }
    fn appends(&self) -> Option<tokio::sync::watch::Receiver<()>> {
        None
    }
}
