"""The election: which process of a directory group coordinates it, and in which epoch.

Design note.

*What it builds on.* The kernel's ``flock`` on ``flight.lock``: every group of every
process campaigns with a thread blocked in ``flock(LOCK_EX)``; the kernel hands the lock
to one of them when the coordinator closes or dies, so a new coordinator serves as soon
as the lock is free, with no polling and no lease to renew (ADR 0010). The winner writes
the next epoch durably before it serves (:func:`fs.next_epoch`, two copies, ADR 0009), so
every token of its term (``epoch << 32 | sequence``) is above every earlier one; then it
runs a :class:`~.coordinator.Coordinator` on its group's background loop.

*The trade-off.* Nothing wakes a blocked ``flock`` but the lock, so a group that closes
while another process coordinates cannot end its campaign. It parks it instead, and the
next group this process opens on the directory adopts it (ADR 0016): opening and closing
groups keeps at most as many campaigns (threads, descriptors of ``flight.lock``) as there
were groups open at once, never zero. Polling with ``LOCK_NB`` would end every thread at
the cost of the failover latency. A winner that cannot serve (the epoch cannot be
written, the socket not bound) resigns at once so that another process may fare better,
fails the calls that wait for a coordinator with the reason, and campaigns again
``_ELECTION_RETRY`` seconds later: a repaired directory is served again without
restarting every process.

*Open questions.* Adoption goes by the directory's absolute path: two spellings of one
directory (a symlink) do not share parked campaigns. A parked campaign's thread waits
until the coordinator goes or a group adopts it. A forked child drops the parked
campaigns (their threads were not copied; their descriptors are let go by
:mod:`.forked`, ADR 0014).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
from typing import TYPE_CHECKING

from .._log import log
from . import fs
from .coordinator import Coordinator

if TYPE_CHECKING:
    from .client import DirectoryArbiter

__all__ = ["Election", "campaign_for", "park"]

# s: after this process won the election and could not serve (the epoch, the socket),
# it campaigns again this much later (each process does: at most one try a second each).
_ELECTION_RETRY = 1.0


class Election:
    """One group's part in the election of its directory: what it does once its
    campaign won (write the epoch, serve), and when it could not serve.

    It acts on its group (``owner``): the group's ``_campaign_lock`` orders the epoch
    write with close(); a won term's coordinator becomes the group's ``_coordinator``,
    and a failure its ``_election_error``, which its calls raise while no coordinator
    is connected."""

    __slots__ = ("owner",)

    def __init__(self, owner: DirectoryArbiter) -> None:
        self.owner = owner

    def won(self, fd: int) -> None:
        """(The election thread) the group holds ``fd``'s lock on ``flight.lock``:
        write the next epoch and serve (on the background loop)."""
        owner = self.owner
        try:
            # close() takes this lock too: it never lets the process end mid-write.
            with owner._campaign_lock:
                if owner._closing:
                    raise _Resign()
                epoch = fs.next_epoch(owner.directory)
        except _Resign:
            os.close(fd)
            return
        except Exception as exc:
            os.close(fd)  # the next process may fare better: let it try
            self.failed(exc)
            return
        if not owner._background.post(self._serve, epoch, fd):
            os.close(fd)

    def failed(self, exc: BaseException) -> None:
        """(Any thread) this process won the election and could not serve: its calls
        that wait for a coordinator fail with ``exc``, and it campaigns again after a
        pause, so that a directory repaired (the epoch written by hand, the disk freed)
        is served again without restarting every process that uses it."""
        owner = self.owner
        again = owner._election_error is not None and repr(owner._election_error) == repr(exc)
        (log.debug if again else log.error)(
            "cannot coordinate %s: %s (trying again every %g s)",
            owner.directory, exc, _ELECTION_RETRY,
        )
        with owner._send_lock:  # see submit(): its second check is under this lock too
            owner._election_error = exc
        owner._background.post(owner._fail_all, exc)
        self.retry()

    def retry(self) -> None:
        """(Any thread) campaign again after _ELECTION_RETRY, unless closing."""
        owner = self.owner

        def campaign() -> None:
            if not owner._closing:
                campaign_for(owner)

        loop = owner._background.loop
        if loop is not None and not owner._closing:
            owner._background.post(loop.call_later, _ELECTION_RETRY, campaign)

    def _serve(self, epoch: int, fd: int) -> None:
        """(On the background loop) serve the term ``epoch`` under ``fd``'s lock."""
        owner = self.owner
        if owner._closing:
            os.close(fd)
            return
        coordinator = Coordinator(
            owner.directory, epoch, fd, max_frame=owner._max_frame,
            rejoin_window=owner._rejoin_window,
        )

        async def start() -> None:
            try:
                await coordinator.start()
            except Exception as exc:
                await coordinator.close()  # its lock too: the next process may serve
                self.failed(exc)
                return
            owner._coordinator = coordinator
            if owner._closing:
                await coordinator.close()
                return
            assert owner._kick is not None
            owner._kick.set()

        asyncio.get_running_loop().create_task(start())


class _Resign(Exception):
    """The group closed before its won campaign wrote the epoch."""


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
                owner._election.retry()
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
        owner._election.won(fd)


# directory -> the campaigns of closed groups, still blocked (see _Campaign)
_parked: dict[str, list[_Campaign]] = {}
_parked_lock = threading.Lock()


def campaign_for(arbiter: DirectoryArbiter) -> None:
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


def park(campaign: _Campaign, closing: DirectoryArbiter) -> None:
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
