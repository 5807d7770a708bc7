//! The admin endpoint: health, readiness, metrics and a look at modules,
//! state and progress over HTTP, for operators and their tools.
//!
//! | route | answer |
//! | --- | --- |
//! | `GET /health` | 200 while the process serves requests |
//! | `GET /ready` | 503 until the projection is caught up ([`crate::engine::progress`]) and while the log is unreachable, else 200 |
//! | `GET /metrics` | every metric of [`crate::engine::metrics`], in the Prometheus (OpenMetrics) text format |
//! | `GET /modules` | the running modules, their event types, kept versions and the last reload of each file (JSON) |
//! | `GET /state/{projection}/{key}` | a page of a key's state entries and the first counters (JSON, [`view::KeyView`]); the key in its text form, URL-encoded (`42`, `%22ann%22`); `?after=<name>&limit=<n>` for the next page, `?entry=<name>` for one entry |
//! | `GET /state/{projection}/counters` | a page of the projection's counters (JSON, [`view::CountersView`]); `?after=<name>&limit=<n>` |
//! | `GET /shadow/{projection}/{key}`, `GET /shadow/{projection}/counters` | the same from the shadow of the rebuild under way ([`crate::operations::rebuild`]); 404 without one |
//! | `GET /status` | what `waku status` prints: per partition position, start-up end, current end, lag; versions; counts; a rebuild's phase and distance to promotion (JSON) |
//! | `/console`, `/console/…` | the operator console in the browser, its JSON views and actions ([`console`]) |
//!
//! **Who may ask.** With a token ([`AdminToken`]) every route but
//! `/health` and `/ready` (which probes call without credentials) answers
//! only a request carrying `Authorization: Bearer <token>` (the admin
//! token, or the read-only token, [`Admin::read_token`], which these
//! routes take too, as they only read); any other
//! gets a 401 with `WWW-Authenticate: Bearer` and a body that says nothing
//! about the host or the token. Tokens are compared in constant time
//! ([`subtle`]), so the time of an answer tells nothing of how much of a
//! guess was right. Without a token the endpoint is open, which the host
//! allows on a loopback address only unless told otherwise
//! ([`crate::operations::host::HostSettings::admin_insecure`]).
//!
//! **Over TLS** when given a certificate and key ([`AdminTls`],
//! `--admin-tls-cert`/`--admin-tls-key`): every connection is TLS, the
//! handshake made by the connection's first read, so a slow client holds
//! only its own connection (within the same timeouts), never the accept
//! loop.
//!
//! Rules it keeps: it only reads (nothing here changes state or modules),
//! but for the console's actions, which need the admin token and a
//! same-origin request ([`console`]);
//! bad input is a 4xx naming the problem; the log is asked for end offsets
//! at request time, so lag is current. No answer grows with what modules
//! wrote: state is shown a page at a time ([`view`]), so a projection of
//! many counters or a key of many large entries costs a request no more
//! than a page. Clients cannot hold the host's resources, nor keep
//! `/health` and `/ready` from answering ([`slots`]): a newcomer is
//! always admitted, and its first request is answered before any later
//! arrival can close it (within [`NEWCOMER_GRACE`]); at most
//! [`MAX_CONNECTIONS`] settled connections (answered once, or older than
//! the grace) are open, at most [`MAX_CONNECTIONS_PER_PEER`] from one
//! address, and as many newcomers apart; past a bound, connections that
//! wait for their clients make room (idle ones first, the peer holding
//! the most first); a connection that
//! moves no byte either way for [`IDLE_TIMEOUT`] is closed (a request sent
//! a byte at a time, or a reader that stopped reading, held its
//! connection, its memory and a file forever), and so is one whose request
//! is not answered within [`REQUEST_DEADLINE`] of its first byte (a byte
//! every 20 s kept a connection forever). Every value an error answer
//! echoes (a path's decoded parts, a query) is written through
//! [`wakuwaku_core::terminal::printable`]: no control, bidi or invisible
//! character reaches whoever reads the answer raw.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;

use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::engine::metrics::Metrics;
use crate::engine::progress::Progress;
use crate::engine::projection::Projection;
use crate::key::Key;
use crate::operations::lifecycle::Library;
use crate::operations::rebuild::RebuildWatch;
use crate::operations::rebuild::conductor::RebuildStatus;
use crate::storage::log::EventLog;
use crate::storage::state::StateStore;
use crate::storage::stats::Stat;

