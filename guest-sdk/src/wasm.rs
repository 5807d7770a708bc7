//! The bridge between the WIT bindings and the plain-Rust API.
//!
//! Compiled on every target so it is type-checked natively, but only useful
//! inside a component: natively the imports `WasmHost` calls are stubs that
//! panic.

use std::marker::PhantomData;

use crate::bindings::exports::wakuwaku::handler::handler as wit_handler;
use crate::bindings::wakuwaku::handler::{emit, log, state, timers, types as wit};
use wakuwaku_core::key::Key;

use crate::context::{HostApi, Outgoing, Refusal};
use crate::module::{EventTypeInfo, Module};
use crate::types::{Algebra, ErrorClass, EventAtomicOrdering, EventTiming, HandlerError, Level};

/// The host as seen from inside a component: every call is a WIT import.
#[derive(Debug, Default)]
pub struct WasmHost;

impl HostApi for WasmHost {
    fn get(&mut self, name: &str) -> Result<Option<Vec<u8>>, Refusal> {
        state::get(name)
    }
    fn set(&mut self, name: &str, value: &[u8]) -> Result<(), Refusal> {
        state::set(name, value)
    }
    fn delete(&mut self, name: &str) -> Result<(), Refusal> {
        state::delete(name)
    }
    fn counter_add(&mut self, name: &str, delta: i64) -> Result<(), Refusal> {
        state::counter_add(name, delta)
    }
    fn counter_get(&mut self, name: &str) -> Result<i64, Refusal> {
        state::counter_get(name)
    }
    fn emit(&mut self, message: Outgoing) -> Result<(), Refusal> {
        emit::emit(&wit::Outgoing {
            topic: message.topic,
            tag: message.tag,
            key: message.key.as_bytes().to_vec(),
            ordering: ordering_to_wit(message.ordering),
            algebra: algebra_to_wit(message.algebra),
            body: message.body,
        })
    }
    fn log(&mut self, level: Level, message: &str) {
        let level = match level {
            Level::Trace => log::Level::Trace,
            Level::Debug => log::Level::Debug,
            Level::Info => log::Level::Info,
            Level::Warn => log::Level::Warn,
            Level::Error => log::Level::Error,
        };
        log::log(level, message);
    }
    fn timer_set(&mut self, name: &str, at: i64, payload: &[u8]) -> Result<(), Refusal> {
        timers::set(name, at, payload)
    }
    fn timer_cancel(&mut self, name: &str) -> Result<(), Refusal> {
        timers::cancel(name)
    }
    fn timer_get(&mut self, name: &str) -> Result<Option<crate::Timer>, Refusal> {
        Ok(timers::get(name)?.map(|t| crate::Timer { name: t.name, at: t.at, payload: t.payload }))
    }
}

/// Exports a [`Module`] as the component's `handler` interface.
pub struct Export<M>(PhantomData<M>);

impl<M: Module> wit_handler::Guest for Export<M> {
    fn describe() -> wit::ModuleInfo {
        let info = M::describe();
        wit::ModuleInfo {
            event_types: info.event_types.into_iter().map(event_type_to_wit).collect(),
            emits: info.emits.iter().map(|topic| (*topic).to_owned()).collect(),
        }
    }

    fn key(tag: u32, body: Vec<u8>) -> Result<Vec<u8>, wit::HandlerError> {
        M::key(tag, &body).map(|key| key.as_bytes().to_vec()).map_err(error_to_wit)
    }

    fn ordering(tag: u32, body: Vec<u8>) -> Result<wit::Ordering, wit::HandlerError> {
        M::ordering(tag, &body).map(ordering_to_wit).map_err(error_to_wit)
    }

    fn event_time(tag: u32, body: Vec<u8>) -> Result<Option<i64>, wit::HandlerError> {
        M::event_time(tag, &body).map_err(error_to_wit)
    }

    fn combine(tag: u32, bodies: Vec<Vec<u8>>) -> Result<Vec<u8>, wit::HandlerError> {
        M::combine(tag, &bodies).map_err(error_to_wit)
    }

    fn handle(tag: u32, key: Vec<u8>, bodies: Vec<Vec<u8>>) -> Result<(), wit::HandlerError> {
        // The host hands over canonical bytes; anything else is its bug.
        let key = Key::from_canonical(&key)
            .map_err(|e| error_to_wit(HandlerError::unrecoverable(format!("the host passed a bad key: {e}"))))?;
        M::handle(&mut WasmHost, tag, &key, &bodies).map_err(error_to_wit)
    }

    fn fire(key: Vec<u8>, timers: Vec<wit::Timer>) -> Result<(), wit::HandlerError> {
        let key = Key::from_canonical(&key)
            .map_err(|e| error_to_wit(HandlerError::unrecoverable(format!("the host passed a bad key: {e}"))))?;
        let timers: Vec<crate::Timer> =
            timers.into_iter().map(|t| crate::Timer { name: t.name, at: t.at, payload: t.payload }).collect();
        M::fire(&mut WasmHost, &key, &timers).map_err(error_to_wit)
    }
}

fn event_type_to_wit(info: EventTypeInfo) -> wit::EventType {
    wit::EventType {
        tag: info.tag,
        name: info.name.to_owned(),
        algebra: algebra_to_wit(info.algebra),
        max_batch: info.max_batch,
        timing: match info.timing {
            EventTiming::Untimed => wit::Timing::Untimed,
            EventTiming::Timed => wit::Timing::Timed,
            EventTiming::TimedRelaxed => wit::Timing::TimedRelaxed,
        },
    }
}

fn ordering_to_wit(ordering: EventAtomicOrdering) -> wit::Ordering {
    match ordering {
        EventAtomicOrdering::Relaxed => wit::Ordering::Relaxed,
        EventAtomicOrdering::Acquire => wit::Ordering::Acquire,
        EventAtomicOrdering::Release => wit::Ordering::Release,
        EventAtomicOrdering::AcqRel => wit::Ordering::AcqRel,
    }
}

fn algebra_to_wit(algebra: Algebra) -> wit::Algebra {
    match algebra {
        Algebra::NonAssociative => wit::Algebra::NonAssociative,
        Algebra::Commutative => wit::Algebra::Commutative,
        Algebra::Idempotent => wit::Algebra::Idempotent,
        Algebra::IdempotentCommutative => wit::Algebra::IdempotentCommutative,
        Algebra::Associative => wit::Algebra::Associative,
    }
}

fn error_to_wit(error: HandlerError) -> wit::HandlerError {
    let class = match error.class {
        ErrorClass::Transient => wit::ErrorClass::Transient,
        ErrorClass::Retryable => wit::ErrorClass::Retryable,
        ErrorClass::Unrecoverable => wit::ErrorClass::Unrecoverable,
    };
    wit::HandlerError { class, message: error.message }
}
