"""docs/api.md, Calls: ``on_join`` is called once for each joiner, in the caller's own thread
or task, before it waits; never for the leader, never for a kept outcome; if it raises,
that call withdraws and raises that error."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from flightgroup import FlightGroup, Retention

from ...ingroup import Background
from ...support import LoopThread, run
from .conftest import Leader, Scope, joiner, never


def test_on_join_is_called_once_per_joiner_in_its_own_thread(group: FlightGroup) -> None:
    leader_joined: list[str] = []
    leader = Leader(group, "k", "v", on_join=lambda: leader_joined.append("leader"))
    seen: list[str] = []
    ready = [threading.Event() for _ in range(3)]

    def call(i: int) -> Any:
        def on_join() -> None:
            seen.append(threading.current_thread().name)
            ready[i].set()

        return group.run_sync("k", never, on_join=on_join)

    joiners = [Background(lambda i=i: call(i), name=f"joiner-{i}") for i in range(3)]
    for each in ready:
        assert each.wait(15)
    leader.release()
    assert [each.wait().value for each in joiners] == ["v"] * 3
    assert sorted(seen) == ["joiner-0", "joiner-1", "joiner-2"]
    assert leader.result().joined is False and leader_joined == []


def test_on_join_runs_in_the_joining_task(group: FlightGroup) -> None:
    leader = Leader(group, "k", "v")
    tasks: list[Any] = []
    joined = threading.Event()

    async def call() -> Any:
        def on_join() -> None:
            tasks.append(asyncio.current_task())
            joined.set()

        return (await group.run("k", _never, on_join=on_join)), asyncio.current_task()

    loop = LoopThread()
    try:
        future = loop.submit(call())
        assert joined.wait(15)
        leader.release()
        result, task = future.result(15)
    finally:
        loop.close()
    assert result.joined and tasks == [task]


async def _never() -> Any:
    raise AssertionError("a joiner's work never runs")


def test_on_join_is_called_for_a_joiner_elsewhere(pair: tuple[FlightGroup, ...]) -> None:
    a, b = pair
    leader = Leader(a, "k", "v")
    count: list[int] = []
    joined = threading.Event()

    def on_join() -> None:
        count.append(1)
        joined.set()

    waiting = Background(lambda: b.run_sync("k", never, on_join=on_join))
    assert joined.wait(15)
    leader.release()
    assert (waiting.wait().joined, count) == (True, [1])


def test_on_join_is_never_called_for_a_kept_outcome(scope: Scope) -> None:
    g = scope.group(retention=Retention(success=60))
    g.run_sync("k", lambda: 1)
    called: list[int] = []
    served = g.run_sync("k", never, on_join=lambda: called.append(1))
    assert (served.joined, called) == (True, [])


def test_on_join_is_never_called_for_an_outcome_kept_elsewhere(wide: Scope) -> None:
    a, b = wide.group(retention=Retention(success=60)), wide.group()
    a.run_sync("k", lambda: 1)
    called: list[int] = []
    served = b.run_sync("k", never, on_join=lambda: called.append(1))
    assert (served.value, served.joined, called) == (1, True, [])
    served = run(b.run("k", _never, on_join=lambda: called.append(2)))
    assert (served.joined, called) == (True, [])


def test_an_on_join_that_raises_withdraws_only_that_caller(group: FlightGroup) -> None:
    leader = Leader(group, "k", "v")
    staying = joiner(group, "k")

    def refuse() -> None:
        raise PermissionError("not this one")

    with pytest.raises(PermissionError):
        group.run_sync("k", never, on_join=refuse)
    leader.release()
    assert (leader.result().value, staying.wait().value) == ("v", "v")


def test_an_on_join_that_raises_elsewhere_withdraws_only_that_caller(
    pair: tuple[FlightGroup, ...],
) -> None:
    a, b = pair
    leader = Leader(a, "k", "v")

    def refuse() -> None:
        raise PermissionError("not this one")

    with pytest.raises(PermissionError):
        b.run_sync("k", never, on_join=refuse)
    staying = joiner(b, "k")
    leader.release()
    assert (leader.result().value, staying.wait().value) == ("v", "v")
    assert leader.runs == 1
