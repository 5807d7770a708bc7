//! Module lifecycle: which version of each module a projection runs, where
//! the bytes of its versions are kept, what a restart runs, and how new
//! versions arrive while it runs (hot reload).
//!
//! Rules kept here:
//! - **A version is a content hash** ([`crate::sandbox::runtime::content_version`]).
//! - **The active versions are recorded with the projection's state** (its
//!   `meta` entry `modules`), with the last [`KEPT_VERSIONS`] versions of
//!   each module, whose bytes are kept under `<data>/modules/<projection>/`
//!   or the directory the record names ([`Recorded::copies`]: a rebuild's
//!   shadow keeps its own, so one store forgetting a version never deletes
//!   a copy another store's record names).
//!   A restart runs the recorded versions from those copies, even if the
//!   module directory changed while the host was down; the differences are
//!   reported ([`Difference`]), and `adopt` takes the directory's versions
//!   instead. `rollback` makes an earlier kept version active again.
//! - **Hot reload never stops the consumer.** [`Reloader`] watches the
//!   module directory; a new or changed file is compiled and validated on a
//!   blocking thread (it must load under the sandbox, and its tags must not
//!   clash with the other modules), then swapped in between batches
//!   ([`Projection::replace_modules`]). A file that fails leaves the old
//!   version running, and the error is kept for the admin endpoint and
//!   counted. A removed file takes its module, and so the handling of its
//!   event types, out of the projection. A reload reads only the files
//!   that changed since it last looked ([`FileStamp`]: size, times,
//!   inode): one taken in, or refused for what its bytes are, is not read
//!   and hashed again while it stays as it was, for at most a minute, and
//!   only once its times are two seconds old ([`Trusted`]).
//! - **A module's emit topics exist before it runs.** With an
//!   [`EmitTopics`] check ([`Library::with_emit_topics`]), every load (at
//!   start-up and on reload) checks that the topics the module declares in
//!   `module-info.emits` exist in the log, or creates them when the
//!   operator asked for it ([`LogEmitTopics`]). A missing topic fails the
//!   load naming the module and the topic, so a reload that needs one is
//!   refused like any other, and the old version keeps running; nothing a
//!   module emits can then wait in the outbox for a topic that is not
//!   there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::metrics::Metrics;
use crate::engine::projection::{ModuleSwap, Projection, ProjectionError};
use crate::sandbox::handler::HandlerModule;
use crate::sandbox::runtime::component_file::{check_module_dir_size, module_paths};
use crate::sandbox::runtime::{Sandbox, content_version, read_component};
use crate::storage::log::{EventLog, LogError};
use crate::storage::state::{StateError, StateStore};

/// The `tracing` target of the lines that say a module was swapped in or
/// taken out by a hot reload: shown at info by the command line's default
/// filter, so a swap is never silent.
pub const RELOAD_LOG_TARGET: &str = "waku::reload";

/// Versions kept per module (the active one included).
pub const KEPT_VERSIONS: usize = 5;

/// The `meta` entry holding the recorded versions.
const META: &str = "modules";

/// Why a lifecycle operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LifecycleError {
    /// A module could not be loaded, or the set is not valid.
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    /// The state store failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// Reading or writing module files failed.
    #[error("{what} `{}`: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The recorded versions cannot be read.
    #[error("the recorded module versions are unreadable: {0}")]
    Corrupt(String),
    /// No such module is recorded.
    #[error("projection `{projection}` has no module `{module}` (it has: {known})")]
    UnknownModule {
        /// The projection.
        projection: String,
        /// The module asked for.
        module: String,
        /// The modules it has.
        known: String,
    },
    /// The version asked for is not kept.
    #[error("module `{module}` has no kept version {version} (kept: {kept})")]
    UnknownVersion {
        /// The module.
        module: String,
        /// The version asked for.
        version: String,
        /// The kept versions, newest first.
        kept: String,
    },
    /// There is nothing earlier to roll back to.
    #[error("module `{module}` has no version before {active} to roll back to")]
    NothingToRollBackTo {
        /// The module.
        module: String,
        /// Its active version.
        active: String,
    },
    /// A rollback in a running projection was refused: the kept version
    /// failed the checks a hot reload makes, and nothing changed.
    #[error("module `{module}`: version {version} is refused, and {running} runs on (nothing changed): {source}")]
    RollbackRefused {
        /// The module.
        module: String,
        /// The version rolled back to.
        version: String,
        /// The version that runs on.
        running: String,
        /// Why.
        source: Box<LifecycleError>,
    },
    /// A module declares it emits to a topic the log does not have.
    #[error(
        "module `{module}` declares it emits to topic `{topic}`, which does not exist; create it, or pass \
         --create-emit-topics <PARTITIONS> to have the host create it"
    )]
    MissingEmitTopic {
        /// The module.
        module: String,
        /// The missing topic.
        topic: String,
    },
    /// The host already created as many emit topics as it creates in one
    /// run ([`CreateTopics`]).
    #[error(
        "module `{module}` declares it emits to topic `{topic}`, which does not exist, and this host has already \
         created {limit} emit topics, the most it creates in one run (`emit-topics-created`); create the topic \
         in the log yourself"
    )]
    EmitTopicsCreated {
        /// The module.
        module: String,
        /// The missing topic.
        topic: String,
        /// How many topics the host creates at most.
        limit: usize,
    },
    /// The log could not be asked about, or could not create, a module's
    /// emit topic.
    #[error("checking emit topic `{topic}` of module `{module}`: {source}")]
    EmitTopicLog {
        /// The module.
        module: String,
        /// The topic.
        topic: String,
        /// What the log said.
        source: LogError,
    },
    /// Neither the directory nor the record has a module.
    #[error("no module (*.wasm) found in {} and none recorded for projection `{projection}`", dir.display())]
    NoModules {
        /// The module directory.
        dir: PathBuf,
        /// The projection.
        projection: String,
    },
}

