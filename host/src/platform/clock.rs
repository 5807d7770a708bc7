//! The wall clock, in one place: milliseconds since the Unix epoch.
//!
//! Rule it keeps: the wall clock measures retry delays and stamps records
//! (when a loss was found, when a failure happened); it never decides
//! event time, which moves only on evidence from the log.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch: the clock retry delays are measured
/// on, so they survive restarts. 0 for a clock set before 1970.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
