//! The `timers` capability: per-key event-time timers of the key being
//! handled (`docs/timers.md`), kept with its state and committed with the
//! batch.
//!
//! Rules (each broken rule is a `refusal` returned to the call, naming it;
//! the values are checked by the call's [`KeyScope`] against
//! [`wakuwaku_core::limits`]):
//! - `outside-handle`: only during `handle` and `fire`.
//! - `timer-name`: a name is 1 to 128 bytes and holds no NUL.
//! - `timer-payload-size`: a payload is at most
//!   [`PayloadLimits::max_timer_payload`](crate::sandbox::handler::PayloadLimits::max_timer_payload).
//! - `timer-time`: `at` is below the largest s64, which no clock passes.
//! - `timer-at-firing`: during `fire`, a timer is set only later than the
//!   timers being fired.
//! - `state-writes-per-call`, `state-bytes-per-call`: each `set` and
//!   `cancel` counts as a state write of its name and payload.
//! - `timers-per-key`, `timers-in-all`: a set that would make a new timer
//!   is refused while the key holds
//!   [`PayloadLimits::max_timers_per_key`](crate::sandbox::handler::PayloadLimits::max_timers_per_key)
//!   timers, or the projection
//!   [`PayloadLimits::max_timers`](crate::sandbox::handler::PayloadLimits::max_timers);
//!   moving or cancelling one never is.
//!
//! A read of the key's timers that fails in the host's state store is not
//! refused: the import traps with a host fault, as `state`'s reads do.

use wasmtime::component::{HasSelf, Linker};

use super::StoreData;
use super::bindings::wakuwaku::handler::{timers, types};

/// Links the `timers` interface.
pub(super) fn link(linker: &mut Linker<StoreData>) -> wasmtime::Result<()> {
    timers::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |data| data)
}

/// What the guest sees (a value, or a refusal as text), or a trap when
/// the host failed.
type Answer<T> = wasmtime::Result<Result<T, String>>;

impl timers::Host for StoreData {
    fn set(&mut self, name: String, at: i64, payload: Vec<u8>) -> Answer<()> {
        self.with_scope("timers", |scope| scope.timer_set(&name, at, payload))
    }

    fn cancel(&mut self, name: String) -> Answer<()> {
        self.with_scope("timers", |scope| scope.timer_cancel(&name))
    }

    fn get(&mut self, name: String) -> Answer<Option<types::Timer>> {
        self.with_scope("timers", |scope| {
            Ok(scope.timer_get(&name)?.map(|t| types::Timer { name: t.name, at: t.at, payload: t.payload }))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use timers::Host;

    use super::*;
    use crate::key::Key;
    use crate::sandbox::handler::{BatchBudget, KeyScope, PayloadLimits};
    use crate::sandbox::runtime::log::LogUnit;
    use crate::sandbox::runtime::wasi::WasiState;
    use crate::storage::state::StateStore;

    fn store_data(scope: Option<KeyScope>) -> StoreData {
        StoreData {
            wasi: WasiState::new(),
            limits: Default::default(),
            scope,
            emits: Arc::from([]),
            log: LogUnit::new("test", PayloadLimits::default()),
        }
    }

    fn refusal<T: std::fmt::Debug>(answer: Answer<T>) -> String {
        answer.expect("no host fault").expect_err("refused")
    }

    #[test]
    fn timers_are_refused_outside_a_call_and_staged_in_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        let mut outside = store_data(None);
        let refused = refusal(outside.set("close".into(), 5, vec![]));
        assert_eq!(refused, "outside-handle: `timers` is only available while `handle` or `fire` runs");

        let limits = PayloadLimits { max_timer_payload: 2, ..PayloadLimits::default() };
        let scope = KeyScope::new(Key::int(1), Arc::new(store.reader().unwrap()), limits, BatchBudget::new(&limits));
        let mut data = store_data(Some(scope));
        data.set("close".into(), 5, vec![1, 2]).unwrap().unwrap();
        assert!(refusal(data.set("close".into(), 5, vec![1, 2, 3])).starts_with("timer-payload-size:"));
        assert!(refusal(data.set("".into(), 5, vec![])).starts_with("timer-name:"));
        assert!(refusal(data.set("never".into(), i64::MAX, vec![])).starts_with("timer-time:"));
        let got = data.get("close".into()).unwrap().unwrap().expect("set");
        assert_eq!((got.name.as_str(), got.at, got.payload), ("close", 5, vec![1, 2]));
        data.cancel("gone".into()).unwrap().unwrap();
        data.set("other".into(), 9, vec![]).unwrap().unwrap();
        data.cancel("other".into()).unwrap().unwrap();
        let mut scope = data.scope.take().unwrap();
        scope.finish_call(Ok(())).unwrap();
        let timers = scope.into_outcome().timers.expect("changed");
        assert_eq!(timers.in_order().iter().map(|t| (t.name.as_str(), t.at)).collect::<Vec<_>>(), [("close", 5)]);
    }
}
