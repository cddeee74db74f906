"""The background thread a wide group's scope runs on (DESIGN.md rule 4): one event loop
per group, in a daemon thread, so what a process owes to others (landings, renewals,
reasserts, a coordinator) never waits for a caller's loop. Also what a forked child of
a started group is told: the thread was not copied, so the group is closed there.

:class:`BackgroundLoop` is that thread's lifecycle, written once for every wide scope:
started lazily by the first call that needs it, under a lock, at most once; callables
and coroutines posted to it from any thread; stopped and joined at close; dropped in a
forked child, whose scope is then told why. An arbiter *owns* one (composition), and
keeps its scope's own steps (what refuses a start, what runs first on the new loop,
what a forked child lets go of) in its own code, calling the loop's methods where they
belong. A base class would have put the loop's five fields among the arbiter's thirty
and hidden the order of those steps in template hooks of another file; owned, the loop
is one field, and each arbiter's start, close and fork read top to bottom.
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from ..engine.eager import start_eagerly
from ..errors import GroupClosedError

# Imported, so its at-fork handler is registered, before this module's own: in a forked
# child, _after_fork tells each started arbiter, whose on_fork gives its group a new
# WideTable, which takes the register's lock; scope.kin must have renewed that lock
# (a thread of the parent may have held it at the fork) before then.
from . import kin as _kin_register_first  # noqa: F401

__all__ = ["BackgroundLoop", "closed_in_fork", "forked_reason", "post", "start_loop"]


def forked_reason(scope: str, parent: int) -> str:
    """Why a wide group copied into a forked child is closed there."""
    return (
        f"This {scope} group was started in process {parent}, and its thread was not "
        "copied into this forked child: make a group of its own here."
    )


def closed_in_fork(why: str) -> GroupClosedError:
    """docs/api.md's GroupClosedError, the reason as a note (``str()`` stays the contract's)."""
    error = GroupClosedError()
    error.add_note(why)
    return error


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


class BackgroundLoop:
    """One wide group's background thread and its event loop (see the module).

    Fields: ``loop``, ``thread`` and ``booting`` are written under ``lock`` when the
    loop starts, and set to None again only in a forked child; ``tasks`` is touched on
    the loop only. An owner also takes ``lock`` to order what it posts with its close.
    """

    def __init__(self, scope: str, forked: Callable[[str, BackgroundLoop], None]) -> None:
        """``scope`` names it ("directory", "fleet"); ``forked(why, inherited)`` is called
        in a forked child of a started loop, after this loop was dropped there:
        ``inherited`` is a copy of it as the fork found it (the parent's loop, thread
        and tasks), which the scope lets go of or keeps, and ``why`` is what its calls
        raise (``forked_reason``). ``forked`` (a method of the owner) is held weakly: the
        loop does not keep its owner alive."""
        self.scope = scope
        self.name = f"flightgroup-{scope}"
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None  # once it runs
        self.thread: threading.Thread | None = None
        # The loop as soon as its thread runs, before setup makes anything: a fork while
        # another thread starts the group must let go of it too.
        self.booting: asyncio.AbstractEventLoop | None = None
        self.tasks: set[asyncio.Task[None]] = set()  # spawned, not done (see spawn)
        self._forked = weakref.WeakMethod(forked)
        _loops.add(self)

    @property
    def started(self) -> bool:
        """True once the loop's thread was started (and not since dropped by a fork)."""
        return self.thread is not None

    def on_its_thread(self) -> bool:
        """True when called on the loop's own thread."""
        return self.thread is threading.current_thread()

    def ensure_started(
        self,
        setup: Callable[[asyncio.AbstractEventLoop], None],
        *,
        check: Callable[[], None],
        prepare: Callable[[], None] | None = None,
        started: Callable[[], None] | None = None,
    ) -> asyncio.AbstractEventLoop:
        """The loop, started by this call if none runs yet; the first call starts it,
        once, and every other waits for it.

        Under ``lock``, until the loop runs: ``check()`` raises if the scope may not
        start (closed, a fatal error); then, if no other call started it meanwhile,
        ``prepare()``, the thread (``setup(loop)`` runs first on it, as in
        :func:`start_loop`), and ``started()``. A running loop is returned at once."""
        loop = self.loop
        if loop is not None:
            return loop
        with self.lock:
            check()
            if self.loop is not None:
                return self.loop
            if prepare is not None:
                prepare()

            def boot(loop: asyncio.AbstractEventLoop) -> None:
                self.booting = loop
                setup(loop)

            loop, self.thread = start_loop(self.name, boot)
            self.loop = loop
            if started is not None:
                started()
            return loop

    def post(self, fn: Callable[..., object], *args: Any) -> bool:
        """Run ``fn(*args)`` on the loop (from any thread); False if it is not running
        (never started, or closed)."""
        return post(self.loop, fn, *args)

    def spawn(self, coro: Coroutine[Any, Any, None], *, now: bool = False) -> asyncio.Task[None]:
        """(On the loop) run ``coro`` as a task, held in ``tasks`` until done: the loop
        keeps only a weak reference to its tasks. ``now``: its first step runs at once
        (a request goes out in this turn, not the next), before the task is in ``tasks``
        or returned: the caller must not need either until that step suspends."""
        assert self.loop is not None
        task = start_eagerly(coro, self.loop) if now else self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def post_task(self, coro: Coroutine[Any, Any, None]) -> bool:
        """Run ``coro`` on the loop as a task (from any thread), its first step in the
        turn it comes (``spawn(now=True)``); False (``coro`` closed, never run) if the
        loop is not running."""
        if self.post(self._spawn_now, coro):
            return True
        coro.close()
        return False

    def _spawn_now(self, coro: Coroutine[Any, Any, None]) -> None:
        self.spawn(coro, now=True)

    def stop(self) -> None:
        """Stop the loop (its tasks are cancelled and awaited, then it closes) and wait
        for its thread, at most 5 s, unless called on that thread."""
        loop = self.loop
        if loop is None:
            return
        self.post(loop.stop)
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def _after_fork(self, parent: int) -> None:
        """(In a forked child) drop the parent's loop and thread, and tell the owner."""
        # Held at the fork: a thread was starting (or closing) the group; it is the
        # parent's. Held, the copy stays held here for ever: a new one either way.
        started = self.loop is not None or self.lock.locked()
        self.lock = threading.Lock()
        if not started:
            return  # made, never started (made at import, first used here): works as new
        inherited = copy.copy(self)
        self.loop = self.booting = self.thread = None
        self.tasks = set()
        forked = self._forked()
        if forked is not None:
            forked(forked_reason(self.scope, parent), inherited)


_loops: weakref.WeakSet[BackgroundLoop] = weakref.WeakSet()  # every one made here


def _after_fork() -> None:
    """(In a forked child) no thread of the parent was copied: a group started there
    would wait on a loop that never runs again. Its scope is told, and raises at once."""
    parent = os.getppid()
    for background in list(_loops):
        background._after_fork(parent)


os.register_at_fork(after_in_child=_after_fork)
