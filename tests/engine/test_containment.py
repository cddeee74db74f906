"""Containment in the process scope: a work or a leader stopped in an unusual place (a
BaseException in the codec, a work thread that cannot start, a work task cancelled
before its first step) still settles its flight and leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest

import flightgroup.engine.sync_attempt as sync_attempt_module
from flightgroup import FlightGroup

from ..ingroup import scope_groups
from ..support import run, until


class Stop(BaseException):
    """A BaseException of the test's own (a stand-in for KeyboardInterrupt)."""


@pytest.fixture(params=["process", "directory", "fleet"])
def any_scope(request: pytest.FixtureRequest) -> Iterator[FlightGroup]:
    """A group of each scope; the wide ones' servers are started only when asked for."""
    [g] = scope_groups(request, request.param, 1, lease=2.0)
    try:
        yield g
    finally:
        g.close()


def test_work_task_cancelled_before_its_first_scheduled_step_still_settles_its_flight(
    any_scope: FlightGroup,
) -> None:
    """A work cancelled as its loop shuts down, right after its eager start, still
    settles its flight.

    asyncio.run(main) where main starts a leader task and returns at once:
    iteration 1: main returns; the run_until_complete callback is queued.
    iteration 2: the leader arrives, leads and starts the work eagerly: its first step
                 runs in the call and waits for an event that never comes (a wide
                 scope's driver: for the scope's answer); the callback stops the loop.
    shutdown:    asyncio.run cancels every task. On 3.11 the work's task has not had its
                 first scheduled step yet (engine/eager.py): the cancel is thrown into
                 the work where it waits, as on 3.12+ it cancels what the task waits on.
    """
    g = any_scope
    ran: list[int] = []
    tasks: list[asyncio.Task[Any]] = []

    async def work() -> str:
        ran.append(1)
        await asyncio.Event().wait()
        return "never"

    async def main() -> None:
        tasks.append(asyncio.create_task(g.run("k", work)))  # fire and forget

    asyncio.run(main())
    assert tasks[0].cancelled()  # the interleaving above happened
    # The process scope's work ran its first step in the call; a wide scope's driver
    # waited for the scope's answer first, so its work never began.
    assert ran == ([1] if "process scope" in repr(g) else [])
    assert g.stats().in_flight == 0, "the flight is stuck in the table"
    # and so a call for a new run gets one instead of waiting on a dead flight for ever.
    # (fresh: a wide scope's withdrawal of the announced lead may still be on its way to
    # the scope, and a plain call may join that ending flight and share its interruption.)
    assert g.run_sync("k", lambda: "next", timeout=10, fresh=True).value == "next"


class _StopOnceCodec:
    """Encoding raises Stop the first time (think KeyboardInterrupt during a slow pickle)."""

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, value: Any, /) -> bytes:
        self.calls += 1
        if self.calls == 1:
            raise Stop()
        return repr(value).encode()

    def decode(self, data: bytes, /) -> Any:
        return data.decode()


def test_sync_encode_interrupted_by_a_base_exception_still_settles_the_flight() -> None:
    """A sync leader's encode interrupted by a BaseException still settles the flight.

    _land runs inside _drive_sync's try: the flight never stays RUNNING."""
    g = FlightGroup(codec=_StopOnceCodec())
    with pytest.raises(Stop):
        g.run_sync("k", lambda: "v")
    assert g.stats().in_flight == 0, "the flight is stuck in the table"
    assert g.run_sync("k", lambda: "w", timeout=5).value == "'w'"


def test_async_encode_interrupted_by_a_base_exception_still_settles_the_flight() -> None:
    """An async leader's encode interrupted by a BaseException still settles the flight.

    _land runs inside _drive_async's guard, not after it: the work's task ending with the
    codec's exception still settles the flight."""

    async def main() -> None:
        g = FlightGroup(codec=_StopOnceCodec())
        release = asyncio.Event()
        work_tasks: list[asyncio.Task[Any] | None] = []

        async def work() -> str:
            work_tasks.append(asyncio.current_task())  # the task the group runs it in
            await release.wait()
            return "v"

        leader = asyncio.create_task(g.run("k", work))
        await until(lambda: bool(work_tasks), "the work's task started")
        task = work_tasks[0]
        assert task is not None
        release.set()
        try:
            await until(task.done, "the work's task ended")
            assert g.stats().in_flight == 0, "the work's task ended, its flight never settled"
            with pytest.raises(Stop):
                await leader
        finally:
            g.close()  # a leader still waiting (the flight unsettled) is let go
            await asyncio.gather(leader, return_exceptions=True)
            if not task.cancelled():
                task.exception()  # retrieved: no "never retrieved" log

    run(main())


class _NoThread:
    """threading.Thread that cannot start (the interpreter is out of threads)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def start(self) -> None:
        raise RuntimeError("can't start new thread")


def test_leader_whose_work_thread_cannot_start_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A leader whose work thread cannot start leaves nothing behind."""
    g = FlightGroup()
    no_threads = types.ModuleType("threading")  # the module, but Thread cannot start
    no_threads.__dict__.update(vars(threading))
    no_threads.Thread = _NoThread  # type: ignore[attr-defined]
    with monkeypatch.context() as patch:
        patch.setattr(sync_attempt_module, "threading", no_threads)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            g.run_sync("k", lambda: "v", timeout=5)
    assert g.stats().in_flight == 0, "the flight is stuck in the table"
