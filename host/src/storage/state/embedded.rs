//! The embedded state store: one transactional redb file per projection,
//! the default backend.
//!
//! Calls block on file I/O (a commit waits for `fsync`). redb serializes
//! write transactions, and a reader never waits for a writer. Only one
//! process may have the file open at a time (redb locks it), so there is
//! nothing to fence: [`StateBackend::claim`] always answers epoch 0.
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
//! that partition below it. Timers: `timers` ((key bytes, name) →
//! partition as u32 LE, time as i64 LE, payload) and its index by time,
//! `timers_due` ((partition, time, key bytes, name)), both written in the
//! batch's transaction.

use std::ops::Bound;
use std::path::{Path, PathBuf};

use redb::{
    Database, ReadOnlyTable, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle,
};

use wakuwaku_core::timers::{Millis, Timer};

use super::{
    BatchCommit, OutboxEntry, Snapshot, StateBackend, StateError, StateReader, TimerSummary, TimerWrite, decode_outbox,
    encode_outbox,
};
use crate::key::Key;
use crate::storage::redb_file::{self, OpenError};
use crate::storage::stats::Stats;

const STATE: TableDefinition<(&[u8], &str), &[u8]> = TableDefinition::new("state");
const COUNTERS: TableDefinition<&str, i128> = TableDefinition::new("counters");
const STATS: TableDefinition<&str, u64> = TableDefinition::new("stats");
const POSITIONS: TableDefinition<(&str, u32), u64> = TableDefinition::new("positions");
const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const SEQUENCES: TableDefinition<&str, u64> = TableDefinition::new("sequences");
const DONE: TableDefinition<(&str, u32, u64), ()> = TableDefinition::new("done");
const TIMERS: TableDefinition<(&[u8], &str), &[u8]> = TableDefinition::new("timers");
const TIMERS_DUE: TableDefinition<(u32, i64, &[u8], &str), ()> = TableDefinition::new("timers_due");

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

/// The state file of one projection.
///
/// Only one process may have the file open at a time (redb locks it);
/// share it within a process through a [`super::StateStore`].
pub struct EmbeddedStore {
    db: Database,
    path: PathBuf,
    /// `` `path` ``, for messages.
    location: String,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore").field("path", &self.path).finish_non_exhaustive()
    }
}

impl EmbeddedStore {
    /// Opens the state file at `path`, creating it (and its parent
    /// directories) if it does not exist, after checking all of it
    /// ([`StateError::Damaged`]).
    pub fn open(path: &Path) -> Result<Self, StateError> {
        let path = path.to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| StateError::Io { path: path.clone(), source })?;
        }
        let location = format!("`{}`", path.display());
        let db = redb_file::open(&path, CACHE_BYTES).map_err(|e| match e {
            OpenError::Damaged(reason) => StateError::Damaged { store: location.clone(), reason },
            OpenError::Engine(redb::DatabaseError::DatabaseAlreadyOpen) => {
                StateError::InUse { store: location.clone() }
            }
            OpenError::Engine(e) => storage(&location, e),
        })?;
        let store = Self { db, path, location };
        store.check_format()?;
        // Create every table now, so readers never meet a missing one.
        let txn = store.db.begin_write().map_err(|e| store.storage(e))?;
        txn.open_table(STATE).map_err(|e| store.storage(e))?;
        txn.open_table(COUNTERS).map_err(|e| store.storage(e))?;
        txn.open_table(STATS).map_err(|e| store.storage(e))?;
        txn.open_table(POSITIONS).map_err(|e| store.storage(e))?;
        txn.open_table(OUTBOX).map_err(|e| store.storage(e))?;
        txn.open_table(META).map_err(|e| store.storage(e))?;
        txn.open_table(SEQUENCES).map_err(|e| store.storage(e))?;
        txn.open_table(DONE).map_err(|e| store.storage(e))?;
        txn.open_table(TIMERS).map_err(|e| store.storage(e))?;
        txn.open_table(TIMERS_DUE).map_err(|e| store.storage(e))?;
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
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
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
                path: self.path.clone(),
                found: other.map_or_else(|| "1".to_owned(), |format| String::from_utf8_lossy(&format).into_owned()),
            }),
        }
    }

    /// The file this state is stored in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn list<V>(&self, definition: TableDefinition<&str, V>) -> Result<Vec<(String, V)>, StateError>
    where
        V: for<'a> redb::Value<SelfType<'a> = V> + 'static,
    {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(definition).map_err(|e| self.storage(e))?;
        let mut list = Vec::new();
        for entry in table.iter().map_err(|e| self.storage(e))? {
            let (name, value) = entry.map_err(|e| self.storage(e))?;
            list.push((name.value().to_owned(), value.value()));
        }
        Ok(list)
    }

    fn storage(&self, e: impl Into<redb::Error>) -> StateError {
        storage(&self.location, e)
    }

    fn corrupt(&self, what: String) -> StateError {
        StateError::Corrupt { store: self.location.clone(), what }
    }
}

