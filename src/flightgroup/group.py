"""FlightGroup: the public face of single flight.

Every call goes first through the group's in-process flight table
(``engine.table.FlightTable``): the first caller of a key leads and runs the work, every
caller that comes while it runs joins and gets the same outcome. Async and sync callers
share one table, from any thread and any event loop.

This module owns the calls (checks, arrival, waiting, delivery) and the group's life.
What it leans on, each in a module of its own: the arguments' checks and the scope they
make (``configure``), the attempt driver (``attempts``: where the work runs, deadline,
retry, containment, landing), the bridge to a wide scope (``scope.bridge``), and the
decorator (``decorator``). It names no concrete scope.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import threading
import warnings
import weakref
from asyncio import events
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self, TypeVar, overload

from .codec import Codec
from .configure import (
    MAX_FRAME,
    Configuration,
    check_call,
    check_key,
    check_operation,
    configure,
)
from .decorator import BoundCoalesced as BoundCoalesced
from .decorator import Coalesced as Coalesced
from .decorator import _Coalesce, make_coalesce
from .engine.attempts import Attempts
from .engine.eager import current_task_of
from .engine.flight import (
    CLOSED,
    JOIN,
    KEPT,
    LEAD,
    LEADING,
    SETTLED,
    VALUE,
    Flight,
    Result,
    make_result,
    new_thread_waiter,
    wake,
)
from .engine.table import FlightTable
from .engine.workers import MAX_DEADLINE_THREADS
from .lease import _CURRENT
from .operations import Operations
from .policy import (
    Limits,
    OnUnavailable,
    Retention,
    Retry,
)
from .stats import Stats
from .waiting import warn_blocks_loop

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from .scope.bridge import Bridge
    from .scope.interface import Scope
else:

    def deprecated(message: str) -> Callable[[T], T]:
        """(Read by type checkers only: at run time an overload is never called.)"""
        return lambda overload: overload


# The wide scopes' modules are imported when a group of that scope is made: the process
# scope needs none of their OS interfaces (fcntl, Unix sockets), so it imports anywhere.

__all__ = ["BoundCoalesced", "Coalesced", "FlightGroup", "Result"]

T = TypeVar("T")
_WAIT_MAX = threading.TIMEOUT_MAX


class FlightGroup(Operations):
    """A group of callers that share flights: one run per key at a time.

    ``FlightGroup()`` is the process scope: every task and thread of this process
    that uses the group. The wider scopes (``directory=``, ``redis=``) take the
    same calls; see docs/api.md. ``lease`` and ``cluster`` belong to the fleet scope,
    ``reconnect_timeout`` and ``max_frame_bytes`` to the directory scope: another
    scope refuses them (ValueError) rather than ignore them. ``on_unavailable``
    says what a call does while its wide scope cannot be reached: ``"raise"``
    UnavailableError (the default), or ``"local"``: coalesce within this process alone
    until the scope is back (docs/failures.md). ``takeover=N``: the joiners of a flight
    that ends interrupted (its leader died, lost its lease, was stopped) take it over,
    N times at most, instead of raising FlightInterruptedError: one of them leads the
    key's next flight and the others join it. ``max_deadline_threads``
    (default 64) is the most threads of the group that run sync works under a
    ``deadline`` at once, in time or left running past it (ADR 0038).

    A group is a context manager (``with`` / ``async with``); closing it makes
    every waiting call raise GroupClosedError and every later call too. Work
    already running is not stopped.
    """

    __slots__ = (
        "__weakref__",
        "_attempts",
        "_bridge",
        "_closed",
        "_closed_why",
        "_deadline",
        "_finalizer",
        "_max_value_bytes",
        "_policy",
        "_scope",
        "_table",
    )

    def __init__(
        self,
        *,
        directory: str | os.PathLike[str] | None = None,
        redis: str | None = None,
        namespace: str | None = None,
        codec: Codec | None = None,
        deadline: float | None = None,
        retry: Retry | None = None,
        retention: Retention | None = None,
        limits: Limits | None = None,
        on_unavailable: OnUnavailable = "raise",
        takeover: int = 0,
        max_value_bytes: int | None = None,
        lease: float = 10.0,
        cluster: bool = False,
        reconnect_timeout: float = 5.0,
        max_frame_bytes: int = MAX_FRAME,
        max_deadline_threads: int = MAX_DEADLINE_THREADS,
    ) -> None:
        self._build(configure(
            directory=directory, redis=redis, namespace=namespace, codec=codec,
            deadline=deadline, retry=retry, retention=retention, limits=limits,
            on_unavailable=on_unavailable, takeover=takeover, max_value_bytes=max_value_bytes,
            lease=lease, cluster=cluster, reconnect_timeout=reconnect_timeout,
            max_frame_bytes=max_frame_bytes, max_deadline_threads=max_deadline_threads,
        ))

    @classmethod
    def _over(cls, made: Configuration) -> FlightGroup:
        """A group of ``made``'s settings over its scope, which was made outside
        :func:`configure` (:mod:`flightgroup.testing`'s fake scope): no public argument
        names a scope object."""
        group = cls.__new__(cls)
        group._build(made)
        return group

    def _build(self, made: Configuration) -> None:
        self._deadline = made.deadline
        self._policy = made.policy
        self._max_value_bytes = made.max_value_bytes
        scope = self._scope = made.scope
        self._closed = False
        self._closed_why: str | None = None  # why, when not by close(): a forked child
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._bridge: Bridge | None = None
        self._table: FlightTable[Any]
        if scope is None:
            self._table = FlightTable()
            self._attempts = Attempts(
                self._table, max_value_bytes=made.max_value_bytes,
                max_deadline_threads=made.max_deadline_threads,
            )
            return
        from .scope.bridge import Bridge
        from .scope.table import WideTable

        # Two groups of this process with the same scope are one group: I6 must see the
        # other's flights (WideTable.scope).
        self._table = WideTable(scope.identity, left_holds=scope.left_flights_hold_keys)
        self._attempts = Attempts(
            self._table, max_value_bytes=made.max_value_bytes,
            max_deadline_threads=made.max_deadline_threads,
        )
        self._bridge = self._attempts.bridge = Bridge(
            scope, table=self._table, attempts=self._attempts,
            max_value_bytes=made.max_value_bytes, closed_error=self._closed_error,
        )
        scope.on_fork = functools.partial(_forget_flights, weakref.ref(self))
        # Every process of the group sees this one's threads left past a deadline.
        self._attempts.workers.on_left = scope.report_left_threads
        # A group dropped without close() lets go of its threads, sockets, locks and
        # connections when collected (not at exit: the process's end does that).
        self._finalizer = weakref.finalize(self, _close_dropped, scope, made.named)
        self._finalizer.atexit = False

    # -- calls ------------------------------------------------------------------

    async def run(
        self,
        key: str,
        work: Callable[[], Awaitable[T]],
        *,
        on_join: Callable[[], object] | None = None,
        timeout: float | None = None,
        fresh: bool = False,
    ) -> Result[T]:
        """Run ``work()`` as the leader of ``key``'s flight, or join the one in progress.

        ``work`` is any callable that returns an awaitable. The leader gets
        ``Result(value, joined=False)``, each joiner ``Result(value, joined=True)``,
        with the same value (the same object in the process scope without a codec).
        ``on_join`` is called once in each joiner, before it waits. ``fresh=True``
        accepts only a flight that starts after this call.

        Cancellation: cancelling the calling task, or its ``timeout`` passing,
        withdraws this caller only: it raises CancelledError (resp. TimeoutError),
        and the flight goes on for the others. The leader's cancel does not cancel
        the work; the group owns it and lands it for the joiners. A call made with
        ``timeout=0`` or from a task that is already being cancelled neither leads
        nor joins.

        Raises:
            TypeError, ValueError: a bad key, work, on_join, timeout or fresh; nothing
                changes.
            GroupClosedError: the group is (or gets) closed.
            TimeoutError: this caller's ``timeout`` passed.
            FlightFailedError: (joiners) the work raised; ``__cause__`` is its error.
            FlightInterruptedError: (joiners) the work was stopped by a
                BaseException and has no outcome.
            RuntimeError: the work of this very flight called its own key (it
                would wait for itself).
            Exception: (the leader) whatever the work raised, itself.
        """
        if (
            type(key) is not str
            or not key
            or on_join is not None
            or timeout is not None
            or fresh is not False
            or self._closed
        ):
            key = self._admit(key, work, on_join, timeout, fresh)
        elif not callable(work):
            check_call(work, None, None, False)
        table = self._table
        if table.kept is not None and not fresh:
            # _kept_now's body, inline on this hot path: before the loop is looked up.
            kept = table.take_kept(key)
            if kept is not None:
                return self._deliver(kept, False) if isinstance(kept, Flight) else kept
        loop = events.get_running_loop()
        task = current_task_of(loop)
        if task is not None and task.cancelling():
            raise asyncio.CancelledError()
        current = _CURRENT.get()
        chain = None if current is None else current.flight
        plain = on_join is None and timeout is None
        role, flight, waiter = table.arrive(
            key,
            key,
            fresh=fresh,
            make_waiter=loop.create_future,
            chain=chain,
            blocking_loop=None,
            policy=self._policy,
        )
        if role is LEAD:
            self._attempts.start_async(flight, work, loop, chain)
            if plain and flight.outcome is None and self._bridge is None:
                # Its eager start suspended: the leader waits here, in this frame (no
                # coroutine of its own to hold while the work runs; a wide scope's
                # leader waits as _lead_waiting says).
                waiter = loop.create_future()
                if table.wait_as_leader(flight, waiter):  # (False: it settled meanwhile)
                    try:
                        signal = await waiter
                    except BaseException:
                        table.give_up(flight, waiter)
                        raise
                    if signal is CLOSED:
                        raise self._closed_error()
                    # (SETTLED: in the process scope nothing else wakes a leader)
            outcome = flight.outcome
            if outcome is not None:  # the work finished (eagerly, or while it waited)
                if on_join is not None and self._bridge is not None and flight.joined_remote:
                    on_join()  # (wide scopes) it joined elsewhere, and the outcome came
                if outcome is VALUE and flight.data is None and not flight.closed:
                    return make_result((flight.value, False, flight.token))  # as _deliver
                return self._deliver(flight, True)
            if plain:
                return await self._lead_waiting(flight, work, loop, self._policy)
            role = LEADING
        elif role is KEPT:
            return self._deliver(flight, False)
        elif role is JOIN and on_join is None and timeout is None:
            # The herd's path, without a second coroutine: a joiner is handed SETTLED
            # or CLOSED, never a claim (claims go to fresh callers).
            try:
                signal = await waiter  # type: ignore[misc]
            except BaseException:
                self._table.give_up(flight, waiter)  # type: ignore[arg-type]
                raise
            if signal is SETTLED:
                # The joiners' one Result, once the first of them made it (_deliver)
                result: Result[Any] | None = flight.joined_result
                if result is not None and not flight.closed:
                    return result
                return self._deliver(flight, False)
            if signal is CLOSED:
                raise self._closed_error()
            return await self._claimed(signal, work, loop, self._policy)  # a takeover's
        return await self._follow(role, flight, waiter, work, on_join, timeout, loop, self._policy)

    def _admit(
        self, key: object, work: object, on_join: object, timeout: object, fresh: object
    ) -> str:
        """The slow path of a call's checks, in order: arguments, closed, timeout=0.
        Raises, or returns the key (a plain str) when the call may go on."""
        key = check_key(key)
        check_call(work, on_join, timeout, fresh)
        if self._closed:
            raise self._closed_error()
        if timeout is not None and timeout <= 0:  # type: ignore[operator]
            raise TimeoutError(f"timeout of 0 s for {key!r}: the call neither led nor joined")
        return key

    @overload
    @deprecated(
        "run_sync() runs a plain callable; an async work needs await run() (given to "
        "run_sync, its flight fails with TypeError)"
    )
    def run_sync(
        self,
        key: str,
        work: Callable[[], Awaitable[Any]],
        *,
        on_join: Callable[[], object] | None = None,
        timeout: float | None = None,
        fresh: bool = False,
    ) -> Result[object]: ...

    @overload
    def run_sync(
        self,
        key: str,
        work: Callable[[], T],
        *,
        on_join: Callable[[], object] | None = None,
        timeout: float | None = None,
        fresh: bool = False,
    ) -> Result[T]: ...

    def run_sync(
        self,
        key: str,
        work: Callable[[], T],
        *,
        on_join: Callable[[], object] | None = None,
        timeout: float | None = None,
        fresh: bool = False,
    ) -> Result[T]:
        """The blocking twin of :meth:`run`, for threads: ``work`` is a plain callable.

        The leader runs ``work()`` in its own thread; with a ``timeout`` it runs it
        on a thread of its own instead, so the leader can stop waiting.

        Cancellation: when ``timeout`` passes this call raises TimeoutError and the
        flight goes on for the others; a leader's timeout does not stop the work.
        KeyboardInterrupt while waiting withdraws this caller the same way.
        ``timeout=0`` neither leads nor joins.

        Raises: as :meth:`run`, and RuntimeError when called on the thread of the
        event loop that runs the flight's async work (it would block it forever).
        """
        if (
            type(key) is not str
            or not key
            or on_join is not None
            or timeout is not None
            or fresh is not False
            or self._closed
        ):
            key = self._admit(key, work, on_join, timeout, fresh)
        elif not callable(work):
            check_call(work, None, None, False)
        loop = events._get_running_loop()
        if loop is not None:  # (whether it would wait is the other callers' timing)
            warn_blocks_loop(f"run_sync({key!r})", stacklevel=3)
        table = self._table
        if table.kept is not None and not fresh:
            kept = table.take_kept(key)
            if kept is not None:
                return self._deliver(kept, False) if isinstance(kept, Flight) else kept
        current = _CURRENT.get()
        parent = None if current is None else current.flight
        role, flight, waiter = table.arrive(
            key, key, fresh=fresh, make_waiter=new_thread_waiter, chain=parent,
            blocking_loop=loop, policy=self._policy,
        )
        if role is KEPT:
            return self._deliver(flight, False)
        if timeout is None and self._scope is None:
            if role is LEAD:
                # the common case: no waiting at all (under a deadline the attempt runs
                # on a kept thread, and this thread waits for it: ADR 0038)
                self._attempts.drive_sync(flight, work, parent)
                return self._deliver(flight, True)
            if role is JOIN and on_join is None:
                # The plain join: a joiner is handed SETTLED or CLOSED, never a claim,
                # and _deliver tells the two apart by the flight.
                try:
                    waiter.acquire()  # type: ignore[union-attr]
                except BaseException:
                    self._table.give_up(flight, waiter)  # type: ignore[arg-type]
                    raise
                if flight.taken_over and waiter in flight.taken_over:  # a takeover's claim
                    following = flight.next
                    claimed, mine = table.claim(following, new_thread_waiter, self._policy)
                    return self._follow_sync(
                        claimed, following, mine, work, None, None, self._policy
                    )
                return self._deliver(flight, False)
        return self._follow_sync(role, flight, waiter, work, on_join, timeout, self._policy)

    # -- the decorator ----------------------------------------------------------

    def coalesce(
        self,
        key: Callable[..., str] | None = None,
        *,
        name: str | None = None,
        deadline: float | None = None,
        retry: Retry | None = None,
        retention: Retention | None = None,
        limits: Limits | None = None,
        on_unavailable: OnUnavailable | None = None,
        takeover: int | None = None,
        codec: Codec | None = None,
    ) -> _Coalesce:
        """Decorate an ``async def`` or a plain ``def`` so that concurrent calls with
        the same key share one run. The decorated function returns the value itself;
        ``fn.options(timeout=..., fresh=..., on_join=...)(*args)`` calls it with those
        options and returns the ``Result``.

        ``key`` is called with the function's arguments and returns the call's key
        (without it, the key is the ``repr`` of the bound arguments: only for
        arguments whose repr says all that matters). Keys live in a namespace of the
        function's own (``module.qualname``, a lambda's with its line and a digest of
        its code, or ``name``), so two decorated functions never share a flight. The
        wrapper also has ``forget(*args, **kwargs)``. A ``key`` function that could not
        take some call the function accepts raises TypeError here (ADR 0044).

        ``deadline``, ``retry``, ``retention``, ``limits``, ``on_unavailable`` and
        ``takeover`` override the group's for this operation. ``codec`` too: its
        values cross with that codec instead of the group's (also in the process
        scope, where every caller then gets decode(encode(value))). A codec with
        ``for_type`` (``flightgroup.typed.TypedCodec``) is made for the function's
        declared return type, so every caller, the leader too, gets a value of that
        type; a value that does not match it fails in the leader's encode, naming
        the operation and the type (docs/codecs.md).
        """
        settings = check_operation(
            key=key, name=name, deadline=deadline, retry=retry, retention=retention,
            limits=limits, on_unavailable=on_unavailable, takeover=takeover, codec=codec,
        )
        decorator: _Coalesce = make_coalesce(self, key, name, settings.over(self._policy))
        return decorator

    # -- the group --------------------------------------------------------------

    def forget(self, key: str) -> None:
        """Make the next call of ``key`` lead a new flight; drop a kept outcome.

        A flight in progress is detached, not stopped: its callers still get its
        outcome, and its late settling never touches the newer flight.

        Raises GroupClosedError if the group is closed (a wide scope would not hear it).
        """
        key = check_key(key)
        if self._closed:
            raise self._closed_error()
        bridge = self._bridge
        if bridge is None:
            self._table.forget(key)
            return
        from .scope.bridge import plain_scope_key

        sent = plain_scope_key(key)
        bridge.scope.check_key(sent)  # a key the scope cannot carry changes nothing
        bridge.forget(key, sent, key)

    def stats(self) -> Stats:
        """A snapshot of this group's counters in this process."""
        workers = self._attempts.workers
        threads, busy, left = workers.counts()
        stats: Stats = self._table.snapshot()
        return dataclasses.replace(
            stats,
            threads=threads,
            deadline_threads=busy,
            left_threads=left,
            max_deadline_threads=workers.bound,
        )

    @property
    def closed(self) -> bool:
        """True once the group is closed; in a forked child, also a wide group that was
        started in the parent (its thread was not copied: docs/adr/0014 and 0018)."""
        return self._closed

    def close(self) -> None:
        """Close the group: waiting calls raise GroupClosedError, later calls too.

        Work that is running is not stopped; its lease is marked lost (its outcome
        will not be delivered), and it runs to its end. The process scope returns
        at once. A directory group first hands over the landings already made
        (waiting at most ``reconnect_timeout`` for a coordinator), then disconnects;
        the flights it leads are interrupted for their joiners elsewhere, and their
        works keep their key locks until they end. If it coordinates, another
        process takes over.
        """
        scope = self._close_here()
        if scope is not None:
            scope.close()

    async def aclose(self) -> None:
        """Close the group (see :meth:`close`), without blocking the event loop."""
        scope = self._close_here()
        if scope is not None:
            await asyncio.to_thread(scope.close)

    def _close_here(self) -> Scope | None:
        """Close this process's side: every waiting call is woken with CLOSED and every
        running work's lease is lost. Returns the scope still to close, if any."""
        self._closed = True
        self._attempts.workers.close()
        for flight, waiters in self._table.close():
            if waiters:
                wake(waiters, CLOSED)
            flight.lose()
        if self._scope is not None and self._finalizer is not None:
            self._finalizer.detach()
        return self._scope

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        scope = "process scope" if self._scope is None else self._scope.label
        return f"<FlightGroup {scope}, {state}, {len(self._table.flights)} flights>"



