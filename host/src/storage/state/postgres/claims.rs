//! Who may write a partition: its claims and their epochs, the positions a
//! commit must find where this store left them, the checks a commit runs
//! for both, the error when one fails, and the run lock a reset takes.
//!
//! Rules kept here:
//! - **A claim bumps the partition's epoch** ([`bump_epoch`]) and reads its
//!   positions in the same call; the store remembers both ([`Claims`]).
//! - **A commit is fenced on every claimed partition it touches**: its
//!   positions, done marks, outbox entries added and outbox settled
//!   ([`Claims::held_epochs`]), checked by [`FENCE`] in the commit's
//!   transaction; partitions this store never claimed are not fenced.
//! - **A commit's positions of claimed partitions must be where the
//!   store's last commit (or its claim) left them** ([`Claims::position_checks`],
//!   checked by [`CHECK_POSITIONS`]); only a commit that passed moves them
//!   on in memory ([`Claims::continued`]).
//! - **A failed check is reported by the partition it failed on**: the
//!   epochs or positions are read again after the rollback, and the first
//!   partition found changed is named ([`StateError::Fenced`],
//!   [`StateError::PositionMoved`]).
//! - **The run lock is an advisory lock per schema and projection**
//!   ([`RUN_LOCK`]), shared by running hosts and taken alone by a reset,
//!   always with a try-lock: nothing waits for it.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use super::super::{BatchCommit, OutboxEntry, StateError};
use super::db::{Db, i32_of};

/// The epochs of the partitions a store claimed, and where its last
/// commit (or its claim) left each of their positions.
#[derive(Debug, Default)]
pub(super) struct Claims {
    /// The epoch of each partition this store claimed.
    epochs: Mutex<HashMap<u32, i64>>,
    /// The positions of each claimed partition, by topic, where this
    /// store's last commit (or its claim) left them: a commit writing one
    /// must find it there ([`StateError::PositionMoved`]).
    continues: Mutex<HashMap<u32, HashMap<String, i64>>>,
}

impl Claims {
    /// The epoch this store claimed `partition` at, if it did.
    pub(super) fn epoch(&self, partition: u32) -> Option<i64> {
        self.epochs.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(&partition).copied()
    }

    /// Remembers a claim of `partition` at `epoch`, and its positions then.
    pub(super) fn claimed(&self, partition: u32, epoch: i64, positions: HashMap<String, i64>) {
        self.epochs.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(partition, epoch);
        self.continues.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(partition, positions);
    }

    /// The one partition a commit's positions name, with the epoch this
    /// store claimed it at: a batch's commit, whose writes are that
    /// partition's.
    pub(super) fn committing_partition(&self, commit: &BatchCommit) -> Option<(u32, i64)> {
        let (_, partition, _) = commit.positions.first()?;
        if commit.positions.iter().any(|(_, other, _)| other != partition) {
            return None;
        }
        Some((*partition, self.epoch(*partition)?))
    }

    /// The claimed epochs of the partitions `commit` touches (their
    /// positions, done marks, outbox or timers), by partition.
    pub(super) fn held_epochs(&self, commit: &BatchCommit) -> Vec<(u32, i64)> {
        let epochs = self.epochs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let touched: HashSet<u32> = (commit.positions.iter().chain(&commit.done).map(|(_, partition, _)| *partition))
            .chain(commit.outbox.iter().map(OutboxEntry::source))
            .chain(commit.outbox_through.map(|(partition, _)| partition))
            .chain(commit.timers.iter().map(|write| write.partition))
            .collect();
        let mut held: Vec<(u32, i64)> =
            touched.into_iter().filter_map(|partition| Some((partition, *epochs.get(&partition)?))).collect();
        held.sort_unstable();
        held
    }

    /// The positions `commit` writes of the partitions this store claimed,
    /// each with where the store's last commit left it.
    pub(super) fn position_checks(&self, commit: &BatchCommit) -> PositionChecks {
        let continues = self.continues.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut checks = PositionChecks::default();
        for (topic, partition, next) in &commit.positions {
            let Some(positions) = continues.get(partition) else { continue };
            checks.topics.push(topic.clone());
            checks.partitions.push(i32_of(*partition));
            checks.expected.push(positions.get(topic).copied());
            checks.next.push(i64::try_from(*next).unwrap_or(i64::MAX));
        }
        checks
    }

