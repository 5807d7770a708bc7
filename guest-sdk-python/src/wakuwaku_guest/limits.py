"""The rules and limits of the module boundary, as the host applies them
(``core/src/limits.rs``), for the test host.

A handler running in the host meets these rules at every import call: a
value that breaks one is refused with a ``refusal`` naming the rule. The
test host (:mod:`wakuwaku_guest.testing`) applies the same rules with the
same messages, so a unit test sees what production would.

Rules kept here, as in the host:

- **Every refusal names its rule**: ``<rule>: <what is wrong>``, where
  ``<rule>`` is a stable id (``state-value-size``, ``emit-topic``, ...).
- **A refused value leaves nothing behind**: :class:`CallTally` counts a
  value against the per-call limits only when it is accepted.
- **Counters stay in the s64 range as each key sees them.**
- **What a module keeps is bounded**: a projection holds at most
  ``max_counters`` counters and a key at most ``max_entries_per_key``
  entries (``counter-count``, ``entries-per-key``); only a new counter or
  entry past the quota is refused, changing what exists never is.
- **Timers keep their own rules** (contract 0.5, ``docs/timers.md``): a
  name of 1 to 128 bytes without NUL (``timer-name``), a payload within
  ``max_timer_payload`` (``timer-payload-size``), a time below the largest
  s64 (``timer-time``), during ``fire`` only later than the timers fired
  (``timer-at-firing``); each ``set`` and ``cancel`` counts as a state
  write; a key holds at most ``max_timers_per_key`` timers and a
  projection ``max_timers`` (``timers-per-key``, ``timers-in-all``: only a
  new timer past them is refused, moving or cancelling one never is).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from .key import KeyFormatError, decode_key
from .types import Refusal

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_EVENT_TYPES",
    "MAX_EVENT_TYPE_NAME_BYTES",
    "MAX_EMIT_TOPICS",
    "MAX_TOPIC_NAME_BYTES",
    "MAX_ERROR_MESSAGE_BYTES",
    "MAX_TIMER_NAME_BYTES",
    "I64_MIN",
    "I64_MAX",
    "PayloadLimits",
    "CallTally",
    "LogTally",
    "ContractError",
    "check_name",
    "check_counter_count",
    "check_entries_per_key",
    "check_timer_name",
    "check_timer",
    "check_timers_per_key",
    "check_timers_in_all",
    "counter_value",
    "check_description",
    "check_emits",
    "check_key",
    "check_combined_body",
    "error_message",
    "is_event_type_name",
    "is_topic_name",
    "is_host_topic",
]

#: The longest state entry or counter name, in bytes.
MAX_NAME_BYTES = 256
#: The most event types one module may declare.
MAX_EVENT_TYPES = 256
#: The longest event type name, in bytes.
MAX_EVENT_TYPE_NAME_BYTES = 128
#: The most topics one module may declare it emits to.
MAX_EMIT_TOPICS = 64
#: The longest topic name, in bytes.
MAX_TOPIC_NAME_BYTES = 255
#: The longest handler-error message the host keeps, in bytes.
MAX_ERROR_MESSAGE_BYTES = 4 << 10
#: The longest timer name, in bytes (``timer-name``).
MAX_TIMER_NAME_BYTES = 128

I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1

_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
_EVENT_TYPE_NAME_CHARS = _TOPIC_CHARS | {":"}


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def is_topic_name(topic: str) -> bool:
    """1 to 255 bytes of ASCII letters, digits, ``_``, ``-`` and ``.``."""
    return 0 < len(topic) <= MAX_TOPIC_NAME_BYTES and all(char in _TOPIC_CHARS for char in topic)


def is_host_topic(topic: str) -> bool:
    """One of the host's own topics (``retry_*``, ``dlq_*``)."""
    return topic.startswith(("retry_", "dlq_"))


