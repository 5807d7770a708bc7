"""Each window kind in the test host against an oracle computed by
sorting, over seeded runs; events handed over as the host hands them (the
clock moved to each event's time first, so the timers below it fire before
it), and the allowed lateness. The same scenarios as the Rust SDK's
`guest-sdk/src/windows.rs` tests."""

from __future__ import annotations

import random
from dataclasses import dataclass

from wakuwaku_guest import Context, Event, Module, Timer, Timing
from wakuwaku_guest.testing import MemoryHost
from wakuwaku_guest.windows import Aggregate, Hopping, Session, Tumbling, Window, Windows


@dataclass
class Click(Event, tag=1, timing=Timing.TIMED, max_batch=1):
    user: int
    at: int
    amount: int

    def key(self) -> int:
        return self.user

    def event_time(self) -> int:
        return self.at


@dataclass(order=True, frozen=True)
class Total(Event, tag=2):
    """A closed window's total, `kind` naming the windows."""

    kind: int
    user: int
    start: int
    end: int
    total: int

    def key(self) -> int:
        return self.user


class Sum(Aggregate[Click, int]):
    """Sums the amounts; `kind` names the windows in the result."""

    state_type = int

    def __init__(self, kind: int) -> None:
        self.kind = kind

    def initial(self) -> int:
        return 0

    def add(self, state: int, event: Click) -> int:
        return state + event.amount

    def merge(self, state: int, other: int) -> int:
        return state + other

    def result(self, key, window: Window, state: int) -> Total:
        return Total(self.kind, key, window.start, window.end, state)


TUMBLING = Windows("tumbling", Tumbling(10), Sum(0), topic="totals")
HOPPING = Windows("hopping", Hopping(10, 5), Sum(1), topic="totals")
SESSIONS = Windows("sessions", Session(5), Sum(2), topic="totals")
# Tumbling windows kept open 5 ms past their end.
LENIENT = Windows("lenient", Tumbling(10), Sum(3), topic="totals", lateness=5)

clicks_module = Module("clicks", emits=["totals"])


@clicks_module.handles(Click)
def clicked(ctx: Context, events: list[Click]) -> None:
    for click in events:
        TUMBLING.add(ctx, click.at, click)
        HOPPING.add(ctx, click.at, click)
        SESSIONS.add(ctx, click.at, click)
        if LENIENT.add(ctx, click.at, click).late:
            ctx.set("late", [*(ctx.get("late") or []), click.at])


@clicks_module.on_timers
def fired(ctx: Context, timers: list[Timer]) -> None:
    for windows in (TUMBLING, HOPPING, SESSIONS, LENIENT):
        windows.fire(ctx, timers)


def totals(host: MemoryHost) -> list[Total]:
    return sorted(message.decode(Total) for message in host.emitted)


def seeded_clicks(seed: int, count: int) -> list[Click]:
    """Seeded clicks of 3 keys in time order, several of one time."""
    rng = random.Random(seed)
    at = 0
    clicks = []
    for _ in range(count):
        at += rng.randrange(5)
        clicks.append(Click(rng.randrange(3), at, rng.randrange(100)))
    return clicks


def oracle(clicks: list[Click]) -> list[Total]:
    """The totals sorting gives: each key's events sorted by time, put in
    the windows of each kind, those closing below the final clock."""
    clock = max(click.at for click in clicks) + 1
    sums: dict[tuple[int, int, int, int], int] = {}

    def add(kind: int, user: int, start: int, end: int, amount: int) -> None:
        sums[(kind, user, start, end)] = sums.get((kind, user, start, end), 0) + amount

    for click in clicks:
        tumbling = click.at // 10 * 10
        add(0, click.user, tumbling, tumbling + 10, click.amount)
        add(3, click.user, tumbling, tumbling + 10, click.amount)
        hop = click.at // 5 * 5
        for start in (hop - 5, hop):
            add(1, click.user, start, start + 10, click.amount)
    for user in {click.user for click in clicks}:
        session: list[int] | None = None  # start, last, total
        for click in sorted((c for c in clicks if c.user == user), key=lambda c: c.at):
            if session is not None and click.at < session[1] + 5:
                session = [session[0], click.at, session[2] + click.amount]
                continue
            if session is not None:
                add(2, user, session[0], session[1] + 5, session[2])
            session = [click.at, click.at, click.amount]
        if session is not None:
            add(2, user, session[0], session[1] + 5, session[2])
    lateness = {3: 5}
    return sorted(
        Total(kind, user, start, end, total)
        for (kind, user, start, end), total in sums.items()
        if end - 1 + lateness.get(kind, 0) < clock
    )


