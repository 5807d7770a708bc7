//! One running host, assembled from one settings value.
//!
//! A host is the sandbox, the projection's library of modules (recorded
//! versions, kept copies, compile cache), the projection itself, its
//! consumer, the reloader that watches the module directory, and the admin
//! endpoint. [`Host::start`] puts them together from a [`HostSettings`] and
//! starts consuming; the [`RunningHost`] it returns is how the caller
//! watches it ([`RunningHost::progress`], [`RunningHost::status`]) and ends
//! it ([`RunningHost::stop`], [`RunningHost::stop_when`],
//! [`RunningHost::finished`]). `waku run`, `waku demo` and the tests start a
//! host this way instead of wiring the parts by hand.
//!
//! Rules it keeps:
//! - Nothing is consumed before every module loaded and the projection was
//!   put together; a failure there is returned and nothing runs.
//! - **A start that fails on its settings creates nothing.** The settings
//!   and the topics (they must exist unless [`HostSettings::create_topic`]
//!   creates them) are checked before the data directory, the embedded
//!   log, the projection's state or the compile cache is made and before
//!   any module is compiled.
//! - A host holds its projection's state for the run
//!   ([`crate::storage::state::StateBackend::hold_for_run`]): `waku reset` is
//!   refused meanwhile, and a host does not start during a reset.
//! - Stopping finishes and commits the batch in flight, then stops the
//!   admin endpoint; dropping a [`RunningHost`] asks the same, without
//!   waiting.
//! - Modules from a directory go through the projection's [`Library`]: a
//!   restart runs the recorded versions unless
//!   [`ModuleSource::Directory::adopt`] says otherwise, and what differs is
//!   reported in [`RunningHost::differences`].
//! - Every module loaded, at start-up or on reload, must find the topics it
//!   declares it emits to (or they are created with
//!   [`HostSettings::create_emit_topics`] partitions).
//! - A host that follows an embedded store with modules from a directory
//!   runs rebuilds ([`crate::operations::rebuild`]): its consumer belongs to the
//!   rebuild conductor, which pauses it between two batches to switch the
//!   projection's state and modules; every part of the host reads the
//!   state through one handle, so all of them see the switch at once.
//!
//! ```no_run
//! # async fn example() -> Result<(), wakuwaku::operations::host::HostError> {
//! use wakuwaku::operations::host::{Host, HostSettings, ModuleSource};
//!
//! let mut settings = HostSettings::new("waku-data", "bank", "accounts", ModuleSource::directory("modules"));
//! settings.until_caught_up = true;
//! let host = Host::start(settings).await?;
//! let summary = host.finished().await?;
//! println!("{} events applied", summary.applied);
//! # Ok(()) }
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::engine::consumer::{CallObserver, Consumer, ConsumerConfig, ConsumerError, Summary};
use crate::engine::metrics::Metrics;
use crate::engine::progress::Progress;
use crate::engine::projection::{Projection, ProjectionError};
use crate::engine::telemetry::{Telemetry, TelemetryError};
use crate::operations::admin::{self, Admin, Status};
use crate::operations::lifecycle::{
    CreateTopics, Difference, EmitTopics, Library, LifecycleError, LogEmitTopics, Reloader, ensure_emit_topics,
};
use crate::operations::rebuild::conductor::{Conductor, RebuildStatus, RebuildWatch};
use crate::operations::rebuild::stores::SwitchingStore;
use crate::operations::rebuild::{RebuildError, RebuildPaths};
use crate::sandbox::handler::HandlerModule;
use crate::sandbox::runtime::{LoadError, Sandbox, SandboxLimits};
use crate::storage::log::{AnyLog, EmbeddedLog, EventLog, IggyLog, LogError};
use crate::storage::state::{PostgresStore, StateError, StateStore};

