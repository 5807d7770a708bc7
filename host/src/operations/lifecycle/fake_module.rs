//! A native module for the unit tests of this folder: a name, a version,
//! the tags it handles and the topics it emits to, and no code (it makes
//! no instances). Enough for what the lifecycle asks of a module without
//! running it: differences, tag clashes, emit topics.

use std::sync::Arc;

use crate::event::{Algebra, EventTiming, EventTypeTag};
use crate::sandbox::handler::{CallError, EventType, HandlerInstance, HandlerModule};

/// See the module doc.
pub(super) struct FakeModule {
    name: String,
    version: String,
    types: Vec<EventType>,
    emits: Vec<String>,
}

impl FakeModule {
    /// Module `name` at `version`, handling no type, emitting nowhere.
    pub(super) fn new(name: &str, version: &str) -> Self {
        Self { name: name.to_owned(), version: version.to_owned(), types: Vec::new(), emits: Vec::new() }
    }

    /// The same, handling the types of `tags`.
    pub(super) fn handling(mut self, tags: &[u32]) -> Self {
        self.types = tags
            .iter()
            .map(|&tag| EventType {
                tag: EventTypeTag::new(tag),
                name: format!("type-{tag}"),
                algebra: Algebra::NonAssociative,
                max_batch: 1,
                timing: EventTiming::Untimed,
            })
            .collect();
        self
    }

    /// The same, declaring it emits to `topics`.
    pub(super) fn emitting(mut self, topics: &[&str]) -> Self {
        self.emits = topics.iter().map(|topic| (*topic).to_owned()).collect();
        self
    }

    /// As the library holds modules.
    pub(super) fn shared(self) -> Arc<dyn HandlerModule> {
        Arc::new(self)
    }
}

impl HandlerModule for FakeModule {
    fn name(&self) -> &str {
        &self.name
    }

    fn version(&self) -> &str {
        &self.version
    }

    fn event_types(&self) -> &[EventType] {
        &self.types
    }

    fn emits(&self) -> &[String] {
        &self.emits
    }

    fn instantiate(&self) -> Result<Box<dyn HandlerInstance>, CallError> {
        Err(CallError::Trap { reason: "a fake module makes no instances".to_owned() })
    }
}
