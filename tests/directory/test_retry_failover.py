"""A flight across a coordinator failover: its joiners get its value, and a flight that
retried is named by every token it had.

Under a Retry policy each attempt of a directory flight gets a new token (`attempt`),
and the coordinator tells the joiners with a second `joined`. A process may miss that
frame: the coordinator was frozen while the attempt was asked (the leader asks the next
coordinator again, which gives yet another token), or the frame sat in the coordinator's
write buffer behind a large value to a frozen joiner when the coordinator was killed.
The joiner then rejoins by a token the new coordinator's flight no longer has as its
current one; it still gets the leader's value (docs/directory-protocol.md: `earlier`
tokens).

The scenarios are forced with signals and pipes, never with sleeps: a frozen coordinator
answers nothing, a frozen joiner reads nothing, and a FIFO as a work's journal holds an
attempt at its first step until the test reads it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from flightgroup import (
    Retry,
    current_lease,
)
from flightgroup.directory import calls, connection, wire

from ..dirproc import Harness, RawConn, assert_value, wait_for
from ..ingroup import Background, live_coordinator
from ..ingroup import close as _close
from ..ingroup import coordinating as _coordinating
from ..ingroup import group as _group
from ..support import wait_until

BIG = 2 * 1024 * 1024  # a value that fills a frozen joiner's socket and more


class Gate:
    """A FIFO given to a work as its journal: each attempt blocks opening it (a FIFO's
    writer waits for a reader) until :meth:`pass_one` reads its line."""

    def __init__(self, h: Harness) -> None:
        self.path = os.path.join(h.root, "gate")
        os.mkfifo(self.path, 0o600)
        self._lines: queue.Queue[str] = queue.Queue()
        self._readers: list[threading.Thread] = []

    def pass_one(self, timeout: float = 20.0) -> tuple[int, str, int]:
        """Let the next attempt through; its journal line (pid, key, token)."""

        def read() -> None:
            fd = os.open(self.path, os.O_RDONLY)  # waits for the attempt to open it
            data = b""
            try:
                while chunk := os.read(fd, 4096):  # until the attempt closes it
                    data += chunk
            finally:
                os.close(fd)
            self._lines.put(data.decode())

        reader = threading.Thread(target=read, daemon=True)
        self._readers.append(reader)
        reader.start()
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no attempt came through the gate in {timeout} s") from None
        pid, key, token = line.split()
        return int(pid), key, int(token)

    def close(self) -> None:
        """Free a reader still waiting for an attempt that never came."""
        for reader in self._readers:
            if reader.is_alive():
                with contextlib.suppress(OSError):
                    os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))
                reader.join(5)


@pytest.fixture
def gate(h: Harness) -> Iterator[Gate]:
    g = Gate(h)
    try:
        yield g
    finally:
        g.close()


def _connect(h: Harness) -> RawConn:
    conn = RawConn(h.path("flight.sock"))
    assert conn.hello() == b'{"ok":true}\n'
    return conn


def flight_of(h: Harness, key: str) -> dict[str, Any] | None:
    """The coordinator's status entry of ``key`` (None: no flight of it runs)."""
    with _connect(h) as conn:
        conn.send(wire.status_frame(1))
        header, _ = conn.read_frame()
    assert header["op"] == "status", header
    flights = [f for f in header["flights"] if f["key"] == key]
    return flights[0] if flights else None


