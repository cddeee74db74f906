"""Regressions from a chaos soak of the directory scope (2026-12-01: real processes,
SIGKILL and SIGSTOP of leaders, joiners and coordinators, group closes). Each test forces
the interleaving the soak found by hand.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from flightgroup import JSON, FlightGroup, GroupClosedError

from .dirproc import Harness, MuteCoordinator, harness
from .ingroup import Background

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def h() -> Iterator[Harness]:
    with harness() as hh:
        yield hh


@pytest.fixture
def mute(h: Harness) -> Iterator[MuteCoordinator]:
    """A coordinator that answers only the handshake (the test holds the election)."""
    os.makedirs(h.dir, mode=0o700)
    h.take_election()
    made = MuteCoordinator(h.path("flight.sock"))
    try:
        yield made
    finally:
        made.close()


def test_closing_a_group_cancels_its_unanswered_runs(h: Harness, mute: MuteCoordinator) -> None:
    """A group closed while a run request waits for its answer fails the call with
    GroupClosedError, and must also cancel the request. Before, the coordinator (frozen
    meanwhile, in the soak) later made the dead call the leader of a flight nobody ran:
    callers of other processes joined it and were interrupted when the closed group's
    connection finally went, seconds later."""
    g = FlightGroup(directory=h.dir, codec=JSON)
    call = Background(lambda: g.run_sync("k", lambda: "never"))
    conn = mute.accept()
    run, _ = conn.expect("run")
    closing = Background(g.close)
    cancel, _ = conn.expect("cancel")
    assert cancel["id"] == run["id"]
    with pytest.raises(GroupClosedError):
        call.wait()
    closing.wait()
