//! A native handler module that fails on cue, for the retry and
//! dead-letter tests.
//!
//! Every body is a [`Step`]: a sequence number, an amount, and the failures
//! it causes on the calls that carry it (`fail[n]` is what the n-th call
//! holding this step returns: `"transient"`, `"retryable"`,
//! `"unrecoverable"` or `"trap"`; once the list is used up, calls succeed).
//! While [`Flaky::broken`] is set, every call fails unrecoverably: the
//! module "before the fix".
//!
//! A successful call appends the steps' sequence numbers to the key's state
//! entry `seqs` and adds their amounts to `total`, so the read model shows
//! exactly what was applied, in which order, and how often.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use wakuwaku::event::{Algebra, EventAtomicOrdering, EventTypeTag};
use wakuwaku::key::Key;
use wakuwaku::sandbox::handler::{CallError, ErrorClass, EventType, HandlerInstance, HandlerModule, KeyScope};

/// A non-associative type, one event per call.
pub const STEP: EventTypeTag = EventTypeTag::new(1);
/// A second non-associative type, up to 4 events per call.
pub const OTHER: EventTypeTag = EventTypeTag::new(2);
/// An associative type: runs are folded by summing amounts.
pub const SUM: EventTypeTag = EventTypeTag::new(3);

/// What every body holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// Unique per test, in publication order.
    pub seq: u64,
    /// Added to the key's `total`.
    pub amount: i64,
    /// What the calls carrying this step return, in turn.
    pub fail: Vec<String>,
    /// For a fold: the sequence numbers of every step folded into it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub folded: Vec<u64>,
}

impl Step {
    /// The sequence numbers it stands for.
    pub fn seqs(&self) -> Vec<u64> {
        if self.folded.is_empty() { vec![self.seq] } else { self.folded.clone() }
    }

    /// The body bytes.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a step serialises")
    }
}

/// One successful call: the key, the type and the sequence numbers handled.
pub type Handled = (Key, EventTypeTag, Vec<u64>);

/// The module. Clones share their call counts, their record and switch.
#[derive(Clone, Default)]
pub struct Flaky {
    /// Calls made so far per sequence number.
    calls: Arc<Mutex<FxHashMap<u64, usize>>>,
    /// Every successful call, in the order each key's calls ran.
    handled: Arc<Mutex<Vec<Handled>>>,
    /// While set, every call fails unrecoverably.
    pub broken: Arc<AtomicBool>,
    /// While set, making an instance fails as a trap would.
    pub unstartable: Arc<AtomicBool>,
    /// Instances asked for so far, made or not.
    pub instantiations: Arc<std::sync::atomic::AtomicUsize>,
    event_types: Arc<Vec<EventType>>,
}

impl Flaky {
    /// A fresh module.
    pub fn new() -> Self {
        let event_type = |tag: EventTypeTag, name: &str, algebra, max_batch| EventType {
            tag,
            name: name.to_owned(),
            algebra,
            max_batch,
            timing: wakuwaku::event::EventTiming::Untimed,
        };
        Self {
            event_types: Arc::new(vec![
                event_type(STEP, "Step", Algebra::NonAssociative, 1),
                event_type(OTHER, "Other", Algebra::NonAssociative, 4),
                event_type(SUM, "Sum", Algebra::Associative, 8),
            ]),
            ..Self::default()
        }
    }

    /// The same module with every type timed: the consumer takes each
    /// event's time from its `waku-event-time` header. The types opt out of
    /// event-time order between types (`TimedRelaxed`), so a key's runs are
    /// planned by their orderings alone, as the fold tests need.
    pub fn timed(self) -> Self {
        let timed = self
            .event_types
            .iter()
            .cloned()
            .map(|event_type| EventType { timing: wakuwaku::event::EventTiming::TimedRelaxed, ..event_type });
        Self { event_types: Arc::new(timed.collect()), ..self }
    }

    /// Every successful call so far.
    pub fn handled(&self) -> Vec<Handled> {
        self.handled.lock().unwrap().clone()
    }

    /// Calls made so far, failed ones included.
    pub fn calls_made(&self) -> usize {
        self.calls.lock().unwrap().values().sum()
    }

