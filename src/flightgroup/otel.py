"""OpenTelemetry spans for a group (extra ``flightgroup[otel]``: opentelemetry-api only).

``instrument(group, tracer_provider=None)`` makes every call of the group a span:

- ``flightgroup.flight`` in the leader (one per flight: the leading call's span, in
  which the work runs, so the work's own spans are its children);
- ``flightgroup.join`` for each call that joined a flight (or was served a kept
  outcome), with a link to the flight's span when the flight was led in this process
  (in other processes, ``flightgroup.token`` ties them together).

Attributes: ``flightgroup.scope`` (process, directory, fleet), ``flightgroup.key_digest``
(the first 16 hex digits of the key's SHA-256: keys can hold tenant ids, so the raw
key is never recorded), ``flightgroup.token`` (when known), ``flightgroup.joined``,
``flightgroup.outcome`` (value, error, timeout, interrupted, lease_lost, closed,
cancelled, wait_timeout). A failure sets the span's status to ERROR.

An uninstrumented group pays nothing: ``instrument`` switches the group to a traced
subclass of its own, so the plain class has no tracing branch on its hot path.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import traceback
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.trace import SpanContext, Status, StatusCode, TracerProvider

from ._forksafe import renew_after_fork
from ._log import key_digest
from .engine.flight import Flight
from .errors import (
    FlightError,
    FlightInterruptedError,
    FlightTimeoutError,
    GroupClosedError,
    LeaseLostError,
)
from .group import FlightGroup, Result, internals
from .lease import current_lease
from .policy import FlightPolicy

__all__ = ["instrument"]

T = TypeVar("T")

_SCOPE_NAME = "flightgroup"
_MAX_LINKS = 10_000  # span contexts of recent flights led here, for joiners' links
_TOKEN = "_flightgroup_token"  # set on a delivered FlightError: its flight's token


class _Links:
    """The span context of each recent flight led in this process, by (key, token)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        renew_after_fork(self)
        self._contexts: collections.OrderedDict[tuple[str, int], SpanContext] = (
            collections.OrderedDict()
        )

    def put(self, key: str, token: int, context: SpanContext) -> None:
        with self._lock:
            self._contexts[(key, token)] = context
            if len(self._contexts) > _MAX_LINKS:
                self._contexts.popitem(last=False)

    def get(self, key: str, token: int) -> SpanContext | None:
        with self._lock:
            return self._contexts.get((key, token))


class _Call:
    """One traced call: its span, and whether its own work ran (it led)."""

    __slots__ = ("key", "led", "span", "token")

    def __init__(self, span: trace.Span, key: str) -> None:
        self.span = span
        self.key = key
        self.led = False
        self.token: int | None = None


def _outcome_of(error: BaseException) -> str:
    if isinstance(error, LeaseLostError):
        return "lease_lost"
    if isinstance(error, FlightTimeoutError):
        return "timeout"
    if isinstance(error, FlightInterruptedError):
        return "interrupted"
    if isinstance(error, GroupClosedError):
        return "closed"
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    if isinstance(error, TimeoutError):
        return "wait_timeout"
    return "error"


# A key shorter than this is replaced only in its repr: its plain text would match
# unrelated words and numbers of a stack trace ("File", line numbers).
_PLAIN_MIN = 4


def _private(error: BaseException, key: str) -> dict[str, str] | None:
    """The message and stack trace of an exception event, with the key (its repr, which
    flightgroup's own messages hold: "The flight of 'tenant:42' failed: ...", and its
    plain text, which a work's own message may hold) shown as its digest, since a span
    never records the raw key. The plain text is replaced only in the exceptions' own
    lines, not in a frame's file name or source line. None: nothing to hide."""
    shown = repr(key)
    plain = key if len(key) >= _PLAIN_MIN else None
    try:
        text = str(error)
    except Exception:  # (record_exception calls str() too, and fails the same way)
        return None
    formatted = traceback.TracebackException.from_exception(error)
    chunks = list(formatted.format())
    stack = "".join(chunks)
    if shown not in stack and (plain is None or plain not in stack):
        return None
    digest = f"<key {key_digest(key)}>"
    frames = _frame_chunks(formatted)

    def hide(part: str, frame: bool) -> str:
        part = part.replace(shown, digest)
        return part if plain is None or frame else part.replace(plain, digest)

    stack = "".join(hide(chunk, chunk in frames) for chunk in chunks)
    return {"exception.message": hide(text, False), "exception.stacktrace": stack}


def _frame_chunks(formatted: traceback.TracebackException) -> set[str]:
    """The formatted frames (file, line, source) of an exception and of every one it
    chains to: the chunks of a stack trace that are code, not the exceptions' text."""
    frames: set[str] = set()
    seen: set[int] = set()
    todo = [formatted]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        frames.update(current.stack.format())
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
        todo += getattr(current, "exceptions", None) or []
    return frames


def instrument(group: FlightGroup, tracer_provider: TracerProvider | None = None) -> None:
    """Trace every call of ``group`` (see the module). Instrumenting twice is a no-op."""
    if isinstance(group, _Traced):
        return
    tracer = trace.get_tracer(_SCOPE_NAME, tracer_provider=tracer_provider)
    wide = internals(group).scope
    scope = "process" if wide is None else wide.kind
    # A subclass of FlightGroup stays one: the traced class derives from it too (else a
    # subclass with a __dict__ cannot take the swap, and a slotted one loses its methods).
    # It comes first so that the traced class's layout is its own (the swap needs that);
    # its overrides run around the traced methods, which they reach through super().
    base = type(group)
    bases: tuple[type, ...] = (_Traced,) if base is FlightGroup else (base, _Traced)
    namespace: dict[str, Any] = {"_tracer": tracer, "_scope_kind": scope, "_links": _Links()}
    if not base.__dictoffset__:  # slotted like FlightGroup: the same layout, no __dict__
        namespace["__slots__"] = ()
    traced = type(f"Traced{base.__name__}", bases, namespace)
    group.__class__ = traced


