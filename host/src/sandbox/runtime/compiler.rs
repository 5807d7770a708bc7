//! Compiling a component into native code, in a child process under limits
//! when the process has a compiler program.
//!
//! The rules of [`component_file`](super::component_file) bound what a
//! component holds, not what compiling it costs: one function of 100 000
//! nested `loop`s (300 KB) keeps Cranelift busy for minutes and takes
//! gigabytes, and no count of blocks or locals bounds every shape. So once
//! [`compile_in_child_processes`] has named a program (the `waku` command
//! names itself), every component the compile cache does not hold is
//! compiled by that program's hidden `compile-component` command, in a
//! child process that:
//! - runs under `RLIMIT_CPU` of
//!   [`SandboxLimits::compile_budget`](super::SandboxLimits::compile_budget),
//!   all its compiler threads together;
//! - is killed by the host once its resident memory passes
//!   [`SandboxLimits::compile_memory_bytes`](super::SandboxLimits::compile_memory_bytes)
//!   (the host samples it every 20 ms; an address-space or data limit
//!   would count the allocator's reservations, not what is used), or past
//!   four times the budget in wall-clock time (plus ten seconds, for a busy
//!   machine), and by the kernel when the host dies (`PR_SET_PDEATHSIG`);
//! - reads the component from its standard input and writes the artifact
//!   (`Engine::precompile_component`, with the sandbox's own engine
//!   settings) to its standard output, which the host deserializes.
//!
//! A child stopped at a limit is a refusal naming its rule
//! (`component-compile-time`, `component-compile-memory`), and so is an
//! artifact over [`max_artifact_bytes`] (`component-artifact-size`,
//! compiled here or in a child). The sandbox
//! remembers such refusals by the component's SHA-256, so the same bytes
//! are refused at once afterwards instead of costing the budget again at
//! every change of the module directory.
//!
//! Without a compiler program (a library user's tests) components compile
//! in this process, with no bound on the time.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{LoadError, Sandbox, SandboxLimits};

/// The hidden command of the compiler program that compiles one component.
pub const CHILD_COMMAND: &str = "compile-component";

/// The program that compiles components for every sandbox of this process.
static COMPILER: OnceLock<PathBuf> = OnceLock::new();

/// Makes every sandbox of this process compile in a child process running
/// `program compile-component` (which must call [`child_main`]). Set once;
/// later calls are ignored.
pub fn compile_in_child_processes(program: PathBuf) {
    let _ = COMPILER.set(program);
}

/// Which compile limit a component broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompileLimit {
    /// `component-compile-time`: the CPU budget.
    Time,
    /// `component-compile-memory`: the memory limit.
    Memory,
    /// `component-artifact-size`: the artifact would be over `most` bytes
    /// ([`max_artifact_bytes`]).
    Artifact {
        /// The most it may be, in bytes.
        most: usize,
    },
}

/// The most bytes the artifact of a component of `component` bytes may
/// have: twice the component (native code is about its size; the Python
/// bank's is 1.9 times), plus the memory limit and 16 MiB for memory
/// images. An image is made per linear memory from its data segments, so
/// a few bytes of segments far apart become megabytes of image: a 2 KB
/// component made 200 MB, which the host would hold and cache.
pub(super) fn max_artifact_bytes(component: usize, limits: &SandboxLimits) -> usize {
    component.saturating_mul(2).saturating_add(limits.memory_bytes).saturating_add(16 << 20)
}

/// The native artifact of `bytes`: compiled by the compiler program under
/// the sandbox's compile limits, or in this process when there is none.
pub(super) fn compile(sandbox: &Sandbox, name: &str, bytes: &[u8]) -> Result<Vec<u8>, LoadError> {
    let limits = sandbox.shared.limits;
    let most = max_artifact_bytes(bytes.len(), &limits);
    let refused =
        |limit, again| LoadError::CompileLimit { module: name.to_owned(), limit, limits: Box::new(limits), again };
    let Some(program) = COMPILER.get() else {
        let artifact = sandbox
            .shared
            .engine
            .precompile_component(bytes)
            .map_err(|e| LoadError::Invalid { module: name.to_owned(), reason: format!("{e:#}") })?;
        return match artifact.len() <= most {
            true => Ok(artifact),
            false => Err(refused(CompileLimit::Artifact { most }, false)),
        };
    };
    let digest = super::cache::sha256_hex(bytes);
    let over_limits = || sandbox.shared.over_compile_limits.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(&limit) = over_limits().get(&digest) {
        return Err(refused(limit, true));
    }
    let result = compile_in_child(program, &limits, bytes, most);
    if let Err(Refused(limit)) = result {
        over_limits().insert(digest, limit);
    }
    result.map_err(|failure| match failure {
        Refused(limit) => refused(limit, false),
        Invalid(reason) => LoadError::Invalid { module: name.to_owned(), reason },
        CompilerFailed(reason) => LoadError::Compiler { module: name.to_owned(), reason },
    })
}

