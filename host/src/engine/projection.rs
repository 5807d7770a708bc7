//! A projection: a named set of handler modules over one topic, sharing one
//! state namespace.
//!
//! Rules it keeps:
//! - **Tags are unique within a projection.** Two modules that declare the
//!   same tag are refused together, and the error names both.
//! - **The module decides how its events are reduced.** Routing a tag gives
//!   the module and the [`EventType`] it declared (algebra, max batch); the
//!   algebra header of a message is informational.
//! - **Instances are pooled.** A worker checks out one instance per module
//!   it needs and gives it back when its batch is done, so stores are reused
//!   across calls and batches instead of being created per call; unless the
//!   module says idle instances are not worth their memory
//!   ([`HandlerModule::keeps_idle_instances`]), when they are dropped.
//! - **Modules change between batches.** The modules, their routes and
//!   their pools form one [`ModuleSet`]. A batch takes the current set when
//!   it starts ([`Projection::current`]) and keeps it to the end;
//!   [`Projection::replace_modules`] puts a new set in place for the batches
//!   that start after it. The old set, and the instances of modules that
//!   left it, are dropped when the last batch using them finishes.
//! - **Replacements happen one at a time.** Every replacement goes through
//!   [`Projection::swap_modules`], which holds a lock (batches never take
//!   it) and counts replacements: a swap prepared against one
//!   [`generation`](ModuleSwap::generation) sees whether another came in
//!   between, so a hot reload never lands on a set a rebuild's promotion
//!   or rollback put in place after it looked.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use rustc_hash::FxHashMap;

use crate::engine::routing::RoutedTopics;
use crate::event::{EventTiming, EventTypeTag};
use crate::sandbox::handler::{CallError, ContractError, EventType, HandlerInstance, HandlerModule};
use crate::sandbox::runtime::{LoadError, Sandbox, WasmModule};
use crate::storage::state::{StateError, StateStore};

