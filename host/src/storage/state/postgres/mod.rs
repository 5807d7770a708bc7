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
//! [`tls`], default `prefer` as libpq's) or Unix sockets.
//! A refused handshake fails the connect at start-up with
//! [`StateError::Tls`], which says why (an unknown CA, a certificate for
//! other names, a server without TLS).
//!
//! ## Layout, one concern per file
//!
//! - this file: the rules above, and the names other crates use
//!   ([`PostgresStore`], [`Written`], [`MIGRATIONS`], [`tls`]);
//! - `store`: [`PostgresStore`] and its [`StateBackend`] impl, each call a
//!   short list of steps in the files below;
//! - `tls`: the connection string, its TLS options and the rustls connector;
//! - `connect`: the pool made from them, the store's name, and a refused
//!   handshake in plain words;
//! - `bridge`: the runtime that drives the connections, and how a blocking
//!   call waits for it;
//! - `db`: a connection as a query sees it, and errors naming the store;
//! - `schema`: the migrations, the schema check of a read-only command,
//!   the projection's view;
//! - `claims`: claims and epochs, the positions a commit must find, the
//!   fence and position checks and their errors, the run lock;
//! - `commit`: a batch folded into arrays, its statements in one flight,
//!   and starting a projection over;
//! - `json`: which values are sent as `jsonb` text;
//! - `outbox`: the outbox's statements and reads;
//! - `reads`: snapshots, and a batch's snapshot opened with its keys;
//! - `inspect`: what tools read (keys, entries, pages, counters,
//!   statistics, positions, done marks) and the host's meta values;
//! - `server_tests`: the store against a server (`WAKU_POSTGRES_URL`).
//!
//! [`StateError::SchemaTooNew`]: super::StateError::SchemaTooNew
//! [`OutboxEntry::source`]: super::OutboxEntry::source
//! [`StateBackend::claim`]: super::StateBackend::claim
//! [`StateError::Fenced`]: super::StateError::Fenced
//! [`StateError::PositionMoved`]: super::StateError::PositionMoved
//! [`StateBackend::release`]: super::StateBackend::release
//! [`StateBackend::claim_released`]: super::StateBackend::claim_released
//! [`StateBackend`]: super::StateBackend
//! [`StateBackend::reader`]: super::StateBackend::reader
//! [`StateBackend::batch_reader`]: super::StateBackend::batch_reader
//! [`StateError::Tls`]: super::StateError::Tls

mod bridge;
mod claims;
mod commit;
mod connect;
mod db;
mod inspect;
mod json;
mod outbox;
mod reads;
mod schema;
#[cfg(test)]
mod server_tests;
mod store;
pub mod tls;

pub use schema::MIGRATIONS;
pub use store::{PostgresStore, Written};
