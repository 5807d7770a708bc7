//! The PostgreSQL state store: the state of a projection shared by several
//! hosts, in tables of one database.
//!
//! **Schema.** The host creates and migrates the schema itself when it
//! connects ([`PostgresStore::connect`]): the versions applied are rows of
//! `waku_schema`, and [`MIGRATIONS`] are applied in order, in one
//! transaction under an advisory lock, so hosts starting together never
//! race. A database with a newer version than this build knows is refused
//! ([`StateError::SchemaTooNew`]). Every table has a `projection` column,
//! so projections share one database:
//!
//! | table | holds |
//! | --- | --- |
//! | `waku_state` | (key bytes, name) → value bytes; `key_text` (the key as commands show it, `42`, `"ann"`), and `json`, the value as `jsonb` when it is JSON text `jsonb` surely takes (checked by the host, `json_text`; `NULL` otherwise) |
//! | `waku_counters`, `waku_stats` | name → value (`numeric`) |
//! | `waku_positions` | (topic, partition) → next offset |
//! | `waku_done` | (topic, partition, record): records at or above the position already dealt with |
//! | `waku_outbox`, `waku_outbox_next` | pending emitted records by sequence number with the partition whose commit added them ([`OutboxEntry::source`]), and the next number |
//! | `waku_meta` | the host's bookkeeping (module versions, outbox marks) |
//! | `waku_epochs` | partition → epoch of its current owner (fencing) |
//!
//! **A read model for SQL.** Each projection gets a view `waku_state_<projection>`
//! (for a projection name over 52 bytes, which PostgreSQL would cut: the
//! first 46 bytes of that, `_` and 16 hex digits of the name's SHA-256)
//! (key, name, json, value), created at connect:
//!
//! ```sql
//! SELECT json->'balance' FROM "waku_state_bank" WHERE key = '42' AND name = 'account';
//! ```
//!
//! **One batch, one transaction, one round trip.** A commit folds the
//! batch (last write of each entry wins, deltas summed) and sends `BEGIN`,
//! the epoch check, one prepared statement per table with arrays
//! (`unnest`) and `COMMIT` together, pipelined on one connection, and
//! waits for the answers once: its cost grows with the number of tables,
//! not of rows, and its round trips are one whatever the batch holds.
//!
//! **Fencing.** [`StateBackend::claim`] bumps the partition's row in
//! `waku_epochs` and remembers the epoch. A commit whose positions, done
//! marks or outbox entries (added or removed) touch a claimed partition
//! first locks its epoch `FOR SHARE` in the same transaction, in a
//! statement that fails (a division by zero, in plain SQL) unless it is
//! still the one claimed: a claim by another host waits for the commit,
//! and a commit after such a claim fails there, so the server skips the
//! rest and its `COMMIT` rolls back; the store reads the epochs then and
//! refuses the commit whole ([`StateError::Fenced`]). Partitions this
//! store never claimed are not fenced (one host, or a command such as
//! `waku dlq`).
//!
//! **Positions are checked too.** A claim reads the partition's positions,
//! and the store remembers where each of its commits left them. A commit
//! writing a position of a claimed partition checks, in the same
//! transaction and flight, that the database still holds it where the
//! store left it, and is refused whole otherwise
//! ([`StateError::PositionMoved`]): a database that came back from a crash
//! without commits it had acknowledged (`synchronous_commit=off`) makes the
//! host continue from what the database holds, never from its memory of
//! the forgotten batches.
//!
//! **Holds.** A claim also takes the partition's hold, a session advisory
//! lock on a connection of the store's own ([`super::hold`]), kept until
//! [`StateBackend::release`] or the session's end;
//! [`StateBackend::claim_released`] claims only a partition no other
//! session holds, so a partition moving between hosts waits for its
//! previous host's last commit instead of fencing it.
//!
//! **Bridging.** tokio-postgres is async and the [`StateBackend`] trait is
//! not (see [`super`]): the store owns a small runtime (two threads) that
//! drives the connections, and each call spawns its queries there and
//! waits for the answer on a channel. That works from any thread, a
//! runtime's included, and never nests runtimes.
//!
//! **Snapshots.** A [`StateBackend::reader`] holds one pooled connection in
//! a `REPEATABLE READ READ ONLY` transaction, started at once, so it sees
//! the commits before it and none after; the workers of a batch share it
//! (tokio-postgres pipelines their queries). Dropping the reader rolls the
//! transaction back before the connection returns to the pool. A batch's
//! reader ([`StateBackend::batch_reader`]) is one too, and in the round
//! trip that begins it, it reads the partition's epoch and every entry of
//! the batch's keys the cache lacks, with one query bound to an array of
//! them ([`super::cache`] says what is kept, and when it is dropped).
//!
//! The database must store text as UTF8 (or SQL_ASCII, which converts
//! nothing): names are any UTF-8 a module chooses, and a database that
//! converts text to another encoding is refused at connect.
//!
//! **Connections** are TCP (over TLS as the URL's `sslmode` says:
//! [`super::postgres_tls`], default `prefer` as libpq's) or Unix sockets.
//! A refused handshake fails the connect at start-up with
//! [`StateError::Tls`], which says why (an unknown CA, a certificate for
//! other names, a server without TLS).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};

use super::postgres_tls::PostgresConfig;

use super::cache::{BatchSnapshot, DEFAULT_CACHE_BYTES, KeyEntries, StateCache};
use super::hold::Holds;
use super::{
    BatchCommit, KeyWrites, OutboxEntry, Snapshot, StateBackend, StateError, StateReader, decode_outbox, encode_outbox,
};
use crate::key::Key;
use crate::storage::stats::Stats;

/// The schema, one migration per version: `MIGRATIONS[n]` takes the
/// database from version `n` to `n + 1`. Append; never edit a published one.
pub const MIGRATIONS: &[&str] = &[
    r#"
CREATE FUNCTION waku_json(value bytea) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    RETURN convert_from(value, 'UTF8')::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;
CREATE TABLE waku_state (
    projection text COLLATE "C" NOT NULL,
    key bytea NOT NULL,
    name text COLLATE "C" NOT NULL,
    key_text text NOT NULL,
    value bytea NOT NULL,
    json jsonb GENERATED ALWAYS AS (waku_json(value)) STORED,
    PRIMARY KEY (projection, key, name)
);
CREATE TABLE waku_counters (
    projection text COLLATE "C" NOT NULL,
    name text COLLATE "C" NOT NULL,
    value numeric(40, 0) NOT NULL,
    PRIMARY KEY (projection, name)
);
CREATE TABLE waku_stats (
    projection text COLLATE "C" NOT NULL,
    name text COLLATE "C" NOT NULL,
    value numeric(20, 0) NOT NULL,
    PRIMARY KEY (projection, name)
);
CREATE TABLE waku_positions (
    projection text COLLATE "C" NOT NULL,
    topic text COLLATE "C" NOT NULL,
    partition integer NOT NULL,
    next bigint NOT NULL,
    PRIMARY KEY (projection, topic, partition)
);
CREATE TABLE waku_done (
    projection text COLLATE "C" NOT NULL,
    topic text COLLATE "C" NOT NULL,
    partition integer NOT NULL,
    record bigint NOT NULL,
    PRIMARY KEY (projection, topic, partition, record)
);
CREATE TABLE waku_outbox (
    projection text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    entry bytea NOT NULL,
    PRIMARY KEY (projection, seq)
);
CREATE TABLE waku_outbox_next (
    projection text COLLATE "C" PRIMARY KEY,
    next bigint NOT NULL
);
CREATE TABLE waku_meta (
    projection text COLLATE "C" NOT NULL,
    name text COLLATE "C" NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (projection, name)
);
CREATE TABLE waku_epochs (
    projection text COLLATE "C" NOT NULL,
    partition integer NOT NULL,
    epoch bigint NOT NULL,
    PRIMARY KEY (projection, partition)
);
"#,
    r#"
ALTER TABLE waku_outbox ADD COLUMN partition integer;
CREATE INDEX waku_outbox_partition ON waku_outbox (projection, partition, seq);
"#,
    // The host checks JSON itself ([`json_text`]) and sends it beside the
    // bytes: no plpgsql call, and no subtransaction, per row written.
    r#"
ALTER TABLE waku_state ALTER COLUMN json DROP EXPRESSION;
DROP FUNCTION waku_json(bytea);
"#,
];

/// The advisory lock held while the schema is migrated ("waku" in ASCII).
const MIGRATION_LOCK: i64 = 0x7761_6b75;

