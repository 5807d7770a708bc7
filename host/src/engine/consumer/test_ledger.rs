//! A native module and a snapshot in a map, for the unit tests of a batch,
//! a key's run and a partition's loop: the ledger's types cover every
//! algebra, timing and failure class the consumer routes.

use std::collections::HashMap;
use std::sync::Arc;

use super::ConsumerConfig;
use super::batch::BatchRunner;
use super::key::KeyRunner;
use super::projection_names::ProjectionNames;
use crate::engine::projection::ModuleSet;
use crate::engine::routing::RoutedTopics;
use crate::event::{Algebra, EventAtomicOrdering, EventHeaders, EventTiming, EventTypeTag};
use crate::key::Key;
use crate::sandbox::handler::{
    BatchBudget, CallError, CounterQuota, ErrorClass, EventType, HandlerInstance, HandlerModule, KeyScope,
};
use crate::storage::log::Record;
use crate::storage::state::{Snapshot, StateError};

use EventAtomicOrdering::Relaxed;

/// Adds its bodies (decimal numbers) to the key's `balance`, two a call.
pub(super) const DEPOSIT: u32 = 1;
/// Sets the key's `balance` to 0.
pub(super) const RESET: u32 = 2;
/// Idempotent-commutative, one a call: appends its body to `tags`.
pub(super) const TAG: u32 = 3;
/// Timed, one a call: appends its body to `readings`.
pub(super) const READING: u32 = 4;
/// Associative (a fold adds the numbers): adds the sum to `balance`.
pub(super) const SUM: u32 = 5;
/// Timed and idempotent-commutative, one a call: appends to `readings`.
pub(super) const MARK: u32 = 6;
/// Timed, declared `timed-relaxed`, one a call: appends to `readings`.
pub(super) const GLANCE: u32 = 7;

/// A native module of the event types above. A body `fail…` fails
/// retryably, `bad…` unrecoverably, whatever the type.
pub(super) struct Ledger {
    pub(super) types: Vec<EventType>,
    /// Whether making an instance panics.
    pub(super) panics: bool,
}

impl Ledger {
    pub(super) fn new() -> Self {
        let event_type = |tag, name: &str, algebra, max_batch, timing| EventType {
            tag: EventTypeTag::new(tag),
            name: name.to_owned(),
            algebra,
            max_batch,
            timing,
        };
        Self {
            types: vec![
                event_type(DEPOSIT, "deposit", Algebra::NonAssociative, 2, EventTiming::Untimed),
                event_type(RESET, "reset", Algebra::NonAssociative, 1, EventTiming::Untimed),
                event_type(TAG, "tag", Algebra::IdempotentCommutative, 1, EventTiming::Untimed),
                event_type(READING, "reading", Algebra::NonAssociative, 1, EventTiming::Timed),
                event_type(SUM, "sum", Algebra::Associative, 10, EventTiming::Untimed),
                event_type(MARK, "mark", Algebra::IdempotentCommutative, 1, EventTiming::Timed),
                event_type(GLANCE, "glance", Algebra::NonAssociative, 1, EventTiming::TimedRelaxed),
            ],
            panics: false,
        }
    }

    pub(super) fn algebra(tag: u32) -> Algebra {
        Self::new().types.iter().find(|t| t.tag.get() == tag).map(|t| t.algebra).unwrap_or_default()
    }
}

impl HandlerModule for Ledger {
    fn name(&self) -> &str {
        "ledger"
    }

    fn version(&self) -> &str {
        "ledger-1"
    }

    fn event_types(&self) -> &[EventType] {
        &self.types
    }

    fn instantiate(&self) -> Result<Box<dyn HandlerInstance>, CallError> {
        assert!(!self.panics, "no instance today");
        Ok(Box::new(LedgerInstance))
    }
}

pub(super) struct LedgerInstance;

fn number(body: &[u8]) -> i64 {
    std::str::from_utf8(body).ok().and_then(|text| text.parse().ok()).unwrap_or_default()
}

