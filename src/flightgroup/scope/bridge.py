"""The bridge between the engine and a wide scope: what a wide flight adds to the
process scope's, owned here and not by the engine.

The first local caller of a key asks the scope (one request per key per process): it
leads there (the work runs here, through the attempt driver, under the scope's token
and lease), or the local flight joins a flight led elsewhere and every local caller of
it is a joiner of that flight. The bridge drives that request (``start_async`` on the
caller's loop, ``drive_sync`` in a thread) and turns the scope's typed events into the
flight's settling; on the caller's loop it awaits a ``Follow``'s read itself, where the
scope lets a joined flight's outcome be read there. A flight led here is landed by the
bridge's part in ``landing.py`` (``land``: the leader's outcome handed to the scope); a
flight's key in the scope is made in ``keys.py``.

When the scope cannot be reached and the flight's policy says ``on_unavailable="local"``,
the bridge leads the flight in this process alone instead (``_local``): the engine's
guarantees hold among this process's callers, nothing is landed or kept in the scope,
and the first such flight of an outage is logged.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, Any

from .._log import log
from ..engine.eager import start_eagerly
from ..engine.flight import JOINED, Attempt, Flight, Outcome, wake
from ..engine.sync_attempt import start_thread
from ..errors import FlightInterruptedError, GroupClosedError, UnavailableError
from .events import Follow, Joined, Landed, Lead, LeaseLost, NoOutcome, Refused, ScopeEvent
from .interface import Scope, ScopeCall
from .keys import op_scope_key, plain_scope_key, scope_key
from .landing import Landing, as_called, from_shared, to_shared
from .table import WideFlight, WideTable

if TYPE_CHECKING:
    from ..engine.attempts import Attempts

__all__ = [
    "Bridge",
    "from_shared",
    "op_scope_key",
    "plain_scope_key",
    "scope_key",
    "to_shared",
]


class Bridge(Landing):
    """The engine's side of one group's wide scope.

    ``closed_error`` makes the error a call of the closed group raises (the group's own:
    a forked child's carries its reason)."""

    __slots__ = ("attempts", "closed_error", "max_value_bytes", "outage", "scope", "table")

    def __init__(
        self,
        scope: Scope,
        *,
        table: WideTable,
        attempts: Attempts,
        max_value_bytes: int | None,
        closed_error: Callable[[], GroupClosedError],
    ) -> None:
        self.scope = scope
        self.table = table
        self.attempts = attempts
        self.max_value_bytes = max_value_bytes
        self.closed_error = closed_error
        # A flight was led here alone since the scope last answered (logged once each).
        self.outage = False

    # -- asking the scope --------------------------------------------------------

    def start_async(
        self, flight: Flight, work: Callable[[], Awaitable[Any]], loop: asyncio.AbstractEventLoop
    ) -> None:
        """Start the task that asks the scope for ``flight``, then leads or follows. The
        scope decides first (it always suspends): no eager deadline."""
        assert isinstance(flight, WideFlight)  # (made by the bridge's table)
        # The request goes out now, from this call (an eager start, engine/eager.py).
        flight.task = start_eagerly(self.drive_async(flight, work), loop)

    def _submit(
        self, flight: WideFlight, loop: asyncio.AbstractEventLoop | None = None
    ) -> ScopeCall:
        detach = functools.partial(self.table.detach, flight)
        return self.scope.submit(
            scope_key(flight), fresh=flight.fresh_lead, after=flight.after,
            on_detached=detach, loop=loop,
        )

    async def drive_async(self, flight: WideFlight, work: Callable[[], Awaitable[Any]]) -> None:
        """The work task of a wide group's flight: ask the scope, then lead or follow."""
        try:
            call = self._submit(flight, asyncio.get_running_loop())
        except Exception as exc:  # a network directory, a refused version, closed
            if self._local(flight, exc):
                await self.attempts.drive_async(flight, work)
            return
        event: ScopeEvent
        try:
            while True:
                event = await call.inbox.get()
                if type(event) is Follow:  # (the scope's last word: no event follows)
                    event = await event.read(functools.partial(self._joined, flight))
                    break
                if type(event) is not Joined:
                    break
                self._joined(flight, event.token)
        except BaseException:  # its loop shuts down: give the call back
            self.scope.withdraw(call)
            self.settle_remote(
                flight, Outcome.INTERRUPTED, FlightInterruptedError(flight.key, "its loop stopped")
            )
            raise
        if type(event) is Lead:
            if self._lead(flight, call, event.token):
                await self.attempts.drive_async(flight, work, call)
        elif type(event) is Refused:
            if self._local(flight, event.error):
                await self.attempts.drive_async(flight, work)
        else:
            self._end(flight, event)

    def drive_sync(
        self,
        flight: Flight,
        work: Callable[[], Any],
        parent: Flight | None,
        on_join: Callable[[], object] | None = None,
    ) -> BaseException | None:
        """:meth:`drive_async` in the leading caller's thread (which then calls
        ``on_join`` itself when the flight joins one led elsewhere). Returns what
        on_join raised, for that caller to raise once the flight ended."""
        assert isinstance(flight, WideFlight)  # (made by the bridge's table)
        flight.parent = parent
        try:
            call = self._submit(flight)
        except Exception as exc:  # as in drive_async
            if self._local(flight, exc):
                self.attempts.drive_sync(flight, work, parent)
            return None
        pending: ScopeEvent | None = None  # read, not yet acted on
        try:
            while True:
                pending = call.inbox.wait_sync()  # taken below: see _go_on_sync
                call.inbox.take(pending)
                event = pending
                if type(event) is not Joined:
                    break
                self._joined(flight, event.token)
                pending = None
                if on_join is not None:
                    call_on_join, on_join = on_join, None
                    try:
                        call_on_join()
                    except BaseException as exc:  # also a KeyboardInterrupt during it
                        self.table.leader_left_flight(flight)
                        # This caller withdraws now; the flight goes on for the others
                        # here on a thread of its own, to its outcome (no thread: it
                        # ends interrupted, below, and this caller raises its own error).
                        try:
                            started = start_thread(
                                "flightgroup-follow", self._follow_sync, flight, call
                            )
                        except BaseException as interrupt:  # (got going: it follows)
                            return interrupt
                        if started is not None:
                            raise
                        return exc
        except BaseException as exc:  # KeyboardInterrupt while waiting
            self._leave_sync(flight, call, work, parent, pending, exc)
            raise
        self._act_sync(flight, call, work, parent, event)
        if on_join is not None and type(event) is Landed and not event.kept:
            # Its flight's outcome came from elsewhere: this caller joined it (_end).
            try:
                on_join()
            except BaseException as exc:
                return exc
        return None

    def _leave_sync(
        self,
        flight: WideFlight,
        call: ScopeCall,
        work: Callable[[], Any],
        parent: Flight | None,
        pending: ScopeEvent | None,
        exc: BaseException,
    ) -> None:
        """The leading caller of ``drive_sync`` stopped waiting (``exc``: a
        KeyboardInterrupt, which it raises next): it withdraws; the flight goes on for
        its other callers here, on a thread of its own, from where it was (DESIGN.md: a
        caller that cancels withdraws only itself). Without a thread it ends
        interrupted for all."""
        self.table.leader_left_flight(flight)
        try:
            failed = start_thread(
                "flightgroup-follow", self._go_on_sync, flight, call, work, parent, pending
            )
        except BaseException:  # (got going: it goes on)
            raise exc from None
        if failed is None:
            return
        self.scope.withdraw(call)
        self.settle_remote(
            flight,
            Outcome.INTERRUPTED,
            FlightInterruptedError(flight.key, f"its leading caller got {type(exc).__name__}"),
        )

    def _act_sync(
        self,
        flight: WideFlight,
        call: ScopeCall,
        work: Callable[[], Any],
        parent: Flight | None,
        event: ScopeEvent,
    ) -> None:
        """The scope's answer (other than Joined): lead here, or settle."""
        if type(event) is Lead:
            if self._lead(flight, call, event.token):
                self.attempts.drive_sync(flight, work, parent, call)
        elif type(event) is Refused:
            if self._local(flight, event.error):
                self.attempts.drive_sync(flight, work, parent)
        else:
            self._end(flight, event)

    def _go_on_sync(
        self,
        flight: WideFlight,
        call: ScopeCall,
        work: Callable[[], Any],
        parent: Flight | None,
        pending: ScopeEvent | None,
    ) -> None:
        """The rest of drive_sync, on a thread of its own, once its caller withdrew:
        ``pending`` is the answer it had read and not acted on."""
        while True:
            if pending is None:  # (an answer read but not taken is still in the inbox)
                pending = call.inbox.wait_sync()
            call.inbox.take(pending)
            event, pending = pending, None
            if type(event) is not Joined:
                break
            self._joined(flight, event.token)
        self._act_sync(flight, call, work, parent, event)

    def _follow_sync(self, flight: WideFlight, call: ScopeCall) -> None:
        """Wait for the outcome of the flight ``call`` joined elsewhere, and settle."""
        while True:
            event = call.inbox.get_sync()
            if type(event) is not Joined:
                break
        self._end(flight, event)

    # -- the scope's answers -----------------------------------------------------

    def _lead(self, flight: WideFlight, call: ScopeCall, token: int) -> bool:
        """This process leads the flight in the scope: its work runs under ``token``.

        False if the group closed since the scope answered: close() may have returned,
        so no work starts after it; the lead goes back to the scope (its key lock, or
        its record in Redis) and the flight ends for nobody (close() woke its callers).
        """
        try:
            promoted = self.table.ran_here(flight)
        except GroupClosedError:
            self.scope.withdraw(call)
            self.settle_remote(flight, Outcome.INTERRUPTED, self.closed_error())
            return False
        self.outage = False
        flight.token = token
        attempt = flight.attempt = Attempt(flight, token)
        flight.wide = call
        if promoted:
            wake(promoted, JOINED)
        self.scope.bind(call, attempt)
        return True

    def _joined(self, flight: WideFlight, token: int) -> None:
        """The flight joined flight ``token`` led elsewhere: its callers are joiners."""
        self.outage = False
        flight.token = token
        woken = self.table.joined_remote(flight)
        if woken is not None:
            wake(woken, JOINED)

    def _local(self, flight: WideFlight, error: BaseException) -> bool:
        """The scope could not serve ``flight`` (``error``): True if it is to run here
        alone (its policy says ``on_unavailable="local"`` and ``error`` is the scope's
        UnavailableError); else it settles with the error, or as closed."""
        if flight.policy.on_unavailable != "local" or not isinstance(error, UnavailableError):
            self.settle_remote(
                flight, Outcome.INTERRUPTED, as_called(error, flight), unserved=True
            )
            return False
        try:
            promoted = self.table.ran_here(flight, local=True)
        except GroupClosedError:
            self.settle_remote(flight, Outcome.INTERRUPTED, self.closed_error())
            return False
        if not self.outage:
            self.outage = True
            log.warning(
                "%s cannot be reached (%s): calls coalesce in this process alone "
                "(on_unavailable='local') until it answers again",
                self.scope.label, error,
            )
        if promoted:
            wake(promoted, JOINED)
        return True

    def _end(self, flight: WideFlight, event: ScopeEvent) -> None:
        """Settle a flight whose outcome came from the scope (or that cannot go on)."""
        if type(event) is Landed:
            if not event.kept and not (flight.joined_remote and flight.token == event.token):
                # A flight's landing is a join of it, announced or not: its callers here
                # are joiners, and their on_join is due before they read it. (Announced:
                # _joined ran for this token on this driver's thread.)
                self._joined(flight, event.token)
            outcome, error, data = from_shared(flight.key, event.outcome)
            if error is not None:  # a failure a group of this process may have landed
                error.__cause__ = self.table.cause_of(flight.key, event.token)
            self.settle_remote(flight, outcome, error, data, event.token, joined=True)
        elif type(event) is Refused:
            self.settle_remote(
                flight, Outcome.INTERRUPTED, as_called(event.error, flight), unserved=True
            )
        else:  # NoOutcome (or LeaseLost before leading: cannot happen, same answer)
            reason = "its leader stopped"
            if isinstance(event, (NoOutcome, LeaseLost)):
                reason = event.reason
            self.settle_remote(
                flight, Outcome.INTERRUPTED, FlightInterruptedError(flight.key, reason)
            )

    def settle_remote(
        self,
        flight: WideFlight,
        outcome: Outcome,
        error: BaseException | None,
        data: bytes | None = None,
        token: int | None = None,
        *,
        joined: bool = False,
        unserved: bool = False,
    ) -> None:
        """Settle ``flight`` with an outcome that every caller here gets as a joiner:
        the value (decoded by each), or a copy of ``error``. ``joined``: the outcome is
        a flight's that ran elsewhere; ``unserved``: the scope could not serve the call."""
        flight.remote = True
        if token is not None:
            flight.token = token
        self.table.ran_elsewhere(flight, joined, unserved)
        self.attempts.settle(flight, outcome, None, error, data)

    def ran_elsewhere(self, flight: Flight) -> bool:
        """``flight``'s outcome came from the scope: every caller here is a joiner."""
        return isinstance(flight, WideFlight) and flight.remote

    # -- the group ---------------------------------------------------------------

    def forget(self, tkey: Hashable, sent: str, key: str) -> None:
        """forget() of ``tkey`` (sent to the scope as ``sent``; ``key`` as its caller
        gave it): the table detaches the flight, the scope forgets it, and the table
        detaches again whatever joined the old flight meanwhile."""
        # Asking: until the scope confirms, it may still make a call join the old flight
        # (a run_sync on the loop of its work is refused meanwhile: _scope_blocks).
        self.table.forget(tkey, asking=True)
        try:
            self.scope.forget(sent)
        except UnavailableError as exc:
            if exc.key is None:  # the scope's own error: it concerns this key
                exc.key = key
            raise
        finally:
            self.table.forget_answered(tkey)
        # Again once the scope confirmed: a call of this group made in between may have
        # reached the scope first and joined the old flight, and the scope's notice of
        # the forget reaches its local flight later (fleet: at its next read). A call
        # made after forget() returned must not join it.
        self.table.forget(tkey)


