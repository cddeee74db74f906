"""The coordinator's answers to a directory group, on its background loop: each one
routed to the call, lead or waiting thread it names (:class:`Answers`).

A ``lead`` takes the key lock (:mod:`.keylocks`) or waits for the caller still opening
the key's file; ``joined``, ``landed`` and ``interrupted`` reach a call's driver; the
acks and ``taken`` move a landing on (:mod:`.leases`); a ``rejected`` reassert or an
error loses a lead; an answer over this group's ``max_frame_bytes`` fails only its
request.
"""

from __future__ import annotations

from typing import Any

from .._log import DigestOf, log
from ..errors import FlightInterruptedError, ValueTooLargeError
from ..scope.events import Joined, Landed, NoOutcome, Refused
from . import keylocks, wire
from .calls import heard
from .channel import Frames
from .keylocks import KeyLocks
from .leases import Leases
from .state import GroupState, finish

__all__ = ["Answers"]


class Answers:
    """What a group does with each answer (see the module); on the group's loop."""

    def __init__(self, state: GroupState, *, leases: Leases, key_locks: KeyLocks) -> None:
        self.state = state
        self.leases = leases
        self.key_locks = key_locks

    def on_frames(self, frames: Frames) -> None:
        """The frames a channel read, in order."""
        for header, payload in frames:
            if header["op"] == wire.SKIPPED:
                self.skipped(header)
                continue
            try:
                answer = wire.parse_answer_frame(header, payload)
            except wire.WireError as exc:
                channel = self.state.channel
                if channel is not None:
                    channel._lost(f"a bad answer: {exc}")
                return
            self.answer(answer)

    def skipped(self, header: dict[str, Any]) -> None:
        """An answer over this group's max_frame_bytes was skipped: its request fails
        (a joiner's call with ValueTooLargeError), and nothing else."""
        state = self.state
        id, size, limit = header["id"], header["size"], state.max_frame
        log.warning("%s: the coordinator's %r answer (%d bytes) is over this group's "
                    "max_frame_bytes (%d)", state.directory, header["of"], size, limit)
        call = state.calls.get(id) if id is not None else None
        if call is not None and call.lead is None:
            del state.calls[id]
            finish(call, Refused(ValueTooLargeError(call.key, size, limit)))
            return
        waiter = state.waiters.pop(id, None) if id is not None else None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ValueError(
                f"the coordinator's answer ({size} bytes) is over this group's "
                f"max_frame_bytes ({limit})"
            ))

    def answer(self, answer: wire.Answer) -> None:
        """Route one answer."""
        state = self.state
        if isinstance(answer, wire.Lead):
            self.on_lead(answer.id, answer.token)
        elif isinstance(answer, wire.Joined):
            self._on_joined(answer)
        elif isinstance(answer, wire.Landed):
            call = state.calls.pop(answer.id, None)
            if call is not None:
                keylocks.drop_fd(call)
                call.inbox.put(Landed(answer.token, answer.outcome, answer.kept))
        elif isinstance(answer, wire.InterruptedAnswer):
            call = state.calls.pop(answer.id, None)
            if call is not None:
                finish(call, NoOutcome(answer.reason))
        elif isinstance(answer, wire.Detached):
            call = state.calls.get(answer.id)
            if call is not None:
                log.debug("%s %s: its flight was detached", state.directory,
                          DigestOf(call.key))
                call.detached()
        elif isinstance(answer, wire.Taken):
            lead = state.leads.get(answer.id)
            if lead is not None and lead.landing is not None:
                self.leases.taken(lead)
        elif isinstance(answer, wire.Ack) and answer.id in state.waiters:
            state.waiters.pop(answer.id).set_result(None)  # a forget was done
        elif isinstance(answer, wire.Ack):
            lead = state.leads.get(answer.id)
            if lead is not None and lead.landing is not None:
                self.leases.acked(lead)
        elif isinstance(answer, wire.Rejected):
            self._on_rejected(answer)
        elif isinstance(answer, wire.StatusAnswer):
            waiter = state.waiters.pop(answer.id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(answer.flights)
        elif isinstance(answer, wire.ErrorAnswer):
            self._on_error(answer)

    def _on_joined(self, answer: wire.Joined) -> None:
        call = self.state.calls.get(answer.id)
        if call is None or call.lead is not None:
            return
        keylocks.drop_fd(call)
        first = not call.joined
        if not first and answer.token != call.token:  # its flight retried
            call.earlier = heard(call.earlier, call.token, answer.token)
        call.joined, call.token = True, answer.token
        if first:
            log.debug("%s %s: join, token %d (leader pid %d)", self.state.directory,
                      DigestOf(call.key), answer.token, answer.pid)
            call.inbox.put(Joined(answer.token, answer.pid, answer.age))

    def _on_rejected(self, answer: wire.Rejected) -> None:
        state = self.state
        with state.send_lock:  # in one step with KeyLocks.take's publishing
            lead = state.leads.get(answer.id)
            call = state.calls.get(answer.id) if lead is None else None
            if call is not None and call.lead is None:
                # A lead told while its caller opened the key's file, reasserted
                # (see connection.resend) and refused: it is lost as soon as it is taken.
                call.refused = answer.reason
        if lead is not None and lead.cut:
            # Its group closed and its interrupted landing names a token the flight
            # no longer has (a retry moved it): nothing to resend. Its joiners hear
            # when this connection closes.
            with lead.lock:
                lead.acked = True
            self.leases.end(lead)
        elif lead is not None:
            self.leases.lose(lead, answer.reason)

    def _on_error(self, answer: wire.ErrorAnswer) -> None:
        state = self.state
        log.warning("the coordinator of %s did not understand: %s", state.directory,
                    answer.message)
        if answer.limit is not None:
            self.leases.over_limit(answer.limit)
        call = state.calls.pop(answer.id, None) if answer.id is not None else None
        if call is None:
            return
        if call.lead is not None:
            self.leases.lose(call.lead, answer.message)
        else:
            error = FlightInterruptedError(call.key, f"the coordinator said: {answer.message}")
            finish(call, Refused(error))

    def on_lead(self, id: int, token: int) -> None:
        """The coordinator made call ``id`` the leader under ``token`` (or gave its
        lead a retry's new token)."""
        state = self.state
        call = state.calls.get(id)
        if call is None:  # withdrawn meanwhile: give the flight back
            state.send(wire.cancel_frame(id))
            return
        log.debug("%s %s: lead, token %d", state.directory, DigestOf(call.key), token)
        lead = call.lead
        if lead is not None:  # a new token for a retry
            self.leases.new_token(lead, token)
            return
        with call.lock:
            fd = call.fd
            if fd == keylocks.OPENING:
                # The caller is still creating the key's file: it takes the lead when
                # its open returns (in its own thread: no hop back to it, no second
                # create racing the first on the directory).
                call.pending = token
                return
            call.fd = -1
        self.key_locks.take(call, fd, token)