# -----------------------------------------------------------------------------
# processes
# -----------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_joiner_rejoins_when_the_retry_was_asked_of_a_frozen_coordinator(
    h: Harness, gate: Gate
) -> None:
    """The leader's `attempt` goes to a frozen coordinator, which is killed: the leader
    reasserts its first token and asks again; the new coordinator gives a token the
    joiner never heard. The joiner rejoins by the first token: it joins the flight."""
    a = h.spawn_warm("a")
    leader = h.spawn_warm("L", retry_attempts=2)
    joiner = h.spawn_warm("J")
    assert h.coordinator_pid() == a.pid
    work = {"journal": gate.path, "block": True, "raise_times": 1, "return": "v"}
    leader.call("l", "k", work)
    pid, key, t1 = gate.pass_one()
    assert (pid, key) == (leader.pid, "k")
    assert leader.expect("started", "l")["token"] == t1
    joiner.call("j", "k", h.work())
    joiner.expect("joined", "j")

    a.stop()  # answers nothing from now on
    leader.release("l")  # attempt 1 raises; the retry asks the frozen coordinator
    leader.expect("returning", "l")
    joiner.stop()  # the joiner reconnects only once the leader is back
    a.kill()
    assert h.coordinator_pid(not_pid=a.pid) == leader.pid  # the only one not frozen
    assert h.epoch() == 2

    # The leader reasserted t1 and asked again: the flight has a token of the new term;
    # attempt 2 waits at the gate.
    def retried() -> bool:
        flight = flight_of(h, "k")
        return flight is not None and flight["token"] >> 32 == 2

    wait_for(retried, "the retry's token of the new term")
    flight = flight_of(h, "k")
    assert flight is not None
    t2 = flight["token"]

    joiner.cont()  # it heard only t1: it rejoins by t1
    wait_for(
        lambda: joiner.seen("done", "j") or (flight_of(h, "k") or {}).get("joiners") == 1,
        "the joiner rejoined (or ended)",
    )
    assert not joiner.seen("done", "j"), joiner.last("done", "j")

    assert gate.pass_one() == (leader.pid, "k", t2)  # attempt 2 runs and lands
    done = leader.expect("done", "l")
    assert_value(done, "v", joined=False)
    assert done["token"] == t2
    done = joiner.expect("done", "j")
    assert_value(done, "v", joined=True)
    assert done["token"] == t2
    assert joiner.count("joined", "j") == 1  # on_join once, never again on a rejoin
    assert h.runs_of("k") == []  # the joiner never ran the work (its journal)


@pytest.mark.timeout(90)
def test_joiner_rejoins_when_the_retrys_joined_died_in_the_coordinators_buffer(
    h: Harness,
) -> None:
    """The coordinator's `joined` with the retry's token sits behind a 2 MiB value to a
    frozen joiner when the coordinator is killed: the leader, which landed with that
    token, reasserts it (with its first one); the joiner rejoins by its first token."""
    a = h.spawn_warm("a")
    x = h.spawn_warm("x")
    leader = h.spawn_warm("L", retry_attempts=2)
    joiner = h.spawn_warm("J")
    assert h.coordinator_pid() == a.pid
    x.call("bl", "big", h.work(block=True, return_chars=BIG))
    x.expect("started", "bl")
    joiner.call("jb", "big", h.work())
    joiner.expect("joined", "jb")
    leader.call("l", "k", h.work(block=True, raise_times=1, **{"return": "v"}))
    t1 = leader.expect("started", "l")["token"]
    joiner.call("jk", "k", h.work())
    joiner.expect("joined", "jk")

    joiner.stop()  # it reads nothing: its socket fills up
    x.release("bl")
    x.expect("done", "bl")
    x.roundtrip("after")  # the coordinator took x's landing: 2 MiB wait for the joiner
    leader.release("l")  # attempt 1 raises; attempt 2 gets t2; `joined` t2 queues
    t2 = leader.expect("started", "l")["token"]  # behind the value
    assert t2 > t1 and t2 >> 32 == t1 >> 32 == 1
    a.stop()  # nothing more leaves it: no ack for the leader either
    joiner.cont()  # reads what its socket holds (part of the value), not `joined` t2
    a.kill()
    assert h.coordinator_pid(not_pid=a.pid) in (x.pid, leader.pid, joiner.pid)

    done = leader.expect("done", "l")
    assert_value(done, "v", joined=False)
    assert done["token"] == t2
    done = joiner.expect("done", "jk")
    assert_value(done, "v", joined=True)
    assert done["token"] == t2
    assert joiner.count("joined", "jk") == 1
    # Retry(attempts=2): attempt 1 failed, attempt 2 landed; nobody else ran it.
    assert h.runs_of("k") == [(leader.pid, "k", t1), (leader.pid, "k", t2)]
    joiner.expect("done", "jb")  # ends too (its outcome depends on x's ack: not ours)


# -----------------------------------------------------------------------------
# the protocol, over raw sockets
# -----------------------------------------------------------------------------


