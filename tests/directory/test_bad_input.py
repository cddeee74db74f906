"""Bad input to the directory scope: a too-long socket path, a coordinator of another
protocol version, and raw bytes on the socket of a live coordinator.

After each bad connection the coordinator must still be the same process, and the
calls of other processes must still work (docs/api.md: bad input closes or answers that
connection only).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from unittest.mock import ANY

import pytest

from flightgroup import JSON, FlightGroup
from flightgroup.directory import wire

from ..dirproc import (
    HELLO,
    MAX_FRAME_BYTES,
    Child,
    Harness,
    RawConn,
    assert_error,
    assert_value,
)
from ..support import run

pytestmark = pytest.mark.timeout(60)

V2 = b'{"protocol":"flightgroup","version":2}\n'
OK = b'{"ok":true}\n'


# -- the socket path --------------------------------------------------------------


def _dir_with_socket_path_of(h: Harness, size: int, char: str = "a") -> str:
    """A directory under h.root whose flight.sock path is ``size`` bytes of UTF-8."""
    base = os.path.join(h.root, "")
    fixed = len(base.encode()) + len("/flight.sock")
    width = len(char.encode())
    name = char * ((size - fixed) // width) + "b" * ((size - fixed) % width)
    path = base + name
    assert len(os.path.join(path, "flight.sock").encode()) == size
    return path


@pytest.mark.parametrize("char", ["a", "é"])
def test_socket_path_over_103_bytes_is_refused_at_construction(h: Harness, char: str) -> None:
    long = _dir_with_socket_path_of(h, 104, char)
    with pytest.raises(ValueError, match="103"):
        FlightGroup(directory=long, codec=JSON)
    assert not os.path.exists(long)  # construction creates nothing


def test_socket_path_of_103_bytes_works(h: Harness) -> None:
    path = _dir_with_socket_path_of(h, 103)
    FlightGroup(directory=path, codec=JSON).close()
    assert not os.path.exists(path)
    h.dir = path
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    b.call("l", "k", h.work(block=True, **{"return": 1}))
    b.expect("started", "l")
    a.call("j", "k", h.work())
    a.expect("joined", "j")
    b.release("l")
    assert_value(a.expect("done", "j"), 1, joined=True)
    assert_value(b.expect("done", "l"), 1, joined=False)


# -- a directory that cannot be made ------------------------------------------------


@pytest.mark.parametrize("where", ["under a file", "deeper under a file", "a file itself"])
def test_a_directory_that_cannot_be_made_fails_every_call_naming_it_and_why(
    tmp_path: Path, where: str
) -> None:
    """A file in the directory's path: NotADirectoryError naming both, at every call."""
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    directory = {
        "under a file": blocker / "flights",
        "deeper under a file": blocker / "a" / "flights",
        "a file itself": blocker,
    }[where]
    g = FlightGroup(directory=str(directory), codec=JSON)  # construction makes nothing
    try:
        errors = []
        for call in (lambda: g.run_sync("k", lambda: 1), lambda: run(g.run("k", one))):
            with pytest.raises(NotADirectoryError) as caught:
                call()
            errors.append(caught.value)
        for error in errors:  # the first call's error, and the same one after it
            assert error.errno == errno.ENOTDIR
            assert str(error) == (
                f"[Errno 20] cannot create the group's directory {str(directory)!r}: "
                f"{str(blocker)!r} is a file, not a directory"
            )
        assert blocker.read_text() == "not a folder"
    finally:
        g.close()


