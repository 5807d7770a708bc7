//! The running host as the one owner of its embedded data directory: the
//! other commands find it by themselves and run through it.
//!
//! `waku run` (and `waku dev`) hold the embedded log and the projection's
//! state file open (redb lets one process at a time have a file). So that
//! nothing a user does on one machine needs the host stopped, the host
//! serves a local socket, and `publish`, `topic`, `state`, `dlq`,
//! `modules`, `status` and `rebuild` of its data directory are sent there
//! and run inside the host process, on the files it holds: the same code
//! as when nothing runs, so the same output and exit code.
//!
//! How they meet:
//! - **The address file** `<data>/running-host.json` (mode 0600) names the
//!   host's process id, its socket (`<data>/host.sock`, mode 0600, or in a
//!   private directory under the temporary directory when that path is too
//!   long for a socket) and a random token. The host writes it once it
//!   serves and removes both when it stops cleanly.
//! - **A command** reads the file before it opens anything. No file, a
//!   process that is gone, a socket nobody listens on (a host killed with
//!   SIGKILL leaves both behind): it opens the files as it would have
//!   anyway. A file that is not what the host writes (too large, not
//!   JSON, not the user's own, readable by others) is said in a warning and
//!   ignored. A host that takes the connection but does not answer within
//!   [`ANSWER_TIMEOUT`] is an error that says so; a host that stops
//!   answering while the command runs (it sends a heartbeat every
//!   [`HEARTBEAT`]) too: never a stall.
//! - **Who may ask**: whoever can open the socket (the user who runs the
//!   host: mode 0600) and presents the token from the file (also 0600),
//!   compared in constant time.
//! - **The request** is typed ([`Request`]): the command line with every
//!   setting applied (flag, environment, `waku.toml`) and every path made
//!   absolute (the host runs in another directory), the settings given as
//!   flags, and standard input for `publish -`. The host parses it with
//!   the same parser and refuses any command but those above.
//! - **The answer** is a stream of frames ([`Frame`]): standard output and
//!   standard error as the command writes them (so `topic consume --follow`
//!   shows each message as it comes), heartbeats, then the exit code. A
//!   client that closes its end (Ctrl-C) ends the command; one that stops
//!   reading holds at most [`QUEUED_FRAMES`] frames and [`WRITE_TIMEOUT`],
//!   then the command ends as with a closed pipe.
//! - **The answer names paths as typed**: the command puts the paths it
//!   made absolute back as the user typed them, in the messages the host
//!   sends ([`AsTyped`]) and in the results of commands that show no data
//!   of the log or state, so its output is the command's alone.
//! - **In the host**, a forwarded command runs with the host's open log
//!   and the open state store of its projection ([`shared_log`],
//!   [`shared_state`]); other projections' files it opens itself. A
//!   `modules rollback` of the host's projection swaps the version in at
//!   once, through the hot-reload checks ([`live_modules`]). A `status` of
//!   the host's projection shows what its `/status` answers: the same
//!   figures, start-up end offsets and clocks included ([`live_status`]).
//!   At most [`MAX_CLIENTS`] commands run at once; more are refused.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use wakuwaku_core::terminal::printable;

use crate::engine::projection::Projection;
use crate::operations::lifecycle::Library;
use crate::storage::log::{AnyLog, EmbeddedLog};
use crate::storage::state::StateStore;

/// The address file's name in the data directory.
pub(super) const ADDRESS_FILE: &str = "running-host.json";

/// The socket's name in the data directory.
const SOCKET_FILE: &str = "host.sock";

/// How long a command waits for the host to take its request.
pub(super) const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the host says it is still there while a command runs.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// How long a command waits for a frame before it calls the host gone.
const SILENCE_TIMEOUT: Duration = Duration::from_secs(15);

/// How long the host waits for a client to take a frame.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The most a frame or a request may hold (standard input of `publish -`
/// included).
const MAX_FRAME: usize = 256 << 20;

/// The most an address file may hold.
const MAX_ADDRESS_FILE: u64 = 64 << 10;

/// Output frames a command may have waiting for a slow client.
const QUEUED_FRAMES: usize = 256;

/// Forwarded commands running at once.
const MAX_CLIENTS: usize = 16;

/// What the address file holds.
#[derive(Serialize, Deserialize)]
struct Address {
    pid: u32,
    socket: PathBuf,
    token: String,
}

