//! The consumer loop: poll → plan → reduce → invoke → commit, per partition.
//!
//! For each polled batch of one partition:
//! 1. **Plan** from headers alone ([`crate::plan`]); bodies stay opaque.
//!    A message whose headers cannot be parsed is left out of the plan and
//!    counted as `malformed` (with the parse error in the log).
//! 2. **Execute per key.** Keys are spread over worker threads; one key's
//!    runs execute one after another (head, body runs, tail, segment after
//!    segment), so a key never races with itself. Each run is reduced with
//!    its type's algebra ([`crate::reduce`]) and handed to the module in
//!    chunks of at most `max-batch` events. Runs whose tag no module
//!    declares are skipped and counted as `skipped`.
//! 3. **Commit once.** State writes, counter changes, emitted messages
//!    (an outbox), counts and the partition's next offset go into the
//!    projection's store in one transaction. A crash at any moment leaves
//!    the state exactly as if every event before the committed offset had
//!    been applied once. The outbox is then published to the log and
//!    cleared; a leftover outbox is published again at start-up. Appends
//!    carry the outbox's sequence numbers ([`EventLog::append_as`]), so an
//!    entry appended just before a crash is not appended again.
//!
//! A handler failure fails the batch before anything of it is committed,
//! so nothing is lost or applied twice; the error names the partition,
//! offset, key and event type.
//!
//! Progress is measured against end offsets read from the log, never a
//! timer: [`Consumer::catch_up`] reads every partition's end offset once
//! and returns when the committed position reaches it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::event::{EventHeaders, EventTypeTag, KeyHash, partition_for};
use crate::handler::{CallError, KeyOutcome, KeyScope, PayloadLimits};
use crate::log::{EventLog, LogError, StoredRecord};
use crate::plan::{Plan, PlanRecord, Stage};
use crate::projection::Projection;
use crate::reduce::{chunks, reduce};
use crate::state::{BatchCommit, StateError, StateReader};

/// Names of the per-projection counts kept with the state.
pub mod stat {
    /// Events handed to a handler successfully (counted before reduction).
    pub const APPLIED: &str = "applied";
    /// Events whose tag no module declares.
    pub const SKIPPED: &str = "skipped";
    /// Messages whose headers could not be parsed.
    pub const MALFORMED: &str = "malformed";
}

/// How a consumer polls and executes.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Most messages polled per batch. Default 16 384: larger batches give
    /// longer runs to reduce and fewer handler calls and commits (see
    /// BENCHMARKS.md); a batch is also the unit of latency.
    pub batch_size: usize,
    /// Worker threads per batch; keys are spread over them. Default: the
    /// machine's available parallelism.
    pub workers: usize,
    /// The partitions this consumer owns; `None` means all of them.
    pub partitions: Option<Vec<u32>>,
    /// How long `follow` waits before polling an idle partition again.
    /// Default 50 ms.
    pub idle_poll: Duration,
    /// Size limits for what handlers hand the host.
    pub payload: PayloadLimits,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            batch_size: 16_384,
            workers: std::thread::available_parallelism().map_or(1, usize::from),
            partitions: None,
            idle_poll: Duration::from_millis(50),
            payload: PayloadLimits::default(),
        }
    }
}

/// Why consuming stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The state store failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// A handler call failed; nothing of the batch was committed.
    #[error(
        "projection `{projection}`, partition {partition}, offset {offset}: key {key:#018x}, event type `{event_type}` (tag {tag}): {error}"
    )]
    Handler {
        /// The projection.
        projection: String,
        /// The partition.
        partition: u32,
        /// Offset of the first event of the failed run.
        offset: u64,
        /// The key.
        key: KeyHash,
        /// The event type's tag.
        tag: EventTypeTag,
        /// The event type's name.
        event_type: String,
        /// What the call said.
        error: CallError,
    },
    /// A partition this consumer was told to own does not exist.
    #[error("topic `{topic}` has {partitions} partitions; partition {partition} does not exist")]
    NoSuchPartition {
        /// The topic.
        topic: String,
        /// The partition asked for.
        partition: u32,
        /// How many the topic has.
        partitions: u32,
    },
    /// A worker thread panicked (a bug in the host, never in a module).
    #[error("a consumer worker panicked: {0}")]
    WorkerPanicked(String),
}

