"""CollapseRequests on a real server: uvicorn with 4 worker processes, each with its own
directory group, serving herds of identical requests over loopback."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from ..support import run
from .payload import BIG, big_body

_ROOT = Path(__file__).resolve().parents[2]
WORKERS = 4
# One worker of the suite runs them all, on one server (--dist loadgroup).
pytestmark = pytest.mark.xdist_group("asgi_uvicorn")


def free_port() -> int:
    """A loopback port free at the time of asking."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """A uvicorn of WORKERS workers serving tests/asgi/workerapp.py, and its state files."""

    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "state"
        self.state.mkdir()
        self.port = free_port()
        env = dict(os.environ, FG_STATE=str(self.state), FG_DIR=str(tmp / "flights"),
                   PYTHONPATH=os.pathsep.join([str(_ROOT / "src"), str(_ROOT)]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "tests.asgi.workerapp:app",
             "--workers", str(WORKERS), "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "warning", "--no-access-log", "--lifespan", "on"],
            cwd=_ROOT, env=env, start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, bound: float = 30.0) -> None:
        """Until every worker has started (its lifespan wrote ready.<pid>)."""
        end = time.monotonic() + bound
        while len(list(self.state.glob("ready.*"))) < WORKERS:
            if self.proc.poll() is not None:
                raise AssertionError(f"uvicorn exited with {self.proc.returncode}")
            if time.monotonic() > end:
                raise AssertionError("uvicorn's workers did not all start")
            time.sleep(0.02)

    def calls_by_worker(self) -> dict[str, int]:
        """Each worker's group's calls, by pid."""
        return {
            path.name.removeprefix("calls."): int(path.read_text() or 0)
            for path in self.state.glob("calls.*")
            if not path.name.endswith(".tmp")
        }

    def calls(self) -> int:
        """The workers' groups' calls, summed."""
        return sum(self.calls_by_worker().values())

    def runs(self, path: str) -> list[str]:
        """The pids of the workers whose endpoint ran for ``path``."""
        try:
            lines = (self.state / "runs").read_text().splitlines()
        except FileNotFoundError:
            return []
        return [pid for p, pid in (line.split() for line in lines) if p == path]

    def go(self, path: str) -> None:
        """Release every run of ``path`` (now and later)."""
        (self.state / f"go.{path.strip('/').replace('/', '_')}").touch()

    def stop(self) -> None:
        """SIGTERM to uvicorn (it stops its workers); SIGKILL to its group past 15 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    made = Server(tmp_path_factory.mktemp("uvicorn"))
    try:
        made.wait_ready()
        yield made
    finally:
        made.stop()


async def until(condition: Callable[[], bool], bound: float = 60.0) -> None:
    """Poll ``condition`` (it reads the workers' files) until it holds."""
    end = time.monotonic() + bound
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("the condition never held")
        await asyncio.sleep(0.01)


def client(connections: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=0),
        timeout=httpx.Timeout(90.0),
    )


async def herd(
    server: Server, path: str, count: int, *, collapsed: int, running: int = 1,
    headers: Callable[[int], dict[str, str]] | None = None,
) -> list[httpx.Response]:
    """``count`` concurrent GETs of ``path``; ``path`` is released once ``collapsed`` of
    them reached their flights and ``running`` runs of it started."""
    before = server.calls()
    async with client(count) as http:
        tasks = [
            asyncio.ensure_future(
                http.get(server.url + path, headers=None if headers is None else headers(i))
            )
            for i in range(count)
        ]
        await until(lambda: server.calls() - before >= collapsed
                    and len(server.runs(path)) >= running)
        server.go(path)
        return list(await asyncio.gather(*tasks))


@pytest.mark.timeout(120)
def test_600_identical_gets_on_4_workers_run_the_endpoint_once(server: Server) -> None:
    """600 concurrent identical GETs over 4 uvicorn workers (directory scope) run the
    endpoint once; all get its status and body; one is led, 599 joined; the herd
    reached several workers."""
    before = server.calls_by_worker()
    answers = run(herd(server, "/once/herd", 600, collapsed=600), timeout=100)
    spread = {pid: n - before.get(pid, 0) for pid, n in server.calls_by_worker().items()}
    assert sum(spread.values()) == 600
    assert sum(1 for n in spread.values() if n) >= 2  # the herd crossed workers
    assert len(server.runs("/once/herd")) == 1
    assert {(a.status_code, a.content) for a in answers} == {
        (200, b"one run for the herd (/once/herd)")
    }
    roles = sorted(a.headers["x-flightgroup"] for a in answers)
    assert roles == ["joined"] * 599 + ["led"]


@pytest.mark.timeout(120)
def test_authorization_is_never_shared_across_workers(server: Server) -> None:
    """40 concurrent GETs with Authorization (20 distinct tokens, 20 equal ones) each run
    the endpoint, all at once, and each gets its own token back."""
    def token(i: int) -> dict[str, str]:
        return {"authorization": f"Bearer t{i}" if i < 20 else "Bearer same"}

    answers = run(herd(server, "/auth/whoami", 40, collapsed=0, running=40, headers=token),
                  timeout=100)
    assert len(server.runs("/auth/whoami")) == 40
    assert [a.content for a in answers] == [token(i)["authorization"].encode()
                                            for i in range(40)]
    assert all("x-flightgroup" not in a.headers for a in answers)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("prefix", "shared"), [("/large", True), ("/small", False)])
def test_a_10_mb_streamed_body_reaches_every_caller_whole(
    server: Server, prefix: str, shared: bool
) -> None:
    """A 10 MB streamed body reaches leader and joiners byte for byte: shared under a
    16 MiB limit (one run), run again by each joiner under a 1 MiB limit."""
    path = f"{prefix}/big"
    answers = run(herd(server, path, 8, collapsed=8), timeout=100)
    expected = hashlib.sha256(big_body()).hexdigest()
    assert all(a.status_code == 200 and len(a.content) == BIG for a in answers)
    assert {hashlib.sha256(a.content).hexdigest() for a in answers} == {expected}
    assert len(server.runs(path)) == (1 if shared else 8)
    roles = sorted(a.headers.get("x-flightgroup", "-") for a in answers)
    assert roles == (["joined"] * 7 + ["led"] if shared else ["-"] * 7 + ["led"])


@pytest.mark.timeout(120)
def test_the_leaders_disconnect_leaves_the_joiners_whole(server: Server) -> None:
    """The leader's client of a 10 MB body hangs up while the run waits; the run goes
    on once, and the 7 joiners (in any worker) get the whole body."""
    path = "/gone/big"

    async def scenario() -> list[httpx.Response]:
        before = server.calls()
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
        await writer.drain()
        await until(lambda: len(server.runs(path)) == 1)
        async with client(7) as http:
            tasks = [asyncio.ensure_future(http.get(server.url + path)) for _ in range(7)]
            await until(lambda: server.calls() - before >= 8)
            writer.close()  # the leader's client goes away before its first byte
            await writer.wait_closed()
            server.go(path)
            return list(await asyncio.gather(*tasks))

    answers = run(scenario(), timeout=100)
    expected = hashlib.sha256(big_body()).hexdigest()
    assert {(a.status_code, hashlib.sha256(a.content).hexdigest()) for a in answers} == {
        (200, expected)
    }
    assert {a.headers["x-flightgroup"] for a in answers} == {"joined"}
    assert len(server.runs(path)) == 1
