//! Apache Iggy as the log: a stream of an Iggy server, its topics and
//! partitions, over the `iggy` client crate.
//!
//! The connection is the URL's (`iggy://user:password@host:port?options`),
//! over TLS with the client's own options (`tls=true&tls_ca_file=…&tls_domain=…`;
//! [`super::iggy_tls`] says how they are read and how a refusal is
//! explained, as [`LogError::Tls`]).
//!
//! **A cluster** is named by several addresses in one URL
//! (`iggy://user:password@a:8090,b:8090,c:8090`, rules in `iggy_nodes`):
//! - The log dials every node at once, each within [`NODE_TIMEOUT`], asks
//!   each which node leads, and uses only the node a majority of the
//!   roster names: a follower may answer from an old view or serve reads
//!   behind the leader's, followers name a dead leader for a heartbeat's
//!   time, and a restarted node may name itself from its old view.
//! - When the session breaks (the node died, stopped or was cut off), the
//!   next call fails over the same way, and never redials a node inside a
//!   call (the client's own redial is off for a cluster). The move is
//!   logged (old node, new node, how long since the session broke) and
//!   counted ([`EventLog::failovers`]); while no node answers as part of a
//!   majority, it says so once and the caller waits with its own backoff
//!   ([`LogError::Unavailable`]).
//! - For [`SETTLING`] after a failover, an answer that contradicts what the
//!   log held (a topic missing, a response that does not parse) is taken
//!   for a node still recovering or cut off mid-answer: the call fails as
//!   an outage and is made again on a fresh session. A response cut short
//!   is taken so at any time.
//! - Nothing else changes with a failover: positions are the state
//!   store's; a consumer group is deleted once and joined again by the
//!   next [`EventLog::group_partitions`] on the new connection (so the
//!   group forgets sessions of a dead node, which Iggy never logs out);
//!   and an append whose answer was lost is resent only after its stamp
//!   was looked for ([`EventLog::append_as`]), now on the new leader.
//! - [`EventLog::nodes`] reads the roster (names, addresses, roles, health)
//!   for `/status` and `waku status`.
//!
//! How the [`EventLog`] promises map onto Iggy:
//! - **Topics live in one stream**, named when connecting
//!   ([`IggyLog::connect`]); the stream is created if it does not exist.
//! - **Partitions are addressed explicitly.** Iggy numbers partitions from
//!   0, like this crate; every append names its partition
//!   ([`crate::event::partition_for`] picked it), so both backends agree on
//!   where a key lives.
//! - **Topics the host creates are durable** unless the log was opened with
//!   lossy topics ([`IggyLog::with_lossy_topics`], `--lossy-topics`). Iggy
//!   decides per topic, when the topic is created, when an acknowledged
//!   message reaches the disk: the server's default keeps up to 1 024
//!   messages (or 1 MiB) in memory before writing them and never fsyncs,
//!   so a server killed (SIGKILL, a crash) loses messages it acknowledged.
//!   The host creates every topic (its consumed topic with
//!   `--create-topic` or `publish --partitions`, retry and dead-letter
//!   topics, emit topics, a rebuild's) with `messages_required_to_save =
//!   1` (each acknowledged batch is written before the answer) and
//!   `enforce_fsync = true` (and flushed to the disk), no message expiry
//!   and no maximum size. Iggy cannot change these on an existing topic.
//! - **Durability is read from the topic's options**
//!   ([`EventLog::durability`]): the server reports, with a topic's
//!   details, the options it was created with, those the client chose and
//!   those filled in from the server's configuration alike. A topic is
//!   durable when both `enforce_fsync` is true and `messages_required_to_save`
//!   is 1; a server that reports neither is of unknown durability.
//! - **End offsets come from the last offset.** Iggy's `current_offset` is
//!   the offset of the last message and is also 0 for an empty partition;
//!   the message count tells them apart. A partition holding messages ends
//!   after its last one; retention deletes the oldest messages (whole
//!   segments) and lowers the count, so the first offset still held
//!   ([`EventLog::extent`]) is the end minus the count. A partition whose
//!   messages all expired ends after its last offset and holds none.
//! - **A topic's identity** ([`EventLog::topic_identity`]) is its numeric
//!   id and creation time: a topic deleted and created again under the
//!   same name has another.
//! - **Records round-trip exactly** (body, and headers as a set by name:
//!   Iggy keeps no header order and one value per name). Headers are Iggy
//!   user headers: the tag travels as a typed `u32` value, everything else
//!   (the key's canonical bytes too) as raw bytes. Iggy refuses empty values, values
//!   over 255 bytes and empty bodies, so the host encodes around them:
//!   - a header's key is its name with every `~` doubled; a value over 255
//!     bytes is split over the keys `name`, `name~1`, `name~2`, … and an
//!     empty one is stored as `name~empty` (a lone `~` always starts such a
//!     suffix, so no name can pose as another's piece);
//!   - an empty body is stored as the one byte `0` with the header
//!     `~no-body` (no header name encodes to it), and read back empty.
//!
//!   A header name longer than 255 bytes once encoded, headers over Iggy's
//!   100 kB, or a body over 64 MB are [`LogError::Refused`], as are the
//!   server's own refusals of a message.
//!
//!   The header codec is `iggy_headers`, pure functions over Iggy's header
//!   types that keep these rules; this file is the client.
//! - **Appends are per partition and per request.** Iggy stores a request
//!   whole or not at all, but a call that fails part-way may have reached
//!   some partitions, and plain appends go 1 000 messages per request.
//!   [`EventLog::append_as`] therefore sends each partition's records in one
//!   request, stamps every message with its producer and sequence number
//!   (headers `waku-producer` and `waku-sequence`) and a deterministic
//!   message id, and [`EventLog::producer_sequence`] reads the stamp back
//!   from the end of the partition down to the caller's `since` offset,
//!   stopping at the first chunk that holds one (a producer's stamps rise
//!   with the offset), once per producer and partition; after that the
//!   client remembers what it appended, until told to forget the producer
//!   ([`EventLog::forget_producer`]: a host taking a partition does, since
//!   the partition's previous host appended under its producer name). So
//!   a retry completes the partitions the first try missed and skips the
//!   others, whatever was appended after the stamp. Retention that deletes messages a producer has not seen
//!   confirmed defeats this (as it defeats end offsets, which are message
//!   counts): keep retry, dead-letter and emitted topics' messages at least
//!   until the hosts writing them have confirmed them.
//! - **Every message has a deterministic id.** Stamped ones from the
//!   producer, partition, sequence and index (the same for any client that
//!   resends them); plain ones from this client, the append call, the
//!   partition and the index, so a request the client replays after a
//!   reconnect carries the same ids.
//! - **Reads poll ahead.** A read that goes on where the partition's last
//!   read ended and comes back full starts polling the range after it (as
//!   many records, within the same byte budget) in the background, so a
//!   consumer's next batch is on its way while it handles this one. That
//!   holds at most one read's records per partition besides what the
//!   reader holds. A read elsewhere in the partition drops it; a
//!   read-ahead that failed is forgotten and the read polls itself,
//!   meeting the failure; one that came back short (the partition's end
//!   then) is completed by a poll, so appends made since are seen. Headers
//!   are decoded straight from the message bytes, with the checks of the
//!   client's own decoding.
//! - **Fetches are sized in bytes.** A poll ([`EventLog::poll`]) stops once
//!   its records hold the batch's byte budget, and each request to the
//!   server asks for no more messages than the budget left can hold at the
//!   partition's largest recent message size (at most 4 096; 1 while
//!   nothing is known of the partition, since Iggy takes messages of up to
//!   64 MB; at least 1, so a message over the budget is still read, alone).
//!   So small messages go 4 096 per request, and a partition of large
//!   ones is fetched a few at a time instead of thousands at once. The
//!   size is learned from what was fetched: a request whose messages are
//!   all far larger than any recent one can still bring up to its count
//!   of them; the next request is sized by them.
//! - **Unreadable headers are a header error.** The client answers a
//!   malformed header block with "no headers"; the record then has none, and
//!   the consumer dead-letters it for its missing envelope.
//! - **Consumer groups assign partitions** ([`EventLog::group_partitions`]):
//!   the host joins the group (created if missing) and asks which
//!   partitions its member holds, found by this connection's client id.
//!   Membership belongs to the connection: the server drops a member whose
//!   connection closes (a host that dies) and shares its partitions out
//!   again, and after a reconnect the next call joins again. Reads stay
//!   plain offset reads; what keeps two hosts from both applying a
//!   partition is the state store's fencing, not the group.
//! - **Errors carry codes, not text** over TCP: they are matched by variant.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use iggy::prelude::{
    Client, ClusterClient, Consumer, ConsumerGroupClient, ConsumerOffsetClient, Identifier, IggyClient, IggyError,
    IggyExpiry, IggyMessage, IggyTimestamp, MaxTopicSize, MessageClient, Partitioning, PollingStrategy, StreamClient,
    TopicClient, TopicCreateOptions,
};
use rustc_hash::FxHashMap;

use super::iggy_headers::{HeaderRefusal, decode_headers, encode_headers, put_raw};
use super::iggy_nodes::Nodes;
use super::loss::Durability;
use super::{EventLog, LogError, LogNode, LogNodes, PolledBatch, Record, StoredRecord, push_stored};
use crate::event::Header;

/// The header naming the producer of an [`EventLog::append_as`].
const PRODUCER: &str = "waku-producer";
/// The header holding the sequence number of an [`EventLog::append_as`].
const SEQUENCE: &str = "waku-sequence";
/// Most messages per plain send, and per read when looking for stamps.
const CHUNK: usize = 1000;
/// Most messages per poll request.
const POLL: usize = 4096;
/// How long dialling one node of a cluster may take, signing in and
/// waiting out an election included (the client waits up to 5 s for a
/// cluster without a leader before it stays on the node it reached).
pub const NODE_TIMEOUT: Duration = Duration::from_secs(8);
/// How long after a failover the cluster counts as settling: an answer
/// that contradicts what the log held is then taken for the node's, and
/// the call made again ([`IggyLog`]'s `answered`). Nodes seen answering
/// so: a restarted node that says a topic does not exist, a node killed
/// while it answered a poll (a body cut short).
const SETTLING: Duration = Duration::from_secs(30);

