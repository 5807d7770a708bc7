//! The hostile test module (`tests/guests/hostile`, written against the raw
//! WIT) and what its tests share: its tags, its events, what it reports
//! back, and the count every test of it checks.
//!
//! - [`hostile_wasm`] builds it; [`hostile_module`] loads it.
//! - [`attack`] makes one event of an attack: a Relaxed record keyed by the
//!   integer `key`, whose JSON body carries the key and the attack's
//!   parameters (see the module's docs: `n`, `size`, `mode`, `topic`, …).
//! - [`report`] reads what the module wrote about one call (the `report`
//!   entry), [`counter`] one of the counters it keeps per attack.
//! - [`Accounts`] checks that every event read from a topic ended applied,
//!   skipped, dead-lettered or waiting in retry: nothing lost, nothing
//!   counted twice.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use wakuwaku::event::EventTypeTag;
use wakuwaku::key::Key;
use wakuwaku::sandbox::handler::HandlerModule;
use wakuwaku::sandbox::runtime::Sandbox;
use wakuwaku::storage::log::Record;
use wakuwaku::storage::state::StateStore;
use wakuwaku::storage::stats::Stat;

use crate::{guest_wasm, json_record};

/// The one topic the hostile module declares it emits to; it must exist
/// before the module loads.
pub const OUT: &str = "hostile_out";

/// The size of the allocation the module's armed allocator misbehaves on
/// (see [`tag::ARM_ALLOCATOR`]).
pub const ALLOC_TRIGGER: usize = 8008;

/// The hostile module's event types, one per attack (see
/// `tests/guests/hostile/src/lib.rs` for what each does with its body).
pub mod tag {
    use wakuwaku::event::EventTypeTag;

