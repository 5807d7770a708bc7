"""The host's rules and limits, with the host's messages: the same cases
and expected words as `core/src/limits.rs`'s tests."""

from __future__ import annotations

import pytest

from wakuwaku_guest import Refusal, encode_key
from wakuwaku_guest.limits import (
    I64_MAX,
    I64_MIN,
    MAX_EMIT_TOPICS,
    MAX_ERROR_MESSAGE_BYTES,
    MAX_EVENT_TYPES,
    CallTally,
    ContractError,
    LogTally,
    PayloadLimits,
    check_combined_body,
    check_counter_count,
    check_description,
    check_entries_per_key,
    check_key,
    check_name,
    counter_value,
    error_message,
    is_event_type_name,
)

SMALL = PayloadLimits(
    max_state_value=8,
    max_state_writes_per_call=3,
    max_state_bytes_per_call=20,
    max_counter_changes_per_call=2,
    max_emit_body=8,
    max_emits_per_call=2,
    max_emit_bytes_per_call=24,
    max_log_line=5,
    max_log_lines_per_call=2,
    max_counters=3,
    max_entries_per_key=2,
)


def rule(call, *args):
    """The rule id of what `call(*args)` raises."""
    with pytest.raises((Refusal, ContractError)) as raised:
        call(*args)
    return raised.value.rule


def test_names_are_one_to_256_bytes():
    assert rule(check_name, "") == "name-length"
    assert rule(check_name, "n" * 257) == "name-length"
    assert rule(check_name, "é" * 129) == "name-length", "bytes are counted, not characters"
    assert rule(check_name, "a\0b") == "name-nul"
    check_name("n")
    check_name("n" * 256)


def test_state_writes_are_checked_then_counted():
    tally = CallTally()
    with pytest.raises(Refusal) as raised:
        tally.set(SMALL, "big", 9)
    assert str(raised.value) == "state-value-size: state value `big` has 9 bytes, over the limit of 8 bytes"
    assert tally == CallTally(), "a refused write counts nothing"
    tally.set(SMALL, "a", 8)
    tally.delete(SMALL, "bb")
    assert (tally.state_writes, tally.state_bytes) == (2, 11)
    assert rule(tally.set, SMALL, "c", 9) == "state-value-size"
    tally.set(SMALL, "c", 8)
    assert rule(tally.delete, SMALL, "d") == "state-writes-per-call"
    tally = CallTally()
    tally.set(SMALL, "aaaaaaaaaaaa", 8)
    with pytest.raises(Refusal) as raised:
        tally.set(SMALL, "b", 1)
    assert str(raised.value) == (
        "state-bytes-per-call: one call may write at most 20 bytes of names and values; this write would make 22"
    )
    assert rule(tally.delete, SMALL, "") == "name-length"


def test_counters_stay_in_range_as_the_key_sees_them():
    tally = CallTally()
    assert tally.counter_add(SMALL, "c", I64_MAX - 1, 1) == I64_MAX
    with pytest.raises(Refusal) as raised:
        tally.counter_add(SMALL, "c", I64_MAX, 1)
    assert str(raised.value) == (
        "counter-range: counter `c` is 9223372036854775807 as this key sees it; adding 1 leaves the s64 range"
    )
    assert tally.counter_changes == 1, "the refused change is not counted"
    assert tally.counter_add(SMALL, "c", I64_MAX + 5, -5) == I64_MAX
    assert rule(tally.counter_add, SMALL, "c", 0, 1) == "counter-changes-per-call"
    assert rule(counter_value, "c", I64_MIN - 1) == "counter-range"
    assert counter_value("c", -3) == -3


