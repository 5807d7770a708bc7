"""JSON read against type hints: the forms the event bodies above do not
cover."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from wakuwaku_guest.codec import DecodeError, from_json, prepare, to_json, to_json_bytes


@dataclass
class Node:
    name: str
    children: list[Node] = field(default_factory=list)


def test_nested_and_recursive_dataclasses():
    tree = from_json(Node, {"name": "a", "children": [{"name": "b"}]})
    assert tree == Node("a", [Node("b")])
    assert to_json(tree) == {"name": "a", "children": [{"name": "b", "children": []}]}


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        (tuple[int, str], [1, "a"], (1, "a")),
        (tuple[int, ...], [1, 2, 3], (1, 2, 3)),
        (dict[str, int], {"a": 1}, {"a": 1}),
        (Literal["x", "y"], "y", "y"),
        (int | str, "a", "a"),
        (int | None, None, None),
        (Any, {"free": [1]}, {"free": [1]}),
        (list, [1, "a"], [1, "a"]),
    ],
)
def test_forms_that_fit(kind, value, expected):
    assert from_json(kind, value) == expected


@pytest.mark.parametrize(
    ("kind", "value", "words"),
    [
        (tuple[int, str], [1], "expected an array of 2 items"),
        (tuple[int, ...], [1, "a"], '[1]: expected an integer, got "a"'),
        (dict[str, int], {"a": "b"}, "[a]: expected an integer"),
        (dict[str, int], [], "expected an object"),
        (Literal["x", "y"], "z", 'expected one of "x", "y"'),
        (Literal[1], True, "expected one of 1"),
        (int | None, "a", "expected a value of type"),
        (bool, 1, "expected true or false"),
        (float, "1", "expected a number"),
        (None, 0, "expected null"),
    ],
)
def test_forms_that_do_not_fit_name_the_place(kind, value, words):
    with pytest.raises(DecodeError, match=words.replace("[", r"\[").replace("(", r"\(")):
        from_json(kind, value)


def test_encoding_refuses_what_json_cannot_hold():
    with pytest.raises(ValueError):
        to_json_bytes(float("nan"))
    assert to_json_bytes({"k": (1, 2), "é": "ü"}) == '{"k":[1,2],"é":"ü"}'.encode()


@dataclass(kw_only=True)
class Named:
    a: int
    b: str = "x"


def test_keyword_only_fields_and_absent_defaults():
    assert from_json(Named, {"a": 1}) == Named(a=1)
    assert from_json(Named, {"a": 1, "b": "y"}) == Named(a=1, b="y")
    with pytest.raises(DecodeError, match="missing field `a`"):
        from_json(Named, {"b": "y"})


def test_type_hints_that_cannot_be_resolved_fail_when_prepared():
    @dataclass
    class Broken:
        when: Undefined  # not defined anywhere: the point of the test

    with pytest.raises(TypeError, match="cannot read the type hints of Broken: name 'Undefined' is not defined"):
        prepare(Broken)
    with pytest.raises(TypeError, match="cannot read the type hints of Broken"):
        prepare(Broken)
