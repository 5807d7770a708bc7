//! A batch's commit in one transaction and one round trip: the batch
//! folded into one array per column ([`CommitRows`]), the statements that
//! write each table, and the flight that sends them ([`commit`]); and the
//! transaction that starts a projection over ([`start_over`]).
//!
//! Rules kept here:
//! - **The batch is folded first**: the last write of each entry wins,
//!   deltas are summed by the caller and sent as decimal text (PostgreSQL
//!   has no 128-bit integer to bind), offsets past `bigint` refuse the
//!   commit before anything is sent.
//! - **One statement per table, bound to arrays** (`unnest`), and only
//!   those with something to do ([`wanted_statements`]), in a fixed order:
//!   the fence and position checks first ([`super::claims`]), then the
//!   state, counters, statistics, done marks, positions (and the done
//!   marks below them), the outbox settled, the outbox added, the timers
//!   of the keys whose timers changed (removed, then the new ones added).
//! - **One flight**: `BEGIN`, every statement and `COMMIT` leave together
//!   and are answered together ([`all_at_once`]): one round trip whatever
//!   the batch holds (and one more per statement the first time a
//!   connection prepares it). A failed check fails its statement (a
//!   division by zero), so the server skips the rest and `COMMIT` rolls
//!   back; the error then says which check failed and where.

use std::collections::BTreeMap;
use std::future::Future;

use tokio_postgres::types::ToSql;

use super::super::{BatchCommit, StateError, TimerWrite, encode_outbox};
use super::claims::{self, CHECK_POSITIONS, FENCE, PositionChecks};
use super::db::{Db, i32_of, i64_of};
use super::json::json_text;
use super::outbox::{ADD_OUTBOX, SETTLE_OUTBOX};

/// The key's text and the last value written to an entry (`None`: deleted).
type LastWrite = (String, Option<Vec<u8>>);

/// A batch folded into one array per column, ready for `unnest`.
#[derive(Debug, Default)]
pub(super) struct CommitRows {
    set_keys: Vec<Vec<u8>>,
    set_names: Vec<String>,
    set_key_texts: Vec<String>,
    set_values: Vec<Vec<u8>>,
    /// Each set value's text when PostgreSQL takes it as `jsonb` ([`json_text`]).
    set_jsons: Vec<Option<String>>,
    deleted_keys: Vec<Vec<u8>>,
    deleted_names: Vec<String>,
    counter_names: Vec<String>,
    counter_deltas: Vec<String>,
    stat_names: Vec<String>,
    stat_deltas: Vec<String>,
    position_topics: Vec<String>,
    position_partitions: Vec<i32>,
    position_nexts: Vec<i64>,
    done_topics: Vec<String>,
    done_partitions: Vec<i32>,
    done_records: Vec<i64>,
    outbox_through: Option<(i32, i64)>,
    outbox: Vec<Vec<u8>>,
    outbox_partitions: Vec<i32>,
    /// Keys whose timers are replaced.
    timer_keys: Vec<Vec<u8>>,
    timer_set_keys: Vec<Vec<u8>>,
    timer_names: Vec<String>,
    timer_partitions: Vec<i32>,
    timer_ats: Vec<i64>,
    timer_payloads: Vec<Vec<u8>>,
}

