"""Retention: a kept outcome is never served after a newer flight of its key ended,
whatever that flight's own outcome (kept or not), in every scope; and the directory's
kept outcomes that ran out leave before a live one is evicted.

docs/api.md: `fresh=True` reads your own writes, and a kept outcome is served "until its time
runs out or it is evicted (LRU by items, then by encoded bytes)". A newer flight's
outcome that is not kept ends the older kept one in the process and directory scopes
(the fleet's record is replaced when the newer flight leads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flightgroup import JSON, FlightFailedError, FlightGroup, Retention

from ..infleet import fleet_group
from ..ingroup import close
from ..support import scope_of

pytestmark = pytest.mark.timeout(60)

Make = Callable[..., FlightGroup]


@pytest.fixture(params=["process", "directory", "fleet"])
def make(request: pytest.FixtureRequest) -> Iterator[Make]:
    made: list[FlightGroup] = []

    def new(**options: Any) -> FlightGroup:
        if request.param == "process":
            group = FlightGroup(**options)
        elif request.param == "directory":
            group = FlightGroup(
                directory=request.getfixturevalue("directory"), codec=JSON, **options
            )
        else:
            url = request.getfixturevalue("redis_server").url
            group = fleet_group(url, request.getfixturevalue("namespace"), **options)
        made.append(group)
        return group

    yield new
    close(*made)


def _fails() -> str:
    raise ValueError("backend down")


def test_a_fresh_success_that_is_not_kept_ends_the_older_kept_failure(make: Make) -> None:
    g = make(retention=Retention(success=None, error=60.0))
    with pytest.raises(ValueError):
        g.run_sync("k", _fails)  # kept for 60 s
    with pytest.raises(FlightFailedError):
        g.run_sync("k", lambda: "unused")  # served from it
    assert g.run_sync("k", lambda: "written", fresh=True).value == "written"
    later = g.run_sync("k", lambda: "read again")
    assert (later.value, later.joined) == ("read again", False)


def test_a_fresh_failure_that_is_not_kept_ends_the_older_kept_value(make: Make) -> None:
    g = make(retention=Retention(success=60.0))
    assert g.run_sync("k", lambda: "old").value == "old"
    assert g.run_sync("k", lambda: "unused").value == "old"  # kept
    with pytest.raises(ValueError):
        g.run_sync("k", _fails, fresh=True)
    later = g.run_sync("k", lambda: "new")
    assert (later.value, later.joined) == ("new", False)


def test_the_directory_drops_kept_outcomes_that_ran_out_before_evicting_a_live_one(
    directory: str,
) -> None:
    from flightgroup.directory.client import DirectoryArbiter

    g = FlightGroup(directory=directory, codec=JSON, retention=Retention(max_items=2))
    brief = g.coalesce(
        key=lambda: "brief", name="brief", retention=Retention(success=1e-6, max_items=2)
    )(lambda: "gone soon")
    try:
        assert g.run_sync("live", lambda: "kept").value == "kept"  # 30 s, the default
        assert brief() == "gone soon"  # kept a microsecond: it ran out at once
        assert g.run_sync("new", lambda: "kept too").value == "kept too"
        again = g.run_sync("live", lambda: "ran again")
        # Two slots: the one that ran out goes, the live one stays.
        assert (again.value, again.joined) == ("kept", True)
        arbiter = scope_of(g)
        assert isinstance(arbiter, DirectoryArbiter) and arbiter._state.coordinator is not None
        assert len(arbiter._state.coordinator._term.outcomes.kept) == 2
    finally:
        close(g)


def test_a_fresh_flight_whose_leader_vanished_ends_the_older_kept_outcome(
    directory: str,
) -> None:
    """The directory's flight ends without a landing (its leader's connection closed:
    the process died): the older kept outcome goes too, as for a landing that keeps
    nothing."""
    import os

    from ..dirproc import HELLO_OK, RawConn
    from ..ingroup import arbiter, coordinating
    from ..support import wait_until

    a = coordinating(directory, retention=Retention(success=60.0))
    try:
        assert a.run_sync("k", lambda: "old").value == "old"
        assert a.run_sync("k", lambda: "unused").value == "old"  # kept
        coordinator = arbiter(a)._state.coordinator
        assert coordinator is not None
        with RawConn(os.path.join(directory, "flight.sock")) as leader:
            assert leader.hello() == HELLO_OK
            leader.send_frame({"op": "run", "id": 1, "key": "k", "fresh": True})
            leader.expect("lead")
        # Its connection closed with the lead: the flight is interrupted.
        wait_until(lambda: "k" not in coordinator._term.flights, "the fresh flight ended")
        later = a.run_sync("k", lambda: "new")
        assert (later.value, later.joined) == ("new", False)
    finally:
        close(a)
