"""The lease: what a flight's work holds while it runs.

``current_lease()`` returns the :class:`Lease` of the attempt whose work is
running in this task or thread. It carries the attempt's fencing token (storage
written by the work can refuse a write from an older token) and the lost
signal: once ``lost`` is True the work's outcome will not be landed, so it
should stop writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from ._forksafe import renew_after_fork
from .errors import LeaseLostError

if TYPE_CHECKING:
    from .engine.flight import Attempt

__all__ = ["Lease", "current_lease"]

# Guards every lease's list of lost-waiters. Loss is rare and registration is
# rare, so one lock for the module costs nothing and keeps Lease small.
_LOSS_LOCK = threading.Lock()
renew_after_fork(sys.modules[__name__], "_LOSS_LOCK")

# The attempt whose work runs here (set in the work's own task or thread). Its
# lease is made only when the work asks for it: most works never do.
_CURRENT: ContextVar[Attempt | None] = ContextVar("flightgroup_attempt", default=None)


class Lease:
    """The lease of one attempt of a flight. No public constructor.

    ``key`` is the flight's key, ``token`` its fencing token (an int that grows
    within a group). ``lost`` turns True at most once and never back.
    """

    __slots__ = ("_lost", "_waiters", "key", "token")

    key: str
    token: int
    _lost: bool
    # (loop, future) pairs of ``wait_lost`` callers; None once lost.
    _waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("Lease has no public constructor; use current_lease() inside a work")

    @classmethod
    def _new(cls, key: str, token: int, lost: bool) -> Lease:
        lease = object.__new__(cls)
        lease.key = key
        lease.token = token
        lease._lost = lost
        lease._waiters = None if lost else []
        return lease

    @property
    def lost(self) -> bool:
        """True once the lease is lost: the work's outcome will not be landed."""
        return self._lost

    def raise_if_lost(self) -> None:
        """Raise :class:`LeaseLostError` if the lease is lost; else do nothing."""
        if self._lost:
            raise LeaseLostError(self.key)

    async def wait_lost(self) -> None:
        """Return once the lease is lost (at once if it already is)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with _LOSS_LOCK:
            if self._waiters is None:
                return
            self._waiters.append((loop, fut))
        try:
            await fut
        finally:
            with _LOSS_LOCK:
                if self._waiters is not None and (loop, fut) in self._waiters:
                    self._waiters.remove((loop, fut))

    def _lose(self) -> None:
        """Mark the lease lost (idempotent) and wake every ``wait_lost`` caller."""
        with _LOSS_LOCK:
            if self._waiters is None:
                return
            waiters, self._waiters = self._waiters, None
            self._lost = True
        for loop, fut in waiters:
            # A loop that closed meanwhile raises RuntimeError: nobody waits there.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, fut)

    def _lose_in_child(self) -> None:
        """(In a forked child) mark the lease lost. Its waiters are the parent's tasks,
        on copies of the parent's loops: waking one would write to the parent's
        wake-up socket, which the child shares."""
        self._waiters = None
        self._lost = True

    def __repr__(self) -> str:
        return f"<Lease key={self.key!r} token={self.token} lost={self._lost}>"


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def current_lease() -> Lease:
    """Return the lease of the flight whose work is running here.

    Raises:
        LookupError: when called outside a flight's work.
    """
    attempt = _CURRENT.get()
    if attempt is None:
        raise LookupError("current_lease() is only available inside a flight's work")
    return attempt.get_lease()
