"""Flight policies in the process scope: deadline, retries, retention, limits, per operation.

Interleavings are forced by events and by observing the flight's state; retention's
clock is a fake one the test advances.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from flightgroup import (
    FlightFailedError,
    FlightGroup,
    FlightTimeoutError,
    Limits,
    Retention,
    Retry,
    TooManyFlightsError,
    TooManyWaitersError,
    current_lease,
)
from flightgroup.engine.flight import RETRY_PENDING

from ..support import LoopThread, flight_of, hanging_works, run, until, use_clock, wait_until

FAST = Retry(attempts=3, backoff=0.001, max_backoff=0.001, jitter=False)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fake_clock(g: FlightGroup) -> FakeClock:
    clock = FakeClock()
    use_clock(g, clock)
    return clock


# -- retries ------------------------------------------------------------------


def test_two_failures_then_success_under_retry_3_every_caller_gets_the_value() -> None:
    g = FlightGroup(retry=FAST)

    async def main() -> None:
        tokens: list[int] = []
        release = asyncio.Event()

        async def flaky() -> str:
            tokens.append(current_lease().token)
            if len(tokens) == 1:
                await release.wait()  # joiners attach during the first attempt
            if len(tokens) < 3:
                raise ConnectionError(f"attempt {len(tokens)}")
            return "finally"

        leader = asyncio.create_task(g.run("k", flaky))
        await until(lambda: len(tokens) == 1)
        joiners = [asyncio.create_task(g.run("k", flaky)) for _ in range(3)]
        await until(lambda: g.stats().joins == 3)
        release.set()
        results = [await leader, *await asyncio.gather(*joiners)]
        assert [r.value for r in results] == ["finally"] * 4
        assert [r.joined for r in results] == [False, True, True, True]
        assert len(tokens) == 3 and tokens == sorted(set(tokens))  # a new token per attempt
        assert {r.token for r in results} == {tokens[-1]}  # the attempt that produced it
        stats = g.stats()
        assert (stats.flights, stats.failures, stats.calls) == (3, 0, 4)

    run(main())


def test_a_joiner_arriving_in_the_backoff_pause_joins_the_same_flight() -> None:
    g = FlightGroup(retry=Retry(attempts=2, backoff=0.3, jitter=False))
    runs: list[int] = []

    async def main() -> None:
        async def flaky() -> int:
            runs.append(1)
            if len(runs) == 1:
                raise TimeoutError("first attempt fails")
            return 7

        leader = asyncio.create_task(g.run("k", flaky))
        flight_state = lambda: getattr(flight_of(g, "k"), "state", None)  # noqa: E731
        await until(lambda: flight_state() is RETRY_PENDING)
        joiner = asyncio.create_task(g.run("k", flaky))
        await until(lambda: g.stats().joins == 1)
        assert flight_state() is RETRY_PENDING  # it joined during the pause
        assert (await leader).value == 7
        result = await joiner
        assert (result.value, result.joined) == (7, True)
        assert len(runs) == 2

    run(main())


def test_exhausted_retries_leader_gets_the_last_error_joiners_flight_failed() -> None:
    g = FlightGroup(retry=FAST)
    errors: list[Exception] = []

    async def main() -> None:
        release = asyncio.Event()

        async def always_fails() -> None:
            if not errors:
                await release.wait()
            errors.append(ValueError(f"attempt {len(errors) + 1}"))
            raise errors[-1]

        leader = asyncio.create_task(g.run("k", always_fails))
        await until(lambda: g.stats().in_flight == 1)
        joiner = asyncio.create_task(g.run("k", always_fails))
        await until(lambda: g.stats().joins == 1)
        release.set()
        with pytest.raises(ValueError, match="attempt 3") as info:
            await leader
        assert info.value is errors[-1]
        with pytest.raises(FlightFailedError) as failed:
            await joiner
        assert failed.value.__cause__ is errors[-1]

    run(main())
    assert len(errors) == 3 and g.stats().flights == 3 and g.stats().failures == 1


def test_retry_on_selects_which_exceptions_retry() -> None:
    g = FlightGroup(retry=Retry(attempts=3, backoff=0, on=(ConnectionError,)))
    runs: list[str] = []

    def not_retried() -> None:
        runs.append("x")
        raise KeyError("not a connection error")

    with pytest.raises(KeyError):
        g.run_sync("k", not_retried)
    assert runs == ["x"]

    def retried() -> str:
        runs.append("y")
        if runs.count("y") < 3:
            raise ConnectionResetError("a subclass of ConnectionError")
        return "ok"

    assert g.run_sync("j", retried).value == "ok"
    assert runs.count("y") == 3


def test_sync_retries_run_in_the_leader_thread_with_backoff() -> None:
    g = FlightGroup(retry=FAST)
    threads: set[int] = set()

    def flaky() -> str:
        threads.add(threading.get_ident())
        if len(threads) and g.stats().flights < 3:
            raise OSError("again")
        return "ok"

    assert g.run_sync("k", flaky).value == "ok"
    assert threads == {threading.get_ident()} and g.stats().flights == 3


# -- deadline -----------------------------------------------------------------


def test_async_deadline_cancels_the_work_everyone_gets_flight_timeout_error() -> None:
    g = FlightGroup(deadline=0.05)
    seen: list[Any] = []

    async def main() -> None:
        async def hangs() -> None:
            lease = current_lease()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                seen.append(("cancelled", lease.lost))
                raise

        leader = asyncio.create_task(g.run("k", hangs))
        await until(lambda: g.stats().in_flight == 1)
        joiner = asyncio.create_task(g.run("k", hangs))
        for task in (leader, joiner):
            with pytest.raises(FlightTimeoutError) as info:
                await task
            assert (info.value.key, info.value.deadline) == ("k", 0.05)
        assert seen == [("cancelled", True)]  # the timed-out attempt's lease is lost
        assert (await g.run("k", lambda: asyncio.sleep(0, "next"))).value == "next"

    run(main())


def test_sync_deadline_settles_at_the_deadline_and_the_late_result_is_dropped() -> None:
    g = FlightGroup(deadline=0.05)
    release = threading.Event()
    late_done = threading.Event()
    lost_at_end: list[bool] = []

    def slow() -> str:
        lease = current_lease()
        release.wait(10)
        lost_at_end.append(lease.lost)
        late_done.set()
        return "late"

    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(g.run_sync, "k", slow)
        wait_until(lambda: g.stats().in_flight == 1)
        joiner = pool.submit(g.run_sync, "k", slow)
        for future in (leader, joiner):
            assert isinstance(future.exception(5), FlightTimeoutError)
        # A new flight of the key runs while the old thread is still stuck.
        gate = threading.Event()

        def fresh_work() -> str:
            gate.wait(5)
            return "new"

        new_leader = pool.submit(g.run_sync, "k", fresh_work)
        wait_until(lambda: g.stats().in_flight == 1)
        release.set()  # the old attempt ends now: its result must not settle the new flight
        assert late_done.wait(5)
        assert lost_at_end == [True]
        assert not new_leader.done()
        gate.set()
        assert new_leader.result(5).value == "new"


def test_deadline_retries_only_when_on_timeout() -> None:
    for on_timeout, expected_runs in ((True, 2), (False, 1)):
        g = FlightGroup(deadline=0.03, retry=Retry(attempts=2, backoff=0, on_timeout=on_timeout))
        runs: list[int] = []

        async def hangs(runs: list[int] = runs) -> None:
            runs.append(1)
            await asyncio.Event().wait()

        with pytest.raises(FlightTimeoutError):
            run(g.run("k", hangs))
        assert len(runs) == expected_runs, on_timeout


def test_a_flight_timeout_error_names_the_attempts_its_flight_made() -> None:
    """A FlightTimeoutError names the attempts its flight made (sync and async works)."""
    g = FlightGroup(deadline=0.02, retry=Retry(attempts=3, backoff=0, on_timeout=True))
    release = threading.Event()
    try:
        with pytest.raises(FlightTimeoutError) as sync_raised:
            g.run_sync("s", lambda: release.wait(10))
        assert sync_raised.value.attempts == 3
        assert "(3 attempts)" in str(sync_raised.value)
        assert sync_raised.value.max_deadline_threads is None  # every attempt ran

        async def hangs() -> None:
            await asyncio.Event().wait()

        with pytest.raises(FlightTimeoutError) as async_raised:
            run(g.run("a", hangs))
        assert async_raised.value.attempts == 3
        assert "(3 attempts)" in str(async_raised.value)
    finally:
        release.set()
        g.close()


def test_a_joiner_s_flight_timeout_error_names_the_attempts_too() -> None:
    """A joiner's FlightTimeoutError names the attempts of the flight it joined."""
    g = FlightGroup(deadline=0.05, retry=Retry(attempts=2, backoff=0, on_timeout=True))
    release = threading.Event()
    started = threading.Event()

    def work() -> None:
        started.set()
        release.wait(10)

    try:
        with ThreadPoolExecutor(1) as pool:
            leader = pool.submit(g.run_sync, "k", work)
            assert started.wait(5)
            with pytest.raises(FlightTimeoutError) as joined:
                g.run_sync("k", work)
            assert joined.value.attempts == 2 and "(2 attempts)" in str(joined.value)
            assert isinstance(leader.exception(5), FlightTimeoutError)
    finally:
        release.set()
        g.close()


