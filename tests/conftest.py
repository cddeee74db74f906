"""Shared fixtures. Every test runs under pytest-timeout (pyproject: timeout = 60)."""

from __future__ import annotations

import compileall
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .support import LoopThread

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile flightgroup and the tests' child programs once, for this Python.

    Many tests start child interpreters that import flightgroup. Where
    PYTHONDONTWRITEBYTECODE is set (as on this project's CI machines) nothing is cached,
    so each child compiled every module from source again: about 0.15 s of CPU per child,
    some thousands of children per run. Compiled files are only read where the source
    still matches them, and ``__pycache__`` is ignored by git."""
    if sys.dont_write_bytecode:
        for package in ("src/flightgroup", "tests", "benchmarks"):
            compileall.compile_dir(os.path.join(_ROOT, package), quiet=1)


def pytest_report_header(config: pytest.Config) -> str:
    """Which Redis build the fleet tests start (tests/redisproc.py; ADR 0029)."""
    import subprocess

    from .redisproc import REDIS_SERVER

    try:
        banner = subprocess.run(
            [REDIS_SERVER, "--version"], capture_output=True, text=True, timeout=20
        ).stdout.strip()
    except OSError as exc:
        banner = f"cannot run: {exc}"
    return f"redis-server for the fleet tests: {REDIS_SERVER} ({banner})"


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    try:
        yield lt
    finally:
        lt.close()


@pytest.fixture
def directory() -> Iterator[str]:
    """A directory group's path that does not exist yet, short enough for its socket
    (103 bytes: pytest's tmp_path can be longer), removed afterwards."""
    path = tempfile.mkdtemp(prefix="fgt", dir="/tmp")
    try:
        yield os.path.join(path, "d")
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def h() -> Iterator[Any]:
    """A :class:`tests.dirproc.Harness`: child processes on one directory, driven over
    pipes, all stopped (by pid) and the directory removed afterwards."""
    from .dirproc import harness

    with harness() as made:
        yield made


@pytest.fixture
def mute(h: Any) -> Iterator[Any]:
    """A :class:`tests.dirproc.MuteCoordinator` on ``h``'s directory: a coordinator that
    answers only the handshake (the test holds the election)."""
    from .dirproc import MuteCoordinator

    os.makedirs(h.dir, mode=0o700)
    h.take_election()
    made = MuteCoordinator(h.path("flight.sock"))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def server() -> Iterator[Any]:
    """A redis-server of the test's own (frozen, or left with keys the module's
    server must not hold)."""
    from .redisproc import RedisServer

    s = RedisServer()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[Any]:
    """A redis-server of this module's own, on a free loopback port (tests that
    kill, freeze or restart it use one of their own: see tests/redisproc.py)."""
    from .redisproc import RedisServer, keys_without_ttl

    server = RedisServer()
    try:
        yield server
        # Every key the library wrote in this module has a TTL (set by the script that
        # created it): checked on every module's own server, after its last test.
        if server.proc is not None and server.proc.poll() is None:
            server.cont()  # a test may have left it frozen
            left = keys_without_ttl(server.client())
            assert not left, f"keys without a TTL on this module's redis-server: {left[:10]}"
    finally:
        server.close()


@pytest.fixture
def holding_proxy(redis_server: Any) -> Iterator[Any]:
    """A proxy to the module's redis-server that can cut and hold replies."""
    from .redisproc import HoldingCutProxy

    proxy = HoldingCutProxy(redis_server.port)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A Redis Cluster (3 masters) of this module's own."""
    from .redisproc import RedisCluster

    c = RedisCluster()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def namespace() -> str:
    """A fleet namespace no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def spans() -> Iterator[Any]:
    """An OpenTelemetry SDK tracer provider and the in-memory exporter of its spans."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _one_group(request: pytest.FixtureRequest) -> Iterator[Any]:
    from .ingroup import scope_groups

    [g] = scope_groups(request, request.param, 1, lease=5.0)
    try:
        yield g
    finally:
        g.close()


@pytest.fixture(params=["directory", "fleet"])
def wide(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A group of each wide scope (the directory's, or the fleet's on the test's Redis)."""
    yield from _one_group(request)


@pytest.fixture(params=["process", "directory", "fleet"])
def g(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A group of each scope (the fleet's on the test's Redis)."""
    yield from _one_group(request)


@pytest.fixture(params=["directory", "fleet"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """Two groups of one wide scope (the directory's, or the fleet's on the test's Redis)."""
    from .ingroup import scope_groups

    made = scope_groups(request, request.param, 2, lease=2.0)
    try:
        yield made[0], made[1]
    finally:
        for g in made:
            g.close()
