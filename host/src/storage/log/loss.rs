//! When the log does not keep what it acknowledged, or no longer holds
//! what it once did: durability of topics, a lost tail, a lost head.
//!
//! The host's promise that every event ends applied, in retry or
//! dead-lettered, exactly once, holds only if an append the log
//! acknowledged is stored. This module says what the host does when that
//! is not so, or may not be.
//!
//! Rules kept here:
//! - **Durability is read, not assumed.** [`EventLog::durability`] says
//!   whether an acknowledged append to a topic survives a crash of the
//!   log's server. The embedded log commits every append durably (a redb
//!   transaction); Iggy decides per topic when the topic is created
//!   (`enforce_fsync` and `messages_required_to_save`, see
//!   [`super::iggy`]), and the topics the host creates there are durable
//!   unless the log was opened with `--lossy-topics`.
//! - **A topic the host appends to must be durable** ([`require_durable`]):
//!   retry, dead-letter and emit topics. One that is not (or whose
//!   durability the log cannot report) refuses the start
//!   ([`LogError::LossyTopic`], naming the topic, the setting and how to
//!   change it) unless the log was opened accepting lossy topics, which
//!   is then said in a warning. The source topic only gets a warning
//!   ([`warn_if_lossy`]): what it loses was never read.
//! - **A lost tail is noticed** ([`Truncation::detect`]): a partition
//!   whose end offset is below the host's position, or below an end offset
//!   read earlier, lost the offsets in between (a server that lost
//!   acknowledged messages, a topic deleted and created again under the
//!   same name). The consumer logs it as an error, counts it
//!   (`waku_log_truncated_total`), records it with the projection's state
//!   ([`record`]), so `waku status` shows it, and follows the new end
//!   instead of waiting for offsets that no longer exist. When the
//!   projection already applied events from the lost offsets, the log
//!   will store new messages at those offsets, which reading on from the
//!   position would skip without a word: the partition stops instead, at
//!   every start, until `waku reset` moves it ([`clear`]).
//! - **A topic created again is recognised** by its identity
//!   ([`EventLog::topic_identity`]: Iggy's topic id and creation time),
//!   recorded with the projection's state the first time the host reads
//!   the topic ([`check_identity`]). A topic whose identity changed is a
//!   new topic: every partition the projection had read from lost all it
//!   had.
//! - **A lost head is said** ([`lost_history`]): retention (Iggy's message
//!   expiry, a maximum topic size) deletes the oldest messages, so a
//!   partition's first offset ([`EventLog::extent`]) may be above 0. A
//!   replay from the earliest offset (`waku reset --to earliest`, `waku
//!   rebuild`) then builds a read model of part of the history; it is
//!   refused unless the operator accepts it explicitly
//!   (`--accept-lost-history`), after saying how many messages are gone.
//!
//! What cannot be noticed: a server that lost messages and had as many
//! appended again before the host looked shows the same end offsets as
//! before; only the topic's durability prevents that.

use serde::{Deserialize, Serialize};

use super::{EventLog, LogError};
use crate::storage::state::{StateError, StateStore};

/// Whether an acknowledged append to a topic survives a crash of the log's
/// server ([`EventLog::durability`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Durability {
    /// Every acknowledged append is stored before it is acknowledged.
    Durable,
    /// An acknowledged append may be lost; `setting` says which setting
    /// makes it so, as the log names it.
    Lossy {
        /// The setting and its value, e.g. `enforce_fsync = false`.
        setting: String,
    },
    /// The log cannot say; `reason` says why.
    Unknown {
        /// Why the durability is unknown.
        reason: String,
    },
}

/// What the host uses a topic for, as its durability messages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicRole {
    /// The topic a projection consumes.
    Source,
    /// A projection's retry topic.
    Retry,
    /// A projection's dead-letter topic.
    DeadLetter,
    /// A topic modules emit to.
    Emit,
}

impl std::fmt::Display for TopicRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Source => "the consumed topic",
            Self::Retry => "a retry topic",
            Self::DeadLetter => "a dead-letter topic",
            Self::Emit => "an emit topic",
        })
    }
}

