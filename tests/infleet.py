"""Fleet groups in one test process: the arranges the fleet tests share."""

from __future__ import annotations

import hashlib
from typing import Any

from flightgroup import (
    JSON,
    FlightGroup,
)
from flightgroup.redis.arbiter import RedisArbiter


def fleet_group(url: str, namespace: str, **options: Any) -> FlightGroup:
    return FlightGroup(redis=url, namespace=namespace, codec=JSON, **options)


def fleet_of(group: FlightGroup) -> RedisArbiter:
    """The group's fleet arbiter (its private steps are what tests patch)."""
    arbiter = group._fleet
    assert isinstance(arbiter, RedisArbiter)
    return arbiter


def never() -> Any:
    raise AssertionError("a joiner's work never runs")


def record_key(namespace: str, key: str) -> str:
    """The Redis key of ``key``'s flight record in ``namespace``."""
    return f"fg:{{{namespace}:{hashlib.sha256(key.encode()).hexdigest()}}}"
