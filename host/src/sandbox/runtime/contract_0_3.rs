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

older_contract!("0.3");

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
