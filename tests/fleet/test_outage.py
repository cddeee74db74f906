"""The fleet scope when Redis is frozen (SIGSTOP), or its startup never ends: new calls and
waiting joiners end with the library's errors within the documented bounds; nothing
hangs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
import redis

from flightgroup import (
    FlightGroup,
    FlightInterruptedError,
    LeaseLostError,
    UnavailableError,
    current_lease,
)
from flightgroup.redis.breaker import Breaker
from flightgroup.redis.names import Names

from ..infleet import fleet_group, fleet_of, never_runs
from ..redisproc import RedisServer
from ..support import in_thread, once_reachable, refused_by_an_outage, until, wait_until


def _blocked_clients(server: RedisServer) -> int:
    return int(server.client().info("clients")["blocked_clients"])


@pytest.mark.timeout(60)
def test_a_frozen_server_ends_new_calls_and_joiners() -> None:
    """A frozen server ends new calls and waiting joiners with the library's errors.

    SIGSTOP the server while a joiner waits in its blocking read: the joiner, a new
    call of a started group and a call of a group made while frozen all end (the
    pytest timeout is the bound: about a lease plus redis-py's four tries of a
    command whose socket timeout follows the lease)."""
    server = RedisServer()
    release = threading.Event()
    started = threading.Event()
    groups: list[FlightGroup] = []
    threads: list[threading.Thread] = []
    try:
        leader = fleet_group(server.url, "n", lease=0.6)
        joiner = fleet_group(server.url, "n", lease=0.6)
        fresh_group = fleet_group(server.url, "n", lease=0.6)
        groups += [leader, joiner, fresh_group]
        leader.run_sync("warm-up-l", lambda: 0)
        joiner.run_sync("warm-up-j", lambda: 0)
        fresh_group.run_sync("warm-up-f", lambda: 0)

        def work() -> str:
            started.set()
            release.wait(30)
            return "late"

        lead, _ = in_thread(leader.run_sync, "k", work)
        threads.append(lead)
        assert started.wait(10)
        joined = threading.Event()
        join, joined_out = in_thread(joiner.run_sync, "k", never_runs, on_join=joined.set)
        threads.append(join)
        assert joined.wait(10)
        wait_until(lambda: _blocked_clients(server) >= 1, "the joiner's XREAD in Redis")
        server.stop()
        try:
            cold = fleet_group(server.url, "n", lease=0.6)  # made while frozen: its startup too
            groups.append(cold)
            new_calls = [in_thread(g.run_sync, "new", never_runs) for g in (fresh_group, cold)]
            threads += [thread for thread, _ in new_calls]
            for thread, _ in new_calls:
                thread.join(40)
            join.join(40)
            for _, out in new_calls:
                assert isinstance(out.get("error"), UnavailableError), out
                assert isinstance(out["error"].__cause__, redis.RedisError)
            error = joined_out.get("error")
            assert isinstance(error, (UnavailableError, FlightInterruptedError)), joined_out
        finally:
            server.cont()
    finally:
        release.set()
        for thread in threads:
            thread.join(10)
        for g in groups:
            g.close()
        server.close()


@pytest.mark.timeout(60)
def test_the_first_call_does_not_wait_for_the_startup_pipeline(
    redis_server: RedisServer, namespace: str
) -> None:
    """A group's first call does not wait for its startup pipeline.

    fleet-protocol.md: a frozen server ends a new call "after 4 command timeouts", so a group's
    first call does not wait for its startup pipeline (SCRIPT LOAD and CONFIG GET, with redis-
    py's own retries) before its own ACQUIRE. Here the startup never ends (held on an event): the
    first call still leads and returns on a live server."""
    group = fleet_group(redis_server.url, namespace)
    fleet = fleet_of(group)
    held, release = threading.Event(), threading.Event()
    startup = fleet._startup

    async def held_startup() -> None:
        held.set()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 20)
        await startup()

    fleet._startup = held_startup  # type: ignore[method-assign]
    try:
        result = group.run_sync("k", lambda: "v", timeout=10)
        assert held.is_set()  # the startup was running all along
    finally:
        release.set()
        group.close()
    assert result.value == "v" and not result.joined


@pytest.mark.timeout(60)
def test_calls_fail_fast_while_redis_is_down_and_go_through_once_it_is_back() -> None:
    """Redis stopped: the call that finds it out of reach raises UnavailableError, and every
    later call, of that key or of any other, raises it at once (its ``__cause__`` the
    client's error), without waiting for the undo of the first call's ACQUIRE. Redis
    back on the same port: new calls lead through it again."""
    server = RedisServer()
    g = fleet_group(server.url, "down")
    try:
        g.run_sync("warm-up", lambda: 0)
        server.kill()
        with pytest.raises(UnavailableError) as first:
            g.run_sync("a", never_runs)
        assert isinstance(first.value.__cause__, redis.ConnectionError)
        for key in ["a"] * 200 + [f"d{i}" for i in range(200)]:
            with pytest.raises(UnavailableError) as refused:
                g.run_sync(key, never_runs)
            assert refused_by_an_outage(refused.value), refused.value
            assert isinstance(refused.value.__cause__, redis.ConnectionError)
            assert refused.value.key == key
        server.start()
        got = once_reachable(lambda: g.run_sync("a", lambda: "back"))
        assert (got.value, got.joined) == ("back", False)
    finally:
        g.close()
        server.close()


@pytest.mark.timeout(60)
def test_calls_refused_during_an_outage_never_reach_redis() -> None:
    """Redis frozen (SIGSTOP): only the first call's ACQUIRE waits on it; the calls made
    after it are refused in this process, so when Redis resumes and runs what its
    sockets buffered, it finds no flight of theirs (a call that had sent one would have
    left a flight there, undone or not)."""
    server = RedisServer()
    g = fleet_group(server.url, "frozen", lease=0.6)
    try:
        g.run_sync("warm-up", lambda: 0)
        server.stop()
        try:
            with pytest.raises(UnavailableError):
                g.run_sync("first", never_runs)
            keys = [f"later{i}" for i in range(200)]
            for key in keys:
                with pytest.raises(UnavailableError) as refused:
                    g.run_sync(key, never_runs)
                assert refused_by_an_outage(refused.value), refused.value
        finally:
            server.cont()
        got = once_reachable(lambda: g.run_sync("first", lambda: "led"))
        assert (got.value, got.joined) == ("led", False)  # its ghost flight was undone
        client = server.client()
        for key in keys:
            record = Names("frozen", key, False).record
            assert client.exists(record) == 0 and not client.keys(f"{record}:*"), key
    finally:
        g.close()
        server.close()


@pytest.mark.timeout(60)
def test_local_calls_coalesce_here_while_redis_is_down_then_go_through_it_again() -> None:
    """on_unavailable="local": with Redis stopped, a call runs its work in this process
    (counted as a local flight); once Redis is back, a call of the key joins the flight
    another process leads there."""
    server = RedisServer()
    g = fleet_group(server.url, "local", on_unavailable="local")
    other = fleet_group(server.url, "local")
    release, started = threading.Event(), threading.Event()
    try:
        g.run_sync("warm-up", lambda: 0)
        server.kill()
        assert g.run_sync("k", lambda: "here").value == "here"
        assert g.run_sync("k", lambda: "here again").value == "here again"
        assert g.stats().local_flights == 2
        server.start()

        def shared() -> str:
            started.set()
            release.wait(30)
            return "shared"

        lead, led = in_thread(other.run_sync, "k", shared)
        assert started.wait(20)
        while True:  # local flights until this group's probe heard Redis again
            got = g.run_sync("k", lambda: "here", on_join=release.set)
            if got.joined:
                break
            time.sleep(0.02)
        assert got.value == "shared"
        lead.join(20)
        assert led["result"].value == "shared"
    finally:
        release.set()
        g.close()
        other.close()
        server.close()


@pytest.mark.timeout(60)
def test_under_local_a_work_whose_lease_redis_could_not_renew_serves_this_process() -> None:
    """on_unavailable="local": Redis frozen while the work runs, its lease is lost for
    want of a renewal; the work's value still serves this process's callers (its leader
    and a joiner here), as nothing newer took the key from it."""
    server = RedisServer()
    g = fleet_group(server.url, "lost", lease=0.6, on_unavailable="local")
    started, joined = threading.Event(), threading.Event()

    async def work() -> str:
        started.set()
        await asyncio.wait_for(current_lease().wait_lost(), 20)
        return "mine"

    try:
        g.run_sync("warm-up", lambda: 0)
        lead, led = in_thread(lambda: asyncio.run(g.run("k", work)))
        assert started.wait(10)
        join, got = in_thread(g.run_sync, "k", never_runs, on_join=joined.set)
        assert joined.wait(10)
        server.stop()
        try:
            lead.join(30)
            join.join(30)
        finally:
            server.cont()
        assert led["result"].value == "mine" and not led["result"].joined, led
        assert got["result"].value == "mine" and got["result"].joined, got
    finally:
        g.close()
        server.close()


@pytest.mark.timeout(60)
def test_under_local_a_lease_redis_took_away_still_fails_its_leader(
    redis_server: RedisServer, namespace: str
) -> None:
    """on_unavailable="local" does not cover a lease Redis said is gone (a reply, not
    silence: a forget or a newer flight may have it): the leader raises LeaseLostError."""
    g = fleet_group(redis_server.url, namespace, lease=0.6, on_unavailable="local")
    started = threading.Event()

    async def work() -> str:
        started.set()
        await asyncio.wait_for(current_lease().wait_lost(), 20)
        return "stale"

    try:
        lead, led = in_thread(lambda: asyncio.run(g.run("k", work)))
        assert started.wait(10)
        client = redis_server.client()
        client.delete(Names(namespace, "k", False).record)  # its next renewal: gone
        lead.join(30)
        assert isinstance(led.get("error"), LeaseLostError), led
    finally:
        g.close()


@pytest.mark.timeout(30)
def test_a_probe_that_fails_after_a_call_closed_the_breaker_opens_a_new_outage() -> None:
    """The probe's PING was on its way when a call's answer closed the breaker, and then
    failed (Redis went away again): the breaker opens as for a new outage, as a call that
    found it would open it: what waits for Redis waits for the probe again, and a refused
    call is told how long this outage has lasted, not the one before. (A stand-in for
    the group's client holds the PING: no real server lets a test choose when its
    answer comes relative to another call's.)"""

    async def main() -> None:
        pings: asyncio.Queue[asyncio.Future[bool]] = asyncio.Queue()

        class Client:
            async def ping(self) -> bool:
                answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
                await pings.put(answer)
                return await answer

        arbiter = SimpleNamespace(
            _closing=False, _timeout=5.0, _blocking=Client(), _where=lambda: "redis://stand-in"
        )
        breaker = Breaker(arbiter)  # type: ignore[arg-type]
        breaker.saw(redis.ConnectionError("refused"))  # the first outage
        first = breaker.opened
        try:
            ping = await asyncio.wait_for(pings.get(), 5)  # the probe asks
            breaker.answered()  # a call's answer came first: Redis is back
            assert breaker.refusal() is None and breaker.reachable.is_set()
            ping.set_exception(redis.ConnectionError("reset"))  # and it is gone again
            await until(lambda: breaker.refusal() is not None, "the breaker open again")
            assert not breaker.reachable.is_set()
            assert breaker.opened > first  # (what a refusal tells: out of reach since then)
        finally:
            breaker.stop()

    asyncio.run(main())
