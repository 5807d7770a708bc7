//! The bank workload through the host with its state in PostgreSQL: the
//! read model equals the oracle, plain SQL on the projection's view reads
//! an account's balance, and a restart resumes at the committed positions
//! without applying anything twice.
//!
//! Needs a server named by `WAKU_POSTGRES_URL` (`.ci/run` starts one);
//! without it, the test prints one `skipped: …` line (under CI it fails).
//! Each run uses a projection of its own, so runs share one database.

use std::collections::HashMap;

use wakuwaku::consumer::{ConsumerConfig, stat};
use wakuwaku::demo::{self, WorkloadSpec};
use wakuwaku::host::StateSettings;
use wakuwaku::log::EventLog;
use wakuwaku_tests::{bank_log, bank_module, catch_up, fresh_stream, host_settings, postgres_url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bank_on_postgres_matches_the_oracle_reads_by_sql_and_resumes() {
    let Some(url) = postgres_url("the bank on PostgreSQL") else { return };
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let spec = WorkloadSpec { events: 8_000, accounts: 120, seed: 21 };
    let (log, oracle) = bank_log(dir.path(), module.clone(), spec, 4).await;
    let projection = fresh_stream("bank").replace('-', "_");
    let settings = |partitions: Option<Vec<u32>>| {
        let config = ConsumerConfig { batch_size: 400, partitions, ..ConsumerConfig::default() };
        let mut settings = host_settings(dir.path(), &projection, "accounts", vec![module.clone()], config);
        settings.state = StateSettings::Postgres { url: url.clone() };
        settings
    };

    // First run: partition 0 only; then a restart over all partitions
    // resumes partition 0 at its end.
    let (first, _) = catch_up(&log, settings(Some(vec![0]))).await.unwrap();
    let end0 = log.end_offset("accounts", 0).await.unwrap();
    assert_eq!(first.consumed, end0);
    let (second, projection_state) = catch_up(&log, settings(None)).await.unwrap();
    assert_eq!(second.consumed, spec.events as u64 - end0, "partition 0 was consumed again");
    // A third run finds nothing left to do.
    let (third, _) = catch_up(&log, settings(None)).await.unwrap();
    assert_eq!((third.consumed, third.applied), (0, 0));

    let store = projection_state.store();
    let check = demo::check_projection(&oracle, &*module, store).unwrap();
    assert!(check.matches(), "{}", check.report(10));
    assert_eq!(check.accounts, oracle.accounts.len());
    // Every event applied exactly once across the three runs.
    let stats: HashMap<_, _> = store.stats().unwrap().into_iter().collect();
    assert_eq!(stats.get(stat::APPLIED).copied(), Some(spec.events as u64));

    // Plain SQL on the documented view answers an account's balance.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    for (&account, expected) in oracle.accounts.iter().take(20) {
        let sql = format!(
            "SELECT (json->>'balance')::bigint FROM \"waku_state_{projection}\" \
             WHERE key = $1 AND name = '{}'",
            demo::ACCOUNT_ENTRY
        );
        let row = client.query_one(&sql, &[&account.to_string()]).await.unwrap();
        assert_eq!(row.get::<_, i64>(0), expected.balance, "account {account}");
    }
}
