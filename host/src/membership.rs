//! Following an Iggy consumer group: which partitions of the topic this
//! host holds, as hosts join and leave.
//!
//! [`follow_group`] joins the group and asks the log for this connection's
//! partitions ([`EventLog::group_partitions`]) at start-up, then again every
//! [`GROUP_POLL`], and hands every change to the consumer
//! ([`crate::consumer::Consumer::with_assignment`]), which takes and drops
//! partitions between batches. Rules kept here:
//!
//! - **Iggy decides, PostgreSQL fences.** The group says who should hold a
//!   partition; the state store's claim makes sure a host that lost one
//!   (paused, cut off, slow to hear of a rebalance) can never commit to it
//!   again. So a late or missed poll here costs time, never correctness.
//! - **Membership belongs to the connection.** After the log reconnects,
//!   the next poll joins again; while the log cannot be reached, the last
//!   assignment stands (the server will have given it away, and fencing
//!   stops this host's commits), and the failure is logged once per
//!   outage.
//! - **A shared state store is required.** A partition's state must follow
//!   it to whichever host it is given; a local state file cannot, so the
//!   host refuses a group without PostgreSQL ([`crate::host::HostError::GroupNeedsSharedState`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::log::{EventLog, LogError};

/// How often the group is asked for this host's partitions.
pub const GROUP_POLL: Duration = Duration::from_millis(500);

/// Joins consumer group `group` of `topic` on `log` and returns this host's
/// partitions, kept up to date by a task that ends once the receiver is
/// dropped. Fails if the first ask fails (no such topic, no groups on this
/// log, server unreachable).
pub async fn follow_group<L: EventLog>(
    log: Arc<L>,
    topic: &str,
    group: &str,
) -> Result<watch::Receiver<Vec<u32>>, LogError> {
    let first = log.group_partitions(topic, group).await?;
    tracing::info!(topic, group, partitions = ?first, "consumer group `{group}` assigns partitions {first:?}");
    let (assign, assigned) = watch::channel(first);
    let (topic, group) = (topic.to_owned(), group.to_owned());
    tokio::spawn(async move {
        let mut failing = false;
        loop {
            tokio::select! {
                () = assign.closed() => return,
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
                Err(error) if !failing => {
                    failing = true;
                    tracing::warn!(
                        topic,
                        group,
                        "cannot ask consumer group `{group}` for this host's partitions: {error}"
                    );
                }
                Err(_) => {}
            }
        }
    });
    Ok(assigned)
}
