//! The TypeScript bank (`examples/bank-ts`) as a component, for the tests
//! that run it through the host.
//!
//! It is built with esbuild and componentize-js from the repository's npm
//! tools (`npm ci` at the root), found as `waku build` finds them. Without
//! them the tests print one `skipped: …` line each; under CI (`CI=true`),
//! which installs them, missing tools fail the test instead.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use wakuwaku::authoring::guest_build::js::find_js_tools;
use wakuwaku::sandbox::handler::HandlerModule;
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};

use crate::{guest_wasm, repo_root};

/// The TypeScript bank's project directory, relative to the repository.
pub const BANK_TS: &str = "examples/bank-ts";

/// Whether the npm tools are there; if not, prints one line saying `what`
/// was skipped (or, under CI, panics).
pub fn js_tools_available(what: &str) -> bool {
    match find_js_tools(&repo_root().join(BANK_TS)) {
        Ok(_) => true,
        Err(error) if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
            panic!("{what}: CI installs the npm tools (.ci/run: npm ci), but: {error}")
        }
        Err(_) => {
            // Straight to stderr, past the test harness's capture, so it shows.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "skipped: {what} needs componentize-js and esbuild (`npm ci` at the repository root)"
            );
            false
        }
    }
}

/// The TypeScript bank component (built once per process, and only when
/// its sources changed since the last build), or `None` after a
/// `skipped:` line.
pub fn bank_ts_wasm(what: &str) -> Option<PathBuf> {
    js_tools_available(what).then(|| guest_wasm(BANK_TS))
}

/// The TypeScript bank loaded into a default sandbox, once per process,
/// its compiled code kept in `target/guests/cache` across runs.
pub fn bank_ts_module(what: &str) -> Option<Arc<dyn HandlerModule>> {
    static MODULE: OnceLock<Arc<dyn HandlerModule>> = OnceLock::new();
    let wasm = bank_ts_wasm(what)?;
    Some(
        MODULE
            .get_or_init(|| {
                let cache = repo_root().join("target").join("guests").join("cache");
                let sandbox =
                    Sandbox::new(SandboxLimits::default()).expect("a default sandbox").with_compile_cache(&cache);
                wakuwaku::engine::projection::load_module_file(&sandbox, &wasm).expect("the TypeScript bank loads")
            })
            .clone(),
    )
}
