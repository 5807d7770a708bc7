//! The `waku` command line. It parses flags, calls the library, and turns
//! errors into messages a person can act on.
//!
//! Exit codes (stable): 0 success, including `run` stopped by SIGINT or
//! SIGTERM after committing the batch in flight, and a command whose
//! standard output was closed by its reader (`waku dlq list | head`); 1 an
//! error (printed as `waku: error: …` with its causes); 2 a usage error
//! (from the argument parser, or a bad setting from the environment or the
//! config file); 3 a check failed: the demo's oracle check (even when its
//! report could not be printed) or `waku test --expect` found a difference;
//! 130 `run` aborted by a second signal
//! (as after a crash, nothing committed is lost).
//!
//! Output: results go to standard output through `outln!`, which returns
//! write errors instead of panicking as `println!` does; a closed pipe ends
//! the command quietly with exit 0 (as a Unix tool killed by SIGPIPE would,
//! but through an error, as ripgrep does). SIGPIPE itself stays ignored, as
//! Rust sets it: a `run` must not die because the admin endpoint's client or
//! the Iggy server closed a socket, and it writes to standard output only its
//! final summary, so a closed pipe never stops it before its work is
//! committed. Messages go to standard error through `errln!`, which
//! ignores write errors: nobody reading them is no reason to stop. Log
//! lines are coloured only when standard error is a terminal and `NO_COLOR`
//! is unset or empty (<https://no-color.org>).
//!
//! Text a module chose never reaches the terminal raw
//! ([`wakuwaku_core::terminal`]): every `errln!` message (each error and
//! cause, a trap reason with the guest's standard error in it) and every
//! field of every log line is written through `printable`, so one message
//! is one line and holds no control or invisible character; every
//! `--output json` result is written through [`json_text`]. Results in
//! text form escape the module's parts where they are put together.
//!
//! Every limit is a flag of `run` and `demo`, one per field of
//! [`SandboxLimits`](crate::sandbox::runtime::SandboxLimits) (what the engine
//! enforces) and of [`PayloadLimits`](crate::sandbox::handler::PayloadLimits) (what
//! the consumer's key scopes enforce), defaulting to the library's values.
//! So is the retry policy ([`RetryPolicy`](crate::engine::routing::RetryPolicy)): `--max-attempts`,
//! `--retry-delays`, `--transient-retries`, `--transient-backoff`.
//!
//! Data directory layout (`--data`, default `waku-data`):
//! `log.redb` is the embedded log (with `retry_<topic>` and `dlq_<topic>`
//! beside each consumed topic); `projections/<name>.redb` is a projection's
//! state, consumer positions, counts and retry bookkeeping;
//! `backups/<projection>-<time>/` is the state a `waku reset --to earliest`
//! cleared. Only `publish`, `topic create`, `run` and `dev` create any of
//! it; every other command looks before it opens, refuses a data
//! directory, projection or topic that is not there, listing those that
//! are, and creates nothing (`existing`).
//!
//! Settings: every setting of `run` can also come from `WAKU_<FLAG>` or
//! `waku.toml`, flag > environment > file > default (`config`). Log lines:
//! `--log-level`, else `RUST_LOG`, else
//! `warn,waku::guest=info,waku::reload=info,iggy::tcp=off`, so the
//! modules' own lines show from info up. `--output json` gives the results
//! of `status`, `dlq list|show`, `modules list` and `state get` a stable
//! JSON shape (README, "JSON output").
//!
//! Layout: one file per command (`new`, `build`, `test`, `dev`, `publish`,
//! `run`, `topic`, `state`, `status`, `modules`, `dlq`, `reset`, `rebuild`,
//! `demo`), the arguments they share in `args`, what a command must
//! find before it opens anything in `existing`, settings from the
//! environment and the file in `config`, signal handling in
//! `signals`. `run` and `demo` start their
//! host with [`crate::operations::host::Host`].
//!
//! Files besides the commands: `admin_access` holds the admin endpoint's
//! token (what `run` protects it with, what `status` and `state` send);
//! `local_host` finds the running host that owns an embedded data
//! directory, for the other commands to run through it; `demo_inventory`
//! is `waku demo inventory`, `demo_nexmark` `waku demo nexmark`.

