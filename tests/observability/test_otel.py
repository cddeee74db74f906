"""flightgroup.otel: spans per flight and per joined call, checked with the SDK's in-memory
exporter.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode, get_tracer

import flightgroup
from flightgroup import JSON, FlightGroup
from flightgroup.otel import instrument

pytestmark = pytest.mark.timeout(30)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_one_flight_span_and_linked_join_spans(spans: Any) -> None:
    provider, exporter = spans
    group = FlightGroup()
    instrument(group, provider)
    inner = get_tracer("test", tracer_provider=provider)
    started = asyncio.Event()
    gate = asyncio.Event()

    async def work() -> str:
        with inner.start_as_current_span("work-inside"):
            started.set()
            await gate.wait()
        return "v"

    async def main() -> list[Any]:
        leader = asyncio.ensure_future(group.run("tenant:42", work))
        await started.wait()
        joiners = [asyncio.ensure_future(group.run("tenant:42", work)) for _ in range(3)]
        await asyncio.sleep(0)
        gate.set()
        return await asyncio.gather(leader, *joiners)

    results = asyncio.run(main())
    token = results[0].token
    [flight] = named(exporter, "flightgroup.flight")
    joins = named(exporter, "flightgroup.join")
    assert len(joins) == 3
    assert flight.attributes is not None
    assert dict(flight.attributes) == {
        "flightgroup.scope": "process",
        "flightgroup.key_digest": digest("tenant:42"),
        "flightgroup.joined": False,
        "flightgroup.token": token,
        "flightgroup.outcome": "value",
    }
    for join in joins:
        assert join.attributes is not None
        assert join.attributes["flightgroup.joined"] is True
        assert join.attributes["flightgroup.token"] == token
        assert join.attributes["flightgroup.outcome"] == "value"
        assert [link.context.span_id for link in join.links] == [flight.context.span_id]
    # The work's own spans are children of the flight's span; the raw key is nowhere.
    [inside] = named(exporter, "work-inside")
    assert inside.parent is not None and inside.parent.span_id == flight.context.span_id
    for span in exporter.get_finished_spans():
        assert "tenant:42" not in str(span.attributes)


def test_a_failure_marks_every_span_and_sync_and_decorated_calls_are_traced(spans: Any) -> None:
    provider, exporter = spans
    group = FlightGroup()
    instrument(group, provider)
    instrument(group, provider)  # twice: still one span per call
    started, gate = threading.Event(), threading.Event()

    def fail() -> None:
        started.set()
        gate.wait(10)
        raise ValueError("broken")

    errors: list[BaseException] = []

    def joiner() -> None:
        try:
            group.run_sync("k", fail)
        except BaseException as exc:
            errors.append(exc)

    leader = threading.Thread(target=joiner)
    leader.start()
    assert started.wait(10)
    other = threading.Thread(target=joiner)
    other.start()
    while group.stats().joins < 1:
        threading.Event().wait(0.001)
    gate.set()
    leader.join(10)
    other.join(10)
    assert sorted(type(e).__name__ for e in errors) == ["FlightFailedError", "ValueError"]
    [flight] = named(exporter, "flightgroup.flight")
    [join] = named(exporter, "flightgroup.join")
    for span in (flight, join):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes is not None and span.attributes["flightgroup.outcome"] == "error"
    assert join.attributes is not None and join.attributes["flightgroup.joined"] is True
    # the failed joiner's span still names the flight's token, and links to its span
    assert flight.attributes is not None
    assert join.attributes["flightgroup.token"] == flight.attributes["flightgroup.token"]
    assert [link.context.span_id for link in join.links] == [flight.context.span_id]

    @group.coalesce(key=lambda n: f"n:{n}")
    def double(n: int) -> int:
        return 2 * n

    assert double(4) == 8
    flights = named(exporter, "flightgroup.flight")
    assert len(flights) == 2
    assert flights[-1].attributes is not None
    assert flights[-1].attributes["flightgroup.key_digest"] == digest("n:4")


def test_fleet_spans_carry_the_scope_and_the_shared_token(
    spans: Any, redis_server: Any, namespace: str
) -> None:
    provider, exporter = spans
    a = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON)
    b = FlightGroup(redis=redis_server.url, namespace=namespace, codec=JSON)
    instrument(a, provider)
    instrument(b, provider)
    started, gate = threading.Event(), threading.Event()

    def work() -> int:
        started.set()
        gate.wait(10)
        return 7

    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(a.run_sync("k", work)))
    thread.start()
    try:
        assert started.wait(10)
        joined = b.run_sync("k", work, on_join=gate.set)
        thread.join(10)
    finally:
        gate.set()
        a.close()
        b.close()
    assert joined.joined and joined.value == 7 and out[0].token == joined.token
    [flight] = named(exporter, "flightgroup.flight")
    [join] = named(exporter, "flightgroup.join")
    assert flight.attributes is not None and join.attributes is not None
    assert flight.attributes["flightgroup.scope"] == "fleet"
    assert join.attributes["flightgroup.token"] == flight.attributes["flightgroup.token"]


def test_bad_input_still_raises_at_once(spans: Any) -> None:
    provider, exporter = spans
    group = FlightGroup()
    instrument(group, provider)
    with pytest.raises(TypeError):
        group.run_sync("k", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        group.run_sync("", lambda: 1)
    assert exporter.get_finished_spans() == ()
    assert isinstance(group, flightgroup.FlightGroup)


def test_a_kept_failure_and_a_failure_led_elsewhere_name_their_flights_token(
    spans: Any, directory: str
) -> None:
    """A call served a kept failure, and a joiner whose flight failed in another group of
    the directory, raise errors that name no token: their spans still carry the flight's,
    as the spans of calls that returned a Result do."""
    provider, exporter = spans
    kept = FlightGroup(retention=flightgroup.Retention(error=60.0))
    instrument(kept, provider)

    def fail() -> None:
        raise ValueError("broken")

    with pytest.raises(ValueError):
        kept.run_sync("k", fail)
    with pytest.raises(flightgroup.FlightFailedError):
        kept.run_sync("k", fail)  # the kept failure
    [flight] = named(exporter, "flightgroup.flight")
    [join] = named(exporter, "flightgroup.join")
    assert flight.attributes is not None and join.attributes is not None
    assert join.attributes["flightgroup.token"] == flight.attributes["flightgroup.token"]
    assert join.attributes["flightgroup.outcome"] == "error"
    exporter.clear()

    a = FlightGroup(directory=directory, codec=JSON)
    b = FlightGroup(directory=directory, codec=JSON)
    instrument(a, provider)
    instrument(b, provider)
    started, gate = threading.Event(), threading.Event()

    def fail_later() -> None:
        started.set()
        gate.wait(10)
        raise ValueError("broken")

    errors: list[BaseException] = []

    def lead() -> None:
        try:
            a.run_sync("k", fail_later)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=lead)
    thread.start()
    try:
        assert started.wait(10)
        with pytest.raises(flightgroup.FlightFailedError):
            b.run_sync("k", fail_later, on_join=gate.set)
        thread.join(10)
    finally:
        gate.set()
        a.close()
        b.close()
    assert [type(e) for e in errors] == [ValueError]
    [flight] = named(exporter, "flightgroup.flight")
    [join] = named(exporter, "flightgroup.join")
    assert flight.attributes is not None and join.attributes is not None
    assert flight.attributes["flightgroup.scope"] == "directory"
    assert join.attributes["flightgroup.token"] == flight.attributes["flightgroup.token"]
    assert join.attributes["flightgroup.token"] >> 32 >= 1  # a directory token: the epoch


def test_a_str_subclass_key_is_traced_as_its_characters(spans: Any) -> None:
    """A StrEnum member's call is traced like the plain key it spells (a str subclass is
    a key, not a reason to pass the call on untraced)."""
    import enum

    class Report(enum.StrEnum):
        DAILY = "tenant:42"

    provider, exporter = spans
    group = FlightGroup()
    instrument(group, provider)
    assert group.run_sync(Report.DAILY, lambda: 1).value == 1
    assert asyncio.run(group.run(Report.DAILY, _one)).value == 1
    finished = exporter.get_finished_spans()
    assert len(finished) == 2, finished
    for span in finished:
        assert span.attributes is not None
        assert span.attributes["flightgroup.key_digest"] == digest("tenant:42")


async def _one() -> int:
    return 1


