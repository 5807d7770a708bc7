"""What a handler can do during a call: state, counters, emit, log, timers.

:class:`Context` is the handler's view; it wraps a :class:`HostApi`, the
raw bytes-level calls of the WIT imports ``state``, ``emit``, ``log`` and
``timers``.
Inside a component the :class:`HostApi` calls the host
(:mod:`wakuwaku_guest.component`); in unit tests it is the in-memory
:class:`~wakuwaku_guest.testing.MemoryHost`.

A :class:`HostApi` call the host refuses raises
:class:`~wakuwaku_guest.types.Refusal` with the host's text, which names the
rule (``state-value-size: ...``); :class:`Context` turns it into
:class:`~wakuwaku_guest.Refused`, an unrecoverable error that also says what
was refused, in the Rust SDK's words (``cannot write state entry `big`:
state-value-size: ...``). Catching it is allowed: the call may still
succeed without what was refused. Left uncaught, it fails the call.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, TypeVar

from . import codec
from .event import Event
from .key import KeyValue, decode_key
from .limits import I64_MAX, I64_MIN
from .types import Algebra, Level, Ordering, Refusal, Refused, UnrecoverableError

__all__ = ["HostApi", "Outgoing", "Context", "Timer"]

T = TypeVar("T")
E = TypeVar("E", bound=Event)


@dataclasses.dataclass(frozen=True)
class Outgoing:
    """A message a handler publishes to another topic, with the headers the
    host writes for it (the WIT record ``outgoing``)."""

    #: One of the topics the module declared it emits to.
    topic: str
    #: The event type's tag.
    tag: int
    #: The message's key, in canonical bytes.
    key: bytes
    #: The ordering the message asks for.
    ordering: Ordering
    #: The event type's algebra.
    algebra: Algebra
    #: The encoded body.
    body: bytes

    @classmethod
    def of(cls, topic: str, event: Event) -> Outgoing:
        """The message for ``event`` on ``topic``: tag, key, ordering and
        algebra come from the event."""
        kind = type(event)
        return cls(topic, kind.TAG, event.key_bytes(), event.ordering(), kind.ALGEBRA, event.encode())

    def decode(self, kind: type[E]) -> E:
        """The body as an event of type ``kind``; an unrecoverable error if
        the tag is not ``kind``'s or the body is malformed."""
        if self.tag != kind.TAG:
            raise UnrecoverableError(f"message has tag {self.tag}, {kind.NAME} has tag {kind.TAG}")
        return kind.decode(self.body)


@dataclasses.dataclass(frozen=True)
class Timer:
    """A pending timer of the key being handled (the WIT record ``timer``,
    contract 0.5, ``docs/timers.md``)."""

    #: Unique among the key's timers: 1 to 128 bytes, no NUL.
    name: str
    #: The event time it fires at, in milliseconds since the Unix epoch.
    at: int
    #: What :meth:`Context.set_timer` gave it to carry to the call that
    #: fires it (JSON, unless set with :meth:`Context.set_timer_bytes`).
    payload: bytes = b""

    def decode(self, kind: type[T] | Any = Any) -> T | Any:
        """The JSON payload, as ``kind`` when given; one that does not
        decode is an unrecoverable error naming the timer."""
        try:
            return codec.from_json_bytes(kind, self.payload)
        except (ValueError, TypeError) as error:
            raise UnrecoverableError(
                f"the payload of timer `{self.name}` is not a valid {_type_name(kind)}: {error}"
            ) from None


