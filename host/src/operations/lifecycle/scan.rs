//! Reading the module directory: [`scan`] reads its `*.wasm` files, and
//! [`FileStamp`] and [`Trusted`] let a reload skip the ones that did not
//! change since it last read them.
//!
//! Rules kept here:
//! - **One file's failure is that file's** (too large, not a regular file,
//!   unreadable): it is returned in its place and the others are read on;
//!   [`all_read`] makes it the whole read's failure, for start-up, where
//!   every module file must be usable.
//! - **The directory's limits hold before anything runs**: at most
//!   [`MAX_MODULES`](crate::sandbox::runtime::component_file::MAX_MODULES)
//!   files, refused before any is read, and at most
//!   [`MAX_MODULE_DIR_BYTES`](crate::sandbox::runtime::component_file::MAX_MODULE_DIR_BYTES)
//!   read in all.
//! - **A file is skipped only while its stamp holds, and only a settled
//!   stamp is trusted**: the stamp (size, times, inode) is taken before the
//!   read, so a write during the read leaves one that no longer holds; one
//!   whose times are younger than [`SETTLED_AFTER`] is not trusted (a write
//!   in the same tick of the file system's clock may leave them as they
//!   were), and a trusted one is trusted for [`TRUSTED_FOR`] at most.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::LifecycleError;
use crate::sandbox::runtime::component_file::{check_module_dir_size, module_paths};
use crate::sandbox::runtime::read_component;

/// The `*.wasm` files of `dir` by module name (the file stem): each one's
/// bytes, or why it could not be read (a file too large, not a regular
/// file, unreadable: that file's failure, the others are read on), with
/// its stamp; but a file whose stamp `known` trusts is not read, only
/// named among the unchanged. Those read hold at most
/// [`MAX_MODULE_DIR_BYTES`](crate::sandbox::runtime::component_file::MAX_MODULE_DIR_BYTES)
/// in all, and a directory of more than
/// [`MAX_MODULES`](crate::sandbox::runtime::component_file::MAX_MODULES) files is
/// refused before any is read.
pub(super) fn scan(dir: &Path, known: &BTreeMap<String, Trusted>) -> Result<Scanned, LifecycleError> {
    let io = |what, path: &Path| {
        let path = path.to_owned();
        move |source| LifecycleError::Io { what, path, source }
    };
    let paths = module_paths(dir).map_err(io("reading the module directory", dir))?;
    let (mut scanned, mut total) = (Scanned::default(), 0);
    for path in paths {
        let name = path.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_default();
        let stamp = FileStamp::of(&path);
        if known.get(&name).is_some_and(|known| known.holds(stamp)) {
            scanned.unchanged.push(name);
            continue;
        }
        let read = read_component(&path).map_err(io("reading", &path));
        if let Ok(bytes) = &read {
            total += bytes.len() as u64;
            check_module_dir_size(total).map_err(|e| io("reading the module directory", dir)(e.into()))?;
        }
        scanned.read.insert(name, (stamp, read));
    }
    Ok(scanned)
}

/// What [`scan`] found.
#[derive(Default)]
pub(super) struct Scanned {
    /// The files read, by module name.
    pub(super) read: BTreeMap<String, ReadFile>,
    /// The modules whose files were not read: as they were.
    pub(super) unchanged: Vec<String>,
}

/// A module file's stamp (taken before reading) and its bytes, or why they
/// could not be read.
pub(super) type ReadFile = (Option<FileStamp>, Result<Vec<u8>, LifecycleError>);

/// What tells a file that changed from one that did not, without reading
/// it: its size, modification and change times, and inode (a file renamed
/// over it is another). Taken before a read, so a write during the read
/// leaves a stamp that no longer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileStamp {
    len: u64,
    modified: std::time::SystemTime,
    changed: std::time::SystemTime,
    #[cfg(unix)]
    inode: (u64, u64),
}

/// A stamp a reload trusts to say its file did not change: one whose
/// times were already [`SETTLED_AFTER`] old when it was taken (a write in
/// the same tick of the file system's clock, or through a memory mapping,
/// may leave the times as they were), for at most [`TRUSTED_FOR`] (past
/// it, the file is read again at the next reload).
#[derive(Debug, Clone, Copy)]
pub(super) struct Trusted {
    stamp: FileStamp,
    until: std::time::Instant,
}

/// How old a stamp's times must be before it is trusted.
const SETTLED_AFTER: Duration = Duration::from_secs(2);
/// How long a stamp is trusted.
const TRUSTED_FOR: Duration = Duration::from_secs(60);

impl Trusted {
    /// `stamp`, trusted from now if its times are settled.
    pub(super) fn new(stamp: FileStamp) -> Option<Self> {
        let settled = |time: std::time::SystemTime| time.elapsed().is_ok_and(|age| age >= SETTLED_AFTER);
        (settled(stamp.modified) && settled(stamp.changed))
            .then(|| Self { stamp, until: std::time::Instant::now() + TRUSTED_FOR })
    }

    /// `stamp`, trusted from now however fresh its times (a test's file
    /// is younger than [`SETTLED_AFTER`]).
    #[cfg(test)]
    pub(super) fn for_test(stamp: FileStamp) -> Self {
        Self { stamp, until: std::time::Instant::now() + TRUSTED_FOR }
    }

    /// Whether `stamp`, taken now, says the file is as it was.
    pub(super) fn holds(&self, stamp: Option<FileStamp>) -> bool {
        stamp == Some(self.stamp) && std::time::Instant::now() < self.until
    }
}