/// The versions a projection runs and keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    /// The active version of each module.
    pub active: BTreeMap<String, String>,
    /// The kept versions of each module, newest first.
    pub kept: BTreeMap<String, Vec<String>>,
    /// Where the kept copies are, relative to the data directory: each
    /// store's record keeps its own, so no other store's record (a
    /// rebuild's shadow, the store before a promotion) can forget, and
    /// delete, a copy this one names. Absent in records written before it
    /// was: `modules/<projection>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copies: Option<PathBuf>,
}

/// How the module directory differs from what the projection runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Difference {
    /// The directory holds another version than the one running.
    Changed {
        /// The module.
        module: String,
        /// The version running (recorded).
        running: String,
        /// The version in the directory.
        in_directory: String,
    },
    /// The directory no longer holds a module that runs.
    Missing {
        /// The module.
        module: String,
        /// The version running (recorded).
        running: String,
    },
    /// A file the record does not know failed to load at a restart (it
    /// does not load, or its tags clash with another module's): it is
    /// refused alone, as a hot reload would refuse it, and the rest starts.
    Refused {
        /// The module.
        module: String,
        /// The file's version.
        version: String,
        /// Why.
        error: String,
    },
    /// The directory's version was taken (`adopt`).
    Adopted {
        /// The module.
        module: String,
        /// The version before, if it ran.
        from: Option<String>,
        /// The version now running.
        to: String,
    },
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Changed { module, running, in_directory } => write!(
                f,
                "module `{module}`: the directory holds version {in_directory}, but {running} is recorded and runs \
                 (restart with --adopt-modules, or change the file while running, to take the directory's)"
            ),
            Self::Missing { module, running } => write!(
                f,
                "module `{module}`: its file is gone from the directory; recorded version {running} runs (restart \
                 with --adopt-modules to drop it)"
            ),
            Self::Refused { module, version, error } => write!(
                f,
                "module `{module}`: its new file (version {version}) is refused, and the other modules start: \
                 {error}"
            ),
            Self::Adopted { module, from: Some(from), to } => write!(f, "module `{module}`: {from} → {to}"),
            Self::Adopted { module, from: None, to } => write!(f, "module `{module}`: dropped {to}"),
        }
    }
}

/// The modules to run at start-up, and how the directory differs from
/// what runs.
pub type Started = (Vec<Arc<dyn HandlerModule>>, Vec<Difference>);

/// What the last reload attempt of a module said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReloadStatus {
    /// The version the file had.
    pub version: String,
    /// The error, when it was refused.
    pub error: Option<String>,
}

/// A projection's module versions: the record, the kept copies, loading.
pub struct Library {
    projection: String,
    /// The data directory.
    data: PathBuf,
    /// Where a record that names no copies directory keeps its copies,
    /// relative to `data`.
    copies: PathBuf,
    store: StateStore,
    sandbox: Sandbox,
    /// The last reload attempt per module file.
    reloads: Mutex<BTreeMap<String, ReloadStatus>>,
    /// The module directory's versions as last taken in (by name): a reload
    /// applies what changed since. Locked only inside the projection's swap
    /// lock, or alone.
    seen: Mutex<BTreeMap<String, String>>,
    /// The files a reload need not read again while their stamp holds:
    /// each one taken in or refused for its bytes.
    unchanged: Mutex<BTreeMap<String, Trusted>>,
    loads_ok: AtomicU64,
    loads_failed: AtomicU64,
    metrics: Option<Arc<Metrics>>,
    emit_topics: Option<Arc<dyn EmitTopics>>,
}

impl Library {
    /// The library of `projection`, keeping copies under
    /// `<data_dir>/modules/<projection>` unless its record names another
    /// directory.
    pub fn new(data_dir: &Path, projection: &str, store: StateStore, sandbox: Sandbox) -> Self {
        Self {
            projection: projection.to_owned(),
            data: data_dir.to_owned(),
            copies: Path::new("modules").join(projection),
            store,
            sandbox,
            reloads: Mutex::default(),
            seen: Mutex::default(),
            unchanged: Mutex::default(),
            loads_ok: AtomicU64::new(0),
            loads_failed: AtomicU64::new(0),
            metrics: None,
            emit_topics: None,
        }
    }

    /// Checks every module it loads against `topics`: the topics a module
    /// declares it emits to must exist (or be created).
    pub fn with_emit_topics(mut self, topics: Arc<dyn EmitTopics>) -> Self {
        self.emit_topics = Some(topics);
        self
    }

    /// Keeps the copies of a store whose record names no copies directory
    /// yet (a new rebuild's shadow) under `<data>/<relative>`, apart from
    /// every other store's.
    pub fn with_copies_in(mut self, relative: PathBuf) -> Self {
        self.copies = relative;
        self
    }