def test_emits_go_to_declared_topics_with_canonical_keys_and_bounded_bodies():
    declared = ["out"]
    key = encode_key(7)
    tally = CallTally()
    with pytest.raises(Refusal) as raised:
        tally.emit(SMALL, declared, "dlq_in", key, b"b")
    assert str(raised.value) == (
        "emit-topic: `dlq_in` is not among the topics the module declared in `module-info.emits` (out)"
    )
    with pytest.raises(Refusal) as raised:
        tally.emit(SMALL, [], "out", key, b"b")
    assert str(raised.value).endswith("(none)")
    assert rule(tally.emit, SMALL, declared, "out", key, b"") == "emit-body-size"
    assert rule(tally.emit, SMALL, declared, "out", key, b"\x01" * 9) == "emit-body-size"
    with pytest.raises(Refusal) as raised:
        tally.emit(SMALL, declared, "out", bytes.fromhex("018000"), b"b")
    assert str(raised.value) == (
        "emit-key: the message's key is not canonical: a number in the key is not in its shortest form (at byte 1)"
    )
    assert tally == CallTally()
    tally.emit(SMALL, declared, "out", key, b"12345678")
    with pytest.raises(Refusal) as raised:
        tally.emit(SMALL, declared, "out", key, b"12345678")
    assert str(raised.value) == (
        "emit-bytes-per-call: one call may emit at most 24 bytes of topics, keys and bodies; this message would "
        "make 26"
    )
    tally.emit(SMALL, declared, "out", key, b"1")
    assert rule(tally.emit, SMALL, declared, "out", key, b"1") == "emits-per-call"


def test_log_lines_are_cut_and_counted():
    tally = LogTally()
    assert tally.admit(SMALL, "short") == "short"
    assert tally.admit(SMALL, "ééé") == "éé […cut]"
    assert tally.admit(SMALL, "third") is None
    assert tally.admit(SMALL, "fourth") is None
    assert tally.finish(SMALL) == "log-lines-per-call: 2 more log lines of this call dropped (at most 2 per call)"
    assert tally.admit(SMALL, "again") is not None, "the next call starts afresh"
    assert tally.finish(SMALL) is None


def test_descriptions_are_checked_rule_by_rule():
    def ok(tag):
        return (tag, "Type", 1)

    check_description([ok(1), ok(2)], ["out", "a.b-c_d"])
    cases = [
        ([], [], "event-type-count"),
        ([ok(1)] * (MAX_EVENT_TYPES + 1), [], "event-type-count"),
        ([ok(1), ok(1)], [], "event-type-tag"),
        ([(1, "", 1)], [], "event-type-name"),
        ([(1, "no spaces", 1)], [], "event-type-name"),
        ([(1, "Type", 0)], [], "max-batch"),
        ([ok(1), (4_294_967_295, "Type", 1)], [], "event-type-tag-reserved"),
        ([ok(1)], [f"t{i}" for i in range(MAX_EMIT_TOPICS + 1)], "emit-topic-count"),
        ([ok(1)], ["a/b"], "emit-topic-name"),
        ([ok(1)], ["retry_x"], "emit-topic-host-owned"),
        ([ok(1)], ["dlq_x"], "emit-topic-host-owned"),
        ([ok(1)], ["a", "a"], "emit-topic-duplicate"),
        ([ok(1)], ["t" * 256], "emit-topic-name"),
    ]
    for types, emits, expected in cases:
        assert rule(check_description, types, emits) == expected, (types[:2], emits[:2])
    check_description([ok(1)], [])
    assert is_event_type_name("n" * 128) and not is_event_type_name("n" * 129)
    assert is_event_type_name("bank:Deposited.v2")


def test_return_values_keys_combined_bodies_and_error_messages():
    check_key(bytes.fromhex("0154"))
    assert rule(check_key, bytes.fromhex("018000")) == "key-canonical"
    assert rule(check_key, b"\x03" * 2000) == "key-canonical"
    check_combined_body(SMALL, b"x")
    assert rule(check_combined_body, SMALL, b"") == "combine-body-size"
    assert rule(check_combined_body, SMALL, b"\x00" * 9) == "combine-body-size"
    kept = error_message("é" * MAX_ERROR_MESSAGE_BYTES)
    assert len(kept.encode()) <= MAX_ERROR_MESSAGE_BYTES + len(" […cut]".encode()) and kept.endswith(" […cut]")
    assert error_message("short") == "short"


def test_new_counters_and_entries_stop_at_their_quota_with_the_numbers_in_the_refusal():
    check_counter_count(SMALL, "c", 2)
    with pytest.raises(Refusal) as raised:
        check_counter_count(SMALL, "c", 3)
    assert str(raised.value) == (
        "counter-count: the projection holds 3 counters (committed and pending), at most 3; counter `c` would "
        "be a new one"
    )
    check_entries_per_key(SMALL, "e", 1)
    with pytest.raises(Refusal) as raised:
        check_entries_per_key(SMALL, "e", 2)
    assert str(raised.value) == (
        "entries-per-key: this key holds 2 entries (committed and written in this batch), at most 2; entry `e` "
        "would be a new one"
    )
