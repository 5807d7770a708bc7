"""The bridge to componentize-py's bindings, against stand-in bindings
shaped as componentize-py 0.25 generates them for `wit/handler-0.5.wit`: what
crosses the boundary (timers both ways), how errors and refusals map, and
that an uncaught exception is reported as retryable."""

from __future__ import annotations

import enum
import sys
import types
from dataclasses import dataclass

import pytest

from wakuwaku_guest import (
    Algebra,
    Context,
    Event,
    Module,
    Ordering,
    Refused,
    Timer,
    Timing,
    TransientError,
    UnrecoverableError,
    encode_key,
    export,
)


@dataclass(frozen=True)
class Err(Exception):
    value: object


def fake_bindings(refuse: set[str]) -> dict[str, types.ModuleType]:
    """Modules `wit_world.imports.*` and `componentize_py_types`; the
    state and emit imports record their calls and refuse those in
    `refuse`."""
    wit = types.ModuleType("wit_world.imports.types")
    wit.Algebra = enum.Enum("Algebra", "NON_ASSOCIATIVE COMMUTATIVE IDEMPOTENT IDEMPOTENT_COMMUTATIVE ASSOCIATIVE")
    wit.Ordering = enum.Enum("Ordering", "RELAXED ACQUIRE RELEASE ACQ_REL")
    wit.ErrorClass = enum.Enum("ErrorClass", "TRANSIENT RETRYABLE UNRECOVERABLE")
    wit.Timing = enum.Enum("Timing", "UNTIMED TIMED TIMED_RELAXED")

    @dataclass
    class EventType:
        tag: int
        name: str
        algebra: object
        max_batch: int
        timing: object

    @dataclass
    class ModuleInfo:
        event_types: list
        emits: list

    @dataclass
    class HandlerError:
        class_: object
        message: str

    @dataclass
    class Outgoing:
        topic: str
        tag: int
        key: bytes
        ordering: object
        algebra: object
        body: bytes

    @dataclass
    class WitTimer:
        name: str
        at: int
        payload: bytes

    wit.EventType, wit.ModuleInfo, wit.HandlerError, wit.Outgoing = EventType, ModuleInfo, HandlerError, Outgoing
    wit.Timer = WitTimer
    calls: list[tuple] = []
    stored: dict[str, bytes] = {}

    def recorded(name, result=None):
        def call(*args):
            calls.append((name, *args))
            if name in refuse:
                raise Err(f"{name}-rule: refused")
            return result(*args) if result else None

        return call

    state = types.ModuleType("wit_world.imports.state")
    state.get = recorded("get", lambda name: stored.get(name))
    state.set = recorded("set", lambda name, value: stored.__setitem__(name, value))
    state.delete = recorded("delete")
    state.counter_add = recorded("counter_add")
    state.counter_get = recorded("counter_get", lambda name: 41)
    emit = types.ModuleType("wit_world.imports.emit")
    emit.emit = recorded("emit")
    log = types.ModuleType("wit_world.imports.log")
    log.Level = enum.Enum("Level", "TRACE DEBUG INFO WARN ERROR")
    log.log = recorded("log")
    timers = types.ModuleType("wit_world.imports.timers")
    pending: dict[str, WitTimer] = {}
    timers.set = recorded("timer_set", lambda name, at, payload: pending.__setitem__(name, WitTimer(name, at, payload)))
    timers.cancel = recorded("timer_cancel", lambda name: pending.pop(name, None) and None)
    timers.get = recorded("timer_get", lambda name: pending.get(name))
    runtime = types.ModuleType("componentize_py_types")
    runtime.Err = Err
    imports = types.ModuleType("wit_world.imports")
    imports.types, imports.state, imports.emit, imports.log = wit, state, emit, log
    imports.timers = timers
    world = types.ModuleType("wit_world")
    world.imports = imports
    world.calls = calls
    return {
        "componentize_py_types": runtime,
        "wit_world": world,
        "wit_world.imports": imports,
        "wit_world.imports.types": wit,
        "wit_world.imports.state": state,
        "wit_world.imports.emit": emit,
        "wit_world.imports.log": log,
        "wit_world.imports.timers": timers,
    }


@dataclass
class Noted(Event, tag=9, algebra=Algebra.IDEMPOTENT, max_batch=4):
    user: int
    note: str

    def key(self) -> int:
        return self.user

    def ordering(self) -> Ordering:
        return Ordering.ACQ_REL if self.note == "fence" else Ordering.RELAXED


