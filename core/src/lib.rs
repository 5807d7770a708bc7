//! # wakuwaku-core
//!
//! The pure parts of [wakuwaku](https://docs.rs/wakuwaku): the event model
//! with its header envelope, the planner, and reduction. No I/O, no WASM runtime, no
//! async: just data in and data out.
//!
//! They live in a crate of their own so that what needs only them builds
//! without the host's dependencies (wasmtime, redb, tokio). Chiefly the fuzz
//! targets in `fuzz/`, which compile everything they link with sanitizer
//! coverage, where building wasmtime would take most of the time budget; and
//! any other crate (tooling, a publisher) that writes or reads headers or
//! plans batches; and the guest SDK, whose test host reduces runs exactly as
//! the host does. The host re-exports these modules, so `wakuwaku::event`,
//! `wakuwaku::plan`, `wakuwaku::reduce` and the `wakuwaku::iggy` facade are
//! the same items.
//!
//! ## Layout
//!
//! - [`event`]: type tags, orderings, algebras, event timings and the strict header
//!   envelope every message carries.
//! - [`key`]: keys as canonical bytes, their text form and their hash.
//! - [`key_serde`]: keys from any `Serialize` value of a key's shape (the
//!   guest SDK's keys).
//! - [`limits`]: the rules and limits of the module boundary: what a module
//!   may hand the host and return to it, per value, per call and per batch
//!   (shared by the host and the guest SDK's test host).
//! - [`names`]: the naming rules of topics and projections, each refusal
//!   naming the rule it breaks.
//! - [`plan`]: the pure planner: records in, plan out, no I/O.
//! - [`reduce`]: what each algebra lets the host do to a run, and chunking.
//! - [`release`]: the release stage in front of the planner: events held
//!   under their event time and released in event-time order when the
//!   log's end offsets say so.
//! - [`time_order`]: the fences that keep a key's timed events of
//!   different types in event-time order through the planner.
//! - [`timers`]: per-key event-time timers, and where each fires among its
//!   key's released events.
//! - [`terminal`]: which characters a terminal or a log line may receive
//!   raw, and the escaping of everything else (a module's text).
//!
//! ## Features
//!
//! - `test-support`: makes `plan::test_support` public (the checker that a
//!   plan keeps every order the spec requires) and `release::test_support`
//!   (a simulated log and host loop that check the release stage's rules),
//!   for tests and fuzz targets outside this crate. Off by default, so the
//!   helpers are not part of the API that normal builds see; this crate's
//!   own tests always have them.

pub mod event;
pub mod key;
pub mod key_serde;
pub mod limits;
pub mod names;
pub mod plan;
pub mod reduce;
pub mod release;
pub mod terminal;
pub mod time_order;
pub mod timers;
