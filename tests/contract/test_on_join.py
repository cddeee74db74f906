"""A joiner's on_join in the wide scopes waits for the scope's answer to its process's
flight: docs/api.md calls on_join "never for a call served from a kept outcome", and a local
joiner that came while the first caller's request was out may be served by one.

Each test holds the request to the scope (the group's ``submit``) until the local joiners
are registered, so they come before the answer; nothing waits on a bare sleep.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flightgroup import JSON, FlightGroup, Retention

from ..infleet import fleet_group, never
from ..infresh import held
from ..ingroup import Background
from ..support import scope_of, wait_until

pytestmark = pytest.mark.timeout(60)

JOINERS = 8


class HeldAsk:
    """Holds ``g``'s next request to its scope (the first caller's ``submit``)."""

    def __init__(self, g: FlightGroup, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reached, self.go = threading.Event(), threading.Event()
        arbiter = scope_of(g)
        original = type(arbiter).submit

        def submit(of: Any, *args: Any, **options: Any) -> Any:
            if of is arbiter:
                self.reached.set()
                assert self.go.wait(20)
            return original(of, *args, **options)

        monkeypatch.setattr(type(arbiter), "submit", submit)


def _joins(g: FlightGroup, count: int) -> None:
    wait_until(lambda: g.stats().joins >= count, f"{count} joins registered")


def _held_herd(
    g: FlightGroup, monkeypatch: pytest.MonkeyPatch, work: Callable[[], Any]
) -> tuple[HeldAsk, Background, list[Background], list[int]]:
    """g's first caller of "k" (on_join tells 0) asks the scope, held; JOINERS callers
    (on_join tells 1..JOINERS) join its flight here before the answer. Returns the
    hold, the first caller, the joiners and what their on_joins told."""
    hold = HeldAsk(g, monkeypatch)
    told: list[int] = []
    first = Background(lambda: g.run_sync("k", work, on_join=lambda: told.append(0)))
    assert hold.reached.wait(10)
    joiners = [
        Background(lambda i=i: g.run_sync("k", never, on_join=lambda: told.append(i)))
        for i in range(1, JOINERS + 1)
    ]
    _joins(g, JOINERS)  # every one joined the local flight before the answer
    return hold, first, joiners, told


@pytest.fixture(params=["directory", "fleet"])
def kept_pair(request: pytest.FixtureRequest) -> Iterator[tuple[FlightGroup, FlightGroup]]:
    """Two groups of one wide scope that keep values for a minute."""
    keep = Retention(success=60.0)
    if request.param == "directory":
        d = request.getfixturevalue("directory")
        made = [FlightGroup(directory=d, codec=JSON, retention=keep) for _ in "ab"]
    else:
        url = request.getfixturevalue("redis_server").url
        ns = request.getfixturevalue("namespace")
        made = [fleet_group(url, ns, retention=keep) for _ in "ab"]
    try:
        yield made[0], made[1]
    finally:
        for g in made:
            g.close()


def test_local_joiners_of_a_call_the_scope_serves_kept_never_call_on_join(
    kept_pair: tuple[FlightGroup, FlightGroup], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = kept_pair
    assert a.run_sync("k", lambda: "kept").value == "kept"  # kept in the scope
    hold, first, joiners, told = _held_herd(b, monkeypatch, never)
    hold.go.set()
    results = [first.wait(), *(j.wait() for j in joiners)]
    assert [(r.value, r.joined) for r in results] == [("kept", True)] * (JOINERS + 1)
    assert told == []


def test_an_async_herd_served_kept_never_calls_on_join(
    kept_pair: tuple[FlightGroup, FlightGroup],
) -> None:
    # The tasks of one gather all run (the first asks the scope, the others join it
    # here) before the loop can take the scope's answer.
    a, b = kept_pair
    assert a.run_sync("k", lambda: "kept").value == "kept"
    told: list[None] = []

    async def herd() -> list[Any]:
        async def work() -> str:
            raise AssertionError("the kept value serves it")

        return await asyncio.gather(
            *(b.run("k", work, on_join=lambda: told.append(None)) for _ in range(50))
        )

    results = asyncio.run(herd())
    assert b.stats().joins == 50
    assert {(r.value, r.joined) for r in results} == {("kept", True)}
    assert told == []


def test_local_joiners_call_on_join_once_the_work_runs_here(
    kept_pair: tuple[FlightGroup, FlightGroup], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, b = kept_pair
    runs: list[str] = []
    started, release = threading.Event(), threading.Event()
    hold, first, joiners, told = _held_herd(b, monkeypatch, held(runs, "first", started, release))
    assert told == []  # not yet: the scope has not answered
    hold.go.set()
    assert started.wait(10)
    # Each joiner's on_join runs before the outcome comes: the work is still held.
    wait_until(lambda: len(told) == JOINERS, "every joiner's on_join")
    assert sorted(told) == list(range(1, JOINERS + 1)) and not release.is_set()
    release.set()
    assert (first.wait().value, first.wait().joined) == ("first", False)
    assert {(j.wait().value, j.wait().joined) for j in joiners} == {("first", True)}
    assert runs == ["first"] and len(told) == JOINERS
    assert b.stats().joins == JOINERS  # each counted once, not again on waking


def test_local_joiners_call_on_join_once_the_flight_joins_one_led_elsewhere(
    kept_pair: tuple[FlightGroup, FlightGroup], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = kept_pair
    runs: list[str] = []
    started, release = threading.Event(), threading.Event()
    leader = Background(lambda: a.run_sync("k", held(runs, "a", started, release)))
    assert started.wait(10)
    hold, first, joiners, told = _held_herd(b, monkeypatch, never)
    hold.go.set()
    # b's flight joined a's: its first caller and every local joiner are joiners now.
    wait_until(lambda: len(told) == JOINERS + 1, "every on_join of b's callers")
    assert sorted(told) == list(range(JOINERS + 1)) and not release.is_set()
    release.set()
    assert leader.wait().value == "a"
    assert {(r.value, r.joined) for r in (first.wait(), *(j.wait() for j in joiners))} == {
        ("a", True)
    }
    assert runs == ["a"]


def test_a_joiner_whose_waiting_on_join_raises_withdraws_alone(
    kept_pair: tuple[FlightGroup, FlightGroup], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, b = kept_pair
    hold = HeldAsk(b, monkeypatch)
    runs: list[str] = []
    started, release = threading.Event(), threading.Event()
    first = Background(lambda: b.run_sync("k", held(runs, "first", started, release)))
    assert hold.reached.wait(10)

    def refuse() -> None:
        raise LookupError("no, thanks")

    quitter = Background(lambda: b.run_sync("k", never, on_join=refuse))
    told: list[None] = []
    stayer = Background(lambda: b.run_sync("k", never, on_join=lambda: told.append(None)))
    _joins(b, 2)
    hold.go.set()
    with pytest.raises(LookupError, match="no, thanks"):
        quitter.wait()
    assert started.is_set() and not release.is_set()  # it left while the work ran
    release.set()
    assert first.wait().value == stayer.wait().value == "first"
    assert told == [None] and runs == ["first"]


def test_a_joiner_that_times_out_before_the_answer_never_calls_on_join(
    kept_pair: tuple[FlightGroup, FlightGroup], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, b = kept_pair
    hold = HeldAsk(b, monkeypatch)
    runs: list[str] = []
    first = Background(lambda: b.run_sync("k", lambda: runs.append("first") or "first"))
    assert hold.reached.wait(10)
    told: list[None] = []
    late = Background(
        lambda: b.run_sync("k", never, on_join=lambda: told.append(None), timeout=0.05)
    )
    with pytest.raises(TimeoutError):
        late.wait()  # the answer is still held
    hold.go.set()
    assert first.wait().value == "first"
    assert told == [] and runs == ["first"]


async def _async_joiners(
    g: FlightGroup, release: asyncio.Event, told: list[int]
) -> tuple[Any, list[Any]]:
    async def work() -> str:
        await release.wait()
        return "first"

    first = asyncio.ensure_future(g.run("k", work))
    await asyncio.sleep(0)  # the first caller leads here and asks the scope
    joiners = [
        asyncio.ensure_future(g.run("k", work, on_join=lambda i=i: told.append(i)))
        for i in range(JOINERS)
    ]
    while len(told) < JOINERS:  # woken one by one as the scope lets the work run here
        await asyncio.sleep(0.001)
    release.set()
    return await first, await asyncio.gather(*joiners)


def test_async_local_joiners_call_on_join_once_the_work_runs_here(
    kept_pair: tuple[FlightGroup, FlightGroup],
) -> None:
    _, b = kept_pair
    told: list[int] = []

    async def main() -> tuple[Any, list[Any]]:
        return await _async_joiners(b, asyncio.Event(), told)

    first, joiners = asyncio.run(main())
    assert (first.value, first.joined) == ("first", False)
    assert {(r.value, r.joined) for r in joiners} == {("first", True)}
    assert sorted(told) == list(range(JOINERS))
    assert b.stats().joins == JOINERS
