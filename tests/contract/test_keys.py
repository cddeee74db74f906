"""Keys, in every scope: a key that is a str subclass (a StrEnum member) is the key its
characters spell, never unpacked as a decorated function's (namespace, key) pair.
"""

from __future__ import annotations

import enum
import threading

import pytest

from flightgroup import (
    FlightGroup,
)

from ..infleet import never
from ..ingroup import scope_groups
from ..support import in_thread, outcome, wait_until


class Report(enum.StrEnum):
    DAILY = "daily"
    Q1 = "q1"

    def __str__(self) -> str:  # what a subclass's str() says is not the key
        return f"Report.{self.name}"


class Named(str):
    pass


@pytest.mark.parametrize("key", [Report.DAILY, Report.Q1, Named("q1")], ids=str)
def test_a_str_subclass_key_is_the_key_its_characters_spell(g: FlightGroup, key: str) -> None:
    """A str subclass key (a StrEnum member) is the key its characters spell."""
    gate, started = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        assert gate.wait(10)
        return "v"

    leader, led = in_thread(g.run_sync, key, work)
    assert started.wait(10)
    joined = threading.Event()
    # the plain str of the same characters joins the subclass's flight, in every scope
    joiner, got = in_thread(g.run_sync, str.__str__(key), never, on_join=joined.set)
    assert joined.wait(10)
    gate.set()
    leader.join(10)
    joiner.join(10)
    assert (outcome(led).value, outcome(got).value, outcome(got).joined) == ("v", "v", True)
    g.forget(key)
    assert g.run_sync(str.__str__(key), lambda: "after").value == "after"


@pytest.mark.parametrize("scope", ["directory", "fleet"])
def test_a_str_subclass_key_meets_its_plain_key_across_groups(
    request: pytest.FixtureRequest, scope: str
) -> None:
    """A str subclass key meets its plain key across the groups of one scope.

    Two groups of one scope meet only in the scope (each has its own table): a two-character
    StrEnum key is sent as the key its characters spell, so one of them leads and the other
    joins."""
    a, b = scope_groups(request, scope, 2, lease=5.0)
    gate, started = threading.Event(), threading.Event()

    def work(name: str) -> str:
        started.set()
        assert gate.wait(10)
        return name

    @a.coalesce(key=lambda report: report, name="reports")
    def build_a(report: str) -> str:
        return work("a")

    @b.coalesce(key=lambda report: report, name="reports")
    def build_b(report: str) -> str:
        raise AssertionError("a joiner's work never runs")

    try:
        for lead, join in [
            (lambda: a.run_sync(Report.Q1, lambda: work("a")).value, lambda j: b.run_sync(
                "q1", never, on_join=j).joined),
            (lambda: build_a(Report.Q1), None),
        ]:
            gate.clear()
            started.clear()
            leader, led = in_thread(lead)
            assert started.wait(10)
            if join is not None:
                joined = threading.Event()
                joiner, got = in_thread(join, joined.set)
                assert joined.wait(10)
            else:  # the decorated twin in the other group, with the plain key
                joiner, got = in_thread(build_b, "q1")
                wait_until(lambda: b.stats().joins == 2, "the decorated call joins")
            gate.set()
            leader.join(10)
            joiner.join(10)
            assert outcome(led) == "a"
            assert outcome(got) in (True, "a"), got
    finally:
        a.close()
        b.close()


