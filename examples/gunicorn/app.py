"""gunicorn recipe: a plain WSGI app whose workers share one report build per day.

The group belongs to the worker process: ``gunicorn.conf.py`` makes it in each worker
once the worker has loaded the app (``post_worker_init``) and closes it when the worker
exits (``worker_exit``), so it works with ``--preload`` (the app is imported in the
master, before the fork) and with ``--max-requests`` (workers are replaced as they
go). The group is a directory group: every worker of the host shares its flights.

Run: ``gunicorn -c gunicorn.conf.py app:application`` from this folder (see README.md).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from flightgroup import JSON, FlightGroup

# Set in each worker by open_group() (gunicorn.conf.py), never in the master: a group
# started before a fork is closed in the child (docs/adr/0014, 0018, 0030).
group: FlightGroup | None = None
_made_in = 0  # the pid that made `group`
_lock = threading.Lock()


def open_group() -> FlightGroup:
    """Make this process's group (once): ``FLIGHTGROUP_DIR`` or a folder of the temp dir."""
    global group, _made_in
    with _lock:
        if group is None or _made_in != os.getpid():
            directory = os.environ.get("FLIGHTGROUP_DIR") or os.path.join(
                tempfile.gettempdir(), f"reports-flights-{os.getuid()}"
            )
            group, _made_in = FlightGroup(directory=directory, codec=JSON), os.getpid()
        return group


def close_group() -> None:
    """Close this process's group: flights it leads are told interrupted to the others."""
    global group
    with _lock:
        if group is not None and _made_in == os.getpid():
            group.close()
        group = None


def build_report(day: str) -> dict[str, Any]:
    """Stands for the expensive part: a slow query, a model call, a remote API."""
    time.sleep(0.5)
    return {"day": day, "orders": 1234, "built_by": os.getpid()}


Respond = Callable[[str, list[tuple[str, str]]], Any]


def application(environ: dict[str, Any], start_response: Respond) -> Iterable[bytes]:
    """``GET /reports/<day>``: the day's report, one build for every concurrent request."""
    path: str = environ.get("PATH_INFO", "")
    headers = [("Content-Type", "application/json"), ("X-Worker", str(os.getpid()))]
    if path == "/healthz":
        start_response("200 OK", headers)
        return [b'{"status": "ok"}']
    if not path.startswith("/reports/") or path == "/reports/":
        start_response("404 Not Found", headers)
        return [b'{"error": "not found"}']
    day = path.removeprefix("/reports/")
    # open_group() too, not `group`: a worker made without the config file's hooks
    # (gunicorn run without -c) still gets its own group.
    result = open_group().run_sync(f"report:{day}", lambda: build_report(day))
    headers.append(("X-Flight", "joined" if result.joined else "led"))
    start_response("200 OK", headers)
    return [json.dumps(result.value).encode()]