    /// Counts module loads in `metrics` too.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The recorded versions.
    pub fn recorded(&self) -> Result<Recorded, LifecycleError> {
        let mut recorded: Recorded = match self.store.meta(META)? {
            None => Recorded::default(),
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| LifecycleError::Corrupt(e.to_string()))?,
        };
        let copies = recorded.copies.get_or_insert_with(|| self.copies.clone());
        let inside = copies.components().all(|part| matches!(part, std::path::Component::Normal(_)));
        if !inside || copies.as_os_str().is_empty() {
            let message = format!("the kept copies directory {} is not inside the data directory", copies.display());
            return Err(LifecycleError::Corrupt(message));
        }
        Ok(recorded)
    }

    /// Saves `recorded`, then deletes the `forgotten` kept copies: a copy
    /// goes only once no saved record names it.
    fn save(&self, recorded: &Recorded, forgotten: Vec<PathBuf>) -> Result<(), LifecycleError> {
        let bytes = serde_json::to_vec(recorded).map_err(|e| LifecycleError::Corrupt(e.to_string()))?;
        self.store.set_meta(META, &bytes)?;
        for path in forgotten {
            let _ = std::fs::remove_file(&path);
            // The module's directory of copies, once it holds none.
            if let Some(module_dir) = path.parent() {
                let _ = std::fs::remove_dir(module_dir);
            }
        }
        Ok(())
    }

    /// Module loads that succeeded and failed since start-up.
    pub fn load_counts(&self) -> (u64, u64) {
        (self.loads_ok.load(Ordering::Relaxed), self.loads_failed.load(Ordering::Relaxed))
    }

    /// The last reload attempt of each module file.
    pub fn reloads(&self) -> BTreeMap<String, ReloadStatus> {
        self.reloads.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The kept copy of `version` of `module` for `recorded` (as
    /// [`Library::recorded`] returns it: with its copies directory).
    fn kept_path(&self, recorded: &Recorded, module: &str, version: &str) -> PathBuf {
        let copies = recorded.copies.as_deref().unwrap_or(&self.copies);
        self.data.join(copies).join(module).join(format!("{version}.wasm"))
    }

    /// Compiles and checks `bytes` as module `name` (and its emit topics,
    /// with an [`EmitTopics`] check), counting the outcome.
    fn load(&self, name: &str, bytes: &[u8]) -> Result<Arc<dyn HandlerModule>, LifecycleError> {
        let loaded = self.sandbox.load(name, bytes).map_err(|e| LifecycleError::from(ProjectionError::from(e)));
        let loaded = loaded.and_then(|module| match &self.emit_topics {
            Some(topics) => topics.ensure(&module).map(|()| module),
            None => Ok(module),
        });
        let counter = if loaded.is_ok() { &self.loads_ok } else { &self.loads_failed };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(metrics) = &self.metrics {
            metrics.module_loaded(&self.projection, loaded.is_ok());
        }
        Ok(Arc::new(loaded?))
    }

    /// Loads a kept version.
    fn load_kept(
        &self,
        recorded: &Recorded,
        name: &str,
        version: &str,
    ) -> Result<Arc<dyn HandlerModule>, LifecycleError> {
        let path = self.kept_path(recorded, name, version);
        let bytes = read_component(&path).map_err(|source| LifecycleError::Io { what: "reading", path, source })?;
        if content_version(&bytes) != version {
            return Err(LifecycleError::Corrupt(format!("the kept copy of `{name}` version {version} was altered")));
        }
        self.load(name, &bytes)
    }

    /// Keeps `bytes` as `version` of `name` and makes it active in
    /// `recorded`; versions past [`KEPT_VERSIONS`] are forgotten: returns
    /// their copies, for [`Library::save`] to delete.
    fn activate(
        &self,
        recorded: &mut Recorded,
        name: &str,
        version: &str,
        bytes: &[u8],
    ) -> Result<Vec<PathBuf>, LifecycleError> {
        let path = self.kept_path(recorded, name, version);
        if !path.exists() {
            let dir = path.parent().expect("a kept path has a parent");
            std::fs::create_dir_all(dir).map_err(|source| LifecycleError::Io {
                what: "creating",
                path: dir.to_owned(),
                source,
            })?;
            let temporary = tempfile::NamedTempFile::new_in(dir).map_err(|source| LifecycleError::Io {
                what: "writing",
                path: path.clone(),
                source,
            })?;
            std::fs::write(temporary.path(), bytes).map_err(|source| LifecycleError::Io {
                what: "writing",
                path: path.clone(),
                source,
            })?;
            temporary.persist(&path).map_err(|e| LifecycleError::Io {
                what: "writing",
                path: path.clone(),
                source: e.error,
            })?;
        }
        recorded.active.insert(name.to_owned(), version.to_owned());
        let kept = recorded.kept.entry(name.to_owned()).or_default();
        kept.retain(|v| v != version);
        kept.insert(0, version.to_owned());
        let forgotten = kept.split_off(KEPT_VERSIONS.min(kept.len()));
        Ok(forgotten.iter().map(|version| self.kept_path(recorded, name, version)).collect())
    }

    /// The modules to run at start-up: the recorded versions, from their
    /// kept copies, and any module the record does not know yet from the
    /// directory. With `adopt`, the directory's versions win, and recorded
    /// modules without a file are dropped. Returns what differs.
    ///
    /// At the first start every file must load. At a restart (the record
    /// names modules) a file it does not know that fails to load, or
    /// whose tags clash with another module's, is refused alone
    /// ([`Difference::Refused`]), as a hot reload refused it: a bad file
    /// dropped in while the host ran must not keep it down after a crash.
    pub fn start(&self, module_dir: &Path, adopt: bool) -> Result<Started, LifecycleError> {
        self.start_adopting(module_dir, &|_| adopt)
    }

    /// [`Library::start`], adopting the directory's version of the modules
    /// `adopt` names (those whose OCI reference changed, [`crate::operations::oci::pins`]).
    pub fn start_adopting(&self, module_dir: &Path, adopt: &dyn Fn(&str) -> bool) -> Result<Started, LifecycleError> {
        let files = all_read(scan(module_dir, &BTreeMap::new())?.read)?;
        let mut recorded = self.recorded()?;
        if files.is_empty() && recorded.active.is_empty() {
            return Err(LifecycleError::NoModules { dir: module_dir.to_owned(), projection: self.projection.clone() });
        }
        let restart = !recorded.active.is_empty();
        let mut modules = Vec::new();
        let mut differences = Vec::new();
        let mut forgotten = Vec::new();
        // New files at a restart: taken once the others are known.
        let mut new_files = Vec::new();
        for (name, bytes) in &files {
            let version = content_version(bytes);
            match recorded.active.get(name).cloned() {
                Some(running) if running != version && !adopt(name) => {
                    modules.push(self.load_kept(&recorded, name, &running)?);
                    differences.push(Difference::Changed { module: name.clone(), running, in_directory: version });
                }
                None if restart => new_files.push((name, bytes, version)),
                running => {
                    modules.push(self.load(name, bytes)?);
                    forgotten.extend(self.activate(&mut recorded, name, &version, bytes)?);
                    if let Some(from) = running.filter(|r| *r != version) {
                        differences.push(Difference::Adopted { module: name.clone(), from: Some(from), to: version });
                    }
                }
            }
        }
        let missing: Vec<(String, String)> = recorded
            .active
            .iter()
            .filter(|(name, _)| !files.contains_key(*name))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        for (name, running) in missing {
            if adopt(&name) {
                recorded.active.remove(&name);
                differences.push(Difference::Adopted { module: name, from: None, to: running });
            } else {
                modules.push(self.load_kept(&recorded, &name, &running)?);
                differences.push(Difference::Missing { module: name, running });
            }
        }
        let mut refused = Vec::new();
        for (name, bytes, version) in new_files {
            let loaded = self.load(name, bytes).and_then(|module| match self.clash(&modules, &*module) {
                Some(error) => Err(error),
                None => Ok(module),
            });
            match loaded {
                Ok(module) => {
                    forgotten.extend(self.activate(&mut recorded, name, &version, bytes)?);
                    modules.push(module);
                }
                Err(error) => {
                    let error = error.to_string();
                    let status = ReloadStatus { version: version.clone(), error: Some(error.clone()) };
                    self.reloads.lock().unwrap_or_else(|e| e.into_inner()).insert(name.clone(), status);
                    differences.push(Difference::Refused { module: name.clone(), version, error });
                    refused.push(name);
                }
            }
        }
        self.save(&recorded, forgotten)?;
        // A refused file is tried again at the next change, as on reload.
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = files
            .iter()
            .filter(|(name, _)| !refused.contains(name))
            .map(|(name, bytes)| (name.clone(), content_version(bytes)))
            .collect();
        Ok((modules, differences))
    }

    /// The clash of `module`'s tags with those of `others`, if any.
    fn clash(&self, others: &[Arc<dyn HandlerModule>], module: &dyn HandlerModule) -> Option<LifecycleError> {
        others.iter().find_map(|other| {
            let declared =
                |tag: &crate::event::EventTypeTag| other.event_types().iter().any(|theirs| theirs.tag == *tag);
            let tag = module.event_types().iter().map(|t| t.tag).find(declared)?;
            Some(LifecycleError::from(ProjectionError::DuplicateTag {
                projection: self.projection.clone(),
                tag,
                first: other.name().to_owned(),
                second: module.name().to_owned(),
            }))
        })
    }

    /// Makes `version` of `module` active again (default: the kept version
    /// before the active one). Returns (from, to). Takes effect when the
    /// projection next starts; [`Library::rollback_running`] swaps it in
    /// at once.
    pub fn rollback(&self, module: &str, version: Option<&str>) -> Result<(String, String), LifecycleError> {
        let mut recorded = self.recorded()?;
        let (active, target) = self.rollback_target(&recorded, module, version)?;
        // Loading it proves the kept copy is intact before it is recorded.
        self.load_kept(&recorded, module, &target)?;
        // Keep the rolled-back-from version, so rolling forward is possible.
        recorded.active.insert(module.to_owned(), target.clone());
        self.save(&recorded, Vec::new())?;
        Ok((active, target))
    }

    /// [`Library::rollback`] of a module of `projection` while it runs,
    /// taking effect at once: the kept version is loaded and checked as a
    /// hot reload checks a changed file (it loads under the sandbox, its
    /// emit topics exist, its tags clash with no other module's, it emits
    /// to no topic the projection consumes), then recorded and swapped in
    /// between batches, so the batches that start after this returns run
    /// it. If any of that fails, nothing changes: neither the record nor
    /// what runs. The module directory keeps what it holds; a later change
    /// of its file is swapped in as usual.
    ///
    /// Compiles on the calling thread (with an [`EmitTopics`] check, off
    /// the async runtime's threads, as [`Library::reload`]).
    pub fn rollback_running(
        &self,
        projection: &Projection,
        module: &str,
        version: Option<&str>,
    ) -> Result<(String, String), LifecycleError> {
        // The swap lock throughout: no reload or rebuild switch comes
        // between reading the record and replacing the set.
        let mut swap = projection.swap_modules();
        let mut recorded = self.recorded()?;
        let (active, target) = self.rollback_target(&recorded, module, version)?;
        let refused = |source| LifecycleError::RollbackRefused {
            module: module.to_owned(),
            version: target.clone(),
            running: active.clone(),
            source: Box::new(source),
        };
        let loaded = self.load_kept(&recorded, module, &target).map_err(refused)?;
        let mut next: Vec<_> = swap.modules().into_iter().filter(|m| m.name() != module).collect();
        next.push(loaded);
        swap.replace_recorded(next, || {
            recorded.active.insert(module.to_owned(), target.clone());
            self.save(&recorded, Vec::new())
        })
        .map_err(refused)?;
        drop(swap);
        tracing::info!(
            target: RELOAD_LOG_TARGET,
            projection = self.projection,
            module,
            version = target,
            "module rolled back; the next batches run it"
        );
        Ok((active, target))
    }

    /// The (active, target) versions of a rollback of `module` to
    /// `version` (a prefix of a kept one; default: the kept version before
    /// the active one).
    fn rollback_target(
        &self,
        recorded: &Recorded,
        module: &str,
        version: Option<&str>,
    ) -> Result<(String, String), LifecycleError> {
        let Some(active) = recorded.active.get(module).cloned() else {
            return Err(LifecycleError::UnknownModule {
                projection: self.projection.clone(),
                module: module.to_owned(),
                known: recorded.active.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        };
        let kept = recorded.kept.get(module).cloned().unwrap_or_default();
        let target = match version {
            Some(version) => {
                kept.iter().find(|v| v.starts_with(version)).cloned().ok_or_else(|| LifecycleError::UnknownVersion {
                    module: module.to_owned(),
                    version: version.to_owned(),
                    kept: kept.join(", "),
                })?
            }
            None => {
                let position = kept.iter().position(|v| *v == active).unwrap_or(0);
                kept.get(position + 1).cloned().ok_or_else(|| LifecycleError::NothingToRollBackTo {
                    module: module.to_owned(),
                    active: active.clone(),
                })?
            }
        };
        Ok((active, target))
    }

    /// Applies the module directory's changes since the library last
    /// looked at it (at start-up, at the last reload, or when the set was
    /// last replaced as a whole, [`Library::replaced`]) on top of the
    /// modules the projection runs: every new or changed file is loaded and
    /// swapped in on its own (a file that fails leaves its module as it
    /// was, and is tried again at the next reload), every removed file
    /// takes its module out. Returns the modules that changed.
    ///
    /// Each change is recorded before the projection runs it, so the record
    /// is never behind what runs: whoever sees a new module set sees its
    /// versions recorded, and a restart never runs versions older than the
    /// ones that ran.
    ///
    /// Files are compiled without holding the projection's swap lock; if
    /// the set was replaced as a whole meanwhile (a rebuild's promotion or
    /// rollback), nothing prepared before is swapped in: the directory is
    /// looked at again against the baseline that replacement left.
    pub fn reload(&self, projection: &Projection, module_dir: &Path) -> Result<Vec<String>, LifecycleError> {
        let mut changed = Vec::new();
        for _ in 0..RELOAD_ATTEMPTS {
            if self.reload_once(projection, module_dir, &mut changed)? == Reloaded::Done {
                return Ok(changed);
            }
            tracing::info!(
                projection = self.projection,
                "the modules were replaced as a whole while a reload was prepared (a rebuild's promotion or \
                 rollback); looking at the module directory again"
            );
        }
        tracing::warn!(
            projection = self.projection,
            "the modules kept being replaced while reloads were prepared; the directory is looked at again when \
             it next changes"
        );
        Ok(changed)
    }

    /// One pass of [`Library::reload`]: stops as soon as a swap finds the
    /// set replaced by someone else since the pass began.
    fn reload_once(
        &self,
        projection: &Projection,
        module_dir: &Path,
        changed: &mut Vec<String>,
    ) -> Result<Reloaded, LifecycleError> {
        let (mut prepared, seen) = {
            let swap = projection.swap_modules();
            (swap.generation(), self.seen())
        };
        let known = self.unchanged.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Scanned { read: files, unchanged } = scan(module_dir, &known)?;
        let present = |name: &String| files.contains_key(name) || unchanged.contains(name);
        // What `/modules` shows of reloads is about the files still there.
        self.reloads.lock().unwrap_or_else(|e| e.into_inner()).retain(|name, _| present(name));
        self.unchanged.lock().unwrap_or_else(|e| e.into_inner()).retain(|name, _| unchanged.contains(name));
        let gone: Vec<&String> = seen.keys().filter(|name| !present(name)).collect();
        if !gone.is_empty() {
            // Removed files first, so that a module renamed in place (its
            // old name gone, its tags under a new one) loads in this pass.
            match self.remove_gone(projection, &gone, prepared, changed)? {
                Some(generation) => prepared = generation,
                None => return Ok(Reloaded::Superseded),
            }
        }
        for (name, (stamp, read)) in &files {
            let bytes = match read {
                Ok(bytes) => bytes,
                Err(error) => {
                    // That file's failure only: the others are applied.
                    self.refuse_unreadable(name, error);
                    continue;
                }
            };
            let version = content_version(bytes);
            if seen.get(name) == Some(&version) {
                continue;
            }
            match self.reload_file(projection, (name, *stamp, bytes, version), prepared, changed)? {
                Some(generation) => prepared = generation,
                None => return Ok(Reloaded::Superseded),
            }
        }
        Ok(Reloaded::Done)
    }

    /// Takes the modules whose files are `gone` out of the projection, and
    /// forgets their kept copies. Returns the module set's generation
    /// after, or `None` if the set was replaced by someone else since
    /// `prepared`.
    fn remove_gone(
        &self,
        projection: &Projection,
        gone: &[&String],
        mut prepared: u64,
        changed: &mut Vec<String>,
    ) -> Result<Option<u64>, LifecycleError> {
        let mut swap = projection.swap_modules();
        if swap.generation() != prepared {
            return Ok(None);
        }
        let (kept, removed): (Vec<_>, Vec<_>) =
            swap.modules().into_iter().partition(|m| !gone.iter().any(|name| *name == m.name()));
        if !removed.is_empty() {
            swap.replace_recorded(kept, || {
                let mut recorded = self.recorded()?;
                // Nothing runs a removed module any more, nor rolls it
                // back: its kept copies go (a file renamed again and
                // again would otherwise leave a copy under every name).
                let mut forgotten = Vec::new();
                for module in &removed {
                    recorded.active.remove(module.name());
                    for version in recorded.kept.remove(module.name()).unwrap_or_default() {
                        forgotten.push(self.kept_path(&recorded, module.name(), &version));
                    }
                }
                self.save(&recorded, forgotten)
            })?;
        }
        prepared = swap.generation();
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).retain(|name, _| !gone.contains(&name));
        drop(swap);
        for module in removed {
            tracing::info!(
                target: RELOAD_LOG_TARGET,
                projection = self.projection,
                module = module.name(),
                "module file removed; its event types are no longer handled"
            );
            changed.push(module.name().to_owned());
        }
        Ok(Some(prepared))
    }

    /// Loads module file `name` (its `stamp`, `bytes` and their
    /// `version`, not the one seen last) and swaps it in, unless what it
    /// holds already runs; records and reports the outcome. Returns the
    /// module set's generation after, or `None` if the set was replaced by
    /// someone else since `prepared`.
    fn reload_file(
        &self,
        projection: &Projection,
        (name, stamp, bytes, version): (&str, Option<FileStamp>, &[u8], String),
        mut prepared: u64,
        changed: &mut Vec<String>,
    ) -> Result<Option<u64>, LifecycleError> {
        let running =
            |modules: &[Arc<dyn HandlerModule>]| modules.iter().any(|m| m.name() == name && m.version() == version);
        // Compiling takes a while: done before the swap lock is taken.
        let loaded = (!running(&projection.modules())).then(|| self.load(name, bytes));
        let mut swap = projection.swap_modules();
        if swap.generation() != prepared {
            return Ok(None);
        }
        let current = swap.modules();
        let replaces = current.iter().any(|m| m.name() == name);
        let attempt = match loaded {
            Some(Err(error)) => Err(error),
            Some(Ok(module)) if !running(&current) => {
                let mut next: Vec<_> = current.into_iter().filter(|m| m.name() != name).collect();
                next.push(module);
                swap.replace_recorded(next, || {
                    let mut recorded = self.recorded()?;
                    let forgotten = self.activate(&mut recorded, name, &version, bytes)?;
                    self.save(&recorded, forgotten)
                })
                .map(|()| true)
            }
            // Already running (the file holds what runs): nothing to swap.
            _ => Ok(false),
        };
        prepared = swap.generation();
        if attempt.is_ok() {
            self.seen.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_owned(), version.clone());
        }
        // Refused for its bytes, it would be refused again; a clash, a
        // missing emit topic or the host's memory may pass at the next
        // change.
        let for_its_bytes = matches!(&attempt,
            Err(LifecycleError::Projection(ProjectionError::Load(error))) if error.is_of_the_bytes());
        if let Some(trusted) = stamp.and_then(Trusted::new).filter(|_| attempt.is_ok() || for_its_bytes) {
            self.unchanged.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_owned(), trusted);
        }
        drop(swap);
        self.report_reload(name, version, (attempt, replaces), changed);
        Ok(Some(prepared))
    }

    /// Keeps the outcome of reloading module file `name` (at `version`)
    /// for `/modules`, and logs it: swapped in, already running, or
    /// refused (`replaces`: an old version keeps running).
    fn report_reload(
        &self,
        name: &str,
        version: String,
        (attempt, replaces): (Result<bool, LifecycleError>, bool),
        changed: &mut Vec<String>,
    ) {
        let status = ReloadStatus { version: version.clone(), error: attempt.as_ref().err().map(|e| e.to_string()) };
        self.reloads.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_owned(), status);
        match attempt {
            Ok(false) => {}
            Ok(true) => {
                tracing::info!(
                    target: RELOAD_LOG_TARGET,
                    projection = self.projection,
                    module = name,
                    version,
                    "module swapped in"
                );
                changed.push(name.to_owned());
            }
            Err(error) if replaces => tracing::error!(
                projection = self.projection,
                module = name,
                version,
                "the new version is refused, the old one keeps running: {error}"
            ),
            Err(error) => tracing::error!(
                projection = self.projection,
                module = name,
                version,
                "the new module is refused (no version of it runs: its event types stay unhandled): {error}"
            ),
        }
    }

    /// Tells the library that the projection's modules were just replaced
    /// as a whole (a rebuild's promotion or rollback, through `swap`): the
    /// module directory as it is now becomes what later reloads compare
    /// against, so only changes made from now on are applied, on top of
    /// the new set, and a reload prepared before is redone. Returns (and
    /// logs) how the directory differs from the new set.
    pub fn replaced(&self, swap: &ModuleSwap<'_>, module_dir: &Path) -> Vec<Difference> {
        let files = match scan(module_dir, &BTreeMap::new()) {
            Ok(files) => files.read,
            Err(error) => {
                // Without the directory, the new set is the baseline: a
                // later reload applies what differs from it.
                tracing::warn!(projection = self.projection, "reading the module directory: {error}");
                let running = swap.modules().iter().map(|m| (m.name().to_owned(), m.version().to_owned())).collect();
                *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = running;
                self.unchanged.lock().unwrap_or_else(|e| e.into_inner()).clear();
                return Vec::new();
            }
        };
        // A file that could not be read is not taken in: the next reload
        // tries it again.
        let seen: BTreeMap<String, String> = files
            .iter()
            .filter_map(|(name, (_, read))| Some((name.clone(), content_version(read.as_ref().ok()?))))
            .collect();
        let differences = differences(&swap.modules(), &seen);
        for difference in &differences {
            tracing::info!(projection = self.projection, "the modules were replaced as a whole; {difference}");
        }
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = seen;
        // The next reload compares every file with the new set.
        self.unchanged.lock().unwrap_or_else(|e| e.into_inner()).clear();
        differences
    }

    /// Records, counts and logs a module file a reload could not read;
    /// the module keeps running as it was.
    fn refuse_unreadable(&self, name: &str, error: &LifecycleError) {
        self.loads_failed.fetch_add(1, Ordering::Relaxed);
        if let Some(metrics) = &self.metrics {
            metrics.module_loaded(&self.projection, false);
        }
        let status = ReloadStatus { version: String::new(), error: Some(error.to_string()) };
        self.reloads.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_owned(), status);
        tracing::error!(
            projection = self.projection,
            module = name,
            "the module file could not be read and is refused; its module, if one runs, runs on as it was: {error}"
        );
    }

    /// The module directory's versions as the library last took them in.
    fn seen(&self) -> BTreeMap<String, String> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// How many times [`Library::reload`] looks at the directory again when the