use std::io::{ErrorKind, IsTerminal};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// `println!` for a command's results, returning the write error instead of
/// panicking, so that `?` ends the command; `report` ends a closed pipe
/// quietly.
macro_rules! outln {
    ($($arg:tt)*) => {
        {
            $crate::cli::local_host::write_out(format_args!("{}\n", format_args!($($arg)*))).map_err($crate::cli::StdoutError)
        }
    };
}

/// [`outln!`] without the line end, for a result written in pieces.
macro_rules! out {
    ($($arg:tt)*) => {
        {
            $crate::cli::local_host::write_out(format_args!($($arg)*)).map_err($crate::cli::StdoutError)
        }
    };
}

/// `eprintln!` for messages, ignoring write errors: when nobody reads
/// standard error any more the command still does its work.
/// The message is one line: every hidden character in it, a line break
/// included, is escaped ([`wakuwaku_core::terminal::printable`]).
macro_rules! errln {
    ($($arg:tt)*) => {{
        let message = format!($($arg)*);
        $crate::cli::local_host::write_err(&wakuwaku_core::terminal::printable(&message));
    }};
}

/// A command's result could not be written to standard output.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to standard output")]
struct StdoutError(#[source] std::io::Error);

impl StdoutError {
    /// Whether the reader closed its end (`| head`): the command ends
    /// quietly with exit 0.
    fn reader_gone(&self) -> bool {
        self.0.kind() == ErrorKind::BrokenPipe
    }
}

mod admin_access;
mod args;
mod build;
mod config;
mod demo;
mod demo_inventory;
mod demo_nexmark;
mod dev;
mod dlq;
mod existing;
mod local_host;
mod modules;
mod new;
mod publish;
mod rebuild;
mod reset;
mod run;
mod signals;
mod state;
mod status;
mod test;
mod topic;

use build::BuildArgs;
use demo::DemoArgs;
use dev::DevArgs;
use dlq::DlqCommand;
use modules::ModulesCommand;
use new::NewArgs;
use publish::PublishArgs;
use rebuild::RebuildArgs;
use reset::ResetArgs;
use run::RunArgs;
use state::StateCommand;
use status::StatusArgs;
use test::TestArgs;
use topic::TopicCommand;

#[derive(Parser)]
#[command(name = "waku", version, about, propagate_version = true, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Read settings from this file instead of `waku.toml` in the working
    /// directory (also `WAKU_CONFIG`). Keys are `run`'s flags without their
    /// dashes; precedence: flag > environment (`WAKU_<FLAG>`) > file >
    /// default. See `waku run --print-config`.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Which log lines to show on standard error: a level (`error`, `warn`,
    /// `info`, `debug`, `trace`) or `tracing` directives
    /// (`warn,waku::guest=debug`). Default: `RUST_LOG` if set, else
    /// `warn,waku::guest=info,waku::reload=info,iggy::tcp=off` (the host's
    /// warnings, and the modules' log lines from info up, marked with
    /// module and key, and each module a hot reload swapped in; not the Iggy
    /// client's own line per failed dial, as the host says each outage).
    #[arg(long, global = true, value_name = "FILTER")]
    log_level: Option<String>,
}

