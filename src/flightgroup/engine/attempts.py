"""The attempt driver: runs a leader's work, attempt by attempt, and lands its outcome.

Where the work runs (ADR 0002): an async work runs in a task of its own, owned by the
group, so the leader's caller can be cancelled or time out without cancelling the work.
That task starts eagerly on every Python (``eager.py``, ADR 0052): a work that finishes
without suspending costs no trip through the event loop. A sync work runs in the
leader's own thread, or, under a deadline, each attempt on one of the group's kept
threads while its driver waits for it, so the deadline can pass it by (ADR 0008, ADR
0038); ``sync_attempt.py`` runs one such attempt, this module loops over them.

Containment: every ending of an attempt (a value, an Exception, a cancellation, any
other BaseException, a deadline) becomes one outcome; retries follow the flight's policy
(the leader's); the landing encodes the value (with the flight's codec), hands it to the scope's
bridge where there is one, and settles the flight in the table, waking every waiter.
"""

from __future__ import annotations

import asyncio
import random
import time
import types
from asyncio import events
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..codec import encode_bytes
from ..errors import FlightTimeoutError, ValueTooLargeError
from ..lease import _CURRENT
from ..retention import estimate_size
from .eager import start_eagerly
from .flight import (
    CLOSED,
    ERROR,
    INTERRUPTED,
    RETRY_PENDING,
    RUNNING,
    SETTLED,
    TIMEOUT,
    VALUE,
    Attempt,
    Flight,
    Outcome,
    wake,
)
from .sync_attempt import Ending, TimedAttempt, attempt_sync, is_awaitable, start_thread
from .table import UNMEASURED, FlightTable
from .workers import Workers

if TYPE_CHECKING:
    from ..scope.bridge import Bridge
    from ..scope.events import ScopeEvent
    from ..scope.interface import ScopeCall
    from .follow import Follower

__all__ = ["Attempts", "current_flight"]

_CoroutineType = types.CoroutineType



