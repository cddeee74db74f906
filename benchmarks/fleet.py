"""The fleet scope: processes anywhere that name one Redis share flights.

``python -m benchmarks`` runs this section with the rest of the suite (a "Fleet scope"
section and its targets in the report); ``python -m benchmarks --only fleet [--quick]
[--write PATH] [--update PATH]`` (or ``scripts/dev bench --only fleet``) runs and
prints just this section; ``--update docs/benchmarks.md`` replaces that section in the
document (or adds it) and keeps every other section.

The run starts a ``redis-server`` of its own on a free loopback port (nothing on disk,
stopped by its pid at the end), so no other client of a shared server shows in its
counts. Every measurement uses real processes (multiprocessing's "forkserver" context,
"spawn" where there is none), driven over pipes; each opens its own
``FlightGroup(redis=URL, namespace=NS, codec=JSON)`` and makes one call before anything
is counted or timed (its event loop, its connection, the scripts loaded). Times that
span processes are read from CLOCK_MONOTONIC (``time.monotonic_ns``), which every
process of a host shares.

1. Round trips per leader and per joiner: a leader in one process, one joiner in
   another; the leader's work waits until the joiner has joined, then 20 ms, then
   returns (a flight far shorter than lease/3). Each process counts
   the requests its arbiter sends (a wrapper around ``RedisArbiter._script`` and
   around its blocking clients' ``xread``), and the server's INFO commandstats delta
   over the round (every command any client sent, the benchmark's own INFO left
   out) must equal their sum: no hidden re-send, handshake or NOSCRIPT. Goal:
   leader 2 (ACQUIRE, COMPLETE), joiner 2 (ACQUIRE, XREAD).
2. Joiner wake-up, in the same rounds: from the leader's arbiter sending COMPLETE
   to the joiner's ``await g.run(...)`` returning with the value in the other
   process (and to its XREAD's reply). The floor: redis-py alone, an XADD in one
   process waking an ``XREAD BLOCK`` in another, in rounds interleaved with these.
3. Herd: 8 processes × 500 asyncio tasks on one key, the work appends a line to a
   journal file and sleeps 200 ms: one run, every caller gets the value, exactly one
   ACQUIRE per process reaches Redis (local coalescing: the wrappers' count, and the
   server's EVALSHA count), and the wall time above the work.
4. Against what users do today, the same herd shape and work: cashews with its Redis
   backend (``@cache(ttl=..., key=..., lock=True)``), and dogpile.cache's
   ``dogpile.cache.redis`` backend with ``distributed_lock=True`` (synchronous: 500
   threads per process, beside flightgroup's ``run_sync`` in 500 threads).
5. Redis down (a server of its own, SIGKILLed): the time of each call refused while
   Redis is known out of reach, against a group whose breaker is disabled, and how soon
   calls go through Redis again once it is back (see benchmarks/outage.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.synchronize import Barrier
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any, NamedTuple

from . import outage
from .directory import Herd as DirectoryHerd
from .outage import Outage
from .procs import WAIT, Proc, context, gather, serve
from .scenarios import quiet

if TYPE_CHECKING:
    from .report import Target

TITLE = "## Fleet scope: processes that name one Redis share flights"

FG_ASYNC = "flightgroup (async tasks)"
CASHEWS = "cashews (Redis backend, `lock=True`)"
FG_THREADS = "flightgroup (threads, `run_sync`)"
DOGPILE = "dogpile.cache (`dogpile.cache.redis`, `distributed_lock=True`)"
FLOOR_TASKS = "floor: tasks awaiting one `asyncio.Future` per process"
FLOOR_THREADS = "floor: threads waiting on one `threading.Event` per process"
HERD_LIBS = (FG_ASYNC, CASHEWS, FLOOR_TASKS, FG_THREADS, DOGPILE, FLOOR_THREADS)
THREADED = {FG_THREADS, DOGPILE, FLOOR_THREADS}
MINE = (FG_ASYNC, FG_THREADS)
PEER_OF = {CASHEWS: FG_ASYNC, DOGPILE: FG_THREADS}
FLOOR_OF = {FLOOR_TASKS: FG_ASYNC, FLOOR_THREADS: FG_THREADS}
PEER_MODULES = {CASHEWS: "cashews", DOGPILE: "dogpile.cache"}

NAMESPACE = "bench"
LEADER_GOAL = 2
JOINER_GOAL = 2
WAKE_GOAL = 1.3  # joiner wake-up p50 ÷ its floor's, read in the same rounds (issue 31)


@dataclass(frozen=True)
class FleetSizes:
    """How big each measurement is: FULL is the issue's numbers, QUICK a smoke run."""

    rounds: int  # leader + joiner rounds (round trips and wake-up), timed
    floor_rounds: int  # redis-py XADD -> XREAD rounds
    warm: int  # untimed rounds first
    herd_rounds: int  # per library
    processes: int = 8
    herd_callers: int = 500  # per process
    work: float = 0.200  # the herd's work sleeps this long
    settle: float = 0.020  # the leader waits this long after its joiner joined
    # dogpile.cache's herd runs once, last, and is cut after this long (see _measure_herds)
    dogpile_budget: float = 60.0
    outage_calls: int = 200  # (5) calls of one key, then of distinct keys, Redis down
    # (5) the same with the breaker disabled: each may cost a command timeout (2.5 s)
    outage_unguarded: int = 10
    outage_returns: int = 5  # (5) times Redis comes back ("back within")


FULL = FleetSizes(rounds=200, floor_rounds=200, warm=10, herd_rounds=5)
QUICK = FleetSizes(rounds=40, floor_rounds=40, warm=4, herd_rounds=1, dogpile_budget=15.0,
                   outage_calls=40, outage_unguarded=2, outage_returns=2)


def _clock() -> int:
    """Nanoseconds on CLOCK_MONOTONIC: one clock for every process of the host."""
    return time.monotonic_ns()


def _progress(message: str) -> None:
    print(f"benchmarks: fleet: {message}", flush=True, file=sys.stderr)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def _append(journal: str, line: str) -> None:
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{os.getpid()} {line}\n".encode())
    finally:
        os.close(fd)


def _journal_starts(journal: str) -> list[int]:
    """When each run of the work began (its journal lines: pid, key, monotonic ns)."""
    try:
        with open(journal, encoding="utf-8") as f:
            return sorted(int(line.split()[-1]) for line in f)
    except FileNotFoundError:
        return []


