"""forget() in a wide scope against a call of its own group made while it runs: the
group forgets the key in its table, then tells the scope. A call that came in between
made a local flight whose request could reach the scope before the forget and join the
old flight; after forget() returned, that local flight stayed in the table until the
scope's notice reached it (a read on the group's thread), so a call made after forget()
returned joined it and got the old outcome, although API.md says the next call leads a
new flight. Found by a chaos soak of the fleet scope (2026-12-01); the directory scope had
the same window. The test puts a call in that window by hand.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from flightgroup import current_lease

from .infleet import fleet_of
from .ingroup import Background
from .support import wait_until

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
        arbiter = forgetter._arbiter
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
    caller must not take that local flight: t2 began before its call (API.md: "fresh=True
    accepts only a flight that starts after its call"). It waits for t2's end and takes
    the flight after it. Found by a chaos soak of the fleet scope (2026-12-01)."""
    from .infleet import fleet_group

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
        flight = a._table.flights["k"]  # t1's local flight: A has not heard yet
        fresh = Background(lambda: a.run_sync("k", work("t3"), fresh=True))
        wait_until(lambda: bool(flight.fresh), "the fresh caller waits for t1's end")
        # A hears of the forget at a renewal (RENEW answers "parked"): the test renews
        # now, on A's own loop, instead of waiting a third of the lease.
        arbiter = fleet_of(a)
        [lead] = list(arbiter._leads)
        asyncio.run_coroutine_threadsafe(
            arbiter._renew_some([(lead, lead.token, lead.moves)]), arbiter._loop
        ).result(10)
        wait_until(lambda: a._table.flights.get("k") is not flight, "A dropped t1")
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
