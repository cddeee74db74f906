"""Retention in the directory scope: the leader's bounds (max_items, max_bytes) travel in
its landing and the coordinator applies them to the group's kept outcomes (docs/api.md: "LRU
by items, then by encoded bytes; a hit counts as a use"); kept outcomes outlive the
coordinator that kept it, in their files (ADR 0039).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import pytest

from flightgroup import FlightFailedError, Retention
from flightgroup.directory import wire

from ..dirproc import HELLO_OK, ROOT, Child, Harness, RawConn, assert_error, assert_value
from ..ingroup import arbiter, close, coordinating, group

pytestmark = pytest.mark.timeout(60)


def test_a_hit_counts_as_a_use_for_max_items(directory: str) -> None:
    """A hit on a kept outcome counts as a use for max_items' LRU."""
    a = coordinating(directory, retention=Retention(success=60.0, max_items=2))
    b = group(directory, retention=Retention(success=60.0, max_items=2))
    try:
        a.run_sync("k1", lambda: 1)
        a.run_sync("k2", lambda: 2)
        assert b.run_sync("k1", lambda: 0).joined is True  # a hit: k1 is used last
        a.run_sync("k3", lambda: 3)  # evicts the least recently used: k2
        assert (b.run_sync("k1", lambda: 0).value, b.run_sync("k3", lambda: 0).value) == (1, 3)
        again = b.run_sync("k2", lambda: 22)
        assert (again.value, again.joined) == (22, False)
    finally:
        close(a, b)


def test_max_bytes_evicts_the_least_recently_used_until_the_rest_fits(directory: str) -> None:
    """max_bytes evicts the least recently used kept outcomes until the rest fits."""
    keep = Retention(success=60.0, max_bytes=30)
    a = coordinating(directory, retention=keep)
    b = group(directory, retention=keep)
    try:
        a.run_sync("k1", lambda: "x" * 10)  # 12 bytes of JSON
        a.run_sync("k2", lambda: "y" * 10)  # 24 in all
        a.run_sync("k3", lambda: "z" * 10)  # 36: k1 goes
        assert b.run_sync("k2", lambda: "").joined is True
        assert b.run_sync("k3", lambda: "").joined is True
        assert b.run_sync("k1", lambda: "new").joined is False
        assert arbiter(a)._state.coordinator._term.outcomes.kept.bytes <= 30  # type: ignore[union-attr]
    finally:
        close(a, b)


def test_an_outcome_over_max_bytes_alone_drops_the_keys_older_one(directory: str) -> None:
    """An outcome over max_bytes alone is not kept and drops the key's older kept one."""
    a = coordinating(directory, retention=Retention(success=60.0, max_bytes=20))
    b = group(directory, retention=Retention(success=60.0, max_bytes=20))
    try:
        a.run_sync("k", lambda: "small")
        a.run_sync("other", lambda: "kept")
        a.run_sync("k", lambda: "x" * 40, fresh=True)  # over max_bytes: not kept
        again = b.run_sync("k", lambda: "new")
        assert (again.value, again.joined) == ("new", False)  # nor is the older one
        assert b.run_sync("other", lambda: "").value == "kept"  # the others stay
    finally:
        close(a, b)


def test_a_kept_failure_counts_its_type_module_and_message(directory: str) -> None:
    """A kept failure's size is its type, module and message."""
    keep = Retention(success=None, error=60.0, max_bytes=40)
    a = coordinating(directory, retention=keep)
    b = group(directory, retention=keep)
    try:
        def short() -> None:
            raise ValueError("no")  # ValueError + builtins + no: 19 bytes

        def long() -> None:
            raise ValueError("n" * 30)  # 47 bytes: over max_bytes alone

        with pytest.raises(ValueError):
            a.run_sync("short", short)
        with pytest.raises(ValueError):
            a.run_sync("long", long)
        with pytest.raises(FlightFailedError):
            b.run_sync("short", lambda: None)  # kept
        assert b.run_sync("long", lambda: "ran").value == "ran"  # not kept
    finally:
        close(a, b)


@pytest.mark.parametrize("name", ["max_items", "max_bytes"])
@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3", 2**63, []])
def test_a_land_with_a_bad_bound_is_answered_error(directory: str, name: str, bad: object) -> None:
    """A land with a bad max_items or max_bytes is answered error; the connection stays."""
    a = coordinating(directory)
    try:
        with RawConn(os.path.join(directory, "flight.sock")) as conn:
            assert conn.hello() == HELLO_OK
            header = {"op": "land", "id": 5, "token": 1, "outcome": "value", "keep": 1.0}
            conn.send_frame({**header, name: bad}, b"1")
            answer, _ = conn.read_frame()
            assert answer["op"] == "error" and answer["id"] == 5, answer
            assert name in answer["message"]
            conn.send_frame({"op": "status", "id": 6})  # the connection stays
            assert conn.read_frame()[0]["op"] == "status"
    finally:
        close(a)


