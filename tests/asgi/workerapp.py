"""The application the uvicorn workers of tests/asgi/test_uvicorn_workers.py serve.

Every worker imports it and makes its own directory group (``FG_DIR``, JSON codec).
Paths under ``/small/`` go through a collapse whose body limit is 1 MiB, the others
through one of 16 MiB. Each run of an endpoint appends a line to ``FG_STATE/runs``
(O_APPEND: lines of many processes never mix) and waits until the test creates
``FG_STATE/go.<path with / as _>``, so the whole herd is in flight before the first run ends. Each
worker writes ``FG_STATE/ready.<pid>`` once it serves, and keeps
``FG_STATE/calls.<pid>`` at its group's call count, so the test sees when every request
has reached its flight.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from flightgroup import JSON, FlightGroup
from flightgroup.asgi import CollapseRequests, Receive, Scope, Send

from .payload import big_body

STATE = os.environ["FG_STATE"]
CHUNK = 64 * 1024

group = FlightGroup(directory=os.environ["FG_DIR"], codec=JSON)


def _write(name: str, text: str) -> None:
    path = os.path.join(STATE, name)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)  # readers see the old or the new count, whole


async def _report_calls() -> None:
    seen = -1
    while True:
        calls = group.stats().calls
        if calls != seen:
            _write(f"calls.{os.getpid()}", str(calls))
            seen = calls
        await asyncio.sleep(0.005)


async def _wait_go(name: str) -> None:
    path = os.path.join(STATE, f"go.{name}")
    while not os.path.exists(path):
        await asyncio.sleep(0.005)


async def endpoints(scope: Scope, receive: Receive, send: Send) -> None:
    """/herd, /whoami (echoes Authorization) and /big (10 MB streamed), any prefix."""
    name = scope["path"].rsplit("/", 1)[-1]
    fd = os.open(os.path.join(STATE, "runs"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{scope['path']} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    await _wait_go(scope["path"].strip("/").replace("/", "_"))
    headers: list[tuple[bytes, bytes]] = [(b"content-type", b"application/octet-stream")]
    if name == "big":
        body = big_body()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for at in range(0, len(body), CHUNK):
            await send({"type": "http.response.body", "body": body[at:at + CHUNK],
                        "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    if name == "whoami":
        body = dict(scope["headers"]).get(b"authorization", b"nobody")
    else:
        body = f"one run for the herd ({scope['path']})".encode()
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


large = CollapseRequests(endpoints, group=group, role_header="x-flightgroup",
                         max_body_bytes=16 * 1024 * 1024)
small = CollapseRequests(endpoints, group=group, role_header="x-flightgroup",
                         max_body_bytes=1024 * 1024)


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """The worker's ASGI app: lifespan here, HTTP through the collapse its path picks."""
    if scope["type"] == "lifespan":
        reporter: asyncio.Task[Any] | None = None
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                reporter = asyncio.ensure_future(_report_calls())
                _write(f"ready.{os.getpid()}", "")
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if reporter is not None:
                    reporter.cancel()
                await group.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return
    chosen = small if scope["path"].startswith("/small/") else large
    await chosen(scope, receive, send)
