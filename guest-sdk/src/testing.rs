//! Unit-testing handlers natively, without WASM and without a host.
//!
//! [`MemoryHost`] keeps state, counters, emitted messages and log lines in
//! memory, and drives a module through the same byte path the component
//! uses: events are encoded, dispatched by tag through [`Module::handle`],
//! and decoded again. It keeps the host's rules, with the host's limits
//! ([`PayloadLimits`], default or [`MemoryHost::with_limits`]) and the
//! host's messages: names, value and body sizes, per-call counts and bytes,
//! declared emit topics, canonical keys, counters within `i64`, the state
//! quotas (counters per projection, entries per key), log lines cut and
//! counted, the timer rules (names, payloads, timers per key and in all,
//! `timer-at-firing`). So a module that passes its native tests meets no
//! new refusal in production. [`MemoryHost::advance::<M>`] moves the clock
//! and fires the due timers as the host does: per key in (time, name)
//! order, all of one time in one call.
//!
//! ```
//! # use serde::{Deserialize, Serialize};
//! # use wakuwaku_guest::{Context, Event, EventTypeTag, Handler, HandlerError};
//! # #[derive(Serialize, Deserialize)]
//! # struct Pinged { user: u64 }
//! # impl Event for Pinged {
//! #     const TYPE_TAG: EventTypeTag = EventTypeTag::new(1);
//! #     const NAME: &'static str = "Pinged";
//! #     type Key = u64;
//! #     fn key(&self) -> u64 { self.user }
//! # }
//! # struct Pings;
//! # impl Handler<Pinged> for Pings {
//! #     fn handle(ctx: &mut Context<'_>, events: &[Pinged]) -> Result<(), HandlerError> {
//! #         let n: u64 = ctx.get("pings")?.unwrap_or(0);
//! #         ctx.set("pings", &(n + events.len() as u64))
//! #     }
//! # }
//! # wakuwaku_guest::export_module!(Pings: Pinged);
//! use wakuwaku_guest::testing::MemoryHost;
//!
//! let mut host = MemoryHost::new();
//! host.handle::<Pings, _>(&[Pinged { user: 1 }, Pinged { user: 1 }, Pinged { user: 2 }]).unwrap();
//! assert_eq!(host.get::<u64>(&1u64, "pings"), Some(2));
//! assert_eq!(host.get::<u64>(&2u64, "pings"), Some(1));
//! ```

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;
use wakuwaku_core::key::Key;
use wakuwaku_core::limits::{
    CallTally, LogTally, PayloadLimits, check_combined_body, check_counter_count, check_entries_per_key, check_name,
    check_timer_name, check_timers_in_all, check_timers_per_key, error_message,
};
use wakuwaku_core::plan::{Plan, PlanRecord, Stage};
use wakuwaku_core::reduce::{chunks, reduce};
use wakuwaku_core::time_order::TimeOrder;
use wakuwaku_core::timers::{KeyTimers, Timer};

use crate::context::{HostApi, Outgoing, Refusal};
use crate::event::{Event, Handler, PartitionKey};
use crate::module::{
    __private::{event_time_of, key_of},
    Module,
};
use crate::types::{EventAtomicOrdering, EventTiming, EventTypeTag, HandlerError, Level};

/// A line a handler logged, as the host keeps it (cut to the limit and
/// marked; a closing `log-lines-per-call` warning when lines were dropped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// The key being handled when it was logged.
    pub key: Key,
    /// Its level.
    pub level: Level,
    /// Its text.
    pub message: String,
}

/// An in-memory host for native tests: per-key state, shared counters,
/// emitted messages and log lines, under the host's rules and limits.
///
/// Like the real host, a failed call leaves no trace in state, counters or
/// emitted messages (its log lines are kept).
#[derive(Clone, Debug, Default)]
pub struct MemoryHost {
    state: BTreeMap<Key, BTreeMap<String, Vec<u8>>>,
    timers: BTreeMap<Key, KeyTimers>,
    counters: BTreeMap<String, i64>,
    emitted: Vec<Outgoing>,
    logs: Vec<LogLine>,
    limits: PayloadLimits,
}

