//! The consumer: poll → plan → reduce → invoke → commit, per partition.
//!
//! For each polled batch of one partition:
//! 1. **Plan** from headers alone ([`crate::plan`]); bodies stay opaque.
//!    Records are grouped by key, and a key is its canonical bytes, never
//!    its hash: each distinct key of the batch gets a planning number of
//!    its own, so keys whose hashes collide never share a run, a fold, a
//!    state scope or a retry diversion. A message whose headers cannot be
//!    parsed goes to the dead-letter topic with the parse error. Events of a key that is waiting in retry are
//!    diverted behind it, to the retry topic ([`crate::engine::routing`]).
//! 2. **Execute per key.** Keys are spread over worker threads (a batch
//!    with one worker runs on the calling thread); one key's
//!    runs execute one after another (head, body runs, tail, segment after
//!    segment), so a key never races with itself. Each run is reduced with
//!    its type's algebra ([`crate::reduce`]) and handed to the module in
//!    chunks of at most `max-batch` events. Runs whose tag no module
//!    declares are skipped and counted as `skipped`. A failed chunk is
//!    routed by its class ([`crate::engine::routing`]): retried in place, sent with
//!    the key's unfinished work to the retry topic, or dead-lettered.
//! 3. **Commit once.** State writes, counter changes, the outbox (emitted
//!    messages and routed records), counts, the partition's next offset and
//!    the retry bookkeeping go into the projection's store in one
//!    transaction. A crash at any moment leaves the state exactly as if
//!    every event before the committed offset had been applied once. The
//!    outbox is then published to the log and cleared ([`crate::engine::outbox`]):
//!    each entry once, and a message that can never be delivered
//!    dead-lettered instead of blocking the partition; a leftover outbox is
//!    published again at start-up, once the retry and dead-letter topics
//!    exist.
//!
//! Between batches, keys whose retry is due are taken from the retry topic
//! (all of a key's waiting records at once), planned and executed the same
//! way, and committed with the retry position and the offsets now done.
//! Every event ends applied, skipped, in retry or dead-lettered, and the
//! counts in [`crate::storage::stats`] say which.
//!
//! A host fault ([`CallError::HostFault`](crate::sandbox::handler::CallError::HostFault): the state store failed under a
//! call) is never counted against a module: the batch is not committed,
//! and the partition tries it again after the same backoff as an
//! unavailable log.
//!
//! A partition another host took ([`StateError::Fenced`](crate::storage::state::StateError::Fenced): its commit was
//! refused whole) is dropped: logged with the epochs, counted
//! (`waku_partitions_fenced_total`, and its batch's events in
//! `waku_events_redone_total`), taken out of the caught-up gate, while
//! the host keeps consuming its other partitions. A commit refused because
//! the database no longer holds the position this host's last commit left
//! ([`StateError::PositionMoved`](crate::storage::state::StateError::PositionMoved): it forgot acknowledged commits) starts
//! the partition over from what the database holds, nothing of the host's
//! memory of it kept, and counts the refused and forgotten events as
//! redone. Partitions that follow a
//! consumer group move without that ([`Consumer::with_assignment`]): the
//! host that loses one lets it go after its batch in flight, and the one
//! that gains it waits for that. Taking an assigned
//! partition that fails (the log or the state store unreachable while
//! claiming it, publishing its outbox or reading its end offset) never
//! stops the host: logged, counted (`waku_partition_takes_failed_total`)
//! and tried again after the log's backoff, doubling.
//!
//! Progress is measured against end offsets read from the log, never a
//! timer: [`Consumer::catch_up`] reads every partition's end offset once and
//! returns when the committed position reaches it and no retry is due.
//!
//! The log is not trusted to keep what it acknowledged ([`loss`](crate::storage::log::loss)): before
//! consuming, the retry and dead-letter topics must be durable and the
//! topic's identity is compared with the one recorded; a partition's end
//! offset is read again at its start and, at most every
//! [`TAIL_CHECK`], while it finds nothing to read. An end below the
//! position or below an end read earlier is a lost tail: logged, counted,
//! recorded, and followed (the gate lowers to the new end, so catching up
//! never waits for offsets that are gone); one below what the projection
//! applied stops the partition ([`ConsumerError::LogTruncated`]).
//!
//! Layout, from the partition set down to one key's run (each type's
//! methods in one file; imports point down this list):
//! - `partition_set`: [`Consumer`], the partitions held (fixed, or a
//!   consumer group's assignment as it changes), one task each.
//! - `partition_loop`: one partition's loop (poll or read through the
//!   event-time stage, run the batch, settle, retries due).
//! - `timing`: one partition index's event-time stage across topics;
//!   `release_marks`: its checkpoint in the commit; [`timing_status`]:
//!   what the stages show.
//! - `parts`: what every partition shares (log, projection, settings,
//!   runner) and what the set and the loops both do with it.
//! - `batch`: one batch, records in, its commit out, as a value (its unit
//!   tests run batches with a native module, no log, no store, no thread).
//! - `key`: one worker's keys, each key's runs in order; `failure`: where a
//!   failed chunk goes; `call_time`: each module's time in a batch.
//! - `work`: a batch's data from the planner to the workers; `key_table`
//!   numbers a batch's keys; `projection_names`: the names a batch routes to.
//! - `timer_clock`: the clock a batch fires timers by, and a one-topic
//!   partition's; `timer_letter`: the dead letter of timers whose `fire`
//!   failed.
//! - `summary`: what a stretch of consuming did; [`phase`]: where a batch's
//!   time went; `error`: why consuming stopped; `test_ledger`: the native
//!   module and snapshot its unit tests share.

