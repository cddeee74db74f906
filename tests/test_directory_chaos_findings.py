"""Regressions from a chaos soak of the directory scope (2026-12-01: real processes,
SIGKILL and SIGSTOP of leaders, joiners and coordinators, group closes). Each test forces
the interleaving the soak found by hand.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
    GroupClosedError,
    LeaseLostError,
    Retry,
    current_lease,
)
from flightgroup.directory import wire

from .dirproc import Harness, MuteCoordinator, key_file, raw_conns, wait_for
from .ingroup import Background, arbiter, close, coordinating, hold_key_lock, lock_waiters

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def mute(h: Harness) -> Iterator[MuteCoordinator]:
    """A coordinator that answers only the handshake (the test holds the election)."""
    os.makedirs(h.dir, mode=0o700)
    h.take_election()
    made = MuteCoordinator(h.path("flight.sock"))
    try:
        yield made
    finally:
        made.close()


def test_closing_a_group_cancels_its_unanswered_runs(h: Harness, mute: MuteCoordinator) -> None:
    """A group closed while a run request waits for its answer fails the call with
    GroupClosedError, and must also cancel the request. Before, the coordinator (frozen
    meanwhile, in the soak) later made the dead call the leader of a flight nobody ran:
    callers of other processes joined it and were interrupted when the closed group's
    connection finally went, seconds later."""
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


def _frames_until(conn: Any, op: str, key: str) -> dict[str, Any]:
    """Read frames until an ``op`` of ``key`` (a reconnect resends every open call)."""
    while True:
        header, _ = conn.read_frame()
        if header["op"] == op and header.get("key") == key:
            return header


# A lead granted under OURS, while a newer flight of the key (NEWER) took its lock first.
OURS, NEWER = (1 << 32) | 5, (2 << 32) | 1


def _overtaken_key_lock(directory: str) -> int:
    """Hold the key lock of "k" with NEWER written in it, as the newer flight's leader
    wrote it; the caller closes the descriptor to free it."""
    holder = hold_key_lock(directory, "k")
    os.pwrite(holder, b"%-20d\n" % NEWER, 0)
    return holder


def _granted_lead(
    g: FlightGroup, mute: MuteCoordinator, work: Any
) -> tuple[Background, Any, dict[str, Any]]:
    """Call "k" on a thread and grant it the lead under OURS: the call, the
    coordinator's end of its connection and the run request."""
    call = Background(lambda: g.run_sync("k", work))
    conn = mute.accept()
    run = _frames_until(conn, "run", "k")
    conn.send(wire.lead_frame(run["id"], OURS))
    return call, conn, run


@pytest.mark.parametrize("written", ["before the coordinator went", "to its dead socket"])
def test_a_fresh_run_resent_after_a_failover_admits_only_flights_after_it(
    h: Harness, mute: MuteCoordinator, written: str
) -> None:
    """A fresh call whose request the gone coordinator's socket took was made before the
    next term began: resent, it admits every flight of that term (``after`` = the last
    token before it). One written to a socket that was already dead (the soak: a process
    frozen through the failover called the instant it thawed, before its loop saw the
    coordinator go) may be newer than that term's running flight: it is resent as a new
    fresh call. Before, it too admitted the term's flights, and joined one that began
    before the call."""
    g = FlightGroup(directory=h.dir, codec=JSON)
    calls = [Background(lambda: g.run_sync("w", lambda: "w"))]
    first = mute.accept()
    _frames_until(first, "run", "w")
    loop = g._scope._background.loop  # type: ignore[union-attr]
    entered, go_on = threading.Event(), threading.Event()
    if written == "to its dead socket":
        # The group's loop is held (as in a frozen process): it cannot see the close.
        loop.call_soon_threadsafe(lambda: (entered.set(), go_on.wait(20)))
        assert entered.wait(10)
        first.close()
    with open(h.path("flight.epoch"), "w") as f:
        f.write("2\n")  # the next term's
    calls.append(Background(lambda: g.run_sync("k", lambda: "k", fresh=True)))
    # The caller's thread opens the key's lock file right after writing its request.
    wait_for(lambda: os.path.exists(h.path("execution-locks", key_file("k"))), "the request")
    if written == "before the coordinator went":
        first.close()
    go_on.set()
    second = mute.accept()
    resent = _frames_until(second, "run", "k")
    assert resent.get("fresh") is True
    if written == "before the coordinator went":
        assert resent.get("after") == (2 << 32) - 1, resent
    else:
        assert resent.get("after") is None, resent
    g.close()
    for call in calls:
        with pytest.raises(GroupClosedError):
            call.wait()