#[derive(Subcommand)]
// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Create a handler project (Rust, Python, TypeScript or JavaScript) with one event type, a
    /// unit test, sample events and a copy of the guest SDK, in a new
    /// directory anywhere.
    #[command(after_help = "Example:\n  waku new visits && cd visits && cargo test && waku build . --out visits.wasm")]
    New(NewArgs),
    /// Build a guest into a handler component: a Rust crate (cargo,
    /// wasm32-wasip2), a Python project (pyproject.toml; componentize-py) or a
    /// TypeScript/JavaScript project (package.json; esbuild, componentize-js).
    #[command(after_help = "Example:\n  waku build examples/bank --out modules/bank.wasm")]
    Build(BuildArgs),
    /// Run a built component on sample events through the real host path,
    /// in a throwaway store, and print per key its state, log lines and
    /// failures, the counters and the emitted messages.
    #[command(
        after_help = "Example:\n  waku test visits.wasm events.jsonl --expect expected.json   # --update writes it"
    )]
    Test(TestArgs),
    /// Watch a guest's sources, rebuild on change and swap each new build
    /// into a running local projection (a failed build keeps the previous
    /// version running); shows the module's log lines.
    #[command(after_help = "Example:\n  waku dev visits --topic visits --events visits/events.jsonl")]
    Dev(DevArgs),
    /// Publish JSON lines to a topic, with headers from the module.
    #[command(after_help = "Example:\n  waku publish --data waku-data --topic accounts --partitions 4 --module \
                            modules/bank.wasm events.jsonl")]
    Publish(PublishArgs),
    /// Consume a topic into a projection.
    #[command(after_help = RUN_HELP)]
    Run(RunArgs),
    /// Create, list, describe and consume the log's topics (the ones
    /// modules emit to among them).
    #[command(subcommand, after_help = "Example:\n  waku topic consume --data waku-data --topic orders --from 0")]
    Topic(TopicCommand),
    /// Read a projection's state.
    #[command(subcommand, after_help = "Example:\n  waku state get --data waku-data --projection bank --key 42")]
    State(StateCommand),
    /// List, inspect and re-drive a projection's dead letters.
    #[command(subcommand, after_help = "Example:\n  waku dlq list --data waku-data --projection bank --topic accounts")]
    Dlq(DlqCommand),
    /// Move a stopped projection's positions in its topic (latest,
    /// offset:N, time:RFC3339; state kept), or start it over (earliest:
    /// state cleared, old state kept as a backup). Says what will happen
    /// and asks: --yes, or a question on a terminal.
    #[command(after_help = RESET_HELP)]
    Reset(ResetArgs),
    /// Show a projection's module versions, or roll one back.
    #[command(subcommand, after_help = "Example:\n  waku modules list --data waku-data --projection bank")]
    Modules(ModulesCommand),
    /// Rebuild a projection in the shadow with new module versions while
    /// `waku run` keeps serving it, then promote it (automatically once
    /// caught up, or with `--promote`); `--rollback` goes back.
    #[command(after_help = REBUILD_HELP)]
    Rebuild(RebuildArgs),
    /// Where a projection stands: per partition position, end, lag; module
    /// versions; counts of applied, skipped, retrying, dead-lettered events.
    #[command(after_help = "Example:\n  waku status --data waku-data --projection bank --topic accounts --output json")]
    Status(StatusArgs),
    /// Build the bank example, publish a seeded workload, consume it, and
    /// check the read model against an oracle.
    #[command(after_help = "Example:\n  waku demo --events 100000 --accounts 1000 --partitions 2")]
    Demo(DemoArgs),
}

/// `waku run --help`'s epilogue: an example and where else settings come
/// from.
const RUN_HELP: &str = "Example:\n  waku run --data waku-data --projection bank --topic accounts --modules modules \
                        --until-caught-up\n\nEvery setting can also come from the environment, as WAKU_<FLAG> \
                        (WAKU_BATCH_SIZE, WAKU_IGGY), or from waku.toml in the working directory (or --config \
                        <FILE>), as `<flag> = <value>` (batch-size = 512). Precedence: flag > environment > file > \
                        default; --print-config shows the effective settings and where each came from.";

/// `waku rebuild --help`'s epilogue.
const REBUILD_HELP: &str = "Example:\n  waku rebuild --data waku-data --projection bank --topic accounts --modules \
                            new-modules\n\nA projection over several topics names every one, in the order `waku run` \
                            takes them:\n  waku rebuild --projection stock --topic orders --topic shipments --modules \
                            new-modules\n\nTo compare before promoting (--data defaults to waku-data):\n  waku \
                            rebuild --projection bank --topic accounts --modules new-modules --promote manual\n  waku \
                            state get --projection bank --key 42 --shadow\n  waku rebuild --projection bank \
                            --promote\n\nTo go back to the state and versions before the last promotion:\n  waku \
                            rebuild --projection bank --rollback\n\nThe running `waku run` of the projection does the \
                            work; `waku status --admin <endpoint>` shows the rebuild's phase and distance to promotion. \
                            Emitted messages: see docs/rebuild-reset.md, \"Rebuilding a projection\".";

