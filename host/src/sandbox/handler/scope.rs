//! The state one key sees while its events are handled in one batch: where
//! a value a call reads comes from, and how what it writes is staged.
//!
//! Rules kept here:
//! - **A call sees one key.** A [`KeyScope`] holds the state writes, counter
//!   changes and emitted messages of one key during one batch. Reads see the
//!   key's own earlier writes first, then the committed snapshot.
//! - **Every value is checked at the call**, against the rules of
//!   [`wakuwaku_core::limits`]: a value that breaks one is a [`Refusal`]
//!   returned to the module, naming the rule, and nothing of it is kept.
//! - **A failed call leaves no trace.** Writes of a call go into the key's
//!   buffer with a note of what each replaced, and are taken back out when
//!   the call fails ([`KeyScope::finish_call`]); its counter changes and
//!   emits join the key's only when it succeeds.
//! - **What the state keeps is bounded.** A set that would give the key a
//!   new entry past [`PayloadLimits::max_entries_per_key`] is refused
//!   (`entries-per-key`), counting the key's committed entries (read once
//!   per batch, and only when a set may add one) and its writes in the
//!   batch; entries whose presence is unknown count as new until the key
//!   nears the quota, where they are looked up, so the decision is exact.
//!   A change that would make a new counter past
//!   [`PayloadLimits::max_counters`] is refused (`counter-count`),
//!   counting the snapshot's counters and those the batches in flight add
//!   ([`CounterQuota`]). Overwrites, deletes and changes to existing
//!   counters always pass.
//! - **Timers are staged as state writes are.** The key's timers are read
//!   from the snapshot when a call first uses them; each `set` and `cancel`
//!   is checked ([`wakuwaku_core::limits::CallTally::timer_set`], counted
//!   as a state write) and changes the key's view at once; a failed call's
//!   changes are taken back. A set that would make a new timer past
//!   [`PayloadLimits::max_timers_per_key`] (`timers-per-key`) or past the
//!   projection's [`PayloadLimits::max_timers`] (`timers-in-all`, counted
//!   by the consumer's [`TimerQuota`]) is refused; moving or cancelling one
//!   never is. During `fire` ([`KeyScope::begin_firing`]) a timer is set
//!   only later than the timers being fired (`timer-at-firing`).
//! - **Host faults are not the module's.** A state read that fails in the
//!   host fails the call as [`CallError::HostFault`], which the consumer
//!   never counts against the module.

use std::collections::HashMap;
use std::hash::RandomState;
use std::sync::Arc;

use indexmap::IndexMap;
use wakuwaku_core::limits::{CallTally, counter_value};

use wakuwaku_core::timers::{KeyTimers, Millis, Timer};

use super::quota::Hold;
use super::timer_quota::Reserve;
use super::{
    BatchBudget, BatchCounters, CallError, CounterQuota, Emitted, PayloadLimits, Refusal, ScopeError, TimerQuota,
    limits,
};
use crate::event::EventHeaders;
use crate::key::Key;
use crate::storage::log::Record;
use crate::storage::state::{EmitOrigin, KeyWrites, OutboxEntry, StateError, StateReader};

/// The state one key sees while its events are handled in one batch.
///
/// It lives for one key and one batch: the consumer makes it, passes it to
/// every call for that key, and turns it into part of the batch's commit.
pub struct KeyScope {
    key: Key,
    /// The snapshot, limits and budget, behind one `Arc` a worker's scopes
    /// share: a call moves the scope into the module's store and back, and
    /// one uncontended count is cheaper than three counts both workers touch.
    shared: Arc<ScopeShared>,
    /// What this key took from the budget: the most its scope held after
    /// any of its successful calls.
    held: usize,
    /// The key's changes so far, the running call's included.
    staged: Staged,
    /// How to take the running call's changes back out of `staged`.
    undo: Undo,
    tally: CallTally,
    host_fault: Option<String>,
    /// What emits of the next calls record as their origin.
    emit_origin: Option<EmitOrigin>,
    /// The key's timers as its calls see them.
    timers: StagedTimers,
}

/// The key's timers in the batch: read from the snapshot when a call
/// first uses them, then changed by its calls.
#[derive(Default)]
struct StagedTimers {
    /// The key's timers as its calls see them, once read.
    current: Option<KeyTimers>,
    /// How many the key held in the snapshot.
    base: usize,
    /// Whether a successful call (or a firing) changed them.
    changed: bool,
    /// The most bytes its timers held in the batch, as charged to the
    /// footprint.
    charged: usize,
    /// Before the running call's first change: the timers, whether they
    /// were changed, and what was charged.
    undo: Option<(KeyTimers, bool, usize)>,
    /// The time of the timers being fired, while `fire` runs.
    firing: Option<Millis>,
}

/// What every key scope of one worker's part of a batch reads: the
/// committed snapshot, the payload limits and the batch's budget.
pub struct ScopeShared {
    /// The committed state reads fall back to.
    pub snapshot: Arc<StateReader>,
    /// The limits values are checked against.
    pub limits: PayloadLimits,
    /// What the batch's calls may hold in all.
    pub budget: BatchBudget,
    /// The counters the batch adds, against the projection's quota.
    pub counters: BatchCounters,
    /// The projection's timers, against `timers-in-all`.
    pub timers: TimerQuota,
}

/// Writes, counter changes and emits not yet committed.
///
/// Writes land here at once, so a read finds them with one lookup and a
/// call allocates no map of its own; [`Undo`] keeps what they replaced.
/// Names are the module's choice: the map's hash is seeded.
#[derive(Default)]
struct Staged {
    /// Entries in the order the key first wrote them.
    writes: IndexMap<String, StagedEntry, RandomState>,
    /// The counter changes of the key's finished calls.
    counters: HashMap<String, i128>,
    /// The running call's counter changes (merged when it succeeds).
    call_counters: HashMap<String, i128>,
    /// Counters the running call made (held in the batch's counter quota,
    /// given back when it fails).
    call_new_counters: Vec<String>,
    outbox: Vec<OutboxEntry>,
    /// What all of the above holds, as the batch budget counts it.
    footprint: usize,
    /// The entries the key's view has beyond the committed ones, for
    /// `entries-per-key`: per staged entry, 1 if it is set, less 1 if it is
    /// known to be committed. An entry not known to be committed counts as
    /// new, so this is at least the truth, and exact once
    /// [`KeyScope::learn_staged`] has looked them all up.
    added: isize,
    /// Staged entries before this index have been looked up.
    looked_up: usize,
    /// The entries the key holds in the snapshot (counted up to the quota
    /// and one more), once needed.
    committed_entries: Option<usize>,
    /// Whether entries the key read (and has not written) are committed, a
    /// few of them: a module that reads an entry before it sets it then
    /// needs no count. Bounded, as reads are not.
    read: Vec<(String, bool)>,
}

/// A staged entry: its value (`None`: deleted) and what is known of it in
/// the snapshot.
struct StagedEntry {
    value: Option<Vec<u8>>,
    committed: Committed,
}

/// Whether an entry exists in the snapshot, as far as the scope knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Committed {
    Unknown,
    Yes,
    No,
}

impl Committed {
    fn of(known: Option<bool>) -> Self {
        match known {
            None => Self::Unknown,
            Some(true) => Self::Yes,
            Some(false) => Self::No,
        }
    }
}

/// How many reads [`Staged::read`] remembers.
const READS_REMEMBERED: usize = 16;

