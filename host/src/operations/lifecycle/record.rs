//! [`Recorded`]: the versions a projection runs and keeps, as its state
//! store records them, and the kept copies of their bytes on disk.
//!
//! Rules kept here:
//! - **The record lives with the state** (the store's `meta` entry
//!   `modules`, JSON), so a store and the versions that wrote it never part.
//! - **At most [`KEPT_VERSIONS`] versions of a module are kept**, newest
//!   first, the active one among them; making a version active again moves
//!   it to the front, never keeps it twice.
//! - **A copy is deleted only once no saved record names it**:
//!   [`Recorded::save`] writes the record first and deletes the forgotten
//!   copies after, and each store's record names its own copies directory
//!   ([`Recorded::copies`]), which must lie inside the data directory.
//! - **A copy is written whole or not at all** ([`keep_copy`]: a temporary
//!   file renamed into place), and one already there is not written again.
//! - **The swap history is bounded**: the record keeps the last
//!   [`SWAPS_KEPT`] swaps ([`Swap`]: which version of which module came
//!   in, when, by what action), oldest first, for `/console`; records
//!   written before it have none.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::LifecycleError;
use crate::storage::state::StateStore;

/// Versions kept per module (the active one included).
pub const KEPT_VERSIONS: usize = 5;

/// Swaps the record remembers, the most recent.
pub const SWAPS_KEPT: usize = 50;

/// One version of a module made active ([`Recorded::swapped`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Swap {
    /// The module.
    pub module: String,
    /// The version that came in.
    pub version: String,
    /// How: `start` (the first start, or one adopting the directory's
    /// version), `reload` (a changed file swapped in while running) or
    /// `rollback` (a kept version run again, back or forward).
    pub action: String,
    /// When, ms since the epoch.
    pub at_ms: u64,
}

/// The `meta` entry holding the recorded versions.
const META: &str = "modules";

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
    /// The last [`SWAPS_KEPT`] swaps, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub swaps: Vec<Swap>,
}