def test_threads_left_past_a_deadline_are_bounded_per_group() -> None:
    """A group runs at most max_deadline_threads works left past their deadlines: beyond
    them an attempt waits for one to return, at most until its own deadline, and then
    times out without running, its FlightTimeoutError naming the bound."""
    g = FlightGroup(deadline=0.05, max_deadline_threads=2)
    other = FlightGroup(deadline=0.05, max_deadline_threads=2)
    release = threading.Event()
    ran: list[str] = []

    hangs = hanging_works(ran, release)

    try:
        assert g.stats().max_deadline_threads == 2
        for key in ("a", "b"):
            with pytest.raises(FlightTimeoutError):
                g.run_sync(key, hangs(key))
        stats = g.stats()
        assert (stats.left_threads, stats.threads) == (2, 2)
        began = time.monotonic()
        with pytest.raises(FlightTimeoutError) as refused:
            g.run_sync("c", hangs("c"))
        assert time.monotonic() - began < 2.0  # its deadline (0.05 s) and no more
        assert refused.value.max_deadline_threads == 2 and refused.value.attempts == 1
        assert "max_deadline_threads" in str(refused.value)
        assert ran == ["a", "b"], "the attempt over the bound never ran"
        assert (g.stats().left_threads, g.stats().threads) == (2, 2)
        # the bound is each group's own
        with pytest.raises(FlightTimeoutError):
            other.run_sync("c", hangs("c"))
        assert ran == ["a", "b", "c"]
        release.set()
        # a left thread is released when its work returns, and kept for the next attempt
        wait_until(lambda: g.stats().left_threads == 0, "the left works returned")
        assert g.run_sync("c", lambda: "v").value == "v"
        assert g.stats().threads == 2  # no new thread: a kept one ran it
    finally:
        release.set()
        g.close()
        other.close()


