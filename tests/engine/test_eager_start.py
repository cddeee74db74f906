"""A leader's work starts eagerly on every Python (engine/eager.py, ADR 0052): its first
step runs inside the call, as the work's own task. Python 3.12+ does it itself; on 3.11
the group does it by hand, and the suite's run on 3.11 is what checks that path."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from flightgroup import FlightGroup, FlightInterruptedError

from ..support import run

pytestmark = pytest.mark.timeout(20)

_SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


def test_a_work_that_never_suspends_ends_inside_the_call() -> None:
    async def main() -> None:
        g = FlightGroup()
        turned: list[int] = []
        loop = asyncio.get_running_loop()

        async def instant() -> str:
            return "v"

        loop.call_soon(turned.append, 1)  # runs at the loop's next turn
        result = await g.run("k", instant)
        # The caller's task never gave the loop a turn: the work ran and settled in the call.
        assert turned == []
        assert (result.value, result.joined) == ("v", False)
        assert g.stats().in_flight == 0

    run(main())


def test_the_work_runs_as_its_own_task_from_its_first_line() -> None:
    async def main() -> None:
        g = FlightGroup()
        seen: list[asyncio.Task[Any] | None] = []

        async def work() -> str:
            seen.append(asyncio.current_task())  # the eager first step
            await asyncio.sleep(0)  # a bare yield: the task's own scheduled step goes on
            seen.append(asyncio.current_task())
            await asyncio.sleep(0.001)  # a future
            seen.append(asyncio.current_task())
            return "v"

        caller = asyncio.current_task()
        assert (await g.run("k", work)).value == "v"
        first = seen[0]
        assert isinstance(first, asyncio.Task)
        assert first is not caller and seen == [first, first, first]
        # The caller is its own task again once the call returned.
        assert asyncio.current_task() is caller

    run(main())


def test_the_work_sees_the_callers_context_and_its_changes_stay_its_own() -> None:
    async def main() -> None:
        g = FlightGroup()

        async def work() -> str:
            before = _SEEN.get()
            _SEEN.set("work")
            await asyncio.sleep(0)
            return f"{before}/{_SEEN.get()}"

        _SEEN.set("caller")
        assert (await g.run("k", work)).value == "caller/work"
        assert _SEEN.get() == "caller"

    run(main())


def test_a_future_done_before_the_tasks_first_step_still_wakes_the_work() -> None:
    """The work waits on a future that is resolved before its task's first scheduled step
    (on 3.11, the step that takes over the wait from the eager start)."""

    async def main() -> None:
        g = FlightGroup()
        loop = asyncio.get_running_loop()
        gate: asyncio.Future[str] = loop.create_future()

        async def work() -> str:
            return await gate

        leader = asyncio.ensure_future(g.run("k", work))
        while g.stats().in_flight == 0:  # the leader's call began, the work waits on gate
            await asyncio.sleep(0)
        gate.set_result("v")  # (on 3.11 the work's task has not stepped yet)
        assert (await leader).value == "v"

    run(main())


def test_a_cancel_of_the_works_task_during_its_eager_step_reaches_the_work() -> None:
    """The work's task is cancelled during its eager first step (on 3.11 that is before
    the task's first scheduled step, when it waits on nothing yet): the cancel reaches the
    work where it then waits, the flight ends interrupted, and its joiner is told so."""

    async def main() -> None:
        g = FlightGroup()
        cancelled: list[bool] = []

        async def work() -> str:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            return "never"

        # The joiner's first step is queued before the leader's task can step again.
        leader = asyncio.ensure_future(g.run("k", work))
        joiner = asyncio.ensure_future(g.run("k", work))
        results = await asyncio.gather(leader, joiner, return_exceptions=True)
        assert cancelled == [True]
        assert isinstance(results[0], asyncio.CancelledError)  # the leader: the interrupt
        assert isinstance(results[1], FlightInterruptedError)  # the joiner: interrupted
        assert g.stats().in_flight == 0
        assert (await g.run("k", _value)).value == "again"  # the key is free

    run(main())


def test_a_work_that_swallows_cancels_from_its_eager_step_on_goes_on_to_its_value() -> None:
    """The work's task is cancelled during its eager step, and again while it waits after
    that; the work catches both and returns: its value is the flight's."""

    async def main() -> None:
        g = FlightGroup()
        loop = asyncio.get_running_loop()
        gate: asyncio.Future[str] = loop.create_future()
        caught: list[int] = []
        tasks: list[asyncio.Task[Any]] = []

        async def work() -> str:
            task = asyncio.current_task()
            assert task is not None
            tasks.append(task)
            task.cancel()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                caught.append(1)
            try:
                return await gate
            except asyncio.CancelledError:
                caught.append(2)
            return "survived"

        leader = asyncio.ensure_future(g.run("k", work))
        while caught != [1]:
            await asyncio.sleep(0)
        tasks[0].cancel()  # (on 3.11: thrown in while the task waits after the first throw)
        assert (await leader).value == "survived"
        assert caught == [1, 2]
        assert gate.cancelled()  # (a cancel of a task cancels what it waits on)

    run(main())


async def _value() -> str:
    return "again"