/// Everything a host needs to start; [`HostSettings::new`] lists the
/// defaults.
#[derive(Clone)]
pub struct HostSettings {
    /// The data directory: the embedded log (`log.redb`), the projection's
    /// state (`projections/<projection>.redb`), kept module versions
    /// (`modules/<projection>/`) and the compile cache (`cache/`).
    pub data: PathBuf,
    /// Which log to consume. Default: the embedded log in [`Self::data`].
    pub log: LogSettings,
    /// Where the projection's state lives. Default: the embedded store in
    /// [`Self::data`].
    pub state: StateSettings,
    /// The projection's name (its state file is named after it).
    pub projection: String,
    /// The topic it consumes.
    pub topic: String,
    /// Further topics it consumes, co-partitioned with `topic`: the
    /// projection then reads a partition index across all of them in
    /// event-time order ([`crate::engine::consumer`]). Default: none.
    pub more_topics: Vec<String>,
    /// Where its modules come from.
    pub modules: ModuleSource,
    /// Create the consumed topic with this many partitions if missing (an
    /// existing one must have as many). Default `None`: a missing topic is
    /// an error.
    pub create_topic: Option<u32>,
    /// Create a topic a module declares it emits to with this many
    /// partitions if missing, at most
    /// [`CreateTopics::DEFAULT_LIMIT`] while the host runs. Default
    /// `None`: a missing emit topic refuses the module.
    pub create_emit_topics: Option<u32>,
    /// Modules named by OCI reference, pulled into the module directory of
    /// [`ModuleSource::Directory`] before it is loaded ([`crate::operations::oci::pins`]).
    /// Default: none.
    pub module_refs: Vec<crate::operations::oci::ModuleRef>,
    /// Where compiled modules are kept. Default: `<data>/cache`.
    pub compile_cache: CompileCache,
    /// The most bytes the compile cache keeps; the least recently used
    /// entries past it are removed ([`Sandbox::with_compile_cache_max_bytes`]).
    /// Default: [`crate::sandbox::runtime::DEFAULT_COMPILE_CACHE_MAX_BYTES`] (1 GiB).
    pub compile_cache_max_bytes: u64,
    /// With [`StateSettings::Postgres`]: the most the store keeps in memory
    /// of the state of the partitions this host holds, and the most a batch
    /// loads ([`crate::storage::state::cache`]). Default
    /// [`crate::storage::state::cache::DEFAULT_CACHE_BYTES`] (64 MiB); 0 reads every
    /// entry with a query of its own.
    pub state_cache_bytes: usize,
    /// What one module instance may use. Default: [`SandboxLimits::default`].
    pub limits: SandboxLimits,
    /// How the consumer polls, executes and retries, and what a module may
    /// hand the host (`consumer.payload`, which the sandbox applies too).
    /// Default: [`ConsumerConfig::default`].
    pub consumer: ConsumerConfig,
    /// Serve the admin endpoint on this address (port 0 picks one; see
    /// [`RunningHost::admin_address`]). Default `None`.
    pub admin: Option<SocketAddr>,
    /// The token the admin endpoint asks for on every route but `/health`
    /// and `/ready` ([`admin::AdminToken`]). Default `None`: open.
    pub admin_token: Option<admin::AdminToken>,
    /// Serve the admin endpoint without a token on an address other than
    /// loopback, which is refused otherwise
    /// ([`HostError::AdminUnprotected`]): anyone who reaches the address
    /// reads the state. Default `false`.
    pub admin_insecure: bool,
    /// A token the admin endpoint takes for reading only (its routes, the
    /// console's pages), never for the console's actions
    /// ([`Admin::read_token`]). Default `None`.
    pub admin_read_token: Option<admin::AdminToken>,
    /// Serve the admin endpoint over TLS with this certificate and key
    /// ([`admin::AdminTls`]). Default `None`: plain HTTP.
    pub admin_tls: Option<admin::AdminTls>,
    /// Stop once the end offsets read at start-up are reached. Default
    /// `false`: follow the topic until stopped.
    pub until_caught_up: bool,
    /// Hold the partitions this Iggy consumer group assigns, following
    /// changes ([`crate::engine::membership`]), instead of `consumer.partitions`;
    /// needs [`StateSettings::Postgres`]. Applies while following (not
    /// with `until_caught_up`).
    pub group: Option<String>,
    /// Told of every run handled (tests check the order of calls with it).
    /// Default `None`.
    pub observer: Option<Arc<dyn CallObserver>>,
    /// Export OpenTelemetry spans and metrics as the `OTEL_*` variables of
    /// the process say ([`crate::engine::telemetry`]): nothing unless they name an
    /// endpoint. Default `false`: none, whatever they say (`waku run` and
    /// `waku demo` set it).
    pub telemetry_from_env: bool,
}

impl HostSettings {
    /// The topics the projection reads: [`Self::topic`], then
    /// [`Self::more_topics`].
    pub fn topics(&self) -> Vec<String> {
        std::iter::once(&self.topic).chain(&self.more_topics).cloned().collect()
    }

    /// Settings for `projection` over `topic` with its modules from
    /// `modules`, data in `data`, and every other setting at its default:
    /// the embedded log, no topic created, the compile cache in
    /// `<data>/cache`, the library's limits, [`ConsumerConfig::default`], no
    /// admin endpoint, following the topic until stopped, no observer.
    pub fn new(data: impl Into<PathBuf>, projection: &str, topic: &str, modules: ModuleSource) -> Self {
        Self {
            data: data.into(),
            log: LogSettings::Embedded,
            state: StateSettings::Embedded,
            projection: projection.to_owned(),
            topic: topic.to_owned(),
            more_topics: Vec::new(),
            modules,
            create_topic: None,
            create_emit_topics: None,
            module_refs: Vec::new(),
            compile_cache: CompileCache::InData,
            compile_cache_max_bytes: crate::sandbox::runtime::DEFAULT_COMPILE_CACHE_MAX_BYTES,
            state_cache_bytes: crate::storage::state::cache::DEFAULT_CACHE_BYTES,
            limits: SandboxLimits::default(),
            consumer: ConsumerConfig::default(),
            admin: None,
            admin_token: None,
            admin_insecure: false,
            admin_read_token: None,
            admin_tls: None,
            until_caught_up: false,
            group: None,
            observer: None,
            telemetry_from_env: false,
        }
    }