/// What the running call changed in [`Staged`], to take it back.
#[derive(Default)]
struct Undo {
    /// Per write, in order: the entry's index and the value it held before
    /// (`None`: the write added the entry, so it is the last one when the
    /// writes are undone from the latest).
    writes: Vec<(usize, Option<Option<Vec<u8>>>)>,
    /// Entries staged before the running call.
    writes_len: usize,
    /// [`Staged::added`] before the running call (kept up to date when an
    /// older entry is looked up during the call).
    added: isize,
    /// Emits before the running call.
    outbox_len: usize,
    /// The footprint before the running call.
    footprint: usize,
}

/// What a staged entry holds, as the batch budget counts it.
fn entry_held(name: &str, value: Option<&Vec<u8>>) -> usize {
    name.len() + value.map_or(0, Vec::len) + limits::WRITE_OVERHEAD
}

impl Staged {
    /// Stages `name = value` (`None`: deleted), noting in `undo` what it
    /// replaces; `committed` says whether a newly staged `name` exists in
    /// the snapshot, if known.
    fn write(&mut self, undo: &mut Undo, name: &str, value: Option<Vec<u8>>, committed: Option<bool>) {
        let held = entry_held(name, value.as_ref());
        let set = isize::from(value.is_some());
        match self.writes.get_full_mut(name) {
            Some((index, _, entry)) => {
                let before = std::mem::replace(&mut entry.value, value);
                self.added += set - isize::from(before.is_some());
                // The replaced value stays in `undo` until the call ends,
                // bounded by the call's own limits.
                self.footprint = (self.footprint + held).saturating_sub(entry_held(name, before.as_ref()));
                undo.writes.push((index, Some(before)));
            }
            None => {
                self.added += set - isize::from(committed == Some(true));
                let entry = StagedEntry { value, committed: Committed::of(committed) };
                let (index, _) = self.writes.insert_full(name.to_owned(), entry);
                self.footprint += held;
                undo.writes.push((index, None));
            }
        }
    }

    /// Whether `name` is committed, if the key read it.
    fn read_of(&self, name: &str) -> Option<bool> {
        self.read.iter().find(|(read, _)| read == name).map(|&(_, committed)| committed)
    }

    /// Stages a change of `delta` to counter `name` in the running call.
    fn counter_add(&mut self, name: &str, delta: i64) {
        match self.call_counters.get_mut(name) {
            Some(sum) => *sum += i128::from(delta),
            None => {
                if !self.counters.contains_key(name) {
                    self.footprint += name.len() + limits::WRITE_OVERHEAD;
                }
                self.call_counters.insert(name.to_owned(), i128::from(delta));
            }
        }
    }

    /// Keeps the running call's changes.
    fn keep(&mut self, undo: &mut Undo) {
        undo.writes.clear();
        undo.writes_len = self.writes.len();
        undo.added = self.added;
        for (name, delta) in self.call_counters.drain() {
            *self.counters.entry(name).or_default() += delta;
        }
        self.call_new_counters.clear();
        undo.outbox_len = self.outbox.len();
        undo.footprint = self.footprint;
    }

    /// Takes the running call's changes back out; returns the counters it
    /// made, to give back to the batch's quota.
    fn roll_back(&mut self, undo: &mut Undo) -> Vec<String> {
        for (index, before) in undo.writes.drain(..).rev() {
            match before {
                Some(before) => {
                    if let Some((_, entry)) = self.writes.get_index_mut(index) {
                        entry.value = before;
                    }
                }
                None => {
                    self.writes.pop();
                }
            }
        }
        self.added = undo.added;
        self.looked_up = self.looked_up.min(self.writes.len());
        self.call_counters.clear();
        self.outbox.truncate(undo.outbox_len);
        self.footprint = undo.footprint;
        std::mem::take(&mut self.call_new_counters)
    }
}

/// What a key's handling in one batch leaves to commit.
#[derive(Debug, Default)]
pub struct KeyOutcome {
    /// State writes of the key.
    pub writes: KeyWrites,
    /// Changes to shared counters (each key's stay within the s64 range as
    /// that key saw the counter; summed over keys they may not).
    pub counters: HashMap<String, i128>,
    /// Messages to publish once the batch commits.
    pub outbox: Vec<OutboxEntry>,
    /// The key's timers after the batch, when its calls changed them
    /// (replacing what is committed; empty: none left).
    pub timers: Option<KeyTimers>,
}

impl KeyScope {
    /// A scope for `key` over a committed `snapshot`, checking values
    /// against `limits` and counting what its calls hold against the
    /// batch's `budget`; its new counters count against a quota of its own
    /// (a consumer's scopes share one through [`KeyScope::sharing`]).
    pub fn new(key: Key, snapshot: Arc<StateReader>, limits: PayloadLimits, budget: BatchBudget) -> Self {
        let counters = CounterQuota::new(&limits).batch();
        let timers = TimerQuota::new(&limits);
        Self::sharing(key, &Arc::new(ScopeShared { snapshot, limits, budget, counters, timers }))
    }

    /// A scope for `key` over what `shared` holds (see [`ScopeShared`]).
    pub fn sharing(key: Key, shared: &Arc<ScopeShared>) -> Self {
        Self {
            key,
            shared: shared.clone(),
            held: 0,
            staged: Staged::default(),
            undo: Undo::default(),
            tally: CallTally::default(),
            host_fault: None,
            emit_origin: None,
            timers: StagedTimers::default(),
        }
    }

    /// The key being handled.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The limits its calls run under.
    pub fn limits(&self) -> &PayloadLimits {
        &self.shared.limits
    }

    /// Moves the scope's contents out (to hand them to a `'static` store
    /// for one call), leaving an empty scope of the same key behind.
    pub(crate) fn take_for_call(&mut self) -> KeyScope {
        KeyScope {
            key: self.key.clone(),
            shared: self.shared.clone(),
            held: self.held,
            staged: std::mem::take(&mut self.staged),
            undo: std::mem::take(&mut self.undo),
            tally: std::mem::take(&mut self.tally),
            host_fault: self.host_fault.take(),
            emit_origin: self.emit_origin.take(),
            timers: std::mem::take(&mut self.timers),
        }
    }

    /// Whether the batch's calls may go on: not once one of them found
    /// its budget spent ([`BatchBudget::not_spent`]).
    pub fn budget_not_spent(&self) -> Result<(), CallError> {
        self.shared.budget.not_spent()
    }

    /// Names the call about to be made as the origin of what it emits
    /// ([`OutboxEntry::origin`]): the topic, partition and offset of the
    /// earliest of the call's events, and the module. The topic and the
    /// module's name and version are kept from the previous call of the
    /// key when they are the same (one module handles most of a key's runs,
    /// read from one topic), so a call does not copy them.
    pub fn set_emit_origin(&mut self, (topic, partition, offset): (&str, u32, u64), module: &str, version: &str) {
        match &mut self.emit_origin {
            Some(origin)
                if origin.module == module && origin.version == version && origin.topic.as_deref() == Some(topic) =>
            {
                origin.partition = partition;
                origin.offset = offset;
            }
            _ => {
                let (module, version, topic) = (module.to_owned(), version.to_owned(), Some(topic.to_owned()));
                self.emit_origin = Some(EmitOrigin { partition, offset, module, version, topic });
            }
        }
    }

