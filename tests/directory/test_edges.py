"""The directory scope at its edges: hostile or broken peers on the Unix socket (a
number past Python's digit limit, silent peers, a half-closed peer, a coordinator that
drops every connection, one out of descriptors), the file system under the group's
directory (a key-lock path that cannot be opened, a FIFO as the epoch file, an election
that fails under a call), and process lifecycle (fork).

Beside test_bad_input.py, test_wire.py, test_fuzz.py and test_fs.py, which cover the
wire's and the file system's ordinary bad input.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from flightgroup import UnavailableError
from flightgroup.directory import epochs

from ..dirproc import HELLO, HELLO_OK, FakeCoordinator, RawConn, key_file, wait_for
from ..ingroup import Background, arbiter, close, coordinating, group

pytestmark = pytest.mark.timeout(60)


def _sock(directory: str) -> str:
    return os.path.join(directory, "flight.sock")


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def test_an_integer_literal_over_the_digit_limit_is_a_bad_field(directory: str) -> None:
    """An integer literal over Python's digit limit is a bad field; the connection stays.

    docs/directory-protocol.md: "a number too large for a float is a bad field" (answered
    ``error``, the connection stays). A 400-digit integer is; a 5,000-digit one is the same kind
    of JSON number, which Python's json refuses to convert (ValueError): it is answered ``error``
    too, and the connection with every flight it led or joined stays."""
    g = coordinating(directory)
    try:
        with RawConn(_sock(directory)) as conn:
            assert conn.hello() == HELLO_OK
            conn.send_frame({"op": "run", "id": 1, "key": "led-by-the-raw-peer"})
            assert conn.read_frame()[0]["op"] == "lead"
            huge = b"9" * 5000
            conn.send(
                _frame(
                    b'{"op":"land","id":7,"token":1,"outcome":"timeout","deadline":' + huge + b"}"
                )
            )
            conn.send_frame({"op": "status", "id": 8})
            answer, _ = conn.read_frame(5)  # the connection stays: no EOFError
            assert (answer["op"], answer["id"]) == ("error", 7), answer
            status, _ = conn.read_frame(5)
            assert status["op"] == "status"
            assert [f["key"] for f in status["flights"]] == ["led-by-the-raw-peer"]
    finally:
        close(g)


def test_a_key_lock_path_the_coordinator_cannot_open_does_not_drop_the_connection(
    directory: str,
) -> None:
    """A key-lock path the coordinator cannot open does not drop the connection.

    A directory where ``execution-locks/<sha256 of "bad">`` belongs (made by hand, a restore, a
    bug elsewhere): a ``run`` of "bad" gets an answer, and the requester's other flights go on;
    the probe's IsADirectoryError never escapes the protocol's callback."""
    g = coordinating(directory)
    try:
        os.mkdir(os.path.join(directory, "execution-locks", key_file("bad")))
        with RawConn(_sock(directory)) as conn:
            assert conn.hello() == HELLO_OK
            conn.send_frame({"op": "run", "id": 1, "key": "good"})
            assert conn.read_frame()[0]["op"] == "lead"
            conn.send_frame({"op": "run", "id": 2, "key": "bad"})
            conn.send_frame({"op": "status", "id": 3})
            answers: dict[int, dict[str, Any]] = {}
            while 3 not in answers:
                header, _ = conn.read_frame(5)  # the connection stays
                answers[header["id"]] = header
            assert 2 in answers, answers  # lead, error or interrupted: an answer
            assert [f["key"] for f in answers[3]["flights"]][:1] == ["good"], answers
    finally:
        close(g)


def test_one_unopenable_key_lock_path_does_not_stop_the_processs_other_calls(
    directory: str,
) -> None:
    """One unopenable key-lock path does not stop the process's other calls.

    The call of "bad" goes out first on each new connection (calls are resent in order); it fails
    with an error (the leader cannot open the lock file), and "ok", behind it on the same
    connection, is served."""
    g = coordinating(directory)
    try:
        os.mkdir(os.path.join(directory, "execution-locks", key_file("bad")))
        bad = Background(lambda: g.run_sync("bad", lambda: "bad ran", timeout=3))
        ok = Background(lambda: g.run_sync("ok", lambda: "ok ran", timeout=3))
        assert ok.wait(20).value == "ok ran"  # served, not its TimeoutError
        with pytest.raises(Exception) as raised:
            bad.wait(20)
        assert not isinstance(raised.value, TimeoutError), raised.value
    finally:
        close(g)


def test_a_coordinator_that_drops_every_connection_after_the_welcome_fails_the_calls(
    directory: str,
) -> None:
    """A coordinator that drops every connection after its welcome fails the calls.

    A coordinator that answers every hello ``{"ok":true}`` and then closes (it breaks on the
    first frame, it is out of memory, a proxy in front of it) serves nobody: for the client it is
    as unreachable as one that does not answer. A welcome alone does not count as connected: the
    call ends in UnavailableError once ``reconnect_timeout`` has passed without being served."""
    os.makedirs(directory, 0o700)
    election = os.open(os.path.join(directory, "flight.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(election, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the fake is the coordinator
    fake = FakeCoordinator(_sock(directory), HELLO_OK)  # welcomes each hello, then closes
    g = group(directory, reconnect_timeout=0.3)
    try:
        call = Background(lambda: g.run_sync("k", lambda: "ran", timeout=10))
        assert call.done.wait(20), "the call did not end"
        connections = fake.hellos.qsize()  # the connections made while the call waited
        assert isinstance(call.error, UnavailableError), (
            f"{call.error!r} (value {call.result!r}) after {connections} connections"
        )
        assert connections < 200, f"{connections} connections: a reconnect loop"
    finally:
        close(g)
        fake.close()
        os.close(election)


def test_silent_peers_do_not_stop_the_coordinator_serving_others_and_are_dropped(
    directory: str,
) -> None:
    """Silent peers do not stop the coordinator serving others, and are dropped.

    docs/directory-protocol.md: a peer silent for 3 s (no hello) is closed without an
    answer. A hundred of them at once (a stuck client, a probe of the same uid) must not
    hold the coordinator up: another process's call is served while they are all
    connected, and each of them is then dropped."""
    g = coordinating(directory)
    other = group(directory)
    silent: list[socket.socket] = []
    try:
        served = arbiter(g)._state.coordinator
        assert served is not None
        before = len(served._server.transports)
        for _ in range(100):
            peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            silent.append(peer)
            peer.connect(_sock(directory))
        # Every silent peer accepted (they are the coordinator's connections now).
        wait_for(
            lambda: len(served._server.transports) >= before + 100, "the silent peers accepted"
        )
        assert other.run_sync("k", lambda: "served", timeout=10).value == "served"
        end = time.monotonic() + 20  # the 3 s handshake timeout, with room
        for peer in silent:
            peer.settimeout(max(end - time.monotonic(), 0.01))
            try:
                data = peer.recv(1)
            except TimeoutError:
                raise AssertionError("a silent peer was never dropped") from None
            except ConnectionResetError:
                data = b""
            assert data == b"", f"a silent peer got {data!r}"  # no answer, only the close
    finally:
        for peer in silent:
            peer.close()
        close(other, g)


def test_a_peer_that_half_closes_after_a_request_still_gets_its_answer(directory: str) -> None:
    """A peer that half-closes after its request still gets its answer.

    A peer that sends its request and then shuts its side for writing (``shutdown
    (SHUT_WR)``, as a one-shot tool such as ``socat`` does) has asked a whole question:
    the end of its stream ends nothing the coordinator owes it. It gets the answer, then
    the coordinator closes the connection."""
    g = coordinating(directory)
    try:
        with RawConn(_sock(directory)) as conn:
            assert conn.hello(HELLO) == HELLO_OK
            conn.send_frame({"op": "status", "id": 1})
            conn.sock.shutdown(socket.SHUT_WR)
            answer, _ = conn.read_frame(10)
            assert (answer["op"], answer["id"]) == ("status", 1), answer
            assert answer["flights"] == [], answer
            assert conn.closed_by_peer(10) == b""
    finally:
        close(g)


def _last_line(path: str) -> str:
    with open(path, "rb") as f:
        lines = f.read().splitlines()
    return lines[-1].decode(errors="replace") if lines else "(none)"


_SHORT_OF_DESCRIPTORS = r"""
import json, logging, os, resource, sys
import flightgroup
from flightgroup import JSON, FlightGroup
directory, log_path = sys.argv[1], sys.argv[2]
handler = logging.FileHandler(log_path)  # opened now, before the limit
handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
logger = logging.getLogger("flightgroup")
logger.addHandler(handler)
logger.setLevel(logging.WARNING)
g = FlightGroup(directory=directory, codec=JSON)
g.run_sync("warm-up", lambda: 0)  # the only process of the directory: it coordinates
highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
limit = highest + 1 + 8  # every descriptor number below it but ~8 is taken
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
print(json.dumps({"pid": os.getpid(), "limit": limit, "module": flightgroup.__file__}),
      flush=True)
