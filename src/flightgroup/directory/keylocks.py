"""A lead's key lock on the client side: the key's file, opened ahead while the request
travels, the exclusive ``flock`` taken at once or by a waiter thread, the token written
under it, and its release (ADR 0010, 0017, 0028).

A lead holds its key's lock while its work runs; the kernel frees it when the process
dies, so no other process starts the key's work beside a live leader, even a frozen one.
The lock may be held for a moment by the coordinator's probe, or by the leader before
this one until its ack arrives, or by a closed group's long work: then a thread waits
for it (:class:`LockWaiter`), on a copy of the descriptor (the same open file, so the
same lock).

The key's file names the newest token that held its lock (ADR 0028): every leader writes
its token there under the lock, so a lead that finds a higher one was granted, then
overtaken while it waited (a forget() detached it, or a failover let a new call lead
before its reassert), and must not run as if it held the lease.

The functions act on one call or lead and say what they did; :class:`KeyLocks` is the
part of the arbiter that takes a lead with them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..scope.events import Lead, Refused
from . import fs, wire
from .calls import Call, DirectoryLead

if TYPE_CHECKING:
    from .state import GroupState

__all__ = [
    "OPENING",
    "KeyLocks",
    "LockWaiter",
    "abandon",
    "claim",
    "drop_fd",
    "lock_or_copy",
    "open_ahead",
    "open_key_file",
    "write_token",
]

OPENING = -2
"""``Call.fd`` while the caller creates the key's file."""


def open_key_file(directory: str, key: str) -> int:
    """Open (create) ``key``'s lock file; raises OSError."""
    return os.open(
        fs.key_lock_path(directory, key), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
    )


def open_ahead(call: Call, directory: str) -> tuple[int, int] | None:
    """(The caller's thread, after its request went out) open the key's file, so a
    lead finds it open. Returns ``(fd, token)`` when the lead came while it opened:
    the caller takes the lead then (``fd`` is -1 if the file could not be opened).
    None otherwise: the file waits in ``call.fd``, or the call was answered without a
    lead and nothing is kept."""
    with call.lock:
        if call.fd is not None:
            return None  # answered already
        call.fd = OPENING
    try:
        fd = open_key_file(directory, call.key)
    except OSError:
        fd = -1  # the lead opens it (and reports the error) if it comes
    with call.lock:
        pending = call.pending
        if call.fd == OPENING:
            call.fd = -1 if pending is not None else fd
            if pending is None:
                return None
        else:  # answered meanwhile without a lead: not needed
            if fd >= 0:
                os.close(fd)
            return None
    return fd, pending


def drop_fd(call: Call) -> None:
    """The call will not lead: close the key lock file it opened ahead (one still
    opening is closed by its opener, which finds -1)."""
    with call.lock:
        fd, call.fd = call.fd, -1
    if fd is not None and fd >= 0:
        os.close(fd)


def lock_or_copy(directory: str, call: Call, fd: int | None) -> tuple[int, int]:
    """Take ``call``'s key lock on ``fd`` (opening the key's file unless ``fd`` is
    open) without blocking. Returns ``(fd, copy)``: ``copy`` is -1 if the lock is
    held, else a duplicate of ``fd`` for a :class:`LockWaiter`. Raises OSError (the
    descriptor it was given or opened is closed then)."""
    if fd is None or fd < 0:
        fd = open_key_file(directory, call.key)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            return fd, os.dup(fd)
        except OSError:
            os.close(fd)
            raise
    return fd, -1


class LockWaiter:
    """A thread that blocks in ``flock`` on ``copy`` until ``lead``'s key lock is this
    process's, then calls ``locked(lead)``; if the lock cannot be had, the lead is
    abandoned and ``failed(lead, exc)`` is called (never lead without the lock)."""

    __slots__ = ("copy", "directory", "failed", "lead", "locked")

    def __init__(
        self,
        directory: str,
        lead: DirectoryLead,
        copy: int,
        locked: Callable[[DirectoryLead], None],
        failed: Callable[[DirectoryLead, Exception], object],
    ) -> None:
        self.directory = directory
        self.lead = lead
        self.copy = copy
        self.locked = locked
        self.failed = failed

    def start(self) -> None:
        """Wait in a thread of its own; with no thread to be had, give the lead back."""
        try:
            threading.Thread(target=self._wait, name="flightgroup-keylock", daemon=True).start()
        except RuntimeError as exc:
            os.close(self.copy)
            self._give_up(exc)

    def _wait(self) -> None:
        try:
            try:
                fcntl.flock(self.copy, fcntl.LOCK_EX)
            finally:
                os.close(self.copy)  # the lock stays with the lead's descriptor
        except OSError as exc:
            self._give_up(exc)
            return
        self.locked(self.lead)

    def _give_up(self, exc: Exception) -> None:
        lead = self.lead
        with lead.lock:
            lead.abandoned = True
        lead.release()
        self.failed(lead, exc)


