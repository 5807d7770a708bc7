//! `WAKU_IGGY_URL=iggy://… cargo bench -p wakuwaku-tests --bench durability`:
//! what durable topics cost on Apache Iggy, against the server's defaults
//! (`--lossy-topics`), in one run, each measured on a fresh stream, the
//! two modes taking turns (`WAKU_BENCH_ROUNDS` rounds, default 2):
//!
//! 1. **`waku publish`** of a seeded bank workload into a topic it creates
//!    (`--partitions 4`), in-process: durable topics write and fsync every
//!    request before answering.
//! 2. **host (bank)**: the bank projection consuming that topic, which
//!    appends nothing but creates its retry and dead-letter topics: the
//!    read path, which durability should not change.
//! 3. **host (emits)**: the probe projection over notes that each emit one
//!    message to a topic the host created: every batch's outbox is an
//!    append the server writes and fsyncs before answering.
//!
//! Prints events/s per mode and durable ÷ lossy. `WAKU_BENCH_EVENTS`
//! resizes the bank workload (default 200 000 events over 10 000
//! accounts; the emit workload has a quarter as many). Without
//! `WAKU_IGGY_URL` it prints one line and stops.

use std::sync::Arc;
use std::time::Instant;

use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig};
use wakuwaku::engine::projection::Projection;
use wakuwaku::event::EventTypeTag;
use wakuwaku::operations::host::Host;
use wakuwaku::storage::log::{EventLog, IggyLog, Record};
use wakuwaku::storage::state::StateStore;
use wakuwaku_tests::{bank_module, bank_wasm, fresh_stream, host_settings, iggy_url, json_record, probe_module};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TOPIC: &str = "accounts";
const PARTITIONS: u32 = 4;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Events per second of each stage in one mode.
#[derive(Default, Clone, Copy)]
struct Rates {
    publish: f64,
    host: f64,
    emits: f64,
}

fn main() {
    // As the `waku` command does, so the figures match it.
    wakuwaku::platform::memory::prefer_small_pages();
    let Some(url) = iggy_url("the durability benchmark") else { return };
    let spec = WorkloadSpec { events: env_or("WAKU_BENCH_EVENTS", 200_000), accounts: 10_000, seed: 42 };
    let rounds = env_or("WAKU_BENCH_ROUNDS", 2);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (events, oracle) = demo::workload(spec);
    let lines: String =
        events.iter().map(|e| serde_json::json!({ "type": e.type_name, "body": e.body }).to_string() + "\n").collect();
    let file = dir.path().join("events.jsonl");
    std::fs::write(&file, lines).expect("write the events");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");

    let mut measured: Vec<(bool, Rates)> = Vec::new();
    for round in 0..rounds {
        for lossy in [false, true] {
            let stream = fresh_stream(if lossy { "waku-bench-lossy" } else { "waku-bench-durable" });
            let mut rates = Rates::default();

            // 1. `waku publish`, creating the topic.
            let (bank, partitions) = (bank_wasm(), PARTITIONS.to_string());
            // `warn`: the probe's guest log lines would otherwise be timed too.
            let mut args = vec!["waku", "--log-level", "warn", "publish", "--iggy", &url, "--stream", &stream];
            args.extend(["--topic", TOPIC]);
            args.extend(["--partitions", &partitions, "--module", bank.to_str().expect("a UTF-8 path")]);
            if lossy {
                args.push("--lossy-topics");
            }
            args.push(file.to_str().expect("a UTF-8 path"));
            let started = Instant::now();
            let code = wakuwaku::cli::main_with(args.iter().map(Into::into));
            assert_eq!(code, std::process::ExitCode::SUCCESS, "waku publish failed");
            rates.publish = spec.events as f64 / started.elapsed().as_secs_f64();

            runtime.block_on(async {
                let connect = || async {
                    Arc::new(IggyLog::connect(&url, &stream).await.expect("connect").with_lossy_topics(lossy))
                };
                // 2. The bank projection over it.
                let log = connect().await;
                let store = StateStore::open(&dir.path().join(format!("bank-{round}-{lossy}.redb"))).expect("a store");
                let module = bank_module();
                let projection =
                    Arc::new(Projection::new("bank", TOPIC, vec![module.clone()], store).expect("a projection"));
                let started = Instant::now();
                let summary = Consumer::new(log.clone(), projection.clone(), ConsumerConfig::default())
                    .catch_up()
                    .await
                    .expect("consumed");
                rates.host = spec.events as f64 / started.elapsed().as_secs_f64();
                assert_eq!(summary.applied, spec.events as u64);
                let check = demo::check_projection(&oracle, &*module, projection.store()).expect("checked");
                assert!(check.matches(), "{}", check.report(5));

                // 3. The probe projection, every note emitting a message.
                let notes = spec.events as u64 / 4;
                log.create_topic("probes", PARTITIONS).await.expect("the topic");
                log.create_topic("out", 1).await.expect("the topic");
                for partition in 0..PARTITIONS {
                    let records: Vec<Record> = (0..notes / u64::from(PARTITIONS))
                        .map(|i| {
                            let body = serde_json::json!({ "key": i % 1000, "text": "n", "emit_to": "notes-out" });
                            json_record(EventTypeTag::new(4), i % 1000, body)
                        })
                        .collect();
                    log.append("probes", vec![(partition, records)]).await.expect("published");
                }
                let data = dir.path().join(format!("probe-{round}-{lossy}"));
                let settings = host_settings(&data, "probe", "probes", vec![probe_module()], ConsumerConfig::default());
                let started = Instant::now();
                let summary = Host::start_on(log.clone(), settings).await.expect("started").finished().await;
                rates.emits = notes as f64 / started.elapsed().as_secs_f64();
                assert_eq!(summary.expect("consumed").applied, notes);
                let emitted = log.end_offset("notes-out", 0).await.expect("the emit topic");
                assert_eq!(emitted, notes, "every note emitted once");
            });
            measured.push((lossy, rates));
        }
    }

    println!(
        "{} bank events over {} accounts, {PARTITIONS} partitions; emit workload {} notes",
        spec.events,
        spec.accounts,
        spec.events / 4
    );
    println!("mode      publish ev/s   host (bank) ev/s   host (emits) ev/s");
    for (lossy, rates) in &measured {
        let mode = if *lossy { "lossy" } else { "durable" };
        println!("{mode:<8} {:>14.0} {:>18.0} {:>19.0}", rates.publish, rates.host, rates.emits);
    }
    let mean = |lossy: bool, stage: fn(&Rates) -> f64| {
        let rates: Vec<f64> = measured.iter().filter(|(l, _)| *l == lossy).map(|(_, r)| stage(r)).collect();
        rates.iter().sum::<f64>() / rates.len() as f64
    };
    for (name, stage) in [
        ("publish", (|r: &Rates| r.publish) as fn(&Rates) -> f64),
        ("host (bank)", |r: &Rates| r.host),
        ("host (emits)", |r: &Rates| r.emits),
    ] {
        println!("{name}: durable / lossy = {:.2}", mean(false, stage) / mean(true, stage));
    }
}
