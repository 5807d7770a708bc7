//! A host upgrade never stops a pinned module version from running: a
//! module built for the first contract (`wakuwaku:handler@0.2.0`, the
//! raw-WIT guest `tests/guests/tally-0-2`) loads and runs unchanged beside
//! a module of the current one (0.4, the probe, built with the SDK), in
//! one projection, published and consumed by the same host; and a module
//! built for 0.3 (`tests/guests/seen-0-3`, before `timed-relaxed`) loads
//! and runs unchanged, its `timed` types applied in event-time order
//! against each other; and a module built for 0.4 (`tests/guests/seen-0-4`,
//! before timers) loads and runs unchanged, is never asked to fire a
//! timer, and its `timed-relaxed` type stays relaxed.

use std::collections::HashMap;

use serde_json::json;
use wakuwaku::authoring::publish::{self, Outgoing};
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::engine::projection::load_module_file;
use wakuwaku::event::{EventTiming, EventTypeTag, header_name};
use wakuwaku::key::Key;
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
use wakuwaku::storage::log::EventLog;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku_tests::{catch_up, guest_wasm, host_settings, probe_wasm};

/// `Added` of the 0.2 module.
const ADDED: EventTypeTag = EventTypeTag::new(300);
/// The probe's `TimedLedger` (timed) and `Ledger` (untimed).
const TIMED_LEDGER: EventTypeTag = EventTypeTag::new(51);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_of_the_0_2_contract_runs_beside_a_current_one_in_one_projection() {
    let sandbox = Sandbox::new(SandboxLimits::default()).unwrap();
    let old = load_module_file(&sandbox, &guest_wasm("tests/guests/tally-0-2")).expect("the 0.2 module loads");
    let new = load_module_file(&sandbox, &probe_wasm()).expect("the 0.3 module loads");
    // A 0.2 module has no event time: all its types are untimed.
    let timings = |module: &dyn wakuwaku::sandbox::handler::HandlerModule| -> HashMap<u32, EventTiming> {
        module.event_types().iter().map(|t| (t.tag.get(), t.timing)).collect()
    };
    assert_eq!(timings(&*old), HashMap::from([(300, EventTiming::Untimed)]));
    assert_eq!(timings(&*new)[&51], EventTiming::Timed);
    assert_eq!(timings(&*new)[&50], EventTiming::Untimed);

    let dir = tempfile::tempdir().unwrap();
    let log = std::sync::Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("mixed", 1).await.unwrap();
    let added =
        |amount: i64| Outgoing { tag: ADDED, body: serde_json::to_vec(&json!({"key": 1, "amount": amount})).unwrap() };
    publish::publish(&*log, "mixed", old.clone(), vec![added(5), added(7)], None, 1).await.unwrap();
    let entry =
        json!({"key": 2, "seq": 1, "amount": 3, "fail": null, "ordering": "relaxed", "at": 1_796_169_600_000i64});
    let timed = Outgoing { tag: TIMED_LEDGER, body: serde_json::to_vec(&entry).unwrap() };
    publish::publish(&*log, "mixed", new.clone(), vec![timed], None, 1).await.unwrap();
    publish::publish(&*log, "mixed", old.clone(), vec![added(-2)], None, 1).await.unwrap();

    // The publisher asked each module what it can answer: no event time of
    // the 0.2 module, the 0.3 module's for its timed type.
    let records = log.read("mixed", 0, 0, 10).await.unwrap();
    let event_times: Vec<Option<Vec<u8>>> = records
        .iter()
        .map(|r| r.record.headers.iter().find(|h| h.name == header_name::EVENT_TIME).map(|h| h.value.clone()))
        .collect();
    let stamped = 1_796_169_600_000i64.to_le_bytes().to_vec();
    assert_eq!(event_times, [None, None, Some(stamped), None]);

    let settings = host_settings(dir.path(), "mixed", "mixed", vec![old, new], ConsumerConfig::default());
    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!((summary.applied, summary.dead_lettered), (4, 0), "{summary:?}");
    let store = projection.store();
    let amounts = store.get(&Key::int(1u64), "amounts").unwrap().expect("the 0.2 module wrote its state");
    assert_eq!(serde_json::from_slice::<Vec<i64>>(&amounts).unwrap(), [5, 7, -2], "in log order");
    let balance = store.get(&Key::int(2u64), "balance").unwrap().expect("the 0.3 module wrote its state");
    assert_eq!(serde_json::from_slice::<i64>(&balance).unwrap(), 3);
    let counters: HashMap<String, i128> = store.counters().unwrap().into_iter().collect();
    assert_eq!((counters.get("added"), counters.get("ledger")), (Some(&3), Some(&1)));
}