def test_a_directory_without_permission_to_make_it_raises_permission_error() -> None:
    """No permission to make the directory: PermissionError naming it and the folder.

    Made in a child process that is not root (root may create folders anywhere: a root
    test run drops the child to the user nobody), in a folder it may read, not write."""
    base = tempfile.mkdtemp(prefix="fgperm", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        locked = os.path.join(base, "locked")
        os.mkdir(locked, 0o555)
        os.chmod(locked, 0o555)
        program = textwrap.dedent(
            f"""
            import importlib, os, pkgutil
            import flightgroup
            from flightgroup import JSON, FlightGroup
            # Everything a call imports, imported while the files can still be read.
            for sub in ("directory", "engine", "scope"):
                package = importlib.import_module("flightgroup." + sub)
                for found in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                    importlib.import_module(found.name)
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            g = FlightGroup(directory={os.path.join(locked, "flights")!r}, codec=JSON)
            try:
                g.run_sync("k", lambda: 1)
            except PermissionError as exc:
                print(type(exc).__name__, exc)
            finally:
                g.close()
            """
        )
        done = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, timeout=30,
            cwd="/",
        )
        assert done.returncode == 0, done.stderr
        assert re.match(r"PermissionError .*group's directory .*no permission to", done.stdout), (
            done.stdout, done.stderr,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def one() -> int:
    return 1


# -- another protocol version -----------------------------------------------------


def test_coordinator_of_another_version_gives_protocol_version_error(h: Harness) -> None:
    os.makedirs(h.dir, 0o700)
    fd = h.take_election()
    fake = h.fake_coordinator(V2)
    p = h.spawn("p", reconnect_timeout=30)  # the recovery below is not a race with it
    for mode in ("sync", "async"):
        p.call(mode, "k", h.work(**{"return": 1}), mode=mode)
        attrs = assert_error(p.expect("done", mode), "ProtocolVersionError")
        assert (attrs["ours"], attrs["theirs"]) == (1, 2)
        assert fake.hellos.get(timeout=20) == HELLO  # byte for byte
    assert h.journal() == []

    # When the other version is gone, the process is served again by itself.
    fake.close()
    h.give_back_election(fd)
    assert h.coordinator_pid() == p.pid
    p.call("again", "k", h.work(**{"return": 2}))
    assert_value(p.expect("done", "again"), 2, joined=False)
    assert h.coordinator_pid() == p.pid


# -- raw bytes on a live coordinator ----------------------------------------------


@pytest.fixture
def served(h: Harness) -> tuple[Harness, Child, Child]:
    """a coordinates; b is another process with a flight of "k" in progress that a
    joined, so bad input meets a live group."""
    a = h.spawn_warm("a")
    b = h.spawn_warm("b")
    assert h.coordinator_pid() == a.pid
    b.call("l", "k", h.work(block=True, **{"return": "unharmed"}))
    b.expect("started", "l")
    a.call("j", "k", h.work())
    a.expect("joined", "j")
    return h, a, b


def _still_serving(h: Harness, a: Child, b: Child) -> None:
    """The same coordinator serves, other processes' calls work, the flight in progress
    is intact."""
    assert a.alive()
    assert h.coordinator_pid() == a.pid
    b.roundtrip("after")
    a.roundtrip("after")
    with RawConn(h.path("flight.sock")) as conn:
        assert conn.hello() == OK
    assert not a.seen("done", "j")
    b.release("l")
    assert_value(b.expect("done", "l"), "unharmed", joined=False)
    assert_value(a.expect("done", "j"), "unharmed", joined=True)
    assert len(h.runs_of("k")) == 1


def test_good_hello_and_status(served: tuple[Harness, Child, Child]) -> None:
    h, a, b = served
    with RawConn(h.path("flight.sock")) as conn:
        assert conn.hello() == OK  # byte for byte
        conn.send_frame({"op": "status", "id": 1})
        header, _ = conn.read_frame()
        assert header["op"] == "status" and header["id"] == 1
        flights = [f for f in header["flights"] if f["key"] == "k"]
        assert len(flights) == 1
        flight = flights[0]
        assert set(flight) == {"key", "token", "leader_pid", "joiners", "age_s"}
        assert flight["leader_pid"] == b.pid
        assert flight["joiners"] == 1
        assert flight["token"] == b.last("started", "l")["token"]
        assert isinstance(flight["age_s"], int | float) and flight["age_s"] >= 0
    _still_serving(h, a, b)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param((MAX_FRAME_BYTES + 1).to_bytes(4, "big"), id="oversized-length"),
        pytest.param((2**32 - 1).to_bytes(4, "big"), id="huge-length"),
        pytest.param((100).to_bytes(4, "big") + b'{"op":"st', id="truncated-frame"),
        pytest.param(b"\x00\x00", id="truncated-header"),
        pytest.param((8).to_bytes(4, "big") + b"not json", id="not-json"),
        pytest.param((0).to_bytes(4, "big"), id="empty-body"),
        pytest.param((5).to_bytes(4, "big") + b"[1,2]", id="not-an-object"),
        pytest.param((8).to_bytes(4, "big") + b'{"id":1}', id="no-op"),
        pytest.param((15).to_bytes(4, "big") + b'{"op":5,"id":1}', id="op-not-a-string"),
        pytest.param((4).to_bytes(4, "big") + b"\xff\xfe{}", id="not-utf8"),
    ],
)
def test_bad_frame_closes_that_connection_only(
    served: tuple[Harness, Child, Child], data: bytes
) -> None:
    h, a, b = served
    with RawConn(h.path("flight.sock")) as conn:
        assert conn.hello() == OK
        conn.send(data)
        conn.sock.shutdown(socket.SHUT_WR)  # the stream ends here
        rest = conn.closed_by_peer(timeout=15)
        assert b'"ok":true' not in rest
    _still_serving(h, a, b)


