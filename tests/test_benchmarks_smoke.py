"""The benchmark harness runs (quick sizes, as `flightgroup bench --quick`) and its
must-checks hold: one run per herd, one run per failure wave, an empty table afterwards;
in the directory scope's section (real processes), one run per cross-process herd and
every caller served; in the fleet scope's (real processes and a redis-server of the run's
own), one run per herd, every caller served, one ACQUIRE per process, two round trips per
leader and per joiner; with Redis down (fleet) and the coordinator frozen (directory),
every call raised UnavailableError, each after the first refused at once, and the calls
go through again once the scope is back. Speed targets are not asserted: tests never
assert wall-clock times."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(100)
def test_quick_benchmark_runs_and_its_must_checks_pass() -> None:
    # Through the command a user types (`flightgroup bench --quick` runs `python -m
    # benchmarks --quick` in the checkout), from another directory.
    proc = subprocess.run(
        [sys.executable, "-m", "flightgroup", "bench", "--quick"],
        cwd=ROOT / "docs",
        capture_output=True,
        text=True,
        timeout=95,
        check=False,
    )
    # On a failure, show what broke: the report's failing rows and any error.
    broken = [
        line
        for line in proc.stdout.splitlines()
        if "FAIL" in line or "| no" in line or "rror" in line or "crash" in line
    ]
    assert proc.returncode == 0, "\n".join([*broken[:40], proc.stderr[-1500:]])
    out = proc.stdout
    for check in ("(b) herd: flightgroup's runs of fn | 1 | 1 | PASS",
                  "(d) failure storm: flightgroup's runs per wave in every wave; every caller "
                  "raised | 1; yes | 1; yes | PASS"):
        assert check in out, out[:3000]
    assert "| table entries | 0 |" in out
    # (a) and (f) are also read against the rule's floor, measured beside them.
    for row in ("(a) miss ÷ the rule's floor", "(f) memory per in-flight key ÷ the rule's floor"):
        assert re.search(re.escape(row) + r"[^|]*\| [0-9.]+× \|", out), out[:3000]
    assert "1; 1; yes | PASS" in out and "yes; 0; 10,000 | PASS" in out, out[:3000]
    # The directory scope: 8 processes share one run of each herd, and nothing failed.
    assert "## Directory scope" in out, out[-3000:]
    assert "failed:" not in out, out[-3000:]
    for check in ("8 processes × 1,000 tasks: runs of the work per herd; every caller got "
                  "the value | 1; yes | 1; yes | PASS",
                  "8 processes × 20 threads: flightgroup's runs per herd; every caller got "
                  "the value | 1; yes | 1; yes | PASS"):
        assert check in out, out[-3000:]
    # (1) reads the CPU each thread a call crosses spends, where the kernel says it.
    if Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        _assert_cpu_table(out)
    _assert_exchange_rows(out)
    # The fleet scope: its herds (8 processes, each one ACQUIRE) share one run, every caller
    # is served, and a leader and a joiner make two round trips each.
    assert "## Fleet scope" in out, out[-3000:]
    for check in ("round trips per joiner, in another process (40 rounds) | 2 (ACQUIRE 1, "
                  "XREAD 1) | 2 | PASS",
                  "round trips per leader, a flight shorter than lease/3 (40 rounds; the "
                  "server's count matched in 40) | 2 (ACQUIRE 1, COMPLETE 1) | 2 | PASS"):
        assert check in out, out[-3000:]
    for callers in ("tasks", "threads"):
        _assert_fleet_herd(out, callers)
    _assert_outage_rows(out)


def _assert_outage_rows(out: str) -> None:
    """Redis down (fleet) and the coordinator frozen (directory): each call raised
    UnavailableError and the 40 + 40 after the first were refused at once; a call led
    again once the scope was back (its row is there, whatever its time)."""
    for check in (
        "fleet (5): Redis down: every call raised UnavailableError; the calls after the "
        "first (80) refused at once by the breaker, without a round trip | yes; 80 | "
        "yes; 80 | PASS",
        "directory (6): coordinator frozen: every call raised UnavailableError; the calls "
        "after the first (80) refused at once | yes; 80 | yes; 80 | PASS",
    ):
        assert check in out, out[-3000:]
    for back in (
        "fleet (5): Redis back (its first PONG) → a call led through it, worst of 2",
        "directory (6): the frozen coordinator gone → a call led (this process elected), "
        "worst of 2",
    ):
        assert back in out, out[-3000:]


def _assert_fleet_herd(out: str, callers: str) -> None:
    """The fleet herd's row: one run and one ACQUIRE per process, every caller served.

    The 4,000 callers (threads above all) of a 2-core machine may still be waking when
    the 200 ms work lands; a caller that calls after its process had the value leads a
    flight of its own, as it must with nothing kept. The benchmark counts those callers
    and names them in the row, and only such a herd may run more than once."""
    prefix = f"herd of 8 processes × 500 {callers}:"
    rows = [line for line in out.splitlines() if prefix in line]
    assert len(rows) == 1, out[-3000:]
    cells = [cell.strip() for cell in rows[0].strip().strip("|").split("|")]
    measured, goal, verdict = cells[1], cells[2], cells[3]
    assert (goal, verdict) == ("1; yes; 8", "PASS"), rows[0]
    if measured != "1; yes; 8":
        served = measured.split(";")[1]
        assert served.strip() == "yes", rows[0]
        assert "had callers that called after the flight had landed" in measured, rows[0]


def _assert_cpu_table(out: str) -> None:
    """The latency section's CPU table: a row per thread, each on a CPU for some time
    per call, and their sum."""
    from benchmarks.directory import CPU_BACKGROUND, CPU_CALLER, CPU_COORDINATOR

    on_cpu: dict[str, float] = {}
    for line in out.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in (CPU_CALLER, CPU_BACKGROUND, CPU_COORDINATOR, "summed"):
            on_cpu[cells[0]] = float(cells[1].replace(",", ""))
    assert set(on_cpu) == {CPU_CALLER, CPU_BACKGROUND, CPU_COORDINATOR, "summed"}, out[-3000:]
    assert all(value > 0 for value in on_cpu.values()), on_cpu
    parts = on_cpu[CPU_CALLER] + on_cpu[CPU_BACKGROUND] + on_cpu[CPU_COORDINATOR]
    assert abs(on_cpu["summed"] - parts) < 0.5, on_cpu


def _assert_exchange_rows(out: str) -> None:
    """(1) times the lead's exchange by hand four ways (answers read on the caller's
    loop or by another thread's, each with and without the landing's ack awaited), as
    many leads each, every one led by the coordinator; the targets compare the call to
    three of them."""
    from benchmarks.directory import (
        EXCHANGE_ACKED,
        EXCHANGE_OWN,
        EXCHANGE_THREAD,
        EXCHANGE_THREAD_ACKED,
    )

    exchanges = (EXCHANGE_OWN, EXCHANGE_ACKED, EXCHANGE_THREAD, EXCHANGE_THREAD_ACKED)
    samples: dict[str, int] = {}
    for line in out.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] in exchanges:
            samples[cells[0]] = int(cells[1].replace(",", ""))
            assert float(cells[2].replace(",", "")) > 0, line
    assert set(samples) == set(exchanges), out[-3000:]
    assert len(set(samples.values())) == 1 and samples[EXCHANGE_OWN] > 0, samples
    ratios = [line for line in out.splitlines() if "÷ the lead's exchange by hand" in line]
    assert len(ratios) == 3, out[-3000:]
    assert all(re.search(r"\| \d+\.\d\d× \(the exchange: [\d,]+ µs\) \|", line)
               for line in ratios), ratios


def test_a_written_report_keeps_the_files_history_section(tmp_path: Path) -> None:
    """``--write`` replaces the report and keeps the file's ``## History`` to its end."""
    from benchmarks.__main__ import _history

    report = tmp_path / "benchmarks.md"
    assert _history(report) == ""  # no file yet: nothing to keep
    report.write_text("# Benchmarks\n\nold rows\n\n## History\n\n### a run\n\nrows\n")
    assert _history(report) == "\n## History\n\n### a run\n\nrows\n"
    report.write_text("# Benchmarks\n\nno history here\n")
    assert _history(report) == ""


@pytest.mark.timeout(60)
def test_codecs_benchmark_runs_and_reports_every_codec_against_json() -> None:
    """``python -m benchmarks.codecs`` runs (tiny sizes) and prints a row per codec,
    with JSON's ratio to itself 1.00."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.codecs", "--times", "20", "--rounds", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=55,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-1500:]
    out = proc.stdout
    for row in ("| TypedCodec for Report (JSON) |", "| TypedCodec for Report (MessagePack) |",
                "| TypedCodec() untyped |", "| flightgroup.PICKLE |"):
        assert row in out, out
    assert "| flightgroup.JSON, plain dict |" in out and "| 1.00 | 1.00 |" in out, out