@dataclass
class Stamped(Event, tag=10, timing=Timing.TIMED):
    user: int
    at: int | None

    def key(self) -> int:
        return self.user

    def event_time(self) -> int | None:
        return self.at


notes = Module("notes", emits=["out"])


@notes.handles(Stamped)
def stamped(ctx: Context, events: list[Stamped]) -> None:
    pass


@notes.handles(Noted)
def noted(ctx: Context, events: list[Noted]) -> None:
    for event in events:
        if event.note == "busy":
            raise TransientError("try again")
        if event.note == "bug":
            {}["missing"]
        if event.note == "over":
            ctx.set("n", 1)
        if event.note == "refusal-caught":
            try:
                ctx.set("n", 1)
            except Refused as refusal:
                ctx.warn(refusal.rule)
            return
        if event.note == "long":
            raise UnrecoverableError("é" * 10_000)
    ctx.set("last", events[-1].note)
    ctx.counter_add("notes", len(events))
    ctx.set("seen", ctx.counter_get("notes"))
    ctx.emit("out", events[-1])
    ctx.debug("done")


reminders = Module("reminders", emits=["out"])


@reminders.handles(Noted)
def remind(ctx: Context, events: list[Noted]) -> None:
    for event in events:
        ctx.set_timer("remind", 1_000, {"note": event.note})
    ctx.cancel_timer("gone")
    assert ctx.timer("remind") == Timer("remind", 1_000, b'{"note":"' + events[-1].note.encode() + b'"}')


@reminders.on_timers
def reminded(ctx: Context, timers: list[Timer]) -> None:
    for timer in timers:
        ctx.set("reminded", [timer.name, timer.at, timer.decode()])
        ctx.set_timer("again", timer.at + 1, None)


def exported(monkeypatch, refuse=(), module=notes):
    modules = fake_bindings(set(refuse))
    for name, bindings in modules.items():
        monkeypatch.setitem(sys.modules, name, bindings)
    return export(module)(), modules


def test_describe_key_ordering_and_handle_cross_the_boundary(monkeypatch):
    handler, modules = exported(monkeypatch)
    wit = modules["wit_world.imports.types"]
    info = handler.describe()
    assert info.emits == ["out"]
    assert [(t.tag, t.name, t.algebra, t.max_batch, t.timing) for t in info.event_types] == [
        (10, "Stamped", wit.Algebra.NON_ASSOCIATIVE, 256, wit.Timing.TIMED),
        (9, "Noted", wit.Algebra.IDEMPOTENT, 4, wit.Timing.UNTIMED),
    ]
    assert handler.key(9, b'{"user": 3, "note": "x"}') == encode_key(3)
    assert handler.ordering(9, b'{"user": 3, "note": "fence"}') is wit.Ordering.ACQ_REL
    handler.handle(9, encode_key(3), [Noted(3, "a").encode(), Noted(3, "b").encode()])
    calls = modules["wit_world"].calls
    assert calls[:4] == [("set", "last", b'"b"'), ("counter_add", "notes", 2), ("counter_get", "notes"), ("set", "seen", b"41")]
    (_, outgoing) = calls[4]
    assert (outgoing.topic, outgoing.tag, outgoing.key, outgoing.ordering, outgoing.algebra, outgoing.body) == (
        "out", 9, encode_key(3), wit.Ordering.RELAXED, wit.Algebra.IDEMPOTENT, b'{"user":3,"note":"b"}'
    )
    assert calls[5] == ("log", modules["wit_world.imports.log"].Level.DEBUG, "done")


def test_event_time_crosses_the_boundary_for_a_timed_type_only(monkeypatch):
    handler, modules = exported(monkeypatch)
    classes = modules["wit_world.imports.types"].ErrorClass
    assert handler.event_time(10, b'{"user": 3, "at": 1796212800000}') == 1796212800000
    assert handler.event_time(9, b"not even json") is None, "an untimed type is not decoded"
    missing = error_of(lambda: handler.event_time(10, b'{"user": 3, "at": null}'))
    assert missing.class_ is classes.UNRECOVERABLE and missing.message.startswith("event-time-declared: Stamped")
    too_big = error_of(lambda: handler.event_time(10, b'{"user": 3, "at": 9223372036854775808}'))
    assert too_big.message.startswith("event-time-declared: ")


def error_of(call):
    with pytest.raises(Err) as raised:
        call()
    return raised.value.value


