"""Regressions from the review of the process-scope engine: each test proved one bug.

Every test forces its interleaving (events, a paused private function, a loop driven
by hand), never a lucky sleep; its docstring gives the interleaving. All the bugs are
fixed; the tests stay so they do not come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

import flightgroup.engine.attempts as attempts_module
import flightgroup.group as group_module
from flightgroup import FlightGroup, GroupClosedError, Lease, current_lease
from flightgroup.engine.flight import CLOSED, wake
from flightgroup.engine.table import FlightTable

from .ingroup import scope_groups
from .support import mypy_strict, run, until, wait_until

R = TypeVar("R")


class Stop(BaseException):
    """A BaseException of the test's own (a stand-in for KeyboardInterrupt)."""


@contextlib.contextmanager
def gc_disabled() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# -- 1. (fixed in 1d5d8a8, kept as a regression) a timed-out waiter handed CLOSED -----


def test_timed_out_joiner_detached_by_close_never_gets_the_late_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """t0 a sync leader runs "k" in a thread; an async joiner waits with a timeout.
    t1 the joiner's timer fires: its future holds EXPIRED, its task is not resumed yet.
    t2 close() detaches the joiner and hands it CLOSED (dropped: the future is done).
    t3 the work lands (settle records VALUE; no waiter is left to wake).
    t4 the joiner resumes: withdraw fails, so it must act on the signal it was handed.
    Before 1d5d8a8, _signal_in_transit guessed it from flight.outcome (VALUE) and the
    call returned the value of a closed group's flight; signal_of reads flight.closed."""
    g = FlightGroup()
    started, release = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert release.wait(5)
        return "landed after close"

    async def never_led() -> str:
        raise AssertionError("the joiner must not lead")

    real_expire = group_module._expire

    def expire_then_close_and_land(fut: asyncio.Future[Any]) -> None:
        real_expire(fut)  # t1
        flight = g._table.flights["k"]
        g.close()  # t2
        release.set()
        wait_until(lambda: flight.outcome is not None, "the work landed")  # t3

    monkeypatch.setattr(group_module, "_expire", expire_then_close_and_land)

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            leader = pool.submit(g.run_sync, "k", work)
            await until(started.is_set, "the work started")
            with pytest.raises((GroupClosedError, TimeoutError)):
                await g.run("k", never_led, timeout=0.01)
            with contextlib.suppress(GroupClosedError):
                leader.result(5)

    run(main())


# -- 2. a lease made while close() runs is never lost -------------------------------------


def test_lease_made_while_the_group_closes_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """t0 the work (a thread) calls current_lease(): get_lease reads lost=False and
       calls Lease._new (paused here).
    t1 close() marks the attempt lost and finds its lease still None: nothing to mark.
    t2 get_lease stores the lease it made with lost=False: lease.lost stays False and
       wait_lost() would never return."""
    g = FlightGroup()
    making, closed = threading.Event(), threading.Event()
    real_new = Lease._new

    def paused_new(cls: type[Lease], key: str, token: int, lost: bool) -> Lease:
        making.set()  # t0
        assert closed.wait(5)
        return real_new(key, token, lost)  # t2

    monkeypatch.setattr(Lease, "_new", classmethod(paused_new))
    leases: list[Lease] = []

    def work() -> str:
        leases.append(current_lease())
        return "v"

    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(g.run_sync, "k", work)
        assert making.wait(5)
        g.close()  # t1
        closed.set()
        with contextlib.suppress(GroupClosedError):
            call.result(5)
    assert leases[0].lost


# -- 3. a sync leader's call returns normally after close() -------------------------------


def test_sync_leader_of_a_group_closed_during_its_work_raises_group_closed_error() -> None:
    """The async leader of the same schedule raises GroupClosedError
    (test_close_rejects_waiting_callers_and_later_calls_but_lets_work_finish); the
    sync leader returns the value of a flight whose lease close() marked lost."""
    g = FlightGroup()
    started, release = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert release.wait(5)
        return "v"

    with ThreadPoolExecutor(1) as pool:
        leader = pool.submit(g.run_sync, "k", work)
        assert started.wait(5)
        g.close()
        release.set()
        with pytest.raises(GroupClosedError):
            leader.result(5)


