"""The fleet scope when Redis answers a script with an error (not "out of reach").

COMPLETE's one deliberate refusal (a value over max_value_bytes) is final; every other
server error (OOM under noeviction, BUSY, READONLY during a failover, LOADING) passes:
the landing is made again within the lease, and a refusal that lasts a whole lease
loses it, with the joiners told at once. A NOSCRIPT (scripts flushed, a restart) still
reloads the script. Errors are injected by patching ``RedisArbiter._script`` with
redis-py's own parse of the server's error line; orders are forced with events.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from redis._parsers.base import BaseParser

from flightgroup import FlightInterruptedError, LeaseLostError

from ..infleet import fleet_group, fleet_of, never
from ..redisproc import RedisServer
from ..support import in_thread, outcome, wait_until

pytestmark = pytest.mark.timeout(60)

_ERRORS = [
    "OOM command not allowed when used memory > 'maxmemory'.",
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.",
    "READONLY You can't write against a read only replica.",
    "LOADING Redis is loading the dataset in memory",
]


def _refusing(fleet: Any, line: str, times: int | None) -> list[int]:
    """Make COMPLETE answer ``line`` (as Redis does) ``times`` times (None: always),
    before it reaches Redis; returns the list that counts the COMPLETEs sent."""
    real = fleet._script
    sent: list[int] = []

    async def script(name: str, keys: Any, args: Any) -> Any:
        if name == "complete":
            sent.append(1)
            if times is None or len(sent) <= times:
                raise BaseParser.parse_error(line)
        return await real(name, keys, args)

    fleet._script = script
    return sent


def _lead_and_join(server_url: str, namespace: str, lease: float, patch: Any) -> tuple[Any, ...]:
    """A leads (its COMPLETE patched by ``patch``), B joins; both results."""
    key = f"k-{uuid.uuid4().hex}"
    a = fleet_group(server_url, namespace, lease=lease)
    b = fleet_group(server_url, namespace, lease=lease)
    joined = threading.Event()
    sent = patch(fleet_of(a))

    def work() -> str:
        assert joined.wait(10)
        return "A's value"

    threads: list[threading.Thread] = []
    try:
        lead, led = in_thread(a.run_sync, key, work)
        threads.append(lead)
        wait_until(lambda: bool(fleet_of(a)._leads), "A to lead")
        join, got = in_thread(b.run_sync, key, never, on_join=joined.set, timeout=20)
        threads.append(join)
        for thread in threads:
            thread.join(30)
    finally:
        joined.set()
        for thread in threads:
            thread.join(30)
        a.close()
        b.close()
    return outcome(led), outcome(got), sent


@pytest.mark.parametrize("line", _ERRORS, ids=["oom", "busy", "readonly", "loading"])
def test_a_landing_refused_for_a_moment_is_made_again(
    redis_server: RedisServer, namespace: str, line: str
) -> None:
    led, got, sent = _lead_and_join(
        redis_server.url, namespace, 3.0, lambda fleet: _refusing(fleet, line, 3)
    )
    assert not isinstance(led, BaseException), f"{line!r}: the leader got {led!r}"
    assert (led.value, led.joined) == ("A's value", False)
    assert not isinstance(got, BaseException), f"{line!r}: the joiner got {got!r}"
    assert (got.value, got.joined) == ("A's value", True)
    assert len(sent) == 4  # three refused, the fourth landed


def test_a_landing_refused_for_a_whole_lease_loses_it_and_tells_the_joiners(
    redis_server: RedisServer, namespace: str
) -> None:
    """RENEW is taken meanwhile (PEXPIRE is no write OOM refuses): the landing must not
    be tried for ever; after a lease the leader loses it and its joiners hear at once."""
    began = time.monotonic()
    led, got, sent = _lead_and_join(
        redis_server.url, namespace, 1.0, lambda fleet: _refusing(fleet, _ERRORS[0], None)
    )
    assert isinstance(led, LeaseLostError), repr(led)
    assert isinstance(got, FlightInterruptedError), repr(got)
    assert "refused" in str(got), str(got)  # told by the ABANDON, not by the lease's end
    assert len(sent) > 1
    assert time.monotonic() - began < 15


def test_completes_own_refusal_over_max_value_bytes_is_final(
    redis_server: RedisServer, namespace: str
) -> None:
    """The guard in COMPLETE (the client checks first; here the arbiter's bound is lowered
    under it): one COMPLETE, the leader's LeaseLostError, its joiners told at once."""

    def lower(fleet: Any) -> list[int]:
        fleet._max_value_bytes = 4
        return _refusing(fleet, "unused", 0)

    led, got, sent = _lead_and_join(redis_server.url, namespace, 10.0, lower)
    assert isinstance(led, LeaseLostError), repr(led)
    assert isinstance(got, FlightInterruptedError), repr(got)
    assert "refused" in str(got), str(got)  # not a lease (10 s) waited out
    assert len(sent) == 1


def test_a_landing_after_the_scripts_were_flushed_reloads_them(
    redis_server: RedisServer, namespace: str
) -> None:
    g = fleet_group(redis_server.url, namespace, lease=3.0)

    def work() -> str:
        redis_server.client().script_flush()  # COMPLETE answers NOSCRIPT once
        return "v"

    try:
        g.run_sync("warm-up", lambda: 0)
        result = g.run_sync(f"k-{uuid.uuid4().hex}", work)
    finally:
        g.close()
    assert (result.value, result.joined) == ("v", False)
