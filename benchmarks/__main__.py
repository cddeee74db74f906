"""``python -m benchmarks [--quick] [--write PATH]``: run the suite, print the report."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from .peers import ASYNC_LIBS, NONE_ASYNC, NONE_SYNC, THREAD_LIBS
from .report import engine, flightgroup_ok, render, src_digest, targets
from .scenarios import FULL, QUICK, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="flightgroup side by side with its peers; prints a Markdown report.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--write", metavar="PATH", help="also write the report to PATH")
    args = parser.parse_args(argv)
    # Read before the run: the code measured is the code imported at its start.
    source, digest = engine(), src_digest()
    report = run(ASYNC_LIBS, NONE_ASYNC, THREAD_LIBS, NONE_SYNC, QUICK if args.quick else FULL)
    if src_digest() != digest:
        source += " (src/ changed while the run went on: run it again)"
    found = targets(report)
    command = shlex.join(["scripts/dev", "bench", *(sys.argv[1:] if argv is None else argv)])
    text = render(report, found, command, source)
    print(text)
    if args.write:
        Path(args.write).write_text(text, encoding="utf-8")
    return 0 if flightgroup_ok(report, found) else 1


if __name__ == "__main__":
    sys.exit(main())
