//! The Python bank (`examples/bank-py`, built with componentize-py from the
//! Python SDK) through the real host: it describes itself as the Rust bank
//! does, gives every body the Rust bank's key and ordering (so modules in
//! both languages can share a topic), fails bad input as the Rust bank
//! does, and its read model after a seeded workload equals the oracle. And
//! the Python SDK's windows (`tests/guests/windows-py`, on timers) through
//! the real host, every window's total against an oracle by sorting.
//!
//! Each test needs componentize-py (see `wakuwaku_tests::python`); without
//! it, it prints one `skipped: …` line, except under CI, where it fails.

use wakuwaku_tests::python::{bank_py_module, windows_py_module};
use wakuwaku_tests::{click_windows, ported_bank};

#[test]
fn the_python_bank_describes_keys_and_orders_as_the_rust_bank() {
    let Some(module) = bank_py_module("the Python bank's description, keys and orderings") else { return };
    ported_bank::describes_keys_and_orders_as_the_rust_bank(module);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_bank_read_model_matches_the_oracle_and_keeps_order() {
    let Some(module) = bank_py_module("the Python bank against the oracle") else { return };
    ported_bank::read_model_matches_the_oracle_and_keeps_order(module).await;
}

/// Tumbling, hopping and session windows of the Python SDK
/// (`tests/guests/windows-py`, contract 0.5) through the real host, every
/// window's total against an oracle by sorting (`wakuwaku_tests::click_windows`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_windows_emit_what_sorting_gives_through_the_host() {
    let Some(module) = windows_py_module("the Python windows through the host") else { return };
    click_windows::emit_what_sorting_gives(module).await;
}