use std::time::Duration;

use crate::engine::routing::RetryPolicy;
use crate::event::EventTypeTag;
use crate::key::Key;
use crate::sandbox::handler::PayloadLimits;

mod batch;
mod call_time;
mod error;
mod failure;
mod key;
mod key_table;
mod partition_loop;
mod partition_set;
mod parts;
pub(crate) mod phase;
mod projection_names;
pub(crate) mod release_marks;
mod summary;
#[cfg(test)]
mod test_ledger;
mod timer_clock;
mod timer_letter;
mod timing;
pub(crate) mod timing_status;
mod work;

pub use error::ConsumerError;
pub use partition_loop::TAIL_CHECK;
pub use partition_set::{Consumer, HOLD_RETRY, RETAKE_AFTER};
pub use phase::{Phase, PhaseTimes};
pub(crate) use release_marks::marked_topics;
pub use summary::Summary;
pub use timing_status::{
    InputTiming, LATE_EVENTS_KEPT, LateEvent, LateEvents, LatencyHistogram, PartitionTiming, TimingBoard,
};
use wakuwaku_core::release::ReleaseLimits;

/// How a consumer polls and executes.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Most messages polled per batch. Default 65 536: larger batches give
    /// longer runs to reduce and fewer handler calls and commits (see
    /// BENCHMARKS.md). It is a maximum: a poll takes what is there, so a
    /// consumer that keeps up handles small batches.
    pub batch_size: usize,
    /// Worker threads per batch; keys are spread over them. Default: the
    /// machine's available parallelism.
    pub workers: usize,
    /// The partitions this consumer owns; `None` means all of them.
    pub partitions: Option<Vec<u32>>,
    /// How long `follow` waits before polling an idle partition again.
    /// Default 50 ms. A log that signals its appends
    /// ([`EventLog::appends`](crate::storage::log::EventLog::appends): the embedded log) ends the wait as soon as
    /// one is made.
    pub idle_poll: Duration,
    /// Size limits for what handlers hand the host.
    pub payload: PayloadLimits,
    /// How failed events are retried.
    pub retry: RetryPolicy,
    /// The first and the longest wait before trying an unavailable log
    /// again; the wait doubles in between. Default 100 ms and 5 s.
    pub log_backoff: (Duration, Duration),
    /// How long one module's calls (`combine` and `handle`, summed over the
    /// workers) may run in one batch before its further calls in the batch
    /// are not made and their keys go to retry without losing an attempt
    /// ([`CallError::BatchTime`](crate::sandbox::handler::CallError::BatchTime)), so
    /// a slow module cannot hold up the partition. Default 30 s.
    pub module_time_per_batch: Duration,
    /// What bounds the events a projection over several topics holds for
    /// event-time order, per partition index ([`ReleaseLimits`]; default
    /// 64 MiB held).
    pub release: ReleaseLimits,
    /// Topics of a projection over several topics whose events carry no
    /// event time (a catalogue): their events pass at once, and they serve
    /// as the processing-time clock once every other topic's partitions
    /// are idle ([`wakuwaku_core::release`], "processing-time clock").
    /// Default: none.
    pub untimed_topics: Vec<String>,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            batch_size: 65_536,
            workers: std::thread::available_parallelism().map_or(1, usize::from),
            partitions: None,
            idle_poll: Duration::from_millis(50),
            payload: PayloadLimits::default(),
            retry: RetryPolicy::default(),
            log_backoff: (Duration::from_millis(100), Duration::from_secs(5)),
            module_time_per_batch: Duration::from_secs(30),
            release: ReleaseLimits::default(),
            untimed_topics: Vec::new(),
        }
    }
}

/// Events handed to a handler, as seen by a [`CallObserver`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCall {
    /// The partition.
    pub partition: u32,
    /// The key.
    pub key: Key,
    /// The event type.
    pub tag: EventTypeTag,
    /// Offsets of the run's events, in log order.
    pub offsets: Vec<u64>,
    /// Events after reduction.
    pub reduced: usize,
    /// Handler calls made for the run.
    pub calls: usize,
}

/// Watches handler calls; tests use it to check execution order.
///
/// Calls for one key are reported in the order they ran: each successful
/// chunk of a run that reduction left as it was, or the whole of a reduced
/// run once every chunk of it succeeded. For records taken from the retry
/// topic the offsets are the origin offsets they carry.
pub trait CallObserver: Send + Sync {
    /// A run was handled successfully.
    fn run_handled(&self, call: &RunCall);
}
