"""ADR 0006: a work that calls its own key (directly, or through other keys) would wait
for itself: the call raises RuntimeError. Two groups of one scope in one process are
one group for this."""

from __future__ import annotations

from typing import Any

import pytest

from flightgroup import FlightGroup

from ...support import run
from .conftest import Scope


def test_a_sync_work_calling_its_own_key_raises_runtime_error(group: FlightGroup) -> None:
    def work() -> str:
        with pytest.raises(RuntimeError):
            group.run_sync("k", lambda: "inner")
        return "outer"

    assert group.run_sync("k", work).value == "outer"


def test_an_async_work_calling_its_own_key_raises_runtime_error(group: FlightGroup) -> None:
    async def inner() -> str:
        return "inner"

    async def work() -> str:
        with pytest.raises(RuntimeError):
            await group.run("k", inner)
        return "outer"

    assert run(group.run("k", work)).value == "outer"


def test_a_work_calling_its_key_through_another_key_raises(group: FlightGroup) -> None:
    def a() -> Any:
        return group.run_sync("b", b).value

    def b() -> str:
        with pytest.raises(RuntimeError):
            group.run_sync("a", lambda: "again")
        return "b"

    assert group.run_sync("a", a).value == "b"


def test_a_work_calling_its_key_through_another_group_of_the_scope_raises(wide: Scope) -> None:
    first, second = wide.pair()

    def work() -> str:
        with pytest.raises(RuntimeError):
            second.run_sync("k", lambda: "inner")
        return "outer"

    assert first.run_sync("k", work).value == "outer"


def test_a_work_may_call_other_keys(group: FlightGroup) -> None:
    assert group.run_sync("a", lambda: group.run_sync("b", lambda: 2).value + 1).value == 3
