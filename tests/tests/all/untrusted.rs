//! Untrusted modules cannot stop, wedge or exhaust the host (issue 10),
//! checked through the real consumer and an embedded log with the hostile
//! module (`tests/guests/hostile`, written against the raw WIT, no SDK).
//!
//! One test per numbered case of the issue that a module can cause, then
//! one per rule of the contract's imports and exports. Each asserts what a
//! user relies on: the call is refused with a message naming the rule; the
//! events end applied (the module ignored the refusal) or dead-lettered
//! with that reason (it returned it); the batch commits and the partition
//! goes on; a second consumer over the same files (a restart) goes on;
//! the dead letters stay listable; and every event read is accounted for:
//! consumed = applied + skipped + dead-lettered + waiting in retry.
//!
//! 1. A bad emit (undeclared or missing topic, invalid name, empty or
//!    oversized body, non-canonical key) is refused at the call; nothing
//!    undeliverable reaches the outbox.
//! 2. Counters never wrap and never fail a commit, at `i64::MAX` and
//!    `i64::MIN`, also when two keys of one batch take a counter past the
//!    range together.
//! 3. Floods of emits, writes, deletes and counters stop at the per-call
//!    limits; a batch holds at most its budget, and the keys past it are
//!    tried again and applied.
//! 4. `dlq_*` and `retry_*` are never writable; dead letters stay listable.
//! 5. Keys cross the boundary as checked canonical bytes, both ways.
//!
//! Beyond the list: names out of bounds, calls outside `handle`,
//! `combine` answers out of bounds, huge log lines and error messages,
//! strings that are not UTF-8, spinning on refusals, names crafted to
//! collide in the host's hash tables, and a flood beside the bank module in
//! one projection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku::authoring::publish::{self, Outgoing};
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig, Summary};
use wakuwaku::engine::projection::{Projection, load_module_file};
use wakuwaku::engine::routing::{FailureClass, RetryPolicy, Routed, dlq_topic, retry_topic};
use wakuwaku::event::{EventHeaders, EventTypeTag};
use wakuwaku::key::Key;
use wakuwaku::operations::dead_letter;
use wakuwaku::sandbox::handler::{CallError, HandlerModule, PayloadLimits};
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, Record, StoredRecord};
use wakuwaku::storage::state::StateStore;
use wakuwaku_tests::hostile::{
    Accounts, OUT, Report, attack, attack_body, attack_name, counter, hostile_module, report, rule, tag,
};
use wakuwaku_tests::{bank_wasm, publish_bank};

/// The topic the hostile projection consumes.
const TOPIC: &str = "hostile";
/// Its projection.
const PROJECTION: &str = "untrusted";

/// A log with the projection's topic and [`OUT`], and the hostile module
/// (plus any others) in one projection over a fresh state file.
struct Bed {
    dir: tempfile::TempDir,
    log: Arc<EmbeddedLog>,
    projection: Arc<Projection>,
    config: ConsumerConfig,
}

impl Bed {
    async fn new(payload: PayloadLimits) -> Self {
        Self::with(payload, SandboxLimits::default(), |_| Vec::new()).await
    }

    /// `others` adds modules beside the hostile one.
    async fn with(
        payload: PayloadLimits,
        limits: SandboxLimits,
        others: impl FnOnce(&Sandbox) -> Vec<Arc<dyn HandlerModule>>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
        log.create_topic(TOPIC, 1).await.unwrap();
        log.create_topic(OUT, 1).await.unwrap();
        let sandbox = Sandbox::new(limits).unwrap().with_payload_limits(payload);
        let mut modules = vec![hostile_module(&sandbox)];
        modules.extend(others(&sandbox));
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        let projection = Arc::new(Projection::new(PROJECTION, TOPIC, modules, store).unwrap());
        let config = ConsumerConfig {
            workers: 2,
            payload,
            retry: RetryPolicy { delays: vec![Duration::ZERO], max_attempts: 3, ..RetryPolicy::default() },
            ..ConsumerConfig::default()
        };
        Self { dir, log, projection, config }
    }

    fn store(&self) -> &StateStore {
        self.projection.store()
    }

    async fn append(&self, records: Vec<Record>) {
        self.log.append(TOPIC, vec![(0, records)]).await.unwrap();
    }

    /// Consumes what the topic holds now, as `waku run --until-caught-up`
    /// does, and checks the counts add up.
    async fn run(&self) -> Summary {
        // A bare consumer: the bed holds one projection across runs, whose store a host would open again.
        let summary = Consumer::new(self.log.clone(), self.projection.clone(), self.config.clone())
            .catch_up()
            .await
            .expect("the consumer never stops because of a module");
        self.accounts().check().unwrap();
        assert!(self.store().outbox().unwrap().is_empty(), "the outbox was published");
        summary
    }

    /// The same files opened afresh, as after a restart.
    fn reopened(self) -> Self {
        let Self { dir, log, projection, config } = self;
        let modules = projection.modules();
        drop(projection);
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        let projection = Arc::new(Projection::new(PROJECTION, TOPIC, modules, store).unwrap());
        Self { dir, log, projection, config }
    }

    fn accounts(&self) -> Accounts {
        Accounts::of(self.store(), TOPIC, 1)
    }

    fn report(&self, key: u64) -> Report {
        report(self.store(), key).unwrap_or_else(|| panic!("key {key} left no report"))
    }

    async fn records(&self, topic: &str) -> Vec<StoredRecord> {
        let end = self.log.end_offset(topic, 0).await.unwrap();
        self.log.read(topic, 0, 0, end as usize).await.unwrap()
    }

    /// The projection's dead letters, as `waku dlq list` reads them.
    async fn dead_letters(&self) -> Vec<dead_letter::DeadLetter> {
        dead_letter::list(&*self.log, TOPIC, PROJECTION, self.store()).await.expect("dead letters stay listable")
    }

