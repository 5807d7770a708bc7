//! `waku dev`: a guest's sources watched, rebuilt on change, and swapped
//! into a running local projection.
//!
//! Rules it keeps:
//! - **The real host.** The projection runs in a host started as `waku
//!   run` starts one ([`crate::operations::host::Host`]): an embedded log and state in
//!   a data directory, the module [`Library`] (recorded versions, emit
//!   topics created as needed), a consumer following the topic. A new build is swapped in by the library's hot
//!   reload ([`Library::reload`]), between batches, nothing lost or applied
//!   twice.
//! - **The previous version keeps running** when a build fails or the new
//!   component is refused at load; the error is reported
//!   ([`DevEvent::BuildFailed`], [`DevEvent::Refused`]) and the next change
//!   tries again. A build that is the running component again (a change
//!   that compiled to the same bytes) says so ([`DevEvent::Unchanged`]).
//! - **Sample events** (`events`) are published at start, again after
//!   every swap, so each version shows what it does with them, and again
//!   when the file itself changes (without a build). State accumulates
//!   over the runs, as it is one projection, and every swap says so
//!   ([`DevEvent::Swapped`]); a fresh data directory shows one version
//!   alone.
//! - **Watching starts first**, before the first build: an edit made while
//!   it builds, or as soon as [`DevEvent::Started`] says the sources are
//!   watched, starts the next build.
//! - **Only sources count.** Changes under `target/`, hidden directories,
//!   `__pycache__`, the data directory, `*.wasm` files and `Cargo.lock` do
//!   not start a build (builds write there). Changes are collected until the
//!   sources have been quiet for [`SETTLE`], so a save of several files
//!   builds once.
//!
//! What happens is reported as [`DevEvent`]s; the module's own log lines go
//! through `tracing` (target `waku::guest`) as in `waku run`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::authoring::guest_build::{BuildError, GuestBuild};
use crate::authoring::publish::{self, PublishError};
use crate::operations::host::{Host, HostError, HostSettings, ModuleSource, RunningHost};
use crate::operations::lifecycle::{Library, LifecycleError};
use crate::sandbox::handler::HandlerModule;
use crate::storage::log::{EmbeddedLog, LogError};

/// How long the sources must be quiet before a build.
pub const SETTLE: Duration = Duration::from_millis(200);

/// What `waku dev` runs.
#[derive(Debug, Clone)]
pub struct DevSettings {
    /// The guest: a crate or a Python project.
    pub guest_dir: PathBuf,
    /// The topic the projection consumes.
    pub topic: String,
    /// Its partitions, when the topic is created.
    pub partitions: u32,
    /// The projection's name; `None`: the module's.
    pub projection: Option<String>,
    /// The embedded log, the state and the module directory.
    pub data_dir: PathBuf,
    /// Sample events (JSON lines) published at start and after each swap.
    pub events: Option<PathBuf>,
    /// The build's target directory (`None`: the guest's default).
    pub target_dir: Option<PathBuf>,
    /// Serve the admin endpoint (state, status, modules) here.
    pub admin: Option<std::net::SocketAddr>,
    /// The token it asks for on every route but `/health` and `/ready`
    /// (`None`: open, which only a loopback address allows).
    pub admin_token: Option<crate::operations::admin::AdminToken>,
    /// A token it takes for reading only (the console's pages, not its
    /// actions).
    pub admin_read_token: Option<crate::operations::admin::AdminToken>,
    /// Serve it without a token off loopback all the same.
    pub admin_insecure: bool,
    /// Serve it over TLS with this certificate and key.
    pub admin_tls: Option<crate::operations::admin::AdminTls>,
}

/// What `waku dev` did, for the person watching.
#[derive(Debug)]
#[non_exhaustive]
pub enum DevEvent {
    /// The first build runs; the projection follows the topic.
    Started {
        /// The projection.
        projection: String,
        /// The module and its version.
        module: String,
        /// The data directory.
        data_dir: PathBuf,
        /// The admin endpoint's URL (`http://…` or `https://…`), if it serves.
        admin: Option<String>,
    },
    /// Sources changed; building.
    Rebuilding {
        /// One of the changed files.
        changed: PathBuf,
    },
    /// The new version runs.
    Swapped {
        /// The module and its new version.
        module: String,
    },
    /// The build is the very component that runs (a change that built to
    /// the same bytes, such as a comment): nothing is swapped in.
    Unchanged {
        /// The running module and its version.
        module: String,
    },
    /// The build failed; the previous version keeps running.
    BuildFailed(BuildError),
    /// The new component was refused at load; the previous version keeps
    /// running.
    Refused {
        /// Why.
        error: String,
    },
    /// The sample events file changed (and nothing else did): published
    /// again, with no build.
    EventsChanged {
        /// The file.
        file: PathBuf,
    },
    /// Sample events were published.
    Published {
        /// How many.
        events: usize,
    },
    /// Publishing the sample events failed (they are checked against each
    /// new version); the projection goes on.
    PublishFailed(DevError),
}

