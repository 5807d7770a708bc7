//! The projection's state store: its read model, its progress and its
//! pending output, committed together once per batch.
//!
//! Handlers read and write named entries under the key they are handling;
//! anything shared across keys is a counter, updated by adding deltas, so
//! keys can run concurrently without races. While a batch runs, the host
//! reads through a [`StateReader`] (a snapshot taken before the batch) and
//! buffers every write in a [`KeyWrites`] per key; nothing reaches the store
//! until the batch is done.
//!
//! **One trait, two backends.** A [`StateStore`] is a cheap handle on a
//! [`StateBackend`]: the embedded store ([`embedded`], one redb file per
//! projection, the default) or PostgreSQL ([`postgres`], state shared by
//! several hosts). Both pass one test suite (`suite`). A store that wraps
//! another and changes part of what it does implements [`ForwardingStore`]
//! (`forwarding`): what it does not define goes to the store it wraps.
//! PostgreSQL is a folder, one concern per file (its `mod.rs` says what
//! each holds): `store` (the store and its trait impl), `tls` and
//! `connect` (reaching the server), `bridge` (blocking calls over the
//! async client), `db`, `schema`, `claims` (epochs, fencing, the run
//! lock), `commit`, `json`, `outbox`, `reads` (snapshots), `inspect` and
//! `server_tests`.
//!
//! **One batch, one commit.** [`StateBackend::commit`] applies a
//! [`BatchCommit`] in a single durable transaction holding:
//! - the state writes of every key (sets and deletes, last write wins),
//! - the counter deltas and the statistics deltas,
//! - the consumer positions: for each partition, the next offset to consume,
//! - the `done` marks (retry records taken out of order, dead letters
//!   re-driven) and the outbox: records emitted by handlers (retry,
//!   dead-letter and published messages), to be appended to the log after
//!   the commit;
//! - the timers of every key whose timers the batch changed (set, moved,
//!   cancelled or fired; [`TimerWrite`]), each key's replaced as a whole,
//!   so a timer fired in a batch is gone exactly when the batch's effects
//!   are there, and a crash before the commit fires it again with them.
//!
//! **Why that gives exactly-once effects.** The transaction is atomic: after
//! a crash the store holds either everything a batch did, together with the
//! position just past it, or none of it, with the position before it. On
//! restart the host resumes from the stored position, so every event before
//! it has been applied exactly once and none after it at all. The log's own
//! consumer offset is only a copy written after the commit. Messages to other
//! topics cannot join this transaction, so they go through the outbox: the
//! host appends the pending entries, then removes them with
//! [`StateBackend::remove_outbox`]. Each entry belongs to the partition whose
//! commit added it ([`OutboxEntry::source`]): only the host holding that
//! partition publishes and removes it. The appends are stamped with the entries'
//! sequence numbers, so after a crash in between only what is missing is
//! appended again: each entry once, in order ([`crate::engine::outbox`]).
//!
//! **Bounded reads.** What modules wrote decides how much state there is
//! (within the quotas `counter-count` and `entries-per-key`), so nothing
//! on a hot path or behind a view reads all of it: a snapshot counts a
//! key's entries and the counters only up to a bound, for the quotas
//! ([`Snapshot`]), and views read a page at a time
//! ([`StateBackend::counters_page`], [`StateBackend::entries_page`]).
//! [`StateBackend::counters`] and [`StateBackend::entries`] read all, for
//! tools and tests.
//!
//! **Fencing.** A host that takes a partition [claims](StateBackend::claim)
//! it, which bumps the partition's epoch; every later commit touching that
//! partition (its positions, done marks, outbox or timers) checks the epoch in the same transaction and is refused with
//! [`StateError::Fenced`] once another host has claimed it since. The
//! same transaction checks that each position it writes is still where
//! this store's last commit (or its claim) left it, and refuses the commit
//! with [`StateError::PositionMoved`] if not: a database that forgot
//! acknowledged commits is never built on from the host's memory. The
//! embedded store has nothing to fence: one process holds its file lock.
//!
//! **Runs and resets exclude each other.** A running host holds its
//! projection ([`StateBackend::hold_for_run`]) and `waku reset` takes it
//! for itself ([`StateBackend::lock_for_reset`]): the embedded store's file
//! lock does both, PostgreSQL has a run lock, shared by running hosts and
//! taken exclusively by a reset. A reset that starts the projection over
//! clears it in one transaction ([`StateBackend::start_over`]).
//!
//! **Where a read comes from.** A batch reads through
//! [`StateBackend::batch_reader`]: the embedded store reads its file in
//! place; PostgreSQL serves the batch's keys from memory, filled before the
//! batch from the entries the host keeps for the partitions it owns and one
//! query for the rest ([`cache`]), so a handler's read never waits for a
//! round trip and a commit is written through.
//!
//! **Blocking calls.** The trait is synchronous: the WASM host functions
//! read state in the middle of a guest call, which cannot await, and the
//! consumer already runs each batch on a blocking thread. Calls block on
//! I/O (a commit waits for `fsync` or the database); async callers run them
//! on a blocking thread. The PostgreSQL backend bridges its async client by
//! running every query on a small runtime of its own and waiting for the
//! answer, so it may be called from any thread ([`postgres`]).
//!
//! Files besides the backends: `hold` keeps who holds a partition in
//! PostgreSQL, as the database sees it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use wakuwaku_core::timers::{Millis, Timer};

