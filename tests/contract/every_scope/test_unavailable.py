"""A wide scope that cannot be reached: ``on_unavailable`` says what calls do.

``"raise"`` (the default): every caller raises UnavailableError. ``"local"``: the callers
of a key coalesce within this process alone, with the process scope's guarantees; the
group counts those flights (``Stats.local_flights``) and logs the first of an outage.
Run over each wide scope made unreachable for real: the fake by its hook, the fleet
with nothing listening on its port, the directory with a coordinator that holds the
election and never answers (``reconnect_timeout`` short).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from flightgroup import JSON, FlightGroup, UnavailableError
from flightgroup.testing import FakeCoordinator

from ...dirproc import Harness
from ...ingroup import Background
from .conftest import WIDE, Leader


def _never() -> Any:
    raise AssertionError("a joiner's work never runs")


class Down:
    """Groups of one wide scope that cannot be reached (see the module)."""

    def __init__(self, id: str) -> None:
        self.id = id
        self.fake: FakeCoordinator | None = None
        self._made: list[FlightGroup] = []
        self._frozen: socket.socket | None = None
        self._harness: Harness | None = None
        # (fleet) bound and never listening: refused, and no other test's server takes it
        self._refusing = socket.socket()
        self._refusing.bind(("127.0.0.1", 0))
        self._port = self._refusing.getsockname()[1]
        if id == "fake":
            self.fake = FakeCoordinator()
            self.fake.unreachable()
        elif id == "directory":
            self._harness = harness = Harness()
            os.makedirs(harness.dir, mode=0o700)
            harness.take_election()  # the frozen coordinator holds the election
            frozen = self._frozen = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            frozen.bind(harness.path("flight.sock"))
            frozen.listen(64)  # connections queue; nobody accepts or answers them

    def group(self, **options: Any) -> FlightGroup:
        if self.fake is not None:
            made = self.fake.group(codec=JSON, **options)
        elif self._harness is not None:
            made = FlightGroup(
                directory=self._harness.dir, codec=JSON, reconnect_timeout=0.2, **options
            )
        else:
            made = FlightGroup(
                redis=f"redis://127.0.0.1:{self._port}/0", namespace="down", codec=JSON,
                **options,
            )
        self._made.append(made)
        return made

    def close(self) -> None:
        for made in self._made:
            made.close()
        if self._frozen is not None:
            self._frozen.close()
        self._refusing.close()
        if self._harness is not None:
            self._harness.cleanup()


@pytest.fixture(params=WIDE)
def down(request: pytest.FixtureRequest) -> Iterator[Down]:
    """Each wide scope, out of reach."""
    made = Down(request.param)
    try:
        yield made
    finally:
        made.close()


def test_callers_raise_unavailable_error_by_default(down: Down) -> None:
    """on_unavailable="raise" (the default): every caller raises UnavailableError naming
    its key, and no work runs."""
    g = down.group()
    for key in ("k", "k", "other"):
        with pytest.raises(UnavailableError) as raised:
            g.run_sync(key, _never)
        assert raised.value.key == key
    stats = g.stats()
    assert (stats.flights, stats.local_flights) == (0, 0)


def test_callers_coalesce_in_this_process_while_the_scope_is_down(down: Down) -> None:
    """on_unavailable="local": the callers of a key share one run in this process; the
    leader gets the value (joined=False), each joiner the same (joined=True, on_join
    called), and the flight counts as a local one."""
    g = down.group(on_unavailable="local")
    leader = Leader(g, "k", "v")  # its work runs until released
    joined = [threading.Event() for _ in range(5)]
    joiners = [
        Background(lambda on_join=on_join: g.run_sync("k", _never, on_join=on_join.set))
        for on_join in joined
    ]
    for on_join in joined:
        assert on_join.wait(15), "a joiner never joined"
    leader.release()
    led = leader.call.wait()
    assert (led.value, led.joined) == ("v", False)
    for joiner in joiners:
        got = joiner.wait()
        assert (got.value, got.joined, got.token) == ("v", True, led.token)
    assert leader.runs == 1
    stats = g.stats()
    assert (stats.calls, stats.flights, stats.joins, stats.local_flights) == (6, 1, 5, 1)


def test_a_local_flights_failure_reaches_its_callers_as_in_the_process_scope(
    down: Down,
) -> None:
    """A local flight's failure: the leader raises the work's error, each joiner
    FlightFailedError with it as ``__cause__`` (the process scope's rows of the table)."""
    from flightgroup import FlightFailedError

    g = down.group(on_unavailable="local")
    leader = Leader(g, "k", error=ValueError("boom"))
    joined = threading.Event()
    joiner = Background(lambda: g.run_sync("k", _never, on_join=joined.set))
    assert joined.wait(15)
    leader.release()
    with pytest.raises(ValueError, match="boom"):
        leader.call.wait()
    with pytest.raises(FlightFailedError) as failed:
        joiner.wait()
    assert isinstance(failed.value.__cause__, ValueError)


def test_on_unavailable_is_per_operation_too(down: Down) -> None:
    """An operation's on_unavailable overrides its group's, both ways."""
    raising, local = down.group(), down.group(on_unavailable="local")

    @raising.coalesce(on_unavailable="local")
    def falls_back() -> str:
        return "here"

    @local.coalesce(on_unavailable="raise")
    def raises() -> str:
        raise AssertionError("never runs")

    assert falls_back() == "here"
    with pytest.raises(UnavailableError):
        raises()
    assert (raising.stats().local_flights, local.stats().local_flights) == (1, 0)


def test_a_local_outcome_is_not_kept(down: Down) -> None:
    """A local flight's outcome is not kept, whatever the Retention: the scope keeps
    outcomes, and one kept here could be served once the scope knows a newer flight."""
    from flightgroup import Retention

    g = down.group(on_unavailable="local", retention=Retention(success=60.0))
    runs: list[int] = []

    def work() -> int:
        runs.append(1)
        return len(runs)

    assert g.run_sync("k", work).value == 1
    assert g.run_sync("k", work).value == 2
    assert g.stats().kept == 0


def test_the_first_local_flight_of_an_outage_is_logged_once(
    down: Down, caplog: pytest.LogCaptureFixture
) -> None:
    """The first local flight of an outage logs one WARNING; later ones log nothing."""
    g = down.group(on_unavailable="local")
    with caplog.at_level(logging.WARNING, logger="flightgroup"):
        for key in ("a", "b", "a"):
            assert g.run_sync(key, lambda: 1).value == 1
    said = [r for r in caplog.records if "on_unavailable='local'" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    assert g.stats().local_flights == 3


def test_new_flights_go_through_the_scope_once_it_is_back() -> None:
    """The fake reachable again: the next call of a key joins the flight another
    "process" leads through the scope; a second outage is logged again."""
    fake = FakeCoordinator()
    g, other = fake.group(codec=JSON, on_unavailable="local"), fake.group(codec=JSON)
    try:
        fake.unreachable()
        assert g.run_sync("k", lambda: "local").value == "local"
        fake.unreachable(False)
        leader = Leader(other, "k", "shared")
        joined = threading.Event()
        joiner = Background(lambda: g.run_sync("k", _never, on_join=joined.set))
        assert joined.wait(15)
        leader.release()
        got = joiner.wait()
        assert (got.value, got.joined) == ("shared", True)
        assert g.stats().local_flights == 1
    finally:
        g.close()
        other.close()