    /// The sandbox these settings run modules in: [`Self::limits`], the
    /// payload limits of [`Self::consumer`], and the compile cache. Load
    /// modules for [`ModuleSource::Loaded`] with it.
    pub fn sandbox(&self) -> Result<Sandbox, HostError> {
        let sandbox = Sandbox::new(self.limits)?
            .with_payload_limits(self.consumer.payload)
            .with_compile_cache_max_bytes(self.compile_cache_max_bytes);
        Ok(match &self.compile_cache {
            CompileCache::InData => sandbox.with_compile_cache(&self.data.join("cache")),
            CompileCache::At(dir) => sandbox.with_compile_cache(dir),
            CompileCache::Off => sandbox,
        })
    }

    /// The projection's state store ([`open_state`]); on PostgreSQL it
    /// names this host for the group's other members with its admin
    /// address, when it serves one (`https://` before it over TLS).
    pub fn open_state(&self) -> Result<StateStore, HostError> {
        let admin = self.admin.map(|address| match self.admin_tls {
            Some(_) => format!("https://{address}"),
            None => address.to_string(),
        });
        open_state_named(&self.data, &self.state, &self.projection, self.state_cache_bytes, admin.as_deref())
    }
}

/// Where a projection's state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateSettings {
    /// The embedded store: `<data>/projections/<projection>.redb`.
    Embedded,
    /// A PostgreSQL database, `postgres://user:password@host:port/db`,
    /// which several hosts may share ([`crate::storage::state::postgres`]).
    Postgres {
        /// The database URL.
        url: String,
    },
}

/// The state store of `projection`: in the data directory `data`, or in
/// the database `state` names (its schema created or migrated on the way).
pub fn open_state(data: &Path, state: &StateSettings, projection: &str) -> Result<StateStore, HostError> {
    open_state_cached(data, state, projection, crate::storage::state::cache::DEFAULT_CACHE_BYTES)
}

/// [`open_state`] keeping at most `cache_bytes` of a PostgreSQL store's
/// state in memory ([`crate::storage::state::cache`]; the embedded store keeps none).
pub fn open_state_cached(
    data: &Path,
    state: &StateSettings,
    projection: &str,
    cache_bytes: usize,
) -> Result<StateStore, HostError> {
    open_state_named(data, state, projection, cache_bytes, None)
}

/// [`open_state_cached`], a PostgreSQL store naming this host with its
/// admin address `admin`, if any.
fn open_state_named(
    data: &Path,
    state: &StateSettings,
    projection: &str,
    cache_bytes: usize,
    admin: Option<&str>,
) -> Result<StateStore, HostError> {
    crate::storage::log::check_projection_name(projection)
        .map_err(|source| HostError::ProjectionName { projection: projection.to_owned(), source })?;
    let opened = match state {
        StateSettings::Embedded => {
            // A promoted rebuild moved the projection to another store.
            let active = RebuildPaths::new(data, projection)
                .active_store()
                .map_err(|source| HostError::Rebuild { projection: projection.to_owned(), source })?;
            StateStore::open(&data.join(active))
        }
        StateSettings::Postgres { url } => PostgresStore::connect(url, projection).map(|store| {
            if let Some(admin) = admin {
                store.name_member_with_admin(admin);
            }
            StateStore::from_backend(store.with_cache_bytes(cache_bytes))
        }),
    };
    opened.map_err(|source| HostError::State { projection: projection.to_owned(), source })
}

/// Which log a host reads and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogSettings {
    /// The embedded log, `<data>/log.redb`.
    Embedded,
    /// An Apache Iggy server.
    Iggy {
        /// `iggy://user:password@host:port`, client options may follow.
        url: String,
        /// The stream holding the topics (created if missing).
        stream: String,
        /// Create topics with the server's defaults (which lose messages
        /// acknowledged but not yet written when the server crashes)
        /// instead of durable ones, and accept appending retry, dead-letter
        /// and emit records to topics that may lose them, with a warning
        /// ([`IggyLog::with_lossy_topics`]). Default `false`.
        lossy_topics: bool,
    },
}

impl LogSettings {
    /// Opens the log (for the embedded one, in `data`).
    pub async fn open(&self, data: &Path) -> Result<AnyLog, HostError> {
        match self {
            Self::Iggy { url, stream, lossy_topics } => IggyLog::connect(url, stream)
                .await
                .map(|log| {
                    if *lossy_topics {
                        tracing::warn!(
                            "--lossy-topics: topics are created with the Iggy server's defaults, and retry, \
                             dead-letter and emit topics that may lose acknowledged messages are accepted; a crash \
                             of the server can lose events"
                        );
                    }
                    AnyLog::Iggy(log.with_lossy_topics(*lossy_topics))
                })
                .map_err(|source| HostError::Iggy { stream: stream.clone(), source }),
            Self::Embedded => {
                let path = data.join("log.redb");
                EmbeddedLog::open(&path).map(AnyLog::Embedded).map_err(|source| HostError::EmbeddedLog { path, source })
            }
        }
    }

    /// The log as OpenTelemetry's `messaging.system` names it: `iggy`, or
    /// `waku-embedded` for the embedded log.
    pub fn messaging_system(&self) -> &'static str {
        match self {
            Self::Iggy { .. } => "iggy",
            Self::Embedded => "waku-embedded",
        }
    }
}

