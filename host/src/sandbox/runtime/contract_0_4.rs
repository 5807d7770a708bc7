//! Modules built for the contract before timers, `wakuwaku:handler@0.4.0`
//! (`wit/handler-0.4.wit`, kept as it was): loaded and run unchanged, so
//! that a host upgrade never stops a pinned module version from running.
//!
//! Rules kept here:
//! - **The version is read from the component, at load**, as for 0.2 and
//!   0.3: a component whose contract imports and `handler` export are all
//!   at 0.4.0 is bound with this file's bindings.
//! - **Same imports, same rules.** The 0.4 `state`, `emit` and `log`
//!   interfaces have the functions and types of the current ones, so each
//!   is served by the current capability: the values are converted and
//!   handed on, and every rule is the one the current capability keeps.
//!   It has no `timers` import, so it never sets a timer, and the host
//!   never calls `fire` on it.
//! - **Its timings mean what they meant**: `untimed`, `timed` and
//!   `timed-relaxed`, one for one.

use wasmtime::component::{HasSelf, Linker};

use super::StoreData;
use super::bindings::wakuwaku::handler as current;

pub(super) mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/handler-0.4.wit",
        world: "module",
        imports: { "wakuwaku:handler/state": trappable },
    });
}

use bindings::wakuwaku::handler::{emit, log, state, types};

older_contract!("0.4");

/// A 0.4 description as the current contract's: the same timings.
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
                types::Timing::TimedRelaxed => current::types::Timing::TimedRelaxed,
            },
        })
        .collect();
    current::types::ModuleInfo { event_types, emits: info.emits }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_0_4_description_is_the_same_types_with_the_same_timings() {
        let event_type = |tag, timing| types::EventType {
            tag,
            name: "Bid".into(),
            algebra: types::Algebra::Commutative,
            max_batch: 3,
            timing,
        };
        let info = types::ModuleInfo {
            event_types: vec![
                event_type(1, types::Timing::Timed),
                event_type(2, types::Timing::TimedRelaxed),
                event_type(3, types::Timing::Untimed),
            ],
            emits: vec!["out".into()],
        };
        let info = module_info(info);
        let [timed, relaxed, untimed] = &info.event_types[..] else { panic!("three types") };
        assert_eq!((timed.tag, timed.name.as_str(), timed.max_batch), (1, "Bid", 3));
        assert!(matches!(timed.algebra, current::types::Algebra::Commutative));
        assert!(matches!(timed.timing, current::types::Timing::Timed));
        assert!(matches!(relaxed.timing, current::types::Timing::TimedRelaxed));
        assert!(matches!(untimed.timing, current::types::Timing::Untimed));
        assert_eq!(info.emits, ["out"]);
    }
}
