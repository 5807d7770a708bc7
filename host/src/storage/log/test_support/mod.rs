//! Test doubles of the event log, for the tests of other crates (behind
//! the `test-support` feature, as `wakuwaku-core` keeps its own): each is
//! a [`ForwardingLog`](super::ForwardingLog) over a real log and changes
//! only what it is for, so a new [`EventLog`](super::EventLog) method
//! needs no change here.
//!
//! - `faulty`: the embedded log (or another) with faults on cue.
//! - `losing`: a log that loses its tail, a topic or its head on cue.

pub mod faulty;
pub mod losing;
