//! Module lifecycle: which version of each module a projection runs, where
//! the bytes of its versions are kept, what a restart runs, and how new
//! versions arrive while it runs (hot reload).
//!
//! Files:
//! - `library`: [`Library`], a projection's module versions: start-up,
//!   adopt, rollback, hot reload (every method of it).
//! - `record`: [`Recorded`], the versions recorded with the state, and
//!   their kept copies ([`KEPT_VERSIONS`]).
//! - `difference`: [`Difference`], how the module directory differs from
//!   what runs.
//! - `reload`: what hot reload keeps between passes, and
//!   [`ReloadStatus`], what `/modules` shows of each file.
//! - `scan`: reading the module directory, and the stamps that let a
//!   reload skip files that did not change.
//! - `emit_topics`: [`EmitTopics`], [`LogEmitTopics`], [`CreateTopics`]:
//!   a module's emit topics exist before it runs.
//! - `watcher`: [`Reloader`], watching the directory.
//! - `error`: [`LifecycleError`].
//! - `fake_module`: a native module without code, for the unit tests.
//!
//! Rules kept here:
//! - **A version is a content hash** ([`crate::sandbox::runtime::content_version`]).
//! - **The active versions are recorded with the projection's state** (its
//!   `meta` entry `modules`), with the last [`KEPT_VERSIONS`] versions of
//!   each module, whose bytes are kept under `<data>/modules/<projection>/`
//!   or the directory the record names ([`Recorded::copies`]: a rebuild's
//!   shadow keeps its own, so one store forgetting a version never deletes
//!   a copy another store's record names).
//!   A restart runs the recorded versions from those copies, even if the
//!   module directory changed while the host was down; the differences are
//!   reported ([`Difference`]), and `adopt` takes the directory's versions
//!   instead. `rollback` makes an earlier kept version active again.
//! - **Hot reload never stops the consumer.** [`Reloader`] watches the
//!   module directory; a new or changed file is compiled and validated on a
//!   blocking thread (it must load under the sandbox, and its tags must not
//!   clash with the other modules), then swapped in between batches
//!   ([`Projection::replace_modules`](crate::engine::projection::Projection::replace_modules)).
//!   A file that fails leaves the old version running, and the error is
//!   kept for the admin endpoint and counted. A removed file takes its
//!   module, and so the handling of its event types, out of the projection.
//!   A reload reads only the files that changed since it last looked
//!   (`scan::FileStamp`: size, times, inode): one taken in, or refused for
//!   what its bytes are, is not read and hashed again while it stays as it
//!   was, for at most a minute, and only once its times are two seconds
//!   old (`scan::Trusted`).
//! - **A module's emit topics exist before it runs.** With an
//!   [`EmitTopics`] check ([`Library::with_emit_topics`]), every load (at
//!   start-up and on reload) checks that the topics the module declares in
//!   `module-info.emits` exist in the log, or creates them when the
//!   operator asked for it ([`LogEmitTopics`]). A missing topic fails the
//!   load naming the module and the topic, so a reload that needs one is
//!   refused like any other, and the old version keeps running; nothing a
//!   module emits can then wait in the outbox for a topic that is not
//!   there.

mod difference;
mod emit_topics;
mod error;
#[cfg(test)]
mod fake_module;
mod library;
mod record;
mod reload;
mod scan;
mod watcher;

pub use difference::Difference;
pub use emit_topics::{CreateTopics, EmitTopics, LogEmitTopics, ensure_emit_topics};
pub use error::LifecycleError;
pub use library::{Library, Started};
pub use record::{KEPT_VERSIONS, Recorded};
pub use reload::ReloadStatus;
pub use watcher::Reloader;

/// The `tracing` target of the lines that say a module was swapped in or
/// taken out by a hot reload: shown at info by the command line's default
/// filter, so a swap is never silent.
pub const RELOAD_LOG_TARGET: &str = "waku::reload";
