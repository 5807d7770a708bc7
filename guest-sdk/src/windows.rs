//! Windows over a key's events, built on timers: tumbling, hopping and
//! session windows with an aggregate the author writes, an allowed
//! lateness, and each window's result emitted to a topic when it closes.
//!
//! Rules kept here (`docs/timers.md`, "Windows", says them for authors):
//! - **A window is `[start, end)` in event time.** Tumbling windows of
//!   `size` start at multiples of `size`; hopping windows of `size` start
//!   every `hop` (an event is in each of the `size / hop` windows that
//!   hold its time); a session holds events no more than `gap` apart and
//!   ends `gap` after its last event (an event that bridges two sessions
//!   merges them, with [`Aggregate::merge`]).
//! - **A window closes when the clock passes its end and the allowance**:
//!   its timer is set at `end - 1 + lateness`, so it fires after every
//!   event of the key up to that time (the host's rule for timers), then
//!   [`Windows::fire`] emits [`Aggregate::result`] to the topic and
//!   forgets the window. An event read late but within the allowance (the
//!   host applies late events at once) still joins its window.
//! - **Late beyond the allowance**: an event whose every window closed is
//!   added to none; it is counted (the counter `<name>/late`) and handed
//!   back to the author ([`Placed::Late`]).
//! - **Kept in the key's state**: the open windows and their aggregates in
//!   the entry `<name>/open`, the latest close time fired in
//!   `<name>/closed`; one timer per open window, named `<name>/<start>`.
//!   A handler declares `max-batch: 1` for the windowed type (as timers
//!   fall exactly between events only so, `docs/timers.md`).

use std::collections::BTreeMap;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Context, Event, HandlerError, Key, Timer};

/// What kind of windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// Windows of `size` ms, one after another.
    Tumbling {
        /// Their length.
        size: i64,
    },
    /// Windows of `size` ms starting every `hop` ms (`hop` divides `size`).
    Hopping {
        /// Their length.
        size: i64,
        /// How far apart they start.
        hop: i64,
    },
    /// Runs of events no more than `gap` ms apart.
    Session {
        /// The silence that ends a session.
        gap: i64,
    },
}

/// One window: `[start, end)` in event time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, serde::Deserialize)]
pub struct Window {
    /// Its first time.
    pub start: i64,
    /// One past its last time.
    pub end: i64,
}

/// What the author writes: how an event joins a window's aggregate, how
/// two sessions' aggregates merge, and the result emitted when it closes.
pub trait Aggregate {
    /// The event windowed.
    type Event;
    /// A window's aggregate, kept in the key's state as JSON.
    type State: Serialize + DeserializeOwned + Default;
    /// What a closed window emits.
    type Result: Event;
    /// Adds an event to a window's aggregate.
    fn add(state: &mut Self::State, event: &Self::Event);
    /// Merges `other` into `into` (sessions an event bridges).
    fn merge(into: &mut Self::State, other: Self::State);
    /// The result of a closed window of `key`.
    fn result(key: &Key, window: Window, state: Self::State) -> Self::Result;
}

/// Where [`Windows::add`] put an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placed {
    /// Into these windows.
    Into(Vec<Window>),
    /// Into none: every window of its time closed (beyond the allowed
    /// lateness). Counted; the author decides what else to do with it.
    Late,
}

/// Windows of one kind over a key's events, their results emitted to a
/// topic.
#[derive(Debug, Clone, Copy)]
pub struct Windows<A> {
    name: &'static str,
    kind: WindowKind,
    lateness: i64,
    topic: &'static str,
    aggregate: PhantomData<fn() -> A>,
}

/// The open windows of a key, by start.
type Open<S> = BTreeMap<i64, (i64, S)>;

impl<A: Aggregate> Windows<A> {
    /// Windows named `name` (their state entries and timers start with
    /// it) of `kind`, keeping each open `lateness` ms past its end, their
    /// results emitted to `topic`.
    pub const fn new(name: &'static str, kind: WindowKind, lateness: i64, topic: &'static str) -> Self {
        Self { name, kind, lateness, topic, aggregate: PhantomData }
    }

    fn open_entry(&self) -> String {
        format!("{}/open", self.name)
    }

    fn closed_entry(&self) -> String {
        format!("{}/closed", self.name)
    }

    fn timer_name(&self, start: i64) -> String {
        format!("{}/{start}", self.name)
    }

    /// When a window ending at `end` closes: its timer's time.
    fn closes_at(&self, end: i64) -> i64 {
        end.saturating_sub(1).saturating_add(self.lateness.max(0))
    }

