"""Event types: a body schema with a tag, a name, an algebra, a max batch,
a timing, a key and a per-message ordering.

An event type is a dataclass deriving from :class:`Event`; what the host
needs to know about it is given as class keywords::

    @dataclass
    class Deposited(Event, tag=2, algebra=Algebra.ASSOCIATIVE):
        account: int
        amount: int

        def key(self) -> int:
            return self.account

        @classmethod
        def combine(cls, events: list["Deposited"]) -> "Deposited":
            return Deposited(events[0].account, sum(e.amount for e in events))

The keywords are checked when the class is created (so a bad one fails the
import, and with it the component build): ``tag`` is a u32 unique among the
types of one topic (uniqueness is checked by the module), ``name`` 1 to 128
bytes of letters, digits, ``_``, ``-``, ``.`` and ``:`` (default: the class
name), ``max_batch`` at least 1 (default 256), ``timing`` a :class:`Timing`
(default ``UNTIMED``), an associative type must define ``combine`` and a
timed one ``event_time``. They are read back as ``TAG``, ``NAME``,
``ALGEBRA``, ``MAX_BATCH`` and ``TIMING``, as the Rust SDK's associated
constants.

A timed type says when each event happened::

    @dataclass
    class Shipped(Event, tag=10, timing=Timing.TIMED):
        product: int
        at_ms: int

        def key(self) -> int:
            return self.product

        def event_time(self) -> int:
            return self.at_ms

``waku publish`` writes that time into the message's ``waku-event-time``
header (``event-time-declared``: ``None`` refuses the event), and the host
applies a key's timed events in event-time order across the projection's
topics. An untimed type is never asked, and a header on its messages is
ignored (``event-time-untimed``).

A key's events of ``TIMED`` types reach the handler in event-time order
whatever their types and orderings (``event-time-order``: where the type
changes the host plans the event as a full barrier; consecutive events of
one type still form one run). ``timing=Timing.TIMED_RELAXED`` opts out:
its events may move past the key's events of other timed types as their
``ordering`` allows, as untimed events do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from . import codec
from .key import KeyFormatError, encode_key
from .limits import is_event_type_name
from .types import Algebra, Ordering, Timing, UnrecoverableError

__all__ = ["Event"]

_U32_MAX = (1 << 32) - 1

E = TypeVar("E", bound="Event")


class Event:
    """The base of every event type. Subclass it with class keywords (see
    the module docs) and implement :meth:`key`; override :meth:`ordering`
    when messages ask for a fence, :meth:`combine` for an associative type,
    and :meth:`decode`/:meth:`encode` for a body format other than JSON."""

    #: Unique among the event types of one topic; written into every
    #: message's header.
    TAG: ClassVar[int]
    #: A human name used in logs, metrics and errors.
    NAME: ClassVar[str]
    #: How the host may reduce a run of this type.
    ALGEBRA: ClassVar[Algebra] = Algebra.NON_ASSOCIATIVE
    #: The most events one handler call receives.
    MAX_BATCH: ClassVar[int] = 256
    #: Whether its events carry an event time.
    TIMING: ClassVar[Timing] = Timing.UNTIMED

    def __init_subclass__(
        cls,
        *,
        tag: int | None = None,
        name: str | None = None,
        algebra: Algebra | None = None,
        max_batch: int | None = None,
        timing: Timing | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if tag is None:
            if name is not None or algebra is not None or max_batch is not None or timing is not None:
                raise TypeError(f"event type {cls.__name__} gives no tag (class {cls.__name__}(Event, tag=...))")
            # A base class shared by event types: it declares nothing itself.
            return
        if type(tag) is not int or not 0 <= tag <= _U32_MAX:
            raise TypeError(f"event type {cls.__name__}: tag {tag!r} is not a u32")
        name = cls.__name__ if name is None else name
        if not isinstance(name, str) or not is_event_type_name(name):
            raise TypeError(
                f"event type {cls.__name__}: name {name!r} is not 1 to 128 bytes of letters, digits, "
                "`_`, `-`, `.` and `:`"
            )
        algebra = cls.ALGEBRA if algebra is None else algebra
        if not isinstance(algebra, Algebra):
            raise TypeError(f"event type {cls.__name__}: algebra {algebra!r} is not an Algebra")
        max_batch = cls.MAX_BATCH if max_batch is None else max_batch
        if type(max_batch) is not int or not 1 <= max_batch <= _U32_MAX:
            raise TypeError(f"event type {cls.__name__}: max_batch {max_batch!r} is not from 1 to {_U32_MAX}")
        timing = cls.TIMING if timing is None else timing
        if not isinstance(timing, Timing):
            raise TypeError(f"event type {cls.__name__}: timing {timing!r} is not a Timing")
        if cls.key is Event.key:
            raise TypeError(f"event type {cls.__name__} does not define key(self)")
        if timing.is_timed and cls.event_time is Event.event_time:
            raise TypeError(f"event type {cls.__name__} is timed but does not define event_time(self)")
        if algebra is Algebra.ASSOCIATIVE and cls.combine.__func__ is Event.combine.__func__:
            raise TypeError(f"event type {cls.__name__} is associative but does not define combine(cls, events)")
        cls.TAG = tag
        cls.NAME = name
        cls.ALGEBRA = algebra
        cls.MAX_BATCH = max_batch
        cls.TIMING = timing

    def key(self) -> Any:
        """The key of this message: an int, str, bytes, or a tuple of those
        (see :mod:`wakuwaku_guest.key`). It may depend only on the body."""
        raise NotImplementedError

    def ordering(self) -> Ordering:
        """How this message orders itself against other event types of its
        key. It may depend on the message, but only on the message. Default:
        ``RELAXED``."""
        return Ordering.RELAXED

    def event_time(self) -> int | None:
        """When this event happened, in milliseconds since the Unix epoch
        (UTC), read from the event itself (never from a clock). Asked only
        of a timed type, where ``None`` refuses the event
        (``event-time-declared``). Default: ``None``."""
        return None

    @classmethod
    def combine(cls: type[E], events: list[E]) -> E:
        """Folds a run of events (at least one, of one key, in log order)
        into one event that the handler treats exactly like the whole run.
        Called only for an associative type; the default fails as
        unrecoverable."""
        raise UnrecoverableError(f"{cls.NAME} is not associative")

    @classmethod
    def decode(cls: type[E], body: bytes) -> E:
        """Decodes a body. Default: JSON read into the dataclass, checked
        against its type hints (see :mod:`wakuwaku_guest.codec`); a body that
        does not fit is an unrecoverable error naming the type."""
        return decoder(cls)([body])[0]

    def encode(self) -> bytes:
        """Encodes the body. Default: compact JSON of the dataclass."""
        return codec.to_json_bytes(self)

    def key_bytes(self) -> bytes:
        """The canonical bytes of :meth:`key`; a value that cannot be a key
        is an unrecoverable error naming the type."""
        try:
            return encode_key(self.key())
        except KeyFormatError as error:
            raise UnrecoverableError(f"the key of a {type(self).NAME} is not a key: {error}") from None


def decoder(kind: type[E]) -> Callable[[Sequence[bytes]], list[E]]:
    """What decodes a chunk of ``kind``'s bodies: its own ``decode`` for
    each, or, for the default JSON bodies, one reader compiled for the type
    (the hot path of every call, so without a call per body through
    ``decode``). Either way a body that does not fit is an unrecoverable
    error naming the type."""
    if kind.decode.__func__ is not Event.decode.__func__:
        decode = kind.decode
        return lambda bodies: [decode(body) for body in bodies]
    read = codec.bytes_reader(kind)
    name = kind.NAME

    def decode_all(bodies: Sequence[bytes]) -> list[E]:
        try:
            return [read(body) for body in bodies]
        except (ValueError, TypeError) as error:
            raise UnrecoverableError(f"malformed {name} body: {error}") from None

    return decode_all
