"""docs/api.md, Groups and Outcomes ("Closing a group"): waiting calls raise GroupClosedError,
the flights the group leads are interrupted for their joiners elsewhere, their work runs
on to its end, and close() does not wait for it."""

from __future__ import annotations

import threading

import pytest

from flightgroup import FlightGroup, FlightInterruptedError, GroupClosedError

from ...support import run
from .conftest import Leader, Scope, joiner, never, raised


def test_closing_wakes_the_leader_and_the_joiners_with_group_closed(group: FlightGroup) -> None:
    ended = threading.Event()
    leader = Leader(group, "k", "v", before=ended.set, timeout=60)  # the caller only waits
    waiting = joiner(group, "k")
    group.close()  # returns without waiting for the work
    assert isinstance(raised(leader.call), GroupClosedError)
    assert isinstance(raised(waiting), GroupClosedError)
    assert not ended.is_set()
    leader.release()  # the work runs on to its end
    assert ended.wait(15)


def test_closing_interrupts_the_joiners_elsewhere(pair: tuple[FlightGroup, ...]) -> None:
    a, b = pair
    leader = Leader(a, "k", "v", timeout=60)
    elsewhere = joiner(b, "k")
    a.close()
    interrupted = raised(elsewhere)
    assert isinstance(interrupted, FlightInterruptedError) and interrupted.key == "k"
    assert isinstance(raised(leader.call), GroupClosedError)
    leader.release()


def test_the_other_process_goes_on_after_one_closed(wide: Scope) -> None:
    a, b = wide.pair()
    a.run_sync("k", lambda: 1)
    a.close()
    assert b.run_sync("k", lambda: 2).value == 2


def test_close_twice_and_the_context_managers_close(scope: Scope) -> None:
    g = scope.group()
    with g:
        assert g.run_sync("k", lambda: 1).value == 1
    assert g.closed
    g.close()
    with pytest.raises(GroupClosedError):
        g.run_sync("k", never)

    async def scenario() -> None:
        async with scope.group() as h:
            assert (await h.run("k", _one)).value == 1
        assert h.closed
        await h.aclose()

    run(scenario())


async def _one() -> int:
    return 1
