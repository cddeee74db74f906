"""Issue 29: a decorated function with the typed codec returns its declared type to every
caller, in every scope, the leader too: a dataclass, a NamedTuple, a tuple, a set and a
dict with int keys come back equal and of that type; a value that does not match fails
in the leader, naming the operation and the type, and its joiners get FlightFailedError."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import threading
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

from flightgroup import FlightFailedError, FlightGroup
from flightgroup.typed import TypedCodec

from ...ingroup import Background
from ...support import wait_until
from .conftest import Scope


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    quantity: int
    price: decimal.Decimal


@dataclasses.dataclass(frozen=True)
class Report:
    day: datetime.date
    lines: list[Line]
    tags: frozenset[str]


class Point(NamedTuple):
    x: int
    y: int


REPORT = Report(
    datetime.date(2026, 12, 2),
    [Line("a-1", 2, decimal.Decimal("9.99")), Line("b-2", 1, decimal.Decimal("0.10"))],
    frozenset({"daily", "eu"}),
)

# (declared return type, the value the work returns, the type every caller gets)
CASES: dict[str, tuple[Any, Any, type]] = {
    "dataclass": (Report, REPORT, Report),
    "namedtuple": (Point, Point(3, -4), Point),
    "tuple": (tuple[int, str, uuid.UUID], (7, "seven", uuid.UUID(int=7)), tuple),
    "set": (set[datetime.date], {datetime.date(2026, 1, 1), datetime.date(2026, 2, 1)}, set),
    "dict_int_keys": (dict[int, Line], {1: REPORT.lines[0], 20: REPORT.lines[1]}, dict),
}


def declared(returns: Any, work: Callable[[], Any]) -> Callable[[], Any]:
    """``work`` as a function whose declared return type is ``returns``."""

    def operation() -> Any:
        return work()

    operation.__annotations__ = {"return": returns}
    return operation


class Gate:
    """A work that runs until released, then returns ``value``; counts its runs."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.started, self.released = threading.Event(), threading.Event()
        self.runs = 0

    def __call__(self) -> Any:
        self.runs += 1
        self.started.set()
        assert self.released.wait(30), "the test never released the work"
        return self.value


def typed_op(g: FlightGroup, returns: Any, gate: Gate) -> Callable[[], Any]:
    """The same operation in ``g`` (one namespace in every group), with the typed codec."""
    return g.coalesce(key=lambda: "report", name="typed-report", codec=TypedCodec())(
        declared(returns, gate)
    )


@pytest.mark.parametrize("case", CASES)
def test_every_caller_in_every_process_gets_the_declared_type(
    wide: Scope, case: str
) -> None:
    """Done when of issue 29: the leader, a joiner beside it and a joiner in another
    process each get a value equal to the work's and of the declared type."""
    returns, value, kind = CASES[case]
    a, b = wide.pair()
    gate = Gate(value)
    in_a, in_b = typed_op(a, returns, gate), typed_op(b, returns, gate)
    leader = Background(in_a)
    assert gate.started.wait(15), "the leader's work never started"
    beside = Background(in_a)
    elsewhere = Background(in_b)
    wait_until(lambda: a.stats().joins == 1, "a joiner beside the leader")
    wait_until(lambda: b.stats().joins == 1, "a joiner in another process")
    gate.released.set()
    got = [leader.wait(), beside.wait(), elsewhere.wait()]
    assert gate.runs == 1
    for each in got:
        assert type(each) is kind
        assert each == value
    if case == "dataclass":  # nested values keep their types too
        assert all(type(line.price) is decimal.Decimal for line in got[2].lines)
        assert type(got[2].tags) is frozenset


def test_every_caller_gets_decoded_copies_not_the_works_object(scope: Scope) -> None:
    """The typed codec makes every scope's callers get decode(encode(value)): equal to
    the work's value and of its type, never the very object (the process scope too)."""
    g = scope.group()
    gate = Gate(REPORT)
    report = typed_op(g, Report, gate)
    leader = Background(report)
    assert gate.started.wait(15)
    joiner = Background(report)
    wait_until(lambda: g.stats().joins == 1, "the second call joined")
    gate.released.set()
    got = [leader.wait(), joiner.wait()]
    assert got == [REPORT, REPORT]
    assert all(type(each) is Report and each is not REPORT for each in got)


def test_a_value_not_of_the_declared_type_fails_in_the_leader_its_joiners_get_flight_failed(
    scope: Scope,
) -> None:
    """The leader's encode checks the value: a TypeError naming the operation and the
    type for the leader, FlightFailedError (error_type TypeError) for its joiner."""
    g = scope.group()
    gate = Gate({"day": "not a report"})
    report = typed_op(g, Report, gate)
    leader = Background(report)
    assert gate.started.wait(15)
    joiner = Background(report)
    wait_until(lambda: g.stats().joins == 1, "the second call joined")
    gate.released.set()
    assert leader.done.wait(15) and joiner.done.wait(15)
    assert isinstance(leader.error, TypeError)
    assert "typed-report" in str(leader.error)
    assert "Report" in str(leader.error)
    assert isinstance(joiner.error, FlightFailedError)
    assert joiner.error.error_type == "TypeError"
    assert "typed-report" in joiner.error.message
    assert "Report" in joiner.error.message
