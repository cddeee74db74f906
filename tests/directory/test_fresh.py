"""Fresh callers in the directory scope (ADR 0005): a fresh caller never gets an outcome
of a flight that began before its call; fresh callers that come during one flight share
the next, across groups, processes and coordinator changes.
"""

from __future__ import annotations

import os
import threading

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
    GroupClosedError,
    Retention,
)
from flightgroup.directory import wire

from ..dirproc import (
    Harness,
    MuteCoordinator,
    assert_value,
    frames_until,
    key_file,
    raw_conns,
    wait_for,
)
from ..ingroup import (
    Background,
    close,
    coordinating,
    coordinator_of,
    group,
    hold_key_lock,
    live_coordinator,
)
from ..ingroup import close as _close
from ..ingroup import group as _group
from ..support import scope_of, table_of, wait_until


def test_fresh_caller_elsewhere_never_gets_the_kept_outcome_of_the_older_flight(
    directory: str,
) -> None:
    """A fresh caller in another group never gets the older flight's kept outcome."""
    a, b = _group(directory, retention=Retention(success=60.0)), _group(directory)
    try:
        running, release = threading.Event(), threading.Event()

        def old() -> str:
            running.set()
            release.wait(10)
            return "old"

        leader = Background(lambda: a.run_sync("k", old))
        assert running.wait(10)
        fresh = Background(lambda: b.run_sync("k", lambda: "new", fresh=True))

        def waiting_fresh() -> bool:
            coordinator = live_coordinator(a, b)
            flight = None if coordinator is None else coordinator._term.flights.get("k")
            return flight is not None and len(flight.fresh) == 1

        wait_until(waiting_fresh, "the fresh call waits for the flight's end")
        release.set()
        assert leader.wait().value == "old"
        result = fresh.wait()
        assert result.value == "new"
        assert result.joined is False
    finally:
        release.set()
        _close(a, b)


@pytest.mark.timeout(60)
def test_fresh_callers_of_one_process_share_the_next_flight(directory: str) -> None:
    """Fresh callers of one process that came during one flight share the next flight."""
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
            lambda: (
                (f := coordinator_of(a)._term.flights.get("k")) is not None and len(f.fresh) == 1
            ),
            "b1's fresh request waits in the coordinator",
        )
        b3 = Background(lambda: b.run_sync("k", second, fresh=True))
        # b3 is in b's table, waiting (it came while "first" still ran: fresh).
        wait_until(
            lambda: (f := table_of(b).flights.get("k")) is not None and len(f.fresh or ()) == 1,
            "b3 waits in b's table",
        )
        assert runs == ["first"]
        release.set()
        assert leader.wait().value == "old"
        results = [b1.wait(), b3.wait()]
        assert [r.value for r in results] == ["new", "new"]
        # docs/api.md: "All fresh callers that arrive during one running flight share the
        # next flight" (ADR 0005): b1 and b3 both came while "first" ran.
        assert runs == ["first", "second"]
        assert sorted(r.joined for r in results) == [False, True]
    finally:
        release.set()
        close(a, b)


OLD = 1 << 32 | 5  # flights of an earlier term


NEW = 1 << 32 | 6


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lock", ["held", "free"])
def test_fresh_callers_of_an_older_flight_wait_for_the_newer_one_that_reasserts(
    directory: str, lock: str
) -> None:
    """Fresh callers of an older flight wait for the newer flight that reasserts.

    A fresh call waits for the end of the key's flight O; the newer N reasserts and
    takes the key. N began before the call too: the call waits for N's end, and then
    leads the next flight (neither joins N, nor leads beside it)."""
    a = coordinating(directory)
    sock = os.path.join(directory, "flight.sock")
    fd = hold_key_lock(directory, "k") if lock == "held" else None  # N's leader's
    try:
        with raw_conns(sock, 4) as (o, n, x, y):
            o.send_frame({"op": "reassert", "id": 1, "key": "k", "token": OLD})
            o.served()
            x.send_frame({"op": "run", "id": 1, "key": "k", "fresh": True})
            x.served()  # its run was taken, unanswered: it waits for O's end
            n.send_frame({"op": "reassert", "id": 1, "key": "k", "token": NEW})
            n.served()
            assert o.expect("rejected")[0]["id"] == 1
            x.served()  # still waiting: N began before the fresh call
            y.send_frame({"op": "run", "id": 1, "key": "k"})
            assert y.expect("joined")[0]["token"] == NEW  # N is the key's only flight
            if fd is not None:
                os.close(fd)
                fd = None
            n.send(wire.land_frame(1, NEW, wire.Value(b'"n"')))
            assert n.expect("ack")[0]["id"] == 1
            header, payload = y.expect("landed")
            assert (header["token"], payload) == (NEW, b'"n"')
            x.expect("lead")  # the fresh call leads the flight after N
    finally:
        if fd is not None:
            os.close(fd)
        close(a)


