"""Windows of every kind over clicks, for the host's tests
(`tests/tests/all/python.rs`): each click joins its key's tumbling,
hopping and session windows and a tumbling window with an allowed
lateness; each window's total is emitted to `totals` when the clock passes
its close. Late clicks (beyond the allowance) are listed in the key's
`late` entry."""

from dataclasses import dataclass

from wakuwaku_guest import Context, Event, Module, Timer, Timing, export
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


@dataclass
class Total(Event, tag=2):
    """A closed window's total; `kind` names the windows (0 tumbling, 1
    hopping, 2 sessions, 3 tumbling with lateness)."""

    kind: int
    user: int
    start: int
    end: int
    total: int

    def key(self) -> int:
        return self.user


class Sum(Aggregate[Click, int]):
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


WINDOWS = (
    Windows("tumbling", Tumbling(60_000), Sum(0), topic="totals"),
    Windows("hopping", Hopping(60_000, 20_000), Sum(1), topic="totals"),
    Windows("sessions", Session(15_000), Sum(2), topic="totals"),
    Windows("lenient", Tumbling(60_000), Sum(3), topic="totals", lateness=30_000),
)

clicks = Module("clickwindows", emits=["totals"])


@clicks.handles(Click)
def clicked(ctx: Context, events: list[Click]) -> None:
    for click in events:
        for windows in WINDOWS:
            if windows.add(ctx, click.at, click).late:
                ctx.set("late", [*(ctx.get("late") or []), [windows.name, click.at]])


@clicks.on_timers
def fired(ctx: Context, timers: list[Timer]) -> None:
    for windows in WINDOWS:
        windows.fire(ctx, timers)


Handler = export(clicks)