def test_oversized_length_closes_without_waiting_for_the_body(
    served: tuple[Harness, Child, Child],
) -> None:
    h, a, b = served
    with RawConn(h.path("flight.sock")) as conn:
        assert conn.hello() == OK
        conn.send((MAX_FRAME_BYTES + 1).to_bytes(4, "big"))  # and nothing more, no EOF
        conn.closed_by_peer(timeout=15)
    _still_serving(h, a, b)


@pytest.mark.parametrize(
    ("header", "answer_id"),
    [
        pytest.param({"op": "bogus", "id": 7}, 7, id="unknown-op"),
        pytest.param({"op": "bogus", "id": "seven"}, None, id="unknown-op-bad-id"),
        pytest.param({"op": "bogus"}, None, id="unknown-op-no-id"),
        pytest.param({"op": "bogus", "id": True}, None, id="unknown-op-bool-id"),
        pytest.param({"op": "run", "id": 9}, 9, id="run-without-key"),
        pytest.param({"op": "run", "id": 10, "key": 5}, 10, id="run-key-not-str"),
        pytest.param({"op": "run", "id": 11, "key": ""}, 11, id="run-empty-key"),
        pytest.param({"op": "land", "id": 12, "token": "x", "outcome": "value"}, 12, id="bad-land"),
    ],
)
def test_unknown_op_or_bad_fields_answered_and_connection_stays_open(
    served: tuple[Harness, Child, Child], header: dict[str, object], answer_id: int | None
) -> None:
    h, a, b = served
    with RawConn(h.path("flight.sock")) as conn:
        assert conn.hello() == OK
        conn.send_frame(header)
        answer, _ = conn.read_frame()
        assert answer["op"] == "error", answer
        assert answer["id"] == answer_id
        assert isinstance(answer["message"], str) and answer["message"]
        # The connection stays open and is still served.
        conn.send_frame({"op": "status", "id": 100})
        status, _ = conn.read_frame()
        assert status["op"] == "status" and status["id"] == 100
        assert [f["key"] for f in status["flights"]].count("k") == 1
    _still_serving(h, a, b)


@pytest.mark.timeout(60)
def test_no_hello_within_the_handshake_timeout_is_dropped(
    served: tuple[Harness, Child, Child],
) -> None:
    h, a, b = served
    with RawConn(h.path("flight.sock")) as silent, RawConn(h.path("flight.sock")) as partial:
        partial.send(HELLO[:10])  # a hello that never ends
        # While they hang, everyone else is served.
        b.roundtrip("meanwhile")
        assert silent.closed_by_peer(timeout=20) == b""
        assert b'"ok":true' not in partial.closed_by_peer(timeout=20)
    _still_serving(h, a, b)


@pytest.mark.parametrize(
    "hello",
    [
        pytest.param(V2, id="version-2"),
        pytest.param(b'{"protocol":"flightgroup","version":0}\n', id="version-0"),
        pytest.param(b'{"version":3,"protocol":"flightgroup"}\n', id="fields-reordered"),
    ],
)
def test_other_version_hello_gets_the_version_line_and_is_closed(
    served: tuple[Harness, Child, Child], hello: bytes
) -> None:
    h, a, b = served
    with RawConn(h.path("flight.sock")) as conn:
        assert conn.hello(hello) == HELLO  # the coordinator's own version, byte for byte
        assert conn.closed_by_peer(timeout=15) == b""
    _still_serving(h, a, b)