/// modules were replaced as a whole while it prepared a swap.
const RELOAD_ATTEMPTS: usize = 3;

/// How a pass of [`Library::reload`] ended.
#[derive(Debug, PartialEq, Eq)]
enum Reloaded {
    /// Every change was applied or refused.
    Done,
    /// The set was replaced as a whole meanwhile; the rest was not applied.
    Superseded,
}

/// How the directory's versions `in_directory` differ from `running`.
fn differences(running: &[Arc<dyn HandlerModule>], in_directory: &BTreeMap<String, String>) -> Vec<Difference> {
    running
        .iter()
        .filter_map(|module| {
            let (name, version) = (module.name().to_owned(), module.version().to_owned());
            match in_directory.get(&name) {
                None => Some(Difference::Missing { module: name, running: version }),
                Some(other) if *other != version => {
                    Some(Difference::Changed { module: name, running: version, in_directory: other.clone() })
                }
                Some(_) => None,
            }
        })
        .collect()
}

/// A check that the topics a module declares it emits to can be written:
/// run on every module a [`Library`] loads.
pub trait EmitTopics: Send + Sync {
    /// Succeeds when every topic `module` declares exists (or was created).
    fn ensure(&self, module: &dyn HandlerModule) -> Result<(), LifecycleError>;
}

