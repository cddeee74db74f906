"""A wide flight led here, from its lead to its landing: a retry's new token, the
sync attempts left running past the deadline (the scope holds the key for them), and
the landing: the outcome as the scope carries it (``to_shared``; a joiner's flight
settles from one with ``from_shared``), handed to the scope, and the flight settled
here once the scope took it, or as lost once it is no longer this leader's.

A part of :class:`~.bridge.Bridge` (``Landing``): it adds no field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ..engine.flight import Attempt, Flight, Outcome
from ..errors import (
    FlightError,
    FlightFailedError,
    FlightInterruptedError,
    FlightTimeoutError,
    LeaseLostError,
    UnavailableError,
    renewed,
)
from .causes import CAUSE_SLACK, KeptCauses
from .events import Lead, ScopeEvent
from .interface import Handed, Scope, ScopeCall
from .outcome import Failure, Interrupted, SharedOutcome, Timeout, Value
from .table import WideFlight, WideTable

if TYPE_CHECKING:
    import threading

    from ..engine.attempts import Attempts
    from ..policy import FlightPolicy

__all__ = [
    "Landing",
    "as_called",
    "from_shared",
    "is_lost",
    "lease_lost",
    "serves_here",
    "to_shared",
]


class Landing:
    """The bridge's part for a flight led here: its retries' tokens, its attempts left
    running, and its landing."""

    __slots__ = ()

    scope: Scope
    table: WideTable
    attempts: Attempts
    max_value_bytes: int | None

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
