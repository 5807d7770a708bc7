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
//! - **Nothing outlives the test**: dropping the cluster kills its nodes.
//! - Without `WAKU_IGGY_SERVER`, [`IggyCluster::from_env`] prints one line
//!   saying what was skipped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The variable naming the server binary.
pub const SERVER_VARIABLE: &str = "WAKU_IGGY_SERVER";

/// The nodes of a cluster.
const NODES: usize = 3;

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
}

impl IggyCluster {
    /// A cluster of the server `WAKU_IGGY_SERVER` names, started and with a
    /// leader; `None`, after one line saying `what` was skipped, without it.
    pub fn from_env(what: &str) -> Option<Self> {
        server_binary(what).map(|binary| Self::start_nodes(binary, NODES))
    }

    /// One server of `binary`, not a cluster: what the cluster's figures
    /// are measured against.
    pub fn single(binary: PathBuf) -> Self {
        Self::start_nodes(binary, 1)
    }

    /// Starts `count` nodes of `binary`: a cluster, or one server alone.
    pub fn start_nodes(binary: PathBuf, count: usize) -> Self {
        let ports = free_ports(count * 3).chunks(3).map(|p| Ports { tcp: p[0], http: p[1], replica: p[2] }).collect();
        let mut cluster =
            Self { binary, dir: tempfile::tempdir().expect("a temporary directory"), ports, nodes: Vec::new() };
        cluster.nodes = (0..count).map(|_| None).collect();
        for node in 0..count {
            cluster.start(node);
        }
        cluster
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

    /// Node `node`'s client address.
    pub fn address(&self, node: usize) -> String {
        format!("127.0.0.1:{}", self.ports[node].tcp)
    }

    /// Which node an address (`host:port`) is.
    pub fn node_of(&self, address: &str) -> Option<usize> {
        (0..self.count()).find(|&node| self.address(node) == address)
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
            .env("IGGY_TCP_ADDRESS", self.address(node))
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
        }
        let child = command.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", self.binary.display()));
        self.nodes[node] = Some(child);
        wait_for_port(self.ports[node].tcp, Duration::from_secs(30));
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

/// Waits until something listens on loopback `port`, or `limit`.
fn wait_for_port(port: u16, limit: Duration) {
    let deadline = Instant::now() + limit;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on 127.0.0.1:{port} after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