impl MemoryHost {
    /// An empty host with the host's default limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same host with these limits (e.g. the ones your deployment
    /// passes to `waku run`).
    pub fn with_limits(mut self, limits: PayloadLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Delivers `events` as they are, without reduction: consecutive events
    /// of one key form a run, cut into chunks of at most `E::MAX_BATCH`, and
    /// each chunk is encoded and handed to [`Module::handle`]. Stops at the
    /// first failing chunk; earlier chunks stay applied.
    pub fn handle<M, E>(&mut self, events: &[E]) -> Result<(), HandlerError>
    where
        M: Module + Handler<E>,
        E: Event,
    {
        for (key, bodies) in runs(events)? {
            self.deliver::<M>(E::TYPE_TAG.get(), E::MAX_BATCH, &key, &bodies)?;
        }
        Ok(())
    }

    /// Like [`handle`](Self::handle), but first reduces each run with `E`'s
    /// algebra with the host's own reduction (`wakuwaku_core::reduce`): an
    /// associative run of two or more events is folded into one with
    /// [`Module::combine`] (whose body must be 1 byte to the emit body
    /// limit, as in the host), an idempotent one loses adjacent duplicates,
    /// an idempotent-commutative one is sorted and loses all duplicates.
    pub fn handle_reduced<M, E>(&mut self, events: &[E]) -> Result<(), HandlerError>
    where
        M: Module + Handler<E>,
        E: Event,
    {
        let tag = E::TYPE_TAG.get();
        let limits = self.limits;
        let combine = |bodies: &[Vec<u8>]| {
            let body = M::combine(tag, bodies)?;
            check_combined_body(&limits, &body).map_err(|e| HandlerError::retryable(e.to_string()))?;
            Ok(body)
        };
        for (key, bodies) in runs(events)? {
            let bodies = reduce(E::ALGEBRA, bodies, combine)?;
            self.deliver::<M>(tag, E::MAX_BATCH, &key, &bodies)?;
        }
        Ok(())
    }

    /// Applies events of several types, as the host applies a projection's
    /// events read from several topics once it has read them all: events
    /// of untimed types as they come, in the order given (consecutive
    /// events of one key and type form a run); events of timed types
    /// ([`Event::TIMING`]) held, put in event-time order, ties in the order
    /// given (the host breaks ties by topic, then by position in the log:
    /// list the events topic by topic, each in log order), and planned as
    /// the host plans a released batch: a key's events of
    /// [`EventTiming::Timed`] types in event-time order
    /// (`event-time-order`), those of [`EventTiming::TimedRelaxed`] types
    /// moving past them as their orderings allow ([`wakuwaku_core::plan`],
    /// [`wakuwaku_core::time_order`]), key by key. Each run is cut into
    /// chunks of at most its type's `MAX_BATCH`, as in
    /// [`handle`](Self::handle), without reduction. Stops at the first
    /// failing chunk; earlier chunks stay applied.
    ///
    /// ```
    /// # use serde::{Deserialize, Serialize};
    /// # use wakuwaku_guest::{Context, Event, EventTiming, EventTypeTag, Handler, HandlerError};
    /// # use wakuwaku_guest::testing::{MemoryHost, Published};
    /// #[derive(Serialize, Deserialize)]
    /// struct Seen { id: u64, at: i64 }
    /// impl Event for Seen {
    ///     const TYPE_TAG: EventTypeTag = EventTypeTag::new(1);
    ///     const NAME: &'static str = "Seen";
    ///     const TIMING: EventTiming = EventTiming::Timed;
    ///     type Key = u64;
    ///     fn key(&self) -> u64 { self.id }
    ///     fn event_time(&self) -> Option<i64> { Some(self.at) }
    /// }
    /// struct Log;
    /// impl Handler<Seen> for Log {
    ///     fn handle(ctx: &mut Context<'_>, events: &[Seen]) -> Result<(), HandlerError> {
    ///         let mut times: Vec<i64> = ctx.get("times")?.unwrap_or_default();
    ///         times.extend(events.iter().map(|e| e.at));
    ///         ctx.set("times", &times)
    ///     }
    /// }
    /// wakuwaku_guest::export_module!(Log: Seen);
    ///
    /// let mut host = MemoryHost::new();
    /// let events = [Published::of(&Seen { id: 1, at: 30 })?, Published::of(&Seen { id: 1, at: 10 })?];
    /// host.handle_in_event_time_order::<Log>(&events)?;
    /// assert_eq!(host.get::<Vec<i64>>(&1u64, "times"), Some(vec![10, 30]));
    /// # Ok::<(), HandlerError>(())
    /// ```
    pub fn handle_in_event_time_order<M: Module>(&mut self, events: &[Published]) -> Result<(), HandlerError> {
        let (untimed, mut timed): (Vec<&Published>, Vec<&Published>) =
            events.iter().partition(|event| event.event_time.is_none());
        let mut run: Vec<Vec<u8>> = Vec::new();
        let mut ordered = untimed.into_iter().peekable();
        while let Some(event) = ordered.next() {
            run.push(event.body.clone());
            let same_run = ordered.peek().is_some_and(|next| next.tag == event.tag && next.key == event.key);
            if !same_run {
                self.deliver::<M>(event.tag, event.max_batch, &event.key, &std::mem::take(&mut run))?;
            }
        }
        // Stable: equal times keep the order given.
        timed.sort_by_key(|event| event.event_time);
        for (event, records) in planned_runs(&timed) {
            let bodies: Vec<Vec<u8>> = records.iter().map(|&index| timed[index].body.clone()).collect();
            self.deliver::<M>(event.tag, event.max_batch, &event.key, &bodies)?;
        }
        Ok(())
    }

    fn deliver<M: Module>(
        &mut self,
        tag: u32,
        max_batch: u32,
        key: &Key,
        bodies: &[Vec<u8>],
    ) -> Result<(), HandlerError> {
        for chunk in chunks(bodies, max_batch) {
            self.handle_bodies::<M>(tag, key, chunk)?;
        }
        Ok(())
    }

    /// One [`Module::handle`] call with encoded bodies, as the host makes it.
    /// On error, the call's state writes, counter changes and emitted
    /// messages are rolled back, and the error's message is cut to 4 KiB as
    /// the host cuts it.
    pub fn handle_bodies<M: Module>(&mut self, tag: u32, key: &Key, bodies: &[Vec<u8>]) -> Result<(), HandlerError> {
        self.undoable(key, |host| M::handle(&mut host.scope::<M>(key), tag, key, bodies))
    }

    /// Runs one call about `key`; when it fails, takes back what it did to
    /// the key's state and timers, the counters and the emitted messages.
    fn undoable(
        &mut self,
        key: &Key,
        call: impl FnOnce(&mut Self) -> Result<(), HandlerError>,
    ) -> Result<(), HandlerError> {
        let state = self.state.get(key).cloned();
        let timers = self.timers.get(key).cloned();
        let counters = self.counters.clone();
        let emitted = self.emitted.len();
        if let Err(error) = call(self) {
            match state {
                Some(state) => self.state.insert(key.clone(), state),
                None => self.state.remove(key),
            };
            match timers {
                Some(timers) => self.timers.insert(key.clone(), timers),
                None => self.timers.remove(key),
            };
            self.counters = counters;
            self.emitted.truncate(emitted);
            return Err(HandlerError::new(error.class, error_message(error.message)));
        }
        Ok(())
    }

    /// Moves the projection's clock to `clock` and fires every timer below
    /// it, as the host does when no event of the key is left to apply
    /// before them: each key's due timers in (time, name) order, all of
    /// one time in one [`Module::fire`] call (timers a call sets below the
    /// clock fire in turn), keys in the order of their earliest timer, then
    /// their bytes. Stops at the first failing call (its changes taken
    /// back, its timers pending again). Returns how many calls it made.
    pub fn advance<M: Module>(&mut self, clock: i64) -> Result<usize, HandlerError> {
        let mut calls = 0;
        loop {
            let next =
                self.timers.iter().filter_map(|(key, timers)| Some((timers.first_due(clock)?, key.clone()))).min();
            let Some((at, key)) = next else { return Ok(calls) };
            self.undoable(&key, |host| {
                let fired = host.timers.get_mut(&key).map(|timers| timers.take_at(at)).unwrap_or_default();
                let mut scope = host.scope::<M>(&key);
                scope.firing = Some(at);
                M::fire(&mut scope, &key, &fired)
            })?;
            self.timers.retain(|_, timers| !timers.is_empty());
            calls += 1;
        }
    }

    /// The pending timers of `key`, in firing order.
    pub fn timers(&self, key: &impl PartitionKey) -> Vec<Timer> {
        self.timers.get(&key.to_key().expect("a key")).map(KeyTimers::in_order).unwrap_or_default()
    }

    /// The [`HostApi`] of one call of module `M` about `key`, to call
    /// [`Module::handle`] or build a [`Context`](crate::Context) by hand.
    /// Its per-call counts start at zero; its writes apply at once.
    pub fn scope<M: Module>(&mut self, key: &Key) -> KeyScope<'_> {
        KeyScope {
            host: self,
            key: key.clone(),
            emits: M::describe().emits,
            tally: CallTally::default(),
            log: LogTally::default(),
            firing: None,
        }
    }

