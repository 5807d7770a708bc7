//! The event log: what the host reads events from and writes routed records
//! to, behind one trait every backend implements.
//!
//! A **topic** is split into a fixed number of **partitions**; a key always
//! lives in one partition ([`crate::event::partition_for`]). The host only
//! needs a few guarantees from a backend, and [`EventLog`] states them:
//!
//! - **Total order per partition.** Records of one partition are read back
//!   in the order they were appended, by every reader, every time. Nothing
//!   is promised across partitions.
//! - **Offsets are dense from 0.** The first record of a partition has
//!   offset 0, the next 1, and so on without gaps. The
//!   [end offset](EventLog::end_offset) is the offset the next record will
//!   get, which is also the number of records in the partition. The "caught
//!   up" gate of the design compares the consumed offset with it. A log
//!   with retention (Iggy) may have deleted the oldest records: its
//!   [extent](EventLog::extent) starts above 0 then, and the end offset
//!   stays the offset the next record gets.
//! - **An acknowledged append is stored**, or the log says it may not be
//!   ([`EventLog::durability`]); a log that lost records anyway (its end
//!   offset went back) is noticed by the consumer ([`loss`]).
//! - **An append is all-or-nothing** on the embedded log: one
//!   [`append`](EventLog::append) call, across all the partitions it names,
//!   is one transaction. Either every record is stored or none is (a missing
//!   partition fails the whole call before anything is written). A networked
//!   backend may only promise this per partition; callers must not rely on
//!   more than "a failed append may be retried".
//! - **Producer stamps are found from a mark.**
//!   [`append_as`](EventLog::append_as) stamps an append with a producer and
//!   a sequence number, and [`producer_sequence`](EventLog::producer_sequence)
//!   reads the highest stamp back, so a producer that lost an answer or
//!   crashed resends only what is missing. The caller names an offset
//!   (`since`) at or below every append of its own it has not seen
//!   confirmed; the embedded log keeps stamps in a table and finds them
//!   wherever they are, a backend that keeps them in the messages (Iggy)
//!   reads from `since` on, however much was appended after it.
//! - **A failure says whether trying again can help.** An unreachable log is
//!   [`LogError::Unavailable`]; a missing topic or partition, an invalid
//!   topic name, or a record the backend will never store
//!   ([`LogError::Refused`], [`LogError::RecordTooLarge`]) fail the same
//!   way every time.
//! - **Times are found by offset.** [`offset_at`](EventLog::offset_at)
//!   answers the first offset appended at or after a time: the embedded log
//!   records append times (records appended before it did count as older
//!   than every time), Iggy polls by its messages' timestamps.
//! - **Consumer offsets are informational.** A projection's position lives in
//!   its own state, committed with its writes (see [`crate::storage::state`]); the
//!   offset stored in the log with
//!   [`store_consumer_offset`](EventLog::store_consumer_offset) is written
//!   after that commit, for tools and dashboards, and is never used to decide
//!   where to resume.
//!
//! Backends:
//! - [`EmbeddedLog`]: one redb file on this machine, the default.
//! - [`IggyLog`]: a stream of an Apache Iggy server, for production and
//!   for more than one host; `iggy_headers` is its codec between our
//!   headers and Iggy's user headers.
//!
//! A log that wraps another and changes part of what it does (a test
//! double, the inventory demo's late reads) implements [`ForwardingLog`]
//! (`forwarding`): what it does not define goes to the log it wraps.
//!
//! Files: `embedded` and `iggy` (with `iggy_headers`, its header codec,
//! `iggy_nodes`, the servers of one log or a cluster's nodes, and
//! `iggy_tls`, Iggy over TLS) are the backends; `polled` holds a
//! poll's records in one buffer; `loss` checks that the log kept what it
//! acknowledged; `forwarding` is the forwarding trait; `test_support`
//! (feature `test-support`) holds the test doubles other crates' tests use.

use std::future::Future;
use std::path::PathBuf;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use wakuwaku_core::names::NameError;

