"""The test host: the byte path, runs and chunks, reduction, rollback of a
failed call, and the host's refusals with the host's messages."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from wakuwaku_guest import (
    Algebra,
    Context,
    ErrorClass,
    Event,
    Level,
    Module,
    Outgoing,
    Ordering,
    Refused,
    RetryableError,
    UnrecoverableError,
    encode_key,
)
from wakuwaku_guest.limits import I64_MAX, PayloadLimits
from wakuwaku_guest.testing import LogLine, MemoryHost


@dataclass
class Added(Event, tag=1, algebra=Algebra.ASSOCIATIVE, max_batch=2):
    user: int
    amount: int

    def key(self) -> int:
        return self.user

    @classmethod
    def combine(cls, events: list[Added]) -> Added:
        return Added(events[0].user, sum(event.amount for event in events))


@dataclass
class Tagged(Event, tag=2, algebra=Algebra.IDEMPOTENT_COMMUTATIVE):
    user: int
    label: str

    def key(self) -> tuple[int, str]:
        return (self.user, "labels")


@dataclass
class Command(Event, tag=3):
    user: int
    op: str
    arg: int = 0

    def key(self) -> int:
        return self.user


ledger = Module("ledger", emits=["audit"])
calls: list[tuple[str, object, list]] = []


@ledger.handles(Added)
def added(ctx: Context, events: list[Added]) -> None:
    calls.append(("Added", ctx.key, [event.amount for event in events]))
    ctx.set("total", (ctx.get("total") or 0) + sum(event.amount for event in events))
    ctx.counter_add("adds", len(events))


@ledger.handles(Tagged)
def tagged(ctx: Context, events: list[Tagged]) -> None:
    calls.append(("Tagged", ctx.key, [event.label for event in events]))


stashed: list[Context] = []


@ledger.handles(Command)
def command(ctx: Context, events: list[Command]) -> None:
    for event in events:
        if event.op == "fail-after-writes":
            ctx.set("total", -1)
            ctx.counter_add("adds", 100)
            ctx.emit("audit", Added(event.user, 1))
            raise RetryableError("busy")
        if event.op == "emit":
            ctx.emit("audit", Added(event.user, event.arg))
        if event.op == "emit-elsewhere":
            ctx.emit("elsewhere", Added(event.user, 1))
        if event.op == "set-big":
            ctx.set_bytes("big", b"x" * event.arg)
        if event.op == "counter":
            ctx.counter_add("c", event.arg)
        if event.op == "new-counter":
            ctx.counter_add(f"n{event.arg}", 1)
        if event.op == "new-entry":
            ctx.set(f"e{event.arg}", event.arg)
        if event.op == "read-counter":
            ctx.set("seen", ctx.counter_get("c"))
        if event.op == "log":
            for n in range(event.arg):
                ctx.info(f"line {n} " + "x" * 10)
        if event.op == "ignore-refusal":
            try:
                ctx.set_bytes("big", b"x" * 30)
            except Refused as refusal:
                ctx.set("refused", refusal.rule)
        if event.op == "stash":
            stashed.append(ctx)
        if event.op == "bug":
            raise KeyError("no such thing")


@pytest.fixture(autouse=True)
def fresh():
    calls.clear()
    stashed.clear()


def small() -> PayloadLimits:
    return PayloadLimits(max_state_value=8, max_log_line=8, max_log_lines_per_call=2)


def test_runs_of_one_type_and_key_are_cut_into_chunks_of_max_batch():
    host = MemoryHost(ledger)
    host.handle([Added(1, 1), Added(1, 2), Added(1, 3), Added(2, 4), Added(1, 5)])
    assert calls == [("Added", 1, [1, 2]), ("Added", 1, [3]), ("Added", 2, [4]), ("Added", 1, [5])]
    assert host.get(1, "total") == 11
    assert host.counter("adds") == 5
    assert host.keys() == [1, 2]


def test_reduced_runs_are_folded_sorted_and_deduplicated():
    host = MemoryHost(ledger)
    host.handle_reduced([Added(1, 1), Added(1, 2), Added(1, 3), Tagged(1, "b"), Tagged(1, "a"), Tagged(1, "b")])
    assert calls == [("Added", 1, [6]), ("Tagged", (1, "labels"), ["a", "b"])]
    assert host.counter("adds") == 1, "the folded run is one event to the handler"


def test_a_failed_call_leaves_no_trace_but_its_log_lines():
    host = MemoryHost(ledger)
    host.handle([Added(1, 5), Command(1, "emit", 2)])
    with pytest.raises(RetryableError, match="busy"):
        host.handle([Command(1, "log", 1), Command(1, "fail-after-writes")])
    assert host.get(1, "total") == 5
    assert host.counter("adds") == 1
    assert host.emitted == [Outgoing("audit", 1, encode_key(1), Ordering.RELAXED, Algebra.ASSOCIATIVE, b'{"user":1,"amount":2}')]
    assert host.emitted[0].decode(Added) == Added(1, 2)
    assert [line.message for line in host.logs] == ["line 0 xxxxxxxxxx"]


def test_an_exception_that_is_no_handler_error_propagates_and_rolls_back():
    host = MemoryHost(ledger)
    with pytest.raises(KeyError):
        host.handle([Added(1, 5), Command(1, "bug")])
    assert host.get(1, "total") == 5


def test_values_over_the_limits_are_refused_with_the_hosts_message():
    host = MemoryHost(ledger, limits=small())
    with pytest.raises(Refused) as raised:
        host.handle([Command(1, "set-big", 9)])
    assert raised.value.message == (
        "cannot write state entry `big`: state-value-size: state value `big` has 9 bytes, over the limit of 8 bytes"
    )
    assert raised.value.rule == "state-value-size"
    assert raised.value.error_class is ErrorClass.UNRECOVERABLE
    with pytest.raises(
        Refused,
        match=r"cannot emit Added to `elsewhere`: emit-topic: `elsewhere` is not among the topics the module "
        r"declared in `module-info.emits` \(audit\)",
    ):
        host.handle([Command(1, "emit-elsewhere")])
    assert host.emitted == []


def test_a_refusal_may_be_caught_and_the_call_still_succeeds():
    host = MemoryHost(ledger, limits=PayloadLimits(max_state_value=20))
    host.handle([Command(1, "ignore-refusal")])
    assert host.get(1, "refused") == "state-value-size"
    assert host.get_bytes(1, "big") is None


def test_counters_stay_in_the_s64_range():
    host = MemoryHost(ledger)
    host.handle([Command(1, "counter", I64_MAX)])
    with pytest.raises(
        Refused, match="cannot add 1 to counter `c`: counter-range: counter `c` is 9223372036854775807 as this key"
    ):
        host.handle([Command(2, "counter", 1)])
    host.handle([Command(2, "read-counter")])
    assert host.get(2, "seen") == I64_MAX
    with pytest.raises(UnrecoverableError, match="cannot add 9223372036854775808 to counter `c`: the delta is not an s64"):
        host.handle([Command(2, "counter", I64_MAX + 1)])


def test_new_counters_and_entries_stop_at_the_hosts_quotas_and_existing_ones_still_change():
    host = MemoryHost(ledger, limits=PayloadLimits(max_counters=2, max_entries_per_key=2))
    host.handle([Command(1, "new-entry", 1), Command(1, "new-entry", 2)])
    with pytest.raises(Refused) as raised:
        host.handle([Command(1, "new-entry", 3)])
    assert raised.value.rule == "entries-per-key"
    assert "this key holds 2 entries" in raised.value.message
    host.handle([Command(1, "new-entry", 2), Command(2, "new-entry", 3)])
    assert host.get(2, "e3") == 3, "another key has room of its own"
    host.handle([Command(1, "new-counter", 1), Command(2, "new-counter", 2), Command(1, "new-counter", 1)])
    with pytest.raises(Refused, match="counter-count: the projection holds 2 counters"):
        host.handle([Command(1, "new-counter", 3)])
    assert host.counter("n1") == 2


def test_log_lines_are_cut_and_past_the_limit_counted():
    host = MemoryHost(ledger, limits=small())
    host.handle([Command(7, "log", 4)])
    assert host.logs == [
        LogLine(7, Level.INFO, "line 0 x […cut]"),
        LogLine(7, Level.INFO, "line 1 x […cut]"),
        LogLine(7, Level.WARN, "log-lines-per-call: 2 more log lines of this call dropped (at most 2 per call)"),
    ]


def test_the_host_refuses_calls_once_handle_returned():
    host = MemoryHost(ledger)
    host.handle([Command(1, "stash")])
    (ctx,) = stashed
    with pytest.raises(
        Refused, match="cannot write state entry `late`: outside-handle: `state` is only available while `handle` or `fire` runs"
    ):
        ctx.set("late", 1)
    with pytest.raises(Refused, match="outside-handle: `emit`"):
        ctx.emit("audit", Added(1, 1))
    ctx.info("dropped: logging never fails")
    assert host.entries(1) == {}


def test_state_can_be_seeded_and_read_as_a_type():
    @dataclass
    class Total:
        value: int

    host = MemoryHost(ledger)
    host.set(1, "total", 10)
    host.handle([Added(1, 5)])
    assert host.get(1, "total") == 15
    host.set((1, "labels"), "t", Total(3))
    assert host.get((1, "labels"), "t", Total) == Total(3)
    assert host.get(2, "total") is None
