"""FlightGroup: the public face of single flight.

Every call goes first through the group's in-process flight table
(``flight.FlightTable``): the first caller of a key leads and runs the work,
every caller that comes while it runs joins and gets the same outcome. Async
and sync callers share one table, from any thread and any event loop.

Where the work runs (ADR 0002): an async work runs in a task of its own,
owned by the group, so the leader's caller can be cancelled or time out without
cancelling the work. On Python 3.12+ that task starts eagerly: a work that
finishes without suspending costs no trip through the event loop. A sync work
runs in the leader's own thread, or, when the leader gave a ``timeout``, on a
thread of its own so the leader can stop waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import math
import os
import random
import sys
import threading
import time
import types
import warnings
import weakref
from asyncio import events
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from contextvars import copy_context
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    ParamSpec,
    Protocol,
    Self,
    TypeVar,
    cast,
    overload,
)

from .codec import Codec, check_codec, encode_bytes
from .errors import (
    FlightError,
    FlightFailedError,
    FlightInterruptedError,
    FlightTimeoutError,
    GroupClosedError,
    LeaseLostError,
    UnavailableError,
    ValueTooLargeError,
    renewed,
)
from .flight import (
    CLOSED,
    DONE,
    EXPIRED,
    JOINED,
    RETRY_PENDING,
    RUNNING,
    SETTLED,
    UNMEASURED,
    Attempt,
    Flight,
    FlightTable,
    Outcome,
    Result,
    Role,
    ThreadWaiter,
    Waiter,
    _expire,
    new_thread_waiter,
    signal_of,
    waited_on,
    wake,
)
from .lease import _CURRENT
from .policy import NO_POLICY, FlightPolicy, Limits, Retention, Retry, check_seconds
from .retention import estimate_size
from .stats import Stats

if TYPE_CHECKING:
    from . import wide as _wide
    from .directory.client import DirectoryArbiter
    from .redis.arbiter import RedisArbiter
    from .wide import Arbiter, Event

    Call = Any  # a wide scope's call: the arbiter's own object (see wide.Arbiter)
else:
    # flightgroup.wide, bound when the first wide group is made (``_bind_wide``): the
    # wide paths read it, where an import in the function cost about 0.4 µs each time.
    _wide = None

# The wide scopes' modules are imported when a group of that scope is made: the process
# scope needs none of their OS interfaces (fcntl, Unix sockets), so it imports anywhere.

__all__ = ["BoundCoalesced", "Coalesced", "FlightGroup", "Result"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
R_co = TypeVar("R_co", covariant=True)
P = ParamSpec("P")
Q = ParamSpec("Q")
S = TypeVar("S")

_CoroutineType = types.CoroutineType
_EAGER = sys.version_info >= (3, 12)
"""Start a leader's task eagerly (Python 3.12+). Tests switch it off to cover 3.11's path."""

_WAIT_MAX = threading.TIMEOUT_MAX
_SOCKET_PATH_LIMIT = 103  # bytes of UTF-8; macOS allows 104 with the NUL, Linux 108
_DIRECTORY_MAX_VALUE = 64 * 1024 * 1024
# A landing's frame holds the value and a small header: the value leaves it this much room.
_FRAME_HEADROOM = 64 * 1024
_MAX_FRAME = _DIRECTORY_MAX_VALUE + _FRAME_HEADROOM  # max_frame_bytes' default
_FLEET_MAX_VALUE = 1024 * 1024


def _check_key(key: object) -> str:
    """``key`` as a plain ``str``. A subclass's (a StrEnum member's) is copied to one:
    the engine tells a plain key from a decorated function's by ``type(tkey) is str``,
    and a wide scope sends the characters, not what the subclass's ``__str__`` says."""
    if type(key) is not str:
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, not {type(key).__name__}")
        key = str.__str__(key)
    if not key:
        raise ValueError("key must not be empty")
    return key


def _check_call(work: object, on_join: object, timeout: object, fresh: object) -> None:
    if not callable(work):
        raise TypeError(f"work must be callable, not {type(work).__name__}")
    if on_join is not None and not callable(on_join):
        raise TypeError(f"on_join must be callable or None, not {type(on_join).__name__}")
    if timeout is not None:
        check_seconds("timeout", timeout)
    if type(fresh) is not bool:
        raise TypeError(f"fresh must be a bool, not {type(fresh).__name__}")


class Coalesced(Protocol[P, R_co]):
    """A function decorated by ``FlightGroup.coalesce``: called as the original, plus
    ``forget(*args, **kwargs)`` (the next call with those arguments leads a new flight)
    and ``flight_namespace`` (the namespace its keys live in)."""

    flight_namespace: str

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    def forget(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Detach the flight these arguments' key maps to (see FlightGroup.forget)."""
        ...

    # A decorated method: read from its class, it is the function (``forget`` takes
    # the instance first); read from an instance, it is bound like any method.
    @overload
    def __get__(self, instance: None, owner: type[Any], /) -> Self: ...

    @overload
    def __get__(
        self: Coalesced[Concatenate[S, Q], R_co], instance: S, owner: type[Any], /
    ) -> BoundCoalesced[Q, R_co]: ...

    def __get__(self, instance: Any, owner: type[Any], /) -> Any: ...


class BoundCoalesced(Protocol[P, R_co]):
    """A decorated method read from an instance: called as the bound method. Its
    ``forget`` is reached through the class (``Cls.method.forget(instance, ...)``)."""

    flight_namespace: str

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...


class _Coalesce(Protocol):
    """The decorator returned by ``FlightGroup.coalesce``. Above ``@classmethod`` or
    ``@staticmethod`` it decorates their function and gives the same kind back (so
    type checkers bind ``cls`` as for any classmethod; its ``forget`` is reached as
    ``Cls.__dict__[name].__func__.forget``)."""

    @overload
    def __call__(self, fn: classmethod[S, P, T], /) -> classmethod[S, P, T]: ...

    @overload  # first: a staticmethod is callable too
    def __call__(  # type: ignore[overload-overlap]
        self, fn: staticmethod[P, T], /
    ) -> staticmethod[P, T]: ...

    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, T]], /
    ) -> Coalesced[P, Coroutine[Any, Any, T]]: ...

    @overload
    def __call__(self, fn: Callable[P, T], /) -> Coalesced[P, T]: ...