impl CommitRows {
    /// Folds `commit`: one row per entry (the last write wins), deltas as
    /// decimal text (PostgreSQL has no 128-bit integer to bind).
    pub(super) fn fold(commit: BatchCommit, location: &str) -> Result<Self, StateError> {
        let BatchCommit { writes, counter_deltas, stat_deltas, positions, outbox, done, outbox_through, timers } =
            commit;
        // (key bytes, name) → (key text, last value written).
        let mut last: BTreeMap<(Vec<u8>, String), LastWrite> = BTreeMap::new();
        for (key, key_writes) in &writes {
            let text = key.to_string();
            for (name, value) in key_writes.iter() {
                last.insert((key.as_bytes().to_vec(), name.to_owned()), (text.clone(), value.map(<[u8]>::to_vec)));
            }
        }
        let mut rows = Self::default();
        for ((key, name), (text, value)) in last {
            match value {
                Some(value) => {
                    rows.set_keys.push(key);
                    rows.set_names.push(name);
                    rows.set_key_texts.push(text);
                    rows.set_jsons.push(json_text(&value));
                    rows.set_values.push(value);
                }
                None => {
                    rows.deleted_keys.push(key);
                    rows.deleted_names.push(name);
                }
            }
        }
        (rows.counter_names, rows.counter_deltas) =
            counter_deltas.into_iter().map(|(name, delta)| (name, delta.to_string())).unzip();
        (rows.stat_names, rows.stat_deltas) =
            stat_deltas.named().map(|(name, delta)| (name.to_owned(), delta.to_string())).unzip();
        for (topic, partition, next) in positions {
            rows.add_position(topic, partition, next, location)?;
        }
        for (topic, partition, record) in done {
            rows.done_topics.push(topic);
            rows.done_partitions.push(i32_of(partition));
            rows.done_records.push(i64_of(record, location)?);
        }
        rows.outbox_through = match outbox_through {
            Some((partition, seq)) => Some((i32_of(partition), i64_of(seq, location)?)),
            None => None,
        };
        rows.outbox = outbox.iter().map(|entry| encode_outbox(entry, location)).collect::<Result<_, _>>()?;
        rows.outbox_partitions = outbox.iter().map(|entry| i32_of(entry.source())).collect();
        // The last write of a key listed twice wins.
        let timers: BTreeMap<Vec<u8>, TimerWrite> =
            timers.into_iter().map(|write| (write.key.as_bytes().to_vec(), write)).collect();
        for (key, TimerWrite { partition, timers, .. }) in timers {
            for timer in timers {
                rows.timer_set_keys.push(key.clone());
                rows.timer_names.push(timer.name);
                rows.timer_partitions.push(i32_of(partition));
                rows.timer_ats.push(timer.at);
                rows.timer_payloads.push(timer.payload);
            }
            rows.timer_keys.push(key);
        }
        Ok(rows)
    }

    /// The rows the commit writes or removes, over every table.
    pub(super) fn count(&self) -> usize {
        self.set_keys.len()
            + self.deleted_keys.len()
            + self.counter_names.len()
            + self.stat_names.len()
            + self.position_topics.len()
            + self.done_topics.len()
            + usize::from(self.outbox_through.is_some())
            + self.outbox.len()
            + self.timer_keys.len()
            + self.timer_names.len()
    }

    /// Adds a position row: `next` is the next offset of `partition`.
    pub(super) fn add_position(
        &mut self,
        topic: String,
        partition: u32,
        next: u64,
        location: &str,
    ) -> Result<(), StateError> {
        self.position_topics.push(topic);
        self.position_partitions.push(i32_of(partition));
        self.position_nexts.push(i64_of(next, location)?);
        Ok(())
    }
}

const SET_ENTRIES: &str = "INSERT INTO waku_state (projection, key, name, key_text, value, json) \
     SELECT $1, k, n, t, v, j::jsonb FROM unnest($2::bytea[], $3::text[], $4::text[], $5::bytea[], $6::text[]) \
         AS u(k, n, t, v, j) \
     ON CONFLICT (projection, key, name) DO UPDATE SET value = excluded.value, json = excluded.json";

const DELETE_ENTRIES: &str = "DELETE FROM waku_state s USING unnest($2::bytea[], $3::text[]) AS d(key, name) \
     WHERE s.projection = $1 AND s.key = d.key AND s.name = d.name";

const ADD_COUNTERS: &str = "INSERT INTO waku_counters (projection, name, value) \
     SELECT $1, n, d::numeric FROM unnest($2::text[], $3::text[]) AS u(n, d) \
     ON CONFLICT (projection, name) DO UPDATE SET value = waku_counters.value + excluded.value";

const ADD_STATS: &str = "INSERT INTO waku_stats (projection, name, value) \
     SELECT $1, n, least(d::numeric, 18446744073709551615) FROM unnest($2::text[], $3::text[]) AS u(n, d) \
     ON CONFLICT (projection, name) \
     DO UPDATE SET value = least(waku_stats.value + excluded.value, 18446744073709551615)";

const ADD_DONE: &str = "INSERT INTO waku_done (projection, topic, partition, record) \
     SELECT $1, * FROM unnest($2::text[], $3::integer[], $4::bigint[]) ON CONFLICT DO NOTHING";

/// Positions, then (the next statement) the done marks below them go.
const SET_POSITIONS: &str = "INSERT INTO waku_positions (projection, topic, partition, next) \
     SELECT $1, * FROM unnest($2::text[], $3::integer[], $4::bigint[]) \
     ON CONFLICT (projection, topic, partition) DO UPDATE SET next = excluded.next";

