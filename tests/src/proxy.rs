//! TCP proxies: one that can cut every connection and refuse new ones for a
//! while (a server that goes away, as its clients see it, without touching
//! the server), and one that adds latency and counts round trips (a server
//! across a network).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::JoinSet;

/// Forwards connections from a local port to `upstream`.
pub struct CuttableProxy {
    port: u16,
    refusing: Arc<AtomicBool>,
    connections: Arc<Mutex<JoinSet<()>>>,
    listener: tokio::task::JoinHandle<()>,
}

impl CuttableProxy {
    /// Listens on an ephemeral local port and forwards to `upstream`
    /// (`host:port`).
    pub async fn start(upstream: String) -> std::io::Result<Self> {
        Self::start_at("127.0.0.1:0", upstream).await
    }

    /// Listens on `listen` (`host:port`) and forwards to `upstream`.
    pub async fn start_at(listen: &str, upstream: String) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let port = listener.local_addr()?.port();
        let refusing = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Mutex::new(JoinSet::new()));
        let (accept_refusing, accept_connections) = (refusing.clone(), connections.clone());
        let listener = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if accept_refusing.load(Ordering::SeqCst) {
                    continue; // Dropped at once: the "server" is down.
                }
                let upstream = upstream.clone();
                accept_connections.lock().await.spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        let (mut client, mut server) = (client, server);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Ok(Self { port, refusing, connections, listener })
    }

    /// `url` (`iggy://user:password@host:port?options`) pointed at this
    /// proxy instead.
    pub fn url_for(&self, url: &str) -> String {
        proxied(url, self.port)
    }

    /// Drops every open connection and refuses new ones for `down`.
    pub async fn cut_for(&self, down: Duration) {
        self.refusing.store(true, Ordering::SeqCst);
        self.connections.lock().await.abort_all();
        tokio::time::sleep(down).await;
        self.refusing.store(false, Ordering::SeqCst);
    }
}

/// Forwards connections from a local port to `upstream`, holding every
/// chunk `delay` in each direction before passing it on (so a round trip
/// costs twice `delay`; what is sent meanwhile is not held back), and
/// counts the client's turns: the times a client sent something after the
/// server had answered. A client that pipelines its queries takes one turn
/// per flight of them, one that waits for each answer one per query, so
/// the count is the round trips the client made, whatever the timing.
pub struct LatencyProxy {
    port: u16,
    turns: Arc<AtomicU64>,
    /// A runtime of its own: a host that blocks its runtime's threads on
    /// its store (as the consumer does between awaits) cannot hold back
    /// the answers it waits for.
    runtime: Option<tokio::runtime::Runtime>,
}

impl LatencyProxy {
    /// Listens on an ephemeral local port and forwards to `upstream`
    /// (`host:port`) with `delay` each way.
    pub fn start(upstream: String, delay: Duration) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("latency-proxy")
            .enable_all()
            .build()?;
        // Bound here, made a tokio listener on the proxy's runtime: this
        // may be called from inside another runtime, which cannot block on
        // this one.
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let turns = Arc::new(AtomicU64::new(0));
        let counted = turns.clone();
        runtime.spawn(async move {
            let Ok(listener) = TcpListener::from_std(listener) else { return };
            let mut connections = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, turns) = (upstream.clone(), counted.clone());
                connections.spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else { return };
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    // Whether the server spoke since the client last did;
                    // the first thing the client says is a turn too.
                    let answered = Arc::new(AtomicBool::new(true));
                    let turn = {
                        let answered = answered.clone();
                        move || {
                            if answered.swap(false, Ordering::SeqCst) {
                                turns.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    };
                    let spoke = move || answered.store(true, Ordering::SeqCst);
                    tokio::join!(
                        delayed(client_read, server_write, delay, turn),
                        delayed(server_read, client_write, delay, spoke),
                    );
                });
            }
        });
        Ok(Self { port, turns, runtime: Some(runtime) })
    }

    /// `url` (`postgres://user@host:port/db`) pointed at this proxy instead.
    pub fn url_for(&self, url: &str) -> String {
        proxied(url, self.port)
    }

    /// The client turns counted so far, over every connection.
    pub fn turns(&self) -> u64 {
        self.turns.load(Ordering::SeqCst)
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        // A runtime dropped on an async thread would panic; this does not.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read; calls
/// `read` as each chunk is read.
async fn delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    read: impl Fn() + Send,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (chunks, mut ready) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reading = async move {
        let mut buffer = vec![0; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buffer).await {
            read();
            if chunks.send((tokio::time::Instant::now() + delay, buffer[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let writing = async move {
        while let Some((due, chunk)) = ready.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reading, writing);
}

/// The `host:port` of an `iggy://user:password@host:port?options` URL.
pub fn upstream_of(url: &str) -> &str {
    let (start, end) = address_span(url);
    &url[start..end]
}

/// `url` with its address replaced by the proxy's on this machine, by the
/// name `localhost` when `url` named it so (a certificate checked with
/// `sslmode=verify-full` names `localhost`, not `127.0.0.1`).
fn proxied(url: &str, port: u16) -> String {
    let (start, end) = address_span(url);
    let host = match url[start..end].starts_with("localhost:") {
        true => "localhost",
        false => "127.0.0.1",
    };
    format!("{}{host}:{port}{}", &url[..start], &url[end..])
}

fn address_span(url: &str) -> (usize, usize) {
    let start = url.rfind('@').map_or(url.find("://").map_or(0, |s| s + 3), |at| at + 1);
    let end = url[start..].find(['?', '/']).map_or(url.len(), |end| start + end);
    (start, end)
}

impl Drop for CuttableProxy {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_pointed_at_the_proxy() {
        assert_eq!(upstream_of("iggy://u:p@10.0.0.1:8090?x=1"), "10.0.0.1:8090");
        assert_eq!(upstream_of("iggy://u:p@h:1"), "h:1");
        assert_eq!(address_span("iggy://u:p@h:1?x=1"), (11, 14));
    }
}
