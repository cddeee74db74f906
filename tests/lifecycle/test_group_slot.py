"""GroupSlot (issue 29, ADR 0044): operations declared at import without a group serve
the group the application opens into the slot, and the next one after it closes,
without being decorated again; an empty slot's calls raise GroupClosedError saying
what to do. The ``flights_group`` fixture below is the pattern for a fresh group per
test."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import flightgroup
from flightgroup import FlightGroup, GroupClosedError, GroupSlot, Retention

from ..ingroup import Background
from ..support import run, wait_until

# Declared at import, as an application's module would.
flights = GroupSlot("flights")
runs: list[int] = []
gate = threading.Event()
gate.set()


@flights.coalesce(key=lambda n: f"n:{n}", retention=Retention(success=60.0))
def load(n: int) -> int:
    runs.append(n)
    assert gate.wait(30)
    return n * 2


@flights.coalesce(key=lambda n: f"a:{n}")
async def aload(n: int) -> int:
    return n + 1


@pytest.fixture
def flights_group() -> Iterator[FlightGroup]:
    """A fresh group in ``flights`` for each test, closed after it."""
    runs.clear()
    with flights.open() as group:
        yield group


def test_a_fixture_gives_the_first_test_a_fresh_group(flights_group: FlightGroup) -> None:
    """The operation's retention keeps an outcome within this test's group only."""
    assert flights_group.stats().calls == 0
    assert (load(1), load(1), runs) == (2, 2, [1])  # the second call is served kept


def test_a_fixture_gives_the_next_test_a_fresh_group(flights_group: FlightGroup) -> None:
    """Nothing kept by the test before: the work runs again, in a new group."""
    assert flights_group.stats().calls == 0
    assert (load(1), runs) == (2, [1])
    assert flights.group is flights_group


def test_an_empty_slots_calls_raise_group_closed_error_with_a_note() -> None:
    """Before open and after close: GroupClosedError (the contract's text), a note
    that names the slot and says to open it; nothing runs."""
    runs.clear()
    for call in (lambda: load(1), lambda: run(aload(1)), lambda: load.forget(1)):
        with pytest.raises(GroupClosedError) as caught:
            call()
        assert str(caught.value) == "This flight group is closed."
        assert any("flights.open(" in note for note in caught.value.__notes__)
    with pytest.raises(GroupClosedError):
        load.options(timeout=1.0)(1)
    with pytest.raises(GroupClosedError):
        _ = flights.group
    assert runs == [] and not flights.bound


def test_the_slot_reopens_and_each_group_serves_the_same_functions(tmp_path: Path) -> None:
    """open() twice in a row (sync, then async with a directory scope): both serve the
    functions declared at import; each group is closed at its block's end."""
    with flights.open() as first:
        assert load(3) == 6 and first.stats().calls == 1
    assert first.closed and not flights.bound

    async def second_session() -> tuple[int, int, FlightGroup]:
        async with flights.open(directory=str(tmp_path / "flights"), codec=flightgroup.JSON) as g:
            return await aload(4), (await aload.options()(4)).token, g

    value, token, second = run(second_session())
    assert value == 5 and token > 0 and second.closed and second is not first


def test_an_operations_policy_applies_over_each_bound_groups_own(tmp_path: Path) -> None:
    """The operation's override (retention) holds in each group; the rest is the
    group's own (a deadline given to open())."""
    gate.clear()
    try:
        with flights.open(deadline=0.2) as group:
            with pytest.raises(flightgroup.FlightTimeoutError):
                load(5)  # the group's deadline
    finally:
        gate.set()
    with flights.open() as group:
        assert (load(6), load(6)) == (12, 12)
        assert group.stats().kept == 1  # the operation's retention


def test_calls_waiting_when_the_slot_closes_raise_group_closed_error() -> None:
    """Closing the block closes its group: a joiner waiting in it raises
    GroupClosedError at once, as for FlightGroup.close(); the leader, whose work runs
    in its own thread, raises it once its work ends."""
    runs.clear()
    gate.clear()
    try:
        with flights.open() as group:
            leader = Background(lambda: load(7))
            wait_until(lambda: runs == [7], "the work runs")
            joiner = Background(lambda: load(7))
            wait_until(lambda: group.stats().joins == 1, "the second call joined")
        with pytest.raises(GroupClosedError):
            joiner.wait()
        gate.set()
        with pytest.raises(GroupClosedError):
            leader.wait()
    finally:
        gate.set()


def test_bind_and_unbind_a_group_made_elsewhere() -> None:
    """bind() serves the slot's functions from a given group, unbind() takes it out
    and leaves it open; a second bind while one is bound is refused."""
    with FlightGroup() as group:
        flights.bind(group)
        try:
            with pytest.raises(RuntimeError):
                flights.bind(FlightGroup())
            assert load(8) == 16 and group.stats().calls == 1
        finally:
            assert flights.unbind() is group
        assert not group.closed
        with pytest.raises(GroupClosedError):
            load(8)
    with pytest.raises(TypeError):
        flights.bind("not a group")  # type: ignore[arg-type]


def test_a_function_declared_while_bound_serves_the_bound_group() -> None:
    """Decorating on a slot that holds a group binds the new function at once."""
    with flights.open() as group:

        @flights.coalesce(key=lambda: "late")
        def late() -> str:
            return "late"

        assert late() == "late" and group.stats().calls == 1
    with pytest.raises(GroupClosedError):
        late()


def test_two_threads_see_one_group_across_a_rebind() -> None:
    """Calls from other threads and loops follow the slot: after a reopen they run in
    the new group."""
    with flights.open() as first:
        assert Background(lambda: load(9)).wait() == 18
    with flights.open() as second:
        loop_result = Background(lambda: asyncio.run(aload(9))).wait()
        assert loop_result == 10 and second.stats().calls == 1
    assert first.stats().calls == 1


def test_opening_a_slot_that_holds_a_group_is_refused_and_changes_nothing() -> None:
    """One group at a time: a nested open raises RuntimeError; the slot keeps serving
    the group it holds."""
    with flights.open() as group:
        with pytest.raises(RuntimeError), flights.open():
            pass
        assert flights.group is group and load(10) == 20


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


@flights.coalesce(key=lambda x: f"p:{x}")
def point(x: int) -> Point:
    return Point(x, x + 1)


@flights.coalesce(key=lambda x: f"pair:{x}", codec=flightgroup.JSON)
def pair(x: int) -> tuple[int, int]:
    return (x, x)


def test_a_typed_codec_of_the_bound_group_is_made_for_each_operations_return_type(
    tmp_path: Path,
) -> None:
    """A slot's operation gets the declared type through the bound group's typed codec
    (made when the group is bound), plain and through options(); an operation's own
    codec replaces the group's."""
    from flightgroup.typed import TypedCodec

    with flights.open(directory=str(tmp_path / "flights"), codec=TypedCodec()):
        assert point(3) == Point(3, 4) and type(point(3)) is Point
        result = point.options(fresh=True)(5)
        assert result.value == Point(5, 6) and type(result.value) is Point
        assert pair(2) == [2, 2]  # its own codec: plain JSON, a tuple comes back a list
