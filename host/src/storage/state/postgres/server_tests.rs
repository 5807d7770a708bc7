//! The store against a server: the state suite every backend passes
//! ([`super::super::suite`]), then what only PostgreSQL does (fencing
//! between hosts, holds, the cache beside a database other hosts write,
//! positions a database forgot, TLS, the schema's versions, the SQL read
//! model).
//!
//! They run against the server `WAKU_POSTGRES_URL` names, each in a
//! schema of its own; without it they are skipped, saying so once, and
//! under CI (`CI=true`, whose `.ci/run` starts a server) they fail. The
//! TLS tests also need the URL to reach the server as `localhost` with
//! `sslmode=verify-full`, and the client-certificate test
//! `WAKU_POSTGRES_CLIENT_CERT_URL`, as `.ci/run` sets them.

use std::str::FromStr;
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::super::hold::HOLD_LEASE;
use super::PostgresStore;
use super::db::i32_of;
use super::json::json_text;
use super::schema::{MAX_IDENTIFIER, MIGRATIONS, view_name};
use super::tls::{PostgresConfig, RootCert, SettingError, SslMode};
use crate::key::Key;
use crate::storage::state::suite::{Fixture, state_suite};
use crate::storage::state::{BatchCommit, KeyWrites, OutboxEntry, StateBackend, StateError, StateStore, encode_outbox};

/// A schema of its own (so a version table of its own) in the database
/// named by `WAKU_POSTGRES_URL`.
struct Database {
    config: PostgresConfig,
}

impl Fixture for Database {
    fn open(&self) -> StateStore {
        StateStore::from_backend(self.connect().unwrap())
    }

    fn fences(&self) -> bool {
        true
    }
}

impl Database {
    fn connect(&self) -> Result<PostgresStore, StateError> {
        PostgresStore::connect_with(self.config.clone(), "bank")
    }

    /// Runs `sql` in the fixture's schema.
    fn execute(&self, sql: &str) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let client = self.config.connect_client().await.unwrap();
            client.batch_execute(sql).await.unwrap();
        });
    }
}

/// A fresh schema, or `None` (saying so once) without a server; under
/// CI (`CI=true`), whose `.ci/run` starts one, no server is a failure.
fn database() -> Option<Database> {
    static SKIPPED: Once = Once::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let Ok(url) = std::env::var("WAKU_POSTGRES_URL") else {
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("the PostgreSQL state tests: CI starts a server (.ci/run), but WAKU_POSTGRES_URL is not set");
        }
        SKIPPED.call_once(|| {
            // Straight to stderr, past the test harness's capture.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "skipped: the PostgreSQL state tests need a server named by WAKU_POSTGRES_URL \
                 (e.g. postgres://postgres@127.0.0.1:5433/postgres)"
            );
        });
        return None;
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    let schema = format!("test_{}_{}_{}", now.as_secs(), std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let mut config = PostgresConfig::from_str(&url).expect("WAKU_POSTGRES_URL is a PostgreSQL URL");
    let database = Database { config: config.clone() };
    database.execute(&format!("CREATE SCHEMA {schema}"));
    config.pg.options(format!("-c search_path={schema}"));
    Some(Database { config })
}

state_suite!(database());

/// The fixture when `WAKU_POSTGRES_URL` reaches its server over TLS
/// with `verify-full` by the name `localhost` (`.ci/run` makes one,
/// with a certificate for `localhost` alone), else `None`, saying so
/// once; a failure under CI.
fn tls_database() -> Option<Database> {
    let database = database()?;
    let tls = &database.config.tls;
    let by_localhost = database.config.pg.get_hosts() == [tokio_postgres::config::Host::Tcp("localhost".into())];
    if tls.mode == SslMode::VerifyFull && tls.root_cert.is_some() && by_localhost {
        return Some(database);
    }
    const WHY: &str = "the PostgreSQL TLS tests need WAKU_POSTGRES_URL to reach the server as `localhost` with \
                       sslmode=verify-full&sslrootcert=<CA file> (as .ci/run does)";
    if std::env::var("CI").is_ok_and(|ci| ci == "true") {
        panic!("{WHY}");
    }
    static SKIPPED: Once = Once::new();
    SKIPPED.call_once(|| {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "skipped: {WHY}");
    });
    None
}

/// Whether the store's connection is encrypted, as the server sees it.
fn over_tls(store: &PostgresStore) -> bool {
    store
        .run(|db| async move {
            let row = db.client().query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await;
            Ok(row.map_err(|e| db.error(e))?.get::<_, bool>(0))
        })
        .unwrap()
}

