"""Event time: the declaration checked when a type is made, the module's
``event_time`` as the host asks it, and the test host applying events in
event-time order as the host does."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from wakuwaku_guest import Context, Event, Module, Ordering, Timing, UnrecoverableError
from wakuwaku_guest.testing import MemoryHost


@dataclass
class Shipped(Event, tag=1, timing=Timing.TIMED):
    product: int
    at: int | None

    def key(self) -> int:
        return self.product

    def event_time(self) -> int | None:
        return self.at


@dataclass
class Received(Event, tag=2, timing=Timing.TIMED):
    product: int
    at: int

    def key(self) -> int:
        return self.product

    def event_time(self) -> int:
        return self.at


@dataclass
class Renamed(Event, tag=3):
    product: int
    name: str

    def key(self) -> int:
        return self.product


stock = Module("stock")


@stock.handles(Shipped, Received, Renamed)
def applied(ctx: Context, events: list[Event]) -> None:
    seen = ctx.get("seen", list) or []
    seen.extend(type(event).__name__ + ":" + str(getattr(event, "at", "-")) for event in events)
    ctx.set("seen", seen)


def test_a_type_declares_its_timing_and_a_timed_one_must_say_when():
    assert (Shipped.TIMING, Renamed.TIMING) == (Timing.TIMED, Timing.UNTIMED)
    assert [t.timing for t in stock.describe().event_types] == [Timing.TIMED, Timing.TIMED, Timing.UNTIMED]
    with pytest.raises(TypeError, match="is timed but does not define event_time"):

        @dataclass
        class Forgot(Event, tag=4, timing=Timing.TIMED):
            product: int

            def key(self) -> int:
                return self.product

    with pytest.raises(TypeError, match="is not a Timing"):

        @dataclass
        class Wrong(Event, tag=5, timing="timed"):
            product: int

            def key(self) -> int:
                return self.product


def test_the_module_answers_event_time_for_timed_types_only():
    assert stock.event_time(1, Shipped(7, 1796212800000).encode()) == 1796212800000
    assert stock.event_time(3, b"not read at all") is None
    with pytest.raises(UnrecoverableError, match="event-time-declared: Shipped declares event time"):
        stock.event_time(1, Shipped(7, None).encode())


def test_the_test_host_applies_timed_events_in_event_time_order_untimed_ones_as_they_come():
    host = MemoryHost(stock)
    host.handle_in_event_time_order(
        [Shipped(7, 30), Received(7, 10), Renamed(7, "new"), Shipped(7, 20), Received(7, 20), Shipped(8, 5)]
    )
    # Ties (20) keep the order given; the untimed rename comes first.
    assert host.get(7, "seen", list) == ["Renamed:-", "Received:10", "Shipped:20", "Received:20", "Shipped:30"]
    assert host.get(8, "seen", list) == ["Shipped:5"]


def test_a_timed_event_without_a_time_is_refused_before_anything_is_applied():
    host = MemoryHost(stock)
    with pytest.raises(UnrecoverableError, match="event-time-declared"):
        host.handle_in_event_time_order([Received(7, 1), Shipped(7, None)])
    assert host.get(7, "seen") is None


@dataclass
class Returned(Event, tag=4, timing=Timing.TIMED_RELAXED):
    product: int
    at: int

    def key(self) -> int:
        return self.product

    def event_time(self) -> int:
        return self.at


@dataclass
class Inspected(Event, tag=5, timing=Timing.TIMED_RELAXED):
    product: int
    at: int

    def key(self) -> int:
        return self.product

    def event_time(self) -> int:
        return self.at


returns = Module("returns")


@returns.handles(Shipped, Received, Returned, Inspected)
def noted(ctx: Context, events: list[Event]) -> None:
    seen = ctx.get("seen", list) or []
    seen.extend(type(event).__name__[0] + "@" + str(event.at) for event in events)
    ctx.set("seen", seen)


def test_a_keys_relaxed_timed_types_reach_the_handler_in_event_time_order():
    # As two topics hand them: every shipment, then every receipt.
    host = MemoryHost(returns)
    host.handle_in_event_time_order([Shipped(7, 1), Shipped(7, 3), Shipped(7, 4), Received(7, 2), Received(7, 5)])
    assert host.get(7, "seen", list) == ["S@1", "R@2", "S@3", "S@4", "R@5"]


def test_declared_timed_relaxed_a_types_events_form_one_run_and_move_past_the_others():
    assert Timing.TIMED_RELAXED.is_timed and not Timing.UNTIMED.is_timed
    assert returns.event_time(4, Returned(7, 9).encode()) == 9
    host = MemoryHost(returns)
    host.handle_in_event_time_order([Returned(7, 1), Returned(7, 3), Inspected(7, 2), Inspected(7, 4)])
    assert host.get(7, "seen", list) == ["R@1", "R@3", "I@2", "I@4"]
    # A relaxed-timed type never fences the key's timed types either.
    host = MemoryHost(returns)
    host.handle_in_event_time_order([Shipped(8, 1), Returned(8, 2), Shipped(8, 3)])
    assert host.get(8, "seen", list) == ["S@1", "S@3", "R@2"]


def test_the_test_host_plans_as_the_host_does():
    from wakuwaku_guest.testing import _planned_runs

    A, B, C = Shipped, Received, Returned
    R, ACQ, REL, AR = Ordering.RELAXED, Ordering.ACQUIRE, Ordering.RELEASE, Ordering.ACQ_REL
    # The ordering page's worked example, one key: opened, deposited,
    # withdrawn, deposited, closed, opened, deposited.
    assert _planned_runs([(A, ACQ), (B, R), (C, R), (B, R), (A, REL), (A, ACQ), (B, R)]) == [
        [0], [1, 3], [2], [4], [5], [6]
    ]
    # Relaxed joins the head run of its type; and the tail run.
    assert _planned_runs([(B, R), (A, ACQ), (B, R), (A, R)]) == [[0], [1, 3], [2]]
    assert _planned_runs([(A, R), (B, R), (A, REL), (B, R)]) == [[1], [0, 2], [3]]
    # Release on the head type with others: a segment of its own.
    assert _planned_runs([(A, ACQ), (B, R), (A, REL)]) == [[0], [1], [2]]
    assert _planned_runs([(A, ACQ), (A, REL), (B, R)]) == [[0, 1], [2]]
    assert _planned_runs([(A, AR), (B, R), (B, REL)]) == [[0], [1, 2]]
