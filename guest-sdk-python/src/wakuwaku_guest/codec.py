"""JSON bodies and state entries for dataclasses, checked against their
type hints.

Decoding follows serde's defaults in the Rust SDK, so a body one side
accepts the other accepts too: fields are read by name, unknown fields are
ignored, a missing field without a default is an error, and each value must
fit its annotation (``int`` is not ``bool``, an ``enum.Enum`` is read by
value, a nested dataclass recursively, ``X | None`` may be ``null``).
Annotations this module does not know (``typing.Any``, a plain class) are
taken as they come; hints that cannot be resolved (a name that is not
defined) are an error, raised when the type is first read.

Encoding writes compact JSON with the fields in declaration order and
non-ASCII characters as they are, as ``serde_json`` does; a field made with
:func:`skip_if_default` is left out when it holds its default (serde's
``skip_serializing_if``).

A decoder is compiled once per class (a list of per-field converters; plain
``int``, ``str`` and ``bool`` fields are checked inline), and encoding
leaves everything but dataclasses and enums to the C JSON encoder: one
body costs one pass of the JSON parser or writer and one pass over its
fields.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import operator
import types
import typing
from collections.abc import Callable
from typing import Any

__all__ = ["skip_if_default", "to_json", "to_json_bytes", "from_json", "from_json_bytes", "bytes_reader", "prepare", "DecodeError"]

_SKIP_IF_DEFAULT = "wakuwaku_skip_if_default"


class DecodeError(ValueError):
    """A JSON value that does not fit the type it is read as; the message
    names the field path (``amount: expected an integer, got "x"``)."""


def skip_if_default(default: Any) -> Any:
    """A dataclass field with ``default`` that is left out of the JSON when
    it holds that default (and read back as the default when absent)::

        @dataclass
        class Deposited(Event, tag=2):
            account: int
            amount: int
            count: int = skip_if_default(1)
    """
    return dataclasses.field(default=default, metadata={_SKIP_IF_DEFAULT: True})


def to_json_bytes(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON, as ``serde_json::to_vec`` writes it:
    dataclasses as objects (fields in order, :func:`skip_if_default` fields
    left out at their default), enums by value, tuples as arrays."""
    return _dumps(value).encode("utf-8")


def to_json(value: Any) -> Any:
    """``value`` as plain JSON data (what :func:`to_json_bytes` writes)."""
    return json.loads(to_json_bytes(value))


def from_json(kind: Any, data: Any) -> Any:
    """Reads plain JSON data ``data`` as ``kind`` (a dataclass, an enum, a
    builtin or a typing form); raises :class:`DecodeError` naming the path of
    a value that does not fit."""
    return _converter(kind)(data)


def from_json_bytes(kind: Any, data: bytes) -> Any:
    """Reads UTF-8 JSON bytes as ``kind``; malformed JSON raises
    ``ValueError``, a value that does not fit :class:`DecodeError`."""
    return _converter(kind)(_parse(str(data, "utf-8")))


def bytes_reader(kind: Any) -> Callable[[bytes], Any]:
    """:func:`from_json_bytes` for one ``kind``, its converter looked up on
    first use (so later definitions that ``kind``'s hints name are there),
    then kept: for decoding many bodies of one type."""
    convert = None

    def read(data: bytes) -> Any:
        nonlocal convert
        if convert is None:
            convert = _converter(kind)
        return convert(_parse(str(data, "utf-8")))

    return read


def prepare(kind: Any) -> None:
    """Compiles the reader of ``kind`` now. A dataclass whose type hints
    cannot be resolved raises ``TypeError`` naming it; the component bridge
    calls this for every event type, so such a module fails its build."""
    _converter(kind)


_decoder = json.JSONDecoder()
_scan_once = _decoder.scan_once


def _parse(text: str) -> Any:
    """``json.loads``, faster for the common case: the scanner alone reads a
    text that is one value with nothing around it (half the cost of the full
    ``decode``, which first matches whitespace on both sides); anything else
    goes through ``decode``, for its whitespace rules and error messages."""
    try:
        value, end = _scan_once(text, 0)
    except StopIteration:
        return _decoder.decode(text)
    if end != len(text):
        return _decoder.decode(text)
    return value


