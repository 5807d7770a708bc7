//! [`ForwardingLog`]: a log that wraps another and changes part of what it
//! does, every other call going to the log it wraps (the forwarding is
//! written once, in `storage/forwarding.rs`).
//!
//! Rules kept here:
//! - `event_log_methods!` lists every method of [`EventLog`] once: a new
//!   method of the trait is one line there, and [`AnyLog`] and every
//!   forwarding log forward it. A test reads both and fails on a method
//!   the list misses (it would not be forwarded: wrappers would answer the
//!   trait's default).
//! - A forwarding log forwards the methods [`EventLog`] gives a default
//!   too: one that wants the default's answer over the wrapped log's writes
//!   it ([`poll_by_reading`] is [`EventLog::poll`]'s).

use std::ops::Deref;
use std::time::SystemTime;

use super::loss::Durability;
use super::{AnyLog, EventLog, LogError, LogNodes, PolledBatch, Record, StoredRecord};
use crate::storage::forwarding::forward_methods;

/// Every method of [`EventLog`], handed to `forward_methods!` after `how`.
macro_rules! event_log_methods {
    ($($how:tt)+) => {
        forward_methods! { $($how)+;
            async fn create_topic(topic: &str, partitions: u32) -> Result<(), LogError>;
            async fn partitions(topic: &str) -> Result<u32, LogError>;
            async fn topics() -> Result<Vec<(String, u32)>, LogError>;
            async fn append(topic: &str, batches: Vec<(u32, Vec<Record>)>) -> Result<(), LogError>;
            async fn append_as(topic: &str, batches: Vec<(u32, Vec<Record>)>, producer: &str, sequence: u64) -> Result<bool, LogError>;
            async fn producer_sequence(topic: &str, partition: u32, producer: &str, since: u64) -> Result<Option<u64>, LogError>;
            async fn read(topic: &str, partition: u32, from: u64, max: usize) -> Result<Vec<StoredRecord>, LogError>;
            async fn poll(topic: &str, partition: u32, from: u64, max: usize, batch: PolledBatch) -> Result<PolledBatch, LogError>;
            fn max_record_bytes(topic: &str) -> Option<usize>;
            fn appends() -> Option<tokio::sync::watch::Receiver<()>>;
            fn forget_producer(producer: &str);
            async fn end_offset(topic: &str, partition: u32) -> Result<u64, LogError>;
            async fn end_offsets(topic: &str) -> Result<Vec<u64>, LogError>;
            async fn extent(topic: &str, partition: u32) -> Result<(u64, u64), LogError>;
            async fn durability(topic: &str) -> Result<Durability, LogError>;
            fn accepts_lossy_topics() -> bool;
            async fn topic_identity(topic: &str) -> Result<Option<String>, LogError>;
            async fn store_consumer_offset(consumer: &str, topic: &str, partition: u32, next: u64) -> Result<(), LogError>;
            async fn consumer_offset(consumer: &str, topic: &str, partition: u32) -> Result<Option<u64>, LogError>;
            async fn offset_at(topic: &str, partition: u32, time: SystemTime) -> Result<u64, LogError>;
            async fn group_partitions(topic: &str, group: &str) -> Result<Vec<u32>, LogError>;
            async fn leave_group(topic: &str, group: &str) -> Result<(), LogError>;
            async fn nodes() -> Result<Option<LogNodes>, LogError>;
            fn failovers() -> u64;
        }
    };
}

/// A log that wraps another: every [`EventLog`] method it does not define
/// goes to [`ForwardingLog::inner`]. It is an [`EventLog`] itself.
///
/// Define a method in the implementation of this trait, under its
/// [`EventLog`] name, to change it. Name this trait by its path there
/// (`impl log::ForwardingLog for …`) rather than importing it: with both
/// traits in scope, a call such as `wrapper.read(…)` is ambiguous (inside
/// that implementation it is: call `EventLog::read(self, …)` there).
pub trait ForwardingLog: Send + Sync + 'static {
    /// The log wrapped.
    type Inner: EventLog;

    /// The log each call goes to, held for the call: a reference, or a
    /// handle on a log that may be replaced between calls.
    fn inner(&self) -> impl Deref<Target = Self::Inner> + Send + '_;

    event_log_methods!(to_inner EventLog);
}

impl<W: ForwardingLog> EventLog for W {
    event_log_methods!(to_forwarding ForwardingLog);
}

impl EventLog for AnyLog {
    event_log_methods!(to_variants AnyLog [Embedded, Iggy]);
}