impl std::fmt::Display for DevEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Started { projection, module, data_dir, admin } => {
                write!(f, "projection `{projection}` runs {module} (data in {}", data_dir.display())?;
                if let Some(address) = admin {
                    write!(f, ", admin endpoint on {address}")?;
                }
                write!(f, "); watching the sources")
            }
            Self::Rebuilding { changed } => write!(f, "{} changed; building", changed.display()),
            Self::Swapped { module } => write!(
                f,
                "swapped in {module} (it goes on from the state earlier versions built: one projection; for this \
                 version alone, start again without --data)"
            ),
            Self::Unchanged { module } => {
                write!(f, "the build is the running version {module}; nothing to swap in")
            }
            Self::EventsChanged { file } => write!(f, "{} changed; publishing the sample events again", file.display()),
            Self::BuildFailed(error) => write!(f, "the build failed, the previous version keeps running: {error}"),
            Self::Refused { error } => write!(f, "the new version is refused, the previous one keeps running: {error}"),
            Self::Published { events } => write!(f, "published {events} sample events"),
            Self::PublishFailed(error) => write!(f, "the sample events were not published: {error}"),
        }
    }
}

/// Why `waku dev` stopped (or could not start).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DevError {
    /// The first build failed.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// A file could not be read, copied or watched.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The sample events are bad.
    #[error("{}: {error}", file.display())]
    Events {
        /// The file.
        file: PathBuf,
        /// What is wrong, with the line.
        error: PublishError,
    },
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The module could not be reloaded or recorded.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// The host could not start, or stopped with an error.
    #[error(transparent)]
    Host(#[from] HostError),
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DevError {
    let path = path.to_owned();
    move |source| DevError::Io { what, path, source }
}

/// The running parts of a dev session.
struct Session {
    settings: DevSettings,
    host: RunningHost<EmbeddedLog>,
    library: Arc<Library>,
    module_dir: PathBuf,
    report: Arc<dyn Fn(DevEvent) + Send + Sync>,
}

/// Builds the guest, runs it in a projection and swaps in every new build
/// of its sources until `shutdown` resolves, calling `started` with the
/// host once it runs; what it returns is kept until the host is asked to
/// stop (the command line serves its local endpoint so). Must run inside a
/// tokio runtime with more than one thread.
pub async fn run_with<G>(
    settings: DevSettings,
    report: impl Fn(DevEvent) + Send + Sync + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
    started: impl FnOnce(&RunningHost<EmbeddedLog>) -> G,
) -> Result<(), DevError> {
    let report: Arc<dyn Fn(DevEvent) + Send + Sync> = Arc::new(report);
    // Watching starts before anything is built or reported: an edit made
    // during the first build, or as soon as the person reads that the
    // sources are watched, is built next instead of lost.
    let changes = SourceChanges::watch(&settings)?;
    let built = build(&settings).await?;
    let name = built.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_else(|| "module".into());
    let projection = settings.projection.clone().unwrap_or_else(|| name.clone());
    let module_dir = settings.data_dir.join("dev-modules");
    std::fs::create_dir_all(&module_dir).map_err(io("creating", &module_dir))?;
    install(&built, &module_dir, &name)?;

    // The host of `waku run`, over the module directory this session
    // writes; it swaps new builds in itself, right after installing them.
    let source = ModuleSource::Directory { path: module_dir.clone(), adopt: true, watch: false };
    let mut host_settings = HostSettings::new(&settings.data_dir, &projection, &settings.topic, source);
    host_settings.create_topic = Some(settings.partitions);
    host_settings.create_emit_topics = Some(settings.partitions);
    host_settings.admin = settings.admin;
    host_settings.admin_token = settings.admin_token.clone();
    host_settings.admin_read_token = settings.admin_read_token.clone();
    host_settings.admin_insecure = settings.admin_insecure;
    host_settings.admin_tls = settings.admin_tls.clone();
    let log = Arc::new(EmbeddedLog::open(settings.data_dir.join("log.redb"))?);
    let host = Host::start_on(log, host_settings).await?;
    let library = host.library().expect("a host of a module directory has a library").clone();
    let kept = started(&host);
    let session = Session { settings, host, library, module_dir, report };
    (session.report)(DevEvent::Started {
        projection,
        module: session.running(&name),
        data_dir: session.settings.data_dir.clone(),
        admin: session.host.admin_address().map(|address| {
            let scheme = if session.host.serves_admin_tls() { "https" } else { "http" };
            format!("{scheme}://{address}")
        }),
    });
    session.publish_events().await;

    tokio::pin!(shutdown);
    let result = tokio::select! {
        () = &mut shutdown => Ok(()),
        result = session.rebuild_on(changes, name.clone()) => result,
    };
    drop(kept);
    session.host.stop().await?;
    result
}

/// Builds the guest off the async runtime's threads.
async fn build(settings: &DevSettings) -> Result<PathBuf, BuildError> {
    let build = GuestBuild { target_dir: settings.target_dir.clone(), ..GuestBuild::new(&settings.guest_dir) };
    tokio::task::spawn_blocking(move || build.run()).await.expect("a build does not panic")
}

/// Copies a built component into the module directory as `<name>.wasm`,
/// whole (written beside it and renamed).
fn install(built: &Path, module_dir: &Path, name: &str) -> Result<(), DevError> {
    let partial = module_dir.join(format!(".{name}.wasm.partial"));
    std::fs::copy(built, &partial).map_err(io("copying the component to", &partial))?;
    let target = module_dir.join(format!("{name}.wasm"));
    std::fs::rename(&partial, &target).map_err(io("moving the component to", &target))
}

impl Session {
    /// `name@version` of the running module.
    fn running(&self, name: &str) -> String {
        let modules = self.host.projection().modules();
        let module = modules.iter().find(|m| m.name() == name).or(modules.first());
        module.map_or_else(|| name.to_owned(), |m| format!("{}@{}", m.name(), m.version()))
    }

    /// Publishes the sample events, if any, with the running module's
    /// headers; a failure is reported, never fatal.
    async fn publish_events(&self) {
        let Some(file) = &self.settings.events else { return };
        let Some(module) = self.host.projection().modules().into_iter().next() else { return };
        match self.publish_with(file, module).await {
            Ok(events) => (self.report)(DevEvent::Published { events }),
            Err(error) => (self.report)(DevEvent::PublishFailed(error)),
        }
    }

    async fn publish_with(&self, file: &Path, module: Arc<dyn HandlerModule>) -> Result<usize, DevError> {
        let text = std::fs::read_to_string(file).map_err(io("reading", file))?;
        let bad = |error| DevError::Events { file: file.to_owned(), error };
        let events = publish::parse_json_lines(&text, &*module).map_err(bad)?;
        let lines = publish::event_lines(&text);
        publish::publish(&**self.host.log(), &self.settings.topic, module, events, Some(lines), 1).await.map_err(bad)
    }

    /// Rebuilds and swaps on every settled change of the sources.
    /// Returns only when the watcher stops.
    async fn rebuild_on(&self, mut changes: SourceChanges, name: String) -> Result<(), DevError> {
        let rx = &mut changes.changed;
        let events = self.settings.events.as_deref().and_then(|file| std::path::absolute(file).ok());
        let is_events = |path: &Path| events.as_deref() == Some(path);
        while let Some(mut changed) = rx.recv().await {
            let mut only_events = is_events(&changed);
            // Editors save through temporary files: name one that is there.
            while let Ok(Some(path)) = tokio::time::timeout(SETTLE, rx.recv()).await {
                only_events &= is_events(&path);
                if path.exists() || !changed.exists() {
                    changed = path;
                }
            }
            if only_events {
                (self.report)(DevEvent::EventsChanged { file: changed });
                self.publish_events().await;
                continue;
            }
            (self.report)(DevEvent::Rebuilding { changed });
            let built = match build(&self.settings).await {
                Ok(built) => built,
                Err(error) => {
                    (self.report)(DevEvent::BuildFailed(error));
                    continue;
                }
            };
            self.swap(&built, &name).await?;
        }
        Ok(())
    }

    /// Installs a new build and reloads it into the projection.
    async fn swap(&self, built: &Path, name: &str) -> Result<(), DevError> {
        let before = self.running(name);
        install(built, &self.module_dir, name)?;
        let (library, projection, dir) =
            (self.library.clone(), self.host.projection().clone(), self.module_dir.clone());
        tokio::task::spawn_blocking(move || library.reload(&projection, &dir))
            .await
            .expect("a reload does not panic")?;
        match self.library.reloads().get(name).and_then(|status| status.error.clone()) {
            Some(error) => (self.report)(DevEvent::Refused { error }),
            None if self.running(name) == before => (self.report)(DevEvent::Unchanged { module: before }),
            None => {
                (self.report)(DevEvent::Swapped { module: self.running(name) });
                self.publish_events().await;
            }
        }
        Ok(())
    }
}

/// The guest's source files that changed, as the watcher reports them
/// (paths [`Ignored`] covers left out), from the moment it was created.
struct SourceChanges {
    /// Kept alive: dropping it ends the watching.
    _watcher: notify::RecommendedWatcher,
    changed: tokio::sync::mpsc::UnboundedReceiver<PathBuf>,
}

impl SourceChanges {
    /// Starts watching the guest directory, recursively.
    fn watch(settings: &DevSettings) -> Result<Self, DevError> {
        use notify::Watcher;
        let guest_dir = std::path::absolute(&settings.guest_dir).map_err(io("resolving", &settings.guest_dir))?;
        let ignored = Ignored::new(&guest_dir, settings);
        let (tx, changed) = tokio::sync::mpsc::unbounded_channel::<PathBuf>();
        let watch_error = |e: notify::Error| DevError::Io {
            what: "watching",
            path: guest_dir.clone(),
            source: std::io::Error::other(e),
        };
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            if event.kind.is_access() {
                return;
            }
            for path in event.paths.into_iter().filter(|path| !ignored.covers(path)) {
                let _ = tx.send(path);
            }
        })
        .map_err(watch_error)?;
        watcher.watch(&guest_dir, notify::RecursiveMode::Recursive).map_err(watch_error)?;
        Ok(Self { _watcher: watcher, changed })
    }
}

