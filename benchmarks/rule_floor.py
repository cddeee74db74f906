"""The rule's floor: the least an async coalescer costs that keeps flightgroup's rules.

Issue 31 holds flightgroup to floors "that its guarantees leave", measured in the same
run. One task per call is the floor of the work's own task alone; this is the floor of
the whole rule, as code: a table that is a dict behind a lock (DESIGN.md rule 3: the
table is thread-safe), a leader whose work runs in a task of its own (ADR 0002: the
leader's cancel does not cancel the work, and ``asyncio.current_task()`` in the work is
the work's own), started eagerly on 3.12+ (on 3.11 through the loop: flightgroup's own
eager start there, ADR 0052, is more than a floor should hold), a leader that waits on a
future of its own only when the work suspended, and joiners that each wait on one, woken
however the work ended, a cancelled waiter skipped. It keeps nothing else: callers on one
event loop only (no wake-up across loops or threads), no fencing token or attempt, no
lease in the work's context, no stats, no policy, no re-entrancy check, and the work's
error raised as it is in every caller (no FlightFailedError of each joiner's own). What
flightgroup costs above it, in (a) and (f), is that bookkeeping.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from .peers import AsyncCall, Lib, Work

__all__ = ["RULE_FLOOR", "RULE_FLOOR_LIB", "RuleFloor"]

RULE_FLOOR = "the rule's floor (a locked dict, the work's own eager task, a future per waiter)"

_EAGER = sys.version_info >= (3, 12)


class _Flight:
    """One key's run: its work's task, its leader's waiter and its joiners' (neither made
    until needed), and its outcome once it ended."""

    __slots__ = ("done", "error", "joiners", "leader", "task", "value")

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.leader: asyncio.Future[None] | None = None
        self.joiners: list[asyncio.Future[None]] | None = None
        self.task: asyncio.Task[None] | None = None


class RuleFloor:
    """A group of the rule's floor: ``await RuleFloor().run(key, work)``."""

    __slots__ = ("_flights", "_lock")

    def __init__(self) -> None:
        self._flights: dict[str, _Flight] = {}
        self._lock = threading.Lock()

    async def run(self, key: str, work: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        """Lead ``key``'s run of ``work`` or join the one in progress; its value."""
        loop = asyncio.get_running_loop()
        with self._lock:
            flight = self._flights.get(key)
            if flight is None:
                flight = self._flights[key] = _Flight()
                waiter = None
            else:
                waiter = loop.create_future()
                if flight.joiners is None:
                    flight.joiners = [waiter]
                else:
                    flight.joiners.append(waiter)
        if waiter is None:  # this call leads
            coro = self._drive(key, flight, work)
            if _EAGER:
                flight.task = asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg, unused-ignore]
            else:
                flight.task = loop.create_task(coro)
            if not flight.done:  # it suspended: it cannot end before this call awaits
                waiter = flight.leader = loop.create_future()
        if waiter is not None:
            await waiter
        if flight.error is not None:
            raise flight.error
        return flight.value

    async def _drive(
        self, key: str, flight: _Flight, work: Callable[[], Coroutine[Any, Any, Any]]
    ) -> None:
        try:
            flight.value = await work()
        except BaseException as exc:
            flight.error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            with self._lock:
                del self._flights[key]
                flight.done = True
                joiners, leader = flight.joiners, flight.leader
            for waiter in (*(joiners or ()), *(() if leader is None else (leader,))):
                if not waiter.done():  # (a cancelled caller withdrew it)
                    waiter.set_result(None)


def _bind(fn: Work) -> AsyncCall:
    run = RuleFloor().run
    return lambda key: run(key, fn)


RULE_FLOOR_LIB: Lib[Work, AsyncCall] = Lib(
    RULE_FLOOR,
    "asyncio",
    "`await RuleFloor().run(key, fn)` (benchmarks/rule_floor.py): a dict behind a "
    "`threading.Lock`, the leader's work in a task of its own (eager on 3.12+), the leader "
    "on a future of its own only when the work suspended, one future per joiner; none of "
    "flightgroup's bookkeeping",
    _bind,
)