/// The first key of the run lock, a shared advisory lock that running
/// hosts hold and a reset takes exclusively ("wak" in ASCII); the second is
/// the `hashtext` of the schema and the projection (advisory locks are per
/// database).
const RUN_LOCK: i32 = 0x0077_616b;

/// Connections kept per store: the batch workers share the reader's, so
/// a few serve a host.
const POOL_SIZE: usize = 8;

/// The state of one projection in a PostgreSQL database.
pub struct PostgresStore {
    pool: Pool,
    bridge: Bridge,
    projection: Arc<str>,
    location: Arc<str>,
    /// The epoch of each partition this store claimed.
    claims: Mutex<HashMap<u32, i64>>,
    /// The positions of each claimed partition, by topic, where this
    /// store's last commit (or its claim) left them: a commit writing one
    /// must find it there ([`StateError::PositionMoved`]).
    continues: Mutex<HashMap<u32, HashMap<String, i64>>>,
    /// The connection holding the run lock (shared for a run, exclusive
    /// for a reset), out of the pool: the lock lasts as long as its session.
    run_lock: Mutex<Option<deadpool_postgres::ClientWrapper>>,
    /// The entries of the keys of the claimed partitions ([`super::cache`]).
    cache: StateCache,
    /// The partitions this store holds, on a session of their own
    /// ([`super::hold`]).
    holds: Arc<Holds>,
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
    commits: std::sync::atomic::AtomicU64,
    rows: std::sync::atomic::AtomicU64,
}

