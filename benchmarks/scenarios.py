"""The scenarios. Each one measures every library in rounds; the order of the
libraries rotates from round to round, so that no library always runs first (on
a cold cache) or last (after the others' garbage)."""

from __future__ import annotations

import asyncio
import gc
import itertools
import random
import sys
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING

from .peers import (
    FLIGHTGROUP,
    HANDOVER_FLOOR,
    NO_COALESCING,
    POLICY_HOW,
    POLICY_KEPT,
    TTLCACHE,
    TTLCACHE_HOW,
    AsyncCall,
    Lib,
    SyncCall,
    SyncWork,
    Work,
    kept_retention,
    policy_groups,
    ttlcache,
    ttlcache_installed,
)
from .procs import WAIT
from .rule_floor import RULE_FLOOR, RULE_FLOOR_LIB

if TYPE_CHECKING:
    from flightgroup import FlightGroup

BARE = "bare `await fn()`"
TASK = "one task per call (`await` a new task of `fn()`; eager on 3.12+)"
FLOOR = "floor (tasks awaiting one Future)"


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is: FULL is the issue's numbers, QUICK a smoke run."""

    miss_calls: int
    miss_rounds: int
    herd_tasks: int
    herd_rounds: int
    spread_tasks: int
    spread_keys: int
    spread_rounds: int
    storm_waves: int
    storm_callers: int
    storm_rounds: int
    threads: int
    thread_calls: int
    thread_keys: int
    thread_rounds: int
    memory_keys: int
    sequential_flights: int
    hit_calls: int
    hit_rounds: int
    policy_calls: int
    policy_sync_calls: int  # fewer: a configured sync miss hands its work to a kept thread
    policy_rounds: int
    cpu_calls: int  # (e) per thread, with a CPU-bound work
    cpu_rounds: int
    herd_sleep: float = 0.050
    spread_sleep: float = 0.001
    storm_sleep: float = 0.001  # so that a wave's callers overlap the failing run
    thread_sleep: float = 0.005  # a query's or an HTTP call's order, not a context switch's
    # Seconds of CPU one run of the CPU-bound work burns: past the interpreter's switch
    # interval (5 ms), so that other threads run, and call, while a leader's work runs
    # (a shorter work holding the GIL ends before anyone else can join it).
    cpu_work: float = 0.010


FULL = Sizes(
    miss_calls=1_000,
    miss_rounds=25,
    herd_tasks=10_000,
    herd_rounds=10,
    spread_tasks=100_000,
    spread_keys=1_000,
    spread_rounds=5,
    storm_waves=10,
    storm_callers=1_000,
    storm_rounds=3,
    threads=32,
    thread_calls=2_000,
    thread_keys=16,
    thread_rounds=3,
    memory_keys=10_000,
    sequential_flights=1_000_000,
    hit_calls=20_000,
    hit_rounds=25,
    policy_calls=1_000,
    policy_sync_calls=200,
    policy_rounds=25,
    cpu_calls=20,
    cpu_rounds=3,
)

QUICK = Sizes(
    miss_calls=500,
    miss_rounds=4,
    herd_tasks=500,
    herd_rounds=2,
    spread_tasks=2_000,
    spread_keys=50,
    spread_rounds=2,
    storm_waves=2,
    storm_callers=100,
    storm_rounds=2,
    threads=32,
    thread_calls=50,
    thread_keys=16,
    thread_rounds=2,
    memory_keys=500,
    sequential_flights=10_000,
    hit_calls=5_000,
    hit_rounds=5,
    policy_calls=500,
    policy_sync_calls=50,
    policy_rounds=5,
    cpu_calls=3,
    cpu_rounds=2,
)


@dataclass
class Series:
    """One library's samples in one scenario."""

    # The statistic that stands for the series: "best" where the timing is one
    # thread's CPU work (noise only adds to it), "median" where the spread is the
    # OS scheduler's own (threads).
    stat: str = "best"
    values: list[float] = field(default_factory=list)
    runs: list[int] = field(default_factory=list)  # runs of fn per sample
    ok: bool = True  # every caller got the outcome it should
    error: str | None = None  # the measurement raised: no more samples

    @property
    def value(self) -> float:
        return min(self.values) if self.stat == "best" else median(self.values)