    /// The tumbling or hopping windows holding time `at`.
    fn fixed_windows(&self, at: i64) -> Vec<Window> {
        let (size, hop) = match self.kind {
            WindowKind::Tumbling { size } => (size.max(1), size.max(1)),
            WindowKind::Hopping { size, hop } => (size.max(1), hop.clamp(1, size.max(1))),
            WindowKind::Session { .. } => return Vec::new(),
        };
        let last = at.div_euclid(hop) * hop;
        let mut windows = Vec::new();
        let mut start = last;
        while start > at.saturating_sub(size) {
            windows.push(Window { start, end: start.saturating_add(size) });
            start -= hop;
        }
        windows.reverse();
        windows
    }

    /// Adds `event`, of event time `at`, to its windows of the current key;
    /// opens those not open yet (setting their timers), or, if every one
    /// of them closed already, counts it late.
    pub fn add(&self, ctx: &mut Context<'_>, at: i64, event: &A::Event) -> Result<Placed, HandlerError> {
        let mut open: Open<A::State> = ctx.get(&self.open_entry())?.unwrap_or_default();
        let closed: Option<i64> = ctx.get(&self.closed_entry())?;
        let is_closed = |window: &Window| closed.is_some_and(|closed| self.closes_at(window.end) <= closed);
        let placed = match self.kind {
            WindowKind::Session { gap } => self.add_to_session(ctx, &mut open, (at, gap.max(1)), event, is_closed)?,
            _ => {
                let windows: Vec<Window> = self.fixed_windows(at).into_iter().filter(|w| !is_closed(w)).collect();
                for window in &windows {
                    let (_, state) = match open.get_mut(&window.start) {
                        Some(entry) => entry,
                        None => {
                            ctx.set_timer_bytes(&self.timer_name(window.start), self.closes_at(window.end), b"")?;
                            open.entry(window.start).or_insert((window.end, A::State::default()))
                        }
                    };
                    A::add(state, event);
                }
                windows
            }
        };
        if placed.is_empty() {
            ctx.counter_add(&format!("{}/late", self.name), 1)?;
            return Ok(Placed::Late);
        }
        ctx.set(&self.open_entry(), &open)?;
        Ok(Placed::Into(placed))
    }

    /// Adds an event at `at` to the sessions of `open` it touches (merging
    /// them), or to a new one; none if its own session would be closed.
    fn add_to_session(
        &self,
        ctx: &mut Context<'_>,
        open: &mut Open<A::State>,
        (at, gap): (i64, i64),
        event: &A::Event,
        is_closed: impl Fn(&Window) -> bool,
    ) -> Result<Vec<Window>, HandlerError> {
        let mut window = Window { start: at, end: at.saturating_add(gap) };
        let touched: Vec<i64> = open
            .iter()
            .filter(|(start, (end, _))| window.start < *end && **start < window.end)
            .map(|(s, _)| *s)
            .collect();
        if touched.is_empty() && is_closed(&window) {
            return Ok(Vec::new());
        }
        let mut state = A::State::default();
        for start in touched {
            if let Some((end, other)) = open.remove(&start) {
                ctx.cancel_timer(&self.timer_name(start))?;
                window = Window { start: window.start.min(start), end: window.end.max(end) };
                A::merge(&mut state, other);
            }
        }
        A::add(&mut state, event);
        ctx.set_timer_bytes(&self.timer_name(window.start), self.closes_at(window.end), b"")?;
        open.insert(window.start, (window.end, state));
        Ok(vec![window])
    }

