"""The bridge between componentize-py's bindings and a :class:`Module`.

A handler file ends with one line that gives the component its export::

    Handler = export(bank)

componentize-py looks for a class named ``Handler`` in the app module and
exports it as the WIT interface ``handler`` of world ``module``. Build it
with ``waku build <project>``, or by hand, with the SDK importable::

    componentize-py -d wit/handler-0.5.wit -w module componentize bank -o bank.wasm

The component implements contract 0.5 (with timers): its ``fire`` export
calls the module's timer handler (:meth:`Module.on_timers
<wakuwaku_guest.Module.on_timers>`), and a module without one (written
before timers) builds unchanged, its ``fire`` failing unrecoverably should
the host ever call it (the host calls ``fire`` only for timers the module
set).

What the bridge does:

- ``describe`` is computed once, when the app is imported at build time,
  and checked by the host's rules, so a module the host would refuse does
  not build.
- A :class:`~wakuwaku_guest.HandlerError` becomes the WIT ``handler-error``
  of its class, its message cut to the host's 4 KiB.
- Any other exception is reported as **retryable**, with its type, message
  and where it was raised: what the host does with a trap (a Rust panic),
  without losing the instance.
- The WIT ``timer`` records become :class:`~wakuwaku_guest.Timer`, both
  ways.
- A refusal from an import raises :class:`~wakuwaku_guest.types.Refusal`,
  which :class:`~wakuwaku_guest.Context` turns into
  :class:`~wakuwaku_guest.Refused`.

Outside a component (under pytest, say) the bindings do not exist and
:func:`export` returns a stand-in whose methods say so; test with
:class:`~wakuwaku_guest.testing.MemoryHost` instead.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from . import codec
from .context import Outgoing, Timer
from .limits import error_message
from .module import Module
from .types import Algebra, ErrorClass, HandlerError, Level, Ordering, Refusal

__all__ = ["export"]


def export(module: Module) -> type:
    """The class to bind to the name ``Handler`` in the app module: the
    component's ``handler`` export, calling ``module``."""
    try:
        from componentize_py_types import Err
        from wit_world.imports import emit as wit_emit
        from wit_world.imports import log as wit_log
        from wit_world.imports import state as wit_state
        from wit_world.imports import timers as wit_timers
        from wit_world.imports import types as wit
    except ImportError:
        return _stand_in(module)

    info = module.describe()
    # Compiled now, while componentize-py snapshots the app: in the
    # component from the first call, and a type hint that cannot be
    # resolved fails the build rather than a call.
    for kind in module.event_types:
        codec.prepare(kind)
    described = wit.ModuleInfo(
        [
            wit.EventType(t.tag, t.name, wit.Algebra[t.algebra.name], t.max_batch, wit.Timing[t.timing.name])
            for t in info.event_types
        ],
        list(info.emits),
    )
    orderings = {ordering: wit.Ordering[ordering.name] for ordering in Ordering}
    algebras = {algebra: wit.Algebra[algebra.name] for algebra in Algebra}
    error_classes = {error_class: wit.ErrorClass[error_class.name] for error_class in ErrorClass}
    levels = {level: wit_log.Level[level.name] for level in Level}
    retryable = wit.ErrorClass.RETRYABLE

    class WasmHost:
        """The host as seen from inside the component: every call is a WIT
        import; a refusal raises Refusal."""

        __slots__ = ()

        def get(self, name: str) -> bytes | None:
            try:
                return wit_state.get(name)
            except Err as refusal:
                raise Refusal(refusal.value) from None

        def set(self, name: str, value: bytes) -> None:
            try:
                wit_state.set(name, value)
            except Err as refusal:
                raise Refusal(refusal.value) from None

        def delete(self, name: str) -> None:
            try:
                wit_state.delete(name)
            except Err as refusal:
                raise Refusal(refusal.value) from None

        def counter_add(self, name: str, delta: int) -> None:
            try:
                wit_state.counter_add(name, delta)
            except Err as refusal:
                raise Refusal(refusal.value) from None

        def counter_get(self, name: str) -> int:
            try:
                return wit_state.counter_get(name)
            except Err as refusal:
                raise Refusal(refusal.value) from None

        def emit(self, message: Outgoing) -> None:
            outgoing = wit.Outgoing(
                message.topic,
                message.tag,
                message.key,
                orderings[message.ordering],
                algebras[message.algebra],
                message.body,
            )
            try:
                wit_emit.emit(outgoing)
            except Err as refusal:
                raise Refusal(refusal.value) from None

        def log(self, level: Level, message: str) -> None:
            wit_log.log(levels[level], message)

        def set_timer(self, name: str, at: int, payload: bytes) -> None:
            try:
                wit_timers.set(name, at, payload)
            except Err as refusal:
                raise Refusal(refusal.value) from None

        def cancel_timer(self, name: str) -> None:
            try:
                wit_timers.cancel(name)
            except Err as refusal:
                raise Refusal(refusal.value) from None

        def get_timer(self, name: str) -> Timer | None:
            try:
                timer = wit_timers.get(name)
            except Err as refusal:
                raise Refusal(refusal.value) from None
            return None if timer is None else Timer(timer.name, timer.at, bytes(timer.payload))

    host = WasmHost()

    def call(function: Callable[..., Any], *args: Any) -> Any:
        try:
            return function(*args)
        except HandlerError as error:
            raise Err(wit.HandlerError(error_classes[error.error_class], error_message(error.message))) from None
        except Exception as error:
            raise Err(wit.HandlerError(retryable, error_message(_uncaught(module, error)))) from None

    class Handler:
        """The component's ``handler`` export."""

        def describe(self) -> Any:
            return described

        def key(self, tag: int, body: bytes) -> bytes:
            return call(module.key, tag, body)

        def ordering(self, tag: int, body: bytes) -> Any:
            return orderings[call(module.ordering, tag, body)]

        def event_time(self, tag: int, body: bytes) -> int | None:
            return call(module.event_time, tag, body)

        def combine(self, tag: int, bodies: list[bytes]) -> bytes:
            return call(module.combine, tag, bodies)

        def handle(self, tag: int, key: bytes, bodies: list[bytes]) -> None:
            call(module.handle, host, tag, key, bodies)

        def fire(self, key: bytes, timers: list[Any]) -> None:
            fired = [Timer(timer.name, timer.at, bytes(timer.payload)) for timer in timers]
            call(module.fire, host, key, fired)

    return Handler


def _uncaught(module: Module, error: Exception) -> str:
    """What an uncaught exception is reported as: its type, message and the
    innermost frame it was raised in."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    return f"uncaught {type(error).__name__} in module {module.name}{where}: {error}"


def _stand_in(module: Module) -> type:
    module.describe()

    class Handler:
        """Stand-in for the component's export outside a component."""

        def __getattr__(self, name: str) -> Any:
            raise RuntimeError(
                f"the handler export of module {module.name} works only inside a component; "
                "test with wakuwaku_guest.testing.MemoryHost"
            )

    return Handler
