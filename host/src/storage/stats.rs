//! A projection's statistics: the counts, in events or messages, that are
//! kept with its state and committed with the batches that change them.
//!
//! [`Stat`] names each count; [`Stats`] holds a set of them (the deltas of
//! a commit, or a store's totals). This module is the one place where a
//! count becomes its persisted name and back ([`Stat::name`],
//! [`Stat::from_name`]); the stores turn those names into rows, and nothing
//! else reads or writes a statistic by its name.
//!
//! # The rules it keeps
//! - **Persisted names never change.** State files and PostgreSQL tables
//!   written by earlier hosts hold these names; renaming a variant's
//!   [`Stat::name`] would lose its count.
//! - **Unknown names are kept, not dropped.** A store may hold a count this
//!   host does not know (written by a newer host). [`Stats::add_named`]
//!   keeps it under its name ([`Stats::unknown`]), so it is copied (a
//!   reset keeps the counts, [`crate::operations::reset`]) and written back unchanged:
//!   never lost, never a panic.
//! - **Counts saturate** at `u64::MAX`, as the stores do.
//!
//! # The balance
//! Every event read from a projection's topics ends in exactly one of
//! [`Stat::Applied`], [`Stat::Skipped`], [`Stat::DeadLettered`] or the
//! retry topic, where `retry_in − retry_out` events wait:
//!
//! > consumed + re-driven = applied + skipped + dead-lettered + (retry_in − retry_out)
//!
//! [`Stats::accounted`] is the right-hand side less the re-driven, so it
//! equals the events consumed (the sum of the committed positions in the
//! projection's topics, not its retry topic).
//! [`Stat::Malformed`] events are dead-lettered too (counted in both);
//! [`Stat::Undeliverable`], [`Stat::OrderViolations`],
//! [`Stat::HeldBack`], [`Stat::TimersFired`] and
//! [`Stat::TimersDeadLettered`] count something else (messages, timers, or
//! events also counted as applied) and stand for no event in that sum.

use std::collections::BTreeMap;
use std::fmt;

