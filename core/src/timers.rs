//! Per-key event-time timers: what a key's pending timers are, and where
//! each one fires among the key's released events. Pure, like the release
//! stage ([`crate::release`]) it follows: the host hands it the places of a
//! key's released events and the projection's clock; it answers which
//! events go next and when the key's due timers fire. No I/O, no wall
//! clock: a timer fires only because the clock, which moves on the log's
//! evidence alone, passed its time.
//!
//! # Rules kept here (`docs/timers.md` says them for authors)
//!
//! - **A timer belongs to one key and has a name.** A key holds at most one
//!   timer per name ([`KeyTimers`]): setting a name again moves that timer
//!   (its time and payload are replaced); cancelling a name that holds none
//!   changes nothing.
//! - **Due when the clock passes it.** A timer at `t` is due once the
//!   projection's clock is above `t`: the clock is exclusive, as for events
//!   ([`crate::release`]: an event at `t` is released once the clock is
//!   above `t`), so a timer is due exactly when an event of its time would
//!   be released, and never earlier. Nothing else makes a timer due: no
//!   wall clock, no idle time.
//! - **Its place among the key's events.** A due timer at `t` fires after
//!   every released event of its key at or before `t`, and before the
//!   key's first event later than `t` that the module has not been handed
//!   yet ([`Agenda`]). An event at exactly `t` goes first: the timer sees
//!   everything of its time.
//! - **Events without a place in time** ([`Place::Anywhere`]: untimed and
//!   timed-relaxed events, which are applied as they arrive or as their
//!   ordering allows, and late events, which are applied at once, out of
//!   order) neither hold a timer back nor wait for one: a timer fires
//!   before the first *timed* event later than it, wherever the others
//!   fall around it.
//! - **Timers of one key fire in time order; ties by name.** Due timers
//!   fire in ascending `(time, name)` (names compared as bytes), a rule
//!   that needs no counter and reads the same on every run. All the key's
//!   timers of one time fire in one call, in that order ([`Next::Fire`]).
//! - **A timer set during a call** is placed among the events the module
//!   has not been handed yet: it fires after the call that set it, at the
//!   earliest, and before the first later event not yet handed over. A
//!   timer set for a time the key's events already passed (below the last
//!   event handed over) so fires right after that call. The host tells the
//!   agenda after each call how far it has handed events over
//!   ([`Agenda::handed`]); events of the same call are already handed over,
//!   so a module that needs a timer set by one event placed exactly among
//!   the next ones declares `max-batch: 1` for that type (what the SDKs'
//!   windows do).
//! - **A call that fires timers may set timers only later than them**
//!   ([`later_than_firing`], rule `timer-at-firing`): during the call for
//!   the timers at `t`, a timer at `t` or before is refused. So a key's
//!   firing always moves forward and one release ends, whatever the module
//!   does.
//! - **The same sequence however the log is polled.** For a key's timed
//!   events (and calls of one event each), the sequence of events handed
//!   over and timers fired does not depend on how the clock moved to get
//!   there: one release up to a clock, or many releases in between, give
//!   the same sequence (the exhaustive test at the bottom checks it over
//!   every way of moving the clock). So a reset or a rebuild, which poll
//!   the log differently, fire the same timers in the same places.
//! - **Bounded.** The timers a key holds, the timers a projection holds and
//!   the bytes of each are bounded by the host's limits
//!   ([`crate::limits`]: `timers-per-key`, `timers-in-all`, `timer-name`,
//!   `timer-payload-size`); a timer at `Millis::MAX`, which no clock passes,
//!   is refused (`timer-time`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::release::Millis;

/// One pending timer of a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Timer {
    /// Its name, unique among the key's timers.
    pub name: String,
    /// The event time it fires at, in milliseconds since the Unix epoch.
    pub at: Millis,
    /// What the module gave it to carry to the call that fires it.
    pub payload: Vec<u8>,
}

impl Timer {
    /// The order timers fire in: time, then name.
    fn order(&self) -> (Millis, &str) {
        (self.at, &self.name)
    }