/// `database`'s configuration reaching the server by its address
/// (`127.0.0.1`) instead of the name its certificate holds.
fn by_address(database: &Database, mode: &str) -> PostgresConfig {
    let url = std::env::var("WAKU_POSTGRES_URL").unwrap().replacen("@localhost", "@127.0.0.1", 1);
    let mut config = PostgresConfig::from_str(&url).unwrap();
    config.tls.mode = mode.parse().unwrap();
    config.pg.ssl_mode(tokio_postgres::config::SslMode::Require);
    config.pg.options(database.config.pg.get_options().unwrap_or_default());
    config
}

#[test]
fn verify_full_connects_over_tls_and_refuses_an_unknown_ca_and_a_wrong_name_saying_which() {
    let Some(database) = tls_database() else { return };
    assert!(over_tls(&database.connect().unwrap()), "the verify-full store's connection is not encrypted");

    // A CA the server's certificate was not signed by.
    let other = crate::platform::tls::test_pki::make(&["localhost"]);
    let mut config = database.config.clone();
    config.tls.root_cert = Some(RootCert::File(other.ca.clone()));
    let error = PostgresStore::connect_with(config, "bank").unwrap_err();
    let StateError::Tls { reason, .. } = &error else { panic!("not a TLS refusal: {error}") };
    assert!(
        reason.contains("not signed by a CA in sslrootcert=") && reason.contains(&other.ca.display().to_string()),
        "{error}"
    );

    // The right CA, the wrong name: the certificate names `localhost`.
    let error = PostgresStore::connect_with(by_address(&database, "verify-full"), "bank").unwrap_err();
    let StateError::Tls { reason, .. } = &error else { panic!("not a TLS refusal: {error}") };
    assert!(reason.contains("not valid for the name `127.0.0.1`") && reason.contains("localhost"), "{error}");
}

#[test]
fn verify_ca_checks_the_chain_and_not_the_name_and_require_checks_nothing() {
    let Some(database) = tls_database() else { return };
    // verify-ca: the name does not matter, the CA does.
    assert!(over_tls(&PostgresStore::connect_with(by_address(&database, "verify-ca"), "bank").unwrap()));
    let other = crate::platform::tls::test_pki::make(&["127.0.0.1"]);
    let mut config = by_address(&database, "verify-ca");
    config.tls.root_cert = Some(RootCert::File(other.ca.clone()));
    assert!(matches!(PostgresStore::connect_with(config, "bank"), Err(StateError::Tls { .. })));
    // require without a root file: encrypted, unchecked.
    let mut config = by_address(&database, "require");
    config.tls.root_cert = None;
    assert!(over_tls(&PostgresStore::connect_with(config, "bank").unwrap()));
    // disable: plain, which the server takes from loopback.
    let mut config = by_address(&database, "disable");
    config.pg.ssl_mode(tokio_postgres::config::SslMode::Disable);
    assert!(!over_tls(&PostgresStore::connect_with(config, "bank").unwrap()));
}

/// `WAKU_POSTGRES_CLIENT_CERT_URL`: a verify-full URL for a role the
/// server lets in only with a client certificate (`.ci/run` makes the
/// role `waku_cert` and its certificate), else `None`, saying so once;
/// a failure under CI.
fn client_cert_config() -> Option<PostgresConfig> {
    if let Ok(url) = std::env::var("WAKU_POSTGRES_CLIENT_CERT_URL") {
        return Some(PostgresConfig::from_str(&url).expect("WAKU_POSTGRES_CLIENT_CERT_URL is a PostgreSQL URL"));
    }
    const WHY: &str = "the PostgreSQL client-certificate test needs WAKU_POSTGRES_CLIENT_CERT_URL (a verify-full \
                       URL with sslcert and sslkey for a role pg_hba lets in by `cert`, as .ci/run does)";
    if std::env::var("CI").is_ok_and(|ci| ci == "true") {
        panic!("{WHY}");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipped: {WHY}");
    None
}

#[test]
fn a_client_certificate_logs_in_the_role_it_names_and_its_absence_is_refused_saying_so() {
    let Some(config) = client_cert_config() else { return };
    let user = config.pg.get_user().expect("the URL names the certificate's role").to_owned();
    let store = PostgresStore::connect_with(config.clone(), "bank").unwrap();
    let (session_user, client_dn) = store
        .run(|db| async move {
            let sql = "SELECT session_user::text, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()";
            let row = db.client().query_one(sql, &[]).await.map_err(|e| db.error(e))?;
            Ok((row.get::<_, String>(0), row.get::<_, Option<String>>(1)))
        })
        .unwrap();
    assert_eq!(session_user, user);
    assert_eq!(client_dn.as_deref(), Some(format!("/CN={user}").as_str()), "the server saw no client certificate");

    // The same URL without sslcert/sslkey: the server's pg_hba asks for one.
    let mut config = config;
    config.tls.client_cert = None;
    config.tls.client_key = None;
    let error = PostgresStore::connect_with(config, "bank").unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, StateError::Tls { .. }), "not a TLS refusal: {text}");
    assert!(text.contains("asks for a client certificate") && text.contains("sslcert=<"), "{text}");
    assert!(text.contains("sslkey=<") && text.contains("requires a valid client certificate"), "{text}");
}