/// `waku reset --help`'s epilogue.
const RESET_HELP: &str = "Example:\n  waku reset --data waku-data --projection bank --topic accounts --to earliest \
                          --yes\n\nOther targets: --to latest, --to offset:1200 --partitions 0,2, --to \
                          time:2026-11-30T12:00:00Z. The projection must be stopped: a running `waku run` of it \
                          holds its state, and the reset is refused.";

/// The exit codes, for `waku --help`.
const EXIT_CODES: &str = "Exit codes: 0 success (also when standard output is closed early, as by `| head`), 1 \
                          error, 2 usage error (also a bad setting in the environment or waku.toml), 3 a check \
                          failed (the demo's oracle check, or a difference found by `waku test --expect`), 130 \
                          `run` aborted by a second signal.";

/// Runs the command line and returns the process's exit code. Components
/// are compiled by this program itself, in child processes under the
/// compile limits ([`crate::sandbox::runtime::compiler`]), which run its hidden
/// `compile-component` command.
pub fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().collect();
    if args.get(1).is_some_and(|command| command == crate::sandbox::runtime::compiler::CHILD_COMMAND) {
        return crate::sandbox::runtime::compiler::child_main(&args[2..]);
    }
    // On Linux `/proc/self/exe` is this very binary even after an upgrade
    // replaced the file: its artifacts fit this host's engine.
    let this_binary = Path::new("/proc/self/exe");
    let program = if this_binary.exists() { Ok(this_binary.to_owned()) } else { std::env::current_exe() };
    match program {
        Ok(program) => crate::sandbox::runtime::compile_in_child_processes(program),
        Err(error) => errln!("waku: warning: compiling in this process, without the compile limits: {error}"),
    }
    main_with(args)
}

/// Runs the command line `args` (the first is the program's name), as
/// the `waku` binary would; for benchmarks that time a command in-process.
pub fn main_with(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    let environment = |name: &str| std::env::var_os(name);
    let args: Vec<_> = args.into_iter().collect();
    let layered = match config::parse(args.clone(), &environment, Path::new(config::DEFAULT_FILE)) {
        Ok(layered) => layered,
        Err(config::Failure::Clap(error)) if error.use_stderr() => {
            usage_error(&error);
            if error.kind() == clap::error::ErrorKind::MissingRequiredArgument && config::takes_settings(&args) {
                errln!(
                    "tip: a setting can also come from the environment (WAKU_<FLAG>) or waku.toml (see `waku help \
                     run`)"
                );
            }
            return ExitCode::from(2);
        }
        Err(config::Failure::Clap(error)) => error.exit(),
        Err(config::Failure::Config(error)) => return report_with(&anyhow::Error::new(error), ExitCode::from(2)),
    };
    for warning in config::secrets_on_the_command_line(&layered.settings) {
        errln!("waku: {warning}");
    }
    let filter = match log_filter(layered.cli.log_level.as_deref(), std::env::var("RUST_LOG").ok().as_deref()) {
        Ok(filter) => filter,
        Err(error) => return report_with(&error, ExitCode::from(2)),
    };
    if let Some(code) = through_running_host(&layered) {
        return code;
    }
    // A second command in one process keeps the first one's subscriber.
    let colours = log_colours(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    // `waku test` keeps the module's log lines for its outcome (a bounded
    // number of them), so they are not echoed on standard error as well.
    let testing = matches!(layered.cli.command, Command::Test(_));
    let echoed = tracing_subscriber::filter::filter_fn(move |metadata| {
        !(testing && metadata.target() == crate::authoring::trial::GUEST_LOG_TARGET)
    });
    let lines = tracing_subscriber::fmt::layer()
        .fmt_fields(printable_fields())
        .with_writer(std::io::stderr)
        .with_ansi(colours)
        .with_filter(filter)
        .with_filter(echoed);
    let capture = testing.then(crate::authoring::trial::GuestLogCapture::layer);
    let _ = tracing_subscriber::registry().with(lines).with(capture).try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return report(&anyhow::Error::new(error).context("starting the async runtime")),
    };
    let code = match runtime.block_on(dispatch(layered.cli.command, &layered.settings)) {
        Ok(code) => code,
        Err(error) => report(&error),
    };
    // The command is done; a hot reload still compiling on a blocking
    // thread must not keep the process alive (or stop a second signal from
    // ending it). Cutting it off is what a crash would do, which loses
    // nothing.
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    code
}