@pytest.mark.parametrize("lock", ["free", "held, then freed"])
def test_a_lead_overtaken_by_a_newer_flight_of_the_key_runs_with_its_lease_lost(
    h: Harness, mute: MuteCoordinator, lock: str
) -> None:
    """A lead granted while the key's lock was still held (the last leader waiting for
    its landing's ack) waits for that lock. If a forget() detaches it meanwhile, or a
    failover lets a new call lead before it reasserts, a newer flight of the key can take
    the lock first and run. The lead must then not run its work as if it held the lease,
    under an older token after a newer one (the soak saw 1:7 run after 2:1, and new calls
    join it). Every leader writes its token into the key's file under the lock, so the
    lead sees the newer token when it gets the lock."""
    holder = _overtaken_key_lock(h.dir)
    if lock == "free":
        os.close(holder)
    seen: list[tuple[bool, int]] = []

    def work() -> str:
        lease = current_lease()
        seen.append((lease.lost, lease.token))
        return "stale"

    g = FlightGroup(directory=h.dir, codec=JSON)
    try:
        call, _, _ = _granted_lead(g, mute, work)
        if lock != "free":
            wait_for(
                lambda: lock_waiters(h.dir) == 1,
                "the lead waiting for the key lock",
            )
            os.close(holder)
        with pytest.raises(LeaseLostError):
            call.wait()
        assert seen == [(True, OURS)]
        with open(h.path("execution-locks", key_file("k")), "rb") as f:
            assert int(f.read()) == NEWER, "the newer token stays in the key's file"
    finally:
        g.close()


def test_a_new_call_beside_a_lead_whose_lease_is_lost_asks_the_coordinator(
    h: Harness, mute: MuteCoordinator
) -> None:
    """A lead whose lease is lost (here: a newer flight of the key held its key lock
    first) runs its work on for its callers, but it is no longer the key's flight in the
    scope: a new call of the key in its process asks the coordinator instead of joining
    it (the old code joined it, and got FlightInterruptedError when the work ended)."""
    holder = _overtaken_key_lock(h.dir)
    os.close(holder)
    started, release = threading.Event(), threading.Event()

    def work() -> str:
        assert current_lease().lost
        started.set()
        assert release.wait(30)
        return "stale"

    g = FlightGroup(directory=h.dir, codec=JSON)
    try:
        call, conn, run = _granted_lead(g, mute, work)
        assert started.wait(20)
        later = Background(lambda: g.run_sync("k", lambda: "new"))
        again = _frames_until(conn, "run", "k")
        assert again["id"] != run["id"]
        release.set()
        with pytest.raises(LeaseLostError):
            call.wait()
    finally:
        release.set()
        g.close()
    with pytest.raises(GroupClosedError):
        later.wait()


def test_a_reassert_of_a_flight_a_newer_one_of_its_key_overtook_is_refused(
    directory: str,
) -> None:
    """After a failover, a lead of the earlier term that still waited for the key lock
    reasserts; meanwhile a new call led the key in this term, ran and ended (its token is
    in the key's file, and not among the endings, which record reasserted flights only).
    The reassert is refused, so new calls never join a flight whose token is older than
    one that already ran (the soak: a call made then joined 1:7 after 2:1 ran)."""
    a = coordinating(directory)
    sock = os.path.join(directory, "flight.sock")
    epoch = arbiter(a)._coordinator.epoch  # type: ignore[union-attr]
    older, ran = (epoch - 1) << 32 | 7, epoch << 32 | 1
    try:
        with raw_conns(sock, 2) as (stale, other):
            # the flight that ran and ended in this term wrote its token under the lock
            fd = hold_key_lock(directory, "k")
            os.pwrite(fd, b"%-20d\n" % ran, 0)
            os.close(fd)
            stale.send(wire.reassert_frame(1, "k", older, notices=True))
            assert stale.expect("rejected")[0]["id"] == 1
            other.send(wire.run_frame(1, "k"))
            assert other.expect("lead")[0]["token"] > ran  # nobody joins the stale one
            # a reassert of a flight newer than what ran is taken back as before
            other.send(wire.reassert_frame(2, "j", ran + 1))
            other.served()
            assert [f["key"] for f in _status(other)].count("j") == 1
    finally:
        close(a)


