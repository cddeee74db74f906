"""flightgroup.prometheus with several worker processes (ADR 0046): a scrape of any worker
shows the sums over all of them, counters never go down, a dead worker's counts stay."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from flightgroup import FlightGroup
from flightgroup.prometheus import DIRECTORY_ENV, FlightGroupCollector, register
from tests.redisproc import free_port

HERE = Path(__file__).parent
SRC = HERE.parent.parent / "src"
WORKERS = 4


@dataclass(frozen=True)
class Scrape:
    """One scrape of /metrics: the worker that answered and the sums it showed."""

    pid: int
    calls: float
    flights: float
    joins: float
    in_flight: float
    workers: float


class Server:
    """``uvicorn --workers 4`` serving workers_app.py on a free loopback port."""

    def __init__(self, metrics: Path, log: Path) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "FG_TEST_METRICS_DIR": str(metrics),
            "FG_TEST_METRICS_INTERVAL": "0.2",
            "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE), os.environ.get("PYTHONPATH", "")]),
        }
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "workers_app:app", "--workers", str(WORKERS),
             "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"],
            env=env, cwd=HERE, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def get(self, path: str) -> tuple[int, bytes]:
        """GET ``path`` on a new connection (the kernel gives it to any worker): the pid
        of the worker that answered and the body."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            body = response.read()
            assert response.status == 200, body
            return int(response.headers["x-pid"]), body
        finally:
            connection.close()

    def scrape(self) -> Scrape:
        pid, body = self.get("/metrics")
        sums: dict[str, float] = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
        return Scrape(pid=pid, calls=sums["flightgroup_calls_total"],
                      flights=sums["flightgroup_flights_total"],
                      joins=sums["flightgroup_joins_total"],
                      in_flight=sums["flightgroup_in_flight"],
                      workers=sums["flightgroup_workers"])

    def scrape_until(self, done: Callable[[Scrape], bool], limit: float = 30.0) -> list[Scrape]:
        """Scrape until ``done(scrape)`` holds (bounded: ``limit`` seconds); every
        scrape made, in order."""
        scrapes: list[Scrape] = []
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            with contextlib.suppress(ConnectionError):
                scrapes.append(self.scrape())
                if done(scrapes[-1]):
                    return scrapes
            time.sleep(0.05)
        raise AssertionError(f"not reached in {limit} s; last scrapes: {scrapes[-3:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)  # the session this test started
            self.process.wait(10)
        self._log.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    made = Server(tmp_path / "metrics", tmp_path / "uvicorn.log")
    try:
        # Every worker wrote its first snapshot: the sums count four live workers.
        made.scrape_until(lambda scrape: scrape.workers == WORKERS)
        yield made
    finally:
        made.stop()


def call_many(server: Server, calls: int, keys: int) -> list[int]:
    """``calls`` calls over ``keys`` keys, 16 at a time, each on its own connection;
    the pid of the worker that answered each."""
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda i: server.get(f"/call/k{i % keys}"), range(calls)))
    return [pid for pid, _ in answers]


