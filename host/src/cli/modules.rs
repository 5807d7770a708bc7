//! `waku modules list|rollback|push|pull|adopt`: a projection's module
//! versions, and modules in OCI registries.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde::Serialize;

use super::args::{DataArgs, OutputArgs};
use crate::engine::projection::Projection;
use crate::operations::lifecycle::Library;
use crate::operations::oci::{ModuleRef, Registry, pins};
use crate::sandbox::runtime::{Sandbox, SandboxLimits};

#[derive(Subcommand)]
pub(super) enum ModulesCommand {
    /// Each module's active version and the versions kept for rollback.
    #[command(after_help = "Example:\n  waku modules list --data waku-data --projection bank --modules modules")]
    List(ModulesListArgs),
    /// Make an earlier kept version of a module active: a `waku run` of
    /// the projection swaps it in at once (as a hot reload, with its
    /// checks); otherwise the next `waku run` runs it.
    #[command(after_help = "Example:\n  waku modules rollback --data waku-data --projection bank bank 778e4efa")]
    Rollback(ModulesRollbackArgs),
    /// Push a component to an OCI registry, in the Wasm artifact layout
    /// `wkg oci push` writes. Credentials: WAKU_OCI_USERNAME and
    /// WAKU_OCI_PASSWORD, or a Docker config.json (never flags).
    #[command(after_help = "Example:\n  waku modules push modules/bank.wasm oci://registry.example/team/bank:v1")]
    Push(ModulesPushArgs),
    /// Pull a component from an OCI registry into a module directory, as
    /// `<last segment of the repository>.wasm`, verified against its digests.
    #[command(
        after_help = "Example:\n  waku modules pull oci://registry.example/team/bank:v1 --modules modules\n  waku modules pull \
                      oci://registry.example/team/bank@sha256:… --modules modules"
    )]
    Pull(ModulesPullArgs),
    /// Take what the projection's module references (--module-ref, or
    /// `module-ref` in waku.toml) name now: pull each, pin it, and make it
    /// the recorded version, so the next `waku run` runs it. A restart
    /// otherwise keeps the pinned digests even after a tag moved. Stop
    /// `waku run` first.
    #[command(after_help = "Example:\n  waku modules adopt --data waku-data --projection bank --modules modules \
                            --module-ref oci://registry.example/team/bank:v1")]
    Adopt(ModulesAdoptArgs),
}

