//! The store itself ([`PostgresStore`]): what it holds, how it is made,
//! and [`StateBackend`] for it, each call a short list of steps whose
//! SQL and rules live in the other files of this folder.
//!
//! Rules kept here:
//! - **Every call runs on the store's runtime** with a pooled connection
//!   of its own ([`PostgresStore::run`], [`super::bridge`]); a snapshot
//!   keeps its connection until it is dropped.
//! - **The store's memory follows the database, never leads it**: a
//!   claim is remembered once the epoch is bumped, positions move on once
//!   a commit passed its checks ([`super::claims`]), and the cache takes a
//!   commit's writes only once it succeeded, or a batch's reads only while
//!   the partition's epoch is still the one claimed ([`super::super::cache`]).
//! - **A connect that fails on a refused handshake says why**
//!   ([`StateError::Tls`], [`super::connect`]).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use deadpool_postgres::Pool;

use super::super::cache::{BatchSnapshot, DEFAULT_CACHE_BYTES, StateCache};
use super::super::hold::Holds;
use super::super::{BatchCommit, KeyWrites, Member, OutboxEntry, StateBackend, StateError, StateReader, TimerSummary};
use super::bridge::Bridge;
use super::claims::{self, Claims};
use super::commit::{self, CommitRows};
use super::db::Db;
use super::reads::{self, PostgresSnapshot};
use super::tls::PostgresConfig;
use super::{connect, inspect, outbox, schema};
use crate::key::Key;
use crate::storage::stats::Stats;
use wakuwaku_core::timers::Millis;

/// The state of one projection in a PostgreSQL database.
pub struct PostgresStore {
    pool: Pool,
    bridge: Bridge,
    projection: Arc<str>,
    location: Arc<str>,
    /// The partitions this store claimed, their epochs and positions.
    claims: Claims,
    /// The connection holding the run lock (shared for a run, exclusive
    /// for a reset), out of the pool: the lock lasts as long as its session.
    /// Its server process, a member of the group for as long as the host
    /// runs ([`StateBackend::members`]).
    run_lock: Mutex<Option<(deadpool_postgres::ClientWrapper, i32)>>,
    /// The entries of the keys of the claimed partitions ([`super::super::cache`]).
    cache: StateCache,
    /// The partitions this store holds, on a session of their own
    /// ([`super::super::hold`]).
    pub(super) holds: Arc<Holds>,
    /// What the store's commits wrote.
    written: Arc<Written>,
    /// What a batch's transaction begins with: `BEGIN`, and `SET LOCAL
    /// synchronous_commit` when the URL opts in ([`PostgresConfig::synchronous_commit`]).
    begin: Arc<str>,
    /// Whether a commit's statements run prepared (the default) or are
    /// parsed and planned by the server at each commit
    /// ([`PostgresStore::with_prepared_commits`]).
    prepared: bool,
}

/// What a store's commits wrote, counted as they succeed
/// ([`PostgresStore::written`]).
#[derive(Debug, Default)]
pub struct Written {
    commits: AtomicU64,
    rows: AtomicU64,
}

