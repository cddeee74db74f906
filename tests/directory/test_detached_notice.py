"""A forget() reaches the local flights of other processes (ADR 0026): the coordinator
tells the leader and the joiners of the flight it detached (`detached`), and their
process's next call of the key no longer joins its local flight of it.

Interleavings are forced with child processes, raw connections and the order of frames
on one connection (a roundtrip of a process after the forget was confirmed proves its
group read every frame the coordinator wrote it before); nothing waits on a bare sleep.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from flightgroup.directory import wire
from flightgroup.directory.answers import Answers

from ..dirproc import HELLO_OK, Harness, RawConn, assert_value
from ..ingroup import Background, arbiter, close, coordinating, group
from ..support import table_of, wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_joining_process_stops_handing_a_forgotten_flight_to_its_new_calls(h: Harness) -> None:
    a = h.spawn_warm("a")  # coordinates, and forgets
    b = h.spawn_warm("b")  # leads the flight that is forgotten
    c = h.spawn_warm("c")  # joined it, then calls the key again
    assert h.coordinator_pid() == a.pid
    b.call("l", "k", h.work(block=True, **{"return": "old"}))
    b.expect("started", "l")
    c.call("j1", "k", h.work(**{"return": "never"}))
    c.expect("joined", "j1")
    a.send(cmd="forget", key="k")
    assert a.expect("forgot")["error"] is None
    c.roundtrip("sync")  # c's group has read the notice, written before the forget's ack

    c.call("j2", "k", h.work(**{"return": "new"}))
    # j2 went to the coordinator (it waits for b's key lock) instead of joining c's
    # local flight, which still waits for the old outcome.
    c.roundtrip("after")
    assert not c.seen("joined", "j2")
    assert not c.seen("done", "j2")
    b.release("l")
    assert_value(b.expect("done", "l"), "old", joined=False)
    assert_value(c.expect("done", "j1"), "old", joined=True)
    # docs/api.md: after forget(key) "the next call of the key leads a new flight".
    assert_value(c.expect("done", "j2"), "new", joined=False)
    assert [pid for pid, _, _ in h.runs_of("k")] == [b.pid, c.pid]


def test_the_leading_process_stops_handing_a_forgotten_flight_to_its_new_calls(
    h: Harness,
) -> None:
    a = h.spawn_warm("a")  # coordinates, and forgets
    b = h.spawn_warm("b")  # leads the flight that is forgotten, then calls the key again
    assert h.coordinator_pid() == a.pid
    b.call("l", "k", h.work(block=True, **{"return": "old"}))
    b.expect("started", "l")
    a.send(cmd="forget", key="k")
    assert a.expect("forgot")["error"] is None
    b.roundtrip("sync")

    b.call("l2", "k", h.work(**{"return": "new"}))
    b.roundtrip("after")
    assert not b.seen("joined", "l2")  # it waits for the key lock its own flight holds
    b.release("l")
    assert_value(b.expect("done", "l"), "old", joined=False)
    assert_value(b.expect("done", "l2"), "new", joined=False)
    assert [pid for pid, _, _ in h.runs_of("k")] == [b.pid, b.pid]


def test_a_late_notice_leaves_the_keys_next_local_flight_alone(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The notice names the call of one flight. A process that forgot the key itself
    may hear it after a new local call began the key's next flight: that one stays."""
    a = coordinating(directory)
    b = group(directory)
    held: list[wire.Answer] = []
    answer = Answers.answer

    def stash_notices(self: Answers, got: wire.Answer) -> None:
        if isinstance(got, wire.Detached):
            held.append(got)  # read later, once the next flight is in the table
        else:
            answer(self, got)

    monkeypatch.setattr(Answers, "answer", stash_notices)
    first_may_end, second_may_end = threading.Event(), threading.Event()
    runs: list[str] = []

    def work(name: str, gate: threading.Event) -> Callable[[], str]:
        def body() -> str:
            runs.append(name)
            assert gate.wait(20)
            return name

        return body

    try:
        first = Background(lambda: b.run_sync("k", work("old", first_may_end)))
        wait_until(lambda: runs == ["old"], "b leads the first flight")
        forgotten = table_of(b).flights["k"]
        b.forget("k")
        assert len(held) == 1  # written before the forget's ack, which came
        second = Background(lambda: b.run_sync("k", work("new", second_may_end)))
        wait_until(
            lambda: table_of(b).flights.get("k") not in (None, forgotten),
            "the next local flight is in the table",
        )
        following = table_of(b).flights["k"]
        read = threading.Event()
        arbiter(b)._background.post(lambda: (answer(arbiter(b)._answers, held[0]), read.set()))
        assert read.wait(10)
        assert table_of(b).flights.get("k") is following
        third = Background(lambda: b.run_sync("k", work("never", second_may_end)))
        # (Its on_join waits for the scope's answer to that flight: ADR 0025.)
        wait_until(lambda: following.joiners == 1, "a third call joins the next local flight")
        first_may_end.set()
        assert first.wait().value == "old"
        wait_until(lambda: runs == ["old", "new"], "the next flight leads once the key lock frees")
        second_may_end.set()
        assert (second.wait().value, second.wait().joined) == ("new", False)
        assert (third.wait().value, third.wait().joined) == ("new", True)
        assert runs == ["old", "new"]
    finally:
        first_may_end.set()
        second_may_end.set()
        close(a, b)