Results = dict[str, Series]


class Boom(Exception):
    """What the failure storm's fn raises."""


@contextmanager
def quiet() -> Iterator[None]:
    """No garbage collection lands inside a timing: collect first, then pause it."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextmanager
def frozen() -> Iterator[None]:
    """The objects alive now (a full kept store, what earlier scenarios left) are
    moved out of the collector's sight, so that ``quiet``'s collect before each
    timing stays short; the timings themselves run with collection paused anyway."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _rotations(names: Sequence[str], rounds: int) -> Iterator[str]:
    for r in range(rounds):
        k = r % len(names)
        yield from [*names[k:], *names[:k]]


def _failed(series: Series, exc: BaseException) -> None:
    series.error = f"{type(exc).__name__}: {exc}"


async def _each(
    names: Sequence[str], rounds: int, measure: Callable[[str, Series], Awaitable[None]]
) -> Results:
    results = {name: Series() for name in names}
    for name in _rotations(names, rounds):
        series = results[name]
        if series.error is None:
            try:
                await measure(name, series)
            except Exception as exc:
                _failed(series, exc)
    return results


def _each_sync(
    names: Sequence[str],
    rounds: int,
    measure: Callable[[str, Series], None],
    stat: str = "median",
) -> Results:
    results = {name: Series(stat=stat) for name in names}
    for name in _rotations(names, rounds):
        series = results[name]
        if series.error is None:
            try:
                measure(name, series)
            except Exception as exc:
                _failed(series, exc)
    return results


Libs = dict[str, Lib[Work, AsyncCall]]


