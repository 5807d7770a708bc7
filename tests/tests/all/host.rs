//! The host entry point: one settings value in, a running host out. It
//! consumes, serves its admin endpoint, reports its status, stops when
//! asked (or by itself once caught up), and says why it cannot start.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wakuwaku::authoring::demo::{self, WorkloadSpec};
use wakuwaku::engine::consumer::ConsumerError;
use wakuwaku::operations::host::{Host, HostError, HostSettings, ModuleSource};
use wakuwaku::operations::lifecycle::LifecycleError;
use wakuwaku::sandbox::runtime::content_version;
use wakuwaku::storage::log::embedded::EmbeddedLog;
use wakuwaku::storage::log::{EventLog, LogError};
use wakuwaku_tests::{bank_log, bank_module, bank_wasm};

/// The status code of GET `url`, or `None` when nothing answers.
async fn get(url: String) -> Option<u16> {
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        agent.get(&url).call().ok().map(|response| response.status().as_u16())
    })
    .await
    .unwrap()
}

/// A module directory holding the bank module.
fn bank_modules(dir: &std::path::Path) -> std::path::PathBuf {
    let modules = dir.join("modules");
    std::fs::create_dir_all(&modules).unwrap();
    std::fs::copy(bank_wasm(), modules.join("bank.wasm")).unwrap();
    modules
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_started_from_settings_consumes_serves_and_stops_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let spec = WorkloadSpec { events: 3_000, accounts: 30, seed: 5 };
    let (log, oracle) = bank_log(dir.path(), module.clone(), spec, 2).await;
    let modules = bank_modules(dir.path());
    let mut settings =
        HostSettings::new(dir.path().join("data"), "bank", "accounts", ModuleSource::directory(&modules));
    settings.admin = Some("127.0.0.1:0".parse().unwrap());
    let host = Host::start_on(log.clone(), settings).await.unwrap();
    let base = format!("http://{}", host.admin_address().expect("an admin endpoint"));

    let started = Instant::now();
    while !host.progress().caught_up() {
        assert!(started.elapsed() < Duration::from_secs(60), "never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get(format!("{base}/ready")).await, Some(200));
    let status = host.status().await.unwrap();
    assert_eq!((status.projection.as_str(), status.topic.as_str()), ("bank", "accounts"));
    assert_eq!(status.applied, spec.events as u64);
    assert_eq!(status.partitions.len(), 2);
    assert!(status.partitions.iter().all(|p| p.caught_up && p.end_at_start == Some(p.end)), "{status:?}");
    let version = content_version(&std::fs::read(bank_wasm()).unwrap());
    assert_eq!(status.modules.get("bank"), Some(&version));
    // The library recorded the version it runs.
    assert_eq!(host.library().expect("modules from a directory").recorded().unwrap().active["bank"], version);

    let projection = host.projection().clone();
    let summary = host.stop().await.unwrap();
    assert_eq!(summary.applied, spec.events as u64);
    let check = demo::check_projection(&oracle, &*module, projection.store()).unwrap();
    assert!(check.matches(), "{}", check.report(5));
    // Stopping the host stopped its admin endpoint.
    let started = Instant::now();
    while get(format!("{base}/health")).await.is_some() {
        assert!(started.elapsed() < Duration::from_secs(10), "the admin endpoint outlived its host");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_runs_until_caught_up_stops_by_itself_and_a_restart_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let spec = WorkloadSpec { events: 2_000, accounts: 20, seed: 6 };
    let (log, oracle) = bank_log(dir.path(), module.clone(), spec, 2).await;
    let mut settings = HostSettings::new(dir.path(), "bank", "accounts", ModuleSource::Loaded(vec![module.clone()]));
    settings.until_caught_up = true;
    let summary = Host::start_on(log.clone(), settings.clone()).await.unwrap().finished().await.unwrap();
    assert_eq!(summary.applied, spec.events as u64);
    // Nothing new: a second host over the same state consumes nothing.
    let host = Host::start_on(log.clone(), settings).await.unwrap();
    let projection = host.projection().clone();
    assert_eq!(host.finished().await.unwrap().consumed, 0);
    assert!(demo::check_projection(&oracle, &*module, projection.store()).unwrap().matches());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_says_why_it_cannot_start_or_run() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());

    // A name that cannot name a state file.
    let settings = HostSettings::new(dir.path(), "a/b", "accounts", ModuleSource::Loaded(vec![bank_module()]));
    assert!(matches!(Host::start_on(log.clone(), settings).await, Err(HostError::ProjectionName { .. })));

    // A topic that does not exist: the host refuses to start, naming the
    // topic, before it opens the projection's state; asked to create it,
    // it consumes nothing.
    let data = dir.path().join("fresh");
    let mut settings = HostSettings::new(&data, "bank", "accounts", ModuleSource::Loaded(vec![bank_module()]));
    settings.until_caught_up = true;
    let Err(error) = Host::start_on(log.clone(), settings.clone()).await else { panic!("started on a missing topic") };
    assert!(!data.exists(), "a refused start created the projection's state");
    match error {
        HostError::Consumer(ConsumerError::Log(LogError::TopicNotFound { topic })) => assert_eq!(topic, "accounts"),
        other => panic!("expected a missing topic, got {other:?}"),
    }
    settings.create_topic = Some(3);
    let summary = Host::start_on(log.clone(), settings).await.unwrap().finished().await.unwrap();
    assert_eq!(summary.consumed, 0);
    assert_eq!(log.partitions("accounts").await.unwrap(), 3);

    // An empty module directory, for a projection that has none recorded.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let settings = HostSettings::new(dir.path(), "empty", "accounts", ModuleSource::directory(&empty));
    match Host::start_on(log.clone(), settings).await {
        Err(HostError::Modules(LifecycleError::NoModules { dir, .. })) => assert_eq!(dir, empty),
        other => panic!("expected no modules, got {:?}", other.err()),
    }
}