# -----------------------------------------------------------------------------
# a redis-server of the run's own
# -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """One ``redis-server`` on 127.0.0.1 and a free port, keeping nothing on disk;
    ``kill()`` SIGKILLs it and ``start()`` starts it again on the same port (empty);
    ``close()`` stops it by its pid."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = _free_port()
        self.dir = tempfile.mkdtemp(prefix="fgbredis")
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
        words = out.stdout.split()
        self.version = next((w[2:] for w in words if w.startswith("v=")), "unknown")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, poll: float = 0.02) -> int:
        """Start the server (again) and wait until it answers a PING, tried every
        ``poll`` s; when it first answered (monotonic ns)."""
        with open(os.path.join(self.dir, "redis.log"), "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir, "--protected-mode", "no",
                 "--maxclients", "10000"],
                stdout=log, stderr=log, start_new_session=True,
            )
        return self._wait_ready(poll)

    def kill(self) -> None:
        """SIGKILL the server by its pid and reap it: its port refuses connections."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def _wait_ready(self, poll: float) -> int:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return time.monotonic_ns()
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(poll)

    def close(self) -> None:
        if not hasattr(self, "proc"):  # it never started
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _commandstats(client: Any) -> dict[str, int]:
    """Calls per command since the server started (INFO commandstats)."""
    info = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(stats["calls"]) for name, stats in info.items()}


def _delta(
    before: dict[str, int], after: dict[str, int], leave_out: frozenset[str] = frozenset()
) -> dict[str, int]:
    """Commands sent between two snapshots, the benchmark's own INFO and the names in
    ``leave_out`` left out."""
    got = {
        name: calls - before.get(name, 0)
        for name, calls in after.items()
        if name != "info" and name not in leave_out
    }
    return {name: n for name, n in got.items() if n}


def _script_commands() -> frozenset[str]:
    """The commands flightgroup's Lua scripts call: commandstats counts them too, once
    per call inside a script, though no client sent them."""
    from flightgroup.redis import scripts

    return frozenset(
        name.lower()
        for body in scripts.SCRIPTS.values()
        for name in re.findall(r"redis\.call\('(\w+)'", body)
    )


# -----------------------------------------------------------------------------
# the worker (a child process): obeys commands from the parent, one at a time
# -----------------------------------------------------------------------------


class _Counter:
    """What this process's arbiter sends to Redis: requests by name, and when it sent
    its COMPLETEs and its XREADs (monotonic ns). Written on the arbiter's thread, and
    on the caller's loop for the XREADs a task's joiner reads there (ADR 0056)."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.complete_at: list[int] = []
        self.xread_at: list[int] = []
        self.xread_back: list[int] = []
        self.on_loop = 0  # the XREADs sent on a caller loop's own client

    def snapshot(self) -> dict[str, int]:
        return dict(self.sent)

    def since(self, before: dict[str, int]) -> dict[str, int]:
        got = {name: n - before.get(name, 0) for name, n in self.sent.items()}
        return {name: n for name, n in got.items() if n}