/// Checks emit topics against a log, creating missing ones with
/// `create` partitions when the operator asked for it
/// (`--create-emit-topics`).
///
/// [`Library`] loads modules on blocking threads, so this waits for the log
/// on `runtime`; call [`Library::start`] and [`Library::reload`] off the
/// async runtime's threads (e.g. in `spawn_blocking`).
pub struct LogEmitTopics<L> {
    /// The log.
    pub log: Arc<L>,
    /// How missing topics are created; `None` makes a missing topic an
    /// error.
    pub create: Option<CreateTopics>,
    /// The runtime the log's calls run on.
    pub runtime: tokio::runtime::Handle,
}

impl<L: EventLog> EmitTopics for LogEmitTopics<L> {
    fn ensure(&self, module: &dyn HandlerModule) -> Result<(), LifecycleError> {
        self.runtime.block_on(ensure_emit_topics(&*self.log, module, self.create.as_ref()))
    }
}

/// How a host creates the emit topics modules declare and the log lacks
/// (`--create-emit-topics`): with `partitions` partitions each, and at
/// most [`CreateTopics::DEFAULT_LIMIT`] of them while it runs
/// (`emit-topics-created`), so that module versions which each declare new
/// topics cannot make the log hold topics without end.
#[derive(Debug)]
pub struct CreateTopics {
    partitions: u32,
    limit: usize,
    created: AtomicUsize,
}

