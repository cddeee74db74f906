"""How a directory group closes (:class:`Closing`): its calls that lead nothing fail,
its leads still waiting for a key lock never start, its running works' joiners hear an
interrupted landing, every landing made here waits (at most ``reconnect_timeout``) for
its ack, and then the connection, the coordinator this group runs, and its loop end.

Works still running keep their key locks until they end (:meth:`.leases.Leases.land`
frees them then): the key never runs twice at once, even past its group's close.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import Future

from ..errors import GroupClosedError
from ..scope.events import LeaseLost, Refused
from ..scope.outcome import Interrupted
from . import keylocks, wire
from .election import Election, park
from .leases import Leases
from .state import GroupState, finish

__all__ = ["Closing"]


class Closing:
    """The close of one group (see the module). ``run`` runs in the closing thread;
    the rest on the group's loop."""

    def __init__(self, state: GroupState, *, leases: Leases, election: Election) -> None:
        self.state = state
        self.leases = leases
        self.election = election
        # The connection's keeper (set when the group starts), held so that closing
        # ends it (its wait on a channel that flush_and_close() shut is never answered)
        # rather than leave it pending.
        self.maintainer: asyncio.Task[None] | None = None
        self.closed: Future[None] = Future()  # set once the loop has nothing left to close
        self.close_by = 0.0  # closing waits for acks until then

    def run(self) -> None:
        """(The closing thread, once) close and wait until it is done."""
        state = self.state
        with state.campaign_lock:  # a won election finishes its epoch write first
            pass
        park(self.election)
        if not state.background.post(self.begin_close):
            return  # never started (or a forked child's copy): nothing runs to close
        with contextlib.suppress(Exception):
            self.closed.result(state.reconnect_timeout + 5)
        state.background.stop()

    def begin_close(self) -> None:
        """(On the loop) end what closing ends at once; wait for the acks."""
        state = self.state
        for call in state.take_unled():
            if call.sent:
                # As a withdrawal does: left out, a coordinator that has not read the
                # run yet would make this dead call a leader, and other processes' calls
                # would join a flight nobody runs until this connection goes.
                state.send(wire.cancel_frame(call.id))
            finish(call, Refused(GroupClosedError()))
        for lead in list(state.leads.values()):
            if keylocks.abandon(lead):  # still waiting for its key lock: it never starts
                state.leads.pop(lead.call.id, None)
                state.calls.pop(lead.call.id, None)
                finish(lead.call, Refused(GroupClosedError()))
                lead.landing = wire.land_frame(
                    lead.call.id, lead.token, Interrupted("its leader's group closed")
                )
                state.send(lead.landing)
                continue
            if lead.retrying:  # between attempts: the next one never starts
                lead.retrying = False
                lead.call.inbox.put(LeaseLost("the group closed"))
            if lead.lose(only_running=True):
                # The group closed: its outcome will not be delivered. Its joiners
                # elsewhere are told now (an interrupted landing), not when a later
                # coordinator finds its key lock free; the lock stays held until the
                # work ends (land() frees it then).
                lead.cut = True
                lead.landing = wire.land_frame(
                    lead.call.id, lead.token, Interrupted("its leader's group closed")
                )
                state.send(lead.landing)
        self.close_by = time.monotonic() + state.reconnect_timeout
        self.check_closed()

    def check_closed(self) -> None:
        """(On the loop) finish closing once no landing waits for an ack (or time is up)."""
        state = self.state
        waiting = [lead for lead in list(state.leads.values()) if lead.landing and not lead.acked]
        if waiting and time.monotonic() < self.close_by and not state.given_up:
            asyncio.get_running_loop().call_later(0.01, self.check_closed)
            return
        if state.finishing:
            return
        state.finishing = True
        for lead in list(state.leads.values()):
            if lead.landing is not None and not lead.acked:
                self.leases.unconfirmed(lead)
            if lead.work_done:
                state.leads.pop(lead.call.id, None)
                lead.release()
            # a running work keeps its key lock until it ends (land() frees it)
        with state.send_lock:
            channel, state.channel = state.channel, None
            state.connected_now.clear()
        for id, waiter in list(state.waiters.items()):  # a forget or status asked meanwhile
            del state.waiters[id]
            if not waiter.done():
                waiter.set_exception(GroupClosedError())
        if channel is not None:
            channel.flush_and_close()
        state.kick_now()
        asyncio.get_running_loop().create_task(self._finish())

    async def _finish(self) -> None:
        if self.maintainer is not None:
            self.maintainer.cancel()
        if self.state.coordinator is not None:
            await self.state.coordinator.close()
        self.closed.set_result(None)
