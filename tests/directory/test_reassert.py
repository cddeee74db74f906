"""A flight reasserted to a new coordinator after a failover (ADR 0022): a landed flight
that reasserts after a newer flight of its key has its landing taken for its own joiners
and acknowledged, and the newer flight stays the key's; the reassert's fields are checked.

Driven over raw connections to a coordinator of the test process, so the order of the
reasserts is the test's; nothing waits on a bare sleep.
"""

from __future__ import annotations

import os

import pytest

from flightgroup.directory import wire

from ..dirproc import HELLO_OK, RawConn, raw_conns
from ..ingroup import close, coordinating, hold_key_lock

pytestmark = pytest.mark.timeout(60)


OLD = 1 << 32 | 5  # a flight of an earlier term that landed


NEW = 1 << 32 | 6  # the key's next flight, led while the landing waited for its ack


def _a_new_call_joins_the_newer_flight(x: RawConn, n: RawConn) -> None:
    """``n``'s new call of k joins the flight NEW that ``x`` leads, and gets its landing,
    never the older landed flight's outcome."""
    n.send_frame({"op": "run", "id": 1, "key": "k"})
    assert n.expect("joined")[0]["token"] == NEW
    x.send(wire.land_frame(1, NEW, wire.Value(b'"new"')))
    assert x.expect("ack")[0]["id"] == 1
    header, payload = n.expect("landed")
    assert (header["token"], payload) == (NEW, b'"new"')


def test_a_landed_reassert_older_than_the_running_flight_lands_for_its_joiners(
    directory: str,
) -> None:
    """A landed flight reasserted after a newer one of its key still lands for its joiners."""
    a = coordinating(directory)
    sock = os.path.join(directory, "flight.sock")
    try:
        with raw_conns(sock, 4) as (x, b, c, n):
            x.send_frame({"op": "reassert", "id": 1, "key": "k", "token": NEW})
            x.served()
            b.send(
                wire.reassert_frame(1, "k", OLD, landed=True)
                + wire.land_frame(1, OLD, wire.Value(b'"old"'))
            )
            header, _ = b.read_frame()
            assert header == {"op": "ack", "id": 1}  # not rejected: its lease holds
            # Its joiner, rejoining by its token, gets its value.
            c.send_frame({"op": "run", "id": 1, "key": "k", "flight": OLD})
            header, payload = c.expect("landed")
            assert (header["token"], payload) == (OLD, b'"old"')
            # A new call joins the newer flight, never gets the older one's outcome.
            _a_new_call_joins_the_newer_flight(x, n)
    finally:
        close(a)


def test_a_landed_reassert_older_than_an_ended_flight_lands_for_its_joiners(
    directory: str,
) -> None:
    """A landed flight reasserted after a newer one ended still lands for its joiners."""
    a = coordinating(directory)
    sock = os.path.join(directory, "flight.sock")
    try:
        with raw_conns(sock, 3) as (x, b, c):
            x.send(
                wire.reassert_frame(1, "k", NEW) + wire.land_frame(1, NEW, wire.Value(b"1"))
            )
            x.expect("ack")
            b.send(
                wire.reassert_frame(1, "k", OLD, landed=True)
                + wire.land_frame(1, OLD, wire.Value(b"0"))
            )
            assert b.expect("ack")[0]["id"] == 1
            c.send_frame({"op": "run", "id": 1, "key": "k", "flight": OLD})
            header, payload = c.expect("landed")
            assert (header["token"], payload) == (OLD, b"0")
    finally:
        close(a)


def test_an_older_reassert_that_did_not_land_is_still_refused(directory: str) -> None:
    """A reassert older than the key's flight that did not land is refused."""
    a = coordinating(directory)
    sock = os.path.join(directory, "flight.sock")
    try:
        with raw_conns(sock, 2) as (x, b):
            x.send_frame({"op": "reassert", "id": 1, "key": "k", "token": NEW})
            x.served()
            b.send_frame({"op": "reassert", "id": 1, "key": "k", "token": OLD})
            header, _ = b.expect("rejected")
            assert header["id"] == 1
    finally:
        close(a)


@pytest.mark.parametrize("bad", [1, "true", [], {}])
def test_a_reassert_whose_landed_is_not_a_boolean_is_answered_error(
    directory: str, bad: object
) -> None:
    """A reassert whose landed field is not a boolean is answered error; the connection stays."""
    a = coordinating(directory)
    sock = os.path.join(directory, "flight.sock")
    try:
        with RawConn(sock) as b:
            assert b.hello() == HELLO_OK
            b.send_frame({"op": "reassert", "id": 3, "key": "k", "token": OLD, "landed": bad})
            header, _ = b.expect("error")
            assert header["id"] == 3 and "landed" in header["message"]
            b.served()  # the connection stays
    finally:
        close(a)


