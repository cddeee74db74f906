"""Keys on the wide scopes' wire (ADR 0019): a key with a lone surrogate crosses like any
other, and a plain key never shares a flight with a decorated function, whatever NULs it
holds.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
)

from ..infleet import fleet_group
from ..redisproc import RedisServer
from ..support import LONE, in_thread, outcome, wait_until


@pytest.mark.timeout(60)
def test_a_directory_call_with_a_lone_surrogate_key_ends(directory: str) -> None:
    """A directory call whose key holds a lone surrogate ends like any other."""
    # The directory scope allows such keys; its DEBUG log line computed the key's
    # digest eagerly and raised in the background loop, so the call never ended.
    with FlightGroup(directory=directory, codec=JSON) as group:
        result = group.run_sync(LONE, lambda: 7, timeout=10)
    assert result.value == 7 and not result.joined


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scope", ["fleet", "directory"])
@pytest.mark.parametrize("form", ["{op}\x00k", "\x00{op}\x00k"])
def test_a_plain_key_never_shares_a_flight_with_a_decorated_function(
    redis_server: RedisServer, namespace: str, directory: str, scope: str, form: str
) -> None:
    """A plain key never shares a flight with a decorated function, in every scope.

    Both wide scopes send a decorated function's key as "NUL name NUL key" and a plain key
    holding a NUL with one more in front: a plain key of either text, called from another group,
    leads a flight of its own, as it does in one process."""
    if scope == "fleet":
        a = fleet_group(redis_server.url, namespace)
        b = fleet_group(redis_server.url, namespace)
    else:
        a = FlightGroup(directory=directory, codec=JSON)
        b = FlightGroup(directory=directory, codec=JSON)
    op = f"op-{uuid.uuid4().hex[:8]}"
    started, gate, joined, plain_ran = (threading.Event() for _ in range(4))

    @a.coalesce(key=lambda x: x, name=op)
    def decorated(x: str) -> str:
        started.set()
        assert gate.wait(10)
        return "decorated"

    def plain() -> str:
        plain_ran.set()
        return "plain"

    dec_thread, dec = in_thread(decorated, "k")
    try:
        assert started.wait(10)
        thread, out = in_thread(b.run_sync, form.format(op=op), plain, on_join=joined.set)
        wait_until(lambda: joined.is_set() or plain_ran.is_set(), "the plain call's lead or join")
        gate.set()
        thread.join(10)
        dec_thread.join(10)
    finally:
        gate.set()
        a.close()
        b.close()
    assert outcome(dec) == "decorated"
    result = outcome(out)
    assert result.value == "plain", f"the plain call got {result!r}"
    assert not result.joined