/// Where compiled modules are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompileCache {
    /// `<data>/cache`.
    InData,
    /// This directory.
    At(PathBuf),
    /// Nowhere: every module is compiled at load.
    Off,
}

/// Where a host's modules come from.
#[derive(Clone)]
pub enum ModuleSource {
    /// The `*.wasm` files of a directory, through the projection's
    /// [`Library`] (versions recorded and kept, hot reload).
    Directory {
        /// The directory.
        path: PathBuf,
        /// Run the directory's versions even where the projection recorded
        /// others (by default a restart runs the recorded versions).
        adopt: bool,
        /// Watch the directory and swap changed modules in between batches.
        watch: bool,
    },
    /// Modules already loaded (with [`HostSettings::sandbox`]); no versions
    /// are recorded and nothing is watched.
    Loaded(Vec<Arc<dyn HandlerModule>>),
}

impl ModuleSource {
    /// The modules of `path`, watched, recorded versions first.
    pub fn directory(path: impl Into<PathBuf>) -> Self {
        Self::Directory { path: path.into(), adopt: false, watch: true }
    }
}

impl HostError {
    /// Whether another process holds the embedded log or the state store
    /// (a `waku run` of this data directory, a `waku reset`).
    pub fn is_in_use(&self) -> bool {
        matches!(
            self,
            Self::EmbeddedLog { source: LogError::InUse { .. }, .. }
                | Self::State { source: StateError::InUse { .. }, .. }
        )
    }
}