class FlightGroup:
    """A group of callers that share flights: one run per key at a time.

    ``FlightGroup()`` is the process scope: every task and thread of this process
    that uses the group. The wider scopes (``directory=``, ``redis=``) take the
    same calls; see API.md. ``lease`` and ``cluster`` belong to the fleet scope,
    ``reconnect_timeout`` and ``max_frame_bytes`` to the directory scope: another
    scope refuses them (ValueError) rather than ignore them.

    A group is a context manager (``with`` / ``async with``); closing it makes
    every waiting call raise GroupClosedError and every later call too. Work
    already running is not stopped.
    """

    __slots__ = (
        "__weakref__",
        "_arbiter",
        "_closed",
        "_closed_why",
        "_codec",
        "_deadline",
        "_finalizer",
        "_fleet",
        "_max_value_bytes",
        "_policy",
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
        max_value_bytes: int | None = None,
        lease: float = 10.0,
        cluster: bool = False,
        reconnect_timeout: float = 5.0,
        max_frame_bytes: int = _MAX_FRAME,
    ) -> None:
        if directory is not None and redis is not None:
            raise ValueError("directory and redis exclude each other: choose one scope")
        if codec is not None:
            check_codec(codec)
        if (directory is not None or redis is not None) and codec is None:
                raise TypeError(
                    "a directory or fleet group needs a codec (for example codec=flightgroup.JSON)"
                )
        if directory is not None:
            path = os.fsdecode(os.fspath(directory))
            if not path:
                raise ValueError("directory must not be empty")
            sock = os.path.join(os.path.abspath(path), "flight.sock")
            size = len(sock.encode())
            if size > _SOCKET_PATH_LIMIT:
                raise ValueError(
                    f"the socket path {sock!r} is {size} bytes, over the limit of "
                    f"{_SOCKET_PATH_LIMIT}; choose a shorter directory"
                )
        if redis is not None:
            if not isinstance(redis, str) or not redis.startswith(
                ("redis://", "rediss://", "unix://")
            ):
                raise ValueError("redis must be a redis://, rediss:// or unix:// URL")
            if not isinstance(namespace, str) or not namespace:
                raise ValueError("the fleet scope needs a non-empty namespace")
            if "}" in namespace:
                # It would end the hash tag of the flight's Redis keys early, and split
                # them over a Cluster's slots.
                raise ValueError("a namespace cannot hold '}'")
        elif namespace is not None:
            raise ValueError("namespace belongs to the fleet scope (redis=...)")
        check_seconds("lease", lease, allow_none=False, allow_zero=False, allow_inf=False)
        if not isinstance(cluster, bool):
            raise TypeError("cluster must be a bool")
        check_seconds("reconnect_timeout", reconnect_timeout, allow_none=False)
        self._deadline = check_seconds("deadline", deadline, allow_zero=False, allow_inf=False)
        for name, given, kind in (
            ("retry", retry, Retry),
            ("retention", retention, Retention),
            ("limits", limits, Limits),
        ):
            if given is not None and not isinstance(given, kind):
                raise TypeError(f"{name} must be a {kind.__name__}, not {type(given).__name__}")
        if max_value_bytes is not None:
            if isinstance(max_value_bytes, bool) or not isinstance(max_value_bytes, int):
                raise TypeError("max_value_bytes must be an int")
            if max_value_bytes < 1:
                raise ValueError("max_value_bytes must be a positive int")
            if codec is None:  # (a wide scope without one was refused above)
                # It bounds an encoded outcome: without a codec nothing is encoded.
                raise ValueError("max_value_bytes needs a codec in the process scope")
        if isinstance(max_frame_bytes, bool) or not isinstance(max_frame_bytes, int):
            raise TypeError("max_frame_bytes must be an int")
        if max_frame_bytes < 1024:
            raise ValueError("max_frame_bytes must be at least 1024")
        # An argument of another scope would be ignored: say so rather than let a
        # misconfigured group run (a lease meant for Redis on a directory group).
        other: list[tuple[str, object, object, str]] = []
        if redis is None:
            fleet = "fleet scope (redis=...)"
            other += [("lease", lease, 10.0, fleet), ("cluster", cluster, False, fleet)]
        if directory is None:
            local = "directory scope (directory=...)"
            other += [
                ("reconnect_timeout", reconnect_timeout, 5.0, local),
                ("max_frame_bytes", max_frame_bytes, _MAX_FRAME, local),
            ]
        for arg, value, default, owner in other:
            if value != default:
                raise ValueError(f"{arg} belongs to the {owner}")
        policy = FlightPolicy(self._deadline, retry, retention, limits)
        self._policy = NO_POLICY if policy == NO_POLICY else policy
        self._codec = codec
        self._arbiter: Arbiter | None = None
        self._fleet: RedisArbiter | None = None
        # Two groups of this process with the same scope are one group: I6 must see the
        # other's flights (FlightTable.scope). A directory by its real path; a fleet by
        # the server its URL names (RedisArbiter.server) and its namespace.
        scope: Hashable | None = None
        if redis is not None or directory is not None:
            _bind_wide()
        if redis is not None:
            assert namespace is not None
            try:
                from .redis.arbiter import RedisArbiter
            except ImportError as exc:  # the extra is not installed
                raise ImportError(
                    "the fleet scope needs redis-py: pip install 'flightgroup[redis]'"
                ) from exc
            if max_value_bytes is None:
                max_value_bytes = _FLEET_MAX_VALUE
            self._arbiter = self._fleet = RedisArbiter(
                redis, namespace, lease=lease, cluster=cluster, max_value_bytes=max_value_bytes
            )
            scope = ("fleet", self._fleet.server, namespace)
        if directory is not None:
            from .directory import forked
            from .directory.client import DirectoryArbiter

            self._arbiter = DirectoryArbiter(
                path, max_frame=max_frame_bytes, reconnect_timeout=reconnect_timeout
            )
            # A value must fit in a frame, or its landing would be refused by every
            # coordinator (the connection dropped, the landing sent again, for ever).
            room = max_frame_bytes - min(_FRAME_HEADROOM, max_frame_bytes // 2)
            if max_value_bytes is None:
                max_value_bytes = min(_DIRECTORY_MAX_VALUE, room)
            elif max_value_bytes > room:
                raise ValueError(
                    f"max_value_bytes ({max_value_bytes}) must leave room for a frame's "
                    f"header in max_frame_bytes ({max_frame_bytes}): at most {room}"
                )
            forked.watch(path)  # a forked child lets go of this directory's locks
            scope = ("directory", os.path.realpath(path))
        self._finalizer: weakref.finalize[Any, Any] | None = None
        if self._arbiter is not None:
            self._arbiter.on_fork = functools.partial(_forget_flights, weakref.ref(self))
            # A group dropped without close() lets go of its threads, sockets, locks and
            # connections when collected (not at exit: the process's end does that).
            named = (
                f"FlightGroup(redis=..., namespace={namespace!r})" if redis is not None
                else f"FlightGroup(directory={path!r})"
            )
            self._finalizer = weakref.finalize(self, _close_dropped, self._arbiter, named)
            self._finalizer.atexit = False
        self._max_value_bytes = max_value_bytes
        self._table = FlightTable(wide=self._arbiter is not None, scope=scope)
        self._closed = False
        self._closed_why: str | None = None  # why, when not by close(): a forked child

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
            _check_call(work, None, None, False)
        loop = events.get_running_loop()
        task = asyncio.current_task(loop)
        if task is not None and task.cancelling():
            raise asyncio.CancelledError()
        table = self._table
        if table.kept is not None and not fresh:
            kept = table.take_kept(key)
            if kept is not None:
                return self._deliver(kept, False) if isinstance(kept, Flight) else kept
        current = _CURRENT.get()
        role, flight, waiter = table.arrive(
            key,
            key,
            fresh,
            loop.create_future,
            None if current is None else current.flight,
            None,
            self._policy,
        )
        if role is Role.LEAD:
            self._start_async(flight, work, loop)
            if flight.outcome is not None:  # the work finished eagerly: no waiting
                if flight.joined_remote and on_join is not None:
                    on_join()  # (wide scopes) it joined elsewhere, and the outcome came
                return self._deliver(flight, True)
            role = Role.LEADING
        elif role is Role.KEPT:
            return self._deliver(flight, False)
        elif role is Role.JOIN and on_join is None and timeout is None:
            # The herd's path, without a second coroutine: a joiner is handed SETTLED
            # or CLOSED, never a claim (claims go to fresh callers).
            try:
                signal = await waiter  # type: ignore[misc]
            except BaseException:
                self._abandon(flight, waiter, None)  # type: ignore[arg-type]
                raise
            if signal is SETTLED:
                return self._deliver(flight, False)
            raise self._closed_error()
        return await self._follow(role, flight, waiter, work, on_join, timeout, loop, self._policy)

    async def _run_op(
        self, tkey: Hashable, key: str, work: Callable[[], Awaitable[T]], policy: FlightPolicy
    ) -> Result[T]:
        """``run`` for a decorated function: ``tkey`` is its namespaced key. Returns the
        Result (the wrapper takes its value; a traced group reads its token)."""
        if self._closed:
            raise self._closed_error()
        loop = events.get_running_loop()
        task = asyncio.current_task(loop)
        if task is not None and task.cancelling():
            raise asyncio.CancelledError()
        current = _CURRENT.get()
        role, flight, waiter = self._table.arrive(
            tkey,
            key,
            False,
            loop.create_future,
            None if current is None else current.flight,
            None,
            policy,
        )
        if role is Role.LEAD:
            self._start_async(flight, work, loop)
            if flight.outcome is not None:
                return self._deliver(flight, True)
            role = Role.LEADING
        elif role is Role.KEPT:
            return self._deliver(flight, False)
        return await self._follow(role, flight, waiter, work, None, None, loop, policy)

    def _admit(
        self, key: object, work: object, on_join: object, timeout: object, fresh: object
    ) -> str:
        """The slow path of a call's checks, in order: arguments, closed, timeout=0.
        Raises, or returns the key (a plain str) when the call may go on."""
        key = _check_key(key)
        _check_call(work, on_join, timeout, fresh)
        if self._closed:
            raise self._closed_error()
        if timeout is not None and timeout <= 0:  # type: ignore[operator]
            raise TimeoutError(f"timeout of 0 s for {key!r}: the call neither led nor joined")
        return key

    async def _follow(
        self,
        role: Role,
        flight: Flight,
        waiter: Waiter | None,
        work: Callable[[], Awaitable[T]],
        on_join: Callable[[], object] | None,
        timeout: float | None,
        loop: asyncio.AbstractEventLoop,
        policy: FlightPolicy,
    ) -> Result[T]:
        table = self._table
        at = None if timeout is None or math.isinf(timeout) else loop.time() + timeout
        leader = False
        fresh_of: Flight | None = None  # the flight whose end this caller waits for
        deferred = False  # (wide scopes) its on_join waits for the scope's answer
        while True:
            if role is Role.LEAD or role is Role.LEADING:
                leader = True
                if role is Role.LEAD:
                    self._start_async(flight, work, loop)
                waiter = loop.create_future()
                if not table.wait_as_leader(flight, waiter):
                    if flight.joined_remote and on_join is not None:
                        on_join()  # (wide scopes) it joined elsewhere, and the outcome came
                    return self._deliver(flight, True)
                if flight.joined_remote and on_join is not None:
                    call_on_join, on_join = on_join, None
                    self._on_join_or_withdraw(flight, waiter, call_on_join)
            elif role is Role.TAKE:  # joined a flight that already ended
                if on_join is not None:
                    on_join()
                return self._deliver(flight, False)
            elif role is Role.JOIN and on_join is not None:
                assert waiter is not None
                # (The process scope is always decided: no lock taken to ask.)
                now = True if self._arbiter is None else table.defer_on_join(flight, waiter)
                if now is None:
                    deferred = True
                else:
                    call_on_join, on_join = on_join, None  # once per call, never after a rejoin
                    if now:
                        self._on_join_or_withdraw(flight, waiter, call_on_join, fresh_of)
            elif role is Role.WAIT_END:
                fresh_of = flight
            assert waiter is not None
            fut: asyncio.Future[Any] = waiter  # type: ignore[assignment]
            timer = None if at is None else loop.call_at(at, _expire, fut)
            try:
                signal = await fut
            except BaseException:
                self._abandon(flight, fut, fresh_of)
                raise
            finally:
                if timer is not None:
                    timer.cancel()
            if signal is EXPIRED:
                if table.withdraw(flight, fut):
                    raise TimeoutError(f"gave up waiting for the flight of {flight.key!r}")
                if leader and flight.leader_waiter is not fut:
                    # Detached by joined_remote: handed JOINED, even if the outcome
                    # came in the same step (on_join must run before it is delivered).
                    signal = JOINED
                else:
                    signal = signal_of(flight, fresh_of, fut)
                if isinstance(signal, Flight):  # out of time: hand the claim back (I4)
                    table.release_claim(signal)
                    raise TimeoutError(f"gave up waiting for the flight of {flight.key!r}")
                if signal is JOINED or (leader and signal is SETTLED and flight.state is not DONE):
                    # (wide scopes) told to wait as a joiner, out of time before it did
                    raise TimeoutError(f"gave up waiting for the flight of {flight.key!r}")
            if signal is JOINED:  # (wide scopes) this caller is a joiner now
                if on_join is not None:
                    call_on_join, on_join = on_join, None
                    call_on_join()  # its waiter was detached: nothing to withdraw
                if leader:  # its flight joined one led elsewhere
                    role = Role.LEADING
                else:  # a fresh caller that ran_here made a joiner of the flight it waited on,
                    # or a joiner whose on_join waited for the scope's answer
                    fresh_of = None
                    flight = waited_on(flight, fut)
                    role, waiter = table.claim(
                        flight, loop.create_future, policy, claimed=False, counted=deferred
                    )
                    deferred = False
                continue
            if signal is SETTLED:
                return self._deliver(flight, leader)
            if signal is CLOSED:
                raise self._closed_error()
            # A claim on the flight after the one this caller waited for.
            assert isinstance(signal, Flight)
            flight, fresh_of = signal, None
            role, waiter = table.claim(flight, loop.create_future, policy)

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
            _check_call(work, None, None, False)
        table = self._table
        if table.kept is not None and not fresh:
            kept = table.take_kept(key)
            if kept is not None:
                return self._deliver(kept, False) if isinstance(kept, Flight) else kept
        current = _CURRENT.get()
        parent = None if current is None else current.flight
        role, flight, waiter = table.arrive(
            key, key, fresh, new_thread_waiter, parent, events._get_running_loop(), self._policy
        )
        if role is Role.KEPT:
            return self._deliver(flight, False)
        if timeout is None and self._arbiter is None:
            # (Under a deadline the leader only waits: _follow_sync drives on a thread.)
            if role is Role.LEAD and flight.policy.deadline is None:
                self._drive_sync(flight, work, parent)  # the common case: no waiting at all
                return self._deliver(flight, True)
            if role is Role.JOIN and on_join is None:
                # The plain join: a joiner is handed SETTLED or CLOSED, never a claim,
                # and _deliver tells the two apart by the flight.
                try:
                    waiter.acquire()  # type: ignore[union-attr]
                except BaseException:
                    self._abandon(flight, waiter, None)  # type: ignore[arg-type]
                    raise
                return self._deliver(flight, False)
        return self._follow_sync(role, flight, waiter, work, on_join, timeout, self._policy)

    def _call_sync(
        self, tkey: Hashable, key: str, work: Callable[[], T], policy: FlightPolicy
    ) -> Result[T]:
        """``run_sync`` for a decorated function: ``tkey`` is its namespaced key."""
        current = _CURRENT.get()
        parent = None if current is None else current.flight
        role, flight, waiter = self._table.arrive(
            tkey, key, False, new_thread_waiter, parent, events._get_running_loop(), policy
        )
        if role is Role.KEPT:
            return self._deliver(flight, False)
        if role is Role.LEAD and self._arbiter is None and policy.deadline is None:
            self._drive_sync(flight, work, parent)
            return self._deliver(flight, True)
        return self._follow_sync(role, flight, waiter, work, None, None, policy)

    def _follow_sync(
        self,
        role: Role,
        flight: Flight,
        waiter: Waiter | None,
        work: Callable[[], T],
        on_join: Callable[[], object] | None,
        timeout: float | None,
        policy: FlightPolicy,
    ) -> Result[T]:
        table = self._table
        monotonic = time.monotonic
        # Past threading.TIMEOUT_MAX (~292 years) Lock.acquire overflows: no limit.
        limited = timeout is not None and timeout < threading.TIMEOUT_MAX
        at = monotonic() + timeout if limited and timeout is not None else None
        leader = False
        fresh_of: Flight | None = None
        deferred = False  # (wide scopes) its on_join waits for the scope's answer
        while True:
            if role is Role.LEAD:
                leader = True
                wide = self._arbiter is not None
                # The work runs in this thread, and a KeyboardInterrupt in it stops it
                # for all; unless each attempt runs on a thread of its own (a deadline):
                # then the flight is driven on a thread of its own, as with a timeout,
                # and an interrupt of this caller's wait withdraws this caller only.
                own = at is None and flight.policy.deadline is None
                if own and not wide:
                    self._drive_sync(flight, work, _current_flight())
                    return self._deliver(flight, True)
                if own:
                    call_on_join, on_join = on_join, None  # the driver calls it
                    failed = self._drive_wide_sync(
                        flight, work, _current_flight(), call_on_join
                    )
                    if failed is not None:  # on_join raised while the flight ran
                        raise failed
                    # Settled, or (fleet) settling once Redis has the landing.
                    role = Role.LEADING
                    continue
                waiter = new_thread_waiter()
                drive: Callable[..., Any] = self._drive_wide_sync if wide else self._drive_sync
                # A failed start ("can't start new thread", or a KeyboardInterrupt that
                # landed inside start() before the thread got going): nothing ran. An
                # interrupt once it got going re-raises here: this caller withdraws,
                # the flight goes on for the others.
                failed = _start_thread(
                    f"flightgroup-work-{flight.token}", drive, flight, work, _current_flight()
                )
                if failed is not None:
                    self._land(flight, Outcome.INTERRUPTED, None, failed)
                    raise failed
                role = Role.LEADING
            if role is Role.LEADING:  # (sync: a wide leading caller told it joined)
                leader = True
                waiter = new_thread_waiter()
                if not table.wait_as_leader(flight, waiter):
                    if flight.joined_remote and on_join is not None:
                        on_join()
                    return self._deliver(flight, True)
                if flight.joined_remote and on_join is not None:
                    call_on_join, on_join = on_join, None
                    self._on_join_or_withdraw(flight, waiter, call_on_join)
            elif role is Role.TAKE:  # joined a flight that already ended
                if on_join is not None:
                    on_join()
                return self._deliver(flight, False)
            elif role is Role.JOIN and on_join is not None:
                assert waiter is not None
                # (The process scope is always decided: no lock taken to ask.)
                now = True if self._arbiter is None else table.defer_on_join(flight, waiter)
                if now is None:
                    deferred = True
                else:
                    call_on_join, on_join = on_join, None
                    if now:
                        self._on_join_or_withdraw(flight, waiter, call_on_join, fresh_of)
            elif role is Role.WAIT_END:
                fresh_of = flight
            assert type(waiter) is ThreadWaiter
            try:
                if at is None:
                    taken = waiter.acquire()
                else:
                    taken = waiter.acquire(timeout=min(max(0.0, at - monotonic()), _WAIT_MAX))
            except BaseException:
                self._abandon(flight, waiter, fresh_of)
                raise
            if not taken and table.withdraw(flight, waiter):
                raise TimeoutError(f"gave up waiting for the flight of {flight.key!r}")
            if not taken and leader and flight.leader_waiter is not waiter:
                # Detached by joined_remote as time ran out: handed JOINED, even if the
                # outcome came since (on_join must run before it is delivered).
                raise TimeoutError(f"gave up waiting for the flight of {flight.key!r}")
            if leader and flight.joined_remote and taken and on_join is not None:
                # (wide scopes) this leading caller became a joiner (its waiter was
                # detached to tell it, or the outcome came right after): on_join first.
                call_on_join, on_join = on_join, None
                call_on_join()
            if leader and flight.outcome is None and not flight.closed:
                # (wide scopes) woken with JOINED: wait again, as a joiner now.
                if not taken:
                    raise TimeoutError(f"gave up waiting for the flight of {flight.key!r}")
                role = Role.LEADING
                continue
            # Taken, or detached as we gave up: either way the signal is on the flight.
            signal = signal_of(flight, fresh_of, waiter)
            if not taken and isinstance(signal, Flight):  # out of time: hand the claim back
                table.release_claim(signal)
                raise TimeoutError(f"gave up waiting for the flight of {flight.key!r}")
            if signal is JOINED:  # a fresh caller that ran_here made a joiner of its flight,
                # or a joiner whose on_join waited for the scope's answer
                if not taken:
                    raise TimeoutError(f"gave up waiting for the flight of {flight.key!r}")
                if on_join is not None:
                    call_on_join, on_join = on_join, None
                    call_on_join()  # its waiter was detached: nothing to withdraw
                fresh_of = None
                flight = waited_on(flight, waiter)
                role, waiter = table.claim(
                    flight, new_thread_waiter, policy, claimed=False, counted=deferred
                )
                deferred = False
                continue
            if signal is SETTLED:
                return self._deliver(flight, leader)
            if signal is CLOSED:
                raise self._closed_error()
            assert isinstance(signal, Flight)
            flight, fresh_of = signal, None
            role, waiter = table.claim(flight, new_thread_waiter, policy)

    def _on_join_or_withdraw(
        self,
        flight: Flight,
        waiter: Waiter,
        on_join: Callable[[], object],
        fresh_of: Flight | None = None,
    ) -> None:
        """A joiner's on_join runs (also a wide scope's leading caller's, once it
        learned it joined a flight led elsewhere); if that raises, the caller
        withdraws and raises it."""
        try:
            on_join()
        except BaseException:
            self._abandon(flight, waiter, fresh_of)
            raise

    def _abandon(self, flight: Flight, waiter: Waiter, fresh_of: Flight | None) -> None:
        """This caller stops waiting (cancel, timeout, on_join raised, interrupt).

        If its waiter could not be withdrawn, a signal reached it first; the only
        signal that asks something of it is a claim on the next flight, which it
        hands back (I4).
        """
        if not self._table.withdraw(flight, waiter) and fresh_of is not None:
            signal = signal_of(flight, fresh_of, waiter)
            if isinstance(signal, Flight):
                self._table.release_claim(signal)

    # -- the leader's side -----------------------------------------------------

    def _start_async(
        self,
        flight: Flight,
        work: Callable[[], Awaitable[Any]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        flight.loop = loop
        flight.parent = _current_flight()
        if self._arbiter is not None:
            # The wide scope decides first (it always suspends): no eager deadline.
            wide = self._drive_wide_async(flight, work)
            if _EAGER:  # the request goes out now, from this call
                flight.task = asyncio.Task(wide, loop=loop, eager_start=True)  # type: ignore[call-arg, unused-ignore]
            else:
                task = flight.task = loop.create_task(wide)
                # Cancelled before its first step, it never asked the scope: the flight
                # is this process's alone, and ends here (its joiners here interrupted).
                task.add_done_callback(
                    functools.partial(self._unstarted_wide, weakref.ref(flight))
                )
            return
        coro = self._drive_async(flight, work)
        if _EAGER:
            began = loop.time()
            task = flight.task = asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg, unused-ignore]
            deadline = flight.policy.deadline
            attempt = flight.attempt
            # A work that finished eagerly cannot have run late: the first attempt's
            # timer is armed only for a work that suspended in it (not one whose first
            # attempt failed at once and that now pauses before the next: that one's
            # own timer comes with it).
            if (
                deadline is not None
                and not task.done()
                and attempt is not None
                and attempt.timer is None
                and flight.attempt is attempt
                and flight.state is RUNNING
            ):
                attempt.timer = loop.call_at(began + deadline, _time_out, attempt, task)
        else:
            task = flight.task = loop.create_task(coro)
            # Cancelled before its first step (its loop shut down at once), the task
            # never enters _drive_async: land the flight here instead.
            # (A weak reference: the callback must not keep a settled flight's value.)
            task.add_done_callback(functools.partial(self._unstarted, weakref.ref(flight)))

    def _unstarted(self, flight_ref: weakref.ref[Flight], task: asyncio.Task[None]) -> None:
        flight = flight_ref()
        if flight is not None and flight.outcome is None and task.cancelled():
            self._land(flight, Outcome.INTERRUPTED, None, asyncio.CancelledError())

    def _unstarted_wide(self, flight_ref: weakref.ref[Flight], task: asyncio.Task[None]) -> None:
        flight = flight_ref()
        if flight is not None and flight.outcome is None and task.cancelled():
            stopped = FlightInterruptedError(flight.key, "its loop stopped before it began")
            self._settle_remote(flight, Outcome.INTERRUPTED, stopped)

    async def _drive_async(
        self, flight: Flight, work: Callable[[], Awaitable[Any]], call: Call | None = None
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
            if policy.deadline is not None and (number > 1 or not _EAGER or call is not None):
                timer = attempt.timer = events.get_running_loop().call_later(
                    policy.deadline, _time_out, attempt, asyncio.current_task()
                )
            try:
                awaitable = work()
                if type(awaitable) is not _CoroutineType and not _is_awaitable(awaitable):
                    raise TypeError(
                        f"the work given to run() returned {type(awaitable).__name__}, not an "
                        "awaitable; use run_sync() for a plain function"
                    )
                value = await awaitable
            except Exception as exc:
                outcome, value, error = Outcome.ERROR, None, exc
            except BaseException as exc:
                outcome, value, error = Outcome.INTERRUPTED, None, exc
            else:
                outcome, error = Outcome.VALUE, None
            timer = attempt.timer  # the first eager attempt's is set by _start_async
            if timer is not None:
                timer.cancel()
                if attempt.timed_out:  # the deadline cancelled it (or its result is late)
                    task = asyncio.current_task()
                    if task is not None and isinstance(error, asyncio.CancelledError):
                        task.uncancel()
                    assert policy.deadline is not None
                    outcome, value = Outcome.TIMEOUT, None
                    error = FlightTimeoutError(flight.key, policy.deadline)
            if error is None or not self._will_retry(flight, number, outcome, error):
                break
            try:
                await asyncio.sleep(policy.backoff(number, random.uniform))
            except BaseException as exc:  # its loop shut down during the pause
                outcome, value, error = Outcome.INTERRUPTED, None, exc
                break
            following = self._table.next_attempt(flight)
            if following is None:
                break
            if call is not None:  # each attempt has its own token from the scope
                assert self._arbiter is not None
                self._arbiter.retry(call)
                try:
                    event, args = await call.inbox.get()
                except BaseException as exc:
                    # Its loop shut down while the scope answers: land the flight (the
                    # arbiter gives back a token it gets now). Unguarded, the flight
                    # never landed: its local joiners waited forever and its lead was
                    # renewed on (tests/test_fleet_review.py::
                    # test_a_leaders_loop_stopping_during_a_retry_ends_the_flight_for_everyone).
                    following.lose()
                    outcome, value, error = Outcome.INTERRUPTED, None, exc
                    break
                if not self._bind_retry(flight, call, following, event, args):
                    break
            attempt, number = following, number + 1
            _CURRENT.set(attempt)
        stop = self._land(flight, outcome, value, error)
        # The task's context holds the flight and the flight holds the task: break the
        # cycle so a settled flight (and its value) goes with its last caller.
        _CURRENT.set(None)
        if stop is not None:
            # CancelledError (its loop shutting down), KeyboardInterrupt, SystemExit:
            # the joiners are interrupted, the leader gets it from _deliver, and it goes
            # on up so the task ends cancelled and the loop sees KeyboardInterrupt.
            # (GeneratorExit: the coroutine is being closed outside any loop.)
            if events._get_running_loop() is not None:
                task = asyncio.current_task()
                if task is not None:  # the leader has it: the task need not log it again
                    task.add_done_callback(_retrieve)
            raise stop

    def _drive_sync(
        self,
        flight: Flight,
        work: Callable[[], Any],
        parent: Flight | None,
        call: Call | None = None,
    ) -> None:
        """Run a sync work's attempts in this thread, retry as the policy says, land
        the outcome. A BaseException reaches the leader through _deliver, in its own
        thread. ``call``: the wide scope's lead this work runs under."""
        flight.parent = parent
        attempt = flight.attempt
        assert attempt is not None
        self._drive_sync_from(flight, work, call, attempt, 1, None)

    def _drive_sync_from(
        self,
        flight: Flight,
        work: Callable[[], Any],
        call: Call | None,
        attempt: Attempt,
        number: int,
        paused: tuple[float, Ending] | None,
    ) -> None:
        """The loop of _drive_sync from attempt ``number``; ``paused``: the pause before
        the next attempt still to wait, and the ending of ``attempt`` (a pause that a
        KeyboardInterrupt cut short in the leader's thread goes on here, on a thread of
        its own: the leader withdraws, the flight goes on for the others)."""
        policy = flight.policy
        error: BaseException | None
        handed = False  # a cut pause went on on a thread of its own
        try:
            while True:
                if paused is None:
                    if policy.deadline is None:
                        outcome, value, error = _attempt_sync(attempt, work)
                    else:
                        try:
                            outcome, value, error = _attempt_sync_with_deadline(
                                attempt, work, policy.deadline, self._table.unlinger
                            )
                        except BaseException as exc:  # KeyboardInterrupt waiting, no thread
                            outcome, value, error = Outcome.INTERRUPTED, None, exc
                    if error is None or not self._will_retry(flight, number, outcome, error):
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
                    if _start_thread(
                        f"flightgroup-retry-{flight.token}",
                        self._drive_sync_from, flight, work, call, attempt, number, rest,
                    ) is not None:  # no thread to go on with: the flight ends here
                        handed = False
                        outcome, value, error = Outcome.INTERRUPTED, None, exc
                        break
                    raise
                following = self._table.next_attempt(flight)
                if following is None:
                    break
                if call is not None:  # each attempt has its own token from the scope
                    assert self._arbiter is not None
                    self._arbiter.retry(call)
                    got: tuple[Any, tuple[Any, ...]] | None = None  # read, maybe not taken
                    try:
                        got = call.inbox.wait_sync()
                        call.inbox.take(got)
                        event, args = got
                    except BaseException as exc:
                        # Interrupted waiting for the token (not in the work): this
                        # caller withdraws, the retry goes on on a thread of its own
                        # (with the answer, if it was read: see Inbox.wait_sync).
                        handed = True  # (as for a cut pause, above)
                        if _start_thread(
                            f"flightgroup-retry-{flight.token}", self._retry_when_bound,
                            flight, work, call, following, number + 1,
                            (outcome, value, error), got,
                        ) is None:
                            raise
                        handed = False
                        following.lose()  # no thread: the flight ends here
                        outcome, value, error = Outcome.INTERRUPTED, None, exc
                        break
                    if not self._bind_retry(flight, call, following, event, args):
                        break
                attempt, number = following, number + 1
            self._land(flight, outcome, value, error)
        except BaseException as exc:
            # Stopped outside the work (a signal between two steps, or in user code the
            # landing calls): the flight must still end, or its joiners wait for ever
            # and every later call joins it. It ends interrupted, as an interrupt in
            # the work does (ADR 0008), unless it settled or is settling already.
            if not handed and (flight.state is RUNNING or flight.state is RETRY_PENDING):
                self._land(flight, Outcome.INTERRUPTED, None, exc)
            raise

    def _bind_retry(
        self, flight: Flight, call: Call, following: Attempt, event: Event, args: tuple[Any, ...]
    ) -> bool:
        """The scope's answer to a retry's request for a token: the attempt runs under
        it; False if the lease was lost meanwhile (the attempt is revoked)."""
        if event is not _wide.Event.LEAD:
            following.revoked = True
            following.lose()
            return False
        following.token = flight.token = args[0]
        assert self._arbiter is not None
        self._arbiter.bind(call, following)
        return True

    def _retry_when_bound(
        self,
        flight: Flight,
        work: Callable[[], Any],
        call: Call,
        following: Attempt,
        number: int,
        ending: Ending,
        got: tuple[Any, tuple[Any, ...]] | None,
    ) -> None:
        """(On a thread of its own) the retry whose token its leader's caller stopped
        waiting for (``got``: the answer, if it had read it): wait for it, then go on
        with the attempts (or land ``ending``, the last attempt's, if the lease was lost
        meanwhile)."""
        if got is None:
            got = call.inbox.wait_sync()
        call.inbox.take(got)
        event, args = got
        if self._bind_retry(flight, call, following, event, args):
            self._drive_sync_from(flight, work, call, following, number, None)
        else:
            self._land(flight, *ending)

    # -- the wide scopes ----------------------------------------------------------
    #
    # The first local caller of a key asks the scope (one request per key per
    # process): it leads there (the work runs here, as above, under the scope's
    # token and lease), or the local flight joins a flight led elsewhere and every
    # local caller of it is a joiner of that flight.

    async def _drive_wide_async(self, flight: Flight, work: Callable[[], Awaitable[Any]]) -> None:
        """The work task of a wide group's flight: ask the scope, then lead or follow."""
        Event = _wide.Event

        arbiter = self._arbiter
        assert arbiter is not None
        try:
            detach = functools.partial(self._table.detach, flight)
            call = arbiter.submit(_wire_key(flight), flight.fresh_lead, flight.after, detach)
        except Exception as exc:  # a network directory, a refused version, closed
            self._settle_remote(
                flight, Outcome.INTERRUPTED, _as_called(exc, flight), unserved=True
            )
            return
        try:
            while True:
                event, args = await call.inbox.get()
                if event is not Event.JOINED:
                    break
                self._joined_remote(flight, args[0])
        except BaseException:  # its loop shuts down: give the call back
            arbiter.withdraw(call)
            self._settle_remote(
                flight, Outcome.INTERRUPTED, FlightInterruptedError(flight.key, "its loop stopped")
            )
            raise
        if event is Event.LEAD:
            if self._lead_wide(flight, call, args[0]):
                await self._drive_async(flight, work, call)
        else:
            self._end_remote(flight, event, args)

    def _drive_wide_sync(
        self,
        flight: Flight,
        work: Callable[[], Any],
        parent: Flight | None,
        on_join: Callable[[], object] | None = None,
    ) -> BaseException | None:
        """The sync twin of _drive_wide_async, in the leading caller's thread (which
        then calls ``on_join`` itself when the flight joins one led elsewhere).
        Returns what on_join raised, for that caller to raise once the flight ended."""
        Event = _wide.Event

        arbiter = self._arbiter
        assert arbiter is not None
        flight.parent = parent
        try:
            detach = functools.partial(self._table.detach, flight)
            call = arbiter.submit(_wire_key(flight), flight.fresh_lead, flight.after, detach)
        except Exception as exc:  # as in _drive_wide_async
            self._settle_remote(
                flight, Outcome.INTERRUPTED, _as_called(exc, flight), unserved=True
            )
            return None
        pending: tuple[Any, tuple[Any, ...]] | None = None  # read, not yet acted on
        try:
            while True:
                pending = call.inbox.wait_sync()  # taken below: see _go_on_wide_sync
                call.inbox.take(pending)
                event, args = pending
                if event is not Event.JOINED:
                    break
                self._joined_remote(flight, args[0])
                pending = None
                if on_join is not None:
                    call_on_join, on_join = on_join, None
                    try:
                        call_on_join()
                    except BaseException as exc:  # also a KeyboardInterrupt during it
                        # This caller withdraws now; the flight goes on for the others
                        # here on a thread of its own, to its outcome (no thread: it
                        # ends interrupted, below, and this caller raises its own error).
                        try:
                            started = _start_thread(
                                "flightgroup-follow", self._follow_remote_sync, flight, call
                            )
                        except BaseException as interrupt:  # (got going: it follows)
                            return interrupt
                        if started is not None:
                            raise
                        return exc
        except BaseException as exc:  # KeyboardInterrupt while waiting
            # This caller withdraws; the flight goes on for its other callers here, on
            # a thread of its own, from where it was (DESIGN.md: a caller that cancels
            # withdraws only itself). Without a thread it ends interrupted for all.
            try:
                failed = _start_thread(
                    "flightgroup-follow", self._go_on_wide_sync, flight, call, work, parent,
                    pending,
                )
            except BaseException:  # (got going: it goes on)
                raise exc from None
            if failed is None:
                raise
            arbiter.withdraw(call)
            self._settle_remote(
                flight,
                Outcome.INTERRUPTED,
                FlightInterruptedError(flight.key, f"its leading caller got {type(exc).__name__}"),
            )
            raise
        self._act_wide_sync(flight, call, work, parent, event, args)
        return None

    def _act_wide_sync(
        self,
        flight: Flight,
        call: Call,
        work: Callable[[], Any],
        parent: Flight | None,
        event: Event,
        args: tuple[Any, ...],
    ) -> None:
        """The scope's answer (other than JOINED): lead here, or settle."""
        if event is _wide.Event.LEAD:
            if self._lead_wide(flight, call, args[0]):
                self._drive_sync(flight, work, parent, call)
        else:
            self._end_remote(flight, event, args)

    def _go_on_wide_sync(
        self,
        flight: Flight,
        call: Call,
        work: Callable[[], Any],
        parent: Flight | None,
        pending: tuple[Event, tuple[Any, ...]] | None,
    ) -> None:
        """The rest of _drive_wide_sync, on a thread of its own, once its caller
        withdrew: ``pending`` is the answer it had read and not acted on."""
        Event = _wide.Event

        while True:
            if pending is None:  # (an answer read but not taken is still in the inbox)
                pending = call.inbox.wait_sync()
            call.inbox.take(pending)
            event, args = pending
            pending = None
            if event is not Event.JOINED:
                break
            self._joined_remote(flight, args[0])
        self._act_wide_sync(flight, call, work, parent, event, args)

    def _follow_remote_sync(self, flight: Flight, call: Call) -> None:
        """Wait for the outcome of the flight ``call`` joined elsewhere, and settle."""
        Event = _wide.Event

        while True:
            event, args = call.inbox.get_sync()
            if event is not Event.JOINED:
                break
        self._end_remote(flight, event, args)

    def _lead_wide(self, flight: Flight, call: Call, token: int) -> bool:
        """This process leads the flight in the scope: its work runs under ``token``.

        False if the group closed since the scope answered: close() may have returned,
        so no work starts after it; the lead goes back to the scope (its key lock, or
        its record in Redis) and the flight ends for nobody (close() woke its callers).
        """
        arbiter = self._arbiter
        assert arbiter is not None
        try:
            promoted = self._table.ran_here(flight)
        except GroupClosedError:
            arbiter.withdraw(call)
            self._settle_remote(flight, Outcome.INTERRUPTED, self._closed_error())
            return False
        flight.token = token
        attempt = flight.attempt = Attempt(flight, token)
        flight.wide = call
        if promoted:
            wake(promoted, JOINED)
        arbiter.bind(call, attempt)
        return True

    def _joined_remote(self, flight: Flight, token: int) -> None:
        flight.token = token
        woken = self._table.joined_remote(flight)
        if woken is not None:
            wake(woken, JOINED)

    def _end_remote(self, flight: Flight, event: Event, args: tuple[Any, ...]) -> None:
        """Settle a flight whose outcome came from the scope (or that cannot go on)."""
        Event, from_wire = _wide.Event, _wide.from_wire

        if event is Event.LANDED:
            token, landed, _kept = args
            outcome, error, data = from_wire(flight.key, landed)
            if error is not None:  # a failure a group of this process may have landed
                error.__cause__ = self._table.cause_of(flight.key, token)
            self._settle_remote(flight, outcome, error, data, token, joined=True)
        elif event is Event.FAILED:
            self._settle_remote(
                flight, Outcome.INTERRUPTED, _as_called(args[0], flight), unserved=True
            )
        else:  # INTERRUPTED (or LOST before leading: cannot happen, same answer)
            reason = str(args[0]) if args else "its leader stopped"
            self._settle_remote(
                flight, Outcome.INTERRUPTED, FlightInterruptedError(flight.key, reason)
            )

    def _settle_remote(
        self,
        flight: Flight,
        outcome: Outcome,
        error: BaseException | None,
        data: bytes | None = None,
        token: int | None = None,
        *,
        joined: bool = False,
        unserved: bool = False,
    ) -> None:
        """Settle ``flight`` with an outcome that every caller here gets as a joiner:
        the value (decoded by each), or a copy of ``error``. ``joined``: the outcome is
        a flight's that ran elsewhere; ``unserved``: the scope could not serve the call."""
        flight.remote = True
        if token is not None:
            flight.token = token
        self._table.ran_elsewhere(flight, joined, unserved)
        self._settle(flight, outcome, None, error, data)

    def _land_wide(
        self,
        flight: Flight,
        call: Call,
        outcome: Outcome,
        data: bytes | None,
        error: BaseException | None,
    ) -> tuple[Outcome, BaseException | None]:
        """Hand the outcome to the scope, unless the lease was lost: then the leader
        gets LeaseLostError (the work's own error as its cause) and nothing lands."""
        arbiter = cast("DirectoryArbiter", self._arbiter)
        if _lost(flight, call):
            arbiter.land(call, None, flight.stragglers)
            return Outcome.LOST, _lease_lost(flight.key, error)
        wired, outcome, error = self._wired(flight, outcome, data, error)
        self._remember_cause(flight, wired, error)
        arbiter.land(call, wired, flight.stragglers)
        return outcome, error

    def _wired(
        self, flight: Flight, outcome: Outcome, data: bytes | None, error: BaseException | None
    ) -> tuple[Any, Outcome, BaseException | None]:
        """The outcome as the wire carries it. Describing a failure calls its str(),
        user code: interrupted there (a signal), the flight lands interrupted instead
        of stopping half way with the key held in the scope."""
        try:
            wired = _wide.to_wire(
                flight.key, outcome, data, error, flight.policy, self._max_value_bytes
            )
        except BaseException as exc:
            outcome, error = Outcome.INTERRUPTED, exc
            wired = _wide.to_wire(flight.key, outcome, None, exc, flight.policy, None)
        return wired, outcome, error

    def _remember_cause(
        self, flight: Flight, wired: object, error: BaseException | None
    ) -> None:
        """A failure landed that a group of this process may get back from the scope: a
        failure to be kept, or any while another group of this process has the scope
        (its joiners). Its error is kept for as long (and for the landing's way through
        the scope), for the ``__cause__`` of their FlightFailedError (API.md: "in the
        same process ``__cause__`` is E"; ADR 0023)."""
        if error is None or not isinstance(wired, _wide.Failure):
            return
        table = self._table
        if wired.keep or table.has_kin():
            if table.causes is None:
                with table.lock:  # leaders land on threads of their own
                    if table.causes is None:
                        table.causes = _wide.KeptCauses()
            table.causes.remember(
                flight.key, flight.token, error, (wired.keep or 0.0) + _wide.CAUSE_SLACK
            )

    def _land_fleet(
        self,
        flight: Flight,
        call: Call,
        outcome: Outcome,
        data: bytes | None,
        error: BaseException | None,
    ) -> tuple[Outcome, BaseException | None]:
        """Hand the outcome to Redis; the flight settles here when Redis took it, or
        as lost (LeaseLostError for the leader) when the flight is no longer ours.
        (Stragglers are not waited for: Redis has no key lock to keep.)"""
        fleet = self._fleet
        assert fleet is not None
        if _lost(flight, call):
            fleet.land(call, None)
            lost = _lease_lost(flight.key, error)
            self._settle_landed(flight, Outcome.LOST, None, lost, None)
            return Outcome.LOST, lost
        wired, outcome, error = self._wired(flight, outcome, data, error)
        if outcome is Outcome.INTERRUPTED:
            data = None

        def landed(fenced: bool, unconfirmed: UnavailableError | None) -> None:
            if fenced:
                if unconfirmed is None:
                    lost = _lease_lost(flight.key, error)
                else:
                    lost = _as_called(unconfirmed, flight)
                    if error is not None:  # the work's own failure, which it landed
                        lost.__cause__ = error
                self._settle_landed(flight, Outcome.LOST, None, lost, None)
            else:
                self._settle_landed(flight, outcome, None, error, data)

        self._remember_cause(flight, wired, error)
        fleet.land(call, wired, landed)
        return outcome, error

    def _will_retry(
        self, flight: Flight, number: int, outcome: Outcome, error: BaseException | None
    ) -> bool:
        """True if attempt ``number``, which just ended so, is followed by another; the
        flight is then RETRY_PENDING until ``next_attempt``."""
        if error is None or outcome is Outcome.INTERRUPTED:  # (callers test None first)
            return False
        if not flight.policy.retries(number, error, outcome is Outcome.TIMEOUT):
            return False
        return self._table.retry_pending(flight)

    def _land(
        self, flight: Flight, outcome: Outcome, value: Any, error: BaseException | None
    ) -> BaseException | None:
        """The landing: encode (with a codec), hand the outcome to the table, wake
        every waiter. Never raises; returns the BaseException that stopped the
        flight (the work's, or the codec's), which an async driver re-raises."""
        data = None
        codec = self._codec
        if codec is not None and outcome is Outcome.VALUE:
            try:
                data = encode_bytes(codec, value)
                limit = self._max_value_bytes
                if limit is not None and len(data) > limit:
                    raise ValueTooLargeError(flight.key, len(data), limit)
            except Exception as exc:
                outcome, value, error, data = Outcome.ERROR, None, exc, None
            except BaseException as exc:
                outcome, value, error, data = Outcome.INTERRUPTED, None, exc, None
            else:
                value = None
        # What stopped the work (an interrupt) stops the driver too, even when the lease
        # turns out lost and the callers get LeaseLostError instead.
        stop = error if outcome is Outcome.INTERRUPTED else None
        if flight.wide is not None:
            self._table.handing(flight)
            if self._fleet is not None:  # settled once Redis took the landing
                outcome, error = self._land_fleet(flight, flight.wide, outcome, data, error)
                return error if outcome is Outcome.INTERRUPTED else stop
            outcome, error = self._land_wide(flight, flight.wide, outcome, data, error)
            if outcome is Outcome.LOST or outcome is Outcome.INTERRUPTED:
                data = None
        retention = flight.policy.retention
        if retention is None or retention.max_bytes is None:  # no size to measure
            self._settle(flight, outcome, value, error, data)
        else:
            self._settle_landed(flight, outcome, value, error, data)
        return error if outcome is Outcome.INTERRUPTED else stop

    def _settle_landed(
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
                if outcome is Outcome.VALUE and retention.success:
                    size = len(data) if data is not None else estimate_size(value)
                elif outcome is Outcome.ERROR and retention.error:
                    size = estimate_size(error)
            except BaseException:
                # Interrupted while measuring (a signal in user code): every caller
                # still gets the outcome, which is not kept; the leader gets the
                # interrupt.
                self._settle(flight, outcome, value, error, data, UNMEASURED)
                raise
        self._settle(flight, outcome, value, error, data, size)

    def _settle(
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
        detached = self._table.settle(flight, outcome, value, error, data, size)
        if detached is not None:
            waiters, fresh = detached
            if waiters:
                wake(waiters, SETTLED)
            if fresh:
                following = flight.next
                wake(fresh, following if following is not None else CLOSED)

    def _deliver(self, flight: Flight, leader: bool) -> Result[Any]:
        """Turn a settled flight into this caller's return value or exception."""
        if flight.closed:  # the group closed while this caller's flight ran
            raise self._closed_error()
        outcome = flight.outcome
        if outcome is Outcome.VALUE:
            data = flight.data
            if data is not None:
                assert self._codec is not None
                return Result(self._codec.decode(data), not leader or flight.remote, flight.token)
            if leader:
                return Result(flight.value, False, flight.token)
            # One Result for every joiner (ADR 0003); setdefault is atomic, so two
            # threads that both found none still return the same object.
            shared = vars(flight)
            result: Result[Any] | None = shared.get("joined_result")
            if result is None:
                result = shared.setdefault(
                    "joined_result", Result(flight.value, True, flight.token)
                )
            return result
        error = flight.error
        assert error is not None
        if flight.remote:  # from the wide scope: every caller here is a joiner
            raise renewed(error)
        if leader:
            raise error
        if outcome is Outcome.LOST:
            raise FlightInterruptedError(flight.key, "its leader lost its lease") from None
        if outcome is Outcome.TIMEOUT:
            assert isinstance(error, FlightTimeoutError)
            raise FlightTimeoutError(flight.key, error.deadline) from None
        if outcome is Outcome.ERROR:
            description = flight.failure
            if description is None:  # a race here only makes the same tuple twice
                description = flight.failure = FlightFailedError.describe(flight.key, error)
            raise FlightFailedError.of(flight.key, error, description)
        raise FlightInterruptedError(
            flight.key, f"its work was stopped by {type(error).__qualname__}"
        ) from None

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
    ) -> _Coalesce:
        """Decorate an ``async def`` or a plain ``def`` so that concurrent calls with
        the same key share one run. The decorated function returns the value itself.

        ``key`` is called with the function's arguments and returns the call's key
        (without it, the key is the ``repr`` of the bound arguments: only for
        arguments whose repr says all that matters). Keys live in a namespace of the
        function's own (``module.qualname``, a lambda's with its line and a digest of
        its code, or ``name``), so two decorated functions never share a flight. The
        wrapper also has ``forget(*args, **kwargs)``.
        """
        if key is not None and not callable(key):
            raise TypeError("key must be a callable that returns the call's key")
        if name is not None and (not isinstance(name, str) or not name or "\x00" in name):
            raise ValueError("name must be a non-empty str without NUL characters")
        check_seconds("deadline", deadline, allow_zero=False, allow_inf=False)
        for field, given, kind in (
            ("retry", retry, Retry),
            ("retention", retention, Retention),
            ("limits", limits, Limits),
        ):
            if given is not None and not isinstance(given, kind):
                raise TypeError(f"{field} must be a {kind.__name__}, not {type(given).__name__}")
        policy = self._policy.override(deadline, retry, retention, limits)
        decorator: _Coalesce = _make_coalesce(self, key, name, policy)
        return decorator

    # -- the group --------------------------------------------------------------

    def forget(self, key: str) -> None:
        """Make the next call of ``key`` lead a new flight; drop a kept outcome.

        A flight in progress is detached, not stopped: its callers still get its
        outcome, and its late settling never touches the newer flight.

        Raises GroupClosedError if the group is closed (a wide scope would not hear it).
        """
        key = _check_key(key)
        if self._closed:
            raise self._closed_error()
        arbiter = self._arbiter
        if arbiter is None:
            self._table.forget(key)
            return
        wire_key = _plain_wire_key(key)
        arbiter.check_key(wire_key)  # a key the scope cannot carry changes nothing
        self._forget_wide(arbiter, key, wire_key, key)

    def _forget_wide(
        self, arbiter: Arbiter, tkey: Hashable, wire_key: str, key: str
    ) -> None:
        # Asking: until the scope confirms, it may still make a call join the old flight
        # (a run_sync on the loop of its work is refused meanwhile: _scope_blocks).
        self._table.forget(tkey, asking=True)
        try:
            arbiter.forget(wire_key)
        except UnavailableError as exc:
            if exc.key is None:  # the scope's own error: it concerns this key
                exc.key = key
            raise
        finally:
            self._table.forget_answered(tkey)
        # Again once the scope confirmed: a call of this group made in between may have
        # reached the scope first and joined the old flight, and the scope's notice of
        # the forget reaches its local flight later (fleet: at its next read). A call
        # made after forget() returned must not join it.
        self._table.forget(tkey)

    def _forget_op(self, tkey: Hashable) -> None:
        if self._closed:
            raise self._closed_error()
        arbiter = self._arbiter
        if arbiter is None:
            self._table.forget(tkey)
            return
        namespace, op = cast("tuple[str, str]", tkey)
        wire_key = f"\x00{namespace}\x00{op}"
        arbiter.check_key(wire_key)
        self._forget_wide(arbiter, tkey, wire_key, op)

    def stats(self) -> Stats:
        """A snapshot of this group's counters in this process."""
        return self._table.snapshot()  # type: ignore[no-any-return]

    @property
    def closed(self) -> bool:
        """True once the group is closed; in a forked child, also a wide group that was
        started in the parent (its thread was not copied: docs/adr/0014 and 0018)."""
        return self._closed

    def _closed_error(self) -> GroupClosedError:
        """API.md's GroupClosedError; when the group was not closed by close(), the reason
        is a note on it (shown in tracebacks; ``str()`` stays the contract's text)."""
        if self._closed_why is None:
            return GroupClosedError()
        from .wide import closed_in_fork

        return closed_in_fork(self._closed_why)

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
        self._closed = True
        for flight, waiters in self._table.close():
            if waiters:
                wake(waiters, CLOSED)
            flight.lose()
        if self._arbiter is not None:
            if self._finalizer is not None:
                self._finalizer.detach()
            self._arbiter.close()

    async def aclose(self) -> None:
        """Close the group (see :meth:`close`), without blocking the event loop."""
        if self._arbiter is None:
            self.close()
            return
        self._closed = True
        for flight, waiters in self._table.close():
            if waiters:
                wake(waiters, CLOSED)
            flight.lose()
        if self._finalizer is not None:
            self._finalizer.detach()
        await asyncio.to_thread(self._arbiter.close)

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
        scope = "process scope"
        if self._fleet is not None:
            scope = f"fleet {self._fleet.namespace!r}"
        elif self._arbiter is not None:
            scope = f"directory {cast('DirectoryArbiter', self._arbiter).directory!r}"
        return f"<FlightGroup {scope}, {state}, {len(self._table.flights)} flights>"


def _lost(flight: Flight, call: Call) -> bool:
    """The lease of the flight this process leads in a wide scope is lost."""
    lead = call.lead
    attempt = flight.attempt
    return (lead is not None and lead.lost) or (attempt is not None and attempt.revoked)


def _lease_lost(key: str, error: BaseException | None) -> BaseException:
    """What a leader that lost its lease raises: LeaseLostError, the work's own
    error as its cause (or the lease's own error, when the work raised that)."""
    if isinstance(error, LeaseLostError):
        return error
    lost = LeaseLostError(key)
    lost.__cause__ = error
    return lost


def _as_called(error: BaseException, flight: Flight) -> BaseException:
    """``error`` as the scope made it, keyed by the key it sent (a decorated function's
    carries its namespace): made again with the key as the caller gave it."""
    if isinstance(error, UnavailableError) and error.key is None:
        made = renewed(error)  # one scope's failure, shared by the calls it failed
        cast("UnavailableError", made).key = flight.key
        return made
    if isinstance(error, FlightError) and getattr(error, "key", flight.key) != flight.key:
        args = error._init_args()
        if args and args[0] == getattr(error, "key", None):
            return type(error)(flight.key, *args[1:])
    return error


def _wire_key(flight: Flight) -> str:
    """The key a flight has in a wide scope: a decorated function's keys carry its
    namespace ("NUL namespace NUL key"), so two functions never share a flight there
    either, nor a function and a plain key (see _plain_wire_key)."""
    tkey = flight.tkey
    if type(tkey) is str:
        return _plain_wire_key(tkey)
    namespace, op = cast("tuple[str, str]", tkey)  # a decorated function's
    return f"\x00{namespace}\x00{op}"


def _plain_wire_key(key: str) -> str:
    """A plain key in a wide scope: as it is, unless it starts with a NUL; then it
    starts with one more. A decorated function's key starts with a NUL and then its
    namespace, which is never empty and holds no NUL, so the kinds never meet."""
    return "\x00" + key if key.startswith("\x00") else key


def _time_out(attempt: Attempt, task: asyncio.Task[None] | None) -> None:
    """The deadline of an async attempt: its lease is lost and its work cancelled."""
    attempt.timed_out = True
    attempt.lose()
    if task is not None:
        task.cancel()


Ending = tuple[Outcome, Any, BaseException | None]


def _attempt_sync(attempt: Attempt, work: Callable[[], Any]) -> Ending:
    """One attempt of a sync work in this thread: every ending becomes an outcome."""
    reset = _CURRENT.set(attempt)
    try:
        value = work()
        if _is_awaitable(value):
            if inspect.iscoroutine(value):
                value.close()  # never awaited: close it quietly
            named = getattr(work, "func", work)  # a decorated plain def: its partial
            raise TypeError(
                f"the work {getattr(named, '__qualname__', type(named).__name__)} returned "
                f"{type(value).__name__}, an awaitable, to a sync call (run_sync(), or a "
                "decorated plain def); use await run(), or decorate an async def"
            )
    except Exception as exc:
        return Outcome.ERROR, None, exc
    except BaseException as exc:
        return Outcome.INTERRUPTED, None, exc
    finally:
        _CURRENT.reset(reset)
    return Outcome.VALUE, value, None


def _attempt_sync_with_deadline(
    attempt: Attempt,
    work: Callable[[], Any],
    deadline: float,
    returned: Callable[[Flight], None],
) -> Ending:
    """One attempt on a thread of its own, waited for until the deadline. A sync
    work cannot be stopped: past the deadline its lease is lost and it runs on,
    detached; its late ending goes to this attempt's own box, which nobody reads.
    ``returned(flight)`` is called on that thread once the work returned."""
    box: list[Ending] = []
    done = new_thread_waiter()
    ended = threading.Event()  # the work itself returned (for a wide scope's key lock)

    def body() -> None:
        try:
            box.append(_attempt_sync(attempt, work))
        finally:
            done.release()
            ended.set()
            returned(attempt.flight)

    threading.Thread(
        target=copy_context().run, args=(body,), name=f"flightgroup-work-{attempt.token}",
        daemon=True,
    ).start()
    if done.acquire(timeout=min(deadline, _WAIT_MAX)):
        return box[0]
    attempt.timed_out = True
    attempt.lose()
    flight = attempt.flight
    if flight.wide is not None:  # it still runs: its key lock must outlive it
        flight.stragglers = [*(flight.stragglers or ()), ended]
    return Outcome.TIMEOUT, None, FlightTimeoutError(flight.key, deadline)


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def _bind_wide() -> None:
    """Bind the module global ``_wide`` (see its comment)."""
    global _wide
    from . import wide

    _wide = wide


def _close_dropped(arbiter: Arbiter, name: str) -> None:
    """A wide group collected without close(): warn, as an unclosed socket does, and
    close its scope's machinery on a thread of its own (a collection may run on any
    thread, the group's own among them, and closing waits for landings)."""
    if getattr(arbiter, "_thread", None) is None:
        return  # never started (construction does no I/O): nothing to let go of
    # (stacklevel 1: a collection has no caller of the group's to point at)
    warnings.warn(
        f"unclosed {name}: close() it (or use it in a with block)", ResourceWarning, stacklevel=1
    )
    with contextlib.suppress(RuntimeError):  # no new thread (the interpreter ends)
        threading.Thread(target=arbiter.close, name="flightgroup-close", daemon=True).start()


def _forget_flights(ref: weakref.ref[FlightGroup], why: str) -> None:
    """(In a forked child of a started wide group) the flights copied from the
    parent have no thread here to end them: a call joining one would wait for ever.
    A new table, so every call reaches the arbiter, which raises."""
    group = ref()
    if group is not None:
        group._table = FlightTable(wide=True)
        group._closed = True
        group._closed_why = why
        if group._finalizer is not None:  # closed here: nothing to warn of or let go
            group._finalizer.detach()


def _start_thread(name: str, run: Callable[..., object], *args: Any) -> BaseException | None:
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


def _current_flight() -> Flight | None:
    """The flight whose work runs here, if any (the chain of I6)."""
    current = _CURRENT.get()
    return None if current is None else current.flight


def _is_awaitable(value: object) -> bool:
    """inspect.isawaitable without its ABC check (the hot path of run_sync)."""
    kind = type(value)
    if hasattr(kind, "__await__"):
        return True
    return kind is types.GeneratorType and bool(
        value.gi_code.co_flags & inspect.CO_ITERABLE_COROUTINE  # type: ignore[attr-defined]
    )


def _namespace_of(fn: Callable[..., Any]) -> str:
    """``fn``'s namespace: its module and qualified name (API.md). Every lambda of a
    scope has the qualified name ``<lambda>``, so a lambda's adds its first line and a
    digest of its code: two lambdas never share flights unless they are the same code
    at the same place, and one lambda has the same namespace in every process that runs
    its source on the same Python (ADR 0032)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise TypeError(
            f"coalesce() needs name= for a {type(fn).__name__} (it has no module and "
            "qualified name to make its keys' namespace from)"
        )
    if qualname.endswith("<lambda>"):
        code = getattr(inspect.unwrap(fn), "__code__", None)
        if isinstance(code, types.CodeType):
            return f"{module}.{qualname}@{code.co_firstlineno}:{_code_digest(code)}"
    return f"{module}.{qualname}"


def _code_digest(code: types.CodeType) -> str:
    """A digest of what ``code`` does, the same in every process of one Python version:
    its bytecode, names and constants, nested code objects by their own content (their
    repr holds an address), a frozenset's members in sorted order (its repr's order
    follows the string hash, which differs between processes). The line is left out:
    lines typed at a prompt or in a notebook's cells all start at 1."""
    digest = hashlib.blake2b(digest_size=8)

    def feed(value: object) -> None:
        if isinstance(value, types.CodeType):
            digest.update(b"c" + value.co_code)
            for part in (value.co_names, value.co_varnames, value.co_freevars, value.co_consts):
                feed(part)
        elif isinstance(value, tuple):
            digest.update(b"(%d" % len(value))
            for item in value:
                feed(item)
        elif isinstance(value, frozenset):
            digest.update(b"{%d" % len(value))
            for text in sorted(repr(item) for item in value):
                digest.update(text.encode() + b"\0")
        else:
            digest.update(repr(value).encode() + b"\0")

    feed(code)
    return digest.hexdigest()


def _make_coalesce(
    group: FlightGroup, key: Callable[..., str] | None, name: str | None, policy: FlightPolicy
) -> Any:
    def decorate(fn: Any) -> Any:
        if isinstance(fn, (classmethod, staticmethod)):  # above it: the same kind back
            return type(fn)(decorate(fn.__func__))
        if not callable(fn):
            raise TypeError("coalesce() decorates a function")
        namespace = name or _namespace_of(fn)
        if key is None:
            signature = inspect.signature(fn)

            def key_of(*args: Any, **kwargs: Any) -> str:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                return repr(tuple(bound.arguments.items()))
        else:
            key_of = key

        def op_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[str, str], str]:
            op = _check_key(key_of(*args, **kwargs))
            return (namespace, op), op

        if inspect.iscoroutinefunction(inspect.unwrap(fn)) or inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                tkey, op = op_key(args, kwargs)
                return (await group._run_op(tkey, op, lambda: fn(*args, **kwargs), policy)).value

            wrapper: Any = async_wrapper
        else:

            @functools.wraps(fn)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                tkey, op = op_key(args, kwargs)
                if group._closed:
                    raise group._closed_error()
                work = functools.partial(fn, *args, **kwargs)
                return group._call_sync(tkey, op, work, policy).value

            wrapper = sync_wrapper

        def forget(*args: Any, **kwargs: Any) -> None:
            group._forget_op(op_key(args, kwargs)[0])

        wrapper.forget = forget
        wrapper.flight_namespace = namespace
        return wrapper

    return decorate
