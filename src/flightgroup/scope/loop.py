"""The background thread a wide group's scope runs on (DESIGN.md rule 4): one event loop
per group, in a daemon thread, so what a process owes to others (landings, renewals,
reasserts, a coordinator) never waits for a caller's loop. Also what a forked child of
a started group is told: the thread was not copied, so the group is closed there.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from ..errors import GroupClosedError

__all__ = ["closed_in_fork", "forked_reason", "post", "start_loop"]


def forked_reason(scope: str, parent: int) -> str:
    """Why a wide group copied into a forked child is closed there."""
    return (
        f"This {scope} group was started in process {parent}, and its thread was not "
        "copied into this forked child: make a group of its own here."
    )


def closed_in_fork(why: str) -> GroupClosedError:
    """API.md's GroupClosedError, the reason as a note (``str()`` stays the contract's)."""
    error = GroupClosedError()
    error.add_note(why)
    return error


_SHUTDOWN_ROUNDS = 10  # rounds of cancelling a stopped loop's tasks before it closes


def start_loop(
    name: str, setup: Callable[[asyncio.AbstractEventLoop], None]
) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """A group's background thread: a new event loop running in a daemon thread named
    ``name``; ``setup(loop)`` runs first, on that thread. Returns once the loop runs.
    When the loop is stopped, its tasks are cancelled and awaited, then it closes.

    Always the standard library's selector loop, whatever the event loop policy (a
    program may have installed uvloop for its own loops): the group's machinery is
    written and tested against it, and reads its internals where it must (a forked
    child's let-go)."""
    loop = asyncio.SelectorEventLoop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            setup(loop)
        finally:
            loop.call_soon(ready.set)
        try:
            loop.run_forever()
            # A task may start another as it is cancelled (a connection's cleanup):
            # cancel until none is left, or one left pending is destroyed with the loop.
            for _ in range(_SHUTDOWN_ROUNDS):
                tasks = asyncio.all_tasks(loop)
                if not tasks:
                    break
                for task in tasks:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        finally:
            loop.close()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    ready.wait()
    return loop, thread


def post(loop: asyncio.AbstractEventLoop | None, fn: Callable[..., object], *args: Any) -> bool:
    """Run ``fn(*args)`` on ``loop`` (from any thread); False if there is no loop or
    it closed."""
    if loop is None:
        return False
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop closed
        return False
    return True