/// An Iggy server's stream, as a log.
pub struct IggyLog {
    /// The connection; replaced by a fresh one after the session broke.
    client: tokio::sync::RwLock<Arc<IggyClient>>,
    /// Set when an error showed the session is gone.
    broken: AtomicBool,
    /// The servers and the failovers between them. Boxed, as `url` was,
    /// to keep [`super::AnyLog`]'s variants of similar size.
    cluster: Box<Cluster>,
    stream: Identifier,
    address: PathBuf,
    /// The last sequence each producer stamped on a partition, as read from
    /// the partition once and then as appended by this client. A producer
    /// name is used by one process at a time; one that moves to another
    /// process and back is forgotten when it comes back
    /// ([`EventLog::forget_producer`]).
    stamps: std::sync::Mutex<FxHashMap<(String, u32, String), Option<u64>>>,
    /// Names this client in the ids of plain appends' messages.
    client_id: u64,
    /// Plain appends made so far, numbering them in message ids.
    appends: AtomicU64,
    /// Per topic and partition, where the last read ended, and the poll of
    /// the range after it when it was started ahead. Boxed, as `url` is,
    /// to keep [`super::AnyLog`]'s variants of similar size.
    reading: Box<std::sync::Mutex<FxHashMap<(String, u32), ReadAhead>>>,
    /// Whether topics are created with the server's defaults (which may
    /// lose acknowledged messages) instead of durable, and topics that may
    /// lose them are accepted ([`IggyLog::with_lossy_topics`]).
    lossy_topics: bool,
}

/// The servers of a log, which one the client dialled, and the outage
/// under way.
struct Cluster {
    /// One server, or a cluster's nodes.
    nodes: Nodes,
    /// The node the client dialled last (round the roster from there on a
    /// failover).
    node: AtomicUsize,
    /// The outage under way: when the session was found broken, and
    /// whether "no node answers" was said for it.
    outage: std::sync::Mutex<Option<(Instant, bool)>>,
    /// Failovers so far ([`EventLog::failovers`]).
    failovers: AtomicU64,
    /// Until when the cluster counts as settling after a failover
    /// ([`SETTLING`]).
    settling: std::sync::Mutex<Option<Instant>>,
    /// Per consumer group (topic, group), the failover count when this
    /// client last made the group afresh ([`EventLog::group_partitions`]).
    regrouped: std::sync::Mutex<FxHashMap<(String, String), u64>>,
}

/// Where a partition's last read ended, what it learned of the partition's
/// message sizes, and maybe the poll of what a reader that goes on from
/// there will ask for next.
struct ReadAhead {
    /// The offset after the last record read.
    from: u64,
    /// The byte budget of the last read; a read-ahead serves only a read
    /// with the same budget.
    budget: usize,
    /// What the next fetch of the partition expects its largest message to
    /// hold ([`next_estimate`]); `None` before any message was seen.
    largest: Option<usize>,
    /// The poll from `from` on, as many records and bytes as the last read
    /// asked for, started when that read was one of a sequence and came
    /// back full.
    poll: Option<tokio::task::JoinHandle<Result<Polled, IggyError>>>,
}

/// Records polled from a partition, with their size and what the polls
/// learned of the partition's message sizes.
#[derive(Default)]
struct Polled {
    records: Vec<StoredRecord>,
    /// Their [`Record::byte_len`]s, summed.
    bytes: usize,
    /// The estimate for the next fetch ([`next_estimate`]).
    largest: Option<usize>,
}

impl Drop for IggyLog {
    fn drop(&mut self) {
        let reading = self.reading.get_mut().unwrap_or_else(|e| e.into_inner());
        for poll in reading.drain().filter_map(|(_, ahead)| ahead.poll) {
            poll.abort();
        }
    }
}

impl IggyLog {
    /// Connects to the server at `url` (`iggy://user:password@host:port`,
    /// with the client's options such as `?reconnection_interval=2s`) and
    /// uses `stream`, creating it if it does not exist.
    ///
    /// The client gives up a lost connection after 3 tries unless the URL
    /// sets `reconnection_retries` (see `iggy_nodes`); the
    /// consumer keeps trying after that, with its own backoff, and reports
    /// the outage.
    pub async fn connect(url: &str, stream: &str) -> Result<Self, LogError> {
        Self::connect_as(url, stream, true).await
    }

    /// [`connect`](Self::connect) for a command that only reads: a stream
    /// that does not exist is [`LogError::StreamNotFound`], never created.
    pub async fn connect_existing(url: &str, stream: &str) -> Result<Self, LogError> {
        Self::connect_as(url, stream, false).await
    }

    async fn connect_as(url: &str, stream: &str, create: bool) -> Result<Self, LogError> {
        let address = PathBuf::from(crate::storage::log::masked_password(url).unwrap_or_else(|| url.to_owned()));
        let nodes = Nodes::parse(url)?;
        let failed = |e: IggyError| match e {
            IggyError::InvalidConnectionString | IggyError::InvalidNumberValue => storage(
                &address,
                "connecting (the URL must read iggy://user:password@host:port, optionally followed by \
                 ?option=value&… with the Iggy client's options)",
                e,
            ),
            e => storage(&address, "connecting", e),
        };
        let (client, node) = match nodes.is_cluster() {
            false => match new_client(nodes.url(0)).await {
                Ok(client) => (client, 0),
                Err(error) => return Err(explained(nodes.url(0), &address, error, failed).await),
            },
            true => match first_answering(&nodes, nodes.after(nodes.len() - 1)).await {
                Ok(found) => found,
                Err(unanswered) => {
                    let error = IggyError::CannotEstablishConnection;
                    return Err(match explained(nodes.url(0), &address, error, failed).await {
                        tls @ LogError::Tls { .. } => tls,
                        _ => no_majority(&address, &unanswered),
                    });
                }
            },
        };
        let stream_id = Identifier::named(stream).map_err(|_| LogError::BackendName {
            name: stream.to_owned(),
            backend: "Iggy",
            what: "stream",
        })?;
        if client.get_stream(&stream_id).await.map_err(failed)?.is_none() {
            if !create {
                let mut found: Vec<String> =
                    client.get_streams().await.map_err(failed)?.into_iter().map(|stream| stream.name).collect();
                found.sort();
                return Err(LogError::StreamNotFound { stream: stream.to_owned(), found });
            }
            match client.create_stream(stream).await {
                Ok(_) | Err(IggyError::StreamNameAlreadyExists(_)) => {}
                Err(e) => return Err(failed(e)),
            }
        }
        Ok(Self {
            client: tokio::sync::RwLock::new(Arc::new(client)),
            broken: AtomicBool::new(false),
            cluster: Box::new(Cluster {
                nodes,
                node: AtomicUsize::new(node),
                outage: Default::default(),
                failovers: AtomicU64::new(0),
                settling: Default::default(),
                regrouped: Default::default(),
            }),
            stream: stream_id,
            address,
            stamps: Default::default(),
            client_id: rand::random(),
            appends: AtomicU64::new(0),
            reading: Default::default(),
            lossy_topics: false,
        })
    }

    /// With `lossy`, creates topics with the server's defaults instead of
    /// durable ones (faster appends; a server crash loses what it had not
    /// written yet) and accepts appending to topics that may lose
    /// acknowledged messages ([`EventLog::accepts_lossy_topics`]), saying
    /// so in a warning. Default: durable topics, lossy ones refused where
    /// the host appends.
    pub fn with_lossy_topics(mut self, lossy: bool) -> Self {
        self.lossy_topics = lossy;
        self
    }
}

/// The options the host creates a topic of `partitions` partitions with:
/// durable unless `lossy` ([`IggyLog::with_lossy_topics`]).
fn topic_options(partitions: u32, lossy: bool) -> TopicCreateOptions {
    let options = TopicCreateOptions { partitions_count: Some(partitions), ..TopicCreateOptions::default() };
    match lossy {
        true => options,
        false => TopicCreateOptions {
            message_expiry: Some(IggyExpiry::NeverExpire),
            max_topic_size: Some(MaxTopicSize::Unlimited),
            enforce_fsync: Some(true),
            messages_required_to_save: Some(1),
            ..options
        },
    }
}

impl IggyLog {
    /// The client, reconnected first if the last error showed the session
    /// is gone (a restarted server does not know it; the old client cannot
    /// bind a new one).
    async fn client(&self) -> Result<Arc<IggyClient>, LogError> {
        if self.broken.load(Ordering::SeqCst) {
            let mut client = self.client.write().await;
            if self.broken.load(Ordering::SeqCst) {
                let fresh = match self.cluster.nodes.is_cluster() {
                    false => {
                        new_client(self.cluster.nodes.url(0)).await.map_err(|e| self.storage("reconnecting", e))?
                    }
                    true => self.fail_over().await?,
                };
                // The old session's node may be gone: its goodbye is not
                // waited for.
                let _ = tokio::time::timeout(Duration::from_millis(100), client.disconnect()).await;
                *client = Arc::new(fresh);
                self.broken.store(false, Ordering::SeqCst);
                *self.cluster.outage.lock().unwrap_or_else(|e| e.into_inner()) = None;
            }
        }
        Ok(self.client.read().await.clone())
    }

