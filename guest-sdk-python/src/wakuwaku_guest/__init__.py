"""Write wakuwaku event handlers in Python and build them into WebAssembly
components with componentize-py.

The Python counterpart of the Rust SDK (``guest-sdk/``), with the same
concepts, limits, errors and key encoding. Each event type is a dataclass
deriving from :class:`Event` (tag, name, algebra, max batch, key, ordering
per message); handlers are functions or methods registered on a
:class:`Module`; the handler file ends with ``Handler = export(module)``.
Build with ``waku build <project>`` (componentize-py against
``wit/handler-0.5.wit``, world ``module``) and hand the ``.wasm`` to the host;
test with pytest, using :class:`testing.MemoryHost`. Per-key event-time
timers (``ctx.set_timer``, :meth:`Module.on_timers`) and windows built on
them (:mod:`.windows`) are described in ``docs/timers.md``.

A minimal handler::

    from dataclasses import dataclass
    from wakuwaku_guest import Context, Event, Module, export

    @dataclass
    class Visited(Event, tag=1):
        user: int
        page: str

        def key(self) -> int:
            return self.user

    visits = Module("visits")

    @visits.handles(Visited)
    def visited(ctx: Context, events: list[Visited]) -> None:
        seen = ctx.get("visits") or 0
        ctx.set("visits", seen + len(events))
        ctx.counter_add("all_visits", len(events))

    Handler = export(visits)

and its test::

    from wakuwaku_guest.testing import MemoryHost

    def test_counts_visits():
        host = MemoryHost(visits)
        host.handle([Visited(7, "/"), Visited(7, "/"), Visited(8, "/")])
        assert host.get(7, "visits") == 2
        assert host.counter("all_visits") == 3

Errors
------

A handler raises a :class:`HandlerError`; its class decides where the host
sends the events of the failed call:

- :class:`TransientError`: may succeed right away; retried in place a few
  times, then treated as retryable.
- :class:`RetryableError`: may succeed later; the key's unfinished work goes
  to the retry topic and its later events queue behind it.
- :class:`UnrecoverableError`: will never succeed; the events go to the
  dead-letter topic with the message, and the key goes on.

The SDK itself raises unrecoverable errors for a body that does not decode
(naming the event type), a tag the module does not handle (naming the tag),
a state entry that does not decode as the requested type (naming the
entry), and a ``combine`` on a type that is not associative. A value the
host refuses (over a limit, an undeclared emit topic) raises
:class:`Refused`, an unrecoverable error whose message names the rule; a
handler may catch it and go on. Any other exception fails the call as
retryable, as a trap would. Whatever the error, nothing the failed call
wrote is kept.

Layout
------

- :mod:`.event`: :class:`Event`, what an author subclasses.
- :mod:`.module`: :class:`Module` and :func:`handles`: dispatch by tag over
  bytes, the WIT ``handler`` interface in plain Python.
- :mod:`.context`: :class:`Context`, what a handler can do during a call,
  and :class:`Timer`.
- :mod:`.windows`: tumbling, hopping and session windows on timers.
- :mod:`.key`: the canonical key encoding shared with every guest SDK.
- :mod:`.codec`: JSON bodies and state entries checked against type hints.
- :mod:`.limits` and :mod:`.reduce`: the host's rules, for the test host.
- :mod:`.testing`: :class:`~testing.MemoryHost`, the test host.
- :mod:`.component`: :func:`export`, the bridge to componentize-py's
  bindings (the only module that imports them).
"""

from .codec import skip_if_default
from .component import export
from .context import Context, HostApi, Outgoing, Timer
from .event import Event
from .key import KeyFormatError, decode_key, encode_key, key_text, parse_key_text
from .module import EventTypeInfo, Module, ModuleInfo, handles, on_timers
from .types import (
    Algebra,
    ErrorClass,
    HandlerError,
    Level,
    Ordering,
    Refusal,
    Refused,
    RetryableError,
    Timing,
    TransientError,
    UnrecoverableError,
)

#: The WIT package and version this SDK's components implement.
WIT_PACKAGE = "wakuwaku:handler@0.5.0"

__all__ = [
    "WIT_PACKAGE",
    "Algebra",
    "Context",
    "ErrorClass",
    "Event",
    "EventTypeInfo",
    "HandlerError",
    "HostApi",
    "KeyFormatError",
    "Level",
    "Module",
    "ModuleInfo",
    "Ordering",
    "Outgoing",
    "Refusal",
    "Refused",
    "RetryableError",
    "Timer",
    "Timing",
    "TransientError",
    "UnrecoverableError",
    "decode_key",
    "encode_key",
    "export",
    "handles",
    "key_text",
    "on_timers",
    "parse_key_text",
    "skip_if_default",
]
