//! `waku status`: where a projection stands, from the files or from the
//! running host's admin endpoint.
//!
//! Rules kept here:
//! - **One status, three ways.** Asked of the admin endpoint (`--admin`),
//!   run inside the running host through its local socket, or read from
//!   the files with no host running, it is one [`admin::Status`] built by
//!   the same code ([`admin::status_of_topics`], and
//!   [`admin::running_status`] where a host runs) and printed here: per
//!   partition, and for a projection over several topics per topic of each
//!   partition, with the start-up end offsets and the release clocks a
//!   running host knows.
//! - The topics are taken as `run` takes them (`--topic` repeated,
//!   `WAKU_TOPIC`, a list in `waku.toml`).

use anyhow::{Context, Result, bail};
use clap::Args;

use super::admin_access::{self, AdminClientArgs};
use super::args::{OutputArgs, ProjectionArgs};
use crate::operations::admin;
use crate::operations::lifecycle::Library;
use crate::operations::rebuild::RebuildPaths;
use crate::operations::rebuild::conductor::{RebuildStatus, measure};
use crate::sandbox::runtime::{Sandbox, SandboxLimits};
use crate::storage::log::AnyLog;
use crate::storage::state::StateStore;

#[derive(Args)]
pub(super) struct StatusArgs {
    #[command(flatten)]
    pub(super) target: ProjectionArgs,
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

/// `waku status`; `admin_from_flag`: `--admin` was given on the command
/// line (else it came from the environment or `waku.toml`, and an
/// endpoint nobody listens on means no host runs: the files are read).
pub(super) async fn status(mut args: StatusArgs, admin_from_flag: bool) -> Result<()> {
    let asked = match &args.admin {
        Some(url) => match ask(url, &args) {
            Err(error) if !admin_from_flag && admin_access::unreachable(&error) => {
                errln!("waku: no host answers at the admin endpoint {url} (setting `admin`); reading the files");
                None
            }
            asked => Some(asked?),
        },
        None => None,
    };
    if asked.is_none() {
        args.admin = None;
    }
    let status = match asked {
        Some(status) => status,
        None => from_files(&args.target).await?,
    };
    if args.output.json() {
        outln!("{}", super::json_text(&status, false)?)?;
        return Ok(());
    }
    print_counts(&status)?;
    print_log_nodes(&status)?;
    print_event_time(&status)?;
    if args.admin.is_some() {
        outln!(
            "this host redid {} events since it started (processed, then refused by fencing: another host took \
             their partition)",
            status.redone
        )?;
    }
    if let Some(rebuild) = &status.rebuild {
        print_rebuild(rebuild)?;
    }
    print_partitions(&status)
}

/// The standing, the modules and the counts of events and messages.
fn print_counts(status: &admin::Status) -> Result<()> {
    let caught_up = status.partitions.iter().all(|p| p.caught_up);
    let stopped = status.partitions.iter().filter(|p| p.stopped).count();
    let standing = match (stopped, caught_up) {
        (0, true) => "caught up".to_owned(),
        (0, false) => "catching up".to_owned(),
        (stopped, _) => format!("{stopped} partitions stopped: the log lost offsets they applied (see below)"),
    };
    let topics: Vec<String> =
        std::iter::once(&status.topic).chain(&status.more_topics).map(|topic| format!("`{topic}`")).collect();
    let on = if topics.len() == 1 { "topic" } else { "topics" };
    outln!("projection `{}` on {on} {}: {standing}", status.projection, topics.join(", "))?;
    let modules: Vec<String> = status.modules.iter().map(|(name, version)| format!("{name}@{version}")).collect();
    outln!("modules: {}", if modules.is_empty() { "none".to_owned() } else { modules.join(", ") })?;
    let redriven = match status.redriven {
        0 => String::new(),
        redriven => format!(" ({redriven} of them re-driven since)"),
    };
    outln!(
        "events: {} applied, {} skipped, {} retrying, {} dead-lettered{redriven}",
        status.applied,
        status.skipped,
        status.retrying,
        status.dead_lettered
    )?;
    outln!(
        "emitted messages: {} undeliverable (dead-lettered); outbox: {} records not yet appended",
        status.undeliverable,
        status.outbox
    )?;
    if let Some(next) = status.next_timer_ms {
        outln!(
            "timers: {} pending, the next due at {next} ms (fired once the clock passes it)",
            status.timers_pending
        )?;
    }
    if status.order_violations > 0 || !status.more_topics.is_empty() {
        let also: Vec<String> = status.more_topics.iter().map(|topic| format!("`{topic}`")).collect();
        let also = if also.is_empty() { String::new() } else { format!("; also reads {}", also.join(", ")) };
        outln!(
            "event time: {} order violations (late events applied at once, out of event-time order){also}",
            status.order_violations,
        )?;
    }
    Ok(())
}

/// The log's cluster: each node, which leads, where this host is.
fn print_log_nodes(status: &admin::Status) -> Result<()> {
    let Some(cluster) = &status.log_nodes else { return Ok(()) };
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|node| {
            let role = if node.leader { "leader" } else { "follower" };
            format!("{} at {} ({role}, {})", node.name, node.address, node.status)
        })
        .collect();
    outln!("log: an Iggy cluster of {} nodes: {}", cluster.nodes.len(), nodes.join("; "))?;
    outln!("log: this host dialled {} and failed over {} times", cluster.connected, cluster.failovers)?;
    Ok(())
}

