"""A fake wide scope, in memory, for tests: several "processes" are several FlightGroups
on one :class:`FakeCoordinator` (ADR 0034).

    from flightgroup import JSON, Retention
    from flightgroup.testing import FakeCoordinator

    fake = FakeCoordinator()
    a = fake.group(codec=JSON, retention=Retention(success=5))
    b = fake.group(codec=JSON)        # another "process" of the same group

The fake decides as the directory's coordinator does: one flight per key across all
its groups; a token per lead and per retry, growing within the coordinator; a call of
a key whose flight another group leads joins it and gets the landed outcome (a value
travels as the codec's bytes: every group decodes its own copy); ``fresh`` calls take
only a flight that began after them; kept outcomes under the leader's Retention (TTL on
the fake's own clock, LRU by items then bytes), served as joined; ``forget`` detaches the
running flight and drops the kept outcome; closing a group interrupts the flights it
leads for their joiners elsewhere.

Hooks force what real scopes suffer, each at a point the test chooses, never by time:
:meth:`FakeCoordinator.lose_lease`, :meth:`~FakeCoordinator.unreachable`,
:meth:`~FakeCoordinator.hold` (answers queued until released),
:meth:`~FakeCoordinator.drop_next`, :meth:`~FakeCoordinator.kill` (a process's death),
:meth:`~FakeCoordinator.advance` (the clock of kept outcomes).

Threads: the fake decides under its own lock and answers after releasing it, in the
thread that made the request (a submit is answered before it returns; a landing's
joiners elsewhere hear it from the leader's thread, and its ``done`` is called there
too, as the directory scope does). A hook answers from the test's thread.

What it does not model: key locks (a forgotten or closed group's work does not hold its
key: ``left_flights_hold_keys`` is False, as in the fleet), leases that run out with
time, lost or re-sent messages other than the hooks', failovers and rejoins, wire
limits (only an optional key length), protocol versions, forks (``on_fork`` is never
called: the fake has no thread to lose).

Its parts: :mod:`._coordinator` (the groups it makes, the hooks), :mod:`._scope` (a
group's side, a call's record), :mod:`._table` (the flights and the decisions).
"""

from __future__ import annotations

from ._coordinator import FakeCoordinator
from ._scope import FakeCall, FakeScope

__all__ = ["FakeCall", "FakeCoordinator", "FakeScope"]
