//! Dead letters: reading a topic's dead-letter topic, and re-driving its
//! records back through the normal path once the module is fixed.
//!
//! Rules kept here:
//! - **A dead letter is never removed.** The dead-letter topic is a log;
//!   re-driving a record marks it done in the projection's state (the
//!   `done` table, [`crate::state::BatchCommit::done`]) in the same
//!   transaction that queues its copy, so it is re-driven once.
//! - **Re-driven records take the retry path.** They are appended to the
//!   projection's retry topic (same partition) with no attempts made, so the
//!   consumer picks them up at once, behind any work of their key already
//!   waiting, and only the projection that dead-lettered them applies them
//!   again: a shared topic's other projections never see them.
//! - **Per-key order among re-driven records is the dead-letter order.**
//!   Each re-driven record acquires ([`routing::rewrite_orderings`] with one
//!   stage per record), so planning them again runs them one after another.
//! - **Nothing is half done.** The copies go through the projection's
//!   outbox: committed with the marks, then appended exactly once.
//! - **A host re-drives only the partitions it owns.** Hosts that spread a
//!   topic over disjoint partitions share its dead-letter topic but each
//!   keeps its own state store, and so its own marks. A host owns the
//!   partitions its store consumes: those it holds a position for. A dead
//!   letter is written in the commit that moves its partition's position,
//!   so every dead letter of a partition was written by a store that owns
//!   it. Re-driving another host's letter would queue a copy that host
//!   applies while only this store marks it, and the owner's own re-drive
//!   would apply it again; so [`redrive`] leaves other partitions alone and
//!   says which they are, refuses a partition or record it does not own,
//!   and refuses to act at all for a store that owns nothing. Running it
//!   twice, on one host or on each, applies every letter at most once.
//! - **A reset settles what came before.** `waku reset --to earliest`
//!   moves the projection's position in the dead-letter topic to its end
//!   ([`crate::reset`]): the events of the letters below it are replayed
//!   from the topic, so those letters count as re-driven and stay readable.

//! - **Only events are re-driven.** A message with unreadable headers needs
//!   a corrected message; a message a module emitted that could not be
//!   delivered (class `undeliverable`, 0 events, see [`crate::outbox`]) is
//!   not an event of the topic and is listed, never re-driven.

use crate::consumer::stat;
use crate::event::{EventHeaders, HeaderError};
use crate::key::Key;
use crate::log::{EventLog, LogError, Record};
use crate::outbox::{self, OutboxError};
use crate::routing::{self, FailureClass, Routed, RoutedTopics, dlq_topic, retry_topic};
use crate::state::{BatchCommit, OutboxEntry, StateError, StateStore};

/// One record of a dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its partition in the dead-letter topic (the partition it came from).
    pub partition: u32,
    /// Its offset in the dead-letter topic.
    pub offset: u64,
    /// Where it came from and why it failed.
    pub routed: Routed,
    /// Its event envelope, or why that cannot be read (a malformed message).
    pub envelope: Result<EventHeaders, HeaderError>,
    /// The record as stored.
    pub record: Record,
    /// Whether it was re-driven already (by this state store).
    pub redriven: bool,
    /// Whether its partition is owned by this state store (see the
    /// [module documentation](self)): only then may it be re-driven here,
    /// and only then does [`DeadLetter::redriven`] tell.
    pub owned: bool,
}

/// Which dead letters to act on. Empty fields select everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Only these partitions.
    pub partitions: Vec<u32>,
    /// Only these (partition, offset) records.
    pub records: Vec<(u32, u64)>,
    /// Only this key.
    pub key: Option<Key>,
}

impl Selection {
    fn picks(&self, letter: &DeadLetter) -> bool {
        self.covers(letter.partition)
            && (self.records.is_empty() || self.records.contains(&(letter.partition, letter.offset)))
            && self.key.as_ref().is_none_or(|key| letter.envelope.as_ref().is_ok_and(|e| e.key == *key))
    }

