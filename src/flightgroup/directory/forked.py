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
are (a file under a group's directory, a Unix socket bound or connected to its
``flight.sock``), so no code that opens one has to register it.
"""

from __future__ import annotations

import contextlib
import os
import socket

# The directories of the directory groups made in this process (absolute paths). A
# group is never removed: a closed group's descriptors are closed already, and the
# set holds one string per directory.
_directories: set[str] = set()


def watch(directory: str) -> None:
    """Make a child forked from now on let go of ``directory``'s locks and sockets."""
    if not _directories:
        os.register_at_fork(after_in_child=_let_go)
    # /proc names files by their real path; sockets keep the path they were bound to.
    _directories.update({os.path.abspath(directory), os.path.realpath(directory)})


def _let_go() -> None:
    """(In a forked child) point the copies of the groups' descriptors at /dev/null."""
    if not _directories:
        return
    prefixes = tuple(os.path.join(d, "") for d in _directories)
    sockets = {os.path.join(d, "flight.sock") for d in _directories}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:  # no /proc: nothing can be told apart
        return
    null = -1
    try:
        for name in names:
            fd = int(name)
            if _ours(fd, prefixes, sockets):
                if null < 0:
                    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
                with contextlib.suppress(OSError):
                    os.dup2(null, fd, inheritable=False)
    finally:
        if null >= 0:
            os.close(null)


def _ours(fd: int, prefixes: tuple[str, ...], sockets: set[str]) -> bool:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
    if target.startswith(prefixes):  # flight.lock, flight.epoch, execution-locks/...
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
        # to it.
        with contextlib.suppress(OSError):
            if _path(sock.getsockname()) in sockets:
                return True
        with contextlib.suppress(OSError):
            if _path(sock.getpeername()) in sockets:
                return True
        return False
    finally:
        sock.detach()  # the descriptor is not this object's to close


def _path(address: object) -> str | None:
    if isinstance(address, bytes):
        address = address.decode(errors="surrogateescape")
    return address if isinstance(address, str) and address else None
