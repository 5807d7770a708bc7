//! Running and operating a projection: what a person starts, asks and
//! repairs.
//!
//! - `host`: one running host (sandbox, library, projection, consumer,
//!   reloader, admin endpoint) assembled from one settings value.
//! - `admin`: the HTTP admin endpoint (health, readiness, metrics, modules,
//!   state, status).
//! - `dead_letter`: listing dead letters and re-driving them.
//! - `reset`: `waku reset`: moving a stopped projection's positions or
//!   starting it over.
//! - `rebuild`: rebuilding a projection in the shadow inside the running
//!   host, promoting and rolling it back.
//! - `lifecycle`: module versions (recorded, kept, rolled back) and hot
//!   reload from a watched directory; a folder: `library` (the `Library`
//!   of a projection's versions), `record` (the versions recorded with the
//!   state, their kept copies), `difference` (the directory against what
//!   runs), `reload` (what hot reload keeps between passes), `scan`
//!   (reading the module directory, file stamps), `emit_topics`, `watcher`
//!   (the `Reloader`), `error`.
//! - `oci`: modules pushed to and pulled from OCI registries.

pub mod admin;
pub mod dead_letter;
pub mod host;
pub mod lifecycle;
pub mod oci;
pub mod rebuild;
pub mod reset;
