"""One report over two Pythons: the suite run again on another interpreter (the oldest
supported one, whose users pay the most), its targets beside this run's, its tables after.

``python -m benchmarks --also-on PYTHON ...`` first runs ``PYTHON -m benchmarks ...
--handoff FILE`` (the same sections and sizes, one after the other so that neither run
shares the machine's cores with the other); that run writes what the report needs into
FILE as JSON (its Python, its targets, its tables). This run then renders its own report
with a targets table of both (each Python's measure, goal and verdict: some goals differ
by version) and the other run's tables after its own, their headings one level down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from .report import Target, this_python


@dataclass(frozen=True)
class Handoff:
    """What another interpreter's run hands to the report: its ``python`` (as the
    environment line names it), its ``targets``, its report's ``text`` and whether its
    musts held (``ok``)."""

    python: str
    targets: list[Target]
    text: str
    ok: bool

    def dump(self, path: str) -> None:
        data = {
            "python": self.python,
            "targets": [asdict(t) for t in self.targets],
            "text": self.text,
            "ok": self.ok,
        }
        Path(path).write_text(json.dumps(data), encoding="utf-8")

    @classmethod
    def load(cls, path: str) -> Handoff:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(
            python=data["python"],
            targets=[Target(**t) for t in data["targets"]],
            text=data["text"],
            ok=data["ok"],
        )


ONLY_HERE = ("--write", "--update", "--also-on", "--handoff")
"""The options only the run that reports does: the other interpreter's run gets none."""


def without(argv: Sequence[str], options: Sequence[str]) -> list[str]:
    """``argv`` without ``options`` (each of which takes a value, given as ``--x V`` or
    ``--x=V``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        elif arg.split("=", 1)[0] not in options:
            out.append(arg)
    return out


def run_other(python: str, argv: Sequence[str]) -> Handoff:
    """Run the suite under ``python`` with ``argv`` (this run's own arguments) and
    return what it handed over. Its report goes to this process's stderr as it runs.
    Raises RuntimeError if it handed nothing over (it crashed)."""
    fd, path = tempfile.mkstemp(prefix="flightgroup-bench-", suffix=".json")
    os.close(fd)
    try:
        done = subprocess.run(
            [python, "-m", "benchmarks", *without(argv, ONLY_HERE), "--handoff", path],
            cwd=Path(__file__).resolve().parent.parent,
            stdout=sys.stderr,
            check=False,
        )
        try:
            return Handoff.load(path)
        except (OSError, ValueError, KeyError) as exc:
            raise RuntimeError(
                f"{python} -m benchmarks exited {done.returncode} and handed nothing over"
            ) from exc
    finally:
        Path(path).unlink(missing_ok=True)


def _cell(target: Target | None) -> list[str]:
    if target is None:
        return ["—", "—", "—"]
    return [target.measured, target.goal, target.verdict]


def _label(a: Target | None, b: Target | None, python: str) -> str:
    """A row's name: its target's, with each run's peer where the two runs' differ."""
    if a is None or b is None:
        only = a if a is not None else b
        assert only is not None  # (a row has a target of one run at least)
        return only.what
    if a.what == b.what or not a.row:
        return a.what
    return a.row.format(other=f"{a.other}; on {python}: {b.other}")


def targets_table(mine: Sequence[Target], theirs: Handoff) -> list[str]:
    """The targets of both runs, a row per target (matched by what it measures, even
    where the two runs' fastest peers differ), each run's measure, goal and verdict side
    by side; a target only one run has shows dashes in the other's cells."""
    here = this_python()
    other = {t.row or t.what: t for t in theirs.targets}
    rows: list[tuple[Target | None, Target | None]] = [
        (t, other.pop(t.row or t.what, None)) for t in mine
    ]
    rows += [(None, t) for t in other.values()]
    header = [
        "target",
        f"{here}: measured",
        "goal",
        "result",
        f"{theirs.python}: measured",
        "goal",
        "result",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for a, b in rows:
        label = _label(a, b, theirs.python)
        lines.append("| " + " | ".join([label, *_cell(a), *_cell(b)]) + " |")
    return lines


def tables_of(theirs: Handoff) -> list[str]:
    """The other run's tables (everything after its targets table), under a heading of
    their own, each heading one level down."""
    lines = theirs.text.splitlines()
    at = next((i for i, line in enumerate(lines) if line == "## Targets"), None)
    if at is None:
        return []
    i = at + 1
    while i < len(lines) and not lines[i].startswith("| "):  # to the targets table
        i += 1
    while i < len(lines) and lines[i].startswith("| "):  # past it
        i += 1
    out = [f"## On {theirs.python}", ""]
    out += [f"Every section again, run on {theirs.python} right before the run above."]
    for line in lines[i:]:
        out.append("#" + line if line.startswith("##") else line)
    return out


def merge(text: str, mine: Sequence[Target], theirs: Handoff) -> str:
    """This run's report ``text`` with its targets table replaced by both runs' and the
    other run's tables appended (before ``## History``, which ``--write`` adds after)."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("- Python: "):
            out.append(line)
            out.append(f"- Also run on: {theirs.python} (its tables follow this run's)")
            i += 1
            continue
        if line.startswith("| target | measured | goal | result |"):
            out += targets_table(mine, theirs)
            i += 2
            while i < len(lines) and lines[i].startswith("| "):
                i += 1
            continue
        out.append(line)
        i += 1
    while out and not out[-1]:
        out.pop()
    return "\n".join([*out, "", *tables_of(theirs), ""])
