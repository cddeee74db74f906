"""A benchmark report over two Pythons (``python -m benchmarks --also-on PYTHON``): the
other interpreter runs the same sections first and hands its targets and tables over; the
report shows both runs' measures, goals and verdicts side by side, a target only one run
has with dashes in the other's cells, and the other run's tables after its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import pythons
from benchmarks.report import Target, render_only

ROOT = Path(__file__).resolve().parent.parent


def _report(found: list[Target], table_title: str) -> str:
    section = [f"## {table_title}", "", "| library | µs |", "| --- | --- |", "| x | 1 |", ""]
    return render_only("process scope", section, found, "scripts/dev bench", "abc1234")


@pytest.mark.timeout(10)
def test_both_runs_targets_stand_side_by_side_and_the_others_tables_follow() -> None:
    mine = [
        Target("(a) miss ÷ the fastest peer's miss (oneflight)", "2.90×", "≤ 1.50×", False),
        Target("(b) herd: flightgroup's runs of fn", "1", "1", True, must=True),
    ]
    theirs = [
        Target("(a) miss ÷ one task per call", "1.40×", "≤ 1.50×", True),
        Target("(b) herd: flightgroup's runs of fn", "2", "1", False, must=True),
    ]
    handoff = pythons.Handoff("CPython 3.11.7", theirs, _report(theirs, "(a) Miss"), ok=False)
    merged = pythons.merge(_report(mine, "(a) Miss"), mine, handoff)
    lines = merged.splitlines()

    assert f"| target | {pythons.this_python()}: measured | goal | result | CPython 3.11.7: " \
        "measured | goal | result |" in lines
    # A target both runs have: one row, each run's own measure and verdict.
    assert "| (b) herd: flightgroup's runs of fn | 1 | 1 | PASS | 2 | 1 | FAIL |" in lines
    # A target of one run only: dashes in the other's cells.
    assert ("| (a) miss ÷ the fastest peer's miss (oneflight) | 2.90× | ≤ 1.50× | MISS "
            "| — | — | — |") in lines
    assert "| (a) miss ÷ one task per call | — | — | — | 1.40× | ≤ 1.50× | PASS |" in lines
    # The single-run targets table is gone; the environment names both interpreters.
    assert not any(line.startswith("| target | measured |") for line in lines)
    assert any(line.startswith("- Also run on: CPython 3.11.7") for line in lines)
    # This run's tables first, then the other's under a heading of their own, a level down.
    assert lines.index("## (a) Miss") < lines.index("## On CPython 3.11.7")
    assert lines.index("## On CPython 3.11.7") < lines.index("### (a) Miss")
    assert "### Targets" not in lines  # the other run's targets are in the table above


@pytest.mark.timeout(10)
def test_a_target_against_each_runs_own_fastest_peer_is_one_row() -> None:
    row = "(e) threads: total time ÷ the fastest thread peer's ({other})"
    mine = [Target(row.format(other="singleflight"), "1.01×", "≤ 1.00×", False, row=row,
                   other="singleflight")]
    theirs = [Target(row.format(other="coalescer"), "0.98×", "≤ 1.00×", True, row=row,
                     other="coalescer")]
    handoff = pythons.Handoff("CPython 3.11.7", theirs, _report(theirs, "(e) Threads"), ok=True)
    lines = pythons.merge(_report(mine, "(e) Threads"), mine, handoff).splitlines()
    rows = [line for line in lines if line.startswith("| (e) threads")]
    assert rows == [
        "| (e) threads: total time ÷ the fastest thread peer's (singleflight; on CPython "
        "3.11.7: coalescer) | 1.01× | ≤ 1.00× | MISS | 0.98× | ≤ 1.00× | PASS |"
    ]


@pytest.mark.timeout(10)
def test_the_handoff_survives_its_file(tmp_path: Path) -> None:
    found = [
        Target("(f) memory", "1.30×", "≤ 1.00×", False),
        Target("(b) runs", "1", "1", True, must=True),
        Target("info", "3", "information", None),
    ]
    sent = pythons.Handoff("CPython 3.11.7", found, "# Benchmarks\n", ok=True)
    sent.dump(str(tmp_path / "handoff.json"))
    got = pythons.Handoff.load(str(tmp_path / "handoff.json"))
    assert got == sent
    assert [t.verdict for t in got.targets] == ["MISS", "PASS", "n/a"]


@pytest.mark.timeout(10)
def test_the_other_run_gets_the_sections_and_sizes_but_not_what_only_the_reporter_does(
) -> None:
    given = ["--quick", "--only", "process", "--write", "docs/benchmarks.md",
             "--also-on", "/usr/bin/python3.11", "--update=x.md"]
    assert pythons.without(given, pythons.ONLY_HERE) == ["--quick", "--only", "process"]


@pytest.mark.timeout(200)
def test_a_run_on_another_interpreter_reports_both(tmp_path: Path) -> None:
    # The real thing, end to end: the other interpreter is this one (the report does not
    # care which), the quick process section on each, one after the other.
    out = tmp_path / "report.md"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "process",
         "--write", str(out), "--also-on", sys.executable],
        cwd=ROOT, capture_output=True, text=True, timeout=190, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text(encoding="utf-8")
    me = pythons.this_python()
    assert f"| target | {me}: measured | goal | result | {me}: measured |" in text
    herd = next(line for line in text.splitlines()
                if line.startswith("| (b) herd: flightgroup's runs of fn |"))
    assert herd.count("| PASS") == 2, herd  # a verdict of each run
    assert f"## On {me}" in text and "### (a) Miss: distinct keys" in text
    # The other run's report went to stderr as it ran; the command shown is the user's.
    assert "# Benchmarks" in proc.stderr
    assert "Reproduce with `scripts/dev bench --quick --only process --write" in text
    assert "--also-on" not in text
