//! The bank demo: a seeded workload for the bank example of
//! `spec/ordering.md`, and an oracle to check the read model against.
//!
//! The workload is deterministic for a seed: accounts are opened
//! (Acquire), receive deposits (Relaxed, associative: the host folds them)
//! and withdrawals (Relaxed), change status with per-message orderings
//! (active: Relaxed, frozen: AcqRel, closed: Release), are closed (Release)
//! and re-opened, all interleaved across accounts in one log order.
//!
//! The oracle applies each account's events natively, one by one, in log
//! order: no planner, no reduction, no WASM. It is written here, apart from
//! the bank module, so that it checks the module and the host rather than
//! repeating them. The consumer's read model must equal it exactly, because
//! every reordering the planner allows commutes for this model.

use std::collections::BTreeMap;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::json;

use crate::authoring::publish::Outgoing;
use crate::event::EventTypeTag;
use crate::sandbox::handler::{CallError, HandlerModule};
use crate::storage::state::{StateError, StateStore};

/// Why the demo's read model could not be checked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// The module is not the bank example.
    #[error("module `{module}` declares no event type `{name}`: is it the bank example?")]
    NotBank {
        /// The module.
        module: String,
        /// The missing event type.
        name: &'static str,
    },
    /// The module failed to compute a key.
    #[error("the module could not compute an account's key: {0}")]
    Call(#[from] CallError),
    /// The state could not be read.
    #[error(transparent)]
    State(#[from] StateError),
}

/// The tag the bank `module` gives the event type `name`.
pub fn bank_tag(module: &dyn HandlerModule, name: &'static str) -> Result<EventTypeTag, CheckError> {
    module
        .event_types()
        .iter()
        .find(|t| t.name == name)
        .map(|t| t.tag)
        .ok_or_else(|| CheckError::NotBank { module: module.name().to_owned(), name })
}

/// The workload's events as messages of the bank `module`, ready to publish.
pub fn outgoing(module: &dyn HandlerModule, events: &[WorkloadEvent]) -> Result<Vec<Outgoing>, CheckError> {
    events
        .iter()
        .map(|event| {
            Ok(Outgoing { tag: bank_tag(module, event.type_name)?, body: event.body.to_string().into_bytes() })
        })
        .collect()
}

/// Compares a bank projection's state with the oracle. The module computes
/// each account's key from an `AccountOpened` body, as a publisher would.
pub fn check_projection(
    oracle: &Oracle,
    module: &dyn HandlerModule,
    store: &StateStore,
) -> Result<OracleCheck, CheckError> {
    let opened = bank_tag(module, event_name::OPENED)?;
    let mut instance = module.instantiate()?;
    let open_accounts =
        store.counters()?.into_iter().find(|(name, _)| name == OPEN_ACCOUNTS).map_or(0, |(_, value)| value);
    check(oracle, open_accounts, |account| -> Result<_, CheckError> {
        let body = serde_json::to_vec(&json!({ "account": account, "owner": "" })).expect("JSON");
        let key = instance.key(opened, &body)?;
        Ok(store.get(&key, ACCOUNT_ENTRY)?)
    })
}

/// Event type names the bank module declares.
pub mod event_name {
    /// Tag 1, Acquire.
    pub const OPENED: &str = "AccountOpened";
    /// Tag 2, Relaxed, associative.
    pub const DEPOSITED: &str = "Deposited";
    /// Tag 3, Relaxed.
    pub const WITHDRAWN: &str = "Withdrawn";
    /// Tag 4, Release.
    pub const CLOSED: &str = "AccountClosed";
    /// Tag 5, ordering per message.
    pub const STATUS_CHANGED: &str = "AccountStatusChanged";
}

/// The state entry that holds an account's read model.
pub const ACCOUNT_ENTRY: &str = "account";
/// The shared counter of open accounts.
pub const OPEN_ACCOUNTS: &str = "open_accounts";

/// The size and seed of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadSpec {
    /// Events in all.
    pub events: usize,
    /// Distinct accounts.
    pub accounts: u64,
    /// The seed: equal specs give equal workloads.
    pub seed: u64,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        Self { events: 1_000_000, accounts: 10_000, seed: 42 }
    }
}

