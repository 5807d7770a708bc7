//! [`ForwardingStore`]: a store that wraps another and changes part of what
//! it does, every other call going to the store it wraps (the forwarding
//! is written once, in `storage/forwarding.rs`).
//!
//! Rules kept here:
//! - `state_backend_methods!` lists every method of [`StateBackend`] but
//!   [`location`](StateBackend::location) once: a new method of the trait
//!   is one line there, and every forwarding store forwards it. A test
//!   reads both and fails on a method the list misses.
//! - [`location`](StateBackend::location) is the one method each
//!   forwarding store writes: it lends its answer for as long as the
//!   wrapper lives, and the store behind a wrapper is held for one call
//!   only (it may be replaced: the rebuild's `SwitchingStore` switches it).
//! - A forwarding store forwards the methods [`StateBackend`] gives a
//!   default too.

use std::ops::Deref;

use super::{BatchCommit, Member, OutboxEntry, StateBackend, StateError, StateReader, TimerSummary};
use crate::key::Key;
use crate::storage::forwarding::forward_methods;
use crate::storage::stats::Stats;
use wakuwaku_core::timers::Millis;

/// Every method of [`StateBackend`] but `location`, handed to
/// `forward_methods!` after `how`.
macro_rules! state_backend_methods {
    ($($how:tt)+) => {
        forward_methods! { $($how)+;
            fn claim(partition: u32) -> Result<u64, StateError>;
            fn claim_released(partition: u32) -> Result<Option<u64>, StateError>;
            fn reader() -> Result<StateReader, StateError>;
            fn batch_reader(partition: u32, keys: &[Key]) -> Result<StateReader, StateError>;
            fn release(partition: u32);
            fn members() -> Result<Vec<Member>, StateError>;
            fn commit(commit: BatchCommit) -> Result<(), StateError>;
            fn keys() -> Result<Vec<Key>, StateError>;
            fn entries(key: &Key) -> Result<Vec<(String, Vec<u8>)>, StateError>;
            fn get(key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError>;
            fn counters() -> Result<Vec<(String, i128)>, StateError>;
            fn counters_page(after: Option<&str>, limit: usize) -> Result<Vec<(String, i128)>, StateError>;
            fn entries_page(key: &Key, after: Option<&str>, limit: usize, max_bytes: usize) -> Result<Vec<(String, Vec<u8>)>, StateError>;
            fn stats() -> Result<Stats, StateError>;
            fn position(topic: &str, partition: u32) -> Result<Option<u64>, StateError>;
            fn done(topic: &str, partition: u32) -> Result<Vec<u64>, StateError>;
            fn outbox() -> Result<Vec<(u64, OutboxEntry)>, StateError>;
            fn outbox_of(partition: u32) -> Result<Vec<(u64, OutboxEntry)>, StateError>;
            fn remove_outbox(partition: u32, through_seq: u64) -> Result<(), StateError>;
            fn meta(name: &str) -> Result<Option<Vec<u8>>, StateError>;
            fn set_meta(name: &str, value: &[u8]) -> Result<(), StateError>;
            fn hold_for_run() -> Result<(), StateError>;
            fn lock_for_reset() -> Result<(), StateError>;
            fn positions() -> Result<Vec<(String, u32, u64)>, StateError>;
            fn done_marks() -> Result<Vec<(String, u32, u64)>, StateError>;
            fn meta_entries() -> Result<Vec<(String, Vec<u8>)>, StateError>;
            fn start_over(positions: Vec<(String, u32, u64)>) -> Result<(), StateError>;
            fn due_timers(partition: u32, before: Millis, limit: usize) -> Result<Vec<(Key, Millis)>, StateError>;
            fn timer_summary(partition: Option<u32>) -> Result<TimerSummary, StateError>;
            fn timer_count() -> Result<u64, StateError>;
        }
    };
}

/// A store that wraps another: every [`StateBackend`] method it does not
/// define goes to [`ForwardingStore::inner`], but
/// [`location`](ForwardingStore::location), which it always defines. It is
/// a [`StateBackend`] itself.
///
/// Define a method in the implementation of this trait, under its
/// [`StateBackend`] name, to change it. Name this trait by its path there
/// (`impl state::ForwardingStore for …`) rather than importing it: with
/// both traits in scope, a call such as `wrapper.commit(…)` is ambiguous
/// (inside that implementation it is: call `StateBackend::commit(self, …)`
/// there).
pub trait ForwardingStore: Send + Sync + std::fmt::Debug {
    /// The store wrapped (`dyn StateBackend` for a [`super::StateStore`]).
    type Inner: StateBackend + ?Sized;

    /// The store each call goes to, held for the call: a reference, or a
    /// handle on a store that may be replaced between calls.
    fn inner(&self) -> impl Deref<Target = Self::Inner> + '_;

    /// [`StateBackend::location`]: not forwarded (see the module docs).
    fn location(&self) -> &str;

    state_backend_methods!(to_inner StateBackend);
}

impl<W: ForwardingStore> StateBackend for W {
    fn location(&self) -> &str {
        <Self as ForwardingStore>::location(self)
    }

    state_backend_methods!(to_forwarding ForwardingStore);
}

#[cfg(test)]
mod tests {
    use std::ops::Deref;

    // Not `super::*`: with `ForwardingStore` in scope, calls on a wrapper
    // would be ambiguous (see its docs).
    use crate::storage::log::Record;
    use crate::storage::state::{BatchCommit, OutboxEntry, StateBackend, StateStore};

    /// Changes nothing but its location.
    #[derive(Debug)]
    struct Renamed(StateStore);

    impl super::ForwardingStore for Renamed {
        type Inner = dyn StateBackend;

        fn inner(&self) -> impl Deref<Target = dyn StateBackend> + '_ {
            &*self.0
        }

        fn location(&self) -> &str {
            "renamed"
        }
    }

    fn entry(partition: u32) -> OutboxEntry {
        let record = Record { headers: Vec::new(), body: b"x".to_vec() };
        OutboxEntry { topic: "out".into(), partition_key: 0, partition: Some(partition), record, origin: None }
    }

    #[test]
    fn a_forwarding_store_forwards_every_call_but_its_location() {
        let dir = tempfile::tempdir().unwrap();
        let inner = StateStore::open(&dir.path().join("state.redb")).unwrap();
        let wrapper = StateStore::from_backend(Renamed(inner.clone()));
        assert_eq!(wrapper.location(), "renamed");
        assert_ne!(inner.location(), "renamed");
        let commit = BatchCommit {
            positions: vec![("t".into(), 0, 4)],
            outbox: vec![entry(0), entry(1)],
            ..BatchCommit::default()
        };
        wrapper.commit(commit).unwrap();
        assert_eq!(inner.position("t", 0).unwrap(), Some(4));
        assert_eq!(wrapper.position("t", 0).unwrap(), Some(4));
        // Methods with a default in the trait are forwarded too.
        let (seq, _) = wrapper.outbox_of(1).unwrap().pop().unwrap();
        wrapper.remove_outbox(1, seq).unwrap();
        assert_eq!(inner.outbox().unwrap().len(), 1);
        assert!(wrapper.claim_released(0).unwrap().is_some());
    }

    /// A method missing from the list would not be forwarded: a wrapper
    /// would answer the trait's default, or fail to build.
    #[test]
    fn the_list_names_every_method_of_the_trait_but_its_location() {
        use crate::storage::log::forwarding::tests::declared;
        let mut trait_methods = declared(include_str!("mod.rs"), "pub trait StateBackend", "\n}\n", "    ");
        let listed =
            declared(include_str!("forwarding.rs"), "macro_rules! state_backend_methods", "\n    };", "            ");
        assert_eq!(trait_methods.len(), 31);
        trait_methods.retain(|name| name != "location");
        assert_eq!(listed, trait_methods);
    }
}
