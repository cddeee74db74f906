"""ADR 0002: an async work runs in a task of its own, in every scope.
`asyncio.current_task()` inside the work is that task from its first line to its end
(started eagerly on every Python, ADR 0052), never the caller's; the work sees the
caller's context variables, and what it sets stays its own."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from flightgroup import FlightGroup

from ...support import run

_SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


def test_the_work_runs_as_its_own_task_from_its_first_line(group: FlightGroup) -> None:
    async def scenario() -> None:
        seen: list[asyncio.Task[Any] | None] = []

        async def work() -> str:
            seen.append(asyncio.current_task())  # its first step
            await asyncio.sleep(0)  # a bare yield: the task's own scheduled step goes on
            seen.append(asyncio.current_task())
            await asyncio.sleep(0.001)  # a future
            seen.append(asyncio.current_task())
            return "v"

        caller = asyncio.current_task()
        assert (await group.run("k", work)).value == "v"
        first = seen[0]
        assert isinstance(first, asyncio.Task)
        assert first is not caller and seen == [first, first, first]
        # The caller is its own task again once the call returned.
        assert asyncio.current_task() is caller

    run(scenario())


def test_the_work_sees_the_callers_context_and_its_changes_stay_its_own(
    group: FlightGroup,
) -> None:
    async def scenario() -> None:
        async def work() -> str:
            before = _SEEN.get()
            _SEEN.set("work")
            await asyncio.sleep(0)
            return f"{before}/{_SEEN.get()}"

        _SEEN.set("caller")
        assert (await group.run("k", work)).value == "caller/work"
        assert _SEEN.get() == "caller"

    run(scenario())