use crate::event::KeyHash;
use crate::key::Key;
use crate::storage::log::Record;
use crate::storage::stats::Stats;

pub(crate) mod cache;
pub(crate) mod embedded;
pub(crate) mod forwarding;
mod hold;
pub mod postgres;
#[cfg(test)]
mod suite;

pub use embedded::EmbeddedStore;
pub use forwarding::ForwardingStore;
pub use postgres::PostgresStore;

/// Why a state operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The directory that holds the state file could not be created.
    #[error("cannot create the directory of `{}`", path.display())]
    Io {
        /// The state file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The state file is damaged: changed on disk since it was written
    /// (checked in full when opened), or cut short.
    #[error("{store} is damaged ({reason}); restore it from a backup")]
    Damaged {
        /// The store ([`StateBackend::location`]).
        store: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The storage engine failed (I/O error, file locked by another process,
    /// lost database connection, ...).
    #[error("state storage failed on {store}")]
    Storage {
        /// The store ([`StateBackend::location`]).
        store: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The TLS handshake with the database was refused: its certificate
    /// did not pass the checks the URL's `sslmode` asks for, it offers
    /// no TLS, or it asks for a client certificate (`sslcert`/`sslkey`)
    /// it did not get or did not take ([`postgres::tls`]).
    #[error("{store}: TLS refused: {reason}")]
    Tls {
        /// The store ([`StateBackend::location`]).
        store: String,
        /// Why, in plain words.
        reason: String,
    },
    /// A stored value cannot be decoded.
    #[error("corrupt state in {store}: {what}")]
    Corrupt {
        /// The store ([`StateBackend::location`]).
        store: String,
        /// What could not be read, and why.
        what: String,
    },
    /// The file was written in a format this build does not read.
    #[error(
        "`{}` holds state in format {found}, this build reads format 2 (keys as canonical bytes); \
         rebuild the projection into a fresh --data directory",
        path.display()
    )]
    UnknownFormat {
        /// The state file.
        path: PathBuf,
        /// The format found (`1` for a file without a mark).
        found: String,
    },
    /// The database holds a schema newer than this build knows.
    #[error("{store} holds schema version {found}, this build knows up to {known}; run a newer waku")]
    SchemaTooNew {
        /// The store ([`StateBackend::location`]).
        store: String,
        /// The version found.
        found: i32,
        /// The newest version this build migrates to.
        known: i32,
    },
    /// Another host took the partition since this store claimed it: the
    /// commit was refused and nothing of it applied ([`StateBackend::claim`]).
    #[error("partition {partition} was taken over (epoch {current}, this host holds {held}); commit refused")]
    Fenced {
        /// The partition.
        partition: u32,
        /// The epoch this store claimed.
        held: u64,
        /// The epoch in the store now.
        current: u64,
    },
    /// A position the commit writes was not, in the store, where this
    /// store's last commit (or its claim) left it: the database forgot
    /// commits it had acknowledged (a crash with `synchronous_commit=off`)
    /// or something else moved it. The commit was refused and nothing of it
    /// applied; the host must continue from what the store holds, not from
    /// its memory ([`StateBackend::claim`] reads the positions again).
    #[error(
        "partition {partition} of `{topic}` is at {} in the state store, not at {} where this host's last commit \
         left it: the database lost acknowledged commits (a crash with synchronous_commit=off) or something else \
         moved it; commit refused",
        found.map_or_else(|| "no position".to_owned(), |at| format!("offset {at}")),
        expected.map_or_else(|| "no position".to_owned(), |at| format!("offset {at}"))
    )]
    PositionMoved {
        /// The partition.
        partition: u32,
        /// The topic (or mark) of the position.
        topic: String,
        /// Where this store left it (`None`: it had none).
        expected: Option<u64>,
        /// Where the store holds it now.
        found: Option<u64>,
    },
    /// Another process holds the projection: a `waku run` (the embedded
    /// store's file lock, PostgreSQL's run lock) or a `waku reset`.
    #[error("{store} is in use by another process (a `waku run` or `waku reset` of this projection)")]
    InUse {
        /// The store ([`StateBackend::location`]).
        store: String,
    },
}

