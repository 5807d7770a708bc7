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
//!   host name and process id, and the admin address when the host serves
//!   one, [`member_name`]; or what [`Holds::set_name`] was given), so each
//!   host can name the others holding the projection's partitions
//!   ([`Holds::members`]: the server's lock table, nothing kept besides).
//! - **A running host is a member for its whole life**, holding partitions
//!   or not: the session holding the run lock (shared, for as long as the
//!   host runs, [`super::postgres`]) carries the same name, and the members
//!   are the sessions holding either lock, one per name (a host's hold
//!   session and run-lock session are one member). A reset holding the
//!   run lock exclusively is listed while it runs.

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

/// The most bytes of a session's name PostgreSQL keeps.
pub const MAX_MEMBER_NAME: usize = 63;

/// This host's name for the others: its host name and process id.
pub(super) fn default_name() -> String {
    member_name(None)
}

/// This host's name for the others: its host name and process id, and
/// `admin` (its admin endpoint's address, `https://` before it when over
/// TLS) when it serves one: `db-7 pid 4121 admin 10.0.0.5:9100`. The host
/// name is cut so the whole stays within [`MAX_MEMBER_NAME`] bytes of
/// printable ASCII (what PostgreSQL keeps).
pub fn member_name(admin: Option<&str>) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unnamed host".to_owned());
    name_of(&host, std::process::id(), admin)
}

/// [`member_name`] of `host`, `pid` and `admin`.
fn name_of(host: &str, pid: u32, admin: Option<&str>) -> String {
    let ascii = |text: &str| -> String { text.chars().map(|c| if c.is_ascii_graphic() { c } else { '?' }).collect() };
    let tail = match admin {
        Some(admin) => format!(" pid {pid} admin {}", ascii(admin)),
        None => format!(" pid {pid}"),
    };
    let host = ascii(host);
    let room = MAX_MEMBER_NAME.saturating_sub(tail.len());
    let name = format!("{}{tail}", &host[..host.len().min(room)]);
    name[..name.len().min(MAX_MEMBER_NAME)].to_owned()
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

    /// The name its sessions give.
    pub(super) fn name(&self) -> String {
        let name = self.name.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        name.clone().unwrap_or_else(default_name)
    }

    /// The hosts running `projection` now (this store's and every other),
    /// from the server's lock table: the sessions holding its partitions
    /// or its run lock (first key `run_lock`), one member per name with
    /// its partitions (none: it holds none now), in the order of their
    /// names. `run_session`: this store's run-lock session, also this host.
    pub(super) async fn members(
        &self,
        pool: &Pool,
        projection: &str,
        location: &str,
        run_lock: i32,
        run_session: Option<i32>,
    ) -> Result<Vec<super::Member>, StateError> {
        let failed = |e: Box<dyn std::error::Error + Send + Sync>| StateError::Storage {
            store: location.to_owned(),
            source: format!("listing the hosts holding partitions: {e}").into(),
        };
        let own = self.session.lock().await.as_ref().map(|session| session.pid);
        // A one-key advisory lock (a hold) shows its key's high half as
        // `classid` and its low half as `objid`, with `objsubid` 1; a
        // two-key one (the run lock) its keys as `classid` and `objid`,
        // with `objsubid` 2 (no partition: -1).
        let sql = "SELECT l.pid, coalesce(a.application_name, ''), \
                   CASE WHEN l.objsubid = 1 THEN l.objid::bigint ELSE -1 END \
                   FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
                   WHERE l.locktype = 'advisory' AND l.granted \
                   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                   AND ((l.objsubid = 1 \
                         AND l.classid::bigint = (hashtext(current_schema() || '/' || $1)::bigint & 4294967295)) \
                     OR (l.objsubid = 2 AND l.classid::bigint = $2 \
                         AND l.objid::bigint = (hashtext(current_schema() || '/' || $1)::bigint & 4294967295))) \
                   ORDER BY 2, 1, 3";
        let client = pool.get().await.map_err(|e| failed(Box::new(e)))?;
        let rows = client.query(sql, &[&projection, &i64::from(run_lock)]).await.map_err(|e| failed(Box::new(e)))?;
        let rows = rows.iter().map(|row| (row.get(0), row.get(1), row.get(2)));
        Ok(members_of(rows, |pid| Some(pid) == own || Some(pid) == run_session))
    }

    /// Stops pinging the session, as a paused host would (tests).
    #[cfg(test)]
    pub(super) fn fall_silent(&self) {
        self.silent.store(true, Ordering::Relaxed);
    }
}

/// The members of `rows` (session, its name, a partition it holds or -1),
/// ordered by name and session: one per name (a session without one is
/// `session <pid>`), this host's marked by `own`.
fn members_of(rows: impl Iterator<Item = (i32, String, i64)>, own: impl Fn(i32) -> bool) -> Vec<super::Member> {
    let mut members: Vec<super::Member> = Vec::new();
    for (pid, name, partition) in rows {
        let name = if name.is_empty() { format!("session {pid}") } else { name };
        let member = match members.last_mut() {
            Some(member) if member.name == name => member,
            _ => {
                members.push(super::Member { name, partitions: Vec::new(), this_host: false });
                members.last_mut().expect("pushed above")
            }
        };
        member.this_host |= own(pid);
        if let Ok(partition) = u32::try_from(partition)
            && !member.partitions.contains(&partition)
        {
            member.partitions.push(partition);
        }
    }
    for member in &mut members {
        member.partitions.sort_unstable();
    }
    members
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_keeps_the_admin_address_within_63_bytes_of_printable_ascii() {
        assert_eq!(name_of("db-7", 4121, Some("10.0.0.5:9100")), "db-7 pid 4121 admin 10.0.0.5:9100");
        assert_eq!(name_of("db-7", 4121, None), "db-7 pid 4121");
        let long = name_of(&"h".repeat(100), 4121, Some("https://[2001:db8::1]:9100"));
        assert_eq!(long.len(), MAX_MEMBER_NAME);
        assert!(long.ends_with(" pid 4121 admin https://[2001:db8::1]:9100"), "{long}");
        assert_eq!(name_of("hôte\n", 1, Some("a b")), "h?te? pid 1 admin a?b");
    }

    #[test]
    fn a_hosts_sessions_are_one_member_and_one_without_a_partition_is_listed() {
        let rows = [
            (10, "a pid 1".to_owned(), -1),
            (11, "a pid 1".to_owned(), 2),
            (11, "a pid 1".to_owned(), 0),
            (20, "b pid 2".to_owned(), -1),
            (30, String::new(), 1),
        ];
        let members = members_of(rows.into_iter(), |pid| pid == 10);
        let listed: Vec<(&str, &[u32], bool)> =
            members.iter().map(|m| (m.name.as_str(), m.partitions.as_slice(), m.this_host)).collect();
        assert_eq!(
            listed,
            [("a pid 1", &[0, 2][..], true), ("b pid 2", &[][..], false), ("session 30", &[1][..], false)]
        );
    }
}
