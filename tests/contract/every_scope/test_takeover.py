"""Takeover of an interrupted flight (``takeover=N``), in every scope.

A flight that ends with no outcome (its leader was stopped by a BaseException; in a
wide scope also: its leader's process died, its lease was lost, its group closed) fails
its joiners with FlightInterruptedError by default. With ``takeover=N`` each such
joiner calls again, N times at most: one of them leads the key's next flight (under a
greater token) and the others join it. In the process scope the joiners share the
leader's group; in a wide scope they are another "process" (a pair of groups).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from flightgroup import FlightGroup, FlightInterruptedError, current_lease

from ...ingroup import Background
from ...support import wait_until
from .conftest import Leader, Scope


class Stop(BaseException):
    """Stops a work as an interrupt would (not an Exception: no outcome)."""


def _groups(scope: Scope, takeover: int) -> tuple[FlightGroup, FlightGroup]:
    """The leader's group and the joiners' (the same one in the process scope)."""
    if not scope.expect.wide:
        g = scope.group(takeover=takeover)
        return g, g
    return scope.group(), scope.group(takeover=takeover)


class Joiners:
    """``n`` callers of ``key`` in ``g`` that have joined its running flight; each one's
    own work counts its runs and returns ``value`` (or raises ``stop``)."""

    def __init__(
        self,
        g: FlightGroup,
        key: str,
        n: int,
        value: Any = "again",
        stop: bool = False,
        mode: str = "sync",
    ) -> None:
        self.runs = 0
        self.on_joins = 0
        lock = threading.Lock()

        def work() -> Any:
            with lock:
                self.runs += 1
            if stop:
                raise Stop()
            return value

        def on_join() -> None:
            with lock:
                self.on_joins += 1

        joined = [threading.Event() for _ in range(n)]

        async def async_work() -> Any:
            return work()

        def call(event: threading.Event) -> Any:
            def joining() -> None:
                on_join()
                event.set()

            if mode == "async":  # each on a loop of its own
                return asyncio.run(g.run(key, async_work, on_join=joining))
            return g.run_sync(key, work, on_join=joining)

        self.calls = [Background(lambda e=e: call(e)) for e in joined]
        for event in joined:
            assert event.wait(15), "a joiner never joined"

    def outcomes(self) -> list[Any]:
        """Each call's Result, or the exception it raised."""
        ended: list[Any] = []
        for call in self.calls:
            assert call.done.wait(30), "a joiner never ended"
            ended.append(call.error if call.error is not None else call.result)
        return ended


def test_joiners_of_an_interrupted_flight_raise_by_default(scope: Scope) -> None:
    """takeover=0 (the default): every joiner of an interrupted flight raises
    FlightInterruptedError, and its own work never runs."""
    a, b = _groups(scope, takeover=0)
    leader = Leader(a, "k", error=Stop())
    joiners = Joiners(b, "k", 3)
    leader.release()
    with pytest.raises(Stop):
        leader.call.wait()
    assert all(isinstance(o, FlightInterruptedError) for o in joiners.outcomes())
    assert joiners.runs == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_one_joiner_takes_an_interrupted_flight_over_and_the_others_join_it(
    scope: Scope, mode: str
) -> None:
    """takeover=1: the leader is stopped; its joiners do not fail: the work runs once more,
    in one of them, and every joiner gets that run's value under a greater token. Each
    joiner's on_join ran once, not again for the takeover."""
    a, b = _groups(scope, takeover=1)
    leader = Leader(a, "k", error=Stop())
    joiners = Joiners(b, "k", 5, mode=mode)
    leader.release()
    with pytest.raises(Stop):
        leader.call.wait()
    ended = joiners.outcomes()
    assert not [o for o in ended if isinstance(o, BaseException)], ended
    assert {o.value for o in ended} == {"again"}
    assert sorted(o.joined for o in ended) == [False, True, True, True, True]
    assert len({o.token for o in ended}) == 1
    assert joiners.runs == 1 and leader.runs == 1  # the work ran twice in all
    assert joiners.on_joins == 5


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("takeover", [1, 2])
def test_takeovers_are_bounded_per_call(scope: Scope, takeover: int, mode: str) -> None:
    """Each takeover flight is stopped too: after ``takeover`` of them the joiners raise
    FlightInterruptedError (each takeover's leader raises its own interrupt)."""
    a, b = _groups(scope, takeover=takeover)
    leader = Leader(a, "k", error=Stop())
    joiners = Joiners(b, "k", 4, stop=True, mode=mode)
    leader.release()
    with pytest.raises(Stop):
        leader.call.wait()
    ended = joiners.outcomes()
    stopped = [o for o in ended if isinstance(o, Stop)]
    interrupted = [o for o in ended if isinstance(o, FlightInterruptedError)]
    assert (len(stopped), len(interrupted)) == (takeover, 4 - takeover), ended
    assert joiners.runs == takeover


def test_a_decorated_functions_takeover_is_its_own_policy(scope: Scope) -> None:
    """``takeover`` given to coalesce() takes the operation's interrupted flights over,
    whatever its group says."""
    g = scope.group()
    runs: list[str] = []
    started, release = threading.Event(), threading.Event()

    @g.coalesce(key=lambda who: who, takeover=1)
    def fetch(who: str) -> str:
        runs.append(who)
        if len(runs) == 1:
            started.set()
            release.wait(15)
            raise Stop()
        return "again"

    first = Background(lambda: fetch("k"))
    assert started.wait(15)
    joined = [Background(lambda: fetch("k")) for _ in range(3)]
    wait_until(lambda: g.stats().joins >= 3, "the joiners wait")
    release.set()
    with pytest.raises(Stop):
        first.wait()
    assert [j.wait() for j in joined] == ["again"] * 3
    assert len(runs) == 2


def test_the_joiners_elsewhere_take_over_a_flight_whose_leaders_group_closed(wide: Scope) -> None:
    """The leader's group closes while its work runs: its joiners in another "process" take
    the flight over (in the directory once the closed group's work let go of its key)."""
    a, b = wide.group(), wide.group(takeover=1)
    leader = Leader(a, "k", "first")
    joiners = Joiners(b, "k", 3)
    closing = Background(a.close)
    assert closing.done.wait(15)
    leader.release()  # its work ends; its own caller got GroupClosedError
    ended = joiners.outcomes()
    assert {o.value for o in ended if not isinstance(o, BaseException)} == {"again"}, ended
    assert joiners.runs == 1 and leader.runs == 1


def test_the_joiners_take_over_a_flight_whose_lease_was_lost(losable: Scope) -> None:
    """The leader's lease is taken away: its joiners elsewhere take the flight over under
    a greater token, while its leader raises LeaseLostError."""
    from flightgroup import LeaseLostError

    from .conftest import lose_lease

    a, b = losable.group(), losable.group(takeover=1)
    started = threading.Event()

    def work() -> str:
        started.set()
        lease = current_lease()
        while not lease.lost:
            threading.Event().wait(0.01)
        return "stale"

    leader = Background(lambda: a.run_sync("k", work))
    assert started.wait(15)
    joiners = Joiners(b, "k", 3)
    lose_lease(losable, "k")
    with pytest.raises(LeaseLostError):
        leader.wait()
    ended = joiners.outcomes()
    assert not [o for o in ended if isinstance(o, BaseException)], ended
    assert {o.value for o in ended} == {"again"} and joiners.runs == 1
