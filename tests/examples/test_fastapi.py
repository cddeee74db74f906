"""examples/fastapi: the FastAPI recipe under real uvicorn servers, one build per report
for concurrent requests across the workers of a host and across two "hosts"."""

from __future__ import annotations

import uuid

import pytest

from .servers import BIN, EXAMPLES, Children, Hold, base_url, child_env, get_many, wait_ready

pytestmark = pytest.mark.timeout(90)

APP = "tests.examples.served.fastapi_app:app"


def uvicorn(children: Children, env: dict[str, str], *, workers: int) -> str:
    """Start ``uvicorn APP --workers N`` on a free loopback port; its base URL once ready."""
    port, url = base_url()
    child = children.start(
        [str(BIN / "uvicorn"), APP, "--host", "127.0.0.1", "--port", str(port),
         "--workers", str(workers), "--no-access-log"],
        cwd=EXAMPLES / "fastapi", env=env,
    )
    wait_ready(f"{url}/healthz", child)
    return url


def test_concurrent_requests_across_uvicorn_workers_share_one_build(
    children: Children, hold: Hold, directory: str
) -> None:
    """Three uvicorn workers on one directory group: nine concurrent requests, one build."""
    url = uvicorn(children, child_env(hold, FLIGHTGROUP_DIR=directory), workers=3)

    replies = get_many([f"{url}/reports/2026-11-30"] * 9)
    hold.wait(started=1, joined=8)
    hold.release()
    answers = [reply.result(timeout=30) for reply in replies]

    assert len(hold.lines("started")) == 1
    assert [a.status for a in answers] == [200] * 9
    assert len({str(a.body) for a in answers}) == 1
    assert sorted(a.headers["x-flight"] for a in answers) == ["joined"] * 8 + ["led"]
    assert len({a.headers["x-flight-token"] for a in answers}) == 1


def test_concurrent_requests_to_two_hosts_share_one_build_through_redis(
    children: Children, hold: Hold
) -> None:
    """Two uvicorn servers (two hosts) on one Redis namespace: one build for both."""
    env = child_env(
        hold, FLIGHTGROUP_REDIS="redis://127.0.0.1:6379/0",
        FLIGHTGROUP_NAMESPACE=f"fgexample-{uuid.uuid4().hex}",
    )
    first, second = (uvicorn(children, env, workers=2) for _ in range(2))

    replies = get_many([f"{host}/reports/2026-12-01" for host in (first, second)] * 4)
    hold.wait(started=1, joined=7)
    hold.release()
    answers = [reply.result(timeout=30) for reply in replies]

    assert len(hold.lines("started")) == 1
    assert [a.status for a in answers] == [200] * 8
    assert len({str(a.body) for a in answers}) == 1
    assert sorted(a.headers["x-flight"] for a in answers) == ["joined"] * 7 + ["led"]