    /// What it costs to keep: its name and payload, and the bookkeeping of
    /// one timer ([`TIMER_OVERHEAD`]).
    pub fn bytes(&self) -> usize {
        self.name.len() + self.payload.len() + TIMER_OVERHEAD
    }
}

/// What one timer costs besides its name and payload (its time, the key's
/// reference to it, the index by time): counted against the batch budget
/// and shown in the pending bytes.
pub const TIMER_OVERHEAD: usize = 32;

/// The pending timers of one key, at most one per name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyTimers {
    /// By name: time and payload.
    by_name: BTreeMap<String, (Millis, Vec<u8>)>,
}

impl KeyTimers {
    /// A key's timers from a list (as stored), the last of a name winning.
    pub fn from_timers(timers: impl IntoIterator<Item = Timer>) -> Self {
        let mut key = Self::default();
        for timer in timers {
            key.set(timer);
        }
        key
    }

    /// Sets a timer: a new one, or the one of its name moved. Returns the
    /// one it replaced.
    pub fn set(&mut self, timer: Timer) -> Option<Timer> {
        let Timer { name, at, payload } = timer;
        self.by_name.insert(name.clone(), (at, payload)).map(|(at, payload)| Timer { name, at, payload })
    }

    /// Cancels the timer of this name; returns it, or none if there was none.
    pub fn cancel(&mut self, name: &str) -> Option<Timer> {
        self.by_name.remove_entry(name).map(|(name, (at, payload))| Timer { name, at, payload })
    }

    /// The timer of this name.
    pub fn get(&self, name: &str) -> Option<Timer> {
        self.by_name.get(name).map(|(at, payload)| Timer { name: name.to_owned(), at: *at, payload: payload.clone() })
    }

    /// How many timers the key holds.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether the key holds none.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// What its timers cost to keep ([`Timer::bytes`]).
    pub fn bytes(&self) -> usize {
        self.by_name.iter().map(|(name, (_, payload))| name.len() + payload.len() + TIMER_OVERHEAD).sum()
    }

    /// The time of its earliest timer.
    pub fn next_at(&self) -> Option<Millis> {
        self.by_name.values().map(|(at, _)| *at).min()
    }

    /// Its timers in firing order: time, then name.
    pub fn in_order(&self) -> Vec<Timer> {
        let mut timers: Vec<Timer> = self
            .by_name
            .iter()
            .map(|(name, (at, payload))| Timer { name: name.clone(), at: *at, payload: payload.clone() })
            .collect();
        timers.sort_by(|a, b| a.order().cmp(&b.order()));
        timers
    }

    /// The time of the earliest timer that is due under `clock` (below it).
    pub fn first_due(&self, clock: Millis) -> Option<Millis> {
        self.next_at().filter(|&at| at < clock)
    }

    /// Removes and returns every timer at exactly `at`, in name order: the
    /// timers one [`Next::Fire`] fires.
    pub fn take_at(&mut self, at: Millis) -> Vec<Timer> {
        let names: Vec<String> = self.by_name.iter().filter(|(_, (t, _))| *t == at).map(|(n, _)| n.clone()).collect();
        names.iter().filter_map(|name| self.cancel(name)).collect()
    }
}

/// Where a released event takes its place for the key's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Place {
    /// A timed event released in event-time order, at this time: due timers
    /// before its time fire before it.
    At(Millis),
    /// An event with no place in time for timers: untimed, timed-relaxed,
    /// or late. It holds no timer back.
    Anywhere,
}

/// What the host does next for a key in one release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Hand these events (indices into the key's released events) to the
    /// module, through the planner as usual, reporting after each call how
    /// far it got ([`Agenda::handed`]). No due timer fires among them.
    Events(std::ops::Range<usize>),
    /// Fire the key's timers at this time ([`KeyTimers::take_at`]) in one
    /// call, before any further event.
    Fire(Millis),
    /// Nothing more: every released event was handed over and no timer is
    /// due.
    Done,
}

