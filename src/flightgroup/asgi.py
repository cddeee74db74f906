"""HTTP request collapsing for ASGI applications (extra ``flightgroup[asgi]``).

:class:`CollapseRequests` wraps any ASGI 3 application (Starlette, FastAPI, a bare
callable). Identical requests that arrive while one of them runs the application share
that one run: its status, headers and body go to every caller. The group decides who
shares: one process, every worker of a host (``directory=``) or a fleet (``redis=``).

The rules (docs/asgi.md; ADR 0045):

- Only ``methods`` (GET and HEAD by default) are collapsed, and only requests without
  a body (no ``Content-Length`` above 0, no ``Transfer-Encoding``).
- The key is a SHA-256 digest of the method, scheme, ``Host``, root path, raw path,
  raw query string and the values of the ``vary`` headers. A key never carries a
  header's value in clear, so secrets never reach Redis or a status listing.
- A request with ``Authorization``, ``Proxy-Authorization`` or ``Cookie`` runs the
  application for itself, unless every such header it carries is named in ``vary``.
- ``Cache-Control: no-cache`` / ``no-store`` or ``Pragma: no-cache`` on a request runs
  the application for it alone.
- Every status is shared, 5xx included. A response is not shared when its body passes
  ``max_body_bytes``, when it sets a cookie, says ``Cache-Control: private`` or is an
  event stream, or when it uses a message beyond ``http.response.start``/
  ``http.response.body``: its leader gets it as it is, and each joiner runs the
  application for itself as soon as that is known. No caller ever gets a truncated body.
- The leader's response streams to its client as the application sends it; the
  joiners get it once it is complete. The application runs for the flight (in a task
  beside its work), on a receive channel of its own, so the leader's disconnect stops
  neither the run nor the joiners' response.

In a wide scope (or a group with a codec) the shared response crosses as this module's
own frame of bytes, through a codec of the middleware's own operation that carries bytes
as they are, whatever the group's codec is.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any, Final, final

from .errors import (
    FlightFailedError,
    FlightInterruptedError,
    FlightTimeoutError,
    GroupClosedError,
    TooManyFlightsError,
    TooManyWaitersError,
    UnavailableError,
)
from .group import FlightGroup, internals
from .policy import Retention

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "NAMESPACE",
    "ASGIApp",
    "CollapseRequests",
    "Message",
    "Receive",
    "Scope",
    "Send",
]

Scope = MutableMapping[str, Any]
"""An ASGI connection scope."""
Message = MutableMapping[str, Any]
"""An ASGI event."""
Receive = Callable[[], Awaitable[Message]]
"""An ASGI receive channel."""
Send = Callable[[Message], Awaitable[None]]
"""An ASGI send channel."""
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
"""An ASGI 3 application."""

NAMESPACE: Final = "flightgroup.asgi"
"""The default namespace of the collapsed requests' keys in their group."""

DEFAULT_MAX_BODY_BYTES: Final = 8 * 1024 * 1024
"""The default bound on a shared body, when the group can carry it."""

_HEADER_ALLOWANCE: Final = 64 * 1024  # room for a response's status and headers in a value
_PRIVATE_REQUEST: Final = frozenset({b"authorization", b"proxy-authorization", b"cookie"})
_FRAME_VERSION: Final = 1
_SHARED: Final = 1  # a frame kind: a whole response follows
_NOT_SHARED: Final = 2  # a frame kind: the joiners run the application for themselves