/// One run handed to a handler, as seen by a [`CallObserver`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCall {
    /// The partition.
    pub partition: u32,
    /// The key.
    pub key: KeyHash,
    /// The event type.
    pub tag: EventTypeTag,
    /// Offsets of the run's events, in log order.
    pub offsets: Vec<u64>,
    /// Events after reduction.
    pub reduced: usize,
    /// Handler calls made for the run.
    pub calls: usize,
}

/// Watches handler calls; tests use it to check execution order.
///
/// Calls for one key are reported in the order they ran.
pub trait CallObserver: Send + Sync {
    /// A run was handled successfully.
    fn run_handled(&self, call: &RunCall);
}

/// What a stretch of consuming did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Batches committed.
    pub batches: u64,
    /// Messages consumed (applied + skipped + malformed).
    pub consumed: u64,
    /// Events applied.
    pub applied: u64,
    /// Events skipped (no module declares their tag).
    pub skipped: u64,
    /// Messages with unreadable headers.
    pub malformed: u64,
    /// Handler calls made.
    pub calls: u64,
}

impl Summary {
    fn add(&mut self, other: &Summary) {
        self.batches += other.batches;
        self.consumed += other.consumed;
        self.applied += other.applied;
        self.skipped += other.skipped;
        self.malformed += other.malformed;
        self.calls += other.calls;
    }
}

/// Consumes one projection's topic from a log.
pub struct Consumer<L> {
    log: Arc<L>,
    projection: Arc<Projection>,
    config: ConsumerConfig,
    observer: Option<Arc<dyn CallObserver>>,
    /// Partitions commit to one outbox; one publisher at a time, or two
    /// could publish the same entries before either clears them.
    outbox: Arc<tokio::sync::Mutex<()>>,
}

impl<L> Clone for Consumer<L> {
    fn clone(&self) -> Self {
        Self {
            log: self.log.clone(),
            projection: self.projection.clone(),
            config: self.config.clone(),
            observer: self.observer.clone(),
            outbox: self.outbox.clone(),
        }
    }
}

impl<L: EventLog> Consumer<L> {
    /// A consumer of `projection`'s topic on `log`.
    pub fn new(log: Arc<L>, projection: Arc<Projection>, config: ConsumerConfig) -> Self {
        Self { log, projection, config, observer: None, outbox: Arc::default() }
    }

    /// Reports every handled run to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The partitions this consumer owns, checked against the topic.
    pub async fn partitions(&self) -> Result<Vec<u32>, ConsumerError> {
        let topic = self.projection.topic();
        let count = self.log.partitions(topic).await?;
        match &self.config.partitions {
            None => Ok((0..count).collect()),
            Some(owned) => {
                if let Some(&missing) = owned.iter().find(|&&p| p >= count) {
                    return Err(ConsumerError::NoSuchPartition {
                        topic: topic.to_owned(),
                        partition: missing,
                        partitions: count,
                    });
                }
                Ok(owned.clone())
            }
        }
    }

    /// Consumes every partition up to the end offsets read when it starts,
    /// then returns what it did. Partitions run concurrently.
    pub async fn catch_up(&self) -> Result<Summary, ConsumerError> {
        self.consume(Until::EndOffsets, std::future::pending()).await
    }

