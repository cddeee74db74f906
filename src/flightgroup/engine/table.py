"""The in-process flight table of one group: key -> Flight, thread-safe.

Every method runs under the table's lock, touches no user code, and returns what the
caller must do after releasing it (decide under the lock, act after). It keeps the
invariants I1-I6 of ``engine/flight.py``; code that keeps one says so.

This module owns what a call meets (lead, join, wait for the end, a kept outcome), a
caller's wait, an attempt's run and its settling, forget, close and the fork. The table
is made of parts, one concern each, that add no field (``tablestate.py``): fresh callers
and their claims (``fresh.py``), takeovers (``takeover.py``), kept outcomes
(``kept.py``).

This is the process scope's table. A wide scope's (``scope.table.WideTable``) extends it
through the hooks named ``_on_...`` / ``_refuse`` here and in its parts, each called only
off the process scope's hot path or as one call per settle.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Final

from ..errors import GroupClosedError, TooManyFlightsError, TooManyWaitersError
from ..policy import NO_POLICY, FlightPolicy, Limits
from ..stats import FOLD_AT, Recorder
from .flight import (
    DONE,
    ERROR,
    IDLE,
    INTERRUPTED,
    JOIN,
    KEPT,
    LEAD,
    LOST,
    RETRY_PENDING,
    RUNNING,
    TIMEOUT,
    VALUE,
    WAIT_END,
    Attempt,
    Counts,
    Flight,
    Outcome,
    Role,
    Signal,
    Waiter,
    _blocks_its_loop,
    _calls_itself,
    signal_of,
)
from .fresh import FreshCallers
from .kept import UNMEASURED, KeptOutcomes
from .tablestate import F
from .takeover import TakeOvers

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["UNMEASURED", "FlightTable"]

# How most flights count (a name read on every settle, not an attribute of the enum).
_BY_OUTCOME: Final = Counts.OUTCOME
_new = object.__new__

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


class FlightTable(FreshCallers[F], TakeOvers[F], KeptOutcomes[F]):
    """The flight table of one group in this process: key -> Flight, thread-safe."""

    __slots__ = ()

    def __init__(self) -> None:
        _TABLES.add(self)
        self.lock = threading.Lock()
        self.flights = {}
        self.detached = set()
        self.kept = None
        self._clock = time.monotonic
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
                flight.counts = Counts.FORKED
                self.stats.in_flight -= 1
        return copied

    # -- arriving -----------------------------------------------------------

    def arrive(
        self, tkey: Hashable, key: str, *, fresh: bool, make_waiter: Callable[[], Waiter],
        chain: Flight | None, blocking_loop: asyncio.AbstractEventLoop | None,
        policy: FlightPolicy = NO_POLICY,
    ) -> tuple[Role, F, Waiter | None]:
        """Decide lead, join, wait-for-end or kept for a new call of ``tkey``.

        ``chain`` is the flight whose work makes the call, if any (I6);
        ``blocking_loop`` is the event loop that this call would block while it
        waits (a sync call made on a loop's thread), or None; ``policy`` is the
        caller's, which a flight it leads keeps. A leader gets no waiter: its work
        starts eagerly, and it registers one (``wait_as_leader``) only if the work
        suspended.
        """
        with self.lock:
            if self.closed:
                raise GroupClosedError()
            stats = self.stats
            flight = self.flights.get(tkey)
            if chain is not None or blocking_loop is not None:
                self._refuse(tkey, key, chain, blocking_loop)
            if flight is None:
                if self.kept is not None and not fresh and (served := self._serve_kept(tkey)):
                    return KEPT, served, None  # type: ignore[return-value]
                if policy.limits is not None:
                    self._check_flights(key, policy.limits)
                stats.calls += 1
                stats.flights += self.lead_counts
                stats.in_flight += 1
                self._next_token += 1
                token = self._next_token
                # Flight(tkey, key, token, RUNNING) and Attempt(made, token), without
                # their two Python frames: the miss path makes one of each.
                made: F = _new(self.flight_type)  # type: ignore[assignment]
                made.tkey, made.key, made.token, made.state = tkey, key, token, RUNNING
                attempt = made.attempt = _new(Attempt)
                attempt.flight, attempt.token = made, token
                made.started = time.perf_counter_ns()
                if policy is not NO_POLICY:
                    made.policy = policy
                self.flights[tkey] = made
                return LEAD, made, None
            state = flight.state
            if state is IDLE:  # a flight that waits for its first leader
                stats.calls += 1
                self._lead(flight, policy)
                return LEAD, flight, None
            if chain is not None and flight.in_chain_of(chain):  # I6
                raise _calls_itself(key)
            if blocking_loop is not None and flight.loop is blocking_loop:
                raise _blocks_its_loop(key)
            if flight.policy.limits is not None:
                self._check_waiters(flight)
            stats.calls += 1
            waiter = make_waiter()
            if fresh:  # an IDLE flight was led above: this one is running
                self._wait_for_end(flight, waiter)
                return WAIT_END, flight, waiter
            waiters = flight.waiters
            if waiters:
                waiters[waiter] = None
            else:  # _add_waiter's first waiter: the class's shared empty dict is not written
                flight.waiters = {waiter: None}
            flight.joiners += 1
            stats.joins += 1
            if stats.timing:
                flight.timed += 1
                flight.joined_ns += time.perf_counter_ns()
            return JOIN, flight, waiter

    def _check_flights(self, key: str, limits: Limits) -> None:
        if (
            limits.max_flights is not None
            and len(self.flights) + len(self.detached) >= limits.max_flights
        ):
            raise TooManyFlightsError(key, limits.max_flights)

    def _check_waiters(self, flight: F) -> None:
        """Refuse a caller that would wait on ``flight`` past its ``max_waiters``: its
        joiners, its fresh callers (they wait for its end) and the pending claims of the
        fresh callers of the flight before it (they join it once they wake, and are
        never refused then) count, its leader not."""
        limits = flight.policy.limits
        if (
            limits is not None
            and limits.max_waiters is not None
            and self._waiting(flight) >= limits.max_waiters
        ):
            raise TooManyWaitersError(flight.key, limits.max_waiters)

    def _waiting(self, flight: F) -> int:
        """(Under the lock) the callers of ``flight`` that count against max_waiters."""
        return len(flight.waiters) + len(flight.fresh or ()) + flight.claims

    def give_up(self, flight: F, waiter: Waiter) -> None:
        """A caller stops waiting on ``flight`` (cancelled, interrupted): its waiter is
        withdrawn, or the claim on the next flight a takeover handed it is handed back
        (I4)."""
        if self.withdraw(flight, waiter) or not flight.taken_over:
            return
        following = flight.next
        if waiter in flight.taken_over and following is not None:
            self.release_claim(following)  # type: ignore[arg-type]  # (a flight of this table)

    def wait_as_leader(self, flight: F, waiter: Waiter) -> bool:
        """Register the leader's own waiter; False if the flight already ended.

        Raises GroupClosedError if the group closed after the leader started.
        """
        with self.lock:
            if flight.state is DONE:
                return False
            if self.closed:
                raise GroupClosedError()
            flight.leader_waiter = flight.leading = waiter
            return True

    def withdraw(self, flight: F, waiter: Waiter) -> bool:
        """Remove a caller's waiter (timeout, cancel, on_join raised).

        True if it was removed: no signal will come (I3). False if a signal was
        already handed to it or is on its way.
        """
        with self.lock:
            if waiter is flight.leading:
                flight.leading = None
                return True
            if flight.waiters and flight.waiters.pop(waiter, False) is None:
                return True
            return self._withdraw_fresh(flight, waiter)

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

        Returns (waiters to wake with SETTLED: the joiners, then the leader if it
        waits; fresh waiters to wake with a claim on ``flight.next``), or None if the
        flight had already settled.
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
            leading = flight.leading
            if leading is not None:
                flight.leading = None
                if waiters:
                    waiters[leading] = None  # (detached above)
                else:
                    waiters = {leading: None}
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
            if outcome is VALUE and flight.counts is _BY_OUTCOME and not flight.timed:
                # The common ending, counted as _count_settled would, without its two
                # frames (Recorder.settled's body for a flight that returned).
                stats = self.stats
                stats.in_flight -= 1
                durations = stats.durations
                durations.append((ended - flight.started) // 1000)
                if flight.joiners:
                    stats.joins_of_flights.append(flight.joiners)
                if len(durations) >= FOLD_AT:
                    stats.fold()
            else:
                self._count_settled(flight, outcome, ended)
            if (
                waiters
                and current
                and (outcome is INTERRUPTED or outcome is LOST)
                and flight.policy.takeover > flight.takeovers
                and not self.closed
                and not flight.closed
            ):
                waiters, fresh = self._take_over(flight, waiters, fresh)
            if fresh and not self.closed:
                return waiters, self._claim_next(flight, fresh, outcome)
            return waiters, fresh

    def _count_settled(self, flight: F, outcome: Outcome, ended: int) -> None:
        """(Under the lock) count a settled flight in the stats as its table decided
        (``flight.counts``); ``ended``: its end, in perf_counter_ns."""
        stats = self.stats
        counts = flight.counts
        if counts is _BY_OUTCOME:
            failed = outcome is ERROR or outcome is TIMEOUT
            lost = outcome is LOST
            interrupted = lost or outcome is INTERRUPTED
            stats.settled(
                failed, interrupted, lost, flight.joiners, (ended - flight.started) // 1000
            )
        elif counts is Counts.CLOSED:
            # Its group closed while it ran: its callers got GroupClosedError and its
            # lease was lost, whatever the work did after.
            stats.settled(False, True, True, flight.joiners, (ended - flight.started) // 1000)
        elif counts is Counts.NOTHING:
            stats.in_flight -= 1  # no flight: only out of in_flight
        # (FORKED: counted out of in_flight at the fork, ``_forked``)
        timed = flight.timed
        if timed:
            # Each joiner's wait is its flight's mean joiner wait: the sum and the count
            # are exact, the spread within one flight is not kept.
            mean = (timed * ended - flight.joined_ns) // (timed * 1000)
            stats.wait_us.record(mean, timed)

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
                if flight.counts is Counts.OUTCOME:
                    flight.counts = self._closed_counts(flight)
                waiters = list(flight.waiters)
                if waiters:
                    flight.waiters = {}
                if flight.leading is not None:
                    waiters.append(flight.leading)
                    flight.leading = None
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

    def _on_attempt(self, flight: F) -> None:
        """(Under the lock) ``flight``'s next attempt began under a local token."""

    def _on_close(self, closed: list[tuple[F, list[Waiter]]]) -> None:
        """(Under the lock) the group closed: ``closed`` are its flights, detached."""

    def _closed_counts(self, flight: F) -> Counts:
        """(Under the lock, ``close``) how ``flight``, running as its group closes, counts
        once settled: as interrupted, its lease lost (CLOSED)."""
        return Counts.CLOSED

    def signal_of(self, flight: F, fresh_of: F | None, waiter: Waiter) -> Signal | Flight:
        """The signal ``waiter`` of ``flight`` was handed, read from the flight itself
        (valid once the waiter was detached, I3); ``fresh_of``: the flight whose end a
        fresh caller waited for, else None."""
        return signal_of(flight, fresh_of, waiter)

    def waited_on(self, flight: F, waiter: Waiter) -> F:
        """The flight the fresh caller ``waiter`` of ``flight`` waits on now."""
        return flight

