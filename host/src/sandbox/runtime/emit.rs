//! The `emit` capability: messages to other topics, sent when the batch
//! commits.
//!
//! Emitting is a declared capability: a module lists the topics it may
//! emit to in `module-info.emits` (checked when it is loaded: valid names,
//! none of the host's own `retry_*`/`dlq_*` topics; the lifecycle checks
//! they exist in the log; the projection refuses a module that declares
//! the topic it consumes, `emit-loop`). At each call (each broken rule is a `refusal`
//! returned to the call, naming it; checked by the call's
//! [`KeyScope`](crate::sandbox::handler::KeyScope) against [`wakuwaku_core::limits`]):
//! - `outside-handle`: only during `handle` and `fire`.
//! - `emit-topic`: the topic is one the module declared.
//! - `emit-body-size`: the body is 1 byte to
//!   [`PayloadLimits::max_emit_body`](crate::sandbox::handler::PayloadLimits::max_emit_body).
//! - `emit-key`: the key is canonical.
//! - `emits-per-call`, `emit-bytes-per-call`: one call emits at most so
//!   many messages and bytes.
//!
//! So nothing a module emits can block the outbox: every queued message
//! goes to an existing topic the module may write, with a body the log
//! takes.

use wasmtime::component::{HasSelf, Linker};

use super::bindings::wakuwaku::handler::{emit, types};
use super::{StoreData, algebra_from_wit, ordering_from_wit};
use crate::event::EventTypeTag;
use crate::sandbox::handler::{Emitted, Refusal};

/// Links the `emit` interface.
pub(super) fn link(linker: &mut Linker<StoreData>) -> wasmtime::Result<()> {
    emit::add_to_linker::<StoreData, HasSelf<StoreData>>(linker, |data| data)
}

impl emit::Host for StoreData {
    fn emit(&mut self, message: types::Outgoing) -> Result<(), String> {
        let Some(scope) = self.scope.as_mut() else {
            return Err(Refusal::OutsideHandle { interface: "emit" }.to_string());
        };
        let emitted = Emitted {
            topic: message.topic,
            tag: EventTypeTag::new(message.tag),
            key: message.key,
            ordering: ordering_from_wit(message.ordering),
            algebra: algebra_from_wit(message.algebra),
            body: message.body,
        };
        scope.emit(&self.emits, emitted).map_err(|refusal| refusal.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use emit::Host;

    use super::*;
    use crate::event::EventHeaders;
    use crate::key::Key;
    use crate::sandbox::handler::{BatchBudget, KeyScope, PayloadLimits};
    use crate::sandbox::runtime::log::LogUnit;
    use crate::sandbox::runtime::wasi::WasiState;
    use crate::storage::state::StateStore;

    fn outgoing(topic: &str, key: Vec<u8>, body: &[u8]) -> types::Outgoing {
        types::Outgoing {
            topic: topic.into(),
            tag: 9,
            key,
            ordering: types::Ordering::Release,
            algebra: types::Algebra::Idempotent,
            body: body.to_vec(),
        }
    }

    #[test]
    fn only_declared_topics_canonical_keys_and_bounded_bodies_during_handle() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
        let limits = PayloadLimits { max_emit_body: 4, max_emits_per_call: 1, ..PayloadLimits::default() };
        let scope = KeyScope::new(Key::int(1), Arc::new(store.reader().unwrap()), limits, BatchBudget::new(&limits));
        let mut data = StoreData {
            wasi: WasiState::new(),
            limits: Default::default(),
            scope: None,
            emits: Arc::from(["out".to_owned()]),
            log: LogUnit::new("test", limits),
        };
        let key = Key::parse_text(r#""ann""#).unwrap();
        let refused = |data: &mut StoreData, message| data.emit(message).unwrap_err();
        assert!(refused(&mut data, outgoing("out", key.as_bytes().to_vec(), b"x")).starts_with("outside-handle:"));
        data.scope = Some(scope);
        for (message, rule) in [
            (outgoing("dlq_out", key.as_bytes().to_vec(), b"x"), "emit-topic:"),
            (outgoing("retry_out", key.as_bytes().to_vec(), b"x"), "emit-topic:"),
            (outgoing("out", key.as_bytes().to_vec(), b""), "emit-body-size:"),
            (outgoing("out", key.as_bytes().to_vec(), b"12345"), "emit-body-size:"),
            (outgoing("out", vec![0x02, 0x01, 0xff], b"x"), "emit-key:"),
            (outgoing("out", Vec::new(), b"x"), "emit-key:"),
        ] {
            assert!(refused(&mut data, message).starts_with(rule), "{rule}");
        }
        data.emit(outgoing("out", key.as_bytes().to_vec(), b"1234")).unwrap();
        assert!(refused(&mut data, outgoing("out", key.as_bytes().to_vec(), b"1")).starts_with("emits-per-call:"));
        let mut scope = data.scope.take().unwrap();
        scope.finish_call(Ok(())).unwrap();
        let outbox = scope.into_outcome().outbox;
        assert_eq!(outbox.len(), 1);
        let headers = EventHeaders::parse_stored(&outbox[0].record.headers).unwrap();
        assert_eq!(headers.key, key);
        assert_eq!((headers.tag.get(), headers.ordering.to_string()), (9, "release".to_owned()));
        assert_eq!(outbox[0].record.body, b"1234");
    }
}
