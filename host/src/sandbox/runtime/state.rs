//! The `state` capability: the entries of the key being handled, and the
//! counters shared by every key of the projection.
//!
//! Rules (each broken rule is a `refusal` returned to the call, naming it;
//! the values are checked by the call's [`KeyScope`] against
//! [`wakuwaku_core::limits`]):
//! - `outside-handle`: only during `handle` and `fire`; in any other call
//!   every state call is refused.
//! - `name-length`: an entry or counter name is 1 to 256 bytes.
//! - `name-nul`: a name holds no NUL character (PostgreSQL `text` cannot).
//! - `state-value-size`: a value is at most
//!   [`PayloadLimits::max_state_value`](crate::sandbox::handler::PayloadLimits::max_state_value).
//! - `state-writes-per-call`, `state-bytes-per-call`: one call writes at most
//!   so many entries and bytes of names and values.
//! - `counter-changes-per-call`: one call changes counters at most so many
//!   times.
//! - `counter-range`: a counter stays within the s64 range as the key sees
//!   it (committed value plus its own changes).
//! - `counter-count`: a change that would make a new counter is refused
//!   while the projection holds
//!   [`PayloadLimits::max_counters`](crate::sandbox::handler::PayloadLimits::max_counters)
//!   counters (committed, plus those the batches in flight add); existing
//!   counters always change.
//! - `entries-per-key`: a set that would make a new entry is refused while
//!   the key holds
//!   [`PayloadLimits::max_entries_per_key`](crate::sandbox::handler::PayloadLimits::max_entries_per_key)
//!   entries (committed, plus its writes in the batch); overwrites and
//!   deletes always pass.
//!
//! A read that fails in the host's state store is not refused: the import
//! traps with a host fault, and the call fails as
//! [`CallError::HostFault`](crate::sandbox::handler::CallError::HostFault).

use wasmtime::component::{HasSelf, Linker};

use super::bindings::wakuwaku::handler::state;
use super::{HostFault, StoreData};
use crate::sandbox::handler::{KeyScope, Refusal, ScopeError};

/// Links the `state` interface.
pub(super) fn link(linker: &mut Linker<StoreData>) -> wasmtime::Result<()> {
    state::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |data| data)
}

/// What the guest sees (a value, or a refusal as text), or a trap when
/// the host failed.
type Answer<T> = wasmtime::Result<Result<T, String>>;

impl StoreData {
    /// Runs `f` on the scope of the `handle` or `fire` call, or refuses
    /// (`outside-handle`, naming `interface`).
    pub(super) fn with_scope<T>(
        &mut self,
        interface: &'static str,
        f: impl FnOnce(&mut KeyScope) -> Result<T, ScopeError>,
    ) -> Answer<T> {
        let result = match self.scope.as_mut() {
            Some(scope) => f(scope),
            None => Err(Refusal::OutsideHandle { interface }.into()),
        };
        match result {
            Ok(value) => Ok(Ok(value)),
            Err(ScopeError::Refused(refusal)) => Ok(Err(refusal.to_string())),
            Err(ScopeError::HostFault(fault)) => Err(HostFault(fault).into()),
        }
    }
}

impl state::Host for StoreData {
    fn get(&mut self, name: String) -> Answer<Option<Vec<u8>>> {
        self.with_scope("state", |scope| scope.get(&name))
    }

    fn set(&mut self, name: String, value: Vec<u8>) -> Answer<()> {
        self.with_scope("state", |scope| scope.set(&name, value))
    }

    fn delete(&mut self, name: String) -> Answer<()> {
        self.with_scope("state", |scope| Ok(scope.delete(&name)?))
    }

    fn counter_add(&mut self, name: String, delta: i64) -> Answer<()> {
        self.with_scope("state", |scope| scope.counter_add(&name, delta))
    }

