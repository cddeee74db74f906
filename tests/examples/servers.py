"""The example recipes' servers and workers as the tests start them: real child
processes on free loopback ports, stopped by pid, and the held work of hold.py seen
from the test's side."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..redisproc import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent
WAIT = 30.0  # the most any one expected event may take on a loaded machine
# gunicorn as the tests start it: without its control socket, whose default path is
# one per user (tests running side by side would take it from each other).
GUNICORN = [str(BIN / "gunicorn"), "--no-control-socket"]


def child_env(hold: Hold | None = None, **extra: str) -> dict[str, str]:
    """The environment of a child: this checkout's flightgroup and tests importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env["PYTHONUNBUFFERED"] = "1"
    for name in ("FLIGHTGROUP_REDIS", "FLIGHTGROUP_NAMESPACE", "FLIGHTGROUP_DIR"):
        env.pop(name, None)
    if hold is not None:
        env["FLIGHTGROUP_EXAMPLE_HOLD"] = str(hold.folder)
    env.update(extra)
    return env


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Poll ``predicate`` until it holds; past ``timeout`` the test fails naming ``what``."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Hold:
    """The test's side of hold.py: the files its held works and joins write."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def lines(self, name: str) -> list[str]:
        """The lines of ``started`` or ``joined`` so far."""
        with contextlib.suppress(FileNotFoundError):
            return (self.folder / name).read_text().splitlines()
        return []

    def wait(self, *, started: int, joined: int, seen: Sequence[Child] = ()) -> None:
        """Wait until ``started`` runs began and ``joined`` calls joined: every request
        sent is then a leader or a joiner, and none can start a second run. A timeout's
        message shows the output of the children ``seen``."""
        try:
            wait_for(
                lambda: len(self.lines("started")) >= started
                and len(self.lines("joined")) >= joined,
                f"{started} started and {joined} joined",
            )
        except AssertionError as failed:
            logs = "\n".join(child.output() for child in seen)
            raise AssertionError(
                f"{failed} (have {self.lines('started')}, {self.lines('joined')})\n{logs}"
            ) from None

    def release(self) -> None:
        """Let the held works go on."""
        (self.folder / "go").touch()

    def reset(self) -> None:
        """Forget the runs and joins seen so far, and hold the next works again."""
        for name in ("started", "joined", "go"):
            with contextlib.suppress(FileNotFoundError):
                (self.folder / name).unlink()


@contextlib.contextmanager
def held() -> Iterator[Hold]:
    """A Hold on a fresh temporary folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="fghold") as folder:
        yield Hold(Path(folder))


class Child:
    """One child process (a server's master, a worker), started in a session of its
    own so that stopping it reaches the processes it made; output to a log file."""

    def __init__(self, argv: Sequence[str], *, cwd: Path, env: dict[str, str]) -> None:
        fd, self.log_path = tempfile.mkstemp(prefix="fgchild", suffix=".log")
        self.log = os.fdopen(fd, "wb")
        self.argv = list(argv)
        self.proc = subprocess.Popen(
            self.argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def output(self) -> str:
        """What it wrote on stdout and stderr so far."""
        return Path(self.log_path).read_text(errors="replace")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (a graceful stop), then SIGKILL to its session past ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        # what it started and left behind (a worker it did not reap) goes with it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()
        os.unlink(self.log_path)


class Children:
    """The children of one test, each stopped at its end (the ``children`` fixture)."""

    def __init__(self) -> None:
        self.started: list[Child] = []

    def start(self, argv: Sequence[str], *, cwd: Path, env: dict[str, str]) -> Child:
        child = Child(argv, cwd=cwd, env=env)
        self.started.append(child)
        return child

    def stop_all(self) -> None:
        """Stop every child still running, the last started first."""
        while self.started:
            self.started.pop().stop()


@dataclass(frozen=True)
class Reply:
    """One HTTP answer: its status, its headers (names in lower case), its body as JSON."""

    status: int
    headers: dict[str, str]
    body: object


def poke(url: str) -> None:
    """GET ``url`` only to spend a request of whichever worker takes it. One that a worker
    takes as it exits (its --max-requests reached) is reset, as gunicorn does; it is
    nothing to the caller, which pokes again."""
    with contextlib.suppress(ConnectionError, urllib.error.URLError):
        get(url)


def get(url: str, timeout: float = WAIT) -> Reply:
    """GET ``url`` and read its JSON body (an error status is a Reply too)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            headers = {name.lower(): value for name, value in answer.headers.items()}
            return Reply(answer.status, headers, json.loads(answer.read()))
    except urllib.error.HTTPError as error:
        headers = {name.lower(): value for name, value in error.headers.items()}
        return Reply(error.code, headers, error.read().decode(errors="replace"))


def get_many(urls: Sequence[str]) -> list[Future[Reply]]:
    """GET every url at once, each on a thread of its own; the futures of their replies."""
    pool = ThreadPoolExecutor(max_workers=len(urls))
    futures = [pool.submit(get, url) for url in urls]
    pool.shutdown(wait=False)
    return futures


def wait_ready(url: str, child: Child, timeout: float = WAIT) -> None:
    """Wait until ``url`` answers 200; fail with the child's output if it exited."""

    def ready() -> bool:
        if child.proc.poll() is not None:
            raise AssertionError(f"{child.argv[:3]} exited:\n{child.output()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    wait_for(ready, f"{url} to answer", timeout)


def base_url() -> tuple[int, str]:
    """A free loopback port and its base URL."""
    port = free_port()
    return port, f"http://127.0.0.1:{port}"


def one_build(server: Child, url: str, hold: Hold, day: str, requests: int) -> set[str]:
    """Fire ``requests`` concurrent requests for ``day``'s report (no more than a worker's
    threads: a worker may take them all, and one past its threads would queue behind
    the held ones), held until all of them led or joined; check they got one build.
    Returns the pids of the workers that answered."""
    hold.reset()
    replies = get_many([f"{url}/reports/{day}"] * requests)
    hold.wait(started=1, joined=requests - 1, seen=[server])
    hold.release()
    answers = [reply.result(timeout=30) for reply in replies]
    assert len(hold.lines("started")) == 1
    assert [a.status for a in answers] == [200] * requests
    assert len({str(a.body) for a in answers}) == 1
    assert sorted(a.headers["x-flight"] for a in answers) == ["joined"] * (requests - 1) + ["led"]
    return {a.headers["x-worker"] for a in answers}
