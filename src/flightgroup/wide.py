"""What the wide scopes (directory, fleet) share with the engine: the events a
call hears from its arbiter, the inbox that carries them to the call's driver
(on its own loop or thread), and the outcome as a landing carries it.

Kept apart from both arbiters so the engine imports neither to speak to them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from _thread import LockType, allocate_lock
from collections.abc import Callable, Hashable
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from ._forksafe import renew_after_fork
from .directory import wire
from .directory.wire import Failure
from .errors import (
    FlightFailedError,
    FlightInterruptedError,
    FlightTimeoutError,
    GroupClosedError,
)
from .flight import Outcome

if TYPE_CHECKING:
    from .flight import Attempt
    from .policy import FlightPolicy

__all__ = [
    "CAUSE_SLACK", "Arbiter", "DetachedNotice", "Event", "Failure", "Inbox", "KeptCauses",
    "LeadState", "closed_in_fork", "forked_reason", "from_wire", "key_as_called", "post",
    "start_loop", "to_wire",
]


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


class Arbiter(Protocol):
    """What the engine asks of a wide scope's arbiter (a call is the arbiter's own
    object: it has an ``inbox`` and, while it leads, a ``lead`` with ``lost``)."""

    # Called in a forked child of a started group, with the reason (forked_reason): the
    # group drops its flights there and counts as closed.
    on_fork: Callable[[str], None] | None

    # fresh: only a flight that begins after the call; after: the token of the flight
    # whose end the fresh callers waited for here (a later one of the scope is theirs);
    # on_detached: called from any thread once a forget() elsewhere took the scope's
    # flight of this call away from its key (the local flight must leave the table too)
    def submit(
        self,
        key: str,
        fresh: bool,
        after: int | None = None,
        on_detached: Callable[[], object] | None = None,
    ) -> Any: ...
    def bind(self, call: Any, attempt: Attempt) -> None: ...
    def retry(self, call: Any) -> None: ...
    def withdraw(self, call: Any) -> None: ...
    def forget(self, key: str) -> None: ...
    # Raises ValueError for a key this scope cannot carry (before anything changes).
    def check_key(self, key: str) -> None: ...
    def status(self) -> list[dict[str, Any]]: ...
    def close(self) -> None: ...


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


def key_as_called(sent: str) -> str:
    """The key as its caller gave it, from the key a wide scope sent (group.py's
    ``_wire_key``): a plain key that starts with a NUL was sent with one more. A
    decorated function's key stays as sent: NUL, its namespace, NUL, the key."""
    return sent[1:] if sent.startswith("\x00\x00") else sent


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


class DetachedNotice:
    """What an arbiter's call holds for ADR 0026: the engine's callback for a forget()
    elsewhere that took the scope's flight of the call away from its key."""

    __slots__ = ("on_detached",)

    def __init__(self, on_detached: Callable[[], object] | None) -> None:
        self.on_detached = on_detached

    def detached(self) -> None:
        """The scope said the flight was detached: tell the engine, once."""
        detach, self.on_detached = self.on_detached, None
        if detach is not None:
            detach()


class LeadState:
    """What a lead in a wide scope shares with the work it runs: the running attempt,
    whether the lease is lost, whether the work has ended. ``lock`` guards them: a
    work ends on its own thread while the arbiter's loop may lose the lease."""

    __slots__ = ("attempt", "lock", "lost", "work_done")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.attempt: Attempt | None = None
        self.lost = False
        self.work_done = False

    def lose(self, only_running: bool = False) -> bool:
        """The lease is lost: the running attempt's work is told. With
        ``only_running``, only if the work has not ended. Returns whether it was
        lost now."""
        with self.lock:
            if self.lost or (only_running and self.work_done):
                return False
            self.lost = True
            attempt = self.attempt
        if attempt is not None:
            attempt.revoked = True
            attempt.lose()
        return True

    def bind(self, attempt: Attempt) -> None:
        """``attempt``'s work runs under this lead from now on (it hears a loss,
        also one that came before)."""
        with self.lock:
            self.attempt = attempt
            lost = self.lost
        if lost:
            attempt.revoked = True
            attempt.lose()


class Event(Enum):
    """What a call hears from its arbiter (its args in the comments)."""

    LEAD = "lead"  # (token): lead (directory: the key lock is held)
    JOINED = "joined"  # (token, pid, age[, host]): joined a flight led elsewhere
    LANDED = "landed"  # (token, outcome, kept): the flight's outcome
    INTERRUPTED = "interrupted"  # (reason): the flight ended without an outcome
    LOST = "lost"  # (reason): the lead's lease is lost
    FAILED = "failed"  # (exception): the call cannot go on (version, closed, ...)