/// A record waiting in the outbox to be appended to the log once the batch
/// that produced it is committed: a message a handler emitted, or an event
/// routed to the retry or dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxEntry {
    /// The topic to append to.
    pub topic: String,
    /// The key hash that picks the partition ([`crate::event::partition_for`]).
    pub partition_key: KeyHash,
    /// The partition, when it is not picked by the key (a message whose
    /// headers could not be read goes to the partition it came from).
    pub partition: Option<u32>,
    /// The record to append.
    pub record: Record,
    /// For a message a handler emitted, where it came from; `None` for the
    /// host's own retry and dead-letter records.
    pub origin: Option<EmitOrigin>,
}

impl OutboxEntry {
    /// The partition of the projection's topic whose commit added the
    /// entry: it is that partition's to publish ([`crate::engine::outbox`]). An
    /// emitted message names it in its origin; the host's own retry and
    /// dead-letter records go to the partition their event came from.
    pub fn source(&self) -> u32 {
        self.origin.as_ref().map(|origin| origin.partition).or(self.partition).unwrap_or(0)
    }
}

/// The handler call that emitted an [`OutboxEntry`]: should the message
/// never be deliverable, it is dead-lettered beside the events of that
/// call ([`crate::engine::outbox`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmitOrigin {
    /// The partition the events came from (of every topic of the
    /// projection: they share their partition indices).
    pub partition: u32,
    /// The earliest of the call's events (by topic, then offset, as
    /// [`wakuwaku_core::reduce::Origin`] orders them), as an offset of
    /// that partition of `topic`.
    pub offset: u64,
    /// The module that emitted the message.
    pub module: String,
    /// Its version.
    pub version: String,
    /// The projection's topic that event was read from; `None` in entries
    /// written by hosts that did not keep it (the projection's first topic
    /// is named then).
    pub topic: Option<String>,
}

/// An outbox entry as hosts before [`EmitOrigin::topic`] stored it.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct EntryWithoutOriginTopic {
    topic: String,
    partition_key: KeyHash,
    partition: Option<u32>,
    record: Record,
    origin: Option<OriginWithoutTopic>,
}

/// An [`EmitOrigin`] as hosts before its `topic` stored it.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct OriginWithoutTopic {
    partition: u32,
    offset: u64,
    module: String,
    version: String,
}

impl From<EntryWithoutOriginTopic> for OutboxEntry {
    fn from(old: EntryWithoutOriginTopic) -> Self {
        let EntryWithoutOriginTopic { topic, partition_key, partition, record, origin } = old;
        let origin = origin.map(|OriginWithoutTopic { partition, offset, module, version }| EmitOrigin {
            partition,
            offset,
            module,
            version,
            topic: None,
        });
        OutboxEntry { topic, partition_key, partition, record, origin }
    }
}

/// The buffered writes of one key during a batch: for each entry name, the
/// last value written, or `None` if the last write deleted it.
///
/// Last write wins: a set after a delete sets, a delete after a set deletes.
#[derive(Debug, Default, Clone)]
pub struct KeyWrites {
    // Names are the module's choice: a seeded hash, so that no module can
    // make them collide (rustc-hash's string hash has no seed).
    entries: HashMap<String, Option<Vec<u8>>>,
}