async def miss(libs: Libs, sizes: Sizes) -> Results:
    """(a) Distinct keys, fn returns at once: µs per call, sequential awaits."""
    keys = [f"miss:{i}" for i in range(sizes.miss_calls)]
    warm = [f"warm:{i}" for i in range(len(keys) // 10)]

    async def measure(name: str, series: Series) -> None:
        runs = 0

        async def fn() -> int:
            nonlocal runs
            runs += 1
            return 1

        if name == BARE:
            with quiet():
                start = time.perf_counter()
                for _ in keys:
                    await fn()
                await asyncio.sleep(0)  # (as every row: see below)
                elapsed = time.perf_counter() - start
        elif name == TASK:
            # The floor of a miss whose work runs in a task of its own (ADR 0002), as
            # flightgroup's does: started eagerly where the loop can (3.12+).
            loop = asyncio.get_running_loop()
            eager = sys.version_info >= (3, 12)
            with quiet():
                start = time.perf_counter()
                for _ in keys:
                    if eager:
                        await asyncio.Task(fn(), loop=loop, eager_start=True)  # type: ignore[call-arg, unused-ignore]
                    else:
                        await loop.create_task(fn())
                await asyncio.sleep(0)  # (as every row: see below)
                elapsed = time.perf_counter() - start
            runs = len(keys)
        else:
            call = libs[name].bind(fn)
            for key in warm:
                await call(key)
            runs = 0
            with quiet():
                start = time.perf_counter()
                for key in keys:
                    await call(key)
                # One turn of the loop inside the timing: what a call left scheduled
                # (on 3.11, the first step of each work task that finished eagerly,
                # ADR 0052) runs, and is paid for, in the round.
                await asyncio.sleep(0)
                elapsed = time.perf_counter() - start
        series.values.append(elapsed / len(keys) * 1e6)
        series.runs.append(runs)
        series.ok = series.ok and runs == len(keys)  # every call was a real miss

    return await _each([*libs, BARE, TASK], sizes.miss_rounds, measure)


def _floor(pause: float) -> AsyncCall:
    """The herd's floor: tasks that await one bare Future, resolved ``pause``
    seconds after the first of them arrives (as a leader's fn would start)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    armed = False

    async def wait(key: str) -> int:
        nonlocal armed
        if not armed:
            armed = True
            loop.call_later(pause, future.set_result, 1)
        return await future

    return wait


async def herd(libs: Libs, sizes: Sizes) -> Results:
    """(b) Many tasks on one key, fn sleeps: runs, and µs per caller above the sleep."""
    pause, n = sizes.herd_sleep, sizes.herd_tasks

    async def measure(name: str, series: Series) -> None:
        runs = 0

        async def fn() -> int:
            nonlocal runs
            runs += 1
            await asyncio.sleep(pause)
            return 1

        call = _floor(pause) if name == FLOOR else libs[name].bind(fn)
        with quiet():
            start = time.perf_counter()
            await asyncio.gather(*[call("herd") for _ in range(n)])
            elapsed = time.perf_counter() - start
        series.values.append((elapsed - pause) / n * 1e6)
        series.runs.append(runs)

    return await _each([*libs, FLOOR], sizes.herd_rounds, measure)


async def spread(libs: Libs, sizes: Sizes) -> Results:
    """(c) Many tasks over many keys, fn sleeps a little: total seconds and runs."""
    keys = [f"spread:{i % sizes.spread_keys}" for i in range(sizes.spread_tasks)]

    async def measure(name: str, series: Series) -> None:
        runs = 0

        async def fn() -> int:
            nonlocal runs
            runs += 1
            await asyncio.sleep(sizes.spread_sleep)
            return 1

        call = libs[name].bind(fn)
        with quiet():
            start = time.perf_counter()
            await asyncio.gather(*[call(key) for key in keys])
            elapsed = time.perf_counter() - start
        series.values.append(elapsed)
        series.runs.append(runs)

    return await _each(list(libs), sizes.spread_rounds, measure)


async def storm(libs: Libs, sizes: Sizes) -> Results:
    """(d) Waves of callers of one key whose fn raises: one run per wave, every
    caller raises, and the next wave runs again (no poisoned key). One group per
    round, used by all its waves."""
    pause, n = sizes.storm_sleep, sizes.storm_callers

    async def measure(name: str, series: Series) -> None:
        runs = 0

        async def fn() -> int:
            nonlocal runs
            runs += 1
            await asyncio.sleep(pause)
            raise Boom("storm")

        call = libs[name].bind(fn)
        for _ in range(sizes.storm_waves):
            before = runs
            with quiet():
                start = time.perf_counter()
                outcomes = await asyncio.gather(
                    *[call("storm") for _ in range(n)], return_exceptions=True
                )
                elapsed = time.perf_counter() - start
            series.values.append((elapsed - pause) / n * 1e6)
            series.runs.append(runs - before)
            series.ok = series.ok and all(isinstance(o, Exception) for o in outcomes)

    return await _each(list(libs), sizes.storm_rounds, measure)


def _plans(sizes: Sizes, calls: int) -> list[list[str]]:
    """Each thread's sequence of keys, drawn once (seeded), so every library gets the same."""
    keys = [f"thread:{k}" for k in range(sizes.thread_keys)]
    return [
        [rng.choice(keys) for _ in range(calls)]
        for rng in (random.Random(t) for t in range(sizes.threads))
    ]


def _burner(seconds: float) -> Callable[[], None]:
    """A function that burns about ``seconds`` of CPU in Python (it holds the GIL, as a
    parse or a render does), calibrated here."""

    def burn(n: int) -> int:
        total = 0
        for i in range(n):
            total += i * i
        return total

    n = 10_000
    while True:
        start = time.process_time()
        burn(n)
        spent = time.process_time() - start
        if spent > 0.05:
            break
        n *= 2
    loops = max(1, int(n * seconds / spent))

    def work() -> None:
        burn(loops)

    return work


def threads(libs: dict[str, Lib[SyncWork, SyncCall]], sizes: Sizes) -> Results:
    """(e) Threads × calls over a few keys, fn = time.sleep: total seconds and runs."""
    return _threads(libs, sizes, _plans(sizes, sizes.thread_calls), sizes.thread_rounds,
                    lambda: time.sleep(sizes.thread_sleep))[0]


def threads_cpu(
    libs: dict[str, Lib[SyncWork, SyncCall]], sizes: Sizes
) -> tuple[Results, Results]:
    """(e) The same threads with a CPU-bound work: (CPU seconds, total seconds) and runs.
    Coalescing runs the work once per flight instead of once per call: the CPU saved."""
    return _threads(libs, sizes, _plans(sizes, sizes.cpu_calls), sizes.cpu_rounds,
                    _burner(sizes.cpu_work))


def _threads(
    libs: dict[str, Lib[SyncWork, SyncCall]],
    sizes: Sizes,
    plans: list[list[str]],
    rounds: int,
    work: Callable[[], None],
) -> tuple[Results, Results]:
    """Every thread calls its plan's keys in turn; (total seconds, CPU seconds of the
    process) per round, and fn's runs."""
    cpu = {name: Series(stat="median") for name in libs}

    def measure(name: str, series: Series) -> None:
        counter = itertools.count()  # next() is atomic under the GIL

        def fn() -> int:
            next(counter)
            work()
            return 1

        call = libs[name].bind(fn)
        errors: list[BaseException] = []
        gate = threading.Barrier(len(plans) + 1)

        def worker(plan: list[str]) -> None:
            gate.wait()
            try:
                for key in plan:
                    call(key)
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=worker, args=(plan,)) for plan in plans]
        for thread in workers:
            thread.start()
        with quiet():
            gate.wait()
            start, start_cpu = time.perf_counter(), time.process_time()
            for thread in workers:
                thread.join()
            elapsed, spent = time.perf_counter() - start, time.process_time() - start_cpu
        if errors:
            raise errors[0]
        runs = next(counter)
        series.values.append(elapsed)
        series.runs.append(runs)
        cpu[name].values.append(spent)
        cpu[name].runs.append(runs)

    wall = _each_sync(list(libs), rounds, measure)
    for name, series in wall.items():
        cpu[name].error = series.error
    return wall, cpu