impl Written {
    /// The commits that succeeded.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// The rows they wrote or removed, over every table (state entries,
    /// counters, statistics, positions, done marks, outbox entries).
    pub fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    /// Counts a commit that succeeded, of `rows` rows.
    fn count(&self, rows: u64) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.rows.fetch_add(rows, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore").field("location", &self.location).finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user@host:port/db`,
    /// or key=value pairs), creates or migrates the schema, and creates the
    /// projection's view.
    pub fn connect(url: &str, projection: &str) -> Result<Self, StateError> {
        let config = PostgresConfig::from_str(url)
            .map_err(|e| StateError::Storage { store: "the PostgreSQL URL".to_owned(), source: Box::new(e) })?;
        Self::connect_with(config, projection)
    }

    /// [`connect`](Self::connect) with a parsed configuration.
    pub fn connect_with(config: PostgresConfig, projection: &str) -> Result<Self, StateError> {
        let (store, roots, client_cert) = Self::pool_for(config, projection)?;
        store
            .run(|db| async move { schema::migrate(db).await })
            .map_err(|error| connect::tls_refusal(error, &roots, client_cert.as_deref()))?;
        Ok(store)
    }

    /// The store of `projection` in the database `url` names, for a
    /// command that only reads: it creates and migrates nothing, and
    /// answers also the projections the database holds (those with a
    /// position, an epoch or a meta entry, sorted; none when it holds no
    /// waku schema), so the caller can refuse one that is not there.
    pub fn connect_existing(url: &str, projection: &str) -> Result<(Self, Vec<String>), StateError> {
        let config = PostgresConfig::from_str(url)
            .map_err(|e| StateError::Storage { store: "the PostgreSQL URL".to_owned(), source: Box::new(e) })?;
        let (store, roots, client_cert) = Self::pool_for(config, projection)?;
        let found = store
            .run(|db| async move { schema::projections(db).await })
            .map_err(|error| connect::tls_refusal(error, &roots, client_cert.as_deref()))?;
        Ok((store, found))
    }

    /// The pool and handle of a store, not connected yet, and what a TLS
    /// refusal's message needs.
    fn pool_for(
        config: PostgresConfig,
        projection: &str,
    ) -> Result<(Self, String, Option<std::path::PathBuf>), StateError> {
        let location: Arc<str> = connect::describe(&config.pg, projection).into();
        crate::storage::log::check_projection_name(projection)
            .map_err(|e| StateError::Storage { store: location.to_string(), source: Box::new(e) })?;
        let connect::Pooled { pool, begin, roots, client_cert } = connect::pool(config, &location)?;
        let bridge =
            Bridge::new().map_err(|e| StateError::Storage { store: location.to_string(), source: Box::new(e) })?;
        let store = Self {
            pool,
            bridge,
            projection: projection.into(),
            location,
            claims: Claims::default(),
            run_lock: Mutex::default(),
            cache: StateCache::new(DEFAULT_CACHE_BYTES),
            holds: Arc::default(),
            written: Arc::default(),
            begin,
            prepared: true,
        };
        Ok((store, roots, client_cert))
    }

    /// The store with a cache of at most `bytes` ([`super::super::cache`]; the
    /// default is [`DEFAULT_CACHE_BYTES`]). A batch loads at most that much
    /// too; 0 caches nothing and reads every entry with a query of its own.
    pub fn with_cache_bytes(mut self, bytes: usize) -> Self {
        self.cache = StateCache::new(bytes);
        self
    }

    /// The store with its commit statements sent prepared (`true`, the
    /// default: named statements each connection prepares once) or not
    /// (`false`: each commit sends every statement's text with its
    /// parameter types, unnamed, so the server parses and plans it again;
    /// the round trips stay one per commit). For the benchmark that
    /// measures what preparing is worth (BENCHMARKS.md).
    pub fn with_prepared_commits(mut self, prepared: bool) -> Self {
        self.prepared = prepared;
        self
    }

    /// What the store's commits wrote so far, counted as they succeed (a
    /// handle that stays valid once the store is put behind a
    /// [`super::super::StateStore`]).
    pub fn written(&self) -> Arc<Written> {
        self.written.clone()
    }

    /// What the cache holds: bytes as it counts them, and keys.
    pub fn cache_held(&self) -> (usize, usize) {
        self.cache.held()
    }

    /// A handle on the store's names with no connection yet.
    fn unconnected(&self) -> Db {
        Db { projection: self.projection.clone(), location: self.location.clone(), client: None }
    }

    /// Runs `work` on the store's runtime with a pooled connection and
    /// waits for it.
    pub(super) fn run<T, F>(&self, work: impl FnOnce(Db) -> F + Send + 'static) -> Result<T, StateError>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, StateError>> + Send + 'static,
    {
        let pool = self.pool.clone();
        let db = self.unconnected();
        let location = self.location.clone();
        self.bridge.run(&location, async move {
            let client = pool.get().await.map_err(|e| db.error(e))?;
            work(Db { client: Some(Arc::new(client)), ..db }).await
        })
    }

    /// Bumps `partition`'s epoch and remembers it as this store's claim,
    /// with the partition's positions then; what the cache held of the
    /// partition goes.
    fn bump_epoch(&self, partition: u32) -> Result<u64, StateError> {
        let (epoch, positions) = self.run(move |db| async move { claims::bump_epoch(&db, partition).await })?;
        self.claims.claimed(partition, epoch, positions);
        self.cache.drop_partition(partition);
        Ok(epoch.unsigned_abs())
    }

    /// Names this host for the other hosts holding the projection's
    /// partitions ([`StateBackend::members`]), from its next hold session
    /// on; by default the host name and process id.
    pub fn name_member(&self, name: &str) {
        self.holds.set_name(name);
    }

    /// Names this host for the others by its host name and process id and
    /// `admin`, its admin endpoint's address
    /// (`db-7 pid 4121 admin 10.0.0.5:9100`, within PostgreSQL's 63 bytes).
    pub fn name_member_with_admin(&self, admin: &str) {
        self.holds.set_name(&super::super::hold::member_name(Some(admin)));
    }

    /// Takes the hold on `partition` unless another session has it
    /// ([`super::super::hold`]).
    fn try_hold(&self, partition: u32) -> Result<bool, StateError> {
        let (holds, pool) = (self.holds.clone(), self.pool.clone());
        let (projection, location) = (self.projection.clone(), self.location.clone());
        self.bridge.run(&self.location, async move { holds.try_hold(&pool, &projection, partition, &location).await })
    }

    /// Takes the run lock, shared or exclusive, with a try-lock on a
    /// connection of its own kept until the store is dropped.
    fn take_run_lock(&self, shared: bool) -> Result<(), StateError> {
        let mut held = self.run_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if held.is_some() {
            return Ok(());
        }
        let (name, location) = (self.holds.name(), self.location.to_string());
        let taken = self.run(move |db| async move {
            let failed = |e| StateError::Storage { store: location, source: Box::new(e) };
            let Some(client) = claims::try_run_lock(db, shared).await? else { return Ok(None) };
            // Named as the hold sessions are: the host is a member while
            // it runs, holding partitions or not.
            let named = client
                .query_one("SELECT set_config('application_name', $1, false), pg_backend_pid()", &[&name])
                .await
                .map_err(failed)?;
            Ok(Some((client, named.get::<_, i32>(1))))
        })?;
        *held = Some(taken.ok_or_else(|| StateError::InUse { store: self.location.to_string() })?);
        Ok(())
    }
}

impl StateBackend for PostgresStore {
    fn location(&self) -> &str {
        &self.location
    }

    /// Bumps the epoch whoever holds the partition, and holds it too when
    /// nobody else does.
    fn claim(&self, partition: u32) -> Result<u64, StateError> {
        self.try_hold(partition)?;
        self.bump_epoch(partition)
    }

    fn claim_released(&self, partition: u32) -> Result<Option<u64>, StateError> {
        match self.try_hold(partition)? {
            true => self.bump_epoch(partition).map(Some),
            false => Ok(None),
        }
    }

    /// One round trip: the snapshot's transaction begins, the partition's
    /// epoch is read in it, and every entry of the keys not cached, in one
    /// query bound to an array of them (up to the cache's capacity).
    fn batch_reader(&self, partition: u32, keys: &[Key]) -> Result<StateReader, StateError> {
        let held = self.claims.epoch(partition);
        let (hits, mut misses) = match held {
            Some(epoch) => self.cache.lookup(partition, epoch, keys),
            None => (HashMap::new(), keys.to_vec()),
        };
        misses.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        misses.dedup();
        let fill = self.cache.begin_fill();
        let wanted: Vec<Vec<u8>> = misses.iter().map(|key| key.as_bytes().to_vec()).collect();
        let bound = i64::try_from(self.cache.capacity()).unwrap_or(i64::MAX);
        let opened = self.run(move |db| async move {
            let opened = reads::open_batch(&db, partition, held.is_some(), wanted, bound).await?;
            Ok((db.client.clone(), opened))
        });
        let (client, opened) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                self.cache.end_fill(fill, None, &HashMap::new());
                return Err(error);
            }
        };
        let still_held = held.filter(|&epoch| opened.epoch == Some(epoch));
        let mut loaded = match still_held {
            Some(_) => hits,
            None => {
                // Taken over since: nothing cached of the partition is
                // served (this batch's commit will be fenced).
                self.cache.drop_partition(partition);
                HashMap::new()
            }
        };
        let fetched = opened.into_entries(misses);
        self.cache.end_fill(fill, still_held.map(|epoch| (partition, epoch)), &fetched);
        loaded.extend(fetched);
        let rest = PostgresSnapshot::new(Db { client, ..self.unconnected() }, self.bridge.handle());
        Ok(StateReader::new(BatchSnapshot::new(loaded, rest)))
    }