/// The order of one key's events and due timers in one release: the host
/// asks [`Agenda::next`] what comes next until [`Next::Done`].
#[derive(Debug, Clone)]
pub struct Agenda {
    /// The places of the key's released events, in the order released.
    places: Vec<Place>,
    /// The first event not handed over yet.
    next: usize,
    /// The end of the events last given out by [`Next::Events`].
    given_to: usize,
    /// The projection's clock after this release.
    clock: Millis,
}

impl Agenda {
    /// The agenda of a key whose released events have these places, with
    /// the projection's clock at `clock` after the release.
    pub fn new(places: Vec<Place>, clock: Millis) -> Self {
        Self { places, next: 0, given_to: 0, clock }
    }

    /// What comes next, given the key's pending timers now.
    pub fn next(&mut self, timers: &KeyTimers) -> Next {
        let due = timers.first_due(self.clock);
        if self.next < self.places.len() {
            let end = match due {
                None => self.places.len(),
                Some(due) => self.place_of(due),
            };
            if end > self.next {
                self.given_to = end;
                return Next::Events(self.next..end);
            }
        }
        match due {
            Some(at) => Next::Fire(at),
            None => Next::Done,
        }
    }

    /// The index before which a timer at `at` fires: the first event not
    /// handed over that is timed and later than it; the end if none is.
    fn place_of(&self, at: Millis) -> usize {
        (self.next..self.places.len())
            .find(|&index| matches!(self.places[index], Place::At(time) if time > at))
            .unwrap_or(self.places.len())
    }

    /// The host handed events up to (not including) `to` over to the
    /// module, in a call that may have set timers. Returns whether the
    /// events given out by the last [`Next::Events`] must stop there: a
    /// timer now due fires before the next of them, so the host hands no
    /// more of them and asks [`Agenda::next`] again.
    pub fn handed(&mut self, to: usize, timers: &KeyTimers) -> bool {
        self.next = self.next.max(to.min(self.places.len()));
        if self.next >= self.given_to {
            return false;
        }
        match timers.first_due(self.clock) {
            Some(due) => self.place_of(due) == self.next,
            None => false,
        }
    }

    /// The first event not handed over yet.
    pub fn position(&self) -> usize {
        self.next
    }
}

