"""docs/api.md, Calls: a caller's cancel or ``timeout`` withdraws only that caller."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import pytest

from flightgroup import FlightGroup

from ...ingroup import Background
from ...support import LoopThread, run
from .conftest import Leader, Scope, joiner, never


async def never_async() -> Any:
    raise AssertionError("a joiner's work never runs")


def test_a_joiners_timeout_withdraws_only_that_joiner(group: FlightGroup) -> None:
    leader = Leader(group, "k", "v")
    staying = joiner(group, "k")
    with pytest.raises(TimeoutError):
        group.run_sync("k", never, timeout=0.05)
    leader.release()
    assert leader.result().value == "v"
    assert staying.wait().value == "v"
    assert leader.runs == 1


def test_a_joiner_elsewhere_that_times_out_leaves_the_flight_to_the_others(
    pair: tuple[FlightGroup, ...],
) -> None:
    a, b = pair
    leader = Leader(a, "k", "v")
    staying = joiner(b, "k")
    with pytest.raises(TimeoutError):
        b.run_sync("k", never, timeout=0.05)
    leader.release()
    assert staying.wait().value == "v"
    assert leader.result().value == "v"


def test_a_leaders_timeout_does_not_stop_the_work(group: FlightGroup) -> None:
    started, release = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert release.wait(30)
        return "v"


    leading = Background(lambda: group.run_sync("k", work, timeout=0.2))
    assert started.wait(15)
    staying = joiner(group, "k")
    assert isinstance(leading.error or _wait_error(leading), TimeoutError)
    release.set()
    assert staying.wait().value == "v"


def test_a_leading_callers_timeout_elsewhere_leaves_the_flight_to_its_joiners(
    pair: tuple[FlightGroup, ...],
) -> None:
    a, b = pair
    started, release = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert release.wait(30)
        return "v"


    leading = Background(lambda: a.run_sync("k", work, timeout=0.2))
    assert started.wait(15)
    elsewhere = joiner(b, "k")
    assert isinstance(_wait_error(leading), TimeoutError)
    release.set()
    assert (elsewhere.wait().value, elsewhere.wait().joined) == ("v", True)


def _wait_error(call: Any) -> BaseException | None:
    call.done.wait(15)
    return call.error


def test_cancelling_a_joining_task_withdraws_only_it(group: FlightGroup) -> None:
    leader = Leader(group, "k", "v")
    joined = threading.Event()
    loop = LoopThread()
    try:
        cancelled = loop.submit(group.run("k", never_async, on_join=joined.set))
        assert joined.wait(15)
        cancelled.cancel()  # cancels the calling task on its loop
        with pytest.raises(concurrent.futures.CancelledError):
            cancelled.result(15)
        staying = joiner(group, "k")
        leader.release()
        assert staying.wait().value == "v"
        assert leader.result().value == "v"
    finally:
        loop.close()


def test_a_leaders_cancel_does_not_cancel_the_work(scope: Scope, group: FlightGroup) -> None:
    started, release, ended = asyncio.Event(), threading.Event(), threading.Event()

    async def work() -> str:
        started.set()
        await asyncio.to_thread(release.wait, 30)
        ended.set()
        return "v"

    async def scenario() -> Any:
        leading = asyncio.ensure_future(group.run("k", work))
        await started.wait()
        joined = asyncio.Event()
        joining = asyncio.ensure_future(group.run("k", never_async, on_join=joined.set))
        await joined.wait()
        leading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leading
        release.set()
        return await joining

    result = run(scenario())
    assert (result.value, result.joined) == ("v", True)
    assert ended.is_set()


def test_a_timeout_of_zero_neither_leads_nor_joins(group: FlightGroup) -> None:
    calls = group.stats().calls
    with pytest.raises(TimeoutError):
        group.run_sync("k", never, timeout=0)
    with pytest.raises(TimeoutError):
        run(group.run("k", never_async, timeout=0))
    leader = Leader(group, "k", "v")
    with pytest.raises(TimeoutError):
        group.run_sync("k", never, timeout=0)  # a flight runs: it does not join it
    leader.release()
    assert leader.result().value == "v"
    assert group.stats().calls == calls + 1  # the leader's only


def test_an_already_cancelled_task_neither_leads_nor_joins(group: FlightGroup) -> None:
    """A task that is being cancelled gets CancelledError from run() at once, and its
    call counts nowhere. (In a task of its own: on Python 3.11 ``uncancel`` leaves the
    request pending, so the calling task ends cancelled.)"""

    async def caller() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await group.run("k", never_async)

    async def scenario() -> None:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.ensure_future(caller())

    run(scenario())
    assert group.stats().calls == 0
