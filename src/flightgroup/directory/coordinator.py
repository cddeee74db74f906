"""The coordinator: the decisions of one term of a directory group.

The process whose group won the election (an exclusive ``flock`` on
``flight.lock``, :mod:`.election`) runs one Coordinator on its group's background event
loop. It decides lead or join for every key of the directory in one step, hands the
leader's outcome to every joiner, then acknowledges the landing to the leader.
It never runs user work and never decodes a value: outcomes pass through as the
leader's codec made them.

It owns the decisions; what it builds on is elsewhere: the socket and the connections
(:mod:`.server`), what its term knows of the flights and the tokens it issues
(:mod:`.term`, on :mod:`.records`: flights, calls waiting, endings and kept outcomes),
a lead reasserted after a failover (:mod:`.reassert`), and waiting for a key's lock
(:mod:`.lockwatch`). A new
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

from ..scope.outcome import Failure, Interrupted, Value
from . import epochs, fs, wire
from .lockwatch import KeyLockWatch, ProbeError, key_held
from .reassert import Reasserts
from .records import Flight, Waiting, add_tokens, began_after, rejoin_tokens
from .server import Frames, Server, Session
from .term import Term, send_ending, tell_detached

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
        self._lock_fd = lock_fd
        self._rejoin_window = rejoin_window
        self._term = Term(directory, epoch, rejoin_window=rejoin_window)
        self._reasserts = Reasserts(self._term, resume=self._resume, interrupt=self._interrupt)
        self._server = Server(
            directory, max_frame=max_frame, handshake_timeout=handshake_timeout,
            on_frames=self._handle, on_closed=self._session_closed,
        )
        self._key_locks = KeyLockWatch(
            directory, self._term.waiting.__contains__, self._key_freed, self._fail_waiting
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    @property
    def epoch(self) -> int:
        """The epoch of the tokens this term issues now (the next one once the term
        used all its tokens)."""
        return self._term.epoch

    # -- serving ----------------------------------------------------------------

    async def start(self) -> None:
        """Bind ``flight.sock`` (0600) and serve. Only the holder of the election
        lock gets here, so the stale socket of a dead coordinator may be removed."""
        self._loop = self._key_locks.loop = asyncio.get_running_loop()
        # Before the socket serves: no call misses an outcome an earlier term kept.
        self._term.outcomes.load()
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
                self._reasserts.reassert(session, request)
        elif isinstance(request, wire.Forget):
            self._forget(request.key)
            if request.id is not None:
                session.send(wire.ack_frame(request.id))
        elif isinstance(request, wire.Status):
            session.send(wire.status_answer_frame(request.id, self.status()))

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
        flight = self._term.flights.get(key)
        if flight is not None:
            if fresh and not began_after(flight, after):
                flight.fresh.append((session, id))
                session.parties[id] = flight
            else:
                self._join(flight, session, id)
            return
        if kept and (not fresh or after is not None):
            entry = self._term.outcomes.kept_of(key)
            if entry is not None and (after is None or entry[0] > after):  # after: fresh
                token, outcome = entry
                session.send(wire.landed_frame(id, token, outcome, kept=True))
                return
        waiting = self._term.waiting.get(key)
        if waiting is not None:  # others already wait for this key's lock
            waiting.append(Waiting(session, id, None, fresh, after))
            session.parties[id] = key
            return
        try:
            held = key not in self._term.releasing and key_held(self.directory, key, create=False)
        except ProbeError as exc:
            session.send(wire.error_frame(id, str(exc)))
            return
        if not held:
            self._lead(session, id, key)
            return
        self._wait_for_key(key, Waiting(session, id, None, fresh, after))

    def _rejoin(self, session: Session, id: int, key: str, tokens: frozenset[int]) -> None:
        """A rejoin of the flight that had (any of) ``tokens``."""
        mine = self._term.flight_of(key, tokens)
        if mine is not None:
            self._join(mine, session, id)
            return
        flight = self._term.flights.get(key)
        ending = self._term.outcomes.ending_of(tokens)
        if ending is not None:
            send_ending(session, id, ending.token, ending.outcome)
            return
        if flight is None:
            waiting = self._term.waiting.get(key)
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

    def _join(self, flight: Flight, session: Session, id: int) -> None:
        flight.joiners[(session, id)] = None
        session.parties[id] = flight
        pid = flight.leader.pid if flight.leader is not None else 0
        age = time.monotonic() - flight.started
        session.send(wire.joined_frame(id, flight.token, pid, round(age, 6)))
        if flight.detached:  # a rejoin after a failover
            session.tell_detached(id)

    def _lead(self, session: Session, id: int, key: str) -> None:
        try:
            token = self._term.next_token()
        except (OSError, epochs.EpochError) as exc:
            session.send(wire.error_frame(id, f"no token to lead with: {exc}"))
            return
        self._term.releasing.pop(key, None)
        self._term.outcomes.led_past(key)
        flight = Flight(key, token, session, id, time.monotonic())
        flight.tokens.add(flight.token)
        self._term.flights[key] = flight
        session.leads[id] = flight
        session.send(wire.lead_frame(id, flight.token))

    def _attempt(self, session: Session, id: int) -> None:
        """A retry of the lead ``id``: its flight goes on under a new token."""
        flight = session.leads.get(id)
        if flight is None:
            session.send(wire.rejected_frame(id, "this process leads no flight with this id"))
            return
        try:
            flight.token = self._term.next_token()
        except (OSError, epochs.EpochError) as exc:  # no token to go on: its lease is lost
            del session.leads[id]
            self._interrupt(flight, "its leader got no token for its next attempt")
            session.send(wire.rejected_frame(id, f"no token for the next attempt: {exc}"))
            return
        add_tokens(flight, {flight.token})
        if flight.detached and flight.key not in self._term.flights:
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
        current = self._term.flights.get(key) is flight
        if current:
            del self._term.flights[key]
        outcome = land.outcome
        written = self._term.deliver(flight, outcome)
        # Acknowledged before a kept outcome's file is written: the leader's call waits
        # for this answer (ADR 0040), and no other request is read before this landing
        # is done with here.
        self._server.ack_when_drained(
            session, land.id, written, self._rejoin_window, taken=land.taken
        )
        # A detached flight (forgotten, or older than the key's current one) is never kept.
        if isinstance(outcome, (Value, Failure)) and outcome.keep and current:
            self._term.outcomes.keep(key, flight.token, outcome, outcome.keep)
        elif current:
            # A newer outcome that is not kept: the key's older kept one (a fresh call
            # led past it) must not be served after it.
            self._term.outcomes.drop_kept(key)
        # A leader frees the key lock once this landing is acknowledged, so the next
        # call leads at once (its lock taken when freed). Not after an interruption or
        # a timeout: a group that closed, or a sync work past its deadline, keeps the
        # lock until its work ends, and each process's next call would wait for it in
        # a thread of its own; they wait here instead, on the key's one watcher.
        if isinstance(outcome, (Value, Failure)):
            self._term.released_at(key, flight.token)
        else:
            self._term.releasing.pop(key, None)
        self._after(flight)

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
        if self._term.flights.get(flight.key) is flight:
            del self._term.flights[flight.key]
            # Ended without an outcome to keep: as in _land, an older kept outcome (a
            # fresh call led past it) must not be served after it.
            self._term.outcomes.drop_kept(flight.key)
        self._term.deliver(flight, Interrupted(reason))
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
            waiting = self._term.waiting.get(part)
            if waiting is not None:
                waiting[:] = [w for w in waiting if not (w.session is session and w.id == id)]

    def _forget(self, key: str) -> None:
        """The next call of ``key`` leads a new flight; a kept outcome is dropped.
        The running flight goes on for its callers, detached (its key lock still
        makes a new leader wait for its work's end). Its token is written down before
        the forget is confirmed, so a later term that hears its reassert keeps it
        detached too (ADR 0020)."""
        self._term.outcomes.drop_kept(key, forgotten=True)  # before the forget is confirmed
        flight = self._term.flights.pop(key, None)
        if flight is not None:
            self._term.releasing.pop(key, None)
            self._term.detach(flight)
            fs.mark_forgotten(self.directory, key, flight.token)
            tell_detached(flight)
        else:
            # A flight of an earlier term may reassert later, whether it holds the key's
            # lock now or its leader still waits for it (told to lead while the key was
            # releasing), so no probe can tell: it began before this forget, as did
            # every flight of a token issued so far.
            fs.mark_forgotten(self.directory, key, self._term.epoch << 32 | self._term.sequence)

    # -- key locks --------------------------------------------------------------

    def _wait_for_key(self, key: str, waiting: Waiting) -> None:
        self._term.waiting[key] = [waiting]
        waiting.session.parties[waiting.id] = key
        self._key_locks.wait(key)

    def _fail_waiting(self, key: str, message: str) -> None:
        """Answer every call waiting for ``key``'s lock with an error."""
        for each in self._term.waiting.pop(key, ()):
            session = each.session
            if not session.closed and session.parties.get(each.id) == key:
                del session.parties[each.id]
                session.send(wire.error_frame(each.id, message))

    def _key_freed(self, key: str) -> None:
        if self.closed:
            return
        waiting = self._term.waiting.pop(key, None)
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
        flight = self._term.flights.get(key)
        if waiting.rejoin is not None:
            mine = self._term.flight_of(key, waiting.rejoin)
            if mine is not None:
                self._join(mine, session, id)
            else:
                ending = self._term.outcomes.ending_of(waiting.rejoin)
                if ending is not None:
                    send_ending(session, id, ending.token, ending.outcome)
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
                waiting = self._term.waiting.get(part)
                if waiting is not None:
                    waiting[:] = [w for w in waiting if w.session is not session]
        session.parties.clear()

    def status(self) -> list[dict[str, object]]:
        """The flights in progress, for ``flightgroup status``."""
        return self._term.status()
