//! `waku state get`: a page of a key's state entries and the first shared
//! counters; `waku state counters`: a page of the counters. Pages as the
//! admin endpoint shows them ([`admin::view`]), read from the files or
//! asked of the running host.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

use super::admin_access::{self, AdminClientArgs};
use super::args::{DataArgs, OutputArgs, parse_key};
use super::publish::load_module;
use crate::operations::admin::view;
use crate::operations::rebuild::RebuildPaths;
use crate::sandbox::runtime::{Sandbox, SandboxLimits};
use crate::storage::state::StateStore;

#[derive(Subcommand)]
pub(super) enum StateCommand {
    /// Print a key's state entries (a page of them: `entries_next` names
    /// the next, for --after) and the first shared counters
    /// (`counters_next`: more with `waku state counters`) as JSON: indented
    /// for people, or on one line with `--output json`.
    #[command(after_help = "Example:\n  waku state get --data waku-data --projection bank --key 42 account\n  \
                      waku state get --projection bank --key 42 --admin http://127.0.0.1:9100 --shadow")]
    Get(StateGetArgs),
    /// Print a page of the projection's counters as JSON (`next` names the
    /// next page, for --after).
    #[command(after_help = "Example:\n  waku state counters --data waku-data --projection bank --limit 1000\n  \
                      waku state counters --projection bank --after total --admin http://127.0.0.1:9100")]
    Counters(StateCountersArgs),
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
    /// Show the entries after this name (a page's `entries_next`).
    #[arg(long, conflicts_with = "entry")]
    pub(super) after: Option<String>,
    /// The most entries to show (at most 1000; default 100).
    #[arg(long, conflicts_with = "entry", value_parser = clap::value_parser!(u64).range(1..=view::MAX_PAGE as u64))]
    pub(super) limit: Option<u64>,
    /// Read the shadow of the rebuild under way instead (`waku rebuild`),
    /// to compare before promoting it.
    #[arg(long)]
    pub(super) shadow: bool,
    /// Ask the running host's admin endpoint instead of reading the files
    /// (which `waku run` holds open): its address as `run --admin` took it,
    /// `127.0.0.1:9100`, or as a URL, `http://127.0.0.1:9100`.
    #[arg(long, value_parser = super::admin_access::endpoint_url)]
    pub(super) admin: Option<String>,
    #[command(flatten)]
    pub(super) admin_access: AdminClientArgs,
    #[command(flatten)]
    pub(super) output: OutputArgs,
}

#[derive(Args)]
pub(super) struct StateCountersArgs {
    #[command(flatten)]
    pub(super) data: DataArgs,
    /// The projection.
    #[arg(long)]
    pub(super) projection: String,
    /// Show the counters after this name (a page's `next`).
    #[arg(long)]
    pub(super) after: Option<String>,
    /// The most counters to show (at most 1000; default 100).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=view::MAX_PAGE as u64))]
    pub(super) limit: Option<u64>,
    /// Read the shadow of the rebuild under way instead (`waku rebuild`).
    #[arg(long)]
    pub(super) shadow: bool,
    /// Ask the running host's admin endpoint instead of reading the files
    /// (which `waku run` holds open): its address as `run --admin` took it,
    /// `127.0.0.1:9100`, or as a URL, `http://127.0.0.1:9100`.
    #[arg(long, value_parser = super::admin_access::endpoint_url)]
    pub(super) admin: Option<String>,
    #[command(flatten)]
    pub(super) admin_access: AdminClientArgs,
    #[command(flatten)]
    pub(super) output: OutputArgs,
}

/// The store a state command reads: the projection's, or with `shadow`
/// the shadow of the rebuild under way.
fn open_store(data: &DataArgs, projection: &str, shadow: bool) -> Result<StateStore> {
    match shadow {
        false => data.existing_state(projection, "is `waku run` using it? pass --admin <its admin endpoint>"),
        true => shadow_store(data, projection),
    }
}

