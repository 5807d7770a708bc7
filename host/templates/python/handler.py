"""{{name}}: a wakuwaku handler module. It counts each user's visits (state
of the user's key) and all visits (a shared counter).

Add event types as dataclasses deriving from ``Event`` (each with a tag
unique in the topic) and register a handler for each on the module.
"""

from dataclasses import dataclass

from wakuwaku_guest import Context, Event, Module, export


@dataclass
class Visited(Event, tag=1):
    """A user visited a page."""

    user: int
    page: str

    def key(self) -> int:
        return self.user


module = Module("{{module}}")


@module.handles(Visited)
def visited(ctx: Context, events: list[Visited]) -> None:
    now = (ctx.get("visits") or 0) + len(events)
    ctx.set("visits", now)
    ctx.counter_add("all_visits", len(events))
    ctx.info(f"{now} visits")


# The component's export; componentize-py looks for this name.
Handler = export(module)
