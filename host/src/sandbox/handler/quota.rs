//! The `counter-count` quota across the batches in flight: how many
//! distinct counters a projection holds, so that a new one is refused at
//! [`PayloadLimits::max_counters`] however many partitions add at once.
//!
//! Counters are shared by every key, and keys of several partitions run at
//! the same time, each batch over its own snapshot. A batch alone would see
//! only its snapshot and its own new counters, so with several partitions in
//! flight each could fill the room left: the quota would be off by a batch
//! per partition. A [`CounterQuota`] is therefore shared by every batch a
//! consumer runs, and each batch draws a [`BatchCounters`] from it.
//!
//! Rules it keeps:
//! - **Counted: committed plus held.** A batch admits a counter its
//!   snapshot does not hold when the snapshot's count plus the names held
//!   stays under the limit. Names are **held** by the batches adding them
//!   (one hold per key scope that added the name; a failed call's holds are
//!   given back) and, once their batch committed, until every batch in
//!   flight has a snapshot that sees that commit.
//! - **Never below the truth.** Every counter that exists or will
//!   exist once the batches in flight commit is in the snapshot's count of
//!   each batch or among the names held. A name may be in both (a batch
//!   whose snapshot already sees a commit whose names are still held for an
//!   older batch), so the count may run ahead of the truth by what the
//!   latest batches added, until the older batches end: a new counter may
//!   be refused a little early, never admitted past the limit.
//! - **Cheap.** The snapshot's count is read once per batch, and only once
//!   a module adds to a counter its snapshot lacks; counters that exist
//!   never touch the quota.
//!
//! Several hosts sharing a PostgreSQL projection see each other's counters
//! only through their snapshots, so together they may go past the limit by
//! what each host's batches in flight add at once.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::RandomState;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::storage::state::StateError;
use wakuwaku_core::limits::PayloadLimits;

/// The counters the batches of one consumer add, shared by those batches
/// (cloning shares it).
#[derive(Debug, Clone)]
pub struct CounterQuota {
    limit: usize,
    ledger: Arc<Mutex<Ledger>>,
}

/// What every batch drawn from one [`CounterQuota`] holds.
#[derive(Debug, Default)]
struct Ledger {
    /// Each name held, with its number of holds. Names are the module's
    /// choice: a seeded hash.
    held: HashMap<String, usize, RandomState>,
    /// Batches that committed new counters so far; the number of the last.
    commits: u64,
    /// The batches in flight, by the number of commits before their
    /// snapshot (so it sees those), with how many started at that number.
    in_flight: BTreeMap<u64, usize>,
    /// The holds of each batch in flight, by batch.
    batches: HashMap<u64, HashMap<String, usize, RandomState>>,
    /// The next batch's number.
    next_batch: u64,
    /// Names committed batches added, by the commit's number, each holding
    /// one hold until every batch in flight sees that commit.
    unseen: VecDeque<(u64, Vec<String>)>,
}

impl Ledger {
    /// Lets go of the names of commits every batch in flight sees.
    fn forget_seen(&mut self) {
        let oldest = self.in_flight.keys().next().copied().unwrap_or(self.commits);
        while self.unseen.front().is_some_and(|(commit, _)| *commit <= oldest) {
            if let Some((_, names)) = self.unseen.pop_front() {
                for name in names {
                    self.release(&name, 1);
                }
            }
        }
    }

    /// Gives back `holds` holds of `name`.
    fn release(&mut self, name: &str, holds: usize) {
        if let Some(count) = self.held.get_mut(name) {
            *count = count.saturating_sub(holds);
            if *count == 0 {
                self.held.remove(name);
            }
        }
    }
}

impl CounterQuota {
    /// A quota of `limits.max_counters` counters.
    pub fn new(limits: &PayloadLimits) -> Self {
        Self { limit: limits.max_counters, ledger: Arc::default() }
    }

