//! `waku demo nexmark` at a small size, as CI runs it (`docs/timers.md`,
//! "Nexmark"): Nexmark's queries 5 and 7 on the SDK's windows over a
//! seeded stream, what they emit checked against the demo's oracle, which
//! sorts the generated bids.

use crate::common::{bank_wasm, nexmark_wasm, text, waku};

/// 60 s of event time at 1 000 events/s over 3 partitions: query 7 closes
/// its 10 s windows, query 5 its windows of 5 slots, and both match the
/// oracle; the bank runs as the baseline over as many events.
#[test]
fn the_nexmark_demo_runs_queries_5_and_7_and_matches_the_oracle() {
    let dir = tempfile::tempdir().unwrap();
    let (first, hot) = nexmark_wasm();
    let (first, hot) = (first.display().to_string(), hot.display().to_string());
    let args = ["demo", "nexmark", "--events", "60000", "--rate", "1000", "--partitions", "3", "--seed", "7"];
    let bank = bank_wasm().display().to_string();
    let modules = ["--module", &first, "--hot-module", &hot, "--bank-module", &bank];
    let out = waku(&[&args[..], &modules, &["--data", "data"]].concat(), dir.path());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("60000 events (1200 persons, 3600 auctions, 55200 bids: Nexmark's 1:3:46)"), "{stdout}");
    assert!(stdout.contains("0 dead-lettered, 6 windows emitted"), "query 7 closes its 6 windows:\n{stdout}");
    // 30 slots of 2 s; the windows all of whose 5 slots closed: 26.
    assert!(stdout.contains("30 slots emitted"), "{stdout}");
    assert!(stdout.contains("the plain bank projection (the baseline), as many bank events: 60000 events"), "{stdout}");
    assert!(stdout.contains("throughput ÷ the bank's: query 7 "), "{stdout}");
    let verdict = stdout.lines().last().unwrap();
    assert!(verdict.starts_with("oracle check: match (query 5: 26 windows, query 7: 6 windows"), "{stdout}");
}
