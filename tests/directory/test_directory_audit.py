"""The directory scope where an audit found bugs: a withdrawn call that waited (fresh,
or on a key lock) kept the key-lock file it had opened ahead, for as long as the
process lived."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from flightgroup import (
    JSON,
    FlightFailedError,
    FlightGroup,
    FlightInterruptedError,
    GroupClosedError,
    Result,
    ValueTooLargeError,
)

from ..ingroup import key_files_open
from ..support import wait_until


@pytest.mark.timeout(60)
def test_a_withdrawn_fresh_call_closes_the_key_file_it_opened(directory: str) -> None:
    leader, joiner = (FlightGroup(directory=directory, codec=JSON) for _ in range(2))
    started, release = threading.Event(), threading.Event()

    def work() -> int:
        started.set()
        release.wait()
        return 1

    thread = threading.Thread(target=leader.run_sync, args=("k", work))
    thread.start()
    try:
        assert started.wait(20)
        held = key_files_open(directory)  # the leader's key lock
        assert held == 1

        async def other() -> int:
            return 2

        for _ in range(5):
            async def abandon() -> None:
                task = asyncio.ensure_future(joiner.run("k", other, fresh=True))
                # The call opened the key's file ahead (it may lead after this flight):
                # the state that leaked. Its loop then ends, which withdraws it.
                await asyncio.to_thread(wait_until, lambda: key_files_open(directory) == held + 1,
                                        "the fresh call's file")
                assert not task.done()

            asyncio.run(abandon())
            # The withdrawal runs on the group's background loop: wait for its close.
            wait_until(lambda: key_files_open(directory) == held, "the file closed")
    finally:
        release.set()
        thread.join(20)
        leader.close()
        joiner.close()
    assert key_files_open(directory) == 0


def test_a_value_bound_that_no_frame_can_carry_is_refused(directory: str) -> None:
    with pytest.raises(ValueError, match="max_value_bytes"):
        FlightGroup(directory=directory, codec=JSON, max_value_bytes=1 << 20,
                    max_frame_bytes=1 << 20)
    FlightGroup(directory=directory, codec=JSON, max_value_bytes=(1 << 20) - (64 << 10),
                max_frame_bytes=1 << 20).close()


@pytest.mark.timeout(60)
def test_a_smaller_frame_makes_the_default_value_bound_fit(directory: str) -> None:
    # A value as big as the frame once made every coordinator drop the leader's
    # connection at each landing, sent again on each reconnect, for ever.
    group = FlightGroup(directory=directory, codec=JSON, max_frame_bytes=1 << 20)
    try:
        with pytest.raises(ValueTooLargeError):
            group.run_sync("big", lambda: "x" * (1 << 20))
        assert group.run_sync("big", lambda: "small").value == "small"  # the key is free
    finally:
        group.close()


@pytest.mark.timeout(60)
def test_a_failure_message_crosses_processes_whole(directory: str) -> None:
    # API.md: FlightFailedError's .message is the error's str(); it was cut at 8,192.
    leader, joiner = (FlightGroup(directory=directory, codec=JSON) for _ in range(2))
    running, joined = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        running.set()  # the coordinator made this group lead: a call now joins
        assert joined.wait(20)
        raise ValueError("é" * 100_000)

    def lead() -> None:
        with pytest.raises(ValueError):
            leader.run_sync("k", work)

    try:
        lead_thread = threading.Thread(target=lead)
        lead_thread.start()
        assert running.wait(20)
        try:
            joiner.run_sync("k", lambda: None, on_join=joined.set)
        except FlightFailedError as exc:
            errors.append(exc)
        lead_thread.join(30)
    finally:
        leader.close()
        joiner.close()
    (error,) = errors
    assert isinstance(error, FlightFailedError)
    assert error.error_type == "ValueError"
    assert error.message == "é" * 100_000


FORKING_LEADER = r"""
import os, sys, threading, warnings
from flightgroup import JSON, FlightGroup
warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads: on purpose
group = FlightGroup(directory=sys.argv[1], codec=JSON)
group.run_sync("warm", lambda: 0)  # this process coordinates
running = threading.Event()
def work():
    running.set()
    threading.Event().wait()  # leads "k" (its key lock held) until killed