class _Traced(FlightGroup):
    """The methods a traced group overrides; made per instrument() call with its tracer."""

    __slots__ = ()
    _tracer: trace.Tracer
    _scope_kind: str
    _links: _Links

    def _begin(self, key: str) -> _Call:
        try:
            span = self._tracer.start_span(
                "flightgroup.call",
                attributes={
                    "flightgroup.scope": self._scope_kind,
                    "flightgroup.key_digest": key_digest(key),
                },
            )
        except Exception:
            # Tracing must never change a call: a span processor that raises in
            # on_start (the SDK does not catch it) leaves this call untraced.
            span = trace.INVALID_SPAN
        return _Call(span, key)

    def _mark(self, call: _Call) -> None:
        """In the work (the leader): remember the flight's span for joiners' links."""
        call.led = True
        try:
            token = current_lease().token
            call.token = token
            self._links.put(call.key, token, call.span.get_span_context())
        except Exception:  # (or LookupError) this runs inside the work: never fail it
            return

    def _deliver(self, flight: Flight, leader: bool) -> Result[Any]:
        try:
            return super()._deliver(flight, leader)
        except FlightError as exc:
            # A joiner's error (or a kept failure's) names no token: the span reads the
            # flight's from it. Each caller's instance is its own (errors.renewed).
            exc.__dict__[_TOKEN] = flight.token
            raise

    def _end(self, call: _Call, result: Result[Any] | None, error: BaseException | None) -> None:
        # Tracing must never change a call: whatever the span path raises (a span
        # processor's on_end, an exporter plugin) is dropped, the call returns or
        # raises what it would untraced.
        try:
            self._finish(call, result, error)
        except Exception:
            return

    def _finish(
        self, call: _Call, result: Result[Any] | None, error: BaseException | None
    ) -> None:
        span = call.span
        joined = not call.led
        if result is not None:
            token: int | None = result.token
        elif call.token is not None:
            token = call.token
        else:
            token = getattr(error, "__dict__", {}).get(_TOKEN)
        if result is not None:
            joined = result.joined
        span.update_name("flightgroup.join" if joined else "flightgroup.flight")
        span.set_attribute("flightgroup.joined", joined)
        if token is not None:
            span.set_attribute("flightgroup.token", token)
            if joined:
                linked = self._links.get(call.key, token)
                if linked is not None:
                    span.add_link(linked)
        if error is None:
            span.set_attribute("flightgroup.outcome", "value")
        else:
            span.set_attribute("flightgroup.outcome", _outcome_of(error))
            span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
            if isinstance(error, Exception):
                span.record_exception(error, attributes=_private(error, call.key))
        span.end()

    def _async_work(
        self, call: _Call, work: Callable[[], Awaitable[T]]
    ) -> Callable[[], Awaitable[T]]:
        def traced() -> Awaitable[T]:
            self._mark(call)
            return work()

        return traced

    def _sync_work(self, call: _Call, work: Callable[[], T]) -> Callable[[], T]:
        def traced() -> T:
            self._mark(call)
            return work()

        return traced

    async def run(self, key: str, work: Callable[[], Awaitable[T]], **kwargs: Any) -> Result[T]:
        if not callable(work) or not isinstance(key, str) or not key:  # the plain checks raise
            return await super().run(key, work, **kwargs)
        key = str.__str__(key)  # a subclass's (StrEnum's) key is its characters
        call = self._begin(key)
        with trace.use_span(call.span, end_on_exit=False, record_exception=False,
                            set_status_on_exception=False):
            try:
                result = await super().run(key, self._async_work(call, work), **kwargs)
            except BaseException as exc:
                self._end(call, None, exc)
                raise
        self._end(call, result, None)
        return result

    def run_sync(self, key: str, work: Callable[[], T], **kwargs: Any) -> Result[T]:
        if not callable(work) or not isinstance(key, str) or not key:  # the plain checks raise
            return super().run_sync(key, work, **kwargs)
        key = str.__str__(key)
        call = self._begin(key)
        with trace.use_span(call.span, end_on_exit=False, record_exception=False,
                            set_status_on_exception=False):
            try:
                result = super().run_sync(key, self._sync_work(call, work), **kwargs)
            except BaseException as exc:
                self._end(call, None, exc)
                raise
        self._end(call, result, None)
        return result

    async def _run_op(
        self, tkey: Hashable, key: str, work: Callable[[], Awaitable[T]], policy: FlightPolicy
    ) -> Result[T]:
        call = self._begin(key)
        with trace.use_span(call.span, end_on_exit=False, record_exception=False,
                            set_status_on_exception=False):
            try:
                result = await super()._run_op(tkey, key, self._async_work(call, work), policy)
            except BaseException as exc:
                self._end(call, None, exc)
                raise
        self._end(call, result, None)
        return result

    def _call_sync(
        self, tkey: Hashable, key: str, work: Callable[[], T], policy: FlightPolicy
    ) -> Result[T]:
        call = self._begin(key)
        with trace.use_span(call.span, end_on_exit=False, record_exception=False,
                            set_status_on_exception=False):
            try:
                result = super()._call_sync(tkey, key, self._sync_work(call, work), policy)
            except BaseException as exc:
                self._end(call, None, exc)
                raise
        self._end(call, result, None)
        return result
