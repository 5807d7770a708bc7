//! A three-node Apache Iggy cluster on loopback, started by a test from
//! the server binary named by `WAKU_IGGY_SERVER` (Iggy's `iggy-server`,
//! built from apache/iggy: no registry ships it).
//!
//! Rules kept here:
//! - **Its own ports and files.** Every port (a client TCP port, an HTTP
//!   port and a replica port per node) is a free loopback port found when
//!   the cluster starts; every node keeps its data in a temporary
//!   directory of the cluster, removed with it. QUIC and WebSocket are off.
//! - **One roster, three identities.** Every node gets the same
//!   `IGGY_CLUSTER_*` variables (name, and per node its name, address,
//!   replica id and ports); only `--replica-id` tells them apart, as
//!   Iggy's own harness starts them.
//! - **Nodes are killed for real**: [`IggyCluster::kill`] sends SIGKILL
//!   (nothing flushed), [`IggyCluster::stop`] SIGTERM (a clean stop), and
//!   [`IggyCluster::start`] starts the node again on its data and ports.
//! - **Links cut for real**: a cluster started
//!   [`behind_proxies`](IggyCluster::from_env_behind_proxies) has each node
//!   advertise a second loopback address, [`PROXY_HOST`], where a proxy
//!   forwards to it: every client connection, the leader redirect
//!   included, goes through a proxy, and [`IggyCluster::cut_link`] drops a
//!   node's client connections (and refuses new ones for a while) with
//!   the node and its replication untouched.
//! - **Nothing outlives the test**: dropping the cluster kills its nodes.
//! - Without `WAKU_IGGY_SERVER`, [`IggyCluster::from_env`] prints one line
//!   saying what was skipped.

use std::net::TcpListener;

use crate::proxy::CuttableProxy;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The variable naming the server binary.
pub const SERVER_VARIABLE: &str = "WAKU_IGGY_SERVER";

/// The nodes of a cluster.
const NODES: usize = 3;

/// The loopback address a cluster behind proxies advertises to clients
/// (the nodes listen on 127.0.0.1, their proxies on this, same ports).
pub const PROXY_HOST: &str = "127.0.0.2";

/// The variable naming the server binary, if set.
pub fn server_binary(what: &str) -> Option<PathBuf> {
    let binary = std::env::var_os(SERVER_VARIABLE).map(PathBuf::from);
    if binary.is_none() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {what} needs Iggy's server binary named by {SERVER_VARIABLE} (built from apache/iggy: cargo \
             build --release -p server; see docs/iggy.md)"
        );
    }
    binary
}

/// One node's ports.
#[derive(Debug, Clone, Copy)]
struct Ports {
    tcp: u16,
    http: u16,
    replica: u16,
}

/// A running three-node cluster.
pub struct IggyCluster {
    binary: PathBuf,
    dir: tempfile::TempDir,
    ports: Vec<Ports>,
    nodes: Vec<Option<Child>>,
    /// Per node, the proxy its clients reach it through, if the cluster
    /// runs behind proxies.
    proxies: Vec<CuttableProxy>,
}

impl IggyCluster {
    /// A cluster of the server `WAKU_IGGY_SERVER` names, started and with a
    /// leader; `None`, after one line saying `what` was skipped, without it.
    pub fn from_env(what: &str) -> Option<Self> {
        server_binary(what).map(|binary| Self::start_nodes(binary, NODES))
    }

    /// [`from_env`](Self::from_env), each node advertising [`PROXY_HOST`]
    /// where a proxy forwards to it.
    pub async fn from_env_behind_proxies(what: &str) -> Option<Self> {
        let binary = server_binary(what)?;
        let mut cluster = Self::new(binary, NODES);
        for node in 0..NODES {
            let listen = format!("{PROXY_HOST}:{}", cluster.ports[node].tcp);
            let proxy = CuttableProxy::start_at(&listen, cluster.bind_address(node)).await;
            cluster.proxies.push(proxy.unwrap_or_else(|e| panic!("a proxy on {listen}: {e}")));
        }
        for node in 0..NODES {
            cluster.start(node);
        }
        Some(cluster)
    }

