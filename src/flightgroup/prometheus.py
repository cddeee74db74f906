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

Several worker processes (``directory=`` or ``FLIGHTGROUP_PROMETHEUS_DIR``, ADR 0046):
each process writes its counts to its own file of the directory off the call path
(``_metrics_dir``), and a scrape of any of them shows the sums over all: counters never
go down, whichever worker a scrape reaches, and a dead worker's counts stay in them.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from ._forksafe import renew_after_fork
from ._metrics_dir import Buckets, Counts, Writer, read
from .group import internals

if TYPE_CHECKING:
    from .engine.table import FlightTable
    from .group import FlightGroup
    from .stats import Histogram, Recorder

__all__ = ["DIRECTORY_ENV", "FlightGroupCollector", "register"]

JOINER_BUCKETS: tuple[float, ...] = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10000)
SECONDS_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
)


_COUNTERS: tuple[tuple[str, str], ...] = (
    ("calls", "Calls made"),
    ("flights", "Times a work ran (attempts included)"),
    ("joins", "Calls that joined a flight or got a kept outcome"),
    ("failures", "Flights whose work failed or timed out"),
    ("interrupted", "Flights that ended with no outcome"),
    ("lease_losses", "Flights led here that lost their lease"),
    ("local_flights", "Flights led in this process alone: the scope was out of reach"),
)
_GAUGES: tuple[tuple[str, str], ...] = (
    ("in_flight", "Flights running now"),
    ("kept", "Outcomes kept for later calls"),
)
# (metric, doc, the Recorder's histogram, bucket bounds, the histogram's unit)
_HISTOGRAMS: tuple[tuple[str, str, str, tuple[float, ...], float], ...] = (
    ("joiners_per_flight", "Joiners per flight", "joiners", JOINER_BUCKETS, 1.0),
    ("flight_seconds", "How long flights ran", "flight_us", SECONDS_BUCKETS, 1e-6),
    ("wait_seconds", "How long joiners waited", "wait_us", SECONDS_BUCKETS, 1e-6),
)

# The environment variable that names the workers' directory when ``register`` is not given one.
DIRECTORY_ENV = "FLIGHTGROUP_PROMETHEUS_DIR"


