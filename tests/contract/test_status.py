"""status() of the wide scopes: each flight as its caller named it.
"""

from __future__ import annotations

import threading

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
)

from ..infleet import fleet_group
from ..infresh import held
from ..redisproc import RedisServer
from ..support import in_thread, outcome

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("scope", ["fleet", "directory"])
def test_status_shows_the_raw_key_of_a_plain_key_that_starts_with_a_nul(
    redis_server: RedisServer, namespace: str, directory: str, scope: str
) -> None:
    """status() shows a plain key that starts with a NUL as its caller gave it.

    A plain key that starts with a NUL is sent with one more (ADR 0019); status() of either wide
    scope shows the raw key."""
    if scope == "fleet":
        g = fleet_group(redis_server.url, namespace)
    else:
        g = FlightGroup(directory=directory, codec=JSON)
    started, release = threading.Event(), threading.Event()
    thread, out = in_thread(g.run_sync, "\x00k", held([], "v", started, release))
    try:
        assert started.wait(10)
        assert g._arbiter is not None
        keys = [flight["key"] for flight in g._arbiter.status()]
    finally:
        release.set()
        thread.join(10)
        g.close()
    assert outcome(out).value == "v"
    assert keys == ["\x00k"], keys