impl Written {
    /// The commits that succeeded.
    pub fn commits(&self) -> u64 {
        self.commits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The rows they wrote or removed, over every table (state entries,
    /// counters, statistics, positions, done marks, outbox entries).
    pub fn rows(&self) -> u64 {
        self.rows.load(std::sync::atomic::Ordering::Relaxed)
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
            .run(|db| async move { db.migrate().await })
            .map_err(|error| tls_refusal(error, &roots, client_cert.as_deref()))?;
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
            .run(|db| async move { db.projections().await })
            .map_err(|error| tls_refusal(error, &roots, client_cert.as_deref()))?;
        Ok((store, found))
    }

    /// The pool and handle of a store, not connected yet, and what a TLS
    /// refusal's message needs.
    fn pool_for(
        config: PostgresConfig,
        projection: &str,
    ) -> Result<(Self, String, Option<std::path::PathBuf>), StateError> {
        let location: Arc<str> = describe(&config.pg, projection).into();
        crate::storage::log::check_projection_name(projection)
            .map_err(|e| StateError::Storage { store: location.to_string(), source: Box::new(e) })?;
        let connector =
            config.connector().map_err(|e| StateError::Storage { store: location.to_string(), source: Box::new(e) })?;
        config.tls.warn_if_unchecked(config.pg.get_hosts(), &location);
        let roots = config.tls.roots_named();
        let client_cert = config.tls.client_cert.clone();
        let begin: Arc<str> = match config.synchronous_commit {
            Some(setting) => format!("BEGIN; SET LOCAL synchronous_commit = {setting}").into(),
            None => "BEGIN".into(),
        };
        let manager =
            Manager::from_config(config.pg, connector, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .build()
            .map_err(|e| StateError::Storage { store: location.to_string(), source: Box::new(e) })?;
        let bridge =
            Bridge::new().map_err(|e| StateError::Storage { store: location.to_string(), source: Box::new(e) })?;
        let store = Self {
            pool,
            bridge,
            projection: projection.into(),
            location,
            claims: Mutex::default(),
            continues: Mutex::default(),
            run_lock: Mutex::default(),
            cache: StateCache::new(DEFAULT_CACHE_BYTES),
            holds: Arc::default(),
            written: Arc::default(),
            begin,
            prepared: true,
        };
        Ok((store, roots, client_cert))
    }

    /// The store with a cache of at most `bytes` ([`super::cache`]; the
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
    /// [`super::StateStore`]).
    pub fn written(&self) -> Arc<Written> {
        self.written.clone()
    }

    /// What the cache holds: bytes as it counts them, and keys.
    pub fn cache_held(&self) -> (usize, usize) {
        self.cache.held()
    }

    fn claimed(&self, partition: u32) -> Option<i64> {
        self.claims.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(&partition).copied()
    }

    /// The one partition a commit's positions name, with the epoch this
    /// store claimed it at: a batch's commit, whose writes are that
    /// partition's.
    fn committing_partition(&self, commit: &BatchCommit) -> Option<(u32, i64)> {
        let (_, partition, _) = commit.positions.first()?;
        if commit.positions.iter().any(|(_, other, _)| other != partition) {
            return None;
        }
        Some((*partition, self.claimed(*partition)?))
    }

    /// Runs `work` on the store's runtime with a pooled connection and
    /// waits for it.
    fn run<T, F>(&self, work: impl FnOnce(Db) -> F + Send + 'static) -> Result<T, StateError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StateError>> + Send + 'static,
    {
        let pool = self.pool.clone();
        let db = Db { projection: self.projection.clone(), location: self.location.clone(), client: None };
        let location = self.location.clone();
        self.bridge.run(&location, async move {
            let client = pool.get().await.map_err(|e| db.error(e))?;
            work(Db { client: Some(Arc::new(client)), ..db }).await
        })
    }

    /// The claimed epochs of the partitions `commit` touches (their
    /// positions, done marks or outbox).
    fn held_epochs(&self, commit: &BatchCommit) -> Vec<(u32, i64)> {
        let claims = self.claims.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let touched: HashSet<u32> = (commit.positions.iter().chain(&commit.done).map(|(_, partition, _)| *partition))
            .chain(commit.outbox.iter().map(OutboxEntry::source))
            .chain(commit.outbox_through.map(|(partition, _)| partition))
            .collect();
        let mut held: Vec<(u32, i64)> =
            touched.into_iter().filter_map(|partition| Some((partition, *claims.get(&partition)?))).collect();
        held.sort_unstable();
        held
    }

    /// The positions `commit` writes of the partitions this store claimed,
    /// each with where the store's last commit left it.
    fn position_checks(&self, commit: &BatchCommit) -> PositionChecks {
        let continues = self.continues.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut checks = PositionChecks::default();
        for (topic, partition, next) in &commit.positions {
            let Some(positions) = continues.get(partition) else { continue };
            checks.topics.push(topic.clone());
            checks.partitions.push(i32_of(*partition));
            checks.expected.push(positions.get(topic).copied());
            checks.next.push(i64::try_from(*next).unwrap_or(i64::MAX));
        }
        checks
    }

    /// Remembers where a commit that passed `checks` left its positions.
    fn continued(&self, checks: &PositionChecks) {
        let mut continues = self.continues.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for ((topic, partition), next) in checks.topics.iter().zip(&checks.partitions).zip(&checks.next) {
            if let Some(positions) = continues.get_mut(&partition.unsigned_abs()) {
                positions.insert(topic.clone(), *next);
            }
        }
    }

    /// Bumps `partition`'s epoch and remembers it as this store's claim,
    /// with the partition's positions then (after the bump, no other
    /// store's commit to it lands).
    fn bump_epoch(&self, partition: u32) -> Result<u64, StateError> {
        let (epoch, positions) = self.run(move |db| async move {
            let row = db
                .client()
                .query_one(
                    "INSERT INTO waku_epochs (projection, partition, epoch) VALUES ($1, $2, 1) \
                     ON CONFLICT (projection, partition) DO UPDATE SET epoch = waku_epochs.epoch + 1 \
                     RETURNING epoch",
                    &[&&*db.projection, &i32_of(partition)],
                )
                .await
                .map_err(|e| db.error(e))?;
            let positions = db.positions_of(partition).await?;
            Ok((row.get::<_, i64>(0), positions))
        })?;
        self.claims.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(partition, epoch);
        self.continues.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(partition, positions);
        self.cache.drop_partition(partition);
        Ok(epoch.unsigned_abs())
    }

    /// Takes the hold on `partition` unless another session has it
    /// ([`super::hold`]).
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
        let sql = match shared {
            true => "SELECT pg_try_advisory_lock_shared($1, hashtext(current_schema() || '/' || $2))",
            false => "SELECT pg_try_advisory_lock($1, hashtext(current_schema() || '/' || $2))",
        };
        let taken = self.run(move |mut db| async move {
            let client = db.take()?;
            let row = client.query_one(sql, &[&RUN_LOCK, &&*db.projection]).await.map_err(|e| db.error(e))?;
            Ok(row.get::<_, bool>(0).then(|| Object::take(client)))
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
        let held = self.claimed(partition);
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
            let opened = db.open_batch(partition, held.is_some(), wanted, bound).await?;
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
        let rest = PostgresSnapshot {
            db: Db { projection: self.projection.clone(), location: self.location.clone(), client },
            bridge: self.bridge.handle(),
        };
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

    fn reader(&self) -> Result<StateReader, StateError> {
        let client = self.run(|db| async move {
            db.client()
                .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1")
                .await
                .map_err(|e| db.error(e))?;
            Ok(db.client.clone())
        })?;
        Ok(StateReader::new(PostgresSnapshot {
            db: Db { projection: self.projection.clone(), location: self.location.clone(), client },
            bridge: self.bridge.handle(),
        }))
    }

    fn commit(&self, commit: BatchCommit) -> Result<(), StateError> {
        if commit.is_empty() {
            return Ok(());
        }
        let held = self.held_epochs(&commit);
        let checks = self.position_checks(&commit);
        let committing = self.committing_partition(&commit);
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
            self.run(move |db| async move { db.commit((&begin, prepared), held, &checked, rows).await })?;
            self.continued(&checks);
            written.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            written.rows.fetch_add(count, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        });
        let through = committed.as_ref().ok().and(committing);
        self.cache.end_write(taken, through, &writes);
        committed
    }

    fn keys(&self) -> Result<Vec<Key>, StateError> {
        self.run(|db| async move {
            let rows = db
                .query("SELECT DISTINCT key FROM waku_state WHERE projection = $1 ORDER BY key", &[&&*db.projection])
                .await?;
            rows.iter()
                .map(|row| {
                    Key::from_canonical(row.get::<_, &[u8]>(0))
                        .map_err(|e| db.corrupt(format!("a state key is not canonical: {e}")))
                })
                .collect()
        })
    }

    fn entries(&self, key: &Key) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        let key = key.as_bytes().to_vec();
        self.run(move |db| async move {
            let rows = db
                .query(
                    "SELECT name, value FROM waku_state WHERE projection = $1 AND key = $2 ORDER BY name",
                    &[&&*db.projection, &key],
                )
                .await?;
            Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
        })
    }

    fn get(&self, key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let (key, name) = (key.as_bytes().to_vec(), name.to_owned());
        self.run(move |db| async move { db.get(&key, &name).await })
    }

    fn counters(&self) -> Result<Vec<(String, i128)>, StateError> {
        self.run(|db| async move { db.numbers("waku_counters").await })
    }

    fn counters_page(&self, after: Option<&str>, limit: usize) -> Result<Vec<(String, i128)>, StateError> {
        let (after, limit) = (after.map(str::to_owned), i64::try_from(limit).unwrap_or(i64::MAX));
        self.run(move |db| async move {
            let rows = db
                .query(
                    "SELECT name, value::text FROM waku_counters WHERE projection = $1 AND ($2::text IS NULL OR name > $2) \
                     ORDER BY name LIMIT $3",
                    &[&&*db.projection, &after, &limit],
                )
                .await?;
            rows.iter()
                .map(|row| {
                    let (name, value): (String, &str) = (row.get(0), row.get(1));
                    let value = value.parse().map_err(|_| db.corrupt(format!("counter `{name}` holds {value}")))?;
                    Ok((name, value))
                })
                .collect()
        })
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
        self.run(move |db| async move {
            // The sizes are summed by the server, so only the page's values
            // travel: the first entry, and the next ones while the values
            // before them are under the bytes.
            let rows = db
                .query(
                    "SELECT name, value FROM ( \
                         SELECT name, value, \
                             coalesce(sum(octet_length(value)) OVER (ORDER BY name ROWS BETWEEN UNBOUNDED PRECEDING \
                                 AND CURRENT ROW), 0) AS upto, \
                             row_number() OVER (ORDER BY name) AS n \
                         FROM (SELECT name, value FROM waku_state \
                               WHERE projection = $1 AND key = $2 AND ($3::text IS NULL OR name > $3) \
                               ORDER BY name LIMIT $4) AS candidates \
                     ) AS page WHERE n = 1 OR upto - octet_length(value) < $5 ORDER BY name",
                    &[&&*db.projection, &key, &after, &limit, &max_bytes],
                )
                .await?;
            Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
        })
    }

    fn stats(&self) -> Result<Stats, StateError> {
        let rows = self.run(|db| async move { db.numbers::<u64>("waku_stats").await })?;
        let mut stats = Stats::new();
        for (name, count) in rows {
            stats.add_named(&name, count);
        }
        Ok(stats)
    }

    fn position(&self, topic: &str, partition: u32) -> Result<Option<u64>, StateError> {
        let topic = topic.to_owned();
        self.run(move |db| async move {
            let rows = db
                .query(
                    "SELECT next FROM waku_positions WHERE projection = $1 AND topic = $2 AND partition = $3",
                    &[&&*db.projection, &topic, &i32_of(partition)],
                )
                .await?;
            Ok(rows.first().map(|row| row.get::<_, i64>(0).unsigned_abs()))
        })
    }

    fn done(&self, topic: &str, partition: u32) -> Result<Vec<u64>, StateError> {
        let topic = topic.to_owned();
        self.run(move |db| async move {
            let rows = db
                .query(
                    "SELECT record FROM waku_done WHERE projection = $1 AND topic = $2 AND partition = $3 \
                     ORDER BY record",
                    &[&&*db.projection, &topic, &i32_of(partition)],
                )
                .await?;
            Ok(rows.iter().map(|row| row.get::<_, i64>(0).unsigned_abs()).collect())
        })
    }

    fn outbox(&self) -> Result<Vec<(u64, OutboxEntry)>, StateError> {
        self.run(|db| async move {
            let rows = db
                .query("SELECT seq, entry FROM waku_outbox WHERE projection = $1 ORDER BY seq", &[&&*db.projection])
                .await?;
            rows.iter()
                .map(|row| {
                    let seq = row.get::<_, i64>(0).unsigned_abs();
                    Ok((seq, decode_outbox(seq, row.get(1)).map_err(|what| db.corrupt(what))?))
                })
                .collect()
        })
    }

    fn outbox_of(&self, partition: u32) -> Result<Vec<(u64, OutboxEntry)>, StateError> {
        self.run(move |db| async move {
            let rows = db
                .query(
                    "SELECT seq, entry FROM waku_outbox WHERE projection = $1 AND partition = $2 ORDER BY seq",
                    &[&&*db.projection, &i32_of(partition)],
                )
                .await?;
            rows.iter()
                .map(|row| {
                    let seq = row.get::<_, i64>(0).unsigned_abs();
                    Ok((seq, decode_outbox(seq, row.get(1)).map_err(|what| db.corrupt(what))?))
                })
                .collect()
        })
    }

    fn meta(&self, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let name = name.to_owned();
        self.run(move |db| async move {
            let rows = db
                .query("SELECT value FROM waku_meta WHERE projection = $1 AND name = $2", &[&&*db.projection, &name])
                .await?;
            Ok(rows.first().map(|row| row.get(0)))
        })
    }

    fn set_meta(&self, name: &str, value: &[u8]) -> Result<(), StateError> {
        let (name, value) = (name.to_owned(), value.to_vec());
        self.run(move |db| async move {
            db.query(
                "INSERT INTO waku_meta (projection, name, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (projection, name) DO UPDATE SET value = excluded.value",
                &[&&*db.projection, &name, &value],
            )
            .await
            .map(drop)
        })
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
        self.run(|db| async move { db.marks("waku_positions", "next").await })
    }

    fn done_marks(&self) -> Result<Vec<(String, u32, u64)>, StateError> {
        self.run(|db| async move { db.marks("waku_done", "record").await })
    }

    fn meta_entries(&self) -> Result<Vec<(String, Vec<u8>)>, StateError> {
        self.run(|db| async move {
            let rows = db
                .query("SELECT name, value FROM waku_meta WHERE projection = $1 ORDER BY name", &[&&*db.projection])
                .await?;
            Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
        })
    }

    fn start_over(&self, positions: Vec<(String, u32, u64)>) -> Result<(), StateError> {
        let mut rows = CommitRows::default();
        for (topic, partition, next) in positions {
            rows.add_position(topic, partition, next, &self.location)?;
        }
        self.run(move |db| async move { db.start_over(rows).await })
    }
}

/// The key's text and the last value written to an entry (`None`: deleted).
type LastWrite = (String, Option<Vec<u8>>);

/// A batch folded into one array per column, ready for `unnest`.
#[derive(Default)]
struct CommitRows {
    set_keys: Vec<Vec<u8>>,
    set_names: Vec<String>,
    set_key_texts: Vec<String>,
    set_values: Vec<Vec<u8>>,
    /// Each set value's text when PostgreSQL takes it as `jsonb` ([`json_text`]).
    set_jsons: Vec<Option<String>>,
    deleted_keys: Vec<Vec<u8>>,
    deleted_names: Vec<String>,
    counter_names: Vec<String>,
    counter_deltas: Vec<String>,
    stat_names: Vec<String>,
    stat_deltas: Vec<String>,
    position_topics: Vec<String>,
    position_partitions: Vec<i32>,
    position_nexts: Vec<i64>,
    done_topics: Vec<String>,
    done_partitions: Vec<i32>,
    done_records: Vec<i64>,
    outbox_through: Option<(i32, i64)>,
    outbox: Vec<Vec<u8>>,
    outbox_partitions: Vec<i32>,
}

impl CommitRows {
    /// Folds `commit`: one row per entry (the last write wins), deltas as
    /// decimal text (PostgreSQL has no 128-bit integer to bind).
    fn fold(commit: BatchCommit, location: &str) -> Result<Self, StateError> {
        let BatchCommit { writes, counter_deltas, stat_deltas, positions, outbox, done, outbox_through } = commit;
        // (key bytes, name) → (key text, last value written).
        let mut last: BTreeMap<(Vec<u8>, String), LastWrite> = BTreeMap::new();
        for (key, key_writes) in &writes {
            let text = key.to_string();
            for (name, value) in key_writes.iter() {
                last.insert((key.as_bytes().to_vec(), name.to_owned()), (text.clone(), value.map(<[u8]>::to_vec)));
            }
        }
        let mut rows = Self::default();
        for ((key, name), (text, value)) in last {
            match value {
                Some(value) => {
                    rows.set_keys.push(key);
                    rows.set_names.push(name);
                    rows.set_key_texts.push(text);
                    rows.set_jsons.push(json_text(&value));
                    rows.set_values.push(value);
                }
                None => {
                    rows.deleted_keys.push(key);
                    rows.deleted_names.push(name);
                }
            }
        }
        (rows.counter_names, rows.counter_deltas) =
            counter_deltas.into_iter().map(|(name, delta)| (name, delta.to_string())).unzip();
        (rows.stat_names, rows.stat_deltas) =
            stat_deltas.named().map(|(name, delta)| (name.to_owned(), delta.to_string())).unzip();
        for (topic, partition, next) in positions {
            rows.add_position(topic, partition, next, location)?;
        }
        for (topic, partition, record) in done {
            rows.done_topics.push(topic);
            rows.done_partitions.push(i32_of(partition));
            rows.done_records.push(i64_of(record, location)?);
        }
        rows.outbox_through = match outbox_through {
            Some((partition, seq)) => Some((i32_of(partition), i64_of(seq, location)?)),
            None => None,
        };
        rows.outbox = outbox.iter().map(|entry| encode_outbox(entry, location)).collect::<Result<_, _>>()?;
        rows.outbox_partitions = outbox.iter().map(|entry| i32_of(entry.source())).collect();
        Ok(rows)
    }

    /// The rows the commit writes or removes, over every table.
    fn count(&self) -> usize {
        self.set_keys.len()
            + self.deleted_keys.len()
            + self.counter_names.len()
            + self.stat_names.len()
            + self.position_topics.len()
            + self.done_topics.len()
            + usize::from(self.outbox_through.is_some())
            + self.outbox.len()
    }

    /// Adds a position row: `next` is the next offset of `partition`.
    fn add_position(&mut self, topic: String, partition: u32, next: u64, location: &str) -> Result<(), StateError> {
        self.position_topics.push(topic);
        self.position_partitions.push(i32_of(partition));
        self.position_nexts.push(i64_of(next, location)?);
        Ok(())
    }
}

/// The positions a commit writes of claimed partitions: each must be where
/// the store's last commit left it ([`CHECK_POSITIONS`]).
#[derive(Debug, Clone, Default)]
struct PositionChecks {
    topics: Vec<String>,
    partitions: Vec<i32>,
    /// Where the store left each (`None`: no position yet).
    expected: Vec<Option<i64>>,
    /// Where the commit moves each.
    next: Vec<i64>,
}

/// Every entry of the keys `$2` (sorted), in order of key and name, while
/// the names and values so far stay within `$3` bytes; then, if that cut
/// the list short, one row (key, NULL, NULL) naming the key it stopped in.
/// Keys from that one on are not loaded (the batch reads them one query at
/// a time); those before it are loaded whole, entries or none.
const FETCH_KEYS: &str = "WITH s AS ( \
         SELECT key, name, value, sum(octet_length(name) + octet_length(value)) OVER (ORDER BY key, name) AS upto \
         FROM waku_state WHERE projection = $1 AND key = ANY($2) \
     ) \
     SELECT key, name, value FROM s WHERE upto <= $3 \
     UNION ALL \
     (SELECT key, NULL, NULL FROM s WHERE upto > $3 ORDER BY key, name LIMIT 1)";

/// What [`Db::open_batch`] read: the partition's epoch in the snapshot and
/// the entries of the keys asked for.
struct OpenedBatch {
    epoch: Option<i64>,
    rows: HashMap<Vec<u8>, KeyEntries>,
    /// The key the byte bound stopped in.
    cut: Option<Vec<u8>>,
}

impl OpenedBatch {
    /// The entries of each of `keys` (sorted by their bytes, as asked) that
    /// was loaded whole: every key before the cut, with no entry if it has
    /// none.
    fn into_entries(mut self, keys: Vec<Key>) -> HashMap<Key, Arc<KeyEntries>> {
        keys.into_iter()
            .take_while(|key| self.cut.as_deref().is_none_or(|cut| key.as_bytes() < cut))
            .map(|key| {
                let entries = self.rows.remove(key.as_bytes()).unwrap_or_default();
                (key, Arc::new(entries))
            })
            .collect()
    }
}

/// What a query on the store's runtime works with: a pooled connection and
/// the names errors carry.
struct Db {
    projection: Arc<str>,
    location: Arc<str>,
    /// Shared with the batch workers when it is a snapshot's.
    client: Option<Arc<Object>>,
}

impl Db {
    fn client(&self) -> &tokio_postgres::Client {
        // Every `Db` a query sees was built with its connection.
        self.client.as_deref().map(|object| &***object).expect("a connection")
    }

    /// The connection with its cache of prepared statements.
    fn wrapper(&self) -> &deadpool_postgres::ClientWrapper {
        // Every `Db` a query sees was built with its connection.
        self.client.as_deref().map(|object| &**object).expect("a connection")
    }

    /// `sql` prepared on this connection, once per connection.
    async fn prepared(&self, sql: &str) -> Result<tokio_postgres::Statement, StateError> {
        self.wrapper().prepare_cached(sql).await.map_err(|e| self.error(e))
    }

    /// Begins a batch's snapshot and, in the same round trip, reads the
    /// epoch of `partition` (when `fenced`) and every entry of `keys`
    /// (sorted by their bytes) up to `bound` bytes of names and values.
    async fn open_batch(
        &self,
        partition: u32,
        fenced: bool,
        keys: Vec<Vec<u8>>,
        bound: i64,
    ) -> Result<OpenedBatch, StateError> {
        let epoch_sql = "SELECT epoch FROM waku_epochs WHERE projection = $1 AND partition = $2";
        let epoch_statement = match fenced {
            true => Some(self.prepared(epoch_sql).await?),
            false => None,
        };
        let fetch_statement = match keys.is_empty() {
            true => None,
            false => Some(self.prepared(FETCH_KEYS).await?),
        };
        let (p, client) = (&*self.projection, self.client());
        let partition = i32_of(partition);
        let begin = client.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1");
        let epoch = async {
            match &epoch_statement {
                Some(statement) => client.query(statement, &[&p, &partition]).await.map(Some),
                None => Ok(None),
            }
        };
        let fetch = async {
            match &fetch_statement {
                Some(statement) => client.query(statement, &[&p, &keys, &bound]).await,
                None => Ok(Vec::new()),
            }
        };
        let (begun, epoch, rows) = tokio::join!(begin, epoch, fetch);
        let answered = begun.and(epoch).and_then(|epoch| Ok((epoch, rows?)));
        let (epoch, rows) = match answered {
            Ok(answered) => answered,
            Err(error) => {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(self.error(error));
            }
        };
        let epoch = epoch.and_then(|rows| rows.first().map(|row| row.get::<_, i64>(0)));
        let mut opened = OpenedBatch { epoch, rows: HashMap::new(), cut: None };
        for row in rows {
            let key: Vec<u8> = row.get(0);
            match row.get::<_, Option<String>>(1) {
                Some(name) => {
                    opened.rows.entry(key).or_default().insert(name, row.get(2));
                }
                None => opened.cut = Some(key),
            }
        }
        Ok(opened)
    }

    fn error(&self, e: impl std::error::Error + Send + Sync + 'static) -> StateError {
        StateError::Storage { store: self.location.to_string(), source: Box::new(e) }
    }

    fn corrupt(&self, what: String) -> StateError {
        StateError::Corrupt { store: self.location.to_string(), what }
    }

    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StateError> {
        self.client().query(sql, params).await.map_err(|e| self.error(e))
    }

    async fn get(&self, key: &[u8], name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let rows = self
            .query(
                "SELECT value FROM waku_state WHERE projection = $1 AND key = $2 AND name = $3",
                &[&&*self.projection, &key, &name],
            )
            .await?;
        Ok(rows.first().map(|row| row.get(0)))
    }

    /// The count a `SELECT count(*) …` answers.
    async fn count(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<usize, StateError> {
        let rows = self.query(sql, params).await?;
        let count: i64 = rows.first().map_or(0, |row| row.get(0));
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// Every (name, value) of a table of numbers, by name.
    async fn numbers<N: FromStr>(&self, table: &'static str) -> Result<Vec<(String, N)>, StateError> {
        let sql = format!("SELECT name, value::text FROM {table} WHERE projection = $1 ORDER BY name");
        let rows = self.query(&sql, &[&&*self.projection]).await?;
        rows.iter()
            .map(|row| {
                let (name, value): (String, &str) = (row.get(0), row.get(1));
                let value = value.parse().map_err(|_| self.corrupt(format!("{table} `{name}` holds {value}")))?;
                Ok((name, value))
            })
            .collect()
    }

    /// The connection, owned: `run` hands each call its own.
    fn take(&mut self) -> Result<Object, StateError> {
        self.client.take().and_then(Arc::into_inner).ok_or_else(|| StateError::Storage {
            store: self.location.to_string(),
            source: "a shared connection cannot open a transaction".into(),
        })
    }

    /// A second handle on the same connection, for a snapshot's queries.
    fn share(&self) -> Self {
        Self { projection: self.projection.clone(), location: self.location.clone(), client: self.client.clone() }
    }

    /// The projections the database holds, creating nothing: none when it
    /// holds no waku schema; an error when its schema is one this build
    /// would have to migrate (reading it as it is could misread it).
    async fn projections(mut self) -> Result<Vec<String>, StateError> {
        let client = self.take()?;
        let row =
            client.query_one("SELECT to_regclass('waku_schema') IS NOT NULL", &[]).await.map_err(|e| self.error(e))?;
        if !row.get::<_, bool>(0) {
            return Ok(Vec::new());
        }
        let row = client
            .query_one("SELECT coalesce(max(version), 0) FROM waku_schema", &[])
            .await
            .map_err(|e| self.error(e))?;
        let (found, known): (i32, i32) = (row.get(0), MIGRATIONS.len() as i32);
        if found > known {
            return Err(StateError::SchemaTooNew { store: self.location.to_string(), found, known });
        }
        if found < known {
            return Err(self.error(OlderSchema { found, known }));
        }
        let rows = client
            .query(
                "SELECT projection FROM waku_positions UNION SELECT projection FROM waku_epochs \
                 UNION SELECT projection FROM waku_meta ORDER BY 1",
                &[],
            )
            .await
            .map_err(|e| self.error(e))?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    /// Creates or migrates the schema and the projection's view.
    async fn migrate(mut self) -> Result<(), StateError> {
        let mut client = self.take()?;
        // Names are any UTF-8 a module chooses: a database that converts
        // text to another encoding would refuse some at commit, every
        // time, and wedge the partition. SQL_ASCII converts nothing.
        let row =
            client.query_one("SELECT current_setting('server_encoding')", &[]).await.map_err(|e| self.error(e))?;
        let encoding: String = row.get(0);
        if encoding != "UTF8" && encoding != "SQL_ASCII" {
            return Err(self.error(NotUtf8 { encoding }));
        }
        let txn = client.transaction().await.map_err(|e| self.error(e))?;
        txn.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await.map_err(|e| self.error(e))?;
        txn.batch_execute("CREATE TABLE IF NOT EXISTS waku_schema (version integer PRIMARY KEY)")
            .await
            .map_err(|e| self.error(e))?;
        let row =
            txn.query_one("SELECT coalesce(max(version), 0) FROM waku_schema", &[]).await.map_err(|e| self.error(e))?;
        let found: i32 = row.get(0);
        let known = MIGRATIONS.len() as i32;
        if found > known {
            return Err(StateError::SchemaTooNew { store: self.location.to_string(), found, known });
        }
        for (version, migration) in MIGRATIONS.iter().enumerate().skip(found as usize) {
            txn.batch_execute(migration).await.map_err(|e| self.error(e))?;
            txn.execute("INSERT INTO waku_schema (version) VALUES ($1)", &[&(version as i32 + 1)])
                .await
                .map_err(|e| self.error(e))?;
            if version == 1 {
                // Version 2 gives each outbox row its partition, which only
                // the entry's bytes tell.
                let rows = txn
                    .query("SELECT projection, seq, entry FROM waku_outbox", &[])
                    .await
                    .map_err(|e| self.error(e))?;
                for row in rows {
                    let (projection, seq, entry): (&str, i64, &[u8]) = (row.get(0), row.get(1), row.get(2));
                    let source = decode_outbox(seq.unsigned_abs(), entry).map_or(0, |entry| entry.source());
                    txn.execute(
                        "UPDATE waku_outbox SET partition = $3 WHERE projection = $1 AND seq = $2",
                        &[&projection, &seq, &i32_of(source)],
                    )
                    .await
                    .map_err(|e| self.error(e))?;
                }
                txn.batch_execute("ALTER TABLE waku_outbox ALTER COLUMN partition SET NOT NULL")
                    .await
                    .map_err(|e| self.error(e))?;
            }
        }
        // The projection's name is checked (letters, digits, `.`, `_`, `-`),
        // so it quotes safely as an identifier and as a literal.
        let (projection, view) = (&self.projection, view_name(&self.projection));
        txn.batch_execute(&format!(
            "CREATE OR REPLACE VIEW \"{view}\" AS \
             SELECT key_text AS key, name, json, value FROM waku_state WHERE projection = '{projection}'"
        ))
        .await
        .map_err(|e| self.error(e))?;
        txn.commit().await.map_err(|e| self.error(e))
    }

    /// Every (topic, partition, offset) row of `table`, its offset in
    /// `column`, in order.
    async fn marks(&self, table: &'static str, column: &'static str) -> Result<Vec<(String, u32, u64)>, StateError> {
        let sql = format!(
            "SELECT topic, partition, {column} FROM {table} WHERE projection = $1 ORDER BY topic, partition, {column}"
        );
        let rows = self.query(&sql, &[&&*self.projection]).await?;
        Ok(rows
            .iter()
            .map(|row| (row.get(0), row.get::<_, i32>(1) as u32, row.get::<_, i64>(2).unsigned_abs()))
            .collect())
    }

    /// Clears the projection's state, counters, statistics, done marks,
    /// outbox and positions, and stores the positions of `rows`, in one
    /// transaction.
    async fn start_over(mut self, rows: CommitRows) -> Result<(), StateError> {
        let mut client = self.take()?;
        let txn = client.transaction().await.map_err(|e| self.error(e))?;
        let p = &*self.projection;
        for table in ["waku_state", "waku_counters", "waku_stats", "waku_done", "waku_outbox", "waku_positions"] {
            txn.execute(&format!("DELETE FROM {table} WHERE projection = $1"), &[&p])
                .await
                .map_err(|e| self.error(e))?;
        }
        txn.execute(
            "INSERT INTO waku_positions (projection, topic, partition, next) \
             SELECT $1, * FROM unnest($2::text[], $3::integer[], $4::bigint[])",
            &[&p, &rows.position_topics, &rows.position_partitions, &rows.position_nexts],
        )
        .await
        .map_err(|e| self.error(e))?;
        txn.commit().await.map_err(|e| self.error(e))
    }

    /// Applies one batch in one transaction, after checking the epochs of
    /// the claimed partitions it touches: `BEGIN`, the check, one statement
    /// per table and `COMMIT` leave together and are answered together,
    /// one round trip whatever the batch holds (and one more per statement
    /// the first time a connection prepares it). A check that finds a newer
    /// epoch fails its statement, so the server rolls everything after it
    /// back and the `COMMIT` commits nothing. Then (in the same flight) a
    /// check that each position of `checks` is where the store left it,
    /// which fails the same way when the database lost commits
    /// ([`StateError::PositionMoved`]). `begin` opens the transaction
    /// (`BEGIN`, and the opted-in `synchronous_commit`); unless `prepared`,
    /// each statement goes as its text, unnamed, with the parameter types
    /// its prepared form reports (the same single flight, parsed anew).
    async fn commit(
        self,
        (begin, prepared): (&str, bool),
        held: Vec<(u32, i64)>,
        checks: &PositionChecks,
        rows: CommitRows,
    ) -> Result<(), StateError> {
        let r = &rows;
        let p = &*self.projection;
        let fence_partitions: Vec<i32> = held.iter().map(|&(partition, _)| i32_of(partition)).collect();
        let fence_epochs: Vec<i64> = held.iter().map(|&(_, epoch)| epoch).collect();
        let fence_count = held.len() as i64;
        let check_count = checks.topics.len() as i64;
        let outbox_count = r.outbox.len() as i64;
        let wanted = wanted_statements(&held, checks, r);
        let mut statements = Vec::with_capacity(wanted.len());
        for sql in &wanted {
            statements.push(self.prepared(sql).await?);
        }
        let client = self.client();
        let mut flight: Vec<Pending<'_>> = vec![Box::pin(client.batch_execute(begin))];
        for (sql, statement) in wanted.iter().zip(&statements) {
            let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = match *sql {
                FENCE => vec![&p, &fence_partitions, &fence_epochs, &fence_count],
                CHECK_POSITIONS => vec![&p, &checks.topics, &checks.partitions, &checks.expected, &check_count],
                SET_ENTRIES => vec![&p, &r.set_keys, &r.set_names, &r.set_key_texts, &r.set_values, &r.set_jsons],
                DELETE_ENTRIES => vec![&p, &r.deleted_keys, &r.deleted_names],
                ADD_COUNTERS => vec![&p, &r.counter_names, &r.counter_deltas],
                ADD_STATS => vec![&p, &r.stat_names, &r.stat_deltas],
                ADD_DONE => vec![&p, &r.done_topics, &r.done_partitions, &r.done_records],
                SET_POSITIONS | DROP_DONE_BELOW => {
                    vec![&p, &r.position_topics, &r.position_partitions, &r.position_nexts]
                }
                SETTLE_OUTBOX => match &r.outbox_through {
                    Some((partition, through)) => vec![&p, partition, through],
                    None => continue,
                },
                _ => vec![&p, &outbox_count, &r.outbox, &r.outbox_partitions],
            };
            flight.push(Box::pin(async move {
                if prepared {
                    return client.execute(statement, &params).await.map(drop);
                }
                let typed: Vec<_> =
                    params.iter().zip(statement.params()).map(|(value, ty)| (*value, ty.clone())).collect();
                client.query_typed(sql, &typed).await.map(drop)
            }));
        }
        flight.push(Box::pin(client.batch_execute("COMMIT")));
        let answers = all_at_once(flight).await;
        // Which check failed, if one did: its answer (after `BEGIN`'s) is
        // a division by zero.
        let failed = |sql: &str| {
            wanted.iter().position(|wanted| *wanted == sql).is_some_and(|at| {
                answers[at + 1].as_ref().err().and_then(tokio_postgres::Error::code)
                    == Some(&tokio_postgres::error::SqlState::DIVISION_BY_ZERO)
            })
        };
        let (fenced, moved) = (failed(FENCE), failed(CHECK_POSITIONS));
        if let Some(error) = answers.into_iter().find_map(Result::err) {
            // `COMMIT` after a failed statement rolls back; this makes sure
            // the connection goes back to the pool outside a transaction.
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(match (fenced, moved) {
                (true, _) => self.fenced(held).await,
                (false, true) => self.moved(checks).await,
                (false, false) => self.error(error),
            });
        }
        Ok(())
    }

    /// The error for a commit whose position check failed: the first of
    /// `checks` not where the store left it.
    async fn moved(&self, checks: &PositionChecks) -> StateError {
        let rows = match self
            .query(
                "SELECT topic, partition, next FROM waku_positions WHERE projection = $1 AND partition = ANY($2)",
                &[&&*self.projection, &checks.partitions],
            )
            .await
        {
            Ok(rows) => rows,
            Err(error) => return error,
        };
        let now: HashMap<(String, i32), i64> = rows.iter().map(|row| ((row.get(0), row.get(1)), row.get(2))).collect();
        let mut checked = checks.topics.iter().zip(&checks.partitions).zip(&checks.expected);
        checked
            .find_map(|((topic, &partition), &expected)| {
                let found = now.get(&(topic.clone(), partition)).copied();
                (found != expected).then(|| StateError::PositionMoved {
                    partition: partition.unsigned_abs(),
                    topic: topic.clone(),
                    expected: expected.map(i64::unsigned_abs),
                    found: found.map(i64::unsigned_abs),
                })
            })
            .unwrap_or_else(|| self.error(NoMovedPosition))
    }

    /// Every position of `partition`, by topic.
    async fn positions_of(&self, partition: u32) -> Result<HashMap<String, i64>, StateError> {
        let rows = self
            .query(
                "SELECT topic, next FROM waku_positions WHERE projection = $1 AND partition = $2",
                &[&&*self.projection, &i32_of(partition)],
            )
            .await?;
        Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
    }

    /// The error for a commit whose fence check failed: the first of the
    /// `held` partitions another store claimed since.
    async fn fenced(&self, held: Vec<(u32, i64)>) -> StateError {
        let partitions: Vec<i32> = held.iter().map(|&(partition, _)| i32_of(partition)).collect();
        let current: HashMap<i32, i64> = match self
            .query(
                "SELECT partition, epoch FROM waku_epochs WHERE projection = $1 AND partition = ANY($2)",
                &[&&*self.projection, &partitions],
            )
            .await
        {
            Ok(rows) => rows.iter().map(|row| (row.get(0), row.get(1))).collect(),
            Err(error) => return error,
        };
        held.into_iter()
            .find_map(|(partition, epoch)| {
                let now = current.get(&i32_of(partition)).copied().unwrap_or(0);
                (now != epoch).then(|| StateError::Fenced {
                    partition,
                    held: epoch.unsigned_abs(),
                    current: now.unsigned_abs(),
                })
            })
            .unwrap_or_else(|| self.error(NoFencedPartition))
    }
}

/// The statements a commit of `rows` runs, in their order: those with
/// nothing to do are left out.
fn wanted_statements(held: &[(u32, i64)], checks: &PositionChecks, r: &CommitRows) -> Vec<&'static str> {
    let mut wanted: Vec<&str> = Vec::new();
    let mut add = |needed: bool, sql: &'static str| {
        if needed {
            wanted.push(sql);
        }
    };
    add(!held.is_empty(), FENCE);
    add(!checks.topics.is_empty(), CHECK_POSITIONS);
    add(!r.set_keys.is_empty(), SET_ENTRIES);
    add(!r.deleted_keys.is_empty(), DELETE_ENTRIES);
    add(!r.counter_names.is_empty(), ADD_COUNTERS);
    add(!r.stat_names.is_empty(), ADD_STATS);
    add(!r.done_topics.is_empty(), ADD_DONE);
    add(!r.position_topics.is_empty(), SET_POSITIONS);
    add(!r.position_topics.is_empty(), DROP_DONE_BELOW);
    add(r.outbox_through.is_some(), SETTLE_OUTBOX);
    add(!r.outbox.is_empty(), ADD_OUTBOX);
    wanted
}

/// A fence check failed, yet every claimed partition holds its epoch.
#[derive(Debug, thiserror::Error)]
#[error("the commit's fence check failed, yet no partition it touches was claimed since")]
struct NoFencedPartition;

/// A position check failed, yet every position is where the store left it.
#[derive(Debug, thiserror::Error)]
#[error("the commit's position check failed, yet every position it checks is where this store left it")]
struct NoMovedPosition;

/// A statement on its way, in a flight of them ([`all_at_once`]).
type Pending<'a> = std::pin::Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send + 'a>>;

/// Polls every future of `flight` at once, so that the queries leave in
/// one flight, in order (tokio-postgres sends a query when its future is
/// first polled), and waits for all the answers, in order.
async fn all_at_once<T>(flight: Vec<std::pin::Pin<Box<dyn Future<Output = T> + Send + '_>>>) -> Vec<T> {
    let mut flight: Vec<_> = flight.into_iter().map(Some).collect();
    let mut answers: Vec<Option<T>> = flight.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (slot, answer) in flight.iter_mut().zip(answers.iter_mut()) {
            if let Some(future) = slot {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => {
                        *answer = Some(value);
                        *slot = None;
                    }
                    std::task::Poll::Pending => waiting = true,
                }
            }
        }
        match waiting {
            true => std::task::Poll::Pending,
            false => std::task::Poll::Ready(()),
        }
    })
    .await;
    answers.into_iter().flatten().collect()
}

/// Fails (a division by zero) unless every claimed partition `$2` holds
/// the epoch `$3` claimed it at (`$4` of them), and locks their rows so a
/// claim waits for the commit.
const FENCE: &str = "SELECT 1 / (CASE WHEN count(*) = $4 THEN 1 ELSE 0 END) FROM ( \
         SELECT 1 FROM waku_epochs e JOIN unnest($2::integer[], $3::bigint[]) AS h(partition, epoch) \
         ON e.partition = h.partition AND e.epoch = h.epoch WHERE e.projection = $1 FOR SHARE OF e \
     ) AS held";

/// Fails (a division by zero) unless each position (`$2` topic, `$3`
/// partition) is at `$4` (`NULL`: none), `$5` of them: where the store's
/// last commit left them.
const CHECK_POSITIONS: &str = "SELECT 1 / (CASE WHEN count(*) = $5 THEN 1 ELSE 0 END) \
     FROM unnest($2::text[], $3::integer[], $4::bigint[]) AS c(topic, partition, next) \
     LEFT JOIN waku_positions p ON p.projection = $1 AND p.topic = c.topic AND p.partition = c.partition \
     WHERE p.next IS NOT DISTINCT FROM c.next";

const SET_ENTRIES: &str = "INSERT INTO waku_state (projection, key, name, key_text, value, json) \
     SELECT $1, k, n, t, v, j::jsonb FROM unnest($2::bytea[], $3::text[], $4::text[], $5::bytea[], $6::text[]) \
         AS u(k, n, t, v, j) \
     ON CONFLICT (projection, key, name) DO UPDATE SET value = excluded.value, json = excluded.json";

const DELETE_ENTRIES: &str = "DELETE FROM waku_state s USING unnest($2::bytea[], $3::text[]) AS d(key, name) \
     WHERE s.projection = $1 AND s.key = d.key AND s.name = d.name";

const ADD_COUNTERS: &str = "INSERT INTO waku_counters (projection, name, value) \
     SELECT $1, n, d::numeric FROM unnest($2::text[], $3::text[]) AS u(n, d) \
     ON CONFLICT (projection, name) DO UPDATE SET value = waku_counters.value + excluded.value";

const ADD_STATS: &str = "INSERT INTO waku_stats (projection, name, value) \
     SELECT $1, n, least(d::numeric, 18446744073709551615) FROM unnest($2::text[], $3::text[]) AS u(n, d) \
     ON CONFLICT (projection, name) \
     DO UPDATE SET value = least(waku_stats.value + excluded.value, 18446744073709551615)";

const ADD_DONE: &str = "INSERT INTO waku_done (projection, topic, partition, record) \
     SELECT $1, * FROM unnest($2::text[], $3::integer[], $4::bigint[]) ON CONFLICT DO NOTHING";

/// Positions, then (the next statement) the done marks below them go.
const SET_POSITIONS: &str = "INSERT INTO waku_positions (projection, topic, partition, next) \
     SELECT $1, * FROM unnest($2::text[], $3::integer[], $4::bigint[]) \
     ON CONFLICT (projection, topic, partition) DO UPDATE SET next = excluded.next";

const DROP_DONE_BELOW: &str = "DELETE FROM waku_done d \
     USING unnest($2::text[], $3::integer[], $4::bigint[]) AS p(topic, partition, next) \
     WHERE d.projection = $1 AND d.topic = p.topic AND d.partition = p.partition AND d.record < p.next";

const SETTLE_OUTBOX: &str = "DELETE FROM waku_outbox WHERE projection = $1 AND partition = $2 AND seq <= $3";

/// Takes `$2` sequence numbers and adds the entries under them, in order.
const ADD_OUTBOX: &str = "WITH n AS ( \
         INSERT INTO waku_outbox_next (projection, next) VALUES ($1, $2) \
         ON CONFLICT (projection) DO UPDATE SET next = waku_outbox_next.next + excluded.next RETURNING next \
     ) \
     INSERT INTO waku_outbox (projection, seq, entry, partition) \
     SELECT $1, n.next - $2 + u.ord - 1, u.entry, u.partition \
     FROM n, unnest($3::bytea[], $4::integer[]) WITH ORDINALITY AS u(entry, partition, ord)";

/// `value` as the text of a `jsonb` when PostgreSQL surely takes it as one:
/// UTF-8 JSON (serde_json's reading, nested at most 128 deep) with no
/// `\u0000` (which `jsonb` refuses) and no number of more than
/// [`JSON_NUMBER_MAX`] characters or with an exponent past it (`numeric`'s
/// range is smaller than JSON's). Stricter than PostgreSQL where they
/// differ (a number past `f64`, deeper nesting): such a value is kept as
/// bytes with no `json`, never a commit refused.
fn json_text(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?;
    serde_json::from_str::<serde_json::Value>(text).ok()?;
    json_numbers_fit(text).then(|| text.to_owned())
}

/// The most characters a JSON number, or the exponent of one, may have for
/// [`json_text`] (`numeric` takes 131 072 digits before the point, 16 383
/// after).
const JSON_NUMBER_MAX: usize = 1000;

/// Whether `text` (valid JSON) has no `\u0000` and every number fits
/// [`JSON_NUMBER_MAX`].
fn json_numbers_fit(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'"' => {
                at += 1;
                while at < bytes.len() && bytes[at] != b'"' {
                    if bytes[at] == b'\\' {
                        if bytes[at + 1..].starts_with(b"u0000") {
                            return false;
                        }
                        at += 1;
                    }
                    at += 1;
                }
                at += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = at;
                while at < bytes.len() && matches!(bytes[at], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                    at += 1;
                }
                let number = &text[start..at];
                let exponent = number.find(['e', 'E']).map_or("0", |e| &number[e + 1..]);
                let exponent: i64 = exponent.parse().unwrap_or(i64::MAX);
                if number.len() > JSON_NUMBER_MAX || exponent.unsigned_abs() > JSON_NUMBER_MAX as u64 {
                    return false;
                }
            }
            _ => at += 1,
        }
    }
    true
}

