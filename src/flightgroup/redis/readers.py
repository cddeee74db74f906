"""The clients that read joined flights' outcomes on callers' event loops (ADR 0056).

redis-py's asyncio connections belong to the loop that opened them, so a fleet group
keeps one blocking client per caller loop that read a joined flight's outcome there:
made by the first such read, kept while the loop lives. A loop's first join reads on
the group's thread instead (``reads_on``), and only a loop that joins again gets a
client: a loop per call (``asyncio.run`` per request) would otherwise open and close a
connection for every join (ADR 0058).

asyncio says nothing when a loop ends, so each client comes with a sentinel async
generator started on its loop: ``loop.shutdown_asyncgens()`` (which ``asyncio.run`` and
``asyncio.Runner`` call as they end) closes it, and its ``finally`` closes the client and
drops it. A loop closed without that loses its client when the next one is made, or at
the group's close; a loop stopped and never closed keeps it until the group's close.

A group's close closes the clients of the loops still running (on their loops, without
waiting); a forked child keeps its copies of the parent's, unused and never closed: a
connection closed from the child would unwatch the parent's socket in an epoll
instance the two share (ADR 0018).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncGenerator, Callable
from typing import Any

__all__ = ["LoopClients"]


class _Kept:
    """One loop's client and the sentinel that closes it when the loop ends."""

    __slots__ = ("client", "closed", "inherited", "sentinel")

    def __init__(self, client: Any) -> None:
        self.client = client
        # Held here: a loop holds its async generators only weakly (a collected one
        # would close the client in a task of its own, or never if the loop closed).
        self.sentinel: AsyncGenerator[None, None] | None = None
        self.closed = False  # (on its loop) its client's close is done
        self.inherited = False  # a forked child's copy: not this process's to close


class LoopClients:
    """A client per caller loop (see the module); ``make`` makes one (on its loop)."""

    __slots__ = ("_closed", "_kept", "_lock", "_make", "_seen")

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        # Changed under the lock from any caller's thread and the group's; read without
        # it (a dict's get is atomic) on the path of every read.
        self._kept: dict[asyncio.AbstractEventLoop, _Kept] = {}
        # The loops whose first join was answered (held weakly: a loop per call is
        # never held by the group); under the lock.
        self._seen: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False

    def reads_on(self, loop: asyncio.AbstractEventLoop) -> bool:
        """(As a join is answered) whether the joiner of ``loop`` reads there: the loop
        has a client, or joined before (this read makes its client). False for its
        first join, which reads on the group's thread."""
        if loop in self._kept:
            return True
        with self._lock:
            try:
                if loop in self._seen:
                    return True
                self._seen.add(loop)
            except TypeError:  # a loop that takes no weak reference: at once, as before
                return True
        return False

    async def client(self, loop: asyncio.AbstractEventLoop) -> Any | None:
        """(On ``loop``) its client, made now if it has none; None once the group closed."""
        kept = self._kept.get(loop)
        if kept is not None:
            return kept.client
        with self._lock:
            if self._closed:
                return None
            for ended in [other for other in self._kept if other.is_closed()]:
                del self._kept[ended]  # ended without closing its generators
            kept = self._kept[loop] = _Kept(self._make())
        sentinel = kept.sentinel = self._until_loop_ends(loop, kept)
        # Its first step registers it with the loop (asyncio's async generator hooks)
        # and stops at its yield: from then on the loop's shutdown closes it.
        await sentinel.__anext__()
        return kept.client

    async def _until_loop_ends(
        self, loop: asyncio.AbstractEventLoop, kept: _Kept
    ) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with self._lock:
                if self._kept.get(loop) is kept:
                    del self._kept[loop]
            # Here too when close() asked for it: a loop that ended before running that
            # request cancelled it. _close_client closes a client once either way.
            await _close_client(kept)

    def close(self) -> None:
        """(Any thread; the group closes) no client is made from now on; each loop
        still running closes its own when it next runs (not waited for), or as it
        ends. The reads on them were cancelled first (closing.close_steps). Only the
        loop's shutdown closes a sentinel: closing it from here could find it running."""
        with self._lock:
            self._closed = True
            kept, self._kept = self._kept, {}
        for loop, one in kept.items():
            closing = _close_client(one)
            try:
                asyncio.run_coroutine_threadsafe(closing, loop)
            except RuntimeError:  # the loop closed meanwhile: its client goes unused
                closing.close()

    def let_go(self) -> None:
        """(In a forked child) drop the parent's clients without closing them, even if
        the child ends a copied loop. The lock is not taken: a thread of the parent may
        have held it at the fork."""
        self._lock = threading.Lock()
        self._seen = weakref.WeakSet()
        kept, self._kept = self._kept, {}
        for one in kept.values():
            one.inherited = True
        _inherited.append(kept)


async def _close_client(kept: _Kept) -> None:
    """(On the client's loop) close it, once."""
    if kept.closed or kept.inherited:
        return
    with contextlib.suppress(Exception):  # (closing: nothing to do about it)
        await kept.client.aclose()
    kept.closed = True


# Forked children's copies of their parents' clients, kept for good (see the module).
_inherited: list[dict[asyncio.AbstractEventLoop, _Kept]] = []
