"""The report: Markdown tables of every scenario, and the targets as PASS/MISS."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from statistics import median

from .peers import (
    FLIGHTGROUP,
    HANDOVER_FLOOR,
    NO_COALESCING,
    POLICY_KEPT,
    POLICY_NONE,
    POLICY_UNUSED,
    TTLCACHE,
    kept_retention,
)
from .rule_floor import RULE_FLOOR
from .scenarios import BARE, FLOOR, HIT_WARM, TASK, Report, Results, Series

PACKAGES = (
    "flightgroup",
    "oneflight",
    "singleflight",
    "coalescer",
    "async-lru",
    "cashews",
    "cachetools",
    "dogpile.cache",
    "filelock",
)


@dataclass(frozen=True)
class Target:
    what: str
    measured: str
    goal: str
    met: bool | None  # None: no verdict (nothing to compare with)
    must: bool = False  # a correctness must, not a speed target
    # What ``what`` was made from (``{other}`` where the run's fastest peer's name went),
    # and that name: one row for the target of runs whose fastest peers differ.
    row: str = ""
    other: str = ""

    @property
    def verdict(self) -> str:
        if self.met is None:
            return "n/a"
        if self.met:
            return "PASS"
        return "FAIL" if self.must else "MISS"


def _usable(series: Series) -> bool:
    return series.error is None and bool(series.values)


def _fastest(
    results: Results, peers: set[str], valid: Callable[[Series], bool] = _usable
) -> str | None:
    """The peer with the lowest value among those that did the job right."""
    good = [name for name in peers if name in results and valid(results[name])]
    return min(good, key=lambda name: results[name].value, default=None)


def _runs(series: Series) -> str:
    if not series.runs:
        return "—"
    low, high = min(series.runs), max(series.runs)
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def _number(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def _table(
    results: Results,
    unit: str,
    digits: int,
    runs_header: str = "runs",
    extra: Callable[[str, Series], str] | None = None,
    extra_header: str = "",
    versus: str | None = None,
) -> list[str]:
    """One row per library: runs, best, median and worst, and flightgroup ÷ this
    (on the scenario's own statistic); with ``versus``, this ÷ that row instead."""
    mine = results.get(FLIGHTGROUP if versus is None else versus)
    stat = next(iter(results.values())).stat
    header = ["library" if versus is None else "group", runs_header, f"{unit}: best"]
    header += ["median", "worst"]
    header += [extra_header] if extra else []
    header.append(f"flightgroup ÷ this ({stat})" if versus is None else f"this ÷ {versus} ({stat})")
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for name, series in results.items():
        if not _usable(series):
            cells = [name, "—", f"error: {series.error or 'no sample'}", "—", "—"]
            cells += ["—"] if extra else []
            lines.append("| " + " | ".join([*cells, "—"]) + " |")
            continue
        values = series.values
        cells = [name, _runs(series)]
        cells += [_number(v, digits) for v in (min(values), median(values), max(values))]
        cells += [extra(name, series)] if extra else []
        if mine is None or not _usable(mine) or series.value <= 0 or mine.value <= 0:
            ratio = "—"
        elif versus is None:
            ratio = f"{mine.value / series.value:.2f}×"
        else:
            ratio = f"{series.value / mine.value:.2f}×"
        lines.append("| " + " | ".join([*cells, ratio]) + " |")
    return lines


def _compare(
    what: str,
    results: Results,
    other: str | None,
    goal: float | None,
    strict: bool = False,
    me: str = FLIGHTGROUP,
) -> Target:
    """``me``'s value (flightgroup's) ÷ ``other``'s, against ``goal`` (None: for
    information). ``what`` may hold ``{other}``, replaced by the name of the one
    compared with."""
    row, name = what, other or "none usable"
    what = row.format(other=name)
    mine = results.get(me)
    theirs = None if other is None else results.get(other)
    if mine is None or theirs is None or not _usable(mine) or not _usable(theirs):
        return Target(what, "—", "—", None, row=row, other=name)
    ratio = mine.value / theirs.value
    if goal is None:
        return Target(what, f"{ratio:.2f}×", "information", None, row=row, other=name)
    met = ratio < goal if strict else ratio <= goal
    sign = "<" if strict else "≤"
    return Target(what, f"{ratio:.2f}×", f"{sign} {goal:.2f}×", met, row=row, other=name)


def targets(report: Report) -> list[Target]:
    peers = set(report.miss) - {FLIGHTGROUP, BARE, TASK, RULE_FLOOR}
    thread_peers = set(report.threads) - {FLIGHTGROUP, NO_COALESCING}

    def once(series: Series) -> bool:
        return _usable(series) and all(runs == 1 for runs in series.runs)

    def real_misses(series: Series) -> bool:
        return _usable(series) and series.ok

    fastest = _fastest(report.miss, peers, real_misses)
    # Issue 31's goals for a miss, against the floors its own task leaves (ADR 0002): on
    # 3.12+ the task starts eagerly and the fastest peer (inline await) is the bar; 3.11
    # has no eager start, so a miss pays a trip through the loop, and one task per call
    # is the bar there.
    eager = sys.version_info >= (3, 12)
    out = [
        _compare(
            "(a) miss ÷ the fastest peer's miss ({other})",
            report.miss,
            fastest,
            1.5 if eager else None,
        ),
        _compare(
            "(a) miss ÷ one task per call", report.miss, TASK, None if eager else 1.5
        ),
        _compare("(a) miss ÷ a bare `await fn()`", report.miss, BARE, None),
        _compare(
            "(a) miss ÷ the rule's floor (what its bookkeeping costs above the rule itself)",
            report.miss,
            RULE_FLOOR,
            None,
        ),
        _compare(
            "(b) herd: joiner cost ÷ the fastest peer's ({other})",
            report.herd,
            _fastest(report.herd, peers, once),
            1.0,
        ),
        _compare("(b) herd: joiner cost ÷ the floor's", report.herd, FLOOR, 1.1),
        _compare(
            "(c) many keys: total time ÷ the fastest peer's ({other})",
            report.spread,
            _fastest(report.spread, peers),
            None,
        ),
        _compare("(c) many keys: total time ÷ no coalescing", report.spread, NO_COALESCING, None),
        _compare(
            "(e) threads: total time ÷ no coalescing", report.threads, NO_COALESCING, 1.0, True
        ),
        _compare(
            "(e) threads: total time ÷ the fastest thread peer's ({other})",
            report.threads,
            _fastest(report.threads, thread_peers),
            1.0,
        ),
        _compare(
            "(e) threads, a CPU-bound work: CPU time ÷ no coalescing's (coalescing saves most)",
            report.threads_cpu,
            NO_COALESCING,
            0.5,
        ),
        _compare(
            "(e) threads, a CPU-bound work: total time ÷ no coalescing",
            report.threads_cpu_wall,
            NO_COALESCING,
            None,
        ),
        _compare(
            "(g) kept hit: `await g.run(key, fn)` ÷ a TTLCache lookup behind a Lock in a "
            "coroutine",
            report.kept_hit,
            TTLCACHE,
            1.5,
        ),
        _compare(
            "(g) kept hit, sync: `g.run_sync(key, fn)` ÷ a TTLCache lookup behind a Lock",
            report.kept_hit_sync,
            TTLCACHE,
            None,
        ),
        _compare(
            "(h) miss, every policy configured but unused ÷ `FlightGroup()`'s miss",
            report.policy,
            POLICY_NONE,
            1.2,
            me=POLICY_UNUSED,
        ),
        _compare(
            "(h) miss, every policy configured, every outcome kept ÷ `FlightGroup()`'s miss",
            report.policy,
            POLICY_NONE,
            None,
            me=POLICY_KEPT,
        ),
        _compare(
            "(h) miss, sync: every policy configured but unused ÷ `FlightGroup()`'s",
            report.policy_sync,
            POLICY_NONE,
            3.0,  # issue 31: a hand-over to a kept thread and back (ADR 0038)
            me=POLICY_UNUSED,
        ),
        _compare(
            "(h) miss, sync: every policy configured but unused ÷ the bare hand-over to "
            "another thread and back (its floor on this host)",
            report.policy_sync,
            HANDOVER_FLOOR,
            None,
            me=POLICY_UNUSED,
        ),
        _compare(
            "(h) miss, sync: every policy configured, every outcome kept ÷ `FlightGroup()`'s",
            report.policy_sync,
            POLICY_NONE,
            None,
            me=POLICY_KEPT,
        ),
    ]
    leanest = _fastest(report.memory, set(report.memory) - {FLIGHTGROUP, NO_COALESCING, RULE_FLOOR})
    out.append(
        _compare(
            "(f) memory per in-flight key ÷ the leanest peer's ({other})",
            report.memory,
            leanest,
            1.0,
        )
    )
    out.append(
        _compare(
            "(f) memory per in-flight key ÷ the rule's floor (what its bookkeeping holds "
            "above the rule itself)",
            report.memory,
            RULE_FLOOR,
            None,
        )
    )
    out.append(
        _compare(
            "(f) the rule's floor per in-flight key ÷ the leanest peer's ({other})",
            report.memory,
            leanest,
            None,
            me=RULE_FLOOR,
        )
    )
    herd, storm = report.herd.get(FLIGHTGROUP), report.storm.get(FLIGHTGROUP)
    if herd is not None:
        out.append(Target("(b) herd: flightgroup's runs of fn", _runs(herd), "1", once(herd), True))
    if storm is not None:
        raised = "yes" if storm.ok else "no"
        out.append(
            Target(
                "(d) failure storm: flightgroup's runs per wave in every wave; every caller raised",
                f"{_runs(storm)}; {raised}",
                "1; yes",
                once(storm) and storm.ok,
                True,
            )
        )
    seq = report.sequential
    left = seq["table entries"] + seq["detached entries"] + seq["stats().in_flight"]
    out.append(
        Target(
            f"(f) flightgroup's table after {report.sizes.sequential_flights:,} flights",
            f"{seq['table entries']} entries, in_flight {seq['stats().in_flight']}",
            "0",
            left == 0 and seq["flights"] == report.sizes.sequential_flights,
            True,
        )
    )
    hits = [r[FLIGHTGROUP] for r in (report.kept_hit, report.kept_hit_sync) if FLIGHTGROUP in r]
    if hits:
        served = all(once(series) and series.ok for series in hits)
        out.append(
            Target(
                "(g) kept hit: flightgroup's runs of fn per round, async and sync; every hit "
                "served the value",
                f"{'; '.join(_runs(series) for series in hits)}; {'yes' if served else 'no'}",
                f"{'; '.join('1' for _ in hits)}; yes",
                served,
                True,
            )
        )
    variants = [*report.policy.values(), *report.policy_sync.values()]
    if variants:
        misses = all(_usable(series) and series.ok for series in variants)
        full = kept_retention().max_items
        kept = report.policy_kept
        nothing, every = kept.get(POLICY_UNUSED, -1), kept.get(POLICY_KEPT, -1)
        out.append(
            Target(
                "(h) every timed call ran fn; kept outcomes after: nothing kept, every "
                "outcome kept (= max_items)",
                f"{'yes' if misses else 'no'}; {nothing:,}; {every:,}",
                f"yes; 0; {full:,}",
                misses and nothing == 0 and every == full,
                True,
            )
        )
    return out


def flightgroup_ok(report: Report, found: list[Target]) -> bool:
    """False if flightgroup crashed in a scenario or broke a must."""
    crashed = any(
        FLIGHTGROUP in results and results[FLIGHTGROUP].error is not None
        for results in (
            report.miss,
            report.herd,
            report.spread,
            report.storm,
            report.memory,
            report.threads,
            report.threads_cpu_wall,
            report.kept_hit,
            report.kept_hit_sync,
        )
    ) or any(
        series.error is not None
        for results in (report.policy, report.policy_sync)
        for series in results.values()
    )
    return not crashed and all(t.met is not False for t in found if t.must)


def _versions() -> str:
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def _git(*args: str) -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return ""
    return done.stdout


def src_digest() -> str:
    """A digest of every file under src/, to tell whether it changed during a run."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parent.parent.glob("src/**/*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def engine() -> str:
    """The engine's source: HEAD, and the files of src/ that differ from it."""
    head = _git("rev-parse", "--short", "HEAD").strip() or "unknown"
    changed = _git("status", "--porcelain", "--", "src").splitlines()
    if not changed:
        return head
    return f"{head} with uncommitted changes to {', '.join(line[3:] for line in changed)}"


def this_python() -> str:
    """The interpreter that runs the report, as it names it: ``CPython 3.13.0``."""
    return f"{platform.python_implementation()} {platform.python_version()}"


def _environment(source: str) -> list[str]:
    return [
        f"- Python: {this_python()} ({platform.system()} {platform.machine()}), "
        f"{os.cpu_count()} cores",
        f"- Libraries: {_versions()}",
        f"- flightgroup source: {source}",
    ]


def _targets_table(found: Sequence[Target]) -> list[str]:
    return [
        "| target | measured | goal | result |",
        "| --- | --- | --- | --- |",
        *(f"| {t.what} | {t.measured} | {t.goal} | {t.verdict} |" for t in found),
    ]


def render_only(title: str, section: list[str], found: list[Target], command: str,
                source: str) -> str:
    """A report of one section alone (``--only``): its environment, targets, tables."""
    lines = [
        f"# Benchmarks: {title}",
        "",
        f"Reproduce with `{command}` from the repository root.",
        "",
        *_environment(source),
        "",
        "## Targets",
        "",
        *_targets_table(found),
        "",
        *section,
    ]
    return "\n".join(lines)


def render(
    report: Report,
    found: list[Target],
    command: str,
    source: str,
    sections: Sequence[str] = (),
) -> str:
    """The whole report; ``sections`` (Markdown lines, e.g. the directory scope's)
    come after the process scope's tables."""
    s = report.sizes
    lines = [
        "# Benchmarks",
        "",
        f"Reproduce with `{command}` from the repository root.",
        "",
        *_environment(source),
        "- Method: every library runs in the same process, in rounds; the order of the "
        "libraries rotates each round; garbage collection is paused inside each timing. "
        "Ratios are flightgroup's ÷ the other's, below 1 means flightgroup is faster, taken "
        "on the best round where a timing is one thread's CPU work (other load on the "
        "machine only adds to it) and on the median round for threads (whose spread is the "
        "scheduler's own).",
        "",
        "## Targets",
        "",
        *_targets_table(found),
        "",
        "Why (a) and (e) miss their goals, and what bounds them: "
        "[performance.md](performance.md).",
        "",
        "## (a) Miss: distinct keys, fn returns at once",
        "",
        f"Sequential awaits in one task; {s.miss_rounds} short rounds of {s.miss_calls:,} "
        "calls, so that every library meets the machine's slow and fast spells alike; each "
        "round ends with one turn of the loop inside its timing, so what the calls left "
        "scheduled is paid for. `runs` counts fn's runs per round: a real miss runs fn on "
        "every call.",
        "",
        *_table(report.miss, "µs per call", 2),
        "",
        f"## (b) Herd: {s.herd_tasks:,} tasks on one key, fn sleeps {s.herd_sleep * 1e3:.0f} ms",
        "",
        f"µs per caller above the sleep = (wall time − {s.herd_sleep * 1e3:.0f} ms) ÷ "
        f"callers; {s.herd_rounds} rounds. It counts making each caller's task, its arrival "
        "and its wake-up; arrivals overlap the sleep, so what fits inside the sleep is not "
        "counted. The floor is the same number of tasks awaiting one bare `asyncio.Future`, "
        "resolved by a timer the first task arms.",
        "",
        *_table(report.herd, "µs per caller", 2),
        "",
        f"## (c) Many keys: {s.spread_tasks:,} tasks over {s.spread_keys:,} keys, fn sleeps "
        f"{s.spread_sleep * 1e3:g} ms",
        "",
        f"All tasks start together, so a key's callers overlap; {s.spread_rounds} rounds.",
        "",
        *_table(report.spread, "total s", 3),
        "",
        f"## (d) Failure storm: {s.storm_waves} waves of {s.storm_callers:,} callers of one "
        f"key, fn raises after {s.storm_sleep * 1e3:g} ms",
        "",
        f"One group per round for all its waves ({s.storm_rounds} rounds): a wave after a "
        "failed one must run fn again. µs per caller above the sleep, per wave.",
        "",
        *_table(
            report.storm,
            "µs per caller",
            2,
            runs_header="runs per wave",
            extra=lambda _, series: "yes" if series.ok else "no",
            extra_header="every caller raised",
        ),
        "",
        f"## (e) Threads: {s.threads} threads × {s.thread_calls:,} calls over "
        f"{s.thread_keys} keys, fn = `time.sleep({s.thread_sleep:g})`",
        "",
        f"Each thread's keys are drawn at random once (seeded) and replayed for every "
        f"library; {s.thread_rounds} rounds.",
        "",
        *_table(report.threads, "total s", 3),
        "",
        f"## (e) Threads with a CPU-bound work: {s.threads} threads × {s.cpu_calls:,} calls "
        f"over {s.thread_keys} keys, fn burns about {s.cpu_work * 1e3:g} ms of CPU in Python",
        "",
        "The same plans; the process's CPU time per round (`time.process_time`), then the "
        f"total time; {s.cpu_rounds} rounds. A call that joins runs no work: coalescing "
        "saves the CPU of every joiner.",
        "",
        *_table(report.threads_cpu, "CPU s", 3),
        "",
        *_table(report.threads_cpu_wall, "total s", 3),
        "",
        f"## (f) Memory per in-flight key: {s.memory_keys:,} keys in flight at once",
        "",
        "tracemalloc, bytes held while every key's work waits on one event (one turn of "
        "the loop after the last work started), ÷ keys. The "
        "callers' own tasks are counted for every library alike; `no coalescing` (each task "
        "awaits fn itself) is that floor. The rule's floor is the least that keeps "
        "flightgroup's rules (benchmarks/rule_floor.py: the work in a task of its own, a "
        "future for each caller that waits, a dict behind a lock); what flightgroup holds "
        "above it is its bookkeeping.",
        "",
        *_memory_table(report.memory),
        "",
        f"## (f) flightgroup's table after {s.sequential_flights:,} sequential flights",
        "",
        "Distinct keys, one flight in ten fails.",
        "",
        "| what | count |",
        "| --- | --- |",
        *(f"| {name} | {count:,} |" for name, count in report.sequential.items()),
        "",
        *_kept_hit_section(report),
        *_policy_section(report),
        *sections,
        "## How each library is driven",
        "",
        "Each round binds a fresh group (or cache) around that round's fn; `call(key)` is "
        "a plain lambda over the library's API (for async-lru and cashews, the decorated "
        "function itself).",
        "",
        *(f"- {name}: {how}" for name, how in report.how.items()),
        "",
    ]
    return "\n".join(lines)


def _memory_table(results: Results) -> list[str]:
    floor = results.get(NO_COALESCING)
    lines = ["| library | bytes per key | above no coalescing |", "| --- | --- | --- |"]
    for name, series in results.items():
        if not _usable(series):
            lines.append(f"| {name} | error: {series.error or 'no sample'} | — |")
            continue
        above = (
            _number(series.value - floor.value, 0)
            if floor is not None and _usable(floor) and name != NO_COALESCING
            else "—"
        )
        lines.append(f"| {name} | {_number(series.value, 0)} | {above} |")
    return lines


def _kept_hit_section(report: Report) -> list[str]:
    s = report.sizes
    return [
        f"## (g) Kept-outcome hit: one key, {s.hit_calls:,} sequential calls that all hit",
        "",
        "`FlightGroup(retention=Retention(success=3600))`, a new group per round: fn runs "
        f"once to warm the key up, {HIT_WARM} untimed calls hit, then {s.hit_calls:,} timed "
        "calls hit too (each served from the kept outcome); "
        f"{s.hit_rounds} rounds, alternating with the yardstick, best round kept. The "
        "yardstick is a `cachetools.TTLCache(maxsize=10_000, ttl=3600)` lookup behind a "
        "`threading.Lock` inside an `async def` that is awaited, so both pay one coroutine "
        "call; the sync twin times `g.run_sync(key, fn)` against the same lookup in a plain "
        "function, outside any event loop. `runs` counts fn's runs per round, warm-up "
        "included.",
        "",
        "Async, `await g.run(key, fn)`:",
        "",
        *_table(report.kept_hit, "µs per call", 3),
        "",
        "Sync, `g.run_sync(key, fn)`:",
        "",
        *_table(report.kept_hit_sync, "µs per call", 3),
        "",
    ]


def _policy_section(report: Report) -> list[str]:
    s = report.sizes
    kept = report.policy_kept
    return [
        "## (h) Miss with every policy configured: distinct keys, fn returns at once",
        "",
        "As (a), on three groups: `FlightGroup()`; every policy configured but unused "
        "(`deadline=60.0`, `Retry(attempts=3)`, `Retention(success=None, error=None)`, "
        "`Limits(max_waiters=10_000, max_flights=1_000_000)`); and the same keeping every "
        "outcome (`Retention(success=60.0)`). One group per variant for the whole scenario, "
        "every key new; the last variant's store is filled to its max_items "
        f"({kept_retention().max_items:,}) before the first timing, so every timed call "
        f"keeps its outcome and evicts the least recently used one. {s.policy_rounds} rounds "
        f"of {s.policy_calls:,} calls, the variants' order rotating, best round kept (async); "
        "before each async timing the event loop turns once, so the cancelled deadline timers are "
        "dropped as a serving loop would drop them. Ratios are each variant ÷ "
        "`FlightGroup()`. Kept outcomes after the rounds: "
        + ", ".join(f"{name}: {count:,}" for name, count in kept.items())
        + ".",
        "",
        "Async, `await g.run(key, fn)`:",
        "",
        *_table(report.policy, "µs per call", 2, versus=POLICY_NONE),
        "",
        f"Sync, `g.run_sync(key, fn)`, {s.policy_sync_calls:,} calls per round (a sync work "
        "with a deadline runs each attempt on one of the group's kept threads, so every call "
        "of the configured variants hands its work to another thread and waits for it); the "
        "median round, as for (e): a hand-over takes a few µs when the scheduler keeps the two "
        "threads on one CPU and tens of µs when it wakes another, and the best round would "
        "show the rare first kind:",
        "",
        *_table(report.policy_sync, "µs per call", 2, versus=POLICY_NONE),
        "",
    ]