threading.Thread(target=group.run_sync, args=("k", work), daemon=True).start()
running.wait()
child = os.fork()
if child == 0:  # holds copies of every descriptor the parent had, until killed
    os.read(0, 1)
    os._exit(0)
print(child, flush=True)
threading.Event().wait()
"""


@pytest.mark.timeout(60)
def test_a_forked_child_holds_no_lock_or_connection_of_its_parent(directory: str) -> None:
    """A coordinator that leads a flight forks a child, then is killed: while the child
    lives, the joiner is interrupted at once, a new coordinator is elected and a new call
    of the key leads (the child's copies of the election lock, the key lock and the
    sockets were pointed at /dev/null when it was forked)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", FORKING_LEADER, directory],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    child = 0
    group = FlightGroup(directory=directory, codec=JSON, reconnect_timeout=60)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        joined = threading.Event()
        outcome: list[BaseException | object] = []

        def join() -> None:
            try:
                outcome.append(group.run_sync("k", lambda: "joiner ran", on_join=joined.set))
            except BaseException as exc:
                outcome.append(exc)

        joiner = threading.Thread(target=join)
        joiner.start()
        assert joined.wait(20)
        parent.kill()
        parent.wait(20)
        joiner.join(40)  # with the child's copy of the connection, it waited for the child
        assert len(outcome) == 1 and isinstance(outcome[0], FlightInterruptedError), outcome
        result = group.run_sync("k", lambda: "led here")
        assert (result.value, result.joined) == ("led here", False)
        assert result.token >> 32 == 2  # a new term: this process won the election
        os.kill(child, 0)  # the child still lives (and holds nothing of the group)
    finally:
        group.close()
        if parent.poll() is None:
            parent.kill()
            parent.wait(20)
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