    /// A client on a live node of the cluster, dialled round the roster
    /// from the node after the one that failed; the move logged and
    /// counted. While no node answers, says so once per outage.
    async fn fail_over(&self) -> Result<IggyClient, LogError> {
        let failed = self.cluster.node.load(Ordering::SeqCst);
        match first_answering(&self.cluster.nodes, self.cluster.nodes.after(failed)).await {
            Ok((client, node)) => {
                self.cluster.node.store(node, Ordering::SeqCst);
                self.cluster.failovers.fetch_add(1, Ordering::Relaxed);
                // Failovers while it settles do not prolong it: a node
                // that answers nonsense for good is reported in the end.
                {
                    let mut settling = self.cluster.settling.lock().unwrap_or_else(|e| e.into_inner());
                    if settling.is_none_or(|until| until <= Instant::now()) {
                        *settling = Some(Instant::now() + SETTLING);
                    }
                }
                let since = self.cluster.outage.lock().unwrap_or_else(|e| e.into_inner()).map(|(since, _)| since);
                let took = since.map_or(Duration::ZERO, |since| since.elapsed());
                // The node is the one a majority named as leader: no need
                // to ask it again.
                tracing::warn!(
                    from = self.cluster.nodes.address(failed),
                    to = self.cluster.nodes.address(node),
                    "the Iggy cluster's node {} failed; failed over to the leader, {}, {:.1} s after the session \
                     broke",
                    self.cluster.nodes.address(failed),
                    self.cluster.nodes.address(node),
                    took.as_secs_f64()
                );
                Ok(client)
            }
            Err(unanswered) => {
                let error = no_majority(&self.address, &unanswered);
                let mut outage = self.cluster.outage.lock().unwrap_or_else(|e| e.into_inner());
                let (_, said) = outage.get_or_insert((Instant::now(), false));
                if !std::mem::replace(said, true) {
                    tracing::warn!("{error}; waiting for a majority of the cluster");
                }
                Err(error)
            }
        }
    }

    /// Up to `max` records from offset `from` on, stopping once they hold
    /// `budget` bytes ([`Record::byte_len`]; always at least one record): what
    /// [`EventLog::read`] (no budget) and [`EventLog::poll`] (the batch's)
    /// do. Uses the read-ahead a sequential reader started, and starts the
    /// next one when this read came back full.
    async fn read_within(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        budget: usize,
    ) -> Result<Vec<StoredRecord>, LogError> {
        if max == 0 {
            self.check_partition(topic, partition).await?;
            return Ok(Vec::new());
        }
        let id = self.topic_id(topic)?;
        let place = (topic.to_owned(), partition);
        let ahead = self.reading.lock().unwrap_or_else(|e| e.into_inner()).remove(&place);
        let sequential = ahead.as_ref().is_some_and(|ahead| ahead.from == from && ahead.budget == budget);
        let largest = ahead.as_ref().and_then(|ahead| ahead.largest);
        let mut read = match ahead.and_then(|ahead| ahead.poll) {
            // A failed read-ahead is forgotten: the poll below meets the
            // failure again and reports it.
            Some(poll) if sequential => poll.await.ok().and_then(Result::ok).unwrap_or_default(),
            Some(poll) => {
                poll.abort();
                Polled::default()
            }
            None => Polled::default(),
        };
        read.largest = read.largest.or(largest);
        if read.records.len() > max {
            read.records.truncate(max);
            read.bytes = read.records.iter().map(|stored| stored.record.byte_len()).sum();
        }
        let client = self.client().await?;
        if read.records.len() < max && (read.records.is_empty() || read.bytes < budget) {
            let at = read.records.last().map_or(from, |last| last.offset + 1);
            let (wanted, bytes_left) = (max - read.records.len(), budget - read.bytes);
            let polled =
                match poll_range(&client, &self.stream, &id, partition, at, wanted, bytes_left, read.largest).await {
                    Ok(polled) => polled,
                    Err(IggyError::TopicIdNotFound(..) | IggyError::TopicNameNotFound(..)) => {
                        return Err(self.missing_topic(topic));
                    }
                    // Name the real partition count in the error.
                    Err(e @ IggyError::PartitionNotFound(..)) => {
                        self.check_partition(topic, partition).await?;
                        return Err(self.storage("reading", e));
                    }
                    Err(e) => return Err(self.storage("reading", e)),
                };
            read.records.extend(polled.records);
            read.bytes += polled.bytes;
            read.largest = polled.largest;
        }
        if let Some(first) = read.records.first().map(|stored| stored.offset).filter(|&first| first > from) {
            self.judge_gap(topic, partition, from, first).await?;
        }
        let Polled { records, bytes, largest } = read;
        let next = records.last().map_or(from, |last| last.offset + 1);
        // A reader that went on where it left off and got all it asked for
        // will likely ask for the next range: poll it while it works.
        let full = !records.is_empty() && (records.len() == max || bytes >= budget);
        let poll = (sequential && full).then(|| {
            let stream = self.stream.clone();
            tokio::spawn(async move { poll_range(&client, &stream, &id, partition, next, max, budget, largest).await })
        });
        let replaced = self
            .reading
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(place, ReadAhead { from: next, budget, largest, poll });
        if let Some(poll) = replaced.and_then(|other| other.poll) {
            poll.abort(); // another reader of the partition meanwhile
        }
        Ok(records)
    }

    /// A read from `from` that came back starting at `first`: fine if
    /// retention removed what lies between (the partition's first offset
    /// is past `from`); else the node answered without records the log
    /// holds (a node seen doing so after a failover), and the read is an
    /// outage, made again on a fresh session rather than skipping them.
    async fn judge_gap(&self, topic: &str, partition: u32, from: u64, first: u64) -> Result<(), LogError> {
        let (retained, _) = self.extent(topic, partition).await?;
        if retained >= first {
            return Ok(());
        }
        Err(self.answered(LogError::Unavailable {
            address: self.address.clone(),
            reason: format!(
                "reading `{topic}` partition {partition} from offset {from} came back from offset {first}, though \
                 the partition holds offsets from {retained}"
            ),
        }))
    }

    fn storage(&self, what: &str, error: IggyError) -> LogError {
        self.answered(storage(&self.address, what, error))
    }

    /// The log's answer that `topic` does not exist, as [`Self::answered`]
    /// takes it.
    fn missing_topic(&self, topic: &str) -> LogError {
        self.answered(LogError::TopicNotFound { topic: topic.to_owned() })
    }

    /// `error` as the caller is to see it; an outage marks the session
    /// broken. While the cluster settles after a failover, an answer that
    /// contradicts what the log held (a topic missing, a response that does
    /// not parse) is taken for a node still recovering its state or cut
    /// off while it answered: the session is dropped like a broken one and
    /// the call made again, on the next node if need be.
    fn answered(&self, error: LogError) -> LogError {
        let settling =
            self.cluster.settling.lock().unwrap_or_else(|e| e.into_inner()).is_some_and(|until| until > Instant::now());
        let error = match error {
            LogError::TopicNotFound { .. } | LogError::Storage { .. } if settling => LogError::Unavailable {
                address: self.address.clone(),
                reason: format!("{error}, within {SETTLING:?} of a failover: taken for a node still settling"),
            },
            error => error,
        };
        if matches!(error, LogError::Unavailable { .. }) && !self.broken.swap(true, Ordering::SeqCst) {
            let mut outage = self.cluster.outage.lock().unwrap_or_else(|e| e.into_inner());
            outage.get_or_insert((Instant::now(), false));
        }
        error
    }

    fn topic_id(&self, topic: &str) -> Result<Identifier, LogError> {
        Identifier::named(topic).map_err(|_| LogError::BackendName {
            name: topic.to_owned(),
            backend: "Iggy",
            what: "topic",
        })
    }

    async fn topic_details(&self, topic: &str) -> Result<iggy::prelude::TopicDetails, LogError> {
        let id = self.topic_id(topic)?;
        match self.client().await?.get_topic(&self.stream, &id).await {
            Ok(Some(details)) => Ok(details),
            Ok(None) | Err(IggyError::TopicIdNotFound(..) | IggyError::TopicNameNotFound(..)) => {
                Err(self.missing_topic(topic))
            }
            Err(e) => Err(self.storage("reading a topic", e)),
        }
    }

    async fn check_partition(&self, topic: &str, partition: u32) -> Result<(), LogError> {
        let partitions = self.partitions(topic).await?;
        if partition >= partitions {
            return Err(LogError::PartitionNotFound { topic: topic.to_owned(), partition, partitions });
        }
        Ok(())
    }

    /// Sends `messages` to a partition, `per_request` at a time (Iggy
    /// stores each request whole or not at all).
    async fn send(
        &self,
        topic: &str,
        partition: u32,
        mut messages: Vec<IggyMessage>,
        per_request: usize,
    ) -> Result<(), LogError> {
        let id = self.topic_id(topic)?;
        let partitioning = Partitioning::partition_id(partition);
        let client = self.client().await?;
        for chunk in messages.chunks_mut(per_request) {
            if let Err(e) = client.send_messages(&self.stream, &id, &partitioning, chunk).await {
                return Err(match e {
                    IggyError::TopicIdNotFound(..) | IggyError::TopicNameNotFound(..) => self.missing_topic(topic),
                    IggyError::PartitionNotFound(..) => {
                        self.check_partition(topic, partition).await?;
                        self.storage("appending", e)
                    }
                    IggyError::TooBigUserHeaders
                    | IggyError::InvalidHeaderKey
                    | IggyError::InvalidHeaderValue
                    | IggyError::InvalidHeaderKind(..)
                    | IggyError::CannotParseHeaderKind(..)
                    | IggyError::TooBigMessagePayload
                    | IggyError::EmptyMessagePayload
                    | IggyError::InvalidMessagePayloadLength
                    | IggyError::InvalidMessagesSize(..)
                    | IggyError::TooSmallMessage(..) => LogError::Refused {
                        topic: topic.to_owned(),
                        partition,
                        reason: format!("{e} (Iggy error {})", e.as_code()),
                    },
                    e => self.storage("appending", e),
                });
            }
        }
        Ok(())
    }

