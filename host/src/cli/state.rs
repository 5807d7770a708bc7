//! `waku state get`: a key's state entries and the shared counters.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

use super::args::{DataArgs, OutputArgs, hint_if_in_use, parse_key};
use super::publish::load_module;
use crate::admin;
use crate::key::Key;
use crate::rebuild::RebuildPaths;
use crate::runtime::{Sandbox, SandboxLimits};
use crate::state::StateStore;

#[derive(Subcommand)]
pub(super) enum StateCommand {
    /// Print a key's state entries (and the shared counters) as JSON:
    /// indented for people, or on one line with `--output json`.
    #[command(after_help = "Example:\n  waku state get --data waku-data --projection bank --key 42 account\n  \
                      waku state get --projection bank --key 42 --admin http://127.0.0.1:9100 --shadow")]
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
    /// Ask the running host's admin endpoint instead of reading the files
    /// (which `waku run` holds open), e.g. `http://127.0.0.1:9100`.
    #[arg(long)]
    pub(super) admin: Option<String>,
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
        .with_context(|| format!("is `waku run` holding {}? pass --admin <its admin endpoint>", path.display()))
}

/// A key's state as the running host's admin endpoint at `url` answers it
/// (`/state/…`, or `/shadow/…` for the rebuild's shadow).
fn ask_admin(url: &str, args: &StateGetArgs, key: &Key) -> Result<serde_json::Value> {
    let route = if args.shadow { "shadow" } else { "state" };
    let encode = |text: &str| utf8_percent_encode(text, NON_ALPHANUMERIC).to_string();
    let url =
        format!("{}/{route}/{}/{}", url.trim_end_matches('/'), encode(&args.projection), encode(&key.to_string()));
    let mut response =
        ureq::get(&url).config().http_status_as_error(false).build().call().with_context(|| format!("asking {url}"))?;
    let body = response.body_mut().read_to_string().with_context(|| format!("reading the answer of {url}"))?;
    if !response.status().is_success() {
        bail!("{url} answered {}: {}", response.status(), body.trim());
    }
    let mut json: serde_json::Value =
        serde_json::from_str(&body).with_context(|| format!("{url} answered something else than a key's state"))?;
    if let (Some(only), Some(entries)) = (&args.entry, json.get_mut("entries").and_then(|e| e.as_object_mut())) {
        entries.retain(|name, _| name == only);
    }
    Ok(json)
}

pub(super) fn state_get(args: StateGetArgs) -> Result<()> {
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
    let output = match &args.admin {
        Some(url) => ask_admin(url, &args, &key)?,
        None => {
            let store = match args.shadow {
                false => args
                    .data
                    .state(&args.projection)
                    .map_err(hint_if_in_use("is `waku run` using it? pass --admin <its admin endpoint>"))?,
                true => shadow_store(&args)?,
            };
            admin::key_state_json(&store, &key, args.entry.as_deref())?
        }
    };
    match args.output.json() {
        true => outln!("{}", serde_json::to_string(&output)?)?,
        false => outln!("{}", serde_json::to_string_pretty(&output)?)?,
    }
    Ok(())
}
