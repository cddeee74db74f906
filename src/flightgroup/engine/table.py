"""The in-process flight table of one group: key -> Flight, thread-safe.

Every method runs under the table's lock, touches no user code, and returns what the
caller must do after releasing it (decide under the lock, act after). It keeps the
invariants I1-I6 of ``engine/flight.py``; code that keeps one says so.

This is the process scope's table. A wide scope's (``scope.table.WideTable``) extends it
through the hooks named ``_on_...`` / ``_refuse`` below, each called only off the process
scope's hot path or as one call per settle.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, TypeVar

from .._log import log
from ..errors import GroupClosedError, TooManyFlightsError, TooManyWaitersError
from ..policy import NO_POLICY, FlightPolicy
from ..retention import RetentionStore
from ..stats import Recorder
from .flight import (
    DONE,
    IDLE,
    RETRY_PENDING,
    RUNNING,
    Attempt,
    Flight,
    Outcome,
    Result,
    Role,
    Signal,
    Waiter,
    _add_waiter,
    _blocks_its_loop,
    _calls_itself,
    _kept_flight,
    signal_of,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..policy import Retention

__all__ = ["UNMEASURED", "FlightTable"]

F = TypeVar("F", bound=Flight)

# The size of an outcome that could not be measured for Retention: it is not kept.
UNMEASURED: Final = -1

# Every table of this process, for a forked child (``_after_fork``).
_TABLES: weakref.WeakSet[FlightTable[Any]] = weakref.WeakSet()


def _after_fork() -> None:
    """(In a forked child) a lock another thread of the parent held at the fork stays
    held here for ever, and the flights copied from the parent's tables have no leader
    here (their threads and loops were not copied): a call that joined one would wait
    for ever. So every table gets a new lock and drops its flights (ADR 0030)."""
    for table in list(_TABLES):
        table._forked()


os.register_at_fork(after_in_child=_after_fork)


class FlightTable(Generic[F]):
    """The flight table of one group in this process: key -> Flight, thread-safe."""

    __slots__ = (
        "__weakref__",
        "_clock",
        "_evict_log_at",
        "_next_token",
        "closed",
        "detached",
        "flights",
        "kept",
        "lock",
        "stats",
    )

    # The class of the flights it makes (a wide table's carry what its scope adds).
    flight_type: ClassVar[type[Flight]] = Flight
    # Flights counted as a flight starts: a wide table counts one when its scope lets
    # the work run here (``ran_here``), never before (counters only grow).
    lead_counts: ClassVar[int] = 1

    def __init__(self) -> None:
        _TABLES.add(self)
        self.lock = threading.Lock()
        self.flights: dict[Hashable, F] = {}
        # flights that left the table by forget() but still run
        self.detached: set[F] = set()
        # kept outcomes (Retention): settled flights, made on the first one kept
        self.kept: RetentionStore | None = None
        self._clock: Callable[[], float] = time.monotonic
        self.stats = Recorder()
        self.closed = False
        self._next_token = 0
        self._evict_log_at = 0.0

    def _forked(self) -> list[F]:
        """(In a forked child, the only thread) see ``_after_fork``. Kept outcomes stay:
        they are values. Returns the flights dropped."""
        self.lock = threading.Lock()
        copied = [*self.flights.values(), *self.detached]
        self.flights = {}
        self.detached = set()
        for flight in copied:
            if flight.state is not IDLE and flight.state is not DONE:  # in ``in_flight``
                flight.forked = True
                self.stats.in_flight -= 1
        return copied

    def use_clock(self, clock: Callable[[], float]) -> None:
        """Drive retention with ``clock`` (tests use a fake one)."""
        with self.lock:
            self._clock = clock
            if self.kept is not None:
                self.kept._clock = clock

    # -- arriving -----------------------------------------------------------

    def arrive(
        self,
        tkey: Hashable,
        key: str,
        *,
        fresh: bool,
        make_waiter: Callable[[], Waiter],
        chain: Flight | None,
        blocking_loop: asyncio.AbstractEventLoop | None,
        policy: FlightPolicy = NO_POLICY,
    ) -> tuple[Role, F, Waiter | None]:
        """Decide lead, join, wait-for-end or kept for a new call of ``tkey``.

        ``chain`` is the flight whose work makes the call, if any (I6);
        ``blocking_loop`` is the event loop that this call would block while it
        waits (a sync call made on a loop's thread), or None; ``policy`` is the
        caller's, which a flight it leads keeps.
        """
        with self.lock:
            if self.closed:
                raise GroupClosedError()
            stats = self.stats
            flight = self.flights.get(tkey)
            if chain is not None or blocking_loop is not None:
                self._refuse(tkey, key, chain, blocking_loop)
            if flight is None:
                if self.kept is not None and not fresh:
                    entry = self.kept.get(tkey)
                    if entry is not None:
                        stats.calls += 1
                        stats.joins += 1
                        return Role.KEPT, _kept_flight(entry.payload), None  # type: ignore[return-value]
                if policy is not NO_POLICY:
                    self._check_flights(key, policy)
                stats.calls += 1
                stats.flights += self.lead_counts
                stats.in_flight += 1
                self._next_token += 1
                token = self._next_token
                made: F = self.flight_type(tkey, key, token, RUNNING)  # type: ignore[assignment]
                made.attempt = Attempt(made, token)
                made.started = time.perf_counter_ns()
                if policy is not NO_POLICY:
                    made.policy = policy
                self.flights[tkey] = made
                return Role.LEAD, made, None
            state = flight.state
            if state is IDLE:  # a flight that waits for its first leader
                stats.calls += 1
                self._lead(flight, policy)
                return Role.LEAD, flight, None
            if chain is not None and flight.in_chain_of(chain):  # I6
                raise _calls_itself(key)
            if blocking_loop is not None and flight.loop is blocking_loop:
                raise _blocks_its_loop(key)
            self._check_waiters(flight)
            stats.calls += 1
            waiter = make_waiter()
            if fresh:  # an IDLE flight was led above: this one is running
                self._on_waits_for_end(flight)
                if flight.fresh is None:
                    flight.fresh = [waiter]
                else:
                    flight.fresh.append(waiter)
                return Role.WAIT_END, flight, waiter
            _add_waiter(flight, waiter)
            flight.joiners += 1
            stats.joins += 1
            if stats.timing:
                flight.timed += 1
                flight.joined_ns += time.perf_counter_ns()
            return Role.JOIN, flight, waiter

    def take_kept(self, tkey: Hashable) -> Flight | Result[Any] | None:
        """The kept outcome of ``tkey`` if there is one and no flight of the key runs:
        the Result to return, or the settled flight to deliver from. The hot path of
        Retention, before ``arrive``."""
        with self.lock:
            if self.closed:
                raise GroupClosedError()
            kept = self.kept
            if kept is None or tkey in self.flights:
                return None
            entry = kept.get(tkey)
            if entry is None:
                return None
            stats = self.stats
            stats.calls += 1
            stats.joins += 1
            return entry.payload  # type: ignore[no-any-return]

    def _check_flights(self, key: str, policy: FlightPolicy) -> None:
        limits = policy.limits
        if (
            limits is not None
            and limits.max_flights is not None
            and len(self.flights) + len(self.detached) >= limits.max_flights
        ):
            raise TooManyFlightsError(key, limits.max_flights)

    def _check_waiters(self, flight: F) -> None:
        """Refuse a caller that would wait on ``flight`` past its ``max_waiters``: its
        joiners, its fresh callers (they wait for its end) and the pending claims of the
        fresh callers of the flight before it (they join it once they wake, and are
        never refused then) count, its leader not."""
        limits = flight.policy.limits
        if limits is not None and limits.max_waiters is not None:
            waiting = len(flight.waiters) + len(flight.fresh or ()) + flight.claims
            if flight.leader_waiter is not None and flight.leader_waiter in flight.waiters:
                waiting -= 1
            if waiting >= limits.max_waiters:
                raise TooManyWaitersError(flight.key, limits.max_waiters)

    def claim(
        self,
        flight: F,
        make_waiter: Callable[[], Waiter],
        policy: FlightPolicy,
        claimed: bool = True,
        counted: bool = False,
    ) -> tuple[Role, Waiter | None]:
        """A fresh caller takes its claim on ``flight`` (the flight after the one
        it waited for): lead it if nobody does, else join it, or take its
        outcome if it already ended (it started after the caller's call).
        ``claimed=False``: a caller promoted by ``ran_here`` joins the flight it
        waited on (it holds no claim: that flight was never IDLE). ``counted``: a
        joiner whose on_join waited for the scope's answer, already counted as one."""
        with self.lock:
            if claimed:
                flight.claims -= 1
            if self.closed:
                raise GroupClosedError()
            if flight.state is IDLE:
                self._lead(flight, policy)
                return Role.LEAD, None
            if flight.state is DONE:
                # I4: a flight with a pending claim is never abandoned.
                assert flight.outcome is not Outcome.ABANDONED
                if not counted:
                    self.stats.joins += 1
                return Role.TAKE, None
            waiter = make_waiter()
            _add_waiter(flight, waiter)
            if counted:
                return Role.JOIN, waiter
            flight.joiners += 1
            self.stats.joins += 1
            if self.stats.timing:
                flight.timed += 1
                flight.joined_ns += time.perf_counter_ns()
            return Role.JOIN, waiter

    def _lead(self, flight: F, policy: FlightPolicy) -> None:
        flight._move(IDLE, RUNNING)
        self._next_token += 1
        flight.token = self._next_token
        flight.attempt = Attempt(flight, flight.token)
        flight.policy = policy
        stats = self.stats
        stats.flights += self.lead_counts
        stats.in_flight += 1
        flight.started = time.perf_counter_ns()

    def release_claim(self, flight: F) -> None:
        """A caller told to claim ``flight`` withdrew instead (I4)."""
        with self.lock:
            flight.claims -= 1
            if flight.state is IDLE and flight.claims == 0:
                flight._move(IDLE, DONE)
                flight.outcome = Outcome.ABANDONED
                if self.flights.get(flight.tkey) is flight:  # I1
                    del self.flights[flight.tkey]
                self.detached.discard(flight)

    def give_up(self, flight: F, waiter: Waiter) -> None:
        """A caller stops waiting on ``flight`` (cancelled, interrupted): its waiter is
        withdrawn, or the claim on the next flight a takeover handed it is handed back
        (I4)."""
        if self.withdraw(flight, waiter) or not flight.taken_over:
            return
        following = flight.next
        if waiter in flight.taken_over and following is not None:
            self.release_claim(following)  # type: ignore[arg-type]  # (a flight of this table)

    def retakes(self, flight: F) -> bool:
        """``flight`` (settled) ended interrupted and a caller that finds it so, rather
        than being woken by its end, takes it over (``take_over``): a fresh or taking-over
        caller whose claim found it ended, or a leading caller that joined it elsewhere."""
        outcome = flight.outcome
        return (
            (outcome is Outcome.INTERRUPTED or outcome is Outcome.LOST)
            and flight.policy.takeover > flight.takeovers
            and not flight.closed
            and self._takes_over(flight)
        )

    def leader_takes_over(self, flight: F) -> bool:
        """``flight`` (settled) ended interrupted and its leading caller, a joiner of a
        flight led elsewhere that was not waiting when it ended, takes it over."""
        return self._leader_joins(flight) and self.retakes(flight)

    def take_over(
        self, flight: F, make_waiter: Callable[[], Waiter], policy: FlightPolicy
    ) -> tuple[Role, F, Waiter | None]:
        """A caller takes interrupted ``flight`` over (``retakes``) along its chain: the
        flight after it (made by the callers that took it over first, or by this call),
        else the key's flight of a later call, else a new one, which counts one takeover
        more. It leads that flight, joins it, or takes its outcome if it ended (and takes
        that one over in turn, while the chain has takeovers left)."""
        with self.lock:
            if self.closed:
                raise GroupClosedError()
            tkey = flight.tkey
            found = flight.next
            if found is not None and found.outcome is Outcome.ABANDONED:
                found = None  # (its claims were all handed back: it never ran)
            if found is None:
                found = self.flights.get(tkey)
            if found is None:
                made: F = self.flight_type(tkey, flight.key, 0, IDLE)  # type: ignore[assignment]
                self.flights[tkey] = made
                made.takeovers = flight.takeovers + 1
                self._made_to_take_over(flight, made)
                flight.next = found = made
            following: F = found  # type: ignore[assignment]
            if following.state is IDLE:
                self._lead(following, policy)
                return Role.LEAD, following, None
            if following.state is DONE:
                self.stats.joins += 1
                return Role.TAKE, following, None
            waiter = make_waiter()
            _add_waiter(following, waiter)
            following.joiners += 1
            self.stats.joins += 1
            return Role.JOIN, following, waiter

    def _made_to_take_over(self, flight: F, following: F) -> None:
        """(Under the lock) ``following`` was made to take interrupted ``flight`` over."""

    def wait_as_leader(self, flight: F, waiter: Waiter) -> bool:
        """Register the leader's own waiter; False if the flight already ended.

        Raises GroupClosedError if the group closed after the leader started.
        """
        with self.lock:
            if flight.state is DONE:
                return False
            if self.closed:
                raise GroupClosedError()
            _add_waiter(flight, waiter)
            flight.leader_waiter = waiter
            return True

    def withdraw(self, flight: F, waiter: Waiter) -> bool:
        """Remove a caller's waiter (timeout, cancel, on_join raised).

        True if it was removed: no signal will come (I3). False if a signal was
        already handed to it or is on its way.
        """
        with self.lock:
            if flight.waiters and flight.waiters.pop(waiter, False) is None:
                return True
            return self._withdraw_fresh(flight, waiter)

    def _withdraw_fresh(self, flight: F, waiter: Waiter) -> bool:
        """(Under the lock) withdraw ``waiter`` from the fresh callers of ``flight``."""
        fresh = flight.fresh
        if fresh is not None and waiter in fresh:
            fresh.remove(waiter)
            return True
        return False

    # -- running and settling -------------------------------------------------

    def retry_pending(self, flight: F) -> bool:
        """The attempt failed and another follows after a pause; False if the group
        closed (nobody waits any more: the flight ends with this failure)."""
        with self.lock:
            if self.closed:
                return False
            flight._move(RUNNING, RETRY_PENDING)
            return True

    def next_attempt(self, flight: F) -> Attempt | None:
        """Start the next attempt with a new token; None if the group closed."""
        with self.lock:
            if self.closed:
                return None
            flight._move(RETRY_PENDING, RUNNING)
            self._next_token += 1
            flight.token = self._next_token
            attempt = flight.attempt = Attempt(flight, flight.token)
            self.stats.flights += 1
            self._on_attempt(flight)
            return attempt

    def settle(
        self,
        flight: F,
        outcome: Outcome,
        value: Any,
        error: BaseException | None,
        data: bytes | None,
        size: int = 0,
    ) -> tuple[dict[Waiter, None], list[Waiter] | None] | None:
        """Record the outcome (I2) and detach the waiters to wake (I3). ``size`` is
        the outcome's size for Retention, measured by the caller outside the lock.

        Returns (waiters to wake with SETTLED, fresh waiters to wake with a claim
        on ``flight.next``), or None if the flight had already settled.
        """
        ended = time.perf_counter_ns()
        with self.lock:
            if flight.state is DONE:  # I2
                return None
            flight.outcome = outcome
            if value is not None:  # the class defaults are None: write only what is set
                flight.value = value
            if error is not None:
                flight.error = error
            if data is not None:
                flight.data = data
            flight.state = DONE  # from RUNNING, RETRY_PENDING or SETTLING
            flight.attempt = None  # the attempt points at its flight: no cycle to collect
            waiters = flight.waiters
            if waiters:
                flight.waiters = {}
            fresh = flight.fresh
            if fresh is not None:
                flight.fresh = None
            tkey = flight.tkey
            flights = self.flights
            current = flights.get(tkey) is flight
            if current:  # I1
                del flights[tkey]
                if flight.policy.keeps and not self.closed:
                    self._keep(flight, size)
                elif self.kept is not None:
                    # A newer outcome that is not kept: the key's older kept one (a
                    # fresh call led past it) must not be served after it.
                    self.kept.discard(tkey)
            elif self.detached:
                self.detached.discard(flight)  # a forgotten flight is never kept
            self._count_settled(flight, outcome, ended, flight.closed)
            if (
                waiters
                and current
                and (outcome is Outcome.INTERRUPTED or outcome is Outcome.LOST)
                and flight.policy.takeover > flight.takeovers
                and not self.closed
                and not flight.closed
            ):
                waiters, fresh = self._take_over(flight, waiters, fresh)
            if fresh and not self.closed:
                taking = self._next_for_fresh(flight, fresh, outcome)
                following = flight.next
                if flight.taken_over and following is not None:
                    # the bound on takeovers runs along the chain of flights taken over
                    following.takeovers = max(following.takeovers, flight.takeovers + 1)
                return waiters, taking
            return waiters, fresh

    def _take_over(
        self, flight: F, waiters: dict[Waiter, None], fresh: list[Waiter] | None
    ) -> tuple[dict[Waiter, None], list[Waiter] | None]:
        """(Under the lock) ``flight`` ended interrupted and its policy takes it over:
        its joiners do not raise FlightInterruptedError, they claim the flight after it
        with its fresh callers (the first claim leads it, the others join it, or take its
        outcome once it ended: one run for them all). Its leading caller is no joiner
        unless the flight joined one led elsewhere (``_leader_joins``). Returns the
        waiters still to wake with SETTLED and the callers to wake with a claim."""
        leader = flight.leader_waiter
        taking: list[Waiter] = []
        staying: dict[Waiter, None] = {}
        for waiter in waiters:
            if waiter is leader and not self._leader_joins(flight):
                staying[waiter] = None
            else:
                taking.append(waiter)
        if not taking or not self._takes_over(flight):
            return waiters, fresh
        flight.taken_over = frozenset(taking)
        return staying, [*(fresh or ()), *taking]

    def _leader_joins(self, flight: F) -> bool:
        """Its leading caller waits as a joiner (a wide flight that joined one led
        elsewhere): it takes the flight over with the others."""
        return False

    def _takes_over(self, flight: F) -> bool:
        """(Under the lock) whether an interrupted ``flight``'s callers may take it
        over (a wide flight the scope could not serve may not)."""
        return True

    def _count_settled(
        self, flight: F, outcome: Outcome, ended: int, closed: bool | None
    ) -> None:
        """(Under the lock) count a settled flight in the stats (``ended``: its end, in
        perf_counter_ns). ``closed``: its group closed while it ran, so it counts as
        interrupted; None: it counts as no flight at all (only out of ``in_flight``)."""
        stats = self.stats
        if flight.forked:
            pass  # counted out of in_flight at the fork (FlightTable._forked)
        elif closed is None:
            stats.in_flight -= 1
        else:
            if closed:
                # Its group closed while it ran: its callers got GroupClosedError and its
                # lease was lost, whatever the work did after.
                failed, interrupted, lost = False, True, True
            else:
                failed = outcome is Outcome.ERROR or outcome is Outcome.TIMEOUT
                lost = outcome is Outcome.LOST
                interrupted = lost or outcome is Outcome.INTERRUPTED
            stats.settled(
                failed, interrupted, lost, flight.joiners, (ended - flight.started) // 1000
            )
        timed = flight.timed
        if timed:
            # Each joiner's wait is its flight's mean joiner wait: the sum and the count
            # are exact, the spread within one flight is not kept.
            mean = (timed * ended - flight.joined_ns) // (timed * 1000)
            stats.wait_us.record(mean, timed)

    def _next_for_fresh(
        self, flight: F, fresh: list[Waiter], outcome: Outcome
    ) -> list[Waiter] | None:
        """(Under the lock) the fresh callers of settled ``flight`` claim the flight
        after it (made IDLE if none runs): returns them, to wake with that claim."""
        tkey = flight.tkey
        following = self.flights.get(tkey)
        if following is None:
            # Its token comes when it is led (_lead): a flight that starts later must
            # carry the larger token, even if it was made earlier.
            made: F = self.flight_type(tkey, flight.key, 0, IDLE)  # type: ignore[assignment]
            self.flights[tkey] = following = made
        following.claims += len(fresh)
        flight.next = following
        return fresh

    def _keep(self, flight: F, size: int) -> None:
        """Keep a settled flight's outcome for later calls (Retention)."""
        retention = flight.policy.retention
        assert retention is not None
        ok = flight.outcome is Outcome.VALUE
        ttl = retention.success if ok else retention.error
        # A timeout or an interruption teaches nothing worth keeping; either way the
        # key's older kept outcome (a fresh call led past it) is no longer its latest.
        if not ttl or (not ok and flight.outcome is not Outcome.ERROR) or size == UNMEASURED:
            if self.kept is not None:
                self.kept.discard(flight.tkey)
            return
        if self.kept is None:
            self.kept = RetentionStore(retention.max_items, retention.max_bytes, self._clock)
        flight.parent = None  # a kept flight holds its outcome, nothing else
        flight.task = None
        flight.loop = None
        # A kept value (without a codec) is kept as the one Result every call it serves
        # returns (ADR 0003); a failure, or encoded data, as the settled flight itself.
        payload: Flight | Result[Any] = flight
        if ok and flight.data is None:
            payload = Result(flight.value, True, flight.token)
        kept = self.kept
        evicted = kept.evicted
        # The flight's own bounds (an operation's Retention may differ from the group's).
        kept.put(
            flight.tkey, ok, payload, flight.token, ttl, size,
            (retention.max_items, retention.max_bytes),
        )
        if kept.evicted != evicted:
            self._evicted(kept, retention)

    def _evicted(self, kept: RetentionStore, retention: Retention) -> None:
        """Say (at most once a minute) that the bounds evict kept outcomes: a bound
        that is too small turns retention into a miss."""
        now = time.monotonic()
        if now < self._evict_log_at:
            return
        self._evict_log_at = now + 60.0
        log.info(
            "retention evicted %d kept outcomes so far (max_items=%d, max_bytes=%s); "
            "raise the bounds if later calls should find them", kept.evicted,
            retention.max_items, retention.max_bytes,
        )

    # -- the group ------------------------------------------------------------

    def forget(self, tkey: Hashable) -> None:
        """Detach the flight of ``tkey`` (it runs on for its callers); the next
        call leads a new flight."""
        with self.lock:
            self._forget(tkey)

    def _forget(self, tkey: Hashable) -> None:
        """(Under the lock) ``forget``."""
        if self.kept is not None:
            self.kept.discard(tkey)
        flight = self.flights.get(tkey)
        if flight is not None:
            # It runs on (or, if IDLE, its claimants still lead it) for the callers it
            # has; close() must still find it. Detached before it leaves: another
            # group's table may read both without this lock.
            self.detached.add(flight)
            del self.flights[tkey]

    def close(self) -> list[tuple[F, list[Waiter]]]:
        """Mark the group closed and detach every waiter; return them to wake
        with CLOSED, per flight (whose leases are then lost)."""
        with self.lock:
            if self.closed:
                return []
            self.closed = True
            result: list[tuple[F, list[Waiter]]] = []
            for flight in [*self.flights.values(), *self.detached]:
                flight.closed = True
                waiters = list(flight.waiters)
                if waiters:
                    flight.waiters = {}
                if flight.fresh:
                    waiters.extend(flight.fresh)
                    flight.fresh = None
                if flight.state is IDLE:
                    flight.claims = 0
                    flight._move(IDLE, DONE)
                    flight.outcome = Outcome.ABANDONED
                result.append((flight, waiters))
            self.flights.clear()
            self.detached.clear()
            if self.kept is not None:
                self.kept.clear()
            self._on_close(result)
            return result

    def snapshot(self) -> Any:
        """A Stats snapshot, taken under the lock."""
        with self.lock:
            kept = self.kept
            if kept is not None:
                kept.purge()
                self.stats.kept = len(kept)
            return self.stats.snapshot()

    def recorder(self, timing: bool = False) -> Recorder:
        """A copy of the counters and histograms, for an exporter; ``timing`` starts
        measuring joiners' waits from now on."""
        with self.lock:
            kept = self.kept
            if kept is not None:
                kept.purge()
                self.stats.kept = len(kept)
            if timing:
                self.stats.timing = True
            return self.stats.copy()

    # -- what a wide table adds (hooks; the process scope's are empty) ----------

    def _refuse(
        self,
        tkey: Hashable,
        key: str,
        chain: Flight | None,
        blocking_loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        """(Under the lock, for a call made by a work or on an event loop's thread)
        raise RuntimeError for a call that would wait for itself in a way this table's
        flights do not show (I6 across the groups of one scope)."""

    def _on_waits_for_end(self, flight: F) -> None:
        """(Under the lock) a fresh caller starts waiting for running ``flight``'s end."""

    def _on_attempt(self, flight: F) -> None:
        """(Under the lock) ``flight``'s next attempt began under a local token."""

    def _on_close(self, closed: list[tuple[F, list[Waiter]]]) -> None:
        """(Under the lock) the group closed: ``closed`` are its flights, detached."""

    def signal_of(self, flight: F, fresh_of: F | None, waiter: Waiter) -> Signal | Flight:
        """The signal ``waiter`` of ``flight`` was handed, read from the flight itself
        (valid once the waiter was detached, I3); ``fresh_of``: the flight whose end a
        fresh caller waited for, else None."""
        return signal_of(flight, fresh_of, waiter)

    def waited_on(self, flight: F, waiter: Waiter) -> F:
        """The flight the fresh caller ``waiter`` of ``flight`` waits on now."""
        return flight