    /// Closes the windows of the current key whose timers are among
    /// `timers` (others are left to the caller): emits each one's result
    /// to the topic and forgets it. Returns the windows closed.
    pub fn fire(&self, ctx: &mut Context<'_>, timers: &[Timer]) -> Result<Vec<Window>, HandlerError> {
        let prefix = format!("{}/", self.name);
        let ours: Vec<&Timer> = timers.iter().filter(|timer| timer.name.starts_with(&prefix)).collect();
        if ours.is_empty() {
            return Ok(Vec::new());
        }
        let mut open: Open<A::State> = ctx.get(&self.open_entry())?.unwrap_or_default();
        let mut closed: Option<i64> = ctx.get(&self.closed_entry())?;
        let mut done = Vec::new();
        for timer in ours {
            let Some(start) = timer.name[prefix.len()..].parse::<i64>().ok() else { continue };
            closed = Some(closed.map_or(timer.at, |closed| closed.max(timer.at)));
            let Some((end, state)) = open.remove(&start) else { continue };
            let window = Window { start, end };
            let key = ctx.key().clone();
            ctx.emit(self.topic, &A::result(&key, window, state))?;
            done.push(window);
        }
        ctx.set(&self.open_entry(), &open)?;
        ctx.set(&self.closed_entry(), &closed)?;
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    //! Each window kind in the SDK's test host against an oracle computed
    //! by sorting; events handed over as the host hands them (the clock
    //! moved to each event's time first, so the timers below it fire
    //! before it), and the allowed lateness.

    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::testing::MemoryHost;
    use crate::{EventTiming, EventTypeTag, Handler, KeyValue};

    #[derive(Debug, Clone, Serialize, Deserialize)]
    struct Click {
        key: u64,
        at: i64,
        amount: i64,
    }

    impl Event for Click {
        const TYPE_TAG: EventTypeTag = EventTypeTag::new(1);
        const NAME: &'static str = "Click";
        const MAX_BATCH: u32 = 1;
        const TIMING: EventTiming = EventTiming::Timed;
        type Key = u64;
        fn key(&self) -> u64 {
            self.key
        }
        fn event_time(&self) -> Option<i64> {
            Some(self.at)
        }
    }

    /// A closed window's total, `kind` naming the windows.
    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
    struct Total {
        kind: u8,
        key: u64,
        start: i64,
        end: i64,
        total: i64,
    }

    impl Event for Total {
        const TYPE_TAG: EventTypeTag = EventTypeTag::new(2);
        const NAME: &'static str = "Total";
        type Key = u64;
        fn key(&self) -> u64 {
            self.key
        }
    }

    /// Sums the amounts; `K` names the windows in the result.
    struct Sum<const K: u8>;

    impl<const K: u8> Aggregate for Sum<K> {
        type Event = Click;
        type State = i64;
        type Result = Total;
        fn add(state: &mut i64, event: &Click) {
            *state += event.amount;
        }
        fn merge(into: &mut i64, other: i64) {
            *into += other;
        }
        fn result(key: &Key, window: Window, total: i64) -> Total {
            let key = match key.value() {
                KeyValue::Int(key) => u64::try_from(key).unwrap_or(0),
                _ => 0,
            };
            Total { kind: K, key, start: window.start, end: window.end, total }
        }
    }

    const TUMBLING: Windows<Sum<0>> = Windows::new("tumbling", WindowKind::Tumbling { size: 10 }, 0, "totals");
    const HOPPING: Windows<Sum<1>> = Windows::new("hopping", WindowKind::Hopping { size: 10, hop: 5 }, 0, "totals");
    const SESSIONS: Windows<Sum<2>> = Windows::new("sessions", WindowKind::Session { gap: 5 }, 0, "totals");
    /// Tumbling windows kept open 5 ms past their end.
    const LENIENT: Windows<Sum<3>> = Windows::new("lenient", WindowKind::Tumbling { size: 10 }, 5, "totals");

    /// Every kind at once over the same clicks; late ones noted per key.
    struct Clicks;

    impl Handler<Click> for Clicks {
        fn handle(ctx: &mut Context<'_>, events: &[Click]) -> Result<(), HandlerError> {
            for click in events {
                TUMBLING.add(ctx, click.at, click)?;
                HOPPING.add(ctx, click.at, click)?;
                SESSIONS.add(ctx, click.at, click)?;
                if LENIENT.add(ctx, click.at, click)? == Placed::Late {
                    let mut late: Vec<i64> = ctx.get("late")?.unwrap_or_default();
                    late.push(click.at);
                    ctx.set("late", &late)?;
                }
            }
            Ok(())
        }
    }

    impl crate::OnTimers for Clicks {
        fn fire(ctx: &mut Context<'_>, timers: &[Timer]) -> Result<(), HandlerError> {
            TUMBLING.fire(ctx, timers)?;
            HOPPING.fire(ctx, timers)?;
            SESSIONS.fire(ctx, timers)?;
            LENIENT.fire(ctx, timers)?;
            Ok(())
        }
    }

    crate::export_module!(Clicks: Click; emits: ["totals"]; timers: Clicks);

    /// Hands `clicks` over as the host does, the clock moved to each one's
    /// time first, then to one past the last; returns the totals emitted.
    fn run(clicks: &[Click]) -> (MemoryHost, Vec<Total>) {
        let mut host = MemoryHost::new();
        for click in clicks {
            host.advance::<Clicks>(click.at).unwrap();
            host.handle::<Clicks, _>(std::slice::from_ref(click)).unwrap();
        }
        let end = clicks.iter().map(|click| click.at).max().unwrap_or(0) + 1;
        host.advance::<Clicks>(end).unwrap();
        let mut totals: Vec<Total> =
            host.emitted().iter().map(|out| serde_json::from_slice(&out.body).unwrap()).collect();
        totals.sort();
        (host, totals)
    }

    /// Seeded clicks of 3 keys in time order, several of one time.
    fn clicks(seed: u64, count: usize) -> Vec<Click> {
        let mut state = seed;
        let mut next = move |below: u64| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % below
        };
        let mut at = 0;
        (0..count)
            .map(|_| {
                at += next(5) as i64;
                Click { key: next(3), at, amount: next(100) as i64 }
            })
            .collect()
    }

