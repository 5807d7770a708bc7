//! What a command that works on what is there finds before it opens
//! anything: the data directory, its embedded log, a projection, a topic.
//!
//! Rules kept here:
//! - **Read-only commands create nothing.** Opening the embedded log or a
//!   projection's store creates the file (and its directories) when it is
//!   missing, which is what `run` and `publish` want; `status`, `state`,
//!   `dlq`, `modules`, `reset`, `rebuild` and `topic` look first, so a
//!   misspelt name leaves no `nope.redb` behind.
//! - **A name that does not exist is an error that lists those that do**
//!   (data directories beside the one asked for, the projections of the
//!   data directory, the topics of the log), so the fix is one look away.
//! - Only the embedded parts are looked for on disk: with `--state` the
//!   projection is looked for in PostgreSQL without creating its schema
//!   ([`PostgresStore::connect_existing`](crate::storage::state::postgres::PostgresStore::connect_existing)),
//!   with `--iggy` the topics on the server (checked through
//!   [`EventLog::topics`]).
//! - **A projection over several topics is named by its first**: given a
//!   later one first, a command says which topic names its retry and
//!   dead-letter topics ([`first_topic`]).

use std::path::{Path, PathBuf};

use crate::engine::routing::dlq_topic;
use crate::operations::rebuild::RebuildPaths;
use crate::storage::log::{EventLog, LogError};
use crate::storage::state::StateStore;

/// What was asked for and is not there.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(super) enum Missing {
    /// `--data` names no directory.
    #[error("no data directory `{}` ({}){}", path.display(), list("data directories beside it", found, "none beside it either"), START)]
    DataDir {
        /// The directory asked for.
        path: PathBuf,
        /// The directories beside it that hold waku data.
        found: Vec<String>,
    },
    /// The data directory holds no embedded log.
    #[error("the data directory `{}` holds no log (no `log.redb`: nothing was published there){}", path.display(), START)]
    NoLog {
        /// The data directory.
        path: PathBuf,
    },
    /// The data directory holds no such projection.
    #[error("projection `{name}` does not exist in `{}` ({})", data.display(), list("its projections", found, "it holds none yet: `waku run` creates one"))]
    Projection {
        /// The name asked for.
        name: String,
        /// The data directory.
        data: PathBuf,
        /// The projections it holds.
        found: Vec<String>,
    },
    /// The PostgreSQL state holds no such projection.
    #[error(
        "projection `{name}` does not exist in the PostgreSQL state ({})",
        list("its projections", found, "it holds none yet: `waku run --state …` creates one")
    )]
    StateProjection {
        /// The name asked for.
        name: String,
        /// The projections it holds.
        found: Vec<String>,
    },
    /// The log holds no such topic.
    #[error("topic `{name}` does not exist ({})", list("the log's topics", found, "the log holds none yet"))]
    Topic {
        /// The name asked for.
        name: String,
        /// The topics the log holds.
        found: Vec<String>,
    },
    /// The topic given first is a later topic of a projection over
    /// several: another one names its retry and dead-letter topics.
    #[error(
        "dead letters of projection `{projection}` are in `dlq_{first}`, named by its first topic `{first}`, not \
         `{given}`; give --topic {first} first (its topics: {})",
        topics.join(", ")
    )]
    NotFirstTopic {
        /// The projection.
        projection: String,
        /// The topic given first.
        given: String,
        /// The projection's first topic.
        first: String,
        /// Every topic the projection consumes, as its state records them.
        topics: Vec<String>,
    },
    /// The log could not say which topics it holds.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The state could not say which topics the projection consumes.
    #[error(transparent)]
    State(#[from] crate::storage::state::StateError),
}

/// How a data directory comes to be.
const START: &str = "; `waku publish --partitions N` or `waku run` creates one";

/// `what: a, b`, or `none` when nothing was found.
fn list(what: &str, found: &[String], none: &str) -> String {
    match found.is_empty() {
        true => none.to_owned(),
        false => format!("{what}: {}", found.join(", ")),
    }
}

/// `data` must be a directory.
pub(super) fn data_dir(data: &Path) -> Result<(), Missing> {
    if data.is_dir() {
        return Ok(());
    }
    let parent = data.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut found: Vec<String> = std::fs::read_dir(parent)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.join("log.redb").is_file() || path.join("projections").is_dir())
        .filter_map(|path| Some(path.file_name()?.to_string_lossy().into_owned()))
        .collect();
    found.sort();
    Err(Missing::DataDir { path: data.to_owned(), found })
}

impl Missing {
    /// Whether it names others beside what was asked for (a likely typo).
    pub(super) fn names_others(&self) -> bool {
        matches!(self, Missing::DataDir { found, .. } if !found.is_empty())
    }
}

