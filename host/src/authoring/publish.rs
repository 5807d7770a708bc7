//! Publishing events: bodies in, messages with headers out.
//!
//! The headers of a message come from the module that handles it: its
//! `key` and `ordering` exports read the body, its declared event type
//! gives the algebra, and for a timed type its `event-time` export gives
//! the `waku-event-time` header. A publisher never hard-codes any of it.
//!
//! Rules it keeps:
//! - **All or nothing.** Every event of a call is checked (parsed, its type
//!   known, its key and ordering computed) before anything is appended; one
//!   bad event fails the call with its position, and nothing is published.
//! - **Nothing twice, and what is unconfirmed is named.** The events go in
//!   rounds of up to [`ROUND`] per partition, each round one stamped append
//!   ([`EventLog::append_as`]: one transaction on the embedded log, one
//!   request per partition on Iggy) under a producer name of this call. A
//!   round the log did not confirm because it was unavailable (a cluster
//!   electing a leader, a server restarting) is sent again once the log
//!   answers, after its stamp was looked for from where the partitions
//!   ended when the call began, so a round whose answer was lost is not
//!   stored twice. After [`PATIENCE`] without an answer the call fails with
//!   [`PublishError::Unconfirmed`], naming by line every event the log did
//!   not confirm.
//! - **Errors name the line.** In JSON-lines input, line numbers start at 1
//!   and blank lines are skipped but still counted.
//! - **A timed type's events carry their time** (`event-time-declared`):
//!   the module's `event-time` answer is written into `waku-event-time`,
//!   and an answer of none refuses the event
//!   ([`ContractError::EventTimeDeclared`]). An untimed type's module is
//!   never asked, and its messages carry no such header.
//! - **Each event fits the log.** An event larger with its headers than
//!   the log takes per record ([`EventLog::max_record_bytes`]) is
//!   [`PublishError::TooLarge`], before anything is appended.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::event::{EventHeaders, EventTiming, EventTypeTag, partition_for};
use crate::sandbox::handler::{CallError, ContractError, EventType, HandlerModule};
use crate::storage::log::{EventLog, LogError, Record};

/// Why events could not be published. Nothing was appended, but for
/// [`PublishError::Unconfirmed`], which says what may be.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// A line is not valid JSON of the expected shape.
    #[error("line {line}: {reason}")]
    Malformed {
        /// The line number (from 1).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// An event names a type the module does not declare.
    #[error("line {line}: the module does not declare event type `{name}` (it declares: {known})")]
    UnknownType {
        /// The line number (from 1).
        line: usize,
        /// The name or tag given.
        name: String,
        /// What the module declares.
        known: String,
    },
    /// The module refused the body.
    #[error("line {line}: the module could not read the `{event_type}` body: {error}")]
    Rejected {
        /// The line number (from 1).
        line: usize,
        /// The event type.
        event_type: String,
        /// What the module said.
        error: CallError,
    },
    /// An event with its headers is larger than the log takes per record.
    #[error(
        "line {line}: the event has {size} bytes with its headers, over the log's limit of {limit} bytes per \
         record; publish a smaller event (keep large data elsewhere and put a reference in the body)"
    )]
    TooLarge {
        /// The line number (from 1).
        line: usize,
        /// The record's size as the log would store it.
        size: usize,
        /// The most the log takes.
        limit: usize,
    },
    /// The topic is one of the host's own retry and dead-letter topics.
    #[error(
        "`{topic}` is one of the host's own topics (`retry_*` and `dlq_*` hold what projections route there); \
         publish to the topic a projection consumes, and re-drive dead letters with `waku dlq redrive`"
    )]
    HostTopic {
        /// The topic asked for.
        topic: String,
    },
    /// The log refused the append.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The log stayed unavailable: these events were not confirmed (the
    /// log may hold some of them); every other event is stored once.
    #[error(
        "the log did not confirm {count} of the events (lines {lines}), the others are stored: {source}; the \
         unconfirmed ones may or may not be stored, check the topic before publishing them again"
    )]
    Unconfirmed {
        /// How many events.
        count: usize,
        /// Their lines, as ranges (`3-5, 9`).
        lines: String,
        /// Why the log did not confirm them.
        #[source]
        source: Box<LogError>,
    },
}

/// Most events of one partition in one round of a publish.
pub const ROUND: usize = 4096;

