//! `waku state get`: a key's state entries and the shared counters.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};

use super::args::{DataArgs, OutputArgs, parse_key};
use super::publish::load_module;
use crate::admin;
use crate::rebuild::RebuildPaths;
use crate::runtime::{Sandbox, SandboxLimits};
use crate::state::StateStore;

#[derive(Subcommand)]
pub(super) enum StateCommand {
    /// Print a key's state entries (and the shared counters) as JSON:
    /// indented for people, or on one line with `--output json`.
    #[command(after_help = "Example:\n  waku state get --data waku-data --projection bank --key 42 account")]
    Get(StateGetArgs),
}

#[derive(Args)]
pub(super) struct StateGetArgs {
    #[command(flatten)]
    pub(super) data: DataArgs,
    /// The projection.
    #[arg(long)]
    pub(super) projection: String,
    /// The key, as the module's log lines and `waku dlq list` print it
    /// (JSON: `42`, `'"ann"'`, `'[42,"eur"]'`).
    #[arg(long, conflicts_with = "event", required_unless_present = "event")]
    pub(super) key: Option<String>,
    /// Find the key from an event body: `<event type>=<JSON body>`, e.g.
    /// `AccountOpened={"account":42,"owner":""}`; needs --module.
    #[arg(long, requires = "module")]
    pub(super) event: Option<String>,
    /// The module that computes the key of --event.
    #[arg(long)]
    pub(super) module: Option<PathBuf>,
    /// Only this entry.
    pub(super) entry: Option<String>,
    /// Read the shadow of the rebuild under way instead (`waku rebuild`),
    /// to compare before promoting it.
    #[arg(long)]
    pub(super) shadow: bool,
    #[command(flatten)]
    pub(super) output: OutputArgs,
}

/// The shadow store of the rebuild under way.
fn shadow_store(args: &StateGetArgs) -> Result<StateStore> {
    if args.data.state.is_some() {
        bail!("--shadow reads a rebuild's shadow, which only the embedded state store has");
    }
    let paths = RebuildPaths::new(&args.data.data, &args.projection);
    let Some(request) = paths.request()? else {
        bail!("no rebuild of `{}` is under way, so it has no shadow", args.projection);
    };
    let path = paths.absolute(&paths.shadow_store(request.generation));
    if !path.is_file() {
        bail!("rebuild {} of `{}` has not started yet (is `waku run` running?)", request.generation, args.projection);
    }
    StateStore::open(&path)
        .with_context(|| format!("is `waku run` holding {}? stop it to read the shadow", path.display()))
}

pub(super) fn state_get(args: StateGetArgs) -> Result<()> {
    let store = match args.shadow {
        false => args.data.state(&args.projection)?,
        true => shadow_store(&args)?,
    };
    let key = match (&args.key, &args.event, &args.module) {
        (Some(text), _, _) => parse_key(text)?,
        (None, Some(event), Some(module)) => {
            let (type_name, body) = event.split_once('=').context("--event takes `<event type>=<JSON body>`")?;
            let sandbox = Sandbox::new(SandboxLimits::default())?;
            let module = load_module(&sandbox, module)?;
            let event_type = module
                .event_types()
                .iter()
                .find(|t| t.name == type_name)
                .with_context(|| format!("the module declares no event type `{type_name}`"))?;
            let body: serde_json::Value = serde_json::from_str(body).context("the body of --event is not JSON")?;
            let body = serde_json::to_vec(&body)?;
            module.instantiate()?.key(event_type.tag, &body).context("the module could not compute the key")?
        }
        _ => bail!("give --key, or --event with --module"),
    };
    let output = admin::key_state_json(&store, &key, args.entry.as_deref())?;
    match args.output.json() {
        true => outln!("{}", serde_json::to_string(&output)?)?,
        false => outln!("{}", serde_json::to_string_pretty(&output)?)?,
    }
    Ok(())
}
