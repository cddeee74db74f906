"""uvloop, the event loop many servers run (uvicorn, and anyone who calls
``uvloop.install()``): callers on uvloop loops share flights with threads in every scope,
and a wide group made while uvloop is the global policy still works: the group's own
background thread runs the standard library's loop whatever the policy (ADR 0027), and
the directory's coordinator takes uvloop's transports."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvloop

from ..ingroup import scope_groups

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def uvloop_everywhere() -> Iterator[None]:
    """uvloop as the global event loop policy for the test (as ``uvloop.install()``)."""
    before = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(before)


@pytest.mark.parametrize("scope", ["process", "directory", "fleet"])
def test_callers_on_uvloop_and_threads_share_one_run(
    request: pytest.FixtureRequest, uvloop_everywhere: None, scope: str
) -> None:
    # two groups of a wide scope are one group; two process groups would be two
    if scope == "process":
        [first] = scope_groups(request, scope, 1, lease=5.0)
        second = first
    else:
        first, second = scope_groups(request, scope, 2, lease=5.0)
    groups = {first, second}
    runs: list[str] = []
    started, release = threading.Event(), threading.Event()

    async def work() -> str:
        runs.append("run")
        started.set()
        await asyncio.to_thread(release.wait, 20)
        return "v"

    def sync_work() -> str:
        raise AssertionError("the threads join: the work never runs here")

    async def one_flight(key: str) -> list[Any]:
        started.clear()
        release.clear()
        joins = sum(g.stats().joins for g in groups)
        leader = asyncio.ensure_future(first.run(key, work))
        assert await asyncio.to_thread(started.wait, 20)
        joiners = [asyncio.ensure_future(g.run(key, work)) for g in (first, second) * 10]
        threads = [
            asyncio.ensure_future(asyncio.to_thread(g.run_sync, key, sync_work))
            for g in (first, second)
        ]
        while sum(g.stats().joins for g in groups) < joins + len(joiners) + len(threads):
            await asyncio.sleep(0.005)
        release.set()
        return await asyncio.gather(leader, *joiners, *threads)

    async def main() -> list[list[Any]]:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        # Two flights on one loop: a fleet joiner's first reads on its group's thread,
        # its next on the loop itself, with a client of uvloop's (ADR 0056, 0058).
        return [await one_flight("k"), await one_flight("k2")]

    try:
        flights = asyncio.run(main())
    finally:
        release.set()
        first.close()
        second.close()
    assert runs == ["run", "run"]
    for results in flights:
        assert [r.value for r in results] == ["v"] * len(results)
        assert [r.joined for r in results] == [False] + [True] * (len(results) - 1)
        assert len({r.token for r in results}) == 1