/// The paths whose changes do not start a build.
struct Ignored {
    guest_dir: PathBuf,
    data_dir: Option<PathBuf>,
}

impl Ignored {
    fn new(guest_dir: &Path, settings: &DevSettings) -> Self {
        Self { guest_dir: guest_dir.to_owned(), data_dir: std::path::absolute(&settings.data_dir).ok() }
    }

    fn covers(&self, path: &Path) -> bool {
        if self.data_dir.as_ref().is_some_and(|data| path.starts_with(data)) {
            return true;
        }
        // What builds write: components, and cargo's lock file (it changes
        // only with Cargo.toml, which counts).
        if path.extension().is_some_and(|ext| ext == "wasm") || path.file_name().is_some_and(|n| n == "Cargo.lock") {
            return true;
        }
        let inside = path.strip_prefix(&self.guest_dir).unwrap_or(path);
        inside.components().any(|part| {
            let part = part.as_os_str().to_string_lossy();
            part == "target" || part == "__pycache__" || part == "node_modules" || part.starts_with('.')
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_outputs_and_the_data_directory_start_no_build() {
        let settings = DevSettings {
            guest_dir: "/p".into(),
            topic: "t".into(),
            partitions: 1,
            projection: None,
            data_dir: "/p/dev-data".into(),
            events: None,
            target_dir: None,
            admin_token: None,
            admin_read_token: None,
            admin_insecure: false,
            admin_tls: None,
            admin: None,
        };
        let ignored = Ignored::new(Path::new("/p"), &settings);
        let built = ["/p/target/release/x.rlib", "/p/.git/index", "/p/pkg/__pycache__/a.pyc", "/p/dev-data/log.redb"];
        for path in built.into_iter().chain(["/p/node_modules/esbuild/bin/esbuild"]) {
            assert!(ignored.covers(Path::new(path)), "{path}");
        }
        assert!(ignored.covers(Path::new("/p/visits.wasm")) && ignored.covers(Path::new("/p/Cargo.lock")));
        for path in
            ["/p/src/lib.rs", "/p/Cargo.toml", "/p/handler.py", "/p/handler.ts", "/p/vendor/wakuwaku/core/src/key.rs"]
        {
            assert!(!ignored.covers(Path::new(path)), "{path}");
        }
        // A checkout under a hidden directory still counts.
        let hidden = Ignored::new(Path::new("/home/me/.work/p"), &settings);
        assert!(!hidden.covers(Path::new("/home/me/.work/p/src/lib.rs")));
    }
}
