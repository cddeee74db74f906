"""RQ recipe: jobs on many worker hosts, one build per report however often it is queued.

The group is the fleet scope (Redis), so the workers of every host share flights; the
queue's Redis can serve as the group's too. It is made at import and does no I/O until
its first call: RQ's default worker imports this module in the work horse it forks for
each job (or, when it imported it already, the horse starts the group anew at its first
call: a group only made, never used, before a fork works in the child).

Run a worker: ``rq worker --url redis://127.0.0.1:6379/0 reports`` from this folder; queue
jobs with ``Queue("reports", connection=...).enqueue("reports.report_job", day)``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from flightgroup import JSON, FlightGroup

group = FlightGroup(
    redis=os.environ.get("FLIGHTGROUP_REDIS", "redis://127.0.0.1:6379/0"),
    namespace=os.environ.get("FLIGHTGROUP_NAMESPACE", "reports"),
    codec=JSON,
)


def compute_report(day: str) -> dict[str, Any]:
    """Stands for the expensive part: a slow query, a model call, a remote API."""
    time.sleep(0.5)
    return {"day": day, "orders": 1234, "built_by": os.getpid()}


# name= fixes the flight's namespace on every host, whatever module path the workers
# import this file under (the default is the function's module and qualified name).
@group.coalesce(key=lambda day: f"report:{day}", name="reports.build_report")
def build_report(day: str) -> dict[str, Any]:
    """The day's report: one build in the fleet for every overlapping call."""
    return compute_report(day)


def report_job(day: str) -> dict[str, Any]:
    """The job: queued by every part of the system that needs the report."""
    report = build_report(day)
    return {"report": report, "job_pid": os.getpid()}