async def memory(libs: Libs, sizes: Sizes) -> Results:
    """(f) Bytes per in-flight key: N keys held in flight at once by works blocked
    on an event, traced by tracemalloc (the callers' own tasks included, for
    every library alike; ``no coalescing`` is that floor)."""
    n = sizes.memory_keys
    keys = [f"memory:{i}" for i in range(n)]

    async def measure(name: str, series: Series) -> None:
        started = 0
        gate = asyncio.Event()

        async def fn() -> int:
            nonlocal started
            started += 1
            await gate.wait()
            return 1

        call = libs[name].bind(fn)
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            tasks = [asyncio.ensure_future(call(key)) for key in keys]
            for _ in range(100):  # libraries that start the work in a task of its own
                if started == n:
                    break
                await asyncio.sleep(0)
            # One more turn: what the calls left scheduled (on 3.11, each work task's
            # first step after its eager start, ADR 0052) has run; what stays is held.
            await asyncio.sleep(0)
            held = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
            gate.set()
        await asyncio.gather(*tasks)
        if started != n:
            raise RuntimeError(f"only {started} of {n} works were in flight at once")
        series.values.append(held / n)
        series.runs.append(started)

    await _grow_task_tables(3 * n)
    return await _each(list(libs), 1, measure)


async def _grow_task_tables(tasks: int) -> None:
    """Hold ``tasks`` tasks at once, then let them end: asyncio's global set of tasks
    (a WeakSet, whose table grows and never shrinks) is then as big as any library's
    measurement needs, so that none pays for its growth (about 200 B per key at 10,000
    keys, for whichever library is measured first)."""
    gate = asyncio.Event()
    held = [asyncio.ensure_future(gate.wait()) for _ in range(tasks)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*held)


