//! A projection's modules named by reference (`module-ref` in `waku.toml`,
//! `--module-ref` on the command line): which digest each reference was
//! pinned to, and the pulls that put them in the module directory.
//!
//! Rules kept here:
//! - **A pin per module**: the reference as configured, the manifest
//!   digest it named when it was taken, and the layer digest (the
//!   component's SHA-256). Pins are kept with the projection's state (its
//!   `meta` entry `oci-modules`), beside the versions the lifecycle
//!   records ([`crate::operations::lifecycle`]), and saved only once those are: the
//!   two never disagree about what runs.
//! - **A restart runs what ran.** At start-up a reference that is pinned
//!   is pulled by its pinned digest, never by its tag: if the tag moved
//!   meanwhile the pinned component still runs, and the move is reported
//!   ([`Synced::notes`]) until the operator adopts it (`waku modules
//!   adopt`, or `waku run --adopt-modules`). A module file already in the
//!   directory with the pinned layer digest is not pulled again (so a
//!   restart needs the registry only for what it lacks).
//! - **A changed reference is the operator's choice.** A reference that
//!   is not pinned yet (a first start, a module added) or that differs
//!   from its pin (the tag or digest changed in `waku.toml`) is pulled as
//!   it reads, and its module is adopted: the library takes the pulled
//!   version over a recorded one.
//! - **Verified before written.** Every pull is checked against the
//!   digests ([`super::Registry::pull`]), must be a component that loads
//!   in the host's sandbox ([`super::check_loads`]: what replaces a module
//!   file would otherwise stop the next start), and is written in one rename
//!   ([`super::write_module`]); nothing is written for a reference that
//!   fails, and a start-up with a reference that fails stops with the
//!   error.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{ModuleRef, OciError, Registry, sha256_digest, write_module};
use crate::sandbox::runtime::Sandbox;
use crate::storage::state::{StateError, StateStore};

/// The `meta` entry holding the pins.
const META: &str = "oci-modules";

/// What a module's reference was pinned to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    /// The reference as configured.
    pub reference: String,
    /// The manifest digest it named when pinned.
    pub manifest: String,
    /// The layer digest: the component's SHA-256.
    pub layer: String,
}

/// Each module's pin, by module name.
pub type Pins = BTreeMap<String, Pin>;

/// Why pinning or pulling failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PinError {
    /// The registry operation failed.
    #[error(transparent)]
    Oci(#[from] OciError),
    /// The state store failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// The pins cannot be read.
    #[error("the recorded module references are unreadable: {0}")]
    Corrupt(String),
    /// Two references name the same module.
    #[error("`{first}` and `{second}` both name module `{module}`")]
    SameModule {
        /// The module.
        module: String,
        /// One reference.
        first: String,
        /// The other.
        second: String,
    },
    /// Writing a module file failed.
    #[error("writing module `{module}` into {}: {source}", dir.display())]
    Write {
        /// The module.
        module: String,
        /// The module directory.
        dir: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// What [`sync`] did: the pins to save once the library has loaded the
/// directory, the modules it must adopt, and what to tell the operator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Synced {
    /// Every pin, the new ones included.
    pub pins: Pins,
    /// Modules whose pulled version the library must take over a recorded
    /// one (their reference is new, changed, or adopted).
    pub adopt: BTreeSet<String>,
    /// Lines for the log: tags that moved, and each change of pin.
    pub notes: Vec<String>,
}

/// The pins `store` holds.
pub fn read(store: &StateStore) -> Result<Pins, PinError> {
    match store.meta(META)? {
        None => Ok(Pins::new()),
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| PinError::Corrupt(e.to_string())),
    }
}

/// Saves `pins` in `store`.
pub fn save(store: &StateStore, pins: &Pins) -> Result<(), PinError> {
    let bytes = serde_json::to_vec(pins).map_err(|e| PinError::Corrupt(e.to_string()))?;
    store.set_meta(META, &bytes)?;
    Ok(())
}

