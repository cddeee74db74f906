"""Key locks in the directory scope: a leader holds its key's kernel lock while its work
runs (past its deadline, past its group's close); a lead waiting for the lock is given
back when it cannot wait; a withdrawn call closes the key file it opened; every attempt
writes its token into the key's file, so a lead that a newer flight of its key overtook
runs with its lease lost, and a new call beside it asks the coordinator.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import types
from typing import Any

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
    FlightTimeoutError,
    GroupClosedError,
    LeaseLostError,
    Retry,
    current_lease,
)
from flightgroup.directory import fs, keylocks, wire

from ..dirproc import (
    Harness,
    MuteCoordinator,
    acknowledge_landing,
    frames_until,
    key_file,
    wait_for,
)
from ..ingroup import (
    Background,
    arbiter,
    close,
    coordinating,
    group,
    hold_key_lock,
    key_files_open,
    lock_waiters,
    run_of_k_after,
)
from ..ingroup import close as _close
from ..ingroup import coordinating as _coordinating
from ..ingroup import group as _group
from ..ingroup import key_lock_free as _key_lock_free
from ..support import wait_until


def test_a_sync_work_past_its_deadline_keeps_the_key_lock_until_it_ends(directory: str) -> None:
    """A sync work past its deadline keeps its key lock until it ends."""
    c = _coordinating(directory)
    a = _group(directory, deadline=0.2)
    b = _group(directory)
    try:
        running, release = threading.Event(), threading.Event()
        active: list[str] = []
        overlaps: list[list[str]] = []

        def slow() -> str:
            active.append("a")
            running.set()
            release.wait(20)
            active.remove("a")
            return "a"

        def other() -> str:
            overlaps.append(list(active))
            return "b"

        with pytest.raises(FlightTimeoutError):
            a.run_sync("k", slow)
        assert active == ["a"]  # the sync work could not be stopped: it runs on
        lock_held = not _key_lock_free(directory, "k")
        call = Background(lambda: b.run_sync("k", other))
        started_beside = call.done.wait(1.0)
        release.set()
        call.wait()
        assert lock_held, "the key lock was freed while the work still runs"
        assert not started_beside and overlaps == [[]], "k ran twice at once"
    finally:
        release.set()
        _close(a, b, c)


class _OsProxy(types.ModuleType):
    def __init__(self, opened: threading.Event) -> None:
        super().__init__("os_proxy")
        self._opened = opened

    def __getattr__(self, name):
        return getattr(os, name)

    def open(self, path, *args, **kwargs):
        fd = os.open(path, *args, **kwargs)
        if threading.current_thread().name == "b-caller" and path.endswith(HEX):
            self._opened.set()
        return fd


HEX = os.path.basename(fs.key_lock_path("/", "k"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["caller", "loop"])
def test_a_lead_whose_lock_wait_thread_cannot_start_is_given_back(
    directory, monkeypatch, where
):
    """A lead whose key-lock wait thread cannot start is given back.

    When the key lock is busy, the lead is published and a thread waits for the lock.
    If that thread cannot start (RuntimeError: can't start new thread), the lead was never
    given back: the coordinator kept a flight nobody runs, which every later call of the
    key joined; the caller got RuntimeError ("caller") or waited for ever ("loop")."""
    a = coordinating(directory)
    b = group(directory)
    c = group(directory)
    holder = -1
    go = threading.Event()
    try:
        b.run_sync("warm-b", lambda: 0)
        c.run_sync("warm-c", lambda: 0)
        barb = arbiter(b)
        coordinator = arbiter(a)._state.coordinator

        # The previous flight of k landed and its leader holds the key lock until its ack:
        # the coordinator lets the next call lead at once (the leader waits for the lock).
        holder = hold_key_lock(directory, "k")
        coordinator._term.releasing["k"] = 1

        # No thread can be started for the key-lock wait (EAGAIN from clone).
        real_thread = threading.Thread

        def no_keylock_thread(*args, **kwargs):
            if kwargs.get("name") == "flightgroup-keylock":
                raise RuntimeError("can't start new thread")
            return real_thread(*args, **kwargs)

        fake_threading = types.SimpleNamespace(
            Thread=no_keylock_thread, Lock=threading.Lock, Event=threading.Event,
            current_thread=threading.current_thread,
        )
        monkeypatch.setattr(keylocks, "threading", fake_threading)

        opened = threading.Event()
        if where == "caller":
            # the lead is told while b's caller opens the key's file (pending)
            real_path = fs.key_lock_path
            in_open = threading.Event()

            def slow_path(d, key):
                if key == "k" and threading.current_thread().name == "b-caller":
                    in_open.set()
                    wait_until(lambda: any(
                        call.pending is not None for call in list(barb._state.calls.values())
                    ), "the lead was told while b opens the key file")
                return real_path(d, key)

            monkeypatch.setattr(fs, "key_lock_path", slow_path)
            run_of_k_after(in_open, coordinator, monkeypatch)
        else:
            # the lead is told after b's caller opened the file: taken on b's loop
            monkeypatch.setattr(keylocks, "os", _OsProxy(opened))
            run_of_k_after(opened, coordinator, monkeypatch)

        b_call = Background(lambda: b.run_sync("k", lambda: "b"), name="b-caller")
        assert b_call.done.wait(10), "b's call never ended (its driver was never told)"
        fcntl.flock(holder, fcntl.LOCK_UN)  # the lock is free again
        coordinator._term.releasing.pop("k", None)

        # A later call of the key elsewhere must not wait for a flight nobody runs.
        result = c.run_sync("k", lambda: "c", timeout=5)
        assert result.value == "c"
    finally:
        go.set()
        if holder >= 0:
            os.close(holder)
        monkeypatch.undo()
        close(a, b, c)


@pytest.mark.timeout(60)
def test_a_withdrawn_fresh_call_closes_the_key_file_it_opened(directory: str) -> None:
    """A withdrawn fresh call closes the key file it opened ahead."""
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
    run = frames_until(conn, "run", "k")
    conn.send(wire.lead_frame(run["id"], OURS))
    return call, conn, run


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lock", ["free", "held, then freed"])
def test_a_lead_overtaken_by_a_newer_flight_of_the_key_runs_with_its_lease_lost(
    h: Harness, mute: MuteCoordinator, lock: str
) -> None:
    """A lead overtaken by a newer flight of its key runs with its lease lost.

    A lead granted while the key's lock is still held (the last leader waiting for its landing's
    ack) waits for that lock. If a forget() detaches it meanwhile, or a failover lets a new call
    lead before it reasserts, a newer flight of the key can take the lock first and run. The lead
    then never runs its work as if it held the lease, under an older token after a newer one:
    every leader writes its token into the key's file under the lock, so the lead sees the newer
    token when it gets the lock."""
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


@pytest.mark.timeout(60)
def test_a_new_call_beside_a_lead_whose_lease_is_lost_asks_the_coordinator(
    h: Harness, mute: MuteCoordinator
) -> None:
    """A new call beside a lead whose lease is lost asks the coordinator.

    A lead whose lease is lost (here: a newer flight of the key held its key lock first) runs its
    work on for its callers, but it is no longer the key's flight in the scope: a new call of the
    key in its process asks the coordinator instead of joining it."""
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
        again = frames_until(conn, "run", "k")
        assert again["id"] != run["id"]
        release.set()
        with pytest.raises(LeaseLostError):
            call.wait()
    finally:
        release.set()
        g.close()
    with pytest.raises(GroupClosedError):
        later.wait()


@pytest.mark.timeout(60)
def test_a_retrys_token_is_written_to_the_keys_file(h: Harness, mute: MuteCoordinator) -> None:
    """A retry's token is written to the key's file, as the first attempt's is.

    Each attempt of a flight has its own, newer token. A forgotten flight that retries while the
    key's next flight waits for the lock it holds gets a token newer than that flight's; the next
    flight sees it when it takes the lock, so it never runs under an older token after the retry
    with its lease intact."""
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
        run = frames_until(conn, "run", "k")
        conn.send(wire.lead_frame(run["id"], first))
        header, _ = conn.read_frame()
        assert header["op"] == "attempt", header
        conn.send(wire.lead_frame(run["id"], second))
        acknowledge_landing(conn, run["id"])
        assert call.wait().value == "second"
        assert seen == [first, second]
    finally:
        g.close()
