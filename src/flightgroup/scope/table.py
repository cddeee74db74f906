"""What a wide scope adds to the engine's table, owned here and not by the engine: a
:class:`WideTable` (of :class:`~.flight.WideFlight`) keeps the rules that only exist
because other processes share the key:

- a flight joins one led elsewhere, or its work runs here only once the scope says so
  (``ran_here``, ``joined_remote``, ``ran_elsewhere``); a joiner's on_join waits for that
  answer (``defer_on_join``): the table's part in ``answers.py``;
- a flight that left the table while its work runs (forgotten, settled past its
  deadline, its group closed) still holds its key in the scope: a call of that key made
  by its own work, or run_sync on its work's loop, would wait for itself (``_refuse``);
- the groups of this process with one scope are one group (their kin: ``kin.py``);
- a forget() elsewhere can move a flight's fresh callers on to the key's next flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, ClassVar

from ..engine.flight import (
    CLOSED,
    DONE,
    IDLE,
    JOINED,
    SETTLED,
    SETTLING,
    Counts,
    Flight,
    Outcome,
    Role,
    Signal,
    Waiter,
    _blocks_its_loop,
    _calls_itself,
)
from ..engine.table import FlightTable
from ..errors import FlightInterruptedError
from ..policy import NO_POLICY, FlightPolicy
from . import kin
from .answers import ScopeAnswers
from .flight import WideFlight

if TYPE_CHECKING:
    from .causes import KeptCauses

__all__ = ["WideFlight", "WideTable"]


def _stragglers_done(flight: WideFlight) -> bool:
    """Every sync attempt of ``flight`` left running past its deadline has returned."""
    return all(ended.is_set() for ended in flight.stragglers or ())


class WideTable(FlightTable[WideFlight], ScopeAnswers):
    """The flight table of a wide scope's group in this process.

    ``scope`` names the scope (Scope.identity): another table of this process with the
    same one is the same group. ``left_holds``: a flight that left the table holds its
    key in the scope while its work runs (Scope.left_flights_hold_keys)."""

    __slots__ = ("causes", "forgetting", "left_holds", "lingering", "scope")

    flight_type: ClassVar[type[Flight]] = WideFlight
    lead_counts: ClassVar[int] = 0

    def __init__(self, scope: Hashable, *, left_holds: bool) -> None:
        super().__init__()
        self.scope = scope
        self.left_holds = left_holds
        kin.register(scope, self)
        # settled flights whose sync work runs on past its deadline (and holds the key
        # lock, in the directory scope), until it returns
        self.lingering: set[WideFlight] = set()
        # keys whose forget() the scope has not confirmed yet, with how many such
        # forget() calls run: the scope may still make a call join their left flight
        self.forgetting: dict[Hashable, int] = {}
        # the errors of failures this table's group landed, for the ``__cause__`` of
        # their FlightFailedError in every group of this process that gets them from
        # the scope (scope.causes.KeptCauses): made at the first one
        self.causes: KeptCauses | None = None

    # -- the engine's hooks ------------------------------------------------------

    def arrive(
        self,
        tkey: Hashable,
        key: str,
        *,
        fresh: bool,
        make_waiter: Callable[[], Waiter],
        chain: Flight | None,
        blocking_loop: asyncio.AbstractEventLoop | None,
        policy: FlightPolicy = NO_POLICY,
    ) -> tuple[Role, WideFlight, Waiter | None]:
        """FlightTable.arrive; a flight led by a fresh caller says so to its scope."""
        role, flight, waiter = super().arrive(
            tkey, key, fresh=fresh, make_waiter=make_waiter, chain=chain,
            blocking_loop=blocking_loop, policy=policy,
        )
        if fresh and waiter is None and flight.state is not DONE:
            # (Only this caller knows the new flight's lead yet: its driver reads it.)
            flight.fresh_lead = True
        return role, flight, waiter

    def _lead(self, flight: WideFlight, policy: Any) -> None:
        super()._lead(flight, policy)
        flight.fresh_lead = True  # an IDLE flight's leader is fresh

    def _refuse(
        self,
        tkey: Hashable,
        key: str,
        chain: Flight | None,
        blocking_loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        if chain is not None and (
            ((self.detached or self.lingering) and self._left_in(tkey, chain))
            or kin.runs_in_kin(self, tkey, chain)
        ):
            # I6 for a flight of this scope that the table's own check cannot see: one
            # that left this table while its work runs (a forget(), here or in another
            # process, detached it (ADR 0026), or it settled past its deadline), or one
            # that another group of this process with the same scope runs. A new lead
            # would wait for the key lock that very flight holds (directory scope) or
            # run the key again inside its own work (fleet); a join would wait for itself.
            raise _calls_itself(key)
        if blocking_loop is not None and kin.scope_blocks(self, tkey, blocking_loop):
            # run_sync on the thread of the loop that runs the work of another flight of
            # the key in this scope (another group's, or one that left its table while
            # its work runs: forgotten, lingering, its group closed): the scope would
            # make it join that flight, or wait for the key lock its work holds, and
            # block the work it waits for.
            raise _blocks_its_loop(key)

    def _waiting(self, flight: WideFlight) -> int:
        """FlightTable's count, and the leading caller as a joiner unless the scope
        let the work run here (``led_here``) or that caller stopped waiting: a flight
        joined elsewhere has no leader in this process, and until the scope answers
        the leading caller may turn out to be a joiner (ADR 0037). So no more than
        ``max_waiters`` callers ever wait here as joiners of a flight led elsewhere,
        and no admitted caller is failed when the answer comes."""
        leading = not flight.led_here and not flight.leader_left
        return super()._waiting(flight) + leading

    def withdraw(self, flight: WideFlight, waiter: Waiter) -> bool:
        """FlightTable.withdraw; the leading caller's withdrawal is noted: it no longer
        counts against max_waiters (``_waiting``)."""
        with self.lock:
            if waiter is flight.leader_waiter or waiter is flight.rejoining:
                flight.leader_left = True
        return super().withdraw(flight, waiter)

    def leader_left_flight(self, flight: WideFlight) -> None:
        """The leading caller stopped waiting while its flight goes on (a sync leading
        caller's driver went on on a thread of its own)."""
        with self.lock:
            flight.leader_left = True

    def _on_waits_for_end(self, flight: WideFlight) -> None:
        if flight.state is SETTLING:  # its scope may have ended it and begun the next
            flight.scoped = False

    def _on_attempt(self, flight: WideFlight) -> None:
        flight.scoped = False  # the scope's token comes later

    def _keep(self, flight: WideFlight, size: int) -> None:
        """Nothing: the scope keeps outcomes where every process reaches them."""

    def _count_settled(self, flight: WideFlight, outcome: Outcome, ended: int) -> None:
        """FlightTable's; a flight whose sync work runs on past its deadline lingers."""
        if flight.stragglers is not None and not _stragglers_done(flight):
            self.lingering.add(flight)  # until unlinger: its last work returned
        super()._count_settled(flight, outcome, ended)

    def _closed_counts(self, flight: WideFlight) -> Counts:
        # A flight not led here counts by its end elsewhere, even if this group closed
        # meanwhile: its lease was never this process's to lose. (Once closed, no work
        # starts here: ``ran_here`` refuses.)
        return Counts.CLOSED if flight.led_here else Counts.OUTCOME

    def _next_for_fresh(
        self, flight: WideFlight, fresh: list[Waiter], outcome: Outcome
    ) -> list[Waiter] | None:
        following = self.flights.get(flight.tkey)
        if following is not None and following.state is not IDLE:
            # This flight left the table (a forget, here or elsewhere) and a newer local
            # flight took the key. It may have joined a flight of the scope that began
            # before these callers came (a forget made elsewhere is heard here late):
            # they wait for its end, as fresh callers that came now would, and take the
            # flight after it.
            if following.state is SETTLING:
                following.scoped = False
            following.fresh = [*(following.fresh or ()), *fresh]
            flight.next = following
            flight.moved = True
            return None
        made = following is None
        taken = super()._next_for_fresh(flight, fresh, outcome)
        following = flight.next
        if made and following is not None:
            if flight.scoped and outcome is not Outcome.LOST:
                following.after = flight.token
            elif (
                flight.taken_over and len(fresh) == len(flight.taken_over)
                and flight.decided and not flight.local
            ):
                # Only callers taking the flight over: any flight of the scope newer than
                # the one interrupted will do (another process may have taken it over
                # first: they join it rather than wait for its end and run it again).
                following.after = flight.token
        return taken

    def _leader_joins(self, flight: WideFlight) -> bool:
        return flight.joined_remote

    def _made_to_take_over(self, flight: WideFlight, following: WideFlight) -> None:
        if flight.decided and not flight.local:
            following.after = flight.token  # any newer flight of the scope will do

    def _takes_over(self, flight: WideFlight) -> bool:
        # A flight the scope could not serve ended with the scope's error, not an
        # interruption: nothing to take over.
        return not flight.unserved and (
            not flight.remote or isinstance(flight.error, FlightInterruptedError)
        )

    def _on_close(self, closed: list[tuple[WideFlight, list[Waiter]]]) -> None:
        # A flight whose work runs on here still holds its key in the scope until it
        # settles: it stays detached, for I6 and run_sync's check (its settle lets go).
        self.detached.update(flight for flight, _ in closed if flight.state is not DONE)
        # The errors remembered for __cause__ hold their works' frames: a closed group
        # that is still referenced must not keep them for its life.
        self.causes = None

    def _forked(self) -> list[WideFlight]:
        """(In a forked child) as FlightTable's; a wide flight's work that this child
        runs on (it forked inside the work) holds no lease of the scope here: its lease
        is lost, so its outcome is never taken for the flight's (LeaseLostError)."""
        copied = [*super()._forked(), *self.lingering]
        self.lingering = set()
        self.forgetting = {}
        for flight in copied:
            if flight.attempt is not None:
                flight.attempt.lose_in_child()
        return copied

    def signal_of(
        self, flight: WideFlight, fresh_of: WideFlight | None, waiter: Waiter
    ) -> Signal | Flight:
        if fresh_of is not None:
            fresh_of = self.waited_on(fresh_of, waiter)
            if waiter in fresh_of.promoted:
                return JOINED
            following = fresh_of.next
            return following if following is not None else CLOSED
        if flight.promoted and waiter in flight.promoted:  # a joiner whose on_join waited
            return JOINED
        if flight.taken_over and waiter in flight.taken_over:  # it takes the flight over
            following = flight.next
            return following if following is not None else CLOSED
        return CLOSED if flight.closed else SETTLED

    def waited_on(self, flight: WideFlight, waiter: Waiter) -> WideFlight:
        """The flight a fresh caller of ``flight`` (its ``waiter``) waits on: ``flight``,
        or along the links of flights whose fresh callers moved on (``moved``), the one
        that promoted it to a joiner, else the last one."""
        while waiter not in flight.promoted and flight.moved and flight.next is not None:
            flight = flight.next
        return flight

    def _withdraw_fresh(self, flight: WideFlight, waiter: Waiter) -> bool:
        while True:
            if super()._withdraw_fresh(flight, waiter):
                return True
            following = flight.next
            if not flight.moved or following is None:
                return False
            flight = following  # its fresh callers wait there now

    def forget(self, tkey: Hashable, asking: bool = False) -> None:
        """FlightTable.forget; ``asking``: the scope is asked to forget it too, and
        ``forget_answered`` follows."""
        with self.lock:
            if asking:
                self.forgetting[tkey] = self.forgetting.get(tkey, 0) + 1
            self._forget(tkey)

    def forget_answered(self, tkey: Hashable) -> None:
        """The scope answered (or failed) one ``forget(tkey, asking=True)``."""
        with self.lock:
            left = self.forgetting.get(tkey, 0) - 1
            if left > 0:
                self.forgetting[tkey] = left
            else:
                self.forgetting.pop(tkey, None)

    def _left_in(self, tkey: Hashable, current: Flight | None) -> bool:
        """(Under the lock) True if ``current``, or a flight whose work started it, is
        a flight of this table with the key ``tkey`` that left it while its work runs:
        detached, or lingering (see ``lingering``)."""
        while current is not None:
            if current.tkey == tkey and (current in self.detached or current in self.lingering):
                return True
            current = current.parent
        return False

    def has_kin(self) -> bool:
        """Another group of this process has this table's scope (wide scopes)."""
        return bool(kin.kin_of(self))

    def cause_of(self, key: str, token: int) -> BaseException | None:
        """The error of the failure that flight ``token`` of ``key`` landed, if a group
        of this process with this scope led it and still remembers it."""
        for table in (self, *kin.kin_of(self)):
            causes = table.causes
            if causes is not None and (error := causes.cause(key, token)) is not None:
                return error
        return None

    def holds(self, flight: Flight) -> bool:
        """``flight``'s work may still run: it is this table's flight of its key, or it
        left the table while its work runs (detached or lingering). Read without the
        lock (by another group's table): each test is one atomic read."""
        return (
            self.flights.get(flight.tkey) is flight
            or flight in self.detached
            or flight in self.lingering
        )

    def unlinger(self, flight: WideFlight) -> None:
        """A sync attempt of ``flight`` returned (on its own thread): once every one
        left running past its deadline has, the flight no longer lingers."""
        if flight.stragglers is None:
            return
        with self.lock:
            if flight in self.lingering and _stragglers_done(flight):
                self.lingering.discard(flight)

    def detach(self, flight: WideFlight) -> None:
        """(Wide scopes) ``flight`` is no longer its key's in the scope (a forget() in
        another process): if it is still this table's flight of its key, it leaves the
        table as forget() would take it; the next local call leads a new one."""
        with self.lock:
            if self.flights.get(flight.tkey) is flight:
                self.detached.add(flight)  # first: see forget()
                del self.flights[flight.tkey]