impl KeyWrites {
    /// Buffers `name = value`.
    pub fn set(&mut self, name: &str, value: Vec<u8>) {
        self.put(name, Some(value));
    }

    /// Buffers the deletion of `name`.
    pub fn delete(&mut self, name: &str) {
        self.put(name, None);
    }

    fn put(&mut self, name: &str, value: Option<Vec<u8>>) {
        match self.entries.get_mut(name) {
            Some(slot) => *slot = value,
            None => {
                self.entries.insert(name.to_owned(), value);
            }
        }
    }

    /// What this buffer says about `name`: `None` if it was not written,
    /// `Some(None)` if it was deleted, `Some(Some(value))` if it was set.
    ///
    /// A reader checks the buffer first and falls back to the
    /// [`StateReader`] snapshot only on `None`.
    pub fn get(&self, name: &str) -> Option<Option<&[u8]>> {
        self.entries.get(name).map(Option::as_deref)
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The number of entry names written.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Every buffered write, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Option<&[u8]>)> {
        self.entries.iter().map(|(name, value)| (name.as_str(), value.as_deref()))
    }

    /// Folds in the writes of `later`, which happened after these: its
    /// writes win.
    pub fn merge(&mut self, later: KeyWrites) {
        if self.entries.is_empty() {
            self.entries = later.entries;
        } else {
            self.entries.extend(later.entries);
        }
    }
}

/// The timers of one key after a batch, replacing what the store holds for
/// it ([`BatchCommit::timers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerWrite {
    /// The key.
    pub key: Key,
    /// The partition index the key's events are read from: its timers are
    /// fired by the host holding that partition
    /// ([`StateBackend::due_timers`]).
    pub partition: u32,
    /// Its timers now (none: it holds none).
    pub timers: Vec<Timer>,
}

/// What the store holds of a projection's timers, or of one partition's
/// ([`StateBackend::timer_summary`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerSummary {
    /// How many timers are pending.
    pub pending: u64,
    /// The earliest time among them.
    pub next_at: Option<Millis>,
}

/// Everything one batch changes, applied by [`StateBackend::commit`] in one
/// transaction.
#[derive(Debug, Default)]
pub struct BatchCommit {
    /// The buffered writes of each key. A key listed twice has its writes
    /// applied in list order.
    pub writes: Vec<(Key, KeyWrites)>,
    /// Amounts to add to counters (a missing counter starts at 0).
    pub counter_deltas: HashMap<String, i128>,
    /// Amounts to add to statistics (saturating at `u64::MAX`).
    pub stat_deltas: Stats,
    /// For each (topic, partition) consumed, the next offset to consume.
    pub positions: Vec<(String, u32, u64)>,
    /// Messages emitted by the batch, in order; each gets the next outbox
    /// sequence number.
    pub outbox: Vec<OutboxEntry>,
    /// Records at or above their partition's position now dealt with, as
    /// (topic, partition, offset).
    pub done: Vec<(String, u32, u64)>,
    /// Pending outbox entries of a partition ([`OutboxEntry::source`]) up
    /// to and including a sequence number, as (partition, sequence), are
    /// settled and removed, before `outbox` adds its entries (the outbox
    /// publisher replaces undeliverable messages by dead letters so).
    pub outbox_through: Option<(u32, u64)>,
    /// The keys whose timers changed, each with all its timers now: set,
    /// moved, cancelled and fired ones are all in this one replacement.
    pub timers: Vec<TimerWrite>,
}

impl BatchCommit {
    /// Whether the commit would change nothing.
    pub fn is_empty(&self) -> bool {
        self.writes.iter().all(|(_, writes)| writes.is_empty())
            && self.counter_deltas.is_empty()
            && self.stat_deltas.is_empty()
            && self.positions.is_empty()
            && self.outbox.is_empty()
            && self.done.is_empty()
            && self.outbox_through.is_none()
            && self.timers.is_empty()
    }
}

/// A host running a projection, holding partitions of it or not
/// ([`StateBackend::members`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Member {
    /// The name its hold session gives (PostgreSQL's `application_name`:
    /// host name and process id unless the host names itself).
    pub name: String,
    /// The partitions it holds, in order.
    pub partitions: Vec<u32>,
    /// Whether it is this host.
    pub this_host: bool,
}

