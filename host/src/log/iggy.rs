//! Apache Iggy as the log: a stream of an Iggy server, its topics and
//! partitions, over the `iggy` client crate.
//!
//! How the [`EventLog`] promises map onto Iggy:
//! - **Topics live in one stream**, named when connecting
//!   ([`IggyLog::connect`]); the stream is created if it does not exist.
//! - **Partitions are addressed explicitly.** Iggy numbers partitions from
//!   0, like this crate; every append names its partition
//!   ([`crate::event::partition_for`] picked it), so both backends agree on
//!   where a key lives.
//! - **End offsets come from message counts.** Iggy's `current_offset` is
//!   the offset of the last message and is also 0 for an empty partition;
//!   the message count tells them apart and is the end offset.
//! - **Headers are Iggy user headers.** The tag travels as a typed `u32`
//!   value, everything else (the key's canonical bytes too) as raw bytes. Iggy refuses empty
//!   values and values over 255 bytes, so such values are split over
//!   numbered keys (`name`, `name~1`, …) or, when empty, stored as
//!   `name~empty`, and joined again when read. Iggy refuses empty bodies:
//!   appending one is an error that says so.
//! - **Appends are per partition and per request.** Iggy stores a request
//!   whole or not at all, but a call that fails part-way may have reached
//!   some partitions, and plain appends go 1 000 messages per request.
//!   [`EventLog::append_as`] therefore sends each partition's records in one
//!   request, stamps every message with its producer and sequence number
//!   (headers `waku-producer` and `waku-sequence`) and a deterministic
//!   message id, and
//!   [`EventLog::producer_sequence`] reads the stamp back from the tail of
//!   the partition (at most the last 100 000 messages, once per producer
//!   and partition; after that the client remembers what it appended), so
//!   a retry completes the partitions the first try missed and skips the
//!   others.
//! - **Every message has a deterministic id.** Stamped ones from the
//!   producer, partition, sequence and index (the same for any client that
//!   resends them); plain ones from this client, the append call, the
//!   partition and the index, so a request the client replays after a
//!   reconnect carries the same ids.
//! - **Unreadable headers are a header error.** The client answers a
//!   malformed header block with "no headers"; the record then has none, and
//!   the consumer dead-letters it for its missing envelope.
//! - **Errors carry codes, not text** over TCP: they are matched by variant.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use iggy::prelude::{
    Client, Consumer, ConsumerOffsetClient, HeaderKey, HeaderKind, HeaderValue, Identifier, IggyClient, IggyError,
    IggyMessage, MessageClient, Partitioning, PollingStrategy, StreamClient, TopicClient, TopicCreateOptions,
};
use rustc_hash::FxHashMap;

use super::{EventLog, LogError, Record, StoredRecord};
use crate::event::Header;
use crate::event::header_name::TAG;

/// The header naming the producer of an [`EventLog::append_as`].
const PRODUCER: &str = "waku-producer";
/// The header holding the sequence number of an [`EventLog::append_as`].
const SEQUENCE: &str = "waku-sequence";
/// Most messages per send and per poll.
const CHUNK: usize = 1000;
/// How far back from a partition's end [`EventLog::producer_sequence`]
/// looks for the producer's last stamp.
const STAMP_WINDOW: u64 = 100_000;

/// An Iggy server's stream, as a log.
pub struct IggyLog {
    /// The connection; replaced by a fresh one after the session broke.
    client: tokio::sync::RwLock<Arc<IggyClient>>,
    /// Set when an error showed the session is gone.
    broken: AtomicBool,
    url: String,
    stream: Identifier,
    address: PathBuf,
    /// The last sequence each producer stamped on a partition, as read from
    /// the partition once and then as appended by this client: a producer
    /// name belongs to one state store, which one process holds.
    stamps: std::sync::Mutex<FxHashMap<(String, u32, String), Option<u64>>>,
    /// Names this client in the ids of plain appends' messages.
    client_id: u64,
    /// Plain appends made so far, numbering them in message ids.
    appends: AtomicU64,
}