const DROP_TIMERS: &str = "DELETE FROM waku_timers t USING unnest($2::bytea[]) AS d(key) \
     WHERE t.projection = $1 AND t.key = d.key";

const ADD_TIMERS: &str = "INSERT INTO waku_timers (projection, key, name, partition, at, payload) \
     SELECT $1, * FROM unnest($2::bytea[], $3::text[], $4::integer[], $5::bigint[], $6::bytea[])";

const DROP_DONE_BELOW: &str = "DELETE FROM waku_done d \
     USING unnest($2::text[], $3::integer[], $4::bigint[]) AS p(topic, partition, next) \
     WHERE d.projection = $1 AND d.topic = p.topic AND d.partition = p.partition AND d.record < p.next";

/// The statements a commit of `rows` runs, in their order: those with
/// nothing to do are left out.
fn wanted_statements(held: &[(u32, i64)], checks: &PositionChecks, r: &CommitRows) -> Vec<&'static str> {
    let mut wanted: Vec<&str> = Vec::new();
    let mut add = |needed: bool, sql: &'static str| {
        if needed {
            wanted.push(sql);
        }
    };
    add(!held.is_empty(), FENCE);
    add(!checks.topics.is_empty(), CHECK_POSITIONS);
    add(!r.set_keys.is_empty(), SET_ENTRIES);
    add(!r.deleted_keys.is_empty(), DELETE_ENTRIES);
    add(!r.counter_names.is_empty(), ADD_COUNTERS);
    add(!r.stat_names.is_empty(), ADD_STATS);
    add(!r.done_topics.is_empty(), ADD_DONE);
    add(!r.position_topics.is_empty(), SET_POSITIONS);
    add(!r.position_topics.is_empty(), DROP_DONE_BELOW);
    add(r.outbox_through.is_some(), SETTLE_OUTBOX);
    add(!r.outbox.is_empty(), ADD_OUTBOX);
    add(!r.timer_keys.is_empty(), DROP_TIMERS);
    add(!r.timer_names.is_empty(), ADD_TIMERS);
    wanted
}

/// What a commit's statements are bound to: the rows, the checks, and
/// the arrays and counts made from them.
struct Bindings<'a> {
    projection: &'a str,
    fence_partitions: Vec<i32>,
    fence_epochs: Vec<i64>,
    fence_count: i64,
    checks: &'a PositionChecks,
    check_count: i64,
    rows: &'a CommitRows,
    outbox_count: i64,
}

impl<'a> Bindings<'a> {
    fn new(projection: &'a str, held: &[(u32, i64)], checks: &'a PositionChecks, rows: &'a CommitRows) -> Self {
        Self {
            projection,
            fence_partitions: held.iter().map(|&(partition, _)| i32_of(partition)).collect(),
            fence_epochs: held.iter().map(|&(_, epoch)| epoch).collect(),
            fence_count: held.len() as i64,
            checks,
            check_count: checks.topics.len() as i64,
            rows,
            outbox_count: rows.outbox.len() as i64,
        }
    }

    /// The parameters of the statement `sql`, or `None` when it has
    /// nothing to bind (no outbox to settle).
    fn of(&self, sql: &str) -> Option<Vec<&(dyn ToSql + Sync)>> {
        let (p, r, checks) = (&self.projection, self.rows, self.checks);
        Some(match sql {
            FENCE => vec![p, &self.fence_partitions, &self.fence_epochs, &self.fence_count],
            CHECK_POSITIONS => vec![p, &checks.topics, &checks.partitions, &checks.expected, &self.check_count],
            SET_ENTRIES => vec![p, &r.set_keys, &r.set_names, &r.set_key_texts, &r.set_values, &r.set_jsons],
            DELETE_ENTRIES => vec![p, &r.deleted_keys, &r.deleted_names],
            ADD_COUNTERS => vec![p, &r.counter_names, &r.counter_deltas],
            ADD_STATS => vec![p, &r.stat_names, &r.stat_deltas],
            ADD_DONE => vec![p, &r.done_topics, &r.done_partitions, &r.done_records],
            SET_POSITIONS | DROP_DONE_BELOW => vec![p, &r.position_topics, &r.position_partitions, &r.position_nexts],
            DROP_TIMERS => vec![p, &r.timer_keys],
            ADD_TIMERS => {
                vec![p, &r.timer_set_keys, &r.timer_names, &r.timer_partitions, &r.timer_ats, &r.timer_payloads]
            }
            SETTLE_OUTBOX => match &r.outbox_through {
                Some((partition, through)) => vec![p, partition, through],
                None => return None,
            },
            // ADD_OUTBOX
            _ => vec![p, &self.outbox_count, &r.outbox, &r.outbox_partitions],
        })
    }
}

