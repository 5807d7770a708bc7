//! What tools and the host read outside a batch, and the host's own
//! values: keys and entries, counters and statistics (all, or a page at a
//! time), positions and done marks, `waku_meta`, and the timers due and
//! pending.
//!
//! Rules kept here:
//! - **Pages are bounded by the server**: a page of entries sums its
//!   values' sizes in the query, so only the page's values travel (the
//!   first entry always, the next ones while the values before them are
//!   under the bytes).
//! - **Numbers travel as text**: `numeric` has no 128-bit integer to read
//!   into, so counters and statistics are read as text and parsed; one
//!   that does not parse is corrupt state naming it ([`number`]).
//! - **Statistics keep the names they were written under**: a name this
//!   host does not know is kept, not dropped ([`stats_of`]).

use std::str::FromStr;

use wakuwaku_core::timers::{Millis, Timer};

use super::super::{StateError, TimerSummary};
use super::db::{Db, i32_of};
use crate::key::Key;
use crate::storage::stats::Stats;

/// Every key with an entry, in byte order.
pub(super) async fn keys(db: &Db) -> Result<Vec<Key>, StateError> {
    let rows =
        db.query("SELECT DISTINCT key FROM waku_state WHERE projection = $1 ORDER BY key", &[&&*db.projection]).await?;
    rows.iter()
        .map(|row| {
            Key::from_canonical(row.get::<_, &[u8]>(0))
                .map_err(|e| db.corrupt(format!("a state key is not canonical: {e}")))
        })
        .collect()
}

/// Every entry of `key`, by name.
pub(super) async fn entries(db: &Db, key: &[u8]) -> Result<Vec<(String, Vec<u8>)>, StateError> {
    let rows = db
        .query(
            "SELECT name, value FROM waku_state WHERE projection = $1 AND key = $2 ORDER BY name",
            &[&&*db.projection, &key],
        )
        .await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// The entries of `key` after `after`, by name: at most `limit`, and past
/// the first only while the values before stay under `max_bytes`.
pub(super) async fn entries_page(
    db: &Db,
    key: &[u8],
    after: Option<&str>,
    limit: i64,
    max_bytes: i64,
) -> Result<Vec<(String, Vec<u8>)>, StateError> {
    // The sizes are summed by the server, so only the page's values
    // travel: the first entry, and the next ones while the values
    // before them are under the bytes.
    let rows = db
        .query(
            "SELECT name, value FROM ( \
                 SELECT name, value, \
                     coalesce(sum(octet_length(value)) OVER (ORDER BY name ROWS BETWEEN UNBOUNDED PRECEDING \
                         AND CURRENT ROW), 0) AS upto, \
                     row_number() OVER (ORDER BY name) AS n \
                 FROM (SELECT name, value FROM waku_state \
                       WHERE projection = $1 AND key = $2 AND ($3::text IS NULL OR name > $3) \
                       ORDER BY name LIMIT $4) AS candidates \
             ) AS page WHERE n = 1 OR upto - octet_length(value) < $5 ORDER BY name",
            &[&&*db.projection, &key, &after, &limit, &max_bytes],
        )
        .await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// The counters after `after`, by name, at most `limit`.
pub(super) async fn counters_page(db: &Db, after: Option<&str>, limit: i64) -> Result<Vec<(String, i128)>, StateError> {
    let rows = db
        .query(
            "SELECT name, value::text FROM waku_counters WHERE projection = $1 AND ($2::text IS NULL OR name > $2) \
             ORDER BY name LIMIT $3",
            &[&&*db.projection, &after, &limit],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let name: String = row.get(0);
            let value = number(db, "counter", &name, row.get(1))?;
            Ok((name, value))
        })
        .collect()
}

/// Every (name, value) of a table of numbers, by name.
pub(super) async fn numbers<N: FromStr>(db: &Db, table: &'static str) -> Result<Vec<(String, N)>, StateError> {
    let rows = db.query(&numbers_sql(table), &[&&*db.projection]).await?;
    rows.iter()
        .map(|row| {
            let name: String = row.get(0);
            let value = number(db, table, &name, row.get(1))?;
            Ok((name, value))
        })
        .collect()
}

/// The query of every (name, value as text) of `table`, by name.
fn numbers_sql(table: &str) -> String {
    format!("SELECT name, value::text FROM {table} WHERE projection = $1 ORDER BY name")
}

/// `value`, the text of the number `name` of `what` (a table, or
/// `counter`), parsed; corrupt state if it does not parse.
pub(super) fn number<N: FromStr>(db: &Db, what: &str, name: &str, value: &str) -> Result<N, StateError> {
    value.parse().map_err(|_| db.corrupt(format!("{what} `{name}` holds {value}")))
}

/// The statistics of rows read by name.
pub(super) fn stats_of(rows: Vec<(String, u64)>) -> Stats {
    let mut stats = Stats::new();
    for (name, count) in rows {
        stats.add_named(&name, count);
    }
    stats
}

/// The next offset of `partition` of `topic`, if it has one.
pub(super) async fn position(db: &Db, topic: &str, partition: u32) -> Result<Option<u64>, StateError> {
    let rows = db
        .query(
            "SELECT next FROM waku_positions WHERE projection = $1 AND topic = $2 AND partition = $3",
            &[&&*db.projection, &topic, &i32_of(partition)],
        )
        .await?;
    Ok(rows.first().map(|row| row.get::<_, i64>(0).unsigned_abs()))
}

/// The done marks of `partition` of `topic`, in order.
pub(super) async fn done(db: &Db, topic: &str, partition: u32) -> Result<Vec<u64>, StateError> {
    let rows = db
        .query(
            "SELECT record FROM waku_done WHERE projection = $1 AND topic = $2 AND partition = $3 \
             ORDER BY record",
            &[&&*db.projection, &topic, &i32_of(partition)],
        )
        .await?;
    Ok(rows.iter().map(|row| row.get::<_, i64>(0).unsigned_abs()).collect())
}

/// Every (topic, partition, offset) row of `table`, its offset in
/// `column`, in order.
pub(super) async fn marks(
    db: &Db,
    table: &'static str,
    column: &'static str,
) -> Result<Vec<(String, u32, u64)>, StateError> {
    let rows = db.query(&marks_sql(table, column), &[&&*db.projection]).await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get::<_, i32>(1) as u32, row.get::<_, i64>(2).unsigned_abs())).collect())
}

