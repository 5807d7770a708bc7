//! Shared by the `waku` command's integration tests: the real binary and
//! the bank example built once per test binary.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use wakuwaku::guest_build::GuestBuild;

/// The `waku` binary under test.
pub fn waku_command(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_waku"));
    command.current_dir(dir);
    command
}

/// Runs `waku` with `args` in `dir` and waits for it.
pub fn waku(args: &[&str], dir: &Path) -> Output {
    waku_command(dir).args(args).output().expect("waku runs")
}

/// Lossy text of a command's output.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The bank example, built once for this test binary.
pub fn bank_wasm() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| guest("examples/bank"))
}

/// The probe test module, built once for this test binary.
pub fn probe_wasm() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| guest("tests/guests/probe"))
}

/// The bank with a withdrawal fee (`tests/guests/bank-fee`), built once
/// for this test binary.
pub fn bank_fee_wasm() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| guest("tests/guests/bank-fee"))
}

fn guest(crate_path: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    GuestBuild { target_dir: Some(root.join("target/guests")), quiet: true, ..GuestBuild::new(root.join(crate_path)) }
        .run()
        .unwrap_or_else(|e| panic!("{crate_path} builds: {e}"))
}

/// The Iggy server the tests may use (`WAKU_IGGY_URL`, for example
/// `iggy://iggy:iggy@127.0.0.1:8090`). Without one, prints one line saying
/// `what` was skipped and returns `None` (CI has no Iggy server).
pub fn iggy_url(what: &str) -> Option<String> {
    let url = std::env::var("WAKU_IGGY_URL").ok();
    if url.is_none() {
        // Straight to stderr, past the test harness's capture, so it shows.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {what} needs an Iggy server named by WAKU_IGGY_URL (e.g. iggy://iggy:iggy@127.0.0.1:8090)"
        );
    }
    url
}

/// The PostgreSQL server the tests may use (`WAKU_POSTGRES_URL`, for
/// example `postgres://postgres@127.0.0.1:5433/postgres`). Without one,
/// prints one line saying `what` was skipped and returns `None`; under CI
/// (which starts one) a missing URL is a failure.
pub fn postgres_url(what: &str) -> Option<String> {
    let url = std::env::var("WAKU_POSTGRES_URL").ok();
    if url.is_none() {
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("{what}: CI starts a PostgreSQL server (.ci/run), but WAKU_POSTGRES_URL is not set");
        }
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {what} needs a PostgreSQL server named by WAKU_POSTGRES_URL \
             (e.g. postgres://postgres@127.0.0.1:5433/postgres)"
        );
    }
    url
}
