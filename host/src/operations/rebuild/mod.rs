//! Rebuilding a projection in the shadow, promoting it, rolling it back.
//!
//! `waku rebuild` cannot open the projection's store while `waku run`
//! holds it, so the running host does the work: the command leaves a
//! durable request in the data directory and the host picks it up between
//! two checks of its [`conductor`].
//!
//! Files, under `<data>/rebuilds/<projection>/`:
//! - `request.toml` ([`Request`]): the rebuild asked for; at most one.
//! - `<generation>/modules/`: a copy of the new module directory, taken when
//!   the rebuild is asked for (later edits of the original do not leak in).
//! - `<generation>/state.redb`: the shadow's store.
//! - `<generation>/kept/`: the copies of the module versions its store's
//!   record names (kept apart from every other store's, see
//!   [`crate::operations::lifecycle::Recorded::copies`]).
//! - `promote`: a person's go-ahead (`waku rebuild --promote`) for a
//!   shadow that waits for one; `rollback`: a request to go back.
//!
//! And `<data>/projections/<projection>.active` ([`Pointer`]): which store
//! is the projection's (absent: the original `<projection>.redb`) and which
//! one was before it. It is replaced with one rename, so after a crash at
//! any moment the projection is either the old one or the promoted one,
//! never a mix: the promoted store holds the state of exactly the live
//! positions before the pointer names it.
//!
//! Rules it keeps:
//! - The shadow consumes every topic of the projection (the topics its
//!   host runs with, in the same order: the request names them, and a
//!   request naming others is refused, [`RebuildError::OtherTopics`]) from
//!   offset 0 with the new modules, under the name `<projection>.rebuild`:
//!   over several topics through the same release stage as the live
//!   consumer, so in the same event-time order. Its emitted messages are
//!   held back ([`stores::HoldBackEmits`]); its failures go to retry and
//!   dead-letter topics of its own ([`RoutedTopics::shadow`] of the first
//!   topic: `retry_<topic>.rebuild`, `dlq_<topic>.rebuild`, under the
//!   host-owned prefixes modules may not emit to), made when it starts with
//!   the topic's partition count, its positions there set to their end
//!   (what is there is an earlier rebuild's). The shared ones never see it.
//! - Promotion is decided from positions and end offsets, never a timer:
//!   once the shadow reached the end offsets read when it started and has
//!   nothing waiting in retry, the live consumer is paused after its batch
//!   in flight, whichever of the two is behind consumes up to exactly the
//!   other's positions, and the host switches state and modules before the
//!   next batch. Over several topics the two are lined up where neither
//!   holds an event for event-time order: each catches up (every input of
//!   every partition to the end offset read as it starts, nothing held),
//!   the one then behind again, until both stand at the same position of
//!   every partition of every topic; so each has applied exactly the events
//!   below those positions. A line-up that does not meet within
//!   [`conductor::LINE_UP_ROUNDS`] (the topics are written to all the
//!   while) lets both follow again and is tried at the next check. No event
//!   is lost or applied twice across the switch, nor its emits. An
//!   automatic promotion waits for a person when the new modules
//!   dead-lettered events (the promoted state would lack them).
//! - The promoted projection routes to the topic's shared retry and
//!   dead-letter topics again, and takes the shared retry topic from its
//!   end at promotion: the live projection's earlier retry records concern
//!   events the shadow applied itself, and the shadow's own retry topic
//!   holds nothing waiting (promotion waits for that). Its dead letters
//!   stay in the shadow's topic and are the promoted projection's:
//!   [`crate::operations::dead_letter::Shelf::rebuilt`] (`waku dlq … --rebuilt`) lists
//!   and re-drives them into the shared retry topic under its own name.
//! - The previous store and its recorded module versions are kept;
//!   rollback switches back the same way, one step back (the pointer then
//!   names no previous store). The rolled-back store consumes again, with
//!   its old modules, every event the promoted one applied (their emits are
//!   sent again); the promoted store's retry records are marked done in it
//!   and the rebuild's dead letters settled (its position in the shadow's
//!   dead-letter topic moves to the end).
//! - Both change the running host's modules in memory before the pointer's
//!   rename, and back if it fails: a running host never serves one store
//!   with the other's modules.
//! - Only the embedded store can host a shadow; with PostgreSQL state a
//!   rebuild is refused.
//!
//! Files: `conductor` runs a rebuild from the host (request, shadow,
//! line-up, promotion, rollback); `stores` holds the two store wrappers
//! a rebuild needs (the switching store, the emits held back).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use wakuwaku_core::terminal::printable;