/// What a command asks the host.
#[derive(Serialize, Deserialize)]
struct Request {
    token: String,
    /// The command line: settings applied, paths absolute.
    argv: Vec<String>,
    /// The settings given as flags (the others came from the environment,
    /// the file or their defaults), for the commands that tell them apart.
    flags: Vec<String>,
    /// Standard input, for `publish -`.
    stdin: Option<String>,
}

/// One frame of the answer: a kind byte, a length (u32, big-endian) and
/// that many bytes.
#[derive(Debug, PartialEq)]
enum Frame {
    /// The request was taken.
    Accepted,
    /// Standard output.
    Out(Vec<u8>),
    /// Standard error.
    Err(Vec<u8>),
    /// Still running.
    Heartbeat,
    /// The command ended with this exit code.
    Exit(u8),
    /// The request was refused, and why.
    Refused(String),
}

impl Frame {
    fn encode(&self) -> Vec<u8> {
        let (kind, payload): (u8, &[u8]) = match self {
            Self::Accepted => (b'A', &[]),
            Self::Out(bytes) => (b'O', bytes),
            Self::Err(bytes) => (b'E', bytes),
            Self::Heartbeat => (b'H', &[]),
            Self::Exit(code) => (b'X', std::slice::from_ref(code)),
            Self::Refused(reason) => (b'R', reason.as_bytes()),
        };
        let mut bytes = Vec::with_capacity(5 + payload.len());
        bytes.push(kind);
        bytes.extend_from_slice(&u32::try_from(payload.len()).unwrap_or(u32::MAX).to_be_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    /// Reads one frame; a frame the host never writes is an error.
    fn read(reader: &mut impl Read) -> std::io::Result<Self> {
        let mut head = [0u8; 5];
        reader.read_exact(&mut head)?;
        let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if length > MAX_FRAME {
            return Err(invalid(format!("a frame of {length} bytes (at most {MAX_FRAME})")));
        }
        let mut payload = vec![0; length];
        reader.read_exact(&mut payload)?;
        match (head[0], payload.as_slice()) {
            (b'A', []) => Ok(Self::Accepted),
            (b'O', _) => Ok(Self::Out(payload)),
            (b'E', _) => Ok(Self::Err(payload)),
            (b'H', []) => Ok(Self::Heartbeat),
            (b'X', [code]) => Ok(Self::Exit(*code)),
            (b'R', _) => Ok(Self::Refused(String::from_utf8_lossy(&payload).into_owned())),
            (kind, _) => Err(invalid(format!("an unknown frame (kind {kind}, {length} bytes)"))),
        }
    }
}

fn invalid(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

/// Writes a length-prefixed request.
fn write_request(writer: &mut impl Write, request: &Request) -> std::io::Result<()> {
    let body = serde_json::to_vec(request).map_err(std::io::Error::other)?;
    if body.len() > MAX_FRAME {
        return Err(invalid(format!("a request of {} bytes (at most {MAX_FRAME})", body.len())));
    }
    writer.write_all(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes())?;
    writer.write_all(&body)?;
    writer.flush()
}

/// Reads a length-prefixed request.
fn read_request(reader: &mut impl Read) -> std::io::Result<Request> {
    let mut head = [0u8; 4];
    reader.read_exact(&mut head)?;
    let length = u32::from_be_bytes(head) as usize;
    if length > MAX_FRAME {
        return Err(invalid(format!("a request of {length} bytes (at most {MAX_FRAME})")));
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    serde_json::from_slice(&body).map_err(|error| invalid(format!("not a request: {error}")))
}

// ---------------------------------------------------------------------------
// In the host: what a forwarded command shares with it, and where it writes.

/// What the running host shares with the commands it runs for others.
pub(super) struct Shared {
    /// Its data directory, canonical.
    data: PathBuf,
    /// Its projection.
    projection: String,
    /// Its log, when embedded.
    log: Option<EmbeddedLog>,
    /// Its projection's state, when embedded.
    store: Option<StateStore>,
    /// Its projection as it runs and the library of its modules, when
    /// they come from a directory: a rollback swaps the version in at once.
    live: Option<(Arc<Library>, Arc<Projection>)>,
    /// Its projection as it runs and what only the running host knows of
    /// its status: a `waku status` run here shows what `/status` does.
    status: Option<(Arc<Projection>, crate::operations::admin::LiveStatus)>,
}

impl Shared {
    /// What a host on `data` running `projection` shares: its embedded log
    /// and state, when they are (the rest others open themselves).
    pub(super) fn new(data: &Path, projection: &str, log: Option<EmbeddedLog>, store: Option<StateStore>) -> Self {
        Self {
            data: data.canonicalize().unwrap_or_else(|_| data.to_owned()),
            projection: projection.to_owned(),
            log,
            store,
            live: None,
            status: None,
        }
    }

    /// Also shares the running `projection` and what only the running host
    /// knows of its status ([`live_status`]).
    pub(super) fn with_live_status(
        mut self,
        projection: &Arc<Projection>,
        live: crate::operations::admin::LiveStatus,
    ) -> Self {
        self.status = Some((projection.clone(), live));
        self
    }

    /// Also shares the running `projection` and the `library` of its
    /// modules, so that `modules rollback` swaps the version in at once.
    pub(super) fn with_live_modules(mut self, library: Option<&Arc<Library>>, projection: &Arc<Projection>) -> Self {
        self.live = library.map(|library| (library.clone(), projection.clone()));
        self
    }

    /// What the host of `run` shares: its log and state where embedded.
    pub(super) fn of_host(
        data: &Path,
        projection: &str,
        log: &AnyLog,
        store: &StateStore,
        embedded_state: bool,
    ) -> Self {
        let log = match log {
            AnyLog::Embedded(log) => Some(log.clone()),
            _ => None,
        };
        Self::new(data, projection, log, embedded_state.then(|| store.clone()))
    }

    fn holds(&self, data: &Path) -> bool {
        data.canonicalize().is_ok_and(|data| data == self.data)
    }
}

/// The context of a command the host runs for another process.
struct Forwarded {
    shared: Arc<Shared>,
    frames: std::sync::mpsc::SyncSender<Frame>,
    stdin: Option<String>,
}

tokio::task_local! {
    static FORWARDED: Forwarded;
}

/// The host's embedded log, when this command runs in the host for
/// another process and names the host's data directory.
pub(super) fn shared_log(data: &Path) -> Option<AnyLog> {
    FORWARDED
        .try_with(|forwarded| {
            let log = forwarded.shared.log.as_ref().filter(|_| forwarded.shared.holds(data))?;
            Some(AnyLog::Embedded(log.clone()))
        })
        .ok()
        .flatten()
}

/// The host's state store, when this command runs in the host for another
/// process and names the host's data directory and projection.
pub(super) fn shared_state(data: &Path, projection: &str) -> Option<StateStore> {
    FORWARDED
        .try_with(|forwarded| {
            let shared = &forwarded.shared;
            shared.store.clone().filter(|_| shared.projection == projection && shared.holds(data))
        })
        .ok()
        .flatten()
}

/// The library and the running projection, when this command runs in a
/// host that runs `projection` on `data` with modules from a directory.
pub(super) fn live_modules(data: &Path, projection: &str) -> Option<(Arc<Library>, Arc<Projection>)> {
    FORWARDED
        .try_with(|forwarded| {
            let shared = &forwarded.shared;
            shared.live.clone().filter(|_| shared.projection == projection && shared.holds(data))
        })
        .ok()
        .flatten()
}

/// The running projection and what only the running host knows of its
/// status, when this command runs in a host that runs `projection` on
/// `data`: `waku status` then builds what `/status` answers.
pub(super) fn live_status(
    data: &Path,
    projection: &str,
) -> Option<(Arc<Projection>, crate::operations::admin::LiveStatus)> {
    FORWARDED
        .try_with(|forwarded| {
            let shared = &forwarded.shared;
            shared.status.clone().filter(|_| shared.projection == projection && shared.holds(data))
        })
        .ok()
        .flatten()
}

/// Whether this command runs in a host that runs `projection` on `data`
/// (its consumer applies what is re-driven at once).
pub(super) fn runs_projection(data: &Path, projection: &str) -> bool {
    FORWARDED
        .try_with(|forwarded| forwarded.shared.projection == projection && forwarded.shared.holds(data))
        .unwrap_or(false)
}

/// Standard input the command was sent, when it runs for another process.
pub(super) fn forwarded_stdin() -> Option<String> {
    FORWARDED.try_with(|forwarded| forwarded.stdin.clone()).ok().flatten()
}

/// Writes a command's result: to the process that sent the command when
/// it runs for another one, else to standard output.
pub(super) fn write_out(text: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    match FORWARDED.try_with(|forwarded| send(&forwarded.frames, Frame::Out(text.to_string().into_bytes()))) {
        Ok(sent) => sent,
        Err(_) => std::io::stdout().lock().write_fmt(text),
    }
}

/// Writes a message line, as [`write_out`] does a result.
pub(super) fn write_err(line: &str) {
    let sent = FORWARDED.try_with(|forwarded| send(&forwarded.frames, Frame::Err(format!("{line}\n").into_bytes())));
    if sent.is_err() {
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }
}

/// Queues `frame` for the client, waiting while the queue is full (a
/// forwarded command runs on a thread of its own, see [`serve_client`]); a
/// client gone is a closed pipe.
fn send(frames: &std::sync::mpsc::SyncSender<Frame>, frame: Frame) -> std::io::Result<()> {
    frames.send(frame).map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
}

// ---------------------------------------------------------------------------
// In the host: serving.

/// The local endpoint of a running host; dropping it stops serving and
/// removes the address file and the socket.
pub(super) struct Served {
    address_file: PathBuf,
    socket: PathBuf,
    /// The private directory holding the socket, when it is not in the
    /// data directory.
    private_dir: Option<PathBuf>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.address_file);
        let _ = std::fs::remove_file(&self.socket);
        if let Some(dir) = &self.private_dir {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A forwarded command under way: its exit code.
pub(super) type Running = std::pin::Pin<Box<dyn std::future::Future<Output = u8>>>;

/// What runs a forwarded command: its command line and the settings given
/// as flags, to its exit code.
pub(super) type Runner = fn(Vec<String>, Vec<String>) -> Running;

/// Serves the host's local endpoint for its data directory, so the other
/// commands of that directory run through it; `run` runs each command.
#[cfg(unix)]
pub(super) fn serve(shared: Shared, run: Runner) -> Result<Served> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};

    let data = shared.data.clone();
    let in_data = data.join(SOCKET_FILE);
    // A socket's path holds at most 107 bytes on Linux (103 on macOS).
    let (socket, private_dir) = match in_data.as_os_str().len() <= 100 {
        true => (in_data, None),
        false => {
            let dir = std::env::temp_dir().join(format!("waku-{}", token_text()));
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .with_context(|| format!("creating {}", dir.display()))?;
            (dir.join(SOCKET_FILE), Some(dir))
        }
    };
    // A socket left by a host killed before it could remove it.
    let _ = std::fs::remove_file(&socket);
    let listener = std::os::unix::net::UnixListener::bind(&socket)
        .with_context(|| format!("listening on {}", socket.display()))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("protecting {}", socket.display()))?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let token = token_text();
    let address = Address { pid: std::process::id(), socket: socket.clone(), token: token.clone() };
    let address_file = data.join(ADDRESS_FILE);
    // Written whole under another name, then renamed: a command never
    // reads half a file.
    let partial = data.join(format!(".{ADDRESS_FILE}.{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)
        .and_then(|mut file| file.write_all(&serde_json::to_vec(&address)?))
        .and_then(|()| std::fs::rename(&partial, &address_file));
    if let Err(error) = written {
        let _ = std::fs::remove_file(&partial);
        let _ = std::fs::remove_file(&socket);
        return Err(anyhow::Error::new(error).context(format!("writing {}", address_file.display())));
    }
    let shared = Arc::new(shared);
    let token = crate::operations::admin::AdminToken::new(&token, "the address file")?.expect("a token is never empty");
    let clients = Arc::new(AtomicUsize::new(0));
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let Ok(stream) = stream.into_std() else { continue };
            let (shared, token, clients) = (shared.clone(), token.clone(), clients.clone());
            let runtime = tokio::runtime::Handle::current();
            let spawned = std::thread::Builder::new()
                .name("waku-local-client".to_owned())
                .spawn(move || serve_client(stream, &shared, &token, &clients, &runtime, run));
            if let Err(error) = spawned {
                tracing::warn!("a local command could not be served: {error}");
            }
        }
    });
    Ok(Served { address_file, socket, private_dir, task })
}

#[cfg(not(unix))]
pub(super) fn serve(_shared: Shared, _run: Runner) -> Result<Served> {
    bail!("the local endpoint needs Unix sockets")
}

/// [`serve`], when the host holds something of its data directory; a
/// failure is a warning (the host runs on, the other commands then find the
/// files held).
pub(super) fn serve_or_warn(shared: Shared, run: Runner) -> Option<Served> {
    if shared.log.is_none() && shared.store.is_none() {
        return None;
    }
    match serve(shared, run) {
        Ok(served) => Some(served),
        Err(error) => {
            errln!("waku: warning: other commands cannot run through this host (they need it stopped): {error:#}");
            None
        }
    }
}

/// A fresh random token, as hex.
fn token_text() -> String {
    rand::random::<[u8; 16]>().iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Serves one client on its own thread: its request, its command's frames.
#[cfg(unix)]
fn serve_client(
    mut stream: std::os::unix::net::UnixStream,
    shared: &Arc<Shared>,
    token: &crate::operations::admin::AdminToken,
    clients: &AtomicUsize,
    runtime: &tokio::runtime::Handle,
    run: Runner,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(ANSWER_TIMEOUT));
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let refuse = |stream: &mut std::os::unix::net::UnixStream, reason: &str| {
        let _ = stream.write_all(&Frame::Refused(reason.to_owned()).encode());
    };
    let request = match read_request(&mut stream) {
        Ok(request) => request,
        Err(error) => return refuse(&mut stream, &format!("unreadable request: {error}")),
    };
    if !token.matches(request.token.as_bytes()) {
        return refuse(&mut stream, "wrong token");
    }
    if clients.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
        clients.fetch_sub(1, Ordering::SeqCst);
        return refuse(&mut stream, &format!("{MAX_CLIENTS} commands run through this host already; try again"));
    }
    let (frames, queue) = std::sync::mpsc::sync_channel(QUEUED_FRAMES);
    let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
    let forwarded = Forwarded { shared: shared.clone(), frames: frames.clone(), stdin: request.stdin };
    let (argv, flags) = (request.argv, request.flags);
    let runtime = runtime.clone();
    // The command runs on a thread of its own, inside the host's runtime:
    // its writes wait for a slow client without holding an async worker.
    let command = std::thread::Builder::new().name("waku-local-command".to_owned()).spawn(move || {
        let command = FORWARDED.scope(forwarded, async move {
            tokio::select! {
                code = run(argv, flags) => Some(code),
                _ = cancelled => None,
            }
        });
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(command)));
        let code = match code {
            Ok(None) => return,
            Ok(Some(code)) => code,
            Err(_) => {
                let _ = frames.send(Frame::Err(b"waku: error: the command panicked in the running host\n".to_vec()));
                1
            }
        };
        let _ = frames.send(Frame::Exit(code));
    });
    if let Err(error) = command {
        refuse(&mut stream, &format!("cannot start the command: {error}"));
        clients.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    let mut write = |frame: Frame| stream.write_all(&frame.encode());
    if write(Frame::Accepted).is_ok() {
        loop {
            let frame = match queue.recv_timeout(HEARTBEAT) {
                Ok(frame) => frame,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Frame::Heartbeat,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            };
            let exit = matches!(frame, Frame::Exit(_));
            // A client gone (or not reading within the timeout) ends the
            // command: it is stopped, and its next write is a closed pipe.
            if write(frame).is_err() || exit {
                break;
            }
        }
    }
    drop(cancel);
    drop(queue);
    clients.fetch_sub(1, Ordering::SeqCst);
}

