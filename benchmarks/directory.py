"""The directory scope (issue 4): processes of one host share flights.

``python -m benchmarks`` runs this section with the rest of the suite (a "Directory
scope" section and its targets in the report); ``python -m benchmarks --only directory
[--quick] [--write PATH]`` (or ``scripts/dev bench --only directory``) runs and prints
just this section, with its own targets table.

Every measurement uses real processes: workers from multiprocessing's "forkserver"
context ("spawn" where there is none), driven over pipes. Each worker opens its own
``FlightGroup(directory=d, codec=JSON)`` on a short temporary directory under /tmp
(``tempfile.mkdtemp(prefix="fgb", dir="/tmp")``: the socket path limit is 103 bytes);
its first call connects it, and the first worker to call in a fresh directory is its
coordinator (checked against the flock holder of ``flight.lock`` in /proc/locks).
Starts are synchronised with a multiprocessing Barrier, never with sleeps. Times that
span processes are read from CLOCK_MONOTONIC, which every process of a host shares.

1. Lead-or-join latency: ``await g.run(fresh_key, work)``, work returns at once, timed
   per call in one process while 3 others are connected; the coordinator is another
   process, then the measuring process itself, then the process scope for reference.
   Floors (the parts any cross-process lead pays here) are timed in the same process,
   and the CPU the call's threads spend (schedstat) is read around the first variant;
   the first variant again with the calls 1 ms apart, so that its threads fall idle.
2. Herd: 8 processes × 1,000 asyncio tasks on one key; the work appends a line to a
   journal file and sleeps 50 ms: one run, every caller gets the value, and the time
   above the work.
3. Throughput: 4 processes calling distinct keys: flights per second in total.
4. Failover: the measuring process SIGKILLs the coordinator (a fresh child per try that
   made the first call in a fresh directory) and times ``run(new_key)`` until it returns.
5. Against what users do today: the same cross-process herd with threads (8 processes ×
   100 threads) for flightgroup's ``run_sync``, dogpile.cache's ``dogpile.cache.dbm``
   backend (``region.get_or_create``) and a plain ``filelock.FileLock`` + a file cache.
6. Coordinator frozen (the benchmark holds the election and never answers): the first
   call's time (through reconnect_timeout), then the time of each call refused at once,
   and how soon a call leads once the frozen one is gone (see benchmarks/outage.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dbm
import importlib.util
import math
import os
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.synchronize import Barrier
from statistics import median
from typing import TYPE_CHECKING, Any, TypeVar

from . import outage
from .outage import DirOutage
from .procs import WAIT, Proc, context, gather, serve
from .scenarios import quiet

if TYPE_CHECKING:
    from .report import Target

FLIGHTGROUP = "flightgroup"
DOGPILE = "dogpile.cache (dbm)"
FILELOCK = "filelock + file cache"
PEERS = (FLIGHTGROUP, DOGPILE, FILELOCK)
PEER_MODULES = {DOGPILE: "dogpile.cache", FILELOCK: "filelock"}

OTHER = "directory, another process coordinates"
SPACED = (
    "directory, another process coordinates, the calls 1 ms apart (the threads on both sides "
    "fall idle between calls)"
)
SPACED_GAP = 0.001  # seconds between two calls of SPACED
SELF = "directory, the measuring process coordinates"
PROCESS = "process scope `FlightGroup()`, for reference"
FLOOR_SOCKET = (
    "floor: Unix-socket round trip to another process (asyncio at both ends, each reading "
    "into a buffer allocated once, as flightgroup does)"
)
FLOOR_STREAMS = (
    "for comparison: the same round trip with asyncio streams at both ends (their transport "
    "reads with `recv(256 KiB)`, allocating that much for every read)"
)
FLOOR_BLOCKING = (
    "for comparison: the same round trip with blocking sockets (a thread at each end, no "
    "event loop)"
)
FLOOR_HOP = "floor: thread hop there and back (caller's loop → another loop → caller's)"
FLOOR_LOCKFILE = (
    "floor: key-lock file (open O_CREAT a new name, flock, pwrite, close), in the first "
    "variant's own `execution-locks/` right after its rounds"
)
FLOOR_SUM = "floors summed (p50s)"
EXCHANGE_OWN = (
    "for comparison: the lead's exchange without the group (run, lead, key lock, the work, "
    "landing) against the same coordinator, every answer read on the caller's loop from a "
    "connection of its own"
)
EXCHANGE_ACKED = (
    "for comparison: the same exchange on the caller's loop, its landing's ack (or `taken`) "
    "awaited as a leader's call now does (ADR 0040)"
)
EXCHANGE_THREAD = (
    "for comparison: the same exchange, every answer read by another thread's loop and "
    "handed to the caller's (where the group reads them: its thread)"
)
EXCHANGE_THREAD_ACKED = (
    "for comparison: the same exchange read by another thread's loop, its landing's ack "
    "awaited (the group's messages and threads, without the group)"
)
CPU_CALLER = "the caller's thread (the measuring process's main thread)"
CPU_BACKGROUND = "the measuring process's group thread (reads the coordinator's answers)"
CPU_COORDINATOR = "the coordinator's process (every thread)"
HERD_FLOOR = "floor (tasks awaiting one Future)"
TASKS_SEQUENTIAL = 1
TASKS_CONCURRENT = 16

T = TypeVar("T")

LATENCY_GOAL_US = 150.0
EXCHANGE_GOAL = 1.25  # lead-or-join p50 ÷ the exchange read on the caller's loop (issue 31)


@dataclass(frozen=True)
class DirSizes:
    """How big each measurement is: FULL is the issue's numbers, QUICK a smoke run."""

    latency_calls: int  # timed calls per round per variant
    latency_rounds: int
    latency_warm: int
    floor_calls: int
    herd_tasks: int  # per process
    herd_rounds: int
    throughput_calls: int  # per process
    throughput_rounds: int
    failover_tries: int
    peer_threads: int  # per process
    peer_rounds: int
    processes: int = 8  # the herds' processes
    connected: int = 3  # the other processes connected while one measures latency
    throughput_processes: int = 4
    herd_sleep: float = 0.050
    outage_calls: int = 200  # (6) calls of one key, then of distinct keys
    outage_tries: int = 3  # (6) frozen coordinators, each gone once timed
    outage_reconnect: float = 0.3  # (6) the group's reconnect_timeout


FULL = DirSizes(
    latency_calls=2_000,
    latency_rounds=5,
    latency_warm=200,
    floor_calls=5_000,
    herd_tasks=1_000,
    herd_rounds=5,
    throughput_calls=2_400,
    throughput_rounds=3,
    failover_tries=20,
    peer_threads=100,
    peer_rounds=3,
)

QUICK = DirSizes(
    latency_calls=300,
    latency_rounds=2,
    latency_warm=50,
    floor_calls=500,
    herd_tasks=1_000,
    herd_rounds=1,
    throughput_calls=400,
    throughput_rounds=1,
    failover_tries=4,
    peer_threads=20,
    peer_rounds=1,
    outage_calls=40,
    outage_tries=2,
    # A smoke run shares its 2 cores with a test suite: a process of the herd may be
    # scheduled half a second late, and one that calls after the work ended leads again
    # (as it should). The work lasts longer here so the must-check "one run per herd"
    # checks the harness, not the scheduler.
    herd_sleep=0.5,
)