def test_the_bounds_round_trip_and_are_optional() -> None:
    """A land's retention bounds round-trip on the wire, and are optional."""
    for outcome in (
        wire.Value(b"v", 1.0, 3, 100),
        wire.Value(b"v", 1.0, None, 100),
        wire.Failure("E", "m", "msg", 2.0, 7, None),
    ):
        frame = wire.land_frame(1, 2, outcome)
        header, payload = wire.decode_body(frame[4:])
        assert wire.parse_request(header, payload) == wire.Land(1, 2, outcome)
        fields, data = wire.outcome_fields(outcome)
        land = {"op": "land", "id": 1, "token": 2, **fields}
        assert frame == wire.encode_frame(land, data)
    header, _ = wire.decode_body(wire.land_frame(1, 2, wire.Value(b"v", 1.0))[4:])
    assert "max_items" not in header and "max_bytes" not in header
    header.update(max_items=None, max_bytes=None)  # null is absent
    assert wire.parse_request(header, b"v") == wire.Land(1, 2, wire.Value(b"v", 1.0))


def test_a_kept_failure_has_its_cause_in_the_group_that_led_it(directory: str) -> None:
    """A kept failure has its __cause__ in the group that led it."""
    g = group(directory, retention=Retention(success=None, error=60.0))
    try:
        boom = KeyError("missing")

        def work() -> None:
            raise boom

        with pytest.raises(KeyError) as led:
            g.run_sync("k", work)
        assert led.value is boom
        runs: list[int] = []
        with pytest.raises(FlightFailedError) as kept:
            g.run_sync("k", lambda: runs.append(1))
        assert runs == []  # served from the kept outcome
        assert kept.value.error_type == "KeyError"
        # docs/api.md (Policies): "a kept failure raises FlightFailedError (with `__cause__` in
        # the leader's process), as a joiner's would" -- as the process scope does.
        assert kept.value.__cause__ is boom
    finally:
        close(g)


def test_retention_max_items_bounds_the_directorys_kept_outcomes(directory: str) -> None:
    """Retention's max_items bounds the directory's kept outcomes."""
    a, b = (group(directory, retention=Retention(success=60.0, max_items=1)) for _ in "ab")
    try:
        assert a.run_sync("k1", lambda: "one").joined is False
        assert a.run_sync("k2", lambda: "two").joined is False
        assert b.run_sync("k2", lambda: "again").value == "two"  # kept: the bound works
        # docs/api.md: a kept outcome is served "until its time runs out or it is evicted (LRU
        # by items, then by encoded bytes)"; max_items=1 keeps only k2's.
        again = b.run_sync("k1", lambda: "new")
        assert (again.value, again.joined) == ("new", False)
    finally:
        close(a, b)


# -- kept outcomes outlive their coordinator (ADR 0039) -----------------------------------

# A short-lived process (a cron job): one call of "k" with Retention, then its end. Each
# run of the work appends a line to argv[2].
SHORT_LIVED = r"""
import os, sys
from flightgroup import JSON, FlightGroup, Retention

def work():
    with open(sys.argv[2], "a") as f:
        f.write(f"{os.getpid()}\n")
    return "v"

with FlightGroup(directory=sys.argv[1], codec=JSON, retention=Retention(success=60.0)) as g:
    result = g.run_sync("k", work)
print(result.value, result.joined, flush=True)
"""


def _kept_files(h: Harness) -> list[str]:
    try:
        return sorted(os.listdir(h.path("state", "kept")))
    except FileNotFoundError:
        return []


def _served(child: Child) -> None:
    """The coordinator read every frame ``child`` sent before (a forget of an unused key
    is confirmed after them: frames of one connection are read in order)."""
    child.send(cmd="forget", key="unused")
    assert child.expect("forgot")["error"] is None


def _end(child: Child, how: str) -> None:
    """End ``child``'s process: its group closed, a plain exit, or SIGKILL; the last two
    once the coordinator read the landings sent before."""
    if how == "close":
        child.send(cmd="close", group="g0")
        assert child.expect("closed")["error"] is None
        child.send(cmd="exit")
        child.proc.wait(20)
        return
    _served(child)
    if how == "exit":
        child.send(cmd="exit")
        child.proc.wait(20)
    else:
        child.kill()


