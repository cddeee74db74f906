"""FastAPI recipe: one flight group per worker process, made in the lifespan.

Concurrent requests for the same report share one build: within a worker (the process
scope's table), across the ``uvicorn --workers`` processes of a host (the directory
scope), or across hosts (the fleet scope on Redis). The scope comes from the
environment, so one app serves every deployment:

- ``FLIGHTGROUP_REDIS`` (and ``FLIGHTGROUP_NAMESPACE``): the fleet scope;
- else ``FLIGHTGROUP_DIR``, or a folder of the temp dir: the directory scope.

Run: ``uvicorn app:app --workers 3`` from this folder, or under gunicorn:
``gunicorn -k uvicorn_worker.UvicornWorker --workers 3 --preload app:app`` (README.md).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response

from flightgroup import JSON, FlightGroup


def open_group() -> FlightGroup:
    """The group of this deployment: it does no I/O until its first call."""
    redis_url = os.environ.get("FLIGHTGROUP_REDIS")
    if redis_url:
        namespace = os.environ.get("FLIGHTGROUP_NAMESPACE", "reports")
        return FlightGroup(redis=redis_url, namespace=namespace, codec=JSON)
    directory = os.environ.get("FLIGHTGROUP_DIR") or os.path.join(
        tempfile.gettempdir(), f"reports-flights-{os.getuid()}"
    )
    return FlightGroup(directory=directory, codec=JSON)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Made here, in the worker process that serves the requests: a group started in
    # another process before a fork does not work in the child (docs/adr/0014, 0018).
    app.state.group = open_group()
    try:
        yield
    finally:
        # Waiting calls raise GroupClosedError; flights this worker leads are handed
        # over as interrupted to their joiners in other processes.
        await app.state.group.aclose()


app = FastAPI(lifespan=lifespan)


async def build_report(day: str) -> dict[str, Any]:
    """Stands for the expensive part: a slow query, a model call, a remote API."""
    await asyncio.sleep(0.5)
    return {"day": day, "orders": 1234, "built_by": os.getpid()}


@app.get("/reports/{day}")
async def report(day: str, request: Request, response: Response) -> dict[str, Any]:
    """The report of one day: one build for every request that comes while it runs."""
    group: FlightGroup = request.app.state.group
    # The key holds every input that changes the result (here only the day).
    result = await group.run(f"report:{day}", lambda: build_report(day))
    response.headers["X-Flight"] = "joined" if result.joined else "led"
    response.headers["X-Flight-Token"] = str(result.token)
    response.headers["X-Worker"] = str(os.getpid())
    value: dict[str, Any] = result.value
    return value


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    """Ready once the worker has run its lifespan."""
    return {"status": "ok"}
