"""Parts the wide scopes share (flightgroup.wide), on their own; and the engine's paths
that both wide scopes take, run on a directory group (the fleet's twins are in
tests/test_fleet_review3.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import flightgroup.group as group_module
from flightgroup import FlightFailedError, Retention
from flightgroup.wide import KeptCauses

from .ingroup import close, group


def test_kept_causes_are_found_by_key_and_token_and_bounded() -> None:
    causes = KeptCauses(limit=3)
    errors = [ValueError(i) for i in range(4)]
    for i, error in enumerate(errors):
        causes.remember("k", i, error, 60.0)
    assert causes.cause("k", 0) is None  # the oldest went past the bound
    assert [causes.cause("k", i) for i in (1, 2, 3)] == errors[1:]
    assert causes.cause("k", 4) is None and causes.cause("other", 3) is None
    causes.remember("k", 1, errors[0], 60.0)  # remembered again: the newest
    causes.remember("j", 9, errors[3], 60.0)
    assert causes.cause("k", 2) is None and causes.cause("k", 1) is errors[0]


def test_kept_causes_drop_an_error_whose_keep_time_ran_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr("flightgroup.wide.time.monotonic", lambda: now[0])
    causes = KeptCauses()
    error = KeyError("gone")
    causes.remember("k", 1, error, 5.0)
    now[0] += 4.9
    assert causes.cause("k", 1) is error
    now[0] += 0.1
    assert causes.cause("k", 1) is None  # as the kept failure it explains


def test_a_kept_failure_led_in_another_group_has_no_cause(directory: str) -> None:
    # API.md: __cause__ only in the leader's process (a group is the unit here, as for
    # joiners: tests/test_directory_policies.py).
    a, b = (group(directory, retention=Retention(success=None, error=60.0)) for _ in "ab")
    try:

        def boom() -> None:
            raise KeyError("missing")

        with pytest.raises(KeyError):
            a.run_sync("k", boom)
        with pytest.raises(FlightFailedError) as other:
            b.run_sync("k", lambda: "never")
        with pytest.raises(FlightFailedError) as own:
            a.run_sync("k", lambda: "never")
        assert other.value.error_type == own.value.error_type == "KeyError"
        assert other.value.__cause__ is None
        assert isinstance(own.value.__cause__, KeyError)
    finally:
        close(a, b)


def test_a_wide_leaders_task_cancelled_before_its_first_step_still_settles(
    directory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without eager tasks (3.11), asyncio.run(main) where main starts a leader's task
    and returns: the driver task is cancelled before it asked the coordinator. The
    flight stayed RUNNING in the table, and every later call of the key joined it."""
    monkeypatch.setattr(group_module, "_EAGER", False)
    g = group(directory)
    ran: list[int] = []
    tasks: list[asyncio.Task[Any]] = []

    async def work() -> str:
        ran.append(1)
        return "v"

    async def main() -> None:
        tasks.append(asyncio.create_task(g.run("k", work)))  # fire and forget

    try:
        asyncio.run(main())
        assert ran == [] and tasks[0].cancelled()  # the interleaving above happened
        assert g._table.flights.get("k") is None
        assert g.run_sync("k", lambda: "next", timeout=10).value == "next"
    finally:
        close(g)
