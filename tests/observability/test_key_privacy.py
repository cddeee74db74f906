"""The raw key never reaches a span or a log record at INFO or above: spans and exception
messages carry ``key_digest``'s ``<key ...>`` (of any str, a lone surrogate too) where
the key is quoted, and nothing else of a message or a stack changes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import flightgroup
from flightgroup import FlightGroup
from flightgroup._log import key_digest
from flightgroup.otel import instrument

from ..support import LONE

pytestmark = pytest.mark.timeout(60)


def test_key_digest_takes_a_lone_surrogate() -> None:
    """key_digest takes a key with a lone surrogate."""
    assert key_digest(LONE) == key_digest(LONE)
    assert len(key_digest(LONE)) == 16


def test_a_traced_call_with_a_lone_surrogate_key_returns(spans: Any) -> None:
    """A traced call whose key holds a lone surrogate returns."""
    provider, exporter = spans
    group = FlightGroup()
    instrument(group, provider)
    assert group.run_sync(LONE, lambda: 7).value == 7
    [span] = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["flightgroup.key_digest"] == key_digest(LONE)


def test_no_span_records_the_raw_key(spans: Any) -> None:
    """No span records the raw key."""
    # A flightgroup error's message names the key ("The flight of 'tenant:secret-42'
    # failed: ..."); recorded as it is in the span's exception event it would put the raw
    # key in the trace, which the docs say never happens.
    provider, exporter = spans
    key = "tenant:secret-42"
    group = FlightGroup()
    instrument(group, provider)
    # The deadline only for the flight that must time out: the failing flight's leader
    # waits for its joiner, which may take longer than any short deadline on a busy host.
    timed = FlightGroup(deadline=0.05)
    instrument(timed, provider)
    started, gate = threading.Event(), threading.Event()

    def fails() -> int:
        started.set()
        gate.wait(10)
        raise ValueError("boom")

    def lead() -> None:
        with pytest.raises(ValueError):
            group.run_sync(key, fails)

    leader = threading.Thread(target=lead)
    leader.start()
    assert started.wait(10)
    with pytest.raises(TimeoutError):  # the builtin: this caller's own wait
        group.run_sync(key, fails, timeout=0.01)
    errors: list[BaseException] = []

    def join() -> None:
        try:
            group.run_sync(key, fails, on_join=gate.set)
        except BaseException as exc:
            errors.append(exc)

    joiner = threading.Thread(target=join)
    joiner.start()
    joiner.join(10)
    leader.join(10)
    assert errors and isinstance(errors[0], flightgroup.FlightFailedError)

    def slow() -> int:
        time.sleep(0.5)
        return 1

    with pytest.raises(flightgroup.FlightTimeoutError):
        timed.run_sync(key, slow)
    finished = exporter.get_finished_spans()
    outcomes = sorted(str((s.attributes or {})["flightgroup.outcome"]) for s in finished)
    assert outcomes == ["error", "error", "timeout", "wait_timeout"], outcomes
    for span in finished:
        texts = [str(v) for v in (span.attributes or {}).values()]
        for event in span.events:
            texts += [str(v) for v in (event.attributes or {}).values()]
        texts.append(str(span.status.description))
        assert not any(key in text for text in texts), (span.name, texts)
    # The events still say what happened, with the key's digest.
    events = [e for s in finished for e in s.events if e.name == "exception"]
    assert any(key_digest(key) in str((e.attributes or {})["exception.message"]) for e in events)


def test_no_span_records_the_raw_key_a_works_error_names(spans: Any) -> None:
    """No span records the raw key that a work's error names."""
    # A work's own error may name the key in plain text ("cannot build tenant:..."):
    # the key is hidden wherever the message quotes it, not only in its repr, in the
    # leader's and the joiner's exception events.
    provider, exporter = spans
    key = "tenant:secret-42"
    group = FlightGroup()
    instrument(group, provider)
    started, gate = threading.Event(), threading.Event()

    def fails() -> int:
        started.set()
        gate.wait(10)
        raise RuntimeError(f"cannot build {key} (as {key!r})")

    errors: list[BaseException] = []

    def call(**kw: Any) -> None:
        try:
            group.run_sync(key, fails, **kw)
        except BaseException as exc:
            errors.append(exc)

    leader = threading.Thread(target=call)
    leader.start()
    assert started.wait(10)
    joiner = threading.Thread(target=call, kwargs={"on_join": gate.set})
    joiner.start()
    leader.join(10)
    joiner.join(10)
    assert sorted(type(e).__name__ for e in errors) == ["FlightFailedError", "RuntimeError"]
    finished = exporter.get_finished_spans()
    assert sorted(s.name for s in finished) == ["flightgroup.flight", "flightgroup.join"]
    for span in finished:
        (event,) = [e for e in span.events if e.name == "exception"]
        attributes = event.attributes or {}
        message = str(attributes["exception.message"])
        stack = str(attributes["exception.stacktrace"])
        assert key not in message and key not in stack, (span.name, message)
        assert f"cannot build <key {key_digest(key)}> (as <key {key_digest(key)}>)" in message