/// The longest identifier PostgreSQL keeps whole (it cuts longer ones).
const MAX_IDENTIFIER: usize = 63;

/// The name of `projection`'s read-model view: `waku_state_<projection>`,
/// or, when that is longer than PostgreSQL keeps (which would cut it, and
/// two long projection names would share one view), its first bytes, `_`
/// and 16 hex digits of the SHA-256 of the projection's name.
fn view_name(projection: &str) -> String {
    use sha2::Digest;
    let full = format!("waku_state_{projection}");
    if full.len() <= MAX_IDENTIFIER {
        return full;
    }
    let digest = sha2::Sha256::digest(projection.as_bytes());
    let hash: String = digest[..8].iter().map(|byte| format!("{byte:02x}")).collect();
    // Projection names are ASCII (checked at connect), so any cut is a
    // character boundary.
    format!("{}_{hash}", &full[..MAX_IDENTIFIER - 1 - hash.len()])
}

/// A database whose text is not UTF-8.
#[derive(Debug, thiserror::Error)]
#[error(
    "the database stores text as {encoding}, and the state needs UTF8: use a database created with ENCODING 'UTF8'"
)]
struct NotUtf8 {
    encoding: String,
}

/// A read-only command found a schema `waku run` has not migrated yet.
#[derive(Debug, thiserror::Error)]
#[error("the database holds schema version {found} and this build reads {known}: `waku run` migrates it")]
struct OlderSchema {
    found: i32,
    known: i32,
}

