"""Drive an ASGI application in process: one request, its whole answer, a client that
may go away, and a test application that counts its runs and waits where told."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flightgroup.asgi import ASGIApp, Message, Receive, Scope, Send


@dataclass
class Answer:
    """What one client got: status, headers (lower-case names) and the whole body."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    complete: bool

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name``, or None."""
        return next((v for n, v in self.headers if n == name), None)


def request(
    path: str = "/",
    *,
    method: str = "GET",
    query: bytes = b"",
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> Scope:
    """An HTTP scope for ``method path?query`` with ``headers`` (and a Host)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query,
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }


async def call(
    app: ASGIApp, scope: Scope, *, gone_after: int | None = None, body: bytes = b""
) -> Answer:
    """Serve ``scope`` through ``app`` as a server would. ``gone_after``: the client
    goes away after that many messages (its sends then raise OSError, its receive says
    ``http.disconnect``)."""
    answer = Answer(0, [], b"", False)
    sent = 0
    gone = asyncio.Event()
    first = True

    async def receive() -> Message:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal sent
        if gone.is_set():
            raise OSError("the client went away")
        sent += 1
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = [(bytes(n).lower(), bytes(v)) for n, v in message["headers"]]
        else:
            answer.body += message.get("body", b"")
            answer.complete = not message.get("more_body", False)
        if gone_after is not None and sent >= gone_after:
            gone.set()

    await app(scope, receive, send)
    return answer


@dataclass
class Endpoint:
    """An ASGI app that counts its runs and holds each run at ``gate`` until released.

    ``respond(scope)`` gives (status, headers, body chunks); ``raises`` makes a run raise
    after ``raise_after`` messages."""

    respond: Callable[[Scope], tuple[int, list[tuple[bytes, bytes]], list[bytes]]]
    runs: list[Scope] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    raises: Exception | None = None
    raise_after: int = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.runs.append(scope)
        self.started.set()
        await self.gate.wait()
        status, headers, chunks = self.respond(scope)
        messages: list[dict[str, Any]] = [
            {"type": "http.response.start", "status": status, "headers": headers}
        ]
        messages += [
            {"type": "http.response.body", "body": chunk, "more_body": i < len(chunks) - 1}
            for i, chunk in enumerate(chunks)
        ]
        for i, message in enumerate(messages):
            if self.raises is not None and i == self.raise_after:
                raise self.raises
            await send(message)
        if self.raises is not None and self.raise_after >= len(messages):
            raise self.raises
