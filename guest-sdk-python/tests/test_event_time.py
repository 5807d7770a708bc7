"""Event time: the declaration checked when a type is made, the module's
``event_time`` as the host asks it, and the test host applying events in
event-time order as the host does."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from wakuwaku_guest import Context, Event, Module, Timing, UnrecoverableError
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
