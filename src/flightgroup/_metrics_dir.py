"""Counts that the worker processes of one server share through a directory (ADR 0046).

A scrape reaches one worker of a server that runs several (``uvicorn --workers``,
gunicorn), so each worker's own counters are not what the server did. Here each process
that exports groups with a directory writes its counts to ``DIR/<pid>-<token>.json``
(a temporary file, then ``os.replace``: a reader sees a whole snapshot or the previous
one) every ``interval`` seconds, before each scrape it answers, and at exit; it holds an
exclusive ``flock`` on ``DIR/<pid>-<token>.lock`` while it lives, which the kernel frees
when it dies, however it dies. A reader sums every snapshot file of the directory:

- counters and histograms of every process that ever wrote there, live or dead, so a
  sum never goes down when a worker exits or is killed (a killed worker loses what it
  counted since its last write, at most ``interval`` seconds of it);
- gauges of the live processes only (those whose lock is held).

A reader merges the files of the dead writers it found into ``DIR/dead.json`` (their
summed counters and histograms, and their idents) and removes them, so a directory does
not grow with every worker that ever ran. Readers take turns under an exclusive ``flock``
of ``DIR/.readers.lock``; writers never wait for it.

Invariant M1: a process's file only ever grows. Its snapshots are taken and written under
one lock, so a later write never holds smaller counts than an earlier one; a removed
group's counts stay in its process's file; a forked child writes a file of its own, with
its counts less those it inherited from its parent at the fork (the parent's file has
those). With M1, two scrapes that follow each other read every file at least as grown the
second time, whichever workers they reach.

Invariant M2: a reader counts a dead writer's counts once: from its file or from
``dead.json``, which names the files it holds (a file its reader died before removing is
skipped), and readers do not read while another merges.

Nothing here runs on a call's path: the writer copies a group's counters once per
``interval`` under the group's lock, as ``stats()`` does.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import secrets
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._log import log

__all__ = ["Buckets", "Counts", "Writer", "read"]


@dataclass(slots=True)
class Buckets:
    """One histogram: cumulative counts, one per bucket bound and then ``+Inf`` (the
    count of observations), and the sum of the observations."""

    cumulative: list[float]
    total: float

    def plus(self, other: Buckets) -> Buckets:
        if len(other.cumulative) != len(self.cumulative):
            raise ValueError("histograms of different buckets")
        return Buckets([a + b for a, b in zip(self.cumulative, other.cumulative, strict=True)],
                       self.total + other.total)

    def minus(self, other: Buckets) -> Buckets:
        return Buckets([a - b for a, b in zip(self.cumulative, other.cumulative, strict=True)],
                       self.total - other.total)


@dataclass(slots=True)
class Counts:
    """One group's counters, gauges and histograms, in one process or summed over
    several (names without the metric prefix: ``calls``, ``in_flight``,
    ``flight_seconds``, ...)."""

    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Buckets] = field(default_factory=dict)

    def plus(self, other: Counts, *, gauges: bool = True) -> Counts:
        """The sum of both; ``gauges=False`` keeps this one's gauges (``other`` is a
        dead process's)."""
        made = Counts(dict(self.counters), dict(self.gauges), dict(self.histograms))
        for name, value in other.counters.items():
            made.counters[name] = made.counters.get(name, 0.0) + value
        if gauges:
            for name, value in other.gauges.items():
                made.gauges[name] = made.gauges.get(name, 0.0) + value
        for name, buckets in other.histograms.items():
            mine = made.histograms.get(name)
            made.histograms[name] = buckets if mine is None else mine.plus(buckets)
        return made

    def minus(self, base: Counts) -> Counts:
        """These counters and histograms less ``base``'s; the gauges are this one's."""
        counters = {name: value - base.counters.get(name, 0.0)
                    for name, value in self.counters.items()}
        histograms = {
            name: buckets if name not in base.histograms else buckets.minus(base.histograms[name])
            for name, buckets in self.histograms.items()
        }
        return Counts(counters, dict(self.gauges), histograms)

    def without_gauges(self) -> Counts:
        return Counts(dict(self.counters), {}, dict(self.histograms))

    def to_json(self) -> dict[str, Any]:
        return {
            "counters": self.counters,
            "gauges": self.gauges,
            "histograms": {name: {"cumulative": b.cumulative, "total": b.total}
                           for name, b in self.histograms.items()},
        }

    @staticmethod
    def from_json(data: Any) -> Counts:
        """Raises ValueError for anything but what ``to_json`` makes."""
        try:
            counters = {str(k): float(v) for k, v in data["counters"].items()}
            gauges = {str(k): float(v) for k, v in data["gauges"].items()}
            histograms = {
                str(k): Buckets([float(c) for c in v["cumulative"]], float(v["total"]))
                for k, v in data["histograms"].items()
            }
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a snapshot: {e!r}") from e
        return Counts(counters, gauges, histograms)