class Inbox:
    """A queue of events from the background thread to one driver, which waits on
    it from an event loop (``get``) or a thread (``get_sync``)."""

    __slots__ = ("_items", "_lock", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[tuple[Event, tuple[Any, ...]]] = collections.deque()
        self._lock = threading.Lock()
        self._waiter: asyncio.Future[None] | LockType | None = None

    def put(self, event: Event, *args: Any) -> None:
        with self._lock:
            self._items.append((event, args))
            waiter, self._waiter = self._waiter, None
        if waiter is None:
            return
        if type(waiter) is LockType:
            waiter.release()
        else:
            fut: asyncio.Future[None] = waiter  # type: ignore[assignment, unused-ignore]
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                fut.get_loop().call_soon_threadsafe(_resolve, fut)

    async def get(self) -> tuple[Event, tuple[Any, ...]]:
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
                fut = loop.create_future()
                self._waiter = fut
            try:
                await fut
            finally:
                with self._lock:
                    if self._waiter is fut:
                        self._waiter = None

    def get_sync(self) -> tuple[Event, tuple[Any, ...]]:
        item = self.wait_sync()
        self.take(item)
        return item

    def wait_sync(self) -> tuple[Event, tuple[Any, ...]]:
        """The first event, left in the inbox until ``take``: a reader interrupted (a
        signal) before it took it loses nothing, whoever reads next gets it."""
        while True:
            with self._lock:
                if self._items:
                    return self._items[0]
                lock = allocate_lock()
                lock.acquire()
                self._waiter = lock
            try:
                lock.acquire()
            finally:
                with self._lock:
                    if self._waiter is lock:
                        self._waiter = None

    def take(self, item: tuple[Event, tuple[Any, ...]]) -> None:
        """Remove ``item`` (from ``wait_sync``) if it is still first (each event is a
        tuple of its own: taking it twice takes nothing more)."""
        with self._lock:
            if self._items and self._items[0] is item:
                self._items.popleft()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


# Seconds a landed failure's error is remembered past its keep time (none when it is
# not kept): the scope keeps, or hands to joiners, an outcome from when it reads the
# landing, which a busy or stopped coordinator or Redis may do that much later.
CAUSE_SLACK = 30.0


class KeptCauses:
    """The errors of failures a group landed, by (key, token), while a group of this
    process may get them back from the scope: kept (Retention), or joined from another
    group of the same scope. Such a caller raises FlightFailedError with the very error
    as ``__cause__`` (API.md: "in the same process ``__cause__`` is E"; ADR 0023).

    Bounded: at most ``limit`` errors (the oldest go first), each for its own time."""

    __slots__ = ("__weakref__", "_errors", "_limit", "_lock")

    def __init__(self, limit: int = 1024) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        renew_after_fork(self)
        self._errors: collections.OrderedDict[tuple[Hashable, int], tuple[float, BaseException]]
        self._errors = collections.OrderedDict()

    def remember(self, key: Hashable, token: int, error: BaseException, seconds: float) -> None:
        now = time.monotonic()
        with self._lock:
            errors = self._errors
            errors[key, token] = (now + seconds, error)
            errors.move_to_end((key, token))
            self._sweep(now)
            while len(errors) > self._limit:  # the oldest remembered first
                errors.popitem(last=False)

    def cause(self, key: Hashable, token: int) -> BaseException | None:
        now = time.monotonic()
        with self._lock:
            held = self._errors.get((key, token))
            if held is not None and held[0] <= now:
                self._sweep(now)
                return None
        return None if held is None else held[1]

    def _sweep(self, now: float) -> None:
        """(Under the lock) drop every expired error: times differ (a kept failure's
        keep time), so one kept long must not hold the short ones behind it."""
        errors = self._errors
        for gone in [entry for entry, (until, _) in errors.items() if until <= now]:
            del errors[gone]


def to_wire(
    key: str, outcome: Outcome, data: bytes | None, error: BaseException | None,
    policy: FlightPolicy, limit: int | None,
) -> wire.Outcome:
    """The outcome a leader lands, as the wire carries it (with its Retention time).
    ``limit`` is the group's ``max_value_bytes``: a failure's message crosses whole
    (API.md: ``.message`` is its ``str()``) unless its UTF-8 could pass that bound."""
    retention = policy.retention
    if outcome is Outcome.VALUE:
        keep = retention.success if retention is not None else None
        if retention is None or not keep:
            return wire.Value(data if data is not None else b"")
        return wire.Value(
            data if data is not None else b"", keep, retention.max_items, retention.max_bytes
        )
    assert error is not None
    if outcome is Outcome.ERROR:
        kind, module, message, _ = FlightFailedError.describe(key, error)
        # A quarter of the bound in characters surely fits (4 UTF-8 bytes each at most).
        if (
            limit is not None and len(message) > limit // 4
            and len(message.encode("utf-8", "surrogatepass")) > limit
        ):
            message = f"{message[: limit // 4]}... (cut)"
        keep = retention.error if retention is not None else None
        if retention is None or not keep:
            return wire.Failure(kind, module, message)
        return wire.Failure(kind, module, message, keep, retention.max_items, retention.max_bytes)
    if outcome is Outcome.TIMEOUT and isinstance(error, FlightTimeoutError):
        return wire.Timeout(error.deadline)
    return wire.Interrupted(f"its work was stopped by {type(error).__qualname__}")


def from_wire(
    key: str, outcome: wire.Outcome
) -> tuple[Outcome, BaseException | None, bytes | None]:
    """A landed outcome as a joiner's flight settles with it: (outcome, the error
    every caller raises a copy of, the encoded value)."""
    if isinstance(outcome, wire.Value):
        return Outcome.VALUE, None, outcome.data
    if isinstance(outcome, wire.Failure):
        return Outcome.ERROR, FlightFailedError(
            key, outcome.type, outcome.message, outcome.module
        ), None
    if isinstance(outcome, wire.Timeout):
        return Outcome.TIMEOUT, FlightTimeoutError(key, outcome.deadline), None
    return Outcome.INTERRUPTED, FlightInterruptedError(key, outcome.reason), None
