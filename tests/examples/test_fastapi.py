"""examples/fastapi: the FastAPI recipe under real uvicorn servers, one build per report
for concurrent requests across the workers of a host and across two "hosts"."""

from __future__ import annotations

import re
import uuid

import pytest

from .servers import (
    BIN,
    EXAMPLES,
    GUNICORN,
    Children,
    Hold,
    base_url,
    child_env,
    get_many,
    one_build,
    poke,
    wait_for,
    wait_ready,
)

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
    hold.wait(started=1, joined=8, seen=children.started)
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
    hold.wait(started=1, joined=7, seen=children.started)
    hold.release()
    answers = [reply.result(timeout=30) for reply in replies]

    assert len(hold.lines("started")) == 1
    assert [a.status for a in answers] == [200] * 8
    assert len({str(a.body) for a in answers}) == 1
    assert sorted(a.headers["x-flight"] for a in answers) == ["joined"] * 7 + ["led"]


def test_gunicorn_uvicorn_workers_preloaded_and_replaced_each_make_their_group_in_the_lifespan(
    children: Children, hold: Hold, directory: str
) -> None:
    """gunicorn -k uvicorn_worker.UvicornWorker --preload --max-requests 4: one build per
    round, before and after every worker was replaced (each ran the lifespan anew)."""
    port, url = base_url()
    server = children.start(
        [*GUNICORN, "-k", "uvicorn_worker.UvicornWorker", "--workers", "3",
         "--preload", "--max-requests", "4", "--max-requests-jitter", "0",
         "--bind", f"127.0.0.1:{port}", APP],
        cwd=EXAMPLES / "fastapi", env=child_env(hold, FLIGHTGROUP_DIR=directory),
    )
    wait_ready(f"{url}/healthz", server)

    def booted() -> set[str]:
        return set(re.findall(r"Booting worker with pid: (\d+)", server.output()))

    def exited() -> set[str]:
        return set(re.findall(r"Worker exiting \(pid: (\d+)\)", server.output()))

    wait_for(lambda: len(booted()) == 3, "three workers to boot")
    first_workers = booted()
    assert one_build(server, url, hold, "2026-11-30", 6) <= first_workers

    def all_replaced() -> bool:
        if not first_workers <= exited():
            poke(f"{url}/healthz")
            return False
        return len(booted() - first_workers) >= 3

    wait_for(all_replaced, "every first worker to be replaced")
    wait_ready(f"{url}/healthz", server)
    # 3 requests: each of the 3 workers may have served up to 3 of the 4 it takes, and
    # the round's requests must all be taken before the held build may go on
    assert one_build(server, url, hold, "2026-12-01", 3).isdisjoint(first_workers)