def wait_gone(pid: int, limit: float = 20.0) -> None:
    """Until ``pid`` was reaped (by uvicorn, its parent), bounded."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"worker {pid} still there after {limit} s")


def assert_never_down(scrapes: list[Scrape]) -> None:
    for field in ("calls", "flights", "joins"):
        values = [getattr(scrape, field) for scrape in scrapes]
        assert values == sorted(values), f"{field} went down: {values}"


@pytest.mark.timeout(120)
def test_counters_of_four_uvicorn_workers_never_go_down_and_add_up_to_the_calls(
    server: Server,
) -> None:
    """Scrapes that reach any of 4 uvicorn workers, while and after calls are made on
    all of them, never see a counter go down and end at the number of calls made."""
    calls = 400
    scrapes: list[Scrape] = []
    stop = threading.Event()

    def scrape_all_along() -> None:
        while not stop.is_set():
            scrapes.append(server.scrape())

    scraper = threading.Thread(target=scrape_all_along)
    scraper.start()
    try:
        pids = call_many(server, calls, keys=25)
    finally:
        stop.set()
        scraper.join(30)
    # Each worker's file is at most an interval behind; its gauges settle with it.
    scrapes += server.scrape_until(lambda scrape: scrape.calls == calls and scrape.in_flight == 0)
    # 30 more scrapes: the sums stay the same whichever worker answers.
    scrapes += [server.scrape() for _ in range(30)]
    assert len(set(pids)) >= 2, "the calls reached one worker only"
    assert len({scrape.pid for scrape in scrapes}) >= 2, "the scrapes reached one worker only"
    assert_never_down(scrapes)
    last = scrapes[-1]
    assert last.calls == calls
    assert last.flights + last.joins == calls  # each call led its flight or joined one
    assert last.in_flight == 0
    assert last.workers == WORKERS


@pytest.mark.timeout(120)
def test_a_killed_uvicorn_worker_keeps_its_counts_in_the_sums(server: Server) -> None:
    """A worker SIGKILLed after its counts were written leaves them in the sums; the
    worker uvicorn starts in its place adds its own."""
    pids = call_many(server, 200, keys=20)
    scrapes = server.scrape_until(lambda scrape: scrape.calls == 200)
    killed = max(set(pids), key=pids.count)  # the worker that answered the most calls
    os.kill(killed, signal.SIGKILL)
    wait_gone(killed)
    # Three workers live until uvicorn's new one wrote its first snapshot.
    after = server.scrape_until(lambda scrape: scrape.workers == WORKERS)
    assert all(scrape.calls == 200 for scrape in after), after
    assert killed not in {scrape.pid for scrape in after}
    pids = call_many(server, 100, keys=20)
    assert killed not in pids
    scrapes += after + server.scrape_until(
        lambda scrape: scrape.calls == 300 and scrape.in_flight == 0
    )
    assert_never_down(scrapes)
    assert scrapes[-1].flights + scrapes[-1].joins == 300


CHILD = textwrap.dedent("""
    import sys, threading, time
    from prometheus_client import CollectorRegistry
    from flightgroup import FlightGroup
    from flightgroup.prometheus import register

    group, registry = FlightGroup(), CollectorRegistry()
    register(group, registry, name="held", directory=sys.argv[1], interval=60)
    started, release = threading.Event(), threading.Event()

    def work():
        started.set()
        release.wait()

    threading.Thread(target=group.run_sync, args=("k", work), daemon=True).start()
    started.wait()
    list(registry.collect())  # a scrape writes this process's counts first
    print("held", flush=True)
    time.sleep(600)
""")


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


@pytest.mark.timeout(60)
def test_a_dead_processes_gauges_leave_the_sums_and_its_counters_stay(tmp_path: Path) -> None:
    """A process killed while its flight runs: its in-flight gauge counted while it
    lived and not after; its calls and flights stay counted."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)],
                             stdout=subprocess.PIPE, env={**os.environ})
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"held\n"
        registry = CollectorRegistry()
        registry.register(FlightGroupCollector(directory=tmp_path))  # reads only
        assert sample(registry, "flightgroup_in_flight", group="held") == 1.0
        assert sample(registry, "flightgroup_calls_total", group="held") == 1.0
        assert sample(registry, "flightgroup_workers") == 1.0
    finally:
        child.kill()
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
    assert sample(registry, "flightgroup_in_flight", group="held") == 0.0
    assert sample(registry, "flightgroup_calls_total", group="held") == 1.0
    assert sample(registry, "flightgroup_flights_total", group="held") == 1.0
    assert sample(registry, "flightgroup_workers") == 0.0


def test_a_removed_or_closed_groups_counts_stay_in_the_sums(tmp_path: Path) -> None:
    """Removing a group, registering a new one under its name, and closing the
    collector never take a count out of the directory's sums."""
    registry = CollectorRegistry()
    first = FlightGroup()
    collector = register(first, registry, name="a", directory=tmp_path)
    try:
        for key in ("x", "y", "z"):
            first.run_sync(key, lambda: 1)
        assert sample(registry, "flightgroup_calls_total", group="a") == 3.0
        collector.remove("a")
        assert sample(registry, "flightgroup_calls_total", group="a") == 3.0
        assert sample(registry, "flightgroup_flight_seconds_count", group="a") == 3.0
        second = FlightGroup()
        register(second, registry, name="a", directory=tmp_path)
        second.run_sync("x", lambda: 1)
        assert sample(registry, "flightgroup_calls_total", group="a") == 4.0
        assert sample(registry, "flightgroup_workers") == 1.0
    finally:
        collector.close()
    assert sample(registry, "flightgroup_calls_total", group="a") == 4.0
    assert sample(registry, "flightgroup_workers") == 0.0