/// Why a projection could not be put together.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProjectionError {
    /// Two modules declare the same tag.
    #[error(
        "tag {tag} is declared by both `{first}` and `{second}`; tags must be unique within projection `{projection}`"
    )]
    DuplicateTag {
        /// The projection.
        projection: String,
        /// The tag.
        tag: EventTypeTag,
        /// The module that declared it first.
        first: String,
        /// The module that declared it again.
        second: String,
    },
    /// A module declares the projection's own topic among its emit
    /// topics: every message would come back as an event, and a module
    /// emitting more than one per event would grow the log without end.
    #[error(
        "emit-loop: module `{module}` declares it emits to `{topic}`, the topic projection `{projection}` consumes; \
         a module may not feed its own projection"
    )]
    EmitLoop {
        /// The projection.
        projection: String,
        /// The module.
        module: String,
        /// The topic.
        topic: String,
    },
    /// A module file could not be read (why is the cause, not repeated in
    /// this message, so a chain of causes says it once).
    #[error("cannot read module file {path}")]
    ReadModule {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A module could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The state store could not be opened.
    #[error(transparent)]
    State(#[from] StateError),
}

/// Modules over one topic (or several co-partitioned ones), their routing
/// table and their state.
pub struct Projection {
    name: String,
    /// Every topic it consumes, in the order given; the first names its
    /// retry and dead-letter topics.
    topics: Vec<String>,
    current: RwLock<Arc<ModuleSet>>,
    /// The swap lock and the number of replacements so far.
    swaps: Mutex<u64>,
    store: StateStore,
    routed: RoutedTopics,
}

/// A set of modules with unique tags: the routing table and the instance
/// pools of one version of a projection.
pub struct ModuleSet {
    modules: Vec<Arc<dyn HandlerModule>>,
    routes: FxHashMap<EventTypeTag, Route>,
    pools: Vec<Mutex<Vec<Box<dyn HandlerInstance>>>>,
    /// Higher for a set made later ([`ModuleSet::sequence`]).
    sequence: u64,
}

/// The sequence number of the next [`ModuleSet`].
static NEXT_SET: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Where events of one tag go.
#[derive(Debug, Clone)]
pub struct Route {
    /// Index of the module in [`ModuleSet::modules`].
    pub module: usize,
    /// The event type as the module declared it.
    pub event_type: EventType,
}

impl ModuleSet {
    /// Puts modules together for `projection` over `topic`, checking that
    /// tags are unique and that no module emits to `topic`.
    pub fn new(projection: &str, topic: &str, modules: Vec<Arc<dyn HandlerModule>>) -> Result<Self, ProjectionError> {
        let mut routes: FxHashMap<EventTypeTag, Route> = FxHashMap::default();
        for (index, module) in modules.iter().enumerate() {
            if module.emits().iter().any(|emitted| emitted == topic) {
                return Err(ProjectionError::EmitLoop {
                    projection: projection.to_owned(),
                    module: module.name().to_owned(),
                    topic: topic.to_owned(),
                });
            }
            for event_type in module.event_types() {
                if let Some(existing) = routes.get(&event_type.tag) {
                    return Err(ProjectionError::DuplicateTag {
                        projection: projection.to_owned(),
                        tag: event_type.tag,
                        first: modules[existing.module].name().to_owned(),
                        second: module.name().to_owned(),
                    });
                }
                routes.insert(event_type.tag, Route { module: index, event_type: event_type.clone() });
            }
        }
        let pools = modules.iter().map(|_| Mutex::new(Vec::new())).collect();
        let sequence = NEXT_SET.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Self { modules, routes, pools, sequence })
    }

    /// Whether any of its event types declares event time (`Timed` or
    /// `TimedRelaxed`).
    pub fn has_timed_types(&self) -> bool {
        self.routes.values().any(|route| route.event_type.timing != EventTiming::Untimed)
    }

    /// A number that is higher for a set made later in this process, so
    /// that of two sets, the one that replaced the other can be told.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// The modules, in load order.
    pub fn modules(&self) -> &[Arc<dyn HandlerModule>] {
        &self.modules
    }

    /// Where events of `tag` go, if any module declares it.
    pub fn route(&self, tag: EventTypeTag) -> Option<&Route> {
        self.routes.get(&tag)
    }

    /// The timing `tag`'s type declares; untimed for a tag no module
    /// declares (which no module handles).
    pub fn timing(&self, tag: EventTypeTag) -> EventTiming {
        self.route(tag).map_or(EventTiming::Untimed, |route| route.event_type.timing)
    }

    /// The event time a message of `tag` has, from the `waku-event-time`
    /// it carried, as its type declares it (`event-time-declared`,
    /// `event-time-untimed`): the header's for a timed type, refused when
    /// it is absent; none for an untimed type, whatever it carried; the
    /// header's for a tag no module declares (which no module handles).
    pub fn event_time(&self, tag: EventTypeTag, carried: Option<i64>) -> Result<Option<i64>, ContractError> {
        let Some(route) = self.route(tag) else { return Ok(carried) };
        let event_type = &route.event_type;
        event_type.timing.event_time(carried).map_err(|_| ContractError::EventTimeDeclared {
            name: event_type.name.clone(),
            tag: tag.get(),
            from_module: false,
        })
    }

    /// Borrows pooled instances for one worker; they return on drop.
    pub fn instances(&self) -> Instances<'_> {
        Instances { set: self, checked_out: self.modules.iter().map(|_| Ok(None)).collect() }
    }
}

impl Projection {
    /// Puts a projection together, checking that tags are unique and that
    /// no module emits to `topic`.
    pub fn new(
        name: &str,
        topic: &str,
        modules: Vec<Arc<dyn HandlerModule>>,
        store: StateStore,
    ) -> Result<Self, ProjectionError> {
        let set = ModuleSet::new(name, topic, modules)?;
        record_type_names(&store, name, set.modules());
        let routed = RoutedTopics::shared(topic);
        Ok(Self {
            name: name.to_owned(),
            topics: vec![topic.to_owned()],
            current: RwLock::new(Arc::new(set)),
            swaps: Mutex::new(0),
            store,
            routed,
        })
    }

    /// Routes its failures to `routed` instead of the topic's shared retry
    /// and dead-letter topics.
    pub fn with_routed_topics(self, routed: RoutedTopics) -> Self {
        Self { routed, ..self }
    }

    /// Where its failures go.
    pub fn routed_topics(&self) -> &RoutedTopics {
        &self.routed
    }

    /// The projection's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The topic it consumes: the first of [`Projection::topics`], whose
    /// retry and dead-letter topics it routes to.
    pub fn topic(&self) -> &str {
        &self.topics[0]
    }

