"""The ``flightgroup`` logger: what it says at which level, and what it never says."""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any

import pytest

import flightgroup
from flightgroup import JSON, FlightGroup, LeaseLostError

pytestmark = pytest.mark.timeout(30)

SECRET_KEY = "tenant:secret-42"
SECRET_VALUE = "value-secret-99"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def assert_private(records: list[logging.LogRecord]) -> None:
    """No record shows the value; none at INFO or above shows the raw key."""
    for record in records:
        text = record.getMessage()
        assert SECRET_VALUE not in text, text
        if record.levelno >= logging.INFO:
            assert SECRET_KEY not in text, text


def test_retention_evictions_are_said_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    group = FlightGroup(retention=flightgroup.Retention(success=60.0, max_items=2))
    with caplog.at_level(logging.INFO, logger="flightgroup"):
        for i in range(6):
            group.run_sync(f"k{i}", lambda: 1)
    evictions = [r for r in caplog.records if "evicted" in r.getMessage()]
    assert len(evictions) == 1
    assert evictions[0].levelno == logging.INFO
    assert "max_items=2" in evictions[0].getMessage()


def _lead_and_join(a: FlightGroup, b: FlightGroup, caplog: pytest.LogCaptureFixture) -> None:
    """``a`` leads SECRET_KEY, ``b`` joins it (from another group: through the
    scope), with DEBUG captured; both groups are closed after."""
    started, gate = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        gate.wait(10)
        return SECRET_VALUE

    with caplog.at_level(logging.DEBUG, logger="flightgroup"):
        thread = threading.Thread(target=lambda: a.run_sync(SECRET_KEY, work))
        thread.start()
        try:
            assert started.wait(10)
            assert b.run_sync(SECRET_KEY, work, on_join=gate.set).joined
            thread.join(10)
        finally:
            gate.set()
            a.close()
            b.close()
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    for word in ("lead", "join", "land"):
        assert any(word in m and digest(SECRET_KEY) in m for m in debug), (word, debug)
    assert_private(caplog.records)


def test_fleet_lead_join_land_at_debug_with_digests_only(
    caplog: pytest.LogCaptureFixture, redis_server: Any, namespace: str
) -> None:
    _lead_and_join(
        FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON),
        FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON),
        caplog,
    )


def test_directory_lead_join_land_at_debug(
    caplog: pytest.LogCaptureFixture, directory: str
) -> None:
    _lead_and_join(
        FlightGroup(directory=directory, codec=JSON),
        FlightGroup(directory=directory, codec=JSON),
        caplog,
    )
    infos = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert any("coordinating" in m for m in infos)  # the election is said at INFO


def test_a_lost_lease_is_said_above_debug(
    caplog: pytest.LogCaptureFixture, redis_server: Any, namespace: str
) -> None:
    group = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=0.3)
    record = f"fg:{{{namespace}:{hashlib.sha256(SECRET_KEY.encode()).hexdigest()}}}"

    def work() -> str:
        redis_server.client().delete(record)
        lease = flightgroup.current_lease()
        lost = threading.Event()
        while not lease.lost and not lost.wait(0.01):
            pass
        return SECRET_VALUE

    with caplog.at_level(logging.INFO, logger="flightgroup"):
        try:
            with pytest.raises(LeaseLostError):
                group.run_sync(SECRET_KEY, work)
        finally:
            group.close()
    lost = [r for r in caplog.records if "lost the lease" in r.getMessage()]
    assert lost and lost[0].levelno >= logging.INFO
    assert digest(SECRET_KEY) in lost[0].getMessage()
    assert_private(caplog.records)