    /// The totals the oracle gives: each key's events sorted by time, put
    /// in the windows of each kind, those ending by the final clock.
    fn oracle(clicks: &[Click]) -> Vec<Total> {
        let clock = clicks.iter().map(|click| click.at).max().unwrap_or(0) + 1;
        let mut sums: BTreeMap<(u8, u64, i64, i64), i64> = BTreeMap::new();
        let mut by_key: BTreeMap<u64, Vec<&Click>> = BTreeMap::new();
        for click in clicks {
            by_key.entry(click.key).or_default().push(click);
            let tumbling = click.at.div_euclid(10) * 10;
            *sums.entry((0, click.key, tumbling, tumbling + 10)).or_default() += click.amount;
            *sums.entry((3, click.key, tumbling, tumbling + 10)).or_default() += click.amount;
            let hop = click.at.div_euclid(5) * 5;
            for start in [hop - 5, hop] {
                *sums.entry((1, click.key, start, start + 10)).or_default() += click.amount;
            }
        }
        for (key, mut events) in by_key {
            events.sort_by_key(|click| click.at);
            let mut session: Option<(i64, i64, i64)> = None;
            for click in events {
                session = match session {
                    Some((start, last, total)) if click.at < last + 5 => Some((start, click.at, total + click.amount)),
                    Some((start, last, total)) => {
                        sums.insert((2, key, start, last + 5), total);
                        Some((click.at, click.at, click.amount))
                    }
                    None => Some((click.at, click.at, click.amount)),
                };
            }
            if let Some((start, last, total)) = session {
                sums.insert((2, key, start, last + 5), total);
            }
        }
        let lateness = |kind: u8| if kind == 3 { 5 } else { 0 };
        let mut totals: Vec<Total> = sums
            .into_iter()
            .filter(|((kind, _, _, end), _)| end - 1 + lateness(*kind) < clock)
            .map(|((kind, key, start, end), total)| Total { kind, key, start, end, total })
            .collect();
        totals.sort();
        totals
    }

    #[test]
    fn tumbling_hopping_and_session_windows_emit_what_sorting_gives() {
        for seed in 0..20 {
            let clicks = clicks(seed, 60);
            let (host, totals) = run(&clicks);
            assert_eq!(totals, oracle(&clicks), "seed {seed}");
            assert_eq!(host.counter("lenient/late"), 0, "seed {seed}: in order, nothing is late");
        }
    }

    #[test]
    fn a_late_event_within_the_allowance_joins_its_window_and_one_beyond_it_is_counted_and_handed_back() {
        let click = |at: i64, amount: i64| Click { key: 1, at, amount };
        let mut host = MemoryHost::new();
        for at_clock in [(click(1, 1), 1), (click(12, 10), 12), (click(8, 100), 12), (click(20, 1000), 20)] {
            let (click, clock) = at_clock;
            host.advance::<Clicks>(clock).unwrap();
            host.handle::<Clicks, _>(&[click]).unwrap();
        }
        // [0, 10) closed at 14 (9 + 5) when the clock reached 20, with the
        // late click at 8 in it.
        let lenient: Vec<Total> = host
            .emitted()
            .iter()
            .map(|out| serde_json::from_slice::<Total>(&out.body).unwrap())
            .filter(|total| total.kind == 3)
            .collect();
        assert_eq!(lenient, [Total { kind: 3, key: 1, start: 0, end: 10, total: 101 }]);
        // Beyond it: counted, handed back, in no window.
        host.handle::<Clicks, _>(&[click(3, 5)]).unwrap();
        assert_eq!(host.counter("lenient/late"), 1);
        assert_eq!(host.get::<Vec<i64>>(&1u64, "late"), Some(vec![3]));
        host.advance::<Clicks>(100).unwrap();
        let reopened = host.emitted().iter().filter_map(|out| serde_json::from_slice::<Total>(&out.body).ok());
        assert!(!reopened.into_iter().any(|total| total.kind == 3 && total.start == 0 && total.total != 101));
    }
}