#[cfg(doc)]
use crate::engine::routing::RoutedTopics;
use crate::sandbox::runtime::component_file::{check_module_dir_size, module_paths};
use crate::sandbox::runtime::read_component;

pub(crate) mod conductor;
pub(crate) mod stores;

pub use conductor::RebuildWatch;

/// The name a rebuild of `projection` runs under: its retry and
/// dead-letter records carry it.
pub fn shadow_name(projection: &str) -> String {
    format!("{projection}.rebuild")
}

/// When a caught-up shadow is promoted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Promote {
    /// As soon as it caught up with the live projection.
    Auto,
    /// When a person says so (`waku rebuild --promote`).
    Manual,
}

impl Promote {
    /// `auto` or `manual`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Manual => "manual",
        }
    }
}

/// A rebuild asked for: `request.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The projection.
    pub projection: String,
    /// Its first topic (it names the retry and dead-letter topics).
    pub topic: String,
    /// Its other topics, for a projection over several.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_topics: Vec<String>,
    /// Names the shadow's directory, `<generation>/`.
    pub generation: u64,
    /// When to promote.
    pub promote: Promote,
}

impl Request {
    /// Every topic of the projection, the first one first.
    pub fn topics(&self) -> Vec<String> {
        std::iter::once(&self.topic).chain(&self.more_topics).cloned().collect()
    }
}

/// Which store is the projection's: `<projection>.active`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pointer {
    /// The active store, relative to the data directory.
    pub active: PathBuf,
    /// The store before it, kept for rollback.
    pub previous: Option<PathBuf>,
    /// The retry topic's end offsets when the active store was promoted:
    /// retry records from there on belong to it, not to `previous`.
    #[serde(default)]
    pub retry_ends: Vec<u64>,
}

/// Why a rebuild file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RebuildError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file holds something else than it should.
    #[error("{} is not a valid rebuild file: {message}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A rebuild of the projection is already asked for.
    #[error("a rebuild of `{projection}` (generation {generation}) is already under way")]
    Pending {
        /// The projection.
        projection: String,
        /// Its generation.
        generation: u64,
    },
    /// The new module directory holds no module.
    #[error("{} holds no *.wasm module", dir.display())]
    NoModules {
        /// The directory.
        dir: PathBuf,
    },
    /// `--promote` without a rebuild waiting for it.
    #[error("no rebuild of `{projection}` is under way")]
    NoneUnderWay {
        /// The projection.
        projection: String,
    },
    /// The rebuild names other topics than the projection's host runs with.
    #[error(
        "projection `{projection}` consumes `{}` (as its host last started), but the rebuild names `{}`: give every \
         topic of the projection, in the order `waku run` takes them",
        consumed.join("`, `"),
        asked.join("`, `")
    )]
    OtherTopics {
        /// The projection.
        projection: String,
        /// The topics the rebuild names.
        asked: Vec<String>,
        /// The topics it consumes.
        consumed: Vec<String>,
    },
    /// The rebuild names no topic.
    #[error("a rebuild of `{projection}` names no topic")]
    NoTopic {
        /// The projection.
        projection: String,
    },
    /// `--rollback` without a previous store.
    #[error("projection `{projection}` has no previous state to roll back to (it was never promoted)")]
    NothingToRollBackTo {
        /// The projection.
        projection: String,
    },
}

/// Where a projection's rebuild files are.
#[derive(Debug, Clone)]
pub struct RebuildPaths {
    data: PathBuf,
    projection: String,
}

impl RebuildPaths {
    /// The rebuild files of `projection` in the data directory `data`.
    pub fn new(data: &Path, projection: &str) -> Self {
        Self { data: data.to_owned(), projection: projection.to_owned() }
    }

