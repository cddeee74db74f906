"""What an audit of the fleet scope found, pinned against a real redis-server.

- A FORGET whose reply is lost and that redis-py re-sends acts once: the flight that
  another caller led in the gap is not parked, its kept outcome not deleted (the
  script remembers the forget's nonce, with a TTL, in the key's slot).
- No wake-up is lost when the leader lands before the joiner's blocking read is even
  sent: the mailbox is a level, read from its start.
- All the flights one process leads are renewed in one RENEW per tick (counted on
  the client and in the server's commandstats); the default lease is 10 s.
- A frozen (SIGSTOPped) Redis ends a new call with UnavailableError and a waiting
  joiner with UnavailableError or FlightInterruptedError; nothing hangs (the bound is
  the test's timeout: the command client's socket timeout follows the lease).
- A leading caller's own timeout or cancel withdraws only that caller: the work runs
  once, and joiners in another group of the process and in another process get the
  same flight's value (same token).

Orders are forced with events, pipes, the proxy's hold and states read from Redis;
no test waits on a bare sleep or asserts a duration.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import itertools
import threading
import uuid
from typing import Any

import pytest
import redis

from flightgroup import (
    FlightGroup,
    FlightInterruptedError,
    Retention,
    UnavailableError,
    current_lease,
)
from flightgroup.redis import scripts
from flightgroup.redis.arbiter import RedisArbiter
from flightgroup.redis.names import Names

from .dirproc import assert_value, harness
from .infleet import fleet_group, fleet_of
from .redisproc import HoldingCutProxy, RedisServer, keys_without_ttl
from .support import LoopThread, in_thread, wait_until


def result_of(out: dict[str, Any]) -> Any:
    assert "error" not in out, repr(out.get("error"))
    return out["result"]


def never(*_: Any) -> Any:
    raise AssertionError("this caller must not run the work")


# -- 1. a re-sent FORGET --------------------------------------------------------------


@pytest.mark.timeout(40)
@pytest.mark.parametrize("newer", ["running", "kept"])
def test_a_resent_forget_leaves_the_next_flight_alone(
    redis_server: RedisServer, holding_proxy: HoldingCutProxy, namespace: str, newer: str
) -> None:
    """The first FORGET parks flight t1; its reply is cut; before redis-py's re-send
    reaches Redis another process leads t2 (and, "kept", lands it with retention).
    The re-send must answer as the first send did and leave t2 alone."""
    key = f"forget-{uuid.uuid4().hex}"
    names = Names(namespace, key, False)
    client = redis_server.client()
    gate1, gate2 = threading.Event(), threading.Event()
    started1, started2 = threading.Event(), threading.Event()
    tokens: dict[str, int] = {}

    def first() -> str:
        tokens["first"] = current_lease().token
        started1.set()
        assert gate1.wait(20)
        return "first"

    def second() -> str:
        tokens["second"] = current_lease().token
        started2.set()
        if newer == "running":
            assert gate2.wait(20)
        return "second"

    retention = Retention(success=30.0) if newer == "kept" else None
    forgetter = fleet_group(holding_proxy.url, namespace)
    a = fleet_group(redis_server.url, namespace)
    b = fleet_group(redis_server.url, namespace, retention=retention)
    c = fleet_group(redis_server.url, namespace)
    threads: list[threading.Thread] = []
    try:
        forgetter.run_sync("warm-up", lambda: 0)  # its scripts are loaded, a connection idles
        lead1, out1 = in_thread(a.run_sync, key, first)
        threads.append(lead1)
        assert started1.wait(10)
        holding_proxy.arm(names.record.encode())  # FORGET names the key's record
        forgetting, forgot = in_thread(forgetter.forget, key)
        threads.append(forgetting)
        # Redis ran the FORGET (t1 parked), its reply was cut, and the re-send waits
        # at the proxy.
        assert holding_proxy.held.wait(10), forgot
        assert holding_proxy.cuts == 1
        assert not client.exists(names.record)
        assert client.hget(names.parked(tokens["first"]), "t") == str(tokens["first"]).encode()

        # In the gap, another process leads the next flight.
        lead2, out2 = in_thread(b.run_sync, key, second)
        threads.append(lead2)
        assert started2.wait(10)
        if newer == "kept":
            lead2.join(10)
            assert result_of(out2).value == "second"
            assert client.hget(names.record, "s") == b"D"
        second_token = tokens["second"]
        assert second_token > tokens["first"]

        holding_proxy.release()  # the re-sent FORGET reaches Redis now
        forgetting.join(15)
        assert "error" not in forgot, forgot  # it answered (as the first send did)
        assert client.hget(names.record, "t") == str(second_token).encode()
        assert not client.exists(names.parked(second_token))  # t2 was not parked

        if newer == "running":
            joined = threading.Event()
            join, got = in_thread(c.run_sync, key, never, on_join=joined.set)
            threads.append(join)
            assert joined.wait(10), got
            gate2.set()
            join.join(10)
            lead2.join(10)
            assert result_of(out2).value == "second" and not result_of(out2).joined
        else:
            join, got = in_thread(c.run_sync, key, never)
            join.join(10)
        # Whoever comes next gets flight t2's outcome: it was neither parked nor deleted.
        assert result_of(got).value == "second" and result_of(got).joined
        assert result_of(got).token == second_token

        gate1.set()  # the parked flight lands for its own caller
        lead1.join(10)
        assert result_of(out1).value == "first" and result_of(out1).token == tokens["first"]
        forgotten = list(client.scan_iter(match=f"{names.record}:g:*"))
        assert len(forgotten) == 1  # one nonce: the re-send wrote nothing new
        assert 0 < client.pttl(forgotten[0]) <= 60_000
    finally:
        holding_proxy.release()
        gate1.set()
        gate2.set()
        for thread in threads:
            thread.join(10)
        for g in (forgetter, a, b, c):
            g.close()
    assert keys_without_ttl(client, f"fg:{{{namespace}*") == []


@pytest.mark.timeout(20)
def test_forget_remembers_its_nonce_with_a_ttl_and_answers_once(
    redis_server: RedisServer, namespace: str
) -> None:
    """The script level: a FORGET with a nonce already seen answers its first answer
    and acts on nothing; every key it writes has a TTL."""
    client = redis_server.client()
    run = {name: client.register_script(body) for name, body in scripts.SCRIPTS.items()}
    names = Names(namespace, "k", False)
    seen = names.forgot("n-1")

    def forget(nonce_key: str) -> int:
        return int(run["forget"](keys=[names.record, nonce_key], args=[60_000]))

    def acquire(nonce: str) -> int:
        reply = run["acquire"](keys=[names.record, names.fence],
                               args=[nonce, 10_000, 86_400_000, 0, 1, "h", "k"])
        assert int(reply[0]) == 1
        return int(reply[1])

    assert forget(seen) == 0  # nothing to forget, and that is remembered too
    t1 = acquire("lead-1")
    assert forget(seen) == 0  # a re-send of that forget: t1 stays
    assert client.hget(names.record, "t") == str(t1).encode()
    assert forget(names.forgot("n-2")) == 2  # a new forget parks t1
    t2 = acquire("lead-2")
    assert forget(names.forgot("n-2")) == 2  # its re-send: t2 is not parked
    assert client.hget(names.record, "t") == str(t2).encode()
    assert not client.exists(names.parked(t2))
    landed = run["complete"](keys=[names.record, names.parked(t2), names.mailbox(t2)],
                             args=[t2, "ok", b"v", 30_000, 31_000, 1024])
    assert int(landed[0]) == 1 and client.hget(names.record, "s") == b"D"
    assert forget(names.forgot("n-2")) == 2  # again: the kept outcome stays
    assert client.hget(names.record, "s") == b"D"
    assert forget(names.forgot("n-3")) == 1  # a new forget drops it
    assert not client.exists(names.record)
    for nonce in ("n-1", "n-2", "n-3"):
        assert 0 < client.pttl(names.forgot(nonce)) <= 60_000
    assert keys_without_ttl(client, f"fg:{{{namespace}*") == []


# -- 2. the leader lands before the joiner's read is sent ----------------------------


@pytest.mark.timeout(30)
def test_a_landing_before_the_joiners_first_read_is_not_lost(
    redis_server: RedisServer, namespace: str
) -> None:
    """The joiner's ACQUIRE joined flight t; its XREAD is held (on its own client)
    until the leader's COMPLETE has been answered; then the real XREAD is sent and
    returns the outcome at once (no CHECK, no lost wake-up)."""
    key = f"level-{uuid.uuid4().hex}"
    client = redis_server.client()
    names = Names(namespace, key, False)
    a, b = fleet_group(redis_server.url, namespace), fleet_group(redis_server.url, namespace)
    started, want_read, landed = threading.Event(), threading.Event(), threading.Event()
    reads: list[Any] = []
    joiner_scripts: list[str] = []
    state_at_read: list[tuple[int, int]] = []
    try:
        a.run_sync("warm-up-a", lambda: 0)
        b.run_sync("warm-up-b", lambda: 0)  # b's blocking client exists from now on
        leader, joiner = fleet_of(a), fleet_of(b)
        leader_script, joiner_script = leader._script, joiner._script

        async def leader_scripts(name: str, keys: Any, args: Any) -> Any:
            reply = await leader_script(name, keys, args)
            if name == "complete":
                landed.set()  # Redis took the landing (and answered it)
            return reply

        async def counted(name: str, keys: Any, args: Any) -> Any:
            joiner_scripts.append(name)
            return await joiner_script(name, keys, args)

        blocking = joiner._blocking
        original_xread = blocking.xread

        async def xread(*args: Any, **kwargs: Any) -> Any:
            want_read.set()  # the joiner knows its token and is about to read
            assert await asyncio.to_thread(landed.wait, 10)
            stream = next(iter(args[0]))  # the joined token's mailbox (then its notice)
            state_at_read.append((client.exists(names.record), client.xlen(stream)))
            reply = await original_xread(*args, **kwargs)
            reads.append(reply)
            return reply

        leader._script = leader_scripts  # type: ignore[method-assign]
        joiner._script = counted  # type: ignore[method-assign]
        blocking.xread = xread

        def work() -> str:
            started.set()
            assert want_read.wait(10)  # the joiner joined: land only now
            return "landed first"

        lead, led = in_thread(a.run_sync, key, work)
        assert started.wait(10)
        got = b.run_sync(key, never)
        lead.join(10)
    finally:
        landed.set()
        a.close()
        b.close()
    assert result_of(led).value == got.value == "landed first"
    assert got.joined and got.token == result_of(led).token
    # When the read went out, the flight's record was gone and its mailbox held the
    # outcome: only the level (reading from ID 0) could still deliver it.
    assert state_at_read == [(0, 1)]
    assert len(reads) == 1 and reads[0], reads
    assert joiner_scripts == ["acquire"]  # the read itself got it: no CHECK


@pytest.mark.timeout(20)
def test_the_xread_the_arbiter_sends_reads_a_mailbox_written_before_it(
    redis_server: RedisServer, namespace: str
) -> None:
    """The script level: join, land, and only then the XREAD the arbiter sends (from
    ID 0, COUNT 1, BLOCK): it returns the entry at once."""
    client = redis_server.client()
    run = {name: client.register_script(body) for name, body in scripts.SCRIPTS.items()}
    names = Names(namespace, "k", False)
    lead = run["acquire"](keys=[names.record, names.fence],
                          args=["n1", 10_000, 86_400_000, 0, 1, "h", "k"])
    join = run["acquire"](keys=[names.record, names.fence],
                          args=["n2", 10_000, 86_400_000, 0, 2, "h", "k"])
    assert int(lead[0]) == 1 and int(join[0]) == 2 and join[1] == lead[1]
    token = int(join[1])
    landed = run["complete"](keys=[names.record, names.parked(token), names.mailbox(token)],
                             args=[token, "ok", b"V", 0, 11_000, 1024])
    assert [int(x) for x in landed] == [1, 1]
    assert not client.exists(names.record)
    # The block is long: a reply that waited for it would fail the test's timeout.
    reply = client.xread({names.mailbox(token): b"0"}, count=1, block=15_000)
    assert reply and reply[0][1][0][1] == {b"c": b"ok", b"v": b"V"}


# -- 3. one RENEW per tick for all the flights of a process --------------------------


def _evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.mark.timeout(30)
def test_flights_led_at_once_are_renewed_in_one_call_per_tick(
    redis_server: RedisServer, namespace: str
) -> None:
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


# -- 4. a frozen Redis ----------------------------------------------------------------


def _blocked_clients(server: RedisServer) -> int:
    return int(server.client().info("clients")["blocked_clients"])


@pytest.mark.timeout(60)
def test_a_frozen_server_ends_new_calls_and_joiners() -> None:
    """SIGSTOP the server while a joiner waits in its blocking read: the joiner, a new
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
        join, joined_out = in_thread(joiner.run_sync, "k", never, on_join=joined.set)
        threads.append(join)
        assert joined.wait(10)
        wait_until(lambda: _blocked_clients(server) >= 1, "the joiner's XREAD in Redis")
        server.stop()
        try:
            cold = fleet_group(server.url, "n", lease=0.6)  # made while frozen: its startup too
            groups.append(cold)
            new_calls = [in_thread(g.run_sync, "new", never) for g in (fresh_group, cold)]
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