    async fn append_stamped(
        &self,
        topic: &str,
        batches: Vec<(u32, Vec<Record>)>,
        stamp: Option<(&str, u64)>,
    ) -> Result<bool, LogError> {
        let partitions = self.partitions(topic).await?;
        if let Some(&(partition, _)) = batches.iter().find(|(partition, _)| *partition >= partitions) {
            return Err(LogError::PartitionNotFound { topic: topic.to_owned(), partition, partitions });
        }
        let call = self.appends.fetch_add(1, Ordering::Relaxed);
        let mut appended = false;
        for (partition, records) in batches {
            // Known from an earlier question or append; otherwise read from
            // the partition's start, which is sound but slow (callers ask
            // with their mark first).
            if let Some((producer, sequence)) = stamp
                && self.producer_sequence(topic, partition, producer, 0).await?.is_some_and(|known| known >= sequence)
            {
                continue;
            }
            let messages = records
                .into_iter()
                .enumerate()
                .map(|(index, record)| {
                    let id = match stamp {
                        Some((producer, sequence)) => stamped_message_id(producer, partition, sequence, index),
                        None => plain_message_id(self.client_id, call, partition, index),
                    };
                    to_message(topic, partition, record, stamp, id)
                })
                .collect::<Result<Vec<_>, _>>()?;
            appended |= !messages.is_empty();
            let stamp_key = stamp.map(|(producer, _)| (topic.to_owned(), partition, producer.to_owned()));
            // A stamped append is one request, so its stamp never marks half
            // of it: the outbox keeps each small enough.
            let per_request = if stamp.is_some() { messages.len().max(1) } else { CHUNK };
            let sent = self.send(topic, partition, messages, per_request).await;
            if let Some((key, (_, sequence))) = stamp_key.zip(stamp) {
                // After a failed send the partition's stamp is unknown, unless
                // the failure says nothing was stored.
                let mut stamps = self.stamps.lock().unwrap_or_else(|e| e.into_inner());
                match &sent {
                    Ok(()) => drop(stamps.insert(key, Some(sequence))),
                    Err(
                        LogError::Refused { .. } | LogError::TopicNotFound { .. } | LogError::PartitionNotFound { .. },
                    ) => {}
                    Err(_) => drop(stamps.remove(&key)),
                }
            }
            sent?;
        }
        Ok(appended)
    }
}

impl EventLog for IggyLog {
    async fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), LogError> {
        if partitions == 0 {
            return Err(LogError::InvalidPartitionCount { topic: topic.to_owned(), requested: partitions });
        }
        let existing = match self.partitions(topic).await {
            Err(LogError::TopicNotFound { .. }) => {
                let options = topic_options(partitions, self.lossy_topics);
                match self.client().await?.create_topic(&self.stream, topic, &options).await {
                    Ok(_) => return Ok(()),
                    // Created meanwhile by another host: check it like any.
                    Err(IggyError::TopicNameAlreadyExists(..)) => self.partitions(topic).await?,
                    Err(e) => return Err(self.storage("creating a topic", e)),
                }
            }
            other => other?,
        };
        if existing != partitions {
            return Err(LogError::PartitionCountMismatch { topic: topic.to_owned(), existing, requested: partitions });
        }
        Ok(())
    }

    async fn partitions(&self, topic: &str) -> Result<u32, LogError> {
        Ok(self.topic_details(topic).await?.partitions_count)
    }

    async fn topics(&self) -> Result<Vec<(String, u32)>, LogError> {
        let topics =
            self.client().await?.get_topics(&self.stream).await.map_err(|e| self.storage("listing topics", e))?;
        let mut listed: Vec<(String, u32)> =
            topics.into_iter().map(|topic| (topic.name, topic.partitions_count)).collect();
        listed.sort();
        Ok(listed)
    }

    async fn append(&self, topic: &str, batches: Vec<(u32, Vec<Record>)>) -> Result<(), LogError> {
        self.append_stamped(topic, batches, None).await.map(drop)
    }

    async fn append_as(
        &self,
        topic: &str,
        batches: Vec<(u32, Vec<Record>)>,
        producer: &str,
        sequence: u64,
    ) -> Result<bool, LogError> {
        self.append_stamped(topic, batches, Some((producer, sequence))).await
    }

    async fn producer_sequence(
        &self,
        topic: &str,
        partition: u32,
        producer: &str,
        since: u64,
    ) -> Result<Option<u64>, LogError> {
        let key = (topic.to_owned(), partition, producer.to_owned());
        if let Some(&known) = self.stamps.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(known);
        }
        let highest = last_stamp(self, topic, partition, producer, since).await?;
        self.stamps.lock().unwrap_or_else(|e| e.into_inner()).insert(key, highest);
        Ok(highest)
    }

    fn forget_producer(&self, producer: &str) {
        self.stamps.lock().unwrap_or_else(|e| e.into_inner()).retain(|(_, _, name), _| name != producer);
    }

    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<StoredRecord>, LogError> {
        self.read_within(topic, partition, from, max, usize::MAX).await
    }

    async fn poll(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max: usize,
        mut batch: PolledBatch,
    ) -> Result<PolledBatch, LogError> {
        batch.clear();
        // The read stopped at the batch's budget already (by the records'
        // sizes as read, a few bytes off their stored encoding): take all.
        for stored in self.read_within(topic, partition, from, max, batch.byte_budget()).await? {
            push_stored(&mut batch, topic, partition, &stored)?;
        }
        Ok(batch)
    }

    async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64, LogError> {
        Ok(partition_extent(topic, &self.topic_details(topic).await?, partition)?.1)
    }

    async fn end_offsets(&self, topic: &str) -> Result<Vec<u64>, LogError> {
        let details = self.topic_details(topic).await?;
        (0..details.partitions_count).map(|partition| Ok(partition_extent(topic, &details, partition)?.1)).collect()
    }

    async fn extent(&self, topic: &str, partition: u32) -> Result<(u64, u64), LogError> {
        partition_extent(topic, &self.topic_details(topic).await?, partition)
    }

    async fn durability(&self, topic: &str) -> Result<Durability, LogError> {
        Ok(durability_of(&self.topic_details(topic).await?.options))
    }

    fn accepts_lossy_topics(&self) -> bool {
        self.lossy_topics
    }

    async fn topic_identity(&self, topic: &str) -> Result<Option<String>, LogError> {
        let details = self.topic_details(topic).await?;
        Ok(Some(format!("iggy topic {} created at {}", details.id, details.created_at.as_micros())))
    }

    async fn store_consumer_offset(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
        next: u64,
    ) -> Result<(), LogError> {
        if next == 0 {
            // Iggy stores the last consumed offset; nothing consumed yet.
            return self.check_partition(topic, partition).await;
        }
        let consumer = Consumer::new(self.topic_id(consumer)?);
        let id = self.topic_id(topic)?;
        let stored =
            self.client().await?.store_consumer_offset(&consumer, &self.stream, &id, Some(partition), next - 1).await;
        match stored.map_err(|e| self.storage("storing a consumer offset", e)) {
            // Once per batch: the topic and partition are only looked up
            // to name what is missing when the server refused.
            Err(error @ LogError::Storage { .. }) => {
                self.check_partition(topic, partition).await?;
                Err(error)
            }
            other => other,
        }
    }

    async fn consumer_offset(&self, consumer: &str, topic: &str, partition: u32) -> Result<Option<u64>, LogError> {
        self.check_partition(topic, partition).await?;
        let consumer = Consumer::new(self.topic_id(consumer)?);
        let id = self.topic_id(topic)?;
        let info = self
            .client()
            .await?
            .get_consumer_offset(&consumer, &self.stream, &id, Some(partition))
            .await
            .map_err(|e| self.storage("reading a consumer offset", e))?;
        Ok(info.map(|info| info.stored_offset + 1))
    }

    /// Polls one message by timestamp: Iggy stamps each message with the
    /// time the server appended it.
    async fn offset_at(&self, topic: &str, partition: u32, time: SystemTime) -> Result<u64, LogError> {
        let end = self.end_offset(topic, partition).await?;
        let id = self.topic_id(topic)?;
        let consumer = Consumer::new(Identifier::named("waku-reader").expect("a valid name"));
        let strategy = PollingStrategy::timestamp(IggyTimestamp::from(time));
        let polled = self
            .client()
            .await?
            .poll_messages(&self.stream, &id, Some(partition), &consumer, &strategy, 1, false)
            .await
            .map_err(|e| self.storage("polling by timestamp", e))?;
        Ok(polled.messages.first().map_or(end, |message| message.header.offset.min(end)))
    }

    async fn group_partitions(&self, topic: &str, group: &str) -> Result<Vec<u32>, LogError> {
        let topic_id = self.topic_id(topic)?;
        let group_id = group_identifier(group)?;
        let client = self.client().await?;
        self.regroup_after_failover(&client, topic, &topic_id, group, &group_id).await?;
        if let Some(partitions) = self.assignment(&client, &topic_id, &group_id).await? {
            return Ok(partitions);
        }
        // Not a member on this connection: the first call, or a reconnect.
        match client.create_consumer_group(&self.stream, &topic_id, group).await {
            Ok(_) | Err(IggyError::ConsumerGroupNameAlreadyExists(..)) => {}
            Err(IggyError::TopicIdNotFound(..) | IggyError::TopicNameNotFound(..)) => {
                return Err(self.missing_topic(topic));
            }
            Err(e) => return Err(self.storage("creating a consumer group", e)),
        }
        client
            .join_consumer_group(&self.stream, &topic_id, &group_id)
            .await
            .map_err(|e| self.storage("joining a consumer group", e))?;
        tracing::info!(topic, group, "joined consumer group `{group}` of `{topic}`");
        Ok(self.assignment(&client, &topic_id, &group_id).await?.unwrap_or_default())
    }

    async fn nodes(&self) -> Result<Option<LogNodes>, LogError> {
        if !self.cluster.nodes.is_cluster() {
            return Ok(None);
        }
        let roster = self
            .client()
            .await?
            .get_cluster_metadata()
            .await
            .map_err(|e| self.storage("reading the cluster's nodes", e))?;
        let nodes = roster
            .nodes
            .into_iter()
            .map(|node| LogNode {
                address: format!("{}:{}", node.ip, node.endpoints.tcp),
                leader: node.role == iggy::prelude::ClusterNodeRole::Leader,
                status: node.status.to_string(),
                name: node.name,
            })
            .collect();
        let connected = self.cluster.nodes.address(self.cluster.node.load(Ordering::SeqCst)).to_owned();
        Ok(Some(LogNodes { nodes, connected, failovers: self.failovers() }))
    }

    fn failovers(&self) -> u64 {
        self.cluster.failovers.load(Ordering::Relaxed)
    }

    async fn leave_group(&self, topic: &str, group: &str) -> Result<(), LogError> {
        let topic_id = self.topic_id(topic)?;
        let group_id = group_identifier(group)?;
        let client = self.client().await?;
        match client.leave_consumer_group(&self.stream, &topic_id, &group_id).await {
            Ok(()) => Ok(()),
            // Not a member (never joined on this connection, or dropped with
            // an earlier one): nothing to leave.
            Err(
                IggyError::ConsumerGroupMemberNotFound(..)
                | IggyError::ConsumerGroupIdNotFound(..)
                | IggyError::ConsumerGroupNameNotFound(..),
            ) => Ok(()),
            Err(e) => Err(self.storage("leaving a consumer group", e)),
        }
    }
}

