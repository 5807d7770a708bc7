//! The Python bank (`examples/bank-py`) as a component, for the tests that
//! run it through the host.
//!
//! It is built with componentize-py, found as `waku build` finds it
//! (`WAKU_COMPONENTIZE_PY`, the project's `.venv`, `PATH`). Without it the
//! tests print one `skipped: …` line each, as the Iggy tests do without a
//! server; under CI (`CI=true`), which installs it, a missing
//! componentize-py fails the test instead.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use wakuwaku::authoring::guest_build::python::{COMPONENTIZE_PY_ENV, find_componentize_py};
use wakuwaku::sandbox::handler::HandlerModule;
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};

use crate::{guest_wasm, repo_root};

/// The Python bank's project directory, relative to the repository.
pub const BANK_PY: &str = "examples/bank-py";

/// Whether componentize-py is there; if not, prints one line saying `what`
/// was skipped (or, under CI, panics).
pub fn componentize_py_available(what: &str) -> bool {
    let found = find_componentize_py(&repo_root().join(BANK_PY), std::env::var_os(COMPONENTIZE_PY_ENV));
    match found {
        Ok(_) => true,
        Err(error) if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
            panic!("{what}: CI installs componentize-py (.ci/run), but: {error}")
        }
        Err(_) => {
            // Straight to stderr, past the test harness's capture, so it shows.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "skipped: {what} needs componentize-py (pip install componentize-py==0.25.1 into a virtual \
                 environment, and set {COMPONENTIZE_PY_ENV} to it or put it on PATH)"
            );
            false
        }
    }
}

/// The Python bank component (built once per process, and only when its
/// sources changed since the last build), or `None` after a `skipped:`
/// line.
pub fn bank_py_wasm(what: &str) -> Option<PathBuf> {
    componentize_py_available(what).then(|| guest_wasm(BANK_PY))
}

/// The Python bank loaded into a default sandbox, once per process. The
/// sandbox keeps compiled components in `target/guests/cache`, so a test
/// run that finds the component unchanged skips the ~25 s compile.
pub fn bank_py_module(what: &str) -> Option<Arc<dyn HandlerModule>> {
    static MODULE: OnceLock<Arc<dyn HandlerModule>> = OnceLock::new();
    let wasm = bank_py_wasm(what)?;
    Some(
        MODULE
            .get_or_init(|| {
                let cache = repo_root().join("target").join("guests").join("cache");
                let sandbox =
                    Sandbox::new(SandboxLimits::default()).expect("a default sandbox").with_compile_cache(&cache);
                wakuwaku::engine::projection::load_module_file(&sandbox, &wasm).expect("the Python bank module loads")
            })
            .clone(),
    )
}
