//! Building a guest into a handler component: a Rust crate (a directory
//! with a `Cargo.toml`), a Python project (a `pyproject.toml`, see
//! [`python`]) or a TypeScript/JavaScript project (a `package.json` with a
//! `wakuwaku` field, see [`js`]).
//!
//! A crate is built with the plain `wasm32-wasip2` target:
//! `cargo build --target wasm32-wasip2`, no extra tools. If the target is
//! missing, it says so and installs it with `rustup target add
//! wasm32-wasip2`. The built component's path comes from cargo's own JSON
//! messages, never from a guessed file name.
//!
//! The commands (`waku build`, `waku dev`) build every Rust guest into one
//! shared target directory unless told otherwise ([`shared_target_dir`]):
//! the dependencies every guest has (the SDK's wit-bindgen, serde) are
//! compiled once per machine, not once per project. Before cargo starts,
//! one line says what is built and where; when that target directory holds
//! no build for the guest target yet, it says that the first build
//! compiles the dependencies and takes minutes. Cargo's own progress
//! (standard error) is passed through as it comes.
//!
//! A Python project is built with componentize-py, from PyPI, against the
//! contract this host implements; when componentize-py is missing, the
//! error says how to install it. A TypeScript or JavaScript project is
//! bundled with esbuild and built with componentize-js, both from npm.
//! Both skip a build when nothing it reads has changed, and write the
//! component beside and rename it into place (`stamped`).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub mod js;
pub mod python;
mod stamped;

/// The target every guest is built for.
pub const GUEST_TARGET: &str = "wasm32-wasip2";

/// The environment variable naming the shared target directory of Rust
/// guests (see [`shared_target_dir`]).
pub const TARGET_DIR_ENV: &str = "WAKU_TARGET_DIR";

/// The target directory the commands build Rust guests into when none is
/// given: `$WAKU_TARGET_DIR`, else `waku/target` in the user's cache
/// directory (`$XDG_CACHE_HOME`, else `~/.cache`), beside `waku test`'s
/// compile cache. `CARGO_TARGET_DIR` is not read: an outer cargo's (a
/// `cargo test` running `waku`) would make the guest build wait for the
/// outer build's lock.
pub fn shared_target_dir() -> Option<PathBuf> {
    let environment = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty()).map(PathBuf::from);
    environment(TARGET_DIR_ENV).or_else(|| {
        let cache = environment("XDG_CACHE_HOME").or_else(|| environment("HOME").map(|home| home.join(".cache")))?;
        Some(cache.join("waku").join("target"))
    })
}

/// The target directory the commands build the guest in `guest_dir` into
/// when none is given: [`shared_target_dir`] for a Rust guest (a
/// Cargo.toml), none (the project's own) for a Python project, whose
/// component is named by its module and would meet other projects' there.
pub fn default_target_dir(guest_dir: &Path) -> Option<PathBuf> {
    if guest_dir.join("Cargo.toml").is_file() { shared_target_dir() } else { None }
}

/// The line printed before cargo builds `crate_dir` into `target_dir`:
/// what is built, where, and, when `target_dir` holds no build of this
/// profile for the guest target yet, that the first build takes minutes.
fn build_notice(crate_dir: &Path, target_dir: &Path, release: bool) -> String {
    let profile = if release { "release" } else { "debug" };
    let mut notice =
        format!("waku: building {} for {GUEST_TARGET} ({profile}) in {}", crate_dir.display(), target_dir.display());
    if !target_dir.join(GUEST_TARGET).join(profile).is_dir() {
        notice.push_str(
            "; the first build there compiles the dependencies too (wit-bindgen, serde) and takes minutes \
             (2 to 9 on 2 cores, by their load), later builds seconds; cargo's progress follows",
        );
    }
    notice
}

