//! Opening the host's redb files (the embedded log, a projection's state):
//! nothing in a file is trusted before all of it is checked.
//!
//! redb trusts a file it shut down cleanly, and a page damaged on disk since
//! (a flipped bit, a block of zeroes) can make it panic, or allocate without
//! bound, when the page is read. Opening with redb's integrity check
//! verifies the checksum of every committed page first, so damage is an
//! error naming the file before any command uses it. The check reads the
//! whole file once: about 0.1 s more for the demo's 140 MB log, 0.4 s when
//! it is not in the page cache (BENCHMARKS.md). The memory it read into is
//! returned to the kernel at once ([`crate::platform::memory::release_freed`]).
//!
//! An existing file of zero bytes is refused too: redb would take it for a
//! new one, and a log, or a projection's positions, would silently start
//! again from nothing.

use std::path::Path;

use redb::{Database, DatabaseError, StorageError};

/// Why a redb file did not open.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// The file is damaged: why, in redb's words.
    Damaged(String),
    /// Anything else (I/O, the file held by another process, ...).
    Engine(DatabaseError),
}

/// Opens the redb file at `path` with a page cache of `cache_bytes`,
/// creating it if it does not exist, after checking all of it.
pub(crate) fn open(path: &Path, cache_bytes: usize) -> Result<Database, OpenError> {
    if std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.len() == 0) {
        return Err(OpenError::Damaged("it is empty: cut short, or never written".to_owned()));
    }
    let opened = redb::Builder::new().set_cache_size(cache_bytes).set_check_integrity_on_open(true).create(path);
    // The check's reads are done with.
    crate::platform::memory::release_freed();
    opened.map_err(|e| match e {
        DatabaseError::Storage(StorageError::Corrupted(reason)) => OpenError::Damaged(reason),
        e => OpenError::Engine(e),
    })
}

/// Flips `count` bytes of the file at `path`, chosen by `seed`: damage of
/// the kind a disk or a careless tool does, for the backends' tests.
#[cfg(test)]
pub(crate) fn flip_bytes(path: &Path, seed: u64, count: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    let mut state = seed;
    for _ in 0..count {
        // Knuth's MMIX linear congruential generator.
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let at = (state >> 33) as usize % bytes.len();
        bytes[at] ^= 0xff;
    }
    std::fs::write(path, bytes).unwrap();
}
