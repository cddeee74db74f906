"""A decorated function's per-call form (issue 29, ADR 0044): ``fn.options(on_join=,
timeout=, fresh=)(*args)`` returns the call's Result, awaited for a coroutine function;
the options mean what they mean for ``run`` / ``run_sync``, a sync function's timeout
included."""

from __future__ import annotations

import asyncio
import threading

import pytest

from flightgroup import FlightGroup, Result

from ...ingroup import Background
from ...support import run, wait_until


def test_a_sync_functions_options_give_the_leader_and_each_joiner_its_result(
    group: FlightGroup,
) -> None:
    """The leader's Result says joined=False, a joiner's joined=True, both with the
    flight's token; on_join runs in the joiner only."""
    started, release = threading.Event(), threading.Event()
    joined: list[str] = []

    @group.coalesce(key=lambda n: f"n:{n}")
    def load(n: int) -> int:
        started.set()
        assert release.wait(30)
        return n * 10

    leader = Background(lambda: load.options(on_join=lambda: joined.append("leader"))(4))
    assert started.wait(15)
    joiner = Background(lambda: load.options(on_join=lambda: joined.append("joiner"))(4))
    wait_until(lambda: joined == ["joiner"], "the second call joined")
    release.set()
    first, second = leader.wait(), joiner.wait()
    assert isinstance(first, Result) and isinstance(second, Result)
    assert (first.value, first.joined, second.value, second.joined) == (40, False, 40, True)
    assert first.token == second.token
    assert load(4) == 40  # the plain call still gives the value


def test_an_async_functions_options_are_awaited_and_give_the_result(
    group: FlightGroup,
) -> None:
    """A coroutine function's per-call form is awaited; a joiner gets joined=True."""
    started, joined = asyncio.Event(), asyncio.Event()

    @group.coalesce(key=lambda n: f"n:{n}")
    async def load(n: int) -> int:
        started.set()
        await joined.wait()
        return n + 1

    async def main() -> tuple[Result[int], Result[int]]:
        leader = asyncio.create_task(load.options()(1))
        await started.wait()
        joiner = asyncio.create_task(load.options(on_join=joined.set)(1))
        return await leader, await joiner

    first, second = run(main())
    assert (first.value, first.joined) == (2, False)
    assert (second.value, second.joined) == (2, True)


def test_a_sync_functions_timeout_withdraws_only_that_caller(group: FlightGroup) -> None:
    """A decorated plain def now has a caller timeout: past it that call raises
    TimeoutError, and the flight goes on for the others."""
    started, release = threading.Event(), threading.Event()

    @group.coalesce(key=lambda: "k")
    def slow() -> str:
        started.set()
        assert release.wait(30)
        return "done"

    leader = Background(slow)
    assert started.wait(15)
    with pytest.raises(TimeoutError):
        slow.options(timeout=0.05)()
    release.set()
    assert leader.wait() == "done"


def test_a_leaders_own_timeout_leaves_its_work_running_for_the_joiners(
    group: FlightGroup,
) -> None:
    """With a timeout the leading sync call runs the work on a thread of its own: it
    stops waiting, the work lands for a joiner."""
    started, release = threading.Event(), threading.Event()
    runs: list[int] = []

    @group.coalesce(key=lambda: "k")
    def slow() -> str:
        runs.append(1)
        started.set()
        assert release.wait(30)
        return "landed"

    leader = Background(lambda: slow.options(timeout=0.2)())
    assert started.wait(15)
    joiner = Background(lambda: slow.options()())
    wait_until(lambda: group.stats().joins >= 1, "the second call joined")
    with pytest.raises(TimeoutError):
        leader.wait()
    release.set()
    result = joiner.wait()
    assert (result.value, result.joined, runs) == ("landed", True, [1])


def test_fresh_waits_for_the_running_flight_and_gets_the_next(group: FlightGroup) -> None:
    """fresh=True accepts only a flight that starts after the call: a greater token and
    a second run."""
    started, release = threading.Event(), threading.Event()
    runs: list[int] = []

    @group.coalesce(key=lambda: "k")
    def load() -> int:
        runs.append(1)
        if len(runs) == 1:
            started.set()
            assert release.wait(30)
        return len(runs)

    first = Background(lambda: load.options()())
    assert started.wait(15)
    fresh = Background(lambda: load.options(fresh=True)())
    wait_until(lambda: group.stats().calls >= 2, "the fresh call arrived")
    release.set()
    old, new = first.wait(), fresh.wait()
    assert (old.value, new.value) == (1, 2)
    assert new.token > old.token and new.joined is False


def test_a_timeout_of_zero_neither_leads_nor_joins(group: FlightGroup) -> None:
    """timeout=0 raises TimeoutError at once; the work never runs."""
    runs: list[int] = []

    @group.coalesce(key=lambda: "k")
    def load() -> int:
        runs.append(1)
        return 1

    with pytest.raises(TimeoutError):
        load.options(timeout=0)()
    assert runs == [] and group.stats().calls == 0


def test_bad_options_are_refused_when_the_form_is_made(group: FlightGroup) -> None:
    """options() checks its arguments as run() does, before any call."""

    @group.coalesce(key=lambda: "k")
    def load() -> int:
        return 1

    with pytest.raises(TypeError):
        load.options(fresh=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        load.options(on_join="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        load.options(timeout=-1.0)
