"""Leases in the fleet scope: the default lease, renewal of every flight a process leads
in one call per tick, a renewal that crosses a retry, leases near the float maximum, and
what a process does with a flight whose lease it lost (Redis restarted empty, or not
heard for a lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from flightgroup import (
    FlightInterruptedError,
    LeaseLostError,
    current_lease,
)

from ..infleet import fleet_group, fleet_of, never, record_key
from ..support import held_lead, in_thread, outcome, raised, wait_until


def test_a_call_after_its_process_lost_the_lease_leads_instead_of_joining_the_dead_flight(
    redis_server: Any, namespace: str
) -> None:
    """A call after its process lost the lease leads instead of joining the dead flight.

    A flight whose lease was lost (Redis restarted empty, evicted it, or its process was frozen
    past the lease) is no longer its key's flight in its process's table while its work runs on:
    a new call of the key there asks Redis, never joins the stale work."""
    g = fleet_group(redis_server.url, namespace, lease=1.0)
    started, release = threading.Event(), threading.Event()
    leases: list[Any] = []

    def stale() -> str:
        leases.append(current_lease())
        started.set()
        assert release.wait(30)  # a work that runs on past its lease
        return "stale"

    leader, led = in_thread(g.run_sync, "k", stale)
    assert started.wait(10)
    joined = threading.Event()
    joiner, got = in_thread(g.run_sync, "k", never, on_join=joined.set)
    assert joined.wait(10)
    # Redis loses the flight (an eviction, a restart without persistence): the next
    # renewal answers 0 and the lease is lost.
    assert redis_server.client().delete(record_key(namespace, "k")) == 1
    wait_until(lambda: leases[0].lost, "the lease is lost")
    try:
        # Redis has no flight of the key: this call leads one, though the stale work
        # still runs here (the old code joined it: TimeoutError after 5 s).
        after = g.run_sync("k", lambda: "new", timeout=5)
    finally:
        release.set()
        leader.join(20)
        joiner.join(20)
    assert (after.value, after.joined) == ("new", False)
    # Who was there before the loss stays with the lost flight.
    assert isinstance(outcome(led), LeaseLostError), led
    assert isinstance(outcome(got), FlightInterruptedError), got
    g.close()


def test_run_sync_on_the_loop_of_a_flight_lost_only_here_still_raises(
    redis_server: Any, namespace: str
) -> None:
    """run_sync on the loop of a flight whose lease was lost only here still raises.

    A lease lost because Redis was not heard for a lease (its RENEWs may have run
    there, their replies late) leaves the flight in the local table: Redis may still
    hold it, so a run_sync on its work's loop thread would join it and block that loop.
    It is refused at once, as for any flight of this table whose work runs there."""
    g = fleet_group(redis_server.url, namespace, lease=5.0)
    scope = fleet_of(g)

    async def main() -> Any:
        task, go = await held_lead(g, "k")
        [lead] = list(scope._leads)
        lost = threading.Event()

        def lose() -> None:  # on the group's loop, as _renew does
            scope._lose(lead, "no renewal reached Redis for a whole lease")
            lost.set()

        scope._loop.call_soon_threadsafe(lose)
        assert await asyncio.to_thread(lost.wait, 10)
        refused = raised(g.run_sync, "k", lambda: "new", timeout=10)
        go.set()
        with contextlib.suppress(LeaseLostError):
            await task
        return refused

    refused = asyncio.run(main())
    g.close()
    assert isinstance(refused, RuntimeError), refused
