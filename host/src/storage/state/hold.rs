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
//! - **A hold session carries its host's name** (`application_name`: the
//!   host name and process id, or what [`Holds::name`] was given), so each
//!   host can name the others holding the projection's partitions
//!   ([`Holds::members`]: the server's lock table, nothing kept besides).

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
    /// The name the hold session gives; `None`: [`default_name`].
    name: std::sync::Mutex<Option<String>>,
}

/// This host's name for the others: its host name and process id.
pub(super) fn default_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unnamed host".to_owned());
    format!("{host} pid {}", std::process::id())
}

struct Session {
    client: Arc<deadpool_postgres::ClientWrapper>,
    /// Its server process, to tell this host among the members.
    pid: i32,
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
            *session = Some(open(pool, self.silent.clone(), &self.name()).await.map_err(failed)?);
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

    /// Names this host for the others: its hold sessions from the next
    /// one opened (PostgreSQL keeps at most 63 bytes of it).
    pub(super) fn set_name(&self, name: &str) {
        *self.name.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(name.to_owned());
    }

    fn name(&self) -> String {
        let name = self.name.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        name.clone().unwrap_or_else(default_name)
    }

    /// The sessions holding partitions of `projection` now (this store's
    /// and every other host's), from the server's lock table: each one's
    /// name and partitions, in the order of their names.
    pub(super) async fn members(
        &self,
        pool: &Pool,
        projection: &str,
        location: &str,
    ) -> Result<Vec<super::Member>, StateError> {
        let failed = |e: Box<dyn std::error::Error + Send + Sync>| StateError::Storage {
            store: location.to_owned(),
            source: format!("listing the hosts holding partitions: {e}").into(),
        };
        let own = self.session.lock().await.as_ref().map(|session| session.pid);
        // A one-key advisory lock shows its key's high half as `classid`
        // and its low half as `objid`, with `objsubid` 1.
        let sql = "SELECT l.pid, coalesce(a.application_name, ''), l.objid::bigint \
                   FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
                   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
                   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                   AND l.classid::bigint = (hashtext(current_schema() || '/' || $1)::bigint & 4294967295) \
                   ORDER BY 2, 1, 3";
        let client = pool.get().await.map_err(|e| failed(Box::new(e)))?;
        let rows = client.query(sql, &[&projection]).await.map_err(|e| failed(Box::new(e)))?;
        let mut members: Vec<(i32, super::Member)> = Vec::new();
        for row in rows {
            let (pid, name, partition): (i32, String, i64) = (row.get(0), row.get(1), row.get(2));
            let partition = u32::try_from(partition).unwrap_or(u32::MAX);
            match members.last_mut() {
                Some((last, member)) if *last == pid => member.partitions.push(partition),
                _ => {
                    let name = if name.is_empty() { format!("session {pid}") } else { name };
                    let this_host = Some(pid) == own;
                    members.push((pid, super::Member { name, partitions: vec![partition], this_host }));
                }
            }
        }
        Ok(members.into_iter().map(|(_, member)| member).collect())
    }

    /// Stops pinging the session, as a paused host would (tests).
    #[cfg(test)]
    pub(super) fn fall_silent(&self) {
        self.silent.store(true, Ordering::Relaxed);
    }
}

/// A session of its own for holds, out of the pool, with its lease set and
/// its keeper running.
async fn open(
    pool: &Pool,
    silent: Arc<AtomicBool>,
    name: &str,
) -> Result<Session, Box<dyn std::error::Error + Send + Sync>> {
    let client = Object::take(pool.get().await?);
    let lease = format!("SET idle_session_timeout = {}", HOLD_LEASE.as_millis());
    client.batch_execute(&lease).await?;
    let named =
        client.query_one("SELECT set_config('application_name', $1, false), pg_backend_pid()", &[&name]).await?;
    let pid: i32 = named.get(1);
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
    Ok(Session { client, pid, held: HashSet::new(), alive, keeper })
}
