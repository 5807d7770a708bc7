//! Following an Iggy consumer group: which partitions of the topic this
//! host holds, as hosts join and leave.
//!
//! [`follow_group`] joins the group and asks the log for this connection's
//! partitions ([`EventLog::group_partitions`]) at start-up, then again every
//! [`GROUP_POLL`], and hands every change to the consumer
//! ([`crate::engine::consumer::Consumer::with_assignment`]), which takes and drops
//! partitions between batches. Rules kept here:
//!
//! - **Iggy decides, PostgreSQL fences.** The group says who should hold a
//!   partition; the state store's claim makes sure a host that lost one
//!   (paused, cut off, slow to hear of a rebalance) can never commit to it
//!   again. So a late or missed poll here costs time, never correctness.
//! - **Membership belongs to the connection.** After the log reconnects,
//!   the next poll joins again. While the log cannot be reached this host
//!   holds nothing: the server dropped it from the group with its
//!   connection and gives its partitions to the others, who wait for this
//!   host to let them go (its batches in flight cannot read on anyway);
//!   the failure is logged once per outage.
//! - **A graceful stop leaves.** [`Membership::leave`] leaves the group
//!   once the consumer let its partitions go after its last commits, so the
//!   server hands them to the others at once (they take them at their next
//!   ask, within [`GROUP_POLL`]) instead of when the connection closes.
//! - **A shared state store is required.** A partition's state must follow
//!   it to whichever host it is given; a local state file cannot, so the
//!   host refuses a group without PostgreSQL ([`crate::operations::host::HostError::GroupNeedsSharedState`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::storage::log::{EventLog, LogError};

/// How often the group is asked for this host's partitions.
pub const GROUP_POLL: Duration = Duration::from_millis(500);

/// This host's membership of a consumer group ([`follow_group`]).
pub struct Membership {
    leave: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Membership {
    /// Stops following the group and leaves it; waits until the server
    /// answered (a failure is logged: the connection's end leaves too).
    pub async fn leave(self) {
        let _ = self.leave.send(());
        let _ = self.task.await;
    }
}

/// Joins consumer group `group` of `topic` on `log` and returns this host's
/// partitions, kept up to date by a task that ends once the receiver is
/// dropped or the [`Membership`] leaves. Fails if the first ask fails (no
/// such topic, no groups on this log, server unreachable).
pub async fn follow_group<L: EventLog>(
    log: Arc<L>,
    topic: &str,
    group: &str,
) -> Result<(watch::Receiver<Vec<u32>>, Membership), LogError> {
    let first = log.group_partitions(topic, group).await?;
    tracing::info!(topic, group, partitions = ?first, "consumer group `{group}` assigns partitions {first:?}");
    let (assign, assigned) = watch::channel(first);
    let (topic, group) = (topic.to_owned(), group.to_owned());
    let (leave, mut leaving) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut failing = false;
        loop {
            tokio::select! {
                () = assign.closed() => return,
                _ = &mut leaving => {
                    match log.leave_group(&topic, &group).await {
                        Ok(()) => tracing::info!(topic, group, "left consumer group `{group}`"),
                        Err(error) => tracing::warn!(topic, group, "cannot leave consumer group `{group}`: {error}"),
                    }
                    return;
                }
                () = tokio::time::sleep(GROUP_POLL) => {}
            }
            match log.group_partitions(&topic, &group).await {
                Ok(partitions) => {
                    failing = false;
                    assign.send_if_modified(|held| {
                        let changed = *held != partitions;
                        if changed {
                            tracing::info!(
                                topic,
                                group,
                                "consumer group `{group}` now assigns partitions {partitions:?} (was {held:?})"
                            );
                            *held = partitions;
                        }
                        changed
                    });
                }
                Err(error) => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(
                            topic,
                            group,
                            "cannot ask consumer group `{group}` for this host's partitions: {error}; holding none \
                             until it answers"
                        );
                    }
                    if matches!(error, LogError::Unavailable { .. }) {
                        // No connection, no membership: what this host held is
                        // the others' now, and it lets it go.
                        assign.send_if_modified(|held| !std::mem::take(held).is_empty());
                    }
                }
            }
        }
    });
    Ok((assigned, Membership { leave, task }))
}