def _instrument(group: Any, counter: _Counter) -> None:
    """Count the arbiter's requests: its scripts, and its blocking client's XREADs."""
    arbiter = group._scope  # the RedisArbiter of a fleet group
    script = arbiter._script

    async def counted_script(name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        counter.sent[name] = counter.sent.get(name, 0) + 1
        if name == "complete":
            counter.complete_at.append(_clock())
        return await script(name, keys, args)

    arbiter._script = counted_script

    def count_reads(client: Any, *, on_loop: bool) -> Any:
        xread = client.xread

        async def counted_xread(*args: Any, **kwargs: Any) -> Any:
            counter.sent["xread"] = counter.sent.get("xread", 0) + 1
            if on_loop:  # (only the caller's loop writes it)
                counter.on_loop += 1
            counter.xread_at.append(_clock())
            try:
                return await xread(*args, **kwargs)
            finally:
                counter.xread_back.append(_clock())

        client.xread = counted_xread
        return client

    # A thread's joiner reads on the group's blocking client, as does a loop's first
    # join; a task's next, on a client of its own loop's (ADR 0056, 0058).
    count_reads(arbiter._blocking, on_loop=False)
    readers = arbiter._readers
    make = readers._make
    readers._make = lambda: count_reads(make(), on_loop=True)


class _Join(NamedTuple):
    """What a joiner's call of (1) and (2) saw in its process."""

    joined: bool
    sent: dict[str, int]  # requests sent
    reads: list[int]  # when its XREADs were sent (monotonic ns)
    backs: list[int]  # when they returned
    returned: int  # when the call returned
    on_loop: bool  # it read on its caller loop's own client


class _Worker:
    def __init__(self, barrier: Barrier, started: MpEvent, joined: MpEvent) -> None:
        self.barrier = barrier
        self.started = started
        self.joined = joined
        self.runner = asyncio.Runner()
        self.group: Any = None
        self.counter = _Counter()
        self.url = ""
        self.floor_client: Any = None
        self.cashews: Any = None
        self.cached: Any = None
        self.region: Any = None
        self.journal = ""
        self.pause = 0.0
        self.first_served = 0  # the last herd's first caller served here, monotonic ns

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        if self.floor_client is not None:
            with contextlib.suppress(Exception):
                self.runner.run(self.floor_client.aclose())
        self.runner.close()

    def open(self, url: str, namespace: str) -> int:
        """Open the fleet group, make one call (loop, connection, scripts), count."""
        from flightgroup import JSON, FlightGroup

        self.url = url
        self.group = FlightGroup(redis=url, namespace=namespace, codec=JSON)
        self.group.run_sync(f"connect:{os.getpid()}", lambda: 1, timeout=WAIT)
        _instrument(self.group, self.counter)
        return os.getpid()

    # -- (1), (2) a leader and a joiner in two processes ---------------------------

    def lead(self, key: str, settle: float) -> tuple[bool, dict[str, int], list[int]]:
        """Lead ``key``: the work waits for the joiner to join, then ``settle`` s.
        (joined?, requests sent, COMPLETE send times)."""
        return self.runner.run(self._lead(key, settle))

    async def _lead(self, key: str, settle: float) -> tuple[bool, dict[str, int], list[int]]:
        started, joined = self.started, self.joined

        async def work() -> str:
            started.set()
            await asyncio.to_thread(joined.wait, WAIT)
            await asyncio.sleep(settle)
            return f"value of {key}"

        before = self.counter.snapshot()
        completes = len(self.counter.complete_at)
        with quiet():
            result = await self.group.run(key, work, timeout=WAIT)
        if result.value != f"value of {key}":
            raise RuntimeError(f"the leader got {result.value!r}")
        return result.joined, self.counter.since(before), self.counter.complete_at[completes:]

    def join(self, key: str) -> _Join:
        """Join ``key`` (the parent calls after the leader's work started)."""
        return self.runner.run(self._join(key))

    async def _join(self, key: str) -> _Join:
        async def work() -> str:
            return "a joiner must not run the work"

        counter = self.counter
        before = counter.snapshot()
        reads, backs, on_loop = len(counter.xread_at), len(counter.xread_back), counter.on_loop
        with quiet():
            result = await self.group.run(key, work, on_join=self.joined.set, timeout=WAIT)
            returned = _clock()
        if result.value != f"value of {key}":
            raise RuntimeError(f"the joiner got {result.value!r}")
        return _Join(
            joined=result.joined, sent=counter.since(before), reads=counter.xread_at[reads:],
            backs=counter.xread_back[backs:], returned=returned,
            on_loop=counter.on_loop > on_loop,
        )

    def floor_read(self, stream: str) -> int:
        """redis-py alone: block on XREAD of ``stream`` from its start; when it returned."""
        return self.runner.run(self._floor_read(stream))

    async def _floor_client(self) -> Any:
        import redis.asyncio as aioredis

        if self.floor_client is None:
            self.floor_client = aioredis.Redis.from_url(self.url, socket_timeout=WAIT)
            await self.floor_client.ping()
        return self.floor_client

    async def _floor_read(self, stream: str) -> int:
        client = await self._floor_client()
        # Ready once quiet()'s collection is over, as a joiner of (2) is: else that
        # collection (milliseconds, in a worker that ran many rounds) may still run
        # when the XADD comes, and the floor would time it.
        with quiet():
            self.started.set()
            reply = await client.xread({stream: b"0"}, count=1, block=int(WAIT * 1000))
            returned = _clock()
        if not reply:
            raise RuntimeError("the floor's XREAD timed out")
        return returned

    def floor_write(self, stream: str) -> int:
        """redis-py alone: XADD to ``stream``; when it was sent."""
        return self.runner.run(self._floor_write(stream))

    async def _floor_write(self, stream: str) -> int:
        client = await self._floor_client()
        with quiet():  # (as the leader of (2): no collection lands in the timing)
            sent = _clock()
            await client.xadd(stream, {"v": "x"})
        await client.expire(stream, 60)
        return sent

    # -- (3), (4) herds -------------------------------------------------------------

    def setup_peers(self, url: str, callers: int) -> list[str]:
        """cashews' cache and dogpile.cache's region on ``url``; the peers set up."""
        ready = []
        if _importable(PEER_MODULES[CASHEWS]):
            from cashews import Cache

            self.cashews = Cache()
            self.cashews.setup(url)

            @self.cashews(ttl=600, key="fgbench:{key}", lock=True)
            async def cached(key: str) -> str:
                _append(self.journal, f"{key} {_clock()}")
                await asyncio.sleep(self.pause)
                return f"value of {key}"

            self.cached = cached
            ready.append(CASHEWS)
        if _importable(PEER_MODULES[DOGPILE]):
            from dogpile.cache import make_region

            self.region = make_region().configure(
                "dogpile.cache.redis",
                expiration_time=600,
                arguments={
                    "url": url,
                    "redis_expiration_time": 900,
                    "distributed_lock": True,
                    "thread_local_lock": False,
                    # redis-py's pool holds 100 connections by default: one thread per
                    # caller needs one each (past 100, MaxConnectionsError).
                    "connection_kwargs": {"max_connections": callers + 50},
                },
            )
            ready.append(DOGPILE)
        return ready

    def herd(
        self, lib: str, key: str, callers: int, pause: float, journal: str, budget: float
    ) -> tuple[int, int, int, int, str, dict[str, int], int, list[int], int]:
        """One herd of ``callers`` on ``key``: (start, end, callers that got the value,
        errors, the first error, requests this process's arbiter sent, callers still
        waiting when ``budget`` seconds had passed: threads only, left running, when
        each caller called, callers that called after a caller of this process had
        its value)."""
        self.journal, self.pause = journal, pause
        before = self.counter.snapshot()
        arrivals: list[int] = []
        if lib in THREADED:
            start, end, got, errors, first, waiting = self._threads(
                lib, key, callers, pause, journal, budget, arrivals
            )
        else:
            start, end, got, errors, first = self.runner.run(
                self._tasks(lib, key, callers, pause, journal, arrivals)
            )
            waiting = 0
        # Callers that called after this process's first caller had its value: the
        # flight had landed here, so the call leads (or joins) a flight of its own.
        late = sum(1 for t in arrivals if self.first_served and t > self.first_served)
        return (start, end, got, errors, first, self.counter.since(before), waiting,
                arrivals, late)

    async def _tasks(
        self, lib: str, key: str, callers: int, pause: float, journal: str,
        arrivals: list[int],
    ) -> tuple[int, int, int, int, str]:
        expected = f"value of {key}"

        async def work() -> str:
            _append(journal, f"{key} {_clock()}")
            await asyncio.sleep(pause)
            return expected

        if lib == FG_ASYNC:
            run = self.group.run

            async def call() -> str:
                result = await run(key, work, timeout=WAIT)
                value: str = result.value
                return value
        elif lib == CASHEWS:
            cached = self.cached

            async def call() -> str:
                value: str = await cached(key)
                return value
        elif lib == FLOOR_TASKS:
            loop = asyncio.get_running_loop()
            future: asyncio.Future[str] = loop.create_future()
            armed = False

            async def call() -> str:
                nonlocal armed
                if not armed:
                    armed = True
                    loop.call_later(pause, future.set_result, expected)
                return await future
        else:
            raise ValueError(f"unknown library {lib!r}")

        async def arrive() -> str:
            arrivals.append(_clock())
            value = await call()
            served.append(_clock())
            return value

        served: list[int] = []

        with quiet():
            self.barrier.wait(WAIT)
            start = _clock()
            outcomes = await asyncio.gather(
                *[arrive() for _ in range(callers)], return_exceptions=True
            )
            end = _clock()
        got = sum(1 for outcome in outcomes if outcome == expected)
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        first = f"{type(errors[0]).__name__}: {errors[0]}" if errors else ""
        self.first_served = min(served, default=0)
        return start, end, got, len(errors), first

    def _threads(
        self, lib: str, key: str, callers: int, pause: float, journal: str, budget: float,
        arrivals: list[int],
    ) -> tuple[int, int, int, int, str, int]:
        expected = f"value of {key}"

        def compute() -> str:
            _append(journal, f"{key} {_clock()}")
            time.sleep(pause)
            return expected

        if lib == FG_THREADS:
            run_sync = self.group.run_sync

            def call() -> Any:
                return run_sync(key, compute, timeout=WAIT).value
        elif lib == DOGPILE:
            get_or_create = self.region.get_or_create

            def call() -> Any:
                return get_or_create(key, compute)
        elif lib == FLOOR_THREADS:
            done = threading.Event()
            arm = threading.Lock()
            armed = False

            def call() -> Any:
                nonlocal armed
                with arm:
                    if not armed:
                        armed = True
                        threading.Timer(pause, done.set).start()
                done.wait()
                return expected
        else:
            raise ValueError(f"unknown library {lib!r}")

        go = threading.Event()
        ends = [0] * callers
        got = [False] * callers
        errors: list[BaseException] = []

        arrived = [0] * callers

        def caller(i: int) -> None:
            go.wait()
            arrived[i] = _clock()
            try:
                got[i] = call() == expected
            except Exception as exc:
                errors.append(exc)
            ends[i] = _clock()

        # Daemon threads: a herd cut at its budget must not keep the process alive.
        threads = [
            threading.Thread(target=caller, args=(i,), daemon=True) for i in range(callers)
        ]
        for thread in threads:
            thread.start()
        with quiet():
            self.barrier.wait(WAIT)
            start = _clock()
            go.set()
            cut = start + int(budget * 1e9)
            for thread in threads:
                thread.join(max(0.0, (cut - _clock()) / 1e9))
        waiting = sum(1 for thread in threads if thread.is_alive())
        arrivals += [t for t in arrived if t]
        self.first_served = min((e for e, ok in zip(ends, got, strict=True) if ok), default=0)
        first = f"{type(errors[0]).__name__}: {errors[0]}" if errors else ""
        end = cut if waiting else max(ends)
        return start, end, sum(got), len(errors), first, waiting


def _worker_main(conn: Connection, barrier: Barrier, started: MpEvent, joined: MpEvent) -> None:
    serve(conn, _Worker(barrier, started, joined))


# -----------------------------------------------------------------------------
# the parent: the server, the workers
# -----------------------------------------------------------------------------


@contextlib.contextmanager
def _workers(ctx: BaseContext, count: int) -> Iterator[tuple[list[Proc], MpEvent, MpEvent]]:
    barrier, started, joined = ctx.Barrier(count), ctx.Event(), ctx.Event()
    procs: list[Proc] = []
    try:
        for _ in range(count):
            procs.append(Proc(ctx, _worker_main, barrier, started, joined))
        yield procs, started, joined
    finally:
        for proc in procs:
            proc.stop()


# -----------------------------------------------------------------------------
# the measurements
# -----------------------------------------------------------------------------


@dataclass
class Rounds:
    """(1) and (2): a sample per timed round."""

    leader: list[dict[str, int]] = field(default_factory=list)  # requests per round
    joiner: list[dict[str, int]] = field(default_factory=list)
    server: list[dict[str, int]] = field(default_factory=list)  # commandstats delta
    wake: list[float] = field(default_factory=list)  # µs, COMPLETE sent -> call returned
    wake_read: list[float] = field(default_factory=list)  # µs, COMPLETE sent -> XREAD back
    reading_first: int = 0  # rounds where the joiner's XREAD was sent before COMPLETE
    on_loop: int = 0  # rounds where the joiner read on its caller loop's own client
    roles_ok: int = 0  # rounds where the leader led and the joiner joined
    floor: list[float] = field(default_factory=list)  # µs, XADD sent -> XREAD returned
    inner: list[str] = field(default_factory=list)  # the scripts' commands, left out

    def counts(self, role: str) -> list[int]:
        return [sum(sent.values()) for sent in getattr(self, role)]

    @property
    def matched(self) -> int:
        """Rounds where the server saw exactly what the two arbiters sent."""
        return sum(
            1
            for lead, join, server in zip(self.leader, self.joiner, self.server, strict=True)
            if sum(server.values()) == sum(lead.values()) + sum(join.values())
        )


@dataclass
class Herd(DirectoryHerd):
    """One library's herds (a sample per herd), with what Redis saw."""

    acquires: list[int] = field(default_factory=list)  # ACQUIREs the arbiters sent
    sent: list[int] = field(default_factory=list)  # requests the arbiters sent in all
    server: list[dict[str, int]] = field(default_factory=list)  # commandstats delta
    waiting: list[int] = field(default_factory=list)  # callers still waiting at the cut
    spread: list[float] = field(default_factory=list)  # s, start -> the last caller called
    late: list[int] = field(default_factory=list)  # callers after a landing (here or anywhere)
    budget: float = 0.0  # s, when a herd is cut

    @property
    def cut(self) -> bool:
        return any(self.waiting)


@dataclass
class FleetReport:
    sizes: FleetSizes
    start_method: str = ""
    redis_version: str = ""
    client: str = ""
    load: str = ""  # the load average when the run began
    load_end: str = ""  # and when it ended
    skipped: str = ""  # why nothing ran (no redis-server, no redis-py)
    rounds: Rounds = field(default_factory=Rounds)
    herds: dict[str, Herd] = field(default_factory=dict)
    outage: Outage = field(default_factory=Outage)  # (5)
    errors: dict[str, str] = field(default_factory=dict)


def _loadavg() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f} (1, 5, 15 min), {os.cpu_count()} cores"