impl FileStamp {
    /// The stamp of the file at `path` (symlinks followed), if the file
    /// system tells.
    pub(super) fn of(path: &Path) -> Option<Self> {
        let metadata = std::fs::metadata(path).ok()?;
        let modified = metadata.modified().ok()?;
        #[cfg(unix)]
        use std::os::unix::fs::MetadataExt;
        #[cfg(unix)]
        let changed = std::time::UNIX_EPOCH
            .checked_add(Duration::new(metadata.ctime().try_into().ok()?, metadata.ctime_nsec().try_into().ok()?))?;
        #[cfg(not(unix))]
        let changed = modified;
        Some(Self {
            len: metadata.len(),
            modified,
            changed,
            #[cfg(unix)]
            inode: (metadata.dev(), metadata.ino()),
        })
    }
}

/// The files [`scan`] read, or the first that could not be read: at
/// start-up every module file must be usable.
pub(super) fn all_read(files: BTreeMap<String, ReadFile>) -> Result<BTreeMap<String, Vec<u8>>, LifecycleError> {
    files.into_iter().map(|(name, (_, read))| Ok((name, read?))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    /// A stamp of a file of `len` bytes whose times are `age` old.
    fn stamp_aged(len: u64, age: Duration) -> FileStamp {
        let then = SystemTime::now() - age;
        FileStamp {
            len,
            modified: then,
            changed: then,
            #[cfg(unix)]
            inode: (1, 2),
        }
    }

    #[test]
    fn a_settled_stamp_is_trusted_while_it_holds_and_a_fresh_one_is_not() {
        let settled = stamp_aged(10, SETTLED_AFTER + Duration::from_secs(1));
        let trusted = Trusted::new(settled).expect("its times are settled");
        assert!(trusted.holds(Some(settled)));
        assert!(!trusted.holds(Some(FileStamp { len: 11, ..settled })), "a changed size is another file");
        let rewritten = FileStamp { modified: SystemTime::now(), ..settled };
        assert!(!trusted.holds(Some(rewritten)), "a changed time is another file");
        #[cfg(unix)]
        assert!(!trusted.holds(Some(FileStamp { inode: (1, 3), ..settled })), "a file renamed over it is another");
        assert!(!trusted.holds(None), "without a stamp nothing holds");

        assert!(Trusted::new(stamp_aged(10, Duration::ZERO)).is_none(), "a fresh stamp is not trusted");
        let half_settled = FileStamp { changed: SystemTime::now(), ..settled };
        assert!(Trusted::new(half_settled).is_none(), "both times must be settled");
    }

    #[test]
    fn a_trusted_stamp_expires() {
        let settled = stamp_aged(10, SETTLED_AFTER + Duration::from_secs(1));
        let expired = Trusted { stamp: settled, until: std::time::Instant::now() };
        assert!(!expired.holds(Some(settled)));
    }

    #[test]
    fn a_files_stamp_changes_when_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bank.wasm");
        assert_eq!(FileStamp::of(&path), None, "no file, no stamp");
        std::fs::write(&path, b"one").unwrap();
        let before = FileStamp::of(&path).unwrap();
        assert_eq!(FileStamp::of(&path), Some(before), "taken twice, the same");
        std::fs::write(&path, b"three").unwrap();
        assert_ne!(FileStamp::of(&path), Some(before));
    }

    #[test]
    fn a_scan_reads_the_wasm_files_by_name_and_each_ones_failure_apart() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bank.wasm"), b"bank bytes").unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"not a module").unwrap();
        std::fs::create_dir(dir.path().join("odd.wasm")).unwrap();
        let scanned = scan(dir.path(), &BTreeMap::new()).unwrap();
        assert_eq!(scanned.read.keys().collect::<Vec<_>>(), ["bank", "odd"], "only *.wasm, by stem");
        assert!(scanned.unchanged.is_empty());
        let (stamp, bytes) = &scanned.read["bank"];
        assert!(stamp.is_some());
        assert_eq!(bytes.as_ref().unwrap(), b"bank bytes");
        assert!(
            matches!(&scanned.read["odd"].1, Err(LifecycleError::Io { what: "reading", .. })),
            "a directory is refused"
        );

        let refused = all_read(scanned.read);
        assert!(matches!(refused, Err(LifecycleError::Io { path, .. }) if path.ends_with("odd.wasm")));
        std::fs::remove_dir(dir.path().join("odd.wasm")).unwrap();
        let files = all_read(scan(dir.path(), &BTreeMap::new()).unwrap().read).unwrap();
        assert_eq!(files, BTreeMap::from([("bank".to_owned(), b"bank bytes".to_vec())]));
    }

    #[test]
    fn a_scan_skips_a_file_whose_stamp_is_trusted() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["bank", "fees"] {
            std::fs::write(dir.path().join(format!("{name}.wasm")), name).unwrap();
        }
        let stamp = FileStamp::of(&dir.path().join("bank.wasm")).unwrap();
        let known = BTreeMap::from([
            ("bank".to_owned(), Trusted { stamp, until: std::time::Instant::now() + TRUSTED_FOR }),
            // A stamp of another file does not hold for this one.
            (
                "fees".to_owned(),
                Trusted { stamp: FileStamp { len: 99, ..stamp }, until: std::time::Instant::now() + TRUSTED_FOR },
            ),
        ]);
        let scanned = scan(dir.path(), &known).unwrap();
        assert_eq!(scanned.unchanged, ["bank"]);
        assert_eq!(scanned.read.keys().collect::<Vec<_>>(), ["fees"]);
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let error = scan(&gone, &BTreeMap::new()).err().expect("no directory");
        assert!(
            matches!(&error, LifecycleError::Io { what: "reading the module directory", path, .. } if *path == gone)
        );
    }
}