/// What every state backend does; see the [module docs](self) for the
/// rules each keeps.
pub trait StateBackend: Send + Sync + std::fmt::Debug {
    /// Where the state lives, for messages (`` `/data/bank.redb` ``,
    /// `` postgres `db` projection `bank` ``).
    fn location(&self) -> &str;

    /// Takes `partition` of the projection for this store: bumps its epoch,
    /// so commits touching it from any store that claimed it earlier are
    /// refused from now on ([`StateError::Fenced`]), and reads its
    /// positions, which its commits are checked against from now on
    /// ([`StateError::PositionMoved`]). Returns the new epoch.
    fn claim(&self, partition: u32) -> Result<u64, StateError>;

    /// Takes `partition` as [`claim`](StateBackend::claim) does, but only
    /// once no other host holds it: its previous host let it go after its
    /// last commit ([`release`](StateBackend::release)), or the store saw
    /// that host's hold end (a host that died or stopped answering). `None`
    /// while another host still holds it (it is finishing its batch in
    /// flight): ask again. A partition that moves this way has no batch
    /// refused by fencing. A store only one host uses (embedded) claims at
    /// once.
    fn claim_released(&self, partition: u32) -> Result<Option<u64>, StateError> {
        self.claim(partition).map(Some)
    }

    /// A read snapshot: it sees every commit made before this call and none
    /// made after, however long it is kept. Hold one per batch.
    fn reader(&self) -> Result<StateReader, StateError>;

    /// A read snapshot for one batch of `partition` whose calls read the
    /// state of `keys`: a [`reader`](StateBackend::reader) that a backend
    /// reading across a network fills beforehand with every entry of those
    /// keys, from its cache and one query for the rest ([`cache`]), so that
    /// no call waits for a round trip. The embedded store reads its file
    /// in place and has nothing to fill.
    fn batch_reader(&self, partition: u32, keys: &[Key]) -> Result<StateReader, StateError> {
        let _ = (partition, keys);
        self.reader()
    }

    /// Says that this host stopped consuming `partition` (it was unassigned
    /// or taken over, or the host is stopping), after its last commit: what
    /// the store kept of it in memory goes ([`cache`]), and so does its
    /// hold, so that the next host claims it at once
    /// ([`claim_released`](StateBackend::claim_released)).
    fn release(&self, partition: u32) {
        let _ = partition;
    }

    /// The hosts running the projection now, as the store sees their
    /// holds ([`StateBackend::claim_released`]) and their run locks
    /// ([`StateBackend::hold_for_run`]): each one's name and partitions
    /// (none when it holds none now), this host's marked. A store only one
    /// host uses (embedded) answers none.
    fn members(&self) -> Result<Vec<Member>, StateError> {
        Ok(Vec::new())
    }

    /// Applies a batch in one durable transaction: all of it, or nothing.
    ///
    /// Counters are summed in i128, so no batch overflows them (each delta
    /// was checked against the i64 range where it was added); statistics
    /// saturate at `u64::MAX`. An empty commit writes nothing.
    fn commit(&self, commit: BatchCommit) -> Result<(), StateError>;

    /// Every key that has at least one entry, in the order of their bytes.
    fn keys(&self) -> Result<Vec<Key>, StateError>;

    /// Every entry of `key`, by name.
    fn entries(&self, key: &Key) -> Result<Vec<(String, Vec<u8>)>, StateError>;

    /// One committed entry of `key`.
    fn get(&self, key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        self.reader()?.get(key, name)
    }

    /// Every counter with its value, by name. Reads them all: views use
    /// [`StateBackend::counters_page`].
    fn counters(&self) -> Result<Vec<(String, i128)>, StateError>;

    /// At most `limit` counters with their values, by name, starting after
    /// `after` (from the first without it): one page of a view.
    fn counters_page(&self, after: Option<&str>, limit: usize) -> Result<Vec<(String, i128)>, StateError>;