@pytest.mark.timeout(60)
def test_fresh_callers_of_a_landed_older_flight_wait_for_the_newer_one(directory: str) -> None:
    """Fresh callers of a landed older flight wait for the newer flight's end.

    The older flight landed (it stays detached for its joiners): its fresh caller waits for the
    newer flight's end, not for the landing's."""
    a = coordinating(directory)
    sock = os.path.join(directory, "flight.sock")
    land = wire.land_frame(1, OLD, wire.Value(b'"' + b"o" * 1_000_000 + b'"'))
    fd = hold_key_lock(directory, "k")
    try:
        with raw_conns(sock, 3) as (o, n, x):
            o.send(wire.reassert_frame(1, "k", OLD, landed=True) + land[:1000])
            x.send_frame({"op": "run", "id": 1, "key": "k", "fresh": True})
            x.served()  # waits for O's end (O's reassert was served before it)
            n.send_frame({"op": "reassert", "id": 1, "key": "k", "token": NEW})
            n.served()
            o.send(land[1000:])
            assert o.expect("ack")[0]["id"] == 1
            x.served()  # O's landing did not end its wait: N runs, and began before it
            os.close(fd)
            fd = None
            n.send(wire.land_frame(1, NEW, wire.Value(b'"n"')))
            n.expect("ack")
            x.expect("lead")
    finally:
        if fd is not None:
            os.close(fd)
        close(a)


@pytest.mark.timeout(60)
def test_fresh_callers_of_one_flight_share_the_next_across_a_failover() -> None:
    """Fresh callers of one flight share the next one across a failover.

    Real processes: p2's and p3's fresh calls wait at the coordinator for F's end; the
    coordinator dies; p3 reconnects first and leads the next flight G; p2's fresh call, sent
    again, was sent to the term before, so any flight of the new term began after it: it joins G."""
    with Harness() as h:
        c = h.spawn_warm("c")
        p1, p2, p3 = (h.spawn_warm(name) for name in ("p1", "p2", "p3"))
        assert h.coordinator_pid() == c.pid
        p1.call("a", "k", h.work(block=True, **{"return": "F"}))
        p1.expect("started", "a")
        p2.call("b", "k", h.work(**{"return": "p2 ran"}), fresh=True)
        p3.call("c", "k", h.work(block=True, **{"return": "G"}), fresh=True)
        p2.roundtrip("rt")  # each fresh request was read (frames go in order)
        p3.roundtrip("rt")
        p2.stop()  # slow to reconnect after the failover
        c.kill()
        p1.release("a")
        assert_value(p1.expect("done", "a"), "F", joined=False)
        p3.expect("started", "c")  # p3 leads G in the new term
        p2.cont()
        p2.roundtrip("rt2")  # p2's fresh call reached the new coordinator
        p3.release("c")
        assert_value(p3.expect("done", "c"), "G", joined=False)
        assert_value(p2.expect("done", "b"), "G", joined=True)
        assert [pid for pid, _, _ in h.runs_of("k")] == [p1.pid, p3.pid]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("written", ["before the coordinator went", "to its dead socket"])
def test_a_fresh_run_resent_after_a_failover_admits_only_flights_after_it(
    h: Harness, mute: MuteCoordinator, written: str
) -> None:
    """A fresh run resent after a failover admits only flights that began after it.

    A fresh call whose request the gone coordinator's socket took was made before the next term
    began: resent, it admits every flight of that term (``after`` = the last token before it).
    One written to a socket that was already dead (a process frozen through the failover calls
    the instant it thaws, before its loop saw the coordinator go) may be newer than that term's
    running flight: it is resent as a new fresh call, and never joins a flight that began before
    it."""
    g = FlightGroup(directory=h.dir, codec=JSON)
    calls = [Background(lambda: g.run_sync("w", lambda: "w"))]
    first = mute.accept()
    frames_until(first, "run", "w")
    loop = scope_of(g)._background.loop
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
    resent = frames_until(second, "run", "k")
    assert resent.get("fresh") is True
    if written == "before the coordinator went":
        assert resent.get("after") == (2 << 32) - 1, resent
    else:
        assert resent.get("after") is None, resent
    g.close()
    for call in calls:
        with pytest.raises(GroupClosedError):
            call.wait()
