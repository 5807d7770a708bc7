//! A TCP proxy that can cut every connection and refuse new ones for a
//! while: a server that goes away, as its clients see it, without touching
//! the server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
        let listener = TcpListener::bind("127.0.0.1:0").await?;
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
        let (start, end) = address_span(url);
        format!("{}127.0.0.1:{}{}", &url[..start], self.port, &url[end..])
    }

    /// Drops every open connection and refuses new ones for `down`.
    pub async fn cut_for(&self, down: Duration) {
        self.refusing.store(true, Ordering::SeqCst);
        self.connections.lock().await.abort_all();
        tokio::time::sleep(down).await;
        self.refusing.store(false, Ordering::SeqCst);
    }
}

/// The `host:port` of an `iggy://user:password@host:port?options` URL.
pub fn upstream_of(url: &str) -> &str {
    let (start, end) = address_span(url);
    &url[start..end]
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
