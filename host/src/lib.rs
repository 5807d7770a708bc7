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
//! Data flows one way: poll → plan → reduce → invoke → commit. The modules
//! are in layers, one folder each, listed top to bottom; a module imports
//! from its own layer and the layers below it, never above (the test
//! `layers_import_only_downwards` reads the sources and keeps this).
//!
//! - [`cli`]: the `waku` command line.
//! - [`authoring`]: tools for writing handlers: publishing events, `waku
//!   test`, `waku dev`, the demos, scaffolding, building guests.
//! - [`operations`]: running and operating a projection: the host, the
//!   admin endpoint, dead letters, reset, rebuild, module versions, OCI.
//! - [`engine`]: the loop and what it feeds: the consumer, routing, the
//!   outbox, projections, metrics, telemetry, progress, membership.
//! - [`sandbox`]: the WASM runtime and the handler modules it loads.
//! - [`storage`]: the event logs, the state stores and their statistics.
//! - [`platform`]: TLS, memory, the clock, files and words in messages.
//! - [`event`], [`key`], [`plan`], [`reduce`]: re-exported from
//!   `wakuwaku-core`, below every layer.
//!
//! The [`iggy`] module is the public facade the user documentation
//! (`docs/ordering.md`) imports from; it re-exports, it holds no code.

pub mod cli;

pub mod authoring;

pub mod operations;

pub mod engine;

pub mod sandbox;

pub mod storage;

pub mod platform;

pub use wakuwaku_core::{event, key, plan, reduce};

/// The facade documented in `spec/ordering.md`: `wakuwaku::iggy::...`.
pub mod iggy {
    pub use crate::event::{Algebra, EventAtomicOrdering, EventTypeTag, KeyHash};

    /// Partition-level processing.
    pub mod partition {
        pub use crate::plan;
    }
}
