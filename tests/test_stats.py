"""Stats: counters, bounded histograms, and the snapshot."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightgroup import FlightGroup, Stats
from flightgroup.stats import Histogram

from .support import run, until


def test_fresh_group_stats_are_zero() -> None:
    stats = FlightGroup().stats()
    assert isinstance(stats, Stats)
    assert dataclasses.astuple(stats) == (0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0, 0.0, 0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.calls = 3  # type: ignore[misc]


def test_counters_follow_calls_flights_joins_failures_and_interruptions() -> None:
    g = FlightGroup()

    async def main() -> None:
        release = asyncio.Event()

        async def ok() -> int:
            await release.wait()
            return 1

        async def bad() -> int:
            raise ValueError("x")

        tasks = [asyncio.create_task(g.run("a", ok)) for _ in range(4)]
        await until(lambda: g.stats().calls == 4)
        assert g.stats().in_flight == 1
        release.set()
        await asyncio.gather(*tasks)
        with pytest.raises(ValueError):
            await g.run("b", bad)

    run(main())
    stats = g.stats()
    assert (stats.calls, stats.flights, stats.joins, stats.failures) == (5, 2, 3, 1)
    assert stats.in_flight == 0 and stats.interrupted == 0
    assert stats.coalescing_ratio == pytest.approx(2 / 5)
    assert stats.joiners_max == 3 and stats.joiners_p99 == 3.0
    assert stats.flight_seconds_p99 >= stats.flight_seconds_p50 >= 0.0


@given(st.lists(st.integers(min_value=0, max_value=10**12), min_size=1, max_size=300))
def test_histogram_percentiles_are_within_one_bucket(values: list[int]) -> None:
    h = Histogram()
    for v in values:
        h.record(v)
    ordered = sorted(values)
    for fraction in (0.5, 0.99, 1.0):
        exact = ordered[max(0, -(-int(fraction * len(values) * 1_000_000) // 1_000_000) - 1)]
        got = h.percentile(fraction)
        assert got <= exact
        assert exact - got <= max(1, exact // 16), (fraction, exact, got)
    assert h.max == max(values) and h.count == len(values)


def test_histogram_memory_is_bounded_whatever_the_values() -> None:
    h = Histogram()
    size = len(h._counts)
    for v in (0, 1, 10**6, 10**15, 10**30):
        h.record(v)
    assert len(h._counts) == size
