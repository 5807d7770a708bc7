//! The TypeScript bank (`examples/bank-ts`) and windows
//! (`tests/guests/windows-ts`) as components, for the tests that run them
//! through the host.
//!
//! It is built with esbuild and componentize-js from the repository's npm
//! tools (`npm ci` at the root), found as `waku build` finds them. Without
//! them the tests print one `skipped: …` line each; under CI (`CI=true`),
//! which installs them, missing tools fail the test instead.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use wakuwaku::authoring::guest_build::js::find_js_tools;
use wakuwaku::sandbox::handler::HandlerModule;

use crate::ported_bank::{load_once, tool_available};
use crate::{guest_wasm, repo_root};

/// The TypeScript bank's project directory, relative to the repository.
pub const BANK_TS: &str = "examples/bank-ts";

/// The TypeScript windows (`wakuwaku_tests::click_windows`'s module), relative to the repository.
pub const WINDOWS_TS: &str = "tests/guests/windows-ts";

/// Whether the npm tools are there; if not, prints one line saying `what`
/// was skipped (or, under CI, panics).
pub fn js_tools_available(what: &str) -> bool {
    let needs = "componentize-js and esbuild (`npm ci` at the repository root)";
    tool_available(find_js_tools(&repo_root().join(BANK_TS)), what, needs, "the npm tools (.ci/run: npm ci)")
}

/// The TypeScript bank component (built once per process, and only when
/// its sources changed since the last build), or `None` after a
/// `skipped:` line.
pub fn bank_ts_wasm(what: &str) -> Option<PathBuf> {
    js_tools_available(what).then(|| guest_wasm(BANK_TS))
}

/// The TypeScript bank loaded into a default sandbox, once per process,
/// its compiled code kept in `target/guests/cache`.
pub fn bank_ts_module(what: &str) -> Option<Arc<dyn HandlerModule>> {
    static MODULE: OnceLock<Arc<dyn HandlerModule>> = OnceLock::new();
    Some(load_once(&MODULE, &bank_ts_wasm(what)?))
}

/// The TypeScript windows loaded into a default sandbox, once per process
/// (as [`bank_ts_module`]), or `None` after a `skipped:` line.
pub fn windows_ts_module(what: &str) -> Option<Arc<dyn HandlerModule>> {
    static MODULE: OnceLock<Arc<dyn HandlerModule>> = OnceLock::new();
    js_tools_available(what).then(|| load_once(&MODULE, &guest_wasm(WINDOWS_TS)))
}
