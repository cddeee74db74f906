"""Stats: counters, bounded histograms, and the snapshot."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightgroup import FlightGroup, Stats
from flightgroup.stats import Histogram

from ..support import in_thread, outcome, run, until, wait_until


def test_fresh_group_stats_are_zero() -> None:
    stats = FlightGroup().stats()
    assert isinstance(stats, Stats)
    # (every counter is zero but the bound on threads left past a deadline)
    assert dataclasses.astuple(stats) == (
        0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0, 0.0, 0.0, 0, 0, 0, 64, 0
    )
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


@pytest.mark.parametrize("ends", ["returns", "raises"])
@pytest.mark.parametrize("scope", ["process", "directory", "fleet"])
def test_a_flight_whose_group_closed_counts_as_interrupted_in_every_scope(
    request: pytest.FixtureRequest, scope: str, ends: str
) -> None:
    """Its callers got GroupClosedError and its lease was lost, whatever its work did
    after: one interrupted flight (and one lost lease), no failure, in every scope alike,
    whichever comes first: the work's end or the scope's answer."""
    import threading

    from prometheus_client import CollectorRegistry

    from flightgroup import JSON, GroupClosedError, current_lease
    from flightgroup.prometheus import register

    if scope == "process":
        g = FlightGroup()
    elif scope == "directory":
        g = FlightGroup(directory=request.getfixturevalue("directory"), codec=JSON)
    else:
        server = request.getfixturevalue("redis_server")
        g = FlightGroup(redis=server.url, namespace=request.getfixturevalue("namespace"),
                        codec=JSON)
    registry = CollectorRegistry()
    register(g, registry=registry)
    started, gate = threading.Event(), threading.Event()
    lost: list[bool] = []

    def work() -> int:
        started.set()
        assert gate.wait(20)
        lost.append(current_lease().lost)
        if ends == "raises":
            raise ValueError("after the close")
        return 1

    leader, box = in_thread(g.run_sync, "k", work)
    try:
        assert started.wait(20)
        g.close()
    finally:
        gate.set()
        leader.join(20)
    assert type(outcome(box)) is GroupClosedError and lost == [True]
    wait_until(lambda: g.stats().in_flight == 0, "the flight's end counted")
    stats = g.stats()
    assert (stats.flights, stats.interrupted, stats.failures) == (1, 1, 0), stats
    losses = registry.get_sample_value("flightgroup_lease_losses_total", {"group": "default"})
    assert losses == 1.0


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


@given(
    st.lists(st.integers(min_value=0, max_value=10**12), max_size=300),
    st.lists(st.integers(min_value=-1, max_value=10**13), max_size=20),
)
def test_histogram_cumulative_counts_are_at_most_of_each_bound(
    values: list[int], bounds: list[int]
) -> None:
    """Histogram.cumulative (one pass, for exporters) counts what at_most counts."""
    h = Histogram()
    for v in values:
        h.record(v)
    bounds.sort()
    assert h.cumulative(bounds) == [h.at_most(bound) for bound in bounds]