/// A reader's transaction, rolled back when it is dropped.
struct PostgresSnapshot {
    db: Db,
    bridge: tokio::runtime::Handle,
}

impl Snapshot for PostgresSnapshot {
    fn get(&self, key: &Key, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        let (db, key, name) = (self.db.share(), key.as_bytes().to_vec(), name.to_owned());
        wait(&self.db.location, &self.bridge, async move { db.get(&key, &name).await })
    }

    fn contains(&self, key: &Key, name: &str) -> Result<bool, StateError> {
        let (db, key, name) = (self.db.share(), key.as_bytes().to_vec(), name.to_owned());
        wait(&self.db.location, &self.bridge, async move {
            let rows = db
                .query(
                    "SELECT 1 FROM waku_state WHERE projection = $1 AND key = $2 AND name = $3",
                    &[&&*db.projection, &key, &name],
                )
                .await?;
            Ok(!rows.is_empty())
        })
    }

    fn entry_count(&self, key: &Key, at_most: usize) -> Result<usize, StateError> {
        let (db, key) = (self.db.share(), key.as_bytes().to_vec());
        let at_most = i64::try_from(at_most).unwrap_or(i64::MAX);
        wait(&self.db.location, &self.bridge, async move {
            db.count(
                "SELECT count(*) FROM (SELECT 1 FROM waku_state WHERE projection = $1 AND key = $2 LIMIT $3) AS s",
                &[&&*db.projection, &key, &at_most],
            )
            .await
        })
    }

