//! `waku reset`: move a stopped projection's positions, or start it over
//! ([`crate::operations::reset`]). Says what will happen, then asks: `--yes`, or a
//! question on a terminal; without either it refuses.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{Result, bail};
use clap::Args;

use super::args::ProjectionArgs;
use crate::operations::host::HostError;
use crate::operations::reset::{self, Plan, Target};
use crate::storage::state::StateError;

#[derive(Args)]
pub(super) struct ResetArgs {
    #[command(flatten)]
    pub(super) target: ProjectionArgs,
    /// Where to: `earliest` (start over: state cleared, every event applied
    /// again), `latest` (skip what was not consumed yet), `offset:N` (that
    /// offset of each partition), or `time:RFC3339` (each partition's first
    /// record appended at or after that UTC time, e.g.
    /// `time:2026-11-30T12:00:00Z`).
    #[arg(long, value_parser = parse_target, value_name = "TARGET")]
    pub(super) to: Target,
    /// Only these partitions (comma-separated), e.g. `0,2`; not with
    /// `earliest`, which starts the whole projection over.
    #[arg(long, value_delimiter = ',')]
    pub(super) partitions: Option<Vec<u32>>,
    /// Do it without asking (needed when standard input is no terminal).
    #[arg(long)]
    pub(super) yes: bool,
    /// With `earliest`: keep no backup of the old state (by default it is
    /// copied to `<data>/backups/<projection>-<time>/` first).
    #[arg(long)]
    pub(super) no_backup: bool,
    /// With `earliest`: start over even though the log no longer holds the
    /// topic's oldest messages (retention deleted them), building a read
    /// model that lacks them. Without it such a reset is refused, after
    /// saying how many messages are gone.
    #[arg(long)]
    pub(super) accept_lost_history: bool,
}

/// `--to`'s parser: the library's, so the error names the value and the
/// forms accepted.
fn parse_target(value: &str) -> Result<Target, String> {
    value.parse().map_err(|e: reset::ResetError| e.to_string())
}

pub(super) async fn reset(args: ResetArgs) -> Result<()> {
    let ProjectionArgs { data, projection, topics } = &args.target;
    if data.state.is_none() {
        super::existing::projection(&data.data, projection)?;
    }
    // The state first: a running host holds it, and that is what to say.
    let store = data.state(projection).and_then(|store| {
        store.lock_for_reset().map_err(|source| HostError::State { projection: projection.clone(), source })?;
        Ok(store)
    });
    let store = match store {
        Err(HostError::State { source: StateError::InUse { store }, .. }) => {
            let holder =
                super::local_host::running_pid(&data.data).map_or(String::new(), |pid| format!(" by process {pid}"));
            bail!(
                "projection `{projection}` is in use{holder} ({store}): stop its `waku run` first; a reset works on \
                 a stopped projection"
            )
        }
        other => other?,
    };
    let log = data.existing_log("is `waku run` using it? stop it first").await?;
    for topic in topics.all() {
        super::existing::topic(&log, topic).await?;
    }
    super::existing::first_topic(&log, &store, projection, topics.first()).await?;
    let mut plans = Vec::with_capacity(topics.all().len());
    for topic in topics.all() {
        plans.push(reset::plan(&log, &store, topic, args.to, args.partitions.as_deref()).await?);
    }
    // One message per line: `errln!` shows a line break inside a message
    // as `\n`.
    for line in describe(&plans, projection).lines() {
        errln!("{line}");
    }
    for plan in &plans {
        plan.check_history(args.accept_lost_history)?;
    }
    if !args.yes && !confirmed()? {
        bail!("nothing was reset: standard input is no terminal to ask on; add --yes to reset without asking");
    }
    let backups = (!args.no_backup).then(|| data.data.join("backups"));
    let backup = reset::apply_all(&log, &store, projection, &plans, backups.as_deref()).await?;
    let several = plans.len() > 1;
    for plan in &plans {
        let topic = if several { format!("`{}` ", plan.topic) } else { String::new() };
        for step in &plan.moves {
            outln!("{topic}partition {}: position {} -> {}", step.partition, step.from, step.to)?;
        }
    }
    match (args.to, backup) {
        (Target::Earliest, Some(dir)) => outln!(
            "projection `{projection}` starts over; its old state is in {} (read it with `waku state get --data {} \
             --projection {projection} ...`)",
            dir.display(),
            dir.display()
        )?,
        (Target::Earliest, None) => outln!("projection `{projection}` starts over; no backup was kept (--no-backup)")?,
        (target, _) => outln!("projection `{projection}` moved to {target}; its state is unchanged")?,
    }
    Ok(())
}

/// What the reset will do, in plain words, one partition a line (named
/// with its topic when the projection consumes several); the retry and
/// dead-letter topics are the first topic's.
fn describe(plans: &[Plan], projection: &str) -> String {
    let Some(first) = plans.first() else { return String::new() };
    let topic = &first.topic;
    let all = plans.iter().map(|plan| format!("`{}`", plan.topic)).collect::<Vec<_>>().join(", ");
    let mut text = match first.target {
        Target::Earliest => format!(
            "This starts projection `{projection}` over: its state, counters, statistics, retry bookkeeping and \
             pending messages are cleared, and every event of {all} is applied again (handlers emit their \
             messages again). Records waiting in `retry_{topic}` are skipped (their events are replayed); dead \
             letters so far stay in `dlq_{topic}` but count as re-driven."
        ),
        target => format!(
            "This moves projection `{projection}` to {target} in {all} and keeps its state: events skipped will \
             never be applied; events moved back over will be applied again on top of the state they already \
             changed."
        ),
    };
    let several = plans.len() > 1;
    for plan in plans {
        let topic = &plan.topic;
        if !plan.lost_history.is_empty() {
            text.push_str(&format!(
                "\nThe log no longer holds the oldest messages of `{topic}` ({}): the replay will lack them.",
                crate::storage::log::loss::describe_lost(&plan.lost_history)
            ));
        }
        let named = if several { format!("`{topic}` ") } else { String::new() };
        for step in &plan.moves {
            let what = match (step.skipped(), step.replayed()) {
                (0, 0) => "no change".to_owned(),
                (skipped, 0) => format!("{skipped} events will never be applied"),
                (_, replayed) => format!("{replayed} events will be applied again"),
            };
            text.push_str(&format!("\n  {named}partition {}: {} -> {}: {what}", step.partition, step.from, step.to));
        }
    }
    text
}

/// Asks on the terminal; `false` when standard input is none.
fn confirmed() -> Result<bool> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Ok(false);
    }
    eprint!("Reset? Type `yes` to go on: ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    if answer.trim() != "yes" {
        bail!("nothing was reset (the answer was not `yes`)");
    }
    Ok(true)
}
