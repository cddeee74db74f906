"""gunicorn settings for app.py: threads in a few workers, preloaded, recycled.

The hooks give each worker a flight group of its own and close it when the worker
leaves, so a preloaded master never holds one and a worker replaced by
``max_requests`` hands its flights over before it goes.
"""

from __future__ import annotations

from typing import Any

import app as reports

bind = "127.0.0.1:8000"
workers = 3
worker_class = "gthread"
threads = 4            # each worker serves 4 requests at once; they share flights
preload_app = True     # import the app once in the master, then fork the workers
max_requests = 1000    # replace a worker after that many requests ...
max_requests_jitter = 50   # ... at slightly different counts, not all at once


def post_worker_init(worker: Any) -> None:
    """In the worker, once the app is loaded: make the worker's own group."""
    reports.open_group()
    worker.log.info("opened the flight group of worker %s", worker.pid)


def worker_exit(server: Any, worker: Any) -> None:
    """In the worker, as it exits (max_requests reached, a reload, a shutdown)."""
    reports.close_group()
    server.log.info("closed the flight group of worker %s", worker.pid)
