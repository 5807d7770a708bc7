"""The vocabulary shared with the host: algebras, orderings, error classes,
log levels, and the errors a handler raises.

Each enum's values are the names ``wit/handler-0.5.wit`` uses
(``non-associative``, ``acq-rel``, ...), so ``Algebra("associative")`` reads
a name as the contract writes it.
"""

from __future__ import annotations

import enum

__all__ = [
    "Algebra",
    "Ordering",
    "Timing",
    "ErrorClass",
    "Level",
    "HandlerError",
    "TransientError",
    "RetryableError",
    "UnrecoverableError",
    "Refusal",
    "Refused",
]


class Algebra(enum.Enum):
    """The law an event type obeys, which decides how the host may reduce a
    run (every event of one type and one key between two fences)."""

    #: No law: every event is delivered, in log order. The default.
    NON_ASSOCIATIVE = "non-associative"
    #: a·b = b·a: delivered unchanged; the order inside a run may relax.
    COMMUTATIVE = "commutative"
    #: a·a = a: adjacent duplicates (equal body bytes) are dropped.
    IDEMPOTENT = "idempotent"
    #: Both: the run is sorted by body bytes and all duplicates dropped.
    IDEMPOTENT_COMMUTATIVE = "idempotent-commutative"
    #: a·b = combine(a, b): the run is folded into one event by ``combine``.
    ASSOCIATIVE = "associative"


class Ordering(enum.Enum):
    """How a message orders itself against other event types of its key
    (the names mirror ``std::sync::atomic::Ordering``)."""

    #: Only its own type's order is kept. The default.
    RELAXED = "relaxed"
    #: Opens something: later events of the key wait for it.
    ACQUIRE = "acquire"
    #: Closes something: it waits for every earlier event of the key.
    RELEASE = "release"
    #: A full barrier: both of the above.
    ACQ_REL = "acq-rel"


class Timing(enum.Enum):
    """Whether an event type's events carry an event time (when the event
    happened, in milliseconds since the Unix epoch): declared per type, as
    its algebra is."""

    #: No event time: applied as they arrive, in log order. The default.
    UNTIMED = "untimed"
    #: Every event has one, which ``event_time`` returns and the publisher
    #: writes into the ``waku-event-time`` header; the host applies a key's
    #: timed events in event-time order across the projection's topics, and
    #: against the key's events of other ``TIMED`` types
    #: (``event-time-order``).
    TIMED = "timed"
    #: Timed as ``TIMED`` is, but its events may move past the key's events
    #: of other timed types as their ordering allows (one run per type
    #: between fences: fewer handler calls).
    TIMED_RELAXED = "timed-relaxed"

    @property
    def is_timed(self) -> bool:
        """Whether its events carry an event time."""
        return self is not Timing.UNTIMED


class ErrorClass(enum.Enum):
    """What kind of failure a handler reports; it decides where the host
    sends the events of the failed call."""

    #: May succeed right away (a busy dependency): retried in place a bounded
    #: number of times, then treated as retryable.
    TRANSIENT = "transient"
    #: May succeed later: the key's unfinished work goes to the retry topic,
    #: and later events of the key queue behind it.
    RETRYABLE = "retryable"
    #: Will never succeed (bad payload, broken invariant): the events go to
    #: the dead-letter topic with the message; the key goes on.
    UNRECOVERABLE = "unrecoverable"


class Level(enum.Enum):
    """The severity of a log line sent to the host."""

    TRACE = "trace"
    DEBUG = "debug"
    INFO = "info"
    WARN = "warn"
    ERROR = "error"


class HandlerError(Exception):
    """A failure a handler reports: a class, which decides where the events
    go, and a message, which ends up in the dead-letter record or the log.

    Raise one of the subclasses (:class:`TransientError`,
    :class:`RetryableError`, :class:`UnrecoverableError`), or this class with
    an explicit :class:`ErrorClass`. ``str(error)`` is ``class: message``, as
    the Rust SDK displays it.
    """

    error_class: ErrorClass = ErrorClass.UNRECOVERABLE

    def __init__(self, *args: object) -> None:
        if len(args) == 2 and isinstance(args[0], ErrorClass):
            self.error_class = args[0]
            message = args[1]
        elif len(args) == 1:
            message = args[0]
        else:
            raise TypeError("HandlerError(message) or HandlerError(ErrorClass, message)")
        self.message = str(message)
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.error_class.value}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.error_class.value!r}, {self.message!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HandlerError):
            return NotImplemented
        return (self.error_class, self.message) == (other.error_class, other.message)

    def __hash__(self) -> int:
        return hash((self.error_class, self.message))


class TransientError(HandlerError):
    """May succeed right away (a busy dependency): retried in place."""

    error_class = ErrorClass.TRANSIENT


class RetryableError(HandlerError):
    """May succeed later: the key's unfinished work goes to the retry topic."""

    error_class = ErrorClass.RETRYABLE


class UnrecoverableError(HandlerError):
    """Will never succeed: the events go to the dead-letter topic."""

    error_class = ErrorClass.UNRECOVERABLE


class Refusal(Exception):
    """The host refused a value a :class:`~wakuwaku_guest.HostApi` call
    handed it: the host's ``refusal`` text, which starts with the rule's id
    (``state-value-size: ...``; the rules are in ``wit/handler.wit``).
    :class:`~wakuwaku_guest.Context` turns it into :class:`Refused`."""

    @property
    def rule(self) -> str:
        """The id of the rule broken, e.g. ``state-value-size``."""
        return str(self).split(":", 1)[0]


class Refused(UnrecoverableError):
    """A :class:`~wakuwaku_guest.Context` call the host refused (a state
    value over the limit, an emit to an undeclared topic, ...). The message
    says what was refused and the host's reason, as the Rust SDK words it:
    ``cannot write state entry `big`: state-value-size: ...``.

    Nothing of the refused value was kept. A handler may catch it and go on
    (the call still succeeds without what was refused); left uncaught it
    fails the call as unrecoverable, as the same input would be refused
    again.
    """

    def __init__(self, what: str, refusal: Refusal | str) -> None:
        #: The host's text, starting with the rule's id.
        self.refusal = str(refusal)
        super().__init__(f"{what}: {self.refusal}")

    @property
    def rule(self) -> str:
        """The id of the rule broken, e.g. ``state-value-size``."""
        return self.refusal.split(":", 1)[0]