/// A partition its holder has not let go is not claimed; it is once the
/// holder lets go after its last commit, or once its session ends (a
/// host that died).
#[test]
fn a_held_partition_is_claimed_once_its_holder_lets_go_or_its_session_ends() {
    let Some(database) = database() else { return };
    let (a, b) = (database.connect().unwrap(), database.connect().unwrap());
    let first = a.claim_released(3).unwrap().expect("nobody held partition 3");
    assert_eq!(b.claim_released(3).unwrap(), None, "A holds partition 3");
    assert!(b.claim_released(4).unwrap().is_some(), "holds are per partition");
    assert_eq!(a.claim_released(3).unwrap(), Some(first + 1), "the holder claims its own again");
    a.release(3);
    let second = b.claim_released(3).unwrap().expect("A let partition 3 go");
    assert!(second > first + 1);
    assert_eq!(a.claim_released(3).unwrap(), None, "B holds partition 3 now");
    drop(b);
    // The server frees a closed session's locks a moment after the
    // socket closes; well within the lease, which would free them too.
    let waited = std::time::Instant::now();
    while a.claim_released(3).unwrap().is_none() {
        assert!(waited.elapsed() < HOLD_LEASE / 2, "B's session ended with it");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(a.claim_released(4).unwrap().is_some());
}

/// Each host names the others holding the projection's partitions, by the
/// name its hold session gives, and itself as this host; a partition let
/// go leaves the list, and so does a host that holds none.
#[test]
fn each_holder_names_the_others_and_their_partitions() {
    let Some(database) = database() else { return };
    let (a, b) = (database.connect().unwrap(), database.connect().unwrap());
    a.name_member("host-a <b>");
    assert!(a.members().unwrap().is_empty(), "nobody holds anything yet");
    a.claim_released(0).unwrap().unwrap();
    a.claim_released(2).unwrap().unwrap();
    b.claim_released(1).unwrap().unwrap();
    let members = b.members().unwrap();
    assert_eq!(members.len(), 2, "{members:?}");
    let (ours, theirs): (Vec<_>, Vec<_>) = members.into_iter().partition(|m| m.this_host);
    assert_eq!((ours[0].partitions.as_slice(), theirs[0].partitions.as_slice()), (&[1][..], &[0, 2][..]));
    assert_eq!(theirs[0].name, "host-a <b>");
    assert!(ours[0].name.contains(&format!("pid {}", std::process::id())), "by default: host name and pid");
    let seen_by_a = a.members().unwrap();
    assert!(seen_by_a.iter().any(|m| m.this_host && m.name == "host-a <b>" && m.partitions == [0, 2]), "{seen_by_a:?}");
    b.release(1);
    let left = a.members().unwrap();
    assert_eq!(left.len(), 1, "B holds nothing now: {left:?}");
    let other = database.connect().unwrap();
    let elsewhere = PostgresStore::connect_with(database.config.clone(), "another").unwrap();
    elsewhere.claim_released(5).unwrap().unwrap();
    assert_eq!(other.members().unwrap().len(), 1, "another projection's holds are not members");
    // A host that runs is a member for its whole life, holding a partition
    // or not: its run-lock session carries its name.
    b.hold_for_run().unwrap();
    let running = a.members().unwrap();
    assert_eq!(running.len(), 2, "{running:?}");
    let idle = running.iter().find(|m| !m.this_host).unwrap();
    assert!(idle.partitions.is_empty() && idle.name.contains(&format!("pid {}", std::process::id())), "{idle:?}");
    b.claim_released(1).unwrap().unwrap();
    let seen_by_b = b.members().unwrap();
    assert_eq!(seen_by_b.len(), 2, "its hold and run-lock sessions are one member: {seen_by_b:?}");
    assert!(seen_by_b.iter().any(|m| m.this_host && m.partitions == [1]), "{seen_by_b:?}");
    drop(b);
    let start = std::time::Instant::now();
    while a.members().unwrap().len() != 1 {
        assert!(start.elapsed() < Duration::from_secs(10), "a host that stopped is no member");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A holder that stops answering (paused, cut off) loses its holds once
/// PostgreSQL ends its silent session; another host claims the
/// partition then, and the old holder's commit to it is refused.
#[test]
fn a_silent_holder_loses_its_holds_and_its_commits_are_fenced() {
    let Some(database) = database() else { return };
    let (a, b) = (database.connect().unwrap(), database.connect().unwrap());
    let held = a.claim_released(3).unwrap().expect("nobody held partition 3");
    let commit = || BatchCommit { positions: vec![("t".into(), 3, 10)], ..BatchCommit::default() };
    a.commit(commit()).unwrap();
    std::thread::sleep(HOLD_LEASE + Duration::from_secs(1));
    assert_eq!(b.claim_released(3).unwrap(), None, "a holder that answers keeps its hold");
    a.holds.fall_silent();
    let deadline = std::time::Instant::now() + HOLD_LEASE * 3;
    let current = loop {
        if let Some(epoch) = b.claim_released(3).unwrap() {
            break epoch;
        }
        assert!(std::time::Instant::now() < deadline, "the silent holder kept its hold");
        std::thread::sleep(Duration::from_millis(100));
    };
    let refused = a.commit(commit()).unwrap_err();
    assert!(
        matches!(refused, StateError::Fenced { partition: 3, held: h, current: c } if h == held && c == current),
        "{refused}"
    );
}

#[test]
fn json_values_are_read_by_sql_through_the_projection_view() {
    let Some(database) = database() else { return };
    let store = database.connect().unwrap();
    let mut writes = KeyWrites::default();
    writes.set("account", br#"{"balance": 70, "owner": "ann"}"#.to_vec());
    writes.set("raw", vec![0xff, 0x00]);
    // JSON that jsonb refuses (a NUL in a string): kept as bytes, no json.
    writes.set("nul", br#""a\u0000b""#.to_vec());
    store.commit(BatchCommit { writes: vec![(Key::int(42), writes)], ..BatchCommit::default() }).unwrap();
    let rows = store
        .run(|db| async move {
            let sql = "SELECT name, json->>'balance', json IS NULL FROM waku_state_bank WHERE key = '42' ORDER BY name";
            let rows = db.query(sql, &[]).await?;
            Ok(rows
                .iter()
                .map(|row| (row.get::<_, String>(0), row.get::<_, Option<String>>(1), row.get::<_, bool>(2)))
                .collect::<Vec<_>>())
        })
        .unwrap();
    assert_eq!(
        rows,
        [
            ("account".to_owned(), Some("70".to_owned()), false),
            ("nul".to_owned(), None, true),
            ("raw".to_owned(), None, true),
        ]
    );
    assert_eq!(store.get(&Key::int(42), "raw").unwrap(), Some(vec![0xff, 0x00]));
}

/// A batch's commit of `value` under `name` for `key`, moving
/// partition `partition` of topic `t` to `next`.
fn batch(partition: u32, next: u64, key: u64, name: &str, value: Option<&str>) -> BatchCommit {
    let mut writes = KeyWrites::default();
    match value {
        Some(value) => writes.set(name, value.as_bytes().to_vec()),
        None => writes.delete(name),
    }
    BatchCommit {
        writes: vec![(Key::int(key), writes)],
        positions: vec![("t".into(), partition, next)],
        ..BatchCommit::default()
    }
}

fn read(store: &PostgresStore, partition: u32, key: u64, name: &str) -> Option<String> {
    let reader = store.batch_reader(partition, &[Key::int(key)]).unwrap();
    reader.get(&Key::int(key), name).unwrap().map(|value| String::from_utf8(value).unwrap())
}

/// The `synchronous_commit` each batch commit ran under, as a trigger
/// on `waku_positions` sees it inside the commit's transaction.
fn commit_settings(database: &Database, store: &PostgresStore, partition: u32) -> Vec<String> {
    database.execute(
        "CREATE TABLE IF NOT EXISTS seen_sync (partition integer, setting text);
         CREATE OR REPLACE FUNCTION see_sync() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO seen_sync VALUES (NEW.partition, current_setting('synchronous_commit'));
             RETURN NEW;
         END $$;
         CREATE OR REPLACE TRIGGER see_sync AFTER INSERT OR UPDATE ON waku_positions
             FOR EACH ROW EXECUTE FUNCTION see_sync();",
    );
    store.claim(partition).unwrap();
    store.commit(batch(partition, 1, 1, "v", Some("a"))).unwrap();
    store.commit(batch(partition, 2, 1, "v", Some("b"))).unwrap();
    // Outside a batch's transaction, the session keeps the server's.
    let after = store
        .run(|db| async move {
            let row = db.client().query_one("SELECT current_setting('synchronous_commit')", &[]).await;
            Ok(row.map_err(|e| db.error(e))?.get::<_, String>(0))
        })
        .unwrap();
    assert_eq!(after, "on", "SET LOCAL ends with its transaction");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = database.config.connect_client().await.unwrap();
        let rows =
            client.query("SELECT setting FROM seen_sync WHERE partition = $1", &[&i32_of(partition)]).await.unwrap();
        rows.iter().map(|row| row.get(0)).collect()
    })
}

#[test]
fn synchronous_commit_is_off_in_the_batch_transactions_only_when_the_url_opts_in() {
    let Some(database) = database() else { return };
    let durable = database.connect().unwrap();
    assert_eq!(commit_settings(&database, &durable, 1), ["on", "on"]);
    let mut opted = database.config.clone();
    opted.synchronous_commit = Some("off");
    let relaxed = PostgresStore::connect_with(opted, "bank").unwrap();
    assert_eq!(commit_settings(&database, &relaxed, 2), ["off", "off"]);
    assert!(matches!(
        "postgres://h/db?synchronous_commit=maybe".parse::<PostgresConfig>(),
        Err(SettingError::Invalid { option: "synchronous_commit", .. })
    ));
    let parsed: PostgresConfig = "postgres://h/db?synchronous_commit=off&sslmode=disable".parse().unwrap();
    assert_eq!(parsed.synchronous_commit, Some("off"));
}

#[test]
fn the_cache_never_serves_a_value_committed_after_the_partition_was_lost() {
    let Some(database) = database() else { return };
    let (old, new) = (database.connect().unwrap(), database.connect().unwrap());
    old.claim(3).unwrap();
    assert_eq!(read(&old, 3, 1, "v"), None);
    old.commit(batch(3, 1, 1, "v", Some("old"))).unwrap();
    assert_eq!(old.cache_held().1, 1, "the key is cached and written through");
    assert_eq!(read(&old, 3, 1, "v").as_deref(), Some("old"));
    // A commit the database refuses (PostgreSQL text holds no NUL)
    // writes nothing through.
    let mut refused = batch(3, 2, 1, "v", Some("refused"));
    refused.writes[0].1.set("nul\0", b"1".to_vec());
    assert!(matches!(old.commit(refused), Err(StateError::Storage { .. })));
    assert_eq!(read(&old, 3, 1, "v").as_deref(), Some("old"));
    // Another host takes the partition and commits; the old owner, not
    // told yet, reads the database's value, not its cache's.
    new.claim(3).unwrap();
    new.commit(batch(3, 2, 1, "v", Some("new"))).unwrap();
    assert_eq!(read(&old, 3, 1, "v").as_deref(), Some("new"));
    assert_eq!(old.cache_held().1, 0, "the lost partition's cache is dropped");
    // Its commit is fenced and writes nothing through.
    assert!(matches!(old.commit(batch(3, 3, 1, "v", Some("stale"))), Err(StateError::Fenced { .. })));
    assert_eq!(read(&old, 3, 1, "v").as_deref(), Some("new"));
    assert_eq!(old.cache_held().1, 0);
    // The new owner's cache follows its own commits, deletes included.
    assert_eq!(read(&new, 3, 1, "v").as_deref(), Some("new"));
    new.commit(batch(3, 3, 1, "v", None)).unwrap();
    assert_eq!(new.cache_held().1, 1);
    assert_eq!(read(&new, 3, 1, "v"), None);
    // Taken back: the old host claims again and reads afresh.
    old.claim(3).unwrap();
    new.commit(batch(3, 4, 1, "w", Some("x"))).unwrap_err();
    assert_eq!(read(&old, 3, 1, "w"), None);
    assert_eq!(read(&old, 3, 1, "v"), None);
    // A released partition's keys go at once.
    old.release(3);
    assert_eq!(old.cache_held().1, 0);
}

/// What `counter-get` rests on when two hosts share a projection, each
/// owning other partitions: a batch's counter is the value committed
/// when the batch began (the handler adds its key's own changes on top,
/// the same on every backend), so what the other host commits meanwhile
/// shows from the next batch on, in both directions, and the counter
/// sums both hosts' changes (README "PostgreSQL for the state",
/// `wit/handler.wit` `counter-get`).
#[test]
fn a_counter_another_host_changed_shows_from_its_next_batch_on() {
    let Some(database) = database() else { return };
    let (a, b) = (database.connect().unwrap(), database.connect().unwrap());
    a.claim(1).unwrap();
    b.claim(2).unwrap();
    let adding = |partition: u32, next: u64, delta: i128| {
        let mut commit = batch(partition, next, u64::from(partition), "v", Some("x"));
        commit.counter_deltas.insert("total".into(), delta);
        commit
    };
    let counter_of = |store: &PostgresStore, partition: u32| {
        store.batch_reader(partition, &[Key::int(u64::from(partition))]).unwrap().counter("total").unwrap()
    };
    a.commit(adding(1, 1, 10)).unwrap();
    assert_eq!(counter_of(&b, 2), 10, "B's batch sees what A committed before it began");
    // A batch of B under way while A commits twice more.
    let under_way = b.batch_reader(2, &[Key::int(2)]).unwrap();
    assert_eq!(under_way.counter("total").unwrap(), 10);
    a.commit(adding(1, 2, 5)).unwrap();
    assert_eq!(under_way.counter("total").unwrap(), 10, "not before B's next batch");
    a.commit(adding(1, 3, 1)).unwrap();
    assert_eq!(under_way.counter("total").unwrap(), 10);
    drop(under_way);
    assert_eq!(counter_of(&b, 2), 16, "B's next batch sees both of A's commits");
    // The other way round: B's change, while a batch of A is under way.
    let under_way = a.batch_reader(1, &[Key::int(1)]).unwrap();
    assert_eq!(under_way.counter("total").unwrap(), 16);
    b.commit(adding(2, 1, -20)).unwrap();
    assert_eq!(under_way.counter("total").unwrap(), 16, "not before A's next batch");
    drop(under_way);
    assert_eq!(counter_of(&a, 1), -4, "A's next batch sees B's commit");
    // Both hosts' changes summed, neither lost.
    assert_eq!(a.counters().unwrap(), vec![("total".to_owned(), -4)]);
    assert_eq!(b.counters().unwrap(), vec![("total".to_owned(), -4)]);
}

/// The database comes back without acknowledged commits (as after a
/// crash with `synchronous_commit=off`), stood for by setting the
/// positions back behind the store's back: the next commit is refused
/// whole, naming where the store left the position and where the
/// database holds it, and a claim reads the positions again. Without
/// the check the commit would go on from the store's memory.
#[test]
fn a_commit_is_refused_when_the_database_forgot_where_the_store_left_a_position() {
    let Some(database) = database() else { return };
    let store = database.connect().unwrap();
    store.claim(5).unwrap();
    store.claim(6).unwrap();
    for next in [10, 20] {
        store.commit(batch(5, next, 1, "v", Some("kept"))).unwrap();
        store.commit(batch(6, next, 2, "v", Some("kept"))).unwrap();
    }
    // The last commit of partition 5 forgotten; every commit of 6.
    database.execute(
        "UPDATE waku_positions SET next = 10 WHERE projection = 'bank' AND partition = 5; \
         DELETE FROM waku_positions WHERE projection = 'bank' AND partition = 6",
    );
    let refused = store.commit(batch(5, 30, 1, "v", Some("refused"))).unwrap_err();
    assert!(
        matches!(&refused, StateError::PositionMoved { partition: 5, topic, expected: Some(20), found: Some(10) }
            if topic == "t"),
        "{refused}"
    );
    assert!(refused.to_string().contains("at offset 10 in the state store, not at offset 20"), "{refused}");
    let refused = store.commit(batch(6, 30, 2, "v", Some("refused"))).unwrap_err();
    assert!(
        matches!(&refused, StateError::PositionMoved { partition: 6, expected: Some(20), found: None, .. }),
        "{refused}"
    );
    // Nothing of either applied.
    assert_eq!((store.position("t", 5).unwrap(), store.position("t", 6).unwrap()), (Some(10), None));
    assert_eq!(store.get(&Key::int(1), "v").unwrap().as_deref(), Some(&b"kept"[..]));
    // Refused again until claimed again; then the store goes on from
    // what the database holds.
    assert!(matches!(store.commit(batch(5, 30, 1, "v", None)), Err(StateError::PositionMoved { .. })));
    store.claim(5).unwrap();
    store.claim(6).unwrap();
    store.commit(batch(5, 30, 1, "v", Some("again"))).unwrap();
    store.commit(batch(6, 10, 2, "v", Some("again"))).unwrap();
    assert_eq!((store.position("t", 5).unwrap(), store.position("t", 6).unwrap()), (Some(30), Some(10)));
    assert_eq!(read(&store, 5, 1, "v").as_deref(), Some("again"));
}

#[test]
fn an_evicted_key_reads_back_its_committed_value() {
    let Some(database) = database() else { return };
    let store = database.connect().unwrap().with_cache_bytes(8 * 1024);
    store.claim(0).unwrap();
    let value = |key: u64| format!("{key}-{}", "x".repeat(200));
    for key in 0..100_u64 {
        let keys: Vec<Key> = (key.saturating_sub(3)..=key).map(Key::int).collect();
        drop(store.batch_reader(0, &keys).unwrap());
        store.commit(batch(0, key + 1, key, "v", Some(&value(key)))).unwrap();
        let (bytes, _) = store.cache_held();
        assert!(bytes <= 8 * 1024, "the cache holds {bytes} bytes");
    }
    let (_, held) = store.cache_held();
    assert!(held > 0 && held < 100, "{held} keys cached");
    for key in 0..100 {
        assert_eq!(read(&store, 0, key, "v"), Some(value(key)), "key {key}");
    }
    // A batch loads up to the capacity; the keys past it are read one
    // at a time, with the same answers.
    let keys: Vec<Key> = (0..100).map(Key::int).collect();
    let reader = store.batch_reader(0, &keys).unwrap();
    for key in 0..100 {
        assert_eq!(reader.get(&Key::int(key), "v").unwrap(), Some(value(key).into_bytes()));
        assert_eq!(reader.entry_count(&Key::int(key), 10).unwrap(), 1);
        assert!(reader.contains(&Key::int(key), "v").unwrap());
    }
    // No cache at all: every read is a query, with the same answers.
    let uncached = database.connect().unwrap().with_cache_bytes(0);
    uncached.claim(0).unwrap();
    assert_eq!(read(&uncached, 0, 42, "v"), Some(value(42)));
    assert_eq!(uncached.cache_held(), (0, 0));
}

#[test]
fn json_is_sent_only_when_postgresql_takes_it_as_jsonb() {
    let Some(database) = database() else { return };
    let store = database.connect().unwrap();
    let big = format!("1{}", "0".repeat(1001));
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let texts = [
        r#"{"a": [1, 2.5, -3e10, true, null, "x\"y"]}"#,
        r#""\u00e9\ud83d\ude00""#,
        r#""a\u0000b""#,
        r#""\ud800""#,
        r#""\\u0000""#,
        "1e400",
        "1e-400",
        "1e-20000",
        "0.1e1001",
        &big,
        &deep,
        "[1,]",
        "{\"a\":1}garbage",
        "\u{feff}1",
        " 1 ",
        "",
    ];
    for text in texts {
        let json = json_text(text.as_bytes());
        let taken = store
            .run({
                let text = text.to_owned();
                move |db| async move { Ok(db.client().query("SELECT $1::text::jsonb", &[&text]).await.is_ok()) }
            })
            .unwrap();
        assert!(json.is_none() || taken, "{text:?} is sent as JSON, and PostgreSQL refuses it");
    }
    assert!(json_text(texts[0].as_bytes()).is_some() && json_text(texts[1].as_bytes()).is_some());
    assert!(json_text(br#""\\u0000""#).is_some(), "an escaped backslash before u0000 is no NUL");
}

#[test]
fn version_2_gives_the_outbox_rows_of_version_1_their_partition() {
    let Some(database) = database() else { return };
    let entry = OutboxEntry {
        topic: "retry_t".into(),
        partition_key: 9,
        partition: Some(5),
        record: crate::storage::log::Record::default(),
        origin: None,
    };
    let bytes: String = encode_outbox(&entry, "test").unwrap().iter().map(|b| format!("{b:02x}")).collect();
    database.execute(&format!(
        "CREATE TABLE waku_schema (version integer PRIMARY KEY); {} INSERT INTO waku_schema VALUES (1); \
         INSERT INTO waku_outbox (projection, seq, entry) VALUES ('bank', 7, '\\x{bytes}'::bytea)",
        MIGRATIONS[0]
    ));
    let store = database.connect().unwrap();
    assert_eq!(store.outbox_of(5).unwrap(), vec![(7, entry)]);
    assert!(store.outbox_of(0).unwrap().is_empty());
}

#[test]
fn stats_written_by_name_by_earlier_hosts_read_back_typed_and_keep_their_names() {
    let Some(database) = database() else { return };
    drop(database.connect().unwrap());
    // The rows as earlier hosts (and a newer one, `from_a_newer_host`) wrote them.
    use crate::storage::stats::tests::PERSISTED;
    let names = PERSISTED.map(|(name, _)| name);
    let values: Vec<String> = names.iter().zip(1..).map(|(name, n)| format!("('bank', '{name}', {n})")).collect();
    database.execute(&format!(
        "INSERT INTO waku_stats (projection, name, value) VALUES {}, ('bank', 'from_a_newer_host', 99)",
        values.join(", ")
    ));
    let store = database.connect().unwrap();
    let stats = store.stats().unwrap();
    for ((_, stat), n) in PERSISTED.into_iter().zip(1..) {
        assert_eq!(stats[stat], n, "{stat}");
    }
    assert_eq!(stats.unknown().get("from_a_newer_host"), Some(&99));
    // Written back under the same names: one row each, added to.
    store.commit(BatchCommit { stat_deltas: stats, ..BatchCommit::default() }).unwrap();
    let rows = store
        .run(|db| async move {
            let rows = db.query("SELECT name, value::text FROM waku_stats ORDER BY name", &[]).await?;
            Ok(rows.iter().map(|row| (row.get::<_, String>(0), row.get::<_, String>(1))).collect::<Vec<_>>())
        })
        .unwrap();
    let mut expected: Vec<(String, String)> =
        names.iter().zip(1..).map(|(name, n): (&&str, u64)| (name.to_string(), (2 * n).to_string())).collect();
    expected.push(("from_a_newer_host".to_owned(), "198".to_owned()));
    expected.sort();
    assert_eq!(rows, expected);
}

#[test]
fn long_projection_names_get_views_of_their_own() {
    let Some(database) = database() else { return };
    let long = |end: &str| format!("{}{end}", "p".repeat(60));
    let (first, second) = (long("1"), long("2"));
    assert_ne!(view_name(&first), view_name(&second));
    assert!(view_name(&first).len() <= MAX_IDENTIFIER);
    assert_eq!(view_name("bank"), "waku_state_bank");
    for projection in [&first, &second] {
        let store = PostgresStore::connect_with(database.config.clone(), projection).unwrap();
        let mut writes = KeyWrites::default();
        writes.set("owner", format!("\"{projection}\"").into_bytes());
        store.commit(BatchCommit { writes: vec![(Key::int(1), writes)], ..BatchCommit::default() }).unwrap();
    }
    let store = database.connect().unwrap();
    for projection in [first, second] {
        let view = view_name(&projection);
        let owners = store
            .run(|db| async move {
                let rows = db.query(&format!("SELECT json #>> '{{}}' FROM \"{view}\""), &[]).await?;
                Ok(rows.iter().map(|row| row.get::<_, String>(0)).collect::<Vec<_>>())
            })
            .unwrap();
        assert_eq!(owners, [projection]);
    }
}

#[test]
fn a_database_that_is_not_utf8_is_refused_naming_its_encoding() {
    let Some(database) = database() else { return };
    let name = format!("waku_latin1_{}", std::process::id());
    database.execute(&format!("DROP DATABASE IF EXISTS {name}"));
    database
        .execute(&format!("CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"));
    let mut config = database.config.clone();
    config.pg.dbname(&name);
    let refused = PostgresStore::connect_with(config, "bank").map(drop);
    database.execute(&format!("DROP DATABASE {name}"));
    let error = refused.unwrap_err();
    let source = std::error::Error::source(&error).map(ToString::to_string).unwrap_or_default();
    assert!(source.contains("stores text as LATIN1") && source.contains("ENCODING 'UTF8'"), "{error}: {source}");
}

#[test]
fn the_schema_is_versioned_and_a_newer_one_is_refused() {
    let Some(database) = database() else { return };
    drop(database.connect().unwrap());
    // A second host finds the schema in place and migrates nothing.
    drop(database.connect().unwrap());
    let known = MIGRATIONS.len() as i32;
    database.execute(&format!("INSERT INTO waku_schema (version) VALUES ({})", known + 1));
    let error = database.connect().unwrap_err();
    assert!(
        matches!(error, StateError::SchemaTooNew { found, known: k, .. } if found == known + 1 && k == known),
        "{error}"
    );
}