// ---------------------------------------------------------------------------
// In a command: finding the host and running through it.

/// Why a command runs on the files instead (said only when it matters).
enum NoHost {
    /// Nothing runs: no file, a process gone, a socket nobody listens on.
    Absent,
    /// The file is not what a host writes: a warning names it.
    Ignored(String),
}

/// Runs the command line `argv` (settings applied; `flags`: those given as
/// flags) through the host running on `data`, if one runs: its exit code;
/// `None` when none runs, so the command opens the files itself. `cwd`
/// makes relative paths absolute.
pub(super) fn forward(data: &Path, argv: &[OsString], flags: Vec<String>, drop: &[&str]) -> Result<Option<u8>> {
    let address = match find(data) {
        Ok(address) => address,
        Err(NoHost::Absent) => return Ok(None),
        Err(NoHost::Ignored(warning)) => {
            errln!("waku: warning: {warning}; reading the files");
            return Ok(None);
        }
    };
    let cwd = std::env::current_dir().context("the working directory")?;
    let (argv, paths) = absolute_argv(argv, &cwd, drop)?;
    let reads_stdin = argv.get(1).is_some_and(|command| command == "publish") && argv.last().is_some_and(|a| a == "-");
    let stdin = match reads_stdin {
        true => {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).context("reading standard input")?;
            Some(text)
        }
        false => None,
    };
    let request = Request { token: address.token, argv, flags, stdin };
    run_remote(&address.socket, address.pid, &request, &paths)
}