/// `data` must be a directory holding an embedded log.
pub(super) fn log_file(data: &Path) -> Result<(), Missing> {
    data_dir(data)?;
    match data.join("log.redb").is_file() {
        true => Ok(()),
        false => Err(Missing::NoLog { path: data.to_owned() }),
    }
}

/// The projections of the data directory `data`: those with a store
/// (`projections/<name>.redb`) or a promoted rebuild's pointer
/// (`projections/<name>.active`), sorted.
pub(super) fn projections(data: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(data.join("projections"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "redb" || ext == "active"))
        .filter_map(|path| Some(path.file_stem()?.to_string_lossy().into_owned()))
        .collect();
    found.sort();
    found.dedup();
    found
}

/// `projection` must have a store in the data directory `data` (its own,
/// or the one a promoted rebuild points to).
pub(super) fn projection(data: &Path, projection: &str) -> Result<(), Missing> {
    data_dir(data)?;
    let paths = RebuildPaths::new(data, projection);
    let active = paths.active_store().unwrap_or_else(|_| paths.original_store());
    match data.join(active).is_file() {
        true => Ok(()),
        false => {
            Err(Missing::Projection { name: projection.to_owned(), data: data.to_owned(), found: projections(data) })
        }
    }
}

/// `topic` must be a topic of `log`.
pub(super) async fn topic(log: &impl EventLog, topic: &str) -> Result<(), Missing> {
    let topics = log.topics().await?;
    match topics.iter().any(|(name, _)| name == topic) {
        true => Ok(()),
        false => {
            Err(Missing::Topic { name: topic.to_owned(), found: topics.into_iter().map(|(name, _)| name).collect() })
        }
    }
}

/// `given` must be the first topic of the projection `store` holds when
/// that projection consumes several topics (a topic given alone that is a
/// later one names the wrong retry and dead-letter topics). The topics a
/// projection over several consumes are those its release checkpoint
/// names ([`crate::engine::consumer::marked_topics`]); the first is the one whose dead-letter
/// topic the host created in `log`. When that is not clear (a projection
/// of one topic, or two of its topics with dead-letter topics), nothing
/// is refused.
pub(super) async fn first_topic(
    log: &impl EventLog,
    store: &StateStore,
    projection: &str,
    given: &str,
) -> Result<(), Missing> {
    let topics = crate::engine::consumer::marked_topics(store)?;
    if topics.len() < 2 || !topics.iter().any(|topic| topic == given) {
        return Ok(());
    }
    let in_log: Vec<String> = log.topics().await?.into_iter().map(|(name, _)| name).collect();
    let named: Vec<&String> = topics.iter().filter(|topic| in_log.contains(&dlq_topic(topic))).collect();
    match named.as_slice() {
        [first] if *first != given => Err(Missing::NotFirstTopic {
            projection: projection.to_owned(),
            given: given.to_owned(),
            first: (*first).clone(),
            topics: topics.clone(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::log::embedded::EmbeddedLog;

    #[test]
    fn a_missing_data_directory_lists_the_ones_beside_it_and_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("waku-data/projections")).unwrap();
        std::fs::create_dir_all(dir.path().join("unrelated")).unwrap();
        let nowhere = dir.path().join("nowhere");
        let error = data_dir(&nowhere).unwrap_err().to_string();
        assert!(error.starts_with(&format!("no data directory `{}`", nowhere.display())), "{error}");
        assert!(error.contains("(data directories beside it: waku-data)"), "{error}");
        assert!(!nowhere.exists());
        let error = log_file(&dir.path().join("waku-data")).unwrap_err().to_string();
        assert!(error.contains("holds no log"), "{error}");
    }

    #[test]
    fn a_missing_projection_lists_the_ones_there() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("projections")).unwrap();
        std::fs::write(dir.path().join("projections/bank.redb"), b"").unwrap();
        std::fs::write(dir.path().join("projections/carts.active"), b"").unwrap();
        projection(dir.path(), "bank").unwrap();
        let error = projection(dir.path(), "nope").unwrap_err().to_string();
        assert!(error.ends_with("(its projections: bank, carts)"), "{error}");
        assert!(!dir.path().join("projections/nope.redb").exists());
        let empty = tempfile::tempdir().unwrap();
        let error = projection(empty.path(), "nope").unwrap_err().to_string();
        assert!(error.ends_with("(it holds none yet: `waku run` creates one)"), "{error}");
    }

    #[tokio::test]
    async fn a_missing_topic_lists_the_logs_topics() {
        let dir = tempfile::tempdir().unwrap();
        let log = EmbeddedLog::open(dir.path().join("log.redb")).unwrap();
        log.create_topic("accounts", 2).await.unwrap();
        log.create_topic("orders", 1).await.unwrap();
        topic(&log, "orders").await.unwrap();
        let error = topic(&log, "order").await.unwrap_err().to_string();
        assert_eq!(error, "topic `order` does not exist (the log's topics: accounts, orders)");
    }
}
