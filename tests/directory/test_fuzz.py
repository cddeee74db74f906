"""Property-based fuzzing of a live directory coordinator (issue 4, docs/fuzzing.md).

A real coordinator runs in a child process: ``FlightGroup(directory=d, codec=JSON)``
whose first call won the election, and which then leads the flight of key ``"held"``
(its work blocks until the test releases it). A second child is a joiner of
``"held"``. Hypothesis then speaks to ``d/flight.sock`` over raw sockets:

1. well-formed frames of every request op whose field values are drawn or mutated
   (wrong types, huge, negative, bools, nested objects, odd numbers, unicode keys,
   missing and extra fields);
2. byte-level mutations of valid frames (bit flips, truncation, insertion, deletion,
   the length prefix made bigger, smaller, or over ``max_frame_bytes``);
3. random bytes, after a hello and instead of one;
4. interleavings: several connections, their bytes cut into chunks and interleaved,
   some connections closed mid-frame, garbage before the hello;
5. scenarios with real state: leads that land (random outcomes), joiners, cancels,
   retries, fresh runs, kept outcomes, reasserts and forgets.

Every example is checked against an oracle written from docs/directory-protocol.md,
not from the code: a frame with a length over the limit, a header that is not JSON,
not an object or without a string ``op`` closes the connection; an unknown op or a bad
field is answered ``{"op":"error","id":ID}`` and the connection stays open (a ``status``
sent after it is answered); every answer is one the real client can parse. After every
example: the coordinator child is alive and is still the coordinator (SO_PEERCRED of a
fresh connection), a fresh connection completes the handshake and gets a ``status``
answer, that status lists ``"held"`` (same token, same leader, one joiner) and nothing
else once the example's connections are closed, and the child's stderr holds no
traceback. The last test releases ``"held"``: the joiner gets the leader's value and
the work ran exactly once.

The tests after the fuzz pin, each on a coordinator of its own, the cases docs/fuzzing.md
lists under Findings.

``scripts/fuzz_coordinator.py`` drives the same strategies and checks for a long run.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import random
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightgroup.directory import wire

# --------------------------------------------------------------------------------------
# Constants (from docs/api.md and docs/directory-protocol.md)

HELLO = b'{"protocol":"flightgroup","version":1}\n'
WELCOME = b'{"ok":true}\n'
REFUSAL = b'{"protocol":"flightgroup","version":1}\n'  # the answer to a hello of another version

# One live coordinator serves the module's fuzz tests; the last checks that they left the
# held flight alone, so they all run on one worker, in order.
# Hundreds of examples each, every one a round trip to the coordinator: tens of seconds
# on a loaded 2-core machine, so the bound against a hang is wider than the default 60 s.
pytestmark = [pytest.mark.xdist_group("directory_fuzz"), pytest.mark.timeout(240)]

MAX_FRAME = 64 * 1024 * 1024 + 64 * 1024  # max_frame_bytes' default
LINE_LIMIT = 1024
HELD = "held"
HELD_VALUE = "the value"
# the error answers a well-formed request may get, for a reason of state
STATE_REFUSALS = {"this id is already in use", "this connection already leads the flight"}
REQUEST_OPS = ("run", "land", "attempt", "cancel", "reassert", "forget", "status")
ID_LIMIT = 2**63
EARLIER_LIMIT = 64  # the most tokens an "earlier" list holds
SENTINEL = 7_777_777_777_777  # the id of the status that closes a stream under test


FUZZ = settings(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
)

# --------------------------------------------------------------------------------------
# The live coordinator: two child processes

CHILD = r"""
import json, logging, sys, threading
logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                    format="%(levelname)s %(name)s: %(message)s")
import flightgroup

directory, role = sys.argv[1], sys.argv[2]
group = flightgroup.FlightGroup(directory=directory, codec=flightgroup.JSON)