def test_short_lived_processes_run_a_kept_key_once(h: Harness) -> None:
    """Short-lived processes that call one kept key one after another run its work once."""
    runs = os.path.join(h.root, "runs")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "src")]))
    answers = []
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", SHORT_LIVED, h.dir, runs],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        answers.append(done.stdout.split())
    assert answers == [["v", "False"], ["v", "True"], ["v", "True"]]
    with open(runs) as f:
        assert len(f.read().splitlines()) == 1  # the work ran once in three processes
    assert h.epoch() == 3  # each process coordinated a term of its own


@pytest.mark.parametrize("how", ["close", "exit", "kill"])
def test_a_kept_value_outlives_the_coordinator_that_kept_it(h: Harness, how: str) -> None:
    """The next coordinator serves a kept value after the one that kept it ended."""
    a = h.spawn("a", keep_success=60.0)  # coordinates and leads
    a.call("l", "k", h.work(**{"return": "v"}))
    assert_value(a.expect("done", "l"), "v", joined=False)
    _end(a, how)

    b = h.spawn("b", keep_success=60.0)  # elected after a ended
    b.call("c", "k", h.work(**{"return": "again"}))
    done = b.expect("done", "c")
    assert_value(done, "v", joined=True)
    assert done["token"] >> 32 == 1  # the token of the flight that produced it
    assert not b.seen("joined", "c")  # a kept outcome calls no on_join
    assert [pid for pid, _, _ in h.runs_of("k")] == [a.pid]
    assert h.epoch() == 2


def test_a_kept_outcome_keeps_its_time_across_coordinators(h: Harness) -> None:
    """The next coordinator serves a kept outcome only for the time it had left."""
    a = h.spawn_warm("a", keep_success=3.0)  # the coordinator
    b = h.spawn_warm("b", keep_success=3.0)
    a.call("l", "k", h.work(**{"return": "old"}))
    assert_value(a.expect("done", "l"), "old", joined=False)
    _served(a)
    kept_before = time.monotonic()  # a kept it before this, for 3 s
    a.kill()
    b.call("kept", "k", h.work(**{"return": "new"}))
    assert_value(b.expect("done", "kept"), "old", joined=True)  # b coordinates now
    # Past the 3 s it was kept for (counted from a's keep, not from b's election).
    threading.Event().wait(max(0.0, kept_before + 3.0 - time.monotonic()))
    b.call("late", "k", h.work(**{"return": "new"}))
    assert_value(b.expect("done", "late"), "new", joined=False)
    assert [pid for pid, _, _ in h.runs_of("k")] == [a.pid, b.pid]


def test_a_forgotten_kept_outcome_stays_forgotten_in_later_terms(h: Harness) -> None:
    """A forget() removes a kept outcome for good: a later coordinator does not serve it."""
    a = h.spawn_warm("a", keep_success=60.0)  # the coordinator
    b = h.spawn_warm("b", keep_success=60.0)
    a.call("l", "k", h.work(**{"return": "old"}))
    a.call("o", "other", h.work(**{"return": "kept"}))
    a.expect("done", "l")
    a.expect("done", "o")
    b.send(cmd="forget", key="k")
    assert b.expect("forgot")["error"] is None  # confirmed by the coordinator
    a.kill()

    b.call("c", "k", h.work(**{"return": "new"}))
    assert_value(b.expect("done", "c"), "new", joined=False)
    b.call("c2", "other", h.work())
    assert_value(b.expect("done", "c2"), "kept", joined=True)  # only k was forgotten


def test_a_fresh_call_is_not_served_an_earlier_terms_kept_outcome(h: Harness) -> None:
    """A fresh call leads past a kept outcome an earlier coordinator kept."""
    a = h.spawn("a", keep_success=60.0)
    a.call("l", "k", h.work(**{"return": "old"}))
    a.expect("done", "l")
    _end(a, "kill")

    b = h.spawn("b", keep_success=60.0)
    b.call("f", "k", h.work(**{"return": "new"}), fresh=True)
    assert_value(b.expect("done", "f"), "new", joined=False)
    b.call("c", "k", h.work())
    assert_value(b.expect("done", "c"), "new", joined=True)  # the fresh flight's, kept