    /// Every topic it consumes, in the order given: one, or several
    /// co-partitioned ones read in event-time order
    /// ([`crate::engine::consumer`], "Event time across topics"). The order is
    /// part of the release order's tie-break.
    pub fn topics(&self) -> &[String] {
        &self.topics
    }

    /// Consumes `more` topics besides the first, checking that no module
    /// emits to any of them. A topic named twice is taken once.
    pub fn with_more_topics(mut self, more: &[String]) -> Result<Self, ProjectionError> {
        for topic in more {
            if self.topics.contains(topic) {
                continue;
            }
            no_emit_loop(&self.name, std::slice::from_ref(topic), self.current().modules())?;
            self.topics.push(topic.clone());
        }
        Ok(self)
    }

    /// The module set batches starting now use.
    pub fn current(&self) -> Arc<ModuleSet> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Its modules now, in load order.
    pub fn modules(&self) -> Vec<Arc<dyn HandlerModule>> {
        self.current().modules.clone()
    }

    /// Where events of `tag` go now, if any module declares it.
    pub fn route(&self, tag: EventTypeTag) -> Option<Route> {
        self.current().route(tag).cloned()
    }

    /// The one way to replace the module set: holds the projection's swap
    /// lock until dropped, so replacements (a hot reload, a rebuild's
    /// promotion or rollback) happen one at a time, each seeing the set the
    /// one before left. Batches never take this lock: they keep reading
    /// [`Projection::current`].
    pub fn swap_modules(&self) -> ModuleSwap<'_> {
        ModuleSwap { projection: self, generation: self.swaps.lock().unwrap_or_else(|e| e.into_inner()) }
    }

    /// Replaces the modules for the batches that start after this call,
    /// checking tags are unique first (on error nothing changes); see
    /// [`ModuleSwap::replace`].
    pub fn replace_modules(&self, modules: Vec<Arc<dyn HandlerModule>>) -> Result<(), ProjectionError> {
        self.swap_modules().replace(modules)
    }

    /// Its state store.
    pub fn store(&self) -> &StateStore {
        &self.store
    }
}

/// The right to replace a projection's module set, held until dropped
/// ([`Projection::swap_modules`]).
pub struct ModuleSwap<'a> {
    projection: &'a Projection,
    generation: MutexGuard<'a, u64>,
}

impl ModuleSwap<'_> {
    /// Replacements made so far; each one adds 1. A swap prepared while
    /// it was `n` can tell whether another came in between.
    pub fn generation(&self) -> u64 {
        *self.generation
    }

    /// The modules now, in load order.
    pub fn modules(&self) -> Vec<Arc<dyn HandlerModule>> {
        self.projection.modules()
    }

    /// Replaces the modules for the batches that start after this call,
    /// checking tags are unique first (on error nothing changes).
    ///
    /// Done off the hot path, so the first batches after the swap do not
    /// pay for instances: modules that stay keep their pooled instances,
    /// and new modules get one instance per core made here.
    pub fn replace(&mut self, modules: Vec<Arc<dyn HandlerModule>>) -> Result<(), ProjectionError> {
        self.replace_recorded(modules, || Ok::<_, ProjectionError>(()))
    }

    /// Like [`ModuleSwap::replace`], but calls `record` once the new set is
    /// checked and before it is put in place; if `record` fails, nothing
    /// changes. What `record` saves (the recorded versions) is thus never
    /// behind what runs: anyone who sees the new set also sees it
    /// recorded, and a crash in between restarts with the new set, which
    /// no batch has used yet.
    pub fn replace_recorded<E: From<ProjectionError>>(
        &mut self,
        modules: Vec<Arc<dyn HandlerModule>>,
        record: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        let projection = self.projection;
        let set = ModuleSet::new(&projection.name, projection.topic(), modules)?;
        no_emit_loop(&projection.name, &projection.topics[1..], set.modules())?;
        record()?;
        record_type_names(&projection.store, &projection.name, set.modules());
        let old = projection.current();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        for (index, module) in set.modules.iter().enumerate() {
            let mut pool = set.pools[index].lock().unwrap_or_else(|e| e.into_inner());
            match old.modules.iter().position(|m| Arc::ptr_eq(m, module)) {
                Some(kept) => pool.append(&mut old.pools[kept].lock().unwrap_or_else(|e| e.into_inner())),
                // A failure here shows again, with its reason, at first use.
                None => pool.extend((0..cores).map_while(|_| module.instantiate().ok())),
            }
        }
        *projection.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(set);
        *self.generation += 1;
        Ok(())
    }
}