/// Applies one batch in one transaction, after checking the epochs of
/// the claimed partitions it touches: `BEGIN`, the check, one statement
/// per table and `COMMIT` leave together and are answered together,
/// one round trip whatever the batch holds (and one more per statement
/// the first time a connection prepares it). A check that finds a newer
/// epoch fails its statement, so the server rolls everything after it
/// back and the `COMMIT` commits nothing. Then (in the same flight) a
/// check that each position of `checks` is where the store left it,
/// which fails the same way when the database lost commits
/// ([`StateError::PositionMoved`]). `begin` opens the transaction
/// (`BEGIN`, and the opted-in `synchronous_commit`); unless `prepared`,
/// each statement goes as its text, unnamed, with the parameter types
/// its prepared form reports (the same single flight, parsed anew).
pub(super) async fn commit(
    db: &Db,
    (begin, prepared): (&str, bool),
    held: Vec<(u32, i64)>,
    checks: &PositionChecks,
    rows: CommitRows,
) -> Result<(), StateError> {
    let wanted = wanted_statements(&held, checks, &rows);
    let mut statements = Vec::with_capacity(wanted.len());
    for sql in &wanted {
        statements.push(db.prepared(sql).await?);
    }
    let bindings = Bindings::new(&db.projection, &held, checks, &rows);
    let client = db.client();
    let mut flight: Vec<Pending<'_>> = vec![Box::pin(client.batch_execute(begin))];
    for (sql, statement) in wanted.iter().zip(&statements) {
        let Some(params) = bindings.of(sql) else { continue };
        flight.push(Box::pin(async move {
            if prepared {
                return client.execute(statement, &params).await.map(drop);
            }
            let typed: Vec<_> = params.iter().zip(statement.params()).map(|(value, ty)| (*value, ty.clone())).collect();
            client.query_typed(sql, &typed).await.map(drop)
        }));
    }
    flight.push(Box::pin(client.batch_execute("COMMIT")));
    let answers = all_at_once(flight).await;
    // Which check failed, if one did: its answer (after `BEGIN`'s) is
    // a division by zero.
    let failed = |sql: &str| {
        wanted.iter().position(|wanted| *wanted == sql).is_some_and(|at| {
            answers[at + 1].as_ref().err().and_then(tokio_postgres::Error::code)
                == Some(&tokio_postgres::error::SqlState::DIVISION_BY_ZERO)
        })
    };
    let (fenced, moved) = (failed(FENCE), failed(CHECK_POSITIONS));
    if let Some(error) = answers.into_iter().find_map(Result::err) {
        // `COMMIT` after a failed statement rolls back; this makes sure
        // the connection goes back to the pool outside a transaction.
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(match (fenced, moved) {
            (true, _) => claims::fenced(db, held).await,
            (false, true) => claims::moved(db, checks).await,
            (false, false) => db.error(error),
        });
    }
    Ok(())
}

/// A statement on its way, in a flight of them ([`all_at_once`]).
type Pending<'a> = std::pin::Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send + 'a>>;

/// Polls every future of `flight` at once, so that the queries leave in
/// one flight, in order (tokio-postgres sends a query when its future is
/// first polled), and waits for all the answers, in order.
async fn all_at_once<T>(flight: Vec<std::pin::Pin<Box<dyn Future<Output = T> + Send + '_>>>) -> Vec<T> {
    let mut flight: Vec<_> = flight.into_iter().map(Some).collect();
    let mut answers: Vec<Option<T>> = flight.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (slot, answer) in flight.iter_mut().zip(answers.iter_mut()) {
            if let Some(future) = slot {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => {
                        *answer = Some(value);
                        *slot = None;
                    }
                    std::task::Poll::Pending => waiting = true,
                }
            }
        }
        match waiting {
            true => std::task::Poll::Pending,
            false => std::task::Poll::Ready(()),
        }
    })
    .await;
    answers.into_iter().flatten().collect()
}