pub mod console;
mod slots;
pub mod view;
pub use slots::{MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER, NEWCOMER_GRACE};
pub use view::counter_json;

/// What the endpoint serves from.
pub struct Admin<L> {
    /// The log (for current end offsets).
    pub log: Arc<L>,
    /// The projection.
    pub projection: Arc<Projection>,
    /// Its consumer's caught-up gate.
    pub progress: Arc<Progress>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// Its module versions, when it has a library.
    pub library: Option<Arc<Library>>,
    /// Its rebuilds' progress, when it can rebuild ([`crate::operations::rebuild`]).
    pub rebuild: Option<Arc<RebuildWatch>>,
    /// The token every route but `/health` and `/ready` asks for; `None`:
    /// every route is open.
    pub token: Option<AdminToken>,
    /// A token that may only look: every route that reads, and the
    /// console's pages and views, but none of its actions. `None`: only
    /// `token` is taken.
    pub read_token: Option<AdminToken>,
    /// What its release stages show, for a projection over several topics
    /// ([`crate::engine::consumer::TimingBoard`]).
    pub timing: Option<Arc<crate::engine::consumer::TimingBoard>>,
}

/// The bearer token that protects the endpoint. Its text never shows in
/// `Debug` or in an error.
#[derive(Clone)]
pub struct AdminToken(String);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(****)")
    }
}

/// Why a token could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminTokenError {
    /// The token file could not be read.
    #[error("cannot read the admin token file {}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The token file holds no token (or only white space).
    #[error("the admin token file {} is empty", path.display())]
    Empty {
        /// The file.
        path: std::path::PathBuf,
    },
    /// The token holds a character an HTTP header cannot carry.
    #[error("the admin token from {origin} holds a character an HTTP header cannot carry (use printable ASCII)")]
    Unprintable {
        /// Where it came from (a file, or the environment variable),
        /// never the token.
        origin: String,
    },
}

impl AdminToken {
    /// The token `text` from `origin` (said in errors instead of the
    /// token), a trailing newline trimmed; `None` when nothing is left.
    pub fn new(text: &str, origin: &str) -> Result<Option<Self>, AdminTokenError> {
        let token = text.trim_end_matches(['\n', '\r']);
        if token.trim().is_empty() {
            return Ok(None);
        }
        if !token.bytes().all(|byte| byte.is_ascii_graphic() || byte == b' ') {
            return Err(AdminTokenError::Unprintable { origin: origin.to_owned() });
        }
        Ok(Some(Self(token.to_owned())))
    }

    /// The token held by the file at `path`; an empty file is an error
    /// naming it.
    pub fn from_file(path: &std::path::Path) -> Result<Self, AdminTokenError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| AdminTokenError::Read { path: path.to_owned(), source })?;
        Self::new(&text, &format!("file {}", path.display()))?
            .ok_or_else(|| AdminTokenError::Empty { path: path.to_owned() })
    }

    /// The token's text, to send it.
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is the token, compared in constant time (for
    /// tokens of one length).
    pub fn matches(&self, presented: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        self.0.as_bytes().ct_eq(presented).into()
    }
}

/// The certificate and key the endpoint serves TLS with. `Debug` names
/// the certificate file, never the key.
#[derive(Clone)]
pub struct AdminTls {
    config: Arc<rustls::ServerConfig>,
    certificate: std::path::PathBuf,
}

impl std::fmt::Debug for AdminTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AdminTls").field(&self.certificate).finish()
    }
}

impl AdminTls {
    /// The chain in the PEM file `certificate` with the key in `key`
    /// (read now; a key file its group or others may read draws a
    /// warning).
    pub fn from_files(
        certificate: &std::path::Path,
        key: &std::path::Path,
    ) -> Result<Self, crate::platform::tls::TlsError> {
        let mut config = crate::platform::tls::server_config(certificate, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self { config: Arc::new(config), certificate: certificate.to_owned() })
    }
}

