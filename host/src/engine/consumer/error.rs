//! Why consuming stopped: [`ConsumerError`], one variant per cause a
//! caller can act on, with the values that name the problem. Log and state
//! failures stay what they are wherever they happened (the outbox's and
//! the loss checks' included), so an unavailable log is waited out the
//! same way everywhere.

use wakuwaku_core::release::ReleaseError;

use crate::engine::outbox::OutboxError;
use crate::storage::log::LogError;
use crate::storage::log::loss::{LossError, LostHistory, Truncation};
use crate::storage::state::StateError;

/// Why consuming stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The state store failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// A partition this consumer was told to own does not exist.
    #[error("topic `{topic}` has {partitions} partitions; partition {partition} does not exist")]
    NoSuchPartition {
        /// The topic.
        topic: String,
        /// The partition asked for.
        partition: u32,
        /// How many the topic has.
        partitions: u32,
    },
    /// The topics of a projection over several topics have different
    /// partition counts: a key would not land in the same partition index
    /// in each.
    #[error(
        "the topics of a projection must have the same number of partitions (co-partitioned), but {}",
        .counts.iter().map(|(topic, count)| format!("`{topic}` has {count}")).collect::<Vec<_>>().join(", ")
    )]
    NotCoPartitioned {
        /// Each topic with its partition count, in the order given.
        counts: Vec<(String, u32)>,
    },
    /// A topic the projection no longer reads holds events in the
    /// partition index's release stage (its last checkpoint lists them):
    /// run on without it, they would never be applied.
    #[error(
        "topic `{topic}` partition {partition} has {held} events held in the event-time stage (offsets from \
         {first}), and the projection no longer reads it: run once more with it (`--topic {topic}`) until caught \
         up, which applies every held event, then without it"
    )]
    HeldByRemovedTopic {
        /// The topic no longer given.
        topic: String,
        /// The partition index.
        partition: u32,
        /// How many events its checkpoint lists as held.
        held: u64,
        /// The lowest held offset.
        first: u64,
    },
    /// A topic the projection now reads alone was read in the release
    /// stage, and its checkpoint (written before checkpoints listed held
    /// events) does not say which events below `read_to` were applied.
    #[error(
        "topic `{topic}` partition {partition} was read in event-time order with other topics up to offset \
         {read_to}, and its checkpoint does not list which events from offset {commit} on were applied: run once \
         more with the projection's other topics until caught up, then with `{topic}` alone"
    )]
    ReleasedUnlisted {
        /// The topic read alone now.
        topic: String,
        /// The partition index.
        partition: u32,
        /// Its committed position.
        commit: u64,
        /// Where the release stage had read it to.
        read_to: u64,
    },
    /// The release stage refused a call: a bug in the host, never message
    /// content.
    #[error("the release stage refused a call: {0}")]
    Release(ReleaseError),
    /// A retry or dead-letter topic exists with another partition count
    /// than its main topic; records could not keep their partition.
    #[error(
        "topic `{routed}` has {existing} partitions but its main topic `{topic}` has {partitions}; they must match \
         (delete `{routed}` or give it {partitions} partitions)"
    )]
    RoutedTopicMismatch {
        /// The main topic.
        topic: String,
        /// Its partition count.
        partitions: u32,
        /// The retry or dead-letter topic.
        routed: String,
        /// Its partition count.
        existing: u32,
    },
    /// The host failed under a handler call (its state store could not be
    /// read). Not the module's doing: the batch is not committed, and the
    /// partition tries it again after a backoff.
    #[error("host fault while handling a batch: {0}")]
    HostFault(String),
    /// A worker thread panicked (a bug in the host, never in a module).
    #[error("a consumer worker panicked: {0}")]
    WorkerPanicked(String),
    /// The outbox holds a record of the host's own it cannot append.
    #[error(transparent)]
    Outbox(OutboxError),
    /// A partition lost offsets from which the projection already applied
    /// events ([`loss`](crate::storage::log::loss)): it stops, at every start, until `waku reset`.
    #[error("{0}")]
    LogTruncated(Box<Truncation>),
    /// A replay from the earliest offset would lack messages retention
    /// deleted, and was not accepted ([`loss::refuse_lost_history`]).
    #[error(transparent)]
    LostHistory(Box<LostHistory>),
}

impl From<LossError> for ConsumerError {
    fn from(error: LossError) -> Self {
        match error {
            LossError::Log(error) => ConsumerError::Log(error),
            LossError::State(error) => ConsumerError::State(error),
            LossError::LostHistory(lost) => ConsumerError::LostHistory(lost),
        }
    }
}

impl From<OutboxError> for ConsumerError {
    /// Log and state failures stay what they are, so an unavailable log is
    /// waited out wherever it happened.
    fn from(error: OutboxError) -> Self {
        match error {
            OutboxError::Log(error) => Self::Log(error),
            OutboxError::State(error) => Self::State(error),
            error => Self::Outbox(error),
        }
    }
}

impl From<ReleaseError> for ConsumerError {
    fn from(error: ReleaseError) -> Self {
        ConsumerError::Release(error)
    }
}
