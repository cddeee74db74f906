"""The process scope with threads (run_sync), and threads mixed with asyncio tasks."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import flightgroup.waiting as waiting_module
from flightgroup import (
    FlightFailedError,
    FlightGroup,
    FlightInterruptedError,
    GroupClosedError,
    Result,
    current_lease,
)

from ..support import LoopThread, run, until, wait_until, waiting_on


class SyncGate:
    """A sync work whose run the test controls."""

    def __init__(self, value: Any = "v") -> None:
        self.value = value
        self.runs = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self.error: BaseException | None = None
        self.threads: list[str] = []

    def __call__(self) -> Any:
        self.runs += 1
        self.threads.append(threading.current_thread().name)
        self.started.set()
        assert self.release.wait(10), "the test never released the work"
        if self.error is not None:
            raise self.error
        return self.value


def never() -> Any:
    raise AssertionError("a joiner's work never runs")


def test_thirty_two_threads_share_one_run() -> None:
    g = FlightGroup()
    gate = SyncGate(object())
    barrier = threading.Barrier(32)

    def call() -> Result[Any]:
        barrier.wait()
        return g.run_sync("k", gate)

    with ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(call) for _ in range(32)]
        wait_until(lambda: g.stats().calls == 32, "32 calls")
        gate.release.set()
        results = [f.result(10) for f in futures]
    assert gate.runs == 1
    assert sum(not r.joined for r in results) == 1
    assert all(r.value is gate.value for r in results)
    assert g.stats().joiners_max == 31


def test_the_leader_runs_sync_work_in_its_own_thread() -> None:
    g = FlightGroup()
    gate = SyncGate()
    gate.release.set()
    result = g.run_sync("k", gate)
    assert not result.joined
    assert gate.threads == [threading.current_thread().name]


def test_leader_exception_itself_and_joiners_flight_failed_error() -> None:
    g = FlightGroup()
    gate = SyncGate()
    gate.error = error = ZeroDivisionError("nope")
    with ThreadPoolExecutor(4) as pool:
        leader = pool.submit(g.run_sync, "k", gate)
        assert gate.started.wait(5)
        joiners = [pool.submit(g.run_sync, "k", gate) for _ in range(3)]
        wait_until(lambda: g.stats().joins == 3)
        gate.release.set()
        assert leader.exception(5) is error
        for joiner in joiners:
            failure = joiner.exception(5)
            assert isinstance(failure, FlightFailedError)
            assert failure.error_type == "ZeroDivisionError" and failure.__cause__ is error


def test_joiner_timeout_raises_builtin_timeout_error_and_the_flight_goes_on() -> None:
    g = FlightGroup()
    gate = SyncGate("v")
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(g.run_sync, "k", gate)
        assert gate.started.wait(5)
        with pytest.raises(TimeoutError):
            g.run_sync("k", gate, timeout=0.05)
        assert waiting_on(g, "k") == 0  # the joiner withdrew (the sync leader does not wait)
        gate.release.set()
        assert leader.result(5).value == "v"
    assert gate.runs == 1


def test_leader_with_timeout_stops_waiting_while_its_work_runs_on_for_joiners() -> None:
    g = FlightGroup()
    gate = SyncGate("late")
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(TimeoutError):
            g.run_sync("k", gate, timeout=0.05)
        assert gate.started.is_set() and gate.threads[0].startswith("flightgroup-work-")
        joiner = pool.submit(g.run_sync, "k", gate)
        wait_until(lambda: g.stats().joins == 1)
        gate.release.set()
        result = joiner.result(5)
    assert (result.value, result.joined, gate.runs) == ("late", True, 1)


def test_sync_work_returning_a_coroutine_fails_with_a_type_error_naming_run() -> None:
    g = FlightGroup()

    async def coroutine_function() -> int:
        return 1

    with pytest.raises(TypeError, match=r"await run\(\)"):
        g.run_sync("k", coroutine_function)  # type: ignore[arg-type]
    assert g.stats().in_flight == 0


def test_run_sync_on_the_loop_thread_that_runs_the_flight_is_refused() -> None:
    async def main() -> None:
        g = FlightGroup()
        started, release = asyncio.Event(), asyncio.Event()

        async def work() -> str:
            started.set()
            await release.wait()
            return "v"

        leader = asyncio.create_task(g.run("k", work))
        await started.wait()  # the flight runs on this loop
        with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="block"):
            g.run_sync("k", lambda: "other")
        release.set()
        assert (await leader).value == "v"

    run(main())


def test_run_sync_joining_on_a_running_loop_warns_naming_the_key() -> None:
    """A joiner's run_sync on a loop's thread blocks that loop: RuntimeWarning, key named."""
    g = FlightGroup()
    gate = SyncGate("led elsewhere")
    leader = threading.Thread(target=g.run_sync, args=("report:7", gate), daemon=True)
    leader.start()
    assert gate.started.wait(10)  # another thread leads the key

    async def main() -> Result[Any]:
        # on_join releases the leader's work only once this call joined: the join is
        # forced, and the loop stays blocked until the outcome comes.
        with pytest.warns(RuntimeWarning, match=r"run_sync\('report:7'\).*blocks that loop"):
            return g.run_sync("report:7", never, on_join=gate.release.set)

    result = run(main())
    assert (result.value, result.joined) == ("led elsewhere", True)
    leader.join(10)


def test_run_sync_leading_on_a_running_loop_warns_too() -> None:
    """A leader's sync work runs on the loop's thread and blocks it: it warns as well."""
    g = FlightGroup()

    async def main() -> Result[Any]:
        with pytest.warns(RuntimeWarning, match=r"run_sync\('k'\)"):
            return g.run_sync("k", lambda: "led here")

    result = run(main())
    assert (result.value, result.joined) == ("led here", False)


def test_a_coalesced_sync_function_called_on_a_running_loop_warns_naming_its_key() -> None:
    """A decorated sync function's call on a loop's thread names its namespace and key."""
    g = FlightGroup()

    @g.coalesce(key=lambda n: f"n:{n}", name="reports")
    def report(n: int) -> int:
        return n

    async def main() -> int:
        with pytest.warns(RuntimeWarning, match=r"reports\('n:3'\)"):
            return report(3)

    assert run(main()) == 3


def test_run_sync_with_no_running_loop_does_not_warn() -> None:
    """The plain sync call, on a thread that runs no loop, says nothing."""
    g = FlightGroup()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert g.run_sync("k", lambda: "v").value == "v"


def test_async_and_sync_callers_share_one_flight_from_threads_and_loops() -> None:
    g = FlightGroup()
    gate = SyncGate("mixed")
    other = LoopThread()
    try:
        with ThreadPoolExecutor(8) as pool:
            leader = pool.submit(g.run_sync, "k", gate)
            assert gate.started.wait(5)
            thread_joiners = [pool.submit(g.run_sync, "k", gate) for _ in range(4)]

            async def async_join() -> Result[Any]:
                return await g.run("k", lambda: asyncio.sleep(0, "never"))

            loop_joiners: list[Future[Result[Any]]] = [
                other.submit(async_join()) for _ in range(4)
            ]
            wait_until(lambda: g.stats().joins == 8, "8 joins")
            gate.release.set()
            results = [f.result(5) for f in [leader, *thread_joiners, *loop_joiners]]
    finally:
        other.close()
    assert gate.runs == 1
    assert [r.joined for r in results] == [False] + [True] * 8
    assert {r.value for r in results} == {"mixed"}


def test_async_leader_sync_joiners() -> None:
    async def main() -> None:
        g = FlightGroup()
        release = asyncio.Event()

        async def work() -> str:
            await release.wait()
            return "async"

        leader = asyncio.create_task(g.run("k", work))
        await until(lambda: g.stats().in_flight == 1)
        joiners = [asyncio.create_task(asyncio.to_thread(g.run_sync, "k", lambda: "sync"))
                   for _ in range(4)]
        await until(lambda: g.stats().joins == 4)
        release.set()
        results = [await leader, *await asyncio.gather(*joiners)]
        assert [r.value for r in results] == ["async"] * 5

    run(main())


def test_keyboard_interrupt_in_sync_work_interrupts_joiners_and_reaches_the_leader() -> None:
    g = FlightGroup()
    gate = SyncGate()
    gate.error = interrupt = KeyboardInterrupt()
    with ThreadPoolExecutor(3) as pool:
        wait_leader: Future[Any] = Future()

        def leader() -> None:
            try:
                g.run_sync("k", gate)
            except BaseException as exc:  # the test inspects it
                wait_leader.set_result(exc)

        pool.submit(leader)
        assert gate.started.wait(5)
        joiners = [pool.submit(g.run_sync, "k", gate) for _ in range(2)]
        wait_until(lambda: g.stats().joins == 2)
        gate.release.set()
        assert wait_leader.result(5) is interrupt
        assert all(isinstance(j.exception(5), FlightInterruptedError) for j in joiners)


def test_current_lease_in_sync_work() -> None:
    g = FlightGroup()
    seen: list[tuple[str, int]] = []

    def work() -> None:
        seen.append((current_lease().key, current_lease().token))

    result = g.run_sync("k", work)
    assert seen == [("k", result.token)]
    with pytest.raises(LookupError):
        current_lease()


def test_sync_work_calling_its_own_key_is_refused() -> None:
    g = FlightGroup()

    def work() -> Any:
        return g.run_sync("k", work).value

    with pytest.raises(RuntimeError, match="wait for itself"):
        g.run_sync("k", work)


def test_close_wakes_waiting_threads_with_group_closed_error() -> None:
    g = FlightGroup()
    gate = SyncGate()
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(g.run_sync, "k", gate, timeout=30)
        assert gate.started.wait(5)
        joiner = pool.submit(g.run_sync, "k", gate)
        wait_until(lambda: g.stats().joins == 1)
        g.close()
        assert isinstance(leader.exception(5), GroupClosedError)
        assert isinstance(joiner.exception(5), GroupClosedError)
        gate.release.set()
    with pytest.raises(GroupClosedError):
        g.run_sync("k", gate)


def test_fresh_threads_share_the_next_flight() -> None:
    g = FlightGroup()
    first, second = SyncGate("before"), SyncGate("after")
    with ThreadPoolExecutor(4) as pool:
        leader = pool.submit(g.run_sync, "k", first)
        assert first.started.wait(5)
        fresh = [pool.submit(g.run_sync, "k", second, fresh=True) for _ in range(3)]
        wait_until(lambda: g.stats().calls == 4)
        first.release.set()
        assert leader.result(5).value == "before"
        assert second.started.wait(5)
        second.release.set()
        results = [f.result(5) for f in fresh]
    assert second.runs == 1
    assert [r.value for r in results] == ["after"] * 3
    assert sum(not r.joined for r in results) == 1


# A real SIGINT to the leader's (main) thread while its flight can go on without it:
# a deadline's attempt runs on a thread of its own, a retry pauses between attempts.
_INTERRUPTED_LEADER = r"""
import json, signal, sys, threading
from flightgroup import FlightGroup, Retry, current_lease
from flightgroup.engine.flight import RETRY_PENDING