    /// Emits to `topic` (default `nowhere`): not declared.
    pub const EMIT_UNDECLARED: EventTypeTag = EventTypeTag::new(200);
    /// Emits to `dlq_`/`retry_` of its own topic and of `topic`.
    pub const EMIT_HOST_TOPIC: EventTypeTag = EventTypeTag::new(201);
    /// Emits to topics whose names are not topic names.
    pub const EMIT_BAD_TOPIC: EventTypeTag = EventTypeTag::new(202);
    /// Emits an empty body, then one of `size` bytes.
    pub const EMIT_BAD_BODY: EventTypeTag = EventTypeTag::new(203);
    /// Emits with keys that are not canonical, and one of exactly 1024 bytes.
    pub const EMIT_BAD_KEY: EventTypeTag = EventTypeTag::new(204);
    /// Emits bodies of `size` bytes until refused.
    pub const EMIT_FLOOD: EventTypeTag = EventTypeTag::new(205);
    /// Sets entries of `size` bytes until refused.
    pub const SET_FLOOD: EventTypeTag = EventTypeTag::new(206);
    /// `i64::MAX` three times (`mode` `min`: the `i64::MIN` edges).
    pub const COUNTER_OVERFLOW: EventTypeTag = EventTypeTag::new(207);
    /// Adds `delta` to counter `name` (default `shared`), then reads it.
    pub const SHARED_COUNTER: EventTypeTag = EventTypeTag::new(208);
    /// Empty, 257-byte and `size`-byte names on every state import (or
    /// only `name`, when given).
    pub const BAD_NAMES: EventTypeTag = EventTypeTag::new(209);
    /// `n` log lines of `size` bytes (`mode` `escape`: terminal control
    /// sequences; `text`: the text of `name`).
    pub const LOG_FLOOD: EventTypeTag = EventTypeTag::new(210);
    /// Fails with a `size`-byte message, class `class` (`mode` `escape`:
    /// terminal control sequences).
    pub const HUGE_ERROR: EventTypeTag = EventTypeTag::new(211);
    /// Its `key` export answers per `mode` (`non-canonical`, `long`, …).
    pub const BAD_KEY_EXPORT: EventTypeTag = EventTypeTag::new(212);
    /// Associative; `combine` returns `size` bytes (`mode` `empty`: none;
    /// `panic`, `loop`, `exit`: it panics, spins or exits instead).
    pub const HUGE_COMBINE: EventTypeTag = EventTypeTag::new(213);
    /// Adds to distinct counters until refused.
    pub const COUNTER_NAMES: EventTypeTag = EventTypeTag::new(214);
    /// Deletes distinct (absent) entries until refused.
    pub const DELETE_FLOOD: EventTypeTag = EventTypeTag::new(215);
    /// Makes refused calls `n` times, ignoring them (0: until the budget).
    pub const REFUSAL_SPIN: EventTypeTag = EventTypeTag::new(216);
    /// Hands the host a `string` that is not UTF-8.
    pub const NOT_UTF8: EventTypeTag = EventTypeTag::new(217);
    /// Behaves: checks the key it is given, sets `seen`, counts `behaved`,
    /// emits each body to [`super::OUT`] with `mode` `emit`.
    pub const BEHAVE: EventTypeTag = EventTypeTag::new(218);
    /// Sets entries whose names collide in the host's FxHash.
    pub const COLLIDING_NAMES: EventTypeTag = EventTypeTag::new(219);
    /// Adds to counters whose names collide in the host's FxHash.
    pub const COLLIDING_COUNTERS: EventTypeTag = EventTypeTag::new(220);
    /// Fails every call as transient.
    pub const TRANSIENT: EventTypeTag = EventTypeTag::new(221);
    /// Sets values of `size` bytes (default 1 MiB) until refused.
    pub const BIG_VALUES: EventTypeTag = EventTypeTag::new(222);
    /// Sleeps `n` seconds (default an hour; `mode` `forever`: `u64::MAX`
    /// nanoseconds) through WASI's monotonic clock.
    pub const SLEEP: EventTypeTag = EventTypeTag::new(223);
    /// Sets an entry, then exits the process (WASI `exit`) with status `n`.
    pub const EXIT: EventTypeTag = EventTypeTag::new(224);
    /// Asks WASI for `size` random bytes (`mode` `insecure`: insecure ones).
    pub const RANDOM: EventTypeTag = EventTypeTag::new(225);
    /// Opens `n` WASI handles (`mode` `streams`: stderr streams; otherwise
    /// clock pollables); with `leak`, never drops them.
    pub const HANDLES: EventTypeTag = EventTypeTag::new(226);
    /// Arms the module's allocator (behind `cabi_realloc`) with `mode`:
    /// the next allocation of [`super::ALLOC_TRIGGER`] bytes (the host
    /// lowering a body of that size, or a list of 1001 bodies) traps
    /// (`trap`), spins (`loop`), answers a pointer past the end of memory
    /// (`out-of-bounds`) or off its alignment (`misaligned`), or grows
    /// memory by 4 GiB (`grow`); `post-return` fails this call with a
    /// message of that size and traps when the post-return function frees
    /// it.
    pub const ARM_ALLOCATOR: EventTypeTag = EventTypeTag::new(227);

    /// Every attack's tag and the name the module declares for it.
    pub const ALL: [(EventTypeTag, &str); 28] = [
        (EMIT_UNDECLARED, "EmitUndeclared"),
        (EMIT_HOST_TOPIC, "EmitHostTopic"),
        (EMIT_BAD_TOPIC, "EmitBadTopic"),
        (EMIT_BAD_BODY, "EmitBadBody"),
        (EMIT_BAD_KEY, "EmitBadKey"),
        (EMIT_FLOOD, "EmitFlood"),
        (SET_FLOOD, "SetFlood"),
        (COUNTER_OVERFLOW, "CounterOverflow"),
        (SHARED_COUNTER, "SharedCounter"),
        (BAD_NAMES, "BadNames"),
        (LOG_FLOOD, "LogFlood"),
        (HUGE_ERROR, "HugeError"),
        (BAD_KEY_EXPORT, "BadKeyExport"),
        (HUGE_COMBINE, "HugeCombine"),
        (COUNTER_NAMES, "CounterNames"),
        (DELETE_FLOOD, "DeleteFlood"),
        (REFUSAL_SPIN, "RefusalSpin"),
        (NOT_UTF8, "NotUtf8"),
        (BEHAVE, "Behave"),
        (COLLIDING_NAMES, "CollidingNames"),
        (COLLIDING_COUNTERS, "CollidingCounters"),
        (TRANSIENT, "Transient"),
        (BIG_VALUES, "BigValues"),
        (SLEEP, "Sleep"),
        (EXIT, "Exit"),
        (RANDOM, "Random"),
        (HANDLES, "Handles"),
        (ARM_ALLOCATOR, "ArmAllocator"),
    ];
}