/// Why a child did not compile a component.
#[derive(Debug, PartialEq, Eq)]
enum ChildFailure {
    Refused(CompileLimit),
    /// The component is not valid; what the compiler said.
    Invalid(String),
    /// The compiler failed for a reason of the host's.
    CompilerFailed(String),
}
use ChildFailure::{CompilerFailed, Invalid, Refused};

/// Compiles `bytes` with `program compile-component`, under `limits`:
/// the component goes in through its standard input, the artifact comes
/// out of its standard output (no file is left behind by a crash).
fn compile_in_child(
    program: &Path,
    limits: &SandboxLimits,
    bytes: &[u8],
    most: usize,
) -> Result<Vec<u8>, ChildFailure> {
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt;
    let limits_json = serde_json::to_string(limits).expect("the limits serialize");
    let mut child = Command::new(program)
        .arg0("waku")
        .arg(CHILD_COMMAND)
        .arg(limits_json)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| CompilerFailed(format!("cannot start {}: {e}", program.display())))?;
    let (mut input, mut output, errors) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    std::thread::scope(|scope| {
        // A child that stops reading (it died) fails the write: its exit
        // status says why.
        scope.spawn(move || input.as_mut().map(|input| input.write_all(bytes)));
        // At most one byte past `most` is kept; the rest is read and
        // dropped, so the child is not left waiting on a full pipe.
        let artifact = scope.spawn(move || -> std::io::Result<Vec<u8>> {
            let mut artifact = Vec::new();
            if let Some(output) = output.as_mut() {
                output.by_ref().take(most as u64 + 1).read_to_end(&mut artifact)?;
                std::io::copy(output, &mut std::io::sink())?;
            }
            Ok(artifact)
        });
        let said = scope.spawn(move || errors.map(head).unwrap_or_default());
        let status = match watch(&mut child, wall_limit(limits), limits.compile_memory_bytes) {
            Ok(Watched::Exited(status)) => status,
            Ok(Watched::Killed(limit)) => return Err(Refused(limit)),
            Err(e) => {
                // Its pipes close only when it ends, and the threads
                // reading them are joined on the way out.
                let _ = child.kill();
                let _ = child.wait();
                return Err(CompilerFailed(format!("waiting for the compiler: {e}")));
            }
        };
        outcome(status, said.join().unwrap_or_default())?;
        match artifact.join() {
            Ok(Ok(artifact)) if artifact.len() > most => Err(Refused(CompileLimit::Artifact { most })),
            Ok(Ok(artifact)) => Ok(artifact),
            Ok(Err(e)) => Err(CompilerFailed(format!("reading the artifact: {e}"))),
            Err(_) => Err(CompilerFailed("reading the artifact failed".to_owned())),
        }
    })
}

/// The exit code with which the child says the component is invalid.
const INVALID: u8 = 1;

/// The exit code with which the child says it failed for another reason
/// (its arguments, its input, its output, its limits).
const FAILED: u8 = 3;

/// What the compiler's exit status and standard error say.
fn outcome(status: ExitStatus, stderr: String) -> Result<(), ChildFailure> {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => Ok(()),
        (Some(code), _) if code == i32::from(INVALID) => Err(Invalid(stderr)),
        // Past the soft CPU limit the kernel sends SIGXCPU, past the hard
        // one SIGKILL.
        (_, Some(libc::SIGXCPU | libc::SIGKILL)) => Err(Refused(CompileLimit::Time)),
        // A machine out of memory fails an allocation, and Rust's
        // allocation error handler aborts with this message (only an
        // abort counts: the component's own names may say anything).
        (_, Some(libc::SIGABRT)) if stderr.starts_with("memory allocation of") => Err(Refused(CompileLimit::Memory)),
        _ => Err(CompilerFailed(format!("it ended with {status}: {stderr}"))),
    }
}

/// How long the host waits for a compiler child in wall-clock time: the
/// CPU budget is spent on up to every core, but a busy machine may give
/// the child a fraction of one.
fn wall_limit(limits: &SandboxLimits) -> Duration {
    limits.compile_budget * 4 + Duration::from_secs(10)
}

/// How a watched child ended.
enum Watched {
    Exited(ExitStatus),
    /// The host killed it at this limit.
    Killed(CompileLimit),
}

/// Waits for `child`, killing it once it has run `time` or holds more than
/// `memory` bytes resident.
fn watch(child: &mut std::process::Child, time: Duration, memory: usize) -> std::io::Result<Watched> {
    let deadline = Instant::now() + time;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Watched::Exited(status));
        }
        let over = if Instant::now() >= deadline {
            Some(CompileLimit::Time)
        } else {
            resident_bytes(child.id()).is_some_and(|resident| resident > memory).then_some(CompileLimit::Memory)
        };
        if let Some(limit) = over {
            child.kill()?;
            child.wait()?;
            return Ok(Watched::Killed(limit));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// The resident memory of process `pid`, in bytes (Linux; elsewhere
/// unknown).
fn resident_bytes(pid: u32) -> Option<usize> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: `sysconf` has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * usize::try_from(page).ok()?)
}