# -- 5. a leading caller's own timeout or cancel --------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["sync-timeout", "async-timeout", "cancel"])
def test_a_leaders_timeout_or_cancel_withdraws_only_that_caller(
    redis_server: RedisServer, namespace: str, loop_thread: LoopThread, how: str
) -> None:
    """A leads (its caller gives up), B joined before that (cancel only: its order is
    forced by on_join), C joins after: every joiner gets A's flight (same token), and
    the work ran once. Had the withdrawal dropped A's Redis participant (ABANDON),
    B would be interrupted and C would lead a new flight (another token, a second run).
    (The async callers run on a loop that lives on: the flight's own task is there.)"""
    key = f"withdraw-{uuid.uuid4().hex}"
    a, b, c = (fleet_group(redis_server.url, namespace) for _ in range(3))
    runs: list[int] = []
    started, release = threading.Event(), threading.Event()
    b_joined, c_joined = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []

    def work() -> str:
        runs.append(current_lease().token)
        started.set()
        assert release.wait(20)
        return "the one run"

    async def async_work() -> str:
        return await asyncio.to_thread(work)

    b_out: dict[str, Any] = {}
    try:
        if how == "sync-timeout":
            with pytest.raises(TimeoutError):
                a.run_sync(key, work, timeout=0.3)
        elif how == "async-timeout":
            with pytest.raises(TimeoutError):
                loop_thread.submit(a.run(key, async_work, timeout=0.3)).result(10)
        else:
            tasks: list[asyncio.Task[Any]] = []

            async def lead() -> str:
                tasks.append(asyncio.ensure_future(a.run(key, async_work)))
                try:
                    await tasks[0]
                except asyncio.CancelledError:
                    return "cancelled"
                return "not cancelled"

            leading = loop_thread.submit(lead())
            assert started.wait(10)
            join_b, b_out = in_thread(b.run_sync, key, never, on_join=b_joined.set)
            threads.append(join_b)
            assert b_joined.wait(10), b_out
            loop_thread.call(lambda: tasks[0].cancel())
            assert leading.result(10) == "cancelled"
        assert started.wait(10)  # the work runs on
        assert not release.is_set()
        join_c, c_out = in_thread(c.run_sync, key, never, on_join=c_joined.set)
        threads.append(join_c)
        assert c_joined.wait(10), c_out
        release.set()
        for thread in threads:
            thread.join(10)
    finally:
        release.set()
        for g in (a, b, c):
            g.close()
    assert len(runs) == 1
    token = runs[0]
    for out in ([b_out] if how == "cancel" else []) + [c_out]:
        got = result_of(out)
        assert got.value == "the one run" and got.joined and got.token == token


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_leaders_timeout_in_one_process_leaves_the_flight_to_another(
    redis_server: RedisServer, namespace: str, mode: str
) -> None:
    """Across processes: the leading caller in process A times out while its work is
    held; process B then joins and gets that flight's value (its token), and the
    journal shows one run."""
    with harness() as h:
        a = h.spawn("a", redis=redis_server.url, namespace=namespace)
        b = h.spawn("b", redis=redis_server.url, namespace=namespace)
        a.call("l", "k", h.work(block=True, **{"return": "from a"}), mode=mode, timeout=0.3)
        started = a.expect("started", "l")
        done = a.expect("done", "l")
        assert not done["ok"] and done["error_type"] == "TimeoutError", done
        record = f"fg:{{{namespace}:{hashlib.sha256(b'k').hexdigest()}}}"
        client = redis_server.client()
        assert client.hget(record, "t") == str(started["token"]).encode()
        assert client.hget(record, "s") == b"R"  # still A's running flight in Redis
        b.call("j", "k", h.work(**{"return": "not b"}), mode=mode)
        b.expect("joined", "j")
        a.release("l")
        got = b.expect("done", "j")
        assert_value(got, "from a", joined=True)
        assert got["token"] == started["token"]
        assert h.runs_of("k") == [(a.pid, "k", started["token"])]
