"""The Python bank against the Rust bank's own tests (examples/bank), on
the pure-Python test host."""

from __future__ import annotations

import pytest

from bank import (
    ACCOUNT,
    OPEN_ACCOUNTS,
    Account,
    AccountClosed,
    AccountOpened,
    AccountStatus,
    AccountStatusChanged,
    Deposited,
    Withdrawn,
    bank,
    wrap_i64,
)
from wakuwaku_guest import Algebra, ErrorClass, HandlerError, Ordering, encode_key
from wakuwaku_guest.testing import MemoryHost

ALICE = 42
BOB = 7


def account(host: MemoryHost, id: int) -> Account:
    found = host.get(id, ACCOUNT, Account)
    assert found is not None, f"account {id} exists"
    return found


def test_describes_its_five_event_types_as_the_rust_bank_does():
    summary = [(t.tag, t.name, t.algebra, t.max_batch) for t in bank.describe().event_types]
    assert summary == [
        (1, "AccountOpened", Algebra.NON_ASSOCIATIVE, 256),
        (2, "Deposited", Algebra.ASSOCIATIVE, 256),
        (3, "Withdrawn", Algebra.NON_ASSOCIATIVE, 256),
        (4, "AccountClosed", Algebra.NON_ASSOCIATIVE, 256),
        (5, "AccountStatusChanged", Algebra.NON_ASSOCIATIVE, 256),
    ]
    assert bank.describe().emits == ()


def test_folded_deposits_equal_separate_deposits():
    deposits = [Deposited(ALICE, amount) for amount in (100, 250, -30, 5)]
    separate = MemoryHost(bank)
    separate.handle(deposits)
    folded = MemoryHost(bank)
    folded.handle_reduced(deposits)
    expected = Account(balance=325, deposits=4)
    assert account(separate, ALICE) == expected
    assert account(folded, ALICE) == expected
    # Folding folded deposits still counts every original deposit.
    bodies = [deposit.encode() for deposit in deposits]
    left, right = bank.combine(2, bodies[:2]), bank.combine(2, bodies[2:])
    assert bank.combine(2, [left, right]) == bank.combine(2, bodies)
    assert Deposited.decode(bank.combine(2, bodies)) == Deposited(ALICE, 325, 4)


def test_bodies_are_the_rust_banks_bytes():
    assert Deposited(ALICE, 5).encode() == b'{"account":42,"amount":5}'
    assert Deposited.decode(b'{"account":42,"amount":5}').count == 1
    assert Deposited(ALICE, 5, 3).encode() == b'{"account":42,"amount":5,"count":3}'
    assert AccountStatusChanged(1, AccountStatus.FROZEN).encode() == b'{"account":1,"status":"frozen"}'
    snapshot = Account("ann", 70, AccountStatus.ACTIVE, 1, 1, 1, 0, 0)
    host = MemoryHost(bank)
    host.handle([AccountOpened(ALICE, "ann"), Deposited(ALICE, 100), Withdrawn(ALICE, 30)])
    assert host.get_bytes(ALICE, ACCOUNT) == (
        b'{"owner":"ann","balance":70,"status":"active","opened":1,"deposits":1,"withdrawals":1,"closes":0,'
        b'"status_changes":0}'
    )
    assert account(host, ALICE) == snapshot


def test_orderings_are_chosen_per_message():
    def ordering(tag: int, body: str) -> Ordering:
        return bank.ordering(tag, body.encode())

    assert ordering(1, '{"account":1,"owner":"a"}') is Ordering.ACQUIRE
    assert ordering(2, '{"account":1,"amount":3}') is Ordering.RELAXED
    assert ordering(3, '{"account":1,"amount":3}') is Ordering.RELAXED
    assert ordering(4, '{"account":1}') is Ordering.RELEASE
    assert ordering(5, '{"account":1,"status":"active"}') is Ordering.RELAXED
    assert ordering(5, '{"account":1,"status":"frozen"}') is Ordering.ACQ_REL
    assert ordering(5, '{"account":1,"status":"closed"}') is Ordering.RELEASE


def test_the_key_is_the_account_as_an_integer_key():
    assert bank.key(3, b'{"account":42,"amount":1}') == encode_key(42) == bytes.fromhex("0154")


def test_open_deposit_withdraw_close_reopen():
    host = MemoryHost(bank)
    host.handle([AccountOpened(ALICE, "alice"), AccountOpened(BOB, "bob")])
    host.handle([Deposited(ALICE, 100), Deposited(ALICE, 50), Deposited(BOB, 9)])
    host.handle([Withdrawn(ALICE, 30)])
    assert host.counter(OPEN_ACCOUNTS) == 2
    host.handle([AccountClosed(ALICE)])
    assert host.counter(OPEN_ACCOUNTS) == 1
    closed = account(host, ALICE)
    assert (closed.status, closed.balance) == (AccountStatus.CLOSED, 120)
    host.handle([AccountOpened(ALICE, "alice b.")])
    host.handle([AccountStatusChanged(ALICE, AccountStatus.FROZEN)])
    assert account(host, ALICE) == Account(
        owner="alice b.",
        balance=120,
        status=AccountStatus.FROZEN,
        opened=2,
        deposits=2,
        withdrawals=1,
        closes=1,
        status_changes=1,
    )
    assert account(host, BOB) == Account(owner="bob", balance=9, deposits=1, opened=1)
    assert host.counter(OPEN_ACCOUNTS) == 2


def test_events_before_opening_apply_to_a_default_account():
    host = MemoryHost(bank)
    host.handle([Withdrawn(BOB, 4)])
    assert account(host, BOB) == Account(balance=-4, withdrawals=1)


def test_amounts_wrap_as_i64_arithmetic_does():
    host = MemoryHost(bank)
    host.handle_reduced([Deposited(ALICE, 2**63 - 1), Deposited(ALICE, 1)])
    assert account(host, ALICE).balance == -(2**63) == wrap_i64(2**63)


def test_an_unknown_tag_is_unrecoverable_and_named():
    with pytest.raises(HandlerError) as raised:
        MemoryHost(bank).handle_bodies(99, encode_key(1), [b"{}"])
    assert raised.value.error_class is ErrorClass.UNRECOVERABLE
    assert "99" in raised.value.message
    for call in (lambda: bank.key(99, b"{}"), lambda: bank.ordering(0, b"{}")):
        with pytest.raises(HandlerError) as raised:
            call()
        assert raised.value.error_class is ErrorClass.UNRECOVERABLE


def test_a_malformed_body_is_unrecoverable_names_the_type_and_leaves_nothing():
    host = MemoryHost(bank)
    host.handle([Deposited(ALICE, 1)])
    with pytest.raises(HandlerError) as raised:
        host.handle_bodies(2, encode_key(ALICE), [Deposited(ALICE, 1).encode(), b'{"account":42}'])
    assert raised.value.error_class is ErrorClass.UNRECOVERABLE
    assert "Deposited" in raised.value.message
    assert account(host, ALICE).deposits == 1
    with pytest.raises(HandlerError, match="AccountOpened"):
        bank.key(1, b"not json")
    with pytest.raises(HandlerError, match="AccountStatusChanged"):
        bank.ordering(5, b'{"account":1,"status":"asleep"}')


def test_combine_of_a_non_associative_type_is_unrecoverable():
    with pytest.raises(HandlerError, match="Withdrawn is not associative") as raised:
        bank.combine(3, [b'{"account":1,"amount":3}'])
    assert raised.value.error_class is ErrorClass.UNRECOVERABLE
