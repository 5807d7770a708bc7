//! The admin endpoint over real HTTP: readiness follows the caught-up gate,
//! metrics count what was applied, and modules, state and status answer in
//! JSON; bad requests get a 4xx that names the problem. With a token,
//! only the probes answer a caller without it, and a host refuses to serve
//! an open endpoint off loopback.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wakuwaku::authoring::demo::WorkloadSpec;
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig};
use wakuwaku::engine::metrics::Metrics;
use wakuwaku::engine::projection::Projection;
use wakuwaku::operations::admin::{self, Admin, ModulesView, Status};
use wakuwaku::storage::state::StateStore;
use wakuwaku_tests::{bank_log, bank_module};

/// GETs `path`, returning the status code and the body.
fn get(base: &str, path: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut response = agent.get(&format!("{base}{path}")).call().unwrap();
    (response.status().as_u16(), response.body_mut().read_to_string().unwrap())
}

async fn get_async(base: &str, path: &str) -> (u16, String) {
    let (base, path) = (base.to_owned(), path.to_owned());
    tokio::task::spawn_blocking(move || get(&base, &path)).await.unwrap()
}

/// The endpoint serving `admin` on a free local port, until stopped.
struct Served {
    address: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    async fn start<L: wakuwaku::storage::log::EventLog>(admin: Admin<L>) -> Self {
        let listener = admin::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(admin::serve(listener, admin, None, async {
            let _ = stopped.await;
        }));
        Self { address, stop, server }
    }

    /// The endpoint of `projection` alone: a bare consumer's progress, no
    /// library or rebuild, metrics of its own.
    async fn bare<L: wakuwaku::storage::log::EventLog>(log: Arc<L>, projection: Arc<Projection>) -> Self {
        let consumer = Consumer::new(log.clone(), projection.clone(), ConsumerConfig::default());
        let progress = consumer.progress();
        Self::start(Admin {
            log,
            projection,
            progress,
            metrics: Arc::new(Metrics::default()),
            library: None,
            rebuild: None,
            token: None,
            read_token: None,
            timing: None,
        })
        .await
    }

    /// The bare endpoint ([`Served::bare`]) of a small bank (10 events on
    /// 2 accounts) kept in `dir`.
    async fn small_bank(dir: &std::path::Path) -> Self {
        let module = bank_module();
        let (log, _) = bank_log(dir, module.clone(), WorkloadSpec { events: 10, accounts: 2, seed: 8 }, 1).await;
        let store = StateStore::open(&dir.join("bank.redb")).unwrap();
        let projection = Arc::new(Projection::new("bank", "accounts", vec![module], store).unwrap());
        Self::bare(log, projection).await
    }

    /// Stops the endpoint and checks it ended cleanly.
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.server.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_endpoint_answers_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let spec = WorkloadSpec { events: 5_000, accounts: 40, seed: 8 };
    let (log, _) = bank_log(dir.path(), module.clone(), spec, 2).await;
    let store = StateStore::open(&dir.path().join("bank.redb")).unwrap();
    let projection = Arc::new(Projection::new("bank", "accounts", vec![module.clone()], store).unwrap());
    let metrics = Arc::new(Metrics::default());
    // A bare consumer: the test checks readiness before consuming starts, which a host does at once.
    let consumer =
        Consumer::new(log.clone(), projection.clone(), ConsumerConfig { batch_size: 256, ..ConsumerConfig::default() })
            .with_metrics(metrics.clone());

    let served = Served::start(Admin {
        log: log.clone(),
        projection: projection.clone(),
        progress: consumer.progress(),
        metrics,
        library: None,
        rebuild: None,
        token: None,
        read_token: None,
        timing: None,
    })
    .await;
    let base = format!("http://{}", served.address);

