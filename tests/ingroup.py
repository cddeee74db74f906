"""Directory groups of the test process itself: made, probed and closed with bounds.

Shared by the tests that drive a group's arbiter in this process (its dicts, its
coordinator), beside tests/dirproc.py's child processes; and ``scope_groups``, which
the scope fixtures of conftest.py and engine/test_containment.py make their groups with.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
    GroupClosedError,
    Retry,
)
from flightgroup.directory import fs as fs_module
from flightgroup.directory import keylocks, lockwatch
from flightgroup.directory.client import DirectoryArbiter

from .support import scope_of, wait_until


def group(directory: str, **kwargs: Any) -> FlightGroup:
    return FlightGroup(directory=directory, codec=JSON, **kwargs)


def arbiter(of: FlightGroup) -> DirectoryArbiter:
    found = scope_of(of)
    assert isinstance(found, DirectoryArbiter)
    return found


def coordinating(directory: str, **kwargs: Any) -> FlightGroup:
    """A group that holds the election (it calls first and waits until it serves)."""
    made = group(directory, **kwargs)
    assert made.run_sync("warm-up", lambda: 0).value == 0
    held = arbiter(made)
    wait_until(lambda: held._state.coordinator is not None, "the first group coordinates")
    return made


def with_timeout(fn: Callable[[], Any], seconds: float) -> None:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(seconds)


def close(*groups: FlightGroup) -> None:
    """Close each group, waiting at most 15 s for each (a hang fails the test's
    own assertions, not the whole run)."""
    for each in groups:
        with_timeout(each.close, 15)


class Background:
    """A call in a thread of its own (named ``name``): its result or its exception."""

    def __init__(self, fn: Callable[[], Any], name: str | None = None) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def body() -> None:
            try:
                self.result = fn()
            except BaseException as exc:
                self.error = exc
            finally:
                self.done.set()

        self.thread = threading.Thread(target=body, daemon=True, name=name)
        self.thread.start()

    def wait(self, timeout: float = 15.0) -> Any:
        assert self.done.wait(timeout), "the call did not end"
        if self.error is not None:
            raise self.error
        return self.result


def key_lock_free(directory: str, key: str) -> bool:
    """Nobody holds ``key``'s lock (probed from a new open file description: a lock of
    this very process counts too)."""
    fd = os.open(fs_module.key_lock_path(directory, key), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def hold_key_lock(directory: str, key: str) -> int:
    """Take ``key``'s lock on a descriptor of its own (as another leader would hold it);
    closing the descriptor frees it."""
    path = fs_module.key_lock_path(directory, key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _key_locks(directory: str) -> str:
    return os.path.join(os.path.realpath(directory), "execution-locks") + os.sep


def key_files_open(directory: str) -> int:
    """This process's open descriptors of ``directory``'s key-lock files (only its own:
    a test that ran before in this process may still be letting go of others)."""
    locks = _key_locks(directory)
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith(locks):
                count += 1
        except OSError:
            pass  # the listing's own descriptor, gone already
    return count


def lock_waiters(directory: str) -> int:
    """Threads of this process blocked in a lead's flock on one of ``directory``'s key
    files (keylocks.LockWaiter; only its own directory's: one of a test that ran before
    in this process waits until its own holder lets go)."""
    locks = _key_locks(directory)
    count = 0
    for t in threading.enumerate():
        # Its LockWaiter's _wait (the target is None once it ended).
        waiter = getattr(getattr(t, "_target", None), "__self__", None)
        if t.name != "flightgroup-keylock" or not isinstance(waiter, keylocks.LockWaiter):
            continue
        path = fs_module.key_lock_path(waiter.directory, waiter.lead.call.key)
        count += os.path.realpath(path).startswith(locks)
    return count


def key_watchers(directory: str) -> list[threading.Thread]:
    """The coordinator's watcher threads of this process blocked on ``directory``'s key
    files (a key's watcher has the same name in every directory)."""
    locks = _key_locks(directory)
    return [
        t for t in threading.enumerate()
        if t.name.startswith("flightgroup-keylock-")
        and isinstance(watcher := getattr(getattr(t, "_target", None), "__self__", None),
                       lockwatch._Watcher)
        and os.path.realpath(watcher.path).startswith(locks)
    ]


def closed_leader_holds(directory: str) -> tuple[FlightGroup, threading.Event, list[str]]:
    """A group ``a`` leads ``k`` and closes while its work runs: the work keeps the key
    lock (until ``release`` is set), and the coordinator has a landed (interrupted)
    flight of ``k``, so the next call of ``k`` waits at the coordinator, on the key's
    watcher, until the lock frees. ``runs`` lists the works that ran ("a")."""
    a = group(directory)
    running, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def work() -> str:
        runs.append("a")
        running.set()
        release.wait(30)
        return "a"

    # With a timeout the work runs on a thread of its own and the caller waits.
    leader = Background(lambda: a.run_sync("k", work, timeout=60))
    assert running.wait(10)
    a.close()
    with pytest.raises(GroupClosedError):
        leader.wait()
    assert not key_lock_free(directory, "k")  # the closed group's work keeps its lock
    return a, release, runs


def landed_leader_holds(directory: str) -> tuple[FlightGroup, threading.Event, list[str]]:
    """A group ``a`` leads ``k`` and lands a value while the key lock stays held: its
    first attempt (sync work) ran past the deadline and goes on until ``release`` is
    set, its retry returned at once. The coordinator expects the lock to be freed with
    the landing's ack, so the next call of ``k`` leads at once and waits for the key
    lock in a key-lock thread. ``runs`` lists the works that ran ("a" then "a2")."""
    a = group(directory, deadline=0.3, retry=Retry(attempts=2, backoff=0.0, jitter=False))
    release = threading.Event()
    runs: list[str] = []

    def work() -> str:
        if runs:
            runs.append("a2")
            return "a2"
        runs.append("a")
        release.wait(30)
        return "a"

    result = a.run_sync("k", work)
    assert (result.value, runs) == ("a2", ["a", "a2"])
    assert not key_lock_free(directory, "k")  # the first attempt's work keeps its lock
    return a, release, runs


def scope_groups(
    request: pytest.FixtureRequest,
    scope: str,
    count: int,
    lease: float,
    fake: Any = None,
    **options: Any,
) -> list[FlightGroup]:
    """``count`` groups of ``scope`` ("process", "fake": a "process" each of ``fake``, a
    FakeCoordinator (a new one when None), "directory", or "fleet" on the test module's
    Redis, with ``lease``), each made with ``options``; a wide scope's server is started
    only when asked for."""
    from flightgroup.testing import FakeCoordinator

    if scope == "process":
        return [FlightGroup(**options) for _ in range(count)]
    options.setdefault("codec", JSON)
    if scope == "fake":
        fake = FakeCoordinator() if fake is None else fake
        return [fake.group(**options) for _ in range(count)]
    if scope == "directory":
        d = request.getfixturevalue("directory")
        return [FlightGroup(directory=d, **options) for _ in range(count)]
    url, ns = request.getfixturevalue("redis_server").url, request.getfixturevalue("namespace")
    return [FlightGroup(redis=url, namespace=ns, lease=lease, **options) for _ in range(count)]


def live_coordinator(*groups: FlightGroup) -> Any:
    """The coordinator that runs in one of ``groups`` and is not closed, or None."""
    for each in groups:
        arbiter = scope_of(each)
        assert arbiter is not None
        coordinator = arbiter._state.coordinator
        if coordinator is not None and not coordinator.closed:
            return coordinator
    return None


def remote_leader(
    directory: str,
) -> tuple[FlightGroup, threading.Event, threading.Event, Background]:
    """A group ``a`` of ``directory`` whose sync caller leads "k" in a thread, its work
    running until ``release`` is set: (a, running, release, leader)."""
    a = group(directory)
    running, release = threading.Event(), threading.Event()

    def work() -> str:
        running.set()
        release.wait(20)
        return "value"

    leader = Background(lambda: a.run_sync("k", work, timeout=60))
    assert running.wait(10)
    return a, running, release, leader


def coordinator_of(of: FlightGroup) -> Any:
    """The coordinator that runs in ``of`` (the test fails if ``of`` does not coordinate)."""
    found = arbiter(of)._state.coordinator
    assert found is not None, "this group does not coordinate"
    return found


def run_of_k_after(event, coordinator, monkeypatch):
    """The coordinator handles a run request of "k" only once ``event`` is set."""
    real_run = coordinator._run

    def run(session, id, key, *args, **kwargs):
        if key == "k":
            assert event.wait(10)
        return real_run(session, id, key, *args, **kwargs)

    monkeypatch.setattr(coordinator, "_run", run)