async def sequential(sizes: Sizes) -> dict[str, int]:
    """(f) flightgroup's table after many sequential flights (one in ten fails):
    every entry must be gone."""
    from flightgroup import FlightGroup

    async def value() -> int:
        return 1

    async def failure() -> int:
        raise Boom("sequential")

    group = FlightGroup()
    failed = 0
    for i in range(sizes.sequential_flights):
        try:
            await group.run(str(i), failure if i % 10 == 0 else value)
        except Boom:
            failed += 1
    stats = group.stats()
    return {
        "flights": stats.flights,
        "failed": failed,
        "table entries": len(group._table.flights),
        "detached entries": len(group._table.detached),
        "stats().in_flight": stats.in_flight,
    }


HIT_KEY = "hit"
HIT_WARM = 200  # untimed hits before each timing: the code paths are specialized


def _hit_names() -> list[str]:
    return [FLIGHTGROUP, *([TTLCACHE] if ttlcache_installed() else [])]


async def kept_hit(sizes: Sizes) -> Results:
    """(g) One key kept (``Retention(success=3600)``) after one warm-up call, then
    sequential ``await g.run(key, fn)`` calls that all hit, side by side with a
    TTLCache lookup behind a lock inside an awaited ``async def``: µs per call. A
    fresh group (or cache) per round; ``runs`` counts fn's runs in the round,
    warm-up included, so it must be 1."""
    from flightgroup import FlightGroup, Retention

    n = sizes.hit_calls

    async def measure(name: str, series: Series) -> None:
        runs = 0

        async def fn() -> int:
            nonlocal runs
            runs += 1
            return 1

        key = HIT_KEY
        if name == FLIGHTGROUP:
            run = FlightGroup(retention=Retention(success=3600)).run
            await run(key, fn)  # the warm-up: fn runs, its outcome is kept
            for _ in range(HIT_WARM):
                await run(key, fn)
            with quiet():
                start = time.perf_counter()
                for _ in range(n):
                    await run(key, fn)
                elapsed = time.perf_counter() - start
            result = await run(key, fn)
            served = result.joined and result.value == 1
        else:
            cached = ttlcache(key, await fn())[0]
            for _ in range(HIT_WARM):
                await cached(key)
            with quiet():
                start = time.perf_counter()
                for _ in range(n):
                    await cached(key)
                elapsed = time.perf_counter() - start
            served = await cached(key) == 1
        series.values.append(elapsed / n * 1e6)
        series.runs.append(runs)
        series.ok = series.ok and served

    with frozen():
        return await _each(_hit_names(), sizes.hit_rounds, measure)


def kept_hit_sync(sizes: Sizes) -> Results:
    """(g), the sync twin: ``g.run_sync(key, fn)`` hits against the same TTLCache
    lookup in a plain function, outside any event loop."""
    from flightgroup import FlightGroup, Retention

    n = sizes.hit_calls

    def measure(name: str, series: Series) -> None:
        runs = 0

        def fn() -> int:
            nonlocal runs
            runs += 1
            return 1

        key = HIT_KEY
        if name == FLIGHTGROUP:
            run_sync = FlightGroup(retention=Retention(success=3600)).run_sync
            run_sync(key, fn)
            for _ in range(HIT_WARM):
                run_sync(key, fn)
            with quiet():
                start = time.perf_counter()
                for _ in range(n):
                    run_sync(key, fn)
                elapsed = time.perf_counter() - start
            result = run_sync(key, fn)
            served = result.joined and result.value == 1
        else:
            cached = ttlcache(key, fn())[1]
            for _ in range(HIT_WARM):
                cached(key)
            with quiet():
                start = time.perf_counter()
                for _ in range(n):
                    cached(key)
                elapsed = time.perf_counter() - start
            served = cached(key) == 1
        series.values.append(elapsed / n * 1e6)
        series.runs.append(runs)
        series.ok = series.ok and served

    with frozen():
        return _each_sync(_hit_names(), sizes.hit_rounds, measure, stat="best")


Groups = dict[str, "FlightGroup"]


async def fill_kept(groups: Groups) -> None:
    """(h) Fill the kept variant's store to its max_items (untimed), so that every
    timed call keeps its outcome and evicts one."""

    async def fn() -> int:
        return 1

    run = groups[POLICY_KEPT].run
    for i in range(kept_retention().max_items):
        await run(f"fill:{i}", fn)


