"""The tests' own Redis servers: a server answers only for itself.

Two test runs on one host can pick the same free port: one run's ping would then reach
the other's server, and its tests would share (and flush) that server's keys.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

from .. import redisproc
from ..redisproc import RedisServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(60)
def test_a_port_taken_by_another_server_moves_the_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other = RedisServer()  # the other run's server, on the port this one draws first
    try:
        ports = iter([other.port])
        real = redisproc.free_port
        monkeypatch.setattr(redisproc, "free_port", lambda: next(ports, None) or real())
        ours = RedisServer()
        try:
            assert ours.port != other.port
            assert ours.client().info("server")["process_id"] == ours.pid
            assert other.client().info("server")["process_id"] == other.pid
            ours.restart()  # a restart keeps its port
            assert ours.client().info("server")["process_id"] == ours.pid
        finally:
            ours.close()
    finally:
        other.close()


@pytest.mark.timeout(60)
def test_a_given_port_that_is_taken_fails_instead_of_moving() -> None:
    other = RedisServer()
    try:
        with pytest.raises(RuntimeError, match=f"redis-server on {other.port} did not start"):
            RedisServer(other.port)
        assert other.client().ping()  # untouched
    finally:
        other.close()


@pytest.mark.timeout(60)
def test_the_servers_run_the_binary_the_run_names(tmp_path: Any) -> None:
    """``scripts/dev test`` puts the fleet tests under other builds (a Valkey, an older
    Redis) by naming their binary: each server must be that binary, not the machine's.
    Here the named build is a copy of this run's own, at a path of its own."""
    named = tmp_path / "redis-server-under-test"
    shutil.copy2(redisproc.REDIS_SERVER, named)
    probe = (
        "import os\n"
        "from tests.redisproc import RedisServer\n"
        "s = RedisServer()\n"
        "try:\n"
        "    answered = s.client().info('server')['process_id'] == s.pid\n"
        "    print(os.readlink(f'/proc/{s.pid}/exe'), answered)\n"
        "finally:\n"
        "    s.close()\n"
    )
    env = {**os.environ, "FLIGHTGROUP_TEST_REDIS_SERVER": str(named)}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=40,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(named), "True"]