    fn counter(&self, name: &str) -> Result<Option<i128>, StateError> {
        let (db, name) = (self.db.share(), name.to_owned());
        wait(&self.db.location, &self.bridge, async move {
            let rows = db
                .query(
                    "SELECT value::text FROM waku_counters WHERE projection = $1 AND name = $2",
                    &[&&*db.projection, &name],
                )
                .await?;
            let Some(row) = rows.first() else { return Ok(None) };
            let value: &str = row.get(0);
            value.parse().map(Some).map_err(|_| db.corrupt(format!("counter `{name}` holds {value}")))
        })
    }

    /// PostgreSQL keeps no row counts: this counts the index, stopping at
    /// `at_most` (the quota), so it costs at most that many rows.
    fn counter_count(&self, at_most: usize) -> Result<usize, StateError> {
        let db = self.db.share();
        let at_most = i64::try_from(at_most).unwrap_or(i64::MAX);
        wait(&self.db.location, &self.bridge, async move {
            db.count(
                "SELECT count(*) FROM (SELECT 1 FROM waku_counters WHERE projection = $1 LIMIT $2) AS s",
                &[&&*db.projection, &at_most],
            )
            .await
        })
    }
}

impl Drop for PostgresSnapshot {
    fn drop(&mut self) {
        if let Some(client) = self.db.client.take() {
            // The connection goes back to the pool once this ends.
            self.bridge.spawn(async move {
                let _ = client.batch_execute("ROLLBACK").await;
            });
        }
    }
}