def is_event_type_name(name: str) -> bool:
    """1 to 128 bytes of ASCII letters, digits, ``_``, ``-``, ``.`` and ``:``."""
    return 0 < len(name) <= MAX_EVENT_TYPE_NAME_BYTES and all(char in _EVENT_TYPE_NAME_CHARS for char in name)


def _cut(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` UTF-8 bytes at a character
    boundary, and whether it was cut."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


def error_message(message: str) -> str:
    """A handler-error message as the host keeps it: at most 4 KiB, marked
    when cut."""
    kept, cut = _cut(message, MAX_ERROR_MESSAGE_BYTES)
    return f"{kept} […cut]" if cut else message


def _quoted(text: str) -> str:
    kept, cut = _cut(text, 64)
    return f"{kept}…" if cut else kept


@dataclasses.dataclass(frozen=True)
class PayloadLimits:
    """How much a module may hand the host per value and per ``handle``
    call, and how much state it may keep; the host's defaults. Counts and
    bytes per call count every accepted call of the import, also when it
    writes the same entry again; refused calls count nothing."""

    #: Largest state value, in bytes.
    max_state_value: int = 1 << 20
    #: Most state writes (``set`` and ``delete``) in one call.
    max_state_writes_per_call: int = 1_000
    #: Most bytes of entry names and values written in one call.
    max_state_bytes_per_call: int = 4 << 20
    #: Most counter changes in one call.
    max_counter_changes_per_call: int = 1_000
    #: Largest body a handler may emit, or ``combine`` may return, in bytes.
    max_emit_body: int = 1 << 20
    #: Most messages emitted in one call.
    max_emits_per_call: int = 1_000
    #: Most bytes of topics, keys and bodies emitted in one call.
    max_emit_bytes_per_call: int = 4 << 20
    #: Longest log line kept, in bytes; longer ones are cut and marked.
    max_log_line: int = 4 << 10
    #: Most log lines kept per call; later ones are dropped and counted.
    max_log_lines_per_call: int = 100
    #: Most distinct counters a projection holds; a new one past it is refused.
    max_counters: int = 10_000
    #: Most entries one key holds; a new one past it is refused.
    max_entries_per_key: int = 1_000
    #: Largest payload of a timer, in bytes (``timer-payload-size``).
    max_timer_payload: int = 1 << 10
    #: Most timers one key holds; a new one past it is refused (``timers-per-key``).
    max_timers_per_key: int = 100
    #: Most timers a projection holds; a new one past it is refused (``timers-in-all``).
    max_timers: int = 1_000_000


def check_name(name: str) -> None:
    """An entry or counter name is 1 to 256 bytes, without a NUL."""
    length = _utf8_len(name)
    if not 1 <= length <= MAX_NAME_BYTES:
        raise Refusal(
            f"name-length: an entry or counter name is 1 to {MAX_NAME_BYTES} bytes; this one has {length}"
        )
    if "\0" in name:
        at = _utf8_len(name[: name.index("\0")])
        raise Refusal(
            f"name-nul: an entry or counter name holds no NUL character (U+0000); this one has one at byte {at}"
        )


def check_counter_count(limits: PayloadLimits, name: str, held: int) -> None:
    """A change that would make counter ``name`` a new one, while the
    projection holds ``held`` counters: refused at ``max_counters``."""
    if held >= limits.max_counters:
        raise Refusal(
            f"counter-count: the projection holds {held} counters (committed and pending), at most "
            f"{limits.max_counters}; counter `{_quoted(name)}` would be a new one"
        )


def check_entries_per_key(limits: PayloadLimits, name: str, held: int) -> None:
    """A set that would make entry ``name`` a new one, while the key holds
    ``held`` entries: refused at ``max_entries_per_key``."""
    if held >= limits.max_entries_per_key:
        raise Refusal(
            f"entries-per-key: this key holds {held} entries (committed and written in this batch), at most "
            f"{limits.max_entries_per_key}; entry `{_quoted(name)}` would be a new one"
        )


def check_timer_name(name: str) -> None:
    """A timer name is 1 to 128 bytes, without a NUL (``timer-name``)."""
    length = _utf8_len(name)
    if not 1 <= length <= MAX_TIMER_NAME_BYTES:
        raise Refusal(
            f"timer-name: a timer name is 1 to {MAX_TIMER_NAME_BYTES} bytes without NUL; this one has {length} bytes"
        )
    if "\0" in name:
        at = _utf8_len(name[: name.index("\0")])
        raise Refusal(
            f"timer-name: a timer name is 1 to {MAX_TIMER_NAME_BYTES} bytes without NUL; this one has a NUL at byte {at}"
        )


def check_timer(limits: PayloadLimits, name: str, at: int, payload_len: int, firing: int | None) -> None:
    """Checks a timer ``set`` as a value: its name, its payload of
    ``payload_len`` bytes, its time ``at``, and during ``fire`` of the
    timers at ``firing``, that it is later (``timer-at-firing``)."""
    check_timer_name(name)
    if payload_len > limits.max_timer_payload:
        raise Refusal(
            f"timer-payload-size: timer `{_quoted(name)}` has a payload of {payload_len} bytes, over the limit of "
            f"{limits.max_timer_payload} bytes"
        )
    if at == I64_MAX:
        raise Refusal(
            f"timer-time: timer `{_quoted(name)}` is set at {at}, the largest time, which no clock ever passes"
        )
    if firing is not None and not at > firing:
        raise Refusal(
            f"timer-at-firing: timer `{_quoted(name)}` is set at {at} while the timers at {firing} fire; a call "
            f"that fires timers sets timers only later than them"
        )


def check_timers_per_key(limits: PayloadLimits, name: str, held: int) -> None:
    """A set that would make timer ``name`` a new one, while the key holds
    ``held`` timers: refused at ``max_timers_per_key``."""
    if held >= limits.max_timers_per_key:
        raise Refusal(
            f"timers-per-key: a key holds at most {limits.max_timers_per_key} timers (it holds {held}); timer "
            f"`{_quoted(name)}` would be a new one (moving or cancelling one is allowed)"
        )


def check_timers_in_all(limits: PayloadLimits, name: str, held: int) -> None:
    """A set that would make timer ``name`` a new one, while the projection
    holds ``held`` timers: refused at ``max_timers``."""
    if held >= limits.max_timers:
        raise Refusal(
            f"timers-in-all: a projection holds at most {limits.max_timers} timers (it holds {held}); timer "
            f"`{_quoted(name)}` would be a new one"
        )


def counter_value(name: str, value: int) -> int:
    """A counter's value as a key reads it: refused when outside the s64
    range (several keys' changes committed together can take it there)."""
    if not I64_MIN <= value <= I64_MAX:
        raise Refusal(f"counter-range: counter `{name}` is {value}, outside the s64 range")
    return value


@dataclasses.dataclass
class CallTally:
    """What one ``handle`` call has handed the host so far. Each method
    checks one import call's values and, when they pass, counts them; a
    refused call raises :class:`~wakuwaku_guest.types.Refusal` and counts
    nothing."""

    state_writes: int = 0
    state_bytes: int = 0
    counter_changes: int = 0
    emits: int = 0
    emit_bytes: int = 0

    def set(self, limits: PayloadLimits, name: str, value_len: int) -> None:
        """Checks a ``set`` of ``name`` to a value of ``value_len`` bytes."""
        check_name(name)
        if value_len > limits.max_state_value:
            raise Refusal(
                f"state-value-size: state value `{name}` has {value_len} bytes, over the limit of "
                f"{limits.max_state_value} bytes"
            )
        self._write(limits, _utf8_len(name) + value_len)

    def delete(self, limits: PayloadLimits, name: str) -> None:
        """Checks a ``delete`` of ``name``."""
        check_name(name)
        self._write(limits, _utf8_len(name))

    def timer_set(self, limits: PayloadLimits, name: str, at: int, payload_len: int, firing: int | None) -> None:
        """Checks a timer ``set``: the timer's own rules, then a state write
        of its name and payload."""
        check_timer(limits, name, at, payload_len, firing)
        self._write(limits, _utf8_len(name) + payload_len)

    def timer_cancel(self, limits: PayloadLimits, name: str) -> None:
        """Checks a timer ``cancel`` of ``name``: a state write of its name."""
        check_timer_name(name)
        self._write(limits, _utf8_len(name))

    def _write(self, limits: PayloadLimits, size: int) -> None:
        if self.state_writes >= limits.max_state_writes_per_call:
            raise Refusal(
                f"state-writes-per-call: one call may write (set or delete) at most "
                f"{limits.max_state_writes_per_call} entries"
            )
        would = self.state_bytes + size
        if would > limits.max_state_bytes_per_call:
            raise Refusal(
                f"state-bytes-per-call: one call may write at most {limits.max_state_bytes_per_call} bytes of "
                f"names and values; this write would make {would}"
            )
        self.state_writes += 1
        self.state_bytes = would

    def counter_add(self, limits: PayloadLimits, name: str, current: int, delta: int) -> int:
        """Checks adding ``delta`` to counter ``name``, whose value as the key
        sees it is ``current``; returns the value afterwards."""
        check_name(name)
        if self.counter_changes >= limits.max_counter_changes_per_call:
            raise Refusal(
                f"counter-changes-per-call: one call may change counters at most "
                f"{limits.max_counter_changes_per_call} times"
            )
        after = current + delta
        if not I64_MIN <= after <= I64_MAX:
            raise Refusal(
                f"counter-range: counter `{name}` is {current} as this key sees it; adding {delta} leaves the "
                f"s64 range"
            )
        self.counter_changes += 1
        return after

    def emit(self, limits: PayloadLimits, declared: Sequence[str], topic: str, key: bytes, body: bytes) -> None:
        """Checks an emit of ``body`` with key bytes ``key`` to ``topic``,
        which must be among ``declared``."""
        if topic not in declared:
            listed = ", ".join(declared) if declared else "none"
            raise Refusal(
                f"emit-topic: `{_quoted(topic)}` is not among the topics the module declared in "
                f"`module-info.emits` ({listed})"
            )
        if not 1 <= len(body) <= limits.max_emit_body:
            raise Refusal(
                f"emit-body-size: an emitted body is 1 to {limits.max_emit_body} bytes; this one has {len(body)}"
            )
        try:
            decode_key(key)
        except KeyFormatError as error:
            raise Refusal(f"emit-key: the message's key is not canonical: {error}") from None
        if self.emits >= limits.max_emits_per_call:
            raise Refusal(f"emits-per-call: one call may emit at most {limits.max_emits_per_call} messages")
        would = self.emit_bytes + _utf8_len(topic) + len(key) + len(body)
        if would > limits.max_emit_bytes_per_call:
            raise Refusal(
                f"emit-bytes-per-call: one call may emit at most {limits.max_emit_bytes_per_call} bytes of "
                f"topics, keys and bodies; this message would make {would}"
            )
        self.emits += 1
        self.emit_bytes = would


@dataclasses.dataclass
class LogTally:
    """The log lines of one call: each cut to the line limit, at most the
    per-call count of them, the rest counted. Logging never fails a call."""

    lines: int = 0
    dropped: int = 0

    def admit(self, limits: PayloadLimits, message: str) -> str | None:
        """The line to keep for ``message`` (cut and marked when long), or
        ``None`` when the call has logged its limit of lines."""
        if self.lines >= limits.max_log_lines_per_call:
            self.dropped += 1
            return None
        self.lines += 1
        kept, cut = _cut(message, limits.max_log_line)
        return f"{kept} […cut]" if cut else kept

    def finish(self, limits: PayloadLimits) -> str | None:
        """Ends a call: the closing line saying how many lines were dropped,
        if any; the tally starts again at zero."""
        dropped = self.dropped
        self.lines = self.dropped = 0
        if not dropped:
            return None
        return (
            f"log-lines-per-call: {dropped} more log lines of this call dropped (at most "
            f"{limits.max_log_lines_per_call} per call)"
        )


class ContractError(ValueError):
    """A value a module's export returned that the host cannot use (a bad
    ``describe`` answer, a key that is not canonical, an empty combined
    body), naming the rule it broke. The host refuses such a module at load,
    or fails the call."""

    @property
    def rule(self) -> str:
        """The id of the rule broken, e.g. ``event-type-tag``."""
        return str(self).split(":", 1)[0]


RESERVED_TAG = 4_294_967_295
"""The tag no module may declare: the host's for the dead letters of timers
(``core/src/limits.rs``'s ``RESERVED_TAG``)."""


def check_description(event_types: Iterable[tuple[int, str, int]], emits: Sequence[str]) -> None:
    """Checks what ``describe`` returns: 1 to 256 event types given as
    ``(tag, name, max_batch)``, tags unique, names valid, none the
    ``RESERVED_TAG``, max batch at least 1; at most 64 emit topics, each a valid topic name, none of the host's
    own, none twice."""
    types = list(event_types)
    if not 1 <= len(types) <= MAX_EVENT_TYPES:
        raise ContractError(
            f"event-type-count: a module handles 1 to {MAX_EVENT_TYPES} event types; this one declares {len(types)}"
        )
    tags: set[int] = set()
    for tag, name, max_batch in types:
        if tag in tags:
            raise ContractError(f"event-type-tag: tag {tag} is declared twice")
        tags.add(tag)
        if not is_event_type_name(name):
            raise ContractError(
                f"event-type-name: tag {tag} is named `{_quoted(name)}`; a name is 1 to "
                f"{MAX_EVENT_TYPE_NAME_BYTES} bytes of letters, digits, `_`, `-`, `.` and `:`"
            )
        if tag == RESERVED_TAG:
            raise ContractError(
                f"event-type-tag-reserved: event type `{name}` declares tag {RESERVED_TAG}, which the host reserves "
                "for the dead letters of timers; give it another tag"
            )
        if max_batch == 0:
            raise ContractError(f"max-batch: event type `{name}` declares max-batch 0 (it must be at least 1)")
    check_emits(emits)


def check_emits(emits: Sequence[str]) -> None:
    """Checks the topics a module declares it emits to: at most 64, each a
    valid topic name, none of the host's own, none twice."""
    if len(emits) > MAX_EMIT_TOPICS:
        raise ContractError(
            f"emit-topic-count: a module declares at most {MAX_EMIT_TOPICS} emit topics; this one declares "
            f"{len(emits)}"
        )
    for index, topic in enumerate(emits):
        if not is_topic_name(topic):
            raise ContractError(
                f"emit-topic-name: `{_quoted(topic)}` is not a topic name (1 to {MAX_TOPIC_NAME_BYTES} bytes of "
                f"letters, digits, `_`, `-` and `.`)"
            )
        if is_host_topic(topic):
            raise ContractError(
                f"emit-topic-host-owned: `{topic}` is the host's own (modules never write to `retry_*` or `dlq_*` "
                f"topics)"
            )
        if topic in emits[:index]:
            raise ContractError(f"emit-topic-duplicate: `{topic}` is declared twice")


def check_key(key: bytes) -> None:
    """Checks a key the module's ``key`` export returned."""
    try:
        decode_key(key)
    except KeyFormatError as error:
        raise ContractError(f"key-canonical: the key the module returned is not canonical: {error}") from None


def check_combined_body(limits: PayloadLimits, body: bytes) -> None:
    """Checks a body ``combine`` returned: 1 byte to the emit body limit."""
    if not 1 <= len(body) <= limits.max_emit_body:
        raise ContractError(
            f"combine-body-size: `combine` returns a body of 1 to {limits.max_emit_body} bytes; this one has "
            f"{len(body)}"
        )
