//! `waku dev`: a guest rebuilt on every change and swapped into a running
//! local projection.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use super::signals::ShutdownSignals;
use crate::authoring::dev::{self, DevSettings};

#[derive(Args)]
pub(super) struct DevArgs {
    /// The guest's directory: a crate or a Python project.
    #[arg(default_value = ".")]
    crate_dir: PathBuf,
    /// The topic the projection consumes (created if missing).
    #[arg(long)]
    topic: String,
    /// Partitions of the topic, and of emit topics, when created.
    #[arg(long, default_value_t = 1)]
    partitions: u32,
    /// The projection's name (default: the module's).
    #[arg(long)]
    projection: Option<String>,
    /// Sample events (JSON lines, as `waku publish` reads them), published
    /// at start and again after each swap.
    #[arg(long)]
    events: Option<PathBuf>,
    /// Keep the log and state here (default: a temporary directory, removed
    /// at exit).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Cargo's target directory for the builds (a Rust guest's default:
    /// the one `waku build` shares between projects, $WAKU_TARGET_DIR or
    /// waku/target in the user's cache directory).
    #[arg(long)]
    target_dir: Option<PathBuf>,
    /// Serve the admin endpoint (state, status, modules) on this address,
    /// e.g. `127.0.0.1:9100`.
    #[arg(long, value_parser = super::admin_access::serve_address)]
    admin: Option<std::net::SocketAddr>,
    #[command(flatten)]
    admin_access: super::admin_access::AdminServeArgs,
}

pub(super) async fn dev(args: DevArgs) -> Result<()> {
    let signals = ShutdownSignals::install()?;
    let temp;
    // With --data the directory outlives the session: other commands may
    // run through it as through `waku run`.
    let serve_others = args.data.is_some();
    let data_dir = match args.data {
        Some(dir) => dir,
        None => {
            temp = tempfile::tempdir().context("creating a temporary directory")?;
            temp.path().to_owned()
        }
    };
    let data_dir_for_others = data_dir.clone();
    let target_dir = args.target_dir.or_else(|| crate::authoring::guest_build::default_target_dir(&args.crate_dir));
    let settings = DevSettings {
        guest_dir: args.crate_dir,
        topic: args.topic,
        partitions: args.partitions,
        projection: args.projection,
        data_dir,
        events: args.events,
        target_dir,
        admin: args.admin,
        admin_token: super::admin_access::token(args.admin_access.admin_token_file.as_deref())?,
        admin_read_token: args.admin_access.read_token()?,
        admin_insecure: args.admin_access.admin_insecure,
        admin_tls: args.admin_access.tls()?,
    };
    let started = move |host: &crate::operations::host::RunningHost<crate::storage::log::EmbeddedLog>| {
        if !serve_others {
            return None;
        }
        let (projection, store) = (host.projection().name().to_owned(), host.projection().store().clone());
        let log = (**host.log()).clone();
        let shared = super::local_host::Shared::new(&data_dir_for_others, &projection, Some(log), Some(store))
            .with_live_modules(host.library(), host.projection());
        super::local_host::serve_or_warn(shared, super::run_forwarded)
    };
    dev::run_with(settings, |event| errln!("waku dev: {event}"), signals.first(), started).await?;
    Ok(())
}