impl StateBackend for EmbeddedStore {
    fn location(&self) -> &str {
        &self.location
    }

    fn claim(&self, _partition: u32) -> Result<u64, StateError> {
        Ok(0)
    }

    /// A read snapshot: it sees every commit made before this call and none
    /// made after, however long it is kept.
    ///
    /// Hold one per batch: a snapshot keeps the pages it sees from being
    /// reused, so a reader kept forever makes the file grow.
    fn reader(&self) -> Result<StateReader, StateError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        Ok(StateReader::new(EmbeddedSnapshot {
            state: txn.open_table(STATE).map_err(|e| self.storage(e))?,
            counters: txn.open_table(COUNTERS).map_err(|e| self.storage(e))?,
            timers: txn.open_table(TIMERS).map_err(|e| self.storage(e))?,
            location: self.location.clone(),
        }))
    }

    /// Applies a batch in one durable transaction: all of it, or nothing.
    ///
    /// Counters are summed in i128, so no batch overflows them (each delta
    /// was checked against the i64 range where it was added). An empty
    /// commit writes nothing.
    fn commit(&self, commit: BatchCommit) -> Result<(), StateError> {
        if commit.is_empty() {
            return Ok(());
        }
        let BatchCommit { writes, counter_deltas, stat_deltas, positions, outbox, done, outbox_through, timers } =
            commit;
        let outbox = outbox.iter().map(|entry| encode_outbox(entry, &self.location)).collect::<Result<Vec<_>, _>>()?;

        let txn = self.db.begin_write().map_err(|e| self.storage(e))?;
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
            for (name, delta) in stat_deltas.named() {
                let value = stats.get(name).map_err(|e| self.storage(e))?.map_or(0, |v| v.value());
                stats.insert(name, value.saturating_add(delta)).map_err(|e| self.storage(e))?;
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

            self.write_timers(&txn, &timers)?;

            if let Some((partition, through)) = outbox_through {
                let mut table = txn.open_table(OUTBOX).map_err(|e| self.storage(e))?;
                retain_others(&mut table, partition, through).map_err(|e| self.storage(e))?;
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
    fn keys(&self) -> Result<Vec<Key>, StateError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
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
    fn entries(&self, key: &Key) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
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
    fn get(&self, key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        self.reader()?.get(key, name)
    }

    /// Every counter with its value, by name.
    fn counters(&self) -> Result<Vec<(String, i128)>, StateError> {
        self.list(COUNTERS)
    }

    fn counters_page(&self, after: Option<&str>, limit: usize) -> Result<Vec<(String, i128)>, StateError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(COUNTERS).map_err(|e| self.storage(e))?;
        let range = match after {
            Some(after) => table.range::<&str>((Bound::Excluded(after), Bound::Unbounded)),
            None => table.range::<&str>(..),
        };
        let mut page = Vec::new();
        for entry in range.map_err(|e| self.storage(e))?.take(limit) {
            let (name, value) = entry.map_err(|e| self.storage(e))?;
            page.push((name.value().to_owned(), value.value()));
        }
        Ok(page)
    }

    fn entries_page(
        &self,
        key: &Key,
        after: Option<&str>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(STATE).map_err(|e| self.storage(e))?;
        let start = match after {
            Some(after) => Bound::Excluded((key.as_bytes(), after)),
            None => Bound::Included((key.as_bytes(), "")),
        };
        let (mut page, mut bytes) = (Vec::new(), 0usize);
        for entry in table.range::<(&[u8], &str)>((start, Bound::Unbounded)).map_err(|e| self.storage(e))? {
            // The first entry always comes; none after the values reach
            // the bytes.
            if page.len() >= limit || (bytes >= max_bytes && !page.is_empty()) {
                break;
            }
            let (k, v) = entry.map_err(|e| self.storage(e))?;
            let (entry_key, name) = k.value();
            if entry_key != key.as_bytes() {
                break;
            }
            let value = v.value();
            bytes = bytes.saturating_add(value.len());
            page.push((name.to_owned(), value.to_vec()));
        }
        Ok(page)
    }

    /// Every statistic with its value.
    fn stats(&self) -> Result<Stats, StateError> {
        let mut stats = Stats::new();
        for (name, count) in self.list(STATS)? {
            stats.add_named(&name, count);
        }
        Ok(stats)
    }

    /// The next offset to consume from a partition, as last committed.
    fn position(&self, topic: &str, partition: u32) -> Result<Option<u64>, StateError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(POSITIONS).map_err(|e| self.storage(e))?;
        Ok(table.get((topic, partition)).map_err(|e| self.storage(e))?.map(|v| v.value()))
    }

    /// Offsets of a partition marked done ([`BatchCommit::done`]), in order.
    fn done(&self, topic: &str, partition: u32) -> Result<Vec<u64>, StateError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(DONE).map_err(|e| self.storage(e))?;
        let mut offsets = Vec::new();
        for entry in table.range((topic, partition, 0)..=(topic, partition, u64::MAX)).map_err(|e| self.storage(e))? {
            offsets.push(entry.map_err(|e| self.storage(e))?.0.value().2);
        }
        Ok(offsets)
    }

    /// The pending outbox entries with their sequence numbers, in order.
    fn outbox(&self) -> Result<Vec<(u64, OutboxEntry)>, StateError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(OUTBOX).map_err(|e| self.storage(e))?;
        let mut entries = Vec::new();
        for entry in table.iter().map_err(|e| self.storage(e))? {
            let (seq, bytes) = entry.map_err(|e| self.storage(e))?;
            let seq = seq.value();
            let entry = decode_outbox(seq, bytes.value()).map_err(|what| self.corrupt(what))?;
            entries.push((seq, entry));
        }
        Ok(entries)
    }

    /// A value the host keeps for itself (module versions, format marks).
    fn meta(&self, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(META).map_err(|e| self.storage(e))?;
        Ok(table.get(name).map_err(|e| self.storage(e))?.map(|v| v.value().to_vec()))
    }

    /// Sets a host value, in its own durable transaction.
    fn set_meta(&self, name: &str, value: &[u8]) -> Result<(), StateError> {
        let txn = self.db.begin_write().map_err(|e| self.storage(e))?;
        {
            let mut table = txn.open_table(META).map_err(|e| self.storage(e))?;
            table.insert(name, value).map_err(|e| self.storage(e))?;
        }
        txn.commit().map_err(|e| self.storage(e))
    }

    // Reset (issue 14)

    /// Nothing to do: the file lock keeps every other process out.
    fn hold_for_run(&self) -> Result<(), StateError> {
        Ok(())
    }

    /// Nothing to do: opening the file took its lock.
    fn lock_for_reset(&self) -> Result<(), StateError> {
        Ok(())
    }

    fn positions(&self) -> Result<Vec<(String, u32, u64)>, StateError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(POSITIONS).map_err(|e| self.storage(e))?;
        let mut positions = Vec::new();
        for entry in table.iter().map_err(|e| self.storage(e))? {
            let (key, next) = entry.map_err(|e| self.storage(e))?;
            let (topic, partition) = key.value();
            positions.push((topic.to_owned(), partition, next.value()));
        }
        Ok(positions)
    }

    fn done_marks(&self) -> Result<Vec<(String, u32, u64)>, StateError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(DONE).map_err(|e| self.storage(e))?;
        let mut marks = Vec::new();
        for entry in table.iter().map_err(|e| self.storage(e))? {
            let (mark, _) = entry.map_err(|e| self.storage(e))?;
            let (topic, partition, offset) = mark.value();
            marks.push((topic.to_owned(), partition, offset));
        }
        Ok(marks)
    }

    fn meta_entries(&self) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(META).map_err(|e| self.storage(e))?;
        let mut entries = Vec::new();
        for entry in table.iter().map_err(|e| self.storage(e))? {
            let (name, value) = entry.map_err(|e| self.storage(e))?;
            entries.push((name.value().to_owned(), value.value().to_vec()));
        }
        Ok(entries)
    }

    fn start_over(&self, positions: Vec<(String, u32, u64)>) -> Result<(), StateError> {
        let txn = self.db.begin_write().map_err(|e| self.storage(e))?;
        {
            txn.open_table(STATE).map_err(|e| self.storage(e))?.retain(|_, _| false).map_err(|e| self.storage(e))?;
            txn.open_table(COUNTERS).map_err(|e| self.storage(e))?.retain(|_, _| false).map_err(|e| self.storage(e))?;
            txn.open_table(STATS).map_err(|e| self.storage(e))?.retain(|_, _| false).map_err(|e| self.storage(e))?;
            txn.open_table(DONE).map_err(|e| self.storage(e))?.retain(|_, _| false).map_err(|e| self.storage(e))?;
            txn.open_table(OUTBOX).map_err(|e| self.storage(e))?.retain(|_, _| false).map_err(|e| self.storage(e))?;
            txn.open_table(TIMERS).map_err(|e| self.storage(e))?.retain(|_, _| false).map_err(|e| self.storage(e))?;
            let mut due = txn.open_table(TIMERS_DUE).map_err(|e| self.storage(e))?;
            due.retain(|_, _| false).map_err(|e| self.storage(e))?;
            let mut table = txn.open_table(POSITIONS).map_err(|e| self.storage(e))?;
            table.retain(|_, _| false).map_err(|e| self.storage(e))?;
            for (topic, partition, next) in &positions {
                table.insert((topic.as_str(), *partition), *next).map_err(|e| self.storage(e))?;
            }
        }
        txn.commit().map_err(|e| self.storage(e))
    }

    fn due_timers(&self, partition: u32, before: Millis, limit: usize) -> Result<Vec<(Key, Millis)>, StateError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let due = txn.open_table(TIMERS_DUE).map_err(|e| self.storage(e))?;
        let range = due
            .range((partition, Millis::MIN, &[][..], "")..(partition, before, &[][..], ""))
            .map_err(|e| self.storage(e))?;
        let mut keys: Vec<(Key, Millis)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for entry in range {
            if keys.len() >= limit {
                break;
            }
            let (index, _) = entry.map_err(|e| self.storage(e))?;
            let (_, at, key, _) = index.value();
            if seen.insert(key.to_vec()) {
                let key = Key::from_canonical(key).map_err(|e| self.corrupt(format!("a timer's key: {e}")))?;
                keys.push((key, at));
            }
        }
        Ok(keys)
    }

    fn timer_summary(&self, partition: Option<u32>) -> Result<TimerSummary, StateError> {
        let txn = self.db.begin_read().map_err(|e| self.storage(e))?;
        let due = txn.open_table(TIMERS_DUE).map_err(|e| self.storage(e))?;
        let (pending, next_at) = match partition {
            None => {
                let pending = due.len().map_err(|e| self.storage(e))?;
                let mut next_at: Option<Millis> = None;
                // The earliest of each partition's first entry.
                let mut from = (0u32, Millis::MIN);
                loop {
                    let mut range = due.range((from.0, from.1, &[][..], "")..).map_err(|e| self.storage(e))?;
                    let Some(entry) = range.next() else { break };
                    let (partition, at, _, _) = entry.map_err(|e| self.storage(e))?.0.value();
                    next_at = Some(next_at.map_or(at, |next: Millis| next.min(at)));
                    match partition.checked_add(1) {
                        Some(next) => from = (next, Millis::MIN),
                        None => break,
                    }
                }
                (pending, next_at)
            }
            Some(partition) => {
                let range = due.range((partition, Millis::MIN, &[][..], "")..).map_err(|e| self.storage(e))?;
                let mut pending = 0u64;
                let mut next_at = None;
                for entry in range {
                    let (of, at, _, _) = entry.map_err(|e| self.storage(e))?.0.value();
                    if of != partition {
                        break;
                    }
                    next_at.get_or_insert(at);
                    pending += 1;
                }
                (pending, next_at)
            }
        };
        Ok(TimerSummary { pending, next_at })
    }
}

