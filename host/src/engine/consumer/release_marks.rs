//! The release stage's checkpoint ([`Checkpoint`]) kept with the state, in
//! the commit of every batch of a projection over several topics.
//!
//! Rules it keeps:
//! - **One transaction.** The checkpoint is written as committed positions
//!   ([`BatchCommit::positions`]), which every state backend already stores
//!   in the batch's transaction and fences by partition: so the released
//!   events applied, the state they wrote and the checkpoint that says they
//!   were released are never apart, whenever the host is killed.
//! - **Where each topic resumes is its own position**: an input's `commit`
//!   (its lowest held offset, or its position) is the topic's committed
//!   position, read back by everything that reads positions (`waku status`,
//!   `waku reset`, the lag gauge) as for a one-topic projection.
//! - **The rest under names no topic can have** (a topic name has no `:`):
//!   `release:read-to:<topic>` for an input's `read_to`, and
//!   `release:clock-high` and `release:clock-low` for the partition index's
//!   clock: its 64 bits (sign flipped) in two halves of 32, as a position
//!   must fit a PostgreSQL `bigint`, which the clock's bits need not.
//! - **The held list** ([`InputCheckpoint::held`]) as
//!   `release:held-runs:<topic>` (how many runs) and, per run `i`,
//!   `release:held-start:<topic>:<i>` and `release:held-end:<topic>:<i>`:
//!   two positions per run of held offsets, so a commit costs what the
//!   held runs number, not the held events. Runs past the count, left by
//!   an earlier commit, are not read. A checkpoint written before the list
//!   has no count: it restores as one without a list (the clock rule), and
//!   so does a count larger than the offsets it covers (a damaged mark).
//! - **Each topic's marks are its own.** A topic whose marks do not match
//!   its position (none yet: a topic added to the projection; or a
//!   `read_to` below it) starts fresh at its position, and the other
//!   topics keep theirs, so adding a topic repeats nothing of the others.
//!   After `waku reset`, which starts every position over, every mark is
//!   gone with them and the whole stage starts fresh from the positions.
//! - **A topic removed while it holds events is refused**
//!   ([`refuse_held_by_removed`]): a topic no longer given whose marks
//!   still list held events of the partition index would never have them
//!   applied, so the partition does not start, and the error says to run
//!   once more with the topic until caught up (which releases every held
//!   event), then without it.
//! - **A topic read alone after the stage skips what it released**
//!   ([`ReleasedMarks`]): a projection cut to one of its topics reads
//!   that topic from its position (its lowest held offset) without the
//!   stage; every offset below its `read_to` that the held list does not
//!   name was released and applied already, so it is skipped, and each
//!   commit writes the held list again clipped at the new position, until
//!   the position passes `read_to` and the marks no longer apply. A topic
//!   whose checkpoint has no held list cannot say which were released: it
//!   is refused, like a removed topic that holds events.

use wakuwaku_core::release::{Checkpoint, HeldRun, InputCheckpoint, Millis};

use super::ConsumerError;
use crate::storage::state::{BatchCommit, StateError, StateStore};

/// The position names of the clock's halves.
const CLOCK_HIGH: &str = "release:clock-high";
const CLOCK_LOW: &str = "release:clock-low";

/// The prefix of the position name of a topic's `read_to`.
const READ_TO: &str = "release:read-to:";

/// The position name of a topic's `read_to`.
fn read_to_name(topic: &str) -> String {
    format!("{READ_TO}{topic}")
}

/// The topics whose `read_to` `store` keeps: those of a projection over
/// several topics that read them (none for a projection of one topic),
/// sorted by name, as the checkpoint does not keep their order.
pub(crate) fn marked_topics(store: &StateStore) -> Result<Vec<String>, StateError> {
    let mut topics: Vec<String> = store
        .positions()?
        .into_iter()
        .filter_map(|(name, _, _)| name.strip_prefix(READ_TO).map(str::to_owned))
        .collect();
    topics.sort();
    topics.dedup();
    Ok(topics)
}

/// The position names of a topic's held list: its count of runs, and each
/// run's first offset and end.
fn held_runs_name(topic: &str) -> String {
    format!("release:held-runs:{topic}")
}

fn held_start_name(topic: &str, run: usize) -> String {
    format!("release:held-start:{topic}:{run}")
}

fn held_end_name(topic: &str, run: usize) -> String {
    format!("release:held-end:{topic}:{run}")
}

/// The clock's bits, sign flipped.
pub(super) fn clock_bits(clock: Millis) -> u64 {
    (clock as u64) ^ (1 << 63)
}

/// The clock of its bits ([`clock_bits`]).
pub(super) fn clock_of(bits: u64) -> Millis {
    (bits ^ (1 << 63)) as Millis
}

