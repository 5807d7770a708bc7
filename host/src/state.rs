//! The projection's state store: its read model, its progress and its
//! pending output, in one transactional file.
//!
//! Each projection has its own file (redb). Handlers read and write named
//! entries under the key they are handling; anything shared across keys is a
//! counter, updated by adding deltas, so keys can run concurrently without
//! races. While a batch runs, the host reads through a [`StateReader`] (a
//! snapshot taken before the batch) and buffers every write in a
//! [`KeyWrites`] per key; nothing touches the file until the batch is done.
//!
//! **One batch, one commit.** [`StateStore::commit`] applies a
//! [`BatchCommit`] in a single durable write transaction holding:
//! - the state writes of every key (sets and deletes, last write wins),
//! - the counter deltas and the statistics deltas,
//! - the consumer positions: for each partition, the next offset to consume,
//! - the outbox: records emitted by handlers (retry, dead-letter and
//!   published messages), to be appended to the log after the commit.
//!
//! **Why that gives exactly-once effects.** The transaction is atomic: after
//! a crash the file holds either everything a batch did, together with the
//! position just past it, or none of it, with the position before it. On
//! restart the host resumes from the stored position, so every event before
//! it has been applied exactly once and none after it at all. The log's own
//! consumer offset is only a copy written after the commit. Messages to other
//! topics cannot join this transaction, so they go through the outbox: the
//! host appends the pending entries, then removes them with
//! [`StateStore::remove_outbox`]. The appends are stamped with the entries'
//! sequence numbers, so after a crash in between only what is missing is
//! appended again: each entry once, in order ([`crate::outbox`]).
//!
//! Calls block on file I/O (a commit waits for `fsync`); async callers should
//! run them on a blocking thread. A [`StateStore`] is cheap to clone and may
//! be shared between threads; redb serializes write transactions, and a
//! reader never waits for a writer.
//!
//! Tables in the file: `state` ((key bytes, name) → bytes; the key's
//! canonical bytes, so keys whose hashes collide never share an entry),
//! `counters` (name → i128: deltas are checked against the i64 range at the
//! call that adds them, and a commit that sums several keys' deltas never
//! overflows), `stats` (name → u64), `positions` ((topic, partition) →
//! next offset), `outbox` (sequence → postcard [`OutboxEntry`]), `meta`
//! (name → bytes, for the host's own bookkeeping such as module versions)
//! `sequences` (the next outbox sequence number, so numbers are never
//! reused even when the outbox is emptied) and `done` ((topic, partition,
//! offset): records at or above a partition's position that are already
//! dealt with, such as retry records taken out of order, or dead letters
//! already re-driven). Committing a position drops the `done` entries of
//! that partition below it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadOnlyTable, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use std::collections::HashMap;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::event::KeyHash;
use crate::key::Key;
use crate::log::Record;

const STATE: TableDefinition<(&[u8], &str), &[u8]> = TableDefinition::new("state");
const COUNTERS: TableDefinition<&str, i128> = TableDefinition::new("counters");
const STATS: TableDefinition<&str, u64> = TableDefinition::new("stats");
const POSITIONS: TableDefinition<(&str, u32), u64> = TableDefinition::new("positions");
const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const SEQUENCES: TableDefinition<&str, u64> = TableDefinition::new("sequences");
const DONE: TableDefinition<(&str, u32, u64), ()> = TableDefinition::new("done");

/// The page cache of a state file. redb's default (1 GiB) would let the
/// cache grow with everything a module writes; 64 MiB holds the hot keys
/// of a large projection and keeps the host's memory bounded.
const CACHE_BYTES: usize = 64 << 20;

/// The `sequences` entry holding the next outbox sequence number.
const OUTBOX_NEXT: &str = "outbox";