impl EmbeddedStore {
    /// Replaces the timers of each key in `writes`, in both tables.
    fn write_timers(&self, txn: &redb::WriteTransaction, writes: &[TimerWrite]) -> Result<(), StateError> {
        if writes.is_empty() {
            return Ok(());
        }
        let mut timers = txn.open_table(TIMERS).map_err(|e| self.storage(e))?;
        let mut due = txn.open_table(TIMERS_DUE).map_err(|e| self.storage(e))?;
        for TimerWrite { key, partition, timers: now } in writes {
            let key = key.as_bytes();
            let mut old: Vec<(String, u32, Millis)> = Vec::new();
            for entry in timers.range((key, "")..).map_err(|e| self.storage(e))? {
                let (index, value) = entry.map_err(|e| self.storage(e))?;
                let (held_by, name) = index.value();
                if held_by != key {
                    break;
                }
                let (partition, at, _) = decode_timer(value.value()).ok_or_else(|| self.corrupt_timer(name))?;
                old.push((name.to_owned(), partition, at));
            }
            for (name, partition, at) in &old {
                timers.remove((key, name.as_str())).map_err(|e| self.storage(e))?;
                due.remove((*partition, *at, key, name.as_str())).map_err(|e| self.storage(e))?;
            }
            for Timer { name, at, payload } in now {
                let value = encode_timer(*partition, *at, payload);
                timers.insert((key, name.as_str()), value.as_slice()).map_err(|e| self.storage(e))?;
                due.insert((*partition, *at, key, name.as_str()), ()).map_err(|e| self.storage(e))?;
            }
        }
        Ok(())
    }