# Distinct keys across (h)'s rounds, variants and both twins.
_policy_keys = itertools.count()


def _policy_plan(calls: int) -> tuple[list[str], list[str]]:
    """A round's untimed warm-up keys and timed keys, never seen before."""
    warm = [f"policy:{next(_policy_keys)}" for _ in range(calls // 10)]
    return warm, [f"policy:{next(_policy_keys)}" for _ in range(calls)]


async def policy_miss(groups: Groups, sizes: Sizes) -> Results:
    """(h) Distinct keys, fn returns at once, on a group with every policy
    configured (and on one that also keeps every outcome) and on ``FlightGroup()``:
    µs per call, sequential awaits. One group per variant for the whole scenario."""

    async def measure(name: str, series: Series) -> None:
        runs = 0

        async def fn() -> int:
            nonlocal runs
            runs += 1
            return 1

        run = groups[name].run
        warm, keys = _policy_plan(sizes.policy_calls)
        for key in warm:
            await run(key, fn)
        runs = 0
        # One turn of the loop drops the cancelled deadline timers, as a serving loop
        # would between requests (a miss that returns at once never yields to it).
        await asyncio.sleep(0)
        with quiet():
            start = time.perf_counter()
            for key in keys:
                await run(key, fn)
            await asyncio.sleep(0)  # what the calls left scheduled is paid for (as in (a))
            elapsed = time.perf_counter() - start
        series.values.append(elapsed / len(keys) * 1e6)
        series.runs.append(runs)
        series.ok = series.ok and runs == len(keys)  # every call was a real miss

    return await _each(list(groups), sizes.policy_rounds, measure)


def policy_miss_sync(groups: Groups, sizes: Sizes) -> Results:
    """(h), the sync twin: ``run_sync`` on the same groups, outside any event loop; and,
    in the same rounds, the floor a deadline puts under it (HANDOVER_FLOOR)."""
    floor = _Handover()

    def measure(name: str, series: Series) -> None:
        if name == HANDOVER_FLOOR:
            n = sizes.policy_sync_calls
            with quiet():
                elapsed = floor.rounds(n)
            series.values.append(elapsed / n * 1e6)
            series.runs.append(n)
            return
        runs = 0

        def fn() -> int:
            nonlocal runs
            runs += 1
            return 1

        run_sync = groups[name].run_sync
        warm, keys = _policy_plan(sizes.policy_sync_calls)
        for key in warm:
            run_sync(key, fn)
        runs = 0
        with quiet():
            start = time.perf_counter()
            for key in keys:
                run_sync(key, fn)
            elapsed = time.perf_counter() - start
        series.values.append(elapsed / len(keys) * 1e6)
        series.runs.append(runs)
        series.ok = series.ok and runs == len(keys)

    try:
        # The median round: a hand-over's time is the scheduler's (the two threads on one
        # CPU or on two), whose spread the best round would hide, as in (e).
        return _each_sync(
            [*groups, HANDOVER_FLOOR], sizes.policy_rounds, measure, stat="median"
        )
    finally:
        floor.close()


class _Handover:
    """(h)'s sync floor: a kept thread that takes a job through one lock and gives it
    back through another, nothing else (no group, no job object, no context)."""

    def __init__(self) -> None:
        self.go = threading.Lock()
        self.go.acquire()
        self.done = threading.Lock()
        self.done.acquire()
        self.stop = False
        self.thread = threading.Thread(target=self._serve, name="bench-handover", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            self.go.acquire()
            if self.stop:
                return
            self.done.release()

    def rounds(self, n: int) -> float:
        """Seconds for ``n`` hand-overs and hand-backs, one after another."""
        go, done = self.go, self.done
        start = time.perf_counter()
        for _ in range(n):
            go.release()
            if not done.acquire(timeout=WAIT):
                raise TimeoutError("the hand-over floor's thread did not answer")
        return time.perf_counter() - start

    def close(self) -> None:
        self.stop = True
        self.go.release()
        self.thread.join(WAIT)


def policies(sizes: Sizes) -> tuple[Results, Results, dict[str, int]]:
    """(h), both twins on the same groups (the async one in a loop of its own);
    then the kept outcomes each group holds, and the groups are closed, so no
    later scenario's garbage collection walks their 10,000 kept outcomes."""
    groups = policy_groups()
    try:
        _progress("(h) miss with every policy configured")
        asyncio.run(fill_kept(groups))
        with frozen():
            async_results = asyncio.run(policy_miss(groups, sizes))
            _progress("(h) miss with every policy configured, sync")
            sync_results = policy_miss_sync(groups, sizes)
        kept = {name: group.stats().kept for name, group in groups.items()}
    finally:
        for group in groups.values():
            group.close()
    return async_results, sync_results, kept


@dataclass
class Report:
    sizes: Sizes
    miss: Results
    herd: Results
    spread: Results
    storm: Results
    threads: Results
    threads_cpu: Results  # CPU seconds, the CPU-bound work
    threads_cpu_wall: Results  # total seconds, the CPU-bound work
    memory: Results
    sequential: dict[str, int]
    kept_hit: Results
    kept_hit_sync: Results
    policy: Results
    policy_sync: Results
    policy_kept: dict[str, int]  # (h) variant -> kept outcomes after its rounds
    how: dict[str, str]  # library -> how it was driven


def _progress(message: str) -> None:
    print(f"benchmarks: {message}", flush=True, file=sys.stderr)


async def _run_async(libs: Libs, none: Lib[Work, AsyncCall], sizes: Sizes) -> tuple[Results, ...]:
    # The rule's floor beside the libraries where it is one: a miss, and a key's memory.
    floor = {RULE_FLOOR: RULE_FLOOR_LIB}
    _progress("(a) miss")
    a = await miss({**libs, **floor}, sizes)
    _progress("(b) herd")
    b = await herd(libs, sizes)
    _progress("(c) many keys")
    c = await spread({**libs, NO_COALESCING: none}, sizes)
    _progress("(d) failure storm")
    d = await storm(libs, sizes)
    _progress("(f) memory per in-flight key")
    f = await memory({**libs, **floor, NO_COALESCING: none}, sizes)
    _progress("(g) kept-outcome hit")
    g = await kept_hit(sizes)
    return a, b, c, d, f, g


def run(
    async_libs: Sequence[Lib[Work, AsyncCall]],
    none_async: Lib[Work, AsyncCall],
    thread_libs: Sequence[Lib[SyncWork, SyncCall]],
    none_sync: Lib[SyncWork, SyncCall],
    sizes: Sizes,
) -> Report:
    libs = {lib.name: lib for lib in async_libs if lib.installed}
    tlibs = {lib.name: lib for lib in thread_libs if lib.installed}
    a, b, c, d, f, g = asyncio.run(_run_async(libs, none_async, sizes))
    _progress("(g) kept-outcome hit, sync")
    g_sync = kept_hit_sync(sizes)
    h, h_sync, kept = policies(sizes)
    _progress(f"(f) {sizes.sequential_flights:,} sequential flights")
    seq = asyncio.run(sequential(sizes))
    _progress("(e) threads")
    e = threads({**tlibs, NO_COALESCING: none_sync}, sizes)
    _progress("(e) threads, a CPU-bound work")
    e_wall, e_cpu = threads_cpu({**tlibs, NO_COALESCING: none_sync}, sizes)
    how = {f"{lib.name} (async)": lib.how for lib in libs.values()}
    how |= {f"{lib.name} (threads)": lib.how for lib in tlibs.values()}
    how[f"{RULE_FLOOR} (a), (f)"] = RULE_FLOOR_LIB.how
    if ttlcache_installed():
        how[f"{TTLCACHE} (g)"] = TTLCACHE_HOW
    how |= {f"{name} (h)": text for name, text in POLICY_HOW.items()}
    return Report(sizes, a, b, c, d, e, e_cpu, e_wall, f, seq, g, g_sync, h, h_sync, kept, how)