def test_a_kept_outcome_led_past_does_not_outlive_its_coordinator(h: Harness) -> None:
    """A kept outcome a fresh flight led past is not served in the next term when that
    flight died with the coordinator, as in one term (a newer flight ended it)."""
    a = h.spawn_warm("a", keep_success=60.0)  # the coordinator
    b = h.spawn_warm("b", keep_success=60.0)
    a.call("l", "k", h.work(**{"return": "old"}))
    a.expect("done", "l")
    a.call("f", "k", h.work(block=True), fresh=True)
    a.expect("started", "f")  # the fresh flight leads past the kept outcome
    a.kill()

    b.call("c", "k", h.work(**{"return": "new"}))
    assert_value(b.expect("done", "c"), "new", joined=False)


def test_a_kept_failure_outlives_its_coordinator_its_cause_stays_in_its_group(
    h: Harness,
) -> None:
    """A kept failure outlives its coordinator; its cause stays in the group that led it."""
    a = h.spawn_warm("a", keep_error=60.0)  # the coordinator
    b = h.spawn_warm("b", keep_error=60.0)
    b.call("l", "k", h.work(**{"raise": "boom"}))
    assert_error(b.expect("done", "l"), "ValueError")
    _served(b)
    a.kill()

    b.call("again", "k", h.work())  # the leading group, now the coordinator too
    done = b.expect("done", "again")
    attrs = assert_error(done, "FlightFailedError")
    assert (attrs["error_type"], attrs["message"]) == ("ValueError", "boom")
    assert done["cause"] == {"type": "ValueError", "message": "boom"}

    c = h.spawn("c", keep_error=60.0)
    c.call("other", "k", h.work())
    done = c.expect("done", "other")
    attrs = assert_error(done, "FlightFailedError")
    assert (attrs["error_type"], attrs["message"]) == ("ValueError", "boom")
    assert done["cause"] is None  # only in the leader's process
    assert [pid for pid, _, _ in h.runs_of("k")] == [b.pid]


@pytest.mark.parametrize("bound", [{"keep_max_items": 2}, {"keep_max_bytes": 8}])
def test_retentions_bounds_hold_for_the_kept_files(h: Harness, bound: dict[str, int]) -> None:
    """max_items and max_bytes bound the kept outcomes the next coordinator serves."""
    a = h.spawn("a", keep_success=60.0, **bound)
    for key in ("k1", "k2", "k3"):  # each value is 4 bytes of JSON: k1 is evicted
        a.call(key, key, h.work(**{"return": key[1] * 2}))
        a.expect("done", key)
    _end(a, "kill")
    assert len(_kept_files(h)) == 2

    b = h.spawn("b", keep_success=60.0, **bound)
    for key, joined in (("k3", True), ("k2", True), ("k1", False)):
        b.call(key, key, h.work(**{"return": key[1] * 2}))
        done = b.expect("done", key)
        assert done["joined"] is joined, (key, done)
    _served(b)
    assert len(_kept_files(h)) == 2  # k1's keep evicted k3, the least recently used


def _kept_path(directory: str, key: str) -> str:
    digest = hashlib.sha256(key.encode()).hexdigest()
    return os.path.join(directory, "state", "kept", digest)


def _names(directory: str, *keys: str) -> list[str]:
    """The sorted file names of ``keys``' kept outcomes."""
    return sorted(os.path.basename(_kept_path(directory, key)) for key in keys)


