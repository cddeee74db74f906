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


def test_demo_shows_three_processes_sharing_one_run() -> None:
    proc = _flightgroup("demo")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # One process led, two joined; one run in the journal; one token; one value.
    assert out.count("this process led the flight") == 1, out
    assert out.count("this process joined it") == 2, out
    assert "the journal has 1 run" in out
    assert "every caller got the same value: True" in out
    assert "624 calls in 3 processes, 1 run of the work." in out
    # Local coalescing: the joining processes ran no flight of the key at all.
    assert out.count("flights=0 joins=208") == 2, out
    assert "flights=1 joins=207" in out


def test_bad_usage_exits_2_without_a_traceback() -> None:
    for args in (("no-such-command",), ("demo", "--bogus"), (), ("bench", "--bogus")):
        proc = _flightgroup(*args)
        assert proc.returncode == 2, (args, proc.returncode)
        assert "Traceback" not in proc.stderr