/// How to make a topic durable, for messages.
pub const HOW_TO_MAKE_DURABLE: &str = "create it with enforce_fsync = true and messages_required_to_save = 1 (Iggy \
                                       cannot change them on an existing topic; the host creates its topics so), or \
                                       accept losing acknowledged appends with --lossy-topics (WAKU_LOSSY_TOPICS=true, \
                                       `lossy-topics = true` in waku.toml)";

/// Checks that an acknowledged append to `topic`, which the host appends
/// to as `role`, survives a crash of the log's server: a topic that may
/// lose one (or whose durability is unknown) is [`LogError::LossyTopic`],
/// unless the log accepts lossy topics ([`EventLog::accepts_lossy_topics`]),
/// which is then logged as a warning.
pub async fn require_durable<L: EventLog>(log: &L, topic: &str, role: TopicRole) -> Result<(), LogError> {
    let setting = match log.durability(topic).await? {
        Durability::Durable => return Ok(()),
        Durability::Lossy { setting } => setting,
        Durability::Unknown { reason } => format!("durability unknown: {reason}"),
    };
    if log.accepts_lossy_topics() {
        tracing::warn!(
            topic,
            "topic `{topic}` ({role}) can lose acknowledged appends when the log server crashes ({setting}); \
             accepted (--lossy-topics): an event whose record is lost there is lost with it"
        );
        return Ok(());
    }
    Err(LogError::LossyTopic { topic: topic.to_owned(), role, setting })
}

/// Warns when the consumed `topic` can lose acknowledged appends: what it
/// loses the host never reads, so it is not refused.
pub async fn warn_if_lossy<L: EventLog>(log: &L, topic: &str) -> Result<(), LogError> {
    let setting = match log.durability(topic).await? {
        Durability::Durable => return Ok(()),
        Durability::Lossy { setting } => setting,
        Durability::Unknown { reason } => format!("durability unknown: {reason}"),
    };
    tracing::warn!(
        topic,
        "topic `{topic}` ({}) can lose acknowledged appends when the log server crashes ({setting}): events \
         published to it may be lost before the host reads them; to avoid it, {HOW_TO_MAKE_DURABLE}",
        TopicRole::Source
    );
    Ok(())
}

/// A partition that lost offsets it once held: its end offset went back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncation {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The end offset found: the first offset gone.
    pub end: u64,
    /// The end offset the host knew (read earlier, or its position, the
    /// higher): offsets `end..known_end` are gone.
    pub known_end: u64,
    /// The projection's committed position when it was found.
    pub position: u64,
    /// Whether the topic was deleted and created again (its identity
    /// changed): then every offset below `known_end` is gone.
    pub recreated: bool,
    /// When it was found, in milliseconds since the Unix epoch.
    pub found_at_ms: u64,
}

impl Truncation {
    /// The truncation of a partition whose end offset is `end` now, where
    /// the host is at `position` and read `known_end` before; `None` when
    /// nothing was lost (the end is at or above both).
    pub fn detect(topic: &str, partition: u32, position: u64, known_end: u64, end: u64) -> Option<Self> {
        let known_end = known_end.max(position);
        (end < known_end).then(|| Self {
            topic: topic.to_owned(),
            partition,
            end,
            known_end,
            position,
            recreated: false,
            found_at_ms: crate::platform::clock::now_ms(),
        })
    }

    /// The first offset gone.
    pub fn gone_from(&self) -> u64 {
        if self.recreated { 0 } else { self.end }
    }

    /// How many offsets are gone.
    pub fn gone(&self) -> u64 {
        self.known_end - self.gone_from()
    }

    /// Whether the projection applied events from offsets that are gone: the
    /// log will store other messages at them, so the partition stops.
    pub fn applied_lost(&self) -> bool {
        self.position > self.gone_from()
    }
}

