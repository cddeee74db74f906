"""What the directory's client keeps of each call and each lead: :class:`Call`, one local
flight's request to the directory, and :class:`DirectoryLead`, a flight this process leads
(its key lock, its landing until acknowledged).

Field ownership: ``Call`` and ``DirectoryLead`` objects are touched only on the group's
background loop, except ``Call.fd``/``Call.pending`` (guarded by ``Call.lock``: the
caller's thread opens the key's file ahead) and ``DirectoryLead.fd``/``attempt`` and the
flags the work's thread sets (guarded by ``DirectoryLead.lock``: a work ends on its own
thread, possibly after close).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from ..scope.events import Inbox
from ..scope.interface import DetachedNotice, Handed, LeadState
from . import wire

__all__ = ["Call", "DirectoryLead", "heard"]


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
        # The key lock file, opened ahead by the caller: None until then, keylocks.OPENING while
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
        "abandoned", "acked", "call", "cut", "done", "earlier", "fd", "landing", "landing_end",
        "locked", "maybe_landed", "retrying", "token",
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
        # Told what became of the landing (Scope.land's ``done``), once: when a
        # coordinator acknowledged it, or when the lease is lost (see Leases.tell). The
        # flight settles in this process only then, so its leader never returns a value
        # that nothing landed.
        self.done: Callable[[Handed], None] | None = None
        # where the landing ends in the current connection's stream (Channel.send)
        self.landing_end = -1
        # The socket of a coordinator that is gone took the landing, unacknowledged: it
        # may have reached joiners, so a lease lost since is not told as "nothing landed".
        self.maybe_landed = False
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


def heard(earlier: tuple[int, ...], old: int, new: int) -> tuple[int, ...]:
    """A flight's token went from ``old`` to ``new``: the earlier tokens then, oldest
    first (``old`` last, ``new`` never: a coordinator that heard of no later token may
    hand back one it had), the latest ``wire.MAX_EARLIER``."""
    kept = [t for t in earlier if t != old and t != new]
    if old != new:
        kept.append(old)
    return tuple(kept[-wire.MAX_EARLIER :])
