"""A leading caller's own timeout or cancel in the fleet scope withdraws only that caller,
at every step (ACQUIRE, ATTEMPT, COMPLETE), in one process or across two: the work runs
once, and every joiner gets that flight's value.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import uuid
from typing import Any

import pytest

from flightgroup import (
    current_lease,
)

from ..dirproc import assert_value, harness
from ..infleet import (
    RETRY_NOW,
    fleet_group,
    fleet_of,
    hold_next_reply,
    never,
    never_runs,
    result_of,
)
from ..redisproc import RedisServer
from ..support import LoopThread, in_thread, outcome, wait_until

pytestmark = pytest.mark.timeout(30)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["sync-timeout", "async-timeout", "cancel"])
def test_a_leaders_timeout_or_cancel_withdraws_only_that_caller(
    redis_server: RedisServer, namespace: str, loop_thread: LoopThread, how: str
) -> None:
    """A leading caller's own timeout or cancel withdraws only that caller.

    A leads (its caller gives up), B joined before that (cancel only: its order is forced by
    on_join), C joins after: every joiner gets A's flight (same token), and the work ran once:
    the withdrawal keeps A's Redis participant (no ABANDON). (The async callers run on a loop
    that lives on: the flight's own task is there.)"""
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
            join_b, b_out = in_thread(b.run_sync, key, never_runs, on_join=b_joined.set)
            threads.append(join_b)
            assert b_joined.wait(10), b_out
            loop_thread.call(lambda: tasks[0].cancel())
            assert leading.result(10) == "cancelled"
        assert started.wait(10)  # the work runs on
        assert not release.is_set()
        join_c, c_out = in_thread(c.run_sync, key, never_runs, on_join=c_joined.set)
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
    """A leading caller's timeout in one process leaves the flight to another process.

    Across processes: the leading caller in process A times out while its work is
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


@pytest.mark.timeout(60)
@pytest.mark.parametrize("step", ["acquire", "attempt", "complete"])
def test_a_leading_callers_timeout_at_each_step_withdraws_only_that_caller(
    redis_server: RedisServer, namespace: str, step: str
) -> None:
    """A leading caller's timeout at each step withdraws only that caller.

    The leading caller's own timeout passes while the reply of ``step`` (run in
    Redis) is held: it raises TimeoutError; the flight goes on and the joiner in
    another group gets its value."""
    key = f"timeout-{step}-{uuid.uuid4().hex}"
    a = fleet_group(redis_server.url, namespace, retry=RETRY_NOW if step == "attempt" else None)
    b = fleet_group(redis_server.url, namespace)
    a.run_sync("warm-up", lambda: 0)
    ran, release, joined = threading.Event(), threading.Event(), threading.Event()
    hold_next_reply(fleet_of(a), step, ran, release)
    runs: list[int] = []

    def work() -> str:
        runs.append(current_lease().token)
        assert joined.wait(10)
        if step == "attempt" and len(runs) == 1:
            raise ValueError("first attempt")
        return "v"

    thread, led = in_thread(a.run_sync, key, work, timeout=1.0)
    try:
        if step == "acquire":
            assert ran.wait(10)  # led in Redis: the joiner can join it already
        else:
            wait_until(lambda: bool(runs), "the work")
        join, got = in_thread(b.run_sync, key, never, on_join=joined.set)
        assert joined.wait(10)
        thread.join(10)
        assert ran.is_set()
        assert isinstance(outcome(led), TimeoutError)
        release.set()
        join.join(10)
    finally:
        joined.set()
        release.set()
        a.close()
        b.close()
    result = outcome(got)
    assert result.value == "v" and result.joined and result.token == runs[-1]
    assert len(runs) == (2 if step == "attempt" else 1)
