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
)

from ..infleet import RETRY_NOW, fleet_arbiter, hold_script, in_thread_box, never_sync

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
    hold_script(fleet_arbiter(a), "attempt", ran=asked, release=release)
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