@pytest.mark.timeout(60)
def test_a_landing_over_the_coordinators_frame_is_not_sent_for_ever(
    directory: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A group with a smaller max_frame_bytes coordinates: a leader's landing over its
    limit once had the leader's connection dropped and the landing sent again on every
    reconnect, its key held for ever. The coordinator now says the limit as it closes;
    the leader lands 'interrupted' instead, and the key is free for the next call."""
    coordinator = FlightGroup(directory=directory, codec=JSON, max_frame_bytes=1 << 20)
    leader, joiner = (FlightGroup(directory=directory, codec=JSON) for _ in range(2))
    running, joined = threading.Event(), threading.Event()
    big = "x" * (2 << 20)

    def work() -> str:
        running.set()
        assert joined.wait(20)
        return big

    results: list[object] = []
    try:
        coordinator.run_sync("warm", lambda: 0)  # it coordinates: frames up to 1 MiB
        thread = threading.Thread(target=lambda: results.append(leader.run_sync("k", work)))
        thread.start()
        assert running.wait(20)
        with pytest.raises(FlightInterruptedError):
            joiner.run_sync("k", lambda: "joiner ran", on_join=joined.set)
        thread.join(20)
        # The leader has its own value. It reconnects, reasserts the flight and lands it
        # "interrupted"; once that landing is acknowledged (the lead gone, its key lock
        # freed), the key is free for a new flight. (A call before then would wait for
        # the key lock and join the reasserted flight, as it must.)
        (result,) = results
        assert isinstance(result, Result) and result.value == big and not result.joined
        leads = leader._arbiter._leads  # type: ignore[union-attr]
        wait_until(lambda: not leads, "the leader's landing acknowledged")
        after = joiner.run_sync("k", lambda: "next")
        assert (after.value, after.joined) == ("next", False)
    finally:
        for group in (leader, joiner, coordinator):
            group.close()
    said = [r for r in caplog.records if "over the coordinator's max_frame_bytes" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING]


@pytest.mark.timeout(60)
def test_groups_and_threads_of_one_process_take_part_in_one_election(directory: str) -> None:
    """Two groups of this thread and one made in another thread, on one directory:
    one of them coordinates (one term, epoch 1); closing it hands over to exactly one
    other (epoch 2), never to two at once."""
    from flightgroup.directory import fs

    groups = [FlightGroup(directory=directory, codec=JSON) for _ in range(2)]
    made: list[FlightGroup] = []
    thread = threading.Thread(target=lambda: made.append(FlightGroup(directory=directory,
                                                                     codec=JSON)))
    thread.start()
    thread.join(20)
    groups += made

    def coordinating() -> list[FlightGroup]:
        return [g for g in groups if g._arbiter._coordinator is not None]  # type: ignore[union-attr]

    try:
        for i, group in enumerate(groups):  # every group connected (its election waits)
            assert group.run_sync(f"k{i}", lambda i=i: i).value == i
        assert fs.read_epoch(directory) == 1
        (first,) = coordinating()
        first.close()
        groups.remove(first)
        # The next call is served by the next term: one of the others coordinates.
        assert groups[0].run_sync("after", lambda: "ok").value == "ok"
        wait_until(lambda: len(coordinating()) == 1, "one new coordinator")
        assert fs.read_epoch(directory) == 2
        assert len(coordinating()) == 1
    finally:
        for group in groups:
            group.close()


COORDINATOR = r"""
import sys, threading
from flightgroup import JSON, FlightGroup
group = FlightGroup(directory=sys.argv[1], codec=JSON)
group.run_sync("warm", lambda: 0)
print("coordinating", flush=True)
threading.Event().wait()
"""


@pytest.mark.timeout(60)
def test_a_group_closed_after_its_coordinator_died_still_interrupts_its_joiners(
    directory: str,
) -> None:
    """The coordinator dies; the leader's group closes before it reconnected. Its joiner
    must hear "its leader's group closed" from the next coordinator at once, not when
    the work ends (the closing group skipped the lead it had cut off when it reconnected,
    and close() waited reconnect_timeout for an ack that could not come)."""
    coordinator = subprocess.Popen([sys.executable, "-c", COORDINATOR, directory],
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
def test_a_failure_over_a_small_frame_is_cut_and_spares_the_other_flights(
    directory: str,
) -> None:
    """With a small max_frame_bytes, a failure's message made a landing the coordinator
    refused: it closed the leader's connection, which interrupted every flight led on it.
    The message is cut to fit; the other flight lands for its joiner."""
    leader = FlightGroup(directory=directory, codec=JSON, max_frame_bytes=4096)
    joiner = FlightGroup(directory=directory, codec=JSON)
    running = {k: threading.Event() for k in ("k1", "k2")}
    joined = {k: threading.Event() for k in ("k1", "k2")}
    led: dict[str, object] = {}
    got: dict[str, object] = {}

    def work(key: str) -> str:
        running[key].set()
        assert joined[key].wait(20)
        if key == "k2":
            raise RuntimeError("x" * 5000)
        return f"{key} value"

    def call(group: FlightGroup, key: str, into: dict[str, object], **kw: object) -> None:
        try:
            into[key] = group.run_sync(key, lambda: work(key), **kw).value  # type: ignore[arg-type]
        except BaseException as exc:
            into[key] = exc

    threads = []
    try:
        for key in ("k1", "k2"):
            threads.append(threading.Thread(target=call, args=(leader, key, led)))
            threads[-1].start()
            assert running[key].wait(20)
            threads.append(threading.Thread(target=call, args=(joiner, key, got),
                                            kwargs={"on_join": joined[key].set}))
            threads[-1].start()
        for thread in threads:
            thread.join(30)
    finally:
        leader.close()
        joiner.close()
    assert led["k1"] == got["k1"] == "k1 value"
    assert isinstance(led["k2"], RuntimeError)
    failed = got["k2"]
    assert isinstance(failed, FlightFailedError) and failed.error_type == "RuntimeError"
    assert failed.message.endswith("... (cut)") and failed.message.startswith("x" * 100)


def test_a_key_too_long_for_a_frame_is_refused_at_the_call(directory: str) -> None:
    from flightgroup.directory import wire

    group = FlightGroup(directory=directory, codec=JSON, max_frame_bytes=1024)
    # A key whose plain run fits, but not every request the call may have to send
    # (a fresh run, a rejoin, a reassert after a failover: longer ids and tokens).
    near = "k" * 990
    assert len(wire.run_frame(1, near)) - 4 < 1024 < len(wire.reassert_frame(2**62, near, 2**62))
    try:
        for key in ("k" * 1100, near):
            with pytest.raises(ValueError, match="max_frame_bytes"):
                group.run_sync(key, lambda: 1)
        assert group.run_sync("k", lambda: 2).value == 2
    finally:
        group.close()


@pytest.mark.timeout(60)
def test_forget_of_a_key_too_long_for_a_frame_is_refused_and_changes_nothing(
    directory: str,
) -> None:
    """forget() sent such a key anyway: the coordinator dropped the connection on each
    try, so a joiner elsewhere of a flight this group led was interrupted, and forget
    raised UnavailableError after its timeout."""
    coordinator = FlightGroup(directory=directory, codec=JSON)
    small = FlightGroup(directory=directory, codec=JSON, max_frame_bytes=1 << 20)
    running, joined, release = threading.Event(), threading.Event(), threading.Event()
    results: list[object] = []

    def work() -> str:
        running.set()
        assert release.wait(20)
        return "led"

    try:
        coordinator.run_sync("warm", lambda: 0)
        leading = threading.Thread(target=lambda: results.append(small.run_sync("k", work)))
        leading.start()
        assert running.wait(20)
        joining = threading.Thread(target=lambda: results.append(
            coordinator.run_sync("k", lambda: "joiner ran", on_join=joined.set)))
        joining.start()
        assert joined.wait(20)
        channel = small._arbiter._channel  # type: ignore[union-attr]
        for forget in (small.forget, small.coalesce(key=lambda k: k, name="op")(str).forget):
            with pytest.raises(ValueError, match="max_frame_bytes"):
                forget("k" * (2 << 20))
        assert small._arbiter._channel is channel  # type: ignore[union-attr]
        release.set()
        leading.join(20)
        joining.join(20)
        assert sorted((r.value, r.joined) for r in results) == [  # type: ignore[attr-defined]
            ("led", False), ("led", True)]
    finally:
        release.set()
        small.close()
        coordinator.close()


FORK_KEEPS_USER_FILES = r"""
import os, sys, warnings
from flightgroup import JSON, FlightGroup
warnings.simplefilter("ignore", DeprecationWarning)
directory, link = sys.argv[1], sys.argv[2]
os.makedirs(directory, exist_ok=True)
log = open(os.path.join(directory, "app.log"), "a", buffering=1)
group = FlightGroup(directory=link, codec=JSON)  # by another path: a symlink
group.run_sync("warm", lambda: 0)
child = os.fork()
if child == 0:
    log.write("child\n")  # the user's own file stays the user's
    import socket
    held = 0
    for n in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{n}")
        except OSError:  # the listing's own descriptor
            continue
        if target.endswith("flight.lock"):
            held += 1
        elif target.startswith("socket:"):
            sock = socket.socket(fileno=int(n))
            try:
                for name in (sock.getsockname, sock.getpeername):
                    try:
                        held += str(name()).endswith("flight.sock")
                    except OSError:
                        pass
            finally:
                sock.detach()
    print(held, flush=True)  # the group's sockets and election lock it kept
    os._exit(0)
os.waitpid(child, 0)
log.write("parent\n")
group.close()
"""


@pytest.mark.timeout(60)
def test_a_forked_child_keeps_the_users_files_and_drops_sockets_named_by_a_link(
    directory: str, tmp_path: Path
) -> None:
    link = str(tmp_path / "link")
    os.makedirs(directory)
    os.symlink(directory, link)
    proc = subprocess.run([sys.executable, "-c", FORK_KEEPS_USER_FILES, directory, link],
                          capture_output=True, text=True, timeout=50, check=False)
    assert proc.returncode == 0, proc.stderr
    # The child kept no socket of the group (it coordinated: listening and accepted
    # sockets, and its own connection, named through the link) and no election lock.
    assert proc.stdout.split() == ["0"], proc.stdout
    with open(os.path.join(directory, "app.log")) as f:
        assert f.read().split() == ["child", "parent"]


@pytest.mark.timeout(60)
def test_a_call_made_while_the_leases_are_lost_is_not_failed_with_them(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No coordinator for reconnect_timeout: the leases are lost and the calls that
    waited through the outage fail. A call made while that happens (here: at the very
    moment the lease is lost) is not one of them; it is served once a coordinator is."""
    import fcntl

    from flightgroup import LeaseLostError, current_lease
    from flightgroup.directory.client import DirectoryArbiter
    from flightgroup.wide import Event

    allow = threading.Event()  # this process campaigns only once allowed
    campaign, lose = DirectoryArbiter._campaign, DirectoryArbiter._lose
    made: list[Any] = []

    def held(self: DirectoryArbiter) -> None:
        allow.wait()
        campaign(self)

    def lose_then_call(self: DirectoryArbiter, lead: Any, reason: str) -> None:
        lose(self, lead, reason)
        if not made:
            made.append(self.submit("after", False))

    monkeypatch.setattr(DirectoryArbiter, "_campaign", held)
    monkeypatch.setattr(DirectoryArbiter, "_lose", lose_then_call)
    coordinator = subprocess.Popen([sys.executable, "-c", COORDINATOR, directory],
                                   stdout=subprocess.PIPE)
    group = FlightGroup(directory=directory, codec=JSON, reconnect_timeout=0.5)
    arbiter = group._arbiter
    assert isinstance(arbiter, DirectoryArbiter)
    running = threading.Event()
    errors: list[BaseException] = []

    def work() -> int:
        running.set()
        asyncio.run(current_lease().wait_lost())
        return 1

    def lead() -> None:
        try:
            group.run_sync("k", work)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=lead)
    fd = -1
    try:
        assert coordinator.stdout is not None
        assert coordinator.stdout.readline() == b"coordinating\n"
        thread.start()
        assert running.wait(20)
        coordinator.kill()
        coordinator.wait(20)
        fd = os.open(os.path.join(directory, "flight.lock"), os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)  # nobody serves: the lease is lost
        thread.join(20)
        assert len(errors) == 1 and isinstance(errors[0], LeaseLostError), errors
        wait_until(lambda: bool(made), "the call made as the lease was lost")
        (call,) = made
        assert arbiter._calls.get(call.id) is call  # still waiting, not failed
        os.close(fd)
        fd = -1
        allow.set()  # this process coordinates: the call is served
        event, _ = call.inbox.get_sync()
        assert event is Event.LEAD
        arbiter.withdraw(call)
    finally:
        if fd >= 0:
            os.close(fd)
        allow.set()
        thread.join(20)
        group.close()
        if coordinator.poll() is None:
            coordinator.kill()
            coordinator.wait(20)


@pytest.mark.timeout(60)
def test_closing_a_coordinator_closes_every_connection_it_accepted(directory: str) -> None:
    """A connection still in its handshake when the coordinating group closed was left
    open, its transport collected unclosed later (in Python 3.13 its __del__ then
    raised inside asyncio, failing whatever test was running)."""
    import gc
    import socket
    import warnings

    group = FlightGroup(directory=directory, codec=JSON)
    group.run_sync("warm", lambda: 0)  # it coordinates
    silent = socket.socket(socket.AF_UNIX)
    try:
        silent.connect(os.path.join(directory, "flight.sock"))  # no hello
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            group.close()
            del group
            gc.collect()
        assert not [w for w in caught if "unclosed" in str(w.message)], caught
        assert silent.recv(1) == b""  # the coordinator closed its end
    finally:
        silent.close()