    /// Ends a call. Its staged changes join the key's buffer when it
    /// succeeded and what the key's scope grew by fits the batch budget;
    /// otherwise they are dropped. A host fault during the call fails it as
    /// [`CallError::HostFault`], and a call that does not fit the budget as
    /// [`CallError::BatchBudget`], whatever the module returned.
    pub fn finish_call(&mut self, result: Result<(), CallError>) -> Result<(), CallError> {
        self.tally = CallTally::default();
        let growth = self.staged.footprint.saturating_sub(self.held);
        let result = match self.host_fault.take() {
            Some(fault) => Err(CallError::HostFault(fault)),
            None => result.and_then(|()| self.shared.budget.reserve(growth, self.held)),
        };
        match result {
            Ok(()) => {
                self.held += growth;
                self.staged.keep(&mut self.undo);
                if self.timers.undo.take().is_some() {
                    self.timers.changed = true;
                }
            }
            Err(_) => self.roll_back(),
        }
        result
    }

    /// Takes the running call's changes back out, its new counters and
    /// timers included.
    fn roll_back(&mut self) {
        for name in self.staged.roll_back(&mut self.undo) {
            self.shared.counters.release(&name);
        }
        if let Some((before, changed, charged)) = self.timers.undo.take() {
            let now = self.timers.current.as_ref().map_or(0, KeyTimers::len);
            self.shared.timers.adjust(before.len() as isize - now as isize);
            self.timers.current = Some(before);
            self.timers.changed = changed;
            self.timers.charged = charged;
        }
    }

    /// Everything the key's successful calls changed.
    pub fn into_outcome(mut self) -> KeyOutcome {
        // A call never finished is not the key's.
        self.roll_back();
        let staged = std::mem::take(&mut self.staged);
        let Staged { writes: staged, counters, outbox, .. } = staged;
        let mut writes = KeyWrites::default();
        for (name, entry) in staged {
            match entry.value {
                Some(value) => writes.set(&name, value),
                None => writes.delete(&name),
            }
        }
        let timers = match self.timers.changed {
            true => self.timers.current.take(),
            false => None,
        };
        KeyOutcome { writes, counters, outbox, timers }
    }

    /// How many timers the key's batch added (less those it removed): what
    /// the consumer gives back to the [`TimerQuota`] if the batch is not
    /// committed (once committed, they are the projection's).
    pub fn timers_added(&self) -> isize {
        self.timers.current.as_ref().map_or(0, |current| current.len() as isize - self.timers.base as isize)
    }

    /// Marks the calls that follow as firing the timers at `firing` (none:
    /// no longer firing), for `timer-at-firing`.
    pub fn begin_firing(&mut self, firing: Option<Millis>) {
        self.timers.firing = firing;
    }

    /// Whether the key's timers were read (or set) in this batch yet.
    pub fn timers_read(&self) -> bool {
        self.timers.current.is_some()
    }

    /// The key's timers as its calls see them, read from the snapshot the
    /// first time.
    pub fn timers(&mut self) -> Result<&KeyTimers, ScopeError> {
        self.timers_mut().map(|timers| &*timers)
    }

    fn timers_mut(&mut self) -> Result<&mut KeyTimers, ScopeError> {
        if self.timers.current.is_none() {
            let read = self.shared.snapshot.timers(&self.key).map_err(|error| self.fault(error))?;
            let read = KeyTimers::from_timers(read);
            self.timers.base = read.len();
            self.timers.current = Some(read);
        }
        Ok(self.timers.current.get_or_insert_with(KeyTimers::default))
    }

    /// Notes, before the running call's first timer change, what to go
    /// back to if it fails.
    fn timers_undo_point(&mut self) -> Result<(), ScopeError> {
        if self.timers.undo.is_none() {
            let before = self.timers_mut()?.clone();
            self.timers.undo = Some((before, self.timers.changed, self.timers.charged));
        }
        Ok(())
    }

    /// Takes the key's due timers at exactly `at` out of its view, to fire
    /// them: the change is the key's as a call's would be (committed with
    /// the batch), and counted out of the projection's timers.
    pub fn take_due(&mut self, at: Millis) -> Result<Vec<Timer>, ScopeError> {
        let fired = self.timers_mut()?.take_at(at);
        if !fired.is_empty() {
            self.timers.changed = true;
            self.shared.timers.adjust(-(fired.len() as isize));
        }
        Ok(fired)
    }

    /// Sets the key's timer `name` at `at` with `payload`: a new one, or
    /// the one of that name moved.
    pub fn timer_set(&mut self, name: &str, at: Millis, payload: Vec<u8>) -> Result<(), ScopeError> {
        let before = self.tally;
        self.tally.timer_set(&self.shared.limits, name, at, payload.len(), self.timers.firing)?;
        let admitted = self.admit_timer(name);
        if let Err(error) = admitted {
            self.tally = before;
            return Err(error);
        }
        self.timers_undo_point()?;
        let timers = self.timers_mut()?;
        timers.set(Timer { name: name.to_owned(), at, payload });
        // Charged as entries are: the most the key's timers held.
        let bytes = timers.bytes();
        if bytes > self.timers.charged {
            self.staged.footprint += bytes - self.timers.charged;
            self.timers.charged = bytes;
        }
        Ok(())
    }

    /// Checks `timers-per-key` and `timers-in-all` for a set of `name`,
    /// counting one more timer in the projection's quota when it is new.
    fn admit_timer(&mut self, name: &str) -> Result<(), ScopeError> {
        let limits = self.shared.limits;
        let timers = self.timers_mut()?;
        if timers.get(name).is_some() {
            return Ok(());
        }
        limits::check_timers_per_key(&limits, name, timers.len())?;
        let snapshot = &self.shared.snapshot;
        match self.shared.timers.reserve(|| snapshot.timer_count(limits.max_timers)) {
            Ok(()) => Ok(()),
            Err(Reserve::Full { held }) => Err(limits::check_timers_in_all(&limits, name, held).err().map_or_else(
                || Refusal::TimersInAll { name: name.to_owned(), held, limit: limits.max_timers }.into(),
                ScopeError::from,
            )),
            Err(Reserve::Store(error)) => Err(self.fault(error)),
        }
    }

    /// Cancels the key's timer `name` (nothing if there is none).
    pub fn timer_cancel(&mut self, name: &str) -> Result<(), ScopeError> {
        self.tally.timer_cancel(&self.shared.limits, name)?;
        if self.timers_mut()?.get(name).is_none() {
            return Ok(());
        }
        self.timers_undo_point()?;
        if self.timers_mut()?.cancel(name).is_some() {
            self.shared.timers.adjust(-1);
        }
        Ok(())
    }

    /// The key's timer `name`, as this call sees it.
    pub fn timer_get(&mut self, name: &str) -> Result<Option<Timer>, ScopeError> {
        limits::check_timer_name(name)?;
        Ok(self.timers_mut()?.get(name))
    }

    /// Notes a host fault (the first one of the call wins) and says so.
    fn fault(&mut self, error: StateError) -> ScopeError {
        let message = format!("{error}");
        self.host_fault.get_or_insert_with(|| message.clone());
        ScopeError::HostFault(message)
    }

    /// Reads an entry of the key: this call's writes, then the batch's, then
    /// the committed state.
    pub fn get(&mut self, name: &str) -> Result<Option<Vec<u8>>, ScopeError> {
        limits::check_name(name)?;
        if let Some(entry) = self.staged.writes.get(name) {
            return Ok(entry.value.clone());
        }
        let value = self.shared.snapshot.get(&self.key, name).map_err(|error| self.fault(error))?;
        let read = &mut self.staged.read;
        if read.len() < READS_REMEMBERED && !read.iter().any(|(known, _)| known == name) {
            read.push((name.to_owned(), value.is_some()));
        }
        Ok(value)
    }

