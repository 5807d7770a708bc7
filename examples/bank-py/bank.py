"""The bank account projection of the ordering spec, as a wakuwaku module
in Python: the same event types, tags, algebras, orderings, state and
behaviour as the Rust bank (``examples/bank``), so either module can run
the demo and a topic's messages mean the same to both.

Events are keyed by the account number (an integer key: the same bytes as
the Rust bank's ``AccountId(u64)``); their bodies are plain JSON, one
dataclass per type:

====================  ===  ===========================  ====================================================
type                  tag  algebra                      ordering
====================  ===  ===========================  ====================================================
AccountOpened         1    non-associative              acquire: nothing happens to an account before it exists
Deposited             2    associative: a run is summed  relaxed
Withdrawn             3    non-associative              relaxed
AccountClosed         4    non-associative              release: waits for every earlier event
AccountStatusChanged  5    non-associative              per message: active relaxed, frozen acq-rel, closed release
====================  ===  ===========================  ====================================================

The read model is one state entry ``account`` per key, the JSON of an
:class:`Account`, plus one counter shared by all keys, ``open_accounts``.

Deposits and withdrawals only add signed amounts (the command side already
checked overdrafts), and amounts and counts wrap as the Rust bank's
``i64``/``u64`` arithmetic does: so applying a run of deposits one by one,
or folded by :meth:`Deposited.combine`, gives the same account, and so does
reordering deposits against withdrawals, as the planner may.

Build: ``waku build examples/bank-py`` (see ``pyproject.toml``); test:
``pytest examples/bank-py``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from wakuwaku_guest import Algebra, Context, Event, Module, Ordering, export, skip_if_default

#: The state entry holding an account's :class:`Account`, as JSON.
ACCOUNT = "account"
#: The counter of open accounts, shared by all keys: +1 per AccountOpened,
#: -1 per AccountClosed.
OPEN_ACCOUNTS = "open_accounts"


def wrap_i64(value: int) -> int:
    """``value`` wrapped into the i64 range, as Rust's ``wrapping_add``."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


def wrap_u64(value: int) -> int:
    """``value`` wrapped into the u64 range."""
    return value % (1 << 64)


class AccountEvent(Event):
    """What every bank event shares: its key is its account."""

    account: int

    def key(self) -> int:
        return self.account


@dataclass
class AccountOpened(AccountEvent, tag=1):
    """An account was opened, or re-opened (its balance carries over)."""

    account: int
    owner: str

    def ordering(self) -> Ordering:
        # Nothing that happens to the account may be applied before it exists.
        return Ordering.ACQUIRE


@dataclass
class Deposited(AccountEvent, tag=2, algebra=Algebra.ASSOCIATIVE):
    """Money was deposited. Associative: the host may fold a run of
    deposits into one, whose ``count`` says how many it stands for (left
    out of the JSON when 1, as in the Rust bank)."""

    account: int
    amount: int
    count: int = skip_if_default(1)

    @classmethod
    def combine(cls, events: list[Deposited]) -> Deposited:
        """Sums amounts and counts."""
        return cls(
            events[0].account,
            wrap_i64(sum(event.amount for event in events)),
            wrap_u64(sum(event.count for event in events)),
        )


@dataclass
class Withdrawn(AccountEvent, tag=3):
    """Money was withdrawn."""

    account: int
    amount: int


@dataclass
class AccountClosed(AccountEvent, tag=4):
    """The account was closed."""

    account: int

    def ordering(self) -> Ordering:
        # Every earlier deposit and withdrawal is applied before the account closes.
        return Ordering.RELEASE


class AccountStatus(enum.Enum):
    """The status of an account. JSON: ``"active"``, ``"frozen"``, ``"closed"``."""

    ACTIVE = "active"
    FROZEN = "frozen"
    CLOSED = "closed"


_STATUS_ORDERING = {
    # Re-activation is informational: let it float.
    AccountStatus.ACTIVE: Ordering.RELAXED,
    # A freeze is a full barrier: nothing passes it in either direction.
    AccountStatus.FROZEN: Ordering.ACQ_REL,
    # Closing waits for everything before it.
    AccountStatus.CLOSED: Ordering.RELEASE,
}


@dataclass
class AccountStatusChanged(AccountEvent, tag=5):
    """The account's status changed. One type models several transitions,
    so the ordering is chosen per message."""

    account: int
    status: AccountStatus

    def ordering(self) -> Ordering:
        return _STATUS_ORDERING[self.status]


@dataclass
class Account:
    """The read model of one account: the state entry ``account``."""

    owner: str = ""
    balance: int = 0
    status: AccountStatus = AccountStatus.ACTIVE
    opened: int = 0
    deposits: int = 0
    withdrawals: int = 0
    closes: int = 0
    status_changes: int = 0


bank = Module("bank")

E = TypeVar("E", bound=AccountEvent)


def update(ctx: Context, events: list[E], apply_one: Callable[[Account, E], None]) -> None:
    """Applies a chunk to the key's account with one read and one write."""
    account = ctx.get(ACCOUNT, Account) or Account()
    for event in events:
        apply_one(account, event)
    ctx.set(ACCOUNT, account)


def apply_opened(account: Account, event: AccountOpened) -> None:
    account.owner = event.owner
    account.status = AccountStatus.ACTIVE
    account.opened += 1


def apply_deposited(account: Account, event: Deposited) -> None:
    account.balance = wrap_i64(account.balance + event.amount)
    account.deposits = wrap_u64(account.deposits + event.count)


def apply_withdrawn(account: Account, event: Withdrawn) -> None:
    account.balance = wrap_i64(account.balance - event.amount)
    account.withdrawals += 1


def apply_closed(account: Account, event: AccountClosed) -> None:
    account.status = AccountStatus.CLOSED
    account.closes += 1


def apply_status_changed(account: Account, event: AccountStatusChanged) -> None:
    account.status = event.status
    account.status_changes += 1


@bank.handles(AccountOpened)
def opened(ctx: Context, events: list[AccountOpened]) -> None:
    update(ctx, events, apply_opened)
    ctx.counter_add(OPEN_ACCOUNTS, len(events))


@bank.handles(Deposited)
def deposited(ctx: Context, events: list[Deposited]) -> None:
    update(ctx, events, apply_deposited)


@bank.handles(Withdrawn)
def withdrawn(ctx: Context, events: list[Withdrawn]) -> None:
    update(ctx, events, apply_withdrawn)


@bank.handles(AccountClosed)
def closed(ctx: Context, events: list[AccountClosed]) -> None:
    update(ctx, events, apply_closed)
    ctx.counter_add(OPEN_ACCOUNTS, -len(events))


@bank.handles(AccountStatusChanged)
def status_changed(ctx: Context, events: list[AccountStatusChanged]) -> None:
    update(ctx, events, apply_status_changed)


#: The component's `handler` export (componentize-py looks for this name).
Handler = export(bank)
