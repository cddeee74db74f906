"""The key locks a coordinator waits on: it learns when another process lets go of a key.

Key locks (``execution-locks/<sha256>``) are the kernel's word on who runs a key. When
a call needs a key whose lock another process holds (a leader of an earlier term that
has not reasserted yet, a leader whose group closed while its work runs, a frozen one),
the coordinator waits for it here: a watcher thread blocks on the lock (no polling) and
posts back to the coordinator's loop once it is free. Past ``_WATCHERS_MAX`` keys, or
when a watcher cannot be had (no thread, no descriptor), the key's lock is probed every
``_POLL_INTERVAL`` instead: never reported free before it is.

Nothing calls off a blocking ``flock``, so a closed term's watcher stays until the lock
frees, and the next term of this process that waits on the key adopts it (as a closed
group's election thread is, ADR 0016): one watcher per key-lock file per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import threading
from collections.abc import Callable

from . import fs

__all__ = ["KeyLockWatch", "ProbeError", "key_held"]

_WATCHERS_MAX = 256  # key-lock watcher threads of a process; more keys are polled
_POLL_INTERVAL = 0.05  # s: between probes of a polled key's lock
# Probing a key's lock failed for want of a resource that comes back: it may be held.
_TRANSIENT = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EAGAIN, errno.EINTR}
)


class ProbeError(Exception):
    """A key's lock cannot be probed, and not for want of a resource (its file is
    not ours to open, say): the calls that need it are answered with an error."""


def key_held(directory: str, key: str, *, create: bool) -> bool:
    """True if another open file holds ``key``'s lock (probed without blocking),
    or may hold it (the probe lacked a descriptor: the caller waits, and the key
    is probed again). Raises ProbeError if the lock cannot be probed at all."""
    path = fs.key_lock_path(directory, key)
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno in _TRANSIENT:
            return True
        raise ProbeError(f"cannot probe the key's lock: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError as exc:
        if exc.errno in _TRANSIENT:
            return True
        raise ProbeError(f"cannot probe the key's lock: {exc.strerror}") from None
    finally:
        os.close(fd)  # also unlocks
    return False


class _Watcher:
    """A thread blocked in ``flock`` on one key's lock, reporting to the watch that
    owns it when the lock frees (see the module)."""

    __slots__ = ("key", "owner", "path")

    def __init__(self, path: str, key: str, owner: KeyLockWatch) -> None:
        self.path = path
        self.key = key
        self.owner: KeyLockWatch | None = owner

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
        loop = owner.loop if owner is not None else None
        if owner is None or loop is None:
            return
        report = owner.freed if freed else owner.poll
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


class KeyLockWatch:
    """The key locks one coordinator term waits on. ``waited(key)``: calls still wait
    for the key; ``on_freed(key)``: its lock is free; ``on_failed(key, message)``: it
    cannot be probed. All three are called on ``loop``, the coordinator's."""

    def __init__(
        self,
        directory: str,
        waited: Callable[[str], bool],
        on_freed: Callable[[str], None],
        on_failed: Callable[[str, str], None],
    ) -> None:
        self.directory = directory
        self.loop: asyncio.AbstractEventLoop | None = None  # set when its term serves
        self._waited = waited
        self._on_freed = on_freed
        self._on_failed = on_failed
        self.polled: set[str] = set()  # waited-for keys with no watcher: probed by a timer
        self.poll_timer: asyncio.TimerHandle | None = None
        self.closed = False

    def wait(self, key: str) -> None:
        """Report when ``key``'s lock frees: on a watcher, or else by polling."""
        if not self._watch(key):
            self.poll(key)

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

    def freed(self, key: str) -> None:
        """(On the loop) a watcher saw ``key``'s lock free."""
        if not self.closed:
            self._on_freed(key)

    def poll(self, key: str) -> None:
        """Probe ``key``'s lock every _POLL_INTERVAL while calls wait for it (no
        watcher could block on it)."""
        if self.closed or not self._waited(key):
            return
        self.polled.add(key)
        if self.poll_timer is None:
            assert self.loop is not None
            self.poll_timer = self.loop.call_later(_POLL_INTERVAL, self._poll_tick)

    def _poll_tick(self) -> None:
        self.poll_timer = None
        if self.closed:
            return
        for key in list(self.polled):
            if not self._waited(key):  # reasserted, or nobody waits any more
                self.polled.discard(key)
                continue
            try:
                held = key_held(self.directory, key, create=False)
            except ProbeError as exc:
                self.polled.discard(key)
                self._on_failed(key, str(exc))
                continue
            if not held:
                self.polled.discard(key)
                self._on_freed(key)
        if self.polled:
            assert self.loop is not None
            self.poll_timer = self.loop.call_later(_POLL_INTERVAL, self._poll_tick)

    def close(self) -> None:
        """Stop polling; the watchers block on, for the next term here to adopt."""
        self.closed = True
        if self.poll_timer is not None:
            self.poll_timer.cancel()
            self.poll_timer = None
        with _watchers_lock:
            for watcher in _watchers.values():
                if watcher.owner is self:
                    watcher.owner = None
