//! Tools for writing handlers: the layer under the command line that turns
//! sources and sample events into modules and runs them.
//!
//! - `publish`: events in, messages with headers from the module out.
//! - `trial`: `waku test`: a built component run on sample events in a
//!   throwaway store, its outcome and how it differs from an expected one.
//! - `dev`: `waku dev`: a guest rebuilt on every change of its sources and
//!   hot-reloaded into a running local projection.
//! - `demo`: the bank workload and its oracle.
//! - `inventory_demo`: the inventory demo: two timed topics, live.
//! - `nexmark`: the Nexmark demo: a seeded stream of persons, auctions and
//!   bids, and the oracle of queries 5 and 7.
//! - `scaffold`: `waku new`: a handler project (Rust or Python) with a copy
//!   of the guest SDK.
//! - `guest_build`: building a guest crate into a component.

pub mod demo;
pub(crate) mod dev;
pub mod guest_build;
pub mod inventory_demo;
pub mod nexmark;
pub mod publish;
pub(crate) mod scaffold;
pub mod trial;
