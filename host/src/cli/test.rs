//! `waku test`: a built component on sample events, compared with a
//! stored outcome.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use super::publish::load_module;
use crate::runtime::{Sandbox, SandboxLimits};
use crate::trial;
use wakuwaku_core::terminal::printable;

#[derive(Args)]
pub(super) struct TestArgs {
    /// The built component (`waku build`'s output).
    module: PathBuf,
    /// Sample events, JSON lines as `waku publish` reads them:
    /// `{"type": "<event type>", "body": {...}}` (or `"tag": N`).
    events: PathBuf,
    /// Compare the outcome with this stored one (JSON) and exit 3 on a
    /// difference, printing each.
    #[arg(long)]
    expect: Option<PathBuf>,
    /// Write the outcome to the --expect file instead of comparing.
    #[arg(long, requires = "expect")]
    update: bool,
}

pub(super) async fn test_module(args: TestArgs) -> Result<ExitCode> {
    let events = std::fs::read_to_string(&args.events).with_context(|| format!("reading {}", args.events.display()))?;
    let sandbox = Sandbox::new(SandboxLimits::default())?;
    let module = load_module(&sandbox, &args.module)?;
    let outcome = trial::run(module, &events, &args.events).await?;
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