    fn corrupt_timer(&self, name: &str) -> StateError {
        self.corrupt(format!("timer `{name}` cannot be decoded"))
    }
}

/// A timer's value in `timers`: partition (u32 LE), time (i64 LE), payload.
fn encode_timer(partition: u32, at: Millis, payload: &[u8]) -> Vec<u8> {
    [&partition.to_le_bytes()[..], &at.to_le_bytes(), payload].concat()
}

fn decode_timer(bytes: &[u8]) -> Option<(u32, Millis, &[u8])> {
    let (partition, rest) = bytes.split_first_chunk::<4>()?;
    let (at, payload) = rest.split_first_chunk::<8>()?;
    Some((u32::from_le_bytes(*partition), Millis::from_le_bytes(*at), payload))
}

fn storage(location: &str, e: impl Into<redb::Error>) -> StateError {
    StateError::Storage { store: location.to_owned(), source: Box::new(e.into()) }
}

/// A read snapshot of the file: a redb read transaction's tables.
struct EmbeddedSnapshot {
    state: ReadOnlyTable<(&'static [u8], &'static str), &'static [u8]>,
    counters: ReadOnlyTable<&'static str, i128>,
    timers: ReadOnlyTable<(&'static [u8], &'static str), &'static [u8]>,
    location: String,
}

