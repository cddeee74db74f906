"""Review findings in the CLI, Prometheus export, OpenTelemetry spans and logs: each
test failed before its fix."""

from __future__ import annotations

import asyncio
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

import flightgroup
from flightgroup import JSON, FlightGroup
from flightgroup._log import key_digest
from flightgroup.otel import instrument

pytestmark = pytest.mark.timeout(60)

PY = sys.executable
LONE = "tenant:\udcff"  # a lone surrogate: what a non-UTF-8 argv byte becomes in Python


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


# -- status --watch and a closed stdout ------------------------------------------------


def _read_until(fd: int, needle: bytes, timeout: float = 20.0) -> bytes:
    got = b""
    end = time.monotonic() + timeout
    while needle not in got:
        left = end - time.monotonic()
        assert left > 0, got
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # a pty whose other side closed
                chunk = b""
            assert chunk, got
            got += chunk
    return got


def _watch(directory: str, stdout: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [PY, "-m", "flightgroup", "status", "--watch", "--dir", directory],
        stdout=stdout, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_status_watch_on_a_pipe_writes_no_screen_codes(directory: str) -> None:
    # Clearing the screen is for a terminal; into a pipe or a log file the escape
    # codes are only noise (as the run's progress line, shown on a terminal only).
    proc = _watch(directory, subprocess.PIPE)
    assert proc.stdout is not None
    try:
        text = _read_until(proc.stdout.fileno(), b"no flights in progress")
        text += _read_until(proc.stdout.fileno(), b"no flights in progress")  # a redraw
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert b"\x1b" not in text, text
    assert b"flightgroup status (" in text


def test_status_watch_on_a_terminal_clears_the_screen(directory: str) -> None:
    main, tty = pty.openpty()
    try:
        proc = _watch(directory, tty)
        os.close(tty)
        try:
            text = _read_until(main, b"no flights in progress")
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=20)
    finally:
        os.close(main)
    assert proc.returncode == 0, err
    assert text.startswith(b"\x1b[H\x1b[2J"), text


@pytest.mark.parametrize("watch", [False, True])
def test_status_into_a_closed_pipe_has_no_traceback(directory: str, watch: bool) -> None:
    # `flightgroup status --watch --json | head -1`: the reader leaves.
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run(
        [PY, "-m", "flightgroup", "status", "--json", "--dir", directory,
         *(["--watch"] if watch else [])],
        stdout=write, stderr=subprocess.PIPE, timeout=30, check=False,
    )  # fmt: skip
    os.close(write)
    assert b"Traceback" not in proc.stderr, proc.stderr
    assert b"Exception ignored" not in proc.stderr, proc.stderr
    assert proc.returncode == 141  # 128 + SIGPIPE, as a shell reports a command it killed


# -- OpenTelemetry: the span path never changes a call's outcome ------------------------


class _Broken(SpanProcessor):
    """A span processor that raises (a buggy exporter plugin)."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "start":
            raise RuntimeError("broken on_start")

    def on_end(self, span: Any) -> None:
        if self.where == "end":
            raise RuntimeError("broken on_end")


@pytest.mark.parametrize("where", ["start", "end"])
def test_a_raising_span_processor_changes_no_call(where: str) -> None:
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


def test_no_span_records_the_raw_key(spans: Any) -> None:
    # A flightgroup error's message names the key ("The flight of 'tenant:secret-42'
    # failed: ..."); recorded as the span's exception event it put the raw key in the
    # trace, which the docs say never happens.
    provider, exporter = spans
    key = "tenant:secret-42"
    group = FlightGroup(deadline=0.05)
    instrument(group, provider)
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
        group.run_sync(key, slow)
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
    # A work's own error may name the key in plain text ("cannot build tenant:..."):
    # only its repr was replaced, so the raw key reached the leader's and the joiner's
    # exception events (review, 2026-12-01).
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
    # The plain key is hidden in the exceptions' own lines; a frame's file name or
    # source line that merely contains it stays readable (review of 2026-12-01).
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
    assert "/tests/observability/test_observability_review.py" in stack
    assert stack.endswith(f"RuntimeError: the {digest} failed\n"), stack


def test_a_key_in_a_syntax_errors_own_file_line_is_hidden(spans: Any) -> None:
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


def test_instrument_keeps_a_subclass_of_the_group(spans: Any) -> None:
    # instrument() swapped any group to a subclass of FlightGroup itself: a subclass
    # with a __dict__ raised TypeError (layout differs), a slotted one lost its methods.
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
