"""What a forked child must not keep of its parent's directory groups.

``os.fork`` (and multiprocessing's "fork" start method) copies every descriptor. A flock
belongs to the open file, so a child that keeps its parent's copy of ``flight.lock`` or of
a key lock keeps the election or the key locked after the parent dies: no new coordinator
is elected, no new leader takes the key. A child that keeps a copy of a Unix-socket
connection keeps it open: the coordinator does not see its leader's process die, and
the peers of a dead coordinator do not see it go. The group's threads are not copied, so
the child can never use them.

After a fork, the child points each such descriptor at ``/dev/null`` (dup2) instead of
closing it: the descriptor number stays taken, so the parent's Python objects copied into
the child (sockets, the coordinator's files) close ``/dev/null`` if they ever close,
never an unrelated file that reused the number. The descriptors are found by what they
are (``flight.lock`` or a key-lock file of a group's directory, a Unix socket bound or
connected to its ``flight.sock``, by whatever path), so no code that opens one has to
register it; the user's own files in the directory are left alone.

A socket names no path between its ``socket()`` and its ``connect()`` or ``bind()``: a
child forked then could not tell it from its own, and the parent connects it right after,
so the child would hold the parent's connection. Those steps are made under
:func:`socket_guard`, which a fork waits for.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading

from . import fs

# The directories (real paths) of the directory groups made in this process. A group is
# never removed: a closed group's descriptors are closed already, and the set holds one
# string per directory.
_directories: set[str] = set()


# Held from a group's socket() until that socket is connected or bound; a fork waits.
_guard = threading.Lock()


def socket_guard() -> threading.Lock:
    """Hold while a group's Unix socket is made and connected or bound: no fork comes
    between, so a forked child always finds the socket by its path (see the module).
    Hold it only around those system calls, which do not wait."""
    return _guard


# Whether this thread's fork took the guard in ``_hold`` (forks of two threads may
# overlap: each releases only its own hold).
_forking = threading.local()


def watch(directory: str) -> None:
    """Make a child forked from now on let go of ``directory``'s locks and sockets."""
    _directories.add(os.path.realpath(directory))  # as /proc names files


def _hold() -> None:
    if _directories:  # a process without a directory group makes no such socket
        _guard.acquire()
        _forking.held = True


def _release() -> None:
    if getattr(_forking, "held", False):  # not a fork that began before the first group
        _forking.held = False
        _guard.release()


def _child() -> None:
    global _guard
    _guard = threading.Lock()  # the copy may be held (by this fork)
    _forking.held = False
    _let_go()


# Once, at import (the import lock makes it once): registered by the first group made,
# two threads making their first groups at once registered it twice, and every fork then
# took the guard twice and waited on itself.
os.register_at_fork(before=_hold, after_in_parent=_release, after_in_child=_child)


def _let_go() -> None:
    """(In a forked child) point the copies of the groups' descriptors at /dev/null."""
    if not _directories:
        return
    locks = {os.path.join(d, fs.LOCK_NAME) for d in _directories}
    key_locks = tuple(os.path.join(d, fs.KEY_LOCKS, "") for d in _directories)
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:  # no /proc: nothing can be told apart
        return
    null = -1
    try:
        for name in names:
            fd = int(name)
            if _ours(fd, locks, key_locks):
                if null < 0:
                    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
                with contextlib.suppress(OSError):
                    os.dup2(null, fd, inheritable=False)
    finally:
        if null >= 0:
            os.close(null)


def _ours(fd: int, locks: set[str], key_locks: tuple[str, ...]) -> bool:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
    if target in locks or target.startswith(key_locks):
        return True
    if not target.startswith("socket:"):
        return False
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        if sock.family != socket.AF_UNIX:
            return False
        # A listening or accepted socket is bound to the path; a client's is connected
        # to it. Either may name the directory by another path (a symlink): compared
        # by the real path of its folder.
        for address in (sock.getsockname, sock.getpeername):
            with contextlib.suppress(OSError):
                path = _path(address())
                if (
                    path is not None
                    and os.path.basename(path) == fs.SOCKET_NAME
                    and os.path.realpath(os.path.dirname(path)) in _directories
                ):
                    return True
        return False
    finally:
        sock.detach()  # the descriptor is not this object's to close


def _path(address: object) -> str | None:
    if isinstance(address, bytes):
        address = address.decode(errors="surrogateescape")
    return address if isinstance(address, str) and address else None