def say(**event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()

if role == "leader":
    group.run_sync("warm", lambda: 0)  # the first call of the directory: this process coordinates
    gate = threading.Event()

    def work():
        say(ev="started")
        gate.wait()
        return "the value"

    def lead():
        result = group.run_sync("held", work)
        say(ev="done", value=result.value, joined=result.joined, token=result.token)

    thread = threading.Thread(target=lead)
    thread.start()
    for line in sys.stdin:
        if line.strip() == "release":
            gate.set()
            thread.join()
    gate.set()
    thread.join()
else:
    def work():
        say(ev="ran")
        return "the joiner ran"

    say(ev="ready")
    result = group.run_sync("held", work)
    say(ev="done", value=result.value, joined=result.joined, token=result.token)
    sys.stdin.read()
group.close()
say(ev="closed")
"""

_BAD_STDERR = ("Traceback", "ERROR", "CRITICAL", "Exception in", "Fatal error")


class Child:
    """A child process running CHILD; its stdout events and stderr lines are collected
    by reader threads."""

    def __init__(self, directory: str, role: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, directory, role],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.events: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._read_events, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read_events(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._cond:
                self.events.append(json.loads(raw))
                self._cond.notify_all()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            with self._cond:
                self.stderr.append(raw.decode("utf-8", "replace"))

    def expect(self, ev: str, timeout: float = 20.0) -> dict[str, Any]:
        """The first event ``ev`` (waits for it)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events:
                    if event["ev"] == ev:
                        return event
                left = deadline - time.monotonic()
                finished = self.proc.poll() is not None and not self._threads[0].is_alive()
                if left <= 0 or finished:
                    raise AssertionError(
                        f"no {ev!r} event from pid {self.proc.pid} (events {self.events}, "
                        f"exit {self.proc.poll()}, stderr {''.join(self.stderr)[-2000:]})"
                    )
                self._cond.wait(min(left, 0.5))

    def count(self, ev: str) -> int:
        with self._cond:
            return sum(1 for event in self.events if event["ev"] == ev)

    def tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def end_input(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()

    def stop(self) -> None:
        """Its stdin closed, the child releases what it holds, closes its group and
        exits; one that does not within 10 s is killed."""
        self.end_input()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        for thread in self._threads:
            thread.join(5)


@dataclass
class Counters:
    examples: int = 0
    frames: int = 0  # fuzz frames (a blob of random bytes counts as one)
    bytes: int = 0
    connections: int = 0
    probes: int = 0  # liveness checks (a fresh connection, handshake and status)
    fences: int = 0  # status requests that fence the answers of a scenario's connections
    by_strategy: dict[str, int] = field(default_factory=dict)

    def add(self, strategy: str, frames: int, sent: int) -> None:
        self.examples += 1
        self.frames += frames
        self.bytes += sent
        self.by_strategy[strategy] = self.by_strategy.get(strategy, 0) + frames


class Live:
    """The live coordinator (the leader child), the joiner child, and the checks."""

    def __init__(self, with_joiner: bool = True) -> None:
        self.children: list[Child] = []
        self.dir = tempfile.mkdtemp(prefix="fz", dir="/tmp")
        try:
            self._start(with_joiner)
        except BaseException:
            self.close()
            raise

    def _start(self, with_joiner: bool) -> None:
        self.sock_path = os.path.join(self.dir, "flight.sock")
        assert len(self.sock_path.encode()) <= 103
        self.counters = Counters()
        self.max_lead_token = 0
        self.leader = self._spawn("leader")
        self.leader.expect("started")  # its warm call won the election; "held" runs
        with open(os.path.join(self.dir, "flight.epoch")) as f:
            self.epoch = int(f.read().strip())
        flights = self.status()
        assert [f["key"] for f in flights] == [HELD], flights
        self.held = flights[0]
        assert self.held["leader_pid"] == self.leader.proc.pid
        self.joiner: Child | None = None
        if with_joiner:
            self.joiner = self._spawn("joiner")
            self.joiner.expect("ready")
            self.wait_for(lambda fl: self._held_of(fl)["joiners"] == 1, "the joiner joined")

    def _spawn(self, role: str) -> Child:
        child = Child(self.dir, role)
        self.children.append(child)
        return child

    # -- talking to it --------------------------------------------------------------

    def connect(self, timeout: float = 5.0) -> Conn:
        conn = Conn(self.sock_path, timeout)
        self.counters.connections += 1
        return conn

    def status(self) -> list[dict[str, Any]]:
        """The flights in progress, asked on a fresh connection, which must complete the
        handshake with the very coordinator the test started."""
        with self.connect() as conn:
            assert conn.peer_pid() == self.leader.proc.pid, "another process coordinates"
            assert conn.handshake(), "the handshake of a fresh connection failed"
            assert conn.send(frame_of({"op": "status", "id": 1}))
            got = conn.read_frame()
            assert got is not None, "a status request on a fresh connection got no answer"
            answer = wire.parse_answer_frame(*got)
            assert isinstance(answer, wire.StatusAnswer) and answer.id == 1, answer
        self.counters.probes += 1
        return answer.flights

    def _held_of(self, flights: list[dict[str, Any]]) -> dict[str, Any]:
        held = [f for f in flights if f["key"] == HELD]
        assert len(held) == 1, f"the flight of {HELD!r} is gone: {flights}"
        return held[0]

    def wait_for(self, ok: Any, what: str, timeout: float = 10.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            flights = self.status()
            if ok(flights):
                return flights
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not so after {timeout} s; flights {flights}")
            time.sleep(0.005)

    # -- the checks -----------------------------------------------------------------

    def check_process(self) -> None:
        for child in self.children:
            assert child.proc.poll() is None, (
                f"child {child.proc.pid} exited {child.proc.returncode}: "
                f"{''.join(child.stderr)[-3000:]}"
            )
            text = "".join(child.stderr)
            bad = [marker for marker in _BAD_STDERR if marker in text]
            assert not bad, f"child {child.proc.pid} wrote to stderr:\n{text[-5000:]}"

    def check(self) -> None:
        """After an example (whose connections are closed): the coordinator serves, and
        the flight of "held" is as it was, with its one joiner, and nothing else runs."""
        self.check_process()

        def settled(flights: list[dict[str, Any]]) -> bool:
            held = self._held_of(flights)
            assert held["token"] == self.held["token"], (held, self.held)
            assert held["leader_pid"] == self.leader.proc.pid, held
            want = 1 if self.joiner is not None else 0
            return len(flights) == 1 and held["joiners"] == want

        self.wait_for(settled, "only the flight of 'held', with its joiner, runs")
        self.check_process()

    def finish(self) -> None:
        """Release "held": the joiner gets the value, the work ran exactly once."""
        self.check()
        assert self.joiner is not None
        assert self.leader.count("started") == 1
        self.leader.tell("release")
        done = self.leader.expect("done")
        assert done == {"ev": "done", "value": HELD_VALUE, "joined": False, "token": done["token"]}
        assert done["token"] == self.held["token"]
        joined = self.joiner.expect("done")
        assert joined == {"ev": "done", "value": HELD_VALUE, "joined": True, "token": done["token"]}
        assert self.joiner.count("ran") == 0, "the joiner's work ran: two runs of one flight"
        assert self.leader.count("started") == 1
        self.wait_for(lambda flights: flights == [], "no flight after the release")
        self.check_process()

    def close(self) -> None:
        for child in self.children:  # the leader first: it releases "held"
            child.end_input()
        for child in self.children:
            child.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------------------
# A raw connection


class Conn:
    """A raw client socket to flight.sock, with a read buffer."""

    def __init__(self, path: str, timeout: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.timeout = timeout
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = bytearray()
        self.eof = False
        self.sent = bytearray()
        self.broken = False  # a send failed: the coordinator closed this connection

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def peer_pid(self) -> int:
        creds = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", creds)[0])

    def send(self, data: bytes) -> bool:
        """Send ``data``; False when the coordinator has closed the connection."""
        if self.broken:
            return False
        self.sent += data
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            self.broken = True
            return False
        return True

    def _fill(self, timeout: float) -> bool:
        """Read what comes within ``timeout``; False at the end of the stream."""
        if self.eof:
            return False
        self.sock.settimeout(max(timeout, 0.0))
        try:
            chunk = self.sock.recv(1 << 16)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def drain(self) -> None:
        """Read whatever has arrived, without waiting."""
        while not self.eof and select.select([self.sock], [], [], 0)[0]:
            self._fill(self.timeout)

    def handshake(self) -> bool:
        return self.send(HELLO) and self.read_line() == WELCOME

    def read_line(self, timeout: float | None = None) -> bytes | None:
        """One line; None if the stream ends first. TimeoutError if none comes."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no line")
            if not self._fill(left):
                return None
        end = self.buf.index(b"\n") + 1
        line = bytes(self.buf[:end])
        del self.buf[:end]
        return line

    def read_frame(
        self, timeout: float | None = None
    ) -> tuple[dict[str, Any], bytes | None] | None:
        """One answer frame, decoded; None at the end of the stream (between frames).
        TimeoutError if none comes; AssertionError for a frame the client cannot parse."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if len(self.buf) >= 4:
                (size,) = struct.unpack_from(">I", self.buf)
                if len(self.buf) >= 4 + size:
                    body = bytes(self.buf[4 : 4 + size])
                    del self.buf[: 4 + size]
                    try:
                        header, payload = wire.decode_body(body)
                        wire.parse_answer_frame(header, payload)
                    except wire.WireError as exc:
                        raise AssertionError(
                            f"an answer the client cannot parse: {body[:300]!r}: {exc}"
                        ) from None
                    return header, payload
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame")
            if not self._fill(left):
                if self.buf:
                    raise AssertionError(
                        f"the stream ended inside an answer: {bytes(self.buf[:100])!r}"
                    )
                return None

    def frames_until_eof(self, timeout: float = 5.0) -> list[tuple[dict[str, Any], bytes | None]]:
        """The answers up to the end of the stream. An aborted connection may end inside
        an answer (the transport's unsent bytes are dropped): that tail is ignored."""
        out = []
        while True:
            try:
                got = self.read_frame(timeout)
            except AssertionError:
                if self.eof:  # cut by the abort
                    return out
                raise
            if got is None:
                return out
            out.append(got)

    def frames_now(self) -> list[tuple[dict[str, Any], bytes | None]]:
        """The whole answers that have arrived, without waiting."""
        self.drain()
        out = []
        while len(self.buf) >= 4 and len(self.buf) >= 4 + struct.unpack_from(">I", self.buf)[0]:
            got = self.read_frame(0)
            assert got is not None
            out.append(got)
        return out


# --------------------------------------------------------------------------------------
# Building frames


@dataclass(frozen=True)
class Raw:
    """A JSON text written into a header as it is (numbers JSON allows and Python would
    not write, constants that are not JSON, deep nesting)."""

    text: str


def dump(value: Any, ascii_only: bool = False, compact: bool = True) -> str:
    """JSON text of ``value`` (dicts, lists, scalars, :class:`Raw`)."""
    comma, colon = (",", ":") if compact else (", ", ": ")
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return (
            "{"
            + comma.join(
                json.dumps(str(k), ensure_ascii=ascii_only) + colon + dump(v, ascii_only, compact)
                for k, v in value.items()
            )
            + "}"
        )
    if isinstance(value, list | tuple):
        return "[" + comma.join(dump(v, ascii_only, compact) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


def frame_of(
    header: Any, payload: bytes | None = None, *, ascii_only: bool = False, compact: bool = True
) -> bytes:
    """A frame: 4-byte big-endian length, the header's JSON (a lone surrogate written as
    is when not ``ascii_only``: invalid UTF-8), and ``\\n`` + payload."""
    head = dump(header, ascii_only, compact).encode("utf-8", "surrogatepass")
    body = head if payload is None else head + b"\n" + payload
    return struct.pack(">I", len(body)) + body


def length_prefixed(body: bytes, size: int | None = None) -> bytes:
    return struct.pack(">I", len(body) if size is None else size) + body


# --------------------------------------------------------------------------------------
# The oracle: what the spec says the coordinator does with a stream


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _any_int(literal: str) -> Any:
    # JSON integers have no size limit; Python's int() does (4,300 digits). A literal past
    # it is still valid JSON, a number too large for any field: a bad field, not bad JSON.
    try:
        return int(literal)
    except ValueError:
        return -math.inf if literal.startswith("-") else math.inf


def _loads(text: bytes) -> Any:
    """The JSON ``text`` holds; raises ValueError (or RecursionError) if none."""
    return json.loads(text.decode("utf-8"), parse_constant=_no_constants, parse_int=_any_int)


def greet(data: bytes) -> tuple[str, bytes]:
    """What a first line does: ("ok", rest) served, ("version", b"") another version,
    ("refused", b"") not a hello, ("long", b"") over 1,024 bytes, ("wait", b"") no
    newline yet."""
    newline = data.find(b"\n", 0, LINE_LIMIT + 1)
    if newline < 0:
        return ("long" if len(data) > LINE_LIMIT else "wait"), b""
    try:
        hello = _loads(data[: newline + 1])
    except (ValueError, RecursionError):
        return "refused", b""
    if (
        not isinstance(hello, dict)
        or hello.get("protocol") != "flightgroup"
        or type(hello.get("version")) is not int
    ):
        return "refused", b""
    if hello["version"] != 1:
        return "version", b""
    return "ok", data[newline + 1 :]


def header_of(body: bytes) -> dict[str, Any] | None:
    """The header a frame body carries; None if the connection must close."""
    newline = body.find(b"\n")
    try:
        header = _loads(body if newline < 0 else body[:newline])
    except (ValueError, RecursionError):
        return None
    if not isinstance(header, dict) or not isinstance(header.get("op"), str):
        return None
    return header


def _is_id(value: Any) -> bool:
    return type(value) is int and 0 <= value < ID_LIMIT


def _is_key(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _is_positive(value: Any) -> bool:
    if type(value) is int:
        try:
            return float(value) > 0
        except OverflowError:
            return False
    return type(value) is float and math.isfinite(value) and value > 0


def _optional(header: dict[str, Any], name: str, ok: Any) -> bool:
    return header.get(name) is None or bool(ok(header[name]))


def _is_earlier(value: Any) -> bool:
    return type(value) is list and len(value) <= EARLIER_LIMIT and all(map(_is_id, value))


def is_bad_request(header: dict[str, Any], payload: bytes | None) -> bool:
    """True if the spec answers this parseable request with an ``error`` frame."""
    op = header["op"]
    get = header.get
    if op not in REQUEST_OPS:
        return True
    if op != "forget" and not _is_id(get("id")):
        return True
    if op == "run":
        return not (
            _is_key(get("key"))
            and _optional(header, "fresh", lambda v: type(v) is bool)
            and _optional(header, "flight", _is_id)
            and _optional(header, "earlier", _is_earlier)
        )
    if op == "reassert":
        return not (
            _is_key(get("key"))
            and _is_id(get("token"))
            and _optional(header, "earlier", _is_earlier)
        )
    if op == "forget":  # an optional id asks for an ack (the code has it; the doc not yet)
        return not (_is_key(get("key")) and _optional(header, "id", _is_id))
    if op == "land":
        if not _is_id(get("token")):
            return True
        outcome = get("outcome")
        if outcome == "value":
            return payload is None or not _optional(header, "keep", _is_positive)
        if outcome == "error":
            error = get("error")
            return not (
                isinstance(error, dict)
                and all(isinstance(error.get(n), str) for n in ("type", "module", "message"))
                and _optional(header, "keep", _is_positive)
            )
        if outcome == "timeout":
            return not _is_positive(get("deadline"))
        if outcome == "interrupted":
            return not isinstance(get("reason"), str)
        return True
    return False


def error_id(header: dict[str, Any]) -> int | None:
    value = header.get("id")
    return value if type(value) is int else None


@dataclass
class Prediction:
    frames: list[tuple[dict[str, Any], bytes | None]]  # the frames the coordinator reads
    end: str  # "open" (every byte read as whole frames), "close", or "partial"
    too_large: bool = False  # closed for a length over max_frame_bytes (said first)

    @property
    def errors(self) -> list[int | None]:
        """The ids of the ``error`` answers the spec fixes, in order."""
        return [error_id(h) for h, p in self.frames if is_bad_request(h, p)]

    @property
    def refusable(self) -> list[int]:
        """The ids of the well-formed requests the coordinator may refuse for a reason of
        state (a run or reassert whose id is in use, a flight reasserted twice)."""
        return [
            h["id"]
            for h, p in self.frames
            if h["op"] in ("run", "reassert") and not is_bad_request(h, p)
        ]

    @property
    def ids(self) -> set[int]:
        return {h["id"] for h, p in self.frames if type(h.get("id")) is int}


def predict(stream: bytes) -> Prediction:
    """Cut ``stream`` (the bytes after the hello) into frames as the spec does."""
    frames: list[tuple[dict[str, Any], bytes | None]] = []
    pos = 0
    while True:
        if len(stream) - pos < 4:
            return Prediction(frames, "open" if pos == len(stream) else "partial")
        (size,) = struct.unpack_from(">I", stream, pos)
        if size > MAX_FRAME:
            return Prediction(frames, "close", too_large=True)
        if len(stream) - pos - 4 < size:
            return Prediction(frames, "partial")
        body = stream[pos + 4 : pos + 4 + size]
        header = header_of(body)
        if header is None:
            return Prediction(frames, "close")
        newline = body.find(b"\n")
        frames.append((header, None if newline < 0 else body[newline + 1 :]))
        pos += 4 + size


# --------------------------------------------------------------------------------------
# Checking one connection against the oracle


def _check_answers(
    answers: list[tuple[dict[str, Any], bytes | None]], prediction: Prediction, exact: bool
) -> None:
    errors = [h for h, _ in answers if h["op"] == "error"]
    # A length over max_frame_bytes is answered, last, by an error naming the limit (so
    # a leader does not send that frame again on every reconnect), then the connection
    # closes: exactly one when read to the end, at most one before.
    notices = [h for h in errors if "limit" in h]
    errors = [h for h in errors if "limit" not in h]
    if notices:
        assert prediction.too_large and len(notices) == 1, notices
        assert notices[0]["id"] is None and notices[0]["limit"] == MAX_FRAME, notices
        assert answers[-1][0] is notices[0], "the limit's notice is the last answer"
    elif prediction.too_large and exact:
        raise AssertionError("a frame over the limit closed the connection unexplained")
    parser_errors = [h["id"] for h in errors if h["message"] not in STATE_REFUSALS]
    want = prediction.errors
    if exact:
        assert parser_errors == want, f"error answers {errors}, the spec wants ids {want}"
    else:
        assert parser_errors == want[: len(parser_errors)], (
            f"error answers {errors}, the spec wants ids {want} (or a prefix)"
        )
    refused = [h["id"] for h in errors if h["message"] in STATE_REFUSALS]
    refusable = prediction.refusable
    assert len(refused) <= len(refusable) and set(refused) <= set(refusable), (refused, refusable)
    ids = prediction.ids | {SENTINEL}
    for header, _ in answers:
        if header["op"] != "error":
            assert header["id"] in ids, f"an answer to a request never sent: {header}"


def settle(conn: Conn) -> None:
    """Check what the coordinator did with everything sent on ``conn`` so far."""
    verdict, rest = greet(bytes(conn.sent))
    if verdict == "wait":  # no newline yet: no answer (the handshake timeout drops it later)
        conn.drain()
        assert not conn.buf, bytes(conn.buf)
        return
    if verdict != "ok":
        line = conn.read_line()
        if verdict == "version":
            assert line == REFUSAL, line
        elif verdict == "refused":
            assert line is not None, "a first line that is not a hello got no answer"
            answer = json.loads(line)
            assert answer["ok"] is False and isinstance(answer["error"], str), line
        else:  # "long": refused as too long
            assert line is not None, "a first line over 1,024 bytes got no answer"
            answer = json.loads(line)
            assert answer["ok"] is False and "too long" in answer["error"], line
        assert conn.frames_until_eof() == [], "a refused connection got frames"
        return
    assert conn.read_line() == WELCOME
    prediction = predict(rest)
    if prediction.end == "open":
        need = 1 + sum(
            1
            for h, p in prediction.frames
            if h["op"] == "status" and h.get("id") == SENTINEL and not is_bad_request(h, p)
        )
        assert conn.send(frame_of({"op": "status", "id": SENTINEL})), (
            "the coordinator closed a connection whose frames were all well-formed"
        )
        answers = []
        while need:
            try:
                got = conn.read_frame()
            except TimeoutError:
                raise AssertionError(f"no status answer after the frames; got {answers}") from None
            assert got is not None, f"the connection closed; frames sent {prediction.frames}"
            answers.append(got)
            if got[0]["op"] == "status" and got[0]["id"] == SENTINEL:
                need -= 1
        _check_answers(answers, prediction, exact=True)
    elif prediction.end == "close":
        try:
            answers = conn.frames_until_eof()
        except TimeoutError:
            raise AssertionError("a connection that broke the framing was not closed") from None
        _check_answers(answers, prediction, exact=False)
        if prediction.too_large:
            assert any("limit" in h for h, _ in answers), "closed for its length, unexplained"
    else:  # waits inside a frame: nothing to wait for
        _check_answers(conn.frames_now(), prediction, exact=False)


# --------------------------------------------------------------------------------------
# Strategies

# any character, lone surrogates too (a JSON \ud800 escape decodes to one)
_TEXT_CHARS = st.characters(exclude_categories=[]) | st.characters(
    min_codepoint=0xD800, max_codepoint=0xDFFF
)


def text(min_size: int = 0, max_size: int = 16) -> st.SearchStrategy[str]:
    return st.text(_TEXT_CHARS, min_size=min_size, max_size=max_size)


GOOD_ID = st.one_of(st.integers(0, 64), st.integers(0, ID_LIMIT - 1), st.just(ID_LIMIT - 1))
KEY = st.one_of(
    st.sampled_from(["k", "k0", "k1", "warm", HELD, "fz"]),
    text(1, 24),
    st.integers(300, 3000).map(lambda n: "ab" * n),
)
SAFE_KEY = KEY.filter(lambda k: k != HELD)  # the fuzz never forgets or reasserts "held"
POSITIVE = st.one_of(
    st.floats(min_value=1e-6, max_value=1e6),
    st.integers(1, 10**6),
    st.sampled_from([5e-324, 1e308, 2**1000]),
)
ERROR_OBJECT = st.fixed_dictionaries({"type": text(), "module": text(), "message": text()})
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | text(0, 8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text(0, 6), inner, max_size=4),
    max_leaves=5,
)
ODD_NUMBERS = [
    Raw(t)
    for t in (
        "1e400", "-1e400", "1E+999", "-0", "-0.0", "0.0", "1.0", "1e2", "0e0",
        "9223372036854775807", "9223372036854775808", "-9223372036854775809",
        "1" + "0" * 400, "7" * 4301, "NaN", "Infinity", "-Infinity",
    )
]  # fmt: skip
DEEP = [Raw("[" * d + "]" * d) for d in (50, 500, 200_000)] + [Raw('{"a":' * 30 + "1" + "}" * 30)]
WEIRD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(max_value=-1),
    st.integers(min_value=ID_LIMIT, max_value=2**64 + 5),
    st.integers(min_value=2**64, max_value=2**2000),
    st.floats(allow_nan=False, allow_infinity=False),
    text(0, 12),
    st.sampled_from(ODD_NUMBERS),
    JSON_VALUES,
    st.sampled_from(DEEP),
)
WEIRD_SAFE = WEIRD.filter(lambda v: v != HELD)
EARLIER = st.one_of(
    st.none(),
    st.lists(GOOD_ID, max_size=4),
    st.lists(GOOD_ID, min_size=EARLIER_LIMIT - 2, max_size=EARLIER_LIMIT),
)
# lists an "earlier" field must not hold: too long, or with an item that is no token
EARLIER_BAD = st.one_of(
    st.lists(GOOD_ID, min_size=EARLIER_LIMIT + 1, max_size=EARLIER_LIMIT + 1),
    st.lists(GOOD_ID, min_size=EARLIER_LIMIT + 2, max_size=EARLIER_LIMIT + 4),
    st.tuples(st.lists(GOOD_ID, max_size=3), WEIRD.filter(lambda v: not _is_id(v))).map(
        lambda pair: [*pair[0], pair[1]]
    ),
)

FIELDS: dict[str, list[tuple[str, st.SearchStrategy[Any]]]] = {
    "run": [
        ("id", GOOD_ID),
        ("key", KEY),
        ("fresh", st.sampled_from([None, False, True])),
        ("flight", st.one_of(st.none(), GOOD_ID)),
        ("earlier", EARLIER),
    ],
    "land": [
        ("id", GOOD_ID),
        ("token", GOOD_ID),
        ("outcome", st.sampled_from(["value", "error", "timeout", "interrupted"])),
        ("keep", st.one_of(st.none(), POSITIVE)),
        ("error", ERROR_OBJECT),
        ("deadline", POSITIVE),
        ("reason", text()),
    ],
    "attempt": [("id", GOOD_ID)],
    "cancel": [("id", GOOD_ID)],
    "reassert": [("id", GOOD_ID), ("key", SAFE_KEY), ("token", GOOD_ID), ("earlier", EARLIER)],
    "forget": [("key", SAFE_KEY), ("id", st.one_of(st.none(), GOOD_ID))],
    "status": [("id", GOOD_ID)],
}
ODD_OPS = ["", "RUN", "Status", "run ", " run", "lead", "joined", "ack", "error", "landed", "runs"]


@st.composite
def headers(draw: st.DrawFn, valid: bool = False) -> dict[str, Any]:
    """A request header. ``valid``: a known op whose fields are all drawn well-formed."""
    if valid:
        op = draw(st.sampled_from(REQUEST_OPS))
    else:
        op = draw(st.one_of(st.sampled_from(REQUEST_OPS), st.sampled_from(ODD_OPS), text(0, 8)))
    schema = FIELDS.get(op) or FIELDS[draw(st.sampled_from(REQUEST_OPS))]
    header: dict[str, Any] = {"op": op}
    if not valid:
        shape = draw(st.integers(0, 24))
        if shape == 0:
            del header["op"]
        elif shape == 1:
            header["op"] = draw(WEIRD)
    for name, good in schema:
        choice = 9 if valid else draw(st.integers(0, 9))
        if choice >= 3:
            header[name] = draw(good)
        elif choice == 1:
            safe = name == "key" and op in ("reassert", "forget")
            if name == "earlier":
                header[name] = draw(EARLIER_BAD | WEIRD)
            else:
                header[name] = draw(WEIRD_SAFE if safe else WEIRD)
        # choice 0 or 2: the field is missing
    if not valid:
        extras = draw(st.integers(0, 3))  # one header in four has extra fields
        extras = draw(st.dictionaries(text(0, 8), JSON_VALUES, max_size=3)) if not extras else {}
        for name, value in extras.items():
            header.setdefault(name, value)  # extra fields, unicode names
    order = draw(st.permutations(list(header)))
    return {name: header[name] for name in order}


@dataclass
class FrameSpec:
    header: dict[str, Any]
    payload: bytes | None
    ascii_only: bool
    compact: bool


@st.composite
def frame_specs(draw: st.DrawFn, valid: bool = False) -> FrameSpec:
    return FrameSpec(
        draw(headers(valid)),
        draw(st.one_of(st.none(), st.binary(max_size=48), st.just(b""))),
        draw(st.booleans()),
        draw(st.booleans() | st.just(True)),
    )


def encode_specs(specs: list[FrameSpec]) -> list[bytes]:
    return [
        frame_of(s.header, s.payload, ascii_only=s.ascii_only, compact=s.compact) for s in specs
    ]


@st.composite
def mutations(draw: st.DrawFn) -> list[tuple[str, int, int, bytes]]:
    """Byte-level edits: (kind, position, amount, bytes)."""
    kinds = ["flip", "truncate", "insert", "delete", "length", "dup", "set"]
    return draw(
        st.lists(
            st.tuples(
                st.sampled_from(kinds),
                st.integers(0, 1 << 16),
                st.one_of(
                    st.integers(0, 64),
                    st.sampled_from([MAX_FRAME, MAX_FRAME + 1, 2**32 - 1]),
                    st.integers(MAX_FRAME + 1, 2**32 - 1),
                ),
                st.binary(min_size=1, max_size=8),
            ),
            min_size=1,
            max_size=3,
        )
    )


def mutate(data: bytes, edits: list[tuple[str, int, int, bytes]]) -> bytes:
    out = bytearray(data)
    for kind, where, amount, blob in edits:
        pos = where % (len(out) + 1)
        if kind == "flip" and out:
            pos %= len(out)
            out[pos] ^= 1 << (amount % 8)
        elif kind == "truncate":
            del out[pos:]
        elif kind == "insert":
            out[pos:pos] = blob
        elif kind == "delete":
            del out[pos : pos + 1 + amount % 16]
        elif kind == "length" and len(out) >= 4:
            size = struct.unpack_from(">I", out)[0]
            # a little bigger or smaller; else at, over or far over the limit
            size = min(2**32 - 1, max(0, size + amount - 32)) if amount <= 64 else amount
            out[:4] = struct.pack(">I", size)
        elif kind == "dup":
            out[pos:pos] = out[pos : pos + 1 + amount % 32]
        elif kind == "set" and out:
            pos %= len(out)
            out[pos] = blob[0]
    return bytes(out)


# The same grammar drawn with a seeded random.Random: hypothesis draws a few frames of
# each example (those shrink), and a seed expands into many more at a fraction of the
# cost, so an example sends many frames over one connection.

_CHAR_RANGES = [(0x20, 0x7F), (0x00, 0x20), (0xA0, 0x800), (0x800, 0xD800), (0xE000, 0x10000)]
_CHAR_RANGES += [(0x10000, 0x110000), (0xD800, 0xE000)]
_FIXED_KEYS = ["k", "k0", "k1", "warm", HELD, "fz", "é", "\u2028", "a b", "\x00"]
_WEIRD_POOL: list[Any] = [
    None, True, False, 0, -1, -(2**63), 2**63 - 1, 2**63, 2**64, 10**100, 0.5, -0.0, 1e308,
    5e-324, "", "x", "é", "\x00", "\n", {}, [], {"a": [1]}, [[[]]], {"op": "status"},
    *ODD_NUMBERS, *DEEP,
]  # fmt: skip


def r_text(rng: random.Random, lo: int = 0, hi: int = 16) -> str:
    out = []
    for _ in range(rng.randint(lo, hi)):
        start, end = _CHAR_RANGES[0] if rng.random() < 0.6 else rng.choice(_CHAR_RANGES)
        out.append(chr(rng.randrange(start, end)))
    return "".join(out)


def r_id(rng: random.Random) -> int:
    pick = rng.randrange(4)
    if pick == 0:
        return ID_LIMIT - 1
    return rng.randrange(65) if pick == 1 else rng.randrange(ID_LIMIT)


def r_key(rng: random.Random, safe: bool = False) -> str:
    pick = rng.randrange(6)
    if pick == 0:
        key = "ab" * rng.randint(300, 3000)
    elif pick < 3:
        key = rng.choice(_FIXED_KEYS)
    else:
        key = r_text(rng, 1, 24)
    return "fz" if safe and key == HELD else key


def r_earlier(rng: random.Random) -> Any:
    pick = rng.randrange(8)
    if pick < 3:
        return None
    if pick == 3:
        return [r_id(rng) for _ in range(rng.randint(EARLIER_LIMIT - 2, EARLIER_LIMIT))]
    return [r_id(rng) for _ in range(rng.randrange(5))]


def r_bad_earlier(rng: random.Random) -> Any:
    """An "earlier" field that is bad: too long, an item that is no token, or no list."""
    pick = rng.randrange(3)
    if pick == 0:  # one over the limit, mostly
        return [r_id(rng) for _ in range(EARLIER_LIMIT + 1 + rng.choice([0, 0, 0, 1, 5]))]
    if pick == 1:
        bad = rng.choice([True, False, -1, 2**63, 1.0, "1", None, [1], {"a": 1}])
        items: list[Any] = [r_id(rng) for _ in range(rng.randrange(3))]
        items.insert(rng.randrange(len(items) + 1), bad)
        return items
    return r_weird(rng)


def r_positive(rng: random.Random) -> Any:
    return (
        rng.choice(
            [rng.uniform(1e-6, 1e6), rng.randint(1, 10**6), 5e-324, 1e308, 2**1000, rng.random()]
        )
        or 1
    )


def r_json(rng: random.Random, depth: int = 2) -> Any:
    pick = rng.randrange(8 if depth else 6)
    if pick == 0:
        return None
    if pick == 1:
        return rng.random() < 0.5
    if pick == 2:
        return rng.randrange(-(2**70), 2**70)
    if pick == 3:
        return rng.uniform(-1e12, 1e12)
    if pick < 6:
        return r_text(rng, 0, 8)
    if pick == 6:
        return [r_json(rng, depth - 1) for _ in range(rng.randrange(4))]
    return {r_text(rng, 0, 6): r_json(rng, depth - 1) for _ in range(rng.randrange(4))}


def r_weird(rng: random.Random) -> Any:
    pick = rng.randrange(6)
    if pick == 0:
        return rng.choice(_WEIRD_POOL)
    if pick == 1:
        return rng.choice([-1, 1]) * rng.randrange(2 ** rng.randrange(1, 2000))
    if pick == 2:
        return rng.choice([-1.0, 1.0]) * rng.random() * 10 ** rng.randrange(-300, 300)
    return r_json(rng)


_R_FIELDS: dict[str, list[tuple[str, Any]]] = {
    "run": [
        ("id", r_id),
        ("key", r_key),
        ("fresh", lambda rng: rng.choice([None, False, True])),
        ("flight", lambda rng: None if rng.random() < 0.5 else r_id(rng)),
        ("earlier", r_earlier),
    ],
    "land": [
        ("id", r_id),
        ("token", r_id),
        ("outcome", lambda rng: rng.choice(["value", "error", "timeout", "interrupted"])),
        ("keep", lambda rng: None if rng.random() < 0.5 else r_positive(rng)),
        ("error", lambda rng: {n: r_text(rng) for n in ("type", "module", "message")}),
        ("deadline", r_positive),
        ("reason", r_text),
    ],
    "attempt": [("id", r_id)],
    "cancel": [("id", r_id)],
    "reassert": [
        ("id", r_id),
        ("key", lambda rng: r_key(rng, safe=True)),
        ("token", r_id),
        ("earlier", r_earlier),
    ],
    "forget": [
        ("key", lambda rng: r_key(rng, safe=True)),
        ("id", lambda rng: None if rng.random() < 0.5 else r_id(rng)),
    ],
    "status": [("id", r_id)],
}


def r_header(rng: random.Random, valid: bool = False) -> dict[str, Any]:
    """A request header, as :func:`headers` draws one."""
    if valid or rng.random() < 0.8:
        op = rng.choice(REQUEST_OPS)
    else:
        op = rng.choice(ODD_OPS) if rng.random() < 0.5 else r_text(rng, 0, 8)
    schema = _R_FIELDS.get(op) or _R_FIELDS[rng.choice(REQUEST_OPS)]
    header: dict[str, Any] = {"op": op}
    if not valid:
        shape = rng.randrange(25)
        if shape == 0:
            del header["op"]
        elif shape == 1:
            header["op"] = r_weird(rng)
    for name, good in schema:
        choice = 9 if valid else rng.randrange(10)
        if choice >= 3:
            header[name] = good(rng)
        elif choice == 1:
            value = r_bad_earlier(rng) if name == "earlier" else r_weird(rng)
            safe = name == "key" and op in ("reassert", "forget")
            header[name] = "fz" if safe and value == HELD else value
    if not valid and rng.randrange(4) == 0:
        for _ in range(rng.randint(1, 3)):
            header.setdefault(r_text(rng, 0, 8), r_json(rng))
    names = list(header)
    rng.shuffle(names)
    return {name: header[name] for name in names}


def r_spec(rng: random.Random, valid: bool = False) -> FrameSpec:
    pick = rng.randrange(4)
    payload = None if pick < 2 else b"" if pick == 2 else rng.randbytes(rng.randrange(1, 48))
    return FrameSpec(r_header(rng, valid), payload, rng.random() < 0.5, rng.random() < 0.7)


def r_mutations(rng: random.Random) -> list[tuple[str, int, int, bytes]]:
    kinds = ["flip", "truncate", "insert", "delete", "length", "dup", "set"]
    edits = []
    for _ in range(rng.randint(1, 3)):
        pick = rng.randrange(4)
        if pick < 2:
            amount = rng.randrange(65)
        elif pick == 2:
            amount = rng.choice([MAX_FRAME, MAX_FRAME + 1, 2**32 - 1])
        else:
            amount = rng.randrange(MAX_FRAME + 1, 2**32)
        blob = rng.randbytes(rng.randint(1, 8))
        edits.append((rng.choice(kinds), rng.randrange(1 << 16), amount, blob))
    return edits


def r_cuts(rng: random.Random, most: int = 3) -> list[int]:
    return [rng.randrange(1 << 12) for _ in range(rng.randrange(most + 1))]


# --------------------------------------------------------------------------------------
# Exercises: one example each; they return (frames, bytes) sent


def _send_in_chunks(conn: Conn, data: bytes, cuts: list[int]) -> None:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for start, end in itertools.pairwise(points):
        if not conn.send(data[start:end]):
            return


def exercise_frames(live: Live, frames: list[bytes], cuts: list[int]) -> tuple[int, int]:
    """One connection: a hello, the frames (written in chunks at ``cuts``), then checked."""
    with live.connect() as conn:
        _send_in_chunks(conn, HELLO + b"".join(frames), cuts)
        settle(conn)
        return len(frames), len(conn.sent)


SEEDS = st.integers(0, 2**32 - 1)


@st.composite
def well_formed_cases(draw: st.DrawFn) -> tuple[list[bytes], list[int]]:
    """A few drawn frames and up to 24 expanded from a seed, in one stream."""
    specs = draw(st.lists(frame_specs(), max_size=2))
    rng = random.Random(draw(SEEDS))
    specs += [r_spec(rng) for _ in range(draw(st.integers(0 if specs else 1, 24)))]
    rng.shuffle(specs)
    return encode_specs(specs), r_cuts(rng)


@st.composite
def mutated_cases(draw: st.DrawFn) -> tuple[list[bytes], list[int]]:
    """Valid (or nearly) frames, some mutated byte by byte."""
    valid = draw(st.booleans())
    drawn = draw(st.lists(st.tuples(frame_specs(valid), mutations()), max_size=1))
    rng = random.Random(draw(SEEDS))
    count = draw(st.integers(0 if drawn else 1, 8))
    specs = [spec for spec, _ in drawn] + [r_spec(rng, valid) for _ in range(count)]
    frames = encode_specs(specs)
    out = [mutate(frames[0], drawn[0][1])] if drawn else []
    for one in frames[len(out) :]:
        out.append(mutate(one, r_mutations(rng)) if rng.randrange(3) else one)
    rng.shuffle(out)
    return out, r_cuts(rng, 2)


@st.composite
def random_cases(draw: st.DrawFn) -> tuple[list[bytes], list[int]]:
    """Random bytes, or random bodies behind a plausible length, or random JSON."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        blobs = [draw(st.binary(min_size=1, max_size=512))]
    elif kind == 1:
        bodies = draw(st.lists(st.binary(max_size=64), min_size=1, max_size=4))
        blobs = [length_prefixed(b) for b in bodies]
    elif kind == 2:
        values = draw(st.lists(JSON_VALUES, min_size=1, max_size=4))
        blobs = [frame_of(v) for v in values]
    else:
        tails = draw(st.lists(st.binary(max_size=24), min_size=1, max_size=4))
        blobs = [length_prefixed(b'{"op":' + t) for t in tails]
    return blobs, []


HELLO_LINES = [
    HELLO,
    b'{"version":1,"protocol":"flightgroup"}\n',
    b'{"protocol":"flightgroup","version":1,"extra":[1,{"a":null}]}\n',
    b' {"protocol" : "flightgroup", "version" : 1} \n',
    b'{"protocol":"flightgroup","version":2}\n',
    b'{"protocol":"flightgroup","version":0}\n',
    b'{"protocol":"flightgroup","version":-1}\n',
    b'{"protocol":"flightgroup","version":99999999999999999999}\n',
    b'{"protocol":"flightgroup","version":true}\n',
    b'{"protocol":"flightgroup","version":"1"}\n',
    b'{"protocol":"flightgroup","version":1.0}\n',
    b'{"protocol":"flightgroup","version":NaN}\n',
    b'{"protocol":"flightgroup"}\n',
    b'{"protocol":"other","version":1}\n',
    b'{"protocol":"flightgroup","version":1}\r\n',
    b"[1]\n",
    b"\n",
    b"hello\n",
    b"\xff\xfe\n",
    b"{" * 5000 + b"\n",
    b'{"protocol":"flightgroup","version":1,"pad":"' + b"x" * 1000 + b'"}\n',
]


@st.composite
def hello_cases(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """A first line (a hello, a variant, garbage), maybe with frames behind it."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        data = draw(st.sampled_from(HELLO_LINES))
    elif kind == 1:
        data = draw(st.binary(min_size=1, max_size=1200))
    elif kind == 2:
        data = draw(st.binary(max_size=16)) + draw(st.sampled_from(HELLO_LINES))
    else:
        obj = draw(st.dictionaries(text(0, 10), JSON_VALUES, max_size=3))
        if draw(st.booleans()):
            obj["protocol"] = "flightgroup"
        data = (dump(obj) + "\n").encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        specs = draw(st.lists(frame_specs(), max_size=3))
        data += b"".join(encode_specs(specs))
    return data, draw(st.lists(st.integers(0, 1 << 11), max_size=3))


def exercise_hello(live: Live, case: tuple[bytes, list[int]]) -> tuple[int, int]:
    data, cuts = case
    with live.connect() as conn:
        _send_in_chunks(conn, data, cuts)
        settle(conn)
        return 1, len(conn.sent)


@dataclass
class Script:
    preamble: bytes  # the hello, or garbage and a hello, or a variant
    frames: list[bytes]
    cuts: list[int]
    abandon_at: int | None  # close after this many chunks (None: keep it to the end)


@st.composite
def interleavings(draw: st.DrawFn) -> tuple[list[Script], list[int]]:
    """2 to 5 connections; hypothesis draws their shape and the schedule, a seed their
    frames."""
    rng = random.Random(draw(SEEDS))
    scripts = []
    for _ in range(draw(st.integers(2, 5))):
        preamble = HELLO
        shape = draw(st.integers(0, 9))
        if shape == 0:
            preamble = rng.randbytes(rng.randint(1, 8)) + HELLO
        elif shape == 1:
            preamble = rng.choice(HELLO_LINES)
        valid = rng.random() < 0.5
        frames = encode_specs([r_spec(rng, valid) for _ in range(rng.randrange(7))])
        frames = [mutate(one, r_mutations(rng)) if rng.randrange(5) == 0 else one for one in frames]
        if rng.randrange(6) == 0:
            frames.append(rng.randbytes(rng.randint(1, 64)))
        abandon = draw(st.one_of(st.none(), st.none(), st.integers(0, 6)))
        scripts.append(Script(preamble, frames, r_cuts(rng, 6), abandon))
    schedule = draw(st.lists(st.integers(0, len(scripts) - 1), min_size=1, max_size=40))
    return scripts, schedule


def exercise_interleaving(live: Live, case: tuple[list[Script], list[int]]) -> tuple[int, int]:
    scripts, schedule = case
    conns = [live.connect() for _ in scripts]
    try:
        chunks: list[list[bytes]] = []
        for script in scripts:
            data = script.preamble + b"".join(script.frames)
            points = sorted({c % (len(data) + 1) for c in script.cuts} | {0, len(data)})
            chunks.append([data[a:b] for a, b in itertools.pairwise(points)])
        done = [0] * len(scripts)
        closed = [False] * len(scripts)
        order = list(schedule) + [i for i, c in enumerate(chunks) for _ in c]  # then the rest
        for i in order:
            if closed[i] or done[i] >= len(chunks[i]):
                continue
            if scripts[i].abandon_at is not None and done[i] >= scripts[i].abandon_at:
                conns[i].close()  # mid-stream, maybe mid-frame
                closed[i] = True
                continue
            conns[i].send(chunks[i][done[i]])
            done[i] += 1
        for i, conn in enumerate(conns):
            if not closed[i]:
                settle(conn)
        sent = sum(len(c.sent) for c in conns)
        return sum(len(s.frames) for s in scripts), sent
    finally:
        for conn in conns:
            conn.close()


# --------------------------------------------------------------------------------------
# Scenarios with real state


class Peer:
    """A client connection that tracks its ids and reads answers in step (``sync``)."""

    def __init__(self, live: Live) -> None:
        self.live = live
        self.conn = live.connect()
        assert self.conn.handshake()
        self.ids = itertools.count(1)
        self.inbox: list[tuple[dict[str, Any], bytes | None]] = []
        self.requests = 0
        self.may_refuse: set[int] = set()  # ids of requests whose refusal depends on state

    def next_id(self) -> int:
        return next(self.ids)

    def send(self, frame: bytes, fence: bool = False) -> None:
        if fence:
            self.live.counters.fences += 1
        else:
            self.requests += 1
        assert self.conn.send(frame), "the coordinator closed a well-behaved connection"

    def sync(self) -> list[tuple[dict[str, Any], bytes | None]]:
        """Every answer sent to this connection so far (a status round trip fences them)."""
        fence = self.next_id()
        self.send(wire.status_frame(fence), fence=True)
        got = []
        while True:
            answer = self.conn.read_frame()
            assert answer is not None, "the coordinator closed a well-behaved connection"
            if answer[0]["op"] == "status" and answer[0]["id"] == fence:
                break
            if answer[0]["op"] == "error":
                assert answer[0]["id"] in self.may_refuse, f"an error for a request: {answer}"
            got.append(answer)
        self.inbox.extend(got)
        return got

    def close(self) -> None:
        self.conn.close()


KEEP = st.one_of(st.none(), st.floats(60, 1e9), st.integers(60, 10**9), st.just(2**1000))
OUTCOME_SPECS = st.one_of(
    st.tuples(st.just("value"), st.binary(max_size=300), KEEP),
    st.tuples(st.just("error"), ERROR_OBJECT, KEEP),
    st.tuples(st.just("timeout"), POSITIVE, st.none()),
    st.tuples(st.just("interrupted"), text(), st.none()),
)  # kept outcomes outlive an example (a short keep is the soup's, which has no model of it)


def land_header(
    id: int, token: int, outcome: tuple[str, Any, Any]
) -> tuple[dict[str, Any], bytes | None]:
    kind, detail, keep = outcome
    header: dict[str, Any] = {"op": "land", "id": id, "token": token, "outcome": kind}
    payload = None
    if kind == "value":
        payload = detail
    elif kind == "error":
        header["error"] = detail
    elif kind == "timeout":
        header["deadline"] = detail
    else:
        header["reason"] = detail
    if keep is not None:
        header["keep"] = keep
    return header, payload


def _same_outcome(
    answer: tuple[dict[str, Any], bytes | None], outcome: tuple[str, Any, Any]
) -> None:
    header, payload = answer
    kind, detail, keep = outcome
    if kind == "interrupted":
        assert header["op"] == "interrupted" and header["reason"] == detail, answer
        return
    assert header["op"] == "landed" and header["outcome"] == kind, answer
    if kind == "value":
        assert payload == detail, answer
    elif kind == "error":
        assert header["error"] == detail, answer
    else:
        assert header["deadline"] == float(detail), answer
    assert header.get("keep") == (None if keep is None else float(keep)), answer


@dataclass
class Delivery:
    joiners: int
    cancel: list[bool]
    attempts: int
    fresh: int
    outcome: tuple[str, Any, Any]
    wrong_land: str | None  # a land first sent wrong: "token" or "field"


DELIVERIES = st.builds(
    Delivery,
    st.integers(0, 4),
    st.lists(st.booleans(), min_size=4, max_size=4),
    st.integers(0, 2),
    st.integers(0, 2),
    OUTCOME_SPECS,
    st.sampled_from([None, "token", "field"]),
)


def _lead_token(live: Live, answer: tuple[dict[str, Any], bytes | None], id: int) -> int:
    header = answer[0]
    assert header["op"] == "lead" and header["id"] == id, answer
    token = int(header["token"])
    assert token >> 32 == live.epoch, f"token {token} is not of epoch {live.epoch}"
    assert token > live.max_lead_token, f"token {token} after {live.max_lead_token}"
    live.max_lead_token = token
    return token


def exercise_delivery(live: Live, case: Delivery) -> tuple[int, int]:
    """A lead, joiners (some cancelled), retries, fresh runs, then a landing: each joiner
    gets exactly the outcome, then the leader its ack; then kept outcomes and forget."""
    key = f"dl-{live.counters.examples}-{time.monotonic_ns()}"
    pid = os.getpid()
    leader = Peer(live)
    joiners = [Peer(live) for _ in range(case.joiners)]
    fresh = [Peer(live) for _ in range(case.fresh)]
    peers = [leader, *joiners, *fresh]
    try:
        leader.send(wire.run_frame(1, key))
        (answer,) = leader.sync()
        token = first_token = _lead_token(live, answer, 1)
        for joiner in joiners:
            joiner.send(wire.run_frame(1, key))
            (answer,) = joiner.sync()
            header = answer[0]
            assert header["op"] == "joined" and header["token"] == token, answer
            assert header["pid"] == pid and header["age"] >= 0, answer
        for peer in fresh:
            peer.send(wire.run_frame(1, key, fresh=True))
            assert peer.sync() == [], "a fresh run was answered before its flight ended"
        staying = []
        for joiner, cancel in zip(joiners, case.cancel, strict=False):
            if cancel:
                joiner.send(wire.cancel_frame(1))
                assert joiner.sync() == []
            else:
                staying.append(joiner)
        for _ in range(case.attempts):
            leader.send(wire.attempt_frame(1))
            (answer,) = leader.sync()
            token = _lead_token(live, answer, 1)
        (mine,) = [f for f in _status_of(leader) if f["key"] == key]
        assert mine["token"] == token and mine["leader_pid"] == pid, mine
        assert mine["joiners"] == len(staying), (mine, len(staying))
        # A rejoin by the flight's first token (one that missed the retries' `joined`)
        # joins it, whatever token it names beside it: every token of the flight names it.
        rejoiner = Peer(live)
        peers.append(rejoiner)
        stranger = 2**62 + live.counters.examples  # tokens no flight had
        earlier = [first_token, *range(stranger + 1, stranger + EARLIER_LIMIT)]  # the most
        rejoiner.send(wire.run_frame(1, key, flight=stranger, earlier=earlier))
        (answer,) = rejoiner.sync()
        assert answer[0]["op"] == "joined" and answer[0]["token"] == token, answer
        header, payload = land_header(1, token, case.outcome)
        if case.wrong_land == "token":
            leader.send(frame_of({**header, "token": token - 1}, payload, ascii_only=True))
            (answer,) = leader.sync()
            assert answer[0]["op"] == "rejected" and answer[0]["id"] == 1, answer
        elif case.wrong_land == "field":
            leader.conn.send(frame_of({**header, "token": -1}, payload, ascii_only=True))
            answer = leader.conn.read_frame()
            assert answer is not None and answer[0]["op"] == "error" and answer[0]["id"] == 1
        leader.send(frame_of(header, payload, ascii_only=True))
        (answer,) = leader.sync()
        assert answer[0] == {"op": "ack", "id": 1}, answer
        for joiner in staying:
            # Each retry told the joiners its new token (`joined` again), then the outcome.
            *rejoined, answer = joiner.sync()
            assert len(rejoined) == case.attempts, rejoined
            assert all(r[0]["op"] == "joined" and r[0]["id"] == 1 for r in rejoined), rejoined
            if rejoined:
                assert rejoined[-1][0]["token"] == token, rejoined
            assert answer[0]["id"] == 1, answer
            if answer[0]["op"] == "landed":
                assert answer[0]["token"] == token and answer[0]["kept"] is False, answer
            _same_outcome(answer, case.outcome)
        (answer,) = rejoiner.sync()
        assert answer[0]["id"] == 1, answer
        if answer[0]["op"] == "landed":
            assert answer[0]["token"] == token, answer
        _same_outcome(answer, case.outcome)
        for joiner in joiners:
            if joiner not in staying:
                assert joiner.sync() == [], "a cancelled joiner got an answer"
        kept = case.outcome[0] in ("value", "error") and case.outcome[2] is not None
        # The fresh runs waited for the flight's end: they accept only a later flight (never
        # the outcome kept from the one they waited for): the first leads the next flight,
        # the others join it.
        next_token = None
        for n, peer in enumerate(fresh):
            (answer,) = peer.sync()
            if n == 0:
                next_token = _lead_token(live, answer, 1)
            else:
                assert answer[0]["op"] == "joined" and answer[0]["token"] == next_token, answer
        late = Peer(live)
        peers.append(late)
        late.send(wire.run_frame(1, key))
        (answer,) = late.sync()
        if next_token is not None:
            assert answer[0]["op"] == "joined" and answer[0]["token"] == next_token, answer
        elif kept:
            assert answer[0]["op"] == "landed" and answer[0]["kept"] is True, answer
            assert answer[0]["token"] == token, answer
            _same_outcome(answer, case.outcome)
        else:
            late.send(wire.cancel_frame(1))  # it leads: withdraw it
            _lead_token(live, answer, 1)
            late.sync()
        late.send(wire.forget_frame(key))
        late.send(wire.run_frame(2, key))
        (answer,) = late.sync()
        _lead_token(live, answer, 2)
    finally:
        for peer in peers:
            peer.close()
    return sum(peer.requests for peer in peers), 0


def _status_of(peer: Peer) -> list[dict[str, Any]]:
    fence = peer.next_id()
    peer.send(wire.status_frame(fence), fence=True)
    while True:
        answer = peer.conn.read_frame()
        assert answer is not None
        if answer[0]["op"] == "status" and answer[0]["id"] == fence:
            return list(answer[0]["flights"])
        peer.inbox.append(answer)


SOUP_KINDS = [
    "run",
    "run",
    "run",
    "fresh",
    "rejoin",
    "land",
    "land",
    "attempt",
    "cancel",
    "reassert",
    "forget",
    "close",
]
SOUP_ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(SOUP_KINDS),
        st.integers(0, 2),  # the connection
        st.integers(0, 2),  # the key
        st.integers(0, 15),  # which lead, id or token it refers to
        OUTCOME_SPECS,
        st.sampled_from([0, 0, 0, 1, -1, 2**32]),  # a token's offset
    ),
    min_size=1,
    max_size=30,
)


def exercise_soup(live: Live, actions: list[tuple[Any, ...]]) -> tuple[int, int]:
    """Random well-formed requests over three connections and three keys, with the real
    tokens and ids the coordinator handed out. No answer is an error but a refused
    reassert; lead tokens rise; all answers parse; when the connections close, no flight
    of theirs remains."""
    tag = f"soup-{live.counters.examples}-{time.monotonic_ns()}"
    keys = [f"{tag}-{i}" for i in range(3)]
    peers = [Peer(live) for _ in range(3)]
    every = list(peers)
    leads: list[tuple[int, int, int]] = []  # (peer index, id, token)
    sent: list[list[int]] = [[], [], []]
    tokens: list[int] = [1]
    try:
        for kind, p, k, ref, outcome, offset in actions:
            keep_ref = ref
            peer = peers[p]
            id = peer.next_id()
            if kind in ("run", "fresh", "rejoin"):
                flight = tokens[ref % len(tokens)] if kind == "rejoin" else None
                earlier = [tokens[(ref + 1 + i) % len(tokens)] for i in range(offset % 3)]
                peer.send(
                    wire.run_frame(
                        id,
                        keys[k],
                        fresh=kind == "fresh",
                        flight=flight,
                        earlier=earlier if flight is not None else (),
                    )
                )
                sent[p].append(id)
            elif kind in ("land", "attempt") and leads:
                lp, lid, ltoken = leads[ref % len(leads)]
                if kind == "land":
                    token = max(0, ltoken + offset) % ID_LIMIT
                    if outcome[2] is not None and keep_ref % 3 == 0:
                        outcome = (*outcome[:2], (keep_ref + 1) / 1000)  # short-lived kept outcomes
                    header, payload = land_header(lid, token, outcome)
                    peers[lp].send(frame_of(header, payload, ascii_only=True))
                else:
                    peers[lp].send(wire.attempt_frame(lid))
            elif kind == "cancel" and sent[p]:
                peer.send(wire.cancel_frame(sent[p][ref % len(sent[p])]))
            elif kind == "reassert":
                token = max(0, tokens[ref % len(tokens)] + offset) % ID_LIMIT
                rid = id
                if sent[p] and ref % 2:
                    rid = sent[p][ref % len(sent[p])]  # an id that may be in use
                earlier = [tokens[(ref + 1 + i) % len(tokens)] for i in range(ref % 3)]
                peer.send(wire.reassert_frame(rid, keys[k], token, earlier))
                peer.may_refuse.add(rid)  # e.g. a flight this connection already leads
                leads.append((p, rid, token))
            elif kind == "forget":
                peer.send(wire.forget_frame(keys[k]))
            elif kind == "close":
                peer.close()
                peers[p] = Peer(live)
                every.append(peers[p])
                sent[p] = []
                leads = [lead for lead in leads if lead[0] != p]
                continue
            fresh_tokens = []
            for i, each in enumerate(peers):
                for header, _ in each.sync():
                    if header["op"] == "lead":
                        leads.append((i, header["id"], header["token"]))
                        fresh_tokens.append(header["token"])
                    if header["op"] in ("lead", "joined", "landed"):
                        tokens.append(header["token"])
            # one request may make several leads (fresh runs after a flight's end)
            assert len(set(fresh_tokens)) == len(fresh_tokens), fresh_tokens
            for token in fresh_tokens:
                assert token >> 32 == live.epoch and token > live.max_lead_token, (
                    token,
                    live.epoch,
                    live.max_lead_token,
                )
            live.max_lead_token = max([live.max_lead_token, *fresh_tokens])
    finally:
        for peer in every:
            peer.close()
    return sum(peer.requests for peer in every), 0


# --------------------------------------------------------------------------------------
# The tests


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    harness = Live()
    try:
        yield harness
    finally:
        harness.close()


def _examples(n: int) -> Any:
    return settings(FUZZ, max_examples=n)


@_examples(700)
@given(case=well_formed_cases())
def test_fuzz_well_formed_frames_of_every_op(
    live: Live, case: tuple[list[bytes], list[int]]
) -> None:
    frames, sent = exercise_frames(live, *case)
    live.counters.add("well-formed", frames, sent)
    live.check()


@_examples(700)
@given(case=mutated_cases())
def test_fuzz_byte_mutations_of_valid_frames(
    live: Live, case: tuple[list[bytes], list[int]]
) -> None:
    frames, sent = exercise_frames(live, *case)
    live.counters.add("mutated", frames, sent)
    live.check()


@_examples(600)
@given(case=random_cases())
def test_fuzz_random_bytes_after_the_hello(live: Live, case: tuple[list[bytes], list[int]]) -> None:
    frames, sent = exercise_frames(live, *case)
    live.counters.add("random", frames, sent)
    live.check()


@_examples(500)
@given(case=hello_cases())
def test_fuzz_first_lines(live: Live, case: tuple[bytes, list[int]]) -> None:
    frames, sent = exercise_hello(live, case)
    live.counters.add("hello", frames, sent)
    live.check()


@_examples(500)
@given(case=interleavings())
def test_fuzz_interleaved_connections(live: Live, case: tuple[list[Script], list[int]]) -> None:
    frames, sent = exercise_interleaving(live, case)
    live.counters.add("interleaved", frames, sent)
    live.check()


@_examples(400)
@given(case=DELIVERIES)
def test_fuzz_landings_reach_every_joiner(live: Live, case: Delivery) -> None:
    frames, sent = exercise_delivery(live, case)
    live.counters.add("delivery", frames, sent)
    live.check()


@_examples(400)
@given(actions=SOUP_ACTIONS)
def test_fuzz_requests_with_live_tokens(live: Live, actions: list[tuple[Any, ...]]) -> None:
    frames, sent = exercise_soup(live, actions)
    live.counters.add("scenario", frames, sent)
    live.check()


# -- answers the protocol fixes, one by one ---------------------------------------------


def test_unknown_op_and_bad_fields_are_answered_and_the_connection_stays(live: Live) -> None:
    cases = [
        ({"op": "nope", "id": 5}, 5),
        ({"op": "lead", "id": 6, "token": 1}, 6),  # an answer's op is not a request
        ({"op": "run", "id": 7}, 7),  # no key
        ({"op": "run", "id": 8, "key": ""}, 8),
        ({"op": "run", "id": "8", "key": "k"}, None),
        ({"op": "run", "id": True, "key": "k"}, None),
        ({"op": "run", "id": -1, "key": "k"}, -1),
        ({"op": "status", "id": 2**63}, 2**63),
        ({"op": "land", "id": 9, "token": 1, "outcome": "value"}, 9),  # no payload
        ({"op": "land", "id": 10, "token": 1, "outcome": "timeout", "deadline": Raw("1e400")}, 10),
        ({"op": "land", "id": 11, "token": 1, "outcome": "error", "error": {"type": "E"}}, 11),
        ({"op": "forget", "key": 3}, None),
        ({"op": "status", "id": 1.0}, None),
        ({"op": "run", "id": 12, "key": "fz", "flight": 1, "earlier": [1] * 65}, 12),
        ({"op": "run", "id": 13, "key": "fz", "flight": 1, "earlier": [True]}, 13),
        ({"op": "reassert", "id": 14, "key": "fz", "token": 9, "earlier": [-1]}, 14),
        ({"op": "reassert", "id": 15, "key": "fz", "token": 9, "earlier": "1"}, 15),
    ]
    with live.connect() as conn:
        assert conn.handshake()
        for header, want in cases:
            assert conn.send(frame_of(header))
            got = conn.read_frame()
            assert got is not None, f"{header} closed the connection"
            assert got[0]["op"] == "error" and got[0]["id"] == want, (header, got)
            assert isinstance(got[0]["message"], str) and got[0]["message"]
            assert conn.send(frame_of({"op": "status", "id": 12}))
            got = conn.read_frame()
            assert got is not None and got[0]["op"] == "status" and got[0]["id"] == 12, got
    live.check()


CLOSING = [
    length_prefixed(b"", MAX_FRAME + 1),
    length_prefixed(b"", 2**32 - 1),
    length_prefixed(b""),  # an empty body is not JSON
    length_prefixed(b"not json"),
    length_prefixed(b"\xff\xfe{}"),  # not UTF-8
    length_prefixed(b'{"op":"status","id":1'),  # cut JSON
    length_prefixed(b"[1,2]"),
    length_prefixed(b'"status"'),
    length_prefixed(b'{"id":1}'),  # no op
    length_prefixed(b'{"op":5,"id":1}'),
    length_prefixed(b'{"op":null,"id":1}'),
    length_prefixed(b'{"op":"status","id":NaN}'),
    length_prefixed(b'{"op":"status","id":-Infinity}'),
    length_prefixed(b'{"op":"status","id":1}{"op":"status","id":2}'),
    length_prefixed(b"[" * 200_000 + b"]" * 200_000),
]


@pytest.mark.parametrize("bad", CLOSING, ids=range(len(CLOSING)))
def test_frames_that_break_the_framing_close_that_connection(live: Live, bad: bytes) -> None:
    with live.connect() as conn, live.connect() as other:
        assert conn.handshake() and other.handshake()
        conn.send(bad)
        prediction = predict(bad)
        assert prediction.end == "close"
        answers = conn.frames_until_eof()
        if prediction.too_large:  # said, then closed
            assert [h for h, _ in answers] == [
                {"op": "error", "id": None, "limit": MAX_FRAME,
                 "message": f"a frame of {struct.unpack('>I', bad[:4])[0]} bytes is over "
                            f"the limit of {MAX_FRAME}"}
            ]
        else:
            assert answers == []
        assert other.send(wire.status_frame(3))  # the other connection is served
        got = other.read_frame()
        assert got is not None and got[0]["op"] == "status"
    live.check()


def test_handshake_answers(live: Live) -> None:
    with live.connect() as conn:
        conn.send(b'{"protocol":"flightgroup","version":2}\n')
        assert conn.read_line() == REFUSAL
        assert conn.read_line() is None
    with live.connect() as conn:
        conn.send(b"GET / HTTP/1.1\r\n")
        line = conn.read_line()
        assert line is not None and json.loads(line)["ok"] is False
        assert conn.read_line() is None
    with live.connect() as conn:
        conn.send(b'{"version":1,"protocol":"flightgroup","client":"fuzz"}\n')
        assert conn.read_line() == WELCOME
    live.check()


def test_a_silent_peer_is_dropped(live: Live) -> None:
    with live.connect() as conn:
        conn.send(b'{"protocol":')  # and then nothing
        start = time.monotonic()
        assert conn.read_line(timeout=10) is None
        assert time.monotonic() - start < 9
    live.check()


def test_frames_cut_short_by_the_end_of_the_stream(live: Live) -> None:
    status = wire.status_frame(1)
    for cut in range(1, len(status)):
        with live.connect() as conn:
            assert conn.handshake()
            conn.send(status[:cut])
    big = wire.land_frame(1, 5, wire.Value(b"x" * 300_000))
    with live.connect() as conn:
        assert conn.handshake()
        conn.send(big[: len(big) // 2])
    live.check()


def _served(live: Live, header_text: str) -> bool:
    """Send one frame; True if a status after it is answered (False: closed)."""
    with live.connect() as conn:
        assert conn.handshake()
        conn.send(length_prefixed(header_text.encode()))
        conn.send(wire.status_frame(2))
        while (got := conn.read_frame()) is not None:
            if got[0]["op"] == "status" and got[0]["id"] == 2:
                return True
            assert got[0]["op"] in ("error", "status"), got
        return False


def _nest(depth: int, in_bad_field: bool) -> str:
    nest = "[" * depth + "]" * depth
    return (
        f'{{"op":"status","id":{nest}}}' if in_bad_field else f'{{"op":"status","id":1,"x":{nest}}}'
    )


def _decoding_limit(live: Live) -> int:
    """The deepest nesting the coordinator decodes, found by bisection over the wire
    (an extra field: served up to the limit, closed above it)."""
    low, high = 1, 1_000_000
    while low < high:
        mid = (low + high + 1) // 2
        if _served(live, _nest(mid, in_bad_field=False)):
            low = mid
        else:
            high = mid - 1
    assert 200 < low < 1_000_000, low
    return low


def test_nesting_at_the_json_decoders_limit(live: Live) -> None:
    """Depths at the coordinator's own decoding limit in a field it ignores: a frame is
    served up to the limit and closes its connection above it, and nothing trips."""
    low = _decoding_limit(live)
    for depth in range(low - 12, low + 4):
        assert _served(live, _nest(depth, in_bad_field=False)) == (depth <= low), depth
    live.check()


def test_many_frames_in_one_write_and_one_byte_at_a_time(live: Live) -> None:
    frames = [wire.status_frame(i) for i in range(1, 501)]
    with live.connect() as conn:
        assert conn.handshake()
        conn.send(b"".join(frames))
        for i in range(1, 501):
            got = conn.read_frame()
            assert got is not None and got[0]["op"] == "status" and got[0]["id"] == i
    with live.connect() as conn:
        for byte in HELLO + wire.status_frame(7):
            conn.send(bytes([byte]))
        assert conn.read_line() == WELCOME
        got = conn.read_frame()
        assert got is not None and got[0]["id"] == 7
    live.check()


def test_the_held_flight_survived_and_runs_once(live: Live) -> None:
    """Last: everything above left the real flight of "held" alone."""
    counters = live.counters
    print(
        f"fuzz: {counters.examples} examples, {counters.frames} frames, "
        f"{counters.connections} connections, {counters.probes} liveness probes"
    )
    live.finish()


# --------------------------------------------------------------------------------------
# Inputs the fuzzing showed to matter, each pinned on a coordinator of its own
# (docs/fuzzing.md tells what each guards against).


@pytest.fixture
def solo() -> Iterator[Live]:
    harness = Live(with_joiner=False)
    try:
        yield harness
    finally:
        harness.close()


def _expect_status(live: Live, timeout: float = 3.0) -> None:
    with live.connect() as conn:
        assert conn.handshake()
        conn.send(b'\x00\x00\x00\x16{"op":"status","id":3}')
        try:
            got = conn.read_frame(timeout)
        except TimeoutError:
            got = None
        assert got is not None and got[0]["op"] == "status", (
            f"a status request from another connection was not answered: {got}; "
            f"coordinator stderr: {''.join(live.leader.stderr)[-1500:]}"
        )


def test_a_key_with_a_lone_surrogate_leaves_status_working_for_everyone(solo: Live) -> None:
    """`{"op":"run","id":1,"key":"\\ud800"}` leads a flight whose key has no UTF-8 form:
    every later `status`, from any connection, is still answered (never a
    UnicodeEncodeError, a traceback, and the asker's connection aborted)."""
    with solo.connect() as conn:
        assert conn.handshake()
        conn.send(length_prefixed(b'{"op":"run","id":1,"key":"\\ud800"}'))
        got = conn.read_frame()
        assert got is not None and got[0]["op"] == "lead"
        _expect_status(solo)
    solo.check_process()


def test_a_landing_with_a_lone_surrogate_reaches_its_joiners(solo: Live) -> None:
    """A leader lands `"outcome":"error"` whose message is `"\\ud800"`: the joiner's
    answer is encoded and sent: never a UnicodeEncodeError in the middle of `_land`, the
    flight gone from the table and its joiner never hearing again."""
    with solo.connect() as leader, solo.connect() as joiner:
        assert leader.handshake() and joiner.handshake()
        leader.send(length_prefixed(b'{"op":"run","id":1,"key":"k"}'))
        got = leader.read_frame()
        assert got is not None and got[0]["op"] == "lead"
        token = got[0]["token"]
        joiner.send(length_prefixed(b'{"op":"run","id":1,"key":"k"}'))
        got = joiner.read_frame()
        assert got is not None and got[0]["op"] == "joined"
        land = (
            b'{"op":"land","id":1,"token":%d,"outcome":"error",'
            b'"error":{"type":"E","module":"m","message":"\\ud800"}}' % token
        )
        leader.send(length_prefixed(land))
        try:
            answer = joiner.read_frame(3)
        except TimeoutError:
            answer = None
        assert answer is not None and answer[0]["id"] == 1, (
            f"the joiner got no outcome; coordinator stderr: {''.join(solo.leader.stderr)[-1500:]}"
        )
    solo.check_process()


def test_a_reassert_reusing_a_live_id_orphans_no_flight(solo: Live) -> None:
    """`reassert` checks that its id is free, as `run` does: a second reassert with the
    id of the connection's first lead never replaces it in `session.leads`, so when the
    connection closes the first flight is interrupted, not left in the table with a dead
    leader for every later call of its key to join and wait on forever."""
    with solo.connect() as conn:
        assert conn.handshake()
        conn.send(length_prefixed(b'{"op":"reassert","id":7,"key":"orphan-a","token":5}'))
        conn.send(length_prefixed(b'{"op":"reassert","id":7,"key":"orphan-b","token":6}'))
        conn.send(wire.status_frame(8))
        got = conn.read_frame()
        assert got is not None and got[0]["op"] in ("status", "error")
    time.sleep(0.2)
    flights = solo.status()
    assert [f["key"] for f in flights] == [HELD], f"flights outlived their connection: {flights}"
    with solo.connect() as conn:
        assert conn.handshake()
        conn.send(wire.run_frame(1, "orphan-a"))
        got = conn.read_frame()
        assert got is not None and got[0]["op"] == "lead", f"a new call of the key: {got}"
    solo.check_process()


def test_a_reassert_of_one_flight_under_a_second_id_keeps_its_ending(solo: Live) -> None:
    """A flight reasserted twice on one connection (ids 1 and 2, the second may be
    refused) lands under id 1; when the connection closes, its outcome kept for the
    rejoin window stays the value: a joiner that rejoins in the window gets it, not
    "interrupted"."""
    with solo.connect() as conn:
        assert conn.handshake()
        conn.send(length_prefixed(b'{"op":"reassert","id":1,"key":"twice","token":5}'))
        conn.send(length_prefixed(b'{"op":"reassert","id":2,"key":"twice","token":5}'))
        conn.send(frame_of({"op": "land", "id": 1, "token": 5, "outcome": "value"}, b'"v"'))
        got = conn.read_frame()
        if got is not None and got[0]["op"] == "error" and got[0]["id"] == 2:
            got = conn.read_frame()  # a coordinator may refuse the second reassert
        assert got is not None and got[0] == {"op": "ack", "id": 1}, got
    time.sleep(0.2)
    with solo.connect() as conn:
        assert conn.handshake()
        conn.send(wire.run_frame(1, "twice", flight=5))
        got = conn.read_frame()
        assert got is not None and got[0]["op"] == "landed" and got[1] == b'"v"', (
            f"the rejoin in the window got {got}"
        )
    solo.check_process()


def test_a_bad_field_nested_at_the_decoders_limit_is_answered_error(
    solo: Live,
) -> None:
    """On Python 3.11 (which counts Python frames against the recursion limit): a bad
    field nested just under the decoder's limit, e.g. `{"op":"status","id":[[...]]}` at
    depth 983, decodes, and quoting it (`wire.messages._show`, a few frames deeper) never lets a
    RecursionError escape `parse_request` and the protocol callback: it gets the `error`
    answer the spec wants, and the connection is kept. (3.12+ count C recursion apart.)"""
    low = _decoding_limit(solo)
    for depth in range(low - 12, low + 1):
        assert _served(solo, _nest(depth, in_bad_field=True)), (
            f"depth {depth} (the limit is {low}) closed the connection; "
            f"coordinator stderr: {''.join(solo.leader.stderr)[-1200:]}"
        )
    solo.check_process()
