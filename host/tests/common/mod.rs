//! Shared by the `waku` command's integration tests: the real binary and
//! the bank example built once per test binary.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use wakuwaku::authoring::guest_build::GuestBuild;

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

/// Runs `waku` with `args` in `dir`, killed if it has not ended within
/// `limit`: its output, or `None` when it had to be killed (so a test of
/// something that must end ends itself).
pub fn waku_within(args: &[&str], dir: &Path, limit: Duration) -> Option<Output> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child =
        waku_command(dir).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("waku runs");
    // Read as it comes, so that a full pipe never stops the child.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped")));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waku can be waited for") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    status.map(|status| Output { status, stdout, stderr })
}

/// Lossy text of a command's output.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The lines of `child`'s standard error (piped), as they come.
pub fn stderr_lines(child: &mut std::process::Child) -> Receiver<String> {
    use std::io::BufRead;
    let (sender, lines) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().expect("standard error is piped");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    lines
}

/// Waits for a line that `wanted` accepts, adding every line read to
/// `seen`; fails the test after a minute without one.
pub fn wait_for_line(lines: &Receiver<String>, seen: &mut Vec<String>, wanted: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.iter().any(|line| wanted(line)) {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => seen.push(line),
            Err(_) => panic!("not the line waited for within a minute: {seen:#?}"),
        }
    }
}

/// Waits up to `within` (a cold build may take minutes) for a line
/// containing `wanted`, adding every line read to `seen`; fails the test
/// without one, showing what the child wrote.
pub fn wait_for_text(lines: &Receiver<String>, wanted: &str, seen: &mut Vec<String>, within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match lines.recv_timeout(Duration::from_secs(1)) {
            Ok(line) => {
                let found = line.contains(wanted);
                seen.push(line);
                if found {
                    return;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    panic!("no line with `{wanted}`; the child wrote:\n{}", seen.join("\n"));
}

/// Kills the child when dropped, so a failed assertion leaves no process.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The bank example, built once for this test binary.
pub fn bank_wasm() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| guest("examples/bank"))
}

/// The inventory example, built once for this test binary.
pub fn inventory_wasm() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| guest("examples/inventory"))
}

/// The probe test module, built once for this test binary.
pub fn probe_wasm() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| guest("tests/guests/probe"))
}

/// The windows test module (`tests/guests/windowed`), built once for this
/// test binary.
pub fn windowed_wasm() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| guest("tests/guests/windowed"))
}

/// The nexmark example (`examples/nexmark`), and the same built with its
/// feature `hot` (query 5's second stage) into a target directory of its
/// own (the component has the crate's name), each once for this test
/// binary.
pub fn nexmark_wasm() -> (&'static PathBuf, &'static PathBuf) {
    static FIRST: OnceLock<PathBuf> = OnceLock::new();
    static HOT: OnceLock<PathBuf> = OnceLock::new();
    let first = FIRST.get_or_init(|| guest("examples/nexmark"));
    let hot = HOT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let build = GuestBuild {
            target_dir: Some(root.join("target/guests/nexmark-hot")),
            quiet: true,
            features: vec!["hot".to_owned()],
            ..GuestBuild::new(root.join("examples/nexmark"))
        };
        build.run().unwrap_or_else(|e| panic!("examples/nexmark builds with its feature `hot`: {e}"))
    });
    (first, hot)
}

/// The probe built with the feature `untimed-ledger` (its `TimedLedger`
/// declares no event time), once for this test binary, into a target
/// directory of its own: the file has the probe's name.
pub fn probe_untimed_ledger_wasm() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let build = GuestBuild {
            target_dir: Some(root.join("target/guests/untimed-ledger")),
            quiet: true,
            features: vec!["untimed-ledger".to_owned()],
            ..GuestBuild::new(root.join("tests/guests/probe"))
        };
        build.run().unwrap_or_else(|e| panic!("the probe with `untimed-ledger` builds: {e}"))
    })
}

/// The component at `wasm` with a custom section appended: the same
/// behaviour, another content hash, so another version.
pub fn variant_of(wasm: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(wasm).unwrap();
    let name = b"variant";
    bytes.extend([0x00, (1 + name.len() + 1) as u8, name.len() as u8]);
    bytes.extend(name);
    bytes.push(1);
    bytes
}

