//! The admin endpoint's connection slots: how many connections are open,
//! from whom, and which ones close when a newcomer comes, so that
//! `/health` and `/ready` answer whoever else holds connections.
//!
//! Keep-alive clients that sent a request now and then, and clients that
//! sent a request a byte at a time, took every connection the endpoint
//! served, and a probe then waited in the kernel's queue until one left.
//! A bound alone cannot help (whoever holds the slots keeps them), so a
//! newcomer is never made to wait: it is admitted at once, and connections
//! that wait for their clients make room. But a crowd that is closed comes
//! straight back, and each of its returns made room again: a probe's fresh
//! connection, the newest idle one, was closed before its request was
//! read. So a connection's first request is protected while it is young.
//!
//! Rules kept here:
//! - A connection is a **newcomer** from its acceptance until its first
//!   answer starts or [`NEWCOMER_GRACE`] has passed, whichever is first;
//!   after that it is **settled**. The two are counted apart, each under
//!   the same bounds: at most [`MAX_CONNECTIONS`] in all and at most
//!   [`MAX_CONNECTIONS_PER_PEER`] from one peer address (its IP; the port
//!   is not part of it). So at most twice those are open at once.
//! - A newcomer is always admitted. When a class is over a bound, one of
//!   its connections is closed ([`closed_for`]), again until both classes
//!   are within both bounds: one of the peer's that is over its bound,
//!   else one of the peer holding the most in that class (ties: the lowest
//!   address). So a crowd from one address closes its own connections
//!   first, and a probe or a scraper from another address keeps its own.
//! - A newcomer is closed only to admit another newcomer, and then the one
//!   accepted first (the newest, a probe that just connected, goes last).
//!   Connections that finish a request at once (a probe, a keep-alive
//!   client coming back) stay newcomers for milliseconds, so the class
//!   fills only with clients slower than the grace, at most the bound
//!   per [`NEWCOMER_GRACE`] from one address.
//! - Among settled connections: an idle one (no request read but
//!   unanswered) before one whose request is being read or answered; among
//!   idle ones the one that moved no byte for the longest; among the
//!   others the one whose request began first. A request under way is
//!   closed only when every connection that could make room has one.
//! - The newcomer being admitted is never the one closed.
//! - A closed connection is closed at once: its task is woken and its next
//!   read or write fails, as an idle keep-alive connection closed by its
//!   timeout does (HTTP clients send again on a new connection).
//! - The timeouts are the connection's own ([`super::IDLE_TIMEOUT`],
//!   [`super::REQUEST_DEADLINE`]); making room is what keeps the endpoint
//!   answerable within them.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

/// The most settled connections served at once (and, apart, the most
/// newcomers).
pub const MAX_CONNECTIONS: usize = 64;

/// The most settled connections served at once from one peer address
/// (and, apart, the most newcomers from one).
pub const MAX_CONNECTIONS_PER_PEER: usize = 16;

/// How long a connection not yet answered is a newcomer: long enough for
/// a probe on a busy machine to send its request and have it answered,
/// short enough that slow clients leave the class soon.
pub const NEWCOMER_GRACE: Duration = Duration::from_secs(2);

/// What a connection is doing, in the order settled connections are
/// closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// Between requests: it owes nothing and is owed nothing.
    Idle,
    /// A request came in, in part or whole, and its answer has not started.
    Requesting,
}

/// One open connection, as [`closed_for`] sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held<P> {
    /// Its peer's address.
    pub peer: P,
    /// What it is doing.
    pub phase: Phase,
    /// Idle: when it last moved a byte; requesting: when its request began.
    pub since: Instant,
    /// When it was accepted.
    pub accepted: Instant,
    /// Whether an answer to it has started.
    pub answered: bool,
}

impl<P> Held<P> {
    /// Whether it is a newcomer at `now`.
    fn newcomer(&self, now: Instant) -> bool {
        !self.answered && now < self.accepted + NEWCOMER_GRACE
    }
}

/// How many connections each class may hold, in all and from one peer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub per_peer: usize,
    pub total: usize,
}

