"""close() of a process-scope group: every waiter is woken with GroupClosedError (a
sync leader too), a lease made while it closes is lost, and no caller it detached gets
an outcome that lands later.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import flightgroup.waiting as waiting_module
from flightgroup import FlightGroup, GroupClosedError, Lease, current_lease
from flightgroup.engine.flight import CLOSED, wake
from flightgroup.engine.table import FlightTable

from ..support import run, until, wait_until, waits_for_loss


def test_timed_out_joiner_detached_by_close_never_gets_the_late_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A timed-out joiner that close() detached never gets the late outcome.

    t0 a sync leader runs "k" in a thread; an async joiner waits with a timeout.
    t1 the joiner's timer fires: its future holds EXPIRED, its task is not resumed yet.
    t2 close() detaches the joiner and hands it CLOSED (dropped: the future is done).
    t3 the work lands (settle records VALUE; no waiter is left to wake).
    t4 the joiner resumes: withdraw fails, so it acts on the signal it was handed:
    signal_of reads flight.closed, never flight.outcome, and the call raises
    GroupClosedError instead of returning the value of a closed group's flight."""
    g = FlightGroup()
    started, release = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert release.wait(5)
        return "landed after close"

    async def never_led() -> str:
        raise AssertionError("the joiner must not lead")

    real_expire = waiting_module._expire

    def expire_then_close_and_land(fut: asyncio.Future[Any]) -> None:
        real_expire(fut)  # t1
        g.close()  # t2
        release.set()
        wait_until(lambda: g.stats().in_flight == 0, "the work landed")  # t3

    monkeypatch.setattr(waiting_module, "_expire", expire_then_close_and_land)

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            leader = pool.submit(g.run_sync, "k", work)
            await until(started.is_set, "the work started")
            with pytest.raises((GroupClosedError, TimeoutError)):
                await g.run("k", never_led, timeout=0.01)
            with contextlib.suppress(GroupClosedError):
                leader.result(5)

    run(main())


def test_lease_made_while_the_group_closes_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lease made while its group closes is lost.

    t0 the work (a thread) calls current_lease(): get_lease reads lost=False and
       calls Lease._new (paused here).
    t1 close() marks the attempt lost and finds its lease still None: nothing to mark.
    t2 get_lease stores the lease it made: it is lost, and wait_lost() returns."""
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


def test_sync_leader_of_a_group_closed_during_its_work_raises_group_closed_error() -> None:
    """A sync leader whose group closes during its work raises GroupClosedError.

    As the async leader of the same schedule does
    (test_close_rejects_waiting_callers_and_later_calls_but_lets_work_finish): it never returns
    the value of a flight whose lease close() marked lost."""
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


def test_close_wakes_every_waiter_even_if_a_wait_lost_loop_closes_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """close() wakes every waiter, though a wait_lost() loop closes meanwhile.

    The work of "k" waits in lease.wait_lost() on loop L, whose thread is about to
    close it; a thread joins "k". close() runs flight.lose() -> Lease._lose():
    L.is_closed() is False, L closes, call_soon_threadsafe raises RuntimeError. The
    closing is stood in for by a call_soon_threadsafe that raises as a closed loop's
    does; nothing else is patched."""
    g = FlightGroup()
    loop = asyncio.new_event_loop()
    leader_tasks: list[asyncio.Task[Any]] = []
    leases: list[Lease] = []

    async def work() -> str:
        leases.append(current_lease())
        await leases[0].wait_lost()
        return "v"

    async def start() -> None:
        leader_tasks.append(asyncio.create_task(g.run("k", work)))
        await until(
            lambda: bool(leases) and waits_for_loss(leases[0]) == 1,
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
                    g.close()  # wakes every waiter, though the lease's loop is closed
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