/// One event of the workload: its type name and JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadEvent {
    /// The account.
    pub account: u64,
    /// The event type's name (see [`event_name`]).
    pub type_name: &'static str,
    /// The JSON body.
    pub body: serde_json::Value,
}

/// An account's read model as the oracle computes it. Its JSON form is the
/// bank module's `account` state entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OracleAccount {
    /// Who opened it last.
    pub owner: String,
    /// Deposits minus withdrawals.
    pub balance: i64,
    /// "active", "frozen" or "closed".
    pub status: &'static str,
    /// Times opened.
    pub opened: u64,
    /// Deposits applied.
    pub deposits: u64,
    /// Withdrawals applied.
    pub withdrawals: u64,
    /// Times closed.
    pub closes: u64,
    /// Status changes applied.
    pub status_changes: u64,
}

/// The expected read model: every account, and the open-accounts counter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Oracle {
    /// Accounts by id.
    pub accounts: BTreeMap<u64, OracleAccount>,
    /// The shared counter of open accounts.
    pub open_accounts: i64,
}

impl Oracle {
    /// Applies one event, as the bank's business rules say.
    pub fn apply(&mut self, event: &WorkloadEvent) {
        let account = self.accounts.entry(event.account).or_default();
        let body = &event.body;
        match event.type_name {
            event_name::OPENED => {
                account.owner = body["owner"].as_str().unwrap_or_default().to_owned();
                account.status = "active";
                account.opened += 1;
                self.open_accounts += 1;
            }
            event_name::DEPOSITED => {
                account.balance += body["amount"].as_i64().unwrap_or_default();
                account.deposits += 1;
            }
            event_name::WITHDRAWN => {
                account.balance -= body["amount"].as_i64().unwrap_or_default();
                account.withdrawals += 1;
            }
            event_name::CLOSED => {
                account.status = "closed";
                account.closes += 1;
                self.open_accounts -= 1;
            }
            event_name::STATUS_CHANGED => {
                account.status = match body["status"].as_str() {
                    Some("frozen") => "frozen",
                    Some("closed") => "closed",
                    _ => "active",
                };
                account.status_changes += 1;
            }
            other => unreachable!("the workload has no `{other}` events"),
        }
    }
}

/// Generates the workload and computes its oracle.
pub fn workload(spec: WorkloadSpec) -> (Vec<WorkloadEvent>, Oracle) {
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let accounts = spec.accounts.max(1);
    let mut open = vec![false; accounts as usize];
    let mut events = Vec::with_capacity(spec.events);
    let mut oracle = Oracle::default();
    for _ in 0..spec.events {
        let account = rng.random_range(0..accounts);
        let is_open = &mut open[account as usize];
        let (type_name, body) = if !*is_open {
            *is_open = true;
            (event_name::OPENED, json!({ "account": account, "owner": format!("owner-{account}") }))
        } else {
            match rng.random_range(0..100) {
                0..55 => (event_name::DEPOSITED, json!({ "account": account, "amount": rng.random_range(1..=1000) })),
                55..85 => (event_name::WITHDRAWN, json!({ "account": account, "amount": rng.random_range(1..=500) })),
                85..94 => {
                    let status = match rng.random_range(0..10) {
                        0..6 => "active",
                        6..9 => "frozen",
                        _ => "closed",
                    };
                    (event_name::STATUS_CHANGED, json!({ "account": account, "status": status }))
                }
                _ => {
                    *is_open = false;
                    (event_name::CLOSED, json!({ "account": account }))
                }
            }
        };
        let event = WorkloadEvent { account, type_name, body };
        oracle.apply(&event);
        events.push(event);
    }
    (events, oracle)
}

/// One account whose read model differs from the oracle.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// The account.
    pub account: u64,
    /// What the oracle expects (JSON).
    pub expected: serde_json::Value,
    /// What the state holds (JSON), `None` if absent.
    pub found: Option<serde_json::Value>,
}