/// What a call of the ledger does: fails as its bodies say, or applies them.
fn apply(scope: &mut KeyScope, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<(), CallError> {
    for body in bodies {
        let class = match body.as_slice() {
            [b'f', b'a', b'i', b'l', ..] => Some(ErrorClass::Retryable),
            [b'b', b'a', b'd', ..] => Some(ErrorClass::Unrecoverable),
            _ => None,
        };
        if let Some(class) = class {
            let message = String::from_utf8_lossy(body).into_owned();
            return Err(CallError::Handler { class, message });
        }
    }
    let read = |scope: &mut KeyScope, name| scope.get(name).unwrap().unwrap_or_default();
    match tag.get() {
        DEPOSIT | SUM => {
            let balance = number(&read(scope, "balance")) + bodies.iter().map(|b| number(b)).sum::<i64>();
            scope.set("balance", balance.to_string().into_bytes()).unwrap();
            scope.counter_add("deposits", bodies.len() as i64).unwrap();
        }
        RESET => scope.set("balance", b"0".to_vec()).unwrap(),
        TAG | READING | MARK | GLANCE => {
            let name = if tag.get() == TAG { "tags" } else { "readings" };
            let mut list = read(scope, name);
            bodies.iter().for_each(|body| list.extend_from_slice(&[body.as_slice(), b" "].concat()));
            scope.set(name, list).unwrap();
        }
        _ => unreachable!("no such type"),
    }
    Ok(())
}

impl HandlerInstance for LedgerInstance {
    fn handle(&mut self, scope: &mut KeyScope, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<(), CallError> {
        // As the WASM runtime does: the call's changes kept or dropped.
        let result = apply(scope, tag, bodies);
        scope.finish_call(result)
    }

    fn combine(&mut self, _: EventTypeTag, bodies: &[Vec<u8>]) -> Result<Vec<u8>, CallError> {
        Ok(bodies.iter().map(|b| number(b)).sum::<i64>().to_string().into_bytes())
    }

    fn key(&mut self, _: EventTypeTag, _: &[u8]) -> Result<Key, CallError> {
        Ok(Key::int(0))
    }

    fn ordering(&mut self, _: EventTypeTag, _: &[u8]) -> Result<EventAtomicOrdering, CallError> {
        Ok(Relaxed)
    }

    fn event_time(&mut self, _: EventTypeTag, _: &[u8]) -> Result<Option<i64>, CallError> {
        Ok(None)
    }
}

/// Committed state held in a map.
#[derive(Default)]
pub(super) struct MapSnapshot(pub(super) HashMap<(Key, String), Vec<u8>>);

impl Snapshot for MapSnapshot {
    fn get(&self, key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self.0.get(&(key.clone(), name.to_owned())).cloned())
    }

    fn contains(&self, key: &Key, name: &str) -> Result<bool, StateError> {
        Ok(self.0.contains_key(&(key.clone(), name.to_owned())))
    }

    fn entry_count(&self, key: &Key, at_most: usize) -> Result<usize, StateError> {
        Ok(self.0.keys().filter(|(k, _)| k == key).count().min(at_most))
    }

    fn counter(&self, _: &str) -> Result<Option<i128>, StateError> {
        Ok(None)
    }

    fn counter_count(&self, _: usize) -> Result<usize, StateError> {
        Ok(0)
    }

    /// The ledger sets no timers.
    fn timers(&self, _: &Key) -> Result<Vec<wakuwaku_core::timers::Timer>, StateError> {
        Ok(Vec::new())
    }

    fn timer_count(&self, _: usize) -> Result<usize, StateError> {
        Ok(0)
    }
}

pub(super) fn runner() -> BatchRunner {
    let config = ConsumerConfig { workers: 1, ..ConsumerConfig::default() };
    let projection = ProjectionNames::new("p".into(), vec!["t".into()], RoutedTopics::shared("t"));
    BatchRunner {
        budget: BatchBudget::new(&config.payload),
        counters: CounterQuota::new(&config.payload),
        keys: KeyRunner::new(Arc::new(projection), config),
        metrics: None,
        clock: Default::default(),
        solo: None,
        due: Vec::new(),
    }
}

pub(super) fn modules(ledger: Ledger) -> Arc<ModuleSet> {
    Arc::new(ModuleSet::new("p", "t", vec![Arc::new(ledger)]).unwrap())
}

/// An event of `key` and type `tag`, as the publisher writes it.
pub(super) fn event(key: i64, tag: u32, ordering: EventAtomicOrdering, event_time: Option<i64>, body: &str) -> Record {
    let envelope = EventHeaders {
        tag: EventTypeTag::new(tag),
        key: Key::int(key),
        ordering,
        algebra: Ledger::algebra(tag),
        event_time,
    };
    Record { headers: envelope.to_headers(), body: body.as_bytes().to_vec() }
}

pub(super) fn relaxed(key: i64, tag: u32, body: &str) -> Record {
    event(key, tag, Relaxed, None, body)
}