@pytest.mark.parametrize(
    "hello",
    [
        pytest.param(b"hello there\n", id="not-json"),
        pytest.param(b"[1]\n", id="not-an-object"),
        pytest.param(b'{"protocol":"other","version":1}\n', id="other-protocol"),
        pytest.param(b'{"protocol":"flightgroup","version":"1"}\n', id="version-not-int"),
        pytest.param(b'{"protocol":"flightgroup"}\n', id="no-version"),
    ],
)
def test_hello_that_is_not_a_flightgroup_hello_is_refused_with_a_reason(
    served: tuple[Harness, Child, Child], hello: bytes
) -> None:
    h, a, b = served
    with RawConn(h.path("flight.sock")) as conn:
        line = conn.hello(hello)
        assert line.endswith(b"\n")
        answer = json.loads(line)
        assert answer["ok"] is False
        assert isinstance(answer["error"], str) and answer["error"]
        assert conn.closed_by_peer(timeout=15) == b""
    _still_serving(h, a, b)


def test_hello_with_other_fields_is_served(served: tuple[Harness, Child, Child]) -> None:
    h, a, b = served
    with RawConn(h.path("flight.sock")) as conn:
        assert conn.hello(b'{"protocol":"flightgroup","version":1,"client":"x"}\n') == OK
        conn.send_frame({"op": "status", "id": 1})
        assert conn.read_frame()[0]["id"] == 1
    _still_serving(h, a, b)


def test_hello_over_1024_bytes_is_refused(served: tuple[Harness, Child, Child]) -> None:
    h, a, b = served
    with RawConn(h.path("flight.sock")) as conn:
        conn.send(b"{" + b" " * 2000)  # no newline within 1,024 bytes
        rest = conn.closed_by_peer(timeout=15)  # closed, never served
        assert b'"ok":true' not in rest
    _still_serving(h, a, b)


def test_many_bad_connections_in_a_row(served: tuple[Harness, Child, Child]) -> None:
    h, a, b = served
    for i in range(30):
        with RawConn(h.path("flight.sock")) as conn:
            if i % 3 == 0:
                conn.send(b"garbage\n")
            elif i % 3 == 1:
                assert conn.hello() == OK
                conn.send((MAX_FRAME_BYTES + 1 + i).to_bytes(4, "big"))
            else:
                assert conn.hello() == OK
                conn.send_frame({"op": "bogus", "id": i})
                assert conn.read_frame()[0]["op"] == "error"
    _still_serving(h, a, b)


def test_frames_split_and_bunched_across_connections_are_each_read_whole(
    served: tuple[Harness, Child, Child],
) -> None:
    """Every connection is read into one buffer of the coordinator (wire.READ_SIZE):
    a frame cut in pieces on one connection, with whole frames of another arriving
    between the pieces, and a frame several times the buffer's size, are each read
    whole and answered on their own connection."""
    h, a, b = served
    status = {"op": "status", "id": 0}
    with RawConn(h.path("flight.sock")) as one, RawConn(h.path("flight.sock")) as two:
        assert one.hello() == OK and two.hello() == OK
        cut = wire.status_frame(41)
        for i, piece in enumerate((cut[:3], cut[3:9], cut[9:])):
            one.send(piece)
            two.send(b"".join(wire.status_frame(100 * i + n) for n in range(3)))  # bunched
            for n in range(3):
                assert two.read_frame()[0] == {**status, "id": 100 * i + n, "flights": ANY}
        assert one.read_frame()[0]["id"] == 41
        # A forget of a key three read buffers long (the coordinator acks its id).
        long_key = "x" * (3 * wire.READ_SIZE)
        one.send(wire.forget_frame(long_key, id=42) + wire.status_frame(43))
        assert one.read_frame()[0] == {"op": "ack", "id": 42}
        assert one.read_frame()[0]["id"] == 43
    _still_serving(h, a, b)
