"""Review findings of the fleet scope (Redis): each test forces one interleaving
(events and patched steps, no sleeps) that the first version got wrong."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis

from flightgroup import (
    JSON,
    FlightGroup,
    FlightInterruptedError,
    Retention,
    Retry,
)
from flightgroup.redis.arbiter import RedisArbiter
from flightgroup.redis.names import Names

from .support import wait_until

pytestmark = pytest.mark.timeout(40)

_RETRY_NOW = Retry(attempts=2, backoff=0.0, jitter=False)


def _fleet(group: FlightGroup) -> RedisArbiter:
    arbiter = group._scope
    assert isinstance(arbiter, RedisArbiter)
    return arbiter


def _hold_script(
    arbiter: RedisArbiter,
    name: str,
    *,
    ran: threading.Event,
    release: threading.Event,
    replies: list[Any] | None = None,
    after: Callable[[Any], bool] = lambda reply: True,
) -> None:
    """Patch ``arbiter`` so that script ``name`` runs in Redis, then its reply is held
    (``ran`` is set) until ``release`` is set: the client has not heard it yet."""
    original = arbiter._script

    async def script(which: str, keys: Any, args: Any) -> Any:
        reply = await original(which, keys, args)
        if which == name:
            if replies is not None:
                replies.append(reply)
            if after(reply):
                ran.set()
                await asyncio.get_running_loop().run_in_executor(None, release.wait, 20)
        return reply

    arbiter._script = script  # type: ignore[method-assign]


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` in a thread; its result or exception lands in the list."""
    box: list[Any] = []

    def body() -> None:
        try:
            box.append(fn())
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, box


# -- 1. the connection pools of redis-py 8 hold 100 connections by default -----------


def test_two_hundred_keys_at_once_all_lead(redis_server: Any, namespace: str) -> None:
    """redis-py 8's asyncio pool makes at most 100 connections and then raises
    MaxConnectionsError at once (no wait, no retry): the 101st concurrent ACQUIRE
    failed with UnavailableError while Redis was fine."""
    group = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON)

    async def main() -> list[Any]:
        async def work(i: int) -> int:
            await asyncio.sleep(0.01)
            return i

        return await asyncio.gather(
            *(group.run(f"k{i}", lambda i=i: work(i)) for i in range(200)),
            return_exceptions=True,
        )

    try:
        results = asyncio.run(main())
    finally:
        group.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == []
    assert [r.value for r in results] == list(range(200))