/// Why a host could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The embedded log could not be opened.
    #[error("opening the embedded log {}", path.display())]
    EmbeddedLog {
        /// Its file.
        path: PathBuf,
        /// Why.
        #[source]
        source: LogError,
    },
    /// The Iggy server could not be reached or refused the stream.
    #[error("connecting to Iggy, stream `{stream}`")]
    Iggy {
        /// The stream.
        stream: String,
        /// Why.
        #[source]
        source: LogError,
    },
    /// The projection's name cannot name a state file.
    #[error("`{projection}` cannot name a projection")]
    ProjectionName {
        /// The name.
        projection: String,
        /// The rule it breaks.
        #[source]
        source: LogError,
    },
    /// A topic named as untimed is not one of the projection's topics, or
    /// the projection has one topic only (the processing-time clock is for
    /// a projection over several).
    #[error(
        "--untimed-topic `{topic}` is not one of the topics of a projection over several (`{}`): name one of them, \
         or leave the flag out",
        topics.join("`, `")
    )]
    UntimedTopic {
        /// The topic named.
        topic: String,
        /// The projection's topics.
        topics: Vec<String>,
    },
    /// The projection's state store could not be opened.
    #[error("opening the state of projection `{projection}`")]
    State {
        /// The projection.
        projection: String,
        /// Why.
        #[source]
        source: StateError,
    },
    /// The projection's rebuild files could not be read.
    #[error("reading the rebuild files of projection `{projection}`")]
    Rebuild {
        /// The projection.
        projection: String,
        /// Why.
        #[source]
        source: RebuildError,
    },
    /// The sandbox could not be built (invalid limits).
    #[error(transparent)]
    Sandbox(#[from] LoadError),
    /// A module could not be loaded, recorded or watched.
    #[error(transparent)]
    Modules(#[from] LifecycleError),
    /// A module named by OCI reference could not be pulled or pinned.
    #[error(transparent)]
    ModuleRefs(#[from] crate::operations::oci::pins::PinError),
    /// The modules do not make a projection (tags clash).
    #[error(transparent)]
    Projection(#[from] ProjectionError),
    /// The consumed topic could not be created.
    #[error("creating topic `{topic}`")]
    CreateTopic {
        /// The topic.
        topic: String,
        /// Why.
        #[source]
        source: LogError,
    },
    /// The admin endpoint could not be bound.
    #[error(transparent)]
    Admin(#[from] std::io::Error),
    /// The admin endpoint was to serve a non-loopback address without a
    /// token.
    #[error(
        "refusing to serve the admin endpoint on {address} without a token: anyone who reaches it would read the \
         state; give a token (--admin-token-file <FILE> or WAKU_ADMIN_TOKEN), bind a loopback address \
         (127.0.0.1), or pass --admin-insecure to serve it open"
    )]
    AdminUnprotected {
        /// The address.
        address: SocketAddr,
    },
    /// Consuming failed.
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
    /// A consumer group was asked for without a state store the hosts
    /// share.
    #[error(
        "consumer group `{group}` needs the state in PostgreSQL (--state postgres://…): the group moves partitions \
         between hosts, and a partition's state must follow it, which a local state file cannot"
    )]
    GroupNeedsSharedState {
        /// The group.
        group: String,
    },
    /// The consumer group could not be joined.
    #[error("joining consumer group `{group}` of topic `{topic}`")]
    Group {
        /// The group.
        group: String,
        /// The topic.
        topic: String,
        /// Why.
        #[source]
        source: LogError,
    },
    /// OpenTelemetry export could not start (the `OTEL_*` variables).
    #[error("starting OpenTelemetry export (the `OTEL_*` variables)")]
    Telemetry(#[from] TelemetryError),
    /// A task of the host panicked.
    #[error("{what} panicked: {message}")]
    Panicked {
        /// Which task.
        what: &'static str,
        /// The panic.
        message: String,
    },
}

/// Starts hosts.
pub struct Host;

impl Host {
    /// Opens the log of `settings` and starts a host on it.
    pub async fn start(settings: HostSettings) -> Result<RunningHost<AnyLog>, HostError> {
        check_settings(&settings)?;
        settings.sandbox()?;
        // A new embedded log holds no topic: refused before the data
        // directory and the log are made, unless asked to create the topics.
        if matches!(settings.log, LogSettings::Embedded)
            && settings.create_topic.is_none()
            && !settings.data.join("log.redb").is_file()
        {
            let missing = LogError::TopicNotFound { topic: settings.topic.clone() };
            return Err(HostError::Consumer(missing.into()));
        }
        let log = Arc::new(settings.log.open(&settings.data).await?);
        Self::start_on(log, settings).await
    }

    /// Starts a host on `log`, which the caller opened (and may use beside
    /// it, e.g. to publish); [`HostSettings::log`] is not used. Must be
    /// called inside a tokio runtime.
    pub async fn start_on<L: EventLog>(log: Arc<L>, settings: HostSettings) -> Result<RunningHost<L>, HostError> {
        check_settings(&settings)?;
        let sandbox = settings.sandbox()?;
        check_topics(&*log, &settings).await?;
        let metrics = Arc::new(Metrics::default());
        let made = NewProjectionFiles::before(&settings);
        let opened = async {
            let (store, rebuilds) = open_store(&settings)?;
            let loaded = load_modules(&log, &settings, &sandbox, &store, &metrics).await?;
            Ok::<_, HostError>((store, rebuilds, loaded))
        };
        let (store, rebuilds, loaded) = match opened.await {
            Ok(opened) => opened,
            Err(error) => {
                made.remove();
                return Err(error);
            }
        };
        let projection = Projection::new(&settings.projection, &settings.topic, loaded.modules, store)?;
        let projection = Arc::new(projection.with_more_topics(&settings.more_topics)?);
        let reloader = match (&settings.modules, &loaded.library) {
            (ModuleSource::Directory { path, watch: true, .. }, Some(library)) => {
                Some(Reloader::watch(library.clone(), projection.clone(), path)?)
            }
            _ => None,
        };
        if let Some(partitions) = settings.create_topic {
            for topic in projection.topics() {
                log.create_topic(topic, partitions)
                    .await
                    .map_err(|source| HostError::CreateTopic { topic: topic.clone(), source })?;
            }
        }
        let telemetry = start_telemetry(&settings).await?;
        let (consumer, membership) = consumer_for(&log, &projection, &settings, &metrics, &telemetry).await?;
        let progress = consumer.progress();
        let timing = consumer.timing();
        let rebuild_watch = rebuilds.as_ref().map(|_| Arc::new(RebuildWatch::default()));
        let admin_tls = settings.admin.is_some() && settings.admin_tls.is_some();
        let (stop_admin, admin_address) = match settings.admin {
            None => (None, None),
            Some(address) => {
                let admin = Admin {
                    log: log.clone(),
                    projection: projection.clone(),
                    progress: progress.clone(),
                    metrics: metrics.clone(),
                    library: loaded.library.clone(),
                    rebuild: rebuild_watch.clone(),
                    token: settings.admin_token.clone(),
                    read_token: settings.admin_read_token.clone(),
                    timing: Some(timing.clone()),
                };
                let (stop, address) = serve_admin(address, admin, settings.admin_tls.clone()).await?;
                (Some(stop), Some(address))
            }
        };
        let conductor = match (rebuilds, &rebuild_watch, &loaded.library) {
            (Some((switching, module_dir)), Some(watch), Some(library)) => Some(Conductor {
                log: log.clone(),
                live: consumer.clone(),
                projection: projection.clone(),
                switching,
                module_dir,
                library: library.clone(),
                data: settings.data.clone(),
                sandbox: sandbox.clone(),
                config: settings.consumer.clone(),
                emit_topics: emit_topics(&log, &settings),
                watch: watch.clone(),
            }),
            _ => None,
        };
        let (stop, consuming) = spawn_consuming(consumer, conductor, settings.until_caught_up);
        Ok(RunningHost {
            log,
            projection,
            library: loaded.library,
            metrics,
            progress,
            timing,
            sandbox,
            differences: loaded.differences,
            admin_address,
            admin_tls,
            rebuild: rebuild_watch,
            stop: Some(stop),
            stop_admin,
            consuming: Some(consuming),
            membership,
            telemetry,
            _reloader: reloader,
        })
    }
}

/// Every topic the projection consumes must exist unless the settings
/// create them ([`HostSettings::create_topic`]): checked before the state
/// store is opened (which creates it) and any module compiled, so a
/// misspelt topic leaves nothing behind.
async fn check_topics<L: EventLog>(log: &L, settings: &HostSettings) -> Result<(), HostError> {
    if settings.create_topic.is_some() {
        return Ok(());
    }
    for topic in std::iter::once(&settings.topic).chain(&settings.more_topics) {
        log.partitions(topic).await.map_err(ConsumerError::from)?;
    }
    Ok(())
}

/// The settings a host refuses before it opens or creates anything: their
/// combinations, the projection's name, a module directory it cannot read.
fn check_settings(settings: &HostSettings) -> Result<(), HostError> {
    crate::storage::log::check_projection_name(&settings.projection)
        .map_err(|source| HostError::ProjectionName { projection: settings.projection.clone(), source })?;
    // A directory modules are pulled into (`--module-ref`) may not exist
    // yet: the pull creates it.
    if let ModuleSource::Directory { path, .. } = &settings.modules
        && (settings.module_refs.is_empty() || path.exists())
    {
        crate::sandbox::runtime::component_file::module_paths(path).map_err(|source| LifecycleError::Io {
            what: "reading the module directory",
            path: path.clone(),
            source,
        })?;
    }
    if let Some(address) = settings.admin
        && settings.admin_token.is_none()
        && !settings.admin_insecure
        && !address.ip().is_loopback()
    {
        return Err(HostError::AdminUnprotected { address });
    }
    let topics = settings.topics();
    if let Some(topic) =
        settings.consumer.untimed_topics.iter().find(|topic| topics.len() < 2 || !topics.contains(topic))
    {
        return Err(HostError::UntimedTopic { topic: topic.clone(), topics });
    }
    if let (Some(group), StateSettings::Embedded) = (&settings.group, &settings.state) {
        return Err(HostError::GroupNeedsSharedState { group: group.clone() });
    }
    Ok(())
}

/// The consumer of `projection`, and its place in the consumer group when
/// the settings name one.
async fn consumer_for<L: EventLog>(
    log: &Arc<L>,
    projection: &Arc<Projection>,
    settings: &HostSettings,
    metrics: &Arc<Metrics>,
    telemetry: &Option<Telemetry>,
) -> Result<(Consumer<L>, Option<crate::engine::membership::Membership>), HostError> {
    let mut consumer = Consumer::new(log.clone(), projection.clone(), settings.consumer.clone())
        .with_metrics(metrics.clone())
        .with_telemetry(telemetry.clone());
    if let Some(observer) = &settings.observer {
        consumer = consumer.with_observer(observer.clone());
    }
    let mut membership = None;
    if let Some(group) = &settings.group {
        let (assigned, member) = crate::engine::membership::follow_group(log.clone(), &settings.topic, group)
            .await
            .map_err(|source| HostError::Group { group: group.clone(), topic: settings.topic.clone(), source })?;
        consumer = consumer.with_assignment(assigned);
        membership = Some(member);
    }
    Ok((consumer, membership))
}

/// A store held for this run, and, for a host that can rebuild in the
/// shadow, the switching store its parts share and the module directory.
type OpenedStore = (StateStore, Option<(SwitchingStore, PathBuf)>);

/// The files and folders a start makes for a new embedded projection
/// (its state file, its rebuild folder, their parents), removed again when
/// the start fails while opening the state or loading the modules (a
/// `--module-ref` a registry cannot serve): a failed start leaves nothing
/// behind.
struct NewProjectionFiles(Vec<(PathBuf, bool)>);

impl NewProjectionFiles {
    /// Those of `settings` that do not exist yet, each with whether it is
    /// the projection's own (removed whole) or a shared parent (removed
    /// only when empty); inner ones first.
    fn before(settings: &HostSettings) -> Self {
        let (rebuilds, projections) = (settings.data.join("rebuilds"), settings.data.join("projections"));
        let mut paths = vec![(rebuilds.join(&settings.projection), true), (rebuilds, false)];
        if matches!(settings.state, StateSettings::Embedded) {
            paths.insert(0, (projections.join(format!("{}.redb", settings.projection)), true));
            paths.push((projections, false));
        }
        Self(paths.into_iter().filter(|(path, _)| !path.exists()).collect())
    }

    /// Removes what exists of them now.
    fn remove(self) {
        for (path, own) in self.0 {
            let _ = match (path.is_dir(), own) {
                (true, true) => std::fs::remove_dir_all(&path),
                (true, false) => std::fs::remove_dir(&path),
                (false, _) => std::fs::remove_file(&path),
            };
        }
    }
}

/// Opens the state of `settings` and holds it for the run.
fn open_store(settings: &HostSettings) -> Result<OpenedStore, HostError> {
    let store = settings.open_state()?;
    // A reset of the projection is refused while this host runs it.
    store.hold_for_run().map_err(|source| HostError::State { projection: settings.projection.clone(), source })?;
    // A host that follows an embedded store, its modules from a
    // directory, can rebuild in the shadow (over one topic or several):
    // every part of it shares one store handle that promotion switches.
    // Its topics are noted, so that `waku rebuild` refuses a request naming
    // others instead of asking a host that would refuse it.
    RebuildPaths::new(&settings.data, &settings.projection)
        .note_topics(&settings.topics())
        .map_err(|source| HostError::Rebuild { projection: settings.projection.clone(), source })?;
    let rebuilds = match (&settings.state, &settings.modules, settings.until_caught_up) {
        (StateSettings::Embedded, ModuleSource::Directory { path, .. }, false) => {
            Some((SwitchingStore::new(store.clone()), path.clone()))
        }
        _ => None,
    };
    let store = rebuilds.as_ref().map_or(store, |(switching, _)| StateStore::from_backend(switching.clone()));
    Ok((store, rebuilds))
}

/// OpenTelemetry export, when the settings ask for it from the `OTEL_*`
/// variables.
async fn start_telemetry(settings: &HostSettings) -> Result<Option<Telemetry>, HostError> {
    if !settings.telemetry_from_env {
        return Ok(None);
    }
    // It builds an HTTP client that blocks: off the runtime's threads.
    let system = settings.log.messaging_system();
    Ok(tokio::task::spawn_blocking(move || Telemetry::from_env(system))
        .await
        .map_err(|e| HostError::Panicked { what: "starting OpenTelemetry", message: e.to_string() })??)
}

/// Runs the consumer (through the rebuild conductor when there is one)
/// until the returned sender is dropped; returns it and the task.
fn spawn_consuming<L: EventLog>(
    consumer: Consumer<L>,
    conductor: Option<Conductor<L>>,
    until_caught_up: bool,
) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<Result<Summary, ConsumerError>>) {
    // Dropping the sender (with the host) stops the consumer too.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopped = async {
        let _ = stopped.await;
    };
    let consuming = tokio::spawn(async move {
        match (conductor, until_caught_up) {
            (Some(conductor), _) => conductor.run(stopped).await,
            (None, true) => consumer.catch_up_or_stop(stopped).await,
            (None, false) => consumer.follow(stopped).await,
        }
    });
    (stop, consuming)
}

