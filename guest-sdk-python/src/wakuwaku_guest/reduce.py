"""Reduction: what the host may do to a run before handing it to a
handler, given the algebra its event type declares; the host's rules
(``core/src/reduce.rs``) for the test host.

A run is every event of one type and one key between two fences, in log
order.

======================  ==================================================
algebra                 what happens to the run
======================  ==================================================
non-associative         nothing
commutative             nothing (delivering in log order is always allowed)
idempotent              adjacent duplicates (equal body bytes) are dropped
idempotent-commutative  sorted by body bytes, every duplicate dropped
associative             folded into one body by the module's ``combine``
                        (only a run of two or more)
======================  ==================================================

After reduction a run is cut into chunks of at most ``max_batch`` events;
each chunk is one handler call. Both rules are checked against the same
vectors as the host's (``core/tests/reduce_vectors.json``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from .types import Algebra

__all__ = ["reduce", "chunks"]


def reduce(algebra: Algebra, bodies: Sequence[bytes], combine: Callable[[list[bytes]], bytes]) -> list[bytes]:
    """Reduces a run's bodies according to ``algebra``. ``combine`` is called
    at most once, and only for an associative run of at least two bodies;
    what it raises is raised."""
    bodies = list(bodies)
    if algebra is Algebra.IDEMPOTENT:
        return _dedup(bodies)
    if algebra is Algebra.IDEMPOTENT_COMMUTATIVE:
        return _dedup(sorted(bodies))
    if algebra is Algebra.ASSOCIATIVE and len(bodies) >= 2:
        return [combine(bodies)]
    return bodies


def _dedup(bodies: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for body in bodies:
        if not out or out[-1] != body:
            out.append(body)
    return out


def chunks(bodies: Sequence[bytes], max_batch: int) -> Iterator[Sequence[bytes]]:
    """Cuts reduced bodies into handler calls of at most ``max_batch``
    events; a ``max_batch`` of 0 is treated as 1."""
    size = max(max_batch, 1)
    for start in range(0, len(bodies), size):
        yield bodies[start : start + size]