_ENCODERS: dict[type, Callable[[Any], Any]] = {}
_CONVERTERS: dict[Any, Callable[[Any], Any]] = {}


def _default(value: Any) -> Any:
    """What the JSON encoder writes for a value it does not know: the
    object of a dataclass (one level; the encoder comes back for nested
    ones), the value of an enum."""
    kind = type(value)
    encoder = _ENCODERS.get(kind)
    if encoder is None:
        if dataclasses.is_dataclass(kind):
            encoder = _dataclass_encoder(kind)
        elif issubclass(kind, enum.Enum):
            encoder = _enum_value
        else:
            raise TypeError(f"a {kind.__name__} cannot be written as JSON")
        _ENCODERS[kind] = encoder
    return encoder(value)


def _enum_value(value: enum.Enum) -> Any:
    return value.value


def _dataclass_encoder(cls: type) -> Callable[[Any], dict[str, Any]]:
    names = tuple(field.name for field in dataclasses.fields(cls))
    skips = tuple(
        (field.name, field.default) for field in dataclasses.fields(cls) if field.metadata.get(_SKIP_IF_DEFAULT)
    )
    if not names:
        return lambda value: {}
    values = operator.attrgetter(*names) if len(names) > 1 else (lambda value: (getattr(value, names[0]),))

    def encoder(value: Any) -> dict[str, Any]:
        out = dict(zip(names, values(value)))
        for name, default in skips:
            if out[name] == default:
                del out[name]
        return out

    return encoder


def _make_dumps() -> Callable[[Any], str]:
    """The compact encoder. ``JSONEncoder.encode`` builds its C encoder
    anew on every call, which costs as much as encoding a small object; this
    builds it once (the same call the standard library makes, without the
    check for circular references, which JSON data cannot have), and falls
    back to ``encode`` where the C encoder is missing or differs."""
    slow = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_default).encode
    try:
        from json.encoder import c_make_encoder, encode_basestring

        if c_make_encoder is None:
            return slow
        fast = c_make_encoder(None, _default, encode_basestring, None, ":", ",", False, False, False)
        if "".join(fast({"a": [1, "é", None]}, 0)) != '{"a":[1,"é",null]}':
            return slow
    except (ImportError, TypeError):
        return slow
    join = "".join
    return lambda value: join(fast(value, 0))


_dumps = _make_dumps()