impl Snapshot for EmbeddedSnapshot {
    fn get(&self, key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let value = self.state.get((key.as_bytes(), name)).map_err(|e| storage(&self.location, e))?;
        Ok(value.map(|v| v.value().to_vec()))
    }

    fn contains(&self, key: &Key, name: &str) -> Result<bool, StateError> {
        Ok(self.state.get((key.as_bytes(), name)).map_err(|e| storage(&self.location, e))?.is_some())
    }

    fn entry_count(&self, key: &Key, at_most: usize) -> Result<usize, StateError> {
        let range = self.state.range((key.as_bytes(), "")..).map_err(|e| storage(&self.location, e))?;
        let mut count = 0;
        for entry in range.take(at_most) {
            if entry.map_err(|e| storage(&self.location, e))?.0.value().0 != key.as_bytes() {
                break;
            }
            count += 1;
        }
        Ok(count)
    }

    fn counter(&self, name: &str) -> Result<Option<i128>, StateError> {
        let value = self.counters.get(name).map_err(|e| storage(&self.location, e))?;
        Ok(value.map(|v| v.value()))
    }

    /// redb keeps every table's length: no counting at all.
    fn counter_count(&self, at_most: usize) -> Result<usize, StateError> {
        let held = self.counters.len().map_err(|e| storage(&self.location, e))?;
        Ok(usize::try_from(held).unwrap_or(usize::MAX).min(at_most))
    }