impl IggyLog {
    /// After a failover, deletes consumer group `group` of `topic` once, so
    /// that the next join makes it afresh. Iggy logs a session out of its
    /// groups when the node holding it sees the connection end; sessions
    /// held by a node that died are never logged out, and the group goes
    /// on assigning them partitions that nobody reads (seen on
    /// 0.9.0-edge.5). Every host that failed over does this and joins
    /// again, and a member whose session survived finds itself no member
    /// and joins again too ([`EventLog::group_partitions`]); nothing is
    /// lost, as positions are the state store's, not the group's.
    async fn regroup_after_failover(
        &self,
        client: &IggyClient,
        topic: &str,
        topic_id: &Identifier,
        group: &str,
        group_id: &Identifier,
    ) -> Result<(), LogError> {
        let failovers = self.failovers();
        if failovers == 0 {
            return Ok(());
        }
        let place = (topic.to_owned(), group.to_owned());
        if self.cluster.regrouped.lock().unwrap_or_else(|e| e.into_inner()).get(&place) == Some(&failovers) {
            return Ok(());
        }
        match client.delete_consumer_group(&self.stream, topic_id, group_id).await {
            Ok(()) | Err(IggyError::ConsumerGroupIdNotFound(..) | IggyError::ConsumerGroupNameNotFound(..)) => {}
            Err(IggyError::TopicIdNotFound(..) | IggyError::TopicNameNotFound(..)) => {
                return Err(self.missing_topic(topic));
            }
            Err(e) => return Err(self.storage("making a consumer group afresh after a failover", e)),
        }
        tracing::info!(topic, group, "made consumer group `{group}` of `{topic}` afresh after a failover");
        self.cluster.regrouped.lock().unwrap_or_else(|e| e.into_inner()).insert(place, failovers);
        Ok(())
    }

    /// This connection's partitions in a consumer group, asked of the
    /// group's coordinator (the client's own sync request, which the
    /// client crate keeps to itself); `None` when it is not a member.
    async fn assignment(
        &self,
        client: &IggyClient,
        topic: &Identifier,
        group: &Identifier,
    ) -> Result<Option<Vec<u32>>, LogError> {
        use iggy_binary_protocol::WireDecode;
        use iggy_binary_protocol::codec::WireEncode;
        use iggy_binary_protocol::requests::consumer_groups::SyncConsumerGroupRequest;
        use iggy_binary_protocol::responses::consumer_groups::SyncConsumerGroupResponse;
        use iggy_common::BinaryTransport;
        use iggy_common::locking::IggyRwLockFn;
        use iggy_common::wire_conversions::identifier_to_wire;

        let failed = |e| self.storage("asking a consumer group for this host's partitions", e);
        let request = SyncConsumerGroupRequest {
            stream_id: identifier_to_wire(&self.stream).map_err(failed)?,
            topic_id: identifier_to_wire(topic).map_err(failed)?,
            group_id: identifier_to_wire(group).map_err(failed)?,
        };
        let wrapper = client.client();
        let wrapper = wrapper.read().await;
        let code = iggy_binary_protocol::codes::SYNC_CONSUMER_GROUP_CODE;
        let response = match &*wrapper {
            iggy::prelude::ClientWrapper::Tcp(tcp) => tcp.send_raw_with_response(code, request.to_bytes()).await,
            _ => return Err(failed(IggyError::InvalidCommand)),
        };
        let response = match response {
            Ok(response) => response,
            Err(IggyError::ConsumerGroupIdNotFound(..) | IggyError::ConsumerGroupNameNotFound(..)) => {
                return Ok(None);
            }
            Err(e) => return Err(failed(e)),
        };
        if response.is_empty() {
            return Ok(None);
        }
        let (assignment, _) =
            SyncConsumerGroupResponse::decode(&response).map_err(|_| failed(IggyError::InvalidCommand))?;
        Ok(Some(sorted(assignment.partitions)))
    }
}

fn sorted(mut partitions: Vec<u32>) -> Vec<u32> {
    partitions.sort_unstable();
    partitions
}

/// A partition's first and end offsets from its topic's details (see the
/// module docs).
fn partition_extent(
    topic: &str,
    details: &iggy::prelude::TopicDetails,
    partition: u32,
) -> Result<(u64, u64), LogError> {
    let partitions = details.partitions_count;
    let found = details.partitions.iter().find(|p| p.id == partition);
    let found = found.ok_or(LogError::PartitionNotFound { topic: topic.to_owned(), partition, partitions })?;
    Ok(extent_of(found.current_offset, found.messages_count))
}

/// The first and end offsets of a partition whose last offset is `last`
/// (0 when empty) and which holds `count` messages.
fn extent_of(last: u64, count: u64) -> (u64, u64) {
    let end = match (count, last) {
        (0, 0) => 0,
        _ => last + 1,
    };
    (end.saturating_sub(count), end)
}

/// A topic's durability from the options it was created with: durable
/// when each acknowledged message is written (`messages_required_to_save
/// = 1`) and flushed (`enforce_fsync = true`) before the answer.
fn durability_of(options: &iggy::prelude::ResourceOptions) -> Durability {
    let parsed = TopicCreateOptions::from_resource_options(options);
    match (parsed.enforce_fsync, parsed.messages_required_to_save) {
        (Some(true), Some(1)) => Durability::Durable,
        (None, None) => Durability::Unknown {
            reason: "the server reports neither enforce_fsync nor messages_required_to_save for it".to_owned(),
        },
        (fsync, saved) => {
            let show = |value: Option<String>| value.unwrap_or_else(|| "not reported".to_owned());
            Durability::Lossy {
                setting: format!(
                    "enforce_fsync = {}, messages_required_to_save = {}",
                    show(fsync.map(|v| v.to_string())),
                    show(saved.map(|v| v.to_string()))
                ),
            }
        }
    }
}

/// Up to `max` records of a partition from offset `from` on, decoded,
/// stopping once they hold `budget` bytes (always taking at least one
/// record) or a poll comes back empty. Each request asks for
/// [`fetch_count`] messages: what the bytes left can hold at the size
/// `largest` expects, so a partition of large messages is fetched a few at
/// a time and one of small messages [`POLL`] at a time.
#[allow(clippy::too_many_arguments)] // where to read, how much, and the estimate
async fn poll_range(
    client: &IggyClient,
    stream: &Identifier,
    topic: &Identifier,
    partition: u32,
    from: u64,
    max: usize,
    budget: usize,
    largest: Option<usize>,
) -> Result<Polled, IggyError> {
    let consumer = Consumer::new(Identifier::named("waku-reader").expect("a valid name"));
    let mut polled = Polled { records: Vec::with_capacity(max.min(4 * POLL)), bytes: 0, largest };
    let mut at = from;
    while polled.records.len() < max && (polled.records.is_empty() || polled.bytes < budget) {
        let count = fetch_count(max - polled.records.len(), budget.saturating_sub(polled.bytes), polled.largest);
        let strategy = PollingStrategy::offset(at);
        let messages = client.poll_messages(stream, topic, Some(partition), &consumer, &strategy, count, false).await?;
        // Nothing (more), or nothing new from a server that went back.
        let Some(last) = messages.messages.last().map(|m| m.header.offset).filter(|&last| last >= at) else { break };
        // A fetch that skips offsets after records were taken ends the
        // read there: the next one, from the missing offset, asks again
        // and [`IggyLog::read_within`] judges the gap.
        let first = messages.messages.iter().map(|m| m.header.offset).find(|&offset| offset >= at);
        if !polled.records.is_empty() && first != Some(at) {
            break;
        }
        let mut largest_fetched = 0;
        for message in messages.messages.into_iter().filter(|m| m.header.offset >= at) {
            // What the fetch brought past the record that spent the budget
            // is left for the next read.
            if polled.records.len() == max || (!polled.records.is_empty() && polled.bytes >= budget) {
                break;
            }
            let stored = from_message(message);
            let size = stored.record.byte_len();
            largest_fetched = largest_fetched.max(size);
            polled.bytes += size;
            polled.records.push(stored);
        }
        polled.largest = Some(next_estimate(polled.largest, largest_fetched));
        at = polled.records.last().map_or(last, |stored| stored.offset) + 1;
    }
    Ok(polled)
}

/// How many messages one poll request asks for: at most [`POLL`] and the
/// records still `wanted`, and no more than `bytes_left` (capped at
/// [`PolledBatch::BYTE_BUDGET`], so a read without a budget fetches in
/// pieces of that size too) can hold if each holds `largest` bytes; always
/// at least 1, so a message larger than the budget is still read (and the
/// read then ends). Knowing nothing of the partition's messages
/// (`largest` is `None`), it asks for 1: Iggy takes messages of up to 64 MB,
/// so no count above 1 is safe before one was seen.
fn fetch_count(wanted: usize, bytes_left: usize, largest: Option<usize>) -> u32 {
    let Some(largest) = largest else { return 1 };
    let by_bytes = bytes_left.min(PolledBatch::BYTE_BUDGET) / largest.max(1);
    // At most POLL, which fits a u32.
    wanted.min(POLL).min(by_bytes).max(1) as u32
}

/// What the next fetch of a partition expects its largest message to hold,
/// after one that `fetched` messages of at most that many bytes: that size,
/// or half the previous estimate if that is more. A large message thus
/// slows the partition's fetches down at once, and they speed up again
/// over a few fetches (doubling) once messages are small again, rather
/// than staying slow for good.
fn next_estimate(previous: Option<usize>, fetched: usize) -> usize {
    fetched.max(previous.unwrap_or(0) / 2)
}