impl IggyLog {
    /// Connects to the server at `url` (`iggy://user:password@host:port`,
    /// with the client's options such as `?reconnection_interval=2s`) and
    /// uses `stream`, creating it if it does not exist.
    ///
    /// The client gives up a lost connection after 3 tries unless the URL
    /// sets `reconnection_retries` (see [`with_bounded_reconnection`]); the
    /// consumer keeps trying after that, with its own backoff, and reports
    /// the outage.
    pub async fn connect(url: &str, stream: &str) -> Result<Self, LogError> {
        let address = PathBuf::from(redact(url));
        let failed = |e: IggyError| match e {
            IggyError::InvalidConnectionString | IggyError::InvalidNumberValue => storage(
                &address,
                "connecting (the URL must read iggy://user:password@host:port, optionally followed by \
                 ?option=value&… with the Iggy client's options)",
                e,
            ),
            e => storage(&address, "connecting", e),
        };
        let client = new_client(url).await.map_err(failed)?;
        let stream_id = Identifier::named(stream).map_err(|_| LogError::InvalidTopicName {
            topic: stream.to_owned(),
            reason: "Iggy cannot name a stream so",
        })?;
        if client.get_stream(&stream_id).await.map_err(failed)?.is_none() {
            match client.create_stream(stream).await {
                Ok(_) | Err(IggyError::StreamNameAlreadyExists(_)) => {}
                Err(e) => return Err(failed(e)),
            }
        }
        Ok(Self {
            client: tokio::sync::RwLock::new(Arc::new(client)),
            broken: AtomicBool::new(false),
            url: url.to_owned(),
            stream: stream_id,
            address,
            stamps: Default::default(),
            client_id: rand::random(),
            appends: AtomicU64::new(0),
        })
    }

    /// The client, reconnected first if the last error showed the session
    /// is gone (a restarted server does not know it; the old client cannot
    /// bind a new one).
    async fn client(&self) -> Result<Arc<IggyClient>, LogError> {
        if self.broken.load(Ordering::SeqCst) {
            let mut client = self.client.write().await;
            if self.broken.load(Ordering::SeqCst) {
                let fresh = new_client(&self.url).await.map_err(|e| self.storage("reconnecting", e))?;
                let _ = client.disconnect().await;
                *client = Arc::new(fresh);
                self.broken.store(false, Ordering::SeqCst);
            }
        }
        Ok(self.client.read().await.clone())
    }

    fn storage(&self, what: &str, error: IggyError) -> LogError {
        let error = storage(&self.address, what, error);
        if matches!(error, LogError::Unavailable { .. }) {
            self.broken.store(true, Ordering::SeqCst);
        }
        error
    }

    fn topic_id(&self, topic: &str) -> Result<Identifier, LogError> {
        Identifier::named(topic)
            .map_err(|_| LogError::InvalidTopicName { topic: topic.to_owned(), reason: "Iggy cannot name a topic so" })
    }