use crate::event::Header;

pub mod embedded;
pub(crate) mod forwarding;
pub mod iggy;
mod iggy_headers;
mod iggy_nodes;
pub(crate) mod iggy_tls;
pub mod loss;
pub(crate) mod polled;
#[cfg(feature = "test-support")]
pub mod test_support;

pub use embedded::EmbeddedLog;
pub use forwarding::{ForwardingLog, poll_by_reading};
pub use iggy::IggyLog;
pub use iggy_nodes::NodesError;
pub use polled::{EncodedRecord, PolledBatch, RecordView};

/// `scheme://user:password@host…` with the password replaced by `****`, for
/// messages and listings; `None` when the URL holds no credentials. The last
/// `@` ends the credentials, so a password holding `@` is masked whole.
///
/// An Iggy URL whose credentials have no `:` holds a personal access
/// token there, not a user name: it is masked whole (`iggy://****@host`).
pub fn masked_password(url: &str) -> Option<String> {
    let (scheme, at) = (url.find("://")?, url.rfind('@')?);
    (scheme < at).then(|| {
        let credentials = &url[scheme + 3..at];
        let token = url.starts_with("iggy") && !credentials.contains(':');
        match token {
            true => format!("{}****{}", &url[..scheme + 3], &url[at..]),
            false => {
                let user = credentials.split(':').next().unwrap_or_default();
                format!("{}{user}:****{}", &url[..scheme + 3], &url[at..])
            }
        }
    })
}

/// The header of the stand-in a log reads in place of a stored record it
/// will not hand over whole (one over [`embedded::MAX_RECORD_BYTES`], left
/// by an older version or written by hand): the stand-in has this header
/// alone, whose value says why, and an empty body. Its envelope is
/// unreadable, so the consumer dead-letters it with that reason
/// ([`unreadable_reason`]) and goes on; the record stays in the log at its
/// offset, which the dead letter names.
pub const UNREADABLE: &str = "waku-unreadable";

/// The prefix of the headers whose values are text (the routing context
/// headers a failure writes): a log that types its header values stores
/// them as text.
pub const TEXT_HEADER_PREFIX: &str = "waku.error.";

/// Whether `name` is a header whose value is text ([`TEXT_HEADER_PREFIX`]).
pub fn is_text_header(name: &str) -> bool {
    name.starts_with(TEXT_HEADER_PREFIX)
}

/// Why the log read a stand-in ([`UNREADABLE`]) in place of the record
/// with these headers; `None` for a record read as it was stored.
pub fn unreadable_reason<'a>(mut headers: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Option<String> {
    let (name, reason) = headers.next()?;
    (name == UNREADABLE.as_bytes() && headers.next().is_none()).then(|| String::from_utf8_lossy(reason).into_owned())
}

/// One message as the log stores it: user headers and an opaque body.
///
/// The host never decodes the body; everything it needs to plan is in the
/// headers (see [`crate::event::EventHeaders`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The user headers, in the order they were written.
    pub headers: Vec<Header>,
    /// The body, as the publisher encoded it. Encoded as a byte string
    /// (`serde_bytes`): in postcard the same bytes as a sequence of `u8`,
    /// so stored records read back unchanged, decoded with one copy.
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

impl Record {
    /// Its body's and its headers' names' and values' bytes: about what it
    /// takes to store or send (less a few bytes of lengths per header),
    /// what byte budgets count.
    pub fn byte_len(&self) -> usize {
        self.body.len() + self.headers.iter().map(|h| h.name.len() + h.value.len()).sum::<usize>()
    }
}

/// A [`Record`] read back from a partition, with the offset it was stored at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    /// The record's position in its partition (dense, from 0).
    pub offset: u64,
    /// The record itself.
    pub record: Record,
    /// When the log appended it (ms since the Unix epoch), where the log
    /// says so when reading (Iggy's message timestamp); the embedded log
    /// gives it in [`EventLog::poll`] only ([`RecordView::append_time`]).
    pub append_time: Option<i64>,
}

