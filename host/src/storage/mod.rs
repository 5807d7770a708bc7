//! What the host keeps: the event logs, the state stores and their
//! statistics.
//!
//! - `log`: the `EventLog` trait every log backend implements, and the
//!   backends: embedded (one redb file) and Apache Iggy.
//! - `state`: a projection's state store: read model, counters, positions
//!   and outbox, committed in one transaction per batch.
//! - `stats`: the statistics a projection keeps with its state.
//! - `forwarding`: the forwarding of `EventLog` and `StateBackend`, written
//!   once, for the types that wrap a log or a store.
//! - `redb_file`: how both embedded backends open their redb files, checked
//!   in full so that a damaged file is an error naming it.

mod forwarding;
pub mod log;
pub(crate) mod redb_file;
pub mod state;
pub mod stats;
