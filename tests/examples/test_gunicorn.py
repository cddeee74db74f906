"""examples/gunicorn: the WSGI recipe under a real gunicorn (gthread workers, --preload,
--max-requests): each worker makes its own group, and a replaced worker's does too."""

from __future__ import annotations

import re

import pytest

from .servers import (
    EXAMPLES,
    GUNICORN,
    Children,
    Hold,
    base_url,
    child_env,
    one_build,
    poke,
    wait_for,
    wait_ready,
)

pytestmark = pytest.mark.timeout(120)

APP = "tests.examples.served.gunicorn_app:application"


def test_preloaded_workers_and_their_replacements_each_make_a_group_that_coalesces(
    children: Children, hold: Hold, directory: str
) -> None:
    """--preload, --max-requests 4: one build per round, before and after every worker
    was replaced, each worker's group opened in it and closed as it left."""
    port, url = base_url()
    server = children.start(
        [*GUNICORN, "-c", "gunicorn.conf.py", "--bind", f"127.0.0.1:{port}",
         "--max-requests", "4", "--max-requests-jitter", "0", APP],
        cwd=EXAMPLES / "gunicorn", env=child_env(hold, FLIGHTGROUP_DIR=directory),
    )
    wait_ready(f"{url}/healthz", server)

    def opened() -> list[str]:
        return re.findall(r"opened the flight group of worker (\d+)", server.output())

    def closed() -> list[str]:
        return re.findall(r"closed the flight group of worker (\d+)", server.output())

    wait_for(lambda: len(opened()) == 3, "three workers to open their groups")
    first_workers = set(opened())
    assert one_build(server, url, hold, "2026-11-30", 4) <= first_workers

    # every first worker reaches its 4 requests and is replaced by a new one
    def all_replaced() -> bool:
        if not first_workers <= set(closed()):
            poke(f"{url}/healthz")
            return False
        return len(set(opened()) - first_workers) >= 3

    wait_for(all_replaced, "every first worker to be replaced")
    # 3 requests: each of the 3 workers may have served up to 3 of the 4 it takes, and
    # the round's requests must all be taken before the held build may go on
    assert one_build(server, url, hold, "2026-12-01", 3).isdisjoint(first_workers)
