//! `waku test`: a built component on sample events, compared with a
//! stored outcome.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Args;

use super::publish::load_module;
use crate::authoring::trial;
use crate::sandbox::runtime::{Sandbox, SandboxLimits};
use wakuwaku_core::terminal::printable;

/// How every WebAssembly binary begins.
const WASM_MAGIC: &[u8] = b"\0asm";

#[derive(Args)]
pub(super) struct TestArgs {
    /// The built component (`waku build`'s output).
    module: PathBuf,
    /// Sample events, JSON lines as `waku publish` reads them:
    /// `{"type": "<event type>", "body": {...}}` (or `"tag": N`). Several
    /// files are several topics of one projection, as `waku run --topic a
    /// --topic b`: a key's events of timed types are applied in event-time
    /// order across them (ties: the file's place in the list, then the
    /// line), the others as they are read.
    #[arg(required = true, num_args = 1..)]
    events: Vec<PathBuf>,
    /// Compare the outcome with this stored one (JSON) and exit 3 on a
    /// difference, printing each.
    #[arg(long)]
    expect: Option<PathBuf>,
    /// Write the outcome to the --expect file instead of comparing.
    #[arg(long, requires = "expect")]
    update: bool,
    /// Keep compiled modules here, so an unchanged component is not
    /// compiled again (default: `waku/compiled` in the user's cache
    /// directory, `$XDG_CACHE_HOME` or `~/.cache`).
    #[arg(long, value_name = "DIR", conflicts_with = "no_compile_cache")]
    compile_cache: Option<PathBuf>,
    /// Compile the component afresh, keeping nothing.
    #[arg(long)]
    no_compile_cache: bool,
}

/// The text of an events file; a component given in its place is named,
/// with the order the arguments go in.
fn read_events(path: &Path, module: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.starts_with(WASM_MAGIC) {
        bail!(
            "{} is a WebAssembly component, not sample events: the component comes first, `waku test {} {}`",
            path.display(),
            path.display(),
            module.display()
        );
    }
    String::from_utf8(bytes).with_context(|| format!("{} holds no text: sample events are JSON lines", path.display()))
}

/// Where `waku test` keeps compiled modules: the flag's directory, else
/// `waku/compiled` in the user's cache directory, else nowhere.
fn compile_cache(args: &TestArgs) -> Option<PathBuf> {
    if args.no_compile_cache {
        return None;
    }
    let environment = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty()).map(PathBuf::from);
    let user_cache = environment("XDG_CACHE_HOME").or_else(|| environment("HOME").map(|home| home.join(".cache")));
    args.compile_cache.clone().or_else(|| Some(user_cache?.join("waku").join("compiled")))
}

pub(super) async fn test_module(args: TestArgs) -> Result<ExitCode> {
    let mut files = Vec::with_capacity(args.events.len());
    for path in &args.events {
        files.push((read_events(path, &args.module)?, path.clone()));
    }
    let mut sandbox = Sandbox::new(SandboxLimits::default())?;
    if let Some(dir) = compile_cache(&args) {
        sandbox = sandbox.with_compile_cache(&dir);
    }
    let module = load_module(&sandbox, &args.module)?;
    let outcome = trial::run(module, &files).await?;
    outln!("{}", outcome.report())?;
    let Some(expect) = &args.expect else { return Ok(ExitCode::SUCCESS) };
    let found = outcome.to_json();
    if args.update {
        let text = super::json_text(&found, true)? + "\n";
        std::fs::write(expect, text).with_context(|| format!("writing {}", expect.display()))?;
        outln!("wrote the outcome to {}", expect.display())?;
        return Ok(ExitCode::SUCCESS);
    }
    let text = std::fs::read_to_string(expect)
        .with_context(|| format!("reading {} (write it with --update)", expect.display()))?;
    let expected: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", expect.display()))?;
    let differences = trial::differences(&expected, &found);
    if differences.is_empty() {
        outln!("as expected ({})", expect.display())?;
        return Ok(ExitCode::SUCCESS);
    }
    outln!("{} differences from {}:", differences.len(), expect.display())?;
    for line in &differences {
        outln!("  {}", printable(line))?;
    }
    Ok(ExitCode::from(3))
}