/// Why a log operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The log has no consumer groups (only Apache Iggy's has them).
    #[error("this log has no consumer groups (they need Apache Iggy: --iggy)")]
    NoConsumerGroups,
    /// A command that only reads named an Iggy stream the server does
    /// not hold.
    #[error("Iggy stream `{stream}` does not exist ({})", match found.is_empty() {
        true => "the server holds none yet: `waku run` or `waku publish` creates it".to_owned(),
        false => format!("the server's streams: {}", found.join(", ")),
    })]
    StreamNotFound {
        /// The stream asked for.
        stream: String,
        /// The streams the server holds, sorted.
        found: Vec<String>,
    },
    /// The topic has not been created.
    #[error("topic `{topic}` does not exist")]
    TopicNotFound {
        /// The topic asked for.
        topic: String,
    },
    /// The topic exists but has no partition with that number.
    #[error("topic `{topic}` has no partition {partition} (it has {partitions})")]
    PartitionNotFound {
        /// The topic.
        topic: String,
        /// The partition asked for.
        partition: u32,
        /// How many partitions the topic has.
        partitions: u32,
    },
    /// The topic exists with another partition count than the one asked for.
    #[error("topic `{topic}` has {existing} partitions, not {requested}")]
    PartitionCountMismatch {
        /// The topic.
        topic: String,
        /// Its partition count.
        existing: u32,
        /// The count asked for.
        requested: u32,
    },
    /// A topic cannot have this many partitions (zero, for instance).
    #[error("topic `{topic}` cannot have {requested} partitions")]
    InvalidPartitionCount {
        /// The topic.
        topic: String,
        /// The count asked for.
        requested: u32,
    },
    /// The topic name breaks the topic-name rule
    /// ([`wakuwaku_core::names::check_topic_name`]; a projection name
    /// refused by its rule reads the same, [`check_projection_name`]).
    #[error("invalid topic name {topic:?}: {reason}")]
    InvalidTopicName {
        /// The name given.
        topic: String,
        /// Which rule it breaks.
        reason: NameError,
    },
    /// The backend cannot name a stream, topic or consumer group so,
    /// though the topic-name rule may allow it (Iggy's identifiers).
    #[error("invalid topic name {name:?}: {backend} cannot name a {what} so")]
    BackendName {
        /// The name given.
        name: String,
        /// The backend refusing it.
        backend: &'static str,
        /// What the name was for: `stream`, `topic` or `group`.
        what: &'static str,
    },
    /// The backend will never store this record as it is (too large, a
    /// header it cannot represent); nothing of the append was stored on
    /// that partition. Trying again fails the same way.
    #[error("`{topic}` partition {partition} refuses the record: {reason}")]
    Refused {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// Why.
        reason: String,
    },
    /// The record is larger than the log takes
    /// ([`embedded::MAX_RECORD_BYTES`]); nothing of the append was stored.
    /// Trying again fails the same way.
    #[error(
        "`{topic}` partition {partition} refuses a record of {size} bytes: the log takes at most {limit} bytes per \
         record (headers and body)"
    )]
    RecordTooLarge {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The record's size as stored (headers, body and their lengths).
        size: usize,
        /// The most the log takes.
        limit: usize,
    },
    /// A stored record cannot be decoded.
    #[error("corrupt record in `{topic}` partition {partition} at offset {offset}: {reason}")]
    Corrupt {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The record's offset.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// The directory that holds the log file could not be created.
    #[error("cannot create the directory of `{}`", path.display())]
    Io {
        /// The log file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is damaged: changed on disk since it was written (checked
    /// in full when opened), or cut short.
    #[error("`{}` is damaged ({reason}); restore it from a backup", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Another process has the file open (a `waku run`, or another command
    /// on the same data directory): one process at a time.
    #[error("`{}` is in use by another process", path.display())]
    InUse {
        /// The file.
        path: PathBuf,
    },
    /// The TLS handshake with the log server was refused: its certificate
    /// did not pass the checks, or it speaks no TLS ([`iggy_tls`]).
    /// Trying again fails the same way until a setting changes.
    #[error("`{address}`: TLS refused: {reason}")]
    Tls {
        /// The server's address, its URL's password masked.
        address: String,
        /// Why, in plain words.
        reason: String,
    },
    /// The storage engine failed (I/O error, ...).
    #[error("log storage failed on `{}`", path.display())]
    Storage {
        /// The file (or, for a networked backend, the address) concerned.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The addresses of an Iggy cluster cannot be used.
    #[error(transparent)]
    Nodes(#[from] NodesError),
    /// The log cannot be reached right now (a server went away, a
    /// connection dropped); trying again later may succeed. The consumer
    /// retries these with a backoff instead of stopping.
    #[error("the log at `{}` is unavailable: {reason}", address.display())]
    Unavailable {
        /// The server's address (without credentials).
        address: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A topic the host appends to can lose acknowledged appends when the
    /// log's server crashes ([`loss::require_durable`]).
    #[error(
        "topic `{topic}` ({role}) can lose acknowledged appends when the log server crashes ({setting}), and losing \
         a record there loses its events: {}",
        loss::HOW_TO_MAKE_DURABLE
    )]
    LossyTopic {
        /// The topic.
        topic: String,
        /// What the host uses it for.
        role: loss::TopicRole,
        /// The setting that makes it lossy, as the log names it.
        setting: String,
    },
    /// The operation was cancelled before it ran, because the runtime is
    /// shutting down.
    #[error("log operation cancelled (runtime shutting down)")]
    Cancelled,
}

/// Checks `topic` against core's topic-name rule
/// ([`wakuwaku_core::names::check_topic_name`]), as the log's error.
pub fn check_topic_name(topic: &str) -> Result<(), LogError> {
    wakuwaku_core::names::check_topic_name(topic)
        .map_err(|reason| LogError::InvalidTopicName { topic: topic.to_owned(), reason })
}

/// Checks `projection` against core's projection-name rule
/// ([`wakuwaku_core::names::check_projection_name`]). A refusal reads as a
/// topic name's ([`LogError::InvalidTopicName`]), as it always has: the
/// rules are the same today.
pub fn check_projection_name(projection: &str) -> Result<(), LogError> {
    wakuwaku_core::names::check_projection_name(projection)
        .map_err(|reason| LogError::InvalidTopicName { topic: projection.to_owned(), reason })
}

/// A partitioned, append-only event log.
///
/// Every method is asynchronous and cheap to call from a tokio task; a
/// backend that blocks does so off the executor. See the
/// [module documentation](self) for the guarantees an implementation keeps.
pub trait EventLog: Send + Sync + 'static {
    /// Creates the topic with `partitions` partitions, or checks an existing
    /// one has that many ([`LogError::PartitionCountMismatch`] if not).
    ///
    /// Idempotent: creating an existing topic with its own count is a no-op.
    fn create_topic(&self, topic: &str, partitions: u32) -> impl Future<Output = Result<(), LogError>> + Send;

    /// The number of partitions of a topic.
    fn partitions(&self, topic: &str) -> impl Future<Output = Result<u32, LogError>> + Send;

    /// Every topic of the log with its partition count, sorted by name
    /// (the host's own `retry_…` and `dlq_…` topics among them).
    fn topics(&self) -> impl Future<Output = Result<Vec<(String, u32)>, LogError>> + Send;

    /// Appends records to several partitions of one topic, each batch after
    /// the records already in its partition, in the order given.
    ///
    /// Embedded: one transaction for the whole call, so either all records
    /// are stored or none. A partition may appear more than once; its
    /// batches are appended in order.
    fn append(
        &self,
        topic: &str,
        batches: Vec<(u32, Vec<Record>)>,
    ) -> impl Future<Output = Result<(), LogError>> + Send;

    /// [`EventLog::append`] as `producer`, stamped with `sequence`: each
    /// partition of the call stores its records and remembers the sequence
    /// number for this producer together, and a partition whose remembered
    /// number is already at or above `sequence` appends nothing. Returns
    /// whether anything was appended. A producer that retries after a crash
    /// or a lost answer therefore never appends the same records twice, even
    /// where an earlier try reached only some partitions.
    ///
    /// A networked backend sends each partition's records in one request,
    /// so callers keep them small (the outbox sends at most
    /// [`crate::engine::outbox::STAMPED_APPEND_RECORDS`] records and
    /// [`crate::engine::outbox::STAMPED_APPEND_BYTES`] per append). A backend that
    /// finds stamps by reading (Iggy) reads the whole partition when it knows
    /// nothing of the producer there yet; callers ask
    /// [`EventLog::producer_sequence`] first, with their mark.
    fn append_as(
        &self,
        topic: &str,
        batches: Vec<(u32, Vec<Record>)>,
        producer: &str,
        sequence: u64,
    ) -> impl Future<Output = Result<bool, LogError>> + Send;

    /// The highest sequence number `producer` appended to a partition with
    /// [`EventLog::append_as`], if any, looking no further back than offset
    /// `since`.
    ///
    /// The caller promises that every append of `producer` it has not seen
    /// confirmed lies at or after `since` (the outbox records the
    /// partition's end offset before its first append there, see
    /// [`crate::engine::outbox`]); stamps below it belong to appends it knows about.
    /// A backend that remembers stamps exactly (embedded) may answer from
    /// before `since`: a higher stamp is still a true one. A `since` past the
    /// end (the topic was deleted and created again) finds nothing.
    fn producer_sequence(
        &self,
        topic: &str,
        partition: u32,
        producer: &str,
        since: u64,
    ) -> impl Future<Output = Result<Option<u64>, LogError>> + Send;

    /// Up to `max` records from offset `from` on, in offset order.
    ///
    /// Empty when `from` is at or past the end offset, or `max` is zero.
    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
    ) -> impl Future<Output = Result<Vec<StoredRecord>, LogError>> + Send;

    /// [`EventLog::read`] into one [`PolledBatch`]: the same records, held
    /// in one buffer instead of one allocation per header and body. What
    /// the consumer polls with.
    ///
    /// `batch` is emptied and filled: pass the one the previous poll
    /// returned, so its buffers are reused instead of grown again. A poll
    /// takes at most `max` records and stops early once the batch
    /// [is full](PolledBatch::is_full) (its byte budget). The default reads
    /// owned records and packs them ([`poll_by_reading`]); a backend that
    /// stores records encoded (embedded) copies them in without decoding.
    fn poll(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        batch: PolledBatch,
    ) -> impl Future<Output = Result<PolledBatch, LogError>> + Send {
        poll_by_reading(self, topic, partition, from, max, batch)
    }

    /// The most one record of `topic` may hold as stored (postcard:
    /// headers, body and their lengths), when the log has such a limit of
    /// its own: a larger record is [`LogError::RecordTooLarge`]. `None`
    /// (the default): the backend refuses what it cannot store by its own
    /// rules ([`LogError::Refused`]). Lets a publisher name the event that
    /// is too large before appending anything.
    fn max_record_bytes(&self, topic: &str) -> Option<usize> {
        let _ = topic;
        None
    }

    /// A signal that changes after records are appended, so that a
    /// consumer that found nothing new polls again at once instead of
    /// after its idle wait. `None` (the default): this log cannot tell
    /// (another process may append), and consumers poll every idle wait.
    fn appends(&self) -> Option<tokio::sync::watch::Receiver<()>> {
        None
    }

    /// Forgets what this client remembers of `producer`'s stamps, so that
    /// [`EventLog::producer_sequence`] and [`EventLog::append_as`] read them
    /// from the log again: another process may have appended as
    /// `producer` since (a partition's outbox producer moves with the
    /// partition between hosts). A no-op for a log that keeps no such
    /// memory (the default).
    fn forget_producer(&self, _producer: &str) {}

    /// The offset the next record of the partition will get: the number of
    /// records in it.
    fn end_offset(&self, topic: &str, partition: u32) -> impl Future<Output = Result<u64, LogError>> + Send;

    /// The end offset of every partition of a topic, in partition order (so
    /// its length is the partition count), read at once.
    fn end_offsets(&self, topic: &str) -> impl Future<Output = Result<Vec<u64>, LogError>> + Send;

    /// A partition's first offset and its end offset: the offsets it holds
    /// are `first..end`. Above 0 when retention deleted the oldest messages
    /// ([`loss::lost_history`]). The default (a log without retention, the
    /// embedded one): 0 and [`EventLog::end_offset`].
    fn extent(&self, topic: &str, partition: u32) -> impl Future<Output = Result<(u64, u64), LogError>> + Send {
        async move { Ok((0, self.end_offset(topic, partition).await?)) }
    }

    /// Whether an append this log acknowledged to `topic` survives a crash
    /// of its server ([`loss::Durability`]). The default (the embedded
    /// log, which commits each append durably): durable.
    fn durability(&self, topic: &str) -> impl Future<Output = Result<loss::Durability, LogError>> + Send {
        let _ = topic;
        async { Ok(loss::Durability::Durable) }
    }

    /// Whether this log was opened accepting topics that may lose
    /// acknowledged appends (`--lossy-topics`): [`loss::require_durable`]
    /// then warns instead of refusing. Default `false`.
    fn accepts_lossy_topics(&self) -> bool {
        false
    }

    /// What tells this incarnation of `topic` from one deleted and created
    /// again under the same name (Iggy: its id and creation time), so a
    /// projection's positions are never taken for positions in a new topic
    /// ([`loss::check_identity`]). `None` (the default): topics of this
    /// log are never created again under a name (the embedded log deletes
    /// none).
    fn topic_identity(&self, topic: &str) -> impl Future<Output = Result<Option<String>, LogError>> + Send {
        let _ = topic;
        async { Ok(None) }
    }

    /// Records that `consumer` will next read offset `next` of a partition.
    ///
    /// Informational only: the projection's state holds the position it
    /// resumes from.
    fn store_consumer_offset(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
        next: u64,
    ) -> impl Future<Output = Result<(), LogError>> + Send;

    /// The offset last stored for `consumer` on a partition, if any.
    fn consumer_offset(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
    ) -> impl Future<Output = Result<Option<u64>, LogError>> + Send;

    /// The offset of the first record of a partition appended at or after
    /// `time`; the end offset when none was (`waku reset --to time:…`).
    fn offset_at(
        &self,
        topic: &str,
        partition: u32,
        time: SystemTime,
    ) -> impl Future<Output = Result<u64, LogError>> + Send;

    /// The partitions of `topic` that consumer group `group` assigns to this
    /// connection now, joining the group (created if missing) when this
    /// connection is not a member: membership belongs to the connection, so
    /// after a reconnect the next call joins again. Logs without consumer
    /// groups answer [`LogError::NoConsumerGroups`].
    fn group_partitions(&self, topic: &str, group: &str) -> impl Future<Output = Result<Vec<u32>, LogError>> + Send {
        let _ = (topic, group);
        async { Err(LogError::NoConsumerGroups) }
    }

    /// Leaves consumer group `group` of `topic` on this connection, so the
    /// server hands this member's partitions to the others now rather than
    /// when the connection closes. Not being a member is no error; logs
    /// without consumer groups answer [`LogError::NoConsumerGroups`].
    fn leave_group(&self, topic: &str, group: &str) -> impl Future<Output = Result<(), LogError>> + Send {
        let _ = (topic, group);
        async { Err(LogError::NoConsumerGroups) }
    }

    /// The servers behind the log, which one leads and how often the log
    /// moved between them, for `/status` and `waku status`; `None` (the
    /// default) for a log that is one process (the embedded log, one Iggy
    /// server).
    fn nodes(&self) -> impl Future<Output = Result<Option<LogNodes>, LogError>> + Send {
        async { Ok(None) }
    }

    /// How many times the log moved to another of its servers after a
    /// session with one broke (an Iggy cluster's failovers); 0 (the
    /// default) for a log of one process.
    fn failovers(&self) -> u64 {
        0
    }
}

