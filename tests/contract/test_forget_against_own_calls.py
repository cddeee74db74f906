"""forget() in a wide scope against a call of its own group made while it runs: the group
forgets the key in its table, then tells the scope. A call that comes in between makes a
local flight whose request may reach the scope before the forget and join the old
flight; once forget() returned, that local flight is out of the table at once (not when
the scope's notice reaches it), so a call made after forget() returned leads a new
flight (docs/api.md) and never gets the old outcome, in the fleet scope and the directory
scope alike. The test puts a call in that window by hand.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from flightgroup import current_lease

from ..infleet import fleet_of
from ..ingroup import Background
from ..support import flight_of, scope_of, wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_call_after_forget_returned_never_joins_the_old_flight(
    pair: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    leader, forgetter = pair
    started, release = threading.Event(), threading.Event()

    def old() -> str:
        started.set()
        assert release.wait(20)
        return "old"

    outer = Background(lambda: leader.run_sync("k", old))
    in_between: list[Background] = []
    try:
        assert started.wait(20)
        arbiter = scope_of(forgetter)
        real_forget = arbiter.forget

        def forget(*args: Any, **kwargs: Any) -> Any:
            # A call of this group between its table's forget and the scope's: it asks
            # the scope first, and joins the old flight.
            call = Background(lambda: forgetter.run_sync("k", lambda: "between"))
            in_between.append(call)
            wait_until(lambda: forgetter.stats().joins >= 1, "the call joined the old flight")
            return real_forget(*args, **kwargs)

        monkeypatch.setattr(arbiter, "forget", forget)
        forgetter.forget("k")
        monkeypatch.undo()
        after = Background(lambda: forgetter.run_sync("k", lambda: "new"))
        # The directory's new leader waits for the old flight's key lock: let it end.
        release.set()
        result = after.wait()
        assert (result.value, result.joined) == ("new", False), result
        assert outer.wait().value == "old"
        assert in_between[0].wait().value == "old"  # it did join the old flight
    finally:
        release.set()


def test_fresh_callers_of_a_flight_forgotten_elsewhere_wait_for_the_keys_next_flight(
    redis_server: Any, namespace: str
) -> None:
    """B forgets k and leads t2 at once; a fresh caller comes to A while A's table still
    holds t1 (A hears of the forget at its next renewal). A then drops t1 from its table,
    and a plain caller makes a new local flight, which joins t2. When t1 ends, its fresh
    caller must not take that local flight: t2 began before its call (docs/api.md: "fresh=True
    accepts only a flight that starts after its call"). It waits for t2's end and takes
    the flight after it."""
    from ..infleet import fleet_group

    a = fleet_group(redis_server.url, namespace, lease=30.0)  # no renewal of its own
    b = fleet_group(redis_server.url, namespace, lease=30.0)
    began: dict[str, int] = {}
    release = {name: threading.Event() for name in ("t1", "t2")}

    def work(name: str) -> Any:
        def run() -> str:
            began[name] = current_lease().token
            if name in release:
                assert release[name].wait(20)
            return name

        return run

    try:
        t1 = Background(lambda: a.run_sync("k", work("t1")))
        wait_until(lambda: "t1" in began, "t1 runs")
        b.forget("k")
        t2 = Background(lambda: b.run_sync("k", work("t2")))
        wait_until(lambda: "t2" in began, "t2 runs")
        flight = flight_of(a, "k")  # t1's local flight: A has not heard yet
        fresh = Background(lambda: a.run_sync("k", work("t3"), fresh=True))
        wait_until(lambda: bool(flight.fresh), "the fresh caller waits for t1's end")
        # A hears of the forget at a renewal (RENEW answers "parked"): the test renews
        # now, on A's own loop, instead of waiting a third of the lease.
        arbiter = fleet_of(a)
        [lead] = list(arbiter._leads)
        asyncio.run_coroutine_threadsafe(
            arbiter._renewal.renew_some([(lead, lead.token, lead.moves)]), arbiter._background.loop
        ).result(10)
        wait_until(lambda: flight_of(a, "k") is not flight, "A dropped t1")
        plain = Background(lambda: a.run_sync("k", work("never")))
        wait_until(lambda: a.stats().joins >= 1, "the plain call joined t2")
        release["t1"].set()
        assert t1.wait().value == "t1"
        assert not fresh.done.is_set(), "the fresh caller took t2, which began before it"
        release["t2"].set()
        assert t2.wait().value == "t2"
        assert plain.wait().value == "t2"
        got = fresh.wait()
        assert got.value == "t3" and got.token == began["t3"] > began["t2"], got
    finally:
        for event in release.values():
            event.set()
        a.close()
        b.close()


def test_a_fresh_caller_promoted_before_its_flight_moved_joins_that_flight(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W, a sync fresh caller of F, is promoted to a joiner of F (F's work ran here) and
    reads its signal late; meanwhile F is forgotten, and when it ends its other fresh
    caller X goes on waiting for the key's next local flight G (F.moved). W must still
    join F, the flight that promoted it, never read its signal through F's link to G (a
    GroupClosedError from an open group, or a claim it never held). W's thread is held at
    the entry of signal_of to open the window a descheduled thread has."""
    from flightgroup import JSON, FlightGroup
    from flightgroup.scope.table import WideTable

    hold = threading.Event()
    real = WideTable.signal_of

    def held(*args: Any) -> Any:
        if threading.current_thread().name == "W":
            assert hold.wait(30)
        return real(*args)

    monkeypatch.setattr(WideTable, "signal_of", held)
    g = FlightGroup(directory=directory, codec=JSON)
    release = {name: threading.Event() for name in ("E", "F", "X", "G")}
    began: set[str] = set()

    def work(name: str) -> Any:
        def run() -> str:
            began.add(name)
            assert release[name].wait(30)
            return name

        return run

    try:
        e = Background(lambda: g.run_sync("k", work("E")))
        wait_until(lambda: "E" in began, "E runs")
        g.forget("k")
        f = Background(lambda: g.run_sync("k", work("F")))
        wait_until(lambda: flight_of(g, "k") is not None, "F is the key's flight")
        flight_f = flight_of(g, "k")
        w = Background(lambda: g.run_sync("k", lambda: "W led", fresh=True), name="W")
        wait_until(lambda: bool(flight_f.fresh), "W waits for F's end")
        release["E"].set()  # F takes the key lock: its work runs here, W is promoted
        wait_until(lambda: "F" in began and bool(flight_f.promoted), "W promoted into F")
        x = Background(lambda: g.run_sync("k", work("X"), fresh=True))
        wait_until(lambda: bool(flight_f.fresh), "X waits for F's end")
        g.forget("k")
        later = Background(lambda: g.run_sync("k", work("G")))
        wait_until(lambda: flight_of(g, "k") not in (None, flight_f), "G took the key")
        release["F"].set()  # F ends: X goes on waiting for G's end
        wait_until(lambda: flight_f.moved, "X moved on to G")
        hold.set()
        got = w.wait()
        assert (got.value, got.joined) == ("F", True), got
        release["G"].set()
        release["X"].set()
        assert e.wait().value == "E" and f.wait().value == "F"
        assert later.wait().value == "G"
        assert x.wait().value in ("G", "X")  # promoted into G, or the flight after it
    finally:
        hold.set()
        for event in release.values():
            event.set()
        g.close()