/// The highest stamp `producer` left in a partition at or after offset
/// `since`, read back from the end in chunks: a producer's stamps rise with
/// the offset, so the first chunk holding one holds the highest.
pub(crate) async fn last_stamp<L: EventLog>(
    log: &L,
    topic: &str,
    partition: u32,
    producer: &str,
    since: u64,
) -> Result<Option<u64>, LogError> {
    let mut upto = log.end_offset(topic, partition).await?;
    while upto > since {
        let from = upto.saturating_sub(CHUNK as u64).max(since);
        let records = log.read(topic, partition, from, (upto - from) as usize).await?;
        let highest = records.iter().filter_map(|stored| stamp_of(&stored.record, producer)).max();
        if highest.is_some() {
            return Ok(highest);
        }
        upto = from;
    }
    Ok(None)
}

/// The sequence number `producer` stamped on `record`, if it did.
fn stamp_of(record: &Record, producer: &str) -> Option<u64> {
    let header = |name: &str| record.headers.iter().find(|h| h.name == name);
    header(PRODUCER).filter(|h| h.value == producer.as_bytes())?;
    header(SEQUENCE).and_then(|h| <[u8; 8]>::try_from(h.value.as_slice()).ok()).map(u64::from_le_bytes)
}

/// The headers [`EventLog::append_as`] adds to each message, as they read
/// back: producer and sequence number.
pub(crate) fn stamp_headers(producer: &str, sequence: u64) -> [Header; 2] {
    [
        Header { name: PRODUCER.to_owned(), value: producer.as_bytes().to_vec() },
        Header { name: SEQUENCE.to_owned(), value: sequence.to_le_bytes().to_vec() },
    ]
}

/// `error` from connecting to `url`, as [`LogError::Tls`] when the URL
/// asks for TLS and a handshake of the host's own says why it was refused
/// ([`super::iggy_tls`]), else as `failed` makes it.
async fn explained(url: &str, address: &Path, error: IggyError, failed: impl Fn(IggyError) -> LogError) -> LogError {
    let Some(tls) = super::iggy_tls::IggyTls::of_url(url) else { return failed(error) };
    match tls.explain().await {
        Some(reason) => LogError::Tls { address: address.display().to_string(), reason },
        None => failed(error),
    }
}

/// A connected client for `url`.
/// `url` holds the reconnection option [`Nodes`] gives it.
async fn new_client(url: &str) -> Result<IggyClient, IggyError> {
    let client = IggyClient::from_connection_string(url)?;
    client.connect().await?;
    Ok(client)
}

/// A connected client on the node that leads, and that node; else, per
/// node, why not. One server: the first of `order` that answers within
/// [`NODE_TIMEOUT`]. A cluster: every node of `order` is asked which node
/// leads, and only a node that a majority of the roster names (itself
/// among them) is used. A follower may answer from an old view (even that
/// a topic does not exist) or serve reads and end offsets behind the
/// leader's; for a heartbeat's time after the leader died its followers
/// still name it; and a node restarted from an old view may name itself
/// until it learns the new one: a majority's word is the cluster's. If the
/// majority names an address the roster does not hold (a cluster that
/// advertises other addresses than the URL's), the first node that
/// answered is used.
async fn first_answering(
    nodes: &Nodes,
    order: impl Iterator<Item = usize>,
) -> Result<(IggyClient, usize), Vec<String>> {
    let mut unanswered = Vec::new();
    let mut answered: Vec<(IggyClient, usize, Option<String>)> = Vec::new();
    let dial = |node: usize| async move {
        let dialled = async {
            let client = new_client(nodes.url(node)).await?;
            let leader = match nodes.is_cluster() {
                true => leader_address(&client).await,
                false => None,
            };
            Ok::<_, IggyError>((client, leader))
        };
        (node, tokio::time::timeout(NODE_TIMEOUT, dialled).await)
    };
    // A cluster's nodes are dialled at once: a round takes the slowest
    // node's time, not the sum (a node mid-election holds a sign-in for
    // seconds).
    let dialled = match nodes.is_cluster() {
        true => futures_util::future::join_all(order.map(dial)).await,
        false => {
            let mut one = Vec::new();
            for node in order {
                let (node, result) = dial(node).await;
                if let Ok(Ok((client, _))) = result {
                    return Ok((client, node));
                }
                one.push((node, result));
            }
            one
        }
    };
    for (node, result) in dialled {
        match result {
            Ok(Ok((client, leader))) => answered.push((client, node, leader)),
            Ok(Err(error)) => unanswered.push(format!("{}: {error}", nodes.address(node))),
            Err(_) => unanswered.push(format!("{}: no answer within {NODE_TIMEOUT:?}", nodes.address(node))),
        }
    }
    let named = |address: &str| answered.iter().filter(|(_, _, leader)| leader.as_deref() == Some(address)).count();
    let majority = nodes.len() / 2 + 1;
    let chosen = answered.iter().position(|(_, node, leader)| match leader.as_deref() {
        Some(leader) if named(leader) >= majority => match nodes.position(leader) {
            Some(leads) => leads == *node,
            None => true,
        },
        _ => false,
    });
    let mut found = None;
    for (index, (client, node, leader)) in answered.into_iter().enumerate() {
        if Some(index) == chosen {
            found = Some((client, node));
            continue;
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), client.disconnect()).await;
        let why = match leader {
            Some(leader) => format!("names {leader} as leader"),
            None => "knows no leader yet".to_owned(),
        };
        unanswered.push(format!("{}: {why}", nodes.address(node)));
    }
    found.ok_or(unanswered)
}

/// The error of a cluster none of whose nodes answered.
fn no_majority(address: &Path, unanswered: &[String]) -> LogError {
    LogError::Unavailable {
        address: address.to_owned(),
        reason: format!("no node of the Iggy cluster answers ({})", unanswered.join("; ")),
    }
}

/// The TCP address of the healthy node `client`'s cluster says leads, if
/// it says.
async fn leader_address(client: &IggyClient) -> Option<String> {
    use iggy::prelude::{ClusterNodeRole, ClusterNodeStatus};
    let roster = client.get_cluster_metadata().await.ok()?;
    let leader = roster
        .nodes
        .iter()
        .find(|node| node.role == ClusterNodeRole::Leader && node.status == ClusterNodeStatus::Healthy)?;
    Some(format!("{}:{}", leader.ip, leader.endpoints.tcp))
}

/// A record as an Iggy message with id `id`: headers as user headers and
/// the body as payload (see the module docs), stamped when `stamp` is given.
fn to_message(
    topic: &str,
    partition: u32,
    record: Record,
    stamp: Option<(&str, u64)>,
    id: u128,
) -> Result<IggyMessage, LogError> {
    let refused = |reason: String| LogError::Refused { topic: topic.to_owned(), partition, reason };
    let mut headers =
        encode_headers(&record.headers, record.body.is_empty()).map_err(|refusal| refused(refusal.to_string()))?;
    let payload = if record.body.is_empty() { Bytes::from_static(&[0]) } else { Bytes::from(record.body) };
    if let Some((producer, sequence)) = stamp {
        for Header { name, value } in stamp_headers(producer, sequence) {
            put_raw(&mut headers, &name, &value).map_err(|refusal| match refusal {
                HeaderRefusal::Value { .. } => refused(format!("producer name {producer:?} must have 1 to 255 bytes")),
                HeaderRefusal::Key { .. } => refused(refusal.to_string()),
            })?;
        }
    }
    IggyMessage::builder()
        .id(id)
        .payload(payload)
        .user_headers(headers)
        .build()
        .map_err(|e| refused(format!("{e} (Iggy error {})", e.as_code())))
}

/// The id of a plain append's message: the client, the append call, the
/// partition and the index in it. A resend of the same call (the client
/// replays requests after a reconnect) carries the same ids.
fn plain_message_id(client: u64, call: u64, partition: u32, index: usize) -> u128 {
    let high = (u128::from(client >> 16) << 80) | (u128::from(call as u32) << 48);
    (high | (u128::from(partition as u16) << 32) | u128::from(index as u32)).max(1)
}

/// A stamped message's id: the same every time the same producer appends
/// the same record again, so a resend can be recognised, even by another
/// client after a crash.
fn stamped_message_id(producer: &str, partition: u32, sequence: u64, index: usize) -> u128 {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(producer.as_bytes());
    hasher.update(partition.to_le_bytes());
    hasher.update(sequence.to_le_bytes());
    hasher.update((index as u64).to_le_bytes());
    u128::from_le_bytes(hasher.finalize()[..16].try_into().expect("16 bytes")).max(1)
}

/// An Iggy message as a stored record: user headers back to the names and
/// little-endian bytes this crate writes, split values joined, an empty
/// body restored.
fn from_message(message: IggyMessage) -> StoredRecord {
    // Malformed header bytes read as "no headers", as the client reads
    // them: the record then has no envelope, which the consumer reports as
    // a header error.
    let (headers, empty_body) = message.user_headers.as_deref().and_then(decode_headers).unwrap_or_default();
    let body = if empty_body { Vec::new() } else { message.payload.to_vec() };
    // Iggy stamps each message with the microsecond it was appended.
    let append_time = i64::try_from(message.header.timestamp / 1000).ok();
    StoredRecord { offset: message.header.offset, record: Record { headers, body }, append_time }
}

fn storage(address: &std::path::Path, what: &str, error: IggyError) -> LogError {
    let reason = format!("{what} failed: {error} (Iggy error {})", error.as_code());
    match error {
        // A response cut short (a node killed while it answered): the
        // session's framing is lost, so it is dropped like a broken one and
        // the call is made again on a fresh session.
        IggyError::EmptyResponse
        | IggyError::InvalidNumberEncoding
        | IggyError::Disconnected
        | IggyError::AlreadyAuthenticated
        | IggyError::NotConnected
        | IggyError::CannotEstablishConnection
        | IggyError::StaleClient
        | IggyError::TcpError
        | IggyError::Unauthenticated
        | IggyError::TransientNotCommitted
        | IggyError::TransientNotAccepted => LogError::Unavailable { address: address.to_owned(), reason },
        _ => LogError::Storage { path: address.to_owned(), source: reason.into() },
    }
}