@final
@dataclass(frozen=True, slots=True)
class _Response:
    """A whole response, as every caller of its flight gets it."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


_NOT_SHARED_RESPONSE: Final = object()  # the process scope's "run it yourself"


@final
class CollapseRequests:
    """ASGI middleware: identical in-flight requests share one run of ``app``.

    Args:
        app: the ASGI 3 application to wrap.
        group: the FlightGroup that decides who shares (its scope: one process, a
            host's workers, a fleet). Whatever the group's codec, the middleware's
            own operation carries its responses as bytes.
        methods: the request methods that are collapsed (upper case).
        vary: request header names whose values join the key (case-insensitive).
            Naming ``authorization`` or ``cookie`` here lets requests with equal
            credentials share a response; the key holds only a digest of them.
        max_body_bytes: the largest body that is shared. A longer one streams to its
            leader in full and each joiner runs the application for itself. Default:
            8 MiB, or less when the group's ``max_value_bytes`` holds less (that bound
            less 64 KiB for the headers). A value the group cannot carry is a
            ValueError.
        role_header: a response header to name each collapsed caller's role in
            (``led`` or ``joined``), e.g. ``"x-flightgroup"``; None (default): none.
        namespace: the namespace of the requests' keys in ``group``. Middlewares over
            one group that wrap different applications need different namespaces, or
            equal requests to the two would share a run.

    Collapsed requests are flights of ``group`` in their own namespace,
    with the group's deadline, retry and takeover policy, but never kept (a flight is
    not a cache). A collapsed request's flight ends with its response: a request that
    arrives after that runs the application again.

    What a joiner answers when the flight has no shared response: 500 when the
    application raised before completing its response, 504 past the group's
    ``deadline``, 502 when the leader was interrupted (its process died), 503 when the
    group's ``limits`` refuse the call. When the group is closed or its scope is out
    of reach, the request runs the application for itself.
    """

    __slots__ = ("_app", "_carries", "_framed", "_group", "_methods", "_private", "_role",
                 "_run", "_vary", "max_body_bytes")

    def __init__(
        self,
        app: ASGIApp,
        *,
        group: FlightGroup,
        methods: Iterable[str] = ("GET", "HEAD"),
        vary: Iterable[str] = (),
        max_body_bytes: int | None = None,
        role_header: str | None = None,
        namespace: str = NAMESPACE,
    ) -> None:
        if not callable(app):
            raise TypeError("app must be an ASGI application (a callable)")
        if not isinstance(group, FlightGroup):
            raise TypeError(f"group must be a FlightGroup, got {type(group).__name__}")
        self._methods = frozenset(_names("methods", methods, upper=True))
        self._vary = tuple(sorted(set(_names("vary", vary, upper=False))))
        vary_set = frozenset(name.encode("latin-1") for name in self._vary)
        # The credentials a request may carry and still share: those in the key.
        self._private = _PRIVATE_REQUEST - vary_set
        if role_header is not None and (
            not isinstance(role_header, str) or not _is_token(role_header)
        ):
            raise ValueError("role_header must be None or a header name")
        self._role = None if role_header is None else role_header.lower().encode("latin-1")
        made = internals(group)
        # A value that is encoded (a wide scope, or a group with a codec) is a frame of
        # bytes carried by _FRAMES; else the response objects are shared as they are.
        self._framed = made.scope is not None or made.codec is not None
        self.max_body_bytes = _body_bound(
            max_body_bytes, None if made.scope is None else made.max_value_bytes
        )
        """The largest body a flight shares (bytes)."""
        self._carries = None if made.scope is None else made.max_value_bytes
        self._app = app
        self._group = group

        async def shared(key: str, work: Callable[[], Awaitable[object]]) -> object:
            return await work()

        self._run: Callable[[str, Callable[[], Awaitable[object]]], Awaitable[object]] = (
            group.coalesce(
                key=lambda key, work: key, name=namespace, retention=_NOT_KEPT,
                codec=_FRAMES if self._framed else None,
            )(shared)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection: collapse it, or hand it to the application."""
        key = self._key_of(scope)
        if key is None:
            await self._app(scope, receive, send)
            return
        leader = _Leader(scope, send, role=self._role, limit=self.max_body_bytes)
        try:
            value = await self._run(key, lambda: leader.run(self._app, self._pack))
        except asyncio.CancelledError:
            leader.open = False  # I: the run goes on for the joiners, silent here
            raise
        except (GroupClosedError, UnavailableError):
            if leader.attempts:
                await leader.finish()
                raise
            await self._app(scope, receive, send)  # the group cannot serve it: alone
            return
        except BaseException as exc:
            if leader.attempts:
                await leader.finish()
                if leader.completed and leader.error is None:
                    return  # its client has its whole response; the run ends here
                raise
            await self._fail(send, exc)
            return
        if leader.attempts:
            # I: a caller whose own work ran got its response from that run, streamed
            # (or its client left): it never gets a second one.
            await leader.finish()
            if leader.error is not None:  # (after a whole response: for the log)
                raise leader.error
            return
        response = self._unpack(value)
        if response is None:
            await self._app(scope, receive, send)  # not shared: this joiner runs it
            return
        await _replay(send, response, self._role, b"joined")

    # -- keys -------------------------------------------------------------------

    def _key_of(self, scope: Scope) -> str | None:
        """The request's key, or None when it must run the application for itself."""
        if scope["type"] != "http" or scope["method"] not in self._methods:
            return None
        headers: dict[bytes, list[bytes]] = {}
        for name, value in scope["headers"]:
            headers.setdefault(bytes(name).lower(), []).append(bytes(value))
        if not self._private.isdisjoint(headers):
            return None
        if b"transfer-encoding" in headers:
            return None
        length = headers.get(b"content-length")
        if length is not None and any(v.strip() not in (b"", b"0") for v in length):
            return None
        for directive in _tokens(headers.get(b"cache-control", ())):
            if directive in (b"no-cache", b"no-store"):
                return None
        if b"no-cache" in _tokens(headers.get(b"pragma", ())):
            return None
        digest = hashlib.sha256()
        path = scope.get("raw_path") or scope["path"].encode("utf-8")
        for part in (
            scope["method"].encode("latin-1"),
            scope.get("scheme", "http").encode("latin-1"),
            b",".join(headers.get(b"host", ())),
            scope.get("root_path", "").encode("utf-8"),
            bytes(path),
            bytes(scope.get("query_string", b"")),
        ):
            _feed(digest, part)
        for name in self._vary:
            raw = name.encode("latin-1")
            _feed(digest, raw)
            values = headers.get(raw)
            _feed(digest, b"\x00" if values is None else b"\x01" + b",".join(values))
        return digest.hexdigest()

    # -- the shared value ---------------------------------------------------------

    def _pack(self, response: _Response | None) -> object:
        """The flight's value for ``response`` (None: not shared)."""
        if not self._framed:
            return _NOT_SHARED_RESPONSE if response is None else response
        frame = _frame(response)
        if self._carries is not None and len(frame) > self._carries:
            # Headers past their allowance: the joiners run it rather than fail on it.
            return self._pack(None)
        return frame

    def _unpack(self, value: object) -> _Response | None:
        """The response a flight's value stands for (None: not shared)."""
        if isinstance(value, _Response):
            return value
        if value is _NOT_SHARED_RESPONSE:
            return None
        if isinstance(value, bytes | bytearray | memoryview):
            return _parse(bytes(value))
        raise TypeError(f"a collapsed request's flight gave {type(value).__name__}")

    async def _fail(self, send: Send, exc: BaseException) -> None:
        """Answer a joiner whose flight has no response to share (or re-raise)."""
        if isinstance(exc, FlightTimeoutError):
            status = 504
        elif isinstance(exc, FlightFailedError):
            status = 500
        elif isinstance(exc, FlightInterruptedError):
            status = 502
        elif isinstance(exc, TooManyWaitersError | TooManyFlightsError):
            status = 503
        else:
            raise exc
        body = _REASONS[status]
        await _replay(
            send,
            _Response(status, ((b"content-type", b"text/plain; charset=utf-8"),
                               (b"content-length", str(len(body)).encode())), body),
            self._role,
            b"joined",
        )

    def __repr__(self) -> str:
        return f"CollapseRequests({self._app!r}, group={self._group!r})"


