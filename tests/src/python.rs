//! The Python bank (`examples/bank-py`) and the Python windows
//! (`tests/guests/windows-py`) as components, for the tests that run them
//! through the host.
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

use crate::ported_bank::{load_once, tool_available};
use crate::{guest_wasm, repo_root};

/// The Python bank's project directory, relative to the repository.
pub const BANK_PY: &str = "examples/bank-py";

/// The Python windows' project directory (tumbling, hopping and session
/// windows of the Python SDK over clicks), relative to the repository.
pub const WINDOWS_PY: &str = "tests/guests/windows-py";

/// Whether componentize-py is there; if not, prints one line saying `what`
/// was skipped (or, under CI, panics).
pub fn componentize_py_available(what: &str) -> bool {
    let found = find_componentize_py(&repo_root().join(BANK_PY), std::env::var_os(COMPONENTIZE_PY_ENV));
    let needs = format!(
        "componentize-py (pip install componentize-py==0.25.1 into a virtual environment, and set \
         {COMPONENTIZE_PY_ENV} to it or put it on PATH)"
    );
    tool_available(found, what, &needs, "componentize-py (.ci/run)")
}

/// The Python bank component (built once per process, and only when its
/// sources changed since the last build), or `None` after a `skipped:`
/// line.
pub fn bank_py_wasm(what: &str) -> Option<PathBuf> {
    componentize_py_available(what).then(|| guest_wasm(BANK_PY))
}

/// The Python bank loaded into a default sandbox, once per process, its
/// compiled code kept in `target/guests/cache` (a run that finds the
/// component unchanged skips the ~25 s compile).
pub fn bank_py_module(what: &str) -> Option<Arc<dyn HandlerModule>> {
    static MODULE: OnceLock<Arc<dyn HandlerModule>> = OnceLock::new();
    Some(load_once(&MODULE, &bank_py_wasm(what)?))
}

/// The Python windows loaded into a default sandbox, once per process (as
/// [`bank_py_module`]), or `None` after a `skipped:` line.
pub fn windows_py_module(what: &str) -> Option<Arc<dyn HandlerModule>> {
    static MODULE: OnceLock<Arc<dyn HandlerModule>> = OnceLock::new();
    componentize_py_available(what).then(|| load_once(&MODULE, &guest_wasm(WINDOWS_PY)))
}
