"""A third review of the fleet scope (Redis): Redis answering with an error, the
3.11 path of a leader's task, fresh callers of two processes, and kept failures.

Each test for a bug is a strict xfail that names what goes wrong; it fails now, for
that reason, and passes once the bug is fixed. Orders are forced with events and
patched private steps (``RedisArbiter._script``), never with a sleep alone. A test
that reconfigures Redis starts a redis-server of its own (tests/redisproc.py).

- ``test_a_landing_refused_by_a_server_out_of_memory_for_a_moment_is_made_again``:
  _land takes every ResponseError of COMPLETE for its one deliberate refusal (an
  outcome over max_value_bytes). A server at maxmemory with noeviction (or BUSY with
  another script, or READONLY in a failover) refuses the XADD: the leader, whose
  lease was never lost, raises LeaseLostError; nothing is abandoned, so its joiners
  elsewhere wait out the lease and get FlightInterruptedError, though Redis took
  writes again at once. ATTEMPT and RENEW treat the same errors as "out of reach"
  and try again within the lease.
- (moved) on the path without eager tasks (Python 3.11), _start_async returned for a
  wide group before it added the ``_unstarted`` callback the process scope has: a loop
  that shut down before the task's first step left the flight RUNNING for ever. Fixed;
  tests/test_review_findings.py's test of it now runs in every scope.
- ``test_fresh_callers_of_two_processes_that_came_during_one_flight_share_the_next``:
  a fresh caller that waited locally for a flight's end leads the next local flight
  with ``fresh_lead``, whose ACQUIRE asks min_token = 2**53 ("no flight that exists
  now"). If a fresh caller of another process, which came during the same flight,
  led the next flight first, this one takes it for an older flight: it waits for
  its end and runs the work once more.
- ``test_a_kept_failure_has_its_cause_in_the_leaders_process``: API.md says a kept
  failure raises FlightFailedError "with ``__cause__`` in the leader's process"; in
  the fleet scope the leader's own group gets the kept failure from Redis, without it.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
from redis.exceptions import ResponseError

from flightgroup import FlightFailedError, Retention, current_lease

from ..infleet import fleet_group, fleet_of, never
from ..redisproc import RedisServer
from ..support import in_thread, outcome, wait_until

pytestmark = pytest.mark.timeout(60)


# -- 1. a landing that Redis refuses for a moment (OOM, BUSY, READONLY) --------------------


def test_a_landing_refused_by_a_server_out_of_memory_for_a_moment_is_made_again(
    namespace: str,
) -> None:
    """A leads, B joins. A's work sets maxmemory to 1 byte (noeviction, the policy the
    library asks for) and returns: COMPLETE's XADD is refused with OOM. As soon as
    that refusal reaches A's arbiter, maxmemory is set back to 0: Redis takes writes
    again, A's lease runs for seconds more. The landing should be made again (as
    ATTEMPT's is) and reach both callers."""
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


# -- 2. a wide leader's task cancelled before its first step (Python 3.11's path) ------------


# -- 3. fresh callers of two processes that came during one flight -------------------------