/// Adds `checkpoint` of `partition` over `topics` (one per input, in input
/// order) to `commit`.
pub(crate) fn add_to_commit(commit: &mut BatchCommit, topics: &[String], partition: u32, checkpoint: &Checkpoint) {
    for (topic, input) in topics.iter().zip(&checkpoint.inputs) {
        commit.positions.push((topic.clone(), partition, input.commit));
        commit.positions.push((read_to_name(topic), partition, input.read_to));
        if let Some(runs) = &input.held {
            add_held_list(commit, topic, partition, runs);
        }
    }
    if let Some(clock) = checkpoint.clock {
        let bits = clock_bits(clock);
        commit.positions.push((CLOCK_HIGH.to_owned(), partition, bits >> 32));
        commit.positions.push((CLOCK_LOW.to_owned(), partition, bits & u64::from(u32::MAX)));
    }
}

/// Adds `topic`'s held list of `partition` to `commit`: its count of runs
/// and each run's first offset and end.
fn add_held_list(commit: &mut BatchCommit, topic: &str, partition: u32, runs: &[HeldRun]) {
    commit.positions.push((held_runs_name(topic), partition, runs.len() as u64));
    for (at, run) in runs.iter().enumerate() {
        commit.positions.push((held_start_name(topic, at), partition, run.start));
        commit.positions.push((held_end_name(topic, at), partition, run.end));
    }
}

/// The checkpoint of `partition` over `topics` as last committed: each
/// input resumes at its topic's position. Without marks (a first run, or
/// after a reset) it is a fresh start at the positions.
pub(crate) fn restore(store: &StateStore, topics: &[String], partition: u32) -> Result<Checkpoint, StateError> {
    let mut inputs = Vec::with_capacity(topics.len());
    let mut any_marked = false;
    for topic in topics {
        let commit = store.position(topic, partition)?.unwrap_or(0);
        match store.position(&read_to_name(topic), partition)? {
            Some(read_to) if read_to >= commit => {
                any_marked = true;
                let held = held_list(store, topic, partition, commit, read_to)?;
                inputs.push(InputCheckpoint { commit, read_to, held });
            }
            _ => inputs.push(InputCheckpoint { commit, read_to: commit, held: Some(Vec::new()) }),
        }
    }
    if !any_marked {
        let positions: Vec<u64> = inputs.iter().map(|input| input.commit).collect();
        return Ok(Checkpoint::start(&positions));
    }
    let clock = match (store.position(CLOCK_HIGH, partition)?, store.position(CLOCK_LOW, partition)?) {
        (Some(high), Some(low)) => Some(clock_of((high << 32) | low)),
        _ => None,
    };
    Ok(Checkpoint { clock, inputs })
}

/// Refuses to start `partition` when a topic not among `topics` still
/// holds events there: its held list names them and its marks match its
/// position.
pub(crate) fn refuse_held_by_removed(
    store: &StateStore,
    topics: &[String],
    partition: u32,
) -> Result<(), ConsumerError> {
    let prefix = "release:held-runs:";
    for (name, at, runs) in store.positions()? {
        let Some(topic) = name.strip_prefix(prefix) else { continue };
        if at != partition || runs == 0 || topics.iter().any(|given| given == topic) {
            continue;
        }
        let commit = store.position(topic, partition)?.unwrap_or(0);
        let Some(read_to) = store.position(&read_to_name(topic), partition)?.filter(|&read_to| read_to >= commit)
        else {
            continue;
        };
        if let Some(held) = held_list(store, topic, partition, commit, read_to)?.filter(|held| !held.is_empty()) {
            let count = held.iter().map(|run| run.end - run.start).sum();
            let topic = topic.to_owned();
            return Err(ConsumerError::HeldByRemovedTopic { topic, partition, held: count, first: held[0].start });
        }
    }
    Ok(())
}

/// What a topic's marks say of the offsets from its position to its
/// `read_to`, for a projection that reads it alone now: the offsets the
/// held list names are still to be applied, every other one was released
/// and applied already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReleasedMarks {
    /// The first offset the release stage had not read.
    read_to: u64,
    /// The offsets still held, sorted, at or above the position.
    held: Vec<HeldRun>,
}

impl ReleasedMarks {
    /// The first offset past the marks: from there on, nothing was
    /// released.
    pub(crate) fn read_to(&self) -> u64 {
        self.read_to
    }

    /// Whether the event at `offset` was released and applied already.
    pub(crate) fn applied(&self, offset: u64) -> bool {
        if offset >= self.read_to {
            return false;
        }
        let after = self.held.partition_point(|run| run.start <= offset);
        after.checked_sub(1).is_none_or(|run| offset >= self.held[run].end)
    }

