//! [`Difference`]: how the module directory differs from what a
//! projection runs, as a restart, an `adopt` or a replacement of the whole
//! set reports it.
//!
//! Rules kept here:
//! - A difference is reported, never acted on here: what runs is decided
//!   by the [`super::Library`], which says what it did ([`Difference::Adopted`],
//!   [`Difference::Refused`]) or what it did not take ([`Difference::Changed`],
//!   [`Difference::Missing`]).
//! - Each message names the module and its versions, and says how to take
//!   the directory's version when the running one was kept.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::sandbox::handler::HandlerModule;

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

/// How the directory's versions `in_directory` differ from `running`.
pub(super) fn differences(
    running: &[Arc<dyn HandlerModule>],
    in_directory: &BTreeMap<String, String>,
) -> Vec<Difference> {
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

#[cfg(test)]
mod tests {
    use super::super::fake_module::FakeModule;
    use super::*;

    #[test]
    fn the_running_modules_are_compared_with_the_directory_by_name() {
        let running = [
            FakeModule::new("bank", "b1").shared(),
            FakeModule::new("fees", "f1").shared(),
            FakeModule::new("audit", "a1").shared(),
        ];
        let in_directory: BTreeMap<String, String> =
            [("bank", "b2"), ("audit", "a1"), ("new", "n1")].map(|(n, v)| (n.to_owned(), v.to_owned())).into();
        assert_eq!(
            differences(&running, &in_directory),
            [
                Difference::Changed { module: "bank".into(), running: "b1".into(), in_directory: "b2".into() },
                Difference::Missing { module: "fees".into(), running: "f1".into() },
            ],
            "a module the directory holds as it runs differs in nothing; a new file is not a difference"
        );
        assert!(differences(&[], &in_directory).is_empty());
    }

    #[test]
    fn each_difference_says_what_runs_and_what_to_do() {
        let changed = Difference::Changed { module: "bank".into(), running: "b1".into(), in_directory: "b2".into() };
        assert_eq!(
            changed.to_string(),
            "module `bank`: the directory holds version b2, but b1 is recorded and runs (restart with \
             --adopt-modules, or change the file while running, to take the directory's)"
        );
        let missing = Difference::Missing { module: "bank".into(), running: "b1".into() };
        assert!(missing.to_string().contains("its file is gone from the directory; recorded version b1 runs"));
        let refused = Difference::Refused { module: "bank".into(), version: "b2".into(), error: "no good".into() };
        assert!(refused.to_string().ends_with("(version b2) is refused, and the other modules start: no good"));
        let adopted = Difference::Adopted { module: "bank".into(), from: Some("b1".into()), to: "b2".into() };
        assert_eq!(adopted.to_string(), "module `bank`: b1 → b2");
        let dropped = Difference::Adopted { module: "bank".into(), from: None, to: "b1".into() };
        assert_eq!(dropped.to_string(), "module `bank`: dropped b1");
    }
}
