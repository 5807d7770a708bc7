//! The operator console (`/console` on the admin endpoint), first over
//! plain HTTP (who may see and do what, from where), then in a real
//! browser: Debian's chromium, headless, driven through chromedriver.
//!
//! Two endpoints with data: a bank of two module versions kept (overview,
//! partitions, modules and their rollback, topics), and a projection of the
//! flaky test module whose dead letters hold a hostile publisher's strings
//! (keys, reasons, bodies with markup, `javascript:` links, bidi and
//! control characters), one of them re-driven through the page once the
//! module is fixed. The browser test saves a screenshot of each view
//! (`WAKU_CONSOLE_SCREENSHOTS=<dir>` says where; by default under the
//! target directory). Without chromium or chromedriver it is skipped with
//! one line, unless `CI=true`, where it fails.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wakuwaku::authoring::demo::WorkloadSpec;
use wakuwaku::engine::consumer::{Consumer, ConsumerConfig};
use wakuwaku::engine::metrics::Metrics;
use wakuwaku::engine::projection::Projection;
use wakuwaku::event::{Algebra, EventAtomicOrdering, EventHeaders};
use wakuwaku::key::{Key, KeyValue};
use wakuwaku::operations::admin::{self, Admin, AdminToken};
use wakuwaku::operations::lifecycle::Library;
use wakuwaku::sandbox::runtime::{Sandbox, SandboxLimits, content_version};
use wakuwaku::storage::log::{EmbeddedLog, EventLog, Record};
use wakuwaku::storage::state::{PostgresStore, StateStore};
use wakuwaku_tests::flaky::{Flaky, STEP, Step};
use wakuwaku_tests::hostile::{self, attack, hostile_module, tag};
use wakuwaku_tests::{bank_log, bank_module, bank_variant, fresh_stream, postgres_url};

const TOKEN: &str = "console-admin-token";
const READ_TOKEN: &str = "console-read-token";

/// What a hostile publisher writes: markup, a script URL, bidi overrides
/// and control characters.
const HOSTILE: &str = "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\"><a \
                       href=\"javascript:window.__pwned=3\">x</a>\u{202e}gnp.exe\u{7}\u{1b}[2J";

/// An endpoint served on a free local port, its consumer following, until
/// dropped.
struct Served {
    address: SocketAddr,
    /// Another host of the group, holding a partition (PostgreSQL state).
    other: Option<PostgresStore>,
    /// A host of the group that runs but holds no partition, named with
    /// its admin address (PostgreSQL state).
    _idle: Option<PostgresStore>,
    _stop: tokio::sync::oneshot::Sender<()>,
    _stop_consumer: tokio::sync::oneshot::Sender<()>,
}

impl Served {
    async fn start<L: EventLog>(admin: Admin<L>, consumer: Consumer<L>) -> Self {
        let listener = admin::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(admin::serve(listener, admin, None, async {
            let _ = stopped.await;
        }));
        let (stop_consumer, consumer_stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            consumer
                .follow(async {
                    let _ = consumer_stopped.await;
                })
                .await
                .unwrap()
        });
        Self { address, other: None, _idle: None, _stop: stop, _stop_consumer: stop_consumer }
    }
}

fn tokens() -> (Option<AdminToken>, Option<AdminToken>) {
    (AdminToken::new(TOKEN, "test").unwrap(), AdminToken::new(READ_TOKEN, "test").unwrap())
}

/// The name another host of the bank's group gives its hold session: markup,
/// and an admin address that is no `host:port`, so no link (PostgreSQL
/// keeps 63 bytes of printable ASCII).
const OTHER_HOST: &str = "other <img src=x onerror=window.__pwned=4> admin javascript:x:1";

/// The admin address the idle host of the bank's group names.
const IDLE_ADMIN: &str = "127.0.0.1:9";

/// The bank's state: on PostgreSQL when `WAKU_POSTGRES_URL` names a server
/// (a projection of its own, partition 1 held by another host named
/// [`OTHER_HOST`], and a third host running without a partition, named
/// with [`IDLE_ADMIN`]), else an embedded file: (projection name, store,
/// the other host, the idle one).
fn bank_store(dir: &Path) -> (String, StateStore, Option<PostgresStore>, Option<PostgresStore>) {
    let Some(url) = postgres_url("the console's group members") else {
        return ("bank".to_owned(), StateStore::open(&dir.join("bank.redb")).unwrap(), None, None);
    };
    let projection = fresh_stream("console").replace('-', "_");
    let other = PostgresStore::connect(&url, &projection).unwrap();
    other.name_member(OTHER_HOST);
    use wakuwaku::storage::state::StateBackend;
    other.claim_released(1).unwrap().expect("nobody held partition 1");
    let idle = PostgresStore::connect(&url, &projection).unwrap();
    idle.name_member_with_admin(IDLE_ADMIN);
    idle.hold_for_run().unwrap();
    let store = StateStore::from_backend(PostgresStore::connect(&url, &projection).unwrap());
    (projection, store, Some(other), Some(idle))
}

/// The name the idle host gives: this machine's, this process's, its admin address.
fn idle_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    format!("{} pid {} admin {IDLE_ADMIN}", host.trim(), std::process::id())
}

/// The bank of 300 events on 2 partitions, run by version 1 with version
/// 0 kept, from a module directory: (endpoint, projection, version 0,
/// version 1, events).
async fn bank(dir: &Path) -> (Served, Arc<Projection>, String, String, u64) {
    let events = 300;
    let (log, _) = bank_log(dir, bank_module(), WorkloadSpec { events, accounts: 12, seed: 48 }, 2).await;
    let modules = dir.join("modules");
    std::fs::create_dir_all(&modules).unwrap();
    let (name, store, other, idle) = bank_store(dir);
    let library = Library::new(dir, "bank", store.clone(), Sandbox::new(SandboxLimits::default()).unwrap());
    std::fs::write(modules.join("bank.wasm"), bank_variant(0)).unwrap();
    library.start(&modules, false).unwrap();
    std::fs::write(modules.join("bank.wasm"), bank_variant(1)).unwrap();
    let (running, _) = library.start(&modules, true).unwrap();
    let projection = Arc::new(Projection::new(&name, "accounts", running, store).unwrap());
    let consumer = Consumer::new(log.clone(), projection.clone(), ConsumerConfig::default());
    let (token, read_token) = tokens();
    let admin = Admin {
        log,
        projection: projection.clone(),
        progress: consumer.progress(),
        metrics: Arc::new(Metrics::default()),
        library: Some(Arc::new(library)),
        rebuild: None,
        token,
        read_token,
        timing: Some(consumer.timing()),
    };
    let served = Served { other, _idle: idle, ..Served::start(admin, consumer).await };
    (served, projection, content_version(&bank_variant(0)), content_version(&bank_variant(1)), events as u64)
}

