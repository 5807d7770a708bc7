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

older_contract!("0.2");

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
