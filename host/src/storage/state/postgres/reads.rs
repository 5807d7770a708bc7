//! What a batch reads: snapshots ([`PostgresSnapshot`]), how a batch's
//! snapshot begins with its partition's epoch and its keys' entries in one
//! round trip ([`open_batch`]), and what one read of an entry asks
//! ([`get`]).
//!
//! Rules kept here:
//! - **A snapshot is one transaction**, `REPEATABLE READ READ ONLY`, begun
//!   at once on one pooled connection: it sees the commits before it and
//!   none after. The workers of a batch share it (tokio-postgres
//!   pipelines their queries); dropping it rolls the transaction back
//!   before the connection returns to the pool.
//! - **A batch's snapshot loads its keys whole or not at all**: every
//!   entry of the keys asked for, in order of key, while the names and
//!   values stay within the bound; the key the bound cut is read one
//!   query at a time, as are the keys after it ([`OpenedBatch`]).
//! - **Counts stop at the bound the quotas need** (`LIMIT`), so a count
//!   costs at most that many rows.

use std::collections::HashMap;
use std::sync::Arc;

use super::super::cache::KeyEntries;
use super::super::{Snapshot, StateError};
use super::bridge::wait;
use super::db::{Db, i32_of};
use super::inspect::number;
use crate::key::Key;
use wakuwaku_core::timers::Timer;

/// What a snapshot's transaction begins with.
pub(super) const BEGIN_SNAPSHOT: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1";

/// Every entry of the keys `$2` (sorted), in order of key and name, while
/// the names and values so far stay within `$3` bytes; then, if that cut
/// the list short, one row (key, NULL, NULL) naming the key it stopped in.
/// Keys from that one on are not loaded (the batch reads them one query at
/// a time); those before it are loaded whole, entries or none.
const FETCH_KEYS: &str = "WITH s AS ( \
         SELECT key, name, value, sum(octet_length(name) + octet_length(value)) OVER (ORDER BY key, name) AS upto \
         FROM waku_state WHERE projection = $1 AND key = ANY($2) \
     ) \
     SELECT key, name, value FROM s WHERE upto <= $3 \
     UNION ALL \
     (SELECT key, NULL, NULL FROM s WHERE upto > $3 ORDER BY key, name LIMIT 1)";

/// What [`open_batch`] read: the partition's epoch in the snapshot and
/// the entries of the keys asked for.
#[derive(Debug, Default)]
pub(super) struct OpenedBatch {
    pub(super) epoch: Option<i64>,
    rows: HashMap<Vec<u8>, KeyEntries>,
    /// The key the byte bound stopped in.
    cut: Option<Vec<u8>>,
}

impl OpenedBatch {
    /// Takes one row of [`FETCH_KEYS`]: an entry of `key`, or (`None`) the
    /// key the bound stopped in.
    fn add(&mut self, key: Vec<u8>, entry: Option<(String, Vec<u8>)>) {
        match entry {
            Some((name, value)) => {
                self.rows.entry(key).or_default().insert(name, value);
            }
            None => self.cut = Some(key),
        }
    }

    /// The entries of each of `keys` (sorted by their bytes, as asked) that
    /// was loaded whole: every key before the cut, with no entry if it has
    /// none.
    pub(super) fn into_entries(mut self, keys: Vec<Key>) -> HashMap<Key, Arc<KeyEntries>> {
        keys.into_iter()
            .take_while(|key| self.cut.as_deref().is_none_or(|cut| key.as_bytes() < cut))
            .map(|key| {
                let entries = self.rows.remove(key.as_bytes()).unwrap_or_default();
                (key, Arc::new(entries))
            })
            .collect()
    }
}

