//! Where a value a handler reads comes from when the state is across a
//! network: the batch's keys read in one query, and the keys a host owns
//! kept in memory between batches.
//!
//! A handler's `state.get` is served by the batch's [`StateReader`](super::StateReader). On a
//! backend that costs a round trip per query (PostgreSQL), the reader of a
//! batch is a [`BatchSnapshot`] over the entries of every key of the batch,
//! all names, taken before the first call ([`StateBackend::batch_reader`](super::StateBackend::batch_reader)):
//! from the [`StateCache`] for the keys it holds, and for the others with
//! one query bound to an array of keys. A get, a `contains` and an entry
//! count of a loaded key then never leave memory; a counter is read at
//! most once per batch (the snapshot is one transaction, so its value
//! cannot change within the batch).
//!
//! Rules kept here:
//! - **Only a fenced owner caches.** A key is cached under the partition
//!   whose batch read it and the epoch the store [claimed](super::StateBackend::claim)
//!   that partition with, and only for a claimed partition: fencing makes
//!   the claimant the only host that can commit to it. A cached key serves
//!   a batch of that same partition and epoch only.
//! - **Checked at every batch.** The snapshot a batch reads from also reads
//!   the partition's epoch (same transaction, same round trip). If another
//!   host claimed the partition since, the partition's cache is dropped
//!   before anything of it is served, and the batch reads from the database
//!   (its commit will be fenced anyway). So a value another host committed
//!   after this one lost the partition is never served: it can only have
//!   been committed after that claim, which the check sees.
//! - **Dropped when the partition goes.** A claim (a new epoch) and a
//!   release ([`StateBackend::release`](super::StateBackend::release), when the host stops consuming a
//!   partition) drop the partition's keys.
//! - **Written through at the commit, only once it succeeded.** A commit
//!   takes the keys it writes out of the cache before it starts; if it
//!   succeeds, the keys cached under the committing partition (the one its
//!   positions name) go back with the commit's writes applied, the others
//!   stay out. A commit that fails (fenced, or a lost connection that may
//!   or may not have committed) puts nothing back, so the next batch reads
//!   those keys from the database.
//! - **No fill races a write.** A fill whose query started before a
//!   commit wrote a key it loads (another partition's commit, for a key
//!   whose records a publisher put in two partitions) skips that key: the
//!   cache remembers the keys written outside their cached partition since
//!   the oldest fill in progress began, up to a bound past which such fills
//!   keep nothing.
//! - **Bounded.** The cache holds at most its capacity (`--state-cache-mib`,
//!   [`DEFAULT_CACHE_BYTES`]), counting keys, names, values and a fixed
//!   overhead per entry; past it, the keys not used for longest go, down to
//!   three quarters of it. A batch loads at most the capacity too: the keys
//!   past that bound are not loaded and read one query at a time, as they
//!   were before this cache.
//!
//! A key's records all live in its partition ([`crate::storage::log`]), so on one
//! host the partition that reads a key is the one that writes it. A key
//! whose records a publisher put in partitions owned by two hosts is read
//! from this cache by the one while the other writes it: its state was
//! already subject to lost updates between the two, and the cache does not
//! see the other host's writes until its partition moves.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use super::{KeyWrites, Snapshot, StateError};
use crate::key::Key;
use wakuwaku_core::timers::Timer;

/// The cache's capacity unless set: 64 MiB, which holds about 300 000 keys
/// of one small JSON entry each.
pub const DEFAULT_CACHE_BYTES: usize = 64 << 20;

/// What an entry costs beyond its name and value bytes (map node, vector
/// headers), as the cache counts it.
const ENTRY_OVERHEAD: usize = 64;

/// What a cached key costs beyond its bytes and entries.
const KEY_OVERHEAD: usize = 96;

/// The most keys written outside their cached partition the cache
/// remembers for the fills in progress ([`StateCache::begin_fill`]).
const WRITES_REMEMBERED: usize = 4096;

/// Every entry of one key, by name.
pub type KeyEntries = BTreeMap<String, Vec<u8>>;

