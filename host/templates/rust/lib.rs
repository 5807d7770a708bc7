//! {{name}}: a wakuwaku handler module. It counts each user's visits (state
//! of the user's key) and all visits (a shared counter).
//!
//! Add event types as serde structs implementing `Event` (each with a tag
//! unique in the topic), handle each with `Handler<E>`, and list them in
//! `export_module!`. The guest SDK's docs: `cargo doc --open -p wakuwaku-guest`.

use serde::{Deserialize, Serialize};
use wakuwaku_guest::{Context, Event, EventTypeTag, Handler, HandlerError, PartitionKey};

/// What order and state are scoped to: one user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct UserId(pub u64);

impl PartitionKey for UserId {}

/// A user visited a page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Visited {
    /// Who.
    pub user: u64,
    /// Which page.
    pub page: String,
}

impl Event for Visited {
    const TYPE_TAG: EventTypeTag = EventTypeTag::new(1);
    const NAME: &'static str = "Visited";
    type Key = UserId;

    fn key(&self) -> UserId {
        UserId(self.user)
    }
}

/// The module.
pub struct {{module}};

impl Handler<Visited> for {{module}} {
    fn handle(ctx: &mut Context<'_>, events: &[Visited]) -> Result<(), HandlerError> {
        let seen: u64 = ctx.get("visits")?.unwrap_or(0);
        let now = seen + events.len() as u64;
        ctx.set("visits", &now)?;
        ctx.counter_add("all_visits", events.len() as i64)?;
        ctx.info(&format!("{now} visits"));
        Ok(())
    }
}

wakuwaku_guest::export_module!({{module}}: Visited);

#[cfg(test)]
mod tests {
    use wakuwaku_guest::testing::MemoryHost;

    use super::*;

    fn visit(user: u64) -> Visited {
        Visited { user, page: "/".into() }
    }

    #[test]
    fn counts_visits_per_user_and_in_all() {
        let mut host = MemoryHost::new();
        host.handle::<{{module}}, _>(&[visit(7), visit(7), visit(8)]).unwrap();
        assert_eq!(host.get::<u64>(&UserId(7), "visits"), Some(2));
        assert_eq!(host.get::<u64>(&UserId(8), "visits"), Some(1));
        assert_eq!(host.counter("all_visits"), 3);
    }
}
