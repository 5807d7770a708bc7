//! `waku publish`: JSON lines to a topic, with headers from the module.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;

use super::args::DataArgs;
use super::available_threads;
use crate::authoring::publish;
use crate::engine::projection::load_module_file;
use crate::sandbox::handler::HandlerModule;
use crate::sandbox::runtime::{Sandbox, SandboxLimits};
use crate::storage::log::EventLog;

#[derive(Args)]
pub(super) struct PublishArgs {
    #[command(flatten)]
    pub(super) data: DataArgs,
    /// The topic to publish to.
    #[arg(long)]
    pub(super) topic: String,
    /// The handler module whose `key` and `ordering` write the headers.
    #[arg(long)]
    pub(super) module: PathBuf,
    /// Create the topic with this many partitions if it does not exist.
    #[arg(long)]
    pub(super) partitions: Option<u32>,
    /// JSON lines, `{"type": "<event type>", "body": {...}}`; `-` reads stdin.
    pub(super) file: PathBuf,
}

pub(super) async fn publish_file(args: PublishArgs) -> Result<()> {
    let text = if let Some(text) = super::local_host::forwarded_stdin().filter(|_| args.file == Path::new("-")) {
        text
    } else if args.file == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("reading standard input")?;
        text
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?
    };
    publish::check_topic(&args.topic)?;
    let sandbox = Sandbox::new(SandboxLimits::default())?;
    let module = load_module(&sandbox, &args.module)?;
    let log = args.data.log().await?;
    if let Some(partitions) = args.partitions {
        log.create_topic(&args.topic, partitions).await?;
    }
    let events = publish::parse_json_lines(&text, &*module)
        .with_context(|| format!("nothing was published from {}", args.file.display()))?;
    let lines = publish::event_lines(&text);
    let count = publish::publish(&log, &args.topic, module, events, Some(lines), available_threads())
        .await
        .with_context(|| format!("nothing was published from {}", args.file.display()))?;
    outln!("published {count} events to `{}`", args.topic)?;
    Ok(())
}

pub(super) fn load_module(sandbox: &Sandbox, path: &Path) -> Result<Arc<dyn HandlerModule>> {
    load_module_file(sandbox, path).with_context(|| format!("loading module {}", path.display()))
}