/// The first 4 KiB of what the child writes to standard error, trimmed;
/// the rest is read and dropped, so the child never waits on a full pipe.
fn head(mut errors: impl std::io::Read) -> String {
    use std::io::Read;
    const MOST: u64 = 4 << 10;
    let mut said = Vec::new();
    let _ = errors.by_ref().take(MOST).read_to_end(&mut said);
    let _ = std::io::copy(&mut errors, &mut std::io::sink());
    String::from_utf8_lossy(&said).trim().to_owned()
}

/// The compiler program's `compile-component` command: `limits` (the
/// sandbox's, as JSON) its one argument, the component on standard input.
/// Puts itself under the compile budget, compiles, and writes the artifact
/// to standard output. An invalid component is exit code 1, any other
/// failure 3, with the reason on standard error.
pub fn child_main(args: &[std::ffi::OsString]) -> std::process::ExitCode {
    use std::io::{Read, Write};
    let [limits] = args else {
        eprintln!("usage: waku {CHILD_COMMAND} LIMITS-JSON < COMPONENT > ARTIFACT (the host runs this itself)");
        return std::process::ExitCode::from(2);
    };
    let failed = |reason: String| (FAILED, reason);
    let run = || -> Result<(), (u8, String)> {
        let limits: SandboxLimits =
            serde_json::from_str(&limits.to_string_lossy()).map_err(|e| failed(format!("limits: {e}")))?;
        limit_this_process(&limits).map_err(failed)?;
        let mut bytes = Vec::new();
        std::io::stdin().lock().read_to_end(&mut bytes).map_err(|e| failed(format!("reading the component: {e}")))?;
        let engine = wasmtime::Engine::new(&super::engine_config(&limits)).map_err(|e| failed(format!("{e:#}")))?;
        let artifact = engine.precompile_component(&bytes).map_err(|e| (INVALID, format!("{e:#}")))?;
        std::io::stdout().lock().write_all(&artifact).map_err(|e| failed(format!("writing the artifact: {e}")))
    };
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err((code, reason)) => {
            eprintln!("{reason}");
            std::process::ExitCode::from(code)
        }
    }
}

/// Puts this process under the compile budget, without core dumps, and
/// has the kernel kill it when its parent dies.
fn limit_this_process(limits: &SandboxLimits) -> Result<(), String> {
    let seconds = limits.compile_seconds().max(1) as libc::rlim_t;
    for (resource, soft, hard, name) in
        [(libc::RLIMIT_CPU, seconds, seconds + 1, "RLIMIT_CPU"), (libc::RLIMIT_CORE, 0, 0, "RLIMIT_CORE")]
    {
        let limit = libc::rlimit { rlim_cur: soft, rlim_max: hard };
        // SAFETY: `setrlimit` reads the struct it is given and nothing else.
        if unsafe { libc::setrlimit(resource, &limit) } != 0 {
            return Err(format!("setting {name}: {}", std::io::Error::last_os_error()));
        }
    }
    // SAFETY: `prctl(PR_SET_PDEATHSIG)` takes a signal number and changes
    // only this process's death signal. (A host gone before this line
    // leaves the child to end at its CPU limit.)
    #[cfg(target_os = "linux")]
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL)
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    #[test]
    fn the_exit_of_the_compiler_names_the_limit_it_broke() {
        let exit = |code: i32| ExitStatus::from_raw(code << 8);
        let signal = ExitStatus::from_raw;
        let said = |text: &str| text.to_owned();
        assert_eq!(outcome(exit(0), said("")), Ok(()));
        let invalid = "failed to parse WebAssembly module";
        assert_eq!(outcome(exit(1), said(invalid)), Err(Invalid(said(invalid))));
        assert_eq!(outcome(signal(libc::SIGXCPU), said("")), Err(Refused(CompileLimit::Time)));
        assert_eq!(outcome(signal(libc::SIGKILL), said("")), Err(Refused(CompileLimit::Time)));
        let abort = "memory allocation of 1048576 bytes failed";
        assert_eq!(outcome(signal(libc::SIGABRT), said(abort)), Err(Refused(CompileLimit::Memory)));
        let named = "import `out of memory` is not a function: memory allocation of 10 bytes failed";
        assert_eq!(outcome(exit(1), said(named)), Err(Invalid(said(named))), "the component's words are not a limit");
        assert!(matches!(outcome(signal(libc::SIGSEGV), said("")), Err(CompilerFailed(_))));
        assert!(matches!(outcome(exit(2), said("usage")), Err(CompilerFailed(_))));
        assert!(matches!(outcome(exit(3), said("limits: missing field")), Err(CompilerFailed(_))));
    }
}
