"""``flightgroup run`` and ``status`` on the fleet scope (``--redis``), as a user runs
them: real processes, a redis-server of the module's own."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .test_run import (
    CMD,
    PY,
    WAIT,
    Run,
    joined_line,
    journal,
    place,
    runs,
)

__all__ = ["place", "runs"]  # fixtures, used by name

pytestmark = pytest.mark.timeout(60)


def fleet_cmd(place: Path, url: str, ns: str, key: str, code: int) -> list[str]:
    return [
        "run", "--key", key, "--redis", url, "--namespace", ns,
        "--", PY, "-c", CMD, str(place / "journal"), str(place / "go"), str(code),
    ]  # fmt: skip


def fleet_status(url: str, ns: str) -> dict[str, Any]:
    proc = subprocess.run(
        [PY, "-m", "flightgroup", "status", "--redis", url, "--namespace", ns, "--json"],
        capture_output=True, timeout=WAIT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    parsed: dict[str, Any] = json.loads(proc.stdout)
    return parsed


def test_three_fleet_runs_share_one_run_and_status_shows_it(
    place: Path, runs: list[Run], redis_server: Any, namespace: str
) -> None:
    assert fleet_status(redis_server.url, namespace) == {"flights": []}
    three = [Run(*fleet_cmd(place, redis_server.url, namespace, "report", 3)) for _ in range(3)]
    runs.extend(three)
    end = time.monotonic() + WAIT
    while sum(b"joined" in run.err.text for run in three if run.err) < 2:
        assert time.monotonic() < end, [run.err.text for run in three if run.err]
        assert all(run.proc.poll() is None for run in three)
        time.sleep(0.01)
    [flight] = fleet_status(redis_server.url, namespace)["flights"]
    assert set(flight) == {"key", "token", "leader_pid", "joiners", "age_s", "host"}
    assert flight["key"] == "report" and flight["host"] == socket.gethostname()
    assert flight["joiners"] == 2
    leaders = [run for run in three if run.proc.pid == flight["leader_pid"]]
    assert len(leaders) == 1
    (place / "go").touch()
    codes = [run.wait() for run in three]
    outs = [run.out.join() for run in three]
    assert codes == [3, 3, 3]
    assert len(journal(place)) == 1
    pid = journal(place)[0].split()[1]
    # The fleet scope gives joiners the output at the end: the same bytes.
    assert outs[0] == outs[1] == outs[2] == f"out {pid}\ndone\n".encode()
    for run in three:
        assert run.err is not None
        assert f"err {pid}\n".encode() in run.err.join()
        assert b"Traceback" not in run.err.text
    assert fleet_status(redis_server.url, namespace) == {"flights": []}


def test_an_unreachable_redis_is_one_line_and_exit_2(place: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    url = f"redis://127.0.0.1:{port}/0"
    proc = subprocess.run(
        [PY, "-m", "flightgroup", *fleet_cmd(place, url, "ns", "k", 0)],
        capture_output=True, timeout=WAIT, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert b"Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (place / "journal").exists()


@pytest.mark.timeout(120)
def test_a_joiner_that_loses_redis_while_it_waits_exits_75(place: Path, runs: list[Run]) -> None:
    # Not bad usage (2): the scope went away under a joiner, as a dead leader would.
    # (It notices within about a lease, 10 s by default, plus the client's retries.)
    from ..redisproc import RedisServer

    server = RedisServer()
    try:
        leader = Run(*fleet_cmd(place, server.url, "ns", "k", 0))
        runs.append(leader)
        leader.out.wait_for(b"out ")  # it leads: CMD runs, held on the go file
        joiner = Run(*fleet_cmd(place, server.url, "ns", "k", 0))
        runs.append(joiner)
        assert joiner.err is not None
        joiner.err.wait_for(b"joined the run of 'k'")
        server.kill()
        assert joiner.wait(90) == 75
        said = joiner.err.join()
        assert b"try again" in said and b"Traceback" not in said
    finally:
        (place / "go").touch()
        server.close()


@pytest.mark.timeout(60)
def test_a_fleet_joiners_line_names_the_leaders_pid_and_host(
    place: Path, runs: list[Run], redis_server: Any, namespace: str
) -> None:
    """A fleet joiner's line names the leader's pid and host."""
    leader = Run(*fleet_cmd(place, redis_server.url, namespace, "report", 0))
    runs.append(leader)
    leader.out.wait_for(b"out ")
    joiner = Run(*fleet_cmd(place, redis_server.url, namespace, "report", 0))
    runs.append(joiner)
    match = joined_line(joiner)
    assert match["key"] == "report"
    assert int(match["pid"]) == leader.proc.pid
    assert match["host"] == socket.gethostname()
    assert float(match["age"]) >= 0
    (place / "go").touch()
    assert leader.wait() == 0
    assert joiner.wait() == 0
    assert joiner.out.join() == leader.out.join()
    assert len(journal(place)) == 1
