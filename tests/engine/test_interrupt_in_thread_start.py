"""A KeyboardInterrupt that lands inside ``Thread.start()`` while a sync leader starts
the thread that drives its flight (a ``timeout`` or a ``deadline`` puts the work on a
thread of its own). The thread's start decides: if it got going, the leader withdraws
(the flight goes on for the others, never a work running on with nobody to land it and a
second run of the key beside it); if not, nothing ran and the flight ends interrupted.

The interrupt is placed by wrapping ``Thread.start`` for the driver's thread only: the
real start runs, then (or instead) KeyboardInterrupt is raised, as a SIGINT handled
between those bytecodes would.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ..ingroup import Background
from ..support import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def interrupt_start(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Makes the next start of a ``flightgroup-work-*`` thread raise KeyboardInterrupt,
    after the real start (``after``) or before it."""
    plan: dict[str, Any] = {"after": True, "armed": True}
    original = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if not (plan["armed"] and self.name.startswith("flightgroup-work-")):
            return original(self)
        plan["armed"] = False
        if plan["after"]:
            original(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", start)
    return plan


@pytest.mark.parametrize("scope", ["process", "directory"])
@pytest.mark.parametrize("how", ["timeout", "deadline"])
def test_an_interrupt_once_the_driver_runs_withdraws_the_leader_only(
    request: pytest.FixtureRequest, interrupt_start: dict[str, Any], scope: str, how: str
) -> None:
    from ..ingroup import scope_groups

    [g] = scope_groups(request, scope, 1, lease=5.0)
    runs: list[str] = []
    started, release = threading.Event(), threading.Event()

    def work() -> str:
        runs.append("run")
        started.set()
        assert release.wait(20)
        return "v"

    if how == "deadline":
        call = g.coalesce(key=lambda: "k", deadline=30.0)(work)
    else:
        call = lambda: g.run_sync("k", work, timeout=30.0).value  # noqa: E731
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
        assert started.wait(20), "the driver's thread runs the work"
        # a call made now joins the running flight: no second run beside it
        joiner = Background(call)
        wait_until(lambda: g.stats().joins >= 1 or len(runs) > 1, "the call joined or led")
        release.set()
        assert joiner.wait() == "v"
        assert runs == ["run"]
    finally:
        release.set()
        g.close()


def test_an_interrupt_before_the_driver_started_ends_the_flight_with_nothing_run(
    interrupt_start: dict[str, Any],
) -> None:
    from flightgroup import FlightGroup

    interrupt_start["after"] = False
    g = FlightGroup()
    runs: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        g.run_sync("k", lambda: runs.append("run"), timeout=30.0)
    assert g.stats().in_flight == 0, "the flight ended"
    assert g.run_sync("k", lambda: runs.append("again") or "v").value == "v"
    assert runs == ["again"]


def test_an_interrupt_once_the_follow_thread_runs_leaves_the_local_joiners_be(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other site: a wide scope's leading caller whose flight joined one led
    elsewhere, whose on_join raised, hands the flight to a thread that follows it for its
    local joiners. An interrupt once that thread got going does not withdraw the flight
    beneath them: they never get FlightInterruptedError while the flight goes on."""
    from flightgroup import JSON, FlightGroup

    original = threading.Thread.start
    armed = [True]

    def start(self: threading.Thread) -> None:
        if armed[0] and self.name == "flightgroup-follow":
            armed[0] = False
            original(self)
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    g1 = FlightGroup(directory=directory, codec=JSON)
    g2 = FlightGroup(directory=directory, codec=JSON)
    started, release = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert release.wait(20)
        return "v"

    def on_join() -> None:
        # a plain joiner of g2's local flight came meanwhile; then on_join fails
        wait_until(lambda: g2.stats().joins >= 2, "a local joiner joined")
        raise ValueError("on_join failed")

    try:
        leader = Background(lambda: g1.run_sync("k", work))
        assert started.wait(20)
        leading = Background(lambda: g2.run_sync("k", lambda: "never", on_join=on_join))
        wait_until(lambda: g2.stats().in_flight == 1, "g2's local flight")
        joiner = Background(lambda: g2.run_sync("k", lambda: "never"))
        with pytest.raises(KeyboardInterrupt):
            leading.wait()
        release.set()
        assert leader.wait().value == "v"
        assert joiner.wait().value == "v"
        wait_until(
            lambda: all(t.name != "flightgroup-follow" for t in threading.enumerate()),
            "the follow thread ended",
        )
    finally:
        release.set()
        g1.close()
        g2.close()