/// The runtime that drives the connections of one store.
struct Bridge {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Bridge {
    fn new() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("waku-postgres")
            .enable_all()
            .build()?;
        Ok(Self { runtime: Some(runtime) })
    }

    fn handle(&self) -> tokio::runtime::Handle {
        // Only `drop` takes the runtime.
        self.runtime.as_ref().map(|runtime| runtime.handle().clone()).expect("a runtime")
    }

    fn run<T: Send + 'static>(
        &self,
        location: &str,
        work: impl Future<Output = Result<T, StateError>> + Send + 'static,
    ) -> Result<T, StateError> {
        wait(location, &self.handle(), work)
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // A runtime dropped on an async thread would panic; this does not.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Spawns `work` on `runtime` and blocks this thread until it answers.
fn wait<T: Send + 'static>(
    location: &str,
    runtime: &tokio::runtime::Handle,
    work: impl Future<Output = Result<T, StateError>> + Send + 'static,
) -> Result<T, StateError> {
    let (answer, answered) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = answer.send(work.await);
    });
    answered.recv().unwrap_or_else(|_| {
        Err(StateError::Storage {
            store: location.to_owned(),
            source: "the database task ended without an answer".into(),
        })
    })
}

/// `error`, as [`StateError::Tls`] when a TLS handshake was refused or the
/// server asked for a client certificate it did not get or did not take
/// (`roots`: where the trusted CAs came from; `client_cert`: `sslcert`).
fn tls_refusal(error: StateError, roots: &str, client_cert: Option<&std::path::Path>) -> StateError {
    let StateError::Storage { store, source } = &error else { return error };
    let chain = || std::iter::successors(Some(source.as_ref() as &(dyn std::error::Error + 'static)), |e| e.source());
    let refused = crate::platform::tls::refusal(source.as_ref(), "the PostgreSQL server", roots)
        .or_else(|| {
            // tokio-postgres's own words when `require` meets a server without TLS.
            chain().map(ToString::to_string).any(|text| text.contains("server does not support TLS")).then(|| {
                "the PostgreSQL server does not offer TLS, and the URL's sslmode asks for it: turn `ssl = on` at the \
                 server, or set sslmode=prefer or disable"
                    .to_owned()
            })
        })
        .or_else(|| {
            let db = chain().find_map(|e| e.downcast_ref::<tokio_postgres::Error>()?.as_db_error())?;
            let about_certificate = db.code() == &tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                && db.message().contains("certificate");
            about_certificate.then(|| client_certificate_refused(db.message(), client_cert))
        });
    match refused {
        Some(reason) => StateError::Tls { store: store.clone(), reason },
        None => error,
    }
}

/// What to do when the server's pg_hba asks for a client certificate
/// (`cert` or `clientcert=`) and refused the login (`said`: its words).
fn client_certificate_refused(said: &str, client_cert: Option<&std::path::Path>) -> String {
    match client_cert {
        None => format!(
            "the PostgreSQL server asks for a client certificate (it said: {said}): add \
             sslcert=<certificate file>&sslkey=<key file> to the URL, a certificate signed by a CA in the server's \
             ssl_ca_file whose CN is the URL's user"
        ),
        Some(cert) => format!(
            "the PostgreSQL server refused the client certificate sslcert={} (it said: {said}): its CN must be the \
             URL's user, and a CA in the server's ssl_ca_file must have signed it",
            cert.display()
        ),
    }
}

/// `postgres host:port/db projection `p``, without the password.
fn describe(config: &tokio_postgres::Config, projection: &str) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().or(config.get_user()).unwrap_or("postgres");
    format!("postgres `{host}:{port}/{db}` projection `{projection}`")
}

/// A partition as PostgreSQL's `integer` (partitions are far below 2^31;
/// a larger one would wrap, so it is mapped to the same bits).
fn i32_of(partition: u32) -> i32 {
    partition as i32
}

fn i64_of(n: u64, location: &str) -> Result<i64, StateError> {
    i64::try_from(n).map_err(|_| StateError::Storage {
        store: location.to_owned(),
        source: format!("{n} is past PostgreSQL's bigint").into(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Once;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::storage::state::suite::{Fixture, state_suite};
    use crate::storage::state::{KeyWrites, StateStore};

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
        if tls.mode == super::super::postgres_tls::SslMode::VerifyFull && tls.root_cert.is_some() && by_localhost {
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
        config.tls.root_cert = Some(super::super::postgres_tls::RootCert::File(other.ca.clone()));
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
        config.tls.root_cert = Some(super::super::postgres_tls::RootCert::File(other.ca.clone()));
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
            assert!(waited.elapsed() < super::super::hold::HOLD_LEASE / 2, "B's session ended with it");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(a.claim_released(4).unwrap().is_some());
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
        std::thread::sleep(super::super::hold::HOLD_LEASE + Duration::from_secs(1));
        assert_eq!(b.claim_released(3).unwrap(), None, "a holder that answers keeps its hold");
        a.holds.fall_silent();
        let deadline = std::time::Instant::now() + super::super::hold::HOLD_LEASE * 3;
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
                let sql =
                    "SELECT name, json->>'balance', json IS NULL FROM waku_state_bank WHERE key = '42' ORDER BY name";
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
            let rows = client
                .query("SELECT setting FROM seen_sync WHERE partition = $1", &[&i32_of(partition)])
                .await
                .unwrap();
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
            Err(super::super::postgres_tls::SettingError::Invalid { option: "synchronous_commit", .. })
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
        database.execute(&format!(
            "CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
        ));
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
}
