"""docs/api.md, Observability: ``stats()`` is this process's view. In a wide scope a call of a
flight led elsewhere is a join here, and the flight's work did not run here."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flightgroup import FlightGroup, Retention

from .conftest import Leader, Scope, joiner, never


def test_calls_flights_joins_and_in_flight(group: FlightGroup) -> None:
    leader = Leader(group, "k", "v")
    assert group.stats().in_flight == 1
    waiting = [joiner(group, "k") for _ in range(2)]
    leader.release()
    for each in waiting:
        each.wait()
    leader.result()
    stats = group.stats()
    assert (stats.calls, stats.flights, stats.joins, stats.in_flight) == (3, 1, 2, 0)
    assert stats.coalescing_ratio == pytest.approx(1 / 3)
    assert stats.joiners_max == 2


def test_failures_and_interruptions_are_counted(group: FlightGroup) -> None:
    with pytest.raises(ValueError):
        group.run_sync("k", _raise(ValueError("x")))
    with pytest.raises(_Stop):
        group.run_sync("k", _raise(_Stop()))
    stats = group.stats()
    assert (stats.calls, stats.flights, stats.failures, stats.interrupted) == (2, 2, 1, 1)


class _Stop(BaseException):
    pass


def _raise(error: BaseException) -> Callable[[], None]:
    def work() -> None:
        raise error

    return work


def test_a_kept_outcome_is_counted_as_a_join(scope: Scope) -> None:
    g = scope.group(retention=Retention(success=60))
    g.run_sync("k", lambda: 1)
    g.run_sync("k", never)
    stats = g.stats()
    assert (stats.calls, stats.flights, stats.joins) == (2, 1, 1)


def test_a_flight_led_elsewhere_is_a_join_here_and_no_flight(
    pair: tuple[FlightGroup, ...],
) -> None:
    a, b = pair
    leader = Leader(a, "k", "v")
    waiting = joiner(b, "k")
    leader.release()
    waiting.wait()
    leader.result()
    here, there = b.stats(), a.stats()
    assert (here.calls, here.flights, here.joins, here.in_flight) == (1, 0, 1, 0)
    assert (there.calls, there.flights, there.joins) == (1, 1, 0)
