"""The fake's coordinator (:class:`FakeCoordinator`): the groups it makes (each a
"process" over a :class:`~._scope.FakeScope`) and the hooks a test forces what real
scopes suffer with. Its decisions are its :class:`~._table.FakeTable`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from ..codec import Codec
from ..configure import MAX_FRAME, configure
from ..engine.workers import MAX_DEADLINE_THREADS
from ..group import FlightGroup, internals
from ..policy import Limits, OnUnavailable, Retention, Retry
from ..scope.events import ScopeEvent
from ._scope import FakeScope
from ._table import FakeTable

__all__ = ["FAKE_MAX_VALUE", "FakeCoordinator"]

FAKE_MAX_VALUE = 1024 * 1024  # a fake group's default max_value_bytes (as the fleet's)

_serials = itertools.count(1)  # names each coordinator (its groups' identity)


class FakeCoordinator:
    """The fake's one decision point, shared by the groups it makes (see the module);
    it decides on its table of flights (:class:`~._table.FakeTable`).

    ``max_key_length``: longer keys are refused (ValueError), as a scope refuses a key
    it cannot carry. ``clock``: the time of kept outcomes, flight ages and status;
    by default the fake's own, which moves only by :meth:`advance`. ``serial`` names
    this coordinator (its groups' identity)."""

    def __init__(
        self,
        *,
        max_key_length: int | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.serial = next(_serials)
        self.max_key_length = max_key_length
        self._now = 0.0  # the fake's own clock (advance() moves it)
        self._clock = clock if clock is not None else self._fake_time
        self._pids = itertools.count(1)
        self._table = FakeTable(self._clock)

    # -- making groups -----------------------------------------------------------

    def scope(self, pid: int | None = None) -> FakeScope:
        """A new "process" of this coordinator (``pid``: its fake process id; by
        default the next of 1, 2, 3, ...)."""
        return FakeScope(self, next(self._pids) if pid is None else pid)

    def group(
        self,
        *,
        codec: Codec | None,
        deadline: float | None = None,
        retry: Retry | None = None,
        retention: Retention | None = None,
        limits: Limits | None = None,
        on_unavailable: OnUnavailable = "raise",
        takeover: int = 0,
        max_value_bytes: int | None = None,
        max_deadline_threads: int = MAX_DEADLINE_THREADS,
        pid: int | None = None,
    ) -> FlightGroup:
        """A FlightGroup over a new "process" of this coordinator. Arguments as
        FlightGroup's (checked the same way); a codec is needed, as in every wide scope;
        ``max_value_bytes`` defaults to 1 MiB (the fleet's)."""
        if codec is None:
            raise TypeError("a fake group needs a codec (for example codec=flightgroup.JSON)")
        made = configure(
            directory=None, redis=None, namespace=None, codec=codec, deadline=deadline,
            retry=retry, retention=retention, limits=limits, on_unavailable=on_unavailable,
            takeover=takeover, max_value_bytes=max_value_bytes,
            lease=10.0, cluster=False, reconnect_timeout=5.0, max_frame_bytes=MAX_FRAME,
            max_deadline_threads=max_deadline_threads,
        )
        scope = self.scope(pid)
        return FlightGroup._over(dataclasses.replace(
            made,
            scope=scope,
            max_value_bytes=FAKE_MAX_VALUE if max_value_bytes is None else max_value_bytes,
            named=f"fake.group(pid={scope.pid})",
        ))

    @staticmethod
    def scope_of(group: FlightGroup) -> FakeScope:
        """The fake scope ``group`` was made over (TypeError for any other group)."""
        scope = internals(group).scope
        if not isinstance(scope, FakeScope):
            raise TypeError("this group is not a fake group")
        return scope

    # -- hooks -------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the fake's own clock (kept outcomes expire by it) ``seconds`` on."""
        with self._table.lock:
            self._now += seconds

    def unreachable(self, flag: bool = True) -> None:
        """While set, the fake cannot be heard: every submit, forget and status raises
        UnavailableError (the call's callers get it). Leads and joins already made go on."""
        with self._table.lock:
            self._table.unreachable = flag

    @contextlib.contextmanager
    def hold(self, key: str | None = None) -> Iterator[None]:
        """Within the block, the fake still decides at once, but its answers about
        ``key`` (every key when None) wait: events and a landing's ``done``. They are
        delivered, in order, when the block ends."""
        with self._table.lock:
            if key in self._table.held:
                raise RuntimeError(f"{key!r} is held already")
            self._table.held[key] = []
        try:
            yield
        finally:
            self.release(key)

    def release(self, key: str | None = None) -> None:
        """Deliver what a :meth:`hold` of ``key`` kept back, and stop holding it."""
        self._table.release(key)

    def drop_next(self, kind: type[ScopeEvent], count: int = 1) -> None:
        """The next ``count`` events of class ``kind`` (Joined, Landed, ...) put to any
        call are lost: a call whose last event is dropped waits until its group closes."""
        with self._table.lock:
            self._table.drops[kind] = self._table.drops.get(kind, 0) + count

    def lose_lease(self, key: str) -> int:
        """The lead of ``key``'s running flight loses its lease now: its work hears it
        (``lease.lost``), its landing is refused (its callers: LeaseLostError, local
        joiners FlightInterruptedError), joiners elsewhere get NoOutcome; the key is free
        for a new flight. Returns the lost flight's token; LookupError if none runs."""
        return self._table.lose_lease(key)

    def kill(self, group: FlightGroup | FakeScope) -> None:
        """``group``'s "process" dies: the flights it leads end for their joiners
        elsewhere (NoOutcome), its leads lose their leases, its waiting calls end
        (UnavailableError, or NoOutcome for a joined one), its later calls raise
        UnavailableError. Its work, if running, runs on unheard."""
        scope = group if isinstance(group, FakeScope) else self.scope_of(group)
        self._table.close(scope, killed=True)

    def status(self) -> list[dict[str, Any]]:
        """The flights in progress, as a scope's ``status()`` says them (for tests)."""
        with self._table.lock:
            return self._table.flights_now()

    def kept(self, key: str) -> bool:
        """True if an outcome of ``key`` is kept and live now (not counted as a use)."""
        with self._table.lock:
            # Read past get(): a look from a test must not count as a use (LRU).
            entry = self._table.kept._entries.get(key)
            return entry is not None and self._clock() < entry.expires

    def _fake_time(self) -> float:
        return self._now
