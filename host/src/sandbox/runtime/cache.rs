//! Compiling components, through the compile cache when the sandbox has
//! one.
//!
//! An entry on disk is a frame: a magic tag, the SHA-256 of the artifact,
//! the artifact. It is named after the SHA-256 of the component and a
//! digest of the engine's settings. A corrupt, truncated or incompatible
//! entry is compiled again and rewritten; only an entry whose checksum
//! matches reaches wasmtime's `deserialize`.
//!
//! An entry is native code the host will run, and its checksum proves only
//! that it is whole, not who wrote it: so an entry is used only when it
//! and its directory are trusted ([`trusted`]): owned by the user the host
//! runs as, writable by no one else, and the entry a regular file (not a
//! symlink or a FIFO). The directory is created private (mode 0700). An
//! untrusted entry is compiled again, and the warning says why.
//!
//! The cache is kept under a size bound (the sandbox's
//! `cache_max_bytes`): it would otherwise grow by an entry for every
//! version of every module ever loaded. Rules:
//! - **Least recently used goes first.** An entry's modification time says
//!   when it was last used: written on a miss, set to now on a hit. After
//!   each entry written, the oldest entries are removed until the entries
//!   together take at most the bound.
//! - **What runs is kept.** The entry just written, and those of the
//!   versions this sandbox loaded last for each module name (the one it
//!   runs, and the one before, which a rollback or a refused reload goes
//!   back to: [`InUse`]), are never removed, even past the bound. Removing
//!   any other entry cannot break a running module either: an entry is
//!   read into memory whole and never read again, so a removed entry costs
//!   only a compile at its next load, in this process or another sharing
//!   the directory.
//! - **Only the cache's own files.** Pruning looks at regular files named
//!   `*.cwasm` in the directory, and at temporary files (`.tmp*`) a crash
//!   left while writing an entry, once they are an hour old; nothing else
//!   in the directory is touched, and a file another process removed first
//!   is no error.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use sha2::Digest;
use wasmtime::component::Component;

use super::{LoadError, Sandbox, compiler};

const MAGIC: &[u8; 8] = b"wakuCW01";

