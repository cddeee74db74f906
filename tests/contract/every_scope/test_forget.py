"""docs/api.md, Calls: ``forget(key)``: the next call of the key leads a new flight, and a
kept outcome of the key is dropped; a flight in progress is detached, not stopped."""

from __future__ import annotations

import pytest

from flightgroup import FlightGroup, Retention

from ...ingroup import Background
from .conftest import Leader, Scope, joiner, never


def test_after_forget_the_next_call_leads_while_the_old_flight_serves_its_callers(
    scope: Scope, group: FlightGroup
) -> None:
    old = Leader(group, "k", "old")
    old_joiner = joiner(group, "k")
    group.forget("k")
    new = Background(lambda: group.run_sync("k", lambda: "new"))
    # Beside the old work, or (a scope whose left flights hold the key) once it ended.
    assert new.done.wait(15 * (not scope.expect.left_holds_key)) is not (
        scope.expect.left_holds_key
    )
    old.release()
    assert (new.wait().value, new.wait().joined) == ("new", False)
    assert old.result().value == "old"
    assert old_joiner.wait().value == "old"
    assert new.wait().token > old.result().token


def test_forget_drops_a_kept_outcome(scope: Scope) -> None:
    g = scope.group(retention=Retention(success=60))
    g.run_sync("k", lambda: 1)
    assert g.run_sync("k", never).joined
    g.forget("k")
    again = g.run_sync("k", lambda: 2)
    assert (again.value, again.joined) == (2, False)


def test_forget_elsewhere_lets_the_next_call_there_lead(wide: Scope) -> None:
    a, b = wide.pair()
    old = Leader(a, "k", "old")
    old_joiner = joiner(b, "k")
    b.forget("k")
    ran: list[str] = []
    new = Background(lambda: b.run_sync("k", lambda: ran.append("new") or "new"))
    if not wide.expect.left_holds_key:
        assert new.wait().value == "new"  # beside the old work
    old.release()
    assert (new.wait().value, new.wait().joined, ran) == ("new", False, ["new"])
    assert old.result().value == "old"
    assert old_joiner.wait().value == "old"


def test_forget_of_a_bad_key_raises_and_changes_nothing(group: FlightGroup) -> None:
    with pytest.raises(ValueError):
        group.forget("")
    with pytest.raises(TypeError):
        group.forget(7)  # type: ignore[arg-type]


def test_the_decorators_forget_makes_the_next_call_lead(group: FlightGroup) -> None:
    ran: list[int] = []

    @group.coalesce(key=lambda n: f"n:{n}", retention=Retention(success=60))
    def double(n: int) -> int:
        ran.append(n)
        return 2 * n

    assert (double(3), double(3), ran) == (6, 6, [3])  # kept
    double.forget(3)
    assert (double(3), ran) == (6, [3, 3])
