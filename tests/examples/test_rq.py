"""examples/rq: the RQ recipe with real ``rq worker`` processes on the machine's Redis:
overlapping jobs of one report on three workers share one build (the fleet scope)."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest
import redis
from rq import Queue, Worker
from rq.job import JobStatus

from .servers import BIN, EXAMPLES, Children, Hold, child_env, wait_for

pytestmark = pytest.mark.timeout(90)

REDIS = "redis://127.0.0.1:6379/0"
JOB = "tests.examples.served.rq_jobs.report_job"


def joiners(namespace: str) -> int:
    """The processes that joined the namespace's flights, as ``flightgroup status`` says."""
    status = subprocess.run(
        [str(BIN / "flightgroup"), "status", "--redis", REDIS, "--namespace", namespace,
         "--json"],
        capture_output=True, text=True, timeout=30, env=child_env(), check=True,
    )
    return sum(flight["joiners"] for flight in json.loads(status.stdout)["flights"])


def test_overlapping_jobs_on_three_workers_share_one_build(
    children: Children, hold: Hold
) -> None:
    """Three jobs of one day on three rq workers: one build, three equal reports."""
    namespace, queue_name = f"fgexample-{uuid.uuid4().hex}", f"fgexample-{uuid.uuid4().hex}"
    connection = redis.Redis.from_url(REDIS)
    queue = Queue(queue_name, connection=connection)
    env = child_env(hold, FLIGHTGROUP_REDIS=REDIS, FLIGHTGROUP_NAMESPACE=namespace)
    try:
        for _ in range(3):
            children.start([str(BIN / "rq"), "worker", "--url", REDIS, queue_name],
                           cwd=EXAMPLES / "rq", env=env)
        wait_for(lambda: len(Worker.all(queue=queue)) == 3, "three workers to register")

        jobs = [queue.enqueue(JOB, "2026-11-30") for _ in range(3)]
        # each worker runs one job at a time: three jobs held at once are on three workers
        wait_for(lambda: len(hold.lines("started")) == 1 and joiners(namespace) == 2,
                 "one build and two joined workers")
        hold.release()
        wait_for(lambda: all(job.get_status() == JobStatus.FINISHED for job in jobs),
                 "the jobs to finish", timeout=30)

        results = [job.return_value() for job in jobs]
        assert len(hold.lines("started")) == 1
        assert all(r is not None and r["report"] == results[0]["report"] for r in results)
        assert len({r["job_pid"] for r in results}) == 3
    finally:
        children.stop_all()  # the workers first: they hold the queue's keys
        queue.delete(delete_jobs=True)
        connection.close()