/// Puts back the paths a command line was given as typed (relative), in
/// what the host sends: it ran the command with them made absolute.
struct AsTyped {
    /// Each path as sent and as typed, as a message shows them
    /// ([`printable`]), longest first.
    typed: Vec<(String, String)>,
    /// Whether standard output is put back too.
    in_results: bool,
}

impl AsTyped {
    /// `bytes` with every path as sent put back as typed; bytes that are
    /// not UTF-8 are left as they are.
    fn put_back(&self, bytes: Vec<u8>) -> Vec<u8> {
        let mut text = match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(error) => return error.into_bytes(),
        };
        for (absolute, typed) in &self.typed {
            if text.contains(absolute.as_str()) {
                text = text.replace(absolute.as_str(), typed);
            }
        }
        text.into_bytes()
    }
}

/// The process id of the host running on `data`, as its address file
/// names it (`None`: no live host wrote one): for messages about files it
/// holds.
pub(super) fn running_pid(data: &Path) -> Option<u32> {
    find(data).ok().map(|address| address.pid)
}

/// The address of the host running on `data`.
fn find(data: &Path) -> Result<Address, NoHost> {
    let path = data.join(ADDRESS_FILE);
    let Ok(metadata) = std::fs::symlink_metadata(&path) else { return Err(NoHost::Absent) };
    let ignored = |why: &str| NoHost::Ignored(format!("{} {why}", path.display()));
    if !metadata.is_file() {
        return Err(ignored("is no file"));
    }
    if metadata.len() > MAX_ADDRESS_FILE {
        return Err(ignored(&format!("holds {} bytes, more than a host writes", metadata.len())));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        if metadata.uid() != uid {
            return Err(ignored("belongs to another user"));
        }
        if metadata.mode() & 0o077 != 0 {
            return Err(ignored("may be read or written by others (a host writes it with mode 0600)"));
        }
    }
    let text = std::fs::read(&path).map_err(|error| ignored(&format!("cannot be read ({error})")))?;
    let address: Address =
        serde_json::from_slice(&text).map_err(|error| ignored(&format!("is not a host's address ({error})")))?;
    if !alive(address.pid) {
        // Left by a host that was killed: nothing runs.
        return Err(NoHost::Absent);
    }
    Ok(address)
}

