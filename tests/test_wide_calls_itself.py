"""I6 (ADR 0006) in the wide scopes for a work whose flight already left the table: a
sync work that ran past its deadline (its flight settled with FlightTimeoutError, its
work runs on and, in the directory scope, holds the key lock) and then calls its own
key gets RuntimeError. Before, the call led a new flight that waited for the key lock
the caller itself held (directory), or ran the key again inside its own work (fleet).
Found by review. The same for a flight that a forget() in another process detached.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from flightgroup import FlightTimeoutError

from .ingroup import Background
from .support import wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_work_past_its_deadline_that_calls_its_own_key_raises(wide: Any) -> None:
    go_on, ended = threading.Event(), threading.Event()
    inner: list[BaseException | str] = []

    def body() -> str:
        if not go_on.is_set():  # the outer run; an inner one (the bug) returns at once
            assert go_on.wait(20)
            try:
                inner.append(again())
            except BaseException as exc:
                inner.append(exc)
            finally:
                ended.set()
        return "late"

    again = wide.coalesce(key=lambda: "k", deadline=0.3)(body)
    with pytest.raises(FlightTimeoutError):
        again()  # the flight settled; its work runs on
    go_on.set()
    assert ended.wait(20), "the nested call waited for the key lock its own work holds"
    [error] = inner
    assert isinstance(error, RuntimeError) and "wait for itself" in str(error), error


def test_a_flight_lingers_only_until_its_late_work_returns(wide: Any) -> None:
    """The table holds a flight settled past its deadline only while its work runs on
    (its outcome with it): it lets go when the work returns, whatever else happens."""
    go_on = threading.Event()

    def body() -> str:
        assert go_on.wait(20)
        return "late"

    late = wide.coalesce(key=lambda: "k", deadline=0.3)(body)
    with pytest.raises(FlightTimeoutError):
        late()
    assert len(wide._table.lingering) == 1
    go_on.set()
    wait_until(lambda: not wide._table.lingering, "the flight lets go once its work returned")


def test_a_work_whose_flight_a_forget_elsewhere_detached_still_raises(
    pair: tuple[Any, Any],
) -> None:
    """Once the notice took the leader's own flight out of its table (ADR 0026), the
    nested call must not lead a flight that waits for the key lock its own flight holds
    (directory), nor run the key again inside its own work (fleet)."""
    leader, forgetter = pair
    go_on, started = threading.Event(), threading.Event()
    runs: list[str] = []

    def work() -> str:
        started.set()
        assert go_on.wait(20)
        with pytest.raises(RuntimeError, match="wait for itself"):
            leader.run_sync("k", lambda: runs.append("inner") or "inner")
        return "outer"

    try:
        outer = Background(lambda: leader.run_sync("k", work))
        assert started.wait(10)
        forgetter.forget("k")
        # The directory's joiners and leader hear it at once; the fleet's leader at its
        # next renewal (the pair's lease is 2 s: within 2/3 s).
        wait_until(lambda: "k" not in leader._table.flights, "the leader heard the forget")
        go_on.set()
        assert outer.wait().value == "outer"
        assert runs == []
    finally:
        go_on.set()
