"""Our own output in ``flightgroup run``: stdout and stderr written by their descriptors
(a closed one held by /dev/null, a full one waited for, a reader gone away told apart
from a write error), the lines flightgroup says, and a joiner's view of its leader's
output (:class:`Follower`: the spool followed while it grows, a progress line on a
terminal until output comes).
"""

from __future__ import annotations

import errno
import os
import select
import threading
import time
from collections.abc import Callable

from .command_spool import STDOUT, RecordReader

__all__ = [
    "Follower",
    "closed_at_start",
    "failed_to_pass",
    "hold_standard_fds",
    "say",
    "write_all",
]

_POLL = 0.03  # seconds between two looks at a spool's growth
_PROGRESS_EVERY = 0.1

# Our stdout and stderr among fds 1 and 2 that were closed when we started: /dev/null
# holds their place (hold_standard_fds), and CMD's output for them is recorded, not passed.
_closed_at_start: frozenset[int] = frozenset()


def hold_standard_fds() -> None:
    """Put /dev/null on each of fds 0, 1 and 2 that is closed (``>&-``), before anything
    opens a descriptor: else the group's own (its event loop's epoll, a socket) would
    take that number, and what is written to "stdout" would go into it."""
    global _closed_at_start
    closed = set()
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
    for fd in sorted(closed):
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        os.set_inheritable(fd, True)  # CMD gets it too (os.open's are close-on-exec)
    _closed_at_start = frozenset(closed)


def write_all(fd: int, data: bytes) -> OSError | None:
    """Write ``data`` to ``fd``; None, or the error that stopped it (EPIPE: the reader
    went away). A full descriptor left non-blocking by whoever made it (EAGAIN) is
    waited for, as a blocking one would be."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [])
        except OSError as exc:
            return exc
    return None


def failed_to_pass(error: OSError, own: int, whose: str) -> bool:
    """After writing to our ``own`` fd failed with ``error``: True (said once, on
    stderr) for a real write error, False when our reader went away (EPIPE)."""
    if error.errno == errno.EPIPE:
        return False
    name = "stdout" if own == 1 else "stderr"
    say(f"cannot write the {whose} {name}: {error.strerror or error}")
    return True


def say(line: str) -> None:
    """Say ``line`` on stderr, as flightgroup."""
    # To the descriptor itself: with fd 2 closed (`2>&-`) sys.stderr is None, and a
    # joiner must still pass on the leader's output and exit code.
    write_all(2, f"flightgroup: {line}\n".encode(errors="replace"))


def closed_at_start() -> frozenset[int]:
    """Which of our fds 1 and 2 were closed when we started (``hold_standard_fds``):
    what CMD writes to them is recorded, not passed."""
    return _closed_at_start


class Follower:
    """A joiner's view of the leader's output: follows the spool file while it
    grows, and shows a progress line on a terminal until output comes."""

    def __init__(
        self,
        key: str,
        path: str | None,
        age: float,
        leader: str,
        reader_gone: Callable[[], None] | None = None,
    ) -> None:
        self._key = key
        self._on_reader_gone = reader_gone  # called from the follow thread
        self._path = path
        self._fd = -1
        self._reader = RecordReader()
        self._started = time.monotonic() - age
        self._leader = leader
        self._tty = os.isatty(2)
        self._progress = False  # the progress line is on the screen
        self._next_progress = 0.0
        self._not_passed: set[int] = set(_closed_at_start)  # our fds that take no more
        # Our reader went away (EPIPE): the joiner withdraws and exits 141 quietly.
        self.reader_gone = False
        # Another write error (ENOSPC, EIO): said; exit 1 if the leader's CMD succeeded.
        self.write_failed = False
        self.emitted = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Follow in a background thread (only when there is something to do)."""
        if self._path is None and not self._tty:
            return
        self._thread = threading.Thread(target=self._run, name="flightgroup-follow", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._poll()
            self._show_progress()
            if self._stop.wait(_POLL):
                return

    def _poll(self) -> None:
        if self._fd < 0:
            if self._path is None:
                return
            try:
                self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return  # not created yet
        while True:
            data = os.read(self._fd, 1 << 16)
            if not data:
                return
            self.emit(self._reader.feed(data))

    def emit(self, records: list[tuple[int, bytes]]) -> None:
        """Write records to our stdout and stderr."""
        for stream, data in records:
            if not data:
                continue
            self._clear_progress()
            self.emitted = True
            own = 1 if stream == STDOUT else 2
            if own in self._not_passed:
                continue
            error = write_all(own, data)
            if error is None:
                continue
            self._not_passed.add(own)
            if failed_to_pass(error, own, "leader's"):
                self.write_failed = True
                continue
            # As in a pipeline (`| head -1`): this caller is done (see
            # _Run.withdraw_now); at the end of the run, it just exits 141.
            self.reader_gone = True
            if self._on_reader_gone and threading.current_thread() is self._thread:
                self._on_reader_gone()

    def _show_progress(self) -> None:
        now = time.monotonic()
        if not self._tty or self.emitted or now < self._next_progress:
            return
        self._next_progress = now + _PROGRESS_EVERY
        elapsed = now - self._started
        line = f"\rflightgroup: waiting for {self._key!r}{self._leader}: {elapsed:.1f} s\x1b[K"
        write_all(2, line.encode(errors="replace"))
        self._progress = True

    def _clear_progress(self) -> None:
        if self._progress:
            write_all(2, b"\r\x1b[K")
            self._progress = False

    def stop(self) -> None:
        """Stop following (the thread ends within one poll)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def finish(self, path: str | None) -> None:
        """After the flight: stop, then write what is left. ``path`` is the spool the
        value names: read from it if this joiner never found its spool."""
        self.stop()
        if path is not None and path != self._path:
            if self.emitted:  # a newer flight of the key started before our status look
                self._clear_progress()
                say(f"the output above may be another run's of {self._key!r} than this one")
            else:
                self._close_fd()
                self._path, self._reader = path, RecordReader()
        self._poll()
        self._clear_progress()
        self._close_fd()

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def abandon(self) -> None:
        """Stop without reading further (this caller withdrew)."""
        self.stop()
        self._clear_progress()
        self._close_fd()