/// What [`load_modules`] found.
struct Loaded {
    modules: Vec<Arc<dyn HandlerModule>>,
    /// For modules from a directory.
    library: Option<Arc<Library>>,
    differences: Vec<Difference>,
}

/// The modules of `settings`, each checked for its emit topics: from a
/// directory through the projection's library (recorded versions first),
/// or as loaded.
async fn load_modules<L: EventLog>(
    log: &Arc<L>,
    settings: &HostSettings,
    sandbox: &Sandbox,
    store: &StateStore,
    metrics: &Arc<Metrics>,
) -> Result<Loaded, HostError> {
    let (path, adopt) = match &settings.modules {
        ModuleSource::Directory { path, adopt, .. } => (path.clone(), *adopt),
        ModuleSource::Loaded(modules) => {
            let create = settings.create_emit_topics.map(CreateTopics::new);
            for module in modules {
                ensure_emit_topics(&**log, &**module, create.as_ref()).await?;
            }
            return Ok(Loaded { modules: modules.clone(), library: None, differences: Vec::new() });
        }
    };
    // Every module loaded, now or on reload, must find its emit topics.
    let library = Arc::new(
        Library::new(&settings.data, &settings.projection, store.clone(), sandbox.clone())
            .with_metrics(metrics.clone())
            .with_emit_topics(emit_topics(log, settings)),
    );
    // Loading compiles and asks the log about emit topics: off the async
    // runtime's threads.
    let synced = match settings.module_refs.is_empty() {
        true => None,
        false => Some(crate::operations::oci::pins::sync(store, &path, &settings.module_refs, adopt, sandbox).await?),
    };
    for note in synced.iter().flat_map(|synced| &synced.notes) {
        tracing::warn!(projection = settings.projection, "{}", wakuwaku_core::terminal::printable(note));
    }
    let starting = library.clone();
    let adopted = synced.as_ref().map(|synced| synced.adopt.clone()).unwrap_or_default();
    let (modules, differences) =
        tokio::task::spawn_blocking(move || starting.start_adopting(&path, &|name| adopt || adopted.contains(name)))
            .await
            .map_err(|e| HostError::Panicked { what: "loading the modules", message: e.to_string() })??;
    // Pinned once the library recorded the versions they name.
    if let Some(synced) = synced {
        crate::operations::oci::pins::save(store, &synced.pins)?;
    }
    Ok(Loaded { modules, library: Some(library), differences })
}