/// How long a publish waits for an unavailable log to answer again before
/// it reports what it could not confirm.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Refuses the host's own topics: a record published there would be read
/// as routed work, or ignored and read again at every start.
pub fn check_topic(topic: &str) -> Result<(), PublishError> {
    match wakuwaku_core::limits::is_host_topic(topic) {
        true => Err(PublishError::HostTopic { topic: topic.to_owned() }),
        false => Ok(()),
    }
}

/// One event to publish: its type and its body bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The event type's tag.
    pub tag: EventTypeTag,
    /// The body, as the module decodes it.
    pub body: Vec<u8>,
}

/// A JSON line: `{"type": "<event type name>", "body": {…}}`; `"tag": N`
/// may stand instead of `"type"`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    #[serde(rename = "type")]
    type_name: Option<String>,
    tag: Option<u32>,
    body: serde_json::Value,
}

/// Reads JSON lines into events of `module`'s types. Every line is
/// checked; the first error is returned with its line number.
pub fn parse_json_lines(text: &str, module: &dyn HandlerModule) -> Result<Vec<Outgoing>, PublishError> {
    let types = module.event_types();
    let mut events = Vec::new();
    for (index, text) in text.lines().enumerate() {
        let line = index + 1;
        if text.trim().is_empty() {
            continue;
        }
        let parsed: Line =
            serde_json::from_str(text).map_err(|e| PublishError::Malformed { line, reason: e.to_string() })?;
        let event_type = match (&parsed.type_name, parsed.tag) {
            (Some(name), None) => types.iter().find(|t| &t.name == name),
            (None, Some(tag)) => types.iter().find(|t| t.tag.get() == tag),
            _ => {
                return Err(PublishError::Malformed {
                    line,
                    reason: "give exactly one of `type` (an event type name) and `tag`".into(),
                });
            }
        };
        let Some(event_type) = event_type else {
            let name = parsed.type_name.unwrap_or_else(|| parsed.tag.unwrap_or_default().to_string());
            return Err(PublishError::UnknownType { line, name, known: known_types(types) });
        };
        let body = serde_json::to_vec(&parsed.body).expect("a JSON value always serialises");
        events.push(Outgoing { tag: event_type.tag, body });
    }
    Ok(events)
}

/// The line number (from 1) of every event of a JSON-lines `text`, as
/// [`parse_json_lines`] reads them (blank lines skipped): what
/// [`publish`] names in its errors.
pub fn event_lines(text: &str) -> Vec<usize> {
    text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()).map(|(index, _)| index + 1).collect()
}

/// Computes every event's headers with the module, then appends them all to
/// `topic`, each to the partition of its key. Event `i` is reported as line
/// `lines[i]` in errors (pass `None` to number events from 1).
///
/// Headers are computed on up to `threads` instances at once.
pub async fn publish<L: EventLog>(
    log: &L,
    topic: &str,
    module: Arc<dyn HandlerModule>,
    events: Vec<Outgoing>,
    lines: Option<Vec<usize>>,
    threads: usize,
) -> Result<usize, PublishError> {
    check_topic(topic)?;
    let partitions = patiently(PATIENCE, || log.partitions(topic)).await?;
    let count = events.len();
    let limit = log.max_record_bytes(topic);
    let line_of = {
        let lines = lines.clone();
        move |index: usize| lines.as_ref().and_then(|lines| lines.get(index).copied()).unwrap_or(index + 1)
    };
    let records =
        tokio::task::spawn_blocking(move || envelope_all(&*module, events, lines, partitions, threads, limit))
            .await
            .expect("computing headers does not panic")?;
    let mut queues: Vec<Vec<(usize, Record)>> = (0..partitions).map(|_| Vec::new()).collect();
    for (index, (partition, record)) in records.into_iter().enumerate() {
        queues[partition as usize].push((line_of(index), record));
    }
    append_in_rounds(log, topic, queues, PATIENCE).await?;
    Ok(count)
}

