//! The running host's side of a rebuild: it consumes the live projection,
//! runs the shadow beside it, and promotes or rolls back between two
//! batches (see the [parent module](super) for the files and the rules).
//!
//! The conductor owns the live consumer: it follows the projection's
//! topics until the host stops, and is paused (after its batch in flight,
//! which commits) only to promote or roll back, then follows again. The
//! shadow consumes the same topics in the same order with the live
//! projection's settings, so over several topics it goes through the same
//! release stage and gives the same event-time order as the live path. A
//! check every [`CHECK_EVERY`] looks at the request files and the shadow's
//! progress; what it decides comes from positions and end offsets only. A
//! rebuild that fails (a module that does not load, a shadow whose consumer
//! fails) is dropped with its error in the status; the live projection
//! never stops because of it. A shadow that cannot start for now (an I/O
//! error reading the request, the log unreachable) is not a failure: the
//! request stays, the status says `waiting to start` and why, and the
//! next check tries again. A host asked to stop while it lines the two up
//! stops after the batch in flight, as at any other time: the line-up is
//! taken up again at its next start.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::stores::{HoldBackEmits, SwitchingStore};
use super::{Pointer, Promote, RebuildError, RebuildPaths, Request};
use crate::engine::consumer::{Consumer, ConsumerConfig, ConsumerError, Summary};
use crate::engine::projection::{Projection, ProjectionError};
use crate::engine::routing::{Routed, RoutedTopics, retry_topic};
use crate::operations::lifecycle::{EmitTopics, Library};
use crate::sandbox::handler::HandlerModule;
use crate::sandbox::runtime::Sandbox;
use crate::storage::log::EventLog;
use crate::storage::state::{BatchCommit, StateError, StateStore};
use crate::storage::stats::Stat;

/// The phase of a caught-up shadow waiting for a person.
const WAITING: &str = "waiting for --promote";

/// The phase of a rebuild whose shadow cannot start for now.
const WAITING_TO_START: &str = "waiting to start";

/// Why a shadow did not start.
enum StartFailure {
    /// The request cannot be served (its topic, its modules): it is
    /// dropped, and the status keeps why.
    Refused(String),
    /// What it needs cannot be read or written for now (an I/O error, the
    /// log unreachable): it stays, and the next check tries again.
    NotNow(String),
}

impl StartFailure {
    /// A rebuild file's error: an I/O error is for now, a corrupt file
    /// refuses the request.
    fn reading(error: RebuildError) -> Self {
        match error {
            RebuildError::Io { .. } => Self::NotNow(error.to_string()),
            other => Self::Refused(other.to_string()),
        }
    }

    /// The shadow store's error at opening: a damaged or corrupt store
    /// refuses the request, anything else (I/O, locked) is for now.
    fn opening(error: StateError) -> Self {
        match error {
            StateError::Damaged { .. } | StateError::Corrupt { .. } => Self::Refused(error.to_string()),
            other => Self::NotNow(other.to_string()),
        }
    }
}

/// Whether a shadow may be promoted now.
#[derive(Debug, PartialEq, Eq)]
enum Readiness {
    /// Not caught up yet.
    Building,
    /// Caught up, waiting for `waku rebuild --promote`, for this reason.
    Waiting(String),
    /// To be promoted.
    Promote,
}

/// Decides from the shadow's progress: `caught_up` (it reached the end
/// offsets read when it started, and is within a batch of the live
/// positions), the promotion mode, whether a person gave the go-ahead,
/// and how many events its handlers dead-lettered. An automatic
/// promotion waits for a person when the new modules dead-lettered
/// events, which the promoted state would lack.
fn readiness(caught_up: bool, promote: Promote, go_ahead: bool, handler_dead_letters: u64) -> Readiness {
    match (caught_up, promote, go_ahead) {
        (false, ..) => Readiness::Building,
        (true, _, true) => Readiness::Promote,
        (true, Promote::Manual, false) => Readiness::Waiting("promotion is manual".to_owned()),
        (true, Promote::Auto, false) if handler_dead_letters > 0 => Readiness::Waiting(format!(
            "the new modules dead-lettered {handler_dead_letters} events, which the promoted state would lack; see \
             them with `waku dlq list --projection <projection> --topic <topic> --rebuilt`"
        )),
        (true, Promote::Auto, false) => Readiness::Promote,
    }
}

