//! `waku modules list|rollback`: a projection's module versions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde::Serialize;

use super::args::{DataArgs, OutputArgs};
use crate::lifecycle::Library;
use crate::runtime::{Sandbox, SandboxLimits};

#[derive(Subcommand)]
pub(super) enum ModulesCommand {
    /// Each module's active version and the versions kept for rollback.
    #[command(after_help = "Example:\n  waku modules list --data waku-data --projection bank --modules modules")]
    List(ModulesListArgs),
    /// Make an earlier kept version of a module active (the next `waku run`
    /// runs it; a running one keeps its version until then).
    #[command(after_help = "Example:\n  waku modules rollback --data waku-data --projection bank bank 778e4efa")]
    Rollback(ModulesRollbackArgs),
}

impl ModulesCommand {
    /// Where its data is.
    pub(super) fn data(&self) -> &DataArgs {
        match self {
            Self::List(args) => &args.data,
            Self::Rollback(args) => &args.data,
        }
    }
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
    #[command(flatten)]
    pub(super) output: OutputArgs,
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
    let store = data.existing_state(projection, "is another process using it? stop it first")?;
    let library = Library::new(&data.data, projection, store, Sandbox::new(SandboxLimits::default())?);
    match &command {
        ModulesCommand::List(args) => list(args, &library),
        ModulesCommand::Rollback(args) => {
            let (from, to) = library.rollback(&args.module, args.target.as_deref())?;
            outln!("module `{}`: {from} → {to}; the next `waku run` runs {to}", args.module)?;
            Ok(())
        }
    }
}

/// `waku modules list --output json`.
#[derive(Serialize)]
struct ModuleList<'a> {
    projection: &'a str,
    modules: Vec<ModuleVersions<'a>>,
}

/// One module in a [`ModuleList`].
#[derive(Serialize)]
struct ModuleVersions<'a> {
    module: &'a str,
    active: &'a str,
    /// Newest first, the active one among them.
    kept: &'a [String],
    /// With `--modules`: the directory's version, or null when the file is
    /// missing; left out without `--modules`.
    #[serde(skip_serializing_if = "Option::is_none")]
    in_directory: Option<Option<&'a str>>,
}

fn list(args: &ModulesListArgs, library: &Library) -> Result<()> {
    let recorded = library.recorded()?;
    let in_directory = match &args.modules {
        None => None,
        Some(dir) => Some(directory_versions(dir)?),
    };
    let modules: Vec<ModuleVersions> = recorded
        .active
        .iter()
        .map(|(module, active)| ModuleVersions {
            module,
            active,
            kept: recorded.kept.get(module).map(Vec::as_slice).unwrap_or_default(),
            in_directory: in_directory.as_ref().map(|versions| versions.get(module).map(String::as_str)),
        })
        .collect();
    if args.output.json() {
        outln!("{}", super::json_text(&ModuleList { projection: &args.projection, modules }, false)?)?;
        return Ok(());
    }
    if modules.is_empty() {
        outln!("projection `{}` has run no module yet", args.projection)?;
    }
    for view in &modules {
        let active = view.active;
        let kept: Vec<String> =
            view.kept.iter().map(|v| if v == active { format!("{v} (active)") } else { v.clone() }).collect();
        let directory = match view.in_directory {
            Some(Some(version)) if version == active => "; the directory holds the active version".to_owned(),
            Some(Some(version)) => format!("; the directory holds {version}"),
            Some(None) => "; not in the directory".to_owned(),
            None => String::new(),
        };
        outln!("{}: {active}{directory}\n  kept, newest first: {}", view.module, kept.join(", "))?;
    }
    Ok(())
}

/// The version of each `*.wasm` file of `dir`, by module name.
fn directory_versions(dir: &Path) -> Result<BTreeMap<String, String>> {
    Ok(std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "wasm"))
        .filter_map(|path| {
            let bytes = crate::runtime::read_component(&path).ok()?;
            Some((path.file_stem()?.to_string_lossy().into_owned(), crate::runtime::content_version(&bytes)))
        })
        .collect())
}
