//! `WAKU_IGGY_URL=iggy://… cargo bench -p wakuwaku-tests --bench iggy`:
//! the platform against one Iggy server, in one run, on one seeded bank
//! workload in a fresh stream:
//!
//! 1. **`waku publish`**: the command, run in-process on a JSON-lines file
//!    (parsing, headers from the module, appends per partition), module
//!    loading included.
//! 2. **raw poll**: the topic read back with the `iggy` client alone, one
//!    task per partition on one connection, every message's user headers
//!    decoded and its tag and key read; no planning, no handlers. Twice:
//!    1 000 messages per poll, and 4 096 (what `IggyLog` asks for).
//! 3. **host**: the bank projection consuming the same topic through
//!    `IggyLog` (poll, plan, reduce, WASM calls, commits, Iggy consumer
//!    offsets), checked against the oracle so a fast wrong answer cannot
//!    win.
//! 4. **host on the embedded log**: the same projection over the same
//!    events in the embedded log, so what Iggy costs the host shows apart
//!    from what the host's own work costs.
//!
//! Prints events/s and the ratios, host ÷ raw poll against the faster of
//! the two raw polls. `WAKU_BENCH_EVENTS` and
//! `WAKU_BENCH_ACCOUNTS` resize the workload (default 1 000 000 events over
//! 10 000 accounts). Without `WAKU_IGGY_URL` it prints one line and stops.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use iggy::prelude::{
    Client, Consumer as IggyConsumer, HeaderKey, Identifier, IggyClient, MessageClient, PollingStrategy,
};
use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig};
use wakuwaku::engine::projection::Projection;
use wakuwaku::event::header_name::{KEY, TAG};
use wakuwaku::storage::log::IggyLog;
use wakuwaku::storage::state::StateStore;
use wakuwaku_tests::{bank_log, bank_module, bank_wasm, fresh_stream, iggy_url};

