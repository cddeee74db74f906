"""A FastAPI application with a lifespan (issue 29, ADR 0044): its operations are
declared at import on a GroupSlot, its lifespan opens a group into the slot and closes
it, and a second ``TestClient(app)`` session in the same process (and the next test)
opens a new one: every session's concurrent requests coalesce, with no decorating
again. Both an ``async def`` endpoint and a plain ``def`` one (FastAPI runs it on a
worker thread, as a threaded app would) are served."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import fastapi
import pytest
from fastapi.testclient import TestClient

import flightgroup
from flightgroup import GroupSlot

from ..ingroup import Background
from ..support import wait_until

# -- the application, as its modules would declare it at import ------------------------

flights = GroupSlot("flights")
settings: dict[str, Any] = {}  # what the app reads at startup (its settings, the env)
gate = threading.Event()  # the work waits on it, so the test forces the joiners
works: list[str] = []


@flights.coalesce(key=lambda user_id: f"user:{user_id}")
async def get_user(user_id: int) -> dict[str, Any]:
    works.append(f"user:{user_id}")
    await asyncio.to_thread(gate.wait, 30)
    return {"id": user_id, "name": f"user {user_id}"}


@flights.coalesce(key=lambda day: f"report:{day}")
def build_report(day: str) -> dict[str, Any]:
    works.append(f"report:{day}")
    assert gate.wait(30)
    return {"day": day, "rows": 3}


@asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    async with flights.open(**settings):
        yield


app = fastapi.FastAPI(lifespan=lifespan)


@app.get("/users/{user_id}")
async def user(user_id: int) -> dict[str, Any]:
    result = await get_user.options(timeout=30.0)(user_id)
    return {**result.value, "joined": result.joined, "token": result.token}


@app.get("/reports/{day}")
def report(day: str) -> dict[str, Any]:
    result = build_report.options(timeout=30.0)(day)
    return {**result.value, "joined": result.joined, "token": result.token}


# -- the tests ---------------------------------------------------------------------------

CALLERS = 4


def session(path: str, work: str) -> list[dict[str, Any]]:
    """One ``with TestClient(app)`` session (startup, requests, shutdown): CALLERS
    concurrent requests of ``path``, released once all but the leader joined."""
    gate.clear()
    works.clear()
    with TestClient(app) as client:
        group = flights.group
        calls = [Background(lambda: client.get(path)) for _ in range(CALLERS)]
        wait_until(lambda: group.stats().joins == CALLERS - 1, "every other request joined")
        gate.set()
        responses = [call.wait(30) for call in calls]
    assert not flights.bound and group.closed  # the lifespan closed its group
    assert works == [work]  # one run for all the requests
    assert all(response.status_code == 200 for response in responses)
    return [response.json() for response in responses]


def check_coalesced(bodies: list[dict[str, Any]]) -> None:
    assert sorted(body["joined"] for body in bodies) == [False] + [True] * (CALLERS - 1)
    assert len({body["token"] for body in bodies}) == 1


@pytest.fixture(params=["process", "directory"])
def scope_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """The app's settings for its group: the process scope, or a directory scope."""
    settings.clear()
    if request.param == "directory":
        settings.update(directory=str(tmp_path / "flights"), codec=flightgroup.JSON)
    yield settings
    settings.clear()
    gate.set()


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("scope_settings")
def test_two_testclient_sessions_in_one_process_each_coalesce() -> None:
    """The second session opens a new group; the async endpoint's requests share one
    run in each."""
    first = session("/users/7", "user:7")
    second = session("/users/7", "user:7")
    check_coalesced(first)
    check_coalesced(second)
    assert first[0]["name"] == second[0]["name"] == "user 7"


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("scope_settings")
def test_the_next_test_opens_the_app_again_and_sync_endpoints_coalesce() -> None:
    """The same app, after the test before it closed its sessions: the plain def
    endpoint's requests (on worker threads) share one run too."""
    check_coalesced(session("/reports/monday", "report:monday"))
    check_coalesced(session("/users/8", "user:8"))