    assert_eq!(get_async(&base, "/health").await, (200, "ok\n".to_owned()));
    // Not started: not ready.
    let (code, body) = get_async(&base, "/ready").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.starts_with("catching up"), "{body}");

    let (stop_consumer, consumer_stopped) = tokio::sync::oneshot::channel::<()>();
    let following = tokio::spawn(async move {
        consumer
            .follow(async {
                let _ = consumer_stopped.await;
            })
            .await
    });
    let started = Instant::now();
    while get_async(&base, "/ready").await.0 != 200 {
        assert!(started.elapsed() < Duration::from_secs(30), "never became ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get_async(&base, "/ready").await.1, "ready\n");

    let (code, text) = get_async(&base, "/metrics").await;
    assert_eq!(code, 200);
    let applied: u64 = text
        .lines()
        .filter(|l| l.starts_with("waku_events_applied_total{projection=\"bank\",module=\"bank\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(applied, 5_000, "{text}");
    assert!(text.contains(r#"waku_handler_call_seconds_count{projection="bank",module="bank"}"#), "{text}");
    assert!(text.contains(r#"waku_partition_lag{projection="bank",partition="0"} 0"#), "{text}");

    let (code, body) = get_async(&base, "/modules").await;
    assert_eq!(code, 200);
    let modules: ModulesView = serde_json::from_str(&body).unwrap();
    assert_eq!(modules.running.len(), 1);
    assert_eq!(modules.running[0].version, module.version());
    assert!(modules.running[0].event_types.iter().any(|t| t.1 == "Deposited" && t.2 == "associative"));

    let key = projection.store().keys().unwrap()[0].clone();
    let (code, body) = get_async(&base, &format!("/state/bank/{key}")).await;
    assert_eq!(code, 200, "{body}");
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(state["entries"]["account"].is_object(), "{state}");
    assert_eq!(state["key"].to_string(), key.to_string(), "the answer names the key in its text form");
    let spaced = format!("/state/bank/%20{key}%20");
    assert_eq!(get_async(&base, &spaced).await.1, body, "the key's text is read as JSON");
    let (code, body) = get_async(&base, "/state/ledger/1").await;
    assert_eq!((code, body.as_str()), (404, "no projection `ledger` here (this host runs `bank`)\n"));
    let (code, body) = get_async(&base, "/state/bank/forty-two").await;
    assert_eq!(code, 400);
    assert!(body.contains("`forty-two`: not a key"), "{body}");

    let (code, body) = get_async(&base, "/status").await;
    assert_eq!(code, 200);
    let status: Status = serde_json::from_str(&body).unwrap();
    assert_eq!(status.applied, 5_000);
    assert!(status.partitions.iter().all(|p| p.caught_up && p.lag == 0 && p.end_at_start == Some(p.end)));
    assert_eq!(status.modules["bank"], module.version());

    stop_consumer.send(()).unwrap();
    following.await.unwrap().unwrap();
    served.stop().await;
}

/// Connections that never finish their request (a slow-loris client) take
/// at most [`admin::MAX_CONNECTIONS`] of the host's files, however many
/// there are; before, each took one until the process ran out, and with
/// them hot reloads and rebuild requests failed. Once they go, the
/// endpoint answers again; one that stays is closed after
/// [`admin::IDLE_TIMEOUT`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_finish_a_request_hold_at_most_the_connection_limit() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Served::small_bank(dir.path()).await;
    let address = endpoint.address;

    const CLIENTS: usize = 3 * admin::MAX_CONNECTIONS;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut client = tokio::net::TcpStream::connect(address).await.unwrap();
        client.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.unwrap();
        clients.push(client);
    }
    // Let the server accept what it will and close what it must: on a
    // starved machine that takes longer than on an idle one, so wait for
    // it to settle within the bound, up to 10 s.
    let bound = 1..=admin::MAX_CONNECTIONS + 4;
    let settled_by = std::time::Instant::now() + Duration::from_secs(10);
    let mut served = accepted_connections(address.port());
    while !bound.contains(&served) && std::time::Instant::now() < settled_by {
        tokio::time::sleep(Duration::from_millis(100)).await;
        served = accepted_connections(address.port());
    }
    assert!(
        bound.contains(&served),
        "{CLIENTS} unfinished requests made the server hold {served} connections after 10 s"
    );
    drop(clients);
    let (code, body) = get_async(&format!("http://{address}"), "/health").await;
    assert_eq!((code, body.as_str()), (200, "ok\n"));

    // One that trickles its request, a byte a second (well within the idle
    // time): closed at the request's deadline.
    let trickler = tokio::spawn(async move {
        let mut trickle = tokio::net::TcpStream::connect(address).await.unwrap();
        trickle.write_all(b"GET /health HTTP/1.1\r\nX-Slow: ").await.unwrap();
        let started = std::time::Instant::now();
        while trickle.write_all(b"x").await.is_ok() && started.elapsed() < admin::IDLE_TIMEOUT {
            let mut byte = [0u8; 1];
            match tokio::time::timeout(Duration::from_secs(1), tokio::io::AsyncReadExt::read(&mut trickle, &mut byte))
                .await
            {
                Ok(_) => break, // closed (or answered, which it must not be)
                Err(_) => continue,
            }
        }
        started.elapsed()
    });
    // One that stays silent: closed once it has sent nothing for the idle
    // time.
    let mut slow = tokio::net::TcpStream::connect(address).await.unwrap();
    let mut rest = Vec::new();
    let read =
        tokio::time::timeout(admin::IDLE_TIMEOUT * 2, tokio::io::AsyncReadExt::read_to_end(&mut slow, &mut rest));
    assert!(read.await.is_ok(), "an idle connection was still open after twice the idle time");
    let trickled = trickler.await.unwrap();
    assert!(
        trickled < admin::REQUEST_DEADLINE + Duration::from_secs(3),
        "a request sent a byte a second was still read after {trickled:?}"
    );
    endpoint.stop().await;
}

/// A crowd of keep-alive clients from one address, each sending `GET
/// /health` now and then and coming back when closed, more of them than
/// the endpoint serves, and clients that send their request a byte at a
/// time: `/health` still answers every poll within a bound, from the
/// crowd's own address and from another. Before, the crowd took every
/// connection and the polls waited in the kernel's queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_idle_and_slow_clients_crowd_the_endpoint() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Served::small_bank(dir.path()).await;
    let address = endpoint.address;
    let stop = Arc::new(AtomicBool::new(false));
    let mut crowd = Vec::new();
    for client in 0..admin::MAX_CONNECTIONS + 16 {
        let stop = stop.clone();
        crowd.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut connection) = tokio::net::TcpStream::connect(address).await else { continue };
                if client % 4 == 0 {
                    // Slow: a request a byte every 300 ms, never finished.
                    let _ = connection.write_all(b"GET /health HTTP/1.1\r\nX-Slow: ").await;
                    while !stop.load(Ordering::Relaxed) && connection.write_all(b"x").await.is_ok() {
                        let mut byte = [0u8; 1];
                        let read = tokio::time::timeout(Duration::from_millis(300), connection.read(&mut byte));
                        if read.await.is_ok() {
                            break; // closed
                        }
                    }
                    continue;
                }
                // Idle keep-alive: a request now and then on the same connection.
                loop {
                    let request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
                    let mut answer = [0u8; 256];
                    if connection.write_all(request).await.is_err()
                        || matches!(connection.read(&mut answer).await, Ok(0) | Err(_))
                        || stop.load(Ordering::Relaxed)
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(700)).await;
                }
            }
        }));
    }
    // Let the crowd take its places.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for poll in 0..20 {
        let from: std::net::IpAddr = if poll % 2 == 0 { [127, 0, 0, 1] } else { [127, 0, 0, 2] }.into();
        let asked = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(5), async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind((from, 0).into()).unwrap();
            let mut connection = socket.connect(address).await.unwrap();
            connection.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
            let mut answer = Vec::new();
            let _ = connection.read_to_end(&mut answer).await;
            String::from_utf8_lossy(&answer).into_owned()
        })
        .await;
        let answer = answer.unwrap_or_else(|_| panic!("poll {poll} from {from}: no answer within 5 s"));
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok\n"), "poll {poll}: {answer}");
        assert!(asked.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(accepted_connections(address.port()) <= admin::MAX_CONNECTIONS + 4, "the crowd is held to the bound");
    stop.store(true, Ordering::Relaxed);
    for client in crowd {
        client.abort();
    }
    endpoint.stop().await;
}