class Attempts:
    """The attempt driver of one group: starts and drives a leader's work, lands its
    outcome. ``bridge`` is the group's wide scope's, if it has one: a wide flight asks
    its scope first (``Bridge.start``), takes a token per retry and lands through it."""

    __slots__ = ("bridge", "max_value_bytes", "table", "workers")

    def __init__(
        self,
        table: FlightTable[Any],
        *,
        max_value_bytes: int | None,
        max_deadline_threads: int,
    ) -> None:
        self.table = table
        self.max_value_bytes = max_value_bytes
        self.bridge: Bridge | None = None
        self.workers = Workers(max_deadline_threads)  # where sync attempts under a deadline run

    def start_async(
        self,
        flight: Flight,
        work: Callable[[], Awaitable[Any]],
        loop: asyncio.AbstractEventLoop,
        parent: Flight | None,
    ) -> None:
        """Start the work of ``flight``, which the caller leads, in a task of its own on
        ``loop`` (a wide flight asks its scope first, in that task). ``parent``: the
        flight whose work makes this call (``current_flight()``), if any."""
        flight.loop = loop
        if parent is not None:
            flight.parent = parent
        if self.bridge is not None:
            self.bridge.start_async(flight, work, loop)
            return
        policy = flight.policy
        deadline = policy.deadline
        if deadline is None and policy.retry is None:
            coro = self.drive_once(flight, work)
        else:
            coro = self.drive_async(flight, work)
        if deadline is None:  # nothing to arm after the eager start
            flight.task = start_eagerly(coro, loop)
            return
        began = loop.time()
        task = flight.task = start_eagerly(coro, loop)
        attempt = flight.attempt
        # A work that finished eagerly cannot have run late: the first attempt's timer is
        # armed only for a work that suspended in it (not one whose first attempt failed
        # at once and that now pauses before the next: that one's own timer comes with it).
        if (
            attempt is not None
            and attempt.timer is None
            and flight.attempt is attempt
            and flight.state is RUNNING
        ):
            attempt.timer = loop.call_at(began + deadline, time_out, attempt, task)

    async def drive_async(
        self, flight: Flight, work: Callable[[], Awaitable[Any]], call: ScopeCall | None = None
    ) -> None:
        """The body of the work's own task: run each attempt, contain every ending,
        retry as the flight's policy says, land the outcome. ``call``: the wide
        scope's lead this work runs under."""
        attempt = flight.attempt
        assert attempt is not None
        _CURRENT.set(attempt)  # in this task's own context
        policy = flight.policy
        number = 1
        error: BaseException | None
        while True:
            timer = None
            if policy.deadline is not None and (number > 1 or call is not None):
                timer = attempt.timer = events.get_running_loop().call_later(
                    policy.deadline, time_out, attempt, asyncio.current_task()
                )
            try:
                awaitable = work()
                if type(awaitable) is not _CoroutineType and not is_awaitable(awaitable):
                    raise _not_awaitable(awaitable)
                value = await awaitable
            except Exception as exc:
                outcome, value, error = ERROR, None, exc
            except BaseException as exc:
                outcome, value, error = INTERRUPTED, None, exc
            else:
                outcome, error = VALUE, None
            timer = attempt.timer  # the first eager attempt's is set by start_async
            if timer is not None:
                timer.cancel()
                if attempt.timed_out:  # the deadline cancelled it (or its result is late)
                    task = asyncio.current_task()
                    if task is not None and isinstance(error, asyncio.CancelledError):
                        task.uncancel()
                    assert policy.deadline is not None
                    outcome, value = TIMEOUT, None
                    error = FlightTimeoutError(flight.key, policy.deadline, number)
            if error is None or not self.will_retry(flight, number, outcome, error):
                break
            try:
                await asyncio.sleep(policy.backoff(number, random.uniform))
            except BaseException as exc:  # its loop shut down during the pause
                outcome, value, error = INTERRUPTED, None, exc
                break
            following = self.table.next_attempt(flight)
            if following is None:
                break
            if call is not None:  # each attempt has its own token from the scope
                assert self.bridge is not None
                try:
                    bound = await self.bridge.retry(flight, call, following)
                except BaseException as exc:
                    # Its loop shut down while the scope answers: the flight still lands
                    # (the scope gives back a token it gets now), or its local joiners
                    # wait for ever and its lead is renewed on.
                    following.lose()
                    outcome, value, error = INTERRUPTED, None, exc
                    break
                if not bound:
                    break
            attempt, number = following, number + 1
            _CURRENT.set(attempt)
        stop = self.land(flight, outcome, value, error)
        # The task's context holds the flight and the flight holds the task: break the
        # cycle so a settled flight (and its value) goes with its last caller.
        _CURRENT.set(None)
        if stop is not None:
            raise _stopped(stop)

    async def drive_once(self, flight: Flight, work: Callable[[], Awaitable[Any]]) -> None:
        """drive_async for a flight of one attempt with no deadline (no Retry, no
        deadline, no wide scope): the same containment and landing in a smaller frame,
        which every in-flight key holds while its work runs."""
        _CURRENT.set(flight.attempt)  # in this task's own context
        try:
            awaitable = work()
            if type(awaitable) is not _CoroutineType and not is_awaitable(awaitable):
                raise _not_awaitable(awaitable)
            value = await awaitable
        except Exception as exc:
            stop = self.land(flight, ERROR, None, exc)
        except BaseException as exc:
            stop = self.land(flight, INTERRUPTED, None, exc)
        else:
            stop = self.land(flight, VALUE, value, None)
        _CURRENT.set(None)  # (as drive_async: no cycle through the task's context)
        if stop is not None:
            raise _stopped(stop)

    def start_sync(self, follower: Follower, work: Callable[[], Any], *, own: bool) -> bool:
        """Start the work of the flight this sync caller leads. True if it settled here
        already (the flight was driven in this thread: deliver it); else the caller
        waits for it.

        ``own`` (no timeout): the flight is driven in this thread. A KeyboardInterrupt
        in the work stops it for all; one while this thread waits for an attempt on a
        kept thread (a deadline) or in a retry's pause withdraws this caller only, and
        the rest of the flight goes on on a thread of its own. Else (a timeout) the
        flight is driven on a thread of its own from the start."""
        flight = follower.flight
        bridge = self.bridge
        if own and bridge is None:
            self.drive_sync(flight, work, current_flight())
            return True
        if own:
            assert bridge is not None
            # The driver calls on_join when the flight joins one led elsewhere.
            failed = bridge.drive_sync(flight, work, current_flight(), follower.take_on_join())
            if failed is not None:  # on_join raised while the flight ran
                raise failed
            return False  # settled, or (fleet) settling once the scope has the landing
        drive: Callable[..., Any] = (
            bridge.drive_sync if bridge is not None else self.drive_sync
        )
        # A failed start ("can't start new thread", or a KeyboardInterrupt that landed
        # inside start() before the thread got going): nothing ran. An interrupt once it
        # got going re-raises here: this caller withdraws, the flight goes on for the
        # others.
        failed = start_thread(
            f"flightgroup-work-{flight.token}", drive, flight, work, current_flight()
        )
        if failed is not None:
            self.land(flight, INTERRUPTED, None, failed)
            raise failed
        return False

    def drive_sync(
        self,
        flight: Flight,
        work: Callable[[], Any],
        parent: Flight | None,
        call: ScopeCall | None = None,
    ) -> None:
        """Run a sync work's attempts in this thread, retry as the policy says, land
        the outcome. A BaseException reaches the leader through _deliver, in its own
        thread. ``call``: the wide scope's lead this work runs under."""
        flight.parent = parent
        attempt = flight.attempt
        assert attempt is not None
        self.drive_sync_from(flight, work, call, attempt, 1, None)

    def drive_sync_from(
        self,
        flight: Flight,
        work: Callable[[], Any],
        call: ScopeCall | None,
        attempt: Attempt,
        number: int,
        paused: tuple[float, Ending] | None,
        timed: TimedAttempt | None = None,
    ) -> None:
        """The loop of drive_sync from attempt ``number``; ``paused``: the pause before
        the next attempt still to wait, and the ending of ``attempt`` (a pause that a
        KeyboardInterrupt cut short in the leader's thread goes on here, on a thread of
        its own: the leader withdraws, the flight goes on for the others); ``timed``:
        ``attempt`` under its deadline, whose wait was cut short so."""
        policy = flight.policy
        error: BaseException | None
        handed = False  # a cut pause or wait went on on a thread of its own
        try:
            while True:
                if paused is None:
                    deadline = policy.deadline
                    if deadline is None:
                        outcome, value, error = attempt_sync(attempt, work)
                    else:
                        if timed is None:
                            timed = TimedAttempt(self, attempt, work, deadline, number)
                        try:
                            outcome, value, error = timed.run()
                        except Exception as exc:  # no thread to be had: nothing ran
                            outcome, value, error = INTERRUPTED, None, exc
                        except BaseException as exc:  # KeyboardInterrupt while it waited
                            # This caller withdraws; the attempt (started, or not yet)
                            # and the rest of the flight go on on a thread of its own.
                            handed = True
                            if start_thread(
                                f"flightgroup-wait-{flight.token}", self.drive_sync_from,
                                flight, work, call, attempt, number, None, timed,
                            ) is None:
                                raise
                            handed = False
                            timed.abandon()  # no thread: the flight ends here
                            outcome, value, error = INTERRUPTED, None, exc
                        timed = None
                    if error is None or not self.will_retry(flight, number, outcome, error):
                        break
                    pause = policy.backoff(number, random.uniform)
                else:
                    pause, (outcome, value, error) = paused
                    paused = None
                resume = time.monotonic() + pause
                try:
                    time.sleep(pause)
                except BaseException as exc:  # KeyboardInterrupt during the pause
                    rest = (max(0.0, resume - time.monotonic()), (outcome, value, error))
                    # (An interrupt inside start() once the thread got going leaves it
                    # handed, and is raised from here.)
                    handed = True
                    if start_thread(
                        f"flightgroup-retry-{flight.token}",
                        self.drive_sync_from, flight, work, call, attempt, number, rest,
                    ) is not None:  # no thread to go on with: the flight ends here
                        handed = False
                        outcome, value, error = INTERRUPTED, None, exc
                        break
                    raise
                following = self.table.next_attempt(flight)
                if following is None:
                    break
                if call is not None:  # each attempt has its own token from the scope
                    bridge = self.bridge
                    assert bridge is not None
                    bridge.scope.retry(call)
                    got: ScopeEvent | None = None  # read, maybe not taken
                    try:
                        got = call.inbox.wait_sync()
                        call.inbox.take(got)
                    except BaseException as exc:
                        # Interrupted waiting for the token (not in the work): this
                        # caller withdraws, the retry goes on on a thread of its own
                        # (with the answer, if it was read: see Inbox.wait_sync).
                        handed = True  # (as for a cut pause, above)
                        if start_thread(
                            f"flightgroup-retry-{flight.token}", self.retry_when_bound,
                            flight, work, call, following, number + 1,
                            (outcome, value, error), got,
                        ) is None:
                            raise
                        handed = False
                        following.lose()  # no thread: the flight ends here
                        outcome, value, error = INTERRUPTED, None, exc
                        break
                    if not bridge.bind_retry(flight, call, following, got):
                        break
                attempt, number = following, number + 1
            self.land(flight, outcome, value, error)
        except BaseException as exc:
            # Stopped outside the work (a signal between two steps, or in user code the
            # landing calls): the flight must still end, or its joiners wait for ever
            # and every later call joins it. It ends interrupted, as an interrupt in
            # the work does (ADR 0008), unless it settled or is settling already.
            if not handed and (flight.state is RUNNING or flight.state is RETRY_PENDING):
                self.land(flight, INTERRUPTED, None, exc)
            raise

    def retry_when_bound(
        self,
        flight: Flight,
        work: Callable[[], Any],
        call: ScopeCall,
        following: Attempt,
        number: int,
        ending: Ending,
        got: ScopeEvent | None,
    ) -> None:
        """(On a thread of its own) the retry whose token its leader's caller stopped
        waiting for (``got``: the answer, if it had read it): wait for it, then go on
        with the attempts (or land ``ending``, the last attempt's, if the lease was lost
        meanwhile)."""
        bridge = self.bridge
        assert bridge is not None
        if got is None:
            got = call.inbox.wait_sync()
        call.inbox.take(got)
        if bridge.bind_retry(flight, call, following, got):
            self.drive_sync_from(flight, work, call, following, number, None)
        else:
            self.land(flight, *ending)

    def will_retry(
        self, flight: Flight, number: int, outcome: Outcome, error: BaseException | None
    ) -> bool:
        """True if attempt ``number``, which just ended so, is followed by another; the
        flight is then RETRY_PENDING until ``next_attempt``."""
        if error is None or outcome is INTERRUPTED:  # (callers test None first)
            return False
        if not flight.policy.retries(number, error, outcome is TIMEOUT):
            return False
        return self.table.retry_pending(flight)

    def land(
        self, flight: Flight, outcome: Outcome, value: Any, error: BaseException | None
    ) -> BaseException | None:
        """The landing: encode (with the flight's codec), hand the outcome to the table,
        wake every waiter. Never raises; returns the BaseException that stopped the
        flight (the work's, or the codec's), which an async driver re-raises."""
        data = None
        codec = flight.policy.codec
        if codec is not None and outcome is VALUE:
            try:
                data = encode_bytes(codec, value)
                limit = self.max_value_bytes
                if limit is not None and len(data) > limit:
                    raise ValueTooLargeError(flight.key, len(data), limit)
            except Exception as exc:
                outcome, value, error, data = ERROR, None, exc, None
            except BaseException as exc:
                outcome, value, error, data = INTERRUPTED, None, exc, None
            else:
                value = None
        # What stopped the work (an interrupt) stops the driver too, even when the lease
        # turns out lost and the callers get LeaseLostError instead.
        stop = error if outcome is INTERRUPTED else None
        if self.bridge is not None:  # settled once the scope has the landing
            outcome, error = self.bridge.land(flight, outcome=outcome, data=data, error=error)
            return error if outcome is INTERRUPTED else stop
        retention = flight.policy.retention
        if retention is None or retention.max_bytes is None:  # no size to measure
            # self.settle(...), inlined: a miss has nobody to wake
            detached = self.table.settle(flight, outcome, value, error, data)
            if detached is not None and (detached[0] or detached[1]):
                self.wake(flight, *detached)
        else:
            self.settle_landed(flight, outcome, value, error, data)
        return error if outcome is INTERRUPTED else stop

    def settle_landed(
        self,
        flight: Flight,
        outcome: Outcome,
        value: Any,
        error: BaseException | None,
        data: bytes | None,
    ) -> None:
        """Settle the flight this process led with its outcome."""
        size = 0
        retention = flight.policy.retention
        if retention is not None and retention.max_bytes is not None:
            # Measured here, outside the lock: __sizeof__ is user code (I5). Only when
            # the outcome may be kept and a byte bound needs its size.
            try:
                if outcome is VALUE and retention.success:
                    size = len(data) if data is not None else estimate_size(value)
                elif outcome is ERROR and retention.error:
                    size = estimate_size(error)
            except BaseException:
                # Interrupted while measuring (a signal in user code): every caller
                # still gets the outcome, which is not kept; the leader gets the
                # interrupt.
                self.settle(flight, outcome, value, error, data, UNMEASURED)
                raise
        self.settle(flight, outcome, value, error, data, size)

    def settle(
        self,
        flight: Flight,
        outcome: Outcome,
        value: Any,
        error: BaseException | None,
        data: bytes | None,
        size: int = 0,
    ) -> None:
        """Record the outcome in the table and wake every waiter: the joiners to read
        it, the fresh callers to claim the next flight."""
        detached = self.table.settle(flight, outcome, value, error, data, size)
        if detached is not None:
            self.wake(flight, *detached)

    @staticmethod
    def wake(flight: Flight, waiters: dict[Any, None], fresh: list[Any] | None) -> None:
        """Wake what ``FlightTable.settle`` detached from ``flight``: the joiners to read
        its outcome, the fresh callers to claim the next flight."""
        if waiters:
            wake(waiters, SETTLED)
        if fresh:
            following = flight.next
            wake(fresh, following if following is not None else CLOSED)


def _not_awaitable(awaitable: object) -> TypeError:
    return TypeError(
        f"the work given to run() returned {type(awaitable).__name__}, not an "
        "awaitable; use run_sync() for a plain function"
    )


def _stopped(stop: BaseException) -> BaseException:
    """What stopped an async work (CancelledError as its loop shuts down,
    KeyboardInterrupt, SystemExit), to raise on from its driver: the joiners were
    interrupted and the leader gets it from _deliver, so its task, which ends cancelled
    (and the loop sees a KeyboardInterrupt), need not log it again. (GeneratorExit: the
    coroutine is being closed outside any loop.)"""
    if events._get_running_loop() is not None:
        task = asyncio.current_task()
        if task is not None:  # the leader has it
            task.add_done_callback(_retrieve)
    return stop


def time_out(attempt: Attempt, task: asyncio.Task[None] | None) -> None:
    """The deadline of an async attempt: its lease is lost and its work cancelled."""
    attempt.timed_out = True
    attempt.lose()
    if task is not None:
        task.cancel()


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()



def current_flight() -> Flight | None:
    """The flight whose work runs here, if any (the chain of I6)."""
    current = _CURRENT.get()
    return None if current is None else current.flight