    fn release(&self, partition: u32) {
        self.cache.drop_partition(partition);
        let (holds, projection, location) = (self.holds.clone(), self.projection.clone(), self.location.clone());
        let _ = self.bridge.run(&self.location, async move {
            holds.unhold(&projection, partition, &location).await;
            Ok(())
        });
    }

    fn members(&self) -> Result<Vec<Member>, StateError> {
        let (holds, pool) = (self.holds.clone(), self.pool.clone());
        let (projection, location) = (self.projection.clone(), self.location.clone());
        let run_session = self.run_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).as_ref().map(|r| r.1);
        self.bridge.run(&self.location, async move {
            holds.members(&pool, &projection, &location, claims::RUN_LOCK, run_session).await
        })
    }

    fn reader(&self) -> Result<StateReader, StateError> {
        let client = self.run(|db| async move {
            reads::begin_snapshot(&db).await?;
            Ok(db.client.clone())
        })?;
        Ok(StateReader::new(PostgresSnapshot::new(Db { client, ..self.unconnected() }, self.bridge.handle())))
    }

    fn commit(&self, commit: BatchCommit) -> Result<(), StateError> {
        if commit.is_empty() {
            return Ok(());
        }
        let held = self.claims.held_epochs(&commit);
        let checks = self.claims.position_checks(&commit);
        let committing = self.claims.committing_partition(&commit);
        let taken = self.cache.begin_write(commit.writes.iter().map(|(key, _)| key));
        // What goes back into the cache once the commit succeeded.
        let writes: Vec<(Key, KeyWrites)> = match committing {
            Some(_) => commit.writes.iter().filter(|(key, _)| taken.was_cached(key)).cloned().collect(),
            None => Vec::new(),
        };
        let written = self.written.clone();
        let (begin, prepared) = (self.begin.clone(), self.prepared);
        let committed = CommitRows::fold(commit, &self.location).and_then(|rows| {
            let count = rows.count() as u64;
            let checked = checks.clone();
            self.run(move |db| async move { commit::commit(&db, (&begin, prepared), held, &checked, rows).await })?;
            self.claims.continued(&checks);
            written.count(count);
            Ok(())
        });
        let through = committed.as_ref().ok().and(committing);
        self.cache.end_write(taken, through, &writes);
        committed
    }

    fn keys(&self) -> Result<Vec<Key>, StateError> {
        self.run(|db| async move { inspect::keys(&db).await })
    }

    fn entries(&self, key: &Key) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        let key = key.as_bytes().to_vec();
        self.run(move |db| async move { inspect::entries(&db, &key).await })
    }

    fn get(&self, key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let (key, name) = (key.as_bytes().to_vec(), name.to_owned());
        self.run(move |db| async move { reads::get(&db, &key, &name).await })
    }

    fn counters(&self) -> Result<Vec<(String, i128)>, StateError> {
        self.run(|db| async move { inspect::numbers(&db, "waku_counters").await })
    }

    fn counters_page(&self, after: Option<&str>, limit: usize) -> Result<Vec<(String, i128)>, StateError> {
        let (after, limit) = (after.map(str::to_owned), i64::try_from(limit).unwrap_or(i64::MAX));
        self.run(move |db| async move { inspect::counters_page(&db, after.as_deref(), limit).await })
    }

    fn entries_page(
        &self,
        key: &Key,
        after: Option<&str>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        let (key, after) = (key.as_bytes().to_vec(), after.map(str::to_owned));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let max_bytes = i64::try_from(max_bytes).unwrap_or(i64::MAX);
        self.run(move |db| async move { inspect::entries_page(&db, &key, after.as_deref(), limit, max_bytes).await })
    }

    fn stats(&self) -> Result<Stats, StateError> {
        let rows = self.run(|db| async move { inspect::numbers::<u64>(&db, "waku_stats").await })?;
        Ok(inspect::stats_of(rows))
    }

    fn position(&self, topic: &str, partition: u32) -> Result<Option<u64>, StateError> {
        let topic = topic.to_owned();
        self.run(move |db| async move { inspect::position(&db, &topic, partition).await })
    }

    fn done(&self, topic: &str, partition: u32) -> Result<Vec<u64>, StateError> {
        let topic = topic.to_owned();
        self.run(move |db| async move { inspect::done(&db, &topic, partition).await })
    }

    fn outbox(&self) -> Result<Vec<(u64, OutboxEntry)>, StateError> {
        self.run(|db| async move { outbox::outbox(&db).await })
    }

    fn outbox_of(&self, partition: u32) -> Result<Vec<(u64, OutboxEntry)>, StateError> {
        self.run(move |db| async move { outbox::outbox_of(&db, partition).await })
    }

    fn meta(&self, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let name = name.to_owned();
        self.run(move |db| async move { inspect::meta(&db, &name).await })
    }

    fn set_meta(&self, name: &str, value: &[u8]) -> Result<(), StateError> {
        let (name, value) = (name.to_owned(), value.to_vec());
        self.run(move |db| async move { inspect::set_meta(&db, &name, &value).await })
    }

    // Reset (issue 14)

    /// Takes the run lock shared: any number of hosts run the projection
    /// together, and a reset's exclusive try-lock fails meanwhile.
    fn hold_for_run(&self) -> Result<(), StateError> {
        self.take_run_lock(true)
    }

    /// Takes the run lock exclusively, without waiting.
    fn lock_for_reset(&self) -> Result<(), StateError> {
        self.take_run_lock(false)
    }

    fn positions(&self) -> Result<Vec<(String, u32, u64)>, StateError> {
        self.run(|db| async move { inspect::marks(&db, "waku_positions", "next").await })
    }

    fn done_marks(&self) -> Result<Vec<(String, u32, u64)>, StateError> {
        self.run(|db| async move { inspect::marks(&db, "waku_done", "record").await })
    }

    fn meta_entries(&self) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        self.run(|db| async move { inspect::meta_entries(&db).await })
    }

    fn start_over(&self, positions: Vec<(String, u32, u64)>) -> Result<(), StateError> {
        let mut rows = CommitRows::default();
        for (topic, partition, next) in positions {
            rows.add_position(topic, partition, next, &self.location)?;
        }
        self.run(move |db| async move { commit::start_over(db, rows).await })
    }

    fn due_timers(&self, partition: u32, before: Millis, limit: usize) -> Result<Vec<(Key, Millis)>, StateError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |db| async move { inspect::due_timers(&db, partition, before, limit).await })
    }

    fn timer_summary(&self, partition: Option<u32>) -> Result<TimerSummary, StateError> {
        self.run(move |db| async move { inspect::timer_summary(&db, partition).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store made without a server: nothing connects until a call.
    fn unconnected(url: &str) -> PostgresStore {
        PostgresStore::pool_for(url.parse().unwrap(), "bank").map(|(store, ..)| store).unwrap()
    }

    #[test]
    fn a_store_shows_where_it_is_never_its_password_and_starts_with_the_defaults() {
        let store = unconnected("postgres://waku:secret@db.example:6432/state");
        let shown = format!("{store:?}");
        assert!(shown.contains("postgres `db.example:6432/state` projection `bank`"), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
        assert_eq!(store.location(), "postgres `db.example:6432/state` projection `bank`");
        assert!(store.prepared && !store.with_prepared_commits(false).prepared);
        let store = unconnected("postgres://u@h/db?synchronous_commit=off");
        assert_eq!(&*store.begin, "BEGIN; SET LOCAL synchronous_commit = off");
        assert_eq!(store.cache_held(), (0, 0));
        let written = store.written();
        assert_eq!((written.commits(), written.rows()), (0, 0));
        written.count(3);
        assert_eq!((store.written().commits(), store.written().rows()), (1, 3), "one counter, shared");
    }

    #[test]
    fn a_bad_url_or_projection_name_is_refused_before_any_connection() {
        let error = PostgresStore::connect("postgres://u@h/db?sslmode=strict", "bank").unwrap_err();
        assert!(matches!(&error, StateError::Storage { store, .. } if store == "the PostgreSQL URL"), "{error}");
        let error = PostgresStore::connect_existing("not a url at all ===", "bank").unwrap_err();
        assert!(matches!(&error, StateError::Storage { store, .. } if store == "the PostgreSQL URL"), "{error}");
        let error = PostgresStore::connect("postgres://u@h/db", "bank account").unwrap_err();
        assert!(
            matches!(&error, StateError::Storage { store, .. } if store == "postgres `h:5432/db` projection `bank account`"),
            "{error}"
        );
    }

    #[test]
    fn a_call_without_a_server_fails_naming_the_store_and_an_empty_commit_needs_none() {
        // Nothing listens on port 1: the connection is refused at once.
        let store = unconnected("postgres://u@127.0.0.1:1/db");
        let error = store.keys().unwrap_err();
        assert!(
            matches!(&error, StateError::Storage { store, .. } if store == "postgres `127.0.0.1:1/db` projection `bank`"),
            "{error}"
        );
        store.commit(BatchCommit::default()).unwrap();
        assert_eq!(store.written().commits(), 0);
        let error = PostgresStore::connect("postgres://u@127.0.0.1:1/db", "bank").unwrap_err();
        assert!(matches!(&error, StateError::Storage { .. }), "not a TLS refusal: {error}");
    }
}
