//! The `waku` command's integration tests, in one test binary so that the
//! host and wasmtime are linked once, not once per file (disk and link time
//! on CI). `crash.rs` and the ordering spec's test stay binaries of their own.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod docs_links;
mod event_time;
mod first_hour;
mod held_across_restart;
mod hostile_registry;
mod layers;
mod nexmark;
mod oci;
mod one_machine;
mod readme_day;
mod rebuild;
mod reset;
mod scale;
mod several_topics;
mod telemetry;
mod through_the_host;
mod timers;
mod typescript;
mod untrusted;
mod windows;
