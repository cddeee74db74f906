"""Retries in the fleet scope: a leader's loop that stops during a retry still ends the
flight for every caller.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
    FlightInterruptedError,
    current_lease,
)

from ..infleet import (
    RETRY_NOW,
    fleet_group,
    fleet_of,
    hold_script,
    in_a_loop_that_joined,
    in_thread_box,
    never,
    never_sync,
)
from ..redisproc import RedisServer
from ..support import in_thread, outcome, wait_until

pytestmark = pytest.mark.timeout(40)


def test_a_leaders_loop_stopping_during_a_retry_ends_the_flight_for_everyone(
    redis_server: Any, namespace: str
) -> None:
    """A leader's loop that stops during a retry ends the flight for every caller.

    The leader's task is cancelled (its loop shuts down) while it awaits the retry's answer (LEAD
    or LOST): the flight still settles, so its local joiners (other threads) are woken and the
    lead is not renewed in Redis, so joiners elsewhere end too."""
    a = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30,
                    retry=RETRY_NOW)
    b = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30)
    asked, release = threading.Event(), threading.Event()
    hold_script(fleet_of(a), "attempt", ran=asked, release=release)
    joined_here, joined_there, fail = threading.Event(), threading.Event(), threading.Event()
    started = threading.Event()

    async def work() -> str:
        started.set()
        await asyncio.get_running_loop().run_in_executor(None, fail.wait, 20)
        raise ValueError("first attempt")

    async def leader() -> None:
        caller = asyncio.ensure_future(a.run("k", work))
        await asyncio.get_running_loop().run_in_executor(None, asked.wait, 20)
        assert not caller.done()
        # returns: asyncio.run cancels the leading caller and the flight's own task

    lead_thread, _ = in_thread_box(lambda: asyncio.run(leader()))
    try:
        assert started.wait(10)  # it leads in Redis
        here, here_box = in_thread_box(lambda: a.run_sync("k", never_sync, on_join=joined_here.set))
        there, there_box = in_thread_box(
            lambda: b.run_sync("k", never_sync, on_join=joined_there.set)
        )
        assert joined_here.wait(10) and joined_there.wait(10)
        fail.set()
        assert asked.wait(10)
        lead_thread.join(10)
        release.set()  # the ATTEMPT's answer comes after the flight's task ended
        here.join(10)
        there.join(10)
        assert not here.is_alive(), "the local joiner waits forever"
        assert not there.is_alive(), "the joiner elsewhere waits for the lease"
        assert isinstance(here_box[0], FlightInterruptedError)
        assert isinstance(there_box[0], FlightInterruptedError)
    finally:
        fail.set()
        release.set()
        a.close()
        b.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("joiner", ["thread", "task's first join", "task"])
def test_a_joiner_that_followed_a_retry_hears_its_leaders_death_within_the_leaders_lease(
    redis_server: RedisServer, namespace: str, joiner: str
) -> None:
    """A joiner that followed a retry hears its leader's death within the leader's lease.

    The leader (lease 1 s) retries, then stops renewing, as a dead process would: its record runs
    out 1 s later. A joiner of a group with a lease of 30 s follows the retry's `next` and is
    interrupted about a (leader's) lease later, as it is without a retry, not at its own deadline
    of 30 s."""
    a = fleet_group(redis_server.url, namespace, lease=1.0, retry=RETRY_NOW)
    b = fleet_group(redis_server.url, namespace, lease=30.0)
    fleet = fleet_of(a)
    tokens: list[int] = []
    joined, fail, release = threading.Event(), threading.Event(), threading.Event()

    async def no_renewal(batch: Any) -> None:
        return None

    def work() -> str:
        tokens.append(current_lease().token)
        if len(tokens) == 1:
            assert fail.wait(10)
            raise ValueError("first attempt")
        fleet._renewal.renew_some = no_renewal  # type: ignore[method-assign]  # "dies" here
        release.wait(20)
        return "late"

    lead, _ = in_thread(a.run_sync, "k", work)
    try:
        wait_until(lambda: bool(tokens), "the first attempt")
        # (a thread's call reads on its group's thread, as a loop's first join does; a
        # task's next, on its loop)
        if joiner == "thread":
            join, got = in_thread(b.run_sync, "k", never, on_join=joined.set, timeout=4.0)
        elif joiner == "task's first join":
            join, got = in_thread(asyncio.run, b.run("k", never, on_join=joined.set, timeout=4.0))
        else:
            join, got = in_a_loop_that_joined(
                a, b, lambda: b.run("k", never, on_join=joined.set, timeout=4.0)
            )
        assert joined.wait(10)
        fail.set()
        join.join(10)
    finally:
        fail.set()
        release.set()
        lead.join(10)
        a.close()
        b.close()
    assert len(tokens) == 2  # it followed the retry
    result = outcome(got)
    assert not isinstance(result, TimeoutError), "still waiting 4 s after a 1 s lease ran out"
    assert isinstance(result, FlightInterruptedError), result
