"""The test host reduces and chunks runs by the host's rules: the shared
vectors `core/tests/reduce_vectors.json`, which the host's own reduction is
checked against too (`core/tests/reduce_vectors.rs`)."""

from __future__ import annotations

import pytest

from wakuwaku_guest import Algebra
from wakuwaku_guest.reduce import chunks, reduce


def encoded(bodies: list[str]) -> list[bytes]:
    return [body.encode("utf-8") for body in bodies]


def test_every_algebra_reduces_runs_as_the_vectors_say(shared_vectors):
    cases = shared_vectors("reduce_vectors.json")["reduce"]
    assert {case["algebra"] for case in cases} == {algebra.value for algebra in Algebra}
    for case in cases:
        algebra, run = Algebra(case["algebra"]), encoded(case["run"])
        calls = []

        def join(bodies: list[bytes]) -> bytes:
            calls.append(list(bodies))
            return b"+".join(bodies)

        assert reduce(algebra, run, join) == encoded(case["reduced"]), case
        folds = algebra is Algebra.ASSOCIATIVE and len(run) >= 2
        assert calls == ([run] if folds else []), f"combine is called once, for a run of two or more: {case}"


def test_reduced_runs_are_cut_into_calls_as_the_vectors_say(shared_vectors):
    for case in shared_vectors("reduce_vectors.json")["chunks"]:
        bodies = [b""] * case["events"]
        assert [len(chunk) for chunk in chunks(bodies, case["max_batch"])] == case["sizes"], case


def test_a_failing_combine_is_raised():
    class Broken(Exception):
        pass

    def fail(bodies: list[bytes]) -> bytes:
        raise Broken

    with pytest.raises(Broken):
        reduce(Algebra.ASSOCIATIVE, [b"a", b"b"], fail)