    /// Remembers where a commit that passed `checks` left its positions.
    pub(super) fn continued(&self, checks: &PositionChecks) {
        let mut continues = self.continues.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for ((topic, partition), next) in checks.topics.iter().zip(&checks.partitions).zip(&checks.next) {
            if let Some(positions) = continues.get_mut(&partition.unsigned_abs()) {
                positions.insert(topic.clone(), *next);
            }
        }
    }
}

/// The positions a commit writes of claimed partitions: each must be where
/// the store's last commit left it ([`CHECK_POSITIONS`]).
#[derive(Debug, Clone, Default)]
pub(super) struct PositionChecks {
    pub(super) topics: Vec<String>,
    pub(super) partitions: Vec<i32>,
    /// Where the store left each (`None`: no position yet).
    pub(super) expected: Vec<Option<i64>>,
    /// Where the commit moves each.
    pub(super) next: Vec<i64>,
}

/// Bumps `partition`'s epoch and reads the partition's positions then
/// (after the bump, no other store's commit to it lands): the claim.
pub(super) async fn bump_epoch(db: &Db, partition: u32) -> Result<(i64, HashMap<String, i64>), StateError> {
    let row = db
        .client()
        .query_one(
            "INSERT INTO waku_epochs (projection, partition, epoch) VALUES ($1, $2, 1) \
             ON CONFLICT (projection, partition) DO UPDATE SET epoch = waku_epochs.epoch + 1 \
             RETURNING epoch",
            &[&&*db.projection, &i32_of(partition)],
        )
        .await
        .map_err(|e| db.error(e))?;
    let positions = positions_of(db, partition).await?;
    Ok((row.get::<_, i64>(0), positions))
}

/// Every position of `partition`, by topic.
async fn positions_of(db: &Db, partition: u32) -> Result<HashMap<String, i64>, StateError> {
    let rows = db
        .query(
            "SELECT topic, next FROM waku_positions WHERE projection = $1 AND partition = $2",
            &[&&*db.projection, &i32_of(partition)],
        )
        .await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// Fails (a division by zero) unless every claimed partition `$2` holds
/// the epoch `$3` claimed it at (`$4` of them), and locks their rows so a
/// claim waits for the commit.
pub(super) const FENCE: &str = "SELECT 1 / (CASE WHEN count(*) = $4 THEN 1 ELSE 0 END) FROM ( \
         SELECT 1 FROM waku_epochs e JOIN unnest($2::integer[], $3::bigint[]) AS h(partition, epoch) \
         ON e.partition = h.partition AND e.epoch = h.epoch WHERE e.projection = $1 FOR SHARE OF e \
     ) AS held";

/// Fails (a division by zero) unless each position (`$2` topic, `$3`
/// partition) is at `$4` (`NULL`: none), `$5` of them: where the store's
/// last commit left them.
pub(super) const CHECK_POSITIONS: &str = "SELECT 1 / (CASE WHEN count(*) = $5 THEN 1 ELSE 0 END) \
     FROM unnest($2::text[], $3::integer[], $4::bigint[]) AS c(topic, partition, next) \
     LEFT JOIN waku_positions p ON p.projection = $1 AND p.topic = c.topic AND p.partition = c.partition \
     WHERE p.next IS NOT DISTINCT FROM c.next";

/// The error for a commit whose fence check failed: the first of the
/// `held` partitions another store claimed since.
pub(super) async fn fenced(db: &Db, held: Vec<(u32, i64)>) -> StateError {
    let partitions: Vec<i32> = held.iter().map(|&(partition, _)| i32_of(partition)).collect();
    let current: HashMap<i32, i64> = match db
        .query(
            "SELECT partition, epoch FROM waku_epochs WHERE projection = $1 AND partition = ANY($2)",
            &[&&*db.projection, &partitions],
        )
        .await
    {
        Ok(rows) => rows.iter().map(|row| (row.get(0), row.get(1))).collect(),
        Err(error) => return error,
    };
    first_fenced(held, &current).unwrap_or_else(|| db.error(NoFencedPartition))
}

/// The first of the `held` partitions whose epoch is not `current`'s now
/// (a partition without a row is at epoch 0).
fn first_fenced(held: Vec<(u32, i64)>, current: &HashMap<i32, i64>) -> Option<StateError> {
    held.into_iter().find_map(|(partition, epoch)| {
        let now = current.get(&i32_of(partition)).copied().unwrap_or(0);
        (now != epoch).then(|| StateError::Fenced {
            partition,
            held: epoch.unsigned_abs(),
            current: now.unsigned_abs(),
        })
    })
}

/// The error for a commit whose position check failed: the first of
/// `checks` not where the store left it.
pub(super) async fn moved(db: &Db, checks: &PositionChecks) -> StateError {
    let rows = match db
        .query(
            "SELECT topic, partition, next FROM waku_positions WHERE projection = $1 AND partition = ANY($2)",
            &[&&*db.projection, &checks.partitions],
        )
        .await
    {
        Ok(rows) => rows,
        Err(error) => return error,
    };
    let now: HashMap<(String, i32), i64> = rows.iter().map(|row| ((row.get(0), row.get(1)), row.get(2))).collect();
    first_moved(checks, &now).unwrap_or_else(|| db.error(NoMovedPosition))
}

/// The first of `checks` whose position is not where the store left it
/// in `now`, by (topic, partition).
fn first_moved(checks: &PositionChecks, now: &HashMap<(String, i32), i64>) -> Option<StateError> {
    let mut checked = checks.topics.iter().zip(&checks.partitions).zip(&checks.expected);
    checked.find_map(|((topic, &partition), &expected)| {
        let found = now.get(&(topic.clone(), partition)).copied();
        (found != expected).then(|| StateError::PositionMoved {
            partition: partition.unsigned_abs(),
            topic: topic.clone(),
            expected: expected.map(i64::unsigned_abs),
            found: found.map(i64::unsigned_abs),
        })
    })
}

/// A fence check failed, yet every claimed partition holds its epoch.
#[derive(Debug, thiserror::Error)]
#[error("the commit's fence check failed, yet no partition it touches was claimed since")]
struct NoFencedPartition;

/// A position check failed, yet every position is where the store left it.
#[derive(Debug, thiserror::Error)]
#[error("the commit's position check failed, yet every position it checks is where this store left it")]
struct NoMovedPosition;

/// The first key of the run lock, a shared advisory lock that running
/// hosts hold and a reset takes exclusively ("wak" in ASCII); the second is
/// the `hashtext` of the schema and the projection (advisory locks are per
/// database).
pub(super) const RUN_LOCK: i32 = 0x0077_616b;

/// The try-lock of the run lock, `shared` for a run or alone for a reset.
fn run_lock_sql(shared: bool) -> &'static str {
    match shared {
        true => "SELECT pg_try_advisory_lock_shared($1, hashtext(current_schema() || '/' || $2))",
        false => "SELECT pg_try_advisory_lock($1, hashtext(current_schema() || '/' || $2))",
    }
}