/// Lets `request` through when the endpoint has no token or the request
/// carries one of them (every route it guards only reads); otherwise a
/// 401 that reveals nothing.
async fn require_token<L: EventLog>(State(admin): State<Arc<Admin<L>>>, request: Request, next: Next) -> Response {
    if admin.token.is_none() && admin.read_token.is_none() {
        return next.run(request).await;
    }
    let presented =
        request.headers().get(header::AUTHORIZATION).and_then(|value| value.as_bytes().strip_prefix(b"Bearer "));
    let matches = |token: &Option<AdminToken>, presented: &[u8]| token.as_ref().is_some_and(|t| t.matches(presented));
    // Both compared, so the time says nothing of which matched.
    if presented.is_some_and(|presented| matches(&admin.token, presented) | matches(&admin.read_token, presented)) {
        next.run(request).await
    } else {
        (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], "unauthorized\n").into_response()
    }
}

/// Serves the endpoint on `listener` until `shutdown` resolves, over TLS
/// with `tls`.
pub async fn serve<L: EventLog>(
    listener: tokio::net::TcpListener,
    admin: Admin<L>,
    tls: Option<AdminTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let admin = Arc::new(admin);
    let console = console::router(admin.clone(), tls.is_some());
    let protected = Router::new()
        .route("/metrics", get(metrics::<L>))
        .route("/modules", get(modules::<L>))
        .route("/state/{projection}/counters", get(counters::<L>))
        .route("/shadow/{projection}/counters", get(shadow_counters::<L>))
        .route("/state/{projection}/{key}", get(state::<L>))
        .route("/shadow/{projection}/{key}", get(shadow_state::<L>))
        .route("/status", get(status_route::<L>))
        .route_layer(axum::middleware::from_fn_with_state(admin.clone(), require_token::<L>));
    let router = Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route("/ready", get(ready::<L>))
        .merge(protected)
        .with_state(admin)
        .merge(console)
        .layer(axum::middleware::map_response(escape_echoes));
    let listener = Capped {
        listener,
        slots: Arc::new(slots::Slots::default()),
        tls: tls.map(|tls| tokio_rustls::TlsAcceptor::from(tls.config)),
    };
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await
}

