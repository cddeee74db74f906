"""The election of a directory's coordinator: every group and thread of a process takes
part in one election, and a process whose election failed (an epoch it cannot write)
campaigns again, so every live process is served once the directory is repaired.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from flightgroup import (
    JSON,
    FlightGroup,
)

from ..dirproc import Harness
from ..ingroup import close, group
from ..support import scope_of, wait_until

pytestmark = pytest.mark.timeout(90)


def _write_epochs(directory: str, text: str) -> None:
    for name in ("flight.epoch", os.path.join("state", "epoch")):
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)


def test_a_failed_election_is_tried_again_once_the_directory_is_repaired(
    directory: str,
) -> None:
    """A failed election is tried again once the directory is repaired.

    A process that won the election and cannot write the epoch (ADR 0009's EpochError, a full
    disk) lets the lock go and campaigns again a second later; calls raise the error at once only
    while no coordinator serves, and are served once the epoch is written by hand as the error
    says."""
    from flightgroup.directory import epochs

    os.makedirs(os.path.join(directory, "state"), mode=0o700)
    _write_epochs(directory, "not a number\n")  # both copies damaged, no token
    g = group(directory)
    try:
        for _ in range(2):  # the first call waited for the election; the next one not
            with pytest.raises(epochs.EpochError):
                g.run_sync("k", lambda: "ran", timeout=20)
        _write_epochs(directory, "41\n")  # the repair the error names
        results: list[Any] = []

        def served() -> bool:
            try:
                results.append(g.run_sync("k", lambda: "ran", timeout=20))
            except epochs.EpochError:
                return False
            return True

        wait_until(served, "the election tried again")
        assert results[-1].value == "ran"
        assert results[-1].token >> 32 == 42
    finally:
        close(g)


def test_every_live_process_is_served_again_after_the_repair(h: Harness) -> None:
    """Every live process is served again once the directory is repaired.

    The coordinator dies while the epoch cannot grow; each live process wins in turn and fails.
    After the repair, both are served again."""
    c, a, b = h.spawn_warm("c"), h.spawn_warm("a"), h.spawn_warm("b")
    _write_epochs(h.dir, f"{2**31 - 1}\n")  # the last epoch: the next one cannot be
    c.kill()
    a.call("a0", "k", h.work())
    assert a.expect("done", "a0")["error_type"] == "EpochError"
    _write_epochs(h.dir, "7\n")
    pause = threading.Event()
    for child in (a, b):
        for attempt in range(100):
            child.call(f"x{attempt}", "k", h.work())
            done = child.expect("done", f"x{attempt}")
            if done["ok"]:
                assert done["token"] >> 32 == 8
                break
            assert done["error_type"] == "EpochError", done
            pause.wait(0.1)  # the retry comes a second after a failed election
        else:
            raise AssertionError(f"{child} was never served again")


@pytest.mark.timeout(60)
def test_groups_and_threads_of_one_process_take_part_in_one_election(directory: str) -> None:
    """Groups and threads of one process take part in one election.

    Two groups of this thread and one made in another thread, on one directory:
    one of them coordinates (one term, epoch 1); closing it hands over to exactly one
    other (epoch 2), never to two at once."""
    from flightgroup.directory import epochs

    groups = [FlightGroup(directory=directory, codec=JSON) for _ in range(2)]
    made: list[FlightGroup] = []
    thread = threading.Thread(target=lambda: made.append(FlightGroup(directory=directory,
                                                                     codec=JSON)))
    thread.start()
    thread.join(20)
    groups += made

    def coordinating() -> list[FlightGroup]:
        return [g for g in groups if scope_of(g)._state.coordinator is not None]

    try:
        for i, group in enumerate(groups):  # every group connected (its election waits)
            assert group.run_sync(f"k{i}", lambda i=i: i).value == i
        assert epochs.read_epoch(directory) == 1
        (first,) = coordinating()
        first.close()
        groups.remove(first)
        # The next call is served by the next term: one of the others coordinates.
        assert groups[0].run_sync("after", lambda: "ok").value == "ok"
        wait_until(lambda: len(coordinating()) == 1, "one new coordinator")
        assert epochs.read_epoch(directory) == 2
        assert len(coordinating()) == 1
    finally:
        for group in groups:
            group.close()