/// The check every module a library loads passes: its emit topics exist
/// (or are created with [`HostSettings::create_emit_topics`] partitions).
fn emit_topics<L: EventLog>(log: &Arc<L>, settings: &HostSettings) -> Arc<dyn EmitTopics> {
    Arc::new(LogEmitTopics {
        log: log.clone(),
        create: settings.create_emit_topics.map(CreateTopics::new),
        runtime: tokio::runtime::Handle::current(),
    })
}

/// Serves `admin` on `address` until the returned sender is dropped;
/// returns it and the address bound (port 0 picks one).
async fn serve_admin<L: EventLog>(
    address: SocketAddr,
    admin: Admin<L>,
    tls: Option<admin::AdminTls>,
) -> Result<(tokio::sync::oneshot::Sender<()>, SocketAddr), HostError> {
    let listener = admin::bind(address).await?;
    let address = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let stopped = async {
            let _ = stopped.await;
        };
        if let Err(error) = admin::serve(listener, admin, tls, stopped).await {
            tracing::error!("the admin endpoint stopped: {error}");
        }
    });
    Ok((stop, address))
}

/// A host that consumes; see the [module docs](self).
pub struct RunningHost<L = AnyLog> {
    log: Arc<L>,
    projection: Arc<Projection>,
    library: Option<Arc<Library>>,
    metrics: Arc<Metrics>,
    progress: Arc<Progress>,
    /// What the release stages show (projections over several topics).
    timing: Arc<crate::engine::consumer::TimingBoard>,
    sandbox: Sandbox,
    differences: Vec<Difference>,
    admin_address: Option<SocketAddr>,
    /// Whether the admin endpoint serves TLS.
    admin_tls: bool,
    rebuild: Option<Arc<RebuildWatch>>,
    /// Dropping it (or the host) stops the consumer after the batch in
    /// flight; likewise `stop_admin` for the admin endpoint.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    stop_admin: Option<tokio::sync::oneshot::Sender<()>>,
    consuming: Option<tokio::task::JoinHandle<Result<Summary, ConsumerError>>>,
    /// Its consumer group membership, left once the consumer let its
    /// partitions go ([`crate::engine::membership`]).
    membership: Option<crate::engine::membership::Membership>,
    /// Shut down (its last spans and metrics sent) once the consumer stopped.
    telemetry: Option<Telemetry>,
    _reloader: Option<Reloader>,
}

