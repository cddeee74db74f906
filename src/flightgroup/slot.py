"""GroupSlot: operations declared at import, served by a group the application opens.

A module decorates its functions on a slot (``@flights.coalesce(...)``) before any group
exists; the application opens a group into the slot at startup (``flights.open(...)``, or
``flights.bind(group)`` for a group made elsewhere) and closes it at shutdown, and may
open another later: a second ``TestClient(app)``, a fresh group per test. The decorated
functions never change; each reads its group and its policy from one attribute, replaced
whole on open and close (ADR 0044).

Invariant: every operation of a slot is bound to the same group, or all are unbound; a
bind or an unbind replaces each operation's pair under the slot's lock, so two binds never
interleave. A call that read the pair just before an unbind goes on in that group, which
the unbind's close then ends for it as for any call waiting in a closed group.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

from .codec import Codec, operation_codec
from .configure import OperationSettings, check_operation
from .decorator import Operation, _Coalesce, make_coalesce
from .errors import GroupClosedError
from .group import FlightGroup
from .policy import (
    NO_POLICY,
    FlightPolicy,
    Limits,
    OnUnavailable,
    Retention,
    Retry,
)

if TYPE_CHECKING:
    from .engine.flight import Result

__all__ = ["GroupSlot"]


class GroupSlot:
    """Where operations are declared before their group exists.

    ``@slot.coalesce(...)`` decorates as ``FlightGroup.coalesce`` does (same arguments,
    same typing, ``forget`` and ``options``). The decorated functions serve the group
    the slot holds at the time of each call:

    - ``with slot.open(**group_args) as group`` / ``async with slot.open(...)``: makes a
      ``FlightGroup(**group_args)``, puts it in the slot, and at the block's end takes it
      out and closes it. The slot may be opened again afterwards.
    - ``slot.bind(group)`` / ``slot.unbind()``: put a group made elsewhere in the slot
      and take it out again (the caller closes it).

    A call while the slot holds no group raises GroupClosedError, with a note that says
    to open the slot. Calls waiting in the group when the slot closes it raise
    GroupClosedError, as for ``FlightGroup.close()``. Binding while a group is in the
    slot raises RuntimeError: one application, one group at a time.
    """

    __slots__ = ("__weakref__", "_group", "_lock", "_name", "_operations", "_unbound")

    def __init__(self, name: str = "flights") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._group: FlightGroup | None = None
        self._unbound = _Unbound(name)
        # Every operation declared on the slot, with its policy overrides.
        self._operations: weakref.WeakKeyDictionary[Operation, _Overrides] = (
            weakref.WeakKeyDictionary()
        )

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
        """Decorate a function as ``FlightGroup.coalesce`` does; its calls go to the
        group the slot holds when they are made, under that group's policy with this
        operation's overrides (a typed ``codec``, or the group's, is made for the
        function's return type when a group is bound). Arguments are checked here, at
        import."""
        settings = check_operation(
            key=key, name=name, deadline=deadline, retry=retry, retention=retention,
            limits=limits, on_unavailable=on_unavailable, takeover=takeover, codec=codec,
        )

        def new_operation(fn: Callable[..., Any], namespace: str) -> Operation:
            overrides = _Overrides(settings, fn=fn, namespace=namespace)
            with self._lock:
                group = self._group
                operation = Operation(
                    (self._unbound, NO_POLICY) if group is None
                    else (group, overrides.under(group))
                )
                self._operations[operation] = overrides
            return operation

        decorator: _Coalesce = make_coalesce(None, key, name, None, new_operation)
        return decorator

    # -- the group's life ---------------------------------------------------------

    @property
    def group(self) -> FlightGroup:
        """The group in the slot. Raises GroupClosedError (with a note) when there is
        none."""
        group = self._group
        if group is None:
            raise self._unbound._closed_error()
        return group

    @property
    def bound(self) -> bool:
        """True while a group is in the slot."""
        return self._group is not None

    def bind(self, group: FlightGroup) -> None:
        """Put ``group`` in the slot: every operation declared on it (and declared
        later) calls into ``group`` until :meth:`unbind`. Raises RuntimeError when a
        group is in the slot already, TypeError for anything but a FlightGroup."""
        if not isinstance(group, FlightGroup):
            raise TypeError(f"bind() takes a FlightGroup, not {type(group).__name__}")
        with self._lock:
            if self._group is not None:
                raise RuntimeError(
                    f"{self._name} holds a group already: unbind() it (or close the "
                    "block that opened it) first"
                )
            # Every policy first: a codec that refuses a function's type (raised here)
            # leaves the slot as it was.
            bound = [(op, (group, overrides.under(group)))
                     for op, overrides in list(self._operations.items())]
            self._group = group
            for operation, pair in bound:
                operation.bound = pair

    def unbind(self) -> FlightGroup | None:
        """Take the group out of the slot (not closing it) and return it (None if the
        slot was empty). Later calls raise GroupClosedError until the next bind."""
        with self._lock:
            group, self._group = self._group, None
            for operation in list(self._operations):
                operation.bound = (self._unbound, NO_POLICY)
        return group

    @contextmanager
    def _opened_sync(self, group: FlightGroup) -> Iterator[FlightGroup]:
        try:
            self.bind(group)
        except BaseException:
            group.close()  # (made for this block only; nothing started yet)
            raise
        try:
            yield group
        finally:
            self._unbind_own(group)
            group.close()

    @asynccontextmanager
    async def _opened_async(self, group: FlightGroup) -> AsyncIterator[FlightGroup]:
        try:
            self.bind(group)
        except BaseException:
            await group.aclose()  # (made for this block only; nothing started yet)
            raise
        try:
            yield group
        finally:
            self._unbind_own(group)
            await group.aclose()

    def _unbind_own(self, group: FlightGroup) -> None:
        """Unbind, if the slot still holds ``group`` (a test may have unbound it)."""
        if self._group is group:
            self.unbind()

    def open(self, **group_args: Any) -> _Opening:
        """Make ``FlightGroup(**group_args)`` and hold it in the slot for a ``with`` or
        ``async with`` block, which gives the group; at the block's end the slot lets go
        of it and closes it (``aclose()`` under ``async with``). The group is made (its
        arguments checked) when the block starts."""
        return _Opening(self, group_args)

    def __repr__(self) -> str:
        return f"<GroupSlot {self._name!r}, {'bound' if self._group is not None else 'empty'}>"


class _Opening:
    """What :meth:`GroupSlot.open` returns: a context manager for ``with`` and for
    ``async with``."""

    __slots__ = ("_args", "_async", "_slot", "_sync")

    def __init__(self, slot: GroupSlot, args: dict[str, Any]) -> None:
        self._slot = slot
        self._args = args
        self._sync: Any = None
        self._async: Any = None

    def __enter__(self) -> FlightGroup:
        self._sync = self._slot._opened_sync(FlightGroup(**self._args))
        group: FlightGroup = self._sync.__enter__()
        return group

    def __exit__(self, *exc_info: Any) -> None:
        self._sync.__exit__(*exc_info)

    async def __aenter__(self) -> FlightGroup:
        self._async = self._slot._opened_async(FlightGroup(**self._args))
        group: FlightGroup = await self._async.__aenter__()
        return group

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._async.__aexit__(*exc_info)


class _Overrides:
    """An operation's own policy settings, applied over each group it is bound to, and
    the function and namespace its codec is made for."""

    __slots__ = ("_fn", "_namespace", "_settings")

    def __init__(
        self, settings: OperationSettings, *, fn: Callable[..., Any], namespace: str
    ) -> None:
        self._settings = settings
        self._fn = fn
        self._namespace = namespace

    def under(self, group: FlightGroup) -> FlightPolicy:
        """The operation's policy in ``group``: the group's, with these overrides, its
        codec made for the function's declared return type (a typed codec)."""
        policy = self._settings.over(group._policy)
        return policy.with_codec(operation_codec(policy.codec, self._fn, self._namespace))


class _Unbound:
    """The group of an empty slot's operations: every call raises GroupClosedError,
    with a note naming the slot and what to do."""

    __slots__ = ("_name",)

    _closed = True

    def __init__(self, name: str) -> None:
        self._name = name

    def _closed_error(self) -> GroupClosedError:
        error = GroupClosedError()
        error.add_note(
            f"{self._name} (a GroupSlot) holds no group: open one "
            f"(with/async with {self._name}.open(...)) or bind one ({self._name}.bind(group))"
        )
        return error

    async def _run_op(self, *args: Any, **kwargs: Any) -> Result[Any]:
        raise self._closed_error()

    async def _run_op_with(self, *args: Any, **kwargs: Any) -> Result[Any]:
        raise self._closed_error()

    def _call_sync(self, *args: Any, **kwargs: Any) -> Result[Any]:
        raise self._closed_error()

    def _call_sync_with(self, *args: Any, **kwargs: Any) -> Result[Any]:
        raise self._closed_error()

    def _forget_op(self, *args: Any) -> None:
        raise self._closed_error()