/// What a 400 or a 404 echoes of the request (a key, a projection's name,
/// decoded from the path) holds no control, bidi or invisible character
/// raw: each is shown as its escape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_answers_escape_what_they_echo() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Served::small_bank(dir.path()).await;
    let base = format!("http://{}", endpoint.address);
    let hidden = |body: &str| body.trim_end_matches('\n').chars().any(wakuwaku_core::terminal::is_hidden);
    let (code, body) = get_async(&base, "/state/bank/x%1b%5b2J%0dforged%e2%80%aey").await;
    assert_eq!(code, 400, "{body}");
    assert!(!hidden(&body) && body.contains("x\\u{1b}[2J\\rforged\\u{202e}y"), "{body:?}");
    let (code, body) = get_async(&base, "/state/l%0aedger%07/1").await;
    assert_eq!(code, 404, "{body}");
    assert!(!hidden(&body) && body.contains("`l\\nedger\\u{7}`"), "{body:?}");
    let (code, body) = get_async(&base, "/state/bank/counters?after%1b=1").await;
    assert_eq!(code, 400, "{body}");
    assert!(!hidden(&body), "{body:?}");
    endpoint.stop().await;
}

/// How many connections to `port` this process has accepted and still
/// holds: sockets of its own (in `/proc/self/fd`) whose local port is
/// `port` and that are not the listener. Counted by socket, not by open
/// files, so the tests running beside this one do not count.
fn accepted_connections(port: u16) -> usize {
    let own: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|link| Some(link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned()))
        .collect();
    let listening = "0A";
    ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| table.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields.get(1).and_then(|local| local.rsplit(':').next());
            local_port.and_then(|hex| u16::from_str_radix(hex, 16).ok()) == Some(port)
                && fields.get(3) != Some(&listening)
                && fields.get(9).is_some_and(|inode| own.contains(*inode))
        })
        .count()
}