mode = sys.argv[1]
sys.path.insert(0, sys.argv[2])  # the checkout: its tests package
from tests.support import flight_of
if mode == "deadline":
    g = FlightGroup(deadline=30.0)
else:
    g = FlightGroup(retry=Retry(attempts=2, backoff=2.0, max_backoff=2.0, jitter=False))
runs, leases, lock = [], [], threading.Lock()
running = [0, 0]  # now, most at once
started, release = threading.Event(), threading.Event()

def work():
    with lock:
        runs.append(len(runs) + 1)
        running[0] += 1
        running[1] = max(running)
        n = len(runs)
    leases.append(current_lease())
    try:
        if mode == "retry" and n == 1:
            raise ValueError("the first attempt fails")  # then the pause
        started.set()
        release.wait(30)
        return "value"
    finally:
        with lock:
            running[0] -= 1

got = {}
def call(name):
    try:
        got[name] = g.run_sync("k", work, timeout=30).joined
    except BaseException as exc:
        got[name] = repr(exc)

def interrupter():
    while not leases:  # the main thread leads: its (first) attempt began
        threading.Event().wait(0.005)
    joiner = threading.Thread(target=call, args=("joiner",))
    joiner.start()
    while g.stats().joins < 1:
        threading.Event().wait(0.005)
    # deadline: the main thread waits as the flight's leader (its driver thread
    # started; a leader that never waits so is interrupted after 2 s, and fails here).
    # retry: the main thread is in the pause after the first attempt failed.
    for _ in range(400):
        flight = flight_of(g, "k")
        if flight is not None and (
            flight.leader_waiter is not None if mode == "deadline"
            else flight.state is RETRY_PENDING
        ):
            break
        threading.Event().wait(0.005)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    interrupted.wait(30)
    later = threading.Thread(target=call, args=("later",))  # after the interrupt
    later.start()
    while g.stats().joins < 2 and "later" not in got:
        threading.Event().wait(0.005)
    if mode == "retry":
        started.wait(30)
    first_lost = leases[0].lost
    release.set()
    joiner.join(30)
    later.join(30)
    print(json.dumps({"leader": leader, "got": got, "runs": runs, "most": running[1],
                      "first_lost": first_lost}), flush=True)

