"""forget() in the directory scope (ADR 0020): the flight a confirmed forget detached
runs on for its own callers and stays detached in every later term, whatever way the
coordinator stopped; the key's next call leads a new flight.

Interleavings are forced with child processes (SIGKILL), raw connections and the order
of frames on one connection; nothing waits on a bare sleep.
"""

from __future__ import annotations

import os

import pytest

from ..dirproc import HELLO_OK, Harness, RawConn, assert_value, wait_for
from ..ingroup import arbiter, close, coordinating, group
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