_NOT_KEPT: Final = Retention(success=None, error=None)
_REASONS: Final = {
    500: b"Internal Server Error",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}


class _Leader:
    """One collapsed request's own state: what its work sent its client.

    Written by the work (on the caller's loop) and by the caller's call; both run on
    one event loop, so no lock is needed. ``open`` goes False for good when the
    call returns or the client's send fails; the work forwards nothing after that."""

    __slots__ = ("attempts", "completed", "error", "limit", "open", "role", "scope", "send",
                 "started", "tail")

    def __init__(self, scope: Scope, send: Send, *, role: bytes | None, limit: int) -> None:
        self.scope = scope
        self.send = send
        self.role = role
        self.limit = limit
        self.open = True
        self.attempts = 0  # times this caller's own work ran (0: it joined)
        self.started = False  # the response start reached this caller's client
        self.completed = False  # ... and its last body message too
        self.error: Exception | None = None  # what the app raised after the outcome
        self.tail: asyncio.Task[None] | None = None  # the latest attempt's run of the app

    async def run(self, app: ASGIApp, pack: Callable[[_Response | None], object]) -> object:
        """The flight's work: run ``app`` once, stream to this caller's client while it
        listens, and return the shared value as soon as it is known: the whole captured
        response, or "not shared" the moment the response cannot be shared (the run
        then goes on for this caller alone, in ``tail``)."""
        self.attempts += 1
        # I: one response per client: a later attempt never writes to this client.
        live = self.open and not self.started
        capture = _Capture(self.limit)
        verdict: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        async def send(message: Message) -> None:
            capture.take(message)
            if not capture.shared and not verdict.done():
                verdict.set_result(pack(None))  # the joiners need not wait for the rest
            if live and self.open:
                await self._forward(message)

        scope = dict(self.scope)
        extensions = scope.get("extensions")
        if extensions:  # the capture speaks only http.response.start and .body
            scope["extensions"] = {
                k: v for k, v in extensions.items() if not k.startswith("http.response.")
            }

        async def run_app() -> None:
            try:
                await app(scope, _no_body_then_wait(), send)
            except Exception as exc:
                if not verdict.done() and not capture.done:
                    verdict.set_exception(exc)
                else:
                    self.error = exc  # after the outcome: the leader's call raises it
            finally:
                if not verdict.done():  # I: the work never waits on a run that ended
                    verdict.set_result(pack(capture.result()))

        self.tail = tail = asyncio.ensure_future(run_app())
        try:
            return await verdict
        except asyncio.CancelledError:
            tail.cancel()  # the attempt is stopped (deadline, close): its run with it
            raise

    async def finish(self) -> None:
        """Wait for this caller's own run to end (it may stream on past the flight's
        outcome); cancelling this wait cancels that run, which serves no one else."""
        tail = self.tail
        try:
            if tail is not None and not tail.done():
                # A tail its attempt's stop cancelled ends quietly here; this call's own
                # cancel stops the tail, which serves this caller alone by now.
                try:
                    await asyncio.wait((tail,))
                except asyncio.CancelledError:
                    tail.cancel()
                    raise
        finally:
            self.open = False  # I: nothing is forwarded after this call returned

    async def _forward(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start" and self.role is not None:
            message = dict(message)
            message["headers"] = [*message.get("headers", ()), (self.role, b"led")]
        try:
            await self.send(message)
        except Exception:
            self.open = False  # the client is gone: the work goes on for the joiners
            return
        if kind == "http.response.start":
            self.started = True
        elif kind == "http.response.body" and not message.get("more_body", False):
            self.completed = True


class _Capture:
    """A response as the application sends it, kept while it may still be shared."""

    __slots__ = ("body", "done", "headers", "limit", "shared", "status")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.status = 0
        self.headers: tuple[tuple[bytes, bytes], ...] = ()
        self.body = bytearray()
        self.shared = True
        self.done = False

    def take(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start" and not self.status:
            self.status = int(message["status"])
            self.headers = tuple((bytes(n), bytes(v)) for n, v in message.get("headers", ()))
            if not _shareable(self.headers):
                self.shared = False
        elif kind == "http.response.body" and self.status and not self.done:
            if self.shared:
                self.body += message.get("body", b"")
                if len(self.body) > self.limit:
                    self.shared = False
                    self.body = bytearray()  # I: never shared, so never kept
            if not message.get("more_body", False):
                self.done = True
        else:
            self.shared = False  # trailers, pathsend, ...: not what a replay can give

    def result(self) -> _Response | None:
        if not (self.done and self.shared):
            return None
        return _Response(self.status, self.headers, bytes(self.body))


def _no_body_then_wait() -> Receive:
    """A receive channel for the flight's run: the empty request body, then nothing
    (never ``http.disconnect``: no caller's disconnect may stop the shared run)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # until the application cancels its listener
        raise AssertionError("unreachable")

    return receive


async def _replay(send: Send, response: _Response, role: bytes | None, name: bytes) -> None:
    """Send ``response`` to one client, with its role header if there is one."""
    headers = list(response.headers)
    if role is not None:
        headers.append((role, name))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


def _shareable(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """False when a response is for its own client alone (Set-Cookie, private) or
    has no end to wait for (an event stream)."""
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"set-cookie":
            return False
        if lowered == b"cache-control" and b"private" in _tokens((value,)):
            return False
        if lowered == b"content-type" and value.split(b";", 1)[0].strip().lower() == (
            b"text/event-stream"
        ):
            return False
    return True


def _tokens(values: Iterable[bytes]) -> list[bytes]:
    """A comma-separated header's directives, lower case, without arguments."""
    return [
        part.split(b"=", 1)[0].strip().lower()
        for value in values
        for part in value.split(b",")
    ]


def _feed(digest: Any, part: bytes) -> None:
    digest.update(struct.pack(">Q", len(part)))  # length-prefixed: no two inputs collide
    digest.update(part)


def _frame(response: _Response | None) -> bytes:
    """The frame of a shared value: version, kind, then status, headers and body."""
    if response is None:
        return bytes((_FRAME_VERSION, _NOT_SHARED))
    parts = [struct.pack(">BBHI", _FRAME_VERSION, _SHARED, response.status,
                         len(response.headers))]
    for name, value in response.headers:
        parts.append(struct.pack(">II", len(name), len(value)))
        parts.append(name)
        parts.append(value)
    parts.append(response.body)
    return b"".join(parts)


def _parse(frame: bytes) -> _Response | None:
    """The response ``_frame`` made ``frame`` from (None: not shared)."""
    if len(frame) < 2 or frame[0] != _FRAME_VERSION:
        raise ValueError("a collapsed response's frame is not of this version")
    if frame[1] == _NOT_SHARED:
        return None
    _, _, status, count = struct.unpack_from(">BBHI", frame, 0)
    at = 8
    headers = []
    for _ in range(count):
        name_len, value_len = struct.unpack_from(">II", frame, at)
        at += 8
        name = frame[at:at + name_len]
        at += name_len
        headers.append((name, frame[at:at + value_len]))
        at += value_len
    return _Response(status, tuple(headers), frame[at:])


class _Frames:
    """The codec of the middleware's operation: a shared response is a frame of bytes
    (:func:`_frame`), carried as it is, whatever the group's own codec."""

    __slots__ = ()

    def encode(self, value: Any, /) -> bytes:
        if not isinstance(value, bytes):
            raise TypeError(f"a collapsed request's value is a frame, not {type(value).__name__}")
        return value

    def decode(self, data: bytes, /) -> bytes:
        return bytes(data)

    def __repr__(self) -> str:
        return "flightgroup.asgi frames"


_FRAMES: Final = _Frames()


def _body_bound(given: int | None, carries: int | None) -> int:
    """The bound on a shared body: ``given``, checked against what a value may hold."""
    room: int | None = None
    if carries is not None:
        room = carries - _HEADER_ALLOWANCE
    if given is None:
        bound = DEFAULT_MAX_BODY_BYTES if room is None else min(DEFAULT_MAX_BODY_BYTES, room)
        return max(bound, 0)
    if isinstance(given, bool) or not isinstance(given, int) or given < 0:
        raise ValueError("max_body_bytes must be an int >= 0 or None")
    if room is not None and given > room:
        raise ValueError(
            f"max_body_bytes={given} is more than the group carries in one value "
            f"({room} bytes of body with its max_value_bytes={carries})"
        )
    return given


def _names(what: str, names: Iterable[str], *, upper: bool) -> list[str]:
    if isinstance(names, str):
        raise TypeError(f"{what} must be an iterable of names, not a str")
    checked = []
    for name in names:
        if not isinstance(name, str) or not _is_token(name):
            raise ValueError(f"{what} holds {name!r}, not a token")
        checked.append(name.upper() if upper else name.lower())
    return checked


def _is_token(name: str) -> bool:
    return bool(name) and name.isascii() and all(
        c.isalnum() or c in "!#$%&'*+-.^_`|~" for c in name
    )
