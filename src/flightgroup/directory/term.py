"""What one term of the coordinator knows of the directory's flights (:class:`Term`):
each key's current flight, the detached ones still running, the calls waiting for a
key's lock, the landed keys whose lock is being released, the outcomes kept, and the
tokens the term issues (``epoch << 32 | sequence``).

Everything here runs on the coordinator's event loop; the decisions (lead or join, a
reassert, a landing) are :mod:`.coordinator`'s and :mod:`.reassert`'s.
"""

from __future__ import annotations

import contextlib
import logging
import time

from ..scope.outcome import Interrupted, SharedOutcome
from . import epochs, wire
from .keptfiles import KeptFiles
from .records import Flight, Outcomes, Waiting
from .server import Session

__all__ = ["Term", "send_ending", "tell_detached"]

log = logging.getLogger("flightgroup")

_RELEASING_MAX = 10_000  # landed keys remembered as releasing; past it the probe decides
_SEQUENCE_MAX = (1 << 32) - 1  # a token's low 32 bits; a term out of them takes the next epoch


class Term:
    """The flights of one term and the tokens it issues (see the module)."""

    def __init__(self, directory: str, epoch: int, *, rejoin_window: float) -> None:
        self.directory = directory
        self.epoch = epoch
        self.sequence = 0
        self.rejoin_window = rejoin_window
        self.flights: dict[str, Flight] = {}
        # key -> its flights that are not its current one (detached, see Flight), until
        # they end: their joiners and rejoins by token still reach them
        self.detached: dict[str, list[Flight]] = {}
        self.waiting: dict[str, list[Waiting]] = {}
        self.releasing: dict[str, int] = {}  # key -> token of a landed flight not yet acked
        self.outcomes = Outcomes(KeptFiles(directory))

    def next_token(self) -> int:
        """The next token of this term; raises OSError or epochs.EpochError when the term
        is out of tokens and the next epoch cannot be written."""
        if self.sequence >= _SEQUENCE_MAX:
            # Out of tokens: the next epoch, taken in place (this process still holds
            # the election), keeps every later token above every earlier one. Once in
            # 2**32 - 1 leads and attempts, so the durable write may block the loop.
            epoch = epochs.next_epoch(self.directory)
            log.info("%s: epoch %d used all its tokens, now epoch %d",
                     self.directory, self.epoch, epoch)
            self.epoch, self.sequence = epoch, 0
        self.sequence += 1
        return self.epoch << 32 | self.sequence

    def flight_of(self, key: str, tokens: frozenset[int]) -> Flight | None:
        """The running flight of ``key`` that had (any of) ``tokens``: the current one,
        or one that is detached."""
        flight = self.flights.get(key)
        if flight is not None and not flight.tokens.isdisjoint(tokens):
            return flight
        for each in self.detached.get(key, ()):
            if not each.tokens.isdisjoint(tokens):
                return each
        return None

    def detach(self, flight: Flight) -> None:
        """``flight`` runs on for its own callers, no longer its key's."""
        flight.detached = True
        self.detached.setdefault(flight.key, []).append(flight)

    def released_at(self, key: str, token: int) -> None:
        """``key``'s flight ``token`` landed: its leader frees the key lock once acked."""
        if len(self.releasing) >= _RELEASING_MAX:
            self.releasing.clear()  # only an optimisation: the probe takes over
        self.releasing[key] = token

    def deliver(self, flight: Flight, outcome: SharedOutcome) -> set[Session]:
        """Hand ``outcome`` to every joiner of ``flight`` (which left the table);
        returns the sessions written to."""
        flight.ended = True
        if flight.detached:
            others = self.detached.get(flight.key)
            if others is not None:
                with contextlib.suppress(ValueError):
                    others.remove(flight)
                if not others:
                    del self.detached[flight.key]
        written: set[Session] = set()
        for session, id in flight.joiners:
            session.parties.pop(id, None)
            send_ending(session, id, flight.token, outcome)
            written.add(session)
        flight.joiners.clear()
        if flight.reasserted and self.rejoin_window > 0:
            self.outcomes.end(flight, outcome, self.rejoin_window)
        return written

    def status(self) -> list[dict[str, object]]:
        """The flights in progress, for ``flightgroup status``."""
        now = time.monotonic()
        return [
            {
                "key": flight.key,
                "token": flight.token,
                "leader_pid": flight.leader.pid if flight.leader is not None else None,
                "joiners": len(flight.joiners),
                "age_s": round(now - flight.started, 3),
            }
            for flights in (self.flights.values(), *self.detached.values())
            for flight in flights
        ]


def send_ending(session: Session, id: int, token: int, outcome: SharedOutcome) -> None:
    """Tell call ``id`` of ``session`` how its flight ended."""
    if isinstance(outcome, Interrupted):
        session.send(wire.interrupted_frame(id, outcome.reason))
    else:
        session.send(wire.landed_frame(id, token, outcome))


def tell_detached(flight: Flight) -> None:
    """Tell ``flight``'s leader and joiners it is no longer its key's, so that no
    new local call in their processes joins their local flight of it either. Only
    a courtesy (it may be lost with this coordinator); the forgotten mark is what
    holds across terms (ADR 0020, ADR 0026)."""
    if flight.leader is not None:
        flight.leader.tell_detached(flight.lead_id)
    for session, id in flight.joiners:
        session.tell_detached(id)
