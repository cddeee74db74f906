"""The coordinator's server: the socket ``flight.sock``, the handshake of each accepted
connection, and its frames handed on as they arrive.

It owns the connections and nothing of the flights: a greeted connection becomes a
:class:`Session`, and the :class:`Server` hands each batch of frames, and the end of each
session, to the coordinator's callbacks. It also holds back the ack of a landing until
the landing left this process for every joiner (:meth:`Server.ack_when_drained`).

Everything here runs on the coordinator's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import forked, fs, wire

if TYPE_CHECKING:
    from .records import Flight

__all__ = ["PendingAck", "Server", "Session"]

log = logging.getLogger("flightgroup")

_PEERCRED = struct.Struct("3i")
_CLOSE_FLUSH = 0.5  # s: closing, what was written to each peer may still leave
_ACCEPT_PAUSE = 0.1  # s: the listener is not watched after accept failed (no descriptor)

Frames = list[tuple[dict[str, Any], bytes | None]]


class Session:
    """One connection from one group of one process."""

    def __init__(self, transport: asyncio.WriteTransport, pid: int) -> None:
        self.transport = transport
        self.pid = pid
        self.closed = False
        # request id -> what it is part of: a flight it joined or waits the end of,
        # a key whose lock it waits on (str), or the flight it leads (in ``leads``)
        self.parties: dict[int, Flight | str] = {}
        self.leads: dict[int, Flight] = {}
        self.drains: list[PendingAck] = []  # acks waiting for this write buffer to empty
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


@dataclass(eq=False)
class PendingAck:
    """An ack that waits until the landing left for every joiner."""

    leader: Session
    id: int
    waiting: set[Session]
    timer: asyncio.TimerHandle | None = None
    sent: bool = False


class Server:
    """The listening socket of one coordinator term and its connections. ``on_frames``
    gets each batch of a session's frames, ``on_closed`` each session that ended (both
    on the loop)."""

    def __init__(
        self,
        directory: str,
        *,
        max_frame: int,
        handshake_timeout: float,
        on_frames: Callable[[Frames, Session], None],
        on_closed: Callable[[Session], None],
    ) -> None:
        self.directory = directory
        self.max_frame = max_frame
        self.handshake_timeout = handshake_timeout
        self.on_frames = on_frames
        self.on_closed = on_closed
        self.sessions: set[Session] = set()
        # every accepted connection until it is lost (greeted or not): close() ends them
        self.transports: set[asyncio.Transport] = set()
        self.none_left: asyncio.Event | None = None  # set once closing, when empty
        # The listening socket, read by this loop; each accepted socket becomes a
        # transport in a task of its own (no asyncio.Server: on 3.13 a connection it
        # accepted while closing raised in its __del__ when collected later).
        self._listener: socket.socket | None = None
        self._accept_failing = False  # warned that accept fails; not again until it works
        self._accepting: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.uid = os.getuid()
        # Every connection reads into this one (see _Connection); a bigger frame
        # arrives over several reads.
        self.read_buffer = memoryview(bytearray(wire.READ_SIZE))
        self.closed = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind ``flight.sock`` (0600) and serve on ``loop``. Only the holder of the
        election lock gets here, so the stale socket of a dead coordinator may be
        removed."""
        self._loop = loop
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
            loop.add_reader(sock.fileno(), self._accept)
            self._listener = sock
        except BaseException:
            if sock is not None:
                sock.close()
            raise

    async def close(self) -> None:
        """Stop accepting, flush and close every connection, remove the socket."""
        self.closed = True
        listener, self._listener = self._listener, None
        if listener is not None:
            assert self._loop is not None
            self._loop.remove_reader(listener.fileno())
            listener.close()
        if self._accepting:  # set up as this closes: connection_made ends them
            await asyncio.wait(self._accepting, timeout=_CLOSE_FLUSH)
        for session in list(self.sessions):
            session.closed = True
        self.none_left = asyncio.Event()
        for transport in list(self.transports):
            transport.close()  # flushes what was written, then closes
        # A peer that does not read (frozen) would keep its transport open past the
        # loop's end, to be collected unclosed later: flushing is bounded, then cut.
        if self.transports:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.none_left.wait(), _CLOSE_FLUSH)
        for transport in list(self.transports):
            transport.abort()
        if self.transports:  # abort() reports connection_lost on a later pass
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.none_left.wait(), _CLOSE_FLUSH)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(fs.socket_path(self.directory))

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

    # -- acks -------------------------------------------------------------------

    def ack_when_drained(
        self, leader: Session, id: int, written: set[Session], window: float, *, taken: bool
    ) -> None:
        """Acknowledge the landing once it left this process for every joiner: the
        leader then frees its key lock and forgets the landing, so a landing still in
        a buffer here (a large value to a slow or frozen joiner) would die with this
        coordinator. Bounded by the rejoin ``window``: a frozen joiner never holds a
        key. A leader that asked (``taken``) hears at once that its landing was read,
        when the ack waits: its call returns then, not once every joiner read it."""
        waiting = {s for s in written if not s.closed and s.transport.get_write_buffer_size()}
        if not waiting:
            leader.send(wire.ack_frame(id))
            return
        if taken:
            leader.send(wire.taken_frame(id))
        pending = PendingAck(leader, id, waiting)
        for each in waiting:
            each.drains.append(pending)
        assert self._loop is not None
        pending.timer = self._loop.call_later(max(window, 0.1), self._send_ack, pending)

    def drained(self, session: Session) -> None:
        """``session``'s write buffer is empty (or it closed): acks waiting for it go."""
        pending, session.drains = session.drains, []
        for each in pending:
            each.waiting.discard(session)
            if not each.waiting:
                self._send_ack(each)

    def _send_ack(self, pending: PendingAck) -> None:
        if pending.sent:
            return
        pending.sent = True
        if pending.timer is not None:
            pending.timer.cancel()
        pending.leader.send(wire.ack_frame(pending.id))