/// How often the conductor looks at the request files and the shadow.
pub const CHECK_EVERY: Duration = Duration::from_millis(200);

/// Where a rebuild stands, for `waku status` and the admin endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildStatus {
    /// The rebuild's generation.
    pub generation: u64,
    /// `building`, `waiting for --promote`, `promoting`, `promoted`,
    /// `rolled back`, or `failed`.
    pub phase: String,
    /// `auto` or `manual`.
    pub promote: String,
    /// Per partition: (partition, shadow position, live position); over
    /// several topics, the positions of the partition index summed over
    /// them (as the caught-up gate counts them).
    pub partitions: Vec<(u32, u64, u64)>,
    /// Events the shadow still has to consume to reach the live positions,
    /// plus those waiting in its retry: its distance to promotion.
    pub distance: u64,
    /// Messages the shadow's handlers emitted that were held back.
    pub held_back: u64,
    /// Events the shadow dead-lettered (listed by `waku dlq list
    /// --projection <projection> --topic <topic> --rebuilt`): the promoted
    /// state lacks them.
    pub dead_lettered: u64,
    /// Of those, messages whose headers could not be read (the live
    /// projection dead-lettered them too).
    pub malformed: u64,
    /// Why a caught-up shadow waits for `waku rebuild --promote`.
    pub note: Option<String>,
    /// The shadow's modules: name → version.
    pub modules: BTreeMap<String, String>,
    /// Why it failed, when it did.
    pub error: Option<String>,
}

/// The latest [`RebuildStatus`] and the shadow's store while one is
/// built, shared with the admin endpoint.
#[derive(Debug, Default)]
pub struct RebuildWatch {
    status: Mutex<Option<RebuildStatus>>,
    shadow: Mutex<Option<StateStore>>,
}

