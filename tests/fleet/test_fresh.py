"""Fresh callers in the fleet scope (ADR 0005): a fresh caller never takes an outcome of
a flight that began before its call, though that flight retried; fresh callers of
several processes that came during one flight share the next.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
    Retention,
    current_lease,
)

from ..infleet import RETRY_NOW, fleet_group, fleet_of, hold_script, in_thread_box
from ..redisproc import RedisServer
from ..support import in_thread, outcome, table_of, wait_until

pytestmark = pytest.mark.timeout(60)


def test_fresh_callers_of_two_processes_that_came_during_one_flight_share_the_next(
    redis_server: RedisServer, namespace: str
) -> None:
    """Fresh callers of two processes that came during one flight share the next.

    A leads t (held). A fresh caller F of A comes (it waits locally for t's end); a
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
        wait_until(lambda: bool(table_of(a).flights[key].fresh), "F to wait for t's end")
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


@pytest.mark.timeout(40)
def test_a_fresh_caller_never_takes_the_kept_outcome_of_a_flight_that_retried(
    redis_server: Any, namespace: str
) -> None:
    """A fresh caller never takes the kept outcome of a flight that retried.

    A fresh caller waits for the running flight's end, then asks again from the token after the
    one the flight ended under (after a retry), so the flight's kept outcome, of a flight that
    began before its call, is not served to it."""
    a = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30)
    b = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON, lease=30,
                    retry=RETRY_NOW, retention=Retention(success=30))
    replies: list[Any] = []
    waiting, never = threading.Event(), threading.Event()
    hold_script(fleet_of(a), "acquire", ran=waiting, release=never, replies=replies,
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

    leader, lead_box = in_thread_box(lambda: b.run_sync("k", old))
    try:
        wait_until(lambda: calls == 1, "the lead")
        fresh, fresh_box = in_thread_box(lambda: a.run_sync("k", lambda: "new", fresh=True))
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