/// How long a connection may move no byte before it is closed.
pub const IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long after the first byte of a request its answer must start, or
/// the connection is closed: a client sending its request a byte at a
/// time, within the idle timeout, held its connection for as long as it
/// liked, and 64 of them kept `/health` from answering.
pub const REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// A listener that gives each connection a slot ([`slots`]), closing
/// another to make room when the bounds are reached.
struct Capped {
    listener: tokio::net::TcpListener,
    slots: Arc<slots::Slots>,
    /// Makes every connection's TLS handshake, when serving TLS.
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl axum::serve::Listener for Capped {
    type Io = AdminStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (AdminStream, SocketAddr) {
        let (stream, address) = axum::serve::Listener::accept(&mut self.listener).await;
        let slot = self.slots.admit(address.ip());
        let idle = Box::pin(tokio::time::sleep(IDLE_TIMEOUT));
        let connection = Connection { stream, idle, answer_by: None, carrying: self.tls.is_none(), slot };
        let stream = match &self.tls {
            None => AdminStream::Plain(connection),
            Some(acceptor) => AdminStream::Handshaking(Box::new(acceptor.accept(connection))),
        };
        (stream, address)
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// An accepted connection: it holds its slot until it is dropped, and
/// fails once it has moved no byte for [`IDLE_TIMEOUT`], once a request
/// has waited [`REQUEST_DEADLINE`] since its first byte without its answer
/// starting, or once a newcomer displaced it.
struct Connection {
    stream: tokio::net::TcpStream,
    /// Fires at the idle timeout or the request's deadline, whichever is
    /// first.
    idle: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// The deadline of a request read in part or whole and not answered.
    answer_by: Option<tokio::time::Instant>,
    /// Whether it carries HTTP (plain, or TLS once the handshake is done),
    /// so that what it writes answers a request.
    carrying: bool,
    slot: slots::Slot,
}

impl Connection {
    /// Passes on what the stream did: progress re-arms the timer (`read`:
    /// bytes of a request came in; `wrote`: bytes of an answer went out),
    /// waiting past it is an error.
    fn watch<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: Poll<std::io::Result<T>>,
        read: bool,
        wrote: bool,
    ) -> Poll<std::io::Result<T>> {
        match polled {
            Poll::Ready(result) => {
                let now = tokio::time::Instant::now();
                if wrote {
                    self.answer_by = None;
                } else if read && self.answer_by.is_none() {
                    self.answer_by = Some(now + REQUEST_DEADLINE);
                }
                let idle = now + IDLE_TIMEOUT;
                self.idle.as_mut().reset(self.answer_by.map_or(idle, |deadline| deadline.min(idle)));
                // A TLS handshake's writes answer no request.
                let answered = wrote && self.carrying;
                let kept = match (read || wrote, self.answer_by) {
                    (false, _) => self.slot.wait(cx.waker()),
                    (true, None) => self.slot.record(slots::Phase::Idle, now, answered, cx.waker()),
                    // Ordered by deadline, which is by when the request began.
                    (true, Some(deadline)) => {
                        self.slot.record(slots::Phase::Requesting, deadline, answered, cx.waker())
                    }
                };
                match kept {
                    true => Poll::Ready(result),
                    false => Poll::Ready(Err(std::io::ErrorKind::ConnectionAborted.into())),
                }
            }
            Poll::Pending if !self.slot.wait(cx.waker()) => {
                Poll::Ready(Err(std::io::ErrorKind::ConnectionAborted.into()))
            }
            Poll::Pending => match self.idle.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::ErrorKind::TimedOut.into())),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl tokio::io::AsyncRead for Connection {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.stream).poll_read(cx, buf);
        let read = buf.filled().len() > before;
        self.watch(cx, polled, read, false)
    }
}

impl tokio::io::AsyncWrite for Connection {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.stream).poll_write(cx, buf);
        let wrote = matches!(polled, Poll::Ready(Ok(written)) if written > 0);
        self.watch(cx, polled, false, wrote)
    }

    fn poll_flush(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.stream).poll_flush(cx);
        self.watch(cx, polled, false, false)
    }

    fn poll_shutdown(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A connection as the endpoint serves it: plain, or TLS once its
/// handshake (driven by the first read or write) is done.
enum AdminStream {
    Plain(Connection),
    Handshaking(Box<tokio_rustls::Accept<Connection>>),
    Tls(Box<tokio_rustls::server::TlsStream<Connection>>),
    /// The handshake failed; the connection only fails from now on.
    Failed,
}

impl AdminStream {
    /// Drives the handshake; ready once the stream can carry bytes.
    fn handshake(&mut self, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<()>> {
        let AdminStream::Handshaking(accept) = self else {
            return match self {
                AdminStream::Failed => Poll::Ready(Err(std::io::ErrorKind::NotConnected.into())),
                _ => Poll::Ready(Ok(())),
            };
        };
        match std::pin::Pin::new(&mut **accept).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(mut stream)) => {
                stream.get_mut().0.carrying = true;
                *self = AdminStream::Tls(Box::new(stream));
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => {
                *self = AdminStream::Failed;
                Poll::Ready(Err(error))
            }
        }
    }
}

/// `$poll` on the stream `$this` carries bytes on, once its handshake is done.
macro_rules! carried {
    ($this:ident, $cx:ident, $stream:ident => $poll:expr) => {{
        let this = $this.get_mut();
        std::task::ready!(this.handshake($cx))?;
        match this {
            AdminStream::Plain($stream) => $poll,
            AdminStream::Tls($stream) => {
                let $stream = &mut **$stream;
                $poll
            }
            AdminStream::Handshaking(_) | AdminStream::Failed => {
                Poll::Ready(Err(std::io::ErrorKind::NotConnected.into()))
            }
        }
    }};
}

impl tokio::io::AsyncRead for AdminStream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        carried!(self, cx, stream => std::pin::Pin::new(stream).poll_read(cx, buf))
    }
}

impl tokio::io::AsyncWrite for AdminStream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        carried!(self, cx, stream => std::pin::Pin::new(stream).poll_write(cx, buf))
    }

    fn poll_flush(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<()>> {
        carried!(self, cx, stream => std::pin::Pin::new(stream).poll_flush(cx))
    }

    fn poll_shutdown(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<()>> {
        carried!(self, cx, stream => std::pin::Pin::new(stream).poll_shutdown(cx))
    }
}

/// The most bytes of an error answer's body [`escape_echoes`] reads; the
/// endpoint's own are one line.
const ECHO_BODY_LIMIT: usize = 64 << 10;

/// A 4xx answer in plain text (the endpoint's own, and the router's
/// rejections) with every hidden character of its body escaped
/// ([`wakuwaku_core::terminal::printable`]), its final line break kept:
/// such bodies echo the request's decoded path and query.
async fn escape_echoes(response: Response) -> Response {
    let plain =
        response.headers().get(header::CONTENT_TYPE).is_some_and(|kind| kind.as_bytes().starts_with(b"text/plain"));
    if !response.status().is_client_error() || !plain {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = match axum::body::to_bytes(body, ECHO_BODY_LIMIT).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(_) => String::from("the answer was too long to show\n"),
    };
    let (line, end) = match text.strip_suffix('\n') {
        Some(line) => (line, "\n"),
        None => (text.as_str(), ""),
    };
    let escaped = format!("{}{end}", wakuwaku_core::terminal::printable(line));
    let mut response = Response::from_parts(parts, axum::body::Body::from(escaped));
    response.headers_mut().remove(header::CONTENT_LENGTH);
    response
}

/// Binds the endpoint's address, with an error that names it.
pub async fn bind(address: SocketAddr) -> Result<tokio::net::TcpListener, std::io::Error> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {address}: {e}")))
}

