//! What the Python and the JavaScript builds share: a build skipped when
//! nothing it reads has changed, a component written beside and renamed
//! into place, and a failed tool's output cut to its end.
//!
//! Rules kept here:
//! - **A build is skipped only for the same inputs.** The digest covers
//!   what the caller names (the contract, the tool's version, the
//!   project's settings) and every file under the project and its extra
//!   source directories, in name order, with its path: but hidden
//!   directories, `target`, the tool's own cache or install directory,
//!   and components (`*.wasm`: none is a source, and the one a build writes
//!   may sit in the project, so counting it would change every build).
//! - **A failed build leaves the last good component, never half of
//!   one**: the tool writes `.<name>.wasm.partial`, renamed into place
//!   once it succeeded, and the digest is written beside it only then.

use std::path::{Path, PathBuf};
use std::process::Output;

use super::BuildError;

/// An I/O failure of a build, naming what it did and where.
pub(super) fn io(what: &str, path: &Path, source: std::io::Error) -> BuildError {
    BuildError::Io { what: format!("{what} {}", path.display()), source }
}

/// The component a build makes, `<out_dir>/<name>.wasm`, and the digest of
/// what it reads.
pub(super) struct Stamped {
    /// The component.
    pub(super) out: PathBuf,
    /// Where the tool writes it, to be renamed into place.
    pub(super) partial: PathBuf,
    stamp: PathBuf,
    inputs: String,
}

impl Stamped {
    /// The build of `name` into `out_dir` from inputs of digest `inputs`
    /// ([`inputs_digest`]).
    pub(super) fn new(out_dir: &Path, name: &str, inputs: String) -> Self {
        Self {
            out: out_dir.join(format!("{name}.wasm")),
            partial: out_dir.join(format!(".{name}.wasm.partial")),
            stamp: out_dir.join(format!(".{name}.wasm.inputs")),
            inputs,
        }
    }

    /// Whether the component there was built from the same inputs.
    pub(super) fn is_current(&self) -> bool {
        self.out.is_file() && std::fs::read_to_string(&self.stamp).is_ok_and(|built_from| built_from == self.inputs)
    }

    /// Moves the finished component into place and records its inputs.
    pub(super) fn finish(self) -> Result<PathBuf, BuildError> {
        std::fs::rename(&self.partial, &self.out).map_err(|e| io("moving the component to", &self.out, e))?;
        std::fs::write(&self.stamp, &self.inputs).map_err(|e| io("writing", &self.stamp, e))?;
        Ok(self.out)
    }
}

/// A digest of `fields` and of every file under `roots` (their paths and
/// bytes), but hidden directories, `target`, `skipped` and `*.wasm` files.
pub(super) fn inputs_digest(
    fields: &[&[u8]],
    roots: impl IntoIterator<Item = PathBuf>,
    skipped: &str,
) -> Result<String, BuildError> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    let mut field = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    fields.iter().for_each(|bytes| field(bytes));
    for root in roots {
        field(root.as_os_str().as_encoded_bytes());
        let walk = walkdir::WalkDir::new(&root).sort_by_file_name().into_iter().filter_entry(|entry| {
            let name = entry.file_name().to_string_lossy();
            entry.depth() == 0 || !(name.starts_with('.') || name == "target" || name == skipped)
        });
        for entry in walk {
            let entry = entry.map_err(|e| {
                let path = e.path().unwrap_or(&root).to_owned();
                io("reading", &path, e.into())
            })?;
            let component = entry.path().extension().is_some_and(|ext| ext == "wasm");
            if entry.file_type().is_file() && !component {
                field(entry.path().strip_prefix(&root).unwrap_or(entry.path()).as_os_str().as_encoded_bytes());
                field(&std::fs::read(entry.path()).map_err(|e| io("reading", entry.path(), e))?);
            }
        }
    }
    Ok(hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect())
}

/// The last 20 non-empty lines of a tool's output (standard error first),
/// after a colon and a line break; empty when it wrote nothing.
pub(super) fn output_tail(output: &Output) -> String {
    let text = String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
    let kept = &lines[lines.len().saturating_sub(20)..];
    if kept.is_empty() { String::new() } else { format!(":\n{}", kept.join("\n")) }
}

/// Shows a tool's output on standard error, unless `quiet`.
pub(super) fn show_output(output: &Output, quiet: bool) {
    if !quiet {
        use std::io::Write;
        let _ = std::io::stderr().write_all(&output.stdout);
        let _ = std::io::stderr().write_all(&output.stderr);
    }
}
