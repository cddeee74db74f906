"""What a wide scope adds to the engine's flights and table, owned here and not by the
engine: a :class:`WideFlight` carries what its scope told this process (led here, joined
elsewhere, decided, its landing's state), and a :class:`WideTable` keeps the rules that
only exist because other processes share the key:

- a flight joins one led elsewhere, or its work runs here only once the scope says so
  (``ran_here``, ``joined_remote``, ``ran_elsewhere``); a joiner's on_join waits for that
  answer (``defer_on_join``);
- a flight that left the table while its work runs (forgotten, settled past its
  deadline, its group closed) still holds its key in the scope: a call of that key made
  by its own work, or run_sync on its work's loop, would wait for itself (``_refuse``);
- the groups of this process with one scope are one group (the kin registry);
- a forget() elsewhere can move a flight's fresh callers on to the key's next flight.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, ClassVar

from ..engine.flight import (
    CLOSED,
    DONE,
    IDLE,
    JOINED,
    RUNNING,
    SETTLED,
    SETTLING,
    Flight,
    Outcome,
    Role,
    Signal,
    Waiter,
    _blocks_its_loop,
    _calls_itself,
)
from ..engine.table import FlightTable
from ..errors import GroupClosedError, TooManyWaitersError
from ..policy import NO_POLICY, FlightPolicy

if TYPE_CHECKING:
    from .causes import KeptCauses

__all__ = ["WideFlight", "WideTable"]


class WideFlight(Flight):
    """A flight of a wide scope's group. Its fields follow Flight's rule: written
    under the table lock (the outcome fields once, before DONE), class-level defaults."""

    # fresh callers that came before the scope let the work start here: woken with
    # JOINED to join this flight instead of waiting for its end (ran_here)
    promoted: frozenset[Waiter] = frozenset()
    # the scope answered: the work runs here, or the flight joined one led elsewhere.
    # Until then a joiner's on_join waits (``defer_on_join``): the answer may be a kept
    # outcome, and a call served from one never calls on_join.
    decided = False
    led_here = False  # the scope let its work run here (ran_here)
    # the scope could not serve it (unreachable, another version): it counts as no
    # flight, no join and no interruption (docs/observability.md)
    unserved = False
    deferred: list[Waiter] | None = None  # joiners whose on_join waits for the answer
    # ``wide`` is the scope's call while this process leads there; ``remote``: the
    # outcome came from elsewhere (every caller here is a joiner and raises a copy of
    # ``error``); ``joined_remote``: told it joined a flight led elsewhere (the leading
    # caller's on_join is due).
    wide: Any = None
    remote = False
    joined_remote = False
    # ends of sync attempts left running past their deadline: the key is held in the
    # scope until each is set
    stragglers: list[threading.Event] | None = None
    fresh_lead = False  # its leader came with fresh=True (the scope must know)
    # the token of the flight whose end its fresh callers waited for: a flight of the
    # scope that began after that one began after their calls
    after: int | None = None
    # ``token`` may be the ``after`` of its next flight: this process led the flight
    # under the scope's token, and every fresh caller waiting for its end came before
    # its landing was handed to the scope (SETTLING), so before the scope could end it
    # and begin another. Not so for a flight led elsewhere (its end reaches this process
    # after the scope may have begun the next one), a local token (a retry's before the
    # scope bound it), or an end the scope did not see (unreachable, lease lost): its
    # next flight then names no flight, and no flight that exists when it asks will do
    # (ADR 0005).
    scoped = False
    # it left the table (a forget) and, when it ended, its fresh callers went on
    # waiting for the end of the key's flight then (``next``): that one may have joined
    # a flight of the scope that began before their calls
    moved = False
    next: WideFlight | None = None  # (the flight after this one, of the same table)
    # its leading caller stopped waiting (timeout, cancel, interrupt, on_join raised)
    # while the flight goes on: it no longer counts against max_waiters
    leader_left = False
    # the leading caller's waiter that ``joined_remote`` detached: the caller may give
    # up with it before it waits again (``withdraw``)
    rejoining: Waiter | None = None


def _stragglers_done(flight: WideFlight) -> bool:
    """Every sync attempt of ``flight`` left running past its deadline has returned."""
    return all(ended.is_set() for ended in flight.stragglers or ())


# The tables of this process by scope: groups of one scope are one group, and a call
# must see the flights of the others (WideTable._runs_in_kin, _scope_blocks).
_KIN_LOCK = threading.Lock()
_KIN: dict[Hashable, weakref.WeakSet[WideTable]] = {}
_KIN_PRUNE_AT = 64  # scopes registered before the next sweep of those left empty


def _kin_register(scope: Hashable, table: WideTable) -> None:
    global _KIN_PRUNE_AT
    with _KIN_LOCK:
        if len(_KIN) >= _KIN_PRUNE_AT:
            # Scopes whose groups were all collected (a group per temporary directory),
            # swept when the register doubled: amortised, not a scan per group made.
            for gone in [name for name, tables in _KIN.items() if not tables]:
                del _KIN[gone]
            _KIN_PRUNE_AT = max(64, 2 * len(_KIN))
        _KIN.setdefault(scope, weakref.WeakSet()).add(table)


def _renew_kin_lock() -> None:
    """(In a forked child) another thread of the parent may have held the lock: its
    copy here would stay held for ever."""
    global _KIN_LOCK
    _KIN_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_renew_kin_lock)


class WideTable(FlightTable[WideFlight]):
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
        _kin_register(scope, self)
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
            or self._runs_in_kin(tkey, chain)
        ):
            # I6 for a flight of this scope that the table's own check cannot see: one
            # that left this table while its work runs (a forget(), here or in another
            # process, detached it (ADR 0026), or it settled past its deadline), or one
            # that another group of this process with the same scope runs. A new lead
            # would wait for the key lock that very flight holds (directory scope) or
            # run the key again inside its own work (fleet); a join would wait for itself.
            raise _calls_itself(key)
        if blocking_loop is not None and self._scope_blocks(tkey, blocking_loop):
            # run_sync on the thread of the loop that runs the work of another flight of
            # the key in this scope (another group's, or one that left its table while
            # its work runs: forgotten, lingering, its group closed): the scope would
            # make it join that flight, or wait for the key lock its work holds, and
            # block the work it waits for.
            raise _blocks_its_loop(key)

    def _check_waiters(self, flight: WideFlight) -> None:
        """FlightTable's count, and the leading caller as a joiner unless the scope
        let the work run here (``led_here``) or that caller stopped waiting: a flight
        joined elsewhere has no leader in this process, and until the scope answers
        the leading caller may turn out to be a joiner (ADR 0037). So no more than
        ``max_waiters`` callers ever wait here as joiners of a flight led elsewhere,
        and no admitted caller is failed when the answer comes."""
        limits = flight.policy.limits
        if limits is not None and limits.max_waiters is not None:
            waiting = len(flight.waiters) + len(flight.fresh or ()) + flight.claims
            if flight.leader_waiter is not None and flight.leader_waiter in flight.waiters:
                waiting -= 1
            if not flight.led_here and not flight.leader_left:
                waiting += 1
            if waiting >= limits.max_waiters:
                raise TooManyWaitersError(flight.key, limits.max_waiters)

    def withdraw(self, flight: WideFlight, waiter: Waiter) -> bool:
        """FlightTable.withdraw; the leading caller's withdrawal is noted: it no longer
        counts against max_waiters (``_check_waiters``)."""
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

    def _count_settled(
        self, flight: WideFlight, outcome: Outcome, ended: int, closed: bool | None
    ) -> None:
        if flight.stragglers is not None and not _stragglers_done(flight):
            self.lingering.add(flight)  # until unlinger: its last work returned
        if flight.unserved:
            closed = None  # no flight, no join: nothing else to count
        elif not flight.led_here:
            # A flight joined elsewhere counts by its end there, even if this group
            # closed meanwhile: its lease was never this process's to lose.
            closed = False
        super()._count_settled(flight, outcome, ended, closed)

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
        if made and following is not None and flight.scoped and outcome is not Outcome.LOST:
            following.after = flight.token
        return taken

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

    # -- the bridge's ----------------------------------------------------------

    def ran_here(self, flight: WideFlight) -> list[Waiter] | None:
        """(Wide scopes) the scope let ``flight``'s work run here: count the flight.

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
            flight.scoped = True
            flight.led_here = True
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

    def joined_remote(self, flight: WideFlight) -> list[Waiter] | None:
        """(Wide scopes) ``flight`` joined a flight led elsewhere: mark it, and detach
        the leading caller's waiter if it waits, and the joiners whose on_join waited
        for the answer, to wake them with JOINED."""
        with self.lock:
            if not flight.joined_remote:  # a rejoin after a failover is the same join
                flight.joined_remote = True
                self.stats.joins += 1
            woken = self._decided(flight)
            waiter = flight.leader_waiter
            if waiter is not None and flight.waiters.pop(waiter, False) is None:
                flight.leader_waiter = None
                flight.rejoining = waiter
                if woken is None:
                    return [waiter]
                woken.append(waiter)
            return woken

    def joined_elsewhere(self, flight: WideFlight) -> bool:
        """``flight`` joined a flight led elsewhere (its leading caller is a joiner)."""
        return flight.joined_remote

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
        return bool(self._kin())

    def cause_of(self, key: str, token: int) -> BaseException | None:
        """The error of the failure that flight ``token`` of ``key`` landed, if a group
        of this process with this scope led it and still remembers it."""
        for table in (self, *self._kin()):
            causes = table.causes
            if causes is not None and (error := causes.cause(key, token)) is not None:
                return error
        return None

    def _kin(self) -> list[WideTable]:
        """The other tables of this scope in this process (wide scopes)."""
        with _KIN_LOCK:
            tables = list(_KIN.get(self.scope, ()))
        return [table for table in tables if table is not self]

    def _runs_in_kin(self, tkey: Hashable, current: Flight | None) -> bool:
        """True if ``current``, or a flight whose work started it, is a flight of the
        key ``tkey`` that another group of this process with the same scope runs: the
        scope would make this call join it (or wait for its key lock), so its work
        would wait for itself. A flight whose work is over (a task it started may
        outlive it) does not count."""
        tables: list[WideTable] | None = None
        while current is not None:
            if current.tkey == tkey:
                if tables is None:
                    tables = self._kin()
                if any(table.holds(current) for table in tables):
                    return True
            current = current.parent
        return False

    def _scope_blocks(self, tkey: Hashable, loop: asyncio.AbstractEventLoop) -> bool:
        """(Under the lock) True if a flight of ``tkey`` whose async work runs on
        ``loop`` here (not known to be led elsewhere) is another table's of this scope
        in this process, or (directory scope) left its table while its work runs (this
        table's check of its own flight comes later). Read from the other tables
        without their locks: each test is one atomic read."""
        # A flight that left its table holds the key in the directory scope (its key
        # lock); in the fleet only until the scope confirms its forget(): after that a
        # new call leads beside it (its lease is lost).
        left_holds = self.left_holds
        for table in (self, *self._kin()):
            if table is not self:
                flight = table.flights.get(tkey)
                if flight is not None and flight.loop is loop and not flight.joined_remote:
                    return True
            if left_holds or tkey in table.forgetting:
                for left in (*table.detached, *table.lingering):
                    if left.tkey == tkey and left.loop is loop and not left.joined_remote:
                        return True
        return False

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