impl<L: EventLog> RunningHost<L> {
    /// The log it consumes.
    pub fn log(&self) -> &Arc<L> {
        &self.log
    }

    /// The projection: its modules (swapped on reload) and state store.
    pub fn projection(&self) -> &Arc<Projection> {
        &self.projection
    }

    /// The library of its modules, when they come from a directory.
    pub fn library(&self) -> Option<&Arc<Library>> {
        self.library.as_ref()
    }

    /// What the release stages of a projection over several topics show:
    /// each partition index's clock, held events and inputs, and the
    /// release latency.
    pub fn timing(&self) -> &Arc<crate::engine::consumer::TimingBoard> {
        &self.timing
    }

    /// Its Prometheus metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The caught-up gate: start-up end offsets against committed positions.
    pub fn progress(&self) -> &Arc<Progress> {
        &self.progress
    }

    /// The sandbox its modules run in.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// How the modules it runs differ from the module directory (a restart
    /// runs the recorded versions).
    pub fn differences(&self) -> &[Difference] {
        &self.differences
    }

    /// The last rebuild's status, when the host can rebuild (it follows
    /// an embedded store with modules from a directory; [`crate::operations::rebuild`]).
    pub fn rebuild(&self) -> Option<RebuildStatus> {
        self.rebuild.as_ref().and_then(|watch| watch.get())
    }

    /// Where the admin endpoint listens, when it serves one.
    pub fn admin_address(&self) -> Option<SocketAddr> {
        self.admin_address
    }

    /// Whether the admin endpoint serves TLS ([`HostSettings::admin_tls`]).
    pub fn serves_admin_tls(&self) -> bool {
        self.admin_tls
    }

    /// Where the projection stands: positions, lag, module versions and
    /// the counts of applied, skipped, retrying and dead-lettered events.
    pub async fn status(&self) -> Result<Status, HostError> {
        Ok(admin::running_status(&*self.log, &self.projection, &self.live_status()).await?)
    }

    /// What only this running host knows of its projection's status, for
    /// [`admin::running_status`] (as `/status` answers it).
    pub fn live_status(&self) -> admin::LiveStatus {
        admin::LiveStatus {
            progress: Some(self.progress.clone()),
            timing: Some(self.timing.clone()),
            rebuild: self.rebuild.clone(),
        }
    }

    /// Asks it to stop after the batch in flight and waits until it has.
    pub async fn stop(self) -> Result<Summary, HostError> {
        self.stop_when(std::future::ready(())).await
    }

    /// Waits until it stops by itself ([`HostSettings::until_caught_up`]) or
    /// fails; a host that follows its topic runs until dropped.
    pub async fn finished(self) -> Result<Summary, HostError> {
        self.stop_when(std::future::pending()).await
    }

    /// Runs until it stops by itself or fails, or until `signal` resolves,
    /// which stops it after the batch in flight.
    pub async fn stop_when(mut self, signal: impl Future<Output = ()>) -> Result<Summary, HostError> {
        let mut consuming = self.consuming.take().expect("a running host has its consumer");
        let ended = tokio::select! {
            ended = &mut consuming => ended,
            () = signal => {
                self.stop.take();
                consuming.await
            }
        };
        self.stop_admin.take();
        // The partitions were let go after their last commits: leaving now
        // hands them to the group's other hosts at once.
        if let Some(membership) = self.membership.take() {
            membership.leave().await;
        }
        if let Some(telemetry) = self.telemetry.take() {
            // Waits on a thread of its own, at most `SHUTDOWN_WAIT`.
            let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        }
        ended.map_err(|e| HostError::Panicked { what: "the consumer", message: e.to_string() })?.map_err(Into::into)
    }
}