    /// A JSON state entry of `key`.
    ///
    /// # Panics
    ///
    /// If `key` has no key shape, or the entry exists but does not decode
    /// as `T`.
    pub fn get<T: DeserializeOwned>(&self, key: &impl PartitionKey, name: &str) -> Option<T> {
        let bytes = self.get_bytes(&key.to_key().expect("a key"), name)?;
        Some(
            serde_json::from_slice(bytes)
                .unwrap_or_else(|e| panic!("state entry `{name}` is not a valid {}: {e}", std::any::type_name::<T>())),
        )
    }

    /// Writes a JSON state entry of `key`, e.g. to start a test from a given
    /// read model.
    ///
    /// # Panics
    ///
    /// If `key` has no key shape or `value` cannot be encoded as JSON.
    pub fn set<T: Serialize + ?Sized>(&mut self, key: &impl PartitionKey, name: &str, value: &T) {
        let bytes = serde_json::to_vec(value).expect("state value encodes as JSON");
        self.state.entry(key.to_key().expect("a key")).or_default().insert(name.to_owned(), bytes);
    }

    /// A state entry of `key`, as bytes.
    pub fn get_bytes(&self, key: &Key, name: &str) -> Option<&[u8]> {
        self.state.get(key)?.get(name).map(Vec::as_slice)
    }