    /// The failure message of the dead letter of integer key `key`.
    async fn dead_letter_reason(&self, key: u64) -> (FailureClass, String) {
        let letters = self.dead_letters().await;
        let letter = letters
            .iter()
            .find(|l| l.envelope.as_ref().is_ok_and(|h| h.key == Key::int(key)))
            .unwrap_or_else(|| panic!("key {key} is not dead-lettered"));
        let failure = letter.routed.failure.clone().expect("a dead letter says why");
        (failure.class, failure.message)
    }
}

/// The rule of a refusal a module returned as its error: the failure
/// reads `<class> handler error: <rule>: …`.
fn returned_rule(failure: &str) -> &str {
    failure.split_once("handler error: ").map_or("", |(_, refusal)| rule(refusal))
}

/// `n` copies of `rule`.
fn times(rule: &str, n: usize) -> Vec<String> {
    vec![rule.to_owned(); n]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_1_emits_that_could_never_be_delivered_are_refused_at_the_call_and_the_partition_goes_on() {
    let payload = PayloadLimits::default();
    let bed = Bed::new(payload).await;
    bed.log.create_topic("accounts", 1).await.unwrap();
    bed.append(vec![
        attack(tag::EMIT_UNDECLARED, 1, json!({ "topic": "nowhere" })),
        attack(tag::EMIT_UNDECLARED, 2, json!({ "topic": "accounts" })),
        attack(tag::EMIT_BAD_TOPIC, 3, json!({})),
        attack(tag::EMIT_BAD_BODY, 4, json!({ "size": payload.max_emit_body + 1 })),
        attack(tag::EMIT_BAD_KEY, 5, json!({})),
        attack(tag::BEHAVE, 6, json!({ "mode": "emit" })),
        attack(tag::EMIT_UNDECLARED, 7, json!({ "then": "return" })),
    ])
    .await;
    let summary = bed.run().await;
    assert_eq!((summary.applied, summary.dead_lettered), (6, 1), "{summary:?}");

    // Each refusal names its rule, and the topic and what was declared.
    let missing = bed.report(1);
    assert_eq!(missing.outcomes, ["emit-topic"]);
    let message = &missing.first["emit-topic"];
    assert!(message.contains("`nowhere`") && message.contains(OUT), "{message}");
    assert_eq!(bed.report(2).outcomes, ["emit-topic"], "an existing topic the module did not declare");
    assert_eq!(bed.report(3).outcomes, times("emit-topic", 9), "invalid names are never declared ones");
    assert!(bed.report(3).first["emit-topic"].len() < 512, "a 1 MiB topic name is not echoed back whole");
    assert_eq!(bed.report(4).outcomes, times("emit-body-size", 2));
    let bad_keys = bed.report(5);
    assert_eq!(bad_keys.outcomes, [times("emit-key", 10), vec!["ok".to_owned()]].concat(), "{:?}", bad_keys.first);
    let (class, reason) = bed.dead_letter_reason(7).await;
    assert_eq!((class, returned_rule(&reason)), (FailureClass::Unrecoverable, "emit-topic"), "{reason}");

    // Nothing undeliverable was queued: no topic was created for it, and
    // only the two accepted messages reached the declared topic.
    assert!(bed.log.partitions("nowhere").await.is_err(), "`nowhere` was created");
    assert_eq!(bed.log.end_offset("accounts", 0).await.unwrap(), 0);
    let out: Vec<Key> = bed
        .records(OUT)
        .await
        .iter()
        .map(|r| EventHeaders::parse_stored(&r.record.headers).expect("emitted headers parse").key)
        .collect();
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(out[0].as_bytes().len(), 1024, "the key of exactly the limit is accepted");
    assert_eq!(out[1], Key::int(6u64));

    // A restart goes on with the next events.
    let bed = bed.reopened();
    bed.append(vec![attack(tag::EMIT_UNDECLARED, 8, json!({})), attack(tag::BEHAVE, 9, json!({}))]).await;
    let summary = bed.run().await;
    assert_eq!(summary.applied, 2, "{summary:?}");
    assert_eq!(bed.store().position(TOPIC, 0).unwrap(), Some(9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_2_counters_never_wrap_and_never_fail_a_commit() {
    let max = i64::MAX.to_string();
    let bed = Bed::new(PayloadLimits::default()).await;
    bed.append(vec![
        attack(tag::COUNTER_OVERFLOW, 1, json!({ "name": "overflow" })),
        attack(tag::COUNTER_OVERFLOW, 2, json!({ "name": "underflow", "mode": "min" })),
        // Two keys of one batch each see 0 and add i64::MAX: both are
        // within the range as each key sees it; the commit sums them.
        attack(tag::SHARED_COUNTER, 3, json!({ "delta": i64::MAX })),
        attack(tag::SHARED_COUNTER, 4, json!({ "delta": i64::MAX })),
        attack(tag::COUNTER_OVERFLOW, 5, json!({ "name": "returned", "then": "return" })),
    ])
    .await;
    let summary = bed.run().await;
    assert_eq!((summary.applied, summary.dead_lettered), (4, 1), "{summary:?}");
    assert_eq!(bed.report(1).outcomes, ["ok", "counter-range", "counter-range", &format!("= {max}")]);
    assert!(bed.report(1).first["counter-range"].contains("`overflow`"), "{:?}", bed.report(1).first);
    assert_eq!(bed.report(2).outcomes, ["ok", "counter-range", "ok", "counter-range", "ok", "= 0"]);
    for key in [3, 4] {
        assert_eq!(bed.report(key).outcomes, ["ok", format!("= {max}").as_str()]);
    }
    let (class, reason) = bed.dead_letter_reason(5).await;
    assert_eq!((class, returned_rule(&reason)), (FailureClass::Unrecoverable, "counter-range"), "{reason}");
    let i64_max = i128::from(i64::MAX);
    assert_eq!(counter(bed.store(), "overflow"), i64_max);
    assert_eq!(counter(bed.store(), "underflow"), 0);
    assert_eq!(counter(bed.store(), "shared"), 2 * i64_max, "summed in i128, not wrapped");
    assert_eq!(counter(bed.store(), "returned"), 0, "a failed call adds nothing");

    // After a restart: reading the counter past the range is refused, so
    // is a step further out; a step back in is taken.
    let bed = bed.reopened();
    bed.append(vec![
        attack(tag::SHARED_COUNTER, 6, json!({ "delta": 1 })),
        attack(tag::SHARED_COUNTER, 7, json!({ "delta": i64::MIN })),
    ])
    .await;
    let summary = bed.run().await;
    assert_eq!(summary.applied, 2, "{summary:?}");
    assert_eq!(bed.report(6).outcomes, ["counter-range", "counter-range"]);
    assert_eq!(bed.report(7).outcomes, ["ok", format!("= {}", i64::MAX - 1).as_str()]);
    assert_eq!(counter(bed.store(), "shared"), i64_max - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_3_floods_within_the_cpu_budget_stop_at_the_per_call_limits() {
    let payload = PayloadLimits::default();
    let bed = Bed::new(payload).await;
    bed.append(vec![
        attack(tag::EMIT_FLOOD, 1, json!({})),
        attack(tag::EMIT_FLOOD, 2, json!({ "size": 65_536 })),
        attack(tag::SET_FLOOD, 3, json!({})),
        attack(tag::BIG_VALUES, 4, json!({})),
        attack(tag::DELETE_FLOOD, 5, json!({})),
        attack(tag::COUNTER_NAMES, 6, json!({})),
    ])
    .await;
    let started = Instant::now();
    let summary = bed.run().await;
    assert_eq!(summary.applied, 6, "{summary:?}");
    let store = bed.store();
    let accepted = |attack: EventTypeTag| counter(store, &format!("{}.accepted", attack_name(attack)));
    let refused = |attack: EventTypeTag, rule: &str| counter(store, &format!("{}.refused.{rule}", attack_name(attack)));

    // Emits: 1 000 one-byte bodies; of 64 KiB bodies as many as fit 4 MiB
    // (topic, key and body counted).
    assert_eq!(accepted(tag::EMIT_FLOOD), 1_000 + 63);
    assert_eq!(refused(tag::EMIT_FLOOD, "emits-per-call"), 1);
    assert_eq!(refused(tag::EMIT_FLOOD, "emit-bytes-per-call"), 1);
    assert_eq!(bed.log.end_offset(OUT, 0).await.unwrap(), 1_063, "exactly the accepted emits were sent");
    // Writes: 1 000 entries, and no room left for the report.
    assert_eq!(accepted(tag::SET_FLOOD), 1_000);
    assert_eq!(refused(tag::SET_FLOOD, "state-writes-per-call"), 1);
    assert_eq!(report(store, 3), None, "the report write was refused too");
    assert_eq!(store.entries(&Key::int(3u64)).unwrap().len(), 1_000);
    // 1 MiB values: three fit the 4 MiB of one call.
    assert_eq!(bed.report(4).accepted, 3);
    assert_eq!(bed.report(4).refused["state-bytes-per-call"], 1);
    assert_eq!(accepted(tag::DELETE_FLOOD), 1_000);
    assert_eq!(refused(tag::DELETE_FLOOD, "state-writes-per-call"), 1);
    // Counters: 1 000 changes, then the report's own counters are refused.
    let counters = bed.report(6);
    assert_eq!((counters.accepted, counters.refused["counter-changes-per-call"]), (1_000, 1));
    assert_eq!(store.counters().unwrap().iter().filter(|(name, _)| name.starts_with("many.")).count(), 1_000);
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_3_a_batch_holds_at_most_its_budget_and_the_keys_past_it_are_tried_again() {
    // The smallest budget the limits allow: one call's worth (about
    // 9 MiB), so each batch takes two or three calls of 3 MiB values.
    let defaults = PayloadLimits::default();
    let payload = PayloadLimits { max_batch_held: defaults.most_held_by_one_call(), ..defaults };
    let mut bed = Bed::new(payload).await;
    bed.config.retry.max_attempts = 10;
    let keys = 1..=8u64;
    bed.append(keys.clone().map(|key| attack(tag::BIG_VALUES, key, json!({ "n": 3 }))).collect()).await;
    let summary = bed.run().await;
    assert_eq!((summary.applied, summary.dead_lettered), (8, 0), "{summary:?}");
    assert!(summary.retry_in >= 5, "the budget sent keys to retry: {summary:?}");
    for key in keys {
        assert_eq!(bed.report(key).accepted, 3, "key {key}");
    }
    // The retry records say why, naming the rule.
    let retried = bed.records(&retry_topic(TOPIC)).await;
    assert!(!retried.is_empty());
    for record in retried {
        let failure = Routed::parse(&record.record.headers).unwrap().failure.expect("a failed call");
        assert_eq!(rule(&failure.message), "batch-budget", "{}", failure.message);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_4_host_topics_are_never_writable_and_dead_letters_stay_listable() {
    let bed = Bed::new(PayloadLimits::default()).await;
    bed.append(vec![
        attack(tag::EMIT_HOST_TOPIC, 1, json!({ "topic": TOPIC })),
        attack(tag::EMIT_HOST_TOPIC, 2, json!({ "topic": TOPIC, "then": "return" })),
        // As large as the hostcall bound lets through (larger traps:
        // sandbox::an_import_argument_past_the_hostcall_bound_traps_before_it_is_copied).
        attack(tag::HUGE_ERROR, 3, json!({ "size": 1 << 20 })),
        attack(tag::HUGE_ERROR, 4, json!({ "size": 1 << 20, "class": "retryable" })),
    ])
    .await;
    let summary = bed.run().await;
    assert_eq!((summary.applied, summary.dead_lettered), (1, 3), "{summary:?}");
    assert_eq!(bed.report(1).outcomes, times("emit-topic", 4));
    assert!(bed.report(1).first["emit-topic"].contains(&format!("`dlq_{OUT}`")), "{:?}", bed.report(1).first);
    // The host's topics hold the host's records only: every one has the
    // routing headers, so the dead letters list.
    for topic in [dlq_topic(TOPIC), retry_topic(TOPIC)] {
        for record in bed.records(&topic).await {
            let routed = Routed::parse(&record.record.headers).unwrap_or_else(|e| panic!("{topic}: {e}"));
            assert_eq!(routed.projection, PROJECTION);
        }
    }
    for topic in [dlq_topic(OUT), retry_topic(OUT)] {
        assert!(bed.log.partitions(&topic).await.is_err(), "`{topic}` was created");
    }
    let letters = bed.dead_letters().await;
    assert_eq!(letters.len(), 3);
    let (_, reason) = bed.dead_letter_reason(2).await;
    assert_eq!(returned_rule(&reason), "emit-topic", "{reason}");
    // Megabyte messages are cut to 4 KiB in the letters.
    for key in [3, 4] {
        let (_, reason) = bed.dead_letter_reason(key).await;
        assert!(reason.len() <= (4 << 10) + 64 && reason.ends_with("[…cut]"), "key {key}: {} bytes", reason.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_5_keys_cross_the_boundary_as_checked_canonical_bytes_both_ways() {
    let bed = Bed::new(PayloadLimits::default()).await;
    let module = bed.projection.modules()[0].clone();
    let mut instance = module.instantiate().unwrap();
    let body = |mode: &str| serde_json::to_vec(&attack_body(1, json!({ "mode": mode }))).unwrap();

    // Out: what `key` returns is checked.
    for mode in ["non-canonical", "long", "empty", "trailing"] {
        match instance.key(tag::BAD_KEY_EXPORT, &body(mode)) {
            Err(CallError::Contract(error)) => assert_eq!(rule(&error.to_string()), "key-canonical", "{mode}"),
            other => panic!("{mode}: expected a broken contract, got {other:?}"),
        }
    }
    let max = instance.key(tag::BAD_KEY_EXPORT, &body("max")).expect("a key of exactly 1024 bytes");
    assert_eq!(max.as_bytes().len(), 1024);
    // A publisher refuses the whole call, naming the line and the rule.
    let events =
        vec![Outgoing { tag: tag::BEHAVE, body: body("") }, Outgoing { tag: tag::BAD_KEY_EXPORT, body: body("long") }];
    let error = publish::publish(&*bed.log, TOPIC, module.clone(), events, None, 1).await.unwrap_err();
    let message = error.to_string();
    assert!(message.contains("line 2") && message.contains("key-canonical"), "{message}");
    assert_eq!(bed.log.end_offset(TOPIC, 0).await.unwrap(), 0, "nothing was published");

    // In: the key `handle` receives is the one the body names (the module
    // fails the call otherwise), and each key's state is its own.
    let events = (1..=5u64)
        .flat_map(|key| (0..3).map(move |seq| (key, seq)))
        .map(|(key, seq)| attack(tag::BEHAVE, key, json!({ "seq": seq })))
        .collect();
    bed.append(events).await;
    let summary = bed.run().await;
    assert_eq!((summary.applied, summary.dead_lettered), (15, 0), "{summary:?}");
    for key in 1..=5u64 {
        let seen = bed.store().get(&Key::int(key), "seen").unwrap();
        assert_eq!(seen.as_deref(), Some(Key::int(key).as_bytes()), "key {key}");
    }
    assert_eq!(counter(bed.store(), "behaved"), 15);
    // Emitted keys were checked the same way (case 1 lists the rejects).
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_out_of_bounds_are_refused_on_every_state_import() {
    let bed = Bed::new(PayloadLimits::default()).await;
    // 1 MiB: the largest name a call can hand the host (past the hostcall
    // bound the call fails before the name is copied: `import-size`).
    bed.append(vec![attack(tag::BAD_NAMES, 1, json!({ "size": 1 << 20 }))]).await;
    bed.run().await;
    let report = bed.report(1);
    // Empty, 257 bytes and 1 MiB, on get, set, delete, counter-add and
    // counter-get; then the limit itself, 256 bytes, is a name.
    assert_eq!(report.outcomes, [times("name-length", 15), vec!["ok".to_owned()]].concat());
    assert!(report.first["name-length"].len() < 256, "{}", report.first["name-length"]);
    let names: Vec<String> = bed.store().entries(&Key::int(1u64)).unwrap().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["n".repeat(256), "report".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_and_emit_are_refused_outside_handle() {
    // The module tries every state and emit import in `describe`, `key`,
    // `ordering` and `combine`, and traps if one is accepted: so it loads,
    // publishes and folds only if all of them were refused.
    let bed = Bed::new(PayloadLimits::default()).await;
    let module = bed.projection.modules()[0].clone();
    let events = tag::ALL
        .iter()
        .filter(|(t, _)| *t != tag::BAD_KEY_EXPORT)
        .map(|&(tag, _)| Outgoing { tag, body: serde_json::to_vec(&attack_body(1, json!({}))).unwrap() })
        .collect();
    let published = publish::publish(&*bed.log, TOPIC, module.clone(), events, None, 2).await.unwrap();
    assert_eq!(published, tag::ALL.len() - 1);
    let mut instance = module.instantiate().unwrap();
    match instance.combine(tag::HUGE_COMBINE, &[b"{}".to_vec(), b"{}".to_vec()]) {
        // Its 2 MiB answer is past the hostcall bound: refused before it is copied.
        Err(CallError::Contract(error)) => assert_eq!(rule(&error.to_string()), "import-size", "{error}"),
        other => panic!("expected a broken contract, got {:?}", other.map(|body| body.len())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_combine_answer_out_of_bounds_fails_its_run_and_nothing_else() {
    let bed = Bed::new(PayloadLimits::default()).await;
    let run = |key: u64, params: serde_json::Value| (0..3).map(move |_| attack(tag::HUGE_COMBINE, key, params.clone()));
    bed.append(
        run(1, json!({}))
            .chain(run(2, json!({ "mode": "empty" })))
            .chain(run(3, json!({ "size": 10 })))
            .chain([attack(tag::BEHAVE, 4, json!({}))])
            .collect(),
    )
    .await;
    let summary = bed.run().await;
    assert_eq!((summary.applied, summary.dead_lettered), (4, 6), "{summary:?}");
    // A 2 MiB answer is past the hostcall bound (`import-size`), an empty
    // one breaks `combine-body-size`: both retryable, as the WIT says of a
    // broken `combine` answer, not traps.
    for (key, rule) in [(1, "import-size"), (2, "combine-body-size")] {
        let (class, reason) = bed.dead_letter_reason(key).await;
        assert_eq!(class, FailureClass::Retryable, "{reason}");
        assert!(reason.contains(rule), "key {key}: {reason}");
    }
    assert_eq!(bed.report(3).outcomes, ["1 bodies, the first of 10 bytes"]);
}

/// A module that fails every call with a long message: each dead letter
/// used to carry the whole message (4 KiB), 100 000 tiny events made 941 MB
/// of letters and held a batch's worth in memory. A worker's batch writes
/// at most 1 MiB of whole messages; every other letter carries a brief one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_messages_are_written_whole_only_up_to_a_bound_per_batch() {
    const EVENTS: u64 = 700;
    let mut bed = Bed::new(PayloadLimits::default()).await;
    bed.config.retry.max_attempts = 1;
    bed.append((0..EVENTS).map(|key| attack(tag::HUGE_ERROR, key, json!({ "size": 4000 }))).collect()).await;
    let summary = bed.run().await;
    assert_eq!(summary.dead_lettered, EVENTS, "{summary:?}");
    let messages: Vec<String> =
        bed.dead_letters().await.into_iter().map(|letter| letter.routed.failure.unwrap().message).collect();
    let (whole, brief): (Vec<&String>, Vec<&String>) = messages.iter().partition(|message| message.len() > 4000);
    // Each of the (at most two) workers writes whole messages until 1 MiB.
    let most_whole = 2 * ((1 << 20) / 4000 + 1);
    assert!(whole.len() <= most_whole, "{} whole messages", whole.len());
    assert!(!whole.is_empty(), "no message was kept whole");
    assert_eq!(whole.len() + brief.len(), EVENTS as usize);
    for message in brief {
        assert!(message.len() < 300 && message.ends_with("[…cut]"), "{message}");
    }
}

/// A `combine` that makes a run of small events into one large body,
/// which `handle` then fails: the run goes to the dead-letter topic as
/// its events came, not as the fold (2 000 keys of two tiny events made
/// 4 GB of dead letters, and held them all in the batch, when the fold was
/// routed); a fold that makes the run smaller still goes as one record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fold_larger_than_its_events_is_routed_as_its_events() {
    let mut bed = Bed::new(PayloadLimits::default()).await;
    bed.config.retry.max_attempts = 1;
    let run = |key: u64, size: u64| {
        (0..2).map(move |seq| attack(tag::HUGE_COMBINE, key, json!({ "mode": "fail", "size": size, "seq": seq })))
    };
    bed.append((0..20).flat_map(|key| run(key, 1 << 19)).chain(run(20, 1)).collect()).await;
    let summary = bed.run().await;
    assert_eq!(summary.dead_lettered, 42, "{summary:?}");
    let letters = bed.records(&dlq_topic(TOPIC)).await;
    let largest = letters.iter().map(|stored| stored.record.body.len()).max().unwrap();
    assert!(largest < 1000, "a dead letter of {largest} bytes: the fold was routed");
    // 20 inflated runs as their 40 events; the run folded into 1 byte as one.
    assert_eq!(letters.len(), 41);
    let folded: Vec<&StoredRecord> = letters.iter().filter(|stored| stored.record.body == b"!").collect();
    assert_eq!(folded.len(), 1, "the shrinking fold went as one record");
    let routed = Routed::parse(&folded[0].record.headers).unwrap();
    assert_eq!(routed.events, 2, "it stands for both events");
}

/// Many large events of one key and an associative type (a hot key, or a
/// flood aimed at one): folded in one `combine` call, the run would not
/// fit the module's memory and every event of it would fail. The host
/// folds a long run in parts, so a module that folds correctly gets all
/// of them applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_larger_than_the_modules_memory_is_folded_in_parts() {
    let limits = SandboxLimits { memory_bytes: 16 << 20, ..SandboxLimits::default() };
    let mut bed = Bed::with(PayloadLimits::default(), limits, |_| Vec::new()).await;
    bed.config.retry.max_attempts = 1;
    let pad = "p".repeat(1 << 20);
    let mut events: Vec<Record> =
        (0..24).map(|seq| attack(tag::HUGE_COMBINE, 1, json!({ "size": 10, "seq": seq, "pad": pad }))).collect();
    events.push(attack(tag::BEHAVE, 2, json!({})));
    bed.append(events).await;
    let summary = bed.run().await;
    if summary.dead_lettered > 0 {
        panic!("the run was dead-lettered: {:?}", bed.dead_letter_reason(1).await);
    }
    assert_eq!(summary.applied, 25, "{summary:?}");
    assert_eq!(bed.report(1).outcomes, ["1 bodies, the first of 10 bytes"]);
}

/// A `combine` that panics, spins or exits the process, and a `handle`
/// that exits halfway through a write: each fails its own call as a trap
/// (the run or chunk is dead-lettered with the reason), nothing it wrote
/// is kept, and the host and the other keys go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_combine_or_handle_that_panics_spins_or_exits_fails_its_call_and_nothing_else() {
    let limits = SandboxLimits { call_budget: Duration::from_millis(300), ..SandboxLimits::default() };
    let mut bed = Bed::with(PayloadLimits::default(), limits, |_| Vec::new()).await;
    bed.config.retry.max_attempts = 1;
    let run = |key: u64, mode: &str| {
        let params = json!({ "mode": mode });
        (0..3).map(move |_| attack(tag::HUGE_COMBINE, key, params.clone()))
    };
    bed.append(
        run(1, "panic")
            .chain(run(2, "loop"))
            .chain(run(3, "exit"))
            .chain([attack(tag::EXIT, 4, json!({ "n": 0 })), attack(tag::BEHAVE, 5, json!({}))])
            .collect(),
    )
    .await;
    let summary = bed.run().await;
    assert_eq!((summary.applied, summary.dead_lettered), (1, 10), "{summary:?}");
    for (key, expected) in [(1, "hostile combine panics"), (2, "cpu budget"), (3, "exit"), (4, "exit")] {
        let (class, reason) = bed.dead_letter_reason(key).await;
        assert_eq!(class, FailureClass::Trap, "key {key}: {reason}");
        assert!(reason.to_lowercase().contains(expected), "key {key}: {reason}");
    }
    assert_eq!(bed.store().get(&Key::int(4), "before-exit").unwrap(), None, "an exit keeps no write");
    assert_eq!(bed.report(5).outcomes, ["ok", "ok"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_floods_of_huge_lines_never_fail_a_call_or_hold_up_the_batch() {
    let bed = Bed::new(PayloadLimits::default()).await;
    bed.append(vec![
        attack(tag::LOG_FLOOD, 1, json!({ "n": 1_000, "size": 1 << 20 })),
        attack(tag::BEHAVE, 2, json!({})),
    ])
    .await;
    let started = Instant::now();
    let summary = bed.run().await;
    assert_eq!(summary.applied, 2, "{summary:?}");
    assert_eq!(bed.report(1).accepted, 1_000);
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_that_is_not_utf8_traps_the_call_and_the_next_call_runs() {
    let mut bed = Bed::new(PayloadLimits::default()).await;
    bed.config.retry.max_attempts = 1;
    bed.append(vec![
        attack(tag::NOT_UTF8, 1, json!({})),
        attack(tag::NOT_UTF8, 2, json!({ "mode": "topic" })),
        attack(tag::NOT_UTF8, 3, json!({ "mode": "log" })),
        attack(tag::BEHAVE, 4, json!({})),
    ])
    .await;
    let summary = bed.run().await;
    assert_eq!((summary.applied, summary.dead_lettered), (1, 3), "{summary:?}");
    for key in 1..=3 {
        let (class, reason) = bed.dead_letter_reason(key).await;
        assert_eq!(class, FailureClass::Trap, "key {key}: {reason}");
        assert!(reason.to_lowercase().contains("utf-8"), "key {key}: {reason}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_cheap_and_spinning_on_them_ends_at_the_cpu_budget() {
    let limits = SandboxLimits { call_budget: Duration::from_millis(300), ..SandboxLimits::default() };
    let mut bed = Bed::with(PayloadLimits::default(), limits, |_| Vec::new()).await;
    bed.config.retry.max_attempts = 1;
    bed.append(vec![
        attack(tag::REFUSAL_SPIN, 1, json!({ "n": 2_000 })),
        attack(tag::REFUSAL_SPIN, 2, json!({ "n": 0 })),
        attack(tag::BEHAVE, 3, json!({})),
    ])
    .await;
    let summary = bed.run().await;
    assert_eq!((summary.applied, summary.dead_lettered), (2, 1), "{summary:?}");
    assert_eq!(bed.report(1).accepted, 2_000, "4 000 refused calls fit one call's budget");
    let (class, reason) = bed.dead_letter_reason(2).await;
    assert_eq!(class, FailureClass::Trap);
    assert!(reason.contains("CPU budget"), "{reason}");
}

/// A sleep waits on WASI's clock inside the host, where the CPU budget
/// (which interrupts running wasm code) cannot reach it: an hour's sleep,
/// or one of `u64::MAX` nanoseconds, would hold its worker and the
/// batch that long. The clock is frozen, so no time passes for a module:
/// every sleep ends at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_ends_at_once_and_never_holds_up_the_batch() {
    let bed = Bed::new(PayloadLimits::default()).await;
    bed.append(vec![
        attack(tag::SLEEP, 1, json!({ "n": 3_600 })),
        attack(tag::SLEEP, 2, json!({ "mode": "forever" })),
        attack(tag::BEHAVE, 3, json!({})),
    ])
    .await;
    let summary =
        tokio::time::timeout(Duration::from_secs(60), bed.run()).await.expect("a sleeping module holds up the batch");
    assert_eq!((summary.applied, summary.dead_lettered), (3, 0), "{summary:?}");
    for key in [1, 2] {
        assert_eq!(bed.report(key).outcomes, ["woke"], "key {key}");
    }
}

/// Runs `events` calls of `attack`, 1 000 names each, colliding in the
/// host's FxHash or not (`mode`), and returns how long the batch took.
/// Entries are per key, so their calls are all for key 1; counters are
/// shared, so theirs are spread over keys. The state quotas are raised
/// past what the flood makes: the names' cost is under test here, not the
/// quotas (`quotas.rs`).
async fn name_flood(attack_tag: EventTypeTag, mode: &str, events: u64) -> (Duration, Bed) {
    let room = (events as usize + 1) * 1_000;
    let payload = PayloadLimits { max_entries_per_key: room, max_counters: room, ..PayloadLimits::default() };
    let bed = Bed::new(payload).await;
    let key = |seq: u64| if attack_tag == tag::COLLIDING_NAMES { 1 } else { seq };
    let records = (0..events).map(|seq| attack(attack_tag, key(seq), json!({ "n": 1_000, "seq": seq, "mode": mode })));
    bed.append(records.collect()).await;
    let started = Instant::now();
    let summary = bed.run().await;
    assert_eq!(summary.applied, events, "{summary:?}");
    (started.elapsed(), bed)
}

/// A module chooses its entry and counter names, and the host keeps the
/// names of a batch in FxHash tables, whose hash of a long string an
/// attacker can make collide at will (`colliding_name` in the module). A
/// batch of colliding names must cost about what plain names of the same
/// length cost, not the square of their number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_crafted_to_collide_in_the_hosts_hash_cost_what_plain_names_cost() {
    let events = 10;
    for attack_tag in [tag::COLLIDING_NAMES, tag::COLLIDING_COUNTERS] {
        let (plain, _) = name_flood(attack_tag, "plain", events).await;
        let (colliding, bed) = name_flood(attack_tag, "collide", events).await;
        // The names the module wrote do collide in the host's hasher.
        if attack_tag == tag::COLLIDING_NAMES {
            let names: Vec<(String, Vec<u8>)> = bed.store().entries(&Key::int(1u64)).unwrap();
            let colliding_names: Vec<&str> =
                names.iter().map(|(name, _)| name.as_str()).filter(|name| *name != "report").collect();
            assert_eq!(colliding_names.len() as u64, events * 1_000);
            let hashes: std::collections::HashSet<u64> = colliding_names
                .iter()
                .map(|name| std::hash::BuildHasher::hash_one(&rustc_hash::FxBuildHasher, *name))
                .collect();
            assert_eq!(hashes.len(), 1, "the names collide");
        }
        assert!(
            colliding < plain * 4 + Duration::from_secs(2),
            "{}: {events} calls of 1 000 colliding names took {colliding:?}, plain names {plain:?}",
            attack_name(attack_tag)
        );
    }
}

/// The hostile module floods beside the bank in one projection: they share
/// the batches, the batch budget, the workers, the outbox. The bank's
/// events must never fail for good because of it: its read model equals
/// the oracle and none of its events is dead-lettered, while the flood
/// fills every batch's budget (small limits keep the test quick: one
/// batch holds about three flooding calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_beside_the_bank_never_fails_the_banks_events() {
    let small = PayloadLimits {
        max_state_value: 64 << 10,
        max_state_writes_per_call: 100,
        max_state_bytes_per_call: 256 << 10,
        max_counter_changes_per_call: 100,
        max_emit_body: 64 << 10,
        max_emits_per_call: 100,
        max_emit_bytes_per_call: 256 << 10,
        ..PayloadLimits::default()
    };
    let payload = PayloadLimits { max_batch_held: small.most_held_by_one_call(), ..small };
    let mut bed = Bed::with(payload, SandboxLimits::default(), |sandbox| {
        vec![load_module_file(sandbox, &bank_wasm()).expect("the bank module loads")]
    })
    .await;
    bed.config.batch_size = 512;
    bed.config.retry.max_attempts = 1;
    let bank = bed.projection.modules()[1].clone();
    // The bank's workload, moved to the projection's topic with a flood
    // event after every 10 bank events.
    let spec = WorkloadSpec { events: 2_000, accounts: 50, seed: 11 };
    let staging = EmbeddedLog::open(bed.dir.path().join("staging.redb")).unwrap();
    let oracle = publish_bank(&staging, bank.clone(), spec, 1).await;
    let bank_records = staging.read("accounts", 0, 0, spec.events).await.unwrap();
    let mut records = Vec::new();
    for (index, stored) in bank_records.into_iter().enumerate() {
        records.push(stored.record);
        if index % 10 == 0 {
            records.push(attack(tag::BIG_VALUES, 1_000_000 + index as u64, json!({ "n": 3, "size": 64 << 10 })));
        }
    }
    bed.append(records).await;
    bed.run().await;

    let is_bank = |headers: &Result<EventHeaders, _>| headers.as_ref().is_ok_and(|h: &EventHeaders| h.tag.get() < 200);
    let bank_letters: Vec<String> = bed
        .dead_letters()
        .await
        .into_iter()
        .filter(|letter| is_bank(&letter.envelope))
        .map(|letter| letter.routed.failure.map(|f| f.message).unwrap_or_default())
        .collect();
    assert!(bank_letters.is_empty(), "{} bank events dead-lettered, the first: {:?}", bank_letters.len(), bank_letters);
    let check = demo::check_projection(&oracle, &*bank, bed.store()).unwrap();
    assert!(check.matches(), "{}", check.report(5));
    // The flood did fill batches: calls failed on the batch budget (the
    // flood's own calls count as attempts and are dead-lettered; a bank
    // call that found the budget full would be in retry).
    let retried = bed.records(&retry_topic(TOPIC)).await;
    let retried = retried.iter().filter_map(|r| Routed::parse(&r.record.headers).ok()?.failure);
    let dead_lettered = bed.dead_letters().await.into_iter().filter_map(|letter| letter.routed.failure);
    let over_budget = retried.chain(dead_lettered).filter(|failure| rule(&failure.message) == "batch-budget").count();
    assert!(over_budget > 0, "no call failed on the batch budget");
}

/// A module slow on every call but never failing, with its events ahead of
/// the bank's: the keys its time per batch cuts off wait in retry without
/// losing an attempt, so they stay due. Retry batches take turns with the
/// topic, so the bank's events are all applied while most of the slow
/// module's keys still wait (before, retry batches followed each other until
/// every slow key was done, and the topic was not read meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_a_slow_module_leaves_in_retry_take_turns_with_the_topic() {
    let mut bed = Bed::with(PayloadLimits::default(), SandboxLimits::default(), |sandbox| {
        vec![load_module_file(sandbox, &bank_wasm()).expect("the bank module loads")]
    })
    .await;
    bed.config.batch_size = 64;
    bed.config.module_time_per_batch = Duration::from_millis(20);
    let bank = bed.projection.modules()[1].clone();
    let spec = WorkloadSpec { events: 300, accounts: 20, seed: 8 };
    let staging = EmbeddedLog::open(bed.dir.path().join("staging.redb")).unwrap();
    let oracle = publish_bank(&staging, bank.clone(), spec, 1).await;
    let slow_keys = 400;
    // Each call spins through refused host calls for some milliseconds, then succeeds.
    let mut records: Vec<Record> =
        (0..slow_keys).map(|i| attack(tag::REFUSAL_SPIN, 1_000_000 + i, json!({ "n": 2_000 }))).collect();
    records.extend(staging.read("accounts", 0, 0, spec.events).await.unwrap().into_iter().map(|s| s.record));
    bed.append(records).await;

    let consumer = Consumer::new(bed.log.clone(), bed.projection.clone(), bed.config.clone());
    let run = tokio::spawn(async move { consumer.catch_up().await });
    let slow_done = |store: &StateStore| (0..slow_keys).filter(|i| report(store, 1_000_000 + i).is_some()).count();
    let done_when_bank_applied = tokio::time::timeout(Duration::from_secs(300), async {
        loop {
            if demo::check_projection(&oracle, &*bank, bed.store()).unwrap().matches() {
                return slow_done(bed.store());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the bank's events are applied");
    let summary = run.await.unwrap().expect("the consumer never stops because of a module");
    assert!(
        done_when_bank_applied < slow_keys as usize / 2,
        "the bank waited until {done_when_bank_applied} of {slow_keys} slow keys were done"
    );
    assert_eq!((slow_done(bed.store()), summary.dead_lettered), (slow_keys as usize, 0), "{summary:?}");
}

/// A module that takes its whole CPU budget on every call, beside the bank
/// in one projection. The per-call budget alone would let it hold the
/// batch (and the bank's events in it) for its number of keys times the
/// budget; the time one module may take per batch cuts that short: its
/// other keys go to retry without losing an attempt (so with one attempt
/// allowed, each still gets its one call and is dead-lettered for its own
/// trap, never for the cut), and the bank is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_slow_on_every_call_is_cut_off_per_batch_and_the_bank_goes_on() {
    let limits = SandboxLimits { call_budget: Duration::from_millis(100), ..SandboxLimits::default() };
    let mut bed = Bed::with(PayloadLimits::default(), limits, |sandbox| {
        vec![load_module_file(sandbox, &bank_wasm()).expect("the bank module loads")]
    })
    .await;
    bed.config.retry.max_attempts = 1;
    bed.config.module_time_per_batch = Duration::from_millis(250);
    let bank = bed.projection.modules()[1].clone();
    let spec = WorkloadSpec { events: 500, accounts: 20, seed: 5 };
    let staging = EmbeddedLog::open(bed.dir.path().join("staging.redb")).unwrap();
    let oracle = publish_bank(&staging, bank.clone(), spec, 1).await;
    let mut records: Vec<Record> =
        staging.read("accounts", 0, 0, spec.events).await.unwrap().into_iter().map(|s| s.record).collect();
    let slow_keys = 20;
    records.extend((0..slow_keys).map(|i| attack(tag::REFUSAL_SPIN, 1_000_000 + i, json!({ "n": 0 }))));
    bed.append(records).await;
    let summary = bed.run().await;

    assert_eq!((summary.applied, summary.dead_lettered), (spec.events as u64, slow_keys), "{summary:?}");
    let check = demo::check_projection(&oracle, &*bank, bed.store()).unwrap();
    assert!(check.matches(), "{}", check.report(5));
    for letter in bed.dead_letters().await {
        let failure = letter.routed.failure.expect("a dead letter says why");
        assert_eq!(failure.class, FailureClass::Trap, "{}", failure.message);
        assert!(failure.message.contains("CPU budget"), "dead-lettered for the cut: {}", failure.message);
    }
    let retried: Vec<Routed> =
        bed.records(&retry_topic(TOPIC)).await.iter().map(|r| Routed::parse(&r.record.headers).unwrap()).collect();
    let cut: Vec<&Routed> = retried
        .iter()
        .filter(|routed| routed.failure.as_ref().is_some_and(|f| rule(&f.message) == "batch-module-time"))
        .collect();
    assert!(!cut.is_empty(), "the slow module's time per batch never cut a batch short");
    assert!(cut.iter().all(|routed| routed.attempts == 0), "a cut call cost its key an attempt: {cut:?}");
    let first = cut[0].failure.as_ref().unwrap();
    assert_eq!(first.class, FailureClass::Retryable);
    assert!(first.message.contains("over the 250 ms one module may take per batch"), "{}", first.message);
    assert!(
        retried.iter().all(|routed| routed.origin_offset >= spec.events as u64),
        "a bank event went to retry because of the slow module"
    );
}
