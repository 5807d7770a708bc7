//! `waku rebuild`: ask the running host to rebuild a projection in the
//! shadow with new module versions, to promote a shadow waiting for a
//! person, or to roll back to the state before the last promotion. The
//! host does the work ([`crate::operations::rebuild`]); this command only leaves the
//! request in the data directory and says how to follow it. A projection
//! over several topics is rebuilt over all of them: the request names
//! every topic, in the order `waku run` takes them, and one naming others
//! than its host last started with is refused. A rebuild from offset 0 of
//! a topic whose oldest messages retention deleted is refused unless
//! `--accept-lost-history` ([`crate::storage::log::loss`]).

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

use super::args::DataArgs;
use super::config::Setting;
use crate::operations::rebuild::{Promote, RebuildError, RebuildPaths};

/// `--promote`'s value: a mode with `--modules`, alone the go-ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum PromoteArg {
    /// Promote as soon as the shadow caught up (the default).
    Auto,
    /// Wait for `waku rebuild --promote`.
    Manual,
    /// The go-ahead for a shadow waiting for it (bare `--promote`).
    Now,
}

#[derive(Args)]
pub(super) struct RebuildArgs {
    #[command(flatten)]
    pub(super) data: DataArgs,
    /// The projection.
    #[arg(long)]
    pub(super) projection: String,
    /// The topic it consumes (with --modules): every topic of a projection
    /// over several, as `waku run` takes them (the flag given more than
    /// once, a comma-separated list, or a list in `waku.toml`), in the same
    /// order.
    #[arg(long = "topic", value_name = "TOPIC", value_delimiter = ',')]
    pub(super) topics: Vec<String>,
    /// The directory of the new module versions (`*.wasm`, named like the
    /// running ones); copied when the rebuild is asked for. From the
    /// environment or `waku.toml`, it asks for a rebuild only when neither
    /// a bare `--promote` nor `--rollback` says otherwise.
    #[arg(long, conflicts_with = "rollback")]
    pub(super) modules: Option<PathBuf>,
    /// With --modules: promote `auto` (as soon as the shadow caught up,
    /// the default) or `manual`. Alone: promote the shadow now waiting.
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "now", conflicts_with = "rollback")]
    pub(super) promote: Option<PromoteArg>,
    /// Go back to the state and module versions before the last promotion.
    #[arg(long)]
    pub(super) rollback: bool,
    /// With --modules: rebuild even though the log no longer holds the
    /// topic's oldest messages (retention deleted them), so the shadow lacks
    /// them. Without it such a rebuild is refused, after saying how many
    /// messages are gone. (The embedded log deletes none.)
    #[arg(long, requires = "modules")]
    pub(super) accept_lost_history: bool,
}

pub(super) async fn rebuild(mut args: RebuildArgs, settings: &[Setting]) -> Result<()> {
    // `--promote` alone is the go-ahead; the directory of a rebuild asked
    // for before, from the environment or the file, does not make it a new
    // request (a `--modules` flag with it is refused below).
    if args.promote == Some(PromoteArg::Now) && !super::config::from_flag(settings, "modules") {
        args.modules = None;
    }
    if args.data.state.is_some() {
        bail!(
            "rebuilding in the shadow needs the embedded state store; a projection kept in PostgreSQL (--state) \
             cannot be rebuilt yet: run the new modules under another projection name and switch readers instead"
        );
    }
    crate::storage::log::check_projection_name(&args.projection)?;
    super::existing::data_dir(&args.data.data)?;
    // A rebuild may be asked for before the projection first runs (the
    // next `waku run` builds it); a promotion or a rollback refused for a
    // name not there says which names are.
    let missing = super::existing::projection(&args.data.data, &args.projection).err().map(|m| m.to_string());
    let named = |error: RebuildError| match &missing {
        Some(missing) => anyhow::Error::new(error).context(missing.clone()),
        None => error.into(),
    };
    let paths = RebuildPaths::new(&args.data.data, &args.projection);
    let follow = format!(
        "follow it with `waku status --admin <the host's admin endpoint>` or in `waku run`'s log lines ({})",
        paths.dir().display()
    );
    match (&args.modules, args.promote, args.rollback) {
        (_, _, true) => {
            let previous = paths.ask_rollback().map_err(named)?;
            outln!("asked the running host of `{}` to roll back to {}; {follow}", args.projection, previous.display())?;
        }
        (Some(modules), promote, false) => {
            let promote = match promote {
                None | Some(PromoteArg::Auto) => Promote::Auto,
                Some(PromoteArg::Manual) => Promote::Manual,
                Some(PromoteArg::Now) => bail!("with --modules, --promote takes `auto` or `manual`"),
            };
            if args.topics.is_empty() {
                bail!(
                    "--modules asks for a rebuild of the topics the projection consumes: give --topic too (every \
                     topic of a projection over several)"
                );
            }
            // Only a log with retention loses its head; the embedded one is
            // held by the running host, and deletes nothing.
            if args.data.iggy.is_some() {
                let log = args.data.log().await?;
                for topic in &args.topics {
                    crate::storage::log::loss::refuse_lost_history(&log, topic, args.accept_lost_history).await?;
                }
            }
            if let Some(missing) = &missing {
                errln!("waku: note: {missing}; the next `waku run --projection {}` builds it", args.projection);
            }
            let request = paths.ask(&args.topics, modules, promote)?;
            let when = match promote {
                Promote::Auto => "it is promoted once it caught up with the live projection",
                Promote::Manual => {
                    "once it caught up, compare with `waku state get --shadow`, then `waku rebuild --promote`"
                }
            };
            outln!(
                "asked for rebuild {} of `{}` over `{}`: the running `waku run` builds it in the shadow from offset 0 \
                 (or the next one to start); {when}; {follow}",
                request.generation,
                args.projection,
                args.topics.join("`, `")
            )?;
        }
        (None, Some(PromoteArg::Now), false) => {
            let request = paths.ask_promotion().map_err(named)?;
            outln!(
                "asked the running host to promote rebuild {} of `{}`; {follow}",
                request.generation,
                args.projection
            )?;
        }
        (None, _, false) => bail!("give --modules (with --topic), --promote or --rollback"),
    }
    Ok(())
}