# Every writer of this process that has not closed (for ``read`` and the fork and exit hooks).
_WRITERS: weakref.WeakSet[Writer] = weakref.WeakSet()


class Writer:
    """Writes this process's counts of some groups to its own file of ``directory``,
    every ``interval`` seconds, at ``write()`` and at exit, until ``close()``.

    ``live`` returns the counts of the groups exported now, by name. The caller that
    stops exporting a group calls ``retire`` under ``lock`` in the same step, so no
    snapshot misses that group's counts (M1).
    """

    def __init__(
        self, directory: str | os.PathLike[str], interval: float,
        live: Callable[[], dict[str, Counts]],
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, not {interval!r}")
        self.directory = Path(os.path.realpath(directory))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.interval = interval
        self._live = live
        # Held while a snapshot is taken and written (M1), and by ``retire``'s caller.
        self.lock = threading.Lock()
        # Written under ``lock`` only:
        self._retired: dict[str, Counts] = {}  # removed groups' counts, kept (M1)
        self._baseline: dict[str, Counts] = {}  # counts inherited at a fork, not ours
        self._written: dict[str, Counts] | None = None  # the last snapshot written
        self._failing = False  # a write failed and was logged; the next success clears it
        self._closed = False
        self._start()
        _WRITERS.add(self)

    def _start(self) -> None:
        """Take a new identity (``<pid>-<token>``, the name of this process's files):
        its lock, held until the process dies or ``close``, and its thread."""
        self._ident = f"{os.getpid()}-{secrets.token_hex(4)}"
        lock_path = self.directory / f"{self._ident}.lock"
        self._lock_fd: int | None = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        # Held before the first snapshot exists: a file whose lock is free is a dead writer's.
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        self._stop = threading.Event()
        thread = threading.Thread(target=self._loop, args=(self._stop,),
                                  name="flightgroup-metrics-writer", daemon=True)
        thread.start()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            self.write()

    def retire(self, name: str, counts: Counts) -> None:
        """(Under ``lock``) keep the counts of the group ``name``, which is no longer in
        ``live()``, in every later snapshot."""
        mine = counts.minus(self._baseline.pop(name, Counts())).without_gauges()
        kept = self._retired.get(name)
        self._retired[name] = mine if kept is None else kept.plus(mine)

    def _snapshot(self) -> dict[str, Counts]:
        made = dict(self._retired)
        for name, counts in self._live().items():
            base = self._baseline.get(name)
            mine = counts if base is None else counts.minus(base)
            kept = made.get(name)
            made[name] = mine if kept is None else kept.plus(mine)
        return made

    def write(self) -> None:
        """Write this process's counts now (nothing if they have not changed). A failure
        to write is logged once, until a write succeeds."""
        with self.lock:
            if self._closed:
                return
            try:
                snapshot = self._snapshot()
                if snapshot == self._written:
                    return
                data = json.dumps(
                    {"pid": os.getpid(),
                     "groups": {name: c.to_json() for name, c in snapshot.items()}}
                ).encode()
                temporary = self.directory / f".{self._ident}.tmp"
                temporary.write_bytes(data)
                os.replace(temporary, self.directory / f"{self._ident}.json")
            except OSError as e:
                if not self._failing:
                    log.warning("cannot write metrics to %s: %s", self.directory, e)
                self._failing = True
                return
            self._failing = False
            self._written = snapshot

    def close(self) -> None:
        """Write one last time, then let go of the lock: this process's gauges leave the
        sums, its counters stay in them."""
        self.write()
        with self.lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
        _WRITERS.discard(self)

    def _forked(self) -> None:
        """(In a forked child, its only thread) write a file of our own from now on,
        with the counts this process inherited left out: the parent's file has them."""
        self.lock = threading.Lock()
        if self._lock_fd is not None:
            # Closing our copy leaves the parent's lock held: it is the parent's until it dies.
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._closed:
            return
        self._retired = {}
        self._baseline = self._live()
        self._written = None
        self._failing = False
        self._start()


def _after_fork() -> None:
    for writer in list(_WRITERS):
        writer._forked()


def _at_exit() -> None:
    for writer in list(_WRITERS):
        with contextlib.suppress(Exception):
            writer.close()


os.register_at_fork(after_in_child=_after_fork)
atexit.register(_at_exit)


def _alive(lock_path: Path) -> bool:
    """Whether the process that wrote next to ``lock_path`` still holds its lock."""
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the lock if we took it: that process is dead
    return False


# The counts of dead writers merged into one file, and the idents merged (``merged``).
DEAD = "dead"
# Held (exclusive flock) while a reader reads and merges, so no reader sees a dead writer's
# counts both merged and in its own file, or in neither.
READERS_LOCK = ".readers.lock"


def _snapshots(directory: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each readable snapshot file of ``directory`` but the dead writers' one: its
    writer's ident and groups."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return
    for entry in entries:
        name = entry.name
        if name.startswith(".") or not name.endswith(".json") or name == f"{DEAD}.json":
            continue
        try:
            groups = json.loads(Path(entry.path).read_bytes())["groups"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # gone since the listing, or not a writer's snapshot
        if isinstance(groups, dict):
            yield name[: -len(".json")], groups


def _parse(groups: Any) -> Iterator[tuple[str, Counts]]:
    """Each group's counts of a snapshot's ``groups`` (those that parse)."""
    if not isinstance(groups, dict):
        return
    for group, data in groups.items():
        try:
            yield str(group), Counts.from_json(data)
        except ValueError:
            continue


def _add(sums: dict[str, Counts], group: str, counts: Counts, *, alive: bool) -> None:
    kept = sums.get(group)
    if kept is None:
        sums[group] = counts if alive else counts.without_gauges()
        return
    with contextlib.suppress(ValueError):  # another version's buckets: they do not add up
        sums[group] = kept.plus(counts, gauges=alive)


def read(directory: str | os.PathLike[str]) -> tuple[dict[str, Counts], int]:
    """Every group's counts summed over the processes that wrote to ``directory`` (the
    gauges over the live ones only), and how many of those processes live. This
    process's writers of that directory write first, so its own counts are fresh.

    The files of writers found dead are merged into ``dead.json`` and removed, so a
    directory does not grow with every worker that ever ran. ``dead.json`` names the
    writers it holds: a file that its removal left behind (the reader died between the
    two) is not counted twice.
    """
    resolved = Path(os.path.realpath(directory))
    for writer in list(_WRITERS):
        if writer.directory == resolved:
            writer.write()
    if not resolved.is_dir():
        return {}, 0
    fd = os.open(resolved / READERS_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _read_and_merge(resolved)
    finally:
        os.close(fd)


def _read_and_merge(directory: Path) -> tuple[dict[str, Counts], int]:
    """(Under the readers' lock) ``read``'s sums, merging dead writers' files."""
    dead_path = directory / f"{DEAD}.json"
    merged: set[str] = set()
    dead: dict[str, Counts] = {}
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        data = json.loads(dead_path.read_bytes())
        merged = {str(ident) for ident in data["merged"]}
        dead = dict(_parse(data["groups"]))
    sums = dict(dead)
    live = 0
    gone: list[str] = []  # dead writers' idents whose files are to be removed
    for ident, groups in _snapshots(directory):
        if ident in merged:
            gone.append(ident)  # counted in dead.json already
            continue
        alive = _alive(directory / f"{ident}.lock")
        live += alive
        for group, counts in _parse(groups):
            _add(sums, group, counts, alive=alive)
            if not alive:
                _add(dead, group, counts, alive=False)
        if not alive:
            gone.append(ident)
    if any(ident not in merged for ident in gone):  # a dead writer not merged yet
        try:
            data = json.dumps({
                "merged": gone,  # those not listed were removed by an earlier reader
                "groups": {group: counts.to_json() for group, counts in dead.items()},
            }).encode()
            temporary = directory / f".{DEAD}.tmp"
            temporary.write_bytes(data)
            os.replace(temporary, dead_path)
        except OSError as e:
            log.warning("cannot merge dead writers' metrics in %s: %s", directory, e)
            return sums, live
    for ident in gone:
        for suffix in (".json", ".lock"):
            with contextlib.suppress(FileNotFoundError):
                (directory / f"{ident}{suffix}").unlink()
    return sums, live