def _describe(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 40 else text[:40] + "…"


def _fail(expected: str, value: Any) -> DecodeError:
    return DecodeError(f"expected {expected}, got {_describe(value)}")


def _converter(kind: Any) -> Callable[[Any], Any]:
    try:
        return _CONVERTERS[kind]
    except (KeyError, TypeError):
        pass
    converter = _build(kind)
    try:
        _CONVERTERS[kind] = converter
    except TypeError:
        pass
    return converter


def _build(kind: Any) -> Callable[[Any], Any]:
    if kind is Any or kind is object:
        return _identity
    if kind is int:
        return _int
    if kind is float:
        return _float
    if kind is str:
        return _str
    if kind is bool:
        return _bool
    if kind is None or kind is type(None):
        return _none
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return _enum(kind)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _dataclass(kind)
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if origin is typing.Union or origin is types.UnionType:
        return _union([_converter(arg) for arg in args], kind)
    if origin is list:
        return _list(_converter(args[0]) if args else _identity)
    if origin is tuple:
        return _tuple([_converter(arg) for arg in args])
    if origin is dict:
        return _dict(_converter(args[1]) if len(args) == 2 else _identity)
    if origin is typing.Literal:
        return _literal(args)
    if kind is list:
        return _list(_identity)
    if kind is dict:
        return _dict(_identity)
    return _identity


def _identity(value: Any) -> Any:
    return value


def _int(value: Any) -> int:
    if type(value) is not int:
        raise _fail("an integer", value)
    return value


def _float(value: Any) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise _fail("a number", value)


def _str(value: Any) -> str:
    if type(value) is not str:
        raise _fail("a string", value)
    return value


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise _fail("true or false", value)
    return value


def _none(value: Any) -> None:
    if value is not None:
        raise _fail("null", value)
    return None


def _enum(kind: type[enum.Enum]) -> Callable[[Any], Any]:
    names = ", ".join(json.dumps(member.value) for member in kind)

    def convert(value: Any) -> Any:
        try:
            return kind(value)
        except (ValueError, TypeError):
            raise _fail(f"one of {names}", value) from None

    return convert


def _union(options: list[Callable[[Any], Any]], kind: Any) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        for option in options:
            try:
                return option(value)
            except DecodeError:
                continue
        raise _fail(f"a value of type {kind}", value)

    return convert


def _list(item: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def convert(value: Any) -> list[Any]:
        if type(value) is not list:
            raise _fail("an array", value)
        if item is _identity:
            return value
        return [_at(item, element, index) for index, element in enumerate(value)]

    return convert


def _tuple(items: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    variadic = len(items) == 2 and items[1] is _ELLIPSIS_CONVERTER

    def convert(value: Any) -> tuple[Any, ...]:
        if type(value) is not list:
            raise _fail("an array", value)
        if variadic:
            return tuple(_at(items[0], element, index) for index, element in enumerate(value))
        if items and len(value) != len(items):
            raise _fail(f"an array of {len(items)} items", value)
        if not items:
            return tuple(value)
        return tuple(_at(item, element, index) for index, (item, element) in enumerate(zip(items, value)))

    return convert


def _ellipsis(value: Any) -> Any:  # pragma: no cover - a marker, never called
    return value


_ELLIPSIS_CONVERTER = _ellipsis
_CONVERTERS[Ellipsis] = _ELLIPSIS_CONVERTER


def _dict(item: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def convert(value: Any) -> dict[str, Any]:
        if type(value) is not dict:
            raise _fail("an object", value)
        if item is _identity:
            return value
        return {key: _at(item, element, key) for key, element in value.items()}

    return convert


def _literal(allowed: tuple[Any, ...]) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if value not in allowed or type(value) not in {type(option) for option in allowed}:
            raise _fail("one of " + ", ".join(json.dumps(option) for option in allowed), value)
        return value

    return convert


def _at(convert: Callable[[Any], Any], value: Any, where: Any) -> Any:
    try:
        return convert(value)
    except DecodeError as error:
        raise DecodeError(f"[{where}]: {error}") from None


def _dataclass(cls: type) -> Callable[[Any], Any]:
    # Each field: its name, the exact type a plain value must have (int, str
    # or bool: checked inline, the common case) or None, the converter, and
    # whether it is required. Filled after the converter is registered, so a
    # dataclass that refers to itself compiles.
    fields: list[tuple[str, type | None, Callable[[Any], Any], bool]] = []

    def field_value(name: str, exact: type | None, field_converter: Callable[[Any], Any], item: Any) -> Any:
        if type(item) is exact:
            return item
        try:
            return field_converter(item)
        except DecodeError as error:
            raise DecodeError(f"{name}: {error}") from None

    def with_defaults(value: dict[str, Any]) -> Any:
        """Some field is absent: pass the others by name."""
        kwargs = {}
        for name, exact, field_converter, required in fields:
            if name in value:
                kwargs[name] = field_value(name, exact, field_converter, value[name])
            elif required:
                raise DecodeError(f"missing field `{name}`")
        return cls(**kwargs)

    def convert(value: Any) -> Any:
        if type(value) is not dict:
            raise _fail(f"an object ({cls.__name__})", value)
        if by_name:
            return with_defaults(value)
        # Every field present (the common case): positional arguments, half
        # the cost of keywords.
        args = []
        for name, exact, field_converter, _ in fields:
            try:
                item = value[name]
            except KeyError:
                return with_defaults(value)
            args.append(item if type(item) is exact else field_value(name, exact, field_converter, item))
        return cls(*args)

    _CONVERTERS[cls] = convert
    try:
        hints = typing.get_type_hints(cls)
    except Exception as error:
        del _CONVERTERS[cls]
        raise TypeError(f"cannot read the type hints of {cls.__name__}: {error}") from None
    init_fields = [field for field in dataclasses.fields(cls) if field.init]
    # Keyword-only fields cannot be passed by position.
    by_name = any(field.kw_only for field in init_fields)
    for field in init_fields:
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        kind = hints.get(field.name, Any)
        exact = kind if kind in (int, str, bool) else None
        fields.append((field.name, exact, _converter(kind), required))
    return convert