/// Whether a process `pid` exists.
fn alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
        if pid <= 0 {
            return false;
        }
        // SAFETY: signal 0 sends nothing; it only checks the process.
        let result = unsafe { libc::kill(pid, 0) };
        result == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        false
    }
}

/// Sends `request` to the host at `socket` and relays its answer.
#[cfg(unix)]
fn run_remote(socket: &Path, pid: u32, request: &Request, paths: &AsTyped) -> Result<Option<u8>> {
    use std::os::unix::fs::MetadataExt;
    let stream = match std::fs::symlink_metadata(socket) {
        // SAFETY: getuid has no preconditions and cannot fail.
        Ok(metadata) if metadata.uid() != unsafe { libc::getuid() } => {
            errln!("waku: warning: the socket {} belongs to another user; reading the files", socket.display());
            return Ok(None);
        }
        Ok(_) => std::os::unix::net::UnixStream::connect(socket),
        Err(error) => Err(error),
    };
    // Nobody listens (a host killed with SIGKILL, whose pid came back):
    // nothing runs.
    let Ok(mut stream) = stream else { return Ok(None) };
    let host = format!("the running host (process {pid}, {})", socket.display());
    stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    stream.set_write_timeout(Some(ANSWER_TIMEOUT))?;
    write_request(&mut stream, request).with_context(|| format!("sending the command to {host}"))?;
    let mut reader = std::io::BufReader::new(stream.try_clone()?);
    match Frame::read(&mut reader) {
        Ok(Frame::Accepted) => {}
        Ok(Frame::Refused(reason)) => {
            bail!("{host} refused the command: {}", printable(&reason))
        }
        Ok(other) => bail!("{host} answered {other:?} instead of taking the command"),
        Err(error) if timed_out(&error) => {
            bail!("{host} took the connection but did not answer within {} s", ANSWER_TIMEOUT.as_secs())
        }
        Err(error) => return Err(anyhow::Error::new(error).context(format!("{host} did not take the command"))),
    }
    stream.set_read_timeout(Some(SILENCE_TIMEOUT))?;
    let (mut stdout, mut stderr) = (std::io::stdout().lock(), std::io::stderr());
    loop {
        match Frame::read(&mut reader) {
            Ok(Frame::Out(bytes)) => {
                let bytes = if paths.in_results { paths.put_back(bytes) } else { bytes };
                if let Err(error) = stdout.write_all(&bytes).and_then(|()| stdout.flush()) {
                    // `| head`: the reader is gone, so is the command.
                    return match error.kind() {
                        std::io::ErrorKind::BrokenPipe => Ok(Some(0)),
                        _ => Err(anyhow::Error::new(error).context("cannot write to standard output")),
                    };
                }
            }
            Ok(Frame::Err(bytes)) => {
                let _ = stderr.write_all(&paths.put_back(bytes));
            }
            Ok(Frame::Heartbeat) => {}
            Ok(Frame::Exit(code)) => return Ok(Some(code)),
            Ok(other) => bail!("{host} sent {other:?} in the middle of the command"),
            Err(error) if timed_out(&error) => {
                bail!("{host} stopped answering ({} s without a word)", SILENCE_TIMEOUT.as_secs())
            }
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {
                bail!("{host} ended the connection before the command ended (did it stop?)")
            }
            Err(error) => return Err(anyhow::Error::new(error).context(format!("reading the answer of {host}"))),
        }
    }
}

