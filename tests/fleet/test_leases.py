"""Leases in the fleet scope: the default lease, renewal of every flight a process leads in
one call per tick, a renewal that crosses a retry, leases and keep times near the float
maximum or past Redis's PEXPIRE range, and what a process does with a flight whose lease
it lost (Redis restarted empty, or not heard for a lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import sys
import threading
import time
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from flightgroup import (
    JSON,
    FlightGroup,
    FlightInterruptedError,
    LeaseLostError,
    Retention,
    UnavailableError,
    current_lease,
)
from flightgroup.redis.arbiter import RedisArbiter
from flightgroup.redis.names import Names

from ..infleet import (
    RETRY_NOW,
    fleet_group,
    fleet_of,
    hold_script,
    in_thread_box,
    join_once,
    never,
    record_key,
    result_of,
)
from ..redisproc import RedisServer, keys_without_ttl
from ..support import held_lead, in_thread, outcome, raised, wait_until


def test_a_call_after_its_process_lost_the_lease_leads_instead_of_joining_the_dead_flight(
    redis_server: Any, namespace: str
) -> None:
    """A call after its process lost the lease leads instead of joining the dead flight.

    A flight whose lease was lost (Redis restarted empty, evicted it, or its process was frozen
    past the lease) is no longer its key's flight in its process's table while its work runs on:
    a new call of the key there asks Redis, never joins the stale work."""
    g = fleet_group(redis_server.url, namespace, lease=1.0)
    started, release = threading.Event(), threading.Event()
    leases: list[Any] = []

    def stale() -> str:
        leases.append(current_lease())
        started.set()
        assert release.wait(30)  # a work that runs on past its lease
        return "stale"

    leader, led = in_thread(g.run_sync, "k", stale)
    assert started.wait(10)
    joined = threading.Event()
    joiner, got = in_thread(g.run_sync, "k", never, on_join=joined.set)
    assert joined.wait(10)
    # Redis loses the flight (an eviction, a restart without persistence): the next
    # renewal answers 0 and the lease is lost.
    assert redis_server.client().delete(record_key(namespace, "k")) == 1
    wait_until(lambda: leases[0].lost, "the lease is lost")
    try:
        # Redis has no flight of the key: this call leads one, though the stale work
        # still runs here (joining it would end in TimeoutError after 5 s).
        after = g.run_sync("k", lambda: "new", timeout=5)
    finally:
        release.set()
        leader.join(20)
        joiner.join(20)
    assert (after.value, after.joined) == ("new", False)
    # Who was there before the loss stays with the lost flight.
    assert isinstance(outcome(led), LeaseLostError), led
    assert isinstance(outcome(got), FlightInterruptedError), got
    g.close()


def test_run_sync_on_the_loop_of_a_flight_lost_only_here_still_raises(
    redis_server: Any, namespace: str
) -> None:
    """run_sync on the loop of a flight whose lease was lost only here still raises.

    A lease lost because Redis was not heard for a lease (its RENEWs may have run
    there, their replies late) leaves the flight in the local table: Redis may still
    hold it, so a run_sync on its work's loop thread would join it and block that loop.
    It is refused at once, as for any flight of this table whose work runs there."""
    g = fleet_group(redis_server.url, namespace, lease=5.0)
    scope = fleet_of(g)

    async def main() -> Any:
        task, go = await held_lead(g, "k")
        [lead] = list(scope._leads)
        lost = threading.Event()

        def lose() -> None:  # on the group's loop, as Renewal.run does
            scope._renewal.lose(lead, "no renewal reached Redis for a whole lease")
            lost.set()

        scope._background.loop.call_soon_threadsafe(lose)
        assert await asyncio.to_thread(lost.wait, 10)
        with pytest.warns(RuntimeWarning, match="blocks that loop"):
            refused = raised(g.run_sync, "k", lambda: "new", timeout=10)
        go.set()
        with contextlib.suppress(LeaseLostError):
            await task
        return refused

    refused = asyncio.run(main())
    g.close()
    assert isinstance(refused, RuntimeError), refused


@pytest.mark.timeout(40)
def test_a_renewal_that_crosses_a_retrys_attempt_does_not_lose_the_lease(
    redis_server: Any, namespace: str
) -> None:
    """A renewal that crosses a retry's ATTEMPT does not lose the lease.

    A RENEW sent with the token the lead had runs in Redis after a retry's ATTEMPT moved the
    flight on: it answers 0 for the old token, and its reply, heard before the ATTEMPT's, does
    not lose the lease of a healthy flight."""
    a = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=1.5,
                    retry=RETRY_NOW)
    fleet = fleet_of(a)
    ran, release = threading.Event(), threading.Event()
    hold_script(fleet, "attempt", ran=ran, release=release)
    renew_sent, renewed = threading.Event(), threading.Event()
    held = fleet._script

    async def script(which: str, keys: Any, args: Any) -> Any:
        if which != "renew" or renew_sent.is_set():
            return await held(which, keys, args)
        renew_sent.set()  # sent now; it reaches Redis after the ATTEMPT
        await asyncio.get_running_loop().run_in_executor(None, ran.wait, 20)
        reply = await held(which, keys, args)
        renewed.set()
        return reply

    fleet._script = script  # type: ignore[method-assign]
    fail = threading.Event()
    calls = 0

    def work() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            fail.wait(20)
            raise ValueError("first attempt")
        return "v"

    leader, box = in_thread_box(lambda: a.run_sync("k", work))
    try:
        assert renew_sent.wait(10)
        fail.set()
        assert ran.wait(10)
        assert renewed.wait(10)  # its reply is heard before the ATTEMPT's
        release.set()
        leader.join(10)
        assert box[0].value == "v", box
    finally:
        fail.set()
        release.set()
        a.close()


@pytest.mark.timeout(60)
def test_a_lease_and_a_keep_near_the_float_maximum_are_taken(
    redis_server: RedisServer, namespace: str
) -> None:
    """A lease and a keep near the float maximum are taken, capped at the longest TTL.

    docs/api.md: construction checks its arguments. A finite lease near
    sys.float_info.max, and a keep that large at the landing, are capped at the longest TTL
    the fleet sets, never overflow to infinity in milliseconds."""
    huge = sys.float_info.max
    g = fleet_group(redis_server.url, namespace, lease=huge,
                    retention=Retention(success=huge))
    try:
        assert g.run_sync("k", lambda: "v").joined is False
        again = g.run_sync("k", lambda: "other")
        assert (again.value, again.joined) == ("v", True)  # kept
    finally:
        g.close()


def _evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.mark.timeout(30)
def test_flights_led_at_once_are_renewed_in_one_call_per_tick(
    redis_server: RedisServer, namespace: str
) -> None:
    """The flights one process leads at once are renewed in one RENEW per tick."""
    keys = [f"renew-{i}-{uuid.uuid4().hex}" for i in range(3)]
    records = {Names(namespace, key, False).record for key in keys}
    client = redis_server.client()
    renewals: list[set[str]] = []  # the records each RENEW carried
    server_calls: list[int] = []  # the server's EVALSHA count, at each joint renewal
    enough, release = threading.Event(), threading.Event()
    started = [threading.Event() for _ in keys]
    lost: list[bool] = []
    g = fleet_group(redis_server.url, namespace, lease=0.6)  # a tick every 0.2 s
    threads = []
    try:
        g.run_sync("warm-up", lambda: 0)
        arbiter = fleet_of(g)
        original = arbiter._script

        async def script(name: str, keys_: Any, args: Any) -> Any:
            reply = await original(name, keys_, args)
            if name == "renew":
                carried = set(keys_[0::2])
                renewals.append(carried)
                assert [int(x) for x in reply] == [1] * len(carried)
                if carried == records:
                    # read here, on the loop, before the next tick can run
                    server_calls.append(_evalsha_calls(client))
                    if len(server_calls) == 5:
                        enough.set()
            return reply

        arbiter._script = script  # type: ignore[method-assign]

        def work(i: int) -> str:
            started[i].set()
            assert release.wait(20)
            lost.append(current_lease().lost)
            return f"v{i}"

        for i, key in enumerate(keys):
            thread, _ = in_thread(g.run_sync, key, lambda i=i: work(i))
            threads.append(thread)
        for event in started:
            assert event.wait(10)
        assert enough.wait(20), renewals
        release.set()
        for thread in threads:
            thread.join(10)
    finally:
        release.set()
        g.close()
    assert lost == [False] * len(keys)
    # Once the flights were renewed together they stay together: one RENEW per tick
    # for all of them, never one per flight.
    first = renewals.index(records)
    assert all(carried == records for carried in renewals[first:first + 5]), renewals
    # And the server ran exactly one script per tick meanwhile (nothing else ran).
    assert [b - a for a, b in itertools.pairwise(server_calls)] == [1, 1, 1, 1], server_calls


@pytest.mark.timeout(20)
def test_the_default_lease_is_ten_seconds(redis_server: RedisServer, namespace: str) -> None:
    """The default lease is ten seconds."""
    assert inspect.signature(FlightGroup).parameters["lease"].default == 10.0
    assert inspect.signature(RedisArbiter).parameters["lease"].default == 10.0
    g = fleet_group(redis_server.url, namespace)
    started, release = threading.Event(), threading.Event()
    try:
        assert fleet_of(g)._lease == 10.0

        def work() -> int:
            started.set()
            assert release.wait(10)
            return 1

        thread, out = in_thread(g.run_sync, "k", work)
        assert started.wait(10)
        # The record of a running flight lives a lease: 10 s (minus the time since).
        pttl = redis_server.client().pttl(Names(namespace, "k", False).record)
        assert 9_000 < pttl <= 10_000, pttl
        release.set()
        thread.join(10)
        assert result_of(out).value == 1
    finally:
        release.set()
        g.close()


_PAST_PEXPIRE = 1e17  # seconds: finite, accepted, and past Redis's PEXPIRE range (~9.2e15)


@pytest.mark.timeout(60)
def test_a_lease_past_the_pexpire_range_leaves_no_record_without_a_ttl(
    server: RedisServer, namespace: str
) -> None:
    """A lease past Redis's PEXPIRE range leaves no record without a TTL."""
    client = server.client()
    sane = fleet_group(server.url, namespace, lease=1.0)
    try:
        try:
            huge = fleet_group(server.url, namespace, lease=_PAST_PEXPIRE)
        except ValueError:
            huge = None  # refused at construction: fine
        if huge is not None:
            try:
                huge.run_sync("k", lambda: "huge")
            except UnavailableError:
                pass  # Redis refused the call: fine, if it left nothing behind
            finally:
                huge.close()
        left = keys_without_ttl(client, f"fg:{{{namespace}*")
        # A sane group of the namespace must not wait on a flight that nobody runs
        # (a record left without a TTL would make it join and CHECK until its timeout).
        try:
            later: Any = sane.run_sync("k", lambda: "sane", timeout=2.0)
        except TimeoutError as exc:
            later = exc
    finally:
        sane.close()
    assert left == [], "a running record without a TTL"
    assert not isinstance(later, TimeoutError), "a sane caller waits on it for ever"
    assert later.value == "sane" and not later.joined


