//! `WAKU_POSTGRES_URL=postgres://… cargo bench -p wakuwaku-tests --bench state`:
//! the bank projection on one seeded workload and one embedded log,
//! consumed through the host into the embedded state store and into
//! PostgreSQL, alternately, in one run.
//!
//! Six ways, back to back in each round: the embedded store, PostgreSQL
//! on loopback, and PostgreSQL behind a proxy the bench starts itself
//! ([`LatencyProxy`]) holding each direction back 0.5 ms (a 1 ms round
//! trip, a database in the same region); then the two PostgreSQL ways
//! again with the URL's `synchronous_commit=off` (each batch's commit
//! returns before PostgreSQL flushes it); then PostgreSQL on loopback with
//! the commit statements unprepared (parsed and planned at each commit,
//! [`PostgresStore::with_prepared_commits`]). Each consumption starts from a
//! fresh store (a file of its own, or a projection of its own in the
//! database) and is checked against the oracle. Prints events/s per way,
//! best of the rounds, its ratio to the embedded store, batches, rows per
//! PostgreSQL commit and the process's CPU-seconds.
//! `WAKU_BENCH_EVENTS` and `WAKU_BENCH_ACCOUNTS` resize the workload, `WAKU_BENCH_ROUNDS` sets the rounds (default 2),
//! `WAKU_BENCH_BATCH` the most events of a batch (default the consumer's)
//! (default 200 000 events over 10 000 accounts, 4 partitions).
//! `WAKU_BENCH_ONLY=stores` runs only these ways, `WAKU_BENCH_ONLY=hosts`
//! only the hosts in a group below (without the rebalances). Without
//! `WAKU_POSTGRES_URL` it says so and stops.
//!
//! With `WAKU_IGGY_URL` too, on a 6-partition Iggy topic holding the same
//! workload: hosts of one projection in a consumer group (each on its own
//! runtime and connection, as `waku run --group` processes), 1, 2 and 3 of
//! them, each count into a fresh projection, timed until every partition's
//! committed position reaches its end, with the process's CPU-seconds and
//! the events redone (commits refused by fencing); then the rebalances of
//! one projection: two hosts join one busy with the backlog, one leaves
//! gracefully right after more events arrive (the time until the others
//! hold its partitions), and one is killed (the time until its partitions
//! are consumed to their new ends elsewhere), with the events redone: for
//! the kill, what the survivor read again of what the dead host had read
//! past its last commit (known here, in one process, from the dead host's
//! gate; a real `waku run` that dies cannot say), beside the dead host's
//! batches in flight.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku::authoring::publish;
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig};
use wakuwaku::engine::projection::Projection;
use wakuwaku::storage::log::{EventLog, IggyLog};
use wakuwaku::storage::state::{PostgresStore, StateStore};
use wakuwaku::storage::stats::Stat;
use wakuwaku_tests::group::GroupHost;
use wakuwaku_tests::proxy::{LatencyProxy, upstream_of};
use wakuwaku_tests::{bank_log, bank_module, fresh_stream, publish_bank};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The CPU time this process has used so far, over all its threads.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command (which may hold spaces) in parentheses:
    // utime and stime are the 12th and 13th, in clock ticks (100 a second).
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks = |index: usize| fields.get(index).and_then(|field| field.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    if !std::env::args().any(|arg| arg == "--bench") {
        println!("state bench: run with `cargo bench -p wakuwaku-tests --bench state`");
        return;
    }
    let Ok(url) = std::env::var("WAKU_POSTGRES_URL") else {
        println!("state bench: needs a PostgreSQL server named by WAKU_POSTGRES_URL");
        return;
    };
    wakuwaku::platform::memory::prefer_small_pages();
    let only = std::env::var("WAKU_BENCH_ONLY").ok();
    let spec = WorkloadSpec {
        events: env_or("WAKU_BENCH_EVENTS", 200_000) as usize,
        accounts: env_or("WAKU_BENCH_ACCOUNTS", 10_000),
        seed: 42,
    };
    let mut config = ConsumerConfig::default();
    if let Some(batch) = std::env::var("WAKU_BENCH_BATCH").ok().and_then(|v| v.parse().ok()) {
        config.batch_size = batch;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    if only.as_deref() != Some("hosts") {
        stores(&runtime, &url, spec, config, dir.path());
    }
    let iggy = std::env::var("WAKU_IGGY_URL").ok().filter(|_| only.as_deref() != Some("stores"));
    if let Some(iggy) = iggy {
        scale_out(&runtime, &iggy, &url, spec, dir.path(), only.as_deref() != Some("hosts"));
    }
}

/// The ways of the state store, each consuming the embedded log of the
/// workload `rounds` times (the best of them counts).
fn stores(runtime: &tokio::runtime::Runtime, url: &str, spec: WorkloadSpec, config: ConsumerConfig, dir: &Path) {
    let rounds = env_or("WAKU_BENCH_ROUNDS", 2) as usize;
    let module = bank_module();
    let (log, oracle) = runtime.block_on(bank_log(dir, module.clone(), spec, 4));
    println!(
        "workload: {} events, {} accounts, 4 partitions, batch {}, default workers; best of {rounds} rounds",
        spec.events, spec.accounts, config.batch_size
    );
    // PostgreSQL across a network, as the bench's own proxy makes it:
    // each way held back 0.5 ms, a round trip 1 ms.
    let proxy = LatencyProxy::start(upstream_of(url).to_owned(), Duration::from_micros(500)).expect("the proxy");
    let far = proxy.url_for(url);
    // The same two, with each batch's transaction opting out of waiting
    // for the flush (the URL's `synchronous_commit=off`).
    let relaxed = |url: &str| format!("{url}{}synchronous_commit=off", if url.contains('?') { '&' } else { '?' });
    // The URL and whether the commit statements are prepared of each
    // PostgreSQL way.
    let urls = [(url.to_owned(), true), (far.clone(), true), (relaxed(url), true), (relaxed(&far), true)];
    let urls = [urls.as_slice(), &[(url.to_owned(), false)]].concat();
    let ways = [
        "embedded state (redb)",
        "PostgreSQL, loopback",
        "PostgreSQL, 1 ms round trip",
        "PostgreSQL, loopback, sync off",
        "PostgreSQL, 1 ms, sync off",
        "PostgreSQL, loopback, unprepared",
    ];
    let mut best = [f64::MAX; 6];
    let mut written = [(0, 0, 0.0); 6];
    for round in 0..rounds {
        for (way, name) in ways.iter().enumerate() {
            let projection = fresh_stream("bench").replace('-', "_");
            let (store, counts) = match way {
                0 => (StateStore::open(&dir.join(format!("bank-{round}.redb"))).unwrap(), None),
                _ => {
                    let (url, prepared) = &urls[way - 1];
                    let store = PostgresStore::connect(url, &projection).unwrap().with_prepared_commits(*prepared);
                    let counts = store.written();
                    (StateStore::from_backend(store), Some(counts))
                }
            };
            let projection = Arc::new(Projection::new("bank", "accounts", vec![module.clone()], store).unwrap());
            let started = Instant::now();
            let cpu = cpu_seconds();
            let consumer = Consumer::new(log.clone(), projection.clone(), config.clone());
            let summary = runtime.block_on(consumer.catch_up()).unwrap();
            let secs = started.elapsed().as_secs_f64();
            let cpu = cpu_seconds() - cpu;
            if secs < best[way] {
                best[way] = secs;
                let rows = counts.as_ref().map_or(0, |counts| counts.rows() / counts.commits().max(1));
                written[way] = (summary.batches, rows, cpu);
            }
            println!("  round {round}, {name}: {secs:.2} s, {} batches", summary.batches);
            let check = demo::check_projection(&oracle, &*module, projection.store()).unwrap();
            assert!(check.matches(), "{}", check.report(5));
        }
    }
    let rate = |secs: f64| spec.events as f64 / secs;
    for (way, name) in ways.iter().enumerate() {
        let (batches, rows, cpu) = written[way];
        println!(
            "{name:<30} {:>10.0} events/s  {:>5.2} of embedded  {batches} batches  {rows} rows per commit  {cpu:.1} CPU-s",
            rate(best[way]),
            best[0] / best[way],
        );
    }
}

/// Hosts in a consumer group: 1, 2, 3 of them (time, CPU-seconds and
/// redone events of each), then, with `and_rebalances`, the rebalances
/// ([`rebalances`]).
fn scale_out(
    runtime: &tokio::runtime::Runtime,
    iggy: &str,
    postgres: &str,
    spec: WorkloadSpec,
    dir: &Path,
    and_rebalances: bool,
) {
    let stream = fresh_stream("bench-scale");
    let log = runtime.block_on(IggyLog::connect(iggy, &stream)).unwrap();
    let module = bank_module();
    let oracle = runtime.block_on(publish_bank(&log, module.clone(), spec, 6));
    let ends = runtime.block_on(log.end_offsets("accounts")).unwrap();
    let cache = dir.join("hosts");
    let start = |projection: &str, group: &str| {
        GroupHost::start(iggy, &stream, postgres, (projection, group), ConsumerConfig::default(), &cache)
    };
    // Compiles the module into the shared cache, so no count pays for it.
    start(&fresh_stream("warm").replace('-', "_"), "warm").stop();
    let all: Vec<u32> = (0..6).collect();
    let mut runs = Vec::new();
    for hosts in 1..=3 {
        let projection = fresh_stream("hosts").replace('-', "_");
        let store = StateStore::from_backend(PostgresStore::connect(postgres, &projection).unwrap());
        let (started, cpu) = (Instant::now(), cpu_seconds());
        let running: Vec<GroupHost> = (0..hosts).map(|_| start(&projection, &projection)).collect();
        while !consumed(&store, &ends, &all) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let secs = started.elapsed().as_secs_f64();
        let redone: u64 = running.into_iter().map(|host| host.stop().redone).sum();
        runs.push((secs, cpu_seconds() - cpu, redone));
        let check = demo::check_projection(&oracle, &*module, &store).unwrap();
        assert!(check.matches(), "{hosts} hosts: {}", check.report(5));
    }
    println!("Iggy, 6 partitions, hosts in one consumer group (start-up included, module cached):");
    for (hosts, (secs, cpu, redone)) in runs.iter().enumerate() {
        println!(
            "  {} host(s): {:>10.0} events/s, {cpu:>6.2} CPU-s ({:.2}x one host's), {redone} events redone",
            hosts + 1,
            spec.events as f64 / secs,
            cpu / runs[0].1
        );
    }
    println!("  ratio 2 hosts / 1 host:  {:>6.2}", runs[0].0 / runs[1].0);
    println!("  ratio 3 hosts / 1 host:  {:>6.2}", runs[0].0 / runs[2].0);
    if and_rebalances {
        rebalances(runtime, &log, postgres, &start, spec);
    }
}

/// Whether `store`'s positions of `partitions` reached `ends`.
fn consumed(store: &StateStore, ends: &[u64], partitions: &[u32]) -> bool {
    partitions.iter().all(|&p| store.position("accounts", p).unwrap() == Some(ends[p as usize]))
}

/// Rebalances of one projection while it consumes: a second and a third
/// host join a host busy with the backlog (planned join), one of them stops
/// gracefully right after more events arrive (graceful leave: the time
/// until the others hold its partitions), and one is killed right after
/// more events arrive (failover: the time until its partitions are
/// consumed to their new ends elsewhere). Redone events (commits refused by
/// fencing, [`GroupHost::redone`]) for each.
fn rebalances(
    runtime: &tokio::runtime::Runtime,
    log: &IggyLog,
    postgres: &str,
    start: &dyn Fn(&str, &str) -> GroupHost,
    spec: WorkloadSpec,
) {
    let module = bank_module();
    let projection = fresh_stream("rebalance").replace('-', "_");
    let all: Vec<u32> = (0..6).collect();
    let store = StateStore::from_backend(PostgresStore::connect(postgres, &projection).unwrap());
    let publish_more = |seed| {
        let (events, _) = demo::workload(WorkloadSpec { events: 60_000, seed, ..spec });
        let outgoing = demo::outgoing(&*module, &events).expect("the bank module");
        runtime.block_on(publish::publish(log, "accounts", module.clone(), outgoing, None, 2)).unwrap();
        runtime.block_on(log.end_offsets("accounts")).unwrap()
    };
    let ends = runtime.block_on(log.end_offsets("accounts")).unwrap();
    let backlog: u64 = ends.iter().sum();
    let a = start(&projection, &projection);
    while all.iter().map(|&p| store.position("accounts", p).unwrap().unwrap_or(0)).sum::<u64>() < backlog / 5 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (b, c) = (start(&projection, &projection), start(&projection, &projection));
    while !consumed(&store, &ends, &all) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let joined = a.redone() + b.redone() + c.redone();
    println!("rebalance, planned join of 2 hosts to 1 busy with the backlog: {joined} events redone");

    let ends = publish_more(8);
    let leaving = b.held();
    let stopping = Instant::now();
    let b_redone = b.stop().redone;
    let stopped = stopping.elapsed().as_secs_f64();
    while !leaving.iter().all(|p| a.held().contains(p) || c.held().contains(p)) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let handover = stopping.elapsed().as_secs_f64();
    while !consumed(&store, &ends, &all) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = b_redone + a.redone() + c.redone() - joined;
    println!(
        "rebalance, graceful leave of {leaving:?} right after 60 000 events arrived: stopped in {stopped:.3} s, \
         its partitions held elsewhere after {handover:.3} s, {left} events redone"
    );

    let ends = publish_more(9);
    let orphaned = c.held();
    let dead = c.progress();
    let died = Instant::now();
    let before = a.redone();
    c.kill();
    while !consumed(&store, &ends, &orphaned) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let failover = died.elapsed().as_secs_f64();
    let killed = a.redone() - before;
    // What the dead host had read past its last commit (its batches in
    // flight), and what of it the survivor read again: from the position
    // it took each partition at up to where the dead host had read.
    let taken = a.progress().partitions();
    let (mut in_flight, mut read_again) = (Vec::new(), 0);
    for p in dead.partitions().into_iter().filter(|p| orphaned.contains(&p.partition)) {
        in_flight.push((p.partition, p.read_to - p.position));
        let start = taken.iter().find(|t| t.partition == p.partition).map_or(p.read_to, |t| t.start);
        read_again += p.read_to.saturating_sub(start);
    }
    a.stop();
    let applied = store.stats().unwrap()[Stat::Applied];
    assert_eq!(applied, ends.iter().sum::<u64>(), "every event applied once");
    println!(
        "rebalance, kill of {orphaned:?} right after 60 000 events arrived: its partitions consumed to their new \
         ends elsewhere after {failover:.2} s; {read_again} events redone (read again by the survivor past where \
         it took them; the batches in flight at the kill, as (partition, events): {in_flight:?}), and {killed} \
         events of the survivor's own commits refused by fencing"
    );
}
