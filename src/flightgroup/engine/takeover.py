"""The flight table's takeovers: a flight that ended interrupted (its leader stopped,
or lost its lease) under a policy with ``takeover`` is taken over by its callers. They
do not raise FlightInterruptedError: they claim the flight after it, along a chain that
counts its takeovers, and the first claim leads it (ADR 0042).

A part of :class:`~flightgroup.engine.table.FlightTable` (see ``tablestate.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import GroupClosedError
from .flight import DONE, IDLE, Outcome, Role, Waiter, _add_waiter
from .tablestate import F, TableState

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..policy import FlightPolicy

__all__ = ["TakeOvers"]


class TakeOvers(TableState[F]):
    """The flight table's part that hands an interrupted flight to its callers."""

    __slots__ = ()

    def retakes(self, flight: F) -> bool:
        """``flight`` (settled) ended interrupted and a caller that finds it so, rather
        than being woken by its end, takes it over (``take_over``): a fresh or taking-over
        caller whose claim found it ended, or a leading caller that joined it elsewhere."""
        outcome = flight.outcome
        return (
            (outcome is Outcome.INTERRUPTED or outcome is Outcome.LOST)
            and flight.policy.takeover > flight.takeovers
            and not flight.closed
            and self._takes_over(flight)
        )

    def leader_takes_over(self, flight: F) -> bool:
        """``flight`` (settled) ended interrupted and its leading caller, a joiner of a
        flight led elsewhere that was not waiting when it ended, takes it over."""
        return self._leader_joins(flight) and self.retakes(flight)

    def take_over(
        self, flight: F, make_waiter: Callable[[], Waiter], policy: FlightPolicy
    ) -> tuple[Role, F, Waiter | None]:
        """A caller takes interrupted ``flight`` over (``retakes``) along its chain: the
        flight after it (made by the callers that took it over first, or by this call),
        else the key's flight of a later call, else a new one, which counts one takeover
        more. It leads that flight, joins it, or takes its outcome if it ended (and takes
        that one over in turn, while the chain has takeovers left)."""
        with self.lock:
            if self.closed:
                raise GroupClosedError()
            tkey = flight.tkey
            found = flight.next
            if found is not None and found.outcome is Outcome.ABANDONED:
                found = None  # (its claims were all handed back: it never ran)
            if found is None:
                found = self.flights.get(tkey)
            if found is None:
                made: F = self.flight_type(tkey, flight.key, 0, IDLE)  # type: ignore[assignment]
                self.flights[tkey] = made
                made.takeovers = flight.takeovers + 1
                self._made_to_take_over(flight, made)
                flight.next = found = made
            following: F = found  # type: ignore[assignment]
            if following.state is IDLE:
                self._lead(following, policy)
                return Role.LEAD, following, None
            if following.state is DONE:
                self.stats.joins += 1
                return Role.TAKE, following, None
            waiter = make_waiter()
            _add_waiter(following, waiter)
            following.joiners += 1
            self.stats.joins += 1
            return Role.JOIN, following, waiter

    def _made_to_take_over(self, flight: F, following: F) -> None:
        """(Under the lock) ``following`` was made to take interrupted ``flight`` over."""

    def _take_over(
        self, flight: F, waiters: dict[Waiter, None], fresh: list[Waiter] | None
    ) -> tuple[dict[Waiter, None], list[Waiter] | None]:
        """(Under the lock) ``flight`` ended interrupted and its policy takes it over:
        its joiners do not raise FlightInterruptedError, they claim the flight after it
        with its fresh callers (the first claim leads it, the others join it, or take its
        outcome once it ended: one run for them all). Its leading caller is no joiner
        unless the flight joined one led elsewhere (``_leader_joins``). Returns the
        waiters still to wake with SETTLED and the callers to wake with a claim."""
        leader = flight.leader_waiter
        taking: list[Waiter] = []
        staying: dict[Waiter, None] = {}
        for waiter in waiters:
            if waiter is leader and not self._leader_joins(flight):
                staying[waiter] = None
            else:
                taking.append(waiter)
        if not taking or not self._takes_over(flight):
            return waiters, fresh
        flight.taken_over = frozenset(taking)
        return staying, [*(fresh or ()), *taking]

    def _leader_joins(self, flight: F) -> bool:
        """Its leading caller waits as a joiner (a wide flight that joined one led
        elsewhere): it takes the flight over with the others."""
        return False

    def _takes_over(self, flight: F) -> bool:
        """(Under the lock) whether an interrupted ``flight``'s callers may take it
        over (a wide flight the scope could not serve may not)."""
        return True