/// Whether a timer at `at` may be set during the call that fires the timers
/// at `firing` (rule `timer-at-firing`): only later than them.
pub fn later_than_firing(at: Millis, firing: Millis) -> bool {
    at > firing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timer(name: &str, at: Millis) -> Timer {
        Timer { name: name.to_owned(), at, payload: name.as_bytes().to_vec() }
    }

    /// One thing in a key's sequence: an event (its index) or a timer fired.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Step {
        Event(usize),
        Fired(String, Millis),
    }

    /// What the simulated module does when handed an event or fired timers:
    /// timers to set (name, time) and names to cancel.
    type Module<'a> = &'a dyn Fn(&Step) -> (Vec<(String, Millis)>, Vec<String>);

    /// Runs one release for a key: events `places` (numbered from `base` in
    /// the key's whole sequence), handed one per call, with the clock at
    /// `clock`, the module reacting to each.
    fn release(
        base: usize,
        places: &[Place],
        clock: Millis,
        timers: &mut KeyTimers,
        module: Module,
        out: &mut Vec<Step>,
    ) -> Result<(), String> {
        let mut agenda = Agenda::new(places.to_vec(), clock);
        let mut guard = 0;
        loop {
            guard += 1;
            if guard > 10_000 {
                return Err("the release does not end".into());
            }
            match agenda.next(timers) {
                Next::Done => return Ok(()),
                Next::Events(range) => {
                    for index in range {
                        let step = Step::Event(base + index);
                        react(module, &step, None, timers)?;
                        out.push(step);
                        if agenda.handed(index + 1, timers) {
                            break;
                        }
                    }
                }
                Next::Fire(at) => {
                    let fired = timers.take_at(at);
                    assert!(!fired.is_empty());
                    let names: Vec<&str> = fired.iter().map(|t| t.name.as_str()).collect();
                    assert!(names.is_sorted(), "ties fire in name order");
                    for t in fired.iter() {
                        assert!(t.at < clock, "a timer fires only once the clock passed it");
                        let step = Step::Fired(t.name.clone(), t.at);
                        react(module, &step, Some(at), timers)?;
                        out.push(step);
                    }
                }
            }
        }
    }

    fn react(module: Module, step: &Step, firing: Option<Millis>, timers: &mut KeyTimers) -> Result<(), String> {
        let (sets, cancels) = module(step);
        for (name, at) in sets {
            if firing.is_some_and(|firing| !later_than_firing(at, firing)) {
                continue; // refused, as the host refuses it
            }
            timers.set(timer(&name, at));
        }
        for name in cancels {
            timers.cancel(&name);
        }
        Ok(())
    }

    /// Every sequence over `alphabet` of length at most `max`.
    fn sequences<T: Clone>(alphabet: &[T], max: usize) -> Vec<Vec<T>> {
        let mut all = vec![vec![]];
        let mut last = vec![vec![]];
        for _ in 0..max {
            let mut next = Vec::new();
            for seq in &last {
                for a in alphabet {
                    let mut longer: Vec<T> = seq.clone();
                    longer.push(a.clone());
                    next.push(longer);
                }
            }
            all.extend(next.iter().cloned());
            last = next;
        }
        all
    }

    /// The oracle for timers set before the release and a module that sets
    /// nothing: events and timers merged by time, an event before a timer
    /// of its time, timers by name among themselves, events in released
    /// order; only timers below the clock.
    fn merged(times: &[Millis], timers: &[Timer], clock: Millis) -> Vec<Step> {
        let mut all: Vec<((Millis, u8, String, usize), Step)> = times
            .iter()
            .enumerate()
            .map(|(i, &t)| ((t, 0, String::new(), i), Step::Event(i)))
            .chain(
                timers
                    .iter()
                    .filter(|t| t.at < clock)
                    .map(|t| ((t.at, 1, t.name.clone(), 0), Step::Fired(t.name.clone(), t.at))),
            )
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.into_iter().map(|(_, step)| step).collect()
    }

    /// Released events are in event-time order: sorted sequences only.
    fn sorted_sequences(alphabet: &[Millis], max: usize) -> Vec<Vec<Millis>> {
        sequences(alphabet, max).into_iter().filter(|s| s.is_sorted()).collect()
    }

    #[test]
    fn pending_timers_fire_between_events_by_time_then_name() {
        let timer_sets = sequences(&[("a", 0), ("a", 1), ("b", 1), ("b", 2), ("c", 3)], 3);
        let mut checked = 0;
        for times in sorted_sequences(&[0, 1, 2], 4) {
            for set in &timer_sets {
                let key = KeyTimers::from_timers(set.iter().map(|&(n, at)| timer(n, at)));
                for clock in 0..=4 {
                    let released: Vec<Millis> = times.iter().copied().filter(|&t| t < clock).collect();
                    let places: Vec<Place> = released.iter().map(|&t| Place::At(t)).collect();
                    let (mut timers, mut out) = (key.clone(), Vec::new());
                    release(0, &places, clock, &mut timers, &|_| (vec![], vec![]), &mut out).unwrap();
                    assert_eq!(out, merged(&released, &key.in_order(), clock), "{times:?} {set:?} clock {clock}");
                    // What is left is exactly what the clock has not passed.
                    assert!(timers.in_order().iter().all(|t| t.at >= clock));
                    assert_eq!(timers.len(), key.in_order().iter().filter(|t| t.at >= clock).count());
                    checked += 1;
                }
            }
        }
        assert!(checked > 10_000, "{checked}");
    }

    #[test]
    fn events_without_a_place_hold_no_timer_back() {
        // A timer at 1 among untimed (None) and timed events: it fires
        // before the first timed event later than 1, and untimed events
        // keep their released order around it.
        for places in sequences(&[Place::Anywhere, Place::At(0), Place::At(2)], 4) {
            let timed: Vec<Millis> =
                places.iter().filter_map(|p| if let Place::At(t) = p { Some(*t) } else { None }).collect();
            if !timed.is_sorted() {
                continue;
            }
            let mut timers = KeyTimers::from_timers([timer("t", 1)]);
            let mut out = Vec::new();
            release(0, &places, 3, &mut timers, &|_| (vec![], vec![]), &mut out).unwrap();
            let fired_at = out.iter().position(|s| matches!(s, Step::Fired(..))).expect("it fires");
            let first_later = places.iter().position(|p| *p == Place::At(2)).unwrap_or(places.len());
            assert_eq!(fired_at, first_later, "{places:?}: {out:?}");
            let events: Vec<Step> = out.iter().filter(|s| matches!(s, Step::Event(_))).cloned().collect();
            assert_eq!(events, (0..places.len()).map(Step::Event).collect::<Vec<_>>());
        }
    }

    /// A module that sets and cancels timers as it goes, the same way on
    /// every run: each event at `t` sets `w<t>` at `t + 1` (a window that
    /// closes after its event) and moves `s` to `t + 2` (a session that
    /// ends after silence); each fired `w<t>` sets `x` at `t + 2` (later
    /// than it, as the rule wants) and tries one at `t` (refused); an event
    /// at 3 cancels `s` after moving it.
    fn module(times: &[Millis]) -> impl Fn(&Step) -> (Vec<(String, Millis)>, Vec<String>) + '_ {
        move |step| match step {
            Step::Event(i) => {
                let t = times[*i];
                let cancels = if t == 3 { vec!["s".to_owned()] } else { vec![] };
                (vec![(format!("w{t}"), t + 1), ("s".to_owned(), t + 2)], cancels)
            }
            Step::Fired(name, at) if name.starts_with('w') => {
                (vec![("x".to_owned(), at + 2), ("refused".to_owned(), *at)], vec![])
            }
            Step::Fired(..) => (vec![], vec![]),
        }
    }

    /// Every way of moving the clock from `from` to `to` in steps.
    fn clock_paths(from: Millis, to: Millis) -> Vec<Vec<Millis>> {
        if from >= to {
            return vec![vec![]];
        }
        let mut paths = Vec::new();
        for next in from + 1..=to {
            for mut rest in clock_paths(next, to) {
                rest.insert(0, next);
                paths.push(rest);
            }
        }
        paths
    }

    /// Runs a key's events through releases at the clocks of `path`.
    fn run_path(times: &[Millis], path: &[Millis]) -> Vec<Step> {
        let module = module(times);
        let (mut timers, mut out, mut released) = (KeyTimers::default(), Vec::new(), 0);
        for &clock in path {
            let upto = times.iter().take_while(|&&t| t < clock).count();
            let places: Vec<Place> = times[released..upto].iter().map(|&t| Place::At(t)).collect();
            release(released, &places, clock, &mut timers, &module, &mut out).unwrap();
            released = upto;
        }
        out
    }

    #[test]
    fn the_sequence_is_the_same_however_the_clock_moves() {
        let paths = clock_paths(0, 7);
        assert_eq!(paths.len(), 64);
        let mut checked = 0;
        for times in sorted_sequences(&[0, 1, 2, 3], 4) {
            let once = run_path(&times, &[7]);
            for path in &paths {
                assert_eq!(run_path(&times, path), once, "{times:?} clock {path:?}");
                checked += 1;
            }
            // Every timer fired once the clock passed it, in place: after
            // every event at or before it, before every later one (the
            // module sets each before any later event is handed over).
            for (i, step) in once.iter().enumerate() {
                if let Step::Fired(_, at) = step {
                    for (j, other) in once.iter().enumerate() {
                        if let Step::Event(e) = other {
                            assert_eq!(j < i, times[*e] <= *at, "{times:?}: {once:?}");
                        }
                    }
                }
            }
            // Fired timers among themselves: by time, never one twice at a
            // time; `refused` never fires (set at its firing time).
            let fired: Vec<(Millis, &str)> = once
                .iter()
                .filter_map(|s| if let Step::Fired(n, at) = s { Some((*at, n.as_str())) } else { None })
                .collect();
            assert!(fired.is_sorted(), "{fired:?}");
            assert!(fired.iter().all(|(_, n)| *n != "refused"));
            if times.contains(&3) {
                assert!(!fired.iter().any(|&(at, n)| n == "s" && at >= 3), "cancelled before it was due: {fired:?}");
            }
        }
        assert!(checked > 4_000, "{checked}");
    }

    #[test]
    fn a_timer_set_in_the_past_fires_right_after_the_call_that_set_it() {
        // Events at 5 and 9, handed one per call; handling 5 sets `late` at
        // 2 (before the event): it fires before 9, right after 5.
        let places = [Place::At(5), Place::At(9)];
        let mut timers = KeyTimers::default();
        let module = |step: &Step| match step {
            Step::Event(0) => (vec![("late".to_owned(), 2)], vec![]),
            _ => (vec![], vec![]),
        };
        let mut out = Vec::new();
        release(0, &places, 10, &mut timers, &module, &mut out).unwrap();
        assert_eq!(out, [Step::Event(0), Step::Fired("late".into(), 2), Step::Event(1)]);
    }

    #[test]
    fn events_of_one_call_are_handed_over_and_a_timer_set_in_it_fires_after_the_call() {
        // A run of 5, 7 and 9 in one call: a timer at 6 set while handling
        // it fires after the call, as the rule says, and the agenda does not
        // ask the host to stop (the events are handed over).
        let mut agenda = Agenda::new(vec![Place::At(5), Place::At(7), Place::At(9), Place::At(11)], 20);
        let mut timers = KeyTimers::default();
        assert_eq!(agenda.next(&timers), Next::Events(0..4));
        timers.set(timer("t", 6));
        assert!(agenda.handed(3, &timers), "the timer fires before 11, which is not handed over");
        assert_eq!(agenda.next(&timers), Next::Fire(6));
        assert_eq!(timers.take_at(6), [timer("t", 6)]);
        assert_eq!(agenda.next(&timers), Next::Events(3..4));
        assert!(!agenda.handed(4, &timers));
        assert_eq!(agenda.next(&timers), Next::Done);
    }

    #[test]
    fn a_timer_at_the_clock_waits_and_the_largest_time_never_fires() {
        let mut timers = KeyTimers::from_timers([timer("now", 7), timer("never", Millis::MAX)]);
        let mut agenda = Agenda::new(vec![Place::At(6)], 7);
        assert_eq!(agenda.next(&timers), Next::Events(0..1));
        assert!(!agenda.handed(1, &timers));
        assert_eq!(agenda.next(&timers), Next::Done, "a timer at the clock waits, as an event at it does");
        let mut agenda = Agenda::new(vec![], Millis::MAX);
        assert_eq!(agenda.next(&timers), Next::Fire(7));
        timers.take_at(7);
        assert_eq!(agenda.next(&timers), Next::Done, "no clock passes the largest time");
    }

    #[test]
    fn setting_a_name_again_moves_its_timer_and_cancelling_returns_it() {
        let mut timers = KeyTimers::default();
        assert_eq!(timers.set(timer("a", 5)), None);
        assert_eq!(timers.set(Timer { name: "a".into(), at: 3, payload: vec![9] }), Some(timer("a", 5)));
        timers.set(timer("b", 3));
        assert_eq!(timers.len(), 2);
        assert_eq!(timers.next_at(), Some(3));
        assert_eq!(timers.in_order().iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(timers.bytes(), 1 + 1 + 1 + 1 + 2 * TIMER_OVERHEAD);
        assert_eq!(timers.cancel("a").map(|t| t.payload), Some(vec![9]));
        assert_eq!(timers.cancel("a"), None);
        assert_eq!(timers.first_due(3), None);
        assert_eq!(timers.first_due(4), Some(3));
        assert_eq!(timers.get("b"), Some(timer("b", 3)));
    }
}
