"""Withdrawals and closes at every point of a directory call's life: a call withdrawn or
its group closed with its run request out, its key-lock file being opened, its lead
waiting for the key lock, a retry's token out, a coordinator killed or frozen meanwhile;
and what each leaves behind (key locks, descriptors, threads): nothing.

Interleavings are forced with events and hooks on the very calls that make the window
(``os.open`` of a key-lock file, ``flock``, ``pwrite``, the `lead` answer held until the
caller opens its file), or with SIGSTOP/SIGKILL of a child process; every wait is
bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

from flightgroup import (
    FlightGroup,
    GroupClosedError,
    Retry,
    current_lease,
)
from flightgroup.directory import fs
from flightgroup.directory.answers import Answers
from flightgroup.directory.client import DirectoryArbiter
from flightgroup.directory.keylocks import OPENING

from ..dirproc import Child, Harness, assert_value, wait_for
from ..ingroup import Background, coordinating
from ..ingroup import arbiter as _arbiter
from ..ingroup import close as _close
from ..ingroup import group as _group
from ..ingroup import key_files_open as _key_files_open
from ..ingroup import key_lock_free as _key_lock_free
from ..ingroup import landed_leader_holds as _landed_leader_holds
from ..ingroup import lock_waiters as _lock_waiters
from ..support import wait_until

# -----------------------------------------------------------------------------
# helpers
# -----------------------------------------------------------------------------


def _coordinating(directory: str, **kwargs: Any) -> FlightGroup:
    """A group that holds the election, its warm-up landing acknowledged."""
    group = coordinating(directory, **kwargs)
    _settled(group)
    return group


def _coordinated_beside_x(h: Harness) -> tuple[Child, Child, FlightGroup, DirectoryArbiter]:
    """A child ``coord`` that coordinates, a child ``x`` connected, and a group of this
    process connected (with its arbiter)."""
    coord = h.spawn_warm("coord")
    assert h.coordinator_pid() == coord.pid
    x = h.spawn_warm("x")
    b = _connected(h.dir)
    return coord, x, b, _arbiter(b)


def _connected(directory: str, **kwargs: Any) -> FlightGroup:
    """A group connected to the coordinator of the moment (it made one call), whose
    campaign holds its descriptor of ``flight.lock``: the campaign's thread opens it
    some time after the group started, and a count of this process's descriptors taken
    before that would find it "left" later."""
    group = _group(directory, **kwargs)
    assert group.run_sync(f"warm-{id(group)}", lambda: 0).value == 0
    _settled(group)
    lock = os.path.realpath(os.path.join(directory, fs.LOCK_NAME))
    wait_until(lambda: any(path == lock for _, path in _fd_table()), "the group's campaign")
    return group


def _settled(group: FlightGroup) -> None:
    """Wait until the group's landings were acknowledged: their calls and leads are
    gone. Each key file is closed just after, on the group's thread (a check of the
    files waits for that)."""
    arbiter = _arbiter(group)
    wait_until(lambda: not arbiter._state.calls and not arbiter._state.leads, "every landing acked")


def _fd_table() -> set[tuple[str, str]]:
    """This process's descriptors: (number, what it names)."""
    table = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, gone already
            table.add((name, os.readlink(f"/proc/self/fd/{name}")))
    return table


def _in_thread(name: str) -> bool:
    return threading.current_thread().name == name


def _answer_lead_while_opening(monkeypatch: pytest.MonkeyPatch, arbiter: DirectoryArbiter) -> None:
    """Hold the coordinator's `lead` answer to a new call of ``arbiter`` (on its loop)
    until the caller is creating the key's file (Call.fd is OPENING): the lead is then
    told while the file opens, and the caller takes it in its own thread."""
    real = Answers.on_lead

    def on_lead(self: Answers, id: int, token: int) -> None:
        call = self.state.calls.get(id)
        if self is arbiter._answers and call is not None and call.lead is None:
            wait_until(lambda: call.fd == OPENING, "the caller opens the key's file")
        real(self, id, token)

    monkeypatch.setattr(Answers, "on_lead", on_lead)


def _cont(child: Child) -> None:
    if child.alive():
        child.cont()