    /// [`Consumer::catch_up`], stopping early when `shutdown` resolves: the
    /// batch in flight is finished and committed first.
    pub async fn catch_up_or_stop(
        &self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Summary, ConsumerError> {
        self.consume(Until::EndOffsets, shutdown).await
    }

    /// Consumes every partition, following new messages, until `shutdown`
    /// resolves; the batch in flight is finished and committed first.
    pub async fn follow(&self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<Summary, ConsumerError> {
        self.consume(Until::Shutdown, shutdown).await
    }

    /// Runs one task per partition until `until` or `shutdown`. A partition
    /// that fails stops the others the same way, so the error is returned at
    /// once instead of at the next shutdown.
    async fn consume(
        &self,
        until: Until,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Summary, ConsumerError> {
        self.publish_outbox().await?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stop_tx = Arc::new(stop_tx);
        let stop_on_shutdown = stop_tx.clone();
        let watcher = tokio::spawn(async move {
            shutdown.await;
            let _ = stop_on_shutdown.send(true);
        });
        let mut tasks = tokio::task::JoinSet::new();
        for partition in self.partitions().await? {
            let end = match until {
                Until::EndOffsets => Some(self.log.end_offset(self.projection.topic(), partition).await?),
                Until::Shutdown => None,
            };
            let consumer = self.clone();
            let stop = stop_rx.clone();
            let stop_all = stop_tx.clone();
            tasks.spawn(async move {
                let result = consumer.consume_partition(partition, end, stop).await;
                if result.is_err() {
                    let _ = stop_all.send(true);
                }
                result
            });
        }
        let summary = collect(tasks).await;
        watcher.abort();
        summary
    }

    /// Consumes one partition until `end` (if given) or until `stop` is set.
    async fn consume_partition(
        &self,
        partition: u32,
        end: Option<u64>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Summary, ConsumerError> {
        let topic = self.projection.topic().to_owned();
        let mut position = self.projection.store().position(&topic, partition)?.unwrap_or(0);
        let mut summary = Summary::default();
        loop {
            if *stop.borrow() {
                break;
            }
            let want = match end {
                Some(end) if position >= end => break,
                Some(end) => self.config.batch_size.min((end - position) as usize),
                None => self.config.batch_size,
            };
            let records = self.log.read(&topic, partition, position, want).await?;
            let Some(last) = records.last() else {
                let _ = tokio::time::timeout(self.config.idle_poll, stop.changed()).await;
                continue;
            };
            let next = last.offset + 1;
            let consumer = self.clone();
            let batch = tokio::task::spawn_blocking(move || consumer.process_batch(partition, records, next))
                .await
                .map_err(|e| ConsumerError::WorkerPanicked(e.to_string()))??;
            summary.add(&batch);
            position = next;
            self.publish_outbox().await?;
            self.log.store_consumer_offset(self.projection.name(), &topic, partition, position).await?;
        }
        Ok(summary)
    }

    /// Plans, executes and commits one batch. Runs on a blocking thread.
    fn process_batch(&self, partition: u32, records: Vec<StoredRecord>, next: u64) -> Result<Summary, ConsumerError> {
        let projection = &*self.projection;
        let mut summary = Summary { batches: 1, consumed: records.len() as u64, ..Summary::default() };

        let mut plan_records = Vec::with_capacity(records.len());
        let mut bodies = Vec::with_capacity(records.len());
        let mut offsets = Vec::with_capacity(records.len());
        for stored in records {
            match EventHeaders::parse_stored(&stored.record.headers) {
                Ok(headers) => {
                    plan_records.push(PlanRecord {
                        key: headers.key_hash,
                        tag: headers.tag,
                        ordering: headers.ordering,
                    });
                    bodies.push(Some(stored.record.body));
                    offsets.push(stored.offset);
                }
                Err(error) => {
                    summary.malformed += 1;
                    tracing::warn!(
                        projection = projection.name(),
                        partition,
                        offset = stored.offset,
                        "message has unreadable headers and is not handled: {error}"
                    );
                }
            }
        }

        let plan = Plan::new(&plan_records);
        let work = split_work(&plan, &mut bodies, &offsets, self.config.workers.max(1));
        let snapshot = Arc::new(projection.store().reader()?);
        let outcomes = self.execute(partition, work, &snapshot)?;
        drop(snapshot);

        let mut commit = BatchCommit::default();
        for outcome in outcomes {
            summary.applied += outcome.applied;
            summary.skipped += outcome.skipped;
            summary.calls += outcome.calls;
            for (key, KeyOutcome { writes, counters, outbox }) in outcome.keys {
                if !writes.is_empty() {
                    commit.writes.push((key, writes));
                }
                for (name, delta) in counters {
                    *commit.counter_deltas.entry(name).or_default() += delta;
                }
                commit.outbox.extend(outbox);
            }
        }
        for (name, count) in
            [(stat::APPLIED, summary.applied), (stat::SKIPPED, summary.skipped), (stat::MALFORMED, summary.malformed)]
        {
            if count > 0 {
                commit.stat_deltas.insert(name.to_owned(), count);
            }
        }
        commit.positions.push((projection.topic().to_owned(), partition, next));
        projection.store().commit(commit)?;
        Ok(summary)
    }

    /// Runs every worker's keys on its own thread.
    fn execute(
        &self,
        partition: u32,
        work: Vec<Vec<KeyWork>>,
        snapshot: &Arc<StateReader>,
    ) -> Result<Vec<WorkerOutcome>, ConsumerError> {
        let failed = AtomicUsize::new(0);
        let results: Vec<Result<WorkerOutcome, ConsumerError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = work
                .into_iter()
                .map(|keys| {
                    let failed = &failed;
                    scope.spawn(move || self.run_worker(partition, keys, snapshot, failed))
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| {
                    handle.join().unwrap_or_else(|panic| {
                        let message = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                            .unwrap_or_default();
                        Err(ConsumerError::WorkerPanicked(message))
                    })
                })
                .collect()
        });
        results.into_iter().collect()
    }

    /// Handles the keys given to one worker, one key after another.
    fn run_worker(
        &self,
        partition: u32,
        keys: Vec<KeyWork>,
        snapshot: &Arc<StateReader>,
        failed: &AtomicUsize,
    ) -> Result<WorkerOutcome, ConsumerError> {
        let projection = &*self.projection;
        let mut instances = projection.instances();
        let mut outcome = WorkerOutcome::default();
        for key_work in keys {
            // Another worker failed: the batch will not commit, stop early.
            if failed.load(AtomicOrdering::Relaxed) > 0 {
                break;
            }
            let key = key_work.key;
            let mut scope = KeyScope::new(key, snapshot.clone(), self.config.payload);
            for run in key_work.runs {
                let Some(route) = projection.route(run.tag) else {
                    outcome.skipped += run.offsets.len() as u64;
                    continue;
                };
                let fail = |error: CallError| {
                    failed.fetch_add(1, AtomicOrdering::Relaxed);
                    ConsumerError::Handler {
                        projection: projection.name().to_owned(),
                        partition,
                        offset: run.offsets[0],
                        key,
                        tag: run.tag,
                        event_type: route.event_type.name.clone(),
                        error,
                    }
                };
                let instance = instances.get(route.module).map_err(fail)?;
                let reduced = reduce(route.event_type.algebra, run.bodies, |bodies| instance.combine(run.tag, bodies))
                    .map_err(fail)?;
                let mut calls = 0;
                for chunk in chunks(&reduced, route.event_type.max_batch) {
                    instance.handle(&mut scope, run.tag, chunk).map_err(fail)?;
                    calls += 1;
                }
                outcome.applied += run.offsets.len() as u64;
                outcome.calls += calls as u64;
                if let Some(observer) = &self.observer {
                    observer.run_handled(&RunCall {
                        partition,
                        key,
                        tag: run.tag,
                        offsets: run.offsets,
                        reduced: reduced.len(),
                        calls,
                    });
                }
            }
            outcome.keys.push((key, scope.into_outcome()));
        }
        Ok(outcome)
    }

    /// Publishes messages that handlers emitted in committed batches.
    async fn publish_outbox(&self) -> Result<(), ConsumerError> {
        let _one_publisher = self.outbox.lock().await;
        let store = self.projection.store();
        let pending = store.outbox()?;
        let Some(&(last_seq, _)) = pending.last() else { return Ok(()) };
        // Outbox sequence numbers stamp the appends, so entries a crash left
        // behind after they were appended are recognised and not sent again.
        let producer = outbox_producer(self.projection.name());
        let mut by_topic: FxHashMap<String, TopicAppend> = FxHashMap::default();
        for (sequence, entry) in pending {
            if !by_topic.contains_key(&entry.topic) {
                let append = TopicAppend {
                    partitions: self.log.partitions(&entry.topic).await?,
                    appended: self.log.producer_sequence(&entry.topic, &producer).await?,
                    ..TopicAppend::default()
                };
                by_topic.insert(entry.topic.clone(), append);
            }
            let append = by_topic.get_mut(&entry.topic).expect("inserted above");
            if append.appended.is_some_and(|appended| sequence <= appended) {
                continue;
            }
            let partition = partition_for(entry.partition_key, append.partitions);
            match append.batches.iter_mut().find(|(p, _)| *p == partition) {
                Some((_, records)) => records.push(entry.record),
                None => append.batches.push((partition, vec![entry.record])),
            }
            append.last = sequence;
        }
        for (topic, append) in by_topic {
            if !append.batches.is_empty() {
                self.log.append_as(&topic, append.batches, &producer, append.last).await?;
            }
        }
        store.remove_outbox(last_seq)?;
        Ok(())
    }
}

/// The producer name a projection's outbox appends as
/// ([`EventLog::append_as`]).
pub fn outbox_producer(projection: &str) -> String {
    format!("projection:{projection}")
}

/// What the outbox sends to one topic.
#[derive(Default)]
struct TopicAppend {
    partitions: u32,
    /// The last outbox sequence number already appended to the topic.
    appended: Option<u64>,
    batches: Vec<(u32, Vec<crate::log::Record>)>,
    /// The highest sequence number in `batches`.
    last: u64,
}

/// How far [`Consumer::consume`] goes.
#[derive(Clone, Copy)]
enum Until {
    /// The end offsets read at the start: catching up.
    EndOffsets,
    /// Only a shutdown: following.
    Shutdown,
}

async fn collect(mut tasks: tokio::task::JoinSet<Result<Summary, ConsumerError>>) -> Result<Summary, ConsumerError> {
    let mut total = Summary::default();
    let mut first_error = None;
    while let Some(joined) = tasks.join_next().await {
        match joined.map_err(|e| ConsumerError::WorkerPanicked(e.to_string())) {
            Ok(Ok(summary)) => total.add(&summary),
            Ok(Err(error)) | Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    first_error.map_or(Ok(total), Err)
}

/// One key's runs, in execution order, with their bodies moved in.
struct KeyWork {
    key: KeyHash,
    runs: Vec<RunWork>,
}

struct RunWork {
    tag: EventTypeTag,
    offsets: Vec<u64>,
    bodies: Vec<Vec<u8>>,
}

#[derive(Default)]
struct WorkerOutcome {
    keys: Vec<(KeyHash, KeyOutcome)>,
    applied: u64,
    skipped: u64,
    calls: u64,
}

/// Turns the plan into per-worker lists of keys, moving each body into the
/// run that holds it. Keys go round-robin to workers in order of first
/// appearance; body runs of a segment are executed in plan order, which the
/// spec allows (they may run in any order).
fn split_work(plan: &Plan, bodies: &mut [Option<Vec<u8>>], offsets: &[u64], workers: usize) -> Vec<Vec<KeyWork>> {
    let mut work: Vec<Vec<KeyWork>> = (0..workers.min(plan.keys().len()).max(1)).map(|_| Vec::new()).collect();
    let worker_count = work.len();
    for (index, key) in plan.keys().iter().enumerate() {
        let mut runs = Vec::new();
        for segment in plan.segments(key) {
            for stage in plan.stages(segment) {
                let stage_runs = match stage {
                    Stage::Head(run) | Stage::Tail(run) => std::slice::from_ref(run),
                    Stage::Body(body) => body,
                };
                for run in stage_runs {
                    let records = plan.records(run);
                    runs.push(RunWork {
                        tag: run.tag(),
                        offsets: records.iter().map(|&i| offsets[i]).collect(),
                        bodies: records.iter().map(|&i| bodies[i].take().unwrap_or_default()).collect(),
                    });
                }
            }
        }
        work[index % worker_count].push(KeyWork { key: key.key_hash(), runs });
    }
    work
}
