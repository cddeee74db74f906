"""``flightgroup status`` as a user runs it: what it shows of the flights in flight (a
key as it was called, a flight that comes and goes under ``--watch``), what it does to
a pipe and a terminal, and that it changes nothing where no group was used.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flightgroup import JSON, FlightGroup, FlightTimeoutError
from flightgroup.group import internals

from ..infleet import fleet_group
from ..infresh import held
from ..ingroup import Background
from ..support import scope_of, wait_until
from .test_run import (
    PY,
    Run,
    place,
    run_flightgroup,
    runs,
    start_leader,
)

__all__ = ["place", "runs"]  # fixtures, used by name

pytestmark = pytest.mark.timeout(60)


def test_status_of_a_path_that_is_no_directory_is_bad_usage(place: Path) -> None:
    """status of a path that is no directory is bad usage (exit 2)."""
    (place / "file").write_text("")
    proc = run_flightgroup("status", "--dir", str(place / "file"))
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(b"flightgroup: error: ")
    assert b"not a directory" in line


def test_status_of_a_folder_no_group_ever_used_has_no_flights_and_changes_nothing() -> None:
    """status of a folder no group ever used has no flights and changes nothing.

    A folder without flight.lock (here /proc, where no group can be) holds no group: status says
    so and creates nothing (it takes no part in an election there)."""
    proc = run_flightgroup("status", "--dir", "/proc", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"flights": []}


def test_fleet_status_shows_a_key_that_is_not_utf8_as_it_was_called(
    redis_server: Any, namespace: str
) -> None:
    """status on the fleet shows a key that is not UTF-8 as it was called."""
    key = b"a\xffb".decode("utf-8", "surrogateescape")  # as a command line gives it
    g = fleet_group(redis_server.url, namespace)
    started, release = threading.Event(), threading.Event()
    try:
        leader = Background(lambda: g.run_sync(key, held([], "v", started, release)))
        assert started.wait(10)
        [flight] = scope_of(g).status()
        assert flight["key"] == key
        release.set()
        assert leader.wait().value == "v"
    finally:
        release.set()
        g.close()


def test_status_shows_a_decorated_functions_key_as_its_name_and_key(directory: str) -> None:
    """status shows a decorated function's flight as name(key); --json keeps the raw key."""
    g = FlightGroup(directory=directory, codec=JSON)
    started, release = threading.Event(), threading.Event()

    @g.coalesce(key=lambda day: f"report:{day}", name="reports.rep")
    def rep(day: str) -> str:
        started.set()
        assert release.wait(30), "the test never released the work"
        return day

    try:
        leader = Background(lambda: rep("2026-11-01"))
        assert started.wait(10)
        shown = run_flightgroup("status", "--dir", directory)
        raw = run_flightgroup("status", "--dir", directory, "--json")
        release.set()
        assert leader.wait() == "2026-11-01"
    finally:
        release.set()
        g.close()
    assert shown.returncode == 0, shown.stderr
    [head, line] = shown.stdout.decode().splitlines()
    assert head.split()[0] == "KEY"
    assert line.split()[0] == "reports.rep(report:2026-11-01)", line
    [flight] = json.loads(raw.stdout)["flights"]
    assert flight["key"] == "\x00reports.rep\x00report:2026-11-01"


@pytest.mark.timeout(60)
def test_status_watch_shows_a_flight_come_and_go(place: Path, runs: list[Run]) -> None:
    """status --watch shows a flight come and go."""
    # Started before the directory exists: it finds it once the leader makes it.
    watcher = Run("status", "--watch", "--dir", str(place / "d"))
    runs.append(watcher)
    watcher.out.wait_for(b"no flights in progress")
    leader = start_leader(runs, place, key="build:main")
    line = watcher.out.wait_for(b"build:main")
    assert re.fullmatch(rb"build:main\s+\d+\s+%d\s+0\s+\d+\.\d s\n" % leader.proc.pid, line), line
    (place / "go").touch()
    assert leader.wait() == 0
    watcher.out.wait_for(b"no flights in progress")  # a draw after the flight's line
    assert watcher.proc.poll() is None
    watcher.proc.send_signal(signal.SIGINT)
    assert watcher.wait() == 0
    out = watcher.out.join()
    assert b"\x1b" not in out  # a pipe: no screen codes
    assert out.count(b"flightgroup status (") >= 3
    assert watcher.err is not None
    assert b"Traceback" not in watcher.err.join()


def _read_until(fd: int, needle: bytes, timeout: float = 20.0) -> bytes:
    got = b""
    end = time.monotonic() + timeout
    while needle not in got:
        left = end - time.monotonic()
        assert left > 0, got
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # a pty whose other side closed
                chunk = b""
            assert chunk, got
            got += chunk
    return got