# -- 4. run_sync with a large finite timeout raises OverflowError -------------------------


def test_run_sync_with_a_timeout_over_timeout_max_waits_like_no_limit() -> None:
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


# -- 5. a work task cancelled before its first step never lands ---------------------------


@pytest.fixture(params=["process", "directory", "fleet"])
def any_scope(request: pytest.FixtureRequest) -> Iterator[FlightGroup]:
    """A group of each scope; the wide ones' servers are started only when asked for."""
    [g] = scope_groups(request, request.param, 1, lease=2.0)
    try:
        yield g
    finally:
        g.close()


def test_work_task_cancelled_before_it_started_still_settles_its_flight(
    any_scope: FlightGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncio.run(main) where main starts a leader task and returns at once:
    iteration 1: main returns; the run_until_complete callback is queued.
    iteration 2: the leader arrives, leads, schedules the work's task; the callback
                 stops the loop.
    shutdown:    asyncio.run cancels every task; the work's task is cancelled before
                 its coroutine ever ran, so nothing lands the flight.
    (Without eager tasks: Python 3.11. In a wide scope the task is the driver that
    would ask the scope first; it was fixed there later, in d9d7f6a.)"""
    monkeypatch.setattr(attempts_module, "_EAGER", False)
    g = any_scope
    ran: list[int] = []
    tasks: list[asyncio.Task[Any]] = []

    async def work() -> str:
        ran.append(1)
        return "v"

    async def main() -> None:
        tasks.append(asyncio.create_task(g.run("k", work)))  # fire and forget

    asyncio.run(main())
    assert ran == [] and tasks[0].cancelled()  # the interleaving above happened
    flight = g._table.flights.get("k")
    assert flight is None, f"{flight!r} is stuck in the table"
    # and so the next call leads a new flight instead of joining a dead one forever
    assert g.run_sync("k", lambda: "next", timeout=10).value == "next"


# -- 6. (fixed in 1d5d8a8, kept as regressions) a codec's BaseException ------------------


class _StopOnceCodec:
    """Encoding raises Stop the first time (think KeyboardInterrupt during a slow pickle)."""

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, value: Any, /) -> bytes:
        self.calls += 1
        if self.calls == 1:
            raise Stop()
        return repr(value).encode()

    def decode(self, data: bytes, /) -> Any:
        return data.decode()


def test_sync_encode_interrupted_by_a_base_exception_still_settles_the_flight() -> None:
    """Before 1d5d8a8, _land ran outside _drive_sync's try: the flight stayed RUNNING."""
    g = FlightGroup(codec=_StopOnceCodec())
    with pytest.raises(Stop):
        g.run_sync("k", lambda: "v")
    flight = g._table.flights.get("k")
    assert flight is None, f"{flight!r} is stuck in the table"
    assert g.run_sync("k", lambda: "w", timeout=5).value == "'w'"


def test_async_encode_interrupted_by_a_base_exception_still_settles_the_flight() -> None:
    """Before 1d5d8a8, _land ran in _drive_async's else clause: the work's task ended
    with the codec's exception and the flight never settled."""

    async def main() -> None:
        g = FlightGroup(codec=_StopOnceCodec())
        release = asyncio.Event()

        async def work() -> str:
            await release.wait()
            return "v"

        leader = asyncio.create_task(g.run("k", work))
        await until(lambda: "k" in g._table.flights, "the leader arrived")
        flight = g._table.flights["k"]
        await until(lambda: flight.task is not None, "the work's task started")
        task = flight.task
        assert task is not None
        release.set()
        try:
            await until(task.done, "the work's task ended")
            assert flight.outcome is not None, "the work's task ended, its flight never settled"
            with pytest.raises(Stop):
                await leader
        finally:
            g.close()  # let a waiting leader go on the buggy code
            await asyncio.gather(leader, return_exceptions=True)
            if not task.cancelled():
                task.exception()  # retrieved: no "never retrieved" log

    run(main())


# -- 7. a failed thread start leaves the flight RUNNING forever ----------------------------


class _NoThread:
    """threading.Thread that cannot start (the interpreter is out of threads)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def start(self) -> None:
        raise RuntimeError("can't start new thread")


def test_leader_whose_work_thread_cannot_start_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    g = FlightGroup()
    no_threads = types.ModuleType("threading")  # the module, but Thread cannot start
    no_threads.__dict__.update(vars(threading))
    no_threads.Thread = _NoThread  # type: ignore[attr-defined]
    with monkeypatch.context() as patch:
        patch.setattr(attempts_module, "threading", no_threads)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            g.run_sync("k", lambda: "v", timeout=5)
    flight = g._table.flights.get("k")
    assert flight is None, f"{flight!r} is stuck in the table"
    assert g.stats().in_flight == 0


# -- 8. a settled async flight is freed only by the cyclic GC ------------------------------


def test_settled_async_flight_is_freed_without_the_cyclic_gc(task_start: str) -> None:
    """Each way the leader's task starts (eagerly on 3.12+, through the loop)."""

    class Big:
        pass

    async def main() -> None:
        g = FlightGroup()
        box = [Big()]
        ref = weakref.ref(box[0])

        async def work() -> Big:
            await asyncio.sleep(0)
            return box.pop()

        result = await g.run("k", work)
        del result
        for _ in range(3):
            await asyncio.sleep(0)  # the work's task runs its done callbacks
        assert ref() is None, "the value is kept alive by the settled flight's cycle"

    with gc_disabled():  # refcounting alone: what a run_sync flight already gets
        run(main())


# -- 9. close() stops half-way when a lease's wait_lost loop is closing -------------------


def test_close_wakes_every_waiter_even_if_a_wait_lost_loop_closes_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The work of "k" waits in lease.wait_lost() on loop L, whose thread is about to
    close it; a thread joins "k". close() runs flight.lose() -> Lease._lose():
    L.is_closed() is False, L closes, call_soon_threadsafe raises RuntimeError. The
    closing is stood in for by a call_soon_threadsafe that raises as a closed loop's
    does; nothing else is patched."""
    g = FlightGroup()
    loop = asyncio.new_event_loop()
    leader_tasks: list[asyncio.Task[Any]] = []

    async def work() -> str:
        await current_lease().wait_lost()
        return "v"

    async def start() -> None:
        leader_tasks.append(asyncio.create_task(g.run("k", work)))
        await until(
            lambda: "k" in g._table.flights
            and (attempt := g._table.flights["k"].attempt) is not None
        and (lease := attempt.lease) is not None
            and bool(lease._waiters),
            "the work waits in wait_lost()",
        )

    def closed_loop_call(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("Event loop is closed")

    detached: list[tuple[Any, list[Any]]] = []
    real_table_close = FlightTable.close

    def recording_close(table: FlightTable) -> Any:
        result = real_table_close(table)
        detached.extend(result)
        return result

    monkeypatch.setattr(FlightTable, "close", recording_close)
    try:
        loop.run_until_complete(start())
        with ThreadPoolExecutor(1) as pool:
            joiner = pool.submit(g.run_sync, "k", lambda: "joiner's", timeout=5)
            wait_until(lambda: g.stats().joins == 1, "the thread joined")
            with monkeypatch.context() as patch:
                patch.setattr(loop, "call_soon_threadsafe", closed_loop_call)
                try:
                    g.close()  # raises RuntimeError on the current code
                except RuntimeError:
                    # The joiner was detached and will never be woken: past its own
                    # timeout it waits for that signal forever. Hand it over here so
                    # the thread ends, then fail.
                    for _, waiters in detached:
                        wake([w for w in waiters if not isinstance(w, asyncio.Future)], CLOSED)
                    raise
            assert isinstance(joiner.exception(5), GroupClosedError)
    finally:

        async def cancel_the_rest() -> None:
            rest = asyncio.all_tasks() - {asyncio.current_task()}
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        loop.run_until_complete(cancel_the_rest())
        loop.close()


# -- 10. the decorator's documented .forget is invisible to mypy ---------------------------


def test_mypy_sees_the_decorated_function_s_forget(tmp_path: Path) -> None:
    proc = mypy_strict(
        tmp_path,
        """
            import flightgroup

            g = flightgroup.FlightGroup()

            @g.coalesce(key=lambda user_id: f"user:{user_id}")
            async def get_user(user_id: int) -> str:
                return "u"

            get_user.forget(7)
        """,
        timeout=50,
    )
    assert proc.returncode == 0, proc.stdout


# -- 11. a wrapped async function is decorated as a sync one ------------------------------


def _passthrough(fn: Callable[..., R]) -> Callable[..., R]:
    """A plain decorator of the everyday kind (logging, metrics): a def that returns
    whatever ``fn`` returns, with functools.wraps."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> R:
        return fn(*args, **kwargs)

    return wrapper


def test_coalesce_of_a_wrapped_async_function_is_awaitable() -> None:
    g = FlightGroup()

    @g.coalesce(key=lambda n: str(n))
    @_passthrough
    async def load(n: int) -> int:
        return n * 2

    async def main() -> None:
        assert await load(21) == 42

    run(main())


# -- 12. a fresh herd's flight can start after a newer flight yet carry an older token ---


def test_a_flight_that_starts_later_carries_the_larger_token() -> None:
    """t0 flight F of "k" runs (token 1) in a thread; a fresh caller waits for its end.
    t1 F lands: the IDLE flight G is made for the fresh caller, with token 2.
    t2 forget("k") detaches G; a new call leads N (token 3) and N's work starts.
    t3 the fresh caller claims G, leads it: G's work starts after N's, with token 2."""
    g = FlightGroup()
    f_started, f_release = threading.Event(), threading.Event()
    n_started, n_release = threading.Event(), threading.Event()
    g_tokens: list[int] = []

    def f_work() -> str:
        f_started.set()
        assert f_release.wait(5)
        return "F"

    def n_work() -> int:
        n_started.set()
        assert n_release.wait(5)
        return current_lease().token

    async def g_work() -> int:
        g_tokens.append(current_lease().token)
        return current_lease().token

    async def main() -> None:
        with ThreadPoolExecutor(2) as pool:
            f_call = pool.submit(g.run_sync, "k", f_work)
            await until(f_started.is_set, "F started")
            fresh = asyncio.create_task(g.run("k", g_work, fresh=True))
            await until(lambda: g.stats().calls == 2, "the fresh caller waits for F's end")
            flight_f = g._table.flights["k"]
            # This loop does not run until t3: the claim on G waits here, undelivered.
            f_release.set()
            wait_until(lambda: flight_f.next is not None, "F landed")  # t1
            g.forget("k")  # t2
            n_call = pool.submit(g.run_sync, "k", n_work)
            assert n_started.wait(5)
            result = await fresh  # t3
            n_release.set()
            n_token = n_call.result(5).value
            assert f_call.result(5).value == "F"
            assert not result.joined and g_tokens == [result.token]
            assert result.token > n_token, (
                f"G started after N but has token {result.token} < {n_token}"
            )

    run(main())


# -- 13. two joiner threads can get two Result objects ------------------------------------


def test_joiner_threads_share_one_result_object(monkeypatch: pytest.MonkeyPatch) -> None:
    g = FlightGroup()
    started, release = threading.Event(), threading.Event()
    first_making, second_made = threading.Event(), threading.Event()
    real_result = group_module.Result
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

    monkeypatch.setattr(group_module, "Result", paused_result)

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
