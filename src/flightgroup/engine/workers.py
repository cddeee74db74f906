"""The kept threads of one group, on which sync attempts under a deadline run.

A sync work cannot be stopped. Under a deadline each attempt runs on a thread other
than its driver's, so the driver can stop waiting at the deadline (ADR 0008); past it
the work runs on, *left*, until it returns. This module owns those threads (ADR 0038):

- **Kept**: a thread whose work returned waits for the group's next attempt, so a
  run_sync under a deadline costs a hand-over between two threads, not a new thread.
  An idle thread ends after ``IDLE_SECONDS``, at the group's close, and is not in a
  forked child (a fork copies only the forking thread). Every thread is a daemon: an
  idle pool never keeps a process from exiting.
- **Bounded**: a thread whose attempt ran past its deadline is *left* until its work
  returns. Any attempt running now may be left at its deadline, so the bound counts both:
  at most ``bound`` threads run sync works under a deadline at once, in time or left
  (``busy``), and so at most ``bound`` are ever left. An attempt that finds ``bound``
  busy waits for one of them to return, at most until its own deadline; if none does,
  the attempt times out without its work having run (its driver says so in its
  FlightTimeoutError). No wait outlasts a deadline, and nothing waits for a thread that
  another wait holds: no deadlock.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from _thread import LockType, allocate_lock
from collections.abc import Callable
from contextvars import Context
from typing import Final

from .._log import log

__all__ = ["IDLE_SECONDS", "MAX_DEADLINE_THREADS", "Job", "Workers"]


IDLE_SECONDS: Final = 30.0
"""How long a kept thread waits for the next attempt before it ends."""

MAX_DEADLINE_THREADS: Final = 64
"""The default bound on a group's threads that run sync works under a deadline (in time
or left past it), and so on its threads left past a deadline."""

# A job's states. Each change is made under its pool's lock.
WAITING: Final = 0  # no thread yet: it may wait for room under the bound
RUNNING: Final = 1  # its work runs, within its deadline: counted in ``Workers.busy``
LEFT: Final = 2  # its work runs on past its deadline: counted in ``busy`` and ``left``
RETURNED: Final = 3  # its work returned (in time, or late: then no longer counted)
GAVE_UP: Final = 4  # its deadline passed before it got a thread: it never ran


class Job:
    """One attempt's run on a kept thread. ``run`` is called in ``context`` on the
    thread; ``done`` is released once it returned. ``until``: the monotonic time of
    its deadline (a wait for a thread counts against it)."""

    __slots__ = ("context", "done", "name", "run", "state", "until")

    def __init__(
        self, run: Callable[[], object], context: Context, *, name: str, until: float
    ) -> None:
        self.run = run
        self.context = context
        self.name = name
        self.until = until
        self.state = WAITING
        self.done: LockType = allocate_lock()
        self.done.acquire()


class _Thread:
    """A kept thread's hand-over point: ``go`` is released when ``job`` was set."""

    __slots__ = ("go", "job", "thread")

    def __init__(self) -> None:
        self.go: LockType = allocate_lock()
        self.go.acquire()
        self.job: Job | None = None
        self.thread: threading.Thread | None = None