    /// At most `limit` entries of `key`, by name, starting after `after`
    /// (from the first without it), and none after their values reach
    /// `max_bytes` (the first always comes): one page of a view, bounded by
    /// `max_bytes` and one value whatever the module wrote.
    fn entries_page(
        &self,
        key: &Key,
        after: Option<&str>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StateError>;

    /// Every statistic with its value (those under names this host does
    /// not know kept by name, [`Stats::unknown`]).
    fn stats(&self) -> Result<Stats, StateError>;

    /// The next offset to consume from a partition, as last committed.
    fn position(&self, topic: &str, partition: u32) -> Result<Option<u64>, StateError>;

    /// Offsets of a partition marked done ([`BatchCommit::done`]), in order.
    fn done(&self, topic: &str, partition: u32) -> Result<Vec<u64>, StateError>;

    /// The pending outbox entries with their sequence numbers, in order.
    fn outbox(&self) -> Result<Vec<(u64, OutboxEntry)>, StateError>;

    /// The pending outbox entries of `partition` ([`OutboxEntry::source`]),
    /// in order: what the host holding that partition publishes.
    fn outbox_of(&self, partition: u32) -> Result<Vec<(u64, OutboxEntry)>, StateError> {
        let mut entries = self.outbox()?;
        entries.retain(|(_, entry)| entry.source() == partition);
        Ok(entries)
    }

    /// Removes the outbox entries of `partition` up to and including
    /// `through_seq`, once they have been appended to the log. Sequence
    /// numbers are not reused. A commit, so fenced as one.
    fn remove_outbox(&self, partition: u32, through_seq: u64) -> Result<(), StateError> {
        self.commit(BatchCommit { outbox_through: Some((partition, through_seq)), ..BatchCommit::default() })
    }

    /// A value the host keeps for itself (module versions, outbox marks).
    fn meta(&self, name: &str) -> Result<Option<Vec<u8>>, StateError>;

    /// Sets a host value, in its own durable transaction.
    fn set_meta(&self, name: &str, value: &[u8]) -> Result<(), StateError>;

    // Reset (issue 14)

    /// Marks the projection as run by this store for as long as it is open,
    /// so that [`StateBackend::lock_for_reset`] is refused meanwhile; fails
    /// with [`StateError::InUse`] while a reset holds it. Embedded: nothing
    /// to do, the file lock already keeps every other process out.
    fn hold_for_run(&self) -> Result<(), StateError>;

    /// Takes the projection for a reset for as long as this store is open;
    /// fails with [`StateError::InUse`] while a running host holds it
    /// ([`StateBackend::hold_for_run`]). Embedded: nothing to do, opening
    /// the file took its lock.
    fn lock_for_reset(&self) -> Result<(), StateError>;

    /// Every committed position, as (topic, partition, next offset), in
    /// order.
    fn positions(&self) -> Result<Vec<(String, u32, u64)>, StateError>;

    /// Every done mark ([`BatchCommit::done`]), as (topic, partition,
    /// offset), in order.
    fn done_marks(&self) -> Result<Vec<(String, u32, u64)>, StateError>;

    /// Every host value ([`StateBackend::meta`]), by name.
    fn meta_entries(&self) -> Result<Vec<(String, Vec<u8>)>, StateError>;

    /// Starts the projection over, in one durable transaction: removes
    /// every state entry, counter, statistic, done mark, pending outbox
    /// entry and position, then stores `positions` (topic, partition, next
    /// offset). Host values, outbox sequence numbers (never reused) and
    /// claimed epochs stay.
    fn start_over(&self, positions: Vec<(String, u32, u64)>) -> Result<(), StateError>;

    /// The keys of `partition` with a timer below `before`, each with its
    /// earliest one, earliest first (ties by key bytes), at most `limit` of
    /// them.
    fn due_timers(&self, partition: u32, before: Millis, limit: usize) -> Result<Vec<(Key, Millis)>, StateError>;

    /// The timers pending in `partition`, or in the whole projection, and
    /// the earliest time among them.
    fn timer_summary(&self, partition: Option<u32>) -> Result<TimerSummary, StateError>;

    /// How many timers the projection holds (for `timers-in-all`).
    fn timer_count(&self) -> Result<u64, StateError> {
        self.timer_summary(None).map(|summary| summary.pending)
    }
}

/// A read snapshot a backend hands out ([`StateBackend::reader`]).
///
/// The counts serve the state quotas (`counter-count`, `entries-per-key`):
/// each is read at most once per batch (per key for entries) and only when
/// a module tries to make a new counter or entry, so they stop counting at
/// `at_most`: whatever a store holds, a count costs no more than the quota.
pub trait Snapshot: Send + Sync {
    /// An entry of `key` as of the snapshot.
    fn get(&self, key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError>;

    /// Whether `key` has an entry `name` as of the snapshot (its value not
    /// read).
    fn contains(&self, key: &Key, name: &str) -> Result<bool, StateError>;

    /// The entries `key` holds as of the snapshot, counted up to `at_most`.
    fn entry_count(&self, key: &Key, at_most: usize) -> Result<usize, StateError>;

    /// A counter as of the snapshot; `None` if it was never written.
    fn counter(&self, name: &str) -> Result<Option<i128>, StateError>;

    /// The counters the projection holds as of the snapshot, counted up to
    /// `at_most`.
    fn counter_count(&self, at_most: usize) -> Result<usize, StateError>;
    /// The timers of `key` as of the snapshot, in no particular order.
    fn timers(&self, key: &Key) -> Result<Vec<Timer>, StateError>;
    /// The timers the projection holds as of the snapshot, counted up to
    /// `at_most`.
    fn timer_count(&self, at_most: usize) -> Result<usize, StateError>;
}

/// The state of one projection, in whichever backend holds it.
///
/// Cheap to clone; clones share the open store. Every [`StateBackend`]
/// method is called on it directly (`store.commit(batch)`).
#[derive(Clone, Debug)]
pub struct StateStore {
    backend: Arc<dyn StateBackend>,
}

impl StateStore {
    /// Opens the embedded state file at `path`, creating it (and its parent
    /// directories) if it does not exist ([`EmbeddedStore::open`]).
    pub fn open(path: &Path) -> Result<Self, StateError> {
        Ok(Self::from_backend(EmbeddedStore::open(path)?))
    }

