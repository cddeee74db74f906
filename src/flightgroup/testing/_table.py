"""The fake's flights and its decisions (:class:`FakeTable`): one flight per key across
its groups, a token per lead and per retry, joins, ``fresh`` calls waiting for a flight's
end, kept outcomes, landings, forgets and closes; and how its answers go out (after its
lock is released, unless a hook holds or drops them).

The decisions are taken under the table's one lock and return the actions that answer
them; the actions run after it is released, in the thread that made the request.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from collections.abc import Callable
from typing import Any

from ..errors import GroupClosedError, UnavailableError
from ..retention import RetentionStore
from ..scope.events import Joined, Landed, Lead, LeaseLost, NoOutcome, Refused, ScopeEvent
from ..scope.interface import Handed, LeadState, key_as_called
from ..scope.outcome import Failure, Interrupted, SharedOutcome, Value, kept_size
from ._scope import FakeCall, FakeScope

__all__ = ["FakeTable"]

# The bounds of kept outcomes when a landing names none (the directory's own).
_KEPT_MAX_ITEMS = 10_000
_KEPT_MAX_BYTES = 256 * 1024 * 1024

_Action = tuple[str, Callable[[], object]]  # (the key it answers, what to do)


class _FakeFlight:
    """A flight the fake knows. Fields are the coordinator's, under its lock."""

    __slots__ = (
        "detached", "ended", "first", "fresh", "joiners", "key", "leader", "started", "token",
    )  # fmt: skip

    def __init__(self, key: str, token: int, leader: FakeCall, started: float) -> None:
        self.key = key
        self.token = token  # the current attempt's
        self.first = token  # its first attempt's: "began after" compares this one
        self.leader = leader
        self.started = started
        self.joiners: list[FakeCall] = []
        self.fresh: list[FakeCall] = []  # fresh calls waiting for its end
        self.detached = False  # forgotten: no longer its key's, serves its own joiners
        self.ended = False


class _FakeLead(LeadState):
    """A lead of one call: the flight it runs (``lost`` and ``work_done`` as every
    scope's lead; ``lock`` guards them)."""

    __slots__ = ("flight",)

    def __init__(self, flight: _FakeFlight) -> None:
        super().__init__()
        self.flight = flight


