"""gunicorn settings for reports_site.py: two worker processes of eight threads each."""

from __future__ import annotations

from typing import Any

bind = "127.0.0.1:8000"
workers = 2
worker_class = "gthread"
threads = 8        # sync views: a thread per request; the threads share flights
preload_app = True
max_requests = 1000
max_requests_jitter = 50


def worker_exit(server: Any, worker: Any) -> None:
    """Close the worker's group as it leaves: flights it leads are handed over as
    interrupted to the other workers' joiners, instead of waiting for its death."""
    import reports_site

    reports_site.group.close()
    server.log.info("closed the flight group of worker %s", worker.pid)
