"""The directory coordinator (``directory/coordinator.py``) on its own:

- the waits for a key lock (``_wait_for_key``, its watcher thread, ``_key_freed``,
  ``_resume``): a watcher that cannot open the key's file or cannot start, a waiting
  run whose connection closes or that is cancelled as the lock frees, several waiters on
  one key;
- resource bounds of a long-running coordinator: waiting entries and frames of
  connections that are gone, watcher threads left behind when a coordinator closes;
- the tokens of a term (``epoch << 32 | sequence``) when its sequence runs out.

Most tests drive one Coordinator directly on a loop thread of this process (``Served``)
with raw wire clients (``RawConn``), and hold a key's lock with a descriptor of the test
itself, as a frozen process (or a leader of an earlier term that has not reasserted
yet) would. Interleavings are forced with hooks (the watcher's ``os.open``, thread
start, a held ``_key_freed``) and every wait is bounded.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flightgroup import (
    GroupClosedError,
)
from flightgroup.directory import fs, wire
from flightgroup.directory.coordinator import Coordinator
from flightgroup.directory.lockwatch import KeyLockWatch

from ..dirproc import HELLO_OK, RawConn
from ..ingroup import Background, arbiter, coordinating, key_watchers
from ..ingroup import close as close_groups
from ..ingroup import group as make_group
from ..support import LoopThread, wait_until

WATCHER = "flightgroup-keylock-"  # the coordinator's watcher threads: this, then the key's digest


# -----------------------------------------------------------------------------
# a coordinator of this process, served on a loop thread of its own
# -----------------------------------------------------------------------------


class Served:
    """One Coordinator term on a short temporary directory, with the election lock
    held by this test, served on a loop thread; raw connections to it."""

    def __init__(self, epoch: int = 7, **kwargs: Any) -> None:
        self.root = tempfile.mkdtemp(prefix="fca", dir="/tmp")
        self.dir = os.path.join(self.root, "d")
        fs.ensure_directory(self.dir)
        lock_fd = os.open(os.path.join(self.dir, "flight.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.epoch = epoch
        self.loop = LoopThread()
        self.coordinator = Coordinator(self.dir, epoch, lock_fd, **kwargs)
        self._conns: list[RawConn] = []
        self._held: list[int] = []
        self.loop.submit(self.coordinator.start()).result(10)

    def connect(self) -> RawConn:
        conn = RawConn(fs.socket_path(self.dir))
        self._conns.append(conn)
        assert conn.hello() == HELLO_OK
        return conn

    def on_loop(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the coordinator's loop (after what was posted before it)."""

        async def call() -> Any:
            return fn()

        return self.loop.submit(call()).result(10)

    def hold(self, key: str) -> int:
        """Take ``key``'s lock as another process would (a new open file)."""
        fd = os.open(fs.key_lock_path(self.dir, key), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._held.append(fd)
        return fd

    def let_go(self, fd: int) -> None:
        self._held.remove(fd)
        os.close(fd)

    def waiting(self, key: str) -> int:
        return int(self.on_loop(lambda: len(self.coordinator._term.waiting.get(key, ()))))

    def sessions(self) -> int:
        return int(self.on_loop(lambda: len(self.coordinator._server.sessions)))

    def close(self) -> None:
        for conn in self._conns:
            conn.close()
        for fd in self._held:  # watcher threads blocked on these locks end now
            os.close(fd)
        try:
            self.loop.submit(self.coordinator.close()).result(10)
        finally:
            self.loop.close()
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def served() -> Iterator[Served]:
    made = Served()
    try:
        yield made
    finally:
        made.close()


def _watchers(directory: str, key: str) -> list[threading.Thread]:
    """The watcher threads blocked on ``directory``'s file of ``key``."""
    digest = os.path.basename(fs.key_lock_path("/", key))[:16]
    return [t for t in key_watchers(directory) if t.name == WATCHER + digest]


def _leading_other(served: Served) -> RawConn:
    """A connection that leads a flight of "other" (which a dropped connection would
    interrupt)."""
    conn = served.connect()
    conn.send(wire.run_frame(1, "other"))
    assert conn.read_frame()[0]["op"] == "lead"
    return conn


def _fail_key_opens_on_the_loop(served: Served, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    """The coordinator's own opens of key-lock files (its probes) fail with ``err``."""
    loop_thread = served.loop.thread
    real_open = os.open

    def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        if threading.current_thread() is loop_thread and fs.KEY_LOCKS in str(path):
            raise OSError(err, os.strerror(err))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", open_)


def _status_of(conn: RawConn, id: int) -> list[dict[str, Any]]:
    """Ask for the status and read until its answer; fails on any other frame."""
    conn.send(wire.status_frame(id))
    header, _ = conn.read_frame()
    assert header["op"] == "status", header
    return list(header["flights"])


# -----------------------------------------------------------------------------
# a watcher that cannot open the key's file
# -----------------------------------------------------------------------------


def test_a_watcher_that_cannot_open_the_key_file_does_not_lead_beside_the_holder(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen process holds ``k`` (here: a leader of epoch 6 that has not reasserted
    yet); a call of ``k`` waits, with a watcher thread that keeps one descriptor open
    per waiting key. Once the process is out of descriptors (a frozen process holding
    many keys is enough), the watcher's open() fails; it never posts _key_freed as if the
    lock had freed: the call does not lead beside the holder, whose reassert (alive, its
    work running, the lock still its) is then taken, its lease kept."""
    served.hold("k")
    tried = threading.Event()
    real_open = os.open

    def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        if threading.current_thread().name.startswith(WATCHER):
            tried.set()
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", open_)
    caller = served.connect()
    caller.send(wire.run_frame(1, "k"))
    assert tried.wait(10), "no watcher tried to open k's file"
    wait_until(lambda: not _watchers(served.dir, "k"), "the watcher ended")
    monkeypatch.undo()
    served.on_loop(lambda: None)  # whatever the watcher posted has run
    # The holder of the lock, a leader of the earlier term, reasserts its flight.
    old_token = (served.epoch - 1) << 32 | 5
    holder = served.connect()
    holder.send(wire.reassert_frame(1, "k", old_token))
    flights = _status_of(holder, 2)  # a `rejected` before it would fail here
    assert [(f["key"], f["token"]) for f in flights] == [("k", old_token)], flights
    header, _ = caller.read_frame()
    assert header["op"] != "lead", f"the call leads while another process holds k: {header}"


def test_a_probe_that_cannot_open_the_key_file_keeps_the_connection(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The coordinator probes a new key's lock by opening its file. Out of descriptors
    (each waiting key's watcher keeps one open), that open raises EMFILE, which never
    escapes _run into buffer_updated (asyncio would close the caller's connection,
    interrupting every flight its process leads). The connection stays (the call may
    fail, or wait)."""
    conn = _leading_other(served)
    _fail_key_opens_on_the_loop(served, monkeypatch, errno.EMFILE)
    conn.send(wire.run_frame(2, "k"))
    conn.send(wire.status_frame(3))
    try:
        frames = [conn.read_frame() for _ in range(2)]
    except EOFError as exc:
        raise AssertionError(f"the connection was dropped: {exc}") from None
    finally:
        monkeypatch.undo()
    status = [header for header, _ in frames if header["op"] == "status"]
    assert status and "other" in [f["key"] for f in status[0]["flights"]], frames


# -----------------------------------------------------------------------------
# a watcher thread that cannot start
# -----------------------------------------------------------------------------


def test_a_watcher_that_cannot_start_does_not_poison_the_key(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread per waiting key: with many keys held by a frozen process, starting
    one more fails (RuntimeError: can't start new thread). That never escapes the
    protocol callback, nor leaves ``k`` a waiting list with no watcher: the key's lock is
    probed on a timer instead, the caller's connection stays, the call leads once the
    holder lets go, and a later call joins it."""
    held = served.hold("k")
    real_start = threading.Thread.start
    failed = threading.Event()

    def start(self: threading.Thread) -> None:
        if self.name.startswith(WATCHER) and not failed.is_set():
            failed.set()
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    first = served.connect()
    first.send(wire.run_frame(1, "other"))  # this process leads another flight
    assert first.read_frame()[0]["op"] == "lead"
    first.send(wire.run_frame(2, "k"))
    assert failed.wait(10)
    monkeypatch.undo()
    assert [f["key"] for f in _status_of(first, 3)] == ["other"]  # it waits; connected
    assert served.waiting("k") == 1
    served.let_go(held)  # the holder is gone: k is free
    header, _ = first.read_frame()
    assert (header["op"], header["id"]) == ("lead", 2), header
    later = served.connect()
    later.send(wire.run_frame(1, "k"))
    header, _ = later.read_frame()
    assert header["op"] == "joined", header


def test_past_the_watcher_bound_keys_are_polled_and_lead_when_freed(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen process holds more keys than the process may have watcher threads:
    the keys past the bound are probed on a timer, never reported free while held,
    and each call leads once its key is let go."""
    from flightgroup.directory import lockwatch

    monkeypatch.setattr(lockwatch, "_WATCHERS_MAX", 2)
    keys = [f"k{i}" for i in range(5)]
    held = {key: served.hold(key) for key in keys}
    conn = served.connect()
    for id, key in enumerate(keys, 1):
        conn.send(wire.run_frame(id, key))
    _status_of(conn, 99)  # every run was handled: each waits
    assert all(served.waiting(key) == 1 for key in keys)
    assert sum(len(_watchers(served.dir, key)) for key in keys) == 2
    assert served.on_loop(lambda: set(served.coordinator._key_locks.polled)) == set(keys[2:])
    for id, key in reversed(list(enumerate(keys, 1))):
        served.let_go(held[key])
        header, _ = conn.read_frame()
        assert (header["op"], header["id"]) == ("lead", id), header
    wait_until(lambda: not any(_watchers(served.dir, key) for key in keys), "the watchers ended")
    assert served.on_loop(lambda: served.coordinator._key_locks.poll_timer) is None


def test_a_key_whose_lock_cannot_be_probed_fails_that_call_only(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe that fails for another reason than a lack of descriptors (the key's file
    is not ours to open) answers that call with an error; the connection and its other
    flights go on."""
    conn = _leading_other(served)
    _fail_key_opens_on_the_loop(served, monkeypatch, errno.EACCES)
    conn.send(wire.run_frame(2, "k"))
    header, _ = conn.read_frame()
    monkeypatch.undo()
    assert (header["op"], header["id"]) == ("error", 2), header
    assert "Permission denied" in header["message"]
    assert [f["key"] for f in _status_of(conn, 3)] == ["other"]


# -----------------------------------------------------------------------------
# waiting entries of connections that are gone
# -----------------------------------------------------------------------------


def test_closed_connections_leave_no_waiting_entries(served: Served) -> None:
    """A frozen process holds ``k`` for hours; processes come and go that call ``k``
    (``flightgroup run --key k --timeout 5`` from cron): each connection closes while its
    call waits. None leaves its entry (and its session, transport and buffers) in
    ``_waiting[k]`` until the lock frees: memory does not grow with the calls made."""
    served.hold("k")
    for _ in range(20):
        conn = served.connect()
        conn.send(wire.run_frame(1, "k"))
        _status_of(conn, 2)  # its run was handled: it waits
        conn.close()
        wait_until(lambda: served.sessions() == 0, "the connection closed")
    live = served.connect()
    live.send(wire.run_frame(1, "k"))
    _status_of(live, 2)  # the run was handled (it waits)
    assert served.waiting("k") == 1, "the waiting entries of closed connections stay"


def test_a_cancelled_waiter_is_skipped_and_the_other_leads_when_the_lock_frees(
    served: Served,
) -> None:
    """Two runs wait for ``k``; one cancels. When the holder lets go, the other leads
    (one watcher served both), and the cancelled one hears nothing."""
    held = served.hold("k")
    one, two = served.connect(), served.connect()
    one.send(wire.run_frame(1, "k"))
    two.send(wire.run_frame(1, "k"))
    wait_until(lambda: served.waiting("k") == 2, "both wait")
    assert len(_watchers(served.dir, "k")) == 1
    one.send(wire.cancel_frame(1))
    _status_of(one, 2)  # the cancel was handled
    served.let_go(held)
    header, _ = two.read_frame()
    assert header["op"] == "lead", header
    assert _status_of(one, 3)[0]["key"] == "k"  # the first frame after the cancel
    wait_until(lambda: not _watchers(served.dir, "k"), "the watcher ended")


def test_a_waiter_whose_connection_closes_as_the_lock_frees_is_skipped(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher reports the lock free while the first waiting run's connection is
    closing: its report (KeyLockWatch.freed) is held until that session is closed, then
    runs; the next waiter (a run on another connection) leads, and no flight is left
    led by the closed one."""
    coordinator = served.coordinator
    real = KeyLockWatch.freed
    posted, go = threading.Event(), asyncio.Event()

    def key_freed(self: KeyLockWatch, key: str) -> None:
        posted.set()

        async def later() -> None:
            await go.wait()
            real(self, key)

        asyncio.get_running_loop().create_task(later())

    monkeypatch.setattr(KeyLockWatch, "freed", key_freed)
    held = served.hold("k")
    first, second = served.connect(), served.connect()
    first.send(wire.run_frame(1, "k"))
    second.send(wire.run_frame(1, "k"))
    wait_until(lambda: served.waiting("k") == 2, "both wait")
    served.let_go(held)
    assert posted.wait(10)
    first.close()
    wait_until(lambda: served.sessions() == 1, "the first connection closed")
    served.on_loop(go.set)
    header, _ = second.read_frame()
    assert header["op"] == "lead", header
    flights = served.on_loop(coordinator.status)
    assert [f["key"] for f in flights] == ["k"] and flights[0]["leader_pid"] == os.getpid()


# -----------------------------------------------------------------------------
# watcher threads left behind when a coordinator closes
# -----------------------------------------------------------------------------


def test_closed_coordinators_leave_no_watcher_threads_behind(directory: str) -> None:
    """A frozen process holds ``k``. A process opens a group, which coordinates, and a
    call of ``k`` waits (a watcher thread blocks in flock on k's file); the group closes.
    Nothing wakes that flock but the lock, so a group this process opens and closes this
    way must not leave one more thread and descriptor each time (as ADR 0016 says of the
    election threads): at most one stays per held key."""
    os.makedirs(os.path.join(directory, fs.KEY_LOCKS), exist_ok=True)
    held = os.open(fs.key_lock_path(directory, "k"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        for index in range(3):
            g = coordinating(directory)
            coordinator = arbiter(g)._state.coordinator
            assert coordinator is not None
            call = Background(lambda g=g: g.run_sync("k", lambda: "never"), f"waits-{index}")
            wait_until(lambda c=coordinator: "k" in c._term.waiting, "the call waits for k")
            close_groups(g)
            with pytest.raises(GroupClosedError):
                call.wait()
        left = len(_watchers(directory, "k"))
        assert left <= 1, f"{left} watcher threads of closed coordinators block on k"
    finally:
        os.close(held)  # the watchers wake and end
        wait_until(lambda: not _watchers(directory, "k"), "the watchers ended")


# -----------------------------------------------------------------------------
# a term out of tokens
# -----------------------------------------------------------------------------


def test_a_term_out_of_tokens_hands_over_to_a_new_term(directory: str) -> None:
    """Tokens are ``epoch << 32 | sequence``: a term has 2**32 - 1 of them (a few days
    of a busy, long-lived coordinator). The next lead past them never raises in the
    protocol callback (dropping the caller's connection, again and again, the term never
    ending): the next call is served, by a new term, with a greater token."""
    a = coordinating(directory)
    b = make_group(directory)
    try:
        coordinator = arbiter(a)._state.coordinator
        assert coordinator is not None
        loop = arbiter(a)._background.loop
        assert loop is not None
        done = threading.Event()

        def near_the_end() -> None:
            coordinator._term.sequence = (1 << 32) - 2
            done.set()

        loop.call_soon_threadsafe(near_the_end)
        assert done.wait(10)
        last = b.run_sync("last", lambda: 1, timeout=10)
        assert last.token == coordinator.epoch << 32 | 0xFFFFFFFF
        after = b.run_sync("after", lambda: 2, timeout=3)
        assert after.value == 2
        assert after.token > last.token
    finally:
        close_groups(b, a)


def test_a_fresh_run_that_names_the_flight_it_came_during_takes_only_later_ones(
    served: Served,
) -> None:
    """``run`` with ``fresh`` and ``after``: its callers came during the flight of token
    ``after``, so a flight (or a kept outcome) of a higher token began after them."""
    leader = served.connect()
    leader.send(wire.run_frame(1, "k"))
    head, _ = leader.read_frame()
    assert head["op"] == "lead"
    t1 = head["token"]
    early = served.connect()  # its callers came during a flight before t1
    early.send(wire.run_frame(1, "k", fresh=True, after=t1 - 1))
    head, _ = early.read_frame()
    assert (head["op"], head["id"], head["token"]) == ("joined", 1, t1)
    during = served.connect()  # came during t1, or names no flight: t1 is too old
    during.send(wire.run_frame(1, "k", fresh=True, after=t1))
    during.send(wire.run_frame(2, "k", fresh=True))
    wait_until(
        lambda: served.on_loop(lambda: len(served.coordinator._term.flights["k"].fresh)) == 2,
        "both fresh runs wait for t1's end",
    )
    leader.send(wire.land_frame(1, t1, wire.Value(b'"one"', keep=60.0)))
    assert early.read_frame()[0]["op"] == "landed"
    answers = {h["id"]: h for h, _ in (during.read_frame(), during.read_frame())}
    assert answers[1]["op"] == "lead" and answers[2]["op"] == "joined"
    t2 = answers[1]["token"]
    assert t2 > t1
    during.send(wire.land_frame(1, t2, wire.Value(b'"two"', keep=60.0)))
    assert {h["op"] for h, _ in (during.read_frame(), during.read_frame())} == {"landed", "ack"}
    # kept: t2's outcome serves a fresh run that came during t1, not one that came during t2
    late = served.connect()
    late.send(wire.run_frame(1, "k", fresh=True, after=t1))
    head, payload = late.read_frame()
    assert (head["op"], head["token"], head.get("kept"), payload) == ("landed", t2, True, b'"two"')
    late.send(wire.run_frame(2, "k", fresh=True, after=t2))
    head, _ = late.read_frame()
    assert head["op"] == "lead" and head["token"] > t2


@pytest.mark.timeout(60)
def test_frames_to_a_peer_that_died_are_not_written_past_its_transport(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Frames to a peer that died are not written past its closed transport.

    A peer that joined many flights dies while the coordinator is busy (or stopped); then the
    coordinator pushes the landings to it. The first write finds the socket broken: asyncio
    closes the transport and runs connection_lost a loop turn later. No write is made meanwhile,
    so asyncio never logs "socket.send() raised exception."."""
    from flightgroup.directory.server import Session

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        session = Session(transport, os.getpid())
        theirs.close()  # the peer's process died
        for _ in range(10):  # one loop turn: connection_lost has not run yet
            session.send(wire.detached_frame(1))
        await asyncio.sleep(0)
        transport.close()

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        asyncio.run(main())
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
