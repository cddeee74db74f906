"""``python -m benchmarks.retention_store``: the kept-outcome store's hit, side by side.

Measures one lookup that hits, behind a ``threading.Lock`` as the engine takes
it, for:

- flightgroup's ``RetentionStore.get`` (ADR 0007),
- ``cachetools.TTLCache.__getitem__`` (the issue's yardstick) and
  ``cachetools.TLRUCache.__getitem__`` (its per-entry-TTL cache), when
  cachetools is installed (left out otherwise),
- ``dict.get``: the floor, a lookup with no LRU or clock at all.

Every cache holds ``--keys`` entries that never expire, and is read in one
shuffled order of its keys. Rounds interleave the candidates (so a burst of
noise from another process hits all of them alike) and each candidate's best
round is reported: on a busy machine the best is the least disturbed. Prints
nanoseconds per lookup, the ratio of the bests to TTLCache (or to the floor
without it), and the median of the ratios taken round by round (a paired
measure: both sides of a ratio ran back to back in the same round).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import threading
import time
from collections.abc import Callable, Hashable
from statistics import median
from typing import Any

from flightgroup.retention import RetentionStore

Lookup = Callable[[Hashable], Any]
TTL = 3600.0


def candidates(keys: list[str]) -> dict[str, Lookup]:
    """Name -> a lookup that hits for every key, each on its own full cache."""
    found: dict[str, Lookup] = {}
    store = RetentionStore(max_items=len(keys), max_bytes=None)
    for key in keys:
        store.put(key, True, key, 1, TTL, 1)
    found["flightgroup RetentionStore.get"] = store.get
    if importlib.util.find_spec("cachetools") is not None:
        import cachetools

        ttl_cache: Any = cachetools.TTLCache(maxsize=len(keys), ttl=TTL)
        tlru_cache: Any = cachetools.TLRUCache(
            maxsize=len(keys), ttu=lambda _key, _value, now: now + TTL
        )
        for key in keys:
            ttl_cache[key] = key
            tlru_cache[key] = key
        found["cachetools TTLCache.__getitem__"] = ttl_cache.__getitem__
        found["cachetools TLRUCache.__getitem__"] = tlru_cache.__getitem__
    floor = dict.fromkeys(keys, 1)
    found["dict.get (floor)"] = floor.get
    return found


def one_round(lookup: Lookup, order: list[str], lock: threading.Lock) -> float:
    """Seconds per lookup over ``order``, each under ``lock``."""
    started = time.perf_counter()
    for key in order:
        with lock:
            lookup(key)
    return (time.perf_counter() - started) / len(order)


def measure(keys: int, lookups: int, rounds: int, seed: int = 7) -> dict[str, list[float]]:
    """Nanoseconds per hit of each candidate, one number per round."""
    names = [f"k{i}" for i in range(keys)]
    order = names * max(1, lookups // keys)
    random.Random(seed).shuffle(order)
    found = candidates(names)
    lock = threading.Lock()
    times: dict[str, list[float]] = {name: [] for name in found}
    for name, lookup in found.items():  # warm up: first touches, specialization
        one_round(lookup, order[:10_000], lock)
        assert lookup(names[0]) is not None, name
    for index in range(rounds):
        # rotate who goes first, so none always runs on a cold cache
        items = list(found.items())
        shift = index % len(items)
        for name, lookup in items[shift:] + items[:shift]:
            times[name].append(one_round(lookup, order, lock) * 1e9)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.retention_store",
                                     description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--keys", type=int, default=10_000, help="entries in each cache")
    parser.add_argument("--lookups", type=int, default=100_000, help="lookups per round")
    parser.add_argument("--rounds", type=int, default=15, help="rounds; the best is kept")
    args = parser.parse_args(argv)
    times = measure(args.keys, args.lookups, args.rounds)
    base_name = "cachetools TTLCache.__getitem__"
    if base_name not in times:
        print("cachetools is not installed: TTLCache left out; ratios are to the floor")
        base_name = "dict.get (floor)"
    base = times[base_name]
    print(f"Python {sys.version.split()[0]}; {args.keys} keys, {args.lookups} hits per round, "
          f"{args.rounds} rounds; each lookup under a threading.Lock")
    print()
    print(f"| lookup (hit) | best ns | ratio of bests to {base_name} | median ratio per round |")
    print("| --- | ---: | ---: | ---: |")
    for name, nanos in times.items():
        paired = median(mine / theirs for mine, theirs in zip(nanos, base, strict=True))
        print(f"| {name} | {min(nanos):.0f} | {min(nanos) / min(base):.2f} | {paired:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