def test_errors_keep_their_class_and_uncaught_exceptions_are_retryable(monkeypatch):
    handler, modules = exported(monkeypatch)
    classes = modules["wit_world.imports.types"].ErrorClass
    busy = error_of(lambda: handler.handle(9, encode_key(1), [Noted(1, "busy").encode()]))
    assert (busy.class_, busy.message) == (classes.TRANSIENT, "try again")
    malformed = error_of(lambda: handler.key(9, b'{"user": "x"}'))
    assert malformed.class_ is classes.UNRECOVERABLE and malformed.message.startswith("malformed Noted body: ")
    unknown = error_of(lambda: handler.combine(1, [b"{}"]))
    assert (unknown.class_, unknown.message) == (classes.UNRECOVERABLE, "module notes has no event type with tag 1")
    bug = error_of(lambda: handler.handle(9, encode_key(1), [Noted(1, "bug").encode()]))
    assert bug.class_ is classes.RETRYABLE
    assert bug.message.startswith("uncaught KeyError in module notes at ") and "in noted: 'missing'" in bug.message


def test_a_refusal_fails_the_call_as_unrecoverable_unless_caught(monkeypatch):
    handler, modules = exported(monkeypatch, refuse={"set"})
    classes = modules["wit_world.imports.types"].ErrorClass
    refused = error_of(lambda: handler.handle(9, encode_key(1), [Noted(1, "over").encode()]))
    assert (refused.class_, refused.message) == (classes.UNRECOVERABLE, "cannot write state entry `n`: set-rule: refused")
    handler.handle(9, encode_key(1), [Noted(1, "refusal-caught").encode()])
    assert modules["wit_world"].calls[-1] == ("log", modules["wit_world.imports.log"].Level.WARN, "set-rule")
    handler, modules = exported(monkeypatch, refuse={"emit"})
    emit_refused = error_of(lambda: handler.handle(9, encode_key(1), [Noted(1, "a").encode()]))
    assert emit_refused.message == "cannot emit Noted to `out`: emit-rule: refused"


def test_long_error_messages_are_cut_to_the_hosts_limit(monkeypatch):
    handler, _ = exported(monkeypatch)
    long = error_of(lambda: handler.handle(9, encode_key(1), [Noted(1, "long").encode()]))
    assert long.message.endswith(" […cut]")
    assert len(long.message.encode()) <= 4096 + len(" […cut]".encode())


def test_outside_a_component_export_gives_a_stand_in(monkeypatch):
    monkeypatch.setitem(sys.modules, "wit_world", None)
    handler = export(notes)()
    with pytest.raises(RuntimeError, match="works only inside a component; test with wakuwaku_guest.testing.MemoryHost"):
        handler.describe()


def test_timers_cross_the_boundary_both_ways(monkeypatch):
    handler, modules = exported(monkeypatch, module=reminders)
    wit = modules["wit_world.imports.types"]
    handler.handle(9, encode_key(3), [Noted(3, "a").encode()])
    calls = modules["wit_world"].calls
    assert calls == [
        ("timer_set", "remind", 1_000, b'{"note":"a"}'),
        ("timer_cancel", "gone"),
        ("timer_get", "remind"),
    ]
    calls.clear()
    handler.fire(encode_key(3), [wit.Timer("remind", 1_000, b'{"note":"a"}')])
    assert calls == [("set", "reminded", b'["remind",1000,{"note":"a"}]'), ("timer_set", "again", 1_001, b"null")]


def test_a_timer_refusal_names_the_timer_and_the_rule(monkeypatch):
    handler, modules = exported(monkeypatch, refuse={"timer_set"}, module=reminders)
    classes = modules["wit_world.imports.types"].ErrorClass
    refused = error_of(lambda: handler.handle(9, encode_key(1), [Noted(1, "a").encode()]))
    assert (refused.class_, refused.message) == (classes.UNRECOVERABLE, "cannot set timer `remind`: timer_set-rule: refused")


def test_a_module_written_before_timers_builds_and_fails_a_fire_call_unrecoverably(monkeypatch):
    handler, modules = exported(monkeypatch)
    wit = modules["wit_world.imports.types"]
    error = error_of(lambda: handler.fire(encode_key(1), [wit.Timer("x", 5, b"")]))
    assert (error.class_, error.message) == (
        wit.ErrorClass.UNRECOVERABLE,
        "module notes handles no timers, but was asked to fire 1 of them",
    )
