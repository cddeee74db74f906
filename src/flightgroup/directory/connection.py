"""The connection of a directory group to its coordinator: connecting and the handshake,
reconnecting after the coordinator went (:class:`Connection`), and what goes out again on
a new connection (:func:`resend`); the frames travel on a :class:`~.channel.Channel`.

A group reconnects with a short backoff while a new coordinator starts (a failover: it
connects within ~5 ms of the new one serving), less and less often while it is refused
or unanswered, and gives its leases up once no coordinator of its version was heard for
``reconnect_timeout`` seconds of its own running time. On a new connection its leads
reassert first (and resend a landing not yet acknowledged), then its calls send their
runs again, a joined call as a rejoin by its flight's tokens.

Every frame a group sends fits ``max_frame_bytes`` (a coordinator closes a connection
that sends more, and every flight on it with it): a rejoin's or a reassert's earlier
tokens are cut to fit (:func:`_fitting`), a key too long for any request is refused before
it is sent (:func:`request_size`), and a landing too large lands as interrupted
(:func:`landing_frame`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from .._log import DigestOf, log
from ..errors import ProtocolVersionError, UnavailableError
from ..scope.outcome import Failure, Interrupted, SharedOutcome
from . import epochs, forked, fs, wire
from .calls import Call, DirectoryLead
from .channel import Channel, Frames

if TYPE_CHECKING:
    from .state import GroupState


__all__ = [
    "Connection",
    "handshake",
    "key_too_long",
    "landing_frame",
    "request_size",
    "resend",
    "send_run",
    "too_large_landing",
]

# The longest one connection attempt (its handshake's wait, then the pause before the
# next) takes while this process runs; one that took longer spanned a stall.
_ATTEMPT_MAX = wire.HANDSHAKE_TIMEOUT + 0.5 + 1.0
# s: a connection that lived this long counts as served, even if nothing came (an idle
# group hears nothing); a shorter one that heard nothing counts as refused.
_SETTLED = 0.5
# s: the handshake wait of an attempt made when reconnect_timeout is (nearly) spent.
_LAST_WAIT = 0.5


async def handshake(directory: str, wait: float = wire.HANDSHAKE_TIMEOUT) -> socket.socket:
    """Connect to ``directory``'s coordinator and shake hands, waiting up to ``wait`` s
    for its line; the socket is non-blocking, for the Channel. Raises OSError (nothing
    listens), ProtocolVersionError (another version), EOFError (refused), TimeoutError."""
    loop = asyncio.get_running_loop()
    path = fs.socket_path(directory)
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
            log.warning("the coordinator of %s refused us: %s", directory, detail)
        raise EOFError("the coordinator closed the handshake")
    except BaseException:
        if sock is not None:
            sock.close()
        raise


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


class Connection:
    """A group's connection to the coordinator of the moment, kept up until the group
    finishes closing. A group that closes goes on reconnecting until its landings are
    acknowledged (or time is up): a landing made while no coordinator served must
    still reach one. It sets the group's ``state.channel`` (under its ``send_lock``)
    while one is up, and what a new coordinator must hear goes out on it first.

    What it tells the group: ``on_frames`` (the frames a channel read), ``refused`` (a
    coordinator of another version holds the election), ``give_up`` (no coordinator of
    our version for longer than ``reconnect_timeout``: the seconds it was down)."""

    def __init__(
        self,
        state: GroupState,
        *,
        on_frames: Callable[[Frames], None],
        refused: Callable[[ProtocolVersionError], None],
        give_up: Callable[[float], None],
    ) -> None:
        self.state = state
        self.on_frames = on_frames
        self.refused = refused
        self.give_up = give_up
        self.backoff = 0.0005
        # Seconds of this process's own running time with no coordinator of our
        # version: an attempt that took longer than any can (this process was frozen,
        # stopped in a debugger) counts for nothing, or a process thawed after a
        # failover would give up on its first try, against the socket of the
        # coordinator that died.
        self.down = 0.0
        self.last = time.monotonic()
        self.over = False  # an attempt began after ``down`` passed reconnect_timeout
        self.refusals = 0  # handshakes in a row that failed (refused, unanswered)

    async def connect(self, wait: float = wire.HANDSHAKE_TIMEOUT) -> socket.socket:
        """Connect and shake hands, waiting up to ``wait`` s for the coordinator's line."""
        return await handshake(self.state.directory, wait)

    async def run(self) -> None:
        """Keep a connection to the coordinator of the moment, until closed."""
        state = self.state
        kick = state.kick
        assert kick is not None
        self.last = time.monotonic()  # the group's running time begins now
        while not state.finishing:
            # A handshake waits no longer than what is left of reconnect_timeout (a
            # last attempt, at least _LAST_WAIT): a frozen coordinator must not stretch
            # the wait to the next multiple of the handshake's own limit.
            wait = min(
                wire.HANDSHAKE_TIMEOUT, max(state.reconnect_timeout - self.down, _LAST_WAIT)
            )
            served = await self._attempt(wait)
            if served is None:  # closed while it connected
                return
            if served:
                self.backoff, self.refusals = 0.0005, 0
                self.down, self.last, self.over = 0.0, time.monotonic(), False
                continue
            now = time.monotonic()
            if now - self.last <= _ATTEMPT_MAX:
                self.down += now - self.last
            self.last = now
            if self.down > state.reconnect_timeout:
                if self.over:
                    self.give_up(self.down)
                else:
                    # One more attempt, at once, before giving up: the one that just
                    # failed may have begun before a stall too short to leave out (it
                    # waited on a coordinator that died meanwhile).
                    self.over = True
                    continue
            kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(kick.wait(), self.backoff)
            if not self.refusals:
                # a failover: connect within ~5 ms of serving
                self.backoff = min(self.backoff * 2, 0.005)

    async def _attempt(self, wait: float) -> bool | None:
        """One connection attempt and, once welcomed, the connection's whole life.
        True: it served (or lived long enough to count as serving); False: it failed
        or was refused; None: the group closed while it connected."""
        state = self.state
        try:
            sock = await self.connect(wait)
        except ProtocolVersionError as exc:
            self.refused(exc)
            return False
        except OSError:  # nothing listens: whoever refused us is gone
            state.refusal = None
            if self.refusals:  # a failover under way: hurry again
                self.backoff, self.refusals = 0.0005, 0
            return False
        except (EOFError, TimeoutError, wire.WireError):
            # Refused at the handshake (another user's coordinator), or it did not
            # answer: ask again less and less often, not every 5 ms for ever.
            self._refused_again()
            return False
        if state.finishing:
            sock.close()
            return None
        lost = asyncio.get_running_loop().create_future()
        began = time.monotonic()
        channel = self.connected(sock, lost)
        await lost
        if channel.heard or time.monotonic() - began >= _SETTLED:
            return True
        # Welcomed, then dropped before it served anything: a coordinator that does so
        # to every connection is no more reachable than a silent one.
        self._refused_again()
        return False

    def connected(self, sock: socket.socket, lost: asyncio.Future[None]) -> Channel:
        """A coordinator welcomed ``sock``: it becomes the group's channel (``lost``
        is set when it goes), and the leads and calls go out on it again."""
        state = self.state

        def on_lost(channel: Channel, reason: str) -> None:
            log.info("lost the coordinator of %s: %s", state.directory, reason)
            self.disconnected(channel)
            if not lost.done():
                lost.set_result(None)

        channel = Channel(
            sock, asyncio.get_running_loop(), state.max_frame, self.on_frames, on_lost
        )
        state.refusal = None
        state.given_up = False
        with state.send_lock:
            state.channel = channel
            state.election_error = None  # a coordinator serves: the directory works
            state.connected_now.set()
            resend(channel, state.leads.values(), state.calls.values(), state.directory,
                   state.max_frame)
        return channel

    def disconnected(self, channel: Channel) -> None:
        """``channel`` is gone: its requests go out again on the next one, and the
        requests a thread waits for fail."""
        state = self.state
        with state.send_lock:
            if state.channel is channel:
                state.channel = None
                state.connected_now.clear()
            for call in list(state.calls.values()):  # (a work's thread may pop one)
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
            for lead in list(state.leads.values()):
                # A landing this socket took may have reached joiners before the
                # coordinator went (see Leases._not_landed).
                if lead.landing is not None and not lead.acked and channel.took(
                    lead.landing_end
                ):
                    lead.maybe_landed = True
                lead.landing_end = -1
        for id, waiter in list(state.waiters.items()):
            del state.waiters[id]
            if not waiter.done():
                waiter.set_exception(UnavailableError("the coordinator went away"))

    def _refused_again(self) -> None:
        self.refusals += 1
        self.backoff = min(0.001 * 2**self.refusals, 0.5)