/// Which of the `open` connections (by id, ids in the order they were
/// accepted) to close, in order, so that both classes are within `bounds`
/// at `now`; `admitted`, the newcomer just added to `open`, is never one
/// of them.
pub(crate) fn closed_for<P: Copy + Ord>(
    open: &BTreeMap<u64, Held<P>>,
    admitted: u64,
    now: Instant,
    bounds: Bounds,
) -> Vec<u64> {
    let mut left = open.clone();
    let mut closed = Vec::new();
    for newcomers in [true, false] {
        loop {
            let class: BTreeMap<u64, Held<P>> = left
                .iter()
                .filter(|(_, held)| held.newcomer(now) == newcomers)
                .map(|(id, held)| (*id, *held))
                .collect();
            let Some(id) = over_bound(&class, newcomers, admitted, bounds) else { break };
            left.remove(&id);
            closed.push(id);
        }
    }
    closed
}

/// One connection of `class` (newcomers or settled ones) to close because
/// it is over `bounds`, never `admitted`; `None` when it is within them.
fn over_bound<P: Copy + Ord>(
    class: &BTreeMap<u64, Held<P>>,
    newcomers: bool,
    admitted: u64,
    bounds: Bounds,
) -> Option<u64> {
    let mut held_by: BTreeMap<P, usize> = BTreeMap::new();
    for held in class.values() {
        *held_by.entry(held.peer).or_default() += 1;
    }
    // Most held first, ties to the lowest address: any rule would do, a
    // fixed one makes tests repeatable.
    let mut peers: Vec<(P, usize)> = held_by.into_iter().collect();
    peers.sort_by_key(|(peer, count)| (std::cmp::Reverse(*count), *peer));
    let over_peer = peers.first().is_some_and(|(_, count)| *count > bounds.per_peer.max(1));
    if !over_peer && class.len() <= bounds.total.max(1) {
        return None;
    }
    // The peer over its bound holds the most; at the total, the peer
    // holding the most that has one to give (the admitted one is not).
    peers.into_iter().find_map(|(peer, _)| {
        let candidates = class.iter().filter(|(id, held)| held.peer == peer && **id != admitted);
        let chosen = if newcomers {
            candidates.min_by_key(|(id, held)| (held.accepted, **id))
        } else {
            candidates.min_by_key(|(id, held)| (held.phase, held.since, **id))
        };
        chosen.map(|(id, _)| *id)
    })
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
    /// Wakes the connection's task, to close it when another takes its
    /// place.
    waker: Option<Waker>,
}

