//! The bank account projection of the ordering spec, as a wakuwaku module.
//!
//! Events are keyed by [`AccountId`]; their bodies are plain JSON, one struct
//! per type:
//!
//! | type | tag | algebra | ordering |
//! | --- | --- | --- | --- |
//! | [`AccountOpened`] | 1 | non-associative | acquire: nothing happens to an account before it exists |
//! | [`Deposited`] | 2 | associative: a run is summed | relaxed |
//! | [`Withdrawn`] | 3 | non-associative | relaxed |
//! | [`AccountClosed`] | 4 | non-associative | release: waits for every earlier event |
//! | [`AccountStatusChanged`] | 5 | non-associative | per message: active relaxed, frozen acq-rel, closed release |
//!
//! The read model is one state entry [`ACCOUNT`] per key, the JSON of an
//! [`Account`], plus one counter shared by all keys, [`OPEN_ACCOUNTS`].
//!
//! Deposits and withdrawals only add signed amounts (the command side already
//! checked overdrafts), and amounts and counts add with wrapping arithmetic:
//! so applying a run of deposits one by one, or folded by [`Deposited`]'s
//! `combine`, gives the same account, and so does reordering deposits against
//! withdrawals, as the planner may.

use serde::{Deserialize, Serialize};
use wakuwaku_guest::{Algebra, Context, Event, EventAtomicOrdering, EventTypeTag, Handler, HandlerError, PartitionKey};

/// The state entry holding an account's [`Account`], as JSON.
pub const ACCOUNT: &str = "account";

/// The counter of open accounts, shared by all keys: +1 per
/// [`AccountOpened`], −1 per [`AccountClosed`].
pub const OPEN_ACCOUNTS: &str = "open_accounts";

/// The key of every bank event: one account. Its canonical key is the
/// account number as an integer (`AccountId(42)` has the bytes of `42u64`),
/// so `waku state get --key 42` shows account 42.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AccountId(pub u64);

impl PartitionKey for AccountId {}

/// An account was opened, or re-opened (its balance carries over).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountOpened {
    /// The account.
    pub account: u64,
    /// Its owner.
    pub owner: String,
}

impl Event for AccountOpened {
    const TYPE_TAG: EventTypeTag = EventTypeTag::new(1);
    const NAME: &'static str = "AccountOpened";
    type Key = AccountId;

    fn key(&self) -> AccountId {
        AccountId(self.account)
    }

    fn atomic_ordering(&self) -> EventAtomicOrdering {
        // Nothing that happens to the account may be applied before it exists.
        EventAtomicOrdering::Acquire
    }
}

/// Money was deposited. Associative: the host may fold a run of deposits
/// into one, whose `count` says how many it stands for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deposited {
    /// The account.
    pub account: u64,
    /// The amount, in the smallest unit of the currency.
    pub amount: i64,
    /// How many deposits this event stands for: 1 unless folded. Omitted
    /// from the JSON when 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub count: u64,
}

fn one() -> u64 {
    1
}

fn is_one(count: &u64) -> bool {
    *count == 1
}

impl Deposited {
    /// One deposit of `amount`.
    pub fn new(account: u64, amount: i64) -> Self {
        Self { account, amount, count: 1 }
    }
}

impl Event for Deposited {
    const TYPE_TAG: EventTypeTag = EventTypeTag::new(2);
    const NAME: &'static str = "Deposited";
    const ALGEBRA: Algebra = Algebra::Associative;
    type Key = AccountId;

    fn key(&self) -> AccountId {
        AccountId(self.account)
    }

    /// Sums amounts and counts.
    fn combine(events: Vec<Self>) -> Result<Self, HandlerError> {
        let mut events = events.into_iter();
        let first = events.next().ok_or_else(|| HandlerError::unrecoverable("combine of no deposits"))?;
        Ok(events.fold(first, |sum, event| Self {
            account: sum.account,
            amount: sum.amount.wrapping_add(event.amount),
            count: sum.count.wrapping_add(event.count),
        }))
    }
}

/// Money was withdrawn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Withdrawn {
    /// The account.
    pub account: u64,
    /// The amount, in the smallest unit of the currency.
    pub amount: i64,
}

impl Event for Withdrawn {
    const TYPE_TAG: EventTypeTag = EventTypeTag::new(3);
    const NAME: &'static str = "Withdrawn";
    type Key = AccountId;

    fn key(&self) -> AccountId {
        AccountId(self.account)
    }
}

/// The account was closed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountClosed {
    /// The account.
    pub account: u64,
}

impl Event for AccountClosed {
    const TYPE_TAG: EventTypeTag = EventTypeTag::new(4);
    const NAME: &'static str = "AccountClosed";
    type Key = AccountId;