impl ModulesCommand {
    /// Where its data is, for the commands a running host runs for
    /// others: not push and pull (no data directory), nor adopt (which
    /// wants the host stopped).
    pub(super) fn data(&self) -> Option<&DataArgs> {
        match self {
            Self::List(args) => Some(&args.data),
            Self::Rollback(args) => Some(&args.data),
            Self::Push(_) | Self::Pull(_) | Self::Adopt(_) => None,
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

#[derive(Args)]
pub(super) struct ModulesPushArgs {
    /// The component file.
    pub(super) file: PathBuf,
    /// Where to push it: oci://REGISTRY/REPOSITORY:TAG.
    #[arg(value_parser = super::run::module_ref)]
    pub(super) reference: ModuleRef,
}

#[derive(Args)]
pub(super) struct ModulesPullArgs {
    /// What to pull: oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST].
    #[arg(value_parser = super::run::module_ref)]
    pub(super) reference: ModuleRef,
    /// The module directory to pull into.
    #[arg(long)]
    pub(super) modules: PathBuf,
}

#[derive(Args)]
pub(super) struct ModulesAdoptArgs {
    #[command(flatten)]
    pub(super) data: DataArgs,
    /// The projection.
    #[arg(long)]
    pub(super) projection: String,
    /// The projection's module directory.
    #[arg(long)]
    pub(super) modules: PathBuf,
    /// The module references, as `waku run` takes them.
    #[arg(long = "module-ref", value_name = "REF", value_delimiter = ',', value_parser = super::run::module_ref)]
    pub(super) module_refs: Vec<ModuleRef>,
}

pub(super) async fn modules(command: ModulesCommand) -> Result<()> {
    let (data, projection) = match &command {
        ModulesCommand::Push(args) => return push(args).await,
        ModulesCommand::Pull(args) => return pull(args).await,
        ModulesCommand::Adopt(args) => return adopt(args).await,
        ModulesCommand::List(args) => (&args.data, &args.projection),
        ModulesCommand::Rollback(args) => (&args.data, &args.projection),
    };
    if let ModulesCommand::Rollback(args) = &command
        && let Some((library, running)) = super::local_host::live_modules(&args.data.data, projection)
    {
        return rollback_running(args, library, running).await;
    }
    let store = data.existing_state(projection, "is another process using it? stop it first")?;
    let pinned = pins::read(&store)?;
    let library = Library::new(&data.data, projection, store, Sandbox::new(SandboxLimits::default())?);
    match &command {
        ModulesCommand::List(args) => list(args, &library, &pinned),
        ModulesCommand::Rollback(args) => {
            let (from, to) = library.rollback(&args.module, args.target.as_deref())?;
            outln!("module `{}`: {from} → {to}; the next `waku run` runs {to}", args.module)?;
            Ok(())
        }
        _ => unreachable!("handled above"),
    }
}

/// `modules rollback` run by the host of the projection: swapped in at
/// once, through the hot-reload checks.
async fn rollback_running(args: &ModulesRollbackArgs, library: Arc<Library>, running: Arc<Projection>) -> Result<()> {
    let (module, target) = (args.module.clone(), args.target.clone());
    let (from, to) =
        tokio::task::spawn_blocking(move || library.rollback_running(&running, &module, target.as_deref()))
            .await
            .context("rolling the module back")??;
    outln!("module `{}`: {from} → {to}; the running host runs {to} from its next batch", args.module)?;
    Ok(())
}

async fn push(args: &ModulesPushArgs) -> Result<()> {
    let bytes = crate::sandbox::runtime::read_component(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let bytes = loaded(&args.reference, bytes).await?;
    let registry = Registry::for_registry(args.reference.registry())?;
    let artifact = registry.push(bytes, &args.reference).await?;
    outln!("pushed {} as {}", args.file.display(), args.reference)?;
    outln!("  manifest {}\n  layer    {}", artifact.manifest, artifact.layer)?;
    outln!("  pin it with {}", args.reference.at_digest(&artifact.manifest))?;
    Ok(())
}

async fn pull(args: &ModulesPullArgs) -> Result<()> {
    let registry = Registry::for_registry(args.reference.registry())?;
    let pulled = registry.pull(&args.reference).await?;
    let pulled = crate::operations::oci::Pulled { bytes: loaded(&args.reference, pulled.bytes).await?, ..pulled };
    let path = crate::operations::oci::write_module(&args.modules, args.reference.module(), &pulled.bytes)
        .with_context(|| format!("writing into {}", args.modules.display()))?;
    outln!("pulled {} into {}", args.reference, path.display())?;
    outln!("  manifest {}\n  layer    {}", pulled.artifact.manifest, pulled.artifact.layer)?;
    outln!("  version  {}", crate::sandbox::runtime::content_version(&pulled.bytes))?;
    Ok(())
}

/// `bytes` if they are a component that loads ([`crate::operations::oci::check_loads`]).
async fn loaded(reference: &ModuleRef, bytes: Vec<u8>) -> Result<Vec<u8>> {
    let reference = reference.clone();
    tokio::task::spawn_blocking(move || {
        let sandbox = Sandbox::new(SandboxLimits::default())?;
        crate::operations::oci::check_loads(&sandbox, &reference, &bytes)?;
        Ok::<_, anyhow::Error>(bytes)
    })
    .await
    .context("loading the component")?
}

async fn adopt(args: &ModulesAdoptArgs) -> Result<()> {
    if args.module_refs.is_empty() {
        bail!("no module references to adopt: give --module-ref, or `module-ref` in waku.toml");
    }
    let store = args.data.existing_state(&args.projection, "is `waku run` using it? stop it first")?;
    let before = pins::read(&store)?;
    let sandbox = Sandbox::new(SandboxLimits::default())?;
    let synced = pins::sync(&store, &args.modules, &args.module_refs, true, &sandbox).await?;
    let library = Library::new(&args.data.data, &args.projection, store.clone(), sandbox);
    let dir = args.modules.clone();
    let adopted = synced.adopt.clone();
    tokio::task::spawn_blocking(move || library.start_adopting(&dir, &|name| adopted.contains(name)))
        .await
        .context("loading the modules")??;
    pins::save(&store, &synced.pins)?;
    for (module, pin) in &synced.pins {
        match before.get(module) {
            Some(old) if old.manifest == pin.manifest => {
                outln!("module `{module}`: {} stays at {}", pin.reference, pin.manifest)?
            }
            Some(old) => outln!(
                "module `{module}`: {} → {} ({}); the next `waku run` runs it",
                old.manifest,
                pin.manifest,
                pin.reference
            )?,
            None => outln!(
                "module `{module}`: pinned to {} ({}); the next `waku run` runs it",
                pin.manifest,
                pin.reference
            )?,
        }
    }
    Ok(())
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
    /// For a module named by OCI reference: the reference and the digests
    /// it is pinned to. Left out otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pinned: Option<&'a pins::Pin>,
}

fn list(args: &ModulesListArgs, library: &Library, pinned: &pins::Pins) -> Result<()> {
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
            pinned: pinned.get(module),
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
        if let Some(pin) = view.pinned {
            outln!("  from {} pinned to {} (layer {})", pin.reference, pin.manifest, pin.layer)?;
        }
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
            let bytes = crate::sandbox::runtime::read_component(&path).ok()?;
            Some((path.file_stem()?.to_string_lossy().into_owned(), crate::sandbox::runtime::content_version(&bytes)))
        })
        .collect())
}
