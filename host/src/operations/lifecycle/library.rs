//! [`Library`]: a projection's module versions: which version of each
//! module it runs, the record of them with its state, their kept copies,
//! and the ways a version becomes the one running: start-up (the recorded
//! versions, or the directory's with `adopt`), rollback, and hot reload.
//!
//! Rules kept here (the folder's doc, [`super`], states them in full):
//! - **A restart runs the recorded versions from their kept copies**, and
//!   reports how the directory differs ([`Difference`]); a new file that
//!   fails at a restart is refused alone, as a hot reload would refuse it.
//! - **A change is recorded before the projection runs it** (through
//!   [`ModuleSwap::replace_recorded`]), so the record is never behind what
//!   runs, and a refused change leaves both as they were.
//! - **A reload prepared before the set was replaced as a whole never lands
//!   on it**: every swap checks the set's generation, and the directory is
//!   looked at again ([`RELOAD_ATTEMPTS`] times at most).
//! - **Every load is counted** ([`Library::load_counts`], and the metrics),
//!   and every refusal is kept for `/modules` ([`Library::reloads`]).
//!
//! What it builds on lives beside it: the record ([`Recorded`]), the
//! directory read ([`scan`]), what reloads remember ([`ReloadMemory`]), the
//! emit topic check ([`EmitTopics`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::difference::{Difference, differences};
use super::record::{Recorded, keep_copy};
use super::reload::{RELOAD_ATTEMPTS, ReloadMemory, ReloadStatus, Reloaded};
use super::scan::{FileStamp, Scanned, Trusted, all_read, scan};
use super::{EmitTopics, LifecycleError, RELOAD_LOG_TARGET};
use crate::engine::metrics::Metrics;
use crate::engine::projection::{ModuleSwap, Projection, ProjectionError};
use crate::sandbox::handler::HandlerModule;
use crate::sandbox::runtime::{Sandbox, content_version, read_component};
use crate::storage::state::StateStore;