/// [`EventLog::poll`] as its default does it: `log`'s
/// [`read`](EventLog::read), packed into `batch`. For a wrapper that polls
/// through its own `read` rather than the wrapped log's `poll`.
pub async fn poll_by_reading<L: EventLog + ?Sized>(
    log: &L,
    topic: &str,
    partition: u32,
    from: u64,
    max: usize,
    mut batch: PolledBatch,
) -> Result<PolledBatch, LogError> {
    batch.clear();
    for stored in log.read(topic, partition, from, max).await? {
        if batch.is_full() {
            break;
        }
        super::push_stored(&mut batch, topic, partition, &stored)?;
    }
    Ok(batch)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::ops::Deref;
    use std::sync::atomic::{AtomicUsize, Ordering};

    // Not `super::*`: with `ForwardingLog` in scope, calls on a wrapper
    // would be ambiguous (see its docs).
    use super::poll_by_reading;
    use crate::storage::log::embedded::MAX_RECORD_BYTES;
    use crate::storage::log::{AnyLog, EmbeddedLog, EventLog, LogError, PolledBatch, Record, StoredRecord};

    /// Counts the reads it forwards and hides partition 1; nothing else of
    /// its own.
    struct CountingReads {
        log: EmbeddedLog,
        reads: AtomicUsize,
    }

    impl super::ForwardingLog for CountingReads {
        type Inner = EmbeddedLog;

        fn inner(&self) -> impl Deref<Target = EmbeddedLog> + Send + '_ {
            &self.log
        }

        async fn read(
            &self,
            topic: &str,
            partition: u32,
            from: u64,
            max: usize,
        ) -> Result<Vec<StoredRecord>, LogError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            match partition {
                1 => Ok(Vec::new()),
                _ => self.log.read(topic, partition, from, max).await,
            }
        }
    }

    fn record(body: &[u8]) -> Record {
        Record { headers: Vec::new(), body: body.to_vec() }
    }

    async fn wrapped(dir: &tempfile::TempDir) -> CountingReads {
        let log = EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
        let wrapper = CountingReads { log, reads: AtomicUsize::new(0) };
        wrapper.create_topic("t", 2).await.unwrap();
        wrapper.append("t", vec![(0, vec![record(b"a"), record(b"b")]), (1, vec![record(b"c")])]).await.unwrap();
        wrapper
    }

    #[tokio::test]
    async fn a_forwarding_log_changes_what_it_defines_and_forwards_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let wrapper = wrapped(&dir).await;
        // Forwarded: the wrapped log holds what went through the wrapper,
        // and the wrapper answers as the wrapped log does, the methods with
        // a default in the trait included.
        assert_eq!(wrapper.log.end_offsets("t").await.unwrap(), [2, 1]);
        assert_eq!(wrapper.end_offsets("t").await.unwrap(), [2, 1]);
        assert_eq!(wrapper.topics().await.unwrap(), [("t".to_owned(), 2)]);
        assert_eq!(wrapper.max_record_bytes("t"), Some(MAX_RECORD_BYTES));
        assert!(wrapper.appends().is_some(), "the embedded log's append signal");
        assert_eq!(wrapper.extent("t", 0).await.unwrap(), (0, 2));
        // Defined: reads are counted and partition 1 hides its record.
        assert_eq!(wrapper.read("t", 0, 0, 10).await.unwrap().len(), 2);
        assert!(wrapper.read("t", 1, 0, 10).await.unwrap().is_empty());
        assert_eq!(wrapper.reads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_forwarding_log_polls_the_wrapped_log_or_through_its_own_read() {
        let dir = tempfile::tempdir().unwrap();
        let wrapper = wrapped(&dir).await;
        // Forwarded: the wrapped log's poll sees partition 1.
        assert_eq!(wrapper.poll("t", 1, 0, 10, PolledBatch::new()).await.unwrap().len(), 1);
        assert_eq!(wrapper.reads.load(Ordering::SeqCst), 0, "not through its read");
        // Through its own read, as the trait's default polls.
        let polled = poll_by_reading(&wrapper, "t", 0, 1, 10, PolledBatch::new()).await.unwrap();
        assert_eq!(polled.iter().map(|view| view.body().to_vec()).collect::<Vec<_>>(), [b"b".to_vec()]);
        assert!(poll_by_reading(&wrapper, "t", 1, 0, 10, polled).await.unwrap().is_empty(), "its read hides it");
        assert_eq!(wrapper.reads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn any_log_forwards_to_the_log_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let any = AnyLog::Embedded(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
        any.create_topic("t", 3).await.unwrap();
        any.append("t", vec![(2, vec![record(b"a")])]).await.unwrap();
        let AnyLog::Embedded(log) = &any else { unreachable!() };
        assert_eq!(log.end_offsets("t").await.unwrap(), [0, 0, 1]);
        assert_eq!(any.partitions("t").await.unwrap(), 3);
        assert_eq!(any.max_record_bytes("t"), Some(MAX_RECORD_BYTES));
        assert!(any.appends().is_some());
        assert!(matches!(any.group_partitions("t", "g").await, Err(LogError::NoConsumerGroups)));
    }

    /// The names of the methods declared in `source` between `start` and
    /// the next line `end`, at `indent`.
    pub(crate) fn declared(source: &str, start: &str, end: &str, indent: &str) -> Vec<String> {
        let block = &source[source.find(start).expect("start")..];
        let block = &block[..block.find(end).expect("end")];
        let mut names: Vec<String> = block
            .lines()
            .filter_map(|line| line.strip_prefix(indent))
            .filter_map(|line| line.strip_prefix("async ").or(Some(line)))
            .filter_map(|line| line.strip_prefix("fn "))
            .map(|line| line[..line.find(['(', '<']).unwrap_or(line.len())].to_owned())
            .collect();
        names.sort();
        names
    }

    /// A method missing from the list would not be forwarded: a wrapper
    /// would answer the trait's default, or fail to build.
    #[test]
    fn the_list_names_every_method_of_the_trait() {
        let trait_methods = declared(include_str!("mod.rs"), "pub trait EventLog", "\n}\n", "    ");
        let listed =
            declared(include_str!("forwarding.rs"), "macro_rules! event_log_methods", "\n    };", "            ");
        assert_eq!(trait_methods.len(), 24);
        assert_eq!(listed, trait_methods);
    }
}