/// The query of every (topic, partition, offset in `column`) of `table`,
/// in order.
fn marks_sql(table: &str, column: &str) -> String {
    format!("SELECT topic, partition, {column} FROM {table} WHERE projection = $1 ORDER BY topic, partition, {column}")
}

/// The host's value `name`.
pub(super) async fn meta(db: &Db, name: &str) -> Result<Option<Vec<u8>>, StateError> {
    let rows =
        db.query("SELECT value FROM waku_meta WHERE projection = $1 AND name = $2", &[&&*db.projection, &name]).await?;
    Ok(rows.first().map(|row| row.get(0)))
}

/// Sets the host's value `name`.
pub(super) async fn set_meta(db: &Db, name: &str, value: &[u8]) -> Result<(), StateError> {
    db.query(
        "INSERT INTO waku_meta (projection, name, value) VALUES ($1, $2, $3) \
         ON CONFLICT (projection, name) DO UPDATE SET value = excluded.value",
        &[&&*db.projection, &name, &value],
    )
    .await
    .map(drop)
}

/// Every host value, by name.
pub(super) async fn meta_entries(db: &Db) -> Result<Vec<(String, Vec<u8>)>, StateError> {
    let rows =
        db.query("SELECT name, value FROM waku_meta WHERE projection = $1 ORDER BY name", &[&&*db.projection]).await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// The keys of `partition` with a timer below `before`, each with its
/// earliest, earliest first, at most `limit` (the index by time serves it).
pub(super) async fn due_timers(
    db: &Db,
    partition: u32,
    before: Millis,
    limit: i64,
) -> Result<Vec<(Key, Millis)>, StateError> {
    let rows = db
        .query(
            "SELECT key, min(at) AS first FROM waku_timers \
             WHERE projection = $1 AND partition = $2 AND at < $3 \
             GROUP BY key ORDER BY first, key LIMIT $4",
            &[&&*db.projection, &i32_of(partition), &before, &limit],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let key = Key::from_canonical(row.get::<_, &[u8]>(0))
                .map_err(|e| db.corrupt(format!("a timer's key is not canonical: {e}")))?;
            Ok((key, row.get::<_, i64>(1)))
        })
        .collect()
}

/// The timers pending in `partition` (or all), and the earliest time.
pub(super) async fn timer_summary(db: &Db, partition: Option<u32>) -> Result<TimerSummary, StateError> {
    let partition = partition.map(i32_of);
    let rows = db
        .query(
            "SELECT count(*), min(at) FROM waku_timers \
             WHERE projection = $1 AND ($2::integer IS NULL OR partition = $2)",
            &[&&*db.projection, &partition],
        )
        .await?;
    let Some(row) = rows.first() else { return Ok(TimerSummary::default()) };
    Ok(TimerSummary { pending: row.get::<_, i64>(0).unsigned_abs(), next_at: row.get(1) })
}

/// The timers of `key`, by name.
pub(super) async fn timers(db: &Db, key: &[u8]) -> Result<Vec<Timer>, StateError> {
    let rows = db
        .query(
            "SELECT name, at, payload FROM waku_timers WHERE projection = $1 AND key = $2 ORDER BY name",
            &[&&*db.projection, &key],
        )
        .await?;
    Ok(rows.iter().map(|row| Timer { name: row.get(0), at: row.get(1), payload: row.get(2) }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::stats::Stat;

    #[test]
    fn numbers_read_as_text_parse_past_i64_and_name_what_does_not() {
        let db = Db { projection: "bank".into(), location: "here".into(), client: None };
        let min = i128::MIN.to_string();
        assert_eq!(number::<i128>(&db, "counter", "c", &min).unwrap(), i128::MIN);
        let error = number::<u64>(&db, "waku_stats", "events", "-1").unwrap_err();
        assert!(
            matches!(&error, StateError::Corrupt { store, what } if store == "here" && what == "waku_stats `events` holds -1"),
            "{error}"
        );
    }

    #[test]
    fn statistics_read_by_name_keep_the_names_this_host_does_not_know() {
        let known = Stat::ALL[0];
        let stats = stats_of(vec![(known.name().to_owned(), 3), ("from_a_newer_host".to_owned(), 9)]);
        assert_eq!(stats.get(known), 3);
        assert_eq!(stats.unknown().get("from_a_newer_host"), Some(&9));
    }

    #[test]
    fn tables_are_read_by_projection_in_order() {
        assert_eq!(
            numbers_sql("waku_stats"),
            "SELECT name, value::text FROM waku_stats WHERE projection = $1 ORDER BY name"
        );
        assert_eq!(
            marks_sql("waku_done", "record"),
            "SELECT topic, partition, record FROM waku_done WHERE projection = $1 ORDER BY topic, partition, record"
        );
    }
}