class _Connection(asyncio.BufferedProtocol):
    """One accepted socket: the handshake, then frames handed to the coordinator as
    they arrive (no task per connection: the frame is dispatched in the loop's own
    callback, which is what keeps a round trip short).

    A buffered protocol: the transport reads into the server's one buffer. A
    plain protocol's transport calls ``recv(256 KiB)`` for every read, whose large
    allocation and release cost more than the rest of a small read here (page
    mapping, and its TLB shootdown in a process with threads).
    """

    def __init__(self, server: Server) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._session: Session | None = None
        self._line = bytearray()
        self._splitter = wire.FrameSplitter(server.max_frame)
        self._timer: asyncio.TimerHandle | None = None
        self._pid = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        server = self._server
        server.transports.add(transport)
        if server.closed:  # accepted as it closed: nobody will serve it
            transport.abort()
            return
        sock = transport.get_extra_info("socket")
        if hasattr(socket, "SO_PEERCRED"):
            pid, uid, _gid = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )
        else:  # no peer credentials here (not Linux): the 0600 socket is the only guard
            pid, uid = 0, server.uid
        self._pid = pid
        if uid != server.uid:
            log.warning("refused a peer of uid %d (pid %d): not this coordinator's user", uid, pid)
            self._refuse(wire.error_line(f"refused: uid {uid} is not the coordinator's user"))
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(server.handshake_timeout, self._silent)

    def _silent(self) -> None:
        log.info("dropped pid %d: no hello within the handshake timeout", self._pid)
        if self._transport is not None:
            self._transport.abort()

    def _refuse(self, line: bytes) -> None:
        assert self._transport is not None
        self._transport.write(line)
        self._transport.close()  # after the line is written

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._server.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        # Consumed before the loop reads again, so one buffer serves every connection.
        self._received(bytes(self._server.read_buffer[:nbytes]))

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
            self._server.on_frames(frames, session)

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
        server = self._server
        if server.closed:
            transport.abort()
            return b""
        transport.write(wire.WELCOME)
        # Told (resume_writing) when the write buffer is empty again: acks wait for it.
        transport.set_write_buffer_limits(high=0, low=0)
        session = self._session = Session(transport, self._pid)
        server.sessions.add(session)
        return rest

    def resume_writing(self) -> None:
        if self._session is not None:
            self._server.drained(self._session)

    def connection_lost(self, exc: Exception | None) -> None:
        server = self._server
        if self._transport is not None:
            server.transports.discard(self._transport)
            if not server.transports and server.none_left is not None:
                server.none_left.set()
        if self._timer is not None:
            self._timer.cancel()
        session = self._session
        if session is not None:
            server.sessions.discard(session)
            server.on_closed(session)
