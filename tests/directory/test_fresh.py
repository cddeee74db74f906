"""Fresh callers in the directory scope (ADR 0005): a fresh caller never gets an outcome
of a flight that began before its call; fresh callers that come during one flight share
the next, across groups, processes and coordinator changes.
"""

from __future__ import annotations

import threading

from flightgroup import (
    Retention,
)

from ..ingroup import Background, live_coordinator
from ..ingroup import close as _close
from ..ingroup import group as _group
from ..support import wait_until


def test_fresh_caller_elsewhere_never_gets_the_kept_outcome_of_the_older_flight(
    directory: str,
) -> None:
    """A fresh caller in another group never gets the older flight's kept outcome."""
    a, b = _group(directory, retention=Retention(success=60.0)), _group(directory)
    try:
        running, release = threading.Event(), threading.Event()

        def old() -> str:
            running.set()
            release.wait(10)
            return "old"

        leader = Background(lambda: a.run_sync("k", old))
        assert running.wait(10)
        fresh = Background(lambda: b.run_sync("k", lambda: "new", fresh=True))

        def waiting_fresh() -> bool:
            coordinator = live_coordinator(a, b)
            flight = None if coordinator is None else coordinator._flights.get("k")
            return flight is not None and len(flight.fresh) == 1

        wait_until(waiting_fresh, "the fresh call waits for the flight's end")
        release.set()
        assert leader.wait().value == "old"
        result = fresh.wait()
        assert result.value == "new"
        assert result.joined is False
    finally:
        release.set()
        _close(a, b)