def claim(lead: DirectoryLead) -> int | None:
    """``lead`` holds its key lock: mark it locked and write its token in the key's
    file. Returns the newer token found there (0: none), or None if the lead was
    abandoned meanwhile (closed or withdrawn: its lock is released here).

    Every leader writes its token here under the lock, so a higher one means a newer
    flight of the key held it first (ADR 0028). Evidence for the epoch too (ADR 0009),
    written under the lock: release() may close the descriptor (and its number be
    reused) once it is free. Fixed width, so no truncate (a journal commit on ext4): a
    token has at most 19 digits."""
    newer = 0
    with lead.lock:
        if lead.abandoned:
            fd = -1
        else:
            lead.locked = True
            fd = lead.fd
            if fd >= 0:
                with contextlib.suppress(OSError, ValueError):
                    newer = int(os.pread(fd, 20, 0) or b"0")
                if newer <= lead.token or newer >= fs.TOKEN_LIMIT:
                    newer = 0
                    with contextlib.suppress(OSError):
                        os.pwrite(fd, b"%-20d\n" % lead.token, 0)
    if fd < 0:
        lead.release()
        return None
    return newer


def write_token(lead: DirectoryLead, token: int) -> None:
    """A retry of ``lead`` took ``token``: the key's file names it if the lock is held
    (ADR 0028: a flight of the key led meanwhile has an older token than this attempt's,
    and must see it when it gets the lock)."""
    with lead.lock:
        if lead.locked and lead.fd >= 0:
            with contextlib.suppress(OSError):
                os.pwrite(lead.fd, b"%-20d\n" % token, 0)


def abandon(lead: DirectoryLead) -> bool:
    """Give up a lead still waiting for its key lock (its fd is closed: the lock,
    if the waiting thread gets it, goes with the file). True if it was waiting."""
    with lead.lock:
        if lead.locked:
            return False
        lead.abandoned = True
    lead.release()
    return True


class KeyLocks:
    """How a group's calls take the lead: the key lock taken (or waited for by a
    :class:`LockWaiter`), the lead published in the group's tables in one step with a
    reconnect's resends, and its driver told (``Lead``), or the lead given back.
    ``lose`` loses a lead's lease (Leases.lose)."""

    __slots__ = ("lose", "state")

    def __init__(self, state: GroupState, lose: Callable[[DirectoryLead, str], None]) -> None:
        self.state = state
        self.lose = lose

    def take(self, call: Call, fd: int | None, token: int) -> None:
        """Take ``call``'s key lock (opening its file unless ``fd`` is open) and tell
        its driver it leads. Runs on the background loop or in the caller's thread."""
        state = self.state
        try:
            fd, copy = lock_or_copy(state.directory, call, fd)
        except OSError as exc:
            state.calls.pop(call.id, None)
            state.send(wire.cancel_frame(call.id))
            drop_fd(call)
            call.inbox.put(Refused(exc))
            return
        # The descriptor is used here only before the lead is published: once it is,
        # close() or a withdrawal may close it (and its number be reused) at any time.
        lead = DirectoryLead(call, token, fd)
        # In one step for a reconnect (which reasserts what _leads holds and sends the
        # runs of calls with no lead): between the two, it would do neither. A call
        # failed meanwhile (the group closes, the scope gave up) has nobody to run its
        # work: published, its key lock would be held for ever.
        with state.send_lock:
            published = not state.closing and state.calls.get(call.id) is call
            if published:
                call.lead = lead
                state.leads[call.id] = lead
            refused = call.refused
        if published and refused is not None:
            # Refused while it was pending (a newer flight of the key runs): its work
            # must not run as if it held the lease, under a token older than that flight's.
            self.lose(lead, refused)
        if not published:
            call.pending = None
            if copy >= 0:
                os.close(copy)
            lead.release()
            state.send(wire.cancel_frame(call.id))
            return
        if copy >= 0:  # held for now: a thread waits for it
            LockWaiter(
                state.directory, lead, copy, self._locked,
                lambda lead, exc: state.background.post(self._failed, lead, exc),
            ).start()
            return
        self._locked(lead)

    def _locked(self, lead: DirectoryLead) -> None:
        """``lead`` holds its key lock: its work may start, unless a newer flight of
        the key held the lock first (then it is lost before its work starts: the work
        hears it when it binds)."""
        newer = claim(lead)
        if newer is None:  # closed or withdrawn while it waited for the lock
            return
        if newer:
            self.lose(
                lead, f"a newer flight of the key (token {newer}) held its key lock first"
            )
        lead.call.inbox.put(Lead(lead.token))

    def _failed(self, lead: DirectoryLead, exc: Exception) -> None:
        """(On the loop) ``lead``'s key lock could not be had: the lead is given back."""
        state, call = self.state, lead.call
        state.leads.pop(call.id, None)
        if state.calls.pop(call.id, None) is not None:
            state.send(wire.cancel_frame(call.id))
            drop_fd(call)
            call.inbox.put(Refused(exc))
