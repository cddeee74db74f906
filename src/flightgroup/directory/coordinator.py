"""The coordinator: the decisions of one term of a directory group.

The process whose group won the election (an exclusive ``flock`` on
``flight.lock``, :mod:`.election`) runs one Coordinator on its group's background event
loop. It decides lead or join for every key of the directory in one step, hands the
leader's outcome to every joiner, then acknowledges the landing to the leader.
It never runs user work and never decodes a value: outcomes pass through as the
leader's codec made them.

It owns the decisions; what it builds on is elsewhere: the socket and the connections
(:mod:`.server`), what it knows of each key (:mod:`.records`: flights, calls waiting,
endings and kept outcomes), and waiting for a key's lock (:mod:`.lockwatch`). A new
call of a key the coordinator knows no flight of is led at once when the key's lock is
free; when another process holds it, the call waits: a reassert of the key makes it a
joiner, the lock freeing first makes it the leader.

Everything here runs on one event loop thread; watcher threads only post back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

from ..scope.outcome import Failure, Interrupted, SharedOutcome, Value
from . import fs, wire
from .keptfiles import KeptFiles
from .lockwatch import KeyLockWatch, ProbeError, key_held
from .records import (
    Flight,
    Outcomes,
    Waiting,
    add_tokens,
    began_after,
    rejoin_tokens,
)
from .server import Frames, Server, Session

__all__ = ["Coordinator"]

log = logging.getLogger("flightgroup")


def _raised_at(exc: BaseException) -> str:
    """Where ``exc`` was raised: ``file:line`` of its innermost frame (no content)."""
    tb = exc.__traceback__
    if tb is None:
        return "?"
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"


_RELEASING_MAX = 10_000  # landed keys remembered as releasing; past it the probe decides
_SEQUENCE_MAX = (1 << 32) - 1  # a token's low 32 bits; a term out of them takes the next epoch


class Coordinator:
    """One term of the directory's coordinator. ``start`` serves; ``close`` stops
    and resigns (releases the election lock) after the socket is gone."""

    def __init__(
        self,
        directory: str,
        epoch: int,
        lock_fd: int,
        *,
        max_frame: int = wire.DEFAULT_MAX_FRAME,
        rejoin_window: float = 5.0,
        handshake_timeout: float = wire.HANDSHAKE_TIMEOUT,
    ) -> None:
        self.directory = directory
        self.epoch = epoch
        self._lock_fd = lock_fd
        self._rejoin_window = rejoin_window
        self._sequence = 0
        self._flights: dict[str, Flight] = {}
        # key -> its flights that are not its current one (detached, see Flight), until
        # they end: their joiners and rejoins by token still reach them
        self._detached: dict[str, list[Flight]] = {}
        self._waiting: dict[str, list[Waiting]] = {}
        self._releasing: dict[str, int] = {}  # key -> token of a landed flight not yet acked
        self._outcomes = Outcomes(KeptFiles(directory))
        self._server = Server(
            directory, max_frame=max_frame, handshake_timeout=handshake_timeout,
            on_frames=self._handle, on_closed=self._session_closed,
        )
        self._key_locks = KeyLockWatch(
            directory, self._waiting.__contains__, self._key_freed, self._fail_waiting
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    # -- serving ----------------------------------------------------------------

    async def start(self) -> None:
        """Bind ``flight.sock`` (0600) and serve. Only the holder of the election
        lock gets here, so the stale socket of a dead coordinator may be removed."""
        self._loop = self._key_locks.loop = asyncio.get_running_loop()
        # Before the socket serves: no call misses an outcome an earlier term kept.
        self._outcomes.load()
        self._server.start(self._loop)
        log.info("coordinating %s, epoch %d", self.directory, self.epoch)

    async def close(self) -> None:
        """Stop serving, flush and close every connection, remove the socket, then
        resign. Removing the socket before resigning keeps this close from removing
        a successor's socket."""
        if self.closed:
            return
        self.closed = True
        self._key_locks.close()  # its watchers block on: the next term here may adopt them
        await self._server.close()
        os.close(self._lock_fd)  # resign: another process's campaign wins now
        log.info("resigned %s, epoch %d", self.directory, self.epoch)

    def _handle(self, frames: Frames, session: Session) -> None:
        for header, payload in frames:
            try:
                request = wire.parse_request(header, payload)
            except wire.BadRequest as exc:
                session.send(wire.error_frame(exc.id, exc.message))
                continue
            except Exception as exc:  # a request the checks did not foresee: that peer only
                # The exception's type and where it was raised, never its message or
                # repr: they can quote the request (a key can hold a tenant id).
                log.warning(
                    "dropped pid %d: its request broke the parser: %s at %s",
                    session.pid, type(exc).__qualname__, _raised_at(exc),
                )
                session.transport.abort()
                return
            self._dispatch(session, request)

    # -- requests ---------------------------------------------------------------

    def _dispatch(self, session: Session, request: wire.Request) -> None:
        if isinstance(request, wire.Run):
            if request.notices:
                session.notices = True
            if request.id in session.parties or request.id in session.leads:
                session.send(wire.error_frame(request.id, "this id is already in use"))
            elif request.flight is not None:
                self._rejoin(session, request.id, request.key, rejoin_tokens(request))
            else:
                self._run(session, request.id, request.key, request.fresh, after=request.after)
        elif isinstance(request, wire.Land):
            self._land(session, request)
        elif isinstance(request, wire.Attempt):
            self._attempt(session, request.id)
        elif isinstance(request, wire.Cancel):
            self._cancel(session, request.id)
        elif isinstance(request, wire.Reassert):
            if request.notices:
                session.notices = True
            if request.id in session.parties or request.id in session.leads:
                session.send(wire.error_frame(request.id, "this id is already in use"))
            else:
                self._reassert(session, request)
        elif isinstance(request, wire.Forget):
            self._forget(request.key)
            if request.id is not None:
                session.send(wire.ack_frame(request.id))
        elif isinstance(request, wire.Status):
            session.send(wire.status_answer_frame(request.id, self.status()))

    def _next_token(self) -> int:
        if self._sequence >= _SEQUENCE_MAX:
            # Out of tokens: the next epoch, taken in place (this process still holds
            # the election), keeps every later token above every earlier one. Once in
            # 2**32 - 1 leads and attempts, so the durable write may block the loop.
            epoch = fs.next_epoch(self.directory)
            log.info("%s: epoch %d used all its tokens, now epoch %d",
                     self.directory, self.epoch, epoch)
            self.epoch, self._sequence = epoch, 0
        self._sequence += 1
        return self.epoch << 32 | self._sequence

    def _run(
        self,
        session: Session,
        id: int,
        key: str,
        fresh: bool,
        kept: bool = True,
        after: int | None = None,
    ) -> None:
        """Lead or join ``key``; ``kept``: a kept outcome may serve it (not a fresh
        call, nor one that waited for the end of the very flight that is kept).
        ``fresh``: only a flight that began after the call does; with ``after``, one
        that began after the flight of that token (its callers came during that one)."""
        flight = self._flights.get(key)
        if flight is not None:
            if fresh and not began_after(flight, after):
                flight.fresh.append((session, id))
                session.parties[id] = flight
            else:
                self._join(flight, session, id)
            return
        if kept and (not fresh or after is not None):
            entry = self._outcomes.kept_of(key)
            if entry is not None and (after is None or entry[0] > after):  # after: fresh
                token, outcome = entry
                session.send(wire.landed_frame(id, token, outcome, kept=True))
                return
        waiting = self._waiting.get(key)
        if waiting is not None:  # others already wait for this key's lock
            waiting.append(Waiting(session, id, None, fresh, after))
            session.parties[id] = key
            return
        try:
            held = key not in self._releasing and key_held(self.directory, key, create=False)
        except ProbeError as exc:
            session.send(wire.error_frame(id, str(exc)))
            return
        if not held:
            self._lead(session, id, key)
            return
        self._wait_for_key(key, Waiting(session, id, None, fresh, after))

    def _rejoin(self, session: Session, id: int, key: str, tokens: frozenset[int]) -> None:
        """A rejoin of the flight that had (any of) ``tokens``."""
        mine = self._flight_of(key, tokens)
        if mine is not None:
            self._join(mine, session, id)
            return
        flight = self._flights.get(key)
        ending = self._outcomes.ending_of(tokens)
        if ending is not None:
            self._send_ending(session, id, ending.token, ending.outcome)
            return
        if flight is None:
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.append(Waiting(session, id, tokens, False))
                session.parties[id] = key
                return
            try:
                held = key_held(self.directory, key, create=False)
            except ProbeError as exc:
                session.send(wire.error_frame(id, str(exc)))
                return
            if held:
                self._wait_for_key(key, Waiting(session, id, tokens, False))
                return
        session.send(wire.interrupted_frame(id, "its flight ended while this call reconnected"))

    def _flight_of(self, key: str, tokens: frozenset[int]) -> Flight | None:
        """The running flight of ``key`` that had (any of) ``tokens``: the current one,
        or one that is detached."""
        flight = self._flights.get(key)
        if flight is not None and not flight.tokens.isdisjoint(tokens):
            return flight
        for each in self._detached.get(key, ()):
            if not each.tokens.isdisjoint(tokens):
                return each
        return None

    def _join(self, flight: Flight, session: Session, id: int) -> None:
        flight.joiners[(session, id)] = None
        session.parties[id] = flight
        pid = flight.leader.pid if flight.leader is not None else 0
        age = time.monotonic() - flight.started
        session.send(wire.joined_frame(id, flight.token, pid, round(age, 6)))
        if flight.detached:  # a rejoin after a failover
            session.tell_detached(id)

    @staticmethod
    def _tell_detached(flight: Flight) -> None:
        """Tell ``flight``'s leader and joiners it is no longer its key's, so that no
        new local call in their processes joins their local flight of it either. Only
        a courtesy (it may be lost with this coordinator); the forgotten mark is what
        holds across terms (ADR 0020, ADR 0026)."""
        if flight.leader is not None:
            flight.leader.tell_detached(flight.lead_id)
        for session, id in flight.joiners:
            session.tell_detached(id)

    def _lead(self, session: Session, id: int, key: str) -> None:
        try:
            token = self._next_token()
        except (OSError, fs.EpochError) as exc:
            session.send(wire.error_frame(id, f"no token to lead with: {exc}"))
            return
        self._releasing.pop(key, None)
        self._outcomes.led_past(key)
        flight = Flight(key, token, session, id, time.monotonic())
        flight.tokens.add(flight.token)
        self._flights[key] = flight
        session.leads[id] = flight
        session.send(wire.lead_frame(id, flight.token))

    def _attempt(self, session: Session, id: int) -> None:
        """A retry of the lead ``id``: its flight goes on under a new token."""
        flight = session.leads.get(id)
        if flight is None:
            session.send(wire.rejected_frame(id, "this process leads no flight with this id"))
            return
        try:
            flight.token = self._next_token()
        except (OSError, fs.EpochError) as exc:  # no token to go on: its lease is lost
            del session.leads[id]
            self._interrupt(flight, "its leader got no token for its next attempt")
            session.send(wire.rejected_frame(id, f"no token for the next attempt: {exc}"))
            return
        add_tokens(flight, {flight.token})
        if flight.detached and flight.key not in self._flights:
            # A later term must know this token is of a forgotten flight. Not while the
            # key's next flight runs: its token is lower, and the mark would detach it
            # too; the retry's reassert still names its first token (``earlier``).
            fs.mark_forgotten(self.directory, flight.key, flight.token)
        session.send(wire.lead_frame(id, flight.token))
        # Joiners learn the new token (a `joined` again), so that after a failover
        # they rejoin the flight by the token its leader reasserts.
        if flight.joiners:
            pid = session.pid
            age = round(time.monotonic() - flight.started, 6)
            for joiner, joiner_id in flight.joiners:
                joiner.send(wire.joined_frame(joiner_id, flight.token, pid, age))

    def _land(self, session: Session, land: wire.Land) -> None:
        flight = session.leads.get(land.id)
        if flight is None or flight.token != land.token:
            session.send(wire.rejected_frame(land.id, "the flight is no longer this leader's"))
            return
        del session.leads[land.id]
        key = flight.key
        current = self._flights.get(key) is flight
        if current:
            del self._flights[key]
        outcome = land.outcome
        written = self._deliver(flight, outcome)
        # Acknowledged before a kept outcome's file is written: the leader's call waits
        # for this answer (ADR 0040), and no other request is read before this landing
        # is done with here.
        self._server.ack_when_drained(
            session, land.id, written, self._rejoin_window, taken=land.taken
        )
        # A detached flight (forgotten, or older than the key's current one) is never kept.
        if isinstance(outcome, (Value, Failure)) and outcome.keep and current:
            self._outcomes.keep(key, flight.token, outcome, outcome.keep)
        elif current:
            # A newer outcome that is not kept: the key's older kept one (a fresh call
            # led past it) must not be served after it.
            self._outcomes.drop_kept(key)
        # A leader frees the key lock once this landing is acknowledged, so the next
        # call leads at once (its lock taken when freed). Not after an interruption or
        # a timeout: a group that closed, or a sync work past its deadline, keeps the
        # lock until its work ends, and each process's next call would wait for it in
        # a thread of its own; they wait here instead, on the key's one watcher.
        if isinstance(outcome, (Value, Failure)):
            if len(self._releasing) >= _RELEASING_MAX:
                self._releasing.clear()  # only an optimisation: the probe takes over
            self._releasing[key] = flight.token
        else:
            self._releasing.pop(key, None)
        self._after(flight)

    def _deliver(self, flight: Flight, outcome: SharedOutcome) -> set[Session]:
        """Hand ``outcome`` to every joiner of ``flight`` (which left the table);
        returns the sessions written to."""
        flight.ended = True
        if flight.detached:
            others = self._detached.get(flight.key)
            if others is not None:
                with contextlib.suppress(ValueError):
                    others.remove(flight)
                if not others:
                    del self._detached[flight.key]
        written: set[Session] = set()
        for session, id in flight.joiners:
            session.parties.pop(id, None)
            self._send_ending(session, id, flight.token, outcome)
            written.add(session)
        flight.joiners.clear()
        if flight.reasserted and self._rejoin_window > 0:
            self._outcomes.end(flight, outcome, self._rejoin_window)
        return written

    def _send_ending(self, session: Session, id: int, token: int, outcome: SharedOutcome) -> None:
        if isinstance(outcome, Interrupted):
            session.send(wire.interrupted_frame(id, outcome.reason))
        else:
            session.send(wire.landed_frame(id, token, outcome))

    def _after(self, flight: Flight) -> None:
        """The fresh runs that waited for ``flight``'s end share the next flight."""
        fresh, flight.fresh = flight.fresh, []
        for session, id in fresh:
            if session.parties.get(id) is flight:
                del session.parties[id]
                if not session.closed:
                    self._run(session, id, flight.key, False, kept=False)

    def _interrupt(self, flight: Flight, reason: str) -> None:
        if flight.ended:
            return
        if self._flights.get(flight.key) is flight:
            del self._flights[flight.key]
            # Ended without an outcome to keep: as in _land, an older kept outcome (a
            # fresh call led past it) must not be served after it.
            self._outcomes.drop_kept(flight.key)
        self._deliver(flight, Interrupted(reason))
        self._after(flight)

    def _cancel(self, session: Session, id: int) -> None:
        lead = session.leads.pop(id, None)
        if lead is not None:
            self._interrupt(lead, "its leader withdrew")
            return
        part = session.parties.pop(id, None)
        if isinstance(part, Flight):
            part.joiners.pop((session, id), None)
            with contextlib.suppress(ValueError):
                part.fresh.remove((session, id))
        elif isinstance(part, str):
            waiting = self._waiting.get(part)
            if waiting is not None:
                waiting[:] = [w for w in waiting if not (w.session is session and w.id == id)]

    def _reassert(self, session: Session, request: wire.Reassert) -> None:
        key, token = request.key, request.token
        # A leader's tokens only grow: an "earlier" one that does not is no token of its.
        tokens = frozenset((token, *(t for t in request.earlier if t < token)))
        same = self._flight_of(key, tokens)
        if same is not None:
            self._lead_again(same, session, request, tokens)
            return
        # A forget() detached this flight (in this term or an earlier one): it comes
        # back for its own joiners only (ADR 0020).
        mark = fs.forgotten_mark(self.directory, key)
        # A flight that landed already (its landing follows) comes back for its own
        # joiners and rejoins only, never as the key's flight: a new call that joined it
        # would get an outcome that ended before the call, an interruption if its group
        # closed. New calls wait for its key lock, then lead (ADR 0022 addendum).
        detached = (mark is not None and min(tokens) <= mark) or request.landed
        older = self._flights.get(key)
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
        self._flights[key] = flight
        self._releasing.pop(key, None)
        self._outcomes.led_past(key)
        for caller, id in moved:
            if not caller.closed and caller.parties.get(id) is older:
                caller.parties[id] = flight
                flight.fresh.append((caller, id))
        for each in self._waiting.pop(key, ()):
            self._resume(each, key)

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
        if self._outcomes.last_ended(key) > token:
            return "a newer flight of the key ended"
        if (fs.key_lock_token(self.directory, key) or 0) > token:
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
            del self._flights[older.key]
            older.detached = True
            self._detached.setdefault(older.key, []).append(older)
            self._tell_detached(older)
        else:
            # It cannot hold the key's lock too: its leader lost it.
            if older.leader is not None:
                older.leader.leads.pop(older.lead_id, None)
                older.leader.send(wire.rejected_frame(older.lead_id, "a newer flight reasserted"))
            self._interrupt(older, "a newer flight of the key took over")
        return moved

    def _back_detached(self, flight: Flight) -> None:
        """A reasserted ``flight`` comes back detached: only the rejoins of this very
        flight stop waiting; new calls go on waiting for the key's lock, then lead."""
        key = flight.key
        self._detached.setdefault(key, []).append(flight)
        assert flight.leader is not None
        flight.leader.tell_detached(flight.lead_id)
        waiting = self._waiting.get(key)
        if not waiting:
            return
        mine = [
            w for w in waiting if w.rejoin is not None and not w.rejoin.isdisjoint(flight.tokens)
        ]
        if mine:
            waiting[:] = [w for w in waiting if w not in mine]
            for each in mine:
                self._resume(each, key)

    def _forget(self, key: str) -> None:
        """The next call of ``key`` leads a new flight; a kept outcome is dropped.
        The running flight goes on for its callers, detached (its key lock still
        makes a new leader wait for its work's end). Its token is written down before
        the forget is confirmed, so a later term that hears its reassert keeps it
        detached too (ADR 0020)."""
        self._outcomes.drop_kept(key, forgotten=True)  # before the forget is confirmed
        flight = self._flights.pop(key, None)
        if flight is not None:
            self._releasing.pop(key, None)
            flight.detached = True
            self._detached.setdefault(key, []).append(flight)
            fs.mark_forgotten(self.directory, key, flight.token)
            self._tell_detached(flight)
        else:
            # A flight of an earlier term may reassert later, whether it holds the key's
            # lock now or its leader still waits for it (told to lead while the key was
            # releasing), so no probe can tell: it began before this forget, as did
            # every flight of a token issued so far.
            fs.mark_forgotten(self.directory, key, self.epoch << 32 | self._sequence)

    # -- key locks --------------------------------------------------------------

    def _wait_for_key(self, key: str, waiting: Waiting) -> None:
        self._waiting[key] = [waiting]
        waiting.session.parties[waiting.id] = key
        self._key_locks.wait(key)

    def _fail_waiting(self, key: str, message: str) -> None:
        """Answer every call waiting for ``key``'s lock with an error."""
        for each in self._waiting.pop(key, ()):
            session = each.session
            if not session.closed and session.parties.get(each.id) == key:
                del session.parties[each.id]
                session.send(wire.error_frame(each.id, message))

    def _key_freed(self, key: str) -> None:
        if self.closed:
            return
        waiting = self._waiting.pop(key, None)
        if not waiting:
            return
        for each in waiting:
            self._resume(each, key)

    def _resume(self, waiting: Waiting, key: str) -> None:
        """A waiting run or rejoin goes on: its key was reasserted or its lock freed."""
        session, id = waiting.session, waiting.id
        if session.closed or session.parties.get(id) != key:
            return  # cancelled, or its connection closed
        del session.parties[id]
        flight = self._flights.get(key)
        if waiting.rejoin is not None:
            mine = self._flight_of(key, waiting.rejoin)
            if mine is not None:
                self._join(mine, session, id)
            else:
                ending = self._outcomes.ending_of(waiting.rejoin)
                if ending is not None:
                    self._send_ending(session, id, ending.token, ending.outcome)
                else:
                    session.send(wire.interrupted_frame(id, "its leader stopped before it landed"))
        elif flight is not None:
            if waiting.fresh and flight.reasserted and not began_after(flight, waiting.after):
                flight.fresh.append((session, id))  # it started before this call
                session.parties[id] = flight
            else:
                self._join(flight, session, id)
        else:
            self._lead(session, id, key)

    # -- connections ------------------------------------------------------------

    def _session_closed(self, session: Session) -> None:
        """A connection ended: its flights are interrupted, its calls withdrawn."""
        session.closed = True
        self._server.drained(session)  # nothing more will reach it: acks waiting for it go
        for id, flight in list(session.leads.items()):
            if flight.leader is session and flight.lead_id == id:
                flight.leader = None
                self._interrupt(flight, "its leader's process closed its connection")
        session.leads.clear()
        for id, part in list(session.parties.items()):
            if isinstance(part, Flight):
                part.joiners.pop((session, id), None)
                with contextlib.suppress(ValueError):
                    part.fresh.remove((session, id))
            else:  # the key whose lock it waited for
                waiting = self._waiting.get(part)
                if waiting is not None:
                    waiting[:] = [w for w in waiting if w.session is not session]
        session.parties.clear()

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
            for flights in (self._flights.values(), *self._detached.values())
            for flight in flights
        ]
