"""Key locks in the directory scope: a leader holds its key's kernel lock while its work
runs (past its deadline, past its group's close), a lead waiting for the lock is given
back when it cannot wait, and the key's file names the newest flight that held it.
"""

from __future__ import annotations

import fcntl
import os
import threading
import types

import pytest

from flightgroup import (
    FlightTimeoutError,
)
from flightgroup.directory import client as client_module
from flightgroup.directory import fs

from ..ingroup import Background, arbiter, close, coordinating, group, hold_key_lock, run_of_k_after
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
        coordinator = arbiter(a)._coordinator

        # The previous flight of k landed and its leader holds the key lock until its ack:
        # the coordinator lets the next call lead at once (the leader waits for the lock).
        holder = hold_key_lock(directory, "k")
        coordinator._releasing["k"] = 1

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
        monkeypatch.setattr(client_module, "threading", fake_threading)

        opened = threading.Event()
        if where == "caller":
            # the lead is told while b's caller opens the key's file (pending)
            real_path = fs.key_lock_path
            in_open = threading.Event()

            def slow_path(d, key):
                if key == "k" and threading.current_thread().name == "b-caller":
                    in_open.set()
                    wait_until(lambda: any(
                        call.pending is not None for call in list(barb._calls.values())
                    ), "the lead was told while b opens the key file")
                return real_path(d, key)

            monkeypatch.setattr(fs, "key_lock_path", slow_path)
            run_of_k_after(in_open, coordinator, monkeypatch)
        else:
            # the lead is told after b's caller opened the file: taken on b's loop
            monkeypatch.setattr(client_module, "os", _OsProxy(opened))
            run_of_k_after(opened, coordinator, monkeypatch)

        b_call = Background(lambda: b.run_sync("k", lambda: "b"), name="b-caller")
        assert b_call.done.wait(10), "b's call never ended (its driver was never told)"
        fcntl.flock(holder, fcntl.LOCK_UN)  # the lock is free again
        coordinator._releasing.pop("k", None)

        # A later call of the key elsewhere must not wait for a flight nobody runs.
        result = c.run_sync("k", lambda: "c", timeout=5)
        assert result.value == "c"
    finally:
        go.set()
        if holder >= 0:
            os.close(holder)
        monkeypatch.undo()
        close(a, b, c)