async fn ready<L: EventLog>(State(admin): State<Arc<Admin<L>>>) -> Response {
    if !admin.progress.log_available() {
        (StatusCode::SERVICE_UNAVAILABLE, "the log is unavailable; reconnecting\n").into_response()
    } else if admin.progress.caught_up() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        let (done, total) = admin.progress.replayed();
        (StatusCode::SERVICE_UNAVAILABLE, format!("catching up: {done} of {total} events replayed\n")).into_response()
    }
}

async fn metrics<L: EventLog>(State(admin): State<Arc<Admin<L>>>) -> Response {
    admin.metrics.set_failovers(admin.projection.name(), admin.log.failovers());
    let topic = admin.projection.topic();
    for partition in admin.progress.partitions() {
        if let Ok(end) = admin.log.end_offset(topic, partition.partition).await {
            admin.metrics.set_lag(admin.projection.name(), partition.partition, end.saturating_sub(partition.position));
        }
    }
    // The store blocks (a PostgreSQL query, a file read): off the runtime.
    let store = admin.projection.store().clone();
    if let Ok(Ok(timers)) = tokio::task::spawn_blocking(move || store.timer_summary(None)).await {
        admin.metrics.set_timers(admin.projection.name(), timers.pending, timers.next_at);
    }
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], admin.metrics.encode()).into_response()
}

/// One running module, for `/modules`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ModuleView {
    /// Its name.
    pub name: String,
    /// Its running version.
    pub version: String,
    /// Its event types: (tag, name, algebra, max batch).
    pub event_types: Vec<(u32, String, String, u32)>,
    /// The versions kept for rollback, newest first.
    pub kept: Vec<String>,
}

/// What `/modules` answers.
#[derive(Debug, Serialize, Deserialize)]
pub struct ModulesView {
    /// The running modules.
    pub running: Vec<ModuleView>,
    /// The last reload attempt of each module file: its version, and the
    /// error if it was refused.
    pub reloads: BTreeMap<String, (String, Option<String>)>,
}

async fn modules<L: EventLog>(State(admin): State<Arc<Admin<L>>>) -> Response {
    let recorded = admin.library.as_ref().and_then(|library| library.recorded().ok()).unwrap_or_default();
    let running = admin
        .projection
        .modules()
        .iter()
        .map(|m| ModuleView {
            name: m.name().to_owned(),
            version: m.version().to_owned(),
            event_types: m
                .event_types()
                .iter()
                .map(|t| (t.tag.get(), t.name.clone(), t.algebra.name().to_owned(), t.max_batch))
                .collect(),
            kept: recorded.kept.get(m.name()).cloned().unwrap_or_default(),
        })
        .collect();
    let reloads = admin
        .library
        .as_ref()
        .map(|library| library.reloads().into_iter().map(|(name, r)| (name, (r.version, r.error))).collect())
        .unwrap_or_default();
    Json(ModulesView { running, reloads }).into_response()
}