/// Why a guest could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The directory has no Cargo.toml, pyproject.toml or package.json.
    #[error(
        "no Cargo.toml, pyproject.toml or package.json in {0}: pass the directory of a guest crate, Python \
         project or TypeScript/JavaScript project"
    )]
    NotAGuest(PathBuf),
    /// A tool could not be started.
    #[error("could not run `{tool}` ({source}); is the Rust toolchain (rustup, cargo) installed and on PATH?")]
    Tool {
        /// The command.
        tool: String,
        /// Why it did not start.
        source: std::io::Error,
    },
    /// `rustup target add` failed.
    #[error(
        "the {GUEST_TARGET} target is missing and `rustup target add {GUEST_TARGET}` failed; run it by hand and retry"
    )]
    TargetInstall,
    /// cargo reported a failed build.
    #[error("cargo could not build {0} for {GUEST_TARGET} (see the compiler output above)")]
    Cargo(PathBuf),
    /// The build succeeded but produced no component.
    #[error("building {0} produced no .wasm file: is it a library with crate-type [\"cdylib\"]?")]
    NoArtifact(PathBuf),
    /// A Python project's `pyproject.toml` cannot be read or has no usable
    /// `[tool.wakuwaku]` table.
    #[error("{}: {reason}", path.display())]
    PyProject {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// componentize-py is not installed where it was looked for.
    #[error(
        "componentize-py is needed to build the Python project {} and was not found ({looked}); install it from \
         PyPI into a virtual environment: `python3 -m venv {}/.venv && {}/.venv/bin/pip install \
         componentize-py=={}` (or set {} to its path)",
        dir.display(), dir.display(), dir.display(), python::TESTED_COMPONENTIZE_PY, python::COMPONENTIZE_PY_ENV
    )]
    ComponentizePyMissing {
        /// The project.
        dir: PathBuf,
        /// Where it was looked for.
        looked: String,
    },
    /// componentize-py reported a failed build.
    #[error("componentize-py could not build {}{output}", dir.display())]
    Componentize {
        /// The project.
        dir: PathBuf,
        /// The end of its output.
        output: String,
    },
    /// A TypeScript/JavaScript project's `package.json` cannot be read or
    /// has no usable `wakuwaku` field.
    #[error("{}: {reason}", path.display())]
    PackageJson {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// esbuild or componentize-js is not installed in a `node_modules` of
    /// the project or a directory above it.
    #[error(
        "esbuild and componentize-js are needed to build the TypeScript/JavaScript project {} and were not found \
         in node_modules/.bin of it or a directory above it; install them from npm into the project: `cd {} && \
         npm install --save-dev @bytecodealliance/componentize-js@{} esbuild@{}` (with node 20 or later)",
        dir.display(), dir.display(), js::TESTED_COMPONENTIZE_JS, js::TESTED_ESBUILD
    )]
    JsToolsMissing {
        /// The project.
        dir: PathBuf,
    },
    /// esbuild or componentize-js reported a failed build.
    #[error("{tool} could not build {}{output}", dir.display())]
    JsBuild {
        /// The tool that failed.
        tool: &'static str,
        /// The project.
        dir: PathBuf,
        /// The end of its output.
        output: String,
    },
    /// A file or directory of the build could not be read or written, or
    /// the build tool could not be started.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

/// What to build and where.
#[derive(Debug, Clone)]
pub struct GuestBuild {
    /// The guest's directory: a crate (holding Cargo.toml), a Python
    /// project (holding pyproject.toml) or a TypeScript/JavaScript project
    /// (holding package.json).
    pub crate_dir: PathBuf,
    /// Cargo's target directory; `None` uses cargo's default for the crate.
    /// A Python project's component is written to `<it>/python/<module>.wasm`
    /// (default `<project>/target/python/<module>.wasm`), a TypeScript or
    /// JavaScript project's to `<it>/js/<package name>.wasm`.
    pub target_dir: Option<PathBuf>,
    /// Optimised build (the default) or debug; Rust only.
    pub release: bool,
    /// Hide the build tool's progress output (errors are still shown).
    pub quiet: bool,
    /// Cargo features to turn on; Rust only. A build with other features
    /// writes the same file name: give it a target directory of its own.
    pub features: Vec<String>,
}

impl GuestBuild {
    /// A release build of the crate in `crate_dir`.
    pub fn new(crate_dir: impl Into<PathBuf>) -> Self {
        Self { crate_dir: crate_dir.into(), target_dir: None, release: true, quiet: false, features: Vec::new() }
    }

    /// Builds the guest and returns the path of the component: a crate
    /// with cargo, else a Python project with componentize-py, else a
    /// TypeScript/JavaScript project with esbuild and componentize-js.
    pub fn run(&self) -> Result<PathBuf, BuildError> {
        let manifest = self.crate_dir.join("Cargo.toml");
        if manifest.is_file() {
            return self.run_cargo(&manifest);
        }
        if self.crate_dir.join("pyproject.toml").is_file() {
            let target = self.target_dir.clone().unwrap_or_else(|| self.crate_dir.join("target"));
            return python::build(&self.crate_dir, &target.join("python"), self.quiet);
        }
        if self.crate_dir.join("package.json").is_file() {
            let target = self.target_dir.clone().unwrap_or_else(|| self.crate_dir.join("target"));
            return js::build(&self.crate_dir, &target.join("js"), self.quiet);
        }
        Err(BuildError::NotAGuest(self.crate_dir.clone()))
    }

