//! [`Reloader`]: watches a projection's module directory and has the
//! [`Library`] apply its changes.
//!
//! Rules kept here:
//! - **Hot reload never stops the consumer**: the reload runs on a
//!   blocking thread ([`Library::reload`] compiles there), and swaps
//!   modules in between batches.
//! - **Changes are coalesced**: however many come while a reload runs, one
//!   more reload follows; and a reload waits until the directory has been
//!   quiet for [`Reloader::SETTLE`], so a file being copied is read once it
//!   is complete.
//! - **Only module files reload** ([`reloads_on`]).
//! - **A failed or panicking reload is logged, and the watching goes on**;
//!   dropping the [`Reloader`] stops it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{Library, LifecycleError};
use crate::engine::projection::Projection;

/// Watches a projection's module directory and swaps changed modules in.
/// Dropping it stops the watching.
pub struct Reloader {
    _watcher: notify::RecommendedWatcher,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Reloader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Reloader {
    /// How long the directory must be quiet before a reload, so a file
    /// being copied is read once it is complete.
    pub const SETTLE: Duration = Duration::from_millis(50);

    /// Starts watching `module_dir` for `projection`. Must be called inside
    /// a tokio runtime.
    pub fn watch(
        library: Arc<Library>,
        projection: Arc<Projection>,
        module_dir: &Path,
    ) -> Result<Self, LifecycleError> {
        use notify::Watcher;
        // Changes are coalesced: however many come while a reload runs,
        // one more reload follows.
        let changed = Arc::new(tokio::sync::Notify::new());
        let signal = changed.clone();
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if reloads_on(&event) {
                signal.notify_one();
            }
        })
        .map_err(|e| watch_error(module_dir, e))?;
        watcher.watch(module_dir, notify::RecursiveMode::NonRecursive).map_err(|e| watch_error(module_dir, e))?;
        let dir = module_dir.to_owned();
        let task = tokio::spawn(async move {
            loop {
                changed.notified().await;
                // Wait until the directory has been quiet for a moment.
                while tokio::time::timeout(Self::SETTLE, changed.notified()).await.is_ok() {}
                let (library, projection, dir) = (library.clone(), projection.clone(), dir.clone());
                let reloaded = tokio::task::spawn_blocking(move || library.reload(&projection, &dir)).await;
                match reloaded {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => tracing::error!("reloading modules failed: {error}"),
                    Err(panic) => tracing::error!("reloading modules panicked: {panic}"),
                }
            }
        });
        Ok(Self { _watcher: watcher, task })
    }
}

fn watch_error(dir: &Path, error: notify::Error) -> LifecycleError {
    LifecycleError::Io { what: "watching", path: dir.to_owned(), source: std::io::Error::other(error) }
}

/// Whether `event` calls for a reload: only a module file's change does (a
/// stream of changes to other files would have every module read and
/// hashed again), and an event without paths (the watcher lost track);
/// reading a file does not, nor does the watcher's own error.
fn reloads_on(event: &notify::Result<notify::Event>) -> bool {
    let wasm = |path: &PathBuf| path.extension().is_some_and(|ext| ext == "wasm");
    event.as_ref().is_ok_and(|e| !e.kind.is_access() && (e.paths.is_empty() || e.paths.iter().any(wasm)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, CreateKind, EventKind, ModifyKind};

    fn event(kind: EventKind, paths: &[&str]) -> notify::Result<notify::Event> {
        let mut event = notify::Event::new(kind);
        for path in paths {
            event = event.add_path(PathBuf::from(path));
        }
        Ok(event)
    }

    #[test]
    fn only_a_change_to_a_module_file_reloads() {
        let written = EventKind::Modify(ModifyKind::Any);
        assert!(reloads_on(&event(written, &["/modules/bank.wasm"])));
        assert!(reloads_on(&event(EventKind::Create(CreateKind::File), &["/modules/notes.txt", "/modules/fees.wasm"])));
        assert!(!reloads_on(&event(written, &["/modules/notes.txt"])), "another file");
        assert!(!reloads_on(&event(written, &["/modules/.bank.wasm.tmp"])), "a file being written beside it");
        assert!(!reloads_on(&event(EventKind::Access(AccessKind::Any), &["/modules/bank.wasm"])), "a read");
        assert!(reloads_on(&event(written, &[])), "the watcher lost track: look at everything");
        assert!(!reloads_on(&Err(notify::Error::generic("the watcher failed"))));
    }

    #[test]
    fn a_watch_error_names_the_directory() {
        let error = watch_error(Path::new("/data/modules"), notify::Error::generic("too many watches"));
        assert!(
            matches!(&error, LifecycleError::Io { what: "watching", path, .. } if path == Path::new("/data/modules"))
        );
        assert_eq!(error.to_string(), "watching `/data/modules`: too many watches");
    }
}