def _rewrite_header(path: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Change a kept file's header, its CRC made right again (the layout of ADR 0039: a
    magic line, the header's length and a CRC-32, both 4 bytes big-endian, the header,
    the payload)."""
    with open(path, "rb") as f:
        data = f.read()
    start = data.index(b"\n") + 1
    length, _ = struct.unpack_from(">II", data, start)
    header = json.loads(data[start + 8 : start + 8 + length])
    payload = data[start + 8 + length :]
    change(header)
    head = json.dumps(header, separators=(",", ":")).encode()
    body = head + payload
    with open(path, "wb") as f:
        f.write(data[:start] + struct.pack(">II", len(head), zlib.crc32(body)) + body)


def _cut(size: int) -> Callable[[str, str], None]:
    def damage(path: str, other: str) -> None:
        os.truncate(path, size if size >= 0 else os.path.getsize(path) + size)

    return damage


def _flip_payload(path: str, other: str) -> None:
    with open(path, "r+b") as f:
        f.seek(-2, os.SEEK_END)  # in "vvvv": the value is still JSON, "vvvw"
        byte = f.read(1)
        f.seek(-2, os.SEEK_END)
        f.write(bytes([byte[0] ^ 1]))


def _garbage(path: str, other: str) -> None:
    with open(path, "wb") as f:
        f.write(os.urandom(300))


def _other_keys(path: str, other: str) -> None:
    shutil.copyfile(other, path)


def _symlink(path: str, other: str) -> None:
    os.unlink(path)
    os.symlink(other, path)


def _fifo(path: str, other: str) -> None:
    os.unlink(path)
    os.mkfifo(path, 0o600)


def _another_boot(path: str, other: str) -> None:
    _rewrite_header(path, lambda header: header.update(boot="another boot"))


def _more_time_than_kept(path: str, other: str) -> None:
    # More time left than it was kept for: the reading of another clock.
    _rewrite_header(path, lambda header: header.update(expires=header["expires"] + 1000.0))


DAMAGES: dict[str, Callable[[str, str], None]] = {
    "empty": _cut(0),
    "cut in its header": _cut(30),
    "cut in its payload": _cut(-2),
    "a byte of its payload changed": _flip_payload,
    "garbage": _garbage,
    "another key's file": _other_keys,
    "a symbolic link to another key's file": _symlink,
    "a FIFO": _fifo,
    "kept in another boot": _another_boot,
    "more time left than it was kept for": _more_time_than_kept,
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_kept_file_is_never_served(directory: str, damage: str) -> None:
    """A damaged, cut short or foreign kept file is not served; the next coordinator
    serves the others."""
    keep = Retention(success=60.0)
    a = coordinating(directory, retention=keep)
    try:
        a.run_sync("k", lambda: "vvvv")
        a.run_sync("other", lambda: "kept")
        a.forget("unused")  # confirmed after the coordinator read both landings
    finally:
        close(a)  # its coordinator resigns
    DAMAGES[damage](_kept_path(directory, "k"), _kept_path(directory, "other"))

    b = group(directory, retention=keep)  # coordinates the next term
    try:
        again = b.run_sync("k", lambda: "new")
        assert (again.value, again.joined) == ("new", False)
        assert b.run_sync("other", lambda: "").value == "kept"
        assert b.run_sync("k", lambda: "").value == "new"  # its own file, whole again
    finally:
        close(b)


def test_the_kept_files_are_one_per_kept_outcome(directory: str) -> None:
    """One kept file per kept outcome: replaced, evicted, forgotten and expired ones go."""
    kept = os.path.join(directory, "state", "kept")
    a = coordinating(directory, retention=Retention(success=60.0, max_items=3))
    short = group(directory, retention=Retention(success=0.2))
    try:
        for n in range(5):
            a.run_sync("k", lambda n=n: n, fresh=True)  # each replaces the one before
        a.forget("unused")  # the coordinator read every landing before
        assert sorted(os.listdir(kept)) == _names(directory, "k", "warm-up")
        for n in range(10):
            a.run_sync(f"k{n}", lambda n=n: n)
        a.forget("k9")
        assert len(os.listdir(kept)) == 2  # max_items=3, then the forget
        short.run_sync("short", lambda: "brief")
        kept_before = time.monotonic()
        short.forget("unused")
        assert len(os.listdir(kept)) == 3
        threading.Event().wait(max(0.0, kept_before + 0.2 - time.monotonic()))
        # Its time ran out: the next keep drops it, file and all (nothing evicted live).
        a.run_sync("k", lambda: "again", fresh=True)
        a.forget("unused")
        assert sorted(os.listdir(kept)) == _names(directory, "k", "k7", "k8")
    finally:
        close(a, short)


def test_a_new_term_drops_expired_kept_files_and_cut_short_writes(directory: str) -> None:
    """A new coordinator removes the expired kept files and the temp files of cut-short
    writes."""
    a = coordinating(directory, retention=Retention(success=0.2))
    try:
        a.run_sync("k", lambda: 1)
        kept_before = time.monotonic()
        a.forget("unused")
    finally:
        close(a)
    kept = os.path.join(directory, "state", "kept")
    cut_short = _kept_path(directory, "x") + ".0123.tmp"
    with open(cut_short, "wb") as f:
        f.write(b"flightgroup-kept 1\n")
    threading.Event().wait(max(0.0, kept_before + 0.2 - time.monotonic()))

    b = coordinating(directory)
    try:
        assert os.listdir(kept) == []
        assert b.run_sync("k", lambda: 2).value == 2
    finally:
        close(b)


def test_a_landing_that_keeps_nothing_writes_nothing(directory: str) -> None:
    """Without Retention, landings write no kept file."""
    a = coordinating(directory)
    b = group(directory, retention=Retention(success=None, error=None))
    try:
        a.run_sync("k", lambda: 1)
        b.run_sync("k", lambda: 2)
        with pytest.raises(ValueError):
            a.run_sync("e", lambda: int("x"))
        b.forget("unused")
        assert not os.path.exists(os.path.join(directory, "state", "kept"))
    finally:
        close(a, b)
