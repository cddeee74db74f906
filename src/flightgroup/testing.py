"""A fake wide scope, in memory, for tests: several "processes" are several FlightGroups
on one :class:`FakeCoordinator` (ADR 0034).

    from flightgroup import JSON, Retention
    from flightgroup.testing import FakeCoordinator

    fake = FakeCoordinator()
    a = fake.group(codec=JSON, retention=Retention(success=5))
    b = fake.group(codec=JSON)        # another "process" of the same group

The fake decides as the directory's coordinator does: one flight per key across all
its groups; a token per lead and per retry, growing within the coordinator; a call of
a key whose flight another group leads joins it and gets the landed outcome (a value
travels as the codec's bytes: every group decodes its own copy); ``fresh`` calls take
only a flight that began after them; kept outcomes under the leader's Retention (TTL on
the fake's own clock, LRU by items then bytes), served as joined; ``forget`` detaches the
running flight and drops the kept outcome; closing a group interrupts the flights it
leads for their joiners elsewhere.

Hooks force what real scopes suffer, each at a point the test chooses, never by time:
:meth:`FakeCoordinator.lose_lease`, :meth:`~FakeCoordinator.unreachable`,
:meth:`~FakeCoordinator.hold` (answers queued until released),
:meth:`~FakeCoordinator.drop_next`, :meth:`~FakeCoordinator.kill` (a process's death),
:meth:`~FakeCoordinator.advance` (the clock of kept outcomes).

Threads: the fake decides under its own lock and answers after releasing it, in the
thread that made the request (a submit is answered before it returns; a landing's
joiners elsewhere hear it from the leader's thread, and its ``done`` is called there
too, as the directory scope does). A hook answers from the test's thread.

What it does not model: key locks (a forgotten or closed group's work does not hold its
key: ``left_flights_hold_keys`` is False, as in the fleet), leases that run out with
time, lost or re-sent messages other than the hooks', failovers and rejoins, wire
limits (only an optional key length), protocol versions, forks (``on_fork`` is never
called: the fake has no thread to lose).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any

from .codec import Codec
from .configure import MAX_FRAME, configure
from .engine.workers import MAX_DEADLINE_THREADS
from .errors import GroupClosedError, UnavailableError
from .group import FlightGroup, internals
from .policy import Limits, Retention, Retry
from .retention import RetentionStore
from .scope.events import (
    Inbox,
    Joined,
    Landed,
    Lead,
    LeaseLost,
    NoOutcome,
    Refused,
    ScopeEvent,
)
from .scope.interface import DetachedNotice, Handed, LeadState, key_as_called
from .scope.outcome import Failure, Interrupted, SharedOutcome, Value, kept_size

if TYPE_CHECKING:
    from .engine.flight import Attempt

__all__ = ["FakeCall", "FakeCoordinator", "FakeScope"]

FAKE_MAX_VALUE = 1024 * 1024  # a fake group's default max_value_bytes (as the fleet's)
# The bounds of kept outcomes when a landing names none (the directory's own).
_KEPT_MAX_ITEMS = 10_000
_KEPT_MAX_BYTES = 256 * 1024 * 1024

_serials = itertools.count(1)  # names each coordinator (its groups' identity)

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


class FakeCall(DetachedNotice):
    """One submitted call (the :class:`~flightgroup.scope.interface.ScopeCall` of the
    fake): its inbox, and its lead while it leads. ``key``, ``fresh``, ``after`` and
    ``inbox`` are set once at submit; ``_lead``, ``flight`` and ``ended`` are written by
    the coordinator under its lock (``_lead`` once, before its Lead event is put)."""

    __slots__ = ("_lead", "after", "ended", "flight", "fresh", "inbox", "key", "scope")

    def __init__(
        self,
        scope: FakeScope,
        key: str,
        fresh: bool,
        after: int | None,
        on_detached: Callable[[], object] | None,
    ) -> None:
        super().__init__(on_detached)
        self.scope = scope
        self.key = key
        self.fresh = fresh
        self.after = after
        self.inbox = Inbox()
        self._lead: _FakeLead | None = None
        self.flight: _FakeFlight | None = None  # the flight it leads, joined or waits on
        self.ended = False  # it heard its last event (or was withdrawn)

    @property
    def lead(self) -> LeadState | None:
        """While this call leads: its lead; else None."""
        return self._lead


class FakeScope:
    """One group's side of a :class:`FakeCoordinator`: what a "process" asks it. Made
    by :meth:`FakeCoordinator.group` (or :meth:`FakeCoordinator.scope`); implements
    :class:`~flightgroup.scope.interface.Scope`."""

    def __init__(self, coordinator: FakeCoordinator, pid: int) -> None:
        self.coordinator = coordinator
        self.pid = pid  # a fake process id: Joined and status() name the leader by it
        self.on_fork: Callable[[str], None] | None = None  # never called (no fork here)
        self.closed = False
        self.killed = False
        self._started = False
        # Calls that have not heard their last event (nor lead): closing refuses them.
        # The coordinator's, under its lock.
        self._waiting: set[FakeCall] = set()

    @property
    def identity(self) -> Hashable:
        """The coordinator's: every group of one fake coordinator is one group (as two
        groups of this process on one directory are)."""
        return ("fake", self.coordinator.serial)

    @property
    def kind(self) -> str:
        """The scope's name in metrics and traces: "fake"."""
        return "fake"

    @property
    def label(self) -> str:
        """How a person reads the scope: its coordinator's number and the fake pid."""
        return f"fake scope #{self.coordinator.serial} (pid {self.pid})"

    @property
    def started(self) -> bool:
        """True once the group made its first call."""
        return self._started

    @property
    def left_flights_hold_keys(self) -> bool:
        """False: the fake has no key locks; once a forget is confirmed (at once), a new
        flight of the key leads beside the old one, as in the fleet scope."""
        return False

    def submit(
        self,
        key: str,
        *,
        fresh: bool,
        after: int | None = None,
        on_detached: Callable[[], object] | None = None,
    ) -> FakeCall:
        """Ask the fake to lead or join ``key``: answered in the inbox before this
        returns (unless held). Raises GroupClosedError once this scope closed,
        UnavailableError while the fake is unreachable or this "process" was killed,
        ValueError for a key over the fake's ``max_key_length``."""
        return self.coordinator._submit(self, key, fresh, after, on_detached)

    def bind(self, call: Any, attempt: Attempt) -> None:
        """``attempt``'s work runs under ``call``'s lead (it hears a loss)."""
        lead = call.lead
        assert lead is not None
        lead.bind(attempt)

    def retry(self, call: Any) -> None:
        """A new token for the lead's next attempt: Lead(token), or LeaseLost."""
        self.coordinator._retry(call)

    def land(
        self,
        call: Any,
        outcome: SharedOutcome | None,
        *,
        stragglers: list[threading.Event] | None = None,
        done: Callable[[Handed], None] | None = None,
    ) -> None:
        """Take the lead's outcome (None: its lease was lost, nothing lands); ``done``
        is told once the fake took it (Handed()) or refused it (fenced: the flight is no
        longer this lead's). ``stragglers`` are not waited for: no key lock."""
        self.coordinator._land(call, outcome, done)

    def withdraw(self, call: Any) -> None:
        """The driver stopped: a lead's flight ends for its joiners (NoOutcome), a
        joiner leaves its flight."""
        self.coordinator._withdraw(call)

    def forget(self, key: str) -> None:
        """The next call of ``key`` leads a new flight; the running one goes on,
        detached, for its callers (told by ``on_detached``); a kept outcome is dropped.
        Raises UnavailableError while the fake is unreachable."""
        self.coordinator._forget(self, key)

    def check_key(self, key: str) -> None:
        """Raises ValueError for a key over the coordinator's ``max_key_length``."""
        limit = self.coordinator.max_key_length
        if limit is not None and len(key) > limit:
            raise ValueError(f"the key ({len(key)} characters) is over the fake's limit ({limit})")

    def status(self) -> list[dict[str, Any]]:
        """The flights in progress (key, token, leader_pid, joiners, age_s); raises
        UnavailableError while the fake is unreachable, GroupClosedError once closed."""
        if self.closed:
            raise GroupClosedError()
        return self.coordinator._status(self)

    def report_left_threads(self, left: int, bound: int) -> None:
        """This "process" now has ``left`` threads past their deadlines (of ``bound``):
        kept by the coordinator (dropped at 0 and when this scope closes)."""
        self.coordinator._report_left(self, left, bound)

    def left_threads(self) -> list[dict[str, Any]]:
        """The "processes" with threads past their deadlines: pid, left_threads,
        max_deadline_threads. Raises GroupClosedError once closed."""
        if self.closed:
            raise GroupClosedError()
        return self.coordinator._left_threads()

    def close(self) -> None:
        """The flights this scope leads whose work has not ended are interrupted for
        their joiners elsewhere; its calls still waiting are refused (GroupClosedError),
        and so are its later submits. Returns at once: every landing was taken already."""
        self.coordinator._close(self, killed=False)


