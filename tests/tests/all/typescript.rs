//! The TypeScript bank (`examples/bank-ts`, built with esbuild and componentize-js from the
//! TypeScript SDK) through the real host: it describes itself as the Rust bank
//! does, gives every body the Rust bank's key and ordering (so modules in
//! both languages can share a topic), fails bad input as the Rust bank
//! does, and its read model after a seeded workload equals the oracle. And
//! the TypeScript SDK's windows (`tests/guests/windows-ts`, on timers)
//! through the real host, every window's total against an oracle by sorting.
//!
//! Each test needs the npm tools (see `wakuwaku_tests::typescript`); without
//! them, it prints one `skipped: …` line, except under CI, where it fails.

use std::sync::Arc;

use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku_tests::typescript::{bank_ts_module, windows_ts_module};
use wakuwaku_tests::{click_windows, ported_bank};

#[test]
fn the_typescript_bank_describes_keys_and_orders_as_the_rust_bank() {
    let Some(module) = bank_ts_module("the TypeScript bank's description, keys and orderings") else { return };
    ported_bank::describes_keys_and_orders_as_the_rust_bank(module);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_bank_read_model_matches_the_oracle_and_keeps_order() {
    let Some(module) = bank_ts_module("the TypeScript bank against the oracle") else { return };
    ported_bank::read_model_matches_the_oracle_and_keeps_order(module).await;
}

/// Tumbling, hopping and session windows of the TypeScript SDK
/// (`tests/guests/windows-ts`, contract 0.5) through the real host, every
/// window's total against an oracle by sorting (`wakuwaku_tests::click_windows`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_windows_emit_what_sorting_gives_through_the_host() {
    let Some(module) = windows_ts_module("the TypeScript windows through the host") else { return };
    click_windows::emit_what_sorting_gives(module).await;
}

/// What one instance of the TypeScript bank costs: it starts within 16 MiB
/// of instance memory (its snapshot alone is 145 pages, 9.1 MiB; the
/// host's default limit is 64 MiB), and the time to instantiate it is
/// printed (`--nocapture`). Its heap grows with every call until the engine
/// collects it, and linear memory never shrinks: the instance handles a
/// workload of 4 000 calls under 16 MiB only because the sandbox replaces
/// it whenever it passes its memory's high-water mark (without that, it
/// runs out within them).
#[test]
fn a_typescript_instance_starts_in_16_mib_and_is_replaced_before_it_fills_them() {
    use std::time::{Duration, Instant};
    use wakuwaku::sandbox::handler::{BatchBudget, KeyScope, PayloadLimits};
    use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits};
    use wakuwaku::storage::state::StateStore;
    let Some(wasm) = wakuwaku_tests::typescript::bank_ts_wasm("the TypeScript bank's instance memory") else {
        return;
    };
    let cache = wakuwaku_tests::repo_root().join("target/guests/cache");
    let limits =
        SandboxLimits { memory_bytes: 16 << 20, compile_budget: Duration::from_secs(300), ..SandboxLimits::default() };
    let sandbox = Sandbox::new(limits).unwrap().with_compile_cache(&cache);
    let module = wakuwaku::engine::projection::load_module_file(&sandbox, &wasm).unwrap();
    let types = module.event_types().to_vec();
    let tag = |name: &str| types.iter().find(|t| t.name == name).unwrap().tag;
    let (events, _) = demo::workload(WorkloadSpec { events: 2_000, accounts: 50, seed: 5 });
    let runs = 10u32;
    let started = Instant::now();
    for _ in 0..runs {
        let instance = module.instantiate().expect("an instance within 16 MiB");
        drop(instance);
    }
    let per_instance = started.elapsed() / runs;
    let mut instance = module.instantiate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(&dir.path().join("state.redb")).unwrap();
    let reader = Arc::new(store.reader().unwrap());
    let payload = PayloadLimits::default();
    for event in &events {
        let body = serde_json::to_vec(&event.body).unwrap();
        let tag = tag(event.type_name);
        let key = instance.key(tag, &body).unwrap();
        let mut scope = KeyScope::new(key, reader.clone(), payload, BatchBudget::new(&payload));
        instance.handle(&mut scope, tag, &[body]).expect("a call within 16 MiB");
    }
    let recycled = module.take_instances_recycled();
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "TypeScript bank: {per_instance:?} per instantiation (mean of {runs}); {recycled} instances replaced in {} \
         calls",
        2 * events.len()
    );
    assert!(recycled > 0, "4 000 calls fit in 16 MiB without replacing the instance");
}
