"""Helpers of the tests of fresh callers in the wide scopes (contract/test_fresh.py, and
others that need a held work): works that record their runs, a held lead, a probe of the
fresh callers waiting in a group's own table."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from flightgroup import FlightGroup
from flightgroup.scope.bridge import Bridge

from .ingroup import Background
from .support import bridge_of, flight_of, wait_until


def fresh_waiting(g: FlightGroup, key: str, count: int) -> None:
    """Wait until ``count`` fresh callers of ``g`` wait for the end of its flight of ``key``."""
    wait_until(
        lambda: (f := flight_of(g, key)) is not None and len(f.fresh or ()) == count,
        f"{count} fresh callers wait on the local flight",
    )


def held(runs: list[str], name: str, started: threading.Event,
         release: threading.Event) -> Callable[[], str]:
    """A work that records ``name``, sets ``started`` and returns once ``release`` is set."""

    def work() -> str:
        runs.append(name)
        started.set()
        assert release.wait(20)
        return name

    return work


def ran(runs: list[str], name: str) -> Callable[[], str]:
    """A work that records ``name`` and returns it."""

    def work() -> str:
        runs.append(name)
        return name

    return work


class HeldLead:
    """Holds ``g``'s next lead between the scope's LEAD answer and the work's start."""

    def __init__(self, g: FlightGroup, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reached, self.go = threading.Event(), threading.Event()
        original = Bridge._lead

        def held(of: Bridge, *args: Any) -> Any:
            if of is bridge_of(g):
                self.reached.set()
                assert self.go.wait(20)
            return original(of, *args)

        monkeypatch.setattr(Bridge, "_lead", held)


def lead_held(
    g: FlightGroup, runs: list[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[HeldLead, threading.Event, threading.Event, Callable[[], str], Background]:
    """A caller of ``g`` leads "k" with a held work named "first"; the lead is held
    (``hold.go`` lets it start). Returns (hold, started, release, work, leader)."""
    hold = HeldLead(g, monkeypatch)
    started, release = threading.Event(), threading.Event()
    work = held(runs, "first", started, release)
    leader = Background(lambda: g.run_sync("k", work))
    assert hold.reached.wait(10)
    return hold, started, release, work, leader