/// A projection whose module made many counters: a key's view answers the
/// key's entries and the first page of counters, never all of them (it
/// answered every counter in every key's view: 382 MB for 1.5 M counters),
/// and the counters have a view of their own, a page at a time, that
/// reaches every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_answer_a_page_of_state_however_many_counters_there_are() {
    use wakuwaku::key::Key;
    use wakuwaku::storage::log::EventLog;
    use wakuwaku::storage::log::embedded::EmbeddedLog;
    use wakuwaku::storage::state::{BatchCommit, KeyWrites};

    const COUNTERS: usize = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(EmbeddedLog::open(dir.path().join("log.redb")).unwrap());
    log.create_topic("accounts", 1).await.unwrap();
    let store = StateStore::open(&dir.path().join("bank.redb")).unwrap();
    let mut writes = KeyWrites::default();
    writes.set("account", br#"{"balance": 7}"#.to_vec());
    for i in 0..250 {
        writes.set(&format!("note.{i:03}"), vec![b'n'; 64]);
    }
    let counter_deltas = (0..COUNTERS).map(|i| (format!("{i:06}.{}", "c".repeat(240)), 1)).collect();
    store.commit(BatchCommit { writes: vec![(Key::int(42), writes)], counter_deltas, ..Default::default() }).unwrap();
    let projection = Arc::new(Projection::new("bank", "accounts", vec![bank_module()], store).unwrap());
    let served = Served::bare(log, projection).await;
    let base = format!("http://{}", served.address);

    // The key's view: a page of entries, the first counters, and where
    // both go on. 20 000 counters of 247 bytes were 5 MB in every key's view.
    let (code, body) = get_async(&base, "/state/bank/42").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.len() < 64 << 10, "a key's view has {} bytes", body.len());
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(view["entries"]["account"]["balance"], 7);
    assert_eq!(view["entries"].as_object().unwrap().len(), admin::view::ENTRIES_PAGE);
    assert_eq!(view["entries_next"], "note.098", "entries are in name order: `account` first");
    assert_eq!(view["counters"].as_object().unwrap().len(), admin::view::COUNTERS_PAGE);
    let counters_next = view["counters_next"].as_str().unwrap().to_owned();
    // The next page of entries, and one entry alone.
    let (code, body) = get_async(&base, "/state/bank/42?after=note.098&limit=1000").await;
    assert_eq!(code, 200, "{body}");
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(view["entries"].as_object().unwrap().len(), 151);
    assert!(view.get("entries_next").is_none(), "{view}");
    let (_, body) = get_async(&base, "/state/bank/42?entry=note.200").await;
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(view["entries"].as_object().unwrap().keys().collect::<Vec<_>>(), ["note.200"]);

    // The counters' view, a page at a time, reaches every counter once.
    let mut seen = std::collections::BTreeSet::new();
    let mut after = None::<String>;
    let mut pages = 0;
    loop {
        let path = match &after {
            Some(after) => format!("/state/bank/counters?limit=1000&after={after}"),
            None => "/state/bank/counters?limit=1000".to_owned(),
        };
        let (code, body) = get_async(&base, &path).await;
        assert_eq!(code, 200, "{body}");
        assert!(body.len() < 512 << 10, "a page of counters has {} bytes", body.len());
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        for (name, value) in page["counters"].as_object().unwrap() {
            assert_eq!(value, 1);
            assert!(seen.insert(name.clone()), "{name} shown twice");
        }
        pages += 1;
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!((seen.len(), pages), (COUNTERS, COUNTERS / 1000));
    // The key view's `counters_next` continues where its page ended.
    let (_, body) = get_async(&base, &format!("/state/bank/counters?after={counters_next}&limit=1")).await;
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    let first = page["counters"].as_object().unwrap().keys().next().unwrap().clone();
    assert!(first.starts_with("000100."), "{first}");
    // The default page, and more than the most a page holds.
    let (_, body) = get_async(&base, "/state/bank/counters").await;
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(page["counters"].as_object().unwrap().len(), admin::view::COUNTERS_PAGE);
    let (_, body) = get_async(&base, "/state/bank/counters?limit=1000000").await;
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(page["counters"].as_object().unwrap().len(), admin::view::MAX_PAGE);

    // Bad queries name the problem; there is no shadow without a rebuild.
    let (code, body) = get_async(&base, "/state/bank/counters?limit=0").await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("`limit`"), "{body}");
    let (code, body) = get_async(&base, "/state/bank/42?page=2").await;
    assert_eq!(
        (code, body.as_str()),
        (400, "unknown query parameter `page` (this view takes after, limit and entry)\n")
    );
    let (code, body) = get_async(&base, "/shadow/bank/counters").await;
    assert_eq!((code, body.as_str()), (404, "no rebuild of `bank` is under way\n"));
    let (code, _) = get_async(&base, "/state/ledger/counters").await;
    assert_eq!(code, 404);

    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_only_the_probes_answer_a_caller_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let (log, _) = bank_log(dir.path(), module.clone(), WorkloadSpec { events: 20, accounts: 2, seed: 3 }, 1).await;
    let store = StateStore::open(&dir.path().join("bank.redb")).unwrap();
    let projection = Arc::new(Projection::new("bank", "accounts", vec![module], store).unwrap());
    let consumer = Consumer::new(log.clone(), projection.clone(), ConsumerConfig::default());
    let served = Served::start(Admin {
        log,
        projection,
        progress: consumer.progress(),
        metrics: Arc::new(Metrics::default()),
        library: None,
        rebuild: None,
        token: admin::AdminToken::new("lib-token", "test").unwrap(),
        read_token: None,
        timing: None,
    })
    .await;
    let base = format!("http://{}", served.address);
    assert_eq!(get_async(&base, "/health").await, (200, "ok\n".to_owned()));
    assert_eq!(get_async(&base, "/ready").await.0, 503, "open, and not caught up");
    for route in ["/metrics", "/modules", "/status", "/state/bank/1", "/state/bank/counters", "/shadow/bank/1"] {
        assert_eq!(get_async(&base, route).await, (401, "unauthorized\n".to_owned()), "{route}");
    }
    served.stop().await;
}