def _measure_rounds(procs: Sequence[Proc], started: MpEvent, joined: MpEvent, client: Any,
                    sizes: FleetSizes, out: FleetReport) -> None:
    """(1) and (2): rounds of one leader and one joiner, the roles swapping each round;
    floor rounds interleaved."""
    a, b = procs[0], procs[1]
    rounds = out.rounds
    inner = _script_commands()
    rounds.inner = sorted(inner)
    for i in range(sizes.warm + max(sizes.rounds, sizes.floor_rounds)):
        timed = i >= sizes.warm
        leader, joiner = (a, b) if i % 2 == 0 else (b, a)
        if i < sizes.warm + sizes.rounds:
            key = f"rt:{i}"
            started.clear()
            joined.clear()
            before = _commandstats(client)
            leader.send("lead", key, sizes.settle)
            if not started.wait(WAIT):
                raise TimeoutError("the leader's work did not start")
            joiner.send("join", key)
            led, lead_sent, completes = leader.recv()
            join: _Join = joiner.recv()
            server = _delta(before, _commandstats(client), inner)
            if timed:
                rounds.leader.append(lead_sent)
                rounds.joiner.append(join.sent)
                rounds.server.append(server)
                rounds.roles_ok += not led and join.joined
                rounds.on_loop += join.on_loop
                if completes and join.reads and join.backs:
                    rounds.wake.append((join.returned - completes[-1]) / 1e3)
                    rounds.wake_read.append((join.backs[-1] - completes[-1]) / 1e3)
                    rounds.reading_first += join.reads[0] < completes[-1]
        if i < sizes.warm + sizes.floor_rounds:
            stream = f"floor:{i}"
            started.clear()
            joiner.send("floor_read", stream)
            if not started.wait(WAIT):
                raise TimeoutError("the floor's reader did not start")
            time.sleep(sizes.settle)  # its XREAD reaches the server and blocks
            sent = leader.ask("floor_write", stream)
            returned = joiner.recv()
            if timed:
                rounds.floor.append((returned - sent) / 1e3)


