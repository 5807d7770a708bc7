//! The WASM sandbox: everything a module may do goes through here.
//!
//! - `runtime`: the one place that builds engines, linkers and stores, and
//!   the limits every instance runs under.
//! - `handler`: what the consumer calls (modules, instances) and the key-
//!   scoped state a call sees.

pub mod handler;
pub mod runtime;
