"""The fields of a flight table that each of its parts reads, and the one step they
share: a caller leads an IDLE flight (``_lead``).

The table (``engine/table.py``) is one class made of parts, one concern each: what a
call meets (``table.py``), fresh callers and their claims (``fresh.py``), takeovers
(``takeover.py``) and kept outcomes (``kept.py``). Each part derives from
:class:`TableState` and adds no field, so the table's instances keep one slot layout
and its methods are found as fast as those of one class.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from .flight import IDLE, RUNNING, Attempt, Flight

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from ..policy import FlightPolicy
    from ..retention import RetentionStore
    from ..stats import Recorder

__all__ = ["F", "TableState"]

F = TypeVar("F", bound=Flight)


class TableState(Generic[F]):
    """What every part of a flight table reads and writes, under ``lock`` (set by
    ``FlightTable.__init__``)."""

    __slots__ = (
        "__weakref__",
        "_clock",
        "_evict_log_at",
        "_next_token",
        "closed",
        "detached",
        "flights",
        "kept",
        "lock",
        "stats",
    )

    # The class of the flights it makes (a wide table's carry what its scope adds).
    flight_type: ClassVar[type[Flight]] = Flight
    # Flights counted as a flight starts: a wide table counts one when its scope lets
    # the work run here (``ran_here``), never before (counters only grow).
    lead_counts: ClassVar[int] = 1

    lock: threading.Lock
    flights: dict[Hashable, F]
    # flights that left the table by forget() but still run
    detached: set[F]
    # kept outcomes (Retention): settled flights, made on the first one kept
    kept: RetentionStore | None
    _clock: Callable[[], float]
    stats: Recorder
    closed: bool
    _next_token: int
    _evict_log_at: float

    def _lead(self, flight: F, policy: FlightPolicy) -> None:
        """(Under the lock) a caller leads IDLE ``flight``: it runs under a new token."""
        flight._move(IDLE, RUNNING)
        self._next_token += 1
        flight.token = self._next_token
        flight.attempt = Attempt(flight, flight.token)
        flight.policy = policy
        stats = self.stats
        stats.flights += self.lead_counts
        stats.in_flight += 1
        flight.started = time.perf_counter_ns()
