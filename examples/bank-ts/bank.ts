/**
 * The bank account projection of the ordering spec, as a wakuwaku module in
 * TypeScript: the same event types, tags, algebras, orderings, state and
 * behaviour as the Rust bank (`examples/bank`) and the Python bank
 * (`examples/bank-py`), so any of them can run the demo and a topic's
 * messages mean the same to all.
 *
 * Events are keyed by the account number (an integer key: the same bytes
 * as the Rust bank's `AccountId(u64)`); their bodies are plain JSON:
 *
 * | type                 | tag | algebra                       | ordering                                             |
 * | -------------------- | --- | ----------------------------- | ---------------------------------------------------- |
 * | AccountOpened        | 1   | non-associative               | acquire: nothing happens to an account before it exists |
 * | Deposited            | 2   | associative: a run is summed  | relaxed                                              |
 * | Withdrawn            | 3   | non-associative               | relaxed                                              |
 * | AccountClosed        | 4   | non-associative               | release: waits for every earlier event               |
 * | AccountStatusChanged | 5   | non-associative               | per message: active relaxed, frozen acq-rel, closed release |
 *
 * The read model is one state entry `account` per key, the JSON of an
 * {@link Account} (written as the Rust bank's serde writes it), plus one
 * counter shared by all keys, `open_accounts`.
 *
 * Amounts and counts are 64-bit and wrap as the Rust bank's `i64`/`u64`
 * arithmetic does (`BigInt.asIntN`/`asUintN`): so applying a run of
 * deposits one by one, or folded by `combine`, gives the same account.
 *
 * Build: `waku build examples/bank-ts`; test: `npm test` here (after
 * `npm ci` at the repository root).
 */

import {
  type Context,
  type EventOf,
  type EventType,
  Module,
  Ordering,
  defineEvent,
  type Infer,
  t,
} from "wakuwaku-guest";

/** The state entry holding an account's {@link Account}, as JSON. */
export const ACCOUNT = "account";
/** The counter of open accounts, shared by all keys. */
export const OPEN_ACCOUNTS = "open_accounts";

const wrapI64 = (value: bigint): bigint => BigInt.asIntN(64, value);
const wrapU64 = (value: bigint): bigint => BigInt.asUintN(64, value);

/** Every bank event's key is its account. */
const byAccount = (event: { account: bigint }): bigint => event.account;

/** An account was opened, or re-opened (its balance carries over). */
export const AccountOpened = defineEvent({
  tag: 1,
  name: "AccountOpened",
  fields: { account: t.u64, owner: t.string },
  key: byAccount,
  // Nothing that happens to the account may be applied before it exists.
  ordering: () => Ordering.Acquire,
});
export type AccountOpened = EventOf<typeof AccountOpened>;

/**
 * Money was deposited. Associative: the host may fold a run of deposits
 * into one, whose `count` says how many it stands for (left out of the
 * JSON when 1, as in the Rust bank).
 */
export const Deposited = defineEvent({
  tag: 2,
  name: "Deposited",
  algebra: "associative",
  fields: { account: t.u64, amount: t.i64, count: t.skipIfDefault(t.u64, 1n) },
  key: byAccount,
  combine: (events) => {
    let amount = 0n;
    let count = 0n;
    for (const event of events) {
      amount = wrapI64(amount + event.amount);
      count = wrapU64(count + event.count);
    }
    return { account: events[0]!.account, amount, count };
  },
});
export type Deposited = EventOf<typeof Deposited>;

/** Money was withdrawn. */
export const Withdrawn = defineEvent({
  tag: 3,
  name: "Withdrawn",
  fields: { account: t.u64, amount: t.i64 },
  key: byAccount,
});
export type Withdrawn = EventOf<typeof Withdrawn>;

/** The account was closed. */
export const AccountClosed = defineEvent({
  tag: 4,
  name: "AccountClosed",
  fields: { account: t.u64 },
  key: byAccount,
  // Every earlier deposit and withdrawal is applied before the account closes.
  ordering: () => Ordering.Release,
});
export type AccountClosed = EventOf<typeof AccountClosed>;

/** The status of an account. JSON: `"active"`, `"frozen"`, `"closed"`. */
export const AccountStatus = t.enumOf("active", "frozen", "closed");
export type AccountStatus = Infer<typeof AccountStatus>;

const STATUS_ORDERING: Record<AccountStatus, Ordering> = {
  // Re-activation is informational: let it float.
  active: Ordering.Relaxed,
  // A freeze is a full barrier: nothing passes it in either direction.
  frozen: Ordering.AcqRel,
  // Closing waits for everything before it.
  closed: Ordering.Release,
};

/** The account's status changed; one type, several transitions: the ordering is per message. */
export const AccountStatusChanged = defineEvent({
  tag: 5,
  name: "AccountStatusChanged",
  fields: { account: t.u64, status: AccountStatus },
  key: byAccount,
  ordering: (event) => STATUS_ORDERING[event.status],
});
export type AccountStatusChanged = EventOf<typeof AccountStatusChanged>;

/** The read model of one account: the state entry `account`, fields in the Rust bank's order. */
export const Account = t.object({
  owner: t.string,
  balance: t.i64,
  status: AccountStatus,
  opened: t.u64,
  deposits: t.u64,
  withdrawals: t.u64,
  closes: t.u64,
  status_changes: t.u64,
});
export type Account = Infer<typeof Account>;

/** A new account: what a key without state starts from. */
export function newAccount(): Account {
  return { owner: "", balance: 0n, status: "active", opened: 0n, deposits: 0n, withdrawals: 0n, closes: 0n, status_changes: 0n };
}

/** Applies a chunk to the key's account with one read and one write. */
function update<T>(ctx: Context, events: T[], applyOne: (account: Account, event: T) => void): void {
  const account = ctx.get(ACCOUNT, Account) ?? newAccount();
  for (const event of events) {
    applyOne(account, event);
  }
  ctx.set(ACCOUNT, account, Account);
}

const bank = new Module("bank");

function handles<T>(type: EventType<T>, applyOne: (account: Account, event: T) => void, counter = 0): void {
  bank.handles(type, (ctx, events) => {
    update(ctx, events, applyOne);
    if (counter !== 0) {
      ctx.counterAdd(OPEN_ACCOUNTS, counter * events.length);
    }
  });
}

handles(
  AccountOpened,
  (account, event) => {
    account.owner = event.owner;
    account.status = "active";
    account.opened = wrapU64(account.opened + 1n);
  },
  +1,
);
handles(Deposited, (account, event) => {
  account.balance = wrapI64(account.balance + event.amount);
  account.deposits = wrapU64(account.deposits + event.count);
});
handles(Withdrawn, (account, event) => {
  account.balance = wrapI64(account.balance - event.amount);
  account.withdrawals = wrapU64(account.withdrawals + 1n);
});
handles(
  AccountClosed,
  (account) => {
    account.status = "closed";
    account.closes = wrapU64(account.closes + 1n);
  },
  -1,
);
handles(AccountStatusChanged, (account, event) => {
  account.status = event.status;
  account.status_changes = wrapU64(account.status_changes + 1n);
});

export default bank;
