//! The two store wrappers a rebuild needs, so the consumer needs no
//! rebuild-specific path of its own.
//!
//! - [`SwitchingStore`]: the running projection's store handle. Every clone
//!   of it (the projection's, the library's, the admin endpoint's) sees the
//!   same store, and [`SwitchingStore::switch`] puts another store behind
//!   all of them at once. The host switches only while its consumer is
//!   paused between two batches, so no batch sees two stores.
//! - [`HoldBackEmits`]: the shadow's store. Its commits keep the host's own
//!   retry and dead-letter records in the outbox (so the shadow's failures
//!   are routed like any projection's) but drop the messages its handlers
//!   emitted, counting them as [`Stat::HeldBack`]: a shadow never publishes.
//!
//! Both are [`ForwardingStore`](state::ForwardingStore)s: what they do not
//! change goes to the store behind them.

use std::ops::Deref;
use std::sync::{Arc, RwLock};

use crate::storage::state::{self, BatchCommit, StateBackend, StateError, StateStore};
use crate::storage::stats::Stat;

/// A store handle whose store can be replaced under every clone of it.
#[derive(Debug, Clone)]
pub struct SwitchingStore {
    current: Arc<RwLock<StateStore>>,
}

impl SwitchingStore {
    /// A handle on `store`.
    pub fn new(store: StateStore) -> Self {
        Self { current: Arc::new(RwLock::new(store)) }
    }

    /// The store behind the handle now.
    pub fn current(&self) -> StateStore {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `store` behind the handle; returns the one it replaces.
    pub fn switch(&self, store: StateStore) -> StateStore {
        std::mem::replace(&mut *self.current.write().unwrap_or_else(|e| e.into_inner()), store)
    }
}

impl state::ForwardingStore for SwitchingStore {
    type Inner = dyn StateBackend;

    fn inner(&self) -> impl Deref<Target = dyn StateBackend> + '_ {
        self.current()
    }

    fn location(&self) -> &str {
        // The location names the file for messages; a switch changes it, so
        // messages name the handle's role instead.
        "the running projection's store"
    }
}

/// A shadow's store: commits drop emitted messages (see the module docs).
#[derive(Debug)]
pub struct HoldBackEmits(pub StateStore);

impl state::ForwardingStore for HoldBackEmits {
    type Inner = dyn StateBackend;

    fn inner(&self) -> impl Deref<Target = dyn StateBackend> + '_ {
        &*self.0
    }

    fn location(&self) -> &str {
        self.0.location()
    }

    fn commit(&self, mut commit: BatchCommit) -> Result<(), StateError> {
        // Emitted messages carry their origin; the host's own routed
        // records carry none.
        let before = commit.outbox.len();
        commit.outbox.retain(|entry| entry.origin.is_none());
        let held = (before - commit.outbox.len()) as u64;
        commit.stat_deltas.add(Stat::HeldBack, held);
        self.0.commit(commit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;
    use crate::storage::log::Record;
    use crate::storage::state::OutboxEntry;
    use crate::storage::state::{EmitOrigin, KeyWrites};

    fn entry(topic: &str, emitted: bool) -> OutboxEntry {
        let origin = EmitOrigin { partition: 0, offset: 0, module: "bank".into(), version: "v".into(), topic: None };
        OutboxEntry {
            topic: topic.to_owned(),
            partition_key: 0,
            partition: Some(0),
            record: Record { headers: Vec::new(), body: b"x".to_vec() },
            origin: emitted.then_some(origin),
        }
    }

    #[test]
    fn a_shadow_commit_keeps_routed_records_and_holds_emitted_messages_back() {
        let dir = tempfile::tempdir().unwrap();
        let inner = StateStore::open(&dir.path().join("shadow.redb")).unwrap();
        let shadow = StateStore::from_backend(HoldBackEmits(inner.clone()));
        let mut writes = KeyWrites::default();
        writes.set("account", b"1".to_vec());
        let commit = BatchCommit {
            writes: vec![(Key::int(1), writes)],
            positions: vec![("accounts".into(), 0, 3)],
            outbox: vec![entry("notifications", true), entry("retry_accounts", false), entry("audit", true)],
            ..BatchCommit::default()
        };
        shadow.commit(commit).unwrap();
        let outbox: Vec<String> = inner.outbox().unwrap().into_iter().map(|(_, e)| e.topic).collect();
        assert_eq!(outbox, ["retry_accounts"]);
        assert_eq!(inner.stats().unwrap()[Stat::HeldBack], 2);
        assert_eq!(inner.position("accounts", 0).unwrap(), Some(3));
        assert_eq!(inner.get(&Key::int(1), "account").unwrap(), Some(b"1".to_vec()));
    }

    #[test]
    fn a_switch_is_seen_by_every_clone_of_the_handle() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (dir.path().join("old.redb"), dir.path().join("new.redb"));
        let (old, new) = (StateStore::open(&old).unwrap(), StateStore::open(&new).unwrap());
        let commit = |store: &StateStore, at: u64| {
            let commit = BatchCommit { positions: vec![("accounts".into(), 0, at)], ..BatchCommit::default() };
            store.commit(commit).unwrap();
        };
        commit(&old, 5);
        commit(&new, 9);
        let switching = SwitchingStore::new(old);
        let handle = StateStore::from_backend(switching.clone());
        let clone = handle.clone();
        assert_eq!(clone.position("accounts", 0).unwrap(), Some(5));
        let replaced = switching.switch(new);
        assert_eq!(replaced.position("accounts", 0).unwrap(), Some(5));
        assert_eq!(clone.position("accounts", 0).unwrap(), Some(9));
        commit(&handle, 10);
        assert_eq!(switching.current().position("accounts", 0).unwrap(), Some(10));
        assert_eq!(replaced.position("accounts", 0).unwrap(), Some(5), "the old store is left as it was");
    }
}
