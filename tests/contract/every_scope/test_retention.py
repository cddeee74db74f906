"""docs/api.md, Policies: Retention. A kept outcome is served, as joined, to calls after the
flight until its time runs out or it is evicted (LRU by items, then bytes; a hit is a
use); group-wide in every scope."""

from __future__ import annotations

import pytest

from flightgroup import FlightFailedError, Retention

from .conftest import Scope, never


def test_a_kept_value_is_served_as_joined_with_its_flights_token(scope: Scope) -> None:
    g = scope.group(retention=Retention(success=60))
    led = g.run_sync("k", lambda: {"v": 1})
    served = g.run_sync("k", never)
    assert (served.value, served.joined, served.token) == ({"v": 1}, True, led.token)


def test_a_kept_failure_raises_flight_failed_error_for_later_calls(scope: Scope) -> None:
    g = scope.group(retention=Retention(success=None, error=60))

    def boom() -> None:
        raise LookupError("nope")

    with pytest.raises(LookupError):
        g.run_sync("k", boom)
    with pytest.raises(FlightFailedError) as caught:
        g.run_sync("k", never)
    assert (caught.value.error_type, caught.value.message) == ("LookupError", "nope")


def test_without_error_retention_a_failure_is_not_kept(scope: Scope) -> None:
    g = scope.group(retention=Retention(success=60))
    with pytest.raises(ValueError):
        g.run_sync("k", _raises)
    assert g.run_sync("k", lambda: "ok").joined is False


def _raises() -> None:
    raise ValueError("x")


def test_a_kept_outcome_expires(scope: Scope) -> None:
    g = scope.group(retention=Retention(success=0.2))
    g.run_sync("k", lambda: 1)
    assert g.run_sync("k", never).joined
    scope.expire(0.3)  # the fake's clock moves; the others' is waited out
    again = g.run_sync("k", lambda: 2)
    assert (again.value, again.joined) == (2, False)


def test_a_hit_counts_as_a_use_for_the_lru(scope: Scope) -> None:
    g = scope.group(retention=Retention(success=60, max_items=2))
    g.run_sync("a", lambda: "a")
    g.run_sync("b", lambda: "b")
    assert g.run_sync("a", never).joined  # "a" is now the most recently used
    g.run_sync("c", lambda: "c")  # one over max_items: "b" goes, not "a"
    assert g.run_sync("a", never).value == "a"
    assert g.run_sync("b", lambda: "b2").joined is False


def test_a_kept_outcome_is_served_to_every_process_of_the_group(wide: Scope) -> None:
    a, b = wide.group(retention=Retention(success=60)), wide.group()
    led = a.run_sync("k", lambda: [1])
    served = b.run_sync("k", never)
    assert (served.value, served.joined, served.token) == ([1], True, led.token)


def test_a_fresh_flights_outcome_replaces_the_kept_one(scope: Scope) -> None:
    keeping = scope.group(retention=Retention(success=60))
    keeping.run_sync("k", lambda: "old")
    keeping.run_sync("k", lambda: "new", fresh=True)  # a fresh flight, kept in its turn
    assert keeping.run_sync("k", never).value == "new"


def test_an_outcome_over_max_bytes_alone_is_not_kept(scope: Scope) -> None:
    g = scope.group(retention=Retention(success=60, max_bytes=64))
    g.run_sync("big", lambda: "x" * 1000)  # over max_bytes by itself (any estimate)
    g.run_sync("small", lambda: "x")
    assert g.run_sync("big", lambda: "again").joined is False
    assert g.run_sync("small", never).joined is True