sys.stdin.readline()  # until the test is done
g.close()
"""


def test_a_coordinator_out_of_descriptors_does_not_spin_on_accept(directory: str) -> None:
    """A coordinator out of descriptors does not spin on accept; it serves once freed.

    A coordinator out of descriptors (RLIMIT_NOFILE, many peers) cannot accept the connections
    that wait in its listen backlog. It waits for a descriptor to be freed, or backs off, and
    says so a bounded number of times (never a busy loop of warnings); once descriptors are free
    again it serves as before."""
    root = os.path.dirname(directory)
    log_path = os.path.join(root, "coordinator.log")
    err_path = os.path.join(root, "coordinator.err")

    def warned() -> int:
        with open(log_path, "rb") as f:
            return sum(1 for line in f if line.startswith(b"WARNING"))

    def stderr() -> str:
        with open(err_path, errors="replace") as f:
            return f.read()[-3000:]

    with open(err_path, "wb") as err:
        child = subprocess.Popen(
            [sys.executable, "-c", _SHORT_OF_DESCRIPTORS, directory, log_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    silent: list[socket.socket] = []
    try:
        assert child.stdout is not None and child.stdin is not None
        line = Background(child.stdout.readline).wait(30)
        assert line, stderr()
        ready = json.loads(line)
        fds = f"/proc/{ready['pid']}/fd"
        for _ in range(40):  # more than the coordinator has descriptors for
            peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            silent.append(peer)
            peer.connect(_sock(directory))  # queued in the listen backlog (512)
        # The coordinator took every descriptor number it may: the next accept is EMFILE.
        wait_for(
            lambda: len(os.listdir(fds)) >= ready["limit"] or warned() > 0,
            "the coordinator out of descriptors",
            10,
        )
        first = warned()
        threading.Event().wait(1.0)  # the window the warnings are counted over
        logged = warned() - first
        assert logged <= 20, (
            f"{logged} warnings in 1 s out of descriptors; the last: {_last_line(log_path)}"
        )
        for peer in silent:
            peer.close()
        silent.clear()
        # Descriptors are free again: the coordinator serves a new connection.
        with RawConn(_sock(directory)) as conn:
            assert conn.hello() == HELLO_OK
            conn.send_frame({"op": "run", "id": 1, "key": "after"})
            assert conn.read_frame(10)[0]["op"] == "lead"
    finally:
        for peer in silent:
            peer.close()
        with contextlib.suppress(OSError):  # the child may be gone
            if child.stdin is not None:
                child.stdin.write("\n")  # its group closes, and it exits
                child.stdin.close()
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()  # this test's own child, by its pid
            child.wait(10)
        if child.stdout is not None:
            child.stdout.close()


def test_a_fifo_as_the_epoch_file_fails_the_election_instead_of_hanging(directory: str) -> None:
    """A FIFO as the epoch file fails the election with EpochError instead of hanging.

    ADR 0009: a copy that is not a decimal number is corrupt; with the other copy missing and no
    token, the election raises EpochError and nothing is written. A named pipe at
    ``flight.epoch`` (a cleanup script, a hostile user of the same uid) is no decimal number, and
    is never opened to block: the calls end in the EpochError that says what to fix, and
    ``close()`` of the group returns."""
    os.makedirs(directory)
    fifo = os.path.join(directory, "flight.epoch")
    os.mkfifo(fifo, 0o600)
    g = group(directory, reconnect_timeout=1.0)
    closing: Background | None = None
    try:
        with pytest.raises(Exception) as raised:
            g.run_sync("k", lambda: "ran", timeout=10)
        assert isinstance(raised.value, epochs.EpochError), repr(raised.value)
        closing = Background(g.close)
        assert closing.done.wait(10), "close() did not return"
    finally:
        if closing is None:
            closing = Background(g.close)
        if not closing.done.wait(0.5):
            _unblock_fifo_reader(fifo)  # let the blocked election thread go
            closing.done.wait(15)


def test_a_call_that_comes_as_the_election_fails_gets_its_error_at_once(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that comes as the election fails gets its error at once.

    A call passes submit()'s first check of the group's fatal error; the election then fails
    (EpochError), and its _fail_all runs and finds no call to fail; only then is the call
    registered. Forced in that order by hooks. submit() checks the fatal error again under the
    send lock, so the call fails at once instead of waiting for a coordinator until
    reconnect_timeout."""
    g = group(directory, reconnect_timeout=30.0)
    a = arbiter(g)
    past_check, failed_all = threading.Event(), threading.Event()
    real_ensure, real_fail_all = a._ensure_started, a._election.fail_all

    def ensure_started() -> Any:
        loop = real_ensure()  # starts the election
        past_check.set()
        assert failed_all.wait(20)
        return loop

    def next_epoch(path: str) -> int:
        assert past_check.wait(20)
        raise epochs.EpochError("the epoch cannot be told (this test)")

    def fail_all(exc: BaseException) -> None:
        real_fail_all(exc)
        failed_all.set()

    monkeypatch.setattr(a, "_ensure_started", ensure_started)
    monkeypatch.setattr(a._election, "fail_all", fail_all)
    monkeypatch.setattr(epochs, "next_epoch", next_epoch)
    try:
        with pytest.raises(Exception) as raised:
            g.run_sync("k", lambda: "ran", timeout=10)
        assert isinstance(raised.value, epochs.EpochError), repr(raised.value)
        assert failed_all.is_set()
    finally:
        close(g)