    /// Whether letters of `partition` may be selected.
    fn covers(&self, partition: u32) -> bool {
        (self.partitions.is_empty() || self.partitions.contains(&partition))
            && (self.records.is_empty() || self.records.iter().any(|&(p, _)| p == partition))
    }
}

/// What a re-drive did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redriven {
    /// The partitions it re-drove from: those this state store owns, as far
    /// as the selection reaches, in order.
    pub partitions: Vec<u32>,
    /// Records queued for another attempt.
    pub records: u64,
    /// Events they account for.
    pub events: u64,
    /// Selected records skipped because they were re-driven before.
    pub already: u64,
    /// Partitions holding selected dead letters that this state store does
    /// not own, left to the hosts that run them, in order.
    pub others: Vec<u32>,
    /// The selected dead letters in those partitions.
    pub left: u64,
}

/// Why reading or re-driving dead letters failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeadLetterError {
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The projection's state failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// Publishing the re-driven records failed after they were committed;
    /// they are published when the projection next runs.
    #[error("the re-driven records are committed but not yet appended (the next `waku run` appends them)")]
    Publish(#[source] OutboxError),
    /// A record of the dead-letter topic has unreadable routing headers.
    #[error("record {offset} of `{topic}` partition {partition} is not a dead letter: {error}")]
    NotADeadLetter {
        /// The dead-letter topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The offset.
        offset: u64,
        /// What is wrong with it.
        error: HeaderError,
    },
    /// No dead letter of the projection is at that place.
    #[error("projection `{projection}` has no dead letter at partition {partition}, offset {offset}")]
    NotFound {
        /// The projection.
        projection: String,
        /// The partition asked for.
        partition: u32,
        /// The offset asked for.
        offset: u64,
    },
    /// This state store owns no partition of the topic: it never consumed
    /// it, so none of its dead letters is this store's to re-drive.
    #[error(
        "this state store of projection `{projection}` holds no position in topic `{topic}`: it owns no partition, \
         so no dead letter is its to re-drive"
    )]
    NothingOwned {
        /// The projection.
        projection: String,
        /// The topic.
        topic: String,
    },
    /// A partition or record named for re-drive is in a partition this
    /// state store does not own.
    #[error(
        "partition {partition} of topic `{topic}` is not this state store's (it holds no position there); re-drive \
         it on the host that runs it"
    )]
    NotOwned {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
    },
    /// The selected record cannot go back through the normal path.
    #[error("dead letter at partition {partition}, offset {offset} cannot be re-driven: {reason}")]
    CannotRedrive {
        /// The partition.
        partition: u32,
        /// The offset.
        offset: u64,
        /// Why.
        reason: String,
    },
}

/// Where a projection's dead letters are read: a dead-letter topic and the
/// projection name its records carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shelf {
    dlq: String,
    tag: String,
    /// Only a store holding a position in `dlq` owns its letters: the
    /// promoted shadow's store does (set when it started), the live store
    /// before a promotion does not.
    marked_only: bool,
}

impl Shelf {
    /// `projection`'s own, in the topic's shared `dlq_<topic>`.
    pub fn shared(topic: &str, projection: &str) -> Self {
        Self { dlq: dlq_topic(topic), tag: projection.to_owned(), marked_only: false }
    }

    /// Those a rebuild of `projection` left, in its own
    /// `dlq_<topic>.rebuild` ([`RoutedTopics::shadow`]), tagged with the
    /// shadow's name: after a promotion they are the projection's.
    pub fn rebuilt(topic: &str, projection: &str) -> Self {
        let dlq = RoutedTopics::shadow(topic).dlq().to_owned();
        Self { dlq, tag: crate::rebuild::shadow_name(projection), marked_only: true }
    }

    /// Whether `store` owns the letters of `partition` on this shelf: it
    /// owns the partition of `topic` ([`owns`]), and for a rebuild's
    /// letters it is the store the rebuild built.
    fn owned_by(&self, store: &StateStore, topic: &str, partition: u32) -> Result<bool, StateError> {
        Ok(owns(store, topic, partition)? && (!self.marked_only || store.position(&self.dlq, partition)?.is_some()))
    }
}

