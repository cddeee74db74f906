"""One call's way from its arrival to its outcome: the decisions of the wait loop,
shared by the async and the sync caller (ADR 0035).

A caller that did not settle at once (it leads and must wait, joins with an on_join or
a timeout, waits for a running flight's end as a fresh caller, ...) is followed by a
:class:`Follower`. The follower owns every decision: what a role asks of the caller,
what a wake-up signal means, when a caller withdraws, which flight it claims next. It
does no waiting and starts no work: its two shells in group.py do (``await`` a future
with a loop timer, or ``acquire`` a lock with a timeout), so the async and sync paths
cannot drift apart again. It runs in the caller's own thread or task, so it calls the
caller's ``on_join`` itself.

The shell's loop::

    while (step := follower.step()) is not Step.DELIVER:
        if step is Step.START: start the leader's work (each shell its own way)
        else: wait on follower.waiter, then follower.woken(signal or EXPIRED)
    deliver follower.flight (as the leader if follower.leader)
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from .flight import (
    CLOSED,
    DONE,
    EXPIRED,
    JOINED,
    SETTLED,
    Flight,
    Role,
    Signal,
    Waiter,
)

if TYPE_CHECKING:
    from ..errors import GroupClosedError
    from ..policy import FlightPolicy
    from .table import FlightTable

__all__ = ["Follower", "Step", "signal_for"]


class WideRules(Protocol):
    """What a wide scope's table adds to a waiting call's decisions."""

    def defer_on_join(self, flight: Any, waiter: Waiter) -> bool | None:
        """Whether a joiner's on_join runs now: True; None, it waits for the scope's
        answer; False, never (the flight ended before it was decided)."""

    def joined_elsewhere(self, flight: Any) -> bool:
        """``flight`` joined a flight led elsewhere (its leading caller is a joiner)."""


class Step(Enum):
    """What the follower asks of its shell next."""

    START = "start"  # start the leader's work (then set ``role`` to LEADING)
    WAIT = "wait"  # wait on ``waiter``, then call ``woken``
    DELIVER = "deliver"  # the flight settled: deliver it (``leader`` says as what)


START = Step.START
WAIT = Step.WAIT
DELIVER = Step.DELIVER


def signal_for(
    table: FlightTable[Any], flight: Flight, fresh_of: Flight | None, waiter: Waiter,
    leader: bool,
) -> Signal | Flight:
    """The signal ``waiter`` was handed, read from the flight (I3: valid once it was
    detached). A leading caller whose waiter is no longer the flight's leader waiter was
    detached by a wide table's ``joined_remote``: its flight joined one led elsewhere."""
    if leader and flight.leader_waiter is not waiter:
        return JOINED
    return table.signal_of(flight, fresh_of, waiter)