/// The modules to run at start-up, and how the directory differs from
/// what runs.
pub type Started = (Vec<Arc<dyn HandlerModule>>, Vec<Difference>);

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
    /// What hot reload remembers of the module directory.
    memory: ReloadMemory,
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
            memory: ReloadMemory::default(),
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
        Recorded::read(&self.store, &self.copies)
    }

    /// Saves `recorded`, then deletes the `forgotten` kept copies
    /// ([`Recorded::save`]).
    fn save(&self, recorded: &Recorded, forgotten: Vec<PathBuf>) -> Result<(), LifecycleError> {
        recorded.save(&self.store, forgotten)
    }

    /// Module loads that succeeded and failed since start-up.
    pub fn load_counts(&self) -> (u64, u64) {
        (self.loads_ok.load(Ordering::Relaxed), self.loads_failed.load(Ordering::Relaxed))
    }

    /// The last reload attempt of each module file.
    pub fn reloads(&self) -> BTreeMap<String, ReloadStatus> {
        self.memory.statuses()
    }

    /// The kept copy of `version` of `module` for `recorded` (as
    /// [`Library::recorded`] returns it: with its copies directory).
    fn kept_path(&self, recorded: &Recorded, module: &str, version: &str) -> PathBuf {
        recorded.kept_path(&self.data, &self.copies, module, version)
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
    /// `recorded`; versions past [`super::KEPT_VERSIONS`] are forgotten: returns
    /// their copies, for [`Library::save`] to delete.
    fn activate(
        &self,
        recorded: &mut Recorded,
        (name, version, action): (&str, &str, &str),
        bytes: &[u8],
    ) -> Result<Vec<PathBuf>, LifecycleError> {
        keep_copy(&self.kept_path(recorded, name, version), bytes)?;
        if recorded.active.get(name).is_none_or(|active| active != version) {
            recorded.swapped(name, version, action);
        }
        let forgotten = recorded.make_active(name, version);
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
                    forgotten.extend(self.activate(&mut recorded, (name, &version, "start"), bytes)?);
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
                    forgotten.extend(self.activate(&mut recorded, (name, &version, "start"), bytes)?);
                    modules.push(module);
                }
                Err(error) => {
                    let error = error.to_string();
                    let status = ReloadStatus { version: version.clone(), error: Some(error.clone()) };
                    self.memory.report(name, status);
                    differences.push(Difference::Refused { module: name.clone(), version, error });
                    refused.push(name);
                }
            }
        }
        self.save(&recorded, forgotten)?;
        // A refused file is tried again at the next change, as on reload.
        self.memory.set_seen(
            files
                .iter()
                .filter(|(name, _)| !refused.contains(name))
                .map(|(name, bytes)| (name.clone(), content_version(bytes)))
                .collect(),
        );
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
        let (active, target) = recorded.rollback_target(&self.projection, module, version)?;
        // Loading it proves the kept copy is intact before it is recorded.
        self.load_kept(&recorded, module, &target)?;
        // Keep the rolled-back-from version, so rolling forward is possible.
        recorded.active.insert(module.to_owned(), target.clone());
        recorded.swapped(module, &target, "rollback");
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
        let (active, target) = recorded.rollback_target(&self.projection, module, version)?;
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
            recorded.swapped(module, &target, "rollback");
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
            (swap.generation(), self.memory.seen())
        };
        let Scanned { read: files, unchanged } = scan(module_dir, &self.memory.trusted())?;
        let present = |name: &String| files.contains_key(name) || unchanged.contains(name);
        // What `/modules` shows of reloads is about the files still there.
        self.memory.keep_statuses_of(present);
        self.memory.keep_trusting(&unchanged);
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
                    for version in recorded.forget(module.name()) {
                        forgotten.push(self.kept_path(&recorded, module.name(), &version));
                    }
                }
                self.save(&recorded, forgotten)
            })?;
        }
        prepared = swap.generation();
        self.memory.forget_gone(gone);
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
                    let forgotten = self.activate(&mut recorded, (name, &version, "reload"), bytes)?;
                    self.save(&recorded, forgotten)
                })
                .map(|()| true)
            }
            // Already running (the file holds what runs): nothing to swap.
            _ => Ok(false),
        };
        prepared = swap.generation();
        if attempt.is_ok() {
            self.memory.took_in(name, version.clone());
        }
        // Refused for its bytes, it would be refused again; a clash, a
        // missing emit topic or the host's memory may pass at the next
        // change.
        let for_its_bytes = matches!(&attempt,
            Err(LifecycleError::Projection(ProjectionError::Load(error))) if error.is_of_the_bytes());
        if let Some(trusted) = stamp.and_then(Trusted::new).filter(|_| attempt.is_ok() || for_its_bytes) {
            self.memory.trust(name, trusted);
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
        self.memory.report(name, status);
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
                self.memory.set_seen(running);
                self.memory.distrust_all();
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
        self.memory.set_seen(seen);
        // The next reload compares every file with the new set.
        self.memory.distrust_all();
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
        self.memory.report(name, status);
        tracing::error!(
            projection = self.projection,
            module = name,
            "the module file could not be read and is refused; its module, if one runs, runs on as it was: {error}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake_module::FakeModule;
    use super::*;
    use crate::sandbox::runtime::SandboxLimits;

    struct Dirs {
        root: tempfile::TempDir,
    }

    impl Dirs {
        fn new() -> Self {
            let root = tempfile::tempdir().unwrap();
            std::fs::create_dir(root.path().join("modules")).unwrap();
            Self { root }
        }

        fn modules(&self) -> PathBuf {
            self.root.path().join("modules")
        }

        fn library(&self) -> Library {
            let store = StateStore::open(&self.root.path().join("bank.redb")).unwrap();
            Library::new(self.root.path(), "bank", store, Sandbox::new(SandboxLimits::default()).unwrap())
        }

        /// The bank projection running `modules`, with a store of its own.
        fn projection(&self, modules: Vec<Arc<dyn HandlerModule>>) -> Projection {
            let store = StateStore::open(&self.root.path().join("bank-state.redb")).unwrap();
            Projection::new("bank", "accounts", modules, store).unwrap()
        }
    }

    fn names(modules: &[Arc<dyn HandlerModule>]) -> Vec<String> {
        modules.iter().map(|m| m.name().to_owned()).collect()
    }

    #[test]
    fn a_first_start_without_a_module_is_refused() {
        let dirs = Dirs::new();
        let refused = dirs.library().start(&dirs.modules(), false).err().expect("nothing to run");
        assert!(matches!(&refused, LifecycleError::NoModules { projection, .. } if projection == "bank"), "{refused}");
    }

    #[test]
    fn a_file_that_does_not_load_at_the_first_start_fails_it_and_is_counted() {
        let dirs = Dirs::new();
        std::fs::write(dirs.modules().join("bank.wasm"), b"not a component").unwrap();
        let library = dirs.library();
        let refused = library.start(&dirs.modules(), false).err().expect("the only file does not load");
        assert!(matches!(refused, LifecycleError::Projection(ProjectionError::Load(_))), "{refused}");
        assert_eq!(library.load_counts(), (0, 1));
        assert!(library.recorded().unwrap().active.is_empty(), "nothing recorded");
    }

    #[test]
    fn a_rollback_of_a_module_never_recorded_is_refused() {
        let dirs = Dirs::new();
        let refused = dirs.library().rollback("fees", None).unwrap_err();
        assert!(matches!(refused, LifecycleError::UnknownModule { module, .. } if module == "fees"));
    }

    #[test]
    fn a_tag_clash_names_the_module_first_there_and_the_newcomer() {
        let library = Dirs::new().library();
        let others = [FakeModule::new("bank", "b1").handling(&[1, 2]).shared()];
        let clash = library.clash(&others, &FakeModule::new("fees", "f1").handling(&[3, 2]));
        let Some(LifecycleError::Projection(ProjectionError::DuplicateTag { tag, first, second, .. })) = clash else {
            panic!("a clash on tag 2: {clash:?}");
        };
        assert_eq!((tag.get(), first.as_str(), second.as_str()), (2, "bank", "fees"));
        assert!(library.clash(&others, &FakeModule::new("fees", "f1").handling(&[3])).is_none());
    }

    #[test]
    fn a_reload_applies_only_what_changed_since_the_set_was_replaced() {
        let dirs = Dirs::new();
        let library = dirs.library();
        let bank = FakeModule::new("bank", "b1").handling(&[1]).shared();
        let fees = FakeModule::new("fees", "f1").handling(&[2]).shared();
        let projection = dirs.projection(vec![bank, fees]);
        let file = dirs.modules().join("bank.wasm");
        std::fs::write(&file, b"not a component").unwrap();

        let differences = library.replaced(&projection.swap_modules(), &dirs.modules());
        let in_directory = content_version(b"not a component");
        assert_eq!(
            differences,
            [
                Difference::Changed { module: "bank".into(), running: "b1".into(), in_directory },
                Difference::Missing { module: "fees".into(), running: "f1".into() },
            ]
        );
        // The directory as it was is the baseline: nothing to apply.
        assert!(library.reload(&projection, &dirs.modules()).unwrap().is_empty());
        assert_eq!(library.load_counts(), (0, 0), "nothing loaded");

        // A change that does not load is refused; the old version runs on.
        std::fs::write(&file, b"still not a component").unwrap();
        assert!(library.reload(&projection, &dirs.modules()).unwrap().is_empty());
        assert_eq!(library.load_counts(), (0, 1));
        let status = &library.reloads()["bank"];
        assert_eq!(status.version, content_version(b"still not a component"));
        assert!(status.error.is_some());
        assert_eq!(projection.modules()[0].version(), "b1");

        // A removed file takes its module out, and its status with it.
        std::fs::remove_file(&file).unwrap();
        assert_eq!(library.reload(&projection, &dirs.modules()).unwrap(), ["bank"]);
        assert_eq!(names(&projection.modules()), ["fees"]);
        assert!(library.reloads().is_empty());
    }
}