    /// One server of `binary`, not a cluster: what the cluster's figures
    /// are measured against.
    pub fn single(binary: PathBuf) -> Self {
        Self::start_nodes(binary, 1)
    }

    /// Starts `count` nodes of `binary`: a cluster, or one server alone.
    pub fn start_nodes(binary: PathBuf, count: usize) -> Self {
        let mut cluster = Self::new(binary, count);
        for node in 0..count {
            cluster.start(node);
        }
        cluster
    }

    /// `count` nodes of `binary` with their ports, none started.
    fn new(binary: PathBuf, count: usize) -> Self {
        let ports = free_ports(count * 3).chunks(3).map(|p| Ports { tcp: p[0], http: p[1], replica: p[2] }).collect();
        let dir = tempfile::tempdir().expect("a temporary directory");
        Self { binary, dir, ports, nodes: (0..count).map(|_| None).collect(), proxies: Vec::new() }
    }

    fn count(&self) -> usize {
        self.ports.len()
    }

    /// The URL naming every node, as a user gives it to `--iggy`.
    pub fn url(&self) -> String {
        let addresses: Vec<String> = (0..self.count()).map(|node| self.address(node)).collect();
        format!("iggy://iggy:iggy@{}", addresses.join(","))
    }

    /// The URL of node `node` alone.
    pub fn node_url(&self, node: usize) -> String {
        format!("iggy://iggy:iggy@{}", self.address(node))
    }

    /// Node `node`'s client address: its proxy's, behind proxies.
    pub fn address(&self, node: usize) -> String {
        let host = if self.proxies.is_empty() { "127.0.0.1" } else { PROXY_HOST };
        format!("{host}:{}", self.ports[node].tcp)
    }

    /// The address node `node` listens on.
    fn bind_address(&self, node: usize) -> String {
        format!("127.0.0.1:{}", self.ports[node].tcp)
    }

    /// Which node an address (`host:port`, the node's or its proxy's) is.
    pub fn node_of(&self, address: &str) -> Option<usize> {
        let port = address.rsplit_once(':').and_then(|(_, port)| port.parse::<u16>().ok())?;
        (0..self.count()).find(|&node| self.ports[node].tcp == port)
    }

    /// Drops every client connection to node `node` and refuses new ones
    /// for `down`; the node runs on. Only behind proxies.
    pub async fn cut_link(&self, node: usize, down: Duration) {
        let proxy = self.proxies.get(node).expect("a cluster started behind proxies");
        proxy.cut_for(down).await;
    }