    /// The value of a shared counter (0 if never touched).
    pub fn counter(&self, name: &str) -> i64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// The messages emitted so far, in order.
    pub fn emitted(&self) -> &[Outgoing] {
        &self.emitted
    }

    /// The lines logged so far, in order.
    pub fn logs(&self) -> &[LogLine] {
        &self.logs
    }
}

/// One event of any type, as a publisher writes it: its tag, key, body and
/// event time; what [`MemoryHost::handle_in_event_time_order`] applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    /// [`Event::TYPE_TAG`].
    pub tag: u32,
    /// The key's canonical bytes.
    pub key: Key,
    /// The encoded body.
    pub body: Vec<u8>,
    /// The event time, for a timed type; `None` for an untimed one.
    pub event_time: Option<i64>,
    max_batch: u32,
    ordering: EventAtomicOrdering,
    timing: EventTiming,
}

impl Published {
    /// `event` as `waku publish` would write it. A timed type whose
    /// [`Event::event_time`] is `None` is refused as the publisher refuses
    /// it (`event-time-declared`); an untimed one has no event time,
    /// whatever `event_time` says.
    pub fn of<E: Event>(event: &E) -> Result<Self, HandlerError> {
        let event_time = match E::TIMING {
            EventTiming::Untimed => None,
            EventTiming::Timed | EventTiming::TimedRelaxed => Some(event_time_of(event)?),
        };
        Ok(Self {
            tag: E::TYPE_TAG.get(),
            key: key_of(event)?,
            body: event.encode(),
            event_time,
            max_batch: E::MAX_BATCH,
            ordering: event.atomic_ordering(),
            timing: E::TIMING,
        })
    }
}

/// The runs the host makes of `timed` events, in event-time order, in one
/// released batch: each run's first event and its records' indexes in
/// `timed`, in the order the host applies them (key by key; a segment's
/// body runs in plan order, which the host also uses).
fn planned_runs<'a>(timed: &[&'a Published]) -> Vec<(&'a Published, Vec<usize>)> {
    let mut keys: Vec<&Key> = Vec::new();
    let mut order = TimeOrder::default();
    let records: Vec<PlanRecord> = timed
        .iter()
        .map(|event| {
            let number = keys.iter().position(|key| **key == event.key).unwrap_or_else(|| {
                keys.push(&event.key);
                keys.len() - 1
            }) as u64;
            let tag = EventTypeTag::new(event.tag);
            PlanRecord { key: number, tag, ordering: order.planned(number, tag, event.timing, event.ordering) }
        })
        .collect();
    let plan = Plan::new(&records);
    let mut runs = Vec::new();
    for key in plan.keys() {
        for segment in plan.segments(key) {
            for stage in plan.stages(segment) {
                let stage_runs = match stage {
                    Stage::Head(run) | Stage::Tail(run) => std::slice::from_ref(run),
                    Stage::Body(body) => body,
                };
                for run in stage_runs {
                    let records = plan.records(run).to_vec();
                    runs.push((timed[records[0]], records));
                }
            }
        }
    }
    runs
}

