"""What a type checker sees of flightgroup's calls (issue 29, ADR 0044): run by
``mypy --strict tests/typing`` in ``scripts/dev test``, never by pytest (no test here).

Each ``assert_type`` is a type that must hold. Each ``# type: ignore[code]`` marks a
misuse that must be reported with that code: mypy's ``warn_unused_ignores`` (part of
--strict) fails the run when a misuse is no longer reported. The deprecated code is on
for this file, as a user turns it on to see an async work given to ``run_sync``.
"""

# mypy: enable-error-code="deprecated"

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, assert_type

import flightgroup
from flightgroup import FlightGroup, GroupSlot, Result
from flightgroup.typed import TypedCodec

group = FlightGroup()
flights = GroupSlot()


@dataclass
class User:
    id: int


@group.coalesce(key=lambda user_id: f"user:{user_id}")
async def get_user(user_id: int) -> User:
    return User(user_id)


@group.coalesce(key=lambda day: f"report:{day}")
def report(day: str) -> list[int]:
    return [1, 2]


@flights.coalesce(key=lambda user_id: f"user:{user_id}")
async def slot_user(user_id: int) -> User:
    return User(user_id)


@flights.coalesce()
def slot_report(day: str, *, full: bool = False) -> dict[str, int]:
    return {}


@group.coalesce(key=lambda user_id: f"user:{user_id}", codec=TypedCodec())
async def typed_user(user_id: int) -> User:
    return User(user_id)


class Repo:
    @group.coalesce(key=lambda self, n: str(n))
    def square(self, n: int) -> int:
        return n * n


async def fetch() -> int:
    return 1


def compute() -> int:
    return 1


async def calls() -> None:
    # The decorated function keeps its signature and return type.
    assert_type(await get_user(7), User)
    assert_type(report("monday"), list[int])
    assert_type(await slot_user(7), User)
    assert_type(slot_report("monday", full=True), dict[str, int])
    assert_type(Repo().square(3), int)
    # A typed codec decodes to the declared type, which is what the checker sees too.
    assert_type(await typed_user(7), User)
    assert_type((await typed_user.options()(7)).value, User)

    # The per-call form gives the Result, awaited for a coroutine function.
    assert_type(await get_user.options(timeout=1.0, fresh=True)(7), Result[User])
    pending = assert_type(
        get_user.options(on_join=lambda: None)(7), Coroutine[Any, Any, Result[User]]
    )
    pending.close()
    assert_type(report.options(timeout=0.5)("monday"), Result[list[int]])
    assert_type(await slot_user.options()(7), Result[User])
    assert_type(slot_report.options(fresh=True)("monday", full=True), Result[dict[str, int]])
    assert_type(Repo.square.options()(Repo(), 3), Result[int])
    user = await get_user.options()(7)
    assert_type(user.value, User)
    assert_type(user.joined, bool)
    assert_type(user.token, int)

    # run and run_sync take the kind of work they run.
    assert_type(await group.run("k", fetch), Result[int])
    assert_type(group.run_sync("k", compute), Result[int])

    # -- misuse: each line must be reported, with this code --------------------------
    group.run_sync("k", fetch)  # type: ignore[deprecated]
    await group.run("k", compute)  # type: ignore[arg-type]
    await get_user("seven")  # type: ignore[arg-type]
    report(day=3)  # type: ignore[arg-type]
    await get_user.options(timeout="1")(7)  # type: ignore[call-overload]
    await get_user.options(retry=3)(7)  # type: ignore[call-overload]
    await get_user.options()("seven")  # type: ignore[arg-type]
    await report.options()("monday")  # type: ignore[misc]
    slot_report.options()("monday", full=1)  # type: ignore[arg-type]
    Repo().square.options()  # type: ignore[attr-defined]
    flightgroup.GroupSlot().bind("not a group")  # type: ignore[arg-type]