    /// Adds the marks of `topic`'s `partition` as they stand once the
    /// position is `next` to `commit`: the held list clipped at `next`, so
    /// that a later start, alone or with the other topics again, finds
    /// them consistent with the position.
    pub(crate) fn add_to_commit(&self, commit: &mut BatchCommit, topic: &str, partition: u32, next: u64) {
        let runs: Vec<HeldRun> = self
            .held
            .iter()
            .filter(|run| run.end > next)
            .map(|run| HeldRun { start: run.start.max(next), end: run.end })
            .collect();
        add_held_list(commit, topic, partition, &runs);
    }
}

/// The marks of `topic`'s `partition` for a projection that reads it alone:
/// none when the release stage left nothing released above its position.
/// A checkpoint without a held list is refused
/// ([`ConsumerError::ReleasedUnlisted`]).
pub(crate) fn released_marks(
    store: &StateStore,
    topic: &str,
    partition: u32,
) -> Result<Option<ReleasedMarks>, ConsumerError> {
    let commit = store.position(topic, partition)?.unwrap_or(0);
    let Some(read_to) = store.position(&read_to_name(topic), partition)?.filter(|&read_to| read_to > commit) else {
        return Ok(None);
    };
    let Some(mut held) = held_list(store, topic, partition, commit, read_to)? else {
        return Err(ConsumerError::ReleasedUnlisted { topic: topic.to_owned(), partition, commit, read_to });
    };
    held.sort_by_key(|run| run.start);
    Ok(Some(ReleasedMarks { read_to, held }))
}