def _unblock_fifo_reader(fifo: str) -> None:
    """Open ``fifo`` for writing without blocking and close it: a reader blocked in its
    ``open`` goes on (and reads an empty file). ENXIO: no reader is there (any more)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as error:
        if error.errno != errno.ENXIO:
            raise
        return
    os.close(fd)


_FORKING_COORDINATOR = r"""
import json, os, sys, threading, warnings
from flightgroup import JSON, FlightGroup
warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: on purpose
directory = sys.argv[1]
parent_group = FlightGroup(directory=directory, codec=JSON)
parent_group.run_sync("warm", lambda: 0)  # this process coordinates
running, release = threading.Event(), threading.Event()
def work():
    running.set()
    release.wait(30)
    return "the parent's value"
led = []
leader = threading.Thread(target=lambda: led.append(parent_group.run_sync("held", work)))
leader.start()
assert running.wait(20)
to_parent_r, to_parent_w = os.pipe()
child = os.fork()
if child == 0:
    out = {}
    def say(**what):
        os.write(to_parent_w, (json.dumps(what) + "\n").encode())
    try:
        own = FlightGroup(directory=directory, codec=JSON)
        other = own.run_sync("other", lambda: "the child's value", timeout=20)
        out["other"] = [other.value, other.joined]
        joined = threading.Event()
        got = []
        def join():
            try:
                got.append(own.run_sync("held", lambda: "child led held", timeout=20,
                                        on_join=joined.set))
            except BaseException as exc:
                got.append(exc)
        joiner = threading.Thread(target=join)
        joiner.start()
        out["joined"] = joined.wait(20)
        say(stage="joined")
        joiner.join(25)
        held = got[0] if got else None
        out["held"] = [held.value, held.joined] if hasattr(held, "value") else repr(held)
        out["closed_at_once"] = parent_group.closed
        try:
            parent_group.run_sync("used-in-child", lambda: 1, timeout=2)
            out["parent_group"] = "served"
        except BaseException as exc:
            out["parent_group"] = [type(exc).__name__, str(exc), getattr(exc, "__notes__", [])]
        try:  # "held" was in flight in the parent's table when it forked
            parent_group.run_sync("held", lambda: 1, timeout=2)
            out["parent_group_held"] = "served"
        except BaseException as exc:
            out["parent_group_held"] = [
                type(exc).__name__, str(exc), getattr(exc, "__notes__", [])
            ]
        own.close()
    except BaseException as exc:
        out["error"] = repr(exc)
    say(**out)
    os._exit(0)
