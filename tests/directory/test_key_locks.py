"""Key locks in the directory scope: a leader holds its key's kernel lock while its work
runs (past its deadline, past its group's close), a lead waiting for the lock is given
back when it cannot wait, and the key's file names the newest flight that held it.
"""

from __future__ import annotations

import threading

import pytest

from flightgroup import (
    FlightTimeoutError,
)

from ..ingroup import Background
from ..ingroup import close as _close
from ..ingroup import coordinating as _coordinating
from ..ingroup import group as _group
from ..ingroup import key_lock_free as _key_lock_free


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