/// Compiles `bytes`, or takes the compiled component from the cache; says
/// which.
pub(super) fn compile(sandbox: &Sandbox, name: &str, bytes: &[u8]) -> Result<(Component, bool), LoadError> {
    let engine = &sandbox.shared.engine;
    let Some(dir) = &sandbox.cache else {
        return Ok((deserialize_fresh(sandbox, name, &compiler::compile(sandbox, name, bytes)?)?, false));
    };
    let path = dir.join(format!("{}-{}.cwasm", sha256_hex(bytes), engine_fingerprint(sandbox)));
    // An entry over the artifact limit (frame included) is not read: it
    // is not one this host would have written.
    let most = compiler::max_artifact_bytes(bytes.len(), &sandbox.shared.limits) + MAGIC.len() + 32;
    let entry = match (trusted(dir, true), trusted(&path, false)) {
        (Ok(()), Ok(())) => std::fs::metadata(&path)
            .is_ok_and(|metadata| metadata.len() <= most as u64)
            .then(|| std::fs::read(&path).ok())
            .flatten(),
        (Err(why), _) | (_, Err(why)) => {
            if path.exists() {
                tracing::warn!(module = name, "cached component {} is not trusted, compiling: {why}", path.display());
            }
            None
        }
    };
    match entry.as_deref().map(unframe) {
        Some(Some(artifact)) => {
            // A hit makes the entry the most recently used.
            if let Err(e) = touch(&path) {
                tracing::debug!(module = name, "cannot mark {} used: {e}", path.display());
            }
            // SAFETY: the entry is trusted (only the host's user can have
            // written it) and its checksum matches the one written beside
            // it when this host serialized it, so these are bytes
            // `Component::serialize` produced; `deserialize` itself refuses
            // artifacts of another wasmtime version or settings.
            match unsafe { Component::deserialize(engine, artifact) } {
                Ok(component) => {
                    sandbox.shared.cache_in_use.loaded(name, &path);
                    return Ok((component, true));
                }
                Err(e) => {
                    tracing::warn!(module = name, "cached component {} is unusable, compiling: {e:#}", path.display())
                }
            }
        }
        Some(None) => tracing::warn!(module = name, "cached component {} is corrupt, compiling", path.display()),
        None => {}
    }
    drop(entry);
    let artifact = compiler::compile(sandbox, name, bytes)?;
    match write(dir, &path, &artifact) {
        Ok(()) => {
            sandbox.shared.cache_in_use.loaded(name, &path);
            let keep = sandbox.shared.cache_in_use.entries();
            match prune(dir, sandbox.cache_max_bytes, &keep) {
                Ok(pruned) if pruned.removed > 0 => tracing::info!(
                    "compile cache {}: removed {} least recently used entries ({} bytes) to stay under {} bytes",
                    dir.display(),
                    pruned.removed,
                    pruned.removed_bytes,
                    sandbox.cache_max_bytes
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!("cannot prune the compile cache {}: {e}", dir.display()),
            }
        }
        Err(e) => tracing::warn!(module = name, "cannot write the compile cache {}: {e}", path.display()),
    }
    Ok((deserialize_fresh(sandbox, name, &artifact)?, false))
}

/// The component of an artifact just compiled for this sandbox.
fn deserialize_fresh(sandbox: &Sandbox, name: &str, artifact: &[u8]) -> Result<Component, LoadError> {
    // SAFETY: these bytes are what `Engine::precompile_component` returned
    // a moment ago, in this process or in its compiler child (the same
    // program, with the same engine settings), read back from a private
    // temporary directory; `deserialize` also refuses an artifact of other
    // settings.
    unsafe { Component::deserialize(&sandbox.shared.engine, artifact) }
        .map_err(|e| LoadError::Compiler { module: name.to_owned(), reason: format!("{e:#}") })
}

/// A short digest of everything in the engine's configuration that decides
/// whether a compiled artifact can be reused.
fn engine_fingerprint(sandbox: &Sandbox) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    sandbox.shared.engine.precompile_compatibility_hash().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// The SHA-256 of `bytes`, in hex.
pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The artifact inside `file`, if the frame and checksum are intact.
fn unframe(file: &[u8]) -> Option<&[u8]> {
    let rest = file.strip_prefix(MAGIC)?;
    let (checksum, artifact) = rest.split_at_checked(32)?;
    (sha2::Sha256::digest(artifact).as_slice() == checksum).then_some(artifact)
}

/// Whether `path` (the cache directory, or an entry) may hold code the
/// host runs: owned by the user the host runs as, writable by no one
/// else, and a directory or a regular file as asked (not a symlink). Says
/// why not.
#[cfg(unix)]
fn trusted(path: &Path, directory: bool) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let metadata = kind_checked(path, directory)?;
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    let user = unsafe { libc::geteuid() };
    if metadata.uid() != user {
        return Err(format!("{} is owned by user {}, not {user}", path.display(), metadata.uid()));
    }
    if metadata.mode() & 0o022 != 0 {
        return Err(format!("{} is writable by other users", path.display()));
    }
    Ok(())
}

/// Elsewhere only the kind is checked.
#[cfg(not(unix))]
fn trusted(path: &Path, directory: bool) -> Result<(), String> {
    kind_checked(path, directory).map(drop)
}

/// The metadata of `path` itself (a symlink is not followed), when it is
/// a directory or a regular file as asked.
fn kind_checked(path: &Path, directory: bool) -> Result<std::fs::Metadata, String> {
    let metadata = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    match (directory, metadata.is_dir(), metadata.is_file()) {
        (true, true, _) | (false, _, true) => Ok(metadata),
        (true, ..) => Err(format!("{} is not a directory", path.display())),
        (false, ..) => Err(format!("{} is not a regular file", path.display())),
    }
}

/// Writes `artifact` framed to `path`, through a temporary file and a
/// rename, so a crash never leaves half an entry under the real name.
fn write(dir: &Path, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)?;
    let mut framed = Vec::with_capacity(MAGIC.len() + 32 + artifact.len());
    framed.extend_from_slice(MAGIC);
    framed.extend_from_slice(&sha2::Sha256::digest(artifact));
    framed.extend_from_slice(artifact);
    let temporary = tempfile::NamedTempFile::new_in(dir)?;
    std::fs::write(temporary.path(), &framed)?;
    temporary.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The compile cache entries of the versions a sandbox loaded last, per
/// module name: the one it runs and the one before.
#[derive(Debug, Default)]
pub(super) struct InUse(Mutex<HashMap<String, [Option<PathBuf>; 2]>>);

impl InUse {
    /// `name` was loaded from (or compiled into) `entry`.
    fn loaded(&self, name: &str, entry: &Path) {
        let mut names = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let last = names.entry(name.to_owned()).or_default();
        if last[0].as_deref() != Some(entry) {
            last[1] = last[0].replace(entry.to_path_buf());
        }
    }

    /// Every entry in use.
    fn entries(&self) -> Vec<PathBuf> {
        let names = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        names.values().flatten().flatten().cloned().collect()
    }
}