    /// Writes an entry of the key; refused (`entries-per-key`) when it
    /// would be a new one and the key holds its quota.
    pub fn set(&mut self, name: &str, value: Vec<u8>) -> Result<(), ScopeError> {
        let before = self.tally;
        self.tally.set(&self.shared.limits, name, value.len())?;
        let committed = match self.admit_entry(name) {
            Ok(committed) => committed,
            Err(error) => {
                // Refused: the call's counts stay as they were.
                self.tally = before;
                return Err(error);
            }
        };
        self.staged.write(&mut self.undo, name, Some(value), committed);
        Ok(())
    }

    /// Removes an entry of the key.
    pub fn delete(&mut self, name: &str) -> Result<(), Refusal> {
        self.tally.delete(&self.shared.limits, name)?;
        let committed = self.staged.read_of(name);
        self.staged.write(&mut self.undo, name, None, committed);
        Ok(())
    }

    /// Checks `entries-per-key` for a set of `name`, which must pass when
    /// it makes no new entry in the key's view (it overwrites one) or the
    /// key has room. Returns whether `name` is committed, if known.
    ///
    /// Cheap far from the quota: the key's committed count is read once per
    /// batch, and only when a set may add an entry. Near it, entries whose
    /// presence is unknown are looked up, each at most once per batch, so
    /// the count is exact where it decides.
    fn admit_entry(&mut self, name: &str) -> Result<Option<bool>, ScopeError> {
        let committed = match self.staged.writes.get(name) {
            // Set already: an overwrite.
            Some(entry) if entry.value.is_some() => return Ok(None),
            // Deleted in this batch: setting it adds it back.
            Some(_) => None,
            None => match self.staged.read_of(name) {
                Some(true) => return Ok(Some(true)),
                known => known,
            },
        };
        let limit = self.shared.limits.max_entries_per_key;
        let in_snapshot = self.committed_entries()?;
        // In i128: a limit may be as large as `usize::MAX`.
        let fits = |added: isize| in_snapshot <= limit && (in_snapshot as i128 + added as i128) < limit as i128;
        if fits(self.staged.added) {
            return Ok(committed);
        }
        // At the quota as far as the scope knows: learn what it does not.
        let mut committed = committed;
        if committed.is_none() && !self.staged.writes.contains_key(name) {
            let present = self.shared.snapshot.contains(&self.key, name).map_err(|error| self.fault(error))?;
            if present {
                return Ok(Some(true));
            }
            committed = Some(false);
        }
        self.learn_staged()?;
        if fits(self.staged.added) {
            return Ok(committed);
        }
        let held = usize::try_from(in_snapshot as i128 + self.staged.added as i128).unwrap_or(0);
        Err(Refusal::entries_per_key(&self.shared.limits, name, held.max(limit)).into())
    }

    /// The entries the key holds in the snapshot, counted up to one past
    /// the quota: a key already past it (written under a higher quota)
    /// takes no new entry in this batch, whatever it deletes.
    fn committed_entries(&mut self) -> Result<usize, ScopeError> {
        if let Some(count) = self.staged.committed_entries {
            return Ok(count);
        }
        let at_most = self.shared.limits.max_entries_per_key.saturating_add(1);
        let count = self.shared.snapshot.entry_count(&self.key, at_most).map_err(|error| self.fault(error))?;
        self.staged.committed_entries = Some(count);
        Ok(count)
    }

    /// Looks up every staged entry not known to be committed, so that
    /// [`Staged::added`] is exact. Each is looked up once per batch, unless
    /// a failed call staged it and it is staged again.
    fn learn_staged(&mut self) -> Result<(), ScopeError> {
        let snapshot = self.shared.snapshot.clone();
        while self.staged.looked_up < self.staged.writes.len() {
            let index = self.staged.looked_up;
            let Some((name, entry)) = self.staged.writes.get_index_mut(index) else { break };
            if entry.committed == Committed::Unknown {
                let present = match snapshot.contains(&self.key, name) {
                    Ok(present) => present,
                    Err(error) => return Err(self.fault(error)),
                };
                entry.committed = Committed::of(Some(present));
                if present {
                    self.staged.added -= 1;
                    if index < self.undo.writes_len {
                        self.undo.added -= 1;
                    }
                }
            }
            self.staged.looked_up += 1;
        }
        Ok(())
    }

    /// A shared counter as this key sees it: committed value plus this
    /// key's changes in the batch; and whether it is new to the key (not
    /// committed, not changed by the key yet).
    fn counter_seen(&mut self, name: &str) -> Result<(i128, bool), ScopeError> {
        limits::check_name(name)?;
        let committed = self.shared.snapshot.find_counter(name).map_err(|error| self.fault(error))?;
        let (finished, running) = (self.staged.counters.get(name), self.staged.call_counters.get(name));
        let new = committed.is_none() && finished.is_none() && running.is_none();
        let own = finished.copied().unwrap_or(0) + running.copied().unwrap_or(0);
        Ok((committed.unwrap_or(0).saturating_add(own), new))
    }

    /// Adds to a counter shared by all keys; refused when the counter as
    /// this key sees it would leave the s64 range, and when it is a new
    /// counter and the projection holds its quota (`counter-count`).
    pub fn counter_add(&mut self, name: &str, delta: i64) -> Result<(), ScopeError> {
        let (current, new) = self.counter_seen(name)?;
        let before = self.tally;
        self.tally.counter_add(&self.shared.limits, name, current, delta)?;
        if new {
            let snapshot = &self.shared.snapshot;
            match self.shared.counters.hold(name, |at_most| snapshot.counter_count(at_most)) {
                Ok(()) => self.staged.call_new_counters.push(name.to_owned()),
                Err(refused) => {
                    // Refused: the call's counts stay as they were.
                    self.tally = before;
                    return Err(match refused {
                        Hold::Full { held } => Refusal::counter_count(&self.shared.limits, name, held).into(),
                        Hold::Store(error) => self.fault(error),
                    });
                }
            }
        }
        self.staged.counter_add(name, delta);
        Ok(())
    }

    /// A shared counter: committed value plus this key's changes; refused
    /// when that is outside the s64 range.
    pub fn counter_get(&mut self, name: &str) -> Result<i64, ScopeError> {
        let (value, _) = self.counter_seen(name)?;
        Ok(counter_value(name, value)?)
    }

