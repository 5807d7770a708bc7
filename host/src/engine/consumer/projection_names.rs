//! What a batch needs of its projection besides its modules and its store:
//! its name, its topics, and where its failures go. Shared by every batch
//! of a consumer, so a batch clones no string.

use crate::engine::projection::Projection;
use crate::engine::routing::RoutedTopics;
use crate::storage::state::OutboxEntry;

/// What a batch needs of its projection besides its modules and its store:
/// its name, its topics and where its failures go.
pub(super) struct ProjectionNames {
    name: String,
    topics: Vec<String>,
    routed: RoutedTopics,
}

impl ProjectionNames {
    /// The names given.
    pub(super) fn new(name: String, topics: Vec<String>, routed: RoutedTopics) -> Self {
        Self { name, topics, routed }
    }

    /// The names of `projection`.
    pub(super) fn of(projection: &Projection) -> Self {
        Self::new(projection.name().to_owned(), projection.topics().to_vec(), projection.routed_topics().clone())
    }

    /// The projection's name.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// Its first topic, whose retry and dead-letter topics it routes to.
    pub(super) fn topic(&self) -> &str {
        &self.topics[0]
    }

    /// Every topic it consumes, in the order given.
    pub(super) fn topics(&self) -> &[String] {
        &self.topics
    }

    /// Where its failures go.
    pub(super) fn routed_topics(&self) -> &RoutedTopics {
        &self.routed
    }

    /// The name of the projection's topic of index `topic` (an
    /// [`Origin::topic`]); the first for an index it does not have.
    pub(super) fn topic_name(&self, topic: u32) -> &str {
        self.topics.get(topic as usize).map_or(self.topic(), String::as_str)
    }

    /// An outbox entry for the retry or dead-letter topic (`topic_of` the
    /// projection's topic), to the partition the event came from.
    pub(super) fn routed_entry(
        &self,
        topic_of: fn(&RoutedTopics) -> &str,
        partition: u32,
        key_hash: u64,
        record: crate::storage::log::Record,
    ) -> OutboxEntry {
        let topic = topic_of(&self.routed).to_owned();
        OutboxEntry { topic, partition_key: key_hash, partition: Some(partition), record, origin: None }
    }
}
