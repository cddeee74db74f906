"""A directory group whose coordinator does not answer (frozen with SIGSTOP), and one
that was closed: forget() and status() say so with the library's errors, as the fleet
scope's do, instead of returning as if the coordinator had confirmed, or raising
concurrent.futures.TimeoutError."""

from __future__ import annotations

import pytest

from flightgroup import GroupClosedError, UnavailableError

from ..dirproc import Harness
from ..ingroup import arbiter, close, group

pytestmark = pytest.mark.timeout(60)


def test_a_forget_no_coordinator_confirms_raises_unavailable(h: Harness) -> None:
    a = h.spawn_warm("a")
    assert h.coordinator_pid() == a.pid
    g = group(h.dir)
    try:
        assert g.run_sync("warm", lambda: 1).value == 1  # connected to a
        a.stop()
        # docs/api.md: forget(key): "the next call of the key leads a new flight". Unconfirmed,
        # other processes may still join the old one: the caller must hear it.
        with pytest.raises(UnavailableError, match="forget"):
            arbiter(g).forget("k", timeout=0.5)
        with pytest.raises(UnavailableError, match="status"):
            arbiter(g).status(timeout=0.5)
        a.cont()
        arbiter(g).forget("k", timeout=10)  # answered again: no error
        assert arbiter(g).status(timeout=10) == []
    finally:
        a.cont()
        close(g)


def test_status_of_a_closed_group_raises_group_closed(directory: str) -> None:
    g = group(directory)
    assert g.run_sync("warm", lambda: 1).value == 1
    close(g)
    with pytest.raises(GroupClosedError):
        arbiter(g).status(timeout=1)
    arbiter(g).forget("k")  # a closed group's arbiter forgets nothing and returns quietly