/// The dead letters of `projection` on `topic`, in partition and offset
/// order, marked when they were re-driven already.
pub async fn list<L: EventLog>(
    log: &L,
    topic: &str,
    projection: &str,
    store: &StateStore,
) -> Result<Vec<DeadLetter>, DeadLetterError> {
    list_on(log, topic, &Shelf::shared(topic, projection), store).await
}

/// The dead letters on `shelf` of a projection of `topic`, as [`list`].
pub async fn list_on<L: EventLog>(
    log: &L,
    topic: &str,
    shelf: &Shelf,
    store: &StateStore,
) -> Result<Vec<DeadLetter>, DeadLetterError> {
    let dlq = shelf.dlq.clone();
    let mut letters = Vec::new();
    for partition in 0..log.partitions(&dlq).await? {
        let owned = shelf.owned_by(store, topic, partition)?;
        let redriven = store.done(&dlq, partition)?;
        // A reset to the earliest offset settles every dead letter before it
        // (its event is replayed from the topic): they count as re-driven.
        let settled_below = store.position(&dlq, partition)?.unwrap_or(0);
        let end = log.end_offset(&dlq, partition).await?;
        let mut from = 0;
        while from < end {
            let records = log.read(&dlq, partition, from, 4096).await?;
            let Some(last) = records.last().map(|r| r.offset) else { break };
            for stored in records {
                let routed = Routed::parse(&stored.record.headers).map_err(|error| {
                    DeadLetterError::NotADeadLetter { topic: dlq.clone(), partition, offset: stored.offset, error }
                })?;
                if routed.projection != shelf.tag {
                    continue;
                }
                letters.push(DeadLetter {
                    partition,
                    offset: stored.offset,
                    routed,
                    envelope: EventHeaders::parse_stored(&stored.record.headers),
                    record: stored.record,
                    redriven: stored.offset < settled_below || redriven.binary_search(&stored.offset).is_ok(),
                    owned,
                });
            }
            from = last + 1;
        }
    }
    Ok(letters)
}

/// Whether this state store owns `partition` of `topic`: it holds a
/// position there, so it consumes it (see the [module documentation](self)).
fn owns(store: &StateStore, topic: &str, partition: u32) -> Result<bool, StateError> {
    Ok(store.position(topic, partition)?.is_some())
}

/// One dead letter of `projection`.
pub async fn show<L: EventLog>(
    log: &L,
    topic: &str,
    projection: &str,
    store: &StateStore,
    partition: u32,
    offset: u64,
) -> Result<DeadLetter, DeadLetterError> {
    show_on(log, topic, &Shelf::shared(topic, projection), store, partition, offset).await
}

/// One dead letter on `shelf`, as [`show`].
pub async fn show_on<L: EventLog>(
    log: &L,
    topic: &str,
    shelf: &Shelf,
    store: &StateStore,
    partition: u32,
    offset: u64,
) -> Result<DeadLetter, DeadLetterError> {
    list_on(log, topic, shelf, store)
        .await?
        .into_iter()
        .find(|l| l.partition == partition && l.offset == offset)
        .ok_or_else(|| DeadLetterError::NotFound { projection: shelf.tag.clone(), partition, offset })
}

/// Re-drives the selected dead letters of `projection` in the partitions
/// this state store owns: queues each, in dead-letter order, in the retry
/// topic for another attempt, and marks it re-driven, in one commit; then
/// appends the queued records.
///
/// A store that owns no partition of the topic, and a partition or record
/// named in `selection` that it does not own, are errors and nothing is
/// re-driven; selected letters of other partitions are left alone and
/// counted ([`Redriven::others`], [`Redriven::left`]). A record asked for by
/// place that cannot be re-driven (its headers are unreadable, or it is an
/// undeliverable emitted message) is an error and nothing is re-driven;
/// unselected by place, such records are left out. One that was re-driven
/// before is counted in [`Redriven::already`] and left alone.
pub async fn redrive<L: EventLog>(
    log: &L,
    topic: &str,
    projection: &str,
    store: &StateStore,
    selection: &Selection,
) -> Result<Redriven, DeadLetterError> {
    redrive_on(log, topic, projection, &Shelf::shared(topic, projection), store, selection).await
}

