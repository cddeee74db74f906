"""A forget() in the fleet scope reaches the local flights of other groups (ADR 0026):
a joiner's process reads the FORGET's notice beside the flight's mailbox, the leader's
hears it from its next RENEW, and their next call of the key leads a new flight instead
of joining their local flight of the parked one.

Three groups of this process stand for three processes: each has its own table and its
own connections to a real redis-server. The waits are on the state the notice changes
(the local table), never on a bare sleep.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from ..infleet import fleet_group, in_a_loop_that_joined, never, result_of
from ..ingroup import Background, close
from ..support import in_thread, table_of, wait_until

pytestmark = pytest.mark.timeout(60)


def _work(runs: list[str], name: str, gate: threading.Event) -> Callable[[], str]:
    def body() -> str:
        runs.append(name)
        assert gate.wait(20)
        return name

    return body


@pytest.mark.parametrize("caller", ["thread", "task's first join", "task"])
def test_a_forget_elsewhere_detaches_the_leaders_and_the_joiners_local_flights(
    redis_server: Any, namespace: str, caller: str
) -> None:
    """The joiner's read hears the notice: on its group's thread (a thread's call, a
    loop's first join) or on its own loop (a task's, on a loop that joined before)."""
    # A short lease: the leader's renewals (each lease/3) carry the notice to it.
    leader = fleet_group(redis_server.url, namespace, lease=0.9)
    joiner = fleet_group(redis_server.url, namespace)
    forgetter = fleet_group(redis_server.url, namespace)
    old_may_end = threading.Event()
    runs: list[str] = []
    try:
        first = Background(lambda: leader.run_sync("k", _work(runs, "old", old_may_end)))
        wait_until(lambda: runs == ["old"], "the leader's work started")
        joined = threading.Event()
        if caller == "thread":
            thread, out = in_thread(joiner.run_sync, "k", never, on_join=joined.set)
        elif caller == "task's first join":
            thread, out = in_thread(asyncio.run, joiner.run("k", never, on_join=joined.set))
        else:
            thread, out = in_a_loop_that_joined(
                leader, joiner, lambda: joiner.run("k", never, on_join=joined.set)
            )
        assert joined.wait(10)
        assert "k" in table_of(joiner).flights and "k" in table_of(leader).flights
        forgetter.forget("k")
        wait_until(lambda: "k" not in table_of(joiner).flights, "the joiner read the notice")
        wait_until(lambda: "k" not in table_of(leader).flights, "a renewal told the leader")
        # The next call in either process leads a new flight (the fleet has no key lock:
        # at once, beside the parked one) instead of joining the old local flight.
        again = joiner.run_sync("k", lambda: "new-in-joiner")
        assert (again.value, again.joined) == ("new-in-joiner", False)
        again = leader.run_sync("k", lambda: "new-in-leader")
        assert (again.value, again.joined) == ("new-in-leader", False)
        # The parked flight still lands for the callers it had.
        old_may_end.set()
        assert (first.wait().value, first.wait().joined) == ("old", False)
        thread.join(10)
        assert (result_of(out).value, result_of(out).joined) == ("old", True)
        assert runs == ["old"]
    finally:
        old_may_end.set()
        close(leader, joiner, forgetter)