    fn timers(&self, key: &Key) -> Result<Vec<Timer>, StateError> {
        let mut timers = Vec::new();
        for entry in self.timers.range((key.as_bytes(), "")..).map_err(|e| storage(&self.location, e))? {
            let (index, value) = entry.map_err(|e| storage(&self.location, e))?;
            let (held_by, name) = index.value();
            if held_by != key.as_bytes() {
                break;
            }
            let (_, at, payload) = decode_timer(value.value()).ok_or_else(|| StateError::Corrupt {
                store: self.location.clone(),
                what: format!("timer `{name}` cannot be decoded"),
            })?;
            timers.push(Timer { name: name.to_owned(), at, payload: payload.to_vec() });
        }
        Ok(timers)
    }

    /// redb keeps every table's length: no counting at all.
    fn timer_count(&self, at_most: usize) -> Result<usize, StateError> {
        let held = self.timers.len().map_err(|e| storage(&self.location, e))?;
        Ok(usize::try_from(held).unwrap_or(usize::MAX).min(at_most))
    }
}

/// Removes the outbox entries of `partition` up to `through`, keeping the
/// other partitions' (and any entry that cannot be decoded: reading it
/// reports it).
fn retain_others(table: &mut redb::Table<u64, &[u8]>, partition: u32, through: u64) -> Result<(), redb::StorageError> {
    table
        .retain_in(..=through, |seq, bytes| decode_outbox(seq, bytes).map_or(true, |entry| entry.source() != partition))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::state::suite::{Fixture, state_suite};
    use crate::storage::state::{KeyWrites, StateStore};

    struct Dir(tempfile::TempDir);

    impl Fixture for Dir {
        fn open(&self) -> StateStore {
            // A directory that does not exist yet: opening creates it.
            StateStore::open(&self.0.path().join("p/state.redb")).unwrap()
        }

        fn fences(&self) -> bool {
            false
        }
    }

    state_suite!(Some(Dir(tempfile::tempdir().unwrap())));

    #[test]
    fn stats_written_by_name_by_earlier_hosts_read_back_typed_and_keep_their_names() {
        use crate::storage::stats::tests::PERSISTED;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        drop(StateStore::open(&path).unwrap());
        // The rows as earlier hosts (and a newer one, `from_a_newer_host`) wrote them.
        let rows = |path: &Path| {
            let db = Database::create(path).unwrap();
            let txn = db.begin_read().unwrap();
            let table = txn.open_table(STATS).unwrap();
            let rows = table.iter().unwrap().map(|row| row.unwrap());
            rows.map(|(name, value)| (name.value().to_owned(), value.value())).collect::<Vec<_>>()
        };
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut table = txn.open_table(STATS).unwrap();
                for ((name, _), n) in PERSISTED.into_iter().zip(1..) {
                    table.insert(name, n).unwrap();
                }
                table.insert("from_a_newer_host", 99).unwrap();
            }
            txn.commit().unwrap();
        }
        let store = StateStore::open(&path).unwrap();
        let stats = store.stats().unwrap();
        for ((_, stat), n) in PERSISTED.into_iter().zip(1..) {
            assert_eq!(stats[stat], n, "{stat}");
        }
        assert_eq!(stats.unknown().get("from_a_newer_host"), Some(&99));
        // Written back under the same names: one row each, added to.
        store.commit(BatchCommit { stat_deltas: stats, ..BatchCommit::default() }).unwrap();
        drop(store);
        let mut expected: Vec<(String, u64)> =
            PERSISTED.into_iter().zip(1..).map(|((name, _), n)| (name.to_owned(), 2 * n)).collect();
        expected.push(("from_a_newer_host".to_owned(), 198));
        expected.sort();
        assert_eq!(rows(&path), expected);
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
    fn a_file_another_store_holds_is_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let held = StateStore::open(&path).unwrap();
        let error = StateStore::open(&path).unwrap_err();
        assert!(matches!(error, StateError::InUse { ref store } if store.contains("state.redb")), "{error}");
        drop(held);
        StateStore::open(&path).unwrap();
    }

    /// Everything a host reads of a state file: what a damaged file must
    /// answer with an error or with values, never a panic.
    fn read_everything(path: &Path) -> Result<usize, StateError> {
        let store = StateStore::open(path)?;
        let reader = store.reader()?;
        let mut read = 0;
        for key in store.keys()? {
            for (name, _) in store.entries(&key)? {
                reader.get(&key, &name)?;
                read += 1;
            }
        }
        for (name, _) in store.counters()? {
            reader.counter(&name)?;
        }
        store.positions()?;
        store.outbox()?;
        store.meta_entries()?;
        Ok(read)
    }

    #[test]
    fn a_damaged_file_is_refused_at_opening_naming_it_never_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let intact = dir.path().join("intact.redb");
        {
            let store = StateStore::open(&intact).unwrap();
            for batch in 0..10u64 {
                let mut commit = BatchCommit::default();
                for account in 0..200u64 {
                    let mut writes = KeyWrites::default();
                    writes.set("balance", format!("{{\"balance\": {}}}", batch * account).into_bytes());
                    commit.writes.push((Key::int(batch * 1000 + account), writes));
                }
                commit.counter_deltas.insert(format!("c{batch}"), 1);
                commit.positions.push(("t".to_owned(), 0, batch));
                store.commit(commit).unwrap();
            }
        }
        assert_eq!(read_everything(&intact).unwrap(), 2000);
        // Without the check at opening, redb panics on some of these copies
        // (a page index past its page).
        let mut refused = 0;
        for seed in 0..40 {
            let path = dir.path().join(format!("damaged-{seed}.redb"));
            std::fs::copy(&intact, &path).unwrap();
            redb_file::flip_bytes(&path, seed, 50);
            match read_everything(&path) {
                Err(StateError::Damaged { store, .. }) => {
                    assert_eq!(store, format!("`{}`", path.display()));
                    refused += 1;
                }
                Err(other) => panic!("seed {seed}: not reported as damaged: {other:?}"),
                // The bytes fell where no committed page is.
                Ok(read) => assert_eq!(read, 2000, "seed {seed}"),
            }
        }
        assert!(refused >= 30, "only {refused} of 40 damaged copies refused");
    }

    #[test]
    fn an_emptied_file_is_damaged_not_a_new_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.redb");
        drop(StateStore::open(&path).unwrap());
        std::fs::write(&path, b"").unwrap();
        let error = StateStore::open(&path).unwrap_err();
        assert!(matches!(&error, StateError::Damaged { .. }), "{error:?}");
        assert!(error.to_string().contains("is empty"), "{error}");
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
}