def _clock() -> int:
    """Nanoseconds on CLOCK_MONOTONIC: one clock for every process of the host."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def _progress(message: str) -> None:
    print(f"benchmarks: directory: {message}", flush=True, file=sys.stderr)


# -----------------------------------------------------------------------------
# the worker (a child process): obeys commands from the parent, one at a time
# -----------------------------------------------------------------------------


async def _one() -> int:
    return 1


def _one_sync() -> int:
    return 1


def _append(journal: str, line: str) -> None:
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{os.getpid()} {line}\n".encode())
    finally:
        os.close(fd)


def _herd_floor(pause: float) -> Callable[[], Any]:
    """Tasks that await one bare Future, resolved ``pause`` seconds after the first
    of them arrives (as the suite's herd floor)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    armed = False

    async def wait() -> int:
        nonlocal armed
        if not armed:
            armed = True
            loop.call_later(pause, future.set_result, 1)
        return await future

    return wait


class _Worker:
    """One child's state: its directory group, a process-scope group, the peers."""

    def __init__(self, barrier: Barrier | None) -> None:
        self.barrier = barrier
        self.runner = asyncio.Runner()
        self.group: Any = None
        self.local: Any = None
        self.region: Any = None
        self.cache_dir = ""
        self.echo_loops: list[asyncio.AbstractEventLoop] = []  # serving the floors' echoes

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        self.runner.close()

    def _wait(self) -> None:
        assert self.barrier is not None
        self.barrier.wait(WAIT)

    # -- joining a directory ----------------------------------------------------

    def open(self, directory: str) -> int:
        """Open a group on ``directory`` (closing the one before) and make one call,
        so that it is connected: the first process to call there coordinates."""
        from flightgroup import JSON, FlightGroup

        if self.group is not None:
            self.group.close()
        self.group = FlightGroup(directory=directory, codec=JSON)
        self.group.run_sync(f"connect:{os.getpid()}", _one_sync, timeout=WAIT)
        return os.getpid()

    # -- (1) latency and its floors ---------------------------------------------

    def latency(
        self, scope: str, prefix: str, calls: int, warm: int, gap: float = 0.0
    ) -> list[int]:
        """ns per ``await g.run(fresh_key, work)``, one sample per call; ``gap``: seconds
        slept before each timed call (0: back to back)."""
        from flightgroup import FlightGroup

        if scope == "process":
            if self.local is None:
                self.local = FlightGroup()
            group = self.local
        else:
            group = self.group
        return self.runner.run(_latency(group.run, prefix, calls, warm, gap))

    def thread_ids(self) -> tuple[int, int | None]:
        """The kernel ids of this process's main thread (where ``latency`` calls) and of
        its directory group's background thread (None if it has none)."""
        background = next(
            (t.native_id for t in threading.enumerate() if t.name == "flightgroup-directory"),
            None,
        )
        return threading.main_thread().native_id or os.getpid(), background

    def echo_server(self, path: str) -> None:
        """Serve an asyncio Unix-socket echo (4-byte length + body) with streams."""

        async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    head = await reader.readexactly(4)
                    body = await reader.readexactly(int.from_bytes(head, "big"))
                    writer.write(head + body)

        self._serve_on_thread(lambda: asyncio.start_unix_server(client, path))

    def buffered_echo_server(self, path: str) -> None:
        """Serve the same echo with an ``asyncio.BufferedProtocol``."""
        loop_of = asyncio.get_running_loop
        self._serve_on_thread(lambda: loop_of().create_unix_server(_BufferedEcho, path))

    def _serve_on_thread(self, start: Callable[[], Awaitable[object]]) -> None:
        """Run ``start()`` (which starts a server) on a new event loop in a thread of
        its own, which then serves until the process ends."""
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()

            async def begin() -> None:
                await start()

            loop.run_until_complete(begin())
            self.echo_loops.append(loop)
            ready.set()
            loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        ready.wait(WAIT)

    def blocking_echo_server(self, path: str) -> None:
        """Serve the same echo with a blocking socket, on a thread per connection."""
        import socket

        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen()

        def client(conn: socket.socket) -> None:
            with conn, contextlib.suppress(OSError):
                while data := conn.recv(65536):
                    conn.sendall(data)

        def accept() -> None:
            while True:
                conn, _ = server.accept()
                threading.Thread(target=client, args=(conn,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()

    def floor_socket(self, path: str, calls: int) -> list[int]:
        return self.runner.run(_floor_buffered(path, calls))

    def floor_streams(self, path: str, calls: int) -> list[int]:
        return self.runner.run(_floor_streams(path, calls))

    def floor_blocking(self, path: str, calls: int) -> list[int]:
        import socket

        frame = _FRAME
        samples = [0] * calls
        clock = time.perf_counter_ns
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            with quiet():
                for i in range(calls):
                    start = clock()
                    sock.sendall(frame)
                    got = 0
                    while got < len(frame):
                        got += len(sock.recv(65536))
                    samples[i] = clock() - start
        return samples

    def floor_hop(self, calls: int) -> list[int]:
        with _other_loop() as other:
            return self.runner.run(_floor_hop(other, calls))

    def floor_lockfile(self, directory: str, calls: int) -> list[int]:
        import fcntl

        os.makedirs(directory, exist_ok=True)
        # Not 64 hex digits: no key's file has these names.
        paths = [os.path.join(directory, f"floor-{i:058x}") for i in range(calls)]
        samples = [0] * calls
        with quiet():
            for i, path in enumerate(paths):
                start = _clock()
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.pwrite(fd, b"%-20d\n" % i, 0)
                os.close(fd)
                samples[i] = _clock() - start
        return samples

    def exchange(
        self, directory: str, prefix: str, calls: int, warm: int, reader: str
    ) -> list[int]:
        """ns per lead made with the directory protocol by hand, no group: what a lead costs
        when the answers are read on the caller's loop (``reader="caller"``) or by another
        thread's loop (``"thread"``), as the group does; with ``-acked`` (``"caller-acked"``,
        ``"thread-acked"``) the lead also waits for its landing's ack, as a leader's call
        does."""
        where, _, acked = reader.partition("-")
        reading = _other_loop() if where == "thread" else contextlib.nullcontext()
        with reading as other:
            return self.runner.run(
                _exchange(directory, prefix, calls, warm, other, acked=bool(acked))
            )

    def floor_epoch(self, directory: str) -> int:
        """ns for what a new coordinator writes first: the next epoch, durably."""
        from flightgroup.directory import epochs

        os.makedirs(directory, exist_ok=True)
        start = _clock()
        epochs.next_epoch(directory)
        return _clock() - start

    # -- (2), (5) herds -----------------------------------------------------------

    def herd(self, key: str, tasks: int, pause: float, journal: str, floor: bool) -> tuple[
        int, int, int, int
    ]:
        """(start, end, callers that got the value, errors) of one herd of tasks."""
        return self.runner.run(self._herd(key, tasks, pause, journal, floor))

    async def _herd(
        self, key: str, tasks: int, pause: float, journal: str, floor: bool
    ) -> tuple[int, int, int, int]:
        expected = f"value of {key}"

        async def work() -> str:
            _append(journal, key)
            await asyncio.sleep(pause)
            return expected

        if floor:
            wait = _herd_floor(pause)

            async def call() -> str:
                await wait()
                return expected
        else:
            run = self.group.run

            async def call() -> str:
                result = await run(key, work, timeout=WAIT)
                value: str = result.value
                return value

        with quiet():
            self._wait()
            start = _clock()
            outcomes = await asyncio.gather(*[call() for _ in range(tasks)], return_exceptions=True)
            end = _clock()
        got = sum(1 for outcome in outcomes if outcome == expected)
        errors = sum(1 for outcome in outcomes if isinstance(outcome, BaseException))
        return start, end, got, errors

    def setup_peers(self, directory: str) -> None:
        """dogpile.cache's dbm region and the file cache's folder, in ``directory``."""
        if _importable(PEER_MODULES[DOGPILE]):
            from dogpile.cache import make_region

            self.region = make_region().configure(
                "dogpile.cache.dbm",
                expiration_time=3600,
                arguments={"filename": os.path.join(directory, "dogpile.dbm")},
            )
        self.cache_dir = os.path.join(directory, "files")
        os.makedirs(self.cache_dir, exist_ok=True)

    def threads(
        self, lib: str, key: str, threads: int, pause: float, journal: str
    ) -> tuple[int, int, int, int, str]:
        """(start, end, callers that got the value, errors, the first error) of one
        herd of threads calling ``lib``."""
        expected = f"value of {key}"

        def compute() -> str:
            _append(journal, key)
            time.sleep(pause)
            return expected

        call = self._peer_call(lib, key, compute)
        go = threading.Event()
        ends = [0] * threads
        got = [False] * threads
        errors: list[BaseException] = []

        def caller(i: int) -> None:
            go.wait()
            try:
                got[i] = call() == expected
            except Exception as exc:
                errors.append(exc)
            ends[i] = _clock()

        workers = [threading.Thread(target=caller, args=(i,)) for i in range(threads)]
        for thread in workers:
            thread.start()
        with quiet():
            self._wait()
            start = _clock()
            go.set()
            for thread in workers:
                thread.join()
        first = f"{type(errors[0]).__name__}: {errors[0]}" if errors else ""
        return start, max(ends), sum(got), len(errors), first

    def _peer_call(self, lib: str, key: str, compute: Callable[[], str]) -> Callable[[], Any]:
        if lib == FLIGHTGROUP:
            run_sync = self.group.run_sync
            return lambda: run_sync(key, compute, timeout=WAIT).value
        if lib == DOGPILE:
            get_or_create = self.region.get_or_create
            return lambda: get_or_create(key, compute)
        if lib == FILELOCK:
            from filelock import FileLock

            path = os.path.join(self.cache_dir, key)

            def cached() -> str:
                # What users write: lock, check the file, compute and write if missing.
                with FileLock(path + ".lock"):
                    try:
                        with open(path, encoding="utf-8") as f:
                            return f.read()
                    except FileNotFoundError:
                        pass
                    value = compute()
                    with open(path, "w", encoding="utf-8") as f:
                        f.write(value)
                    return value

            return cached
        raise ValueError(f"unknown library {lib!r}")

    # -- (3) throughput -----------------------------------------------------------

    def throughput(self, prefix: str, calls: int, tasks: int) -> tuple[int, int, int]:
        """(start, end, runs of the work) of ``calls`` calls of distinct keys, made by
        ``tasks`` tasks that each await their share one after the other."""
        return self.runner.run(self._throughput(prefix, calls, tasks))

    async def _throughput(self, prefix: str, calls: int, tasks: int) -> tuple[int, int, int]:
        run = self.group.run
        runs = 0

        async def work() -> int:
            nonlocal runs
            runs += 1
            return 1

        prefix = f"{prefix}:{os.getpid()}"

        async def caller(t: int) -> None:
            for i in range(calls // tasks):
                await run(f"{prefix}:{t}:{i}", work)

        with quiet():
            self._wait()
            start = _clock()
            await asyncio.gather(*[caller(t) for t in range(tasks)])
            end = _clock()
        return start, end, runs

    # -- (4) failover -------------------------------------------------------------

    def kill_and_call(self, pid: int, key: str) -> tuple[int, int | None, bool]:
        """SIGKILL the coordinator ``pid`` (a worker the parent started), then time
        ``run(key)`` until it returns (see _kill_and_call)."""
        return self.runner.run(_kill_and_call(self.group.run, pid, key))


@contextlib.contextmanager
def _other_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own, stopped and closed on exit."""
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:
        yield other
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(WAIT)
        other.close()


async def _latency(
    run: Callable[..., Any], prefix: str, calls: int, warm: int, gap: float
) -> list[int]:
    for i in range(warm):
        await run(f"{prefix}:warm:{i}", _one)
    keys = [f"{prefix}:{i}" for i in range(calls)]
    samples = [0] * calls
    clock = time.perf_counter_ns
    with quiet():
        for i, key in enumerate(keys):
            if gap:
                await asyncio.sleep(gap)
            start = clock()
            await run(key, _one)
            samples[i] = clock() - start
    return samples


_FRAME = (48).to_bytes(4, "big") + b"x" * 48  # about a run request's size


class _BufferedEcho(asyncio.BufferedProtocol):
    """Writes back what it reads, reading into one buffer."""

    def __init__(self) -> None:
        self.buffer = memoryview(bytearray(65536))
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        assert self.transport is not None
        self.transport.write(bytes(self.buffer[:nbytes]))


class _BufferedReader(asyncio.BufferedProtocol):
    """Counts the bytes read into one buffer; ``waiter`` is resolved once ``want`` came."""

    def __init__(self) -> None:
        self.buffer = memoryview(bytearray(65536))
        self.got = 0
        self.want = 0
        self.waiter: asyncio.Future[None] | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes
        if self.got >= self.want and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


async def _timed(calls: int, once: Callable[[], Awaitable[object]]) -> list[int]:
    """ns per ``await once()``, one sample per call, garbage collection paused."""
    samples = [0] * calls
    clock = time.perf_counter_ns
    with quiet():
        for i in range(calls):
            start = clock()
            await once()
            samples[i] = clock() - start
    return samples


async def _floor_buffered(path: str, calls: int) -> list[int]:
    loop = asyncio.get_running_loop()
    transport, reader = await loop.create_unix_connection(_BufferedReader, path)
    frame = _FRAME

    async def round_trip() -> None:
        reader.got, reader.want = 0, len(frame)
        reader.waiter = loop.create_future()
        transport.write(frame)
        await reader.waiter

    try:
        return await _timed(calls, round_trip)
    finally:
        transport.close()


async def _floor_streams(path: str, calls: int) -> list[int]:
    reader, writer = await asyncio.open_unix_connection(path)
    frame = _FRAME

    async def round_trip() -> None:
        writer.write(frame)
        await reader.readexactly(len(frame))

    try:
        return await _timed(calls, round_trip)
    finally:
        writer.close()


async def _floor_hop(other: asyncio.AbstractEventLoop, calls: int) -> list[int]:
    loop = asyncio.get_running_loop()
    samples = [0] * calls
    clock = time.perf_counter_ns

    def there(fut: asyncio.Future[None]) -> None:
        loop.call_soon_threadsafe(fut.set_result, None)

    with quiet():
        for i in range(calls):
            start = clock()
            fut = loop.create_future()
            other.call_soon_threadsafe(there, fut)
            await fut
            samples[i] = clock() - start
    return samples


class _Exchange:
    """A connection of the directory protocol, read on ``loop``: a lead's answer resolves
    its future (on the caller's loop), an ack frees the lead's key lock, and the first of
    a landing's ``taken`` and ack resolves the landing's future, if it has one."""

    def __init__(self, sock: Any, loop: asyncio.AbstractEventLoop) -> None:
        from flightgroup.directory import wire

        self.sock = sock
        self.splitter = wire.FrameSplitter(wire.DEFAULT_MAX_FRAME)
        self.buffer = memoryview(bytearray(wire.READ_SIZE))
        self.answers: dict[int, asyncio.Future[Any]] = {}
        self.leads: dict[int, int] = {}  # request id -> the key lock's descriptor
        self.landings: dict[int, asyncio.Future[Any]] = {}  # request id -> its ack awaited
        self.loop = loop
        loop.call_soon_threadsafe(loop.add_reader, sock.fileno(), self._readable)

    def _readable(self) -> None:
        from flightgroup.directory import wire

        size = self.sock.recv_into(self.buffer)
        for header, payload in self.splitter.feed(bytes(self.buffer[:size])):
            answer = wire.parse_answer_frame(header, payload)
            if isinstance(answer, (wire.Ack, wire.Taken)):
                if isinstance(answer, wire.Ack):
                    os.close(self.leads.pop(answer.id))
                landed = self.landings.pop(answer.id, None)
                if landed is not None:
                    self._tell(landed, answer)
                continue
            # (an error without an id: a KeyError)
            self._tell(self.answers.pop(answer.id or 0), answer)

    def _tell(self, fut: asyncio.Future[Any], answer: Any) -> None:
        """Resolve ``fut`` on its own loop, from this connection's reading loop."""
        if fut.get_loop() is self.loop:
            fut.set_result(answer)
        else:
            fut.get_loop().call_soon_threadsafe(fut.set_result, answer)

    def close(self) -> None:
        done = threading.Event()

        def stop() -> None:
            self.loop.remove_reader(self.sock.fileno())
            done.set()

        if asyncio.get_running_loop() is self.loop:
            stop()
        else:
            self.loop.call_soon_threadsafe(stop)
            done.wait(WAIT)
        self.sock.close()
        for fd in self.leads.values():
            os.close(fd)


async def _exchange(
    directory: str,
    prefix: str,
    calls: int,
    warm: int,
    other: asyncio.AbstractEventLoop | None,
    *,
    acked: bool = False,
) -> list[int]:
    import fcntl
    import socket

    from flightgroup import JSON
    from flightgroup.directory import fs, wire

    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(fs.socket_path(directory))
    sock.sendall(wire.HELLO)
    if sock.recv(len(wire.WELCOME)) != wire.WELCOME:
        raise RuntimeError("the coordinator did not welcome the exchange")
    sock.setblocking(False)
    conn = _Exchange(sock, other or loop)
    ids = iter(range(1, 1 << 62))

    async def lead(key: str) -> None:
        id = next(ids)
        answer = conn.answers[id] = loop.create_future()
        sock.send(wire.run_frame(id, key))
        # While the request travels, as the group does: the key's file is made.
        fd = os.open(fs.key_lock_path(directory, key), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
        got = await answer
        if not isinstance(got, wire.Lead):
            raise RuntimeError(f"a fresh key was not led: {got}")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(fd, b"%-20d\n" % got.token, 0)
        conn.leads[id] = fd
        data = JSON.encode(await _one())
        assert isinstance(data, bytes)
        if not acked:
            sock.send(wire.land_frame(id, got.token, wire.Value(data)))
            return
        landed = conn.landings[id] = loop.create_future()
        sock.send(wire.land_frame(id, got.token, wire.Value(data), taken=True))
        await landed

    try:
        for i in range(warm):
            await lead(f"{prefix}:warm:{i}")
        keys = iter([f"{prefix}:{i}" for i in range(calls)])
        return await _timed(calls, lambda: lead(next(keys)))
    finally:
        conn.close()


async def _kill_and_call(
    run: Callable[..., Any], pid: int, key: str
) -> tuple[int, int | None, bool]:
    """(ns from SIGKILL to the call's return, ns from SIGKILL to the process's exit as
    its pidfd tells, or None where there is no pidfd; whether the call led)."""
    died: list[int] = []
    watcher = None
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = -1
    if pidfd >= 0:

        def watch() -> None:
            select.select([pidfd], [], [], WAIT)
            died.append(_clock())

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
    start = _clock()
    os.kill(pid, signal.SIGKILL)
    result = await run(key, _one, timeout=WAIT)
    end = _clock()
    if watcher is not None:
        watcher.join(WAIT)
        os.close(pidfd)
    return end - start, (died[0] - start if died else None), bool(result.joined)


def _worker_main(conn: Connection, barrier: Barrier | None) -> None:
    serve(conn, _Worker(barrier))


# -----------------------------------------------------------------------------
# the parent: workers, temporary directories, the election's holder
# -----------------------------------------------------------------------------


@contextlib.contextmanager
def _workers(ctx: BaseContext, count: int, barrier: bool = False) -> Iterator[list[Proc]]:
    gate = ctx.Barrier(count) if barrier else None
    procs: list[Proc] = []
    try:
        for _ in range(count):
            procs.append(Proc(ctx, _worker_main, gate))
        yield procs
    finally:
        for proc in procs:
            proc.stop()


@contextlib.contextmanager
def _tempdirs() -> Iterator[Callable[[], str]]:
    made: list[str] = []

    def make() -> str:
        path = tempfile.mkdtemp(prefix="fgb", dir="/tmp")
        made.append(path)
        return path

    try:
        yield make
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


def _lock_holder(directory: str) -> int | None:
    """The pid holding the flock on ``flight.lock`` (the coordinator), from /proc/locks;
    None when it cannot be told."""
    try:
        st = os.stat(os.path.join(directory, "flight.lock"))
        with open("/proc/locks", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue
        if fields[5] == where:
            return int(fields[4])
    return None


def _schedstat(pid: int, tid: int | None = None) -> tuple[int, int] | None:
    """ns on a CPU and ns waiting for one (runnable, in a run queue), of thread ``tid`` of
    ``pid``, or of all its threads when ``tid`` is None; None when the kernel does not
    say (no /proc/<pid>/task/<tid>/schedstat)."""
    try:
        tids = [str(tid)] if tid is not None else os.listdir(f"/proc/{pid}/task")
        on_cpu = waiting = 0
        for t in tids:
            with open(f"/proc/{pid}/task/{t}/schedstat", encoding="ascii") as f:
                run, wait, _ = f.read().split()
            on_cpu, waiting = on_cpu + int(run), waiting + int(wait)
    except (OSError, ValueError):
        return None
    return on_cpu, waiting


def _open_all(procs: Sequence[Proc], directory: str) -> None:
    """Connect each worker in turn: the first one coordinates (checked)."""
    for proc in procs:
        proc.ask("open", directory)
    holder = _lock_holder(directory)
    if holder is not None and holder != procs[0].pid:
        raise RuntimeError(f"expected {procs[0].pid} to coordinate, found {holder}")


def _rotations(names: Sequence[T], rounds: int) -> Iterator[tuple[int, T]]:
    for r in range(rounds):
        k = r % len(names)
        for name in [*names[k:], *names[:k]]:
            yield r, name


# -----------------------------------------------------------------------------
# the measurements
# -----------------------------------------------------------------------------


@dataclass
class Herd:
    """One library's herds: a sample per herd."""

    walls: list[float] = field(default_factory=list)  # seconds, first start to last end
    runs: list[int] = field(default_factory=list)  # journal lines per herd
    got: list[int] = field(default_factory=list)  # callers that got the value
    errors: list[int] = field(default_factory=list)  # callers that raised
    first_error: str = ""
    callers: int = 0  # per herd
    error: str | None = None  # the measurement itself failed

    @property
    def usable(self) -> bool:
        return self.error is None and bool(self.walls)

    @property
    def served(self) -> bool:
        return self.usable and all(g == self.callers for g in self.got)

    @property
    def once(self) -> bool:
        return self.usable and all(r == 1 for r in self.runs)


@dataclass
class Throughput:
    seconds: list[float] = field(default_factory=list)
    flights: int = 0  # per round
    runs: list[int] = field(default_factory=list)


@dataclass
class DirectoryReport:
    sizes: DirSizes
    start_method: str = ""
    dbm: str = ""
    latency: dict[str, list[float]] = field(default_factory=dict)  # µs samples
    coordinators: dict[str, str] = field(default_factory=dict)  # variant -> who coordinates
    # (1)'s first variant: thread -> [ns on a CPU, ns waiting for one], over cpu_calls calls
    cpu: dict[str, list[int]] = field(default_factory=dict)
    cpu_calls: int = 0
    herd: dict[str, Herd] = field(default_factory=dict)
    peers: dict[str, Herd] = field(default_factory=dict)
    throughput: dict[int, Throughput] = field(default_factory=dict)  # tasks per process ->
    failover: list[float] = field(default_factory=list)  # seconds
    failover_exit: list[float] = field(default_factory=list)  # s, SIGKILL to its exit
    failover_led: list[bool] = field(default_factory=list)
    takeover: dict[str, list[float]] = field(default_factory=dict)  # next coordinator -> s
    epoch_write: list[float] = field(default_factory=list)  # seconds, next_epoch alone
    outage: DirOutage = field(default_factory=DirOutage)  # (6)
    errors: dict[str, str] = field(default_factory=dict)  # measurement -> what failed


def _measure_latency(
    ctx: BaseContext, sizes: DirSizes, out: DirectoryReport, tempdir: Callable[[], str]
) -> None:
    from flightgroup.directory import fs

    others = sizes.connected
    with _workers(ctx, 2 * (others + 1)) as procs:
        dir_other, dir_self, scratch = tempdir(), tempdir(), tempdir()
        coordinator, *bystanders = procs[:others]
        measuring_other = procs[others]
        measuring_self, *connected = procs[others + 1 :]
        # The coordinator calls first, then the others, then the measuring process.
        _open_all([coordinator, *bystanders, measuring_other], dir_other)
        _open_all([measuring_self, *connected], dir_self)
        out.coordinators[OTHER] = (
            f"process {coordinator.pid} (the measuring one is {measuring_other.pid})"
        )
        out.coordinators[SELF] = f"process {measuring_self.pid} (the measuring one)"
        variants = {
            OTHER: (measuring_other, "directory", 0.0),
            SPACED: (measuring_other, "directory", SPACED_GAP),
            SELF: (measuring_self, "directory", 0.0),
            PROCESS: (measuring_other, "process", 0.0),
        }
        main, background = measuring_other.ask("thread_ids")
        threads = {
            CPU_CALLER: (measuring_other.pid, main),
            CPU_COORDINATOR: (coordinator.pid, None),
        }
        if background is not None:
            threads[CPU_BACKGROUND] = (measuring_other.pid, background)
        samples: dict[str, list[int]] = {name: [] for name in variants}
        for r, name in _rotations(list(variants), sizes.latency_rounds):
            proc, scope, gap = variants[name]
            prefix = f"lat:{scope}:{gap}:{r}"
            # The CPU is read around the first variant's rounds only.
            measured = threads if name == OTHER else {}
            before = {who: _schedstat(*ids) for who, ids in measured.items()}
            # Spaced calls take their gap too: a quarter as many fill the same time.
            calls = sizes.latency_calls // 4 if gap else sizes.latency_calls
            samples[name] += proc.ask("latency", scope, prefix, calls, sizes.latency_warm, gap)
            if not before:
                continue
            out.cpu_calls += sizes.latency_calls + sizes.latency_warm
            for who, ids in threads.items():
                start, end = before[who], _schedstat(*ids)
                if start is not None and end is not None:
                    spent = out.cpu.setdefault(who, [0, 0])
                    spent[0] += end[0] - start[0]
                    spent[1] += end[1] - start[1]
        for name, values in samples.items():
            out.latency[name] = [ns / 1e3 for ns in values]
        # The floors, in the measuring process, against the coordinator's process.
        echo, streams, blocking = (
            os.path.join(scratch, name) for name in ("echo.sock", "s.sock", "b.sock")
        )
        coordinator.ask("buffered_echo_server", echo)
        coordinator.ask("echo_server", streams)
        coordinator.ask("blocking_echo_server", blocking)
        floors: dict[str, tuple[Any, ...]] = {
            FLOOR_SOCKET: ("floor_socket", echo, sizes.floor_calls),
            FLOOR_HOP: ("floor_hop", sizes.floor_calls),
            # Where the first variant's calls created theirs (ext4 allocates a file's
            # inode near its directory's: the same inodes to scan past, if any).
            FLOOR_LOCKFILE: ("floor_lockfile", os.path.join(dir_other, fs.KEY_LOCKS),
                             sizes.floor_calls),
            FLOOR_BLOCKING: ("floor_blocking", blocking, sizes.floor_calls),
            FLOOR_STREAMS: ("floor_streams", streams, sizes.floor_calls),
        }
        for name, (command, *args) in floors.items():
            out.latency[name] = [ns / 1e3 for ns in measuring_other.ask(command, *args)]
        # The lead's exchange by hand: what the reading thread costs, apart from the group.
        exchanges = {
            EXCHANGE_OWN: "caller", EXCHANGE_ACKED: "caller-acked", EXCHANGE_THREAD: "thread",
            EXCHANGE_THREAD_ACKED: "thread-acked",
        }
        for r, name in _rotations(list(exchanges), sizes.latency_rounds):
            out.latency.setdefault(name, []).extend(
                ns / 1e3
                for ns in measuring_other.ask(
                    "exchange", dir_other, f"x:{exchanges[name]}:{r}", sizes.latency_calls,
                    sizes.latency_warm, exchanges[name],
                )
            )


def _journal_runs(journal: str) -> int:
    try:
        with open(journal, encoding="utf-8") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def _measure_herds(
    ctx: BaseContext, sizes: DirSizes, out: DirectoryReport, tempdir: Callable[[], str]
) -> None:
    """(2) the big herd of tasks and (5) the herd of threads with the peers, on the
    same 8 processes."""
    n = sizes.processes
    with _workers(ctx, n, barrier=True) as procs:
        directory, files = tempdir(), tempdir()
        _open_all(procs, directory)
        pause = sizes.herd_sleep

        out.herd = {FLIGHTGROUP: Herd(callers=n * sizes.herd_tasks),
                    HERD_FLOOR: Herd(callers=n * sizes.herd_tasks)}
        for r, name in _rotations(list(out.herd), sizes.herd_rounds):
            series = out.herd[name]
            key, journal = f"herd:{r}", os.path.join(files, f"herd-{r}")
            try:
                done = gather(procs, "herd", key, sizes.herd_tasks, pause, journal,
                               name == HERD_FLOOR)
            except Exception as exc:
                series.error = f"{type(exc).__name__}: {exc}"
                raise
            series.walls.append((max(d[1] for d in done) - min(d[0] for d in done)) / 1e9)
            series.got.append(sum(d[2] for d in done))
            series.errors.append(sum(d[3] for d in done))
            if name == FLIGHTGROUP:
                series.runs.append(_journal_runs(journal))

        _progress("(5) the herd against dogpile.cache and filelock")
        for proc in procs:  # one after the other: each opens (maybe creates) the dbm file
            proc.ask("setup_peers", files)
        libs = [lib for lib in PEERS if lib == FLIGHTGROUP or _installed(lib)]
        out.peers = {lib: Herd(callers=n * sizes.peer_threads) for lib in libs}
        for r, lib in _rotations(libs, sizes.peer_rounds):
            series = out.peers[lib]
            if series.error is not None:
                continue
            key = f"peer-{r}-{PEERS.index(lib)}"
            journal = os.path.join(files, f"journal-{key}")
            try:
                done = gather(procs, "threads", lib, key, sizes.peer_threads, pause, journal)
            except Exception as exc:
                series.error = f"{type(exc).__name__}: {exc}"
                if lib == FLIGHTGROUP:
                    raise
                continue
            series.walls.append((max(d[1] for d in done) - min(d[0] for d in done)) / 1e9)
            series.got.append(sum(d[2] for d in done))
            series.errors.append(sum(d[3] for d in done))
            series.first_error = series.first_error or next((d[4] for d in done if d[4]), "")
            series.runs.append(_journal_runs(journal))


def _installed(lib: str) -> bool:
    return _importable(PEER_MODULES[lib])


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def _measure_throughput(
    ctx: BaseContext, sizes: DirSizes, out: DirectoryReport, tempdir: Callable[[], str]
) -> None:
    n = sizes.throughput_processes
    with _workers(ctx, n, barrier=True) as procs:
        _open_all(procs, tempdir())
        out.throughput = {
            # Each task makes an equal share: the calls a process makes in all.
            tasks: Throughput(flights=n * (sizes.throughput_calls // tasks) * tasks)
            for tasks in (TASKS_SEQUENTIAL, TASKS_CONCURRENT)
        }
        for r, tasks in _rotations(list(out.throughput), sizes.throughput_rounds):
            series = out.throughput[tasks]
            done = gather(procs, "throughput", f"tp:{r}:{tasks}", sizes.throughput_calls, tasks)
            series.seconds.append((max(d[1] for d in done) - min(d[0] for d in done)) / 1e9)
            series.runs.append(sum(d[2] for d in done))


def _measure_failover(
    ctx: BaseContext, sizes: DirSizes, out: DirectoryReport, tempdir: Callable[[], str]
) -> None:
    with _workers(ctx, 2) as (measuring, bystander):
        names = {measuring.pid: "the measuring process", bystander.pid: "the other process"}
        for i in range(sizes.failover_tries):
            directory = tempdir()
            # The doomed child calls first in the fresh directory: it coordinates. The
            # other two connect in turns, the first to connect mostly wins the next term.
            others = [bystander, measuring] if i % 2 == 0 else [measuring, bystander]
            with _workers(ctx, 1) as (doomed,):
                _open_all([doomed, *others], directory)
                ns, exited, joined = measuring.ask(
                    "kill_and_call", doomed.pid, f"after-kill:{i}"
                )
                doomed.process.join(WAIT)
            out.failover.append(ns / 1e9)
            if exited is not None:
                out.failover_exit.append(exited / 1e9)
            out.failover_led.append(not joined)
            holder = _lock_holder(directory)
            who = names.get(holder, "unknown") if holder is not None else "unknown"
            out.takeover.setdefault(who, []).append(ns / 1e9)
            out.epoch_write.append(measuring.ask("floor_epoch", tempdir()) / 1e9)


def _measure_outage(
    ctx: BaseContext, sizes: DirSizes, out: DirectoryReport, tempdir: Callable[[], str]
) -> None:
    del ctx  # in the benchmark's own process: it holds the frozen coordinator's files
    outage.measure_directory(
        tempdir, calls=sizes.outage_calls, tries=sizes.outage_tries,
        reconnect_timeout=sizes.outage_reconnect, out=out.outage,
    )


Measure = Callable[[BaseContext, DirSizes, DirectoryReport, Callable[[], str]], None]
MEASUREMENTS: tuple[tuple[str, Measure], ...] = (
    ("(1) lead-or-join latency", _measure_latency),
    ("(2) herd of tasks, (5) herd of threads with the peers", _measure_herds),
    ("(3) throughput", _measure_throughput),
    ("(4) failover", _measure_failover),
    ("(6) coordinator frozen", _measure_outage),
)


def run(sizes: DirSizes) -> DirectoryReport:
    ctx = context(["flightgroup", __name__])
    out = DirectoryReport(sizes, start_method=ctx.get_start_method(), dbm=_dbm_module())
    # Every directory stays until the section ends. Here (ext4 without a journal),
    # creating a file scans past the inodes removed in the last seconds (minutes while
    # their inode table is unwritten): removing one measurement's thousands of key-lock
    # files would slow the next one's.
    with _tempdirs() as tempdir:
        for name, measure in MEASUREMENTS:
            _progress(name)
            try:
                measure(ctx, sizes, out, tempdir)
            except Exception as exc:
                out.errors[name] = f"{type(exc).__name__}: {exc}"
    return out


def _dbm_module() -> str:
    """The module ``dbm.open`` picks here (dogpile's dbm backend uses it)."""
    with tempfile.TemporaryDirectory(prefix="fgb", dir="/tmp") as scratch:
        path = os.path.join(scratch, "probe")
        with dbm.open(path, "c"):
            pass
        return dbm.whichdb(path) or "unknown"


# -----------------------------------------------------------------------------
# the report
# -----------------------------------------------------------------------------


def _pct(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0-100) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _rounds(n: int) -> str:
    return "1 round" if n == 1 else f"{n} rounds"


def _runs(values: Sequence[int]) -> str:
    if not values:
        return "—"
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def _herd_ok(series: Herd | None) -> bool:
    return series is not None and series.once and series.served


def targets(out: DirectoryReport) -> list[Target]:
    from .report import Target

    found: list[Target] = []
    other = out.latency.get(OTHER)
    if other:
        p50 = _pct(other, 50)
        found.append(
            Target(
                f"directory (1): lead-or-join p50, fresh key, {out.sizes.connected} other "
                "processes connected, another process coordinates",
                f"{p50:,.0f} µs (p99 {_pct(other, 99):,.0f} µs)",
                f"≤ {LATENCY_GOAL_US:.0f} µs",
                p50 <= LATENCY_GOAL_US,
            )
        )
        # Against the lead's exchange by hand in the same run: the acked ones wait as a
        # leader's call must (ADR 0040), and above the one read by another thread is the
        # group's own work alone.
        for name, what, goal in (
            (EXCHANGE_OWN, "read on the caller's loop", EXCHANGE_GOAL),
            (EXCHANGE_ACKED, "read on the caller's loop, its landing's ack awaited", None),
            (EXCHANGE_THREAD_ACKED, "read by another thread, its landing's ack awaited", None),
        ):
            exchange = out.latency.get(name)
            if not exchange:
                continue
            over = p50 / _pct(exchange, 50)
            found.append(
                Target(
                    f"directory (1): lead-or-join p50 ÷ the lead's exchange by hand {what}",
                    f"{over:.2f}× (the exchange: {_pct(exchange, 50):,.0f} µs)",
                    "information" if goal is None else f"≤ {goal:.2f}×",
                    None if goal is None else over <= goal,
                )
            )
    herd = out.herd.get(FLIGHTGROUP)
    found.append(
        Target(
            f"directory (2): herd of {out.sizes.processes} processes × "
            f"{out.sizes.herd_tasks:,} tasks: runs of the work per herd; every caller got "
            "the value",
            f"{_runs(herd.runs) if herd else '—'}; {'yes' if herd and herd.served else 'no'}",
            "1; yes",
            _herd_ok(herd),
            True,
        )
    )
    mine = out.peers.get(FLIGHTGROUP)
    found.append(
        Target(
            f"directory (5): herd of {out.sizes.processes} processes × "
            f"{out.sizes.peer_threads:,} threads: flightgroup's runs per herd; every caller "
            "got the value",
            f"{_runs(mine.runs) if mine else '—'}; {'yes' if mine and mine.served else 'no'}",
            "1; yes",
            _herd_ok(mine),
            True,
        )
    )
    for lib in (DOGPILE, FILELOCK):
        theirs = out.peers.get(lib)
        usable = mine is not None and mine.usable and theirs is not None and theirs.usable
        ratio = (
            f"{median(mine.walls) / median(theirs.walls):.2f}×"
            if usable and mine is not None and theirs is not None
            else "—"
        )
        runs = _runs(theirs.runs) if theirs is not None else "not installed"
        found.append(
            Target(
                f"directory (5): herd wall time ÷ {lib}'s (its runs per herd: {runs})",
                ratio,
                "information" if usable else "—",
                None,
            )
        )
    if out.failover:
        found.append(
            Target(
                f"directory (4): failover, SIGKILL of the coordinator to the next flight led, "
                f"p50 of {len(out.failover)}",
                f"{median(out.failover) * 1e3:,.1f} ms",
                "information",
                None,
            )
        )
    return found + outage.directory_targets(out.outage)


def ok(out: DirectoryReport, found: list[Target]) -> bool:
    """False if flightgroup failed a measurement or broke a must."""
    return not out.errors and all(t.met is not False for t in found if t.must)


def section(out: DirectoryReport) -> list[str]:
    lines = [
        "## Directory scope: processes of one host share flights",
        "",
        "Every measurement uses real processes (multiprocessing's "
        f'"{out.start_method}" start method, driven over pipes); each opens its own '
        "`FlightGroup(directory=d, codec=JSON)` on a short temporary directory under /tmp "
        "and makes one call to connect before anything is timed. The first process to "
        "call in a fresh directory coordinates (checked against the holder of "
        "`flight.lock` in /proc/locks). Starts are synchronised with a barrier; times "
        "that span processes are read from CLOCK_MONOTONIC. The directories are removed "
        "only when the section ends: on an ext4 without a journal (as here), creating a "
        "file scans past the inodes removed in the last seconds, minutes while their "
        "inode table is not written back, so removing one measurement's thousands of "
        "key-lock files would slow the next one's creates (the key-lock floor of (1), "
        "timed in the first variant's own directory, shows what a create cost there in "
        "this run).",
        "",
    ]
    for name, error in out.errors.items():
        lines += [f"**{name} failed: {error}**", ""]
    lines += _latency_lines(out)
    lines += _herd_lines(out)
    lines += _throughput_lines(out)
    lines += _failover_lines(out)
    lines += _peer_lines(out)
    lines += outage.directory_lines(out.outage)
    return lines


def _latency_lines(out: DirectoryReport) -> list[str]:
    s = out.sizes
    if not out.latency:
        return []
    reference = out.latency.get(PROCESS)
    base = _pct(reference, 50) if reference else None
    lines = [
        f"### (1) Lead-or-join latency: a fresh key, {s.connected} other processes connected",
        "",
        f"`await g.run(fresh_key, work)`, the work returns at once, timed call by call in "
        f"one process: {s.latency_rounds} rounds of {s.latency_calls:,} calls per variant "
        f"(after {s.latency_warm} untimed ones; {s.latency_calls // 4:,} for the calls 1 ms "
        "apart), the variants' order rotating, garbage collection paused. Back to back, "
        "each call finds the threads it needs awake; 1 ms apart, as a program's occasional "
        "call would, it wakes them (on a VM, a core that fell idle is slow to wake). Each "
        "call leads (nobody else calls its key): a request to the "
        "coordinator, the answer, the key lock, the work, and the landing sent. The floors "
        "are timed in the same process, the socket one against the coordinator's process. "
        "The two exchanges send a lead's messages by hand on a connection of their own to "
        "the first variant's coordinator (no group, no flight table), their rounds rotating: "
        "they differ only in the thread that reads the answers, which DESIGN.md rule 4 puts "
        "on the group's own thread. "
        + " ".join(f"{name}: {who}." for name, who in out.coordinators.items()),
        "",
        "| variant | samples | p50 µs | p99 µs | p50 ÷ process scope's |",
        "| --- | --- | --- | --- | --- |",
    ]
    floors = 0.0
    for name, values in out.latency.items():
        p50 = _pct(values, 50)
        if name.startswith("floor:"):
            floors += p50
        ratio = f"{p50 / base:.1f}×" if base else "—"
        lines.append(
            f"| {name} | {len(values):,} | {p50:,.1f} | {_pct(values, 99):,.1f} | {ratio} |"
        )
    if any(name.startswith("floor:") for name in out.latency):
        ratio = f"{floors / base:.1f}×" if base else "—"
        # After the last floor, before the rows for comparison.
        last = max(i for i, line in enumerate(lines) if line.startswith("| floor:"))
        lines.insert(last + 1, f"| {FLOOR_SUM} | — | {floors:,.1f} | — | {ratio} |")
    return [*lines, "", *_cpu_lines(out)]


def _cpu_lines(out: DirectoryReport) -> list[str]:
    """Where the CPU of the first variant's calls goes: a call's path crosses three
    threads in two processes, and on a machine with few cores they queue for one."""
    calls, wall = out.cpu_calls, out.latency.get(OTHER)
    if not out.cpu or not calls or not wall:
        return []
    cores = os.cpu_count() or 1
    lines = [
        f'Where the CPU goes in "{OTHER}": the threads a call crosses, from the kernel\'s '
        "schedstat (time on a CPU, and time runnable but waiting for one), per call, the "
        f"untimed calls included. The machine has {cores} core{'s' if cores != 1 else ''}; "
        f"a timed call took {sum(wall) / len(wall):,.1f} µs on average.",
        "",
        "| thread | on a CPU, µs per call | waiting for a CPU, µs per call |",
        "| --- | --- | --- |",
    ]
    on_total = wait_total = 0.0
    for who in (CPU_CALLER, CPU_BACKGROUND, CPU_COORDINATOR):
        if who not in out.cpu:
            continue
        on_cpu, waiting = (ns / calls / 1e3 for ns in out.cpu[who])
        on_total, wait_total = on_total + on_cpu, wait_total + waiting
        lines.append(f"| {who} | {on_cpu:,.1f} | {waiting:,.1f} |")
    lines.append(f"| summed | {on_total:,.1f} | {wait_total:,.1f} |")
    return [*lines, ""]


def _herd_lines(out: DirectoryReport) -> list[str]:
    s = out.sizes
    if not out.herd:
        return []
    pause_ms = s.herd_sleep * 1e3
    lines = [
        f"### (2) Herd: {s.processes} processes × {s.herd_tasks:,} tasks on one key, the work "
        f"sleeps {pause_ms:.0f} ms",
        "",
        "The work appends a line to a journal file (runs = its lines), then sleeps. Wall "
        "time runs from the first process leaving the barrier to the last caller served "
        f"in any process; above the work = wall − {pause_ms:.0f} ms (making each caller's "
        "task, the coordinator's round trips, every process's wake-ups), also per caller. "
        "The floor is the same tasks in the same processes awaiting one bare "
        f"`asyncio.Future` per process, resolved {pause_ms:.0f} ms after its first task "
        f"arrives. {_rounds(s.herd_rounds)}, medians.",
        "",
        "| group | runs per herd | every caller got the value | wall ms: best | median | "
        "above the work, ms | µs per caller above the work |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, series in out.herd.items():
        if not series.usable:
            lines.append(f"| {name} | — | — | error: {series.error or 'no sample'} | — | — | — |")
            continue
        wall = median(series.walls)
        above = wall - s.herd_sleep
        served = "yes" if series.served else f"no ({_raised(series)})"
        runs = _runs(series.runs) if series.runs else "—"
        lines.append(
            f"| {name} | {runs} | {served} | {min(series.walls) * 1e3:,.1f} | "
            f"{wall * 1e3:,.1f} | {above * 1e3:,.1f} | {above / series.callers * 1e6:,.2f} |"
        )
    return [*lines, ""]


def _raised(series: Herd) -> str:
    got = min(series.got) if series.got else 0
    text = f"{got:,} of {series.callers:,} at worst"
    if any(series.errors):
        text += f", {max(series.errors):,} raised"
        if series.first_error:
            text += f": {series.first_error}"
    return text


def _throughput_lines(out: DirectoryReport) -> list[str]:
    s = out.sizes
    if not out.throughput:
        return []
    lines = [
        f"### (3) Throughput: {s.throughput_processes} processes calling distinct keys",
        "",
        f"Each process makes {s.throughput_calls:,} calls of keys nobody else calls, the work "
        "returns at once (every call leads, so the work's runs equal the flights); either "
        "one caller awaiting its calls one after the other, or "
        f"{TASKS_CONCURRENT} tasks sharing them. Time from the first process leaving the "
        f"barrier to the last one done; {_rounds(s.throughput_rounds)}, the median.",
        "",
        "| callers per process | flights per round | runs of the work | s: best | median | "
        "flights per second (median) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for tasks, series in out.throughput.items():
        if not series.seconds:
            continue
        mid = median(series.seconds)
        label = "1 (sequential awaits)" if tasks == 1 else f"{tasks} tasks"
        lines.append(
            f"| {label} | {series.flights:,} | {_runs(series.runs)} | "
            f"{min(series.seconds):,.3f} | {mid:,.3f} | {series.flights / mid:,.0f} |"
        )
    return [*lines, ""]


def _failover_lines(out: DirectoryReport) -> list[str]:
    if not out.failover:
        return []
    ms = [v * 1e3 for v in out.failover]
    epoch = [v * 1e3 for v in out.epoch_write]
    led = "yes" if all(out.failover_led) else "no"
    rows = [("SIGKILL to the next flight led", ms)]
    rows += [
        (f"… when {who} took over", [v * 1e3 for v in values])
        for who, values in sorted(out.takeover.items())
    ]
    if out.failover_exit:
        rows.append(("SIGKILL to the coordinator's exit (its pidfd readable)",
                     [v * 1e3 for v in out.failover_exit]))
    rows += [("the epoch write alone", epoch)] if epoch else []
    return [
        "### (4) Failover: SIGKILL of the coordinator to the next flight led",
        "",
        f"{len(ms)} tries, each in a fresh directory with three processes: a new child "
        "that calls first (the coordinator), another process, and the measuring one, "
        "which sends SIGKILL to the coordinator and at once times `await g.run(new_key, "
        "work)` until it returns: the kernel frees `flight.lock`, a waiting process wins "
        "it and writes the next epoch durably, serves, and the measuring process "
        "(re)connects, leads and runs the work. The two others connect in turns (the "
        "first to connect mostly wins the next term); the next coordinator is read from "
        "/proc/locks. For where the time goes: the coordinator's exit (a pidfd on it, "
        "watched by a thread of the measuring process: the kernel's teardown of the "
        "killed process, before `flight.lock` is free), and the epoch write alone "
        "(`next_epoch` on a scratch directory, in the measuring process).",
        "",
        "| what | tries | p50 ms | best | worst |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {what} | {len(values)} | {median(values):,.2f} | {min(values):,.2f} | "
            f"{max(values):,.2f} |"
            for what, values in rows
            if values
        ),
        "",
        f"Every measured call led: {led}.",
        "",
    ]


def _peer_lines(out: DirectoryReport) -> list[str]:
    s = out.sizes
    if not out.peers:
        return []
    pause_ms = s.herd_sleep * 1e3
    mine = out.peers.get(FLIGHTGROUP)
    lines = [
        f"### (5) Against what users do today: {s.processes} processes × {s.peer_threads} "
        f"threads on one key, the work sleeps {pause_ms:.0f} ms",
        "",
        "The same cross-process herd, with threads (the peers are synchronous), in the "
        "same processes and the same run, the libraries' order rotating: "
        "flightgroup's `g.run_sync(key, work)`; dogpile.cache's "
        '`make_region().configure("dogpile.cache.dbm", expiration_time=3600, '
        'arguments={"filename": ...})` and `region.get_or_create(key, work)` (its '
        f"dogpile lock is an flock on one lock file per dbm file; dbm here: `{out.dbm}`); "
        "and a `filelock.FileLock` per call around a file cache (lock, read the file, "
        "or run the work and write it, unlock; filelock's defaults, which poll a busy "
        "lock every 50 ms). The work appends a line to a journal file (runs = its lines) "
        "and sleeps; a new key per herd. Wall time from the first process leaving the "
        f"barrier to the last caller served; {_rounds(s.peer_rounds)}, the median; ratios "
        "are flightgroup's median wall time ÷ the library's.",
        "",
        "| library | runs per herd | every caller got the value | wall ms: best | median | "
        "worst | flightgroup ÷ this (median) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, series in out.peers.items():
        if not series.usable:
            lines.append(f"| {name} | — | — | error: {series.error or 'no sample'} | — | — | — |")
            continue
        wall = median(series.walls)
        ratio = (
            f"{median(mine.walls) / wall:.2f}×" if mine is not None and mine.usable else "—"
        )
        served = "yes" if series.served else f"no ({_raised(series)})"
        lines.append(
            f"| {name} | {_runs(series.runs)} | {served} | {min(series.walls) * 1e3:,.1f} | "
            f"{wall * 1e3:,.1f} | {max(series.walls) * 1e3:,.1f} | {ratio} |"
        )
    return [*lines, ""]
