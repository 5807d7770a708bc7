//! Failures go somewhere: every row of the error table end to end on the
//! embedded log, the order of a key across retries and diversion, the
//! isolation of a poisoned key, retries surviving a restart, and the
//! accounting that says where every event went.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig, RunCall};
use wakuwaku::engine::projection::Projection;
use wakuwaku::engine::routing::{FailureClass, RetryPolicy, Routed};
use wakuwaku::event::{Algebra, EventAtomicOrdering, EventHeaders, EventTypeTag, Header, partition_for};
use wakuwaku::key::Key;
use wakuwaku::operations::host::HostSettings;
use wakuwaku::plan::PlanRecord;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record};
use wakuwaku::storage::state::StateStore;
use wakuwaku::storage::stats::Stats;
use wakuwaku_tests::flaky::{Flaky, OTHER, STEP, SUM, Step};
use wakuwaku_tests::{Recorder, catch_up, check_call_order, host_settings};

use EventAtomicOrdering::{AcqRel, Acquire, Relaxed, Release};

const TOPIC: &str = "steps";

/// One event to publish.
struct Event {
    /// The key's integer (`Key::int`).
    key: u64,
    tag: EventTypeTag,
    ordering: EventAtomicOrdering,
    step: Step,
}

fn event(key: u64, tag: EventTypeTag, ordering: EventAtomicOrdering, seq: u64, fail: &[&str]) -> Event {
    let fail = fail.iter().map(|s| (*s).to_owned()).collect();
    Event { key, tag, ordering, step: Step { seq, amount: 1, fail, ..Step::default() } }
}

fn record(e: &Event) -> Record {
    let algebra = if e.tag == SUM { Algebra::Associative } else { Algebra::NonAssociative };
    let headers = EventHeaders { tag: e.tag, key: Key::int(e.key), ordering: e.ordering, algebra, event_time: None };
    Record { headers: headers.to_headers(), body: e.step.body() }
}

struct Setup {
    dir: tempfile::TempDir,
    log: Arc<EmbeddedLog>,
    module: Flaky,
    partitions: u32,
}

impl Setup {
    async fn new(partitions: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
        log.create_topic(TOPIC, partitions).await.unwrap();
        Self { dir, log, module: Flaky::new(), partitions }
    }

    /// Appends events, each to its key's partition, in the order given.
    async fn publish(&self, events: &[Event]) {
        for e in events {
            self.log
                .append(TOPIC, vec![(partition_for(Key::int(e.key).key_hash(), self.partitions), vec![record(e)])])
                .await
                .unwrap();
        }
    }

    /// A projection over the topic, with its state in the test directory:
    /// opening it again is a restart.
    fn projection(&self) -> Arc<Projection> {
        let store = StateStore::open(&self.dir.path().join("flaky.redb")).unwrap();
        Arc::new(Projection::new("flaky", TOPIC, vec![Arc::new(self.module.clone())], store).unwrap())
    }

    /// A bare consumer of `projection`, for tests that catch up with it
    /// more than once while holding its store; the others start a host of
    /// [`Self::settings`].
    fn consumer(&self, projection: &Arc<Projection>, batch_size: usize, retry: RetryPolicy) -> Consumer<EmbeddedLog> {
        Consumer::new(self.log.clone(), projection.clone(), consumer_config(batch_size, retry))
    }

    /// The settings of a host of the projection, with its state in the
    /// test directory: starting another is a restart.
    fn settings(&self, batch_size: usize, retry: RetryPolicy) -> HostSettings {
        let modules = vec![Arc::new(self.module.clone()) as _];
        host_settings(self.dir.path(), "flaky", TOPIC, modules, consumer_config(batch_size, retry))
    }

    /// Every record of `topic`, all partitions, with routing headers parsed.
    async fn routed(&self, topic: &str) -> Vec<(Record, Routed)> {
        let mut all = Vec::new();
        for partition in 0..self.partitions {
            let end = self.log.end_offset(topic, partition).await.unwrap();
            for stored in self.log.read(topic, partition, 0, end as usize).await.unwrap() {
                let routed = Routed::parse(&stored.record.headers).unwrap();
                all.push((stored.record, routed));
            }
        }
        all
    }
}

/// Two workers, batches of `batch_size`, `retry`.
fn consumer_config(batch_size: usize, retry: RetryPolicy) -> ConsumerConfig {
    ConsumerConfig { batch_size, workers: 2, retry, ..ConsumerConfig::default() }
}

/// No waiting between attempts.
fn eager(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        transient_retries: 2,
        transient_backoff: Duration::from_millis(1),
        delays: vec![Duration::ZERO],
        max_attempts,
        ..RetryPolicy::default()
    }
}

