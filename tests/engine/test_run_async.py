"""The process scope with asyncio callers: leading, joining, outcomes, cancellation.

A leader's task starts eagerly on every Python (3.11 by hand, engine/eager.py): the
suite's run on 3.11 covers that path, and tests/engine/test_eager_start.py pins it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from flightgroup import (
    FlightFailedError,
    FlightGroup,
    FlightInterruptedError,
    Result,
    Retention,
    current_lease,
)

from ..support import flight_of, run, until, wait_until, waiting_on


class Gate:
    """A work whose run the test controls: it records each run and waits to be released."""

    def __init__(self, value: Any = "v") -> None:
        self.value = value
        self.runs = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.error: BaseException | None = None

    async def __call__(self) -> Any:
        self.runs += 1
        self.started.set()
        await self.release.wait()
        if self.error is not None:
            raise self.error
        return self.value


def test_first_caller_leads_and_later_callers_join_with_the_same_object() -> None:
    async def main() -> None:
        g = FlightGroup()
        value = object()
        gate = Gate(value)
        leader = asyncio.create_task(g.run("k", gate))
        await gate.started.wait()
        joiners = [asyncio.create_task(g.run("k", gate)) for _ in range(5)]
        await until(lambda: g.stats().joins == 5, "5 joins")
        gate.release.set()
        results: list[Result[Any]] = [await leader, *await asyncio.gather(*joiners)]
        assert gate.runs == 1
        assert [r.joined for r in results] == [False] + [True] * 5
        assert all(r.value is value for r in results)
        assert len({r.token for r in results}) == 1

    run(main())


def test_thousand_tasks_share_one_run() -> None:
    async def main() -> None:
        g = FlightGroup()
        gate = Gate(42)
        tasks = [asyncio.create_task(g.run("herd", gate)) for _ in range(1000)]
        await gate.started.wait()
        await until(lambda: g.stats().calls == 1000, "1000 calls")
        gate.release.set()
        results = await asyncio.gather(*tasks)
        assert gate.runs == 1
        assert sum(not r.joined for r in results) == 1
        assert {r.value for r in results} == {42}
        stats = g.stats()
        assert (stats.calls, stats.flights, stats.joins, stats.in_flight) == (1000, 1, 999, 0)
        assert stats.joiners_max == 999

    run(main())


def test_a_call_after_the_flight_ended_starts_a_new_flight_with_a_higher_token() -> None:
    async def main() -> None:
        g = FlightGroup()
        runs = 0

        async def work() -> int:
            nonlocal runs
            runs += 1
            return runs

        first = await g.run("k", work)
        second = await g.run("k", work)
        assert (first.value, second.value) == (1, 2)
        assert not first.joined and not second.joined
        assert second.token > first.token

    run(main())


def test_work_may_be_a_lambda_returning_a_coroutine_or_any_awaitable() -> None:
    async def main() -> None:
        g = FlightGroup()

        async def fetch(n: int) -> int:
            return n * 2

        assert (await g.run("a", lambda: fetch(21))).value == 42
        loop = asyncio.get_running_loop()

        def future_work() -> asyncio.Future[str]:
            fut = loop.create_future()
            loop.call_soon(fut.set_result, "from a future")
            return fut

        assert (await g.run("b", future_work)).value == "from a future"

    run(main())


def test_work_returning_a_non_awaitable_fails_its_flight_with_a_type_error_naming_run_sync() -> (
    None
):
    async def main() -> None:
        g = FlightGroup()
        with pytest.raises(TypeError, match="run_sync"):
            await g.run("k", lambda: 5)  # type: ignore[arg-type, return-value]
        # nothing is left behind
        assert (await g.run("k", lambda: asyncio.sleep(0))).joined is False

    run(main())


def test_leader_gets_its_own_exception_and_each_joiner_its_own_flight_failed_error() -> None:
    async def main() -> None:
        g = FlightGroup()
        gate = Gate()
        error = KeyError("missing")
        gate.error = error
        leader = asyncio.create_task(g.run("k", gate))
        await gate.started.wait()
        joiners = [asyncio.create_task(g.run("k", gate)) for _ in range(3)]
        await until(lambda: g.stats().joins == 3)
        gate.release.set()
        with pytest.raises(KeyError) as leader_error:
            await leader
        assert leader_error.value is error
        failures = await asyncio.gather(*joiners, return_exceptions=True)
        assert all(isinstance(f, FlightFailedError) for f in failures)
        assert len({id(f) for f in failures}) == 3  # one instance per joiner
        for failure in failures:
            assert isinstance(failure, FlightFailedError)
            assert failure.key == "k"
            assert failure.error_type == "KeyError"
            assert failure.error_module == "builtins"
            assert failure.message == str(error)
            assert failure.__cause__ is error
        stats = g.stats()
        assert stats.failures == 1

    run(main())


def test_joiners_do_not_grow_the_original_traceback() -> None:
    async def main() -> None:
        g = FlightGroup()
        gate = Gate()
        gate.error = ValueError("boom")
        leader = asyncio.create_task(g.run("k", gate))
        await gate.started.wait()
        joiners = [asyncio.create_task(g.run("k", gate)) for _ in range(50)]
        await until(lambda: g.stats().joins == 50)
        gate.release.set()
        await asyncio.gather(*joiners, return_exceptions=True)
        depth_after_joiners = _tb_depth(gate.error)
        with pytest.raises(ValueError, match="boom"):
            await leader
        # The joiners raised their own errors; only the leader's raise adds frames.
        assert _tb_depth(gate.error) - depth_after_joiners <= 3

    run(main())


def _tb_depth(error: BaseException | None) -> int:
    assert error is not None
    depth, tb = 0, error.__traceback__
    while tb is not None:
        depth, tb = depth + 1, tb.tb_next
    return depth


def test_failure_does_not_poison_the_key() -> None:
    async def main() -> None:
        g = FlightGroup()
        attempts = 0

        async def flaky() -> str:
            nonlocal attempts
            attempts += 1
            if attempts == 1:
                raise RuntimeError("first try fails")
            return "ok"

        with pytest.raises(RuntimeError):
            await g.run("k", flaky)
        result = await g.run("k", flaky)
        assert (result.value, result.joined) == ("ok", False)

    run(main())


def test_leader_cancelled_does_not_cancel_the_work_and_joiners_get_its_value() -> None:
    async def main() -> None:
        g = FlightGroup()
        gate = Gate("done")
        leader = asyncio.create_task(g.run("k", gate))
        await gate.started.wait()
        joiner = asyncio.create_task(g.run("k", gate))
        await until(lambda: g.stats().joins == 1)
        leader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leader
        gate.release.set()
        result = await joiner
        assert (result.value, result.joined, gate.runs) == ("done", True, 1)

    run(main())


def test_leader_alone_cancelled_lets_the_work_finish_owned_by_the_group() -> None:
    async def main() -> None:
        g = FlightGroup()
        finished = asyncio.Event()

        async def work() -> str:
            await asyncio.sleep(0.01)
            finished.set()
            return "v"

        leader = asyncio.create_task(g.run("k", work))
        await asyncio.sleep(0)
        leader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leader
        await finished.wait()
        await until(lambda: g.stats().in_flight == 0)

    run(main())


@pytest.mark.parametrize("when", ["while it waits", "in the turn its flight settles"])
def test_joiner_cancelled_withdraws_only_itself(when: str) -> None:
    """A cancelled joiner raises CancelledError and the others get the value; also when
    the flight settles before the joiner's task could withdraw it (the wake-up passes
    over its cancelled wait)."""

    async def main() -> None:
        g = FlightGroup()
        gate = Gate("v")
        leader = asyncio.create_task(g.run("k", gate))
        await gate.started.wait()
        quitter = asyncio.create_task(g.run("k", gate))
        stayer = asyncio.create_task(g.run("k", gate))
        await until(lambda: g.stats().joins == 2)
        if when == "while it waits":
            quitter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await quitter
            assert waiting_on(g, "k") == 2  # the leader and the stayer
            gate.release.set()
        else:
            gate.release.set()  # the work's task steps first in the next turn: it settles
            quitter.cancel()  # its wait is cancelled now; its task withdraws it only after
        results = await asyncio.gather(leader, quitter, stayer, return_exceptions=True)
        assert isinstance(results[1], asyncio.CancelledError)
        assert (results[0].value, results[2].value) == ("v", "v")  # type: ignore[union-attr]
        assert results[2].joined  # type: ignore[union-attr]
        assert g.stats().in_flight == 0

    run(main())


def test_timeout_withdraws_the_caller_with_builtin_timeout_error_and_the_flight_goes_on() -> None:
    async def main() -> None:
        g = FlightGroup()
        gate = Gate("v")
        leader = asyncio.create_task(g.run("k", gate, timeout=0.05))
        await gate.started.wait()
        joiner = asyncio.create_task(g.run("k", gate, timeout=0.05))
        patient = asyncio.create_task(g.run("k", gate))
        with pytest.raises(TimeoutError):
            await leader
        with pytest.raises(TimeoutError):
            await joiner
        assert not patient.done()
        gate.release.set()
        result = await patient
        assert (result.value, result.joined, gate.runs) == ("v", True, 1)

    run(main())


def test_timeout_zero_neither_leads_nor_joins() -> None:
    async def main() -> None:
        g = FlightGroup()
        gate = Gate()
        with pytest.raises(TimeoutError):
            await g.run("k", gate, timeout=0)
        assert gate.runs == 0 and g.stats().calls == 0
        leader = asyncio.create_task(g.run("k", gate))
        await gate.started.wait()
        joined: list[int] = []
        with pytest.raises(TimeoutError):
            await g.run("k", gate, timeout=0, on_join=lambda: joined.append(1))
        assert joined == [] and g.stats().joins == 0
        gate.release.set()
        await leader

    run(main())


def test_an_already_cancelled_task_neither_leads_nor_joins() -> None:
    async def main() -> None:
        g = FlightGroup()
        gate = Gate()
        gate.release.set()
        outcome: list[str] = []

        async def caller() -> None:
            asyncio.current_task().cancel()  # type: ignore[union-attr]
            try:
                await g.run("k", gate)
            except asyncio.CancelledError:
                outcome.append("cancelled")
                raise

        task = asyncio.create_task(caller())
        with pytest.raises(asyncio.CancelledError):
            await task
        assert outcome == ["cancelled"]
        assert gate.runs == 0 and g.stats().calls == 0

    run(main())


def test_a_task_being_cancelled_is_served_an_outcome_this_process_keeps() -> None:
    """A kept outcome waits for nothing (ADR 0057): a task already being cancelled gets
    it from run() and from a decorated function, and its next await raises
    CancelledError; a call of a key with nothing kept raises CancelledError at once."""
    g = FlightGroup(retention=Retention(success=60))
    gate = Gate()
    gate.release.set()

    @g.coalesce(key=lambda: "op")
    async def op() -> str:
        return "op kept"

    got: list[object] = []

    async def caller() -> None:
        task = asyncio.current_task()
        assert task is not None
        got.append((await g.run("k", gate)).value)  # leads: its outcome is kept
        got.append(await op())
        task.cancel()
        got.append((await g.run("k", gate)).value)
        got.append(await op())
        got.append((await op.options(on_join=lambda: None)()).value)
        with pytest.raises(asyncio.CancelledError):
            await g.run("nothing kept", gate)
        got.append("after")
        await asyncio.sleep(0)  # (the cancel is still pending: it lands here)
        got.append("never")

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.ensure_future(caller())

    run(main())
    assert gate.runs == 1
    assert got == [gate.value, "op kept", gate.value, "op kept", "op kept", "after"]


def test_on_join_runs_once_per_joiner_in_its_own_task_before_it_waits() -> None:
    async def main() -> None:
        g = FlightGroup()
        gate = Gate()
        seen: list[tuple[str, bool]] = []

        def on_join_for(name: str) -> Any:
            def on_join() -> None:
                task = asyncio.current_task()
                assert task is not None
                seen.append((task.get_name(), gate.release.is_set()))

            return on_join

        leader = asyncio.create_task(g.run("k", gate, on_join=on_join_for("leader")))
        await gate.started.wait()
        joiners = [
            asyncio.create_task(g.run("k", gate, on_join=on_join_for(f"j{i}")), name=f"j{i}")
            for i in range(3)
        ]
        await until(lambda: len(seen) == 3)
        gate.release.set()
        await asyncio.gather(leader, *joiners)
        assert sorted(seen) == [("j0", False), ("j1", False), ("j2", False)]

    run(main())


def test_on_join_that_raises_withdraws_that_call_with_its_error() -> None:
    async def main() -> None:
        g = FlightGroup()
        gate = Gate("v")
        leader = asyncio.create_task(g.run("k", gate))
        await gate.started.wait()

        def refuse() -> None:
            raise PermissionError("not allowed to wait")

        with pytest.raises(PermissionError):
            await g.run("k", gate, on_join=refuse)
        assert waiting_on(g, "k") == 1  # only the leader's
        gate.release.set()
        assert (await leader).value == "v"

    run(main())


def test_base_exception_in_work_interrupts_joiners_and_reaches_the_leader() -> None:
    async def main() -> None:
        g = FlightGroup()
        gate = Gate()

        class Stop(BaseException):
            pass

        stop = Stop()
        gate.error = stop
        leader = asyncio.create_task(g.run("k", gate))
        await gate.started.wait()
        joiners = [asyncio.create_task(g.run("k", gate)) for _ in range(3)]
        await until(lambda: g.stats().joins == 3)
        gate.release.set()
        outcomes = await asyncio.gather(leader, *joiners, return_exceptions=True)
        assert outcomes[0] is stop
        assert all(isinstance(o, FlightInterruptedError) for o in outcomes[1:])
        assert g.stats().interrupted == 1
        assert g.stats().in_flight == 0

    run(main())


def test_work_cancelled_by_its_loop_shutting_down_interrupts_joiners_on_other_loops(
    loop_thread: Any,
) -> None:
    g = FlightGroup()
    started = __import__("threading").Event()

    async def work() -> str:
        started.set()
        await asyncio.Event().wait()  # never ends by itself
        return "never"

    async def leader_side() -> None:
        leader = asyncio.create_task(g.run("k", work))
        leader.add_done_callback(lambda t: t.cancelled() or t.exception())
        await until(started.is_set, "the work started")

    async def joiner_side() -> Any:
        try:
            return await g.run("k", work)
        except FlightInterruptedError as exc:
            return exc

    def main() -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(leader_side())
            assert started.is_set()
            joined = loop_thread.submit(joiner_side())
            # wait for the joiner to be registered on the flight
            for _ in range(5000):
                if waiting_on(g, "k") == 2:
                    break
                __import__("time").sleep(0.001)
            # shut the leader's loop down the way asyncio.run does: cancel its tasks
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        finally:
            loop.close()
        assert isinstance(joined.result(5), FlightInterruptedError)

    main()


def test_joiners_on_another_event_loop_in_another_thread(loop_thread: Any) -> None:
    async def main() -> None:
        g = FlightGroup()
        gate = Gate("shared")
        leader = asyncio.create_task(g.run("k", gate))
        await gate.started.wait()
        remote = [loop_thread.submit(g.run("k", gate)) for _ in range(20)]
        await until(lambda: g.stats().joins == 20, "20 remote joins")
        gate.release.set()
        local = await leader
        results = [await asyncio.wrap_future(f) for f in remote]
        assert gate.runs == 1 and not local.joined
        assert all(r.joined and r.value == "shared" for r in results)

    run(main())


def test_work_on_another_loop_is_joined_here(loop_thread: Any) -> None:
    async def main() -> None:
        g = FlightGroup()
        release = __import__("threading").Event()
        runs: list[int] = []

        async def remote_work() -> str:
            runs.append(1)
            await asyncio.to_thread(release.wait, 10)
            return "from the other loop"

        remote_leader = loop_thread.submit(g.run("k", remote_work))
        await until(lambda: runs == [1], "the remote work started")
        local = asyncio.create_task(g.run("k", remote_work))
        await until(lambda: g.stats().joins == 1)
        release.set()
        result = await local
        assert (result.value, result.joined) == ("from the other loop", True)
        assert not remote_leader.result(5).joined

    run(main())


def test_forget_detaches_the_running_flight_and_its_late_landing_keeps_the_new_one() -> None:
    async def main() -> None:
        g = FlightGroup()
        old, new = Gate("old"), Gate("new")
        old_leader = asyncio.create_task(g.run("k", old))
        await old.started.wait()
        old_joiner = asyncio.create_task(g.run("k", old))
        await until(lambda: g.stats().joins == 1)
        g.forget("k")
        new_leader = asyncio.create_task(g.run("k", new))
        await new.started.wait()
        new_joiner = asyncio.create_task(g.run("k", old))
        await until(lambda: g.stats().joins == 2)
        # the old flight lands first: it must not remove the new one (identity, I1)
        old.release.set()
        assert (await old_leader).value == "old"
        assert (await old_joiner).value == "old"
        # the new flight still holds the key:
        late = asyncio.create_task(g.run("k", old))
        await until(lambda: g.stats().joins == 3)
        assert old.runs == 1  # the late caller joined the new flight, nothing re-ran
        new.release.set()
        assert [(await t).value for t in (new_leader, new_joiner, late)] == ["new"] * 3
        assert g.stats().in_flight == 0  # neither the new flight nor the detached old one

    run(main())


def test_fresh_caller_never_takes_the_outcome_of_a_flight_that_started_before_it() -> None:
    async def main() -> None:
        g = FlightGroup()
        first, second = Gate("before"), Gate("after")
        leader = asyncio.create_task(g.run("k", first))
        await first.started.wait()
        plain = asyncio.create_task(g.run("k", first))
        fresh = [asyncio.create_task(g.run("k", second, fresh=True)) for _ in range(3)]
        await until(lambda: g.stats().calls == 5)
        first.release.set()
        assert (await leader).value == "before"
        assert (await plain).value == "before"
        await second.started.wait()
        second.release.set()
        results = await asyncio.gather(*fresh)
        assert second.runs == 1  # the fresh callers shared one next flight
        assert [r.value for r in results] == ["after"] * 3
        assert sum(not r.joined for r in results) == 1
        assert len({r.token for r in results}) == 1
        assert results[0].token > (await leader).token

    run(main())


def test_fresh_caller_with_no_flight_running_leads_at_once() -> None:
    async def main() -> None:
        g = FlightGroup()

        async def work() -> int:
            return 7

        result = await g.run("k", work, fresh=True)
        assert (result.value, result.joined) == (7, False)

    run(main())


def test_fresh_callers_who_all_cancel_leave_nothing_behind() -> None:
    async def main() -> None:
        g = FlightGroup()
        gate = Gate("v")
        leader = asyncio.create_task(g.run("k", gate))
        await gate.started.wait()
        fresh = [asyncio.create_task(g.run("k", gate, fresh=True)) for _ in range(2)]
        await until(lambda: g.stats().calls == 3)
        for task in fresh:
            task.cancel()
        await asyncio.gather(*fresh, return_exceptions=True)
        gate.release.set()
        await leader
        assert flight_of(g, "k") is None and gate.runs == 1  # no IDLE flight left (I4)

    run(main())


def test_fresh_caller_cancelled_while_its_claim_is_in_transit_hands_the_next_flight_back(
    loop_thread: Any,
) -> None:
    g = FlightGroup()
    gate = Gate("v")

    async def main() -> None:
        leader = loop_thread.submit(g.run("k", gate))
        await until(lambda: gate.runs == 1, "the leader's work started")
        fresh = asyncio.create_task(g.run("k", gate, fresh=True))
        await until(lambda: g.stats().calls == 2)
        flight = flight_of(g, "k")
        # Block this loop while the other loop lands the flight: the fresh caller's
        # claim on the next flight is then queued here, not yet delivered.
        loop_thread.call(gate.release.set)
        wait_until(lambda: g.stats().in_flight == 0, "the flight landed")
        following = flight.next
        assert following is not None and following.claims == 1
        fresh.cancel()  # before this loop delivers the claim
        with pytest.raises(asyncio.CancelledError):
            await fresh
        assert following.claims == 0
        assert flight_of(g, "k") is None  # the unclaimed next flight left the table (I4)
        assert gate.runs == 1
        assert not (await asyncio.wrap_future(leader)).joined

    run(main())


def test_a_work_calling_its_own_key_gets_a_clear_error_instead_of_a_deadlock() -> None:
    async def main() -> None:
        g = FlightGroup()

        async def outer() -> str:
            return (await g.run("inner", inner)).value

        async def inner() -> str:
            await asyncio.sleep(0)
            return (await g.run("outer", outer)).value  # outer waits on inner: a cycle

        with pytest.raises(RuntimeError, match="wait for itself"):
            await g.run("outer", outer)

        async def direct() -> str:
            return (await g.run("self", direct)).value

        with pytest.raises(RuntimeError, match="wait for itself"):
            await g.run("self", direct)
        assert g.stats().in_flight == 0

    run(main())


def test_current_lease_inside_the_work_and_lookup_error_outside() -> None:
    async def main() -> None:
        g = FlightGroup()
        seen: list[Any] = []

        async def work() -> None:
            lease = current_lease()
            seen.append((lease.key, lease.token, lease.lost))
            lease.raise_if_lost()
            await asyncio.sleep(0)
            assert current_lease() is lease

        result = await g.run("k", work)
        assert seen == [("k", result.token, False)]
        with pytest.raises(LookupError):
            current_lease()

    run(main())


def test_nested_flights_each_see_their_own_lease() -> None:
    async def main() -> None:
        g = FlightGroup()

        async def inner() -> tuple[str, int]:
            return current_lease().key, current_lease().token

        async def outer() -> tuple[str, Any]:
            mine = current_lease().key
            inner_seen = (await g.run("inner", inner)).value
            assert current_lease().key == mine
            return mine, inner_seen

        result = await g.run("outer", outer)
        assert result.value[0] == "outer" and result.value[1][0] == "inner"

    run(main())


def test_close_rejects_waiting_callers_and_later_calls_but_lets_work_finish() -> None:
    async def main() -> None:
        g = FlightGroup()
        gate = Gate("v")
        lost_seen: list[bool] = []

        async def work() -> Any:
            lease = current_lease()
            value = await gate()
            lost_seen.append(lease.lost)
            return value

        from flightgroup import GroupClosedError

        leader = asyncio.create_task(g.run("k", work))
        await gate.started.wait()
        joiner = asyncio.create_task(g.run("k", work))
        await until(lambda: g.stats().joins == 1)
        await g.aclose()
        for task in (leader, joiner):
            with pytest.raises(GroupClosedError, match=r"This flight group is closed\."):
                await task
        with pytest.raises(GroupClosedError):
            await g.run("other", work)
        gate.release.set()
        await until(lambda: lost_seen != [])
        assert lost_seen == [True] and gate.runs == 1

    run(main())


def test_group_as_async_and_sync_context_manager() -> None:
    async def main() -> None:
        async with FlightGroup() as g:
            assert (await g.run("k", lambda: asyncio.sleep(0, "x"))).value == "x"
        assert g.closed
        with FlightGroup() as g2, pytest.warns(RuntimeWarning):  # (run_sync on a loop)
            assert g2.run_sync("k", lambda: 3).value == 3
        assert g2.closed

    run(main())


def test_settled_flights_are_not_kept_alive() -> None:
    async def main() -> None:
        g = FlightGroup()
        holder = [type("Big", (), {})()]
        ref = weakref.ref(holder[0])

        async def work() -> Any:
            return holder.pop()

        result = await g.run("k", work)
        del result
        gc.collect()
        assert ref() is None  # neither the table nor a flight holds the value

    run(main())


@contextlib.contextmanager
def gc_disabled() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def test_settled_async_flight_is_freed_without_the_cyclic_gc() -> None:
    """A settled async flight is freed without the cyclic garbage collector."""

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