/// What one key's entries cost in the cache.
fn cost(key: &Key, entries: &KeyEntries) -> usize {
    let values: usize = entries.iter().map(|(name, value)| name.len() + value.len() + ENTRY_OVERHEAD).sum();
    key.as_bytes().len() + KEY_OVERHEAD + values
}

/// The entries of the keys a host owns, kept between batches; see the
/// [module docs](self) for when a value may be served from it.
#[derive(Debug)]
pub struct StateCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    keys: HashMap<Key, Cached>,
    /// What `keys` holds, as [`cost`] counts it.
    bytes: usize,
    /// Advances at every use, so that eviction finds the keys not used for
    /// longest.
    tick: u64,
    /// Keys a commit is writing right now, with how many commits do.
    writing: HashMap<Key, u32>,
    /// Advances at every commit that wrote keys outside their cached
    /// partition; a fill notes it when it begins.
    writes_seen: u64,
    /// The keys those commits wrote, with the value of `writes_seen` after
    /// them, kept while a fill that began before them is in progress.
    written: VecDeque<(u64, Key)>,
    /// The `writes_seen` below which `written` forgot keys (it is bounded):
    /// a fill that began before it keeps nothing.
    forgotten_below: u64,
    /// The `writes_seen` each fill in progress began at, by fill.
    fills: HashMap<u64, u64>,
    next_fill: u64,
}

#[derive(Debug)]
struct Cached {
    partition: u32,
    epoch: i64,
    entries: Arc<KeyEntries>,
    bytes: usize,
    used: u64,
}

/// A fill in progress ([`StateCache::begin_fill`]): what a batch's query
/// loads goes into the cache through it, unless a write raced it.
#[derive(Debug)]
#[must_use = "a fill ends with `StateCache::end_fill`"]
pub struct Fill {
    id: u64,
    began_at: u64,
}

/// The keys a commit took out of the cache ([`StateCache::begin_write`]),
/// to put back once it is known to have succeeded.
#[derive(Debug)]
#[must_use = "a write ends with `StateCache::end_write`"]
pub struct TakenOut {
    keys: HashMap<Key, Option<Cached>>,
}

impl TakenOut {
    /// Whether `key` was cached when the commit took it out.
    pub fn was_cached(&self, key: &Key) -> bool {
        self.keys.get(key).is_some_and(Option::is_some)
    }
}