impl CreateTopics {
    /// The most topics a host creates while it runs: four modules' worth
    /// of the most emit topics one may declare.
    pub const DEFAULT_LIMIT: usize = 256;

    /// Topics of `partitions` partitions, at most [`Self::DEFAULT_LIMIT`].
    pub fn new(partitions: u32) -> Self {
        Self::with_limit(partitions, Self::DEFAULT_LIMIT)
    }

    /// Topics of `partitions` partitions, at most `limit`.
    pub fn with_limit(partitions: u32, limit: usize) -> Self {
        Self { partitions, limit, created: AtomicUsize::new(0) }
    }

    /// Takes one topic of the limit; false when none is left.
    fn take_one(&self) -> bool {
        self.created.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < self.limit).then_some(n + 1)).is_ok()
    }
}

/// Checks that every topic `module` declares it emits to exists in `log`
/// and keeps what it acknowledges ([`crate::storage::log::loss::require_durable`]);
/// creates a missing one as `create` says (durable), or fails naming it.
pub async fn ensure_emit_topics(
    log: &impl EventLog,
    module: &dyn HandlerModule,
    create: Option<&CreateTopics>,
) -> Result<(), LifecycleError> {
    let failed = |topic: &str, source| LifecycleError::EmitTopicLog {
        module: module.name().to_owned(),
        topic: topic.to_owned(),
        source,
    };
    for topic in module.emits() {
        match (log.partitions(topic).await, create) {
            // One the host did not create may lose what modules emit.
            (Ok(_), _) => {
                crate::storage::log::loss::require_durable(log, topic, crate::storage::log::loss::TopicRole::Emit)
                    .await
                    .map_err(|error| failed(topic, error))?;
            }
            (Err(LogError::TopicNotFound { .. }), Some(create)) => {
                if !create.take_one() {
                    return Err(LifecycleError::EmitTopicsCreated {
                        module: module.name().to_owned(),
                        topic: topic.clone(),
                        limit: create.limit,
                    });
                }
                let partitions = create.partitions;
                if let Err(error) = log.create_topic(topic, partitions).await {
                    create.created.fetch_sub(1, Ordering::SeqCst);
                    return Err(failed(topic, error));
                }
                tracing::info!(module = module.name(), topic, partitions, "created emit topic");
            }
            (Err(LogError::TopicNotFound { .. }), None) => {
                return Err(LifecycleError::MissingEmitTopic {
                    module: module.name().to_owned(),
                    topic: topic.clone(),
                });
            }
            (Err(error), _) => return Err(failed(topic, error)),
        }
    }
    Ok(())
}