lines = os.fdopen(to_parent_r)
stage = json.loads(lines.readline())
release.set()
result = json.loads(lines.readline())
os.waitpid(child, 0)
leader.join(20)
result["stage"] = stage
result["parent_led"] = [led[0].value, led[0].joined] if led else None
print(json.dumps(result), flush=True)
parent_group.close()
"""


@pytest.fixture(scope="module")
def forked() -> Iterator[dict[str, Any]]:
    """What a child forked from a coordinator that leads "held" did (see the script)."""
    import shutil
    import tempfile

    root = tempfile.mkdtemp(prefix="fge", dir="/tmp")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _FORKING_COORDINATOR, os.path.join(root, "d")],
            capture_output=True,
            text=True,
            timeout=50,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        yield json.loads(proc.stdout.splitlines()[-1])
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_forked_childs_own_group_joins_the_parents_flight_and_leads_others(
    forked: dict[str, Any],
) -> None:
    """A forked child's own group joins its parent's flight and leads other keys.

    ADR 0014: the child lets go of its parent's descriptors, and makes a group of its
    own. Forked while its parent coordinates and leads "held": the child's new group
    leads a key of its own and joins the parent's running flight, getting the parent's
    value; the parent's call is unharmed."""
    assert "error" not in forked, forked
    assert forked["other"] == ["the child's value", False], forked
    assert forked["joined"] is True, forked
    assert forked["held"] == ["the parent's value", True], forked
    assert forked["parent_led"] == ["the parent's value", False], forked