/// `Ordered` and `Shipped` of the 0.3 module: timed, relaxed.
const ORDERED: EventTypeTag = EventTypeTag::new(310);
const SHIPPED: EventTypeTag = EventTypeTag::new(311);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_of_the_0_3_contract_runs_unchanged_its_timed_types_in_event_time_order() {
    let sandbox = Sandbox::new(SandboxLimits::default()).unwrap();
    let module = load_module_file(&sandbox, &guest_wasm("tests/guests/seen-0-3")).expect("the 0.3 module loads");
    let timings: HashMap<u32, EventTiming> = module.event_types().iter().map(|t| (t.tag.get(), t.timing)).collect();
    assert_eq!(timings, HashMap::from([(310, EventTiming::Timed), (311, EventTiming::Timed)]));

    let dir = tempfile::tempdir().unwrap();
    let log = std::sync::Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    let seen = |tag, at: i64| Outgoing { tag, body: serde_json::to_vec(&json!({"key": 7, "at": at})).unwrap() };
    for (topic, tag, times) in [("orders", ORDERED, [1000, 3000, 5000]), ("shipments", SHIPPED, [2000, 4000, 6000])] {
        log.create_topic(topic, 1).await.unwrap();
        let events = times.iter().map(|&at| seen(tag, at)).collect();
        publish::publish(&*log, topic, module.clone(), events, None, 1).await.unwrap();
    }
    let mut settings = host_settings(dir.path(), "seen", "orders", vec![module], ConsumerConfig::default());
    settings.more_topics = vec!["shipments".to_owned()];
    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!((summary.applied, summary.dead_lettered, summary.order_violations), (6, 0, 0), "{summary:?}");
    let seen = projection.store().get(&Key::int(7u64), "seen").unwrap().expect("the 0.3 module wrote its state");
    let seen: Vec<String> = serde_json::from_slice(&seen).unwrap();
    assert_eq!(seen, ["O@1000", "S@2000", "O@3000", "S@4000", "O@5000", "S@6000"]);
}

/// `Ordered` (timed) and `Shipped` (timed-relaxed) of the 0.4 module.
const ORDERED_0_4: EventTypeTag = EventTypeTag::new(320);
const SHIPPED_0_4: EventTypeTag = EventTypeTag::new(321);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_of_the_0_4_contract_runs_unchanged_and_has_no_timers() {
    let sandbox = Sandbox::new(SandboxLimits::default()).unwrap();
    let module = load_module_file(&sandbox, &guest_wasm("tests/guests/seen-0-4")).expect("the 0.4 module loads");
    let timings: HashMap<u32, EventTiming> = module.event_types().iter().map(|t| (t.tag.get(), t.timing)).collect();
    assert_eq!(timings, HashMap::from([(320, EventTiming::Timed), (321, EventTiming::TimedRelaxed)]));
    // It has no `fire`: the host never calls it, whatever it is handed.
    let dir = tempfile::tempdir().unwrap();
    let store = wakuwaku::storage::state::StateStore::open(&dir.path().join("scratch.redb")).unwrap();
    let limits = wakuwaku::sandbox::handler::PayloadLimits::default();
    let mut scope = wakuwaku::sandbox::handler::KeyScope::new(
        Key::int(7u64),
        std::sync::Arc::new(store.reader().unwrap()),
        limits,
        wakuwaku::sandbox::handler::BatchBudget::new(&limits),
    );
    let timer = wakuwaku_core::timers::Timer { name: "t".into(), at: 1, payload: vec![] };
    assert_eq!(module.instantiate().unwrap().fire(&mut scope, &[timer]), Ok(false));

    let log = std::sync::Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    let seen = |tag, at: i64| Outgoing { tag, body: serde_json::to_vec(&json!({"key": 7, "at": at})).unwrap() };
    for (topic, tag, times) in [("orders", ORDERED_0_4, [1000, 3000]), ("shipments", SHIPPED_0_4, [2000, 4000])] {
        log.create_topic(topic, 1).await.unwrap();
        let events = times.iter().map(|&at| seen(tag, at)).collect();
        publish::publish(&*log, topic, module.clone(), events, None, 1).await.unwrap();
    }
    let mut settings = host_settings(dir.path(), "seen", "orders", vec![module], ConsumerConfig::default());
    settings.more_topics = vec!["shipments".to_owned()];
    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!((summary.applied, summary.dead_lettered, summary.order_violations), (4, 0, 0), "{summary:?}");
    let seen = projection.store().get(&Key::int(7u64), "seen").unwrap().expect("the 0.4 module wrote its state");
    let mut seen: Vec<String> = serde_json::from_slice(&seen).unwrap();
    // Each type in its own event-time order; relaxed against each other.
    seen.sort_by_key(|entry| entry.starts_with('S'));
    assert_eq!(seen, ["O@1000", "O@3000", "S@2000", "S@4000"]);
}
