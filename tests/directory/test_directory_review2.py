"""A second review of the directory scope: policies, forget() and close() across
coordinator changes, and the edges of the contract the first reviews did not reach.

Interleavings are forced with child processes (SIGKILL, SIGSTOP/SIGCONT), events and
monkeypatched hooks; nothing waits on a bare sleep.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from flightgroup import JSON, FlightFailedError, FlightGroup, Retention

from ..dirproc import Harness, assert_value, wait_for
from ..ingroup import Background, arbiter, close, coordinating, group
from ..support import wait_until

pytestmark = pytest.mark.timeout(60)


def _coordinator_of(of: FlightGroup) -> Any:
    found = arbiter(of)._coordinator
    assert found is not None, "this group does not coordinate"
    return found


# -- forget() across a failover ------------------------------------------------------


def test_a_call_after_a_confirmed_forget_never_joins_the_forgotten_flight_after_a_failover(
    directory: str,
) -> None:
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
        assert "k" not in _coordinator_of(a)._flights

        close(a)  # the coordinator changes (a SIGKILL does the same; the forget is lost)
        wait_until(lambda: _any_coordinator(b, c) is not None, "b or c coordinates")
        new = _any_coordinator(b, c)
        wait_until(
            lambda: "k" in new._flights or bool(new._detached.get("k")),
            "b reasserted its flight to the new term",
        )

        after = Background(lambda: c.run_sync("k", lambda: "new"))
        wait_until(
            lambda: (
                bool(new._waiting.get("k"))
                or ("k" in new._flights and len(new._flights["k"].joiners) == 1)
            ),
            "c's call reached the new coordinator",
        )
        release.set()
        assert leader.wait().value == "old"
        # API.md: forget(key): "the next call of the key leads a new flight". c's call came
        # after the confirmed forget: it must not get the forgotten flight's value.
        result = after.wait()
        assert (result.value, result.joined) == ("new", False)
    finally:
        release.set()
        close(a, b, c)


def _any_coordinator(*groups: FlightGroup) -> Any:
    for each in groups:
        found = arbiter(each)._coordinator
        if found is not None and not found.closed:
            return found
    return None


# -- fresh callers of one process (ADR 0005) ---------------------------------------


def test_fresh_callers_of_one_process_share_the_next_flight(directory: str) -> None:
    a = coordinating(directory)  # coordinates and leads the running flight
    b = group(directory)
    try:
        started, release = threading.Event(), threading.Event()
        runs: list[str] = []

        def first() -> str:
            runs.append("first")
            started.set()
            release.wait(15)
            return "old"

        def second() -> str:
            runs.append("second")
            return "new"

        leader = Background(lambda: a.run_sync("k", first))
        assert started.wait(10)
        b1 = Background(lambda: b.run_sync("k", second, fresh=True))
        # b1's fresh request reached the coordinator and waits for the running flight.
        wait_until(
            lambda: (f := _coordinator_of(a)._flights.get("k")) is not None and len(f.fresh) == 1,
            "b1's fresh request waits in the coordinator",
        )
        b3 = Background(lambda: b.run_sync("k", second, fresh=True))
        # b3 is in b's table, waiting (it came while "first" still ran: fresh).
        wait_until(
            lambda: (f := b._table.flights.get("k")) is not None and len(f.fresh or ()) == 1,
            "b3 waits in b's table",
        )
        assert runs == ["first"]
        release.set()
        assert leader.wait().value == "old"
        results = [b1.wait(), b3.wait()]
        assert [r.value for r in results] == ["new", "new"]
        # API.md: "All fresh callers that arrive during one running flight share the
        # next flight" (ADR 0005): b1 and b3 both came while "first" ran.
        assert runs == ["first", "second"]
        assert sorted(r.joined for r in results) == [False, True]
    finally:
        release.set()
        close(a, b)


# -- a landing not yet acknowledged when the coordinator dies ------------------------


def test_a_frozen_joiner_gets_the_value_when_a_newer_lead_reasserts_first(h: Harness) -> None:
    a = h.spawn_warm("a")  # the coordinator
    b = h.spawn_warm("b")  # the leader
    c = h.spawn_warm("c")  # a joiner, frozen while the value is pushed to it
    e = h.spawn_warm("e")  # a joiner that proves the coordinator took the landing
    x = h.spawn_warm("x")  # a new call of the key once the flight landed
    assert h.coordinator_pid() == a.pid
    big = "x" * (2 * 1024 * 1024)
    b.call("l", "k", h.work(block=True, return_chars=len(big)))
    started = b.expect("started", "l")
    c.call("j", "k", h.work())
    c.expect("joined", "j")
    e.call("j", "k", h.work())
    e.expect("joined", "j")

    c.stop()  # c reads nothing: the coordinator's ack to b waits for c's buffer
    b.release("l")
    assert_value(e.expect("done", "j"), big, joined=True)  # the landing was taken
    assert_value(b.expect("done", "l"), big, joined=False)
    # A new call of the key leads at once (the landed flight is "releasing"); its lead
    # waits for b's key lock, which b keeps until its landing is acknowledged.
    x.call("n", "k", h.work(**{"return": "next"}))
    wait_for(lambda: h.led_by("k", x.pid), "x leads the next flight")
    assert not x.seen("started", "n")

    b.stop()  # b reconnects only after x's lead is reasserted
    a.kill()
    assert h.coordinator_pid(not_pid=a.pid) in (e.pid, x.pid)  # b and c are frozen
    wait_for(lambda: h.led_by("k", x.pid), "x reasserted its lead to the new term")
    b.cont()
    b.roundtrip("after")  # b's reassert and its landing reached the new term
    c.cont()

    # The leader is alive and landed: its frozen joiner still gets the value
    # (docs/directory-scope.md: "a coordinator that dies meanwhile is replaced and the
    # value still reaches it"; API.md: a joiner is interrupted only when the leader died
    # or lost its lease).
    done = c.expect("done", "j")
    assert_value(done, big, joined=True)
    assert done["token"] == started["token"]
    assert_value(x.expect("done", "n"), "next", joined=False)


# -- a kept failure in the leader's own group ----------------------------------------


def test_a_kept_failure_has_its_cause_in_the_group_that_led_it(directory: str) -> None:
    g = group(directory, retention=Retention(success=None, error=60.0))
    try:
        boom = KeyError("missing")

        def work() -> None:
            raise boom

        with pytest.raises(KeyError) as led:
            g.run_sync("k", work)
        assert led.value is boom
        runs: list[int] = []
        with pytest.raises(FlightFailedError) as kept:
            g.run_sync("k", lambda: runs.append(1))
        assert runs == []  # served from the kept outcome
        assert kept.value.error_type == "KeyError"
        # API.md (Policies): "a kept failure raises FlightFailedError (with `__cause__` in
        # the leader's process), as a joiner's would" -- as the process scope does.
        assert kept.value.__cause__ is boom
    finally:
        close(g)


# -- close() twice ---------------------------------------------------------------------


def test_a_second_close_returns_only_once_the_landings_were_handed_over(h: Harness) -> None:
    """A second close() (another thread, a with-block's exit after an explicit close)
    returned at once while the first still handed over an unacknowledged landing."""
    a = h.spawn_warm("a")  # the coordinator, in a process of its own: it can be frozen
    assert h.coordinator_pid() == a.pid
    g = FlightGroup(directory=h.dir, codec=JSON, reconnect_timeout=15.0)
    first: Background | None = None
    try:
        running, release = threading.Event(), threading.Event()

        def work() -> str:
            running.set()
            release.wait(15)
            return "v"

        leader = Background(lambda: g.run_sync("k", work))
        assert running.wait(10)
        a.stop()  # the coordinator cannot acknowledge the landing
        release.set()
        assert leader.wait().value == "v"
        lead = next(iter(arbiter(g)._leads.values()))
        assert lead.landing is not None and not lead.acked

        waiting = threading.Event()

        class Watched(threading.Event):
            def wait(self, timeout: float | None = None) -> bool:
                waiting.set()  # the second close() waits for the first one
                return super().wait(timeout)

        returned = Watched()
        arbiter(g)._close_returned = returned
        first = Background(g.close, name="first-close")
        wait_until(lambda: arbiter(g)._closing, "the first close began")

        def second_close() -> bool:
            g.close()
            return bool(lead.acked)  # what was handed over when it returned

        second = Background(second_close, name="second-close")
        assert waiting.wait(10)
        assert not second.done.is_set()  # it waits while the landing is not acknowledged
        a.cont()  # the coordinator acknowledges; the first close returns, then the second
        # API.md: "close() returns once the landings already made have been handed over"
        assert second.wait(20) is True
        assert first.wait(20) is None
    finally:
        a.cont()
        if first is not None:
            first.wait(20)
        close(g)


# -- Retention's bounds ------------------------------------------------------------------


def test_retention_max_items_bounds_the_directorys_kept_outcomes(directory: str) -> None:
    a, b = (group(directory, retention=Retention(success=60.0, max_items=1)) for _ in "ab")
    try:
        assert a.run_sync("k1", lambda: "one").joined is False
        assert a.run_sync("k2", lambda: "two").joined is False
        assert b.run_sync("k2", lambda: "again").value == "two"  # kept: the bound works
        # API.md: a kept outcome is served "until its time runs out or it is evicted (LRU
        # by items, then by encoded bytes)"; max_items=1 keeps only k2's.
        again = b.run_sync("k1", lambda: "new")
        assert (again.value, again.joined) == ("new", False)
    finally:
        close(a, b)
