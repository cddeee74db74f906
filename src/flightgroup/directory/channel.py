"""The channel a directory group talks to its coordinator on, once the handshake is
done (:class:`Channel`): frames read on the group's loop and handed over whole, frames
written from whichever thread has something to say, in order, never blocking.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

from . import wire

__all__ = ["Channel", "Frames"]

Frames = list[tuple[dict[str, Any], bytes | None]]  # (header, payload) of whole frames

# bytes: the most a lost connection's drain reads (a coordinator that died wrote no
# more than its socket's buffer; one still writing is not read for ever).
_DRAIN_MAX = 2 * wire.DEFAULT_MAX_FRAME


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
        on_frames: Callable[[Frames], None],
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
            self._loop.call_soon_threadsafe(self._lost, reason, True)

    def _lost(self, reason: str, drain: bool = False) -> None:
        """The connection is gone. ``drain`` (a write failed): what the socket holds
        is read first."""
        if self.closed:
            return
        if drain:
            self._drain()
        if self.close():
            self._on_lost(self, reason)

    def _drain(self) -> None:
        """(On the loop) dispatch every whole frame the socket holds before a failed
        write gives it up: a coordinator that wrote a landing to this process and then
        died (this process was frozen meanwhile) has no other copy of it, and the next
        coordinator knows no such flight (docs/directory-scope.md promises its joiners
        the value). A frame cut off by the coordinator's end is dropped."""
        frames: list[tuple[dict[str, Any], bytes | None]] = []
        left = _DRAIN_MAX
        while left > 0:
            try:
                size = self.sock.recv_into(self._buffer)
            except OSError:  # nothing more now (BlockingIOError), or nothing to read
                break
            if not size:
                break
            left -= size
            try:
                frames += self._splitter.feed(bytes(self._buffer[:size]))
            except wire.WireError:
                break
        if frames:
            self.heard = True
            self._on_frames(frames)

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