#[tokio::test]
async fn a_host_refuses_an_open_endpoint_off_loopback_with_a_typed_error() {
    use wakuwaku::operations::host::{Host, HostError, HostSettings, ModuleSource};
    let dir = tempfile::tempdir().unwrap();
    let mut settings = HostSettings::new(dir.path(), "bank", "accounts", ModuleSource::Loaded(vec![bank_module()]));
    settings.admin = Some("0.0.0.0:0".parse().unwrap());
    let Err(error) = Host::start(settings).await else { panic!("an open endpoint on 0.0.0.0 started") };
    assert!(matches!(error, HostError::AdminUnprotected { .. }), "{error}");
}

/// Pending timers and the earliest of them are on `/status`, `/metrics`
/// and the status read from the files, as the store holds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_timers_and_the_next_due_time_are_on_status_and_metrics() {
    use wakuwaku::storage::state::{BatchCommit, TimerWrite};
    use wakuwaku_core::timers::Timer;

    let dir = tempfile::tempdir().unwrap();
    let module = bank_module();
    let (log, _) = bank_log(dir.path(), module.clone(), WorkloadSpec { events: 10, accounts: 2, seed: 8 }, 1).await;
    let store = StateStore::open(&dir.path().join("bank.redb")).unwrap();
    let timer = |name: &str, at| Timer { name: name.into(), at, payload: vec![] };
    let write = |key: u64, timers| TimerWrite { key: wakuwaku::key::Key::int(key), partition: 0, timers };
    let timers = vec![write(1, vec![timer("a", 5_000), timer("b", 7_000)]), write(2, vec![timer("a", 3_000)])];
    store.commit(BatchCommit { timers, ..BatchCommit::default() }).unwrap();
    let projection = Arc::new(Projection::new("bank", "accounts", vec![module], store.clone()).unwrap());

    let offline = admin::status(&*log, "bank", "accounts", &store, None, Default::default()).await.unwrap();
    assert_eq!((offline.timers_pending, offline.next_timer_ms), (3, Some(3_000)));

    let served = Served::bare(log.clone(), projection).await;
    let base = format!("http://{}", served.address);
    let (code, body) = get_async(&base, "/status").await;
    assert_eq!(code, 200, "{body}");
    let status: Status = serde_json::from_str(&body).unwrap();
    assert_eq!((status.timers_pending, status.next_timer_ms), (3, Some(3_000)));
    let (code, metrics) = get_async(&base, "/metrics").await;
    assert_eq!(code, 200, "{metrics}");
    assert!(metrics.contains(r#"waku_timers_pending{projection="bank"} 3"#), "{metrics}");
    assert!(metrics.contains(r#"waku_timer_next_due_ms{projection="bank"} 3000"#), "{metrics}");
    served.stop().await;

    // Without timers the status leaves them out of its JSON.
    store.commit(BatchCommit { timers: vec![write(1, vec![]), write(2, vec![])], ..BatchCommit::default() }).unwrap();
    let none = admin::status(&*log, "bank", "accounts", &store, None, Default::default()).await;
    let none = serde_json::to_value(none.unwrap()).unwrap();
    assert!(none.get("timers_pending").is_none() && none.get("next_timer_ms").is_none(), "{none}");
}
