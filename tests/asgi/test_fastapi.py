"""CollapseRequests as FastAPI middleware (``app.add_middleware``): routes, JSON,
streamed responses and HTTP errors are shared as any ASGI response."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse

from flightgroup import FlightGroup
from flightgroup.asgi import CollapseRequests

from .driver import call, request
from .test_collapse_rules import until


def make_app(group: FlightGroup, gate: asyncio.Event, runs: list[str]) -> FastAPI:
    app = FastAPI()
    app.add_middleware(CollapseRequests, group=group, role_header="x-flightgroup")

    @app.get("/report/{year}")
    async def report(year: int) -> dict[str, object]:
        runs.append(f"report {year}")
        await gate.wait()
        return {"year": year, "rows": list(range(5))}

    @app.get("/missing")
    async def missing() -> None:
        runs.append("missing")
        await gate.wait()
        raise HTTPException(status_code=404, detail="no such thing")

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        runs.append("stream")

        async def chunks() -> AsyncIterator[bytes]:
            await gate.wait()
            for i in range(100):
                yield b"%04d," % i

        return StreamingResponse(chunks(), media_type="text/csv")

    return app


async def test_fastapi_routes_share_one_run_per_request() -> None:
    """Identical requests to a JSON route, a 404 route and a streamed route each run
    their route once; every caller gets the same status and body."""
    group = FlightGroup()
    gate = asyncio.Event()
    runs: list[str] = []
    app = make_app(group, gate, runs)
    paths = ["/report/2026"] * 4 + ["/missing"] * 3 + ["/stream"] * 3
    tasks = [asyncio.ensure_future(call(app, request(p))) for p in paths]
    await until(lambda: group.stats().calls >= len(paths) and len(runs) == 3)
    gate.set()
    answers = await asyncio.gather(*tasks)
    assert sorted(runs) == ["missing", "report 2026", "stream"]
    bodies = {(p, a.status, a.body) for p, a in zip(paths, answers, strict=True)}
    assert bodies == {
        ("/report/2026", 200, b'{"year":2026,"rows":[0,1,2,3,4]}'),
        ("/missing", 404, b'{"detail":"no such thing"}'),
        ("/stream", 200, b"".join(b"%04d," % i for i in range(100))),
    }
    assert sorted(a.header(b"x-flightgroup") or b"" for a in answers) == (
        [b"joined"] * 7 + [b"led"] * 3
    )
