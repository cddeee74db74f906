"""How a call of a group waits for its flight and what it gets from it: the async shell
of the wait loop (futures of the caller's loop, a timer for its timeout), the sync shell
(locks, the lock's timeout), the leader's plain wait, a takeover's claim, and the
delivery of a settled flight as the caller's Result or error.

``engine.follow.Follower`` makes every decision of the wait; these shells only wait and
start the leader's work where it decides. :class:`Waiting` is a part of
:class:`~flightgroup.group.FlightGroup` (its base), over the group's table, attempt
driver and bridge.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

from .engine.attempts import current_flight
from .engine.flight import (
    CLOSED,
    ERROR,
    EXPIRED,
    JOINED,
    LEADING,
    LOST,
    SETTLED,
    TIMEOUT,
    VALUE,
    Flight,
    Result,
    Role,
    ThreadWaiter,
    Waiter,
    _expire,
    make_result,
    new_thread_waiter,
)
from .engine.follow import DELIVER, START, Follower, WideRules, signal_for
from .errors import (
    FlightFailedError,
    FlightInterruptedError,
    FlightTimeoutError,
    GroupClosedError,
    renewed,
)

if TYPE_CHECKING:
    from .engine.attempts import Attempts
    from .engine.table import FlightTable
    from .policy import FlightPolicy
    from .scope.bridge import Bridge

__all__ = ["Waiting", "warn_blocks_loop"]

T = TypeVar("T")
_WAIT_MAX = threading.TIMEOUT_MAX


class Waiting:
    """The waiting and delivery of a group's calls (see the module)."""

    __slots__ = ()

    _table: FlightTable[Any]
    _attempts: Attempts
    _bridge: Bridge | None
    _closed_why: str | None

    async def _lead_waiting(
        self,
        flight: Flight,
        work: Callable[[], Awaitable[T]],
        loop: asyncio.AbstractEventLoop,
        policy: FlightPolicy,
    ) -> Result[Any]:
        """The leader whose work (or its scope's answer) has not come yet, with no
        on_join and no timeout: the follower's decisions for that case, without the
        follower (the miss path of every wide call, and of a decorated function's call
        whose work suspended). JOINED (a wide flight joined one led elsewhere) makes it wait again,
        as a joiner now; SETTLED delivers; CLOSED raises; a claim (a takeover of the
        interrupted flight it joined) claims the next flight."""
        table = self._table
        while True:
            fut = loop.create_future()
            if not table.wait_as_leader(flight, fut):
                if self._bridge is not None and table.leader_takes_over(flight):
                    role, following, waiter = table.take_over(flight, loop.create_future, policy)
                    return await self._follow(
                        role, following, waiter, work, None, None, loop, policy
                    )
                return self._deliver(flight, True)
            try:
                signal = await fut
            except BaseException:
                table.give_up(flight, fut)
                raise
            if signal is SETTLED:
                return self._deliver(flight, True)
            if signal is CLOSED:
                raise self._closed_error()
            if signal is not JOINED:
                return await self._claimed(signal, work, loop, policy)


    async def _claimed(
        self,
        following: Any,
        work: Callable[[], Awaitable[T]],
        loop: asyncio.AbstractEventLoop,
        policy: FlightPolicy,
    ) -> Result[T]:
        """A joiner of an interrupted flight that its policy takes over claims the
        flight after it (FlightTable.settle): it leads it, joins it, or takes its
        outcome."""
        role, waiter = self._table.claim(following, loop.create_future, policy)
        return await self._follow(role, following, waiter, work, None, None, loop, policy)


    async def _follow(
        self,
        role: Role,
        flight: Flight,
        waiter: Waiter | None,
        work: Callable[[], Awaitable[T]],
        on_join: Callable[[], object] | None,
        timeout: float | None,
        loop: asyncio.AbstractEventLoop,
        policy: FlightPolicy,
    ) -> Result[T]:
        """The async shell of the wait loop (follow.py decides): waits on futures of
        ``loop``, its timeout a timer on that loop."""
        at = None if timeout is None or math.isinf(timeout) else loop.time() + timeout
        follower = Follower(
            self._table, role, flight, waiter, on_join=on_join, policy=policy,
            make_waiter=loop.create_future, wide=self._wide_rules(),
            closed_error=self._closed_error,
        )
        while True:
            step = follower.step()
            if step is DELIVER:
                return self._deliver(follower.flight, follower.leader)
            if step is START:
                self._attempts.start_async(follower.flight, work, loop, current_flight())
                follower.role = LEADING
                continue
            fut: asyncio.Future[Any] = follower.waiter  # type: ignore[assignment]
            timer = None if at is None else loop.call_at(at, _expire, fut)
            try:
                signal = await fut
            except BaseException:
                follower.abandon()
                raise
            finally:
                if timer is not None:
                    timer.cancel()
            if follower.woken(signal) is DELIVER:
                return self._deliver(follower.flight, follower.leader)

    # An async work given to run_sync fails its flight at run time (TypeError): a type
    # checker that reports deprecated calls flags it where it is written (ADR 0044).


    def _follow_sync(
        self,
        role: Role,
        flight: Flight,
        waiter: Waiter | None,
        work: Callable[[], T],
        on_join: Callable[[], object] | None,
        timeout: float | None,
        policy: FlightPolicy,
    ) -> Result[T]:
        """The sync shell of the wait loop (follow.py decides): waits on locks, its
        timeout the lock's; starts the leader's work in this thread or on its own."""
        monotonic = time.monotonic
        # Past threading.TIMEOUT_MAX (~292 years) Lock.acquire overflows: no limit.
        limited = timeout is not None and timeout < threading.TIMEOUT_MAX
        at = monotonic() + timeout if limited and timeout is not None else None
        follower = Follower(
            self._table, role, flight, waiter, on_join=on_join, policy=policy,
            make_waiter=new_thread_waiter, wide=self._wide_rules(),
            closed_error=self._closed_error,
        )
        while True:
            step = follower.step()
            if step is DELIVER:
                return self._deliver(follower.flight, follower.leader)
            if step is START:
                if self._attempts.start_sync(follower, work, own=at is None):
                    if follower.ended_as_leader():
                        return self._deliver(follower.flight, True)
                    continue  # it takes over the interrupted flight it joined elsewhere
                follower.role = LEADING
                continue
            waiter = follower.waiter
            assert type(waiter) is ThreadWaiter
            try:
                if at is None:
                    taken = waiter.acquire()
                else:
                    taken = waiter.acquire(timeout=min(max(0.0, at - monotonic()), _WAIT_MAX))
            except BaseException:
                follower.abandon()
                raise
            signal = (
                signal_for(
                    self._table, follower.flight, follower.fresh_of, waiter, follower.leader
                )
                if taken else EXPIRED
            )
            if follower.woken(signal) is DELIVER:
                return self._deliver(follower.flight, follower.leader)


    def _wide_rules(self) -> WideRules | None:
        """The wide table's rules for a waiting call (None in the process scope)."""
        return None if self._bridge is None else self._bridge.table


    def _kept_now(self, tkey: Hashable) -> Result[Any] | None:
        """(A group with Retention) the Result of ``tkey``'s kept outcome if no flight
        of it runs, counted as a join; else None. An async call asks this before
        anything else, even before it looks up its loop (on 3.11 that costs a getpid):
        a kept outcome waits for nothing, so a task being cancelled gets it too."""
        kept = self._table.take_kept(tkey)
        if kept is None:
            return None
        return self._deliver(kept, False) if isinstance(kept, Flight) else kept

    def _deliver(self, flight: Flight, leader: bool) -> Result[Any]:
        """Turn a settled flight into this caller's return value or exception."""
        if flight.closed:  # the group closed while this caller's flight ran
            raise self._closed_error()
        outcome = flight.outcome
        if outcome is VALUE:
            data = flight.data
            if data is not None:
                # The flight's own codec made ``data`` (an operation's may differ from
                # the group's): every flight of one key has one operation's policy.
                codec = flight.policy.codec
                assert codec is not None
                bridge = self._bridge
                joined = not leader or (bridge is not None and bridge.ran_elsewhere(flight))
                return Result(codec.decode(data), joined, flight.token)
            if leader:  # (a sync miss's return: no Python frame of the named tuple's)
                return make_result((flight.value, False, flight.token))
            # One Result for every joiner (ADR 0003); setdefault is atomic, so two
            # threads that both found none still return the same object.
            shared = vars(flight)
            result: Result[Any] | None = shared.get("joined_result")
            if result is None:
                result = shared.setdefault(
                    "joined_result", Result(flight.value, True, flight.token)
                )
            return result
        error = flight.error
        assert error is not None
        if self._bridge is not None and self._bridge.ran_elsewhere(flight):
            # (its outcome came from the scope: every caller here is a joiner)
            raise renewed(error)
        if leader:
            raise error
        if outcome is LOST:
            raise FlightInterruptedError(flight.key, "its leader lost its lease") from None
        if outcome is TIMEOUT:
            assert isinstance(error, FlightTimeoutError)
            raise renewed(error) from None
        if outcome is ERROR:
            description = flight.failure
            if description is None:  # a race here only makes the same tuple twice
                description = flight.failure = FlightFailedError.describe(flight.key, error)
            raise FlightFailedError.of(flight.key, error, description)
        raise FlightInterruptedError(
            flight.key, f"its work was stopped by {type(error).__qualname__}"
        ) from None


    def _closed_error(self) -> GroupClosedError:
        """docs/api.md's GroupClosedError; when the group was not closed by close(), the reason
        is a note on it (shown in tracebacks; ``str()`` stays the contract's text)."""
        if self._closed_why is None:
            return GroupClosedError()
        from .scope.loop import closed_in_fork

        return closed_in_fork(self._closed_why)


def warn_blocks_loop(call: str, *, stacklevel: int) -> None:
    """A sync call (``call``, naming its key) made on the thread of a running event loop:
    whether it leads (its work runs in this thread) or joins (it waits for another
    caller's work), that loop runs nothing until the call returns. Said for every such
    call, a kept outcome's too: whether one would wait depends on the other callers'
    timing, the warning must not. Said before the call reaches the table: a warning
    turned into an error changes nothing."""
    warnings.warn(
        f"{call} was called on the thread of a running event loop: it blocks that loop "
        "until the flight's outcome comes (a leader runs the work in this thread, a joiner "
        "waits for another caller's); use await run() there, or call it from another "
        "thread (asyncio.to_thread)",
        RuntimeWarning,
        stacklevel=stacklevel,
    )
