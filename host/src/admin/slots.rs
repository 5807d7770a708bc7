//! The admin endpoint's connection slots: how many connections are open,
//! from whom, and which one a newcomer displaces, so that `/health` and
//! `/ready` answer whoever else holds connections.
//!
//! Keep-alive clients that sent a request now and then, and clients that
//! sent a request a byte at a time, took every connection the endpoint
//! served, and a probe then waited in the kernel's queue until one left.
//! A bound alone cannot help (whoever holds the slots keeps them), so a
//! newcomer is never made to wait: it takes the slot of a connection that
//! waits for its client.
//!
//! Rules kept here:
//! - At most [`MAX_CONNECTIONS`] connections are open, and at most
//!   [`MAX_CONNECTIONS_PER_PEER`] from one peer address (its IP; the port
//!   is not part of it).
//! - A newcomer is always served. When its peer holds the per-peer bound,
//!   one of that peer's connections is closed to make room; when the total
//!   is reached, one of the connections of the peer holding the most. So a
//!   crowd from one address displaces its own connections first, and a
//!   probe or a scraper from another address keeps its own.
//! - Which one ([`displaced`]): an idle connection (no request read but
//!   unanswered) before one whose request is being read or answered; among
//!   idle ones the one that moved no byte for the longest; among the
//!   others the one whose request began first. A request under way is
//!   displaced only when every connection that could make room has one.
//! - A displaced connection is closed at once: its task is woken and its
//!   next read or write fails, as an idle keep-alive connection closed by
//!   its timeout does (HTTP clients send again on a new connection).
//! - The timeouts are the connection's own ([`super::IDLE_TIMEOUT`],
//!   [`super::REQUEST_DEADLINE`]); displacing is what keeps the endpoint
//!   answerable within them.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use tokio::time::Instant;

/// The most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// The most connections served at once from one peer address.
pub const MAX_CONNECTIONS_PER_PEER: usize = 16;

/// What a connection is doing, in the order connections are displaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// Between requests: it owes nothing and is owed nothing.
    Idle,
    /// A request came in, in part or whole, and its answer has not started.
    Requesting,
}

/// One open connection, as [`displaced`] sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held<P> {
    /// Its peer's address.
    pub peer: P,
    /// What it is doing.
    pub phase: Phase,
    /// Idle: when it last moved a byte; requesting: when its request began.
    pub since: Instant,
}

/// Which of the `open` connections (by id, ids in the order they were
/// accepted) to close so that one more from `peer` fits the bounds; `None`
/// when it fits as it is.
pub(crate) fn displaced<P: Copy + Eq + Ord>(
    open: &BTreeMap<u64, Held<P>>,
    peer: P,
    per_peer: usize,
    total: usize,
) -> Option<u64> {
    let mut held_by: BTreeMap<P, usize> = BTreeMap::new();
    for held in open.values() {
        *held_by.entry(held.peer).or_default() += 1;
    }
    let from = if held_by.get(&peer).copied().unwrap_or(0) >= per_peer.max(1) {
        peer
    } else if open.len() >= total.max(1) {
        // Ties go to the lowest address: any rule would do, a fixed one
        // makes tests repeatable.
        let most = held_by.values().copied().max().unwrap_or(0);
        held_by.iter().find(|(_, count)| **count == most).map(|(peer, _)| *peer)?
    } else {
        return None;
    };
    open.iter()
        .filter(|(_, held)| held.peer == from)
        .min_by_key(|(id, held)| (held.phase, held.since, **id))
        .map(|(id, _)| *id)
}

/// Every open connection of the endpoint.
#[derive(Default)]
pub(crate) struct Slots {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    open: BTreeMap<u64, Entry>,
}

struct Entry {
    held: Held<IpAddr>,
    /// Wakes the connection's task, to close it when displaced.
    waker: Option<Waker>,
}

