"""The bridge between the engine and a wide scope: what a wide flight adds to the
process scope's, owned here and not by the engine.

The first local caller of a key asks the scope (one request per key per process): it
leads there (the work runs here, through the attempt driver, under the scope's token
and lease), or the local flight joins a flight led elsewhere and every local caller of
it is a joiner of that flight. The bridge drives that request (``start_async`` on the
caller's loop, ``drive_sync`` in a thread), turns the scope's typed events into the
flight's settling, and hands the leader's outcome to the scope (``land``).

When the scope cannot be reached and the flight's policy says ``on_unavailable="local"``,
the bridge leads the flight in this process alone instead (``_local``): the engine's
guarantees hold among this process's callers, nothing is landed or kept in the scope,
and the first such flight of an outage is logged.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, Any, cast

from .._log import log
from ..engine import attempts as _attempts
from ..engine.attempts import start_thread
from ..engine.flight import JOINED, Attempt, Flight, Outcome, wake
from ..errors import (
    FlightError,
    FlightFailedError,
    FlightInterruptedError,
    FlightTimeoutError,
    GroupClosedError,
    LeaseLostError,
    UnavailableError,
    renewed,
)
from .causes import CAUSE_SLACK, KeptCauses
from .events import Joined, Landed, Lead, LeaseLost, NoOutcome, Refused, ScopeEvent
from .interface import Handed, Scope, ScopeCall
from .outcome import Failure, Interrupted, SharedOutcome, Timeout, Value
from .table import WideFlight, WideTable

if TYPE_CHECKING:
    import threading

    from ..engine.attempts import Attempts
    from ..policy import FlightPolicy

__all__ = ["Bridge", "from_shared", "plain_scope_key", "scope_key", "to_shared"]


class Bridge:
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
        drive = self.drive_async(flight, work)
        if _attempts._EAGER:  # the request goes out now, from this call
            flight.task = asyncio.Task(drive, loop=loop, eager_start=True)  # type: ignore[call-arg, unused-ignore]
        else:
            task = flight.task = loop.create_task(drive)
            # Cancelled before its first step, it never asked the scope: the flight is
            # this process's alone, and ends here (its joiners here interrupted).
            task.add_done_callback(functools.partial(self._unstarted, weakref.ref(flight)))

    def _unstarted(self, flight_ref: weakref.ref[WideFlight], task: asyncio.Task[None]) -> None:
        flight = flight_ref()
        if flight is not None and flight.outcome is None and task.cancelled():
            stopped = FlightInterruptedError(flight.key, "its loop stopped before it began")
            self.settle_remote(flight, Outcome.INTERRUPTED, stopped)

    def _submit(self, flight: WideFlight) -> ScopeCall:
        detach = functools.partial(self.table.detach, flight)
        return self.scope.submit(
            scope_key(flight), fresh=flight.fresh_lead, after=flight.after, on_detached=detach
        )

    async def drive_async(self, flight: WideFlight, work: Callable[[], Awaitable[Any]]) -> None:
        """The work task of a wide group's flight: ask the scope, then lead or follow."""
        try:
            call = self._submit(flight)
        except Exception as exc:  # a network directory, a refused version, closed
            if self._local(flight, exc):
                await self.attempts.drive_async(flight, work)
            return
        try:
            while True:
                event = await call.inbox.get()
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
            self.table.leader_left_flight(flight)
            # This caller withdraws; the flight goes on for its other callers here, on
            # a thread of its own, from where it was (DESIGN.md: a caller that cancels
            # withdraws only itself). Without a thread it ends interrupted for all.
            try:
                failed = start_thread(
                    "flightgroup-follow", self._go_on_sync, flight, call, work, parent,
                    pending,
                )
            except BaseException:  # (got going: it goes on)
                raise exc from None
            if failed is None:
                raise
            self.scope.withdraw(call)
            self.settle_remote(
                flight,
                Outcome.INTERRUPTED,
                FlightInterruptedError(flight.key, f"its leading caller got {type(exc).__name__}"),
            )
            raise
        self._act_sync(flight, call, work, parent, event)
        if on_join is not None and type(event) is Landed and not event.kept:
            # Its flight's outcome came from elsewhere: this caller joined it (_end).
            try:
                on_join()
            except BaseException as exc:
                return exc
        return None

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
            if not event.kept:
                # A flight's landing is a join of it, announced or not: its callers here
                # are joiners, and their on_join is due before they read it.
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

    # -- retries and the landing ------------------------------------------------

    async def retry(self, flight: Flight, call: ScopeCall, following: Attempt) -> bool:
        """Ask the scope a token for ``following``, the flight's next attempt, and bind
        it; False if the lease was lost meanwhile."""
        self.scope.retry(call)
        return self.bind_retry(flight, call, following, await call.inbox.get())

    def bind_retry(
        self, flight: Flight, call: ScopeCall, following: Attempt, event: ScopeEvent
    ) -> bool:
        """The scope's answer to a retry's request for a token: the attempt runs under
        it; False if the lease was lost meanwhile (the attempt is revoked)."""
        if type(event) is not Lead:
            following.revoked = True
            following.lose()
            return False
        following.token = flight.token = event.token
        self.scope.bind(call, following)
        return True

    def land(
        self,
        flight: Flight,
        *,
        outcome: Outcome,
        data: bytes | None,
        error: BaseException | None,
    ) -> tuple[Outcome, BaseException | None]:
        """Hand the outcome to the scope; the flight settles here once the scope has it
        (or as lost, when the flight is no longer this leader's: LeaseLostError for the
        leader, the work's own error as its cause). Returns the outcome and error the
        leader ends with, as far as they are known now."""
        assert isinstance(flight, WideFlight)  # (made by the bridge's table)
        if flight.local:  # nothing to hand over: its outcome is this process's alone
            self.attempts.settle(flight, outcome, None, error, data)
            return outcome, error
        call = flight.wide
        self.table.handing(flight)
        scope = self.scope
        if is_lost(flight, call):
            scope.land(call, None, stragglers=flight.stragglers)
            if serves_here(flight, call):
                self.attempts.settle(flight, outcome, None, error, data)
                return outcome, error
            lost = lease_lost(flight.key, error)
            self.attempts.settle(flight, Outcome.LOST, None, lost, None)
            return Outcome.LOST, lost
        shared, outcome, error = self._shared(flight, outcome, data, error)
        if outcome is Outcome.INTERRUPTED:
            data = None

        def handed(answer: Handed) -> None:
            if not answer.fenced or (
                flight.policy.on_unavailable == "local"
                and (answer.unconfirmed is not None or serves_here(flight, call))
            ):
                # Taken; or not heard for a lease, the scope out of reach: under "local"
                # its outcome still serves this process (no newer flight fenced it).
                self.attempts.settle(flight, outcome, None, error, data)
                return
            if answer.unconfirmed is None:
                lost = lease_lost(flight.key, error)
            else:
                lost = as_called(answer.unconfirmed, flight)
                if error is not None:  # the work's own failure, which it landed
                    lost.__cause__ = error
            self.attempts.settle(flight, Outcome.LOST, None, lost, None)

        self._remember_cause(flight, shared, error)
        scope.land(call, shared, stragglers=flight.stragglers, done=handed)
        return outcome, error

    def ran_elsewhere(self, flight: Flight) -> bool:
        """``flight``'s outcome came from the scope: every caller here is a joiner."""
        return isinstance(flight, WideFlight) and flight.remote

    def straggles(self, flight: Flight, ended: threading.Event) -> None:
        """A sync attempt of ``flight`` runs on past its deadline (``ended`` is set when
        it returns): the scope holds the key until it ends."""
        assert isinstance(flight, WideFlight)  # (made by the bridge's table)
        flight.stragglers = [*(flight.stragglers or ()), ended]

    def returned(self, flight: Flight) -> None:
        """A sync attempt of ``flight`` run on a thread of its own returned."""
        assert isinstance(flight, WideFlight)  # (made by the bridge's table)
        self.table.unlinger(flight)

    def _shared(
        self, flight: WideFlight, outcome: Outcome, data: bytes | None, error: BaseException | None
    ) -> tuple[SharedOutcome, Outcome, BaseException | None]:
        """The outcome as the scope carries it. Describing a failure calls its str(),
        user code: interrupted there (a signal), the flight lands interrupted instead
        of stopping half way with the key held in the scope."""
        try:
            shared = to_shared(
                flight.key, outcome, data, error, flight.policy, self.max_value_bytes
            )
        except BaseException as exc:
            outcome, error = Outcome.INTERRUPTED, exc
            shared = to_shared(flight.key, outcome, None, exc, flight.policy, None)
        return shared, outcome, error

    def _remember_cause(
        self, flight: WideFlight, shared: SharedOutcome, error: BaseException | None
    ) -> None:
        """A failure landed that a group of this process may get back from the scope: a
        failure to be kept, or any while another group of this process has the scope
        (its joiners). Its error is kept for as long (and for the landing's way through
        the scope), for the ``__cause__`` of their FlightFailedError (docs/api.md: "in the
        same process ``__cause__`` is E"; ADR 0023)."""
        if error is None or not isinstance(shared, Failure):
            return
        table = self.table
        if shared.keep or table.has_kin():
            if table.causes is None:
                with table.lock:  # leaders land on threads of their own
                    if table.causes is None:
                        table.causes = KeptCauses()
            table.causes.remember(
                flight.key, flight.token, error, (shared.keep or 0.0) + CAUSE_SLACK
            )

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