async fn state<L: EventLog>(
    State(admin): State<Arc<Admin<L>>>,
    Path((projection, key)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    key_state_response(&admin, &projection, &key, query.as_deref(), Some(admin.projection.store().clone()))
}

async fn shadow_state<L: EventLog>(
    State(admin): State<Arc<Admin<L>>>,
    Path((projection, key)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let shadow = admin.rebuild.as_ref().and_then(|watch| watch.shadow());
    key_state_response(&admin, &projection, &key, query.as_deref(), shadow)
}

async fn counters<L: EventLog>(
    State(admin): State<Arc<Admin<L>>>,
    Path(projection): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    counters_response(&admin, &projection, query.as_deref(), Some(admin.projection.store().clone()))
}

async fn shadow_counters<L: EventLog>(
    State(admin): State<Arc<Admin<L>>>,
    Path(projection): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let shadow = admin.rebuild.as_ref().and_then(|watch| watch.shadow());
    counters_response(&admin, &projection, query.as_deref(), shadow)
}

/// The store of `projection` (`None`: no rebuild under way), if this host
/// runs it; otherwise the 404 that says why not.
fn store_of<L>(admin: &Admin<L>, projection: &str, store: Option<StateStore>) -> Result<StateStore, NotHere> {
    if projection != admin.projection.name() {
        return Err(NotHere(format!(
            "no projection `{projection}` here (this host runs `{}`)\n",
            admin.projection.name()
        )));
    }
    store.ok_or_else(|| NotHere(format!("no rebuild of `{projection}` is under way\n")))
}

/// A 404 and why.
struct NotHere(String);

impl IntoResponse for NotHere {
    fn into_response(self) -> Response {
        (StatusCode::NOT_FOUND, self.0).into_response()
    }
}

/// A page of a key's state in `store`, for the projection this host runs.
fn key_state_response<L>(
    admin: &Admin<L>,
    projection: &str,
    key: &str,
    query: Option<&str>,
    store: Option<StateStore>,
) -> Response {
    let store = match store_of(admin, projection, store) {
        Ok(store) => store,
        Err(not_here) => return not_here.into_response(),
    };
    let key = match Key::parse_text(key) {
        Ok(key) => key,
        Err(error) => return (StatusCode::BAD_REQUEST, format!("`{key}`: {error}\n")).into_response(),
    };
    let parameters = view::parse_query(query, &["after", "limit", "entry"], "after, limit and entry");
    let (parameters, page) = match parameters.and_then(|parameters| Ok((view::page_of(&parameters)?, parameters))) {
        Ok((page, parameters)) => (parameters, page),
        Err(error) => return (StatusCode::BAD_REQUEST, format!("{error}\n")).into_response(),
    };
    match view::key_view(&store, &key, parameters.get("entry").map(String::as_str), &page) {
        Ok(view) => Json(view).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response(),
    }
}

/// A page of the counters in `store`, for the projection this host runs.
fn counters_response<L>(
    admin: &Admin<L>,
    projection: &str,
    query: Option<&str>,
    store: Option<StateStore>,
) -> Response {
    let store = match store_of(admin, projection, store) {
        Ok(store) => store,
        Err(not_here) => return not_here.into_response(),
    };
    let page = view::parse_query(query, &["after", "limit"], "after and limit").and_then(|p| view::page_of(&p));
    let page = match page {
        Ok(page) => page,
        Err(error) => return (StatusCode::BAD_REQUEST, format!("{error}\n")).into_response(),
    };
    match view::counters_view(&store, &page) {
        Ok(view) => Json(view).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response(),
    }
}

async fn status_route<L: EventLog>(State(admin): State<Arc<Admin<L>>>) -> Response {
    let live = LiveStatus {
        progress: Some(admin.progress.clone()),
        timing: admin.timing.clone(),
        rebuild: admin.rebuild.clone(),
    };
    match running_status(&*admin.log, &admin.projection, &live).await {
        Ok(status) => Json(status).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response(),
    }
}

/// What only a running host knows about where its projection stands: the
/// caught-up gate (start-up end offsets, events redone), the release
/// stages' clocks (a projection over several topics) and the rebuild under
/// way. `/status`, [`crate::operations::host::RunningHost::status`] and a `waku status`
/// the host runs for another process all build their answer with it in
/// [`running_status`], so the three show the same figures.
#[derive(Debug, Clone, Default)]
pub struct LiveStatus {
    /// The consumer's caught-up gate.
    pub progress: Option<Arc<Progress>>,
    /// Its release stages' board.
    pub timing: Option<Arc<crate::engine::consumer::TimingBoard>>,
    /// Its rebuilds' progress.
    pub rebuild: Option<Arc<RebuildWatch>>,
}

/// The status of the running `projection` (its topics, its modules as they
/// run, its store) with what the running host knows ([`LiveStatus`]).
pub async fn running_status<L: EventLog>(
    log: &L,
    projection: &Projection,
    live: &LiveStatus,
) -> Result<Status, crate::engine::consumer::ConsumerError> {
    let versions = projection.modules().iter().map(|m| (m.name().to_owned(), m.version().to_owned())).collect();
    let (name, topics, store) = (projection.name(), projection.topics(), projection.store());
    let status = status_of_topics(log, name, topics, store, live.progress.as_deref(), versions).await?;
    Ok(Status {
        rebuild: live.rebuild.as_ref().and_then(|watch| watch.get()),
        event_time: live.timing.as_ref().map(|timing| timing.snapshot()).unwrap_or_default(),
        ..status
    })
}

/// One partition in a [`Status`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionStatus {
    /// The partition.
    pub partition: u32,
    /// The committed position.
    pub position: u64,
    /// The end offset when the running consumer started (unknown offline).
    pub end_at_start: Option<u64>,
    /// The end offset now.
    pub end: u64,
    /// `end - position`.
    pub lag: u64,
    /// Whether the position reached the start-up end (offline: the end),
    /// and no lost tail stopped it.
    pub caught_up: bool,
    /// The first offset the log still holds: above 0 when retention deleted
    /// the oldest messages ([`crate::storage::log::loss::lost_history`]).
    #[serde(default)]
    pub first: u64,
    /// The lost tail recorded for the partition, in words
    /// ([`crate::storage::log::loss::Truncation`]), if the log ever lost one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<String>,
    /// Whether that lost tail stopped the partition (it lost offsets the
    /// projection applied): it stays stopped until `waku reset`.
    #[serde(default)]
    pub stopped: bool,
    /// For a projection over several topics, this partition of each of
    /// them, in the projection's order (the figures above are their sums);
    /// left out of the JSON for a projection of one topic.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topics: Vec<TopicPartitionStatus>,
}

/// One topic's partition of a [`PartitionStatus`] over several topics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicPartitionStatus {
    /// The topic.
    pub topic: String,
    /// The committed position in it.
    pub position: u64,
    /// The first offset the log still holds.
    pub first: u64,
    /// Its end offset now.
    pub end: u64,
    /// `end - position`.
    pub lag: u64,
}