# -----------------------------------------------------------------------------
# the group closed while the caller takes a lead it was told of as it opened the file
# -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_close_while_the_caller_takes_a_lead_told_as_it_opened_the_key_file(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = _coordinating(directory)
    b = _connected(directory)
    arbiter = _arbiter(b)
    at_flock, go = threading.Event(), threading.Event()
    real_open, real_flock = os.open, fcntl.flock

    def told_to_lead() -> bool:
        return any(call.pending is not None for call in list(arbiter._state.calls.values()))

    def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        if _in_thread("adv-caller") and "execution-locks" in str(path):
            # The coordinator's `lead` comes while this thread creates the key's file.
            wait_until(told_to_lead, "the lead answer came while the file opened")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def flock(fd: int, operation: int) -> None:
        if _in_thread("adv-caller") and operation & fcntl.LOCK_NB and not at_flock.is_set():
            at_flock.set()  # the caller took the pending lead; it is not published yet
            go.wait(20)
        real_flock(fd, operation)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(fcntl, "flock", flock)
    _answer_lead_while_opening(monkeypatch, arbiter)
    runs: list[str] = []
    try:
        call = Background(lambda: b.run_sync("k", lambda: runs.append("b")), "adv-caller")
        assert at_flock.wait(20)
        closing = Background(b.close)
        closing.wait(20)  # close() ended: the call was failed, the connection is gone
        go.set()
        with pytest.raises(GroupClosedError):
            call.wait()
        assert runs == []
        assert _key_lock_free(directory, "k"), "a closed group keeps k's key lock for ever"
    finally:
        go.set()
        monkeypatch.undo()
        for lead in list(arbiter._state.leads.values()):
            lead.release()  # the leaked descriptor
        _close(b, c)


# -----------------------------------------------------------------------------
# a lead that gets its key lock as its call is withdrawn
# -----------------------------------------------------------------------------


def _fd_is_key_file(fd: int) -> bool:
    try:
        return "execution-locks" in os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False


class _Contended:
    """A lead's lock that says when another thread waits to take it."""

    def __init__(self, lock: Any, waiting: threading.Event) -> None:
        self._lock, self._waiting = lock, waiting

    def __enter__(self) -> bool:
        if not self._lock.acquire(blocking=False):
            self._waiting.set()
            self._lock.acquire()
        return True

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