    /// Starts node `node` (again) on its data and ports.
    pub fn start(&mut self, node: usize) {
        assert!(self.nodes[node].is_none(), "node {node} runs already");
        let data = self.dir.path().join(format!("node-{node}"));
        std::fs::create_dir_all(&data).expect("the node's directory");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("node-{node}.log")))
            .expect("the node's log file");
        let mut command = Command::new(&self.binary);
        command
            .arg("--replica-id")
            .arg(node.to_string())
            .current_dir(&data)
            .env("IGGY_SYSTEM_PATH", &data)
            .env("IGGY_TCP_ADDRESS", self.bind_address(node))
            .env("IGGY_HTTP_ADDRESS", format!("127.0.0.1:{}", self.ports[node].http))
            .env("IGGY_QUIC_ENABLED", "false")
            .env("IGGY_WEBSOCKET_ENABLED", "false")
            .env("IGGY_ROOT_USERNAME", "iggy")
            .env("IGGY_ROOT_PASSWORD", "iggy")
            .env("IGGY_SHARD_RUNTIME_CAPACITY", "256")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log file"))
            .stderr(log);
        if self.count() > 1 {
            command
                .env("IGGY_CLUSTER_ENABLED", "true")
                .env("IGGY_CLUSTER_NAME", "waku-test")
                .env("IGGY_MESSAGE_BUS_RECONNECT_PERIOD", "100ms");
        }
        for (index, ports) in self.ports.iter().enumerate().filter(|_| self.count() > 1) {
            let var = |what: &str| format!("IGGY_CLUSTER_NODES_{index}_{what}");
            command
                .env(var("NAME"), format!("node-{index}"))
                .env(var("IP"), "127.0.0.1")
                .env(var("REPLICA_ID"), index.to_string())
                .env(var("PORTS_TCP"), ports.tcp.to_string())
                .env(var("PORTS_HTTP"), ports.http.to_string())
                .env(var("PORTS_TCP_REPLICA"), ports.replica.to_string());
            if !self.proxies.is_empty() {
                command.env(var("ADVERTISED_ADDRESS"), PROXY_HOST);
            }
        }
        let mut child = command.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", self.binary.display()));
        // Up once it listens; a node that ends first says why in its log.
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(self.bind_address(node)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("node {node} ended ({status}) before it listened:\n{}", self.log_tail(node));
            }
            assert!(Instant::now() < deadline, "node {node} listens within 60 s:\n{}", self.log_tail(node));
            std::thread::sleep(Duration::from_millis(50));
        }
        self.nodes[node] = Some(child);
    }

    /// Kills node `node` with SIGKILL and waits for it to end.
    pub fn kill(&mut self, node: usize) {
        if let Some(mut child) = self.nodes[node].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops node `node` with SIGTERM (a clean stop) and waits for it.
    pub fn stop(&mut self, node: usize) {
        if let Some(mut child) = self.nodes[node].take() {
            let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether node `node` runs.
    pub fn runs(&self, node: usize) -> bool {
        self.nodes[node].is_some()
    }

    /// The node the cluster says leads, asked of any running node, within
    /// `limit`.
    pub async fn leader(&self, limit: Duration) -> Option<usize> {
        use iggy::prelude::{Client, ClusterClient, ClusterNodeRole, ClusterNodeStatus, IggyClient};
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            for node in (0..self.count()).filter(|&node| self.runs(node)) {
                let url = format!("{}?reconnection_retries=0", self.node_url(node));
                let Ok(client) = IggyClient::from_connection_string(&url) else { continue };
                let asked = async {
                    client.connect().await.ok()?;
                    client.get_cluster_metadata().await.ok()
                };
                let roster = tokio::time::timeout(Duration::from_secs(3), asked).await.ok().flatten();
                let _ = client.disconnect().await;
                let leader = roster.and_then(|roster| {
                    roster
                        .nodes
                        .into_iter()
                        .find(|n| n.role == ClusterNodeRole::Leader && n.status == ClusterNodeStatus::Healthy)
                });
                if let Some(leader) = leader.and_then(|n| self.node_of(&format!("{}:{}", n.ip, n.endpoints.tcp)))
                    && self.runs(leader)
                {
                    return Some(leader);
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }

    /// What the nodes' logs say of a panic of the server's own threads
    /// (a node then may hold up the cluster for good): empty if none did,
    /// else `" (the Iggy server failed: …)"`, for a failing test's message.
    pub fn server_panics(&self) -> String {
        let mut panics = Vec::new();
        for node in 0..self.count() {
            let text = std::fs::read_to_string(self.dir.path().join(format!("node-{node}.log"))).unwrap_or_default();
            let mut lines = text.lines();
            while let Some(line) = lines.by_ref().find(|line| line.contains("panicked at")) {
                let why = lines.next().unwrap_or_default();
                panics.push(format!("node {node}: {} {why}", line.trim()));
            }
        }
        match panics.is_empty() {
            true => String::new(),
            false => format!(" (the Iggy server failed: {})", panics.join("; ")),
        }
    }

    /// The last lines node `node` logged, for a failing test's message.
    pub fn log_tail(&self, node: usize) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(format!("node-{node}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for IggyCluster {
    fn drop(&mut self) {
        for node in 0..self.count() {
            self.kill(node);
        }
    }
}

/// `count` distinct free loopback ports.
fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> =
        (0..count).map(|_| TcpListener::bind("127.0.0.1:0").expect("a free loopback port")).collect();
    listeners.iter().map(|listener| listener.local_addr().expect("its address").port()).collect()
}