def test_tumbling_hopping_and_session_windows_emit_what_sorting_gives():
    for seed in range(20):
        clicks = seeded_clicks(seed, 60)
        host = MemoryHost(clicks_module)
        host.handle_in_time(clicks)
        assert totals(host) == oracle(clicks), f"seed {seed}"
        assert host.counter("lenient/late") == 0, f"seed {seed}: in order, nothing is late"
        kinds = {total.kind for total in totals(host)}
        assert kinds == {0, 1, 2, 3}, f"seed {seed}: every kind closed windows"


def test_a_late_event_within_the_allowance_joins_its_window_and_one_beyond_it_is_counted_and_handed_back():
    host = MemoryHost(clicks_module)
    for click, clock in [(Click(1, 1, 1), 1), (Click(1, 12, 10), 12), (Click(1, 8, 100), 12), (Click(1, 20, 1000), 20)]:
        host.advance(clock)
        host.handle([click])
    # [0, 10) closed at 14 (9 + 5) when the clock reached 20, with the late
    # click at 8 in it.
    assert [total for total in totals(host) if total.kind == 3] == [Total(3, 1, 0, 10, 101)]
    # Beyond it: counted, handed back, in no window.
    host.handle([Click(1, 3, 5)])
    assert host.counter("lenient/late") == 1
    assert host.get(1, "late") == [3]
    # The kinds without an allowance count it too (tumbling counted the click
    # at 8 already; hopping put that one in [5, 15), sessions in [8, 17)),
    # and none opens a window for it.
    assert [host.counter(f"{name}/late") for name in ("tumbling", "hopping", "sessions")] == [2, 1, 1]
    emitted = len(host.emitted)
    host.advance(100)
    assert [total for total in totals(host) if total.kind == 3 and total.start == 0] == [Total(3, 1, 0, 10, 101)]
    assert all(total.start > 3 for total in sorted(m.decode(Total) for m in host.emitted[emitted:]))


def test_windows_keep_the_rust_sdks_state_layout():
    host = MemoryHost(clicks_module)
    host.handle([Click(1, 3, 7)])
    assert host.get(1, "tumbling/open") == {"0": [10, 7]}
    assert host.get(1, "hopping/open") == {"-5": [5, 7], "0": [10, 7]}
    assert host.get(1, "sessions/open") == {"3": [8, 7]}
    assert [(timer.name, timer.at) for timer in host.timers(1)] == [
        ("hopping/-5", 4),
        ("sessions/3", 7),
        ("hopping/0", 9),
        ("tumbling/0", 9),
        ("lenient/0", 14),
    ]
    host.advance(10)
    assert host.get(1, "tumbling/open") == {}
    assert host.get(1, "tumbling/closed") == 9


def test_a_bridging_event_merges_two_sessions_into_one():
    host = MemoryHost(clicks_module)
    host.handle([Click(1, 0, 1), Click(1, 8, 2)])
    assert host.get(1, "sessions/open") == {"0": [5, 1], "8": [13, 2]}
    host.handle([Click(1, 4, 4)])
    assert host.get(1, "sessions/open") == {"0": [13, 7]}
    assert [timer.name for timer in host.timers(1) if timer.name.startswith("sessions/")] == ["sessions/0"]
    host.advance(13)
    assert [total for total in totals(host) if total.kind == 2] == [Total(2, 1, 0, 13, 7)]
