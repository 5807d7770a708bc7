//! What every layer may use: TLS, memory, the clock, files and words in
//! messages.
//!
//! - `tls`: rustls configurations for the host's links and refused
//!   handshakes in plain words.
//! - `memory`: how the process takes memory pages from the kernel.
//! - `words`: counts and rates in messages (`1 event`, `2 batches`).
//! - `clock`: the wall clock, for retry delays and stamps, never event
//!   time.
//! - `files`: what the host asks of files beyond reading them (modes).

pub mod clock;
pub(crate) mod files;
pub mod memory;
pub(crate) mod tls;
pub(crate) mod words;
