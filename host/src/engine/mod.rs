//! The loop, poll → plan → reduce → invoke → commit, and what it feeds.
//!
//! - `consumer`: the loop over a projection's partitions.
//! - `routing`: where failed events go: the retry and dead-letter topics,
//!   their records, the delay schedule and the retry queue.
//! - `outbox`: publishing what a committed batch owes the log, each message
//!   once.
//! - `projection`: modules over a projection's topics, their routing and
//!   state.
//! - `metrics`: Prometheus metrics, tallied per batch.
//! - `telemetry`: OpenTelemetry traces and metrics.
//! - `progress`: the caught-up gate (start-up end offsets vs. committed
//!   positions).
//! - `membership`: which partitions this host consumes, from the log's
//!   consumer groups.

pub mod consumer;
pub(crate) mod membership;
pub mod metrics;
pub mod outbox;
pub mod progress;
pub mod projection;
pub mod routing;
pub mod telemetry;