/// The `meta` entry naming the file's format, and the format this build
/// writes. Format 2 keys state by canonical key bytes; format 1 (unmarked)
/// keyed it by a 64-bit hash.
const FORMAT: &str = "state-format";
const FORMAT_VERSION: &[u8] = b"2";

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
    /// The storage engine failed (I/O error, file locked by another process,
    /// damaged file, ...).
    #[error("state storage failed on `{}`", path.display())]
    Storage {
        /// The state file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A stored value cannot be decoded.
    #[error("corrupt state in `{}`: {what}", path.display())]
    Corrupt {
        /// The state file.
        path: PathBuf,
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

/// The handler call that emitted an [`OutboxEntry`]: should the message
/// never be deliverable, it is dead-lettered beside the events of that
/// call ([`crate::outbox`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmitOrigin {
    /// The partition of the projection's topic the events came from.
    pub partition: u32,
    /// The earliest of the call's events, as an offset of that partition.
    pub offset: u64,
    /// The module that emitted the message.
    pub module: String,
    /// Its version.
    pub version: String,
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

/// Everything one batch changes, applied by [`StateStore::commit`] in one
/// transaction.
#[derive(Debug, Default)]
pub struct BatchCommit {
    /// The buffered writes of each key. A key listed twice has its writes
    /// applied in list order.
    pub writes: Vec<(Key, KeyWrites)>,
    /// Amounts to add to counters (a missing counter starts at 0).
    pub counter_deltas: HashMap<String, i128>,
    /// Amounts to add to statistics (saturating at `u64::MAX`).
    pub stat_deltas: FxHashMap<String, u64>,
    /// For each (topic, partition) consumed, the next offset to consume.
    pub positions: Vec<(String, u32, u64)>,
    /// Messages emitted by the batch, in order; each gets the next outbox
    /// sequence number.
    pub outbox: Vec<OutboxEntry>,
    /// Records at or above their partition's position now dealt with, as
    /// (topic, partition, offset).
    pub done: Vec<(String, u32, u64)>,
    /// Pending outbox entries up to and including this sequence number
    /// are settled and removed, before `outbox` adds its entries (the
    /// outbox publisher replaces undeliverable messages by dead letters so).
    pub outbox_through: Option<u64>,
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
    }
}

/// The state file of one projection.
///
/// Cheap to clone; clones share the open file. Only one process may have
/// the file open at a time (redb locks it).
#[derive(Clone)]
pub struct StateStore {
    inner: Arc<Inner>,
}

struct Inner {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore").field("path", &self.inner.path).finish_non_exhaustive()
    }
}

