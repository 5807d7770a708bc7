//! Resetting a stopped projection (`waku reset`): moving its positions in
//! its topics, or starting it over from the earliest offset.
//!
//! A reset is planned first ([`plan`]: where each partition is and where it
//! goes, nothing written), shown to a person, then applied ([`apply`]).
//!
//! Rules it keeps:
//! - **Only on a stopped projection.** The caller holds the state for the
//!   reset ([`crate::storage::state::StateBackend::lock_for_reset`]): the embedded
//!   store's file lock, PostgreSQL's run lock taken exclusively. A running
//!   host holds either, so the reset is refused ([`StateError::InUse`]),
//!   and a host does not start while a reset holds them.
//! - **Moving keeps state.** [`Target::Latest`], [`Target::Offset`] and
//!   [`Target::Time`] move the positions of the partitions named (all by
//!   default) in one commit and change nothing else: events skipped are
//!   never applied, events moved back over are applied again on top of the
//!   state they already changed. Retry and dead-letter records are left as
//!   they are.
//! - **Every topic of a projection over several is reset** ([`apply_all`]):
//!   one plan per topic, shown and checked (lost history) for each; the
//!   retry and dead-letter topics are the first topic's.
//! - **Earliest starts over, whole.** [`Target::Earliest`] clears the
//!   state, counters, statistics, retry bookkeeping, pending outbox and
//!   positions in one transaction ([`crate::storage::state::StateBackend::start_over`]);
//!   the partitions the projection consumed start again at offset 0. State
//!   is shared by all partitions, so earliest takes no partition list.
//! - **Nothing old is applied on top of the replay.** Records already
//!   waiting in the projection's retry topic belong to events the replay
//!   applies again, so the retry position of every partition moves to the
//!   retry topic's end; likewise the dead-letter position, so earlier dead
//!   letters count as re-driven and `waku dlq redrive` leaves them alone
//!   ([`crate::operations::dead_letter`]). The replay emits its messages again.
//! - **A lost head is said.** Earliest names the partitions whose oldest
//!   messages retention deleted ([`Plan::lost_history`]); such a replay is
//!   refused unless the operator accepts it ([`Plan::check_history`],
//!   `--accept-lost-history`).
//! - **A reset is the operator's decision about a lost tail**: the
//!   truncations recorded for the partitions it moves are forgotten
//!   ([`crate::storage::log::loss::clear`]), so a partition stopped by one runs
//!   again from where the reset put it.
//! - **The old state is kept** unless the caller says not to: before
//!   clearing, every entry, counter, statistic, position, done mark, pending
//!   outbox entry and host value is copied into a new embedded state file,
//!   `<dir>/projections/<projection>.redb` under a fresh backup directory
//!   ([`backup`]), which `waku state get --data <dir>` reads. A failed
//!   backup stops the reset before anything is cleared.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::SystemTime;

use crate::engine::routing::{dlq_topic, retry_topic};
use crate::storage::log::loss::{self, LostHead, LostHistory};
use crate::storage::log::{EventLog, LogError};
use crate::storage::state::{BatchCommit, KeyWrites, StateError, StateStore};

/// Where a reset moves a projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Start over: state cleared, every partition from offset 0.
    Earliest,
    /// Each partition's end: what was not consumed yet is skipped.
    Latest,
    /// This offset of each partition.
    Offset(u64),
    /// Each partition's first record appended at or after this time
    /// ([`EventLog::offset_at`]).
    Time(SystemTime),
}

impl FromStr for Target {
    type Err = ResetError;

    /// `earliest`, `latest`, `offset:N` or `time:RFC3339` (UTC, e.g.
    /// `time:2026-11-30T12:00:00Z`).
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| ResetError::BadTarget { value: value.to_owned(), reason: reason.to_owned() };
        match value.split_once(':') {
            None if value == "earliest" => Ok(Self::Earliest),
            None if value == "latest" => Ok(Self::Latest),
            Some(("offset", n)) => n.parse().map(Self::Offset).map_err(|_| bad("the offset is not a whole number")),
            Some(("time", t)) => humantime::parse_rfc3339_weak(t)
                .map(Self::Time)
                .map_err(|_| bad("the time is not RFC 3339 in UTC, like 2026-11-30T12:00:00Z")),
            _ => Err(bad("expected earliest, latest, offset:N or time:RFC3339")),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Earliest => f.write_str("earliest"),
            Self::Latest => f.write_str("latest"),
            Self::Offset(n) => write!(f, "offset:{n}"),
            Self::Time(t) => write!(f, "time:{}", humantime::format_rfc3339(*t)),
        }
    }
}

