//! What each module version's calls cost and how they failed, gathered
//! where the sandbox already measures: the calls it makes
//! ([`super::WasmInstance`]'s `invoke`) and the memory growths its limiter
//! allows ([`super::instance_limits::InstanceLimits`]).
//!
//! A [`UsageBoard`] belongs to a [`super::Sandbox`] and holds one
//! [`VersionUsage`] per module version it loaded, so a version swapped out
//! keeps its figures (its errors stay visible after a rollback).
//!
//! Rules kept here:
//! - **Cheap on the call path.** A call adds to atomics only (its count,
//!   its time's bucket, its longest time, its failure's class); the board's
//!   lock is taken when a version is loaded and when the figures are read,
//!   never per call.
//! - **Failures are counted by class** ([`Failure`]): the handler's own
//!   error, a trap, out of time (the CPU budget, an epoch deadline), out of
//!   memory (a growth the instance's or the host's limit refused), a broken
//!   contract, or a host fault under an import (the host's, shown apart).
//! - **Call times against the budget.** Each call's wall time (what the
//!   epoch deadline counts) lands in one of [`BUCKETS`] buckets, four per
//!   power of two microseconds, so the 99th percentile is known to within a
//!   quarter (its bucket's upper edge, never above the longest call).
//! - **Memory against the limit.** What the version's live instances hold
//!   now, all together, and the most one instance ever held (the limit is
//!   per instance: [`super::SandboxLimits::memory_bytes`]).
//! - **Log lines are kept by module** ([`super::log::LogBook`]): each
//!   version's store writes into its module's book, which outlives the
//!   version, as its figures do.
//! - **Bounded.** At most [`MOST_VERSIONS_PER_MODULE`] versions of a module
//!   are kept; past it the oldest that no loaded module uses is forgotten.
//!
//! Public because [`crate::sandbox::handler::HandlerModule`], a public
//! trait, hands out the board.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::log::LogBook;

/// How many buckets of call times a version keeps: four per power of two
/// microseconds, up to 2^32 µs (71 minutes; longer calls share the last).
pub const BUCKETS: usize = 128;

/// The most versions of one module a board keeps.
pub const MOST_VERSIONS_PER_MODULE: usize = 16;

/// Why a call failed, as the board counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The handler returned an error.
    Handler,
    /// The guest trapped (a panic, an abort, a stack overflow, a bad value).
    Trap,
    /// The call ran past its CPU budget (its epoch deadline).
    Time,
    /// A memory growth was refused: the instance's limit or the host's.
    Memory,
    /// The module returned or handed over something the contract forbids.
    Contract,
    /// The host failed under an import: not the module's fault.
    Host,
}

impl Failure {
    /// Every class, in the order the figures list them.
    pub const ALL: [Failure; 6] =
        [Failure::Handler, Failure::Trap, Failure::Time, Failure::Memory, Failure::Contract, Failure::Host];

