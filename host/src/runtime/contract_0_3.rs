//! Modules built for the contract before `timed-relaxed`,
//! `wakuwaku:handler@0.3.0` (`wit/handler-0.3.wit`, kept as it was): loaded
//! and run unchanged, so that a host upgrade never stops a pinned module
//! version from running.
//!
//! Rules kept here:
//! - **The version is read from the component, at load**, as for 0.2
//!   ([`super::contract_0_2`]): a component whose contract imports and
//!   `handler` export are all at 0.3.0 is bound with this file's bindings.
//! - **Same imports, same rules.** The 0.3 `state`, `emit` and `log`
//!   interfaces have the functions and types of the current ones, so each
//!   is served by the current capability: the values are converted and
//!   handed on, and every rule is the one the current capability keeps.
//! - **Its timings mean what they meant.** 0.3 has `untimed` and `timed`
//!   and no `timed-relaxed`: its `timed` types are
//!   [`crate::event::EventTiming::Timed`], so a key's events of its timed
//!   types reach `handle` in event-time order (`event-time-order`), and its
//!   `event-time` export is asked as the current one is.

use wasmtime::component::{HasSelf, Linker};

use super::StoreData;
use super::bindings::wakuwaku::handler as current;

pub(super) mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/handler-0.3.wit",
        world: "module",
        imports: { "wakuwaku:handler/state": trappable },
    });
}

use bindings::wakuwaku::handler::{emit, log, state, types};

/// Links the 0.3 `types`, `state`, `emit` and `log` interfaces.
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

/// A 0.3 ordering as the current contract's.
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

/// A 0.3 handler error as the current contract's.
pub(super) fn error(error: types::HandlerError) -> current::types::HandlerError {
    let class = match error.class {
        types::ErrorClass::Transient => current::types::ErrorClass::Transient,
        types::ErrorClass::Retryable => current::types::ErrorClass::Retryable,
        types::ErrorClass::Unrecoverable => current::types::ErrorClass::Unrecoverable,
    };
    current::types::HandlerError { class, message: error.message }
}

/// A 0.3 answer with its error as the current contract's.
pub(super) fn answer<T>(
    answer: wasmtime::Result<Result<T, types::HandlerError>>,
) -> wasmtime::Result<Result<T, current::types::HandlerError>> {
    answer.map(|result| result.map_err(error))
}

/// A 0.3 description as the current contract's: the same timings.
pub(super) fn module_info(info: types::ModuleInfo) -> current::types::ModuleInfo {
    let event_types = info
        .event_types
        .into_iter()
        .map(|t| current::types::EventType {
            tag: t.tag,
            name: t.name,
            algebra: algebra(t.algebra),
            max_batch: t.max_batch,
            timing: match t.timing {
                types::Timing::Untimed => current::types::Timing::Untimed,
                types::Timing::Timed => current::types::Timing::Timed,
            },
        })
        .collect();
    current::types::ModuleInfo { event_types, emits: info.emits }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_0_3_description_is_the_same_types_with_the_same_timings() {
        let event_type = |tag, timing| types::EventType {
            tag,
            name: "Shipped".into(),
            algebra: types::Algebra::Associative,
            max_batch: 7,
            timing,
        };
        let info = types::ModuleInfo {
            event_types: vec![event_type(3, types::Timing::Timed), event_type(4, types::Timing::Untimed)],
            emits: vec!["out".into()],
        };
        let info = module_info(info);
        let [timed, untimed] = &info.event_types[..] else { panic!("two types") };
        assert_eq!((timed.tag, timed.name.as_str(), timed.max_batch), (3, "Shipped", 7));
        assert!(matches!(timed.algebra, current::types::Algebra::Associative));
        assert!(matches!(timed.timing, current::types::Timing::Timed));
        assert!(matches!(untimed.timing, current::types::Timing::Untimed));
        assert_eq!(info.emits, ["out"]);
    }
}