/// Marks the entry at `path` used now.
fn touch(path: &Path) -> std::io::Result<()> {
    std::fs::OpenOptions::new().write(true).open(path)?.set_modified(SystemTime::now())
}

/// What [`prune`] removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Pruned {
    /// Entries removed.
    pub(super) removed: usize,
    /// Their bytes.
    pub(super) removed_bytes: u64,
}

/// How old a temporary file of the cache must be before it counts as left
/// by a crash: far longer than writing an entry takes.
const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// Removes the least recently used entries of `dir` until they take at
/// most `max_bytes`, never one of `keep`; and temporary files a crash left
/// (see the [module documentation](self)).
pub(super) fn prune(dir: &Path, max_bytes: u64, keep: &[PathBuf]) -> std::io::Result<Pruned> {
    let now = SystemTime::now();
    let mut entries = Vec::new();
    let mut pruned = Pruned::default();
    for item in std::fs::read_dir(dir)? {
        let item = item?;
        let Ok(metadata) = item.path().symlink_metadata() else { continue };
        if !metadata.is_file() {
            continue;
        }
        let name = item.file_name();
        let name = name.to_string_lossy();
        let used = metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if name.ends_with(".cwasm") {
            entries.push((used, metadata.len(), item.path()));
        } else if name.starts_with(".tmp")
            && now.duration_since(used).is_ok_and(|age| age > STALE_TEMPORARY)
            && remove(&item.path())?
        {
            pruned.removed += 1;
            pruned.removed_bytes += metadata.len();
        }
    }
    let mut total: u64 = entries.iter().map(|(_, bytes, _)| bytes).sum();
    entries.sort();
    for (_, bytes, path) in entries {
        if total <= max_bytes {
            break;
        }
        if keep.contains(&path) {
            continue;
        }
        if remove(&path)? {
            pruned.removed += 1;
            pruned.removed_bytes += bytes;
        }
        total -= bytes;
    }
    Ok(pruned)
}

/// Removes `path`; `false` when another process removed it first.
fn remove(path: &Path) -> std::io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `bytes` bytes last used `age_s` seconds ago.
    fn file(dir: &Path, name: &str, bytes: usize, age_s: u64) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, vec![0; bytes]).unwrap();
        let used = SystemTime::now() - Duration::from_secs(age_s);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(used).unwrap();
        path
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn pruning_removes_the_least_recently_used_entries_past_the_bound_and_keeps_those_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        file(dir, "a.cwasm", 100, 50);
        let in_use = file(dir, "b.cwasm", 100, 40);
        file(dir, "c.cwasm", 100, 30);
        file(dir, "d.cwasm", 100, 20);
        file(dir, "e.cwasm", 100, 10);
        file(dir, "notes.txt", 1000, 100);
        file(dir, ".tmpOLD", 10, 7200);
        file(dir, ".tmpNEW", 10, 10);
        std::fs::create_dir(dir.join("sub.cwasm")).unwrap();

        // 500 bytes of entries, 250 allowed: a, c and d go (b is in use).
        let pruned = prune(dir, 250, std::slice::from_ref(&in_use)).unwrap();
        assert_eq!(pruned, Pruned { removed: 4, removed_bytes: 310 });
        assert_eq!(names(dir), [".tmpNEW", "b.cwasm", "e.cwasm", "notes.txt", "sub.cwasm"]);

        // Under the bound: nothing more.
        assert_eq!(prune(dir, 250, &[]).unwrap(), Pruned::default());
        // A hit makes an entry the most recently used: b outlives e.
        touch(&in_use).unwrap();
        assert_eq!(prune(dir, 100, &[]).unwrap().removed, 1);
        assert_eq!(names(dir), [".tmpNEW", "b.cwasm", "notes.txt", "sub.cwasm"]);
        // A bound below one entry keeps only what is in use.
        assert_eq!(prune(dir, 0, std::slice::from_ref(&in_use)).unwrap(), Pruned::default());
        assert_eq!(prune(dir, 0, &[]).unwrap().removed, 1);
    }

    #[test]
    fn the_entries_in_use_are_the_last_two_versions_of_each_module() {
        let in_use = InUse::default();
        for entry in ["a1", "a2", "a2", "a3"] {
            in_use.loaded("a", Path::new(entry));
        }
        in_use.loaded("b", Path::new("b1"));
        let mut entries = in_use.entries();
        entries.sort();
        assert_eq!(entries, [Path::new("a2"), Path::new("a3"), Path::new("b1")]);
    }
}