/// The nodes of a replicated log as its leader describes them
/// ([`EventLog::nodes`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogNodes {
    /// Every node of the roster.
    pub nodes: Vec<LogNode>,
    /// The address (`host:port`) this host's connection dialled last.
    pub connected: String,
    /// How many times this host moved to another node after a session
    /// broke.
    pub failovers: u64,
}

/// One node of a replicated log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogNode {
    /// Its name in the roster.
    pub name: String,
    /// Its client address (`host:port`).
    pub address: String,
    /// Whether it leads (takes the appends).
    pub leader: bool,
    /// Its status as the roster says (`healthy`, `unreachable`, …).
    pub status: String,
}

/// Appends a record read from `topic`'s `partition` to a polled batch; one
/// that cannot be packed is [`LogError::Corrupt`] at its offset.
fn push_stored(batch: &mut PolledBatch, topic: &str, partition: u32, stored: &StoredRecord) -> Result<(), LogError> {
    batch.push(stored.offset, &stored.record).map_err(|reason| LogError::Corrupt {
        topic: topic.to_owned(),
        partition,
        offset: stored.offset,
        reason,
    })?;
    batch.stamp_last(stored.append_time);
    Ok(())
}

/// Either backend, chosen at run time (the command line's `--iggy`); each
/// call goes to the one it holds (`forwarding`).
pub enum AnyLog {
    /// The embedded log.
    Embedded(EmbeddedLog),
    /// An Iggy server.
    Iggy(IggyLog),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape records had when their bytes were sequences of `u8`.
    #[derive(Serialize)]
    struct SequenceHeader {
        name: String,
        value: Vec<u8>,
    }