/// Begins a batch's snapshot and, in the same round trip, reads the
/// epoch of `partition` (when `fenced`) and every entry of `keys`
/// (sorted by their bytes) up to `bound` bytes of names and values.
pub(super) async fn open_batch(
    db: &Db,
    partition: u32,
    fenced: bool,
    keys: Vec<Vec<u8>>,
    bound: i64,
) -> Result<OpenedBatch, StateError> {
    let epoch_sql = "SELECT epoch FROM waku_epochs WHERE projection = $1 AND partition = $2";
    let epoch_statement = match fenced {
        true => Some(db.prepared(epoch_sql).await?),
        false => None,
    };
    let fetch_statement = match keys.is_empty() {
        true => None,
        false => Some(db.prepared(FETCH_KEYS).await?),
    };
    let (p, client) = (&*db.projection, db.client());
    let partition = i32_of(partition);
    let begin = client.batch_execute(BEGIN_SNAPSHOT);
    let epoch = async {
        match &epoch_statement {
            Some(statement) => client.query(statement, &[&p, &partition]).await.map(Some),
            None => Ok(None),
        }
    };
    let fetch = async {
        match &fetch_statement {
            Some(statement) => client.query(statement, &[&p, &keys, &bound]).await,
            None => Ok(Vec::new()),
        }
    };
    let (begun, epoch, rows) = tokio::join!(begin, epoch, fetch);
    let answered = begun.and(epoch).and_then(|epoch| Ok((epoch, rows?)));
    let (epoch, rows) = match answered {
        Ok(answered) => answered,
        Err(error) => {
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(db.error(error));
        }
    };
    let epoch = epoch.and_then(|rows| rows.first().map(|row| row.get::<_, i64>(0)));
    let mut opened = OpenedBatch { epoch, ..OpenedBatch::default() };
    for row in rows {
        let entry = row.get::<_, Option<String>>(1).map(|name| (name, row.get(2)));
        opened.add(row.get(0), entry);
    }
    Ok(opened)
}

/// Begins a snapshot's transaction on `db`'s connection.
pub(super) async fn begin_snapshot(db: &Db) -> Result<(), StateError> {
    db.client().batch_execute(BEGIN_SNAPSHOT).await.map_err(|e| db.error(e))
}

/// The value of entry `name` of `key`.
pub(super) async fn get(db: &Db, key: &[u8], name: &str) -> Result<Option<Vec<u8>>, StateError> {
    let rows = db
        .query(
            "SELECT value FROM waku_state WHERE projection = $1 AND key = $2 AND name = $3",
            &[&&*db.projection, &key, &name],
        )
        .await?;
    Ok(rows.first().map(|row| row.get(0)))
}

/// A reader's transaction, rolled back when it is dropped.
pub(super) struct PostgresSnapshot {
    db: Db,
    bridge: tokio::runtime::Handle,
}

impl PostgresSnapshot {
    /// The snapshot whose transaction `db`'s connection has begun, its
    /// queries run on `bridge`.
    pub(super) fn new(db: Db, bridge: tokio::runtime::Handle) -> Self {
        Self { db, bridge }
    }
}

impl Snapshot for PostgresSnapshot {
    fn get(&self, key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let (db, key, name) = (self.db.share(), key.as_bytes().to_vec(), name.to_owned());
        wait(&self.db.location, &self.bridge, async move { get(&db, &key, &name).await })
    }

    fn contains(&self, key: &Key, name: &str) -> Result<bool, StateError> {
        let (db, key, name) = (self.db.share(), key.as_bytes().to_vec(), name.to_owned());
        wait(&self.db.location, &self.bridge, async move {
            let rows = db
                .query(
                    "SELECT 1 FROM waku_state WHERE projection = $1 AND key = $2 AND name = $3",
                    &[&&*db.projection, &key, &name],
                )
                .await?;
            Ok(!rows.is_empty())
        })
    }

    fn entry_count(&self, key: &Key, at_most: usize) -> Result<usize, StateError> {
        let (db, key) = (self.db.share(), key.as_bytes().to_vec());
        let at_most = i64::try_from(at_most).unwrap_or(i64::MAX);
        wait(&self.db.location, &self.bridge, async move {
            db.count(
                "SELECT count(*) FROM (SELECT 1 FROM waku_state WHERE projection = $1 AND key = $2 LIMIT $3) AS s",
                &[&&*db.projection, &key, &at_most],
            )
            .await
        })
    }