def test_a_short_key_is_hidden_only_where_it_is_quoted(spans: Any) -> None:
    """A short key is hidden only where an error quotes it."""
    # A key of fewer than 4 characters would match unrelated text of a stack trace
    # ("File", line numbers): only its repr is replaced (docs/observability.md).
    provider, exporter = spans
    group = FlightGroup()
    instrument(group, provider)

    def fails() -> int:
        raise RuntimeError("id 7 and '7'")

    with pytest.raises(RuntimeError):
        group.run_sync("7", fails)
    (span,) = exporter.get_finished_spans()
    (event,) = [e for e in span.events if e.name == "exception"]
    message = str((event.attributes or {})["exception.message"])
    assert message == f"id 7 and <key {key_digest('7')}>", message


def test_a_key_in_a_frames_file_or_source_line_is_left_as_it_is(spans: Any) -> None:
    """A key in a frame's file name or source line is left as it is."""
    # The plain key is hidden in the exceptions' own lines; a frame's file name or
    # source line that merely contains it stays readable.
    provider, exporter = spans
    key = "tests"  # this file's path holds it
    group = FlightGroup()
    instrument(group, provider)

    def fails() -> int:
        raise RuntimeError("the tests failed")

    with pytest.raises(RuntimeError):
        group.run_sync(key, fails)
    (span,) = exporter.get_finished_spans()
    (event,) = [e for e in span.events if e.name == "exception"]
    attributes = event.attributes or {}
    digest = f"<key {key_digest(key)}>"
    assert attributes["exception.message"] == f"the {digest} failed"
    stack = str(attributes["exception.stacktrace"])
    # the frame's file, as it is
    assert "/tests/observability/test_key_privacy.py" in stack
    assert stack.endswith(f"RuntimeError: the {digest} failed\n"), stack


def test_a_key_in_a_syntax_errors_own_file_line_is_hidden(spans: Any) -> None:
    """A key in a SyntaxError's own file line is hidden."""
    # A SyntaxError's own '  File "<name>", line N' line is its text, not a frame: the
    # key there is hidden (a frame's chunk is told by the frames, not by its prefix).
    provider, exporter = spans
    key = "tenant:42"
    group = FlightGroup()
    instrument(group, provider)

    def work() -> Any:  # a template compiled under the name of the key it renders
        return compile("x = = 1", f"<template {key}>", "exec")

    with pytest.raises(SyntaxError):
        group.run_sync(key, work)
    (span,) = exporter.get_finished_spans()
    (event,) = [e for e in span.events if e.name == "exception"]
    stack = str((event.attributes or {})["exception.stacktrace"])
    assert key not in stack, stack
    assert f'File "<template <key {key_digest(key)}>>", line 1' in stack, stack
