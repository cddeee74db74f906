"""Flights reasserted to a new coordinator after a failover (ADR 0022): a landed flight
that reasserts beside a newer flight of its key has its landing taken for its own
joiners and acknowledged, and the newer flight stays the key's; a reassert older than a
flight that already ran, or of a pending lead another process's flight overtook, is
refused (the lead's lease is lost); a frozen joiner still gets its leader's value; the
reassert's fields are checked.

Most are driven over raw connections to a coordinator of the test process, so the order
of the reasserts is the test's; nothing waits on a bare sleep.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import pytest

from flightgroup import (
    LeaseLostError,
    current_lease,
)
from flightgroup.directory import fs, wire

from ..dirproc import (
    HELLO_OK,
    Harness,
    RawConn,
    assert_value,
    raw_conns,
    wait_for,
)
from ..ingroup import Background, arbiter, close, coordinating, group, hold_key_lock, run_of_k_after
from ..support import wait_until

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


def test_a_frozen_joiner_gets_the_value_when_a_newer_lead_reasserts_first(h: Harness) -> None:
    """A frozen joiner gets its leader's value though a newer lead reasserts first."""
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
    # value still reaches it"; docs/api.md: a joiner is interrupted only when the leader died
    # or lost its lease).
    done = c.expect("done", "j")
    assert_value(done, big, joined=True)
    assert done["token"] == started["token"]
    assert_value(x.expect("done", "n"), "next", joined=False)


def test_a_rejected_reassert_of_a_pending_lead_is_not_dropped(directory, monkeypatch):
    """A pending lead whose reassert is refused loses its lease; it never runs as a lead.

    A lead told while its caller still opens the key's file is reasserted by the reconnect (it is
    pending); a new coordinator that let another process lead the key meanwhile refuses it. The
    refusal reaches the pending lead: its lease is lost, and it never runs its work after the
    other flight under an older fencing token."""
    a = coordinating(directory)
    b = group(directory)
    c = group(directory)
    try:
        b.run_sync("warm-b", lambda: 0)
        c.run_sync("warm-c", lambda: 0)
        barb = arbiter(b)

        # b's caller thread stalls while it opens the key's file (a slow first create)
        in_open, open_go = threading.Event(), threading.Event()
        real_path = fs.key_lock_path

        def slow_path(d, key):
            if key == "k" and threading.current_thread().name == "b-caller":
                in_open.set()
                assert open_go.wait(30)
            return real_path(d, key)

        monkeypatch.setattr(fs, "key_lock_path", slow_path)
        # ... and the coordinator answers b's run only once b's caller is in that open
        run_of_k_after(in_open, arbiter(a)._state.coordinator, monkeypatch)

        # b's next reconnect waits until the test lets it go
        connect_go = threading.Event()
        real_connect = barb._connection.connect

        async def gated_connect(*args):
            await asyncio.to_thread(connect_go.wait, 30)
            return await real_connect(*args)

        # b hears every answer; the test sees the rejection
        answers: list[object] = []
        real_answer = barb._answers.answer

        def answer(ans):
            answers.append(ans)
            real_answer(ans)

        barb._answers.answer = answer  # type: ignore[method-assign]

        b_lease = {}

        def b_work():
            lease = current_lease()
            b_lease["lost"] = lease.lost
            b_lease["token"] = lease.token
            return "b"

        b_call = Background(lambda: b.run_sync("k", b_work), name="b-caller")
        assert in_open.wait(10)
        # the lead reached b's loop while its caller opens the file: parked as pending
        wait_until(lambda: any(call.pending is not None for call in barb._state.calls.values()),
                   "b was told to lead while it opens the key file")

        barb._connection.connect = gated_connect  # type: ignore[method-assign]
        with_a_closed = Background(a.close)
        with_a_closed.wait(20)  # the coordinator is gone (b, c reconnect to a new one)

        c_started, c_go = threading.Event(), threading.Event()

        def c_work():
            c_started.set()
            assert c_go.wait(30)
            return "c"

        c_call = Background(lambda: c.run_sync("k", c_work))
        assert c_started.wait(15)  # c leads k in the new term (its key lock was free)

        connect_go.set()  # b reconnects: it reasserts its pending lead, which is refused
        wait_until(lambda: any(isinstance(x, wire.Rejected) for x in answers),
                   "b's reassert was rejected")

        open_go.set()  # b's open returns
        c_go.set()
        c_result = c_call.wait()
        try:
            b_result = b_call.wait()
        except LeaseLostError:
            return  # its lease was lost, as the rejection said: fine
        # A lead the coordinator refused must not run as if it held its lease, and a
        # flight that ran after c's must not carry an older fencing token.
        assert not (b_lease.get("lost") is False and b_result.token < c_result.token), (
            f"b's refused lead ran with its lease intact (lease.lost={b_lease.get('lost')}),"
            f" token {b_result.token:#x} after c's flight with token {c_result.token:#x}"
        )
    finally:
        open_go.set()
        connect_go.set()
        close(b, c)
        close(a)


def test_a_reassert_of_a_flight_a_newer_one_of_its_key_overtook_is_refused(
    directory: str,
) -> None:
    """A reassert of a flight that a newer flight of its key overtook is refused.

    After a failover, a lead of the earlier term that still waited for the key lock reasserts;
    meanwhile a new call led the key in this term, ran and ended (its token is in the key's file,
    and not among the endings, which record reasserted flights only). The reassert is refused, so
    new calls never join a flight whose token is older than one that already ran."""
    a = coordinating(directory)
    sock = os.path.join(directory, "flight.sock")
    epoch = arbiter(a)._state.coordinator.epoch  # type: ignore[union-attr]
    older, ran = (epoch - 1) << 32 | 7, epoch << 32 | 1
    try:
        with raw_conns(sock, 2) as (stale, other):
            # the flight that ran and ended in this term wrote its token under the lock
            fd = hold_key_lock(directory, "k")
            os.pwrite(fd, b"%-20d\n" % ran, 0)
            os.close(fd)
            stale.send(wire.reassert_frame(1, "k", older, notices=True))
            assert stale.expect("rejected")[0]["id"] == 1
            other.send(wire.run_frame(1, "k"))
            assert other.expect("lead")[0]["token"] > ran  # nobody joins the stale one
            # a reassert of a flight newer than what ran is still taken back
            other.send(wire.reassert_frame(2, "j", ran + 1))
            other.served()
            assert [f["key"] for f in _status(other)].count("j") == 1
    finally:
        close(a)


def _status(conn: Any) -> list[dict[str, Any]]:
    conn.send_frame({"op": "status", "id": 77})
    return list(conn.expect("status")[0]["flights"])
