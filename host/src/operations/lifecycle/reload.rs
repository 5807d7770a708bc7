//! What hot reload keeps between passes: the versions of the module
//! directory last taken in, the files it need not read again, and what the
//! last attempt at each file said ([`ReloadMemory`]); and how a pass ends
//! ([`Reloaded`]).
//!
//! The passes themselves are [`super::Library::reload`]'s: they swap
//! modules in the projection and write the record, which the library owns.
//!
//! Rules kept here:
//! - **A reload applies what changed since it last looked**: `seen` holds
//!   the version of each file taken in (or left as the baseline by a start
//!   or a replacement of the whole set); a file refused is not in it, so it
//!   is tried again at its next change.
//! - **A file is skipped only while its stamp is trusted** ([`Trusted`]),
//!   and only files still there keep a stamp or a status: what `/modules`
//!   shows of reloads is about the files in the directory.
//! - **A poisoned lock is still read**: a panic in one reload must not
//!   stop every later one.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;

use super::scan::Trusted;

/// How many times [`super::Library::reload`] looks at the directory again
/// when the modules were replaced as a whole while it prepared a swap.
pub(super) const RELOAD_ATTEMPTS: usize = 3;

/// How a pass of [`super::Library::reload`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Reloaded {
    /// Every change was applied or refused.
    Done,
    /// The set was replaced as a whole meanwhile; the rest was not applied.
    Superseded,
}

/// What the last reload attempt of a module said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReloadStatus {
    /// The version the file had.
    pub version: String,
    /// The error, when it was refused.
    pub error: Option<String>,
}

/// What a library remembers of its module directory between reloads.
#[derive(Default)]
pub(super) struct ReloadMemory {
    /// The module directory's versions as last taken in (by name): a reload
    /// applies what changed since. Changed only inside the projection's
    /// swap lock, or alone.
    seen: Mutex<BTreeMap<String, String>>,
    /// The files a reload need not read again while their stamp holds:
    /// each one taken in or refused for its bytes.
    trusted: Mutex<BTreeMap<String, Trusted>>,
    /// The last reload attempt per module file.
    statuses: Mutex<BTreeMap<String, ReloadStatus>>,
}

/// The value behind `lock`, even if a panic poisoned it.
fn locked<T>(lock: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    lock.lock().unwrap_or_else(|e| e.into_inner())
}

impl ReloadMemory {
    /// The versions last taken in, by module name.
    pub(super) fn seen(&self) -> BTreeMap<String, String> {
        locked(&self.seen).clone()
    }

    /// Makes `seen` the versions taken in: what later reloads compare with.
    pub(super) fn set_seen(&self, seen: BTreeMap<String, String>) {
        *locked(&self.seen) = seen;
    }

    /// Notes that `version` of file `name` was taken in.
    pub(super) fn took_in(&self, name: &str, version: String) {
        locked(&self.seen).insert(name.to_owned(), version);
    }

    /// Forgets the files that are `gone`.
    pub(super) fn forget_gone(&self, gone: &[&String]) {
        locked(&self.seen).retain(|name, _| !gone.contains(&name));
    }

    /// The trusted stamps, by module name.
    pub(super) fn trusted(&self) -> BTreeMap<String, Trusted> {
        locked(&self.trusted).clone()
    }

    /// Trusts `stamp` to say file `name` did not change.
    pub(super) fn trust(&self, name: &str, stamp: Trusted) {
        locked(&self.trusted).insert(name.to_owned(), stamp);
    }

    /// Keeps trusting only the stamps of the `unchanged` files (the others
    /// were read again, or are gone).
    pub(super) fn keep_trusting(&self, unchanged: &[String]) {
        locked(&self.trusted).retain(|name, _| unchanged.contains(name));
    }

    /// Trusts no stamp: the next reload reads every file.
    pub(super) fn distrust_all(&self) {
        locked(&self.trusted).clear();
    }

    /// The last reload attempt of each module file.
    pub(super) fn statuses(&self) -> BTreeMap<String, ReloadStatus> {
        locked(&self.statuses).clone()
    }

    /// Keeps `status` as what the last attempt at file `name` said.
    pub(super) fn report(&self, name: &str, status: ReloadStatus) {
        locked(&self.statuses).insert(name.to_owned(), status);
    }

    /// Keeps the statuses of the files still `present` only.
    pub(super) fn keep_statuses_of(&self, present: impl Fn(&String) -> bool) {
        locked(&self.statuses).retain(|name, _| present(name));
    }
}

#[cfg(test)]
mod tests {
    use super::super::scan::FileStamp;
    use super::*;

    fn names<V>(map: &BTreeMap<String, V>) -> Vec<&str> {
        map.keys().map(String::as_str).collect()
    }

    #[test]
    fn the_versions_taken_in_follow_the_files() {
        let memory = ReloadMemory::default();
        memory.set_seen(BTreeMap::from([("bank".to_owned(), "b1".to_owned()), ("fees".to_owned(), "f1".to_owned())]));
        memory.took_in("bank", "b2".to_owned());
        memory.took_in("audit", "a1".to_owned());
        memory.forget_gone(&[&"fees".to_owned()]);
        let seen = memory.seen();
        assert_eq!(names(&seen), ["audit", "bank"]);
        assert_eq!(seen["bank"], "b2");
    }

    #[test]
    fn only_files_still_there_keep_a_status_or_a_trusted_stamp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bank.wasm");
        std::fs::write(&path, b"bank").unwrap();
        let stamp = FileStamp::of(&path).unwrap();
        // Fresh, so not trusted by `Trusted::new`; built as one settled.
        let trusted = Trusted::for_test(stamp);

        let memory = ReloadMemory::default();
        for name in ["bank", "fees"] {
            memory.trust(name, trusted);
            memory.report(name, ReloadStatus { version: format!("{name}-1"), error: None });
        }
        memory.keep_trusting(&["fees".to_owned()]);
        assert_eq!(names(&memory.trusted()), ["fees"]);
        memory.keep_statuses_of(|name| name == "bank");
        assert_eq!(memory.statuses()["bank"].version, "bank-1");
        assert_eq!(names(&memory.statuses()), ["bank"]);
        memory.distrust_all();
        assert!(memory.trusted().is_empty());
    }

    #[test]
    fn a_panic_holding_the_memory_does_not_stop_later_reloads() {
        let memory = std::sync::Arc::new(ReloadMemory::default());
        memory.took_in("bank", "b1".to_owned());
        let holder = memory.clone();
        let panicked = std::thread::spawn(move || {
            let _held = holder.seen.lock().unwrap();
            panic!("a reload panicked");
        })
        .join();
        assert!(panicked.is_err() && memory.seen.is_poisoned());
        memory.took_in("fees", "f1".to_owned());
        assert_eq!(names(&memory.seen()), ["bank", "fees"]);
    }
}
