"""The directory arbiter: how one group takes part in its directory.

One background thread per group runs an event loop with the connection to the
coordinator (and the coordinator itself while this group holds the election).
A second thread campaigns: it blocks in ``flock`` on ``flight.lock`` until the
kernel hands the lock over (the previous coordinator closed or died), then
starts serving. Nothing polls the election; reconnecting polls the socket with
a short backoff while a new coordinator starts.

A local flight asks the arbiter once (``submit``): it leads (and holds the key
lock while its work runs), joins a flight led elsewhere, or is served a kept
outcome. Answers reach the flight's driver through an ``Inbox``, on its own
loop or thread.

Field ownership: ``Call`` and ``DirectoryLead`` objects and the arbiter's dicts are
touched only on the background loop, except ``DirectoryLead.fd``/``DirectoryLead.attempt``,
guarded by ``DirectoryLead.lock`` (a work ends on its own thread, possibly after close).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import os
import socket
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any

from .._forksafe import renew_after_fork
from .._log import DigestOf, log
from ..errors import (
    FlightInterruptedError,
    GroupClosedError,
    ProtocolVersionError,
    UnavailableError,
    ValueTooLargeError,
    renewed,
)
from ..scope.events import (
    Inbox,
    Joined,
    Landed,
    Lead,
    LeaseLost,
    NoOutcome,
    Refused,
    ScopeEvent,
)
from ..scope.interface import DetachedNotice, Handed, LeadState, key_as_called
from ..scope.loop import BackgroundLoop, closed_in_fork
from ..scope.outcome import Failure, Interrupted, SharedOutcome
from . import forked, fs, wire
from .coordinator import Coordinator

if TYPE_CHECKING:
    from ..flight import Attempt

__all__ = ["Call", "DirectoryArbiter"]



_OPENING = -2  # Call.fd while the caller creates the key's file
# The longest one connection attempt (its handshake's wait, then the pause before the
# next) takes while this process runs; one that took longer spanned a stall.
_ATTEMPT_MAX = wire.HANDSHAKE_TIMEOUT + 0.5 + 1.0
# s: a connection that lived this long counts as served, even if nothing came (an idle
# group hears nothing); a shorter one that heard nothing counts as refused.
_SETTLED = 0.5
# s: the handshake wait of an attempt made when reconnect_timeout is (nearly) spent.
_LAST_WAIT = 0.5
# s: after this process won the election and could not serve (the epoch, the socket),
# it campaigns again this much later (each process does: at most one try a second each).
_ELECTION_RETRY = 1.0


class Call(DetachedNotice):
    """One local flight's request to the directory (its id is reused for the lead;
    ``on_detached``: a forget() elsewhere detached the flight it leads or joined)."""

    __slots__ = (
        "after",
        "earlier",
        "fd",
        "fresh",
        "id",
        "inbox",
        "joined",
        "key",
        "lead",
        "lock",
        "outlived",
        "pending",
        "refused",
        "sent",
        "sent_end",
        "token",
    )

    def __init__(
        self,
        id: int,
        key: str,
        fresh: bool,
        inbox: Inbox,
        after: int | None = None,
        on_detached: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(on_detached)
        self.lock = threading.Lock()
        # The key lock file, opened ahead by the caller: None until then, _OPENING while
        # it opens, -1 once the lead took it or the call ended without leading.
        self.fd: int | None = None
        self.pending: int | None = None  # a lead's token that came while it opened
        # Why a new coordinator refused that pending lead's reassert: lost once taken.
        self.refused: str | None = None
        self.id = id
        self.key = key
        self.fresh = fresh
        self.after = after  # (fresh) a flight newer than this token is a later one
        self.inbox = inbox
        self.sent = False  # went out on the current connection
        # where its request ends in that connection's stream (Channel.send), -1: never
        # written there
        self.sent_end = -1
        # (fresh) the socket of a coordinator that is gone took it, unanswered: it was
        # made before the next term began, so any flight of that term began after it
        self.outlived = False
        self.joined = False  # heard `joined`: after a reconnect it rejoins by token
        self.token = 0
        # The flight's tokens heard before ``token`` (it retried), oldest first: a rejoin
        # names them too, in case the next coordinator never heard of ``token``.
        self.earlier: tuple[int, ...] = ()
        self.lead: DirectoryLead | None = None


class DirectoryLead(LeadState):
    """A flight this process leads: its key lock and its landing until acked
    (``lock`` also guards ``fd``)."""

    __slots__ = (
        "abandoned", "acked", "call", "cut", "earlier", "fd", "landing", "locked", "retrying",
        "token",
    )  # fmt: skip

    def __init__(self, call: Call, token: int, fd: int) -> None:
        super().__init__()
        self.call = call
        self.token = token
        # The tokens of its earlier attempts, oldest first: a reassert names them, so a
        # joiner that missed the `joined` of a retry still finds its flight.
        self.earlier: tuple[int, ...] = ()
        self.fd = fd  # the key lock; -1 once released
        self.landing: bytes | None = None  # the land frame, kept until acked
        self.acked = False
        self.locked = False  # the key lock is held (the work may start)
        self.abandoned = False  # given up before it was locked (closed or withdrawn)
        self.retrying = False  # an `attempt` request is out
        # Its group closed while its work ran: its landing says "interrupted", and must
        # reach a coordinator (its joiners hear it now, not when the work ends).
        self.cut = False

    def release(self) -> None:
        """Free the key lock (once)."""
        with self.lock:
            fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


class Channel:
    """The connection to the coordinator, after the handshake.

    Reading runs on the background loop (``add_reader``: a frame is dispatched in
    the loop's own callback). Writing is done by whichever thread has something to
    say, under ``lock``: a caller's request goes out from the caller's own thread,
    with no hop through the background loop. What the socket does not take at once
    is buffered and flushed by the loop (``add_writer``), in order.
    """

    def __init__(
        self,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        max_frame: int,
        on_frames: Callable[[list[tuple[dict[str, Any], bytes | None]]], None],
        on_lost: Callable[[Channel, str], None],
    ) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self._loop = loop
        self._out = bytearray()  # what the socket has not taken yet
        # Bytes handed to send(), and bytes the socket took: a request whose end the
        # socket took reached the coordinator's side before it went (see Call.outlived).
        self._offered = 0
        self._taken = 0
        self._flushing = False  # a writer callback is (being) registered
        # An answer over this group's limit (a coordinator of a larger one sent it) fails
        # only its request: dropping the connection would lose every lease on it.
        self._splitter = wire.FrameSplitter(max_frame, skip_over=True)
        self._buffer = memoryview(bytearray(wire.READ_SIZE))  # see wire.READ_SIZE
        self._on_frames = on_frames
        self._on_lost = on_lost
        self.closed = False
        self.heard = False  # a whole frame came: the coordinator serves us
        loop.add_reader(sock.fileno(), self._readable)

    def send(self, frame: bytes) -> int:
        """Write ``frame`` (any thread; never blocks). Returns where it ends in this
        connection's stream (see ``took``), or -1 if it was not written here at all."""
        with self.lock:
            if self.closed:
                return -1
            self._offered += len(frame)
            end = self._offered
            if not self._out:
                try:
                    sent = self.sock.send(frame)
                except BlockingIOError:
                    sent = 0
                except OSError as exc:
                    self._post_lost(f"cannot write: {exc}")
                    return -1
                self._taken += sent
                if sent == len(frame):
                    return end
                frame = frame[sent:]
            self._out += frame
            if self._flushing:
                return end
            self._flushing = True
        with contextlib.suppress(RuntimeError):  # the loop closed
            self._loop.call_soon_threadsafe(self._start_flush)
        return end

    def took(self, end: int) -> bool:
        """The socket took everything up to ``end`` (a ``send`` result)."""
        return 0 <= end <= self._taken

    def _start_flush(self) -> None:
        with self.lock:
            if self.closed:
                return
        self._loop.add_writer(self.sock.fileno(), self._writable)

    def _writable(self) -> None:
        with self.lock:
            if self.closed:
                return
            try:
                sent = self.sock.send(self._out)
            except BlockingIOError:
                return
            except OSError as exc:
                self._post_lost(f"cannot write: {exc}")
                return
            self._taken += sent
            del self._out[:sent]
            if self._out:
                return
            self._flushing = False
        self._loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        try:
            size = self.sock.recv_into(self._buffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(f"cannot read: {exc}")
            return
        if not size:
            self._lost("the coordinator closed the connection")
            return
        try:
            frames = self._splitter.feed(bytes(self._buffer[:size]))
        except wire.WireError as exc:
            self._lost(str(exc))
            return
        if frames:
            self.heard = True
            self._on_frames(frames)

    def _post_lost(self, reason: str) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._lost, reason)

    def _lost(self, reason: str) -> None:
        if self.close():
            self._on_lost(self, reason)

    def close(self) -> bool:
        """Stop reading and writing and close the socket (on the loop). True the
        first time."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
        fd = self.sock.fileno()
        self._loop.remove_reader(fd)
        self._loop.remove_writer(fd)
        self.sock.close()
        return True

    def flush_and_close(self) -> None:
        """Write what is buffered (bounded wait), then close: a landing made just
        before closing still goes out."""
        with self.lock:
            pending = bytes(self._out)
            self._out.clear()
        if pending:
            with contextlib.suppress(OSError):
                self.sock.setblocking(True)
                self.sock.settimeout(1.0)
                self.sock.sendall(pending)
        self.close()


class DirectoryArbiter:
    """DirectoryLead or join for the wider scope of a directory group (see the module)."""

    def __init__(
        self,
        directory: str,
        *,
        max_frame: int = wire.DEFAULT_MAX_FRAME,
        reconnect_timeout: float = 5.0,
        rejoin_window: float = 5.0,
    ) -> None:
        self.directory = os.path.abspath(directory)
        self._max_frame = max_frame
        self._reconnect_timeout = reconnect_timeout
        self._rejoin_window = rejoin_window
        self._campaign_lock = threading.Lock()
        # The group's thread; its lock also orders close() with a start.
        self._background = BackgroundLoop("directory", self._forked)
        self._fatal: BaseException | None = None  # every call raises it (bad directory)
        # This process's last election failed (the epoch could not be written or told,
        # the socket not served): while no coordinator is connected, calls raise it at
        # once (it says what to fix); it is tried again every _ELECTION_RETRY seconds,
        # and the first connection to a coordinator clears it.
        self._election_error: BaseException | None = None
        self._refusal: BaseException | None = None  # new calls raise it (another version)
        self._next_id = 0
        self._calls: dict[int, Call] = {}
        self._leads: dict[int, DirectoryLead] = {}
        self._channel: Channel | None = None
        # Guards the channel, call registration and ``Call.sent`` (callers send their
        # own run requests from their threads; the loop resends after a reconnect).
        self._send_lock = threading.Lock()
        self._connected_now = threading.Event()  # set while a channel is up
        self._kick: asyncio.Event | None = None
        # The connection's keeper, held so that closing ends it (its wait on a channel
        # that flush_and_close() shut is never answered) rather than leave it pending.
        self._maintainer: asyncio.Task[None] | None = None
        self._coordinator: Coordinator | None = None
        self._closing = False
        self._given_up = False
        # Requests answered to a thread that waits (status, forget): id -> its future.
        self._waiters: dict[int, Future[Any]] = {}
        self._closed_future: Future[None] = Future()
        # Set when the first close() returns: a second one (another thread, a with-block
        # after an explicit close) returns no sooner (API.md: once landings are handed over).
        self._close_returned = threading.Event()
        self._campaigner: _Campaign | None = None  # its election thread's state
        self._close_by = 0.0  # closing waits for acks until then
        self._finishing = False
        # Called in a forked child of a started group (its group drops its flights).
        self.on_fork: Callable[[str], None] | None = None
        # Held by another thread at a fork, a copied lock would stay held in the child.
        renew_after_fork(self, "_send_lock")
        renew_after_fork(self, "_campaign_lock")

    # -- starting ---------------------------------------------------------------

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        """The group's loop, started (and the election begun) by the first call."""
        return self._background.ensure_started(
            self._setup,
            check=self._check_startable,
            prepare=self._check_directory,
            started=lambda: _campaign_for(self),
        )

    def _check_startable(self) -> None:
        if self._fatal is not None:
            raise renewed(self._fatal)
        if self._closing:
            raise GroupClosedError()

    def _check_directory(self) -> None:
        """A directory that cannot serve (a network file system, no permission) fails
        every call of the group, this one first."""
        try:
            fs.check_local(self.directory)
            fs.ensure_directory(self.directory)
        except BaseException as exc:
            self._fatal = exc
            raise

    def _setup(self, loop: asyncio.AbstractEventLoop) -> None:
        self._kick = asyncio.Event()
        self._maintainer = loop.create_task(self._maintain())

    # -- the election -----------------------------------------------------------

    def _campaign(self) -> None:
        """The election thread of this group (see _Campaign)."""
        campaign = self._campaigner
        assert campaign is not None
        campaign.run()

    def _won(self, fd: int) -> None:
        """(The election thread) this group holds ``fd``'s lock on ``flight.lock``:
        write the next epoch and serve (on the background loop)."""
        try:
            # close() takes this lock too: it never lets the process end mid-write.
            with self._campaign_lock:
                if self._closing:
                    raise _Resign()
                epoch = fs.next_epoch(self.directory)
        except _Resign:
            os.close(fd)
            return
        except Exception as exc:
            os.close(fd)  # the next process may fare better: let it try
            self._election_failed(exc)
            return
        if not self._background.post(self._serve, epoch, fd):
            os.close(fd)

    def _election_failed(self, exc: BaseException) -> None:
        """(Any thread) this process won the election and could not serve: its calls
        that wait for a coordinator fail with ``exc``, and it campaigns again after a
        pause, so that a directory repaired (the epoch written by hand, the disk freed)
        is served again without restarting every process that uses it."""
        again = self._election_error is not None and repr(self._election_error) == repr(exc)
        (log.debug if again else log.error)(
            "cannot coordinate %s: %s (trying again every %g s)",
            self.directory, exc, _ELECTION_RETRY,
        )
        with self._send_lock:  # see submit(): its second check is under this lock too
            self._election_error = exc
        self._background.post(self._fail_all, exc)
        self._retry_campaign()

    def _retry_campaign(self) -> None:
        """(Any thread) campaign again after _ELECTION_RETRY, unless closing."""

        def campaign() -> None:
            if not self._closing:
                _campaign_for(self)

        loop = self._background.loop
        if loop is not None and not self._closing:
            self._background.post(loop.call_later, _ELECTION_RETRY, campaign)

    def _serve(self, epoch: int, fd: int) -> None:
        if self._closing:
            os.close(fd)
            return
        coordinator = Coordinator(
            self.directory, epoch, fd, max_frame=self._max_frame,
            rejoin_window=self._rejoin_window,
        )

        async def start() -> None:
            try:
                await coordinator.start()
            except Exception as exc:
                await coordinator.close()  # its lock too: the next process may serve
                self._election_failed(exc)
                return
            self._coordinator = coordinator
            if self._closing:
                await coordinator.close()
                return
            assert self._kick is not None
            self._kick.set()

        asyncio.get_running_loop().create_task(start())

    # -- the connection ---------------------------------------------------------

    async def _maintain(self) -> None:
        """Keep a connection to the coordinator of the moment, until closed. A group
        that closes goes on reconnecting until its landings are acknowledged (or time
        is up): a landing made while no coordinator served must still reach one."""
        assert self._kick is not None
        backoff = 0.0005
        # Seconds of this process's own running time with no coordinator of our version:
        # an attempt that took longer than any can (this process was frozen, stopped in
        # a debugger) counts for nothing, or a process thawed after a failover would give
        # up on its first try, against the socket of the coordinator that died.
        down = 0.0
        last = time.monotonic()
        over = False  # an attempt began after ``down`` passed reconnect_timeout
        refusals = 0  # handshakes in a row that failed (refused, unanswered)
        while not self._finishing:
            # A handshake waits no longer than what is left of reconnect_timeout (a
            # last attempt, at least _LAST_WAIT): a frozen coordinator must not stretch
            # the wait to the next multiple of the handshake's own limit.
            wait = min(wire.HANDSHAKE_TIMEOUT, max(self._reconnect_timeout - down, _LAST_WAIT))
            try:
                sock = await self._connect(wait)
            except ProtocolVersionError as exc:
                self._refused(exc)
            except OSError:  # nothing listens: whoever refused us is gone
                self._refusal = None
                if refusals:  # a failover under way: hurry again
                    backoff, refusals = 0.0005, 0
            except (EOFError, TimeoutError, wire.WireError):
                # Refused at the handshake (another user's coordinator), or it did not
                # answer: ask again less and less often, not every 5 ms for ever.
                refusals += 1
                backoff = min(0.001 * 2**refusals, 0.5)
            else:
                if self._finishing:  # closed while it connected
                    sock.close()
                    return
                lost = asyncio.get_running_loop().create_future()
                began = time.monotonic()
                channel = self._connected(sock, lost)
                await lost
                if channel.heard or time.monotonic() - began >= _SETTLED:
                    backoff, refusals = 0.0005, 0
                    down, last, over = 0.0, time.monotonic(), False
                    continue
                # Welcomed, then dropped before it served anything: a coordinator that
                # does so to every connection is no more reachable than a silent one.
                refusals += 1
                backoff = min(0.001 * 2**refusals, 0.5)
            now = time.monotonic()
            if now - last <= _ATTEMPT_MAX:
                down += now - last
            last = now
            if down > self._reconnect_timeout:
                if over:
                    self._give_up(down)
                else:
                    # One more attempt, at once, before giving up: the one that just
                    # failed may have begun before a stall too short to leave out (it
                    # waited on a coordinator that died meanwhile).
                    over = True
                    continue
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), backoff)
            if not refusals:
                backoff = min(backoff * 2, 0.005)  # a failover: connect within ~5 ms of serving

    async def _connect(self, wait: float = wire.HANDSHAKE_TIMEOUT) -> socket.socket:
        """Connect and shake hands, waiting up to ``wait`` s for the coordinator's
        line; the socket is non-blocking, for the Channel."""
        loop = asyncio.get_running_loop()
        path = fs.socket_path(self.directory)
        sock: socket.socket | None = None
        try:
            with forked.socket_guard():  # no fork before it is connected (forked.py)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.setblocking(False)
                # A Unix socket connects at once or not at all: a full backlog
                # (BlockingIOError) fails this attempt like a refusal.
                sock.connect(path)
            await loop.sock_sendall(sock, wire.HELLO)
            line = await asyncio.wait_for(_read_line(loop, sock), wait)
            kind, detail = wire.parse_answer(line)
            if kind == "ok":
                return sock
            if kind == "version":
                assert isinstance(detail, int)
                raise ProtocolVersionError(wire.VERSION, detail)
            if kind == "refused":
                log.warning("the coordinator of %s refused us: %s", self.directory, detail)
            raise EOFError("the coordinator closed the handshake")
        except BaseException:
            if sock is not None:
                sock.close()
            raise

    def _connected(self, sock: socket.socket, lost: asyncio.Future[None]) -> Channel:
        def on_lost(channel: Channel, reason: str) -> None:
            log.info("lost the coordinator of %s: %s", self.directory, reason)
            self._disconnected(channel)
            if not lost.done():
                lost.set_result(None)

        channel = Channel(
            sock, asyncio.get_running_loop(), self._max_frame, self._on_frames, on_lost
        )
        self._refusal = None
        self._given_up = False
        with self._send_lock:
            self._channel = channel
            self._election_error = None  # a coordinator serves: the directory works
            self._connected_now.set()
            # Leaders first: a reassert (and its landing) before any rejoin of the key.
            for lead in list(self._leads.values()):
                if lead.acked or (lead.lost and not lead.cut):
                    continue
                reassert = partial(
                    wire.reassert_frame, lead.call.id, lead.call.key, lead.token,
                    landed=lead.landing is not None, notices=True,
                )
                channel.send(_fitting(reassert, lead.earlier, self._max_frame))
                if lead.landing is not None:
                    channel.send(lead.landing)
                elif lead.retrying:  # the new token it asked for never came
                    channel.send(wire.attempt_frame(lead.call.id))
            epoch = None
            for call in list(self._calls.values()):
                if call.lead is None and not call.sent:
                    if call.outlived:
                        call.outlived = False
                        if epoch is None:
                            epoch = fs.read_epoch(self.directory) or 0
                        if call.after is None and epoch > 0:
                            # Not "no flight that exists now": the one this call waited
                            # for may have ended, and the next begun, in the new term.
                            call.after = (epoch << 32) - 1
                    if call.pending is not None:
                        # It was told to lead while it opened its key file; the lead is
                        # being taken: the new coordinator hears a reassert, not a run.
                        call.sent = True
                        channel.send(
                            wire.reassert_frame(call.id, call.key, call.pending, notices=True)
                        )
                    else:
                        self._send_run(call, channel, self._max_frame)
        return channel

    def _disconnected(self, channel: Channel) -> None:
        with self._send_lock:
            if self._channel is channel:
                self._channel = None
                self._connected_now.clear()
            for call in list(self._calls.values()):  # (a work's thread may pop one)
                # Only a request the gone coordinator's socket took was made before the
                # next term began. One written to a socket already dead (this process
                # was frozen through the failover, say) may be newer than that term's
                # flights: it goes to the next coordinator as a new fresh call.
                if (
                    call.sent
                    and call.fresh
                    and not call.joined
                    and call.lead is None
                    and channel.took(call.sent_end)
                ):
                    call.outlived = True
                call.sent = False
                call.sent_end = -1
        for id, waiter in list(self._waiters.items()):
            del self._waiters[id]
            if not waiter.done():
                waiter.set_exception(UnavailableError("the coordinator went away"))

    def _send(self, frame: bytes) -> None:
        channel = self._channel
        if channel is not None:
            channel.send(frame)

    def _refused(self, exc: ProtocolVersionError) -> None:
        """A coordinator of another version holds the election: new calls fail."""
        self._refusal = exc
        for call in self._take_unled(lambda call: not call.joined):
            _finish(call, Refused(renewed(exc)))

    def _give_up(self, down: float) -> None:
        """No coordinator of our version for ``down`` s (over ``reconnect_timeout``):
        every lease of this process is lost, and its joined calls are interrupted."""
        if self._given_up:
            return
        self._given_up = True
        # The calls that waited through the outage; one made while the leases are lost
        # below (their works wake, their callers go on) is not failed with them.
        waited = self._take_unled()
        for lead in list(self._leads.values()):
            self._lose(lead, "no coordinator could be reached")
        for call in waited:
            if call.joined:
                _finish(call, NoOutcome("no coordinator could be reached"))
            else:
                error = self._refusal or UnavailableError(
                    f"no coordinator of {self.directory!r} answered for {down:.1f} s "
                    f"(reconnect_timeout={self._reconnect_timeout:g})"
                )
                _finish(call, Refused(renewed(error)))

    def _fail_all(self, exc: BaseException) -> None:
        for call in self._take_unled():
            _finish(call, Refused(renewed(exc)))

    def _take_unled(self, only: Callable[[Call], bool] | None = None) -> list[Call]:
        """Remove the calls that lead nothing (and pass ``only``); under the send lock,
        so that none of them is published as a lead meanwhile (see _take_lead)."""
        with self._send_lock:
            calls = [
                call for call in self._calls.values()
                if call.lead is None and (only is None or only(call))
            ]
            for call in calls:
                del self._calls[call.id]
        return calls

    @staticmethod
    def _send_run(call: Call, channel: Channel, max_frame: int) -> None:
        """(Under the send lock.)"""
        call.sent = True
        if call.joined:  # a rejoin, by every token of the flight it heard
            rejoin = partial(wire.run_frame, call.id, call.key, flight=call.token, notices=True)
            channel.send(_fitting(rejoin, call.earlier, max_frame))
        else:
            call.sent_end = channel.send(wire.run_frame(
                call.id, call.key, fresh=call.fresh, after=call.after, notices=True
            ))

    def _on_frames(self, frames: list[tuple[dict[str, Any], bytes | None]]) -> None:
        for header, payload in frames:
            if header["op"] == wire.SKIPPED:
                self._skipped(header)
                continue
            try:
                answer = wire.parse_answer_frame(header, payload)
            except wire.WireError as exc:
                channel = self._channel
                if channel is not None:
                    channel._lost(f"a bad answer: {exc}")
                return
            self._answer(answer)

    def _skipped(self, header: dict[str, Any]) -> None:
        """An answer over this group's max_frame_bytes was skipped: its request fails
        (a joiner's call with ValueTooLargeError), and nothing else."""
        id, size, limit = header["id"], header["size"], self._max_frame
        log.warning("%s: the coordinator's %r answer (%d bytes) is over this group's "
                    "max_frame_bytes (%d)", self.directory, header["of"], size, limit)
        call = self._calls.get(id) if id is not None else None
        if call is not None and call.lead is None:
            del self._calls[id]
            _finish(call, Refused(ValueTooLargeError(call.key, size, limit)))
            return
        waiter = self._waiters.pop(id, None) if id is not None else None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ValueError(
                f"the coordinator's answer ({size} bytes) is over this group's "
                f"max_frame_bytes ({limit})"
            ))

    def _answer(self, answer: wire.Answer) -> None:
        if isinstance(answer, wire.Lead):
            self._on_lead(answer.id, answer.token)
        elif isinstance(answer, wire.Joined):
            call = self._calls.get(answer.id)
            if call is not None and call.lead is None:
                _drop_fd(call)
                first = not call.joined
                if not first and answer.token != call.token:  # its flight retried
                    call.earlier = _heard(call.earlier, call.token, answer.token)
                call.joined, call.token = True, answer.token
                if first:
                    log.debug("%s %s: join, token %d (leader pid %d)", self.directory,
                              DigestOf(call.key), answer.token, answer.pid)
                    call.inbox.put(Joined(answer.token, answer.pid, answer.age))
        elif isinstance(answer, wire.Landed):
            call = self._calls.pop(answer.id, None)
            if call is not None:
                _drop_fd(call)
                call.inbox.put(Landed(answer.token, answer.outcome, answer.kept))
        elif isinstance(answer, wire.InterruptedAnswer):
            call = self._calls.pop(answer.id, None)
            if call is not None:
                _finish(call, NoOutcome(answer.reason))
        elif isinstance(answer, wire.Detached):
            call = self._calls.get(answer.id)
            if call is not None:
                log.debug("%s %s: its flight was detached", self.directory,
                          DigestOf(call.key))
                call.detached()
        elif isinstance(answer, wire.Ack) and answer.id in self._waiters:
            self._waiters.pop(answer.id).set_result(None)  # a forget was done
        elif isinstance(answer, wire.Ack):
            lead = self._leads.get(answer.id)
            if lead is not None and lead.landing is not None:
                with lead.lock:
                    lead.acked = True
                self._end_lead(lead)
        elif isinstance(answer, wire.Rejected):
            with self._send_lock:  # in one step with _take_lead's publishing
                lead = self._leads.get(answer.id)
                call = self._calls.get(answer.id) if lead is None else None
                if call is not None and call.lead is None:
                    # A lead told while its caller opened the key's file, reasserted
                    # (see _connected) and refused: it is lost as soon as it is taken.
                    call.refused = answer.reason
            if lead is not None and lead.cut:
                # Its group closed and its interrupted landing names a token the flight
                # no longer has (a retry moved it): nothing to resend. Its joiners hear
                # when this connection closes.
                with lead.lock:
                    lead.acked = True
                self._end_lead(lead)
            elif lead is not None:
                self._lose(lead, answer.reason)
        elif isinstance(answer, wire.StatusAnswer):
            waiter = self._waiters.pop(answer.id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(answer.flights)
        elif isinstance(answer, wire.ErrorAnswer):
            log.warning("the coordinator of %s did not understand: %s", self.directory,
                        answer.message)
            if answer.limit is not None:
                self._over_limit(answer.limit)
            call = self._calls.pop(answer.id, None) if answer.id is not None else None
            if call is not None:
                if call.lead is not None:
                    self._lose(call.lead, answer.message)
                else:
                    _finish(
                        call,
                        Refused(
                            FlightInterruptedError(
                                call.key, f"the coordinator said: {answer.message}"
                            )
                        ),
                    )

    def _over_limit(self, limit: int) -> None:
        """The coordinator refused a frame over its ``max_frame_bytes`` (a group of
        another configuration coordinates): a landing that big would be refused again
        on every reconnect, and its key held for ever. It lands as interrupted instead;
        the joiners hear why (the leader has its value already)."""
        for lead in list(self._leads.values()):
            landing = lead.landing
            if landing is not None and not lead.acked and len(landing) - 4 > limit:
                lead.landing = _too_large(lead, len(landing) - 4, limit, "the coordinator's")
        for call in list(self._calls.values()):  # requests that can never be read: the key
            if _request_size(call.key) > limit:
                if call.lead is None:
                    self._calls.pop(call.id, None)
                    _finish(call, Refused(_key_too_long(call.key, limit)))
                elif not call.lead.acked:  # its reassert would be refused for ever
                    self._lose(call.lead, str(_key_too_long(call.key, limit)))

    def _on_lead(self, id: int, token: int) -> None:
        call = self._calls.get(id)
        if call is None:  # withdrawn meanwhile: give the flight back
            self._send(wire.cancel_frame(id))
            return
        log.debug("%s %s: lead, token %d", self.directory, DigestOf(call.key), token)
        lead = call.lead
        if lead is not None:  # a new token for a retry
            if lead.retrying and not lead.lost:
                lead.retrying = False
                lead.earlier = _heard(lead.earlier, lead.token, token)
                lead.token = token
                # The key's file names the newest token that holds its lock (ADR 0028):
                # a flight of the key led meanwhile (this one was forgotten) has an
                # older token than this attempt's, and must see it when it gets the lock.
                with lead.lock:
                    if lead.locked and lead.fd >= 0:
                        with contextlib.suppress(OSError):
                            os.pwrite(lead.fd, b"%-20d\n" % token, 0)
                call.inbox.put(Lead(token))
            return
        with call.lock:
            fd = call.fd
            if fd == _OPENING:
                # The caller is still creating the key's file: it takes the lead when
                # its open returns (in its own thread: no hop back to it, no second
                # create racing the first on the directory).
                call.pending = token
                return
            call.fd = -1
        self._take_lead(call, fd, token)

    def _take_lead(self, call: Call, fd: int | None, token: int) -> None:
        """Take ``call``'s key lock (opening its file unless ``fd`` is open) and tell
        its driver it leads. Runs on the background loop or in the caller's thread."""
        if fd is None or fd < 0:
            path = fs.key_lock_path(self.directory, call.key)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                self._calls.pop(call.id, None)
                self._send(wire.cancel_frame(call.id))
                _finish(call, Refused(exc))
                return
        # The descriptor is used here only before the lead is published: once it is,
        # close() or a withdrawal may close it (and its number be reused) at any time.
        copy = -1
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Held for a moment by the coordinator's probe, or by the leader before us
            # until its ack arrives; or by a closed group's long work: a thread waits,
            # on a copy of the descriptor (the same open file, so the same lock).
            try:
                copy = os.dup(fd)
            except OSError as exc:
                os.close(fd)
                self._calls.pop(call.id, None)
                self._send(wire.cancel_frame(call.id))
                _finish(call, Refused(exc))
                return
        lead = DirectoryLead(call, token, fd)
        # In one step for a reconnect (which reasserts what _leads holds and sends the
        # runs of calls with no lead): between the two, it would do neither. A call
        # failed meanwhile (the group closes, the scope gave up) has nobody to run its
        # work: published, its key lock would be held for ever.
        with self._send_lock:
            published = not self._closing and self._calls.get(call.id) is call
            if published:
                call.lead = lead
                self._leads[call.id] = lead
            refused = call.refused
        if published and refused is not None:
            # Refused while it was pending (a newer flight of the key runs): its work
            # must not run as if it held the lease, under a token older than that flight's.
            self._lose(lead, refused)
        if not published:
            call.pending = None
            if copy >= 0:
                os.close(copy)
            lead.release()
            self._send(wire.cancel_frame(call.id))
            return
        if copy >= 0:

            def wait_for_lock() -> None:
                try:
                    try:
                        fcntl.flock(copy, fcntl.LOCK_EX)
                    finally:
                        os.close(copy)  # the lock stays with the lead's descriptor
                except OSError as exc:  # never lead without the lock
                    with lead.lock:
                        lead.abandoned = True
                    lead.release()
                    self._background.post(self._lock_failed, lead, exc)
                    return
                self._locked(lead)

            try:
                threading.Thread(
                    target=wait_for_lock, name="flightgroup-keylock", daemon=True
                ).start()
            except RuntimeError as exc:  # no thread to wait with: give the lead back
                os.close(copy)
                with lead.lock:
                    lead.abandoned = True
                lead.release()
                self._background.post(self._lock_failed, lead, exc)
            return
        self._locked(lead)

    def _locked(self, lead: DirectoryLead) -> None:
        newer = 0
        with lead.lock:
            if lead.abandoned:  # closed or withdrawn while it waited for the lock
                fd = -1
            else:
                lead.locked = True
                fd = lead.fd
                # Every leader writes its token here under the lock, so a higher one
                # means a newer flight of the key held it first: this lead was granted,
                # then overtaken while it waited (a forget() detached it, or a failover
                # let a new call lead before its reassert). Its work must not run as if
                # it held the lease, under an older token (ADR 0028).
                # Evidence for the epoch too (ADR 0009), written under the lock:
                # release() may close the descriptor (and its number be reused) once it
                # is free. Fixed width, so no truncate (a journal commit on ext4): a
                # token has at most 19 digits.
                if fd >= 0:
                    with contextlib.suppress(OSError, ValueError):
                        newer = int(os.pread(fd, 20, 0) or b"0")
                    if newer <= lead.token or newer >= fs.TOKEN_LIMIT:
                        newer = 0
                        with contextlib.suppress(OSError):
                            os.pwrite(fd, b"%-20d\n" % lead.token, 0)
        if fd < 0:
            lead.release()
            return
        if newer:  # lost before its work starts: the work hears it when it binds
            self._lose(lead, f"a newer flight of the key (token {newer}) held its key lock first")
        lead.call.inbox.put(Lead(lead.token))

    def _lock_failed(self, lead: DirectoryLead, exc: Exception) -> None:
        call = lead.call
        self._leads.pop(call.id, None)
        if self._calls.pop(call.id, None) is not None:
            self._send(wire.cancel_frame(call.id))
            _finish(call, Refused(exc))

    def _abandon(self, lead: DirectoryLead) -> bool:
        """Give up a lead still waiting for its key lock (its fd is closed: the lock,
        if the waiting thread gets it, goes with the file). True if it was waiting."""
        with lead.lock:
            if lead.locked:
                return False
            lead.abandoned = True
        lead.release()
        return True

    def _lose(self, lead: DirectoryLead, reason: str) -> None:
        if lead.lost or lead.acked:
            return
        log.warning("lost the lease of a flight of %s (token %d): %s",
                    DigestOf(lead.call.key), lead.token, reason)
        lead.lose()
        # No longer the key's flight in the scope: it leaves the local table as a
        # forget() would take it, so a new call of the key here asks the coordinator
        # (and waits for the key lock this work holds) instead of joining a flight that
        # can only end interrupted. Its callers stay with it.
        lead.call.detached()
        if lead.retrying:
            lead.retrying = False
            lead.call.inbox.put(LeaseLost(reason))
        self._end_lead(lead)

    def _end_lead(self, lead: DirectoryLead) -> None:
        """Free the key lock once the work ended and the flight needs nothing more.
        Called by each side after it set its flag (work_done in the work's thread,
        acked or lost here), so one of them sees both."""
        with lead.lock:
            if not (lead.work_done and (lead.acked or lead.lost or self._closing)):
                return
        self._leads.pop(lead.call.id, None)
        self._calls.pop(lead.call.id, None)
        lead.release()

    # -- what drivers call (any thread) -----------------------------------------

    @property
    def identity(self) -> Hashable:
        """The directory's real path: every spelling of it is one group."""
        return ("directory", os.path.realpath(self.directory))

    @property
    def kind(self) -> str:
        return "directory"

    @property
    def label(self) -> str:
        return f"directory {self.directory!r}"

    @property
    def started(self) -> bool:
        """True once the first call started the group's thread."""
        return self._background.started

    @property
    def left_flights_hold_keys(self) -> bool:
        """True: a flight's key lock is held until its work ends, forgotten or not."""
        return True

    def submit(
        self,
        key: str,
        *,
        fresh: bool,
        after: int | None = None,
        on_detached: Callable[[], object] | None = None,
    ) -> Call:
        """Ask the directory to lead or join ``key``; events go to the call's inbox.
        ``fresh``: only a flight that begins after the call, or after flight ``after``.
        ``on_detached``: called on the group's thread if a forget() elsewhere detaches
        the flight this call leads or joined.

        The request goes out from this thread when connected. While it travels, this
        thread opens the key's lock file (creating it costs a journal write), so a
        lead finds it open."""
        if self._fatal is not None:
            raise renewed(self._fatal)
        if self._election_error is not None and self._channel is None:
            raise renewed(self._election_error)
        self.check_key(key)
        self._ensure_started()
        with self._send_lock:
            if self._closing:
                raise GroupClosedError()
            # Again under the lock: the election may have failed since, and its
            # _fail_all (under this lock too) may have run before this call was in.
            if self._fatal is not None:
                raise renewed(self._fatal)
            if self._election_error is not None and self._channel is None:
                raise renewed(self._election_error)
            self._next_id += 1
            call = Call(self._next_id, key, fresh, Inbox(), after, on_detached)
            self._calls[call.id] = call
            channel = self._channel
            if channel is not None:
                self._send_run(call, channel, self._max_frame)
        if channel is None:
            # Disconnected (maybe refused by another version): try again now; the
            # answer decides this call (ProtocolVersionError while refused).
            self._background.post(self._kick_now)
        with call.lock:
            if call.fd is not None:
                return call  # answered already
            call.fd = _OPENING
        try:
            fd = os.open(
                fs.key_lock_path(self.directory, key), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                0o600,
            )
        except OSError:
            fd = -1  # the lead opens it (and reports the error) if it comes
        with call.lock:
            pending = call.pending
            if call.fd == _OPENING:
                call.fd = -1 if pending is not None else fd
                if pending is None:
                    return call
            else:  # answered meanwhile without a lead: not needed
                if fd >= 0:
                    os.close(fd)
                return call
        self._take_lead(call, fd, pending)
        return call

    def _kick_now(self) -> None:
        if self._kick is not None:
            self._kick.set()

    def bind(self, call: Call, attempt: Attempt) -> None:
        """The attempt whose work runs under ``call``'s lead (it hears a loss)."""
        lead = call.lead
        assert lead is not None
        lead.bind(attempt)

    def retry(self, call: Call) -> None:
        """Ask a new token for the next attempt; the inbox hears LEAD or LOST."""
        self._background.post(self._retry, call)

    def _retry(self, call: Call) -> None:
        lead = call.lead
        assert lead is not None
        if lead.lost or self._closing:
            call.inbox.put(LeaseLost("the group closed" if self._closing else "lost"))
            return
        lead.retrying = True
        self._send(wire.attempt_frame(call.id))
        # Disconnected: the reassert on the next connection keeps the lead; the
        # retry asks again then (see _connected), or the lease is lost.

    def land(
        self,
        call: Call,
        outcome: SharedOutcome | None,
        *,
        stragglers: list[threading.Event] | None = None,
        done: Callable[[Handed], None] | None = None,
    ) -> None:
        """The flight ended: hand ``outcome`` over (None: nothing to land, the lease
        was lost). Sent from the work's own thread, like a run request; ``done`` is told
        once it is handed to the connection (the coordinator resends it to a rejoin, so
        the flight settles here at once). The key lock is freed once the coordinator
        acknowledged (kept until then for a resend) and every attempt's work has
        returned: ``stragglers`` are the ends of sync attempts still running past their
        deadline (the key never runs beside them)."""
        lead = call.lead
        assert lead is not None
        running = [ended for ended in stragglers or () if not ended.is_set()]
        if running:
            waiter = threading.Thread(
                target=self._after_stragglers, args=(call, running),
                name="flightgroup-straggler", daemon=True,
            )
            self._send_landing(call, lead, outcome, work_done=False)
            waiter.start()
        else:
            self._send_landing(call, lead, outcome, work_done=True)
        if done is not None:
            done(Handed())

    def _after_stragglers(self, call: Call, running: list[threading.Event]) -> None:
        for ended in running:
            ended.wait()
        lead = call.lead
        assert lead is not None
        with lead.lock:
            lead.work_done = True
        self._end_lead(lead)
        if self._closing:
            self._background.post(self._check_closed)

    def _send_landing(
        self, call: Call, lead: DirectoryLead, outcome: SharedOutcome | None, *, work_done: bool
    ) -> None:
        frame = None
        if outcome is not None and not lead.lost:
            frame = wire.land_frame(call.id, lead.token, outcome)  # outside the locks
            if len(frame) - 4 > self._max_frame and isinstance(outcome, Failure):
                # A long message in a small frame: cut to what surely fits (a character
                # takes at most 12 bytes of ASCII JSON), the joiners still hear the error.
                keep = max(0, (self._max_frame - 256 - 12 * len(outcome.type + outcome.module))
                           // 12)
                cut = dataclasses.replace(outcome, message=f"{outcome.message[:keep]}... (cut)")
                frame = wire.land_frame(call.id, lead.token, cut)
            if len(frame) - 4 > self._max_frame:
                frame = _too_large(lead, len(frame) - 4, self._max_frame, "this group's")
        with self._send_lock:  # in order with a reconnect's resends
            with lead.lock:
                lead.work_done = work_done
                if frame is not None and not lead.lost:
                    lead.landing = frame
                else:
                    frame = None
            channel = self._channel
            if frame is not None and channel is not None:
                channel.send(frame)
        log.debug("%s %s: land, token %d (%s)", self.directory, DigestOf(call.key),
                  lead.token, "sent" if frame is not None else "lost, nothing to land")
        self._end_lead(lead)
        if self._closing:
            self._background.post(self._check_closed)

    def withdraw(self, call: Call) -> None:
        """The flight's driver stopped before the call ended: give it back."""
        if not self._background.post(self._withdraw, call):
            self._withdraw(call)  # the group's loop is gone: nothing else runs here

    def _withdraw(self, call: Call) -> None:
        if self._calls.pop(call.id, None) is None:
            return
        lead = call.lead
        if lead is not None:
            self._leads.pop(call.id, None)
            with lead.lock:
                lead.abandoned = True
            lead.release()
        else:
            _drop_fd(call)  # the key's file it opened ahead, in case it led
        # A lead reasserted after a failover is known to the coordinator although its
        # run was never sent on this connection: it is cancelled too.
        if call.sent or lead is not None:
            self._send(wire.cancel_frame(call.id))

    def check_key(self, key: str) -> None:
        """Raises ValueError for a key whose request would not fit in a frame (a
        coordinator would drop the connection, and every flight on it)."""
        # A character takes at most 12 bytes of ASCII JSON: only a long key is measured.
        if 12 * len(key) + 256 > self._max_frame and _request_size(key) > self._max_frame:
            raise _key_too_long(key, self._max_frame)

    def forget(self, key: str, timeout: float = 5.0) -> None:
        """Tell the coordinator: the next call of ``key`` leads a new flight. Returns
        once it confirmed, so a later call anywhere sees it (connecting first if this
        group is not connected; sent again if the connection drops meanwhile).

        Raises UnavailableError when no coordinator confirmed it within ``timeout``
        (then a call elsewhere may still join the flight); a closed group forgets
        only in its own table, and returns."""
        if self._closing:
            return
        self._ensure_started()
        end = time.monotonic() + timeout
        while not self._closing and (left := end - time.monotonic()) > 0:
            if not self._connected_now.wait(left):
                break
            waiter: Future[Any] = Future()
            with self._send_lock:
                channel = self._channel
                if channel is None:
                    continue
                self._next_id += 1
                id = self._next_id
                self._waiters[id] = waiter
                channel.send(wire.forget_frame(key, id))
            try:
                waiter.result(max(0.0, end - time.monotonic()))
                return
            except Exception:  # the connection dropped: the next coordinator is told
                continue
        if not self._closing:
            raise UnavailableError(
                f"no coordinator confirmed the forget of {key!r} within {timeout:g} s; "
                "other processes may still join its flight"
            )

    def status(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The flights in progress in the directory (a read-only request). Raises
        UnavailableError when no coordinator answers within ``timeout``, and
        GroupClosedError once the group is closed."""
        if self._closing:
            raise GroupClosedError()
        self._ensure_started()
        waiter: Future[Any] = Future()

        def ask() -> None:
            with self._send_lock:
                self._next_id += 1
                id = self._next_id
            if self._channel is None:
                waiter.set_exception(UnavailableError("no coordinator is connected"))
                return
            self._waiters[id] = waiter
            self._send(wire.status_frame(id))

        if not self._background.post(ask):
            raise GroupClosedError()
        try:
            flights: list[dict[str, Any]] = waiter.result(timeout)
        except TimeoutError:  # concurrent.futures' is the builtin since 3.11
            # (its waiter goes with the answer, or with the connection)
            raise UnavailableError(
                f"no coordinator answered the status request within {timeout:g} s"
            ) from None
        for flight in flights:
            if isinstance(flight.get("key"), str):
                flight["key"] = key_as_called(flight["key"])
        return flights

    # -- closing ----------------------------------------------------------------

    def close(self) -> None:
        """Wait (at most ``reconnect_timeout``) until every landing made here was
        acknowledged, then disconnect; stop coordinating if this group does. Works
        still running keep their key locks until they end."""
        # (Under the start lock: no call starts the group once it closes. Under the send
        # lock: submit() checks it there.)
        with self._background.lock, self._send_lock:
            again = self._closing
            self._closing = True
        if again:
            if not self._background.on_its_thread():
                self._close_returned.wait(self._reconnect_timeout + 10)
            return
        try:
            self._close()
        finally:
            self._close_returned.set()

    def _close(self) -> None:
        with self._campaign_lock:  # a won election finishes its epoch write first
            pass
        if self._campaigner is not None:
            _park(self._campaigner, self)
        if not self._background.post(self._begin_close):
            return  # never started (or a forked child's copy): nothing runs to close
        with contextlib.suppress(Exception):
            self._closed_future.result(self._reconnect_timeout + 5)
        self._background.stop()

    def _begin_close(self) -> None:
        for call in self._take_unled():
            if call.sent:
                # As a withdrawal does: left out, a coordinator that has not read the
                # run yet would make this dead call a leader, and other processes' calls
                # would join a flight nobody runs until this connection goes.
                self._send(wire.cancel_frame(call.id))
            _finish(call, Refused(GroupClosedError()))
        for lead in list(self._leads.values()):
            if self._abandon(lead):  # still waiting for its key lock: it never starts
                self._leads.pop(lead.call.id, None)
                self._calls.pop(lead.call.id, None)
                _finish(lead.call, Refused(GroupClosedError()))
                lead.landing = wire.land_frame(
                    lead.call.id, lead.token, Interrupted("its leader's group closed")
                )
                self._send(lead.landing)
                continue
            if lead.retrying:  # between attempts: the next one never starts
                lead.retrying = False
                lead.call.inbox.put(LeaseLost("the group closed"))
            if lead.lose(only_running=True):
                # The group closed: its outcome will not be delivered. Its joiners
                # elsewhere are told now (an interrupted landing), not when a later
                # coordinator finds its key lock free; the lock stays held until the
                # work ends (land() frees it then).
                lead.cut = True
                lead.landing = wire.land_frame(
                    lead.call.id, lead.token, Interrupted("its leader's group closed")
                )
                self._send(lead.landing)
        self._close_by = time.monotonic() + self._reconnect_timeout
        self._check_closed()

    def _check_closed(self) -> None:
        """Finish closing once no landing waits for an ack (or time is up)."""
        waiting = [lead for lead in list(self._leads.values()) if lead.landing and not lead.acked]
        if waiting and time.monotonic() < self._close_by and not self._given_up:
            asyncio.get_running_loop().call_later(0.01, self._check_closed)
            return
        if self._finishing:
            return
        self._finishing = True
        for lead in list(self._leads.values()):
            if lead.work_done:
                self._leads.pop(lead.call.id, None)
                lead.release()
            # a running work keeps its key lock until it ends (land() frees it)
        with self._send_lock:
            channel, self._channel = self._channel, None
            self._connected_now.clear()
        for id, waiter in list(self._waiters.items()):  # a forget or status asked meanwhile
            del self._waiters[id]
            if not waiter.done():
                waiter.set_exception(GroupClosedError())
        if channel is not None:
            channel.flush_and_close()
        if self._kick is not None:
            self._kick.set()

        async def finish() -> None:
            if self._maintainer is not None:
                self._maintainer.cancel()
            if self._coordinator is not None:
                await self._coordinator.close()
            self._closed_future.set_result(None)

        asyncio.get_running_loop().create_task(finish())

    def _forked(self, why: str, inherited: BackgroundLoop) -> None:
        """(In a forked child of a started group, see BackgroundLoop) the group's threads
        were not copied: it raises at once here, instead of waiting on a loop that never
        runs (its descriptors were let go, see forked.py)."""
        self._fatal = closed_in_fork(why)
        self._closing = True  # close() has nothing to wait for
        self._close_returned = threading.Event()
        self._close_returned.set()
        self._kick = None
        self._channel = self._coordinator = None
        self._campaigner = None
        if self.on_fork is not None:
            self.on_fork(why)


class _Resign(Exception):
    pass


class _Campaign:
    """One election thread: it blocks in ``flock`` on ``flight.lock`` (no polling: the
    kernel wakes it when the lock is free) for the group that owns it.

    Nothing can wake a blocked ``flock`` but the lock, so a group that closes while
    another process coordinates cannot end its campaign. It parks it instead, and the
    next group this process opens on the directory adopts it: opening and closing
    groups keeps at most as many campaigns (threads, descriptors of ``flight.lock``)
    as there were groups open at once. A parked campaign that wins lets go at once.
    """

    __slots__ = ("done", "owner")

    def __init__(self, owner: DirectoryArbiter) -> None:
        self.owner = owner
        self.done = False  # it no longer waits (it won, or could not wait): never parked

    def run(self) -> None:
        directory = self.owner.directory
        path = os.path.join(directory, fs.LOCK_NAME)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                os.close(fd)
                raise
        except OSError as exc:
            with _parked_lock:
                self.done = True
                owner = None if self in _parked.get(directory, ()) else self.owner
            log.warning("cannot take part in the election of %s: %s", directory, exc)
            if owner is not None:  # (a parked campaign's group closed: nobody needs it)
                owner._retry_campaign()
            return
        with _parked_lock:
            self.done = True
            parked = _parked.get(directory, [])
            orphan = self in parked
            if orphan:
                parked.remove(self)
                if not parked:
                    del _parked[directory]
            owner = self.owner
        if orphan:  # its group closed and no other adopted it: the next process wins
            os.close(fd)
            return
        owner._won(fd)


# directory -> the campaigns of closed groups, still blocked (see _Campaign)
_parked: dict[str, list[_Campaign]] = {}
_parked_lock = threading.Lock()


def _campaign_for(arbiter: DirectoryArbiter) -> None:
    """Give ``arbiter`` a parked campaign of its directory, or start a new one."""
    with _parked_lock:
        parked = _parked.get(arbiter.directory)
        if parked:
            campaign = arbiter._campaigner = parked.pop()
            if not parked:
                del _parked[arbiter.directory]
            campaign.owner = arbiter
            return
    arbiter._campaigner = _Campaign(arbiter)
    threading.Thread(target=arbiter._campaign, name="flightgroup-election", daemon=True).start()


def _park(campaign: _Campaign, closing: DirectoryArbiter) -> None:
    """``closing``'s group closes: its campaign, if still blocked, waits for a new owner."""
    with _parked_lock:
        if campaign.done or campaign.owner is not closing:
            return
        _parked.setdefault(closing.directory, []).append(campaign)


def _after_fork() -> None:
    """(In a forked child) the parked campaigns' threads were not copied: no group here
    adopts one (a started group's own let-go is ``DirectoryArbiter._forked``)."""
    global _parked_lock
    _parked.clear()
    _parked_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def _finish(call: Call, event: ScopeEvent) -> None:
    """The call ends without leading: tell its driver."""
    _drop_fd(call)
    call.inbox.put(event)


def _heard(earlier: tuple[int, ...], old: int, new: int) -> tuple[int, ...]:
    """A flight's token went from ``old`` to ``new``: the earlier tokens then, oldest
    first (``old`` last, ``new`` never: a coordinator that heard of no later token may
    hand back one it had), the latest ``wire.MAX_EARLIER``."""
    kept = [t for t in earlier if t != old and t != new]
    if old != new:
        kept.append(old)
    return tuple(kept[-wire.MAX_EARLIER :])


def _too_large(lead: DirectoryLead, size: int, limit: int, whose: str) -> bytes:
    """The landing that replaces one over a frame's limit: no coordinator would read it
    (it closes the connection, and every flight led on it would be interrupted)."""
    log.warning(
        "the outcome of a flight of %s (token %d, %d bytes) is over %s max_frame_bytes "
        "(%d): its joiners are interrupted", DigestOf(lead.call.key), lead.token, size,
        whose, limit,
    )
    return wire.land_frame(
        lead.call.id, lead.token,
        Interrupted(f"its outcome ({size} bytes) is over {whose} max_frame_bytes ({limit})"),
    )


def _request_size(key: str) -> int:
    """The largest body a request about ``key`` can take (a rejoin of a fresh call, or a
    reassert, with the longest id and token; ``earlier`` is cut to fit, see _fitting)."""
    most = 2**63 - 1
    return max(
        len(wire.run_frame(most, key, fresh=True, flight=most, after=most, notices=True)),
        len(wire.reassert_frame(most, key, most, landed=True, notices=True)),
    ) - 4


def _key_too_long(key: str, limit: int) -> ValueError:
    return ValueError(
        f"the key ({len(key)} characters) makes a request over max_frame_bytes ({limit})"
    )


def _fitting(frame_of: Callable[..., bytes], earlier: Sequence[int], max_frame: int) -> bytes:
    """The frame ``frame_of(earlier=...)`` makes with as many of the latest ``earlier``
    tokens as keep it within ``max_frame`` (a small ``max_frame_bytes``: the oldest go)."""
    tokens = list(earlier)
    frame = frame_of(earlier=tokens)
    while tokens and len(frame) - 4 > max_frame:
        del tokens[: max(1, len(tokens) // 2)]
        frame = frame_of(earlier=tokens)
    return frame


def _drop_fd(call: Call) -> None:
    """The call will not lead: close the key lock file it opened ahead (one still
    opening is closed by its opener, which finds -1)."""
    with call.lock:
        fd, call.fd = call.fd, -1
    if fd is not None and fd >= 0:
        os.close(fd)


async def _read_line(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes | None:
    """The handshake's answer line, read byte-exact (nothing after it is taken: the
    Channel reads the frames)."""
    line = bytearray()
    while len(line) <= wire.FIRST_LINE_LIMIT:
        chunk = await loop.sock_recv(sock, 1)
        if not chunk:
            return None
        line += chunk
        if chunk == b"\n":
            return bytes(line)
    return None