    fn key(&self) -> AccountId {
        AccountId(self.account)
    }

    fn atomic_ordering(&self) -> EventAtomicOrdering {
        // Every earlier deposit and withdrawal is applied before the account closes.
        EventAtomicOrdering::Release
    }
}

/// The status of an account. JSON: `"active"`, `"frozen"`, `"closed"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccountStatus {
    /// Open for business.
    #[default]
    Active,
    /// Temporarily blocked.
    Frozen,
    /// Closed.
    Closed,
}

/// The account's status changed. One type models several transitions, so
/// the ordering is chosen per message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountStatusChanged {
    /// The account.
    pub account: u64,
    /// The new status.
    pub status: AccountStatus,
}

impl Event for AccountStatusChanged {
    const TYPE_TAG: EventTypeTag = EventTypeTag::new(5);
    const NAME: &'static str = "AccountStatusChanged";
    type Key = AccountId;

    fn key(&self) -> AccountId {
        AccountId(self.account)
    }

    fn atomic_ordering(&self) -> EventAtomicOrdering {
        match self.status {
            // Re-activation is informational: let it float.
            AccountStatus::Active => EventAtomicOrdering::Relaxed,
            // A freeze is a full barrier: nothing passes it in either direction.
            AccountStatus::Frozen => EventAtomicOrdering::AcqRel,
            // Closing waits for everything before it.
            AccountStatus::Closed => EventAtomicOrdering::Release,
        }
    }
}

/// The read model of one account: the state entry [`ACCOUNT`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    /// The owner, from the latest [`AccountOpened`].
    pub owner: String,
    /// Deposits minus withdrawals.
    pub balance: i64,
    /// The current status.
    pub status: AccountStatus,
    /// How many times it was opened.
    pub opened: u64,
    /// How many deposits were applied (a folded deposit counts as many).
    pub deposits: u64,
    /// How many withdrawals were applied.
    pub withdrawals: u64,
    /// How many times it was closed.
    pub closes: u64,
    /// How many status changes were applied.
    pub status_changes: u64,
}

fn apply_opened(account: &mut Account, event: &AccountOpened) {
    account.owner.clone_from(&event.owner);
    account.status = AccountStatus::Active;
    account.opened += 1;
}

fn apply_deposited(account: &mut Account, event: &Deposited) {
    account.balance = account.balance.wrapping_add(event.amount);
    account.deposits = account.deposits.wrapping_add(event.count);
}

/// What a withdrawal costs beside its amount: 0, or 1 with the
/// `withdrawal-fee` feature (a changed rule the rebuild tests roll out).
pub const WITHDRAWAL_FEE: i64 = if cfg!(feature = "withdrawal-fee") { 1 } else { 0 };

fn apply_withdrawn(account: &mut Account, event: &Withdrawn) {
    account.balance = account.balance.wrapping_sub(event.amount).wrapping_sub(WITHDRAWAL_FEE);
    account.withdrawals += 1;
}

fn apply_closed(account: &mut Account, _: &AccountClosed) {
    account.status = AccountStatus::Closed;
    account.closes += 1;
}

fn apply_status_changed(account: &mut Account, event: &AccountStatusChanged) {
    account.status = event.status;
    account.status_changes += 1;
}

/// The module: keeps an [`Account`] per key and the [`OPEN_ACCOUNTS`] counter.
pub struct Bank;

/// Applies a chunk to the key's account with one read and one write.
fn update<E>(ctx: &mut Context<'_>, events: &[E], apply_one: fn(&mut Account, &E)) -> Result<(), HandlerError> {
    let mut account: Account = ctx.get(ACCOUNT)?.unwrap_or_default();
    for event in events {
        apply_one(&mut account, event);
    }
    ctx.set(ACCOUNT, &account)
}

impl Handler<AccountOpened> for Bank {
    fn handle(ctx: &mut Context<'_>, events: &[AccountOpened]) -> Result<(), HandlerError> {
        update(ctx, events, apply_opened)?;
        ctx.counter_add(OPEN_ACCOUNTS, events.len() as i64)
    }
}

impl Handler<Deposited> for Bank {
    fn handle(ctx: &mut Context<'_>, events: &[Deposited]) -> Result<(), HandlerError> {
        update(ctx, events, apply_deposited)
    }
}

impl Handler<Withdrawn> for Bank {
    fn handle(ctx: &mut Context<'_>, events: &[Withdrawn]) -> Result<(), HandlerError> {
        update(ctx, events, apply_withdrawn)
    }
}