def resend(
    channel: Channel,
    leads: Iterable[DirectoryLead],
    calls: Iterable[Call],
    directory: str,
    max_frame: int,
) -> None:
    """(Under the group's send lock) what a new connection hears first. Leaders first:
    a reassert (and its landing) before any rejoin of the key; then every call that
    leads nothing sends its run again."""
    for lead in list(leads):
        if lead.acked or (lead.lost and not lead.cut):
            continue
        reassert = partial(
            wire.reassert_frame, lead.call.id, lead.call.key, lead.token,
            landed=lead.landing is not None, notices=True,
        )
        channel.send(_fitting(reassert, lead.earlier, max_frame))
        if lead.landing is not None:
            lead.landing_end = channel.send(lead.landing)
        elif lead.retrying:  # the new token it asked for never came
            channel.send(wire.attempt_frame(lead.call.id))
    epoch = None
    for call in list(calls):
        if call.lead is not None or call.sent:
            continue
        if call.outlived:
            call.outlived = False
            if epoch is None:
                epoch = epochs.read_epoch(directory) or 0
            if call.after is None and epoch > 0:
                # Not "no flight that exists now": the one this call waited for may
                # have ended, and the next begun, in the new term.
                call.after = (epoch << 32) - 1
        if call.pending is not None:
            # It was told to lead while it opened its key file; the lead is being
            # taken: the new coordinator hears a reassert, not a run.
            call.sent = True
            channel.send(wire.reassert_frame(call.id, call.key, call.pending, notices=True))
        else:
            send_run(call, channel, max_frame)


