//! `waku modules list|rollback`: a projection's module versions.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use super::args::DataArgs;
use crate::lifecycle::Library;
use crate::runtime::{Sandbox, SandboxLimits};

#[derive(Subcommand)]
pub(super) enum ModulesCommand {
    /// Each module's active version and the versions kept for rollback.
    List(ModulesListArgs),
    /// Make an earlier kept version of a module active (the next `waku run`
    /// runs it). Stop `waku run` first.
    Rollback(ModulesRollbackArgs),
}

#[derive(Args)]
pub(super) struct ModulesListArgs {
    #[command(flatten)]
    pub(super) data: DataArgs,
    /// The projection.
    #[arg(long)]
    pub(super) projection: String,
    /// Also compare with the files of this module directory.
    #[arg(long)]
    pub(super) modules: Option<PathBuf>,
}

#[derive(Args)]
pub(super) struct ModulesRollbackArgs {
    #[command(flatten)]
    pub(super) data: DataArgs,
    /// The projection.
    #[arg(long)]
    pub(super) projection: String,
    /// The module.
    pub(super) module: String,
    /// The version (or a prefix of it); default: the one before the active.
    #[arg(value_name = "VERSION")]
    pub(super) target: Option<String>,
}

pub(super) fn modules(command: ModulesCommand) -> Result<()> {
    let (data, projection) = match &command {
        ModulesCommand::List(args) => (&args.data, &args.projection),
        ModulesCommand::Rollback(args) => (&args.data, &args.projection),
    };
    let store = data.state(projection).context("is `waku run` using it? stop it first")?;
    let library = Library::new(&data.data, projection, store, Sandbox::new(SandboxLimits::default())?);
    match &command {
        ModulesCommand::List(args) => {
            let recorded = library.recorded()?;
            if recorded.active.is_empty() {
                outln!("projection `{projection}` has run no module yet")?;
            }
            let in_directory: std::collections::BTreeMap<String, String> = match &args.modules {
                None => Default::default(),
                Some(dir) => std::fs::read_dir(dir)
                    .with_context(|| format!("reading {}", dir.display()))?
                    .filter_map(Result::ok)
                    .map(|entry| entry.path())
                    .filter(|path| path.extension().is_some_and(|ext| ext == "wasm"))
                    .filter_map(|path| {
                        let bytes = std::fs::read(&path).ok()?;
                        Some((
                            path.file_stem()?.to_string_lossy().into_owned(),
                            crate::runtime::content_version(&bytes),
                        ))
                    })
                    .collect(),
            };
            for (module, active) in &recorded.active {
                let kept = recorded.kept.get(module).map(Vec::as_slice).unwrap_or_default();
                let kept: Vec<String> =
                    kept.iter().map(|v| if v == active { format!("{v} (active)") } else { v.clone() }).collect();
                let directory = match in_directory.get(module) {
                    Some(version) if version == active => "; the directory holds the active version".to_owned(),
                    Some(version) => format!("; the directory holds {version}"),
                    None if args.modules.is_some() => "; not in the directory".to_owned(),
                    None => String::new(),
                };
                outln!("{module}: {active}{directory}\n  kept, newest first: {}", kept.join(", "))?;
            }
        }
        ModulesCommand::Rollback(args) => {
            let (from, to) = library.rollback(&args.module, args.target.as_deref())?;
            outln!("module `{}`: {from} → {to}; the next `waku run` runs {to}", args.module)?;
        }
    }
    Ok(())
}