/// Consecutive events of one key: the key and the encoded bodies.
type Run = (Key, Vec<Vec<u8>>);

/// The runs of `events`.
fn runs<E: Event>(events: &[E]) -> Result<Vec<Run>, HandlerError> {
    let mut runs: Vec<Run> = Vec::new();
    for event in events {
        let key = key_of(event)?;
        match runs.last_mut() {
            Some((last, bodies)) if *last == key => bodies.push(event.encode()),
            _ => runs.push((key, vec![event.encode()])),
        }
    }
    Ok(runs)
}

/// [`MemoryHost`] seen by one call about one key; see
/// [`MemoryHost::scope`]. When it is dropped, a closing log line says how
/// many lines the call dropped, if any.
#[derive(Debug)]
pub struct KeyScope<'a> {
    host: &'a mut MemoryHost,
    key: Key,
    emits: &'static [&'static str],
    tally: CallTally,
    log: LogTally,
    /// The time of the timers being fired, in a `fire` call.
    firing: Option<i64>,
}

impl KeyScope<'_> {
    fn push_log(&mut self, level: Level, message: String) {
        self.host.logs.push(LogLine { key: self.key.clone(), level, message });
    }
}

impl Drop for KeyScope<'_> {
    fn drop(&mut self) {
        if let Some(closing) = self.log.finish(&self.host.limits) {
            self.push_log(Level::Warn, closing);
        }
    }
}