/// Why a reset could not be planned or applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResetError {
    /// The target does not parse.
    #[error("bad reset target `{value}`: {reason}")]
    BadTarget {
        /// The text given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Earliest clears state every partition shares, so it cannot be
    /// limited to some partitions.
    #[error("a reset to earliest starts the whole projection over; it takes no partition list")]
    EarliestTakesAllPartitions,
    /// The offset is past a partition's end.
    #[error("offset {offset} is past the end of `{topic}` partition {partition} (it ends at {end})")]
    OffsetPastEnd {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The offset asked for.
        offset: u64,
        /// The partition's end offset.
        end: u64,
    },
    /// The backup of the state could not be written; nothing was reset.
    #[error("cannot write the backup `{}`; nothing was reset", path.display())]
    Backup {
        /// The backup's directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: StateError,
    },
    /// The backup directory could not be created; nothing was reset.
    #[error("cannot create the backup directory `{}`; nothing was reset", path.display())]
    BackupDirectory {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The state store failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// The log failed (a missing topic or partition, an unreachable server).
    #[error(transparent)]
    Log(#[from] LogError),
    /// Earliest would replay a topic whose oldest messages are gone, and
    /// that was not accepted ([`Plan::check_history`]).
    #[error(transparent)]
    LostHistory(#[from] Box<LostHistory>),
}

/// One partition's move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The partition.
    pub partition: u32,
    /// Its committed position (0 when it was never consumed).
    pub from: u64,
    /// Where it goes.
    pub to: u64,
}

impl Move {
    /// Events this move skips: they will never be applied.
    pub fn skipped(&self) -> u64 {
        self.to.saturating_sub(self.from)
    }

    /// Events this move goes back over: they will be applied again.
    pub fn replayed(&self) -> u64 {
        self.from.saturating_sub(self.to)
    }
}

/// A reset worked out, nothing written yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The topic the projection consumes.
    pub topic: String,
    /// Where it goes.
    pub target: Target,
    /// Each partition's move, in partition order. For earliest, the
    /// partitions the projection has consumed.
    pub moves: Vec<Move>,
    /// For earliest, the partitions whose oldest messages the log no longer
    /// holds (retention): the replay would lack them.
    pub lost_history: Vec<LostHead>,
}

impl Plan {
    /// Refuses a plan whose replay lacks messages the log no longer holds
    /// ([`ResetError::LostHistory`], saying how many), unless `accept`.
    pub fn check_history(&self, accept: bool) -> Result<(), ResetError> {
        match self.lost_history.is_empty() || accept {
            true => Ok(()),
            false => Err(Box::new(LostHistory { topic: self.topic.clone(), lost: self.lost_history.clone() }).into()),
        }
    }
}

/// Works out a reset of the projection `store` holds on `topic`: for
/// `partitions` (every partition of the topic when `None`), where each is
/// and where `target` puts it. Writes nothing.
pub async fn plan<L: EventLog>(
    log: &L,
    store: &StateStore,
    topic: &str,
    target: Target,
    partitions: Option<&[u32]>,
) -> Result<Plan, ResetError> {
    let count = log.partitions(topic).await?;
    let chosen: Vec<u32> = match (target, partitions) {
        (Target::Earliest, Some(_)) => return Err(ResetError::EarliestTakesAllPartitions),
        (_, Some(listed)) => {
            let mut listed = listed.to_vec();
            listed.sort_unstable();
            listed.dedup();
            if let Some(&partition) = listed.iter().find(|&&p| p >= count) {
                return Err(
                    LogError::PartitionNotFound { topic: topic.to_owned(), partition, partitions: count }.into()
                );
            }
            listed
        }
        (_, None) => (0..count).collect(),
    };
    let mut moves = Vec::with_capacity(chosen.len());
    for partition in chosen {
        let position = store.position(topic, partition)?;
        let from = position.unwrap_or(0);
        let to = match target {
            Target::Earliest if position.is_none() => continue,
            Target::Earliest => 0,
            Target::Latest => log.end_offset(topic, partition).await?,
            Target::Offset(offset) => {
                let end = log.end_offset(topic, partition).await?;
                if offset > end {
                    return Err(ResetError::OffsetPastEnd { topic: topic.to_owned(), partition, offset, end });
                }
                offset
            }
            Target::Time(time) => log.offset_at(topic, partition, time).await?,
        };
        moves.push(Move { partition, from, to });
    }
    let lost_history = match target {
        Target::Earliest => loss::lost_history(log, topic).await?,
        _ => Vec::new(),
    };
    Ok(Plan { topic: topic.to_owned(), target, moves, lost_history })
}

/// Applies `plan` to the projection `store` holds; for earliest, first
/// copies the old state into a new backup directory under `backups` (when
/// given) and returns where it went.
pub async fn apply<L: EventLog>(
    log: &L,
    store: &StateStore,
    projection: &str,
    plan: &Plan,
    backups: Option<&Path>,
) -> Result<Option<PathBuf>, ResetError> {
    let topic = plan.topic.as_str();
    let positions = |moves: &[Move]| moves.iter().map(|m| (topic.to_owned(), m.partition, m.to)).collect::<Vec<_>>();
    // The operator decided where the partitions go: a lost tail recorded
    // for them no longer stops them.
    let moved: Vec<u32> = plan.moves.iter().map(|m| m.partition).collect();
    let whole = plan.target == Target::Earliest || moved.len() as u32 == log.partitions(topic).await?;
    if plan.target != Target::Earliest {
        store.commit(BatchCommit { positions: positions(&plan.moves), ..BatchCommit::default() })?;
        loss::clear(store, topic, &moved, whole)?;
        return Ok(None);
    }
    let backup = match backups {
        Some(dir) => Some(backup(store, projection, dir)?),
        None => None,
    };
    let mut start = positions(&plan.moves);
    // What waits in the retry and dead-letter topics belongs to events the
    // replay applies again: start past it.
    for routed in [retry_topic(topic), dlq_topic(topic)] {
        let ends = match log.end_offsets(&routed).await {
            Err(LogError::TopicNotFound { .. }) => continue, // never consumed: nothing routed
            ends => ends?,
        };
        start.extend(ends.into_iter().zip(0..).map(|(end, partition)| (routed.clone(), partition, end)));
    }
    store.start_over(start)?;
    let all: Vec<u32> = (0..log.partitions(topic).await?).collect();
    loss::clear(store, topic, &all, whole)?;
    Ok(backup)
}

/// Applies the plans of a projection over several topics, one per topic,
/// the first topic's first: earliest starts the whole projection over
/// once (clearing every topic's position) and forgets the lost tails of
/// every topic; any other target moves each topic's positions. Returns the
/// backup's directory, as [`apply`] does.
pub async fn apply_all<L: EventLog>(
    log: &L,
    store: &StateStore,
    projection: &str,
    plans: &[Plan],
    backups: Option<&Path>,
) -> Result<Option<PathBuf>, ResetError> {
    let Some((first, later)) = plans.split_first() else { return Ok(None) };
    if first.target != Target::Earliest {
        for plan in plans {
            apply(log, store, projection, plan, None).await?;
        }
        return Ok(None);
    }
    let backup = apply(log, store, projection, first, backups).await?;
    for plan in later {
        let all: Vec<u32> = (0..log.partitions(&plan.topic).await?).collect();
        loss::clear(store, &plan.topic, &all, true)?;
    }
    Ok(backup)
}

/// Copies the state of `store` into a new embedded state file,
/// `<backups>/<projection>-<UTC time>/projections/<projection>.redb`, and
/// returns that backup's directory (read it with `--data <directory>`).
pub fn backup(store: &StateStore, projection: &str, backups: &Path) -> Result<PathBuf, ResetError> {
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now()).to_string().replace(':', "-");
    std::fs::create_dir_all(backups)
        .map_err(|source| ResetError::BackupDirectory { path: backups.to_path_buf(), source })?;
    // A fresh directory, even for two resets within one second.
    let mut dir = backups.join(format!("{projection}-{stamp}"));
    let mut attempt = 1;
    loop {
        match std::fs::create_dir(&dir) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                attempt += 1;
                dir = backups.join(format!("{projection}-{stamp}-{attempt}"));
            }
            Err(source) => return Err(ResetError::BackupDirectory { path: dir, source }),
        }
    }
    let file = dir.join("projections").join(format!("{projection}.redb"));
    copy_state(store, &file).map_err(|source| ResetError::Backup { path: dir.clone(), source })?;
    Ok(dir)
}

