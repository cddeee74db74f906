"""Prometheus metrics of a group (extra ``flightgroup[prometheus]``).

``register(group, registry=None, name="default")`` exports the group through the
registry's collector, which reads the counters at each scrape (nothing is pushed on
the hot path; joiners' waits are timed from registration on). Every metric has the
label ``group`` (``name``), so several groups share a registry. In the wide scopes
these are this process's view, like ``stats()``.

Metrics (with the default prefix ``flightgroup``):

- counters: ``_calls_total``, ``_flights_total`` (times a work ran, attempts
  included), ``_joins_total``, ``_failures_total``, ``_interrupted_total``,
  ``_lease_losses_total``, ``_local_flights_total`` (flights led in this process
  alone while the scope was out of reach, ``on_unavailable="local"``);
- gauges: ``_in_flight``, ``_kept``;
- histograms: ``_joiners_per_flight``, ``_flight_seconds``, ``_wait_seconds`` (a
  joiner's wait; each joiner counts its flight's mean joiner wait, so ``_sum`` and
  ``_count`` are exact). Bucket counts come from the group's log-linear histograms
  and are exact to within one of their buckets (about 6%); sums are exact.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from ._forksafe import renew_after_fork
from .group import internals

if TYPE_CHECKING:
    from .engine.table import FlightTable
    from .group import FlightGroup
    from .stats import Histogram, Recorder

__all__ = ["FlightGroupCollector", "register"]

JOINER_BUCKETS: tuple[float, ...] = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10000)
SECONDS_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
)


class FlightGroupCollector(Collector):
    """Reads the counters of the groups registered to one registry, at each scrape
    (one collector per registry: every metric name appears once, one series per
    group)."""

    def __init__(self, prefix: str = "flightgroup") -> None:
        self._prefix = prefix
        self._lock = threading.Lock()
        renew_after_fork(self)
        self._tables: dict[str, FlightTable[Any]] = {}

    def add(self, name: str, table: FlightTable[Any]) -> None:
        with self._lock:
            if name in self._tables:
                raise ValueError(f"a group named {name!r} is registered already")
            self._tables[name] = table
        table.recorder(timing=True)  # joiners' waits are timed from now on

    def remove(self, name: str) -> None:
        """Stop exporting the group named ``name``."""
        with self._lock:
            self._tables.pop(name, None)

    def describe(self) -> Iterator[Any]:
        return self._families([])

    def collect(self) -> Iterator[Any]:
        with self._lock:
            tables = list(self._tables.items())
        return self._families([(name, table.recorder()) for name, table in tables])

    def _families(self, recorders: list[tuple[str, Recorder]]) -> Iterator[Any]:
        p = self._prefix
        for name, doc in (
            ("calls", "Calls made"),
            ("flights", "Times a work ran (attempts included)"),
            ("joins", "Calls that joined a flight or got a kept outcome"),
            ("failures", "Flights whose work failed or timed out"),
            ("interrupted", "Flights that ended with no outcome"),
            ("lease_losses", "Flights led here that lost their lease"),
            ("local_flights", "Flights led in this process alone: the scope was out of reach"),
        ):
            counter = CounterMetricFamily(f"{p}_{name}", doc, labels=["group"])
            for group, recorder in recorders:
                counter.add_metric([group], getattr(recorder, name))
            yield counter
        for name, doc in (
            ("in_flight", "Flights running now"),
            ("kept", "Outcomes kept for later calls"),
        ):
            gauge = GaugeMetricFamily(f"{p}_{name}", doc, labels=["group"])
            for group, recorder in recorders:
                gauge.add_metric([group], getattr(recorder, name))
            yield gauge
        for name, doc, field, bounds, unit in (
            ("joiners_per_flight", "Joiners per flight", "joiners", JOINER_BUCKETS, 1.0),
            ("flight_seconds", "How long flights ran", "flight_us", SECONDS_BUCKETS, 1e-6),
            ("wait_seconds", "How long joiners waited", "wait_us", SECONDS_BUCKETS, 1e-6),
        ):
            family = HistogramMetricFamily(f"{p}_{name}", doc, labels=["group"])
            for group, recorder in recorders:
                histogram: Histogram = getattr(recorder, field)
                family.add_metric([group], _buckets(histogram, bounds, unit),
                                  sum_value=histogram.total * unit)
            yield family


def _buckets(
    histogram: Histogram, bounds: Sequence[float], unit: float
) -> list[tuple[str, float]]:
    """Cumulative Prometheus buckets from one of the group's histograms (whose
    values are in ``unit``s)."""
    buckets = [(_le(bound), float(histogram.at_most(int(bound / unit)))) for bound in bounds]
    buckets.append(("+Inf", float(histogram.count)))
    return buckets


def _le(bound: float) -> str:
    return repr(float(bound))


_COLLECTORS: weakref.WeakKeyDictionary[CollectorRegistry, FlightGroupCollector] = (
    weakref.WeakKeyDictionary()
)
_COLLECTORS_LOCK = threading.Lock()
renew_after_fork(sys.modules[__name__], "_COLLECTORS_LOCK")


def register(
    group: FlightGroup,
    registry: CollectorRegistry | None = None,
    *,
    name: str = "default",
) -> FlightGroupCollector:
    """Export ``group``'s metrics to ``registry`` (the default registry if None),
    labelled ``group=name``. Every group of one registry shares one collector, which
    is returned; ``collector.remove(name)`` stops exporting the group.

    Raises:
        ValueError: a group of this name is registered to ``registry`` already.
    """
    registry = REGISTRY if registry is None else registry
    with _COLLECTORS_LOCK:
        collector = _COLLECTORS.get(registry)
        if collector is None:
            collector = _COLLECTORS[registry] = FlightGroupCollector()
            registry.register(collector)
    collector.add(name, internals(group).table)
    return collector
