"""A timed ledger in Python, for the host's event-time tests (the Python
counterpart of the probe's ``TimedLedger``, ``tests/guests/probe``).

``Entry`` (tag 1) declares event time: its ``at`` is the event's time in
ms since the epoch, and its key is ``account``. The handler appends each
entry's ``seq`` to the key's state entry ``applied`` (so the state shows
the order the host applied the key's entries in), adds ``amount`` to
``balance``, and counts ``entries`` per entry and ``out_of_order`` per
entry whose ``seq`` is not above the last one applied to its key.
"""

from __future__ import annotations

from dataclasses import dataclass

from wakuwaku_guest import Context, Event, Module, Timing, export


@dataclass
class Entry(Event, tag=1, max_batch=1, timing=Timing.TIMED):
    """A ledger entry of ``account``; ``seq`` rises with its time ``at``."""

    account: int
    seq: int
    amount: int
    at: int | None

    def key(self) -> int:
        return self.account

    def event_time(self) -> int | None:
        return self.at


ledger = Module("ledger")


@ledger.handles(Entry)
def entries(ctx: Context, events: list[Entry]) -> None:
    applied = ctx.get("applied", list) or []
    balance = ctx.get("balance", int) or 0
    for event in events:
        if applied and applied[-1] >= event.seq:
            ctx.counter_add("out_of_order", 1)
        applied.append(event.seq)
        balance += event.amount
        ctx.counter_add("entries", 1)
    ctx.set("applied", applied)
    ctx.set("balance", balance)


#: The component's `handler` export (componentize-py looks for this name).
Handler = export(ledger)