/// The result of comparing a read model with the oracle.
#[derive(Debug, Clone, PartialEq)]
pub struct OracleCheck {
    /// Accounts compared.
    pub accounts: usize,
    /// Accounts that differ, in account order.
    pub differences: Vec<Difference>,
    /// The open-accounts counter: expected and found.
    pub open_accounts: (i128, i128),
}

impl OracleCheck {
    /// Whether everything matched.
    pub fn matches(&self) -> bool {
        self.differences.is_empty() && self.open_accounts.0 == self.open_accounts.1
    }

    /// The one-line verdict, and up to `max` differences after it.
    pub fn report(&self, max: usize) -> String {
        if self.matches() {
            return format!("oracle check: match ({} accounts)", self.accounts);
        }
        let mut out = format!(
            "oracle check: MISMATCH ({} of {} accounts differ; open_accounts expected {}, found {})",
            self.differences.len(),
            self.accounts,
            self.open_accounts.0,
            self.open_accounts.1
        );
        for difference in self.differences.iter().take(max) {
            let found = difference.found.as_ref().map_or_else(|| "nothing".to_owned(), ToString::to_string);
            out.push_str(&format!(
                "\n  account {}: expected {}, found {found}",
                difference.account, difference.expected
            ));
        }
        out
    }
}

/// Compares a read model with the oracle. `read` returns an account's
/// `account` entry (JSON bytes), if any; `open_accounts` is the counter.
pub fn check<E>(
    oracle: &Oracle,
    open_accounts: i128,
    mut read: impl FnMut(u64) -> Result<Option<Vec<u8>>, E>,
) -> Result<OracleCheck, E> {
    let mut differences = Vec::new();
    for (&account, expected) in &oracle.accounts {
        let expected = serde_json::to_value(expected).expect("the oracle serialises");
        let found = read(account)?
            .map(|bytes| serde_json::from_slice(&bytes).unwrap_or_else(|e| json!(format!("unreadable JSON: {e}"))));
        if found.as_ref() != Some(&expected) {
            differences.push(Difference { account, expected, found });
        }
    }
    Ok(OracleCheck {
        accounts: oracle.accounts.len(),
        differences,
        open_accounts: (oracle.open_accounts.into(), open_accounts),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_is_deterministic_for_a_seed() {
        let spec = WorkloadSpec { events: 2000, accounts: 50, seed: 7 };
        assert_eq!(workload(spec), workload(spec));
        assert_ne!(workload(spec).0, workload(WorkloadSpec { seed: 8, ..spec }).0);
    }

    #[test]
    fn workload_has_every_event_type_and_reopens() {
        let (events, oracle) = workload(WorkloadSpec { events: 20_000, accounts: 100, seed: 1 });
        for name in [
            event_name::OPENED,
            event_name::DEPOSITED,
            event_name::WITHDRAWN,
            event_name::CLOSED,
            event_name::STATUS_CHANGED,
        ] {
            assert!(events.iter().any(|e| e.type_name == name), "no {name}");
        }
        assert!(oracle.accounts.values().any(|a| a.opened > 1), "no account was re-opened");
        let open = oracle.accounts.values().map(|a| a.opened as i64 - a.closes as i64).sum::<i64>();
        assert_eq!(open, oracle.open_accounts);
    }

    #[test]
    fn check_reports_differences() {
        let (_, oracle) = workload(WorkloadSpec { events: 500, accounts: 10, seed: 3 });
        let exact = |account: u64| Ok::<_, ()>(Some(serde_json::to_vec(&oracle.accounts[&account]).unwrap()));
        assert!(check(&oracle, oracle.open_accounts.into(), exact).unwrap().matches());
        let wrong = |account: u64| Ok::<_, ()>(if account == 3 { None } else { exact(account)? });
        let result = check(&oracle, oracle.open_accounts.into(), wrong).unwrap();
        assert!(!result.matches());
        assert_eq!(result.differences.len(), 1);
        assert!(result.report(5).contains("account 3: expected"), "{}", result.report(5));
    }
}
