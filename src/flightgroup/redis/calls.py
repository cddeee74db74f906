"""What the fleet arbiter keeps of one local flight's request (:class:`FleetCall`) and,
while this process leads it, of its lead (:class:`FleetLead`).

Field ownership: their fields are written on the group's loop, except
``FleetLead.attempt``/``lost``/``work_done``, guarded by its lock (a work ends on its
own thread), and ``FleetCall.reader``, written on the call's own loop while it reads
its flight's outcome there (delivery.read_here).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from ..scope.events import Inbox
from ..scope.interface import DetachedNotice, LeadState

__all__ = ["FleetCall", "FleetLead"]


class FleetCall(DetachedNotice):
    """One local flight's request to the namespace (``on_detached``: a FORGET elsewhere
    parked the flight it leads or joined)."""

    __slots__ = (
        "after", "fresh", "inbox", "key", "lead", "loop", "nonce", "reader", "reading",
        "task", "withdrawn",
    )

    def __init__(
        self,
        key: str,
        fresh: bool,
        after: int | None = None,
        on_detached: Callable[[], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(on_detached)
        self.key = key
        self.fresh = fresh
        self.after = after
        # The loop its driver waits on, where a join's outcome is read (None: a thread,
        # or a Cluster: read on the group's loop).
        self.loop = loop
        self.reader: asyncio.Task[Any] | None = None  # the task reading it there
        self.inbox = Inbox()
        self.nonce = uuid.uuid4().hex  # makes a re-sent ACQUIRE find its own flight
        self.lead: FleetLead | None = None
        self.task: asyncio.Task[None] | None = None
        self.reading = False  # only a read may be cancelled: a script may have run
        self.withdrawn = False


class FleetLead(LeadState):
    """A flight this process leads: its token, its lease, its landing."""

    __slots__ = ("call", "landing", "moves", "renewed_at", "token")

    def __init__(self, call: FleetCall, token: int, renewed_at: float) -> None:
        super().__init__()
        self.call = call
        self.token = token
        # ATTEMPTs sent plus ATTEMPTs heard: odd while one is in flight. A renewal that
        # crossed one answers for a token Redis may have moved on from: it must not count.
        self.moves = 0
        # When the last renewal that Redis took was sent: the record lives a lease past it.
        self.renewed_at = renewed_at
        self.landing: asyncio.Task[None] | None = None
