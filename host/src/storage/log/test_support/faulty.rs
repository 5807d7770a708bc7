//! A log (the embedded one unless told otherwise) with faults on cue, for
//! tests of what the consumer does when its log misbehaves.

use crate::storage::log::embedded::EmbeddedLog;
use crate::storage::log::loss::Durability;
use crate::storage::log::{self, EventLog, LogError, PolledBatch, Record, StoredRecord};

/// A call a [`FaultyLog`] is about to make.
#[derive(Debug, Clone, Copy)]
pub enum Call<'a> {
    /// `read` of a partition.
    Read {
        /// The topic.
        topic: &'a str,
        /// The partition.
        partition: u32,
        /// The first offset asked for.
        from: u64,
    },
    /// `append`, `append_as` or `store_consumer_offset`.
    Write {
        /// The topic.
        topic: &'a str,
    },
    /// `producer_sequence`, `end_offset`, `end_offsets` or `extent`.
    Query {
        /// The topic.
        topic: &'a str,
    },
    /// `create_topic`, `partitions`, `consumer_offset`, `durability` or
    /// `topic_identity`: never faulted.
    Setup,
    /// `forget_producer`: seen, never faulted (it cannot fail).
    Forget {
        /// The producer forgotten.
        producer: &'a str,
    },
}

/// A log, except where `fault` returns an error for a call.
pub struct FaultyLog<L = EmbeddedLog> {
    /// The log underneath, to check what reached it.
    pub log: L,
    fault: Box<dyn Fn(Call<'_>) -> Option<LogError> + Send + Sync>,
    /// Reads for which this is true find nothing, though the log holds
    /// records there: a partition that is slow, not failing.
    silent: Box<dyn Fn(Call<'_>) -> bool + Send + Sync>,
}

impl<L> FaultyLog<L> {
    /// `log`, failing each call for which `fault` returns an error.
    pub fn new(log: L, fault: impl Fn(Call<'_>) -> Option<LogError> + Send + Sync + 'static) -> Self {
        Self { log, fault: Box::new(fault), silent: Box::new(|_| false) }
    }

    /// Makes each read for which `silent` returns true find nothing (its
    /// end offsets still say what the log holds): the start-up race, a
    /// partition read late.
    pub fn with_silence(self, silent: impl Fn(Call<'_>) -> bool + Send + Sync + 'static) -> Self {
        Self { silent: Box::new(silent), ..self }
    }

    fn check(&self, call: Call<'_>) -> Result<(), LogError> {
        (self.fault)(call).map_or(Ok(()), Err)
    }
}

/// Every call but `accepts_lossy_topics`, `max_record_bytes`, `appends`
/// and the consumer-group calls passes `fault` first. Two answers are the
/// trait's defaults rather than the wrapped log's, as the tests over this
/// log were written against: `poll` goes through this log's faulty `read`,
/// and there is no append signal (`appends`), so a consumer polls on its
/// idle wait.
impl<L: EventLog> log::ForwardingLog for FaultyLog<L> {
    type Inner = L;

    fn inner(&self) -> impl std::ops::Deref<Target = L> + Send + '_ {
        &self.log
    }

    async fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), LogError> {
        self.check(Call::Setup)?;
        self.log.create_topic(topic, partitions).await
    }
    async fn partitions(&self, topic: &str) -> Result<u32, LogError> {
        self.check(Call::Setup)?;
        self.log.partitions(topic).await
    }
    async fn topics(&self) -> Result<Vec<(String, u32)>, LogError> {
        self.check(Call::Setup)?;
        self.log.topics().await
    }
    fn forget_producer(&self, producer: &str) {
        let _ = self.check(Call::Forget { producer });
        self.log.forget_producer(producer);
    }
    async fn append(&self, topic: &str, batches: Vec<(u32, Vec<Record>)>) -> Result<(), LogError> {
        self.check(Call::Write { topic })?;
        self.log.append(topic, batches).await
    }
    async fn append_as(
        &self,
        topic: &str,
        batches: Vec<(u32, Vec<Record>)>,
        producer: &str,
        sequence: u64,
    ) -> Result<bool, LogError> {
        self.check(Call::Write { topic })?;
        self.log.append_as(topic, batches, producer, sequence).await
    }
    async fn producer_sequence(
        &self,
        topic: &str,
        partition: u32,
        producer: &str,
        since: u64,
    ) -> Result<Option<u64>, LogError> {
        self.check(Call::Query { topic })?;
        self.log.producer_sequence(topic, partition, producer, since).await
    }
    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<StoredRecord>, LogError> {
        self.check(Call::Read { topic, partition, from })?;
        if (self.silent)(Call::Read { topic, partition, from }) {
            return Ok(Vec::new());
        }
        self.log.read(topic, partition, from, max).await
    }
    async fn poll(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        batch: PolledBatch,
    ) -> Result<PolledBatch, LogError> {
        log::poll_by_reading(self, topic, partition, from, max, batch).await
    }
    fn appends(&self) -> Option<tokio::sync::watch::Receiver<()>> {
        None
    }
    async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64, LogError> {
        self.check(Call::Query { topic })?;
        self.log.end_offset(topic, partition).await
    }
    async fn end_offsets(&self, topic: &str) -> Result<Vec<u64>, LogError> {
        self.check(Call::Query { topic })?;
        self.log.end_offsets(topic).await
    }
    async fn store_consumer_offset(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
        next: u64,
    ) -> Result<(), LogError> {
        self.check(Call::Write { topic })?;
        self.log.store_consumer_offset(consumer, topic, partition, next).await
    }
    async fn consumer_offset(&self, consumer: &str, topic: &str, partition: u32) -> Result<Option<u64>, LogError> {
        self.check(Call::Setup)?;
        self.log.consumer_offset(consumer, topic, partition).await
    }
    async fn offset_at(&self, topic: &str, partition: u32, time: std::time::SystemTime) -> Result<u64, LogError> {
        self.check(Call::Query { topic })?;
        self.log.offset_at(topic, partition, time).await
    }
    async fn extent(&self, topic: &str, partition: u32) -> Result<(u64, u64), LogError> {
        self.check(Call::Query { topic })?;
        self.log.extent(topic, partition).await
    }
    async fn durability(&self, topic: &str) -> Result<Durability, LogError> {
        self.check(Call::Setup)?;
        self.log.durability(topic).await
    }
    async fn topic_identity(&self, topic: &str) -> Result<Option<String>, LogError> {
        self.check(Call::Setup)?;
        self.log.topic_identity(topic).await
    }
}
