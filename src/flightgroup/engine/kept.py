"""The flight table's kept outcomes (Retention): which settled flights it keeps, how a
later call is served from one, and what it says when the bounds evict them.

A part of :class:`~flightgroup.engine.table.FlightTable` (see ``tablestate.py``); the
store itself is :class:`~flightgroup.retention.RetentionStore`.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Final

from .._log import log
from ..errors import GroupClosedError
from ..retention import RetentionStore
from .flight import Flight, Outcome, Result, _kept_flight
from .tablestate import F, TableState

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..policy import Retention

__all__ = ["UNMEASURED", "KeptOutcomes"]

# The size of an outcome that could not be measured for Retention: it is not kept.
UNMEASURED: Final = -1


class KeptOutcomes(TableState[F]):
    """The flight table's part that keeps outcomes and serves calls from them."""

    __slots__ = ()

    def use_clock(self, clock: Callable[[], float]) -> None:
        """Drive retention with ``clock`` (tests use a fake one)."""
        with self.lock:
            self._clock = clock
            if self.kept is not None:
                self.kept._clock = clock

    def take_kept(self, tkey: Hashable) -> Flight | Result[Any] | None:
        """The kept outcome of ``tkey`` if there is one and no flight of the key runs:
        the Result to return, or the settled flight to deliver from. The hot path of
        Retention, before ``arrive``."""
        with self.lock:
            if self.closed:
                raise GroupClosedError()
            kept = self.kept
            if kept is None or tkey in self.flights:
                return None
            entry = kept.get(tkey)
            if entry is None:
                return None
            stats = self.stats
            stats.calls += 1
            stats.joins += 1
            return entry.payload  # type: ignore[no-any-return]

    def _serve_kept(self, tkey: Hashable) -> Flight | None:
        """(Under the lock, ``arrive`` finding no flight of ``tkey`` and a store of kept
        outcomes) the settled flight that serves a call from the key's kept outcome,
        counted as a join; None if none is kept."""
        assert self.kept is not None
        entry = self.kept.get(tkey)
        if entry is None:
            return None
        stats = self.stats
        stats.calls += 1
        stats.joins += 1
        return _kept_flight(entry.payload)

    def _keep(self, flight: F, size: int) -> None:
        """Keep a settled flight's outcome for later calls (Retention)."""
        retention = flight.policy.retention
        assert retention is not None
        ok = flight.outcome is Outcome.VALUE
        ttl = retention.success if ok else retention.error
        # A timeout or an interruption teaches nothing worth keeping; either way the
        # key's older kept outcome (a fresh call led past it) is no longer its latest.
        if not ttl or (not ok and flight.outcome is not Outcome.ERROR) or size == UNMEASURED:
            if self.kept is not None:
                self.kept.discard(flight.tkey)
            return
        if self.kept is None:
            self.kept = RetentionStore(retention.max_items, retention.max_bytes, self._clock)
        flight.parent = None  # a kept flight holds its outcome, nothing else
        flight.task = None
        flight.loop = None
        # A kept value (without a codec) is kept as the one Result every call it serves
        # returns (ADR 0003); a failure, or encoded data, as the settled flight itself.
        payload: Flight | Result[Any] = flight
        if ok and flight.data is None:
            payload = Result(flight.value, True, flight.token)
        kept = self.kept
        evicted = kept.evicted
        # The flight's own bounds (an operation's Retention may differ from the group's).
        kept.put(
            flight.tkey, ok, payload, flight.token, ttl, size,
            (retention.max_items, retention.max_bytes),
        )
        if kept.evicted != evicted:
            self._evicted(kept, retention)

    def _evicted(self, kept: RetentionStore, retention: Retention) -> None:
        """Say (at most once a minute) that the bounds evict kept outcomes: a bound
        that is too small turns retention into a miss."""
        now = time.monotonic()
        if now < self._evict_log_at:
            return
        self._evict_log_at = now + 60.0
        log.info(
            "retention evicted %d kept outcomes so far (max_items=%d, max_bytes=%s); "
            "raise the bounds if later calls should find them", kept.evicted,
            retention.max_items, retention.max_bytes,
        )