impl std::fmt::Display for Truncation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (topic, partition) = (&self.topic, self.partition);
        let (from, to) = (self.gone_from(), self.known_end);
        match self.recreated {
            true => write!(
                f,
                "topic `{topic}` was deleted and created again (its identity changed): partition {partition} lost \
                 offsets {from}..{to} ({} messages; it now ends at {})",
                self.gone(),
                self.end
            )?,
            false => write!(
                f,
                "`{topic}` partition {partition} lost offsets {from}..{to} ({} messages): its end offset went back \
                 from {to} to {}; the log lost messages it had acknowledged",
                self.gone(),
                self.end
            )?,
        }
        if self.applied_lost() {
            write!(
                f,
                "; the projection already applied events from offsets {from}..{}, and the log will store other \
                 messages at them, so partition {partition} stops rather than skip them: decide with `waku reset` \
                 (`--to offset:{from}` applies what the log holds there now, `--to latest` skips it)",
                self.position
            )?;
        }
        Ok(())
    }
}

/// The host value under which a partition's truncation is recorded.
fn truncation_meta(topic: &str, partition: u32) -> String {
    format!("log-truncated/{topic}/{partition}")
}

/// The host value under which a topic's identity is recorded.
fn identity_meta(topic: &str) -> String {
    format!("log-identity/{topic}")
}

/// Records `truncation` with the projection's state, replacing an earlier
/// one of its partition that did not stop it (one that did is kept: it
/// stands until a reset).
pub fn record(store: &StateStore, truncation: &Truncation) -> Result<(), StateError> {
    if recorded(store, &truncation.topic, truncation.partition)?.is_some_and(|earlier| earlier.applied_lost()) {
        return Ok(());
    }
    let bytes = serde_json::to_vec(truncation).unwrap_or_default();
    store.set_meta(&truncation_meta(&truncation.topic, truncation.partition), &bytes)
}

/// The truncation recorded for a partition, if any.
pub fn recorded(store: &StateStore, topic: &str, partition: u32) -> Result<Option<Truncation>, StateError> {
    let bytes = store.meta(&truncation_meta(topic, partition))?;
    Ok(bytes.and_then(|bytes| serde_json::from_slice(&bytes).ok()))
}

/// Forgets the truncations recorded for `partitions` of `topic` and, with
/// `identity`, the topic's identity (`waku reset`: the operator decided),
/// so the next start records the identity the topic has then.
pub fn clear(store: &StateStore, topic: &str, partitions: &[u32], identity: bool) -> Result<(), StateError> {
    let mut names: Vec<String> = partitions.iter().map(|&partition| truncation_meta(topic, partition)).collect();
    if identity {
        names.push(identity_meta(topic));
    }
    for name in names {
        if store.meta(&name)?.is_some_and(|bytes| !bytes.is_empty()) {
            store.set_meta(&name, b"")?;
        }
    }
    Ok(())
}

/// Compares `topic`'s identity with the one recorded with the projection's
/// state, recording it when none is. When it changed (the topic was
/// deleted and created again), every partition the projection had read
/// from lost all it held: returns those truncations, recorded and logged,
/// and records the new identity.
pub async fn check_identity<L: EventLog>(
    log: &L,
    store: &StateStore,
    topic: &str,
) -> Result<Vec<Truncation>, LossError> {
    let Some(identity) = log.topic_identity(topic).await? else { return Ok(Vec::new()) };
    let name = identity_meta(topic);
    let known = store.meta(&name)?.filter(|bytes| !bytes.is_empty());
    let mut found = Vec::new();
    if let Some(known) = &known
        && known.as_slice() != identity.as_bytes()
    {
        let ends = log.end_offsets(topic).await?;
        for (partition, end) in (0u32..).zip(ends) {
            let position = store.position(topic, partition)?.unwrap_or(0);
            if position == 0 {
                continue;
            }
            let truncation = Truncation {
                topic: topic.to_owned(),
                partition,
                end,
                known_end: position,
                position,
                recreated: true,
                found_at_ms: crate::platform::clock::now_ms(),
            };
            tracing::error!(topic, partition, "{truncation}");
            record(store, &truncation)?;
            found.push(truncation);
        }
    }
    if known.as_deref() != Some(identity.as_bytes()) {
        store.set_meta(&name, identity.as_bytes())?;
    }
    Ok(found)
}

