"""docs/api.md, Calls: ``fresh=True`` accepts only a flight that starts after the call; the
fresh callers that arrive during one running flight share the next one."""

from __future__ import annotations

import threading

from flightgroup import FlightGroup, Retention

from ...ingroup import Background
from ...support import wait_until
from .conftest import Leader, Scope, never


def _fresh_call(g: FlightGroup, key: str, value: str, ran: list[str]) -> Background:
    def work() -> str:
        ran.append(value)
        return value

    return Background(lambda: g.run_sync(key, work, fresh=True))


def test_a_fresh_call_waits_for_the_running_flight_and_leads_the_next(
    group: FlightGroup,
) -> None:
    leader = Leader(group, "k", "old")
    ran: list[str] = []
    fresh = _fresh_call(group, "k", "new", ran)
    wait_until(lambda: group.stats().calls == 2, "the fresh call arrived")
    assert not fresh.done.is_set()  # it does not take the running flight
    leader.release()
    led, got = leader.result(), fresh.wait()
    assert (got.value, got.joined, ran) == ("new", False, ["new"])
    assert got.token > led.token


def test_fresh_callers_during_one_flight_share_the_next(group: FlightGroup) -> None:
    leader = Leader(group, "k", "old")
    ran: list[str] = []
    fresh = [_fresh_call(group, "k", f"new{i}", ran) for i in range(3)]
    wait_until(lambda: group.stats().calls == 4, "every fresh call arrived")
    leader.release()
    results = [each.wait() for each in fresh]
    assert len(ran) == 1  # one next flight for all three
    assert {r.value for r in results} == {ran[0]}
    assert sorted(r.joined for r in results) == [False, True, True]
    assert len({r.token for r in results}) == 1


def test_a_fresh_call_elsewhere_takes_only_a_flight_that_began_after_it(
    pair: tuple[FlightGroup, ...],
) -> None:
    a, b = pair
    leader = Leader(a, "k", "old")
    ran: list[str] = []
    fresh = _fresh_call(b, "k", "new", ran)
    wait_until(lambda: b.stats().calls == 1, "the fresh call arrived")
    leader.release()
    led, got = leader.result(), fresh.wait()
    assert got.value == "new" and got.token > led.token


def test_a_fresh_call_is_never_served_a_kept_outcome(scope: Scope) -> None:
    g = scope.group(retention=Retention(success=60))
    assert g.run_sync("k", lambda: "kept").value == "kept"
    served = g.run_sync("k", never)
    assert (served.value, served.joined) == ("kept", True)
    fresh = g.run_sync("k", lambda: "fresh", fresh=True)
    assert (fresh.value, fresh.joined) == ("fresh", False)


def test_a_plain_call_during_a_flight_joins_it_while_a_fresh_one_waits(
    group: FlightGroup,
) -> None:
    leader = Leader(group, "k", "old")
    joined = threading.Event()
    plain = Background(lambda: group.run_sync("k", never, on_join=joined.set))
    assert joined.wait(15)
    ran: list[str] = []
    fresh = _fresh_call(group, "k", "new", ran)
    leader.release()
    assert plain.wait().value == "old"
    assert fresh.wait().value == "new"