impl Slots {
    fn table(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock left plain numbers behind, still
        // usable.
        self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A slot for a connection accepted from `peer`, made room for by
    /// closing another if the bounds are reached.
    pub(crate) fn admit(self: &Arc<Self>, peer: IpAddr) -> Slot {
        let now = Instant::now();
        let mut table = self.table();
        let held: BTreeMap<u64, Held<IpAddr>> = table.open.iter().map(|(id, entry)| (*id, entry.held)).collect();
        if let Some(id) = displaced(&held, peer, MAX_CONNECTIONS_PER_PEER, MAX_CONNECTIONS)
            && let Some(entry) = table.open.remove(&id)
            && let Some(waker) = entry.waker
        {
            waker.wake();
        }
        let id = table.next_id;
        table.next_id += 1;
        table.open.insert(id, Entry { held: Held { peer, phase: Phase::Idle, since: now }, waker: None });
        Slot { id, slots: self.clone() }
    }

    /// How many connections hold a slot.
    #[cfg(test)]
    fn open(&self) -> usize {
        self.table().open.len()
    }
}

/// A connection's hold on a slot, given back when dropped.
pub(crate) struct Slot {
    id: u64,
    slots: Arc<Slots>,
}

impl Slot {
    /// Records that the connection moved bytes and is now in `phase` since
    /// `since`, and that `waker` wakes it; false when it was displaced and
    /// must close.
    pub(crate) fn record(&self, phase: Phase, since: Instant, waker: &Waker) -> bool {
        self.update(|entry| {
            entry.held.phase = phase;
            entry.held.since = since;
            Self::keep_waker(entry, waker);
        })
    }

    /// Records that `waker` wakes the connection, which waits; false when
    /// it was displaced and must close.
    pub(crate) fn wait(&self, waker: &Waker) -> bool {
        self.update(|entry| Self::keep_waker(entry, waker))
    }

    fn keep_waker(entry: &mut Entry, waker: &Waker) {
        if !entry.waker.as_ref().is_some_and(|kept| kept.will_wake(waker)) {
            entry.waker = Some(waker.clone());
        }
    }

