"""examples/cli: the cron and CI scripts, each run by several processes at once: one
run of the command, its output and exit code in every process."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from .servers import BIN, EXAMPLES, Hold, child_env, wait_for

pytestmark = pytest.mark.timeout(90)

# The command the scripts run: record the run in HOLD/started, wait for HOLD/go, say
# "built", exit with CODE.
COMMAND = r"""
import os, sys, time
hold, code = sys.argv[1], int(sys.argv[2])
with open(os.path.join(hold, "started"), "a") as journal:
    journal.write(f"run {os.getpid()}\n")
end = time.monotonic() + 30
while not os.path.exists(os.path.join(hold, "go")) and time.monotonic() < end:
    time.sleep(0.01)
print("built", flush=True)
sys.exit(code)
"""


def run_at_once(
    script: str, hold: Hold, tmp_path: Path, *, callers: int, code: int, **env: str
) -> list[tuple[int, str, str]]:
    """Run ``script`` from ``callers`` processes at once, the command held until every
    other caller said it joined; each caller's exit code, stdout and stderr."""
    environment = child_env(**env)
    environment["PATH"] = f"{BIN}:{environment['PATH']}"
    procs, outputs = [], []
    for n in range(callers):
        out, err = tmp_path / f"out{n}", tmp_path / f"err{n}"
        outputs.append((out, err))
        with out.open("wb") as stdout, err.open("wb") as stderr:
            procs.append(subprocess.Popen(
                [str(EXAMPLES / "cli" / script), sys.executable, "-c", COMMAND,
                 str(hold.folder), str(code)],
                env=environment, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            ))
    try:
        def joined() -> int:
            return sum("joined the run" in err.read_text() for _, err in outputs)

        wait_for(lambda: len(hold.lines("started")) == 1 and joined() == callers - 1,
                 f"one run and {callers - 1} joined callers")
        hold.release()
        codes = [proc.wait(timeout=30) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [
        (c, out.read_text(), err.read_text()) for c, (out, err) in zip(codes, outputs, strict=True)
    ]


def test_cron_jobs_firing_at_once_on_one_host_run_the_report_once(
    hold: Hold, tmp_path: Path, directory: str
) -> None:
    """Four cron jobs on one directory: one run, its output and success in all four."""
    ends = run_at_once("cron-report.sh", hold, tmp_path, callers=4, code=0,
                       FLIGHTGROUP_DIR=directory)

    assert len(hold.lines("started")) == 1
    assert [(code, out) for code, out, _ in ends] == [(0, "built\n")] * 4


def test_ci_jobs_of_one_commit_on_several_runners_build_once_and_share_its_failure(
    hold: Hold, tmp_path: Path
) -> None:
    """Three CI jobs of one commit through Redis: one build; its exit code 3 in all."""
    ends = run_at_once(
        "ci-build.sh", hold, tmp_path, callers=3, code=3,
        GITHUB_SHA=uuid.uuid4().hex, FLIGHTGROUP_REDIS="redis://127.0.0.1:6379/0",
        FLIGHTGROUP_NAMESPACE=f"fgexample-{uuid.uuid4().hex}",
    )

    assert len(hold.lines("started")) == 1
    assert [(code, out) for code, out, _ in ends] == [(3, "built\n")] * 3