/// What `waku status` shows about one projection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The projection.
    pub projection: String,
    /// Its topic.
    pub topic: String,
    /// Every partition of the topic.
    pub partitions: Vec<PartitionStatus>,
    /// Module name → running (or recorded) version.
    pub modules: BTreeMap<String, String>,
    /// Events applied.
    pub applied: u64,
    /// Events skipped.
    pub skipped: u64,
    /// Events waiting in retry.
    pub retrying: u64,
    /// Events dead-lettered, in all (those re-driven since among them).
    pub dead_lettered: u64,
    /// Dead-lettered events re-driven since (`waku dlq redrive`): so
    /// `applied + skipped + retrying + dead_lettered - redriven` is every
    /// event consumed.
    #[serde(default)]
    pub redriven: u64,
    /// Emitted messages dead-lettered because they could never be delivered.
    #[serde(default)]
    pub undeliverable: u64,
    /// Outbox records committed but not yet appended to the log.
    #[serde(default)]
    pub outbox: u64,
    /// Events the running host processed for nothing since it started:
    /// their batch's commit was refused because another host took the
    /// partition (`waku_events_redone_total`; 0 when read from the files).
    #[serde(default)]
    pub redone: u64,
    /// The last rebuild the running host ran: its phase and distance to
    /// promotion ([`crate::operations::rebuild`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild: Option<RebuildStatus>,
    /// The topics it consumes after `topic`, co-partitioned with it; for
    /// such a projection each partition's position and end are summed over
    /// the topics.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_topics: Vec<String>,
    /// Late events: read after the clock passed their event time, applied
    /// at once, out of event-time order (projections over several topics);
    /// left out of the JSON while there are none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub order_violations: u64,
    /// The running host's release stages, per partition index: clock,
    /// watermark lag, held events and bytes, each input's clock and
    /// whether it is idle (projections over several topics).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_time: Vec<crate::engine::consumer::PartitionTiming>,
    /// The log's servers when it is a replicated cluster: each node, which
    /// one leads, the one this host dialled and its failovers
    /// ([`EventLog::nodes`]); left out of the JSON for one server or the
    /// embedded log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_nodes: Option<crate::storage::log::LogNodes>,
    /// Timers waiting for the projection's clock (`docs/timers.md`);
    /// left out of the JSON while there are none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub timers_pending: u64,
    /// The earliest time among them, ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_timer_ms: Option<i64>,
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}

