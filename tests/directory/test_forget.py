"""forget() in the directory scope (ADR 0020): the flight a confirmed forget detached
runs on for its own callers and stays detached in every later term, whatever way the
coordinator stopped; the key's next call leads a new flight.

Interleavings are forced with child processes (SIGKILL), raw connections and the order
of frames on one connection; nothing waits on a bare sleep.
"""

from __future__ import annotations

import os
import threading

import pytest

from flightgroup import (
    Retention,
)

from ..dirproc import HELLO_OK, Harness, RawConn, assert_value, wait_for
from ..ingroup import Background, arbiter, close, coordinating, group
from ..ingroup import close as _close
from ..ingroup import coordinating as _coordinating
from ..ingroup import group as _group
from ..support import wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_forget_survives_a_coordinator_killed_right_after_confirming_it(h: Harness) -> None:
    """A confirmed forget holds after its coordinator is killed: the next call leads anew."""
    a = h.spawn_warm("a")  # the coordinator, SIGKILLed once it confirmed the forget
    b = h.spawn_warm("b")  # leads the flight that is forgotten
    c = h.spawn_warm("c")  # forgets, then calls the key
    assert h.coordinator_pid() == a.pid
    b.call("l", "k", h.work(block=True, **{"return": "old"}))
    b.expect("started", "l")
    c.send(cmd="forget", key="k")
    assert c.expect("forgot")["error"] is None  # confirmed by a
    a.kill()
    assert h.coordinator_pid(not_pid=a.pid) in (b.pid, c.pid)
    wait_for(lambda: h.led_by("k", b.pid), "b reasserted its flight to the new term")

    c.call("n", "k", h.work(**{"return": "new"}), on_join=True)
    # Frames of one connection are served in order: once a later call of c came back,
    # the coordinator has decided "n" (it waits for b's key lock, or joined b's flight).
    c.roundtrip("after")
    assert not c.seen("joined", "n")
    b.release("l")
    assert_value(b.expect("done", "l"), "old", joined=False)
    # API.md: after forget(key) "the next call of the key leads a new flight".
    assert_value(c.expect("done", "n"), "new", joined=False)
    assert [pid for pid, _, _ in h.runs_of("k")] == [b.pid, c.pid]


def test_a_forgotten_flight_that_retried_stays_detached_in_the_next_term(directory: str) -> None:
    """A forgotten flight that retried stays detached in the next term, known by its retry's token.

    The retry of a detached flight takes a token above the one the forget saw; the
    next term still knows the flight by it."""
    a = coordinating(directory)
    b = group(directory)
    assert b.run_sync("warm-up", lambda: 0).value == 0  # b takes part in the election
    sock = os.path.join(directory, "flight.sock")
    try:
        with RawConn(sock) as leader, RawConn(sock) as other:
            assert leader.hello() == HELLO_OK and other.hello() == HELLO_OK
            leader.send_frame({"op": "run", "id": 1, "key": "k"})
            first = leader.expect("lead")[0]["token"]
            other.send_frame({"op": "forget", "key": "k", "id": 7})
            assert other.expect("ack")[0]["id"] == 7
            leader.send_frame({"op": "attempt", "id": 1})
            second = leader.expect("lead")[0]["token"]
            assert second > first
        # Those connections closed: the flight was interrupted in this term. A leader
        # that comes back to the next term reasserts it.
        close(a)
        wait_until(lambda: arbiter(b)._coordinator is not None, "b coordinates")
        with RawConn(sock) as leader, RawConn(sock) as caller:
            assert leader.hello() == HELLO_OK and caller.hello() == HELLO_OK
            # Without its earlier token: the retry's token alone names it forgotten.
            leader.send_frame({"op": "reassert", "id": 1, "key": "k", "token": second})
            leader.send_frame({"op": "status", "id": 2})
            leader.expect("status")[0]  # the reassert was served
            caller.send_frame({"op": "run", "id": 1, "key": "k"})
            # The key's lock is free (no process holds it): a new call leads at once; it
            # never joins the forgotten flight.
            assert caller.expect("lead")[0]["token"] > second
            # A rejoin of the forgotten flight by its token still reaches it.
            caller.send_frame({"op": "run", "id": 2, "key": "k", "flight": second})
            assert caller.expect("joined")[0]["token"] == second
    finally:
        close(a, b)


def test_forget_from_a_group_that_never_called_reaches_the_coordinator(directory: str) -> None:
    """forget() from a group that never called reaches the coordinator."""
    a = _coordinating(directory, retention=Retention(success=60.0))
    b = _group(directory, retention=Retention(success=60.0))
    try:
        assert a.run_sync("k", lambda: "v1").value == "v1"
        b.forget("k")  # a later call anywhere leads a new flight (API.md)
        again = b.run_sync("k", lambda: "v2")
        assert again.value == "v2" and again.joined is False
    finally:
        _close(a, b)


def test_forget_from_a_connected_group_drops_the_kept_outcome_everywhere(directory: str) -> None:
    """forget() from a connected group drops the key's kept outcome for every group."""
    a = _coordinating(directory, retention=Retention(success=60.0))
    b = _group(directory, retention=Retention(success=60.0))
    try:
        assert b.run_sync("other", lambda: 0).value == 0  # b is connected
        assert a.run_sync("k", lambda: "v1").value == "v1"
        assert b.run_sync("k", lambda: "x").value == "v1"  # kept
        b.forget("k")
        again = a.run_sync("k", lambda: "v2")
        assert again.value == "v2" and again.joined is False
    finally:
        _close(a, b)


def test_a_flight_forgotten_while_it_runs_is_not_kept(directory: str) -> None:
    """A flight forgotten while it runs is not kept: the next call runs fresh."""
    c = _coordinating(directory)
    a = _group(directory, retention=Retention(success=60.0))
    b = _group(directory, retention=Retention(success=60.0))
    try:
        assert b.run_sync("other", lambda: 0).value == 0  # b is connected
        running, release = threading.Event(), threading.Event()

        def stale() -> str:
            running.set()
            release.wait(10)
            return "stale"

        leader = Background(lambda: a.run_sync("k", stale))
        assert running.wait(10)
        b.forget("k")  # e.g. after a write: the running flight read the old data
        release.set()
        assert leader.wait().value == "stale"
        again = b.run_sync("k", lambda: "fresh")
        assert again.value == "fresh" and again.joined is False
    finally:
        release.set()
        _close(a, b, c)


def test_a_call_after_forget_waits_for_the_detached_flight_then_leads(directory: str) -> None:
    """A call after forget() waits for the detached flight's key lock, then leads."""
    c = _coordinating(directory)
    a, b = _group(directory), _group(directory)
    try:
        assert b.run_sync("other", lambda: 0).value == 0
        running, release = threading.Event(), threading.Event()
        active: list[str] = []
        overlaps: list[list[str]] = []

        def old() -> str:
            active.append("a")
            running.set()
            release.wait(10)
            active.remove("a")
            return "old"

        def new() -> str:
            overlaps.append(list(active))
            return "new"

        leader = Background(lambda: a.run_sync("k", old))
        assert running.wait(10)
        b.forget("k")
        call = Background(lambda: b.run_sync("k", new))
        assert not call.done.wait(0.3)  # waits on a's key lock: never beside it
        release.set()
        assert leader.wait().value == "old"
        result = call.wait()
        assert result.value == "new" and result.joined is False
        assert overlaps == [[]]
    finally:
        release.set()
        _close(a, b, c)
