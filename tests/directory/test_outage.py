"""A directory group without a coordinator: calls fail with UnavailableError once
reconnect_timeout is spent without one (a frozen coordinator's handshakes count towards
it), and only the calls that waited through the outage; a stall of the process itself is
not an outage.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
    UnavailableError,
)
from flightgroup.directory import wire

from ..dirproc import (
    COORDINATOR_PROGRAM,
    Harness,
    MuteCoordinator,
    acknowledge_landing,
    frames_until,
    wait_for,
)
from ..ingroup import Background
from ..support import scope_of, wait_until


@pytest.mark.timeout(60)
def test_a_call_made_while_the_leases_are_lost_is_refused_at_once(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call made while the leases are lost is refused at once, and calls are served again
    once a coordinator is.

    No coordinator for reconnect_timeout: the leases are lost and the calls that
    waited through the outage fail. A call made while that happens (here: at the very
    moment the lease is lost) raises UnavailableError at once: it neither waits nor is
    left registered; the next call once a coordinator serves leads."""
    import fcntl

    from flightgroup import LeaseLostError, UnavailableError, current_lease
    from flightgroup.directory.client import DirectoryArbiter
    from flightgroup.directory.election import Election
    from flightgroup.directory.leases import Leases
    from flightgroup.scope.events import Lead

    allow = threading.Event()  # this process campaigns only once allowed
    campaign, lose = Election.campaign, Leases.lose
    made: list[Any] = []

    def held(self: Election) -> None:
        allow.wait()
        campaign(self)

    def lose_then_call(self: Leases, lead: Any, reason: str, **how: Any) -> None:
        lose(self, lead, reason, **how)
        if not made:
            try:
                made.append(arbiter.submit("after", fresh=False))
            except UnavailableError as exc:
                made.append(exc)

    monkeypatch.setattr(Election, "campaign", held)
    monkeypatch.setattr(Leases, "lose", lose_then_call)
    coordinator = subprocess.Popen([sys.executable, "-c", COORDINATOR_PROGRAM, directory],
                                   stdout=subprocess.PIPE)
    group = FlightGroup(directory=directory, codec=JSON, reconnect_timeout=0.5)
    arbiter = scope_of(group)
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
        (refused,) = made
        assert isinstance(refused, UnavailableError), refused
        assert "has answered for" in str(refused) and not arbiter._state.calls
        os.close(fd)
        fd = -1
        allow.set()  # this process coordinates: calls are served
        while True:
            try:
                call = arbiter.submit("after", fresh=False)
                break
            except UnavailableError:  # until this process's own coordinator serves it
                time.sleep(0.01)
        assert isinstance(call.inbox.get_sync(), Lead)
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
@pytest.mark.parametrize("stall", ["longer than any attempt", "shorter than an attempt"])
def test_a_stall_of_this_process_is_not_an_outage(h: Harness, stall: str) -> None:
    """A stall of this process is not counted as time without a coordinator.

    A process frozen while it waited for a coordinator's handshake (which then died, and another
    took over) does not count its own stall as time without a coordinator: it tries again and
    reaches the new one, and its calls are served. The stall is the group's own thread held, past
    every attempt's longest time."""
    os.makedirs(h.dir, mode=0o700)
    h.take_election()
    path = h.path("flight.sock")
    frozen = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    frozen.bind(path)
    frozen.listen(4)
    g = FlightGroup(directory=h.dir, codec=JSON, reconnect_timeout=1.0)
    try:
        call = Background(lambda: g.run_sync("k", lambda: "v"))
        # The group connected and said hello; a frozen coordinator never answers.
        ready, _, _ = select.select([frozen], [], [], 10)
        assert ready
        waiting, _ = frozen.accept()
        arbiter = scope_of(g)
        wait_for(lambda: arbiter._background.loop is not None, "the group's loop")  # type: ignore[union-attr]
        loop = arbiter._background.loop  # type: ignore[union-attr]
        entered, go_on = threading.Event(), threading.Event()
        loop.call_soon_threadsafe(lambda: (entered.set(), go_on.wait(30)))
        assert entered.wait(10)
        # The old coordinator dies; the next one serves at once.
        waiting.close()
        frozen.close()
        mute = MuteCoordinator(path)
        # Past reconnect_timeout either way; a long stall outlasts the longest attempt
        # (it counts for nothing), a short one does not (one more attempt is made at
        # once before giving up).
        stalled = threading.Event()
        long = stall == "longer than any attempt"
        assert not stalled.wait(wire.HANDSHAKE_TIMEOUT + 2.5 if long else 1.5)
        go_on.set()
        conn = mute.accept()
        run = frames_until(conn, "run", "k")
        conn.send(wire.lead_frame(run["id"], 1 << 32 | 1))
        acknowledge_landing(conn, run["id"])
        assert call.wait().value == "v"
        mute.close()
    finally:
        g.close()


