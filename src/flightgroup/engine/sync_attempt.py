"""One attempt of a sync work, and the threads a sync flight goes on on.

A sync work's attempt runs in its driver's thread (``attempt_sync``) or, under a
deadline, on one of the group's kept threads while its driver waits for it until the
deadline (``TimedAttempt``, ADR 0008, ADR 0038); either way every ending of the work
becomes an :data:`Ending`. ``start_thread`` starts the thread a sync flight goes on on
once its leader's caller withdraws (a KeyboardInterrupt while it waited), or a flight
under a timeout is driven on. The driver that loops over attempts and lands the outcome
is ``attempts.py``'s.
"""

from __future__ import annotations

import inspect
import threading
import time
import types
from collections.abc import Callable
from contextvars import copy_context
from typing import TYPE_CHECKING, Any, TypeAlias

from ..errors import FlightTimeoutError
from ..lease import _CURRENT
from .flight import ERROR, INTERRUPTED, TIMEOUT, VALUE, Attempt, Outcome
from .workers import GAVE_UP, WAITING, Job

if TYPE_CHECKING:
    from .attempts import Attempts

__all__ = ["Ending", "TimedAttempt", "attempt_sync", "is_awaitable", "start_thread"]

Ending: TypeAlias = tuple[Outcome, Any, BaseException | None]
"""How one attempt ended: its outcome, its value, its error."""


def attempt_sync(attempt: Attempt, work: Callable[[], Any]) -> Ending:
    """One attempt of a sync work in this thread: every ending becomes an outcome."""
    reset = _CURRENT.set(attempt)
    try:
        value = work()
        if is_awaitable(value):
            if inspect.iscoroutine(value):
                value.close()  # never awaited: close it quietly
            named = getattr(work, "func", work)  # a decorated plain def: its partial
            raise TypeError(
                f"the work {getattr(named, '__qualname__', type(named).__name__)} returned "
                f"{type(value).__name__}, an awaitable, to a sync call (run_sync(), or a "
                "decorated plain def); use await run(), or decorate an async def"
            )
    except Exception as exc:
        return ERROR, None, exc
    except BaseException as exc:
        return INTERRUPTED, None, exc
    finally:
        _CURRENT.reset(reset)
    return VALUE, value, None


class TimedAttempt:
    """One attempt of a sync work under its deadline: it runs on one of the group's
    kept threads, and its driver waits for it until the deadline (a wait for a thread
    under the group's bound counts against it). A sync work cannot be stopped: past
    the deadline its lease is lost and it runs on, left; its late ending goes to this
    attempt's own ``ending``, which nobody reads. A wide scope's bridge hears of such
    a straggler and of its return."""

    __slots__ = ("attempt", "attempts", "deadline", "ended", "ending", "job", "number", "work")

    def __init__(
        self,
        attempts: Attempts,
        attempt: Attempt,
        work: Callable[[], Any],
        deadline: float,
        number: int,
    ) -> None:
        self.attempts = attempts
        self.attempt = attempt
        self.work = work
        self.deadline = deadline
        self.number = number
        self.ending: Ending | None = None
        # the work itself returned (for a wide scope's key lock)
        self.ended = threading.Event() if attempts.bridge is not None else None
        self.job = Job(
            self._body, copy_context(), name=f"flightgroup-work-{attempt.token}",
            until=time.monotonic() + deadline,
        )

    def _body(self) -> None:
        """(On a kept thread) the attempt itself."""
        try:
            self.ending = attempt_sync(self.attempt, self.work)
        finally:
            if self.ended is not None:
                self.ended.set()
                bridge = self.attempts.bridge
                assert bridge is not None
                bridge.returned(self.attempt.flight)

    def run(self) -> Ending:
        """Hand the attempt to a kept thread (unless it was) and wait for its ending,
        at most until its deadline. Raises what starting a thread raises, and a
        KeyboardInterrupt while waiting (``job.state`` then says if its work runs)."""
        workers = self.attempts.workers
        job = self.job
        if job.state == WAITING:
            workers.start(job)
        if job.state == GAVE_UP:
            # Its deadline passed while the group's deadline threads were all busy.
            return self._timed_out(workers.bound)
        if workers.wait(job):
            ending = self.ending
            assert ending is not None
            return ending
        return self._timed_out(None)

    def _timed_out(self, bound: int | None) -> Ending:
        attempt = self.attempt
        attempt.timed_out = True
        attempt.lose()
        flight = attempt.flight
        bridge = self.attempts.bridge
        if bound is None and bridge is not None:
            # It still runs: the scope must hold its key until it ends.
            assert self.ended is not None
            bridge.straggles(flight, self.ended)
        error = FlightTimeoutError(flight.key, self.deadline, self.number, bound)
        return TIMEOUT, None, error

    def abandon(self) -> None:
        """Nobody waits for the attempt any more (its driver's caller was interrupted and
        no thread could go on): if its work runs, it is left, its lease lost."""
        if self.attempts.workers.abandon(self.job):
            self.attempt.lose()
            bridge = self.attempts.bridge
            if bridge is not None:
                assert self.ended is not None
                bridge.straggles(self.attempt.flight, self.ended)


def start_thread(name: str, run: Callable[..., object], *args: Any) -> BaseException | None:
    """Start a daemon thread that calls ``run(*args)`` in a copy of this context.

    None once started. When ``start()`` raises (no thread to be had, or a
    KeyboardInterrupt handled inside it), the new thread and this one race for a gate:
    if this one wins, ``run`` never runs and the error is returned; if the thread got
    going first, ``run`` runs and the error is raised here."""
    gate = threading.Lock()

    def body() -> None:
        if gate.acquire(blocking=False):
            run(*args)

    thread = threading.Thread(target=copy_context().run, args=(body,), name=name, daemon=True)
    try:
        thread.start()
    except BaseException as exc:
        if gate.acquire(blocking=False):
            return exc
        raise
    return None


def is_awaitable(value: object) -> bool:
    """inspect.isawaitable without its ABC check (the hot path of run_sync)."""
    kind = type(value)
    if hasattr(kind, "__await__"):
        return True
    return kind is types.GeneratorType and bool(
        value.gi_code.co_flags & inspect.CO_ITERABLE_COROUTINE  # type: ignore[attr-defined]
    )
