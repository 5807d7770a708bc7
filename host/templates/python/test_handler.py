from wakuwaku_guest.testing import MemoryHost

from {{module}} import Visited, module


def test_counts_visits_per_user_and_in_all() -> None:
    host = MemoryHost(module)
    host.handle([Visited(7, "/"), Visited(7, "/"), Visited(8, "/")])
    assert host.get(7, "visits") == 2
    assert host.get(8, "visits") == 1
    assert host.counter("all_visits") == 3