def _frames_until(conn: RawConn, op: str) -> tuple[dict[str, Any], bytes]:
    header, payload = conn.read_frame()
    assert header["op"] == op, header
    return header, payload


@pytest.mark.timeout(60)
def test_a_rejoin_names_its_flight_by_any_token_it_had(h: Harness) -> None:
    """A reassert with `earlier` tokens and the coordinator's own attempts: a rejoin by
    any of them (or with one among its own `earlier`) joins; by a token the flight never
    had, it is interrupted; after the landing, the kept ending answers every token."""
    h.spawn_warm("a")
    t_old, t_missed, t1 = 3, 4, 5  # tokens of an earlier term (epoch 0)
    conns = [_connect(h) for _ in range(6)]
    leader, j_old, j_earlier, j_stranger, late_old, late_earlier = conns
    try:
        leader.send(wire.reassert_frame(1, "rk", t1, earlier=[t_old]))
        leader.send(wire.attempt_frame(1))
        t2 = _frames_until(leader, "lead")[0]["token"]
        assert t2 >> 32 == 1

        j_old.send(wire.run_frame(1, "rk", flight=t_old))
        assert _frames_until(j_old, "joined")[0]["token"] == t2
        # It heard t_missed (the leader did not) after t1: t1 names the flight.
        j_earlier.send(wire.run_frame(1, "rk", flight=t_missed, earlier=[t1]))
        assert _frames_until(j_earlier, "joined")[0]["token"] == t2
        j_stranger.send(wire.run_frame(1, "rk", flight=t_missed))
        _frames_until(j_stranger, "interrupted")

        leader.send(wire.land_frame(1, t2, wire.Value(b'"v"')))
        for joiner in (j_old, j_earlier):
            header, payload = _frames_until(joiner, "landed")
            assert header["token"] == t2 and payload == b'"v"', header
        assert _frames_until(leader, "ack")[0]["id"] == 1

        # The flight was reasserted: its ending is kept under each of its tokens.
        late_old.send(wire.run_frame(1, "rk", flight=t_old))
        header, payload = _frames_until(late_old, "landed")
        assert header["token"] == t2 and payload == b'"v"', header
        late_earlier.send(wire.run_frame(1, "rk", flight=t_missed, earlier=[t2]))
        header, payload = _frames_until(late_earlier, "landed")
        assert header["token"] == t2 and payload == b'"v"', header
    finally:
        for conn in conns:
            conn.close()


@pytest.mark.timeout(60)
def test_a_leader_that_missed_its_retrys_token_reasserts_the_flight(h: Harness) -> None:
    """A leader back on a new connection that never got the token of its last
    `attempt` reasserts an earlier token of the flight: it takes the flight over (it
    is not refused as older) and asks again; its joiner gets its landing."""
    h.spawn_warm("a")
    first, second, joiner = _connect(h), _connect(h), _connect(h)
    try:
        first.send(wire.reassert_frame(1, "mk", 5))
        first.send(wire.attempt_frame(1))
        t2 = _frames_until(first, "lead")[0]["token"]  # the answer the leader "missed"
        joiner.send(wire.run_frame(1, "mk", flight=5))
        assert _frames_until(joiner, "joined")[0]["token"] == t2

        second.send(wire.reassert_frame(7, "mk", 5))
        second.send(wire.attempt_frame(7))
        t3 = _frames_until(second, "lead")[0]["token"]
        assert t3 > t2
        assert _frames_until(joiner, "joined")[0]["token"] == t3
        first.close()  # no longer the flight's leader: closing ends nothing
        second.send(wire.land_frame(7, t3, wire.Value(b"1")))
        assert _frames_until(second, "ack")[0]["id"] == 7
        header, payload = _frames_until(joiner, "landed")
        assert header["token"] == t3 and payload == b"1", header
    finally:
        for conn in (first, second, joiner):
            conn.close()


# -----------------------------------------------------------------------------
# the client's record of a flight's tokens
# -----------------------------------------------------------------------------


