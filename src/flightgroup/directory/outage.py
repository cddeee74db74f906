"""A directory group while no coordinator of its version answers (:class:`Outage`): a
coordinator of another version refuses it, its election failed, or nobody answered
for ``reconnect_timeout``; what its waiting calls become, and what a new call raises.

The connection keeps trying all along (as a probe: the first coordinator of our version
that answers ends the outage, see :mod:`.connection`).
"""

from __future__ import annotations

import time

from ..errors import ProtocolVersionError, UnavailableError, renewed
from ..scope.events import NoOutcome, Refused
from .leases import Leases
from .state import GroupState, finish

__all__ = ["Outage"]


class Outage:
    """What a group does when no coordinator of its version serves it (see the
    module); on the group's loop, but ``out_of_reach`` (any thread)."""

    __slots__ = ("leases", "state")

    def __init__(self, state: GroupState, leases: Leases) -> None:
        self.state = state
        self.leases = leases

    def refused(self, exc: ProtocolVersionError) -> None:
        """A coordinator of another version holds the election: new calls fail."""
        self.state.refusal = exc
        for call in self.state.take_unled(lambda call: not call.joined):
            finish(call, Refused(renewed(exc)))

    def give_up(self, down: float) -> None:
        """No coordinator of our version for ``down`` s (over ``reconnect_timeout``):
        every lease of this process is lost, and its joined calls are interrupted."""
        state = self.state
        if state.given_up:
            return
        state.down_since = time.monotonic() - down
        state.given_up = True
        # The calls that waited through the outage; one made while the leases are lost
        # below (their works wake, their callers go on) is not failed with them.
        waited = state.take_unled()
        for lead in list(state.leads.values()):
            self.leases.lose(lead, "no coordinator could be reached", unreachable=True)
        for call in waited:
            if call.joined:
                finish(call, NoOutcome("no coordinator could be reached"))
            else:
                error = state.refusal or UnavailableError(
                    f"no coordinator of {state.directory!r} answered for {down:.1f} s "
                    f"(reconnect_timeout={state.reconnect_timeout:g})"
                )
                finish(call, Refused(renewed(error)))

    def out_of_reach(self) -> BaseException:
        """What a new call raises while no coordinator of our version has answered for
        longer than ``reconnect_timeout``: the refusal of another version's, if one
        holds the election, else UnavailableError."""
        state = self.state
        if state.refusal is not None:
            return renewed(state.refusal)
        return UnavailableError(
            f"no coordinator of {state.directory!r} has answered for "
            f"{time.monotonic() - state.down_since:.1f} s "
            f"(reconnect_timeout={state.reconnect_timeout:g}); still trying"
        )

    def fail_all(self, exc: BaseException) -> None:
        """Every call that leads nothing fails with ``exc`` (the election failed)."""
        for call in self.state.take_unled():
            finish(call, Refused(renewed(exc)))