    /// Queues a message for publication when the batch commits. Its topic
    /// must be one of `declared` (the module's [`HandlerModule::emits`]).
    pub fn emit(&mut self, declared: &[String], message: Emitted) -> Result<(), Refusal> {
        let Emitted { topic, tag, key, ordering, algebra, body } = message;
        let key = self.tally.emit(&self.shared.limits, declared, &topic, &key, &body)?;
        self.staged.footprint += topic.len() + key.as_bytes().len() + body.len() + limits::EMIT_OVERHEAD;
        let partition_key = key.key_hash();
        let headers = EventHeaders { tag, key, ordering, algebra, event_time: None };
        self.staged.outbox.push(OutboxEntry {
            topic,
            partition_key,
            partition: None,
            record: Record { headers: headers.to_headers(), body },
            origin: self.emit_origin.clone(),
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::fmt;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::event::{Algebra, EventAtomicOrdering, EventTypeTag};
    use crate::sandbox::handler::ErrorClass;
    use crate::storage::state::{BatchCommit, StateStore};
    use wakuwaku_core::limits::WRITE_OVERHEAD;

    struct Store {
        _dir: tempfile::TempDir,
        store: StateStore,
    }

    impl Store {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
            Self { _dir: dir, store }
        }

        fn scope(&self, key: u64, limits: PayloadLimits, budget: &BatchBudget) -> KeyScope {
            KeyScope::new(Key::int(key), Arc::new(self.store.reader().unwrap()), limits, budget.clone())
        }
    }

    fn emitted(topic: &str, key: &Key, body: &[u8]) -> Emitted {
        Emitted {
            topic: topic.into(),
            tag: EventTypeTag::new(1),
            key: key.as_bytes().to_vec(),
            ordering: EventAtomicOrdering::Relaxed,
            algebra: Algebra::NonAssociative,
            body: body.to_vec(),
        }
    }

    fn rule(error: impl fmt::Display) -> String {
        error.to_string().split(':').next().unwrap().to_owned()
    }

    #[test]
    fn refused_values_leave_nothing_and_the_call_may_still_succeed() {
        let store = Store::new();
        let limits = PayloadLimits { max_state_value: 4, ..PayloadLimits::default() };
        let budget = BatchBudget::new(&limits);
        let mut scope = store.scope(1, limits, &budget);
        assert_eq!(rule(scope.set("big", vec![0; 5]).unwrap_err()), "state-value-size");
        assert_eq!(rule(scope.set("", vec![]).unwrap_err()), "name-length");
        assert_eq!(rule(scope.get(&"n".repeat(300)).unwrap_err()), "name-length");
        scope.set("ok", b"1".to_vec()).unwrap();
        scope.finish_call(Ok(())).unwrap();
        assert_eq!(scope.get("big"), Ok(None));
        assert_eq!(scope.get("ok"), Ok(Some(b"1".to_vec())));
        let outcome = scope.into_outcome();
        assert_eq!(outcome.writes.len(), 1);
        assert_eq!(budget.held(), "ok".len() + 1 + wakuwaku_core::limits::WRITE_OVERHEAD);
    }

    #[test]
    fn each_emit_names_the_call_it_came_from() {
        let store = Store::new();
        let limits = PayloadLimits::default();
        let mut scope = store.scope(1, limits, &BatchBudget::new(&limits));
        let declared = ["out".to_owned()];
        let key = Key::int(1);
        let calls = [("t", 7, "a", "1"), ("u", 9, "a", "1"), ("u", 12, "b", "1"), ("u", 15, "b", "2")];
        for (topic, offset, module, version) in calls {
            scope.set_emit_origin((topic, 3, offset), module, version);
            scope.emit(&declared, emitted("out", &key, b"x")).unwrap();
            scope.finish_call(Ok(())).unwrap();
        }
        let origins: Vec<_> = scope
            .into_outcome()
            .outbox
            .into_iter()
            .map(|entry| entry.origin.map(|o| (o.topic.unwrap(), o.partition, o.offset, o.module, o.version)))
            .collect();
        let expected = calls.map(|(topic, offset, module, version)| {
            Some((topic.to_owned(), 3, offset, module.to_owned(), version.to_owned()))
        });
        assert_eq!(origins, expected);
    }

    #[test]
    fn per_call_counts_start_again_with_each_call() {
        let store = Store::new();
        let limits = PayloadLimits { max_state_writes_per_call: 2, ..PayloadLimits::default() };
        let mut scope = store.scope(1, limits, &BatchBudget::new(&limits));
        for call in 0..3 {
            scope.set("a", vec![call]).unwrap();
            scope.delete("b").unwrap();
            assert_eq!(rule(scope.set("c", vec![]).unwrap_err()), "state-writes-per-call");
            scope.finish_call(Ok(())).unwrap();
        }
        // A failed call's count does not carry over either.
        scope.set("a", vec![9]).unwrap();
        scope.set("a", vec![9]).unwrap();
        scope.finish_call(Err(CallError::Trap { reason: "x".into() })).unwrap_err();
        scope.set("a", vec![7]).unwrap();
        scope.finish_call(Ok(())).unwrap();
        assert_eq!(scope.get("a"), Ok(Some(vec![7])));
    }

    #[test]
    fn counters_are_checked_against_the_committed_value_and_the_keys_own_changes() {
        let store = Store::new();
        store
            .store
            .commit(BatchCommit {
                counter_deltas: [("c".to_owned(), i128::from(i64::MAX) - 10)].into_iter().collect(),
                ..BatchCommit::default()
            })
            .unwrap();
        let limits = PayloadLimits::default();
        let budget = BatchBudget::new(&limits);
        let mut first = store.scope(1, limits, &budget);
        let mut second = store.scope(2, limits, &budget);
        first.counter_add("c", 6).unwrap();
        first.finish_call(Ok(())).unwrap();
        first.counter_add("c", 4).unwrap();
        assert_eq!(first.counter_get("c"), Ok(i64::MAX));
        assert_eq!(rule(first.counter_add("c", 1).unwrap_err()), "counter-range");
        first.finish_call(Ok(())).unwrap();
        // Another key sees only the committed value, so it may add too: the
        // store sums the deltas as i128 and never fails the commit.
        second.counter_add("c", 10).unwrap();
        second.finish_call(Ok(())).unwrap();
        let mut deltas: HashMap<String, i128> = HashMap::default();
        for scope in [first, second] {
            for (name, delta) in scope.into_outcome().counters {
                *deltas.entry(name).or_default() += delta;
            }
        }
        assert_eq!(deltas["c"], 20);
        store.store.commit(BatchCommit { counter_deltas: deltas, ..BatchCommit::default() }).unwrap();
        // Now outside the s64 range: reads are refused, a step back in is not.
        let mut third = store.scope(3, limits, &BatchBudget::new(&limits));
        assert_eq!(rule(third.counter_get("c").unwrap_err()), "counter-range");
        assert_eq!(rule(third.counter_add("c", 1).unwrap_err()), "counter-range");
        third.counter_add("c", -10).unwrap();
        assert_eq!(third.counter_get("c"), Ok(i64::MAX));
    }

    #[test]
    fn emits_are_checked_and_queued_with_the_keys_hash() {
        let store = Store::new();
        let limits = PayloadLimits::default();
        let mut scope = store.scope(1, limits, &BatchBudget::new(&limits));
        let declared = vec!["out".to_owned()];
        let key = Key::parse_text(r#"[1,"a"]"#).unwrap();
        assert_eq!(rule(scope.emit(&declared, emitted("dlq_in", &key, b"x")).unwrap_err()), "emit-topic");
        assert_eq!(rule(scope.emit(&[], emitted("out", &key, b"x")).unwrap_err()), "emit-topic");
        assert_eq!(rule(scope.emit(&declared, emitted("out", &key, b"")).unwrap_err()), "emit-body-size");
        let mut bad = emitted("out", &key, b"x");
        bad.key = vec![0x01, 0x80, 0x00];
        assert_eq!(rule(scope.emit(&declared, bad).unwrap_err()), "emit-key");
        scope.emit(&declared, emitted("out", &key, b"x")).unwrap();
        scope.finish_call(Ok(())).unwrap();
        let outbox = scope.into_outcome().outbox;
        assert_eq!(outbox.len(), 1);
        assert_eq!((outbox[0].topic.as_str(), outbox[0].partition_key), ("out", key.key_hash()));
        let headers = EventHeaders::parse_stored(&outbox[0].record.headers).unwrap();
        assert_eq!(headers.key, key);
    }

    #[test]
    fn a_call_past_the_batch_budget_fails_as_retryable_and_keeps_nothing() {
        let store = Store::new();
        let one_call = PayloadLimits::default().most_held_by_one_call();
        let limits = PayloadLimits { max_batch_held: one_call, ..PayloadLimits::default() };
        let budget = BatchBudget::new(&limits);
        let value = vec![0; 1 << 20];
        // Two calls of 3 MiB fit the budget of about 9 MiB; a third does not.
        let mut first = store.scope(1, limits, &budget);
        for call in 0..2 {
            for name in ["a", "b", "c"] {
                first.set(&format!("{name}{call}"), value.clone()).unwrap();
            }
            first.finish_call(Ok(())).unwrap();
        }
        let held = budget.held();
        let mut second = store.scope(2, limits, &budget);
        for name in ["a", "b", "c"] {
            second.set(name, value.clone()).unwrap();
        }
        let error = second.finish_call(Ok(())).unwrap_err();
        assert!(matches!(error, CallError::BatchBudget { held: h, .. } if h == held), "{error}");
        assert_eq!(error.class(), ErrorClass::Retryable);
        assert!(error.to_string().starts_with("batch-budget:"), "{error}");
        assert_eq!(budget.held(), held, "a failed call takes nothing from the budget");
        assert!(second.into_outcome().writes.is_empty());
        // A smaller call still fits.
        let mut third = store.scope(3, limits, &budget);
        third.set("a", vec![1]).unwrap();
        third.finish_call(Ok(())).unwrap();
    }

    #[test]
    fn timers_are_staged_bounded_and_taken_back_with_a_failed_call() {
        let store = Store::new();
        let commit = BatchCommit {
            timers: vec![crate::storage::state::TimerWrite {
                key: Key::int(1),
                partition: 0,
                timers: vec![Timer { name: "old".into(), at: 3, payload: vec![] }],
            }],
            ..BatchCommit::default()
        };
        store.store.commit(commit).unwrap();
        let limits = PayloadLimits { max_timers_per_key: 2, max_timers: 3, ..PayloadLimits::default() };
        let budget = BatchBudget::new(&limits);
        let mut scope = store.scope(1, limits, &budget);
        assert_eq!(scope.timer_get("old").unwrap().map(|t| t.at), Some(3), "the committed timers are read");
        scope.timer_set("close", 10, vec![1]).unwrap();
        let refused = scope.timer_set("third", 11, vec![]).unwrap_err();
        assert!(refused.to_string().starts_with("timers-per-key:"), "{refused}");
        scope.timer_set("close", 12, vec![2]).unwrap(); // moving one is never refused
        scope.finish_call(Ok(())).unwrap();
        // A failed call's changes are taken back.
        scope.timer_cancel("close").unwrap();
        scope.timer_set("other", 1, vec![]).unwrap();
        scope.finish_call(Err(CallError::Trap { reason: "x".into() })).unwrap_err();
        assert_eq!(scope.timer_get("close").unwrap().map(|t| (t.at, t.payload)), Some((12, vec![2])));
        assert_eq!(scope.timer_get("other").unwrap(), None);
        // While `fire` runs for the timers at 12, only later ones are set.
        scope.begin_firing(Some(12));
        assert!(scope.timer_set("old", 12, vec![]).unwrap_err().to_string().starts_with("timer-at-firing:"));
        scope.timer_set("old", 13, vec![]).unwrap();
        scope.begin_firing(None);
        scope.finish_call(Ok(())).unwrap();
        assert_eq!(scope.take_due(12).unwrap().len(), 1);
        assert_eq!(scope.timers_added(), 0, "one timer added and fired, the committed one moved");
        let outcome = scope.into_outcome();
        let timers = outcome.timers.expect("changed").in_order();
        assert_eq!(timers.iter().map(|t| (t.name.as_str(), t.at)).collect::<Vec<_>>(), [("old", 13)]);
        // The projection's quota, shared by the keys of a batch: 1
        // committed, 3 at most.
        let shared = Arc::new(ScopeShared {
            snapshot: Arc::new(store.store.reader().unwrap()),
            limits,
            budget: budget.clone(),
            counters: CounterQuota::new(&limits).batch(),
            timers: TimerQuota::new(&limits),
        });
        let (mut a, mut b) = (KeyScope::sharing(Key::int(2), &shared), KeyScope::sharing(Key::int(3), &shared));
        a.timer_set("a", 1, vec![]).unwrap();
        b.timer_set("b", 1, vec![]).unwrap();
        let refused = a.timer_set("c", 1, vec![]).unwrap_err().to_string();
        assert!(refused.starts_with("timers-in-all: a projection holds at most 3 timers (it holds 3)"), "{refused}");
        b.timer_cancel("b").unwrap();
        a.timer_set("c", 1, vec![]).unwrap();
    }

    #[test]
    fn a_key_rewriting_its_entries_is_charged_once_for_them() {
        let store = Store::new();
        let base = PayloadLimits::default();
        let limits = PayloadLimits { max_batch_held: base.most_held_by_one_call(), ..base };
        let budget = BatchBudget::new(&limits);
        let mut scope = store.scope(1, limits, &budget);
        // Ten thousand calls, each rewriting the same 1 KiB entry and
        // counter: charged as one entry and one counter name.
        for call in 0..10_000u32 {
            scope.set("balance", vec![call as u8; 1024]).unwrap();
            scope.counter_add("total", 1).unwrap();
            scope.finish_call(Ok(())).unwrap();
        }
        let one_entry = "balance".len() + 1024 + WRITE_OVERHEAD;
        let one_counter = "total".len() + WRITE_OVERHEAD;
        assert_eq!(budget.held(), one_entry + one_counter);
        // A smaller value, a delete and a failed larger write give nothing
        // back and take nothing more.
        scope.set("balance", vec![1]).unwrap();
        scope.finish_call(Ok(())).unwrap();
        scope.delete("balance").unwrap();
        scope.finish_call(Ok(())).unwrap();
        scope.set("balance", vec![0; 4096]).unwrap();
        scope.finish_call(Err(CallError::Trap { reason: "x".into() })).unwrap_err();
        assert_eq!(budget.held(), one_entry + one_counter);
        // Growing the entry charges the difference past the most it held.
        scope.set("balance", vec![0; 1500]).unwrap();
        scope.finish_call(Ok(())).unwrap();
        assert_eq!(budget.held(), one_entry + one_counter + 476);
        assert_eq!(scope.into_outcome().counters["total"], 10_000);
    }

    #[test]
    fn a_key_whose_footprint_grows_past_the_budget_fails_and_emits_always_count() {
        let store = Store::new();
        let base = PayloadLimits::default();
        let limits = PayloadLimits { max_batch_held: base.most_held_by_one_call(), ..base };
        let budget = BatchBudget::new(&limits);
        let mut scope = store.scope(1, limits, &budget);
        // New entries of 1 MiB each: the ninth or tenth does not fit the
        // budget of about 9 MiB.
        let mut failed = None;
        for call in 0..20 {
            scope.set(&format!("e{call}"), vec![0; 1 << 20]).unwrap();
            if let Err(error) = scope.finish_call(Ok(())) {
                failed = Some((call, error));
                break;
            }
        }
        let (call, error) = failed.expect("the budget stopped the key");
        assert!((8..12).contains(&call), "failed at call {call}");
        assert!(matches!(error, CallError::BatchBudget { key_held, .. } if key_held == budget.held()), "{error}");
        assert!(error.counts_as_attempt(), "the key itself holds the budget");
        assert!(budget.held() <= limits.max_batch_held);
        assert_eq!(scope.get(&format!("e{call}")), Ok(None), "the failed call left nothing");
        // Emits are never replaced: the same message again and again is
        // charged each time, until it does not fit.
        let mut emitter = store.scope(2, limits, &BatchBudget::new(&limits));
        let declared = ["out".to_owned()];
        let body = vec![1; 1 << 20];
        let mut emitted_calls = 0;
        while emitter.emit(&declared, emitted("out", &Key::int(2), &body)).is_ok()
            && emitter.finish_call(Ok(())).is_ok()
        {
            emitted_calls += 1;
            assert!(emitted_calls < 20, "emits stopped counting");
        }
        assert!((8..12).contains(&emitted_calls), "{emitted_calls} emits of 1 MiB fitted");
        assert_eq!(emitter.into_outcome().outbox.len(), emitted_calls);
    }

    #[test]
    fn a_failed_call_is_taken_back_write_by_write() {
        let store = Store::new();
        let limits = PayloadLimits::default();
        let mut scope = store.scope(1, limits, &BatchBudget::new(&limits));
        let declared = ["out".to_owned()];
        scope.set("a", vec![1]).unwrap();
        scope.set("b", vec![2]).unwrap();
        scope.counter_add("c", 5).unwrap();
        scope.emit(&declared, emitted("out", &Key::int(1), b"kept")).unwrap();
        scope.finish_call(Ok(())).unwrap();
        // A failing call rewrites, deletes, adds (some names twice), counts and emits.
        scope.set("a", vec![3]).unwrap();
        scope.delete("b").unwrap();
        scope.set("new", vec![4]).unwrap();
        scope.set("a", vec![5]).unwrap();
        scope.delete("new").unwrap();
        scope.set("other", vec![6]).unwrap();
        scope.counter_add("c", 7).unwrap();
        scope.emit(&declared, emitted("out", &Key::int(1), b"dropped")).unwrap();
        assert_eq!(scope.get("a"), Ok(Some(vec![5])), "a call reads its own writes");
        scope.finish_call(Err(CallError::Trap { reason: "x".into() })).unwrap_err();
        assert_eq!(scope.get("a"), Ok(Some(vec![1])));
        assert_eq!(scope.get("b"), Ok(Some(vec![2])));
        assert_eq!((scope.get("new"), scope.get("other")), (Ok(None), Ok(None)));
        assert_eq!(scope.counter_get("c"), Ok(5));
        // A later call's writes are kept, and so is an unfinished call's nothing.
        scope.set("b", vec![8]).unwrap();
        scope.finish_call(Ok(())).unwrap();
        scope.set("a", vec![9]).unwrap();
        let outcome = scope.into_outcome();
        let mut writes: Vec<_> =
            outcome.writes.iter().map(|(name, value)| (name.to_owned(), value.map(<[u8]>::to_vec))).collect();
        writes.sort();
        assert_eq!(writes, [("a".to_owned(), Some(vec![1])), ("b".to_owned(), Some(vec![8]))]);
        assert_eq!(outcome.counters["c"], 5);
        assert_eq!(outcome.outbox.iter().map(|entry| entry.record.body.as_slice()).collect::<Vec<_>>(), [b"kept"]);
    }

    #[test]
    fn a_host_fault_fails_the_call_whatever_the_module_returns() {
        let store = Store::new();
        let limits = PayloadLimits::default();
        let mut scope = store.scope(1, limits, &BatchBudget::new(&limits));
        scope.set("kept", vec![1]).unwrap();
        scope.host_fault = Some("disk on fire".into());
        let error = scope.finish_call(Ok(())).unwrap_err();
        assert_eq!(error, CallError::HostFault("disk on fire".into()));
        assert_eq!(scope.get("kept"), Ok(None), "nothing of the call is kept");
    }

    /// A snapshot that counts the reads the quotas make.
    struct Counted {
        inner: StateReader,
        reads: Arc<Reads>,
    }

    #[derive(Default)]
    struct Reads {
        entry_counts: AtomicUsize,
        lookups: AtomicUsize,
        counter_counts: AtomicUsize,
    }

    impl Reads {
        fn take(&self) -> (usize, usize, usize) {
            let take = |count: &AtomicUsize| count.swap(0, Ordering::Relaxed);
            (take(&self.entry_counts), take(&self.lookups), take(&self.counter_counts))
        }
    }

    impl crate::storage::state::Snapshot for Counted {
        fn get(&self, key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError> {
            self.inner.get(key, name)
        }
        fn contains(&self, key: &Key, name: &str) -> Result<bool, StateError> {
            self.reads.lookups.fetch_add(1, Ordering::Relaxed);
            self.inner.contains(key, name)
        }
        fn entry_count(&self, key: &Key, at_most: usize) -> Result<usize, StateError> {
            self.reads.entry_counts.fetch_add(1, Ordering::Relaxed);
            self.inner.entry_count(key, at_most)
        }
        fn counter(&self, name: &str) -> Result<Option<i128>, StateError> {
            self.inner.find_counter(name)
        }
        fn counter_count(&self, at_most: usize) -> Result<usize, StateError> {
            self.reads.counter_counts.fetch_add(1, Ordering::Relaxed);
            self.inner.counter_count(at_most)
        }

        fn timers(&self, key: &Key) -> Result<Vec<Timer>, StateError> {
            self.inner.timers(key)
        }

        fn timer_count(&self, at_most: usize) -> Result<usize, StateError> {
            self.inner.timer_count(at_most)
        }
    }

    impl Store {
        /// Commits `names` as entries of `key` and `counters` as counters.
        fn with(self, key: u64, names: &[&str], counters: &[&str]) -> Self {
            let mut writes = KeyWrites::default();
            for name in names {
                writes.set(name, b"committed".to_vec());
            }
            let counter_deltas = counters.iter().map(|name| ((*name).to_owned(), 1)).collect();
            self.store
                .commit(BatchCommit { writes: vec![(Key::int(key), writes)], counter_deltas, ..Default::default() })
                .unwrap();
            self
        }

        /// What the scopes of one batch share, over a counting snapshot.
        fn batch(&self, limits: PayloadLimits, quota: &CounterQuota) -> (Arc<ScopeShared>, Arc<Reads>) {
            let reads = Arc::new(Reads::default());
            let snapshot = StateReader::new(Counted { inner: self.store.reader().unwrap(), reads: reads.clone() });
            let shared = ScopeShared {
                snapshot: Arc::new(snapshot),
                limits,
                budget: BatchBudget::new(&limits),
                counters: quota.batch(),
                timers: TimerQuota::new(&limits),
            };
            (Arc::new(shared), reads)
        }
    }

    fn entry_names(scope: KeyScope) -> Vec<(String, bool)> {
        let mut names: Vec<_> =
            scope.into_outcome().writes.iter().map(|(name, value)| (name.to_owned(), value.is_some())).collect();
        names.sort();
        names
    }

    #[test]
    fn a_key_at_its_entry_quota_may_overwrite_and_delete_but_not_add() {
        let store = Store::new().with(1, &["a", "b"], &[]);
        let limits = PayloadLimits { max_entries_per_key: 3, ..PayloadLimits::default() };
        let mut scope = store.scope(1, limits, &BatchBudget::new(&limits));
        scope.set("a", vec![1]).unwrap();
        scope.set("c", vec![1]).unwrap();
        let refusal = scope.set("d", vec![1]).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "entries-per-key: this key holds 3 entries (committed and written in this batch), at most 3; entry `d` \
             would be a new one"
        );
        assert_eq!(scope.tally.state_writes, 2, "the refused write counts nothing");
        scope.set("b", vec![2]).unwrap();
        scope.delete("a").unwrap();
        scope.set("d", vec![1]).unwrap();
        assert_eq!(rule(scope.set("e", vec![1]).unwrap_err()), "entries-per-key");
        // Deleting what the key wrote in the batch makes room as well.
        scope.delete("d").unwrap();
        scope.set("e", vec![1]).unwrap();
        scope.finish_call(Ok(())).unwrap();
        let names = entry_names(scope);
        let expected = [("a", false), ("b", true), ("c", true), ("d", false), ("e", true)];
        assert_eq!(names, expected.map(|(name, set)| (name.to_owned(), set)));
    }

    #[test]
    fn blind_writes_are_counted_exactly_at_the_quota_and_cheaply_below_it() {
        let store = Store::new().with(1, &["a", "b", "c"], &[]);
        let limits = PayloadLimits { max_entries_per_key: 5, ..PayloadLimits::default() };
        let quota = CounterQuota::new(&limits);
        let (shared, reads) = store.batch(limits, &quota);
        let mut scope = KeyScope::sharing(Key::int(1), &shared);
        // Below the quota a blind write costs one count for the key's batch,
        // and no lookup: it is counted as new.
        scope.set("a", vec![1]).unwrap();
        scope.set("b", vec![1]).unwrap();
        assert_eq!(reads.take(), (1, 0, 0));
        // Now the key's view may hold 5 as far as the scope knows: at the
        // quota it looks up what it does not know, once each.
        scope.set("x", vec![1]).unwrap();
        assert_eq!(reads.take(), (0, 3, 0), "`x`, then the two it wrote");
        scope.set("y", vec![1]).unwrap();
        assert_eq!(reads.take(), (0, 0, 0), "a, b, c, x and y: it fits");
        assert_eq!(rule(scope.set("z", vec![1]).unwrap_err()), "entries-per-key");
        assert_eq!(reads.take(), (0, 2, 0), "only `z` and `y` were unknown");
        // A blind delete of a committed entry makes room, once looked up.
        scope.delete("c").unwrap();
        scope.set("z", vec![1]).unwrap();
        assert_eq!(reads.take(), (0, 2, 0), "`z` and `c`");
        // Overwriting a committed entry it read needs no lookup at all.
        let mut reader = KeyScope::sharing(Key::int(1), &shared);
        assert!(reader.get("c").unwrap().is_some());
        reader.set("c", vec![2]).unwrap();
        assert_eq!(reads.take(), (0, 0, 0));
        reader.set("q", vec![2]).unwrap();
        assert_eq!(reads.take(), (1, 0, 0), "a new entry is counted, once for the key");
    }

    #[test]
    fn a_failed_calls_entries_do_not_count_and_lookups_made_in_it_stay_true() {
        let store = Store::new().with(1, &["a"], &[]);
        let limits = PayloadLimits { max_entries_per_key: 3, ..PayloadLimits::default() };
        let mut scope = store.scope(1, limits, &BatchBudget::new(&limits));
        scope.set("a", vec![1]).unwrap(); // blind: counted as new
        scope.set("b", vec![1]).unwrap();
        scope.finish_call(Ok(())).unwrap();
        // A failing call looks `a` up at the quota, then is taken back.
        scope.set("c", vec![1]).unwrap();
        assert_eq!(rule(scope.set("d", vec![1]).unwrap_err()), "entries-per-key");
        scope.finish_call(Err(CallError::Trap { reason: "x".into() })).unwrap_err();
        // `c` is gone, and `a` is still known to be committed (not counted
        // as new again): beside `a` and `b` there is room for one.
        scope.set("c", vec![1]).unwrap();
        assert_eq!(rule(scope.set("d", vec![1]).unwrap_err()), "entries-per-key");
        scope.finish_call(Ok(())).unwrap();
        assert_eq!(entry_names(scope).len(), 3);
    }

    #[test]
    fn the_largest_quotas_take_everything() {
        let store = Store::new().with(1, &["a"], &["c"]);
        let limits = PayloadLimits { max_entries_per_key: usize::MAX, max_counters: usize::MAX, ..Default::default() };
        let mut scope = store.scope(1, limits, &BatchBudget::new(&limits));
        scope.set("b", vec![1]).unwrap();
        scope.counter_add("d", 1).unwrap();
        scope.finish_call(Ok(())).unwrap();
    }

    #[test]
    fn a_key_already_past_its_quota_takes_no_new_entry_but_may_shrink() {
        let store = Store::new().with(1, &["a", "b", "c", "d"], &[]);
        let limits = PayloadLimits { max_entries_per_key: 2, ..PayloadLimits::default() };
        let mut scope = store.scope(1, limits, &BatchBudget::new(&limits));
        scope.set("a", vec![1]).unwrap();
        scope.delete("b").unwrap();
        scope.delete("c").unwrap();
        assert_eq!(rule(scope.set("x", vec![1]).unwrap_err()), "entries-per-key");
        scope.finish_call(Ok(())).unwrap();
        store
            .store
            .commit(BatchCommit { writes: vec![(Key::int(1), scope.into_outcome().writes)], ..Default::default() })
            .unwrap();
        // Under it again (a, d), the next batch writes a new one.
        let mut scope = store.scope(1, limits, &BatchBudget::new(&limits));
        assert_eq!(rule(scope.set("x", vec![1]).unwrap_err()), "entries-per-key");
        scope.delete("d").unwrap();
        scope.set("x", vec![1]).unwrap();
    }

    #[test]
    fn new_counters_stop_at_the_quota_across_the_keys_of_a_batch_and_existing_ones_change() {
        let store = Store::new().with(9, &[], &["old"]);
        let limits = PayloadLimits { max_counters: 3, ..PayloadLimits::default() };
        let quota = CounterQuota::new(&limits);
        let (shared, reads) = store.batch(limits, &quota);
        let (mut one, mut two) = (KeyScope::sharing(Key::int(1), &shared), KeyScope::sharing(Key::int(2), &shared));
        one.counter_add("old", 5).unwrap();
        assert_eq!(reads.take(), (0, 0, 0), "an existing counter never touches the quota");
        one.counter_add("a", 1).unwrap();
        two.counter_add("b", 1).unwrap();
        assert_eq!(reads.take(), (0, 0, 1), "the snapshot's counters are counted once per batch");
        let refusal = two.counter_add("c", 1).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "counter-count: the projection holds 3 counters (committed and pending), at most 3; counter `c` would \
             be a new one"
        );
        assert_eq!(two.tally.counter_changes, 1, "the refused change counts nothing");
        // What another key of the batch made new is no new counter.
        two.counter_add("a", 2).unwrap();
        one.counter_add("old", -1).unwrap();
        one.finish_call(Ok(())).unwrap();
        // A failed call gives its new counters back.
        two.finish_call(Err(CallError::Trap { reason: "x".into() })).unwrap_err();
        two.counter_add("c", 1).unwrap();
        two.finish_call(Ok(())).unwrap();
        assert_eq!(rule(one.counter_add("d", 1).unwrap_err()), "counter-count");
        let mut deltas: HashMap<String, i128> = HashMap::default();
        for scope in [one, two] {
            for (name, delta) in scope.into_outcome().counters {
                *deltas.entry(name).or_default() += delta;
            }
        }
        let mut names: Vec<_> = deltas.keys().cloned().collect();
        names.sort();
        assert_eq!(names, ["a", "c", "old"]);
        store.store.commit(BatchCommit { counter_deltas: deltas, ..Default::default() }).unwrap();
        shared.counters.committed();
        drop(shared);
        assert_eq!(store.store.counters().unwrap().len(), 3);
        // The next batch sees them committed: still full.
        let (shared, _) = store.batch(limits, &quota);
        let mut three = KeyScope::sharing(Key::int(3), &shared);
        assert_eq!(rule(three.counter_add("e", 1).unwrap_err()), "counter-count");
        three.counter_add("c", 1).unwrap();
    }
}