/// A projection of the flaky module over topic `steps`: key 7's step 2
/// dead-lettered while the module was broken (then fixed), and a hostile
/// publisher's event (its key, its body) dead-lettered because its body is
/// no step, with the body in the reason.
async fn flaky(dir: &Path) -> (Served, Arc<Projection>, Flaky) {
    let log = Arc::new(EmbeddedLog::open(dir.join("steps.redb")).unwrap());
    log.create_topic("steps", 1).await.unwrap();
    let record = |key: Key, body: Vec<u8>| {
        let headers = EventHeaders {
            tag: STEP,
            key,
            ordering: EventAtomicOrdering::Relaxed,
            algebra: Algebra::NonAssociative,
            event_time: None,
        };
        Record { headers: headers.to_headers(), body }
    };
    let step = |seq| Step { seq, amount: 1, ..Step::default() }.body();
    let hostile_key = Key::of(&KeyValue::Str(HOSTILE.to_owned())).unwrap();
    let hostile_body = serde_json::to_vec(&serde_json::json!({ "seq": HOSTILE })).unwrap();
    let records =
        vec![record(Key::int(1u64), step(1)), record(Key::int(7u64), step(2)), record(hostile_key, hostile_body)];
    log.append("steps", vec![(0, records)]).await.unwrap();
    let module = Flaky::new();
    let store = StateStore::open(&dir.join("flaky.redb")).unwrap();
    let projection = Arc::new(Projection::new("flaky", "steps", vec![Arc::new(module.clone())], store).unwrap());
    // Broken for the first batch: every event but the hostile one fails
    // as "not fixed yet"; the hostile one fails to parse.
    module.broken.store(true, std::sync::atomic::Ordering::SeqCst);
    let consumer = Consumer::new(log.clone(), projection.clone(), ConsumerConfig::default());
    assert_eq!(consumer.catch_up().await.unwrap().dead_lettered, 3);
    module.broken.store(false, std::sync::atomic::Ordering::SeqCst);
    let (token, read_token) = tokens();
    let admin = Admin {
        log,
        projection: projection.clone(),
        progress: consumer.progress(),
        metrics: Arc::new(Metrics::default()),
        library: None,
        rebuild: None,
        token,
        read_token,
        timing: None,
    };
    (Served::start(admin, consumer).await, projection, module)
}

/// A projection of the timed flaky module over topics `a` and `b`: once
/// both reached their end (the clock past both events, 60 and 50 s ago),
/// an event of the hostile key of two minutes ago is read late, by 70 s.
async fn timed(dir: &Path) -> (Served, Arc<wakuwaku::engine::consumer::TimingBoard>) {
    let log = Arc::new(EmbeddedLog::open(dir.join("timed.redb")).unwrap());
    for topic in ["a", "b"] {
        log.create_topic(topic, 1).await.unwrap();
    }
    let now = wakuwaku::platform::clock::now_ms() as i64;
    let record = |key: Key, seq: u64, event_time: i64| {
        let headers = EventHeaders {
            tag: STEP,
            key,
            ordering: EventAtomicOrdering::Relaxed,
            algebra: Algebra::NonAssociative,
            event_time: Some(event_time),
        };
        Record { headers: headers.to_headers(), body: Step { seq, amount: 1, ..Step::default() }.body() }
    };
    log.append("a", vec![(0, vec![record(Key::int(1u64), 1, now - 60_000)])]).await.unwrap();
    log.append("b", vec![(0, vec![record(Key::int(2u64), 2, now - 50_000)])]).await.unwrap();
    let store = StateStore::open(&dir.join("timed-state.redb")).unwrap();
    let projection = Projection::new("timed", "a", vec![Arc::new(Flaky::new().timed())], store)
        .unwrap()
        .with_more_topics(&["b".to_owned()])
        .unwrap();
    let projection = Arc::new(projection);
    let consumer = Consumer::new(log.clone(), projection.clone(), ConsumerConfig::default());
    let timing = consumer.timing();
    let (token, read_token) = tokens();
    let admin = Admin {
        log: log.clone(),
        projection: projection.clone(),
        progress: consumer.progress(),
        metrics: Arc::new(Metrics::default()),
        library: None,
        rebuild: None,
        token,
        read_token,
        timing: Some(timing.clone()),
    };
    let served = Served::start(admin, consumer).await;
    let start = Instant::now();
    loop {
        let board = timing.snapshot();
        if board.len() == 1 && board[0].inputs.iter().all(|input| input.idle) && board[0].clock_ms > Some(now - 50_000)
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "the clock passes both events: {board:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let hostile = Key::of(&KeyValue::Str(HOSTILE.to_owned())).unwrap();
    log.append("a", vec![(0, vec![record(hostile, 3, now - 120_000)])]).await.unwrap();
    eventually("the late event", || timing.late_events().total == 1).await;
    (served, timing)
}

/// How many calls of the hostile module fail with its own error.
const HOSTILE_FAILURES: u64 = 4;

/// How many plain log lines the hostile module writes before its hostile one.
const PLAIN_LINES: u64 = 25;

/// A projection of the hostile test module (a WASM component, measured by
/// its sandbox) over topic `attacks`: [`HOSTILE_FAILURES`] events that fail
/// with a handler error (dead-lettered at once, unrecoverable), ten that
/// behave, then [`PLAIN_LINES`] log lines and one of [`HOSTILE`] text for
/// the [`HOSTILE`] key, all applied or dead-lettered: (endpoint, the
/// module's version).
async fn hostile_host(dir: &Path) -> (Served, String) {
    let log = Arc::new(EmbeddedLog::open(dir.join("attacks.redb")).unwrap());
    log.create_topic("attacks", 1).await.unwrap();
    log.create_topic(hostile::OUT, 1).await.unwrap();
    let module = hostile_module(&Sandbox::new(SandboxLimits::default()).unwrap());
    let version = module.version().to_owned();
    let mut records: Vec<Record> =
        (0..HOSTILE_FAILURES).map(|key| attack(tag::HUGE_ERROR, key, serde_json::json!({ "size": 64 }))).collect();
    records.extend((100..110).map(|key| attack(tag::BEHAVE, key, serde_json::json!({}))));
    let plain = serde_json::json!({ "n": PLAIN_LINES, "mode": "text", "name": "a plain line" });
    records.push(attack(tag::LOG_FLOOD, 200, plain));
    let headers = EventHeaders {
        tag: tag::LOG_FLOOD,
        key: Key::of(&KeyValue::Str(HOSTILE.to_owned())).unwrap(),
        ordering: EventAtomicOrdering::Relaxed,
        algebra: Algebra::NonAssociative,
        event_time: None,
    };
    let body = serde_json::json!({ "key": 0, "n": 1, "mode": "text", "name": HOSTILE });
    let hostile_line = Record { headers: headers.to_headers(), body: serde_json::to_vec(&body).unwrap() };
    log.append("attacks", vec![(0, records)]).await.unwrap();
    let store = StateStore::open(&dir.join("hostile.redb")).unwrap();
    let projection = Arc::new(Projection::new("hostile", "attacks", vec![module], store).unwrap());
    let consumer = Consumer::new(log.clone(), projection.clone(), ConsumerConfig::default());
    assert_eq!(consumer.catch_up().await.unwrap().dead_lettered, HOSTILE_FAILURES);
    // The hostile line last (keys of one batch run side by side).
    log.append("attacks", vec![(0, vec![hostile_line])]).await.unwrap();
    assert_eq!(consumer.catch_up().await.unwrap().dead_lettered, 0);
    let (token, read_token) = tokens();
    let admin = Admin {
        log,
        projection,
        progress: consumer.progress(),
        metrics: Arc::new(Metrics::default()),
        library: None,
        rebuild: None,
        token,
        read_token,
        timing: None,
    };
    (Served::start(admin, consumer).await, version)
}

/// Waits up to 20 s for `done`.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn caught_up(projection: &Projection, events: u64) -> bool {
    let stats = projection.store().stats().unwrap();
    stats[wakuwaku::storage::stats::Stat::Applied] >= events
}