def test_concurrent_hung_flights_never_leave_more_threads_than_the_bound() -> None:
    """Concurrent flights whose works all hang leave at most max_deadline_threads threads:
    an attempt running in time counts against the bound, as it may be left."""
    g = FlightGroup(deadline=0.2, max_deadline_threads=2)
    release = threading.Event()
    ran: list[int] = []

    def work() -> None:
        ran.append(1)
        release.wait(20)

    try:
        with ThreadPoolExecutor(5) as pool:
            calls = [pool.submit(g.run_sync, f"k{i}", work) for i in range(5)]
            errors = [call.exception(10) for call in calls]
        assert all(isinstance(error, FlightTimeoutError) for error in errors), errors
        refused = [
            e for e in errors if isinstance(e, FlightTimeoutError) and e.max_deadline_threads
        ]
        assert len(refused) == 3 and len(ran) == 2
        stats = g.stats()
        assert (stats.threads, stats.deadline_threads, stats.left_threads) == (2, 2, 2)
    finally:
        release.set()
        g.close()


def test_an_attempt_over_the_bound_runs_once_a_left_thread_returns() -> None:
    """An attempt over the bound runs once a left work returns, within its deadline."""
    g = FlightGroup(max_deadline_threads=1)
    short = g.coalesce(key=lambda: "short", deadline=0.05)
    long = g.coalesce(key=lambda: "long", deadline=20.0)
    release = threading.Event()
    left_when_run: list[int] = []

    @short
    def hangs() -> None:
        release.wait(20)

    @long
    def waits() -> str:
        left_when_run.append(g.stats().left_threads)
        return "v"

    try:
        with pytest.raises(FlightTimeoutError):
            hangs()
        assert g.stats().left_threads == 1
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(waits)
            wait_until(lambda: g.stats().in_flight == 1, "the call led its flight")
            assert not waiting.done() and left_when_run == []
            release.set()  # the left work returns: its thread takes the waiting attempt
            assert waiting.result(10) == "v"
        assert left_when_run == [0]
    finally:
        release.set()
        g.close()