CALLING = textwrap.dedent("""
    import sys
    from prometheus_client import CollectorRegistry
    from flightgroup import FlightGroup
    from flightgroup.prometheus import register

    group = FlightGroup()
    register(group, CollectorRegistry(), name="g", directory=sys.argv[1], interval=60)
    for i in range(int(sys.argv[2])):
        group.run_sync(f"k{i}", lambda: 1)
""")


@pytest.mark.timeout(60)
def test_exited_writers_counts_are_written_at_exit_and_merged_into_one_file(
    tmp_path: Path,
) -> None:
    """Processes that exit write their counts at exit; a scrape merges the files of
    dead writers into one and counts each once, a file its merger left behind too."""
    for calls in (1, 2, 4):
        subprocess.run([sys.executable, "-c", CALLING, str(tmp_path), str(calls)],
                       check=True, timeout=50)
    written = sorted(tmp_path.glob("*.json"))
    assert len(written) == 3
    left_behind = written[0].read_bytes()
    registry = CollectorRegistry()
    registry.register(FlightGroupCollector(directory=tmp_path))
    assert sample(registry, "flightgroup_calls_total", group="g") == 7.0
    assert sorted(path.name for path in tmp_path.iterdir() if not path.name.startswith(".")) == [
        "dead.json"
    ]
    # As if the merging reader had died before it removed that file: still counted once.
    written[0].write_bytes(left_behind)
    assert sample(registry, "flightgroup_calls_total", group="g") == 7.0
    assert not written[0].exists()
    subprocess.run([sys.executable, "-c", CALLING, str(tmp_path), "3"], check=True, timeout=50)
    assert sample(registry, "flightgroup_calls_total", group="g") == 10.0
    assert sample(registry, "flightgroup_flight_seconds_count", group="g") == 10.0
    assert sample(registry, "flightgroup_workers") == 0.0


FORKING = textwrap.dedent("""
    import os, sys, warnings
    from prometheus_client import CollectorRegistry
    from flightgroup import FlightGroup
    from flightgroup.prometheus import register

    warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: on purpose
    group, registry = FlightGroup(), CollectorRegistry()
    collector = register(group, registry, name="g", directory=sys.argv[1], interval=60)
    for key in ("a", "b", "c"):
        group.run_sync(key, lambda: 1)
    list(registry.collect())  # the parent's file holds its 3 calls before the fork
    pid = os.fork()
    if pid == 0:
        group.run_sync("d", lambda: 1)
        group.run_sync("e", lambda: 1)
        collector.close()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
""")


@pytest.mark.timeout(60)
def test_a_forked_child_counts_only_its_own_calls(tmp_path: Path) -> None:
    """A child forked from a process that exported a group writes its own calls to a
    file of its own, not the parent's counts again."""
    subprocess.run([sys.executable, "-c", FORKING, str(tmp_path)], check=True, timeout=50)
    assert len(list(tmp_path.glob("*.json"))) == 2  # the parent's and the child's
    registry = CollectorRegistry()
    registry.register(FlightGroupCollector(directory=tmp_path))
    assert sample(registry, "flightgroup_calls_total", group="g") == 5.0
    assert sample(registry, "flightgroup_flights_total", group="g") == 5.0


def test_a_registry_exports_from_one_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory comes from FLIGHTGROUP_PROMETHEUS_DIR when not given; a registry's
    groups all use its collector's directory."""
    monkeypatch.setenv(DIRECTORY_ENV, str(tmp_path / "env"))
    registry = CollectorRegistry()
    collector = register(FlightGroup(), registry, name="a")
    try:
        assert collector.directory == os.path.realpath(tmp_path / "env")
        with pytest.raises(ValueError, match="directory"):
            register(FlightGroup(), registry, name="b", directory=tmp_path / "other")
    finally:
        collector.close()