    #[derive(Serialize)]
    struct SequenceRecord {
        headers: Vec<SequenceHeader>,
        body: Vec<u8>,
    }

    #[test]
    fn passwords_are_masked_whole() {
        assert_eq!(masked_password("iggy://iggy:secret@127.0.0.1:8090").unwrap(), "iggy://iggy:****@127.0.0.1:8090");
        assert_eq!(masked_password("iggy://u:p@ss@host:1").unwrap(), "iggy://u:****@host:1");
        assert_eq!(masked_password("postgres://waku@db/state").unwrap(), "postgres://waku:****@db/state");
        assert_eq!(masked_password("iggy://127.0.0.1:8090"), None);
        assert_eq!(masked_password("iggy://personal-token@127.0.0.1:8090").unwrap(), "iggy://****@127.0.0.1:8090");
        assert_eq!(masked_password("iggy+tcp://tok@h:1?tls=true").unwrap(), "iggy+tcp://****@h:1?tls=true");
        assert_eq!(masked_password("host=db password=x@y"), None);
    }

    #[test]
    fn stored_records_keep_their_bytes_with_byte_strings() {
        let body: Vec<u8> = (0..=255).chain(0..200).collect();
        let value = vec![0, 1, 127, 128, 255];
        let record =
            Record { headers: vec![Header { name: "waku-key".into(), value: value.clone() }], body: body.clone() };
        let before = SequenceRecord { headers: vec![SequenceHeader { name: "waku-key".into(), value }], body };
        let stored = postcard::to_allocvec(&before).unwrap();
        assert_eq!(postcard::to_allocvec(&record).unwrap(), stored);
        assert_eq!(postcard::from_bytes::<Record>(&stored).unwrap(), record);
    }
}