/// Appends each partition's `(line, record)`s in rounds of [`ROUND`], each
/// a stamped append, waiting out an unavailable log for up to `patience`
/// per round (rules in the module docs).
async fn append_in_rounds<L: EventLog>(
    log: &L,
    topic: &str,
    mut queues: Vec<Vec<(usize, Record)>>,
    patience: Duration,
) -> Result<(), PublishError> {
    let since = patiently(patience, || log.end_offsets(topic)).await?;
    let producer = format!("waku-publish-{:016x}", rand::random::<u64>());
    let rounds = queues.iter().map(|queue| queue.len().div_ceil(ROUND)).max().unwrap_or(0);
    for round in 0..rounds {
        let batches: Vec<(u32, Vec<Record>)> = (0..queues.len())
            .filter_map(|partition| {
                let queue = &queues[partition];
                let start = (round * ROUND).min(queue.len());
                let records: Vec<Record> =
                    queue[start..(start + ROUND).min(queue.len())].iter().map(|(_, record)| record.clone()).collect();
                (!records.is_empty()).then_some((partition as u32, records))
            })
            .collect();
        if let Err(source) =
            append_patiently(log, topic, batches, (&producer, round as u64 + 1), &since, patience).await
        {
            let mut unconfirmed: Vec<usize> = queues
                .iter_mut()
                .flat_map(|queue| queue.drain((round * ROUND).min(queue.len())..).map(|(line, _)| line))
                .collect();
            unconfirmed.sort_unstable();
            return Err(PublishError::Unconfirmed {
                count: unconfirmed.len(),
                lines: line_ranges(&unconfirmed),
                source: Box::new(source),
            });
        }
    }
    Ok(())
}

/// One round's append stamped `(producer, sequence)`, sent again while
/// the log is unavailable, for up to `patience`; before each resend the
/// partitions' stamps are looked for from `since`, so what reached the log
/// is not sent twice.
async fn append_patiently<L: EventLog>(
    log: &L,
    topic: &str,
    batches: Vec<(u32, Vec<Record>)>,
    (producer, sequence): (&str, u64),
    since: &[u64],
    patience: Duration,
) -> Result<(), LogError> {
    let mut first = true;
    patiently(patience, || {
        let resend = !std::mem::replace(&mut first, false);
        let batches = batches.clone();
        async move {
            if resend {
                for (partition, _) in &batches {
                    let from = since.get(*partition as usize).copied().unwrap_or(0);
                    log.producer_sequence(topic, *partition, producer, from).await?;
                }
            }
            log.append_as(topic, batches, producer, sequence).await.map(drop)
        }
    })
    .await
}

/// `step`, tried again while it fails with the log unavailable, with a
/// growing pause, until `patience` has passed.
async fn patiently<T, F, Fut>(patience: Duration, mut step: F) -> Result<T, LogError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LogError>>,
{
    let began = Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        match step().await {
            Err(LogError::Unavailable { .. }) if began.elapsed() < patience => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            done => return done,
        }
    }
}

/// Sorted line numbers as ranges: `1-3, 7, 9-10`.
fn line_ranges(lines: &[usize]) -> String {
    let mut ranges: Vec<String> = Vec::new();
    let mut index = 0;
    while index < lines.len() {
        let start = lines[index];
        let mut end = start;
        while index + 1 < lines.len() && lines[index + 1] == end + 1 {
            index += 1;
            end = lines[index];
        }
        ranges.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
        index += 1;
    }
    ranges.join(", ")
}