/// The `meta` entry naming the event types a projection's modules
/// declared: tag → name (JSON), so that `waku dlq` names a dead letter's
/// type where a tag alone would say little.
const EVENT_TYPES_META: &str = "event-types";

/// The names of the event types recorded with `store` by tag; empty when
/// none are (or the entry is not what this host writes).
pub fn type_names(store: &StateStore) -> BTreeMap<u32, String> {
    let Ok(Some(bytes)) = store.meta(EVENT_TYPES_META) else { return BTreeMap::new() };
    serde_json::from_slice(&bytes).unwrap_or_default()
}

/// Records the names of the event types `modules` declare, keeping the
/// names recorded before (a type whose module left still names its dead
/// letters). Only a log line when it cannot: names are for people.
fn record_type_names(store: &StateStore, projection: &str, modules: &[Arc<dyn HandlerModule>]) {
    let mut names = type_names(store);
    let before = names.clone();
    for event_type in modules.iter().flat_map(|module| module.event_types()) {
        names.insert(event_type.tag.get(), event_type.name.clone());
    }
    if names == before {
        return;
    }
    let recorded = serde_json::to_vec(&names)
        .map_err(|error| error.to_string())
        .and_then(|bytes| store.set_meta(EVENT_TYPES_META, &bytes).map_err(|error| error.to_string()));
    if let Err(error) = recorded {
        tracing::warn!(projection, "cannot record the names of the event types: {error}");
    }
}

/// Refuses modules that emit to one of `topics`, which `projection`
/// consumes: a module may not feed its own projection.
fn no_emit_loop(
    projection: &str,
    topics: &[String],
    modules: &[Arc<dyn HandlerModule>],
) -> Result<(), ProjectionError> {
    for topic in topics {
        if let Some(module) = modules.iter().find(|module| module.emits().iter().any(|emitted| emitted == topic)) {
            return Err(ProjectionError::EmitLoop {
                projection: projection.to_owned(),
                module: module.name().to_owned(),
                topic: topic.clone(),
            });
        }
    }
    Ok(())
}

/// Loads one module file into `sandbox`; its name is the file stem.
pub fn load_module_file(sandbox: &Sandbox, path: &Path) -> Result<Arc<dyn HandlerModule>, ProjectionError> {
    let bytes = crate::sandbox::runtime::read_component(path)
        .map_err(|source| ProjectionError::ReadModule { path: path.to_owned(), source })?;
    let name = path.file_stem().map_or_else(|| "module".into(), |stem| stem.to_string_lossy());
    let module: WasmModule = sandbox.load(&name, &bytes)?;
    Ok(Arc::new(module))
}

/// Instances one worker holds, one per module at most, taken from the
/// set's pool on first use and returned when dropped. A module that could
/// not make one is not asked again by the same worker for the same batch:
/// its later keys get the same error, so a start function that traps (or
/// the host's memory full) costs one attempt per worker, not one per key.
pub struct Instances<'a> {
    set: &'a ModuleSet,
    checked_out: Vec<Result<Option<Box<dyn HandlerInstance>>, CallError>>,
}

impl Instances<'_> {
    /// The worker's instance of module `module`.
    pub fn get(&mut self, module: usize) -> Result<&mut dyn HandlerInstance, CallError> {
        let slot = &mut self.checked_out[module];
        if let Ok(None) = slot {
            let pooled = self.set.pools[module].lock().unwrap_or_else(|e| e.into_inner()).pop();
            *slot = match pooled {
                Some(instance) => Ok(Some(instance)),
                None => self.set.modules[module].instantiate().map(Some),
            };
        }
        match slot {
            Ok(instance) => Ok(instance.as_deref_mut().expect("filled above")),
            Err(error) => Err(error.clone()),
        }
    }
}

impl Drop for Instances<'_> {
    fn drop(&mut self) {
        for (module, slot) in self.checked_out.iter_mut().enumerate() {
            if let Ok(Some(instance)) = std::mem::replace(slot, Ok(None)) {
                let mut pool = self.set.pools[module].lock().unwrap_or_else(|e| e.into_inner());
                if self.set.modules[module].keeps_idle_instances() {
                    pool.push(instance);
                } else {
                    pool.clear();
                }
            }
        }
    }
}
