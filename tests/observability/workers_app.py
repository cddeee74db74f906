"""A raw ASGI app that test_prometheus_workers.py serves with ``uvicorn --workers 4``.

Each worker process imports it, so each has its own group, registered with the directory
named by ``FG_TEST_METRICS_DIR`` (written every ``FG_TEST_METRICS_INTERVAL`` seconds).

- ``GET /call/KEY``: ``group.run(KEY, ...)`` (a work of 20 ms); answers ``PID JOINED``;
- ``GET /metrics``: the registry's exposition; header ``x-pid`` names the worker;
- ``GET /pid``: the worker's pid.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from flightgroup import FlightGroup
from flightgroup.prometheus import register

group = FlightGroup()
registry = CollectorRegistry()
register(group, registry, name="app", directory=os.environ["FG_TEST_METRICS_DIR"],
         interval=float(os.environ["FG_TEST_METRICS_INTERVAL"]))


async def _work() -> str:
    await asyncio.sleep(0.02)
    return "v"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    path: str = scope["path"]
    status = 200
    if path.startswith("/call/"):
        result = await group.run(path[len("/call/"):], _work)
        body = f"{os.getpid()} {int(result.joined)}".encode()
    elif path == "/metrics":
        body = generate_latest(registry)
    elif path == "/pid":
        body = str(os.getpid()).encode()
    else:
        status, body = 404, b"no such route"
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"text/plain"), (b"x-pid", str(os.getpid()).encode())],
    })
    await send({"type": "http.response.body", "body": body})