impl StateCache {
    /// An empty cache holding at most `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        Self { capacity, inner: Mutex::default() }
    }

    /// The most a batch loads and the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What the cache holds, in bytes as it counts them, and in keys.
    pub fn held(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.bytes, inner.keys.len())
    }

    /// Splits `keys` into those cached under `partition` at `epoch`, with
    /// their entries, and the others, in order.
    pub fn lookup(&self, partition: u32, epoch: i64, keys: &[Key]) -> (HashMap<Key, Arc<KeyEntries>>, Vec<Key>) {
        let mut inner = self.lock();
        inner.tick += 1;
        let tick = inner.tick;
        let mut hits = HashMap::new();
        let mut misses = Vec::new();
        for key in keys {
            match inner.keys.get_mut(key) {
                Some(cached) if cached.partition == partition && cached.epoch == epoch => {
                    cached.used = tick;
                    hits.insert(key.clone(), cached.entries.clone());
                }
                _ => misses.push(key.clone()),
            }
        }
        (hits, misses)
    }

    /// Notes that a query for keys is about to start; its results go in
    /// through [`StateCache::end_fill`].
    pub fn begin_fill(&self) -> Fill {
        let mut inner = self.lock();
        let (id, began_at) = (inner.next_fill, inner.writes_seen);
        inner.next_fill += 1;
        inner.fills.insert(id, began_at);
        Fill { id, began_at }
    }

    /// Ends `fill`: caches `loaded` under `partition` at `epoch` (`None`:
    /// the partition is not held, keep nothing), but no key a commit is
    /// writing or wrote outside its cached partition since the fill began,
    /// nor a key larger than an eighth of the capacity.
    pub fn end_fill(&self, fill: Fill, held: Option<(u32, i64)>, loaded: &HashMap<Key, Arc<KeyEntries>>) {
        let mut inner = self.lock();
        inner.fills.remove(&fill.id);
        if let Some((partition, epoch)) = held
            && fill.began_at >= inner.forgotten_below
        {
            let raced: HashSet<Key> =
                inner.written.iter().filter(|(at, _)| *at > fill.began_at).map(|(_, key)| key.clone()).collect();
            inner.tick += 1;
            let tick = inner.tick;
            for (key, entries) in loaded {
                if raced.contains(key) || inner.writing.contains_key(key) {
                    continue;
                }
                let bytes = cost(key, entries);
                if bytes > self.capacity / 8 {
                    continue;
                }
                let cached = Cached { partition, epoch, entries: entries.clone(), bytes, used: tick };
                inner.insert(key.clone(), cached);
            }
            inner.evict(self.capacity);
        }
        inner.forget_writes();
    }

    /// Drops every key cached under `partition`.
    pub fn drop_partition(&self, partition: u32) {
        let mut inner = self.lock();
        let before = inner.keys.len();
        inner.keys.retain(|_, cached| cached.partition != partition);
        if inner.keys.len() != before {
            inner.bytes = inner.keys.values().map(|cached| cached.bytes).sum();
        }
    }

    /// Takes `keys` (those a commit writes) out of the cache before the
    /// commit starts.
    pub fn begin_write<'a>(&self, keys: impl IntoIterator<Item = &'a Key>) -> TakenOut {
        let mut inner = self.lock();
        let mut taken = HashMap::new();
        for key in keys {
            if taken.contains_key(key) {
                continue;
            }
            *inner.writing.entry(key.clone()).or_default() += 1;
            let cached = inner.remove(key);
            taken.insert(key.clone(), cached);
        }
        TakenOut { keys: taken }
    }

    /// Ends a commit that [took `taken` out](StateCache::begin_write).
    /// When it `committed`, as the partition and epoch it was fenced by
    /// (the one its positions name), the keys cached under that partition
    /// and epoch go back with `writes` applied; the others stay out, and
    /// fills that began before are told they were written.
    pub fn end_write(&self, taken: TakenOut, committed: Option<(u32, i64)>, writes: &[(Key, KeyWrites)]) {
        let by_key: HashMap<&Key, Vec<&KeyWrites>> = writes.iter().fold(HashMap::new(), |mut map, (key, w)| {
            map.entry(key).or_insert_with(Vec::new).push(w);
            map
        });
        let mut inner = self.lock();
        let mut outside = Vec::new();
        for (key, cached) in taken.keys {
            let writing = inner.writing.get_mut(&key).map(|count| {
                *count -= 1;
                *count
            });
            if writing == Some(0) {
                inner.writing.remove(&key);
            }
            let back = match (committed, cached) {
                (Some((partition, epoch)), Some(cached))
                    if cached.partition == partition && cached.epoch == epoch && writing == Some(0) =>
                {
                    Some(cached)
                }
                _ => None,
            };
            match back {
                Some(mut cached) => {
                    let entries = Arc::make_mut(&mut cached.entries);
                    for key_writes in by_key.get(&key).into_iter().flatten() {
                        for (name, value) in key_writes.iter() {
                            match value {
                                Some(value) => entries.insert(name.to_owned(), value.to_vec()),
                                None => entries.remove(name),
                            };
                        }
                    }
                    cached.bytes = cost(&key, &cached.entries);
                    inner.tick += 1;
                    cached.used = inner.tick;
                    if cached.bytes <= self.capacity / 8 {
                        inner.insert(key, cached);
                    }
                }
                None => outside.push(key),
            }
        }
        if !outside.is_empty() && !inner.fills.is_empty() {
            inner.writes_seen += 1;
            let at = inner.writes_seen;
            inner.written.extend(outside.into_iter().map(|key| (at, key)));
            while inner.written.len() > WRITES_REMEMBERED {
                if let Some((at, _)) = inner.written.pop_front() {
                    inner.forgotten_below = inner.forgotten_below.max(at);
                }
            }
        }
        inner.evict(self.capacity);
    }
}

impl Inner {
    fn insert(&mut self, key: Key, cached: Cached) {
        self.bytes += cached.bytes;
        if let Some(old) = self.keys.insert(key, cached) {
            self.bytes -= old.bytes;
        }
    }