/// Prints clap's usage error as every error is printed, `waku: error: …`
/// (clap writes `error: …`), each line through `errln!`.
fn usage_error(error: &clap::Error) {
    let text = error.render().to_string();
    for (number, line) in text.trim_end().lines().enumerate() {
        match (number, line.strip_prefix("error: ")) {
            (0, Some(rest)) => errln!("waku: error: {rest}"),
            _ => errln!("{line}"),
        }
    }
}

/// Runs the command through the host running on its data directory, if
/// it is one a running host serves and one runs ([`local_host`]): its exit
/// code; `None` when the command opens the files itself.
fn through_running_host(layered: &config::Layered) -> Option<ExitCode> {
    let data = served(&layered.cli.command, config::from_flag(&layered.settings, "admin"))?;
    let flags = layered.settings.iter().filter(|setting| setting.source == config::Source::Flag);
    let flags = flags.map(|setting| setting.name.clone()).collect();
    match local_host::forward(data, &layered.argv, flags, &FORWARD_LEAVES_OUT) {
        Ok(None) => None,
        Ok(Some(code)) => Some(ExitCode::from(code)),
        Err(error) => Some(report(&error)),
    }
}

/// The settings a forwarded command goes without: the host it runs in is
/// the one `--admin` would ask (given as a flag, the command asks it).
const FORWARD_LEAVES_OUT: [&str; 3] = ["admin", "admin-token-file", "admin-ca-file"];

/// The data directory of a command a running host runs for others; `None`
/// for the other commands (and for `status` and `state` told to ask an
/// admin endpoint with `--admin`).
fn served(command: &Command, admin_flag: bool) -> Option<&Path> {
    let data = match command {
        Command::Publish(args) => &args.data,
        Command::Topic(command) => command.data(),
        Command::State(StateCommand::Get(args)) if !admin_flag => &args.data,
        Command::State(StateCommand::Counters(args)) if !admin_flag => &args.data,
        Command::Dlq(command) => command.data(),
        Command::Modules(command) => command.data()?,
        Command::Status(args) if !admin_flag => &args.target.data,
        Command::Rebuild(args) => &args.data,
        _ => return None,
    };
    Some(&data.data)
}

/// Runs a command another process sent to this host ([`local_host`]):
/// parsed as that process parsed it, and only one of those [`served`].
fn run_forwarded(argv: Vec<String>, flags: Vec<String>) -> local_host::Running {
    Box::pin(async move {
        let cli = match Cli::try_parse_from(&argv) {
            Ok(cli) => cli,
            Err(error) => {
                errln!("waku: error: the running host cannot read the command: {}", error.kind());
                return 2;
            }
        };
        if served(&cli.command, false).is_none() {
            errln!("waku: error: the running host runs only publish, topic, state, dlq, modules, status and rebuild");
            return 2;
        }
        let settings: Vec<config::Setting> = flags.into_iter().map(config::Setting::flag).collect();
        match dispatch(cli.command, &settings).await {
            Ok(_) => 0,
            Err(error) if stdout_closed(&error) => 0,
            Err(error) => {
                report(&error);
                1
            }
        }
    })
}