    /// A batch's share. Draw it **before** taking the batch's snapshot:
    /// it notes the commits made so far, which the snapshot then surely
    /// sees.
    pub fn batch(&self) -> BatchCounters {
        let mut ledger = lock(&self.ledger);
        let (seen, number) = (ledger.commits, ledger.next_batch);
        ledger.next_batch += 1;
        *ledger.in_flight.entry(seen).or_default() += 1;
        ledger.batches.insert(number, HashMap::default());
        drop(ledger);
        BatchCounters {
            share: Arc::new(Share {
                limit: self.limit,
                ledger: self.ledger.clone(),
                seen,
                number,
                committed: OnceLock::new(),
                done: AtomicBool::new(false),
            }),
        }
    }

    /// How many names are held now (for tests and metrics).
    pub fn held(&self) -> usize {
        lock(&self.ledger).held.len()
    }
}

/// One batch's share of a [`CounterQuota`]; its key scopes share it
/// (cloning shares it). When the last clone is dropped, the batch's holds
/// are given back, or, after [`BatchCounters::committed`], kept until every
/// batch in flight sees the commit.
#[derive(Debug, Clone)]
pub struct BatchCounters {
    share: Arc<Share>,
}

#[derive(Debug)]
struct Share {
    limit: usize,
    ledger: Arc<Mutex<Ledger>>,
    /// The commits the batch's snapshot sees at least.
    seen: u64,
    number: u64,
    /// The counters the batch's snapshot holds (up to the limit), once read.
    committed: OnceLock<usize>,
    /// Whether the batch committed.
    done: AtomicBool,
}

/// Why a new counter was not admitted.
#[derive(Debug)]
pub(crate) enum Hold {
    /// The projection holds `held` counters, committed and pending.
    Full {
        /// The count.
        held: usize,
    },
    /// Reading the snapshot's count failed.
    Store(StateError),
}

impl BatchCounters {
    /// Holds a place for `name`, a counter the batch's snapshot does not
    /// hold, for one key scope; `committed` reads the snapshot's count (up
    /// to the limit) the first time it is needed.
    pub(crate) fn hold(
        &self,
        name: &str,
        committed: impl FnOnce(usize) -> Result<usize, StateError>,
    ) -> Result<(), Hold> {
        let share = &*self.share;
        let committed = match share.committed.get() {
            Some(&count) => count,
            // Read outside the lock: it may wait on the database. Two
            // workers may both read it; they read the same snapshot.
            None => {
                let count = committed(share.limit).map_err(Hold::Store)?.min(share.limit);
                *share.committed.get_or_init(|| count)
            }
        };
        // Full already in the snapshot: refused without taking the lock the
        // batches in flight share (a module spinning on refusals stays off it).
        if committed >= share.limit {
            return Err(Hold::Full { held: committed });
        }
        let mut ledger = lock(&share.ledger);
        if !ledger.held.contains_key(name) {
            let held = committed.saturating_add(ledger.held.len());
            if held >= share.limit {
                return Err(Hold::Full { held });
            }
        }
        *ledger.held.entry(name.to_owned()).or_default() += 1;
        if let Some(holds) = ledger.batches.get_mut(&share.number) {
            *holds.entry(name.to_owned()).or_default() += 1;
        }
        Ok(())
    }

    /// Gives back one hold of `name` (a failed call's new counter).
    pub(crate) fn release(&self, name: &str) {
        let mut ledger = lock(&self.share.ledger);
        let number = self.share.number;
        let Some(holds) = ledger.batches.get_mut(&number) else { return };
        match holds.get_mut(name) {
            Some(count) if *count > 1 => *count -= 1,
            Some(_) => {
                holds.remove(name);
            }
            None => return,
        }
        ledger.release(name, 1);
    }

    /// Marks the batch committed: its new counters are in the store, and
    /// stay held until every batch in flight sees them.
    pub fn committed(&self) {
        self.share.done.store(true, Ordering::Release);
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut ledger = lock(&self.ledger);
        let holds = ledger.batches.remove(&self.number).unwrap_or_default();
        if *self.done.get_mut() && !holds.is_empty() {
            ledger.commits += 1;
            let commit = ledger.commits;
            // One hold per name stays, for the batches that do not see
            // this commit yet.
            for (name, count) in &holds {
                ledger.release(name, count - 1);
            }
            ledger.unseen.push_back((commit, holds.into_keys().collect()));
        } else {
            for (name, count) in holds {
                ledger.release(&name, count);
            }
        }
        if let Some(count) = ledger.in_flight.get_mut(&self.seen) {
            *count -= 1;
            if *count == 0 {
                ledger.in_flight.remove(&self.seen);
            }
        }
        ledger.forget_seen();
    }
}

