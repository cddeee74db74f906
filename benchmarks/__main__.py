"""``python -m benchmarks [--quick] [--write PATH] [--only process|directory|fleet]
[--update PATH] [--also-on PYTHON]``: run the suite, print the report (``--write`` keeps
the file's ``## History`` section; ``--also-on`` runs it on that interpreter first and
reports both, see benchmarks/pythons.py). ``--only directory`` (``--only
fleet``) runs and prints the directory (fleet) scope's section alone (see
benchmarks/directory.py, benchmarks/fleet.py); ``--update PATH`` puts the fleet scope's
section into the Markdown file PATH in place of its old text, keeping the rest."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from . import directory, fleet, pythons
from .peers import ASYNC_LIBS, NONE_ASYNC, NONE_SYNC, THREAD_LIBS
from .report import engine, flightgroup_ok, render, render_only, src_digest, targets
from .scenarios import FULL, QUICK, run

HISTORY = "\n## History\n"


def _history(path: Path) -> str:
    """The ``## History`` section of the report at ``path`` (to its end), which a new
    report keeps: side-by-side runs of two commits are written there by hand."""
    try:
        old = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    at = old.find(HISTORY)
    return "" if at < 0 else old[at:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="flightgroup side by side with its peers; prints a Markdown report.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--write", metavar="PATH", help="also write the report to PATH")
    parser.add_argument(
        "--only",
        choices=["process", "directory", "fleet"],
        help="run only this section (the process, the directory or the fleet scope) and print "
        "it alone",
    )
    parser.add_argument(
        "--update",
        metavar="PATH",
        help="put the fleet scope's section (with its targets) into the Markdown file PATH, "
        "replacing its old text and keeping every other section",
    )
    parser.add_argument(
        "--also-on",
        metavar="PYTHON",
        help="first run the same sections on this interpreter (with flightgroup and the "
        "peers installed), then report both: their targets side by side, its tables after",
    )
    parser.add_argument("--handoff", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    # (The interpreters a report covers are in its environment lines, not its command.)
    shown = pythons.without(given, ("--also-on", "--handoff"))
    command = shlex.join(["scripts/dev", "bench", *shown])
    # The other interpreter runs first, alone: the two runs never share the cores.
    other = pythons.run_other(args.also_on, given) if args.also_on else None
    # Read before the run: the code measured is the code imported at its start.
    source, digest = engine(), src_digest()
    if args.only in (None, "process"):
        report = run(ASYNC_LIBS, NONE_ASYNC, THREAD_LIBS, NONE_SYNC, QUICK if args.quick else FULL)
    wide = wide_found = fleet_out = None
    if args.only in (None, "directory"):
        wide = directory.run(directory.QUICK if args.quick else directory.FULL)
        wide_found = directory.targets(wide)
    if args.only in (None, "fleet"):
        fleet_out = fleet.run(fleet.QUICK if args.quick else fleet.FULL)
    if src_digest() != digest:
        source += " (src/ changed while the run went on: run it again)"
    fleet_found = fleet.targets(fleet_out) if fleet_out is not None else []
    ok = True
    if args.only is None:
        assert wide is not None
        assert wide_found is not None
        assert fleet_out is not None
        found = targets(report)
        sections = [*directory.section(wide), *fleet.section(fleet_out)]
        found = found + wide_found + fleet_found
        text = render(report, found, command, source, sections)
        ok = flightgroup_ok(report, found)
    elif args.only == "process":
        found = targets(report)
        text = render(report, found, command, source)
        ok = flightgroup_ok(report, found)
    elif args.only == "directory":
        assert wide is not None
        assert wide_found is not None
        found = wide_found
        text = render_only("directory scope", directory.section(wide), found, command, source)
    else:
        assert fleet_out is not None
        found = fleet_found
        text = render_only("fleet scope", fleet.section(fleet_out), found, command, source)
    if wide is not None and wide_found is not None and not directory.ok(wide, wide_found):
        ok = False
    if fleet_out is not None and not fleet.ok(fleet_out, fleet_found):
        ok = False
    if args.handoff:
        pythons.Handoff(pythons.this_python(), found, text, ok).dump(args.handoff)
    if other is not None:
        text = pythons.merge(text, found, other)
        ok = ok and other.ok
    print(text)
    if args.write:
        Path(args.write).write_text(text + _history(Path(args.write)), encoding="utf-8")
    if args.update and fleet_out is not None:
        fleet.update(args.update, fleet.section(fleet_out, fleet_found, command, source))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
