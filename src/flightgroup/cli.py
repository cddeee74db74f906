"""The ``flightgroup`` command line.

``demo`` is built (three processes sharing one run, ``flightgroup.demo``);
``run``, ``status`` and ``bench`` come with the command-line issue, and say so
(exit 2) until then.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .demo import demo

__all__ = ["main"]

def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flightgroup`` command."""
    parser = argparse.ArgumentParser(
        prog="flightgroup",
        description="Single flight: one run per key, every concurrent caller joins it.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("demo", help="show three processes sharing one run")
    for name, purpose in (
        ("run", "run a command as the leader of a key, or join the run in flight"),
        ("status", "list the flights in progress"),
        ("bench", "run the benchmark suite"),
    ):
        commands.add_parser(name, help=f"{purpose} (not built yet)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return demo()
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    print(f"flightgroup {args.command}: not built yet in this version", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