def test_the_landed_field_is_optional_and_null_is_absent() -> None:
    """A reassert's landed field is optional, and null means absent."""
    header, _ = wire.decode_body(wire.reassert_frame(1, "k", 2)[4:])
    assert "landed" not in header
    assert wire.parse_request(header, None) == wire.Reassert(1, "k", 2)
    header["landed"] = None
    assert wire.parse_request(header, None) == wire.Reassert(1, "k", 2)
    header, _ = wire.decode_body(wire.reassert_frame(1, "k", 2, landed=True)[4:])
    assert header["landed"] is True
    assert wire.parse_request(header, None) == wire.Reassert(1, "k", 2, landed=True)


def test_a_landed_flight_whose_landing_is_still_arriving_stays_for_its_joiners_when_a_newer_one_reasserts(  # noqa: E501
    directory: str,
) -> None:
    """A landed flight still being read stays for its joiners as a newer one reasserts.

    The landed flight reasserts first and its large landing is still being read when the newer
    flight reasserts. The landed one is taken back detached, not refused: its leader gets its ack
    and its joiner its value; the newer flight takes the key."""
    a = coordinating(directory)
    sock = os.path.join(directory, "flight.sock")
    value = b'"' + b"v" * (2 * 1024 * 1024) + b'"'
    land = wire.land_frame(1, OLD, wire.Value(value))
    # The old leader's key lock, held here: a rejoin that reaches the coordinator before
    # the reassert waits for it instead of being told its flight ended.
    fd = hold_key_lock(directory, "k")
    try:
        with raw_conns(sock, 4) as (x, b, c, n):
            b.send(wire.reassert_frame(1, "k", OLD, landed=True) + land[:1000])
            c.send_frame({"op": "run", "id": 1, "key": "k", "flight": OLD})
            assert c.expect("joined")[0]["token"] == OLD  # the reassert was served
            x.send_frame({"op": "reassert", "id": 1, "key": "k", "token": NEW})
            x.served()
            b.send(land[1000:])
            header, _ = b.read_frame()
            assert header == {"op": "ack", "id": 1}  # not rejected: its lease holds
            header, payload = c.read_frame()
            assert (header["op"], header["token"], payload) == ("landed", OLD, value)
            # The newer flight is the key's: a new call joins it.
            _a_new_call_joins_the_newer_flight(x, n)
    finally:
        os.close(fd)
        close(a)


def test_a_call_waiting_for_the_key_lock_does_not_join_a_landed_reassert(
    directory: str,
) -> None:
    """A call waiting for the key lock never joins a landed flight that reasserts; it then leads.

    After a failover, a call that waits for the key's lock (a closed group's work still holds it)
    when the flight that landed "interrupted" reasserts keeps waiting, then leads: the landed
    flight is not the key's, so the call is not interrupted with it, and a call after the
    reassert waits too (ADR 0022)."""
    a = coordinating(directory)
    sock = os.path.join(directory, "flight.sock")
    fd = hold_key_lock(directory, "k")  # the closed group's work, still running
    try:
        with raw_conns(sock, 4) as (b, c, n, m):
            n.send_frame({"op": "run", "id": 1, "key": "k"})
            n.served()  # n waits for the key's lock
            b.send(
                wire.reassert_frame(1, "k", OLD, landed=True)
                + wire.land_frame(1, OLD, wire.Interrupted("its leader's group closed"))
            )
            assert b.expect("ack")[0]["id"] == 1
            # Its own joiner, rejoining by its token, still hears how it ended.
            c.send_frame({"op": "run", "id": 1, "key": "k", "flight": OLD})
            header, _ = c.expect("interrupted")
            m.send_frame({"op": "run", "id": 1, "key": "k"})
            m.served()  # a call after the reassert waits too
            n.served()  # nothing came for n's call: it still waits
            os.close(fd)  # the work ends: its lock frees
            fd = -1
            token = n.expect("lead")[0]["token"]
            assert m.expect("joined")[0]["token"] == token
            n.send(wire.land_frame(1, token, wire.Value(b'"n"')))
            assert n.expect("ack")[0]["id"] == 1
            header, payload = m.expect("landed")
            assert (header["token"], payload) == (token, b'"n"')
    finally:
        if fd >= 0:
            os.close(fd)
        close(a)
