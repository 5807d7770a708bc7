//! `WAKU_IGGY_SERVER=…/iggy-server cargo bench -p wakuwaku-tests --bench iggy_cluster`:
//! the host on a three-node Iggy cluster beside one server of the same
//! binary, in one run:
//!
//! 1. **Throughput**: the bank projection consuming the same seeded
//!    workload from one server and from the cluster (both running, a fresh
//!    stream and data directory each time), taking turns twice, checked
//!    against the oracle; events/s and the ratio cluster ÷ one server.
//! 2. **Failover**: a host consuming from the cluster while its leader is
//!    SIGKILLed ten times (the killed node started again after each); for
//!    each kill, the time from the kill to the first commit of a batch
//!    polled after the host failed over (batches polled before the kill
//!    commit without the log), reported as p50 and max, and the
//!    events redone in all (processed and committed twice: always 0 for a
//!    host whose partitions did not move). The run ends checked against
//!    the oracle.
//!
//! `WAKU_BENCH_EVENTS` resizes the throughput workload (default 400 000
//! events over 10 000 accounts; the failover run has 300 000). Without
//! `WAKU_IGGY_SERVER` it prints one line and stops.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wakuwaku::authoring::demo::WorkloadSpec;
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::operations::host::Host;
use wakuwaku::storage::log::IggyLog;
use wakuwaku_tests::iggy_cluster::{IggyCluster, server_binary};
use wakuwaku_tests::{bank_module, check_bank_store, host_settings, publish_bank};

// The allocator the `waku` command uses, so figures match the demo.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PARTITIONS: u32 = 4;
const KILLS: usize = 10;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    wakuwaku::platform::memory::prefer_small_pages();
    let Some(binary) = server_binary("the Iggy cluster benchmark") else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let spec = WorkloadSpec { events: env_or("WAKU_BENCH_EVENTS", 400_000), accounts: 10_000, seed: 31 };
    runtime.block_on(async {
        let single = IggyCluster::single(binary.clone());
        let mut cluster = IggyCluster::start_nodes(binary, 3);
        cluster.leader(Duration::from_secs(60)).await.expect("a leader");
        for round in 1..=2 {
            let one = throughput(&single.url(), spec).await;
            let three = throughput(&cluster.url(), spec).await;
            println!("round {round}: one server {one:>9.0} events/s, three-node cluster {three:>9.0} events/s ({:.2} of one server)", three / one);
        }
        drop(single);
        failovers(&mut cluster).await;
    });
}

fn config() -> ConsumerConfig {
    ConsumerConfig { log_backoff: (Duration::from_millis(50), Duration::from_millis(500)), ..ConsumerConfig::default() }
}

/// Publishes `spec` to a fresh stream of the log at `url` and consumes it
/// with one host; events/s of the consuming, checked against the oracle.
async fn throughput(url: &str, spec: WorkloadSpec) -> f64 {
    let stream = wakuwaku_tests::fresh_stream("waku-bench-cluster");
    let publisher = IggyLog::connect(url, &stream).await.unwrap();
    let oracle = publish_bank(&publisher, bank_module(), spec, PARTITIONS).await;
    drop(publisher);
    let log = Arc::new(IggyLog::connect(url, &stream).await.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let settings = host_settings(dir.path(), "bank", "accounts", vec![bank_module()], config());
    let started = Instant::now();
    let host = Host::start_on(log, settings).await.unwrap();
    let projection = host.projection().clone();
    let summary = host.finished().await.unwrap();
    let rate = summary.applied as f64 / started.elapsed().as_secs_f64();
    assert_eq!(summary.applied, spec.events as u64);
    assert!(check_bank_store(&oracle, projection.store()).matches(), "the read model matches the oracle");
    rate
}

/// Ten SIGKILLs of the leader under a consuming host: the time from each
/// kill to the first commit after it, and the events redone.
async fn failovers(cluster: &mut IggyCluster) {
    let spec = WorkloadSpec { events: 300_000, accounts: 10_000, seed: 32 };
    let stream = wakuwaku_tests::fresh_stream("waku-bench-failover");
    let publisher = IggyLog::connect(&cluster.url(), &stream).await.unwrap();
    let oracle = publish_bank(&publisher, bank_module(), spec, PARTITIONS).await;
    drop(publisher);
    let log = Arc::new(IggyLog::connect(&cluster.url(), &stream).await.unwrap());
    let dir = tempfile::tempdir().unwrap();
    // Small batches, so the run outlasts ten kills on a small machine.
    let settings = host_settings(
        dir.path(),
        "bank",
        "accounts",
        vec![bank_module()],
        ConsumerConfig { batch_size: 20, ..config() },
    );
    let host = Host::start_on(log.clone(), settings).await.unwrap();
    let (progress, projection) = (host.progress().clone(), host.projection().clone());
    let mut recoveries = Vec::new();
    for _ in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let Some(leader) = cluster.leader(Duration::from_secs(60)).await else { break };
        let before = progress.replayed().0;
        if before >= spec.events as u64 {
            break;
        }
        let failovers = wakuwaku::storage::log::EventLog::failovers(&*log);
        let killed = Instant::now();
        cluster.kill(leader);
        // The first commit of a batch polled after the failover: the ones
        // polled before it may still commit (the state store is local).
        let mut moved = None;
        while killed.elapsed() < Duration::from_secs(120) {
            let replayed = progress.replayed().0;
            match moved {
                None if wakuwaku::storage::log::EventLog::failovers(&*log) > failovers => moved = Some(replayed),
                Some(at) if replayed > at => break,
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        recoveries.push(killed.elapsed());
        println!(
            "kill {} (node {leader}): first commit {:.1} s after it",
            recoveries.len(),
            killed.elapsed().as_secs_f64()
        );
        cluster.start(leader);
        // A node whose own thread panicked can hold the cluster up for
        // good: the kills stop there, and the figures say so.
        let panics = cluster.server_panics();
        if !panics.is_empty() {
            println!("stopped after {} kills{panics}", recoveries.len());
            break;
        }
    }
    let Ok(summary) = tokio::time::timeout(Duration::from_secs(300), host.finished()).await else {
        println!("the host did not catch up within 300 s after the kills{}", cluster.server_panics());
        return;
    };
    let summary = summary.unwrap();
    assert!(
        check_bank_store(&oracle, projection.store()).matches(),
        "the read model matches the oracle after the kills"
    );
    recoveries.sort();
    let p50 = recoveries.get(recoveries.len() / 2).copied().unwrap_or_default();
    let max = recoveries.last().copied().unwrap_or_default();
    println!(
        "leader SIGKILLed {} times: first commit after the kill p50 {:.1} s, max {:.1} s; failovers {}, events redone \
         {}",
        recoveries.len(),
        p50.as_secs_f64(),
        max.as_secs_f64(),
        wakuwaku::storage::log::EventLog::failovers(&*log),
        summary.redone
    );
}
