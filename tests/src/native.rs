//! A guest-SDK module run natively inside the host: the same handler code
//! as the component, called through the host's [`HandlerModule`] interface
//! with the host's own key scope as its state, minus the sandbox.
//!
//! The benchmark uses it to measure what WebAssembly costs on top of the
//! same projection. Values are checked as for a component: the key scope
//! applies the same rules, the module's declared emit topics bound its
//! emits, and the host's log unit cuts and counts its lines.

use std::marker::PhantomData;
use std::sync::Arc;

use wakuwaku::event::{EventAtomicOrdering, EventTypeTag};
use wakuwaku::key::Key;
use wakuwaku::sandbox::handler::{
    CallError, Emitted, ErrorClass, EventType, HandlerInstance, HandlerModule, KeyScope, LogLevel, limits,
};
use wakuwaku::sandbox::runtime::log::LogUnit;
use wakuwaku_guest as guest;

/// A native module built from `M`'s `Module` implementation.
pub struct NativeModule<M> {
    name: String,
    event_types: Vec<EventType>,
    emits: Arc<[String]>,
    module: PhantomData<fn() -> M>,
}

impl<M: guest::Module + 'static> NativeModule<M> {
    /// A native module named `name`.
    ///
    /// # Panics
    ///
    /// If `M` describes itself in a way the sandbox would refuse (which
    /// `export_module!` already rules out at compile time).
    pub fn new(name: &str) -> Self {
        let info = M::describe();
        let types = info.event_types.iter().map(|t| (t.tag, t.name, t.max_batch));
        if let Err(error) = limits::check_description(types, info.emits) {
            panic!("module `{name}` describes itself wrongly: {error}");
        }
        let event_types = info
            .event_types
            .into_iter()
            .map(|info| EventType {
                tag: EventTypeTag::new(info.tag),
                name: info.name.to_owned(),
                algebra: info.algebra,
                max_batch: info.max_batch,
                timing: info.timing,
            })
            .collect();
        let emits = info.emits.iter().map(|topic| (*topic).to_owned()).collect();
        Self { name: name.to_owned(), event_types, emits, module: PhantomData }
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

    fn emits(&self) -> &[String] {
        &self.emits
    }

    fn instantiate(&self) -> Result<Box<dyn HandlerInstance>, CallError> {
        Ok(Box::new(NativeInstance::<M> {
            log: LogUnit::new(&self.name, Default::default()),
            emits: self.emits.clone(),
            module: PhantomData,
        }))
    }
}

struct NativeInstance<M> {
    log: LogUnit,
    emits: Arc<[String]>,
    module: PhantomData<fn() -> M>,
}

impl<M: guest::Module> HandlerInstance for NativeInstance<M> {
    fn handle(&mut self, scope: &mut KeyScope, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<(), CallError> {
        let key = scope.key().clone();
        self.log.begin(Some(key.clone()), *scope.limits());
        let mut host = ScopeHost { scope: &mut *scope, emits: &self.emits, log: &mut self.log };
        let result = M::handle(&mut host, tag.get(), &key, bodies).map_err(call_error);
        self.log.finish();
        scope.finish_call(result)
    }

    fn combine(&mut self, tag: EventTypeTag, bodies: &[Vec<u8>]) -> Result<Vec<u8>, CallError> {
        M::combine(tag.get(), bodies).map_err(call_error)
    }

    fn key(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<Key, CallError> {
        M::key(tag.get(), body).map_err(call_error)
    }

    fn ordering(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<EventAtomicOrdering, CallError> {
        M::ordering(tag.get(), body).map_err(call_error)
    }

    fn event_time(&mut self, tag: EventTypeTag, body: &[u8]) -> Result<Option<i64>, CallError> {
        M::event_time(tag.get(), body).map_err(call_error)
    }
}

/// The guest SDK's host interface over the host's key scope.
struct ScopeHost<'a> {
    scope: &'a mut KeyScope,
    emits: &'a [String],
    log: &'a mut LogUnit,
}

impl guest::HostApi for ScopeHost<'_> {
    fn get(&mut self, name: &str) -> Result<Option<Vec<u8>>, guest::Refusal> {
        self.scope.get(name).map_err(|e| e.to_string())
    }

    fn set(&mut self, name: &str, value: &[u8]) -> Result<(), guest::Refusal> {
        self.scope.set(name, value.to_vec()).map_err(|e| e.to_string())
    }

    fn delete(&mut self, name: &str) -> Result<(), guest::Refusal> {
        self.scope.delete(name).map_err(|e| e.to_string())
    }

    fn counter_add(&mut self, name: &str, delta: i64) -> Result<(), guest::Refusal> {
        self.scope.counter_add(name, delta).map_err(|e| e.to_string())
    }

    fn counter_get(&mut self, name: &str) -> Result<i64, guest::Refusal> {
        self.scope.counter_get(name).map_err(|e| e.to_string())
    }

    fn emit(&mut self, message: guest::Outgoing) -> Result<(), guest::Refusal> {
        let emitted = Emitted {
            topic: message.topic,
            tag: EventTypeTag::new(message.tag),
            key: message.key.as_bytes().to_vec(),
            ordering: message.ordering,
            algebra: message.algebra,
            body: message.body,
        };
        self.scope.emit(self.emits, emitted).map_err(|e| e.to_string())
    }

    fn log(&mut self, level: guest::Level, message: &str) {
        let level = match level {
            guest::Level::Trace => LogLevel::Trace,
            guest::Level::Debug => LogLevel::Debug,
            guest::Level::Info => LogLevel::Info,
            guest::Level::Warn => LogLevel::Warn,
            guest::Level::Error => LogLevel::Error,
        };
        self.log.log(level, message);
    }
}

fn call_error(error: guest::HandlerError) -> CallError {
    let class = match error.class {
        guest::ErrorClass::Transient => ErrorClass::Transient,
        guest::ErrorClass::Retryable => ErrorClass::Retryable,
        guest::ErrorClass::Unrecoverable => ErrorClass::Unrecoverable,
    };
    CallError::Handler { class, message: limits::error_message(error.message) }
}