def _watch(directory: str, stdout: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [PY, "-m", "flightgroup", "status", "--watch", "--dir", directory],
        stdout=stdout, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_status_watch_on_a_pipe_writes_no_screen_codes(directory: str) -> None:
    """status --watch on a pipe writes no screen codes."""
    # Clearing the screen is for a terminal; into a pipe or a log file the escape
    # codes are only noise (as the run's progress line, shown on a terminal only).
    proc = _watch(directory, subprocess.PIPE)
    assert proc.stdout is not None
    try:
        text = _read_until(proc.stdout.fileno(), b"no flights in progress")
        text += _read_until(proc.stdout.fileno(), b"no flights in progress")  # a redraw
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert b"\x1b" not in text, text
    assert b"flightgroup status (" in text


def test_status_watch_on_a_terminal_clears_the_screen(directory: str) -> None:
    """status --watch on a terminal clears the screen."""
    main, tty = pty.openpty()
    try:
        proc = _watch(directory, tty)
        os.close(tty)
        try:
            text = _read_until(main, b"no flights in progress")
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=20)
    finally:
        os.close(main)
    assert proc.returncode == 0, err
    assert text.startswith(b"\x1b[H\x1b[2J"), text


@pytest.mark.parametrize("watch", [False, True])
def test_status_into_a_closed_pipe_has_no_traceback(directory: str, watch: bool) -> None:
    """status into a closed pipe ends without a traceback."""
    # `flightgroup status --watch --json | head -1`: the reader leaves.
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run(
        [PY, "-m", "flightgroup", "status", "--json", "--dir", directory,
         *(["--watch"] if watch else [])],
        stdout=write, stderr=subprocess.PIPE, timeout=30, check=False,
    )  # fmt: skip
    os.close(write)
    assert b"Traceback" not in proc.stderr, proc.stderr
    assert b"Exception ignored" not in proc.stderr, proc.stderr
    assert proc.returncode == 141  # 128 + SIGPIPE, as a shell reports a command it killed


def _left_past_deadline(g: FlightGroup, release: threading.Event) -> None:
    """g's call of "k" runs past its deadline: its work stays blocked on ``release``."""

    def hangs() -> None:
        release.wait(30)

    with pytest.raises(FlightTimeoutError) as timed_out:
        g.run_sync("k", hangs)
    assert timed_out.value.attempts == 1
    assert g.stats().left_threads == 1


def test_status_shows_a_process_s_threads_left_past_their_deadlines(directory: str) -> None:
    """status shows each process's threads left past their deadlines, until they return."""
    g = FlightGroup(directory=directory, codec=JSON, deadline=0.05, max_deadline_threads=3)
    release = threading.Event()
    try:
        _left_past_deadline(g, release)
        proc = run_flightgroup("status", "--dir", directory, "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == {
            "flights": [],
            "left_threads": [{"pid": os.getpid(), "left_threads": 1, "max_deadline_threads": 3}],
        }
        proc = run_flightgroup("status", "--dir", directory)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.decode().splitlines()
        assert "threads running works past their deadlines:" in lines
        assert re.match(rf"{os.getpid()}\s+1\s+3$", lines[-1]), lines
        release.set()  # the work returns: its thread is no longer left
        wait_until(lambda: g.stats().left_threads == 0, "the left work returned")
        scope = internals(g).scope
        assert scope is not None
        wait_until(lambda: scope.left_threads() == [], "the count was published")
        proc = run_flightgroup("status", "--dir", directory, "--json")
        assert json.loads(proc.stdout) == {"flights": []}
    finally:
        release.set()
        g.close()


def test_fleet_status_shows_a_process_s_threads_left_past_their_deadlines(
    redis_server: Any, namespace: str
) -> None:
    """status on the fleet shows each process's threads left past their deadlines."""
    g = fleet_group(redis_server.url, namespace, deadline=0.05, max_deadline_threads=3)
    release = threading.Event()
    try:
        _left_past_deadline(g, release)
        scope = internals(g).scope
        assert scope is not None
        wait_until(lambda: scope.left_threads() != [], "the count was published")
        proc = run_flightgroup(
            "status", "--redis", redis_server.url, "--namespace", namespace, "--json"
        )
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["left_threads"] == [
            {
                "pid": os.getpid(),
                "left_threads": 1,
                "max_deadline_threads": 3,
                "host": socket.gethostname(),
            }
        ]
        release.set()
        wait_until(lambda: scope.left_threads() == [], "the key was deleted")
    finally:
        release.set()
        g.close()


def test_a_closed_group_s_left_threads_are_no_longer_shown(directory: str) -> None:
    """A closed group's threads left past their deadlines are no longer shown."""
    g = FlightGroup(directory=directory, codec=JSON, deadline=0.05)
    release = threading.Event()
    try:
        _left_past_deadline(g, release)
        g.close()
        proc = run_flightgroup("status", "--dir", directory, "--json")
        assert json.loads(proc.stdout) == {"flights": []}
    finally:
        release.set()
        g.close()
