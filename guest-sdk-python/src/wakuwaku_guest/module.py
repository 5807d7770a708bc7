"""A module: the event types it handles, dispatched by tag, and the topics
it may emit to.

Handlers are plain functions registered on a :class:`Module`::

    bank = Module("bank")

    @bank.handles(Deposited)
    def deposited(ctx: Context, events: list[Deposited]) -> None:
        ...

or methods of a :class:`Module` subclass, marked with :func:`handles`::

    class Bank(Module):
        @handles(Deposited)
        def deposited(self, ctx: Context, events: list[Deposited]) -> None:
            ...

    bank = Bank()

Every handler call gets events of one key and one type, in log order
(after the host's reduction), at most ``MAX_BATCH`` of them; calls for one
key never overlap. On error nothing the call wrote is kept, and the events
go where the error's class says.

A module's timers (contract 0.5, ``docs/timers.md``) are set in any call
with ``ctx.set_timer`` and fired, per key, by the one function registered
with :meth:`Module.on_timers` (or the method marked with :func:`on_timers`):
all of a key's due timers of one time in one call, in name order::

    @bank.on_timers
    def fire(ctx: Context, timers: list[Timer]) -> None:
        ...

A module without one sets no timers, and fails unrecoverably if it is ever
asked to fire some.

:class:`Module`'s ``describe``, ``key``, ``ordering``, ``event_time``,
``combine``, ``handle`` and ``fire`` are the WIT ``handler`` interface over bytes: the component
exports them (:func:`wakuwaku_guest.component.export`) and the test host
calls them, so a unit test runs exactly the code the component runs. Each
fails with an unrecoverable error naming the tag when the module has no
event type with that tag, and naming the type when a body does not decode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .context import Context, HostApi, Timer
from .event import Event, decoder
from .limits import ContractError, check_description, check_emits
from .types import Algebra, Ordering, Timing, UnrecoverableError

__all__ = ["Module", "handles", "on_timers", "EventTypeInfo", "ModuleInfo"]

F = TypeVar("F", bound=Callable[..., Any])

_HANDLES = "__wakuwaku_handles__"
_ON_TIMERS = "__wakuwaku_on_timers__"
# The methods the host calls (the WIT `handler` export); a handler method
# must not take one of their names.
_PROTOCOL = frozenset({"describe", "key", "ordering", "event_time", "combine", "handle", "fire"})

_S64_MIN = -(1 << 63)
_S64_MAX = (1 << 63) - 1


@dataclasses.dataclass(frozen=True)
class EventTypeInfo:
    """One event type as ``describe`` reports it to the host."""

    tag: int
    name: str
    algebra: Algebra
    max_batch: int
    timing: Timing = Timing.UNTIMED

    @classmethod
    def of(cls, kind: type[Event]) -> EventTypeInfo:
        """The description of event type ``kind``."""
        return cls(kind.TAG, kind.NAME, kind.ALGEBRA, kind.MAX_BATCH, kind.TIMING)


@dataclasses.dataclass(frozen=True)
class ModuleInfo:
    """What a module declares about itself (the WIT record
    ``module-info``)."""

    event_types: tuple[EventTypeInfo, ...]
    emits: tuple[str, ...]


def handles(*event_types: type[Event]) -> Callable[[F], F]:
    """Marks a method of a :class:`Module` subclass as the handler of
    ``event_types``: it is called as ``method(self, ctx, events)``."""
    _check_event_types(event_types)

    def mark(method: F) -> F:
        setattr(method, _HANDLES, getattr(method, _HANDLES, ()) + event_types)
        return method

    return mark


def on_timers(method: F) -> F:
    """Marks a method of a :class:`Module` subclass as its timer handler: it
    is called as ``method(self, ctx, timers)``."""
    setattr(method, _ON_TIMERS, True)
    return method


def _check_event_types(event_types: Sequence[Any]) -> None:
    if not event_types:
        raise TypeError("handles() needs at least one event type")
    for kind in event_types:
        if not (isinstance(kind, type) and issubclass(kind, Event) and "TAG" in vars(kind)):
            raise TypeError(f"{kind!r} is not an event type (a subclass of Event with a tag)")
        overrides_codec = kind.decode.__func__ is not Event.decode.__func__ and kind.encode is not Event.encode
        if not dataclasses.is_dataclass(kind) and not overrides_codec:
            raise TypeError(f"event type {kind.__name__} is not a dataclass and does not define decode and encode")


class Module:
    """A handler module: its event types, each with its handler, and the
    topics it may emit to.

    ``name`` names the module in error messages (default: the class name);
    ``emits`` lists the topics it may emit to (checked now: valid topic
    names, none of the host's ``retry_*``/``dlq_*``, none twice). Tags are
    checked as handlers are registered: two event types with one tag raise
    :class:`TypeError`, so the import, and the component build, fail.
    """

    def __init__(self, name: str | None = None, *, emits: Sequence[str] = ()) -> None:
        self.name = name or type(self).__name__
        self.emits = tuple(emits)
        try:
            check_emits(self.emits)
        except ContractError as error:
            raise TypeError(f"module {self.name}: {error}") from None
        # Per tag: the event type, its handler, and what decodes its bodies.
        self._handlers: dict[int, tuple[type[Event], Callable[[Context, list[Any]], Any], Callable[..., list[Any]]]] = {}
        self._timer_handler: Callable[[Context, list[Timer]], Any] | None = None
        seen: set[str] = set()
        for klass in type(self).__mro__:
            for attribute, value in vars(klass).items():
                if attribute in seen:
                    continue
                seen.add(attribute)
                if attribute in _PROTOCOL and (getattr(value, _HANDLES, ()) or getattr(value, _ON_TIMERS, False)):
                    raise TypeError(
                        f"module {self.name}: the handler method `{attribute}` would replace Module.{attribute}, "
                        "which the host calls; name it otherwise"
                    )
                for kind in getattr(value, _HANDLES, ()):
                    self._register(kind, getattr(self, attribute))
                if getattr(value, _ON_TIMERS, False):
                    self.on_timers(getattr(self, attribute))

    def handles(self, *event_types: type[Event]) -> Callable[[F], F]:
        """Registers a function as the handler of ``event_types``: it is
        called as ``function(ctx, events)``."""
        _check_event_types(event_types)

        def register(function: F) -> F:
            for kind in event_types:
                self._register(kind, function)
            return function

        return register

    def on_timers(self, function: F) -> F:
        """Registers a function as the module's timer handler (at most one):
        it is called as ``function(ctx, timers)`` with a key's due timers of
        one time, in name order, and may use state, emit, log and timers as
        an event handler does, setting timers only later than the ones it
        fires (``timer-at-firing``)."""
        if not callable(function):
            raise TypeError(f"module {self.name}: the timer handler is not callable")
        if self._timer_handler is not None:
            raise TypeError(f"module {self.name}: on_timers is registered twice; a module has one timer handler")
        self._timer_handler = function
        return function

    @property
    def handles_timers(self) -> bool:
        """Whether the module has a timer handler (:meth:`on_timers`)."""
        return self._timer_handler is not None

    def _register(self, kind: type[Event], handler: Callable[[Context, list[Any]], Any]) -> None:
        _check_event_types([kind])
        known = self._handlers.get(kind.TAG)
        if known is not None:
            raise TypeError(
                f"module {self.name}: event types {known[0].__name__} and {kind.__name__} have the same tag {kind.TAG}"
            )
        self._handlers[kind.TAG] = (kind, handler, decoder(kind))

    @property
    def event_types(self) -> list[type[Event]]:
        """The event types this module handles, in the order registered."""
        return [kind for kind, _, _ in self._handlers.values()]

    def event_type(self, tag: int) -> type[Event]:
        """The event type with ``tag``; an unrecoverable error naming the tag
        if the module has none."""
        entry = self._handlers.get(tag)
        if entry is None:
            raise UnrecoverableError(f"module {self.name} has no event type with tag {tag}")
        return entry[0]

    def describe(self) -> ModuleInfo:
        """The event types and emit topics, checked by the rules the host
        applies to ``describe`` (at least one event type, at most 256)."""
        info = ModuleInfo(tuple(EventTypeInfo.of(kind) for kind in self.event_types), self.emits)
        check_description(((t.tag, t.name, t.max_batch) for t in info.event_types), info.emits)
        return info

    def key(self, tag: int, body: bytes) -> bytes:
        """The canonical key bytes of a message body."""
        return self.event_type(tag).decode(body).key_bytes()

    def ordering(self, tag: int, body: bytes) -> Ordering:
        """The ordering a message body asks for."""
        return self.event_type(tag).decode(body).ordering()

    def event_time(self, tag: int, body: bytes) -> int | None:
        """When the event of a message body happened (ms since the epoch)
        for a timed type; ``None`` for an untimed one, which is not
        decoded. A timed event without one (or with a time that is no s64)
        is an unrecoverable error naming the rule
        (``event-time-declared``)."""
        kind = self.event_type(tag)
        if kind.TIMING is Timing.UNTIMED:
            return None
        time = kind.decode(body).event_time()
        if type(time) is not int or not _S64_MIN <= time <= _S64_MAX:
            raise UnrecoverableError(
                f"event-time-declared: {kind.NAME} declares event time, but its event_time() returned {time!r}, "
                "not milliseconds since the epoch as an s64"
            )
        return time

    def combine(self, tag: int, bodies: Sequence[bytes]) -> bytes:
        """Folds a run of bodies (at least one) of an associative type into
        one body with the type's ``combine``."""
        kind = self.event_type(tag)
        if not bodies:
            raise UnrecoverableError(f"combine of no {kind.NAME} events")
        combined = kind.combine(self._handlers[tag][2](bodies))
        if not isinstance(combined, kind):
            raise UnrecoverableError(f"{kind.NAME}.combine returned a {type(combined).__name__}, not a {kind.NAME}")
        return combined.encode()

    def handle(self, host: HostApi, tag: int, key: bytes, bodies: Sequence[bytes]) -> None:
        """Applies a chunk of bodies of one type to the key ``key``
        (canonical bytes); state calls go to ``host``."""
        entry = self._handlers.get(tag)
        if entry is None:
            raise UnrecoverableError(f"module {self.name} has no event type with tag {tag}")
        _, handler, decode_all = entry
        handler(Context(host, key), decode_all(bodies))

    def fire(self, host: HostApi, key: bytes, timers: Sequence[Timer]) -> None:
        """Fires the due timers of one time of the key ``key`` (canonical
        bytes), in name order, with the module's timer handler; an
        unrecoverable error if it has none."""
        if self._timer_handler is None:
            raise UnrecoverableError(
                f"module {self.name} handles no timers, but was asked to fire {len(timers)} of them"
            )
        self._timer_handler(Context(host, key), list(timers))
