"""Modules: handlers as functions or methods, tags checked at registration,
and the WIT `handler` interface over bytes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from wakuwaku_guest import (
    Algebra,
    Context,
    Event,
    EventTypeInfo,
    Module,
    ModuleInfo,
    Ordering,
    UnrecoverableError,
    encode_key,
    handles,
)
from wakuwaku_guest.testing import MemoryHost


@dataclass
class Pinged(Event, tag=1):
    user: int

    def key(self) -> int:
        return self.user


@dataclass
class Summed(Event, tag=2, algebra=Algebra.ASSOCIATIVE, max_batch=16):
    user: int
    amount: int

    def key(self) -> int:
        return self.user

    def ordering(self) -> Ordering:
        return Ordering.RELEASE if self.amount < 0 else Ordering.RELAXED

    @classmethod
    def combine(cls, events: list[Summed]) -> Summed:
        return Summed(events[0].user, sum(event.amount for event in events))


def test_functions_and_methods_both_register_handlers():
    functions = Module("functions", emits=["out"])

    @functions.handles(Pinged)
    def pinged(ctx: Context, events: list[Pinged]) -> None:
        ctx.set("pings", len(events))

    class Methods(Module):
        @handles(Pinged)
        def pinged(self, ctx: Context, events: list[Pinged]) -> None:
            ctx.set("pings", len(events) * self.factor)

        factor = 10

    for module, expected in [(functions, 2), (Methods(), 20)]:
        host = MemoryHost(module)
        host.handle([Pinged(1), Pinged(1)])
        assert host.get(1, "pings") == expected
    assert Methods().name == "Methods"
    assert functions.describe() == ModuleInfo((EventTypeInfo(1, "Pinged", Algebra.NON_ASSOCIATIVE, 256),), ("out",))


def test_one_handler_may_handle_several_types():
    module = Module("both")
    seen = []

    @module.handles(Pinged, Summed)
    def either(ctx: Context, events: list[Event]) -> None:
        seen.append([type(event).__name__ for event in events])

    MemoryHost(module).handle([Pinged(1), Summed(1, 2)])
    assert seen == [["Pinged"], ["Summed"]]
    assert [t.tag for t in module.describe().event_types] == [1, 2]


def test_two_event_types_with_one_tag_fail_the_import():
    @dataclass
    class Other(Event, tag=1):
        id: int

        def key(self) -> int:
            return self.id

    module = Module("clash")
    module.handles(Pinged)(lambda ctx, events: None)
    with pytest.raises(TypeError, match="event types Pinged and Other have the same tag 1"):
        module.handles(Other)(lambda ctx, events: None)


def test_registration_refuses_what_is_not_an_event_type():
    module = Module("m")
    with pytest.raises(TypeError, match="not an event type"):
        module.handles(int)
    with pytest.raises(TypeError, match="at least one event type"):
        module.handles()

    class NotData(Event, tag=3):
        def key(self) -> int:
            return 1

    with pytest.raises(TypeError, match="NotData is not a dataclass and does not define decode and encode"):
        module.handles(NotData)


@pytest.mark.parametrize(
    ("emits", "words"),
    [(["retry_accounts"], "emit-topic-host-owned"), (["a b"], "emit-topic-name"), (["a", "a"], "emit-topic-duplicate")],
)
def test_bad_emit_topics_fail_the_module(emits, words):
    with pytest.raises(TypeError, match=words):
        Module("m", emits=emits)


def test_describe_needs_an_event_type():
    with pytest.raises(ValueError, match="event-type-count"):
        Module("empty").describe()


def module_of_both() -> Module:
    module = Module("both")
    module.handles(Pinged, Summed)(lambda ctx, events: None)
    return module


def test_key_ordering_and_combine_over_bytes():
    module = module_of_both()
    assert module.key(2, b'{"user": 42, "amount": 1}') == encode_key(42)
    assert module.ordering(2, b'{"user": 42, "amount": -1}') is Ordering.RELEASE
    assert module.ordering(1, b'{"user": 42}') is Ordering.RELAXED
    bodies = [Summed(4, amount).encode() for amount in (1, 2, 3)]
    assert Summed.decode(module.combine(2, bodies)) == Summed(4, 6)
    with pytest.raises(UnrecoverableError, match="combine of no Summed events"):
        module.combine(2, [])
    with pytest.raises(UnrecoverableError, match="Pinged is not associative"):
        module.combine(1, [Pinged(1).encode()])


def test_an_unknown_tag_is_unrecoverable_and_named():
    module = module_of_both()
    for call in (
        lambda: module.key(99, b"{}"),
        lambda: module.ordering(99, b"{}"),
        lambda: module.combine(99, [b"{}"]),
        lambda: MemoryHost(module).handle_bodies(99, encode_key(1), [b"{}"]),
    ):
        with pytest.raises(UnrecoverableError, match="module both has no event type with tag 99"):
            call()


def test_combine_must_return_its_own_type():
    @dataclass
    class Sloppy(Event, tag=5, algebra=Algebra.ASSOCIATIVE):
        id: int

        def key(self) -> int:
            return self.id

        @classmethod
        def combine(cls, events):
            return events[0].id

    module = Module("sloppy")
    module.handles(Sloppy)(lambda ctx, events: None)
    with pytest.raises(UnrecoverableError, match="Sloppy.combine returned a int, not a Sloppy"):
        module.combine(5, [Sloppy(1).encode(), Sloppy(1).encode()])
