//! Where a batch's time goes, phase by phase, so a slow phase shows without
//! a profiler: in `waku run`'s closing summary and as the
//! `waku_batch_phase_seconds` histogram on `/metrics`.
//!
//! The phases follow the data flow of [`crate::engine::consumer`]:
//!
//! | phase | what it times |
//! | --- | --- |
//! | `poll` | reading the batch's records from the log |
//! | `decode` | parsing headers, diverting keys in retry, building the planner's input |
//! | `plan` | planning, splitting the keys over the workers, and reading the state of the batch's keys ([`crate::storage::state::StateBackend::batch_reader`]) |
//! | `reduce` | reducing runs with their algebra (`combine` calls included) |
//! | `calls` | handler calls, with routing a failed chunk |
//! | `commit` | gathering the workers' outcomes and the one state transaction |
//! | `outbox` | after the commit: publishing the outbox, indexing new retry records, storing the log's consumer offset |
//!
//! Rules it keeps:
//! - `reduce` and `calls` are summed over a batch's workers, so with
//!   several workers they can exceed the batch's wall time; the other
//!   phases run on one thread per partition.
//! - Times of several partitions (and of a whole run) are sums too: they
//!   say where the work went, not how long anyone waited.
//! - Timing costs a clock read per run of events, never per event.

use std::fmt;
use std::time::{Duration, Instant};

/// One phase of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Reading records from the log.
    Poll,
    /// Parsing headers and building the planner's input.
    Decode,
    /// Planning and splitting keys over workers.
    Plan,
    /// Reducing runs with their algebra.
    Reduce,
    /// Handler calls.
    Calls,
    /// Gathering outcomes and committing.
    Commit,
    /// Publishing the outbox after a commit.
    Outbox,
}

impl Phase {
    /// Every phase, in data-flow order.
    pub const ALL: [Phase; 7] =
        [Phase::Poll, Phase::Decode, Phase::Plan, Phase::Reduce, Phase::Calls, Phase::Commit, Phase::Outbox];

    /// The phase's name, as the metric's `phase` label and the summary show it.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Poll => "poll",
            Phase::Decode => "decode",
            Phase::Plan => "plan",
            Phase::Reduce => "reduce",
            Phase::Calls => "calls",
            Phase::Commit => "commit",
            Phase::Outbox => "outbox",
        }
    }
}

/// Time spent per phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhaseTimes {
    times: [Duration; Phase::ALL.len()],
}

impl PhaseTimes {
    /// The time spent in `phase`.
    pub fn get(&self, phase: Phase) -> Duration {
        self.times[phase as usize]
    }

    /// Adds `time` to `phase`.
    pub fn add(&mut self, phase: Phase, time: Duration) {
        self.times[phase as usize] += time;
    }

    /// Adds every phase of `other`.
    pub fn absorb(&mut self, other: &PhaseTimes) {
        for phase in Phase::ALL {
            self.add(phase, other.get(phase));
        }
    }

    /// The phases that took any time, with their times, in data-flow order.
    pub fn iter(&self) -> impl Iterator<Item = (Phase, Duration)> + '_ {
        Phase::ALL.into_iter().map(|phase| (phase, self.get(phase))).filter(|(_, time)| !time.is_zero())
    }

    /// The sum of every phase.
    pub fn total(&self) -> Duration {
        self.times.iter().sum()
    }
}

impl fmt::Display for PhaseTimes {
    /// `poll 0.12 s (3%), decode 0.40 s (10%), …`; phases that took no time
    /// are left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.total().as_secs_f64().max(1e-9);
        for (index, (phase, time)) in self.iter().enumerate() {
            let secs = time.as_secs_f64();
            let separator = if index == 0 { "" } else { ", " };
            write!(f, "{separator}{} {secs:.2} s ({:.0}%)", phase.name(), 100.0 * secs / total)?;
        }
        Ok(())
    }
}

/// A stopwatch over consecutive phases: each lap adds the time since the
/// previous lap to a phase, so back-to-back phases share one clock read.
#[derive(Debug)]
pub struct Laps {
    last: Instant,
}

impl Laps {
    /// Starts timing now.
    pub fn start() -> Self {
        Self { last: Instant::now() }
    }

    /// Adds the time since the last lap (or the start) to `phase`.
    pub fn lap(&mut self, times: &mut PhaseTimes, phase: Phase) {
        let now = Instant::now();
        times.add(phase, now - self.last);
        self.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_add_up_per_phase_and_show_in_flow_order() {
        let mut times = PhaseTimes::default();
        times.add(Phase::Commit, Duration::from_millis(250));
        times.add(Phase::Poll, Duration::from_millis(500));
        let mut other = PhaseTimes::default();
        other.add(Phase::Commit, Duration::from_millis(250));
        times.absorb(&other);
        assert_eq!(times.get(Phase::Commit), Duration::from_millis(500));
        assert_eq!(times.total(), Duration::from_secs(1));
        assert_eq!(times.to_string(), "poll 0.50 s (50%), commit 0.50 s (50%)");
        assert_eq!(PhaseTimes::default().to_string(), "");
    }

    #[test]
    fn a_lap_charges_the_time_since_the_last_one() {
        let mut times = PhaseTimes::default();
        let mut laps = Laps::start();
        std::thread::sleep(Duration::from_millis(5));
        laps.lap(&mut times, Phase::Reduce);
        laps.lap(&mut times, Phase::Calls);
        assert!(times.get(Phase::Reduce) >= Duration::from_millis(5));
        assert_eq!(times.total(), times.get(Phase::Reduce) + times.get(Phase::Calls));
        assert_eq!(times.get(Phase::Poll), Duration::ZERO);
    }
}
