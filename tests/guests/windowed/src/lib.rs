//! A test module of the guest SDK's windows (`wakuwaku_guest::windows`),
//! for the tests that run them through the real host
//! (`host/tests/all/windows.rs`).
//!
//! Every [`Click`] (tag 80, timed, `max-batch: 1`) of a key goes into three
//! kinds of windows at once, each summing the clicks' amounts:
//!
//! | windows | kind | allowed lateness |
//! | --- | --- | --- |
//! | `tumbling` | [`TUMBLING_SIZE`] ms | [`TUMBLING_LATENESS`] ms |
//! | `hopping` | [`HOPPING_SIZE`] ms every [`HOPPING_HOP`] ms | 0 |
//! | `sessions` | a gap of [`SESSION_GAP`] ms | [`SESSION_LATENESS`] ms |
//!
//! Each closed window emits a [`Total`] (tag 81) to the topic `totals`.
//! A click too late for every window of a kind is counted by the SDK (the
//! counter `<windows>/late`), and its key's entry `late` lists its time.

use serde::{Deserialize, Serialize};
use wakuwaku_guest::windows::{Aggregate, Placed, Window, WindowKind, Windows};
use wakuwaku_guest::{
    Context, Event, EventTiming, EventTypeTag, Handler, HandlerError, Key, KeyValue, OnTimers, Timer,
};

/// The tumbling windows' length.
pub const TUMBLING_SIZE: i64 = 1_000;
/// How long the tumbling windows stay open past their end.
pub const TUMBLING_LATENESS: i64 = 200;
/// The hopping windows' length.
pub const HOPPING_SIZE: i64 = 1_000;
/// How far apart the hopping windows start.
pub const HOPPING_HOP: i64 = 250;
/// The silence that ends a session.
pub const SESSION_GAP: i64 = 300;
/// How long a session stays open past its end.
pub const SESSION_LATENESS: i64 = 100;

/// A click: its key, event time and amount.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Click {
    /// The key.
    pub key: u64,
    /// Its event time.
    pub at: i64,
    /// What it adds.
    pub amount: i64,
}

impl Event for Click {
    const TYPE_TAG: EventTypeTag = EventTypeTag::new(80);
    const NAME: &'static str = "Click";
    // Windows close exactly between events only so (docs/timers.md).
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

/// A closed window's total.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Total {
    /// Which windows: `tumbling`, `hopping` or `sessions`.
    pub windows: String,
    /// The key.
    pub key: u64,
    /// The window's first time.
    pub start: i64,
    /// One past its last time.
    pub end: i64,
    /// How many clicks it holds.
    pub clicks: u64,
    /// Their amounts' sum.
    pub sum: i64,
}

impl Event for Total {
    const TYPE_TAG: EventTypeTag = EventTypeTag::new(81);
    const NAME: &'static str = "WindowTotal";
    type Key = u64;

    fn key(&self) -> u64 {
        self.key
    }
}

/// A window's aggregate: how many clicks, and their sum.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Sum {
    clicks: u64,
    sum: i64,
}

/// Sums clicks; `K` says which windows (0 tumbling, 1 hopping, 2 sessions).
pub struct Summed<const K: u8>;

impl<const K: u8> Aggregate for Summed<K> {
    type Event = Click;
    type State = Sum;
    type Result = Total;

    fn add(state: &mut Sum, click: &Click) {
        state.clicks += 1;
        state.sum += click.amount;
    }

    fn merge(into: &mut Sum, other: Sum) {
        into.clicks += other.clicks;
        into.sum += other.sum;
    }

    fn result(key: &Key, window: Window, state: Sum) -> Total {
        let key = match key.value() {
            KeyValue::Int(key) => u64::try_from(key).unwrap_or(0),
            _ => 0,
        };
        let windows = ["tumbling", "hopping", "sessions"][usize::from(K.min(2))].to_owned();
        Total { windows, key, start: window.start, end: window.end, clicks: state.clicks, sum: state.sum }
    }
}

const TUMBLING: Windows<Summed<0>> =
    Windows::new("tumbling", WindowKind::Tumbling { size: TUMBLING_SIZE }, TUMBLING_LATENESS, "totals");
const HOPPING: Windows<Summed<1>> =
    Windows::new("hopping", WindowKind::Hopping { size: HOPPING_SIZE, hop: HOPPING_HOP }, 0, "totals");
const SESSIONS: Windows<Summed<2>> =
    Windows::new("sessions", WindowKind::Session { gap: SESSION_GAP }, SESSION_LATENESS, "totals");

/// The module.
pub struct Windowed;

impl Handler<Click> for Windowed {
    fn handle(ctx: &mut Context<'_>, events: &[Click]) -> Result<(), HandlerError> {
        for click in events {
            let placed = [
                TUMBLING.add(ctx, click.at, click)?,
                HOPPING.add(ctx, click.at, click)?,
                SESSIONS.add(ctx, click.at, click)?,
            ];
            if placed.contains(&Placed::Late) {
                let mut late: Vec<i64> = ctx.get("late")?.unwrap_or_default();
                late.push(click.at);
                ctx.set("late", &late)?;
            }
        }
        Ok(())
    }
}

impl OnTimers for Windowed {
    fn fire(ctx: &mut Context<'_>, timers: &[Timer]) -> Result<(), HandlerError> {
        TUMBLING.fire(ctx, timers)?;
        HOPPING.fire(ctx, timers)?;
        SESSIONS.fire(ctx, timers)?;
        Ok(())
    }
}

wakuwaku_guest::export_module!(Windowed: Click; emits: ["totals"]; timers: Windowed);