/// How long the end of a command waits for blocking work nobody awaits.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// Whether log lines get colours: only on a terminal, and not when
/// `NO_COLOR` is set to anything but the empty string
/// (<https://no-color.org>).
fn log_colours(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

/// The default log filter: the host's warnings, the modules' log lines
/// from info up, and the hot reloads that took ([`crate::operations::lifecycle::RELOAD_LOG_TARGET`]).
/// Not the Iggy client's connection errors: it logs one per dial and per
/// broken call, and the host says each outage itself, once, with what it
/// was doing.
const DEFAULT_LOG_FILTER: &str = "warn,waku::guest=info,waku::reload=info,iggy::tcp=off";

/// The log filter: `--log-level`, else `RUST_LOG`, else
/// [`DEFAULT_LOG_FILTER`]; a bad `--log-level` is an error, a bad
/// `RUST_LOG` too (it would otherwise hide what the person asked to see).
fn log_filter(flag: Option<&str>, rust_log: Option<&str>) -> Result<tracing_subscriber::EnvFilter> {
    let (directives, source) = match (flag, rust_log) {
        (Some(flag), _) => (flag, "--log-level"),
        (None, Some(variable)) if !variable.trim().is_empty() => (variable, "RUST_LOG"),
        _ => (DEFAULT_LOG_FILTER, "the default"),
    };
    tracing_subscriber::EnvFilter::builder()
        .parse(directives)
        .with_context(|| format!("bad log filter `{directives}` from {source}"))
}

/// Prints `error` with its causes and returns exit code 1; nothing, and 0,
/// when standard output was closed by its reader.
fn report(error: &anyhow::Error) -> ExitCode {
    report_with(error, ExitCode::from(1))
}

/// Prints `error` with its causes and returns `code`; nothing, and 0, when
/// standard output was closed by its reader.
fn report_with(error: &anyhow::Error, code: ExitCode) -> ExitCode {
    if stdout_closed(error) {
        return ExitCode::SUCCESS;
    }
    errln!("waku: error: {error}");
    for cause in error.chain().skip(1) {
        errln!("  caused by: {cause}");
    }
    if let Some(holder) = holder_of_embedded_log(error) {
        errln!("  held by: {holder}");
    }
    code
}

/// Which process holds the embedded log `error` found in use, as the
/// address file of its data directory names it.
fn holder_of_embedded_log(error: &anyhow::Error) -> Option<String> {
    let path = error.chain().find_map(|cause| match cause.downcast_ref::<crate::storage::log::LogError>() {
        Some(crate::storage::log::LogError::InUse { path }) => Some(path),
        _ => None,
    })?;
    let data = path.parent()?;
    let pid = local_host::running_pid(data)?;
    Some(format!("process {pid} (named in {})", data.join(local_host::ADDRESS_FILE).display()))
}

/// Whether `error` is a write to a standard output whose reader is gone; a
/// broken pipe anywhere else (a socket to the log) is a real error.
fn stdout_closed(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| cause.downcast_ref::<StdoutError>().is_some_and(StdoutError::reader_gone))
}

async fn dispatch(command: Command, settings: &[config::Setting]) -> Result<ExitCode> {
    match command {
        Command::Run(args) if args.print_config => {
            outln!("{}", config::render(settings))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::New(args) => new::new_project(args).map(|()| ExitCode::SUCCESS),
        Command::Build(args) => build::build(args).map(|()| ExitCode::SUCCESS),
        Command::Test(args) => test::test_module(args).await,
        Command::Dev(args) => dev::dev(args).await.map(|()| ExitCode::SUCCESS),
        Command::Publish(args) => publish::publish_file(args).await.map(|()| ExitCode::SUCCESS),
        Command::Run(args) => run::run(args, settings).await.map(|()| ExitCode::SUCCESS),
        Command::State(StateCommand::Get(args)) => state::state_get(args).map(|()| ExitCode::SUCCESS),
        Command::State(StateCommand::Counters(args)) => state::state_counters(args).map(|()| ExitCode::SUCCESS),
        Command::Dlq(command) => dlq::dlq(command).await.map(|()| ExitCode::SUCCESS),
        Command::Topic(command) => topic::topic(command).await.map(|()| ExitCode::SUCCESS),
        Command::Reset(args) => reset::reset(args).await.map(|()| ExitCode::SUCCESS),
        Command::Modules(command) => modules::modules(command).await.map(|()| ExitCode::SUCCESS),
        Command::Rebuild(args) => rebuild::rebuild(args, settings).await.map(|()| ExitCode::SUCCESS),
        Command::Status(args) => {
            status::status(args, config::from_flag(settings, "admin")).await.map(|()| ExitCode::SUCCESS)
        }
        Command::Demo(args) => demo::run_demo(args).await,
    }
}

/// How log lines write their message and fields: as the default format
/// does (`message key=value ...`), each through
/// [`wakuwaku_core::terminal::printable`], so no log line, whoever wrote
/// its fields (a module's log line, a key, a refused module's error), can
/// hold a control or invisible character or break into two lines.
fn printable_fields() -> impl for<'writer> tracing_subscriber::fmt::FormatFields<'writer> + 'static {
    use tracing_subscriber::field::MakeExt as _;
    tracing_subscriber::fmt::format::debug_fn(|writer, field, value| {
        let text = match field.name() {
            "message" => format!("{value:?}"),
            name => format!("{name}={value:?}"),
        };
        write!(writer, "{}", wakuwaku_core::terminal::printable(&text))
    })
    .delimited(" ")
}

