"""flightgroup.otel.instrument() and the group it instruments: a span processor that raises
changes no call, and a subclass of FlightGroup stays that subclass.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from flightgroup import FlightGroup
from flightgroup.otel import instrument

pytestmark = pytest.mark.timeout(30)


class _Broken(SpanProcessor):
    """A span processor that raises (an exporter plugin with a bug)."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "start":
            raise RuntimeError("broken on_start")

    def on_end(self, span: Any) -> None:
        if self.where == "end":
            raise RuntimeError("broken on_end")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["start", "end"])
def test_a_raising_span_processor_changes_no_call(where: str) -> None:
    """A span processor that raises changes no call."""
    provider = TracerProvider()
    provider.add_span_processor(_Broken(where))
    group = FlightGroup()
    instrument(group, provider)
    assert group.run_sync("k", lambda: 7).value == 7

    def fails() -> int:
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        group.run_sync("k", fails)

    async def work() -> int:
        return 8

    assert asyncio.run(group.run("k", work)).value == 8

    @group.coalesce(key=lambda n: str(n))
    def double(n: int) -> int:
        return 2 * n

    @group.coalesce(key=lambda n: str(n))
    async def triple(n: int) -> int:
        return 3 * n

    assert double(4) == 8
    assert asyncio.run(triple(4)) == 12


@pytest.mark.timeout(60)
def test_instrument_keeps_a_subclass_of_the_group(spans: Any) -> None:
    """instrument() keeps a subclass of FlightGroup as it is."""
    # The traced class derives from the group's own class: one derived from FlightGroup
    # itself would raise TypeError for a subclass with a __dict__ (another layout) and
    # drop a slotted subclass's methods.
    provider, exporter = spans

    class Mine(FlightGroup):
        def hello(self) -> str:
            return "hi"

    class Slotted(FlightGroup):
        __slots__ = ()

        def hello(self) -> str:
            return "hi"

    for cls in (Mine, Slotted):
        group = cls()
        instrument(group, provider)
        instrument(group, provider)  # twice is a no-op
        assert isinstance(group, cls)
        assert group.hello() == "hi"
        assert group.run_sync("k", lambda: 1).value == 1
    assert [s.name for s in exporter.get_finished_spans()] == ["flightgroup.flight"] * 2
