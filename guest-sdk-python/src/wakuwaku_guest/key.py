"""Keys: what order and state are scoped to, as canonical bytes.

A key is a small value (an integer, a string, a byte string, or a tuple of
those) with one canonical encoding, stated in ``wit/handler.wit`` ("Keys")
and implemented by the host in ``core/src/key.rs``. Every guest SDK produces
the same bytes for the same value, so modules written in Rust and in Python
can share a topic: ``encode_key(42)`` here is the key of ``42u64`` (or of a
``struct AccountId(u64)``) in the Rust SDK. Both sides are checked against
the same test vectors (``core/tests/key_vectors.json``).

Rules kept here:

- **Bytes are the identity.** Two keys are equal exactly when their bytes
  are; the host derives a 64-bit hash from them only to pick partitions.
- **One encoding per value.** :func:`encode_key` writes the shortest form;
  :func:`decode_key` refuses anything that is not exactly one value in its
  shortest form, with a :class:`KeyFormatError` naming the problem and where
  it is (the same words as the host's ``KeyError``).
- **Limits.** At most :data:`MAX_KEY_BYTES` bytes in all, tuples nested at
  most :data:`MAX_KEY_DEPTH` deep.

How Python values map onto key values (mirroring the Rust SDK's serde
mapping):

============================================  ===========================
Python value                                  key value
============================================  ===========================
``int`` from ``-2**63`` to ``2**64 - 1``      integer
``bool``                                      integer 0 or 1
``str``                                       string (its UTF-8 bytes)
``bytes``, ``bytearray``, ``memoryview``      byte string
``tuple``, ``list``                           tuple
a dataclass instance                          tuple of its fields, in order
an ``enum.Enum`` member                       its value
============================================  ===========================

Anything else (``None``, floats, dicts, sets) is refused: a float has no
canonical form, a map no canonical order, and an absent key is no key.

The encoding:

==========  ==========================================================
value       bytes
==========  ==========================================================
integer     ``0x01``, the zigzag form as unsigned LEB128, shortest form
string      ``0x02``, the byte length as unsigned LEB128, the bytes
byte string ``0x03``, the length as unsigned LEB128, the bytes
tuple       ``0x04``, the element count as unsigned LEB128, each element
==========  ==========================================================

The text form (for people, logs and the ``waku`` command) is JSON: an
integer is a number, a string a JSON string, a tuple an array, a byte string
``{"bytes": "<hex>"}``: ``42``, ``"ann"``, ``[42,"eur"]``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_KEY_DEPTH",
    "KeyFormatError",
    "KeyValue",
    "encode_key",
    "decode_key",
    "key_text",
    "parse_key_text",
]

#: The most bytes a key's canonical encoding may have.
MAX_KEY_BYTES = 1024
#: The deepest tuples may nest (a key that is a plain value has depth 0).
MAX_KEY_DEPTH = 16

_INT = 0x01
_STR = 0x02
_BYTES = 0x03
_TUPLE = 0x04

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")

_INT_MIN = -(1 << 63)
_INT_MAX = (1 << 64) - 1

#: A decoded key: an ``int``, a ``str``, ``bytes``, or a ``tuple`` of those.
KeyValue = Any


class KeyFormatError(ValueError):
    """Why a value or bytes are not a key. The message is the host's own
    wording for the same problem."""


def encode_key(value: Any) -> bytes:
    """The canonical bytes of ``value`` (see the table above), checked
    against the limits.

    >>> encode_key(42).hex()
    '0154'
    >>> encode_key((42, "eur")).hex()
    '040201540203657572'
    """
    out = bytearray()
    _encode_into(value, out, 0)
    if len(out) > MAX_KEY_BYTES:
        raise KeyFormatError(f"a key has at most {MAX_KEY_BYTES} bytes; this one has {len(out)}")
    return bytes(out)


def _encode_into(value: Any, out: bytearray, depth: int) -> None:
    kind = type(value)
    if kind is int or kind is bool:
        _encode_int(int(value), out)
    elif kind is str:
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise KeyFormatError(f"this value cannot be a key: a string that is not valid Unicode ({error.reason})") from None
        out.append(_STR)
        _write_leb128(out, len(data))
        out += data
    elif kind is bytes or kind is bytearray or kind is memoryview:
        data = bytes(value)
        out.append(_BYTES)
        _write_leb128(out, len(data))
        out += data
    elif kind is tuple or kind is list:
        _encode_tuple(value, out, depth)
    elif isinstance(value, enum.Enum):
        _encode_into(value.value, out, depth)
    elif isinstance(value, bool | int):
        # int subclasses (IntEnum is caught above).
        _encode_int(int(value), out)
    elif isinstance(value, str):
        _encode_into(str(value), out, depth)
    elif isinstance(value, tuple | list):
        _encode_tuple(value, out, depth)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [getattr(value, field.name) for field in dataclasses.fields(value)]
        _encode_tuple(fields, out, depth)
    else:
        what = "None (an absent key is no key)" if value is None else f"a value of type {kind.__name__}"
        raise KeyFormatError(
            f"this value cannot be a key: {what}; a key is an int, str, bytes, or a tuple of those"
        )


def _encode_int(value: int, out: bytearray) -> None:
    if not _INT_MIN <= value <= _INT_MAX:
        raise KeyFormatError(
            f"an integer in the key is outside the range from i64::MIN to u64::MAX (at byte {len(out)})"
        )
    out.append(_INT)
    _write_leb128(out, value << 1 if value >= 0 else (-value << 1) - 1)


def _encode_tuple(items: Any, out: bytearray, depth: int) -> None:
    if depth >= MAX_KEY_DEPTH:
        raise KeyFormatError(f"a key's tuples nest at most {MAX_KEY_DEPTH} deep")
    out.append(_TUPLE)
    _write_leb128(out, len(items))
    for item in items:
        _encode_into(item, out, depth + 1)
        if len(out) > MAX_KEY_BYTES:
            raise KeyFormatError(f"a key has at most {MAX_KEY_BYTES} bytes; this one has {len(out)}")


def _write_leb128(out: bytearray, value: int) -> None:
    while True:
        byte = value & 0x7F
        value >>= 7
        if value == 0:
            out.append(byte)
            return
        out.append(byte | 0x80)


def decode_key(data: bytes) -> KeyValue:
    """The value of canonical key bytes; anything else raises
    :class:`KeyFormatError` naming the problem.

    >>> decode_key(bytes.fromhex("040201540203657572"))
    (42, 'eur')
    """
    data = bytes(data)
    if not data:
        raise KeyFormatError("a key cannot be empty")
    if len(data) > MAX_KEY_BYTES:
        raise KeyFormatError(f"a key has at most {MAX_KEY_BYTES} bytes; this one has {len(data)}")
    reader = _Reader(data)
    value = reader.value(0)
    extra = len(data) - reader.at
    if extra:
        raise KeyFormatError(f"the key has {extra} bytes after its value")
    return value


class _Reader:
    __slots__ = ("data", "at")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise KeyFormatError(f"the key's bytes end inside a value (at byte {self.at})")
        byte = self.data[self.at]
        self.at += 1
        return byte

    def leb128(self) -> int:
        start = self.at
        value = 0
        shift = 0
        while True:
            byte = self.byte()
            bits = byte & 0x7F
            # The host reads numbers into 128 bits; anything wider is out of range.
            if shift >= 128 or (bits << shift) >> 128:
                raise KeyFormatError(
                    f"an integer in the key is outside the range from i64::MIN to u64::MAX (at byte {start})"
                )
            value |= bits << shift
            if not byte & 0x80:
                if byte == 0 and shift > 0:
                    raise KeyFormatError(f"a number in the key is not in its shortest form (at byte {start})")
                return value
            shift += 7

    def length(self) -> int:
        start = self.at
        length = self.leb128()
        if length > len(self.data) - self.at:
            raise KeyFormatError(f"the key's bytes end inside a value (at byte {start})")
        return length

    def value(self, depth: int) -> KeyValue:
        start = self.at
        tag = self.byte()
        if tag == _INT:
            at = self.at
            raw = self.leb128()
            value = raw >> 1 if not raw & 1 else -(raw >> 1) - 1
            if not _INT_MIN <= value <= _INT_MAX:
                raise KeyFormatError(
                    f"an integer in the key is outside the range from i64::MIN to u64::MAX (at byte {at})"
                )
            return value
        if tag == _STR:
            length = self.length()
            at = self.at
            raw = self.data[at : at + length]
            self.at += length
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                raise KeyFormatError(f"a string in the key is not UTF-8 (at byte {at})") from None
        if tag == _BYTES:
            length = self.length()
            raw = self.data[self.at : self.at + length]
            self.at += length
            return raw
        if tag == _TUPLE:
            if depth >= MAX_KEY_DEPTH:
                raise KeyFormatError(f"a key's tuples nest at most {MAX_KEY_DEPTH} deep")
            count = self.length()
            return tuple(self.value(depth + 1) for _ in range(count))
        raise KeyFormatError(f"unknown key value tag {tag:#04x} at byte {start}")


def key_text(data: bytes) -> str:
    """The text form of canonical key bytes (JSON, as the host shows keys).

    >>> key_text(encode_key((42, "eur", b"\\xab")))
    '[42,"eur",{"bytes":"ab"}]'
    """
    return json.dumps(_to_json(decode_key(data)), ensure_ascii=False, separators=(",", ":"))


def _to_json(value: KeyValue) -> Any:
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, tuple):
        return [_to_json(item) for item in value]
    return value


def parse_key_text(text: str) -> bytes:
    """The canonical bytes of a key written in its text form (JSON:
    ``42``, ``"ann"``, ``[42, "eur"]``, ``{"bytes": "00ff"}``)."""
    try:
        value = json.loads(text)
    except ValueError as error:
        raise _text_error(str(error)) from None
    return encode_key(_from_json(value))


def _from_json(value: Any) -> KeyValue:
    if isinstance(value, bool) or value is None or isinstance(value, float):
        raise _text_error(f"{json.dumps(value)} is not an integer, string, array or byte string")
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise _text_error(f"{value} is not an integer from i64::MIN to u64::MAX")
        return value
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return tuple(_from_json(item) for item in value)
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("bytes"), str):
        hex_text = value["bytes"]
        if len(hex_text) % 2:
            raise _text_error(f"byte string `{hex_text}` has an odd number of hex digits")
        if not all(char in _HEX_DIGITS for char in hex_text):
            raise _text_error(f"byte string `{hex_text}` is not hex")
        return bytes.fromhex(hex_text)
    raise _text_error('an object must be {"bytes": "<hex>"}')


def _text_error(reason: str) -> KeyFormatError:
    return KeyFormatError(
        f'not a key: {reason} (a key is written as JSON: 42, "ann", [42, "eur"] or {{"bytes": "00ff"}})'
    )
