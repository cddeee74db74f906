"""A leader's work starts eagerly on every Python (engine/eager.py, ADR 0052): its first
step runs inside the call, as the work's own task. Python 3.12+ does it itself; on 3.11
the group does it by hand, and the suite's run on 3.11 is what checks that path. (That the
work is its own task from its first line, in every scope: tests/contract/every_scope/
test_work_task.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flightgroup import FlightGroup, FlightInterruptedError

from ..support import run

pytestmark = pytest.mark.timeout(20)

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