def _measure_herds(procs: Sequence[Proc], client: Any, url: str, files: str,
                   sizes: FleetSizes, out: FleetReport) -> None:
    """(3) and (4): herds of every library, their order rotating; one untimed herd of
    each first (connections, threads, the peers' scripts). dogpile.cache's herd runs
    once, last, with no warm-up, and is cut after ``sizes.dogpile_budget`` seconds: its
    callers take its distributed lock one after the other (each polls every 0.1 s), which
    4,000 threads on a few cores may not get through in minutes; the callers still
    waiting then are counted, and their processes are stopped after it."""
    callers = sizes.herd_callers
    ready = set(gather(procs, "setup_peers", url, callers)[0])
    libs = [lib for lib in HERD_LIBS if lib not in PEER_OF or lib in ready]
    out.herds = {lib: Herd(callers=len(procs) * callers) for lib in libs}
    rotating = [lib for lib in libs if lib != DOGPILE]
    schedule = [(-1, lib) for lib in rotating]
    for r in range(sizes.herd_rounds):
        k = r % len(rotating)
        schedule += [(r, lib) for lib in [*rotating[k:], *rotating[:k]]]
    if DOGPILE in libs:
        schedule.append((0, DOGPILE))
    for r, lib in schedule:
        series = out.herds[lib]
        if series.error is not None:
            continue
        key = f"herd:{r}:{HERD_LIBS.index(lib)}"
        journal = os.path.join(files, key.replace(":", "-"))
        _progress(f"herd of {lib}" + (" (warm-up)" if r < 0 else f", round {r + 1}"))
        before = _commandstats(client)
        try:
            budget = sizes.dogpile_budget if lib == DOGPILE else WAIT
            done = gather(procs, "herd", lib, key, callers, sizes.work, journal, budget)
        except Exception as exc:
            series.error = f"{type(exc).__name__}: {exc}"
            if lib in MINE:
                raise
            continue
        server = _delta(before, _commandstats(client))
        if r < 0:
            continue
        series.walls.append((max(d[1] for d in done) - min(d[0] for d in done)) / 1e9)
        series.got.append(sum(d[2] for d in done))
        series.errors.append(sum(d[3] for d in done))
        series.first_error = series.first_error or next((d[4] for d in done if d[4]), "")
        starts = _journal_starts(journal) if lib not in FLOOR_OF else []
        if lib not in FLOOR_OF:
            series.runs.append(len(starts))
        series.acquires.append(sum(d[5].get("acquire", 0) for d in done))
        series.sent.append(sum(sum(d[5].values()) for d in done))
        series.server.append(server)
        series.waiting.append(sum(d[6] for d in done))
        arrivals = [t for d in done for t in d[7]]
        start = min(d[0] for d in done)
        series.spread.append((max(arrivals) - start) / 1e9 if arrivals else 0.0)
        # A caller that called after the first run's work had ended (the monotonic clock is
        # the host's, so arrivals of every process compare with the journal's starts) may
        # lead a new run as rightly as one that called after its own process's landing.
        ended = starts[0] + int(sizes.work * 1e9) if starts else None
        after_end = 0 if ended is None else sum(1 for t in arrivals if t > ended)
        series.late.append(max(sum(d[8] for d in done), after_end))
        series.budget = budget


def run(sizes: FleetSizes) -> FleetReport:
    ctx = context()
    out = FleetReport(sizes, start_method=ctx.get_start_method(), load=_loadavg())
    binary = shutil.which("redis-server")
    if binary is None:
        out.skipped = "no `redis-server` on PATH"
        return out
    try:
        import redis
    except ImportError:
        out.skipped = "redis-py is not installed (pip install 'flightgroup[redis]')"
        return out
    out.client = _client_versions()
    server = RedisServer(binary)
    files = tempfile.mkdtemp(prefix="fgbfleet")
    try:
        out.redis_version = server.version
        client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=WAIT)
        client.ping()
        with _workers(ctx, sizes.processes) as (procs, started, joined):
            for proc in procs:
                proc.ask("open", server.url, NAMESPACE)
            steps: tuple[tuple[str, Callable[[], None]], ...] = (
                ("(1) round trips, (2) joiner wake-up",
                 lambda: _measure_rounds(procs, started, joined, client, sizes, out)),
                ("(3) herd, (4) herds of the peers",
                 lambda: _measure_herds(procs, client, server.url, files, sizes, out)),
            )
            for name, step in steps:
                _progress(name)
                try:
                    step()
                except Exception as exc:
                    out.errors[name] = f"{type(exc).__name__}: {exc}"
        client.close()
        name = "(5) Redis down"
        _progress(name)
        try:
            outage.measure(binary, calls=sizes.outage_calls, unguarded=sizes.outage_unguarded,
                           returns=sizes.outage_returns, out=out.outage)
        except Exception as exc:
            out.errors[name] = f"{type(exc).__name__}: {exc}"
    finally:
        server.close()
        shutil.rmtree(files, ignore_errors=True)
    out.load_end = _loadavg()
    return out