interrupted = threading.Event()
leader = None
driver = threading.Thread(target=interrupter)
driver.start()
try:
    g.run_sync("k", work)
    leader = "returned"
except KeyboardInterrupt:
    leader = "KeyboardInterrupt"
interrupted.set()
# The main thread stays: from 3.12 on, no thread may start once it has ended.
driver.join(60)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["deadline", "retry"])
def test_a_keyboard_interrupt_withdraws_a_leader_whose_flight_goes_on(mode: str) -> None:
    """DESIGN.md: "A caller that cancels (task cancelled, timeout, signal) withdraws only
    itself; the work goes on for the others." A sync leader interrupted while it waits
    on the attempt's own thread (a deadline) or in a retry's pause raises
    KeyboardInterrupt alone: the work keeps its lease and runs once at a time, its joiner
    and a call made after the interrupt both join the flight, and the retry runs."""
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_LEADER, mode, str(Path(__file__).parents[2])],
        capture_output=True, text=True, timeout=50, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["leader"] == "KeyboardInterrupt", seen
    # The joiner and a call after the interrupt both joined the flight, which went on.
    assert seen["got"] == {"joiner": True, "later": True}, seen
    assert seen["most"] == 1 and seen["first_lost"] is False, seen
    assert seen["runs"] == ([1] if mode == "deadline" else [1, 2]), seen