    /// `<data>/rebuilds/<projection>`.
    pub fn dir(&self) -> PathBuf {
        self.data.join("rebuilds").join(&self.projection)
    }

    fn request_path(&self) -> PathBuf {
        self.dir().join("request.toml")
    }

    /// The go-ahead file of a manual promotion.
    pub fn promote_path(&self) -> PathBuf {
        self.dir().join("promote")
    }

    /// The rollback request file.
    pub fn rollback_path(&self) -> PathBuf {
        self.dir().join("rollback")
    }

    /// The shadow's directory of `generation`.
    pub fn generation_dir(&self, generation: u64) -> PathBuf {
        self.dir().join(generation.to_string())
    }

    /// The copy of the new modules of `generation`.
    pub fn modules_dir(&self, generation: u64) -> PathBuf {
        self.generation_dir(generation).join("modules")
    }

    /// Where the shadow of `generation` keeps the copies of its module
    /// versions, relative to the data directory: apart from the live
    /// store's, so neither forgets a copy the other's record names.
    pub fn kept_copies(&self, generation: u64) -> PathBuf {
        Path::new("rebuilds").join(&self.projection).join(generation.to_string()).join("kept")
    }

    /// The shadow store of `generation`, relative to the data directory.
    pub fn shadow_store(&self, generation: u64) -> PathBuf {
        Path::new("rebuilds").join(&self.projection).join(generation.to_string()).join("state.redb")
    }

    /// The original store, relative to the data directory.
    pub fn original_store(&self) -> PathBuf {
        Path::new("projections").join(format!("{}.redb", self.projection))
    }

    fn pointer_path(&self) -> PathBuf {
        self.data.join("projections").join(format!("{}.active", self.projection))
    }

    /// The data directory joined with `relative`.
    pub fn absolute(&self, relative: &Path) -> PathBuf {
        self.data.join(relative)
    }

    /// The rebuild asked for, if any.
    pub fn request(&self) -> Result<Option<Request>, RebuildError> {
        read_toml(&self.request_path())
    }

    /// The pointer, if the projection was ever promoted. Its stores must
    /// be inside the data directory.
    pub fn pointer(&self) -> Result<Option<Pointer>, RebuildError> {
        let path = self.pointer_path();
        let pointer: Option<Pointer> = read_toml(&path)?;
        let stores = pointer.iter().flat_map(|p| std::iter::once(&p.active).chain(&p.previous));
        if let Some(outside) = stores.into_iter().find(|store| !inside(store)) {
            let message = format!("store {} is not a path inside the data directory", outside.display());
            return Err(RebuildError::Corrupt { path, message });
        }
        Ok(pointer)
    }

    /// The active store, relative to the data directory.
    pub fn active_store(&self) -> Result<PathBuf, RebuildError> {
        Ok(self.pointer()?.map_or_else(|| self.original_store(), |pointer| pointer.active))
    }

    /// Replaces the pointer in one rename.
    pub fn set_pointer(&self, pointer: &Pointer) -> Result<(), RebuildError> {
        write_toml(&self.pointer_path(), pointer)
    }

    /// Notes the topics a host of the projection starts with, so that a
    /// rebuild naming others is refused when it is asked for
    /// ([`RebuildError::OtherTopics`]) instead of when a host takes it up.
    pub fn note_topics(&self, topics: &[String]) -> Result<(), RebuildError> {
        let path = self.topics_path();
        let io = |source| RebuildError::Io { path: path.clone(), source };
        let topics = distinct(topics);
        if self.noted_topics()?.as_ref() == Some(&topics) {
            return Ok(());
        }
        std::fs::create_dir_all(self.dir()).map_err(io)?;
        std::fs::write(&path, topics.join("\n")).map_err(io)
    }

