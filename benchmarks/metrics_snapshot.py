"""``python -m benchmarks.metrics_snapshot``: what a worker's metrics file costs (ADR 0046).

Side by side, in interleaved rounds (each candidate's best round is reported, and the
median of the ratios taken round by round, both sides run back to back):

- converting one histogram to Prometheus buckets: ``at_most`` per bound (how a scrape
  did it) against ``Histogram.cumulative`` (one pass);
- a worker's whole write, for one group: copy under the table lock, convert, JSON,
  ``os.replace`` (``Writer.write`` with a count changed each time);
- a miss through ``run_sync`` on a group registered without a directory, and on one
  registered with a directory whose writer writes every 10 ms (100 times its default
  rate): the writer's thread beside the calls.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from statistics import median

from prometheus_client import CollectorRegistry

from flightgroup import FlightGroup
from flightgroup.prometheus import SECONDS_BUCKETS, register
from flightgroup.stats import Histogram


def best_of(
    rounds: int, candidates: dict[str, tuple[Callable[[], object], int]]
) -> dict[str, list[float]]:
    """Seconds per operation of each candidate, round by round (interleaved)."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, (run, n) in candidates.items():
            start = time.perf_counter()
            for _ in range(n):
                run()
            times[name].append((time.perf_counter() - start) / n)
    return times


def report(title: str, times: dict[str, list[float]], unit: float, label: str) -> None:
    names = list(times)
    base = names[0]
    print(f"\n{title}")
    for name in names:
        ratios = [b / m for b, m in zip(times[base], times[name], strict=True)]
        print(f"  {name:48} {min(times[name]) / unit:10.3f} {label}"
              f"   {base} / this: best {min(times[base]) / min(times[name]):5.2f},"
              f" median of rounds {median(ratios):5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.metrics_snapshot")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    histogram = Histogram()
    rng = random.Random(1)
    for _ in range(100_000):
        histogram.record(int(rng.lognormvariate(9, 2)))  # microseconds, ms to minutes
    bounds = [int(bound / 1e-6) for bound in SECONDS_BUCKETS]
    report("one histogram to Prometheus buckets", best_of(args.rounds, {
        "at_most per bound": (lambda: [histogram.at_most(b) for b in bounds], 20),
        "Histogram.cumulative": (lambda: histogram.cumulative(bounds), 200),
    }), 1e-3, "ms")

    with tempfile.TemporaryDirectory() as directory:
        group = FlightGroup()
        collector = register(group, CollectorRegistry(), name="g", directory=directory,
                             interval=3600)
        writer = collector._writer
        assert writer is not None
        counter = iter(range(10**9))

        def write() -> None:
            group.run_sync(f"w{next(counter)}", lambda: None)  # a count that changed
            writer.write()

        report("a worker's write of one group (with one call to change it)", best_of(
            args.rounds, {"Writer.write": (write, 200)}), 1e-3, "ms")
        collector.close()

    with tempfile.TemporaryDirectory() as directory:
        plain, shared = FlightGroup(), FlightGroup()
        register(plain, CollectorRegistry(), name="plain")
        collector = register(shared, CollectorRegistry(), name="shared",
                             directory=directory, interval=0.01)
        keys = iter(range(10**9))
        report("a miss through run_sync", best_of(args.rounds, {
            "registered, no directory": (
                lambda: plain.run_sync(f"k{next(keys)}", lambda: None).value, 20_000),
            "registered, directory written every 10 ms": (
                lambda: shared.run_sync(f"k{next(keys)}", lambda: None).value, 20_000),
        }), 1e-6, "µs")
        collector.close()


if __name__ == "__main__":
    main()
