"""Many keys at once in one fleet group: more flights led, and more joiners waiting on
their mailboxes, than redis-py's connection pool holds by default.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis

from flightgroup import (
    JSON,
    FlightGroup,
)

from ..infleet import in_thread_box
from ..support import wait_until

pytestmark = pytest.mark.timeout(40)


def test_two_hundred_keys_at_once_all_lead(redis_server: Any, namespace: str) -> None:
    """Two hundred keys called at once all lead, past redis-py's pool of 100.

    redis-py 8's asyncio pool makes at most 100 connections and then raises MaxConnectionsError
    at once (no wait, no retry): the group's own pool lets every concurrent ACQUIRE through while
    Redis is fine."""
    group = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON)

    async def main() -> list[Any]:
        async def work(i: int) -> int:
            await asyncio.sleep(0.01)
            return i

        return await asyncio.gather(
            *(group.run(f"k{i}", lambda i=i: work(i)) for i in range(200)),
            return_exceptions=True,
        )

    try:
        results = asyncio.run(main())
    finally:
        group.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == []
    assert [r.value for r in results] == list(range(200))


def test_a_hundred_and_fifty_keys_waited_on_at_once_each_read_their_mailbox(
    redis_server: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hundred and fifty keys waited on at once each read their mailbox.

    Each waiting key holds one blocked XREAD connection (ADR 0011): past 100 each joiner still
    reads its mailbox and is pushed its outcome, never falls back to polling CHECK for the whole
    flight."""
    n = 150
    lead = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30)
    join = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30)
    started = [0]
    gate = threading.Event()
    read_errors: list[BaseException] = []
    reading = [0]
    original_xread = redis.asyncio.Redis.xread

    async def xread(self: Any, *args: Any, **kwargs: Any) -> Any:
        reading[0] += 1
        try:
            return await original_xread(self, *args, **kwargs)
        except BaseException as exc:
            read_errors.append(exc)
            raise

    monkeypatch.setattr(redis.asyncio.Redis, "xread", xread)

    def work(i: int) -> Callable[[], int]:
        def body() -> int:
            started[0] += 1
            gate.wait(20)
            return i

        return body

    leaders = [in_thread_box(lambda i=i: lead.run_sync(f"k{i}", work(i))) for i in range(n)]
    try:
        wait_until(lambda: started[0] == n, "every lead")

        async def joiners() -> list[Any]:
            return await asyncio.gather(
                *(join.run(f"k{i}", _never) for i in range(n)), return_exceptions=True
            )

        thread, box = in_thread_box(lambda: asyncio.run(joiners()))
        wait_until(lambda: reading[0] >= n or bool(read_errors), "every joiner's read")
        assert read_errors == []
        gate.set()
        thread.join(20)
        assert [r.value for r in box[0]] == list(range(n))
    finally:
        gate.set()
        for leader, _ in leaders:
            leader.join(10)
        lead.close()
        join.close()


async def _never() -> Any:
    raise AssertionError("a joiner's work never runs")
