"""Directory client reviews (3): a lead told while its caller still opened the key's
file, then refused by a new coordinator; a lead whose key-lock wait thread cannot start."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import types

import pytest

from flightgroup import LeaseLostError, current_lease
from flightgroup.directory import fs, keylocks, wire

from .ingroup import Background, arbiter, close, coordinating, group, hold_key_lock
from .support import wait_until

pytestmark = pytest.mark.timeout(60)


def _run_of_k_after(event, coordinator, monkeypatch):
    """The coordinator handles a run request of "k" only once ``event`` is set."""
    real_run = coordinator._run

    def run(session, id, key, *args, **kwargs):
        if key == "k":
            assert event.wait(10)
        return real_run(session, id, key, *args, **kwargs)

    monkeypatch.setattr(coordinator, "_run", run)


def test_a_rejected_reassert_of_a_pending_lead_is_not_dropped(directory, monkeypatch):
    """A lead told while its caller still opened the key's file is reasserted by the
    reconnect (it is pending); a new coordinator that let another process lead the key
    meanwhile refuses it. That `rejected` was dropped (the lead was not in ``_leads`` yet):
    published later with its lease intact, it ran its work after the other flight under an
    older fencing token and returned a normal Result.
    """
    a = coordinating(directory)
    b = group(directory)
    c = group(directory)
    try:
        b.run_sync("warm-b", lambda: 0)
        c.run_sync("warm-c", lambda: 0)
        barb = arbiter(b)

        # b's caller thread stalls while it opens the key's file (a slow first create)
        in_open, open_go = threading.Event(), threading.Event()
        real_path = fs.key_lock_path

        def slow_path(d, key):
            if key == "k" and threading.current_thread().name == "b-caller":
                in_open.set()
                assert open_go.wait(30)
            return real_path(d, key)

        monkeypatch.setattr(fs, "key_lock_path", slow_path)
        # ... and the coordinator answers b's run only once b's caller is in that open
        _run_of_k_after(in_open, arbiter(a)._coordinator, monkeypatch)

        # b's next reconnect waits until the test lets it go
        connect_go = threading.Event()
        real_connect = barb._connect

        async def gated_connect(*args):
            await asyncio.to_thread(connect_go.wait, 30)
            return await real_connect(*args)

        # b hears every answer; the test sees the rejection
        answers: list[object] = []
        real_answer = barb._answer

        def answer(ans):
            answers.append(ans)
            real_answer(ans)

        barb._answer = answer

        b_lease = {}

        def b_work():
            lease = current_lease()
            b_lease["lost"] = lease.lost
            b_lease["token"] = lease.token
            return "b"

        b_call = Background(lambda: b.run_sync("k", b_work), name="b-caller")
        assert in_open.wait(10)
        # the lead reached b's loop while its caller opens the file: parked as pending
        wait_until(lambda: any(call.pending is not None for call in barb._calls.values()),
                   "b was told to lead while it opens the key file")

        barb._connect = gated_connect
        with_a_closed = Background(a.close)
        with_a_closed.wait(20)  # the coordinator is gone (b, c reconnect to a new one)

        c_started, c_go = threading.Event(), threading.Event()

        def c_work():
            c_started.set()
            assert c_go.wait(30)
            return "c"

        c_call = Background(lambda: c.run_sync("k", c_work))
        assert c_started.wait(15)  # c leads k in the new term (its key lock was free)

        connect_go.set()  # b reconnects: it reasserts its pending lead, which is refused
        wait_until(lambda: any(isinstance(x, wire.Rejected) for x in answers),
                   "b's reassert was rejected")

        open_go.set()  # b's open returns
        c_go.set()
        c_result = c_call.wait()
        try:
            b_result = b_call.wait()
        except LeaseLostError:
            return  # its lease was lost, as the rejection said: fine
        # A lead the coordinator refused must not run as if it held its lease, and a
        # flight that ran after c's must not carry an older fencing token.
        assert not (b_lease.get("lost") is False and b_result.token < c_result.token), (
            f"b's refused lead ran with its lease intact (lease.lost={b_lease.get('lost')}),"
            f" token {b_result.token:#x} after c's flight with token {c_result.token:#x}"
        )
    finally:
        open_go.set()
        connect_go.set()
        close(b, c)
        close(a)


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


@pytest.mark.parametrize("where", ["caller", "loop"])
def test_a_lead_whose_lock_wait_thread_cannot_start_is_given_back(
    directory, monkeypatch, where
):
    """When the key lock is busy, the lead is published and a thread waits for the lock.
    If that thread cannot start (RuntimeError: can't start new thread), the lead was never
    given back: the coordinator kept a flight nobody runs, which every later call of the
    key joined; the caller got RuntimeError ("caller") or waited for ever ("loop").
    """
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
                        call.pending is not None for call in list(barb._calls.values())
                    ), "the lead was told while b opens the key file")
                return real_path(d, key)

            monkeypatch.setattr(fs, "key_lock_path", slow_path)
            _run_of_k_after(in_open, coordinator, monkeypatch)
        else:
            # the lead is told after b's caller opened the file: taken on b's loop
            monkeypatch.setattr(keylocks, "os", _OsProxy(opened))
            _run_of_k_after(opened, coordinator, monkeypatch)

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
