"""Unit-testing handlers with pytest: no component, no host.

:class:`MemoryHost` keeps state, counters, emitted messages and log lines
in memory, and drives a module through the same byte path the component
uses: each event is encoded, its key taken with the module's ``key``, and
the bodies dispatched by tag through :meth:`Module.handle
<wakuwaku_guest.Module.handle>`, where they are decoded again. It applies
the host's rules with the host's messages (:mod:`wakuwaku_guest.limits`):
state, counter and emit calls are refused past the same limits and state
quotas (counters per projection, entries per key), only during a call,
and log lines are cut and counted. A failed call leaves no
trace in state, counters, timers or emitted messages (its log lines are
kept).

Timers (contract 0.5, ``docs/timers.md``) are kept per key under the
host's rules by id (``timer-name``, ``timer-payload-size``, ``timer-time``,
``timer-at-firing``, ``timers-per-key``, ``timers-in-all``), and
:meth:`MemoryHost.advance` moves the projection's clock and fires the due
ones as the host does, so a timer is unit-tested without a log::

    host.handle([Clicked(1, at=100)])   # sets "end" at 700
    assert host.advance(701) == 1       # fires it

:meth:`MemoryHost.handle_in_time` plays timed events with the clock moved
to each one's time first, so every timer fires at its place among the
key's events (after the events of its time, before the later ones).

::

    from wakuwaku_guest.testing import MemoryHost

    host = MemoryHost(bank)
    host.handle([Deposited(42, 100), Deposited(42, 50), Deposited(7, 9)])
    assert host.get(42, "account", Account).balance == 150

One difference from the host, on purpose: an exception that is not a
:class:`~wakuwaku_guest.HandlerError` propagates as it is, with its
traceback, where the component reports it as retryable (as a Rust panic
traps).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from . import codec
from .context import Outgoing, Timer
from .event import Event
from .key import KeyValue, decode_key, encode_key
from .limits import (
    CallTally,
    LogTally,
    PayloadLimits,
    check_combined_body,
    check_counter_count,
    check_entries_per_key,
    check_key,
    check_timer_name,
    check_timers_in_all,
    check_timers_per_key,
    counter_value,
)
from .module import Module
from .reduce import chunks, reduce
from .types import Level, Ordering, Refusal, Timing

__all__ = ["MemoryHost", "LogLine"]

T = TypeVar("T")


def _time_fenced(records: Sequence[tuple[type[Event], bytes, Ordering]], index: int) -> Ordering:
    """The ordering the host plans one key's timed record ``index`` with
    (``records`` in event-time order): a ``TIMED`` record whose type differs
    from the key's last ``TIMED`` record before it is a full barrier
    (``ACQ_REL``, ``event-time-order``); every other record keeps its
    own."""
    kind, _, ordering = records[index]
    if kind.TIMING is not Timing.TIMED:
        return ordering
    earlier = [k for k, _, _ in records[:index] if k.TIMING is Timing.TIMED]
    return Ordering.ACQ_REL if earlier and earlier[-1] is not kind else ordering


def _planned_runs(records: Sequence[tuple[type[Event], Ordering]]) -> list[list[int]]:
    """The runs the host's planner makes of one key's records (type and
    ordering, in order), as lists of indexes, in the order the host applies
    them: segments cut at fences (``ACQUIRE`` and ``ACQ_REL`` start one and
    head it, ``RELEASE`` ends one as its tail, or gets one of its own when
    its type heads a segment that holds other types), each segment's head,
    then its body runs in order of first appearance, then its tail."""
    runs: list[list[int]] = []
    slots: list[tuple[type[Event], list[int]]] = []
    state = {"open": False, "head": False, "tail": None}

    def finish() -> None:
        head = 1 if state["head"] and slots else 0
        order = list(range(head)) + [i for i in range(head, len(slots)) if i != state["tail"]]
        order += [] if state["tail"] is None else [state["tail"]]
        runs.extend(slots[i][1] for i in order)
        slots.clear()
        state.update(open=True, head=False, tail=None)

    def slot(kind: type[Event], index: int) -> int:
        for number, (k, indexes) in enumerate(slots):
            if k is kind:
                indexes.append(index)
                return number
        slots.append((kind, [index]))
        return len(slots) - 1

    for index, (kind, ordering) in enumerate(records):
        if ordering in (Ordering.ACQUIRE, Ordering.ACQ_REL):
            finish()
            state["head"] = True
            slot(kind, index)
        elif ordering is Ordering.RELAXED:
            if not state["open"]:
                finish()
            slot(kind, index)
        else:
            on_head = state["head"] and slots[0][0] is kind
            if state["open"] and not (on_head and len(slots) > 1):
                number = slot(kind, index)
                if not on_head:
                    state["tail"] = number
            else:
                finish()
                state["tail"] = slot(kind, index)
            state["open"] = False
    finish()
    return runs


@dataclasses.dataclass(frozen=True)
class LogLine:
    """A line a handler logged (as kept: cut when long)."""

    #: The key being handled when it was logged, decoded.
    key: KeyValue
    level: Level
    message: str


class MemoryHost:
    """An in-memory host for unit tests of ``module``: per-key state,
    shared counters, emitted messages and log lines, under ``limits`` (the
    host's defaults unless given). The module's ``describe`` is checked
    when the host is made, as the host checks it at load."""

    def __init__(self, module: Module, *, limits: PayloadLimits | None = None) -> None:
        module.describe()
        self.module = module
        self.limits = limits or PayloadLimits()
        self._state: dict[bytes, dict[str, bytes]] = {}
        self._counters: dict[str, int] = {}
        # Per key: its pending timers by name.
        self._timers: dict[bytes, dict[str, Timer]] = {}
        #: The messages emitted so far, in order.
        self.emitted: list[Outgoing] = []
        #: The lines logged so far, in order.
        self.logs: list[LogLine] = []

    def handle(self, events: Iterable[Event]) -> None:
        """Delivers ``events`` as they are, without reduction: consecutive
        events of one type and one key form a run, cut into chunks of at
        most the type's ``MAX_BATCH``, each handed to the module's
        ``handle``. Stops at the first failing chunk (raising its error);
        earlier chunks stay applied."""
        for kind, key, bodies in self._runs(events):
            self._deliver(kind, key, bodies)

    def handle_reduced(self, events: Iterable[Event]) -> None:
        """Like :meth:`handle`, but first reduces each run with its type's
        algebra, by the host's rules (:mod:`wakuwaku_guest.reduce`): an
        associative run of two or more is folded into one with the module's
        ``combine``, an idempotent one loses adjacent duplicates, an
        idempotent-commutative one is sorted and loses all duplicates."""
        for kind, key, bodies in self._runs(events):
            reduced = reduce(kind.ALGEBRA, bodies, lambda run, tag=kind.TAG: self._combine(tag, run))
            self._deliver(kind, key, reduced)

    def handle_in_event_time_order(self, events: Iterable[Event]) -> None:
        """Applies events of several types as the host applies a
        projection's events read from several topics once it has read them
        all: events of untimed types as they come, in the order given
        (consecutive events of one type and key form a run); events of
        timed types held, put in event-time order, ties in the order given
        (the host breaks ties by topic, then by position in the log: list
        the events topic by topic, each in log order), and planned as the
        host plans a released batch, key by key: a key's events of
        ``Timing.TIMED`` types in event-time order (``event-time-order``),
        those of ``Timing.TIMED_RELAXED`` types moving past them as their
        orderings allow (one run per type between fences). Each event's
        time comes from the module's ``event_time``, as ``waku publish``
        takes it, so a timed event without one raises the publisher's
        ``event-time-declared`` error before anything is applied. Runs are
        chunked by ``MAX_BATCH``, without reduction; stops at the first
        failing chunk.

        ::

            host.handle_in_event_time_order([Shipped(1, at_ms=30), Received(1, at_ms=10)])
        """
        untimed: list[Event] = []
        timed: list[tuple[int, Event]] = []
        for event in events:
            time = self.module.event_time(type(event).TAG, event.encode())
            if time is None:
                untimed.append(event)
            else:
                timed.append((time, event))
        self.handle(untimed)
        # Stable: equal times keep the order given.
        timed.sort(key=lambda pair: pair[0])
        by_key: dict[bytes, list[tuple[type[Event], bytes, Ordering]]] = {}
        for _, event in timed:
            kind, body = type(event), event.encode()
            key = self.module.key(kind.TAG, body)
            check_key(key)
            by_key.setdefault(key, []).append((kind, body, self.module.ordering(kind.TAG, body)))
        for key, records in by_key.items():
            for run in _planned_runs([(kind, _time_fenced(records, i)) for i, (kind, _, _) in enumerate(records)]):
                self._deliver(records[run[0]][0], key, [records[i][1] for i in run])

    def _combine(self, tag: int, bodies: list[bytes]) -> bytes:
        body = self.module.combine(tag, bodies)
        check_combined_body(self.limits, body)
        return body

    def _runs(self, events: Iterable[Event]) -> list[tuple[type[Event], bytes, list[bytes]]]:
        runs: list[tuple[type[Event], bytes, list[bytes]]] = []
        for event in events:
            kind = type(event)
            body = event.encode()
            key = self.module.key(kind.TAG, body)
            check_key(key)
            if runs and runs[-1][0] is kind and runs[-1][1] == key:
                runs[-1][2].append(body)
            else:
                runs.append((kind, key, [body]))
        return runs

    def _deliver(self, kind: type[Event], key: bytes, bodies: Sequence[bytes]) -> None:
        for chunk in chunks(bodies, kind.MAX_BATCH):
            self.handle_bodies(kind.TAG, key, chunk)

    def handle_bodies(self, tag: int, key: bytes, bodies: Sequence[bytes]) -> None:
        """One ``handle`` call with encoded bodies for the key with canonical
        bytes ``key``, as the host makes it. On error, the call's state
        writes, counter changes, timer changes and emitted messages are
        rolled back and the error is raised."""
        check_key(key)
        self._undoable(key, None, lambda scope: self.module.handle(scope, tag, key, bodies))

    def _undoable(self, key: bytes, firing: int | None, call: Any) -> None:
        """Runs one call about ``key`` (firing the timers at ``firing``, if
        any): on error its state writes, counter changes, timer changes and
        emitted messages are rolled back and the error is raised."""
        state = dict(self._state.get(key, {}))
        timers = dict(self._timers.get(key, {}))
        counters = dict(self._counters)
        emitted = len(self.emitted)
        scope = _KeyScope(self, key, firing)
        try:
            call(scope)
        except BaseException:
            self._state[key] = state
            self._timers[key] = timers
            self._counters = counters
            del self.emitted[emitted:]
            raise
        finally:
            scope.close()
            if not self._timers.get(key, True):
                del self._timers[key]

    def advance(self, clock: int) -> int:
        """Moves the projection's clock to ``clock`` (ms since the epoch)
        and fires every timer below it, as the host does when no event of
        the key is left to apply before them: each key's due timers in
        (time, name) order, names compared as UTF-8 bytes, all of one time
        in one call of the module's timer handler
        (:meth:`Module.on_timers <wakuwaku_guest.Module.on_timers>`); timers
        a call sets below the clock fire in turn; keys in the order of their
        earliest due timer, then of their bytes. A timer at ``t`` is due
        once the clock is above ``t`` (the clock is exclusive, as for
        events). Stops at the first failing call, raising its error (its
        changes taken back, its timers pending again). Returns how many
        calls it made."""
        calls = 0
        while True:
            due = [(timer.at, key) for key, timers in self._timers.items() for timer in timers.values() if timer.at < clock]
            if not due:
                return calls
            at, key = min(due)
            self._undoable(key, at, lambda scope, key=key, at=at: self._fire(scope, key, at))
            calls += 1

    def _fire(self, scope: _KeyScope, key: bytes, at: int) -> None:
        timers = self._timers[key]
        fired = _in_firing_order([timer for timer in timers.values() if timer.at == at])
        for timer in fired:
            del timers[timer.name]
        self.module.fire(scope, key, fired)

    def handle_in_time(self, events: Iterable[Event], *, clock: int | None = None) -> int:
        """Plays ``events`` as the host applies a projection's timed events
        once it has read them all, with the timers in their places: the
        events put in event-time order (ties in the order given; the time
        from the module's ``event_time``, so an untimed event raises the
        publisher's ``event-time-declared`` error first), and before each
        one the clock moved to its time (:meth:`advance`), so a timer at
        ``t`` fires after every event at or before ``t`` and before the
        later ones; each event in a call of its own (as with ``MAX_BATCH``
        1, which a handler whose timers must fall exactly between events
        declares). At the end the clock moves to ``clock``, by default one
        past the latest event time, as the host's clock does at the end of
        the log. Returns how many timer calls it made."""
        timed: list[tuple[int, Event]] = []
        for event in events:
            time = self.module.event_time(type(event).TAG, event.encode())
            if time is None:
                raise ValueError(f"handle_in_time plays timed events only; {type(event).NAME} is untimed")
            timed.append((time, event))
        timed.sort(key=lambda pair: pair[0])
        calls = 0
        for time, event in timed:
            calls += self.advance(time)
            self.handle([event])
        end = clock if clock is not None else (timed[-1][0] + 1 if timed else None)
        return calls + (self.advance(end) if end is not None else 0)

    def timers(self, key: Any) -> list[Timer]:
        """The pending timers of ``key`` (a key value: ``42``, ``"ann"``,
        ``(42, "eur")``), in firing order."""
        return _in_firing_order(list(self._timers.get(encode_key(key), {}).values()))

    def get(self, key: Any, name: str, kind: type[T] | Any = Any) -> T | None:
        """A JSON state entry of ``key`` (a key value: ``42``, ``"ann"``,
        ``(42, "eur")``), as ``kind`` when given; ``None`` if absent."""
        data = self.get_bytes(key, name)
        return None if data is None else codec.from_json_bytes(kind, data)

    def set(self, key: Any, name: str, value: Any) -> None:
        """Writes a JSON state entry of ``key``, e.g. to start a test from a
        given read model."""
        self._state.setdefault(encode_key(key), {})[name] = codec.to_json_bytes(value)

    def get_bytes(self, key: Any, name: str) -> bytes | None:
        """A state entry of ``key``, as bytes."""
        return self._state.get(encode_key(key), {}).get(name)

    def entries(self, key: Any) -> dict[str, bytes]:
        """Every state entry of ``key``."""
        return dict(self._state.get(encode_key(key), {}))

    def keys(self) -> list[KeyValue]:
        """Every key that has state, decoded, in canonical byte order."""
        return [decode_key(key) for key in sorted(self._state) if self._state[key]]

    def counter(self, name: str) -> int:
        """The value of a shared counter (0 if never touched)."""
        return self._counters.get(name, 0)


def _in_firing_order(timers: list[Timer]) -> list[Timer]:
    """``timers`` in the order they fire: time, then name as UTF-8 bytes."""
    return sorted(timers, key=lambda timer: (timer.at, timer.name.encode("utf-8", "surrogatepass")))


class _KeyScope:
    """The host as one call about one key sees it: the module's
    :class:`~wakuwaku_guest.HostApi` during that call, refusing everything
    once the call is over."""

    def __init__(self, host: MemoryHost, key: bytes, firing: int | None = None) -> None:
        self._host = host
        self._key = key
        # The time of the timers being fired, in a `fire` call.
        self._firing = firing
        self._tally = CallTally()
        self._log = LogTally()
        self._open = True

    def close(self) -> None:
        closing = self._log.finish(self._host.limits)
        if closing is not None:
            self._host.logs.append(LogLine(decode_key(self._key), Level.WARN, closing))
        self._open = False

    def _check_open(self, interface: str) -> None:
        if not self._open:
            raise Refusal(f"outside-handle: `{interface}` is only available while `handle` or `fire` runs")

    def get(self, name: str) -> bytes | None:
        self._check_open("state")
        return self._host._state.get(self._key, {}).get(name)

    def set(self, name: str, value: bytes) -> None:
        self._check_open("state")
        before = dataclasses.replace(self._tally)
        self._tally.set(self._host.limits, name, len(value))
        entries = self._host._state.setdefault(self._key, {})
        if name not in entries:
            try:
                check_entries_per_key(self._host.limits, name, len(entries))
            except Refusal:
                # Refused: the call's counts stay as they were.
                self._tally = before
                raise
        entries[name] = bytes(value)

    def delete(self, name: str) -> None:
        self._check_open("state")
        self._tally.delete(self._host.limits, name)
        self._host._state.get(self._key, {}).pop(name, None)

    def counter_add(self, name: str, delta: int) -> None:
        self._check_open("state")
        current = self._host._counters.get(name, 0)
        before = dataclasses.replace(self._tally)
        after = self._tally.counter_add(self._host.limits, name, current, delta)
        if name not in self._host._counters:
            try:
                check_counter_count(self._host.limits, name, len(self._host._counters))
            except Refusal:
                # Refused: the call's counts stay as they were.
                self._tally = before
                raise
        self._host._counters[name] = after

    def counter_get(self, name: str) -> int:
        self._check_open("state")
        return counter_value(name, self._host._counters.get(name, 0))

    def emit(self, message: Outgoing) -> None:
        self._check_open("emit")
        self._tally.emit(self._host.limits, self._host.module.emits, message.topic, message.key, message.body)
        self._host.emitted.append(message)

    def set_timer(self, name: str, at: int, payload: bytes) -> None:
        self._check_open("timers")
        limits = self._host.limits
        before = dataclasses.replace(self._tally)
        self._tally.timer_set(limits, name, at, len(payload), self._firing)
        timers = self._host._timers.setdefault(self._key, {})
        if name not in timers:
            try:
                check_timers_per_key(limits, name, len(timers))
                check_timers_in_all(limits, name, sum(len(held) for held in self._host._timers.values()))
            except Refusal:
                # Refused: the call's counts stay as they were.
                self._tally = before
                raise
        timers[name] = Timer(name, at, bytes(payload))

    def cancel_timer(self, name: str) -> None:
        self._check_open("timers")
        self._tally.timer_cancel(self._host.limits, name)
        self._host._timers.get(self._key, {}).pop(name, None)

    def get_timer(self, name: str) -> Timer | None:
        self._check_open("timers")
        check_timer_name(name)
        return self._host._timers.get(self._key, {}).get(name)

    def log(self, level: Level, message: str) -> None:
        if not self._open:
            return
        kept = self._log.admit(self._host.limits, message)
        if kept is not None:
            self._host.logs.append(LogLine(decode_key(self._key), level, kept))