/// A partition whose oldest messages are gone (retention deleted them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostHead {
    /// The partition.
    pub partition: u32,
    /// Its first offset: offsets below it are gone.
    pub first: u64,
    /// Its end offset.
    pub end: u64,
}

/// The partitions of `topic` whose first offset is above 0: a replay from
/// the earliest offset would lack `first` messages of each.
pub async fn lost_history<L: EventLog>(log: &L, topic: &str) -> Result<Vec<LostHead>, LogError> {
    let mut lost = Vec::new();
    for partition in 0..log.partitions(topic).await? {
        let (first, end) = log.extent(topic, partition).await?;
        if first > 0 {
            lost.push(LostHead { partition, first, end });
        }
    }
    Ok(lost)
}

/// A replay from the earliest offset refused because the log no longer
/// holds the start of `topic`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{topic}` no longer holds its oldest messages ({}): a replay from the earliest offset would build a read \
     model that lacks them while reporting success; pass --accept-lost-history to replay what is left",
    describe_lost(lost)
)]
pub struct LostHistory {
    /// The topic.
    pub topic: String,
    /// Its partitions that lost their head.
    pub lost: Vec<LostHead>,
}

/// Why a check of what the log lost failed: the log or the state could
/// not be read, or the history asked for is gone.
#[derive(Debug, thiserror::Error)]
pub enum LossError {
    /// The log could not be read.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The state could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
    /// The log no longer holds the oldest messages a replay needs.
    #[error(transparent)]
    LostHistory(Box<LostHistory>),
}

/// `partition 0: offsets 0..120 gone (120 messages), …`.
pub fn describe_lost(lost: &[LostHead]) -> String {
    let parts: Vec<String> = lost
        .iter()
        .map(|head| format!("partition {}: offsets 0..{} gone ({} messages)", head.partition, head.first, head.first))
        .collect();
    parts.join(", ")
}

/// [`lost_history`], refused as [`LostHistory`] unless `accept`; accepted,
/// what is gone is logged as a warning and returned.
pub async fn refuse_lost_history<L: EventLog>(log: &L, topic: &str, accept: bool) -> Result<Vec<LostHead>, LossError> {
    let lost = lost_history(log, topic).await?;
    if lost.is_empty() {
        return Ok(lost);
    }
    if !accept {
        return Err(LossError::LostHistory(Box::new(LostHistory { topic: topic.to_owned(), lost })));
    }
    tracing::warn!(topic, "replaying `{topic}` without its oldest messages (accepted): {}", describe_lost(&lost));
    Ok(lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_below_the_position_or_an_earlier_end_is_a_truncation() {
        assert_eq!(Truncation::detect("t", 0, 10, 10, 10), None);
        assert_eq!(Truncation::detect("t", 0, 10, 50, 60), None, "a higher end is new messages");
        let below_earlier = Truncation::detect("t", 0, 10, 50, 30).unwrap();
        assert_eq!((below_earlier.gone_from(), below_earlier.gone(), below_earlier.applied_lost()), (30, 20, false));
        let below_position = Truncation::detect("t", 1, 40, 30, 25).unwrap();
        assert_eq!((below_position.known_end, below_position.gone(), below_position.applied_lost()), (40, 15, true));
        let text = below_position.to_string();
        assert!(text.contains("`t` partition 1 lost offsets 25..40 (15 messages)"), "{text}");
        assert!(text.contains("applied events from offsets 25..40"), "{text}");
        assert!(text.contains("waku reset"), "{text}");
        let recreated = Truncation { recreated: true, ..below_earlier };
        assert_eq!((recreated.gone_from(), recreated.gone(), recreated.applied_lost()), (0, 50, true));
    }

    #[test]
    fn lost_heads_are_counted_per_partition() {
        let lost = [LostHead { partition: 0, first: 120, end: 300 }, LostHead { partition: 2, first: 5, end: 9 }];
        assert_eq!(
            describe_lost(&lost),
            "partition 0: offsets 0..120 gone (120 messages), partition 2: offsets 0..5 gone (5 messages)"
        );
        let error = LostHistory { topic: "t".into(), lost: lost.to_vec() }.to_string();
        assert!(error.contains("--accept-lost-history"), "{error}");
    }
}
