"""The fleet scope in one process: a caller's own timeout and cancel withdraw only that
caller (a joiner, or the leading caller at any step, in one process or across two), the
default outcome bound, bad construction arguments, odd keys and URLs.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import uuid
from typing import Any

import pytest

from flightgroup import (
    JSON,
    FlightFailedError,
    FlightGroup,
    ValueTooLargeError,
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


def test_a_joiners_timeout_and_cancel_withdraw_only_itself(
    redis_server: Any, namespace: str
) -> None:
    a = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON)
    b = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON)
    started, gate = threading.Event(), threading.Event()
    runs: list[int] = []

    def work() -> str:
        runs.append(1)
        started.set()
        gate.wait(10)
        return "v"

    results: list[Any] = []
    leader = threading.Thread(target=lambda: results.append(a.run_sync("k", work)))
    leader.start()
    try:
        assert started.wait(10)
        joined = threading.Event()
        with pytest.raises(TimeoutError):
            b.run_sync("k", work, timeout=0.2, on_join=joined.set)
        assert joined.is_set()  # it had joined, then gave up alone

        async def cancelled_joiner() -> None:
            entered = asyncio.Event()
            task = asyncio.ensure_future(b.run("k", _never, on_join=entered.set))
            await entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cancelled_joiner())
        # The flight went on: a later joiner still gets its value.
        late: list[Any] = []
        joiner = threading.Thread(target=lambda: late.append(b.run_sync("k", work)))
        joiner.start()
        # b's local flight (which follows a's) has the cancelled joiner and this one.
        while b.stats().joins < 2:
            threading.Event().wait(0.005)
        gate.set()
        leader.join(10)
        joiner.join(10)
    finally:
        gate.set()
        a.close()
        b.close()
    assert runs == [1]
    assert results[0].value == "v" and not results[0].joined
    assert late[0].value == "v" and late[0].joined and late[0].token == results[0].token


async def _never() -> str:
    raise AssertionError("a joiner's work never runs")


def test_the_default_bound_is_one_mebibyte(redis_server: Any, namespace: str) -> None:
    a = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON)
    b = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON)
    try:
        assert a.run_sync("fits", lambda: "x" * (1024 * 1024 - 2)).value == "x" * (1024 * 1024 - 2)
        started, gate = threading.Event(), threading.Event()

        def big() -> str:
            started.set()
            gate.wait(10)
            return "x" * (1024 * 1024)  # 2 bytes of quotes over the bound

        errors: list[BaseException] = []

        def lead() -> None:
            try:
                a.run_sync("big", big)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=lead)
        thread.start()
        assert started.wait(10)
        with pytest.raises(FlightFailedError) as joined:
            b.run_sync("big", big, on_join=gate.set)
        thread.join(10)
    finally:
        a.close()
        b.close()
    assert joined.value.error_type == "ValueTooLargeError"
    assert isinstance(errors[0], ValueTooLargeError)
    assert errors[0].size == 1024 * 1024 + 2 and errors[0].limit == 1024 * 1024


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"redis": "http://127.0.0.1:6379/0", "namespace": "n", "codec": JSON}, ValueError),
        ({"redis": "redis://127.0.0.1:port/0", "namespace": "n", "codec": JSON}, ValueError),
        ({"redis": "redis://127.0.0.1:6379/0", "namespace": "", "codec": JSON}, ValueError),
        ({"redis": "redis://127.0.0.1:6379/0", "namespace": "n"}, TypeError),
        ({"redis": "redis://127.0.0.1:6379/0", "namespace": "n", "codec": JSON, "lease": 0},
         ValueError),
        ({"redis": "redis://127.0.0.1:6379/0", "namespace": "n", "codec": JSON,
          "cluster": "yes"}, TypeError),
        ({"redis": "redis://127.0.0.1:6379/0", "directory": "/tmp/x", "namespace": "n",
          "codec": JSON}, ValueError),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        FlightGroup(**kwargs)


def test_a_key_with_a_lone_surrogate_is_a_key_like_any_other(
    redis_server: Any, namespace: str
) -> None:
    """A non-UTF-8 byte of argv becomes a lone surrogate (flightgroup run --key): the
    fleet scope names and stores it like the directory scope does."""
    key = "report-\udcff"
    a = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON)
    try:
        first = a.run_sync(key, lambda: 1)
        assert first.value == 1 and not first.joined
        assert a.run_sync(key + "x", lambda: 2).value == 2
    finally:
        a.close()


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_url_of_either_protocol_serves_leader_joiner_and_kept_hit(
    redis_server: Any, namespace: str, protocol: int
) -> None:
    """redis-py takes ``?protocol=3`` from the URL, and RESP3 shapes XREAD's reply as
    a dict: a joiner in another group still reads the leader's value from its mailbox."""
    from flightgroup import Retention

    url = f"{redis_server.url}?protocol={protocol}"
    a, b = (FlightGroup(redis=url, namespace=namespace, codec=JSON,
                        retention=Retention(success=30.0)) for _ in range(2))
    started, joined = threading.Event(), threading.Event()

    def work() -> int:
        started.set()
        assert joined.wait(10)  # b has joined: its read of the mailbox is what is tested
        return 7

    results: list[Any] = []
    leader = threading.Thread(target=lambda: results.append(a.run_sync("k", work)))
    leader.start()
    try:
        assert started.wait(10)
        got = b.run_sync("k", _never_sync, on_join=joined.set)
        leader.join(10)
        assert (got.value, got.joined, got.token) == (7, True, results[0].token)
        led = b.run_sync("k2", lambda: 8)
        assert (led.value, led.joined) == (8, False)
        kept = a.run_sync("k2", _never_sync)  # b's kept outcome, read from Redis by a
        assert (kept.value, kept.joined, kept.token) == (8, True, led.token)
    finally:
        joined.set()
        leader.join(10)
        a.close()
        b.close()


def _never_sync() -> Any:
    raise AssertionError("this work never runs")


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