    /// The topics noted by [`RebuildPaths::note_topics`], if a host ever
    /// started.
    fn noted_topics(&self) -> Result<Option<Vec<String>>, RebuildError> {
        let path = self.topics_path();
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text.lines().map(|topic| printable(topic).into_owned()).collect())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(RebuildError::Io { path, source }),
        }
    }

    fn topics_path(&self) -> PathBuf {
        self.dir().join("topics")
    }

    /// Asks for a rebuild of the projection over `topics` (every one of
    /// them, the first one first; at least one) with the modules of
    /// `modules`, copied into the shadow's directory. Refused while another
    /// is under way, and when a host of the projection last started with
    /// other topics.
    pub fn ask(&self, topics: &[String], modules: &Path, promote: Promote) -> Result<Request, RebuildError> {
        let topics = distinct(topics);
        let Some((topic, more_topics)) = topics.split_first() else {
            return Err(RebuildError::NoTopic { projection: self.projection.clone() });
        };
        if let Some(consumed) = self.noted_topics()?
            && consumed != topics
        {
            let asked = topics;
            return Err(RebuildError::OtherTopics { projection: self.projection.clone(), asked, consumed });
        }
        if let Some(pending) = self.request()? {
            return Err(RebuildError::Pending { projection: self.projection.clone(), generation: pending.generation });
        }
        // The rules of a module directory (`module-count`, `module-dir-size`).
        let wasm = module_paths(modules).map_err(|source| RebuildError::Io { path: modules.to_owned(), source })?;
        let wasm: Vec<PathBuf> = wasm.into_iter().filter(|path| path.is_file()).collect();
        if wasm.is_empty() {
            return Err(RebuildError::NoModules { dir: modules.to_owned() });
        }
        let generation = self.next_generation()?;
        let copy = self.modules_dir(generation);
        let copied = copy_modules(modules, wasm, &copy);
        if let Err(error) = copied {
            // Nothing of a refused request stays behind.
            let _ = std::fs::remove_dir_all(self.generation_dir(generation));
            return Err(error);
        }
        let _ = std::fs::remove_file(self.promote_path());
        let request = Request {
            projection: self.projection.clone(),
            topic: topic.clone(),
            more_topics: more_topics.to_vec(),
            generation,
            promote,
        };
        write_toml(&self.request_path(), &request)?;
        Ok(request)
    }

    /// The go-ahead for a manual promotion.
    pub fn ask_promotion(&self) -> Result<Request, RebuildError> {
        let request =
            self.request()?.ok_or_else(|| RebuildError::NoneUnderWay { projection: self.projection.clone() })?;
        touch(&self.promote_path())?;
        Ok(request)
    }

    /// Asks for a rollback to the previous store.
    pub fn ask_rollback(&self) -> Result<PathBuf, RebuildError> {
        let previous = self
            .pointer()?
            .and_then(|pointer| pointer.previous)
            .ok_or_else(|| RebuildError::NothingToRollBackTo { projection: self.projection.clone() })?;
        touch(&self.rollback_path())?;
        Ok(previous)
    }

    /// Removes what the pending request's generation holds (its copy of
    /// the new modules, its kept copies, its shadow store), unless its
    /// store is the active one: for a rebuild dropped before promotion.
    pub fn remove_pending_generation(&self) -> Result<(), RebuildError> {
        let Some(request) = self.request()? else { return Ok(()) };
        if self.active_store()? == self.shadow_store(request.generation) {
            return Ok(());
        }
        let dir = self.generation_dir(request.generation);
        match std::fs::remove_dir_all(&dir) {
            Err(source) if source.kind() != std::io::ErrorKind::NotFound => Err(RebuildError::Io { path: dir, source }),
            _ => Ok(()),
        }
    }

    /// Forgets the request (after promotion, or when it was promoted
    /// before a crash).
    pub fn finish(&self) -> Result<(), RebuildError> {
        for path in [self.request_path(), self.promote_path()] {
            match std::fs::remove_file(&path) {
                Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
                    return Err(RebuildError::Io { path, source });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// One more than the highest generation directory.
    fn next_generation(&self) -> Result<u64, RebuildError> {
        let dir = self.dir();
        let highest = match std::fs::read_dir(&dir) {
            Ok(entries) => {
                entries.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u64>().ok()).max().unwrap_or(0)
            }
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => 0,
            Err(source) => return Err(RebuildError::Io { path: dir, source }),
        };
        Ok(highest + 1)
    }
}

/// `topics` with each named once, in their order (a projection takes a
/// topic named twice once).
fn distinct(topics: &[String]) -> Vec<String> {
    let mut seen = Vec::with_capacity(topics.len());
    for topic in topics {
        if !seen.contains(topic) {
            seen.push(topic.clone());
        }
    }
    seen
}

/// Copies the module files `wasm` of directory `modules` into `copy`,
/// under a module directory's size rule (`module-dir-size`).
fn copy_modules(modules: &Path, wasm: Vec<PathBuf>, copy: &Path) -> Result<(), RebuildError> {
    std::fs::create_dir_all(copy).map_err(|source| RebuildError::Io { path: copy.to_owned(), source })?;
    let mut total = 0;
    for file in wasm {
        let target = copy.join(file.file_name().unwrap_or_default());
        let bytes = read_component(&file).map_err(|source| RebuildError::Io { path: file.clone(), source })?;
        total += bytes.len() as u64;
        check_module_dir_size(total).map_err(|e| RebuildError::Io { path: modules.to_owned(), source: e.into() })?;
        std::fs::write(&target, bytes).map_err(|source| RebuildError::Io { path: target.clone(), source })?;
    }
    Ok(())
}

fn read_toml<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, RebuildError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(source) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(RebuildError::Io { path: path.to_owned(), source }),
    };
    toml::from_str(&text)
        .map(Some)
        .map_err(|e| RebuildError::Corrupt { path: path.to_owned(), message: e.message().to_owned() })
}