    /// The class's name in the figures.
    pub fn name(self) -> &'static str {
        match self {
            Failure::Handler => "handler",
            Failure::Trap => "trap",
            Failure::Time => "time",
            Failure::Memory => "memory",
            Failure::Contract => "contract",
            Failure::Host => "host",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One module version's figures, updated by its calls and instances.
#[derive(Debug)]
pub struct VersionUsage {
    module: String,
    version: String,
    loaded_at_ms: u64,
    calls: AtomicU64,
    failures: [AtomicU64; Failure::ALL.len()],
    buckets: [AtomicU64; BUCKETS],
    longest_us: AtomicU64,
    instances: AtomicU64,
    memory_held: AtomicUsize,
    memory_peak: AtomicUsize,
    /// Its module's log lines.
    book: Arc<LogBook>,
}

impl VersionUsage {
    fn new(module: &str, version: &str, book: Arc<LogBook>) -> Self {
        Self {
            book,
            module: module.to_owned(),
            version: version.to_owned(),
            loaded_at_ms: crate::platform::clock::now_ms(),
            calls: AtomicU64::new(0),
            failures: std::array::from_fn(|_| AtomicU64::new(0)),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            longest_us: AtomicU64::new(0),
            instances: AtomicU64::new(0),
            memory_held: AtomicUsize::new(0),
            memory_peak: AtomicUsize::new(0),
        }
    }

    /// A version's figures for a test of what feeds them.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        Self::new("m", "v", Arc::new(LogBook::new("m")))
    }

    /// The version.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Its module's log lines.
    pub fn book(&self) -> &LogBook {
        &self.book
    }

    /// Counts a call that took `took` and failed as `failure`, if it did.
    pub(crate) fn call(&self, took: Duration, failure: Option<Failure>) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.buckets[bucket(us)].fetch_add(1, Ordering::Relaxed);
        self.longest_us.fetch_max(us, Ordering::Relaxed);
        if let Some(failure) = failure {
            self.failures[failure.index()].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a failure found after the call returned (a key or a body
    /// that breaks the contract): the call itself is counted already.
    pub(crate) fn failed_after(&self, failure: Failure) {
        self.failures[failure.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// An instance was made.
    pub(crate) fn instance_made(&self) {
        self.instances.fetch_add(1, Ordering::Relaxed);
    }

    /// An instance holding `held` bytes was dropped.
    pub(crate) fn instance_dropped(&self, held: usize) {
        self.instances.fetch_sub(1, Ordering::Relaxed);
        self.memory_held.fetch_sub(held, Ordering::Relaxed);
    }

    /// An instance's memories grew by `adds` bytes to `instance_held`.
    pub(crate) fn memory_grew(&self, adds: usize, instance_held: usize) {
        self.memory_held.fetch_add(adds, Ordering::Relaxed);
        self.memory_peak.fetch_max(instance_held, Ordering::Relaxed);
    }

    /// The figures as they are now.
    pub fn figures(&self) -> VersionFigures {
        let buckets: Vec<u64> = self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        let longest_us = self.longest_us.load(Ordering::Relaxed);
        VersionFigures {
            module: self.module.clone(),
            version: self.version.clone(),
            loaded_at_ms: self.loaded_at_ms,
            calls: self.calls.load(Ordering::Relaxed),
            errors: Failure::ALL.iter().map(|f| (f.name(), self.failures[f.index()].load(Ordering::Relaxed))).collect(),
            longest_us,
            p99_us: percentile(&buckets, 99).map(|p| p.min(longest_us)),
            instances: self.instances.load(Ordering::Relaxed),
            memory_bytes: self.memory_held.load(Ordering::Relaxed),
            memory_peak_bytes: self.memory_peak.load(Ordering::Relaxed),
        }
    }
}

/// A version's figures, as the console shows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionFigures {
    /// The module.
    pub module: String,
    /// The version.
    pub version: String,
    /// When the sandbox loaded it (ms since the Unix epoch).
    pub loaded_at_ms: u64,
    /// Calls made (`handle`, `fire`, `key`, `ordering`, `event-time`,
    /// `combine`, `describe`).
    pub calls: u64,
    /// Failed calls per class ([`Failure::name`]), in [`Failure::ALL`]'s
    /// order.
    pub errors: Vec<(&'static str, u64)>,
    /// The longest call, in µs.
    pub longest_us: u64,
    /// The 99th percentile of call times, in µs (its bucket's upper edge,
    /// at most the longest); none before the first call.
    pub p99_us: Option<u64>,
    /// Its live instances (pooled idle ones included).
    pub instances: u64,
    /// What its live instances hold in linear memory together, in bytes.
    pub memory_bytes: usize,
    /// The most one of its instances ever held, in bytes.
    pub memory_peak_bytes: usize,
}

impl VersionFigures {
    /// Failed calls of every class but the host's.
    pub fn failed(&self) -> u64 {
        self.errors.iter().filter(|(name, _)| *name != "host").map(|(_, n)| n).sum()
    }
}

/// Every version a sandbox loaded, with the limits they run under.
#[derive(Debug)]
pub struct UsageBoard {
    versions: Mutex<Vec<Arc<VersionUsage>>>,
    /// One log book per module.
    books: Mutex<Vec<Arc<LogBook>>>,
    memory_limit: usize,
    call_budget: Duration,
}

impl UsageBoard {
    /// A board for instances of at most `memory_limit` bytes and calls of
    /// at most `call_budget`.
    pub(crate) fn new(memory_limit: usize, call_budget: Duration) -> Self {
        Self { versions: Mutex::default(), books: Mutex::default(), memory_limit, call_budget }
    }

    /// The figures of `version` of `module`, made when first asked; past
    /// [`MOST_VERSIONS_PER_MODULE`] the module's oldest unused version is
    /// forgotten.
    pub(crate) fn version(&self, module: &str, version: &str) -> Arc<VersionUsage> {
        let mut versions = self.versions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(found) = versions.iter().find(|v| v.module == module && v.version == version) {
            return found.clone();
        }
        let made = Arc::new(VersionUsage::new(module, version, self.book_of(module)));
        versions.push(made.clone());
        if versions.iter().filter(|v| v.module == module).count() > MOST_VERSIONS_PER_MODULE
            && let Some(oldest) = versions.iter().position(|v| v.module == module && Arc::strong_count(v) == 1)
        {
            versions.remove(oldest);
        }
        made
    }

    /// The log book of `module`, made when first asked.
    fn book_of(&self, module: &str) -> Arc<LogBook> {
        let mut books = self.books.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(found) = books.iter().find(|book| book.module() == module) {
            return found.clone();
        }
        let made = Arc::new(LogBook::new(module));
        books.push(made.clone());
        made
    }

    /// The log lines of `module`, if the sandbox loaded it.
    pub fn log(&self, module: &str) -> Option<Arc<LogBook>> {
        let books = self.books.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        books.iter().find(|book| book.module() == module).cloned()
    }

    /// The figures of every version of `module`, the newest loaded first.
    pub fn module(&self, module: &str) -> Vec<VersionFigures> {
        let versions = self.versions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        versions.iter().rev().filter(|v| v.module == module).map(|v| v.figures()).collect()
    }

    /// The most linear memory one instance may hold, in bytes.
    pub fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    /// The time one call may take.
    pub fn call_budget(&self) -> Duration {
        self.call_budget
    }
}

/// The bucket of a call of `us` microseconds: 0 to 3 by themselves, then
/// four per power of two.
fn bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let log = 63 - u64::from(us.leading_zeros());
    let quarter = (us >> (log - 2)) & 3;
    usize::try_from(4 * (log - 1) + quarter).unwrap_or(BUCKETS - 1).min(BUCKETS - 1)
}

/// The first microsecond past bucket `index`.
fn bucket_end(index: usize) -> u64 {
    if index < 4 {
        return index as u64 + 1;
    }
    let (log, quarter) = (index as u64 / 4 + 1, index as u64 % 4);
    ((4 + quarter) << (log - 2)) + (1 << (log - 2))
}

/// The `percent`th percentile of `buckets` (upper edge of its bucket); none
/// when empty.
fn percentile(buckets: &[u64], percent: u64) -> Option<u64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let wanted = (total * percent).div_ceil(100);
    let mut seen = 0;
    buckets.iter().enumerate().find_map(|(index, count)| {
        seen += count;
        (seen >= wanted).then(|| bucket_end(index))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_four_per_power_of_two_and_end_where_the_next_begins() {
        for us in [0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 1000, 999_999, 1 << 31] {
            let index = bucket(us);
            assert!(us < bucket_end(index), "{us} in bucket {index} ending at {}", bucket_end(index));
            if index > 0 {
                assert!(us >= bucket_end(index - 1), "{us} past bucket {}", index - 1);
            }
        }
        assert_eq!((bucket(4), bucket(7), bucket(8), bucket(15), bucket(16)), (4, 7, 8, 11, 12));
        assert_eq!(bucket(u64::MAX), BUCKETS - 1, "the longest share the last");
    }

    #[test]
    fn failures_are_counted_by_class_and_the_p99_is_within_a_quarter() {
        let usage = VersionUsage::for_tests();
        for _ in 0..990 {
            usage.call(Duration::from_micros(100), None);
        }
        for _ in 0..7 {
            usage.call(Duration::from_micros(100), Some(Failure::Handler));
        }
        usage.call(Duration::from_millis(1000), Some(Failure::Time));
        usage.call(Duration::from_micros(900), Some(Failure::Trap));
        usage.call(Duration::from_micros(5000), Some(Failure::Host));
        let figures = usage.figures();
        assert_eq!(figures.calls, 1000);
        assert_eq!(
            figures.errors,
            vec![("handler", 7), ("trap", 1), ("time", 1), ("memory", 0), ("contract", 0), ("host", 1)]
        );
        assert_eq!(figures.failed(), 9, "the host's faults are not the module's");
        assert_eq!(figures.longest_us, 1_000_000);
        // 997 calls of 100 µs: the 99th percentile is theirs.
        let p99 = figures.p99_us.unwrap();
        assert!((100..=125).contains(&p99), "{p99}");
        assert_eq!(VersionUsage::for_tests().figures().p99_us, None);
    }

    #[test]
    fn memory_is_what_live_instances_hold_and_the_most_one_held() {
        let usage = VersionUsage::for_tests();
        usage.instance_made();
        usage.instance_made();
        usage.memory_grew(1 << 20, 1 << 20);
        usage.memory_grew(3 << 20, 3 << 20);
        usage.memory_grew(1 << 20, 2 << 20);
        let figures = usage.figures();
        assert_eq!((figures.instances, figures.memory_bytes, figures.memory_peak_bytes), (2, 5 << 20, 3 << 20));
        usage.instance_dropped(3 << 20);
        let figures = usage.figures();
        assert_eq!((figures.instances, figures.memory_bytes, figures.memory_peak_bytes), (1, 2 << 20, 3 << 20));
    }

    #[test]
    fn a_board_keeps_each_version_once_and_forgets_only_unused_old_ones() {
        let board = UsageBoard::new(64 << 20, Duration::from_secs(1));
        let running = board.version("m", "v0");
        running.call(Duration::from_micros(5), Some(Failure::Handler));
        assert!(Arc::ptr_eq(&running, &board.version("m", "v0")), "one figure set per version");
        for n in 1..=MOST_VERSIONS_PER_MODULE {
            drop(board.version("m", &format!("v{n}")));
        }
        board.version("other", "x");
        let versions = board.module("m");
        assert_eq!(versions.len(), MOST_VERSIONS_PER_MODULE);
        assert_eq!(versions[0].version, format!("v{MOST_VERSIONS_PER_MODULE}"), "newest first");
        assert!(versions.iter().any(|v| v.version == "v0" && v.failed() == 1), "v0 is in use: kept");
        assert!(!versions.iter().any(|v| v.version == "v1"), "the oldest unused one is forgotten");
    }
}
