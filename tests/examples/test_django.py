"""examples/django: the single-file Django project under gunicorn (2 workers x 8
threads): concurrent requests from sync views share one PostgreSQL query."""

from __future__ import annotations

import pytest

from .servers import EXAMPLES, GUNICORN, Children, Hold, base_url, child_env, get_many, wait_ready

pytestmark = pytest.mark.timeout(90)

APP = "tests.examples.served.django_site:application"


def test_concurrent_requests_of_sync_views_in_threads_and_workers_share_one_query(
    children: Children, hold: Hold, directory: str
) -> None:
    """Eight concurrent requests (no more than a worker's threads, so none queues behind
    the held ones) over two workers' threads: one query, one answer."""
    port, url = base_url()
    server = children.start(
        [*GUNICORN, "-c", "gunicorn.conf.py", "--bind", f"127.0.0.1:{port}", APP],
        cwd=EXAMPLES / "django", env=child_env(hold, FLIGHTGROUP_DIR=directory),
    )
    wait_ready(f"{url}/healthz", server)

    replies = get_many([f"{url}/reports/2026-11-30"] * 8)
    hold.wait(started=1, joined=7, seen=[server])
    hold.release()
    answers = [reply.result(timeout=30) for reply in replies]

    assert len(hold.lines("started")) == 1
    assert [a.status for a in answers] == [200] * 8
    bodies = [a.body for a in answers]
    assert all(body == bodies[0] for body in bodies)
    assert isinstance(bodies[0], dict)
    assert bodies[0]["day"] == "2026-11-30" and bodies[0]["orders"] == 200000
    assert sorted(a.headers["x-flight"] for a in answers) == ["joined"] * 7 + ["led"]