/// Writes `value` to a temporary file, syncs it, and renames it over
/// `path`: readers see the old file or the new one, never a part.
fn write_toml<T: Serialize>(path: &Path, value: &T) -> Result<(), RebuildError> {
    let io = |source| RebuildError::Io { path: path.to_owned(), source };
    let text =
        toml::to_string(value).map_err(|e| RebuildError::Corrupt { path: path.to_owned(), message: e.to_string() })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut file = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    std::io::Write::write_all(&mut file, text.as_bytes()).map_err(io)?;
    file.as_file().sync_all().map_err(io)?;
    file.persist(path).map_err(|e| io(e.error))?;
    // The rename itself is durable once the directory is.
    if let Ok(dir) = std::fs::File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Whether `relative` stays inside the directory it is relative to.
fn inside(relative: &Path) -> bool {
    relative.components().all(|part| matches!(part, std::path::Component::Normal(_)))
        && relative.components().next().is_some()
}

fn touch(path: &Path) -> Result<(), RebuildError> {
    let io = |source| RebuildError::Io { path: path.to_owned(), source };
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new("."))).map_err(io)?;
    std::fs::write(path, b"").map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::runtime::component_file::MAX_MODULES;

    fn accounts() -> Vec<String> {
        vec!["accounts".to_owned()]
    }

    #[test]
    fn a_rebuild_names_every_topic_its_projections_host_started_with_in_order() {
        let data = tempfile::tempdir().unwrap();
        let modules = data.path().join("new");
        std::fs::create_dir_all(&modules).unwrap();
        std::fs::write(modules.join("ledger.wasm"), b"not really").unwrap();
        let paths = RebuildPaths::new(data.path(), "ledger");
        let topics = |names: &[&str]| names.iter().map(|name| name.to_string()).collect::<Vec<_>>();
        paths.note_topics(&topics(&["a", "b"])).unwrap();
        for other in [&["a"][..], &["b", "a"], &["a", "b", "c"]] {
            let error = paths.ask(&topics(other), &modules, Promote::Auto).unwrap_err();
            assert!(matches!(error, RebuildError::OtherTopics { .. }), "{other:?}: {error}");
            let said = error.to_string();
            assert!(said.contains("consumes `a`, `b` (as its host last started)"), "{said}");
        }
        assert!(matches!(paths.ask(&[], &modules, Promote::Auto), Err(RebuildError::NoTopic { .. })));
        assert!(paths.request().unwrap().is_none() && !paths.generation_dir(1).exists(), "a refusal left files");
        let request = paths.ask(&topics(&["a", "b"]), &modules, Promote::Auto).unwrap();
        assert_eq!((request.topic.as_str(), request.topics()), ("a", topics(&["a", "b"])));
        assert_eq!(paths.request().unwrap(), Some(request), "the request keeps every topic");
    }

    #[test]
    fn a_request_is_written_once_and_the_pointer_round_trips() {
        let data = tempfile::tempdir().unwrap();
        let modules = data.path().join("new");
        std::fs::create_dir_all(&modules).unwrap();
        let paths = RebuildPaths::new(data.path(), "bank");
        assert!(matches!(paths.ask(&accounts(), &modules, Promote::Auto), Err(RebuildError::NoModules { .. })));
        std::fs::write(modules.join("bank.wasm"), b"not really").unwrap();
        let request = paths.ask(&accounts(), &modules, Promote::Manual).unwrap();
        assert_eq!(request.generation, 1);
        assert!(paths.modules_dir(1).join("bank.wasm").is_file());
        assert!(matches!(paths.ask(&accounts(), &modules, Promote::Auto), Err(RebuildError::Pending { .. })));
        assert_eq!(paths.request().unwrap(), Some(request));
        assert!(matches!(paths.ask_rollback(), Err(RebuildError::NothingToRollBackTo { .. })));
        assert_eq!(paths.active_store().unwrap(), paths.original_store());
        let pointer =
            Pointer { active: paths.shadow_store(1), previous: Some(paths.original_store()), retry_ends: vec![3] };
        paths.set_pointer(&pointer).unwrap();
        assert_eq!(paths.pointer().unwrap(), Some(pointer));
        paths.finish().unwrap();
        assert_eq!(paths.request().unwrap(), None);
        assert_eq!(paths.ask(&accounts(), &modules, Promote::Auto).unwrap().generation, 2);
    }

    #[test]
    fn new_modules_past_a_module_directorys_count_are_refused_and_leave_nothing_behind() {
        let data = tempfile::tempdir().unwrap();
        let modules = data.path().join("new");
        std::fs::create_dir_all(&modules).unwrap();
        for n in 0..=MAX_MODULES {
            std::fs::write(modules.join(format!("m{n}.wasm")), b"not really").unwrap();
        }
        let paths = RebuildPaths::new(data.path(), "bank");
        let error = paths.ask(&accounts(), &modules, Promote::Auto).unwrap_err().to_string();
        assert!(error.contains("module-count: a module directory holds at most 64 modules"), "{error}");
        assert!(!paths.dir().exists() && paths.request().unwrap().is_none());
    }

    #[test]
    fn a_dropped_generation_is_removed_unless_its_store_is_active() {
        let data = tempfile::tempdir().unwrap();
        let modules = data.path().join("new");
        std::fs::create_dir_all(&modules).unwrap();
        std::fs::write(modules.join("bank.wasm"), b"not really").unwrap();
        let paths = RebuildPaths::new(data.path(), "bank");
        paths.ask(&accounts(), &modules, Promote::Auto).unwrap();
        assert!(paths.generation_dir(1).exists());
        paths.remove_pending_generation().unwrap();
        assert!(!paths.generation_dir(1).exists(), "the dropped generation's files stay");
        paths.finish().unwrap();

        let request = paths.ask(&accounts(), &modules, Promote::Auto).unwrap();
        let pointer = Pointer { active: paths.shadow_store(request.generation), previous: None, retry_ends: vec![] };
        paths.set_pointer(&pointer).unwrap();
        paths.remove_pending_generation().unwrap();
        assert!(paths.generation_dir(request.generation).exists(), "the active store's generation went");
    }

    #[test]
    fn a_garbled_pointer_or_one_naming_a_store_outside_the_data_is_an_error_naming_the_file() {
        let data = tempfile::tempdir().unwrap();
        let paths = RebuildPaths::new(data.path(), "bank");
        std::fs::create_dir_all(data.path().join("projections")).unwrap();
        for garbled in ["active = 3", "active = \"../../elsewhere.redb\"", "active = \"/etc/x.redb\"", "active = \"\""]
        {
            std::fs::write(data.path().join("projections/bank.active"), garbled).unwrap();
            let error = paths.active_store().unwrap_err().to_string();
            assert!(error.contains("bank.active"), "{garbled}: {error}");
        }
    }
}
