"""Timers in the test host (contract 0.5, `docs/timers.md`): a key's timers
fire in (time, name) order, all of one time in one call, at their place
among the key's events; a failed call's timer changes are taken back; and
the six timer rules are refused by id, as the host refuses them."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from wakuwaku_guest import Context, Event, Module, Refused, RetryableError, Timer, Timing, UnrecoverableError, on_timers
from wakuwaku_guest.limits import PayloadLimits
from wakuwaku_guest.testing import MemoryHost


@dataclass
class Tick(Event, tag=70, timing=Timing.TIMED, max_batch=1):
    """An event at `at`; it appends `e<at>` to its key's `seq` and sets the
    timers in `timers` (name, time), or cancels one with time -1."""

    key_: int
    at: int
    timers: list[tuple[str, int]]

    def key(self) -> int:
        return self.key_

    def event_time(self) -> int:
        return self.at


def append(ctx: Context, item: str) -> None:
    ctx.set("seq", [*(ctx.get("seq") or []), item])


class Ticks(Module):
    """Appends each event and each fired call to `seq`; a fired timer whose
    payload says so sets the next one."""

    def __init__(self) -> None:
        super().__init__("ticks")
        self.handles(Tick)(self.tick)

    def tick(self, ctx: Context, events: list[Tick]) -> None:
        for event in events:
            append(ctx, f"e{event.at}")
            for name, at in event.timers:
                if at < 0:
                    ctx.cancel_timer(name)
                else:
                    ctx.set_timer(name, at, {"from": event.at})

    @on_timers
    def fired(self, ctx: Context, timers: list[Timer]) -> None:
        append(ctx, "t" + ",".join(f"{timer.name}@{timer.at}" for timer in timers))
        for timer in timers:
            payload = timer.decode()
            if payload and payload.get("chain"):
                ctx.set_timer(timer.name, timer.at + payload["chain"], None)
            if payload and payload.get("fail"):
                raise RetryableError("not now")


def test_due_timers_fire_in_time_then_name_order_all_of_one_time_in_one_call():
    host = MemoryHost(Ticks())
    # Names compare as UTF-8 bytes: "B" (0x42) < "a" (0x61) < "\u00e9" (0xc3 0xa9).
    host.handle([Tick(1, 5, [("\u00e9", 20), ("a", 20), ("B", 20), ("z", 10)])])
    assert [timer.name for timer in host.timers(1)] == ["z", "B", "a", "\u00e9"]
    assert host.advance(20) == 1, "a timer at 20 is not due at clock 20: the clock is exclusive"
    assert host.advance(21) == 1
    assert host.get(1, "seq") == ["e5", "tz@10", "tB@20,a@20,\u00e9@20"]
    assert host.timers(1) == []
    assert host.advance(1_000) == 0


def test_setting_a_name_again_moves_the_timer_and_cancelling_a_missing_one_changes_nothing():
    host = MemoryHost(Ticks())
    host.handle([Tick(1, 5, [("end", 50), ("end", 30), ("none", -1)])])
    assert host.timers(1) == [Timer("end", 30, b'{"from":5}')]
    host.handle([Tick(1, 6, [("end", -1)])])
    assert host.timers(1) == []
    assert host.advance(100) == 0


def test_keys_fire_in_the_order_of_their_earliest_timer_then_of_their_bytes():
    host = MemoryHost(Orderly())
    host.handle([Tick(2, 1, [("x", 10)]), Tick(1, 1, [("x", 10)]), Tick(3, 1, [("x", 5)])])
    assert host.advance(11) == 3
    # A shared counter of calls tells which key fired when.
    assert [host.get(key, "nth") for key in (3, 1, 2)] == [1, 2, 3]


class Orderly(Ticks):
    @on_timers
    def fired(self, ctx: Context, timers: list[Timer]) -> None:
        ctx.counter_add("calls", 1)
        ctx.set("nth", ctx.counter_get("calls"))


class Chain(Ticks):
    """Each event sets `c` one past its time; each firing moves it 3 on."""

    def tick(self, ctx: Context, events: list[Tick]) -> None:
        for event in events:
            append(ctx, f"e{event.at}")
            ctx.set_timer("c", event.at + 1, None)

    @on_timers
    def fired(self, ctx: Context, timers: list[Timer]) -> None:
        append(ctx, "t" + ",".join(f"{timer.name}@{timer.at}" for timer in timers))
        ctx.set_timer("c", timers[0].at + 3, None)


def test_a_timer_set_below_the_clock_while_firing_fires_in_turn():
    host = MemoryHost(Chain())
    host.handle([Tick(1, 1, [])])
    assert host.advance(10) == 3
    assert host.get(1, "seq") == ["e1", "tc@2", "tc@5", "tc@8"]
    assert host.timers(1) == [Timer("c", 11, b"null")]


class Failing(Ticks):
    """Each event sets `f` one past its time, whose firing writes, then fails."""

    def tick(self, ctx: Context, events: list[Tick]) -> None:
        for event in events:
            append(ctx, f"e{event.at}")
            ctx.set_timer("f", event.at + 1, {"fail": True})


def test_a_failed_fire_call_is_taken_back_and_its_timers_stay_pending():
    host = MemoryHost(Failing())
    host.handle([Tick(1, 1, [])])
    before = host.timers(1)
    with pytest.raises(RetryableError, match="not now"):
        host.advance(100)
    assert host.timers(1) == before == [Timer("f", 2, b'{"fail":true}')]
    assert host.get(1, "seq") == ["e1"], "the failed call's write is gone"


def test_a_failed_handle_call_takes_back_its_timer_changes():
    host = MemoryHost(Failing())
    host.handle([Tick(1, 1, [])])
    module = Module("bad")

    @module.handles(Tick)
    def bad(ctx: Context, events: list[Tick]) -> None:
        ctx.cancel_timer("f")
        ctx.set_timer("new", 7, None)
        raise RetryableError("no")

    other = MemoryHost(module)
    other._timers = host._timers
    with pytest.raises(RetryableError):
        other.handle([Tick(1, 2, [])])
    assert other.timers(1) == [Timer("f", 2, b'{"fail":true}')]


def test_handle_in_time_fires_each_timer_after_the_events_of_its_time_and_before_later_ones():
    host = MemoryHost(Ticks())
    host.handle_in_time(
        [
            Tick(1, 30, []),
            Tick(1, 10, [("a", 20), ("b", 30)]),
            Tick(1, 20, []),
            Tick(1, 40, [("c", 45)]),
        ]
    )
    assert host.get(1, "seq") == ["e10", "e20", "ta@20", "e30", "tb@30", "e40"]
    assert host.timers(1) == [Timer("c", 45, b'{"from":40}')], "beyond the final clock (41): still pending"


def test_handle_in_time_matches_an_oracle_computed_by_sorting_over_seeded_runs():
    for seed in range(30):
        rng = random.Random(seed)
        ticks = []
        for _ in range(40):
            at = rng.randrange(0, 60)
            timers = [(rng.choice("pq"), at + rng.randrange(0, 15))] if rng.random() < 0.5 else []
            ticks.append(Tick(rng.randrange(3), at, timers))
        host = MemoryHost(Ticks())
        host.handle_in_time(ticks)
        assert {key: host.get(key, "seq") for key in host.keys()} == oracle(ticks), f"seed {seed}"


def oracle(ticks: list[Tick]) -> dict[int, list[str]]:
    """Each key's events in time order (ties as given), each timer firing
    after the events at or before its time: a timer set by an event at `s`
    for `t` is due at the clock of the first later event above `t`; a later
    set of the same name (by time order) moves it, if it has not fired."""
    clock = max(tick.at for tick in ticks) + 1
    result: dict[int, list[str]] = {}
    for key in sorted({tick.key_ for tick in ticks}):
        events = sorted((tick for tick in ticks if tick.key_ == key), key=lambda tick: tick.at)
        seq: list[str] = []
        pending: dict[str, int] = {}

        def fire_below(now: int) -> None:
            while True:
                due = sorted((at, name.encode()) for name, at in pending.items() if at < now)
                if not due:
                    return
                at = due[0][0]
                names = [name.decode() for time, name in due if time == at]
                seq.append("t" + ",".join(f"{name}@{at}" for name in names))
                for name in names:
                    del pending[name]

        for tick in events:
            fire_below(tick.at)
            seq.append(f"e{tick.at}")
            for name, at in tick.timers:
                pending[name] = at
        fire_below(clock)
        result[key] = seq
    return result


@dataclass
class Poke(Event, tag=1):
    user: int
    what: str
    size: int = 0

    def key(self) -> int:
        return self.user


# Does what each event's `what` says, to probe the rules.
rules = Module("rules")


@rules.handles(Poke)
def poke(ctx: Context, events: list[Poke]) -> None:
    for event in events:
        if event.what == "name":
            ctx.set_timer_bytes("x" * event.size, 1)
        elif event.what == "nul":
            ctx.set_timer_bytes("a\0b", 1)
        elif event.what == "payload":
            ctx.set_timer_bytes("p", 1, b"x" * event.size)
        elif event.what == "max-time":
            ctx.set_timer_bytes("m", (1 << 63) - 1)
        elif event.what == "many":
            for i in range(event.size):
                ctx.set_timer_bytes(f"n{i}", 1)
        elif event.what == "move":
            ctx.set_timer_bytes("n0", 2)
        elif event.what == "cancel-many":
            for _ in range(event.size):
                ctx.cancel_timer("c")
        elif event.what == "stash":
            stashed.append(ctx)


stashed: list[Context] = []


@rules.on_timers
def rules_fire(ctx: Context, timers: list[Timer]) -> None:
    ctx.set_timer_bytes("again", timers[0].at)


def refused(host: MemoryHost, poke: Poke) -> Refused:
    with pytest.raises(Refused) as raised:
        host.handle([poke])
    return raised.value


def test_timer_name_payload_and_time_are_refused_by_rule():
    host = MemoryHost(rules)
    assert refused(host, Poke(1, "name", 0)).rule == "timer-name"
    assert refused(host, Poke(1, "name", 129)).refusal.endswith("this one has 129 bytes")
    host.handle([Poke(1, "name", 128)])
    assert refused(host, Poke(1, "nul")).refusal.endswith("this one has a NUL at byte 1")
    big = refused(host, Poke(1, "payload", 1025))
    assert big.rule == "timer-payload-size" and str(big).startswith("unrecoverable: cannot set timer `p`: ")
    host.handle([Poke(1, "payload", 1024)])
    assert refused(host, Poke(1, "max-time")).rule == "timer-time"


def test_a_fire_call_sets_timers_only_later_than_the_ones_it_fires():
    host = MemoryHost(rules)
    host.handle([Poke(1, "payload", 0)])
    with pytest.raises(Refused) as raised:
        host.advance(5)
    assert raised.value.rule == "timer-at-firing"
    assert raised.value.refusal == (
        "timer-at-firing: timer `again` is set at 1 while the timers at 1 fire; a call that fires timers sets "
        "timers only later than them"
    )
    assert host.timers(1) == [Timer("p", 1, b"")], "the failed call's timer is pending again"


def test_timers_per_key_and_in_all_refuse_only_a_new_timer():
    host = MemoryHost(rules, limits=PayloadLimits(max_timers_per_key=3, max_timers=5))
    assert refused(host, Poke(1, "many", 4)).rule == "timers-per-key"
    assert host.timers(1) == [], "the failed call's timers are gone"
    host.handle([Poke(1, "many", 3)])
    host.handle([Poke(1, "move")])  # moving one at the quota is allowed
    assert [(timer.name, timer.at) for timer in host.timers(1)] == [("n1", 1), ("n2", 1), ("n0", 2)]
    host.handle([Poke(2, "many", 2)])
    in_all = refused(host, Poke(3, "many", 1))
    assert in_all.refusal == (
        "timers-in-all: a projection holds at most 5 timers (it holds 5); timer `n0` would be a new one"
    )


def test_set_and_cancel_count_as_state_writes():
    host = MemoryHost(rules, limits=PayloadLimits(max_state_writes_per_call=3))
    assert refused(host, Poke(1, "cancel-many", 4)).rule == "state-writes-per-call"
    host.handle([Poke(1, "cancel-many", 3)])
    assert refused(host, Poke(1, "many", 4)).rule == "state-writes-per-call"


def test_timers_are_refused_outside_a_call():
    stashed.clear()
    host = MemoryHost(rules)
    host.handle([Poke(1, "stash")])
    (ctx,) = stashed
    with pytest.raises(Refused, match="cannot set timer `x`: outside-handle: `timers` is only available while"):
        ctx.set_timer("x", 1)
    with pytest.raises(Refused, match="outside-handle"):
        ctx.timer("x")


def test_a_handler_method_may_not_take_the_name_of_a_call_the_host_makes():
    class Shadowing(Module):
        @on_timers
        def fire(self, ctx: Context, timers: list[Timer]) -> None:
            pass

    with pytest.raises(TypeError, match="the handler method `fire` would replace Module.fire"):
        Shadowing()


def test_a_timer_payload_that_does_not_decode_names_the_timer():
    with pytest.raises(UnrecoverableError, match="the payload of timer `t` is not a valid int"):
        Timer("t", 1, b'"x"').decode(int)
    assert Timer("t", 1, b'{"a":1}').decode() == {"a": 1}


def test_a_time_that_is_no_s64_is_refused_before_the_host():
    stashed.clear()
    MemoryHost(rules).handle([Poke(1, "stash")])
    with pytest.raises(UnrecoverableError, match="cannot set timer `x` at 9223372036854775808: the time is not an s64"):
        stashed[0].set_timer("x", 1 << 63)