/// Tries the run lock on `db`'s connection, and answers the connection,
/// out of the pool (the lock lasts as long as its session), if it took it.
pub(super) async fn try_run_lock(
    mut db: Db,
    shared: bool,
) -> Result<Option<deadpool_postgres::ClientWrapper>, StateError> {
    let client = db.take()?;
    let row = client.query_one(run_lock_sql(shared), &[&RUN_LOCK, &&*db.projection]).await.map_err(|e| db.error(e))?;
    Ok(row.get::<_, bool>(0).then(|| deadpool_postgres::Object::take(client)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::log::Record;

    /// A claim as the tests write it: partition, epoch, positions by topic.
    type Claim<'a> = (u32, i64, &'a [(&'a str, i64)]);

    fn claims(of: &[Claim<'_>]) -> Claims {
        let claims = Claims::default();
        for &(partition, epoch, positions) in of {
            let positions = positions.iter().map(|&(topic, next)| (topic.to_owned(), next)).collect();
            claims.claimed(partition, epoch, positions);
        }
        claims
    }

    fn outbox_from(partition: u32) -> OutboxEntry {
        OutboxEntry {
            topic: "retry_t".into(),
            partition_key: 1,
            partition: Some(partition),
            record: Record::default(),
            origin: None,
        }
    }

    #[test]
    fn a_commit_is_fenced_on_every_claimed_partition_it_touches_and_no_other() {
        let claims = claims(&[(1, 11, &[]), (2, 12, &[]), (3, 13, &[]), (4, 14, &[]), (5, 15, &[]), (6, 16, &[])]);
        let commit = BatchCommit {
            positions: vec![("t".into(), 1, 10), ("t".into(), 9, 10)],
            done: vec![("t".into(), 2, 4)],
            outbox: vec![outbox_from(3)],
            outbox_through: Some((5, 7)),
            ..BatchCommit::default()
        };
        assert_eq!(claims.held_epochs(&commit), [(1, 11), (2, 12), (3, 13), (5, 15)], "9 was never claimed");
        assert!(claims.held_epochs(&BatchCommit::default()).is_empty());
        assert_eq!((claims.epoch(4), claims.epoch(9)), (Some(14), None));
    }

    #[test]
    fn a_batch_commits_one_claimed_partition_and_other_commits_none() {
        let claims = claims(&[(1, 11, &[]), (2, 12, &[])]);
        let at = |positions: &[u32]| BatchCommit {
            positions: positions.iter().map(|&partition| ("t".to_owned(), partition, 5)).collect(),
            ..BatchCommit::default()
        };
        assert_eq!(claims.committing_partition(&at(&[1, 1])), Some((1, 11)));
        assert_eq!(claims.committing_partition(&at(&[1, 2])), None, "two partitions");
        assert_eq!(claims.committing_partition(&at(&[3])), None, "not claimed");
        assert_eq!(claims.committing_partition(&at(&[])), None, "no position");
    }

    #[test]
    fn a_position_is_checked_where_the_last_passed_commit_left_it() {
        let claims = claims(&[(1, 11, &[("t", 10)])]);
        let commit = |next: u64| BatchCommit {
            positions: vec![("t".into(), 1, next), ("u".into(), 1, 5), ("t".into(), 9, 3)],
            ..BatchCommit::default()
        };
        let checks = claims.position_checks(&commit(20));
        assert_eq!(checks.topics, ["t", "u"], "partition 9 is not claimed");
        assert_eq!(checks.partitions, [1, 1]);
        assert_eq!(checks.expected, [Some(10), None]);
        assert_eq!(checks.next, [20, 5]);
        // Not passed yet: still where the claim found them.
        assert_eq!(claims.position_checks(&commit(30)).expected, [Some(10), None]);
        claims.continued(&checks);
        let after = claims.position_checks(&commit(u64::MAX));
        assert_eq!(after.expected, [Some(20), Some(5)]);
        assert_eq!(after.next, [i64::MAX, 5], "past bigint: checked as its largest");
        // A new claim reads them afresh.
        claims.claimed(1, 12, HashMap::new());
        assert_eq!(claims.position_checks(&commit(30)).expected, [None, None]);
    }

    #[test]
    fn a_failed_check_names_the_first_partition_found_changed() {
        let current = HashMap::from([(1, 5), (2, 4)]);
        let fenced = first_fenced(vec![(1, 5), (2, 3), (3, 1)], &current).expect("2 was claimed since");
        assert!(matches!(fenced, StateError::Fenced { partition: 2, held: 3, current: 4 }), "{fenced}");
        let gone = first_fenced(vec![(3, 1)], &current).expect("3 has no epoch now");
        assert!(matches!(gone, StateError::Fenced { partition: 3, held: 1, current: 0 }), "{gone}");
        assert!(first_fenced(vec![(1, 5)], &current).is_none());

        let checks = PositionChecks {
            topics: vec!["t".into(), "u".into(), "v".into()],
            partitions: vec![1, 1, 2],
            expected: vec![Some(10), Some(7), Some(3)],
            next: vec![20, 8, 4],
        };
        let now = HashMap::from([(("t".to_owned(), 1), 10), (("v".to_owned(), 2), 1)]);
        let moved = first_moved(&checks, &now).expect("u is gone");
        assert!(
            matches!(&moved, StateError::PositionMoved { partition: 1, topic, expected: Some(7), found: None } if topic == "u"),
            "{moved}"
        );
        let now = HashMap::from([(("t".to_owned(), 1), 10), (("u".to_owned(), 1), 7), (("v".to_owned(), 2), 3)]);
        assert!(first_moved(&checks, &now).is_none());
    }

    #[test]
    fn a_run_shares_the_run_lock_and_a_reset_takes_it_alone() {
        assert!(run_lock_sql(true).contains("pg_try_advisory_lock_shared($1,"));
        assert!(run_lock_sql(false).contains("pg_try_advisory_lock($1,"));
        assert!(run_lock_sql(false).contains("current_schema() || '/' || $2"), "per schema and projection");
        assert_eq!(RUN_LOCK.to_be_bytes(), [0, b'w', b'a', b'k']);
    }
}