class HostApi(Protocol):
    """The host's side of a handler call, as raw bytes: what the WIT
    imports offer. Every method but ``log`` raises
    :class:`~wakuwaku_guest.types.Refusal` when the host refuses the call."""

    def get(self, name: str) -> bytes | None:
        """Reads an entry of the current key."""

    def set(self, name: str, value: bytes) -> None:
        """Writes an entry of the current key."""

    def delete(self, name: str) -> None:
        """Removes an entry of the current key (no error if it is absent)."""

    def counter_add(self, name: str, delta: int) -> None:
        """Adds ``delta`` to a counter shared by every key."""

    def counter_get(self, name: str) -> int:
        """Reads a shared counter: its committed value plus this key's
        changes."""

    def emit(self, message: Outgoing) -> None:
        """Queues a message, sent when the batch commits."""

    def log(self, level: Level, message: str) -> None:
        """Writes a line to the host's log (never fails)."""

    def set_timer(self, name: str, at: int, payload: bytes) -> None:
        """Sets the current key's timer ``name`` at event time ``at``: a new
        one, or the one of that name moved."""

    def cancel_timer(self, name: str) -> None:
        """Cancels the current key's timer ``name`` (no error if there is
        none)."""

    def get_timer(self, name: str) -> Timer | None:
        """The current key's timer ``name``, as this call sees it."""