@pytest.mark.timeout(60)
def test_a_retention_past_the_pexpire_range_lands_for_the_leader_too(
    server: RedisServer, namespace: str
) -> None:
    """A keep time past Redis's PEXPIRE range lands for the leader too."""
    try:
        leader = fleet_group(server.url, namespace, retention=Retention(success=_PAST_PEXPIRE))
    except ValueError:
        return  # refused at construction: fine
    joiner = fleet_group(server.url, namespace)
    started, joined = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert joined.wait(10)
        return "v"

    thread, led = in_thread(leader.run_sync, "k", work)
    try:
        assert started.wait(10)
        got = joiner.run_sync("k", never, on_join=joined.set)
        thread.join(10)
        left = keys_without_ttl(server.client(), f"fg:{{{namespace}*")
    finally:
        joined.set()
        leader.close()
        joiner.close()
    assert got.value == "v" and got.joined
    assert not isinstance(outcome(led), LeaseLostError), "the joiner got the value it landed"
    assert outcome(led).value == "v"
    assert left == []


@pytest.mark.timeout(30)
def test_a_joiners_wait_for_a_dead_leader_counts_from_its_join_not_from_its_busy_loop(
    redis_server: RedisServer, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's joiner reads on its own loop (ADR 0056; a loop that joined before, ADR
    0058); a loop busy past the leader's lease when the join is answered does not add a
    read of a lease more: the joiner asks CHECK at once, hears that its leader stopped,
    and sent no XREAD."""
    a = fleet_group(redis_server.url, namespace, lease=1.0)
    b = fleet_group(redis_server.url, namespace, lease=1.0)
    started, release = threading.Event(), threading.Event()
    sent: list[str] = []

    async def no_renewal(batch: Any) -> None:
        return None

    def work() -> str:
        started.set()
        release.wait(20)
        return "late"

    runner = asyncio.Runner()
    try:
        a.run_sync("warm-up-a", lambda: 0)
        b.run_sync("warm-up-b", lambda: 0)
        runner.run(join_once(a, b))  # (the loop's next join reads on the loop)
        fleet_of(a)._renewal.renew_some = no_renewal  # type: ignore[method-assign]  # it "dies"
        lead, _ = in_thread(a.run_sync, "k", work)
        assert started.wait(10)
        joiner = fleet_of(b)
        script, xread = joiner._script, aioredis.Redis.xread

        async def counted(name: str, keys: Any, args: Any) -> Any:
            sent.append(name)
            return await script(name, keys, args)

        async def counted_xread(self: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append("xread")
            return await xread(self, *args, **kwargs)

        joiner._script = counted  # type: ignore[method-assign]
        monkeypatch.setattr(aioredis.Redis, "xread", counted_xread)

        async def join_on_a_busy_loop() -> Any:
            call = asyncio.ensure_future(b.run("k", never))
            await asyncio.sleep(0)  # the call is asked (its ACQUIRE is out)...
            time.sleep(2.5)  # ...and its loop is busy past the lease while it is answered
            return await call

        with pytest.raises(FlightInterruptedError):
            runner.run(join_on_a_busy_loop())
        assert sent == ["acquire", "check"]
        release.set()
        lead.join(10)
    finally:
        release.set()
        runner.close()
        a.close()
        b.close()