@pytest.mark.timeout(60)
def test_a_frozen_coordinator_fails_calls_after_about_reconnect_timeout(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen coordinator fails calls after about reconnect_timeout, not more.

    A coordinator that holds the election and never answers a handshake (frozen): the calls fail
    with UnavailableError once reconnect_timeout is spent. Each handshake waits only for what is
    left of it, so the attempts' waits add up to about reconnect_timeout."""
    from flightgroup import UnavailableError
    from flightgroup.directory import connection
    from flightgroup.directory.connection import Connection

    os.makedirs(h.dir, mode=0o700)
    h.take_election()
    frozen = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    frozen.bind(h.path("flight.sock"))
    frozen.listen(16)  # connections queue; nobody accepts or answers them
    waits: list[float] = []
    connect = Connection.connect

    async def spied(self: Connection, wait: float = wire.HANDSHAKE_TIMEOUT) -> Any:
        waits.append(wait)
        return await connect(self, wait)

    monkeypatch.setattr(Connection, "connect", spied)
    g = FlightGroup(directory=h.dir, codec=JSON, reconnect_timeout=1.0)
    try:
        with pytest.raises(UnavailableError, match=r"reconnect_timeout=1\)") as info:
            g.run_sync("k", lambda: "v")
        assert info.value.key == "k"
        # Not served: no flight, no join, no interruption (docs/observability.md).
        stats = g.stats()
        assert (stats.calls, stats.flights, stats.joins, stats.interrupted) == (1, 0, 0, 0)
        assert stats.in_flight == 0 and stats.flight_seconds_p99 == 0.0, stats
    finally:
        g.close()
        frozen.close()
    assert len(waits) >= 2, waits
    # The attempts before the last fit in the budget (one of them may be a short one
    # begun as it ran out); the last waits at most _LAST_WAIT.
    assert sum(waits[:-1]) <= 1.0 + connection._LAST_WAIT, waits
    assert waits[-1] <= connection._LAST_WAIT, waits


@pytest.mark.timeout(60)
def test_calls_fail_fast_once_no_coordinator_answered_and_go_through_when_one_does(
    h: Harness,
) -> None:
    """Calls fail fast once no coordinator answered for reconnect_timeout, and go through
    again when one does.

    The coordinator is frozen (it holds the election, its socket takes connections and
    never answers): the call that waits through reconnect_timeout raises UnavailableError;
    every later call, of that key or any other, raises it at once instead of waiting
    reconnect_timeout again (200 such waits would be 60 s). The group keeps trying to
    connect: once the frozen one is gone, this process is elected and the calls lead."""
    from flightgroup import UnavailableError

    os.makedirs(h.dir, mode=0o700)
    election = h.take_election()
    frozen = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    frozen.bind(h.path("flight.sock"))
    frozen.listen(16)  # connections queue; nobody accepts or answers them
    g = FlightGroup(directory=h.dir, codec=JSON, reconnect_timeout=0.3)
    try:
        with pytest.raises(UnavailableError, match=r"reconnect_timeout=0.3\)"):
            g.run_sync("k", lambda: "never")
        for key in ["k"] * 200 + [f"d{i}" for i in range(200)]:
            with pytest.raises(UnavailableError, match="has answered for") as refused:
                g.run_sync(key, lambda: "never")
            assert refused.value.key == key
        assert g.stats().flights == 0
        frozen.close()
        os.unlink(h.path("flight.sock"))
        h.give_back_election(election)
        while True:  # refused at once until this process is elected and connected
            try:
                got = g.run_sync("k", lambda: "led")
                break
            except UnavailableError as exc:
                if "has answered for" not in str(exc):
                    raise
                time.sleep(0.01)
        assert (got.value, got.joined) == ("led", False)
    finally:
        g.close()
        frozen.close()


@pytest.mark.timeout(60)
def test_a_lease_lost_after_a_gone_coordinator_took_the_landing_is_unconfirmed(
    h: Harness, mute: MuteCoordinator
) -> None:
    """A leader whose landing a coordinator read, unacknowledged, before it went, and no
    other could be reached, raises UnavailableError: its joiners may have the value."""
    g = FlightGroup(directory=h.dir, codec=JSON, reconnect_timeout=1.0)
    try:
        call = Background(lambda: g.run_sync("k", lambda: "v"))
        conn = mute.accept()
        run = frames_until(conn, "run", "k")
        conn.send(wire.lead_frame(run["id"], 1 << 32 | 1))
        while conn.read_frame()[0]["op"] != "land":  # the coordinator read the landing
            pass
        assert not call.done.is_set()  # no ack: the leader waits
        mute.close()  # it goes; none serves after it (the test holds the election)
        with pytest.raises(UnavailableError) as raised:
            call.wait()
        assert "may have its outcome" in str(raised.value)
    finally:
        g.close()
