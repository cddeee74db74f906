"""``python -m benchmarks [--quick] [--write PATH] [--only directory]``: run the suite,
print the report. ``--only directory`` runs and prints the directory scope's section
alone (see benchmarks/directory.py)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from . import directory
from .peers import ASYNC_LIBS, NONE_ASYNC, NONE_SYNC, THREAD_LIBS
from .report import engine, flightgroup_ok, render, render_only, src_digest, targets
from .scenarios import FULL, QUICK, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="flightgroup side by side with its peers; prints a Markdown report.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--write", metavar="PATH", help="also write the report to PATH")
    parser.add_argument(
        "--only",
        choices=["directory"],
        help="run only this section (the directory scope) and print it alone",
    )
    args = parser.parse_args(argv)
    command = shlex.join(["scripts/dev", "bench", *(sys.argv[1:] if argv is None else argv)])
    # Read before the run: the code measured is the code imported at its start.
    source, digest = engine(), src_digest()
    if args.only is None:
        report = run(ASYNC_LIBS, NONE_ASYNC, THREAD_LIBS, NONE_SYNC, QUICK if args.quick else FULL)
    wide = directory.run(directory.QUICK if args.quick else directory.FULL)
    if src_digest() != digest:
        source += " (src/ changed while the run went on: run it again)"
    wide_found = directory.targets(wide)
    if args.only is None:
        found = targets(report)
        text = render(report, found + wide_found, command, source, directory.section(wide))
        ok = flightgroup_ok(report, found)
    else:
        text = render_only("directory scope", directory.section(wide), wide_found, command, source)
        ok = True
    print(text)
    if args.write:
        Path(args.write).write_text(text, encoding="utf-8")
    return 0 if ok and directory.ok(wide, wide_found) else 1


if __name__ == "__main__":
    sys.exit(main())
