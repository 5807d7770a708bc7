//! Compiling components, through the compile cache when the sandbox has
//! one.
//!
//! An entry on disk is a frame: a magic tag, the SHA-256 of the artifact,
//! the artifact. It is named after the SHA-256 of the component and a
//! digest of the engine's settings. A corrupt, truncated or incompatible
//! entry is compiled again and rewritten; only an entry whose checksum
//! matches reaches wasmtime's `deserialize`.

use std::path::Path;

use sha2::Digest;
use wasmtime::component::Component;

use super::{LoadError, Sandbox};

const MAGIC: &[u8; 8] = b"wakuCW01";

/// Compiles `bytes`, or takes the compiled component from the cache; says
/// which.
pub(super) fn compile(sandbox: &Sandbox, name: &str, bytes: &[u8]) -> Result<(Component, bool), LoadError> {
    let engine = &sandbox.shared.engine;
    let compile = || {
        Component::new(engine, bytes)
            .map_err(|e| LoadError::Invalid { module: name.to_owned(), reason: format!("{e:#}") })
    };
    let Some(dir) = &sandbox.cache else { return Ok((compile()?, false)) };
    let path = dir.join(format!("{}-{}.cwasm", sha256_hex(bytes), engine_fingerprint(sandbox)));
    match std::fs::read(&path).ok().map(|file| unframe(&file).map(<[u8]>::to_vec)) {
        Some(Some(artifact)) => {
            // SAFETY: the artifact's checksum matches the one written beside
            // it when this host serialized it, so these are bytes
            // `Component::serialize` produced; `deserialize` itself refuses
            // artifacts of another wasmtime version or settings.
            match unsafe { Component::deserialize(engine, &artifact) } {
                Ok(component) => return Ok((component, true)),
                Err(e) => {
                    tracing::warn!(module = name, "cached component {} is unusable, compiling: {e:#}", path.display())
                }
            }
        }
        Some(None) => tracing::warn!(module = name, "cached component {} is corrupt, compiling", path.display()),
        None => {}
    }
    let component = compile()?;
    match component.serialize() {
        Ok(artifact) => {
            if let Err(e) = write(dir, &path, &artifact) {
                tracing::warn!(module = name, "cannot write the compile cache {}: {e}", path.display());
            }
        }
        Err(e) => tracing::warn!(module = name, "cannot serialize the compiled component: {e:#}"),
    }
    Ok((component, false))
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

/// Writes `artifact` framed to `path`, through a temporary file and a
/// rename, so a crash never leaves half an entry under the real name.
fn write(dir: &Path, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut framed = Vec::with_capacity(MAGIC.len() + 32 + artifact.len());
    framed.extend_from_slice(MAGIC);
    framed.extend_from_slice(&sha2::Sha256::digest(artifact));
    framed.extend_from_slice(artifact);
    let temporary = tempfile::NamedTempFile::new_in(dir)?;
    std::fs::write(temporary.path(), &framed)?;
    temporary.persist(path).map_err(|e| e.error)?;
    Ok(())
}
