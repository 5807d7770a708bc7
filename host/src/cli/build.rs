//! `waku build`: a guest crate, Python project or TypeScript/JavaScript
//! project into a component.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::authoring::guest_build::{GuestBuild, default_target_dir};

#[derive(Args)]
pub(super) struct BuildArgs {
    /// The guest's directory: a crate (Cargo.toml), a Python project
    /// (pyproject.toml with a [tool.wakuwaku] table naming its module) or a
    /// TypeScript/JavaScript project (package.json with a "wakuwaku" field
    /// naming its main file).
    #[arg(default_value = ".")]
    pub(super) crate_dir: PathBuf,
    /// Copy the component to this file.
    #[arg(long, short)]
    pub(super) out: Option<PathBuf>,
    /// Build without optimisation (Rust only).
    #[arg(long)]
    pub(super) debug: bool,
    /// Cargo's target directory. A Rust guest's default is one directory
    /// every project shares, so dependencies compile once: $WAKU_TARGET_DIR,
    /// else waku/target in the user's cache directory. A Python component
    /// goes to <it>/python/<module>.wasm, a TypeScript/JavaScript one to
    /// <it>/js/<package name>.wasm (default: the project's target/).
    #[arg(long)]
    pub(super) target_dir: Option<PathBuf>,
}

pub(super) fn build(args: BuildArgs) -> Result<()> {
    let target_dir = args.target_dir.or_else(|| default_target_dir(&args.crate_dir));
    let built = GuestBuild { target_dir, release: !args.debug, ..GuestBuild::new(&args.crate_dir) }.run()?;
    let path = match args.out {
        Some(out) => {
            std::fs::copy(&built, &out).with_context(|| format!("copying {} to {}", built.display(), out.display()))?;
            out
        }
        None => built,
    };
    outln!("{}", path.display())?;
    Ok(())
}
