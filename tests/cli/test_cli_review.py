"""Findings of a review of the command line, each as a user meets it: a ``--dir`` that
cannot be a directory group, a joiner whose stderr is closed, a fleet key that is not
UTF-8 in ``status``."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from ..infleet import fleet_group
from ..infresh import held
from ..ingroup import Background
from ..support import wait_until
from .test_run import PY, WAIT, Run, journal, place, runs, start_leader, status

__all__ = ["place", "runs"]  # fixtures, used by name

pytestmark = pytest.mark.timeout(60)


def _flightgroup(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [PY, "-m", "flightgroup", *args], capture_output=True, timeout=WAIT, check=False
    )


@pytest.mark.parametrize("where", ["a file", "under a file", "in /proc"])
def test_run_with_a_dir_that_cannot_be_a_directory_group_is_bad_usage(
    place: Path, where: str
) -> None:
    (place / "afile").touch()
    path = {
        "a file": place / "afile",
        "under a file": place / "afile" / "sub",
        "in /proc": Path("/proc/no-such-flightgroup-folder"),
    }[where]
    proc = _flightgroup("run", "--key", "k", "--dir", str(path), "--", "true")
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(b"flightgroup: error: cannot use the directory ")
    assert str(path).encode() in line


def test_status_of_a_path_that_is_no_directory_is_bad_usage(place: Path) -> None:
    (place / "file").write_text("")
    proc = _flightgroup("status", "--dir", str(place / "file"))
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(b"flightgroup: error: ")
    assert b"not a directory" in line


def test_status_of_a_folder_no_group_ever_used_has_no_flights_and_changes_nothing() -> None:
    """A folder without flight.lock (here /proc, where no group can be) holds no group:
    status says so and creates nothing (before, it took part in an election there)."""
    proc = _flightgroup("status", "--dir", "/proc", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"flights": []}


def test_a_joiner_with_its_stderr_closed_passes_on_the_leaders_output_and_code(
    place: Path, runs: list[Run]
) -> None:
    leader = start_leader(runs, place, code=5)
    # fd 2 closed in the joiner (`2>&-`): Python's sys.stderr is None there.
    cmd = ["run", "--key", "k", "--dir", str(place / "d"), "--", PY, "-c", "raise SystemExit(9)"]
    joiner = Run(*cmd, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.close(2))
    runs.append(joiner)
    wait_until(
        lambda: status(place)["flights"][0]["joiners"] == 1, "the joiner joined the leader's run"
    )
    (place / "go").touch()
    assert leader.wait() == 5
    assert joiner.wait() == 5
    pid = journal(place)[0].split()[1]
    assert joiner.out.join() == f"out {pid}\ndone\n".encode()


def test_fleet_status_shows_a_key_that_is_not_utf8_as_it_was_called(
    redis_server: Any, namespace: str
) -> None:
    key = b"a\xffb".decode("utf-8", "surrogateescape")  # as a command line gives it
    g = fleet_group(redis_server.url, namespace)
    started, release = threading.Event(), threading.Event()
    try:
        leader = Background(lambda: g.run_sync(key, held([], "v", started, release)))
        assert started.wait(10)
        [flight] = g._arbiter.status()  # type: ignore[union-attr]
        assert flight["key"] == key
        release.set()
        assert leader.wait().value == "v"
    finally:
        release.set()
        g.close()