def test_run_sync_with_a_timeout_over_timeout_max_waits_like_no_limit() -> None:
    """run_sync with a timeout over threading.TIMEOUT_MAX waits like no limit."""
    g = FlightGroup()
    started, release = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert release.wait(5)
        return "v"

    assert threading.TIMEOUT_MAX < 1e10
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(g.run_sync, "k", work)
        assert started.wait(5)
        joiner = pool.submit(g.run_sync, "k", work, timeout=1e10)
        wait_until(lambda: g.stats().joins == 1, "the joiner joined")
        release.set()
        assert leader.result(5).value == "v"
        result = joiner.result(5)  # OverflowError: timestamp out of range for platform time_t
        assert (result.value, result.joined) == ("v", True)


def test_joiner_threads_share_one_result_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """Joiner threads of one flight share one Result object."""
    g = FlightGroup()
    started, release = threading.Event(), threading.Event()
    first_making, second_made = threading.Event(), threading.Event()
    real_result = waiting_module.Result
    made: list[int] = []

    def paused_result(value: Any, joined: bool, token: int) -> Any:
        result = real_result(value, joined, token)
        if joined:
            made.append(1)
            if len(made) == 1:  # the first joiner pauses after its check saw None
                first_making.set()
                second_made.wait(2)
            else:
                second_made.set()
        return result

    monkeypatch.setattr(waiting_module, "Result", paused_result)

    def work() -> str:
        started.set()
        assert release.wait(5)
        return "v"

    with ThreadPoolExecutor(3) as pool:
        leader = pool.submit(g.run_sync, "k", work)
        assert started.wait(5)
        joiners = [pool.submit(g.run_sync, "k", work) for _ in range(2)]
        wait_until(lambda: g.stats().joins == 2, "both threads joined")
        release.set()
        results = [j.result(5) for j in joiners]
        assert leader.result(5).value == "v"
    assert all(r.joined and r.value == "v" for r in results)
    assert results[0] is results[1]
