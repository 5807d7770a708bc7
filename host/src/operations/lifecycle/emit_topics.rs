//! Emit topics: the topics a module declares it emits to
//! (`module-info.emits`) exist in the log before the module runs.
//!
//! Rules kept here:
//! - **Checked on every load** a [`super::Library`] makes with an
//!   [`EmitTopics`] check, at start-up and on reload: a missing topic fails
//!   the load naming the module and the topic
//!   ([`LifecycleError::MissingEmitTopic`]), so nothing a module emits can
//!   wait in the outbox for a topic that is not there.
//! - **Created only when the operator asked** (`--create-emit-topics`,
//!   [`CreateTopics`]), durable, and at most [`CreateTopics::DEFAULT_LIMIT`]
//!   (or the limit given) while the host runs (`emit-topics-created`); a
//!   creation that fails gives its place back.
//! - **A topic the host did not create must keep what it acknowledges**
//!   ([`crate::storage::log::loss::require_durable`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::LifecycleError;
use crate::sandbox::handler::HandlerModule;
use crate::storage::log::{EventLog, LogError};

/// A check that the topics a module declares it emits to can be written:
/// run on every module a [`super::Library`] loads.
pub trait EmitTopics: Send + Sync {
    /// Succeeds when every topic `module` declares exists (or was created).
    fn ensure(&self, module: &dyn HandlerModule) -> Result<(), LifecycleError>;
}

/// Checks emit topics against a log, creating missing ones with
/// `create` partitions when the operator asked for it
/// (`--create-emit-topics`).
///
/// [`super::Library`] loads modules on blocking threads, so this waits for the log
/// on `runtime`; call [`super::Library::start`] and [`super::Library::reload`] off the
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

#[cfg(test)]
mod tests {
    use super::super::fake_module::FakeModule;
    use super::*;
    use crate::storage::log::embedded::EmbeddedLog;

    fn log(dir: &tempfile::TempDir) -> EmbeddedLog {
        EmbeddedLog::open(dir.path().join("log.redb")).unwrap()
    }

    #[test]
    fn a_limit_is_taken_one_topic_at_a_time_and_no_further() {
        let create = CreateTopics::with_limit(3, 2);
        assert!(create.take_one());
        assert!(create.take_one());
        assert!(!create.take_one(), "the limit is 2");
        assert!(!create.take_one());
        assert_eq!(CreateTopics::new(1).limit, CreateTopics::DEFAULT_LIMIT);
    }

    #[tokio::test]
    async fn a_missing_topic_fails_the_load_naming_it_unless_the_host_creates_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = log(&dir);
        let module = FakeModule::new("bank", "b1").emitting(&["audit"]);
        let missing = ensure_emit_topics(&log, &module, None).await;
        assert!(
            matches!(&missing, Err(LifecycleError::MissingEmitTopic { module, topic }) if module == "bank" && topic == "audit"),
            "{missing:?}"
        );

        let create = CreateTopics::new(3);
        ensure_emit_topics(&log, &module, Some(&create)).await.unwrap();
        assert_eq!(log.partitions("audit").await.unwrap(), 3);
        // There now: checked, not created again.
        ensure_emit_topics(&log, &module, None).await.unwrap();
        assert_eq!(create.created.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_host_creates_at_most_its_limit_of_topics() {
        let dir = tempfile::tempdir().unwrap();
        let log = log(&dir);
        let create = CreateTopics::with_limit(1, 1);
        let module = FakeModule::new("bank", "b1").emitting(&["audit", "mail"]);
        let refused = ensure_emit_topics(&log, &module, Some(&create)).await;
        assert!(
            matches!(&refused, Err(LifecycleError::EmitTopicsCreated { topic, limit: 1, .. }) if topic == "mail"),
            "{refused:?}"
        );
        assert_eq!(log.partitions("audit").await.unwrap(), 1, "the first was created");
        assert!(log.partitions("mail").await.is_err());
    }

    #[test]
    fn a_log_check_waits_for_the_log_on_its_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let check = LogEmitTopics { log: Arc::new(log(&dir)), create: None, runtime: runtime.handle().clone() };
        assert!(check.ensure(&FakeModule::new("quiet", "q1")).is_ok(), "no topic declared, nothing to check");
        let error = check.ensure(&FakeModule::new("bank", "b1").emitting(&["audit"])).unwrap_err();
        assert!(matches!(error, LifecycleError::MissingEmitTopic { .. }), "{error}");
    }
}
