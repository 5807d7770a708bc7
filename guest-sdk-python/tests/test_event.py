"""Event types: class keywords checked at class creation, JSON bodies read
as serde reads them in the Rust SDK."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import pytest

from wakuwaku_guest import Algebra, Event, Ordering, UnrecoverableError, encode_key, skip_if_default


class Status(enum.Enum):
    ACTIVE = "active"
    FROZEN = "frozen"


@dataclass
class Address:
    city: str
    zip: str | None = None


@dataclass
class Moved(Event, tag=7, name="user:Moved.v2", max_batch=3):
    user: int
    to: Address
    status: Status
    tags: list[str] = field(default_factory=list)
    weight: float = 1.0
    count: int = skip_if_default(1)

    def key(self) -> tuple[int, str]:
        return (self.user, self.to.city)

    def ordering(self) -> Ordering:
        return Ordering.ACQ_REL if self.status is Status.FROZEN else Ordering.RELAXED


def test_class_keywords_become_the_event_types_constants():
    assert (Moved.TAG, Moved.NAME, Moved.ALGEBRA, Moved.MAX_BATCH) == (7, "user:Moved.v2", Algebra.NON_ASSOCIATIVE, 3)

    @dataclass
    class Plain(Event, tag=0):
        id: int

        def key(self) -> int:
            return self.id

    assert (Plain.NAME, Plain.MAX_BATCH, Plain.ALGEBRA) == ("Plain", 256, Algebra.NON_ASSOCIATIVE)


def test_bodies_are_compact_json_in_field_order_as_serde_writes_them():
    moved = Moved(1, Address("Kyōto"), Status.ACTIVE)
    assert moved.encode() == '{"user":1,"to":{"city":"Kyōto","zip":null},"status":"active","tags":[],"weight":1.0}'.encode()
    assert Moved(1, Address("x"), Status.ACTIVE, count=2).encode().endswith(b',"count":2}')
    assert Moved.decode(moved.encode()) == moved
    assert moved.key_bytes() == encode_key((1, "Kyōto"))
    assert Moved.decode(Moved(1, Address("x"), Status.FROZEN).encode()).ordering() is Ordering.ACQ_REL


def test_unknown_fields_are_ignored_and_defaults_filled_in():
    moved = Moved.decode(b'{"user": 3, "to": {"city": "Oslo", "extra": 1}, "status": "frozen", "new": true}')
    assert moved == Moved(3, Address("Oslo"), Status.FROZEN)
    assert Moved.decode(b'{"user": 3, "to": {"city": "Oslo"}, "status": "active", "weight": 2}').weight == 2.0


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"not json", "malformed user:Moved.v2 body: Expecting value"),
        (b"[1, 2]", "malformed user:Moved.v2 body: expected an object (Moved)"),
        (b'{"to": {"city": "x"}, "status": "active"}', "missing field `user`"),
        (b'{"user": "1", "to": {"city": "x"}, "status": "active"}', 'user: expected an integer, got "1"'),
        (b'{"user": true, "to": {"city": "x"}, "status": "active"}', "user: expected an integer, got true"),
        (b'{"user": 1, "to": {"city": 5}, "status": "active"}', "to: city: expected a string, got 5"),
        (b'{"user": 1, "to": {"city": "x"}, "status": "asleep"}', 'status: expected one of "active", "frozen"'),
        (b'{"user": 1, "to": {"city": "x"}, "status": "active", "tags": ["a", 2]}', "tags: [1]: expected a string"),
        (b'{"user": 1, "to": {"city": "x"}, "status": "active", "weight": "heavy"}', "weight: expected a number"),
        (b"\xff\xfe", "malformed user:Moved.v2 body"),
    ],
)
def test_a_body_that_does_not_fit_is_unrecoverable_and_names_the_type(body, words):
    with pytest.raises(UnrecoverableError) as raised:
        Moved.decode(body)
    assert words in raised.value.message
    assert raised.value.message.startswith("malformed user:Moved.v2 body: ")


def test_a_key_that_is_no_key_is_unrecoverable_and_names_the_type():
    @dataclass
    class Floaty(Event, tag=1):
        at: float

        def key(self) -> float:
            return self.at

    with pytest.raises(UnrecoverableError, match="the key of a Floaty is not a key: this value cannot be a key: a value of type float"):
        Floaty(1.5).key_bytes()


def test_combine_of_a_type_that_is_not_associative_is_unrecoverable():
    with pytest.raises(UnrecoverableError, match="user:Moved.v2 is not associative"):
        Moved.combine([Moved(1, Address("x"), Status.ACTIVE)])


@pytest.mark.parametrize(
    ("keywords", "words"),
    [
        ({"tag": -1}, "tag -1 is not a u32"),
        ({"tag": 2**32}, "is not a u32"),
        ({"tag": "1"}, "is not a u32"),
        ({"tag": 1, "name": "no spaces"}, "name 'no spaces' is not 1 to 128 bytes"),
        ({"tag": 1, "name": "n" * 129}, "is not 1 to 128 bytes"),
        ({"tag": 1, "max_batch": 0}, "max_batch 0 is not from 1"),
        ({"tag": 1, "algebra": "associative"}, "is not an Algebra"),
        ({"tag": 1, "algebra": Algebra.ASSOCIATIVE}, "is associative but does not define combine"),
        ({"name": "NoTag"}, "gives no tag"),
    ],
)
def test_bad_class_keywords_fail_the_class(keywords, words):
    with pytest.raises(TypeError, match=words):

        class Bad(Event, **keywords):
            def key(self) -> int:
                return 1


def test_an_event_type_must_define_its_key():
    with pytest.raises(TypeError, match="does not define key"):

        class NoKey(Event, tag=1):
            pass


def test_a_shared_base_without_a_tag_declares_nothing():
    class AccountEvent(Event):
        def key(self) -> int:
            return self.account

    @dataclass
    class Opened(AccountEvent, tag=1):
        account: int

    assert Opened(5).key_bytes() == encode_key(5)
    assert "TAG" not in vars(AccountEvent)