/// The shadow store of the rebuild under way.
fn shadow_store(data: &DataArgs, projection: &str) -> Result<StateStore> {
    if data.state.is_some() {
        bail!("--shadow reads a rebuild's shadow, which only the embedded state store has");
    }
    super::existing::projection(&data.data, projection)?;
    let paths = RebuildPaths::new(&data.data, projection);
    let Some(request) = paths.request()? else {
        bail!("no rebuild of `{projection}` is under way, so it has no shadow");
    };
    let path = paths.absolute(&paths.shadow_store(request.generation));
    if !path.is_file() {
        bail!("rebuild {} of `{projection}` has not started yet (is `waku run` running?)", request.generation);
    }
    StateStore::open(&path)
        .with_context(|| format!("is `waku run` holding {}? pass --admin <its admin endpoint>", path.display()))
}

/// What the running host's admin endpoint at `url` answers for `route`
/// of `projection` (`/state/…`, or `/shadow/…` for the rebuild's shadow),
/// with the query `parameters`.
fn ask_admin(
    url: &str,
    access: &AdminClientArgs,
    shadow: bool,
    projection: &str,
    route: &str,
    parameters: &[(&str, Option<String>)],
) -> Result<serde_json::Value> {
    let root = if shadow { "shadow" } else { "state" };
    let encode = |text: &str| utf8_percent_encode(text, NON_ALPHANUMERIC).to_string();
    let query: Vec<String> = parameters
        .iter()
        .filter_map(|(name, value)| value.as_ref().map(|value| format!("{name}={}", encode(value))))
        .collect();
    let mut url = format!("{}/{root}/{}/{route}", url.trim_end_matches('/'), encode(projection));
    if !query.is_empty() {
        url = format!("{url}?{}", query.join("&"));
    }
    let token = admin_access::token(access.admin_token_file.as_deref())?;
    let body = admin_access::get(&url, token.as_ref(), access.admin_ca_file.as_deref())?;
    serde_json::from_str(&body).with_context(|| format!("{url} answered something else than a view of the state"))
}

/// Prints `json`: indented for people, on one line for programs, with
/// the module's names and values escaped ([`super::json_text`]).
fn print(json: &serde_json::Value, output: &OutputArgs) -> Result<()> {
    outln!("{}", super::json_text(json, !output.json())?)?;
    Ok(())
}

pub(super) fn state_counters(args: StateCountersArgs) -> Result<()> {
    let page = view::Page { after: args.after.clone(), limit: args.limit.map(|limit| limit as usize) };
    let output = match &args.admin {
        Some(url) => {
            let parameters = [("after", page.after.clone()), ("limit", page.limit.map(|limit| limit.to_string()))];
            ask_admin(url, &args.admin_access, args.shadow, &args.projection, "counters", &parameters)?
        }
        None => {
            let store = open_store(&args.data, &args.projection, args.shadow)?;
            serde_json::to_value(view::counters_view(&store, &page)?)?
        }
    };
    print(&output, &args.output)
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
    let page = view::Page { after: args.after.clone(), limit: args.limit.map(|limit| limit as usize) };
    let output = match &args.admin {
        Some(url) => {
            let parameters = [
                ("entry", args.entry.clone()),
                ("after", page.after.clone()),
                ("limit", page.limit.map(|limit| limit.to_string())),
            ];
            let mut json =
                ask_admin(url, &args.admin_access, args.shadow, &args.projection, &key.to_string(), &parameters)?;
            // A host from before `?entry=` answers all of the page.
            if let (Some(only), Some(entries)) = (&args.entry, json.get_mut("entries").and_then(|e| e.as_object_mut()))
            {
                entries.retain(|name, _| name == only);
            }
            json
        }
        None => {
            let store = open_store(&args.data, &args.projection, args.shadow)?;
            serde_json::to_value(view::key_view(&store, &key, args.entry.as_deref(), &page)?)?
        }
    };
    print(&output, &args.output)
}
