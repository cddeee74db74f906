"""Counters and bounded histograms behind ``FlightGroup.stats()``.

The recorder is written only under the group's table lock, inside critical
sections the hot path takes anyway, so counting adds no lock of its own.
Histograms are log-linear with a fixed number of buckets: memory stays bounded
whatever the traffic, and a percentile is exact to within one bucket (1/16 of
its power of two, about 6%). A settled flight's two samples (its joiners, its
duration) are appended to short lists and folded into their histograms in batches of
repeated values, before any read: two appends cost a miss less than two bucket
lookups, and flights of one workload repeat the same few values.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass

__all__ = ["Histogram", "Recorder", "Stats"]


@dataclass(frozen=True, slots=True)
class Stats:
    """A snapshot of one group's counters, as this group sees them (in the wide scopes,
    a call of a flight led elsewhere is a join here, and that flight's failure or
    interruption is counted here too: docs/observability.md).

    ``calls``: calls made; ``flights``: times a work ran (attempts included);
    ``joins``: calls that joined a flight or were served a kept outcome;
    ``failures``: flights whose work failed or timed out; ``interrupted``: flights that
    ended with no outcome; ``in_flight``: flights running now; ``kept``: outcomes kept
    for later calls; ``coalescing_ratio``: flights / calls (0.0 before any call);
    ``joiners_*``: joiners per flight; ``flight_seconds_*``: how long flights ran;
    ``threads``: the group's kept threads alive now (on which sync attempts under a
    deadline run, idle ones included); ``deadline_threads``: those of them running a
    work now, in time or past its deadline; ``left_threads``: those whose work ran past
    its deadline and has not returned yet; ``max_deadline_threads``: the group's bound on
    ``deadline_threads``, and so on ``left_threads`` (ADR 0038);
    ``local_flights``: flights a wide group led in this process alone because its scope
    could not be reached (``on_unavailable="local"``; also counted in ``flights``).
    """

    calls: int
    flights: int
    joins: int
    failures: int
    interrupted: int
    in_flight: int
    kept: int
    coalescing_ratio: float
    joiners_p50: float
    joiners_p99: float
    joiners_max: int
    flight_seconds_p50: float
    flight_seconds_p99: float
    threads: int = 0
    deadline_threads: int = 0
    left_threads: int = 0
    max_deadline_threads: int = 0
    local_flights: int = 0


_SUB_BITS = 4
_SUB = 1 << _SUB_BITS  # buckets per power of two
_MAX_EXP = 48  # about 2**52 at most: 140 years in microseconds
_LAST = (_MAX_EXP + 1) * _SUB - 1


class Histogram:
    """A log-linear histogram of non-negative integers with bounded memory."""

    __slots__ = ("_counts", "count", "max", "total")

    def __init__(self) -> None:
        self._counts = [0] * ((_MAX_EXP + 1) * _SUB)
        self.count = 0
        self.max = 0
        self.total = 0  # the sum of the observations (exact)

    @staticmethod
    def _lower(index: int) -> int:
        if index < _SUB:
            return index
        exp = index // _SUB - 1
        return (_SUB | (index % _SUB)) << exp

    def record(self, value: int, times: int = 1) -> None:
        """Count ``times`` observations of ``value`` (clamped at 0). Inlined: it
        runs twice per flight under the table lock."""
        if value < _SUB:
            index = value if value > 0 else 0
        else:
            exp = value.bit_length() - _SUB_BITS - 1
            index = ((exp + 1) << _SUB_BITS) + ((value >> exp) & (_SUB - 1))
            if index > _LAST:
                index = _LAST
        self._counts[index] += times
        self.count += times
        if value > 0:
            self.total += value * times
        if value > self.max:
            self.max = value

    def copy(self) -> Histogram:
        """A copy (for an exporter; take it under the group's lock)."""
        made = Histogram.__new__(Histogram)
        made._counts = list(self._counts)
        made.count, made.max, made.total = self.count, self.max, self.total
        return made

    def at_most(self, bound: int) -> int:
        """How many observations were at most ``bound`` (to within one bucket: a
        bucket counts when its lower bound is at most ``bound``)."""
        if bound < 0:
            return 0
        seen = 0
        for index, count in enumerate(self._counts):
            if self._lower(index) > bound:
                break
            seen += count
        return seen

    def cumulative(self, bounds: list[int]) -> list[int]:
        """``[self.at_most(bound) for bound in bounds]`` (``bounds`` ascending) in one
        pass over the buckets."""
        counts = self._counts
        made: list[int] = []
        seen = 0
        index = 0
        for bound in bounds:
            if bound < 0:
                made.append(0)
                continue
            end = bisect.bisect_right(_LOWERS, bound, lo=index)
            seen += sum(counts[index:end])
            index = end
            made.append(seen)
        return made

    def percentile(self, fraction: float) -> int:
        """The smallest bucket's lower bound at or above ``fraction`` of the counts."""
        if self.count == 0:
            return 0
        rank = max(1, int(fraction * self.count + 0.999999))
        seen = 0
        for index, count in enumerate(self._counts):
            seen += count
            if seen >= rank:
                return min(self._lower(index), self.max)
        return self.max


# Each bucket's lower bound, by index (ascending).
_LOWERS: tuple[int, ...] = tuple(Histogram._lower(index) for index in range(_LAST + 1))

FOLD_AT = 1024
"""How many settled flights' samples wait, at most, before they are folded into the
histograms (a bound on the lists' memory)."""


class Recorder:
    """The mutable counters of one group. Written under the group's lock only."""

    __slots__ = (
        "calls",
        "durations",
        "failures",
        "flight_us",
        "flights",
        "in_flight",
        "interrupted",
        "joiners",
        "joins",
        "joins_of_flights",
        "kept",
        "lease_losses",
        "local_flights",
        "timing",
        "wait_us",
    )

    def __init__(self) -> None:
        self.calls = 0
        self.flights = 0
        self.joins = 0
        self.failures = 0
        self.interrupted = 0
        self.lease_losses = 0
        self.local_flights = 0
        self.in_flight = 0
        self.kept = 0
        self.joiners = Histogram()
        self.flight_us = Histogram()
        # Settled flights' samples not yet folded into ``flight_us`` and ``joiners``: each
        # flight's duration, and the joiners of those that had any (the others had 0).
        self.durations: list[int] = []
        self.joins_of_flights: list[int] = []
        # Joiners' waits, measured only once an exporter asked (``timing``): a clock
        # read per join is a cost the herd's hot path does not pay otherwise.
        self.timing = False
        self.wait_us = Histogram()

    def settled(
        self, failed: bool, interrupted: bool, lost: bool, joiners: int, micros: int
    ) -> None:
        """Count a flight that ended: one call, under the group's lock."""
        self.in_flight -= 1
        if failed:
            self.failures += 1
        elif interrupted:
            self.interrupted += 1
            if lost:
                self.lease_losses += 1
        durations = self.durations
        durations.append(micros)
        if joiners:
            self.joins_of_flights.append(joiners)
        if len(durations) >= FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Fold the waiting samples into the histograms (under the group's lock; before
        every read of ``flight_us`` or ``joiners``)."""
        durations, joins = self.durations, self.joins_of_flights
        if not durations:
            return
        flight_us, joiners = self.flight_us, self.joiners
        for value, times in Counter(durations).items():
            flight_us.record(value, times)
        without = len(durations) - len(joins)
        if without:
            joiners.record(0, without)
        for value, times in Counter(joins).items():
            joiners.record(value, times)
        durations.clear()
        joins.clear()

    def copy(self) -> Recorder:
        """A copy of every counter and histogram (for an exporter; under the lock)."""
        self.fold()
        made = Recorder()
        for name in ("calls", "flights", "joins", "failures", "interrupted", "lease_losses",
                     "local_flights", "in_flight", "kept", "timing"):
            setattr(made, name, getattr(self, name))
        made.joiners = self.joiners.copy()
        made.flight_us = self.flight_us.copy()
        made.wait_us = self.wait_us.copy()
        return made

    def snapshot(self) -> Stats:
        """A frozen copy; call it under the group's lock."""
        self.fold()
        return Stats(
            calls=self.calls,
            flights=self.flights,
            joins=self.joins,
            failures=self.failures,
            interrupted=self.interrupted,
            in_flight=self.in_flight,
            kept=self.kept,
            coalescing_ratio=(self.flights / self.calls) if self.calls else 0.0,
            joiners_p50=float(self.joiners.percentile(0.50)),
            joiners_p99=float(self.joiners.percentile(0.99)),
            joiners_max=self.joiners.max,
            flight_seconds_p50=self.flight_us.percentile(0.50) / 1e6,
            flight_seconds_p99=self.flight_us.percentile(0.99) / 1e6,
            local_flights=self.local_flights,
        )