/// The bank with a withdrawal fee (`tests/guests/bank-fee`), built once
/// for this test binary.
pub fn bank_fee_wasm() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| guest("tests/guests/bank-fee"))
}

/// The timed Python ledger (`tests/guests/ledger-py`), built once for this
/// test binary with componentize-py, found as `waku build` finds it; `None`
/// after a `skipped:` line saying `what` was skipped, or a panic under CI,
/// which installs componentize-py (.ci/run).
pub fn ledger_py_wasm(what: &str) -> Option<&'static PathBuf> {
    use wakuwaku::authoring::guest_build::python::{COMPONENTIZE_PY_ENV, find_componentize_py};
    const PROJECT: &str = "tests/guests/ledger-py";
    let project = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join(PROJECT);
    if let Err(error) = find_componentize_py(&project, std::env::var_os(COMPONENTIZE_PY_ENV)) {
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("{what}: CI installs componentize-py (.ci/run), but {error}");
        }
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "skipped: {what} needs componentize-py: {error}");
        return None;
    }
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    Some(BUILT.get_or_init(|| guest(PROJECT)))
}

/// The npm tools of the TypeScript guests (`npm ci` at the repository
/// root), found as `waku build` finds them for `project`: `true` when
/// there; else one `skipped:` line saying `what` was skipped, or a panic
/// under CI, which installs them (.ci/run).
pub fn js_tools_available(project: &Path, what: &str) -> bool {
    match wakuwaku::authoring::guest_build::js::find_js_tools(project) {
        Ok(_) => true,
        Err(error) if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
            panic!("{what}: CI installs the npm tools (.ci/run: npm ci), but {error}")
        }
        Err(_) => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "skipped: {what} needs componentize-js and esbuild (`npm ci` at the repository root)"
            );
            false
        }
    }
}

/// The TypeScript bank (`examples/bank-ts`), built once for this test
/// binary with esbuild and componentize-js; `None` after a `skipped:` line
/// (see [`js_tools_available`]).
pub fn bank_ts_wasm(what: &str) -> Option<&'static PathBuf> {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    js_guest("examples/bank-ts", &BUILT, what)
}

/// The TypeScript inventory (`examples/inventory-ts`), built once for this
/// test binary; `None` after a `skipped:` line.
pub fn inventory_ts_wasm(what: &str) -> Option<&'static PathBuf> {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    js_guest("examples/inventory-ts", &BUILT, what)
}

/// The hostile TypeScript module (`tests/guests/hostile-ts`), built once
/// for this test binary; `None` after a `skipped:` line.
pub fn hostile_ts_wasm(what: &str) -> Option<&'static PathBuf> {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    js_guest("tests/guests/hostile-ts", &BUILT, what)
}

fn js_guest(project: &str, built: &'static OnceLock<PathBuf>, what: &str) -> Option<&'static PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join(project);
    if !js_tools_available(&dir, what) {
        return None;
    }
    Some(built.get_or_init(|| guest(project)))
}

/// Where the tests keep compiled components (`waku test --compile-cache`),
/// shared with the `wakuwaku-tests` crate's: a component compiled once is
/// not compiled again by a later run (a Python one takes about 25 s).
pub fn compile_cache() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("target/guests/cache")
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

pub mod registry;

/// Runs `waku args` in `dir` `trials` times, each SIGKILLed at a random
/// moment (seeded by `seed`) after it reached its 16th batch, unless it
/// ended first, which it must have done successfully: the crash trials
/// of the event-time and timer tests. Says how many runs were killed.
pub fn kill_runs_at_random(dir: &Path, args: &[&str], trials: u64, seed: u64) -> u64 {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut killed = 0;
    for trial in 0..trials {
        let mut child = waku_command(dir)
            .args(args)
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("waku starts");
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while std::io::BufRead::read_line(&mut stderr, &mut line).unwrap_or(0) > 0 && !line.contains("batch 16") {
            line.clear();
        }
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        std::thread::sleep(Duration::from_millis(rng.random_range(20..400)));
        match child.try_wait().unwrap() {
            Some(status) => assert!(status.success(), "trial {trial}: waku failed on its own"),
            None => {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                killed += 1;
            }
        }
    }
    killed
}