impl Handler<AccountClosed> for Bank {
    fn handle(ctx: &mut Context<'_>, events: &[AccountClosed]) -> Result<(), HandlerError> {
        update(ctx, events, apply_closed)?;
        ctx.counter_add(OPEN_ACCOUNTS, -(events.len() as i64))
    }
}

impl Handler<AccountStatusChanged> for Bank {
    fn handle(ctx: &mut Context<'_>, events: &[AccountStatusChanged]) -> Result<(), HandlerError> {
        update(ctx, events, apply_status_changed)
    }
}

wakuwaku_guest::export_module!(Bank: AccountOpened, Deposited, Withdrawn, AccountClosed, AccountStatusChanged);

#[cfg(test)]
mod tests {
    use wakuwaku_guest::testing::MemoryHost;
    use wakuwaku_guest::{ErrorClass, EventTypeInfo, Key, Module};

    use super::*;

    const ALICE: u64 = 42;
    const BOB: u64 = 7;

    fn opened(account: u64, owner: &str) -> AccountOpened {
        AccountOpened { account, owner: owner.into() }
    }

    fn account(host: &MemoryHost, id: u64) -> Account {
        host.get(&AccountId(id), ACCOUNT).expect("account exists")
    }

    #[test]
    fn describes_its_five_event_types() {
        let described = Bank::describe().event_types;
        let summary: Vec<_> = described.iter().map(|t| (t.tag, t.name, t.algebra, t.max_batch)).collect();
        assert_eq!(
            summary,
            [
                (1, "AccountOpened", Algebra::NonAssociative, 256),
                (2, "Deposited", Algebra::Associative, 256),
                (3, "Withdrawn", Algebra::NonAssociative, 256),
                (4, "AccountClosed", Algebra::NonAssociative, 256),
                (5, "AccountStatusChanged", Algebra::NonAssociative, 256),
            ]
        );
        assert_eq!(described[1], EventTypeInfo::of::<Deposited>());
        assert!(Bank::describe().emits.is_empty(), "the bank emits nowhere");
    }

    #[test]
    fn folded_deposits_equal_separate_deposits() {
        let deposits: Vec<_> = [100, 250, -30, 5].map(|amount| Deposited::new(ALICE, amount)).into();

        let mut separate = MemoryHost::new();
        separate.handle::<Bank, _>(&deposits).unwrap();
        let mut folded = MemoryHost::new();
        folded.handle_reduced::<Bank, _>(&deposits).unwrap();

        let expected = Account { balance: 325, deposits: 4, ..Account::default() };
        assert_eq!(account(&separate, ALICE), expected);
        assert_eq!(account(&folded, ALICE), expected);

        // Folding folded deposits still counts every original deposit.
        let bodies: Vec<_> = deposits.iter().map(Event::encode).collect();
        let left = Bank::combine(2, &bodies[..2]).unwrap();
        let right = Bank::combine(2, &bodies[2..]).unwrap();
        let all = Bank::combine(2, &[left, right]).unwrap();
        assert_eq!(all, Bank::combine(2, &bodies).unwrap());
        assert_eq!(Deposited::decode(&all).unwrap(), Deposited { account: ALICE, amount: 325, count: 4 });
    }

