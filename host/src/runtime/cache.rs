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

use std::path::Path;

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
            // SAFETY: the entry is trusted (only the host's user can have
            // written it) and its checksum matches the one written beside
            // it when this host serialized it, so these are bytes
            // `Component::serialize` produced; `deserialize` itself refuses
            // artifacts of another wasmtime version or settings.
            match unsafe { Component::deserialize(engine, artifact) } {
                Ok(component) => return Ok((component, true)),
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
    if let Err(e) = write(dir, &path, &artifact) {
        tracing::warn!(module = name, "cannot write the compile cache {}: {e}", path.display());
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