def is_lost(flight: WideFlight, call: ScopeCall) -> bool:
    """The lease of the flight this process leads in a wide scope is lost."""
    lead = call.lead
    attempt = flight.attempt
    return (lead is not None and lead.lost) or (attempt is not None and attempt.revoked)


def serves_here(flight: WideFlight, call: ScopeCall) -> bool:
    """The lease of ``flight`` was lost only because its scope could not be reached,
    and its policy says ``on_unavailable="local"``: its outcome serves this process's
    callers (nothing newer took the key from it; it is not landed in the scope)."""
    lead = call.lead
    attempt = flight.attempt
    return (
        flight.policy.on_unavailable == "local"
        and lead is not None
        and lead.unreachable
        and not (attempt is not None and attempt.timed_out)
    )


def lease_lost(key: str, error: BaseException | None) -> BaseException:
    """What a leader that lost its lease raises: LeaseLostError, the work's own
    error as its cause (or the lease's own error, when the work raised that)."""
    if isinstance(error, LeaseLostError):
        return error
    lost = LeaseLostError(key)
    lost.__cause__ = error
    return lost


def as_called(error: BaseException, flight: WideFlight) -> BaseException:
    """``error`` as the scope made it, keyed by the key it sent (a decorated function's
    carries its namespace): made again with the key as the caller gave it."""
    if isinstance(error, UnavailableError) and error.key is None:
        made = renewed(error)  # one scope's failure, shared by the calls it failed
        cast("UnavailableError", made).key = flight.key
        return made
    if isinstance(error, FlightError) and getattr(error, "key", flight.key) != flight.key:
        args = error._init_args()
        if args and args[0] == getattr(error, "key", None):
            return type(error)(flight.key, *args[1:])
    return error


