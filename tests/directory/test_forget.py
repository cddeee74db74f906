"""forget() in the directory scope (ADR 0020): it reaches the coordinator from any group
(one that never called too) and drops the key's kept outcome for every group; the flight
a confirmed forget detached runs on for its own callers, is not kept, and stays detached
in every later term, whatever way the coordinator stopped; the key's next call leads a
new flight.

Interleavings are forced with child processes (SIGKILL), raw connections and the order
of frames on one connection; nothing waits on a bare sleep.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from flightgroup import (
    FlightGroup,
    Retention,
)

from ..dirproc import HELLO_OK, Harness, RawConn, assert_value, raw_conns, wait_for
from ..ingroup import Background, arbiter, close, coordinating, coordinator_of, group
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
    # docs/api.md: after forget(key) "the next call of the key leads a new flight".
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
        wait_until(lambda: arbiter(b)._state.coordinator is not None, "b coordinates")
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
        b.forget("k")  # a later call anywhere leads a new flight (docs/api.md)
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


def test_a_call_after_a_confirmed_forget_never_joins_the_forgotten_flight_after_a_failover(
    directory: str,
) -> None:
    """A call after a confirmed forget never joins the forgotten flight after a failover."""
    a = coordinating(directory)
    b = group(directory)
    c = group(directory)
    try:
        running, release = threading.Event(), threading.Event()

        def old() -> str:
            running.set()
            release.wait(15)
            return "old"

        leader = Background(lambda: b.run_sync("k", old))
        assert running.wait(10)
        c.forget("k")  # returns once the coordinator confirmed it
        assert "k" not in coordinator_of(a)._term.flights

        close(a)  # the coordinator changes (a SIGKILL does the same; the forget is lost)
        wait_until(lambda: _any_coordinator(b, c) is not None, "b or c coordinates")
        new = _any_coordinator(b, c)
        wait_until(
            lambda: "k" in new._term.flights or bool(new._term.detached.get("k")),
            "b reasserted its flight to the new term",
        )

        after = Background(lambda: c.run_sync("k", lambda: "new"))
        wait_until(
            lambda: (
                bool(new._term.waiting.get("k"))
                or ("k" in new._term.flights and len(new._term.flights["k"].joiners) == 1)
            ),
            "c's call reached the new coordinator",
        )
        release.set()
        assert leader.wait().value == "old"
        # docs/api.md: forget(key): "the next call of the key leads a new flight". c's call came
        # after the confirmed forget: it must not get the forgotten flight's value.
        result = after.wait()
        assert (result.value, result.joined) == ("new", False)
    finally:
        release.set()
        close(a, b, c)


def _any_coordinator(*groups: FlightGroup) -> Any:
    for each in groups:
        found = arbiter(each)._state.coordinator
        if found is not None and not found.closed:
            return found
    return None


def test_a_call_after_a_confirmed_forget_leads_though_the_flight_reasserts_later() -> None:
    """A call after a confirmed forget leads, though the flight reasserts later.

    Real processes: b leads k and freezes; the coordinator a is killed; the next one
    (c) confirms forget(k) before b's flight reasserted; c's call then waits for b's key
    lock. When b continues, its flight is taken back detached (it began before the
    forget), and c's call leads a new flight once b's work ended."""
    with Harness() as h:
        a, b, c = (h.spawn_warm(name) for name in "abc")
        assert h.coordinator_pid() == a.pid
        b.call("l", "k", h.work(block=True, **{"return": "old"}))
        b.expect("started", "l")
        b.stop()
        a.kill()
        assert h.coordinator_pid(not_pid=a.pid) == c.pid
        c.send(cmd="forget", key="k")
        assert c.expect("forgot")["error"] is None
        c.call("n", "k", h.work(**{"return": "new"}), on_join=True)
        c.roundtrip("after")  # "n" reached the coordinator: it waits for b's key lock
        b.cont()
        b.release("l")
        assert_value(b.expect("done", "l"), "old", joined=False)
        assert_value(c.expect("done", "n"), "new", joined=False)
        assert [pid for pid, _, _ in h.runs_of("k")] == [b.pid, c.pid]


def test_a_forgotten_flights_retry_does_not_detach_the_keys_next_flight(
    directory: str,
) -> None:
    """A forgotten flight's retry does not detach the key's next flight.

    D's flight is forgotten; N leads the key's next flight; then D retries (a token
    above N's). After a failover N reasserts: it is still the key's flight, so a new
    call joins it."""
    a = coordinating(directory)
    b = group(directory)
    b.run_sync("warm-b", lambda: 0)  # b takes part in the election: it coordinates next
    sock = os.path.join(directory, "flight.sock")
    try:
        with raw_conns(sock, 3) as (d, f, n):
            d.send_frame({"op": "run", "id": 1, "key": "k"})
            first = d.expect("lead")[0]["token"]
            f.send_frame({"op": "forget", "key": "k", "id": 2})
            f.expect("ack")
            n.send_frame({"op": "run", "id": 1, "key": "k"})
            token = n.expect("lead")[0]["token"]
            d.send_frame({"op": "attempt", "id": 1})
            assert d.expect("lead")[0]["token"] > token > first
        close(a)
        wait_until(lambda: arbiter(b)._state.coordinator is not None, "b coordinates")
        with raw_conns(sock, 2) as (n2, q):
            n2.send_frame({"op": "reassert", "id": 1, "key": "k", "token": token})
            n2.served()
            q.send_frame({"op": "run", "id": 1, "key": "k"})
            assert q.expect("joined")[0]["token"] == token
    finally:
        close(a)
        close(b)


def test_a_forget_of_a_key_nobody_holds_still_detaches_an_earlier_terms_lead(
    directory: str,
) -> None:
    """A forget of a key no flight holds still detaches an earlier term's lead.

    A lead of an earlier term need not hold its key lock yet: told to lead while the
    key was releasing, its leader waits for the previous holder. A forget confirmed then,
    with the lock free and nobody waiting, still writes its mark (whenever no flight of
    the key is known), so the lead's later reassert is taken back detached, never as the
    key's flight, and a call after the forget does not join it."""
    a = coordinating(directory)
    sock = os.path.join(directory, "flight.sock")
    earlier = 0 << 32 | 5  # a token of the term before this one (epoch 0)
    try:
        with raw_conns(sock, 3) as (f, b, q):
            f.send_frame({"op": "forget", "key": "k", "id": 1})
            f.expect("ack")
            b.send_frame({"op": "reassert", "id": 1, "key": "k", "token": earlier})
            b.served()  # taken back detached: for its own joiners only
            q.send_frame({"op": "run", "id": 1, "key": "k"})
            assert q.expect("lead")[0]["token"] > earlier
            # Its own joiners still find it by its token.
            f.send_frame({"op": "run", "id": 3, "key": "k", "flight": earlier})
            assert f.expect("joined")[0]["token"] == earlier
    finally:
        close(a)
