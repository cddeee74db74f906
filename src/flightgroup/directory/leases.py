"""A lead's lease on the client side, from its first token to the release of its key
lock: a retry's new token, the lease lost (the work told, the flight taken off its key
here), the landing handed to the coordinator (within the frame limit) and kept for a
resend until acknowledged, and the end that frees the key lock once the work ended and
the flight needs nothing more (ADR 0010, 0028).

Two sides end a lead, each after it set its own flag under ``DirectoryLead.lock``: the
work's thread (``work_done``, when it lands or its last straggler ends) and the group's
loop (``acked`` or ``lost``), so that one of them sees both (:meth:`Leases.end`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._log import DigestOf, log
from ..errors import UnavailableError
from ..scope.events import Lead, LeaseLost, Refused
from ..scope.interface import Handed
from ..scope.outcome import SharedOutcome
from . import keylocks, wire
from .calls import Call, DirectoryLead, heard
from .connection import key_too_long, landing_frame, request_size, too_large_landing
from .keylocks import drop_fd

if TYPE_CHECKING:
    from .state import GroupState

__all__ = ["Leases"]


class Leases:
    """The leases of a group's leads (see the module). Every method but ``land`` runs
    on the group's loop. ``check_closed`` (on the loop) lets a closing group finish
    once a work ended (Closing.check_closed)."""

    __slots__ = ("check_closed", "state")

    def __init__(self, state: GroupState, check_closed: Callable[[], None]) -> None:
        self.state = state
        self.check_closed = check_closed

    def new_token(self, lead: DirectoryLead, token: int) -> None:
        """The coordinator answered a retry's ``attempt``: the lead's next attempt runs
        under ``token`` (unless the lease was lost meanwhile)."""
        if lead.retrying and not lead.lost:
            lead.retrying = False
            lead.earlier = heard(lead.earlier, lead.token, token)
            lead.token = token
            keylocks.write_token(lead, token)  # ADR 0028
            lead.call.inbox.put(Lead(token))

    def over_limit(self, limit: int) -> None:
        """The coordinator refused a frame over its ``max_frame_bytes`` (a group of
        another configuration coordinates): a landing that big would be refused again
        on every reconnect, and its key held for ever. It lands as interrupted instead;
        the joiners hear why (the leader has its value already)."""
        state = self.state
        for lead in list(state.leads.values()):
            landing = lead.landing
            if landing is not None and not lead.acked and len(landing) - 4 > limit:
                lead.landing = too_large_landing(lead, len(landing) - 4, limit, "the coordinator's")
        for call in list(state.calls.values()):  # requests that can never be read: the key
            if request_size(call.key) > limit:
                if call.lead is None:
                    state.calls.pop(call.id, None)
                    drop_fd(call)
                    call.inbox.put(Refused(key_too_long(call.key, limit)))
                elif not call.lead.acked:  # its reassert would be refused for ever
                    self.lose(call.lead, str(key_too_long(call.key, limit)))

    def lose(self, lead: DirectoryLead, reason: str, *, unreachable: bool = False) -> None:
        """The lease is lost: the work hears it, the flight leaves its key here, a
        retry waiting for its token hears LeaseLost; the key lock goes once the work
        ended. ``unreachable``: no coordinator could be reached."""
        if lead.lost or lead.acked:
            return
        log.warning("lost the lease of a flight of %s (token %d): %s",
                    DigestOf(lead.call.key), lead.token, reason)
        lead.lose(unreachable=unreachable)
        self.tell(lead, self._not_landed(lead, reason))
        # No longer the key's flight in the scope: it leaves the local table as a
        # forget() would take it, so a new call of the key here asks the coordinator
        # (and waits for the key lock this work holds) instead of joining a flight that
        # can only end interrupted. Its callers stay with it.
        lead.call.detached()
        if lead.retrying:
            lead.retrying = False
            lead.call.inbox.put(LeaseLost(reason))
        self.end(lead)

    def end(self, lead: DirectoryLead) -> None:
        """Free the key lock once the work ended and the flight needs nothing more.
        Called by each side after it set its flag (work_done in the work's thread,
        acked or lost here), so one of them sees both."""
        state = self.state
        with lead.lock:
            if not (lead.work_done and (lead.acked or lead.lost or state.closing)):
                return
        state.leads.pop(lead.call.id, None)
        state.calls.pop(lead.call.id, None)
        lead.release()
        if not lead.acked:  # the group closed before a coordinator took the landing
            self.unconfirmed(lead)

    def acked(self, lead: DirectoryLead) -> None:
        """(On the loop) a coordinator acknowledged ``lead``'s landing: it took it, so
        the key lock may go (first: the key's next flight waits for it), and the flight
        settles here with its outcome."""
        with lead.lock:
            lead.acked = True
        self.end(lead)
        self.tell(lead, Handed())

    def taken(self, lead: DirectoryLead) -> None:
        """(On the loop) the coordinator read ``lead``'s landing and its ack waits for
        the joiners: the flight settles here now (the key lock waits for the ack)."""
        self.tell(lead, Handed())

    def unconfirmed(self, lead: DirectoryLead) -> None:
        """The group closed while ``lead``'s landing waited for its ack: it went out, so
        it may land, but no coordinator said so."""
        self.tell(lead, Handed(fenced=True, unconfirmed=UnavailableError(
            f"no coordinator of {self.state.directory!r} acknowledged the landing before "
            "the group closed, so its joiners may have its outcome"
        )))

    @staticmethod
    def tell(lead: DirectoryLead, handed: Handed) -> None:
        """Tell the flight's driver what became of the landing (once)."""
        with lead.lock:
            done, lead.done = lead.done, None
        if done is not None:
            done(handed)

    def _not_landed(self, lead: DirectoryLead, reason: str) -> Handed:
        """What a lost lease makes of a landing not acknowledged: nothing landed
        (LeaseLostError), unless a coordinator that is gone may have taken it."""
        if not lead.maybe_landed:
            return Handed(fenced=True)
        return Handed(fenced=True, unconfirmed=UnavailableError(
            f"the lease was lost ({reason}) after a coordinator of "
            f"{self.state.directory!r} that went away took the landing unacknowledged, "
            "so its joiners may have its outcome"
        ))

    def retry(self, call: Call) -> None:
        """(On the loop) ask a new token for the lead's next attempt."""
        state = self.state
        lead = call.lead
        assert lead is not None
        if lead.lost or state.closing:
            call.inbox.put(LeaseLost("the group closed" if state.closing else "lost"))
            return
        lead.retrying = True
        state.send(wire.attempt_frame(call.id))
        # Disconnected: the reassert on the next connection keeps the lead; the
        # retry asks again then (see connection.resend), or the lease is lost.

    def land(
        self,
        call: Call,
        outcome: SharedOutcome | None,
        *,
        stragglers: list[threading.Event] | None = None,
        done: Callable[[Handed], None] | None = None,
    ) -> None:
        """(The work's thread) hand ``call``'s ``outcome`` over; the contract is
        DirectoryArbiter.land's."""
        lead = call.lead
        assert lead is not None
        running = [ended for ended in stragglers or () if not ended.is_set()]
        if running:
            waiter = threading.Thread(
                target=self._after_stragglers, args=(call, running),
                name="flightgroup-straggler", daemon=True,
            )
            self._send_landing(call, lead, outcome, work_done=False, done=done)
            waiter.start()
        else:
            self._send_landing(call, lead, outcome, work_done=True, done=done)

    def _after_stragglers(self, call: Call, running: list[threading.Event]) -> None:
        state = self.state
        for ended in running:
            ended.wait()
        lead = call.lead
        assert lead is not None
        with lead.lock:
            lead.work_done = True
        self.end(lead)
        if state.closing:
            state.background.post(self.check_closed)

    def _send_landing(
        self,
        call: Call,
        lead: DirectoryLead,
        outcome: SharedOutcome | None,
        *,
        work_done: bool,
        done: Callable[[Handed], None] | None,
    ) -> None:
        state = self.state
        frame = None
        if outcome is not None and not lead.lost:
            frame = landing_frame(call, lead, outcome, state.max_frame)  # outside the locks
        with state.send_lock:  # in order with a reconnect's resends
            with lead.lock:
                lead.work_done = work_done
                if frame is not None and not lead.lost:
                    lead.landing = frame
                    # Told on the ack (or the loss), never before: the ack is awaited
                    # anyway (the key lock waits for it), and a landing only queued
                    # here may never reach a coordinator.
                    lead.done = done
                else:
                    frame = None
            channel = state.channel
            if frame is not None and channel is not None:
                lead.landing_end = channel.send(frame)
        log.debug("%s %s: land, token %d (%s)", state.directory, DigestOf(call.key),
                  lead.token, "sent" if frame is not None else "lost, nothing to land")
        if frame is None and done is not None:  # the lease was lost: nothing lands
            done(Handed(fenced=True))
        self.end(lead)
        if state.closing:
            state.background.post(self.check_closed)
