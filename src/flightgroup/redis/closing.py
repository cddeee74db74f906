"""How a fleet group stops: its close(), and a forked child's let-go of the group it
copied from its parent.

close() interrupts the flights led here whose work has not ended (their joiners
elsewhere hear it at once), ends the calls still waiting, waits for the landings already
made and for every step those spawn, then disconnects and stops the group's thread. In
a forked child no thread of the parent was copied: the group refuses calls at once, and
its copies of the parent's loop and connections are kept from acting (ADR 0018).

Like the other steps beside :mod:`.arbiter`, these take the arbiter.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..errors import GroupClosedError
from ..scope.events import Refused
from .breaker import Breaker
from .clients import COMMAND_TIMEOUT
from .renewal import Renewal

if TYPE_CHECKING:
    from ..scope.loop import BackgroundLoop
    from .arbiter import RedisArbiter
    from .calls import FleetCall

__all__ = ["close", "close_steps", "forked"]


def close(arbiter: RedisArbiter) -> None:
    """RedisArbiter.close(): the first call closes; a later one returns when the first
    did (the landings are handed over)."""
    bound = min(threading.TIMEOUT_MAX, 2 * COMMAND_TIMEOUT + arbiter._lease)
    with arbiter._background.lock:
        again = arbiter._closing
        arbiter._closing = True
    if again:
        if not arbiter._background.on_its_thread():
            arbiter._close_returned.wait(min(threading.TIMEOUT_MAX, bound + 10))
        return
    try:
        _close_now(arbiter, bound)
    finally:
        arbiter._close_returned.set()


def _close_now(arbiter: RedisArbiter, bound: float) -> None:
    loop = arbiter._background.loop
    if loop is None:
        return
    future: Future[None] = asyncio.run_coroutine_threadsafe(arbiter._close(), loop)
    with contextlib.suppress(Exception):
        # (bound is at most threading.TIMEOUT_MAX: past it, result() raises at once.)
        future.result(bound)
    arbiter._background.stop()


async def close_steps(arbiter: RedisArbiter) -> None:
    """(On the group's loop, ``RedisArbiter._close``) end the calls, interrupt the leads
    whose work runs, wait for every step in flight, then disconnect."""
    # Steps already sent (an ACQUIRE, a retry's ATTEMPT) may still win a lead; each
    # gives it back itself once it hears (the call is withdrawn, the group closing).
    # Wait for them and for what they spawn before the loop stops: a lead won and
    # never given back would hold its joiners elsewhere for a lease.
    background = arbiter._background
    # (A call read on its own loop leaves _calls from there: iterate over a copy.)
    calls = list(arbiter._calls)
    pending = {call.task for call in calls if call.task is not None}
    for call in calls:
        if call.lead is None:
            arbiter._calls.discard(call)
            if call.reading and call.task is not None:
                call.task.cancel()
            call.withdrawn = True  # (before reader is read: see delivery.read_here)
            reader = call.reader
            if reader is not None:  # its read on its own loop ends refused, as closed
                with contextlib.suppress(RuntimeError):  # that loop closed meanwhile
                    reader.get_loop().call_soon_threadsafe(_stop_read, call, reader)
            call.inbox.put(Refused(GroupClosedError()))
    arbiter._readers.close()
    for lead in list(arbiter._leads):
        if lead.landing is None and lead.lose(only_running=True):
            background.spawn(arbiter._abandon(lead, "its leader's group closed"))
    pending |= background.tasks
    while pending := {task for task in pending if not task.done()}:
        await asyncio.wait(pending)
        pending = set(background.tasks)
    arbiter._renewal.cancel()
    arbiter._breaker.stop()
    await arbiter._left.drop()
    for client in (arbiter._client, arbiter._blocking):
        with contextlib.suppress(Exception):
            await client.aclose()


def _stop_read(call: FleetCall, reader: asyncio.Task[Any]) -> None:
    """(On the reader's loop) cancel ``call``'s read if it still reads: a read that
    ended meanwhile let its task go on to other steps (a flight led here alone), which
    close() must not cancel."""
    if call.reader is reader:
        reader.cancel()


def forked(arbiter: RedisArbiter, why: str, inherited: BackgroundLoop) -> None:
    """(In a forked child of a started group) the group raises at once here, its copies
    of the parent's loop and connections are kept from acting (see ``_let_go``), and its
    group drops the flights copied from the parent's table (``on_fork``)."""
    _inherited.append(dict(vars(arbiter), _background=inherited))
    loop = inherited.loop or inherited.booting
    if loop is not None:
        _let_go(loop)
    arbiter._closing = True  # close() has nothing to wait for
    arbiter._close_returned = threading.Event()  # (a copy's lock may be held)
    arbiter._close_returned.set()
    arbiter._closed_why = why
    arbiter._ready = None
    arbiter._renewal = Renewal(arbiter)
    arbiter._breaker = Breaker(arbiter)
    arbiter._client = arbiter._blocking = None
    arbiter._readers.let_go()
    arbiter._scripts = {}
    arbiter._calls, arbiter._leads = set(), set()
    arbiter._undoing, arbiter._undo_nonces = {}, {}
    if arbiter.on_fork is not None:
        arbiter.on_fork(why)


# What forked children keep of their parents' started groups, for good: collected there,
# a copied redis-py connection would close itself through the copied loop, whose epoll
# instance is the parent's own (an unregister from here unwatches the parent's socket).
_inherited: list[dict[str, Any]] = []


def _let_go(loop: asyncio.AbstractEventLoop) -> None:
    """(In a forked child) point the child's copies of the descriptors ``loop`` watches
    (the parent's Redis connections, its wake-up socket) and of its epoll instance at
    /dev/null: the parent's connections then close when the parent closes them, not
    when this child exits, and nothing done here can reach the parent's through them.
    dup2, not close: the numbers stay taken, so no later file of the child gets one."""
    selector = getattr(loop, "_selector", None)  # asyncio's selector loop (private)
    if selector is None:
        return
    try:
        fds = [key.fd for key in selector.get_map().values()]
        fds.append(selector.fileno())
    except (AttributeError, RuntimeError, OSError):
        return
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.dup2(null, fd)
    finally:
        os.close(null)