impl StateStore {
    /// Opens the state file at `path`, creating it (and its parent
    /// directories) if it does not exist.
    pub fn open(path: &Path) -> Result<Self, StateError> {
        let path = path.to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| StateError::Io { path: path.clone(), source })?;
        }
        let db = redb::Builder::new().set_cache_size(CACHE_BYTES).create(&path).map_err(|e| storage(&path, e))?;
        let store = Self { inner: Arc::new(Inner { db, path }) };
        store.check_format()?;
        // Create every table now, so readers never meet a missing one.
        let txn = store.inner.db.begin_write().map_err(|e| store.storage(e))?;
        txn.open_table(STATE).map_err(|e| store.storage(e))?;
        txn.open_table(COUNTERS).map_err(|e| store.storage(e))?;
        txn.open_table(STATS).map_err(|e| store.storage(e))?;
        txn.open_table(POSITIONS).map_err(|e| store.storage(e))?;
        txn.open_table(OUTBOX).map_err(|e| store.storage(e))?;
        txn.open_table(META).map_err(|e| store.storage(e))?;
        txn.open_table(SEQUENCES).map_err(|e| store.storage(e))?;
        txn.open_table(DONE).map_err(|e| store.storage(e))?;
        txn.open_table(META)
            .map_err(|e| store.storage(e))?
            .insert(FORMAT, FORMAT_VERSION)
            .map_err(|e| store.storage(e))?;
        txn.commit().map_err(|e| store.storage(e))?;
        Ok(store)
    }

    /// Refuses a file of another format before any table is opened with
    /// types it was not written with. A new file has no tables at all.
    fn check_format(&self) -> Result<(), StateError> {
        let txn = self.inner.db.begin_read().map_err(|e| self.storage(e))?;
        let tables: Vec<String> =
            txn.list_tables().map_err(|e| self.storage(e))?.map(|table| table.name().to_owned()).collect();
        if tables.is_empty() {
            return Ok(());
        }
        let found = match tables.iter().any(|name| name == META.name()) {
            true => txn
                .open_table(META)
                .map_err(|e| self.storage(e))?
                .get(FORMAT)
                .map_err(|e| self.storage(e))?
                .map(|v| v.value().to_vec()),
            false => None,
        };
        match found {
            Some(format) if format == FORMAT_VERSION => Ok(()),
            other => Err(StateError::UnknownFormat {
                path: self.inner.path.clone(),
                found: other.map_or_else(|| "1".to_owned(), |format| String::from_utf8_lossy(&format).into_owned()),
            }),
        }
    }

    /// The file this state is stored in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// A read snapshot: it sees every commit made before this call and none
    /// made after, however long it is kept.
    ///
    /// Hold one per batch: a snapshot keeps the pages it sees from being
    /// reused, so a reader kept forever makes the file grow.
    pub fn reader(&self) -> Result<StateReader, StateError> {
        let txn = self.inner.db.begin_read().map_err(|e| self.storage(e))?;
        Ok(StateReader {
            state: txn.open_table(STATE).map_err(|e| self.storage(e))?,
            counters: txn.open_table(COUNTERS).map_err(|e| self.storage(e))?,
            store: self.clone(),
        })
    }

    /// Applies a batch in one durable transaction: all of it, or nothing.
    ///
    /// Counters are summed in i128, so no batch overflows them (each delta
    /// was checked against the i64 range where it was added). An empty
    /// commit writes nothing.
    pub fn commit(&self, commit: BatchCommit) -> Result<(), StateError> {
        if commit.is_empty() {
            return Ok(());
        }
        let BatchCommit { writes, counter_deltas, stat_deltas, positions, outbox, done, outbox_through } = commit;
        let outbox = outbox
            .iter()
            .map(|entry| {
                postcard::to_allocvec(entry).map_err(|e| StateError::Storage {
                    path: self.inner.path.clone(),
                    source: format!("cannot encode an outbox entry for `{}`: {e}", entry.topic).into(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;

        let txn = self.inner.db.begin_write().map_err(|e| self.storage(e))?;
        {
            let mut state = txn.open_table(STATE).map_err(|e| self.storage(e))?;
            for (key, key_writes) in &writes {
                for (name, value) in &key_writes.entries {
                    let entry = (key.as_bytes(), name.as_str());
                    match value {
                        Some(value) => state.insert(entry, value.as_slice()).map(drop),
                        None => state.remove(entry).map(drop),
                    }
                    .map_err(|e| self.storage(e))?;
                }
            }

            let mut counters = txn.open_table(COUNTERS).map_err(|e| self.storage(e))?;
            for (name, &delta) in &counter_deltas {
                let value = counters.get(name.as_str()).map_err(|e| self.storage(e))?.map_or(0, |v| v.value());
                // Saturation is unreachable: reaching i128's bounds takes
                // 2^64 deltas of i64's size.
                counters.insert(name.as_str(), value.saturating_add(delta)).map_err(|e| self.storage(e))?;
            }

            let mut stats = txn.open_table(STATS).map_err(|e| self.storage(e))?;
            for (name, &delta) in &stat_deltas {
                let value = stats.get(name.as_str()).map_err(|e| self.storage(e))?.map_or(0, |v| v.value());
                stats.insert(name.as_str(), value.saturating_add(delta)).map_err(|e| self.storage(e))?;
            }

            let mut done_table = txn.open_table(DONE).map_err(|e| self.storage(e))?;
            for (topic, partition, offset) in &done {
                done_table.insert((topic.as_str(), *partition, *offset), ()).map_err(|e| self.storage(e))?;
            }
            let mut table = txn.open_table(POSITIONS).map_err(|e| self.storage(e))?;
            for (topic, partition, next) in &positions {
                table.insert((topic.as_str(), *partition), *next).map_err(|e| self.storage(e))?;
                let below = (topic.as_str(), *partition, 0)..(topic.as_str(), *partition, *next);
                done_table.retain_in(below, |_, _| false).map_err(|e| self.storage(e))?;
            }

            if let Some(through) = outbox_through {
                let mut table = txn.open_table(OUTBOX).map_err(|e| self.storage(e))?;
                table.retain_in(..=through, |_, _| false).map_err(|e| self.storage(e))?;
            }
            if !outbox.is_empty() {
                let mut sequences = txn.open_table(SEQUENCES).map_err(|e| self.storage(e))?;
                let mut seq = sequences.get(OUTBOX_NEXT).map_err(|e| self.storage(e))?.map_or(0, |v| v.value());
                let mut table = txn.open_table(OUTBOX).map_err(|e| self.storage(e))?;
                for bytes in &outbox {
                    table.insert(seq, bytes.as_slice()).map_err(|e| self.storage(e))?;
                    seq += 1;
                }
                sequences.insert(OUTBOX_NEXT, seq).map_err(|e| self.storage(e))?;
            }
        }
        txn.commit().map_err(|e| self.storage(e))
    }

    /// Every key that has at least one entry, in the order of their bytes.
    pub fn keys(&self) -> Result<Vec<Key>, StateError> {
        let txn = self.inner.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(STATE).map_err(|e| self.storage(e))?;
        // Jump from key to key instead of visiting every entry: the first
        // byte string after `key` is `key` followed by a zero byte.
        let mut keys = Vec::new();
        let mut from = Vec::new();
        loop {
            let Some(first) = table.range((from.as_slice(), "")..).map_err(|e| self.storage(e))?.next() else { break };
            let bytes = first.map_err(|e| self.storage(e))?.0.value().0.to_vec();
            let key =
                Key::from_canonical(&bytes).map_err(|e| self.corrupt(format!("a state key is not canonical: {e}")))?;
            keys.push(key);
            from = bytes;
            from.push(0);
        }
        Ok(keys)
    }

    /// Every entry of `key`, by name.
    pub fn entries(&self, key: &Key) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        let txn = self.inner.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(STATE).map_err(|e| self.storage(e))?;
        let mut entries = Vec::new();
        for entry in table.range((key.as_bytes(), "")..).map_err(|e| self.storage(e))? {
            let (k, v) = entry.map_err(|e| self.storage(e))?;
            let (entry_key, name) = k.value();
            if entry_key != key.as_bytes() {
                break;
            }
            entries.push((name.to_owned(), v.value().to_vec()));
        }
        Ok(entries)
    }

    /// One committed entry of `key`.
    pub fn get(&self, key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        self.reader()?.get(key, name)
    }

    /// Every counter with its value, by name.
    pub fn counters(&self) -> Result<Vec<(String, i128)>, StateError> {
        self.list(COUNTERS)
    }

    /// Every statistic with its value, by name.
    pub fn stats(&self) -> Result<Vec<(String, u64)>, StateError> {
        self.list(STATS)
    }

    fn list<V>(&self, definition: TableDefinition<&str, V>) -> Result<Vec<(String, V)>, StateError>
    where
        V: for<'a> redb::Value<SelfType<'a> = V> + 'static,
    {
        let txn = self.inner.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(definition).map_err(|e| self.storage(e))?;
        let mut list = Vec::new();
        for entry in table.iter().map_err(|e| self.storage(e))? {
            let (name, value) = entry.map_err(|e| self.storage(e))?;
            list.push((name.value().to_owned(), value.value()));
        }
        Ok(list)
    }

    /// The next offset to consume from a partition, as last committed.
    pub fn position(&self, topic: &str, partition: u32) -> Result<Option<u64>, StateError> {
        let txn = self.inner.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(POSITIONS).map_err(|e| self.storage(e))?;
        Ok(table.get((topic, partition)).map_err(|e| self.storage(e))?.map(|v| v.value()))
    }

    /// Offsets of a partition marked done ([`BatchCommit::done`]), in order.
    pub fn done(&self, topic: &str, partition: u32) -> Result<Vec<u64>, StateError> {
        let txn = self.inner.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(DONE).map_err(|e| self.storage(e))?;
        let mut offsets = Vec::new();
        for entry in table.range((topic, partition, 0)..=(topic, partition, u64::MAX)).map_err(|e| self.storage(e))? {
            offsets.push(entry.map_err(|e| self.storage(e))?.0.value().2);
        }
        Ok(offsets)
    }

    /// The pending outbox entries with their sequence numbers, in order.
    pub fn outbox(&self) -> Result<Vec<(u64, OutboxEntry)>, StateError> {
        let txn = self.inner.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(OUTBOX).map_err(|e| self.storage(e))?;
        let mut entries = Vec::new();
        for entry in table.iter().map_err(|e| self.storage(e))? {
            let (seq, bytes) = entry.map_err(|e| self.storage(e))?;
            let seq = seq.value();
            let entry = match postcard::take_from_bytes::<OutboxEntry>(bytes.value()) {
                Ok((entry, [])) => entry,
                Ok((_, rest)) => return Err(self.corrupt(format!("outbox entry {seq}: {} trailing bytes", rest.len()))),
                Err(e) => return Err(self.corrupt(format!("outbox entry {seq}: {e}"))),
            };
            entries.push((seq, entry));
        }
        Ok(entries)
    }

    /// Removes every outbox entry up to and including `through_seq`, once
    /// they have been appended to the log. Sequence numbers are not reused.
    pub fn remove_outbox(&self, through_seq: u64) -> Result<(), StateError> {
        let txn = self.inner.db.begin_write().map_err(|e| self.storage(e))?;
        {
            let mut table = txn.open_table(OUTBOX).map_err(|e| self.storage(e))?;
            table.retain_in(..=through_seq, |_, _| false).map_err(|e| self.storage(e))?;
        }
        txn.commit().map_err(|e| self.storage(e))
    }

    /// A value the host keeps for itself (module versions, format marks).
    pub fn meta(&self, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let txn = self.inner.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(META).map_err(|e| self.storage(e))?;
        Ok(table.get(name).map_err(|e| self.storage(e))?.map(|v| v.value().to_vec()))
    }

    /// Sets a host value, in its own durable transaction.
    pub fn set_meta(&self, name: &str, value: &[u8]) -> Result<(), StateError> {
        let txn = self.inner.db.begin_write().map_err(|e| self.storage(e))?;
        {
            let mut table = txn.open_table(META).map_err(|e| self.storage(e))?;
            table.insert(name, value).map_err(|e| self.storage(e))?;
        }
        txn.commit().map_err(|e| self.storage(e))
    }

    fn storage(&self, e: impl Into<redb::Error>) -> StateError {
        storage(&self.inner.path, e)
    }

    fn corrupt(&self, what: String) -> StateError {
        StateError::Corrupt { path: self.inner.path.clone(), what }
    }
}

fn storage(path: &Path, e: impl Into<redb::Error>) -> StateError {
    StateError::Storage { path: path.to_path_buf(), source: Box::new(e.into()) }
}

/// A read snapshot of the state, taken by [`StateStore::reader`].
///
/// `Send` and `Sync`: one reader serves every worker of a batch by
/// reference. It sees only committed state; the caller overlays the
/// batch's own [`KeyWrites`] on top.
pub struct StateReader {
    state: ReadOnlyTable<(&'static [u8], &'static str), &'static [u8]>,
    counters: ReadOnlyTable<&'static str, i128>,
    store: StateStore,
}

impl std::fmt::Debug for StateReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateReader").field("path", &self.store.inner.path).finish_non_exhaustive()
    }
}

impl StateReader {
    /// An entry of `key` as of the snapshot.
    pub fn get(&self, key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let value = self.state.get((key.as_bytes(), name)).map_err(|e| self.store.storage(e))?;
        Ok(value.map(|v| v.value().to_vec()))
    }

    /// A counter as of the snapshot; 0 if it was never written.
    pub fn counter(&self, name: &str) -> Result<i128, StateError> {
        let value = self.counters.get(name).map_err(|e| self.store.storage(e))?;
        Ok(value.map_or(0, |v| v.value()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Header;

    fn k(n: u64) -> Key {
        Key::int(n)
    }

    fn open(dir: &tempfile::TempDir) -> StateStore {
        StateStore::open(&dir.path().join("state.redb")).unwrap()
    }

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

    fn entry(topic: &str, n: u8) -> OutboxEntry {
        OutboxEntry {
            topic: topic.into(),
            partition_key: u64::from(n),
            partition: None,
            record: Record { headers: vec![Header { name: "h".into(), value: vec![n] }], body: vec![n; 3] },
            origin: (n % 2 == 1).then(|| EmitOrigin {
                partition: 1,
                offset: u64::from(n) * 10,
                module: "m".into(),
                version: "v".into(),
            }),
        }
    }

    fn bytes(s: &str) -> Option<Vec<u8>> {
        Some(s.as_bytes().to_vec())
    }

    #[test]
    fn reader_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<StateReader>();
        assert_send_sync::<StateStore>();
    }

    #[test]
    fn commit_then_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir);
        assert_eq!(store.keys().unwrap(), Vec::<Key>::new());
        let commit = BatchCommit {
            writes: vec![
                (k(7), writes(&[("balance", Some("10")), ("owner", Some("ann"))])),
                (k(u64::MAX), writes(&[("x", Some("max"))])),
                (k(0), writes(&[("x", Some("zero"))])),
            ],
            positions: vec![("accounts".into(), 2, 100)],
            ..BatchCommit::default()
        };
        store.commit(commit).unwrap();
        assert_eq!(store.keys().unwrap(), vec![k(0), k(7), k(u64::MAX)]);
        assert_eq!(store.get(&k(7), "balance").unwrap(), bytes("10"));
        assert_eq!(store.get(&k(7), "missing").unwrap(), None);
        assert_eq!(store.get(&k(8), "balance").unwrap(), None);
        assert_eq!(
            store.entries(&k(7)).unwrap(),
            vec![("balance".to_owned(), b"10".to_vec()), ("owner".to_owned(), b"ann".to_vec())]
        );
        assert_eq!(store.entries(&k(u64::MAX)).unwrap(), vec![("x".to_owned(), b"max".to_vec())]);
        assert_eq!(store.entries(&k(3)).unwrap(), vec![]);
        assert_eq!(store.position("accounts", 2).unwrap(), Some(100));
        assert_eq!(store.position("accounts", 1).unwrap(), None);
        let reader = store.reader().unwrap();
        assert_eq!(reader.get(&k(0), "x").unwrap(), bytes("zero"));
        assert_eq!(reader.counter("nothing").unwrap(), 0);
    }

    #[test]
    fn a_commit_survives_reopen_and_counters_pass_the_i64_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p/state.redb");
        {
            let store = StateStore::open(&path).unwrap();
            store
                .commit(BatchCommit {
                    writes: vec![(k(1), writes(&[("a", Some("1"))]))],
                    counter_deltas: [("total".to_owned(), i128::from(i64::MAX) - 1)].into_iter().collect(),
                    positions: vec![("t".into(), 0, 5)],
                    outbox: vec![entry("out", 1)],
                    ..BatchCommit::default()
                })
                .unwrap();
            // Several keys' deltas may sum past i64 in one batch (each was
            // checked on its own): the commit still lands, nothing wraps.
            store
                .commit(BatchCommit {
                    counter_deltas: [("total".to_owned(), 2)].into_iter().collect(),
                    ..BatchCommit::default()
                })
                .unwrap();
        }
        let store = StateStore::open(&path).unwrap();
        assert_eq!(store.entries(&k(1)).unwrap(), vec![("a".to_owned(), b"1".to_vec())]);
        assert_eq!(store.position("t", 0).unwrap(), Some(5));
        assert_eq!(store.counters().unwrap(), vec![("total".to_owned(), i128::from(i64::MAX) + 1)]);
        assert_eq!(store.outbox().unwrap(), vec![(0, entry("out", 1))]);
    }

    #[test]
    fn keys_are_their_bytes_and_are_listed_in_byte_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir);
        let text = |t: &str| Key::parse_text(t).unwrap();
        let keys = [text(r#""b""#), text(r#""a""#), text(r#"["a", 1]"#), text(r#""ab""#), k(3)];
        let commit = BatchCommit {
            writes: keys.iter().map(|key| (key.clone(), writes(&[("v", Some(&key.to_string()))]))).collect(),
            ..BatchCommit::default()
        };
        store.commit(commit).unwrap();
        let mut sorted = keys.to_vec();
        sorted.sort();
        assert_eq!(store.keys().unwrap(), sorted);
        for key in &keys {
            assert_eq!(store.entries(key).unwrap(), vec![("v".to_owned(), key.to_string().into_bytes())]);
        }
    }

    #[test]
    fn a_file_of_the_old_format_is_refused_with_the_way_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            let old: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("state");
            txn.open_table(old).unwrap().insert((7, "balance"), b"1".as_slice()).unwrap();
            txn.commit().unwrap();
        }
        let error = StateStore::open(&path).unwrap_err();
        assert!(matches!(error, StateError::UnknownFormat { ref found, .. } if found == "1"), "{error}");
        assert!(error.to_string().contains("fresh --data"), "{error}");
        // A file this build wrote opens again.
        let fresh = dir.path().join("fresh.redb");
        drop(StateStore::open(&fresh).unwrap());
        StateStore::open(&fresh).unwrap();
    }

    #[test]
    fn delete_removes_an_entry_and_an_empty_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir);
        store
            .commit(BatchCommit {
                writes: vec![(k(1), writes(&[("a", Some("1")), ("b", Some("2"))]))],
                ..Default::default()
            })
            .unwrap();
        store
            .commit(BatchCommit { writes: vec![(k(1), writes(&[("a", None), ("zz", None)]))], ..Default::default() })
            .unwrap();
        assert_eq!(store.get(&k(1), "a").unwrap(), None);
        assert_eq!(store.entries(&k(1)).unwrap(), vec![("b".to_owned(), b"2".to_vec())]);
        store.commit(BatchCommit { writes: vec![(k(1), writes(&[("b", None)]))], ..Default::default() }).unwrap();
        assert_eq!(store.keys().unwrap(), Vec::<Key>::new());
    }

    #[test]
    fn counters_add_across_commits_and_stats_saturate() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir);
        for (delta, stat) in [(5, 1), (-8, 2), (10, u64::MAX)] {
            store
                .commit(BatchCommit {
                    counter_deltas: [("c".to_owned(), delta), ("d".to_owned(), 1)].into_iter().collect(),
                    stat_deltas: [("applied".to_owned(), stat), ("retried".to_owned(), 1)].into_iter().collect(),
                    ..Default::default()
                })
                .unwrap();
        }
        assert_eq!(store.counters().unwrap(), vec![("c".to_owned(), 7), ("d".to_owned(), 3)]);
        assert_eq!(store.reader().unwrap().counter("c").unwrap(), 7);
        assert_eq!(store.stats().unwrap(), vec![("applied".to_owned(), u64::MAX), ("retried".to_owned(), 3)]);
    }

    #[test]
    fn outbox_sequence_numbers_keep_increasing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let store = StateStore::open(&path).unwrap();
        store.commit(BatchCommit { outbox: vec![entry("a", 0), entry("b", 1)], ..Default::default() }).unwrap();
        store.commit(BatchCommit { outbox: vec![entry("a", 2)], ..Default::default() }).unwrap();
        assert_eq!(store.outbox().unwrap(), vec![(0, entry("a", 0)), (1, entry("b", 1)), (2, entry("a", 2))]);
        store.remove_outbox(1).unwrap();
        assert_eq!(store.outbox().unwrap(), vec![(2, entry("a", 2))]);
        store.remove_outbox(2).unwrap();
        assert_eq!(store.outbox().unwrap(), vec![]);
        drop(store);
        let store = StateStore::open(&path).unwrap();
        store.commit(BatchCommit { outbox: vec![entry("c", 3)], ..Default::default() }).unwrap();
        assert_eq!(store.outbox().unwrap(), vec![(3, entry("c", 3))]);
        store.remove_outbox(0).unwrap();
        assert_eq!(store.outbox().unwrap().len(), 1);
        // Settling replaces: entries up to 3 go, the new one gets 4.
        store.commit(BatchCommit { outbox: vec![entry("d", 4)], ..Default::default() }).unwrap();
        let settle = BatchCommit { outbox: vec![entry("dlq", 5)], outbox_through: Some(3), ..Default::default() };
        store.commit(settle).unwrap();
        assert_eq!(store.outbox().unwrap(), vec![(4, entry("d", 4)), (5, entry("dlq", 5))]);
    }

    #[test]
    fn corrupt_outbox_entry_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        drop(StateStore::open(&path).unwrap());
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(OUTBOX).unwrap().insert(4, [0xFF, 0xFF].as_slice()).unwrap();
            txn.commit().unwrap();
        }
        let err = StateStore::open(&path).unwrap().outbox().unwrap_err();
        assert!(matches!(err, StateError::Corrupt { ref what, .. } if what.starts_with("outbox entry 4: ")), "{err}");
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

    #[test]
    fn a_reader_sees_its_snapshot_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir);
        store
            .commit(BatchCommit {
                writes: vec![(k(1), writes(&[("a", Some("old"))]))],
                counter_deltas: [("c".to_owned(), 1)].into_iter().collect(),
                ..Default::default()
            })
            .unwrap();
        let before = store.reader().unwrap();
        store
            .commit(BatchCommit {
                writes: vec![(k(1), writes(&[("a", Some("new")), ("b", Some("new"))]))],
                counter_deltas: [("c".to_owned(), 10)].into_iter().collect(),
                ..Default::default()
            })
            .unwrap();
        // Shared by reference across threads, as the workers of a batch do.
        std::thread::scope(|s| {
            s.spawn(|| {
                assert_eq!(before.get(&k(1), "a").unwrap(), bytes("old"));
                assert_eq!(before.get(&k(1), "b").unwrap(), None);
                assert_eq!(before.counter("c").unwrap(), 1);
            });
        });
        let after = store.reader().unwrap();
        assert_eq!(after.get(&k(1), "a").unwrap(), bytes("new"));
        assert_eq!(after.counter("c").unwrap(), 11);
    }

    #[test]
    fn meta_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir);
        assert_eq!(store.meta("module/bank").unwrap(), None);
        store.set_meta("module/bank", b"v1").unwrap();
        store.set_meta("module/bank", b"v2").unwrap();
        assert_eq!(store.meta("module/bank").unwrap(), Some(b"v2".to_vec()));
    }

    #[test]
    fn done_offsets_are_dropped_once_the_position_passes_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir);
        let done = |offsets: &[u64]| offsets.iter().map(|&o| ("retry_t".to_owned(), 1, o)).collect();
        store.commit(BatchCommit { done: done(&[4, 7, 9]), ..BatchCommit::default() }).unwrap();
        store.commit(BatchCommit { done: done(&[3]), ..BatchCommit::default() }).unwrap();
        assert_eq!(store.done("retry_t", 1).unwrap(), [3, 4, 7, 9]);
        assert!(store.done("retry_t", 0).unwrap().is_empty());
        // Position 8 in the same commit as a new done offset: below 8 goes.
        let commit =
            BatchCommit { done: done(&[12]), positions: vec![("retry_t".into(), 1, 8)], ..BatchCommit::default() };
        store.commit(commit).unwrap();
        assert_eq!(store.done("retry_t", 1).unwrap(), [9, 12]);
    }
}