/// The `*.wasm` files of `dir` by module name (the file stem): each one's
/// bytes, or why it could not be read (a file too large, not a regular
/// file, unreadable: that file's failure, the others are read on), with
/// its stamp; but a file whose stamp `known` trusts is not read, only
/// named among the unchanged. Those read hold at most
/// [`MAX_MODULE_DIR_BYTES`](crate::sandbox::runtime::component_file::MAX_MODULE_DIR_BYTES)
/// in all, and a directory of more than
/// [`MAX_MODULES`](crate::sandbox::runtime::component_file::MAX_MODULES) files is
/// refused before any is read.
fn scan(dir: &Path, known: &BTreeMap<String, Trusted>) -> Result<Scanned, LifecycleError> {
    let io = |what, path: &Path| {
        let path = path.to_owned();
        move |source| LifecycleError::Io { what, path, source }
    };
    let paths = module_paths(dir).map_err(io("reading the module directory", dir))?;
    let (mut scanned, mut total) = (Scanned::default(), 0);
    for path in paths {
        let name = path.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_default();
        let stamp = FileStamp::of(&path);
        if known.get(&name).is_some_and(|known| known.holds(stamp)) {
            scanned.unchanged.push(name);
            continue;
        }
        let read = read_component(&path).map_err(io("reading", &path));
        if let Ok(bytes) = &read {
            total += bytes.len() as u64;
            check_module_dir_size(total).map_err(|e| io("reading the module directory", dir)(e.into()))?;
        }
        scanned.read.insert(name, (stamp, read));
    }
    Ok(scanned)
}

