"""Findings of the fourth review of the directory scope, each pinned by the raw frames (or
processes) that showed it: a newer reassert and the older flight's fresh callers; forget()
of a flight that has not reasserted yet; a forgotten flight's retry beside the key's next
flight.

The coordinator is a group of the test process; the test speaks for every other party
over raw connections, so the order of the messages is the test's.
"""

from __future__ import annotations

import os

import pytest

from flightgroup.directory import wire

from ..dirproc import Harness, assert_value, raw_conns
from ..ingroup import arbiter, close, coordinating, group, hold_key_lock
from ..support import wait_until

pytestmark = pytest.mark.timeout(60)

OLD = 1 << 32 | 5  # flights of an earlier term
NEW = 1 << 32 | 6


@pytest.mark.parametrize("lock", ["held", "free"])
def test_fresh_callers_of_an_older_flight_wait_for_the_newer_one_that_reasserts(
    directory: str, lock: str
) -> None:
    """A fresh call waits for the end of the key's flight O; the newer N reasserts and
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


def test_fresh_callers_of_a_landed_older_flight_wait_for_the_newer_one(directory: str) -> None:
    """The same when the older flight landed (it stays detached for its joiners): its
    fresh caller waits for the newer flight's end, not for the landing's."""
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


def test_a_call_after_a_confirmed_forget_leads_though_the_flight_reasserts_later() -> None:
    """Real processes: b leads k and freezes; the coordinator a is killed; the next one
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
    """D's flight is forgotten; N leads the key's next flight; then D retries (a token
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
        wait_until(lambda: arbiter(b)._coordinator is not None, "b coordinates")
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
    """A lead of an earlier term need not hold its key lock yet: told to lead while the
    key was releasing, its leader waits for the previous holder (review of 2026-11-30,
    round 2). A forget confirmed then, with the lock free and nobody waiting, wrote no
    mark, so the lead's later reassert became the key's flight and a call after the
    forget joined it. The mark is written whenever no flight of the key is known."""
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


def test_fresh_callers_of_one_flight_share_the_next_across_a_failover() -> None:
    """Real processes: p2's and p3's fresh calls wait at the coordinator for F's end;
    the coordinator dies; p3 reconnects first and leads the next flight G; p2's fresh
    call, sent again, once waited for G's end and ran the work a third time (its new
    coordinator could not tell it came before G began). It was sent to the term before,
    so any flight of the new term began after it: it joins G (review of 2026-11-30)."""
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