@pytest.mark.timeout(60)
def test_a_lead_withdrawn_as_it_gets_its_key_lock_writes_no_other_file(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key-lock thread got the lock and is about to write the token (held at its
    pwrite); the call is withdrawn then. The withdrawal waits for the write (the lead's
    lock), so the descriptor the token goes to is still the key's file: it is never
    closed under the write and its number handed to another file."""
    c = _coordinating(directory)
    b = _connected(directory)
    arbiter = _arbiter(b)
    a, release_a, runs = _landed_leader_holds(directory)
    at_pwrite, go, withdrawing = threading.Event(), threading.Event(), threading.Event()
    written: list[tuple[int, int]] = []
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if _in_thread("flightgroup-keylock") and not at_pwrite.is_set():
            (lead,) = arbiter._state.leads.values()
            written.append((fd, lead.token))
            # Its lock is held here (the `with` took it): a withdrawal must wait for it.
            lead.lock = _Contended(lead.lock, withdrawing)  # type: ignore[assignment]
            at_pwrite.set()  # the key-lock thread got the lock: its token goes out now
            go.wait(20)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    try:

        async def work_b() -> str:
            runs.append("b")
            return "b"

        async def main() -> None:
            task = asyncio.ensure_future(b.run("k", work_b))
            await asyncio.to_thread(
                wait_until,
                lambda: _lock_waiters(directory) == 1,
                "b leads k and waits for its lock",
            )
            release_a.set()  # a's work ends: b's key-lock thread takes the lock
            await asyncio.to_thread(at_pwrite.wait, 20)
            assert not task.done()
            # The program's loop ends here: the driver task is cancelled, the call withdrawn

        asyncio.run(main())
        assert withdrawing.wait(20), "the withdrawal did not come while the token was due"
        fd, token = written[0]
        assert _fd_is_key_file(fd)  # the withdrawal waits on the lead's lock, fd still open
        go.set()
        wait_until(lambda: not _fd_is_key_file(fd), "the withdrawal closed the lead's descriptor")
        wait_until(lambda: _lock_waiters(directory) == 0, "the key-lock thread ended")
        assert not arbiter._state.leads
        with open(fs.key_lock_path(directory, "k"), "rb") as f:
            assert f.read() == b"%-20d\n" % token  # the token went to the key's own file
        assert runs == ["a", "a2"]
        assert _key_lock_free(directory, "k")
    finally:
        go.set()
        release_a.set()
        a.close()
        monkeypatch.undo()
        _close(b, c)


# -----------------------------------------------------------------------------
# the group closed while a retry's `attempt` is out
# -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_close_while_a_retry_asks_its_token(h: Harness) -> None:
    coord = h.spawn_warm("coord")
    assert h.coordinator_pid() == coord.pid
    b = _connected(h.dir, retry=Retry(attempts=2, backoff=0.0, jitter=False), reconnect_timeout=4.0)
    arbiter = _arbiter(b)
    started, fail = threading.Event(), threading.Event()
    runs: list[int] = []

    second = threading.Event()

    def work() -> str:
        runs.append(len(runs) + 1)
        started.set()
        assert fail.wait(20)
        if len(runs) > 1:
            second.wait(20)
        raise ValueError("attempt fails")

    try:
        call = Background(lambda: b.run_sync("k", work))
        assert started.wait(20)
        coord.stop()  # the coordinator hears the retry's `attempt` only later
        fail.set()
        wait_until(
            lambda: any(lead.retrying for lead in list(arbiter._state.leads.values())),
            "the retry asked a new token",
        )
        (lead,) = arbiter._state.leads.values()
        closing = Background(b.close)
        wait_until(lambda: lead.cut, "close() told the coordinator the flight is cut")
        coord.cont()
        ended = closing.done.wait(2.5)
        second.set()
        call.done.wait(20)
        assert runs == [1], "a new attempt of the work started after its group closed"
        assert ended, "close() waited reconnect_timeout for an ack that never comes"
    finally:
        fail.set()
        second.set()
        _cont(coord)
        _close(b)


# -----------------------------------------------------------------------------
# the group closed, or the call withdrawn, before its run request is answered
# -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_close_while_the_caller_opens_its_key_file_before_any_answer(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    coord, x, b, arbiter = _coordinated_beside_x(h)
    assert arbiter._state.channel is not None
    fd = arbiter._state.channel.sock.fileno()
    connection = (str(fd), os.readlink(f"/proc/self/fd/{fd}"))  # b's, to the coordinator
    at_open, go = threading.Event(), threading.Event()
    real_open = os.open

    def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        if _in_thread("adv-caller") and "execution-locks" in str(path):
            at_open.set()  # Call.fd is OPENING now
            go.wait(20)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", open_)
    runs: list[str] = []
    try:
        coord.stop()  # nothing answers b's run request
        call = Background(lambda: b.run_sync("k", lambda: runs.append("b")), "adv-caller")
        assert at_open.wait(20)
        closing = Background(b.close)
        closing.wait(20)  # while the coordinator is still frozen
        go.set()
        with pytest.raises(GroupClosedError):
            call.wait()
        monkeypatch.undo()
        # The file the caller opened is closed by the caller itself (close() found the
        # call OPENING), and nothing else of b is left.
        wait_until(lambda: _key_files_open(h.dir) == 0, "the caller closed the key file")
        assert not arbiter._state.calls and not arbiter._state.leads
        assert connection not in _fd_table()  # b's connection is gone too
        coord.cont()  # it reads b's run, leads it, finds b gone: the flight is interrupted
        x.call("n", "k", h.work(**{"return": "x"}))
        assert_value(x.expect("done", "n"), "x", joined=False)
        assert runs == []
        assert [entry[0] for entry in h.runs_of("k")] == [x.pid]
    finally:
        go.set()
        _cont(coord)
        _close(b)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("then", ["coordinator-continues", "coordinator-killed"])
def test_a_call_withdrawn_before_its_run_is_answered(h: Harness, then: str) -> None:
    coord, x, b, arbiter = _coordinated_beside_x(h)
    runs: list[str] = []

    async def work() -> str:
        runs.append("b")
        return "b"

    try:
        coord.stop()  # b's run request (and then its cancel) wait in the socket
        for _ in range(3):

            async def main() -> None:
                task = asyncio.ensure_future(b.run("k", work))
                await asyncio.to_thread(
                    wait_until, lambda: _key_files_open(h.dir) == 1, "the call opened k's file"
                )
                assert not task.done()
                # The loop ends: the driver task is cancelled, the call withdrawn.

            asyncio.run(main())
            wait_until(lambda: not arbiter._state.calls, "the call was withdrawn")
            wait_until(lambda: _key_files_open(h.dir) == 0, "its key file closed")
        if then == "coordinator-continues":
            # It reads each run, leads it, then reads its cancel: nobody leads k after.
            coord.cont()
        else:
            # The requests die with it; b must not send them again to the next one.
            coord.kill()
            h.coordinator_pid(not_pid=coord.pid)
            wait_until(lambda: arbiter._state.channel is not None, "b reconnected")
        # Answered after every frame b sent before it: no flight of k is left.
        assert arbiter.status(timeout=10) == []
        x.call("n", "k", h.work(**{"return": "x"}))
        assert_value(x.expect("done", "n"), "x", joined=False)
        assert runs == []
        assert [entry[0] for entry in h.runs_of("k")] == [x.pid]
        assert not arbiter._state.calls and not arbiter._state.leads
        assert _key_files_open(h.dir) == 0
        x.roundtrip("after")  # answered after the ack of x's landing: x freed k
        assert _key_lock_free(h.dir, "k")
    finally:
        _cont(coord)
        _close(b)


# -----------------------------------------------------------------------------
# a lead told while the caller opens the key's file, then the coordinator killed
# -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_lead_told_as_the_file_opened_survives_the_coordinators_death(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    coord, x, b, arbiter = _coordinated_beside_x(h)
    go, x_joined = threading.Event(), threading.Event()
    real_open = os.open
    runs: list[int] = []

    def told() -> list[int]:
        return [c.pending for c in list(arbiter._state.calls.values()) if c.pending is not None]

    def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        if _in_thread("adv-caller") and "execution-locks" in str(path):
            wait_until(lambda: bool(told()), "the lead answer came while the file opened")
            go.wait(20)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def work() -> str:
        runs.append(current_lease().token)
        assert x_joined.wait(20)
        return "b"

    monkeypatch.setattr(os, "open", open_)
    _answer_lead_while_opening(monkeypatch, arbiter)
    try:
        call = Background(lambda: b.run_sync("k", work), "adv-caller")
        wait_until(lambda: bool(told()), "b was told to lead k")
        (token,) = told()
        coord.kill()  # the coordinator that told it dies before b holds the key lock
        h.coordinator_pid(not_pid=coord.pid)
        # b reconnects and reasserts the lead it was told of (it is not a lead yet)
        wait_until(
            lambda: (
                arbiter._state.channel is not None
                and all(c.sent for c in list(arbiter._state.calls.values()))
            ),
            "b reasserted its lead",
        )
        assert arbiter.status(timeout=10)[0]["token"] == token
        x.call("j", "k", h.work(**{"return": "x"}))
        x.expect("joined", "j")  # x joins b's flight: the new coordinator knows it
        x_joined.set()
        go.set()
        result = call.wait()
        assert (result.value, result.joined, result.token) == ("b", False, token)
        done = x.expect("done", "j")
        assert_value(done, "b", joined=True)
        assert done["token"] == token
        assert runs == [token] and h.runs_of("k") == []  # x never ran it
        _settled(b)
        wait_until(lambda: _key_files_open(h.dir) == 0, "b closed k's file after the ack")
    finally:
        go.set()
        x_joined.set()
        monkeypatch.undo()
        _close(b)


# -----------------------------------------------------------------------------
# many calls withdrawn at each point leave no descriptor and no thread behind
# -----------------------------------------------------------------------------


def _withdraw_after(group: FlightGroup, key: str, reached: Callable[[], bool]) -> None:
    """Call ``key`` on a loop of its own and end that loop (which cancels the flight's
    driver task: the call is withdrawn) once ``reached()`` holds."""
    arbiter = _arbiter(group)

    async def work() -> str:
        raise AssertionError("a withdrawn call's work ran")

    async def main() -> None:
        task = asyncio.ensure_future(group.run(key, work))
        await asyncio.to_thread(wait_until, reached, f"the call of {key} got there")
        assert not task.done()

    asyncio.run(main())
    wait_until(
        lambda: not arbiter._state.calls and not arbiter._state.leads, "the call was withdrawn"
    )


@pytest.mark.timeout(60)
def test_many_calls_withdrawn_at_each_point_leak_nothing(h: Harness) -> None:
    coord = h.spawn_warm("coord")
    assert h.coordinator_pid() == coord.pid
    a = h.spawn_warm("a", deadline=0.3, retry_attempts=2)
    x = h.spawn_warm("x")
    b = _connected(h.dir)
    arbiter = _arbiter(b)
    fds, threads = _fd_table(), set(threading.enumerate())
    # a leads k: its first attempt runs past the deadline and goes on, the retry lands
    # a value. The first work keeps k's key lock, and the coordinator lets the next call
    # of k lead at once (a landed value: the lock is freed with its ack, it expects).
    a.call("l", "k", h.work(block_first=True), timeout=60)
    a.expect("started", "l")
    assert_value(a.expect("done", "l"), None, joined=False)
    # x leads j; b's calls of j join it.
    x.call("l", "j", h.work(block=True, **{"return": "j"}))
    x.expect("started", "l")
    try:
        # b leads k and waits for its key lock in a thread: withdrawn there.
        _withdraw_after(b, "k", lambda: _lock_waiters(h.dir) == 1)
        for _ in range(10):
            # The coordinator makes b's call wait for k's key lock (b opened the file).
            _withdraw_after(
                b,
                "k",
                lambda: any(
                    c.fd is not None and c.fd >= 0 for c in list(arbiter._state.calls.values())
                ),
            )
            # b joined x's flight of j.
            _withdraw_after(
                b, "j", lambda: any(c.joined for c in list(arbiter._state.calls.values()))
            )
        assert [entry[0] for entry in h.runs_of("k")] == [a.pid, a.pid]
        assert _lock_waiters(h.dir) == 1  # the first withdrawn lead still waits on a copy
        a.release("l")  # a's work ends and frees the key lock
        x.release("l")
        assert_value(x.expect("done", "l"), "j", joined=False)
        wait_until(lambda: _lock_waiters(h.dir) == 0, "the key-lock thread ended")
        try:
            wait_until(lambda: not _fd_table() - fds, "no descriptor left but those before")
        except AssertionError as failed:
            raise AssertionError(f"{failed}: {sorted(_fd_table() - fds)}") from None
        wait_until(lambda: not set(threading.enumerate()) - threads, "no thread left")
        assert _key_files_open(h.dir) == 0
        result = b.run_sync("k", lambda: "b")  # nothing of the withdrawn calls holds k
        assert (result.value, result.joined) == ("b", False)
        assert [entry[0] for entry in h.runs_of("k")] == [a.pid, a.pid]
    finally:
        a.send(cmd="release_all")
        x.send(cmd="release_all")
        _close(b)


# -----------------------------------------------------------------------------
# a closed group gives back what it held for the election
# -----------------------------------------------------------------------------


def _election_files_open() -> int:
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").endswith("/flight.lock"):
                count += 1
        except OSError:
            pass
    return count


def _election_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "flightgroup-election")


@pytest.mark.timeout(60)
def test_closed_groups_election_threads_are_adopted_not_piled_up(h: Harness) -> None:
    """Nothing wakes a thread blocked in flock(flight.lock) but the lock, so a group
    that closes while another process coordinates parks its campaign, and the next
    group opened on the directory adopts it: open and close groups any number of times,
    and one thread and one descriptor are left, not one per group ever closed. When the
    coordinator dies, that parked campaign wins, lets go at once, and another process
    coordinates."""
    coord = h.spawn_warm("coord")
    assert h.coordinator_pid() == coord.pid
    fds, threads = _election_files_open(), _election_threads()
    for index in range(5):
        group = _connected(h.dir)
        # it takes part in the election (its thread opens flight.lock, then blocks)
        wait_for(lambda: _election_files_open() == fds + 1, "its campaign waits", 10)
        assert _election_threads() == threads + 1
        group.close()
        coord.roundtrip(f"after-{index}")  # the directory goes on
    assert _election_threads() == threads + 1  # the last closed group's, parked
    assert _election_files_open() == fds + 1
    other = h.spawn_warm("other")
    coord.kill()
    # The parked campaign may win first: it must let go, not keep the election.
    other.roundtrip("after-kill")
    assert h.coordinator_pid(not_pid=coord.pid) == other.pid
    wait_for(lambda: _election_threads() == threads, "the parked campaign let go", 10)
    assert _election_files_open() == fds