/// Each partition index's clock, held events and inputs (projections over
/// several topics).
fn print_event_time(status: &admin::Status) -> Result<()> {
    for timing in &status.event_time {
        let ms = |value: Option<i64>| value.map_or_else(|| "-".to_owned(), |value| value.to_string());
        let inputs: Vec<String> = timing
            .inputs
            .iter()
            .map(|input| {
                let state = match (input.idle, input.paused) {
                    (true, _) => "idle",
                    (false, true) => "paused",
                    (false, false) => "counting",
                };
                format!("{} at {} clock {} {state}", input.topic, input.position, ms(input.clock_ms))
            })
            .collect();
        outln!(
            "partition {}: clock {} ms, watermark lag {} ms, {} events ({} bytes) held; {}",
            timing.partition,
            ms(timing.clock_ms),
            ms(timing.watermark_lag_ms),
            timing.held_events,
            timing.held_bytes,
            inputs.join("; ")
        )?;
    }
    Ok(())
}

/// A rebuild in the shadow, running or asked for.
fn print_rebuild(rebuild: &RebuildStatus) -> Result<()> {
    let modules: Vec<String> = rebuild.modules.iter().map(|(name, version)| format!("{name}@{version}")).collect();
    outln!(
        "rebuild {} ({} promotion, modules {}): {}; {} events to promotion; {} emitted messages held back; {} \
         events dead-lettered",
        rebuild.generation,
        rebuild.promote,
        modules.join(", "),
        rebuild.phase,
        rebuild.distance,
        rebuild.held_back,
        rebuild.dead_lettered
    )?;
    if let Some(note) = &rebuild.note {
        outln!("rebuild: {note}")?;
    }
    if let Some(error) = &rebuild.error {
        outln!("rebuild error: {error}")?;
    }
    for (partition, shadow, live) in &rebuild.partitions {
        outln!("rebuild partition {partition}: shadow at {shadow}, live at {live}")?;
    }
    Ok(())
}

/// The table of partitions, and what the log no longer holds.
fn print_partitions(status: &admin::Status) -> Result<()> {
    outln!("partition\tfirst\tposition\tstart-up end\tend\tlag\tcaught up")?;
    for p in &status.partitions {
        let at_start = p.end_at_start.map_or_else(|| "-".to_owned(), |end| end.to_string());
        let caught_up = match (p.stopped, p.caught_up) {
            (true, _) => "stopped",
            (false, true) => "yes",
            (false, false) => "no",
        };
        outln!("{}\t{}\t{}\t{at_start}\t{}\t{}\t{caught_up}", p.partition, p.first, p.position, p.end, p.lag)?;
        // A projection over several topics: the sums above, then each topic.
        for each in &p.topics {
            outln!("  {}\t{}\t{}\t\t{}\t{}\t", each.topic, each.first, each.position, each.end, each.lag)?;
        }
    }
    for p in status.partitions.iter().filter(|p| p.first > 0) {
        outln!(
            "partition {}: the log no longer holds offsets 0..{} ({} messages deleted by retention)",
            p.partition,
            p.first,
            p.first
        )?;
    }
    for (p, truncated) in status.partitions.iter().filter_map(|p| Some((p, p.truncated.as_ref()?))) {
        outln!("partition {}: log truncated: {truncated}", p.partition)?;
    }
    Ok(())
}

/// The status from the log and the files, when no host answers.
async fn from_files(target: &ProjectionArgs) -> Result<admin::Status> {
    let hint = "is `waku run` using it? pass --admin <its admin endpoint>";
    let (log, store) = target.existing(hint).await?;
    if let Some((running, live)) = super::local_host::live_status(&target.data.data, &target.projection) {
        // Run by the host itself for another process: what `/status` says.
        return Ok(admin::running_status(&log, &running, &live).await?);
    }
    let library =
        Library::new(&target.data.data, &target.projection, store.clone(), Sandbox::new(SandboxLimits::default())?);
    let versions = library.recorded()?.active;
    let status = admin::status_of_topics(&log, &target.projection, target.topics.all(), &store, None, versions).await?;
    Ok(admin::Status { rebuild: pending_rebuild(&log, target, &store).await?, ..status })
}

/// The status the admin endpoint at `url` answers.
fn ask(url: &str, args: &StatusArgs) -> Result<admin::Status> {
    let url = format!("{}/status", url.trim_end_matches('/'));
    let token = admin_access::token(args.admin_access.admin_token_file.as_deref())?;
    let body = admin_access::get(&url, token.as_ref(), args.admin_access.admin_ca_file.as_deref())?;
    let status: admin::Status =
        serde_json::from_str(&body).with_context(|| format!("{url} answered something else than a status"))?;
    if status.projection != args.target.projection {
        bail!("{url} runs projection `{}`, not `{}`", status.projection, args.target.projection);
    }
    Ok(status)
}

/// A rebuild asked for but not running (no host, or the host that builds
/// it holds the files: then this is not reached), from its files.
async fn pending_rebuild(log: &AnyLog, target: &ProjectionArgs, live: &StateStore) -> Result<Option<RebuildStatus>> {
    let paths = RebuildPaths::new(&target.data.data, &target.projection);
    let Some(request) = paths.request()? else { return Ok(None) };
    let path = paths.absolute(&paths.shadow_store(request.generation));
    let sandbox = Sandbox::new(SandboxLimits::default())?;
    let mut status = match path.is_file() {
        true => {
            let shadow = StateStore::open(&path)?;
            let versions =
                Library::new(&target.data.data, &target.projection, shadow.clone(), sandbox).recorded()?.active;
            measure(log, &request, &shadow, live, versions).await?
        }
        false => RebuildStatus {
            generation: request.generation,
            promote: request.promote.name().to_owned(),
            ..RebuildStatus::default()
        },
    };
    status.phase = "asked for; the next `waku run` builds it".to_owned();
    Ok(Some(status))
}