class FakeTable:
    """The flights of one fake coordinator and its decisions (see the module); every
    method may be called from any thread. ``clock``: the time of kept outcomes, flight
    ages and status."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self._tokens = itertools.count(1)
        self.flights: dict[str, _FakeFlight] = {}
        self.detached: list[_FakeFlight] = []  # forgotten flights still running
        self.kept = RetentionStore(_KEPT_MAX_ITEMS, _KEPT_MAX_BYTES, clock=clock)
        self.unreachable = False  # every submit, forget and status raises (a hook)
        # key (None: every key) -> the answers a hook holds back, in order
        self.held: dict[str | None, list[Callable[[], object]]] = {}
        self.drops: dict[type[ScopeEvent], int] = {}  # events of a kind a hook loses
        # each scope's threads past their deadlines: (left, bound), while left > 0
        self.left: dict[FakeScope, tuple[int, int]] = {}

    # -- what scopes ask -------------------------------------------------------------

    def submit(
        self,
        scope: FakeScope,
        key: str,
        fresh: bool,
        after: int | None,
        on_detached: Callable[[], object] | None,
    ) -> FakeCall:
        """A new call of ``scope`` (FakeScope.submit's contract): answered before
        this returns, unless held."""
        if scope.closed and not scope.killed:
            raise GroupClosedError()
        if scope.killed:
            raise UnavailableError(f"the fake process {scope.pid} was killed")
        scope.check_key(key)
        with self.lock:
            if self.unreachable:
                raise UnavailableError("the fake scope is unreachable")
            scope._started = True
            call = FakeCall(scope, key, fresh, after, on_detached)
            scope._waiting.add(call)
            actions = self._run(call, fresh, kept=True)
        self._perform(actions)
        return call

    def _run(self, call: FakeCall, fresh: bool, *, kept: bool) -> list[_Action]:
        """(Under the lock) lead, join, wait for the end of, or serve kept ``call``.
        ``kept``: a kept outcome may serve it (not after it waited for a flight's end)."""
        key, after = call.key, call.after
        flight = self.flights.get(key)
        if flight is not None:
            if fresh and (after is None or flight.first <= after):
                flight.fresh.append(call)  # it began before the call: the next one
                call.flight = flight
                return []
            return self._join(flight, call)
        if kept and (not fresh or after is not None):
            entry = self.kept.get(key)  # a hit is a use (LRU); an expired one goes
            if entry is not None and (after is None or entry.token > after):
                call.ended = True
                return [self._put(call, Landed(entry.token, entry.payload, kept=True))]
        token = next(self._tokens)
        flight = _FakeFlight(key, token, call, self.clock())
        self.flights[key] = flight
        call.flight = flight
        call._lead = _FakeLead(flight)
        return [self._put(call, Lead(token))]

    def _join(self, flight: _FakeFlight, call: FakeCall) -> list[_Action]:
        flight.joiners.append(call)
        call.flight = flight
        age = self.clock() - flight.started
        return [self._put(call, Joined(flight.token, flight.leader.scope.pid, age))]

    def retry(self, call: FakeCall) -> None:
        """A new token for ``call``'s lead (FakeScope.retry's contract)."""
        lead = call._lead
        assert lead is not None
        with self.lock:
            flight = lead.flight
            if lead.lost or flight.ended or call.scope.closed:
                actions = [self._put(call, LeaseLost("lost"))]
            else:
                flight.token = next(self._tokens)
                # Joiners hear the new token (as the fleet's do): Joined again.
                age = self.clock() - flight.started
                pid = call.scope.pid
                actions = [self._put(call, Lead(flight.token))]
                actions += [
                    self._put(joiner, Joined(flight.token, pid, age)) for joiner in flight.joiners
                ]
        self._perform(actions)

    def land(
        self,
        call: FakeCall,
        outcome: SharedOutcome | None,
        done: Callable[[Handed], None] | None,
    ) -> None:
        """Take ``call``'s outcome (FakeScope.land's contract)."""
        lead = call._lead
        assert lead is not None
        with lead.lock:
            lead.work_done = True
            lost = lead.lost
        with self.lock:
            flight = lead.flight
            call.ended = True
            if outcome is None or lost or flight.ended:
                # Nothing lands: the flight is no longer this lead's (its end was told).
                actions = [] if flight.ended else self._end_flight(
                    flight, NoOutcome("its leader lost its lease")
                )
                fenced = True
            else:
                current = self.flights.get(flight.key) is flight
                ending: ScopeEvent = (
                    NoOutcome(outcome.reason) if isinstance(outcome, Interrupted)
                    else Landed(flight.token, outcome)
                )
                actions = self._end_flight(flight, ending)
                # A detached (forgotten) flight is never kept.
                if isinstance(outcome, (Value, Failure)) and outcome.keep and current:
                    self._keep(flight, outcome, outcome.keep)
                elif current:
                    # A newer outcome that is not kept: an older kept one (a fresh call
                    # led past it) must not be served after it.
                    self.kept.discard(flight.key)
                fenced = False
            if done is not None:
                actions.append((call.key, lambda: done(Handed(fenced=fenced))))
        self._perform(actions)

    def _keep(self, flight: _FakeFlight, outcome: Value | Failure, seconds: float) -> None:
        max_items = outcome.max_items if outcome.max_items is not None else _KEPT_MAX_ITEMS
        max_bytes = outcome.max_bytes if outcome.max_bytes is not None else _KEPT_MAX_BYTES
        self.kept.put(
            flight.key, isinstance(outcome, Value), outcome, flight.token, seconds,
            kept_size(outcome), (max_items, max_bytes),
        )

    def withdraw(self, call: FakeCall) -> None:
        """``call``'s driver stopped (FakeScope.withdraw's contract)."""
        with self.lock:
            if call.ended:
                return
            call.ended = True
            flight = call.flight
            actions: list[_Action] = []
            if flight is not None and call._lead is not None:
                if not flight.ended:
                    actions = self._end_flight(flight, NoOutcome("its leader withdrew"))
            elif flight is not None:
                with contextlib.suppress(ValueError):
                    flight.joiners.remove(call)
                with contextlib.suppress(ValueError):
                    flight.fresh.remove(call)
        self._perform(actions)

    def forget(self, scope: FakeScope, key: str) -> None:
        """The next call of ``key`` leads a new flight (FakeScope.forget's contract)."""
        with self.lock:
            if self.unreachable:
                raise UnavailableError(f"the fake scope is unreachable: cannot forget {key!r}")
            self.kept.discard(key)
            flight = self.flights.pop(key, None)
            told: list[FakeCall] = []
            if flight is not None:
                flight.detached = True
                self.detached.append(flight)
                told = [flight.leader, *flight.joiners]
        for each in told:  # the engine's callback: outside the lock
            each.detached()

    def status(self, scope: FakeScope) -> list[dict[str, Any]]:
        """The flights in progress, for ``scope``; raises while unreachable."""
        with self.lock:
            if self.unreachable:
                raise UnavailableError("the fake scope is unreachable")
            return self.flights_now()

    def flights_now(self) -> list[dict[str, Any]]:
        """(Under the lock) the flights in progress, as a scope's ``status()`` says them."""
        now = self.clock()
        return [
            {
                "key": key_as_called(flight.key),
                "token": flight.token,
                "leader_pid": flight.leader.scope.pid,
                "joiners": len(flight.joiners),
                "age_s": round(now - flight.started, 3),
            }
            for flight in (*self.flights.values(), *self.detached)
        ]

    def close(self, scope: FakeScope, *, killed: bool) -> None:
        """``scope`` closes, or its "process" is ``killed`` (FakeScope.close,
        FakeCoordinator.kill)."""
        with self.lock:
            if scope.closed and not (killed and not scope.killed):
                return
            scope.closed = True
            scope.killed = scope.killed or killed
            self.left.pop(scope, None)
            actions: list[_Action] = []
            losing: list[tuple[FakeCall, _FakeLead]] = []
            flights = [*self.flights.values(), *self.detached]
            reason = "its leader's process died" if killed else "its leader's group closed"
            for flight in flights:
                leader = flight.leader
                lead = leader._lead
                if leader.scope is scope and lead is not None and not leader.ended:
                    with lead.lock:
                        running = not lead.work_done
                    if running or killed:
                        losing.append((leader, lead))
                        actions += self._end_flight(flight, NoOutcome(reason))
            # Every call of the scope still waiting for its answer (one the fake
            # decided but whose answer is held or lost too) hears it now.
            for call in list(scope._waiting):
                scope._waiting.discard(call)
                part = call.flight
                joined = part is not None and call in part.joiners
                if part is not None and not call.ended:
                    with contextlib.suppress(ValueError):
                        part.joiners.remove(call)
                    with contextlib.suppress(ValueError):
                        part.fresh.remove(call)
                call.ended = True
                event: ScopeEvent = Refused(GroupClosedError())
                if killed:
                    event = (
                        NoOutcome("this process died") if joined
                        else Refused(UnavailableError("this fake process died"))
                    )
                actions.append((call.key, functools.partial(call.inbox.put, event)))
        for leader, lead in losing:
            self._lose(leader, lead, reason)
        self._perform(actions)

    # -- what hooks do --------------------------------------------------------------

    def lose_lease(self, key: str) -> int:
        """The lead of ``key``'s running flight loses its lease (FakeCoordinator's)."""
        with self.lock:
            flight = self.flights.get(key)
            if flight is None:
                raise LookupError(f"no flight of {key!r} runs in the fake")
            actions = self._end_flight(flight, NoOutcome("its leader lost its lease"))
        lead = flight.leader._lead
        assert lead is not None
        self._lose(flight.leader, lead, "its lease was lost")
        self._perform(actions)
        return flight.token

    def report_left(self, scope: FakeScope, left: int, bound: int) -> None:
        """``scope`` has ``left`` threads past their deadlines (of ``bound``)."""
        with self.lock:
            if left and not scope.closed:
                self.left[scope] = (left, bound)
            else:
                self.left.pop(scope, None)

    def left_threads(self) -> list[dict[str, Any]]:
        """The "processes" with threads past their deadlines."""
        with self.lock:
            return [
                {"pid": scope.pid, "left_threads": left, "max_deadline_threads": bound}
                for scope, (left, bound) in self.left.items()
            ]

    def release(self, key: str | None) -> None:
        """Deliver what a hold of ``key`` kept back, and stop holding it."""
        with self.lock:
            queued = self.held.pop(key, [])
        for action in queued:
            action()

    # -- inside ----------------------------------------------------------------------

    def _end_flight(self, flight: _FakeFlight, ending: ScopeEvent) -> list[_Action]:
        """(Under the lock) ``flight`` ends: its joiners hear ``ending``, its fresh
        waiters lead or join the key's next flight (a kept outcome never serves them)."""
        flight.ended = True
        if self.flights.get(flight.key) is flight:
            del self.flights[flight.key]
            if not isinstance(ending, Landed):
                self.kept.discard(flight.key)  # ended with nothing newer to keep
        with contextlib.suppress(ValueError):
            self.detached.remove(flight)
        actions: list[_Action] = []
        for joiner in flight.joiners:
            if not joiner.ended:
                joiner.ended = True
                actions.append(self._put(joiner, ending))
        flight.joiners = []
        fresh, flight.fresh = flight.fresh, []
        for call in fresh:
            if not call.ended:
                actions += self._run(call, False, kept=False)
        return actions

    def _lose(self, call: FakeCall, lead: _FakeLead, reason: str) -> None:
        """(Outside the lock) ``call``'s lead lost its lease: its work hears it, and its
        group's table lets a new local call ask the fake (as a forget would)."""
        if lead.lose():
            call.detached()

    def _put(self, call: FakeCall, event: ScopeEvent) -> _Action:
        """(Under the lock) what delivers ``event`` to ``call`` later."""
        return call.key, lambda: self._deliver(call, event)

    def _deliver(self, call: FakeCall, event: ScopeEvent) -> None:
        with self.lock:
            kind = type(event)
            left = self.drops.get(kind, 0)
            if left:
                self.drops[kind] = left - 1
                return
            if kind is not Joined:  # its last event, or it leads now
                call.scope._waiting.discard(call)
        call.inbox.put(event)

    def _perform(self, actions: list[_Action]) -> None:
        """Run ``actions`` (outside the lock), except those a hold keeps back."""
        for key, action in actions:
            with self.lock:
                held = self.held.get(key)
                if held is None:
                    held = self.held.get(None)
                if held is not None:
                    held.append(action)
                    continue
            action()