def _close_dropped(scope: Scope, name: str) -> None:
    """A wide group collected without close(): warn, as an unclosed socket does, and
    close its scope's machinery on a thread of its own (a collection may run on any
    thread, the group's own among them, and closing waits for landings)."""
    if not scope.started:
        return  # never started (construction does no I/O): nothing to let go of
    # (stacklevel 1: a collection has no caller of the group's to point at)
    warnings.warn(
        f"unclosed {name}: close() it (or use it in a with block)", ResourceWarning, stacklevel=1
    )
    with contextlib.suppress(RuntimeError):  # no new thread (the interpreter ends)
        threading.Thread(target=scope.close, name="flightgroup-close", daemon=True).start()


def _forget_flights(ref: weakref.ref[FlightGroup], why: str) -> None:
    """(In a forked child of a started wide group) the flights copied from the
    parent have no thread here to end them: a call joining one would wait for ever.
    A new table, so every call reaches the arbiter, which raises."""
    group = ref()
    if group is not None:
        from .scope.table import WideTable

        # (Its own identity: it must not be taken for the parent's group's kin.)
        group._table = WideTable(object(), left_holds=False)
        group._attempts.table = group._table
        if group._bridge is not None:
            group._bridge.table = group._table
        group._closed = True
        group._closed_why = why
        if group._finalizer is not None:  # closed here: nothing to warn of or let go
            group._finalizer.detach()


@dataclass(frozen=True, slots=True)
class Internals:
    """What the package's integrations (metrics, tracing, the CLI, the ASGI middleware)
    read of a group: its wide scope (None: the process scope), its flight table, its
    bound on an encoded outcome and its own codec (None: values are not encoded)."""

    scope: Scope | None
    table: FlightTable[Any]
    max_value_bytes: int | None
    codec: Codec | None


def internals(group: FlightGroup) -> Internals:
    """``group``'s :class:`Internals`, for the integrations of this package only."""
    return Internals(group._scope, group._table, group._max_value_bytes, group._policy.codec)
