"""What a wide table does with its scope's answer to a flight's call: the work runs
here (``ran_here``), the flight joined one led elsewhere (``joined_remote``), or it ended
without its work running here (``ran_elsewhere``); until the answer, a joiner's on_join
waits (``defer_on_join``). The bridge (``bridge.py``) calls these as the answers come.

A part of :class:`~.table.WideTable`, as the engine's table is made of parts
(``engine/tablestate.py``): it adds no field.
"""

from __future__ import annotations

from ..engine.flight import DONE, RUNNING, SETTLING, Counts, Waiter
from ..engine.tablestate import TableState
from ..errors import GroupClosedError
from .flight import WideFlight

__all__ = ["ScopeAnswers"]


class ScopeAnswers(TableState[WideFlight]):
    """The wide table's part that records its scope's answers (the bridge's calls)."""

    __slots__ = ()

    def ran_here(self, flight: WideFlight, *, local: bool = False) -> list[Waiter] | None:
        """(Wide scopes) the scope let ``flight``'s work run here: count the flight.
        ``local``: the scope could not be reached and the flight runs in this process
        alone (``on_unavailable="local"``): its end is no flight of the scope's.

        Its fresh callers came while it waited for the scope's answer, so before its
        work starts: they join it (ADR 0005: the next flight to start is this one)
        instead of waiting for its end and leading one more. Returns them, detached,
        to wake with JOINED; each then joins through ``claim(claimed=False)``. So are
        the joiners whose on_join waited for the answer (``defer_on_join``).

        Raises GroupClosedError once the group closed: no work starts after close().
        """
        with self.lock:
            if self.closed:
                raise GroupClosedError()
            self.stats.flights += 1
            flight.scoped = not local
            flight.led_here = True
            if local:
                flight.local = True
                self.stats.local_flights += 1
            deferred = self._decided(flight)
            fresh = flight.fresh
            if not fresh or flight.state is not RUNNING:
                return deferred
            flight.fresh = None
            if deferred:
                flight.promoted = flight.promoted.union(fresh)
                return [*deferred, *fresh]
            flight.promoted = frozenset(fresh)
            return fresh

    def defer_on_join(self, flight: WideFlight, waiter: Waiter) -> bool | None:
        """(A joiner with an on_join) whether its on_join runs now: True, the flight
        is decided; None, it waits for the scope's
        answer (its waiter is woken with JOINED then, or SETTLED by a kept outcome);
        False, the flight ended before the scope let it run or join anywhere (a kept
        outcome, or the scope's failure to serve it): no on_join."""
        with self.lock:
            if flight.decided:
                return True
            if flight.state is DONE or waiter not in flight.waiters:
                return False  # woken already (settled or closed) while undecided
            if flight.deferred is None:
                flight.deferred = [waiter]
            else:
                flight.deferred.append(waiter)
            return None

    def _decided(self, flight: WideFlight) -> list[Waiter] | None:
        """Mark ``flight`` decided; detach the joiners whose on_join waited for it
        (under the lock), to wake with JOINED."""
        flight.decided = True
        deferred = flight.deferred
        if deferred is None:
            return None
        flight.deferred = None
        waiters = flight.waiters
        woken = [w for w in deferred if waiters.pop(w, False) is None]
        if woken:
            flight.promoted = flight.promoted.union(woken)
        return woken or None

    def handing(self, flight: WideFlight) -> None:
        """(Wide scopes) the landing of ``flight`` goes to the scope now (SETTLING): a
        fresh caller that comes from here on may come after the scope began the next
        flight. (A retry given up as the group closed lands from RETRY_PENDING.)"""
        with self.lock:
            if flight.state is RUNNING:
                flight._move(RUNNING, SETTLING)

    def ran_elsewhere(self, flight: WideFlight, joined: bool, unserved: bool = False) -> None:
        """(Wide scopes) ``flight`` ended without its work running here: its leading
        caller counts as a join if it had a flight's outcome from elsewhere (``joined``),
        unless it was counted when the flight joined; a call the scope could not serve
        (``unserved``: unreachable, closed) is no join, and counts nothing at its end
        unless the scope had answered it first."""
        with self.lock:
            flight.scoped = False  # it ended elsewhere, maybe before it ended here
            if joined and not flight.joined_remote:
                self.stats.joins += 1
            elif unserved and not flight.decided:
                flight.unserved = True
                if flight.counts is not Counts.FORKED:
                    flight.counts = Counts.NOTHING  # no flight, no join: nothing to count

    def joined_remote(self, flight: WideFlight) -> list[Waiter] | None:
        """(Wide scopes) ``flight`` joined a flight led elsewhere: mark it, and detach
        the leading caller's waiter if it waits, and the joiners whose on_join waited
        for the answer, to wake them with JOINED."""
        with self.lock:
            if not flight.joined_remote:  # a rejoin after a failover is the same join
                flight.joined_remote = True
                self.stats.joins += 1
            woken = self._decided(flight)
            waiter = flight.leading
            if waiter is not None:
                flight.leading = flight.leader_waiter = None
                flight.rejoining = waiter
                if woken is None:
                    return [waiter]
                woken.append(waiter)
            return woken

    def joined_elsewhere(self, flight: WideFlight) -> bool:
        """``flight`` joined a flight led elsewhere (its leading caller is a joiner)."""
        return flight.joined_remote