    async fn topic_details(&self, topic: &str) -> Result<iggy::prelude::TopicDetails, LogError> {
        let id = self.topic_id(topic)?;
        match self.client().await?.get_topic(&self.stream, &id).await {
            Ok(Some(details)) => Ok(details),
            Ok(None) | Err(IggyError::TopicIdNotFound(..) | IggyError::TopicNameNotFound(..)) => {
                Err(LogError::TopicNotFound { topic: topic.to_owned() })
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
            client
                .send_messages(&self.stream, &id, &partitioning, chunk)
                .await
                .map_err(|e| self.storage("appending", e))?;
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
            if let Some((producer, sequence)) = stamp
                && self.producer_sequence(topic, partition, producer).await?.is_some_and(|known| known >= sequence)
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
                // After a failed send the partition's stamp is unknown.
                let mut stamps = self.stamps.lock().unwrap_or_else(|e| e.into_inner());
                match sent {
                    Ok(()) => stamps.insert(key, Some(sequence)),
                    Err(_) => stamps.remove(&key),
                };
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
                let options =
                    TopicCreateOptions { partitions_count: Some(partitions), ..TopicCreateOptions::default() };
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

    async fn producer_sequence(&self, topic: &str, partition: u32, producer: &str) -> Result<Option<u64>, LogError> {
        let key = (topic.to_owned(), partition, producer.to_owned());
        if let Some(&known) = self.stamps.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(known);
        }
        // A producer's stamps rise with the offset: the last one found,
        // reading back from the end, is the highest.
        let end = self.end_offset(topic, partition).await?;
        let window = end.saturating_sub(STAMP_WINDOW);
        let mut highest = None;
        let mut upto = end;
        while upto > window && highest.is_none() {
            let from = upto.saturating_sub(CHUNK as u64).max(window);
            for record in self.read(topic, partition, from, (upto - from) as usize).await? {
                let header = |name: &str| record.record.headers.iter().find(|h| h.name == name);
                if header(PRODUCER).is_some_and(|h| h.value == producer.as_bytes())
                    && let Some(sequence) = header(SEQUENCE).and_then(|h| <[u8; 8]>::try_from(h.value.as_slice()).ok())
                {
                    highest = highest.max(Some(u64::from_le_bytes(sequence)));
                }
            }
            upto = from;
        }
        self.stamps.lock().unwrap_or_else(|e| e.into_inner()).insert(key, highest);
        Ok(highest)
    }

    async fn read(&self, topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<StoredRecord>, LogError> {
        if max == 0 {
            self.check_partition(topic, partition).await?;
            return Ok(Vec::new());
        }
        let id = self.topic_id(topic)?;
        let consumer = Consumer::new(Identifier::named("waku-reader").expect("a valid name"));
        let mut records = Vec::new();
        let mut at = from;
        while records.len() < max {
            let count = (max - records.len()).min(CHUNK) as u32;
            let polled = self
                .client()
                .await?
                .poll_messages(
                    &self.stream,
                    &id,
                    Some(partition),
                    &consumer,
                    &PollingStrategy::offset(at),
                    count,
                    false,
                )
                .await
                .map_err(|e| match e {
                    IggyError::TopicIdNotFound(..) | IggyError::TopicNameNotFound(..) => {
                        LogError::TopicNotFound { topic: topic.to_owned() }
                    }
                    IggyError::PartitionNotFound(..) => {
                        LogError::PartitionNotFound { topic: topic.to_owned(), partition, partitions: 0 }
                    }
                    e => self.storage("reading", e),
                });
            let polled = match polled {
                // Name the real partition count in the error.
                Err(LogError::PartitionNotFound { .. }) => {
                    self.check_partition(topic, partition).await?;
                    return Err(self.storage(
                        "reading",
                        IggyError::PartitionNotFound(partition as usize, self.stream.clone(), id),
                    ));
                }
                other => other?,
            };
            let Some(last) = polled.messages.last().map(|m| m.header.offset) else { break };
            for message in polled.messages {
                if message.header.offset >= at {
                    records.push(from_message(message));
                }
            }
            at = last + 1;
        }
        records.truncate(max);
        Ok(records)
    }

    async fn end_offset(&self, topic: &str, partition: u32) -> Result<u64, LogError> {
        let details = self.topic_details(topic).await?;
        let partitions = details.partitions_count;
        details
            .partitions
            .iter()
            .find(|p| p.id == partition)
            .map(|p| p.messages_count)
            .ok_or(LogError::PartitionNotFound { topic: topic.to_owned(), partition, partitions })
    }

    async fn store_consumer_offset(
        &self,
        consumer: &str,
        topic: &str,
        partition: u32,
        next: u64,
    ) -> Result<(), LogError> {
        self.check_partition(topic, partition).await?;
        if next == 0 {
            return Ok(()); // Iggy stores the last consumed offset; nothing consumed yet.
        }
        let consumer = Consumer::new(self.topic_id(consumer)?);
        let id = self.topic_id(topic)?;
        self.client()
            .await?
            .store_consumer_offset(&consumer, &self.stream, &id, Some(partition), next - 1)
            .await
            .map_err(|e| self.storage("storing a consumer offset", e))
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
}

/// A connected client for `url`.
async fn new_client(url: &str) -> Result<IggyClient, IggyError> {
    let client = IggyClient::from_connection_string(&with_bounded_reconnection(url))?;
    client.connect().await?;
    Ok(client)
}

/// A record as an Iggy message with id `id`: headers as user headers (see
/// the module docs), stamped when `stamp` is given.
fn to_message(
    topic: &str,
    partition: u32,
    record: Record,
    stamp: Option<(&str, u64)>,
    id: u128,
) -> Result<IggyMessage, LogError> {
    let invalid = |reason: String| LogError::Storage {
        path: PathBuf::from(topic),
        source: format!("cannot append to partition {partition}: {reason}").into(),
    };
    if record.body.is_empty() {
        return Err(invalid("Iggy refuses messages with an empty body".into()));
    }
    let mut headers = BTreeMap::new();
    let mut put = |name: &str, value: HeaderValue| -> Result<(), LogError> {
        let key =
            HeaderKey::from_str(name).map_err(|_| invalid(format!("header name {name:?} is not valid in Iggy")))?;
        headers.insert(key, value);
        Ok(())
    };
    for Header { name, value } in &record.headers {
        match (name.as_str(), value.len()) {
            (TAG, 4) => put(name, HeaderValue::from(u32::from_le_bytes(value[..].try_into().expect("4 bytes"))))?,
            (_, 0) => put(&format!("{name}~empty"), HeaderValue::from(0u8))?,
            _ => {
                for (index, piece) in value.chunks(255).enumerate() {
                    let key = if index == 0 { name.clone() } else { format!("{name}~{index}") };
                    let piece = HeaderValue::from_raw(HeaderKind::Raw, piece).expect("1 to 255 bytes");
                    put(&key, piece)?;
                }
            }
        }
    }
    if let Some((producer, sequence)) = stamp {
        put(
            PRODUCER,
            HeaderValue::from_raw(HeaderKind::Raw, producer.as_bytes())
                .map_err(|_| invalid(format!("producer name {producer:?} must have 1 to 255 bytes")))?,
        )?;
        put(SEQUENCE, HeaderValue::from_raw(HeaderKind::Raw, &sequence.to_le_bytes()).expect("8 bytes"))?;
    }
    IggyMessage::builder()
        .id(id)
        .payload(Bytes::from(record.body))
        .user_headers(headers)
        .build()
        .map_err(|e| invalid(format!("{e}")))
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
/// little-endian bytes this crate writes, split values joined.
fn from_message(message: IggyMessage) -> StoredRecord {
    let mut headers: Vec<Header> = Vec::new();
    // Malformed header bytes come back as "no headers": the record then has
    // no envelope, which the consumer reports as a header error.
    if let Ok(Some(map)) = message.user_headers_map() {
        let mut pieces: BTreeMap<String, Vec<(usize, Vec<u8>)>> = BTreeMap::new();
        for (key, value) in map {
            let key = key.as_str().map_or_else(|_| String::from_utf8_lossy(key.as_bytes()).into_owned(), str::to_owned);
            let bytes = match value.kind() {
                HeaderKind::Uint32 => value.as_uint32().map(|v| v.to_le_bytes().to_vec()).unwrap_or_default(),
                HeaderKind::Uint64 => value.as_uint64().map(|v| v.to_le_bytes().to_vec()).unwrap_or_default(),
                _ => value.as_bytes().to_vec(),
            };
            match key.rsplit_once('~') {
                Some((name, "empty")) => pieces.entry(name.to_owned()).or_default().push((0, Vec::new())),
                Some((name, index)) if index.parse::<usize>().is_ok() => {
                    pieces.entry(name.to_owned()).or_default().push((index.parse().expect("checked"), bytes))
                }
                _ => pieces.entry(key).or_default().push((0, bytes)),
            }
        }
        for (name, mut parts) in pieces {
            parts.sort_by_key(|(index, _)| *index);
            headers.push(Header { name, value: parts.into_iter().flat_map(|(_, bytes)| bytes).collect() });
        }
    }
    StoredRecord { offset: message.header.offset, record: Record { headers, body: message.payload.to_vec() } }
}

fn storage(address: &std::path::Path, what: &str, error: IggyError) -> LogError {
    let reason = format!("{what} failed: {error} (Iggy error {})", error.as_code());
    match error {
        IggyError::Disconnected
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

/// `url`, with `reconnection_retries` bounded unless the URL sets it.
///
/// The client otherwise retries a lost connection forever inside whichever
/// call noticed it, so a server that is down would stall the host without a
/// word. Bounded, the call fails as [`LogError::Unavailable`] after a few
/// seconds; the consumer then reports the outage and keeps trying with its
/// own backoff, and start-up against an unreachable server ends with an
/// error instead of waiting silently.
fn with_bounded_reconnection(url: &str) -> String {
    const DEFAULT: &str = "reconnection_retries=3";
    match url.split_once('?') {
        None => format!("{url}?{DEFAULT}"),
        Some((_, query)) if query.split('&').any(|option| option.starts_with("reconnection_retries=")) => {
            url.to_owned()
        }
        Some(_) => format!("{url}&{DEFAULT}"),
    }
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(scheme), Some(at)) if scheme < at => {
            let credentials = &url[scheme + 3..at];
            let user = credentials.split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::header_name::KEY;

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
    fn an_empty_body_is_refused_by_name_and_ids_are_deterministic() {
        let error = to_message("t", 1, Record { headers: vec![], body: vec![] }, None, 1).unwrap_err();
        assert!(error.to_string().contains("`t`") || format!("{error:?}").contains("empty body"), "{error:?}");
        assert_eq!(stamped_message_id("p", 0, 7, 1), stamped_message_id("p", 0, 7, 1));
        assert_ne!(stamped_message_id("p", 0, 7, 1), stamped_message_id("p", 0, 7, 2));
        let ids: std::collections::HashSet<u128> = (0..4)
            .flat_map(|call| (0..3).flat_map(move |partition| (0..100).map(move |i| (call, partition, i))))
            .map(|(call, partition, index)| plain_message_id(0xabcd_ef01_2345_6789, call, partition, index))
            .collect();
        assert_eq!(ids.len(), 4 * 3 * 100, "plain ids differ by call, partition and index");
        assert_eq!(plain_message_id(5, 1, 2, 3), plain_message_id(5, 1, 2, 3));
        assert_eq!(redact("iggy://iggy:secret@127.0.0.1:8090"), "iggy://iggy:***@127.0.0.1:8090");
    }

    #[test]
    fn reconnection_is_bounded_unless_the_url_says_otherwise() {
        let url = "iggy://u:p@h:1";
        assert_eq!(with_bounded_reconnection(url), "iggy://u:p@h:1?reconnection_retries=3");
        assert_eq!(
            with_bounded_reconnection("iggy://u:p@h:1?nodelay=true"),
            format!("{url}?nodelay=true&reconnection_retries=3")
        );
        let unlimited = "iggy://u:p@h:1?nodelay=true&reconnection_retries=unlimited";
        assert_eq!(with_bounded_reconnection(unlimited), unlimited);
    }
}
