"""Windows over a key's events, built on timers: tumbling, hopping and
session windows with an aggregate the author writes, an allowed lateness,
and each window's result emitted to a topic when it closes.

The Python counterpart of the Rust SDK's ``wakuwaku_guest::windows``, with
the same rules and the same state layout, so a key's windows read the same
whichever SDK wrote them (``docs/timers.md``, "Windows", says them for
authors):

- **A window is ``[start, end)`` in event time.** :class:`Tumbling`
  windows of ``size`` start at multiples of ``size``; :class:`Hopping`
  windows of ``size`` start every ``hop`` (an event is in each of the
  ``size / hop`` windows that hold its time); a :class:`Session` holds
  events less than ``gap`` apart and ends ``gap`` after its last event (an
  event that bridges two sessions merges them, with
  :meth:`Aggregate.merge`).
- **A window closes when the clock passes its end and the allowance**:
  its timer is set at ``end - 1 + lateness``, so it fires after every event
  of the key up to that time (the host's rule for timers), then
  :meth:`Windows.fire` emits :meth:`Aggregate.result` to the topic and
  forgets the window. An event read late but within the allowance (the
  host applies late events at once) still joins its window.
- **Late beyond the allowance**: an event whose every window closed is
  added to none; it is counted (the counter ``<name>/late``) and handed
  back to the author (:attr:`Placed.late`).
- **Kept in the key's state**: the open windows and their aggregates in
  the JSON entry ``<name>/open`` (``{"<start>": [end, aggregate]}``), the
  latest close time fired in ``<name>/closed``; one timer per open window,
  named ``<name>/<start>``. A handler declares ``max_batch=1`` for the
  windowed type (as timers fall exactly between events only so).

::

    class Spent(Aggregate):
        def initial(self) -> int:
            return 0

        def add(self, total: int, paid: Paid) -> int:
            return total + paid.amount

        def merge(self, total: int, other: int) -> int:
            return total + other

        def result(self, key, window: Window, total: int) -> Spending:
            return Spending(key, window.start, window.end, total)

    # Windows of 5 minutes, kept open 30 s past their end for late events.
    SPENT = Windows("spent", Tumbling(300_000), Spent(), topic="spending", lateness=30_000)

    @shop.handles(Paid)
    def paid(ctx: Context, events: list[Paid]) -> None:
        for event in events:
            if SPENT.add(ctx, event.at, event).late:
                ctx.warn("a payment after its window closed")

    @shop.on_timers
    def fire(ctx: Context, timers: list[Timer]) -> None:
        SPENT.fire(ctx, timers)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from . import codec
from .context import Context, Timer
from .event import Event
from .key import KeyValue
from .limits import I64_MAX, I64_MIN

__all__ = ["Aggregate", "Hopping", "Placed", "Session", "Tumbling", "Window", "WindowKind", "Windows"]

S = TypeVar("S")
E = TypeVar("E")


@dataclasses.dataclass(frozen=True, order=True)
class Window:
    """One window: ``[start, end)`` in event time (ms since the epoch)."""

    #: Its first time.
    start: int
    #: One past its last time.
    end: int


@dataclasses.dataclass(frozen=True)
class Tumbling:
    """Windows of ``size`` ms, one after another, starting at multiples of
    ``size``."""

    size: int


@dataclasses.dataclass(frozen=True)
class Hopping:
    """Windows of ``size`` ms starting every ``hop`` ms (``hop`` divides
    ``size``)."""

    size: int
    hop: int


@dataclasses.dataclass(frozen=True)
class Session:
    """Runs of events less than ``gap`` ms apart; a session ends ``gap``
    after its last event."""

    gap: int


#: What kind of windows.
WindowKind = Tumbling | Hopping | Session


@dataclasses.dataclass(frozen=True)
class Placed:
    """Where :meth:`Windows.add` put an event."""

    #: The windows it joined, by start; none if it is late.
    windows: tuple[Window, ...]

    @property
    def late(self) -> bool:
        """Whether it joined no window: every window of its time closed
        (beyond the allowed lateness). Counted; the author decides what
        else to do with it."""
        return not self.windows


class Aggregate(Generic[E, S]):
    """What the author writes: a window's first aggregate, how an event
    joins it, how two sessions' aggregates merge, and the result emitted
    when it closes. Aggregates are kept in the key's state as JSON; set
    ``state_type`` (a dataclass, a builtin or typing form) to read them
    back as that type."""

    #: The type aggregates are read back as from JSON (``Any``: plain JSON).
    state_type: Any = Any

    def initial(self) -> S:
        """The aggregate of a window no event joined yet."""
        raise NotImplementedError

    def add(self, state: S, event: E) -> S:
        """``state`` with ``event`` added."""
        raise NotImplementedError

    def merge(self, state: S, other: S) -> S:
        """``state`` and ``other`` merged (sessions an event bridges)."""
        raise NotImplementedError

    def result(self, key: KeyValue, window: Window, state: S) -> Event:
        """What the closed ``window`` of ``key`` emits."""
        raise NotImplementedError


_START = re.compile(r"[+-]?[0-9]+", re.ASCII)


def _saturate(value: int) -> int:
    return max(I64_MIN, min(I64_MAX, value))


class Windows(Generic[E, S]):
    """Windows named ``name`` (their state entries and timers start with
    it) of ``kind``, aggregated by ``aggregate``, each kept open
    ``lateness`` ms past its end, their results emitted to ``topic``."""

    def __init__(
        self, name: str, kind: WindowKind, aggregate: Aggregate[E, S], *, topic: str, lateness: int = 0
    ) -> None:
        if not isinstance(kind, (Tumbling, Hopping, Session)):
            raise TypeError(f"windows {name}: {kind!r} is not Tumbling, Hopping or Session")
        self.name = name
        self.kind = kind
        self.aggregate = aggregate
        self.topic = topic
        self.lateness = lateness
        self._prefix = f"{name}/"

    def _open_entry(self) -> str:
        return f"{self.name}/open"

    def _closed_entry(self) -> str:
        return f"{self.name}/closed"

    def _timer_name(self, start: int) -> str:
        return f"{self.name}/{start}"

    def closes_at(self, end: int) -> int:
        """When a window ending at ``end`` closes: its timer's time."""
        return _saturate(end - 1 + max(self.lateness, 0))

    def windows_of(self, at: int) -> list[Window]:
        """The tumbling or hopping windows holding time ``at``, by start
        (none for sessions, which depend on the key's other events)."""
        if isinstance(self.kind, Tumbling):
            size = hop = max(self.kind.size, 1)
        elif isinstance(self.kind, Hopping):
            size = max(self.kind.size, 1)
            hop = min(max(self.kind.hop, 1), size)
        else:
            return []
        windows = []
        start = at // hop * hop
        while start > at - size:
            windows.append(Window(start, _saturate(start + size)))
            start -= hop
        windows.reverse()
        return windows

    def _read_open(self, ctx: Context) -> dict[int, tuple[int, S]]:
        stored = ctx.get(self._open_entry()) or {}
        kind = self.aggregate.state_type
        return {int(start): (end, codec.from_json(kind, state)) for start, (end, state) in stored.items()}

    def _write_open(self, ctx: Context, open_: dict[int, tuple[int, S]]) -> None:
        ctx.set(
            self._open_entry(),
            {str(start): [end, codec.to_json(state)] for start, (end, state) in sorted(open_.items())},
        )

    def add(self, ctx: Context, at: int, event: E) -> Placed:
        """Adds ``event``, of event time ``at``, to its windows of the
        current key; opens those not open yet (setting their timers), or, if
        every one of them closed already, counts it late."""
        open_ = self._read_open(ctx)
        closed: int | None = ctx.get(self._closed_entry())

        def is_closed(window: Window) -> bool:
            return closed is not None and self.closes_at(window.end) <= closed

        if isinstance(self.kind, Session):
            placed = self._add_to_session(ctx, open_, at, max(self.kind.gap, 1), event, is_closed)
        else:
            placed = [window for window in self.windows_of(at) if not is_closed(window)]
            for window in placed:
                entry = open_.get(window.start)
                if entry is None:
                    ctx.set_timer_bytes(self._timer_name(window.start), self.closes_at(window.end))
                    entry = (window.end, self.aggregate.initial())
                open_[window.start] = (entry[0], self.aggregate.add(entry[1], event))
        if not placed:
            ctx.counter_add(f"{self.name}/late", 1)
            return Placed(())
        self._write_open(ctx, open_)
        return Placed(tuple(placed))

    def _add_to_session(
        self, ctx: Context, open_: dict[int, tuple[int, S]], at: int, gap: int, event: E, is_closed: Any
    ) -> list[Window]:
        """Adds an event at ``at`` to the sessions of ``open_`` it touches
        (merging them), or to a new one; none if its own session would be
        closed."""
        window = Window(at, _saturate(at + gap))
        touched = sorted(start for start, (end, _) in open_.items() if window.start < end and start < window.end)
        if not touched and is_closed(window):
            return []
        state = self.aggregate.initial()
        for start in touched:
            end, other = open_.pop(start)
            ctx.cancel_timer(self._timer_name(start))
            window = Window(min(window.start, start), max(window.end, end))
            state = self.aggregate.merge(state, other)
        state = self.aggregate.add(state, event)
        ctx.set_timer_bytes(self._timer_name(window.start), self.closes_at(window.end))
        open_[window.start] = (window.end, state)
        return [window]

    def fire(self, ctx: Context, timers: Sequence[Timer]) -> list[Window]:
        """Closes the windows of the current key whose timers are among
        ``timers`` (others are left to the caller): emits each one's result
        to the topic and forgets it. Returns the windows closed."""
        ours = [timer for timer in timers if timer.name.startswith(self._prefix)]
        if not ours:
            return []
        open_ = self._read_open(ctx)
        closed: int | None = ctx.get(self._closed_entry())
        done = []
        for timer in ours:
            # A start as the Rust SDK writes and parses it (an i64).
            if not _START.fullmatch(timer.name[len(self._prefix) :]):
                continue
            start = int(timer.name[len(self._prefix) :])
            closed = timer.at if closed is None else max(closed, timer.at)
            entry = open_.pop(start, None)
            if entry is None:
                continue
            window = Window(start, entry[0])
            ctx.emit(self.topic, self.aggregate.result(ctx.key, window, entry[1]))
            done.append(window)
        self._write_open(ctx, open_)
        ctx.set(self._closed_entry(), closed)
        return done
