//! # wakuwaku
//!
//! Runs event handlers as WebAssembly components over a partitioned event
//! log. A host polls a log partition, plans each batch per key so that only
//! the order the business needs is kept, reduces runs of events with their
//! declared algebra, and calls handler modules in a sandbox through the WIT
//! contract in `wit/`.
//!
//! ## Layout
//!
//! Data flows one way: poll → plan → reduce → invoke → commit.
//!
//! - [`event`]: type tags, orderings, algebras and the strict header
//!   envelope every message carries (re-exported from `wakuwaku-core`).
//! - [`key`]: keys as canonical bytes (the identity of what order and state
//!   are scoped to), their text form and the hash that picks a partition
//!   (re-exported from `wakuwaku-core`).
//! - [`plan`]: the pure planner: records in, plan out, no I/O (re-exported
//!   from `wakuwaku-core`).
//! - [`reduce`]: what each algebra lets the host do to a run, and chunking
//!   (re-exported from `wakuwaku-core`).
//! - [`handler`]: what the consumer calls (modules, instances) and the
//!   key-scoped state a call sees.
//! - [`runtime`]: the WASM sandbox: the one place that builds engines,
//!   linkers and stores, and the limits every instance runs under.
//! - [`projection`]: modules over one topic, their routing and state.
//! - [`lifecycle`]: module versions (recorded, kept, rolled back) and hot
//!   reload from a watched directory.
//! - [`consumer`]: the loop: poll → plan → reduce → invoke → commit.
//! - [`outbox`]: publishing what a committed batch owes the log (emitted
//!   messages, retry and dead-letter records), each once, and
//!   dead-lettering messages that can never be delivered.
//! - [`routing`]: where failed events go: the retry and dead-letter
//!   topics, their records, the delay schedule and the retry queue.
//! - [`dead_letter`]: listing dead letters and re-driving them.
//! - [`rebuild`]: rebuilding a projection in the shadow inside the running
//!   host, promoting it between two batches, rolling it back.
//! - [`reset`]: `waku reset`, moving a stopped projection's positions or
//!   starting it over (with a backup of its state).
//! - [`metrics`]: Prometheus metrics, tallied per batch.
//! - [`progress`]: the caught-up gate (start-up end offsets vs. committed
//!   positions).
//! - [`publish`]: events in, messages with headers from the module out.
//! - [`guest_build`]: building a guest crate into a component.
//! - [`scaffold`]: `waku new`, a handler project (Rust or Python) with a
//!   copy of the guest SDK, that builds anywhere.
//! - [`trial`]: `waku test`, a built component run on sample events in a
//!   throwaway store, its outcome and how it differs from an expected one.
//! - [`dev`]: `waku dev`, a guest rebuilt on every change of its sources
//!   and hot-reloaded into a running local projection.
//! - [`demo`]: the bank workload and its oracle.
//! - [`host`]: one running host (sandbox, library, projection, consumer,
//!   reloader, admin endpoint) assembled from one settings value.
//! - [`admin`]: the HTTP admin endpoint (health, readiness, metrics,
//!   modules, state, status).
//! - [`cli`]: the `waku` command line.
//! - [`log`]: the [`log::EventLog`] trait every log backend implements, and
//!   the backends: embedded (one redb file) and Apache Iggy.
//! - [`state`]: a projection's state store: read model, counters, consumer
//!   positions and outbox, committed in one transaction per batch.
//! - `redb_file`: how both embedded backends open their redb files, checked
//!   in full so that a damaged file is an error naming it, never a crash.
//! - [`memory`]: how the process takes memory pages from the kernel.
//! - [`words`]: counts and rates in messages (`1 event`, `2 batches`).
//! - [`tls`]: rustls configurations for the host's links (PostgreSQL, the
//!   admin endpoint and its callers) and refused handshakes in plain words.
//!
//! The [`iggy`] module is the public facade the user documentation
//! (`spec/ordering.md`) imports from; it re-exports, it holds no code.

pub mod admin;
pub mod cli;
pub mod consumer;
pub mod dead_letter;
pub mod demo;
pub mod dev;
pub mod guest_build;
pub mod handler;
pub mod host;
pub mod inventory_demo;
pub mod lifecycle;
pub mod log;
pub mod membership;
pub mod memory;
pub mod metrics;
pub mod oci;
pub mod outbox;
pub mod progress;
pub mod projection;
pub mod publish;
pub mod rebuild;
mod redb_file;
pub mod reset;
pub mod routing;
pub mod runtime;
pub mod scaffold;
pub mod state;
pub mod stats;
pub mod telemetry;
pub mod tls;
pub mod trial;
pub mod words;

pub use wakuwaku_core::{event, key, plan, reduce};

/// The facade documented in `spec/ordering.md`: `wakuwaku::iggy::...`.
pub mod iggy {
    pub use crate::event::{Algebra, EventAtomicOrdering, EventTypeTag, KeyHash};

    /// Partition-level processing.
    pub mod partition {
        pub use crate::plan;
    }
}