def _status(conn: Any) -> list[dict[str, Any]]:
    conn.send_frame({"op": "status", "id": 77})
    return list(conn.expect("status")[0]["flights"])


@pytest.mark.parametrize("stall", ["longer than any attempt", "shorter than an attempt"])
def test_a_stall_of_this_process_is_not_an_outage(h: Harness, stall: str) -> None:
    """A process frozen while it waited for a coordinator's handshake (which then died,
    and another took over) must not count its own stall as time without a coordinator:
    it tries again and reaches the new one. Before, its first failed attempt after the
    thaw (against the dead coordinator's socket) gave up at once, and its calls raised
    UnavailableError although a coordinator served. The stall is the group's own thread
    held, past every attempt's longest time."""
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
        arbiter = g._scope
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
        # once before giving up: found by a second soak).
        stalled = threading.Event()
        long = stall == "longer than any attempt"
        assert not stalled.wait(wire.HANDSHAKE_TIMEOUT + 2.5 if long else 1.5)
        go_on.set()
        conn = mute.accept()
        run = _frames_until(conn, "run", "k")
        conn.send(wire.lead_frame(run["id"], 1 << 32 | 1))
        assert call.wait().value == "v"
        mute.close()
    finally:
        g.close()


def test_a_frozen_coordinator_fails_calls_after_about_reconnect_timeout(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coordinator that holds the election and never answers a handshake (frozen):
    the calls fail with UnavailableError once reconnect_timeout is spent. Each handshake
    waits only for what is left of it, so the attempts' waits add up to about
    reconnect_timeout, not to a multiple of the handshake's own 3 s."""
    from flightgroup import UnavailableError
    from flightgroup.directory import client, connection

    os.makedirs(h.dir, mode=0o700)
    h.take_election()
    frozen = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    frozen.bind(h.path("flight.sock"))
    frozen.listen(16)  # connections queue; nobody accepts or answers them
    waits: list[float] = []
    connect = client.DirectoryArbiter._connect

    async def spied(self: client.DirectoryArbiter, wait: float = wire.HANDSHAKE_TIMEOUT) -> Any:
        waits.append(wait)
        return await connect(self, wait)

    monkeypatch.setattr(client.DirectoryArbiter, "_connect", spied)
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


def test_a_retrys_token_is_written_to_the_keys_file(h: Harness, mute: MuteCoordinator) -> None:
    """Each attempt of a flight has its own, newer token. A forgotten flight that retries
    while the key's next flight waits for the lock it holds gets a token newer than that
    flight's; the next flight must see it when it takes the lock, so the retry writes its
    token into the key's file as the first attempt did (found by a chaos soak: the next
    flight then ran under an older token after the retry, its lease intact)."""
    first, second = (1 << 32) | 3, (1 << 32) | 9
    seen: list[int] = []

    def work() -> str:
        with open(h.path("execution-locks", key_file("k")), "rb") as f:
            seen.append(int(f.read()))
        if len(seen) == 1:
            raise ValueError("the first attempt fails")
        return "second"

    g = FlightGroup(
        directory=h.dir, codec=JSON, retry=Retry(attempts=2, backoff=0.0, jitter=False),
        reconnect_timeout=1.0,  # close() waits that long for the landing's ack
    )
    try:
        call = Background(lambda: g.run_sync("k", work))
        conn = mute.accept()
        run = _frames_until(conn, "run", "k")
        conn.send(wire.lead_frame(run["id"], first))
        header, _ = conn.read_frame()
        assert header["op"] == "attempt", header
        conn.send(wire.lead_frame(run["id"], second))
        assert call.wait().value == "second"
        assert seen == [first, second]
    finally:
        g.close()


def test_frames_to_a_peer_that_died_are_not_written_past_its_transport(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A peer that joined many flights dies while the coordinator is busy (or stopped);
    then the coordinator pushes the landings to it. The first write finds the socket
    broken: asyncio closes the transport and runs connection_lost a loop turn later.
    Writes made meanwhile would make asyncio log "socket.send() raised exception." from
    the fifth on: none is made past the transport's closing."""
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