impl Recorded {
    /// The record `store` holds (none yet: an empty one), its copies
    /// directory filled in with `default_copies` when it names none.
    /// A copies directory that is not a relative path down inside the
    /// data directory is refused as corrupt.
    pub(super) fn read(store: &StateStore, default_copies: &Path) -> Result<Self, LifecycleError> {
        let mut recorded: Recorded = match store.meta(META)? {
            None => Recorded::default(),
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| LifecycleError::Corrupt(e.to_string()))?,
        };
        let copies = recorded.copies.get_or_insert_with(|| default_copies.to_owned());
        let inside = copies.components().all(|part| matches!(part, std::path::Component::Normal(_)));
        if !inside || copies.as_os_str().is_empty() {
            let message = format!("the kept copies directory {} is not inside the data directory", copies.display());
            return Err(LifecycleError::Corrupt(message));
        }
        Ok(recorded)
    }

    /// Saves the record in `store`, then deletes the `forgotten` kept
    /// copies: a copy goes only once no saved record names it.
    pub(super) fn save(&self, store: &StateStore, forgotten: Vec<PathBuf>) -> Result<(), LifecycleError> {
        let bytes = serde_json::to_vec(self).map_err(|e| LifecycleError::Corrupt(e.to_string()))?;
        store.set_meta(META, &bytes)?;
        for path in forgotten {
            let _ = std::fs::remove_file(&path);
            // The module's directory of copies, once it holds none.
            if let Some(module_dir) = path.parent() {
                let _ = std::fs::remove_dir(module_dir);
            }
        }
        Ok(())
    }

    /// The kept copy of `version` of `module`, under the data directory
    /// `data`: in the record's copies directory, or `default_copies` when
    /// it names none.
    pub(super) fn kept_path(&self, data: &Path, default_copies: &Path, module: &str, version: &str) -> PathBuf {
        let copies = self.copies.as_deref().unwrap_or(default_copies);
        data.join(copies).join(module).join(format!("{version}.wasm"))
    }

    /// Makes `version` of `module` active and the newest kept one; returns
    /// the versions past [`KEPT_VERSIONS`], which are no longer kept.
    pub(super) fn make_active(&mut self, module: &str, version: &str) -> Vec<String> {
        self.active.insert(module.to_owned(), version.to_owned());
        let kept = self.kept.entry(module.to_owned()).or_default();
        kept.retain(|v| v != version);
        kept.insert(0, version.to_owned());
        kept.split_off(KEPT_VERSIONS.min(kept.len()))
    }

    /// Notes that `version` of `module` came in by `action` now, dropping
    /// the oldest swaps past [`SWAPS_KEPT`].
    pub(super) fn swapped(&mut self, module: &str, version: &str, action: &str) {
        let at_ms = crate::platform::clock::now_ms();
        let swap = Swap { module: module.to_owned(), version: version.to_owned(), action: action.to_owned(), at_ms };
        self.swaps.push(swap);
        let over = self.swaps.len().saturating_sub(SWAPS_KEPT);
        self.swaps.drain(..over);
    }

    /// Forgets `module` altogether (nothing runs it, nothing rolls it
    /// back); returns the versions that were kept.
    pub(super) fn forget(&mut self, module: &str) -> Vec<String> {
        self.active.remove(module);
        self.kept.remove(module).unwrap_or_default()
    }

    /// The (active, target) versions of a rollback of `module` of
    /// `projection` to `version` (a prefix of a kept one; default: the
    /// kept version before the active one).
    pub(super) fn rollback_target(
        &self,
        projection: &str,
        module: &str,
        version: Option<&str>,
    ) -> Result<(String, String), LifecycleError> {
        let Some(active) = self.active.get(module).cloned() else {
            return Err(LifecycleError::UnknownModule {
                projection: projection.to_owned(),
                module: module.to_owned(),
                known: self.active.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        };
        let kept = self.kept.get(module).cloned().unwrap_or_default();
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
}

/// Keeps `bytes` at `path` (a kept copy), unless a copy is there already:
/// written to a temporary file beside it and renamed into place, so a
/// crash never leaves half a copy under a version's name.
pub(super) fn keep_copy(path: &Path, bytes: &[u8]) -> Result<(), LifecycleError> {
    if path.exists() {
        return Ok(());
    }
    let writing = |source| LifecycleError::Io { what: "writing", path: path.to_owned(), source };
    let dir = path.parent().expect("a kept path has a parent");
    std::fs::create_dir_all(dir).map_err(|source| LifecycleError::Io {
        what: "creating",
        path: dir.to_owned(),
        source,
    })?;
    let temporary = tempfile::NamedTempFile::new_in(dir).map_err(writing)?;
    std::fs::write(temporary.path(), bytes).map_err(writing)?;
    temporary.persist(path).map_err(|e| writing(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &Path) -> StateStore {
        StateStore::open(&dir.join("state.redb")).unwrap()
    }

    #[test]
    fn a_record_round_trips_through_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let empty = Recorded::read(&store, Path::new("modules/bank")).unwrap();
        assert_eq!(empty, Recorded { copies: Some("modules/bank".into()), ..Recorded::default() });

        let mut recorded = empty;
        recorded.make_active("bank", "v1");
        recorded.make_active("bank", "v2");
        recorded.make_active("fees", "f1");
        recorded.save(&store, Vec::new()).unwrap();
        // The record names its copies directory: another default is ignored.
        let read = Recorded::read(&store, Path::new("elsewhere")).unwrap();
        assert_eq!(read, recorded);
        assert_eq!(read.active["bank"], "v2");
        assert_eq!(read.kept["bank"], ["v2", "v1"]);
    }

    #[test]
    fn a_record_written_before_copies_were_named_takes_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        store.set_meta(META, br#"{"active":{"bank":"v1"},"kept":{"bank":["v1"]}}"#).unwrap();
        let read = Recorded::read(&store, Path::new("modules/bank")).unwrap();
        assert_eq!(read.copies.as_deref(), Some(Path::new("modules/bank")));
        assert_eq!(read.active["bank"], "v1");
    }

    #[test]
    fn a_copies_directory_outside_the_data_directory_or_unreadable_json_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        for copies in ["../elsewhere", "/etc", "modules/../../x", ""] {
            let record = Recorded { copies: Some(copies.into()), ..Recorded::default() };
            record.save(&store, Vec::new()).unwrap();
            let read = Recorded::read(&store, Path::new("modules/bank"));
            assert!(matches!(read, Err(LifecycleError::Corrupt(_))), "{copies:?}: {read:?}");
        }
        store.set_meta(META, b"{not json").unwrap();
        assert!(matches!(Recorded::read(&store, Path::new("modules/bank")), Err(LifecycleError::Corrupt(_))));
    }

    #[test]
    fn only_the_last_versions_are_kept_newest_first() {
        let mut recorded = Recorded::default();
        let mut forgotten = Vec::new();
        for version in 0..KEPT_VERSIONS + 2 {
            forgotten.extend(recorded.make_active("bank", &format!("v{version}")));
        }
        assert_eq!(forgotten, ["v0", "v1"]);
        let newest_first: Vec<String> = (2..KEPT_VERSIONS + 2).rev().map(|v| format!("v{v}")).collect();
        assert_eq!(recorded.kept["bank"], newest_first);
        assert_eq!(recorded.active["bank"], format!("v{}", KEPT_VERSIONS + 1));

        // Made active again: moved to the front, not kept twice.
        assert!(recorded.make_active("bank", "v3").is_empty());
        assert_eq!(recorded.kept["bank"][0], "v3");
        assert_eq!(recorded.kept["bank"].iter().filter(|v| *v == "v3").count(), 1);
        assert_eq!(recorded.kept["bank"].len(), KEPT_VERSIONS);
    }

    #[test]
    fn a_forgotten_module_is_neither_active_nor_kept() {
        let mut recorded = Recorded::default();
        recorded.make_active("bank", "v1");
        recorded.make_active("bank", "v2");
        recorded.make_active("fees", "f1");
        assert_eq!(recorded.forget("bank"), ["v2", "v1"]);
        assert!(!recorded.active.contains_key("bank") && !recorded.kept.contains_key("bank"));
        assert_eq!(recorded.active["fees"], "f1");
        assert!(recorded.forget("bank").is_empty());
    }

    #[test]
    fn a_rollback_goes_to_the_version_before_or_the_one_a_prefix_names() {
        let mut recorded = Recorded::default();
        for version in ["aaa1", "bbb2", "ccc3"] {
            recorded.make_active("bank", version);
        }
        let target = |version| recorded.rollback_target("proj", "bank", version);
        assert_eq!(target(None).unwrap(), ("ccc3".to_owned(), "bbb2".to_owned()));
        assert_eq!(target(Some("aa")).unwrap(), ("ccc3".to_owned(), "aaa1".to_owned()));
        assert!(
            matches!(target(Some("zz")), Err(LifecycleError::UnknownVersion { kept, .. }) if kept == "ccc3, bbb2, aaa1")
        );

        // Rolled back to the oldest: nothing before it.
        recorded.active.insert("bank".into(), "aaa1".into());
        let target = |version| recorded.rollback_target("proj", "bank", version);
        assert!(matches!(target(None), Err(LifecycleError::NothingToRollBackTo { active, .. }) if active == "aaa1"));
        let unknown = recorded.rollback_target("proj", "fees", None);
        assert!(matches!(unknown, Err(LifecycleError::UnknownModule { known, .. }) if known == "bank"));
    }

    #[test]
    fn a_kept_path_lies_in_the_records_copies_directory() {
        let data = Path::new("/data");
        let mut recorded = Recorded::default();
        let path = recorded.kept_path(data, Path::new("modules/bank"), "fees", "v1");
        assert_eq!(path, Path::new("/data/modules/bank/fees/v1.wasm"));
        recorded.copies = Some("rebuilds/bank/1/kept".into());
        let path = recorded.kept_path(data, Path::new("modules/bank"), "fees", "v1");
        assert_eq!(path, Path::new("/data/rebuilds/bank/1/kept/fees/v1.wasm"));
    }

    #[test]
    fn a_copy_is_written_once_and_saving_deletes_the_forgotten_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("modules/bank/fees/v1.wasm");
        keep_copy(&path, b"first").unwrap();
        keep_copy(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"first", "a copy already kept is not written again");
        let module_dir = path.parent().unwrap();
        assert_eq!(std::fs::read_dir(module_dir).unwrap().count(), 1, "no temporary file is left behind");

        Recorded::default().save(&store(dir.path()), vec![path.clone()]).unwrap();
        assert!(!path.exists());
        assert!(!module_dir.exists(), "the module's directory of copies goes once empty");
    }
}
