"""The fleet scope in one process: a joiner's own timeout and cancel withdraw only itself,
the default outcome bound, bad construction arguments, odd keys and URLs.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from flightgroup import (
    JSON,
    FlightFailedError,
    FlightGroup,
    ValueTooLargeError,
)

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


