"""Regressions from a chaos soak of the directory scope (2026-12-01: real processes,
SIGKILL and SIGSTOP of leaders, joiners and coordinators, group closes). Each test forces
the interleaving the soak found by hand.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from flightgroup import JSON, FlightGroup, GroupClosedError

from .dirproc import Harness, MuteCoordinator, harness, key_file, wait_for
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


def _frames_until(conn: Any, op: str, key: str) -> dict[str, Any]:
    """Read frames until an ``op`` of ``key`` (a reconnect resends every open call)."""
    while True:
        header, _ = conn.read_frame()
        if header["op"] == op and header.get("key") == key:
            return header


@pytest.mark.parametrize("written", ["before the coordinator went", "to its dead socket"])
def test_a_fresh_run_resent_after_a_failover_admits_only_flights_after_it(
    h: Harness, mute: MuteCoordinator, written: str
) -> None:
    """A fresh call whose request the gone coordinator's socket took was made before the
    next term began: resent, it admits every flight of that term (``after`` = the last
    token before it). One written to a socket that was already dead (the soak: a process
    frozen through the failover called the instant it thawed, before its loop saw the
    coordinator go) may be newer than that term's running flight: it is resent as a new
    fresh call. Before, it too admitted the term's flights, and joined one that began
    before the call."""
    g = FlightGroup(directory=h.dir, codec=JSON)
    calls = [Background(lambda: g.run_sync("w", lambda: "w"))]
    first = mute.accept()
    _frames_until(first, "run", "w")
    loop = g._arbiter._loop  # type: ignore[union-attr]
    entered, go_on = threading.Event(), threading.Event()
    if written == "to its dead socket":
        # The group's loop is held (as in a frozen process): it cannot see the close.
        loop.call_soon_threadsafe(lambda: (entered.set(), go_on.wait(20)))
        assert entered.wait(10)
        first.close()
    with open(h.path("flight.epoch"), "w") as f:
        f.write("2\n")  # the next term's
    calls.append(Background(lambda: g.run_sync("k", lambda: "k", fresh=True)))
    # The caller's thread opens the key's lock file right after writing its request.
    wait_for(lambda: os.path.exists(h.path("execution-locks", key_file("k"))), "the request")
    if written == "before the coordinator went":
        first.close()
    go_on.set()
    second = mute.accept()
    resent = _frames_until(second, "run", "k")
    assert resent.get("fresh") is True
    if written == "before the coordinator went":
        assert resent.get("after") == (2 << 32) - 1, resent
    else:
        assert resent.get("after") is None, resent
    g.close()
    for call in calls:
        with pytest.raises(GroupClosedError):
            call.wait()