/// Keys copied per commit into a backup, at most.
const KEYS_PER_COMMIT: usize = 1024;
/// Bytes of entries copied per commit into a backup, about: the entries of
/// a key are read in pages of at most this much (and at least one entry),
/// so a backup holds at most about twice this in memory however large
/// the keys' values.
const BYTES_PER_COMMIT: usize = 32 << 20;
/// Entries read per page of a key.
const ENTRIES_PER_PAGE: usize = 1024;

/// Copies everything `from` holds into a new embedded store at `file`.
fn copy_state(from: &StateStore, file: &Path) -> Result<(), StateError> {
    let to = StateStore::open(file)?;
    let (mut writes, mut bytes): (Vec<(crate::key::Key, KeyWrites)>, usize) = (Vec::new(), 0);
    for key in from.keys()? {
        let mut after: Option<String> = None;
        loop {
            let page = from.entries_page(&key, after.as_deref(), ENTRIES_PER_PAGE, BYTES_PER_COMMIT)?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.clone());
            let mut entries = KeyWrites::default();
            for (name, value) in page {
                bytes += name.len() + value.len();
                entries.set(&name, value);
            }
            match writes.last_mut() {
                Some((previous, written)) if *previous == key => written.merge(entries),
                _ => writes.push((key.clone(), entries)),
            }
            if bytes >= BYTES_PER_COMMIT || writes.len() >= KEYS_PER_COMMIT {
                to.commit(BatchCommit { writes: std::mem::take(&mut writes), ..BatchCommit::default() })?;
                bytes = 0;
            }
        }
    }
    to.commit(BatchCommit { writes, ..BatchCommit::default() })?;
    to.commit(BatchCommit {
        counter_deltas: from.counters()?.into_iter().collect(),
        stat_deltas: from.stats()?,
        positions: from.positions()?,
        done: from.done_marks()?,
        outbox: from.outbox()?.into_iter().map(|(_, entry)| entry).collect(),
        ..BatchCommit::default()
    })?;
    for (name, value) in from.meta_entries()? {
        to.set_meta(&name, &value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;
    use crate::storage::log::{EmbeddedLog, Record};

    #[test]
    fn targets_parse_and_bad_ones_say_why() {
        assert_eq!("earliest".parse::<Target>().unwrap(), Target::Earliest);
        assert_eq!("latest".parse::<Target>().unwrap(), Target::Latest);
        assert_eq!("offset:42".parse::<Target>().unwrap(), Target::Offset(42));
        let time = "time:2026-11-30T12:00:00Z".parse::<Target>().unwrap();
        assert_eq!(time, Target::Time(humantime::parse_rfc3339("2026-11-30T12:00:00Z").unwrap()));
        assert_eq!(time.to_string(), "time:2026-11-30T12:00:00Z");
        for (value, reason) in [
            ("offset:-1", "whole number"),
            ("offset:", "whole number"),
            ("time:yesterday", "RFC 3339"),
            ("start", "earliest, latest"),
            ("Earliest", "earliest, latest"),
            ("latest:5", "earliest, latest"),
        ] {
            let error = value.parse::<Target>().unwrap_err().to_string();
            assert!(error.contains(&format!("`{value}`")) && error.contains(reason), "{value}: {error}");
        }
    }

    fn record() -> Record {
        Record { headers: Vec::new(), body: b"x".to_vec() }
    }

    /// Key 1's entry `v` set to `1`.
    fn one_entry() -> Vec<(Key, KeyWrites)> {
        let mut writes = KeyWrites::default();
        writes.set("v", b"1".to_vec());
        vec![(Key::int(1), writes)]
    }

    async fn log_with(dir: &Path, ends: &[u64]) -> EmbeddedLog {
        let log = EmbeddedLog::open(dir.join("log.redb")).unwrap();
        log.create_topic("t", ends.len() as u32).await.unwrap();
        let batches = ends.iter().zip(0..).map(|(&end, p)| (p, vec![record(); end as usize])).collect();
        log.append("t", batches).await.unwrap();
        log
    }

    #[tokio::test]
    async fn moves_reach_only_the_named_partitions_and_keep_state() {
        let dir = tempfile::tempdir().unwrap();
        let log = log_with(dir.path(), &[10, 20, 30]).await;
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        store
            .commit(BatchCommit {
                writes: one_entry(),
                positions: vec![("t".into(), 0, 5), ("t".into(), 1, 5), ("t".into(), 2, 5)],
                ..BatchCommit::default()
            })
            .unwrap();
        let plan = plan(&log, &store, "t", Target::Offset(8), Some(&[2, 0, 2])).await.unwrap();
        assert_eq!(plan.moves, [Move { partition: 0, from: 5, to: 8 }, Move { partition: 2, from: 5, to: 8 }]);
        assert_eq!(apply(&log, &store, "p", &plan, Some(dir.path())).await.unwrap(), None, "no backup for a move");
        let positions = store.positions().unwrap();
        assert_eq!(positions, [("t".to_owned(), 0, 8), ("t".to_owned(), 1, 5), ("t".to_owned(), 2, 8)]);
        assert_eq!(store.get(&Key::int(1), "v").unwrap(), Some(b"1".to_vec()), "state is kept");

        let latest = super::plan(&log, &store, "t", Target::Latest, None).await.unwrap();
        assert_eq!(latest.moves.iter().map(|m| m.to).collect::<Vec<_>>(), [10, 20, 30]);
        assert_eq!(latest.moves[1].skipped(), 15);
        let back = super::plan(&log, &store, "t", Target::Offset(2), Some(&[1])).await.unwrap();
        assert_eq!((back.moves[0].replayed(), back.moves[0].skipped()), (3, 0));

        let past = super::plan(&log, &store, "t", Target::Offset(11), None).await.unwrap_err();
        assert!(matches!(past, ResetError::OffsetPastEnd { partition: 0, offset: 11, end: 10, .. }), "{past}");
        let missing = super::plan(&log, &store, "t", Target::Latest, Some(&[3])).await.unwrap_err();
        assert!(matches!(missing, ResetError::Log(LogError::PartitionNotFound { partition: 3, .. })), "{missing}");
        let earliest = super::plan(&log, &store, "t", Target::Earliest, Some(&[0])).await.unwrap_err();
        assert!(matches!(earliest, ResetError::EarliestTakesAllPartitions), "{earliest}");
    }

    #[test]
    fn a_backup_copies_every_entry_of_keys_larger_than_a_page() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        let mut writes = Vec::new();
        for key in 0..3u64 {
            let mut entries = KeyWrites::default();
            for n in 0..(ENTRIES_PER_PAGE as u64 * 2 + key) {
                entries.set(&format!("e{n:05}"), vec![key as u8; 100]);
            }
            writes.push((Key::int(key), entries));
        }
        store.commit(BatchCommit { writes, ..BatchCommit::default() }).unwrap();
        copy_state(&store, &dir.path().join("copy.redb")).unwrap();
        let copy = StateStore::open(&dir.path().join("copy.redb")).unwrap();
        assert_eq!(copy.keys().unwrap(), store.keys().unwrap());
        for key in store.keys().unwrap() {
            assert_eq!(copy.entries(&key).unwrap(), store.entries(&key).unwrap());
        }
    }

    #[tokio::test]
    async fn earliest_starts_over_past_the_routed_records_and_keeps_a_backup() {
        let dir = tempfile::tempdir().unwrap();
        let log = log_with(dir.path(), &[10, 20]).await;
        log.create_topic("retry_t", 2).await.unwrap();
        log.create_topic("dlq_t", 2).await.unwrap();
        log.append("retry_t", vec![(1, vec![record(); 4])]).await.unwrap();
        log.append("dlq_t", vec![(0, vec![record(); 3])]).await.unwrap();
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        store
            .commit(BatchCommit {
                writes: one_entry(),
                counter_deltas: [("c".to_owned(), 7)].into_iter().collect(),
                positions: vec![("t".into(), 0, 10), ("t".into(), 1, 20), ("retry_t".into(), 1, 1)],
                done: vec![("retry_t".into(), 1, 3)],
                ..BatchCommit::default()
            })
            .unwrap();
        let plan = plan(&log, &store, "t", Target::Earliest, None).await.unwrap();
        assert_eq!(plan.moves.iter().map(|m| m.replayed()).collect::<Vec<_>>(), [10, 20]);
        let backup = apply(&log, &store, "p", &plan, Some(&dir.path().join("backups"))).await.unwrap().unwrap();

        assert!(store.keys().unwrap().is_empty() && store.counters().unwrap().is_empty());
        assert!(store.done_marks().unwrap().is_empty());
        let expected =
            [("dlq_t", 0, 3), ("dlq_t", 1, 0), ("retry_t", 0, 0), ("retry_t", 1, 4), ("t", 0, 0), ("t", 1, 0)];
        let expected: Vec<_> = expected.iter().map(|&(t, p, o)| (t.to_owned(), p, o)).collect();
        assert_eq!(store.positions().unwrap(), expected);

        // The backup is a state directory holding everything as it was.
        let old = StateStore::open(&backup.join("projections/p.redb")).unwrap();
        assert_eq!(old.get(&Key::int(1), "v").unwrap(), Some(b"1".to_vec()));
        assert_eq!(old.counters().unwrap(), [("c".to_owned(), 7)]);
        assert_eq!(old.position("retry_t", 1).unwrap(), Some(1));
        assert_eq!(old.done("retry_t", 1).unwrap(), [3]);
        // A second reset within the second gets a directory of its own.
        let again = apply(&log, &store, "p", &plan, Some(&dir.path().join("backups"))).await.unwrap().unwrap();
        assert_ne!(again, backup);
    }
}
