"""The command line as a user runs it."""

from __future__ import annotations

import subprocess
import sys


def _flightgroup(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flightgroup", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_demo_shows_one_run_shared_by_tasks_and_threads() -> None:
    proc = _flightgroup("demo")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "led:    1 call" in out
    assert "joined: 999 asyncio tasks" in out
    assert "32 threads" in out
    assert "runs of the work: 1 " in out
    assert "flights=1 joins=1031" in out


def test_bad_usage_exits_2_without_a_traceback() -> None:
    for args in (("no-such-command",), ("demo", "--bogus"), ()):
        proc = _flightgroup(*args)
        assert proc.returncode == 2, (args, proc.returncode)
        assert "Traceback" not in proc.stderr


def test_commands_not_built_yet_say_so_and_exit_2() -> None:
    for command in ("run", "status", "bench"):
        proc = _flightgroup(command)
        assert proc.returncode == 2
        assert "not built yet" in proc.stderr
