//! Modules built for the previous contract, `wakuwaku:handler@0.2.0`
//! (`wit/handler.wit`, kept as it was): loaded and run unchanged, so that a
//! host upgrade never stops a pinned module version from running.
//!
//! Rules kept here:
//! - **The version is read from the component, at load.** A component whose
//!   contract imports and its `handler` export are all at 0.2.0 is bound
//!   with this file's bindings; one at 0.3.0 with the current ones; one
//!   mixing them, or at any other version, is refused
//!   (`LoadError::ContractVersion`, see [`super::capabilities`]).
//! - **Same imports, same rules.** The 0.2 `state`, `emit` and `log`
//!   interfaces have the functions and types of the current ones, so each
//!   is served by the current capability: the values are converted and
//!   handed on, and every rule (`outside-handle`, the limits, the host
//!   faults) is the one the current capability keeps.
//! - **No event time.** 0.2 has neither `event-type.timing` nor the
//!   `event-time` export: every event type of a 0.2 module is untimed
//!   ([`crate::event::EventTiming::Untimed`]), so its events are applied as they arrive
//!   and a `waku-event-time` header on them is ignored (`event-time-untimed`),
//!   and the host never asks it for an event time.

use wasmtime::component::{HasSelf, Linker};

use super::StoreData;
use super::bindings::wakuwaku::handler as current;

pub(super) mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/handler.wit",
        world: "module",
        imports: { "wakuwaku:handler/state": trappable },
    });
}

use bindings::wakuwaku::handler::{emit, log, state, types};

/// Links the 0.2 `types`, `state`, `emit` and `log` interfaces.
pub(super) fn link(linker: &mut Linker<StoreData>) -> wasmtime::Result<()> {
    types::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |data| data)?;
    state::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |data| data)?;
    emit::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |data| data)?;
    log::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |data| data)
}

impl types::Host for StoreData {}

type Answer<T> = wasmtime::Result<Result<T, String>>;

impl state::Host for StoreData {
    fn get(&mut self, name: String) -> Answer<Option<Vec<u8>>> {
        current::state::Host::get(self, name)
    }

    fn set(&mut self, name: String, value: Vec<u8>) -> Answer<()> {
        current::state::Host::set(self, name, value)
    }

    fn delete(&mut self, name: String) -> Answer<()> {
        current::state::Host::delete(self, name)
    }

    fn counter_add(&mut self, name: String, delta: i64) -> Answer<()> {
        current::state::Host::counter_add(self, name, delta)
    }

    fn counter_get(&mut self, name: String) -> Answer<i64> {
        current::state::Host::counter_get(self, name)
    }
}

impl emit::Host for StoreData {
    fn emit(&mut self, message: types::Outgoing) -> Result<(), String> {
        let message = current::types::Outgoing {
            topic: message.topic,
            tag: message.tag,
            key: message.key,
            ordering: ordering(message.ordering),
            algebra: algebra(message.algebra),
            body: message.body,
        };
        current::emit::Host::emit(self, message)
    }
}

impl log::Host for StoreData {
    fn log(&mut self, level: log::Level, message: String) {
        let level = match level {
            log::Level::Trace => current::log::Level::Trace,
            log::Level::Debug => current::log::Level::Debug,
            log::Level::Info => current::log::Level::Info,
            log::Level::Warn => current::log::Level::Warn,
            log::Level::Error => current::log::Level::Error,
        };
        current::log::Host::log(self, level, message);
    }
}

/// A 0.2 ordering as the current contract's.
pub(super) fn ordering(ordering: types::Ordering) -> current::types::Ordering {
    match ordering {
        types::Ordering::Relaxed => current::types::Ordering::Relaxed,
        types::Ordering::Acquire => current::types::Ordering::Acquire,
        types::Ordering::Release => current::types::Ordering::Release,
        types::Ordering::AcqRel => current::types::Ordering::AcqRel,
    }
}

fn algebra(algebra: types::Algebra) -> current::types::Algebra {
    match algebra {
        types::Algebra::NonAssociative => current::types::Algebra::NonAssociative,
        types::Algebra::Commutative => current::types::Algebra::Commutative,
        types::Algebra::Idempotent => current::types::Algebra::Idempotent,
        types::Algebra::IdempotentCommutative => current::types::Algebra::IdempotentCommutative,
        types::Algebra::Associative => current::types::Algebra::Associative,
    }
}

/// A 0.2 handler error as the current contract's.
pub(super) fn error(error: types::HandlerError) -> current::types::HandlerError {
    let class = match error.class {
        types::ErrorClass::Transient => current::types::ErrorClass::Transient,
        types::ErrorClass::Retryable => current::types::ErrorClass::Retryable,
        types::ErrorClass::Unrecoverable => current::types::ErrorClass::Unrecoverable,
    };
    current::types::HandlerError { class, message: error.message }
}

/// A 0.2 answer with its error as the current contract's.
pub(super) fn answer<T>(
    answer: wasmtime::Result<Result<T, types::HandlerError>>,
) -> wasmtime::Result<Result<T, current::types::HandlerError>> {
    answer.map(|result| result.map_err(error))
}

/// A 0.2 description as the current contract's: every event type untimed.
pub(super) fn module_info(info: types::ModuleInfo) -> current::types::ModuleInfo {
    let event_types = info
        .event_types
        .into_iter()
        .map(|t| current::types::EventType {
            tag: t.tag,
            name: t.name,
            algebra: algebra(t.algebra),
            max_batch: t.max_batch,
            timing: current::types::Timing::Untimed,
        })
        .collect();
    current::types::ModuleInfo { event_types, emits: info.emits }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_0_2_description_is_the_same_types_all_untimed() {
        let info = types::ModuleInfo {
            event_types: vec![types::EventType {
                tag: 3,
                name: "Deposited".into(),
                algebra: types::Algebra::Associative,
                max_batch: 7,
            }],
            emits: vec!["out".into()],
        };
        let info = module_info(info);
        let [t] = &info.event_types[..] else { panic!("one type") };
        assert_eq!((t.tag, t.name.as_str(), t.max_batch), (3, "Deposited", 7));
        assert!(matches!(t.algebra, current::types::Algebra::Associative));
        assert!(matches!(t.timing, current::types::Timing::Untimed));
        assert_eq!(info.emits, ["out"]);
    }
}