fn stats(store: &StateStore) -> Stats {
    store.stats().unwrap()
}

/// consumed + re-driven = applied + skipped + dead-lettered + waiting in retry.
fn assert_accounted(store: &StateStore, consumed: u64, in_retry: u64) {
    let s = stats(store);
    assert_eq!(s.retrying(), in_retry, "events waiting in retry: {s:?}");
    assert_eq!(
        s.accounted(),
        i128::from(consumed),
        "every event is applied, skipped, dead-lettered or in retry: {s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_the_error_table_lands_where_it_should() {
    let setup = Setup::new(1).await;
    let events = [
        // transient, once: retried in place, applied in the same batch.
        event(1, STEP, Relaxed, 1, &["transient"]),
        // transient, always: in place twice, then retryable; after the
        // third attempt, dead-lettered as transient.
        event(2, STEP, Relaxed, 2, &["transient"; 20]),
        // retryable, once: the key stops, its later events wait behind it,
        // and all three are applied in order from the retry topic.
        event(3, STEP, Relaxed, 3, &["retryable"]),
        event(3, STEP, Relaxed, 4, &[]),
        event(3, OTHER, Acquire, 5, &[]),
        // unrecoverable: the chunk is dead-lettered, the key goes on.
        event(4, STEP, Relaxed, 6, &[]),
        event(4, STEP, Relaxed, 7, &["unrecoverable"]),
        event(4, STEP, Relaxed, 8, &[]),
        // a trap, once: retryable with the trap as the reason.
        event(5, STEP, Relaxed, 9, &["trap"]),
        // a trap every time: dead-lettered after the last attempt.
        event(6, STEP, Relaxed, 10, &["trap"; 20]),
        // an unknown tag: skipped.
        Event { key: 7, tag: EventTypeTag::new(99), ordering: Relaxed, step: Step::default() },
    ];
    setup.publish(&events).await;
    // A message whose headers cannot be read.
    let garbled = Record { headers: vec![Header { name: "waku-version".into(), value: vec![7] }], body: b"?".to_vec() };
    setup.log.append(TOPIC, vec![(0, vec![garbled])]).await.unwrap();

    let (summary, projection) = catch_up(&setup.log, setup.settings(100, eager(3))).await.unwrap();
    let store = projection.store();

    assert_eq!(Flaky::applied(store, &Key::int(1u64)), [1]);
    assert_eq!(Flaky::applied(store, &Key::int(2u64)), Vec::<u64>::new());
    assert_eq!(Flaky::applied(store, &Key::int(3u64)), [3, 4, 5]);
    assert_eq!(Flaky::applied(store, &Key::int(4u64)), [6, 8]);
    assert_eq!(Flaky::applied(store, &Key::int(5u64)), [9]);
    assert_eq!(Flaky::applied(store, &Key::int(6u64)), Vec::<u64>::new());

    let dead = setup.routed("dlq_steps").await;
    let mut lines: Vec<(u64, FailureClass, u32, String)> = dead
        .iter()
        .map(|(_, r)| {
            let failure = r.failure.clone().unwrap();
            (r.origin_offset, failure.class, r.attempts, failure.message)
        })
        .collect();
    lines.sort_by_key(|l| l.0);
    assert_eq!(
        lines,
        [
            (1, FailureClass::Transient, 3, "transient handler error: step 2".to_owned()),
            (6, FailureClass::Unrecoverable, 1, "unrecoverable handler error: step 7".to_owned()),
            (9, FailureClass::Trap, 3, "module trapped: wasm trap: step 10 hit unreachable".to_owned()),
            (
                11,
                FailureClass::Malformed,
                0,
                "header format version 7 is not supported (this build reads version 2)".to_owned()
            ),
        ]
    );
    for (_, routed) in &dead {
        let failure = routed.failure.as_ref().unwrap();
        if failure.class != FailureClass::Malformed {
            assert_eq!((failure.module.as_str(), failure.version.as_str()), ("flaky", "flaky-1"));
        }
        assert_eq!((routed.projection.as_str(), routed.origin_partition, routed.events), ("flaky", 0, 1));
    }
    // The garbled message kept its own headers and body.
    let garbled = &dead.iter().find(|(_, r)| r.origin_offset == 11).unwrap().0;
    assert_eq!(garbled.body, b"?");
    assert_eq!(garbled.headers[0], Header { name: "waku-version".into(), value: vec![7] });

    assert_eq!((summary.consumed, summary.applied, summary.skipped, summary.dead_lettered), (12, 7, 1, 4));
    assert_accounted(store, 12, 0);
    assert_eq!(store.position(TOPIC, 0).unwrap(), Some(12));
    assert_eq!(store.position("retry_steps", 0).unwrap(), Some(setup.log.end_offset("retry_steps", 0).await.unwrap()));
}

/// The value of header `name`, as any consumer would read it: UTF-8 text.
/// No wakuwaku code.
fn text_header<'a>(headers: &'a [Header], name: &str) -> Option<&'a str> {
    let mut found = headers.iter().filter(|h| h.name == name);
    let value = found.next().map(|h| std::str::from_utf8(&h.value).expect("a text header"));
    assert!(found.next().is_none(), "{name} twice");
    value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_and_retries_carry_their_context_as_plain_text() {
    let setup = Setup::new(1).await;
    setup
        .publish(&[
            event(1, STEP, Relaxed, 1, &["trap"; 20]),
            event(2, STEP, Relaxed, 2, &["retryable"; 20]),
            event(2, STEP, Relaxed, 3, &[]),
        ])
        .await;
    let started = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let (summary, _) = catch_up(&setup.log, setup.settings(100, eager(3))).await.unwrap();
    assert_eq!(summary.dead_lettered, 2, "{summary:?}");

    // Read back with the log's plain reader: names and UTF-8 text, nothing
    // of wakuwaku's header parsing.
    let letters = setup.log.read("dlq_steps", 0, 0, 10).await.unwrap();
    let by_offset = |offset: &str| {
        letters.iter().find(|r| text_header(&r.record.headers, "waku.error.offset") == Some(offset)).unwrap()
    };
    let trapped = &by_offset("0").record.headers;
    let get = |name: &str| text_header(trapped, name).unwrap_or_else(|| panic!("no {name}"));
    assert_eq!(get("waku.error.topic"), TOPIC);
    assert_eq!(get("waku.error.partition"), "0");
    assert_eq!(get("waku.error.projection"), "flaky");
    assert_eq!(get("waku.error.module"), "flaky");
    assert_eq!(get("waku.error.module.version"), "flaky-1");
    assert_eq!(get("waku.error.event.type"), "Step");
    assert_eq!(get("waku.error.class"), "trap");
    assert_eq!(get("waku.error.message"), "module trapped: wasm trap: step 1 hit unreachable");
    assert_eq!(get("waku.error.attempts"), "3");
    assert_eq!(get("waku.error.events"), "1");
    // RFC 3339 UTC: ordered as text; the first attempt before the last.
    let (first, last) = (get("waku.error.first.failure"), get("waku.error.last.failure"));
    assert!(first.ends_with('Z') && first.len() == started.len(), "{first}");
    assert!(started.as_str() <= first && first <= last, "{started} {first} {last}");
    // Written in the text scheme only.
    assert!(trapped.iter().all(|h| !matches!(h.name.as_str(), "waku-failure" | "waku-origin-offset")));

    // The key's later event waited behind it in the retry topic, diverted
    // with no failure of its own.
    let retried = setup.log.read("retry_steps", 0, 0, 100).await.unwrap();
    let diverted = retried
        .iter()
        .map(|r| &r.record.headers)
        .find(|h| text_header(h, "waku.error.offset") == Some("2") && text_header(h, "waku.error.class").is_none())
        .expect("the diverted event");
    assert_eq!(text_header(diverted, "waku.error.attempts"), Some("0"));
    assert_eq!(text_header(diverted, "waku.error.first.failure"), None);
    assert_eq!(text_header(diverted, "waku.error.event.type"), Some("Step"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_keeps_its_order_across_retries_and_diversion() {
    let mut diverted = 0;
    for seed in 0..12 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let setup = Setup::new(2).await;
        let orderings = [Relaxed, Relaxed, Relaxed, Acquire, Release, AcqRel];
        let events: Vec<Event> = (0..300)
            .map(|seq| {
                let key = rng.random_range(0..6u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let tag = [STEP, OTHER, SUM][rng.random_range(0..3)];
                let ordering = orderings[rng.random_range(0..orderings.len())];
                let fail: &[&str] = match rng.random_range(0..25) {
                    0 => &["retryable"],
                    1 => &["trap", "retryable"],
                    2 => &["transient"],
                    _ => &[],
                };
                event(key, tag, ordering, seq, fail)
            })
            .collect();
        setup.publish(&events).await;
        let projection = setup.projection();
        let batch_size = rng.random_range(3..40);
        // A short delay, so later batches are polled while keys wait.
        let retry = RetryPolicy { delays: vec![Duration::from_millis(15)], ..eager(10) };
        // A bare consumer: it catches up again and again until no key waits in retry.
        let consumer = setup.consumer(&projection, batch_size, retry);
        let mut summary = consumer.catch_up().await.unwrap();
        while summary.retry_in > summary.retry_out {
            tokio::time::sleep(Duration::from_millis(15)).await;
            let more = consumer.catch_up().await.unwrap();
            summary.retry_in += more.retry_in;
            summary.retry_out += more.retry_out;
            summary.applied += more.applied;
        }
        assert_eq!(
            summary.applied,
            300,
            "seed {seed}: {:?}",
            setup
                .routed("dlq_steps")
                .await
                .iter()
                .map(|(r, x)| (String::from_utf8_lossy(&r.body).into_owned(), x.clone()))
                .collect::<Vec<_>>()
        );
        assert_accounted(projection.store(), 300, 0);
        diverted += setup.routed("retry_steps").await.iter().filter(|(_, r)| r.attempts == 0).count();

        // Every pair of events the spec orders was handled in that order,
        // and every event exactly once (sequence numbers stand in for
        // offsets: they follow log order within a partition).
        let calls: Vec<RunCall> = setup
            .module
            .handled()
            .into_iter()
            .map(|(key, tag, seqs)| RunCall {
                partition: partition_for(key.key_hash(), 2),
                key,
                tag,
                reduced: 1,
                calls: 1,
                offsets: seqs,
            })
            .collect();
        for partition in 0..2 {
            let log: Vec<(u64, Key, PlanRecord)> = events
                .iter()
                .filter(|e| partition_for(Key::int(e.key).key_hash(), 2) == partition)
                .map(|e| (e.step.seq, Key::int(e.key), PlanRecord { key: e.key, tag: e.tag, ordering: e.ordering }))
                .collect();
            check_call_order(partition, &log, &calls)
                .unwrap_or_else(|e| panic!("seed {seed}, batch size {batch_size}, partition {partition}: {e}"));
        }
    }
    assert!(diverted > 0, "no event was ever diverted behind a key in retry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_key_delays_no_other_key() {
    let setup = Setup::new(1).await;
    // Key 666 fails on every call; 20 other keys carry on around it.
    let events: Vec<Event> = (0..200)
        .map(|seq| match seq % 5 {
            0 => event(666, STEP, Relaxed, seq, &["retryable"; 100]),
            _ => event(seq % 20, OTHER, Relaxed, seq, &[]),
        })
        .collect();
    setup.publish(&events).await;
    let recorder = Arc::new(Recorder::default());
    let retry = RetryPolicy { delays: vec![Duration::from_secs(3600)], ..eager(5) };
    let settings = HostSettings { observer: Some(recorder.clone()), ..setup.settings(10, retry) };
    let (summary, projection) = catch_up(&setup.log, settings).await.unwrap();

    // Twenty batches of ten, no more: nothing waited for the poisoned key,
    // whose first event waits an hour in retry with the rest behind it.
    assert_eq!(summary.batches, 20);
    assert_eq!((summary.applied, summary.retry_in, summary.retry_out), (160, 40, 0));
    assert_eq!(projection.store().position(TOPIC, 0).unwrap(), Some(200));
    assert_accounted(projection.store(), 200, 40);
    // Every other event was handled in the batch that polled it: calls
    // arrive in batch order, so an event of batch b is never reported after
    // one of a later batch.
    let batches: Vec<u64> = recorder.calls().iter().flat_map(|c| c.offsets.iter().map(|o| o / 10)).collect();
    assert!(batches.windows(2).all(|w| w[0] <= w[1]), "{batches:?}");
    assert_eq!(batches.len(), 160);
    let waiting = setup.routed("retry_steps").await;
    assert_eq!(waiting.len(), 40);
    // The failed event has had an attempt and says why; the rest (the one
    // behind it in its batch, then the diverted ones) wait without one.
    assert_eq!(waiting[0].1.attempts, 1);
    assert_eq!(waiting[0].1.failure.as_ref().unwrap().class, FailureClass::Retryable);
    assert!(waiting[1..].iter().all(|(_, r)| r.attempts == 0 && r.failure.is_none()));
}

/// Catches up again and again until nothing waits in retry; the summaries
/// added up.
async fn drain_retries(consumer: &Consumer<EmbeddedLog>) -> wakuwaku::engine::consumer::Summary {
    let mut summary = consumer.catch_up().await.unwrap();
    while summary.retry_in > summary.retry_out {
        let more = consumer.catch_up().await.unwrap();
        summary.add(&more);
    }
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_keeps_failing_writes_each_event_to_retry_once_per_attempt() {
    // Every attempt of a key used to write all of the key's waiting events
    // to the retry topic again: a key of n events that kept failing wrote
    // about n² records (3.3 GB in 30 s for 300 events of 512 KiB).
    const N: u64 = 120;
    let setup = Setup::new(1).await;
    let events: Vec<Event> = (0..N).map(|seq| event(1, STEP, Relaxed, seq, &["retryable"; 10])).collect();
    setup.publish(&events).await;
    let projection = setup.projection();
    let consumer = setup.consumer(&projection, 20, eager(3));
    let summary = drain_retries(&consumer).await;
    assert_eq!((summary.applied, summary.dead_lettered), (0, N));
    assert_accounted(projection.store(), N, 0);
    // Each event went to retry once when it first failed or was diverted,
    // and once more for each attempt that left it due again: never again
    // for another event's attempt.
    let retried = setup.routed("retry_steps").await;
    assert!(retried.len() as u64 <= 3 * N, "{} records written to retry for {N} events", retried.len());
    // Dead-lettered in order, each after its three attempts.
    let letters = setup.routed("dlq_steps").await;
    let seqs: Vec<u64> =
        letters.iter().map(|(record, _)| serde_json::from_slice::<Step>(&record.body).unwrap().seq).collect();
    assert_eq!(seqs, (0..N).collect::<Vec<_>>());
    assert!(letters.iter().all(|(_, routed)| routed.attempts == 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_past_a_spent_batch_budget_are_not_called_and_stay_where_they_wait() {
    // Once a batch's budget was spent, every later key of the batch used
    // to be called anyway, refused, and written to retry again: k keys
    // cost about k²/2 calls and retry records.
    const K: u64 = 200;
    let setup = Setup::new(1).await;
    let events: Vec<Event> = (0..K).map(|seq| event(seq + 1, STEP, Relaxed, seq, &[])).collect();
    setup.publish(&events).await;
    let projection = setup.projection();
    // A few keys' writes fill a batch's budget.
    let payload = wakuwaku::sandbox::handler::PayloadLimits { max_batch_held: 1_000, ..Default::default() };
    let config = ConsumerConfig { payload, ..consumer_config(1_000, eager(5)) };
    let consumer = Consumer::new(setup.log.clone(), projection.clone(), config);
    let summary = drain_retries(&consumer).await;
    assert_eq!((summary.applied, summary.dead_lettered), (K, 0));
    assert_accounted(projection.store(), K, 0);
    for seq in 0..K {
        assert_eq!(Flaky::applied(projection.store(), &Key::int(seq + 1)), [seq]);
    }
    // One call per key, and per batch at most one more on each of its two
    // workers: the call that found the budget spent.
    let calls = setup.module.calls_made() as u64;
    assert!(calls <= K + 2 * summary.batches, "{calls} calls for {K} keys in {} batches", summary.batches);
    // Each key not reached went to retry once, and waited there.
    let retried = setup.routed("retry_steps").await.len() as u64;
    assert!(retried < K, "{retried} records written to retry for {K} keys");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_that_cannot_start_is_asked_once_per_worker_and_batch() {
    // Each key used to ask for an instance again: a start function that
    // traps (or the host's instance memory full) ran once per key.
    use std::sync::atomic::Ordering::SeqCst;
    let setup = Setup::new(1).await;
    let events: Vec<Event> = (0..100).map(|seq| event(seq + 1, STEP, Relaxed, seq, &[])).collect();
    setup.publish(&events).await;
    let projection = setup.projection();
    setup.module.unstartable.store(true, SeqCst);
    setup.module.instantiations.store(0, SeqCst);
    let retry = RetryPolicy { delays: vec![Duration::from_secs(3600)], ..eager(5) };
    let summary = setup.consumer(&projection, 100, retry).catch_up().await.unwrap();
    assert_eq!((summary.batches, summary.applied, summary.retry_in), (1, 0, 100));
    let asked = setup.module.instantiations.load(SeqCst);
    assert!(asked <= 2, "{asked} instances asked for in one batch of 100 keys on two workers");
    let waiting = setup.routed("retry_steps").await;
    assert!(waiting.iter().all(|(_, routed)| routed.failure.as_ref().is_some_and(|f| f.class == FailureClass::Trap)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_retry_queue_stops_the_partition_reading_until_it_drains_and_loses_nothing() {
    // A module that fails every key used to have every event of the
    // backlog diverted and held in memory (about 60 bytes each: 2 M
    // events, 120 MB, in 10 s). The queue's bound stops the reading.
    const N: u64 = 1000;
    let setup = Setup::new(1).await;
    let events: Vec<Event> = (0..N).map(|seq| event(seq, STEP, Relaxed, seq, &["retryable"; 10])).collect();
    setup.publish(&events).await;
    let projection = setup.projection();
    let cramped = RetryPolicy { delays: vec![Duration::from_secs(3600)], queue_max_bytes: 8 << 10, ..eager(5) };
    let consumer = setup.consumer(&projection, 20, cramped);
    let summary = consumer.follow(tokio::time::sleep(Duration::from_secs(1))).await.unwrap();
    // About 160 bytes per key with one record: 50 fill the queue, and the
    // batch that found it not yet full adds at most 20 more.
    let retried = setup.routed("retry_steps").await.len() as u64;
    assert!(summary.consumed <= 80 && retried <= 80, "consumed {}, {retried} in retry", summary.consumed);
    assert!(summary.consumed >= 40, "the queue filled with only {} events", summary.consumed);
    assert_eq!(summary.consumed, retried, "every event read went to retry: nothing was applied");
    drop(consumer);

    // With room, the rest is read, and every event is accounted for.
    let consumer = setup.consumer(&projection, 20, eager(1));
    let more = drain_retries(&consumer).await;
    assert_eq!(summary.consumed + more.consumed, N);
    assert_eq!(more.dead_lettered, N, "each failed once more and was dead-lettered");
    assert_accounted(projection.store(), N, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_retry_queue_is_never_full() {
    let setup = Setup::new(1).await;
    setup.publish(&(0..10).map(|seq| event(seq, STEP, Relaxed, seq, &[])).collect::<Vec<_>>()).await;
    let projection = setup.projection();
    let no_room = RetryPolicy { queue_max_bytes: 0, ..eager(3) };
    let consumer = setup.consumer(&projection, 4, no_room);
    let summary = tokio::time::timeout(Duration::from_secs(20), consumer.catch_up()).await;
    assert_eq!(summary.expect("the partition stalled").unwrap().applied, 10);
}

/// Records in the retry topic that are not the projection's (written by
/// someone else, or another projection's) are looked at once: the retry
/// position passes them with the next batch, so a restart does not read
/// (and log) them all again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_in_the_retry_topic_that_are_not_the_projections_are_read_once() {
    let setup = Setup::new(1).await;
    let retry = wakuwaku::engine::routing::retry_topic(TOPIC);
    setup.log.create_topic(&retry, 1).await.unwrap();
    let junk = (0..50).map(|i| Record { headers: Vec::new(), body: format!("junk {i}").into_bytes() }).collect();
    setup.log.append(&retry, vec![(0, junk)]).await.unwrap();
    setup.publish(&(0..10).map(|seq| event(seq, STEP, Relaxed, seq, &[])).collect::<Vec<_>>()).await;
    let projection = setup.projection();
    assert_eq!(setup.consumer(&projection, 4, eager(3)).catch_up().await.unwrap().applied, 10);
    assert_eq!(projection.store().position(&retry, 0).unwrap(), Some(50), "the retry position stayed behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_in_retry_are_rebuilt_at_start_up_and_wait_out_their_delay() {
    let setup = Setup::new(1).await;
    setup.publish(&[event(1, STEP, Relaxed, 1, &["retryable"]), event(2, STEP, Relaxed, 2, &[])]).await;
    // Long enough that the restart below comes before it on a busy CI
    // machine (the delay runs from the failure, inside the first run).
    let delay = Duration::from_secs(5);
    let retry = RetryPolicy { delays: vec![delay], ..eager(5) };
    let started = Instant::now();
    let failed_by = {
        let (summary, _) = catch_up(&setup.log, setup.settings(100, retry.clone())).await.unwrap();
        assert_eq!((summary.applied, summary.retry_in), (1, 1));
        Instant::now()
    };
    // Restart, with a later event of key 1 published meanwhile: it is
    // diverted behind the waiting one, which is not due yet.
    setup.publish(&[event(1, OTHER, Relaxed, 3, &[])]).await;
    let (summary, projection) = catch_up(&setup.log, setup.settings(100, retry.clone())).await.unwrap();
    assert!(started.elapsed() < delay, "the restart came after the delay ({:?}): nothing checked", started.elapsed());
    assert_eq!((summary.applied, summary.retry_in), (0, 1), "the key was not known to be in retry");
    assert_eq!(Flaky::applied(projection.store(), &Key::int(1u64)), Vec::<u64>::new());
    drop(projection);

    // Once the delay (measured from the failure) has passed, both are
    // applied, in order, after another restart.
    tokio::time::sleep_until((failed_by + delay + Duration::from_millis(100)).into()).await;
    let (summary, projection) = catch_up(&setup.log, setup.settings(100, retry)).await.unwrap();
    assert_eq!((summary.applied, summary.retry_out), (2, 2));
    assert_eq!(Flaky::applied(projection.store(), &Key::int(1u64)), [1, 3]);
    assert_accounted(projection.store(), 3, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folded_run_is_retried_as_one_record_that_counts_every_event() {
    let setup = Setup::new(1).await;
    let mut events: Vec<Event> = (1..=5).map(|seq| event(1, SUM, Relaxed, seq, &[])).collect();
    events[2].step.fail = vec!["retryable".into()];
    setup.publish(&events).await;
    let (summary, projection) = catch_up(&setup.log, setup.settings(100, eager(5))).await.unwrap();
    // One fold of five failed once, went to retry as one record standing
    // for five events, and was applied from there.
    assert_eq!((summary.retry_in, summary.retry_out, summary.applied), (5, 5, 5));
    let retried = setup.routed("retry_steps").await;
    assert_eq!(retried.len(), 1);
    assert_eq!((retried[0].1.origin_offset, retried[0].1.events), (0, 5));
    let total: i64 =
        serde_json::from_slice(&projection.store().get(&Key::int(1u64), "total").unwrap().unwrap()).unwrap();
    assert_eq!(total, 5);
    assert_accounted(projection.store(), 5, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_redriven_in_order_once_the_module_is_fixed() {
    use wakuwaku::operations::dead_letter::{self, DeadLetterError, Selection};
    let setup = Setup::new(2).await;
    let (one, two) = (0x1111_0000_0000_0000u64, 0xF000_0000_0000_0000u64);
    setup
        .publish(&[
            event(one, STEP, Relaxed, 1, &[]),
            event(one, OTHER, Relaxed, 2, &[]),
            event(two, STEP, Relaxed, 3, &[]),
            event(one, STEP, Acquire, 4, &[]),
        ])
        .await;
    // Before the fix, every call fails unrecoverably: all four are dead.
    setup.module.broken.store(true, std::sync::atomic::Ordering::SeqCst);
    let projection = setup.projection();
    // A bare consumer: it catches up three times while the test re-drives through its store.
    let consumer = setup.consumer(&projection, 100, eager(3));
    assert_eq!(consumer.catch_up().await.unwrap().dead_lettered, 4);
    let store = projection.store();
    let letters = dead_letter::list(&*setup.log, TOPIC, "flaky", store).await.unwrap();
    assert_eq!(letters.len(), 4);
    assert!(letters.iter().all(|l| !l.redriven && l.routed.failure.as_ref().unwrap().message.contains("not fixed")));

    // After the fix: re-drive key one's three, in dead-letter order.
    setup.module.broken.store(false, std::sync::atomic::Ordering::SeqCst);
    let key_one = Selection { key: Some(Key::int(one)), ..Selection::default() };
    let done = dead_letter::redrive(&*setup.log, TOPIC, "flaky", store, &key_one).await.unwrap();
    assert_eq!((done.records, done.events, done.already), (3, 3, 0));
    let again = dead_letter::redrive(&*setup.log, TOPIC, "flaky", store, &key_one).await.unwrap();
    assert_eq!((again.records, again.already), (0, 3), "a dead letter is re-driven once");
    let summary = consumer.catch_up().await.unwrap();
    assert_eq!((summary.consumed, summary.retry_out, summary.applied), (0, 3, 3));
    assert_eq!(Flaky::applied(store, &Key::int(one)), [1, 2, 4]);
    assert_eq!(Flaky::applied(store, &Key::int(two)), Vec::<u64>::new());
    let redriven: Vec<bool> =
        dead_letter::list(&*setup.log, TOPIC, "flaky", store).await.unwrap().iter().map(|l| l.redriven).collect();
    assert_eq!(redriven.iter().filter(|&&r| r).count(), 3);

    // The rest, by place; a place with no dead letter is refused by name.
    let place = letters.iter().find(|l| l.envelope.as_ref().is_ok_and(|e| e.key == Key::int(two))).unwrap();
    let missing = Selection { records: vec![(0, 999)], ..Selection::default() };
    let error = dead_letter::redrive(&*setup.log, TOPIC, "flaky", store, &missing).await.unwrap_err();
    assert!(matches!(error, DeadLetterError::NotFound { partition: 0, offset: 999, .. }), "{error}");
    let by_place = Selection { records: vec![(place.partition, place.offset)], ..Selection::default() };
    assert_eq!(dead_letter::redrive(&*setup.log, TOPIC, "flaky", store, &by_place).await.unwrap().records, 1);
    consumer.catch_up().await.unwrap();
    assert_eq!(Flaky::applied(store, &Key::int(two)), [3]);
    assert_accounted(store, 4, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_host_redrives_only_the_dead_letters_of_its_own_partitions() {
    use wakuwaku::operations::dead_letter::{self, DeadLetterError, Selection};
    let setup = Setup::new(2).await;
    // Two keys per partition, two events each; host A runs partition 0,
    // host B partition 1, each with its own state store, on one topic.
    let partition_of = |n: u64| partition_for(Key::int(n).key_hash(), 2);
    let first_two = |partition| -> Vec<u64> { (0..).filter(|&n| partition_of(n) == partition).take(2).collect() };
    let (zero, one) = (first_two(0), first_two(1));
    let keys = [zero[0], zero[1], one[0], one[1]];
    assert_eq!(keys.map(partition_of), [0, 0, 1, 1]);
    let events: Vec<Event> = (0..8)
        .map(|seq| event(keys[seq as usize % 4], if seq < 4 { STEP } else { OTHER }, Relaxed, seq, &[]))
        .collect();
    setup.publish(&events).await;
    // Bare consumers: each catches up twice while the test re-drives through its store.
    let host = |name: &str, partition: u32| {
        let store = StateStore::open(&setup.dir.path().join(format!("{name}.redb"))).unwrap();
        let projection =
            Arc::new(Projection::new("flaky", TOPIC, vec![Arc::new(setup.module.clone())], store).unwrap());
        let config = ConsumerConfig {
            batch_size: 100,
            workers: 2,
            partitions: Some(vec![partition]),
            retry: eager(3),
            ..ConsumerConfig::default()
        };
        (Consumer::new(setup.log.clone(), projection.clone(), config), projection)
    };
    let ((consumer_a, projection_a), (consumer_b, projection_b)) = (host("a", 0), host("b", 1));
    let (a, b) = (projection_a.store(), projection_b.store());
    setup.module.broken.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(consumer_a.catch_up().await.unwrap().dead_lettered, 4);
    assert_eq!(consumer_b.catch_up().await.unwrap().dead_lettered, 4);

    // Both hosts see all eight letters; each owns those of its partition.
    let letters = dead_letter::list(&*setup.log, TOPIC, "flaky", a).await.unwrap();
    assert_eq!(letters.len(), 8);
    assert!(letters.iter().all(|l| l.owned == (l.partition == 0)), "{letters:?}");
    let of_b = letters.iter().find(|l| l.partition == 1).unwrap();

    // Naming another host's partition or record is refused, and does nothing.
    for named in [
        Selection { partitions: vec![1], ..Selection::default() },
        Selection { records: vec![(1, of_b.offset)], ..Selection::default() },
        Selection { partitions: vec![0, 1], ..Selection::default() },
    ] {
        let error = dead_letter::redrive(&*setup.log, TOPIC, "flaky", a, &named).await.unwrap_err();
        assert!(matches!(error, DeadLetterError::NotOwned { partition: 1, .. }), "{error}");
    }
    // A store that owns nothing re-drives nothing.
    let stranger = StateStore::open(&setup.dir.path().join("stranger.redb")).unwrap();
    let all = Selection::default();
    let error = dead_letter::redrive(&*setup.log, TOPIC, "flaky", &stranger, &all).await.unwrap_err();
    assert!(matches!(error, DeadLetterError::NothingOwned { .. }), "{error}");
    assert_eq!(setup.log.end_offset("retry_steps", 0).await.unwrap(), 0);
    assert_eq!(setup.log.end_offset("retry_steps", 1).await.unwrap(), 0);

    // Everything, on each host, twice: each re-drives its own, once.
    setup.module.broken.store(false, std::sync::atomic::Ordering::SeqCst);
    let done = dead_letter::redrive(&*setup.log, TOPIC, "flaky", a, &all).await.unwrap();
    assert_eq!((done.partitions, done.records, done.already, done.others, done.left), (vec![0], 4, 0, vec![1], 4));
    let done = dead_letter::redrive(&*setup.log, TOPIC, "flaky", b, &all).await.unwrap();
    assert_eq!((done.partitions, done.records, done.already, done.others, done.left), (vec![1], 4, 0, vec![0], 4));
    for store in [a, b] {
        let again = dead_letter::redrive(&*setup.log, TOPIC, "flaky", store, &all).await.unwrap();
        assert_eq!((again.records, again.already, again.left), (0, 4, 4), "a dead letter is re-driven once");
    }
    assert_eq!(setup.log.end_offset("retry_steps", 0).await.unwrap(), 4);
    assert_eq!(setup.log.end_offset("retry_steps", 1).await.unwrap(), 4);

    // Each host applies its own letters, each once and in order.
    assert_eq!(consumer_a.catch_up().await.unwrap().applied, 4);
    assert_eq!(consumer_b.catch_up().await.unwrap().applied, 4);
    for (nth, &key) in keys.iter().enumerate() {
        let (mine, theirs) = if nth < 2 { (a, b) } else { (b, a) };
        assert_eq!(Flaky::applied(mine, &Key::int(key)), [nth as u64, nth as u64 + 4], "key {key}");
        assert_eq!(Flaky::applied(theirs, &Key::int(key)), Vec::<u64>::new(), "key {key} on the other host");
    }
    assert_accounted(a, 4, 0);
    assert_accounted(b, 4, 0);
}