class Context:
    """A handler's view of the host during one call: the state of the key
    being handled, the counters shared by all keys, emit, log, and the
    key's timers.

    State entries are JSON by default (:meth:`get`, :meth:`set`); a
    dataclass is written as a JSON object and read back into its class when
    the class is given. Writes are visible to later reads of the same key at
    once and committed with the batch; if the call fails, none is kept.
    """

    __slots__ = ("_host", "key_bytes", "_key")

    def __init__(self, host: HostApi, key: bytes) -> None:
        self._host = host
        #: The key being handled, in canonical bytes.
        self.key_bytes = key
        self._key: Any = _UNSET

    @property
    def key(self) -> KeyValue:
        """The key being handled, decoded (an int, str, bytes or tuple)."""
        if self._key is _UNSET:
            self._key = decode_key(self.key_bytes)
        return self._key

    def get(self, name: str, kind: type[T] | Any = Any) -> T | None:
        """Reads a JSON entry of the current key, as ``kind`` when given (a
        dataclass, an enum, a builtin or typing form); ``None`` if it is
        absent. An entry that does not decode is an unrecoverable error
        naming the entry."""
        # The host is called directly (not through get_bytes): this is the
        # hot path of most handlers.
        try:
            data = self._host.get(name)
        except Refusal as refusal:
            raise Refused(f"cannot read state entry `{name}`", refusal) from None
        if data is None:
            return None
        try:
            return codec.from_json_bytes(kind, data)
        except (ValueError, TypeError) as error:
            raise UnrecoverableError(f"state entry `{name}` is not a valid {_type_name(kind)}: {error}") from None

    def set(self, name: str, value: Any) -> None:
        """Writes a JSON entry of the current key."""
        try:
            data = codec.to_json_bytes(value)
        except (ValueError, TypeError) as error:
            raise UnrecoverableError(f"cannot encode state entry `{name}` as JSON: {error}") from None
        try:
            self._host.set(name, data)
        except Refusal as refusal:
            raise Refused(f"cannot write state entry `{name}`", refusal) from None

    def get_bytes(self, name: str) -> bytes | None:
        """Reads an entry of the current key as bytes."""
        try:
            return self._host.get(name)
        except Refusal as refusal:
            raise Refused(f"cannot read state entry `{name}`", refusal) from None

    def set_bytes(self, name: str, value: bytes) -> None:
        """Writes an entry of the current key as bytes."""
        try:
            self._host.set(name, bytes(value))
        except Refusal as refusal:
            raise Refused(f"cannot write state entry `{name}`", refusal) from None

    def delete(self, name: str) -> None:
        """Removes an entry of the current key (nothing happens if it is
        absent)."""
        try:
            self._host.delete(name)
        except Refusal as refusal:
            raise Refused(f"cannot delete state entry `{name}`", refusal) from None

    def counter_add(self, name: str, delta: int) -> None:
        """Adds ``delta`` (an s64, possibly negative) to a counter shared by
        every key. Counters are the only state shared across keys: additions
        commute, so keys handled at the same time lose no update. An addition
        that would take the counter, as this key sees it, out of the s64
        range is refused (``counter-range``), and nothing is added."""
        if type(delta) is not int or not I64_MIN <= delta <= I64_MAX:
            raise UnrecoverableError(f"cannot add {delta!r} to counter `{name}`: the delta is not an s64")
        try:
            self._host.counter_add(name, delta)
        except Refusal as refusal:
            raise Refused(f"cannot add {delta} to counter `{name}`", refusal) from None

    def counter_get(self, name: str) -> int:
        """Reads a shared counter: its committed value plus this key's
        changes. Other keys' changes in the same batch may or may not be
        included."""
        try:
            return self._host.counter_get(name)
        except Refusal as refusal:
            raise Refused(f"cannot read counter `{name}`", refusal) from None

    def emit(self, topic: str, event: Event) -> None:
        """Publishes ``event`` to ``topic`` when the batch commits; its
        headers (tag, key, ordering, algebra) come from the event. The topic
        must be one the module declared in ``emits``."""
        try:
            self._host.emit(Outgoing.of(topic, event))
        except Refusal as refusal:
            raise Refused(f"cannot emit {type(event).NAME} to `{topic}`", refusal) from None

    def set_timer(self, name: str, at: int, payload: Any = None) -> None:
        """Sets the current key's timer ``name`` at event time ``at`` (ms
        since the Unix epoch), carrying ``payload`` as JSON to the module's
        timer handler (:meth:`Module.on_timers
        <wakuwaku_guest.Module.on_timers>`): a new timer, or the one of that
        name moved. It fires once the projection's clock passes ``at``,
        after every event of the key at or before ``at`` (see
        ``docs/timers.md``). A refusal (``timers-per-key``,
        ``timer-payload-size``, ...) is :class:`~wakuwaku_guest.Refused`,
        naming the timer and the rule."""
        try:
            data = codec.to_json_bytes(payload)
        except (ValueError, TypeError) as error:
            raise UnrecoverableError(f"cannot encode the payload of timer `{name}`: {error}") from None
        self.set_timer_bytes(name, at, data)

    def set_timer_bytes(self, name: str, at: int, payload: bytes = b"") -> None:
        """:meth:`set_timer` with the payload as bytes."""
        if type(at) is not int or not I64_MIN <= at <= I64_MAX:
            raise UnrecoverableError(f"cannot set timer `{name}` at {at!r}: the time is not an s64")
        try:
            self._host.set_timer(name, at, bytes(payload))
        except Refusal as refusal:
            raise Refused(f"cannot set timer `{name}`", refusal) from None

    def cancel_timer(self, name: str) -> None:
        """Cancels the current key's timer ``name`` (nothing happens if there
        is none)."""
        try:
            self._host.cancel_timer(name)
        except Refusal as refusal:
            raise Refused(f"cannot cancel timer `{name}`", refusal) from None

    def timer(self, name: str) -> Timer | None:
        """The current key's timer ``name``, if it is pending (as this call
        sees it: committed, and the changes of this batch)."""
        try:
            return self._host.get_timer(name)
        except Refusal as refusal:
            raise Refused(f"cannot read timer `{name}`", refusal) from None

    def log(self, level: Level, message: str) -> None:
        """Writes a line to the host's log."""
        self._host.log(level, str(message))

    def trace(self, message: str) -> None:
        """Writes a trace line to the host's log."""
        self._host.log(Level.TRACE, str(message))

    def debug(self, message: str) -> None:
        """Writes a debug line to the host's log."""
        self._host.log(Level.DEBUG, str(message))

    def info(self, message: str) -> None:
        """Writes an info line to the host's log."""
        self._host.log(Level.INFO, str(message))

    def warn(self, message: str) -> None:
        """Writes a warning to the host's log."""
        self._host.log(Level.WARN, str(message))

    def error(self, message: str) -> None:
        """Writes an error line to the host's log."""
        self._host.log(Level.ERROR, str(message))


_UNSET = object()


def _type_name(kind: Any) -> str:
    if kind is Any:
        return "JSON value"
    return getattr(kind, "__name__", str(kind))