/// The hostile module as a component.
pub fn hostile_wasm() -> PathBuf {
    guest_wasm("tests/guests/hostile")
}

/// Loads the hostile module into `sandbox`.
pub fn hostile_module(sandbox: &Sandbox) -> Arc<dyn HandlerModule> {
    wakuwaku::engine::projection::load_module_file(sandbox, &hostile_wasm()).expect("the hostile module loads")
}

/// The name an attack's tag is declared under.
pub fn attack_name(tag: EventTypeTag) -> &'static str {
    tag::ALL.iter().find(|(t, _)| *t == tag).map(|(_, name)| *name).expect("a hostile tag")
}

/// One event of the attack `tag` for integer key `key`; `params` (a JSON
/// object) gives its parameters, and the body gets `key` added.
pub fn attack(tag: EventTypeTag, key: u64, params: serde_json::Value) -> Record {
    json_record(tag, key, attack_body(key, params))
}

/// The JSON body of an attack on `key` with `params`.
pub fn attack_body(key: u64, params: serde_json::Value) -> serde_json::Value {
    let mut body = match params {
        serde_json::Value::Object(map) => map,
        serde_json::Value::Null => serde_json::Map::new(),
        other => panic!("attack parameters are a JSON object, not {other}"),
    };
    body.insert("key".into(), key.into());
    serde_json::Value::Object(body)
}

/// What the hostile module wrote about its last successful call for a key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Report {
    /// Import calls the host accepted.
    pub accepted: u64,
    /// Refused calls per rule id.
    pub refused: BTreeMap<String, u64>,
    /// The first refusal message per rule id.
    pub first: BTreeMap<String, String>,
    /// One outcome per step, for the small attacks: `ok`, `= <value>` or a
    /// rule id.
    pub outcomes: Vec<String>,
}

/// The report the module left for integer key `key`, if any.
pub fn report(store: &StateStore, key: u64) -> Option<Report> {
    let bytes = store.get(&Key::int(key), "report").expect("state reads")?;
    Some(serde_json::from_slice(&bytes).expect("the module writes its report as JSON"))
}

/// A committed counter (0 when absent).
pub fn counter(store: &StateStore, name: &str) -> i128 {
    store.counters().expect("counters read").into_iter().find(|(n, _)| n == name).map_or(0, |(_, value)| value)
}

/// The rule id a refusal or failure message starts with.
pub fn rule(message: &str) -> &str {
    message.split(':').next().unwrap_or(message)
}

/// Where every event read from a projection's topic ended, from its
/// committed positions and statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Accounts {
    /// Messages read from the topic (the committed positions, summed).
    pub consumed: u64,
    /// Events applied.
    pub applied: u64,
    /// Events no module declares.
    pub skipped: u64,
    /// Events in the dead-letter topic.
    pub dead_lettered: u64,
    /// Events waiting in the retry topic (`retry_in − retry_out`).
    pub waiting: u64,
    /// Dead letters re-driven.
    pub redriven: u64,
}

impl Accounts {
    /// Reads the counts of a projection of `topic` (with `partitions`
    /// partitions) from its store.
    pub fn of(store: &StateStore, topic: &str, partitions: u32) -> Self {
        let stats = store.stats().expect("stats read");
        let consumed = (0..partitions).map(|p| store.position(topic, p).expect("positions read").unwrap_or(0)).sum();
        let (retry_in, retry_out) = (stats[Stat::RetryIn], stats[Stat::RetryOut]);
        assert!(retry_out <= retry_in, "{retry_out} events left the retry topic but only {retry_in} entered it");
        Self {
            consumed,
            applied: stats[Stat::Applied],
            skipped: stats[Stat::Skipped],
            dead_lettered: stats[Stat::DeadLettered],
            waiting: retry_in - retry_out,
            redriven: stats[Stat::Redriven],
        }
    }

    /// Checks that every event is accounted for exactly once: consumed +
    /// re-driven = applied + skipped + dead-lettered + waiting in retry.
    pub fn check(&self) -> Result<(), String> {
        let ended = self.applied + self.skipped + self.dead_lettered + self.waiting;
        if self.consumed + self.redriven == ended { Ok(()) } else { Err(format!("the counts do not add up: {self:?}")) }
    }
}