    /// A handle on `backend`.
    pub fn from_backend(backend: impl StateBackend + 'static) -> Self {
        Self { backend: Arc::new(backend) }
    }
}

impl std::ops::Deref for StateStore {
    type Target = dyn StateBackend;

    fn deref(&self) -> &Self::Target {
        &*self.backend
    }
}

/// A read snapshot of the state, taken by [`StateBackend::reader`].
///
/// `Send` and `Sync`: one reader serves every worker of a batch by
/// reference. It sees only committed state; the caller overlays the
/// batch's own [`KeyWrites`] on top.
pub struct StateReader(Box<dyn Snapshot>);

impl std::fmt::Debug for StateReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateReader").finish_non_exhaustive()
    }
}

impl StateReader {
    /// A reader over a backend's snapshot.
    pub fn new(snapshot: impl Snapshot + 'static) -> Self {
        Self(Box::new(snapshot))
    }

    /// An entry of `key` as of the snapshot.
    pub fn get(&self, key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        self.0.get(key, name)
    }

    /// A counter as of the snapshot; 0 if it was never written.
    pub fn counter(&self, name: &str) -> Result<i128, StateError> {
        Ok(self.0.counter(name)?.unwrap_or(0))
    }

    /// A counter as of the snapshot; `None` if it was never written.
    pub fn find_counter(&self, name: &str) -> Result<Option<i128>, StateError> {
        self.0.counter(name)
    }

    /// Whether `key` has an entry `name` as of the snapshot.
    pub fn contains(&self, key: &Key, name: &str) -> Result<bool, StateError> {
        self.0.contains(key, name)
    }

    /// The entries `key` holds as of the snapshot, counted up to `at_most`.
    pub fn entry_count(&self, key: &Key, at_most: usize) -> Result<usize, StateError> {
        self.0.entry_count(key, at_most)
    }

    /// The counters as of the snapshot, counted up to `at_most`.
    pub fn counter_count(&self, at_most: usize) -> Result<usize, StateError> {
        self.0.counter_count(at_most)
    }

    /// The timers of `key` as of the snapshot.
    pub fn timers(&self, key: &Key) -> Result<Vec<Timer>, StateError> {
        self.0.timers(key)
    }

    /// The projection's timers as of the snapshot, counted up to `at_most`.
    pub fn timer_count(&self, at_most: usize) -> Result<usize, StateError> {
        self.0.timer_count(at_most)
    }
}