#[cfg(not(unix))]
fn run_remote(_socket: &Path, _pid: u32, _request: &Request, _paths: &AsTyped) -> Result<Option<u8>> {
    Ok(None)
}

fn timed_out(error: &std::io::Error) -> bool {
    matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}

/// `argv` (settings applied) as the host must run it: every path absolute
/// against `cwd`, the settings named in `drop` left out, each flag as
/// `--<flag>=<value>` and the positional arguments after `--`. Also each
/// path made absolute, with the path as typed ([`AsTyped`]).
fn absolute_argv(argv: &[OsString], cwd: &Path, drop: &[&str]) -> Result<(Vec<String>, AsTyped)> {
    use clap::CommandFactory;
    use clap::parser::ValueSource;
    let command = super::Cli::command();
    let matches = command.clone().try_get_matches_from(argv).context("the command line")?;
    let mut out = vec!["waku".to_owned()];
    let (mut leaf_command, mut leaf) = (&command, &matches);
    while let Some((name, sub)) = leaf.subcommand() {
        out.push(name.to_owned());
        leaf_command = leaf_command.find_subcommand(name).context("a subcommand")?;
        leaf = sub;
    }
    let is_path =
        |arg: &clap::Arg| arg.get_value_parser().type_id() == clap::builder::ValueParser::path_buf().type_id();
    let utf8 = |value: OsString| {
        value.into_string().map_err(|value| anyhow::anyhow!("`{}` is not UTF-8", value.to_string_lossy()))
    };
    let mut typed = Vec::new();
    let mut text = |value: &std::ffi::OsStr, arg: &clap::Arg| -> Result<String> {
        if !is_path(arg) || value == "-" {
            return utf8(value.to_owned());
        }
        let absolute = utf8(cwd.join(value).into_os_string())?;
        let as_typed = utf8(value.to_owned())?;
        if absolute != as_typed {
            typed.push((printable(&absolute).into_owned(), printable(&as_typed).into_owned()));
        }
        Ok(absolute)
    };
    let mut positionals = Vec::new();
    for arg in leaf_command.get_arguments().filter(|arg| !arg.is_global_set()) {
        let id = arg.get_id().as_str();
        let from_line = leaf.value_source(id) == Some(ValueSource::CommandLine);
        let default_path = leaf.value_source(id) == Some(ValueSource::DefaultValue) && is_path(arg);
        let long = arg.get_long();
        if !(from_line || default_path) || long.is_some_and(|long| drop.contains(&long)) {
            continue;
        }
        if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
            if leaf.get_flag(id) {
                out.push(format!("--{}", long.context("a switch has a long name")?));
            }
            continue;
        }
        let values: Vec<String> = match leaf.get_raw(id) {
            Some(raw) => raw.map(|value| text(value, arg)).collect::<Result<_>>()?,
            None => continue,
        };
        if arg.is_positional() {
            positionals.push((arg.get_index().unwrap_or(usize::MAX), values));
            continue;
        }
        let long = long.with_context(|| format!("`{id}` has no long name"))?;
        match arg.get_value_delimiter() {
            Some(delimiter) => out.push(format!("--{long}={}", values.join(&delimiter.to_string()))),
            None => out.extend(values.iter().map(|value| format!("--{long}={value}"))),
        }
    }
    positionals.sort_by_key(|(index, _)| *index);
    if !positionals.is_empty() {
        out.push("--".to_owned());
        out.extend(positionals.into_iter().flat_map(|(_, values)| values));
    }
    // The longest first: a path that begins another is put back after it.
    typed.sort_by_key(|(absolute, _): &(String, String)| std::cmp::Reverse(absolute.len()));
    typed.dedup();
    // Its messages name the paths as typed, as the command alone does; its
    // result too, but a result that shows what the log or state holds is
    // left as it came.
    let shows_data = out.get(1).is_some_and(|command| ["topic", "state", "dlq"].contains(&command.as_str()));
    Ok((out, AsTyped { typed, in_results: !shows_data }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_forwarded_command_line_has_absolute_paths_and_parses_as_the_original() {
        let cwd = Path::new("/home/ann/shop");
        let (argv, paths) = absolute_argv(
            &os(&["waku", "publish", "--topic", "carts", "--module", "m.wasm", "--partitions=2", "events.jsonl"]),
            cwd,
            &[],
        )
        .unwrap();
        assert_eq!(
            argv,
            [
                "waku",
                "publish",
                "--data=/home/ann/shop/waku-data",
                "--topic=carts",
                "--module=/home/ann/shop/m.wasm",
                "--partitions=2",
                "--",
                "/home/ann/shop/events.jsonl"
            ]
        );
        let message = "waku: error: reading /home/ann/shop/events.jsonl: no such file\n  in /home/ann/shop/waku-data\n";
        assert_eq!(
            paths.put_back(message.as_bytes().to_vec()),
            b"waku: error: reading events.jsonl: no such file\n  in waku-data\n"
        );
        assert_eq!(paths.put_back(vec![0xff, b'/']), [0xff, b'/'], "not UTF-8: as it came");
        let (stdin, paths) =
            absolute_argv(&os(&["waku", "publish", "--topic", "t", "--module", "/m.wasm", "-"]), cwd, &[]).unwrap();
        assert!(!paths.typed.iter().any(|(_, typed)| typed == "/m.wasm" || typed == "-"), "{:?}", paths.typed);
        assert_eq!(stdin.last().map(String::as_str), Some("-"));
        let (list, _) = absolute_argv(
            &os(&["waku", "dlq", "redrive", "--projection", "p", "--topic", "t", "--record", "0:1,1:2"]),
            cwd,
            &[],
        )
        .unwrap();
        assert!(list.contains(&"--record=0:1,1:2".to_owned()), "{list:?}");
        let (admin, _) = absolute_argv(
            &os(&["waku", "status", "--projection", "p", "--topic", "t", "--admin", "127.0.0.1:1"]),
            cwd,
            &["admin"],
        )
        .unwrap();
        assert!(!admin.iter().any(|arg| arg.starts_with("--admin")), "{admin:?}");
        use clap::Parser;
        for argv in [argv, stdin, list, admin] {
            super::super::Cli::try_parse_from(&argv).unwrap_or_else(|error| panic!("{argv:?}: {error}"));
        }
    }

    #[test]
    fn a_frame_the_host_never_writes_is_an_error_never_a_panic_or_a_huge_allocation() {
        for frame in [Frame::Accepted, Frame::Out(b"x".to_vec()), Frame::Heartbeat, Frame::Exit(3)] {
            assert_eq!(Frame::read(&mut frame.encode().as_slice()).unwrap(), frame);
        }
        for bytes in [&b"Z\0\0\0\0"[..], b"O\xff\xff\xff\xff", b"X\0\0\0\x02ab", b"O\0\0\0\x09short", b"", b"A"] {
            assert!(Frame::read(&mut &bytes[..]).is_err(), "{bytes:?}");
        }
        assert!(read_request(&mut &b"\xff\xff\xff\xff"[..]).is_err());
        assert!(read_request(&mut &b"\0\0\0\x03abc"[..]).is_err());
    }
}