/// What [`scan`] found.
#[derive(Default)]
struct Scanned {
    /// The files read, by module name.
    read: BTreeMap<String, ReadFile>,
    /// The modules whose files were not read: as they were.
    unchanged: Vec<String>,
}

/// A module file's stamp (taken before reading) and its bytes, or why they
/// could not be read.
type ReadFile = (Option<FileStamp>, Result<Vec<u8>, LifecycleError>);

/// What tells a file that changed from one that did not, without reading
/// it: its size, modification and change times, and inode (a file renamed
/// over it is another). Taken before a read, so a write during the read
/// leaves a stamp that no longer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: std::time::SystemTime,
    changed: std::time::SystemTime,
    #[cfg(unix)]
    inode: (u64, u64),
}

/// A stamp a reload trusts to say its file did not change: one whose
/// times were already [`SETTLED_AFTER`] old when it was taken (a write in
/// the same tick of the file system's clock, or through a memory mapping,
/// may leave the times as they were), for at most [`TRUSTED_FOR`] (past
/// it, the file is read again at the next reload).
#[derive(Debug, Clone, Copy)]
struct Trusted {
    stamp: FileStamp,
    until: std::time::Instant,
}

/// How old a stamp's times must be before it is trusted.
const SETTLED_AFTER: Duration = Duration::from_secs(2);
/// How long a stamp is trusted.
const TRUSTED_FOR: Duration = Duration::from_secs(60);

impl Trusted {
    /// `stamp`, trusted from now if its times are settled.
    fn new(stamp: FileStamp) -> Option<Self> {
        let settled = |time: std::time::SystemTime| time.elapsed().is_ok_and(|age| age >= SETTLED_AFTER);
        (settled(stamp.modified) && settled(stamp.changed))
            .then(|| Self { stamp, until: std::time::Instant::now() + TRUSTED_FOR })
    }

    /// Whether `stamp`, taken now, says the file is as it was.
    fn holds(&self, stamp: Option<FileStamp>) -> bool {
        stamp == Some(self.stamp) && std::time::Instant::now() < self.until
    }
}

impl FileStamp {
    /// The stamp of the file at `path` (symlinks followed), if the file
    /// system tells.
    fn of(path: &Path) -> Option<Self> {
        let metadata = std::fs::metadata(path).ok()?;
        let modified = metadata.modified().ok()?;
        #[cfg(unix)]
        use std::os::unix::fs::MetadataExt;
        #[cfg(unix)]
        let changed = std::time::UNIX_EPOCH
            .checked_add(Duration::new(metadata.ctime().try_into().ok()?, metadata.ctime_nsec().try_into().ok()?))?;
        #[cfg(not(unix))]
        let changed = modified;
        Some(Self {
            len: metadata.len(),
            modified,
            changed,
            #[cfg(unix)]
            inode: (metadata.dev(), metadata.ino()),
        })
    }
}

/// The files [`scan`] read, or the first that could not be read: at
/// start-up every module file must be usable.
fn all_read(files: BTreeMap<String, ReadFile>) -> Result<BTreeMap<String, Vec<u8>>, LifecycleError> {
    files.into_iter().map(|(name, (_, read))| Ok((name, read?))).collect()
}

/// Watches a projection's module directory and swaps changed modules in.
/// Dropping it stops the watching.
pub struct Reloader {
    _watcher: notify::RecommendedWatcher,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Reloader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Reloader {
    /// How long the directory must be quiet before a reload, so a file
    /// being copied is read once it is complete.
    pub const SETTLE: Duration = Duration::from_millis(50);

    /// Starts watching `module_dir` for `projection`. Must be called inside
    /// a tokio runtime.
    pub fn watch(
        library: Arc<Library>,
        projection: Arc<Projection>,
        module_dir: &Path,
    ) -> Result<Self, LifecycleError> {
        use notify::Watcher;
        // Changes are coalesced: however many come while a reload runs,
        // one more reload follows.
        let changed = Arc::new(tokio::sync::Notify::new());
        let signal = changed.clone();
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // Only a module file's change reloads (a stream of changes to
            // other files would have every module read and hashed again);
            // an event without paths (the watcher lost track) does too.
            let wasm = |path: &PathBuf| path.extension().is_some_and(|ext| ext == "wasm");
            if event.is_ok_and(|e| !e.kind.is_access() && (e.paths.is_empty() || e.paths.iter().any(wasm))) {
                signal.notify_one();
            }
        })
        .map_err(|e| watch_error(module_dir, e))?;
        watcher.watch(module_dir, notify::RecursiveMode::NonRecursive).map_err(|e| watch_error(module_dir, e))?;
        let dir = module_dir.to_owned();
        let task = tokio::spawn(async move {
            loop {
                changed.notified().await;
                // Wait until the directory has been quiet for a moment.
                while tokio::time::timeout(Self::SETTLE, changed.notified()).await.is_ok() {}
                let (library, projection, dir) = (library.clone(), projection.clone(), dir.clone());
                let reloaded = tokio::task::spawn_blocking(move || library.reload(&projection, &dir)).await;
                match reloaded {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => tracing::error!("reloading modules failed: {error}"),
                    Err(panic) => tracing::error!("reloading modules panicked: {panic}"),
                }
            }
        });
        Ok(Self { _watcher: watcher, task })
    }
}

fn watch_error(dir: &Path, error: notify::Error) -> LifecycleError {
    LifecycleError::Io { what: "watching", path: dir.to_owned(), source: std::io::Error::other(error) }
}
