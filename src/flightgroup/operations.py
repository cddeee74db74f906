"""The calls of decorated functions (``FlightGroup.coalesce``): a decorated call arrives
at the table under its operation's namespaced key and policy, plainly or with per-call
options (``fn.options(...)``), and ``forget`` of its arguments' key. The wrapper
(``decorator.py``) has checked the key; these run the call as ``run``/``run_sync`` do.

:class:`Operations` is a part of :class:`~flightgroup.group.FlightGroup` (its base).
"""

from __future__ import annotations

import asyncio
from asyncio import events
from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, TypeVar, cast

from .engine.eager import current_task_of
from .engine.flight import (
    KEPT,
    LEAD,
    LEADING,
    Result,
    new_thread_waiter,
)
from .lease import _CURRENT
from .waiting import Waiting, warn_blocks_loop

if TYPE_CHECKING:
    from .policy import FlightPolicy
    from .scope.interface import Scope

__all__ = ["Operations"]

T = TypeVar("T")


class Operations(Waiting):
    """The decorated functions' calls of a group (see the module)."""

    __slots__ = ()

    _closed: bool
    _scope: Scope | None

    async def _run_op(
        self, tkey: Hashable, key: str, work: Callable[[], Awaitable[T]], policy: FlightPolicy
    ) -> Result[T]:
        """``run`` for a decorated function: ``tkey`` is its namespaced key. Returns the
        Result (the wrapper takes its value; a traced group reads its token)."""
        if self._closed:
            raise self._closed_error()
        if self._table.kept is not None:  # (as run's: before the loop, even if cancelling)
            kept = self._kept_now(tkey)
            if kept is not None:
                return kept
        loop = events.get_running_loop()
        task = current_task_of(loop)
        if task is not None and task.cancelling():
            raise asyncio.CancelledError()
        current = _CURRENT.get()
        chain = None if current is None else current.flight
        role, flight, waiter = self._table.arrive(
            tkey,
            key,
            fresh=False,
            make_waiter=loop.create_future,
            chain=chain,
            blocking_loop=None,
            policy=policy,
        )
        if role is LEAD:
            self._attempts.start_async(flight, work, loop, chain)
            if flight.outcome is not None:
                return self._deliver(flight, True)
            return await self._lead_waiting(flight, work, loop, policy)
        if role is KEPT:
            return self._deliver(flight, False)
        return await self._follow(role, flight, waiter, work, None, None, loop, policy)


    async def _run_op_with(
        self,
        tkey: Hashable,
        key: str,
        work: Callable[[], Awaitable[T]],
        policy: FlightPolicy,
        *,
        on_join: Callable[[], object] | None,
        timeout: float | None,
        fresh: bool,
    ) -> Result[T]:
        """``run`` for a decorated function called with options (``fn.options(...)``,
        checked there): as :meth:`run`'s, over the namespaced key ``tkey``."""
        if self._closed:
            raise self._closed_error()
        if timeout is not None and timeout <= 0:
            raise TimeoutError(f"timeout of 0 s for {key!r}: the call neither led nor joined")
        if self._table.kept is not None and not fresh:
            kept = self._kept_now(tkey)
            if kept is not None:
                return kept
        loop = events.get_running_loop()
        task = current_task_of(loop)
        if task is not None and task.cancelling():
            raise asyncio.CancelledError()
        current = _CURRENT.get()
        chain = None if current is None else current.flight
        role, flight, waiter = self._table.arrive(
            tkey,
            key,
            fresh=fresh,
            make_waiter=loop.create_future,
            chain=chain,
            blocking_loop=None,
            policy=policy,
        )
        if role is LEAD:
            self._attempts.start_async(flight, work, loop, chain)
            if flight.outcome is not None:  # the work finished eagerly: no waiting
                if on_join is not None and self._bridge is not None and flight.joined_remote:
                    on_join()  # (wide scopes) it joined elsewhere, and the outcome came
                return self._deliver(flight, True)
            role = LEADING
        elif role is KEPT:
            return self._deliver(flight, False)
        return await self._follow(role, flight, waiter, work, on_join, timeout, loop, policy)


    def _call_sync(
        self, tkey: Hashable, key: str, work: Callable[[], T], policy: FlightPolicy
    ) -> Result[T]:
        """``run_sync`` for a decorated function: ``tkey`` is its namespaced key."""
        current = _CURRENT.get()
        parent = None if current is None else current.flight
        loop = events._get_running_loop()
        if loop is not None:
            namespace, op = cast("tuple[str, str]", tkey)
            warn_blocks_loop(f"{namespace}({op!r})", stacklevel=4)
        role, flight, waiter = self._table.arrive(
            tkey, key, fresh=False, make_waiter=new_thread_waiter, chain=parent,
            blocking_loop=loop, policy=policy,
        )
        if role is KEPT:
            return self._deliver(flight, False)
        if role is LEAD and self._scope is None:
            self._attempts.drive_sync(flight, work, parent)
            return self._deliver(flight, True)
        return self._follow_sync(role, flight, waiter, work, None, None, policy)


    def _call_sync_with(
        self,
        tkey: Hashable,
        key: str,
        work: Callable[[], T],
        policy: FlightPolicy,
        *,
        on_join: Callable[[], object] | None,
        timeout: float | None,
        fresh: bool,
    ) -> Result[T]:
        """``run_sync`` for a decorated function called with options
        (``fn.options(...)``, checked there): as :meth:`run_sync`'s, over the
        namespaced key ``tkey``; with a ``timeout`` the leader's work runs on a thread
        of its own."""
        if self._closed:
            raise self._closed_error()
        if timeout is not None and timeout <= 0:
            raise TimeoutError(f"timeout of 0 s for {key!r}: the call neither led nor joined")
        current = _CURRENT.get()
        parent = None if current is None else current.flight
        loop = events._get_running_loop()
        if loop is not None:
            namespace, op = cast("tuple[str, str]", tkey)
            warn_blocks_loop(f"{namespace}({op!r})", stacklevel=4)
        role, flight, waiter = self._table.arrive(
            tkey, key, fresh=fresh, make_waiter=new_thread_waiter, chain=parent,
            blocking_loop=loop, policy=policy,
        )
        if role is KEPT:
            return self._deliver(flight, False)
        return self._follow_sync(role, flight, waiter, work, on_join, timeout, policy)


    def _forget_op(self, tkey: Hashable) -> None:
        if self._closed:
            raise self._closed_error()
        bridge = self._bridge
        if bridge is None:
            self._table.forget(tkey)
            return
        from .scope.bridge import op_scope_key

        namespace, op = cast("tuple[str, str]", tkey)
        sent = op_scope_key(namespace, op)
        bridge.scope.check_key(sent)
        bridge.forget(tkey, sent, op)
