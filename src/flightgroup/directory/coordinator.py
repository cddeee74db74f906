"""The coordinator: the server of one term of a directory group.

The process whose group won the election (an exclusive ``flock`` on
``flight.lock``) runs one Coordinator on its group's background event loop. It
decides lead or join for every key of the directory in one step, hands the
leader's outcome to every joiner, then acknowledges the landing to the leader.
It never runs user work and never decodes a value: outcomes pass through as the
leader's codec made them.

Key locks (``execution-locks/<sha256>``) are the kernel's word on who runs a key.
A new call of a key the coordinator knows no flight of is led at once when the
key's lock is free; when another process holds it (a leader of an earlier term
that has not reasserted yet, a leader whose group closed while its work runs, a
frozen one), the call waits: a reassert of the key makes it a joiner, the lock
freeing first makes it the leader. A watcher thread blocks on the lock for such
keys (no polling). Past ``_WATCHERS_MAX`` keys, or when a watcher cannot be had (no
thread, no descriptor), the key's lock is probed every ``_POLL_INTERVAL`` instead:
never reported free before it is.

Everything here runs on one event loop thread; watcher threads only post back.

The rejoin window: the outcome of a flight reasserted in this term (born in an
earlier one) is kept ``rejoin_window`` seconds after it ends, so a joiner that
reconnects after its leader landed still gets it.

Tokens: a flight that retries gets a new token per attempt, and a process may have
missed some of them (a `joined` or `lead` frame lost with a coordinator that died).
So a flight keeps every token it had that this coordinator heard of (its reassert's
``earlier`` tokens, its attempts here; the latest ``wire.MAX_EARLIER + 1``): a rejoin
names its flight if any of its tokens is one of them, and an ending is kept under each.
Which of two flights of a key is newer is decided by their current tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..retention import RetentionStore
from ..scope.outcome import Failure, Interrupted, SharedOutcome, Value, kept_size
from . import forked, fs, wire

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


_PEERCRED = struct.Struct("3i")
# Kept outcomes (Retention): the bounds when a landing names none (a peer of an earlier
# release); max_bytes absent is this coordinator's memory guard.
_KEPT_MAX_ITEMS = 10_000
_KEPT_MAX_BYTES = 256 * 1024 * 1024
_RELEASING_MAX = 10_000
_CLOSE_FLUSH = 0.5  # s: closing, what was written to each peer may still leave
_SEQUENCE_MAX = (1 << 32) - 1  # a token's low 32 bits; a term out of them takes the next epoch
_WATCHERS_MAX = 256  # key-lock watcher threads of a process; more keys are polled
_POLL_INTERVAL = 0.05  # s: between probes of a polled key's lock
_ACCEPT_PAUSE = 0.1  # s: the listener is not watched after accept failed (no descriptor)
# Probing a key's lock failed for want of a resource that comes back: it may be held.
_TRANSIENT = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EAGAIN, errno.EINTR}
)


@dataclass(eq=False)
class _Flight:
    """A flight the coordinator knows: its leader (session and request id) and
    its joiners. ``reasserted``: born in an earlier term."""

    key: str
    token: int  # the current attempt's
    leader: _Session | None
    lead_id: int
    started: float
    reasserted: bool = False
    # Not the key's current flight: a forget() detached it, or it reasserted a landing
    # while a newer flight of the key ran. It serves its own joiners and rejoins by
    # token, never a new call (see _detached).
    detached: bool = False
    # It reasserted a landing (its `land` follows on its leader's connection): a newer
    # flight that reasserts meanwhile detaches it instead of refusing it (ADR 0022).
    landed: bool = False
    # every token the flight had that this coordinator knows (``token`` too)
    tokens: set[int] = field(default_factory=set)
    ended: bool = False  # landed or interrupted: it is nobody's to end again
    # (session, request id) -> None, in join order
    joiners: dict[tuple[_Session, int], None] = field(default_factory=dict)
    # fresh runs waiting for this flight's end: (session, request id)
    fresh: list[tuple[_Session, int]] = field(default_factory=list)


def _began_after(flight: _Flight, after: int | None) -> bool:
    """``flight`` began after the flight whose last token is ``after`` (its first token
    is higher: a key's flights take ever higher tokens); None: no flight that exists
    began after a fresh call that comes now."""
    return after is not None and min(flight.tokens, default=flight.token) > after


@dataclass(eq=False)
class _Waiting:
    """A run or rejoin waiting for a key whose lock another process holds."""

    session: _Session
    id: int
    rejoin: frozenset[int] | None  # the tokens of the flight a rejoin wants, else None
    fresh: bool
    after: int | None = None  # (fresh) a flight that began after this token's will do


@dataclass(eq=False)
class _PendingAck:
    """An ack that waits until the landing left for every joiner."""

    leader: _Session
    id: int
    waiting: set[_Session]
    timer: asyncio.TimerHandle | None = None
    sent: bool = False


@dataclass
class _Ending:
    key: str
    token: int  # the flight's last token (a `landed` carries it)
    outcome: SharedOutcome
    until: float


_TOKENS_MAX = wire.MAX_EARLIER + 1  # the tokens a flight keeps: its current and earlier ones
# state/forgotten/<sha256 of the key>: the last token of a flight of the key that a forget()
# detached (fixed-width decimal text), so that a later term knows it (ADR 0020).
_FORGOTTEN = "forgotten"
_MARK_SIZE = 64


class _ProbeError(Exception):
    """A key's lock cannot be probed, and not for want of a resource (its file is
    not ours to open, say): the calls that need it are answered with an error."""


class _Watcher:
    """A thread blocked in ``flock`` on one key's lock, reporting to the coordinator
    that owns it when the lock frees. Nothing calls off a blocking flock, so a closed
    coordinator's watcher stays until the lock frees, and the next term of this
    process that waits on the key adopts it (as a closed group's election thread is,
    ADR 0016): one watcher per key-lock file per process, whatever the terms."""

    __slots__ = ("key", "owner", "path")

    def __init__(self, path: str, key: str, owner: Coordinator) -> None:
        self.path = path
        self.key = key
        self.owner: Coordinator | None = owner

    def run(self) -> None:
        freed = True
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            freed = False  # its owner polls the key instead: never "free" unseen
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # blocks until the holder lets go
            except OSError:
                freed = False
            finally:
                os.close(fd)
        with _watchers_lock:
            if _watchers.get(self.path) is self:
                del _watchers[self.path]
            owner, self.owner = self.owner, None
        loop = owner._loop if owner is not None else None
        if owner is None or loop is None:
            return
        report = owner._key_freed if freed else owner._poll
        with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
            loop.call_soon_threadsafe(report, self.key)


_watchers: dict[str, _Watcher] = {}  # key-lock path -> its watcher, while it blocks
_watchers_lock = threading.Lock()


def _forget_watchers() -> None:
    """(In a forked child) the parent's watcher threads are not the child's."""
    global _watchers_lock
    _watchers.clear()
    _watchers_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_watchers)


def _add_tokens(flight: _Flight, tokens: frozenset[int] | set[int]) -> None:
    """``flight`` had ``tokens`` too; it keeps the latest ``_TOKENS_MAX`` (the highest:
    tokens only grow from attempt to attempt)."""
    flight.tokens |= tokens
    while len(flight.tokens) > _TOKENS_MAX:
        flight.tokens.discard(min(flight.tokens))


def _rejoin_tokens(run: wire.Run) -> frozenset[int]:
    assert run.flight is not None
    return frozenset((run.flight, *run.earlier))


class _Session:
    """One connection from one group of one process."""

    def __init__(self, transport: asyncio.WriteTransport, pid: int) -> None:
        self.transport = transport
        self.pid = pid
        self.closed = False
        # request id -> what it is part of: a flight it joined or waits the end of,
        # a key whose lock it waits on (str), or the flight it leads (in ``leads``)
        self.parties: dict[int, _Flight | str] = {}
        self.leads: dict[int, _Flight] = {}
        self.drains: list[_PendingAck] = []  # acks waiting for this write buffer to empty
        # It said `"notices":true`: it hears `detached` (a peer of an earlier release
        # would take the unknown answer as a broken coordinator).
        self.notices = False

    def send(self, frame: bytes) -> None:
        # Not once the transport is closing: a peer that died is known to the transport
        # a loop turn before connection_lost marks the session closed, and asyncio logs
        # every write past the fifth made meanwhile ("socket.send() raised exception.").
        if not self.closed and not self.transport.is_closing():
            self.transport.write(frame)

    def tell_detached(self, id: int) -> None:
        """The flight of request ``id`` is no longer its key's (ADR 0026), if this
        connection said it hears that."""
        if self.notices:
            self.send(wire.detached_frame(id))


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
        self._max_frame = max_frame
        self._rejoin_window = rejoin_window
        self._handshake_timeout = handshake_timeout
        self._sequence = 0
        self._flights: dict[str, _Flight] = {}
        # key -> its flights that are not its current one (detached, see _Flight), until
        # they end: their joiners and rejoins by token still reach them
        self._detached: dict[str, list[_Flight]] = {}
        self._waiting: dict[str, list[_Waiting]] = {}
        self._polled: set[str] = set()  # waited-for keys with no watcher: probed by a timer
        self._poll_timer: asyncio.TimerHandle | None = None
        self._endings: dict[int, _Ending] = {}
        self._releasing: dict[str, int] = {}  # key -> token of a landed flight not yet acked
        # Kept outcomes (Retention), the engine's own store: expired ones go before any
        # live one is evicted. Each keep passes its landing's bounds.
        self._kept = RetentionStore(_KEPT_MAX_ITEMS, _KEPT_MAX_BYTES)
        self._sessions: set[_Session] = set()
        # every accepted connection until it is lost (greeted or not): close() ends them
        self._transports: set[asyncio.Transport] = set()
        self._none_left: asyncio.Event | None = None  # set once closing, when empty
        # The listening socket, read by this loop; each accepted socket becomes a
        # transport in a task of its own (no asyncio.Server: on 3.13 a connection it
        # accepted while closing raised in its __del__ when collected later).
        self._listener: socket.socket | None = None
        self._accept_failing = False  # warned that accept fails; not again until it works
        self._accepting: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._uid = os.getuid()
        self._pid = os.getpid()
        # Every connection reads into this one (see _Connection); a bigger frame
        # arrives over several reads.
        self._read_buffer = memoryview(bytearray(wire.READ_SIZE))
        self.closed = False

    # -- serving ----------------------------------------------------------------

    async def start(self) -> None:
        """Bind ``flight.sock`` (0600) and serve. Only the holder of the election
        lock gets here, so the stale socket of a dead coordinator may be removed."""
        self._loop = asyncio.get_running_loop()
        path = fs.socket_path(self.directory)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock: socket.socket | None = None
        try:
            with forked.socket_guard():  # no fork before it is bound (forked.py)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.bind(path)
            os.chmod(path, 0o600)  # before listen: nobody can connect to it yet
            sock.listen(512)
            sock.setblocking(False)
            self._loop.add_reader(sock.fileno(), self._accept)
            self._listener = sock
        except BaseException:
            if sock is not None:
                sock.close()
            raise
        log.info("coordinating %s, epoch %d", self.directory, self.epoch)

    async def close(self) -> None:
        """Stop serving, flush and close every connection, remove the socket, then
        resign. Removing the socket before resigning keeps this close from removing
        a successor's socket."""
        if self.closed:
            return
        self.closed = True
        if self._poll_timer is not None:
            self._poll_timer.cancel()
            self._poll_timer = None
        with _watchers_lock:  # they block on: the next term here may adopt them
            for watcher in _watchers.values():
                if watcher.owner is self:
                    watcher.owner = None
        listener, self._listener = self._listener, None
        if listener is not None:
            assert self._loop is not None
            self._loop.remove_reader(listener.fileno())
            listener.close()
        if self._accepting:  # set up as this closes: connection_made ends them
            await asyncio.wait(self._accepting, timeout=_CLOSE_FLUSH)
        for session in list(self._sessions):
            session.closed = True
        self._none_left = asyncio.Event()
        for transport in list(self._transports):
            transport.close()  # flushes what was written, then closes
        # A peer that does not read (frozen) would keep its transport open past the
        # loop's end, to be collected unclosed later: flushing is bounded, then cut.
        if self._transports:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._none_left.wait(), _CLOSE_FLUSH)
        for transport in list(self._transports):
            transport.abort()
        if self._transports:  # abort() reports connection_lost on a later pass
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._none_left.wait(), _CLOSE_FLUSH)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(fs.socket_path(self.directory))
        os.close(self._lock_fd)  # resign: another process's campaign wins now
        log.info("resigned %s, epoch %d", self.directory, self.epoch)

    def _accept(self) -> None:
        """The listening socket is readable: take what waits (a burst at most)."""
        listener = self._listener
        loop = self._loop
        if listener is None or loop is None:
            return
        for _ in range(64):
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # EMFILE and the like. The listener stays readable (level-triggered): it
                # is left alone for a moment instead of spun on, and warned of once.
                if not self._accept_failing:
                    self._accept_failing = True
                    log.warning("cannot accept a connection on %s: %s", self.directory, exc)
                loop.remove_reader(listener.fileno())
                loop.call_later(_ACCEPT_PAUSE, self._accept_again)
                return
            if self._accept_failing:
                self._accept_failing = False
                log.info("accepting connections on %s again", self.directory)
            conn.setblocking(False)
            task = loop.create_task(
                loop.connect_accepted_socket(lambda: _Connection(self), conn)
            )
            self._accepting.add(task)
            task.add_done_callback(self._accepted)

    def _accept_again(self) -> None:
        listener = self._listener
        if listener is not None and self._loop is not None:  # (not closed meanwhile)
            self._loop.add_reader(listener.fileno(), self._accept)

    def _accepted(self, task: asyncio.Task[Any]) -> None:
        self._accepting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.info("a connection failed as it was set up: %s", task.exception())

    def _handle(self, frames: list[tuple[dict[str, Any], bytes | None]], session: _Session) -> None:
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

    def _dispatch(self, session: _Session, request: wire.Request) -> None:
        if isinstance(request, wire.Run):
            if request.notices:
                session.notices = True
            if request.id in session.parties or request.id in session.leads:
                session.send(wire.error_frame(request.id, "this id is already in use"))
            elif request.flight is not None:
                self._rejoin(session, request.id, request.key, _rejoin_tokens(request))
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
        session: _Session,
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
            if fresh and not _began_after(flight, after):
                flight.fresh.append((session, id))
                session.parties[id] = flight
            else:
                self._join(flight, session, id)
            return
        if kept and (not fresh or after is not None):
            entry = self._kept_of(key)
            if entry is not None and (after is None or entry[0] > after):  # after: fresh
                token, outcome = entry
                session.send(wire.landed_frame(id, token, outcome, kept=True))
                return
        waiting = self._waiting.get(key)
        if waiting is not None:  # others already wait for this key's lock
            waiting.append(_Waiting(session, id, None, fresh, after))
            session.parties[id] = key
            return
        try:
            held = key not in self._releasing and self._key_held(key, create=False)
        except _ProbeError as exc:
            session.send(wire.error_frame(id, str(exc)))
            return
        if not held:
            self._lead(session, id, key)
            return
        self._wait_for_key(key, _Waiting(session, id, None, fresh, after))

    def _rejoin(self, session: _Session, id: int, key: str, tokens: frozenset[int]) -> None:
        """A rejoin of the flight that had (any of) ``tokens``."""
        mine = self._flight_of(key, tokens)
        if mine is not None:
            self._join(mine, session, id)
            return
        flight = self._flights.get(key)
        ending = self._ending_of(tokens)
        if ending is not None:
            self._send_ending(session, id, ending.token, ending.outcome)
            return
        if flight is None:
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.append(_Waiting(session, id, tokens, False))
                session.parties[id] = key
                return
            try:
                held = self._key_held(key, create=False)
            except _ProbeError as exc:
                session.send(wire.error_frame(id, str(exc)))
                return
            if held:
                self._wait_for_key(key, _Waiting(session, id, tokens, False))
                return
        session.send(wire.interrupted_frame(id, "its flight ended while this call reconnected"))

    def _flight_of(self, key: str, tokens: frozenset[int]) -> _Flight | None:
        """The running flight of ``key`` that had (any of) ``tokens``: the current one,
        or one that is detached."""
        flight = self._flights.get(key)
        if flight is not None and not flight.tokens.isdisjoint(tokens):
            return flight
        for each in self._detached.get(key, ()):
            if not each.tokens.isdisjoint(tokens):
                return each
        return None

    def _join(self, flight: _Flight, session: _Session, id: int) -> None:
        flight.joiners[(session, id)] = None
        session.parties[id] = flight
        pid = flight.leader.pid if flight.leader is not None else 0
        age = time.monotonic() - flight.started
        session.send(wire.joined_frame(id, flight.token, pid, round(age, 6)))
        if flight.detached:  # a rejoin after a failover
            session.tell_detached(id)

    @staticmethod
    def _tell_detached(flight: _Flight) -> None:
        """Tell ``flight``'s leader and joiners it is no longer its key's, so that no
        new local call in their processes joins their local flight of it either. Only
        a courtesy (it may be lost with this coordinator); the forgotten mark is what
        holds across terms (ADR 0020, ADR 0026)."""
        if flight.leader is not None:
            flight.leader.tell_detached(flight.lead_id)
        for session, id in flight.joiners:
            session.tell_detached(id)

    def _lead(self, session: _Session, id: int, key: str) -> None:
        try:
            token = self._next_token()
        except (OSError, fs.EpochError) as exc:
            session.send(wire.error_frame(id, f"no token to lead with: {exc}"))
            return
        self._releasing.pop(key, None)
        flight = _Flight(key, token, session, id, time.monotonic())
        flight.tokens.add(flight.token)
        self._flights[key] = flight
        session.leads[id] = flight
        session.send(wire.lead_frame(id, flight.token))

    def _attempt(self, session: _Session, id: int) -> None:
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
        _add_tokens(flight, {flight.token})
        if flight.detached and flight.key not in self._flights:
            # A later term must know this token is of a forgotten flight. Not while the
            # key's next flight runs: its token is lower, and the mark would detach it
            # too; the retry's reassert still names its first token (``earlier``).
            self._mark_forgotten(flight.key, flight.token)
        session.send(wire.lead_frame(id, flight.token))
        # Joiners learn the new token (a `joined` again), so that after a failover
        # they rejoin the flight by the token its leader reasserts.
        if flight.joiners:
            pid = session.pid
            age = round(time.monotonic() - flight.started, 6)
            for joiner, joiner_id in flight.joiners:
                joiner.send(wire.joined_frame(joiner_id, flight.token, pid, age))

    def _land(self, session: _Session, land: wire.Land) -> None:
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
        # A detached flight (forgotten, or older than the key's current one) is never kept.
        if isinstance(outcome, (Value, Failure)) and outcome.keep and current:
            self._keep(key, flight.token, outcome, outcome.keep)
        elif current:
            # A newer outcome that is not kept: the key's older kept one (a fresh call
            # led past it) must not be served after it.
            self._drop_kept(key)
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
        self._ack_when_drained(session, land.id, written)
        self._after(flight)

    def _ack_when_drained(self, leader: _Session, id: int, written: set[_Session]) -> None:
        """Acknowledge the landing once it left this process for every joiner: the
        leader then frees its key lock and forgets the landing, so a landing still in
        a buffer here (a large value to a slow or frozen joiner) would die with this
        coordinator. Bounded by the rejoin window: a frozen joiner never holds a key."""
        waiting = {s for s in written if not s.closed and s.transport.get_write_buffer_size()}
        if not waiting:
            leader.send(wire.ack_frame(id))
            return
        pending = _PendingAck(leader, id, waiting)
        for each in waiting:
            each.drains.append(pending)
        assert self._loop is not None
        pending.timer = self._loop.call_later(
            max(self._rejoin_window, 0.1), self._send_ack, pending
        )

    def _drained(self, session: _Session) -> None:
        """``session``'s write buffer is empty (or it closed): acks waiting for it go."""
        pending, session.drains = session.drains, []
        for each in pending:
            each.waiting.discard(session)
            if not each.waiting:
                self._send_ack(each)

    def _send_ack(self, pending: _PendingAck) -> None:
        if pending.sent:
            return
        pending.sent = True
        if pending.timer is not None:
            pending.timer.cancel()
        pending.leader.send(wire.ack_frame(pending.id))

    def _deliver(self, flight: _Flight, outcome: SharedOutcome) -> set[_Session]:
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
        written: set[_Session] = set()
        for session, id in flight.joiners:
            session.parties.pop(id, None)
            self._send_ending(session, id, flight.token, outcome)
            written.add(session)
        flight.joiners.clear()
        if flight.reasserted and self._rejoin_window > 0:
            # Under every token of the flight: a joiner may rejoin by any of them.
            now = time.monotonic()
            ending = _Ending(flight.key, flight.token, outcome, now + self._rejoin_window)
            for token in flight.tokens:
                self._endings[token] = ending
            self._purge_endings(now)
        return written

    def _send_ending(self, session: _Session, id: int, token: int, outcome: SharedOutcome) -> None:
        if isinstance(outcome, Interrupted):
            session.send(wire.interrupted_frame(id, outcome.reason))
        else:
            session.send(wire.landed_frame(id, token, outcome))

    def _after(self, flight: _Flight) -> None:
        """The fresh runs that waited for ``flight``'s end share the next flight."""
        fresh, flight.fresh = flight.fresh, []
        for session, id in fresh:
            if session.parties.get(id) is flight:
                del session.parties[id]
                if not session.closed:
                    self._run(session, id, flight.key, False, kept=False)

    def _interrupt(self, flight: _Flight, reason: str) -> None:
        if flight.ended:
            return
        if self._flights.get(flight.key) is flight:
            del self._flights[flight.key]
            # Ended without an outcome to keep: as in _land, an older kept outcome (a
            # fresh call led past it) must not be served after it.
            self._drop_kept(flight.key)
        self._deliver(flight, Interrupted(reason))
        self._after(flight)

    def _cancel(self, session: _Session, id: int) -> None:
        lead = session.leads.pop(id, None)
        if lead is not None:
            self._interrupt(lead, "its leader withdrew")
            return
        part = session.parties.pop(id, None)
        if isinstance(part, _Flight):
            part.joiners.pop((session, id), None)
            with contextlib.suppress(ValueError):
                part.fresh.remove((session, id))
        elif isinstance(part, str):
            waiting = self._waiting.get(part)
            if waiting is not None:
                waiting[:] = [w for w in waiting if not (w.session is session and w.id == id)]

    def _reassert(self, session: _Session, request: wire.Reassert) -> None:
        key, token = request.key, request.token
        # A leader's tokens only grow: an "earlier" one that does not is no token of its.
        tokens = frozenset((token, *(t for t in request.earlier if t < token)))
        same = self._flight_of(key, tokens)
        if same is not None:
            # The same flight, its leader back on a new connection (it may have missed
            # the token of an attempt: it asks again, its `attempt` is still out).
            if same.leader is session:
                session.send(
                    wire.error_frame(request.id, "this connection already leads the flight")
                )
                return
            if same.leader is not None:
                same.leader.leads.pop(same.lead_id, None)
            same.leader, same.lead_id = session, request.id
            session.leads[request.id] = same
            same.token = max(same.token, token)
            same.landed = same.landed or request.landed
            _add_tokens(same, tokens)
            if same.detached:
                session.tell_detached(request.id)
            return
        # A forget() detached this flight (in this term or an earlier one): it comes
        # back for its own joiners only (ADR 0020).
        mark = self._forgotten_mark(key)
        # A flight that landed already (its landing follows) comes back for its own
        # joiners and rejoins only, never as the key's flight: a new call that joined it
        # would get an outcome that ended before the call, an interruption if its group
        # closed. New calls wait for its key lock, then lead (ADR 0022 addendum).
        detached = (mark is not None and min(tokens) <= mark) or request.landed
        older = self._flights.get(key)
        if not detached:
            if older is not None and older.token > token:
                reason = "a newer flight of the key runs"
            else:
                # Reasserts are rare (after a failover): a scan of the endings is fine.
                ended = max((t for t, e in self._endings.items() if e.key == key), default=0)
                reason = "a newer flight of the key ended" if ended > token else ""
                if not reason and (fs.key_lock_token(self.directory, key) or 0) > token:
                    # A newer flight of the key took its lock and ended, in this term
                    # (unlike reasserted ones, those are not in the endings): this one
                    # was granted, then overtaken while it waited for the lock (ADR 0028).
                    reason = "a newer flight of the key ran"
            if reason:
                session.send(wire.rejected_frame(request.id, reason))
                return
        moved: list[tuple[_Session, int]] = []
        if not detached and older is not None:
            # An older flight holds the key: the newer wins. The older one's fresh
            # callers came after both began: they wait for the newer one's end.
            moved, older.fresh = older.fresh, []
            if older.landed:
                # It landed (its landing is still being read): it stays for its own
                # joiners, detached (ADR 0022).
                del self._flights[key]
                older.detached = True
                self._detached.setdefault(key, []).append(older)
                self._tell_detached(older)
            else:
                # It cannot hold the key's lock too: its leader lost it.
                if older.leader is not None:
                    older.leader.leads.pop(older.lead_id, None)
                    older.leader.send(
                        wire.rejected_frame(older.lead_id, "a newer flight reasserted")
                    )
                self._interrupt(older, "a newer flight of the key took over")
        started = time.monotonic()
        flight = _Flight(
            key, token, session, request.id, started, reasserted=True, detached=detached,
            landed=request.landed,
        )
        _add_tokens(flight, tokens)
        session.leads[request.id] = flight
        if detached:
            self._detached.setdefault(key, []).append(flight)
            session.tell_detached(request.id)
            # Only the rejoins of this very flight stop waiting; new calls go on waiting
            # for the key's lock, then lead.
            waiting = self._waiting.get(key)
            if waiting:
                mine = [
                    w for w in waiting
                    if w.rejoin is not None and not w.rejoin.isdisjoint(flight.tokens)
                ]
                if mine:
                    waiting[:] = [w for w in waiting if w not in mine]
                    for each in mine:
                        self._resume(each, key)
            return
        self._flights[key] = flight
        self._releasing.pop(key, None)
        for caller, id in moved:
            if not caller.closed and caller.parties.get(id) is older:
                caller.parties[id] = flight
                flight.fresh.append((caller, id))
        for each in self._waiting.pop(key, ()):
            self._resume(each, key)

    def _forget(self, key: str) -> None:
        """The next call of ``key`` leads a new flight; a kept outcome is dropped.
        The running flight goes on for its callers, detached (its key lock still
        makes a new leader wait for its work's end). Its token is written down before
        the forget is confirmed, so a later term that hears its reassert keeps it
        detached too (ADR 0020)."""
        self._drop_kept(key)
        flight = self._flights.pop(key, None)
        if flight is not None:
            self._releasing.pop(key, None)
            flight.detached = True
            self._detached.setdefault(key, []).append(flight)
            self._mark_forgotten(key, flight.token)
            self._tell_detached(flight)
        else:
            # A flight of an earlier term may reassert later, whether it holds the key's
            # lock now or its leader still waits for it (told to lead while the key was
            # releasing), so no probe can tell: it began before this forget, as did
            # every flight of a token issued so far.
            self._mark_forgotten(key, self.epoch << 32 | self._sequence)

    def _forgotten_path(self, key: str) -> str:
        digest = os.path.basename(fs.key_lock_path(self.directory, key))
        return os.path.join(self.directory, fs.STATE, _FORGOTTEN, digest)

    def _mark_forgotten(self, key: str, token: int) -> None:
        """Write down that the flight of ``key`` with ``token`` (and every earlier one)
        was forgotten. Written before the forget is confirmed; a process's death does
        not undo a write (the page cache is the kernel's), so the next term reads it."""
        path = self._forgotten_path(key)
        data = b"%-20d\n" % token  # fixed width: no truncate, the token only grows
        try:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(os.path.dirname(path), 0o700)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.pwrite(fd, data, 0)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning(
                "cannot write down a forget in %s (%s): a later coordinator may let "
                "calls join the forgotten flight", self.directory, exc.strerror or exc,
            )

    def _forgotten_mark(self, key: str) -> int | None:
        """The last forgotten token of ``key`` (see _mark_forgotten), or None."""
        try:
            fd = os.open(self._forgotten_path(key), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            raw = os.read(fd, _MARK_SIZE)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            return int(raw.strip() or b"x")
        except ValueError:
            return None

    # -- key locks --------------------------------------------------------------

    def _key_held(self, key: str, *, create: bool) -> bool:
        """True if another open file holds ``key``'s lock (probed without blocking),
        or may hold it (the probe lacked a descriptor: the caller waits, and the key
        is probed again). Raises _ProbeError if the lock cannot be probed at all."""
        path = fs.key_lock_path(self.directory, key)
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno in _TRANSIENT:
                return True
            raise _ProbeError(f"cannot probe the key's lock: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError as exc:
            if exc.errno in _TRANSIENT:
                return True
            raise _ProbeError(f"cannot probe the key's lock: {exc.strerror}") from None
        finally:
            os.close(fd)  # also unlocks
        return False

    def _wait_for_key(self, key: str, waiting: _Waiting) -> None:
        self._waiting[key] = [waiting]
        waiting.session.parties[waiting.id] = key
        if not self._watch(key):
            self._poll(key)

    def _watch(self, key: str) -> bool:
        """A watcher thread for ``key``'s lock reports to this term: the one of a
        closed term if it still blocks, else a new one. False if none can be had."""
        path = fs.key_lock_path(self.directory, key)
        with _watchers_lock:
            watcher = _watchers.get(path)
            if watcher is not None:
                watcher.owner = self
                return True
            if len(_watchers) >= _WATCHERS_MAX:
                return False
            watcher = _watchers[path] = _Watcher(path, key, self)
        # Named by the key's file (a digest): thread names reach logs and dumps.
        name = f"flightgroup-keylock-{os.path.basename(path)[:16]}"
        try:
            threading.Thread(target=watcher.run, name=name, daemon=True).start()
        except RuntimeError:  # no thread to be had now
            with _watchers_lock:
                if _watchers.get(path) is watcher:
                    del _watchers[path]
            return False
        return True

    def _poll(self, key: str) -> None:
        """Probe ``key``'s lock every _POLL_INTERVAL while calls wait for it (no
        watcher could block on it)."""
        if self.closed or key not in self._waiting:
            return
        self._polled.add(key)
        if self._poll_timer is None:
            assert self._loop is not None
            self._poll_timer = self._loop.call_later(_POLL_INTERVAL, self._poll_tick)

    def _poll_tick(self) -> None:
        self._poll_timer = None
        if self.closed:
            return
        for key in list(self._polled):
            if key not in self._waiting:  # reasserted, or nobody waits any more
                self._polled.discard(key)
                continue
            try:
                held = self._key_held(key, create=False)
            except _ProbeError as exc:
                self._polled.discard(key)
                self._fail_waiting(key, str(exc))
                continue
            if not held:
                self._polled.discard(key)
                self._key_freed(key)
        if self._polled:
            assert self._loop is not None
            self._poll_timer = self._loop.call_later(_POLL_INTERVAL, self._poll_tick)

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

    def _resume(self, waiting: _Waiting, key: str) -> None:
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
                ending = self._ending_of(waiting.rejoin)
                if ending is not None:
                    self._send_ending(session, id, ending.token, ending.outcome)
                else:
                    session.send(wire.interrupted_frame(id, "its leader stopped before it landed"))
        elif flight is not None:
            if waiting.fresh and flight.reasserted and not _began_after(flight, waiting.after):
                flight.fresh.append((session, id))  # it started before this call
                session.parties[id] = flight
            else:
                self._join(flight, session, id)
        else:
            self._lead(session, id, key)

    # -- endings and kept outcomes ---------------------------------------------

    def _ending(self, token: int) -> _Ending | None:
        ending = self._endings.get(token)
        if ending is not None and ending.until < time.monotonic():
            del self._endings[token]
            return None
        return ending

    def _ending_of(self, tokens: frozenset[int]) -> _Ending | None:
        """The kept ending of the flight that had (any of) ``tokens``."""
        for token in tokens:
            ending = self._ending(token)
            if ending is not None:
                return ending
        return None

    def _purge_endings(self, now: float) -> None:
        for token in [t for t, e in self._endings.items() if e.until < now]:
            del self._endings[token]

    def _keep(
        self, key: str, token: int, outcome: Value | Failure, seconds: float
    ) -> None:
        """Keep ``outcome`` as ``key``'s for ``seconds``, under the bounds its leader's
        Retention set (absent: the coordinator's own). An outcome over ``max_bytes``
        alone is not kept (and the key's older one goes); then the least recently used
        others are evicted until at most ``max_items`` and ``max_bytes`` remain."""
        max_items = outcome.max_items if outcome.max_items is not None else _KEPT_MAX_ITEMS
        max_bytes = outcome.max_bytes if outcome.max_bytes is not None else _KEPT_MAX_BYTES
        # Expired outcomes leave first; the new one is never evicted by its own keep.
        self._kept.put(
            key, isinstance(outcome, Value), outcome, token, seconds,
            kept_size(outcome), (max_items, max_bytes),
        )

    def _kept_of(self, key: str) -> tuple[int, SharedOutcome] | None:
        entry = self._kept.get(key)  # a hit counts as a use (LRU); an expired one goes
        if entry is None:
            return None
        outcome: SharedOutcome = entry.payload
        return entry.token, outcome

    def _drop_kept(self, key: str) -> None:
        self._kept.discard(key)

    # -- connections ------------------------------------------------------------

    def _session_closed(self, session: _Session) -> None:
        """A connection ended: its flights are interrupted, its calls withdrawn."""
        session.closed = True
        self._drained(session)  # nothing more will reach it: acks waiting for it go
        for id, flight in list(session.leads.items()):
            if flight.leader is session and flight.lead_id == id:
                flight.leader = None
                self._interrupt(flight, "its leader's process closed its connection")
        session.leads.clear()
        for id, part in list(session.parties.items()):
            if isinstance(part, _Flight):
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


class _Connection(asyncio.BufferedProtocol):
    """One accepted socket: the handshake, then frames handed to the coordinator as
    they arrive (no task per connection: the frame is dispatched in the loop's own
    callback, which is what keeps a round trip short).

    A buffered protocol: the transport reads into the coordinator's one buffer. A
    plain protocol's transport calls ``recv(256 KiB)`` for every read, whose large
    allocation and release cost more than the rest of a small read here (page
    mapping, and its TLB shootdown in a process with threads).
    """

    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator
        self._transport: asyncio.Transport | None = None
        self._session: _Session | None = None
        self._line = bytearray()
        self._splitter = wire.FrameSplitter(coordinator._max_frame)
        self._timer: asyncio.TimerHandle | None = None
        self._pid = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        coordinator = self._coordinator
        coordinator._transports.add(transport)
        if coordinator.closed:  # accepted as it closed: nobody will serve it
            transport.abort()
            return
        sock = transport.get_extra_info("socket")
        if hasattr(socket, "SO_PEERCRED"):
            pid, uid, _gid = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )
        else:  # no peer credentials here (not Linux): the 0600 socket is the only guard
            pid, uid = 0, coordinator._uid
        self._pid = pid
        if uid != coordinator._uid:
            log.warning("refused a peer of uid %d (pid %d): not this coordinator's user", uid, pid)
            self._refuse(wire.error_line(f"refused: uid {uid} is not the coordinator's user"))
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(coordinator._handshake_timeout, self._silent)

    def _silent(self) -> None:
        log.info("dropped pid %d: no hello within the handshake timeout", self._pid)
        if self._transport is not None:
            self._transport.abort()

    def _refuse(self, line: bytes) -> None:
        assert self._transport is not None
        self._transport.write(line)
        self._transport.close()  # after the line is written

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._coordinator._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        # Consumed before the loop reads again, so one buffer serves every connection.
        self._received(bytes(self._coordinator._read_buffer[:nbytes]))

    def _received(self, data: bytes) -> None:
        session = self._session
        if session is None:
            data = self._greet(data)
            session = self._session
            if session is None or not data:
                return
        try:
            frames = self._splitter.feed(data)
        except wire.WireError as exc:
            log.info("dropped a connection from pid %d: %s", session.pid, exc)
            assert self._transport is not None
            if isinstance(exc, wire.FrameTooLarge):
                # Say so before closing: a leader whose landing is over this limit must
                # not send it again on every reconnect (it lands "interrupted" instead).
                self._transport.write(wire.error_frame(None, str(exc), exc.limit))
                self._transport.close()
            else:
                self._transport.abort()
            return
        if frames:
            self._coordinator._handle(frames, session)

    def _greet(self, data: bytes) -> bytes:
        """Collect the hello line; answer it. Returns the bytes after it."""
        transport = self._transport
        assert transport is not None
        if transport.is_closing():
            return b""
        line = self._line
        line += data
        newline = line.find(b"\n", 0, wire.FIRST_LINE_LIMIT + 1)
        if newline < 0:
            if len(line) > wire.FIRST_LINE_LIMIT:
                self._refuse(wire.error_line("refused: the first line is too long"))
            return b""
        hello, rest = bytes(line[: newline + 1]), bytes(line[newline + 1 :])
        line.clear()
        if self._timer is not None:
            self._timer.cancel()
        version = wire.parse_hello(hello)
        if version is None:
            log.info("refused pid %d: its first line is not a flightgroup hello", self._pid)
            self._refuse(wire.error_line("refused: the first line is not a flightgroup hello"))
            return b""
        if version != wire.VERSION:
            log.info("refused pid %d: it speaks protocol version %d", self._pid, version)
            self._refuse(wire.refusal_line())
            return b""
        coordinator = self._coordinator
        if coordinator.closed:
            transport.abort()
            return b""
        transport.write(wire.WELCOME)
        # Told (resume_writing) when the write buffer is empty again: acks wait for it.
        transport.set_write_buffer_limits(high=0, low=0)
        session = self._session = _Session(transport, self._pid)
        coordinator._sessions.add(session)
        return rest

    def resume_writing(self) -> None:
        if self._session is not None:
            self._coordinator._drained(self._session)

    def connection_lost(self, exc: Exception | None) -> None:
        coordinator = self._coordinator
        if self._transport is not None:
            coordinator._transports.discard(self._transport)
            if not coordinator._transports and coordinator._none_left is not None:
                coordinator._none_left.set()
        if self._timer is not None:
            self._timer.cancel()
        session = self._session
        if session is not None:
            self._coordinator._sessions.discard(session)
            self._coordinator._session_closed(session)