def scope_key(flight: WideFlight) -> str:
    """The key a flight has in a wide scope: a decorated function's keys carry its
    namespace ("NUL namespace NUL key"), so two functions never share a flight there
    either, nor a function and a plain key (see plain_scope_key)."""
    tkey = flight.tkey
    if type(tkey) is str:
        return plain_scope_key(tkey)
    namespace, op = cast("tuple[str, str]", tkey)  # a decorated function's
    return op_scope_key(namespace, op)


def op_scope_key(namespace: str, op: str) -> str:
    """The key a decorated function's call of ``op`` has in a wide scope."""
    return f"\x00{namespace}\x00{op}"


def plain_scope_key(key: str) -> str:
    """A plain key in a wide scope: as it is, unless it starts with a NUL; then it
    starts with one more. A decorated function's key starts with a NUL and then its
    namespace, which is never empty and holds no NUL, so the kinds never meet."""
    return "\x00" + key if key.startswith("\x00") else key


def to_shared(
    key: str, outcome: Outcome, data: bytes | None, error: BaseException | None,
    policy: FlightPolicy, limit: int | None,
) -> SharedOutcome:
    """The outcome a leader lands, as the scope carries it (with its Retention time).
    ``limit`` is the group's ``max_value_bytes``: a failure's message crosses whole
    (docs/api.md: ``.message`` is its ``str()``) unless its UTF-8 could pass that bound."""
    retention = policy.retention
    if outcome is Outcome.VALUE:
        keep = retention.success if retention is not None else None
        if retention is None or not keep:
            return Value(data if data is not None else b"")
        return Value(
            data if data is not None else b"", keep, retention.max_items, retention.max_bytes
        )
    assert error is not None
    if outcome is Outcome.ERROR:
        kind, module, message, _ = FlightFailedError.describe(key, error)
        # A quarter of the bound in characters surely fits (4 UTF-8 bytes each at most).
        if (
            limit is not None and len(message) > limit // 4
            and len(message.encode("utf-8", "surrogatepass")) > limit
        ):
            message = f"{message[: limit // 4]}... (cut)"
        keep = retention.error if retention is not None else None
        if retention is None or not keep:
            return Failure(kind, module, message)
        return Failure(kind, module, message, keep, retention.max_items, retention.max_bytes)
    if outcome is Outcome.TIMEOUT and isinstance(error, FlightTimeoutError):
        return Timeout(error.deadline, error.attempts)
    return Interrupted(f"its work was stopped by {type(error).__qualname__}")


def from_shared(
    key: str, outcome: SharedOutcome
) -> tuple[Outcome, BaseException | None, bytes | None]:
    """A landed outcome as a joiner's flight settles with it: (outcome, the error
    every caller raises a copy of, the encoded value)."""
    if isinstance(outcome, Value):
        return Outcome.VALUE, None, outcome.data
    if isinstance(outcome, Failure):
        return Outcome.ERROR, FlightFailedError(
            key, outcome.type, outcome.message, outcome.module
        ), None
    if isinstance(outcome, Timeout):
        return Outcome.TIMEOUT, FlightTimeoutError(key, outcome.deadline, outcome.attempts), None
    return Outcome.INTERRUPTED, FlightInterruptedError(key, outcome.reason), None