def test_a_parents_group_used_in_a_forked_child_raises_instead_of_hanging(
    forked: dict[str, Any],
) -> None:
    """A parent's group used in a forked child raises GroupClosedError at once.

    ADR 0014 says the child cannot use its parent's groups. A group at module level
    and multiprocessing's "fork" start method make that easy to do by accident: the
    call raises GroupClosedError at once, not at the caller's own timeout (for ever
    without one). So does a call of a key that was in flight in the parent's table at
    the fork (its copy there had no thread left to end it)."""
    assert forked["closed_at_once"] is True, forked  # the group counts as closed there
    for outcome in (forked["parent_group"], forked["parent_group_held"]):
        # docs/api.md's text; why, and the parent's pid, in a note
        assert outcome[:2] == ["GroupClosedError", "This flight group is closed."], outcome
        assert len(outcome[2]) == 1, outcome
        assert "This directory group was started in process" in outcome[2][0], outcome


_FORK_BEFORE_USE = r"""
import json, os, sys, warnings
from flightgroup import JSON, FlightGroup
warnings.simplefilter("ignore", DeprecationWarning)
group = FlightGroup(directory=sys.argv[1], codec=JSON)  # made at import, not used yet
child = os.fork()
result = group.run_sync("in-child" if child == 0 else "in-parent", lambda: os.getpid())
if child == 0:
    print(json.dumps(["child", result.value == os.getpid(), result.joined]), flush=True)
    group.close()
    os._exit(0)
_, status = os.waitpid(child, 0)
print(json.dumps(["parent", result.value == os.getpid(), result.joined, status]), flush=True)
group.close()
"""


def test_a_group_made_but_not_used_before_a_fork_works_in_parent_and_child(
    directory: str,
) -> None:
    """A group made but not used before a fork works in parent and child.

    A pre-forking server makes its group at import and forks its workers: a group
    whose thread never started has nothing of the parent's to let go, so the child's
    copy works as a new group (and so does the parent's)."""
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_BEFORE_USE, directory],
        capture_output=True, text=True, timeout=50, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = sorted(json.loads(line) for line in proc.stdout.splitlines())
    assert lines == [["child", True, False], ["parent", True, False, 0]], proc.stdout


_FORK_WHILE_STARTING = r"""
import json, os, sys, threading, warnings
from flightgroup import JSON, FlightGroup
from flightgroup.directory import fs
warnings.simplefilter("ignore", DeprecationWarning)
group = FlightGroup(directory=sys.argv[1], codec=JSON)
inside, go_on = threading.Event(), threading.Event()
real = fs.ensure_directory
def ensure_directory(path):
    inside.set()  # the first call is starting the group: it holds the start lock
    go_on.wait(20)
    real(path)
fs.ensure_directory = ensure_directory
first = threading.Thread(target=lambda: group.run_sync("first", lambda: 1))
first.start()
assert inside.wait(20)
child = os.fork()
if child == 0:
    try:
        group.run_sync("in-child", lambda: 2, timeout=3)
        said = "served"
    except BaseException as exc:
        said = type(exc).__name__
    print(json.dumps(["child", said]), flush=True)
    os._exit(0)
go_on.set()
first.join(20)
os.waitpid(child, 0)
print(json.dumps(["parent", group.run_sync("after", lambda: 3).value]), flush=True)
group.close()
"""


def test_a_fork_while_another_thread_starts_the_group_raises_in_the_child(
    directory: str,
) -> None:
    """A fork while another thread starts the group: the child's copy raises.

    A thread starts the group (its first call holds the start lock, here held open at the
    directory's creation) when the main thread forks: the child's copy of the lock stays held for
    ever, and the group is the parent's. A call in the child raises GroupClosedError at once,
    never waits on that lock until its timeout."""
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_WHILE_STARTING, directory],
        capture_output=True, text=True, timeout=50, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = sorted(json.loads(line) for line in proc.stdout.splitlines())
    assert lines == [["child", "GroupClosedError"], ["parent", 3]], proc.stdout