/// Re-drives the selected dead letters on `shelf` as [`redrive`], into
/// `projection`'s retry topic `retry_<topic>`, tagged with `projection`.
pub async fn redrive_on<L: EventLog>(
    log: &L,
    topic: &str,
    projection: &str,
    shelf: &Shelf,
    store: &StateStore,
    selection: &Selection,
) -> Result<Redriven, DeadLetterError> {
    let mut owned = Vec::new();
    for partition in 0..log.partitions(&shelf.dlq).await? {
        if shelf.owned_by(store, topic, partition)? {
            owned.push(partition);
        }
    }
    if owned.is_empty() {
        return Err(DeadLetterError::NothingOwned { projection: projection.to_owned(), topic: topic.to_owned() });
    }
    let letters = list_on(log, topic, shelf, store).await?;
    if let Some(&(partition, offset)) =
        selection.records.iter().find(|&&(p, o)| !letters.iter().any(|l| l.partition == p && l.offset == o))
    {
        return Err(DeadLetterError::NotFound { projection: projection.to_owned(), partition, offset });
    }
    let mut named = selection.partitions.iter().chain(selection.records.iter().map(|(partition, _)| partition));
    if let Some(&partition) = named.find(|partition| !owned.contains(partition)) {
        return Err(DeadLetterError::NotOwned { topic: topic.to_owned(), partition });
    }
    let mut report = Redriven {
        partitions: owned.into_iter().filter(|&partition| selection.covers(partition)).collect(),
        ..Redriven::default()
    };
    let mut chosen = Vec::new();
    for letter in letters.into_iter().filter(|l| selection.picks(l)) {
        if !letter.owned {
            if report.others.last() != Some(&letter.partition) {
                report.others.push(letter.partition);
            }
            report.left += 1;
            continue;
        }
        if letter.redriven {
            report.already += 1;
            continue;
        }
        // Only events go back through the projection: an unreadable message
        // needs a corrected one, an undeliverable message its own topic.
        let emitted = letter.routed.failure.as_ref().is_some_and(|f| f.class == FailureClass::Undeliverable);
        let reason = match &letter.envelope {
            _ if emitted => "it is a message a module emitted, not an event of the topic".to_owned(),
            Err(error) => format!("its headers cannot be read ({error}); publish a corrected message instead"),
            Ok(_) => {
                chosen.push(letter);
                continue;
            }
        };
        if !selection.records.is_empty() {
            return Err(DeadLetterError::CannotRedrive { partition: letter.partition, offset: letter.offset, reason });
        }
    }
    if chosen.is_empty() {
        return Ok(report);
    }

    let now = routing::now_ms();
    let (dlq, retry) = (shelf.dlq.clone(), retry_topic(topic));
    let orderings = routing::rewrite_orderings(0..chosen.len());
    let mut commit = BatchCommit::default();
    for (letter, ordering) in chosen.into_iter().zip(orderings) {
        let envelope = EventHeaders { ordering, ..letter.envelope.expect("chosen only when readable") };
        let routed = Routed {
            projection: projection.to_owned(),
            attempts: 0,
            failed_at_ms: now,
            ahead_of: None,
            ..letter.routed
        };
        report.records += 1;
        report.events += routed.events;
        commit.outbox.push(OutboxEntry {
            topic: retry.clone(),
            partition_key: envelope.key.key_hash(),
            partition: Some(letter.partition),
            record: routing::routed_record(&envelope, &routed, letter.record.body),
            origin: None,
        });
        commit.done.push((dlq.clone(), letter.partition, letter.offset));
    }
    commit.stat_deltas =
        [(stat::REDRIVEN.to_owned(), report.events), (stat::RETRY_IN.to_owned(), report.events)].into_iter().collect();
    store.commit(commit)?;
    let partitions = report.partitions.clone();
    outbox::publish(log, store, projection, &RoutedTopics::shared(topic), &partitions)
        .await
        .map_err(DeadLetterError::Publish)?;
    Ok(report)
}