impl HostApi for KeyScope<'_> {
    fn get(&mut self, name: &str) -> Result<Option<Vec<u8>>, Refusal> {
        check_name(name).map_err(|refusal| refusal.to_string())?;
        Ok(self.host.get_bytes(&self.key, name).map(<[u8]>::to_vec))
    }

    fn set(&mut self, name: &str, value: &[u8]) -> Result<(), Refusal> {
        let before = self.tally;
        self.tally.set(&self.host.limits, name, value.len()).map_err(|refusal| refusal.to_string())?;
        let entries = self.host.state.entry(self.key.clone()).or_default();
        if !entries.contains_key(name)
            && let Err(refusal) = check_entries_per_key(&self.host.limits, name, entries.len())
        {
            // Refused: the call's counts stay as they were.
            self.tally = before;
            return Err(refusal.to_string());
        }
        entries.insert(name.to_owned(), value.to_vec());
        Ok(())
    }

    fn delete(&mut self, name: &str) -> Result<(), Refusal> {
        self.tally.delete(&self.host.limits, name).map_err(|refusal| refusal.to_string())?;
        if let Some(entries) = self.host.state.get_mut(&self.key) {
            entries.remove(name);
        }
        Ok(())
    }

    fn counter_add(&mut self, name: &str, delta: i64) -> Result<(), Refusal> {
        let current = i128::from(self.host.counter(name));
        let before = self.tally;
        let next = self.tally.counter_add(&self.host.limits, name, current, delta).map_err(|r| r.to_string())?;
        if !self.host.counters.contains_key(name)
            && let Err(refusal) = check_counter_count(&self.host.limits, name, self.host.counters.len())
        {
            // Refused: the call's counts stay as they were.
            self.tally = before;
            return Err(refusal.to_string());
        }
        let next = i64::try_from(next).expect("the tally keeps counters within i64");
        self.host.counters.insert(name.to_owned(), next);
        Ok(())
    }

    fn counter_get(&mut self, name: &str) -> Result<i64, Refusal> {
        check_name(name).map_err(|refusal| refusal.to_string())?;
        Ok(self.host.counter(name))
    }

    fn emit(&mut self, message: Outgoing) -> Result<(), Refusal> {
        let limits = self.host.limits;
        let key = message.key.as_bytes();
        self.tally.emit(&limits, self.emits, &message.topic, key, &message.body).map_err(|r| r.to_string())?;
        self.host.emitted.push(message);
        Ok(())
    }

    fn log(&mut self, level: Level, message: &str) {
        if let Some(line) = self.log.admit(&self.host.limits, message) {
            let line = line.to_string();
            self.push_log(level, line);
        }
    }

    fn timer_set(&mut self, name: &str, at: i64, payload: &[u8]) -> Result<(), Refusal> {
        let limits = self.host.limits;
        let before = self.tally;
        self.tally.timer_set(&limits, name, at, payload.len(), self.firing).map_err(|r| r.to_string())?;
        let in_all: usize = self.host.timers.values().map(KeyTimers::len).sum();
        let timers = self.host.timers.entry(self.key.clone()).or_default();
        if timers.get(name).is_none() {
            let admitted = check_timers_per_key(&limits, name, timers.len())
                .and_then(|()| check_timers_in_all(&limits, name, in_all));
            if let Err(refusal) = admitted {
                // Refused: the call's counts stay as they were.
                self.tally = before;
                return Err(refusal.to_string());
            }
        }
        timers.set(Timer { name: name.to_owned(), at, payload: payload.to_vec() });
        Ok(())
    }

    fn timer_cancel(&mut self, name: &str) -> Result<(), Refusal> {
        self.tally.timer_cancel(&self.host.limits, name).map_err(|r| r.to_string())?;
        if let Some(timers) = self.host.timers.get_mut(&self.key) {
            timers.cancel(name);
        }
        Ok(())
    }

    fn timer_get(&mut self, name: &str) -> Result<Option<Timer>, Refusal> {
        check_timer_name(name).map_err(|refusal| refusal.to_string())?;
        Ok(self.host.timers.get(&self.key).and_then(|timers| timers.get(name)))
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};
    use wakuwaku_core::limits::MAX_ERROR_MESSAGE_BYTES;

    use super::*;
    use crate::context::Context;
    use crate::types::{ErrorClass, EventTypeTag};

    /// A test event: its `op` says what the handler does, `n` times.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    struct Op {
        key: u64,
        op: String,
        n: u64,
        #[serde(default)]
        arg: i64,
    }

    impl Event for Op {
        const TYPE_TAG: EventTypeTag = EventTypeTag::new(1);
        const NAME: &'static str = "Op";
        type Key = u64;
        fn key(&self) -> u64 {
            self.key
        }
    }

    struct Ops;

    impl Handler<Op> for Ops {
        fn handle(ctx: &mut Context<'_>, events: &[Op]) -> Result<(), HandlerError> {
            for event in events {
                for i in 0..event.n {
                    match event.op.as_str() {
                        "set" => ctx.set_bytes(&format!("e{i}"), &vec![1; event.arg as usize])?,
                        "add" => ctx.counter_add("c", event.arg)?,
                        "emit" => ctx.emit("out", &Op { op: "x".repeat(event.arg as usize), ..event.clone() })?,
                        "emit-elsewhere" => ctx.emit("dlq_in", event)?,
                        "log" => ctx.info(&"l".repeat(event.arg as usize)),
                        "fail" => return Err(HandlerError::retryable("e".repeat(event.arg as usize))),
                        other => panic!("unknown op {other}"),
                    }
                }
            }
            Ok(())
        }
    }

    crate::export_module!(Ops: Op; emits: ["out"]);

    fn op(op: &str, n: u64, arg: i64) -> Op {
        Op { key: 7, op: op.into(), n, arg }
    }

    fn rule_of(error: &HandlerError) -> &str {
        // "<what>: <rule>: <detail>"
        error.message.split(": ").nth(1).unwrap_or_default()
    }

    /// A click at `at`; the session of its key ends 10 ms after its last
    /// click.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    struct Click {
        key: u64,
        at: i64,
    }

    impl Event for Click {
        const TYPE_TAG: EventTypeTag = EventTypeTag::new(2);
        const NAME: &'static str = "Click";
        const TIMING: crate::EventTiming = crate::EventTiming::Timed;
        type Key = u64;
        fn key(&self) -> u64 {
            self.key
        }
        fn event_time(&self) -> Option<i64> {
            Some(self.at)
        }
    }

    /// Counts clicks per session: each click moves the `end` timer, whose
    /// payload is the count; firing it records the session and, at a
    /// payload of 99, tries to set a timer at its own time (refused).
    struct Sessions;

    impl Handler<Click> for Sessions {
        fn handle(ctx: &mut Context<'_>, events: &[Click]) -> Result<(), HandlerError> {
            for click in events {
                let count = match ctx.timer("end")? {
                    Some(timer) => serde_json::from_slice::<u64>(&timer.payload).unwrap_or(0),
                    None => 0,
                };
                ctx.set_timer("end", click.at + 10, &(count + 1))?;
            }
            Ok(())
        }
    }

    impl crate::OnTimers for Sessions {
        fn fire(ctx: &mut Context<'_>, timers: &[Timer]) -> Result<(), HandlerError> {
            let mut sessions: Vec<(i64, u64)> = ctx.get("sessions")?.unwrap_or_default();
            for timer in timers {
                let count: u64 = serde_json::from_slice(&timer.payload).unwrap_or(0);
                if count == 99 {
                    ctx.set_timer("again", timer.at, &0)?;
                }
                sessions.push((timer.at, count));
            }
            ctx.set("sessions", &sessions)
        }
    }

    crate::export_module!(Sessions: Click; timers: Sessions);

    #[test]
    fn timers_fire_when_the_clock_passes_them_in_time_order_and_keep_the_rules() {
        let mut host =
            MemoryHost::new().with_limits(PayloadLimits { max_timers_per_key: 1, ..PayloadLimits::default() });
        let clicks = [Click { key: 1, at: 100 }, Click { key: 1, at: 105 }, Click { key: 2, at: 103 }];
        host.handle::<Sessions, _>(&clicks).unwrap();
        let pending: Vec<(String, i64)> = host.timers(&1u64).into_iter().map(|t| (t.name, t.at)).collect();
        assert_eq!(pending, [("end".to_owned(), 115)], "the click at 105 moved the timer");
        assert_eq!(host.advance::<Sessions>(113).unwrap(), 0, "nothing is due below 113 but key 2's at 113");
        assert_eq!(host.advance::<Sessions>(114).unwrap(), 1);
        assert_eq!(host.get::<Vec<(i64, u64)>>(&2u64, "sessions"), Some(vec![(113, 1)]));
        assert_eq!(host.advance::<Sessions>(116).unwrap(), 1);
        assert_eq!(host.get::<Vec<(i64, u64)>>(&1u64, "sessions"), Some(vec![(115, 2)]));
        assert!(host.timers(&1u64).is_empty());
        // `timer-at-firing`: a fire call sets timers only later than them;
        // the failed call is taken back and its timer stays pending.
        let mut scope = host.scope::<Sessions>(&Key::int(3));
        scope.timer_set("end", 200, b"99").unwrap();
        let refused = scope.timer_set("more", 1, b"").unwrap_err();
        assert!(refused.starts_with("timers-per-key:"), "{refused}");
        drop(scope);
        let error = host.advance::<Sessions>(201).unwrap_err();
        assert_eq!(rule_of(&error), "timer-at-firing", "{error}");
        assert_eq!(host.timers(&3u64).len(), 1, "a failed fire keeps its timers");
        assert_eq!(host.get::<Vec<(i64, u64)>>(&3u64, "sessions"), None);
        // A module that names no timers fails if asked to fire.
        assert!(<Ops as Module>::fire(&mut host.scope::<Ops>(&Key::int(1)), &Key::int(1), &[]).is_err());
    }

    #[test]
    fn state_writes_meet_the_hosts_limits_and_a_failed_call_keeps_nothing() {
        let limits = PayloadLimits { max_state_value: 8, max_state_writes_per_call: 3, ..PayloadLimits::default() };
        let mut host = MemoryHost::new().with_limits(limits);
        let error = host.handle::<Ops, _>(&[op("set", 1, 9)]).unwrap_err();
        assert_eq!(error.class, ErrorClass::Unrecoverable);
        assert_eq!(rule_of(&error), "state-value-size", "{error}");
        let error = host.handle::<Ops, _>(&[op("set", 4, 1)]).unwrap_err();
        assert_eq!(rule_of(&error), "state-writes-per-call", "{error}");
        assert_eq!(host.get_bytes(&Key::int(7), "e0"), None, "the failed call's writes are rolled back");
        // Each call counts afresh.
        host.handle::<Ops, _>(&[op("set", 3, 1)]).unwrap();
        host.handle::<Ops, _>(&[op("set", 3, 1)]).unwrap();
        assert_eq!(host.get_bytes(&Key::int(7), "e2"), Some(&[1][..]));
    }

    #[test]
    fn counters_overflow_as_a_refusal_not_a_wrap() {
        let mut host = MemoryHost::new();
        host.handle::<Ops, _>(&[op("add", 1, i64::MAX)]).unwrap();
        let error = host.handle::<Ops, _>(&[op("add", 1, 1)]).unwrap_err();
        assert_eq!(rule_of(&error), "counter-range", "{error}");
        assert_eq!(host.counter("c"), i64::MAX);
        let limits = PayloadLimits { max_counter_changes_per_call: 2, ..PayloadLimits::default() };
        let mut host = MemoryHost::new().with_limits(limits);
        let error = host.handle::<Ops, _>(&[op("add", 3, 1)]).unwrap_err();
        assert_eq!(rule_of(&error), "counter-changes-per-call", "{error}");
        assert_eq!(host.counter("c"), 0, "the failed call's changes are rolled back");
    }

    #[test]
    fn new_counters_and_entries_stop_at_the_hosts_quotas_and_existing_ones_still_change() {
        let limits = PayloadLimits { max_counters: 1, max_entries_per_key: 2, ..PayloadLimits::default() };
        let mut host = MemoryHost::new().with_limits(limits);
        host.handle::<Ops, _>(&[op("set", 2, 1)]).unwrap();
        let error = host.handle::<Ops, _>(&[op("set", 3, 1)]).unwrap_err();
        assert_eq!(rule_of(&error), "entries-per-key", "{error}");
        assert!(error.message.contains("holds 2 entries"), "{error}");
        assert_eq!(host.get_bytes(&Key::int(7), "e2"), None);
        // Overwriting what exists passes; another key has room of its own.
        host.handle::<Ops, _>(&[op("set", 2, 4)]).unwrap();
        host.handle::<Ops, _>(&[Op { key: 8, ..op("set", 2, 1) }]).unwrap();
        host.handle::<Ops, _>(&[op("add", 1, 5)]).unwrap();
        host.handle::<Ops, _>(&[op("add", 1, -2)]).unwrap();
        assert_eq!(host.counter("c"), 3);
        let mut scope = host.scope::<Ops>(&Key::int(7));
        let refusal = HostApi::counter_add(&mut scope, "d", 1).unwrap_err();
        assert!(refusal.starts_with("counter-count: the projection holds 1 counters"), "{refusal}");
    }

    #[test]
    fn emits_go_only_to_declared_topics_within_the_limits() {
        let limits = PayloadLimits { max_emit_body: 100, max_emits_per_call: 2, ..PayloadLimits::default() };
        let mut host = MemoryHost::new().with_limits(limits);
        let error = host.handle::<Ops, _>(&[op("emit-elsewhere", 1, 0)]).unwrap_err();
        assert_eq!(rule_of(&error), "emit-topic", "{error}");
        let error = host.handle::<Ops, _>(&[op("emit", 1, 100)]).unwrap_err();
        assert_eq!(rule_of(&error), "emit-body-size", "{error}");
        let error = host.handle::<Ops, _>(&[op("emit", 3, 1)]).unwrap_err();
        assert_eq!(rule_of(&error), "emits-per-call", "{error}");
        assert!(host.emitted().is_empty());
        host.handle::<Ops, _>(&[op("emit", 2, 1)]).unwrap();
        assert_eq!(host.emitted().len(), 2);
        assert_eq!(host.emitted()[0].key, Key::int(7));
        assert_eq!(Ops::describe().emits, ["out"]);
    }

    #[test]
    fn log_lines_are_cut_and_counted_and_error_messages_cut() {
        let limits = PayloadLimits { max_log_line: 4, max_log_lines_per_call: 2, ..PayloadLimits::default() };
        let mut host = MemoryHost::new().with_limits(limits);
        host.handle::<Ops, _>(&[op("log", 5, 6)]).unwrap();
        let messages: Vec<&str> = host.logs().iter().map(|line| line.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "llll […cut]",
                "llll […cut]",
                "log-lines-per-call: 3 more log lines of this call dropped (at most 2 per call)"
            ]
        );
        assert_eq!(host.logs()[2].level, Level::Warn);
        let error = host.handle::<Ops, _>(&[op("fail", 1, 10_000)]).unwrap_err();
        assert!(error.message.len() <= MAX_ERROR_MESSAGE_BYTES + " […cut]".len() && error.message.ends_with("[…cut]"));
    }

    #[test]
    fn state_is_kept_by_key_bytes() {
        let mut host = MemoryHost::new();
        host.set(&7u64, "a", &1);
        assert_eq!(host.get::<i32>(&7u8, "a"), Some(1), "7u8 and 7u64 are one key");
        assert_eq!(host.get::<i32>(&"7", "a"), None, "the string \"7\" is another key");
    }
}
