//! A guest-SDK module run natively inside the host: the same handler code
//! as the component, called through the host's [`HandlerModule`] interface
//! with the host's own key scope as its state, minus the sandbox.
//!
//! The benchmark uses it to measure what WebAssembly costs on top of the
//! same projection.

use std::marker::PhantomData;

use wakuwaku::event::{EventAtomicOrdering, EventHeaders, EventTypeTag, KeyHash};
use wakuwaku::handler::{
    CallError, Emitted, ErrorClass, EventType, HandlerInstance, HandlerModule, KeyScope, LogLevel,
};
use wakuwaku_guest as guest;

/// A native module built from `M`'s `Module` implementation.
pub struct NativeModule<M> {
    name: String,
    event_types: Vec<EventType>,
    module: PhantomData<fn() -> M>,
}

impl<M: guest::Module + 'static> NativeModule<M> {
    /// A native module named `name`.
    pub fn new(name: &str) -> Self {
        let event_types = M::describe()
            .into_iter()
            .map(|info| EventType {
                tag: EventTypeTag::new(info.tag),
                name: info.name.to_owned(),
                algebra: info.algebra,
                max_batch: info.max_batch,
            })
            .collect();
        Self { name: name.to_owned(), event_types, module: PhantomData }
    }
}

impl<M: guest::Module + 'static> HandlerModule for NativeModule<M> {
    fn name(&self) -> &str {
        &self.name
    }

    fn version(&self) -> &str {
        "native"
    }

    fn event_types(&self) -> &[EventType] {
        &self.event_types
    }

    fn instantiate(&self) -> Result<Box<dyn HandlerInstance>, CallError> {
        Ok(Box::new(NativeInstance::<M> { name: self.name.clone(), module: PhantomData }))
    }
}

struct NativeInstance<M> {
    name: String,
    module: PhantomData<fn() -> M>,
}

impl<M: guest::Module> HandlerInstance for NativeInstance<M> {
    fn handle(&mut self, scope: &mut KeyScope, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<(), CallError> {
        let key = scope.key();
        let mut host = ScopeHost { scope: &mut *scope, module: &self.name };
        let result = M::handle(&mut host, tag.get(), key, bodies).map_err(call_error);
        scope.finish_call(result)
    }

    fn combine(&mut self, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<Vec<u8>, CallError> {
        M::combine(tag.get(), bodies).map_err(call_error)
    }

    fn key(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<KeyHash, CallError> {
        M::key(tag.get(), body).map_err(call_error)
    }

    fn ordering(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<EventAtomicOrdering, CallError> {
        M::ordering(tag.get(), body).map_err(call_error)
    }
}

/// The guest SDK's host interface over the host's key scope.
struct ScopeHost<'a> {
    scope: &'a mut KeyScope,
    module: &'a str,
}

impl guest::HostApi for ScopeHost<'_> {
    fn get(&mut self, name: &str) -> Option<Vec<u8>> {
        self.scope.get(name)
    }

    fn set(&mut self, name: &str, value: &[u8]) -> Result<(), String> {
        self.scope.set(name, value.to_vec())
    }

    fn delete(&mut self, name: &str) {
        self.scope.delete(name);
    }

    fn counter_add(&mut self, name: &str, delta: i64) {
        self.scope.counter_add(name, delta);
    }

    fn counter_get(&mut self, name: &str) -> i64 {
        self.scope.counter_get(name)
    }

    fn emit(&mut self, message: guest::Outgoing) -> Result<(), String> {
        self.scope.emit(Emitted {
            topic: message.topic,
            headers: EventHeaders {
                tag: EventTypeTag::new(message.tag),
                key_hash: message.key_hash,
                ordering: message.ordering,
                algebra: message.algebra,
            },
            body: message.body,
        })
    }

    fn log(&mut self, level: guest::Level, message: &str) {
        let level = match level {
            guest::Level::Trace => LogLevel::Trace,
            guest::Level::Debug => LogLevel::Debug,
            guest::Level::Info => LogLevel::Info,
            guest::Level::Warn => LogLevel::Warn,
            guest::Level::Error => LogLevel::Error,
        };
        self.scope.log(self.module, level, message);
    }
}

fn call_error(error: guest::HandlerError) -> CallError {
    let class = match error.class {
        guest::ErrorClass::Transient => ErrorClass::Transient,
        guest::ErrorClass::Retryable => ErrorClass::Retryable,
        guest::ErrorClass::Unrecoverable => ErrorClass::Unrecoverable,
    };
    CallError::Handler { class, message: error.message }
}
