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
from redis.exceptions import ResponseError

from flightgroup import (
    FlightFailedError,
    FlightInterruptedError,
    LeaseLostError,
    UnavailableError,
)

from ..infleet import fleet_group, fleet_of, never, record_key
from ..redisproc import HoldingCutProxy, RedisServer
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


def test_a_landing_refused_by_a_server_out_of_memory_for_a_moment_is_made_again(
    namespace: str,
) -> None:
    """A landing refused by a server out of memory for a moment is made again.

    A leads, B joins. A's work sets maxmemory to 1 byte (noeviction, the policy the library asks
    for) and returns: COMPLETE's XADD is refused with OOM. As soon as that refusal reaches A's
    arbiter, maxmemory is set back to 0: Redis takes writes again, A's lease runs for seconds
    more. The landing is made again (as ATTEMPT's is) and reaches both callers."""
    server = RedisServer()
    key = f"oom-{uuid.uuid4().hex}"
    a = fleet_group(server.url, namespace, lease=2.0)
    b = fleet_group(server.url, namespace, lease=2.0)
    fleet = fleet_of(a)
    real_script = fleet._script
    joined, refused = threading.Event(), threading.Event()
    refusals: list[str] = []

    async def script(name: str, keys: Any, args: Any) -> Any:
        try:
            return await real_script(name, keys, args)
        except ResponseError as exc:
            if name == "complete" and not refused.is_set():
                refusals.append(str(exc))
                server.client().config_set("maxmemory", 0)  # writes are taken again
                refused.set()
            raise

    def work() -> str:
        assert joined.wait(10)
        server.client().config_set("maxmemory", 1)
        return "A's value"

    fleet._script = script  # type: ignore[method-assign]
    threads: list[threading.Thread] = []
    try:
        a.run_sync("warm-up", lambda: 0)
        lead, led = in_thread(a.run_sync, key, work)
        threads.append(lead)
        wait_until(lambda: bool(fleet._leads), "A to lead")
        join, got = in_thread(b.run_sync, key, never, on_join=joined.set, timeout=15)
        threads.append(join)
        lead.join(15)
        join.join(15)
    finally:
        joined.set()
        for thread in threads:
            thread.join(15)
        a.close()
        b.close()
        server.close()
    assert refused.is_set() and "maxmemory" in refusals[0], refusals  # the order happened
    result = outcome(led)
    assert not isinstance(result, BaseException), (
        f"the leader got {result!r} for a landing Redis refused once with {refusals[0]!r}; "
        f"its joiner got {outcome(got)!r}"
    )
    assert (result.value, result.joined) == ("A's value", False)
    joiner = outcome(got)
    assert not isinstance(joiner, BaseException), repr(joiner)
    assert (joiner.value, joiner.joined) == ("A's value", True)


def test_a_landing_refused_by_a_full_server_ends_the_flight_in_redis_too(namespace: str) -> None:
    """A landing refused by a full server ends the flight in Redis too.

    At maxmemory under noeviction the landing is refused for a lease. ABANDON deletes the record
    first (a DEL is no write that OOM refuses), and a script that has written may write on, so
    the XADD that tells the joiners is taken too: the joiners hear at once, and later calls never
    join a flight nobody will land."""
    server = RedisServer()
    try:
        a = fleet_group(server.url, namespace, lease=1.0)
        b = fleet_group(server.url, namespace, lease=1.0)
        started, joined = threading.Event(), threading.Event()

        def work() -> str:
            started.set()
            assert joined.wait(10)
            admin = server.client()
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", "1")  # every write is refused from now on
            return "v"

        leader, led = in_thread(a.run_sync, "k", work)
        assert started.wait(10)
        joiner, got = in_thread(b.run_sync, "k", never, on_join=joined.set)
        leader.join(30)
        assert isinstance(outcome(led), LeaseLostError), led
        # The leader gave up its landing: the flight is gone from Redis at once, not a
        # lease after its last renewal (ABANDON deletes before it writes).
        assert server.client().exists(record_key(namespace, "k")) == 0
        # and the joiners are told at once: a script that has written may write again
        # under OOM, so the XADD after the DEL is taken.
        mailboxes = server.client().keys(record_key(namespace, "k") + ":m:*")
        assert [server.client().xrange(m)[0][1][b"c"] for m in mailboxes] == [b"int"]
        joiner.join(30)
        assert isinstance(outcome(got), FlightInterruptedError), got
        server.client().config_set("maxmemory", "0")
        assert a.run_sync("k", lambda: "next").value == "next"
        a.close()
        b.close()
    finally:
        server.close()


class Boom(Exception):
    pass


@pytest.mark.parametrize("ending", ["value", "failure"])
def test_a_landing_redis_took_but_never_confirmed_is_unavailable_not_a_lost_lease(
    redis_server: RedisServer, holding_proxy: HoldingCutProxy, namespace: str, ending: str
) -> None:
    """A landing Redis took but never confirmed raises UnavailableError, not LeaseLostError."""
    a = fleet_group(holding_proxy.url, namespace, lease=1.0)
    b = fleet_group(redis_server.url, namespace, lease=1.0)
    started, joined = threading.Event(), threading.Event()
    marker = "a value whose landing is cut"

    def work() -> str:
        started.set()
        assert joined.wait(10)
        # COMPLETE carries the value: Redis runs it, its reply is cut, and redis-py's
        # re-send waits at the proxy until the leader has given up.
        holding_proxy.arm(marker.encode())
        if ending == "failure":
            raise Boom(marker)
        return marker

    try:
        a.run_sync("warm-up", lambda: 0)
        leader, led = in_thread(a.run_sync, "k", work)
        assert started.wait(10)
        joiner, got = in_thread(b.run_sync, "k", never, on_join=joined.set)
        leader.join(30)
        joiner.join(30)
    finally:
        holding_proxy.release()
        a.close()
        b.close()
    error = outcome(led)
    assert isinstance(error, UnavailableError), error
    assert "did not confirm" in str(error)
    assert error.key == "k"
    if ending == "value":
        assert outcome(got).value == marker  # Redis took the landing
    else:
        # the joiners got the failure; the leader's own error stays its cause
        assert isinstance(outcome(got), FlightFailedError), outcome(got)
        assert isinstance(error.__cause__, Boom), error.__cause__