class FakeCoordinator:
    """The fake's one decision point, shared by the groups it makes (see the module).

    ``max_key_length``: longer keys are refused (ValueError), as a scope refuses a key
    it cannot carry. ``clock``: the time of kept outcomes, flight ages and status;
    by default the fake's own, which moves only by :meth:`advance`. ``serial`` names
    this coordinator (its groups' identity)."""

    def __init__(
        self,
        *,
        max_key_length: int | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.serial = next(_serials)
        self.max_key_length = max_key_length
        self._now = 0.0
        self._clock = clock if clock is not None else self._fake_time
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._pids = itertools.count(1)
        self._flights: dict[str, _FakeFlight] = {}
        self._detached: list[_FakeFlight] = []  # forgotten flights still running
        self._kept = RetentionStore(_KEPT_MAX_ITEMS, _KEPT_MAX_BYTES, clock=self._clock)
        self._unreachable = False
        self._held: dict[str | None, list[Callable[[], object]]] = {}
        self._drops: dict[type[ScopeEvent], int] = {}
        # each scope's threads past their deadlines: (left, bound), while left > 0
        self._left: dict[FakeScope, tuple[int, int]] = {}

    # -- making groups -----------------------------------------------------------

    def scope(self, pid: int | None = None) -> FakeScope:
        """A new "process" of this coordinator (``pid``: its fake process id; by
        default the next of 1, 2, 3, ...)."""
        return FakeScope(self, next(self._pids) if pid is None else pid)

    def group(
        self,
        *,
        codec: Codec | None,
        deadline: float | None = None,
        retry: Retry | None = None,
        retention: Retention | None = None,
        limits: Limits | None = None,
        max_value_bytes: int | None = None,
        max_deadline_threads: int = MAX_DEADLINE_THREADS,
        pid: int | None = None,
    ) -> FlightGroup:
        """A FlightGroup over a new "process" of this coordinator. Arguments as
        FlightGroup's (checked the same way); a codec is needed, as in every wide scope;
        ``max_value_bytes`` defaults to 1 MiB (the fleet's)."""
        if codec is None:
            raise TypeError("a fake group needs a codec (for example codec=flightgroup.JSON)")
        made = configure(
            directory=None, redis=None, namespace=None, codec=codec, deadline=deadline,
            retry=retry, retention=retention, limits=limits, max_value_bytes=max_value_bytes,
            lease=10.0, cluster=False, reconnect_timeout=5.0, max_frame_bytes=MAX_FRAME,
            max_deadline_threads=max_deadline_threads,
        )
        scope = self.scope(pid)
        return FlightGroup._over(dataclasses.replace(
            made,
            scope=scope,
            max_value_bytes=FAKE_MAX_VALUE if max_value_bytes is None else max_value_bytes,
            named=f"fake.group(pid={scope.pid})",
        ))

    @staticmethod
    def scope_of(group: FlightGroup) -> FakeScope:
        """The fake scope ``group`` was made over (TypeError for any other group)."""
        scope = internals(group).scope
        if not isinstance(scope, FakeScope):
            raise TypeError("this group is not a fake group")
        return scope

    # -- hooks -------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the fake's own clock (kept outcomes expire by it) ``seconds`` on."""
        with self._lock:
            self._now += seconds

    def unreachable(self, flag: bool = True) -> None:
        """While set, the fake cannot be heard: every submit, forget and status raises
        UnavailableError (the call's callers get it). Leads and joins already made go on."""
        with self._lock:
            self._unreachable = flag

    @contextlib.contextmanager
    def hold(self, key: str | None = None) -> Iterator[None]:
        """Within the block, the fake still decides at once, but its answers about
        ``key`` (every key when None) wait: events and a landing's ``done``. They are
        delivered, in order, when the block ends."""
        with self._lock:
            if key in self._held:
                raise RuntimeError(f"{key!r} is held already")
            self._held[key] = []
        try:
            yield
        finally:
            self.release(key)

    def release(self, key: str | None = None) -> None:
        """Deliver what a :meth:`hold` of ``key`` kept back, and stop holding it."""
        with self._lock:
            queued = self._held.pop(key, [])
        for action in queued:
            action()

    def drop_next(self, kind: type[ScopeEvent], count: int = 1) -> None:
        """The next ``count`` events of class ``kind`` (Joined, Landed, ...) put to any
        call are lost: a call whose last event is dropped waits until its group closes."""
        with self._lock:
            self._drops[kind] = self._drops.get(kind, 0) + count

    def lose_lease(self, key: str) -> int:
        """The lead of ``key``'s running flight loses its lease now: its work hears it
        (``lease.lost``), its landing is refused (its callers: LeaseLostError, local
        joiners FlightInterruptedError), joiners elsewhere get NoOutcome; the key is free
        for a new flight. Returns the lost flight's token; LookupError if none runs."""
        with self._lock:
            flight = self._flights.get(key)
            if flight is None:
                raise LookupError(f"no flight of {key!r} runs in the fake")
            actions = self._end_flight(flight, NoOutcome("its leader lost its lease"))
        lead = flight.leader._lead
        assert lead is not None
        self._lose(flight.leader, lead, "its lease was lost")
        self._perform(actions)
        return flight.token

    def kill(self, group: FlightGroup | FakeScope) -> None:
        """``group``'s "process" dies: the flights it leads end for their joiners
        elsewhere (NoOutcome), its leads lose their leases, its waiting calls end
        (UnavailableError, or NoOutcome for a joined one), its later calls raise
        UnavailableError. Its work, if running, runs on unheard."""
        scope = group if isinstance(group, FakeScope) else self.scope_of(group)
        self._close(scope, killed=True)

    def _report_left(self, scope: FakeScope, left: int, bound: int) -> None:
        with self._lock:
            if left and not scope.closed:
                self._left[scope] = (left, bound)
            else:
                self._left.pop(scope, None)

    def _left_threads(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {"pid": scope.pid, "left_threads": left, "max_deadline_threads": bound}
                for scope, (left, bound) in self._left.items()
            ]

    def status(self) -> list[dict[str, Any]]:
        """The flights in progress, as a scope's ``status()`` says them (for tests)."""
        with self._lock:
            return self._flights_now()

    def kept(self, key: str) -> bool:
        """True if an outcome of ``key`` is kept and live now (not counted as a use)."""
        with self._lock:
            # Read past get(): a look from a test must not count as a use (LRU).
            entry = self._kept._entries.get(key)
            return entry is not None and self._clock() < entry.expires

    # -- what scopes ask (any thread) ------------------------------------------------

    def _fake_time(self) -> float:
        return self._now

    def _submit(
        self,
        scope: FakeScope,
        key: str,
        fresh: bool,
        after: int | None,
        on_detached: Callable[[], object] | None,
    ) -> FakeCall:
        if scope.closed and not scope.killed:
            raise GroupClosedError()
        if scope.killed:
            raise UnavailableError(f"the fake process {scope.pid} was killed")
        scope.check_key(key)
        with self._lock:
            if self._unreachable:
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
        flight = self._flights.get(key)
        if flight is not None:
            if fresh and (after is None or flight.first <= after):
                flight.fresh.append(call)  # it began before the call: the next one
                call.flight = flight
                return []
            return self._join(flight, call)
        if kept and (not fresh or after is not None):
            entry = self._kept.get(key)  # a hit is a use (LRU); an expired one goes
            if entry is not None and (after is None or entry.token > after):
                call.ended = True
                return [self._put(call, Landed(entry.token, entry.payload, kept=True))]
        token = next(self._tokens)
        flight = _FakeFlight(key, token, call, self._clock())
        self._flights[key] = flight
        call.flight = flight
        call._lead = _FakeLead(flight)
        return [self._put(call, Lead(token))]

    def _join(self, flight: _FakeFlight, call: FakeCall) -> list[_Action]:
        flight.joiners.append(call)
        call.flight = flight
        age = self._clock() - flight.started
        return [self._put(call, Joined(flight.token, flight.leader.scope.pid, age))]

    def _retry(self, call: FakeCall) -> None:
        lead = call._lead
        assert lead is not None
        with self._lock:
            flight = lead.flight
            if lead.lost or flight.ended or call.scope.closed:
                actions = [self._put(call, LeaseLost("lost"))]
            else:
                flight.token = next(self._tokens)
                # Joiners hear the new token (as the fleet's do): Joined again.
                age = self._clock() - flight.started
                pid = call.scope.pid
                actions = [self._put(call, Lead(flight.token))]
                actions += [
                    self._put(joiner, Joined(flight.token, pid, age)) for joiner in flight.joiners
                ]
        self._perform(actions)

    def _land(
        self,
        call: FakeCall,
        outcome: SharedOutcome | None,
        done: Callable[[Handed], None] | None,
    ) -> None:
        lead = call._lead
        assert lead is not None
        with lead.lock:
            lead.work_done = True
            lost = lead.lost
        with self._lock:
            flight = lead.flight
            call.ended = True
            if outcome is None or lost or flight.ended:
                # Nothing lands: the flight is no longer this lead's (its end was told).
                actions = [] if flight.ended else self._end_flight(
                    flight, NoOutcome("its leader lost its lease")
                )
                fenced = True
            else:
                current = self._flights.get(flight.key) is flight
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
                    self._kept.discard(flight.key)
                fenced = False
            if done is not None:
                actions.append((call.key, lambda: done(Handed(fenced=fenced))))
        self._perform(actions)

    def _keep(self, flight: _FakeFlight, outcome: Value | Failure, seconds: float) -> None:
        max_items = outcome.max_items if outcome.max_items is not None else _KEPT_MAX_ITEMS
        max_bytes = outcome.max_bytes if outcome.max_bytes is not None else _KEPT_MAX_BYTES
        self._kept.put(
            flight.key, isinstance(outcome, Value), outcome, flight.token, seconds,
            kept_size(outcome), (max_items, max_bytes),
        )

    def _withdraw(self, call: FakeCall) -> None:
        with self._lock:
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

    def _forget(self, scope: FakeScope, key: str) -> None:
        with self._lock:
            if self._unreachable:
                raise UnavailableError(f"the fake scope is unreachable: cannot forget {key!r}")
            self._kept.discard(key)
            flight = self._flights.pop(key, None)
            told: list[FakeCall] = []
            if flight is not None:
                flight.detached = True
                self._detached.append(flight)
                told = [flight.leader, *flight.joiners]
        for each in told:  # the engine's callback: outside the lock
            each.detached()

    def _status(self, scope: FakeScope) -> list[dict[str, Any]]:
        with self._lock:
            if self._unreachable:
                raise UnavailableError("the fake scope is unreachable")
            return self._flights_now()

    def _flights_now(self) -> list[dict[str, Any]]:
        now = self._clock()
        return [
            {
                "key": key_as_called(flight.key),
                "token": flight.token,
                "leader_pid": flight.leader.scope.pid,
                "joiners": len(flight.joiners),
                "age_s": round(now - flight.started, 3),
            }
            for flight in (*self._flights.values(), *self._detached)
        ]

    def _close(self, scope: FakeScope, *, killed: bool) -> None:
        with self._lock:
            if scope.closed and not (killed and not scope.killed):
                return
            scope.closed = True
            scope.killed = scope.killed or killed
            self._left.pop(scope, None)
            actions: list[_Action] = []
            losing: list[tuple[FakeCall, _FakeLead]] = []
            flights = [*self._flights.values(), *self._detached]
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

    # -- inside --------------------------------------------------------------------

    def _end_flight(self, flight: _FakeFlight, ending: ScopeEvent) -> list[_Action]:
        """(Under the lock) ``flight`` ends: its joiners hear ``ending``, its fresh
        waiters lead or join the key's next flight (a kept outcome never serves them)."""
        flight.ended = True
        if self._flights.get(flight.key) is flight:
            del self._flights[flight.key]
            if not isinstance(ending, Landed):
                self._kept.discard(flight.key)  # ended with nothing newer to keep
        with contextlib.suppress(ValueError):
            self._detached.remove(flight)
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
        with self._lock:
            kind = type(event)
            left = self._drops.get(kind, 0)
            if left:
                self._drops[kind] = left - 1
                return
            if kind is not Joined:  # its last event, or it leads now
                call.scope._waiting.discard(call)
        call.inbox.put(event)

    def _perform(self, actions: list[_Action]) -> None:
        """Run ``actions`` (outside the lock), except those a hold keeps back."""
        for key, action in actions:
            with self._lock:
                held = self._held.get(key)
                if held is None:
                    held = self._held.get(None)
                if held is not None:
                    held.append(action)
                    continue
            action()
