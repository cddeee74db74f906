"""The tests' own Redis servers: a server answers only for itself.

Two test runs on one host can pick the same free port: one run's ping would then reach
the other's server, and its tests would share (and flush) that server's keys.
"""

from __future__ import annotations

import pytest

from . import redisproc
from .redisproc import RedisServer


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
