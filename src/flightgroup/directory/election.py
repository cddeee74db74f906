"""The election: which process of a directory group coordinates it, and in which epoch.

Design note.

*What it builds on.* The kernel's ``flock`` on ``flight.lock``: every group of every
process campaigns with a thread blocked in ``flock(LOCK_EX)``; the kernel hands the lock
to one of them when the coordinator closes or dies, so a new coordinator serves as soon
as the lock is free, with no polling and no lease to renew (ADR 0010). The winner writes
the next epoch durably before it serves (:func:`epochs.next_epoch`, two copies, ADR 0009), so
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
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._log import log
from . import epochs, fs
from .coordinator import Coordinator

if TYPE_CHECKING:
    from .state import GroupState

__all__ = ["Election", "campaign_for", "park"]

# s: after this process won the election and could not serve (the epoch, the socket),
# it campaigns again this much later (each process does: at most one try a second each).
_ELECTION_RETRY = 1.0


class Election:
    """One group's part in the election of its directory: its campaign (see
    :class:`_Campaign`), what it does once the campaign won (write the epoch, serve),
    and when it could not serve.

    A won term's coordinator becomes the group's ``state.coordinator``, and a failure
    its ``state.election_error``, which its calls raise while no coordinator is
    connected; ``fail_all`` fails the calls that wait for a coordinator then."""

    __slots__ = ("campaigner", "fail_all", "state")

    def __init__(self, state: GroupState, fail_all: Callable[[BaseException], None]) -> None:
        self.state = state
        self.fail_all = fail_all
        self.campaigner: _Campaign | None = None  # its election thread's state

    def campaign(self) -> None:
        """The election thread of this group (see _Campaign)."""
        campaign = self.campaigner
        assert campaign is not None
        campaign.run()

    def won(self, fd: int) -> None:
        """(The election thread) the group holds ``fd``'s lock on ``flight.lock``:
        write the next epoch and serve (on the background loop)."""
        state = self.state
        try:
            # close() takes this lock too: it never lets the process end mid-write.
            with state.campaign_lock:
                if state.closing:
                    raise _Resign()
                epoch = epochs.next_epoch(state.directory)
        except _Resign:
            os.close(fd)
            return
        except Exception as exc:
            os.close(fd)  # the next process may fare better: let it try
            self.failed(exc)
            return
        if not state.background.post(self._serve, epoch, fd):
            os.close(fd)

    def failed(self, exc: BaseException) -> None:
        """(Any thread) this process won the election and could not serve: its calls
        that wait for a coordinator fail with ``exc``, and it campaigns again after a
        pause, so that a directory repaired (the epoch written by hand, the disk freed)
        is served again without restarting every process that uses it."""
        state = self.state
        again = state.election_error is not None and repr(state.election_error) == repr(exc)
        (log.debug if again else log.error)(
            "cannot coordinate %s: %s (trying again every %g s)",
            state.directory, exc, _ELECTION_RETRY,
        )
        with state.send_lock:  # see submit(): its second check is under this lock too
            state.election_error = exc
        state.background.post(self.fail_all, exc)
        self.retry()

    def retry(self) -> None:
        """(Any thread) campaign again after _ELECTION_RETRY, unless closing."""
        state = self.state

        def campaign() -> None:
            if not state.closing:
                campaign_for(self)

        loop = state.background.loop
        if loop is not None and not state.closing:
            state.background.post(loop.call_later, _ELECTION_RETRY, campaign)

    def _serve(self, epoch: int, fd: int) -> None:
        """(On the background loop) serve the term ``epoch`` under ``fd``'s lock."""
        state = self.state
        if state.closing:
            os.close(fd)
            return
        coordinator = Coordinator(
            state.directory, epoch, fd, max_frame=state.max_frame,
            rejoin_window=state.rejoin_window,
        )

        async def start() -> None:
            try:
                await coordinator.start()
            except Exception as exc:
                await coordinator.close()  # its lock too: the next process may serve
                self.failed(exc)
                return
            state.coordinator = coordinator
            if state.closing:
                await coordinator.close()
                return
            assert state.kick is not None
            state.kick.set()

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

    def __init__(self, owner: Election) -> None:
        self.owner = owner
        self.done = False  # it no longer waits (it won, or could not wait): never parked

    def run(self) -> None:
        directory = self.owner.state.directory
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
                owner.retry()
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
        owner.won(fd)


# directory -> the campaigns of closed groups, still blocked (see _Campaign)
_parked: dict[str, list[_Campaign]] = {}
_parked_lock = threading.Lock()


def campaign_for(election: Election) -> None:
    """Give ``election`` a parked campaign of its directory, or start a new one."""
    directory = election.state.directory
    with _parked_lock:
        parked = _parked.get(directory)
        if parked:
            campaign = election.campaigner = parked.pop()
            if not parked:
                del _parked[directory]
            campaign.owner = election
            return
    election.campaigner = _Campaign(election)
    threading.Thread(target=election.campaign, name="flightgroup-election", daemon=True).start()


def park(closing: Election) -> None:
    """``closing``'s group closes: its campaign, if still blocked, waits for a new owner."""
    campaign = closing.campaigner
    if campaign is None:
        return
    with _parked_lock:
        if campaign.done or campaign.owner is not closing:
            return
        _parked.setdefault(closing.state.directory, []).append(campaign)


def _after_fork() -> None:
    """(In a forked child) the parked campaigns' threads were not copied: no group here
    adopts one (a started group's own let-go is ``DirectoryArbiter._forked``)."""
    global _parked_lock
    _parked.clear()
    _parked_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