def test_heard_keeps_the_earlier_tokens_oldest_first_and_bounded() -> None:
    earlier: tuple[int, ...] = ()
    earlier = calls.heard(earlier, 5, 9)
    assert earlier == (5,)
    earlier = calls.heard(earlier, 9, 12)
    assert earlier == (5, 9)
    # A coordinator that heard of no later token hands back one the call had.
    assert calls.heard(earlier, 12, 9) == (5, 12)
    assert calls.heard(earlier, 12, 12) == (5, 9)
    many: tuple[int, ...] = ()
    for token in range(1, wire.MAX_EARLIER + 10):
        many = calls.heard(many, token, token + 1)
    assert len(many) == wire.MAX_EARLIER
    assert many[-1] == wire.MAX_EARLIER + 9 and many[0] == 10


def test_fitting_drops_the_oldest_earlier_tokens_for_a_small_frame_limit() -> None:
    tokens = list(range(2**40, 2**40 + wire.MAX_EARLIER))
    rejoin = functools.partial(wire.run_frame, 1, "k", flight=2**41)
    whole = connection._fitting(rejoin, tokens, wire.DEFAULT_MAX_FRAME)
    assert whole == wire.run_frame(1, "k", flight=2**41, earlier=tokens)
    small = connection._fitting(rejoin, tokens, 1024)
    assert len(small) - 4 <= 1024
    header, _ = wire.decode_body(small[4:])
    request = wire.parse_request(header, None)
    assert isinstance(request, wire.Run)
    assert request.earlier and request.earlier == tuple(tokens[-len(request.earlier) :])
    bare = connection._fitting(rejoin, tokens, 40)  # nothing fits: no earlier tokens at all
    assert bare == wire.run_frame(1, "k", flight=2**41)


def test_joiner_of_a_retried_flight_survives_a_failover(directory: str) -> None:
    """A joiner of a flight that retried gets its value across a coordinator failover."""
    c = _coordinating(directory)
    a = _group(directory, retry=Retry(attempts=2, backoff=0.001, jitter=False))
    b = _group(directory)
    try:
        first_running, fail_first = threading.Event(), threading.Event()
        second_running, release = threading.Event(), threading.Event()
        tokens: list[int] = []

        def work() -> str:
            tokens.append(current_lease().token)
            if len(tokens) == 1:
                first_running.set()
                fail_first.wait(10)
                raise ValueError("first attempt fails")
            second_running.set()
            release.wait(10)
            return "value"

        leader = Background(lambda: a.run_sync("k", work))
        assert first_running.wait(10)
        joined = threading.Event()
        joiner = Background(lambda: b.run_sync("k", lambda: "never", on_join=joined.set))
        assert joined.wait(10)  # b joined attempt 1 (its token)
        fail_first.set()
        assert second_running.wait(10)
        assert tokens[1] > tokens[0]
        c.close()  # the coordinator goes; a or b serves now; a reasserts, b rejoins

        def rejoined() -> bool:
            if joiner.done.is_set():
                return True
            coordinator = live_coordinator(a, b)
            if coordinator is None:
                return False
            flight = coordinator._term.flights.get("k")
            return flight is not None and len(flight.joiners) == 1

        wait_until(rejoined, "b rejoined (or ended)")
        release.set()
        assert leader.wait().value == "value"
        result = joiner.wait()
        assert result.value == "value" and result.joined is True
    finally:
        release.set()
        fail_first.set()
        _close(a, b, c)


def test_joiner_of_a_flight_without_retry_survives_a_failover(directory: str) -> None:
    """A joiner of a flight without retry gets its value across a coordinator failover."""
    c = _coordinating(directory)
    a, b = _group(directory), _group(directory)
    try:
        running, release = threading.Event(), threading.Event()

        def work() -> str:
            running.set()
            release.wait(10)
            return "value"

        leader = Background(lambda: a.run_sync("k", work))
        assert running.wait(10)
        joined = threading.Event()
        joiner = Background(lambda: b.run_sync("k", lambda: "never", on_join=joined.set))
        assert joined.wait(10)
        c.close()

        def rejoined() -> bool:
            coordinator = live_coordinator(a, b)
            if coordinator is None:
                return False
            flight = coordinator._term.flights.get("k")
            return flight is not None and len(flight.joiners) == 1

        wait_until(rejoined, "b rejoined")
        release.set()
        assert leader.wait().value == "value"
        result = joiner.wait()
        assert result.value == "value" and result.joined is True
    finally:
        release.set()
        _close(a, b, c)
