"""The canonical key encoding: the shared vectors, the pinned encodings of
the host's own tests, how Python values map onto keys, and refusals."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import NamedTuple

import pytest

from wakuwaku_guest.key import (
    MAX_KEY_BYTES,
    MAX_KEY_DEPTH,
    KeyFormatError,
    decode_key,
    encode_key,
    key_text,
    parse_key_text,
)


def from_text(text: str):
    """A key value from its text form, as a Python author would write it."""

    def convert(value):
        if isinstance(value, list):
            return tuple(convert(item) for item in value)
        if isinstance(value, dict):
            return bytes.fromhex(value["bytes"])
        return value

    return convert(json.loads(text))


def test_every_shared_vector_encodes_decodes_and_shows_as_its_text(shared_vectors):
    vectors = shared_vectors("key_vectors.json")["vectors"]
    assert len(vectors) >= 30, "the file lost its vectors"
    for vector in vectors:
        text, expected = vector["text"], vector["hex"]
        assert encode_key(from_text(text)).hex() == expected, text
        assert parse_key_text(text).hex() == expected, text
        assert decode_key(bytes.fromhex(expected)) == from_text(text), expected
        assert key_text(bytes.fromhex(expected)) == text, expected


def test_shared_refused_bytes_are_not_keys(shared_vectors):
    refused = shared_vectors("key_vectors.json")["refused"]
    assert refused
    for case in refused:
        with pytest.raises(KeyFormatError):
            decode_key(bytes.fromhex(case["hex"]))


# The host's `encodings_are_pinned` (core/src/key.rs), byte for byte.
PINNED = [
    (0, "0100"),
    (42, "0154"),
    (-1, "0101"),
    (64, "018001"),
    (2**64 - 1, "01feffffffffffffffff03"),
    ("ann", "0203616e6e"),
    (b"\x00\xff", "030200ff"),
    ((42, "eur"), "040201540203657572"),
]


@pytest.mark.parametrize(("value", "expected"), PINNED)
def test_encodings_are_pinned(value, expected):
    assert encode_key(value).hex() == expected
    assert decode_key(bytes.fromhex(expected)) == value


@pytest.mark.parametrize("value", [-(2**63), -65, -64, 63, 127, 128, 2**63 - 1, 2**64 - 1])
def test_round_trips_at_the_edges_of_the_integer_range(value):
    data = encode_key(value)
    assert decode_key(data) == value
    assert parse_key_text(key_text(data)) == data


def test_integers_outside_the_range_are_refused():
    for value in (2**64, -(2**63) - 1):
        with pytest.raises(KeyFormatError, match="outside the range from i64::MIN to u64::MAX"):
            encode_key(value)


class Currency(enum.Enum):
    EUR = "eur"


class Level(enum.IntEnum):
    GOLD = 3


@dataclass
class Holding:
    account: int
    currency: str


class Pair(NamedTuple):
    account: int
    currency: str


def test_python_values_map_as_the_rust_sdk_maps_serde_shapes():
    holding = encode_key((42, "eur"))
    # A struct is the tuple of its fields, in order; so is a NamedTuple.
    assert encode_key(Holding(42, "eur")) == holding
    assert encode_key(Pair(42, "eur")) == holding
    assert encode_key([42, "eur"]) == holding
    # An enum member is its value; a bool is 0 or 1.
    assert encode_key(Currency.EUR) == encode_key("eur")
    assert encode_key(Level.GOLD) == encode_key(3)
    assert encode_key(True) == encode_key(1)
    assert encode_key(bytearray(b"\x01")) == encode_key(b"\x01") == encode_key(memoryview(b"\x01"))
    assert encode_key(()) == bytes.fromhex("0400")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (None, "an absent key is no key"),
        (1.5, "type float"),
        ({"a": 1}, "type dict"),
        ({1}, "type set"),
        ((1, None), "an absent key is no key"),
        ("\ud800", "not valid Unicode"),
    ],
)
def test_values_that_are_no_keys_are_refused_with_the_reason(value, words):
    with pytest.raises(KeyFormatError, match=words):
        encode_key(value)


def test_limits_of_length_and_depth():
    assert len(encode_key("x" * (MAX_KEY_BYTES - 3))) == MAX_KEY_BYTES
    with pytest.raises(KeyFormatError, match=f"at most {MAX_KEY_BYTES} bytes; this one has 1025"):
        encode_key("x" * (MAX_KEY_BYTES - 2))
    with pytest.raises(KeyFormatError, match="at most 1024 bytes"):
        encode_key(tuple(range(600)))
    deep = 1
    for _ in range(MAX_KEY_DEPTH):
        deep = (deep,)
    assert decode_key(encode_key(deep)) == deep
    with pytest.raises(KeyFormatError, match="nest at most 16 deep"):
        encode_key((deep,))
    too_deep = bytes([0x04, 0x01] * (MAX_KEY_DEPTH + 1) + [0x01, 0x02])
    with pytest.raises(KeyFormatError, match="nest at most 16 deep"):
        decode_key(too_deep)


# The host's `non_canonical_bytes_are_refused_with_the_reason`, with the
# host's wording of each reason.
REFUSED = [
    ("", "a key cannot be empty"),
    ("05", "unknown key value tag 0x05 at byte 0"),
    ("01", "the key's bytes end inside a value (at byte 1)"),
    ("018000", "a number in the key is not in its shortest form (at byte 1)"),
    ("010000", "the key has 1 bytes after its value"),
    ("020561", "the key's bytes end inside a value (at byte 1)"),
    ("0201ff", "a string in the key is not UTF-8 (at byte 2)"),
    ("04ffffffff0f", "the key's bytes end inside a value (at byte 1)"),
    (
        "01ffffffffffffffffffffffffffffffffffff7f",
        "an integer in the key is outside the range from i64::MIN to u64::MAX (at byte 1)",
    ),
    ("0303" + "03" * (MAX_KEY_BYTES - 1), "a key has at most 1024 bytes; this one has 1025"),
]


@pytest.mark.parametrize(("hex_bytes", "message"), REFUSED)
def test_non_canonical_bytes_are_refused_with_the_hosts_words(hex_bytes, message):
    with pytest.raises(KeyFormatError) as raised:
        decode_key(bytes.fromhex(hex_bytes))
    assert str(raised.value) == message


def test_text_form_is_json():
    data = encode_key((42, "eur", b"\xab"))
    assert key_text(data) == '[42,"eur",{"bytes":"ab"}]'
    assert parse_key_text(' [42, "eur", {"bytes": "AB"}] ') == data
    for bad in ["4.5", "true", '{"x": 1}', "[1,", "18446744073709551616", '{"bytes": "abc"}', '{"bytes": "a b"}']:
        with pytest.raises(KeyFormatError, match="not a key"):
            parse_key_text(bad)