# -- the coordinator, on raw connections ------------------------------------------------


def _notices(header: dict[str, object]) -> dict[str, object]:
    return {**header, "notices": True}


def test_the_coordinator_tells_the_leader_and_every_joiner_that_said_notices(
    directory: str,
) -> None:
    a = coordinating(directory)
    sock = os.path.join(directory, "flight.sock")
    try:
        with (
            RawConn(sock) as leader,
            RawConn(sock) as new,
            RawConn(sock) as old,
            RawConn(sock) as forgetter,
        ):
            for conn in (leader, new, old, forgetter):
                assert conn.hello() == HELLO_OK
            leader.send_frame(_notices({"op": "run", "id": 5, "key": "k"}))
            token = leader.expect("lead")[0]["token"]
            new.send_frame(_notices({"op": "run", "id": 6, "key": "k"}))
            assert new.expect("joined")[0]["token"] == token
            old.send_frame({"op": "run", "id": 7, "key": "k"})  # an earlier release
            assert old.expect("joined")[0]["token"] == token
            forgetter.send_frame({"op": "forget", "key": "k", "id": 1})
            assert forgetter.expect("ack")[0] == {"op": "ack", "id": 1}
            assert leader.expect("detached")[0] == {"op": "detached", "id": 5}
            assert new.expect("detached")[0] == {"op": "detached", "id": 6}
            old.served()  # the status answer is the next frame: no notice came before it
            # The detached flight still lands for its joiners.
            leader.send(wire.land_frame(5, token, wire.Value(b'"v"')))
            assert leader.expect("ack")[0]["id"] == 5
            assert new.expect("landed")[1] == b'"v"'
            assert old.expect("landed")[1] == b'"v"'
    finally:
        close(a)


def test_a_rejoin_or_a_reassert_of_a_forgotten_flight_hears_it_in_the_next_term(
    directory: str,
) -> None:
    """A notice can be lost with the coordinator that wrote it: the next term tells the
    flight's leader when it reasserts and each joiner when it rejoins."""
    a = coordinating(directory)
    b = group(directory)
    assert b.run_sync("warm-up", lambda: 0).value == 0  # b takes part in the election
    sock = os.path.join(directory, "flight.sock")
    try:
        with RawConn(sock) as leader, RawConn(sock) as other:
            assert leader.hello() == HELLO_OK and other.hello() == HELLO_OK
            leader.send_frame({"op": "run", "id": 1, "key": "k"})
            token = leader.expect("lead")[0]["token"]
            other.send_frame({"op": "forget", "key": "k", "id": 2})
            assert other.expect("ack")[0]["id"] == 2
        close(a)
        wait_until(lambda: arbiter(b)._state.coordinator is not None, "b coordinates")
        with RawConn(sock) as leader, RawConn(sock) as joiner, RawConn(sock) as old:
            for conn in (leader, joiner, old):
                assert conn.hello() == HELLO_OK
            leader.send_frame(_notices({"op": "reassert", "id": 1, "key": "k", "token": token}))
            assert leader.expect("detached")[0] == {"op": "detached", "id": 1}
            joiner.send_frame(_notices({"op": "run", "id": 3, "key": "k", "flight": token}))
            assert joiner.expect("joined")[0]["token"] == token
            assert joiner.expect("detached")[0] == {"op": "detached", "id": 3}
            old.send_frame({"op": "run", "id": 4, "key": "k", "flight": token})
            assert old.expect("joined")[0]["token"] == token
            old.served()
    finally:
        close(b)


@pytest.mark.parametrize("field", ["notices"])
@pytest.mark.parametrize("op", ["run", "reassert"])
@pytest.mark.parametrize("bad", [1, "true", [], {}])
def test_a_notices_field_that_is_not_a_boolean_is_a_bad_field(
    op: str, field: str, bad: object
) -> None:
    header = {"op": op, "id": 1, "key": "k", "token": 5, field: bad}
    with pytest.raises(wire.BadRequest, match=field):
        wire.parse_request(header, None)


def test_the_notices_field_and_the_detached_answer_on_the_wire() -> None:
    run = wire.parse_request({"op": "run", "id": 1, "key": "k", "notices": True}, None)
    assert isinstance(run, wire.Run) and run.notices
    plain = wire.parse_request({"op": "run", "id": 1, "key": "k", "notices": None}, None)
    assert isinstance(plain, wire.Run) and not plain.notices
    reassert = wire.parse_request(
        {"op": "reassert", "id": 1, "key": "k", "token": 3, "notices": True}, None
    )
    assert isinstance(reassert, wire.Reassert) and reassert.notices
    # The builders write what encode_frame writes, and the parsers read it back.
    assert wire.run_frame(1, "k", fresh=True, after=4, notices=True) == wire.encode_frame(
        {"op": "run", "id": 1, "key": "k", "fresh": True, "after": 4, "notices": True}
    )
    assert wire.reassert_frame(1, "k", 3, notices=True) == wire.encode_frame(
        {"op": "reassert", "id": 1, "key": "k", "token": 3, "notices": True}
    )
    assert wire.detached_frame(9) == wire.encode_frame({"op": "detached", "id": 9})
    assert wire.parse_answer_frame({"op": "detached", "id": 9}, None) == wire.Detached(9)
    with pytest.raises(wire.WireError):
        wire.parse_answer_frame({"op": "detached", "id": "9"}, None)