    /// Sequence numbers applied to `key`, in order, from committed state.
    pub fn applied(store: &wakuwaku::storage::state::StateStore, key: &Key) -> Vec<u64> {
        store.get(key, "seqs").unwrap().map(|b| serde_json::from_slice(&b).unwrap()).unwrap_or_default()
    }
}

impl HandlerModule for Flaky {
    fn name(&self) -> &str {
        "flaky"
    }

    fn version(&self) -> &str {
        "flaky-1"
    }

    fn event_types(&self) -> &[EventType] {
        &self.event_types
    }

    fn instantiate(&self) -> Result<Box<dyn HandlerInstance>, CallError> {
        self.instantiations.fetch_add(1, Ordering::SeqCst);
        if self.unstartable.load(Ordering::SeqCst) {
            return Err(CallError::Trap { reason: "the start function trapped".into() });
        }
        Ok(Box::new(self.clone()))
    }
}

/// A JSON entry of the scope's key, or the default.
fn read<T: serde::de::DeserializeOwned + Default>(scope: &mut KeyScope, name: &str) -> T {
    scope.get(name).unwrap().map(|bytes| serde_json::from_slice(&bytes).unwrap()).unwrap_or_default()
}

impl HandlerInstance for Flaky {
    fn handle(&mut self, scope: &mut KeyScope, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<(), CallError> {
        let steps: Vec<Step> = bodies
            .iter()
            .map(|b| serde_json::from_slice(b))
            .collect::<Result<_, _>>()
            .map_err(|e| CallError::Handler { class: ErrorClass::Unrecoverable, message: e.to_string() })?;
        if self.broken.load(Ordering::SeqCst) {
            return Err(CallError::Handler { class: ErrorClass::Unrecoverable, message: "not fixed yet".into() });
        }
        let mut failure = None;
        {
            let mut calls = self.calls.lock().unwrap();
            for step in &steps {
                let made = calls.entry(step.seq).or_default();
                if let Some(class) = step.fail.get(*made) {
                    failure.get_or_insert_with(|| (class.clone(), step.seq));
                }
                *made += 1;
            }
        }
        let result = match failure {
            Some((class, seq)) => Err(match class.as_str() {
                "trap" => CallError::Trap { reason: format!("wasm trap: step {seq} hit unreachable") },
                "transient" => CallError::Handler { class: ErrorClass::Transient, message: format!("step {seq}") },
                "retryable" => CallError::Handler { class: ErrorClass::Retryable, message: format!("step {seq}") },
                _ => CallError::Handler { class: ErrorClass::Unrecoverable, message: format!("step {seq}") },
            }),
            None => {
                let mut seqs: Vec<u64> = read(scope, "seqs");
                seqs.extend(steps.iter().map(|s| s.seq));
                let total: i64 = read(scope, "total");
                let total = total + steps.iter().map(|s| s.amount).sum::<i64>();
                scope.set("seqs", serde_json::to_vec(&seqs).unwrap()).unwrap();
                scope.set("total", serde_json::to_vec(&total).unwrap()).unwrap();
                let seqs = steps.iter().flat_map(Step::seqs).collect();
                self.handled.lock().unwrap().push((scope.key().clone(), tag, seqs));
                Ok(())
            }
        };
        scope.finish_call(result)
    }

    fn combine(&mut self, _tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<Vec<u8>, CallError> {
        let steps: Vec<Step> = bodies.iter().map(|b| serde_json::from_slice(b).unwrap()).collect();
        Ok(Step {
            seq: steps[0].seq,
            amount: steps.iter().map(|s| s.amount).sum(),
            folded: steps.iter().flat_map(Step::seqs).collect(),
            fail: steps.into_iter().flat_map(|s| s.fail).collect(),
        }
        .body())
    }

    fn key(&mut self, _tag: EventTypeTag, _body: &[u8]) -> Result<Key, CallError> {
        Err(CallError::Handler {
            class: ErrorClass::Unrecoverable,
            message: "the flaky module's keys come from the test".into(),
        })
    }

    fn ordering(&mut self, _tag: EventTypeTag, _body: &[u8]) -> Result<EventAtomicOrdering, CallError> {
        Ok(EventAtomicOrdering::Relaxed)
    }

    fn event_time(&mut self, _tag: EventTypeTag, _body: &[u8]) -> Result<Option<i64>, CallError> {
        Ok(None)
    }
}
