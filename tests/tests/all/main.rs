//! The end-to-end tests, in one test binary so that the host and wasmtime
//! are linked once, not once per file (disk and link time on CI). Tests
//! that change something process-wide stay binaries of their own:
//! `collision.rs` and `untrusted_collision.rs` (the key hash), `flood.rs`
//! (the process's peak RSS) and `iggy.rs` (restarts the Iggy server).

mod admin;
mod bank;
mod console;
mod consumer;
mod contract_versions;
mod event_time;
mod guest_output;
mod host;
mod hostile;
mod lifecycle;
mod log_conformance;
mod loss;
mod oci;
mod outage;
mod outbox;
mod postgres;
mod python;
mod quotas;
mod rebuild;
mod reset;
mod routing;
mod sandbox;
mod scale;
mod shutdown;
mod timers;
mod typescript;
mod untrusted;
mod untrusted_postgres;