    fn remove(&mut self, key: &Key) -> Option<Cached> {
        let cached = self.keys.remove(key)?;
        self.bytes -= cached.bytes;
        Some(cached)
    }

    /// Past `capacity`, drops the keys used longest ago until three
    /// quarters of it are left (so the sort is paid once per quarter of
    /// the capacity filled, not at every insert).
    fn evict(&mut self, capacity: usize) {
        if self.bytes <= capacity {
            return;
        }
        let mut by_use: Vec<(u64, Key)> = self.keys.iter().map(|(key, cached)| (cached.used, key.clone())).collect();
        by_use.sort_unstable_by_key(|(used, _)| *used);
        let target = capacity / 4 * 3;
        for (_, key) in by_use {
            if self.bytes <= target {
                break;
            }
            self.remove(&key);
        }
    }

    /// Forgets the writes no fill in progress began before.
    fn forget_writes(&mut self) {
        let oldest = self.fills.values().copied().min();
        match oldest {
            None => self.written.clear(),
            Some(oldest) => {
                while self.written.front().is_some_and(|(at, _)| *at <= oldest) {
                    self.written.pop_front();
                }
            }
        }
    }
}

/// A batch's read snapshot over entries loaded before the batch: the keys
/// in `loaded` are served from memory (every entry of each), the others by
/// the backend's snapshot `rest`, and each counter is read from `rest` at
/// most once.
pub struct BatchSnapshot {
    loaded: HashMap<Key, Arc<KeyEntries>>,
    rest: Box<dyn Snapshot>,
    counters: Mutex<HashMap<String, Option<i128>>>,
}

impl BatchSnapshot {
    /// A snapshot serving `loaded` (each key with all of its entries, as
    /// `rest` sees them) and everything else from `rest`.
    pub fn new(loaded: HashMap<Key, Arc<KeyEntries>>, rest: impl Snapshot + 'static) -> Self {
        Self { loaded, rest: Box::new(rest), counters: Mutex::default() }
    }
}

impl Snapshot for BatchSnapshot {
    fn get(&self, key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        match self.loaded.get(key) {
            Some(entries) => Ok(entries.get(name).cloned()),
            None => self.rest.get(key, name),
        }
    }

    fn contains(&self, key: &Key, name: &str) -> Result<bool, StateError> {
        match self.loaded.get(key) {
            Some(entries) => Ok(entries.contains_key(name)),
            None => self.rest.contains(key, name),
        }
    }

    fn entry_count(&self, key: &Key, at_most: usize) -> Result<usize, StateError> {
        match self.loaded.get(key) {
            Some(entries) => Ok(entries.len().min(at_most)),
            None => self.rest.entry_count(key, at_most),
        }
    }

    fn counter(&self, name: &str) -> Result<Option<i128>, StateError> {
        if let Some(value) = self.counters.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(name) {
            return Ok(*value);
        }
        let value = self.rest.counter(name)?;
        let mut counters = self.counters.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // Names are the module's: bounded by the batch's calls, which the
        // batch budget bounds.
        counters.insert(name.to_owned(), value);
        Ok(value)
    }

    fn counter_count(&self, at_most: usize) -> Result<usize, StateError> {
        self.rest.counter_count(at_most)
    }

    /// Read from the backend's snapshot: only keys whose calls use timers
    /// ask, once per batch each.
    fn timers(&self, key: &Key) -> Result<Vec<Timer>, StateError> {
        self.rest.timers(key)
    }