def test_close_ends_the_group_s_idle_kept_threads() -> None:
    """close() ends the group's idle kept threads; a left one ends when its work returns."""
    g = FlightGroup(deadline=5.0)
    ran_on: list[threading.Thread] = []
    release = threading.Event()

    def work() -> str:
        ran_on.append(threading.current_thread())
        return "v"

    def hangs() -> None:
        ran_on.append(threading.current_thread())
        release.wait(20)

    with pytest.raises(FlightTimeoutError):
        g.coalesce(key=lambda: "h", deadline=0.05)(hangs)()
    assert g.run_sync("k", work).value == "v"
    assert g.run_sync("k", work).value == "v"
    left, idle = ran_on[0], ran_on[1]
    assert ran_on[2] is idle and threading.current_thread() not in ran_on
    assert g.stats().threads == 2 and g.stats().left_threads == 1
    g.close()
    idle.join(5)
    assert not idle.is_alive()
    assert left.is_alive() and g.stats().threads == 1
    release.set()
    left.join(5)
    assert not left.is_alive()
    assert (g.stats().threads, g.stats().left_threads) == (0, 0)


def test_an_idle_kept_thread_does_not_keep_the_process_from_exiting() -> None:
    """An unclosed group's idle kept threads do not keep the process from exiting."""
    code = (
        "import flightgroup, threading\n"
        "g = flightgroup.FlightGroup(deadline=5.0)\n"
        "assert g.run_sync('k', lambda: 'v').value == 'v'\n"
        "assert g.stats().threads == 1\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")},
    )
    assert proc.returncode == 0, proc.stderr


