"""A fourth review of the fleet scope (Redis), under faults: what a process does with a
flight whose lease it lost, and what a leader's joiners hear when Redis refuses every
write (maxmemory under noeviction).

- ``test_a_call_after_its_process_lost_the_lease_leads_instead_of_joining_the_dead_flight``:
  a flight whose lease was lost (Redis restarted empty, evicted it, or its process was
  frozen past the lease) stayed its key's flight in its process's table while its work
  ran on. Every new call of the key there joined it, waited for the stale work, and
  got FlightInterruptedError, though Redis had no flight of the key (or another
  process had led and kept a newer one).
- ``test_a_landing_refused_by_a_full_server_ends_the_flight_in_redis_too``: at maxmemory
  under noeviction the landing is refused for a lease, and so is the ABANDON's XADD that
  tells the joiners: Redis refuses a script's first write that can grow memory, and
  ABANDON's XADD came first. The script ended with nothing done; RENEW kept the record
  alive, so the joiners heard only a lease after the leader gave up, and later calls
  joined a flight nobody would land. ABANDON now deletes the record first (a DEL is no
  such write), and a script that has written may write on: the XADD is taken too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
from typing import Any

import pytest

from flightgroup import (
    FlightFailedError,
    FlightInterruptedError,
    LeaseLostError,
    UnavailableError,
    current_lease,
)

from .infleet import fleet_group, fleet_of, never
from .redisproc import HoldingCutProxy, RedisServer
from .support import held_lead, in_thread, outcome, raised, wait_until


def _record(namespace: str, key: str) -> str:
    return f"fg:{{{namespace}:{hashlib.sha256(key.encode()).hexdigest()}}}"


def test_a_call_after_its_process_lost_the_lease_leads_instead_of_joining_the_dead_flight(
    redis_server: Any, namespace: str
) -> None:
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
    assert redis_server.client().delete(_record(namespace, "k")) == 1
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


def test_a_landing_refused_by_a_full_server_ends_the_flight_in_redis_too(namespace: str) -> None:
    server = RedisServer()
    try:
        a = fleet_group(server.url, namespace, lease=1.0)
        b = fleet_group(server.url, namespace, lease=1.0)
        started, joined = threading.Event(), threading.Event()

        def work() -> str:
            started.set()
            assert joined.wait(10)
            admin = server.client()
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", "1")  # every write is refused from now on
            return "v"

        leader, led = in_thread(a.run_sync, "k", work)
        assert started.wait(10)
        joiner, got = in_thread(b.run_sync, "k", never, on_join=joined.set)
        leader.join(30)
        assert isinstance(outcome(led), LeaseLostError), led
        # The leader gave up its landing: the flight is gone from Redis at once, not a
        # lease after its last renewal (the old ABANDON failed before its DEL).
        assert server.client().exists(_record(namespace, "k")) == 0
        # and the joiners are told at once: a script that has written may write again
        # under OOM, so the XADD after the DEL is taken.
        mailboxes = server.client().keys(_record(namespace, "k") + ":m:*")
        assert [server.client().xrange(m)[0][1][b"c"] for m in mailboxes] == [b"int"]
        joiner.join(30)
        assert isinstance(outcome(got), FlightInterruptedError), got
        server.client().config_set("maxmemory", "0")
        assert a.run_sync("k", lambda: "next").value == "next"
        a.close()
        b.close()
    finally:
        server.close()


class Boom(Exception):
    pass


@pytest.mark.parametrize("ending", ["value", "failure"])
def test_a_landing_redis_took_but_never_confirmed_is_unavailable_not_a_lost_lease(
    redis_server: RedisServer, holding_proxy: HoldingCutProxy, namespace: str, ending: str
) -> None:
    a = fleet_group(holding_proxy.url, namespace, lease=1.0)
    b = fleet_group(redis_server.url, namespace, lease=1.0)
    started, joined = threading.Event(), threading.Event()
    marker = "a value whose landing is cut"

    def work() -> str:
        started.set()
        assert joined.wait(10)
        # COMPLETE carries the value: Redis runs it, its reply is cut, and redis-py's
        # re-send waits at the proxy until the leader has given up.
        holding_proxy.arm(marker.encode())
        if ending == "failure":
            raise Boom(marker)
        return marker

    try:
        a.run_sync("warm-up", lambda: 0)
        leader, led = in_thread(a.run_sync, "k", work)
        assert started.wait(10)
        joiner, got = in_thread(b.run_sync, "k", never, on_join=joined.set)
        leader.join(30)
        joiner.join(30)
    finally:
        holding_proxy.release()
        a.close()
        b.close()
    error = outcome(led)
    assert isinstance(error, UnavailableError), error
    assert "did not confirm" in str(error)
    assert error.key == "k"
    if ending == "value":
        assert outcome(got).value == marker  # Redis took the landing
    else:
        # the joiners got the failure; the leader's own error stays its cause
        assert isinstance(outcome(got), FlightFailedError), outcome(got)
        assert isinstance(error.__cause__, Boom), error.__cause__


def test_run_sync_on_the_loop_of_a_flight_lost_only_here_still_raises(
    redis_server: Any, namespace: str
) -> None:
    """A lease lost because Redis was not heard for a lease (its RENEWs may have run
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

        scope._background.loop.call_soon_threadsafe(lose)
        assert await asyncio.to_thread(lost.wait, 10)
        refused = raised(g.run_sync, "k", lambda: "new", timeout=10)
        go.set()
        with contextlib.suppress(LeaseLostError):
            await task
        return refused

    refused = asyncio.run(main())
    g.close()
    assert isinstance(refused, RuntimeError), refused