/// Puts the module of every reference in `refs` into `dir`, as the
/// [module documentation](self) says: pinned ones by their pinned digest,
/// new or changed ones (or all, with `adopt_all`) as they read now.
pub async fn sync(
    store: &StateStore,
    dir: &Path,
    refs: &[ModuleRef],
    adopt_all: bool,
    sandbox: &Sandbox,
) -> Result<Synced, PinError> {
    let mut by_module: BTreeMap<&str, &ModuleRef> = BTreeMap::new();
    for reference in refs {
        if let Some(first) = by_module.insert(reference.module(), reference) {
            return Err(PinError::SameModule {
                module: reference.module().to_owned(),
                first: first.to_string(),
                second: reference.to_string(),
            });
        }
    }
    let mut synced = Synced { pins: read(store)?, ..Synced::default() };
    for (module, reference) in by_module {
        let pinned = synced.pins.get(module).filter(|pin| pin.reference == reference.to_string() && !adopt_all);
        let registry = Registry::for_registry(reference.registry())?;
        match pinned.cloned() {
            Some(pin) => {
                keep_pinned(&registry, dir, module, reference, &pin, sandbox).await?;
                if let Some(note) = moved(&registry, reference, &pin).await {
                    synced.notes.push(note);
                }
            }
            None => {
                let pulled = registry.pull(reference).await?;
                let pulled = super::Pulled { bytes: loaded(sandbox, reference, pulled.bytes).await?, ..pulled };
                write(dir, module, &pulled.bytes)?;
                let pin = Pin {
                    reference: reference.to_string(),
                    manifest: pulled.artifact.manifest,
                    layer: pulled.artifact.layer,
                };
                let before = synced.pins.insert(module.to_owned(), pin.clone());
                synced.notes.push(match before {
                    Some(before) if before.manifest != pin.manifest => format!(
                        "module `{module}`: `{}` pinned to {} (was `{}` at {})",
                        pin.reference, pin.manifest, before.reference, before.manifest
                    ),
                    _ => format!("module `{module}`: `{}` pinned to {}", pin.reference, pin.manifest),
                });
                synced.adopt.insert(module.to_owned());
            }
        }
    }
    Ok(synced)
}

/// Makes sure `dir` holds the pinned component of `module`: the file there
/// if it has the pinned layer digest, else pulled by the pinned manifest
/// digest.
async fn keep_pinned(
    registry: &Registry,
    dir: &Path,
    module: &str,
    reference: &ModuleRef,
    pin: &Pin,
    sandbox: &Sandbox,
) -> Result<(), PinError> {
    let path = dir.join(format!("{module}.wasm"));
    if crate::sandbox::runtime::read_component(&path).is_ok_and(|bytes| sha256_digest(&bytes) == pin.layer) {
        return Ok(());
    }
    let pulled = registry.pull(&reference.at_digest(&pin.manifest)).await?;
    if pulled.artifact.layer != pin.layer {
        return Err(OciError::Tampered {
            reference: reference.at_digest(&pin.manifest).to_string(),
            what: "a layer",
            expected: pin.layer.clone(),
            actual: pulled.artifact.layer,
        }
        .into());
    }
    write(dir, module, &loaded(sandbox, reference, pulled.bytes).await?)
}

/// The line saying a pinned tag now names another manifest, if it does
/// (or that it could not be asked).
async fn moved(registry: &Registry, reference: &ModuleRef, pin: &Pin) -> Option<String> {
    // A reference by digest names one manifest for good.
    if reference.digest().is_some() {
        return None;
    }
    match registry.resolve(reference).await {
        Ok(now) if now != pin.manifest => Some(format!(
            "module `{}`: `{reference}` now names {now}; the pinned {} keeps running until you adopt it (`waku \
             modules adopt`, or `waku run --adopt-modules`)",
            reference.module(),
            pin.manifest
        )),
        Ok(_) => None,
        Err(error) => Some(format!("module `{}`: runs the pinned {}; {error}", reference.module(), pin.manifest)),
    }
}

/// `bytes` if they are a component that loads in `sandbox`.
async fn loaded(sandbox: &Sandbox, reference: &ModuleRef, bytes: Vec<u8>) -> Result<Vec<u8>, PinError> {
    let (sandbox, reference) = (sandbox.clone(), reference.clone());
    tokio::task::spawn_blocking(move || super::check_loads(&sandbox, &reference, &bytes).map(|()| bytes))
        .await
        .map_err(|e| OciError::DoesNotLoad { reference: String::new(), reason: e.to_string() })?
        .map_err(PinError::from)
}

fn write(dir: &Path, module: &str, bytes: &[u8]) -> Result<(), PinError> {
    write_module(dir, module, bytes).map(|_| ()).map_err(|source| PinError::Write {
        module: module.to_owned(),
        dir: dir.to_owned(),
        source,
    })
}