def test_max_deadline_threads_must_be_a_positive_int() -> None:
    """max_deadline_threads must be a positive int."""
    with pytest.raises(TypeError):
        FlightGroup(max_deadline_threads=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        FlightGroup(max_deadline_threads=True)
    with pytest.raises(ValueError):
        FlightGroup(max_deadline_threads=0)
    assert FlightGroup().stats().max_deadline_threads == 64


# -- retention ------------------------------------------------------------------


def test_kept_outcome_is_served_with_joined_true_without_running_or_on_join() -> None:
    g = FlightGroup(retention=Retention(success=10.0))
    clock = fake_clock(g)
    runs: list[int] = []
    joins: list[int] = []

    def work() -> list[int]:
        runs.append(1)
        return [len(runs)]

    first = g.run_sync("k", work)
    second = g.run_sync("k", work, on_join=lambda: joins.append(1))
    assert (first.joined, second.joined) == (False, True)
    assert second.value is first.value and second.token == first.token
    assert runs == [1] and joins == []
    assert g.stats().kept == 1 and g.stats().joins == 1
    clock.now += 10.5  # expired: the next call leads a new flight
    third = g.run_sync("k", work)
    assert (third.value, third.joined) == ([2], False) and third.token > first.token


def test_kept_failure_raises_flight_failed_error_only_with_error_retention() -> None:
    g = FlightGroup(retention=Retention(success=None, error=5.0))
    fake_clock(g)
    boom = RuntimeError("kept failure")
    runs: list[int] = []

    def fails() -> None:
        runs.append(1)
        raise boom

    with pytest.raises(RuntimeError):
        g.run_sync("k", fails)
    with pytest.raises(FlightFailedError) as info:
        g.run_sync("k", fails)
    assert info.value.__cause__ is boom and runs == [1]
    assert g.run_sync("ok", lambda: 1).joined is False
    assert g.run_sync("ok", lambda: 2).value == 2  # success=None: values are not kept


def test_retention_lru_by_items_and_a_hit_counts_as_a_use() -> None:
    g = FlightGroup(retention=Retention(success=60.0, max_items=2))
    fake_clock(g)
    g.run_sync("a", lambda: "a1")
    g.run_sync("b", lambda: "b1")
    assert g.run_sync("a", lambda: "a2").value == "a1"  # a is now the most recent
    g.run_sync("c", lambda: "c1")  # evicts b, the least recently used
    assert g.run_sync("b", lambda: "b2").value == "b2"
    assert g.stats().kept == 2


def test_retention_max_bytes_evicts_by_encoded_size() -> None:
    from flightgroup import JSON

    g = FlightGroup(codec=JSON, retention=Retention(success=60.0, max_bytes=25))
    fake_clock(g)
    g.run_sync("a", lambda: "x" * 10)  # 12 bytes encoded
    g.run_sync("b", lambda: "y" * 10)  # 12 more: 24 <= 25
    assert g.stats().kept == 2
    g.run_sync("c", lambda: "z" * 10)  # 36 > 25: a (the oldest) goes
    assert g.run_sync("a", lambda: "new").value == "new"
    g.run_sync("huge", lambda: "h" * 100)  # larger than max_bytes alone: never kept
    assert g.run_sync("huge", lambda: "again").value == "again"


def test_forget_drops_the_kept_outcome_and_fresh_never_takes_one() -> None:
    g = FlightGroup(retention=Retention(success=60.0))
    fake_clock(g)
    g.run_sync("k", lambda: 1)
    assert g.run_sync("k", lambda: 2).value == 1
    fresh = g.run_sync("k", lambda: 3, fresh=True)
    assert (fresh.value, fresh.joined) == (3, False)
    assert g.run_sync("k", lambda: 4).value == 3  # the fresh flight's outcome is kept
    g.forget("k")
    assert g.run_sync("k", lambda: 5).value == 5


def test_a_forgotten_flight_landing_late_does_not_become_the_kept_outcome() -> None:
    g = FlightGroup(retention=Retention(success=60.0))
    fake_clock(g)
    release = threading.Event()

    def old() -> str:
        release.wait(5)
        return "old"

    with ThreadPoolExecutor(1) as pool:
        leader = pool.submit(g.run_sync, "k", old)
        wait_until(lambda: g.stats().in_flight == 1)
        g.forget("k")
        assert g.run_sync("k", lambda: "new").value == "new"
        release.set()
        assert leader.result(5).value == "old"
    assert g.run_sync("k", lambda: "third").value == "new"


# -- limits -----------------------------------------------------------------------


def test_max_waiters_refuses_a_joiner_at_once_with_key_and_limit() -> None:
    g = FlightGroup(limits=Limits(max_waiters=1))
    release = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(g.run_sync, "k", lambda: release.wait(5) and "v")
        wait_until(lambda: g.stats().in_flight == 1)
        first = pool.submit(g.run_sync, "k", lambda: "never")
        wait_until(lambda: g.stats().joins == 1)
        with pytest.raises(TooManyWaitersError) as info:
            g.run_sync("k", lambda: "never")
        assert (info.value.key, info.value.limit) == ("k", 1)
        release.set()
        assert leader.result(5).value == "v" and first.result(5).value == "v"


def test_max_waiters_counts_fresh_callers_waiting_for_the_flight_s_end() -> None:
    """A fresh caller waits on the running flight as a joiner does (for its end, then
    the next flight): it counts against ``max_waiters``, and is refused past it."""
    g = FlightGroup(limits=Limits(max_waiters=2))
    release = threading.Event()
    runs: list[str] = []

    def fresh_work() -> str:
        runs.append("fresh")
        return "new"

    with ThreadPoolExecutor(3) as pool:
        leader = pool.submit(g.run_sync, "k", lambda: release.wait(5) and "old")
        wait_until(lambda: g.stats().in_flight == 1)
        joiner = pool.submit(g.run_sync, "k", lambda: "never")
        wait_until(lambda: g.stats().joins == 1)
        fresh = pool.submit(g.run_sync, "k", fresh_work, fresh=True)
        wait_until(lambda: g.stats().calls == 3)  # the fresh caller waits for the end
        with pytest.raises(TooManyWaitersError) as info:  # a third fresh caller
            g.run_sync("k", fresh_work, fresh=True)
        assert (info.value.key, info.value.limit) == ("k", 2)
        with pytest.raises(TooManyWaitersError) as info:  # and a third joiner
            g.run_sync("k", lambda: "never")
        # The message counts both kinds of waiting callers.
        assert "2 callers waiting (joiners and fresh callers)" in str(info.value)
        release.set()
        assert leader.result(5).value == "old" and joiner.result(5).value == "old"
        assert fresh.result(5).value == "new"
    assert runs == ["fresh"]


def test_max_waiters_counts_the_fresh_callers_claims_on_the_next_flight() -> None:
    """The fresh callers of a flight hold claims on the next one and join it when they
    wake; they are never refused then. Their claims count: a caller that comes to the
    next flight before them is not let in as if they were not there, so the flight never
    ends up with more joiners than max_waiters."""
    g = FlightGroup(limits=Limits(max_waiters=1))
    first, second, hold = threading.Event(), threading.Event(), threading.Event()
    busy = threading.Event()
    other = LoopThread()
    try:
        with ThreadPoolExecutor(3) as pool:
            f = pool.submit(g.run_sync, "k", lambda: first.wait(5) and "F")
            wait_until(lambda: g.stats().in_flight == 1)
            fresh = other.submit(g.run("k", lambda: asyncio.sleep(0, "fresh ran"), fresh=True))
            wait_until(lambda: g.stats().calls == 2, "fresh waits for F's end")

            def hold_the_loop() -> None:
                busy.set()
                hold.wait(10)

            other.call(hold_the_loop)  # its caller cannot claim the next flight yet
            assert busy.wait(5)
            first.set()
            assert f.result(5).value == "F"
            # The next flight G is IDLE with the fresh caller's claim; a caller leads it.
            g_leader = pool.submit(g.run_sync, "k", lambda: second.wait(5) and "G")
            wait_until(lambda: g.stats().in_flight == 1, "G runs")  # IDLE is not in_flight
            with pytest.raises(TooManyWaitersError):  # the claim takes the one place
                g.run_sync("k", lambda: "never")
            hold.set()
            wait_until(lambda: g.stats().joins == 1, "the claim joined G")
            second.set()
            assert g_leader.result(5).value == "G"
            result = fresh.result(5)
            assert (result.value, result.joined) == ("G", True)
    finally:
        hold.set()
        first.set()
        second.set()
        other.close()


def test_max_flights_refuses_a_new_key_but_a_duplicate_still_joins() -> None:
    g = FlightGroup(limits=Limits(max_flights=1))
    release = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(g.run_sync, "a", lambda: release.wait(5) and "v")
        wait_until(lambda: g.stats().in_flight == 1)
        with pytest.raises(TooManyFlightsError) as info:
            g.run_sync("b", lambda: "never")
        assert (info.value.key, info.value.limit) == ("b", 1)
        joiner = pool.submit(g.run_sync, "a", lambda: "never")
        wait_until(lambda: g.stats().joins == 1)
        release.set()
        assert leader.result(5).value == "v" and joiner.result(5).joined
    assert g.run_sync("b", lambda: "now").value == "now"


# -- per operation ------------------------------------------------------------------


def test_coalesce_takes_policies_per_operation() -> None:
    g = FlightGroup()
    runs: list[int] = []

    @g.coalesce(key=lambda: "k", retry=FAST, retention=Retention(success=60.0))
    def op() -> int:
        runs.append(1)
        if len(runs) < 3:
            raise OSError("again")
        return len(runs)

    assert op() == 3 and op() == 3  # retried, then kept
    assert runs == [1, 1, 1]
    with pytest.raises(OSError):  # the group itself has no policy
        g.run_sync("k", lambda: (_ for _ in ()).throw(OSError("once")))


def test_the_first_caller_s_policy_is_the_flight_s_policy() -> None:
    g = FlightGroup()
    release = threading.Event()
    runs: list[int] = []

    @g.coalesce(key=lambda: "shared", name="op", retry=FAST)
    def with_retry() -> str:
        runs.append(1)
        release.wait(5)
        if len(runs) < 2:
            raise OSError("first attempt fails")
        return "ok"

    @g.coalesce(key=lambda: "shared", name="op")
    def without_retry() -> str:
        runs.append(1)
        raise AssertionError("a joiner's work never runs")

    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(with_retry)
        wait_until(lambda: runs == [1])
        joiner = pool.submit(without_retry)
        wait_until(lambda: g.stats().joins == 1)
        release.set()
        assert leader.result(5) == "ok" and joiner.result(5) == "ok"
    assert len(runs) == 2


def test_a_sync_attempt_whose_thread_cannot_start_interrupts_the_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    g = FlightGroup(deadline=5.0)

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        g.run_sync("k", lambda: "never")
    monkeypatch.undo()
    assert g.stats().in_flight == 0 and g.stats().interrupted == 1
    assert g.run_sync("k", lambda: "next").value == "next"


def test_a_first_attempt_that_fails_at_once_leaves_no_deadline_timer_for_the_next() -> None:
    # With eager tasks (3.12+) the first attempt runs inside the call; it failed before
    # the work's task first suspended (in the retry's pause), so no timer of its may be
    # armed then: one due 0.05 s after the call would cancel the pause or attempt 2.
    calls: list[int] = []

    async def work() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("the first attempt fails at once")
        return "second"

    async def main() -> Any:
        g = FlightGroup(deadline=0.05, retry=Retry(attempts=2, backoff=0.3, jitter=False))
        return await g.run("k", work)

    res = run(main())
    assert (res.value, res.joined, len(calls)) == ("second", False, 2)


def test_a_thousand_and_more_attempts_back_off_without_overflowing() -> None:
    # 2 ** 1024 does not fit a float: past attempt 1025 the pause must still be computed.
    policy = FlightGroup(retry=Retry(attempts=2000, backoff=0.5, max_backoff=3.0))._policy
    assert policy.backoff(1, lambda lo, hi: hi) == 0.5
    assert policy.backoff(1100, lambda lo, hi: hi) == 3.0
    attempts: list[int] = []

    def work() -> None:
        attempts.append(1)
        raise ValueError(f"attempt {len(attempts)}")

    g = FlightGroup(retry=Retry(attempts=1100, backoff=0.0, max_backoff=0.0, jitter=False))
    with pytest.raises(ValueError, match="attempt 1100"):
        g.run_sync("k", work)
    assert len(attempts) == 1100


def test_each_landing_is_kept_under_its_own_flights_retention_bounds() -> None:
    # The store is made at the first kept outcome; later flights of another policy (the
    # group's, an operation's) still apply their own bounds, as the directory does.
    g = FlightGroup(retention=Retention(success=60.0, max_items=10_000))

    @g.coalesce(key=str, retention=Retention(success=60.0, max_items=1))
    def op(x: int) -> int:
        return x

    op(1)  # the first kept outcome, under max_items=1
    runs: list[str] = []
    for key in "abc":
        g.run_sync(key, lambda key=key: runs.append(key) or key)
    assert g.stats().kept == 4  # the group's max_items, not the operation's
    assert [g.run_sync(key, lambda: "again").joined for key in "abc"] == [True] * 3
    assert runs == ["a", "b", "c"]
    op(2)  # its landing's own bound: one kept outcome in all
    assert g.stats().kept == 1