    fn counter_get(&mut self, name: String) -> Answer<i64> {
        self.with_scope("state", |scope| scope.counter_get(&name))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use state::Host;

    use super::*;
    use crate::key::Key;
    use crate::sandbox::handler::{BatchBudget, PayloadLimits};
    use crate::sandbox::runtime::log::LogUnit;
    use crate::sandbox::runtime::wasi::WasiState;
    use crate::storage::state::{BatchCommit, StateStore};

    fn store_data(scope: Option<KeyScope>) -> StoreData {
        StoreData {
            wasi: WasiState::new(),
            limits: Default::default(),
            scope,
            emits: Arc::from([]),
            log: LogUnit::new("test", PayloadLimits::default()),
        }
    }

    fn scope(store: &StateStore, limits: PayloadLimits) -> KeyScope {
        KeyScope::new(Key::int(1), Arc::new(store.reader().unwrap()), limits, BatchBudget::new(&limits))
    }

    fn refusal<T: std::fmt::Debug>(answer: Answer<T>) -> String {
        answer.expect("not a trap").expect_err("a refusal")
    }

    #[test]
    fn outside_handle_every_call_is_refused() {
        let mut data = store_data(None);
        for answer in [
            data.get("a".into()).map(|a| a.map(drop)),
            data.set("a".into(), vec![1]),
            data.delete("a".into()),
            data.counter_add("a".into(), 1),
            data.counter_get("a".into()).map(|a| a.map(drop)),
        ] {
            assert_eq!(refusal(answer), "outside-handle: `state` is only available while `handle` or `fire` runs");
        }
    }

    #[test]
    fn refusals_name_their_rule_and_accepted_calls_land_in_the_scope() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        store
            .commit(BatchCommit {
                counter_deltas: [("c".to_owned(), i128::from(i64::MAX))].into_iter().collect(),
                ..BatchCommit::default()
            })
            .unwrap();
        let limits = PayloadLimits { max_state_value: 3, max_counter_changes_per_call: 1, ..PayloadLimits::default() };
        let mut data = store_data(Some(scope(&store, limits)));
        assert!(refusal(data.set("a".into(), vec![0; 4])).starts_with("state-value-size:"));
        assert!(refusal(data.get(String::new())).starts_with("name-length:"));
        assert!(refusal(data.counter_add("c".into(), 1)).starts_with("counter-range:"));
        data.counter_add("c".into(), -1).unwrap().unwrap();
        assert!(refusal(data.counter_add("d".into(), 1)).starts_with("counter-changes-per-call:"));
        data.set("a".into(), vec![7]).unwrap().unwrap();
        assert_eq!(data.get("a".into()).unwrap(), Ok(Some(vec![7])));
        data.delete("a".into()).unwrap().unwrap();
        assert_eq!(data.get("a".into()).unwrap(), Ok(None));
        assert_eq!(data.counter_get("c".into()).unwrap(), Ok(i64::MAX - 1));
    }

    #[test]
    fn new_counters_and_entries_past_their_quota_are_refused_naming_the_rule() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        store
            .commit(BatchCommit {
                counter_deltas: [("c".to_owned(), 1)].into_iter().collect(),
                ..BatchCommit::default()
            })
            .unwrap();
        let limits = PayloadLimits { max_counters: 1, max_entries_per_key: 1, ..PayloadLimits::default() };
        let mut data = store_data(Some(scope(&store, limits)));
        assert!(refusal(data.counter_add("d".into(), 1)).starts_with("counter-count:"));
        data.counter_add("c".into(), 1).unwrap().unwrap();
        data.set("a".into(), vec![1]).unwrap().unwrap();
        assert!(refusal(data.set("b".into(), vec![1])).starts_with("entries-per-key:"));
        data.set("a".into(), vec![2]).unwrap().unwrap();
    }

    #[test]
    fn a_host_fault_traps_instead_of_answering() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        let mut data = store_data(Some(scope(&store, PayloadLimits::default())));
        let answer: Answer<()> = data.with_scope("state", |_| Err(ScopeError::HostFault("disk gone".into())));
        let trap = answer.expect_err("a host fault is a trap, not an answer");
        assert_eq!(trap.downcast_ref::<HostFault>().map(|fault| fault.0.as_str()), Some("disk gone"));
    }
}