/// An outbox entry as both backends store it (postcard).
fn encode_outbox(entry: &OutboxEntry, location: &str) -> Result<Vec<u8>, StateError> {
    postcard::to_allocvec(entry).map_err(|e| StateError::Storage {
        store: location.to_owned(),
        source: format!("cannot encode an outbox entry for `{}`: {e}", entry.topic).into(),
    })
}

/// The outbox entry `seq` from its stored bytes; the error says what is wrong.
///
/// An entry an earlier host wrote, whose emit origin has no topic, ends
/// where this one expects the topic, so it cannot read as one of this
/// host's; it is read as such an entry ([`EntryWithoutOriginTopic`]).
fn decode_outbox(seq: u64, bytes: &[u8]) -> Result<OutboxEntry, String> {
    let error = match postcard::take_from_bytes::<OutboxEntry>(bytes) {
        Ok((entry, [])) => return Ok(entry),
        Ok((_, rest)) => format!("outbox entry {seq}: {} trailing bytes", rest.len()),
        Err(e) => format!("outbox entry {seq}: {e}"),
    };
    match postcard::take_from_bytes::<EntryWithoutOriginTopic>(bytes) {
        Ok((old, [])) => Ok(old.into()),
        _ => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(pairs: &[(&str, Option<&str>)]) -> KeyWrites {
        let mut w = KeyWrites::default();
        for (name, value) in pairs {
            match value {
                Some(v) => w.set(name, v.as_bytes().to_vec()),
                None => w.delete(name),
            }
        }
        w
    }

    #[test]
    fn reader_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<StateReader>();
        assert_send_sync::<StateStore>();
    }

    #[test]
    fn outbox_entries_of_earlier_hosts_read_back_with_no_origin_topic() {
        let record = Record { headers: vec![], body: b"x".to_vec() };
        let origin = OriginWithoutTopic { partition: 2, offset: 7, module: "m".into(), version: "v".into() };
        let old = EntryWithoutOriginTopic {
            topic: "out".into(),
            partition_key: 9,
            partition: None,
            record: record.clone(),
            origin: Some(origin),
        };
        let bytes = postcard::to_allocvec(&old).unwrap();
        let entry = decode_outbox(1, &bytes).unwrap();
        let origin = EmitOrigin { partition: 2, offset: 7, module: "m".into(), version: "v".into(), topic: None };
        let expected =
            OutboxEntry { topic: "out".into(), partition_key: 9, partition: None, record, origin: Some(origin) };
        assert_eq!(entry, expected);
        // This host's entries read back as written, their origin's topic too.
        let mut entry = expected;
        entry.origin.as_mut().unwrap().topic = Some("second".into());
        assert_eq!(decode_outbox(2, &encode_outbox(&entry, "test").unwrap()).unwrap(), entry);
        assert!(decode_outbox(3, &bytes[..bytes.len() - 1]).is_err(), "a cut entry is still refused");
    }

    #[test]
    fn key_writes_last_write_wins_and_merge() {
        let mut w = KeyWrites::default();
        assert!(w.is_empty());
        assert_eq!(w.get("a"), None);
        w.set("a", b"1".to_vec());
        w.delete("a");
        assert_eq!(w.get("a"), Some(None));
        w.set("a", b"2".to_vec());
        assert_eq!(w.get("a"), Some(Some(b"2".as_slice())));
        w.set("b", b"1".to_vec());
        w.delete("c");
        w.merge(writes(&[("b", None), ("c", Some("3")), ("d", Some("4"))]));
        assert_eq!(w.len(), 4);
        assert_eq!(w.get("a"), Some(Some(b"2".as_slice())));
        assert_eq!(w.get("b"), Some(None));
        assert_eq!(w.get("c"), Some(Some(b"3".as_slice())));
        assert_eq!(w.get("d"), Some(Some(b"4".as_slice())));
        let mut empty = KeyWrites::default();
        empty.merge(w.clone());
        let mut listed: Vec<_> = empty.iter().collect();
        listed.sort();
        assert_eq!(
            listed,
            vec![("a", Some(b"2".as_slice())), ("b", None), ("c", Some(b"3".as_slice())), ("d", Some(b"4".as_slice()))]
        );
    }
}