def test_fresh_callers_of_two_processes_that_came_during_one_flight_share_the_next(
    redis_server: RedisServer, namespace: str
) -> None:
    """A leads t (held). A fresh caller F of A comes (it waits locally for t's end); a
    fresh caller G of B comes (Redis tells it to wait for t's end). t lands. G leads
    the next flight t2 (held) before F's process asks Redis again (A's second ACQUIRE
    is held until t2 runs). F and G came during t: they must share t2. F's ACQUIRE
    asks for a flight newer than every one that exists: it waits for t2's end and
    then leads t3."""
    key = f"fresh-{uuid.uuid4().hex}"
    a = fleet_group(redis_server.url, namespace, lease=3.0)
    b = fleet_group(redis_server.url, namespace, lease=3.0)
    fa, fb = fleet_of(a), fleet_of(b)
    release_t, release_g = threading.Event(), threading.Event()
    g_waits, g_runs = threading.Event(), threading.Event()
    runs: list[tuple[str, int]] = []
    real_a, real_b = fa._script, fb._script
    acquires: list[Any] = []

    async def script_a(name: str, keys: Any, args: Any) -> Any:
        if name == "acquire" and args[6] == key.encode():
            acquires.append(args[3])
            if len(acquires) > 1:  # F's ACQUIRE: only once G led the next flight
                await asyncio.to_thread(g_runs.wait, 10)
        return await real_a(name, keys, args)

    async def script_b(name: str, keys: Any, args: Any) -> Any:
        reply = await real_b(name, keys, args)
        if name == "acquire" and int(reply[0]) == 4:
            g_waits.set()  # G waits for t's end
        return reply

    def work_t() -> str:
        runs.append(("t", current_lease().token))
        assert release_t.wait(15)
        return "t"

    def work_f() -> str:
        runs.append(("F", current_lease().token))
        return "F"

    def work_g() -> str:
        runs.append(("G", current_lease().token))
        g_runs.set()
        assert release_g.wait(15)
        return "G"

    fa._script = script_a  # type: ignore[method-assign]
    fb._script = script_b  # type: ignore[method-assign]
    threads: list[threading.Thread] = []
    try:
        lead, led = in_thread(a.run_sync, key, work_t)
        threads.append(lead)
        wait_until(lambda: bool(runs), "t to run in A")
        f, f_out = in_thread(a.run_sync, key, work_f, fresh=True, timeout=20)
        threads.append(f)
        wait_until(lambda: bool(a._table.flights[key].fresh), "F to wait for t's end")
        g, g_out = in_thread(b.run_sync, key, work_g, fresh=True, timeout=20)
        threads.append(g)
        assert g_waits.wait(10)
        release_t.set()
        assert g_runs.wait(10)  # G leads t2; F's ACQUIRE goes out now
        # F's ACQUIRE is answered: it reads t2's mailbox (to join it, or, as now, to
        # wait for its end), or it ended
        wait_until(
            lambda: bool(f_out) or any(call.reading for call in list(fa._calls)),
            "F's ACQUIRE to be answered",
        )
        release_g.set()
        for thread in threads:
            thread.join(20)
    finally:
        release_t.set()
        g_runs.set()
        release_g.set()
        for thread in threads:
            thread.join(20)
        a.close()
        b.close()
    assert outcome(led).value == "t"
    g_result, f_result = outcome(g_out), outcome(f_out)
    assert not isinstance(g_result, BaseException), repr(g_result)
    assert (g_result.value, g_result.joined) == ("G", False)
    assert not isinstance(f_result, BaseException), repr(f_result)
    assert [name for name, _ in runs] == ["t", "G"], (
        f"the work ran {runs}: F, fresh during t, did not share t2 with G "
        f"(its ACQUIREs asked min_token {acquires})"
    )
    assert (f_result.value, f_result.joined, f_result.token) == ("G", True, g_result.token)


# -- 4. a kept failure in the leader's own process ---------------------------------------


def test_a_kept_failure_has_its_cause_in_the_leaders_process(
    redis_server: RedisServer, namespace: str
) -> None:
    """API.md, Policies: a kept failure raises FlightFailedError "(with ``__cause__`` in
    the leader's process), as a joiner's would". The process scope keeps it; the fleet
    scope's leader process gets the failure back from Redis as any other process."""
    g = fleet_group(
        redis_server.url, namespace, retention=Retention(success=None, error=30.0)
    )
    original = KeyError("missing")

    def boom() -> None:
        raise original

    try:
        with pytest.raises(KeyError):
            g.run_sync("k", boom)
        with pytest.raises(FlightFailedError) as caught:
            g.run_sync("k", never)
    finally:
        g.close()
    assert caught.value.error_type == "KeyError"
    assert caught.value.__cause__ is original