def test_a_hundred_and_fifty_keys_waited_on_at_once_each_read_their_mailbox(
    redis_server: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each waiting key holds one blocked XREAD connection (ADR 0011): past 100 the
    reads failed with MaxConnectionsError, and each such joiner polled CHECK every
    50 ms for the whole flight instead of being pushed its outcome."""
    n = 150
    lead = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30)
    join = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30)
    started = [0]
    gate = threading.Event()
    read_errors: list[BaseException] = []
    reading = [0]
    original_xread = redis.asyncio.Redis.xread

    async def xread(self: Any, *args: Any, **kwargs: Any) -> Any:
        reading[0] += 1
        try:
            return await original_xread(self, *args, **kwargs)
        except BaseException as exc:
            read_errors.append(exc)
            raise

    monkeypatch.setattr(redis.asyncio.Redis, "xread", xread)

    def work(i: int) -> Callable[[], int]:
        def body() -> int:
            started[0] += 1
            gate.wait(20)
            return i

        return body

    leaders = [_in_thread(lambda i=i: lead.run_sync(f"k{i}", work(i))) for i in range(n)]
    try:
        wait_until(lambda: started[0] == n, "every lead")

        async def joiners() -> list[Any]:
            return await asyncio.gather(
                *(join.run(f"k{i}", _never) for i in range(n)), return_exceptions=True
            )

        thread, box = _in_thread(lambda: asyncio.run(joiners()))
        wait_until(lambda: reading[0] >= n or bool(read_errors), "every joiner's read")
        assert read_errors == []
        gate.set()
        thread.join(20)
        assert [r.value for r in box[0]] == list(range(n))
    finally:
        gate.set()
        for leader, _ in leaders:
            leader.join(10)
        lead.close()
        join.close()


async def _never() -> Any:
    raise AssertionError("a joiner's work never runs")


def _record(server: Any, namespace: str, key: str) -> dict[bytes, bytes]:
    client = redis.Redis.from_url(server.url)
    try:
        found: dict[bytes, bytes] = client.hgetall(Names(namespace, key, False).record)
        return found
    finally:
        client.close()


def _never_sync() -> Any:
    raise AssertionError("a joiner's work never runs")


# -- 2. the leader's loop stops while a retry asks Redis for its new token -----------


def test_a_leaders_loop_stopping_during_a_retry_ends_the_flight_for_everyone(
    redis_server: Any, namespace: str
) -> None:
    """The engine awaited the retry's answer (LEAD or LOST) outside any guard: when the
    leader's task was cancelled there (its loop shut down), the flight never landed:
    its local joiners (other threads) waited forever and the lead stayed renewed in
    Redis, so joiners elsewhere waited as long as the process lived."""
    a = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30,
                    retry=_RETRY_NOW)
    b = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30)
    asked, release = threading.Event(), threading.Event()
    _hold_script(_fleet(a), "attempt", ran=asked, release=release)
    joined_here, joined_there, fail = threading.Event(), threading.Event(), threading.Event()
    started = threading.Event()

    async def work() -> str:
        started.set()
        await asyncio.get_running_loop().run_in_executor(None, fail.wait, 20)
        raise ValueError("first attempt")

    async def leader() -> None:
        caller = asyncio.ensure_future(a.run("k", work))
        await asyncio.get_running_loop().run_in_executor(None, asked.wait, 20)
        assert not caller.done()
        # returns: asyncio.run cancels the leading caller and the flight's own task

    lead_thread, _ = _in_thread(lambda: asyncio.run(leader()))
    try:
        assert started.wait(10)  # it leads in Redis
        here, here_box = _in_thread(lambda: a.run_sync("k", _never_sync, on_join=joined_here.set))
        there, there_box = _in_thread(
            lambda: b.run_sync("k", _never_sync, on_join=joined_there.set)
        )
        assert joined_here.wait(10) and joined_there.wait(10)
        fail.set()
        assert asked.wait(10)
        lead_thread.join(10)
        release.set()  # the ATTEMPT's answer comes after the flight's task ended
        here.join(10)
        there.join(10)
        assert not here.is_alive(), "the local joiner waits forever"
        assert not there.is_alive(), "the joiner elsewhere waits for the lease"
        assert isinstance(here_box[0], FlightInterruptedError)
        assert isinstance(there_box[0], FlightInterruptedError)
    finally:
        fail.set()
        release.set()
        a.close()
        b.close()


# -- 3. close() while a retry's ATTEMPT is in flight --------------------------------


def test_closing_during_a_retrys_attempt_interrupts_the_joiners_elsewhere_at_once(
    redis_server: Any, namespace: str
) -> None:
    """close() abandoned the flight under the token it had; the ATTEMPT that Redis had
    already run moved the flight to a new token, which nobody abandoned or renewed:
    the joiners elsewhere, following `next`, waited a whole lease."""
    a = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30,
                    retry=_RETRY_NOW)
    b = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30)
    ran, release = threading.Event(), threading.Event()
    fleet = _fleet(a)
    _hold_script(fleet, "attempt", ran=ran, release=release)
    abandoned = threading.Event()
    original_abandon = fleet._abandon

    async def abandon(lead: Any, reason: str) -> None:
        await original_abandon(lead, reason)
        abandoned.set()

    fleet._abandon = abandon  # type: ignore[method-assign]
    joined, fail = threading.Event(), threading.Event()
    calls = 0

    def work() -> str:
        nonlocal calls
        calls += 1
        fail.wait(20)
        raise ValueError(f"attempt {calls}")

    leader, _ = _in_thread(lambda: a.run_sync("k", work))
    try:
        wait_until(lambda: calls == 1, "the lead")
        there, there_box = _in_thread(lambda: b.run_sync("k", _never_sync, on_join=joined.set))
        assert joined.wait(10)
        fail.set()
        assert ran.wait(10)  # Redis moved the flight to a new token; the leader waits
        closing, _ = _in_thread(a.close)
        assert abandoned.wait(10)
        release.set()
        closing.join(20)
        there.join(10)
        assert not there.is_alive(), "the joiner elsewhere waits for the lease"
        assert isinstance(there_box[0], FlightInterruptedError)
        assert _record(redis_server, namespace, "k").get(b"s") != b"R"
    finally:
        fail.set()
        release.set()
        a.close()
        b.close()
        leader.join(10)


# -- 4. close() while an ACQUIRE that leads is in flight -----------------------------


def test_closing_during_an_acquire_that_leads_gives_the_lead_back(
    redis_server: Any, namespace: str
) -> None:
    """An ACQUIRE answered "lead" after close() had begun: the abandon it started was
    not waited for, and the loop stopped under it: the record stayed, and the
    joiners elsewhere waited a whole lease."""
    a = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30)
    b = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30)
    fleet = _fleet(a)
    ran, release = threading.Event(), threading.Event()
    _hold_script(fleet, "acquire", ran=ran, release=release)
    original_close = fleet._close

    async def close() -> None:
        release.set()  # the held ACQUIRE is heard once close() has begun
        await original_close()

    fleet._close = close  # type: ignore[method-assign]
    joined = threading.Event()
    caller, _ = _in_thread(lambda: a.run_sync("k", lambda: "never runs"))
    try:
        assert ran.wait(10)
        there, there_box = _in_thread(lambda: b.run_sync("k", _never_sync, on_join=joined.set))
        assert joined.wait(10)
        a.close()
        assert _record(redis_server, namespace, "k").get(b"s") != b"R"
        there.join(10)
        assert not there.is_alive(), "the joiner elsewhere waits for the lease"
        assert isinstance(there_box[0], FlightInterruptedError)
    finally:
        release.set()
        a.close()
        b.close()
        caller.join(10)


# -- 5. fresh=True, a retry during its wait, and a kept outcome ----------------------


def test_a_fresh_caller_never_takes_the_kept_outcome_of_a_flight_that_retried(
    redis_server: Any, namespace: str
) -> None:
    """A fresh caller waits for the running flight's end, then asks again from the
    token after it. It asked from the token it first saw, not from the token the
    flight ended under after a retry: the flight's kept outcome was past it, and the
    fresh caller took it (an outcome of a flight that began before its call)."""
    a = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30)
    b = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30,
                    retry=_RETRY_NOW, retention=Retention(success=30))
    replies: list[Any] = []
    waiting, never = threading.Event(), threading.Event()
    _hold_script(_fleet(a), "acquire", ran=waiting, release=never, replies=replies,
                 after=lambda reply: False)
    gates = [threading.Event(), threading.Event()]
    calls = 0

    def old() -> str:
        nonlocal calls
        calls += 1
        gates[calls - 1].wait(20)
        if calls == 1:
            raise ValueError("first attempt")
        return "old"

    leader, lead_box = _in_thread(lambda: b.run_sync("k", old))
    try:
        wait_until(lambda: calls == 1, "the lead")
        fresh, fresh_box = _in_thread(lambda: a.run_sync("k", lambda: "new", fresh=True))
        wait_until(lambda: bool(replies), "the fresh caller's first answer")
        assert int(replies[0][0]) == 4  # wait for the running flight's end
        gates[0].set()
        wait_until(lambda: calls == 2, "the retry")
        gates[1].set()
        leader.join(10)
        fresh.join(10)
        assert lead_box[0].value == "old"
        assert fresh_box[0].value == "new" and not fresh_box[0].joined
        assert fresh_box[0].token > lead_box[0].token
    finally:
        for gate in gates:
            gate.set()
        a.close()
        b.close()


# -- 6. a renewal that crosses a retry's ATTEMPT ------------------------------------


def test_a_renewal_that_crosses_a_retrys_attempt_does_not_lose_the_lease(
    redis_server: Any, namespace: str
) -> None:
    """A RENEW sent with the token the lead had ran in Redis after a retry's ATTEMPT
    had moved the flight on: it answered 0 for the old token, and its reply, heard
    before the ATTEMPT's, lost the lease of a healthy flight (the leader got
    LeaseLostError, its joiners FlightInterruptedError)."""
    a = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=1.5,
                    retry=_RETRY_NOW)
    fleet = _fleet(a)
    ran, release = threading.Event(), threading.Event()
    _hold_script(fleet, "attempt", ran=ran, release=release)
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

    leader, box = _in_thread(lambda: a.run_sync("k", work))
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
