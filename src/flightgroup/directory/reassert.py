"""A lead reasserted to the coordinator (:class:`Reasserts`): a leader back on a new
connection, or a flight of an earlier term after a failover (ADR 0020, 0022, 0028).

The same flight is led again by its new connection; a flight newer than the key's
current one takes the key over (the older one is interrupted, or stays detached for its
own joiners if it landed already); a forgotten flight, or one that landed, comes back
detached, for its own joiners and rejoins only; a reassert older than what the key ran
since is refused, and its leader loses its lease. The calls that waited for the key's
lock go on once the key is reasserted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from . import epochs, fs, wire
from .records import Flight, Waiting, add_tokens
from .server import Session
from .term import Term, tell_detached

__all__ = ["Reasserts"]


class Reasserts:
    """The reasserts of one term (see the module); on the coordinator's loop.
    ``resume`` lets a call waiting for a key's lock go on; ``interrupt`` ends a flight
    without an outcome (both the coordinator's)."""

    __slots__ = ("interrupt", "resume", "term")

    def __init__(
        self,
        term: Term,
        *,
        resume: Callable[[Waiting, str], None],
        interrupt: Callable[[Flight, str], None],
    ) -> None:
        self.term = term
        self.resume = resume
        self.interrupt = interrupt

    def reassert(self, session: Session, request: wire.Reassert) -> None:
        """``session`` says it leads ``request.key``'s flight of ``request.token``."""
        term = self.term
        key, token = request.key, request.token
        # A leader's tokens only grow: an "earlier" one that does not is no token of its.
        tokens = frozenset((token, *(t for t in request.earlier if t < token)))
        same = term.flight_of(key, tokens)
        if same is not None:
            self._lead_again(same, session, request, tokens)
            return
        # A forget() detached this flight (in this term or an earlier one): it comes
        # back for its own joiners only (ADR 0020).
        mark = fs.forgotten_mark(term.directory, key)
        # A flight that landed already (its landing follows) comes back for its own
        # joiners and rejoins only, never as the key's flight: a new call that joined it
        # would get an outcome that ended before the call, an interruption if its group
        # closed. New calls wait for its key lock, then lead (ADR 0022 addendum).
        detached = (mark is not None and min(tokens) <= mark) or request.landed
        older = term.flights.get(key)
        if not detached:
            reason = self._newer_than(key, token, older)
            if reason:
                session.send(wire.rejected_frame(request.id, reason))
                return
        moved: list[tuple[Session, int]] = []
        if not detached and older is not None:
            moved = self._take_over(older)
        started = time.monotonic()
        flight = Flight(
            key, token, session, request.id, started, reasserted=True, detached=detached,
            landed=request.landed,
        )
        add_tokens(flight, tokens)
        session.leads[request.id] = flight
        if detached:
            self._back_detached(flight)
            return
        term.flights[key] = flight
        term.releasing.pop(key, None)
        term.outcomes.led_past(key)
        for caller, id in moved:
            if not caller.closed and caller.parties.get(id) is older:
                caller.parties[id] = flight
                flight.fresh.append((caller, id))
        for each in term.waiting.pop(key, ()):
            self.resume(each, key)

    def _lead_again(
        self, same: Flight, session: Session, request: wire.Reassert, tokens: frozenset[int]
    ) -> None:
        """The same flight, its leader back on a new connection (it may have missed
        the token of an attempt: it asks again, its `attempt` is still out)."""
        if same.leader is session:
            session.send(wire.error_frame(request.id, "this connection already leads the flight"))
            return
        if same.leader is not None:
            same.leader.leads.pop(same.lead_id, None)
        same.leader, same.lead_id = session, request.id
        session.leads[request.id] = same
        same.token = max(same.token, request.token)
        same.landed = same.landed or request.landed
        add_tokens(same, tokens)
        if same.detached:
            session.tell_detached(request.id)

    def _newer_than(self, key: str, token: int, older: Flight | None) -> str:
        """Why a reassert of ``key`` with ``token`` is refused: a newer flight of the
        key runs, ended, or ran; "" if none did."""
        if older is not None and older.token > token:
            return "a newer flight of the key runs"
        if self.term.outcomes.last_ended(key) > token:
            return "a newer flight of the key ended"
        if (epochs.key_lock_token(self.term.directory, key) or 0) > token:
            # A newer flight of the key took its lock and ended, in this term (unlike
            # reasserted ones, those are not in the endings): this one was granted,
            # then overtaken while it waited for the lock (ADR 0028).
            return "a newer flight of the key ran"
        return ""

    def _take_over(self, older: Flight) -> list[tuple[Session, int]]:
        """A reasserted flight newer than ``older``, the key's flight, takes the key.
        Returns ``older``'s fresh callers: they came after both began, so they wait
        for the newer one's end."""
        moved, older.fresh = older.fresh, []
        if older.landed:
            # It landed (its landing is still being read): it stays for its own
            # joiners, detached (ADR 0022).
            del self.term.flights[older.key]
            self.term.detach(older)
            tell_detached(older)
        else:
            # It cannot hold the key's lock too: its leader lost it.
            if older.leader is not None:
                older.leader.leads.pop(older.lead_id, None)
                older.leader.send(wire.rejected_frame(older.lead_id, "a newer flight reasserted"))
            self.interrupt(older, "a newer flight of the key took over")
        return moved

    def _back_detached(self, flight: Flight) -> None:
        """A reasserted ``flight`` comes back detached: only the rejoins of this very
        flight stop waiting; new calls go on waiting for the key's lock, then lead."""
        key = flight.key
        self.term.detach(flight)
        assert flight.leader is not None
        flight.leader.tell_detached(flight.lead_id)
        waiting = self.term.waiting.get(key)
        if not waiting:
            return
        mine = [
            w for w in waiting if w.rejoin is not None and not w.rejoin.isdisjoint(flight.tokens)
        ]
        if mine:
            waiting[:] = [w for w in waiting if w not in mine]
            for each in mine:
                self.resume(each, key)