class Workers:
    """The kept threads of one group and its bound on the threads that run sync works
    under a deadline (so on those left past one).

    Fields are read and written under ``lock``: ``idle`` (threads waiting for a job),
    ``threads`` (threads alive: idle, or running a job), ``busy`` (jobs handed over whose
    work has not returned: at most ``bound``), ``left`` (those of them past their
    deadline), ``queued`` (jobs waiting for room under the bound), ``closed``."""

    __slots__ = (
        "__weakref__",
        "_reporting",
        "bound",
        "busy",
        "closed",
        "idle",
        "left",
        "lock",
        "on_left",
        "queued",
        "room",
        "threads",
    )

    def __init__(self, bound: int = MAX_DEADLINE_THREADS) -> None:
        _POOLS.add(self)
        self.bound = bound
        # Told (left, bound) after ``left`` changed, outside ``lock`` (a wide scope
        # publishes it for ``flightgroup status``); reports are made one at a time, each
        # with the count as it is then, so the last one told is the latest.
        self.on_left: Callable[[int, int], object] | None = None
        self._reporting = threading.Lock()
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)  # notified when a busy job returns
        self.idle: list[_Thread] = []
        self.threads = 0
        self.busy = 0
        self.left = 0
        self.queued = 0
        self.closed = False

    def counts(self) -> tuple[int, int, int]:
        """(threads alive now, threads running a job now, threads left past a deadline
        now)."""
        with self.lock:
            return self.threads, self.busy, self.left

    def start(self, job: Job) -> None:
        """Run ``job`` on a kept thread (a new one if none is idle): its state is then
        RUNNING; or GAVE_UP if its deadline passed while ``bound`` jobs were busy (it
        never runs). Raises what ``Thread.start`` raises (no thread to be had), or
        a KeyboardInterrupt that landed meanwhile: ``job.state`` then says whether it
        was handed over (RUNNING) or not (WAITING: start it again, or it never runs)."""
        with self.lock:
            while self.busy >= self.bound:
                remaining = job.until - time.monotonic()
                if remaining <= 0:
                    job.state = GAVE_UP
                    return
                self.queued += 1
                try:
                    self.room.wait(min(remaining, threading.TIMEOUT_MAX))
                finally:
                    self.queued -= 1
            self.busy += 1  # (given back if no thread can be started for it)
            if self.idle:
                kept = self.idle.pop()
                kept.job = job
                job.state = RUNNING
                kept.go.release()
                return
            self.threads += 1
        self._spawn(job)

    def _spawn(self, job: Job) -> None:
        kept = _Thread()
        gate = allocate_lock()  # taken by whichever of the new thread and this one is first

        def serve() -> None:
            if gate.acquire(blocking=False):
                self._serve(kept, job)

        thread = kept.thread = threading.Thread(target=serve, name=job.name, daemon=True)
        try:
            thread.start()
        except BaseException:
            if gate.acquire(blocking=False):  # the thread never got going: nothing ran
                with self.lock:
                    self.threads -= 1
                    self.busy -= 1
                    self.room.notify()
                raise
            # it got going: the job runs (its state says so), and this caller hears of
            # the interrupt that landed in start()
            with self.lock:
                if job.state == WAITING:
                    job.state = RUNNING
            raise
        with self.lock:
            if job.state == WAITING:
                job.state = RUNNING

    def _serve(self, kept: _Thread, job: Job) -> None:
        """A kept thread's life: run each job handed to it, then wait for the next."""
        lock = self.lock
        current = threading.current_thread()
        with lock:
            if job.state == WAITING:
                job.state = RUNNING
        while True:
            ran = False
            try:
                job.context.run(job.run)  # (its run contains every ending of its work)
                ran = True
            finally:
                with lock:
                    was_left = job.state == LEFT
                    if was_left:
                        self.left -= 1
                    self.busy -= 1
                    if self.queued:  # only a job in room.wait needs it (notify is Python)
                        self.room.notify()
                    job.state = RETURNED
                    ending = self.closed or not ran
                    if ending:
                        self.threads -= 1
                    else:
                        # (before ``done``: its driver's next attempt finds it idle)
                        self.idle.append(kept)
                job.done.release()
                if was_left:
                    self._report()
            if ending:
                return
            if not kept.go.acquire(timeout=IDLE_SECONDS):
                with lock:
                    if kept in self.idle:
                        self.idle.remove(kept)
                        self.threads -= 1
                        return
                kept.go.acquire()  # taken from ``idle`` meanwhile: its job is coming
            next_job = kept.job
            kept.job = None
            if next_job is None:  # the pool closed
                return
            job = next_job
            current.name = job.name

    def wait(self, job: Job) -> bool:
        """Wait for ``job``'s work to return, at most until its deadline: True if it did.
        False: it runs on, counted left until it returns."""
        # RETURNED is set before ``done`` is released: a wait cut short after it took
        # ``done`` finds it here, and ``done`` taken means RETURNED.
        if job.state == RETURNED:
            return True
        remaining = job.until - time.monotonic()
        if remaining > 0 and job.done.acquire(timeout=min(remaining, threading.TIMEOUT_MAX)):
            return True
        with self.lock:
            if job.state == RETURNED:  # (also one that returned as the deadline passed)
                return True
            if job.state != RUNNING:  # (a wait cut short after this counted it already)
                return False
            job.state = LEFT
            self.left += 1
        self._report()
        return False

    def abandon(self, job: Job) -> bool:
        """Nobody will wait for ``job``: True if its work runs (now counted left); a job
        not handed over yet never runs."""
        with self.lock:
            if job.state != RUNNING:
                if job.state == WAITING:
                    job.state = GAVE_UP
                return False
            job.state = LEFT
            self.left += 1
        self._report()
        return True

    def _report(self) -> None:
        """Tell ``on_left`` the count of left threads as it is now."""
        on_left = self.on_left
        if on_left is None:
            return
        with self._reporting:
            with self.lock:
                left = self.left
            try:
                on_left(left, self.bound)
            except Exception:  # a report that fails must not stop an attempt or a thread
                log.warning(
                    "could not publish the count of threads left past a deadline", exc_info=True
                )

    def close(self) -> None:
        """End the idle threads; a thread running a job ends once its work returns."""
        with self.lock:
            self.closed = True
            idle, self.idle = self.idle, []
            self.threads -= len(idle)
            self.room.notify_all()
        for kept in idle:
            kept.job = None
            kept.go.release()

    def _forked(self) -> None:
        """(In a forked child, the only thread) the threads were not copied, and the
        works they ran run in the parent only."""
        self.lock = threading.Lock()
        self._reporting = threading.Lock()
        self.room = threading.Condition(self.lock)
        self.idle = []
        self.threads = 0
        self.busy = 0
        self.left = 0
        self.queued = 0


# Every pool of this process, for a forked child.
_POOLS: weakref.WeakSet[Workers] = weakref.WeakSet()


def _after_fork() -> None:
    for pool in list(_POOLS):
        pool._forked()


os.register_at_fork(after_in_child=_after_fork)