/// Clears the projection's state, counters, statistics, done marks,
/// outbox, positions and timers, and stores the positions of `rows`, in one
/// transaction.
pub(super) async fn start_over(mut db: Db, rows: CommitRows) -> Result<(), StateError> {
    let mut client = db.take()?;
    let txn = client.transaction().await.map_err(|e| db.error(e))?;
    let p = &*db.projection;
    let tables =
        ["waku_state", "waku_counters", "waku_stats", "waku_done", "waku_outbox", "waku_positions", "waku_timers"];
    for table in tables {
        txn.execute(&format!("DELETE FROM {table} WHERE projection = $1"), &[&p]).await.map_err(|e| db.error(e))?;
    }
    txn.execute(
        "INSERT INTO waku_positions (projection, topic, partition, next) \
         SELECT $1, * FROM unnest($2::text[], $3::integer[], $4::bigint[])",
        &[&p, &rows.position_topics, &rows.position_partitions, &rows.position_nexts],
    )
    .await
    .map_err(|e| db.error(e))?;
    txn.commit().await.map_err(|e| db.error(e))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::key::Key;
    use crate::storage::log::Record;
    use crate::storage::state::{KeyWrites, OutboxEntry};
    use crate::storage::stats::{Stat, Stats};
    use wakuwaku_core::timers::Timer;

    fn outbox_from(partition: u32) -> OutboxEntry {
        OutboxEntry {
            topic: "out".into(),
            partition_key: 3,
            partition: Some(partition),
            record: Record::default(),
            origin: None,
        }
    }

    /// A commit with something for every table.
    fn full_commit() -> BatchCommit {
        let mut first = KeyWrites::default();
        first.set("a", b"1".to_vec());
        first.set("b", b"raw \xff".to_vec());
        first.set("gone", b"x".to_vec());
        let mut later = KeyWrites::default();
        later.set("a", br#"{"n": 2}"#.to_vec());
        later.delete("gone");
        let mut stats = Stats::new();
        stats.add(Stat::ALL[0], 4);
        BatchCommit {
            writes: vec![(Key::int(7), first), (Key::int(7), later)],
            counter_deltas: HashMap::from([("total".to_owned(), i128::MIN)]),
            stat_deltas: stats,
            positions: vec![("t".into(), 2, 10)],
            outbox: vec![outbox_from(2), outbox_from(2)],
            done: vec![("t".into(), 2, 12)],
            outbox_through: Some((2, 5)),
            timers: vec![
                TimerWrite { key: Key::int(7), partition: 2, timers: vec![] },
                TimerWrite {
                    key: Key::int(7),
                    partition: 2,
                    timers: vec![Timer { name: "close".into(), at: 9, payload: vec![1] }],
                },
                TimerWrite { key: Key::int(8), partition: 2, timers: vec![] },
            ],
        }
    }

    #[test]
    fn a_batch_folds_into_one_row_per_entry_the_last_write_winning() {
        let rows = CommitRows::fold(full_commit(), "here").unwrap();
        let key = Key::int(7);
        assert_eq!(rows.set_keys, [key.as_bytes().to_vec(), key.as_bytes().to_vec()]);
        assert_eq!(rows.set_names, ["a", "b"]);
        assert_eq!(rows.set_key_texts, [key.to_string(), key.to_string()]);
        assert_eq!(rows.set_values, [br#"{"n": 2}"#.to_vec(), b"raw \xff".to_vec()]);
        assert_eq!(rows.set_jsons, [Some(r#"{"n": 2}"#.to_owned()), None], "JSON beside its bytes; bytes alone");
        assert_eq!((rows.deleted_keys, rows.deleted_names), (vec![key.as_bytes().to_vec()], vec!["gone".to_owned()]));
        assert_eq!(rows.counter_deltas, [i128::MIN.to_string()], "past i64, as decimal text");
        assert_eq!((rows.stat_names, rows.stat_deltas), (vec![Stat::ALL[0].name().to_owned()], vec!["4".to_owned()]));
        assert_eq!((rows.position_partitions, rows.position_nexts), (vec![2], vec![10]));
        assert_eq!((rows.done_partitions, rows.done_records), (vec![2], vec![12]));
        assert_eq!(rows.outbox_through, Some((2, 5)));
        assert_eq!(rows.outbox.len(), 2);
        assert_eq!(rows.outbox_partitions, [2, 2]);
        assert_eq!(rows.timer_keys, [key.as_bytes().to_vec(), Key::int(8).as_bytes().to_vec()], "each key once");
        assert_eq!(
            (rows.timer_names, rows.timer_ats, rows.timer_partitions),
            (vec!["close".to_owned()], vec![9], vec![2])
        );
        assert_eq!((rows.timer_set_keys, rows.timer_payloads), (vec![key.as_bytes().to_vec()], vec![vec![1]]));
    }

    #[test]
    fn every_row_is_counted_once() {
        let rows = CommitRows::fold(full_commit(), "here").unwrap();
        // 2 set, 1 deleted, 1 counter, 1 stat, 1 position, 1 done, the
        // settling, 2 outbox entries, 2 keys' timers replaced, 1 timer.
        assert_eq!(rows.count(), 13);
        assert_eq!(CommitRows::default().count(), 0);
    }

    #[test]
    fn an_offset_past_bigint_refuses_the_commit_before_anything_is_sent() {
        for commit in [
            BatchCommit { positions: vec![("t".into(), 0, u64::MAX)], ..BatchCommit::default() },
            BatchCommit { done: vec![("t".into(), 0, u64::MAX)], ..BatchCommit::default() },
            BatchCommit { outbox_through: Some((0, u64::MAX)), ..BatchCommit::default() },
        ] {
            let error = CommitRows::fold(commit, "here").unwrap_err();
            assert!(matches!(&error, StateError::Storage { store, .. } if store == "here"), "{error}");
        }
    }

    fn checks() -> PositionChecks {
        PositionChecks { topics: vec!["t".into()], partitions: vec![2], expected: vec![Some(9)], next: vec![10] }
    }

    #[test]
    fn only_the_statements_with_something_to_do_run_checks_first() {
        let rows = CommitRows::fold(full_commit(), "here").unwrap();
        assert_eq!(
            wanted_statements(&[(2, 1)], &checks(), &rows),
            [
                FENCE,
                CHECK_POSITIONS,
                SET_ENTRIES,
                DELETE_ENTRIES,
                ADD_COUNTERS,
                ADD_STATS,
                ADD_DONE,
                SET_POSITIONS,
                DROP_DONE_BELOW,
                SETTLE_OUTBOX,
                ADD_OUTBOX,
                DROP_TIMERS,
                ADD_TIMERS
            ]
        );
        let positions_only =
            CommitRows::fold(BatchCommit { positions: vec![("t".into(), 2, 10)], ..BatchCommit::default() }, "here")
                .unwrap();
        assert_eq!(
            wanted_statements(&[], &PositionChecks::default(), &positions_only),
            [SET_POSITIONS, DROP_DONE_BELOW]
        );
        assert!(wanted_statements(&[], &PositionChecks::default(), &CommitRows::default()).is_empty());
    }

    /// The highest `$n` of `sql`.
    fn placeholders(sql: &str) -> usize {
        sql.split('$')
            .skip(1)
            .filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn each_statement_is_bound_to_as_many_values_as_it_has_placeholders() {
        let rows = CommitRows::fold(full_commit(), "here").unwrap();
        let checks = checks();
        let bindings = Bindings::new("bank", &[(2, 1)], &checks, &rows);
        for sql in wanted_statements(&[(2, 1)], &checks, &rows) {
            let params = bindings.of(sql).expect("something to bind");
            assert_eq!(params.len(), placeholders(sql), "{sql}");
        }
        let unsettled = CommitRows::default();
        assert!(Bindings::new("bank", &[], &checks, &unsettled).of(SETTLE_OUTBOX).is_none(), "no outbox to settle");
    }

    #[test]
    fn a_flight_sends_every_statement_before_any_answer_and_answers_in_order() {
        // Each future notes each poll, and answers only on its second.
        let polled = Arc::new(Mutex::new(Vec::new()));
        let flight: Vec<std::pin::Pin<Box<dyn Future<Output = usize> + Send>>> = (0..3)
            .map(|n: usize| {
                let polled = polled.clone();
                let mut first = true;
                Box::pin(std::future::poll_fn(move |cx| {
                    polled.lock().unwrap().push(n);
                    if first {
                        first = false;
                        cx.waker().wake_by_ref();
                        return std::task::Poll::Pending;
                    }
                    std::task::Poll::Ready(n)
                })) as std::pin::Pin<Box<dyn Future<Output = usize> + Send>>
            })
            .collect();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let answers = runtime.block_on(all_at_once(flight));
        assert_eq!(answers, [0, 1, 2]);
        assert_eq!(polled.lock().unwrap()[..3], [0, 1, 2], "every one sent before any is waited for");
    }
}