    fn run_cargo(&self, manifest: &Path) -> Result<PathBuf, BuildError> {
        ensure_target(self.quiet)?;
        if !self.quiet {
            let default_target = self.crate_dir.join("target");
            let target_dir = self.target_dir.as_deref().unwrap_or(&default_target);
            // Not `eprintln!`, which panics when standard error is a closed pipe.
            let _ = writeln!(std::io::stderr(), "{}", build_notice(&self.crate_dir, target_dir, self.release));
        }
        let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cargo
            .args(["build", "--target", GUEST_TARGET, "--message-format", "json-render-diagnostics"])
            .arg("--manifest-path")
            .arg(manifest)
            .stdout(Stdio::piped())
            .stderr(if self.quiet { Stdio::null() } else { Stdio::inherit() });
        if self.release {
            cargo.arg("--release");
        }
        if self.quiet {
            cargo.arg("--quiet");
        }
        if !self.features.is_empty() {
            cargo.arg("--features").arg(self.features.join(","));
        }
        if let Some(dir) = &self.target_dir {
            cargo.arg("--target-dir").arg(dir);
        }
        // Settings of an outer cargo (when run from `cargo run` or a test)
        // must not leak into the guest build.
        for var in ["CARGO_TARGET_DIR", "RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "CARGO_BUILD_TARGET"] {
            cargo.env_remove(var);
        }
        let mut child = cargo.spawn().map_err(|source| BuildError::Tool { tool: "cargo".into(), source })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut artifact = None;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(path) = wasm_artifact(&line, manifest) {
                artifact = Some(path);
            }
        }
        let status = child.wait().map_err(|source| BuildError::Tool { tool: "cargo".into(), source })?;
        if !status.success() {
            return Err(BuildError::Cargo(self.crate_dir.clone()));
        }
        artifact.ok_or_else(|| BuildError::NoArtifact(self.crate_dir.clone()))
    }
}

/// The .wasm file of a `compiler-artifact` message for the crate at
/// `manifest`, if this line is one.
fn wasm_artifact(line: &str, manifest: &Path) -> Option<PathBuf> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact" {
        return None;
    }
    let from_manifest = Path::new(message["manifest_path"].as_str()?);
    let same_crate = match (from_manifest.canonicalize(), manifest.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => from_manifest == manifest,
    };
    if !same_crate {
        return None;
    }
    message["filenames"]
        .as_array()?
        .iter()
        .filter_map(serde_json::Value::as_str)
        .find(|name| name.ends_with(".wasm"))
        .map(PathBuf::from)
}

/// Installs the guest target with rustup when it is missing.
fn ensure_target(quiet: bool) -> Result<(), BuildError> {
    let tool = |source| BuildError::Tool { tool: "rustup".into(), source };
    let installed = Command::new("rustup").args(["target", "list", "--installed"]).output().map_err(tool)?;
    if String::from_utf8_lossy(&installed.stdout).lines().any(|line| line.trim() == GUEST_TARGET) {
        return Ok(());
    }
    // Not `eprintln!`, which panics when standard error is a closed pipe.
    let _ = writeln!(
        std::io::stderr(),
        "waku: the {GUEST_TARGET} target is not installed; installing it with `rustup target add {GUEST_TARGET}`"
    );
    let mut add = Command::new("rustup");
    add.args(["target", "add", GUEST_TARGET]);
    if quiet {
        add.stdout(Stdio::null());
    }
    if add.status().map_err(tool)?.success() { Ok(()) } else { Err(BuildError::TargetInstall) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_wasm_file_of_the_right_crate() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("Cargo.toml");
        std::fs::write(&manifest, "").unwrap();
        let line = serde_json::json!({
            "reason": "compiler-artifact",
            "manifest_path": manifest,
            "filenames": ["/t/libbank.rlib", "/t/bank.wasm"],
        })
        .to_string();
        assert_eq!(wasm_artifact(&line, &manifest), Some(PathBuf::from("/t/bank.wasm")));
        let other = line.replace("Cargo.toml", "Other.toml");
        assert_eq!(wasm_artifact(&other, &manifest), None);
        assert_eq!(wasm_artifact("not json", &manifest), None);
    }

    #[test]
    fn the_build_notice_says_when_a_first_build_takes_minutes() {
        let target = tempfile::tempdir().unwrap();
        let first = build_notice(Path::new("shop"), target.path(), true);
        assert!(first.starts_with("waku: building shop for wasm32-wasip2 (release) in "), "{first}");
        assert!(first.contains("the first build there compiles the dependencies too"), "{first}");
        std::fs::create_dir_all(target.path().join(GUEST_TARGET).join("release")).unwrap();
        let later = build_notice(Path::new("shop"), target.path(), true);
        assert!(!later.contains("first build"), "{later}");
        // A debug build has not been made there yet.
        assert!(build_notice(Path::new("shop"), target.path(), false).contains("first build"));
    }

    #[test]
    fn a_directory_without_a_manifest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let error = GuestBuild::new(dir.path()).run().unwrap_err();
        assert!(matches!(error, BuildError::NotAGuest(_)), "{error}");
    }
}