// ---- over plain HTTP ----

/// An answer: status, headers, body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

fn call(method: &str, url: &str, headers: &[(&str, &str)], body: Option<&str>) -> Answer {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).max_redirects(0).build().into();
    let mut response = match (method, body) {
        ("GET", _) => {
            let mut request = agent.get(url);
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            request.call().unwrap()
        }
        (_, body) => {
            let mut request = agent.post(url);
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            request.send(body.unwrap_or_default()).unwrap()
        }
    };
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| (name.as_str().to_owned(), value.to_str().unwrap_or_default().to_owned()))
        .collect();
    Answer { status: response.status().as_u16(), headers, body: response.body_mut().read_to_string().unwrap() }
}

async fn call_async(
    method: &'static str,
    url: String,
    headers: Vec<(&'static str, String)>,
    body: Option<String>,
) -> Answer {
    tokio::task::spawn_blocking(move || {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        call(method, &url, &headers, body.as_deref())
    })
    .await
    .unwrap()
}

/// Signs in with `token` from the endpoint's own origin: the session
/// cookie (`name=value`) and its CSRF token.
async fn signed_in(base: &str, token: &str) -> (String, String) {
    let form = format!("token={token}");
    let answer = call_async(
        "POST",
        format!("{base}/console/sign-in"),
        vec![("origin", base.to_owned()), ("content-type", "application/x-www-form-urlencoded".to_owned())],
        Some(form),
    )
    .await;
    assert_eq!(answer.status, 303, "{}", answer.body);
    let cookie = answer.header("set-cookie").unwrap().to_owned();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    assert!(!cookie.contains(token), "the token is never in the cookie");
    let cookie = cookie.split(';').next().unwrap().to_owned();
    let session =
        call_async("GET", format!("{base}/console/api/session"), vec![("cookie", cookie.clone())], None).await;
    assert_eq!(session.status, 200, "{}", session.body);
    assert!(!session.body.contains(token), "{}", session.body);
    let session: serde_json::Value = serde_json::from_str(&session.body).unwrap();
    (cookie, session["csrf"].as_str().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_answers_only_its_tokens_and_acts_only_for_its_own_pages() {
    let dir = tempfile::tempdir().unwrap();
    let (served, projection, v0, v1, events) = bank(dir.path()).await;
    eventually("the bank to catch up", || caught_up(&projection, events)).await;
    let base = format!("http://{}", served.address);

    // Without a credential: the sign-in page only.
    let page = call_async("GET", format!("{base}/console"), vec![], None).await;
    assert_eq!((page.status, page.header("location")), (303, Some("/console/sign-in")));
    for path in
        ["/console/api/overview", "/console/api/dead-letters", "/console/assets/console.js", "/console/api/session"]
    {
        let answer = call_async("GET", format!("{base}{path}"), vec![], None).await;
        assert_eq!(answer.status, 401, "{path}: {}", answer.body);
    }
    let rollback = r#"{"module":"bank"}"#.to_owned();
    let json = ("content-type", "application/json".to_owned());
    let answer =
        call_async("POST", format!("{base}/console/api/rollback"), vec![json.clone()], Some(rollback.clone())).await;
    assert_eq!(answer.status, 401, "{}", answer.body);
    let sign_in = call_async("GET", format!("{base}/console/sign-in"), vec![], None).await;
    assert_eq!(sign_in.status, 200);
    let policy = sign_in.header("content-security-policy").unwrap();
    assert!(policy.contains("script-src 'self'") && !policy.contains("unsafe-inline"), "{policy}");
    assert_eq!(sign_in.header("x-content-type-options"), Some("nosniff"));

    // A wrong token, a form from elsewhere.
    let form = ("content-type", "application/x-www-form-urlencoded".to_owned());
    let wrong = call_async(
        "POST",
        format!("{base}/console/sign-in"),
        vec![("origin", base.clone()), form.clone()],
        Some("token=guess".into()),
    )
    .await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none());
    let elsewhere = call_async(
        "POST",
        format!("{base}/console/sign-in"),
        vec![("origin", "http://evil.example".into()), form.clone()],
        Some(format!("token={TOKEN}")),
    )
    .await;
    assert_eq!(elsewhere.status, 403, "{}", elsewhere.body);

    // Signed in: every view answers, and says nothing of the token.
    let (cookie, csrf) = signed_in(&base, TOKEN).await;
    for path in [
        "/console/",
        "/console/api/overview",
        "/console/api/modules",
        "/console/api/topics",
        "/console/api/dead-letters?limit=5",
        "/console/api/messages?topic=accounts&partition=1&from=end&limit=3",
    ] {
        let answer = call_async("GET", format!("{base}{path}"), vec![("cookie", cookie.clone())], None).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        assert!(!answer.body.contains(TOKEN) && !answer.body.contains(READ_TOKEN), "{path} shows a token");
        assert!(answer.header("content-security-policy").is_some(), "{path}");
    }
    let overview =
        call_async("GET", format!("{base}/console/api/overview"), vec![("cookie", cookie.clone())], None).await;
    let overview: serde_json::Value = serde_json::from_str(&overview.body).unwrap();
    assert_eq!(overview["status"]["applied"], events);
    assert_eq!(overview["log"], "embedded");
    assert_eq!(overview["status"]["modules"]["bank"], v1.as_str());
    // Each partition's last batch: the bank's backlog, one batch a partition.
    let batches = &overview["batches"];
    let batch_events: u64 = ["0", "1"].iter().map(|p| batches[p]["events"].as_u64().unwrap()).sum();
    assert_eq!((batch_events, batches["0"]["kind"].as_str()), (events, Some("topic")), "{batches}");
    assert!(batches["0"]["phases"].as_array().unwrap().iter().any(|p| p[0] == "commit"), "{batches}");
    let members = overview["members"].as_array().unwrap();
    match &served.other {
        Some(_) => {
            let named = |this: bool| members.iter().find(|m| m["this_host"] == this).unwrap();
            assert_eq!(
                (&named(false)["name"], &named(false)["partitions"]),
                (&OTHER_HOST.into(), &serde_json::json!([1]))
            );
            assert_eq!(named(true)["partitions"], serde_json::json!([0]), "{members:?}");
            // A host that runs and holds nothing now is a member all the same.
            let idle = members.iter().find(|m| m["name"] == idle_name().as_str()).expect("the idle host is listed");
            assert_eq!((&idle["partitions"], &idle["this_host"]), (&serde_json::json!([]), &false.into()));
            assert_eq!(members.len(), 3, "{members:?}");
        }
        None => assert!(members.is_empty(), "an embedded store has no other members"),
    }
    // The host's own history: sampled from its start, whether a page is open or not.
    let mut history = serde_json::Value::Null;
    for _ in 0..50 {
        let answer =
            call_async("GET", format!("{base}/console/api/history"), vec![("cookie", cookie.clone())], None).await;
        history = serde_json::from_str(&answer.body).unwrap();
        if history["samples"].as_array().unwrap().last().is_some_and(|s| s["applied"] == events) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let samples = history["samples"].as_array().unwrap();
    assert_eq!(samples.last().unwrap()["applied"], events, "{history}");
    assert_eq!((history["every_ms"].as_u64(), samples.last().unwrap()["lag"].as_u64()), (Some(2_000), Some(0)));
    assert!(samples.windows(2).all(|w| w[0]["t_ms"].as_u64() < w[1]["t_ms"].as_u64()), "oldest first");
    let page = call_async(
        "GET",
        format!("{base}/console/api/messages?topic=accounts&partition=0&from=0&limit=500"),
        vec![("cookie", cookie.clone())],
        None,
    )
    .await;
    let page: serde_json::Value = serde_json::from_str(&page.body).unwrap();
    let held = page["end"].as_u64().unwrap() - page["first"].as_u64().unwrap();
    assert_eq!(page["messages"].as_array().unwrap().len() as u64, held.min(200), "a page is at most 200 messages");

    // An action needs the CSRF token and the endpoint's own origin.
    let with = |extra: Vec<(&'static str, String)>| {
        let mut headers = vec![("cookie", cookie.clone()), json.clone()];
        headers.extend(extra);
        headers
    };
    let url = format!("{base}/console/api/rollback");
    let no_csrf = call_async("POST", url.clone(), with(vec![("origin", base.clone())]), Some(rollback.clone())).await;
    assert_eq!(no_csrf.status, 403, "{}", no_csrf.body);
    let other_origin = call_async(
        "POST",
        url.clone(),
        with(vec![("x-waku-csrf", csrf.clone()), ("origin", "http://evil.example".into())]),
        Some(rollback.clone()),
    )
    .await;
    assert_eq!(other_origin.status, 403, "{}", other_origin.body);
    let other_site = call_async(
        "POST",
        url.clone(),
        with(vec![("x-waku-csrf", csrf.clone()), ("sec-fetch-site", "cross-site".into())]),
        Some(rollback.clone()),
    )
    .await;
    assert_eq!(other_site.status, 403, "{}", other_site.body);
    assert_eq!(projection.modules()[0].version(), v1, "nothing changed");

    // A read-only session looks, and may not act.
    let (read_cookie, read_csrf) = signed_in(&base, READ_TOKEN).await;
    let read =
        call_async("GET", format!("{base}/console/api/overview"), vec![("cookie", read_cookie.clone())], None).await;
    assert_eq!(read.status, 200);
    let refused = call_async(
        "POST",
        url.clone(),
        vec![("cookie", read_cookie), json.clone(), ("x-waku-csrf", read_csrf), ("origin", base.clone())],
        Some(rollback.clone()),
    )
    .await;
    assert_eq!(refused.status, 403);
    assert!(refused.body.contains("may only look"), "{}", refused.body);
    let status =
        call_async("GET", format!("{base}/status"), vec![("authorization", format!("Bearer {READ_TOKEN}"))], None)
            .await;
    assert_eq!(status.status, 200, "the read-only token reads the other routes");

    // The full session acts: the rollback takes effect at once.
    let done = call_async(
        "POST",
        url,
        with(vec![("x-waku-csrf", csrf.clone()), ("origin", base.clone()), ("sec-fetch-site", "same-origin".into())]),
        Some(rollback),
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(projection.modules()[0].version(), v0);

    // Signed out, the cookie is worth nothing.
    let out = call_async(
        "POST",
        format!("{base}/console/sign-out"),
        with(vec![("x-waku-csrf", csrf), ("origin", base.clone())]),
        None,
    )
    .await;
    assert_eq!(out.status, 303);
    let after = call_async("GET", format!("{base}/console/api/overview"), vec![("cookie", cookie)], None).await;
    assert_eq!(after.status, 401);

    // Dead letters, filtered and paged, with the bearer token of a tool.
    let (flaky_served, _, _) = flaky(&dir.path().join("flaky")).await;
    let base = format!("http://{}", flaky_served.address);
    let bearer = || vec![("authorization", format!("Bearer {TOKEN}"))];
    let letters = |query: &str| {
        let (url, query) = (format!("{base}/console/api/dead-letters?{query}"), query.to_owned());
        async move {
            let answer = call_async("GET", url, bearer(), None).await;
            assert_eq!(answer.status, 200, "{query}: {}", answer.body);
            serde_json::from_str::<serde_json::Value>(&answer.body).unwrap()
        }
    };
    let keyed = letters("key=7").await;
    assert_eq!(keyed["letters"].as_array().unwrap().len(), 1);
    assert_eq!(keyed["letters"][0]["reason"], "unrecoverable handler error: not fixed yet");
    let first = letters("class=unrecoverable&limit=1").await;
    assert_eq!(first["letters"].as_array().unwrap().len(), 1);
    let next = first["next"].as_str().unwrap().to_owned();
    let rest = letters(&format!("class=unrecoverable&limit=5&after={next}")).await;
    assert_eq!((rest["letters"].as_array().unwrap().len(), &rest["next"]), (2, &serde_json::Value::Null));
    assert_eq!(letters("class=trap").await["letters"].as_array().unwrap().len(), 0);
    assert_eq!(letters("limit=2").await["dead_lettered"], 3);
    let bad = call_async("GET", format!("{base}/console/api/dead-letters?key=%7B"), bearer(), None).await;
    assert_eq!(bad.status, 400, "{}", bad.body);
}

// ---- in a real browser ----

/// Chromium and chromedriver, when both are installed.
fn browser_binaries() -> Option<(PathBuf, PathBuf)> {
    let find = |names: &[&str]| {
        names.iter().find_map(|name| {
            std::env::var_os("PATH")
                .into_iter()
                .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
                .map(|dir| dir.join(name))
                .find(|path| path.is_file())
        })
    };
    Some((find(&["chromium", "chromium-browser"])?, find(&["chromedriver"])?))
}

/// chromedriver on a free port, killed when dropped.
struct Driver {
    child: std::process::Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_driver(chromedriver: &Path) -> Driver {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = std::process::Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let driver = Driver { child, port };
    let start = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(start.elapsed() < Duration::from_secs(20), "chromedriver did not listen");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    driver
}

async fn open_browser(driver: &Driver, chromium: &Path, profile: &Path) -> fantoccini::Client {
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ];
    let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    args.push(format!("--user-data-dir={}", profile.display()));
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({ "binary": chromium.display().to_string(), "args": args }),
    );
    fantoccini::ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("chromedriver starts chromium")
}

use fantoccini::Locator::Css;

/// Waits up to 20 s for the element `css`, whose text satisfies `check`;
/// returns that text.
async fn text_of(client: &fantoccini::Client, css: &str, check: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        if let Ok(element) = client.find(Css(css)).await
            && let Ok(text) = element.text().await
            && check(&text)
        {
            return text;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let url = client.current_url().await.map(|url| url.to_string()).unwrap_or_default();
            let source = client.source().await.unwrap_or_default();
            panic!("timed out waiting for `{css}` at {url}:\n{source}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn sign_in(client: &fantoccini::Client, base: &str, token: &str) {
    client.goto(&format!("{base}/console/")).await.unwrap();
    assert_eq!(client.current_url().await.unwrap().path(), "/console/sign-in", "the console asks for the token first");
    client.find(Css("#token")).await.unwrap().send_keys(token).await.unwrap();
    client.find(Css("#sign-in")).await.unwrap().click().await.unwrap();
    text_of(client, "#access", |text| text.starts_with("signed in")).await;
}

/// Shows the view `name` and waits for its first answer.
async fn view(client: &fantoccini::Client, name: &str) {
    client.find(Css(&format!("#nav-{name}"))).await.unwrap().click().await.unwrap();
    let start = Instant::now();
    loop {
        let root = client.find(Css("#view")).await.unwrap();
        if root.attr("data-view").await.unwrap().as_deref() == Some(name)
            && root.attr("data-loaded").await.unwrap().is_some()
        {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "view {name} did not load");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn screenshot(client: &fantoccini::Client, name: &str) {
    let dir = std::env::var_os("WAKU_CONSOLE_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots"));
    std::fs::create_dir_all(&dir).unwrap();
    let png = client.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a screenshot of {name}");
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

/// The attribute `name` of the element `css`, read in one step (the page
/// redraws a view at each poll, so an element found earlier may be gone).
async fn attr(client: &fantoccini::Client, css: &str, name: &str) -> Option<String> {
    let script = "const e = document.querySelector(arguments[0]); return e ? e.getAttribute(arguments[1]) : null;";
    let value = client.execute(script, vec![css.into(), name.into()]).await.unwrap();
    value.as_str().map(str::to_owned)
}

/// How many elements `css` finds, in one step.
async fn count_of(client: &fantoccini::Client, css: &str) -> usize {
    let value = client.execute("return document.querySelectorAll(arguments[0]).length;", vec![css.into()]).await;
    value.unwrap().as_u64().unwrap() as usize
}

/// Clicks the element `css`, in one step.
async fn click(client: &fantoccini::Client, css: &str) {
    let script = "const e = document.querySelector(arguments[0]); if (!e) return false; e.click(); return true;";
    assert_eq!(client.execute(script, vec![css.into()]).await.unwrap(), serde_json::Value::Bool(true), "{css}");
}

/// Waits up to 20 s for the attribute `name` of `css` to be `value`.
async fn attr_becomes(client: &fantoccini::Client, css: &str, name: &str, value: &str) {
    let start = Instant::now();
    while attr(client, css, name).await.as_deref() != Some(value) {
        assert!(start.elapsed() < Duration::from_secs(20), "{css} [{name}] never became {value}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn pwned(client: &fantoccini::Client) -> serde_json::Value {
    client.execute("return window.__pwned === undefined ? null : window.__pwned;", vec![]).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_browser_shows_every_view_and_steers_the_projection() {
    let Some((chromium, chromedriver)) = browser_binaries() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI needs chromium and chromedriver (apt-get install chromium chromium-driver)"
        );
        println!("skipped: chromium or chromedriver is not installed (apt-get install chromium chromium-driver)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("bank")).unwrap();
    std::fs::create_dir_all(dir.path().join("flaky")).unwrap();
    let (bank_served, bank_projection, v0, v1, events) = bank(&dir.path().join("bank")).await;
    let (flaky_served, flaky_projection, _module) = flaky(&dir.path().join("flaky")).await;
    eventually("the bank to catch up", || caught_up(&bank_projection, events)).await;
    let bank = format!("http://127.0.0.1:{}", bank_served.address.port());
    // The host sampled its figures twice before any page opened.
    let history = || {
        let url = format!("{bank}/console/api/history");
        async move {
            let answer = call_async("GET", url, vec![("authorization", format!("Bearer {TOKEN}"))], None).await;
            serde_json::from_str::<serde_json::Value>(&answer.body).unwrap()["samples"].as_array().unwrap().len()
        }
    };
    let start = Instant::now();
    while history().await < 2 {
        assert!(start.elapsed() < Duration::from_secs(20), "the host samples its history");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before_page_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    let driver = start_driver(&chromedriver).await;
    let client = open_browser(&driver, &chromium, &dir.path().join("profile")).await;
    // The other endpoint by name, so the two sessions' cookies stay apart.
    let steps = format!("http://localhost:{}", flaky_served.address.port());

    // No page and no view without the token.
    client.goto(&format!("{bank}/console/api/overview")).await.unwrap();
    let refused = client.find(Css("body")).await.unwrap().text().await.unwrap();
    assert!(refused.contains("sign in first"), "{refused}");

    // A read-only session sees no action.
    sign_in(&client, &bank, READ_TOKEN).await;
    assert_eq!(text_of(&client, "#access", |_| true).await, "signed in: read only");
    view(&client, "modules").await;
    let button = client.find(Css(&format!(".run-version[data-version='{v0}']"))).await.unwrap();
    assert!(!button.is_displayed().await.unwrap(), "a read-only session has no rollback button");
    client.find(Css("#sign-out")).await.unwrap().click().await.unwrap();
    text_of(&client, "#sign-in", |_| true).await;

    sign_in(&client, &bank, TOKEN).await;
    // Overview: the figures of the running projection.
    view(&client, "overview").await;
    let applied = text_of(&client, "dd[data-fact=applied]", |text| !text.is_empty()).await;
    assert_eq!(applied.replace(',', ""), events.to_string());
    assert_eq!(text_of(&client, "dd[data-fact=log]", |_| true).await, "embedded");
    assert!(text_of(&client, "dd[data-fact=modules]", |_| true).await.contains(&v1));
    assert!(text_of(&client, "dd[data-fact=caught-up]", |_| true).await.starts_with("yes"));
    assert_eq!(text_of(&client, "dd[data-fact=lag]", |_| true).await, "0 events");
    // The plots start with the host's history, from before the page opened.
    let plot = client.find(Css("#plot-throughput")).await.unwrap();
    let points: usize = plot.attr("data-points").await.unwrap().unwrap().parse().unwrap();
    let from_ms: u128 = plot.attr("data-from-ms").await.unwrap().unwrap().parse().unwrap();
    assert!(
        points >= 2 && from_ms < before_page_ms,
        "{points} points from {from_ms}, the page opened at {before_page_ms}"
    );
    assert!(!client.find_all(Css("#plot-lag canvas")).await.unwrap().is_empty(), "the lag plot is drawn");
    // The group's members: this host and the other, by name, as text.
    let members = text_of(&client, "dd[data-fact=members]", |text| !text.is_empty()).await;
    match &bank_served.other {
        Some(_) => {
            assert!(members.contains(&format!("{OTHER_HOST}: partitions 1")), "{members}");
            assert!(members.starts_with("this host, ") && members.contains(": partitions 0"), "{members}");
            assert!(members.contains(&format!("{}: no partition now (its console)", idle_name())), "{members}");
            // Only the idle host's plain address became a link, to its console.
            assert_eq!(count_of(&client, "dd[data-fact=members] a").await, 1);
            let href = attr(&client, "dd[data-fact=members] a.member-console", "href").await;
            assert_eq!(href.as_deref(), Some(format!("http://{IDLE_ADMIN}/console/").as_str()));
        }
        None => assert_eq!(members, "this host only (its state is its own)"),
    }
    assert!(client.find_all(Css("#view img, #view script")).await.unwrap().is_empty(), "a member's name is text");
    assert_eq!(pwned(&client).await, serde_json::Value::Null);
    screenshot(&client, "overview").await;

    view(&client, "partitions").await;
    let rows = client.find_all(Css("#partitions tbody tr")).await.unwrap();
    assert_eq!(rows.len(), 2);
    let status = bank_projection.store().position("accounts", 0).unwrap().unwrap_or(0);
    let position = text_of(&client, "#partitions tr[data-partition='0'] td:nth-child(2)", |_| true).await;
    assert_eq!(position.replace(',', ""), status.to_string());
    let batch = text_of(&client, "#partitions tr[data-partition='0'] td.batch", |_| true).await;
    // (Under a thousand events: no thousands separator.)
    assert!(batch.starts_with(&format!("{status} events (topic, {status} applied")), "{batch}, position {status}");
    let phases = text_of(&client, "#partitions tr[data-partition='0'] td.phases", |_| true).await;
    assert!(phases.contains("poll ") && phases.contains("commit "), "{phases}");
    let owner = text_of(&client, "#partitions tr[data-partition='1'] td.owner", |_| true).await;
    assert_eq!(owner, if bank_served.other.is_some() { OTHER_HOST } else { "this host" });
    assert!(client.find_all(Css("#view img")).await.unwrap().is_empty(), "a member's name is text");
    assert_eq!(pwned(&client).await, serde_json::Value::Null);
    screenshot(&client, "partitions").await;

    view(&client, "event-time").await;
    text_of(&client, "#event-time-none", |text| text.contains("one topic")).await;

    view(&client, "topics").await;
    let count = text_of(&client, "tr[data-topic='accounts'] td.count", |_| true).await;
    assert_eq!(count.replace(',', ""), events.to_string());
    client.find(Css("button.pick-topic[data-topic='accounts']")).await.unwrap().click().await.unwrap();
    text_of(&client, "#messages-range", |text| text.contains("accounts partition 0")).await;
    assert!(!client.find_all(Css("article.message")).await.unwrap().is_empty());
    screenshot(&client, "topics").await;

    view(&client, "rebuilds").await;
    text_of(&client, "#rebuild-none", |_| true).await;
    screenshot(&client, "rebuilds").await;

    // An action from another origin (the same endpoint by another name)
    // is refused: the page there posts a rollback with the browser's help.
    client.goto(&format!("http://localhost:{}/console/sign-in", bank_served.address.port())).await.unwrap();
    let script = format!(
        "return fetch('{bank}/console/api/rollback', {{method: 'POST', mode: 'no-cors', credentials: 'include', \
         headers: {{'content-type': 'text/plain'}}, body: '{{\"module\": \"bank\"}}'}}).then(() => 'sent', e => 'failed')"
    );
    client.execute(&script, vec![]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(bank_projection.modules()[0].version(), v1, "a request from another origin changed nothing");

    // A rollback through the page takes effect at once.
    client.goto(&format!("{bank}/console/#modules")).await.unwrap();
    view(&client, "modules").await;
    client.find(Css(&format!(".run-version[data-version='{v0}']"))).await.unwrap().click().await.unwrap();
    text_of(&client, "#notice", |text| text.contains(&format!("{v1} → {v0}"))).await;
    assert_eq!(bank_projection.modules()[0].version(), v0, "the rollback took effect when the page said so");
    text_of(&client, "section.module dd[data-fact=running]", |text| text == v0).await;
    // The swap history, newest first: the rollback, then the two starts.
    let swaps = text_of(&client, "section.module table.swaps tbody", |text| text.contains("rollback")).await;
    let swaps: Vec<&str> = swaps.lines().collect();
    assert_eq!(swaps.len(), 3, "{swaps:?}");
    assert!(swaps[0].starts_with(&format!("{v0} rollback 20")), "{swaps:?}");
    assert!(swaps[1].starts_with(&format!("{v1} start")) && swaps[2].starts_with(&format!("{v0} start")), "{swaps:?}");
    // Each version's figures stay after the swap: v1 ran the bank's
    // events (a call handles a key's run of them), without a failure, its
    // instances within their limits.
    let v1_calls = text_of(&client, &format!("table.usage tr[data-version='{v1}'] td.calls"), |_| true).await;
    let v1_calls: u64 = v1_calls.replace(',', "").parse().unwrap();
    assert!((12..=events).contains(&v1_calls), "{v1_calls} calls for 12 accounts");
    let v1_row = format!("table.usage tr[data-version='{v1}']");
    attr_becomes(&client, &format!("{v1_row} td.errors"), "data-failed", "0").await;
    assert_eq!(text_of(&client, &format!("{v1_row} td.errors"), |_| true).await, "none");
    let peak_bytes: u64 = attr(&client, &format!("{v1_row} td.peak"), "data-bytes").await.unwrap().parse().unwrap();
    let limit = SandboxLimits::default().memory_bytes as u64;
    assert!(peak_bytes > 0 && peak_bytes <= limit, "peak {peak_bytes} of {limit}");
    let peak = text_of(&client, &format!("{v1_row} td.peak"), |_| true).await;
    assert!(peak.ends_with(" of 64.0 MiB"), "{peak}");
    let cpu = text_of(&client, &format!("{v1_row} td.cpu"), |_| true).await;
    assert!(cpu.contains(" longest, ") && cpu.ends_with(" p99, of 1.00 s"), "{cpu}");
    text_of(&client, &format!("table.usage tr[data-version='{v0}'] td.calls"), |_| true).await;
    screenshot(&client, "modules").await;

    // A module that fails calls: its version shows each failure, by class.
    let (hostile_served, hostile_version) = hostile_host(&dir.path().join("hostile")).await;
    let attacks = format!("http://127.0.0.1:{}", hostile_served.address.port());
    let bearer = vec![("authorization", format!("Bearer {TOKEN}"))];
    let answer = call_async("GET", format!("{attacks}/console/api/modules"), bearer, None).await;
    let answer: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    let usage = &answer["modules"][0]["usage"][0];
    assert_eq!(usage["version"], hostile_version.as_str(), "{answer}");
    assert_eq!(usage["errors"][0], serde_json::json!(["handler", HOSTILE_FAILURES]), "{answer}");
    assert!(usage["memory_bytes"].as_u64().unwrap() > 0, "{answer}");
    sign_in(&client, &attacks, TOKEN).await;
    view(&client, "modules").await;
    let row = format!("table.usage tr[data-version='{hostile_version}']");
    let errors = text_of(&client, &format!("{row} td.errors"), |text| text != "none").await;
    assert_eq!(errors, format!("{HOSTILE_FAILURES} handler"));
    attr_becomes(&client, &format!("{row} td.errors"), "data-failed", &HOSTILE_FAILURES.to_string()).await;
    let held: u64 = attr(&client, &format!("{row} td.memory"), "data-bytes").await.unwrap().parse().unwrap();
    assert!(held > 0, "its instances hold memory");
    let peak: u64 = attr(&client, &format!("{row} td.peak"), "data-bytes").await.unwrap().parse().unwrap();
    assert!(peak > 0 && peak <= limit, "peak {peak} of {limit}");

    // Its log lines, newest first: the hostile one is inert text, its key too.
    let bearer = vec![("authorization", format!("Bearer {TOKEN}"))];
    let answer =
        call_async("GET", format!("{attacks}/console/api/module-log?module=hostile&limit=3"), bearer, None).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let page: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(page["written"], PLAIN_LINES + 1, "{page}");
    let newest = &page["lines"][0];
    assert_eq!(
        (newest["seq"].as_u64(), newest["version"].as_str()),
        (Some(PLAIN_LINES), Some(hostile_version.as_str()))
    );
    let (text, key) = (newest["text"].as_str().unwrap(), newest["key"].as_str().unwrap());
    assert!(
        text.contains("\\u{202e}gnp.exe\\u{7}\\u{1b}[2J") && !text.contains('\u{202e}'),
        "sent printable: {text:?}"
    );
    assert!(key.contains("\\u{202e}") && !key.contains('\u{1b}'), "{key:?}");
    assert_eq!(page["next"].as_u64(), Some(PLAIN_LINES - 2), "{page}");
    let log = "div.module-log[data-module='hostile']";
    let line = text_of(&client, &format!("{log} tr[data-seq='{PLAIN_LINES}'] td.text"), |_| true).await;
    assert!(line.starts_with("<script>window.__pwned=1</script><img src=x onerror="), "markup shows as text: {line}");
    assert!(line.contains("href=\"javascript:window.__pwned=3\""), "{line}");
    assert!(line.contains("\\u{202e}gnp.exe\\u{7}\\u{1b}[2J") && !line.contains('\u{202e}'), "{line:?}");
    let key = text_of(&client, &format!("{log} tr[data-seq='{PLAIN_LINES}'] td.key"), |_| true).await;
    assert!(key.contains("<script>window.__pwned=1</script>") && key.contains("\\u{202e}"), "{key}");
    assert_eq!(count_of(&client, &format!("{log} table.log tbody tr")).await, 20, "a page of 20 lines");
    // Paged: the older lines, then back to the newest.
    click(&client, &format!("{log} button.log-older")).await;
    let oldest_shown = format!("{log} table.log tbody tr:first-child");
    attr_becomes(&client, &oldest_shown, "data-seq", &(PLAIN_LINES - 20).to_string()).await;
    assert_eq!(count_of(&client, &format!("{log} table.log tbody tr")).await as u64, PLAIN_LINES + 1 - 20, "the rest");
    assert_eq!(text_of(&client, &format!("{oldest_shown} td.text"), |_| true).await, "a plain line");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    attr_becomes(&client, &oldest_shown, "data-seq", &(PLAIN_LINES - 20).to_string()).await;
    click(&client, &format!("{log} button.log-newest")).await;
    attr_becomes(&client, &oldest_shown, "data-seq", &PLAIN_LINES.to_string()).await;
    text_of(&client, &format!("{log} tr[data-seq='{PLAIN_LINES}'] td.level"), |_| true).await;
    assert!(client.find_all(Css("#view img, #view script, #view a")).await.unwrap().is_empty(), "no markup made it in");
    assert_eq!(pwned(&client).await, serde_json::Value::Null, "no script of the module ran");
    screenshot(&client, "module-log").await;

    // Dead letters: a hostile publisher's strings are inert text.
    sign_in(&client, &steps, TOKEN).await;
    view(&client, "dead-letters").await;
    text_of(&client, "#letter-table tbody", |text| text.contains("not fixed yet")).await;
    let rows = client.find_all(Css("#letter-table tbody tr")).await.unwrap();
    assert_eq!(rows.len(), 3);
    let table = client.find(Css("#letter-table")).await.unwrap().text().await.unwrap();
    assert!(table.contains("<script>window.__pwned=1</script>"), "markup shows as text: {table}");
    assert!(table.contains("\\u{202e}gnp.exe\\u{7}\\u{1b}[2J"), "bidi and control characters show as escapes: {table}");
    assert!(!table.contains('\u{202e}') && !table.contains('\u{1b}'), "{table:?}");
    let mut hostile = None;
    for row in &rows {
        if row.find(Css("td.key")).await.unwrap().text().await.unwrap().contains("__pwned") {
            hostile = row.attr("data-place").await.unwrap();
        }
    }
    let hostile = hostile.expect("the hostile key's dead letter is listed");
    client.find(Css(&format!("tr[data-place='{hostile}'] td.reason"))).await.unwrap().click().await.unwrap();
    let body = text_of(&client, "#letter-body", |text| text.contains("onerror")).await;
    assert!(body.contains("<img src=x onerror=\\\"window.__pwned=2\\\">"), "{body}");
    assert!(client.find_all(Css("#view img, #view script, #view a")).await.unwrap().is_empty(), "no markup made it in");
    assert_eq!(pwned(&client).await, serde_json::Value::Null, "no script of the module ran");
    screenshot(&client, "dead-letters").await;

    // Key 7's letter, re-driven through the page, is applied once.
    let seven = Key::int(7u64).to_string();
    let mut place = None;
    for row in client.find_all(Css("#letter-table tbody tr")).await.unwrap() {
        if row.find(Css("td.key")).await.unwrap().text().await.unwrap() == seven
            && row.find(Css("td.reason")).await.unwrap().text().await.unwrap().contains("not fixed")
        {
            place = row.attr("data-place").await.unwrap();
        }
    }
    let place = place.expect("key 7's dead letter is listed");
    client.find(Css(&format!("input[data-place='{place}']"))).await.unwrap().click().await.unwrap();
    client.find(Css("#redrive-selected")).await.unwrap().click().await.unwrap();
    text_of(&client, "#notice", |text| text.starts_with("Re-drove 1 dead letters")).await;
    eventually("key 7's step to be applied", || Flaky::applied(flaky_projection.store(), &Key::int(7u64)) == [2]).await;
    text_of(&client, "dd[data-fact=redriven]", |text| text == "1").await;
    text_of(&client, &format!("tr[data-place='{place}'] td.state"), |text| text == "re-driven").await;
    assert!(!client.find(Css(&format!("input[data-place='{place}']"))).await.unwrap().is_enabled().await.unwrap());
    // Re-driving everything waiting leaves it alone: still applied once.
    client.find(Css("#redrive-all")).await.unwrap().click().await.unwrap();
    text_of(&client, "#notice", |text| text.starts_with("Re-drove")).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(Flaky::applied(flaky_projection.store(), &Key::int(7u64)), [2], "applied once");
    assert_eq!(pwned(&client).await, serde_json::Value::Null);

    // Event time over two topics: the late event with its key, as text,
    // and its lateness.
    let (timed_served, timing) = timed(&dir.path().join("timed")).await;
    let late = timing.late_events().recent[0].clone();
    assert!((70_000..75_000).contains(&late.lateness_ms), "{late:?}");
    assert_eq!((late.topic.as_str(), late.offset), ("a", 1));
    let timed = format!("http://127.0.0.1:{}", timed_served.address.port());
    let bearer = vec![("authorization", format!("Bearer {TOKEN}"))];
    let answer = call_async("GET", format!("{timed}/console/api/late-events"), bearer, None).await;
    let answer: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(
        (answer["total"].as_u64(), answer["recent"][0]["lateness_ms"].as_i64()),
        (Some(1), Some(late.lateness_ms))
    );
    let key = answer["recent"][0]["key"].as_str().unwrap();
    assert!(key.contains("\\u{202e}") && !key.contains('\u{202e}'), "the host sends the key printable: {key:?}");
    sign_in(&client, &timed, TOKEN).await;
    view(&client, "event-time").await;
    text_of(&client, "#late-summary", |text| text == "1 late events read since the host started:").await;
    let key = text_of(&client, "#late-table td.key", |_| true).await;
    assert!(key.contains("<script>window.__pwned=1</script>") && key.contains("\\u{202e}gnp.exe"), "{key}");
    assert!(!key.contains('\u{202e}') && !key.contains('\u{1b}'), "{key:?}");
    let lateness = text_of(&client, "#late-table td.lateness", |_| true).await;
    assert_eq!(lateness, format!("{:.1} s", late.lateness_ms as f64 / 1000.0));
    let waits = text_of(&client, "section.partition-clock p.waits", |_| true).await;
    assert!(waits.starts_with("nothing: every input reached the end"), "{waits}");
    assert!(client.find_all(Css("#view img, #view script, #view a")).await.unwrap().is_empty(), "no markup made it in");
    assert_eq!(pwned(&client).await, serde_json::Value::Null);
    screenshot(&client, "event-time").await;

    client.close().await.unwrap();
}