def send_run(call: Call, channel: Channel, max_frame: int) -> None:
    """(Under the group's send lock) send ``call``'s request: a run, or, for a call that
    joined before a reconnect, a rejoin by every token of the flight it heard."""
    call.sent = True
    if call.joined:
        rejoin = partial(wire.run_frame, call.id, call.key, flight=call.token, notices=True)
        channel.send(_fitting(rejoin, call.earlier, max_frame))
    else:
        call.sent_end = channel.send(wire.run_frame(
            call.id, call.key, fresh=call.fresh, after=call.after, notices=True
        ))


def landing_frame(
    call: Call, lead: DirectoryLead, outcome: SharedOutcome, max_frame: int
) -> bytes:
    """The ``land`` frame of ``outcome``, within ``max_frame``: a failure's long message
    is cut, an outcome still too large lands as interrupted (see too_large_landing)."""
    frame = wire.land_frame(call.id, lead.token, outcome, taken=True)
    if len(frame) - 4 > max_frame and isinstance(outcome, Failure):
        # A long message in a small frame: cut to what surely fits (a character
        # takes at most 12 bytes of ASCII JSON), the joiners still hear the error.
        keep = max(0, (max_frame - 256 - 12 * len(outcome.type + outcome.module)) // 12)
        cut = dataclasses.replace(outcome, message=f"{outcome.message[:keep]}... (cut)")
        frame = wire.land_frame(call.id, lead.token, cut, taken=True)
    if len(frame) - 4 > max_frame:
        frame = too_large_landing(lead, len(frame) - 4, max_frame, "this group's")
    return frame


def too_large_landing(lead: DirectoryLead, size: int, limit: int, whose: str) -> bytes:
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
        taken=True,
    )


def request_size(key: str) -> int:
    """The largest body a request about ``key`` can take (a rejoin of a fresh call, or a
    reassert, with the longest id and token; ``earlier`` is cut to fit, see _fitting)."""
    most = 2**63 - 1
    return max(
        len(wire.run_frame(most, key, fresh=True, flight=most, after=most, notices=True)),
        len(wire.reassert_frame(most, key, most, landed=True, notices=True)),
    ) - 4


def key_too_long(key: str, limit: int) -> ValueError:
    """The error of a key whose request would not fit ``limit``."""
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
