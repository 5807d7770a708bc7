"""JSON bodies and state entries for dataclasses, checked against their
type hints.

Decoding follows serde's defaults in the Rust SDK, so a body one side
accepts the other accepts too: fields are read by name, unknown fields are
ignored, a missing field without a default is an error, and each value must
fit its annotation (``int`` is not ``bool``, an ``enum.Enum`` is read by
value, a nested dataclass recursively, ``X | None`` may be ``null``).
Annotations this module does not know (``typing.Any``, a plain class) are
taken as they come.

Encoding writes compact JSON with the fields in declaration order and
non-ASCII characters as they are, as ``serde_json`` does; a field made with
:func:`skip_if_default` is left out when it holds its default (serde's
``skip_serializing_if``).

A decoder is compiled once per class (a list of per-field converters), so
decoding a body costs one ``json.loads`` and one pass over its fields.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import Callable
from typing import Any

__all__ = ["skip_if_default", "to_json", "to_json_bytes", "from_json", "DecodeError"]

_SKIP_IF_DEFAULT = "wakuwaku_skip_if_default"

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


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


def to_json(value: Any) -> Any:
    """``value`` as plain JSON data: dataclasses as objects (fields in
    order, :func:`skip_if_default` fields left out at their default), enums
    by value, tuples as arrays."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _encoder(type(value))(value)
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    return value


def to_json_bytes(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON, as ``serde_json::to_vec`` writes it."""
    return _dumps(to_json(value)).encode("utf-8")


def from_json(kind: Any, data: Any) -> Any:
    """Reads plain JSON data ``data`` as ``kind`` (a dataclass, an enum, a
    builtin or a typing form); raises :class:`DecodeError` naming the path of
    a value that does not fit."""
    return _converter(kind)(data)


_ENCODERS: dict[type, Callable[[Any], Any]] = {}
_CONVERTERS: dict[Any, Callable[[Any], Any]] = {}


def _encoder(cls: type) -> Callable[[Any], Any]:
    encoder = _ENCODERS.get(cls)
    if encoder is None:
        fields = [
            (field.name, field.default if field.metadata.get(_SKIP_IF_DEFAULT) else dataclasses.MISSING)
            for field in dataclasses.fields(cls)
        ]
        missing = dataclasses.MISSING

        def encoder(value: Any) -> dict[str, Any]:
            out = {}
            for name, skip in fields:
                item = getattr(value, name)
                if skip is not missing and item == skip:
                    continue
                out[name] = to_json(item)
            return out

        _ENCODERS[cls] = encoder
    return encoder


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
    # Placeholder first, so a dataclass that refers to itself compiles.
    fields_ready: list[tuple[str, Callable[[Any], Any], bool]] = []

    def convert(value: Any) -> Any:
        if type(value) is not dict:
            raise _fail(f"an object ({cls.__name__})", value)
        kwargs = {}
        for name, field_converter, required in fields_ready:
            if name in value:
                try:
                    kwargs[name] = field_converter(value[name])
                except DecodeError as error:
                    raise DecodeError(f"{name}: {error}") from None
            elif required:
                raise DecodeError(f"missing field `{name}`")
        return cls(**kwargs)

    _CONVERTERS[cls] = convert
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation that cannot be resolved is taken as it comes
        hints = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        fields_ready.append((field.name, _converter(hints.get(field.name, Any)), required))
    return convert
