"""flightgroup.prometheus: the metrics a scrape of the registry shows."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import flightgroup
from flightgroup import JSON, FlightGroup, LeaseLostError
from flightgroup.prometheus import register

pytestmark = pytest.mark.timeout(30)


def sample(registry: CollectorRegistry, name: str, group: str = "default", **labels: str) -> float:
    value = registry.get_sample_value(name, {"group": group, **labels})
    assert value is not None, f"{name} is not exported"
    return value


def test_counters_gauges_and_histograms_after_a_herd_and_a_failure() -> None:
    registry = CollectorRegistry()
    group = FlightGroup(retention=flightgroup.Retention(success=60.0))
    register(group, registry)
    started = asyncio.Event()
    gate = asyncio.Event()

    async def work() -> str:
        started.set()
        await gate.wait()
        return "v"

    async def main() -> None:
        leader = asyncio.ensure_future(group.run("k", work))
        await started.wait()
        joiners = [asyncio.ensure_future(group.run("k", work)) for _ in range(9)]
        await asyncio.sleep(0)  # every joiner registered (they are in the table now)
        assert sample(registry, "flightgroup_in_flight") == 1.0
        gate.set()
        results = await asyncio.gather(leader, *joiners)
        assert [r.joined for r in results].count(False) == 1

        async def fail() -> None:
            raise ValueError("no")

        with pytest.raises(ValueError, match="no"):
            await group.run("bad", fail)

    asyncio.run(main())
    assert sample(registry, "flightgroup_calls_total") == 11.0
    assert sample(registry, "flightgroup_flights_total") == 2.0
    assert sample(registry, "flightgroup_joins_total") == 9.0
    assert sample(registry, "flightgroup_failures_total") == 1.0
    assert sample(registry, "flightgroup_interrupted_total") == 0.0
    assert sample(registry, "flightgroup_lease_losses_total") == 0.0
    assert sample(registry, "flightgroup_in_flight") == 0.0
    assert sample(registry, "flightgroup_kept") == 1.0  # "k" kept; the failure is not
    # Joiners per flight: one flight with 9, one with 0.
    assert sample(registry, "flightgroup_joiners_per_flight_count") == 2.0
    assert sample(registry, "flightgroup_joiners_per_flight_sum") == 9.0
    assert sample(registry, "flightgroup_joiners_per_flight_bucket", le="0.0") == 1.0
    assert sample(registry, "flightgroup_joiners_per_flight_bucket", le="5.0") == 1.0
    assert sample(registry, "flightgroup_joiners_per_flight_bucket", le="10.0") == 2.0
    assert sample(registry, "flightgroup_joiners_per_flight_bucket", le="+Inf") == 2.0
    assert sample(registry, "flightgroup_flight_seconds_count") == 2.0
    assert sample(registry, "flightgroup_flight_seconds_sum") > 0.0
    # Nine joiners waited, each a positive time.
    assert sample(registry, "flightgroup_wait_seconds_count") == 9.0
    assert sample(registry, "flightgroup_wait_seconds_sum") > 0.0
    text = generate_latest(registry).decode()
    assert "# TYPE flightgroup_calls_total counter" in text
    assert "# TYPE flightgroup_wait_seconds histogram" in text


def test_buckets_are_cumulative_and_end_with_the_count() -> None:
    registry = CollectorRegistry()
    group = FlightGroup()
    register(group, registry)
    for i in range(50):
        group.run_sync(f"k{i}", lambda: None)
    buckets = [
        value
        for metric in registry.collect()
        if metric.name == "flightgroup_flight_seconds"
        for sample_ in metric.samples
        if sample_.name.endswith("_bucket")
        for value in [sample_.value]
    ]
    assert buckets == sorted(buckets)
    assert buckets[-1] == 50.0


def test_two_groups_share_a_registry_by_name_and_a_name_is_used_once() -> None:
    registry = CollectorRegistry()
    first, second = FlightGroup(), FlightGroup()
    collector = register(first, registry, name="reports")
    register(second, registry, name="users")
    first.run_sync("a", lambda: 1)
    for key in ("a", "b", "c"):
        second.run_sync(key, lambda: 1)
    assert sample(registry, "flightgroup_calls_total", group="reports") == 1.0
    assert sample(registry, "flightgroup_calls_total", group="users") == 3.0
    with pytest.raises(ValueError, match="reports"):
        register(FlightGroup(), registry, name="reports")
    collector.remove("reports")
    assert registry.get_sample_value("flightgroup_calls_total", {"group": "reports"}) is None
    # Each metric family appears once in the exposition, whatever the number of groups.
    text = generate_latest(registry).decode()
    assert text.count("# TYPE flightgroup_calls_total counter") == 1


def test_a_lost_lease_is_counted(redis_server: Any, namespace: str) -> None:
    """A fleet leader whose record Redis no longer holds loses its lease at the next
    renewal: the call raises LeaseLostError and the counter shows it."""
    registry = CollectorRegistry()
    group = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=0.3)
    register(group, registry)
    started = threading.Event()
    record = f"fg:{{{namespace}:{hashlib.sha256(b'k').hexdigest()}}}"

    def work() -> str:
        started.set()
        lease = flightgroup.current_lease()
        # Lost at the next renewal (lease/3): the record is gone.
        redis_server.client().delete(record)
        assert _wait_lost(lease)
        return "late"

    try:
        with pytest.raises(LeaseLostError):
            group.run_sync("k", work)
        assert started.is_set()
        assert sample(registry, "flightgroup_lease_losses_total") == 1.0
        assert sample(registry, "flightgroup_interrupted_total") == 1.0
    finally:
        group.close()


def _wait_lost(lease: flightgroup.Lease) -> bool:
    done = threading.Event()

    async def wait() -> None:
        await lease.wait_lost()
        done.set()

    thread = threading.Thread(target=lambda: asyncio.run(wait()), daemon=True)
    thread.start()
    return done.wait(10)


def test_local_flights_are_counted() -> None:
    """Flights led in this process alone while the scope is out of reach
    (on_unavailable="local") are exported as ``_local_flights_total``."""
    from flightgroup.testing import FakeCoordinator

    registry = CollectorRegistry()
    fake = FakeCoordinator()
    group = fake.group(codec=JSON, on_unavailable="local")
    register(group, registry)
    try:
        assert sample(registry, "flightgroup_local_flights_total") == 0.0
        fake.unreachable()
        assert group.run_sync("k", lambda: 1).value == 1
        assert sample(registry, "flightgroup_local_flights_total") == 1.0
        assert sample(registry, "flightgroup_flights_total") == 1.0
    finally:
        group.close()