impl Slots {
    fn table(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock left plain numbers behind, still
        // usable.
        self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A slot for a connection accepted from `peer`, made room for by
    /// closing others if the bounds are reached.
    pub(crate) fn admit(self: &Arc<Self>, peer: IpAddr) -> Slot {
        let now = Instant::now();
        let mut table = self.table();
        let id = table.next_id;
        table.next_id += 1;
        let held = Held { peer, phase: Phase::Idle, since: now, accepted: now, answered: false };
        table.open.insert(id, Entry { held, waker: None });
        let open: BTreeMap<u64, Held<IpAddr>> = table.open.iter().map(|(id, entry)| (*id, entry.held)).collect();
        let bounds = Bounds { per_peer: MAX_CONNECTIONS_PER_PEER, total: MAX_CONNECTIONS };
        for closed in closed_for(&open, id, now, bounds) {
            if let Some(waker) = table.open.remove(&closed).and_then(|entry| entry.waker) {
                waker.wake();
            }
        }
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
    /// `since`, that an answer started when `answered`, and that `waker`
    /// wakes it; false when it was closed to make room.
    pub(crate) fn record(&self, phase: Phase, since: Instant, answered: bool, waker: &Waker) -> bool {
        self.update(|entry| {
            entry.held.phase = phase;
            entry.held.since = since;
            entry.held.answered |= answered;
            Self::keep_waker(entry, waker);
        })
    }

    /// Records that `waker` wakes the connection, which waits; false when
    /// it was closed to make room.
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

    const BOUNDS: Bounds = Bounds { per_peer: 3, total: 5 };

    /// A settled connection of `peer` (answered once), in `phase` since
    /// `at` seconds after `base`, accepted well before.
    fn settled(peer: u8, phase: Phase, at: u64, base: Instant) -> Held<u8> {
        Held { peer, phase, since: base + Duration::from_secs(at), accepted: base, answered: true }
    }

    /// A newcomer of `peer` accepted `at` milliseconds after `base`, its
    /// request under way when `requesting`.
    fn newcomer(peer: u8, at: u64, requesting: bool, base: Instant) -> Held<u8> {
        let accepted = base + Duration::from_millis(at);
        let phase = if requesting { Phase::Requesting } else { Phase::Idle };
        Held { peer, phase, since: accepted, accepted, answered: false }
    }

    /// What admitting a newcomer of `peer` at `now` to `open` closes.
    fn admit(open: &mut BTreeMap<u64, Held<u8>>, peer: u8, now: Instant, bounds: Bounds) -> Vec<u64> {
        let id = open.keys().last().map_or(0, |last| last + 1);
        open.insert(id, Held { peer, phase: Phase::Idle, since: now, accepted: now, answered: false });
        let closed = closed_for(open, id, now, bounds);
        for id in &closed {
            open.remove(id);
        }
        closed
    }

    #[test]
    fn a_newcomer_fits_until_a_bound_is_reached() {
        let base = Instant::now();
        let now = base + Duration::from_secs(60);
        let mut open = BTreeMap::new();
        for id in 0..3 {
            open.insert(id, settled(1, Phase::Idle, id, base));
        }
        assert_eq!(admit(&mut open, 2, now, BOUNDS), Vec::<u64>::new(), "another peer fits");
        assert_eq!(admit(&mut open, 1, now, BOUNDS), Vec::<u64>::new(), "newcomers are counted apart");
        // The two newcomers settle (answered); the next admission puts
        // peer 1 back within its bound, its longest idle one closed.
        for held in open.values_mut() {
            held.answered = true;
        }
        assert_eq!(admit(&mut open, 3, now, BOUNDS), vec![0]);
    }

    #[test]
    fn settled_idle_ones_go_before_requests_under_way_and_the_oldest_first() {
        let base = Instant::now();
        let now = base + Duration::from_secs(60);
        let mut open = BTreeMap::from([
            (0, settled(1, Phase::Requesting, 0, base)),
            (1, settled(1, Phase::Idle, 5, base)),
            (2, settled(1, Phase::Idle, 3, base)),
            (3, settled(1, Phase::Requesting, 1, base)),
        ]);
        let bounds = Bounds { per_peer: 3, total: 10 };
        assert_eq!(closed_for(&open, u64::MAX, now, bounds), vec![2]);
        open.remove(&1);
        open.remove(&2);
        let bounds = Bounds { per_peer: 1, total: 10 };
        assert_eq!(closed_for(&open, u64::MAX, now, bounds), vec![0], "the request that began first");
    }

    /// The probe's case: a crowd of one address holds every settled slot
    /// and comes straight back when closed. Its returns close settled
    /// ones, never the probe's fresh connection, which waits for its
    /// answer however many come back meanwhile.
    #[test]
    fn a_fresh_connection_outlives_any_number_of_returns_within_its_grace() {
        let base = Instant::now();
        let mut open: BTreeMap<u64, Held<u8>> = (0..3).map(|id| (id, settled(1, Phase::Idle, id, base))).collect();
        let now = base + Duration::from_secs(60);
        assert!(admit(&mut open, 1, now, BOUNDS).is_empty());
        let probe = *open.keys().last().unwrap();
        for turn in 0..1_000 {
            let now = now + Duration::from_micros(turn);
            // The one that came back is answered at once and settles.
            let closed = admit(&mut open, 1, now, BOUNDS);
            assert!(!closed.contains(&probe), "turn {turn}: {closed:?}");
            let back = *open.keys().last().unwrap();
            open.get_mut(&back).unwrap().answered = true;
            assert!(open.contains_key(&probe));
        }
        // Past its grace, unanswered, it is a slow client like any other:
        // settled, and idle the longest, it goes first (with the last one
        // back, which settled after the last admission).
        let late = now + NEWCOMER_GRACE;
        assert_eq!(admit(&mut open, 1, late, BOUNDS).first(), Some(&probe));
    }

    #[test]
    fn newcomers_over_the_bound_close_the_one_accepted_first() {
        let base = Instant::now();
        let mut open: BTreeMap<u64, Held<u8>> =
            [(0, newcomer(1, 5, true, base)), (1, newcomer(1, 1, false, base)), (2, newcomer(1, 3, true, base))].into();
        let now = base + Duration::from_millis(10);
        assert_eq!(admit(&mut open, 1, now, BOUNDS), vec![1]);
    }

    #[test]
    fn at_the_total_the_peer_holding_most_makes_room_not_the_newcomer_or_the_few() {
        let base = Instant::now();
        let now = base + Duration::from_secs(60);
        let bounds = Bounds { per_peer: 10, total: 5 };
        // Peer 1 holds 4 (its requests under way), peer 2 one idle since
        // long, and a newcomer of peer 3 settled unanswered (past its
        // grace), making 6.
        let mut open: BTreeMap<u64, Held<u8>> =
            (0..4).map(|id| (id, settled(1, Phase::Requesting, 10 + id, base))).collect();
        open.insert(4, settled(2, Phase::Idle, 0, base));
        open.insert(5, newcomer(3, 0, true, base));
        assert_eq!(closed_for(&open, u64::MAX, now, bounds), vec![0], "the crowd's own, though others are older");
        // A newcomer alone at the total, every peer holding one: not it.
        let many: BTreeMap<u64, Held<u8>> = (0..6).map(|id| (id, newcomer(id as u8, id, false, now))).collect();
        let closed = closed_for(&many, 0, now + Duration::from_millis(10), bounds);
        assert_eq!(closed, vec![1], "the lowest address that is not the admitted one");
    }

    /// Every way of filling the slots, from three peers, settled (in
    /// either phase) or newcomers: after admitting a newcomer, closing
    /// what [`closed_for`] names, both classes are within both bounds, the
    /// newcomer is in, only the newcomer's peer or a busiest peer of the
    /// class lost a connection, and no newcomer was closed unless the
    /// newcomers were over a bound.
    #[test]
    fn every_admission_keeps_both_bounds() {
        let base = Instant::now();
        let now = base + Duration::from_secs(60);
        let (per_peer, total) = (2, 3);
        let bounds = Bounds { per_peer, total };
        // Each open connection: peer 0..3, and settled idle, settled
        // requesting, or a newcomer; two ages each.
        let shapes: Vec<Held<u8>> = (0..3u8)
            .flat_map(|peer| {
                (0..2).flat_map(move |age| {
                    [
                        settled(peer, Phase::Idle, age, base),
                        settled(peer, Phase::Requesting, age, base),
                        newcomer(peer, 60_000 - 10 + age, false, base),
                    ]
                })
            })
            .collect();
        let within = |open: &BTreeMap<u64, Held<u8>>, newcomers: bool| {
            let class: Vec<&Held<u8>> = open.values().filter(|held| held.newcomer(now) == newcomers).collect();
            class.len() <= total && (0..3).all(|p| class.iter().filter(|held| held.peer == p).count() <= per_peer)
        };
        let mut checked = 0;
        let mut stack: Vec<Vec<usize>> = vec![vec![]];
        while let Some(choice) = stack.pop() {
            let open: BTreeMap<u64, Held<u8>> =
                choice.iter().enumerate().map(|(id, &shape)| (id as u64, shapes[shape])).collect();
            if !within(&open, true) || !within(&open, false) {
                continue;
            }
            for peer in 0..3 {
                let mut after = open.clone();
                let closed = admit(&mut after, peer, now, bounds);
                let admitted = open.len() as u64;
                assert!(within(&after, true) && within(&after, false), "{open:?} + peer {peer}");
                assert!(after.contains_key(&admitted), "{open:?} + peer {peer}");
                for id in &closed {
                    let gone = open[id];
                    let class = |held: &&Held<u8>| held.newcomer(now) == gone.newcomer(now);
                    let most = (0..3).map(|p| open.values().filter(class).filter(|h| h.peer == p).count()).max();
                    let count = open.values().filter(class).filter(|h| h.peer == gone.peer).count();
                    assert!(gone.peer == peer || Some(count) == most, "{open:?} + peer {peer}: {gone:?}");
                }
                checked += 1;
            }
            if choice.len() < 2 * total {
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
    async fn a_closed_connection_is_woken_and_told_to_close() {
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
        assert!(first.record(Phase::Idle, Instant::now(), true, &waker));
        let rest: Vec<Slot> = (1..MAX_CONNECTIONS_PER_PEER)
            .map(|_| {
                let slot = slots.admit(peer);
                assert!(slot.record(Phase::Idle, Instant::now(), true, &waker));
                slot
            })
            .collect();
        assert!(!woken.0.load(std::sync::atomic::Ordering::SeqCst));
        // A newcomer fits beside them; once answered, it settles and the
        // next admission closes the oldest idle one.
        let newcomer = slots.admit(peer);
        assert!(newcomer.record(Phase::Idle, Instant::now(), true, &waker));
        assert!(!woken.0.load(std::sync::atomic::Ordering::SeqCst));
        let next = slots.admit(peer);
        assert!(woken.0.load(std::sync::atomic::Ordering::SeqCst), "the oldest idle one was woken");
        assert!(!first.wait(&waker), "and told to close");
        assert_eq!(slots.open(), MAX_CONNECTIONS_PER_PEER + 1);
        drop((first, rest, newcomer, next));
        assert_eq!(slots.open(), 0);
    }
}