    fn counter(&self, name: &str) -> Result<Option<i128>, StateError> {
        let (db, name) = (self.db.share(), name.to_owned());
        wait(&self.db.location, &self.bridge, async move {
            let rows = db
                .query(
                    "SELECT value::text FROM waku_counters WHERE projection = $1 AND name = $2",
                    &[&&*db.projection, &name],
                )
                .await?;
            let Some(row) = rows.first() else { return Ok(None) };
            number(&db, "counter", &name, row.get(0)).map(Some)
        })
    }

    /// PostgreSQL keeps no row counts: this counts the index, stopping at
    /// `at_most` (the quota), so it costs at most that many rows.
    fn counter_count(&self, at_most: usize) -> Result<usize, StateError> {
        let db = self.db.share();
        let at_most = i64::try_from(at_most).unwrap_or(i64::MAX);
        wait(&self.db.location, &self.bridge, async move {
            db.count(
                "SELECT count(*) FROM (SELECT 1 FROM waku_counters WHERE projection = $1 LIMIT $2) AS s",
                &[&&*db.projection, &at_most],
            )
            .await
        })
    }

    fn timers(&self, key: &Key) -> Result<Vec<Timer>, StateError> {
        let (db, key) = (self.db.share(), key.as_bytes().to_vec());
        wait(&self.db.location, &self.bridge, async move { super::inspect::timers(&db, &key).await })
    }

    /// Counts the index, stopping at `at_most` (the quota).
    fn timer_count(&self, at_most: usize) -> Result<usize, StateError> {
        let db = self.db.share();
        let at_most = i64::try_from(at_most).unwrap_or(i64::MAX);
        wait(&self.db.location, &self.bridge, async move {
            db.count(
                "SELECT count(*) FROM (SELECT 1 FROM waku_timers WHERE projection = $1 LIMIT $2) AS s",
                &[&&*db.projection, &at_most],
            )
            .await
        })
    }
}

impl Drop for PostgresSnapshot {
    fn drop(&mut self) {
        if let Some(client) = self.db.client.take() {
            // The connection goes back to the pool once this ends.
            self.bridge.spawn(async move {
                let _ = client.batch_execute("ROLLBACK").await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, value: &str) -> Option<(String, Vec<u8>)> {
        Some((name.to_owned(), value.as_bytes().to_vec()))
    }

    /// Four keys, sorted by their bytes as a batch asks for them.
    fn keys() -> Vec<Key> {
        let mut keys: Vec<Key> = (1..=4).map(Key::int).collect();
        keys.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        keys
    }

    #[test]
    fn keys_before_the_cut_are_loaded_whole_entries_or_none_and_the_rest_not_at_all() {
        let keys = keys();
        let mut opened = OpenedBatch::default();
        opened.add(keys[0].as_bytes().to_vec(), entry("a", "1"));
        opened.add(keys[0].as_bytes().to_vec(), entry("b", "2"));
        // keys[1] has no entry; keys[2]'s first entry went past the bound.
        opened.add(keys[2].as_bytes().to_vec(), None);
        let loaded = opened.into_entries(keys.clone());
        assert_eq!(loaded.len(), 2, "{loaded:?}");
        let first: Vec<(&str, &[u8])> = loaded[&keys[0]].iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
        assert_eq!(first, [("a", &b"1"[..]), ("b", &b"2"[..])]);
        assert!(loaded[&keys[1]].is_empty(), "a key with no entry is loaded as such");
        assert!(!loaded.contains_key(&keys[2]) && !loaded.contains_key(&keys[3]), "from the cut on, read one by one");
    }

    #[test]
    fn without_a_cut_every_key_asked_for_is_loaded() {
        let keys = keys();
        let mut opened = OpenedBatch::default();
        opened.add(keys[3].as_bytes().to_vec(), entry("v", "x"));
        let loaded = opened.into_entries(keys.clone());
        assert_eq!(loaded.len(), 4);
        assert_eq!(loaded[&keys[3]].get("v").map(Vec::as_slice), Some(&b"x"[..]));
    }
}