/// Declares the statistics once: each [`Stat`] with its docs and the field
/// of [`Counts`] that holds it, whose name is the name it is persisted
/// under.
macro_rules! statistics {
    ($($(#[$doc:meta])* $variant:ident => $field:ident,)*) => {
        /// One statistic of a projection.
        ///
        /// The variants are listed in [`Stat::ALL`]; each has its persisted
        /// name ([`Stat::name`]), which never changes.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Stat {
            $($(#[$doc])* $variant,)*
        }

        impl Stat {
            /// Every statistic, in the order of their indices.
            pub const ALL: [Stat; COUNT] = [$(Stat::$variant),*];

            /// The name the statistic is persisted under (and shown by):
            /// the name of its field in [`Counts`].
            pub const fn name(self) -> &'static str {
                match self {
                    $(Stat::$variant => stringify!($field),)*
                }
            }
        }

        /// How many statistics there are.
        const COUNT: usize = [$(stringify!($variant)),*].len();

        /// A count for every [`Stat`], each in the field named as it is
        /// persisted: what a stretch of consuming adds
        /// ([`crate::engine::consumer::Summary`]) and what a store holds
        /// ([`Stats`]).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Counts {
            $($(#[$doc])* pub $field: u64,)*
        }

        impl Counts {
            /// The count of `stat`.
            pub const fn field(&self, stat: Stat) -> &u64 {
                match stat {
                    $(Stat::$variant => &self.$field,)*
                }
            }

            /// Where the count of `stat` is kept.
            fn field_mut(&mut self, stat: Stat) -> &mut u64 {
                match stat {
                    $(Stat::$variant => &mut self.$field,)*
                }
            }
        }
    };
}

statistics! {
    /// Events handed to a handler successfully (a folded run counts every
    /// event folded into it).
    Applied => applied,
    /// Events whose tag no module declares.
    Skipped => skipped,
    /// Messages whose headers could not be parsed (also dead-lettered).
    Malformed => malformed,
    /// Events written to the dead-letter topic.
    DeadLettered => dead_lettered,
    /// Events written to the retry topic (failed, or diverted behind a
    /// key).
    RetryIn => retry_in,
    /// Events taken back from the retry topic for another attempt.
    RetryOut => retry_out,
    /// Dead letters re-driven into the retry topic
    /// ([`crate::operations::dead_letter`]).
    Redriven => redriven,
    /// Emitted messages that could never be delivered and went to the
    /// dead-letter topic instead ([`crate::engine::outbox`]).
    Undeliverable => undeliverable,
    /// Events read after the clock passed their event time (projections
    /// over several topics): applied at once, out of event-time order.
    OrderViolations => order_violations,
    /// Messages a rebuild's shadow emitted and held back, never published
    /// ([`crate::operations::rebuild`]).
    HeldBack => held_back,
    /// Timers fired: handed to a module's `fire` export, which took them
    /// (timers, not events; [`wakuwaku_core::timers`]).
    TimersFired => timers_fired,
    /// Timers whose `fire` call failed: written to the dead-letter topic
    /// (timers, not events).
    TimersDeadLettered => timers_dead_lettered,
}

impl Stat {
    /// The statistic persisted as `name`; `None` for a name this host does
    /// not know.
    pub fn from_name(name: &str) -> Option<Stat> {
        Stat::ALL.into_iter().find(|stat| stat.name() == name)
    }

    /// Its place in [`Stat::ALL`].
    #[cfg(test)]
    const fn index(self) -> usize {
        self as usize
    }
}

impl Counts {
    /// Adds `count` to `stat`, saturating at `u64::MAX`.
    pub fn add(&mut self, stat: Stat, count: u64) {
        let slot = self.field_mut(stat);
        *slot = slot.saturating_add(count);
    }

    /// Adds every count of `other`.
    pub fn absorb(&mut self, other: &Counts) {
        for stat in Stat::ALL {
            self.add(stat, *other.field(stat));
        }
    }
}

impl fmt::Display for Stat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of statistics: every [`Stat`] with its count (0 when absent),
/// and the counts under names this host does not know.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    counts: Counts,
    /// Counts read under names no [`Stat`] has, by name (never 0).
    unknown: BTreeMap<String, u64>,
}

impl Stats {
    /// No counts.
    pub fn new() -> Self {
        Self::default()
    }

    /// The count of `stat` (0 when absent).
    pub fn get(&self, stat: Stat) -> u64 {
        *self.counts.field(stat)
    }

    /// Adds `count` to `stat`, saturating at `u64::MAX`.
    pub fn add(&mut self, stat: Stat, count: u64) {
        self.counts.add(stat, count);
    }

    /// Adds `count` under its persisted `name`: to its [`Stat`], or kept
    /// under the name when no [`Stat`] has it (a newer host's count). How
    /// the stores read their rows.
    pub fn add_named(&mut self, name: &str, count: u64) {
        match Stat::from_name(name) {
            Some(stat) => self.add(stat, count),
            None if count == 0 => {}
            None => {
                let slot = self.unknown.entry(name.to_owned()).or_default();
                *slot = slot.saturating_add(count);
            }
        }
    }

    /// The counts under names this host does not know, by name.
    pub fn unknown(&self) -> &BTreeMap<String, u64> {
        &self.unknown
    }

    /// Every count that is not 0, by persisted name: the known ones in the
    /// order of [`Stat::ALL`], then the unknown ones by name. How the
    /// stores write their rows.
    pub fn named(&self) -> impl Iterator<Item = (&str, u64)> {
        let known = Stat::ALL.into_iter().map(|stat| (stat.name(), self.get(stat)));
        known.filter(|&(_, count)| count > 0).chain(self.unknown.iter().map(|(name, &count)| (name.as_str(), count)))
    }

    /// Whether every count is 0.
    pub fn is_empty(&self) -> bool {
        self.named().next().is_none()
    }

    /// Events waiting in the retry topic: `retry_in − retry_out` (0 if the
    /// counts say fewer entered than left).
    pub fn retrying(&self) -> u64 {
        self.get(Stat::RetryIn).saturating_sub(self.get(Stat::RetryOut))
    }

    /// The events the counts account for: applied + skipped +
    /// dead-lettered + (retry_in − retry_out) − re-driven. By the balance
    /// (see the [module docs](self)) it equals the events consumed from
    /// the projection's topics; negative counts mean they contradict it.
    pub fn accounted(&self) -> i128 {
        let ended = [Stat::Applied, Stat::Skipped, Stat::DeadLettered, Stat::RetryIn]
            .into_iter()
            .map(|stat| i128::from(self.get(stat)))
            .sum::<i128>();
        ended - i128::from(self.get(Stat::RetryOut)) - i128::from(self.get(Stat::Redriven))
    }
}

impl std::ops::Index<Stat> for Stats {
    type Output = u64;

    fn index(&self, stat: Stat) -> &u64 {
        self.counts.field(stat)
    }
}

impl From<Counts> for Stats {
    fn from(counts: Counts) -> Self {
        Self { counts, unknown: BTreeMap::new() }
    }
}

impl FromIterator<(Stat, u64)> for Stats {
    fn from_iter<I: IntoIterator<Item = (Stat, u64)>>(counts: I) -> Self {
        let mut stats = Self::new();
        for (stat, count) in counts {
            stats.add(stat, count);
        }
        stats
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The names earlier hosts persisted: they must read back as the same
    /// statistics
    /// (the store tests write them as text, as those hosts did).
    pub(crate) const PERSISTED: [(&str, Stat); 12] = [
        ("applied", Stat::Applied),
        ("skipped", Stat::Skipped),
        ("malformed", Stat::Malformed),
        ("dead_lettered", Stat::DeadLettered),
        ("retry_in", Stat::RetryIn),
        ("retry_out", Stat::RetryOut),
        ("redriven", Stat::Redriven),
        ("undeliverable", Stat::Undeliverable),
        ("order_violations", Stat::OrderViolations),
        ("held_back", Stat::HeldBack),
        ("timers_fired", Stat::TimersFired),
        ("timers_dead_lettered", Stat::TimersDeadLettered),
    ];

    #[test]
    fn every_name_round_trips_and_keeps_its_persisted_spelling() {
        for (name, stat) in PERSISTED {
            assert_eq!(stat.name(), name);
            assert_eq!(Stat::from_name(name), Some(stat));
        }
        assert_eq!(Stat::ALL.len(), PERSISTED.len(), "a new statistic needs its persisted name here");
        for (index, stat) in Stat::ALL.into_iter().enumerate() {
            assert_eq!(stat.index(), index, "{stat}");
        }
    }

    #[test]
    fn unknown_names_are_kept_and_written_back() {
        let mut stats = Stats::new();
        stats.add_named("applied", 2);
        stats.add_named("from_a_newer_host", 5);
        stats.add_named("from_a_newer_host", 1);
        stats.add_named("zero", 0);
        assert_eq!(Stat::from_name("Applied"), None, "names are exact");
        assert_eq!(stats[Stat::Applied], 2);
        assert_eq!(stats.unknown(), &BTreeMap::from([("from_a_newer_host".to_owned(), 6)]));
        assert_eq!(stats.named().collect::<Vec<_>>(), vec![("applied", 2), ("from_a_newer_host", 6)]);
        let mut copy = Stats::new();
        for (name, count) in stats.named() {
            copy.add_named(name, count);
        }
        assert_eq!(copy, stats, "what is written reads back the same");
    }

    #[test]
    fn adding_saturates() {
        let mut stats: Stats = [(Stat::RetryIn, 3), (Stat::RetryOut, 1), (Stat::RetryIn, 1)].into_iter().collect();
        assert_eq!((stats.get(Stat::RetryIn), stats.retrying()), (4, 3));
        stats.add(Stat::Applied, u64::MAX);
        stats.add(Stat::Applied, 1);
        assert_eq!(stats[Stat::Applied], u64::MAX);
        stats.add_named("from_a_newer_host", u64::MAX);
        stats.add_named("from_a_newer_host", 1);
        assert_eq!(stats.unknown()["from_a_newer_host"], u64::MAX);
        assert!(!stats.is_empty() && Stats::new().is_empty());
        assert!(Stats::from_iter([(Stat::Skipped, 0)]).is_empty());
    }

    #[test]
    fn accounted_follows_the_balance() {
        // 10 consumed: 4 applied, 1 skipped, 2 dead-lettered (1 malformed),
        // 3 to retry of which 1 came back and was applied; then 1 dead
        // letter re-driven, now waiting in retry with the other 2.
        let stats: Stats = [
            (Stat::Applied, 5),
            (Stat::Skipped, 1),
            (Stat::Malformed, 1),
            (Stat::DeadLettered, 2),
            (Stat::RetryIn, 3 + 1),
            (Stat::RetryOut, 1),
            (Stat::Redriven, 1),
            (Stat::Undeliverable, 7),
            (Stat::OrderViolations, 2),
            (Stat::HeldBack, 4),
        ]
        .into_iter()
        .collect();
        assert_eq!(stats.accounted(), 10);
        assert_eq!(Stats::from_iter([(Stat::RetryOut, 1)]).accounted(), -1);
    }
}