    fn update(&self, change: impl FnOnce(&mut Entry)) -> bool {
        match self.slots.table().open.get_mut(&self.id) {
            Some(entry) => {
                change(entry);
                true
            }
            None => false,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.table().open.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn held(peer: u8, phase: Phase, at: u64, base: Instant) -> Held<u8> {
        Held { peer, phase, since: base + Duration::from_secs(at) }
    }

    #[test]
    fn a_newcomer_fits_until_a_bound_is_reached() {
        let base = Instant::now();
        let mut open = BTreeMap::new();
        for id in 0..3 {
            assert_eq!(displaced(&open, 1, 3, 5), None);
            open.insert(id, held(1, Phase::Idle, id, base));
        }
        assert_eq!(displaced(&open, 2, 3, 5), None, "another peer fits");
        assert_eq!(displaced(&open, 1, 3, 5), Some(0), "the peer's oldest idle connection goes");
    }

    #[test]
    fn the_idle_go_before_requests_under_way_and_the_oldest_first() {
        let base = Instant::now();
        let open = BTreeMap::from([
            (0, held(1, Phase::Requesting, 0, base)),
            (1, held(1, Phase::Idle, 5, base)),
            (2, held(1, Phase::Idle, 3, base)),
            (3, held(1, Phase::Requesting, 1, base)),
        ]);
        assert_eq!(displaced(&open, 1, 4, 10), Some(2));
        let requesting: BTreeMap<_, _> = open.into_iter().filter(|(_, h)| h.phase == Phase::Requesting).collect();
        assert_eq!(displaced(&requesting, 1, 2, 10), Some(0), "the request that began first");
    }

    #[test]
    fn at_the_total_the_peer_holding_most_makes_room_not_the_newcomer_or_the_few() {
        let base = Instant::now();
        let mut open = BTreeMap::new();
        // Peer 1 holds 4 (its requests under way), peer 2 one idle since long.
        for id in 0..4 {
            open.insert(id, held(1, Phase::Requesting, 10 + id, base));
        }
        open.insert(4, held(2, Phase::Idle, 0, base));
        assert_eq!(displaced(&open, 3, 10, 5), Some(0), "the crowd's own, though another's is older and idle");
        assert_eq!(displaced(&open, 2, 10, 5), Some(0));
    }

    /// Every way of filling the slots, from three peers in either phase:
    /// after admitting a newcomer (closing what [`displaced`] names), no
    /// bound is exceeded, the newcomer is in, and only the newcomer's peer
    /// or the busiest peer lost a connection.
    #[test]
    fn every_admission_keeps_both_bounds() {
        let base = Instant::now();
        let (per_peer, total) = (3, 5);
        // Each open connection: peer 0..3, phase, age 0..2.
        let shapes: Vec<(u8, Phase, u64)> = (0..3)
            .flat_map(|peer| [Phase::Idle, Phase::Requesting].map(|phase| (peer, phase)))
            .flat_map(|(peer, phase)| (0..2).map(move |age| (peer, phase, age)))
            .collect();
        let mut checked = 0;
        let mut stack: Vec<Vec<usize>> = vec![vec![]];
        while let Some(choice) = stack.pop() {
            let open: BTreeMap<u64, Held<u8>> = choice
                .iter()
                .enumerate()
                .map(|(id, &shape)| (id as u64, held(shapes[shape].0, shapes[shape].1, shapes[shape].2, base)))
                .collect();
            let fits = |open: &BTreeMap<u64, Held<u8>>| {
                open.len() <= total && (0..3).all(|p| open.values().filter(|h| h.peer == p).count() <= per_peer)
            };
            if !fits(&open) {
                continue;
            }
            for newcomer in 0..3 {
                let mut after = open.clone();
                let gone = displaced(&open, newcomer, per_peer, total).map(|id| after.remove(&id).unwrap());
                after.insert(u64::MAX, held(newcomer, Phase::Idle, 9, base));
                assert!(fits(&after), "{open:?} + peer {newcomer}");
                if let Some(gone) = gone {
                    let most = (0..3).map(|p| open.values().filter(|h| h.peer == p).count()).max().unwrap();
                    let count = open.values().filter(|h| h.peer == gone.peer).count();
                    assert!(gone.peer == newcomer || count == most, "{open:?} + peer {newcomer}: {gone:?}");
                }
                checked += 1;
            }
            if choice.len() < total {
                // Ascending choices: each multiset of shapes once.
                for next in choice.last().copied().unwrap_or(0)..shapes.len() {
                    let mut grown = choice.clone();
                    grown.push(next);
                    stack.push(grown);
                }
            }
        }
        assert!(checked > 1_000, "{checked}");
    }

    #[tokio::test]
    async fn a_displaced_connection_is_woken_and_told_to_close() {
        struct Woken(std::sync::atomic::AtomicBool);
        impl std::task::Wake for Woken {
            fn wake(self: Arc<Self>) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let slots = Arc::new(Slots::default());
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let woken = Arc::new(Woken(false.into()));
        let waker = Waker::from(woken.clone());
        let first = slots.admit(peer);
        assert!(first.wait(&waker));
        let rest: Vec<Slot> = (1..MAX_CONNECTIONS_PER_PEER).map(|_| slots.admit(peer)).collect();
        assert!(!woken.0.load(std::sync::atomic::Ordering::SeqCst));
        let newcomer = slots.admit(peer);
        assert!(woken.0.load(std::sync::atomic::Ordering::SeqCst), "the oldest idle one was woken");
        assert!(!first.wait(&waker), "and told to close");
        assert_eq!(slots.open(), MAX_CONNECTIONS_PER_PEER);
        drop((first, rest, newcomer));
        assert_eq!(slots.open(), 0);
    }
}
