//! [`LifecycleError`]: why a lifecycle operation failed.
//!
//! One enum for the whole module, as callers branch on it (`waku run`
//! names a missing emit topic, `waku modules rollback` a refused version).
//! Rules kept here:
//! - A message names what failed (the module, the version, the topic, the
//!   file) and, where there is one, what the operator can do about it.
//! - A refused rollback keeps its cause ([`LifecycleError::RollbackRefused`]
//!   boxes it), so the cause chain says why the kept version is refused.

use std::path::PathBuf;

use crate::engine::projection::ProjectionError;
use crate::storage::log::LogError;
use crate::storage::state::StateError;

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
    /// run ([`super::CreateTopics`]).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_names_what_was_done_and_the_file() {
        let error = LifecycleError::Io {
            what: "reading",
            path: PathBuf::from("/data/modules/bank.wasm"),
            source: std::io::Error::other("disk on fire"),
        };
        assert_eq!(error.to_string(), "reading `/data/modules/bank.wasm`: disk on fire");
    }

    #[test]
    fn a_refused_rollback_says_what_runs_on_and_why() {
        let cause = LifecycleError::MissingEmitTopic { module: "bank".into(), topic: "audit".into() };
        let error = LifecycleError::RollbackRefused {
            module: "bank".into(),
            version: "0123".into(),
            running: "4567".into(),
            source: Box::new(cause),
        };
        let text = error.to_string();
        assert!(
            text.starts_with("module `bank`: version 0123 is refused, and 4567 runs on (nothing changed): "),
            "{text}"
        );
        assert!(text.contains("topic `audit`, which does not exist"), "{text}");
        let source = std::error::Error::source(&error).expect("the cause is kept");
        assert!(source.to_string().starts_with("module `bank` declares it emits to topic `audit`"), "{source}");
    }

    #[test]
    fn a_missing_emit_topic_says_how_to_have_it_created() {
        let error = LifecycleError::MissingEmitTopic { module: "bank".into(), topic: "audit".into() };
        assert!(error.to_string().contains("--create-emit-topics <PARTITIONS>"), "{error}");
        let error = LifecycleError::EmitTopicsCreated { module: "bank".into(), topic: "audit".into(), limit: 3 };
        assert!(error.to_string().contains("already created 3 emit topics"), "{error}");
    }

    #[test]
    fn an_unknown_module_lists_the_known_ones() {
        let error = LifecycleError::UnknownModule {
            projection: "bank".into(),
            module: "fees".into(),
            known: "bank, audit".into(),
        };
        assert_eq!(error.to_string(), "projection `bank` has no module `fees` (it has: bank, audit)");
    }
}
