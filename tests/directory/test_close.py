"""close() of a directory group: its callers and the joiners of its flights elsewhere are
woken (after its coordinator died too), its unanswered run requests are cancelled, its
key locks are held while its work runs and never leaked, its landings are handed over
before close() returns (the second close() too), and a closing coordinator closes every
connection it accepted.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
    FlightInterruptedError,
    GroupClosedError,
)

from ..dirproc import COORDINATOR_PROGRAM, Harness, MuteCoordinator
from ..ingroup import Background, arbiter, close, remote_leader
from ..ingroup import close as _close
from ..ingroup import closed_leader_holds as _closed_leader_holds
from ..ingroup import coordinating as _coordinating
from ..ingroup import group as _group
from ..ingroup import key_lock_free as _key_lock_free
from ..ingroup import key_watchers as _key_watchers
from ..ingroup import landed_leader_holds as _landed_leader_holds
from ..ingroup import lock_waiters as _lock_waiters
from ..support import scope_of, wait_until


def test_a_closed_groups_running_work_keeps_the_key_and_the_next_call_waits(
    directory: str,
) -> None:
    """A closed group's running work keeps its key: the next call elsewhere waits."""
    c = _coordinating(directory)
    b = _group(directory)
    _a, release, runs = _closed_leader_holds(directory)
    try:
        def work_b() -> str:
            runs.append("b")
            return "b"

        call = Background(lambda: b.run_sync("k", work_b))
        assert not call.done.wait(0.3)
        assert runs == ["a"]  # b waits for the key lock: never beside a's work
        release.set()
        result = call.wait()
        assert result.value == "b" and result.joined is False
        assert runs == ["a", "b"]
    finally:
        release.set()
        _close(b, c)


def test_calls_of_a_key_a_closed_groups_work_holds_wait_on_the_one_watcher(
    directory: str,
) -> None:
    """Calls of a key a closed group's work holds wait on the coordinator's one watcher.

    Each group that calls ``k`` while a closed group's work holds its lock, then closes, leaves
    no key-lock thread nor descriptor behind: its call waits at the coordinator, on the key's one
    watcher; the first call after the work ends leads."""
    c = _coordinating(directory)
    _a, release, runs = _closed_leader_holds(directory)
    try:
        async def work() -> str:
            runs.append("late")
            return "late"

        for _ in range(5):
            g = _group(directory)

            async def main(g: FlightGroup = g) -> None:
                async with g:
                    with pytest.raises(TimeoutError):  # a's work holds k all along
                        await g.run("k", work, timeout=0.2)

            asyncio.run(main())
        assert _lock_waiters(directory) == 0  # no lead waits in a key-lock thread
        assert len(_key_watchers(directory)) == 1  # the coordinator's, for k
        release.set()
        b = _group(directory)
        try:
            result = b.run_sync("k", lambda: "b")
            assert (result.value, result.joined) == ("b", False)
        finally:
            b.close()
        assert runs == ["a"]
    finally:
        release.set()
        _close(c)


def test_close_wakes_a_sync_leader_waiting_for_the_key_lock(directory: str) -> None:
    """close() wakes a sync leader waiting for its key lock with GroupClosedError."""
    c = _coordinating(directory)
    b = _group(directory)
    a, release, runs = _landed_leader_holds(directory)
    try:
        def work_b() -> str:
            runs.append("b")
            return "b"

        call = Background(lambda: b.run_sync("k", work_b))
        arbiter = scope_of(b)
        assert arbiter is not None
        wait_until(lambda: len(arbiter._state.leads) == 1, "b leads k and waits for its lock")
        closing = Background(b.close)
        closing.wait()
        ended = call.done.wait(3)
        release.set()
        call.done.wait(10)
        assert ended, "the caller hung after close()"
        assert isinstance(call.error, GroupClosedError)
        assert runs == ["a", "a2"]  # no work starts in a closed group
    finally:
        release.set()
        _close(b, a, c)