/// `value` as JSON text for `--output json` and for people (`pretty`),
/// with every hidden character in it written as a JSON escape
/// ([`wakuwaku_core::terminal::json_escaped`]): the names and values in it
/// may be a module's.
fn json_text(value: &impl serde::Serialize, pretty: bool) -> Result<String> {
    let text = match pretty {
        true => serde_json::to_string_pretty(value)?,
        false => serde_json::to_string(value)?,
    };
    Ok(wakuwaku_core::terminal::json_escaped(&text).into_owned())
}

fn available_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_are_coloured_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(log_colours(true, None));
        assert!(log_colours(true, Some(OsStr::new(""))), "an empty NO_COLOR does not count");
        assert!(!log_colours(true, Some(OsStr::new("1"))));
        assert!(!log_colours(false, None));
        assert!(!log_colours(false, Some(OsStr::new(""))));
    }

    #[test]
    fn only_a_closed_standard_output_ends_a_command_quietly() {
        let closed = anyhow::Error::new(StdoutError(ErrorKind::BrokenPipe.into())).context("listing");
        assert!(stdout_closed(&closed));
        assert_eq!(report(&closed), ExitCode::SUCCESS);
        let full = anyhow::Error::new(StdoutError(std::io::Error::other("disk full")));
        assert!(!stdout_closed(&full));
        // A broken pipe elsewhere (a socket to the log) is an error.
        let socket = anyhow::Error::new(std::io::Error::from(ErrorKind::BrokenPipe));
        assert!(!stdout_closed(&socket));
    }

    #[test]
    fn every_command_has_an_example_in_its_help() {
        use clap::CommandFactory;
        fn walk(command: &mut clap::Command, path: &str, checked: &mut Vec<String>) {
            for sub in command.get_subcommands_mut().filter(|sub| sub.get_name() != "help") {
                let path = format!("{path} {}", sub.get_name());
                let help = sub.render_long_help().to_string();
                let example = help.split_once("Example:\n").map(|(_, rest)| rest.lines().next().unwrap_or_default());
                let example = example.unwrap_or_else(|| panic!("`{path} --help` has no example:\n{help}"));
                assert!(example.trim_start().starts_with(&format!("{path} ")), "`{path} --help`: {example}");
                checked.push(path.clone());
                walk(sub, &path, checked);
            }
        }
        let mut checked = Vec::new();
        walk(&mut Cli::command(), "waku", &mut checked);
        for command in [
            "waku run",
            "waku state get",
            "waku dlq show",
            "waku modules rollback",
            "waku demo",
            "waku new",
            "waku test",
            "waku dev",
            "waku rebuild",
            "waku reset",
        ] {
            assert!(checked.iter().any(|c| c == command), "{command} was not checked: {checked:?}");
        }
    }

    #[test]
    fn every_example_of_rebuild_help_parses() {
        use clap::Parser;
        let examples: Vec<&str> = REBUILD_HELP.lines().filter_map(|line| line.strip_prefix("  waku ")).collect();
        assert_eq!(examples.len(), 6, "{REBUILD_HELP}");
        for example in examples {
            let args = std::iter::once("waku").chain(example.split_whitespace());
            if let Err(error) = Cli::try_parse_from(args) {
                panic!("`waku {example}` does not parse: {error}");
            }
        }
    }

    #[test]
    fn every_subcommand_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
