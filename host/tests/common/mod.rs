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

/// `WAKU_IGGY_URL`, `WAKU_POSTGRES_URL` and stream names, as the
/// `wakuwaku-tests` crate has them.
#[path = "../../../tests/src/servers.rs"]
pub mod servers;
