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

from .dirproc import HELLO_OK, RawConn
from .ingroup import close, coordinating, hold_key_lock

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
        with RawConn(sock) as o, RawConn(sock) as n, RawConn(sock) as x, RawConn(sock) as y:
            for conn in (o, n, x, y):
                assert conn.hello() == HELLO_OK
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
        with RawConn(sock) as o, RawConn(sock) as n, RawConn(sock) as x:
            for conn in (o, n, x):
                assert conn.hello() == HELLO_OK
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