def _client_versions() -> str:
    found = []
    for name in ("redis", "hiredis"):
        try:
            found.append(f"{name}-py {metadata.version(name)}" if name == "redis"
                         else f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


# -----------------------------------------------------------------------------
# the report
# -----------------------------------------------------------------------------


def _pct(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0-100) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _spread(values: Sequence[int]) -> str:
    if not values:
        return "—"
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def _rounds(n: int) -> str:
    return "1 round" if n == 1 else f"{n} rounds"


def _named(counts: Sequence[dict[str, int]]) -> str:
    """The requests of the rounds, by name: "acquire 1, complete 1" (a range where
    rounds differ)."""
    names = sorted({name for sent in counts for name in sent})
    return ", ".join(
        f"{name.upper()} {_spread([sent.get(name, 0) for sent in counts])}" for name in names
    ) or "—"


def _herd_ok(series: Herd | None, processes: int) -> bool:
    """Every caller served; one run and one ACQUIRE per process in each herd where no
    caller called after the flight had landed in its process or after the first run's
    work had ended (such a call leads a new flight, as it must: nothing is kept)."""
    if series is None or not series.served:
        return False
    late = series.late or [0] * len(series.runs)
    return all(
        late_callers > 0 or (runs == 1 and acquires == processes)
        for runs, acquires, late_callers in zip(series.runs, series.acquires, late, strict=True)
    )


def _late_note(series: Herd) -> str:
    if not any(series.late):
        return ""
    herds = sum(1 for n in series.late if n)
    return (f" ({herds} herd(s) had callers that called after the flight had landed in "
            f"their process or after the first run ended: "
            f"{_spread([n for n in series.late if n])})")


def targets(out: FleetReport) -> list[Target]:
    from .report import Target

    found: list[Target] = []
    if out.skipped:
        return found
    r, s = out.rounds, out.sizes
    if r.leader:
        leader, joiner = r.counts("leader"), r.counts("joiner")
        found.append(Target(
            f"fleet (1): round trips per leader, a flight shorter than lease/3 "
            f"({len(leader)} rounds; the server's count matched in {r.matched})",
            f"{_spread(leader)} ({_named(r.leader)})",
            f"{LEADER_GOAL}",
            all(n == LEADER_GOAL for n in leader) and r.matched == len(leader),
            True,
        ))
        found.append(Target(
            f"fleet (1): round trips per joiner, in another process ({len(joiner)} rounds)",
            f"{_spread(joiner)} ({_named(r.joiner)})",
            f"{JOINER_GOAL}",
            all(n == JOINER_GOAL for n in joiner) and r.roles_ok == len(joiner),
            True,
        ))
    if r.wake:
        found.append(Target(
            f"fleet (2): joiner wake-up across processes, COMPLETE sent → the joiner's "
            f"call returned, p50 ({len(r.wake)} rounds)",
            f"{_pct(r.wake, 50):,.0f} µs (p99 {_pct(r.wake, 99):,.0f} µs; floor p50 "
            + (f"{_pct(r.floor, 50):,.0f} µs)" if r.floor else "—)"),
            "information",
            None,
        ))
    if r.wake and r.floor:
        # Issue 31: against the floor read in the same rounds; the XREAD's own return (on
        # the joiner's loop) shows what comes before the rest of the call's return.
        floor = _pct(r.floor, 50)
        over = _pct(r.wake, 50) / floor
        # A floor slower than the group's own read of the same reply measured the host's
        # stalls, not a floor: no verdict from it.
        sound = not r.wake_read or floor <= _pct(r.wake_read, 50)
        # The floor reads on the caller's loop: so must every timed joiner (ADR 0058).
        on_loop = r.on_loop == len(r.joiner)
        note = ""
        if not sound:
            note = " (the floor was slower than the group's own read: no floor in this run)"
        elif not on_loop:
            note = (f" (the joiner read on its caller's loop in {r.on_loop} of "
                    f"{len(r.joiner)} rounds: not the path the floor measures)")
        found.append(Target(
            "fleet (2): joiner wake-up p50 ÷ its floor's (redis-py alone, XADD → XREAD "
            "BLOCK on the caller's loop)",
            f"{over:.2f}×{note}",
            f"≤ {WAKE_GOAL:.2f}×",
            over <= WAKE_GOAL if sound and on_loop else None,
        ))
        if r.wake_read:
            found.append(Target(
                "fleet (2): COMPLETE sent → the joiner's XREAD returned (on its caller's "
                "loop), p50 ÷ the floor's",
                f"{_pct(r.wake_read, 50) / floor:.2f}×",
                "information",
                None,
            ))
    herd = out.herds.get(FG_ASYNC)
    found.append(Target(
        f"fleet (3): herd of {s.processes} processes × {s.herd_callers:,} tasks: runs per "
        "herd; every caller got the value; ACQUIREs that reached Redis",
        (f"{_spread(herd.runs)}; {'yes' if herd.served else 'no'}; {_spread(herd.acquires)}"
         + _late_note(herd) if herd is not None and herd.usable else "—"),
        f"1; yes; {s.processes}",
        _herd_ok(herd, s.processes),
        True,
    ))
    threads = out.herds.get(FG_THREADS)
    found.append(Target(
        f"fleet (4): herd of {s.processes} processes × {s.herd_callers:,} threads: "
        "flightgroup's runs per herd; every caller got the value; ACQUIREs",
        (f"{_spread(threads.runs)}; {'yes' if threads.served else 'no'}; "
         f"{_spread(threads.acquires)}" + _late_note(threads)
         if threads is not None and threads.usable else "—"),
        f"1; yes; {s.processes}",
        _herd_ok(threads, s.processes),
        True,
    ))
    for peer, mine_name in PEER_OF.items():
        mine, theirs = out.herds.get(mine_name), out.herds.get(peer)
        usable = mine is not None and mine.usable and theirs is not None and theirs.usable
        ratio = (
            f"{median(mine.walls) / median(theirs.walls):.2f}×"
            if usable and mine is not None and theirs is not None
            else "—"
        )
        if theirs is not None and theirs.cut and ratio != "—":
            ratio = (f"< {ratio} (cut after {theirs.budget:g} s, "
                     f"{max(theirs.waiting):,} callers still waiting)")
        runs = _spread(theirs.runs) if theirs is not None else "not installed"
        found.append(Target(
            f"fleet (4): herd wall time, {mine_name} ÷ {peer} (its runs per herd: {runs})",
            ratio,
            "information" if usable else "—",
            None,
        ))
    return found + outage.targets(out.outage)


def ok(out: FleetReport, found: list[Target]) -> bool:
    """False if flightgroup failed a measurement, broke a must of its herds (one run,
    every caller served, one ACQUIRE per process) or of Redis down (every call raised
    UnavailableError, refused at once after the first). A round-trip count over its goal is
    reported as FAIL in the table but, as a cost rather than a wrong result, does not
    fail the run (as the suite's missed speed targets do not)."""
    del found
    if out.skipped:
        return True
    processes = out.sizes.processes
    return (not out.errors and all(_herd_ok(out.herds.get(lib), processes) for lib in MINE)
            and outage.ok(out.outage))


def section(
    out: FleetReport, found: Sequence[Target] = (), command: str = "", source: str = ""
) -> list[str]:
    """The "Fleet scope" section; with ``found``, its targets table first, and with
    ``command`` and ``source``, how it was run (so that the section stands alone in a
    document, see ``update``)."""
    lines = [TITLE, ""]
    if command:
        lines += [f"Reproduce with `{command}` from the repository root; flightgroup "
                  f"source: {source}.", ""]
    if out.skipped:
        return [*lines, f"Not measured: {out.skipped}.", ""]
    lines += [
        f"A `redis-server` {out.redis_version} of the run's own on a free loopback port "
        "(nothing on disk, nothing else connected); every measurement uses real "
        f'processes (multiprocessing\'s "{out.start_method}" start method, driven over '
        f"pipes), {out.sizes.processes} of them, each with its own "
        f"`FlightGroup(redis=URL, namespace=\"{NAMESPACE}\", codec=JSON)` (default lease "
        "10 s) that made one call before anything was counted or timed. Client: "
        f"{out.client}. Load average when the run began: {out.load}; when it ended: "
        f"{out.load_end} (its own herds of "
        f"{out.sizes.processes * out.sizes.herd_callers:,} threads count in that). Times "
        "that span "
        "processes are read from CLOCK_MONOTONIC.",
        "",
    ]
    for name, error in out.errors.items():
        lines += [f"**{name} failed: {error}**", ""]
    if found:
        lines += ["| target | measured | goal | result |", "| --- | --- | --- | --- |"]
        lines += [f"| {t.what} | {t.measured} | {t.goal} | {t.verdict} |" for t in found]
        lines.append("")
    lines += _round_trip_lines(out)
    lines += _wake_lines(out)
    lines += _herd_lines(out)
    lines += outage.lines(out.outage)
    return lines


def _round_trip_lines(out: FleetReport) -> list[str]:
    r, s = out.rounds, out.sizes
    if not r.leader:
        return []
    leader, joiner = r.counts("leader"), r.counts("joiner")
    servers = [sum(d.values()) for d in r.server]
    commands = sorted({name for d in r.server for name in d})
    by_command = ", ".join(
        f"`{name.upper()}` {_spread([d.get(name, 0) for d in r.server])}" for name in commands
    )
    return [
        "### (1) Round trips per leader and per joiner",
        "",
        f"{_rounds(len(leader))} (after {s.warm} untimed ones), the two roles swapping "
        "processes each round: a process leads a fresh key, its work waits until the "
        f"joiner in the other process has joined, then {s.settle * 1e3:.0f} ms (a flight "
        "far shorter than lease/3). Each process counts the "
        "requests its arbiter sends (a wrapper around `RedisArbiter._script` and the "
        "blocking client's `xread`); the server's INFO commandstats delta over the round "
        "(every command of every client; left out: the benchmark's INFO, and the commands "
        "the Lua scripts call inside, which commandstats counts too: "
        f"{', '.join(f'`{n.upper()}`' for n in r.inner)}) is their sum when nothing else "
        "went over the wire (no re-send, handshake or NOSCRIPT).",
        "",
        "| role | round trips per call | requests | goal | rounds at the goal |",
        "| --- | --- | --- | --- | --- |",
        f"| leader | {_spread(leader)} | {_named(r.leader)} | {LEADER_GOAL} | "
        f"{sum(n == LEADER_GOAL for n in leader)} of {len(leader)} |",
        f"| joiner | {_spread(joiner)} | {_named(r.joiner)} | {JOINER_GOAL} | "
        f"{sum(n == JOINER_GOAL for n in joiner)} of {len(joiner)} |",
        f"| the server, per round | {_spread(servers)} | {by_command} | "
        f"{LEADER_GOAL + JOINER_GOAL} | {r.matched} of {len(servers)} equal the two "
        "counts' sum |",
        "",
        f"The leader led and the joiner joined in {r.roles_ok} of {len(leader)} rounds. "
        + _renew_note(r),
        "",
    ]


def _renew_note(r: Rounds) -> str:
    renewed = sum(1 for sent in r.leader if sent.get("renew"))
    if not renewed:
        return "No RENEW fell inside a timed flight."
    return (
        f"A RENEW fell inside {renewed} of {len(r.leader)} flights: the process renews "
        "every flight it leads in one RENEW per tick, every lease/3 from when its renewal "
        "task started (with an earlier flight), and a flight that is running at a tick is "
        "renewed however young it is; so a flight of duration d pays a third round trip "
        "with a chance of about d ÷ (lease/3)."
    )


def _wake_lines(out: FleetReport) -> list[str]:
    r = out.rounds
    if not r.wake:
        return []
    rows = [
        ("COMPLETE sent by the leader's arbiter → the joiner's `await g.run(...)` returned "
         "with the value", r.wake),
        ("COMPLETE sent → the joiner's XREAD returned (on its caller's loop)", r.wake_read),
        ("floor: redis-py alone, XADD sent in one process → `XREAD BLOCK` returned in "
         "another", r.floor),
    ]
    return [
        "### (2) Joiner wake-up after the leader lands, across processes",
        "",
        "In the rounds of (1): from the moment the leader's arbiter sends COMPLETE (read "
        "in the leader's process) to the joiner's call returning with the value (read in "
        "the joiner's process). The joiner's XREAD was sent before COMPLETE in "
        f"{r.reading_first} of {len(r.wake)} rounds (it was blocked, waiting), on its "
        f"caller loop's own client in {r.on_loop} of {len(r.joiner)} (ADR 0056; a loop's "
        "first join reads on the group's thread, ADR 0058, and each process's first "
        "join was among the untimed rounds). The floor "
        "is redis-py's asyncio client alone, in the same two processes and rounds "
        "interleaved with these: one blocks on XREAD of a fresh stream, the other "
        "XADDs to it.",
        "",
        "| from → to | samples | p50 µs | p99 µs | best | worst |",
        "| --- | --- | --- | --- | --- | --- |",
        *(
            f"| {what} | {len(values)} | {_pct(values, 50):,.0f} | {_pct(values, 99):,.0f} | "
            f"{min(values):,.0f} | {max(values):,.0f} |"
            for what, values in rows
            if values
        ),
        "",
    ]


def _herd_lines(out: FleetReport) -> list[str]:
    s = out.sizes
    if not out.herds:
        return []
    work_ms = s.work * 1e3
    lines = [
        f"### (3), (4) Herd: {s.processes} processes × {s.herd_callers:,} callers on one "
        f"key, the work sleeps {work_ms:.0f} ms; against what users do today",
        "",
        "Every library in the same processes and the same run, the libraries' order "
        "rotating each round, after one untimed herd each: flightgroup's "
        "`await g.run(key, work)` in asyncio tasks and `g.run_sync(key, work)` in threads; "
        "cashews 7 with its Redis backend, `cache.setup(URL)` and "
        "`@cache(ttl=600, key=\"fgbench:{key}\", lock=True)` on the work (tasks; its lock "
        "is a SET NX tried again at once while it fails (`check_interval=0`, a PING "
        "between tries), and `protected=True` shares one call per process); "
        "dogpile.cache's `make_region().configure(\"dogpile.cache.redis\", "
        "expiration_time=600, arguments={\"url\": URL, \"redis_expiration_time\": 900, "
        "\"distributed_lock\": True, \"thread_local_lock\": False})` and "
        "`region.get_or_create(key, work)` (threads; redis-py's Lock, polled every "
        "0.1 s; a pool of callers + 50 connections, since redis-py's default of 100 "
        "raises MaxConnectionsError with 500 threads; its herd runs once, last, with no "
        "warm-up, cut after "
        f"{s.dogpile_budget:g} s if it has not ended). The work appends a line to a "
        "journal file (runs = its lines), then "
        "sleeps; a new key per herd. The floors are the same callers in the same processes "
        "waiting on one local primitive per process, set when the work's time has passed "
        "since the first caller arrived (nothing crosses a process). Wall time from the "
        "first process leaving the barrier "
        f"to the last caller served; above the work = wall − {work_ms:.0f} ms. "
        "ACQUIREs: the requests flightgroup's arbiters sent, summed over the processes. "
        "Last caller called: from the first process leaving the barrier to the last "
        f"caller's call ({s.processes * s.herd_callers:,} threads on {os.cpu_count()} cores "
        "wake slowly). Callers after their "
        "process's landing: calls made after a caller of the same process already had "
        "the value; with nothing kept, such a call leads a new flight, so a herd with any "
        "is not held to one run and one ACQUIRE per process. "
        "Redis commands: the server's commandstats delta over the herd (every client; the "
        "commands a Lua script calls count too, for every library), and its three "
        "commonest. "
        f"{_rounds(s.herd_rounds)}, medians; the ratio is flightgroup's median wall time ÷ "
        "the other row's, tasks against tasks and threads against threads.",
        "",
        "| library | runs per herd | every caller got the value | ACQUIREs | "
        "last caller called, ms (median) | callers after their process's landing | "
        "Redis commands per herd | wall ms: best | median | above the work, ms | "
        "flightgroup ÷ this |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, series in out.herds.items():
        if not series.usable:
            lines.append(
                f"| {name} | — | — | — | — | — | — | error: {series.error or 'no sample'} | "
                "— | — | — |"
            )
            continue
        wall = median(series.walls)
        mine = out.herds.get(PEER_OF.get(name) or FLOOR_OF.get(name) or name)
        ratio = f"{median(mine.walls) / wall:.2f}×" if mine is not None and mine.usable else "—"
        served = "yes" if series.served else f"no ({_raised(series)})"
        acquires = _spread(series.acquires) if name in MINE else "—"
        more = "> " if series.cut else ""  # cut at its budget: the wall is a lower bound
        ratio = f"< {ratio}" if more and ratio != "—" else ratio
        lines.append(
            f"| {name} | {_spread(series.runs)} | {served} | {acquires} | "
            f"{median(series.spread) * 1e3:,.0f} | {_spread(series.late)} | "
            f"{_server_summary(series.server)} | {more}{min(series.walls) * 1e3:,.1f} | "
            f"{more}{wall * 1e3:,.1f} | {more}{(wall - s.work) * 1e3:,.1f} | {ratio} |"
        )
    return [*lines, ""]


def _server_summary(deltas: Sequence[dict[str, int]]) -> str:
    """The median herd's commands in all, and its three commonest."""
    if not deltas:
        return "—"
    totals = [sum(d.values()) for d in deltas]
    mid = sorted(range(len(deltas)), key=lambda i: totals[i])[(len(deltas) - 1) // 2]
    top = sorted(deltas[mid].items(), key=lambda item: -item[1])[:3]
    names = ", ".join(f"{name.upper()} {n:,}" for name, n in top)
    return f"{totals[mid]:,} ({names})" if names else f"{totals[mid]:,}"


def _raised(series: Herd) -> str:
    got = min(series.got) if series.got else 0
    if series.cut:
        text = (f"{got:,} of {series.callers:,} served in {series.budget:g} s, "
                f"{max(series.waiting):,} still waiting")
    else:
        text = f"{got:,} of {series.callers:,} at worst"
    if any(series.errors):
        text += f", {max(series.errors):,} raised"
        if series.first_error:
            text += f": {series.first_error}"
    return text


# -----------------------------------------------------------------------------
# the document: replace this section, keep the others
# -----------------------------------------------------------------------------


def update(path: str, lines: Sequence[str]) -> None:
    """Put ``lines`` (a section starting with its "## " heading) into the Markdown file
    ``path`` in place of the section of that heading, or before "## How each library is
    driven", or at the end; every other section stays as it is."""
    file = Path(path)
    text = file.read_text(encoding="utf-8") if file.exists() else ""
    old = text.splitlines()
    heading = lines[0]
    new = [*lines]
    while new and not new[-1]:
        new.pop()
    if heading in old:
        start = old.index(heading)
        end = next(
            (i for i in range(start + 1, len(old)) if old[i].startswith("## ")), len(old)
        )
        merged = [*old[:start], *new, "", *old[end:]]
    else:
        tail = "## How each library is driven"
        at = old.index(tail) if tail in old else len(old)
        merged = [*old[:at], *new, "", *old[at:]]
    while merged and not merged[-1]:
        merged.pop()
    file.write_text("\n".join(merged) + "\n", encoding="utf-8")