/// The ledger, also after a panic elsewhere (its counts stay consistent:
/// every change is made whole under the lock).
fn lock(ledger: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(limit: usize) -> CounterQuota {
        CounterQuota::new(&PayloadLimits { max_counters: limit, ..PayloadLimits::default() })
    }

    fn held(result: Result<(), Hold>) -> usize {
        match result {
            Err(Hold::Full { held }) => held,
            other => panic!("expected the quota to be full, got {other:?}"),
        }
    }

    #[test]
    fn a_batch_admits_new_counters_up_to_the_limit_less_what_its_snapshot_holds() {
        let quota = quota(5);
        let batch = quota.batch();
        for name in ["a", "b", "c"] {
            batch.hold(name, |_| Ok(2)).unwrap();
        }
        assert_eq!(held(batch.hold("d", |_| unreachable!("read once"))), 5);
        // A name already held takes no new place.
        batch.hold("a", |_| unreachable!()).unwrap();
        // Given back, a place is free again.
        batch.release("b");
        batch.hold("d", |_| unreachable!()).unwrap();
        assert_eq!(quota.held(), 3);
        drop(batch);
        assert_eq!(quota.held(), 0, "an uncommitted batch gives everything back");
    }

    #[test]
    fn a_name_two_scopes_hold_stays_held_until_both_give_it_back() {
        let quota = quota(3);
        let batch = quota.batch();
        batch.hold("x", |_| Ok(0)).unwrap();
        batch.hold("x", |_| Ok(0)).unwrap();
        batch.release("x");
        assert_eq!(quota.held(), 1);
        batch.release("x");
        assert_eq!(quota.held(), 0);
    }

    #[test]
    fn batches_in_flight_share_the_room_left() {
        let quota = quota(4);
        let (one, two) = (quota.batch(), quota.batch());
        one.hold("a", |_| Ok(1)).unwrap();
        two.hold("b", |_| Ok(1)).unwrap();
        one.hold("c", |_| Ok(1)).unwrap();
        assert_eq!(held(two.hold("d", |_| Ok(1))), 4, "the other partition's new counters count");
        two.hold("a", |_| Ok(1)).unwrap();
        drop(one);
        // `a` is still held by the second batch.
        assert_eq!(quota.held(), 2);
    }

    #[test]
    fn committed_names_stay_held_until_every_older_batch_is_done() {
        let quota = quota(3);
        let old = quota.batch(); // its snapshot predates the commit below
        let adding = quota.batch();
        adding.hold("a", |_| Ok(0)).unwrap();
        adding.hold("b", |_| Ok(0)).unwrap();
        adding.committed();
        drop(adding);
        // `old` does not see `a` and `b` in its snapshot (count 0): they
        // must still count, or it could add three more.
        old.hold("c", |_| Ok(0)).unwrap();
        assert_eq!(held(old.hold("d", |_| unreachable!())), 3);
        // A batch started now sees the commit in its snapshot (count 2) and
        // still in the names held: early, never late.
        let new = quota.batch();
        assert_eq!(held(new.hold("e", |_| Ok(2))), 5);
        drop(old);
        // Once the old batch is done, `a` and `b` are only counted by the
        // snapshots; `c` was never committed.
        assert_eq!(quota.held(), 0);
        new.hold("e", |_| unreachable!()).unwrap();
        assert_eq!(held(new.hold("f", |_| unreachable!())), 3);
    }

    #[test]
    fn a_failed_count_is_a_store_error_and_holds_nothing() {
        let quota = quota(3);
        let batch = quota.batch();
        let error = StateError::Corrupt { store: "s".into(), what: "w".into() };
        assert!(matches!(batch.hold("a", |_| Err(error)), Err(Hold::Store(_))));
        assert_eq!(quota.held(), 0);
        batch.hold("a", |limit| Ok(limit - 1)).unwrap();
        assert_eq!(held(batch.hold("b", |_| unreachable!())), 3);
    }
}