def test_a_lead_waiting_on_its_key_lock_at_close_never_leaks_the_lock(directory: str) -> None:
    """A lead waiting on its key lock when its group closes never leaks the lock."""
    c = _coordinating(directory)
    b = _group(directory)
    a, release, runs = _landed_leader_holds(directory)
    arbiter = scope_of(b)
    assert arbiter is not None
    try:
        async def work_b() -> str:
            runs.append("b")
            return "b"

        async def main() -> None:
            async with b:  # the usual shape: the group closes with the program's loop
                with pytest.raises(TimeoutError):
                    await b.run("k", work_b, timeout=0.5)
                assert len(arbiter._state.leads) == 1  # b leads k and waits for its lock

        asyncio.run(main())  # aclose(), then the loop's end cancels the driver task
        assert _lock_waiters(directory) == 1  # b's lead still waits in flock
        release.set()  # a's work ends: a frees the key lock, b's waiting flock takes it
        wait_until(lambda: _lock_waiters(directory) == 0, "b's key-lock thread got the lock")
        assert runs == ["a", "a2"]
        assert _key_lock_free(directory, "k"), "nobody runs k, yet its key lock stays held"
    finally:
        release.set()
        for lead in list(arbiter._state.leads.values()):
            lead.release()  # the leaked fd
        _close(a, c)


def test_joiner_elsewhere_is_interrupted_when_the_leaders_group_closes(directory: str) -> None:
    """A joiner in another group is interrupted when the leader's group closes."""
    c = _coordinating(directory)
    b = _group(directory)
    a, _, release, leader = remote_leader(directory)
    try:
        joined = threading.Event()
        call = Background(lambda: b.run_sync("k", lambda: "never", on_join=joined.set))
        assert joined.wait(10)
        Background(a.close).wait()
        with pytest.raises(FlightInterruptedError):
            call.wait()
        with pytest.raises(GroupClosedError):
            leader.wait()
    finally:
        release.set()
        _close(a, b, c)


@pytest.mark.timeout(60)
def test_a_second_close_returns_only_once_the_landings_were_handed_over(h: Harness) -> None:
    """A second close() returns only once the first handed its landings over.

    A second close() (another thread, a with-block's exit after an explicit close) waits while
    the first still hands over an unacknowledged landing."""
    a = h.spawn_warm("a")  # the coordinator, in a process of its own: it can be frozen
    assert h.coordinator_pid() == a.pid
    g = FlightGroup(directory=h.dir, codec=JSON, reconnect_timeout=15.0)
    first: Background | None = None
    try:
        running, release = threading.Event(), threading.Event()

        def work() -> str:
            running.set()
            release.wait(15)
            return "v"

        leader = Background(lambda: g.run_sync("k", work))
        assert running.wait(10)
        a.stop()  # the coordinator cannot acknowledge the landing
        release.set()
        lead = next(iter(arbiter(g)._state.leads.values()))
        wait_until(lambda: lead.landing is not None, "the landing was made")
        assert not lead.acked
        assert not leader.done.is_set()  # the leader returns once its landing is taken

        waiting = threading.Event()

        class Watched(threading.Event):
            def wait(self, timeout: float | None = None) -> bool:
                waiting.set()  # the second close() waits for the first one
                return super().wait(timeout)

        returned = Watched()
        arbiter(g)._close_returned = returned
        first = Background(g.close, name="first-close")
        wait_until(lambda: arbiter(g)._state.closing, "the first close began")

        def second_close() -> bool:
            g.close()
            return bool(lead.acked)  # what was handed over when it returned

        second = Background(second_close, name="second-close")
        assert waiting.wait(10)
        assert not second.done.is_set()  # it waits while the landing is not acknowledged
        a.cont()  # the coordinator acknowledges; the first close returns, then the second
        # docs/api.md: "close() returns once the landings already made have been handed over"
        assert second.wait(20) is True
        assert first.wait(20) is None
        # docs/api.md: a call still waiting when its group closes raises GroupClosedError
        with pytest.raises(GroupClosedError):
            leader.wait()
    finally:
        a.cont()
        if first is not None:
            first.wait(20)
        close(g)