// The allocator the `waku` command uses, so figures match the demo.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TOPIC: &str = "accounts";
const PARTITIONS: u32 = 4;
/// Messages per poll of the raw polls: the earlier figure's 1 000, and
/// what `IggyLog` asks for.
const POLLS: [u32; 2] = [1000, 4096];

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    // As the `waku` command does, so the figures match it.
    wakuwaku::platform::memory::prefer_small_pages();
    let Some(url) = iggy_url("the Iggy benchmark") else { return };
    let spec = WorkloadSpec {
        events: env_or("WAKU_BENCH_EVENTS", 1_000_000),
        accounts: env_or("WAKU_BENCH_ACCOUNTS", 10_000) as u64,
        seed: 42,
    };
    let stream = fresh_stream("waku-bench");
    let dir = tempfile::tempdir().expect("a temporary directory");

    // 1. `waku publish`, in-process.
    let (events, oracle) = demo::workload(spec);
    let lines: String =
        events.iter().map(|e| serde_json::json!({ "type": e.type_name, "body": e.body }).to_string() + "\n").collect();
    let file = dir.path().join("events.jsonl");
    std::fs::write(&file, lines).expect("write the events");
    let (bank, partitions) = (bank_wasm(), PARTITIONS.to_string());
    let args = [
        "waku",
        "publish",
        "--iggy",
        &url,
        "--stream",
        &stream,
        "--topic",
        TOPIC,
        "--partitions",
        &partitions,
        "--module",
        bank.to_str().expect("a UTF-8 path"),
        file.to_str().expect("a UTF-8 path"),
    ];
    let started = Instant::now();
    let code = wakuwaku::cli::main_with(args.iter().map(Into::into));
    let publish_secs = started.elapsed().as_secs_f64();
    assert_eq!(code, std::process::ExitCode::SUCCESS, "waku publish failed");
    let publish_rate = spec.events as f64 / publish_secs;

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        // 2. Raw poll with header decoding.
        let client = Arc::new(IggyClient::from_connection_string(&url).expect("a valid URL"));
        client.connect().await.expect("connect");
        let mut raw = Vec::new();
        for poll in POLLS {
            let started = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for partition in 0..PARTITIONS {
                let (client, stream) = (client.clone(), stream.clone());
                tasks.spawn(async move { raw_poll(&client, &stream, partition, poll).await });
            }
            let polled: u64 = tasks.join_all().await.into_iter().sum();
            let raw_secs = started.elapsed().as_secs_f64();
            assert_eq!(polled, spec.events as u64, "the raw poll read every event");
            raw.push((poll, raw_secs, spec.events as f64 / raw_secs));
        }
        let raw_rate = raw.iter().map(|&(_, _, rate)| rate).fold(0.0, f64::max);

        // 3. The host consuming into the bank projection.
        let log = Arc::new(IggyLog::connect(&url, &stream).await.expect("connect"));
        let store = StateStore::open(&dir.path().join("bank.redb")).expect("a state store");
        let module = bank_module();
        let projection = Arc::new(Projection::new("bank", TOPIC, vec![module.clone()], store).expect("a projection"));
        let started = Instant::now();
        let summary = Consumer::new(log.clone(), projection.clone(), ConsumerConfig::default())
            .catch_up()
            .await
            .expect("consumed");
        let host_secs = started.elapsed().as_secs_f64();
        assert_eq!(summary.applied, spec.events as u64);
        let check = demo::check_projection(&oracle, &*module, projection.store()).expect("checked");
        assert!(check.matches(), "{}", check.report(5));
        let host_rate = spec.events as f64 / host_secs;

        // 4. The same projection over the same events in the embedded log.
        let embedded_dir = tempfile::tempdir().expect("a temporary directory");
        let (embedded, oracle) = bank_log(embedded_dir.path(), module.clone(), spec, PARTITIONS).await;
        let store = StateStore::open(&embedded_dir.path().join("bank.redb")).expect("a state store");
        let projection = Arc::new(Projection::new("bank", TOPIC, vec![module.clone()], store).expect("a projection"));
        let started = Instant::now();
        let summary =
            Consumer::new(embedded, projection.clone(), ConsumerConfig::default()).catch_up().await.expect("consumed");
        let embedded_secs = started.elapsed().as_secs_f64();
        assert_eq!(summary.applied, spec.events as u64);
        let check = demo::check_projection(&oracle, &*module, projection.store()).expect("checked");
        assert!(check.matches(), "{}", check.report(5));
        let embedded_rate = spec.events as f64 / embedded_secs;

        println!(
            "workload: {} events over {} accounts, {PARTITIONS} partitions, stream `{stream}`",
            spec.events, spec.accounts
        );
        println!("waku publish:  {:>10.0} events/s ({publish_secs:.2} s)", publish_rate);
        for (poll, raw_secs, rate) in raw {
            println!("raw poll ({poll:>4}): {rate:>10.0} events/s ({raw_secs:.2} s)");
        }
        println!("host (bank):   {:>10.0} events/s ({host_secs:.2} s), oracle: match", host_rate);
        println!("host, embedded log: {:>10.0} events/s ({embedded_secs:.2} s), oracle: match", embedded_rate);
        println!("host / raw poll: {:.2}", host_rate / raw_rate);
        println!("host on Iggy / host on the embedded log: {:.2}", host_rate / embedded_rate);
        println!("publish / raw poll: {:.2}", publish_rate / raw_rate);
    });
}

/// Polls a partition from offset 0 to its end, `poll` messages at a time,
/// decoding every message's user headers and reading its tag and key;
/// returns how many were read.
async fn raw_poll(client: &IggyClient, stream: &str, partition: u32, poll: u32) -> u64 {
    let stream = Identifier::named(stream).expect("a stream name");
    let topic = Identifier::named(TOPIC).expect("a topic name");
    let consumer = IggyConsumer::new(Identifier::named("waku-bench").expect("a name"));
    let (tag, key) = (HeaderKey::from_str(TAG).expect("a key"), HeaderKey::from_str(KEY).expect("a key"));
    let (mut offset, mut read, mut checksum) = (0, 0, 0u64);
    loop {
        let polled = client
            .poll_messages(&stream, &topic, Some(partition), &consumer, &PollingStrategy::offset(offset), poll, false)
            .await
            .expect("poll");
        let Some(last) = polled.messages.last().map(|m| m.header.offset) else { break };
        for message in &polled.messages {
            let headers = message.user_headers_map().expect("headers").expect("headers present");
            let tag = headers[&tag].as_uint32().expect("a u32 tag");
            // The key's canonical bytes, hashed as the host does.
            let key = wakuwaku::key::key_hash(headers[&key].as_bytes());
            checksum = checksum.wrapping_add(u64::from(tag) ^ key);
        }
        read += polled.messages.len() as u64;
        offset = last + 1;
    }
    std::hint::black_box(checksum);
    read
}
