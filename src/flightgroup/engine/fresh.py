"""The flight table's fresh callers and their claims: a caller with ``fresh=True`` that
finds its key's flight running waits for that flight's end, then claims the flight
after it (made IDLE if none runs): the first claim leads it, the others join it, or
take its outcome once it ended (I4: an IDLE flight always has a pending claim).

A part of :class:`~flightgroup.engine.table.FlightTable` (see ``tablestate.py``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..errors import GroupClosedError
from .flight import DONE, IDLE, Outcome, Role, Waiter, _add_waiter
from .tablestate import F, TableState

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..policy import FlightPolicy

__all__ = ["FreshCallers"]


class FreshCallers(TableState[F]):
    """The flight table's part for fresh callers: their waits and their claims."""

    __slots__ = ()

    def _wait_for_end(self, flight: F, waiter: Waiter) -> None:
        """(Under the lock) the fresh caller ``waiter`` waits for running ``flight``'s
        end."""
        self._on_waits_for_end(flight)
        if flight.fresh is None:
            flight.fresh = [waiter]
        else:
            flight.fresh.append(waiter)

    def _on_waits_for_end(self, flight: F) -> None:
        """(Under the lock) a fresh caller starts waiting for running ``flight``'s end."""

    def claim(
        self,
        flight: F,
        make_waiter: Callable[[], Waiter],
        policy: FlightPolicy,
        claimed: bool = True,
        counted: bool = False,
    ) -> tuple[Role, Waiter | None]:
        """A fresh caller takes its claim on ``flight`` (the flight after the one
        it waited for): lead it if nobody does, else join it, or take its
        outcome if it already ended (it started after the caller's call).
        ``claimed=False``: a caller promoted by ``ran_here`` joins the flight it
        waited on (it holds no claim: that flight was never IDLE). ``counted``: a
        joiner whose on_join waited for the scope's answer, already counted as one."""
        with self.lock:
            if claimed:
                flight.claims -= 1
            if self.closed:
                raise GroupClosedError()
            if flight.state is IDLE:
                self._lead(flight, policy)
                return Role.LEAD, None
            if flight.state is DONE:
                # I4: a flight with a pending claim is never abandoned.
                assert flight.outcome is not Outcome.ABANDONED
                if not counted:
                    self.stats.joins += 1
                return Role.TAKE, None
            waiter = make_waiter()
            _add_waiter(flight, waiter)
            if counted:
                return Role.JOIN, waiter
            flight.joiners += 1
            self.stats.joins += 1
            if self.stats.timing:
                flight.timed += 1
                flight.joined_ns += time.perf_counter_ns()
            return Role.JOIN, waiter

    def release_claim(self, flight: F) -> None:
        """A caller told to claim ``flight`` withdrew instead (I4)."""
        with self.lock:
            flight.claims -= 1
            if flight.state is IDLE and flight.claims == 0:
                flight._move(IDLE, DONE)
                flight.outcome = Outcome.ABANDONED
                if self.flights.get(flight.tkey) is flight:  # I1
                    del self.flights[flight.tkey]
                self.detached.discard(flight)

    def _withdraw_fresh(self, flight: F, waiter: Waiter) -> bool:
        """(Under the lock) withdraw ``waiter`` from the fresh callers of ``flight``."""
        fresh = flight.fresh
        if fresh is not None and waiter in fresh:
            fresh.remove(waiter)
            return True
        return False

    def _claim_next(self, flight: F, fresh: list[Waiter], outcome: Outcome) -> list[Waiter] | None:
        """(Under the lock, ``settle``) the callers to wake with a claim on the flight
        after settled ``flight`` (``_next_for_fresh``); that flight inherits the count
        of takeovers along the chain of flights taken over."""
        taking = self._next_for_fresh(flight, fresh, outcome)
        following = flight.next
        if flight.taken_over and following is not None:
            # the bound on takeovers runs along the chain of flights taken over
            following.takeovers = max(following.takeovers, flight.takeovers + 1)
        return taking

    def _next_for_fresh(
        self, flight: F, fresh: list[Waiter], outcome: Outcome
    ) -> list[Waiter] | None:
        """(Under the lock) the fresh callers of settled ``flight`` claim the flight
        after it (made IDLE if none runs): returns them, to wake with that claim."""
        tkey = flight.tkey
        following = self.flights.get(tkey)
        if following is None:
            # Its token comes when it is led (_lead): a flight that starts later must
            # carry the larger token, even if it was made earlier.
            made: F = self.flight_type(tkey, flight.key, 0, IDLE)  # type: ignore[assignment]
            self.flights[tkey] = following = made
        following.claims += len(fresh)
        flight.next = following
        return fresh