@pytest.mark.timeout(60)
def test_a_group_closed_after_its_coordinator_died_still_interrupts_its_joiners(
    directory: str,
) -> None:
    """A group closed after its coordinator died still interrupts its joiners at once.

    The coordinator dies; the leader's group closes before it reconnected. Its joiner hears "its
    leader's group closed" from the next coordinator at once, not when the work ends, and close()
    does not wait reconnect_timeout for an ack that cannot come."""
    coordinator = subprocess.Popen([sys.executable, "-c", COORDINATOR_PROGRAM, directory],
                                   stdout=subprocess.PIPE)
    leader, joiner = (FlightGroup(directory=directory, codec=JSON) for _ in range(2))
    running, joined, release = threading.Event(), threading.Event(), threading.Event()
    heard: list[BaseException | object] = []

    def work() -> str:
        running.set()
        release.wait()
        return "late"

    def join() -> None:
        try:
            heard.append(joiner.run_sync("k", lambda: "joiner ran", on_join=joined.set,
                                         timeout=20))
        except BaseException as exc:
            heard.append(exc)

    led: list[BaseException | object] = []

    def run_leader() -> None:
        try:
            led.append(leader.run_sync("k", work))
        except BaseException as exc:
            led.append(exc)

    lead = threading.Thread(target=run_leader)
    follow = threading.Thread(target=join)
    try:
        assert coordinator.stdout is not None
        assert coordinator.stdout.readline() == b"coordinating\n"
        lead.start()
        assert running.wait(20)
        follow.start()
        assert joined.wait(20)
        coordinator.kill()
        coordinator.wait(20)
        leader.close()  # at once: its connection is gone or going
        follow.join(30)
        assert not follow.is_alive()
        (outcome,) = heard
        assert isinstance(outcome, FlightInterruptedError), outcome
        assert "its leader's group closed" in str(outcome)
    finally:
        release.set()
        lead.join(20)
        leader.close()
        joiner.close()
        # The leader's caller: its group closed under it (the work itself ends later).
        assert len(led) == 1 and isinstance(led[0], GroupClosedError), led
        if coordinator.poll() is None:
            coordinator.kill()
            coordinator.wait(20)


@pytest.mark.timeout(60)
def test_closing_a_coordinator_closes_every_connection_it_accepted(directory: str) -> None:
    """Closing a coordinator closes every connection it accepted, in handshake too.

    A connection still in its handshake when the coordinating group closes is closed with the
    others, never left for its transport to be collected unclosed."""
    import gc
    import socket
    import warnings

    group = FlightGroup(directory=directory, codec=JSON)
    group.run_sync("warm", lambda: 0)  # it coordinates
    silent = socket.socket(socket.AF_UNIX)
    try:
        silent.connect(os.path.join(directory, "flight.sock"))  # no hello
        gc.collect()  # what earlier tests of this worker left is not this group's
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            group.close()
            del group
            gc.collect()
        # This coordinator's: its transports, or sockets of its directory's flight.sock
        # (other tests' unclosed sockets, collected here too, name their own addresses).
        assert not [
            str(w.message) for w in caught
            if "unclosed" in str(w.message)
            and ("transport" in str(w.message) or directory in str(w.message))
        ]
        assert silent.recv(1) == b""  # the coordinator closed its end
    finally:
        silent.close()


@pytest.mark.timeout(60)
def test_closing_a_group_cancels_its_unanswered_runs(h: Harness, mute: MuteCoordinator) -> None:
    """Closing a group cancels its unanswered run requests at the coordinator.

    A group closed while a run request waits for its answer fails the call with GroupClosedError
    and cancels the request, so the coordinator never makes the dead call the leader of a flight
    nobody runs."""
    g = FlightGroup(directory=h.dir, codec=JSON)
    call = Background(lambda: g.run_sync("k", lambda: "never"))
    conn = mute.accept()
    run, _ = conn.expect("run")
    closing = Background(g.close)
    cancel, _ = conn.expect("cancel")
    assert cancel["id"] == run["id"]
    with pytest.raises(GroupClosedError):
        call.wait()
    closing.wait()