class Follower:
    """The state of one waiting call: its ``role`` and ``flight``, its ``waiter``,
    whether it leads (``leader``), the flight whose end it waits for as a fresh caller
    (``fresh_of``), and its ``on_join`` until called (once per call, never after a
    rejoin). Written and read by its own caller only."""

    __slots__ = (
        "_closed_error",
        "_make_waiter",
        "_wide",
        "deferred",
        "flight",
        "fresh_of",
        "leader",
        "on_join",
        "policy",
        "role",
        "table",
        "waiter",
    )

    def __init__(
        self,
        table: FlightTable[Any],
        role: Role,
        flight: Flight,
        waiter: Waiter | None,
        *,
        on_join: Callable[[], object] | None,
        policy: FlightPolicy,
        make_waiter: Callable[[], Waiter],
        wide: WideRules | None,
        closed_error: Callable[[], GroupClosedError],
    ) -> None:
        self.table = table
        self.role = role
        self.flight = flight
        self.waiter = waiter
        self.on_join = on_join
        self.policy = policy
        self._make_waiter = make_waiter
        # None in the process scope: its flights are always decided, a joiner's on_join
        # runs at once (a wide flight's may wait for its scope's answer).
        self._wide = wide
        self._closed_error = closed_error
        self.leader = False
        self.fresh_of: Flight | None = None  # the flight whose end this caller waits for
        self.deferred = False  # (wide scopes) its on_join waits for the scope's answer

    def take_on_join(self) -> Callable[[], object] | None:
        """Hand the call's on_join to whoever calls it now (a wide leader's driver)."""
        on_join, self.on_join = self.on_join, None
        return on_join

    def step(self) -> Step:
        """Act on the current role: what the shell does next."""
        role = self.role
        flight = self.flight
        if role is Role.LEAD:
            self.leader = True
            return START
        if role is Role.LEADING:
            self.leader = True
            waiter = self.waiter = self._make_waiter()
            if not self.table.wait_as_leader(flight, waiter):
                if self.on_join is not None and self._joined_elsewhere():
                    self.on_join()  # it joined elsewhere, and the outcome came
                return DELIVER if self.ended_as_leader() else self.step()
            if self.on_join is not None and self._joined_elsewhere():
                self._on_join_or_withdraw()
            return WAIT
        if role is Role.TAKE:  # joined a flight that already ended
            if self.on_join is not None:
                self.on_join()
            if self.table.retakes(flight):  # it ended interrupted: take it over
                self.take_over()
                return self.step()
            self.leader = False
            return DELIVER
        if role is Role.JOIN and self.on_join is not None:
            assert self.waiter is not None
            wide = self._wide
            now = True if wide is None else wide.defer_on_join(flight, self.waiter)
            if now is None:
                self.deferred = True
            elif now:
                self._on_join_or_withdraw()
            else:
                self.on_join = None  # once per call, never after a rejoin
        elif role is Role.WAIT_END:
            self.fresh_of = flight
        return WAIT

    def woken(self, signal: Signal | Flight) -> Step:
        """The caller's wait ended with ``signal`` (EXPIRED: its own timeout passed):
        raise what the caller raises, or say what it does next: DELIVER, or WAIT (take
        the next ``step``)."""
        table, flight, waiter = self.table, self.flight, self.waiter
        assert waiter is not None
        if signal is EXPIRED:
            if table.withdraw(flight, waiter):
                raise self._gave_up()
            # A signal reached it first: read it from the flight.
            signal = signal_for(table, flight, self.fresh_of, waiter, self.leader)
            if isinstance(signal, Flight):  # out of time: hand the claim back (I4)
                table.release_claim(signal)
                raise self._gave_up()
            if signal is JOINED or (self.leader and signal is SETTLED and flight.state is not DONE):
                # (wide scopes) told to wait as a joiner, out of time before it did
                raise self._gave_up()
        if signal is JOINED:  # (wide scopes) this caller is a joiner now
            on_join = self.take_on_join()
            if on_join is not None:
                try:
                    on_join()
                except BaseException:
                    # Its waiter was detached: nothing is withdrawn, but a wide table
                    # learns that its leading caller left (it counts no longer).
                    self.abandon()
                    raise
            if self.leader:  # its flight joined one led elsewhere
                self.role = Role.LEADING
            else:  # a fresh caller that ran_here made a joiner of the flight it waited on,
                # or a joiner whose on_join waited for the scope's answer
                self.fresh_of = None
                self.flight = table.waited_on(flight, waiter)
                self.role, self.waiter = table.claim(
                    self.flight, self._make_waiter, self.policy, claimed=False,
                    counted=self.deferred,
                )
                self.deferred = False
            return WAIT
        if signal is SETTLED:
            return DELIVER
        if signal is CLOSED:
            raise self._closed_error()
        # A claim on the flight after the one this caller waited for (a fresh caller's),
        # or after the interrupted one it takes over.
        assert isinstance(signal, Flight)
        self.flight, self.fresh_of, self.leader = signal, None, False
        self.role, self.waiter = table.claim(signal, self._make_waiter, self.policy)
        return WAIT

    def ended_as_leader(self) -> bool:
        """The flight this caller leads ended before it waited (its work ran in its own
        thread, or the outcome came first): True, deliver it; False, the flight joined
        one led elsewhere that ended interrupted, and this caller took it over (its next
        ``step`` says how)."""
        if self.table.leader_takes_over(self.flight):
            self.take_over()
            return False
        return True

    def take_over(self) -> None:
        """This leading caller, a joiner of a flight led elsewhere that ended
        interrupted, takes it over (``FlightTable.take_over``): it leads or joins the
        key's next flight."""
        self.on_join = None  # once per call, never after a rejoin
        self.role, self.flight, self.waiter = self.table.take_over(
            self.flight, self._make_waiter, self.policy
        )
        self.leader = False

    def abandon(self) -> None:
        """This caller stops waiting (cancel, interrupt, on_join raised).

        If its waiter could not be withdrawn, a signal reached it first; the only
        signal that asks something of it is a claim on the next flight, which it
        hands back (I4)."""
        flight, waiter, fresh_of = self.flight, self.waiter, self.fresh_of
        assert waiter is not None
        if not self.table.withdraw(flight, waiter):
            signal = self.table.signal_of(flight, fresh_of, waiter)
            if isinstance(signal, Flight):  # a fresh caller's claim, or a takeover's
                self.table.release_claim(signal)

    def _on_join_or_withdraw(self) -> None:
        """The call's on_join runs now (a joiner's, or a wide leading caller's once its
        flight joined one led elsewhere); if it raises, the caller withdraws first."""
        on_join = self.take_on_join()
        assert on_join is not None
        try:
            on_join()
        except BaseException:
            self.abandon()
            raise

    def _joined_elsewhere(self) -> bool:
        """(A wide flight's) this leading caller's flight joined one led elsewhere: the
        caller is a joiner now, its on_join is due. Read after its waiter registered."""
        return self._wide is not None and self._wide.joined_elsewhere(self.flight)

    def _gave_up(self) -> TimeoutError:
        return TimeoutError(f"gave up waiting for the flight of {self.flight.key!r}")
