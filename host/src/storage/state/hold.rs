//! Holding a partition in PostgreSQL: which host consumes it now, as the
//! database sees it, so that a partition that moves redoes nothing.
//!
//! Fencing ([`super::postgres`]) refuses a stale owner's commit; a hold
//! keeps the new owner from starting before the old one is done, so the
//! batch in flight commits instead of being refused and done again. Rules
//! kept here:
//!
//! - **A hold is a session advisory lock**, one per schema, projection and
//!   partition (the one-key `bigint` form, a key space apart from the run
//!   lock's two keys), on a connection of its own that the store keeps out
//!   of its pool. PostgreSQL frees it when the holder lets go
//!   ([`Holds::unhold`], after the partition's last commit) or when the
//!   holder's session ends: a process that dies closes its connection, and
//!   the server frees its holds at once.
//! - **A holder that stops answering loses its holds.** The session asks the
//!   server to end it once idle for [`HOLD_LEASE`] (`idle_session_timeout`)
//!   and a keeper task pings it every [`HOLD_PING`]: a paused or cut-off
//!   host stops pinging, PostgreSQL ends its session, and its holds are
//!   free. What decides is the server's view of the holder's session, not a
//!   timer of the host that waits; and a holder that wakes up finds its
//!   commits fenced.
//! - **A held partition is waited for, never taken by a timer.** Taking one
//!   ([`super::StateBackend::claim_released`]) tries the lock and answers at
//!   once; the caller asks again until the holder lets go.
//! - **Losing the session loses every hold**: the next try opens a new
//!   session and holds nothing until it takes again.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::{Object, Pool};

use super::StateError;

/// How long the hold session may stay silent before PostgreSQL ends it and
/// frees its holds: how long a paused host keeps its partitions from the
/// others (a host that dies frees them at once).
pub const HOLD_LEASE: Duration = Duration::from_secs(5);

/// How often the keeper pings the hold session: well inside the lease.
pub const HOLD_PING: Duration = Duration::from_secs(1);

/// The lock key of a hold: the schema and projection's `hashtext` in the
/// high 32 bits, the partition in the low ones.
const HOLD_KEY: &str = "(hashtext(current_schema() || '/' || $1)::bigint << 32) | $2::bigint";

/// The partitions a store holds and the session holding them.
#[derive(Default)]
pub(super) struct Holds {
    session: tokio::sync::Mutex<Option<Session>>,
    /// Set by tests to stand for a host that stopped answering: the keeper
    /// pings no more.
    silent: Arc<AtomicBool>,
}

struct Session {
    client: Arc<deadpool_postgres::ClientWrapper>,
    held: HashSet<u32>,
    /// Cleared by the keeper when a ping fails: the server ended it.
    alive: Arc<AtomicBool>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

impl Holds {
    /// Takes the hold on `partition` if no other session has it; `true` if
    /// this store holds it now (already, or taken).
    pub(super) async fn try_hold(
        &self,
        pool: &Pool,
        projection: &str,
        partition: u32,
        location: &str,
    ) -> Result<bool, StateError> {
        let failed = |e: Box<dyn std::error::Error + Send + Sync>| StateError::Storage {
            store: location.to_owned(),
            source: format!("holding partition {partition}: {e}").into(),
        };
        let mut session = self.session.lock().await;
        if session.as_ref().is_some_and(|s| !s.alive.load(Ordering::Relaxed) || s.client.is_closed()) {
            tracing::warn!(store = location, "the session holding this host's partitions ended; they are held no more");
            *session = None;
        }
        if session.is_none() {
            *session = Some(open(pool, self.silent.clone()).await.map_err(failed)?);
        }
        let open = session.as_mut().expect("opened above");
        if open.held.contains(&partition) {
            return Ok(true);
        }
        let sql = format!("SELECT pg_try_advisory_lock({HOLD_KEY})");
        let row = open
            .client
            .query_one(&sql, &[&projection, &i64::from(partition)])
            .await
            .map_err(|e| failed(Box::new(e)))?;
        let taken: bool = row.get(0);
        if taken {
            open.held.insert(partition);
        }
        Ok(taken)
    }

    /// Lets the hold on `partition` go, if this store has it. A failure is
    /// logged only: the session is then broken, and its end frees the hold.
    pub(super) async fn unhold(&self, projection: &str, partition: u32, location: &str) {
        let mut session = self.session.lock().await;
        let Some(open) = session.as_mut() else { return };
        if !open.held.remove(&partition) {
            return;
        }
        let sql = format!("SELECT pg_advisory_unlock({HOLD_KEY})");
        if let Err(error) = open.client.query_one(&sql, &[&projection, &i64::from(partition)]).await {
            tracing::warn!(store = location, partition, "cannot let the hold on partition {partition} go: {error}");
            *session = None;
        }
    }

    /// Stops pinging the session, as a paused host would (tests).
    #[cfg(test)]
    pub(super) fn fall_silent(&self) {
        self.silent.store(true, Ordering::Relaxed);
    }
}

/// A session of its own for holds, out of the pool, with its lease set and
/// its keeper running.
async fn open(pool: &Pool, silent: Arc<AtomicBool>) -> Result<Session, Box<dyn std::error::Error + Send + Sync>> {
    let client = Object::take(pool.get().await?);
    let lease = format!("SET idle_session_timeout = {}", HOLD_LEASE.as_millis());
    client.batch_execute(&lease).await?;
    let client = Arc::new(client);
    let alive = Arc::new(AtomicBool::new(true));
    let keeper = tokio::spawn({
        let (client, alive) = (client.clone(), alive.clone());
        async move {
            loop {
                tokio::time::sleep(HOLD_PING).await;
                if silent.load(Ordering::Relaxed) {
                    continue;
                }
                if client.simple_query("SELECT 1").await.is_err() {
                    alive.store(false, Ordering::Relaxed);
                    return;
                }
            }
        }
    });
    Ok(Session { client, held: HashSet::new(), alive, keeper })
}