/// The status of a projection from its state and the log; with the running
/// consumer's `progress`, readiness uses its start-up end offsets.
pub async fn status<L: EventLog>(
    log: &L,
    projection: &str,
    topic: &str,
    store: &StateStore,
    progress: Option<&Progress>,
    modules: BTreeMap<String, String>,
) -> Result<Status, crate::engine::consumer::ConsumerError> {
    status_of_topics(log, projection, &[topic.to_owned()], store, progress, modules).await
}

/// [`status`] of a projection over `topics` (the first names it): each
/// partition index's position and end are summed over the topics, as the
/// caught-up gate counts them, and given per topic beside
/// ([`PartitionStatus::topics`]).
pub async fn status_of_topics<L: EventLog>(
    log: &L,
    projection: &str,
    topics: &[String],
    store: &StateStore,
    progress: Option<&Progress>,
    modules: BTreeMap<String, String>,
) -> Result<Status, crate::engine::consumer::ConsumerError> {
    let topic = topics[0].as_str();
    let gate = progress.map(Progress::partitions).unwrap_or_default();
    let mut partitions = Vec::new();
    for partition in 0..log.partitions(topic).await? {
        let mut per_topic = Vec::with_capacity(topics.len());
        for each in topics {
            let position = store.position(each, partition)?.unwrap_or(0);
            let (first, end) = log.extent(each, partition).await?;
            let lag = end.saturating_sub(position);
            per_topic.push(TopicPartitionStatus { topic: each.clone(), position, first, end, lag });
        }
        let position = per_topic.iter().map(|each| each.position).sum();
        let end = per_topic.iter().map(|each| each.end).sum();
        let first = per_topic[0].first;
        if topics.len() == 1 {
            per_topic.clear();
        }
        let end_at_start = gate.iter().find(|p| p.partition == partition).map(|p| p.end_at_start);
        // Recorded by the consumer; offline, an end below the position is
        // one the consumer will stop at.
        let truncation = crate::storage::log::loss::recorded(store, topic, partition)?
            .or_else(|| crate::storage::log::loss::Truncation::detect(topic, partition, position, position, end));
        let stopped = truncation.as_ref().is_some_and(crate::storage::log::loss::Truncation::applied_lost);
        partitions.push(PartitionStatus {
            partition,
            position,
            end_at_start,
            end,
            lag: end.saturating_sub(position),
            caught_up: !stopped && position >= end_at_start.unwrap_or(end),
            first,
            truncated: truncation.map(|truncation| truncation.to_string()),
            stopped,
            topics: per_topic,
        });
    }
    let stats = store.stats()?;
    let timers = store.timer_summary(None)?;
    Ok(Status {
        projection: projection.to_owned(),
        topic: topic.to_owned(),
        partitions,
        modules,
        applied: stats[Stat::Applied],
        skipped: stats[Stat::Skipped],
        retrying: stats.retrying(),
        dead_lettered: stats[Stat::DeadLettered],
        redriven: stats[Stat::Redriven],
        undeliverable: stats[Stat::Undeliverable],
        outbox: store.outbox()?.len() as u64,
        redone: progress.map_or(0, Progress::redone),
        rebuild: None,
        more_topics: topics[1..].to_vec(),
        order_violations: stats[Stat::OrderViolations],
        event_time: Vec::new(),
        log_nodes: log.nodes().await?,
        timers_pending: timers.pending,
        next_timer_ms: timers.next_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_trimmed_of_its_newline_and_matches_only_itself() {
        let token = AdminToken::new("s3cret\n", "test").unwrap().unwrap();
        assert!(token.matches(b"s3cret"));
        for wrong in [&b"s3cre"[..], b"s3cret\n", b"s3creT", b"", b"s3cret-and-more"] {
            assert!(!token.matches(wrong), "{wrong:?}");
        }
        assert!(AdminToken::new("\n", "test").unwrap().is_none());
        assert!(!format!("{token:?}").contains("s3cret"));
        let refused = AdminToken::new("a\u{7}b", "test").unwrap_err().to_string();
        assert!(!refused.contains("a\u{7}b"), "{refused}");
    }

    #[test]
    fn an_empty_token_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "\n").unwrap();
        let error = AdminToken::from_file(&path).unwrap_err().to_string();
        assert!(error.contains(&path.display().to_string()) && error.contains("empty"), "{error}");
    }
}
