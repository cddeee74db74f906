"""What a call hears from its scope, and the inbox that carries it.

A scope answers each submitted call with typed events, put from the scope's own thread
into the call's :class:`Inbox`; the engine's driver of the flight reads them on its own
event loop (``get``) or thread (``wait_sync`` then ``take``). Every event is a new frozen
object, so an event read twice is still one event (``take`` compares identity).

The order a call hears: any number of :class:`Joined` (its flight joined one led
elsewhere; a failover may tell it again), then exactly one of :class:`Lead`,
:class:`Landed`, :class:`NoOutcome`, :class:`Refused` or :class:`Follow` (a call
submitted from an event loop: its driver reads the outcome there, and ``read`` gives
one of the three that end a call). A lead then hears :class:`Lead` again for each
retry's token (``Scope.retry``), or :class:`LeaseLost`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from _thread import LockType, allocate_lock
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeAlias

from .outcome import SharedOutcome

__all__ = [
    "Follow",
    "Inbox",
    "Joined",
    "Landed",
    "Lead",
    "LeaseLost",
    "NoOutcome",
    "Refused",
    "ScopeEvent",
]


@dataclass(frozen=True, slots=True, eq=False)
class Lead:
    """This process leads the flight (or its retry) under ``token``; in the directory
    scope the key lock is held."""

    token: int


@dataclass(frozen=True, slots=True, eq=False)
class Joined:
    """The call joined flight ``token``, led by process ``pid`` (on ``host``, where the
    scope spans hosts) for ``age`` seconds."""

    token: int
    pid: int = 0
    age: float = 0.0
    host: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class Landed:
    """Flight ``token`` ended with ``outcome``; ``kept``: served from a kept outcome."""

    token: int
    outcome: SharedOutcome
    kept: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class NoOutcome:
    """The flight the call waited for ended without an outcome (its leader died,
    withdrew or lost its lease), and why."""

    reason: str


@dataclass(frozen=True, slots=True, eq=False)
class LeaseLost:
    """The lead's lease is lost: its outcome will not be taken, and why."""

    reason: str


@dataclass(frozen=True, slots=True, eq=False)
class Refused:
    """The scope cannot serve the call (unreachable, another protocol version, the
    group closed, a key it cannot carry): ``error`` is what its callers raise."""

    error: BaseException


@dataclass(frozen=True, slots=True, eq=False)
class Follow:
    """The call joined a flight whose outcome its driver reads on its own loop (the one
    it submitted from): ``await read(joined)`` gives the event that ends the call
    (Landed, NoOutcome or Refused), and tells ``joined`` each retry's new token on the
    way. The read's cancellation withdraws nothing: the driver withdraws as it would."""

    read: Callable[[Callable[[int], None]], Awaitable[Landed | NoOutcome | Refused]]


ScopeEvent: TypeAlias = Lead | Joined | Landed | NoOutcome | LeaseLost | Refused | Follow
"""Every event a call can hear."""


class Inbox:
    """A queue of events from the scope's thread to one driver, which waits on it from
    an event loop (``get``) or a thread (``get_sync``, or ``wait_sync`` then ``take``)."""

    __slots__ = ("_items", "_lock", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[ScopeEvent] = collections.deque()
        self._lock = threading.Lock()
        self._waiter: asyncio.Future[None] | LockType | None = None

    def put(self, event: ScopeEvent) -> None:
        """Queue ``event`` and wake the driver (from any thread)."""
        with self._lock:
            self._items.append(event)
            waiter, self._waiter = self._waiter, None
        if waiter is None:
            return
        if type(waiter) is LockType:
            waiter.release()
        else:
            fut: asyncio.Future[None] = waiter  # type: ignore[assignment, unused-ignore]
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                fut.get_loop().call_soon_threadsafe(_resolve, fut)

    async def get(self) -> ScopeEvent:
        """The first event, taken (waits on the running loop)."""
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

    def get_sync(self) -> ScopeEvent:
        """The first event, taken (blocks this thread)."""
        event = self.wait_sync()
        self.take(event)
        return event

    def wait_sync(self) -> ScopeEvent:
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

    def take(self, event: ScopeEvent) -> None:
        """Remove ``event`` (from ``wait_sync``) if it is still first: taking it twice
        takes nothing more."""
        with self._lock:
            if self._items and self._items[0] is event:
                self._items.popleft()

    def pending(self) -> list[ScopeEvent]:
        """The events queued and not yet taken, oldest first (a snapshot)."""
        with self._lock:
            return list(self._items)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
