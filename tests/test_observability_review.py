"""Review findings in the CLI, Prometheus export, OpenTelemetry spans and logs: each
test failed before its fix."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from flightgroup import JSON, FlightGroup
from flightgroup._log import key_digest
from flightgroup.otel import instrument

pytestmark = pytest.mark.timeout(60)

PY = sys.executable
LONE = "tenant:\udcff"  # a lone surrogate: what a non-UTF-8 argv byte becomes in Python


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


# -- a key with a lone surrogate ------------------------------------------------------


def test_key_digest_takes_a_lone_surrogate() -> None:
    assert key_digest(LONE) == key_digest(LONE)
    assert len(key_digest(LONE)) == 16


def test_a_directory_call_with_a_lone_surrogate_key_ends(directory: str) -> None:
    # The directory scope allows such keys; its DEBUG log line computed the key's
    # digest eagerly and raised in the background loop, so the call never ended.
    with FlightGroup(directory=directory, codec=JSON) as group:
        result = group.run_sync(LONE, lambda: 7, timeout=10)
    assert result.value == 7 and not result.joined


def test_a_traced_call_with_a_lone_surrogate_key_returns(spans: Any) -> None:
    provider, exporter = spans
    group = FlightGroup()
    instrument(group, provider)
    assert group.run_sync(LONE, lambda: 7).value == 7
    [span] = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["flightgroup.key_digest"] == key_digest(LONE)


def test_cli_run_with_a_key_that_is_not_utf8(directory: str) -> None:
    key = os.fsencode("build:") + b"\xff"
    proc = subprocess.run(
        [PY, "-m", "flightgroup", "run", "--key", key, "--dir", directory, "--", "echo", "hi"],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"hi\n"