impl RebuildWatch {
    /// The status of the last rebuild this host ran, if any.
    pub fn get(&self) -> Option<RebuildStatus> {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The store of the shadow being built, if one is (read only: the
    /// admin endpoint's `/shadow/{projection}/{key}`).
    pub fn shadow(&self) -> Option<StateStore> {
        self.shadow.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, status: RebuildStatus) {
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = Some(status);
    }

    /// Sets the phase; a phase that ends the shadow (promoted, failed)
    /// also lets go of its store.
    fn set_phase(&self, phase: &str, error: Option<String>, shadow: Option<StateStore>) {
        let mut current = self.status.lock().unwrap_or_else(|e| e.into_inner());
        let status = current.get_or_insert_with(RebuildStatus::default);
        status.phase = phase.to_owned();
        status.error = error;
        *self.shadow.lock().unwrap_or_else(|e| e.into_inner()) = shadow;
    }
}

/// What the conductor needs of the host.
pub struct Conductor<L> {
    /// The log.
    pub log: Arc<L>,
    /// The live consumer.
    pub live: Consumer<L>,
    /// The live projection, whose store is `switching`.
    pub projection: Arc<Projection>,
    /// The store handle every part of the host shares.
    pub switching: SwitchingStore,
    /// The live module directory (a rollback runs the old store's recorded
    /// versions, as a restart would).
    pub module_dir: PathBuf,
    /// The live projection's library, whose hot reloads watch `module_dir`.
    pub library: Arc<Library>,
    /// The data directory.
    pub data: PathBuf,
    /// The sandbox modules run in.
    pub sandbox: Sandbox,
    /// How the shadow consumes (the live projection's settings).
    pub config: ConsumerConfig,
    /// The emit-topic check shadow modules pass, like live ones.
    pub emit_topics: Arc<dyn EmitTopics>,
    /// Where the status is shown.
    pub watch: Arc<RebuildWatch>,
}

/// A shadow being built.
struct Shadow<L> {
    request: Request,
    /// Its store, without the hold-back wrapper (what promotion switches to).
    store: StateStore,
    modules: Vec<Arc<dyn HandlerModule>>,
    consumer: Consumer<L>,
    following: Following,
}

type Following = (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<Result<Summary, ConsumerError>>);

/// Set once the host is asked to stop.
type Stop = tokio::sync::watch::Receiver<bool>;

/// Resolves once `stop` is set (or its sender is gone).
async fn stopping(mut stop: Stop) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// How many times a promotion over several topics lets the live projection
/// and the shadow catch up in turn before it gives up until the next check
/// (their topics were written to all the while).
pub const LINE_UP_ROUNDS: usize = 4;

/// What a check decided.
enum Action {
    Stop,
    Promote,
    Rollback,
}

fn follow<L: EventLog>(consumer: &Consumer<L>) -> Following {
    let (pause, paused) = tokio::sync::oneshot::channel::<()>();
    let consumer = consumer.clone();
    let task = tokio::spawn(async move {
        consumer
            .follow(async {
                let _ = paused.await;
            })
            .await
    });
    (pause, task)
}

async fn pause((pause, task): Following) -> Result<Summary, ConsumerError> {
    drop(pause);
    task.await.map_err(|e| ConsumerError::WorkerPanicked(e.to_string()))?
}

impl<L: EventLog> Conductor<L> {
    fn paths(&self) -> RebuildPaths {
        RebuildPaths::new(&self.data, self.projection.name())
    }

    /// Consumes until `stopped` resolves or the live consumer fails,
    /// running rebuilds as they are asked for.
    pub async fn run(self, stopped: impl Future<Output = ()> + Send + 'static) -> Result<Summary, ConsumerError> {
        // Watched here and by a promotion's line-up, which may take a while.
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let watcher = tokio::spawn(async move {
            stopped.await;
            let _ = stop.send(true);
        });
        let result = self.conduct(stopping).await;
        watcher.abort();
        result
    }

    async fn conduct(self, stop: Stop) -> Result<Summary, ConsumerError> {
        let mut total = Summary::default();
        let mut shadow: Option<Shadow<L>> = None;
        loop {
            let (pause_live, mut live) = follow(&self.live);
            let action = loop {
                tokio::select! {
                    () = stopping(stop.clone()) => break Action::Stop,
                    ended = &mut live => {
                        if let Some(shadow) = shadow.take() {
                            let _ = pause(shadow.following).await;
                        }
                        total.add(&ended.map_err(|e| ConsumerError::WorkerPanicked(e.to_string()))??);
                        return Ok(total);
                    }
                    () = tokio::time::sleep(CHECK_EVERY) => {
                        if let Some(action) = self.check(&mut shadow).await {
                            break action;
                        }
                    }
                }
            };
            total.add(&pause((pause_live, live)).await?);
            match action {
                Action::Stop => {
                    // The shadow's own failure never fails the host; its
                    // commits are kept and it resumes at the next start.
                    if let Some(shadow) = shadow.take()
                        && let Err(error) = pause(shadow.following).await
                    {
                        tracing::warn!(projection = self.projection.name(), "the shadow stopped with: {error}");
                    }
                    return Ok(total);
                }
                Action::Promote => {
                    let Some(ready) = shadow.take() else { continue };
                    // Until the pointer's rename, a failure leaves the live
                    // projection as it was: the rebuild is dropped, the
                    // live one goes on.
                    match self.promote(ready, &stop).await {
                        Ok(not_yet) => shadow = not_yet,
                        Err(error) => self.fail(&self.paths(), format!("promoting: {error}")),
                    }
                }
                Action::Rollback => {
                    if let Err(error) = self.rollback().await {
                        tracing::error!(projection = self.projection.name(), "rollback failed: {error}");
                        self.watch.set_phase("rollback failed", Some(error.to_string()), None);
                        let _ = std::fs::remove_file(self.paths().rollback_path());
                    }
                }
            }
        }
    }

    /// Looks at the request files and the shadow; says what to do, if
    /// anything.
    async fn check(&self, shadow: &mut Option<Shadow<L>>) -> Option<Action> {
        let paths = self.paths();
        if paths.rollback_path().exists() {
            if let Some(running) = shadow.take() {
                let _ = pause(running.following).await;
            }
            return Some(Action::Rollback);
        }
        let Some(running) = shadow else {
            match self.start_shadow(&paths).await {
                Ok(started) => *shadow = started,
                Err(StartFailure::Refused(error)) => self.fail(&paths, error),
                Err(StartFailure::NotNow(error)) => self.wait_to_start(error),
            }
            return None;
        };
        if running.following.1.is_finished() {
            let running = shadow.take().expect("checked above");
            let error = match pause(running.following).await {
                Err(error) => error.to_string(),
                Ok(_) => "the shadow's consumer stopped".to_owned(),
            };
            self.fail(&paths, error);
            return None;
        }
        let live = self.switching.current();
        let versions = running.modules.iter().map(|m| (m.name().to_owned(), m.version().to_owned())).collect();
        let status = match measure(&*self.log, &running.request, &running.store, &live, versions).await {
            Ok(status) => status,
            Err(error) => {
                tracing::warn!(projection = self.projection.name(), "reading the rebuild's progress: {error}");
                return None;
            }
        };
        let caught_up = running.consumer.progress().caught_up() && status.distance <= self.config.batch_size as u64;
        let go_ahead = paths.promote_path().exists();
        let readiness = readiness(
            caught_up,
            running.request.promote,
            go_ahead,
            status.dead_lettered.saturating_sub(status.malformed),
        );
        let status = match &readiness {
            Readiness::Waiting(why) => RebuildStatus { phase: WAITING.to_owned(), note: Some(why.clone()), ..status },
            _ => status,
        };
        if status.phase == WAITING && self.watch.get().is_none_or(|before| before.phase != WAITING) {
            tracing::info!(
                projection = self.projection.name(),
                generation = status.generation,
                "the shadow caught up; waiting for `waku rebuild --promote`: {}",
                status.note.as_deref().unwrap_or_default()
            );
        }
        self.watch.set(status);
        matches!(readiness, Readiness::Promote).then_some(Action::Promote)
    }

    /// Drops a rebuild that failed: its generation's files and its request
    /// are removed, the status keeps the error.
    fn fail(&self, paths: &RebuildPaths, error: String) {
        tracing::error!(projection = self.projection.name(), "the rebuild failed and was dropped: {error}");
        self.watch.set_phase("failed", Some(error), None);
        if let Err(error) = paths.remove_pending_generation().and_then(|()| paths.finish()) {
            tracing::error!(projection = self.projection.name(), "{error}");
        }
    }

    /// A shadow that cannot start for now: the request stays, the status
    /// says why, and the next check tries again. Logged once per reason.
    fn wait_to_start(&self, error: String) {
        let reason = Some(error);
        if self.watch.get().is_none_or(|status| status.phase != WAITING_TO_START || status.error != reason) {
            tracing::warn!(
                projection = self.projection.name(),
                "the rebuild cannot start yet and is tried again: {}",
                reason.as_deref().unwrap_or_default()
            );
            self.watch.set_phase(WAITING_TO_START, reason, None);
        }
    }

    /// Starts the shadow of the pending request, if there is one and it
    /// was not promoted already (a crash after the pointer moved).
    async fn start_shadow(&self, paths: &RebuildPaths) -> Result<Option<Shadow<L>>, StartFailure> {
        let Some(request) = paths.request().map_err(StartFailure::reading)? else { return Ok(None) };
        let store_path = paths.shadow_store(request.generation);
        if paths.active_store().map_err(StartFailure::reading)? == store_path {
            paths.finish().map_err(StartFailure::reading)?;
            return Ok(None);
        }
        if request.topics() != self.projection.topics() {
            return Err(StartFailure::Refused(
                RebuildError::OtherTopics {
                    projection: self.projection.name().to_owned(),
                    asked: request.topics(),
                    consumed: self.projection.topics().to_vec(),
                }
                .to_string(),
            ));
        }
        let store = StateStore::open(&paths.absolute(&store_path)).map_err(StartFailure::opening)?;
        let copies = Some(paths.kept_copies(request.generation));
        let modules = self
            .load_modules(&store, paths.modules_dir(request.generation), true, copies)
            .await
            .map_err(StartFailure::Refused)?;
        // Its own retry and dead-letter topics, made now; a new shadow
        // takes them from their end: what is there is an earlier rebuild's.
        let routed = RoutedTopics::shadow(&request.topic);
        let not_now = |e: &dyn std::fmt::Display| StartFailure::NotNow(e.to_string());
        let partitions = self.log.partitions(&request.topic).await.map_err(|e| not_now(&e))?;
        for topic in [routed.retry(), routed.dlq()] {
            self.log.create_topic(topic, partitions).await.map_err(|e| not_now(&e))?;
        }
        if store.position(routed.retry(), 0).map_err(|e| not_now(&e))?.is_none() {
            let commit = settled(&*self.log, &[routed.retry(), routed.dlq()]).await.map_err(|e| not_now(&e))?;
            store.commit(commit).map_err(|e| not_now(&e))?;
        }
        let name = super::shadow_name(self.projection.name());
        let held_back = StateStore::from_backend(HoldBackEmits(store.clone()));
        let projection = Projection::new(&name, &request.topic, modules.clone(), held_back)
            .and_then(|projection| projection.with_more_topics(&request.more_topics))
            .map_err(|e| StartFailure::Refused(e.to_string()))?
            .with_routed_topics(routed);
        let consumer = Consumer::new(self.log.clone(), Arc::new(projection), self.config.clone());
        let following = follow(&consumer);
        self.watch.set_phase("building", None, Some(store.clone()));
        tracing::info!(
            projection = self.projection.name(),
            generation = request.generation,
            "rebuilding in the shadow from offset 0"
        );
        Ok(Some(Shadow { request, store, modules, consumer, following }))
    }

    /// The modules of `dir` through a library on `store` (recording them;
    /// with `adopt` the directory's versions win, else the recorded ones,
    /// as at a restart), compiled off the async threads. A store whose
    /// record names no copies directory keeps its copies in `copies`, when
    /// given.
    async fn load_modules(
        &self,
        store: &StateStore,
        dir: PathBuf,
        adopt: bool,
        copies: Option<PathBuf>,
    ) -> Result<Vec<Arc<dyn HandlerModule>>, String> {
        let mut library = Library::new(&self.data, self.projection.name(), store.clone(), self.sandbox.clone())
            .with_emit_topics(self.emit_topics.clone());
        if let Some(copies) = copies {
            library = library.with_copies_in(copies);
        }
        let (modules, _) = tokio::task::spawn_blocking(move || library.start(&dir, adopt))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        Ok(modules)
    }

    /// Promotes the shadow, the live consumer being paused: lines the two
    /// up on the same positions, then switches. Returns the shadow, still
    /// following, when it cannot be promoted yet (events waiting in its
    /// retry, or two topics' line-up not met).
    async fn promote(&self, mut shadow: Shadow<L>, stop: &Stop) -> Result<Option<Shadow<L>>, ConsumerError> {
        tracing::info!(
            projection = self.projection.name(),
            generation = shadow.request.generation,
            "promoting: the live consumer is paused; lining the shadow up with it"
        );
        self.watch.set_phase("promoting", None, None);
        let (pause_shadow, stopped) = std::mem::replace(&mut shadow.following, follow_nothing());
        pause((pause_shadow, stopped)).await?;
        let topic = self.projection.topic().to_owned();
        let partitions = self.log.partitions(&topic).await?;
        let lined_up = match self.projection.topics().len() {
            1 => self.line_up(&shadow, partitions).await?,
            _ => self.line_up_released(&shadow, partitions, stop).await?,
        };
        if !lined_up || shadow.store.stats()?.retrying() > 0 {
            shadow.following = follow(&shadow.consumer);
            return Ok(Some(shadow));
        }
        // The retry records from here on are the promoted projection's; the
        // live projection's earlier ones concern events the shadow applied.
        let retry = retry_topic(&topic);
        let mut retry_ends = Vec::new();
        let mut commit = BatchCommit::default();
        for partition in 0..partitions {
            let end = self.log.end_offset(&retry, partition).await?;
            retry_ends.push(end);
            commit.positions.push((retry.clone(), partition, end));
        }
        shadow.store.commit(commit)?;
        let paths = self.paths();
        let previous = paths.active_store().map_err(|e| ConsumerError::HostFault(e.to_string()))?;
        let pointer =
            Pointer { active: paths.shadow_store(shadow.request.generation), previous: Some(previous), retry_ends };
        self.switch(&paths, shadow.modules.clone(), &pointer, shadow.store.clone())
            .map_err(|e| ConsumerError::HostFault(e.to_string()))?;
        if let Err(error) = paths.finish() {
            tracing::warn!(projection = self.projection.name(), "{error}");
        }
        self.watch.set_phase("promoted", None, None);
        tracing::info!(projection = self.projection.name(), generation = shadow.request.generation, "promoted");
        Ok(None)
    }

    /// Lines the live projection and the shadow of a projection over one
    /// topic up: whichever is behind consumes up to exactly the other's
    /// position of every partition.
    async fn line_up(&self, shadow: &Shadow<L>, partitions: u32) -> Result<bool, ConsumerError> {
        let topic = self.projection.topic();
        let mut targets = FxHashMap::default();
        for partition in 0..partitions {
            let live = self.switching.current().position(topic, partition)?.unwrap_or(0);
            let at = shadow.store.position(topic, partition)?.unwrap_or(0);
            targets.insert(partition, live.max(at));
        }
        self.live.catch_up_to(targets.clone()).await?;
        shadow.consumer.catch_up_to(targets).await?;
        Ok(true)
    }

    /// Lines the live projection and the shadow of a projection over
    /// several topics up where neither holds an event for event-time order
    /// (see the [parent module](super)): each catches up in turn (every
    /// input to the end offset read as it starts, nothing held), until both
    /// stand at the same position of every partition of every topic. Then
    /// each applied exactly the events below those positions. False when
    /// they did not meet within [`LINE_UP_ROUNDS`], or the host is stopping.
    async fn line_up_released(&self, shadow: &Shadow<L>, partitions: u32, stop: &Stop) -> Result<bool, ConsumerError> {
        for _ in 0..LINE_UP_ROUNDS {
            self.live.catch_up_or_stop(stopping(stop.clone())).await?;
            shadow.consumer.catch_up_or_stop(stopping(stop.clone())).await?;
            if *stop.borrow() {
                return Ok(false);
            }
            let live = self.switching.current();
            let mut met = true;
            for topic in self.projection.topics() {
                for partition in 0..partitions {
                    met &= live.position(topic, partition)? == shadow.store.position(topic, partition)?;
                }
            }
            if met {
                return Ok(true);
            }
        }
        tracing::info!(
            projection = self.projection.name(),
            generation = shadow.request.generation,
            "the shadow and the live projection did not meet in {LINE_UP_ROUNDS} rounds (the topics are being \
             written to): both follow again, and the promotion is tried at the next check"
        );
        Ok(false)
    }

    /// Switches back to the previous store and its recorded module
    /// versions, the live consumer being paused. The promoted store's retry
    /// records are marked done in the previous one, which consumes again
    /// every event since the promotion.
    async fn rollback(&self) -> Result<(), String> {
        let paths = self.paths();
        let pointer = paths.pointer().map_err(|e| e.to_string())?;
        let Some(Pointer { active, previous: Some(previous), retry_ends }) = pointer else {
            return Err("there is no previous state to roll back to".to_owned());
        };
        let old = StateStore::open(&paths.absolute(&previous)).map_err(|e| e.to_string())?;
        let retry = retry_topic(self.projection.topic());
        let mut commit = BatchCommit::default();
        for (partition, &from) in retry_ends.iter().enumerate() {
            let partition = partition as u32;
            let end = self.log.end_offset(&retry, partition).await.map_err(|e| e.to_string())?;
            let mut next = from;
            while next < end {
                let records = self.log.read(&retry, partition, next, 4096).await.map_err(|e| e.to_string())?;
                let Some(last) = records.last().map(|r| r.offset) else { break };
                for record in &records {
                    if Routed::parse(&record.record.headers).is_ok_and(|r| r.projection == self.projection.name()) {
                        commit.done.push((retry.clone(), partition, record.offset));
                    }
                }
                next = last + 1;
            }
        }
        // The rebuild's dead letters are the promoted store's: settled in
        // this one, so `waku dlq list --rebuilt` shows them as done.
        let shadow_dlq = RoutedTopics::shadow(self.projection.topic()).dlq().to_owned();
        let settle = settled(&*self.log, &[&shadow_dlq]).await.map_err(|e| e.to_string())?;
        commit.positions.extend(settle.positions);
        old.commit(commit).map_err(|e| e.to_string())?;
        // The old store's recorded versions, loaded before anything changes.
        let modules = self.load_modules(&old, self.module_dir.clone(), false, None).await?;
        // One step back only: the promoted store stays on disk, not offered.
        let _ = active;
        let pointer = Pointer { active: previous, previous: None, retry_ends: Vec::new() };
        self.switch(&paths, modules, &pointer, old).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_file(paths.rollback_path());
        self.watch.set_phase("rolled back", None, None);
        tracing::info!(projection = self.projection.name(), "rolled back to the previous state");
        Ok(())
    }
}

impl<L> Conductor<L> {
    /// Puts `modules` and `store` in place of the live ones, the live
    /// consumer being paused: the modules change in memory first (and back
    /// if the pointer cannot be written), then the one durable step that
    /// decides, then the store. All of it holds the projection's swap lock,
    /// so a hot reload prepared before cannot land on the new set, nor
    /// record into the store being left; the live library then compares
    /// later reloads with the module directory as it is now.
    fn switch(
        &self,
        paths: &RebuildPaths,
        modules: Vec<Arc<dyn HandlerModule>>,
        pointer: &Pointer,
        store: StateStore,
    ) -> Result<(), SwitchError> {
        let mut swap = self.projection.swap_modules();
        let old_modules = swap.modules();
        swap.replace(modules)?;
        if let Err(error) = paths.set_pointer(pointer) {
            let _ = swap.replace(old_modules);
            return Err(error.into());
        }
        drop(self.switching.switch(store));
        self.library.replaced(&swap, &self.module_dir);
        Ok(())
    }
}

/// Why a promotion or rollback could not switch.
#[derive(Debug, thiserror::Error)]
enum SwitchError {
    /// The new module set is not valid.
    #[error(transparent)]
    Modules(#[from] ProjectionError),
    /// The pointer could not be written.
    #[error(transparent)]
    Pointer(#[from] RebuildError),
}

/// A commit moving a store's positions in `topics` to their end offsets:
/// their records before then are not its own.
async fn settled<L: EventLog>(log: &L, topics: &[&str]) -> Result<BatchCommit, crate::storage::log::LogError> {
    let mut commit = BatchCommit::default();
    for &topic in topics {
        let ends = match log.end_offsets(topic).await {
            // No rebuild made it (one promoted by an older host): nothing to settle.
            Err(crate::storage::log::LogError::TopicNotFound { .. }) => continue,
            ends => ends?,
        };
        for (partition, end) in ends.into_iter().enumerate() {
            commit.positions.push((topic.to_owned(), partition as u32, end));
        }
    }
    Ok(commit)
}

/// Where the shadow of `request` stands against the live projection: per
/// partition (index, over every topic) its position and the live one, the
/// distance to promotion (summed over every partition of every topic),
/// its counts; `modules` are its versions. The phase says `building`.
pub async fn measure<L: EventLog>(
    log: &L,
    request: &Request,
    shadow: &StateStore,
    live: &StateStore,
    modules: BTreeMap<String, String>,
) -> Result<RebuildStatus, ConsumerError> {
    let topics = request.topics();
    let mut partitions = Vec::new();
    let mut distance = 0;
    for partition in 0..log.partitions(&request.topic).await? {
        let (mut at, mut live_at) = (0, 0);
        for topic in &topics {
            let (shadow_here, live_here) =
                (shadow.position(topic, partition)?.unwrap_or(0), live.position(topic, partition)?.unwrap_or(0));
            distance += live_here.saturating_sub(shadow_here);
            (at, live_at) = (at + shadow_here, live_at + live_here);
        }
        partitions.push((partition, at, live_at));
    }
    let stats = shadow.stats()?;
    distance += stats.retrying();
    Ok(RebuildStatus {
        generation: request.generation,
        phase: "building".to_owned(),
        promote: request.promote.name().to_owned(),
        partitions,
        distance,
        held_back: stats[Stat::HeldBack],
        dead_lettered: stats[Stat::DeadLettered],
        malformed: stats[Stat::Malformed],
        modules,
        note: None,
        error: None,
    })
}

/// A placeholder for a paused shadow's following.
fn follow_nothing() -> Following {
    let (pause, _) = tokio::sync::oneshot::channel();
    (pause, tokio::spawn(async { Ok(Summary::default()) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shadow_is_promoted_once_caught_up_automatically_or_on_the_go_ahead() {
        assert_eq!(readiness(false, Promote::Auto, true, 0), Readiness::Building);
        assert_eq!(readiness(false, Promote::Manual, true, 0), Readiness::Building);
        assert_eq!(readiness(true, Promote::Auto, false, 0), Readiness::Promote);
        assert!(matches!(readiness(true, Promote::Manual, false, 0), Readiness::Waiting(_)));
        assert_eq!(readiness(true, Promote::Manual, true, 0), Readiness::Promote);
    }

    #[test]
    fn an_automatic_promotion_waits_for_a_person_when_the_new_modules_dead_lettered_events() {
        let Readiness::Waiting(why) = readiness(true, Promote::Auto, false, 3) else { panic!("not held") };
        assert!(why.contains("dead-lettered 3 events"), "{why}");
        assert_eq!(readiness(true, Promote::Auto, true, 3), Readiness::Promote, "the go-ahead accepts them");
    }
}
