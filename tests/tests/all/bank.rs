//! The bank workload end to end through the real WASM module: the read
//! model equals the oracle, and every key's handler calls keep the order
//! `spec/ordering.md` requires.

use std::sync::Arc;

use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku::engine::consumer::ConsumerConfig;
use wakuwaku::operations::host::HostSettings;
use wakuwaku::storage::stats::Stat;
use wakuwaku_tests::{Recorder, bank_log, bank_module, catch_up, check_call_order, host_settings, read_partition};

async fn consume_and_check(spec: WorkloadSpec, partitions: u32, batch_size: usize, workers: usize) {
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let (log, oracle) = bank_log(dir.path(), module.clone(), spec, partitions).await;
    let recorder = Arc::new(Recorder::default());
    let config = ConsumerConfig { batch_size, workers, ..ConsumerConfig::default() };
    let settings = HostSettings {
        observer: Some(recorder.clone()),
        ..host_settings(dir.path(), "bank", "accounts", vec![module.clone()], config)
    };

    let (summary, projection) = catch_up(&log, settings).await.unwrap();
    assert_eq!(summary.consumed, spec.events as u64);
    assert_eq!(summary.applied, spec.events as u64);
    assert_eq!((summary.skipped, summary.malformed), (0, 0));
    // Every call is counted; reduction makes fewer calls than events.
    assert!(summary.calls > 0 && summary.calls < summary.applied, "{summary:?}");

    // The read model equals the oracle.
    let store = projection.store();
    let check = demo::check_projection(&oracle, &*module, store).unwrap();
    assert!(check.matches(), "{}", check.report(10));
    assert_eq!(check.accounts, oracle.accounts.len());

    // Counts are committed with the state.
    let stats = store.stats().unwrap();
    assert_eq!(stats[Stat::Applied], spec.events as u64);

    // Every key's calls keep the spec's order, every event handled once.
    let calls = recorder.calls();
    for partition in 0..partitions {
        let records = read_partition(&log, "accounts", partition).await;
        check_call_order(partition, &records, &calls).unwrap_or_else(|e| panic!("partition {partition}: {e}"));
    }

    // Deposits (associative) were folded: some run of several deposits was
    // handed over as one event.
    let deposited = module.event_types().iter().find(|t| t.name == demo::event_name::DEPOSITED).unwrap().tag;
    assert!(calls.iter().any(|c| c.tag == deposited && c.offsets.len() > 1 && c.reduced == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_read_model_matches_the_oracle_and_keeps_order() {
    consume_and_check(WorkloadSpec { events: 40_000, accounts: 400, seed: 11 }, 4, 1024, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_batches_and_one_worker_give_the_same_read_model() {
    consume_and_check(WorkloadSpec { events: 5_000, accounts: 30, seed: 5 }, 2, 7, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_from_the_committed_position_applies_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let spec = WorkloadSpec { events: 6_000, accounts: 50, seed: 9 };
    let (log, oracle) = bank_log(dir.path(), module.clone(), spec, 2).await;
    let settings = |config| host_settings(dir.path(), "bank", "accounts", vec![module.clone()], config);
    // First run: consume only partition 0, then stop.
    let config = ConsumerConfig { batch_size: 500, partitions: Some(vec![0]), ..ConsumerConfig::default() };
    catch_up(&log, settings(config)).await.unwrap();
    // Second run over all partitions: partition 0 resumes at its end.
    let config = ConsumerConfig { batch_size: 500, ..ConsumerConfig::default() };
    let (summary, projection) = catch_up(&log, settings(config)).await.unwrap();
    let end0 = wakuwaku::storage::log::EventLog::end_offset(&*log, "accounts", 0).await.unwrap();
    assert_eq!(summary.consumed, spec.events as u64 - end0, "partition 0 was not consumed again");

    let check = demo::check_projection(&oracle, &*module, projection.store()).unwrap();
    assert!(check.matches(), "{}", check.report(10));
}