/// A topic's held list: none when its checkpoint was written before the
/// list, or when the count cannot be runs of `commit..read_to`.
fn held_list(
    store: &StateStore,
    topic: &str,
    partition: u32,
    commit: u64,
    read_to: u64,
) -> Result<Option<Vec<HeldRun>>, StateError> {
    let Some(count) = store.position(&held_runs_name(topic), partition)? else { return Ok(None) };
    if count > read_to - commit {
        return Ok(None);
    }
    let mut runs = Vec::with_capacity(count as usize);
    for at in 0..count as usize {
        let start = store.position(&held_start_name(topic, at), partition)?;
        let end = store.position(&held_end_name(topic, at), partition)?;
        let (Some(start), Some(end)) = (start, end) else { return Ok(None) };
        runs.push(HeldRun { start, end });
    }
    Ok(Some(runs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_marks_skip_what_is_not_held_and_clip_the_list_at_each_commit() {
        let marks =
            ReleasedMarks { read_to: 10, held: vec![HeldRun { start: 2, end: 4 }, HeldRun { start: 7, end: 8 }] };
        let applied: Vec<u64> = (0..12).filter(|&offset| marks.applied(offset)).collect();
        assert_eq!(applied, [0, 1, 4, 5, 6, 8, 9]);
        let mut commit = BatchCommit::default();
        marks.add_to_commit(&mut commit, "b", 3, 3);
        let names: Vec<(&str, u64)> = commit.positions.iter().map(|(name, _, at)| (name.as_str(), *at)).collect();
        assert_eq!(
            names,
            [
                ("release:held-runs:b", 2),
                ("release:held-start:b:0", 3),
                ("release:held-end:b:0", 4),
                ("release:held-start:b:1", 7),
                ("release:held-end:b:1", 8),
            ]
        );
    }

    #[test]
    fn a_topic_read_alone_takes_its_marks_and_a_checkpoint_without_a_list_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("p.redb")).unwrap();
        assert_eq!(released_marks(&store, "b", 0).unwrap(), None, "never read in the stage");
        let mut commit = BatchCommit::default();
        commit.positions.push(("b".to_owned(), 0, 3));
        commit.positions.push((read_to_name("b"), 0, 9));
        store.commit(commit).unwrap();
        assert!(matches!(released_marks(&store, "b", 0), Err(ConsumerError::ReleasedUnlisted { read_to: 9, .. })));
        let mut commit = BatchCommit::default();
        commit.positions.push((held_runs_name("b"), 0, 1));
        commit.positions.push((held_start_name("b", 0), 0, 3));
        commit.positions.push((held_end_name("b", 0), 0, 5));
        store.commit(commit).unwrap();
        let marks = released_marks(&store, "b", 0).unwrap().unwrap();
        assert_eq!(marks, ReleasedMarks { read_to: 9, held: vec![HeldRun { start: 3, end: 5 }] });
        let mut commit = BatchCommit::default();
        commit.positions.push(("b".to_owned(), 0, 9));
        store.commit(commit).unwrap();
        assert_eq!(released_marks(&store, "b", 0).unwrap(), None, "the position passed the marks");
    }

    #[test]
    fn the_clock_keeps_its_order_as_a_position() {
        let times = [i64::MIN, -5, -1, 0, 1, 1_796_212_800_000, i64::MAX];
        for pair in times.windows(2) {
            assert!(clock_bits(pair[0]) < clock_bits(pair[1]), "{pair:?}");
        }
        for time in times {
            assert_eq!(clock_of(clock_bits(time)), time);
        }
    }

    #[test]
    fn a_checkpoint_round_trips_through_a_commit_and_a_reset_starts_it_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("p.redb")).unwrap();
        let topics = vec!["a".to_owned(), "b".to_owned()];
        assert_eq!(restore(&store, &topics, 1).unwrap(), Checkpoint::start(&[0, 0]));
        let checkpoint = Checkpoint {
            clock: Some(1_796_169_600_000),
            inputs: vec![
                InputCheckpoint { commit: 3, read_to: 9, held: Some(vec![HeldRun { start: 3, end: 4 }]) },
                InputCheckpoint { commit: 4, read_to: 4, held: Some(Vec::new()) },
            ],
        };
        let mut commit = BatchCommit::default();
        add_to_commit(&mut commit, &topics, 1, &checkpoint);
        store.commit(commit).unwrap();
        assert_eq!(restore(&store, &topics, 1).unwrap(), checkpoint);
        assert_eq!(restore(&store, &topics, 0).unwrap(), Checkpoint::start(&[0, 0]), "another partition index");
        store.start_over(vec![("a".to_owned(), 1, 2), ("b".to_owned(), 1, 0)]).unwrap();
        assert_eq!(restore(&store, &topics, 1).unwrap(), Checkpoint::start(&[2, 0]));
    }

    /// The release stage's checkpoint through a commit: its held list comes
    /// back as written, also when a later commit lists fewer runs; one written
    /// before the list (the positions of that time, no run count) comes back
    /// without one, so the stage judges it with the clock rule; and a topic
    /// added to the projection starts fresh while the others keep theirs.
    #[test]
    fn release_checkpoints_keep_their_held_list_and_old_ones_restore_without() {
        let dir = tempfile::tempdir().unwrap();
        let open = || StateStore::open(&dir.path().join("p.redb")).unwrap();
        let store = open();
        let topics = vec!["a".to_owned(), "b".to_owned()];
        let run = |start, end| HeldRun { start, end };
        let listed = |commit, read_to, runs: &[HeldRun]| InputCheckpoint { commit, read_to, held: Some(runs.to_vec()) };
        let checkpoint = Checkpoint {
            clock: Some(1_796_169_600_000),
            inputs: vec![listed(3, 12, &[run(3, 5), run(7, 8), run(10, 12)]), listed(4, 4, &[])],
        };
        let mut commit = BatchCommit::default();
        add_to_commit(&mut commit, &topics, 1, &checkpoint);
        store.commit(commit).unwrap();
        assert_eq!(restore(&store, &topics, 1).unwrap(), checkpoint);
        let fewer = Checkpoint {
            clock: Some(1_796_169_600_001),
            inputs: vec![listed(10, 13, &[run(10, 11)]), listed(4, 6, &[])],
        };
        let mut commit = BatchCommit::default();
        add_to_commit(&mut commit, &topics, 1, &fewer);
        store.commit(commit).unwrap();
        drop(store);
        let store = open();
        assert_eq!(restore(&store, &topics, 1).unwrap(), fewer, "the runs past the count are not read");

        // A topic added: `c` has no marks and starts at its position; `a` and
        // `b` keep theirs.
        let three = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let mut expected = fewer.clone();
        expected.inputs.push(listed(0, 0, &[]));
        assert_eq!(restore(&store, &three, 1).unwrap(), expected);

        // Partition 2 as a host before the held list committed it.
        let old = vec![
            ("a".to_owned(), 2, 3),
            ("release:read-to:a".to_owned(), 2, 9),
            ("b".to_owned(), 2, 4),
            ("release:read-to:b".to_owned(), 2, 4),
            ("release:clock-high".to_owned(), 2, 1 << 31),
            ("release:clock-low".to_owned(), 2, 15),
        ];
        store.commit(BatchCommit { positions: old, ..BatchCommit::default() }).unwrap();
        let restored = restore(&store, &topics, 2).unwrap();
        let without = |commit, read_to| InputCheckpoint { commit, read_to, held: None };
        assert_eq!(restored, Checkpoint { clock: Some(15), inputs: vec![without(3, 9), without(4, 4)] });
    }
}
