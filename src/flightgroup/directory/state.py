"""What the parts of one directory group share: its settings, its tables of calls and
leads, its channel to the coordinator, and the flags of its life (:class:`GroupState`).

The arbiter (:mod:`.client`) makes one and hands it to each part it builds on
(:mod:`.election`, :mod:`.connection`, :mod:`.keylocks`, :mod:`.leases`, :mod:`.answers`,
:mod:`.outage`, :mod:`.closing`), with the few calls of another part each one needs:
no part reaches into another's private state.

Field ownership: the tables and the flags are touched only on the group's background
loop, except under ``send_lock`` (a caller's thread registers its call and sends its run
request; see :mod:`.calls` for the fields of a call and a lead).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from .._forksafe import renew_after_fork
from ..scope.events import ScopeEvent
from ..scope.loop import BackgroundLoop
from .calls import Call, DirectoryLead
from .keylocks import drop_fd

if TYPE_CHECKING:
    from .channel import Channel
    from .coordinator import Coordinator

__all__ = ["GroupState", "finish"]


class GroupState:
    """One directory group's shared state (see the module)."""

    def __init__(
        self,
        directory: str,
        background: BackgroundLoop,
        *,
        max_frame: int,
        reconnect_timeout: float,
        rejoin_window: float,
    ) -> None:
        self.directory = os.path.abspath(directory)
        self.max_frame = max_frame
        self.reconnect_timeout = reconnect_timeout
        self.rejoin_window = rejoin_window
        # The group's thread; its lock also orders close() with a start.
        self.background = background
        # Guards the channel, call registration and ``Call.sent`` (callers send their
        # own run requests from their threads; the loop resends after a reconnect).
        self.send_lock = threading.Lock()
        # Orders a won election's epoch write with close(): the process never ends mid-write.
        self.campaign_lock = threading.Lock()
        self.next_id = 0
        self.calls: dict[int, Call] = {}
        self.leads: dict[int, DirectoryLead] = {}
        self.channel: Channel | None = None
        self.connected_now = threading.Event()  # set while a channel is up
        # Requests answered to a thread that waits (status, forget): id -> its future.
        self.waiters: dict[int, Future[Any]] = {}
        # Wakes the connection's keeper (a call made while disconnected, a new term).
        self.kick: asyncio.Event | None = None
        self.coordinator: Coordinator | None = None  # while this group holds the election
        self.fatal: BaseException | None = None  # every call raises it (bad directory)
        # This process's last election failed (the epoch could not be written or told,
        # the socket not served): while no coordinator is connected, calls raise it at
        # once (it says what to fix); the election is tried again, and the first
        # connection to a coordinator clears it.
        self.election_error: BaseException | None = None
        self.refusal: BaseException | None = None  # new calls raise it (another version)
        self.closing = False
        self.finishing = False  # closing no longer waits for acks: the connection ends
        self.given_up = False  # no coordinator for reconnect_timeout: calls fail fast
        self.down_since = 0.0  # time.monotonic() when the outage that gave up began
        # Held by another thread at a fork, a copied lock would stay held in the child.
        renew_after_fork(self, "send_lock")
        renew_after_fork(self, "campaign_lock")

    def send(self, frame: bytes) -> None:
        """Write ``frame`` on the channel, if one is up (any thread)."""
        channel = self.channel
        if channel is not None:
            channel.send(frame)

    def take_unled(self, only: Callable[[Call], bool] | None = None) -> list[Call]:
        """Remove the calls that lead nothing (and pass ``only``); under the send lock,
        so that none of them is published as a lead meanwhile (see KeyLocks.take)."""
        with self.send_lock:
            calls = [
                call for call in self.calls.values()
                if call.lead is None and (only is None or only(call))
            ]
            for call in calls:
                del self.calls[call.id]
        return calls

    def kick_now(self) -> None:
        """(On the loop) wake the connection's keeper: try to connect now."""
        if self.kick is not None:
            self.kick.set()


def finish(call: Call, event: ScopeEvent) -> None:
    """The call ends without leading: tell its driver."""
    drop_fd(call)
    call.inbox.put(event)