class FlightGroupCollector(Collector):
    """Reads the counters of the groups registered to one registry, at each scrape
    (one collector per registry: every metric name appears once, one series per
    group).

    With a ``directory`` (ADR 0046), this process writes its groups' counts to its own
    file there every ``interval`` seconds (and before each scrape it answers, and at
    exit), and a scrape shows every group's counts summed over all the processes that
    wrote there: counters and histograms of live and dead ones, gauges of live ones
    only, and ``<prefix>_workers``, the processes writing there now. Such a collector
    with no group only reads: register one in a registry made per scrape.
    """

    def __init__(
        self,
        prefix: str = "flightgroup",
        *,
        directory: str | os.PathLike[str] | None = None,
        interval: float = 1.0,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, not {interval!r}")
        self._prefix = prefix
        self._lock = threading.Lock()
        renew_after_fork(self)
        self._tables: dict[str, FlightTable[Any]] = {}
        self.directory = None if directory is None else os.path.realpath(directory)
        self._interval = interval
        # Made at the first group added in directory mode; None in a reader-only one.
        self._writer: Writer | None = None

    def add(self, name: str, table: FlightTable[Any]) -> None:
        with self._lock:
            if name in self._tables:
                raise ValueError(f"a group named {name!r} is registered already")
            self._tables[name] = table
            if self.directory is not None and self._writer is None:
                self._writer = Writer(self.directory, self._interval, self._live)
        table.recorder(timing=True)  # joiners' waits are timed from now on

    def remove(self, name: str) -> None:
        """Stop exporting the group named ``name`` (with a directory, its counts so far
        stay in the sums)."""
        writer = self._writer
        if writer is None:
            with self._lock:
                self._tables.pop(name, None)
            return
        with writer.lock:  # M1: no snapshot between the group leaving and its retiring
            with self._lock:
                table = self._tables.pop(name, None)
            if table is not None:
                writer.retire(name, _counts(table.recorder()))

    def close(self) -> None:
        """(With a directory) write this process's counts one last time and stop
        writing: its gauges leave the sums, its counters stay in them. Done at exit
        anyway."""
        if self._writer is not None:
            self._writer.close()

    def describe(self) -> Iterator[Any]:
        return self._families([], workers=None if self.directory is None else 0)

    def collect(self) -> Iterator[Any]:
        if self.directory is not None:
            sums, live = read(self.directory)
            return self._families(sorted(sums.items()), workers=live)
        return self._families(sorted(self._live().items()), workers=None)

    def _live(self) -> dict[str, Counts]:
        """This process's counts of its groups, by name."""
        with self._lock:
            tables = list(self._tables.items())
        return {name: _counts(table.recorder()) for name, table in tables}

    def _families(self, groups: list[tuple[str, Counts]], workers: int | None) -> Iterator[Any]:
        p = self._prefix
        for name, doc in _COUNTERS:
            counter = CounterMetricFamily(f"{p}_{name}", doc, labels=["group"])
            for group, counts in groups:
                counter.add_metric([group], counts.counters.get(name, 0.0))
            yield counter
        for name, doc in _GAUGES:
            gauge = GaugeMetricFamily(f"{p}_{name}", doc, labels=["group"])
            for group, counts in groups:
                gauge.add_metric([group], counts.gauges.get(name, 0.0))
            yield gauge
        for name, doc, _, bounds, _ in _HISTOGRAMS:
            family = HistogramMetricFamily(f"{p}_{name}", doc, labels=["group"])
            les = [*map(_le, bounds), "+Inf"]
            for group, counts in groups:
                buckets = counts.histograms.get(name)
                if buckets is None:
                    continue
                family.add_metric([group], list(zip(les, buckets.cumulative, strict=True)),
                                  sum_value=buckets.total)
            yield family
        if workers is not None:
            yield GaugeMetricFamily(f"{p}_workers", "Processes writing to the directory now",
                                    value=workers)


def _counts(recorder: Recorder) -> Counts:
    """One group's counts from a copy of its recorder."""
    histograms = {}
    for name, _, field, bounds, unit in _HISTOGRAMS:
        histogram: Histogram = getattr(recorder, field)
        cumulative = histogram.cumulative([int(bound / unit) for bound in bounds])
        histograms[name] = Buckets([*map(float, cumulative), float(histogram.count)],
                                   histogram.total * unit)
    return Counts(
        counters={name: float(getattr(recorder, name)) for name, _ in _COUNTERS},
        gauges={name: float(getattr(recorder, name)) for name, _ in _GAUGES},
        histograms=histograms,
    )


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
    directory: str | os.PathLike[str] | None = None,
    interval: float = 1.0,
) -> FlightGroupCollector:
    """Export ``group``'s metrics to ``registry`` (the default registry if None),
    labelled ``group=name``. Every group of one registry shares one collector, which
    is returned; ``collector.remove(name)`` stops exporting the group.

    Several worker processes of one server (``uvicorn --workers``, gunicorn) name one
    ``directory`` (None: the environment variable ``FLIGHTGROUP_PROMETHEUS_DIR``, if
    set): each writes its counts there every ``interval`` seconds, and a scrape of any
    of them shows the sums over all of them (ADR 0046; docs/observability.md).

    Raises:
        ValueError: a group of this name is registered to ``registry`` already, or the
            registry's collector was made with another directory.
    """
    registry = REGISTRY if registry is None else registry
    if directory is None:
        directory = os.environ.get(DIRECTORY_ENV) or None
    wanted = None if directory is None else os.path.realpath(directory)
    with _COLLECTORS_LOCK:
        collector = _COLLECTORS.get(registry)
        if collector is None:
            collector = FlightGroupCollector(directory=wanted, interval=interval)
            registry.register(collector)
            _COLLECTORS[registry] = collector
        elif collector.directory != wanted:
            raise ValueError(
                f"this registry exports from directory {collector.directory!r}, not {wanted!r}"
            )
    collector.add(name, internals(group).table)
    return collector