    fn timer_count(&self, at_most: usize) -> Result<usize, StateError> {
        self.rest.timer_count(at_most)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(pairs: &[(&str, &str)]) -> Arc<KeyEntries> {
        Arc::new(pairs.iter().map(|(name, value)| (name.to_string(), value.as_bytes().to_vec())).collect())
    }

    fn fill(cache: &StateCache, held: (u32, i64), keys: &[(u64, Arc<KeyEntries>)]) {
        let fill = cache.begin_fill();
        let loaded = keys.iter().map(|(key, entries)| (Key::int(*key), entries.clone())).collect();
        cache.end_fill(fill, Some(held), &loaded);
    }

    fn write(name: &str, value: &str) -> KeyWrites {
        let mut writes = KeyWrites::default();
        writes.set(name, value.as_bytes().to_vec());
        writes
    }

    #[test]
    fn a_key_serves_only_its_partition_and_epoch() {
        let cache = StateCache::new(1 << 20);
        fill(&cache, (3, 7), &[(1, entries(&[("v", "a")]))]);
        let keys = [Key::int(1)];
        assert_eq!(cache.lookup(3, 7, &keys).0.len(), 1);
        assert_eq!(cache.lookup(3, 8, &keys).1, keys);
        assert_eq!(cache.lookup(4, 7, &keys).1, keys);
        cache.drop_partition(3);
        assert_eq!(cache.lookup(3, 7, &keys).1, keys);
        assert_eq!(cache.held(), (0, 0));
    }

    #[test]
    fn a_commit_writes_through_only_when_it_succeeded_under_the_key_s_partition() {
        let cache = StateCache::new(1 << 20);
        let keys = [Key::int(1)];
        let writes = vec![(Key::int(1), write("v", "b"))];
        for (committed, kept) in [(Some((3, 7)), true), (Some((4, 7)), false), (Some((3, 6)), false), (None, false)] {
            cache.drop_partition(3);
            fill(&cache, (3, 7), &[(1, entries(&[("v", "a"), ("w", "x")]))]);
            let taken = cache.begin_write(&keys);
            assert!(cache.lookup(3, 7, &keys).0.is_empty(), "taken out while the commit runs");
            cache.end_write(taken, committed, &writes);
            let (hits, _) = cache.lookup(3, 7, &keys);
            match kept {
                true => assert_eq!(*hits[&Key::int(1)], *entries(&[("v", "b"), ("w", "x")]), "{committed:?}"),
                false => assert!(hits.is_empty(), "{committed:?}"),
            }
        }
    }

    #[test]
    fn a_fill_skips_the_keys_written_elsewhere_since_it_began() {
        let cache = StateCache::new(1 << 20);
        let began = cache.begin_fill();
        // Another partition's commit writes key 1 (not cached) meanwhile.
        let taken = cache.begin_write(&[Key::int(1)]);
        cache.end_write(taken, Some((5, 1)), &[(Key::int(1), write("v", "new"))]);
        let loaded = [(Key::int(1), entries(&[("v", "old")])), (Key::int(2), entries(&[]))].into_iter().collect();
        cache.end_fill(began, Some((3, 7)), &loaded);
        let (hits, misses) = cache.lookup(3, 7, &[Key::int(1), Key::int(2)]);
        assert_eq!(misses, [Key::int(1)]);
        assert!(hits.contains_key(&Key::int(2)));
        // A key being written while the fill ends is skipped too.
        let began = cache.begin_fill();
        let taken = cache.begin_write(&[Key::int(1)]);
        cache.end_fill(began, Some((3, 7)), &loaded);
        assert_eq!(cache.lookup(3, 7, &[Key::int(1)]).1, [Key::int(1)]);
        cache.end_write(taken, None, &[]);
    }

    #[test]
    fn past_its_capacity_the_keys_used_longest_ago_go() {
        let value = "x".repeat(1000);
        let one = cost(&Key::int(0), &entries(&[("v", &value)]));
        let cache = StateCache::new(one * 10);
        for key in 0..10 {
            fill(&cache, (0, 1), &[(key, entries(&[("v", &value)]))]);
        }
        assert_eq!(cache.held().1, 10);
        // Key 0 is used again, so key 1 is the oldest.
        assert_eq!(cache.lookup(0, 1, &[Key::int(0)]).0.len(), 1);
        fill(&cache, (0, 1), &[(10, entries(&[("v", &value)]))]);
        let (bytes, count) = cache.held();
        assert!(bytes <= one * 10 / 4 * 3, "{bytes}");
        assert_eq!(count, 7);
        let all: Vec<Key> = (0..=10).map(Key::int).collect();
        let (hits, _) = cache.lookup(0, 1, &all);
        let mut kept: Vec<u64> = (0..=10).filter(|n| hits.contains_key(&Key::int(*n))).collect();
        kept.sort_unstable();
        assert_eq!(kept, [0, 5, 6, 7, 8, 9, 10]);
    }
}