    #[test]
    fn a_single_deposit_body_has_no_count() {
        assert_eq!(Deposited::new(ALICE, 5).encode(), br#"{"account":42,"amount":5}"#);
        let decoded = Deposited::decode(br#"{"account":42,"amount":5}"#).unwrap();
        assert_eq!(decoded.count, 1);
    }

    #[test]
    fn orderings_are_chosen_per_message() {
        let ordering = |tag: u32, body: &str| Bank::ordering(tag, body.as_bytes()).unwrap();
        assert_eq!(ordering(1, r#"{"account":1,"owner":"a"}"#), EventAtomicOrdering::Acquire);
        assert_eq!(ordering(2, r#"{"account":1,"amount":3}"#), EventAtomicOrdering::Relaxed);
        assert_eq!(ordering(3, r#"{"account":1,"amount":3}"#), EventAtomicOrdering::Relaxed);
        assert_eq!(ordering(4, r#"{"account":1}"#), EventAtomicOrdering::Release);
        assert_eq!(ordering(5, r#"{"account":1,"status":"active"}"#), EventAtomicOrdering::Relaxed);
        assert_eq!(ordering(5, r#"{"account":1,"status":"frozen"}"#), EventAtomicOrdering::AcqRel);
        assert_eq!(ordering(5, r#"{"account":1,"status":"closed"}"#), EventAtomicOrdering::Release);
    }

    #[test]
    fn the_key_is_the_account_number() {
        // `AccountId(42)` has the canonical bytes of the integer 42.
        let key = Bank::key(3, br#"{"account":42,"amount":1}"#).unwrap();
        assert_eq!(key, AccountId(42).to_key().unwrap());
        assert_eq!(key.as_bytes(), [0x01, 0x54]);
        assert_eq!(key.to_string(), "42");
    }

    #[test]
    fn open_deposit_withdraw_close_reopen() {
        let mut host = MemoryHost::new();
        host.handle::<Bank, _>(&[opened(ALICE, "alice"), opened(BOB, "bob")]).unwrap();
        host.handle::<Bank, _>(&[Deposited::new(ALICE, 100), Deposited::new(ALICE, 50), Deposited::new(BOB, 9)])
            .unwrap();
        host.handle::<Bank, _>(&[Withdrawn { account: ALICE, amount: 30 }]).unwrap();
        assert_eq!(host.counter(OPEN_ACCOUNTS), 2);

        host.handle::<Bank, _>(&[AccountClosed { account: ALICE }]).unwrap();
        assert_eq!(host.counter(OPEN_ACCOUNTS), 1);
        let closed = account(&host, ALICE);
        assert_eq!(closed.status, AccountStatus::Closed);
        assert_eq!(closed.balance, 120 - WITHDRAWAL_FEE);

        host.handle::<Bank, _>(&[opened(ALICE, "alice b.")]).unwrap();
        host.handle::<Bank, _>(&[AccountStatusChanged { account: ALICE, status: AccountStatus::Frozen }]).unwrap();
        assert_eq!(
            account(&host, ALICE),
            Account {
                owner: "alice b.".into(),
                balance: 120 - WITHDRAWAL_FEE,
                status: AccountStatus::Frozen,
                opened: 2,
                deposits: 2,
                withdrawals: 1,
                closes: 1,
                status_changes: 1,
            }
        );
        assert_eq!(
            account(&host, BOB),
            Account { owner: "bob".into(), balance: 9, deposits: 1, opened: 1, ..Account::default() }
        );
        assert_eq!(host.counter(OPEN_ACCOUNTS), 2);
    }

    #[test]
    fn events_before_opening_apply_to_a_default_account() {
        let mut host = MemoryHost::new();
        host.handle::<Bank, _>(&[Withdrawn { account: BOB, amount: 4 }]).unwrap();
        let balance = -4 - WITHDRAWAL_FEE;
        assert_eq!(account(&host, BOB), Account { balance, withdrawals: 1, ..Account::default() });
    }

    #[test]
    fn an_unknown_tag_is_unrecoverable_and_named() {
        let mut host = MemoryHost::new();
        let error = host.handle_bodies::<Bank>(99, &Key::int(1), &[b"{}".to_vec()]).unwrap_err();
        assert_eq!(error.class, ErrorClass::Unrecoverable);
        assert!(error.message.contains("99"), "{error}");
        for error in [Bank::key(99, b"{}").unwrap_err(), Bank::ordering(0, b"{}").unwrap_err()] {
            assert_eq!(error.class, ErrorClass::Unrecoverable);
        }
    }

    #[test]
    fn a_malformed_body_is_unrecoverable_and_names_the_type() {
        let mut host = MemoryHost::new();
        host.handle::<Bank, _>(&[Deposited::new(ALICE, 1)]).unwrap();
        let bodies = [Deposited::new(ALICE, 1).encode(), b"{\"account\":42}".to_vec()];
        let error = host.handle_bodies::<Bank>(2, &AccountId(ALICE).to_key().unwrap(), &bodies).unwrap_err();
        assert_eq!(error.class, ErrorClass::Unrecoverable);
        assert!(error.message.contains("Deposited"), "{error}");
        // Nothing of the failed call was applied.
        assert_eq!(account(&host, ALICE).deposits, 1);

        let error = Bank::key(1, b"not json").unwrap_err();
        assert_eq!(error.class, ErrorClass::Unrecoverable);
        assert!(error.message.contains("AccountOpened"), "{error}");
        let error = Bank::ordering(5, br#"{"account":1,"status":"asleep"}"#).unwrap_err();
        assert!(error.message.contains("AccountStatusChanged"), "{error}");
    }

    #[test]
    fn combine_of_a_non_associative_type_is_unrecoverable() {
        let error = Bank::combine(3, &[br#"{"account":1,"amount":3}"#.to_vec()]).unwrap_err();
        assert_eq!(error.class, ErrorClass::Unrecoverable);
        assert!(error.message.contains("Withdrawn is not associative"), "{error}");
    }

    #[test]
    fn statuses_are_lower_case() {
        let body = AccountStatusChanged { account: 1, status: AccountStatus::Frozen }.encode();
        assert_eq!(body, br#"{"account":1,"status":"frozen"}"#);
    }
}