/// Headers for every event, split over `threads` instances; keeps order.
/// A record over `limit` bytes as stored is [`PublishError::TooLarge`].
fn envelope_all(
    module: &dyn HandlerModule,
    events: Vec<Outgoing>,
    lines: Option<Vec<usize>>,
    partitions: u32,
    threads: usize,
    limit: Option<usize>,
) -> Result<Vec<(u32, Record)>, PublishError> {
    let line_of = |i: usize| lines.as_ref().and_then(|l| l.get(i).copied()).unwrap_or(i + 1);
    let types = module.event_types();
    let chunk = events.len().div_ceil(threads.max(1)).max(1);
    let results: Vec<Result<Vec<(u32, Record)>, PublishError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = events
            .chunks(chunk)
            .enumerate()
            .map(|(part, slice)| {
                scope.spawn(move || {
                    let mut instance = module.instantiate().map_err(|error| PublishError::Rejected {
                        line: line_of(part * chunk),
                        event_type: module.name().to_owned(),
                        error,
                    })?;
                    slice
                        .iter()
                        .enumerate()
                        .map(|(offset, event)| {
                            let line = line_of(part * chunk + offset);
                            let event_type =
                                types.iter().find(|t| t.tag == event.tag).ok_or_else(|| PublishError::UnknownType {
                                    line,
                                    name: format!("tag {}", event.tag),
                                    known: known_types(types),
                                })?;
                            let headers = headers_for(&mut *instance, event_type, &event.body).map_err(|error| {
                                PublishError::Rejected { line, event_type: event_type.name.clone(), error }
                            })?;
                            let record = Record { headers: headers.to_headers(), body: event.body.clone() };
                            if let Some(limit) = limit {
                                // Cannot fail: a record is byte strings of known lengths.
                                let size = postcard::experimental::serialized_size(&record).unwrap_or(usize::MAX);
                                if size > limit {
                                    return Err(PublishError::TooLarge { line, size, limit });
                                }
                            }
                            Ok((partition_for(headers.key.key_hash(), partitions), record))
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("header threads do not panic")).collect()
    });
    let mut records = Vec::with_capacity(events.len());
    for part in results {
        records.extend(part?);
    }
    Ok(records)
}

/// What a module declares, for error messages: `Name (tag N), …`.
fn known_types(types: &[EventType]) -> String {
    types.iter().map(|t| format!("{} (tag {})", t.name, t.tag)).collect::<Vec<_>>().join(", ")
}

/// The envelope of one body, from the module's `key` and `ordering`, and
/// for a timed type its `event-time` (none is refused:
/// `event-time-declared`).
pub fn headers_for(
    instance: &mut dyn crate::sandbox::handler::HandlerInstance,
    event_type: &EventType,
    body: &[u8],
) -> Result<EventHeaders, CallError> {
    // `timed-relaxed` is timed: only how the host plans its events differs.
    let event_time = match event_type.timing {
        EventTiming::Untimed => None,
        EventTiming::Timed | EventTiming::TimedRelaxed => {
            Some(instance.event_time(event_type.tag, body)?.ok_or_else(|| ContractError::EventTimeDeclared {
                name: event_type.name.clone(),
                tag: event_type.tag.get(),
                from_module: true,
            })?)
        }
    };
    Ok(EventHeaders {
        tag: event_type.tag,
        key: instance.key(event_type.tag, body)?,
        ordering: instance.ordering(event_type.tag, body)?,
        algebra: event_type.algebra,
        event_time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Algebra, EventAtomicOrdering};
    use crate::key::Key;
    use crate::sandbox::handler::{HandlerInstance, KeyScope};

    /// Answers `event-time` with `time`, and key 7 and relaxed.
    struct Stamps(Option<i64>);

    impl HandlerInstance for Stamps {
        fn handle(&mut self, _: &mut KeyScope, _: EventTypeTag, _: &[Vec<u8>]) -> Result<(), CallError> {
            Ok(())
        }
        fn combine(&mut self, _: EventTypeTag, bodies: &[Vec<u8>]) -> Result<Vec<u8>, CallError> {
            Ok(bodies[0].clone())
        }
        fn key(&mut self, _: EventTypeTag, _: &[u8]) -> Result<Key, CallError> {
            Ok(Key::int(7u64))
        }
        fn ordering(&mut self, _: EventTypeTag, _: &[u8]) -> Result<EventAtomicOrdering, CallError> {
            Ok(EventAtomicOrdering::Relaxed)
        }
        fn event_time(&mut self, _: EventTypeTag, _: &[u8]) -> Result<Option<i64>, CallError> {
            Ok(self.0)
        }
    }

    fn event_type(timing: EventTiming) -> EventType {
        let tag = EventTypeTag::new(3);
        EventType { tag, name: "Shipped".into(), algebra: Algebra::NonAssociative, max_batch: 1, timing }
    }

    #[test]
    fn a_timed_type_gets_the_modules_time_and_none_is_refused_naming_the_rule() {
        let timed = event_type(EventTiming::Timed);
        assert_eq!(headers_for(&mut Stamps(Some(-5)), &timed, b"{}").unwrap().event_time, Some(-5));
        let refused = headers_for(&mut Stamps(None), &timed, b"{}").unwrap_err();
        assert!(
            refused.to_string().contains("event-time-declared: event type `Shipped` (tag 3) declares event time"),
            "{refused}"
        );
        let untimed = event_type(EventTiming::Untimed);
        assert_eq!(headers_for(&mut Stamps(Some(9)), &untimed, b"{}").unwrap().event_time, None, "never asked");
        let opted_out = event_type(EventTiming::TimedRelaxed);
        assert_eq!(headers_for(&mut Stamps(Some(4)), &opted_out, b"{}").unwrap().event_time, Some(4));
        assert!(headers_for(&mut Stamps(None), &opted_out, b"{}").is_err(), "timed-relaxed is timed");
    }

    /// An embedded log whose appends of the calls in `lost` are stored
    /// but answered as unavailable (the answer lost).
    struct LostAnswers {
        log: crate::storage::log::EmbeddedLog,
        calls: std::sync::atomic::AtomicUsize,
        lost: std::ops::Range<usize>,
    }

    impl crate::storage::log::ForwardingLog for LostAnswers {
        type Inner = crate::storage::log::EmbeddedLog;

        fn inner(&self) -> impl std::ops::Deref<Target = Self::Inner> + Send + '_ {
            &self.log
        }

        async fn append_as(
            &self,
            topic: &str,
            batches: Vec<(u32, Vec<Record>)>,
            producer: &str,
            sequence: u64,
        ) -> Result<bool, LogError> {
            let call = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let appended = self.log.append_as(topic, batches, producer, sequence).await?;
            match self.lost.contains(&call) {
                true => Err(LogError::Unavailable { address: "test".into(), reason: "the answer was lost".into() }),
                false => Ok(appended),
            }
        }
    }

    async fn lost_answers(lost: std::ops::Range<usize>) -> (tempfile::TempDir, LostAnswers) {
        let dir = tempfile::tempdir().unwrap();
        let log = crate::storage::log::EmbeddedLog::open(dir.path().join("log")).unwrap();
        log.create_topic("t", 2).await.unwrap();
        (dir, LostAnswers { log, calls: Default::default(), lost })
    }

    /// Lines 1..=`events`, odd ones to partition 1, even ones to 0, their
    /// bodies their line numbers.
    fn queues(events: usize) -> Vec<Vec<(usize, Record)>> {
        let mut queues = vec![Vec::new(), Vec::new()];
        for line in 1..=events {
            queues[line % 2].push((line, Record { headers: vec![], body: line.to_string().into_bytes() }));
        }
        queues
    }

    /// The lines stored, sorted.
    async fn stored(log: &LostAnswers) -> Vec<usize> {
        let mut lines = Vec::new();
        for partition in 0..2 {
            for stored in log.log.read("t", partition, 0, usize::MAX).await.unwrap() {
                lines.push(String::from_utf8(stored.record.body).unwrap().parse().unwrap());
            }
        }
        lines.sort_unstable();
        lines
    }

    #[tokio::test]
    async fn a_log_that_answers_again_gets_every_event_once() {
        // Three rounds; the answers of the second round and of its first
        // resend are lost.
        let (_dir, log) = lost_answers(1..3).await;
        let events = 6 * ROUND;
        append_in_rounds(&log, "t", queues(events), Duration::from_millis(500)).await.unwrap();
        assert_eq!(stored(&log).await, (1..=events).collect::<Vec<_>>(), "every event once, none twice");
    }

    #[tokio::test]
    async fn what_the_log_never_confirmed_is_named_by_line_and_stored_at_most_once() {
        // Every answer from the second round on is lost, until the patience ends.
        let (_dir, log) = lost_answers(1..usize::MAX).await;
        let events = 6 * ROUND;
        let result = append_in_rounds(&log, "t", queues(events), Duration::from_millis(500)).await;
        let Err(PublishError::Unconfirmed { count, lines, .. }) = result else { panic!("{result:?}") };
        assert_eq!(count, 4 * ROUND, "the second and third rounds");
        assert_eq!(lines, format!("{}-{events}", 2 * ROUND + 1));
        // The second round reached the log once, however often it was sent;
        // the third was never sent.
        assert_eq!(stored(&log).await, (1..=4 * ROUND).collect::<Vec<_>>());
    }

    #[test]
    fn lines_are_named_as_ranges() {
        assert_eq!(line_ranges(&[1, 2, 3, 7, 9, 10]), "1-3, 7, 9-10");
        assert_eq!(line_ranges(&[4]), "4");
        assert_eq!(line_ranges(&[]), "");
    }
}