/// Iggy's identifier of the consumer group `group`.
fn group_identifier(group: &str) -> Result<Identifier, LogError> {
    Identifier::named(group).map_err(|_| LogError::BackendName {
        name: group.to_owned(),
        backend: "Iggy",
        what: "group",
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::str::FromStr;

    use iggy::prelude::{HeaderKey, HeaderKind, HeaderValue};

    use super::*;
    use crate::event::header_name::{KEY, TAG};
    use crate::storage::log::iggy_headers::{HeaderPiece, header_key, parse_header_key};

    const MIB: usize = 1 << 20;

    #[test]
    fn a_fetch_asks_for_what_the_bytes_left_can_hold() {
        // Nothing known of the partition: one message.
        assert_eq!(fetch_count(65_536, 32 * MIB, None), 1);
        // Small messages (the demo's): POLL at a time, or what is wanted.
        assert_eq!(fetch_count(65_536, 32 * MIB, Some(150)), 4096);
        assert_eq!(fetch_count(10, 32 * MIB, Some(150)), 10);
        assert_eq!(fetch_count(65_536, 150 * 100, Some(150)), 100);
        // Large ones: what the bytes left hold.
        assert_eq!(fetch_count(65_536, 32 * MIB, Some(2 * MIB)), 16);
        assert_eq!(fetch_count(65_536, 5 * MIB, Some(2 * MIB)), 2);
        // Larger than what is left, or than the whole budget: still one.
        assert_eq!(fetch_count(65_536, MIB, Some(64_000_000)), 1);
        assert_eq!(fetch_count(65_536, 0, Some(150)), 1);
        // A read without a budget fetches in pieces of the default one.
        assert_eq!(fetch_count(65_536, usize::MAX, Some(MIB)), 32);
        assert_eq!(fetch_count(65_536, usize::MAX, Some(0)), 4096);
    }

    #[test]
    fn a_fetch_never_asks_for_more_than_fits_and_always_for_one() {
        let sizes = [0, 1, 100, 4095, 4096, MIB, 32 * MIB, 64_000_000, usize::MAX];
        for wanted in [1, 2, 100, 4096, 4097, 65_536, usize::MAX] {
            for bytes_left in sizes {
                for largest in sizes.map(Some).into_iter().chain([None]) {
                    let count = fetch_count(wanted, bytes_left, largest) as usize;
                    let case = format!("wanted {wanted}, {bytes_left} bytes left, largest {largest:?}: {count}");
                    assert!((1..=POLL.min(wanted)).contains(&count), "{case}");
                    if count > 1 {
                        let fits = bytes_left.min(PolledBatch::BYTE_BUDGET);
                        assert!(count.saturating_mul(largest.unwrap()) <= fits, "{case}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_estimate_follows_large_messages_at_once_and_small_ones_by_halves() {
        assert_eq!(next_estimate(None, 150), 150);
        assert_eq!(next_estimate(Some(150), 5 * MIB), 5 * MIB);
        assert_eq!(next_estimate(Some(64_000_000), 150), 32_000_000);
        // After one message of Iggy's largest, small messages go POLL at a
        // time again within a few fetches.
        let (mut estimate, mut fetches) = (Some(64_000_000), 0);
        while fetch_count(65_536, PolledBatch::BYTE_BUDGET, estimate) < POLL as u32 {
            estimate = Some(next_estimate(estimate, 150));
            fetches += 1;
        }
        assert_eq!(fetches, 13);
    }

    /// Against a server named by `WAKU_IGGY_URL`, else skipped with a line.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_of_large_messages_fetches_no_more_than_its_budget() {
        let Ok(url) = std::env::var("WAKU_IGGY_URL") else {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "skipped: the Iggy fetch test needs an Iggy server named by WAKU_IGGY_URL (e.g. iggy://iggy:iggy@127.0.0.1:8090)"
            );
            return;
        };
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap();
        let log = IggyLog::connect(&url, &format!("waku-lib-fetch-{}", now.as_nanos())).await.unwrap();
        log.create_topic("large", 1).await.unwrap();
        let record = |n: u8| Record { headers: Vec::new(), body: vec![n; MIB / 2] };
        for batch in 0..3 {
            log.append("large", vec![(0, (0..4).map(|n| record(batch * 4 + n)).collect())]).await.unwrap();
        }
        let offsets = |records: &[StoredRecord]| records.iter().map(|stored| stored.offset).collect::<Vec<_>>();
        // 12 messages of 512 KiB, a budget of 2 MiB: one message (nothing
        // known yet), then the three the 1.5 MiB left hold.
        let first = log.read_within("large", 0, 0, 1000, 2 * MIB).await.unwrap();
        assert_eq!(offsets(&first), [0, 1, 2, 3]);
        assert_eq!(first[3].record, record(3));
        // The read-ahead went on by as much; the next read takes it.
        let ahead = log.reading.lock().unwrap().get(&("large".to_owned(), 0)).unwrap().largest;
        assert_eq!(ahead, Some(MIB / 2));
        let second = log.read_within("large", 0, 4, 1000, 2 * MIB).await.unwrap();
        assert_eq!(offsets(&second), [4, 5, 6, 7]);
        assert_eq!(second[0].record, record(4));
        // A budget below one message: one message.
        assert_eq!(offsets(&log.read_within("large", 0, 8, 1000, 1).await.unwrap()), [8]);
        // A read without a budget reads what it is asked for.
        assert_eq!(offsets(&log.read("large", 0, 2, 1000).await.unwrap()), (2..12).collect::<Vec<_>>());
    }

    #[test]
    fn headers_survive_the_trip_through_iggy_user_headers() {
        let long = vec![7u8; 600];
        let record = Record {
            headers: vec![
                Header { name: TAG.into(), value: 9u32.to_le_bytes().to_vec() },
                Header { name: KEY.into(), value: vec![0x01, 0x54] },
                Header { name: "waku-failure".into(), value: long.clone() },
                Header { name: "waku-module".into(), value: Vec::new() },
                Header { name: "trace".into(), value: b"abc".to_vec() },
            ],
            body: b"{}".to_vec(),
        };
        let mut message = to_message("t", 0, record.clone(), Some(("p", 3)), 9).unwrap();
        assert_eq!(message.header.id, 9);
        message.header.offset = 5;
        let stored = from_message(message);
        assert_eq!(stored.offset, 5);
        let find = |name: &str| stored.record.headers.iter().find(|h| h.name == name).map(|h| h.value.clone());
        for header in &record.headers {
            assert_eq!(find(&header.name), Some(header.value.clone()), "{}", header.name);
        }
        assert_eq!(find(SEQUENCE), Some(3u64.to_le_bytes().to_vec()));
        assert_eq!(find(PRODUCER), Some(b"p".to_vec()));
        assert_eq!(stored.record.body, b"{}");
    }

    #[test]
    fn context_headers_are_iggy_strings_cut_at_characters() {
        let message = "é".repeat(300);
        let record = Record {
            headers: vec![
                Header { name: "waku.error.message".into(), value: message.clone().into_bytes() },
                Header { name: "waku.error.offset".into(), value: b"41".to_vec() },
                // Not UTF-8 (only a hostile writer's): raw, as any value.
                Header { name: "waku.error.module".into(), value: vec![0xff] },
            ],
            body: b"{}".to_vec(),
        };
        let sent = to_message("t", 0, record.clone(), None, 1).unwrap();
        let headers = sent.user_headers_map().unwrap().unwrap();
        let text = |key: &str| {
            headers.get(&HeaderKey::from_str(key).unwrap()).map(|v| (v.kind(), v.as_str().ok().map(str::to_owned)))
        };
        assert_eq!(text("waku.error.offset"), Some((HeaderKind::String, Some("41".to_owned()))));
        let (kind, first) = text("waku.error.message").unwrap();
        assert_eq!((kind, first.unwrap().chars().count()), (HeaderKind::String, 127), "254 bytes of 2-byte characters");
        assert_eq!(text("waku.error.module").unwrap().0, HeaderKind::Raw);
        assert_eq!(
            round_trip(&record).headers.iter().find(|h| h.name == "waku.error.message").unwrap().value,
            message.as_bytes()
        );
    }

    fn round_trip(record: &Record) -> Record {
        let mut message = to_message("t", 0, record.clone(), None, 1).unwrap();
        message.header.offset = 0;
        from_message(message).record
    }

    fn sorted(mut record: Record) -> Record {
        record.headers.sort_by(|a, b| a.name.cmp(&b.name));
        record
    }

    #[test]
    fn empty_bodies_and_names_with_tildes_round_trip_exactly() {
        let header = |name: &str, value: &[u8]| Header { name: name.into(), value: value.to_vec() };
        let long = vec![3u8; 300];
        let tricky = Record {
            headers: vec![
                header("a", &long),
                header("a~1", b"not a piece"),
                header("a~empty", b"not empty"),
                header("~no-body", b"not the marker"),
                header("~", &[]),
                header("~~", &long),
                header("b~", b"x"),
                header("b", &[]),
                header("~1", b"y"),
            ],
            body: Vec::new(),
        };
        assert_eq!(sorted(round_trip(&tricky)), sorted(tricky.clone()));
        let one_zero = Record { headers: vec![], body: vec![0] };
        assert_eq!(round_trip(&one_zero), one_zero, "a real one-byte body stays");
        let bare = Record { headers: vec![], body: vec![] };
        assert_eq!(round_trip(&bare), bare);
        for name in ["plain", "a~b", "~", "x~~", "~1", "~empty", "~no-body"] {
            for suffix in [None, Some("1"), Some("empty")] {
                let parsed = parse_header_key(&header_key(name, suffix));
                let expected = match suffix {
                    None => HeaderPiece::Value { name: name.into(), index: 0 },
                    Some("empty") => HeaderPiece::Empty { name: name.into() },
                    Some(_) => HeaderPiece::Value { name: name.into(), index: 1 },
                };
                assert_eq!(parsed, expected, "{name:?} {suffix:?}");
            }
        }
        // Another producer's keys that do not follow the scheme are names.
        assert_eq!(parse_header_key("a~b"), HeaderPiece::Value { name: "a~b".into(), index: 0 });
    }

    /// The headers as the client's own typed map gives them, joined the way
    /// [`from_message`] joins them: what [`decode_headers`] must agree with.
    fn through_the_clients_map(message: &IggyMessage) -> Option<(Vec<Header>, bool)> {
        let map = message.user_headers_map().ok()??;
        let mut pieces: BTreeMap<String, Vec<(usize, Vec<u8>)>> = BTreeMap::new();
        let mut empty_body = false;
        for (key, value) in map {
            let bytes = match value.kind() {
                HeaderKind::Uint32 => value.as_uint32().unwrap().to_le_bytes().to_vec(),
                HeaderKind::Uint64 => value.as_uint64().unwrap().to_le_bytes().to_vec(),
                _ => value.as_bytes().to_vec(),
            };
            match parse_header_key(&String::from_utf8_lossy(key.as_bytes())) {
                HeaderPiece::Value { name, index } => pieces.entry(name).or_default().push((index, bytes)),
                HeaderPiece::Empty { name } => pieces.entry(name).or_default().push((0, Vec::new())),
                HeaderPiece::EmptyBody => empty_body = true,
            }
        }
        let headers = pieces
            .into_iter()
            .map(|(name, mut parts)| {
                parts.sort_by_key(|(index, _)| *index);
                Header { name, value: parts.into_iter().flat_map(|(_, bytes)| bytes).collect() }
            })
            .collect();
        Some((headers, empty_body))
    }

    /// A user-header block written by hand: (key kind, key, value kind, value).
    fn block(entries: &[(u8, &[u8], u8, &[u8])]) -> Bytes {
        let mut buf = bytes::BytesMut::new();
        iggy_binary_protocol::encode_user_headers(entries, &mut buf);
        buf.freeze()
    }

    #[test]
    fn headers_decoded_from_the_bytes_match_the_clients_typed_map() {
        let typed = |pairs: Vec<(&str, HeaderValue)>| {
            let headers = pairs.into_iter().map(|(k, v)| (HeaderKey::from_str(k).unwrap(), v)).collect();
            IggyMessage::builder().payload(Bytes::from_static(b"{}")).user_headers(headers).build().unwrap()
        };
        let long = Record {
            headers: vec![
                Header { name: TAG.into(), value: 7u32.to_le_bytes().to_vec() },
                Header { name: "a".into(), value: vec![5; 700] },
                Header { name: "e".into(), value: Vec::new() },
                Header { name: "x~y".into(), value: b"z".to_vec() },
            ],
            body: Vec::new(),
        };
        let mut messages = vec![
            to_message("t", 0, long, Some(("p", 9)), 1).unwrap(),
            typed(vec![
                ("u8", HeaderValue::from(7u8)),
                ("i16", HeaderValue::from(-3i16)),
                ("u32", HeaderValue::from(70_000u32)),
                ("u64", HeaderValue::from(u64::MAX - 1)),
                ("i128", HeaderValue::from(-5i128)),
                ("f64", HeaderValue::from(1.5f64)),
                ("bool", HeaderValue::from(true)),
                ("s", HeaderValue::from_str("text").unwrap()),
                ("raw~3", HeaderValue::from_raw(HeaderKind::Raw, b"piece").unwrap()),
            ]),
        ];
        // Blocks the client refuses: an unknown kind, a fixed size broken,
        // a block cut short, a key without its value, bytes after the end.
        let refused = [
            block(&[(2, b"k", 16, b"v")]),
            block(&[(2, b"k", 11, b"abc")]),
            block(&[(7, b"123", 1, b"v")]),
            block(&[(2, b"k", 1, b"v")]).slice(..9),
            Bytes::from(vec![2, 1, 0, 0, 0, b'k']),
            [block(&[(2, b"k", 1, b"v")]), Bytes::from_static(&[1])].concat().into(),
            block(&[(2, &[0xff, b'~', b'1'], 1, b"v"), (1, &[0xfe], 1, b"w")]),
        ];
        for bytes in refused {
            let mut message = typed(vec![]);
            message.user_headers = Some(bytes);
            messages.push(message);
        }
        for message in &messages {
            let decoded = message.user_headers.as_deref().and_then(decode_headers);
            assert_eq!(decoded, through_the_clients_map(message), "{:?}", message.user_headers);
        }
        let refusals: Vec<_> = messages.iter().map(|m| through_the_clients_map(m).is_none()).collect();
        assert_eq!(refusals, [false, false, true, true, true, true, true, true, false], "refusals tested");
    }

    #[test]
    fn what_iggy_cannot_store_is_refused_naming_the_place() {
        let named =
            |name: String| Record { headers: vec![Header { name, value: b"v".to_vec() }], body: b"{}".to_vec() };
        for record in [named("~".repeat(128)), named(String::new()), named("x".repeat(256))] {
            let error = to_message("t", 3, record, None, 1).unwrap_err();
            assert!(matches!(&error, LogError::Refused { topic, partition: 3, .. } if topic == "t"), "{error:?}");
        }
        assert!(to_message("t", 3, named("~".repeat(127)), None, 1).is_ok());
        let heavy = Record {
            headers: (0..500).map(|i| Header { name: format!("h{i}"), value: vec![1; 255] }).collect(),
            body: b"{}".to_vec(),
        };
        let error = to_message("t", 0, heavy, None, 1).unwrap_err();
        assert!(error.to_string().starts_with("`t` partition 0 refuses the record: "), "{error}");
    }

    #[test]
    fn message_ids_are_deterministic() {
        assert_eq!(stamped_message_id("p", 0, 7, 1), stamped_message_id("p", 0, 7, 1));
        assert_ne!(stamped_message_id("p", 0, 7, 1), stamped_message_id("p", 0, 7, 2));
        let ids: std::collections::HashSet<u128> = (0..4)
            .flat_map(|call| (0..3).flat_map(move |partition| (0..100).map(move |i| (call, partition, i))))
            .map(|(call, partition, index)| plain_message_id(0xabcd_ef01_2345_6789, call, partition, index))
            .collect();
        assert_eq!(ids.len(), 4 * 3 * 100, "plain ids differ by call, partition and index");
        assert_eq!(plain_message_id(5, 1, 2, 3), plain_message_id(5, 1, 2, 3));
    }

    /// A producer's stamps are found from `since` on, however many
    /// messages follow them, and never below it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stamps_are_found_from_the_mark_behind_any_amount_of_traffic() {
        use crate::storage::log::EmbeddedLog;
        let dir = tempfile::tempdir().unwrap();
        let log = EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
        log.create_topic("out", 1).await.unwrap();
        let stamped = |sequence: u64| Record { headers: stamp_headers("host-a", sequence).to_vec(), body: vec![1] };
        let other = || Record { headers: stamp_headers("host-b", 99).to_vec(), body: vec![2] };
        log.append("out", vec![(0, vec![stamped(3), other()])]).await.unwrap();
        let mark = log.end_offset("out", 0).await.unwrap();
        log.append("out", vec![(0, vec![stamped(4), stamped(5), other()])]).await.unwrap();
        // More traffic than the 100 000 messages the old look-back read.
        for _ in 0..15 {
            log.append("out", vec![(0, (0..10_000).map(|_| other()).collect())]).await.unwrap();
        }
        assert_eq!(last_stamp(&log, "out", 0, "host-a", mark).await.unwrap(), Some(5));
        assert_eq!(last_stamp(&log, "out", 0, "host-a", 0).await.unwrap(), Some(5));
        assert_eq!(last_stamp(&log, "out", 0, "host-b", mark).await.unwrap(), Some(99));
        assert_eq!(last_stamp(&log, "out", 0, "host-c", mark).await.unwrap(), None);
        // Below the mark is not looked at; past the end finds nothing.
        assert_eq!(last_stamp(&log, "out", 0, "host-a", mark + 3).await.unwrap(), None);
        assert_eq!(last_stamp(&log, "out", 0, "host-a", u64::MAX).await.unwrap(), None);
    }

    #[test]
    fn extents_follow_the_last_offset_and_the_count() {
        assert_eq!(extent_of(0, 0), (0, 0), "empty");
        assert_eq!(extent_of(0, 1), (0, 1), "one message");
        assert_eq!(extent_of(99, 100), (0, 100));
        // Retention deleted the oldest 40: the end stays, the first rises.
        assert_eq!(extent_of(99, 60), (40, 100));
        // Every message expired: nothing held, the end after the last.
        assert_eq!(extent_of(99, 0), (100, 100));
    }

    #[test]
    fn a_response_cut_short_breaks_the_session_and_a_refusal_does_not() {
        let address = std::path::Path::new("iggy://127.0.0.1:8090");
        let unavailable = |error| matches!(storage(address, "reading", error), LogError::Unavailable { .. });
        // A node killed while it answered a poll leaves a short body.
        assert!(unavailable(IggyError::InvalidNumberEncoding));
        assert!(unavailable(IggyError::EmptyResponse));
        assert!(unavailable(IggyError::Disconnected));
        // What the server refuses on purpose is no outage.
        assert!(!unavailable(IggyError::InvalidCommand));
        assert!(!unavailable(IggyError::TopicIdNotFound(
            Identifier::numeric(2).unwrap(),
            Identifier::numeric(1).unwrap()
        )));
    }

    #[test]
    fn a_topic_is_durable_only_with_fsync_and_a_save_per_message() {
        let options = |fsync: Option<bool>, saved: Option<u32>| {
            let create =
                TopicCreateOptions { enforce_fsync: fsync, messages_required_to_save: saved, ..Default::default() };
            durability_of(&create.to_option_map().unwrap())
        };
        assert_eq!(options(Some(true), Some(1)), Durability::Durable);
        let lossy = |setting: &str| Durability::Lossy { setting: setting.to_owned() };
        assert_eq!(options(Some(false), Some(1)), lossy("enforce_fsync = false, messages_required_to_save = 1"));
        assert_eq!(options(Some(true), Some(1024)), lossy("enforce_fsync = true, messages_required_to_save = 1024"));
        assert_eq!(options(Some(true), None), lossy("enforce_fsync = true, messages_required_to_save = not reported"));
        assert!(matches!(options(None, None), Durability::Unknown { .. }));
        // What the host creates its topics with, and the opt-out.
        let durable = topic_options(4, false);
        assert_eq!(durable.partitions_count, Some(4));
        assert_eq!(durability_of(&durable.to_option_map().unwrap()), Durability::Durable);
        assert_eq!(durable.message_expiry, Some(IggyExpiry::NeverExpire));
        let lossy = topic_options(4, true);
        assert_eq!((lossy.enforce_fsync, lossy.messages_required_to_save), (None, None), "the server's defaults");
    }
}
